#include "layers/linear.h"

#include <algorithm>
#include <utility>

#include "backends/cpu/cpu_device.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

// The backend's own projection kernel (backends/cpu/linear_f32.cc): x packed once per call into
// panels shared by every thread, w read in place. One thread, against OpenBLAS sgemm (x w^T) +
// bias, `bench_kernels` (linear rows), GFLOP/s, range of three runs, AVX-512 on Zen 4 (FMA peak
// ~116):
//   rows x out x in     OpenBLAS     linear_f32
//   128 x 1536 x 512    90-97        92-107
//   128 x 512 x 512     79-98        102
//   512 x 2304 x 768    96-99        103-105
//   2048 x 2304 x 768   97-102       98-102
//   4096 x 1536 x 512   91-101       94-97
//   7 x 2304 x 768      24-33        23-24   (a 32-row panel for 7 rows: OpenBLAS below 32)
//   1024 x 8 x 512      41-48        17-18   (12-feature tiles for 8 features: below 64)
// Besides, OpenBLAS under the row split packs the whole weight once per thread.
// AVX2 on Zen 3 (`bench_linear`, best of 3 alternating runs, FMA loop 91-96 GFLOP/s on one
// thread, 178 on two), linear_f32 / OpenBLAS split by rows:
//   rows x out x in     1 thread       2 threads
//   64 x 1536 x 512     80 / 71        131 / 99
//   128 x 1536 x 512    62 / 61        117 / 110
//   256 x 1536 x 512    68 / 70        111 / 106
//   197 x 2304 x 768    60-64 / 71     102 / 111
//   2048 x 2304 x 768   73-75 / 80     119 / 134
//   512 x 8192 x 512    63-67 / 77     106 / 127
//   3136 x 288 x 96     52-55 / 64     80 / 111
//   98 x 288 x 96       58 / 67        69 / 93
//
// OpenBLAS is ahead on AVX2 at many rows as well, but only when each worker packs the whole
// weight for its own share of the rows, a split that depends on the thread count and changes
// result bits (OpenBLAS's edge kernels sum in another order); split by shape alone, it packs the
// weight for every block, which costs more than it gains where the weight is large.
//
// Which one runs is the kernel table's call (LinearKernels::preferred, per dispatched target):
// the own kernel from 32 rows (one panel) and 64 output features; on AVX2 only from 256 input
// features. OpenBLAS the rest, in row blocks fixed by the shape.
bool use_packed(const LinearKernels* lk, int64_t rows, int64_t in_features,
                int64_t out_features) {
  return lk != nullptr && lk->preferred(rows, in_features, out_features);
}

// Whether any target's kernel table could choose the packed kernel (the widest rule above):
// the workspace is sized for it then, because the dispatched target may change after a plan is
// sized (tests run every target; TESSERA_HWY_TARGET).
bool may_use_packed(const LinearKernels* lk, int64_t rows, int64_t out_features) {
  return lk != nullptr && rows >= lk->panel_rows && out_features >= 64;
}

void linear_packed_forward_f32(const LinearKernels& lk, int64_t rows, int64_t in_features,
                               int64_t out_features, const float* x, int64_t x_stride,
                               const float* w, const float* bias, float* y, int64_t y_stride,
                               float* xp) {
  const int64_t panel_rows = lk.panel_rows;
  const int64_t panels = (rows + panel_rows - 1) / panel_rows;
  const int64_t panel_floats = panel_rows * in_features;
  parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    lk.pack(rows, in_features, x, x_stride, p0, p1, xp);
  });
  // Tasks: 96 output features (8 tiles of 12 weight rows; a tile, 24 KiB of w at in = 512,
  // stays in L1 across the task's panels) x panels of x totalling ~512 KiB (half the L2: 8
  // panels at in = 512), which each tile reads once. The split changes no result.
  constexpr int64_t kFeatures = 96;
  const int64_t panels_per_task = std::max<int64_t>(1, (int64_t{128} << 10) / panel_floats);
  const int64_t feature_blocks = (out_features + kFeatures - 1) / kFeatures;
  const int64_t panel_blocks = (panels + panels_per_task - 1) / panels_per_task;
  parallel_for(0, feature_blocks * panel_blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = (t % feature_blocks) * kFeatures,
                    p0 = (t / feature_blocks) * panels_per_task;
      lk.packed(rows, in_features, xp, p0, std::min(panels, p0 + panels_per_task), w, in_features,
                n0, std::min(out_features, n0 + kFeatures), bias, y, y_stride);
    }
  });
}

