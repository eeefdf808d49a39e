#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/limits.h"
#include "core/random.h"

namespace tessera {

namespace {

[[noreturn]] void shape_error(const std::string& where, const std::string& what) {
  fail(ErrorCode::Shape, where, what);
}

bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

// Reads element i of a typed buffer as double.
double load_as_double(const void* p, DType t) {
  switch (t) {
    case DType::F32: return *static_cast<const float*>(p);
    case DType::F64: return *static_cast<const double*>(p);
    case DType::F16: return half_to_float(*static_cast<const uint16_t*>(p));
    case DType::BF16: return bfloat16_to_float(*static_cast<const uint16_t*>(p));
    case DType::I64: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::I32: return *static_cast<const int32_t*>(p);
    case DType::U8: return *static_cast<const uint8_t*>(p);
    case DType::I8: return *static_cast<const int8_t*>(p);
    case DType::Bool: return *static_cast<const uint8_t*>(p) != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

void store_from_double(void* p, DType t, double v) {
  switch (t) {
    case DType::F32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::F64: *static_cast<double*>(p) = v; break;
    case DType::F16: *static_cast<uint16_t*>(p) = float_to_half(static_cast<float>(v)); break;
    case DType::BF16:
      *static_cast<uint16_t*>(p) = float_to_bfloat16(static_cast<float>(v));
      break;
    case DType::I64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DType::I32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DType::U8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    case DType::I8: *static_cast<int8_t*>(p) = static_cast<int8_t>(v); break;
    case DType::Bool: *static_cast<uint8_t*>(p) = v != 0.0 ? 1 : 0; break;
  }
}

// Calls fn(src_offset, dst_index) for every element of a strided tensor in row-major order.
template <class Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn&& fn) {
  const size_t nd = shape.size();
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(off, i);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) shape_error("shape", "negative dimension in " + shape_to_string(shape));
    if (mul_overflows(n, d, &n))
      shape_error("shape", "element count of " + shape_to_string(shape) + " overflows");
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  // Saturates instead of overflowing: a stride past INT64_MAX only arises for a shape with a zero
  // dimension (e.g. {0, 2^40, 2^40}; a nonzero count that large is refused by shape_numel), whose
  // strides never address memory. Callers may compute strides before validating the count.
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    if (mul_overflows(s, std::max<int64_t>(shape[i], 1), &s)) s = INT64_MAX;
  }
  return strides;
}

// ---------------------------------------------------------------- Storage

Storage::Storage(Allocator& allocator, size_t bytes, bool zeroed)
    : data_(zeroed ? allocator.allocate_zeroed(bytes) : allocator.allocate(bytes)),
      bytes_(bytes),
      allocator_(&allocator) {}

Storage::Storage(void* data, size_t bytes, std::shared_ptr<const void> owner, bool read_only,
                 bool file_mapped)
    : data_(data),
      bytes_(bytes),
      allocator_(nullptr),
      owner_(std::move(owner)),
      read_only_(read_only),
      file_mapped_(read_only && file_mapped) {
  if (!owner_) owner_ = std::make_shared<int>(0);  // borrowed even without an owner handle
}

Storage::~Storage() {
  if (owner_ == nullptr) allocator_->deallocate(data_);
}

// ---------------------------------------------------------------- Tensor

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides,
               int64_t offset)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset) {
  // Every tensor passes here (factories and views alike): one place bounds the rank.
  if (dim() > kMaxRank)
    shape_error("Tensor", "rank " + std::to_string(dim()) + " exceeds the limit of " +
                              std::to_string(kMaxRank) + " dimensions");
}

