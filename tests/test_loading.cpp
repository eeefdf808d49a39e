// Loading without copying (issue 7): a strict load from a checkpoint builds the layers without
// initialising them, float32 weights become read-only views of the mapping, writes to a
// parameter detach it first, and the device's zeroed allocations are zero whether the block is
// fresh from the OS or reused from its cache. Results must be bitwise those of the copying path.
#include <boost/test/unit_test.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "core/allocator.h"
#include "core/random.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/network.h"
#include "layers/parameters.h"
#include "runtime/loader.h"

using namespace tessera;

namespace {

const std::string kEncoder = std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/";

std::map<std::string, Tensor> run_once(const Model& model, const Tensor& x) {
  Plan plan(model, {{"x", TensorDesc{x.shape(), x.dtype()}}});
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : plan.run({{"x", x}})) out[name] = t.clone();
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

// True when `t`'s data lies inside the file's mapping of tensor `name`.
bool views_file(const Tensor& t, const SafetensorsFile& file, const std::string& name) {
  const Tensor stored = file.tensor(name);
  return t.read_only() && t.raw_data() == stored.raw_data();
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loading)

BOOST_AUTO_TEST_CASE(strict_load_uses_float32_weights_in_place) {
  const LoadedModel loaded = load_model(kEncoder + "encoder.safetensors", std::nullopt, true);
  BOOST_TEST(loaded.weights == kEncoder + "encoder.safetensors");
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  const std::map<std::string, Tensor> state = loaded.model.state_dict();
  BOOST_TEST_REQUIRE(state.size() == 34u);
  int in_place = 0;
  for (const auto& [name, t] : state) {
    // Attention packs q/k/v (weights and biases) into one buffer of its own: those are copies.
    const bool packed = name.find("_attn.q_proj") != std::string::npos ||
                        name.find("_attn.k_proj") != std::string::npos ||
                        name.find("_attn.v_proj") != std::string::npos;
    // Read-only data can only be a checkpoint's mapping (load_model's own, opened apart).
    BOOST_TEST(t.read_only() == !packed, name);
    BOOST_TEST(same_bits(t, file.tensor(name)), name);
    in_place += packed ? 0 : 1;
  }
  BOOST_TEST(in_place == 34 - 12);  // 2 blocks x q/k/v x weight/bias are packed
}

// After a load, every projection weight is packed (the forwards read the panels) and the
// checkpoint's pages of it dropped; the parameter still reads the file's values (its pages come
// back from the page cache), the panels hold the same numbers, and the model's memory counts
// them.
BOOST_AUTO_TEST_CASE(loaded_projection_weights_are_packed_and_still_read_the_file) {
  const LoadedModel loaded = load_model(kEncoder + "encoder.safetensors", std::nullopt, true);
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  const Network& net = loaded.model.network();
  int packed = 0;
  double panel_bytes = 0.0;
  for (size_t i = 0; i < net.nodes().size(); ++i) {
    const ParameterSet* ps = loaded.model.layer(i).parameters();
    if (!ps) continue;
    for (const Parameter& p : ps->all()) {
      if (!p.projection) continue;
      const std::string key = net.nodes()[i].name + "." + p.name;
      BOOST_TEST_REQUIRE(p.panels.defined(), key);
      BOOST_TEST(p.value.file_mapped(), key);
      BOOST_TEST(same_bits(p.value, file.tensor(key)), key);
      // Panel q, step kk, column j holds w[16 q + j][kk]; padding columns are zero.
      const int64_t n = p.value.size(0), k = p.value.size(1);
      const float* w = p.value.data<float>();
      const float* panels = p.panels.data<float>();
      int wrong = 0;
      for (int64_t f = 0; f < (n + 15) / 16 * 16; ++f)
        for (int64_t kk = 0; kk < k; ++kk) {
          const float want = f < n ? w[f * k + kk] : 0.0f;
          wrong += panels[(f / 16) * k * 16 + kk * 16 + f % 16] != want;
        }
      BOOST_TEST(wrong == 0, key);
      panel_bytes += static_cast<double>(p.panels.nbytes());
      ++packed;
    }
  }
  BOOST_TEST(packed == 4);  // two blocks x two feed-forward linears
  double params = 0.0;
  for (const auto& [name, t] : loaded.model.state_dict()) params += static_cast<double>(t.nbytes());
  BOOST_TEST(loaded.model.memory_bytes() >= params + panel_bytes);
  // A tensor of an in-memory checkpoint is read-only but no file mapping: never dropped.
  BOOST_TEST(!SafetensorsFile::from_bytes(read_file_bytes(kEncoder + "encoder.safetensors"), "mem")
                  .tensor(file.names().front())
                  .file_mapped());
}

// The VmFlags line of the mapping in /proc/self/smaps that holds address p ("" if none). A
// mapping's header line is "lo-hi perms ..."; its field lines start "Name:".
static std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    const std::string first = line.substr(0, line.find(' '));
    if (!first.empty() && first.back() != ':') {
      uintptr_t lo = 0, hi = 0;
      inside = std::sscanf(first.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && lo <= addr &&
               addr < hi;
    } else if (inside && first == "VmFlags:") {
      return line;
    }
  }
  return "";
}

BOOST_AUTO_TEST_CASE(checkpoint_mapping_asks_for_small_pages) {
  // A 2 MiB page-cache folio mapped whole would keep megabytes of checkpoint resident around
  // each small tensor read in place (22.5 MB for swin_t): the mapping is marked no-huge ("nh").
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  const Tensor t = file.tensor(file.names().front());
  BOOST_TEST_REQUIRE(t.file_mapped());
  const std::string flags = mapping_flags(t.data<float>());
  BOOST_TEST_REQUIRE(!flags.empty());
  BOOST_TEST(flags.find(" nh") != std::string::npos, flags);
}

