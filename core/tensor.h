// Tensor: a dtype, a shape, strides (in elements), an offset and shared host storage.
// Views (reshape/view/transpose/permute/narrow/select/unsqueeze/squeeze/expand) share storage;
// contiguous()/clone()/to() copy. Storage is either an owned 64-byte aligned allocation from
// the Allocator the factory was given (host_allocator() unless told otherwise), or borrowed
// memory (an mmap'd checkpoint) kept alive by a shared owner handle.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace tessera {

class Generator;

// "[2, 3, 4]"
std::string shape_to_string(const Shape& shape);
// Product of dims; E_SHAPE on a negative dim or int64 overflow.
int64_t shape_numel(const Shape& shape);

class Storage {
 public:
  // Owned: from `allocator` (which must outlive the storage), 64-byte aligned; uninitialised,
  // or zero-filled with `zeroed`.
  Storage(Allocator& allocator, size_t bytes, bool zeroed = false);
  // Borrowed. `read_only`: nobody may write the bytes (a read-only mapping of a checkpoint), so
  // holders may share them instead of copying. `file_mapped`: the bytes are a private read-only
  // mapping of a file, so their resident pages may be dropped (release_file_pages) and come
  // back from the page cache when touched.
  Storage(void* data, size_t bytes, std::shared_ptr<const void> owner, bool read_only = false,
          bool file_mapped = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // The allocator the bytes came from; null for borrowed memory.
  Allocator* allocator() const { return allocator_; }
  bool owned() const { return owner_ == nullptr; }
  bool read_only() const { return read_only_; }
  bool file_mapped() const { return file_mapped_; }

 private:
  void* data_;
  size_t bytes_;
  Allocator* allocator_;
  std::shared_ptr<const void> owner_;
  bool read_only_ = false;
  bool file_mapped_ = false;
};

class Tensor {
 public:
  Tensor() = default;  // undefined (defined() == false)

  // ---- factories (the owning ones allocate from `allocator`)
  static Tensor empty(const Shape& shape, DType dtype = DType::F32,
                      Allocator& allocator = host_allocator());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32,
                      Allocator& allocator = host_allocator());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Allocator& allocator = host_allocator());
  // Copies bytes (product(shape) * dtype_size) from `data`.
  static Tensor from_data(const void* data, const Shape& shape, DType dtype,
                          Allocator& allocator = host_allocator());
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape,
                            Allocator& allocator = host_allocator());
  // No copy: views `data` (aligned for dtype) and keeps `owner` alive as long as any view lives.
  // `read_only` marks data nobody may write (see read_only()), `file_mapped` a read-only file
  // mapping (see Storage).
  static Tensor wrap(void* data, const Shape& shape, DType dtype,
                     std::shared_ptr<const void> owner, bool read_only = false,
                     bool file_mapped = false);
  static Tensor randn(const Shape& shape, Generator& gen, double mean = 0.0, double std = 1.0,
                      DType dtype = DType::F32, Allocator& allocator = host_allocator());
  static Tensor rand(const Shape& shape, Generator& gen, double low = 0.0, double high = 1.0,
                     DType dtype = DType::F32, Allocator& allocator = host_allocator());

  // ---- metadata
  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const { return shape_[wrap_dim(d)]; }
  int64_t stride(int64_t d) const { return strides_[wrap_dim(d)]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // True for a view of read-only memory (a checkpoint's mapping): writing it faults, and it
  // never changes, so it can be shared where a copy would otherwise be taken.
  bool read_only() const { return storage_ && storage_->read_only(); }
  bool file_mapped() const { return storage_ && storage_->file_mapped(); }
  std::string shape_str() const { return shape_to_string(shape_); }

  // Pointer to the first element (storage base + offset).
  void* raw_data() const;
  template <class T>
  T* data() const;  // checks that T matches dtype (E_DTYPE otherwise)

  // ---- views (no copy)
  Tensor view(Shape shape) const;     // E_SHAPE when the strides do not allow it; one -1 allowed
  Tensor reshape(Shape shape) const;  // view when possible, otherwise a contiguous copy
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  Tensor slice(int64_t d, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t d, int64_t index) const;
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;  // no-op when size(d) != 1, like PyTorch
  Tensor squeeze() const;           // all size-1 dims
  Tensor expand(const Shape& shape) const;  // broadcast size-1 dims with stride 0; -1 keeps
  // The first product(shape) * dtype_size(dtype) bytes of this contiguous tensor's memory as a
  // contiguous `shape` of `dtype` (a plan's float32 buffer holding int64 ids). E_SHAPE when they
  // do not fit, E_DTYPE when the start is not aligned for `dtype`.
  Tensor reinterpret(DType dtype, const Shape& shape) const;

  // ---- copies (new memory from host_allocator())
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;  // *this when already that dtype
  // Copies src (same shape, any dtype/strides) into this tensor's elements.
  void copy_from(const Tensor& src);

  // ---- element access (for tests and small glue; not for hot loops)
  double item(const std::vector<int64_t>& index) const;  // any dtype, as double
  void set_item(const std::vector<int64_t>& index, double value);
  template <class T>
  T at(const std::vector<int64_t>& index) const {
    return data<T>()[element_offset(index)];
  }
  // Copy of all elements in logical (row-major) order, converted to double.
  std::vector<double> to_double_vector() const;
  std::vector<float> to_float_vector() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides,
         int64_t offset);
  int64_t wrap_dim(int64_t d) const;
  int64_t wrap_dim_inclusive(int64_t d) const;  // for unsqueeze: [-dim-1, dim]
  int64_t element_offset(const std::vector<int64_t>& index) const;  // relative to raw_data()

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::F32;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
};

// Row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);

template <class T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::I8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };

template <class T>
T* Tensor::data() const {
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (dtype_ != DType::F16 && dtype_ != DType::BF16)
      fail(ErrorCode::DType, "Tensor::data",
           std::string("uint16 access to a ") + dtype_name(dtype_) + " tensor");
  } else {
    if (dtype_ != DTypeOf<std::remove_const_t<T>>::value)
      fail(ErrorCode::DType, "Tensor::data",
           std::string("expected ") + dtype_name(DTypeOf<std::remove_const_t<T>>::value) +
               ", tensor is " + dtype_name(dtype_));
  }
  return static_cast<T*>(raw_data());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& v, const Shape& shape, Allocator& allocator) {
  if (static_cast<int64_t>(v.size()) != shape_numel(shape))
    fail(ErrorCode::Shape, "Tensor::from_vector",
         std::to_string(v.size()) + " values do not fill shape " + shape_to_string(shape));
  if constexpr (std::is_same_v<T, bool>) {
    Tensor t = empty(shape, DType::Bool, allocator);
    auto* p = static_cast<uint8_t*>(t.raw_data());
    for (size_t i = 0; i < v.size(); ++i) p[i] = v[i] ? 1 : 0;
    return t;
  } else {
    return from_data(v.data(), shape, DTypeOf<T>::value, allocator);
  }
}

}  // namespace tessera
