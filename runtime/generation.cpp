#include "runtime/generation.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/text.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "generate";

// The vocabulary: the network must have one output [B, T, vocab] over the ids' dims.
int64_t output_vocab(const Network& net, const std::string& seq) {
  if (net.outputs().size() != 1)
    fail(ErrorCode::Arg, kWhere,
         "the network has " + str(static_cast<int64_t>(net.outputs().size())) +
             " outputs; generation needs one, the logits [B, T, vocab]");
  const auto& [name, id] = net.outputs()[0];
  const ValueType& t = net.values()[static_cast<size_t>(id)].type;
  const SymShape& ids = net.values()[static_cast<size_t>(net.inputs()[0])].type.shape;
  if (t.dtype != DType::F32 || t.shape.size() != 3 || t.shape[0] != ids[0] ||
      t.shape[1].is_fixed() || t.shape[1].text != seq || !t.shape[2].is_fixed() ||
      t.shape[2].value < 1)
    fail(ErrorCode::Arg, kWhere,
         "output " + name + " is " + sym_shape_to_string(t.shape) +
             "; generation needs the logits [B, T, vocab] of every position");
  return t.shape[2].value;
}

std::map<std::string, TensorDesc> ids_desc(const std::string& name, int64_t batch, int64_t len) {
  return {{name, TensorDesc{Shape{batch, len}, DType::I64}}};
}

