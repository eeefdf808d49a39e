// The tessera command line (shared/docs/interfaces.md §3, §5, §6): run, summary, inspect, bench,
// recipe and generate.
//
// Files and arguments become library calls; every failure becomes one line on stderr,
// "tessera: error: E_CODE: <where>: <what>", and an exit status: 2 for a user error (every
// code but E_INTERNAL), 1 for an internal failure (E_INTERNAL, any other exception, out of
// memory). Warnings ("tessera: warning: ...") are held back until the command has succeeded, so
// a command that fails prints its error line and nothing else.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/network.h"
#include "io/atomic_file.h"
#include "recipes/recipes.h"
#include "runtime/generation.h"
#include "runtime/loader.h"
#include "runtime/sampling.h"
#include "runtime/session.h"

#ifndef TESSERA_VERSION
#error "TESSERA_VERSION comes from meson (apps/meson.build)"
#endif

namespace tessera {
namespace {

constexpr const char* kUsage =
    "usage: tessera <command> [options]\n"
    "\n"
    "commands:\n"
    "  run NET [--weights W.safetensors] --input IN.safetensors --output OUT.safetensors\n"
    "          [--threads N] [--seed S] [--non-strict] [--panel-cache DIR]\n"
    "  summary NET [--shape NAME=D0,D1,...]\n"
    "  inspect FILE.safetensors\n"
    "  bench NET [--weights W.safetensors] --shape NAME=D0,D1,... [--threads N]\n"
    "            [--warmup K] [--reps R] [--json] [--panel-cache DIR]\n"
    "  recipe ARCH [--set NAME=VALUE]... [--output NET.json]\n"
    "  generate NET [--weights W.safetensors] (--prompt IDS.safetensors | --prompt-ids 5,17,3)\n"
    "           --max-new-tokens N [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "           [--threads N] [--output OUT.safetensors] [--panel-cache DIR]\n"
    "\n"
    "NET is a network JSON file, or a .safetensors checkpoint carrying its network in the\n"
    "metadata key tessera.network. 'tessera <command> --help' describes a command's options;\n"
    "'tessera --version' prints the version. Exit status: 0 success, 2 a user error, 1 an\n"
    "internal failure.\n"
    "\n"
    "--panel-cache DIR (default: $TESSERA_PANEL_CACHE; none when both are unset) keeps the\n"
    "packed projection weights of each checkpoint in DIR, so that later loads map them instead\n"
    "of packing again.\n";

// Warnings wait for success: a failing command prints only its error line.
std::vector<std::string> g_warnings;
// A progress bar is on the terminal's current line: clear it before printing anything else.
bool g_progress_shown = false;

void clear_progress() {
  if (!g_progress_shown) return;
  std::fputs("\r\033[K", stderr);
  g_progress_shown = false;
}

// Messages are one line, whatever a nested message carried.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

void flush_warnings() {
  for (const std::string& w : g_warnings)
    std::fprintf(stderr, "tessera: warning: %s\n", one_line(w).c_str());
  g_warnings.clear();
}

// ------------------------------------------------------------------ argument parsing

struct Command {
  std::string name;
  cxxopts::Options options;
  cxxopts::ParseResult result;

  Command(std::string cmd, const std::string& help)
      : name(std::move(cmd)), options("tessera " + name, help) {}

  // Parses argv after the command word. E_ARG for anything cxxopts rejects and for stray
  // positional arguments.
  void parse(int argc, char** argv) {
    options.add_options()("h,help", "Print this help");
    try {
      result = options.parse(argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
      fail(ErrorCode::Arg, name, e.what());
    }
    if (!result.unmatched().empty())
      fail(ErrorCode::Arg, name, "unexpected argument '" + result.unmatched()[0] + "'");
  }
  bool help() const { return result.count("help") > 0; }
  bool has(const char* opt) const { return result.count(opt) > 0; }
  std::string str(const char* opt) const { return result[opt].as<std::string>(); }
  std::string required(const char* opt, const char* what) const {
    if (!has(opt)) fail(ErrorCode::Arg, name, std::string("missing ") + what);
    return str(opt);
  }
  std::optional<std::string> optional(const char* opt) const {
    if (!has(opt)) return std::nullopt;
    return str(opt);
  }
  // Every value of an option that may be repeated (--shape a=1 --shape b=2), in order.
  std::vector<std::string> all(const char* opt) const {
    std::vector<std::string> v;
    for (const auto& kv : result.arguments())
      if (kv.key() == opt) v.push_back(kv.value());
    return v;
  }
  // A finite decimal number in [min, max]; the option's default when absent.
  double number(const char* opt, double def, double min, double max) const {
    if (!has(opt)) return def;
    const std::string text = str(opt);
    char* end = nullptr;
    const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < min ||
        v > max)
      fail(ErrorCode::Arg, name,
           std::string("--") + opt + ": '" + text + "' is not a number in [" + py_float(min) +
               ", " + py_float(max) + "]");
    return v;
  }
  // A decimal integer in [min, max]; the option's default when absent.
  uint64_t integer(const char* opt, uint64_t def, uint64_t min, uint64_t max) const {
    if (!has(opt)) return def;
    const std::string text = str(opt);
    uint64_t v = 0;
    bool ok = !text.empty() && text.size() <= 20;
    for (char c : text) {
      ok = ok && c >= '0' && c <= '9';
      if (!ok) break;
      const uint64_t digit = static_cast<uint64_t>(c - '0');
      if (v > (UINT64_MAX - digit) / 10) {
        ok = false;
        break;
      }
      v = v * 10 + digit;
    }
    if (!ok || v < min || v > max)
      fail(ErrorCode::Arg, name,
           std::string("--") + opt + ": '" + text + "' is not an integer in [" +
               std::to_string(min) + ", " + std::to_string(max) + "]");
    return v;
  }
};

// "--shape NAME=D0,D1,..." (repeatable) -> name -> shape. "NAME=" is a scalar.
std::map<std::string, Shape> parse_shapes(const std::vector<std::string>& specs) {
  std::map<std::string, Shape> shapes;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      fail(ErrorCode::Arg, "--shape", "'" + spec + "' is not NAME=D0,D1,...");
    const std::string name = spec.substr(0, eq);
    Shape shape;
    const std::string dims = spec.substr(eq + 1);
    size_t pos = 0;
    while (!dims.empty() && pos <= dims.size()) {
      const size_t comma = std::min(dims.find(',', pos), dims.size());
      const std::string d = dims.substr(pos, comma - pos);
      const bool digits =
          !d.empty() && d.size() <= 18 &&
          std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits)
        fail(ErrorCode::Arg, "--shape",
             "'" + spec + "': '" + d + "' is not a dimension (a non-negative integer)");
      shape.push_back(std::stoll(d));
      pos = comma + 1;
    }
    if (!shapes.emplace(name, shape).second)
      fail(ErrorCode::Arg, "--shape", "input " + name + " is given twice");
  }
  return shapes;
}

