// Steady-state allocation facts, measured with the counting hooks of allocation_counter.h: the
// thread layer and OpenBLAS allocate nothing once warm, so a plan's run() that allocates is our
// own doing. The first cases show the instrument itself sees every kind of allocation it claims.
#include <boost/test/unit_test.hpp>

#include <cblas.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/tensor.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/network.h"
#include "runtime/loader.h"
#include "tests/allocation_counter.h"

using namespace tessera;
using tessera::testing::Allocations;
using tessera::testing::count_allocations;

namespace {

// Escapes a pointer, so the compiler cannot drop a new/delete or malloc/free pair.
void* volatile g_sink = nullptr;

// Returns once every thread of the current count has run a chunk (each chunk waits at most 1 s
// for the others). oneTBB starts its workers asynchronously and a starting worker allocates its
// task pool: on a fast core the warm-up runs of a small loop can all finish on the calling
// thread before the worker arrives, which then allocates inside the counted runs (seen on a
// Xeon when the suite ran alone).
void wait_for_all_threads() {
  const int threads = num_threads();
  std::atomic<int> arrived{0};
  parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (arrived.load() < threads && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  });
}

// set_num_threads(n) for one scope, its threads all started; back to the default (all cores)
// after.
struct ThreadCount {
  explicit ThreadCount(int n) {
    set_num_threads(n);
    wait_for_all_threads();
  }
  ~ThreadCount() { set_num_threads(0); }
};

// Runs fn `warm` times uncounted, then `counted` times counted, and returns the counted runs'
// allocations. Warming more than once lets both threads' oneTBB task pools and OpenBLAS's
// buffers reach their size under whatever interleaving the scheduler picks.
template <typename Fn>
Allocations steady_state(Fn&& fn, int warm = 8, int counted = 32) {
  for (int i = 0; i < warm; ++i) fn();
  return count_allocations([&] {
    for (int i = 0; i < counted; ++i) fn();
  });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(allocations)

// ---- The instrument.

BOOST_AUTO_TEST_CASE(counts_new_and_malloc) {
  const Allocations a = count_allocations([] { g_sink = new int(7); });
  BOOST_TEST(a.heap == 1u, a.str());
  BOOST_TEST(a.total() == 1u, a.str());
  BOOST_TEST(a.sites.find("operator new") != std::string::npos, a.str());
  delete static_cast<int*>(g_sink);

  const Allocations m = count_allocations([] { g_sink = std::malloc(100); });
  BOOST_TEST(m.heap == 1u, m.str());
  BOOST_TEST(m.total() == 1u, m.str());
  std::free(g_sink);

  const Allocations v = count_allocations([] {
    std::vector<float> floats(1000);
    g_sink = floats.data();
  });
  BOOST_TEST(v.heap == 1u, v.str());

  const Allocations none = count_allocations([] { g_sink = nullptr; });
  BOOST_TEST(none.total() == 0u, none.str());
  BOOST_TEST(none.sites.empty());
}

BOOST_AUTO_TEST_CASE(counts_other_threads) {
  std::atomic<int> stage{0};
  std::thread other([&] {
    // A thread's first allocation can bring its own (under ASan, 3 more heap calls for the
    // thread's allocator state): made before counting starts, so only the one below is counted.
    delete new int(0);
    stage.store(3);
    while (stage.load() != 1) std::this_thread::yield();
    g_sink = new int(1);
    stage.store(2);
  });
  while (stage.load() != 3) std::this_thread::yield();
  const Allocations a = count_allocations([&] {
    stage.store(1);
    while (stage.load() != 2) std::this_thread::yield();
  });
  other.join();
  delete static_cast<int*>(g_sink);
  BOOST_TEST(a.heap == 1u, a.str());
}

BOOST_AUTO_TEST_CASE(counts_device_blocks_and_mmap) {
  // 4 MiB: a large block (mmap or a cached one), plus the tensor's shared control block.
  const Allocations t = count_allocations([] {
    Tensor x = Tensor::empty({int64_t{1} << 20}, DType::F32);
    g_sink = x.data<float>();
  });
  BOOST_TEST(t.device == 1u, t.str());
  BOOST_TEST(t.heap >= 1u, t.str());

  void* map = nullptr;
  const Allocations m = count_allocations([&] {
    map = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  });
  BOOST_REQUIRE(map != MAP_FAILED);
  munmap(map, 1 << 16);
  BOOST_TEST(m.mmap == 1u, m.str());
  BOOST_TEST(m.total() == 1u, m.str());
}

BOOST_AUTO_TEST_CASE(counts_onetbb_allocator) {
  // A new arena is allocated inside libtbb, through the allocator oneTBB picked (libtbbmalloc
  // here): counted as tbb, which proves the hook sits in front of libtbb's own calls.
  const Allocations a = count_allocations([] {
    oneapi::tbb::task_arena arena(1);
    arena.initialize();
  });
  BOOST_TEST(a.tbb >= 1u, a.str());
}

BOOST_AUTO_TEST_CASE(excluded_allocations_are_tallied_apart) {
  const Allocations a = count_allocations([] {
    tessera::testing::ExcludeAllocations exclude("the case under test");
    g_sink = new int(3);
  });
  delete static_cast<int*>(g_sink);
  BOOST_TEST(a.total() == 0u, a.str());
  BOOST_TEST(a.excluded == 1u, a.str());
}

// ---- Steady state.

BOOST_AUTO_TEST_CASE(parallel_for_allocates_nothing) {
  std::vector<int64_t> out(4096);
  int64_t offset = 3, scale = 2;
  // The body captures 4 references (32 bytes): as a std::function it would be heap-allocated
  // on every call, past libstdc++'s 16-byte small-object buffer.
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * scale + offset;
  };
  static_assert(sizeof(body) > 16);
  for (int threads : {1, 2}) {
    ThreadCount scope(threads);
    for (int64_t grain : {int64_t{1}, int64_t{64}, int64_t{5000}}) {
      const Allocations a =
          steady_state([&] { parallel_for(0, static_cast<int64_t>(out.size()), grain, body); });
      BOOST_TEST(a.total() == 0u, "threads " << threads << " grain " << grain << ": " << a.str());
    }
  }
  BOOST_TEST(out[4095] == 4095 * 2 + 3);
}

