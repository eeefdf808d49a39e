#include "layers/conv.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/limits.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/op_args.h"
#include "layers/parameters.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

using ojson = nlohmann::ordered_json;
using DimArray = std::array<int64_t, kMaxRank>;

// a * b, E_SHAPE at `where` when it overflows int64.
int64_t checked_mul(int64_t a, int64_t b, const std::string& what, const std::string& where) {
  int64_t p;
  if (__builtin_mul_overflow(a, b, &p)) fail(ErrorCode::Shape, where, what + " overflows int64");
  return p;
}

}  // namespace

int64_t conv2d_output_size(int64_t in, int64_t pad, int64_t kernel, int64_t stride,
                           int64_t dilation, const char* what, const std::string& where) {
  // In 128 bits: in and pad may each be near 2^63 (hostile dims), dilation * (kernel - 1) < 2^62.
  const __int128 span = static_cast<__int128>(dilation) * (kernel - 1) + 1;
  const __int128 padded = static_cast<__int128>(in) + pad;
  if (padded < span)
    fail(ErrorCode::Shape, where,
         std::string("the padded input ") + what + " " + str(in) + " + " + str(pad) +
             " is smaller than the dilated kernel " + str(static_cast<int64_t>(span)) +
             ": the output would be empty");
  const __int128 out = (padded - span) / stride + 1;
  if (out > std::numeric_limits<int64_t>::max())
    fail(ErrorCode::Shape, where, std::string("the output ") + what + " overflows int64");
  return static_cast<int64_t>(out);
}

// ---------------------------------------------------------------- conv2d

