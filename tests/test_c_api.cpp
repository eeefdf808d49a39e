// The C API (include/tessera/tessera.h) as a C program meets it: this file includes nothing of
// tessera but the public header and writes its test files by hand. Every function is called,
// with every error path (bad path, bad file, wrong input count, wrong shape, wrong dtype, null
// pointers), and one model is run from 8 threads at once against single-threaded results.
#include <tessera/tessera.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::string kEncoder = std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/";

// A failed call's code and message, the error object freed.
struct Failure {
  tessera_code code = TESSERA_OK;
  std::string message;
};

// Calls `call(&error)`, which must fail with `code` and a message that starts with the code's
// name and contains `text`; *error must be NULL on entry and set by the failure.
template <class Call>
void expect_error(tessera_code code, const std::string& text, Call call) {
  tessera_error* error = nullptr;
  const tessera_code got = call(&error);
  BOOST_TEST(got == code, "got " << tessera_code_name(got) << ", expected "
                                 << tessera_code_name(code) << ": "
                                 << tessera_error_message(error));
  BOOST_REQUIRE(error != nullptr);
  BOOST_TEST(tessera_error_code(error) == code);
  const std::string message = tessera_error_message(error);
  BOOST_TEST(message.starts_with(std::string(tessera_code_name(code)) + ": "), message);
  BOOST_TEST(message.find(text) != std::string::npos, "'" << message << "' lacks '" << text << "'");
  BOOST_TEST(message.find('\n') == std::string::npos, message);
  tessera_error_free(error);
  // The same call without an error object reports the same code.
  BOOST_TEST(call(nullptr) == code);
}

// Calls `call(&error)`, which must succeed and leave the error object NULL.
template <class Call>
void expect_ok(Call call) {
  tessera_error* error = nullptr;
  const tessera_code got = call(&error);
  BOOST_TEST(got == TESSERA_OK, tessera_error_message(error));
  BOOST_TEST(error == nullptr);
  tessera_error_free(error);
}

// A directory of test files, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("tessera_c_api_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& contents) const {
    const fs::path p = path / name;
    std::ofstream(p, std::ios::binary) << contents;
    return p.string();
  }
  static std::atomic<int>& counter() {
    static std::atomic<int> n{0};
    return n;
  }
};

// A safetensors file written by hand, as interfaces.md §4 lays it out.
struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string safetensors(const std::vector<StTensor>& tensors, const std::string& network = "") {
  std::string header = "{";
  if (!network.empty())
    header += "\"__metadata__\":{\"tessera.network\":\"" + json_escape(network) + "\"},";
  std::string data;
  for (const StTensor& t : tensors) {
    std::string shape;
    for (int64_t d : t.shape) {
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.bytes.size()) + "]},";
    data += t.bytes;
  }
  header.back() = '}';
  if (header == "}") header = "{}";
  while (header.size() % 8) header += ' ';
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return file + header + data;
}

// A two-layer network without weights: x [B, 4] -> linear(3) -> linear(2).
const char* kLinearNet = R"({"inputs": {"x": ["B", 4]},
  "nodes": [{"name": "fc1", "op": "linear", "args": {"out_features": 3}, "inputs": {"x": "x"}},
            {"name": "fc2", "op": "linear", "args": {"out_features": 2}, "inputs": {"x": "fc1"}}],
  "outputs": {"y": "fc2"}})";

std::vector<StTensor> linear_net_weights() {
  std::vector<float> w1(12), b1(3), w2(6), b2(2);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = 0.1f * static_cast<float>(i) - 0.5f;
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.3f - 0.1f * static_cast<float>(i);
  b1 = {0.1f, -0.2f, 0.3f};
  b2 = {1.0f, -1.0f};
  return {{"fc1.weight", "F32", {3, 4}, f32_bytes(w1)},
          {"fc1.bias", "F32", {3}, f32_bytes(b1)},
          {"fc2.weight", "F32", {2, 3}, f32_bytes(w2)},
          {"fc2.bias", "F32", {2}, f32_bytes(b2)}};
}

// x [B, T, 8] split along T into two outputs: "a" [B, T/2, 8] and "b".
const char* kChunkNet = R"({"inputs": {"x": ["B", "T", 8]},
  "nodes": [{"name": "c", "op": "chunk", "args": {"chunks": 2, "dim": 1}, "inputs": {"x": "x"}}],
  "outputs": {"a": "c.out0", "b": "c.out1"}})";

tessera_model* load(const std::string& net, const char* weights = nullptr, uint32_t flags = 0) {
  tessera_model* model = nullptr;
  tessera_error* error = nullptr;
  const tessera_code code = tessera_model_load(net.c_str(), weights, flags, &model, &error);
  BOOST_TEST_REQUIRE(code == TESSERA_OK, tessera_error_message(error));
  tessera_error_free(error);
  return model;
}

tessera_tensor* wrap(void* data, tessera_dtype dtype, std::vector<int64_t> shape) {
  tessera_tensor* t = nullptr;
  tessera_error* error = nullptr;
  const tessera_code code =
      tessera_tensor_wrap(data, dtype, shape.data(), shape.size(), &t, &error);
  BOOST_TEST_REQUIRE(code == TESSERA_OK, tessera_error_message(error));
  return t;
}

tessera_tensor* read(const std::string& path, const char* name) {
  tessera_tensor* t = nullptr;
  tessera_error* error = nullptr;
  const tessera_code code = tessera_tensor_read(path.c_str(), name, &t, &error);
  BOOST_TEST_REQUIRE(code == TESSERA_OK, tessera_error_message(error));
  return t;
}

std::string bytes_of(const tessera_tensor* t) {
  return std::string(static_cast<const char*>(tessera_tensor_data(t)), tessera_tensor_nbytes(t));
}

std::vector<int64_t> shape_of(const tessera_tensor* t) {
  const int64_t* s = tessera_tensor_shape(t);
  return s ? std::vector<int64_t>(s, s + tessera_tensor_rank(t)) : std::vector<int64_t>();
}