// A few rows (a decode step) against the whole weight: memory-bound, every weight read once.
// Output features in fixed blocks of 64 (the split depends on the shape only), tasks of whole
// blocks streaming at least ~256 KB of weights each (~20 us at 11-17 GB/s, well above a worker
// hand-off). The gpt recipe's 124M weights, one token, 1 / 2 threads: see
// benchmarks/results (bench_generate).
// (The split is the same for weights read in place and for packed panels: fn(n0, n1) computes
// features n0 .. n1 - 1, n0 a multiple of 64.)
template <class Fn>
void for_matvec_blocks(int64_t in_features, int64_t out_features, Fn&& fn) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (out_features + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(kBlock * in_features, 1));
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    fn(b0 * kBlock, std::min(out_features, b1 * kBlock));
  });
}

void linear_matvec_forward_f32(const LinearKernels& lk, int64_t rows, int64_t in_features,
                               int64_t out_features, const float* x, int64_t x_stride,
                               const float* w, const float* bias, float* y, int64_t y_stride) {
  for_matvec_blocks(in_features, out_features, [&](int64_t n0, int64_t n1) {
    lk.matvec(rows, in_features, x, x_stride, w, in_features, n0, n1, bias, y, y_stride);
  });
}

// Below ~2 MFLOP a second thread costs more (wake-up ~5-10 us) than it saves, and the packing
// pass is not worth it either.
bool small_product(int64_t rows, int64_t in_features, int64_t out_features) {
  return 2.0 * static_cast<double>(rows) * in_features * out_features < 2e6;
}

// `act` over rows [r0, r1) x columns [c0, c1) of y, in place, with the elementwise ops' kernels.
void apply_activation_f32(const KernelTable& k, Activation act, int64_t r0, int64_t r1,
                          int64_t c0, int64_t c1, RowsOutF32 y) {
  if (act == Activation::none || c1 <= c0) return;
  const UnaryMapF32 relu = act == Activation::relu ? k.unary_map_f32("relu") : nullptr;
  for (int64_t r = r0; r < r1; ++r) {
    float* row = y.row(r) + c0;
    if (relu)
      relu(c1 - c0, row, row);
    else
      k.gelu_f32(c1 - c0, row, row, act == Activation::gelu_tanh);
  }
}

