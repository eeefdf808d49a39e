#include "layers/matmul.h"

#include <algorithm>
#include <array>
#include <span>

#include "backends/cpu/cpu_device.h"
#include "core/limits.h"
#include "core/parallel.h"
#include "core/text.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

// Dims of at most kMaxRank, on the stack: the forward allocates nothing.
using DimArray = std::array<int64_t, kMaxRank>;

std::string pair_of(std::span<const int64_t> a, std::span<const int64_t> b) {
  std::string s = "a ";
  s += shape_to_string(Shape(a.begin(), a.end()));
  s += " and b ";
  s += shape_to_string(Shape(b.begin(), b.end()));
  return s;
}

// One product's layout on concrete shapes: `batches` products of [m, k] x [k, n] over the
// broadcast batch dims, and where each operand's matrix of a batch index starts.
struct MatmulLayout {
  int64_t m = 1, n = 1, k = 1;
  size_t batch_rank = 0;
  DimArray batch{};  // the broadcast batch dims
  DimArray out{};    // the output shape
  size_t out_rank = 0;
};

// Validates as MatmulOp::infer does, with the same messages; allocates only to fail. Multiplies
// no dims (a hostile shape cannot overflow here; matmul_into's products are those of tensors
// that exist).
MatmulLayout matmul_layout(std::span<const int64_t> a, std::span<const int64_t> b,
                           const std::string& where) {
  MatmulLayout l;
  const size_t ra = a.size(), rb = b.size();
  if (ra == 0 || rb == 0)
    fail(ErrorCode::Shape, where, pair_of(a, b) + ": matmul needs inputs of at least 1 dim");
  if (std::max(ra, rb) > static_cast<size_t>(kMaxRank))
    fail(ErrorCode::Shape, where, pair_of(a, b) + ": rank over the limit of " + str(kMaxRank));
  l.m = ra >= 2 ? a[ra - 2] : 1;
  l.k = a[ra - 1];
  const int64_t kb = rb >= 2 ? b[rb - 2] : b[0];
  l.n = rb >= 2 ? b[rb - 1] : 1;
  if (l.k != kb)
    fail(ErrorCode::Shape, where,
         pair_of(a, b) + " cannot be multiplied: inner dims " + str(l.k) + " vs " + str(kb));
  const size_t ba = ra >= 2 ? ra - 2 : 0, bb = rb >= 2 ? rb - 2 : 0;
  l.batch_rank = std::max(ba, bb);
  for (size_t i = 0; i < l.batch_rank; ++i) {
    const int64_t da = i < l.batch_rank - ba ? 1 : a[i - (l.batch_rank - ba)];
    const int64_t db = i < l.batch_rank - bb ? 1 : b[i - (l.batch_rank - bb)];
    if (da != db && da != 1 && db != 1)
      fail(ErrorCode::Shape, where,
           pair_of(a, b) + " do not broadcast in their batch dims (dim " +
               str(static_cast<int64_t>(i)) + "): " + str(da) + " vs " + str(db));
    l.batch[i] = da == 1 ? db : da;
    l.out[l.out_rank++] = l.batch[i];
  }
  if (ra >= 2) l.out[l.out_rank++] = l.m;
  if (rb >= 2) l.out[l.out_rank++] = l.n;
  return l;
}

// Work per task, in FLOPs: 4 MFLOP is ~40 us at the ~100 GFLOP/s OpenBLAS reaches here
// (linear.cpp's table), well above the 1-10 us a worker takes to wake; smaller products run
// whole, several per task.
constexpr double kTaskFlops = 4e6;

