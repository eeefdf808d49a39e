// Hostile inputs and reliability (SECURITY.md): the resource limits of core/limits.h (rank,
// JSON depth, the memory budget of models and plans), files whose header promises more than
// they hold, regressions for what fuzzing found (fuzz/), and bitwise determinism of every op
// across runs and thread counts. The cli suite covers the command line's side: budget errors,
// and an output file that survives a SIGKILL mid-run.
#include <fcntl.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "core/limits.h"
#include "core/parallel.h"
#include "core/random.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/network.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

NetworkSpec spec_of(const std::string& json) { return parse_network(json, "test.json"); }

// Sets the process's memory budget for one scope, then restores the default.
struct BudgetScope {
  explicit BudgetScope(uint64_t bytes) { set_memory_budget(bytes); }
  ~BudgetScope() { set_memory_budget(0); }
};

// Caps the worker threads for one scope, then restores all cores.
struct ThreadScope {
  explicit ThreadScope(int n) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(0); }
};

// A safetensors file from header text and data bytes (the length prefix computed).
std::vector<uint8_t> st_file(const std::string& header, size_t data_bytes = 0) {
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0x5a);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Runs `model` on `in` at 1, 2 and 8 threads, twice each through one plan, checking that every
// output has the same bytes every time; returns how many outputs there were.
size_t outputs_bitwise_across_threads(const Model& model, const std::map<std::string, Tensor>& in) {
  std::map<std::string, TensorDesc> descs;
  for (const auto& [name, t] : in) descs[name] = TensorDesc{t.shape(), t.dtype()};
  std::map<std::string, std::vector<uint8_t>> reference;
  for (int threads : {1, 2, 8}) {
    ThreadScope scope(threads);
    Plan plan(model, descs);
    for (int rep = 0; rep < 2; ++rep) {
      for (const auto& [name, t] : plan.run(in)) {
        const std::vector<uint8_t> bytes = bytes_of(t);
        auto [it, first] = reference.emplace(name, bytes);
        BOOST_TEST((first || it->second == bytes),
                   "output " << name << " differs at threads=" << threads << " run " << rep);
      }
    }
  }
  return reference.size();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(security)

// ---------------------------------------------------------------- JSON depth

// Regression: `tessera summary` on a 400 KB file whose args nested 200,000 arrays deep died of
// a stack overflow (SIGSEGV): nlohmann copies values recursively when the node's args are
// stored, and already inside parse() when the next key grows the node's ordered_map (its
// vector copies the members). Now refused with E_FORMAT while parsing, before any copy.
BOOST_AUTO_TEST_CASE(deeply_nested_network_json_is_refused) {
  auto nested = [](int depth) {
    return R"({"inputs": {"x": [2, 8]}, "nodes": [{"name": "n0", "op": "linear", "args":)"
           R"( {"out_features": )" +
           std::string(static_cast<size_t>(depth), '[') +
           std::string(static_cast<size_t>(depth), ']') +
           R"(}, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})";
  };
  expect_error(ErrorCode::Format, "deeper than 128 levels",
               [&] { parse_network(nested(200000), "deep.json"); });
  // The root, nodes, the node and args take 4 levels: 124 more arrays reach exactly 128, which
  // parses; the wrong argument type is the resolver's E_ARG.
  expect_error(ErrorCode::Format, "deeper than 128",
               [&] { parse_network(nested(125), "deep.json"); });
  const NetworkSpec spec = parse_network(nested(124), "deep.json");
  expect_error(ErrorCode::Arg, "argument out_features must be an integer",
               [&] { Network::resolve(spec); });
  // The same text stored in a checkpoint's metadata takes the same path.
  const auto file = SafetensorsFile::from_bytes(
      serialize_safetensors(NamedTensors{}, {{kNetworkMetadataKey, nested(200000)}}), "m.st");
  expect_error(ErrorCode::Format, "deeper than 128", [&] { network_from_checkpoint(file); });
}

// Regression (fuzz_network): a number beyond the double range made nlohmann throw
// out_of_range, which escaped parse_network as a foreign exception: `tessera summary` printed
// E_INTERNAL and exited 1 for what is malformed JSON.
BOOST_AUTO_TEST_CASE(numbers_beyond_double_are_format_errors) {
  expect_error(ErrorCode::Format, "net.json: not valid JSON: number overflow parsing '1e606'", [] {
    parse_network(
        std::string(R"({"inputs": {"x": [2, 8]}, "nodes": [{"name": "ln", "op": "layer_norm",
      "args": {"eps": 1e606}, "inputs": {"x": "x"}}], "outputs": {"y": "ln"}})"),
        "net.json");
  });
}

// ---------------------------------------------------------------- rank