namespace {

// Storage for a contiguous `shape` of `dtype` from `allocator`; `where` names the factory.
std::shared_ptr<Storage> new_storage(const Shape& shape, DType dtype, Allocator& allocator,
                                     bool zeroed, const char* where) {
  const int64_t n = shape_numel(shape);
  int64_t bytes;
  if (mul_overflows(n, static_cast<int64_t>(dtype_size(dtype)), &bytes))
    shape_error(where, "byte size of " + shape_to_string(shape) + " overflows");
  return std::make_shared<Storage>(allocator, static_cast<size_t>(bytes), zeroed);
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& allocator) {
  return Tensor(new_storage(shape, dtype, allocator, false, "Tensor::empty"), dtype, shape,
                contiguous_strides(shape), 0);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Allocator& allocator) {
  // Zeroed by the allocator: the host one's large fresh blocks come zeroed from the OS and stay
  // untouched (no RSS, no first-touch cost) until written; a parameter that a checkpoint
  // replaces never is.
  return Tensor(new_storage(shape, dtype, allocator, true, "Tensor::zeros"), dtype, shape,
                contiguous_strides(shape), 0);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Allocator& allocator) {
  Tensor t = empty(shape, dtype, allocator);
  const size_t es = dtype_size(dtype);
  if (t.numel() == 0) return t;
  auto* p = static_cast<uint8_t*>(t.raw_data());
  store_from_double(p, dtype, value);
  const int64_t n = t.numel();  // numel() walks the shape: once, not per element
  for (int64_t i = 1; i < n; ++i) std::memcpy(p + i * es, p, es);
  return t;
}

Tensor Tensor::from_data(const void* data, const Shape& shape, DType dtype,
                         Allocator& allocator) {
  Tensor t = empty(shape, dtype, allocator);
  if (t.nbytes() > 0) std::memcpy(t.raw_data(), data, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype,
                    std::shared_ptr<const void> owner, bool read_only, bool file_mapped) {
  const int64_t n = shape_numel(shape);
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0)
    fail(ErrorCode::Internal, "Tensor::wrap",
         "data not aligned for " + std::string(dtype_name(dtype)));
  auto storage = std::make_shared<Storage>(data, static_cast<size_t>(n) * dtype_size(dtype),
                                           std::move(owner), read_only, file_mapped);
  return Tensor(std::move(storage), dtype, shape, contiguous_strides(shape), 0);
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, double mean, double std, DType dtype,
                     Allocator& allocator) {
  Tensor t = empty(shape, dtype, allocator);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  const size_t es = dtype_size(dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) store_from_double(p + i * es, dtype, mean + std * gen.normal());
  return t;
}

Tensor Tensor::rand(const Shape& shape, Generator& gen, double low, double high, DType dtype,
                    Allocator& allocator) {
  Tensor t = empty(shape, dtype, allocator);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  const size_t es = dtype_size(dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    store_from_double(p + i * es, dtype, low + (high - low) * gen.uniform());
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as PyTorch: no element is out of place
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) fail(ErrorCode::Internal, "Tensor", "access to an undefined tensor");
  return static_cast<uint8_t*>(storage_->data()) +
         offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

int64_t Tensor::wrap_dim(int64_t d) const {
  const int64_t n = dim();
  if (d < -n || d >= n)
    shape_error("Tensor", "dimension " + std::to_string(d) + " out of range for a " +
                              std::to_string(n) + "-d tensor");
  return d < 0 ? d + n : d;
}

int64_t Tensor::wrap_dim_inclusive(int64_t d) const {
  const int64_t n = dim() + 1;
  if (d < -n || d >= n)
    shape_error("Tensor::unsqueeze", "dimension " + std::to_string(d) + " out of range for a " +
                                         std::to_string(dim()) + "-d tensor");
  return d < 0 ? d + n : d;
}

int64_t Tensor::element_offset(const std::vector<int64_t>& index) const {
  if (static_cast<int64_t>(index.size()) != dim())
    shape_error("Tensor", std::to_string(index.size()) + " indices for a " + std::to_string(dim()) +
                              "-d tensor");
  int64_t off = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= shape_[i])
      shape_error("Tensor", "index " + std::to_string(index[i]) + " out of range for dimension " +
                                std::to_string(i) + " of size " + std::to_string(shape_[i]));
    off += index[i] * strides_[i];
  }
  return off;
}

// ---------------------------------------------------------------- views

// Infers one -1 and checks the element count.
static Shape resolve_shape(Shape shape, int64_t numel, const Shape& from) {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0)
        shape_error("Tensor::view", "only one dimension can be -1 in " + shape_to_string(shape));
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      shape_error("Tensor::view", "invalid dimension in " + shape_to_string(shape));
    } else if (mul_overflows(known, shape[i], &known)) {
      shape_error("Tensor::view", "element count of " + shape_to_string(shape) + " overflows");
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      shape_error("Tensor::view",
                  "cannot view " + shape_to_string(from) + " as " + shape_to_string(shape));
    shape[infer] = numel / known;
  } else if (known != numel) {
    shape_error("Tensor::view", "cannot view " + shape_to_string(from) + " (" +
                                    std::to_string(numel) + " elements) as " +
                                    shape_to_string(shape));
  }
  return shape;
}