// Whether the network accepts ids [1, len].
bool accepts(const Network& net, int64_t len) {
  try {
    const ValueType& t = net.values()[static_cast<size_t>(net.inputs()[0])].type;
    net.bind({ValueType{fixed_shape(Shape{1, len}), t.dtype}});
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

void GenerationSession::check(const Network& net) {
  DecodeState::step_roles(net);
  output_vocab(net, DecodeState::ids_input(net).second);
}

std::optional<int64_t> GenerationSession::context(const Network& net) {
  DecodeState::ids_input(net);
  constexpr int64_t kMax = int64_t{1} << 24;
  if (accepts(net, kMax)) return std::nullopt;
  if (!accepts(net, 1)) return 0;
  // Largest accepted length: accepted lengths form a prefix (a position table refuses every
  // length past its rows).
  int64_t lo = 1, hi = kMax;  // accepts(lo), !accepts(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (accepts(net, mid) ? lo : hi) = mid;
  }
  return lo;
}

GenerationSession::GenerationSession(const Model& model, int64_t batch, int64_t capacity,
                                     const SamplingOptions& sampling)
    : GenerationSession(model, batch, capacity, sampling,
                        DecodeState::ids_input(model.network())) {}

GenerationSession::GenerationSession(const Model& model, int64_t batch, int64_t capacity,
                                     const SamplingOptions& sampling,
                                     const std::pair<std::string, std::string>& ids)
    : model_(model),
      ids_name_(ids.first),
      state_(model, batch, capacity),
      sampling_(sampling),
      vocab_(output_vocab(model.network(), ids.second)),
      sampler_(sampling, batch, vocab_, kWhere) {
  const std::optional<int64_t> limit = context(model.network());
  if (limit && capacity > *limit)
    fail(ErrorCode::Shape, kWhere,
         str(capacity) + " positions are more than the network's context of " + str(*limit));
  step_plan_ = std::make_unique<Plan>(model_, ids_desc(ids_name_, batch, 1), &state_);
  step_ids_ = Tensor::empty({batch, 1}, DType::I64);
  step_inputs_.emplace(ids_name_, step_ids_);
  logits_.resize(static_cast<size_t>(batch * vocab_));
}

void GenerationSession::reset() {
  state_.reset();
  sampler_ = TokenSampler(sampling_, state_.batch(), vocab_, kWhere);
}

const float* GenerationSession::last_logits(
    const std::vector<std::pair<std::string, Tensor>>& outputs) {
  const Tensor& y = outputs[0].second;  // [batch, T, vocab], contiguous float32
  const int64_t T = y.size(1);
  const float* p = y.data<float>();
  for (int64_t b = 0; b < state_.batch(); ++b)
    std::memcpy(logits_.data() + b * vocab_, p + (b * T + T - 1) * vocab_,
                static_cast<size_t>(vocab_) * sizeof(float));
  return logits_.data();
}

void GenerationSession::check_ids(const Tensor& ids, const char* where) const {
  if (ids.dim() != 2 || ids.size(0) != state_.batch() || ids.size(1) < 1)
    fail(ErrorCode::Shape, where,
         "ids " + ids.shape_str() + " are not [" + str(state_.batch()) + ", T] with T >= 1");
  if (ids.dtype() != DType::I64 && ids.dtype() != DType::I32)
    fail(ErrorCode::DType, where,
         std::string("ids have dtype ") + dtype_safetensors_name(ids.dtype()) +
             "; token ids are I64 or I32");
}

const float* GenerationSession::run_positions(const Tensor& ids) {
  const int64_t T = ids.size(1);
  if (T == 1 && ids.dtype() == DType::I64) return step(ids.data<int64_t>());
  // Only the last position's logits are read: the plan runs the network's per-position tail
  // (final norm, head) there alone.
  if (!prompt_plan_ || prompt_len_ != T || ids.dtype() != DType::I64) {
    std::map<std::string, TensorDesc> desc = {{ids_name_, TensorDesc{ids.shape(), ids.dtype()}}};
    prompt_plan_ = std::make_unique<Plan>(model_, desc, &state_, /*last_position_only=*/true);
    prompt_len_ = ids.dtype() == DType::I64 ? T : 0;  // an int32 plan is not kept
  }
  return last_logits(prompt_plan_->run({{ids_name_, ids}}, state_));
}

const float* GenerationSession::prefill(const Tensor& ids) {
  check_ids(ids, "prompt");
  const int64_t T = ids.size(1);
  if (T > state_.capacity())
    fail(ErrorCode::Shape, "prompt",
         str(T) + " positions are more than the session's capacity of " +
             str(state_.capacity()));
  reset();
  return run_positions(ids);
}

const float* GenerationSession::append(const Tensor& ids) {
  check_ids(ids, "append");
  const int64_t T = ids.size(1);
  if (state_.past() + T > state_.capacity())
    fail(ErrorCode::Shape, "append",
         str(state_.past()) + " positions so far and " + str(T) + " more pass the capacity of " +
             str(state_.capacity()));
  return run_positions(ids);
}

const float* GenerationSession::step(const int64_t* tokens) {
  int64_t* p = step_ids_.data<int64_t>();
  std::copy(tokens, tokens + state_.batch(), p);
  return last_logits(step_plan_->run(step_inputs_, state_));
}

std::vector<std::vector<int64_t>> GenerationSession::generate(
    const Tensor& prompt, int64_t max_new, const std::function<void(int64_t)>& progress) {
  if (max_new < 0) fail(ErrorCode::Arg, kWhere, "max_new_tokens=" + str(max_new) + " must be >= 0");
  const int64_t B = state_.batch();
  const int64_t T = prompt.dim() == 2 ? prompt.size(1) : 0;
  // The sequence grows to T + max_new (the last token is sampled, never run).
  if (T + max_new > state_.capacity())
    fail(ErrorCode::Shape, kWhere,
         "a prompt of " + str(T) + " and " + str(max_new) + " new tokens make " +
             str(T + max_new) + " positions, more than the capacity of " +
             str(state_.capacity()));
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  if (max_new == 0) return out;
  const float* logits = prefill(prompt);
  std::vector<int64_t> next(static_cast<size_t>(B));
  for (int64_t n = 0; n < max_new; ++n) {
    for (int64_t b = 0; b < B; ++b) {
      next[static_cast<size_t>(b)] = sample(b, logits + b * vocab_);
      out[static_cast<size_t>(b)].push_back(next[static_cast<size_t>(b)]);
    }
    if (progress) progress(n + 1);
    if (n + 1 < max_new) logits = step(next.data());
  }
  return out;
}

}  // namespace tessera