void apply_threads(const Command& cmd) {
  if (cmd.has("threads")) set_num_threads(static_cast<int>(cmd.integer("threads", 0, 1, 4096)));
}

// ------------------------------------------------------------------ models

// NET (with its stored weights, or --weights) as a ready Model; what a non-strict load skipped,
// or the absence of any weights, becomes a warning.
Model load_net(const Command& cmd, const std::string& net_path,
               const std::optional<std::string>& weights_path, bool strict, uint64_t seed) {
  LoadedModel loaded =
      tessera::load_model(net_path, weights_path, strict, seed, cmd.optional("panel-cache"));
  if (!loaded.panel_cache_warning.empty())
    g_warnings.push_back("panel cache not written, the next load packs again: " +
                         loaded.panel_cache_warning);
  const std::string seed_text = std::to_string(seed);
  if (!loaded.report.missing.empty())
    g_warnings.push_back(loaded.weights + ": missing weights initialised from --seed " +
                         seed_text + ": " + join(loaded.report.missing));
  if (!loaded.report.unexpected.empty())
    g_warnings.push_back(loaded.weights +
                         ": unexpected weights ignored: " + join(loaded.report.unexpected));
  if (loaded.weights.empty() && loaded.model.parameter_count() > 0)
    g_warnings.push_back("no weights given (no --weights, none stored in " + net_path +
                         "): parameters initialised randomly from --seed " + seed_text);
  return std::move(loaded.model);
}

// ------------------------------------------------------------------ run

int cmd_run(int argc, char** argv) {
  Command cmd("run", "Run a network on the tensors of IN and write its outputs to OUT.");
  // clang-format off
  cmd.options.add_options()
      ("net", "Network JSON file or .safetensors checkpoint", cxxopts::value<std::string>())
      ("weights", "Weights checkpoint (replaces weights stored in NET)",
       cxxopts::value<std::string>(), "W.safetensors")
      ("panel-cache", "Keep packed projection weights in DIR for later loads (default: "
                      "$TESSERA_PANEL_CACHE)", cxxopts::value<std::string>(), "DIR")
      ("input", "One tensor per network input, by name", cxxopts::value<std::string>(),
       "IN.safetensors")
      ("output", "Written atomically: one F32 tensor per network output",
       cxxopts::value<std::string>(), "OUT.safetensors")
      ("threads", "Cap on worker threads (default: all cores)", cxxopts::value<std::string>(), "N")
      ("seed", "Seed for parameters without weights (default 0)", cxxopts::value<std::string>(),
       "S")
      ("non-strict", "Ignore unexpected weights and initialise missing ones, with a warning");
  // clang-format on
  cmd.options.parse_positional({"net"});
  cmd.options.positional_help("NET");
  cmd.parse(argc, argv);
  if (cmd.help()) {
    std::cout << cmd.options.help();
    return 0;
  }
  const std::string net = cmd.required("net", "NET (a network file)");
  const std::string input = cmd.required("input", "--input IN.safetensors");
  const std::string output = cmd.required("output", "--output OUT.safetensors");
  const uint64_t seed = cmd.integer("seed", 0, 0, UINT64_MAX);
  apply_threads(cmd);

  const Session session(
      load_net(cmd, net, cmd.optional("weights"), !cmd.has("non-strict"), seed));
  const NetworkSpec& spec = session.model().network().spec();

  const SafetensorsFile in = SafetensorsFile::open(input);
  std::vector<std::string> missing, unknown, names;
  for (const NetworkInput& i : spec.inputs) {
    names.push_back(i.name);
    if (!in.contains(i.name)) missing.push_back(i.name);
  }
  for (const std::string& name : in.names())
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  if (!missing.empty() || !unknown.empty())
    fail(ErrorCode::Arg, input,
         (missing.empty() ? "" : "missing network input " + join(missing)) +
             (missing.empty() || unknown.empty() ? "" : "; ") +
             (unknown.empty() ? "" : "tensor " + join(unknown) + " is not a network input") +
             " (network inputs: " + join(names) + ")");
  std::map<std::string, Tensor> tensors;
  std::map<std::string, TensorDesc> descs;
  for (const NetworkInput& i : spec.inputs) {
    const SafetensorsTensorInfo& info = in.info(i.name);
    // Which computable dtype fits which input is the plan's rule (float, mask or ids).
    if (!info.dtype)
      fail(ErrorCode::DType, "input " + i.name,
           "dtype " + info.dtype_name + " is not accepted (float inputs are F32, F16, BF16 or " +
               "F64; masks BOOL or float; ids I64 or I32)");
    Tensor t = in.tensor(i.name);
    descs[i.name] = TensorDesc{t.shape(), t.dtype()};
    tensors.emplace(i.name, std::move(t));
  }
  // A lease, not Session::run: the outputs are written from the plan's buffers, not copied first.
  Session::Lease lease = session.lease(descs);
  NamedTensors out;
  for (const auto& [name, t] : lease.run(tensors)) out.emplace_back(name, t.to(DType::F32));
  save_safetensors(output, out);
  flush_warnings();
  return 0;
}