// Runs a one-input, one-output model with a library-owned output.
tessera_tensor* run1(const tessera_model* model, const tessera_tensor* x) {
  tessera_tensor* y = nullptr;
  tessera_error* error = nullptr;
  const tessera_code code = tessera_model_run(model, &x, 1, &y, 1, &error);
  BOOST_TEST_REQUIRE(code == TESSERA_OK, tessera_error_message(error));
  return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(c_api)

BOOST_AUTO_TEST_CASE(version_matches_the_header) {
  BOOST_TEST(std::string(tessera_version()) == TESSERA_VERSION_STRING);
  BOOST_TEST(tessera_version_number() == static_cast<uint32_t>(TESSERA_VERSION_NUMBER));
  const std::string expected = std::to_string(TESSERA_VERSION_MAJOR) + "." +
                               std::to_string(TESSERA_VERSION_MINOR) + "." +
                               std::to_string(TESSERA_VERSION_PATCH);
  BOOST_TEST(std::string(tessera_version()) == expected);
}

BOOST_AUTO_TEST_CASE(codes_and_error_objects) {
  const std::vector<std::pair<tessera_code, std::string>> names = {
      {TESSERA_OK, "OK"},
      {TESSERA_E_CONSTRAINT, "E_CONSTRAINT"},
      {TESSERA_E_SHAPE, "E_SHAPE"},
      {TESSERA_E_DTYPE, "E_DTYPE"},
      {TESSERA_E_ARG, "E_ARG"},
      {TESSERA_E_WEIGHTS, "E_WEIGHTS"},
      {TESSERA_E_FORMAT, "E_FORMAT"},
      {TESSERA_E_IO, "E_IO"},
      {TESSERA_E_UNSUPPORTED, "E_UNSUPPORTED"},
      {TESSERA_E_INTERNAL, "E_INTERNAL"}};
  for (size_t i = 0; i < names.size(); ++i) {
    BOOST_TEST(static_cast<int>(names[i].first) == static_cast<int>(i));  // fixed ABI values
    BOOST_TEST(tessera_code_name(names[i].first) == names[i].second);
  }
  BOOST_TEST(tessera_code_name(static_cast<tessera_code>(15)) == std::string("E_UNKNOWN"));
  BOOST_TEST(tessera_code_name(static_cast<tessera_code>(10)) == std::string("E_UNKNOWN"));
  // NULL error objects.
  BOOST_TEST(tessera_error_code(nullptr) == TESSERA_OK);
  BOOST_TEST(tessera_error_message(nullptr) == std::string(""));
  tessera_error_free(nullptr);
}

BOOST_AUTO_TEST_CASE(dtypes) {
  const std::vector<std::tuple<tessera_dtype, std::string, size_t>> all = {
      {TESSERA_F32, "F32", 4}, {TESSERA_F16, "F16", 2}, {TESSERA_BF16, "BF16", 2},
      {TESSERA_F64, "F64", 8}, {TESSERA_I64, "I64", 8}, {TESSERA_I32, "I32", 4},
      {TESSERA_U8, "U8", 1},   {TESSERA_I8, "I8", 1},   {TESSERA_BOOL, "BOOL", 1}};
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [dtype, name, size] = all[i];
    BOOST_TEST(static_cast<int>(dtype) == static_cast<int>(i + 1));
    BOOST_TEST(tessera_dtype_name(dtype) == name);
    BOOST_TEST(tessera_dtype_size(dtype) == size);
  }
  // 10 and 15 lie inside the enum's value range (0..15), so C++ may form them; a C caller can
  // pass any int, which the library reads the same way (a switch with a default).
  for (tessera_dtype bad :
       {TESSERA_DTYPE_UNDEFINED, static_cast<tessera_dtype>(10), static_cast<tessera_dtype>(15)}) {
    BOOST_TEST(tessera_dtype_name(bad) == std::string("UNDEFINED"));
    BOOST_TEST(tessera_dtype_size(bad) == 0u);
  }
}

BOOST_AUTO_TEST_CASE(threads) {
  const int before = tessera_num_threads();
  BOOST_TEST(before >= 1);
  expect_ok([](tessera_error** e) { return tessera_set_num_threads(1, e); });
  BOOST_TEST(tessera_num_threads() == 1);
  expect_ok([](tessera_error** e) { return tessera_set_num_threads(3, e); });
  BOOST_TEST(tessera_num_threads() == 3);
  expect_ok([](tessera_error** e) { return tessera_set_num_threads(0, e); });
  const int all_cores = tessera_num_threads();
  BOOST_TEST(all_cores >= 1);
  expect_error(TESSERA_E_ARG, "n=-1 must be >= 1",
               [](tessera_error** e) { return tessera_set_num_threads(-1, e); });
  BOOST_TEST(tessera_num_threads() == all_cores);  // a refused call changes nothing
  expect_ok([&](tessera_error** e) { return tessera_set_num_threads(before, e); });
}

BOOST_AUTO_TEST_CASE(tensor_wrap_views_the_callers_buffer) {
  std::vector<float> buffer(6);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i);
  tessera_tensor* t = wrap(buffer.data(), TESSERA_F32, {2, 3});
  BOOST_TEST(tessera_tensor_dtype(t) == TESSERA_F32);
  BOOST_TEST(tessera_tensor_rank(t) == 2u);
  BOOST_TEST(shape_of(t) == std::vector<int64_t>({2, 3}));
  BOOST_TEST(tessera_tensor_numel(t) == 6);
  BOOST_TEST(tessera_tensor_nbytes(t) == 24u);
  BOOST_TEST(tessera_tensor_data(t) == static_cast<void*>(buffer.data()));  // no copy
  tessera_tensor_free(t);  // the buffer stays the caller's
  BOOST_TEST(buffer[5] == 5.0f);

  // A scalar: rank 0, shape may be NULL.
  double scalar = 2.5;
  tessera_tensor* s = nullptr;
  expect_ok([&](tessera_error** e) {
    return tessera_tensor_wrap(&scalar, TESSERA_F64, nullptr, 0, &s, e);
  });
  BOOST_TEST(tessera_tensor_rank(s) == 0u);
  BOOST_TEST(tessera_tensor_shape(s) == nullptr);
  BOOST_TEST(tessera_tensor_numel(s) == 1);
  BOOST_TEST(tessera_tensor_nbytes(s) == 8u);
  tessera_tensor_free(s);

  // No elements: data may be NULL.
  const int64_t empty_shape[] = {0, 4};
  tessera_tensor* z = nullptr;
  expect_ok([&](tessera_error** e) {
    return tessera_tensor_wrap(nullptr, TESSERA_F32, empty_shape, 2, &z, e);
  });
  BOOST_TEST(tessera_tensor_numel(z) == 0);
  BOOST_TEST(tessera_tensor_nbytes(z) == 0u);
  tessera_tensor_free(z);

  // NULL handles.
  BOOST_TEST(tessera_tensor_dtype(nullptr) == TESSERA_DTYPE_UNDEFINED);
  BOOST_TEST(tessera_tensor_rank(nullptr) == 0u);
  BOOST_TEST(tessera_tensor_shape(nullptr) == nullptr);
  BOOST_TEST(tessera_tensor_numel(nullptr) == 0);
  BOOST_TEST(tessera_tensor_nbytes(nullptr) == 0u);
  BOOST_TEST(tessera_tensor_data(nullptr) == nullptr);
  tessera_tensor_free(nullptr);
}