namespace {

// Output rows (n, oy) gathered per block: at most kColFloats floats of patches (4 MiB), or one
// output row when a row alone is more. A ViT-B/16 image at 224 (196 patches of 768) is 150,528
// floats, six images a block; a block stays in the L3 (32 MiB here) while the GEMM reads it once
// per block of output channels, and bounds the workspace whatever the batch.
constexpr int64_t kColFloats = int64_t{1} << 20;
// Which GEMM. Both compute W x^T per image and group, W the group's weight [out_g, group_k] and x
// its patches [patches, group_k] (rows of the col matrix), so that the product [out_g, patches]
// is already the NCHW output plane:
//  - OpenBLAS sgemm (W times col^T), in tasks of 256 patches x 128 channels (its n and m);
//  - the backend's linear kernel (backends/cpu/linear_f32.cc) with its roles swapped: the
//    weight packed into panels of kLinearPanelRows output channels once per forward, the patch
//    rows broadcast against them, tiles written straight into the planes. Tasks of 96 patches
//    (8 tiles of 12 on AVX-512, 32 of 3 on AVX2) x weight panels of ~128 K floats (512 KiB,
//    half the L2), the split layers/linear.cpp measured for its projections.
// Packing costs a pass over the weight, so it pays where many patches share it. One thread,
// Zen 3 AVX2 shared with other builds (the FMA probe gave 47-69 of its nominal 102 GFLOP/s),
// best of 40 runs, ranges over 3-4 rounds; GFLOP/s of the whole forward, packed / OpenBLAS:
//   Swin-T 4x4 patches, 224, N = 1 (3136 patches x 48 -> 96)    41-53 / 33-51
//   ViT-B/16 patches, 224, N = 8 (1568 patches x 768 -> 768)    72-75 / 68-71 (CPU time)
//   3x3 conv, 64 -> 64 channels at 56x56 (3136 x 576 -> 64)     56-57 / 49-51
//   ViT-B/16 patches, 224, N = 1 (196 patches)                  63-66 / 68-74
//   ViT-B/32 patches, 224, N = 1 (49 patches x 3072 -> 768)     37-41 / 57-61
//   3x3 conv, 256 -> 256 channels at 14x14 (196 x 2304)         61-64 / 65-66
// (torch 1.13 with mkldnn, one thread, same rounds: 63, 40-55, 81, 62-67, 20-29, 77.) So the
// packed kernel takes a forward of at least kPackedPatches patches (N * oh * ow), or fewer where
// the backend prefers it to OpenBLAS for that shape (LinearKernels::preferred; the weight plays
// the packed rows): on AVX-512 it always does, and ViT-B/16's N = 1 patches take 1.70-1.80 ms
// against OpenBLAS's 2.69 (Zen 5, one thread, OPENBLAS_CORETYPE=Haswell), on AVX2 it does from
// k = 256, a tie there (2.55-2.65 against 2.53-2.61 ms, forced AVX2 on the same Zen 5). And a
// whole panel of channels per group (below one panel most of each panel would be padding).
constexpr int64_t kPackedPatches = 1024;
constexpr int64_t kTaskPatches = 96;
constexpr int64_t kTaskPanelFloats = int64_t{128} << 10;
constexpr int64_t kBlasPatches = 256;
constexpr int64_t kBlasChannels = 128;

struct ConvLayout {
  int64_t group_k = 0;     // C/groups * kh * kw: one group's patch, the GEMM's k
  int64_t patch_k = 0;     // C * kh * kw: a patch across every group, one row of the col matrix
  int64_t out_g = 0;       // out_channels / groups
  int64_t plane = 0;       // out_h * out_w
  int64_t rows = 0;        // N * out_h output rows
  int64_t block_rows = 0;  // output rows gathered at once
  // A 1x1 kernel of stride 1 without padding: the input planes [C, H*W] are already the
  // patches, transposed; OpenBLAS takes them in place (W x), nothing is gathered.
  bool pointwise = false;
  const LinearKernels* lk = nullptr;  // the packed GEMM, or null: OpenBLAS
  // Whether any target could take the packed GEMM (its `preferred` needs 64 patches at least):
  // the scratch holds the packed weight then, as the dispatched target may change after a plan
  // is sized (tests run every target; TESSERA_HWY_TARGET).
  bool may_pack = false;
  int64_t panel_rows = 0;  // output channels per weight panel (when may_pack)
  int64_t panels = 0;      // weight panels per group (when may_pack)
};

// The one place that decides how a forward runs; sizes as infer checked them (no overflow).
ConvLayout conv_layout(const Device& device, const Conv2dOptions& o, const Conv2dShape& s) {
  ConvLayout l;
  l.out_g = o.out_channels / o.groups;
  l.group_k = o.in_channels / o.groups * o.kernel_h * o.kernel_w;
  l.patch_k = o.in_channels * o.kernel_h * o.kernel_w;
  l.plane = s.out_h * s.out_w;
  l.rows = s.batch * s.out_h;
  l.pointwise = o.kernel_h == 1 && o.kernel_w == 1 && o.stride_h == 1 && o.stride_w == 1 &&
                o.pad_top == 0 && o.pad_bottom == 0 && o.pad_left == 0 && o.pad_right == 0;
  if (l.pointwise) {
    l.block_rows = std::max<int64_t>(l.rows, 1);
    return l;
  }
  const int64_t row_floats = s.out_w * l.patch_k;
  l.block_rows = std::clamp<int64_t>(kColFloats / row_floats, 1, std::max<int64_t>(l.rows, 1));
  const LinearKernels* lk = device.kernels().linear(DType::F32);
  const int64_t patches = s.batch * l.plane;
  if (lk && l.out_g >= lk->panel_rows && patches >= 64) {
    l.may_pack = true;
    l.panel_rows = lk->panel_rows;
    l.panels = (l.out_g + lk->panel_rows - 1) / lk->panel_rows;
    if (patches >= kPackedPatches || lk->preferred(l.out_g, l.group_k, patches)) l.lk = lk;
  }
  return l;
}

struct ConvScratch {
  float* col = nullptr;     // block_rows * out_w patches of patch_k floats
  float* packed = nullptr;  // every group's weight in panels (packed GEMM)
};

ConvScratch take_conv_scratch(const ConvLayout& l, const Conv2dOptions& o, const Conv2dShape& s,
                              Workspace& ws) {
  ConvScratch sc;
  if (l.rows == 0 || l.pointwise) return sc;
  sc.col = ws.take<float>(l.block_rows * s.out_w * l.patch_k);
  if (l.may_pack) sc.packed = ws.take<float>(o.groups * l.panels * l.panel_rows * l.group_k);
  return sc;
}

// The patches of output row oy of one image: col[ox][c][i][j] = x[c][iy][ix] with
// iy = oy*stride_h - pad_top + i*dilation_h, ix = ox*stride_w - pad_left + j*dilation_w, zero
// outside the input. Ordered as the weight [out, C/groups, kh, kw] is, so group g's patch is
// the group_k floats from g * group_k. The data moves in runs of kw floats (16 for ViT's patches,
// 4 for Swin's, 3 for a 3x3 conv): kKw > 0 fixes kernel_w at compile time, so that a run inside
// the input row is a fixed-size copy of one or two vector moves instead of a loop (the gather
// took 18% of Swin's patch embedding and 44% of a 3x3 conv over 64 channels at 56x56 with the
// loop; perf, AVX2); kKw == 0 takes any kernel_w.
template <int64_t kKw>
void im2col_row_kw(const Conv2dOptions& o, const Conv2dShape& s, const float* x, int64_t oy,
                   float* col) {
  const int64_t C = o.in_channels, H = s.height, W = s.width, kh = o.kernel_h;
  const int64_t kw = kKw > 0 ? kKw : o.kernel_w;
  const int64_t dh = o.dilation_h, dw = o.dilation_w;
  const int64_t patch_k = C * kh * kw;
  const int64_t iy0 = oy * o.stride_h - o.pad_top;
  for (int64_t ox = 0; ox < s.out_w; ++ox) {
    float* dst = col + ox * patch_k;
    const int64_t ix0 = ox * o.stride_w - o.pad_left;
    const bool inside = ix0 >= 0 && ix0 + (kw - 1) * dw < W;
    for (int64_t c = 0; c < C; ++c) {
      const float* plane = x + c * H * W;
      for (int64_t i = 0; i < kh; ++i, dst += kw) {
        const int64_t iy = iy0 + i * dh;
        if (iy < 0 || iy >= H) {
          std::fill(dst, dst + kw, 0.0f);
          continue;
        }
        const float* row = plane + iy * W;
        if (inside && dw == 1) {
          if constexpr (kKw > 0)
            std::memcpy(dst, row + ix0, sizeof(float) * kKw);
          else
            std::memcpy(dst, row + ix0, sizeof(float) * static_cast<size_t>(kw));
        } else if (inside) {
          for (int64_t j = 0; j < kw; ++j) dst[j] = row[ix0 + j * dw];
        } else {
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t ix = ix0 + j * dw;
            dst[j] = ix >= 0 && ix < W ? row[ix] : 0.0f;
          }
        }
      }
    }
  }
}

