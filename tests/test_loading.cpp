// Loading without copying (issue 7): a strict load from a checkpoint builds the layers without
// initialising them, float32 weights become read-only views of the mapping, writes to a
// parameter detach it first, and the device's zeroed allocations are zero whether the block is
// fresh from the OS or reused from its cache. Results must be bitwise those of the copying path.
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "backends/cpu/cpu_device.h"
#include "core/allocator.h"
#include "core/process_memory.h"
#include "core/random.h"
#include "io/network_file.h"
#include "io/panel_cache.h"
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

// ---- The panel cache (io/panel_cache.h, load_model's panel_cache_dir).
namespace {

namespace fs = std::filesystem;

// A directory with a copy of the encoder checkpoint (its own inode and mtime), removed at the end.
struct CacheDir {
  fs::path root;
  std::string checkpoint, cache;
  CacheDir() {
    static int counter = 0;
    root = fs::temp_directory_path() /
           ("tessera_panel_cache_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(root);
    checkpoint = (root / "encoder.safetensors").string();
    fs::copy_file(kEncoder + "encoder.safetensors", checkpoint);
    cache = (root / "cache").string();
  }
  ~CacheDir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  LoadedModel load(bool strict = true) const {
    return load_model(checkpoint, std::nullopt, strict, 0, cache);
  }
};

// Every packed projection of `m`: key -> (panels' bytes, whether they view a file mapping).
std::map<std::string, std::pair<std::vector<uint8_t>, bool>> panels_of(const Model& m) {
  std::map<std::string, std::pair<std::vector<uint8_t>, bool>> out;
  for (const PackedProjection& p : m.packed_projections()) {
    const auto* b = static_cast<const uint8_t*>(p.panels->raw_data());
    out[p.key] = {std::vector<uint8_t>(b, b + p.panels->nbytes()), p.panels->file_mapped()};
  }
  return out;
}

// Whole pages of [p, p + bytes) mapped in this process (the present bit of /proc/self/pagemap,
// which needs no privilege), or -1 when pagemap cannot be read.
int64_t mapped_whole_pages(const void* p, size_t bytes) {
  const uintptr_t page = 4096, lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page,
                  hi = (reinterpret_cast<uintptr_t>(p) + bytes) / page;
  // pread of whole 8-byte entries: pagemap refuses reads of other sizes (an ifstream's buffer).
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int64_t mapped = 0;
  for (uintptr_t i = lo; i < hi && mapped >= 0; ++i) {
    uint64_t entry = 0;
    if (::pread(fd, &entry, 8, static_cast<off_t>(i * 8)) != 8) mapped = -1;
    else mapped += static_cast<int64_t>((entry >> 63) & 1);
  }
  ::close(fd);
  return mapped;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// The cache file's JSON header, and the file with its header replaced by `json` (same data
// start as long as the header stays within its 4096-byte page, as these edits do).
std::string header_of(const std::vector<uint8_t>& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data() + 8, 8);
  return std::string(file.begin() + 16, file.begin() + 16 + static_cast<int64_t>(n));
}
std::vector<uint8_t> with_header(std::vector<uint8_t> file, const std::string& json) {
  const std::string old = header_of(file);
  BOOST_REQUIRE(json.size() <= old.size() + 64);
  const uint64_t n = json.size();
  const size_t data_start = (16 + old.size() + 4095) / 4096 * 4096;
  std::vector<uint8_t> out(file.size(), 0);
  std::memcpy(out.data(), file.data(), 8);
  std::memcpy(out.data() + 8, &n, 8);
  std::memcpy(out.data() + 16, json.data(), json.size());
  std::memcpy(out.data() + data_start, file.data() + data_start, file.size() - data_start);
  return out;
}
std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, from);
  return s.replace(at, from.size(), to);
}

}  // namespace