BOOST_AUTO_TEST_CASE(tensor_wrap_errors) {
  alignas(8) float buffer[8] = {};
  const int64_t shape[] = {2, 3};
  tessera_tensor* t = nullptr;
  expect_error(TESSERA_E_ARG, "tensor is NULL", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, TESSERA_F32, shape, 2, nullptr, e);
  });
  expect_error(TESSERA_E_ARG, "shape is NULL", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, TESSERA_F32, nullptr, 2, &t, e);
  });
  expect_error(TESSERA_E_ARG, "data is NULL for 6 elements", [&](tessera_error** e) {
    return tessera_tensor_wrap(nullptr, TESSERA_F32, shape, 2, &t, e);
  });
  expect_error(TESSERA_E_ARG, "dtype 0 is not a tessera_dtype", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, TESSERA_DTYPE_UNDEFINED, shape, 2, &t, e);
  });
  expect_error(TESSERA_E_ARG, "dtype 12 is not a tessera_dtype", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, static_cast<tessera_dtype>(12), shape, 2, &t, e);
  });
  const int64_t negative[] = {2, -3};
  expect_error(TESSERA_E_SHAPE, "", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, TESSERA_F32, negative, 2, &t, e);
  });
  const int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 30};  // 2^70 elements
  expect_error(TESSERA_E_SHAPE, "", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, TESSERA_F32, huge, 2, &t, e);
  });
  const int64_t big[] = {int64_t{1} << 62};  // 2^62 elements fit int64, 2^65 bytes do not
  expect_error(TESSERA_E_SHAPE, "overflows", [&](tessera_error** e) {
    return tessera_tensor_wrap(buffer, TESSERA_F64, big, 1, &t, e);
  });
  char* misaligned = reinterpret_cast<char*>(buffer) + 1;
  expect_error(TESSERA_E_ARG, "not aligned to the 4-byte elements of F32", [&](tessera_error** e) {
    return tessera_tensor_wrap(misaligned, TESSERA_F32, shape, 2, &t, e);
  });
  BOOST_TEST(t == nullptr);  // no failure touched the out-parameter
  // Bytes have no alignment to miss.
  expect_ok([&](tessera_error** e) {
    return tessera_tensor_wrap(misaligned, TESSERA_U8, shape, 2, &t, e);
  });
  tessera_tensor_free(t);
}

BOOST_AUTO_TEST_CASE(tensor_read) {
  TempDir dir;
  const std::string path = dir.file(
      "t.safetensors", safetensors({{"a", "F32", {2, 2}, f32_bytes({1.0f, -2.0f, 3.5f, 4.0f})},
                                    {"mask", "BOOL", {3}, std::string("\1\0\1", 3)},
                                    {"f8", "F8_E4M3", {2}, std::string("\1\2", 2)}}));
  tessera_tensor* a = read(path, "a");
  BOOST_TEST(tessera_tensor_dtype(a) == TESSERA_F32);
  BOOST_TEST(shape_of(a) == std::vector<int64_t>({2, 2}));
  BOOST_TEST(bytes_of(a) == f32_bytes({1.0f, -2.0f, 3.5f, 4.0f}));
  static_cast<float*>(tessera_tensor_data(a))[0] = 7.0f;  // a private, writable copy
  tessera_tensor_free(a);
  tessera_tensor* again = read(path, "a");
  BOOST_TEST(static_cast<const float*>(tessera_tensor_data(again))[0] == 1.0f);
  tessera_tensor_free(again);
  tessera_tensor* mask = read(path, "mask");
  BOOST_TEST(tessera_tensor_dtype(mask) == TESSERA_BOOL);
  BOOST_TEST(bytes_of(mask) == std::string("\1\0\1", 3));
  tessera_tensor_free(mask);

  tessera_tensor* t = nullptr;
  expect_error(TESSERA_E_ARG, "path is NULL",
               [&](tessera_error** e) { return tessera_tensor_read(nullptr, "a", &t, e); });
  expect_error(TESSERA_E_ARG, "name is NULL", [&](tessera_error** e) {
    return tessera_tensor_read(path.c_str(), nullptr, &t, e);
  });
  expect_error(TESSERA_E_ARG, "tensor is NULL", [&](tessera_error** e) {
    return tessera_tensor_read(path.c_str(), "a", nullptr, e);
  });
  const std::string missing = (dir.path / "missing.safetensors").string();
  expect_error(TESSERA_E_IO, missing,
               [&](tessera_error** e) { return tessera_tensor_read(missing.c_str(), "a", &t, e); });
  expect_error(TESSERA_E_IO, "", [&](tessera_error** e) {
    return tessera_tensor_read(dir.path.c_str(), "a", &t, e);  // a directory
  });
  const std::string garbage = dir.file("garbage.safetensors", "this is not a safetensors file");
  expect_error(TESSERA_E_FORMAT, garbage,
               [&](tessera_error** e) { return tessera_tensor_read(garbage.c_str(), "a", &t, e); });
  expect_error(TESSERA_E_ARG, "nope",
               [&](tessera_error** e) { return tessera_tensor_read(path.c_str(), "nope", &t, e); });
  expect_error(TESSERA_E_DTYPE, "F8_E4M3",
               [&](tessera_error** e) { return tessera_tensor_read(path.c_str(), "f8", &t, e); });
  BOOST_TEST(t == nullptr);
}