// How one GEMM of [rows, k] x [k, cols] is cut into tasks, from its shape alone (so results do
// not depend on the thread count). Every task is its own GEMM call, and OpenBLAS packs all of
// its B for each call: a block of R rows spends ~0.3 ns per packed float (8 bytes moved at
// ~25 GB/s) against 2R FLOPs per B element (2.6 ns at R = 128 and 100 GFLOP/s), so blocks of at
// least 128 rows keep packing near a tenth of the work, and at most 8 blocks per GEMM (enough to
// balance 2-8 threads) keep it lower on tall products. Products of fewer than 256 rows split
// their columns instead, under the same rules (256 columns at least: each block packs all of
// A). Each task still holds at least kTaskFlops.
struct Blocks {
  int64_t rows, cols;
};
Blocks task_blocks(int64_t rows, int64_t cols, int64_t k) {
  const double flops =
      2.0 * static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(k);
  if (flops <= kTaskFlops) return {rows, cols};
  constexpr int64_t kMaxBlocks = 8;
  // The block length along a dim of `len` whose unit of length costs `per_unit` FLOPs.
  const auto block = [](int64_t len, double per_unit, int64_t least, int64_t align) {
    const auto for_flops = static_cast<int64_t>(std::min(kTaskFlops / per_unit + 1.0, 1e12));
    const int64_t b = std::max({least, (len + kMaxBlocks - 1) / kMaxBlocks, for_flops});
    return std::min(len, (b + align - 1) / align * align);
  };
  const double kd = static_cast<double>(k);
  if (rows >= 256) return {block(rows, 2.0 * static_cast<double>(cols) * kd, 128, 16), cols};
  if (cols >= 512) return {rows, block(cols, 2.0 * static_cast<double>(rows) * kd, 256, 64)};
  return {rows, cols};
}

}  // namespace

Shape matmul_shape(const Shape& a, const Shape& b, const std::string& where) {
  const MatmulLayout l = matmul_layout(a, b, where);
  return Shape(l.out.begin(), l.out.begin() + static_cast<std::ptrdiff_t>(l.out_rank));
}

void matmul_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where) {
  Tensor as, bs;
  const Tensor& ac = f32_contiguous(a, as, "a", where);
  const Tensor& bc = f32_contiguous(b, bs, "b", where);
  const MatmulLayout l = matmul_layout(ac.shape(), bc.shape(), where);
  check_output(y, std::span<const int64_t>(l.out.data(), l.out_rank), "y", where);
  if (y.numel() == 0) return;  // m, n or a batch dim is 0; k == 0 gives zeros below
  const float* ap = ac.data<float>();
  const float* bp = bc.data<float>();
  float* yp = y.data<float>();
  const KernelTable& kt = cpu_device().kernels();
  const int64_t m = l.m, n = l.n, k = l.k;
  const int64_t batches = y.numel() / (m * n);
  // Elements between consecutive matrices of a and b along each batch dim (0 where the operand
  // stretches), from the operands' own shapes right-aligned to the batch dims.
  DimArray a_step{}, b_step{};
  const auto steps = [&](const Shape& s, int64_t matrix, DimArray& step) {
    const size_t own = s.size() >= 2 ? s.size() - 2 : 0;  // the operand's batch dims
    int64_t stride = matrix;
    for (size_t i = l.batch_rank; i-- > l.batch_rank - own;) {
      const int64_t d = s[i - (l.batch_rank - own)];
      step[i] = d == 1 ? 0 : stride;
      stride *= d;
    }
  };
  steps(ac.shape(), m * k, a_step);
  steps(bc.shape(), k * n, b_step);

  // One B for every batch and a's matrices back to back ([B, m, k] x [k, n], the common
  // activations-times-weight case): one GEMM of [B*m, k] x [k, n], y being [B*m, n] row-major.
  bool fold = batches > 1;
  for (size_t i = 0; i < l.batch_rank && fold; ++i)
    fold = l.batch[i] == 1 || (b_step[i] == 0 && a_step[i] != 0);
  const int64_t gemms = fold ? 1 : batches;
  const int64_t rows = fold ? batches * m : m;
  const Blocks blk = task_blocks(rows, n, k);
  const int64_t row_blocks = (rows + blk.rows - 1) / blk.rows;
  const int64_t col_blocks = (n + blk.cols - 1) / blk.cols;
  const int64_t per_gemm = row_blocks * col_blocks;
  const double task_flops = 2.0 * static_cast<double>(blk.rows) * static_cast<double>(blk.cols) *
                            static_cast<double>(std::max<int64_t>(k, 1));
  const auto grain = static_cast<int64_t>(std::clamp(kTaskFlops / task_flops, 1.0, 1e9));
  parallel_for(0, gemms * per_gemm, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t g = t / per_gemm;
      const int64_t r0 = (t % per_gemm) / col_blocks * blk.rows;
      const int64_t c0 = (t % col_blocks) * blk.cols;
      int64_t oa = 0, ob = 0;
      for (size_t i = l.batch_rank, rem = static_cast<size_t>(g); i-- > 0;) {
        const auto d = static_cast<size_t>(l.batch[i]);
        const auto idx = static_cast<int64_t>(rem % d);
        rem /= d;
        oa += idx * a_step[i];
        ob += idx * b_step[i];
      }
      if (fold) oa = ob = 0;
      // OpenBLAS runs single-threaded inside our workers (cpu_device.cpp pins it).
      kt.gemm_f32(false, false, std::min(blk.rows, rows - r0), std::min(blk.cols, n - c0), k, 1.0f,
                  ap + oa + r0 * k, k, bp + ob + c0, n, 0.0f, yp + g * m * n + r0 * n + c0, n);
    }
  });
}