// ------------------------------------------------------------------ summary

int cmd_summary(int argc, char** argv) {
  Command cmd("summary", "Print a network's nodes, shapes and parameter count.");
  // clang-format off
  cmd.options.add_options()
      ("net", "Network JSON file or .safetensors checkpoint", cxxopts::value<std::string>())
      ("shape", "Bind an input's shape (repeatable); open dims print as numbers",
       cxxopts::value<std::string>(), "NAME=D0,D1,...");
  // clang-format on
  cmd.options.parse_positional({"net"});
  cmd.options.positional_help("NET");
  cmd.parse(argc, argv);
  if (cmd.help()) {
    std::cout << cmd.options.help();
    return 0;
  }
  const std::string net = cmd.required("net", "NET (a network file)");
  const auto shapes = parse_shapes(cmd.all("shape"));
  const Network network = Network::resolve(load_network(net), shapes);
  std::cout << network.summary();
  flush_warnings();
  return 0;
}

// ------------------------------------------------------------------ recipe

int cmd_recipe(int argc, char** argv) {
  Command cmd("recipe",
              "Write the network file of a PyTorch model (architectures: " + join(recipe_names()) +
                  "); its state_dict then loads as is.");
  // clang-format off
  cmd.options.add_options()
      ("arch", "Architecture", cxxopts::value<std::string>())
      ("set", "A constructor keyword argument by its PyTorch name (repeatable); VALUE is JSON, "
              "or else a string", cxxopts::value<std::string>(), "NAME=VALUE")
      ("output", "Write here (atomically) instead of stdout", cxxopts::value<std::string>(),
       "NET.json");
  // clang-format on
  cmd.options.parse_positional({"arch"});
  cmd.options.positional_help("ARCH");
  cmd.parse(argc, argv);
  if (cmd.help()) {
    std::cout << cmd.options.help();
    return 0;
  }
  const std::string arch = cmd.required("arch", "ARCH (an architecture)");
  std::vector<RecipeSetting> settings;
  for (const std::string& s : cmd.all("set")) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      fail(ErrorCode::Arg, "--set", "'" + s + "' is not NAME=VALUE");
    const std::string text = s.substr(eq + 1);
    // activation=gelu reads as the string "gelu"; image_size=384 as a number.
    nlohmann::ordered_json value = nlohmann::ordered_json::parse(text, nullptr, false);
    if (value.is_discarded()) value = text;
    settings.emplace_back(s.substr(0, eq), std::move(value));
  }
  const nlohmann::ordered_json net = make_recipe(arch, settings);
  const std::string text = recipe_text(net);
  // What it writes resolves: a recipe that made a network the resolver refuses is our bug.
  try {
    Network::resolve(parse_network(text, "recipe " + arch));
  } catch (const Error& e) {
    fail(ErrorCode::Internal, "recipe " + arch,
         std::string("the network does not resolve: ") + e.what());
  }
  if (const auto out = cmd.optional("output")) {
    write_file_atomically(*out, [&](int fd) { write_all(fd, text.data(), text.size(), *out); });
  } else {
    std::cout << text;
  }
  flush_warnings();
  return 0;
}

// ------------------------------------------------------------------ inspect

// Metadata values are free text: control characters are shown escaped to keep one line each.
std::string escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += "\\x" + std::string(1, "0123456789abcdef"[(c >> 4) & 15]) + "0123456789abcdef"[c & 15];
    else
      out += c;
  }
  return out;
}

