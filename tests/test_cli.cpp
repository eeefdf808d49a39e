// The tessera command line as a user meets it (shared/docs/interfaces.md §3): the built binary
// is run in a child process and its stdout, stderr and exit status are checked, for every
// command, every error code and both failure exit statuses. Every committed example is run and
// compared with its expected output.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/random.h"
#include "io/safetensors.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct Result {
  int status = -1;  // exit status; -1 when the child did not exit normally
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `binary` with `args`; stdout and stderr land in files, read back after the exit.
Result run_binary(const std::string& binary, const std::vector<std::string>& args) {
  const fs::path dir = fs::temp_directory_path();
  const std::string out_path = (dir / ("tessera_cli_out_" + std::to_string(getpid()))).string();
  const std::string err_path = (dir / ("tessera_cli_err_" + std::to_string(getpid()))).string();
  const pid_t pid = fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) _exit(127);
    dup2(o, STDOUT_FILENO);
    dup2(e, STDERR_FILENO);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  int wstatus = 0;
  BOOST_REQUIRE(waitpid(pid, &wstatus, 0) == pid);
  Result r;
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  fs::remove(out_path);
  fs::remove(err_path);
  return r;
}

Result cli_run(const std::vector<std::string>& args) { return run_binary(TESSERA_CLI, args); }

const std::string kSource = TESSERA_SOURCE_DIR;

// A failed command: exit 2 (or 1), nothing on stdout, and exactly one stderr line that starts
// with "tessera: error: E_CODE: " and contains `text`.
void expect_failure(const Result& r, const std::string& code, const std::string& text,
                    int status = 2) {
  BOOST_TEST(r.status == status, "stderr: " << r.err);
  BOOST_TEST(r.out.empty(), "stdout: " << r.out);
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, "stderr: " << r.err);
  BOOST_TEST(r.err.starts_with("tessera: error: " + code + ": "), "stderr: " << r.err);
  BOOST_TEST(r.err.find(text) != std::string::npos, "'" << r.err << "' lacks '" << text << "'");
}

// A scratch directory for one test case, removed afterwards.
struct Scratch {
  fs::path dir;
  Scratch() {
    std::string tmpl = (fs::temp_directory_path() / "tessera_cli_XXXXXX").string();
    BOOST_REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
};

void save(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  save_safetensors(path, tensors);
}

Tensor randn(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return Tensor::randn(shape, gen);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE(a.shape() == b.shape());
  const auto av = a.to_double_vector(), bv = b.to_double_vector();
  double m = 0;
  for (size_t i = 0; i < av.size(); ++i) m = std::max(m, std::abs(av[i] - bv[i]));
  return m;
}

const std::string kExample1 = kSource + "/examples/spec/example1.json";
const std::string kEncoder = kSource + "/examples/encoder/encoder.safetensors";
const std::string kEncoderJson = kSource + "/examples/encoder/encoder.json";
const std::string kEncoderInput = kSource + "/examples/encoder/input.safetensors";
const std::string kEncoderExpected = kSource + "/examples/encoder/expected.safetensors";

}  // namespace

BOOST_AUTO_TEST_SUITE(cli)

// ---------------------------------------------------------------- help, version, usage errors

BOOST_AUTO_TEST_CASE(help_and_version) {
  Result r = cli_run({"--help"});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.starts_with("usage: tessera <command>"));
  BOOST_TEST(r.err.empty());
  for (const char* cmd : {"run", "summary", "inspect", "bench"}) {
    r = cli_run({cmd, "--help"});
    BOOST_TEST(r.status == 0, cmd);
    BOOST_TEST(r.out.find(std::string("tessera ") + cmd) != std::string::npos, r.out);
    BOOST_TEST(r.err.empty());
  }
  BOOST_TEST(cli_run({"run", "--help"}).out.find("--non-strict") != std::string::npos);
  BOOST_TEST(cli_run({"bench", "--help"}).out.find("--warmup") != std::string::npos);
  r = cli_run({"--version"});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.starts_with("tessera "));
  BOOST_TEST(r.out.size() > 9u);
  BOOST_TEST(std::count(r.out.begin(), r.out.end(), '\n') == 1);
}

BOOST_AUTO_TEST_CASE(bad_command_lines_are_arg_errors) {
  expect_failure(cli_run({}), "E_ARG", "tessera: no command given");
  expect_failure(cli_run({"train"}), "E_ARG", "unknown command 'train'");
  expect_failure(cli_run({"run", kExample1, "--frobnicate"}), "E_ARG", "run: ");
  expect_failure(cli_run({"run", kExample1, "--output", "o.safetensors"}), "E_ARG",
                 "run: missing --input IN.safetensors");
  expect_failure(cli_run({"run", "--input", "a", "--output", "b"}), "E_ARG", "missing NET");
  expect_failure(cli_run({"summary", kExample1, "extra"}), "E_ARG", "unexpected argument 'extra'");
  expect_failure(cli_run({"run", kExample1, "--input", "i", "--output", "o", "--threads", "0"}),
                 "E_ARG", "--threads: '0' is not an integer in [1, 4096]");
  expect_failure(cli_run({"bench", kExample1, "--reps", "x"}), "E_ARG", "--reps: 'x'");
  expect_failure(cli_run({"summary", kExample1, "--shape", "x2,8,32"}), "E_ARG",
                 "--shape: 'x2,8,32' is not NAME=D0,D1,...");
  expect_failure(cli_run({"summary", kExample1, "--shape", "x=2,,32"}), "E_ARG",
                 "'' is not a dimension");
  expect_failure(cli_run({"summary", kExample1, "--shape", "q=2,8,32"}), "E_ARG",
                 "'q' is not a network input (inputs: x)");
}

// ---------------------------------------------------------------- summary

