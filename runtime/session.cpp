#include "runtime/session.h"

#include <iterator>

#include "core/error.h"

namespace tessera {

Session::Session(Model model) : model_(std::move(model)) {}

Session::Lease::Lease(const Session& session, std::list<Entry> entry)
    : session_(&session), entry_(std::move(entry)) {}

Session::Lease::Lease(Lease&& other) noexcept : session_(other.session_) {
  entry_.splice(entry_.begin(), other.entry_);  // leaves `other` empty: its end returns nothing
}

Session::Lease::~Lease() {
  if (!entry_.empty()) session_->give_back(entry_);
}

const std::vector<std::pair<std::string, Tensor>>& Session::Lease::run(
    const std::map<std::string, Tensor>& inputs) {
  if (entry_.empty())
    fail(ErrorCode::Internal, "session", "this lease's plan was dropped when a run failed");
  try {
    return entry_.front().plan->run(inputs);
  } catch (...) {
    entry_.clear();  // a run that failed part-way does not hand its plan to the next one
    throw;
  }
}

Session::Lease Session::lease(const std::map<std::string, TensorDesc>& inputs) const {
  const std::vector<NetworkInput>& names = model_.network().spec().inputs;
  PlanKey key;
  for (const NetworkInput& in : names) {
    const auto it = inputs.find(in.name);
    if (it == inputs.end()) break;
    key.emplace_back(it->second.shape, it->second.dtype);
  }
  // Only inputs naming exactly the network's may match an idle plan; any others go to the Plan
  // constructor, which names what is missing or unknown (E_ARG).
  if (key.size() == names.size() && inputs.size() == names.size()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->key != key) continue;
      std::list<Lease::Entry> entry;
      entry.splice(entry.begin(), idle_, it);
      return Lease(*this, std::move(entry));
    }
  }
  // Outside the lock: planning allocates every buffer, and binding checks every input.
  std::unique_ptr<Plan> plan = std::make_unique<Plan>(model_, inputs);
  std::list<Lease::Entry> entry;
  entry.push_back(Lease::Entry{std::move(key), std::move(plan)});
  return Lease(*this, std::move(entry));
}

std::vector<std::pair<std::string, Tensor>> Session::run(
    const std::map<std::string, Tensor>& inputs) const {
  std::map<std::string, TensorDesc> descs;
  for (const auto& [name, t] : inputs) descs[name] = TensorDesc{t.shape(), t.dtype()};
  Lease lease = this->lease(descs);
  std::vector<std::pair<std::string, Tensor>> outputs;
  for (const auto& [name, t] : lease.run(inputs)) outputs.emplace_back(name, t.clone());
  return outputs;
}

void Session::give_back(std::list<Lease::Entry>& entry) const noexcept {
  std::list<Lease::Entry> dropped;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.splice(idle_.begin(), entry);
  if (idle_.size() > kMaxIdlePlans) dropped.splice(dropped.begin(), idle_, std::prev(idle_.end()));
}

void Session::trim() const {
  std::list<Lease::Entry> idle;  // the plans (and their buffers) are freed after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  idle.swap(idle_);
}

size_t Session::idle_plans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_.size();
}

}  // namespace tessera
