// Fuzz target: a whole `tessera run` on a fuzzed network, checkpoint and input, in memory.
//
// Input layout (fuzz/make_corpus.py writes the seeds):
//   byte 0            flags: bit 0 = strict weight loading (the CLI default)
//   u32 LE, bytes     NET: network JSON text, or a safetensors checkpoint carrying
//                     `tessera.network` (a NUL among its first 8 bytes says which, as in the CLI)
//   u32 LE, bytes     W: a weights checkpoint; empty = none (NET's own weights, else the seed)
//   rest              IN: the input safetensors file
// The steps are the CLI's (apps/tessera.cpp cmd_run): load the network and its weights, check
// the input names and dtypes, plan, run, convert the outputs to F32 and serialize them.
//
// Bounds that keep one execution fast: one thread, a 16 MiB memory budget (core/limits.h; run
// with -malloc_limit_mb well above it so that any allocation the budget failed to foresee is a
// crash), and no run of a plan over 5*10^7 FLOPs (about 10 ms under ASan).
//
// Properties, each a bug when it fails (besides crashes, hangs and sanitizer reports):
//  - every failure is a tessera Error with a user-error code (never E_INTERNAL);
//  - outputs have the planned shapes;
//  - a second run of the same plan, whose buffers now hold the first run's values, gives the
//    same bytes: no output depends on memory a run did not write first;
//  - a network that can generate (one int64 ids input [B, T], T >= 2) also runs incrementally:
//    the first position as the prompt, the next T - 2 appended in one call, and one step through
//    a GenerationSession, twice, with the same bytes both times (the incremental path's caches
//    and plans read nothing unwritten).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/limits.h"
#include "core/parallel.h"
#include "fuzz/fuzz_common.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/network.h"
#include "runtime/generation.h"
#include "runtime/loader.h"

using namespace tessera;

namespace {

constexpr const char* kTarget = "fuzz_run";
constexpr uint64_t kBudgetBytes = uint64_t{16} << 20;
constexpr double kMaxFlops = 5e7;

// Reads a u32 LE length and that many bytes; false when the input is too short.
bool take_part(const uint8_t*& p, const uint8_t* end, std::vector<uint8_t>& out) {
  if (end - p < 4) return false;
  uint32_t n;
  std::memcpy(&n, p, 4);
  p += 4;
  if (static_cast<size_t>(end - p) < n) return false;
  out.assign(p, p + n);
  p += n;
  return true;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  if (t.nbytes() == 0) return {};
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// The prompt ids[:, :1], ids[:, 1:T-1] appended, then one step with ids[:, T-1], when the network
// can generate.
void generate_incrementally(const Model& model, const std::map<std::string, Tensor>& tensors) {
  try {
    GenerationSession::check(model.network());
  } catch (const Error&) {
    return;  // not a generating network: E_ARG, as the CLI says
  }
  const Tensor ids = tensors.begin()->second.to(DType::I64).contiguous();
  if (ids.dim() != 2 || ids.size(0) < 1 || ids.size(1) < 2) return;
  const int64_t B = ids.size(0), T = ids.size(1);
  const Tensor prompt = ids.narrow(1, 0, 1).contiguous();
  const Tensor middle = ids.narrow(1, 1, T - 2).contiguous();  // empty when T == 2
  std::vector<int64_t> last(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) last[static_cast<size_t>(b)] = ids.data<int64_t>()[b * T + T - 1];
  std::vector<float> logits[2];
  for (std::vector<float>& out : logits) {
    GenerationSession session(model, B, T, SamplingOptions{});
    session.prefill(prompt);
    if (T > 2) session.append(middle);
    const float* step = session.step(last.data());
    out.assign(step, step + B * session.vocab());
  }
  if (std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) != 0)
    fuzz::bug(kTarget, "two incremental runs of one prompt gave different logits");
}

void run(bool strict, const std::vector<uint8_t>& net, const std::vector<uint8_t>& weights,
         std::vector<uint8_t> input) {
  // NET: a checkpoint when its first 8 bytes hold a NUL (io/network_file.h is_safetensors_path).
  std::optional<SafetensorsFile> checkpoint;
  NetworkSpec spec;
  if (!net.empty() && std::memchr(net.data(), 0, std::min<size_t>(net.size(), 8)) != nullptr) {
    checkpoint.emplace(SafetensorsFile::from_bytes(net, "net.safetensors"));
    spec = network_from_checkpoint(*checkpoint);
  } else {
    spec = parse_network(std::string(net.begin(), net.end()), "net.json");
  }
  Model model(spec, 0);
  std::optional<SafetensorsFile> weights_file;
  const SafetensorsFile* source = nullptr;
  if (!weights.empty()) {
    weights_file.emplace(SafetensorsFile::from_bytes(weights, "weights.safetensors"));
    source = &*weights_file;
  } else if (checkpoint && checkpoint->size() > 0) {
    source = &*checkpoint;
  }
  if (source) load_checkpoint_weights(model, *source, strict);

  const SafetensorsFile in = SafetensorsFile::from_bytes(std::move(input), "input.safetensors");
  if (in.size() != spec.inputs.size())
    fail(ErrorCode::Arg, in.path(), "not one tensor per network input");
  std::map<std::string, Tensor> tensors;
  std::map<std::string, TensorDesc> descs;
  for (const NetworkInput& i : spec.inputs) {
    const SafetensorsTensorInfo& info = in.info(i.name);  // E_ARG when missing
    if (!info.dtype || (!dtype_is_floating(*info.dtype) && *info.dtype != DType::Bool &&
                        *info.dtype != DType::I64 && *info.dtype != DType::I32))
      fail(ErrorCode::DType, "input " + i.name, "dtype " + info.dtype_name);
    Tensor t = in.tensor(i.name);
    descs[i.name] = TensorDesc{t.shape(), t.dtype()};
    tensors.emplace(i.name, std::move(t));
  }
  Plan plan(model, descs);
  if (plan.flops() > kMaxFlops) return;

  std::vector<std::pair<std::string, std::vector<uint8_t>>> first;
  NamedTensors out;
  for (const auto& [name, t] : plan.run(tensors)) {
    const Tensor f = t.to(DType::F32);
    first.emplace_back(name, bytes_of(f));
    out.emplace_back(name, f);
  }
  const auto& outputs = model.network().outputs();
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Shape want = concrete_shape(plan.types()[static_cast<size_t>(outputs[k].second)].shape);
    if (out[k].second.shape() != want)
      fuzz::bug(kTarget, "output " + out[k].first + " is " + out[k].second.shape_str() +
                             ", the plan says " + shape_to_string(want));
  }
  (void)serialize_safetensors(out);

  const auto& again = plan.run(tensors);
  for (size_t k = 0; k < again.size(); ++k)
    if (bytes_of(again[k].second.to(DType::F32)) != first[k].second)
      fuzz::bug(kTarget, "output " + again[k].first + " differs between two runs of one plan");

  generate_incrementally(model, tensors);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool configured = [] {
    set_num_threads(1);
    set_memory_budget(kBudgetBytes);
    return true;
  }();
  (void)configured;
  if (size < 1) return 0;
  const uint8_t* p = data + 1;
  const uint8_t* end = data + size;
  std::vector<uint8_t> net, weights;
  if (!take_part(p, end, net) || !take_part(p, end, weights)) return 0;
  try {
    run((data[0] & 1) != 0, net, weights, std::vector<uint8_t>(p, end));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::Internal) fuzz::bug(kTarget, "E_INTERNAL: " + e.message());
  }
  return 0;
}