// ---------------------------------------------------------------- the op

namespace {

class MatmulOp : public Op {
 public:
  MatmulOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args(node.args, where, "matmul").finish();
  }
  const char* name() const override { return "matmul"; }
  std::vector<PortSpec> input_ports() const override { return {{"a"}, {"b"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& a = *in[0];
    const ValueType& b = *in[1];
    require_float("a", a, "matmul", where());
    require_float("b", b, "matmul", where());
    const std::string both = named("a", a) + " and " + named("b", b);
    const size_t ra = a.shape.size(), rb = b.shape.size();
    if (ra == 0 || rb == 0)
      fail(ErrorCode::Shape, where(), both + ": matmul needs inputs of at least 1 dim");
    if (std::max(ra, rb) > static_cast<size_t>(kMaxRank))
      fail(ErrorCode::Shape, where(), both + ": rank over the limit of " + str(kMaxRank));
    const Dim& ka = a.shape[ra - 1];
    const Dim& kb = rb >= 2 ? b.shape[rb - 2] : b.shape[0];
    if (differ(ka, kb))
      fail(ErrorCode::Shape, where(),
           both + " cannot be multiplied: inner dims " + ka.str() + " vs " + kb.str());
    const size_t ba = ra >= 2 ? ra - 2 : 0, bb = rb >= 2 ? rb - 2 : 0;
    const size_t batch_rank = std::max(ba, bb);
    SymShape out(batch_rank);
    for (size_t i = 0; i < batch_rank; ++i) {
      const Dim da = i < batch_rank - ba ? Dim::fixed(1) : a.shape[i - (batch_rank - ba)];
      const Dim db = i < batch_rank - bb ? Dim::fixed(1) : b.shape[i - (batch_rank - bb)];
      out[i] = dim_broadcast(
          da, db,
          both + " do not broadcast in their batch dims (dim " + str(static_cast<int64_t>(i)) + ")",
          where());
    }
    if (ra >= 2) out.push_back(a.shape[ra - 2]);
    if (rb >= 2) out.push_back(b.shape[rb - 1]);
    return {{{out, DType::F32}}, {}};
  }
  // 2 m n k per product, over every batch.
  OpCost cost(const InputTypes& in) const override {
    SymbolBindings none;
    const double k = static_cast<double>(in[0]->shape.back().value);
    return {2.0 * elements(infer(in, none).outputs[0].shape) * k, 0.0};
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          matmul_into(*in[0], *in[1], *out[0], w);
        });
  }
};

}  // namespace

std::unique_ptr<Op> make_matmul_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<MatmulOp>(node, where);
}

}  // namespace tessera