// From the layer's packed weight: a few rows stream every panel once (split as the matvec
// above); more rows run the panel GEMM in tasks of row blocks of at most the kernel's
// panel_row_block rows (240: the kernel sizes its depth blocks so that a depth block of that
// many rows of x stays in the L2 while the task's column tiles pass) x column blocks of whole
// tiles (below). The split changes no result (one FMA chain per element in k order), so it may
// follow the thread count.
void linear_panels_forward_f32(const LinearKernels& lk, int64_t rows, int64_t in_features,
                               int64_t out_features, RowsInF32 x, const float* panels,
                               const float* bias, RowsOutF32 y, bool one_thread,
                               const KernelTable& k, Activation act) {
  if (lk.panels_matvec != nullptr && rows <= lk.matvec_max_rows) {
    for_matvec_blocks(in_features, out_features, [&](int64_t n0, int64_t n1) {
      lk.panels_matvec(rows, in_features, x, panels, out_features, n0, n1, bias, y);
      apply_activation_f32(k, act, 0, rows, n0, std::min(n1, out_features), y);
    });
    return;
  }
  if (one_thread) {
    lk.panels(in_features, x, 0, rows, panels, out_features, 0, out_features, 0, 0, bias, y);
    apply_activation_f32(k, act, 0, rows, 0, out_features, y);
    return;
  }
  // Columns split at whole tiles of the dispatched target: 48 features on AVX-512, 16 on AVX2.
  // (A 48-feature step on AVX2 left 512 features in 11 units, so 128-row products were cut in
  // two row blocks: bench_linear --cold --target AVX2, two threads, Zen 4: 128x512x2048
  // 1.46 -> 1.35 ms, 128x512x512 0.37 -> 0.33 ms with 16.)
  const int64_t step = lk.panel_tile_cols();
  const int64_t tiles = (out_features + step - 1) / step;
  const int64_t threads = std::max(1, num_threads());
  // Where (row block, tile) units do not share evenly among the threads, one more row block if
  // the blocks stay tall (>= 128 rows; every row block streams the whole weight, from memory in
  // a model: 512x512x2048 2.52-2.54 ms with four, 2.58-2.62 with three, bench_linear --cold,
  // two threads, AVX-512), else the panel blocks below.
  const int64_t row_block = lk.panel_row_block > 0 ? lk.panel_row_block : rows;
  int64_t row_blocks = (rows + row_block - 1) / row_block;
  if ((row_blocks * tiles) % threads != 0 && rows / (row_blocks + 1) >= 128) ++row_blocks;
  const int64_t block_rows = (rows + row_blocks - 1) / row_blocks;
  // Column blocks of whole tiles (`step` features), at most 4 tiles each, at least 8 tasks in
  // all, and as many per thread: a count the threads share evenly, sizes within one tile of
  // each other, larger and smaller interleaved. (11 blocks of 4 tiles for 2048 features at 128
  // rows, one row block, gave one thread 6 blocks and the other 5.)
  // Where the units still do not share evenly (11 tiles for 512 features on AVX-512, 128 rows:
  // 6 against 5 at best on two threads), blocks of whole panels instead, as many per thread, of
  // 8 panels or more where there are that many per thread (512 features: 4 blocks of 2 tiles and
  // a 2-panel tile; fewer panels: one block per thread): the threads get the same work at the
  // cost of narrow tiles. bench_linear --cold, two threads, AVX-512, Zen 5, 2 alternating
  // rounds: 128x512x2048 0.75-0.76 ms against 0.81-0.83 with two 64-row blocks (the rule
  // before), 128x512x512 0.190 against 0.204-0.205.
  const bool by_tiles = (row_blocks * tiles) % threads == 0;
  const int64_t unit = by_tiles ? step : lk.weight_panel;
  const int64_t units = (out_features + unit - 1) / unit;
  int64_t col_blocks = by_tiles ? std::max((8 + row_blocks - 1) / row_blocks, (tiles + 3) / 4)
                                : threads * std::max<int64_t>(1, units / (threads * 8));
  col_blocks = std::min(units, (col_blocks + threads - 1) / threads * threads);
  const int64_t tasks = row_blocks * col_blocks;
  const auto columns = [&](int64_t t) {
    const int64_t cb = t % col_blocks;
    return std::pair<int64_t, int64_t>(
        cb * units / col_blocks * unit,
        std::min(out_features, (cb + 1) * units / col_blocks * unit));
  };
  parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = (t / col_blocks) * block_rows, r1 = std::min(rows, r0 + block_rows);
      const auto [c0, c1] = columns(t);
      // The task after this one is, most of the time, this thread's next (TBB hands a thread
      // a run of consecutive tasks): the kernel prefetches its first weights.
      const auto [next_c0, next_c1] =
          t + 1 < tasks ? columns(t + 1) : std::pair<int64_t, int64_t>(0, 0);
      lk.panels(in_features, x, r0, r1, panels, out_features, c0, c1, next_c0, next_c1, bias, y);
      apply_activation_f32(k, act, r0, r1, c0, c1, y);
    }
  });
}

}  // namespace

int64_t linear_workspace_floats(const Device& device, int64_t rows, int64_t in_features,
                                int64_t out_features) {
  const LinearKernels* lk = device.kernels().linear(DType::F32);
  if (rows <= 0 || out_features <= 0 || small_product(rows, in_features, out_features) ||
      !may_use_packed(lk, rows, out_features))
    return 0;
  const int64_t panels = (rows + lk->panel_rows - 1) / lk->panel_rows;
  return panels * lk->panel_rows * in_features;
}