BOOST_AUTO_TEST_CASE(summary_prints_the_contract_format) {
  Result r = cli_run({"summary", kExample1});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.err.empty());
  BOOST_TEST(r.out ==
             "Network: [B, 8, 32] -> [B, 8, 32] dtype=float32\n"
             "index  name  operation  input shapes  output shapes\n"
             "0      n0    attention  x=[B, 8, 32]  out=[B, 8, 32]\n"
             "Parameters: 4,224\n");
  r = cli_run({"summary", kExample1, "--shape", "x=3,8,32"});
  BOOST_TEST(r.out.starts_with("Network: [3, 8, 32] -> [3, 8, 32] dtype=float32\n"));
  // A checkpoint carrying its network is a NET too.
  r = cli_run({"summary", kEncoder, "--shape", "x=2,16,64"});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.starts_with("Network: [2, 16, 64] -> [2, 16, 64] dtype=float32\n"));
  BOOST_TEST(r.out.ends_with("Parameters: 100,096\n"));
}

// ---------------------------------------------------------------- every error code

BOOST_AUTO_TEST_CASE(every_error_code_and_exit_status) {
  Scratch s;
  auto net = [&](const std::string& name, const std::string& op, const std::string& args,
                 const std::string& shape = R"(["B", 8, 32])",
                 const std::string& dtype = "float32") {
    return s.write(name, R"({"dtype": ")" + dtype + R"(", "inputs": {"x": )" + shape +
                             R"(}, "nodes": [{"name": "n0", "op": ")" + op + R"(", "args": )" +
                             args + R"(, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})");
  };
  const std::string good = net("good.json", "attention", R"({"heads": 4})");
  const std::string in_path = s.path("in.safetensors");
  save(in_path, {{"x", randn({2, 8, 32}, 1)}});

  // E_CONSTRAINT: interfaces.md §3's example, verbatim.
  Result r = cli_run({"summary", net("c.json", "attention", R"({"heads": 3})")});
  expect_failure(r, "E_CONSTRAINT", "");
  BOOST_TEST(r.err == "tessera: error: E_CONSTRAINT: n0 (attention): heads=3 must divide D=32\n");
  // E_SHAPE: an input that does not fit.
  const std::string bad_shape = s.path("bad_shape.safetensors");
  save(bad_shape, {{"x", randn({2, 9, 32}, 1)}});
  expect_failure(cli_run({"run", good, "--input", bad_shape, "--output", s.path("o.safetensors")}),
                 "E_SHAPE", "input x: shape [2, 9, 32] does not fit [B, 8, 32]");
  // E_DTYPE: an integer input.
  const std::string ints = s.path("ints.safetensors");
  save(ints, {{"x", Tensor::zeros({2, 8, 32}, DType::I32)}});
  expect_failure(cli_run({"run", good, "--input", ints, "--output", s.path("o.safetensors")}),
                 "E_DTYPE", "input x: dtype I32 is not accepted");
  // E_ARG: unknown op; an input file lacking an input or carrying an extra tensor.
  expect_failure(cli_run({"summary", net("u.json", "teleport", "{}")}), "E_ARG",
                 "n0 (teleport): unknown op 'teleport'");
  const std::string extra = s.path("extra.safetensors");
  save(extra, {{"x", randn({2, 8, 32}, 1)}, {"mask", randn({2}, 2)}});
  expect_failure(cli_run({"run", good, "--input", extra, "--output", s.path("o.safetensors")}),
                 "E_ARG", extra + ": tensor mask is not a network input (network inputs: x)");
  const std::string none = s.path("none.safetensors");
  save(none, {{"z", randn({2}, 2)}});
  expect_failure(cli_run({"run", good, "--input", none, "--output", s.path("o.safetensors")}),
                 "E_ARG", none + ": missing network input x; tensor z is not a network input");
  // E_WEIGHTS: every offending key in one line.
  const std::string w = s.path("w.safetensors");
  save(w, {{"n0.q_proj.weight", randn({32, 32}, 3)},
           {"n0.k_proj.weight", randn({32, 31}, 4)},
           {"n0.extra", randn({1}, 5)}});
  expect_failure(cli_run({"run", good, "--weights", w, "--input", in_path, "--output",
                          s.path("o.safetensors")}),
                 "E_WEIGHTS",
                 w + ": missing: n0.q_proj.bias, n0.k_proj.bias, n0.v_proj.weight, "
                     "n0.v_proj.bias, n0.o_proj.weight, n0.o_proj.bias; unexpected: n0.extra; "
                     "mis-shaped: n0.k_proj.weight (expected [32, 32], got [32, 31])");
  // E_FORMAT: JSON and safetensors, naming the file.
  const std::string broken = s.write("broken.json", R"({"inputs": {"x": [1]}, "nodes": [)");
  expect_failure(cli_run({"summary", broken}), "E_FORMAT", broken + ": not valid JSON");
  const std::string junk =
      s.write("junk.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
  expect_failure(cli_run({"inspect", junk}), "E_FORMAT", junk + ": ");
  expect_failure(cli_run({"run", good, "--input", junk, "--output", s.path("o.safetensors")}),
                 "E_FORMAT", junk + ": ");
  // E_IO: a missing file, an output directory that does not exist.
  expect_failure(cli_run({"summary", s.path("missing.json")}), "E_IO",
                 s.path("missing.json") + ": cannot open");
  expect_failure(
      cli_run({"run", good, "--input", in_path, "--output", s.path("no/dir/o.safetensors")}),
      "E_IO", "");
  // E_UNSUPPORTED: a plan dtype tessera does not compute in.
  expect_failure(cli_run({"summary", net("h.json", "gelu", "{}", "[2, 4]", "float16")}),
                 "E_UNSUPPORTED", "dtype=float16 is not supported");
  // Exit 1: an internal failure. 10^12 x 8 x 32 floats (10^15 bytes) exceed any address space
  // here: with the memory budget raised past them (16 PiB; by default the plan refuses them with
  // E_SHAPE, as memory_budget_errors_are_shape_errors checks), allocating the buffers fails.
  setenv("TESSERA_MEMORY_BUDGET", "16384T", 1);
  expect_failure(cli_run({"bench", good, "--shape", "x=1000000000000,8,32", "--reps", "1"}),
                 "E_INTERNAL", "out of memory", 1);
  unsetenv("TESSERA_MEMORY_BUDGET");
  BOOST_TEST(!fs::exists(s.path("o.safetensors")));
}

// ---------------------------------------------------------------- run

BOOST_AUTO_TEST_CASE(every_example_matches_its_expected_output) {
  // Each examples/<name>/ with an expected.safetensors holds <name>.safetensors (a checkpoint
  // carrying its network), input.safetensors and, optionally, <name>.json (the same network).
  // Tolerance: float32 against PyTorch's float32 forward, max |ours - torch| <= 1e-4; the
  // encoder's outputs are O(1) (max 3.4), so this is ~3e-5 relative; observed ~1e-6.
  Scratch s;
  int examples = 0;
  for (const auto& entry : fs::directory_iterator(kSource + "/examples")) {
    const fs::path dir = entry.path();
    if (!fs::exists(dir / "expected.safetensors")) continue;
    const std::string name = dir.filename().string();
    const std::string ckpt = (dir / (name + ".safetensors")).string();
    const std::string input = (dir / "input.safetensors").string();
    std::vector<std::vector<std::string>> runs = {{"run", ckpt, "--input", input}};
    if (fs::exists(dir / (name + ".json")))
      runs.push_back(
          {"run", (dir / (name + ".json")).string(), "--weights", ckpt, "--input", input});
    for (auto args : runs) {
      const std::string out = s.path(name + "_out.safetensors");
      args.insert(args.end(), {"--output", out});
      const Result r = cli_run(args);
      BOOST_TEST(r.status == 0, args[1] << ": " << r.err);
      BOOST_TEST(r.out.empty());
      BOOST_TEST(r.err.empty(), r.err);
      const SafetensorsFile got = SafetensorsFile::open(out);
      const SafetensorsFile want = SafetensorsFile::open((dir / "expected.safetensors").string());
      BOOST_TEST(got.names() == want.names());
      for (const std::string& t : want.names()) {
        BOOST_TEST(got.info(t).dtype_name == "F32");
        BOOST_TEST(max_abs_diff(got.tensor(t), want.tensor(t)) <= 1e-4, name << "/" << t);
      }
      // tessera-compare agrees (this is what scripts/run_example.sh shows).
      const Result c = run_binary(TESSERA_COMPARE, {out, (dir / "expected.safetensors").string()});
      BOOST_TEST(c.status == 0, c.out);
      BOOST_TEST(c.out.find(": match") != std::string::npos);
      ++examples;
    }
  }
  BOOST_TEST(examples >= 2);
}

BOOST_AUTO_TEST_CASE(run_options_threads_dtypes_and_random_init) {
  Scratch s;
  const std::string out1 = s.path("o1.safetensors"), out2 = s.path("o2.safetensors");
  Result r =
      cli_run({"run", kEncoder, "--input", kEncoderInput, "--output", out1, "--threads", "1"});
  BOOST_TEST(r.status == 0, r.err);
  // Float16 input: converted; the result is that of the float32 values it holds.
  const Tensor x16 = SafetensorsFile::open(kEncoderInput).tensor("x").to(DType::F16);
  const std::string in16 = s.path("in16.safetensors"), in32 = s.path("in32.safetensors");
  save(in16, {{"x", x16}});
  save(in32, {{"x", x16.to(DType::F32)}});
  BOOST_TEST(cli_run({"run", kEncoder, "--input", in16, "--output", out1}).status == 0);
  BOOST_TEST(cli_run({"run", kEncoder, "--input", in32, "--output", out2}).status == 0);
  BOOST_TEST(max_abs_diff(SafetensorsFile::open(out1).tensor("y"),
                          SafetensorsFile::open(out2).tensor("y")) == 0.0);

  // No weights anywhere: random init from --seed, with a warning; the seed decides the result.
  const std::string in = s.path("in.safetensors");
  save(in, {{"x", randn({2, 8, 32}, 1)}});
  r = cli_run({"run", kExample1, "--input", in, "--output", out1, "--seed", "5"});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.err == "tessera: warning: no weights given (no --weights, none stored in " +
                          kExample1 + "): parameters initialised randomly from --seed 5\n");
  BOOST_TEST(cli_run({"run", kExample1, "--input", in, "--output", out2, "--seed", "5"}).status ==
             0);
  BOOST_TEST(max_abs_diff(SafetensorsFile::open(out1).tensor("y"),
                          SafetensorsFile::open(out2).tensor("y")) == 0.0);
  BOOST_TEST(cli_run({"run", kExample1, "--input", in, "--output", out2, "--seed", "6"}).status ==
             0);
  BOOST_TEST(max_abs_diff(SafetensorsFile::open(out1).tensor("y"),
                          SafetensorsFile::open(out2).tensor("y")) > 0.0);
}

