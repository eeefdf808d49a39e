// io/safetensors: round trips of every dtype, files written by PyTorch (fixtures from
// tests/fixtures/gen_safetensors_fixtures.py, expectations in expected.json), one malformed file
// per validation rule, the quirks the reference reader accepts, and writer atomicity.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/safetensors.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(TESSERA_FIXTURE_DIR) + "/safetensors";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " << path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  BOOST_REQUIRE(out.good());
}

// A file: 8-byte little-endian `n` (the header's length unless given), the header, then
// `data_bytes` bytes of `fill`.
std::vector<uint8_t> st_file(const std::string& header, size_t data_bytes = 0,
                             std::optional<uint64_t> n = std::nullopt, uint8_t fill = 0) {
  const uint64_t len = n.value_or(header.size());
  std::vector<uint8_t> b(8 + header.size() + data_bytes, fill);
  std::memcpy(b.data(), &len, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

// {"<name>":{"dtype":"<dtype>","shape":<shape>,"data_offsets":<offsets>}}
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

template <class Fn>
void expect_error(ErrorCode code, const std::string& needle, Fn&& fn,
                  const std::string& where = "") {
  try {
    fn();
  } catch (const Error& e) {
    BOOST_CHECK_MESSAGE(e.code() == code, "got " << error_code_name(e.code()) << ", expected "
                                                 << error_code_name(code) << ": " << e.what());
    BOOST_CHECK_MESSAGE(e.detail().find(needle) != std::string::npos,
                        "message \"" << e.what() << "\" lacks \"" << needle << "\"");
    if (!where.empty()) BOOST_CHECK_EQUAL(e.where(), where);
    return;
  }
  BOOST_ERROR("no error; expected " << error_code_name(code) << " mentioning \"" << needle << "\"");
}

void expect_format(const std::vector<uint8_t>& bytes, const std::string& needle) {
  expect_error(
      ErrorCode::Format, needle, [&] { SafetensorsFile::from_bytes(bytes, "case.safetensors"); },
      "case.safetensors");
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

Tensor f16_tensor(const std::vector<float>& v, const Shape& shape) {
  std::vector<uint16_t> bits;
  for (float f : v) bits.push_back(float_to_half(f));
  return Tensor::from_data(bits.data(), shape, DType::F16);
}

Tensor bf16_tensor(const std::vector<float>& v, const Shape& shape) {
  std::vector<uint16_t> bits;
  for (float f : v) bits.push_back(float_to_bfloat16(f));
  return Tensor::from_data(bits.data(), shape, DType::BF16);
}

// One tensor of every dtype, plus a scalar, an empty tensor and two strided views.
NamedTensors every_dtype() {
  std::vector<float> base(12);
  for (int i = 0; i < 12; ++i) base[i] = static_cast<float>(i) * 0.5f - 2.0f;
  const Tensor grid = Tensor::from_vector(base, {3, 4});
  return {
      {"f32", Tensor::from_vector<float>({0.5f, -1.25f, 3e-8f, 1e30f, -0.0f, 7.0f}, {2, 3})},
      {"f16", f16_tensor({1.5f, -2.0f, 65504.0f}, {3})},
      {"bf16", bf16_tensor({1.0f, -3.5f, 1e20f, 1e-20f}, {2, 2})},
      {"f64", Tensor::from_vector<double>({3.141592653589793}, {})},
      {"i64", Tensor::from_vector<int64_t>({INT64_MIN, INT64_MAX, -1}, {3})},
      {"i32", Tensor::from_vector<int32_t>({}, {0, 4})},
      {"u8", Tensor::from_vector<uint8_t>({0, 1, 127, 128, 255}, {5})},
      {"i8", Tensor::from_vector<int8_t>({-128, -1, 0, 127}, {4})},
      {"mask", Tensor::from_vector<bool>({true, false, false, true}, {2, 2})},
      {"transposed", grid.transpose(0, 1)},  // [4, 3], strides [1, 4]
      {"rows", grid.narrow(0, 1, 2)},        // contiguous, storage offset 4
  };
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tessera_st_XXXXXX";
    BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> list() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
};

nlohmann::json expectations() {
  std::ifstream in(kFixtures + "/expected.json");
  BOOST_REQUIRE_MESSAGE(in, "missing " << kFixtures << "/expected.json");
  return nlohmann::json::parse(in);
}

std::string hex_of(const Tensor& t) {
  std::string s;
  char buf[4];
  for (uint8_t b : bytes_of(t)) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    s += buf;
  }
  return s;
}

// Checks every tensor of `file` against its expected.json description.
void check_against_expectations(const SafetensorsFile& f, const nlohmann::json& exp) {
  BOOST_CHECK_EQUAL(f.file_size(), exp["size"].get<uint64_t>());
  std::map<std::string, std::string> meta;
  if (!exp["metadata"].is_null()) meta = exp["metadata"].get<std::map<std::string, std::string>>();
  BOOST_CHECK(f.metadata() == meta);
  BOOST_CHECK_EQUAL(f.size(), exp["tensors"].size());
  for (const auto& [name, e] : exp["tensors"].items()) {
    BOOST_TEST_CONTEXT("tensor " << name) {
      BOOST_REQUIRE(f.contains(name));
      const SafetensorsTensorInfo& info = f.info(name);
      BOOST_CHECK_EQUAL(info.dtype_name, e["dtype"].get<std::string>());
      BOOST_CHECK(info.shape == e["shape"].get<std::vector<uint64_t>>());
      BOOST_CHECK_EQUAL(info.nbytes() * 2, e["hex"].get<std::string>().size());
      if (!e.contains("values")) {
        BOOST_CHECK(!info.computable());
        continue;
      }
      const Tensor t = f.tensor(name);
      BOOST_CHECK_EQUAL(dtype_safetensors_name(t.dtype()), info.dtype_name);
      BOOST_CHECK(t.shape() == Shape(info.shape.begin(), info.shape.end()));
      BOOST_CHECK_EQUAL(hex_of(t), e["hex"].get<std::string>());
      const std::vector<double> want = e["values"].get<std::vector<double>>();
      const std::vector<double> got = t.to_double_vector();
      BOOST_REQUIRE_EQUAL(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        BOOST_CHECK_MESSAGE(got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]),
                            "element " << i << ": " << got[i] << " != " << want[i]);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors)

// ------------------------------------------------------------------------------ round trips

BOOST_AUTO_TEST_CASE(round_trip_every_dtype_in_memory) {
  const NamedTensors src = every_dtype();
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"tessera.network", "{\"nodes\": []}"}, {"empty", ""}};
  const std::vector<uint8_t> bytes = serialize_safetensors(src, meta);
  const SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "mem");

  BOOST_CHECK(f.metadata() == meta);
  BOOST_CHECK_EQUAL(f.header_size() % 8, 0u);
  BOOST_REQUIRE_EQUAL(f.size(), src.size());
  for (const auto& [name, t] : src) {
    BOOST_TEST_CONTEXT("tensor " << name) {
      const Tensor got = f.tensor(name);
      BOOST_CHECK(got.dtype() == t.dtype());
      BOOST_CHECK(got.shape() == t.shape());
      BOOST_CHECK(got.is_contiguous());
      BOOST_CHECK(bytes_of(got) == bytes_of(t));  // logical order, bit for bit
      const SafetensorsTensorInfo& info = f.info(name);
      BOOST_CHECK_EQUAL(info.dtype_name, dtype_safetensors_name(t.dtype()));
      BOOST_CHECK_EQUAL(info.nbytes(), t.nbytes());
      // The reference layout keeps every tensor aligned, so each one is mapped, not copied.
      BOOST_CHECK_EQUAL(info.file_offset % dtype_size(t.dtype()), 0u);
      BOOST_CHECK(!got.storage()->owned());
      BOOST_CHECK(got.read_only());
    }
  }
  // Values through the Tensor API too, for the strided source.
  const std::vector<double> tr = f.tensor("transposed").to_double_vector();
  BOOST_CHECK(tr == src[9].second.to_double_vector());
  BOOST_CHECK_EQUAL(f.tensor("i64").at<int64_t>({0}), INT64_MIN);
  BOOST_CHECK_EQUAL(f.tensor("i64").at<int64_t>({1}), INT64_MAX);
  BOOST_CHECK_EQUAL(f.tensor("f64").dim(), 0);
  BOOST_CHECK_EQUAL(f.tensor("i32").numel(), 0);

  // Re-serialising what was read gives the same bytes (from a map, in another order).
  BOOST_CHECK(serialize_safetensors(f.tensors(), f.metadata()) == bytes);
}