void im2col_row(const Conv2dOptions& o, const Conv2dShape& s, const float* x, int64_t oy,
                float* col) {
  switch (o.kernel_w) {
    case 1:
      return im2col_row_kw<1>(o, s, x, oy, col);
    case 2:
      return im2col_row_kw<2>(o, s, x, oy, col);
    case 3:
      return im2col_row_kw<3>(o, s, x, oy, col);
    case 4:
      return im2col_row_kw<4>(o, s, x, oy, col);
    case 5:
      return im2col_row_kw<5>(o, s, x, oy, col);
    case 7:
      return im2col_row_kw<7>(o, s, x, oy, col);
    case 8:
      return im2col_row_kw<8>(o, s, x, oy, col);
    case 14:
      return im2col_row_kw<14>(o, s, x, oy, col);
    case 16:
      return im2col_row_kw<16>(o, s, x, oy, col);
    case 32:
      return im2col_row_kw<32>(o, s, x, oy, col);
    default:
      return im2col_row_kw<0>(o, s, x, oy, col);
  }
}

// y[c][p] += bias[c] for c < channels, p in [p0, p1) of rows `ld` apart.
void add_channel_bias(int64_t channels, const float* bias, float* y, int64_t ld, int64_t p0,
                      int64_t p1) {
  for (int64_t c = 0; c < channels; ++c) {
    const float b = bias[c];
    float* row = y + c * ld;
    for (int64_t p = p0; p < p1; ++p) row[p] += b;
  }
}

}  // namespace

size_t conv2d_workspace_bytes(const Device& device, const Conv2dOptions& o, const Conv2dShape& s) {
  Workspace counter;
  take_conv_scratch(conv_layout(device, o, s), o, s, counter);
  return counter.peak();
}

// Per block of output rows: the patches gathered (im2col_row, in parallel over rows), then the
// GEMM tasks of every image segment and group of the block (conv_layout says which GEMM).
void conv2d_forward_f32(const Device& device, const Conv2dOptions& o, const Conv2dShape& s,
                        const float* x, const float* weight, const float* bias, float* y,
                        Workspace& ws) {
  const ConvLayout l = conv_layout(device, o, s);
  if (l.rows == 0) return;
  const ConvScratch sc = take_conv_scratch(l, o, s, ws);
  const KernelTable& k = device.kernels();
  const int64_t G = o.groups, K = l.group_k, KP = l.patch_k, P = l.plane;
  const int64_t OH = s.out_h, OW = s.out_w, out_g = l.out_g;
  const int64_t x_image = o.in_channels * s.height * s.width, y_image = o.out_channels * P;

  if (l.pointwise) {
    // y[n][g] = W_g x[n][g], x[n][g] the group's input planes [C/groups, H*W] as they are.
    const int64_t patch_blocks = (P + kBlasPatches - 1) / kBlasPatches;
    const int64_t channel_blocks = (out_g + kBlasChannels - 1) / kBlasChannels;
    parallel_for(0, s.batch * G * channel_blocks * patch_blocks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t rest = t;
        const int64_t f0 = rest % patch_blocks * kBlasPatches;
        rest /= patch_blocks;
        const int64_t c0 = rest % channel_blocks * kBlasChannels;
        rest /= channel_blocks;
        const int64_t g = rest % G, n = rest / G;
        const int64_t f1 = std::min(P, f0 + kBlasPatches), c1 = std::min(out_g, c0 + kBlasChannels);
        float* yc = y + n * y_image + (g * out_g + c0) * P;
        k.gemm_f32(false, false, c1 - c0, f1 - f0, K, 1.0f, weight + (g * out_g + c0) * K, K,
                   x + n * x_image + g * K * P + f0, P, 0.0f, yc + f0, P);
        if (bias) add_channel_bias(c1 - c0, bias + g * out_g + c0, yc, P, f0, f1);
      }
    });
    return;
  }

  int64_t panel_rows = 0, panel_floats = 0;
  if (l.lk) {
    panel_rows = l.lk->panel_rows;
    panel_floats = panel_rows * K;
    const LinearKernels& lk = *l.lk;
    parallel_for(0, G * l.panels, std::max<int64_t>(1, kElementGrain / panel_floats),
                 [&](int64_t t0, int64_t t1) {
                   for (int64_t t = t0; t < t1; ++t) {
                     const int64_t g = t / l.panels, q = t % l.panels;
                     lk.pack(out_g, K, weight + g * out_g * K, K, q, q + 1,
                             sc.packed + g * l.panels * panel_floats);
                   }
                 });
  }

  for (int64_t r0 = 0; r0 < l.rows; r0 += l.block_rows) {
    const int64_t r1 = std::min(l.rows, r0 + l.block_rows);
    parallel_for(r0, r1, std::max<int64_t>(1, kElementGrain / (OW * KP)),
                 [&](int64_t a, int64_t b) {
                   for (int64_t r = a; r < b; ++r)
                     im2col_row(o, s, x + (r / OH) * x_image, r % OH, sc.col + (r - r0) * OW * KP);
                 });
    // The block's rows split into one segment per image: rows [max(r0, n*OH), min(r1, (n+1)*OH))
    // of image n, whose patches are contiguous in its output planes.
    const int64_t n_first = r0 / OH, images = (r1 - 1) / OH - n_first + 1;
    const int64_t longest = std::min(r1 - r0, OH) * OW;
    struct Segment {
      const float* col;  // its first patch
      float* y;          // output channel 0 of group 0, at its first patch
      int64_t patches;
    };
    auto segment = [&](int64_t image) {
      const int64_t n = n_first + image;
      const int64_t rs = std::max(r0, n * OH), re = std::min(r1, (n + 1) * OH);
      return Segment{sc.col + (rs - r0) * OW * KP, y + n * y_image + (rs - n * OH) * OW,
                     (re - rs) * OW};
    };

    if (l.lk) {
      const LinearKernels& lk = *l.lk;
      const int64_t panels_per_task = std::max<int64_t>(1, kTaskPanelFloats / panel_floats);
      const int64_t patch_blocks = (longest + kTaskPatches - 1) / kTaskPatches;
      const int64_t panel_blocks = (l.panels + panels_per_task - 1) / panels_per_task;
      // Task order: patch blocks fastest, so that consecutive tasks share a weight panel block
      // (in L2) and read different patches.
      parallel_for(0, images * G * panel_blocks * patch_blocks, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          int64_t rest = t;
          const int64_t fb = rest % patch_blocks;
          rest /= patch_blocks;
          const int64_t pb = rest % panel_blocks;
          rest /= panel_blocks;
          const int64_t g = rest % G;
          const Segment seg = segment(rest / G);
          const int64_t f0 = fb * kTaskPatches;
          if (f0 >= seg.patches) continue;
          const int64_t f1 = std::min(seg.patches, f0 + kTaskPatches);
          const int64_t q0 = pb * panels_per_task, q1 = std::min(l.panels, q0 + panels_per_task);
          float* yg = seg.y + g * out_g * P;
          lk.packed(out_g, K, sc.packed + g * l.panels * panel_floats, q0, q1, seg.col + g * K, KP,
                    f0, f1, nullptr, yg, P);
          if (bias) {
            const int64_t c0 = q0 * panel_rows, c1 = std::min(out_g, q1 * panel_rows);
            add_channel_bias(c1 - c0, bias + g * out_g + c0, yg + c0 * P, P, f0, f1);
          }
        }
      });
    } else {
      const int64_t patch_blocks = (longest + kBlasPatches - 1) / kBlasPatches;
      const int64_t channel_blocks = (out_g + kBlasChannels - 1) / kBlasChannels;
      parallel_for(0, images * G * channel_blocks * patch_blocks, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          int64_t rest = t;
          const int64_t fb = rest % patch_blocks;
          rest /= patch_blocks;
          const int64_t cb = rest % channel_blocks;
          rest /= channel_blocks;
          const int64_t g = rest % G;
          const Segment seg = segment(rest / G);
          const int64_t f0 = fb * kBlasPatches;
          if (f0 >= seg.patches) continue;
          const int64_t f1 = std::min(seg.patches, f0 + kBlasPatches);
          const int64_t c0 = cb * kBlasChannels, c1 = std::min(out_g, c0 + kBlasChannels);
          float* yc = seg.y + (g * out_g + c0) * P;
          k.gemm_f32(false, true, c1 - c0, f1 - f0, K, 1.0f, weight + (g * out_g + c0) * K, K,
                     seg.col + f0 * KP + g * K, KP, 0.0f, yc + f0, P);
          if (bias) add_channel_bias(c1 - c0, bias + g * out_g + c0, yc, P, f0, f1);
        }
      });
    }
  }
}