namespace {

// The paths that read w's rows in place (no activation: linear_forward_f32 applies it after).
void linear_rows_forward_f32(const KernelTable& k, int64_t rows, int64_t in_features,
                             int64_t out_features, const float* x, int64_t x_stride,
                             const float* w, const float* bias, float* y, int64_t y_stride,
                             float* workspace) {
  if (const LinearKernels* lk = k.linear(DType::F32);
      lk != nullptr && lk->matvec != nullptr && rows <= lk->matvec_max_rows) {
    linear_matvec_forward_f32(*lk, rows, in_features, out_features, x, x_stride, w, bias, y,
                              y_stride);
    return;
  }
  // The split below depends on the shape only, never on the thread count, so results are
  // bitwise identical on 1, 2 or 8 threads (security suite, determinism): OpenBLAS's result for
  // one element can change with the N of the call (measured: a [2, 512] x [512, 1024] product
  // split into 2 and into 8 column slices differed in the last bit), while splitting rows keeps
  // every element's K loop and blocking unchanged.
  if (small_product(rows, in_features, out_features)) {
    k.gemm_f32(false, true, rows, out_features, in_features, 1.0f, x, x_stride, w, in_features,
               0.0f, y, y_stride);
    if (bias) k.add_bias_rows_f32(rows, out_features, y, y_stride, bias);
    return;
  }
  if (const LinearKernels* lk = k.linear(DType::F32);
      use_packed(lk, rows, in_features, out_features)) {
    linear_packed_forward_f32(*lk, rows, in_features, out_features, x, x_stride, w, bias, y,
                              y_stride, workspace);
    return;
  }
  if (rows >= 32) {
    // Split rows: each worker runs one GEMM over a block of rows with the whole weight, so the
    // weight panel is packed once per block. At most 8 blocks of at least 32 rows, by the shape
    // alone: OpenBLAS's result for a row depends on where its block starts (its edge kernels
    // sum in another order), so a split by thread count would change bits with --threads.
    const int64_t blocks = std::clamp<int64_t>(rows / 32, 1, 8);
    const int64_t block_rows = (rows + blocks - 1) / blocks;
    parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * block_rows, n = std::min(block_rows, rows - r0);
        if (n <= 0) continue;
        k.gemm_f32(false, true, n, out_features, in_features, 1.0f, x + r0 * x_stride, x_stride,
                   w, in_features, 0.0f, y + r0 * y_stride, y_stride);
        if (bias) k.add_bias_rows_f32(n, out_features, y + r0 * y_stride, y_stride, bias);
      }
    });
  } else {
    // Few rows (decode-like): split output features into fixed blocks of 128 (a whole number of
    // AVX-512 vectors; 8 blocks for 1024 features, enough to balance 2-8 threads).
    constexpr int64_t kColumnBlock = 128;
    const int64_t blocks = (out_features + kColumnBlock - 1) / kColumnBlock;
    parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n0 = b * kColumnBlock, n = std::min(kColumnBlock, out_features - n0);
        k.gemm_f32(false, true, rows, n, in_features, 1.0f, x, x_stride, w + n0 * in_features,
                   in_features, 0.0f, y + n0, y_stride);
        if (bias) k.add_bias_rows_f32(rows, n, y + n0, y_stride, bias + n0);
      }
    });
  }
}

// The product from the weight's packed panels, where it has them and the device their kernel:
// computed (with `act`), true; otherwise nothing done, false.
bool linear_from_panels_f32(const KernelTable& k, int64_t rows, int64_t in_features,
                            int64_t out_features, RowsInF32 x, ProjectionWeight weight,
                            const float* bias, RowsOutF32 y, Activation act) {
  const LinearKernels* lk = k.linear(DType::F32);
  if (weight.panels == nullptr || lk == nullptr || lk->panels == nullptr) return false;
  linear_panels_forward_f32(*lk, rows, in_features, out_features, x, weight.panels, bias, y,
                            small_product(rows, in_features, out_features), k, act);
  return true;
}

}  // namespace

void linear_forward_f32(const Device& device, int64_t rows, int64_t in_features,
                        int64_t out_features, const float* x, int64_t x_stride,
                        ProjectionWeight weight, const float* bias, float* y, int64_t y_stride,
                        float* workspace, Activation act) {
  if (rows <= 0 || out_features <= 0) return;
  const KernelTable& k = device.kernels();
  if (linear_from_panels_f32(k, rows, in_features, out_features, RowsInF32{x, x_stride}, weight,
                             bias, RowsOutF32{y, y_stride}, act))
    return;
  linear_rows_forward_f32(k, rows, in_features, out_features, x, x_stride, weight.rows, bias, y,
                          y_stride, workspace);
  if (act == Activation::none) return;
  // Split as the elementwise ops split their work: by rows of >= kElementGrain elements.
  const int64_t grain = std::max<int64_t>(1, kElementGrain / out_features);
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    apply_activation_f32(k, act, r0, r1, 0, out_features, RowsOutF32{y, y_stride});
  });
}