// Strides for viewing (old_shape, old_strides) as new_shape without a copy, if possible
// (the same rule as PyTorch's computeStride: each new dim must lie inside one chunk of old dims
// that are mutually contiguous).
static bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape,
                         Shape* out) {
  Shape strides(new_shape.size());
  int64_t numel = 1;
  for (int64_t d : old_shape) numel *= d;
  if (numel == 0) {
    *out = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 &&
         old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return false;
  *out = strides;
  return true;
}

Tensor Tensor::view(Shape shape) const {
  shape = resolve_shape(std::move(shape), numel(), shape_);
  Shape strides;
  if (!view_strides(shape_, strides_, shape, &strides))
    shape_error("Tensor::view", "cannot view a non-contiguous " + shape_to_string(shape_) +
                                    " tensor as " + shape_to_string(shape) +
                                    " (use reshape or contiguous)");
  return Tensor(storage_, dtype_, shape, strides, offset_);
}

Tensor Tensor::reshape(Shape shape) const {
  shape = resolve_shape(std::move(shape), numel(), shape_);
  Shape strides;
  if (view_strides(shape_, strides_, shape, &strides))
    return Tensor(storage_, dtype_, shape, strides, offset_);
  return contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  a = wrap_dim(a);
  b = wrap_dim(b);
  Shape shape = shape_, strides = strides_;
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return Tensor(storage_, dtype_, shape, strides, offset_);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  if (static_cast<int64_t>(dims.size()) != dim())
    shape_error("Tensor::permute",
                std::to_string(dims.size()) + " dims for a " + std::to_string(dim()) + "-d tensor");
  std::vector<bool> seen(dims.size(), false);
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i]);
    if (seen[d]) shape_error("Tensor::permute", "repeated dimension " + std::to_string(d));
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Tensor(storage_, dtype_, shape, strides, offset_);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d);
  if (start < 0) start += shape_[d];
  if (start < 0 || length < 0 || start > shape_[d] || length > shape_[d] - start)
    shape_error("Tensor::narrow", "range [" + std::to_string(start) + ", " + std::to_string(start) +
                                      "+" + std::to_string(length) + ") out of dimension " +
                                      std::to_string(d) + " of size " + std::to_string(shape_[d]));
  Shape shape = shape_;
  shape[d] = length;
  return Tensor(storage_, dtype_, shape, strides_, offset_ + start * strides_[d]);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d);
  if (step <= 0) shape_error("Tensor::slice", "step must be positive, got " + std::to_string(step));
  const int64_t n = shape_[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = shape_, strides = strides_;
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return Tensor(storage_, dtype_, shape, strides, offset_ + start * strides_[d]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d);
  if (index < 0) index += shape_[d];
  if (index < 0 || index >= shape_[d])
    shape_error("Tensor::select", "index " + std::to_string(index) + " out of dimension " +
                                      std::to_string(d) + " of size " + std::to_string(shape_[d]));
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, dtype_, shape, strides, offset_ + index * strides_[d]);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim_inclusive(d);
  Shape shape = shape_, strides = strides_;
  const int64_t s = d < dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, s);
  return Tensor(storage_, dtype_, shape, strides, offset_);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d);
  if (shape_[d] != 1) return *this;
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, dtype_, shape, strides, offset_);
}

Tensor Tensor::squeeze() const {
  Shape shape, strides;
  for (size_t i = 0; i < shape_.size(); ++i)
    if (shape_[i] != 1) {
      shape.push_back(shape_[i]);
      strides.push_back(strides_[i]);
    }
  return Tensor(storage_, dtype_, shape, strides, offset_);
}

Tensor Tensor::expand(const Shape& shape) const {
  if (shape.size() < shape_.size())
    shape_error("Tensor::expand", "cannot expand " + shape_to_string(shape_) + " to fewer dims " +
                                      shape_to_string(shape));
  const size_t lead = shape.size() - shape_.size();
  Shape out_shape(shape.size()), out_strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i] < 0) shape_error("Tensor::expand", "-1 is not allowed for a new leading dim");
      out_shape[i] = shape[i];
      out_strides[i] = 0;
      continue;
    }
    const int64_t have = shape_[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    if (have == want) {
      out_shape[i] = have;
      out_strides[i] = strides_[i - lead];
    } else if (have == 1 && want >= 0) {
      out_shape[i] = want;
      out_strides[i] = 0;
    } else {
      shape_error("Tensor::expand",
                  "cannot expand " + shape_to_string(shape_) + " to " + shape_to_string(shape));
    }
  }
  shape_numel(out_shape);
  return Tensor(storage_, dtype_, out_shape, out_strides, offset_);
}

// ---------------------------------------------------------------- copies

