// Scratch memory an op takes from its plan. An op lays its scratch out with one function that
// takes regions from a Workspace; run over no memory the same function only counts (that count
// is the op's reported workspace size), run over the plan's buffer it hands out the regions. So
// the size an op reports and the memory its forward takes come from one piece of code, and a
// forward that takes more than was reported fails loudly (E_INTERNAL) instead of overrunning.
// (XNNPACK's reshape -> workspace size -> setup, with the sizing and the setup one function.)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tessera {

class Workspace {
 public:
  static constexpr size_t kAlignment = 64;  // a cache line, one AVX-512 vector

  Workspace() = default;  // counting only: every take() returns null
  // `base` 64-byte aligned, `bytes` long.
  Workspace(void* base, size_t bytes) : base_(static_cast<char*>(base)), capacity_(bytes) {}

  bool counting() const { return base_ == nullptr; }
  // A 64-byte aligned region of `count` elements (null when counting or count is 0).
  template <class T>
  T* take(int64_t count) {
    return static_cast<T*>(take_bytes(static_cast<size_t>(count < 0 ? 0 : count) * sizeof(T)));
  }
  void* take_bytes(size_t bytes);
  // Regions taken after mark() are given back by release(mark): a layer whose steps use
  // scratch one after the other reuses the same bytes.
  size_t mark() const { return used_; }
  void release(size_t mark) { used_ = mark; }
  // The most this workspace has held at once: the op's workspace size, when counting.
  size_t peak() const { return peak_; }
  size_t capacity() const { return capacity_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// Per-worker scratch inside a workspace: `slots` regions of `bytes` each (one per thread that
// may run at once), and a parallel chunk leases one while it runs. Leases go by an atomic busy
// mask rather than by thread index: a oneTBB thread index depends on the arena and on external
// threads stealing work, a free slot does not. More concurrent chunks than slots (threads raised
// after the plan was made) wait for a slot: slower, never wrong.
class WorkerScratch {
 public:
  static constexpr int kMaxSlots = 64;  // bits of the busy mask

  WorkerScratch() = default;
  // Takes the busy mask and `slots` regions of `bytes` from `ws` (clamped to [1, kMaxSlots]).
  WorkerScratch(Workspace& ws, size_t bytes, int slots);

  class Lease {
   public:
    Lease(const WorkerScratch& owner, int slot) : owner_(owner), slot_(slot) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    template <class T>
    T* as() const {
      return reinterpret_cast<T*>(owner_.base_ + static_cast<size_t>(slot_) * owner_.stride_);
    }

   private:
    const WorkerScratch& owner_;
    int slot_;
  };
  Lease acquire() const;

 private:
  std::atomic<uint64_t>* busy_ = nullptr;
  char* base_ = nullptr;
  size_t stride_ = 0;
  int slots_ = 0;
};

}  // namespace tessera