// ---------------------------------------------------------------- mean

void mean_into(const Tensor& x, std::span<const int64_t> dims, bool keepdim, Tensor& y,
               const std::string& where) {
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  const int64_t rank = xc.dim();
  if (rank > kMaxRank)
    fail(ErrorCode::Shape, where, "rank " + str(rank) + " is over the limit of " + str(kMaxRank));
  std::array<bool, kMaxRank> reduced{};
  for (int64_t i = 0; i < rank; ++i) reduced[static_cast<size_t>(i)] = dims.empty();
  for (const int64_t d : dims) {
    const int64_t w = wrap_dim(d, std::max<int64_t>(rank, 1), where);
    if (rank == 0) continue;
    if (reduced[static_cast<size_t>(w)])
      fail(ErrorCode::Constraint, where, "dim " + str(w) + " appears more than once in dim");
    reduced[static_cast<size_t>(w)] = true;
  }
  DimArray out{};
  size_t out_rank = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (!reduced[static_cast<size_t>(i)])
      out[out_rank++] = xc.size(i);
    else if (keepdim)
      out[out_rank++] = 1;
  }
  check_output(y, std::span<const int64_t>(out.data(), out_rank), "y", where);
  const int64_t n_out = y.numel();
  if (n_out == 0) return;
  float* yp = y.data<float>();
  if (xc.numel() == 0) {  // a reduced dim is empty: 0/0
    std::fill(yp, yp + n_out, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  // Coalesced: size-1 dims dropped, neighbours of the same kind merged, so the layout is a few
  // alternating groups of kept and reduced dims.
  DimArray size{}, stride{};
  std::array<bool, kMaxRank> red{};
  size_t m = 0;
  int64_t count = 1;
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t n = xc.size(i);
    const bool r = reduced[static_cast<size_t>(i)];
    if (r) count *= n;
    if (n == 1) continue;
    if (m > 0 && red[m - 1] == r) {
      size[m - 1] *= n;
    } else {
      size[m] = n;
      red[m] = r;
      ++m;
    }
  }
  if (m == 0) {  // a single element
    size[0] = 1;
    m = 1;
  }
  stride[m - 1] = 1;
  for (size_t i = m - 1; i-- > 0;) stride[i] = stride[i + 1] * size[i + 1];
  const float* xp = xc.data<float>();
  const double scale = 1.0 / static_cast<double>(count);

  // Input offset of the idx-th combination of the groups of kind `want` among the first `upto`
  // groups (row-major over them).
  auto offset_of = [&](int64_t idx, bool want, size_t upto) {
    int64_t off = 0;
    for (size_t g = upto; g-- > 0;) {
      if (red[g] != want) continue;
      off += (idx % size[g]) * stride[g];
      idx /= size[g];
    }
    return off;
  };

  if (!red[m - 1]) {
    // Kept innermost dims: each output row of `inner` floats sums whole input rows. Columns go in
    // chunks of kChunk double accumulators on the stack (vectorised by the compiler: the columns
    // are independent, the order over input rows fixed).
    constexpr int64_t kChunk = 256;
    const int64_t inner = size[m - 1];
    const int64_t chunks = (inner + kChunk - 1) / kChunk;
    const int64_t out_rows = n_out / inner;
    const int64_t work = std::min(inner, kChunk) * count;  // floats read per item
    parallel_for(0, out_rows * chunks, std::max<int64_t>(1, kElementGrain / work),
                 [&](int64_t i0, int64_t i1) {
                   double acc[kChunk];
                   for (int64_t item = i0; item < i1; ++item) {
                     const int64_t o = item / chunks, j0 = (item % chunks) * kChunk;
                     const int64_t len = std::min(kChunk, inner - j0);
                     const float* base = xp + offset_of(o, false, m - 1) + j0;
                     std::fill(acc, acc + len, 0.0);
                     for (int64_t r = 0; r < count; ++r) {
                       const float* row = base + offset_of(r, true, m - 1);
                       for (int64_t j = 0; j < len; ++j) acc[j] += row[j];
                     }
                     float* dst = yp + o * inner + j0;
                     for (int64_t j = 0; j < len; ++j) dst[j] = static_cast<float>(acc[j] * scale);
                   }
                 });
    return;
  }
  // Reduced innermost dims: each output sums count / run contiguous runs, four accumulators
  // interleaved (a fixed order, whatever the split).
  const int64_t run = size[m - 1], runs = count / run;
  parallel_for(0, n_out, std::max<int64_t>(1, kElementGrain / count), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const float* base = xp + offset_of(o, false, m);
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (int64_t r = 0; r < runs; ++r) {
        const float* p = base + offset_of(r, true, m - 1);
        int64_t j = 0;
        for (; j + 4 <= run; j += 4) {
          a0 += p[j];
          a1 += p[j + 1];
          a2 += p[j + 2];
          a3 += p[j + 3];
        }
        for (; j < run; ++j) a0 += p[j];
      }
      yp[o] = static_cast<float>(((a0 + a1) + (a2 + a3)) * scale);
    }
  });
}