BOOST_AUTO_TEST_CASE(round_trip_through_disk) {
  TempDir dir;
  const std::string path = dir.path + "/w.safetensors";
  const NamedTensors src = every_dtype();
  save_safetensors(path, src);
  const std::vector<uint8_t> on_disk = read_bytes(path);
  BOOST_CHECK(on_disk == serialize_safetensors(src));
  BOOST_CHECK(dir.list() == std::vector<std::string>{"w.safetensors"});

  const SafetensorsFile f = SafetensorsFile::open(path);
  BOOST_CHECK_EQUAL(f.path(), path);
  BOOST_CHECK(f.metadata() == (std::map<std::string, std::string>{{"format", "pt"}}));
  for (const auto& [name, t] : src) BOOST_CHECK(bytes_of(f.tensor(name)) == bytes_of(t));
  BOOST_CHECK(serialize_safetensors(f.tensors(), f.metadata()) == on_disk);

  // Saving again replaces the file.
  save_safetensors(path, NamedTensors{{"x", Tensor::from_vector<float>({1.0f}, {1})}}, {});
  const SafetensorsFile g = SafetensorsFile::open(path);
  BOOST_CHECK(g.names() == std::vector<std::string>{"x"});
  BOOST_CHECK(g.metadata().empty());
}

BOOST_AUTO_TEST_CASE(writer_layout_is_the_reference_layout) {
  // Dtype rank descending (I64 > F32 > U8), then name; header padded with spaces to 8.
  const NamedTensors src = {
      {"b", Tensor::from_vector<float>({1, 2}, {2})},
      {"mm", Tensor::from_vector<uint8_t>({1, 2, 3}, {3})},
      {"a", Tensor::from_vector<float>({3}, {1})},
      {"i", Tensor::from_vector<int64_t>({4}, {1})},
  };
  const std::vector<uint8_t> b = serialize_safetensors(src);
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
      R"("mm":{"dtype":"U8","shape":[3],"data_offsets":[20,23]}})";
  BOOST_REQUIRE_EQUAL(json.size(), 249u);  // so the header pads with 7 spaces to 256
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  BOOST_CHECK_EQUAL(n, 256u);
  BOOST_REQUIRE_EQUAL(b.size(), 8u + 256u + 23u);
  BOOST_CHECK_EQUAL(std::string(b.begin() + 8, b.begin() + 8 + 256), json + "       ");
  const SafetensorsFile f = SafetensorsFile::from_bytes(b, "layout");
  BOOST_CHECK((f.names() == std::vector<std::string>{"i", "a", "b", "mm"}));

  // Empty metadata writes no __metadata__ key; strings escape as serde_json escapes them.
  const std::string name = "q\"b\\n\nc\x01\x1f\t\xc3\xa9/";
  const std::vector<uint8_t> e =
      serialize_safetensors(NamedTensors{{name, Tensor::from_vector<uint8_t>({9}, {1})}}, {});
  const std::string want = R"({"q\"b\\n\nc\u0001\u001f\t)"
                           "\xc3\xa9"
                           R"(/":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  BOOST_CHECK_EQUAL(std::string(e.begin() + 8, e.begin() + 8 + static_cast<long>(want.size())),
                    want);
  const SafetensorsFile g = SafetensorsFile::from_bytes(e, "escapes");
  BOOST_CHECK(g.names() == std::vector<std::string>{name});
  BOOST_CHECK(g.metadata().empty());

  // No tensors at all: a header and nothing else.
  const std::vector<uint8_t> z = serialize_safetensors(NamedTensors{});
  BOOST_CHECK_EQUAL(std::string(z.begin() + 8, z.end()), "{\"__metadata__\":{\"format\":\"pt\"}}");
  BOOST_CHECK_EQUAL(SafetensorsFile::from_bytes(z, "z").size(), 0u);
}