int cmd_inspect(int argc, char** argv) {
  Command cmd("inspect",
              "List a safetensors file's tensors (name, dtype, shape, bytes) and metadata.");
  cmd.options.add_options()("file", "The .safetensors file", cxxopts::value<std::string>());
  cmd.options.parse_positional({"file"});
  cmd.options.positional_help("FILE.safetensors");
  cmd.parse(argc, argv);
  if (cmd.help()) {
    std::cout << cmd.options.help();
    return 0;
  }
  const SafetensorsFile f = SafetensorsFile::open(cmd.required("file", "FILE.safetensors"));
  std::vector<std::string> names = f.names();
  std::sort(names.begin(), names.end());
  std::vector<std::vector<std::string>> rows = {{"name", "dtype", "shape", "bytes"}};
  uint64_t data = 0;
  for (const std::string& n : names) {
    const SafetensorsTensorInfo& info = f.info(n);
    rows.push_back({n, info.dtype_name, info.shape_str(), thousands(info.nbytes())});
    data += info.nbytes();
  }
  std::vector<size_t> width(4, 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out = "file: " + f.path() + " (" + thousands(f.file_size()) + " bytes: header " +
                    thousands(f.header_size()) + ", data " + thousands(data) + ")\n";
  out += "tensors: " + std::to_string(names.size()) + "\n";
  for (const auto& r : rows) {
    // Bytes right-aligned (numbers), the rest left-aligned; two spaces between columns.
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(width[c] - r[c].size(), ' ');
      line += c == 3 ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : "");
      if (c + 1 < r.size()) line += "  ";
    }
    out += line + "\n";
  }
  out += "metadata: " + std::to_string(f.metadata().size()) + "\n";
  for (const auto& [key, value] : f.metadata()) out += escape(key) + ": " + escape(value) + "\n";
  std::cout << out;
  return 0;
}

// ------------------------------------------------------------------ bench

class ProgressBar {
 public:
  ProgressBar(const char* label, uint64_t total)
      : label_(label), total_(total), enabled_(isatty(STDERR_FILENO) == 1) {}
  void update(uint64_t done) {
    // Redraw only when the percentage moves: at most ~100 writes whatever the rep count.
    if (!enabled_ || (done * 100 / std::max<uint64_t>(total_, 1) == shown_ && done != total_))
      return;
    shown_ = done * 100 / std::max<uint64_t>(total_, 1);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / std::max<uint64_t>(total_, 1));
    std::fprintf(stderr, "\r%s [%s%s] %llu/%llu", label_,
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(),
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_));
    std::fflush(stderr);
    g_progress_shown = true;
  }

 private:
  const char* label_;
  uint64_t total_;
  bool enabled_;
  uint64_t shown_ = UINT64_MAX;  // the percentage on screen
};

// The number of rows of the smallest embedding table reading network value `ids` directly (ids
// drawn below it are valid everywhere); 1 when no embedding reads it.
uint64_t embedding_rows_for(const Network& net, int ids) {
  uint64_t rows = 0;
  for (const ResolvedNode& node : net.nodes()) {
    if (std::string(node.op->name()) != "embedding") continue;
    if (std::find(node.inputs.begin(), node.inputs.end(), ids) == node.inputs.end()) continue;
    for (const auto& [name, shape] : node.parameters)
      if (name == "weight" && !shape.empty() && shape[0] > 0 &&
          (rows == 0 || static_cast<uint64_t>(shape[0]) < rows))
        rows = static_cast<uint64_t>(shape[0]);
  }
  return rows == 0 ? 1 : rows;
}

// One node's share of a profiled run (bench --profile).
struct NodeTime {
  std::string node, op;
  double ms, flops;  // per run
  // A linear running its reader's activation ("gelu"), or the activation's node run inside the
  // producer named here (its time and FLOPs then count in the producer's row of the tables).
  std::string activation, fused_into;
  std::string fused_op;  // the op of the node it runs inside ("linear+gelu", "add+layer_norm")
  std::string summed;    // a layer_norm running the add before it: that add's node
};

