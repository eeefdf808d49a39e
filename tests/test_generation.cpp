// Incremental generation (runtime/generation.h, interfaces.md §6) against full recomputation:
// the same model run by an ordinary Plan over the whole sequence so far, its last position's
// logits and their argmax, step after step. Models are the gpt recipe and a network of the
// `attention` op with rope, every parameter drawn at random (the layers' seeded init).
// Tolerance for the logits: 2e-4 * max(1, max |reference|): the prompt runs the same kernels as
// the full forward, each step a different but equally accurate path (the decode kernel,
// projections of B rows instead of B*T), float32 throughout.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/text.h"
#include "io/network_file.h"
#include "layers/network.h"
#include "recipes/recipes.h"
#include "runtime/generation.h"
#include "tests/allocation_counter.h"
#include "tests/expect_error.h"

namespace tessera {
namespace {

NetworkSpec tiny_gpt(int64_t context) {
  return parse_network(make_recipe("gpt", {{"vocab_size", 23},
                                           {"d_model", 16},
                                           {"nhead", 2},
                                           {"num_layers", 2},
                                           {"dim_feedforward", 32},
                                           {"context", context}})
                           .dump(),
                       "gpt");
}

// ids -> embedding -> attention@1 (causal, rope) -> layer_norm -> linear: no position table,
// so no context limit. q/k/v weights drawn wider than nn.Linear's default so that attention
// is peaked and decides the logits (with the default the 250-key average barely moves them, and a
// new key rotated at the wrong position went unnoticed).
const char* kRopeNet = R"({
  "dtype": "float32",
  "inputs": {"ids": {"shape": ["B", "T"], "dtype": "int64"}},
  "nodes": [
    {"name": "tok", "op": "embedding", "args": {"num_embeddings": 19, "embedding_dim": 24},
     "inputs": {"x": "ids"}},
    {"name": "attn", "op": "attention", "args": {"heads": 3, "causal": true, "rope": true,
     "init": {"q_proj.weight": 0.3, "k_proj.weight": 0.3, "v_proj.weight": 0.5}},
     "inputs": {"x": "tok"}},
    {"name": "res", "op": "add", "inputs": {"a": "tok", "b": "attn"}},
    {"name": "norm", "op": "layer_norm", "inputs": {"x": "res"}},
    {"name": "head", "op": "linear", "args": {"out_features": 19}, "inputs": {"x": "norm"}}
  ],
  "outputs": {"logits": "head"}
})";

Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint32_t seed) {
  Tensor ids = Tensor::empty({B, T}, DType::I64);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  for (int64_t i = 0; i < B * T; ++i) ids.data<int64_t>()[i] = pick(gen);
  return ids;
}

// The last position's logits of a full forward over `seq` ([B, T] int64), [B, vocab].
std::vector<float> full_last_logits(const Model& model, const Tensor& seq) {
  Plan plan(model, {{"ids", TensorDesc{seq.shape(), DType::I64}}});
  const Tensor& y = plan.run({{"ids", seq}})[0].second;
  const int64_t B = y.size(0), T = y.size(1), V = y.size(2);
  std::vector<float> out(static_cast<size_t>(B * V));
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(y.data<float>() + (b * T + T - 1) * V, V, out.data() + b * V);
  return out;
}

struct Trace {
  std::vector<std::vector<int64_t>> tokens;  // per row
  std::vector<std::vector<float>> logits;    // per position run: [B, vocab]
};

// [B, T1] and [B, T2] int64 ids -> [B, T1 + T2].
Tensor concat_ids(const Tensor& a, const Tensor& b) {
  const int64_t B = a.size(0), T1 = a.size(1), T2 = b.size(1);
  Tensor out = Tensor::empty({B, T1 + T2}, DType::I64);
  for (int64_t r = 0; r < B; ++r) {
    std::copy_n(a.data<int64_t>() + r * T1, T1, out.data<int64_t>() + r * (T1 + T2));
    std::copy_n(b.data<int64_t>() + r * T2, T2, out.data<int64_t>() + r * (T1 + T2) + T1);
  }
  return out;
}

