#include "io/network_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/limits.h"

namespace tessera {

using ojson = nlohmann::ordered_json;

const char* json_type(const ojson& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a number";
  return j.type_name();  // "string", "boolean", "array", "object", "null"
}

namespace {

// Names of inputs and nodes become sources and PyTorch state_dict names. A node name may be a
// nested module path ("encoder.layers.0.self_attn", interfaces.md §2), so '.' is allowed, but
// not an empty segment ("a..b", ".a", "a."), which no module path has and which would make
// "node.port" ambiguous.
void check_name(const std::string& name, const std::string& what, const std::string& where) {
  if (name.empty()) fail(ErrorCode::Arg, where, what + " name is empty");
  if (name.front() == '.' || name.back() == '.' || name.find("..") != std::string::npos)
    fail(ErrorCode::Arg, where,
         what + " name '" + name + "' has an empty '.'-separated part");
}

SymShape parse_shape(const ojson& j, const std::string& input, const std::string& where) {
  if (!j.is_array())
    fail(ErrorCode::Arg, where, "input " + input + ": shape must be an array, got " + json_type(j));
  if (j.size() > static_cast<size_t>(kMaxRank))
    fail(ErrorCode::Shape, where,
         "input " + input + ": rank " + std::to_string(j.size()) + " exceeds the limit of " +
             std::to_string(kMaxRank) + " dimensions");
  SymShape shape;
  for (const ojson& d : j) {
    if (d.is_number_unsigned()) {
      const auto v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX))
        fail(ErrorCode::Shape, where,
             "input " + input + ": dimension " + std::to_string(v) + " does not fit int64");
      shape.push_back(Dim::fixed(static_cast<int64_t>(v)));
    } else if (d.is_number_integer()) {
      fail(ErrorCode::Shape, where,
           "input " + input + ": dimension " + std::to_string(d.get<int64_t>()) + " is negative");
    } else if (d.is_string()) {
      const std::string sym = d.get<std::string>();
      if (!is_symbol_name(sym))
        fail(ErrorCode::Arg, where,
             "input " + input + ": open dimension '" + sym +
                 "' is not a symbol name (letters, digits, '_'; not starting with a digit)");
      shape.push_back(Dim::open(sym));
    } else {
      fail(ErrorCode::Arg, where,
           "input " + input + ": a dimension must be an integer or a symbol string, got " +
               json_type(d));
    }
  }
  return shape;
}

DType parse_dtype_value(const ojson& j, const std::string& what, const std::string& where) {
  if (!j.is_string()) fail(ErrorCode::Arg, where, what + " must be a string, got " + json_type(j));
  const auto t = parse_dtype(j.get<std::string>());
  if (!t)
    fail(ErrorCode::DType, where,
         what + " '" + j.get<std::string>() +
             "' is not a dtype (float32, float16, bfloat16, float64, bool, ...)");
  return *t;
}