BOOST_AUTO_TEST_CASE(panel_cache_is_written_then_mapped_with_the_same_bits) {
  const CacheDir dir;
  const Tensor x = SafetensorsFile::open(kEncoder + "input.safetensors").tensor("x");
  const LoadedModel plain = load_model(dir.checkpoint, std::nullopt, true, 0, std::string());
  BOOST_TEST(plain.panel_cache.empty());
  const LoadedModel first = dir.load();  // a miss: packs, then writes the file
  BOOST_TEST(!first.panel_cache_hit);
  BOOST_TEST(first.panel_cache_warning.empty(), first.panel_cache_warning);
  BOOST_TEST(first.panel_cache.rfind(dir.cache + "/", 0) == 0u, first.panel_cache);
  BOOST_TEST_REQUIRE(fs::is_regular_file(first.panel_cache));
  const LoadedModel second = dir.load();  // a hit: every panel a view of the cache's mapping
  BOOST_TEST(second.panel_cache_hit);
  BOOST_TEST(second.panel_cache == first.panel_cache);
  const auto packed = panels_of(plain.model), cached = panels_of(second.model);
  BOOST_TEST_REQUIRE(packed.size() == 4u);
  BOOST_TEST_REQUIRE(cached.size() == packed.size());
  for (const auto& [key, p] : packed) {
    BOOST_TEST(!p.second, key);
    BOOST_TEST(cached.at(key).second, key);
    BOOST_TEST((cached.at(key).first == p.first), key);
  }
  const Tensor want = run_once(plain.model, x).at("y");
  BOOST_TEST(same_bits(run_once(first.model, x).at("y"), want));
  BOOST_TEST(same_bits(run_once(second.model, x).at("y"), want));
  // The weights' rows are never read on a hit, and the small tensors' first reads must not leave
  // the rows' pages mapped around them (fault-around), as packing does not.
  const std::map<std::string, Tensor> state = second.model.state_dict();
  for (const auto& [key, p] : packed) {
    const Tensor& rows = state.at(key);
    BOOST_TEST_REQUIRE(rows.file_mapped(), key);
    BOOST_TEST(mapped_whole_pages(rows.raw_data(), rows.nbytes()) == 0, key);
  }
  // Another checkpoint path gets another file in the same directory.
  BOOST_TEST(PanelCacheFile::path_for(dir.cache, dir.checkpoint) == first.panel_cache);
  BOOST_TEST(PanelCacheFile::path_for(dir.cache, kEncoder + "encoder.safetensors") !=
             first.panel_cache);
}

BOOST_AUTO_TEST_CASE(panel_cache_is_rebuilt_when_stale_or_broken) {
  const CacheDir dir;
  const Tensor x = SafetensorsFile::open(kEncoder + "input.safetensors").tensor("x");
  const Tensor want =
      run_once(load_model(dir.checkpoint, std::nullopt, true, 0, std::string()).model, x).at("y");
  const std::string path = dir.load().panel_cache;
  const std::vector<uint8_t> good = read_file_bytes(path);
  const std::string header = header_of(good);
  const std::string layout = projection_panel_layout(cpu_device());
  // Each damaged file is a miss (never an error or a read outside the file), the load packs
  // and gives the same bits, and the file it rewrites is a hit again.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> broken = {
      {"empty", {}},
      {"prefix only", std::vector<uint8_t>(good.begin(), good.begin() + 15)},
      {"truncated data", std::vector<uint8_t>(good.begin(), good.end() - 4096)},
      {"bad magic", [&] { auto b = good; b[0] = 'X'; return b; }()},
      {"header length past the file", [&] { auto b = good; b[15] = 0x7f; return b; }()},
      {"not JSON", with_header(good, std::string(header.size(), 'x'))},
      {"deep JSON", with_header(good, std::string(40, '[') + std::string(40, ']'))},
      {"version 2", with_header(good, replaced(header, "\"version\":1", "\"version\":2"))},
      {"other layout", with_header(good, replaced(header, layout, "f32 panels of 8"))},
      {"offset past the end",
       with_header(good, replaced(header, "\"offset\":0", "\"offset\":1099511627776"))},
      {"unaligned offset", with_header(good, replaced(header, "\"offset\":0", "\"offset\":4"))},
      {"negative floats", with_header(good, replaced(header, "\"floats\":", "\"floats\":-"))},
      {"floats of another shape", with_header(good, replaced(header, "\"rows\":", "\"rows\":1"))},
      {"string inode", with_header(good, replaced(header, "\"inode\":", "\"inode\":\"1\",\"x\":"))},
  };
  for (const auto& [what, bytes] : broken) {
    write_bytes(path, bytes);
    const LoadedModel rebuilt = dir.load();
    BOOST_TEST(!rebuilt.panel_cache_hit, what);
    BOOST_TEST(rebuilt.panel_cache_warning.empty(), what << ": " << rebuilt.panel_cache_warning);
    BOOST_TEST(same_bits(run_once(rebuilt.model, x).at("y"), want), what);
    BOOST_TEST(dir.load().panel_cache_hit, what);
  }
  // A checkpoint touched since (another mtime) is a miss; why says so.
  const SafetensorsFile before = SafetensorsFile::open(dir.checkpoint);
  fs::last_write_time(dir.checkpoint, fs::last_write_time(dir.checkpoint) - std::chrono::hours(1));
  const SafetensorsFile after = SafetensorsFile::open(dir.checkpoint);
  BOOST_TEST(!(after.identity() == before.identity()));
  std::string why;
  BOOST_TEST(!PanelCacheFile::open(path, after.identity(), layout, &why).has_value());
  BOOST_TEST(why == "the checkpoint changed");
  BOOST_TEST(PanelCacheFile::open(path, before.identity(), layout, &why).has_value());
  BOOST_TEST(!dir.load().panel_cache_hit);
  BOOST_TEST(dir.load().panel_cache_hit);
  BOOST_TEST(!PanelCacheFile::open(dir.cache + "/none.tpanels", after.identity(), layout, &why));
  BOOST_TEST(why == "absent");
}

