#include "core/workspace.h"

#include <algorithm>
#include <new>
#include <string>
#include <thread>

#include "core/error.h"

namespace tessera {

void* Workspace::take_bytes(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  const size_t begin = used_;
  used_ += rounded;
  peak_ = std::max(peak_, used_);
  if (counting()) return nullptr;
  if (used_ > capacity_)
    fail(ErrorCode::Internal, "workspace",
         "an op took " + std::to_string(used_) + " bytes of scratch but reported " +
             std::to_string(capacity_));
  return base_ + begin;
}

WorkerScratch::WorkerScratch(Workspace& ws, size_t bytes, int slots) {
  slots_ = std::clamp(slots, 1, kMaxSlots);
  stride_ = (bytes + Workspace::kAlignment - 1) / Workspace::kAlignment * Workspace::kAlignment;
  void* mask = ws.take_bytes(sizeof(std::atomic<uint64_t>));
  base_ = static_cast<char*>(ws.take_bytes(stride_ * static_cast<size_t>(slots_)));
  if (mask) busy_ = new (mask) std::atomic<uint64_t>(0);
}

WorkerScratch::Lease WorkerScratch::acquire() const {
  const uint64_t all = slots_ == 64 ? ~uint64_t{0} : (uint64_t{1} << slots_) - 1;
  for (;;) {
    uint64_t busy = busy_->load(std::memory_order_relaxed);
    const uint64_t free = ~busy & all;
    if (free == 0) {
      std::this_thread::yield();
      continue;
    }
    const int slot = __builtin_ctzll(free);
    if (busy_->compare_exchange_weak(busy, busy | (uint64_t{1} << slot), std::memory_order_acquire,
                                     std::memory_order_relaxed))
      return Lease(*this, slot);
  }
}

WorkerScratch::Lease::~Lease() {
  owner_.busy_->fetch_and(~(uint64_t{1} << slot_), std::memory_order_release);
}

}  // namespace tessera