BOOST_AUTO_TEST_CASE(rank_is_bounded_at_64) {
  BOOST_TEST(Tensor::zeros(Shape(64, 1)).dim() == 64);
  expect_error(ErrorCode::Shape, "rank 65 exceeds the limit of 64",
               [] { Tensor::zeros(Shape(65, 1)); });
  const Tensor t = Tensor::zeros(Shape(64, 1));
  expect_error(ErrorCode::Shape, "rank 65", [&] { t.unsqueeze(0); });
  expect_error(ErrorCode::Shape, "rank 65", [&] { t.view(Shape(65, 1)); });

  // A file may declare rank 70 (the reference reads it, inspect lists it); computing is E_SHAPE.
  std::string dims = "1";
  for (int i = 1; i < 70; ++i) dims += ",1";
  const auto file = SafetensorsFile::from_bytes(
      st_file(R"({"x":{"dtype":"F32","shape":[)" + dims + R"(],"data_offsets":[0,4]}})", 4),
      "rank70.safetensors");
  BOOST_TEST(file.info("x").shape.size() == 70u);
  BOOST_TEST(!file.info("x").computable());
  BOOST_TEST(file.tensors().empty());
  expect_error(ErrorCode::Shape, "tensor 'x' has rank 70, over the limit of 64",
               [&] { file.tensor("x"); });

  // A network input of rank 65.
  std::string shape = "1";
  for (int i = 1; i < 65; ++i) shape += ",1";
  expect_error(ErrorCode::Shape, "input x: rank 65 exceeds the limit of 64", [&] {
    spec_of(R"({"inputs": {"x": [)" + shape + R"(]}, "nodes": [], "outputs": {"y": "x"}})");
  });
}

// ---------------------------------------------------------------- checkpoints