void linear_forward_rows_f32(const Device& device, int64_t rows, int64_t in_features,
                             int64_t out_features, RowsInF32 x, ProjectionWeight weight,
                             const float* bias, RowsOutF32 y) {
  if (rows <= 0 || out_features <= 0) return;
  const KernelTable& k = device.kernels();
  if (linear_from_panels_f32(k, rows, in_features, out_features, x, weight, bias, y,
                             Activation::none))
    return;
  // A weight without panels (a network packs every projection it owns: not a path the models
  // take): row by row, each the few-rows product against w read in place, which needs no
  // workspace and reads w once per row.
  for (int64_t r = 0; r < rows; ++r)
    linear_rows_forward_f32(k, 1, in_features, out_features, x.row(r), in_features, weight.rows,
                            bias, y.row(r), out_features, nullptr);
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features), has_bias_(bias) {
  if (in_features <= 0 || out_features <= 0)
    fail(ErrorCode::Constraint, "linear",
         "in_features=" + std::to_string(in_features) +
             " and out_features=" + std::to_string(out_features) + " must be positive");
  params_.add_projection("weight", out_features, in_features);
  if (bias) params_.add("bias", {out_features});
}

void Linear::reset_parameters(Generator& gen) {
  init_linear_weight(params_.mutable_tensor("weight"), gen, in_);
  if (has_bias_) init_linear_bias(params_.mutable_tensor("bias"), gen, in_);
}

namespace {

// nn.Linear's rules, for the layer and the op alike: x [..., in] -> [..., out].
void check_linear_input(const Tensor& x, int64_t in_features, const std::string& where) {
  if (x.dim() < 1 || x.size(-1) != in_features)
    fail(ErrorCode::Shape, where,
         "input " + x.shape_str() + " does not end in in_features=" + std::to_string(in_features));
  if (!dtype_is_floating(x.dtype()))
    fail(ErrorCode::DType, where,
         std::string("input dtype ") + dtype_name(x.dtype()) + " is not a float type");
}

// y = x W^T + b for a contiguous float32 x (rows of in_features), into y (rows of
// out_features), scratch from `ws`.
void linear_rows(const Linear& layer, const Tensor& x, Tensor& y, Workspace& ws,
                 Activation act = Activation::none) {
  const int64_t K = layer.in_features(), N = layer.out_features();
  const int64_t rows = K > 0 ? x.numel() / K : 0;
  const ParameterSet& p = layer.parameters();
  float* scratch = ws.take<float>(linear_workspace_floats(cpu_device(), rows, K, N));
  const float* bias = layer.has_bias() ? p.tensor("bias").data<float>() : nullptr;
  linear_forward_f32(cpu_device(), rows, K, N, rows ? x.data<float>() : nullptr, K,
                     p.projection("weight"), bias, rows ? y.data<float>() : nullptr, N, scratch,
                     act);
}

}  // namespace

Tensor Linear::forward(const Tensor& x) const {
  check_linear_input(x, in_, "linear");
  const Tensor xc = x.to(DType::F32).contiguous();
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  Tensor y = Tensor::empty(out_shape, DType::F32);
  const int64_t rows = xc.numel() / in_;
  const Tensor scratch = Tensor::empty({linear_workspace_floats(cpu_device(), rows, in_, out_)});
  Workspace ws(scratch.raw_data(), scratch.nbytes());
  linear_rows(*this, xc, y, ws);
  return y;
}

// ---------------------------------------------------------------- the `linear` op

namespace {

class LinearLayer : public OpLayer {
 public:
  LinearLayer(int64_t in, int64_t out, bool bias, std::optional<uint64_t> seed, std::string where)
      : linear_(in, out, bias), where_(std::move(where)) {
    if (!seed) return;
    Generator gen(*seed);
    linear_.reset_parameters(gen);
  }
  ParameterSet* parameters() override { return &linear_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    linear_.parameters().load(state, false, where_);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace& ws) const override {
    linear_rows(linear_, *in[0], *out[0], ws);
  }
  void forward_activated(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                         Workspace& ws, Activation act) const override {
    linear_rows(linear_, *in[0], *out[0], ws, act);
  }