// Greedy generation of `new_tokens` per row through a session, checked position by position
// against full recomputation; returns what the session produced. With `chunks`, each is
// appended after the prompt (GenerationSession::append) before generating.
Trace check_against_recomputation(const Model& model, const Tensor& prompt, int64_t new_tokens,
                                  int64_t capacity, const std::vector<Tensor>& chunks = {}) {
  const int64_t B = prompt.size(0);
  GenerationSession session(model, B, capacity, SamplingOptions{});
  const int64_t V = session.vocab();
  Trace trace;
  trace.tokens.resize(static_cast<size_t>(B));
  Tensor seq = prompt.clone();
  const float* logits = session.prefill(prompt);
  for (const Tensor& chunk : chunks) {
    logits = session.append(chunk);
    seq = concat_ids(seq, chunk);
  }
  BOOST_TEST(session.past() == seq.size(1));
  const int64_t T = seq.size(1);
  for (int64_t n = 0; n < new_tokens; ++n) {
    const std::vector<float> want = full_last_logits(model, seq);
    double top = 1.0, err = 0.0;
    for (float w : want) top = std::max(top, std::fabs(static_cast<double>(w)));
    for (size_t i = 0; i < want.size(); ++i)
      err = std::max(err, std::fabs(static_cast<double>(logits[i]) - want[i]));
    BOOST_TEST(err <= 2e-4 * top, "position " << T + n - 1 << ": max |logit error| " << err
                                               << " > " << 2e-4 * top);
    trace.logits.emplace_back(logits, logits + B * V);
    // Greedy: the full model's argmax, appended to every row.
    Tensor next_seq = Tensor::empty({B, T + n + 1}, DType::I64);
    std::vector<int64_t> next(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t want_token = argmax_token(want.data() + b * V, V);
      const int64_t got = session.sample(b, logits + b * V);
      BOOST_TEST(got == want_token, "row " << b << " token " << n);
      next[static_cast<size_t>(b)] = got;
      trace.tokens[static_cast<size_t>(b)].push_back(got);
      std::copy_n(seq.data<int64_t>() + b * (T + n), T + n,
                  next_seq.data<int64_t>() + b * (T + n + 1));
      next_seq.data<int64_t>()[b * (T + n + 1) + T + n] = got;
    }
    seq = next_seq;
    if (n + 1 < new_tokens) logits = session.step(next.data());
  }
  return trace;
}

BOOST_AUTO_TEST_SUITE(generation)

// The gpt recipe, B = 2, a prompt of 3, greedy to the full context of 24, at 1 and 2 threads:
// every logit within tolerance of recomputation, every token the full model's argmax, and the
// same bits at both thread counts. generate() gives the same tokens.
BOOST_AUTO_TEST_CASE(gpt_greedy_matches_full_recomputation_to_the_context) {
  const int64_t context = 24;
  const Model model(tiny_gpt(context), 11);
  BOOST_TEST(GenerationSession::context(model.network()).value_or(-1) == context);
  const Tensor prompt = random_ids(2, 3, 23, 5);
  std::vector<Trace> traces;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    traces.push_back(check_against_recomputation(model, prompt, context - 3, context));
  }
  set_num_threads(0);
  BOOST_TEST(traces[0].tokens == traces[1].tokens);
  BOOST_TEST((traces[0].logits == traces[1].logits), "logits differ between 1 and 2 threads");
  GenerationSession session(model, 2, context, SamplingOptions{});
  BOOST_TEST(session.generate(prompt, context - 3) == traces[0].tokens);
}

// attention@1 with rope (the new key rotated at its absolute position), no context limit;
// a long prompt (past one decode block of 256 keys) and steps across the block boundary.
BOOST_AUTO_TEST_CASE(rope_attention_matches_full_recomputation) {
  const Model model(parse_network(std::string(kRopeNet), "rope"), 3);
  BOOST_TEST(!GenerationSession::context(model.network()).has_value());
  check_against_recomputation(model, random_ids(2, 250, 19, 8), 12, 300);
  check_against_recomputation(model, random_ids(1, 1, 19, 9), 6, 8);
}