BOOST_AUTO_TEST_CASE(model_load_both_ways) {
  // A checkpoint carrying its network.
  tessera_model* stored = load(kEncoder + "encoder.safetensors");
  // The network as JSON, the weights from a checkpoint.
  const std::string weights = kEncoder + "encoder.safetensors";
  tessera_model* separate = load(kEncoder + "encoder.json", weights.c_str());
  // Both give the same bits.
  tessera_tensor* x = read(kEncoder + "input.safetensors", "x");
  tessera_tensor* y1 = run1(stored, x);
  tessera_tensor* y2 = run1(separate, x);
  BOOST_TEST(bytes_of(y1) == bytes_of(y2));
  // Freeing the model leaves its outputs valid.
  tessera_model_free(stored);
  tessera_model_free(separate);
  tessera_model_free(nullptr);
  BOOST_TEST(shape_of(y1) == std::vector<int64_t>({2, 16, 64}));
  tessera_tensor* expected = read(kEncoder + "expected.safetensors", "y");
  const float* a = static_cast<const float*>(tessera_tensor_data(y1));
  const float* b = static_cast<const float*>(tessera_tensor_data(expected));
  double worst = 0.0;
  for (int64_t i = 0; i < tessera_tensor_numel(expected); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  BOOST_TEST(worst <= 1e-4);  // PyTorch's output, float32 against float32
  for (tessera_tensor* t : {x, y1, y2, expected}) tessera_tensor_free(t);
}

// A complete checkpoint (network in the metadata) written by hand; the result checked against
// the two matrix products computed here in double.
BOOST_AUTO_TEST_CASE(hand_written_checkpoint_runs) {
  TempDir dir;
  const std::vector<StTensor> w = linear_net_weights();
  tessera_model* model = load(dir.file("linear.safetensors", safetensors(w, kLinearNet)));
  auto floats = [](const StTensor& t) {
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  };
  const std::vector<float> w1 = floats(w[0]), b1 = floats(w[1]), w2 = floats(w[2]),
                           b2 = floats(w[3]);
  std::vector<float> x = {1.0f, 2.0f, -1.0f, 0.5f, -3.0f, 0.25f,
                          4.0f, 1.0f, 0.0f,  0.0f, 0.0f,  2.0f};  // B = 3
  tessera_tensor* in = wrap(x.data(), TESSERA_F32, {3, 4});
  tessera_tensor* y = run1(model, in);
  BOOST_TEST(shape_of(y) == std::vector<int64_t>({3, 2}));
  const float* got = static_cast<const float*>(tessera_tensor_data(y));
  for (size_t b = 0; b < 3; ++b)
    for (size_t o = 0; o < 2; ++o) {
      double out = b2[o];
      for (size_t h = 0; h < 3; ++h) {
        double hidden = b1[h];
        for (size_t i = 0; i < 4; ++i) hidden += static_cast<double>(w1[h * 4 + i]) * x[b * 4 + i];
        out += static_cast<double>(w2[o * 3 + h]) * hidden;
      }
      BOOST_TEST(std::fabs(got[b * 2 + o] - out) <= 1e-5 * (1.0 + std::fabs(out)),
                 "y[" << b << ", " << o << "] = " << got[b * 2 + o] << ", expected " << out);
    }
  tessera_tensor_free(y);
  tessera_tensor_free(in);
  tessera_model_free(model);
}

BOOST_AUTO_TEST_CASE(model_load_errors) {
  TempDir dir;
  const std::string net = dir.file("net.json", kLinearNet);
  const std::string good = dir.file("w.safetensors", safetensors(linear_net_weights()));
  tessera_model* model = nullptr;
  auto load_into = [&](const std::string& n, const char* w, uint32_t flags) {
    return [&, n, w, flags](tessera_error** e) {
      return tessera_model_load(n.c_str(), w, flags, &model, e);
    };
  };

  expect_error(TESSERA_E_ARG, "network_path is NULL", [&](tessera_error** e) {
    return tessera_model_load(nullptr, good.c_str(), 0, &model, e);
  });
  expect_error(TESSERA_E_ARG, "model is NULL", [&](tessera_error** e) {
    return tessera_model_load(net.c_str(), good.c_str(), 0, nullptr, e);
  });
  expect_error(TESSERA_E_ARG, "unknown flag bits 6", load_into(net, good.c_str(), 7));
  // Bad paths and files.
  const std::string missing = (dir.path / "missing.json").string();
  expect_error(TESSERA_E_IO, missing, load_into(missing, nullptr, 0));
  const std::string missing_w = (dir.path / "missing.safetensors").string();
  expect_error(TESSERA_E_IO, missing_w, load_into(net, missing_w.c_str(), 0));
  const std::string garbage = dir.file("garbage.safetensors", "this is not a safetensors file");
  expect_error(TESSERA_E_FORMAT, garbage, load_into(garbage, nullptr, 0));
  expect_error(TESSERA_E_FORMAT, garbage, load_into(net, garbage.c_str(), 0));
  const std::string not_json = dir.file("bad.json", "{\"inputs\": ");
  expect_error(TESSERA_E_FORMAT, not_json, load_into(not_json, nullptr, 0));
  // A checkpoint without a network.
  expect_error(TESSERA_E_ARG, "tessera.network", load_into(good, nullptr, 0));
  // Bad networks.
  const std::string unknown_op =
      dir.file("op.json", R"({"inputs": {"x": [2, 4]}, "nodes": [{"name": "n", "op": "conv",
        "args": {}, "inputs": {"x": "x"}}], "outputs": {"y": "n"}})");
  expect_error(TESSERA_E_ARG, "conv", load_into(unknown_op, nullptr, 0));
  const std::string heads =
      dir.file("heads.json", R"({"inputs": {"x": ["B", 8, 32]}, "nodes": [{"name": "n0",
        "op": "attention", "args": {"heads": 3}, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})");
  expect_error(TESSERA_E_CONSTRAINT, "n0 (attention)", load_into(heads, nullptr, 0));
  const std::string shape =
      dir.file("shape.json", R"({"inputs": {"a": [2, 4], "b": [2, 5]}, "nodes": [{"name": "s",
        "op": "add", "args": {}, "inputs": {"a": "a", "b": "b"}}], "outputs": {"y": "s"}})");
  expect_error(TESSERA_E_SHAPE, "s (add)", load_into(shape, nullptr, 0));
  const std::string int_input =
      dir.file("dtype.json", R"({"inputs": {"x": {"shape": [2, 4], "dtype": "int64"}}, "nodes": [
        {"name": "g", "op": "gelu", "args": {}, "inputs": {"x": "x"}}], "outputs": {"y": "g"}})");
  // int64 ids are a network input type now (token ids); gelu refuses them, naming itself.
  expect_error(TESSERA_E_DTYPE, "g (gelu): x has dtype int64", load_into(int_input, nullptr, 0));
  const std::string half =
      dir.file("half.json", R"({"dtype": "float16", "inputs": {"x": [2, 4]}, "nodes": [
        {"name": "g", "op": "gelu", "args": {}, "inputs": {"x": "x"}}], "outputs": {"y": "g"}})");
  expect_error(TESSERA_E_UNSUPPORTED, "float16", load_into(half, nullptr, 0));

  // Weights: none at all is refused unless non-strict.
  expect_error(TESSERA_E_WEIGHTS, "no weights: the network has 23 parameters",
               load_into(net, nullptr, 0));
  std::vector<StTensor> w = linear_net_weights();
  w.pop_back();  // fc2.bias missing
  const std::string partial = dir.file("partial.safetensors", safetensors(w));
  expect_error(TESSERA_E_WEIGHTS, "missing: fc2.bias", load_into(net, partial.c_str(), 0));
  w = linear_net_weights();
  w.push_back({"extra.weight", "F32", {1}, f32_bytes({1.0f})});
  const std::string extra = dir.file("extra.safetensors", safetensors(w));
  expect_error(TESSERA_E_WEIGHTS, "unexpected: extra.weight", load_into(net, extra.c_str(), 0));
  w = linear_net_weights();
  w[0] = {"fc1.weight", "F32", {4, 3}, w[0].bytes};
  const std::string misshaped = dir.file("misshaped.safetensors", safetensors(w));
  expect_error(TESSERA_E_WEIGHTS, "fc1.weight (expected [3, 4], got [4, 3])",
               load_into(net, misshaped.c_str(), 0));
  // Non-strict: mis-shaped is still refused.
  expect_error(TESSERA_E_WEIGHTS, "fc1.weight (expected [3, 4], got [4, 3])",
               load_into(net, misshaped.c_str(), TESSERA_LOAD_NON_STRICT));
  BOOST_TEST(model == nullptr);  // no failure touched the out-parameter

  // Non-strict accepts missing (initialised), unexpected (ignored) and absent weights.
  for (const std::string& weights : {partial, extra, std::string()}) {
    expect_ok([&](tessera_error** e) {
      return tessera_model_load(net.c_str(), weights.empty() ? nullptr : weights.c_str(),
                                TESSERA_LOAD_NON_STRICT, &model, e);
    });
    BOOST_TEST(model != nullptr);
    tessera_model_free(model);
    model = nullptr;
  }
}