BOOST_AUTO_TEST_CASE(non_strict_weights_warn_and_failures_print_only_the_error) {
  Scratch s;
  // The encoder's weights without b1_fc2.bias and with one stray key.
  std::map<std::string, Tensor> state = SafetensorsFile::open(kEncoder).tensors();
  std::map<std::string, Tensor> partial;
  for (const auto& [k, v] : state)
    if (k != "b1_fc2.bias") partial.emplace(k, v.clone());
  partial.emplace("head.weight", randn({2}, 1));
  const std::string w = s.path("partial.safetensors");
  save_safetensors(w, partial);
  const std::string out = s.path("o.safetensors");
  Result r =
      cli_run({"run", kEncoderJson, "--weights", w, "--input", kEncoderInput, "--output", out});
  expect_failure(r, "E_WEIGHTS", w + ": missing: b1_fc2.bias; unexpected: head.weight");
  r = cli_run({"run", kEncoderJson, "--weights", w, "--input", kEncoderInput, "--output", out,
               "--non-strict"});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.err == "tessera: warning: " + w +
                          ": missing weights initialised from --seed 0: b1_fc2.bias\n"
                          "tessera: warning: " +
                          w + ": unexpected weights ignored: head.weight\n");
  BOOST_TEST(SafetensorsFile::open(out).tensor("y").shape() == (Shape{2, 16, 64}));
  // Non-strict still refuses a mis-shaped weight.
  partial["b0_fc1.bias"] = randn({255}, 2);
  save_safetensors(w, partial);
  expect_failure(cli_run({"run", kEncoderJson, "--weights", w, "--input", kEncoderInput, "--output",
                          out, "--non-strict"}),
                 "E_WEIGHTS", "mis-shaped: b0_fc1.bias (expected [256], got [255])");
  // A run that would warn but then fails prints its error line only.
  const std::string bad = s.path("bad.safetensors");
  save(bad, {{"x", randn({2, 16, 63}, 1)}});
  expect_failure(cli_run({"run", kExample1, "--input", bad, "--output", out}), "E_SHAPE",
                 "input x: shape [2, 16, 63] does not fit [B, 8, 32]");
}

