// A Session runs one loaded Model from any number of threads: the command line, the C API and
// (later) the bindings all run models through it.
//
// Why a pool: a model's layers are immutable after loading and OpLayer::forward is const, so runs
// share them freely; what a run writes lives in a Plan (its intermediate buffers, bound to one
// set of input shapes), which serves one run at a time. Building a plan for every run would fault
// in fresh buffers each time (first touch runs at about 0.33 GB/s here: 30 ms for a 10 MB
// workspace, per run), so the session keeps idle plans and hands a warm one to the next run with
// the same inputs.
//
// The pool's policy:
//  - A plan is keyed by every network input's shape and stored dtype, in input order; a run takes
//    the most recently returned idle plan with its key, else builds a new one (outside the lock:
//    planning allocates every buffer, and binding is what checks the inputs).
//  - At most kMaxIdlePlans idle plans are kept; returning one more drops the least recently
//    used. Plans out on lease do not count: 8 threads running at once hold 8 plans, whatever
//    the cap.
//  - A plan goes back after its run, or unused (a caller's check failed before the run); a plan
//    whose run threw is dropped, not returned.
//  - trim() frees every idle plan; leased ones return to the pool afterwards as usual.
//
// Thread safety: every method may be called from any number of threads at once. The pool is the
// only state runs share, and a run holds its lock only to take or return a plan; taking and
// returning allocate nothing (the pool's list node travels with the lease), so returning a plan
// never fails. A Lease is one thread's at a time (it is one Plan). The session must outlive its
// leases.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/network.h"

namespace tessera {

class Session {
 public:
  // Idle plans kept. 8 covers 8 threads each running one input shape (the C API's concurrency
  // test), or a few threads alternating between a few shapes. An idle plan holds its
  // intermediates: for the example encoder 72 KB at [2, 16, 64], 18 MB at [2, 4096, 64].
  static constexpr size_t kMaxIdlePlans = 8;

  explicit Session(Model model);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Model& model() const { return model_; }

  // What a plan was bound for: every network input's shape and stored dtype, in input order.
  using PlanKey = std::vector<std::pair<Shape, DType>>;

  // One plan borrowed from the pool; it goes back when the lease is destroyed. For repeated runs
  // on the same inputs (`tessera bench`), and for callers that read the outputs in place.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();

    // The plan's types (Plan::types) and FLOPs: what the outputs will be, before a run. A lease
    // whose run threw has none.
    const Plan& plan() const { return *entry_.front().plan; }
    // Plan::run: the outputs live in the plan's buffers until the next run or the lease's end.
    // When it throws, the plan is dropped and the lease is empty: a later run is E_INTERNAL.
    const std::vector<std::pair<std::string, Tensor>>& run(
        const std::map<std::string, Tensor>& inputs);

   private:
    friend class Session;
    struct Entry {
      PlanKey key;
      std::unique_ptr<Plan> plan;
    };
    Lease(const Session& session, std::list<Entry> entry);

    const Session* session_;
    std::list<Entry> entry_;  // one node, spliced out of the pool and back: no allocation
  };

  // A plan bound to `inputs` (Plan's errors: E_ARG, E_SHAPE, E_DTYPE, E_CONSTRAINT): an idle
  // one when the pool has one, else a new one.
  Lease lease(const std::map<std::string, TensorDesc>& inputs) const;

  // One run on a plan from the pool. The outputs (by name, in network output order, float32
  // contiguous; a mask passed straight through keeps its dtype) are copies the caller owns.
  std::vector<std::pair<std::string, Tensor>> run(
      const std::map<std::string, Tensor>& inputs) const;

  // Frees every idle plan (their buffers are released outside the lock).
  void trim() const;
  size_t idle_plans() const;

 private:
  void give_back(std::list<Lease::Entry>& entry) const noexcept;

  Model model_;
  mutable std::mutex mutex_;
  mutable std::list<Lease::Entry> idle_;  // most recently returned first
};

}  // namespace tessera