// ---------------------------------------------------------------- adaptive_avg_pool2d

void adaptive_avg_pool2d_into(const Tensor& x, Tensor& y, const std::string& where) {
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  if (xc.dim() != 3 && xc.dim() != 4)
    fail(ErrorCode::Shape, where, "x " + xc.shape_str() + " is not [N, C, H, W] or [C, H, W]");
  const int64_t H = xc.size(-2), W = xc.size(-1);
  if (!y.defined() || y.dim() != xc.dim() ||
      !std::equal(xc.shape().begin(), xc.shape().end() - 2, y.shape().begin()))
    fail(ErrorCode::Shape, where,
         "y " + (y.defined() ? y.shape_str() : std::string("(undefined)")) + " is not x " +
             xc.shape_str() + " with other last two dims");
  check_output(y, y.shape(), "y", where);  // contiguous float32
  const int64_t OH = y.size(-2), OW = y.size(-1);
  const int64_t planes = OH * OW == 0 ? 0 : y.numel() / (OH * OW);
  if (planes == 0) return;
  if (H < 1 || W < 1)
    fail(ErrorCode::Shape, where, "x " + xc.shape_str() + " has an empty spatial dim");
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  // floor(i * n / out) and ceil((i + 1) * n / out), in 128 bits (both sizes may be large).
  auto start = [](int64_t i, int64_t n, int64_t out) {
    return static_cast<int64_t>(static_cast<__int128>(i) * n / out);
  };
  auto end = [](int64_t i, int64_t n, int64_t out) {
    return static_cast<int64_t>((static_cast<__int128>(i + 1) * n + out - 1) / out);
  };
  // Each plane reads about H * W floats (windows overlap by at most one row or column).
  parallel_for(0, planes, std::max<int64_t>(1, kElementGrain / std::max(H * W, OH * OW)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p) {
                   const float* src = xp + p * H * W;
                   float* dst = yp + p * OH * OW;
                   for (int64_t i = 0; i < OH; ++i) {
                     const int64_t y0 = start(i, H, OH), y1 = end(i, H, OH);
                     for (int64_t j = 0; j < OW; ++j) {
                       const int64_t x0 = start(j, W, OW), x1 = end(j, W, OW);
                       double sum = 0.0;
                       for (int64_t r = y0; r < y1; ++r)
                         for (int64_t c = x0; c < x1; ++c) sum += src[r * W + c];
                       dst[i * OW + j] =
                           static_cast<float>(sum / static_cast<double>((y1 - y0) * (x1 - x0)));
                     }
                   }
                 }
               });
}

// ---------------------------------------------------------------- the ops

