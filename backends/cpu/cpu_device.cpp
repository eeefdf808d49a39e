// The CPU device: the kernel table of backends/cpu, over the host allocator (core/allocator.h).
#include "backends/cpu/cpu_device.h"

#include <cblas.h>
#include <hwy/targets.h>
#include <unistd.h>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/flash_attention.h"
#include "core/allocator.h"

// OpenBLAS's pthread build: stops its server threads (joins them; blas_server_avail drops to 0).
// Weak: the serial build lacks it, and Debian's alternatives may put that (or the OpenMP build)
// where the pthread build was linked.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace tessera {
namespace {

KernelTable make_cpu_kernels() {
  KernelTable t{};
  t.gemm_f32 = cpu::gemm_f32;
  t.gemm_batched_f32 = cpu::gemm_batched_f32;
  t.linear_by_weight[static_cast<size_t>(DType::F32)] = {
      cpu::kLinearPanelRows, cpu::linear_pack_f32,   cpu::linear_packed_f32,
      cpu::linear_packed_preferred_f32, cpu::kLinearMatvecRows, cpu::linear_matvec_f32,
      cpu::kLinearWeightPanel, cpu::linear_panel_tile_cols_f32, cpu::kLinearPanelRowBlock,
      cpu::linear_pack_weights_f32, cpu::linear_panels_f32, cpu::linear_panels_matvec_f32};
  t.softmax_rows_f32 = cpu::softmax_rows_f32;
  t.rope_rotate_half_f32 = cpu::rope_rotate_half_f32;
  t.add_bias_rows_f32 = cpu::add_bias_rows_f32;
  t.add_f32 = cpu::add_f32;
  t.gelu_f32 = cpu::gelu_f32;
  t.layer_norm_rows_f32 = cpu::layer_norm_rows_f32;
  t.add_layer_norm_rows_f32 = cpu::add_layer_norm_rows_f32;
  t.unary_maps_f32 = cpu::unary_maps_f32(&t.unary_map_count);
  t.binary_maps_f32 = cpu::binary_maps_f32(&t.binary_map_count);
  t.softmax_columns_f32 = cpu::softmax_columns_f32;
  t.flash_attention_f32 = cpu::flash_attention_f32_dispatch;
  t.flash_attention_scratch_floats = cpu::flash_attention_scratch_floats_cpu;
  t.decode_attention_block_f32 = cpu::decode_attention_block_f32;
  t.decode_attention_merge_f32 = cpu::decode_attention_merge_f32;
  return t;
}

class CpuDevice final : public Device {
 public:
  CpuDevice() : kernels_(make_cpu_kernels()) {
    // oneTBB owns every worker thread and the layers call GEMM from inside those workers. A
    // threaded OpenBLAS would start its own pool on top: 2 pools on 2 cores oversubscribe and
    // GEMM-heavy layers slow down 2-5x (core/parallel.h). Debian ships the pthread build, so pin
    // it to one thread here, before any kernel can run.
    openblas_set_num_threads(1);
    // The pthread build also starts its server threads (one per core but one) as the library
    // loads, and each spins on sched_yield for ~2^28 TSC ticks (~100 ms here) before it sleeps.
    // Sharing a core with a oneTBB worker, a spinning one halved that worker for the process's
    // first ~100 ms (perf sched): the gpt recipe's first run on two threads took 74 ms longer
    // than the next (median of 8 processes, each after 2 s idle, Zen 4), 25 ms with this call;
    // cold start 206 -> 158 ms. One thread never needs them, so they stop here; OpenBLAS starts
    // them again itself should a threaded call ever come.
    if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
  }

  const char* name() const override { return "cpu"; }
  Allocator& allocator() const override { return host_allocator(); }
  const KernelTable& kernels() const override { return kernels_; }

  // Asked every time rather than cached: tests narrow the targets with
  // hwy::SetSupportedTargetsForTest, and the kernels follow on their next call.
  const char* simd_target() const override { return hwy::TargetName(cpu::dispatched_target()); }

 private:
  KernelTable kernels_;
};

}  // namespace

Device& cpu_device() {
  static CpuDevice device;
  return device;
}

bool restrict_simd_target(const std::string& name, std::string& available) {
  const int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
  int64_t chosen = 0;
  available.clear();
  for (int64_t bit = 1; bit != 0 && bit <= HWY_TARGETS; bit <<= 1) {
    if (!(bit & usable)) continue;
    if (!available.empty()) available += ", ";
    available += hwy::TargetName(bit);
    if (name == hwy::TargetName(bit)) chosen = bit;
  }
  if (chosen == 0) return false;
  hwy::SetSupportedTargetsForTest(chosen);
  return true;
}

namespace cpu {

size_t l1d_cache_bytes() {
  static const size_t bytes = [] {
    const long l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return l1d >= (16 << 10) && l1d <= (1 << 20) ? static_cast<size_t>(l1d) : size_t{32} << 10;
  }();
  return bytes;
}

size_t l2_cache_bytes() {
  static const size_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 >= (128 << 10) && l2 <= (64 << 20) ? static_cast<size_t>(l2) : size_t{512} << 10;
  }();
  return bytes;
}

}  // namespace cpu
}  // namespace tessera