// Appended chunks of new positions (a conversation's next turns) give the logits of full
// recomputation, and so do the steps after them: every appended position's keys and values
// reached the caches at its absolute position. Chunks of 1, of fewer than 16 rows, and of 30
// rows (two passes of the decode kernel) across the 256-key block boundary; B = 2.
BOOST_AUTO_TEST_CASE(append_matches_full_recomputation) {
  const Model gpt(tiny_gpt(24), 12);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_against_recomputation(gpt, random_ids(2, 3, 23, 20), 24 - 3 - 9 - 1, 24,
                                {random_ids(2, 9, 23, 21), random_ids(2, 1, 23, 22)});
  }
  set_num_threads(0);
  const Model rope(parse_network(std::string(kRopeNet), "rope"), 5);
  check_against_recomputation(rope, random_ids(2, 240, 19, 23), 4, 300,
                              {random_ids(2, 30, 19, 24)});
  // Past the capacity: E_SHAPE, and nothing ran.
  GenerationSession session(gpt, 2, 24, SamplingOptions{});
  session.prefill(random_ids(2, 20, 23, 25));
  expect_error(ErrorCode::Shape, "append: 20 positions so far and 5 more pass the capacity of 24",
               [&] { session.append(random_ids(2, 5, 23, 26)); });
  BOOST_TEST(session.past() == 20);
  expect_error(ErrorCode::Shape, "append: ids [1, 2] are not [2, T] with T >= 1",
               [&] { session.append(random_ids(1, 2, 23, 26)); });
}

// Sampling is seeded: the same tokens at any thread count, and again after reset.
BOOST_AUTO_TEST_CASE(sampling_is_seeded_and_independent_of_threads) {
  const Model model(tiny_gpt(32), 4);
  const Tensor prompt = random_ids(2, 4, 23, 6);
  SamplingOptions o;
  o.temperature = 0.9;
  o.top_k = 8;
  o.top_p = 0.95;
  o.seed = 1234;
  std::vector<std::vector<std::vector<int64_t>>> runs;
  for (int threads : {1, 2, 1}) {
    set_num_threads(threads);
    GenerationSession session(model, 2, 32, o);
    runs.push_back(session.generate(prompt, 20));
    runs.push_back(session.generate(prompt, 20));  // generate resets: the same again
  }
  set_num_threads(0);
  for (const auto& r : runs) BOOST_TEST(r == runs[0]);
  o.seed = 1235;
  GenerationSession other(model, 2, 32, o);
  BOOST_TEST(other.generate(prompt, 20) != runs[0], "another seed drew the same 40 tokens");
}

// The prompt's plan runs the per-position tail after the last attention (the last block's
// residual adds, its feed-forward, the final norm and the head) on the last position only: its
// output is [B, 1, vocab], equal to the full forward's last row, and it skips the tail's work at
// the other T - 1 positions (at least the head's 2 * B * (T - 1) * d_model * vocab FLOPs).
BOOST_AUTO_TEST_CASE(prompt_plan_runs_the_head_at_the_last_position_only) {
  const Model model(tiny_gpt(32), 7);
  const int64_t B = 2, T = 9, D = 16, V = 23;
  const Tensor prompt = random_ids(B, T, V, 3);
  const std::map<std::string, TensorDesc> desc = {{"ids", TensorDesc{prompt.shape(), DType::I64}}};
  DecodeState state(model, B, 32);
  Plan last(model, desc, &state, true);
  Plan full(model, desc);
  BOOST_TEST(full.flops() - last.flops() >= 2.0 * B * (T - 1) * D * V);
  const Tensor& y = last.run({{"ids", prompt}}, state)[0].second;
  BOOST_TEST((y.shape() == Shape{B, 1, V}));
  const std::vector<float> want = full_last_logits(model, prompt);
  for (int64_t i = 0; i < B * V; ++i)
    BOOST_TEST(std::fabs(y.data<float>()[i] - want[static_cast<size_t>(i)]) <=
                   2e-4 * std::max(1.0f, std::fabs(want[static_cast<size_t>(i)])),
               "logit " << i);
  // Without a last-position tail (the output is attention's own) the plan is the full one.
  const char* net = R"({"dtype": "float32",
    "inputs": {"ids": {"shape": ["B", "T"], "dtype": "int64"}},
    "nodes": [{"name": "tok", "op": "embedding", "args": {"num_embeddings": 5, "embedding_dim": 8},
               "inputs": {"x": "ids"}},
              {"name": "attn", "op": "attention", "args": {"heads": 2, "causal": true},
               "inputs": {"x": "tok"}}],
    "outputs": {"y": "attn"}})";
  const Model bare(parse_network(std::string(net), "bare"), 1);
  DecodeState bare_state(bare, B, 32);
  Plan bare_last(bare, desc, &bare_state, true);
  BOOST_TEST(bare_last.flops() == Plan(bare, desc).flops());
  BOOST_TEST((bare_last.run({{"ids", random_ids(B, T, 5, 4)}}, bare_state)[0].second.shape() ==
              Shape{B, T, 8}));
}

