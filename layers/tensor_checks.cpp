#include "layers/tensor_checks.h"

#include <algorithm>

namespace tessera {

const Tensor& f32_contiguous(const Tensor& x, Tensor& scratch, const char* name,
                             const std::string& where) {
  if (!x.defined()) fail(ErrorCode::Arg, where, std::string(name) + " is undefined");
  if (!dtype_is_floating(x.dtype()))
    fail(ErrorCode::DType, where,
         std::string(name) + " has dtype " + dtype_name(x.dtype()) + ", not a float type");
  if (x.dtype() == DType::F32 && x.is_contiguous()) return x;
  scratch = x.to(DType::F32).contiguous();
  return scratch;
}

void check_output(const Tensor& y, std::span<const int64_t> shape, const char* name,
                  const std::string& where) {
  const bool fits = y.defined() && y.dtype() == DType::F32 && y.is_contiguous() &&
                    std::equal(y.shape().begin(), y.shape().end(), shape.begin(), shape.end());
  if (!fits)
    fail(ErrorCode::Shape, where,
         std::string("output ") + name + " must be a contiguous float32 " +
             shape_to_string(Shape(shape.begin(), shape.end())) +
             (y.defined() ? std::string(", got ") + dtype_name(y.dtype()) + " " + y.shape_str()
                          : std::string(", got an undefined tensor")));
}

int64_t product(std::span<const int64_t> s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

int64_t seq_axis(const SymShape& shape, const std::string& seq) {
  for (size_t i = 0; i < shape.size(); ++i)
    if (!shape[i].is_fixed() && shape[i].text == seq) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace tessera