// ------------------------------------------------------------------------------ PyTorch files

BOOST_AUTO_TEST_CASE(reads_files_written_from_pytorch) {
  const nlohmann::json exp = expectations();
  for (const char* name : {"torch_dtypes.safetensors", "unaligned.safetensors",
                           "other_dtypes.safetensors", "no_tensors.safetensors"}) {
    BOOST_TEST_CONTEXT(name) {
      const SafetensorsFile f = SafetensorsFile::open(kFixtures + "/" + name);
      check_against_expectations(f, exp[name]);
    }
  }
}

BOOST_AUTO_TEST_CASE(writer_reproduces_pytorch_files_byte_for_byte) {
  // torch_dtypes.safetensors was laid out by st_format.py, which follows the reference writer.
  const std::string path = kFixtures + "/torch_dtypes.safetensors";
  const SafetensorsFile f = SafetensorsFile::open(path);
  BOOST_CHECK_EQUAL(f.tensors().size(), 12u);
  BOOST_CHECK(serialize_safetensors(f.tensors(), f.metadata()) == read_bytes(path));
}

BOOST_AUTO_TEST_CASE(unaligned_tensors_are_copied) {
  const SafetensorsFile f = SafetensorsFile::open(kFixtures + "/unaligned.safetensors");
  BOOST_CHECK((f.names() == std::vector<std::string>{"bytes", "w", "d", "h"}));
  BOOST_CHECK_EQUAL(f.info("w").data_begin, 3u);
  BOOST_CHECK_EQUAL(f.info("d").data_begin, 19u);
  BOOST_CHECK_EQUAL(f.info("h").data_begin, 43u);
  BOOST_CHECK(!f.tensor("bytes").storage()->owned());  // U8 is always aligned: mapped
  BOOST_CHECK(f.tensor("bytes").read_only());
  for (const char* name : {"w", "d", "h"}) {
    BOOST_CHECK(f.tensor(name).storage()->owned());
    BOOST_CHECK(!f.tensor(name).read_only());  // a private copy, free to write
  }
  BOOST_CHECK_EQUAL(f.tensor("w").at<float>({1, 1}), 4096.0f);
  BOOST_CHECK_EQUAL(f.tensor("d").at<double>({2}), std::ldexp(1.0, -1074));
  BOOST_CHECK_EQUAL(f.tensor("h").item({0}), -1.0);
}