BOOST_AUTO_TEST_CASE(panel_cache_failures_are_warnings_and_seeded_weights_stay_out) {
  const CacheDir dir;
  const Tensor x = SafetensorsFile::open(kEncoder + "input.safetensors").tensor("x");
  const Tensor want =
      run_once(load_model(dir.checkpoint, std::nullopt, true, 0, std::string()).model, x).at("y");
  // The cache "directory" is a file: nothing can be written, the model is fine.
  std::ofstream(dir.cache) << "not a directory";
  const LoadedModel blocked = dir.load();
  BOOST_TEST(!blocked.panel_cache_hit);
  BOOST_TEST(blocked.panel_cache_warning.find("E_IO") != std::string::npos,
             blocked.panel_cache_warning);
  BOOST_TEST(same_bits(run_once(blocked.model, x).at("y"), want));
  fs::remove(dir.cache);

  // A non-strict load of a checkpoint without b0_fc1.weight seeds it: its panels are not cached.
  const SafetensorsFile full = SafetensorsFile::open(dir.checkpoint);
  std::map<std::string, Tensor> partial;
  for (const std::string& name : full.names())
    if (name != "b0_fc1.weight") partial[name] = full.tensor(name);
  const std::string partial_path = (dir.root / "partial.safetensors").string();
  save_safetensors(partial_path, partial, full.metadata());
  const LoadedModel seeded = load_model(partial_path, std::nullopt, false, 7, dir.cache);
  BOOST_TEST(seeded.report.missing == std::vector<std::string>({"b0_fc1.weight"}));
  std::string why;
  const auto cache = PanelCacheFile::open(seeded.panel_cache,
                                          SafetensorsFile::open(partial_path).identity(),
                                          projection_panel_layout(cpu_device()), &why);
  BOOST_TEST_REQUIRE(cache.has_value(), why);
  BOOST_TEST(cache->size() == 3u);
  BOOST_TEST(load_model(partial_path, std::nullopt, false, 7, dir.cache).panel_cache_hit);
}

BOOST_AUTO_TEST_CASE(panel_cache_hit_keeps_the_peak_rss_to_the_panels) {
  // 24 linears 512 -> 512: 24 MiB of rows, each beside a 2 KiB bias read in place. Written in
  // one write(), the file sits in the page cache in large folios, which Linux 6.18 maps whole
  // when a bias is first read: without releasing the rows beside each bias at once, a cache hit
  // mapped all 24 MiB of rows before dropping them (as vit_b_16's peak RSS was 436 MB against
  // 349 with the rows released at each bias). Kernels that map only the 64 KiB fault-around
  // window never come near the bound.
  const CacheDir dir;
  constexpr int kLayers = 24;
  constexpr int64_t kWidth = 512;
  nlohmann::json nodes = nlohmann::json::array();
  std::map<std::string, Tensor> weights;
  std::string last = "x";
  for (int i = 0; i < kLayers; ++i) {
    const std::string name = std::string("l").append(std::to_string(100 + i));
    nodes.push_back({{"name", name}, {"op", "linear"}, {"args", {{"out_features", kWidth}}},
                     {"inputs", {{"x", last}}}});
    weights[name + ".weight"] = Tensor::full({kWidth, kWidth}, 0.001 * (i + 1));
    weights[name + ".bias"] = Tensor::full({kWidth}, 0.5);
    last = name;
  }
  const nlohmann::json net = {
      {"inputs", {{"x", {4, kWidth}}}}, {"nodes", nodes}, {"outputs", {{"y", last}}}};
  const std::string net_path = (dir.root / "net.json").string();
  std::ofstream(net_path) << net.dump();
  const std::string weights_path = (dir.root / "wide.safetensors").string();
  const std::vector<uint8_t> bytes = serialize_safetensors(weights);
  const int fd = ::open(weights_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  BOOST_TEST_REQUIRE(fd >= 0);
  BOOST_TEST_REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);

  double panel_bytes = 0.0;
  {
    const LoadedModel first = load_model(net_path, weights_path, true, 0, dir.cache);  // packs
    BOOST_TEST_REQUIRE(!first.panel_cache_hit);
    for (const PackedProjection& p : first.model.packed_projections())
      panel_bytes += static_cast<double>(p.panels->nbytes());
  }
  BOOST_TEST_REQUIRE(panel_bytes >= kLayers * kWidth * kWidth * 4.0);
  BOOST_TEST_REQUIRE(reset_peak_rss());  // VmHWM restarts from the current RSS
  const double rss_before = process_status_bytes("VmRSS");
  BOOST_TEST_REQUIRE(rss_before > 0);
  const LoadedModel second = load_model(net_path, weights_path, true, 0, dir.cache);
  BOOST_TEST_REQUIRE(second.panel_cache_hit);
  const double grew = process_status_bytes("VmHWM") - rss_before;
  // The panels (mapped from the cache), the model's own few KiB, and at most two 2 MiB folios
  // of rows mapped at once around a bias: bound 8 MiB over the panels; all the rows are 24 MiB.
  BOOST_TEST(grew <= panel_bytes + 8.0 * (1 << 20),
             "peak RSS grew " << grew / (1 << 20) << " MiB for " << panel_bytes / (1 << 20)
                              << " MiB of panels");
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