BOOST_AUTO_TEST_CASE(failed_runs_leave_existing_output_intact) {
  Scratch s;
  const std::string out = s.path("o.safetensors");
  const std::string precious = "previous contents of the output file";
  s.write("o.safetensors", precious);
  const std::string bad = s.path("bad.safetensors");
  save(bad, {{"x", randn({2, 16, 63}, 1)}});
  expect_failure(cli_run({"run", kEncoder, "--input", bad, "--output", out}), "E_SHAPE", "");
  expect_failure(cli_run({"run", kEncoder, "--weights", s.path("nope.safetensors"), "--input",
                          kEncoderInput, "--output", out}),
                 "E_IO", "");
  BOOST_TEST(slurp(out) == precious);
  // A successful run replaces it whole, leaving no temporary file behind.
  BOOST_TEST(cli_run({"run", kEncoder, "--input", kEncoderInput, "--output", out}).status == 0);
  BOOST_TEST(SafetensorsFile::open(out).names() == std::vector<std::string>{"y"});
  int files = 0;
  for (const auto& e : fs::directory_iterator(s.dir)) files += e.is_regular_file() ? 1 : 0;
  BOOST_TEST(files == 2);  // bad.safetensors and o.safetensors
}

// ---------------------------------------------------------------- inspect and bench

// --panel-cache DIR: the first load writes the checkpoint's packed projections there, later ones
// map them; outputs are the same bytes with and without. An unwritable DIR is a warning only.
BOOST_AUTO_TEST_CASE(panel_cache_keeps_results_and_only_warns_when_unwritable) {
  Scratch s;
  const std::string cache = s.path("cache");
  std::vector<std::string> outputs;
  const char* const names[] = {"o0.safetensors", "o1.safetensors", "o2.safetensors"};
  for (const bool cached : {false, true, true}) {
    outputs.push_back(s.path(names[outputs.size()]));
    std::vector<std::string> args = {"run", kEncoder, "--input", kEncoderInput, "--output",
                                     outputs.back()};
    if (cached) args.insert(args.end(), {"--panel-cache", cache});
    const Result r = cli_run(args);
    BOOST_TEST(r.status == 0, r.err);
    BOOST_TEST(r.err.empty(), r.err);
  }
  int files = 0;
  for (const auto& entry : fs::directory_iterator(cache))
    files += entry.path().extension() == ".tpanels" ? 1 : 0;
  BOOST_TEST(files == 1);
  BOOST_TEST(slurp(outputs[1]) == slurp(outputs[0]));
  BOOST_TEST(slurp(outputs[2]) == slurp(outputs[0]));
  const Result bench = cli_run({"bench", kEncoder, "--shape", "x=2,16,64", "--warmup", "0",
                                "--reps", "1", "--json", "--panel-cache", cache});
  BOOST_TEST(bench.status == 0, bench.err);
  BOOST_TEST(bench.err.empty(), bench.err);

  const std::string not_a_dir = s.write("not_a_dir", "x");
  const Result r = cli_run({"run", kEncoder, "--input", kEncoderInput, "--output",
                            s.path("o3.safetensors"), "--panel-cache", not_a_dir});
  BOOST_TEST(r.status == 0, r.err);
  BOOST_TEST(r.err.starts_with("tessera: warning: panel cache not written, the next load packs "
                               "again: E_IO: "), r.err);
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, r.err);
  BOOST_TEST(slurp(s.path("o3.safetensors")) == slurp(outputs[0]));
}

BOOST_AUTO_TEST_CASE(inspect_lists_tensors_and_metadata) {
  const Result r = cli_run({"inspect", kEncoder});
  BOOST_TEST(r.status == 0, r.err);
  BOOST_TEST(r.out.find("tensors: 34\n") != std::string::npos);
  // name, dtype, shape, bytes: 64 * 256 floats.
  BOOST_TEST(r.out.find("b0_fc1.weight          F32    [256, 64]  65,536\n") != std::string::npos,
             r.out);
  BOOST_TEST(r.out.find("metadata: 2\nformat: pt\ntessera.network: {") != std::string::npos);
}