// The --profile table: ms per run summed by op kind (most first), then the 15 slowest nodes,
// each with its share of all node time and its GFLOP/s.
void print_profile(const std::vector<NodeTime>& all, uint64_t reps) {
  std::vector<NodeTime> nodes;
  // (op, the op of the node it runs inside) -> nodes run inside another.
  std::map<std::pair<std::string, std::string>, int> fused;
  for (NodeTime t : all) {
    if (!t.fused_into.empty()) {
      ++fused[{t.op, t.fused_op}];
      continue;
    }
    if (!t.activation.empty()) t.op += "+" + t.activation;
    if (!t.summed.empty()) t.op = "add+" + t.op;
    nodes.push_back(std::move(t));
  }
  double total = 0.0;
  for (const NodeTime& t : nodes) total += t.ms;
  std::map<std::string, NodeTime> by_op;
  std::map<std::string, int> count;
  for (const NodeTime& t : nodes) {
    NodeTime& o =
        by_op.try_emplace(t.op, NodeTime{t.op, t.op, 0.0, 0.0, "", "", "", ""}).first->second;
    o.ms += t.ms;
    o.flops += t.flops;
    ++count[t.op];
  }
  std::vector<NodeTime> ops;
  for (const auto& entry : by_op) ops.push_back(entry.second);
  std::vector<NodeTime> slowest = nodes;
  const auto by_time = [](const NodeTime& a, const NodeTime& b) { return a.ms > b.ms; };
  std::stable_sort(ops.begin(), ops.end(), by_time);
  std::stable_sort(slowest.begin(), slowest.end(), by_time);
  slowest.resize(std::min<size_t>(slowest.size(), 15));
  // Columns as wide as their longest entry (node names run to 50 characters in ViT).
  int first = 12, second = 5;
  for (const NodeTime& t : slowest) {
    first = std::max(first, static_cast<int>(t.node.size()));
    second = std::max(second, static_cast<int>(t.op.size()));
  }
  for (const NodeTime& o : ops) first = std::max(first, static_cast<int>(o.op.size()));
  const auto row = [&](const std::string& a, const std::string& b, const std::string& rest) {
    std::cout << "  " << a << std::string(static_cast<size_t>(first) - a.size() + 1, ' ') << b
              << std::string(static_cast<size_t>(second) - b.size() + 1, ' ') << rest << "\n";
  };
  const auto numbers = [&](const NodeTime& t) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%9.3f %6.1f %9.1f", t.ms,
                  total > 0 ? 100.0 * t.ms / total : 0.0,
                  t.ms > 0 ? t.flops / (t.ms * 1e-3) / 1e9 : 0.0);
    return std::string(buf);
  };
  char head[160];
  std::snprintf(head, sizeof(head),
                "profile: %.3f ms per run in nodes (a plan of its own, %llu runs)\n", total,
                static_cast<unsigned long long>(reps));
  std::cout << head;
  std::snprintf(head, sizeof(head), "%9s %6s %9s", "ms", "%", "GFLOP/s");
  row("op", "nodes", head);
  for (const NodeTime& o : ops) row(o.op, std::to_string(count[o.op]), numbers(o));
  row("slowest node", "op", head);
  for (const NodeTime& t : slowest) row(t.node, t.op, numbers(t));
  for (const auto& [ops, n] : fused)
    std::cout << "  (" << n << " " << ops.first << " node" << (n == 1 ? "" : "s")
              << " run inside the node next to them: " << ops.second << " above)\n";
}