Tensor Tensor::reinterpret(DType dtype, const Shape& shape) const {
  if (!is_contiguous()) shape_error("Tensor::reinterpret", "the tensor is not contiguous");
  int64_t bytes;
  if (mul_overflows(shape_numel(shape), static_cast<int64_t>(dtype_size(dtype)), &bytes) ||
      static_cast<size_t>(bytes) > nbytes())
    shape_error("Tensor::reinterpret", shape_to_string(shape) + " of " + dtype_name(dtype) +
                                           " does not fit in " + std::to_string(nbytes()) +
                                           " bytes");
  const int64_t byte_offset = offset_ * static_cast<int64_t>(dtype_size(dtype_));
  if (byte_offset % static_cast<int64_t>(dtype_size(dtype)) != 0)
    fail(ErrorCode::DType, "Tensor::reinterpret",
         "the start is not aligned for " + std::string(dtype_name(dtype)));
  return Tensor(storage_, dtype, shape, contiguous_strides(shape),
                byte_offset / static_cast<int64_t>(dtype_size(dtype)));
}

void Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_)
    shape_error("Tensor::copy_from", "source " + shape_to_string(src.shape_) + " does not match " +
                                         shape_to_string(shape_));
  if (numel() == 0) return;
  const size_t es = dtype_size(dtype_);
  auto* dst = static_cast<uint8_t*>(raw_data());
  const auto* s = static_cast<const uint8_t*>(src.raw_data());
  if (is_contiguous() && src.is_contiguous()) {
    const int64_t n = numel();
    if (src.dtype_ == dtype_) {
      std::memcpy(dst, s, nbytes());
      return;
    }
    if (src.dtype_ == DType::F16 && dtype_ == DType::F32)
      return convert_f16_to_f32(n, reinterpret_cast<const uint16_t*>(s),
                                reinterpret_cast<float*>(dst));
    if (src.dtype_ == DType::BF16 && dtype_ == DType::F32)
      return convert_bf16_to_f32(n, reinterpret_cast<const uint16_t*>(s),
                                 reinterpret_cast<float*>(dst));
    if (src.dtype_ == DType::F32 && dtype_ == DType::F16)
      return convert_f32_to_f16(n, reinterpret_cast<const float*>(s),
                                reinterpret_cast<uint16_t*>(dst));
    if (src.dtype_ == DType::F32 && dtype_ == DType::BF16)
      return convert_f32_to_bf16(n, reinterpret_cast<const float*>(s),
                                 reinterpret_cast<uint16_t*>(dst));
    if (src.dtype_ == DType::F64 && dtype_ == DType::F32) {
      const auto* in = reinterpret_cast<const double*>(s);
      auto* out = reinterpret_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
      return;
    }
    if (src.dtype_ == DType::F32 && dtype_ == DType::F64) {
      const auto* in = reinterpret_cast<const float*>(s);
      auto* out = reinterpret_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = in[i];
      return;
    }
  }
  // General path: gather src in logical order into a contiguous staging order matching dst.
  const Shape dst_strides = strides_;
  std::vector<int64_t> dst_offsets;
  dst_offsets.reserve(static_cast<size_t>(numel()));
  for_each_offset(shape_, dst_strides, [&](int64_t off, int64_t) { dst_offsets.push_back(off); });
  const size_t ses = dtype_size(src.dtype_);
  for_each_offset(src.shape_, src.strides_, [&](int64_t off, int64_t i) {
    const void* from = s + off * static_cast<int64_t>(ses);
    void* to = dst + dst_offsets[i] * static_cast<int64_t>(es);
    if (src.dtype_ == dtype_)
      std::memcpy(to, from, es);
    else
      store_from_double(to, dtype_, load_as_double(from, src.dtype_));
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

double Tensor::item(const std::vector<int64_t>& index) const {
  const auto* p = static_cast<const uint8_t*>(raw_data());
  return load_as_double(p + element_offset(index) * static_cast<int64_t>(dtype_size(dtype_)),
                        dtype_);
}

void Tensor::set_item(const std::vector<int64_t>& index, double value) {
  auto* p = static_cast<uint8_t*>(raw_data());
  store_from_double(p + element_offset(index) * static_cast<int64_t>(dtype_size(dtype_)), dtype_,
                    value);
}

std::vector<double> Tensor::to_double_vector() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  if (out.empty()) return out;
  const auto* p = static_cast<const uint8_t*>(raw_data());
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
  for_each_offset(shape_, strides_,
                  [&](int64_t off, int64_t i) { out[i] = load_as_double(p + off * es, dtype_); });
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  const Tensor t = to(DType::F32).contiguous();
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), t.raw_data(), out.size() * sizeof(float));
  return out;
}

}  // namespace tessera