// TESSERA_HWY_TARGET narrows the kernels to one target: SCALAR is compiled into every build and
// runs on every CPU; a name that is not a compiled target is E_ARG before anything runs.
BOOST_AUTO_TEST_CASE(simd_target_from_environment) {
  setenv("TESSERA_HWY_TARGET", "SCALAR", 1);
  Result r = cli_run({"bench", kEncoder, "--shape", "x=1,4,64", "--warmup", "0", "--reps", "1",
                      "--json"});
  unsetenv("TESSERA_HWY_TARGET");
  BOOST_TEST(r.status == 0, r.err);
  if (r.status == 0)
    BOOST_TEST(nlohmann::json::parse(r.out)["simd_target"].get<std::string>() == "SCALAR");
  setenv("TESSERA_HWY_TARGET", "AVX9", 1);
  r = cli_run({"bench", kEncoder, "--shape", "x=1,4,64"});
  unsetenv("TESSERA_HWY_TARGET");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.err.find("tessera: error: E_ARG: TESSERA_HWY_TARGET: target 'AVX9' is not "
                        "compiled in") == 0u,
             r.err);
}

BOOST_AUTO_TEST_CASE(bench_reports_times_and_json) {
  Result r = cli_run(
      {"bench", kEncoder, "--shape", "x=2,16,64", "--warmup", "1", "--reps", "3", "--json"});
  BOOST_TEST(r.status == 0, r.err);
  BOOST_TEST(r.err.empty(), r.err);  // stderr is not a terminal: no progress bar
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"median_ms", "min_ms", "max_ms", "gflops", "peak_rss_mb", "flops",
                          "load_ms", "first_run_ms"}) {
    BOOST_REQUIRE(j.contains(key));
    BOOST_TEST(j[key].get<double>() > 0.0, key);
  }
  BOOST_REQUIRE(j.contains("simd_target"));
  BOOST_TEST(!j["simd_target"].get<std::string>().empty());
  BOOST_TEST(j.size() == 9u);
  BOOST_TEST(j["min_ms"].get<double>() <= j["median_ms"].get<double>());
  BOOST_TEST(j["median_ms"].get<double>() <= j["max_ms"].get<double>());
  // GFLOP/s is the plan's FLOP count over the median time.
  const double rate = j["flops"].get<double>() / (j["median_ms"].get<double>() * 1e6);
  BOOST_TEST(std::abs(j["gflops"].get<double>() - rate) <= 1e-9 * rate);
  r = cli_run({"bench", kEncoder, "--shape", "x=2,16,64", "--warmup", "0", "--reps", "2",
               "--threads", "1"});
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.find("time: median ") != std::string::npos);
  BOOST_TEST(r.out.find("GFLOP/s") != std::string::npos);
  BOOST_TEST(r.out.find("peak RSS: ") != std::string::npos);
  expect_failure(cli_run({"bench", kEncoder}), "E_ARG",
                 "--shape: input x [B, T, 64] has open dims; give --shape x=D0,D1,...");
}

// --profile: one entry per node of the network, in its order, with the op's name; the nodes'
// FLOPs add up to the plan's (the op costs, counted node by node), times are positive except
// for an activation run inside its linear (the encoder's gelu: "fused_into" names the linear,
// which says "activation"; its FLOPs count there) and an add run inside the layer_norm after it
// ("fused_into" names the layer_norm, whose "summed" names the add). The text form adds the two
// tables.
BOOST_AUTO_TEST_CASE(bench_profiles_every_node) {
  Result r = cli_run({"bench", kEncoder, "--shape", "x=2,16,64", "--warmup", "0", "--reps", "2",
                      "--json", "--profile"});
  BOOST_TEST(r.status == 0, r.err);
  const auto j = nlohmann::json::parse(r.out);
  BOOST_REQUIRE(j.contains("profile"));
  std::ifstream net_file(kSource +
                         "/examples/encoder/encoder.json");  // the network inside kEncoder
  const nlohmann::json spec = nlohmann::json::parse(net_file);
  const auto& nodes = spec["nodes"];
  BOOST_REQUIRE(j["profile"].size() == nodes.size());
  double gflop = 0.0;
  int fused = 0, summed = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& p = j["profile"][i];
    BOOST_TEST(p["node"].get<std::string>() == nodes[i]["name"].get<std::string>());
    BOOST_TEST(p["op"].get<std::string>() == nodes[i]["op"].get<std::string>());
    if (p.contains("fused_into")) {
      ++fused;
      BOOST_TEST(p["ms"].get<double>() == 0.0);
      BOOST_TEST(p["gflop"].get<double>() == 0.0);
      const auto producer =
          std::find_if(j["profile"].begin(), j["profile"].end(),
                       [&](const auto& e) { return e["node"] == p["fused_into"]; });
      BOOST_TEST_REQUIRE((producer != j["profile"].end()));
      if (p["op"] == "add") {
        ++summed;
        BOOST_TEST((*producer)["op"].get<std::string>() == "layer_norm");
        BOOST_TEST((*producer)["summed"] == p["node"]);
      } else {
        BOOST_TEST((*producer)["op"].get<std::string>() == "linear");
        BOOST_TEST((*producer)["activation"].get<std::string>() == p["op"].get<std::string>());
      }
    } else {
      BOOST_TEST(p["ms"].get<double>() > 0.0);
    }
    gflop += p["gflop"].get<double>();
  }
  BOOST_TEST(fused >= 1);
  BOOST_TEST(summed >= 1);
  BOOST_TEST(std::abs(gflop * 1e9 - j["flops"].get<double>()) <= 1e-9 * j["flops"].get<double>());
  r = cli_run({"bench", kEncoder, "--shape", "x=2,16,64", "--warmup", "0", "--reps", "1",
               "--profile"});
  BOOST_TEST(r.status == 0, r.err);
  BOOST_TEST(r.out.find("profile: ") != std::string::npos);
  BOOST_TEST(r.out.find("slowest node") != std::string::npos);
  BOOST_TEST(r.out.find(nodes[0]["name"].get<std::string>()) != std::string::npos);
}