namespace {

// An int argument's value from JSON (E_ARG when not an int, E_CONSTRAINT past int64).
int64_t json_int(Args& a, const char* name, const char* want, const ojson& whole, const ojson& v,
                 const std::string& where) {
  if (!v.is_number_integer()) a.type_error(name, want, whole);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(ErrorCode::Constraint, where,
         std::string("argument ") + name + "=" + shown_arg(whole) + " does not fit int64");
  return v.get<int64_t>();
}

// An int or a pair of ints ([h, w]), as torch's _pair takes them; `def` when absent.
std::pair<int64_t, int64_t> int_pair(Args& a, const char* name, const ojson* v,
                                     std::pair<int64_t, int64_t> def, const std::string& where) {
  constexpr const char* kWant = "an int or a pair of ints";
  if (!v) return def;
  if (v->is_array()) {
    if (v->size() != 2) a.type_error(name, kWant, *v);
    return {json_int(a, name, kWant, *v, (*v)[0], where),
            json_int(a, name, kWant, *v, (*v)[1], where)};
  }
  return {json_int(a, name, kWant, *v, *v, where), json_int(a, name, kWant, *v, *v, where)};
}

// E_CONSTRAINT unless min <= both <= kConvArgMax: "stride=[1, 0] must be >= 1".
void require_pair(std::pair<int64_t, int64_t> p, int64_t min, const char* name, const ojson* raw,
                  const std::string& where) {
  const std::string arg = std::string(name) + "=" + (raw ? shown_arg(*raw) : str(p.first));
  if (p.first < min || p.second < min)
    fail(ErrorCode::Constraint, where, arg + " must be >= " + str(min));
  if (p.first > kConvArgMax || p.second > kConvArgMax)
    fail(ErrorCode::Constraint, where, arg + " must be <= " + str(kConvArgMax));
}

// True when `text` has a + or - outside parentheses: dividing it needs them.
bool has_top_level_sum(const std::string& text) {
  int depth = 0;
  for (const char ch : text) {
    depth += ch == '(' ? 1 : ch == ')' ? -1 : 0;
    if (depth == 0 && (ch == '+' || ch == '-')) return true;
  }
  return false;
}

// The output size of an open input dim `in`, as the expression (in + add) / stride that
// conv2d_output_size evaluates once it is bound, add = pad - dilation * (kernel - 1) - 1 + stride:
// "H/16" for ViT's patches, "(H+1)/2" for a 3x3 stride-2 conv padded by 1, "H-2" unpadded.
Dim open_output_dim(const Dim& in, int64_t pad, int64_t kernel, int64_t stride, int64_t dilation) {
  const __int128 add =
      static_cast<__int128>(pad) - static_cast<__int128>(dilation) * (kernel - 1) - 1 + stride;
  std::string text = in.text;
  if (add != 0) {
    text += add > 0 ? '+' : '-';
    text += std::to_string(static_cast<uint64_t>(add > 0 ? add : -add));
  }
  if (stride == 1) return Dim::open(text);
  if (has_top_level_sum(text)) {
    text.insert(text.begin(), '(');
    text += ')';
  }
  text += '/';
  text += str(stride);
  return Dim::open(text);
}

class Conv2dLayer : public OpLayer {
 public:
  Conv2dLayer(const Conv2dOptions& o, std::optional<uint64_t> seed, std::string where)
      : o_(o), where_(std::move(where)) {
    const int64_t fan_in = o.in_channels / o.groups * o.kernel_h * o.kernel_w;
    params_.add("weight", {o.out_channels, o.in_channels / o.groups, o.kernel_h, o.kernel_w});
    if (o.bias) params_.add("bias", {o.out_channels});
    if (!seed) return;
    // nn.Conv2d.reset_parameters: kaiming_uniform_(a=sqrt(5)) is U(+-1/sqrt(fan_in)), and the
    // bias U(+-1/sqrt(fan_in)), fan_in = in_channels / groups * kh * kw.
    Generator gen(*seed);
    init_linear_weight(params_.mutable_tensor("weight"), gen, fan_in);
    if (o.bias) init_linear_bias(params_.mutable_tensor("bias"), gen, fan_in);
  }
  ParameterSet* parameters() override { return &params_; }
  void load(const std::map<std::string, Tensor>& state) override {
    params_.load(state, false, where_);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace& ws) const override {
    const Tensor& x = *in[0];
    const int64_t r = x.dim();
    Conv2dShape s;
    s.batch = r == 4 ? x.size(0) : 1;
    s.height = x.size(r - 2);
    s.width = x.size(r - 1);
    s.out_h = conv2d_output_size(s.height, o_.pad_top + o_.pad_bottom, o_.kernel_h, o_.stride_h,
                                 o_.dilation_h, "height", where_);
    s.out_w = conv2d_output_size(s.width, o_.pad_left + o_.pad_right, o_.kernel_w, o_.stride_w,
                                 o_.dilation_w, "width", where_);
    if (x.numel() == 0) return;
    conv2d_forward_f32(cpu_device(), o_, s, x.data<float>(), params_.tensor("weight").data<float>(),
                       o_.bias ? params_.tensor("bias").data<float>() : nullptr,
                       out[0]->data<float>(), ws);
  }

 private:
  Conv2dOptions o_;
  std::string where_;
  ParameterSet params_;
};

class Conv2dOp : public Op {
 public:
  Conv2dOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "conv2d");
    o_.in_channels = a.integer("in_channels");
    o_.out_channels = a.integer("out_channels");
    const ojson* kernel = a.raw("kernel_size");
    if (!kernel) fail(ErrorCode::Arg, where, "missing required argument kernel_size");
    const auto [kh, kw] = int_pair(a, "kernel_size", kernel, {0, 0}, where);
    const ojson* stride_raw = a.raw("stride");
    const auto [sh, sw] = int_pair(a, "stride", stride_raw, {1, 1}, where);
    const ojson* pad_raw = a.raw("padding");
    std::string pad_mode;  // "valid", "same" or empty: numbers
    std::pair<int64_t, int64_t> pad{0, 0};
    if (pad_raw && pad_raw->is_string())
      pad_mode = pad_raw->get<std::string>();
    else
      pad = int_pair(a, "padding", pad_raw, {0, 0}, where);
    const ojson* dil_raw = a.raw("dilation");
    const auto [dh, dw] = int_pair(a, "dilation", dil_raw, {1, 1}, where);
    o_.groups = a.integer("groups", 1);
    o_.bias = a.boolean("bias", true);
    const std::string padding_mode = a.string("padding_mode", "zeros");
    a.finish();