BOOST_AUTO_TEST_CASE(serial_scope_runs_parallel_loops_inline) {
  ThreadCount two(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> calls{0}, elsewhere{0};
  std::atomic<int64_t> covered{0};
  auto body = [&](int64_t b, int64_t e) {
    calls.fetch_add(1);
    covered.fetch_add(e - b);
    if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
  };
  {
    const SerialScope outer;
    {
      const SerialScope inner;  // nests
      parallel_for(0, 4096, 1, body);
    }
    BOOST_TEST(calls.load() == 1);
    parallel_for_each(0, 64, body);
    BOOST_TEST(calls.load() == 2);
  }
  BOOST_TEST(elsewhere.load() == 0);
  BOOST_TEST(covered.load() == 4096 + 64);
  // Past the scope the loop is split again: 32 chunks (16 per thread) of 128.
  calls = 0;
  parallel_for(0, 4096, 1, body);
  BOOST_TEST(calls.load() == 32);
}

// OpenBLAS 0.3.21 (Debian's pthread build) takes each GEMM's packing buffer from a table of
// slots, one per GEMM running at that moment: the first use of a slot maps BUFFER_SIZE (128 MiB
// of address space, touched only as far as packing reaches) and later calls reuse it; small
// products (8x64x64) take one too. So nothing is allocated per call, but the first run in which
// more GEMMs overlap than ever before maps one more slot (measured: the first 2-thread run of the
// 8x64x64 products mapped one slot, since they rarely overlap, the 256^3 ones two). The warm-up
// below makes two GEMMs overlap on purpose, as a first run on two busy threads does.
BOOST_AUTO_TEST_CASE(openblas_sgemm_in_workers_allocates_nothing) {
  cpu_device();  // pins OpenBLAS to one thread (cpu_device.cpp), as every tessera call does
  constexpr int kSquare = 256;
  std::vector<float> sa(kSquare * kSquare, 0.5f), sb(kSquare * kSquare, 0.25f),
      sc(2 * kSquare * kSquare);
  {
    ThreadCount two(2);
    for (int round = 0; round < 4; ++round) {
      // Two chunks, one per thread; each waits (at most 1 s) for the other before its GEMM.
      std::atomic<int> arrived{0};
      parallel_for(0, 2, 1, [&](int64_t t0, int64_t) {
        arrived.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kSquare, kSquare, kSquare, 1.0f,
                    sa.data(), kSquare, sb.data(), kSquare, 0.0f,
                    sc.data() + t0 * kSquare * kSquare, kSquare);
      });
    }
  }
  struct Size {
    int m, n, k;
  };
  for (const Size s : {Size{256, 256, 256}, Size{8, 64, 64}}) {
    constexpr int kTasks = 8;  // a GEMM per task, each into its own C
    std::vector<float> a(static_cast<size_t>(s.m) * s.k, 0.5f);
    std::vector<float> b(static_cast<size_t>(s.k) * s.n, 0.25f);
    std::vector<float> c(static_cast<size_t>(kTasks) * s.m * s.n);
    auto gemms = [&] {
      parallel_for(0, kTasks, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), s.k,
                      b.data(), s.n, 0.0f, c.data() + t * s.m * s.n, s.n);
      });
    };
    for (int threads : {1, 2}) {
      ThreadCount scope(threads);
      const Allocations al = steady_state(gemms);
      BOOST_TEST(al.total() == 0u,
                 s.m << "x" << s.n << "x" << s.k << ", threads " << threads << ": " << al.str());
    }
    BOOST_TEST(c.back() == 0.5f * 0.25f * static_cast<float>(s.k));
  }
}