// What the header declares must be in the file before a byte of data is touched: no tensor can
// need more memory than the file holds, and a short file never maps a page past its end (which
// would raise SIGBUS).
BOOST_AUTO_TEST_CASE(headers_cannot_claim_more_than_the_file_holds) {
  // 2^40 floats declared, 16 bytes present: refused while reading the header, no allocation.
  const std::string huge =
      R"({"w":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4398046511104]}})";
  expect_error(ErrorCode::Format, "truncated",
               [&] { SafetensorsFile::from_bytes(st_file(huge, 16), "huge.safetensors"); });
  // The mapped path: a file cut short after a 1 MiB tensor's first page.
  const fs::path dir = fs::temp_directory_path() / ("tessera_security_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "cut.safetensors").string();
  {
    const std::vector<uint8_t> full =
        st_file(R"({"w":{"dtype":"F32","shape":[262144],"data_offsets":[0,1048576]}})", 1048576);
    // Only the first 4096 data bytes are written. (Not resize(): GCC 12 at -O3 with ASan warns
    // about the growing branch of a shrinking resize, -Wstringop-overflow, a false positive.)
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(full.data()),
               static_cast<std::streamsize>(full.size() - 1048576 + 4096));
  }
  expect_error(ErrorCode::Format, "tensors need 1048576 data bytes but the file has only 4096",
               [&] { SafetensorsFile::open(path); });
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- memory budget

BOOST_AUTO_TEST_CASE(memory_budget_default_and_override) {
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  const uint64_t by_default = memory_budget();
  // Half of memory (or of a lower cgroup limit), unless the environment set it.
  if (std::getenv("TESSERA_MEMORY_BUDGET") == nullptr) {
    BOOST_TEST(by_default <= physical / 2);
    BOOST_TEST(by_default >= uint64_t{1} << 20);
  }
  set_memory_budget(12345);
  BOOST_TEST(memory_budget() == 12345u);
  set_memory_budget(0);
  BOOST_TEST(memory_budget() == by_default);
  BOOST_TEST(format_bytes(512) == "512 B");
  BOOST_TEST(format_bytes(1.5 * 1024 * 1024 * 1024) == "1.50 GiB");
}

// Parameters are allocated when a Model is built, from shapes the network file declares: a
// 150-byte file can ask for petabytes. Refused before the first layer exists (without the check
// these would throw std::bad_alloc, or be killed by the OOM killer, not E_SHAPE).
BOOST_AUTO_TEST_CASE(models_over_the_budget_are_refused_before_allocating) {
  expect_error(
      ErrorCode::Shape, "the model (parameters and precomputed tables) needs 4.00 PiB", [] {
        Model m(spec_of(R"({"inputs": {"x": [2, 1024]}, "nodes": [{"name": "n0", "op": "linear",
      "args": {"out_features": 1099511627776}, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})"));
      });
  // The relative-position index is int64 [T, T] with T = H*W: 8 * (30000^2)^2 bytes.
  expect_error(ErrorCode::Shape, "over the memory budget", [] {
    Model m(spec_of(R"({"inputs": {"x": ["B", "T", 8]}, "nodes": [{"name": "n0",
      "op": "attention", "args": {"heads": 2, "relative_position_bias": true,
      "spatial_shape": [30000, 30000]}, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})"));
  });
  BudgetScope budget(64 * 1024);
  // 8*8 + 8 floats and the weight's panels (8 features padded to 16 x 8) fit 64 KiB; a
  // 128-wide layer (64 KiB of weight alone) does not.
  Model ok(spec_of(R"({"inputs": {"x": ["B", 8]}, "nodes": [{"name": "n0", "op": "linear",
    "args": {"out_features": 8}, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})"));
  BOOST_TEST(ok.memory_bytes() == (8 * 8 + 8 + 16 * 8) * 4.0);
  expect_error(ErrorCode::Shape, "over the memory budget of 64.00 KiB", [] {
    Model m(spec_of(R"({"inputs": {"x": ["B", 128]}, "nodes": [{"name": "n0", "op": "linear",
      "args": {"out_features": 128}, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})"));
  });
}

// Input shapes are the user's; what a plan for them needs is checked before any buffer exists.
BOOST_AUTO_TEST_CASE(plans_over_the_budget_are_refused_with_e_shape) {
  const Model linear(spec_of(R"({"inputs": {"x": ["B", 8]}, "nodes": [{"name": "n0",
    "op": "linear", "args": {"out_features": 8}, "inputs": {"x": "x"}}],
    "outputs": {"y": "n0"}})"));
  const Model attention(spec_of(R"({"inputs": {"x": ["B", "T", 8]}, "nodes": [{"name": "n0",
    "op": "attention", "args": {"heads": 2, "rope": true}, "inputs": {"x": "x"}}],
    "outputs": {"y": "n0"}})"));
  const Model mha(spec_of(R"({"inputs": {"q": ["L", "N", 8]}, "nodes": [{"name": "m",
    "op": "multihead_attention", "args": {"embed_dim": 8, "num_heads": 2},
    "inputs": {"query": "q"}}], "outputs": {"y": "m", "w": "m.weights"}})"));
  BudgetScope budget(1 << 20);
  ThreadScope threads(2);  // attention's score tiles are per thread
  // x and y [B, 8] floats: 64 B per row plus the model's 288 B.
  Plan fits(linear, {{"x", TensorDesc{{16000, 8}}}});
  expect_error(ErrorCode::Shape, "inputs: running the network on x=[20000, 8] needs 1.22 MiB", [&] {
    Plan p(linear, {{"x", TensorDesc{{20000, 8}}}});
  });
  // An F16 input counts its float32 copy too: 14000 rows fit as F32 (875 KiB), not as F16
  // (2 + 4 + 4 bytes per element: 1.07 MiB).
  Plan fits_f32(linear, {{"x", TensorDesc{{14000, 8}}}});
  expect_error(ErrorCode::Shape, "over the memory budget of 1.00 MiB", [&] {
    Plan p(linear, {{"x", TensorDesc{{14000, 8}, DType::F16}}});
  });
  // Attention scratch grows with B*T*D (q|k|v, context); T alone sizes rope's tables.
  expect_error(ErrorCode::Shape, "over the memory budget", [&] {
    Plan p(attention, {{"x", TensorDesc{{1, 16384, 8}}}});
  });
  // A zero-size input needs nothing, whatever its other dims (the layer returns before any
  // scratch): no refusal, and the run gives an empty output.
  Plan empty(attention, {{"x", TensorDesc{{0, int64_t{1} << 40, 8}}}});
  BOOST_TEST(empty.run({{"x", Tensor::zeros({0, int64_t{1} << 40, 8})}})[0].second.numel() == 0);
  // MultiheadAttention at L = S = 384: averaged weights [N, L, S] (576 KiB) and one 256-row
  // score tile per thread (2 x 384 KiB, the workspace) are 1.4 MiB with the rest; L = 64 needs
  // about 100 KiB.
  Plan small(mha, {{"q", TensorDesc{{64, 1, 8}}}});
  expect_error(ErrorCode::Shape, "running the network on q=[384, 1, 8]", [&] {
    Plan p(mha, {{"q", TensorDesc{{384, 1, 8}}}});
  });
}

// ---------------------------------------------------------------- determinism

