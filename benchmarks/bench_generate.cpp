// Token generation (incremental decoding with a key/value cache, runtime/generation.h) of a
// network file against the weight-read bound measured in the same run. A decode step of a small
// batch reads every weight once (one matrix-vector product per projection) and every cached key
// and value once; at short contexts the weights dominate, so a step's floor is
// weight bytes / read bandwidth.
//
//   bench_generate NET [--weights W.safetensors] [--batch 1] [--prompt 128] [--new 128]
//                  [--contexts 1024,4096] [--threads N] [--json]
//
// 1. The model, loaded strictly when --weights is given (else initialised from seed 0).
// 2. Weight bytes per step: every parameter of every node except embeddings (a lookup reads one
//    row per token), plus each parameter a node reads through a port (the gpt recipe's tied
//    head reads tok.weight). bound = weight bytes / read bandwidth.
// 3. Prefill of seeded random ids [batch, prompt]: one warm-up (it builds the prompt plan and
//    faults in the weights), then best and median of 3; then `new` greedy steps, each timed:
//    median, tokens/s = batch / median, median / bound. Then the same number of positions
//    appended after the prompt in one call (GenerationSession::append), best of 3.
// 4. Per context C of --contexts up to the network's context: prefill C-17 positions, one
//    warm-up step (position C-17), 16 timed steps (positions C-16..C-1): median, the K/V cache
//    bytes the last step reads, the bound with them; and the slope of the step time in us per
//    1000 positions from the main run (prompt + new/2 on average) to the largest C.
// 5. Peak RSS (VmHWM), the CPU model (/proc/cpuinfo), the Highway target, threads.
// The read bandwidth (benchmarks/read_bandwidth.h: 512 MiB, the run's thread count) is measured
// last, after peak RSS is taken: its buffer would otherwise be the peak for models under 512 MiB.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "benchmarks/read_bandwidth.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/process_memory.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/network.h"
#include "runtime/generation.h"
#include "runtime/loader.h"

namespace tessera::bench {
namespace {

constexpr size_t kBandwidthMiB = 512;  // as bench_decode: many times any L3 here
constexpr int kPrefillRuns = 3;
constexpr int64_t kContextSteps = 16;  // timed steps per context, after one warm-up

struct Options {
  std::string net;
  std::optional<std::string> weights;
  int64_t batch = 1, prompt = 128, new_tokens = 128;
  std::vector<int64_t> contexts = {1024, 4096};
  int threads = 0;
  bool json = false;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s NET [--weights W.safetensors] [--batch 1] [--prompt 128] [--new 128] "
               "[--contexts 1024,4096] [--threads N] [--json]\n",
               argv0);
  std::exit(2);
}

int64_t positive(const char* text, const char* argv0) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 1) usage(argv0);
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  o.threads = hardware_threads();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--weights" && has_value) {
      o.weights = argv[++i];
    } else if (a == "--batch" && has_value) {
      o.batch = positive(argv[++i], argv[0]);
    } else if (a == "--prompt" && has_value) {
      o.prompt = positive(argv[++i], argv[0]);
    } else if (a == "--new" && has_value) {
      o.new_tokens = positive(argv[++i], argv[0]);
    } else if (a == "--contexts" && has_value) {
      o.contexts.clear();
      const std::string list = argv[++i];
      for (size_t pos = 0; pos < list.size();) {
        const size_t end = std::min(list.find(',', pos), list.size());
        o.contexts.push_back(positive(list.substr(pos, end - pos).c_str(), argv[0]));
        pos = end + 1;
      }
    } else if (a == "--threads" && has_value) {
      o.threads = static_cast<int>(positive(argv[++i], argv[0]));
    } else if (a == "--json") {
      o.json = true;
    } else if (o.net.empty() && !a.empty() && a[0] != '-') {
      o.net = a;
    } else {
      usage(argv[0]);
    }
  }
  if (o.net.empty()) usage(argv[0]);
  std::sort(o.contexts.begin(), o.contexts.end());
  o.contexts.erase(std::unique(o.contexts.begin(), o.contexts.end()), o.contexts.end());
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// Bytes one decode step reads from the weights: a projection reads its whole matrix for any
// number of rows, an embedding lookup one row per token (negligible), so every parameter counts
// except an embedding's own, and a parameter read through another node's port (a tied head)
// counts again there: it is read again.
double weight_bytes_per_step(const Network& net) {
  const double element = static_cast<double>(dtype_size(net.dtype()));
  double bytes = 0.0;
  for (const ResolvedNode& node : net.nodes()) {
    if (std::string(node.op->name()) != "embedding")
      for (const auto& [name, shape] : node.parameters)
        bytes += static_cast<double>(shape_numel(shape)) * element;
    for (int id : node.inputs) {
      if (id < 0) continue;
      const NetworkValue& v = net.values()[static_cast<size_t>(id)];
      if (v.port != -1) continue;
      for (const auto& [name, shape] : net.nodes()[static_cast<size_t>(v.producer)].parameters)
        if (name == v.parameter) bytes += static_cast<double>(shape_numel(shape)) * element;
    }
  }
  return bytes;
}

