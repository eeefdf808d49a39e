// The CPU device: 64-byte aligned host memory and the kernel table of backends/cpu.
#include <cblas.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/flash_attention.h"
#include "core/device.h"
#include "core/error.h"

namespace tessera {
namespace {

KernelTable make_cpu_kernels() {
  KernelTable t{};
  t.gemm_f32 = cpu::gemm_f32;
  t.gemm_batched_f32 = cpu::gemm_batched_f32;
  t.softmax_rows_f32 = cpu::softmax_rows_f32;
  t.rope_rotate_half_f32 = cpu::rope_rotate_half_f32;
  t.convert_f16_to_f32 = cpu::convert_f16_to_f32;
  t.convert_f32_to_f16 = cpu::convert_f32_to_f16;
  t.convert_bf16_to_f32 = cpu::convert_bf16_to_f32;
  t.convert_f32_to_bf16 = cpu::convert_f32_to_bf16;
  t.add_bias_rows_f32 = cpu::add_bias_rows_f32;
  t.add_f32 = cpu::add_f32;
  t.gelu_f32 = cpu::gelu_f32;
  t.layer_norm_rows_f32 = cpu::layer_norm_rows_f32;
  t.flash_attention_f32 = cpu::flash_attention_f32_dispatch;
  t.flash_attention_scratch_floats = cpu::flash_attention_scratch_floats_cpu;
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
  }

  const char* name() const override { return "cpu"; }

  void* allocate(size_t bytes) override {
    constexpr size_t kAlignment = 64;  // a cache line, and one AVX-512 vector
    // aligned_alloc wants a multiple of the alignment, and aligned_alloc(64, 0) may return
    // null, which the Device contract forbids: round up, to at least one line.
    if (bytes > SIZE_MAX - kAlignment) {
      throw Error(ErrorCode::Internal, "cpu",
                  "cannot allocate " + std::to_string(bytes) + " bytes: size overflows");
    }
    const size_t rounded =
        bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      throw Error(ErrorCode::Internal, "cpu",
                  "out of memory allocating " + std::to_string(bytes) + " bytes");
    }
    return p;
  }

  void deallocate(void* p) noexcept override { std::free(p); }

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

}  // namespace tessera
