// Safetensors checkpoints (shared/docs/interfaces.md §4): a validating, memory-mapped reader and
// an atomic writer whose layout is byte-identical to huggingface/safetensors' writer.
//
// Reader. We accept exactly the files the reference reader (safetensors/src/tensor.rs, serde +
// serde_json) accepts, with one stricter rule: a tensor name that appears twice is an error (the
// reference keeps the last one). What the reference accepts, and we therefore accept too:
//  - JSON whitespace (space, tab, CR, LF) before and after the header object;
//  - extra keys in a tensor entry besides dtype/shape/data_offsets (ignored, any JSON value);
//  - a tensor entry written as a 3-element array [dtype, shape, data_offsets], and a dtype
//    written as a one-key object {"F32": null} (serde reads structs from sequences and unit
//    variants from one-key maps);
//  - duplicate keys inside __metadata__ (the last value wins, as in the reference's HashMap);
//  - every reference dtype (22 of them, F4 to U64), including sub-byte ones whose element count
//    fills whole bytes; tensors in any header order (they are sorted by offsets);
//  - empty tensors sharing an offset with each other or with the next tensor.
// And what it refuses, beyond the obvious: a UTF-8 byte order mark or NUL padding around the
// JSON, floats or negative numbers (even -0) as dims or offsets, JSON nested deeper than 127
// levels (serde_json's recursion limit), numbers beyond the f64 range anywhere.
// There is no rank limit on reading, as in the reference: the 100,000,000-byte header cap already
// bounds the work (every dimension costs at least two header bytes and eight bytes of memory).
// Computing with a tensor of rank over kMaxRank (64, core/limits.h) is refused by tensor().
// Every failure is an Error with ErrorCode::Format (where = the path) naming the tensor and the
// values involved; a missing or unreadable file, or a directory, is ErrorCode::IO.
//
// Concurrency: a SafetensorsFile is immutable after open() and safe to share between threads.
// The file must not be truncated while mapped (reading a page past the new end raises SIGBUS);
// replacing it by rename, as save_safetensors does, is safe.
//
// Writer. Tensors are laid out by the reference dtype order descending (U64 I64 F64 ... F32 I32
// BF16 F16 ... I8 U8 BOOL, i.e. by alignment) then by name, the header is compact JSON padded
// with spaces to a multiple of 8 bytes, so every tensor lands aligned to its element size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace tessera {

// Largest header the reference reads (and writes): 100,000,000 bytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One entry of the header, validated.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;       // as written in the file: "F32", "BF16", "F8_E4M3", "F4", ...
  std::optional<DType> dtype;   // set for the dtypes tessera computes with
  uint32_t dtype_bits = 0;      // element width in bits: 4 (F4), 6 (F6_*), 8, 16, 32 or 64
  std::vector<uint64_t> shape;  // as stored; [] is a scalar
  uint64_t data_begin = 0;      // [begin, end) relative to the data section, as in the header
  uint64_t data_end = 0;
  uint64_t file_offset = 0;  // absolute file offset of the first byte (8 + N + data_begin)

  uint64_t nbytes() const { return data_end - data_begin; }
  uint64_t numel() const;         // cannot overflow: validated
  std::string shape_str() const;  // "[2, 3]"
  // True when tensor() can return it: a tessera dtype, rank <= kMaxRank, and a shape whose
  // contiguous strides fit int64 (the product of the non-zero dims is at most 2^63 - 1).
  bool computable() const;
};

// What identifies a file's contents without reading them: a file replaced, rewritten or touched
// since gets another (inode, size or modification time in ns). All zero for in-memory files.
struct FileIdentity {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
  bool known() const { return inode != 0 || device != 0; }
};

class SafetensorsFile {
 public:
  // Maps the file read-only (PROT_READ, MAP_PRIVATE) and validates the whole header.
  // E_IO: missing, unreadable, a directory or not a regular file. E_FORMAT: malformed.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory file; `name` stands in for the path in errors.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, std::string name);

  // Tensor names in data (offset) order; ties between empty tensors keep header order.
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }
  bool contains(const std::string& name) const;
  // E_ARG when there is no such tensor.
  const SafetensorsTensorInfo& info(const std::string& name) const;

  // The tensor, converted to nothing: same dtype and shape as stored. Zero-copy when the data is
  // aligned for its dtype (always so for files from the reference writer): the Tensor views the
  // mapping, keeps it alive and is read_only(). The mapping is read-only: such a tensor must
  // never be written (doing so faults); clone() or to() it first. Unaligned data is copied.
  // E_ARG: unknown name. E_DTYPE: a dtype tessera does not compute with (listed by info()).
  // E_SHAPE: rank over kMaxRank, or a zero-size tensor whose dims cannot be represented with
  // int64 strides.
  Tensor tensor(const std::string& name) const;
  // Every tensor for which info(name).computable() holds, by name.
  std::map<std::string, Tensor> tensors() const;

  // __metadata__; empty when absent or null.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // The file as it was when opened (fstat of the descriptor that was mapped).
  const FileIdentity& identity() const { return identity_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_size() const { return header_size_; }  // N, padding included
  uint64_t data_offset() const { return 8 + header_size_; }

 private:
  struct Bytes;  // the mapping or the in-memory buffer
  SafetensorsFile() = default;
  void parse();

  std::string path_;
  FileIdentity identity_;
  std::shared_ptr<const Bytes> bytes_;
  uint64_t file_size_ = 0;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsTensorInfo> infos_;  // in data order
  std::vector<std::string> names_;            // in data order
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The file as bytes. Non-contiguous tensors are written in logical (row-major) order. An empty
// `metadata` writes no __metadata__ key. E_ARG: an undefined tensor, a duplicate name, the name
// "__metadata__", a name or metadata string that is not valid UTF-8, a header over 100,000,000
// bytes.
std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata = {
                                               {"format", "pt"}});
std::vector<uint8_t> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {
                                               {"format", "pt"}});

// Writes serialize_safetensors()'s bytes to `path` atomically: into a new temporary file in the
// same directory (path + ".tmp.<pid>.<n>"), fsync, rename over `path`, fsync the directory. On
// any failure the temporary file is removed and `path` is left as it was. E_ARG as above; E_IO
// when the file cannot be created, written, synced or renamed.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Every dtype string the reference defines, with its element width in bits; nullopt otherwise.
std::optional<uint32_t> safetensors_dtype_bits(const std::string& dtype_name);

}  // namespace tessera
