#include "core/dtype.h"

#include <cmath>
#include <cstring>

namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::U8:
    case DType::I8:
    case DType::Bool: return 1;
  }
  return 1;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F64: return "float64";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    case DType::Bool: return "bool";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  static constexpr DType all[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64,
                                  DType::I32, DType::U8,  DType::I8,   DType::Bool};
  for (DType t : all)
    if (name == dtype_name(t) || name == dtype_safetensors_name(t)) return t;
  return std::nullopt;
}

bool dtype_is_floating(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24, exact in float32
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN (keep NaN quiet and non-zero)
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (absx < 0x38800000u) {                        // below 2^-14: subnormal half or zero
    // value in units of 2^-24, rounded to nearest even by the FPU
    float a;
    std::memcpy(&a, &absx, 4);
    const float scaled = a * 16777216.0f;  // 2^24, exact
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return sign | static_cast<uint16_t>(m);
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits to nearest even
  uint32_t r = absx - 0x38000000u;  // exponent bias 127 -> 15
  const uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return sign | static_cast<uint16_t>(r >> 13);
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace tessera