// ---------------------------------------------------------------- limits and file safety

// Memory the inputs would need beyond the budget (core/limits.h) is E_SHAPE before anything is
// allocated. Regression: bench made its random inputs before planning, so this shape died as
// "E_INTERNAL: out of memory" (exit 1) after trying to allocate 256 TB.
BOOST_AUTO_TEST_CASE(memory_budget_errors_are_shape_errors) {
  expect_failure(cli_run({"bench", kEncoder, "--shape", "x=1000000,1000000,64"}), "E_SHAPE",
                 "inputs: running the network on x=[1000000, 1000000, 64] needs ");
  Scratch s;
  const std::string out = s.path("o.safetensors");
  // TESSERA_MEMORY_BUDGET reaches the child. The encoder holds 100,096 parameters and, in each of
  // its two attention layers, packed q/k/v weights [192, 64] and bias [192]: 500,224 bytes.
  auto with_budget = [&](const char* budget) {
    setenv("TESSERA_MEMORY_BUDGET", budget, 1);
    const Result r = cli_run({"run", kEncoder, "--input", kEncoderInput, "--output", out});
    unsetenv("TESSERA_MEMORY_BUDGET");
    return r;
  };
  expect_failure(with_budget("256K"), "E_SHAPE",
                 "the model (parameters and precomputed tables) needs 488.50 KiB, over the "
                 "memory budget of 256.00 KiB");
  BOOST_TEST(with_budget("64M").status == 0);
  expect_failure(with_budget("lots"), "E_ARG",
                 "TESSERA_MEMORY_BUDGET: 'lots' is not a memory size");
  expect_failure(with_budget("0"), "E_ARG", "is not a memory size");
}