Tensor random_ids(int64_t batch, int64_t len, int64_t vocab, uint64_t seed) {
  Tensor ids = Tensor::empty({batch, len}, DType::I64);
  Generator gen(seed);
  int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < batch * len; ++i)
    p[i] = static_cast<int64_t>(gen.next_u64() % static_cast<uint64_t>(vocab));
  return ids;
}

// The next token of every row from the last logits (greedy: the session's default sampling).
void next_tokens(GenerationSession& session, const float* logits, std::vector<int64_t>& tokens) {
  for (int64_t b = 0; b < session.batch(); ++b)
    tokens[static_cast<size_t>(b)] = session.sample(b, logits + b * session.vocab());
}

// Runs `steps` greedy steps from `logits`, timing each step alone (sampling is outside: it is
// the same argmax for every runtime and not what the bound describes). Milliseconds per step.
std::vector<double> timed_steps(GenerationSession& session, const float* logits, int64_t steps) {
  std::vector<int64_t> tokens(static_cast<size_t>(session.batch()));
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) {
    next_tokens(session, logits, tokens);
    const double t0 = steady_now_s();
    logits = session.step(tokens.data());
    ms.push_back((steady_now_s() - t0) * 1e3);
  }
  return ms;
}

struct ContextRun {
  int64_t context;
  double step_ms;   // median of the timed steps
  double kv_bytes;  // K/V cache bytes the step at position C-1 reads (all C positions)
};

// The process's peak resident set (VmHWM), MiB. Not getrusage's ru_maxrss: Linux carries that
// across fork and exec, so a child of a large runner reports at least the runner's peak.
double peak_rss_mib() {
  if (const double bytes = process_status_bytes("VmHWM"); bytes >= 0) return bytes / (1 << 20);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? "" : line.substr(begin);
  }
  return "unknown";
}

// One JSON object on one line, keys in the order added.
class JsonLine {
 public:
  void number(const char* key, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    raw(key, buf);
  }
  void integer(const char* key, int64_t v) { raw(key, std::to_string(v)); }
  void text(const char* key, const std::string& v) { raw(key, quoted(v)); }
  void raw(const char* key, const std::string& json) {
    out_ += out_.empty() ? '{' : ',';
    out_ += quoted(key);
    out_ += ':';
    out_ += json;
  }
  std::string str() const { return out_ + "}"; }

  static std::string quoted(const std::string& s) {
    std::string q = "\"";
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        q += buf;
      } else {
        q += c;
      }
    }
    return q + "\"";
  }

 private:
  std::string out_;
};