BOOST_AUTO_TEST_CASE(model_inputs_and_outputs) {
  TempDir dir;
  tessera_model* model = load(dir.file("chunk.json", kChunkNet));
  BOOST_TEST(tessera_model_num_inputs(model) == 1u);
  BOOST_TEST(tessera_model_num_outputs(model) == 2u);
  BOOST_TEST(tessera_model_num_inputs(nullptr) == 0u);
  BOOST_TEST(tessera_model_num_outputs(nullptr) == 0u);

  const char* name = nullptr;
  tessera_dtype dtype = TESSERA_DTYPE_UNDEFINED;
  size_t rank = 0;
  expect_ok(
      [&](tessera_error** e) { return tessera_model_input(model, 0, &name, &dtype, &rank, e); });
  BOOST_TEST(name == std::string("x"));
  BOOST_TEST(dtype == TESSERA_F32);
  BOOST_TEST(rank == 3u);
  const std::vector<std::pair<int64_t, const char*>> input_dims = {
      {-1, "B"}, {-1, "T"}, {8, nullptr}};
  for (size_t axis = 0; axis < 3; ++axis) {
    int64_t size = 0;
    const char* symbol = "unset";
    expect_ok([&](tessera_error** e) {
      return tessera_model_input_dim(model, 0, axis, &size, &symbol, e);
    });
    BOOST_TEST(size == input_dims[axis].first);
    BOOST_TEST((symbol ? std::string(symbol) : "NULL") ==
               (input_dims[axis].second ? input_dims[axis].second : "NULL"));
  }
  for (size_t k = 0; k < 2; ++k) {
    expect_ok(
        [&](tessera_error** e) { return tessera_model_output(model, k, &name, &dtype, &rank, e); });
    BOOST_TEST(name == std::string(k == 0 ? "a" : "b"));
    BOOST_TEST(dtype == TESSERA_F32);
    BOOST_TEST(rank == 3u);
    int64_t size = 0;
    const char* symbol = nullptr;
    expect_ok([&](tessera_error** e) {
      return tessera_model_output_dim(model, k, 1, &size, &symbol, e);
    });
    BOOST_TEST(size == -1);
    BOOST_TEST(symbol == std::string("T/2"));  // an expression of symbols
    expect_ok([&](tessera_error** e) {
      return tessera_model_output_dim(model, k, 2, &size, &symbol, e);
    });
    BOOST_TEST(size == 8);
    BOOST_TEST(symbol == nullptr);
  }
  // Every out-parameter is optional.
  expect_ok([&](tessera_error** e) {
    return tessera_model_input(model, 0, nullptr, nullptr, nullptr, e);
  });
  expect_ok([&](tessera_error** e) {
    return tessera_model_output_dim(model, 1, 0, nullptr, nullptr, e);
  });

  // Errors.
  expect_error(TESSERA_E_ARG, "tessera_model_input: model is NULL", [&](tessera_error** e) {
    return tessera_model_input(nullptr, 0, &name, &dtype, &rank, e);
  });
  expect_error(TESSERA_E_ARG, "tessera_model_output: model is NULL", [&](tessera_error** e) {
    return tessera_model_output(nullptr, 0, &name, &dtype, &rank, e);
  });
  expect_error(
      TESSERA_E_ARG, "input index 1 is out of range (the model has 1)",
      [&](tessera_error** e) { return tessera_model_input(model, 1, &name, nullptr, nullptr, e); });
  expect_error(TESSERA_E_ARG, "output index 2 is out of range (the model has 2)",
               [&](tessera_error** e) {
                 return tessera_model_output(model, 2, &name, nullptr, nullptr, e);
               });
  int64_t size = 0;
  const char* symbol = nullptr;
  expect_error(TESSERA_E_ARG, "tessera_model_input_dim: model is NULL", [&](tessera_error** e) {
    return tessera_model_input_dim(nullptr, 0, 0, &size, &symbol, e);
  });
  expect_error(TESSERA_E_ARG, "tessera_model_output_dim: model is NULL", [&](tessera_error** e) {
    return tessera_model_output_dim(nullptr, 0, 0, &size, &symbol, e);
  });
  expect_error(TESSERA_E_ARG, "input index 3 is out of range", [&](tessera_error** e) {
    return tessera_model_input_dim(model, 3, 0, &size, &symbol, e);
  });
  expect_error(TESSERA_E_ARG, "output index 2 is out of range", [&](tessera_error** e) {
    return tessera_model_output_dim(model, 2, 0, &size, &symbol, e);
  });
  expect_error(
      TESSERA_E_ARG, "axis 3 is out of range (input x has rank 3)",
      [&](tessera_error** e) { return tessera_model_input_dim(model, 0, 3, &size, &symbol, e); });
  expect_error(
      TESSERA_E_ARG, "axis 5 is out of range (output b has rank 3)",
      [&](tessera_error** e) { return tessera_model_output_dim(model, 1, 5, &size, &symbol, e); });
  tessera_model_free(model);
}

BOOST_AUTO_TEST_CASE(run_outputs_library_or_caller_owned) {
  TempDir dir;
  tessera_model* model = load(dir.file("chunk.json", kChunkNet));
  std::vector<float> x(2 * 4 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  tessera_tensor* in = wrap(x.data(), TESSERA_F32, {2, 4, 8});

  // Slot a: the caller's buffer; slot b: NULL, so the library allocates.
  std::vector<float> a(2 * 2 * 8, -1.0f);
  tessera_tensor* out[2] = {wrap(a.data(), TESSERA_F32, {2, 2, 8}), nullptr};
  tessera_tensor* const a_handle = out[0];
  expect_ok([&](tessera_error** e) { return tessera_model_run(model, &in, 1, out, 2, e); });
  BOOST_TEST(out[0] == a_handle);  // the caller's slot keeps its tensor
  BOOST_REQUIRE(out[1] != nullptr);
  BOOST_TEST(shape_of(out[1]) == std::vector<int64_t>({2, 2, 8}));
  BOOST_TEST(tessera_tensor_dtype(out[1]) == TESSERA_F32);
  const float* b = static_cast<const float*>(tessera_tensor_data(out[1]));
  // chunk along T: a holds rows t = 0, 1 of each batch, b rows t = 2, 3.
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t c = 0; c < 8; ++c) {
        BOOST_TEST(a[static_cast<size_t>((n * 2 + t) * 8 + c)] ==
                   x[static_cast<size_t>((n * 4 + t) * 8 + c)]);
        BOOST_TEST(b[(n * 2 + t) * 8 + c] == x[static_cast<size_t>((n * 4 + t + 2) * 8 + c)]);
      }
  for (tessera_tensor* t : out) tessera_tensor_free(t);

  // Other float dtypes are converted: F64 input, same result.
  std::vector<double> x64(x.begin(), x.end());
  tessera_tensor* in64 = wrap(x64.data(), TESSERA_F64, {2, 4, 8});
  tessera_tensor* out64[2] = {nullptr, nullptr};
  expect_ok([&](tessera_error** e) { return tessera_model_run(model, &in64, 1, out64, 2, e); });
  BOOST_TEST(std::memcmp(tessera_tensor_data(out64[0]), a.data(), a.size() * 4) == 0);
  for (tessera_tensor* t : out64) tessera_tensor_free(t);
  tessera_tensor_free(in64);
  tessera_tensor_free(in);
  tessera_model_free(model);
}