// `run` writes its output through a temporary file renamed over the target: killing it at any
// moment leaves the previous file whole, never a partial one under the final name.
BOOST_AUTO_TEST_CASE(sigkill_mid_run_leaves_the_previous_output_intact) {
  Scratch s;
  // Four 1024x1024 layers on [2048, 1024]: 17 GFLOP and an 8 MiB output, so the kill can land
  // while the output is being written (and fsync'ed).
  std::string nodes;
  for (int i = 0; i < 4; ++i)
    nodes += std::string(i ? "," : "") + R"({"name": "l)" + std::to_string(i) +
             R"(", "op": "linear", "args": {"out_features": 1024}, "inputs": {"x": ")" +
             (i ? std::string("l").append(std::to_string(i - 1)) : std::string("x")) + R"("}})";
  const std::string net = s.write("big.json", R"({"inputs": {"x": [2048, 1024]}, "nodes": [)" +
                                                  nodes + R"(], "outputs": {"y": "l3"}})");
  const std::string in = s.path("in.safetensors");
  save(in, {{"x", randn({2048, 1024}, 3)}});
  const std::string out = s.path("o.safetensors");
  const std::string precious = "previous contents of the output file";

  auto spawn = [&] {
    const pid_t pid = fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      execl(TESSERA_CLI, TESSERA_CLI, "run", net.c_str(), "--input", in.c_str(), "--output",
            out.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  };
  auto temp_exists = [&] {
    for (const auto& e : fs::directory_iterator(s.dir))
      if (e.path().filename().string().starts_with("o.safetensors.tmp.")) return true;
    return false;
  };
  auto kill_and_reap = [](pid_t pid) {
    kill(pid, SIGKILL);
    int status = 0;
    BOOST_REQUIRE(waitpid(pid, &status, 0) == pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  };

  // Killed while computing (its temporary file does not exist yet).
  s.write("o.safetensors", precious);
  pid_t pid = spawn();
  usleep(20000);
  const bool computing = !temp_exists();
  BOOST_TEST(kill_and_reap(pid));
  if (computing) BOOST_TEST(slurp(out) == precious);

  // Killed while writing: the moment its temporary file appears (polled every 100 us).
  int mid_write = 0;
  for (int attempt = 0; attempt < 5 && mid_write == 0; ++attempt) {
    for (const auto& e : fs::directory_iterator(s.dir))
      if (e.path().filename().string().starts_with("o.safetensors.tmp.")) fs::remove(e.path());
    s.write("o.safetensors", precious);
    pid = spawn();
    int exited = 0;
    while (!temp_exists() && waitpid(pid, &exited, WNOHANG) == 0) usleep(100);
    if (!temp_exists()) {  // finished between two polls: the output must be the new one
      BOOST_TEST(SafetensorsFile::open(out).tensor("y").shape() == (Shape{2048, 1024}));
      continue;
    }
    BOOST_TEST(kill_and_reap(pid));
    if (temp_exists()) {
      ++mid_write;
      BOOST_TEST(slurp(out) == precious, "a kill during the write changed the output file");
    } else {  // renamed just before the kill: the new output, whole
      BOOST_TEST(SafetensorsFile::open(out).tensor("y").shape() == (Shape{2048, 1024}));
    }
  }
  BOOST_TEST(mid_write == 1, "no kill landed while the output was being written");

  // Run to the end: the output is replaced whole.
  pid = spawn();
  int status = 0;
  BOOST_REQUIRE(waitpid(pid, &status, 0) == pid);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  BOOST_TEST(SafetensorsFile::open(out).tensor("y").shape() == (Shape{2048, 1024}));
}

// ---------------------------------------------------------------- recipe

BOOST_AUTO_TEST_CASE(recipe_writes_networks_that_summary_counts_like_torch) {
  Scratch s;
  // The shipped example's network is what the recipe writes today (examples/digits/make_digits.py
  // names the command), so the example cannot drift from the recipe.
  const Result digits = cli_run({"recipe", "vision_transformer", "--set", "image_size=8", "--set",
                                 "patch_size=2", "--set", "num_layers=2", "--set", "num_heads=4",
                                 "--set", "hidden_dim=32", "--set", "mlp_dim=64", "--set",
                                 "num_classes=10"});
  BOOST_TEST(digits.status == 0, digits.err);
  BOOST_TEST(digits.err.empty());
  std::ifstream committed(kSource + "/examples/digits/digits.json", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(committed)),
                         std::istreambuf_iterator<char>());
  BOOST_TEST(digits.out == text);

  // --output writes the same text (atomically: nothing else is left in the directory), and
  // summary reports PyTorch's parameter count (sum(p.numel() for p in GPT().parameters()) of
  // the reference GPT at these arguments: 1,600, the head tied to tok.weight).
  const std::string net = s.path("gpt.json");
  const Result w = cli_run({"recipe", "gpt", "--set", "vocab_size=40", "--set", "context=8",
                            "--set", "d_model=8", "--set", "nhead=2", "--set", "num_layers=2",
                            "--set", "dim_feedforward=16", "--output", net});
  BOOST_TEST(w.status == 0, w.err);
  BOOST_TEST(w.out.empty());
  BOOST_TEST(std::distance(fs::directory_iterator(s.dir), fs::directory_iterator()) == 1);
  const Result summary = cli_run({"summary", net});
  BOOST_TEST(summary.status == 0, summary.err);
  BOOST_TEST(summary.out.ends_with("Parameters: 1,600\n"), summary.out);
  // Token ids run through `run` (I64, and I32 widened to the same logits) and `bench`.
  const std::string ids64 = s.path("ids64.safetensors"), ids32 = s.path("ids32.safetensors");
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 39, 0, 7, 7}, {1, 5});
  save(ids64, {{"ids", ids}});
  save(ids32, {{"ids", ids.to(DType::I32)}});
  std::vector<Tensor> logits;
  for (const std::string& in : {ids64, ids32}) {
    const std::string out = s.path("logits.safetensors");
    const Result r = cli_run({"run", net, "--input", in, "--output", out});
    BOOST_TEST(r.status == 0, r.err);
    logits.push_back(SafetensorsFile::open(out).tensor("logits").clone());
    BOOST_TEST(logits.back().shape() == (Shape{1, 5, 40}));
  }
  BOOST_TEST(max_abs_diff(logits[0], logits[1]) == 0.0);
  const Result b =
      cli_run({"bench", net, "--shape", "ids=2,8", "--reps", "1", "--warmup", "0", "--json"});
  BOOST_TEST(b.status == 0, b.err);
  expect_failure(cli_run({"bench", net, "--shape", "ids=1,9"}), "E_SHAPE",
                 "pos (embedding): positions 0..8 need 9 rows, num_embeddings=8");
  fs::remove(ids32);
  fs::remove(ids64);
  fs::remove(s.path("logits.safetensors"));
  // activation=gelu is the string "gelu" (not JSON, so taken as text); a bare number is a number.
  const Result t = cli_run({"recipe", "transformer", "--set", "activation=gelu", "--set",
                            "d_model=16", "--set", "nhead=2"});
  BOOST_TEST(t.status == 0, t.err);
  BOOST_TEST(t.out.find(R"("op":"gelu")") != std::string::npos);

  expect_failure(cli_run({"recipe", "resnet50"}), "E_ARG", "unknown architecture 'resnet50'");
  expect_failure(cli_run({"recipe", "gpt", "--set", "d_model"}), "E_ARG",
                 "'d_model' is not NAME=VALUE");
  expect_failure(cli_run({"recipe", "gpt", "--set", "d_model=8", "--set", "d_model=16"}), "E_ARG",
                 "--set d_model is given twice");
  expect_failure(cli_run({"recipe", "vit_b_16", "--set", "image_size=225"}), "E_CONSTRAINT",
                 "Input shape indivisible by patch size!");
  expect_failure(cli_run({"recipe", "transformer", "--set", "custom_encoder=\"MyEncoder\""}),
                 "E_ARG", "custom_encoder takes a Python callable or class");
  // A failed recipe leaves an existing --output as it was.
  const std::string kept = s.write("kept.json", "{}");
  expect_failure(cli_run({"recipe", "gpt", "--set", "nhead=5", "--output", kept}), "E_CONSTRAINT",
                 "embed_dim must be divisible by num_heads");
  std::ifstream k(kept);
  BOOST_TEST(std::string((std::istreambuf_iterator<char>(k)), std::istreambuf_iterator<char>()) ==
             "{}");
}

// ---------------------------------------------------------------- generate

const std::string kFortunes = kSource + "/examples/fortunes/";