int cmd_bench(int argc, char** argv) {
  Command cmd("bench", "Time a network on random inputs of the given shapes.");
  // clang-format off
  cmd.options.add_options()
      ("net", "Network JSON file or .safetensors checkpoint", cxxopts::value<std::string>())
      ("weights", "Weights checkpoint (replaces weights stored in NET)",
       cxxopts::value<std::string>(), "W.safetensors")
      ("panel-cache", "Keep packed projection weights in DIR for later loads (default: "
                      "$TESSERA_PANEL_CACHE)", cxxopts::value<std::string>(), "DIR")
      ("shape", "An input's shape (repeatable; needed for inputs with open dims)",
       cxxopts::value<std::string>(), "NAME=D0,D1,...")
      ("threads", "Cap on worker threads (default: all cores)", cxxopts::value<std::string>(), "N")
      ("warmup", "Untimed runs first (default 3; the first run, timed as first_run_ms, is "
                 "always made)", cxxopts::value<std::string>(), "K")
      ("reps", "Timed runs (default 20)", cxxopts::value<std::string>(), "R")
      ("json", "Print one JSON object: median_ms, min_ms, max_ms, gflops, peak_rss_mb, flops, "
                "load_ms, first_run_ms")
      ("profile", "Then time every node over R more runs (a plan of its own, after the peak "
                  "RSS is read): ms per run by op and for the slowest nodes; with --json, a "
                  "\"profile\" array of {node, op, ms, gflop}");
  // clang-format on
  cmd.options.parse_positional({"net"});
  cmd.options.positional_help("NET");
  cmd.parse(argc, argv);
  if (cmd.help()) {
    std::cout << cmd.options.help();
    return 0;
  }
  const std::string net = cmd.required("net", "NET (a network file)");
  const auto shapes = parse_shapes(cmd.all("shape"));
  const uint64_t warmup = cmd.integer("warmup", 3, 0, 1'000'000);
  const uint64_t reps = cmd.integer("reps", 20, 1, 1'000'000);
  apply_threads(cmd);

  const auto start = std::chrono::steady_clock::now();
  const Session session(load_net(cmd, net, cmd.optional("weights"), true, 0));
  // The shapes --shape gives, checked against the network (symbols, spatial grids).
  const Network bound = Network::resolve(session.model().network().spec(), shapes);
  std::map<std::string, TensorDesc> descs;
  std::vector<std::string> shape_text;
  for (size_t i = 0; i < bound.inputs().size(); ++i) {
    const NetworkValue& v = bound.values()[static_cast<size_t>(bound.inputs()[i])];
    if (!is_fixed(v.type.shape))
      fail(ErrorCode::Arg, "--shape",
           "input " + v.name + " " + sym_shape_to_string(v.type.shape) +
               " has open dims; give --shape " + v.name + "=D0,D1,...");
    const Shape shape = concrete_shape(v.type.shape);
    const DType stored = v.type.dtype == DType::Bool || v.type.dtype == DType::I64 ? v.type.dtype
                                                                                  : DType::F32;
    descs[v.name] = TensorDesc{shape, stored};
    shape_text.push_back(v.name + "=" + shape_to_string(shape));
  }
  // The plan first: it refuses shapes over the memory budget before the inputs are made. One
  // plan serves every run, warm-up included.
  Session::Lease lease = session.lease(descs);
  Generator gen(0);
  std::map<std::string, Tensor> inputs;
  for (size_t i = 0; i < bound.inputs().size(); ++i) {
    const int value = bound.inputs()[i];
    const NetworkValue& v = bound.values()[static_cast<size_t>(value)];
    const TensorDesc& d = descs.at(v.name);
    // Masks keep everything (false), so every run does the full work; ids are drawn in
    // [0, the smallest table an embedding reads them with), as real tokens would be.
    Tensor t =
        d.dtype == DType::F32 ? Tensor::randn(d.shape, gen) : Tensor::zeros(d.shape, d.dtype);
    if (d.dtype == DType::I64) {
      const uint64_t limit = embedding_rows_for(bound, value);
      int64_t* ids = t.data<int64_t>();
      for (int64_t k = 0; k < t.numel(); ++k)
        ids[k] = static_cast<int64_t>(gen.next_u64() % limit);
    }
    inputs.emplace(v.name, std::move(t));
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  // The first run on its own: with the load before it, the cold start a user waits for.
  const auto f0 = std::chrono::steady_clock::now();
  lease.run(inputs);
  const double first_run_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - f0).count();
  ProgressBar warm("warm-up", warmup);
  for (uint64_t i = 1; i < warmup; ++i) {
    lease.run(inputs);
    warm.update(i + 1);
  }
  std::vector<double> ms;
  ProgressBar timed("bench  ", reps);
  for (uint64_t i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    lease.run(inputs);
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    timed.update(i + 1);
  }
  clear_progress();
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  const double gflops = median > 0 ? lease.plan().flops() / (median * 1e-3) / 1e9 : 0.0;
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss: KiB

  // Per-node times on a plan of their own, so the timed runs above read no clock per node.
  std::vector<NodeTime> profile;
  if (cmd.has("profile")) {
    Plan plan(session.model(), descs);
    plan.run(inputs);
    plan.set_node_timing(true);
    for (uint64_t i = 0; i < reps; ++i) plan.run(inputs);
    const auto& nodes = session.model().network().nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
      NodeTime t{nodes[i].name, nodes[i].op->name(),
                 plan.node_seconds()[i] * 1e3 / static_cast<double>(reps), plan.node_flops()[i],
                 "", "", "", ""};
      if (plan.node_activations()[i] != Activation::none)
        t.activation = activation_name(plan.node_activations()[i]);
      if (const int j = plan.summed_adds()[i]; j >= 0)
        t.summed = nodes[static_cast<size_t>(j)].name;
      profile.push_back(std::move(t));
    }
    // A node run inside another (an activation inside the linear before it, an add inside the
    // layer_norm after it): its FLOPs count where they are spent.
    for (size_t i = 0; i < nodes.size(); ++i)
      if (const int host = plan.fused_into()[i]; host >= 0) {
        NodeTime& h = profile[static_cast<size_t>(host)];
        h.flops += profile[i].flops;
        profile[i].fused_into = h.node;
        profile[i].fused_op = !h.activation.empty() ? h.op + "+" + h.activation
                              : !h.summed.empty()   ? "add+" + h.op
                                                    : h.op;
        profile[i].flops = 0.0;
      }
  }

  if (cmd.has("json")) {
    nlohmann::ordered_json j;
    j["median_ms"] = median;
    j["min_ms"] = ms.front();
    j["max_ms"] = ms.back();
    j["gflops"] = gflops;
    j["peak_rss_mb"] = peak_rss_mb;
    j["flops"] = lease.plan().flops();
    j["load_ms"] = load_ms;
    j["first_run_ms"] = first_run_ms;
    j["simd_target"] = cpu_device().simd_target();
    if (cmd.has("profile")) {
      j["profile"] = nlohmann::ordered_json::array();
      for (const NodeTime& t : profile) {
        nlohmann::ordered_json e = {
            {"node", t.node}, {"op", t.op}, {"ms", t.ms}, {"gflop", t.flops / 1e9}};
        if (!t.activation.empty()) e["activation"] = t.activation;
        if (!t.fused_into.empty()) e["fused_into"] = t.fused_into;
        if (!t.summed.empty()) e["summed"] = t.summed;
        j["profile"].push_back(std::move(e));
      }
    }
    std::cout << j.dump() << "\n";
  } else {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "bench: %s  inputs %s  threads %d  simd %s  %llu warm-up + %llu timed runs\n"
                  "time: median %.3f ms  min %.3f ms  max %.3f ms\n"
                  "compute: %.2f GFLOP/s (%.4g GFLOP per run)\n"
                  "peak RSS: %.1f MB\n",
                  net.c_str(), join(shape_text).c_str(), num_threads(), cpu_device().simd_target(),
                  static_cast<unsigned long long>(warmup), static_cast<unsigned long long>(reps),
                  median, ms.front(), ms.back(), gflops, lease.plan().flops() / 1e9, peak_rss_mb);
    std::cout << buf;
    if (cmd.has("profile")) print_profile(profile, reps);
  }
  flush_warnings();
  return 0;
}

