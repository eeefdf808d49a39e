#include "io/safetensors.h"

#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_set>

#include "core/error.h"
#include "core/limits.h"

namespace tessera {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is mapped without byte swapping");
static_assert(sizeof(size_t) == 8, "file offsets are 64-bit");

namespace {

// ------------------------------------------------------------------------------------ dtypes

struct StDtype {
  const char* name;
  uint32_t bits;
  std::optional<DType> dtype;  // set when tessera computes with it
};

// In the reference's enum order (safetensors/src/tensor.rs `Dtype`): the writer sorts by this
// rank, descending, so the index below is the layout rank.
constexpr StDtype kDtypes[] = {
    {"BOOL", 8, DType::Bool},
    {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},
    {"U8", 8, DType::U8},
    {"I8", 8, DType::I8},
    {"F8_E5M2", 8, std::nullopt},
    {"F8_E4M3", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt},
    {"F8_E4M3FNUZ", 8, std::nullopt},
    {"F8_E5M2FNUZ", 8, std::nullopt},
    {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt},
    {"F16", 16, DType::F16},
    {"BF16", 16, DType::BF16},
    {"I32", 32, DType::I32},
    {"U32", 32, std::nullopt},
    {"F32", 32, DType::F32},
    {"C64", 64, std::nullopt},
    {"F64", 64, DType::F64},
    {"I64", 64, DType::I64},
    {"U64", 64, std::nullopt},
};

const StDtype* find_dtype(std::string_view name) {
  for (const StDtype& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

int dtype_rank(DType t) {
  const std::string_view name = dtype_safetensors_name(t);
  for (size_t i = 0; i < std::size(kDtypes); ++i)
    if (name == kDtypes[i].name) return static_cast<int>(i);
  fail(ErrorCode::Internal, "safetensors", "no safetensors dtype for " + std::string(name));
}

// ------------------------------------------------------------------------------------ helpers

// Offset of the first byte that makes `s` invalid UTF-8, or npos. Strict as Rust's
// core::str::from_utf8 (the reference's check): no overlong forms, no UTF-16 surrogates
// (U+D800..U+DFFF), nothing above U+10FFFF (Unicode Table 3-7).
size_t invalid_utf8_at(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string::npos;
}

bool valid_utf8(const std::string& s) {
  return invalid_utf8_at(reinterpret_cast<const uint8_t*>(s.data()), s.size()) == std::string::npos;
}

// A name as it appears in messages: quoted, with control bytes escaped and long names cut, so a
// hostile header cannot flood a terminal.
std::string quote_name(std::string_view s) {
  constexpr size_t kMax = 200;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "'";
}

std::string dims_str(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

bool mul_overflows_u64(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// ------------------------------------------------------------------------------------ header

struct RawEntry {
  std::string name;
  const StDtype* dtype = nullptr;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> offsets;
};

// Builds the entries straight from nlohmann's SAX events instead of a DOM: it sees every key (so
// duplicates are caught; a DOM keeps the last), keeps only what the format needs, and stops at
// the first error with a message that names the tensor.
class HeaderParser {
 public:
  using json = nlohmann::json;

  std::vector<RawEntry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;

  // serde_json (the reference's parser) counts down from kMaxJsonDepth = 128 and fails when it
  // reaches 0: 127 nested arrays/objects pass, the 128th is refused.
  static constexpr int kMaxDepth = kMaxJsonDepth - 1;

  bool null() { return value(Kind::Null, "null"); }
  bool boolean(bool v) { return value(Kind::Bool, v ? "true" : "false"); }
  // nlohmann reports every number written with a '-' here, "-0" included, which serde_json
  // reads as a float; both are refused where an unsigned integer is expected.
  bool number_integer(json::number_integer_t v) {
    return value(Kind::Negative, v == 0 ? "-0" : std::to_string(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    unsigned_ = v;
    return value(Kind::Unsigned, std::to_string(v));
  }
  // Never a valid shape or offset; nlohmann, like serde_json, already refuses 1e400.
  bool number_float(json::number_float_t, const std::string& token) {
    return value(Kind::Float, token);
  }
  bool string(std::string& v) {
    string_ = std::move(v);
    return value(Kind::String, "the string " + quote_name(string_));
  }
  bool binary(json::binary_t&) { return fail("header is not valid JSON: binary value"); }

  bool start_object(std::size_t) {
    if (!enter()) return false;
    return container(true);
  }
  bool start_array(std::size_t) {
    if (!enter()) return false;
    return container(false);
  }
  bool end_object() {
    --depth_;
    return close();
  }
  bool end_array() {
    --depth_;
    return close();
  }
  bool key(std::string& k) {
    switch (state_) {
      case State::RootKeys:
        if (k == "__metadata__") {
          if (seen_metadata_) return fail("duplicate key '__metadata__'");
          seen_metadata_ = true;
          state_ = State::MetaValue;
          return true;
        }
        if (!names_.insert(k).second) return fail("duplicate tensor name " + quote_name(k));
        entries.emplace_back();
        entries.back().name = std::move(k);
        state_ = State::EntryValue;
        return true;
      case State::MetaKeys:
        meta_key_ = std::move(k);
        state_ = State::MetaValueString;
        return true;
      case State::EntryKeys: {
        RawEntry& e = entries.back();
        bool* seen = nullptr;
        if (k == "dtype") {
          field_ = Field::Dtype;
          seen = &e.has_dtype;
        } else if (k == "shape") {
          field_ = Field::Shape;
          seen = &e.has_shape;
        } else if (k == "data_offsets") {
          field_ = Field::Offsets;
          seen = &e.has_offsets;
        } else {
          // The reference (serde, no deny_unknown_fields) ignores any other key.
          skip_depth_ = 0;
          state_ = State::Skip;
          return true;
        }
        if (*seen) return fail(tensor() + ": duplicate key '" + k + "'");
        *seen = true;
        state_ = State::FieldValue;
        return true;
      }
      case State::DtypeMapKey:
        string_ = std::move(k);
        if (!set_dtype()) return false;
        state_ = State::DtypeMapNull;
        return true;
      case State::DtypeMapEnd:
        return fail(tensor() + ": a dtype object must have exactly one key, like {\"F32\": null}");
      case State::Skip:
        return true;
      default:
        return fail("header is not valid JSON: unexpected key");  // the parser never gets here
    }
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ..." -> "parse error..."
    std::string what = ex.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return fail("header is not valid JSON: " + what);
  }

  bool finished() const { return state_ == State::Done; }

 private:
  enum class Kind { Null, Bool, Negative, Unsigned, Float, String, Object, Array };
  enum class State {
    Top,              // before the root value
    RootKeys,         // in the root object, expecting a key or '}'
    MetaValue,        // the value of __metadata__
    MetaKeys,         // in __metadata__, expecting a key or '}'
    MetaValueString,  // a metadata value
    EntryValue,       // the value of a tensor name
    EntryKeys,        // in a tensor object, expecting a key or '}'
    EntrySeq,         // in a tensor array [dtype, shape, data_offsets]
    FieldValue,       // the value of dtype/shape/data_offsets
    DtypeMapKey,      // in a dtype written as {"F32": null}, expecting the key
    DtypeMapNull,     // its value
    DtypeMapEnd,      // expecting its '}'
    Shape,            // in the shape array
    Offsets,          // in the data_offsets array
    Skip,             // inside an ignored value
    Done,
  };
  enum class Field { Dtype, Shape, Offsets };

  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  std::string tensor() const { return "tensor " + quote_name(entries.back().name); }
  const char* field_name() const {
    return field_ == Field::Dtype ? "dtype" : field_ == Field::Shape ? "shape" : "data_offsets";
  }
  bool enter() {
    if (++depth_ > kMaxDepth)
      return fail("header is not valid JSON: nested deeper than " + std::to_string(kMaxDepth) +
                  " levels");
    return true;
  }

  // Records string_ as the current tensor's dtype.
  bool set_dtype() {
    RawEntry& e = entries.back();
    e.has_dtype = true;
    e.dtype = find_dtype(string_);
    if (!e.dtype) return fail(tensor() + ": unknown dtype " + quote_name(string_));
    return true;
  }

  // The state to return to once a field value is complete.
  State entry_state() const { return in_seq_ ? State::EntrySeq : State::EntryKeys; }

  // Picks the field of the next element of the array form.
  bool next_seq_field() {
    switch (seq_pos_++) {
      case 0:
        field_ = Field::Dtype;
        break;
      case 1:
        field_ = Field::Shape;
        break;
      case 2:
        field_ = Field::Offsets;
        break;
      default:
        return fail(tensor() +
                    ": an array entry must be [dtype, shape, data_offsets], got more "
                    "than 3 elements");
    }
    state_ = State::FieldValue;
    return true;
  }

  static std::string describe(Kind k, const std::string& text) {
    switch (k) {
      case Kind::Object:
        return "an object";
      case Kind::Array:
        return "an array";
      default:
        return text;
    }
  }

  // A scalar value arrived.
  bool value(Kind k, const std::string& text) {
    switch (state_) {
      case State::Top:
        return fail("header root is " + describe(k, text) + ", not an object");
      case State::MetaValue:
        if (k == Kind::Null) {
          state_ = State::RootKeys;
          return true;
        }
        return fail("__metadata__ must be an object of strings or null, got " + text);
      case State::MetaValueString:
        if (k != Kind::String)
          return fail("__metadata__ value of " + quote_name(meta_key_) + " must be a string, got " +
                      text);
        metadata[meta_key_] = std::move(string_);  // duplicate keys: the last wins, as in serde
        state_ = State::MetaKeys;
        return true;
      case State::EntryValue:
        return fail(tensor() + " must be an object {dtype, shape, data_offsets}, got " + text);
      case State::EntrySeq:
        if (!next_seq_field()) return false;
        return value(k, text);
      case State::FieldValue:
        if (field_ == Field::Dtype && k == Kind::String) {
          if (!set_dtype()) return false;
          state_ = entry_state();
          return true;
        }
        if (field_ == Field::Dtype) return fail(tensor() + ": dtype must be a string, got " + text);
        return fail(tensor() + ": " + field_name() + " must be a list of integers, got " + text);
      case State::DtypeMapNull:
        if (k != Kind::Null)
          return fail(tensor() + ": a dtype object must map the dtype to null, got " + text);
        state_ = State::DtypeMapEnd;
        return true;
      case State::Shape:
        if (k != Kind::Unsigned)
          return fail(tensor() + ": shape must hold non-negative integers, got " + text);
        entries.back().shape.push_back(unsigned_);
        return true;
      case State::Offsets:
        if (k != Kind::Unsigned)
          return fail(tensor() + ": data_offsets must hold non-negative integers, got " + text);
        if (entries.back().offsets.size() == 2)
          return fail(tensor() + ": data_offsets must be [begin, end], got more than 2 values");
        entries.back().offsets.push_back(unsigned_);
        return true;
      case State::Skip:
        if (skip_depth_ == 0) state_ = State::EntryKeys;
        return true;
      default:
        return fail("header is not valid JSON: unexpected value");  // the parser never gets here
    }
  }

  // '{' or '[' arrived (depth already counted).
  bool container(bool object) {
    const Kind k = object ? Kind::Object : Kind::Array;
    switch (state_) {
      case State::Top:
        if (!object) return fail("header root is an array, not an object");
        state_ = State::RootKeys;
        return true;
      case State::MetaValue:
        if (!object) return fail("__metadata__ must be an object of strings or null, got an array");
        state_ = State::MetaKeys;
        return true;
      case State::MetaValueString:
        return fail("__metadata__ value of " + quote_name(meta_key_) + " must be a string, got " +
                    describe(k, ""));
      case State::EntryValue:
        if (object) {
          in_seq_ = false;
          state_ = State::EntryKeys;
        } else {
          in_seq_ = true;
          seq_pos_ = 0;
          state_ = State::EntrySeq;
        }
        return true;
      case State::EntrySeq:
        if (!next_seq_field()) return false;
        return container(object);
      case State::FieldValue:
        if (field_ == Field::Dtype) {
          // serde reads a unit enum variant from a one-key map too: {"F32": null}.
          if (!object) return fail(tensor() + ": dtype must be a string, got an array");
          state_ = State::DtypeMapKey;
          return true;
        }
        if (object)
          return fail(tensor() + ": " + field_name() +
                      " must be a list of integers, got an object");
        state_ = field_ == Field::Shape ? State::Shape : State::Offsets;
        return true;
      case State::DtypeMapNull:
        return fail(tensor() + ": a dtype object must map the dtype to null, got " +
                    describe(k, ""));
      case State::Shape:
      case State::Offsets:
        return fail(tensor() + ": " + (state_ == State::Shape ? "shape" : "data_offsets") +
                    " must hold non-negative integers, got " + describe(k, ""));
      case State::Skip:
        ++skip_depth_;
        return true;
      default:
        return fail("header is not valid JSON: unexpected value");  // the parser never gets here
    }
  }

  // '}' or ']' arrived (nlohmann has checked that it matches its opener).
  bool close() {
    switch (state_) {
      case State::RootKeys:
        state_ = State::Done;
        return true;
      case State::MetaKeys:
        state_ = State::RootKeys;
        return true;
      case State::EntryKeys: {
        const RawEntry& e = entries.back();
        for (auto [has, name] : {std::pair{e.has_dtype, "dtype"}, std::pair{e.has_shape, "shape"},
                                 std::pair{e.has_offsets, "data_offsets"}})
          if (!has) return fail(tensor() + ": missing key '" + name + "'");
        state_ = State::RootKeys;
        return true;
      }
      case State::EntrySeq:
        if (seq_pos_ != 3)
          return fail(tensor() + ": an array entry must be [dtype, shape, data_offsets], got " +
                      std::to_string(seq_pos_) + " elements");
        entries.back().has_dtype = entries.back().has_shape = entries.back().has_offsets = true;
        state_ = State::RootKeys;
        return true;
      case State::DtypeMapKey:
        return fail(tensor() + ": a dtype object must have exactly one key, like {\"F32\": null}");
      case State::DtypeMapEnd:
        state_ = entry_state();
        return true;
      case State::Shape:
        state_ = entry_state();
        return true;
      case State::Offsets: {
        const auto& off = entries.back().offsets;
        if (off.size() != 2)
          return fail(tensor() + ": data_offsets must be [begin, end], got " +
                      std::to_string(off.size()) + (off.size() == 1 ? " value" : " values"));
        state_ = entry_state();
        return true;
      }
      case State::Skip:
        if (--skip_depth_ == 0) state_ = State::EntryKeys;
        return true;
      default:
        return fail("header is not valid JSON: unexpected end of container");  // unreachable
    }
  }

  State state_ = State::Top;
  Field field_ = Field::Dtype;
  int depth_ = 0;
  int skip_depth_ = 0;
  bool in_seq_ = false;
  int seq_pos_ = 0;
  bool seen_metadata_ = false;
  std::unordered_set<std::string> names_;
  std::string meta_key_;
  std::string string_;
  uint64_t unsigned_ = 0;
};

}  // namespace

// ------------------------------------------------------------------------------------ info

uint64_t SafetensorsTensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated: the left-to-right product does not overflow
  return n;
}

std::string SafetensorsTensorInfo::shape_str() const { return dims_str(shape); }

bool SafetensorsTensorInfo::computable() const {
  if (!dtype || shape.size() > static_cast<size_t>(kMaxRank)) return false;
  // Tensor::empty/wrap compute contiguous strides as products of the trailing dims with zeros
  // counted as 1, so the product of the non-zero dims must fit int64.
  uint64_t p = 1;
  for (uint64_t d : shape)
    if (d != 0 && mul_overflows_u64(p, d, &p)) return false;
  return p <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

std::optional<uint32_t> safetensors_dtype_bits(const std::string& dtype_name) {
  const StDtype* d = find_dtype(dtype_name);
  if (!d) return std::nullopt;
  return d->bits;
}

// ------------------------------------------------------------------------------------ reader

struct SafetensorsFile::Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* map = nullptr;  // mmap'd region, or null for an in-memory buffer
  std::vector<uint8_t> owned;

  Bytes() = default;
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  ~Bytes() {
    if (map) ::munmap(map, size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorCode::IO, path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorCode::IO, path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail(ErrorCode::IO, path, "is a directory, not a safetensors file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorCode::IO, path, "is not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    // Also keeps a 0-byte file away from mmap, which fails on length 0.
    ::close(fd);
    fail(ErrorCode::Format, path,
         "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (map == MAP_FAILED)
    fail(ErrorCode::IO, path, std::string("cannot map: ") + std::strerror(err));
  // The page cache may hold the file in 2 MiB folios, which a fault then maps whole: the small
  // tensors read in place (norms, biases, position tables) kept 22.5 MB of swin_t's checkpoint
  // resident where their 4 KiB pages are 0.8 MB, and pages released after packing came back
  // with their neighbours. 4 KiB mappings keep RSS to what is read. Advisory: failure only
  // costs memory.
  ::madvise(map, size, MADV_NOHUGEPAGE);

  auto bytes = std::make_shared<Bytes>();
  bytes->map = map;
  bytes->data = static_cast<const uint8_t*>(map);
  bytes->size = size;

  SafetensorsFile f;
  f.path_ = path;
  f.identity_ = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), size,
                 static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  f.bytes_ = std::move(bytes);
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> data, std::string name) {
  auto bytes = std::make_shared<Bytes>();
  bytes->owned = std::move(data);
  bytes->data = bytes->owned.data();
  bytes->size = bytes->owned.size();
  SafetensorsFile f;
  f.path_ = std::move(name);
  f.bytes_ = std::move(bytes);
  f.parse();
  return f;
}

namespace {

[[noreturn]] void format_error(const std::string& where, const std::string& what) {
  fail(ErrorCode::Format, where, what);
}

// N from the 8-byte length prefix (read only once size >= 8), bounded by the limit and by the
// file's size.
uint64_t read_header_length(const uint8_t* p, uint64_t size, const std::string& where) {
  if (size < 8)
    format_error(
        where, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, p, 8);  // little-endian (static_assert above)
  if (n > kSafetensorsMaxHeaderBytes)
    format_error(where, "header length " + std::to_string(n) + " exceeds the limit of " +
                            std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (8 + n > size)
    format_error(where, "header length " + std::to_string(n) + " runs past the end of the file (" +
                            std::to_string(size) + " bytes, header needs " + std::to_string(8 + n) +
                            ")");
  return n;
}

// Refuses header bytes [h, h + n) that are not UTF-8, or that nlohmann would read more laxly
// than the reference.
void check_header_bytes(const uint8_t* h, uint64_t n, const std::string& where) {
  if (const size_t bad = invalid_utf8_at(h, n); bad != std::string::npos) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", h[bad]);
    format_error(where, "header is not valid UTF-8 (byte " + std::string(buf) +
                            " at header offset " + std::to_string(bad) + ")");
  }
  // Two places where nlohmann is laxer than serde_json (the reference's parser): it reads a NUL
  // byte as the end of input, so "{}" padded with NULs would pass, and it skips a leading byte
  // order mark. A raw NUL is never valid JSON (inside strings it must be escaped).
  if (const void* nul = std::memchr(h, 0, n))
    format_error(where, "header is not valid JSON: NUL byte at header offset " +
                            std::to_string(static_cast<const uint8_t*>(nul) - h));
  if (n >= 3 && h[0] == 0xEF && h[1] == 0xBB && h[2] == 0xBF)
    format_error(where, "header is not valid JSON: it starts with a UTF-8 byte order mark");
}

// What HeaderParser read.
struct Header {
  std::vector<RawEntry> entries;  // in header order
  std::map<std::string, std::string> metadata;
};

Header parse_header_json(const uint8_t* h, uint64_t n, const std::string& where) {
  HeaderParser parser;
  const bool ok = nlohmann::json::sax_parse(h, h + n, &parser);
  if (!ok || !parser.finished())
    format_error(where, parser.error.empty() ? "header is not valid JSON" : parser.error);
  return {std::move(parser.entries), std::move(parser.metadata)};
}

// Data order: by (begin, end) as the reference sorts; stable, so empty tensors sharing an
// offset keep their header order.
std::vector<size_t> data_order(const std::vector<RawEntry>& raw) {
  std::vector<size_t> order(raw.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return raw[a].offsets < raw[b].offsets; });
  return order;
}

// One entry of a header of `n` bytes. It must begin at `expected`, where the tensor before it in
// data order (`prev`; null for the first) ends, and span exactly the bytes its dtype and shape
// need.
SafetensorsTensorInfo read_entry(RawEntry& e, uint64_t expected, const std::string* prev,
                                 uint64_t n, const std::string& where) {
  const uint64_t begin = e.offsets[0], end = e.offsets[1];
  // Messages are built only on failure: a checkpoint may hold 10^5 tensors.
  auto t = [&] { return "tensor " + quote_name(e.name) + ": "; };
  auto offs = [&] {
    return "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  };
  auto what = [&] { return std::string(e.dtype->name) + " " + dims_str(e.shape); };
  if (end < begin) format_error(where, t() + offs() + " end before they begin");
  if (begin != expected) {
    if (!prev) format_error(where, t() + offs() + " but the first tensor must begin at 0");
    if (begin > expected)
      format_error(where, t() + offs() + " leave a gap of " + std::to_string(begin - expected) +
                              " bytes after tensor " + quote_name(*prev) + ", which ends at " +
                              std::to_string(expected));
    format_error(where, t() + offs() + " overlap tensor " + quote_name(*prev) + ", which ends at " +
                            std::to_string(expected));
  }
  // Same arithmetic as the reference: element count folded left to right, then times the
  // element width in bits, each step overflow-checked.
  uint64_t numel = 1;
  for (uint64_t d : e.shape)
    if (mul_overflows_u64(numel, d, &numel))
      format_error(where,
                   t() + "the element count of shape " + dims_str(e.shape) + " overflows 64 bits");
  uint64_t bits;
  if (mul_overflows_u64(numel, e.dtype->bits, &bits))
    format_error(where, t() + "the size of " + what() + " overflows 64 bits");
  if (bits % 8 != 0)
    format_error(
        where, t() + what() + " is " + std::to_string(bits) + " bits, not a whole number of bytes");
  if (end - begin != bits / 8)
    format_error(where, t() + offs() + " span " + std::to_string(end - begin) + " bytes but " +
                            what() + " needs " + std::to_string(bits / 8));

  SafetensorsTensorInfo info;
  info.name = std::move(e.name);
  info.dtype_name = e.dtype->name;
  info.dtype = e.dtype->dtype;
  info.dtype_bits = e.dtype->bits;
  info.shape = std::move(e.shape);
  info.data_begin = begin;
  info.data_end = end;
  info.file_offset = 8 + n + begin;
  return info;
}

// The entries of a header of `n` bytes in data order, checked to tile the `data_size` bytes
// after the header: from 0, without gaps or overlaps, to the last byte.
std::vector<SafetensorsTensorInfo> tile_data_section(std::vector<RawEntry>& raw, uint64_t n,
                                                     uint64_t data_size, const std::string& where) {
  uint64_t expected = 0;
  const std::string* prev = nullptr;
  std::vector<SafetensorsTensorInfo> infos;
  infos.reserve(raw.size());  // keeps `prev` valid
  for (size_t idx : data_order(raw)) {
    infos.push_back(read_entry(raw[idx], expected, prev, n, where));
    expected = infos.back().data_end;
    prev = &infos.back().name;
  }
  if (expected != data_size) {
    if (expected < data_size)
      format_error(where, "tensors cover " + std::to_string(expected) +
                              " data bytes but the file has " + std::to_string(data_size) +
                              " after the header (" + std::to_string(data_size - expected) +
                              " trailing bytes)");
    format_error(where, "tensors need " + std::to_string(expected) +
                            " data bytes but the file has only " + std::to_string(data_size) +
                            " after the header (truncated)");
  }
  return infos;
}

}  // namespace

// Reads only bytes [0, size): the length prefix after checking size >= 8, the header after
// checking 8 + N <= size, and no tensor data at all (tensor() reads it, within the validated
// ranges).
void SafetensorsFile::parse() {
  const uint64_t size = bytes_->size;
  file_size_ = size;
  const uint64_t n = read_header_length(bytes_->data, size, path_);
  header_size_ = n;
  const uint8_t* h = bytes_->data + 8;
  check_header_bytes(h, n, path_);
  Header header = parse_header_json(h, n, path_);
  metadata_ = std::move(header.metadata);
  infos_ = tile_data_section(header.entries, n, size - 8 - n, path_);

  names_.reserve(infos_.size());
  index_.reserve(infos_.size());
  for (size_t i = 0; i < infos_.size(); ++i) {
    names_.push_back(infos_[i].name);
    index_.emplace(infos_[i].name, i);
  }
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(ErrorCode::Arg, path_, "no tensor named " + quote_name(name));
  return infos_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensorInfo& e = info(name);
  if (!e.dtype)
    fail(ErrorCode::DType, path_,
         "tensor " + quote_name(name) + " has dtype " + e.dtype_name +
             ", which tessera does not compute with (it reads F32 F16 BF16 F64 I64 I32 U8 I8 "
             "BOOL)");
  if (e.shape.size() > static_cast<size_t>(kMaxRank))
    fail(ErrorCode::Shape, path_,
         "tensor " + quote_name(name) + " has rank " + std::to_string(e.shape.size()) +
             ", over the limit of " + std::to_string(kMaxRank) + " dimensions");
  if (!e.computable())
    fail(ErrorCode::Shape, path_,
         "tensor " + quote_name(name) + " has shape " + e.shape_str() +
             ", whose non-zero dims multiply past 2^63 - 1");
  const Shape shape(e.shape.begin(), e.shape.end());
  const DType dtype = *e.dtype;
  // Mapped read-only: Tensor::wrap takes a mutable pointer, but nothing may write through it
  // (documented in the header), and the tensor says so (read_only()), so that loaders may keep
  // it instead of copying.
  auto* base = const_cast<uint8_t*>(bytes_->data);
  const std::shared_ptr<const void> owner = bytes_;
  // An empty tensor's data is never read; the base pointer (page-aligned for a mapping, 16 for
  // a heap buffer) satisfies wrap's alignment check even when its offset is odd.
  if (e.nbytes() == 0) return Tensor::wrap(base, shape, dtype, owner, true);
  uint8_t* data = base + e.file_offset;
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0)
    return Tensor::wrap(data, shape, dtype, owner, true, bytes_->map != nullptr);
  return Tensor::from_data(data, shape, dtype);  // unaligned: copy
}

std::map<std::string, Tensor> SafetensorsFile::tensors() const {
  std::map<std::string, Tensor> out;
  for (const SafetensorsTensorInfo& e : infos_)
    if (e.computable()) out.emplace(e.name, tensor(e.name));
  return out;
}

// ------------------------------------------------------------------------------------ writer

namespace {

// serde_json's string escaping (the reference writer): '"', '\\', \b \f \n \r \t, other bytes
// below 0x20 as \u00xx with lowercase hex; everything else, UTF-8 included, verbatim.
void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

struct Prepared {
  std::string header;                // JSON, padded with spaces to a multiple of 8
  std::vector<const Tensor*> order;  // data order
  uint64_t data_bytes = 0;
};

Prepared prepare(const std::vector<std::pair<const std::string*, const Tensor*>>& items,
                 const std::map<std::string, std::string>& metadata, const std::string& where) {
  std::unordered_set<std::string_view> seen;
  for (const auto& [name, t] : items) {
    if (!t->defined()) fail(ErrorCode::Arg, where, "tensor " + quote_name(*name) + " is undefined");
    if (*name == "__metadata__")
      fail(ErrorCode::Arg, where, "'__metadata__' is reserved and cannot name a tensor");
    if (!valid_utf8(*name))
      fail(ErrorCode::Arg, where, "tensor name " + quote_name(*name) + " is not valid UTF-8");
    if (!seen.insert(*name).second)
      fail(ErrorCode::Arg, where, "duplicate tensor name " + quote_name(*name));
  }
  for (const auto& [k, v] : metadata)
    if (!valid_utf8(k) || !valid_utf8(v))
      fail(ErrorCode::Arg, where, "metadata entry " + quote_name(k) + " is not valid UTF-8");

  // The reference order: dtype rank descending (alignment descending), then name ascending, so
  // with a header padded to 8 bytes every tensor starts aligned to its element size.
  std::vector<size_t> idx(items.size());
  std::vector<int> rank(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    idx[i] = i;
    rank[i] = dtype_rank(items[i].second->dtype());
  }
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    if (rank[a] != rank[b]) return rank[a] > rank[b];
    return *items[a].first < *items[b].first;  // bytewise, as Rust compares Strings
  });

  Prepared p;
  std::string& h = p.header;
  h += '{';
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      append_json_string(h, k);
      h += ':';
      append_json_string(h, v);
    }
    h += '}';
    first = false;
  }
  for (size_t i : idx) {
    const Tensor& t = *items[i].second;
    const uint64_t nbytes = t.nbytes();
    if (!first) h += ',';
    first = false;
    append_json_string(h, *items[i].first);
    h += ":{\"dtype\":\"";
    h += dtype_safetensors_name(t.dtype());
    h += "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) h += ',';
      h += std::to_string(t.size(d));
    }
    h += "],\"data_offsets\":[";
    h += std::to_string(p.data_bytes);
    h += ',';
    h += std::to_string(p.data_bytes + nbytes);
    h += "]}";
    p.data_bytes += nbytes;
    p.order.push_back(&t);
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  if (h.size() > kSafetensorsMaxHeaderBytes)
    fail(ErrorCode::Arg, where,
         "header of " + std::to_string(h.size()) + " bytes exceeds the limit of " +
             std::to_string(kSafetensorsMaxHeaderBytes));
  return p;
}

template <class Container>
std::vector<std::pair<const std::string*, const Tensor*>> items_of(const Container& c) {
  std::vector<std::pair<const std::string*, const Tensor*>> items;
  items.reserve(c.size());
  for (const auto& [name, t] : c) items.emplace_back(&name, &t);
  return items;
}

std::vector<uint8_t> serialize_items(
    const std::vector<std::pair<const std::string*, const Tensor*>>& items,
    const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(items, metadata, "safetensors writer");
  const uint64_t n = p.header.size();
  // Sized up front and filled with memcpy: GCC 12 misreports insert() after reserve() as a
  // buffer overflow (-Wstringop-overflow).
  std::vector<uint8_t> out(8 + n + p.data_bytes);
  uint8_t* dst = out.data();
  std::memcpy(dst, &n, 8);
  std::memcpy(dst + 8, p.header.data(), n);
  dst += 8 + n;
  for (const Tensor* t : p.order) {
    const Tensor c = t->contiguous();  // logical order for strided views
    if (c.nbytes() > 0) std::memcpy(dst, c.raw_data(), c.nbytes());
    dst += c.nbytes();
  }
  return out;
}

void save_items(const std::string& path,
                const std::vector<std::pair<const std::string*, const Tensor*>>& items,
                const std::map<std::string, std::string>& metadata) {
  // Everything that can be refused is refused before a file exists.
  const Prepared p = prepare(items, metadata, path);
  write_file_atomically(path, [&](int fd) {
    const uint64_t n = p.header.size();
    write_all(fd, &n, 8, path);
    write_all(fd, p.header.data(), p.header.size(), path);
    for (const Tensor* t : p.order) {
      const Tensor c = t->contiguous();
      write_all(fd, c.raw_data(), c.nbytes(), path);
    }
  });
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  return serialize_items(items_of(tensors), metadata);
}

std::vector<uint8_t> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  return serialize_items(items_of(tensors), metadata);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_items(path, items_of(tensors), metadata);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_items(path, items_of(tensors), metadata);
}

}  // namespace tessera