BOOST_AUTO_TEST_CASE(other_dtypes_are_listed_but_refused) {
  const SafetensorsFile f = SafetensorsFile::open(kFixtures + "/other_dtypes.safetensors");
  struct Want {
    const char* name;
    const char* dtype;
    uint32_t bits;
    uint64_t bytes;
  };
  for (const Want& w :
       {Want{"i16", "I16", 16, 6}, Want{"c64", "C64", 64, 16}, Want{"f8", "F8_E4M3", 8, 4},
        Want{"f4", "F4", 4, 2}, Want{"u64", "U64", 64, 8}}) {
    BOOST_TEST_CONTEXT(w.name) {
      const SafetensorsTensorInfo& info = f.info(w.name);
      BOOST_CHECK_EQUAL(info.dtype_name, w.dtype);
      BOOST_CHECK(!info.dtype.has_value());
      BOOST_CHECK(!info.computable());
      BOOST_CHECK_EQUAL(info.dtype_bits, w.bits);
      BOOST_CHECK_EQUAL(info.nbytes(), w.bytes);
      expect_error(ErrorCode::DType, std::string("has dtype ") + w.dtype,
                   [&] { f.tensor(w.name); });
    }
  }
  BOOST_CHECK_EQUAL(f.info("f4").shape_str(), "[2, 2]");
  const auto all = f.tensors();
  BOOST_CHECK_EQUAL(all.size(), 1u);
  BOOST_CHECK(all.count("ok") == 1);
  // The writer order put U64 (reference rank 21) first and the F4 (rank 1) last.
  BOOST_CHECK_EQUAL(f.names().front(), "u64");
  BOOST_CHECK_EQUAL(f.names().back(), "f4");
  BOOST_CHECK_EQUAL(*safetensors_dtype_bits("F6_E3M2"), 6u);
  BOOST_CHECK(!safetensors_dtype_bits("F32x").has_value());
}

// ------------------------------------------------------------------------------ malformed

BOOST_AUTO_TEST_CASE(rejects_short_and_truncated_files) {
  expect_format({}, "0 bytes, shorter than the 8-byte header length");
  expect_format({1, 0, 0, 0, 0}, "5 bytes, shorter than the 8-byte header length");
  expect_format(st_file("{}", 0, 100'000'001), "header length 100000001 exceeds the limit");
  expect_format(st_file("{}", 0, UINT64_MAX), "exceeds the limit of 100000000 bytes");
  expect_format(st_file("{}", 0, 100),
                "header length 100 runs past the end of the file (10 bytes, header needs 108)");
  expect_format(st_file("", 0), "header is not valid JSON");  // N = 0
}

BOOST_AUTO_TEST_CASE(rejects_bad_header_text) {
  expect_format(st_file("{\"\xff\":1}"), "not valid UTF-8 (byte 0xff at header offset 2)");
  expect_format(st_file("{\"\xc0\xaf\":1}"), "not valid UTF-8 (byte 0xc0");      // overlong '/'
  expect_format(st_file("{\"\xed\xa0\x80\":1}"), "not valid UTF-8 (byte 0xed");  // surrogate
  expect_format(st_file("{\"\xf4\x90\x80\x80\":1}"), "not valid UTF-8");         // > U+10FFFF
  expect_format(st_file("{\"\xe2\x82\":1}"), "not valid UTF-8");                 // cut short
  expect_format(st_file("\xef\xbb\xbf{}"), "byte order mark");
  expect_format(st_file("{\"a\":"), "header is not valid JSON: parse error");
  expect_format(st_file("{} x"), "header is not valid JSON");
  expect_format(st_file(std::string("{}\0\0\0\0\0\0", 8)),
                "header is not valid JSON: NUL byte at header offset 2");
  expect_format(st_file(std::string("{\"a\0\":1}", 8)), "NUL byte at header offset 3");
  expect_format(st_file("{\"a\\ud800\":1}"), "header is not valid JSON");  // lone surrogate
  expect_format(st_file(R"({"__metadata__":{"a":"b",}})"), "header is not valid JSON");
  expect_format(st_file("{/*c*/}"), "header is not valid JSON");
  expect_format(st_file("[]"), "header root is an array, not an object");
  expect_format(st_file("\"x\""), "header root is the string 'x', not an object");
  expect_format(st_file("7"), "header root is 7, not an object");
  expect_format(st_file("null"), "header root is null, not an object");
  // serde_json refuses the 128th nesting level and numbers beyond f64.
  const std::string deep = std::string(126, '[') + std::string(126, ']');
  expect_format(st_file("{\"w\":{\"x\":" + deep + "}}"), "nested deeper than 127 levels");
  expect_format(st_file(R"({"w":{"x":1e400}})"), "header is not valid JSON: number overflow");
}

BOOST_AUTO_TEST_CASE(rejects_bad_metadata) {
  expect_format(st_file(R"({"__metadata__":{"a":1}})"),
                "__metadata__ value of 'a' must be a string, got 1");
  expect_format(st_file(R"({"__metadata__":{"a":null}})"),
                "__metadata__ value of 'a' must be a string, got null");
  expect_format(st_file(R"({"__metadata__":{"a":{"b":"c"}}})"),
                "__metadata__ value of 'a' must be a string, got an object");
  expect_format(st_file(R"({"__metadata__":["a"]})"),
                "__metadata__ must be an object of strings or null, got an array");
  expect_format(st_file(R"({"__metadata__":"pt"})"),
                "__metadata__ must be an object of strings or null, got the string 'pt'");
  expect_format(st_file(R"({"__metadata__":{},"__metadata__":{}})"),
                "duplicate key '__metadata__'");
}