 private:
  Linear linear_;
  std::string where_;
};

// F.linear(x, weight, bias) with the weight another node's parameter (GPT's LM head reading
// tok.weight): the layer holds only its bias.
class SharedWeightLinearLayer : public OpLayer {
 public:
  SharedWeightLinearLayer(int64_t in, int64_t out, bool bias, std::optional<uint64_t> seed,
                          std::string where)
      : in_(in), out_(out), bias_(bias), where_(std::move(where)) {
    if (!bias) return;
    params_.add("bias", {out});
    if (!seed) return;
    Generator gen(*seed);
    init_linear_bias(params_.mutable_tensor("bias"), gen, in);
  }
  ParameterSet* parameters() override { return bias_ ? &params_ : nullptr; }
  void load(const std::map<std::string, Tensor>& state) override {
    params_.load(state, false, where_);
  }
  // The tied weight is packed like a layer's own (Model::pack_projections): the LM head of the
  // gpt recipe is 16% of a prefill's FLOPs, and read in place it ran at 99 GFLOP/s against
  // 116-136 for the packed projections (Xeon, AVX-512, one thread).
  PortPanels* port_panels(int port) override { return port == 1 ? &tied_ : nullptr; }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace& ws) const override {
    forward_activated(in, out, ws, Activation::none);
  }
  void forward_activated(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                         Workspace& ws, Activation act) const override {
    const Tensor& x = *in[0];
    const int64_t rows = x.numel() / in_;
    const float* w = in[1]->data<float>();
    const float* panels = tied_.panels.defined() && tied_.rows == w ? tied_.panels.data<float>()
                                                                     : nullptr;
    float* scratch = ws.take<float>(linear_workspace_floats(cpu_device(), rows, in_, out_));
    linear_forward_f32(cpu_device(), rows, in_, out_, rows ? x.data<float>() : nullptr, in_,
                       ProjectionWeight(w, panels),
                       bias_ ? params_.tensor("bias").data<float>() : nullptr,
                       rows ? out[0]->data<float>() : nullptr, out_, scratch, act);
  }

 private:
  int64_t in_, out_;
  bool bias_;
  std::string where_;
  ParameterSet params_;
  PortPanels tied_;
};

class LinearOp : public Op {
 public:
  LinearOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "linear");
    out_ = a.integer("out_features");
    bias_ = a.boolean("bias", true);
    a.finish();
    require_at_least(out_, 1, "out_features", where);
  }
  const char* name() const override { return "linear"; }
  // `weight`, when connected, replaces the node's own weight parameter: a tied weight read by
  // its full name ("tok.weight"), stored and counted once (interfaces.md §1).
  std::vector<PortSpec> input_ports() const override {
    return {PortSpec{"x", false}, PortSpec{"weight", true}};
  }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "linear", where());
    if (x.shape.empty()) fail(ErrorCode::Shape, where(), "x [] has no last dim to project");
    const int64_t K = require_fixed(x.shape.back(), "the last dim (in_features)", x, "x", where());
    if (K < 1) fail(ErrorCode::Shape, where(), named("x", x) + " has an empty last dim");
    InferResult r;
    SymShape out = x.shape;
    out.back() = Dim::fixed(out_);
    r.outputs.push_back({out, DType::F32});
    if (in[1]) {
      const ValueType& w = *in[1];
      require_float("weight", w, "linear", where());
      if (w.shape != fixed_shape(Shape{out_, K}))
        fail(ErrorCode::Shape, where(),
             named("weight", w) + " is not [out_features, in_features] = [" + str(out_) + ", " +
                 str(K) + "]");
    } else {
      r.parameters.emplace_back("weight", Shape{out_, K});
    }
    if (bias_) r.parameters.emplace_back("bias", Shape{out_});
    return r;
  }
  OpCost cost(const InputTypes& in) const override {
    const SymShape& x = in[0]->shape;
    const int64_t K = x.back().value;
    const double rows = elements(x) / static_cast<double>(K);
    OpCost c;
    c.flops = 2.0 * elements(x) * static_cast<double>(out_);
    const int64_t ws_floats =
        linear_workspace_floats(cpu_device(), static_cast<int64_t>(rows), K, out_);
    c.workspace_bytes = sizeof(float) * static_cast<double>(ws_floats);
    return c;
  }
  // in_features and the weight are fixed (infer), so x's rows are positions.
  StepRole step_role(const InputTypes&, const std::string&, std::string&) const override {
    return StepRole::per_position;
  }
  bool applies_activation() const override { return true; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes& in,
                                       std::optional<uint64_t> seed) const override {
    if (in[1])
      return std::make_unique<SharedWeightLinearLayer>(in[0]->shape.back().value, out_, bias_,
                                                       seed, where());
    return std::make_unique<LinearLayer>(in[0]->shape.back().value, out_, bias_, seed, where());
  }

 private:
  int64_t out_;
  bool bias_;
};

}  // namespace

std::unique_ptr<Op> make_linear_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LinearOp>(node, where);
}

}  // namespace tessera
