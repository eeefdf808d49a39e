// Generating tokens with a key/value cache (interfaces.md §6): the session `tessera generate`,
// the C API and the C++ wrapper all use.
//
// A GenerationSession holds, for one loaded Model, the caches of its causal attention nodes (a
// DecodeState sized for batch x capacity positions) and two plans: one bound to the prompt
// [B, T] and one bound to a single new position [B, 1]. The prompt runs once through the
// ordinary (flash) attention path, filling the caches; each step then runs the network on one
// new position per sequence, the attention nodes reading every earlier key and value from their
// cache: O(T) work per token instead of a full forward over the sequence.
//
// Ownership: a session refers to its Model, which must outlive it (the C API keeps the model
// alive while a session exists: see tessera.h). One session serves one thread at a time;
// many sessions may run over one Model at once (the model is immutable).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/network.h"
#include "runtime/sampling.h"

namespace tessera {

class GenerationSession {
 public:
  // E_ARG when the network cannot generate (not one int64 [B, T] ids input and one
  // [B, T, vocab] output, or a node that does not act per position apart from causal
  // attention: named), E_SHAPE when capacity exceeds the context or the caches exceed the
  // memory budget, E_ARG for bad sampling options.
  GenerationSession(const Model& model, int64_t batch, int64_t capacity,
                    const SamplingOptions& sampling);
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // Whether the network can generate (E_ARG as the constructor), before any cache exists.
  static void check(const Network& network);
  // The longest sequence the network accepts (the gpt recipe's context: its position table),
  // found by binding; nullopt when no length is refused (up to 2^24 positions).
  static std::optional<int64_t> context(const Network& network);

  int64_t batch() const { return state_.batch(); }
  int64_t capacity() const { return state_.capacity(); }
  int64_t vocab() const { return vocab_; }
  int64_t past() const { return state_.past(); }  // positions run so far per sequence

  // Forgets every position and restarts the sampler's streams from the seed.
  void reset();
  // Resets, then runs the prompt: int64 (or int32) ids [batch, T], T >= 1 and within the
  // capacity (E_SHAPE), ids within the vocabulary (E_SHAPE from the embedding). Returns the
  // logits of the last position, [batch, vocab] row-major, valid until the next call.
  const float* prefill(const Tensor& ids);
  // Runs one new position per sequence (`tokens`: batch ids) after the ones so far; E_SHAPE past
  // the capacity. Returns the new position's logits as prefill does.
  const float* step(const int64_t* tokens);
  // Runs T new positions per sequence after the ones so far, without resetting (a conversation's
  // next turn): ids [batch, T] as for prefill; E_SHAPE when past() + T passes the capacity
  // (nothing runs then). One pass over the weights for all T, the attention reading the cache in
  // blocks shared by up to 16 new rows. Returns the last new position's logits.
  const float* append(const Tensor& ids);
  // The logits of the last position run, [batch, vocab] (what prefill and step returned).
  const float* logits() const { return logits_.data(); }
  // The next token of batch row `row` from its logits (greedy or sampled, runtime/sampling.h).
  int64_t sample(int64_t row, const float* logits) { return sampler_.next(row, logits); }

  // The whole loop: prompt, then max_new tokens per row (prompt excluded), each appended and fed
  // back; E_SHAPE before anything runs when T + max_new exceeds the capacity. `progress` (may be
  // null) is called after each token with the count so far.
  std::vector<std::vector<int64_t>> generate(const Tensor& prompt, int64_t max_new,
                                             const std::function<void(int64_t)>& progress = {});

 private:
  // `ids`: DecodeState::ids_input of the network (the input's name, the sequence symbol).
  GenerationSession(const Model& model, int64_t batch, int64_t capacity,
                    const SamplingOptions& sampling,
                    const std::pair<std::string, std::string>& ids);
  const float* last_logits(const std::vector<std::pair<std::string, Tensor>>& outputs);
  // E_SHAPE / E_DTYPE unless ids are [batch, T >= 1] int64 or int32; `where` names the call.
  void check_ids(const Tensor& ids, const char* where) const;
  // Runs ids [batch, T] after the positions so far (the caller checked the capacity).
  const float* run_positions(const Tensor& ids);

  const Model& model_;
  std::string ids_name_;
  DecodeState state_;
  SamplingOptions sampling_;
  int64_t vocab_ = 0;
  TokenSampler sampler_;
  std::unique_ptr<Plan> prompt_plan_;  // bound to the last prompt's (or appended chunk's) length
  int64_t prompt_len_ = 0;
  std::unique_ptr<Plan> step_plan_;    // bound to [batch, 1]
  Tensor step_ids_;                    // [batch, 1] int64
  std::map<std::string, Tensor> step_inputs_;  // {ids: step_ids_}: a step allocates nothing
  std::vector<float> logits_;          // [batch, vocab]
};

}  // namespace tessera