BOOST_AUTO_TEST_CASE(rejects_bad_tensor_entries) {
  auto one = [](const std::string& body, size_t data = 0) {
    return st_file("{\"w\":" + body + "}", data);
  };
  expect_format(st_file("{" + entry("w", "F31", "[1]", "[0,4]") + "}", 4),
                "tensor 'w': unknown dtype 'F31'");
  expect_format(st_file("{" + entry("w", "f32", "[1]", "[0,4]") + "}", 4),
                "tensor 'w': unknown dtype 'f32'");
  expect_format(one(R"({"dtype":5,"shape":[1],"data_offsets":[0,4]})", 4),
                "tensor 'w': dtype must be a string, got 5");
  expect_format(one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", 8),
                "tensor 'w': shape must hold non-negative integers, got 2.0");
  expect_format(one(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,0]})"),
                "tensor 'w': shape must hold non-negative integers, got -1");
  expect_format(one(R"({"dtype":"F32","shape":[-0],"data_offsets":[0,0]})"),
                "tensor 'w': shape must hold non-negative integers, got -0");
  expect_format(one(R"({"dtype":"F32","shape":[1e0],"data_offsets":[0,4]})", 4),
                "shape must hold non-negative integers, got 1e0");
  expect_format(one(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})", 8),
                "tensor 'w': shape must hold non-negative integers, got the string '2'");
  expect_format(one(R"({"dtype":"F32","shape":[[2]],"data_offsets":[0,8]})", 8),
                "tensor 'w': shape must hold non-negative integers, got an array");
  expect_format(one(R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})", 16),
                "tensor 'w': shape must be a list of integers, got 4");
  expect_format(one(R"({"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0]})"),
                "got 18446744073709551616");  // 2^64: parsed as a float, refused
  expect_format(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4.0]})", 4),
                "tensor 'w': data_offsets must hold non-negative integers, got 4.0");
  expect_format(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 8),
                "tensor 'w': data_offsets must be [begin, end], got more than 2 values");
  expect_format(one(R"({"dtype":"F32","shape":[0],"data_offsets":[0]})"),
                "tensor 'w': data_offsets must be [begin, end], got 1 value");
  expect_format(one(R"({"dtype":"F32","shape":[1],"data_offsets":{"begin":0}})", 4),
                "tensor 'w': data_offsets must be a list of integers, got an object");
  expect_format(one(R"({"shape":[1],"data_offsets":[0,4]})", 4), "tensor 'w': missing key 'dtype'");
  expect_format(one(R"({"dtype":"F32","data_offsets":[0,4]})", 4),
                "tensor 'w': missing key 'shape'");
  expect_format(one(R"({"dtype":"F32","shape":[1]})", 4), "tensor 'w': missing key 'data_offsets'");
  expect_format(one(R"({"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4),
                "tensor 'w': duplicate key 'dtype'");
  expect_format(one("5"), "tensor 'w' must be an object {dtype, shape, data_offsets}, got 5");
  expect_format(one("\"F32\""), "tensor 'w' must be an object");
  expect_format(one(R"(["F32",[1]])", 4),
                "tensor 'w': an array entry must be [dtype, shape, "
                "data_offsets], got 2 elements");
  expect_format(one(R"(["F32",[1],[0,4],0])", 4), "got more than 3 elements");
  expect_format(one(R"({"dtype":{"F32":null,"F16":null},"shape":[1],"data_offsets":[0,4]})", 4),
                "a dtype object must have exactly one key");
  expect_format(one(R"({"dtype":{},"shape":[1],"data_offsets":[0,4]})", 4),
                "a dtype object must have exactly one key");
  expect_format(one(R"({"dtype":{"F32":1},"shape":[1],"data_offsets":[0,4]})", 4),
                "a dtype object must map the dtype to null, got 1");
  expect_format(one(R"({"dtype":{"F33":null},"shape":[1],"data_offsets":[0,4]})", 4),
                "unknown dtype 'F33'");
  // Duplicate tensor names: the one rule stricter than the reference, which keeps the last.
  expect_format(st_file("{" + entry("w", "F32", "[1]", "[0,4]") + "," +
                            entry("w", "F32", "[1]", "[4,8]") + "}",
                        8),
                "duplicate tensor name 'w'");
}