int run(const Options& o) {
  set_num_threads(o.threads);
  const LoadedModel loaded = load_model(o.net, o.weights, /*strict=*/o.weights.has_value());
  const Model& model = loaded.model;
  const Network& net = model.network();
  GenerationSession::check(net);
  const std::optional<int64_t> context = GenerationSession::context(net);
  const int64_t capacity = o.prompt + o.new_tokens;
  if (context && capacity > *context)
    fail(ErrorCode::Shape, "bench_generate",
         "--prompt " + std::to_string(o.prompt) + " + --new " + std::to_string(o.new_tokens) +
             " is more than the network's context of " + std::to_string(*context));
  const double weight_bytes = weight_bytes_per_step(net);

  // Prefill and decode at a short context: the weights dominate.
  double first_prefill_ms = 0.0;
  std::vector<double> prefill_ms, step_ms, append_ms;
  double main_kv_bytes = 0.0;  // the cache at capacity prompt + new: the last step reads it all
  int64_t vocab = 0;
  {
    GenerationSession session(model, o.batch, capacity, SamplingOptions{});
    vocab = session.vocab();
    const Tensor ids = random_ids(o.batch, o.prompt, vocab, 1);
    double t0 = steady_now_s();
    const float* logits = session.prefill(ids);
    first_prefill_ms = (steady_now_s() - t0) * 1e3;
    for (int r = 0; r < kPrefillRuns; ++r) {
      t0 = steady_now_s();
      logits = session.prefill(ids);
      prefill_ms.push_back((steady_now_s() - t0) * 1e3);
    }
    step_ms = timed_steps(session, logits, o.new_tokens);
    main_kv_bytes = DecodeState(model, o.batch, capacity).cache_bytes();
    // The same `new` positions given at once after the prompt (append: a conversation's next
    // turn), against stepping through them: one warm-up (it builds the chunk's plan), best of 3.
    const Tensor chunk = random_ids(o.batch, o.new_tokens, vocab, 2);
    for (int r = 0; r <= kPrefillRuns; ++r) {
      session.prefill(ids);
      t0 = steady_now_s();
      session.append(chunk);
      if (r > 0) append_ms.push_back((steady_now_s() - t0) * 1e3);
    }
  }
  const double main_peak_rss = peak_rss_mib();

  // Decode steps deep into longer contexts: each also reads C positions of keys and values.
  std::vector<ContextRun> context_runs;
  std::vector<int64_t> skipped;
  for (const int64_t C : o.contexts) {
    if ((context && C > *context) || C < kContextSteps + 2) {
      skipped.push_back(C);
      continue;
    }
    GenerationSession session(model, o.batch, C, SamplingOptions{});
    const float* logits = session.prefill(
        random_ids(o.batch, C - kContextSteps - 1, vocab, static_cast<uint64_t>(C)));
    std::vector<int64_t> warmup(static_cast<size_t>(o.batch));
    next_tokens(session, logits, warmup);
    logits = session.step(warmup.data());
    const std::vector<double> ms = timed_steps(session, logits, kContextSteps);
    // A state of capacity C holds exactly C positions per sequence: what the step at C-1 reads.
    // Its caches are allocated but never touched here, so they cost no RSS.
    context_runs.push_back({C, median(ms), DecodeState(model, o.batch, C).cache_bytes()});
  }
  const double peak_rss = peak_rss_mib();

  std::vector<float> buffer(kBandwidthMiB * 1024 * 256, 1.0f);  // touched before timing
  const double read_gbs = read_bandwidth_gbs(buffer, o.threads);
  buffer = {};

  const double bound_ms = weight_bytes / (read_gbs * 1e9) * 1e3;
  const double step_median = median(step_ms);
  const double tokens_per_s = static_cast<double>(o.batch) / (step_median * 1e-3);
  const double main_position =
      static_cast<double>(o.prompt) + 0.5 * static_cast<double>(o.new_tokens);
  std::optional<double> slope_us_per_1k;
  if (!context_runs.empty() && static_cast<double>(context_runs.back().context) > main_position)
    slope_us_per_1k = (context_runs.back().step_ms - step_median) * 1e3 /
                      ((static_cast<double>(context_runs.back().context) - main_position) / 1e3);
  const auto bound_with_kv_ms = [&](double kv_bytes) {
    return (weight_bytes + kv_bytes) / (read_gbs * 1e9) * 1e3;
  };
  const std::string cpu = cpu_model_name();
  const char* target = cpu_device().simd_target();

  if (o.json) {
    JsonLine j;
    j.text("net", o.net);
    j.text("weights", loaded.weights);
    j.integer("batch", o.batch);
    j.integer("prompt", o.prompt);
    j.integer("new", o.new_tokens);
    j.integer("threads", o.threads);
    j.text("cpu", cpu);
    j.text("simd_target", target);
    j.integer("parameters", model.parameter_count());
    j.integer("vocab", vocab);
    j.raw("network_context", context ? std::to_string(*context) : "null");
    j.number("read_gbs", read_gbs);
    j.number("weight_bytes", weight_bytes);
    j.number("bound_ms", bound_ms);
    j.number("first_prefill_ms", first_prefill_ms);
    j.number("prefill_ms_best", min_of(prefill_ms));
    j.number("prefill_ms_median", median(prefill_ms));
    j.number("step_ms_median", step_median);
    j.number("step_ms_best", min_of(step_ms));
    j.number("tokens_per_s", tokens_per_s);
    j.number("step_over_bound", step_median / bound_ms);
    j.number("kv_bytes_last_step", main_kv_bytes);
    j.number("append_ms_best", min_of(append_ms));
    std::string runs = "[";
    for (const ContextRun& r : context_runs) {
      JsonLine c;
      c.integer("context", r.context);
      c.number("step_ms", r.step_ms);
      c.number("kv_bytes", r.kv_bytes);
      c.number("bound_ms", bound_with_kv_ms(r.kv_bytes));
      c.number("step_over_bound", r.step_ms / bound_with_kv_ms(r.kv_bytes));
      runs += (runs.size() > 1 ? "," : "") + c.str();
    }
    j.raw("contexts", runs + "]");
    std::string skipped_list = "[";
    for (const int64_t C : skipped)
      skipped_list += (skipped_list.size() > 1 ? "," : "") + std::to_string(C);
    j.raw("contexts_skipped", skipped_list + "]");
    j.raw("slope_us_per_1k", slope_us_per_1k ? std::to_string(*slope_us_per_1k) : "null");
    j.number("peak_rss_main_mib", main_peak_rss);
    j.number("peak_rss_mib", peak_rss);
    std::printf("%s\n", j.str().c_str());
    return 0;
  }

  std::printf("bench_generate: %s%s%s, batch %ld, %d thread(s), target %s, CPU %s\n", o.net.c_str(),
              loaded.weights.empty() ? " (weights from seed 0)" : " with ", loaded.weights.c_str(),
              static_cast<long>(o.batch), o.threads, target, cpu.c_str());
  std::printf("model: %.1f M parameters, vocab %ld, context %s; a step reads %.1f MB of weights\n",
              static_cast<double>(model.parameter_count()) * 1e-6, static_cast<long>(vocab),
              context ? std::to_string(*context).c_str() : "unlimited", weight_bytes * 1e-6);
  std::printf("read bandwidth %.1f GB/s (%d thread(s), %zu MiB): weight-read bound %.2f ms/step\n",
              read_gbs, o.threads, kBandwidthMiB, bound_ms);
  std::printf("prefill %ld: first %.1f ms, best %.1f ms, median %.1f ms of %d\n",
              static_cast<long>(o.prompt), first_prefill_ms, min_of(prefill_ms), median(prefill_ms),
              kPrefillRuns);
  std::printf(
      "decode %ld steps (positions %ld..%ld): median %.2f ms, best %.2f ms, %.1f tokens/s, "
      "%.2fx the bound\n",
      static_cast<long>(o.new_tokens), static_cast<long>(o.prompt), static_cast<long>(capacity - 1),
      step_median, min_of(step_ms), tokens_per_s, step_median / bound_ms);
  std::printf("append %ld positions after the prompt at once: best %.1f ms (%.2f ms per position; "
              "%.1f ms as steps)\n",
              static_cast<long>(o.new_tokens), min_of(append_ms),
              min_of(append_ms) / static_cast<double>(o.new_tokens),
              step_median * static_cast<double>(o.new_tokens));
  if (!context_runs.empty()) {
    std::printf("%8s %10s %12s %22s %11s\n", "context", "step ms", "K/V MB read",
                "bound ms (weights+K/V)", "step/bound");
    for (const ContextRun& r : context_runs)
      std::printf("%8ld %10.2f %12.1f %22.2f %11.2f\n", static_cast<long>(r.context), r.step_ms,
                  r.kv_bytes * 1e-6, bound_with_kv_ms(r.kv_bytes),
                  r.step_ms / bound_with_kv_ms(r.kv_bytes));
  }
  for (const int64_t C : skipped)
    std::printf("context %ld skipped (past the network's context, or under %ld)\n",
                static_cast<long>(C), static_cast<long>(kContextSteps + 2));
  if (slope_us_per_1k)
    std::printf("step slope: %.1f us per 1000 positions (%.0f -> %ld)\n", *slope_us_per_1k,
                main_position, static_cast<long>(context_runs.back().context));
  std::printf("peak RSS: %.0f MiB (%.0f MiB after the %ld-position run)\n", peak_rss, main_peak_rss,
              static_cast<long>(capacity));
  return 0;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  const tessera::bench::Options options = tessera::bench::parse_options(argc, argv);
  try {
    return tessera::bench::run(options);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
}