// Every op, bitwise identical across repeated runs and across 1, 2 and 8 threads. The sizes
// make each parallel path split: linear by rows (256 rows >= 16 per thread) and by output
// columns (2 rows, 2*2*512*1024 FLOPs >= the 2 MFLOP threshold), attention and
// MultiheadAttention into several (batch, head, query tile) tasks, the elementwise ops into
// chunks of 16K floats.
BOOST_AUTO_TEST_CASE(outputs_are_bitwise_identical_across_runs_and_thread_counts) {
  const std::string json = R"({
    "inputs": {"x": [4, 64, 64], "d": [2, 512], "pad": {"shape": [64, 4], "dtype": "bool"}},
    "nodes": [
      {"name": "ln", "op": "layer_norm", "inputs": {"x": "x"}},
      {"name": "fc", "op": "linear", "args": {"out_features": 256}, "inputs": {"x": "ln"}},
      {"name": "g", "op": "gelu", "inputs": {"x": "fc"}},
      {"name": "gt", "op": "gelu", "args": {"approximate": "tanh"}, "inputs": {"x": "fc"}},
      {"name": "s", "op": "add", "inputs": {"a": "g", "b": "gt"}},
      {"name": "c", "op": "chunk", "args": {"chunks": 4, "dim": -1}, "inputs": {"x": "s"}},
      {"name": "j", "op": "concat", "args": {"dim": 1}, "inputs": {"x0": "c.out3", "x1": "x"}},
      {"name": "a", "op": "attention", "args": {"heads": 4, "rope": true, "causal": true},
       "inputs": {"x": "j"}},
      {"name": "r", "op": "attention",
       "args": {"heads": 4, "relative_position_bias": true, "spatial_shape": [8, 8]},
       "inputs": {"x": "x"}},
      {"name": "m", "op": "multihead_attention",
       "args": {"embed_dim": 64, "num_heads": 4, "add_bias_kv": true},
       "inputs": {"query": "x", "key_padding_mask": "pad"}},
      {"name": "mn", "op": "multihead_attention",
       "args": {"embed_dim": 64, "num_heads": 4, "need_weights": false, "batch_first": true},
       "inputs": {"query": "x"}},
      {"name": "dc", "op": "linear", "args": {"out_features": 1024}, "inputs": {"x": "d"}}
    ],
    "outputs": {"a": "a", "r": "r", "m": "m", "mw": "m.weights", "mn": "mn", "dc": "dc",
                "c0": "c.out0"}})";
  const Model model(spec_of(json), 7);
  Generator gen(11);
  Tensor pad = Tensor::zeros({64, 4}, DType::Bool);
  for (int64_t n = 0; n < 32; ++n) pad.set_item({n, 3}, 1.0);  // half the batch ignores key 3
  const std::map<std::string, Tensor> in = {
      {"x", Tensor::randn({4, 64, 64}, gen)}, {"d", Tensor::randn({2, 512}, gen)}, {"pad", pad}};
  BOOST_TEST(outputs_bitwise_across_threads(model, in) == 7u);
}

// The math ops the same way: matmul split into row tasks (300 rows: 3 of 128), column tasks (8
// rows x 2048 columns: 2) and batches (16 products, several per task); softmax over the last
// dim (rows) and over dim 0 (column tasks of 256); the binary and exp maps in 16K-float chunks,
// broadcast rows included ([300, 600] / [5, 1, 600]: 1500 rows of 600).
BOOST_AUTO_TEST_CASE(math_ops_are_bitwise_identical_across_thread_counts) {
  const std::string net = R"({
    "inputs": {"a": [300, 130], "b": [130, 600], "c": [8, 200], "d": [200, 2048],
               "q": [16, 64, 64], "z": [5, 1, 600]},
    "nodes": [
      {"name": "p", "op": "matmul", "inputs": {"a": "a", "b": "b"}},
      {"name": "pc", "op": "matmul", "inputs": {"a": "c", "b": "d"}},
      {"name": "pq", "op": "matmul", "inputs": {"a": "q", "b": "q"}},
      {"name": "s", "op": "softmax", "args": {"dim": -1}, "inputs": {"x": "p"}},
      {"name": "s0", "op": "softmax", "args": {"dim": 0}, "inputs": {"x": "p"}},
      {"name": "t", "op": "tanh", "inputs": {"x": "s0"}},
      {"name": "g", "op": "sigmoid", "inputs": {"x": "p"}},
      {"name": "u", "op": "silu", "inputs": {"x": "pc"}},
      {"name": "m", "op": "mul", "inputs": {"a": "s", "b": "t"}},
      {"name": "v", "op": "sub", "inputs": {"a": "m", "b": "g"}},
      {"name": "dz", "op": "dropout", "inputs": {"x": "z"}},
      {"name": "r", "op": "div", "inputs": {"a": "v", "b": "dz"}}
    ],
    "outputs": {"r": "r", "u": "u", "pq": "pq"}})";
  const Model model(spec_of(net), 7);
  Generator gen(13);
  std::map<std::string, Tensor> in;
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"a", {300, 130}},  {"b", {130, 600}},   {"c", {8, 200}},
      {"d", {200, 2048}}, {"q", {16, 64, 64}}, {"z", {5, 1, 600}}};
  for (const auto& [name, shape] : shapes) in[name] = Tensor::randn(shape, gen);
  BOOST_TEST(outputs_bitwise_across_threads(model, in) == 3u);
}

BOOST_AUTO_TEST_SUITE_END()
