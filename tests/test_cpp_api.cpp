// The public C++ wrapper (include/tessera/tessera.hpp) as a C++ program meets it: RAII handles
// over the C API, failures as tessera::Error with the C code. Only the public header is
// included (the wrapper's classes live in tessera::v0, apart from the library's own).
#include <boost/test/unit_test.hpp>
#include <optional>
#include <string>
#include <tessera/tessera.hpp>
#include <utility>
#include <vector>

namespace {

const std::string kEncoder = std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/";

std::string bytes_of(const tessera::Tensor& t) {
  return std::string(static_cast<const char*>(t.data()), t.nbytes());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cpp_api)

BOOST_AUTO_TEST_CASE(load_describe_run) {
  BOOST_TEST(tessera::version() == TESSERA_VERSION_STRING);
  const tessera::Model model = tessera::Model::load(kEncoder + "encoder.safetensors");
  const std::vector<tessera::ValueInfo> in = model.inputs();
  BOOST_TEST_REQUIRE(in.size() == 1u);
  BOOST_TEST(in[0].name == "x");
  BOOST_TEST(in[0].dtype == TESSERA_F32);
  BOOST_TEST_REQUIRE(in[0].shape.size() == 3u);
  BOOST_TEST(in[0].shape[0].symbol == "B");
  BOOST_TEST(in[0].shape[1].symbol == "T");
  BOOST_TEST(in[0].shape[2].size == 64);
  BOOST_TEST(in[0].shape[2].symbol.empty());
  BOOST_TEST(model.outputs().at(0).name == "y");

  const tessera::Tensor x = tessera::Tensor::read(kEncoder + "input.safetensors", "x");
  std::vector<tessera::Tensor> y = model.run({&x});
  BOOST_TEST_REQUIRE(y.size() == 1u);
  BOOST_TEST(y[0].shape() == std::vector<int64_t>({2, 16, 64}));
  BOOST_TEST(y[0].dtype() == TESSERA_F32);
  BOOST_TEST(y[0].data<float>() == y[0].data());
  BOOST_CHECK_THROW(y[0].data<double>(), tessera::Error);

  // Into a caller-owned buffer: the same bits.
  std::vector<float> buffer(2 * 16 * 64);
  tessera::Tensor mine = tessera::Tensor::wrap(buffer.data(), {2, 16, 64});
  model.run({&x}, {&mine});
  BOOST_TEST(mine.data() == static_cast<void*>(buffer.data()));
  BOOST_TEST(bytes_of(mine) == bytes_of(y[0]));

  // Handles move; the moved-from one is empty.
  tessera::Tensor moved = std::move(y[0]);
  BOOST_TEST(!y[0]);
  BOOST_TEST(static_cast<bool>(moved));
  BOOST_TEST(y[0].nbytes() == 0u);
}

BOOST_AUTO_TEST_CASE(failures_throw_with_the_c_code) {
  try {
    tessera::Model::load(kEncoder + "no-such-file.safetensors");
    BOOST_FAIL("loading a missing file did not throw");
  } catch (const tessera::Error& e) {
    BOOST_TEST(e.code() == TESSERA_E_IO);
    BOOST_TEST(std::string(e.what()).starts_with("E_IO: "), e.what());
  }
  const tessera::Model model = tessera::Model::load(kEncoder + "encoder.safetensors");
  std::vector<float> buffer(2 * 16 * 32);
  const tessera::Tensor narrow = tessera::Tensor::wrap(buffer.data(), {2, 16, 32});
  try {
    model.run({&narrow});
    BOOST_FAIL("a wrong shape did not throw");
  } catch (const tessera::Error& e) {
    BOOST_TEST(e.code() == TESSERA_E_SHAPE);
  }
  tessera::Tensor slot;
  try {
    model.run({&narrow}, {&slot});
    BOOST_FAIL("a wrong shape did not throw");
  } catch (const tessera::Error& e) {
    BOOST_TEST(e.code() == TESSERA_E_SHAPE);
  }
  BOOST_TEST(!slot);  // a failed run leaves the slot empty
  BOOST_CHECK_THROW(model.run({&narrow}, {nullptr}), tessera::Error);
  BOOST_CHECK_THROW(tessera::set_num_threads(-2), tessera::Error);
}

// Generator: greedy generation of the shipped fortunes model equals PyTorch's (its
// greedy.safetensors), step by step equals generate(), and the generator outlives the Model
// object it came from.
BOOST_AUTO_TEST_CASE(generator_matches_pytorch_and_outlives_its_model) {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/examples/fortunes/";
  const tessera::Tensor prompt = tessera::Tensor::read(dir + "prompt.safetensors", "ids");
  const tessera::Tensor expected = tessera::Tensor::read(dir + "greedy.safetensors", "ids");
  const int64_t B = prompt.shape()[0], T = prompt.shape()[1], N = expected.shape()[1] - T;
  const int64_t* p = prompt.data<int64_t>();
  const std::vector<int64_t> ids(p, p + B * T);
  std::optional<tessera::Generator> gen;
  {
    const tessera::Model model = tessera::Model::load(dir + "fortunes.safetensors");
    gen.emplace(model, B);  // capacity: the model's context
  }
  BOOST_TEST(gen->capacity() == 256);
  const std::vector<std::vector<int64_t>> rows = gen->generate(ids, N);
  BOOST_TEST_REQUIRE(rows.size() == static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* want = expected.data<int64_t>() + b * (T + N) + T;
    BOOST_TEST(rows[static_cast<size_t>(b)] == std::vector<int64_t>(want, want + N),
               boost::test_tools::per_element());
  }
  gen->prefill(ids);
  for (int64_t n = 0; n < 5; ++n) {
    const std::vector<int64_t> next = gen->sample();
    for (int64_t b = 0; b < B; ++b)
      BOOST_TEST(next[static_cast<size_t>(b)] ==
                 rows[static_cast<size_t>(b)][static_cast<size_t>(n)]);
    gen->step(next);
  }
  // The first 10 tokens appended to the prompt in one call: the 11th is PyTorch's.
  std::vector<int64_t> given;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < 10; ++n)
      given.push_back(rows[static_cast<size_t>(b)][static_cast<size_t>(n)]);
  gen->prefill(ids);
  gen->append(given);
  BOOST_TEST(gen->position() == T + 10);
  const std::vector<int64_t> eleventh = gen->sample();
  for (int64_t b = 0; b < B; ++b)
    BOOST_TEST(eleventh[static_cast<size_t>(b)] == rows[static_cast<size_t>(b)][10]);
  BOOST_CHECK_THROW(gen->append({1, 2, 3}), tessera::Error);  // not 2 equal rows
  BOOST_CHECK_THROW(gen->step({1}), tessera::Error);  // one token for a batch of 2
  try {
    gen->prefill({1, 2, 3});  // 3 ids are not 2 equal rows
    BOOST_ERROR("no error");
  } catch (const tessera::Error& e) {
    BOOST_TEST(e.code() == TESSERA_E_ARG);
  }
}

BOOST_AUTO_TEST_SUITE_END()