// True when arrays and objects nest deeper than `limit` levels in `j` (a scalar is level 0).
// Walked with an explicit stack: the point is to refuse what would overflow the call stack.
bool nests_deeper_than(const ojson& j, int limit) {
  std::vector<std::pair<const ojson*, int>> stack = {{&j, 0}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth + 1 > limit) return true;
    for (const ojson& child : *v) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

[[noreturn]] void fail_too_deep(const std::string& origin) {
  fail(ErrorCode::Format, origin,
       "JSON nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

// The network described by `j`, whose depth is already known to be within kMaxJsonDepth.
NetworkSpec spec_from_json(const ojson& j, const std::string& origin);

std::string read_text_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorCode::IO, path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorCode::IO, path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorCode::IO, path,
         S_ISDIR(st.st_mode) ? "is a directory, not a network file" : "is not a regular file");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      fail(ErrorCode::IO, path, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace

NetworkSpec parse_network(const std::string& json_text, const std::string& origin) {
  // Depth is refused while parsing, not after: ordered_map stores members in a std::vector,
  // whose growth copies (recursively) the members already parsed, so a 200,000-deep value
  // followed by one more key overflowed the stack inside parse() itself (security suite).
  struct TooDeep {};
  const auto refuse_deep = [](int depth, nlohmann::json::parse_event_t event, ojson&) {
    const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                       event == nlohmann::json::parse_event_t::array_start;
    // `depth` counts the containers around this one: the root object is level 1.
    if (opens && depth + 1 > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  ojson j;
  try {
    j = ojson::parse(json_text, refuse_deep);
  } catch (const TooDeep&) {
    fail_too_deep(origin);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number past the double range ("1e606") is out_of_range.406.
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 7: ...";
    // the bracketed id means nothing to a user.
    std::string what = e.what();
    const size_t close = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    fail(ErrorCode::Format, origin, "not valid JSON: " + what);
  }
  return spec_from_json(j, origin);  // the parse already bounded the depth
}

NetworkSpec parse_network(const ojson& j, const std::string& origin) {
  // A value built by the caller: nlohmann destroys values without recursion, but copies and
  // prints them recursively (args are copied, and printed in messages): refuse depth first.
  if (nests_deeper_than(j, kMaxJsonDepth)) fail_too_deep(origin);
  return spec_from_json(j, origin);
}

namespace {

// The top level: an object with inputs, nodes and outputs, optionally dtype, and nothing else.
void check_network_keys(const ojson& j, const std::string& where) {
  if (!j.is_object())
    fail(ErrorCode::Arg, where,
         std::string("the network must be a JSON object, got ") + json_type(j));
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "dtype" && key != "inputs" && key != "nodes" && key != "outputs")
      fail(ErrorCode::Arg, where,
           "unknown key '" + key + "' (a network has dtype, inputs, nodes, outputs)");
  }
  for (const char* key : {"inputs", "nodes", "outputs"})
    if (!j.contains(key)) fail(ErrorCode::Arg, where, std::string("missing '") + key + "'");
}

// One input: a shape, or an object {shape, dtype}; of `dtype` (the network's) unless it names one.
NetworkInput parse_input(const std::string& name, const ojson& value, DType dtype,
                         const std::string& where) {
  check_name(name, "input", where);
  NetworkInput in;
  in.name = name;
  in.dtype = dtype;
  if (value.is_object()) {
    for (const auto& [key, v] : value.items()) {
      (void)v;
      if (key != "shape" && key != "dtype")
        fail(ErrorCode::Arg, where,
             "input " + name + ": unknown key '" + key + "' (an input has shape, dtype)");
    }
    if (!value.contains("shape")) fail(ErrorCode::Arg, where, "input " + name + ": no shape");
    in.shape = parse_shape(value["shape"], name, where);
    if (value.contains("dtype"))
      in.dtype = parse_dtype_value(value["dtype"], "input " + name + ": dtype", where);
  } else {
    in.shape = parse_shape(value, name, where);
  }
  return in;
}

// The inputs, whose names are added to `names`.
std::vector<NetworkInput> parse_inputs(const ojson& inputs, DType dtype,
                                       std::set<std::string>& names, const std::string& where) {
  if (!inputs.is_object())
    fail(ErrorCode::Arg, where, std::string("inputs must be an object, got ") + json_type(inputs));
  std::vector<NetworkInput> out;
  for (const auto& [name, value] : inputs.items()) {
    out.push_back(parse_input(name, value, dtype, where));
    names.insert(name);
  }
  return out;
}

// "attention@1" is identity attention, version 1: the only version of every op today.
void strip_op_version(NetworkNode& node) {
  const size_t at = node.op.find('@');
  if (at == std::string::npos) return;
  const std::string version = node.op.substr(at + 1);
  node.op.resize(at);
  if (version != "1")
    fail(ErrorCode::Arg, node.name + " (" + node.op + ")",
         "unknown version @" + version + " of op " + node.op + " (tessera has @1)");
}

// A node's "inputs": port -> source, in file order.
std::vector<std::pair<std::string, std::string>> parse_node_inputs(const ojson& ports,
                                                                   const std::string& node_where) {
  if (!ports.is_object())
    fail(ErrorCode::Arg, node_where,
         std::string("inputs must be an object (port -> source), got ") + json_type(ports));
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [port, src] : ports.items()) {
    if (!src.is_string())
      fail(ErrorCode::Arg, node_where,
           "input port " + port + ": a source must be a string, got " + json_type(src));
    out.emplace_back(port, src.get<std::string>());
  }
  return out;
}

// nodes[i]. Its name must not be in `names` (the inputs and earlier nodes) and is added to it.
NetworkNode parse_node(const ojson& n, size_t i, std::set<std::string>& names) {
  std::string node_where = "nodes[" + std::to_string(i) + "]";
  if (!n.is_object())
    fail(ErrorCode::Arg, node_where, std::string("a node must be an object, got ") + json_type(n));
  if (!n.contains("name") || !n["name"].is_string())
    fail(ErrorCode::Arg, node_where, "a node needs a string 'name'");
  if (!n.contains("op") || !n["op"].is_string())
    fail(ErrorCode::Arg, node_where, "a node needs a string 'op'");
  NetworkNode node;
  node.name = n["name"].get<std::string>();
  node.op = n["op"].get<std::string>();
  strip_op_version(node);
  node_where = node.name + " (" + node.op + ")";
  check_name(node.name, "node", node_where);
  if (!names.insert(node.name).second)
    fail(ErrorCode::Arg, node_where,
         "the name " + node.name + " is already taken by an earlier input or node");
  for (const auto& [key, v] : n.items()) {
    (void)v;
    if (key != "name" && key != "op" && key != "args" && key != "inputs")
      fail(ErrorCode::Arg, node_where,
           "unknown key '" + key + "' (a node has name, op, args, inputs)");
  }
  node.args = ojson::object();
  if (n.contains("args")) {
    if (!n["args"].is_object())
      fail(ErrorCode::Arg, node_where,
           std::string("args must be an object, got ") + json_type(n["args"]));
    node.args = n["args"];
  }
  if (n.contains("inputs")) node.inputs = parse_node_inputs(n["inputs"], node_where);
  return node;
}

// The nodes, whose names are added to `names`.
std::vector<NetworkNode> parse_nodes(const ojson& nodes, std::set<std::string>& names,
                                     const std::string& where) {
  if (!nodes.is_array())
    fail(ErrorCode::Arg, where, std::string("nodes must be an array, got ") + json_type(nodes));
  std::vector<NetworkNode> out;
  for (size_t i = 0; i < nodes.size(); ++i) out.push_back(parse_node(nodes[i], i, names));
  return out;
}

// The outputs: name -> source, at least one.
std::vector<std::pair<std::string, std::string>> parse_outputs(const ojson& outputs,
                                                               const std::string& where) {
  if (!outputs.is_object())
    fail(ErrorCode::Arg, where,
         std::string("outputs must be an object (name -> source), got ") + json_type(outputs));
  if (outputs.empty()) fail(ErrorCode::Arg, where, "the network has no outputs");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, src] : outputs.items()) {
    if (name.empty()) fail(ErrorCode::Arg, where, "an output name is empty");
    if (!src.is_string())
      fail(ErrorCode::Arg, where,
           "output " + name + ": a source must be a string, got " + json_type(src));
    out.emplace_back(name, src.get<std::string>());
  }
  return out;
}

NetworkSpec spec_from_json(const ojson& j, const std::string& origin) {
  const std::string& where = origin;
  check_network_keys(j, where);

  NetworkSpec spec;
  spec.origin = origin;
  if (j.contains("dtype")) spec.dtype = parse_dtype_value(j["dtype"], "dtype", where);

  std::set<std::string> names;  // inputs and nodes share one namespace: sources name either
  spec.inputs = parse_inputs(j["inputs"], spec.dtype, names, where);
  spec.nodes = parse_nodes(j["nodes"], names, where);
  spec.outputs = parse_outputs(j["outputs"], where);
  return spec;
}

}  // namespace