BOOST_AUTO_TEST_CASE(run_errors) {
  TempDir dir;
  tessera_model* model = load(kEncoder + "encoder.safetensors");
  tessera_tensor* x = read(kEncoder + "input.safetensors", "x");
  tessera_tensor* y = nullptr;

  expect_error(TESSERA_E_ARG, "tessera_model_run: model is NULL",
               [&](tessera_error** e) { return tessera_model_run(nullptr, &x, 1, &y, 1, e); });
  expect_error(TESSERA_E_ARG, "inputs is NULL",
               [&](tessera_error** e) { return tessera_model_run(model, nullptr, 1, &y, 1, e); });
  expect_error(TESSERA_E_ARG, "outputs is NULL",
               [&](tessera_error** e) { return tessera_model_run(model, &x, 1, nullptr, 1, e); });
  const tessera_tensor* null_input = nullptr;
  expect_error(TESSERA_E_ARG, "input x is NULL", [&](tessera_error** e) {
    return tessera_model_run(model, &null_input, 1, &y, 1, e);
  });
  // Wrong counts.
  expect_error(TESSERA_E_ARG, "got 0 inputs, the network has 1",
               [&](tessera_error** e) { return tessera_model_run(model, nullptr, 0, &y, 1, e); });
  const tessera_tensor* two[] = {x, x};
  expect_error(TESSERA_E_ARG, "got 2 inputs, the network has 1",
               [&](tessera_error** e) { return tessera_model_run(model, two, 2, &y, 1, e); });
  tessera_tensor* slots[2] = {nullptr, nullptr};
  expect_error(TESSERA_E_ARG, "got 2 output slots, the network has 1 outputs",
               [&](tessera_error** e) { return tessera_model_run(model, &x, 1, slots, 2, e); });
  expect_error(TESSERA_E_ARG, "got 0 output slots",
               [&](tessera_error** e) { return tessera_model_run(model, &x, 1, nullptr, 0, e); });

  // Wrong input shapes and dtypes.
  std::vector<float> buffer(2 * 16 * 64);
  tessera_tensor* narrow = wrap(buffer.data(), TESSERA_F32, {2, 16, 32});
  expect_error(TESSERA_E_SHAPE, "input x",
               [&](tessera_error** e) { return tessera_model_run(model, &narrow, 1, &y, 1, e); });
  tessera_tensor* flat = wrap(buffer.data(), TESSERA_F32, {32, 64});
  expect_error(TESSERA_E_SHAPE, "input x",
               [&](tessera_error** e) { return tessera_model_run(model, &flat, 1, &y, 1, e); });
  std::vector<int64_t> ints(2 * 16 * 64);
  tessera_tensor* int_input = wrap(ints.data(), TESSERA_I64, {2, 16, 64});
  expect_error(TESSERA_E_DTYPE, "input x", [&](tessera_error** e) {
    return tessera_model_run(model, &int_input, 1, &y, 1, e);
  });
  BOOST_TEST(y == nullptr);  // no failure filled a slot

  // Caller-owned outputs of the wrong shape or dtype: refused before anything is written.
  std::vector<float> small(2 * 8 * 64, 42.0f);
  tessera_tensor* wrong_shape = wrap(small.data(), TESSERA_F32, {2, 8, 64});
  expect_error(
      TESSERA_E_SHAPE, "output y: the buffer is [2, 8, 64], the output is [2, 16, 64]",
      [&](tessera_error** e) { return tessera_model_run(model, &x, 1, &wrong_shape, 1, e); });
  BOOST_TEST(std::all_of(small.begin(), small.end(), [](float v) { return v == 42.0f; }));
  std::vector<double> wide(2 * 16 * 64, 42.0);
  tessera_tensor* wrong_dtype = wrap(wide.data(), TESSERA_F64, {2, 16, 64});
  expect_error(
      TESSERA_E_DTYPE, "output y: the buffer is F64, the output is F32",
      [&](tessera_error** e) { return tessera_model_run(model, &x, 1, &wrong_dtype, 1, e); });
  BOOST_TEST(std::all_of(wide.begin(), wide.end(), [](double v) { return v == 42.0; }));

  // The model still runs after every refusal.
  tessera_tensor* ok = run1(model, x);
  BOOST_TEST(shape_of(ok) == std::vector<int64_t>({2, 16, 64}));
  for (tessera_tensor* t : {x, narrow, flat, int_input, wrong_shape, wrong_dtype, ok})
    tessera_tensor_free(t);
  tessera_model_free(model);

  // Checks that wait for concrete shapes: one symbol bound two ways (E_SHAPE), a chunked dim
  // that is not a multiple of the chunk count (E_CONSTRAINT).
  tessera_model* pair = load(
      dir.file("pair.json", R"({"inputs": {"a": ["B", 4], "b": ["B", 4]}, "nodes": [{"name": "s",
        "op": "add", "args": {}, "inputs": {"a": "a", "b": "b"}}], "outputs": {"y": "s"}})"));
  std::vector<float> pa(2 * 4), pb(3 * 4);
  const tessera_tensor* ab[] = {wrap(pa.data(), TESSERA_F32, {2, 4}),
                                wrap(pb.data(), TESSERA_F32, {3, 4})};
  expect_error(TESSERA_E_SHAPE, "B",
               [&](tessera_error** e) { return tessera_model_run(pair, ab, 2, &y, 1, e); });
  for (const tessera_tensor* t : ab) tessera_tensor_free(const_cast<tessera_tensor*>(t));
  tessera_model_free(pair);

  tessera_model* chunk = load(dir.file("chunk.json", kChunkNet));
  std::vector<float> odd(1 * 5 * 8);
  tessera_tensor* odd_t = wrap(odd.data(), TESSERA_F32, {1, 5, 8});
  tessera_tensor* two_slots[2] = {nullptr, nullptr};
  expect_error(TESSERA_E_CONSTRAINT, "c (chunk)", [&](tessera_error** e) {
    return tessera_model_run(chunk, &odd_t, 1, two_slots, 2, e);
  });
  BOOST_TEST((two_slots[0] == nullptr && two_slots[1] == nullptr));
  tessera_tensor_free(odd_t);
  tessera_model_free(chunk);
}

BOOST_AUTO_TEST_CASE(trim_keeps_results_identical) {
  tessera_model* model = load(kEncoder + "encoder.safetensors");
  tessera_tensor* x = read(kEncoder + "input.safetensors", "x");
  tessera_tensor* before = run1(model, x);
  tessera_model_trim(model);  // the next run plans afresh
  tessera_tensor* after = run1(model, x);
  BOOST_TEST(bytes_of(before) == bytes_of(after));
  tessera_model_trim(nullptr);
  for (tessera_tensor* t : {x, before, after}) tessera_tensor_free(t);
  tessera_model_free(model);
}

