// Element types, named as PyTorch names them ("float32") and as safetensors stores them ("F32").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, U8, I8, Bool };
// Number of dtypes, for tables indexed by static_cast<size_t>(dtype) (Bool is the last).
inline constexpr size_t kDTypeCount = static_cast<size_t>(DType::Bool) + 1;

size_t dtype_size(DType t);
// "float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "int8", "bool"
const char* dtype_name(DType t);
// "F32", "F16", "BF16", "F64", "I64", "I32", "U8", "I8", "BOOL"
const char* dtype_safetensors_name(DType t);
// Accepts either spelling; nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);
bool dtype_is_floating(DType t);

// Scalar conversions, the reference for the vectorised ones below. Round to nearest even, NaN
// kept.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float bfloat16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bfloat16(float f);

// The same conversions over n contiguous values, bit-exact with the scalar ones on every SIMD
// target (core/convert.cc, dispatched at run time).
void convert_f16_to_f32(int64_t n, const uint16_t* in, float* out);
void convert_f32_to_f16(int64_t n, const float* in, uint16_t* out);
void convert_bf16_to_f32(int64_t n, const uint16_t* in, float* out);
void convert_f32_to_bf16(int64_t n, const float* in, uint16_t* out);

}  // namespace tessera