// ------------------------------------------------------------------ generate

// "5,17,3" -> [1, 3] int64 ids. Any integer is taken: ids outside the vocabulary are the
// embedding's E_SHAPE, as in a --prompt file.
Tensor parse_prompt_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string d = text.substr(pos, comma - pos);
    const size_t digits_from = !d.empty() && d[0] == '-' ? 1 : 0;
    const bool ok = d.size() > digits_from && d.size() <= 18 &&
                    std::all_of(d.begin() + static_cast<std::ptrdiff_t>(digits_from), d.end(),
                                [](char c) { return c >= '0' && c <= '9'; });
    if (!ok)
      fail(ErrorCode::Arg, "--prompt-ids",
           "'" + text + "': '" + d + "' is not a token id (comma-separated integers)");
    ids.push_back(std::stoll(d));
    pos = comma + 1;
  }
  Tensor t = Tensor::empty({1, static_cast<int64_t>(ids.size())}, DType::I64);
  std::copy(ids.begin(), ids.end(), t.data<int64_t>());
  return t;
}

// The prompt of --prompt FILE: the tensor named as the ids input, I64 or I32 [B, T].
Tensor read_prompt_file(const std::string& path, const std::string& ids_name) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  if (!f.contains(ids_name))
    fail(ErrorCode::Arg, path,
         "no tensor " + ids_name + " (the network's ids input); the file holds " +
             (f.names().empty() ? std::string("none") : join(f.names())));
  const SafetensorsTensorInfo& info = f.info(ids_name);
  if (!info.dtype || (*info.dtype != DType::I64 && *info.dtype != DType::I32))
    fail(ErrorCode::DType, path,
         ids_name + " is " + info.dtype_name + "; token ids are I64 or I32");
  Tensor t = f.tensor(ids_name);
  if (t.dim() != 2 || t.size(1) < 1 || t.size(0) < 1)
    fail(ErrorCode::Shape, path, ids_name + " " + t.shape_str() + " is not [B, T] with B, T >= 1");
  return t.to(DType::I64).contiguous();
}

// "generate: 37/128 tokens, 412.5 tokens/s" on stderr while it runs, when stderr is a terminal.
class TokenProgress {
 public:
  explicit TokenProgress(int64_t total)
      : total_(total), enabled_(isatty(STDERR_FILENO) == 1),
        start_(std::chrono::steady_clock::now()) {}
  void update(int64_t done) {
    if (!enabled_) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "\r\033[Kgenerate: %lld/%lld tokens, %.1f tokens/s",
                 static_cast<long long>(done), static_cast<long long>(total_),
                 s > 0.0 ? static_cast<double>(done) / s : 0.0);
    std::fflush(stderr);
    g_progress_shown = true;
  }

 private:
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
};