// One model, 8 threads x 50 runs each, two input shapes interleaved (so threads take and return
// workspaces of both kinds at once), half the runs into caller-owned buffers: every output must
// be bitwise identical to the same input's single-threaded run.
BOOST_AUTO_TEST_CASE(concurrent_runs_match_single_threaded_bitwise) {
  constexpr int kThreads = 8, kRuns = 50;
  tessera_model* model = load(kEncoder + "encoder.safetensors");
  tessera_tensor* shipped = read(kEncoder + "input.safetensors", "x");  // [2, 16, 64]
  std::vector<float> other(1 * 9 * 64);
  for (size_t i = 0; i < other.size(); ++i)
    other[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  tessera_tensor* inputs[2] = {shipped, wrap(other.data(), TESSERA_F32, {1, 9, 64})};
  std::string reference[2];
  for (int k = 0; k < 2; ++k) {
    tessera_tensor* y = run1(model, inputs[k]);
    reference[k] = bytes_of(y);
    tessera_tensor_free(y);
  }
  BOOST_TEST_REQUIRE(reference[0].size() == 2u * 16 * 64 * 4);
  BOOST_TEST_REQUIRE(reference[1].size() == 1u * 9 * 64 * 4);

  std::vector<int> mismatches(kThreads, 0), failures(kThreads, 0);
  std::vector<std::string> first_error(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> mine[2] = {std::vector<float>(2 * 16 * 64),
                                    std::vector<float>(1 * 9 * 64)};
      tessera_tensor* own[2] = {nullptr, nullptr};
      const std::vector<int64_t> shapes[2] = {{2, 16, 64}, {1, 9, 64}};
      for (int k = 0; k < 2; ++k)
        tessera_tensor_wrap(mine[k].data(), TESSERA_F32, shapes[k].data(), 3, &own[k], nullptr);
      for (int r = 0; r < kRuns; ++r) {
        const int k = (t + r) % 2;
        const bool caller_owned = (r / 2) % 2 == 1;
        tessera_tensor* y = caller_owned ? own[k] : nullptr;
        tessera_error* error = nullptr;
        const tessera_tensor* in = inputs[k];
        if (tessera_model_run(model, &in, 1, &y, 1, &error) != TESSERA_OK) {
          if (failures[t]++ == 0) first_error[t] = tessera_error_message(error);
          tessera_error_free(error);
          continue;
        }
        if (bytes_of(y) != reference[k]) ++mismatches[t];
        if (!caller_owned) tessera_tensor_free(y);
      }
      for (tessera_tensor* o : own) tessera_tensor_free(o);
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    BOOST_TEST(failures[t] == 0, "thread " << t << ": " << first_error[t]);
    BOOST_TEST(mismatches[t] == 0, "thread " << t);
  }
  for (tessera_tensor* t : inputs) tessera_tensor_free(t);
  tessera_model_free(model);
}

// ---------------------------------------------------------------------------- generation
// The shipped generation example (examples/fortunes, made by make_fortunes.py): a character GPT
// whose greedy.safetensors holds PyTorch's greedy continuation of prompt.safetensors by full
// recomputation (every step's top-two margin >= 1e-3).
const std::string kFortunes = std::string(TESSERA_SOURCE_DIR) + "/examples/fortunes/";

std::vector<int64_t> ids_of(const tessera_tensor* t) {
  const int64_t* p = static_cast<const int64_t*>(tessera_tensor_data(t));
  return std::vector<int64_t>(p, p + tessera_tensor_numel(t));
}

tessera_generator* make_generator(const tessera_model* model, int64_t batch, int64_t capacity,
                                  double temperature = 0.0, int64_t top_k = 0, double top_p = 1.0,
                                  uint64_t seed = 0) {
  tessera_generator* g = nullptr;
  tessera_error* error = nullptr;
  const tessera_code code = tessera_generator_create(model, batch, capacity, temperature, top_k,
                                                     top_p, seed, &g, &error);
  BOOST_REQUIRE_MESSAGE(code == TESSERA_OK, tessera_error_message(error));
  return g;
}

// Greedy generation equals PyTorch's, through generate() and through prefill/sample/step; the
// generator keeps working after its model was freed (its own reference keeps it loaded).
BOOST_AUTO_TEST_CASE(generation_matches_pytorch_and_outlives_model_free) {
  tessera_model* model = load(kFortunes + "fortunes.safetensors");
  int64_t context = -1;
  expect_ok([&](tessera_error** e) { return tessera_model_context(model, &context, e); });
  BOOST_TEST(context == 256);
  tessera_tensor* prompt = read(kFortunes + "prompt.safetensors", "ids");
  tessera_tensor* expected = read(kFortunes + "greedy.safetensors", "ids");
  const std::vector<int64_t> p = ids_of(prompt), want = ids_of(expected);
  const int64_t B = shape_of(prompt)[0], T = shape_of(prompt)[1];
  const int64_t N = shape_of(expected)[1] - T;
  BOOST_TEST_REQUIRE(B == 2);

  tessera_generator* g = make_generator(model, B, 0);  // capacity: the context
  BOOST_TEST(tessera_generator_capacity(g) == 256);
  BOOST_TEST(tessera_generator_batch(g) == 2);
  BOOST_TEST(tessera_generator_vocab(g) == 128);
  tessera_model_free(model);  // the generator still holds it

  std::vector<int64_t> got(static_cast<size_t>(B * N));
  expect_ok([&](tessera_error** e) {
    return tessera_generator_generate(g, p.data(), T, N, got.data(), e);
  });
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      BOOST_TEST(got[static_cast<size_t>(b * N + n)] ==
                     want[static_cast<size_t>(b * (T + N) + T + n)],
                 "row " << b << " token " << n);
  // Step by step: the same tokens.
  expect_ok([&](tessera_error** e) { return tessera_generator_prefill(g, p.data(), T, e); });
  BOOST_TEST(tessera_generator_position(g) == T);
  BOOST_TEST(tessera_generator_logits(g) != nullptr);
  std::vector<int64_t> step_tokens;
  for (int64_t n = 0; n < N; ++n) {
    int64_t next[2];
    expect_ok([&](tessera_error** e) { return tessera_generator_sample(g, next, e); });
    step_tokens.insert(step_tokens.end(), next, next + 2);
    if (n + 1 < N) expect_ok([&](tessera_error** e) { return tessera_generator_step(g, next, e); });
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < B; ++b)
      BOOST_TEST(step_tokens[static_cast<size_t>(n * B + b)] ==
                 got[static_cast<size_t>(b * N + n)]);
  // In pieces: the prompt's first 5 ids, then the rest of it and PyTorch's first 40 tokens
  // appended (51 positions: passes of 16 rows over the cache), then greedy steps: PyTorch's
  // continuation from there on.
  constexpr int64_t kFirst = 5, kGiven = 40;
  std::vector<int64_t> head, rest;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T + kGiven; ++t)
      (t < kFirst ? head : rest).push_back(want[static_cast<size_t>(b * (T + N) + t)]);
  expect_ok(
      [&](tessera_error** e) { return tessera_generator_prefill(g, head.data(), kFirst, e); });
  expect_ok([&](tessera_error** e) {
    return tessera_generator_append(g, rest.data(), T + kGiven - kFirst, e);
  });
  BOOST_TEST(tessera_generator_position(g) == T + kGiven);
  for (int64_t n = kGiven; n < N; ++n) {
    int64_t next[2];
    expect_ok([&](tessera_error** e) { return tessera_generator_sample(g, next, e); });
    for (int64_t b = 0; b < B; ++b)
      BOOST_TEST(next[b] == want[static_cast<size_t>(b * (T + N) + T + n)],
                 "appended: row " << b << " token " << n);
    if (n + 1 < N) expect_ok([&](tessera_error** e) { return tessera_generator_step(g, next, e); });
  }
  tessera_generator_reset(g);
  BOOST_TEST(tessera_generator_position(g) == 0);
  BOOST_TEST(tessera_generator_logits(g) == nullptr);
  tessera_generator_free(g);  // frees the model too (ASan would see a leak or a double free)
  tessera_tensor_free(prompt);
  tessera_tensor_free(expected);
}