// The ids of a safetensors tensor, flat.
std::vector<int64_t> read_ids(const std::string& path, const std::string& name) {
  const Tensor t = SafetensorsFile::open(path).tensor(name).contiguous();
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

// `tessera generate` greedy on the shipped fortunes model prints PyTorch's greedy continuation
// (examples/fortunes/greedy.safetensors: full recomputation in PyTorch) and writes it with the
// prompt to --output; sampling gives the same tokens at 1 and 2 threads.
BOOST_AUTO_TEST_CASE(generate_matches_pytorch_greedy) {
  Scratch tmp;
  const std::string out = tmp.path("ids.safetensors");
  const Result r = cli_run({"generate", kFortunes + "fortunes.safetensors", "--prompt",
                            kFortunes + "prompt.safetensors", "--max-new-tokens", "200",
                            "--output", out});
  BOOST_TEST_REQUIRE(r.status == 0, r.err);
  BOOST_TEST(r.err.empty(), r.err);  // not a terminal: no progress line
  const std::vector<int64_t> want = read_ids(kFortunes + "greedy.safetensors", "ids");
  BOOST_TEST(read_ids(out, "ids") == want, boost::test_tools::per_element());
  const std::vector<int64_t> prompt = read_ids(kFortunes + "prompt.safetensors", "ids");
  const size_t T = prompt.size() / 2, N = want.size() / 2 - T;
  std::string text;
  for (size_t b = 0; b < 2; ++b) {
    for (size_t n = 0; n < N; ++n) {
      if (n) text += ' ';  // (not `(n ? " " : "") + ...`: GCC 12's -Wrestrict false positive)
      text += std::to_string(want[b * (T + N) + T + n]);
    }
    text += '\n';
  }
  BOOST_TEST(r.out == text);

  std::vector<std::string> sampled;
  for (const char* threads : {"1", "2"}) {
    const Result s = cli_run({"generate", kFortunes + "fortunes.safetensors", "--prompt-ids",
                              "37,10,65", "--max-new-tokens", "60", "--temperature", "0.8",
                              "--top-k", "30", "--top-p", "0.9", "--seed", "7", "--threads",
                              threads});
    BOOST_TEST_REQUIRE(s.status == 0, s.err);
    sampled.push_back(s.out);
  }
  BOOST_TEST(sampled[0] == sampled[1]);
  BOOST_TEST(std::count(sampled[0].begin(), sampled[0].end(), ' ') == 59);
}

BOOST_AUTO_TEST_CASE(generate_refuses_bad_input_before_running) {
  Scratch tmp;
  const std::string net = kFortunes + "fortunes.safetensors";
  auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", net};
    args.insert(args.end(), extra.begin(), extra.end());
    return cli_run(args);
  };
  expect_failure(gen({"--max-new-tokens", "4"}), "E_ARG", "give one of --prompt");
  expect_failure(gen({"--prompt-ids", "1", "--prompt", "p", "--max-new-tokens", "4"}), "E_ARG",
                 "give one of --prompt");
  expect_failure(gen({"--prompt-ids", "1"}), "E_ARG", "missing --max-new-tokens");
  expect_failure(gen({"--prompt-ids", "1,x", "--max-new-tokens", "4"}), "E_ARG",
                 "'x' is not a token id");
  expect_failure(gen({"--prompt-ids", "1", "--max-new-tokens", "4", "--top-p", "0"}), "E_ARG",
                 "top_p");
  expect_failure(gen({"--prompt-ids", "1", "--max-new-tokens", "4", "--top-p", "1.5"}), "E_ARG",
                 "top_p");
  expect_failure(gen({"--prompt-ids", "1", "--max-new-tokens", "4", "--top-k", "-1"}), "E_ARG",
                 "--top-k");
  expect_failure(gen({"--prompt-ids", "1", "--max-new-tokens", "4", "--temperature", "-0.5"}),
                 "E_ARG", "temperature");
  expect_failure(gen({"--prompt-ids", "1", "--max-new-tokens", "4", "--temperature", "nan"}),
                 "E_ARG", "--temperature");
  expect_failure(gen({"--prompt-ids", "1,2,3", "--max-new-tokens", "254"}), "E_SHAPE",
                 "a prompt of 3 and 254 new tokens make 257 positions, more than the network's "
                 "context of 256");
  expect_failure(gen({"--prompt-ids", "1,200,3", "--max-new-tokens", "4"}), "E_SHAPE",
                 "tok (embedding): id 200");
  expect_failure(gen({"--prompt-ids", "-1", "--max-new-tokens", "4"}), "E_SHAPE", "id -1");
  const std::string wrong = tmp.path("wrong.safetensors");
  save(wrong, {{"tokens", Tensor::zeros({1, 3}, DType::I64)}});
  expect_failure(gen({"--prompt", wrong, "--max-new-tokens", "4"}), "E_ARG",
                 "no tensor ids (the network's ids input); the file holds tokens");
  save(wrong, {{"ids", Tensor::zeros({1, 3})}});
  expect_failure(gen({"--prompt", wrong, "--max-new-tokens", "4"}), "E_DTYPE",
                 "ids is F32; token ids are I64 or I32");
  // A network that is not causal (the encoder example: float input) and one whose attention
  // sees later positions.
  expect_failure(cli_run({"generate", kEncoder, "--prompt-ids", "1", "--max-new-tokens", "2"}),
                 "E_ARG", "int64 ids [B, T]");
  const std::string bidir = tmp.write("bidir.json", R"({
    "inputs": {"ids": {"shape": ["B", "T"], "dtype": "int64"}},
    "nodes": [{"name": "tok", "op": "embedding", "args": {"num_embeddings": 5, "embedding_dim": 8},
               "inputs": {"x": "ids"}},
              {"name": "sa", "op": "multihead_attention",
               "args": {"embed_dim": 8, "num_heads": 2, "batch_first": true, "need_weights": false},
               "inputs": {"query": "tok"}},
              {"name": "head", "op": "linear", "args": {"out_features": 5}, "inputs": {"x": "sa"}}],
    "outputs": {"logits": "head"}})");
  expect_failure(cli_run({"generate", bidir, "--prompt-ids", "1", "--max-new-tokens", "2"}),
                 "E_ARG", "sa (multihead_attention): the network cannot run one position at a "
                 "time (generate): multihead attention without is_causal");
  // --output is written only on success: an existing file stays as it was.
  const std::string keep = tmp.write("keep.safetensors", "original");
  expect_failure(gen({"--prompt-ids", "1,200", "--max-new-tokens", "4", "--output", keep}),
                 "E_SHAPE", "id 200");
  BOOST_TEST(slurp(keep) == "original");
}

BOOST_AUTO_TEST_SUITE_END()