BOOST_AUTO_TEST_CASE(rejects_sizes_that_do_not_match) {
  auto file = [](const std::string& entries, size_t data) {
    return st_file("{" + entries + "}", data);
  };
  expect_format(file(entry("w", "F32", "[2,2]", "[0,12]"), 12),
                "tensor 'w': data_offsets [0, 12] span 12 bytes but F32 [2, 2] needs 16");
  expect_format(file(entry("w", "F32", "[]", "[0,8]"), 8),
                "tensor 'w': data_offsets [0, 8] span 8 bytes but F32 [] needs 4");
  expect_format(file(entry("w", "F32", "[1099511627776,1099511627776]", "[0,0]"), 0),
                "tensor 'w': the element count of shape [1099511627776, 1099511627776] "
                "overflows 64 bits");
  // Folded left to right like the reference: the overflow comes before the zero.
  expect_format(file(entry("w", "F32", "[4294967296,4294967296,0]", "[0,0]"), 0),
                "overflows 64 bits");
  expect_format(file(entry("w", "F64", "[2305843009213693952]", "[0,0]"), 0),
                "tensor 'w': the size of F64 [2305843009213693952] overflows 64 bits");
  expect_format(file(entry("w", "F4", "[3]", "[0,1]"), 1),
                "tensor 'w': F4 [3] is 12 bits, not a whole number of bytes");
  expect_format(file(entry("w", "F6_E2M3", "[3]", "[0,2]"), 2), "18 bits, not a whole number");
  expect_format(file(entry("w", "F32", "[1]", "[8,4]"), 4),
                "tensor 'w': data_offsets [8, 4] end before they begin");
  expect_format(file(entry("w", "F32", "[1]", "[4,8]"), 8),
                "tensor 'w': data_offsets [4, 8] but the first tensor must begin at 0");
  expect_format(
      file(entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]"), 12),
      "tensor 'b': data_offsets [8, 12] leave a gap of 4 bytes after tensor 'a', which "
      "ends at 4");
  expect_format(
      file(entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[1]", "[4,8]"), 8),
      "tensor 'b': data_offsets [4, 8] overlap tensor 'a', which ends at 8");
  expect_format(
      file(entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[0,4]"), 4),
      "overlap tensor 'a'");
  expect_format(
      file(entry("w", "F32", "[1]", "[0,4]"), 8),
      "tensors cover 4 data bytes but the file has 8 after the header (4 trailing bytes)");
  expect_format(file(entry("w", "F32", "[4]", "[0,16]"), 8),
                "tensors need 16 data bytes but the file has only 8 after the header (truncated)");
  expect_format(file("", 1), "tensors cover 0 data bytes but the file has 1");
  // End offsets near 2^64 must not wrap when checked against the file size.
  expect_format(
      file(entry("w", "U8", "[1152921504606846976]", "[0,1152921504606846976]"), 0),
      "tensors need 1152921504606846976 data bytes but the file has only 0 after the header");
}

BOOST_AUTO_TEST_CASE(io_errors) {
  TempDir dir;
  expect_error(
      ErrorCode::IO, "cannot open: No such file or directory",
      [&] { SafetensorsFile::open(dir.path + "/missing.safetensors"); },
      dir.path + "/missing.safetensors");
  expect_error(ErrorCode::IO, "is a directory", [&] { SafetensorsFile::open(dir.path); });
  expect_error(ErrorCode::IO, "not a regular file", [&] { SafetensorsFile::open("/dev/null"); });
  // A 0-byte file is a format error, and is never mmapped (mmap of length 0 fails).
  write_bytes(dir.path + "/empty.safetensors", {});
  expect_error(
      ErrorCode::Format, "0 bytes, shorter than the 8-byte header length",
      [&] { SafetensorsFile::open(dir.path + "/empty.safetensors"); },
      dir.path + "/empty.safetensors");
  // An on-disk file that lies about its size fails like the in-memory one.
  write_bytes(dir.path + "/short.safetensors", st_file("{}", 0, 64));
  expect_error(ErrorCode::Format, "runs past the end of the file",
               [&] { SafetensorsFile::open(dir.path + "/short.safetensors"); });

  const SafetensorsFile f = SafetensorsFile::open(kFixtures + "/torch_dtypes.safetensors");
  expect_error(ErrorCode::Arg, "no tensor named 'nope'", [&] { f.info("nope"); });
  expect_error(ErrorCode::Arg, "no tensor named 'nope'", [&] { f.tensor("nope"); });
  BOOST_CHECK(!f.contains("nope"));
}

// ------------------------------------------------------------------------------ accepted

BOOST_AUTO_TEST_CASE(accepts_what_the_reference_accepts) {
  // JSON whitespace around the header: space padding is how writers align.
  {
    const auto b = st_file(" \n\t\r{" + entry("w", "F32", "[1]", "[0,4]") + "} \n\t\r   ", 4);
    const auto f = SafetensorsFile::from_bytes(b, "ws");
    BOOST_CHECK(f.names() == std::vector<std::string>{"w"});
    BOOST_CHECK(f.metadata().empty());
  }
  // Extra keys in an entry (any value, repeated) are ignored; tensors listed out of data
  // order are sorted by offset; metadata may be null; unicode names, escaped or not.
  {
    const std::string h =
        R"({"b":{"shape":[2],"extra":{"x":[1,{"y":null}],"z":-1.5},"extra":true,)"
        R"("dtype":"F32","data_offsets":[4,12]},)"
        R"("\u00e9":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":null})";
    const auto f = SafetensorsFile::from_bytes(st_file(h, 12), "extra");
    BOOST_CHECK((f.names() == std::vector<std::string>{"\xc3\xa9", "b"}));
    BOOST_CHECK(f.info("b").shape == std::vector<uint64_t>{2});
    BOOST_CHECK(f.metadata().empty());
  }
  // serde reads a struct from an array and a unit variant from a one-key map.
  {
    const std::string h = R"({"a":["F32",[1],[0,4]],"b":{"dtype":{"I32":null},"shape":[],)"
                          R"("data_offsets":[4,8]}})";
    const auto f = SafetensorsFile::from_bytes(st_file(h, 8), "forms");
    BOOST_CHECK_EQUAL(f.info("a").dtype_name, "F32");
    BOOST_CHECK_EQUAL(f.info("b").dtype_name, "I32");
    BOOST_CHECK(f.info("b").shape.empty());
  }
  // Duplicate metadata keys: the last wins, as in the reference's HashMap.
  {
    const auto f = SafetensorsFile::from_bytes(
        st_file(R"({"__metadata__":{"k":"1","k":"2","format":"pt"}})"), "meta");
    BOOST_CHECK((f.metadata() == std::map<std::string, std::string>{{"k", "2"}, {"format", "pt"}}));
  }
  // 127 levels of nesting (root, entry, 125 arrays) is serde_json's limit and still fine.
  {
    const std::string deep = std::string(125, '[') + std::string(125, ']');
    const std::string h =
        R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":)" + deep + "}}";
    BOOST_CHECK_EQUAL(SafetensorsFile::from_bytes(st_file(h), "deep").size(), 1u);
  }
  // Empty tensors may share offsets with each other and with the next tensor; sub-byte dtypes
  // filling whole bytes are fine; an empty header and data section is a valid file.
  {
    const std::string h =
        "{" + entry("z1", "F32", "[0,3]", "[0,0]") + "," + entry("w", "F4", "[2,2]", "[0,2]") +
        "," + entry("z0", "F64", "[0]", "[0,0]") + "," + entry("z2", "I64", "[4,0]", "[2,2]") + "}";
    const auto f = SafetensorsFile::from_bytes(st_file(h, 2), "empties");
    BOOST_CHECK((f.names() == std::vector<std::string>{"z1", "z0", "w", "z2"}));
    BOOST_CHECK(f.tensor("z1").shape() == (Shape{0, 3}));
    BOOST_CHECK_EQUAL(f.tensor("z2").numel(), 0);
    BOOST_CHECK_EQUAL(f.tensors().size(), 3u);  // F4 is listed, not computable
    BOOST_CHECK_EQUAL(SafetensorsFile::from_bytes(st_file("{}"), "none").size(), 0u);
  }
  // A zero-size tensor whose dims need more than int64 strides: valid, listed, not loadable.
  {
    const std::string h = "{" + entry("huge", "F32", "[9223372036854775808,0]", "[0,0]") + "," +
                          entry("ok", "F32", "[0,4611686018427387904]", "[0,0]") + "}";
    const auto f = SafetensorsFile::from_bytes(st_file(h), "huge");
    BOOST_CHECK(!f.info("huge").computable());
    expect_error(ErrorCode::Shape, "multiply past 2^63 - 1", [&] { f.tensor("huge"); });
    BOOST_CHECK(f.info("ok").computable());
    BOOST_CHECK_EQUAL(f.tensor("ok").size(1), int64_t{1} << 62);
    BOOST_CHECK_EQUAL(f.tensors().size(), 1u);
  }
  // Any rank is read; computing is limited to kMaxRank (64) dims.
  {
    std::string dims65 = "[1";
    for (int i = 1; i < 65; ++i) dims65 += ",1";
    dims65 += "]";
    const std::string dims64 = "[1" + dims65.substr(4);  // one ",1" fewer
    const std::string h = "{" + entry("r65", "F32", dims65, "[0,4]") + "," +
                          entry("r64", "F32", dims64, "[4,8]") + "}";
    const auto f = SafetensorsFile::from_bytes(st_file(h, 8), "ranks");
    BOOST_CHECK_EQUAL(f.info("r65").shape.size(), 65u);
    BOOST_CHECK(!f.info("r65").computable());
    expect_error(ErrorCode::Shape, "tensor 'r65' has rank 65, over the limit of 64 dimensions",
                 [&] { f.tensor("r65"); });
    BOOST_CHECK_EQUAL(f.tensor("r64").dim(), 64);
    BOOST_CHECK_EQUAL(f.tensors().count("r65"), 0u);
  }
}