// Generators on 6 threads at once over one model, each seed sampled twice on its thread: every
// run equals that seed's run on the main thread.
BOOST_AUTO_TEST_CASE(generators_on_many_threads_match_single_threaded) {
  constexpr int kThreads = 6;
  constexpr int64_t kNew = 40;
  tessera_model* model = load(kFortunes + "fortunes.safetensors");
  const std::vector<int64_t> prompt = {37, 10, 84, 104, 101, 32};  // "%\nThe "
  auto sample_run = [&](uint64_t seed) {
    tessera_generator* g = make_generator(model, 1, 64, 0.9, 20, 0.95, seed);
    std::vector<int64_t> out(kNew);
    tessera_error* error = nullptr;
    if (tessera_generator_generate(g, prompt.data(), 6, kNew, out.data(), &error) != TESSERA_OK) {
      out.assign(1, -1);
      tessera_error_free(error);
    }
    tessera_generator_free(g);
    return out;
  };
  std::vector<std::vector<int64_t>> reference;
  for (int t = 0; t < kThreads; ++t) reference.push_back(sample_run(100 + t));
  BOOST_TEST(reference[0] != reference[1], "two seeds drew the same 40 tokens");
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 2; ++r)
        if (sample_run(100 + t) != reference[static_cast<size_t>(t)]) ++mismatches[t];
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) BOOST_TEST(mismatches[t] == 0, "thread " << t);
  tessera_model_free(model);
}

BOOST_AUTO_TEST_CASE(generation_errors) {
  tessera_model* model = load(kFortunes + "fortunes.safetensors");
  tessera_generator* g = nullptr;
  int64_t context = 0;
  expect_error(TESSERA_E_ARG, "model is NULL",
               [&](tessera_error** e) { return tessera_model_context(nullptr, &context, e); });
  expect_error(TESSERA_E_ARG, "generator is NULL", [&](tessera_error** e) {
    return tessera_generator_create(model, 1, 0, 0.0, 0, 1.0, 0, nullptr, e);
  });
  expect_error(TESSERA_E_ARG, "top_p", [&](tessera_error** e) {
    return tessera_generator_create(model, 1, 0, 0.0, 0, 1.5, 0, &g, e);
  });
  expect_error(TESSERA_E_ARG, "temperature", [&](tessera_error** e) {
    return tessera_generator_create(model, 1, 0, -1.0, 0, 1.0, 0, &g, e);
  });
  expect_error(TESSERA_E_ARG, "top_k", [&](tessera_error** e) {
    return tessera_generator_create(model, 1, 0, 1.0, -2, 1.0, 0, &g, e);
  });
  expect_error(TESSERA_E_ARG, "batch=0", [&](tessera_error** e) {
    return tessera_generator_create(model, 0, 0, 0.0, 0, 1.0, 0, &g, e);
  });
  expect_error(TESSERA_E_SHAPE, "more than the network's context of 256", [&](tessera_error** e) {
    return tessera_generator_create(model, 1, 257, 0.0, 0, 1.0, 0, &g, e);
  });
  BOOST_TEST(g == nullptr);

  g = make_generator(model, 1, 8);
  int64_t token = 0;
  expect_error(TESSERA_E_ARG, "no prompt has run yet",
               [&](tessera_error** e) { return tessera_generator_step(g, &token, e); });
  expect_error(TESSERA_E_ARG, "no prompt has run yet",
               [&](tessera_error** e) { return tessera_generator_sample(g, &token, e); });
  const int64_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  expect_error(TESSERA_E_SHAPE, "9 positions are more than the session's capacity of 8",
               [&](tessera_error** e) { return tessera_generator_prefill(g, ids, 9, e); });
  expect_error(TESSERA_E_SHAPE, "length=0",
               [&](tessera_error** e) { return tessera_generator_prefill(g, ids, 0, e); });
  const int64_t bad[2] = {5, 128};
  expect_error(TESSERA_E_SHAPE, "id 128",
               [&](tessera_error** e) { return tessera_generator_prefill(g, bad, 2, e); });
  expect_error(TESSERA_E_SHAPE, "a prompt of 3 and 6 new tokens make 9 positions",
               [&](tessera_error** e) {
                 int64_t out[6];
                 return tessera_generator_generate(g, ids, 3, 6, out, e);
               });
  expect_error(TESSERA_E_ARG, "ids is NULL",
               [&](tessera_error** e) { return tessera_generator_append(g, nullptr, 2, e); });
  expect_error(TESSERA_E_SHAPE, "length=0",
               [&](tessera_error** e) { return tessera_generator_append(g, ids, 0, e); });
  expect_ok([&](tessera_error** e) { return tessera_generator_prefill(g, ids, 6, e); });
  expect_error(TESSERA_E_SHAPE, "6 positions so far and 3 more pass the capacity of 8",
               [&](tessera_error** e) { return tessera_generator_append(g, ids, 3, e); });
  BOOST_TEST(tessera_generator_position(g) == 6);
  expect_ok([&](tessera_error** e) { return tessera_generator_append(g, ids, 2, e); });
  expect_error(TESSERA_E_SHAPE, "pass the capacity of 8",
               [&](tessera_error** e) { return tessera_generator_step(g, &token, e); });
  tessera_generator_free(g);
  tessera_generator_free(nullptr);
  tessera_generator_reset(nullptr);
  BOOST_TEST(tessera_generator_logits(nullptr) == nullptr);

  // A model that cannot generate: the encoder example (float input, no causal attention).
  tessera_model* encoder = load(kEncoder + "encoder.safetensors");
  expect_error(TESSERA_E_ARG, "need int64 ids [B, T] with T a symbol",
               [&](tessera_error** e) { return tessera_model_context(encoder, &context, e); });
  expect_error(TESSERA_E_ARG, "int64 ids [B, T]", [&](tessera_error** e) {
    return tessera_generator_create(encoder, 1, 8, 0.0, 0, 1.0, 0, &g, e);
  });
  tessera_model_free(encoder);
  tessera_model_free(model);
}

BOOST_AUTO_TEST_SUITE_END()