    require_at_least(o_.in_channels, 1, "in_channels", where);
    require_at_least(o_.out_channels, 1, "out_channels", where);
    require_at_least(o_.groups, 1, "groups", where);
    if (o_.in_channels % o_.groups != 0 || o_.out_channels % o_.groups != 0)
      fail(ErrorCode::Constraint, where,
           "groups=" + str(o_.groups) + " must divide in_channels=" + str(o_.in_channels) +
               " and out_channels=" + str(o_.out_channels));
    require_pair({kh, kw}, 1, "kernel_size", kernel, where);
    require_pair({sh, sw}, 1, "stride", stride_raw, where);
    require_pair({dh, dw}, 1, "dilation", dil_raw, where);
    o_.kernel_h = kh;
    o_.kernel_w = kw;
    o_.stride_h = sh;
    o_.stride_w = sw;
    o_.dilation_h = dh;
    o_.dilation_w = dw;
    if (pad_mode.empty()) {
      require_pair(pad, 0, "padding", pad_raw, where);
      o_.pad_top = o_.pad_bottom = pad.first;
      o_.pad_left = o_.pad_right = pad.second;
    } else if (pad_mode == "same") {
      if (sh != 1 || sw != 1)
        fail(ErrorCode::Constraint, where,
             "padding='same' is not supported for strided convolutions (stride=" +
                 (stride_raw ? shown_arg(*stride_raw) : str(sh)) + ")");
      // Total dilation * (kernel - 1), the odd one after, as PyTorch pads for 'same'.
      o_.pad_top = dh * (kh - 1) / 2;
      o_.pad_bottom = dh * (kh - 1) - o_.pad_top;
      o_.pad_left = dw * (kw - 1) / 2;
      o_.pad_right = dw * (kw - 1) - o_.pad_left;
    } else if (pad_mode != "valid") {
      fail(ErrorCode::Constraint, where,
           "padding='" + pad_mode + "' must be 'valid', 'same', an int or a pair of ints");
    }
    if (padding_mode == "reflect" || padding_mode == "replicate" || padding_mode == "circular")
      fail(ErrorCode::Unsupported, where,
           "padding_mode='" + padding_mode + "' is not supported (only 'zeros')");
    if (padding_mode != "zeros")
      fail(ErrorCode::Constraint, where,
           "padding_mode='" + padding_mode +
               "' must be one of 'zeros', 'reflect', 'replicate', 'circular'");
    // The weight, and the packed copy the forward makes of it (whole panels of 32 channels per
    // group, at most 32 times the weight), stay well inside int64.
    int64_t w = 0;
    const bool huge = __builtin_mul_overflow(o_.out_channels, o_.in_channels / o_.groups, &w) ||
                      __builtin_mul_overflow(w, kh, &w) || __builtin_mul_overflow(w, kw, &w) ||
                      __builtin_mul_overflow(w, int64_t{64}, &w) ||
                      __builtin_mul_overflow(o_.in_channels, kh * kw, &w);
    if (huge)
      fail(ErrorCode::Constraint, where,
           "the weight [" + str(o_.out_channels) + ", " + str(o_.in_channels / o_.groups) + ", " +
               str(kh) + ", " + str(kw) + "] is too large");
  }
  const char* name() const override { return "conv2d"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "conv2d", where());
    const size_t rank = x.shape.size();
    if (rank != 3 && rank != 4)
      fail(ErrorCode::Shape, where(), named("x", x) + " is not [N, C, H, W] or [C, H, W]");
    const size_t c = rank - 3;
    const Dim& C = x.shape[c];
    if (C.is_fixed() && C.value != o_.in_channels)
      fail(ErrorCode::Shape, where(),
           named("x", x) + " has " + str(C.value) + " channels (dim " +
               str(static_cast<int64_t>(c)) + "), in_channels=" + str(o_.in_channels));
    for (size_t i = c + 1; i < rank; ++i)
      if (x.shape[i].is_fixed() && x.shape[i].value == 0)
        fail(ErrorCode::Shape, where(),
             named("x", x) + " has an empty spatial dim (only the batch may be empty)");
    SymShape out = x.shape;
    out[c] = Dim::fixed(o_.out_channels);
    auto side = [&](const Dim& d, int64_t pad, int64_t k, int64_t s, int64_t dil,
                    const char* what) {
      return d.is_fixed() ? Dim::fixed(conv2d_output_size(d.value, pad, k, s, dil, what, where()))
                          : open_output_dim(d, pad, k, s, dil);
    };
    out[c + 1] = side(x.shape[c + 1], o_.pad_top + o_.pad_bottom, o_.kernel_h, o_.stride_h,
                      o_.dilation_h, "height");
    out[c + 2] = side(x.shape[c + 2], o_.pad_left + o_.pad_right, o_.kernel_w, o_.stride_w,
                      o_.dilation_w, "width");
    if (is_fixed(out)) {
      // The sizes the forward computes with: the output, and one output row's patches.
      int64_t n = 1;
      for (const Dim& d : out) n = checked_mul(n, d.value, "the output size", where());
      checked_mul(out[c + 2].value, o_.in_channels * o_.kernel_h * o_.kernel_w,
                  "one output row's patches", where());
    }
    InferResult r;
    r.outputs.push_back({out, DType::F32});
    r.parameters.emplace_back(
        "weight", Shape{o_.out_channels, o_.in_channels / o_.groups, o_.kernel_h, o_.kernel_w});
    if (o_.bias) r.parameters.emplace_back("bias", Shape{o_.out_channels});
    return r;
  }
  OpCost cost(const InputTypes& in) const override {
    const Conv2dShape s = shape_of(in[0]->shape);
    const double outputs = static_cast<double>(s.batch) * static_cast<double>(o_.out_channels) *
                           static_cast<double>(s.out_h) * static_cast<double>(s.out_w);
    const double k = static_cast<double>(o_.in_channels / o_.groups) *
                     static_cast<double>(o_.kernel_h * o_.kernel_w);
    OpCost c;
    c.flops = 2.0 * outputs * k + (o_.bias ? outputs : 0.0);
    c.workspace_bytes = static_cast<double>(conv2d_workspace_bytes(cpu_device(), o_, s));
    return c;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<Conv2dLayer>(o_, seed, where());
  }

 private:
  Conv2dShape shape_of(const SymShape& x) const {
    const size_t r = x.size();
    Conv2dShape s;
    s.batch = r == 4 ? x[0].value : 1;
    s.height = x[r - 2].value;
    s.width = x[r - 1].value;
    s.out_h = conv2d_output_size(s.height, o_.pad_top + o_.pad_bottom, o_.kernel_h, o_.stride_h,
                                 o_.dilation_h, "height", where());
    s.out_w = conv2d_output_size(s.width, o_.pad_left + o_.pad_right, o_.kernel_w, o_.stride_w,
                                 o_.dilation_w, "width", where());
    return s;
  }

  Conv2dOptions o_;
};