// ------------------------------------------------------------------------------ lifetime

BOOST_AUTO_TEST_CASE(tensors_keep_the_mapping_alive) {
  TempDir dir;
  const std::string path = dir.path + "/w.safetensors";
  const NamedTensors src = every_dtype();
  save_safetensors(path, src);
  Tensor kept;
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    kept = f.tensor("f32");
  }
  fs::remove(path);  // the mapping outlives the name, the file object and the file
  BOOST_CHECK(bytes_of(kept) == bytes_of(src[0].second));
}

BOOST_AUTO_TEST_CASE(concurrent_reads_of_one_file) {
  const SafetensorsFile f = SafetensorsFile::open(kFixtures + "/torch_dtypes.safetensors");
  const std::vector<double> want = f.tensor("f32").to_double_vector();
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 200; ++rep)
        ok[i] += f.tensors().size() == 12 && f.tensor("f32").to_double_vector() == want;
    });
  for (auto& t : threads) t.join();
  for (int v : ok) BOOST_CHECK_EQUAL(v, 200);
}

// ------------------------------------------------------------------------------ writer

BOOST_AUTO_TEST_CASE(writer_refuses_bad_input) {
  const Tensor one = Tensor::from_vector<float>({1.0f}, {1});
  expect_error(ErrorCode::Arg, "duplicate tensor name 'a'", [&] {
    serialize_safetensors(NamedTensors{{"a", one}, {"a", one}});
  });
  expect_error(ErrorCode::Arg, "'__metadata__' is reserved", [&] {
    serialize_safetensors(NamedTensors{{"__metadata__", one}});
  });
  expect_error(ErrorCode::Arg, "tensor 'u' is undefined", [&] {
    serialize_safetensors(NamedTensors{{"u", Tensor()}});
  });
  expect_error(ErrorCode::Arg, "is not valid UTF-8", [&] {
    serialize_safetensors(NamedTensors{{"bad\xff", one}});
  });
  expect_error(ErrorCode::Arg, "metadata entry 'k' is not valid UTF-8", [&] {
    serialize_safetensors(NamedTensors{}, {{"k", "\xc0\x80"}});
  });
}