// ---- Plans: after the first run at a shape, run() allocates nothing (issue 13).

namespace {

struct PlanCase {
  const char* name;
  const char* json;
  std::vector<std::pair<std::string, Tensor>> inputs;
};

Tensor randn(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return Tensor::randn(shape, g);
}

// Token ids in [0, vocab).
Tensor ids(const Shape& shape, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(shape, DType::I64);
  auto* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<int64_t>(g.next_u64() % static_cast<uint64_t>(vocab));
  return t;
}

Tensor mask(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  Tensor m = Tensor::empty(shape, DType::Bool);
  auto* p = static_cast<uint8_t*>(m.raw_data());
  for (int64_t i = 0; i < m.numel(); ++i) p[i] = g.next_u64() % 4 == 0 ? 1 : 0;
  p[0] = 0;  // one visible key in the first row at least
  return m;
}

// Every op of the ops table, the options that change its code path (masks, weights, rope,
// the relative-position bias, causal, appended key/value positions), shapes large enough that
// the work splits over threads and linear takes its packed kernel.
std::vector<PlanCase> plan_cases() {
  return {
      {"linear",
       R"({"inputs": {"x": [96, 64]}, "nodes": [{"name": "n", "op": "linear",
         "args": {"out_features": 128}, "inputs": {"x": "x"}}], "outputs": {"y": "n"}})",
       {{"x", randn({96, 64}, 1)}}},
      {"layer_norm+gelu+relu+add",
       R"({"inputs": {"x": [4, 33, 40]}, "nodes": [
         {"name": "a", "op": "layer_norm", "inputs": {"x": "x"}},
         {"name": "b", "op": "gelu", "args": {"approximate": "tanh"}, "inputs": {"x": "a"}},
         {"name": "c", "op": "relu", "inputs": {"x": "b"}},
         {"name": "d", "op": "add", "inputs": {"a": "c", "b": "x"}}], "outputs": {"y": "d"}})",
       {{"x", randn({4, 33, 40}, 2)}}},
      {"broadcast add",
       R"({"inputs": {"a": [4, 1, 40], "b": [7, 1]}, "nodes": [
         {"name": "s", "op": "add", "inputs": {"a": "a", "b": "b"}}], "outputs": {"y": "s"}})",
       {{"a", randn({4, 1, 40}, 3)}, {"b", randn({7, 1}, 4)}}},
      {"chunk+concat",
       R"({"inputs": {"x": [2, 6, 40]}, "nodes": [
         {"name": "c", "op": "chunk", "args": {"chunks": 3, "dim": 1}, "inputs": {"x": "x"}},
         {"name": "j", "op": "concat", "args": {"dim": -1},
          "inputs": {"x0": "c.out2", "x1": "c", "x2": "c.out1"}}], "outputs": {"y": "j"}})",
       {{"x", randn({2, 6, 40}, 5)}}},
      // Swin's window shuffle and ViT's token handling, every layout op; 38,400 floats after
      // the pad, so the copies split over both threads.
      {"layout ops",
       R"({"inputs": {"x": [4, 64, 96]}, "nodes": [
         {"name": "r", "op": "reshape", "args": {"shape": [4, 8, -1, 96]}, "inputs": {"x": "x"}},
         {"name": "p", "op": "pad", "args": {"pad": [0, 0, 1, 1, 1, 1]}, "inputs": {"x": "r"}},
         {"name": "ro", "op": "roll", "args": {"shifts": [-3, -3], "dims": [1, 2]},
          "inputs": {"x": "p"}},
         {"name": "s", "op": "slice", "args": {"dim": [1, 2], "start": [0, 1], "step": 2},
          "inputs": {"x": "ro"}},
         {"name": "pe", "op": "permute", "args": {"dims": [0, 3, 1, 2]}, "inputs": {"x": "s"}},
         {"name": "f", "op": "flatten", "args": {"start_dim": 2}, "inputs": {"x": "pe"}},
         {"name": "t", "op": "transpose", "args": {"dim0": 1, "dim1": 2}, "inputs": {"x": "f"}},
         {"name": "u", "op": "unsqueeze", "args": {"dim": 1}, "inputs": {"x": "t"}},
         {"name": "e", "op": "expand", "args": {"sizes": [-1, 3, -1, -1]}, "inputs": {"x": "u"}},
         {"name": "se", "op": "select", "args": {"dim": 1, "index": -1}, "inputs": {"x": "e"}},
         {"name": "sq", "op": "squeeze", "args": {"dim": 1}, "inputs": {"x": "u"}},
         {"name": "a", "op": "add", "inputs": {"a": "se", "b": "sq"}}], "outputs": {"y": "a"}})",
       {{"x", randn({4, 64, 96}, 15)}}},
      {"attention rope causal",
       R"({"inputs": {"x": [2, 300, 32]}, "nodes": [{"name": "n",
         "op": "attention", "args": {"heads": 4, "rope": true, "causal": true},
         "inputs": {"x": "x"}}], "outputs": {"y": "n"}})",
       {{"x", randn({2, 300, 32}, 6)}}},
      {"attention relative position bias",
       R"({"inputs": {"x": [2, 49, 32]}, "nodes": [{"name": "n",
         "op": "attention", "args": {"heads": 4, "relative_position_bias": true,
         "spatial_shape": 7}, "inputs": {"x": "x"}}], "outputs": {"y": "n"}})",
       {{"x", randn({2, 49, 32}, 7)}}},
      {"mha self, averaged weights",
       R"({"inputs": {"q": [40, 2, 32]}, "nodes": [{"name": "m",
         "op": "multihead_attention", "args": {"embed_dim": 32, "num_heads": 4},
         "inputs": {"query": "q"}}], "outputs": {"y": "m", "w": "m.weights"}})",
       {{"q", randn({40, 2, 32}, 8)}}},
      {"mha masks, per-head weights, bias_kv, zero_attn",
       R"({"inputs": {"q": [2, 40, 32],
         "k": [2, 50, 24], "v": [2, 50, 16], "kpm": {"shape": [2, 50], "dtype": "bool"},
         "am": [40, 50]},
         "nodes": [{"name": "m", "op": "multihead_attention", "args": {"embed_dim": 32,
         "num_heads": 4, "kdim": 24, "vdim": 16, "batch_first": true, "add_bias_kv": true,
         "add_zero_attn": true, "average_attn_weights": false},
         "inputs": {"query": "q", "key": "k", "value": "v", "key_padding_mask": "kpm",
         "attn_mask": "am"}}], "outputs": {"y": "m", "w": "m.weights"}})",
       {{"q", randn({2, 40, 32}, 9)},
        {"k", randn({2, 50, 24}, 10)},
        {"v", randn({2, 50, 16}, 11)},
        {"kpm", mask({2, 50}, 12)},
        {"am", randn({40, 50}, 13)}}},
      {"embeddings, positions, a learned tensor, a tied head",
       R"({"inputs": {"ids":
         {"shape": [2, 40], "dtype": "int64"}}, "nodes": [
         {"name": "tok", "op": "embedding", "args": {"num_embeddings": 50, "embedding_dim": 64},
          "inputs": {"x": "ids"}},
         {"name": "positions", "op": "arange", "args": {"dim": 1}, "inputs": {"like": "ids"}},
         {"name": "pos", "op": "embedding", "args": {"num_embeddings": 40, "embedding_dim": 64},
          "inputs": {"x": "positions"}},
         {"name": "bias", "op": "parameter", "args": {"shape": [1, 1, 64]}},
         {"name": "a", "op": "add", "inputs": {"a": "tok", "b": "pos"}},
         {"name": "b", "op": "add", "inputs": {"a": "a", "b": "bias"}},
         {"name": "head", "op": "linear", "args": {"out_features": 50, "bias": false},
          "inputs": {"x": "b", "weight": "tok.weight"}}], "outputs": {"y": "head"}})",
       {{"ids", ids({2, 40}, 50, 15)}}},
      {"patch_merging_pad",
       R"({"inputs": {"x": [2, 7, 9, 16]}, "nodes": [
         {"name": "m", "op": "patch_merging_pad", "inputs": {"x": "x"}}], "outputs": {"y": "m"}})",
       {{"x", randn({2, 7, 9, 16}, 18)}}},
      {"mha causal, no weights (fused)",
       R"({"inputs": {"q": [1, 300, 64]}, "nodes": [{"name": "m",
         "op": "multihead_attention", "args": {"embed_dim": 64, "num_heads": 4,
         "batch_first": true, "need_weights": false, "is_causal": true},
         "inputs": {"query": "q"}}], "outputs": {"y": "m"}})",
       {{"q", randn({1, 300, 64}, 14)}}},
      {"conv2d (packed, OpenBLAS, pointwise)+adaptive_avg_pool2d+mean",
       R"({"inputs": {"x": [4, 3, 64, 64]}, "nodes": [
         {"name": "p", "op": "conv2d", "args": {"in_channels": 3, "out_channels": 96,
          "kernel_size": 4, "stride": 4}, "inputs": {"x": "x"}},
         {"name": "c", "op": "conv2d", "args": {"in_channels": 96, "out_channels": 16,
          "kernel_size": 3, "padding": 1, "groups": 2}, "inputs": {"x": "p"}},
         {"name": "q", "op": "conv2d", "args": {"in_channels": 16, "out_channels": 32,
          "kernel_size": 1}, "inputs": {"x": "c"}},
         {"name": "a", "op": "adaptive_avg_pool2d", "args": {"output_size": [3, null]},
          "inputs": {"x": "q"}},
         {"name": "m", "op": "mean", "args": {"dim": [-1, -2]}, "inputs": {"x": "a"}}],
         "outputs": {"y": "m"}})",
       {{"x", randn({4, 3, 64, 64}, 15)}}},
      {"matmul+softmax+silu+tanh+sigmoid+mul+sub+div+dropout",
       R"({"inputs": {"x": [4, 33, 40],
         "w": [40, 24], "z": [24]}, "nodes": [
         {"name": "m", "op": "matmul", "inputs": {"a": "x", "b": "w"}},
         {"name": "s", "op": "softmax", "args": {"dim": -1}, "inputs": {"x": "m"}},
         {"name": "s0", "op": "softmax", "args": {"dim": 1}, "inputs": {"x": "m"}},
         {"name": "a", "op": "silu", "inputs": {"x": "s"}},
         {"name": "t", "op": "tanh", "inputs": {"x": "s0"}},
         {"name": "g", "op": "sigmoid", "inputs": {"x": "m"}},
         {"name": "u", "op": "mul", "inputs": {"a": "a", "b": "t"}},
         {"name": "v", "op": "sub", "inputs": {"a": "u", "b": "g"}},
         {"name": "q", "op": "div", "inputs": {"a": "v", "b": "z"}},
         {"name": "d", "op": "dropout", "args": {"p": 0.1}, "inputs": {"x": "q"}}],
         "outputs": {"y": "d"}})",
       {{"x", randn({4, 33, 40}, 15)}, {"w", randn({40, 24}, 16)}, {"z", randn({24}, 17)}}},
      {"matmul batched and blocked",
       R"({"inputs": {"a": [2, 1, 40, 40], "b": [3, 40, 40],
         "c": [300, 130], "d": [130, 600]}, "nodes": [
         {"name": "p", "op": "matmul", "inputs": {"a": "a", "b": "b"}},
         {"name": "q", "op": "matmul", "inputs": {"a": "c", "b": "d"}}],
         "outputs": {"p": "p", "q": "q"}})",
       {{"a", randn({2, 1, 40, 40}, 18)},
        {"b", randn({3, 40, 40}, 19)},
        {"c", randn({300, 130}, 20)},
        {"d", randn({130, 600}, 21)}}},
      {"shifted_window_attention (shifted: tiled core; unshifted: fused)",
       R"({"inputs":
         {"x": [2, 14, 13, 64]}, "nodes": [
         {"name": "s", "op": "shifted_window_attention", "args": {"dim": 64, "num_heads": 4,
          "window_size": 7, "shift_size": 3}, "inputs": {"x": "x"}},
         {"name": "w", "op": "shifted_window_attention", "args": {"dim": 64, "num_heads": 2,
          "window_size": [4, 7]}, "inputs": {"x": "s"}}], "outputs": {"y": "w"}})",
       {{"x", randn({2, 14, 13, 64}, 22)}}},
  };
}