BOOST_AUTO_TEST_CASE(in_place_and_copied_weights_give_the_same_bits) {
  const Tensor x = SafetensorsFile::open(kEncoder + "input.safetensors").tensor("x");
  const LoadedModel mapped = load_model(kEncoder + "encoder.safetensors", std::nullopt, true);
  // The copying path: an initialised model loading owned (writable) copies of every tensor.
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  Model copied(network_from_checkpoint(file), 5);
  std::map<std::string, Tensor> owned;
  for (const std::string& name : file.names()) owned[name] = file.tensor(name).clone();
  copied.load_weights(owned, true, "copies");
  for (const auto& [name, t] : copied.state_dict()) BOOST_TEST(!t.read_only(), name);
  BOOST_TEST(same_bits(run_once(mapped.model, x).at("y"), run_once(copied, x).at("y")));
}

BOOST_AUTO_TEST_CASE(non_strict_load_still_initialises_what_is_missing) {
  // Non-strict may leave parameters unloaded, so they are initialised from the seed first.
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  Model model(network_from_checkpoint(file), 3);
  std::map<std::string, Tensor> state;
  for (const std::string& name : file.names())
    if (name != "b0_fc1.weight") state[name] = file.tensor(name);
  const Tensor before = model.state_dict().at("b0_fc1.weight").clone();
  const WeightsReport r = model.load_weights(state, false, "partial");
  BOOST_TEST(r.missing == std::vector<std::string>({"b0_fc1.weight"}));
  const Tensor kept = model.state_dict().at("b0_fc1.weight");
  BOOST_TEST(same_bits(kept, before));
  BOOST_TEST(kept.to_double_vector() !=
             std::vector<double>(static_cast<size_t>(kept.numel()), 0.0));  // drawn
  BOOST_TEST(views_file(model.state_dict().at("b0_fc2.weight"), file, "b0_fc2.weight"));
}

BOOST_AUTO_TEST_CASE(unseeded_model_draws_nothing) {
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  const Model model(network_from_checkpoint(file), std::nullopt);
  // Nothing drawn: zeros, except layer_norm's constant initial weight of ones.
  for (const auto& [name, t] : model.state_dict()) {
    const bool norm_weight = name.find("ln") != std::string::npos && name.ends_with(".weight");
    for (double v : t.to_double_vector()) BOOST_TEST_REQUIRE(v == (norm_weight ? 1.0 : 0.0), name);
  }
}

BOOST_AUTO_TEST_CASE(writes_detach_a_parameter_from_the_mapping) {
  const SafetensorsFile file = SafetensorsFile::open(kEncoder + "encoder.safetensors");
  const Tensor stored = file.tensor("b0_fc1.weight");
  BOOST_TEST(stored.read_only());
  ParameterSet ps;
  ps.add("weight", {256, 64});
  ps.add("bias", {256});
  ps.load({{"weight", stored}, {"bias", file.tensor("b0_fc1.bias")}}, true, "t");
  BOOST_TEST(ps.tensor("weight").raw_data() == stored.raw_data());  // shared, not copied

  Tensor& w = ps.mutable_tensor("weight");  // write access: a private copy first
  BOOST_TEST(!w.read_only());
  BOOST_TEST(w.raw_data() != stored.raw_data());
  BOOST_TEST(same_bits(w, stored));
  w.set_item({0, 0}, 123.0);
  BOOST_TEST(stored.item({0, 0}) != 123.0);  // the checkpoint is untouched

  BOOST_TEST(ps.tensor("bias").read_only());
  ps.all();  // non-const access detaches every parameter
  BOOST_TEST(!ps.tensor("bias").read_only());
  BOOST_TEST(same_bits(ps.tensor("bias"), file.tensor("b0_fc1.bias")));

  // Another dtype is converted, so copied; an owned tensor is copied too (PyTorch's semantics).
  ParameterSet other;
  other.add("weight", {256, 64});
  const Tensor owned = stored.clone();
  other.load({{"weight", owned}}, true, "t");
  BOOST_TEST(other.tensor("weight").raw_data() != owned.raw_data());
  other.load({{"weight", stored.to(DType::F64)}}, true, "t");
  BOOST_TEST(!other.tensor("weight").read_only());
  BOOST_TEST(same_bits(other.tensor("weight"), stored));
}

// Large blocks (>= 1 MiB) come from mmap zero-filled, or from the device's cache holding an
// earlier tensor's data: zeros() must be zero either way.
BOOST_AUTO_TEST_CASE(zeros_are_zero_on_fresh_and_reused_blocks) {
  for (int64_t n : {int64_t{3}, int64_t{1} << 18, (int64_t{1} << 20) + 77, int64_t{3} << 20}) {
    {
      Tensor dirty = Tensor::full({n}, 7.5);
      BOOST_TEST(dirty.item({n - 1}) == 7.5);
    }  // freed: a large block goes to the cache, dirty
    const Tensor z = Tensor::zeros({n});
    const float* p = z.data<float>();
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; ++i) nonzero += p[i] != 0.0f;
    BOOST_TEST(nonzero == 0, "n = " << n);
    BOOST_TEST(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  }
  // allocate_zeroed directly, through the allocator interface.
  Allocator& host = host_allocator();
  void* a = host.allocate(5 << 20);
  std::memset(a, 0xAB, 5 << 20);
  host.deallocate(a);
  auto* b = static_cast<unsigned char*>(host.allocate_zeroed(5 << 20));
  size_t nonzero = 0;
  for (size_t i = 0; i < (5u << 20); ++i) nonzero += b[i] != 0;
  BOOST_TEST(nonzero == 0u);
  host.deallocate(b);
}

BOOST_AUTO_TEST_SUITE_END()