class MeanOp : public Op {
 public:
  MeanOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "mean");
    if (const ojson* d = a.raw("dim"); d && !d->is_null()) {
      constexpr const char* kWant = "an int, a list of ints or null";
      if (d->is_array()) {
        if (d->size() > static_cast<size_t>(kMaxRank))
          fail(ErrorCode::Constraint, where,
               "dim lists " + str(static_cast<int64_t>(d->size())) + " dims, more than rank " +
                   str(kMaxRank) + " allows");
        for (const ojson& v : *d) dims_.push_back(json_int(a, "dim", kWant, *d, v, where));
      } else {
        dims_.push_back(json_int(a, "dim", kWant, *d, *d, where));
      }
    }
    keepdim_ = a.boolean("keepdim", false);
    a.finish();
  }
  const char* name() const override { return "mean"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "mean", where());
    const auto rank = static_cast<int64_t>(x.shape.size());
    std::vector<bool> reduced(x.shape.size(), dims_.empty());
    for (const int64_t d : dims_) {
      const int64_t w = wrap_dim(d, std::max<int64_t>(rank, 1), where(), "input");
      if (rank == 0) continue;
      if (reduced[static_cast<size_t>(w)])
        fail(ErrorCode::Constraint, where(),
             "dim " + str(w) + " appears more than once in dim (x " + sym_shape_to_string(x.shape) +
                 ")");
      reduced[static_cast<size_t>(w)] = true;
    }
    SymShape out;
    for (size_t i = 0; i < x.shape.size(); ++i) {
      if (!reduced[i])
        out.push_back(x.shape[i]);
      else if (keepdim_)
        out.push_back(Dim::fixed(1));
    }
    return {{{out, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer([dims = dims_, keepdim = keepdim_, w = where()](
                              std::span<const Tensor* const> in, std::span<Tensor* const> out) {
      mean_into(*in[0], dims, keepdim, *out[0], w);
    });
  }

 private:
  std::vector<int64_t> dims_;  // empty: every dim
  bool keepdim_ = false;
};

class AdaptiveAvgPool2dOp : public Op {
 public:
  AdaptiveAvgPool2dOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "adaptive_avg_pool2d");
    const ojson* s = a.raw("output_size");
    a.finish();
    if (!s) fail(ErrorCode::Arg, where, "missing required argument output_size");
    constexpr const char* kWant = "an int, or a pair of ints or nulls";
    auto entry = [&](const ojson& v) -> std::optional<int64_t> {
      if (v.is_null()) return std::nullopt;
      const int64_t n = json_int(a, "output_size", kWant, *s, v, where);
      if (n < 0)
        fail(ErrorCode::Constraint, where, "output_size=" + shown_arg(*s) + " must be >= 0");
      return n;
    };
    if (s->is_array()) {
      if (s->size() != 2) a.type_error("output_size", kWant, *s);
      h_ = entry((*s)[0]);
      w_ = entry((*s)[1]);
    } else {
      if (s->is_null()) a.type_error("output_size", kWant, *s);
      h_ = w_ = entry(*s);
    }
  }
  const char* name() const override { return "adaptive_avg_pool2d"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "adaptive_avg_pool2d", where());
    const size_t rank = x.shape.size();
    if (rank != 3 && rank != 4)
      fail(ErrorCode::Shape, where(), named("x", x) + " is not [N, C, H, W] or [C, H, W]");
    for (size_t i = rank - 3; i < rank; ++i)
      if (x.shape[i].is_fixed() && x.shape[i].value == 0)
        fail(ErrorCode::Shape, where(),
             named("x", x) + " has an empty dim " + str(static_cast<int64_t>(i)) +
                 " (only the batch dim may be empty)");
    SymShape out = x.shape;
    if (h_) out[rank - 2] = Dim::fixed(*h_);
    if (w_) out[rank - 1] = Dim::fixed(*w_);
    if (is_fixed(out)) {
      int64_t n = 1;
      for (const Dim& d : out) n = checked_mul(n, d.value, "the output size", where());
    }
    return {{{out, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          adaptive_avg_pool2d_into(*in[0], *out[0], w);
        });
  }

 private:
  std::optional<int64_t> h_, w_;  // nullopt: the input's size
};

}  // namespace

std::unique_ptr<Op> make_conv2d_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<Conv2dOp>(node, where);
}
std::unique_ptr<Op> make_mean_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<MeanOp>(node, where);
}
std::unique_ptr<Op> make_adaptive_avg_pool2d_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<AdaptiveAvgPool2dOp>(node, where);
}

}  // namespace tessera
