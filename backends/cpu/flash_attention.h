// The fused attention kernel of the CPU backend (flash_attention_f32.cc), as the two plain
// functions KernelTable::flash_attention_f32 / flash_attention_scratch_floats point at. The
// kernel re-dispatches on every call (HWY_DYNAMIC_DISPATCH), so a test that narrows the targets
// with hwy::SetSupportedTargetsForTest reaches each compiled SIMD target through it.
// Contract: core/kernels.h and core/attention_tile.h (FlashAttentionTile).
#pragma once

#include <cstdint>

#include "core/attention_tile.h"

namespace tessera::cpu {

// One query tile against all tile.kv_len keys, online softmax. No allocation, no exceptions, no
// threads; tile.scratch holds flash_attention_scratch_floats_cpu(rows, head_dim, v_head_dim)
// floats, 64-byte aligned, and must not be shared with a concurrent call.
void flash_attention_f32_dispatch(const FlashAttentionTile& tile);

// Scratch floats for flash_attention_f32_dispatch; the same for every SIMD target. Grows with
// `rows` up to the kernel's 256-row panel, never with kv_len: at head_dim = v_head_dim = 64,
// 36 KiB for rows <= 32 and 150 KiB for rows >= 256. Tiles of 256 rows (or all of L when
// shorter) are what the kernel was tuned for: K and V stream once per 256 rows.
int64_t flash_attention_scratch_floats_cpu(int64_t rows, int64_t head_dim, int64_t v_head_dim);

// The exps as the kernels compute them, so that tests can bound their errors on their own:
// exp_fast_f32, decode attention's and gelu's (ExpFastF32), y = e^x (x <= 88; 0 below -87.34);
// exp2_f32, the one under the flash kernel's online softmax (Exp2F32), y = 2^x (x <= 127; 0
// below -126). Both: -inf -> 0, NaN -> NaN. Not table kernels.
void exp_fast_f32(int64_t n, const float* x, float* y);
void exp2_f32(int64_t n, const float* x, float* y);

}  // namespace tessera::cpu