// A step runs in the plans' memory: no allocation once warm.
BOOST_AUTO_TEST_CASE(a_step_allocates_nothing) {
  const Model model(tiny_gpt(64), 2);
  GenerationSession session(model, 2, 64, SamplingOptions{});
  session.prefill(random_ids(2, 5, 23, 1));
  const int64_t tokens[2] = {3, 4};
  session.step(tokens);
  const testing::Allocations a = testing::count_allocations([&] { session.step(tokens); });
  BOOST_TEST(a.total() == 0, a.str());
}

BOOST_AUTO_TEST_CASE(refuses_what_cannot_generate) {
  const Model gpt(tiny_gpt(8), 1);
  expect_error(ErrorCode::Shape, "9 positions are more than the network's context of 8",
               [&] { GenerationSession(gpt, 1, 9, SamplingOptions{}); });
  GenerationSession session(gpt, 2, 8, SamplingOptions{});
  expect_error(ErrorCode::Shape, "a prompt of 5 and 4 new tokens make 9 positions",
               [&] { session.generate(random_ids(2, 5, 23, 1), 4); });
  expect_error(ErrorCode::Shape, "prompt: ids [1, 3] are not [2, T]",
               [&] { session.prefill(random_ids(1, 3, 23, 1)); });
  Tensor bad = random_ids(2, 3, 23, 1);
  bad.data<int64_t>()[4] = 23;
  expect_error(ErrorCode::Shape, "tok (embedding): id 23", [&] { session.prefill(bad); });
  session.prefill(random_ids(2, 7, 23, 2));
  const int64_t tokens[2] = {1, 2};
  session.step(tokens);
  expect_error(ErrorCode::Shape, "8 positions so far and 1 more pass the capacity of 8",
               [&] { session.step(tokens); });
  SamplingOptions o;
  o.top_p = 0.0;
  expect_error(ErrorCode::Arg, "top_p", [&] { GenerationSession(gpt, 1, 8, o); });

  // Attention that sees later positions, and inputs that are not ids.
  auto net = [](const std::string& json) { return Model(parse_network(json, "t"), 1); };
  const Model bidirectional = net(R"({"inputs": {"ids": {"shape": ["B", "T"], "dtype": "int64"}},
    "nodes": [{"name": "tok", "op": "embedding", "args": {"num_embeddings": 5, "embedding_dim": 8},
               "inputs": {"x": "ids"}},
              {"name": "sa", "op": "multihead_attention",
               "args": {"embed_dim": 8, "num_heads": 2, "batch_first": true, "need_weights": false},
               "inputs": {"query": "tok"}}],
    "outputs": {"y": "sa"}})");
  expect_error(ErrorCode::Arg, "sa (multihead_attention): the network cannot run one position "
               "at a time (generate): multihead attention without is_causal",
               [&] { GenerationSession(bidirectional, 1, 4, SamplingOptions{}); });
  const Model floats = net(R"({"inputs": {"x": {"shape": ["B", "T", 4]}},
    "nodes": [{"name": "l", "op": "linear", "args": {"out_features": 3}, "inputs": {"x": "x"}}],
    "outputs": {"y": "l"}})");
  expect_error(ErrorCode::Arg, "need int64 ids [B, T]",
               [&] { GenerationSession(floats, 1, 4, SamplingOptions{}); });
  const Model softmax_seq = net(R"({"inputs": {"ids": {"shape": ["B", "T"], "dtype": "int64"}},
    "nodes": [{"name": "tok", "op": "embedding", "args": {"num_embeddings": 5, "embedding_dim": 8},
               "inputs": {"x": "ids"}},
              {"name": "sm", "op": "softmax", "args": {"dim": 1}, "inputs": {"x": "tok"}}],
    "outputs": {"y": "sm"}})");
  expect_error(ErrorCode::Arg, "sm (softmax): the network cannot run one position at a time "
               "(generate): softmax over the sequence dim T",
               [&] { GenerationSession(softmax_seq, 1, 4, SamplingOptions{}); });
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace tessera