BOOST_AUTO_TEST_CASE(writer_is_atomic) {
  TempDir dir;
  const std::string path = dir.path + "/w.safetensors";
  save_safetensors(path, every_dtype());
  const std::vector<uint8_t> original = read_bytes(path);
  const std::vector<std::string> listing = {"w.safetensors"};

  // Refused before any file exists.
  expect_error(ErrorCode::Arg, "undefined", [&] {
    save_safetensors(path, NamedTensors{{"x", Tensor::from_vector<float>({1}, {1})}, {"u", {}}});
  });
  BOOST_CHECK(read_bytes(path) == original);
  BOOST_CHECK(dir.list() == listing);

  // The directory does not exist: nothing can be created.
  expect_error(ErrorCode::IO, "cannot create",
               [&] { save_safetensors(dir.path + "/no/such/dir/w.safetensors", every_dtype()); });
  BOOST_CHECK(dir.list() == listing);

  // The target is a directory: the temporary file is written, the rename fails, the temporary
  // file is removed and the directory is left alone.
  fs::create_directory(dir.path + "/d.safetensors");
  write_bytes(dir.path + "/d.safetensors/keep", {1, 2, 3});
  expect_error(ErrorCode::IO, "cannot rename",
               [&] { save_safetensors(dir.path + "/d.safetensors", every_dtype()); });
  BOOST_CHECK((dir.list() == std::vector<std::string>{"d.safetensors", "w.safetensors"}));
  BOOST_CHECK(read_bytes(dir.path + "/d.safetensors/keep") == (std::vector<uint8_t>{1, 2, 3}));

  // A write that fails midway: cap the file size at 4 KiB (RLIMIT_FSIZE) and save 64 KiB.
  // write(2) then fails with EFBIG (SIGXFSZ ignored) after the header and part of the data.
  {
    struct rlimit old_limit;
    BOOST_REQUIRE_EQUAL(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    struct sigaction ignore = {}, old_action;
    ignore.sa_handler = SIG_IGN;
    BOOST_REQUIRE_EQUAL(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
    const NamedTensors big = {{"big", Tensor::zeros({16384})}};
    struct rlimit small = old_limit;
    small.rlim_cur = 4096;
    // Until the limit is restored nothing but the save may write a file (not even a log line).
    BOOST_REQUIRE_EQUAL(::setrlimit(RLIMIT_FSIZE, &small), 0);
    std::optional<Error> err;
    try {
      save_safetensors(path, big);
    } catch (const Error& e) {
      err = e;
    }
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    ::sigaction(SIGXFSZ, &old_action, nullptr);
    BOOST_REQUIRE(err.has_value());
    BOOST_CHECK(err->code() == ErrorCode::IO);
    BOOST_CHECK_MESSAGE(err->detail().find("cannot write: File too large") != std::string::npos,
                        err->what());
    BOOST_CHECK_EQUAL(err->where(), path);
  }
  BOOST_CHECK(read_bytes(path) == original);
  BOOST_CHECK((dir.list() == std::vector<std::string>{"d.safetensors", "w.safetensors"}));
  BOOST_CHECK_EQUAL(SafetensorsFile::open(path).size(), every_dtype().size());
}

// ------------------------------------------------------------------------------ robustness

// Random corruptions of a valid file: each is either read (and every computable tensor can be
// loaded) or refused with E_FORMAT; nothing else, and never a crash.
BOOST_AUTO_TEST_CASE(corrupted_files_fail_cleanly) {
  const std::vector<uint8_t> good = read_bytes(kFixtures + "/torch_dtypes.safetensors");
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  std::mt19937_64 rng(12345);
  const char tokens[] = "{}[]\",:-.e0123456789 ";
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<uint8_t> b = good;
    const int kind = static_cast<int>(rng() % 5);
    const size_t pos = 8 + rng() % n;  // a header byte
    if (kind == 0) {
      b[pos] = static_cast<uint8_t>(rng());
    } else if (kind == 1) {
      b[pos] = static_cast<uint8_t>(tokens[rng() % (sizeof tokens - 1)]);
    } else if (kind == 2) {
      b.resize(rng() % b.size());
    } else if (kind == 3) {
      const uint64_t v = rng() % (b.size() + 16);
      std::memcpy(b.data(), &v, 8);
    } else if (std::isdigit(b[pos])) {
      b[pos] = static_cast<uint8_t>('0' + rng() % 10);  // shift an offset or a dim
    }
    try {
      const SafetensorsFile f = SafetensorsFile::from_bytes(b, "fuzz");
      for (const auto& [name, t] : f.tensors()) (void)t.to_double_vector();
      ++accepted;
    } catch (const Error& e) {
      BOOST_REQUIRE_MESSAGE(e.code() == ErrorCode::Format, e.what());
      ++refused;
    }
  }
  BOOST_TEST_MESSAGE("corruptions: " << accepted << " read, " << refused << " refused");
  BOOST_CHECK_GT(accepted, 0);
  BOOST_CHECK_GT(refused, 0);
}

BOOST_AUTO_TEST_SUITE_END()