int cmd_generate(int argc, char** argv) {
  Command cmd("generate",
              "Generate tokens after a prompt with a network of causal attention (a KV cache).");
  // clang-format off
  cmd.options.add_options()
      ("net", "Network JSON file or .safetensors checkpoint", cxxopts::value<std::string>())
      ("weights", "Weights checkpoint (replaces weights stored in NET)",
       cxxopts::value<std::string>(), "W.safetensors")
      ("panel-cache", "Keep packed projection weights in DIR for later loads (default: "
                      "$TESSERA_PANEL_CACHE)", cxxopts::value<std::string>(), "DIR")
      ("prompt", "I64/I32 tensor [B, T] named as the network's ids input",
       cxxopts::value<std::string>(), "IDS.safetensors")
      ("prompt-ids", "One prompt row: comma-separated token ids", cxxopts::value<std::string>(),
       "5,17,3")
      ("max-new-tokens", "Tokens to generate per row", cxxopts::value<std::string>(), "N")
      ("temperature", "0 (default): greedy; otherwise logits / T are sampled",
       cxxopts::value<std::string>(), "T")
      ("top-k", "Sample among the K most likely (default 0: all)", cxxopts::value<std::string>(),
       "K")
      ("top-p", "Sample among the smallest set reaching P (default 1: all)",
       cxxopts::value<std::string>(), "P")
      ("seed", "Sampling seed; also initialises parameters without weights (default 0)",
       cxxopts::value<std::string>(), "S")
      ("threads", "Cap on worker threads (default: all cores)", cxxopts::value<std::string>(), "N")
      ("output", "Also write ids I64 [B, T + N] (prompt included), atomically",
       cxxopts::value<std::string>(), "OUT.safetensors");
  // clang-format on
  cmd.options.parse_positional({"net"});
  cmd.options.positional_help("NET");
  cmd.parse(argc, argv);
  if (cmd.help()) {
    std::cout << cmd.options.help();
    return 0;
  }
  // Every argument is checked before anything is loaded.
  const std::string net = cmd.required("net", "NET (a network file)");
  if (cmd.has("prompt") == cmd.has("prompt-ids"))
    fail(ErrorCode::Arg, "generate", "give one of --prompt IDS.safetensors and --prompt-ids");
  if (!cmd.has("max-new-tokens")) fail(ErrorCode::Arg, "generate", "missing --max-new-tokens N");
  const int64_t max_new = static_cast<int64_t>(
      cmd.integer("max-new-tokens", 0, 0, uint64_t{1} << 40));
  SamplingOptions sampling;
  sampling.temperature = cmd.number("temperature", 0.0, -1e300, 1e300);
  sampling.top_k = static_cast<int64_t>(cmd.integer("top-k", 0, 0, INT64_MAX));
  sampling.top_p = cmd.number("top-p", 1.0, -1e300, 1e300);
  sampling.seed = cmd.integer("seed", 0, 0, UINT64_MAX);
  check_sampling_options(sampling, "generate");
  std::optional<Tensor> prompt_ids;
  if (cmd.has("prompt-ids")) prompt_ids = parse_prompt_ids(cmd.str("prompt-ids"));
  apply_threads(cmd);

  const Model model = load_net(cmd, net, cmd.optional("weights"), true, sampling.seed);
  const Network& network = model.network();
  GenerationSession::check(network);  // E_ARG: no ids input, a node that looks ahead, ...
  const std::string ids_name = DecodeState::ids_input(network).first;
  const Tensor prompt = prompt_ids ? *prompt_ids : read_prompt_file(cmd.str("prompt"), ids_name);
  const int64_t B = prompt.size(0), T = prompt.size(1);
  const std::optional<int64_t> context = GenerationSession::context(network);
  if (context && T + max_new > *context)
    fail(ErrorCode::Shape, "generate",
         "a prompt of " + std::to_string(T) + " and " + std::to_string(max_new) +
             " new tokens make " + std::to_string(T + max_new) +
             " positions, more than the network's context of " + std::to_string(*context));

  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(B));
  if (max_new > 0) {
    GenerationSession session(model, B, T + max_new, sampling);
    TokenProgress progress(max_new * B);
    tokens = session.generate(prompt, max_new, [&](int64_t n) { progress.update(n * B); });
    clear_progress();
  }
  std::string text;
  for (const auto& row : tokens) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) text += ' ';
      text += std::to_string(row[i]);
    }
    text += "\n";
  }
  if (cmd.has("output")) {
    Tensor ids = Tensor::empty({B, T + max_new}, DType::I64);
    for (int64_t b = 0; b < B; ++b) {
      int64_t* dst = ids.data<int64_t>() + b * (T + max_new);
      std::copy_n(prompt.data<int64_t>() + b * T, T, dst);
      std::copy(tokens[static_cast<size_t>(b)].begin(), tokens[static_cast<size_t>(b)].end(),
                dst + T);
    }
    save_safetensors(cmd.str("output"), NamedTensors{{"ids", ids}});
  }
  std::cout << text;
  flush_warnings();
  return 0;
}

// TESSERA_HWY_TARGET=AVX2 (any compiled Highway target this CPU has) runs every kernel on that
// target instead of the best one: how an AVX-512 machine measures the AVX2 path.
void apply_simd_target_from_environment() {
  const char* name = std::getenv("TESSERA_HWY_TARGET");
  if (name == nullptr || *name == '\0') return;
  std::string available;
  if (!restrict_simd_target(name, available))
    fail(ErrorCode::Arg, "TESSERA_HWY_TARGET",
         std::string("target '") + name + "' is not compiled in or not supported by this CPU "
         "(available: " + available + ")");
}

int dispatch(int argc, char** argv, std::string& where) {
  apply_simd_target_from_environment();
  if (argc < 2)
    fail(ErrorCode::Arg, "tessera",
         "no command given (run, summary, inspect, bench, recipe, generate; see --help)");
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (command == "--version") {
    std::cout << "tessera " << TESSERA_VERSION << "\n";
    return 0;
  }
  where = command;
  // cxxopts sees the command word as the program name.
  if (command == "run") return cmd_run(argc - 1, argv + 1);
  if (command == "summary") return cmd_summary(argc - 1, argv + 1);
  if (command == "inspect") return cmd_inspect(argc - 1, argv + 1);
  if (command == "bench") return cmd_bench(argc - 1, argv + 1);
  if (command == "recipe") return cmd_recipe(argc - 1, argv + 1);
  if (command == "generate") return cmd_generate(argc - 1, argv + 1);
  where = "tessera";
  fail(ErrorCode::Arg, "tessera",
       "unknown command '" + command +
           "' (commands: run, summary, inspect, bench, recipe, generate; see --help)");
}

void print_error(const std::string& message) {
  clear_progress();
  std::cout.flush();
  std::fprintf(stderr, "tessera: error: %s\n", one_line(message).c_str());
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using tessera::ErrorCode;
  std::string where = "tessera";
  try {
    return tessera::dispatch(argc, argv, where);
  } catch (const tessera::Error& e) {
    tessera::print_error(e.what());
    return e.code() == ErrorCode::Internal ? 1 : 2;
  } catch (const std::bad_alloc&) {
    tessera::print_error("E_INTERNAL: " + where + ": out of memory");
    return 1;
  } catch (const std::exception& e) {
    tessera::print_error("E_INTERNAL: " + where + ": " + e.what());
    return 1;
  } catch (...) {
    tessera::print_error("E_INTERNAL: " + where + ": unknown exception");
    return 1;
  }
}