NetworkSpec network_from_checkpoint(const SafetensorsFile& file) {
  const auto it = file.metadata().find(kNetworkMetadataKey);
  if (it == file.metadata().end())
    fail(ErrorCode::Arg, file.path(),
         std::string("the checkpoint carries no network (no '") + kNetworkMetadataKey +
             "' in its metadata)");
  return parse_network(it->second, file.path() + " (" + kNetworkMetadataKey + ")");
}

bool is_safetensors_path(const std::string& path) {
  if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) return true;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorCode::IO, path, std::string("cannot open: ") + std::strerror(errno));
  unsigned char head[8];
  ssize_t n;
  do {
    n = ::read(fd, head, sizeof(head));
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    // A directory reads as EISDIR: report it as the text reader would.
    if (err == EISDIR) fail(ErrorCode::IO, path, "is a directory, not a network file");
    fail(ErrorCode::IO, path, std::string("cannot read: ") + std::strerror(err));
  }
  for (ssize_t i = 0; i < n; ++i)
    if (head[i] == 0) return true;
  return false;
}

NetworkSpec load_network(const std::string& path, std::optional<SafetensorsFile>* checkpoint) {
  if (checkpoint) checkpoint->reset();
  if (is_safetensors_path(path)) {
    SafetensorsFile file = SafetensorsFile::open(path);
    NetworkSpec spec = network_from_checkpoint(file);
    if (checkpoint) checkpoint->emplace(std::move(file));
    return spec;
  }
  return parse_network(read_text_file(path), path);
}

}  // namespace tessera