// A second run of a plan, and every later one, at 1 and 2 threads.
void check_plan_steady_state(const std::string& name, const Model& model,
                             const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, TensorDesc> descs;
  for (const auto& [n, t] : inputs) descs[n] = TensorDesc{t.shape(), t.dtype()};
  for (int threads : {1, 2}) {
    ThreadCount scope(threads);
    Plan plan(model, descs);
    const Allocations a = steady_state([&] { plan.run(inputs); }, 2, 3);
    BOOST_TEST(a.total() == 0u, name << ", threads " << threads << ": " << a.str());
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(plan_runs_allocate_nothing_for_every_op) {
  std::set<std::string> covered;
  for (const PlanCase& c : plan_cases()) {
    const NetworkSpec spec = parse_network(std::string(c.json), c.name);
    for (const NetworkNode& n : spec.nodes) covered.insert(n.op);
    const Model model(spec, 3);
    std::map<std::string, Tensor> inputs(c.inputs.begin(), c.inputs.end());
    check_plan_steady_state(c.name, model, inputs);
  }
  for (const std::string& op : op_names())
    BOOST_TEST(covered.count(op) == 1u, "no allocation case for op " << op);
}

BOOST_AUTO_TEST_CASE(example_encoder_run_allocates_nothing) {
  const LoadedModel loaded =
      load_model(std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/encoder.safetensors",
                 std::nullopt, true);
  const SafetensorsFile input = SafetensorsFile::open(std::string(TESSERA_SOURCE_DIR) +
                                                      "/examples/encoder/input.safetensors");
  std::map<std::string, Tensor> inputs;
  for (const std::string& name : input.names()) inputs.emplace(name, input.tensor(name));
  check_plan_steady_state("example encoder", loaded.model, inputs);
}

BOOST_AUTO_TEST_SUITE_END()
