#include "layers/network.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <limits>
#include <set>
#include <type_traits>

#include "backends/cpu/cpu_device.h"
#include "core/allocator.h"
#include "core/limits.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

// The dtype a network input has inside the graph: a float input is the plan dtype; a bool input
// stays bool (a mask); an integer one is int64 (token ids; int32 is widened). Anything else
// cannot feed an op.
DType graph_dtype(const NetworkInput& in, DType plan) {
  if (dtype_is_floating(in.dtype)) return plan;
  if (in.dtype == DType::Bool) return DType::Bool;
  if (in.dtype == DType::I64 || in.dtype == DType::I32) return DType::I64;
  fail(ErrorCode::DType, "input " + in.name,
       std::string("dtype ") + dtype_name(in.dtype) +
           " is not supported for network inputs (float types, bool for masks, int64 for ids)");
}

SymShape substitute(const SymShape& shape, const SymbolBindings& bindings) {
  SymShape out = shape;
  for (Dim& d : out) {
    if (!d.is_symbol()) continue;
    const auto it = bindings.find(d.text);
    if (it != bindings.end()) d = Dim::fixed(it->second);
  }
  return out;
}

// Checks concrete `shape` against input `name`'s declared shape and binds its symbols; a symbol
// bound before (by another input, or by the network) must get the same value. `origin` records
// which input bound each symbol, for the message.
void bind_shape(const std::string& name, const SymShape& declared, const Shape& shape,
                SymbolBindings& bindings, std::map<std::string, std::string>& origin) {
  const std::string where = "input " + name;
  if (shape.size() != declared.size())
    fail(ErrorCode::Shape, where,
         "shape " + shape_to_string(shape) + " does not fit " + sym_shape_to_string(declared) +
             " (rank " + str(static_cast<int64_t>(shape.size())) + ", not " +
             str(static_cast<int64_t>(declared.size())) + ")");
  for (size_t i = 0; i < shape.size(); ++i) {
    const Dim& d = declared[i];
    const int64_t v = shape[i];
    if (v < 0)
      fail(ErrorCode::Shape, where, "shape " + shape_to_string(shape) + " has a negative dim");
    if (d.is_fixed()) {
      if (d.value != v)
        fail(ErrorCode::Shape, where,
             "shape " + shape_to_string(shape) + " does not fit " + sym_shape_to_string(declared) +
                 ": dim " + str(static_cast<int64_t>(i)) + " is " + str(v) +
                 ", the network fixes it to " + str(d.value));
      continue;
    }
    const auto [it, inserted] = bindings.emplace(d.text, v);
    if (!inserted && it->second != v) {
      const auto o = origin.find(d.text);
      fail(ErrorCode::Shape, where,
           "shape " + shape_to_string(shape) + " does not fit " + sym_shape_to_string(declared) +
               ": dim " + str(static_cast<int64_t>(i)) + " (" + d.text + ") is " + str(v) +
               ", but " + d.text + "=" + str(it->second) +
               (o != origin.end() ? " from " + o->second : std::string(" in the network")));
    }
    if (inserted) origin[d.text] = where;
  }
}

struct Graph {
  std::vector<NetworkValue> values;
  std::vector<ResolvedNode> nodes;
  std::vector<int> inputs;
  std::vector<std::pair<std::string, int>> outputs;
  std::map<std::pair<int, std::string>, int> parameter_values;  // (node, parameter) -> value
};

// Finds the value a source names (interfaces.md §2), with a message that says why when there is
// none: a network input of that name; else the longest node name that equals the source or is
// followed in it by '.', and then what follows the '.': one of its output ports (none: the
// first), or one of its parameters (a value made on first use, shared by later readers).
class SourceTable {
 public:
  explicit SourceTable(const NetworkSpec& spec) {
    for (size_t i = 0; i < spec.inputs.size(); ++i)
      input_index_[spec.inputs[i].name] = static_cast<int>(i);
    for (size_t i = 0; i < spec.nodes.size(); ++i)
      node_index_[spec.nodes[i].name] = static_cast<int>(i);
  }

  // `current` is the index of the node asking (nodes.size() for the network outputs).
  int find(const std::string& source, Graph& g, int current, const std::string& where,
           const std::string& who) const {
    const auto in = input_index_.find(source);
    if (in != input_index_.end()) return g.inputs[static_cast<size_t>(in->second)];
    // Candidate node names, longest first: the whole source, then up to each '.' from the right.
    size_t cut = source.size();
    auto n = node_index_.end();
    for (;;) {
      n = node_index_.find(source.substr(0, cut));
      if (n != node_index_.end() || cut == 0) break;
      const size_t dot = source.rfind('.', cut - 1);
      if (dot == std::string::npos) break;
      cut = dot;
    }
    if (n == node_index_.end())
      fail(ErrorCode::Arg, where,
           who + ": unknown source '" + source + "' (not a network input or a node)");
    const std::string& node = n->first;
    if (n->second >= current)
      fail(ErrorCode::Arg, where,
           who + ": source '" + source + "' refers to node " + node +
               (n->second == current ? ", this node itself" : ", which comes later") +
               " (nodes run in file order)");
    const ResolvedNode& rn = g.nodes[static_cast<size_t>(n->second)];
    if (cut == source.size()) return rn.outputs[0];
    const std::string rest = source.substr(cut + 1);
    for (size_t k = 0; k < rn.output_ports.size(); ++k)
      if (rn.output_ports[k] == rest) return rn.outputs[k];
    for (const auto& [param, shape] : rn.parameters) {
      if (param != rest) continue;
      const auto key = std::make_pair(n->second, param);
      const auto it = g.parameter_values.find(key);
      if (it != g.parameter_values.end()) return it->second;
      const int id = static_cast<int>(g.values.size());
      g.values.push_back({source, {fixed_shape(shape), DType::F32, {}}, n->second, -1, param});
      g.parameter_values.emplace(key, id);
      return id;
    }
    std::vector<std::string> params;
    for (const auto& p : rn.parameters) params.push_back(p.first);
    fail(ErrorCode::Arg, where,
         who + ": node " + node + " (" + rn.op->name() + ") has no output port or parameter '" +
             rest + "' (ports: " + join(rn.output_ports) +
             (params.empty() ? std::string() : "; parameters: " + join(params)) + ")");
  }

 private:
  std::map<std::string, int> input_index_;
  std::map<std::string, int> node_index_;
};

// One pass over the network with these input types: every source looked up, every op's
// inference run. Symbols the ops fix land in `bound`.
Graph build(const NetworkSpec& spec, const std::vector<std::shared_ptr<const Op>>& ops,
            const std::vector<ValueType>& input_types, SymbolBindings& bound) {
  Graph g;
  SourceTable sources(spec);
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const int id = static_cast<int>(g.values.size());
    g.values.push_back({spec.inputs[i].name, input_types[i], -1, static_cast<int>(i), {}});
    g.inputs.push_back(id);
  }
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const NetworkNode& node = spec.nodes[i];
    const Op& op = *ops[i];
    ResolvedNode rn;
    rn.name = node.name;
    rn.op = ops[i];
    const std::vector<PortSpec> ports = op.input_ports();
    for (const PortSpec& p : ports) rn.input_ports.push_back(p.name);
    rn.inputs.assign(ports.size(), -1);
    for (const auto& [port, source] : node.inputs) {
      const size_t k = static_cast<size_t>(
          std::find(rn.input_ports.begin(), rn.input_ports.end(), port) - rn.input_ports.begin());
      rn.inputs[k] = sources.find(source, g, static_cast<int>(i), op.where(), "input port " + port);
    }
    std::vector<const ValueType*> in;
    for (int id : rn.inputs)
      in.push_back(id >= 0 ? &g.values[static_cast<size_t>(id)].type : nullptr);
    InferResult r = op.infer(in, bound);
    rn.output_ports = op.output_ports();
    if (r.outputs.size() != rn.output_ports.size())
      fail(ErrorCode::Internal, op.where(),
           "inferred " + str(static_cast<int64_t>(r.outputs.size())) + " outputs for " +
               str(static_cast<int64_t>(rn.output_ports.size())) + " ports");
    rn.parameters = std::move(r.parameters);
    for (size_t j = 0; j < rn.output_ports.size(); ++j) {
      const int id = static_cast<int>(g.values.size());
      const std::string full = node.name + "." + rn.output_ports[j];
      g.values.push_back({j == 0 ? node.name : full, std::move(r.outputs[j]), static_cast<int>(i),
                          static_cast<int>(j), {}});
      rn.outputs.push_back(id);
    }
    g.nodes.push_back(std::move(rn));
  }
  for (const auto& [name, source] : spec.outputs)
    g.outputs.emplace_back(name, sources.find(source, g, static_cast<int>(spec.nodes.size()),
                                              spec.origin, "output " + name));
  return g;
}

}  // namespace

// ---------------------------------------------------------------- Network

Network Network::resolve(const NetworkSpec& spec,
                         const std::map<std::string, Shape>& input_shapes) {
  if (spec.dtype != DType::F32) {
    if (!dtype_is_floating(spec.dtype))
      fail(ErrorCode::DType, spec.origin,
           std::string("dtype=") + dtype_name(spec.dtype) + " is not a compute dtype");
    fail(ErrorCode::Unsupported, spec.origin,
         std::string("dtype=") + dtype_name(spec.dtype) +
             " is not supported: tessera computes in float32 (weights and inputs of other float "
             "types are converted)");
  }
  Network net;
  net.spec_ = spec;
  std::vector<std::shared_ptr<const Op>> ops;
  for (const NetworkNode& node : spec.nodes) ops.push_back(make_op(node));

  std::vector<ValueType> declared;
  for (const NetworkInput& in : spec.inputs)
    declared.push_back({in.shape, graph_dtype(in, spec.dtype)});

  SymbolBindings bindings;
  std::map<std::string, std::string> origin;
  for (const auto& [name, shape] : input_shapes) {
    // Captured through a plain reference: clang 14 (the fuzz build) cannot capture a structured
    // binding in a lambda, a C++20 feature it gained in clang 16.
    const std::string& input_name = name;
    const auto it = std::find_if(spec.inputs.begin(), spec.inputs.end(),
                                 [&](const NetworkInput& in) { return in.name == input_name; });
    if (it == spec.inputs.end()) {
      std::vector<std::string> names;
      for (const NetworkInput& in : spec.inputs) names.push_back(in.name);
      fail(ErrorCode::Arg, "--shape",
           "'" + name + "' is not a network input (inputs: " + join(names) + ")");
    }
    bind_shape(name, it->shape, shape, bindings, origin);
  }

  // Each pass that fixes a new symbol (an attention grid fixing T) is followed by another with
  // the symbol substituted everywhere, so every shape prints it as a number; there are at most
  // as many passes as symbols, plus one.
  for (;;) {
    std::vector<ValueType> types = declared;
    for (ValueType& t : types) t.shape = substitute(t.shape, bindings);
    SymbolBindings fixed_now = bindings;
    Graph g = build(spec, ops, types, fixed_now);
    bool grew = false;
    for (const auto& [sym, value] : fixed_now) grew |= bindings.emplace(sym, value).second;
    if (!grew) {
      net.values_ = std::move(g.values);
      net.nodes_ = std::move(g.nodes);
      net.inputs_ = std::move(g.inputs);
      net.outputs_ = std::move(g.outputs);
      break;
    }
  }
  net.bindings_ = std::move(bindings);
  return net;
}

std::string parameter_key(const std::string& node, const std::string& param) {
  if (param.empty()) return node;
  std::string key = node;
  key += '.';
  key += param;
  return key;
}

int64_t Network::parameter_count() const {
  // A node reading another's parameter declares none itself: each tensor is counted once.
  int64_t n = 0;
  for (const ResolvedNode& node : nodes_)
    for (const auto& p : node.parameters) n += shape_numel(p.second);
  return n;
}

std::string Network::summary() const {
  auto side = [&](const std::vector<std::pair<std::string, int>>& items) {
    if (items.size() == 1)
      return sym_shape_to_string(values_[static_cast<size_t>(items[0].second)].type.shape);
    std::vector<std::string> parts;
    for (const auto& [name, id] : items)
      parts.push_back(name + "=" +
                      sym_shape_to_string(values_[static_cast<size_t>(id)].type.shape));
    return join(parts);
  };
  std::vector<std::pair<std::string, int>> ins;
  for (size_t i = 0; i < inputs_.size(); ++i) ins.emplace_back(spec_.inputs[i].name, inputs_[i]);
  std::string s = "Network: " + side(ins) + " -> " + side(outputs_) +
                  " dtype=" + dtype_name(spec_.dtype) + "\n";

  std::vector<std::vector<std::string>> rows = {
      {"index", "name", "operation", "input shapes", "output shapes"}};
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const ResolvedNode& n = nodes_[i];
    std::vector<std::string> in, out;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] >= 0)
        in.push_back(n.input_ports[k] + "=" +
                     sym_shape_to_string(values_[static_cast<size_t>(n.inputs[k])].type.shape));
    for (size_t k = 0; k < n.outputs.size(); ++k)
      out.push_back(n.output_ports[k] + "=" +
                    sym_shape_to_string(values_[static_cast<size_t>(n.outputs[k])].type.shape));
    rows.push_back({std::to_string(i), n.name, n.op->name(), join(in), join(out)});
  }
  // Columns two spaces apart, each as wide as its widest cell; the last one is not padded.
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    s += line + "\n";
  }
  return s + "Parameters: " + thousands(parameter_count()) + "\n";
}

std::vector<ValueType> Network::bind(const std::vector<ValueType>& inputs) const {
  if (inputs.size() != inputs_.size())
    fail(ErrorCode::Internal, "network",
         "bind got " + str(static_cast<int64_t>(inputs.size())) + " inputs for " +
             str(static_cast<int64_t>(inputs_.size())));
  SymbolBindings bindings;
  std::map<std::string, std::string> origin;
  std::vector<ValueType> types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const NetworkValue& v = values_[static_cast<size_t>(inputs_[i])];
    bind_shape(v.name, v.type.shape, concrete_shape(inputs[i].shape), bindings, origin);
    types.push_back(inputs[i]);
  }
  std::vector<std::shared_ptr<const Op>> ops;
  for (const ResolvedNode& n : nodes_) ops.push_back(n.op);
  // Symbols the network fixed itself (resolve's bindings_) are bound again by the ops that fix
  // them; those the inputs bound are known to every op (a reshape to ["B", -1]).
  Graph g = build(spec_, ops, types, bindings);
  std::vector<ValueType> out;
  for (NetworkValue& v : g.values) {
    // A symbol an argument names (reshape to ["C", -1]) that no input binds stays open.
    for (const Dim& d : v.type.shape)
      if (!d.is_fixed())
        fail(ErrorCode::Shape,
             v.producer >= 0 ? nodes_[static_cast<size_t>(v.producer)].op->where() : v.name,
             "value " + v.name + " has shape " + sym_shape_to_string(v.type.shape) + ": " + d.text +
                 " is bound by no input");
    out.push_back(std::move(v.type));
  }
  return out;
}

// ---------------------------------------------------------------- Model

Model::Model(const NetworkSpec& spec, std::optional<uint64_t> seed)
    : Model(Network::resolve(spec), seed) {}

Model::Model(Network network, std::optional<uint64_t> seed) : network_(std::move(network)) {
  // A network file of a few bytes can declare a [10^12, 10^12] weight: what the layers will
  // hold is checked against the memory budget before the first one is built.
  for (const ResolvedNode& node : network_.nodes()) {
    std::vector<const ValueType*> in;
    for (int id : node.inputs)
      in.push_back(id >= 0 ? &network_.values()[static_cast<size_t>(id)].type : nullptr);
    for (const auto& p : node.parameters) memory_bytes_ += sizeof(float) * elements(p.second);
    memory_bytes_ += node.op->resident_bytes(in);
  }
  check_memory_budget(memory_bytes_, network_.spec().origin,
                      "the model (parameters and precomputed tables)");
  Generator gen(seed.value_or(0));
  for (const ResolvedNode& node : network_.nodes()) {
    std::vector<const ValueType*> in;
    for (int id : node.inputs)
      in.push_back(id >= 0 ? &network_.values()[static_cast<size_t>(id)].type : nullptr);
    layers_.push_back(
        node.op->instantiate(in, seed ? std::optional<uint64_t>(gen.next_u64()) : std::nullopt));
    // The resolver counts parameters from the documented rules without building layers; the
    // layer is the authority. They must agree, or summary and loading would disagree.
    std::vector<std::pair<std::string, Shape>> declared;
    if (const ParameterSet* ps = layers_.back()->parameters())
      for (const Parameter& p : ps->all()) declared.emplace_back(p.name, p.shape);
    std::vector<std::pair<std::string, Shape>> expected = node.parameters;
    std::sort(declared.begin(), declared.end());
    std::sort(expected.begin(), expected.end());
    if (declared != expected)
      fail(ErrorCode::Internal, node.op->where(),
           "the layer declares other parameters than the resolver counted");
  }
  if (seed) pack_projections();
}

// A projection weight read through a layer's port (a tied LM head): the other node's parameter
// behind it, when it is one that can be packed; null otherwise.
const Parameter* Model::tied_projection(size_t node, int port) const {
  const int v = network_.nodes()[node].inputs[static_cast<size_t>(port)];
  if (v < 0) return nullptr;
  const NetworkValue& nv = network_.values()[static_cast<size_t>(v)];
  if (nv.port >= 0 || nv.producer < 0) return nullptr;  // not a parameter
  const ParameterSet* ps = layers_[static_cast<size_t>(nv.producer)]->parameters();
  const Parameter* p = ps ? ps->find(nv.parameter) : nullptr;
  return p && projection_weight_packable(p->value) ? p : nullptr;
}

// Every tied projection: fn(its slot, the parameter behind the port, the parameter's key).
template <typename Self, typename Fn>
void Model::visit_tied_projections(Self& self, Fn&& fn) {
  using Slot = std::conditional_t<std::is_const_v<Self>, const PortPanels&, PortPanels&>;
  const auto& nodes = self.network_.nodes();
  for (size_t i = 0; i < self.layers_.size(); ++i)
    for (size_t port = 0; port < nodes[i].inputs.size(); ++port) {
      PortPanels* slot = self.layers_[i]->port_panels(static_cast<int>(port));
      if (!slot) continue;
      const Parameter* p = self.tied_projection(i, static_cast<int>(port));
      if (!p) continue;
      const NetworkValue& nv = self.network_.values()[static_cast<size_t>(nodes[i].inputs[port])];
      fn(static_cast<Slot>(*slot), *p,
         parameter_key(nodes[static_cast<size_t>(nv.producer)].name, nv.parameter));
    }
}

template <typename Fn>
void Model::for_each_tied_projection(Fn&& fn) {
  visit_tied_projections(*this, fn);
}

template <typename Fn>
void Model::for_each_tied_projection(Fn&& fn) const {
  visit_tied_projections(*this, fn);
}

void Model::pack_projections(const PanelLookup* packed) {
  const Device& device = cpu_device();
  double held = 0.0, more = 0.0;
  for (const auto& layer : layers_)
    if (const ParameterSet* ps = layer->parameters()) {
      more += sizeof(float) * static_cast<double>(ps->unpacked_panel_floats(device));
      for (const Parameter& p : ps->all())
        if (p.panels.defined()) held += static_cast<double>(p.panels.nbytes());
    }
  for_each_tied_projection([&](PortPanels& slot, const Parameter& p, const std::string&) {
    if (slot.panels.defined() && slot.rows == p.value.data<float>())
      held += static_cast<double>(slot.panels.nbytes());
    else
      more += sizeof(float) * static_cast<double>(projection_panel_floats(
                                  device, p.value.size(0), p.value.size(1)));
  });
  if (more == 0.0) return;
  check_memory_budget(memory_bytes_ + held + more, network_.spec().origin,
                      "the model (parameters, precomputed tables and packed weights)");
  const auto& nodes = network_.nodes();
  bool adopted = false;
  auto find = [&](const std::string& key, int64_t rows, int64_t cols, int64_t floats) {
    if (packed == nullptr) return Tensor();
    Tensor found = (*packed)(key, rows, cols, floats);
    adopted = adopted || found.defined();
    return found;
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    ParameterSet* ps = layers_[i]->parameters();
    if (!ps) continue;
    ps->pack_projections(device, [&](const Parameter& p, int64_t floats) {
      return find(parameter_key(nodes[i].name, p.name), p.value.size(0), p.value.size(1), floats);
    });
  }
  for_each_tied_projection([&](PortPanels& slot, const Parameter& p, const std::string& key) {
    const float* rows = p.value.data<float>();
    if (slot.panels.defined() && slot.rows == rows) return;
    const int64_t n = p.value.size(0), k = p.value.size(1);
    slot.rows = rows;
    slot.panels = find(key, n, k, projection_panel_floats(device, n, k));
    if (!slot.panels.defined()) slot.panels = pack_projection_panels(device, p.value);
  });
  panel_bytes_ = held + more;
  if (adopted) drop_unread_checkpoint_pages();
}

// Panels that came from elsewhere leave their weights' rows in the checkpoint unread, but the
// first read of a tensor beside them (a bias, a norm) maps the page-cache pages around it too
// (fault-around: the aligned 64 KiB window of the faulting page): 12 MB of swin_t's projection
// rows became resident that way (peak RSS 154 MB against 140 when packing, where the packing's
// reads had mapped the other tensors' edges already and the rows were dropped after). So the
// pages of every other tensor that share a window with something else are read here, then the
// rows dropped, as packing leaves them. Only those edge windows: the interior of an embedding
// table read row by row stays unread (gpt 124M's is 154 MB).
// Linux 6.18 maps a large page-cache folio whole on fault-around, and a freshly written file is
// held in folios of up to 2 MiB: touching vit_b_16's ~100 small tensors then mapped 87 MB of
// projection rows before the final release (peak RSS 436 MB against 349, Zen 5, a checkpoint
// just written by Python). The rows within one folio (2 MiB either side) of each window are
// therefore dropped as soon as the window is read, so at most a few folios are mapped at once.
void Model::drop_unread_checkpoint_pages() const {
  constexpr uintptr_t kPage = 4096, kWindow = 65536, kLargestFolio = uintptr_t{2} << 20;
  struct Range {
    uintptr_t begin, end;
  };
  std::vector<Range> packed;  // the rows of every packed projection, by address
  for (const auto& layer : layers_)
    if (const ParameterSet* ps = layer->parameters())
      for (const Parameter& p : ps->all())
        if (p.panels.defined() && p.value.file_mapped() && p.value.nbytes() > 0) {
          const auto begin = reinterpret_cast<uintptr_t>(p.value.raw_data());
          packed.push_back({begin, begin + p.value.nbytes()});
        }
  std::sort(packed.begin(), packed.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // Drops the packed rows inside [lo, hi).
  auto release_near = [&](uintptr_t lo, uintptr_t hi) {
    auto it = std::lower_bound(packed.begin(), packed.end(), lo,
                               [](const Range& r, uintptr_t at) { return r.end <= at; });
    for (; it != packed.end() && it->begin < hi; ++it) {
      const uintptr_t b = std::max(lo, it->begin), e = std::min(hi, it->end);
      if (e > b) release_file_pages(reinterpret_cast<const void*>(b), e - b);
    }
  };
  volatile uint8_t sink = 0;
  auto touch = [&](uintptr_t window, uintptr_t begin, uintptr_t end) {
    for (uintptr_t at = std::max(window, begin); at < std::min(window + kWindow, end);
         at = (at / kPage + 1) * kPage)
      sink = sink + *reinterpret_cast<const uint8_t*>(at);
    release_near(window > kLargestFolio ? window - kLargestFolio : 0,
                 window + kWindow + kLargestFolio);
  };
  for (const auto& layer : layers_)
    if (const ParameterSet* ps = layer->parameters())
      for (const Parameter& p : ps->all())
        if (!p.panels.defined() && p.value.file_mapped() && p.value.nbytes() > 0) {
          const auto begin = reinterpret_cast<uintptr_t>(p.value.raw_data());
          const uintptr_t end = begin + p.value.nbytes();
          const uintptr_t first = begin / kWindow * kWindow, last = (end - 1) / kWindow * kWindow;
          touch(first, begin, end);
          if (last != first) touch(last, begin, end);
        }
  for (const Range& r : packed)
    release_file_pages(reinterpret_cast<const void*>(r.begin), r.end - r.begin);
}

std::vector<PackedProjection> Model::packed_projections() const {
  std::vector<PackedProjection> out;
  const auto& nodes = network_.nodes();
  for (size_t i = 0; i < layers_.size(); ++i)
    if (const ParameterSet* ps = layers_[i]->parameters())
      for (const Parameter& p : ps->all())
        if (p.panels.defined())
          out.push_back({parameter_key(nodes[i].name, p.name), p.value.size(0), p.value.size(1),
                         &p.panels});
  std::set<std::string> tied;  // two heads reading one tensor store it once
  for_each_tied_projection([&](const PortPanels& slot, const Parameter& p, const std::string& key) {
    if (slot.panels.defined() && slot.rows == p.value.data<float>() && tied.insert(key).second)
      out.push_back({key, p.value.size(0), p.value.size(1), &slot.panels});
  });
  return out;
}

namespace {

// Whether checkpoint tensor `t` holds exactly the buffer value `want` (any number dtype).
bool same_values(const Tensor& t, const Tensor& want) {
  return t.shape() == want.shape() && t.to_double_vector() == want.to_double_vector();
}

}  // namespace

WeightsReport Model::load_weights(const std::map<std::string, Tensor>& state, bool strict,
                                  const std::string& where,
                                  const std::map<std::string, std::string>& unusable,
                                  const PanelLookup* packed) {
  std::vector<std::string> missing, unexpected, misshaped;
  std::set<std::string> declared;  // every key that is a parameter or a persistent buffer
  const auto& nodes = network_.nodes();
  // Per node: its parameters' checkpoint tensors, by name within the node.
  std::vector<std::map<std::string, Tensor>> subs(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& [name, value] : nodes[i].op->persistent_buffers()) {
      const std::string key = parameter_key(nodes[i].name, name);
      declared.insert(key);
      const auto it = state.find(key);
      if (it != state.end() && !same_values(it->second, value))
        misshaped.push_back(key + " (a buffer; not the value " + nodes[i].op->where() +
                            " computes from its arguments)");
      else if (it == state.end() && unusable.count(key))
        misshaped.push_back(key + " (dtype " + unusable.at(key) +
                            " is not a number type tessera reads)");
    }
    const ParameterSet* ps = layers_[i]->parameters();
    if (!ps) continue;
    std::map<std::string, std::string> key_of;  // name within the node -> checkpoint key
    for (const Parameter& p : ps->all()) {
      const std::string key = parameter_key(nodes[i].name, p.name);
      declared.insert(key);
      key_of[p.name] = key;
      const auto it = state.find(key);
      if (it != state.end()) subs[i].emplace(p.name, it->second);
    }
    // check() names keys as given: rename "weight" back to "n0.weight".
    auto full = [&](const std::string& reported) {
      for (const auto& [name, key] : key_of)
        if (reported == name || reported.starts_with(name + " "))
          return key + reported.substr(name.size());
      return reported;
    };
    LoadResult r = ps->check(subs[i], "");
    for (const std::string& m : r.missing) {
      const std::string key = full(m);
      const auto u = unusable.find(key);
      if (u != unusable.end())
        misshaped.push_back(key + " (dtype " + u->second + " is not a number type tessera reads)");
      else
        missing.push_back(key);
    }
    for (const std::string& m : r.misshaped) misshaped.push_back(full(m));
  }
  for (const auto& entry : state)
    if (!declared.count(entry.first)) unexpected.push_back(entry.first);
  for (const auto& entry : unusable)
    if (!declared.count(entry.first)) unexpected.push_back(entry.first);
  std::sort(unexpected.begin(), unexpected.end());

  if (!misshaped.empty() || (strict && (!missing.empty() || !unexpected.empty())))
    fail(ErrorCode::Weights, where,
         strict ? describe_weight_problems(missing, unexpected, misshaped)
                : describe_weight_problems({}, {}, misshaped));
  for (size_t i = 0; i < nodes.size(); ++i)
    if (layers_[i]->parameters() && !subs[i].empty()) layers_[i]->load(subs[i]);
  pack_projections(packed);
  return {std::move(missing), std::move(unexpected)};
}

std::map<std::string, Tensor> Model::state_dict() const {
  std::map<std::string, Tensor> out;
  const auto& nodes = network_.nodes();
  for (size_t i = 0; i < nodes.size(); ++i)
    if (const ParameterSet* ps = layers_[i]->parameters())
      for (const Parameter& p : ps->all()) out[parameter_key(nodes[i].name, p.name)] = p.value;
  return out;
}

// ---------------------------------------------------------------- Plan

namespace {

// E_ARG naming every missing and every unknown input.
void check_input_names(const NetworkSpec& spec, const std::map<std::string, TensorDesc>& inputs) {
  std::vector<std::string> missing, unknown, names;
  for (const NetworkInput& in : spec.inputs) {
    names.push_back(in.name);
    if (!inputs.count(in.name)) missing.push_back(in.name);
  }
  for (const auto& entry : inputs)
    if (std::find(names.begin(), names.end(), entry.first) == names.end())
      unknown.push_back(entry.first);
  if (!missing.empty() || !unknown.empty())
    fail(ErrorCode::Arg, "inputs",
         (missing.empty() ? "" : "missing network input " + join(missing)) +
             (missing.empty() || unknown.empty() ? "" : "; ") +
             (unknown.empty() ? "" : join(unknown) + " is not a network input") +
             " (inputs: " + join(names) + ")");
}

// The graph types of the inputs as given: a float input is the plan dtype, a mask bool, ids
// int64 (stored I64 or I32).
std::vector<ValueType> graph_input_types(const Network& net,
                                         const std::map<std::string, TensorDesc>& inputs) {
  std::vector<ValueType> in_types;
  for (size_t i = 0; i < net.spec().inputs.size(); ++i) {
    const NetworkInput& in = net.spec().inputs[i];
    const TensorDesc& d = inputs.at(in.name);
    const DType declared = net.values()[static_cast<size_t>(net.inputs()[i])].type.dtype;
    DType t;
    if (declared == DType::I64 && (d.dtype == DType::I64 || d.dtype == DType::I32))
      t = DType::I64;
    else if (declared != DType::I64 && dtype_is_floating(d.dtype))
      t = net.dtype();
    else if (declared == DType::Bool && d.dtype == DType::Bool)
      t = DType::Bool;
    else
      fail(ErrorCode::DType, "input " + in.name,
           std::string("dtype ") + dtype_safetensors_name(d.dtype) + " is not accepted (" +
               (declared == DType::I64  ? "an int64 input takes I64 or I32"
                : declared == DType::Bool ? "a mask is BOOL or a float type"
                                          : "float inputs are F32, F16, BF16 or F64") +
               ")");
    in_types.push_back({fixed_shape(d.shape), t, {}});
  }
  return in_types;
}

// Floats of a plan buffer that hold a value of `type` (buffers are float32; an int64 value
// takes two floats per element).
int64_t buffer_floats(const ValueType& type) {
  const int64_t bytes =
      shape_numel(concrete_shape(type.shape)) * static_cast<int64_t>(dtype_size(type.dtype));
  return (bytes + static_cast<int64_t>(sizeof(float)) - 1) / static_cast<int64_t>(sizeof(float));
}

// Which buffer holds each value (-1: none) and each buffer's size in floats.
struct BufferAssignment {
  std::vector<int> value_buffer;
  std::vector<int64_t> capacity;
};

// Lifetimes: a value lives from its producer to its last consumer; network outputs to the end.
// Greedy assignment in execution order: each output takes the smallest free buffer that holds
// it, else the largest free one (grown), else a new one; buffers return to the free list after
// the last consumer runs. A node's outputs never share with its inputs (those are freed after),
// except `in_place[v] = u`: value v takes u's buffer (u's last reader is v's producer, a fused
// activation), which then lives as long as v. A node that `runs_with_next` (an add run inside
// the layer_norm after it) reads its inputs when that next node runs: they live until then, so
// the next node's outputs never take their buffers.
BufferAssignment assign_buffers(const Network& net, const std::vector<ValueType>& types,
                                const std::vector<int>& in_place,
                                const std::vector<char>& runs_with_next) {
  const auto& nodes = net.nodes();
  const size_t n_values = types.size();
  constexpr int kForever = std::numeric_limits<int>::max();
  std::vector<int> last_use(n_values, -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (int id : nodes[i].outputs) last_use[static_cast<size_t>(id)] = static_cast<int>(i);
    // Nodes come in order, so a later reader still overwrites i + 1.
    const int reads_at = static_cast<int>(i) + (runs_with_next[i] ? 1 : 0);
    for (int id : nodes[i].inputs)
      if (id >= 0) last_use[static_cast<size_t>(id)] = reads_at;
  }
  for (const auto& out : net.outputs()) last_use[static_cast<size_t>(out.second)] = kForever;
  for (size_t v = 0; v < n_values; ++v)
    if (in_place[v] >= 0) last_use[static_cast<size_t>(in_place[v])] = -1;  // freed through v

  BufferAssignment a;
  a.value_buffer.assign(n_values, -1);
  std::vector<int64_t>& capacity = a.capacity;
  std::vector<int> free_list;
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (int id : nodes[i].outputs) {
      if (const int u = in_place[static_cast<size_t>(id)]; u >= 0) {
        a.value_buffer[static_cast<size_t>(id)] = a.value_buffer[static_cast<size_t>(u)];
        continue;
      }
      const int64_t need = buffer_floats(types[static_cast<size_t>(id)]);
      int best = -1;
      for (int b : free_list)
        if (capacity[static_cast<size_t>(b)] >= need &&
            (best < 0 || capacity[static_cast<size_t>(b)] < capacity[static_cast<size_t>(best)]))
          best = b;
      if (best < 0)
        for (int b : free_list)
          if (best < 0 || capacity[static_cast<size_t>(b)] > capacity[static_cast<size_t>(best)])
            best = b;
      if (best < 0) {
        best = static_cast<int>(capacity.size());
        capacity.push_back(0);
      } else {
        free_list.erase(std::find(free_list.begin(), free_list.end(), best));
      }
      capacity[static_cast<size_t>(best)] = std::max(capacity[static_cast<size_t>(best)], need);
      a.value_buffer[static_cast<size_t>(id)] = best;
    }
    std::set<int> done;
    auto release = [&](int id) {
      if (id < 0 || !done.insert(id).second) return;
      const int b = a.value_buffer[static_cast<size_t>(id)];
      if (b >= 0 && last_use[static_cast<size_t>(id)] == static_cast<int>(i))
        free_list.push_back(b);
    };
    for (int id : nodes[i].inputs) release(id);
    for (int id : nodes[i].outputs) release(id);
    if (i > 0 && runs_with_next[i - 1])
      for (int id : nodes[i - 1].inputs) release(id);
  }
  return a;
}

// What a run holds at its peak, checked before the first buffer exists: the model, the inputs
// as given and float32 copies of those stored in another float dtype, the shared buffers and
// the workspace.
void check_run_memory(const Model& model, const std::map<std::string, TensorDesc>& inputs,
                      const std::vector<int64_t>& capacity, double workspace) {
  double bytes = model.memory_bytes();
  std::string shapes;
  for (const NetworkInput& in : model.network().spec().inputs) {
    const TensorDesc& d = inputs.at(in.name);
    const double n = elements(d.shape);
    bytes += n * static_cast<double>(dtype_size(d.dtype));
    if (dtype_is_floating(d.dtype) && d.dtype != DType::F32) bytes += n * sizeof(float);
    if (d.dtype == DType::I32) bytes += n * sizeof(int64_t);  // widened to int64
    shapes += (shapes.empty() ? "" : ", ") + in.name + "=" + shape_to_string(d.shape);
  }
  for (int64_t cap : capacity) bytes += static_cast<double>(cap) * sizeof(float);
  check_memory_budget(bytes + workspace, "inputs", "running the network on " + shapes);
}

}  // namespace

// ---------------------------------------------------------------- incremental runs

std::pair<std::string, std::string> DecodeState::ids_input(const Network& net) {
  const auto& ins = net.spec().inputs;
  const std::string where = "generate";
  if (ins.size() != 1)
    fail(ErrorCode::Arg, where,
         "the network has " + str(static_cast<int64_t>(ins.size())) +
             " inputs; incremental runs need one, int64 ids [B, T]");
  const ValueType& t = net.values()[static_cast<size_t>(net.inputs()[0])].type;
  if (t.dtype != DType::I64 || t.shape.size() != 2 || !t.shape[1].is_symbol())
    fail(ErrorCode::Arg, where,
         "input " + ins[0].name + " is " + dtype_name(t.dtype) + " " +
             sym_shape_to_string(t.shape) +
             "; incremental runs need int64 ids [B, T] with T a symbol (the sequence)");
  return {ins[0].name, t.shape[1].text};
}

namespace {

InputTypes resolved_inputs(const Network& net, const ResolvedNode& node) {
  InputTypes in;
  for (int id : node.inputs)
    in.push_back(id >= 0 ? &net.values()[static_cast<size_t>(id)].type : nullptr);
  return in;
}

}  // namespace

std::vector<StepRole> DecodeState::step_roles(const Network& net) {
  const std::string seq = ids_input(net).second;
  std::vector<StepRole> roles;
  for (const ResolvedNode& node : net.nodes()) {
    std::string why;
    const StepRole role = node.op->step_role(resolved_inputs(net, node), seq, why);
    if (role == StepRole::none)
      fail(ErrorCode::Arg, node.op->where(),
           "the network cannot run one position at a time (generate): " + why);
    roles.push_back(role);
  }
  return roles;
}

DecodeState::DecodeState(const Model& model, int64_t batch, int64_t capacity)
    : model_(&model), batch_(batch), capacity_(capacity) {
  const Network& net = model.network();
  roles_ = step_roles(net);
  if (batch < 1 || capacity < 1)
    fail(ErrorCode::Shape, "generate",
         "batch=" + str(batch) + " and capacity=" + str(capacity) + " must be >= 1");
  const auto& nodes = net.nodes();
  std::vector<int64_t> floats(nodes.size(), 0);
  double bytes = model.memory_bytes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (roles_[i] != StepRole::cached) continue;
    floats[i] = nodes[i].op->cache_floats(resolved_inputs(net, nodes[i]), batch, capacity);
    bytes += static_cast<double>(floats[i]) * sizeof(float);
  }
  check_memory_budget(bytes, "generate",
                      "the key/value caches for batch " + str(batch) + " x " + str(capacity) +
                          " positions with the model");
  caches_.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    if (roles_[i] == StepRole::cached)
      caches_[i] = Tensor::empty({std::max<int64_t>(floats[i], 1)});
}

double DecodeState::cache_bytes() const {
  double bytes = 0.0;
  for (const Tensor& c : caches_)
    if (c.defined()) bytes += static_cast<double>(c.nbytes());
  return bytes;
}

namespace {

// Whether an open dim's text names `symbol` ("T", "T/2" and "2*T+4" do; "TT" does not).
bool mentions_symbol(const Dim& d, const std::string& symbol) {
  if (d.is_fixed()) return false;
  const std::string& t = d.text;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = t.find(symbol); i != std::string::npos; i = t.find(symbol, i + 1))
    if ((i == 0 || !ident(t[i - 1])) &&
        (i + symbol.size() == t.size() || !ident(t[i + symbol.size()])))
      return true;
  return false;
}

// The axis of a value's shape that is the sequence `seq` (tensor_checks' seq_axis): -1 when no dim
// involves it (the value is the same at every position), -2 when it is not one plain axis
// ("2*T", or T twice).
int sequence_axis(const SymShape& shape, const std::string& seq) {
  const int64_t axis = seq_axis(shape, seq);
  for (size_t a = 0; a < shape.size(); ++a)
    if (static_cast<int64_t>(a) != axis && mentions_symbol(shape[a], seq)) return -2;
  return static_cast<int>(axis);
}

// The nodes a run needs at the last position only, when only the last position of each network
// output is read: nodes acting per position whose outputs are read only by such nodes or are
// network outputs. Found from the outputs backwards; a node with an input that has no plain
// sequence axis (cutting it to one position is not defined) stays out.
std::vector<char> last_position_nodes(const Network& net, const std::vector<StepRole>& roles,
                                      const std::string& seq) {
  const auto& nodes = net.nodes();
  std::vector<char> every_position(net.values().size(), 0);  // some reader needs them all
  std::vector<char> last(nodes.size(), 0);
  for (size_t i = nodes.size(); i-- > 0;) {
    bool ok = roles[i] == StepRole::per_position;
    for (int id : nodes[i].outputs) ok = ok && !every_position[static_cast<size_t>(id)];
    for (int id : nodes[i].inputs)
      ok = ok &&
           (id < 0 || sequence_axis(net.values()[static_cast<size_t>(id)].type.shape, seq) != -2);
    last[i] = ok;
    if (!ok)
      for (int id : nodes[i].inputs)
        if (id >= 0) every_position[static_cast<size_t>(id)] = 1;
  }
  return last;
}

}  // namespace

Plan::Plan(const Model& model, const std::map<std::string, TensorDesc>& inputs,
           const DecodeState* decode, bool last_position_only)
    : model_(&model), decode_(decode) {
  const Network& net = model.network();
  const NetworkSpec& spec = net.spec();
  check_input_names(spec, inputs);
  types_ = net.bind(graph_input_types(net, inputs));
  if (decode) {
    if (decode->model_ != &model)
      fail(ErrorCode::Internal, "generate", "the decode state belongs to another model");
    const Shape& ids = inputs.at(spec.inputs[0].name).shape;
    if (ids[0] != decode->batch())
      fail(ErrorCode::Shape, "input " + spec.inputs[0].name,
           "shape " + shape_to_string(ids) + " does not have the batch of the decode state, " +
               str(decode->batch()));
  }

  const auto& nodes = net.nodes();
  const size_t n_values = types_.size();
  last_position_node_.assign(nodes.size(), 0);
  last_position_copy_.resize(n_values);
  copy_axis_.assign(n_values, -1);
  std::vector<ValueType> copy_types(n_values);  // of the last-position copies
  std::vector<int64_t> copy_floats;             // their sizes, for the memory check
  if (last_position_only) {
    if (!decode) fail(ErrorCode::Internal, "generate", "a last-position plan needs a decode state");
    const auto [ids_name, seq] = DecodeState::ids_input(net);
    last_position_node_ = last_position_nodes(net, decode->roles_, seq);
    // Those nodes' values as a run of one position types them.
    std::map<std::string, TensorDesc> one = inputs;
    one.at(ids_name).shape[1] = 1;
    const std::vector<ValueType> step_types = net.bind(graph_input_types(net, one));
    for (size_t i = 0; i < nodes.size(); ++i)
      if (last_position_node_[i])
        for (int id : nodes[i].outputs)
          types_[static_cast<size_t>(id)] = step_types[static_cast<size_t>(id)];
    // Their inputs from other nodes (or the network's inputs) get a copy of the last position.
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!last_position_node_[i]) continue;
      for (int id : nodes[i].inputs) {
        if (id < 0) continue;
        const size_t v = static_cast<size_t>(id);
        const NetworkValue& nv = net.values()[v];
        const bool inside = nv.port >= 0 && nv.producer >= 0 &&
                            last_position_node_[static_cast<size_t>(nv.producer)];
        const int axis = sequence_axis(nv.type.shape, seq);
        if (inside || axis < 0 || copy_axis_[v] >= 0) continue;
        Shape shape = concrete_shape(types_[v].shape);
        shape[static_cast<size_t>(axis)] = 1;
        copy_axis_[v] = axis;
        copy_types[v] = ValueType{fixed_shape(shape), types_[v].dtype, {}};
        copy_floats.push_back(buffer_floats(copy_types[v]));
      }
    }
  }
  // A node's input types as it runs: a last-position node reads the copies.
  auto node_input_type = [&](size_t node, int id) -> const ValueType* {
    if (id < 0) return nullptr;
    const size_t v = static_cast<size_t>(id);
    return reads_last_position_copy(node, id) ? &copy_types[v] : &types_[v];
  };
  double workspace = 0.0;  // the most any node takes: nodes run one at a time
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<const ValueType*> in;
    for (int id : nodes[i].inputs) in.push_back(node_input_type(i, id));
    const OpCost cost = nodes[i].op->cost(in);
    flops_ += cost.flops;
    node_flops_.push_back(cost.flops);
    workspace = std::max(workspace, cost.workspace_bytes);
    if (decode && decode->roles_[i] == StepRole::cached)
      workspace = std::max(workspace, nodes[i].op->step_workspace_bytes(in, decode->capacity()));
  }

  // Fusion: a linear whose output only a relu / gelu reads applies it itself, in place; the
  // activation's node is skipped and its output shares the linear's buffer (same shape and
  // dtype). Not across a last-position boundary, nor for an output the network returns.
  node_activation_.assign(nodes.size(), Activation::none);
  fused_into_.assign(nodes.size(), -1);
  std::vector<int> in_place(n_values, -1);
  std::vector<int> readers(n_values, 0);
  for (const ResolvedNode& node : nodes)
    for (int id : node.inputs)
      if (id >= 0) ++readers[static_cast<size_t>(id)];
  for (const auto& out : net.outputs()) ++readers[static_cast<size_t>(out.second)];
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Activation act = nodes[i].op->as_activation();
    if (act == Activation::none || nodes[i].inputs.size() != 1 || nodes[i].outputs.size() != 1)
      continue;
    const int u = nodes[i].inputs[0];
    if (u < 0 || readers[static_cast<size_t>(u)] != 1) continue;
    const NetworkValue& nu = net.values()[static_cast<size_t>(u)];
    if (nu.port != 0 || nu.producer < 0) continue;
    const size_t j = static_cast<size_t>(nu.producer);
    if (!nodes[j].op->applies_activation() || nodes[j].outputs.size() != 1 ||
        node_activation_[j] != Activation::none || reads_last_position_copy(i, u) ||
        last_position_node_[i] != last_position_node_[j] ||
        types_[static_cast<size_t>(u)].dtype != DType::F32)
      continue;
    node_activation_[j] = act;
    fused_into_[i] = static_cast<int>(j);
    in_place[static_cast<size_t>(nodes[i].outputs[0])] = u;
  }
  // Fusion: an add whose output the node right after it normalizes (a transformer block's
  // residual, then its layer_norm) runs inside that node: one pass that forms the sum row by row
  // and normalizes it (add_layer_norm_rows_f32), writing the sum only where something else reads
  // it: one parallel phase and two passes over the activations fewer per block (bench_kernels,
  // 128 x 512, one thread, AVX-512, Zen 5: 18.9 us for the pair, 13.9 fused without the sum;
  // vit_b_16 on two threads 97.5-98.8 ms against 99.8-100.4). Only an add of two float32
  // values of its output's shape (no broadcast), in the same last-position segment, neither
  // reading a last-position copy.
  summed_add_.assign(nodes.size(), -1);
  writes_sum_.assign(nodes.size(), 0);
  std::vector<char> runs_with_next(nodes.size(), 0);
  for (size_t i = 1; i < nodes.size(); ++i) {
    const size_t j = i - 1;
    if (!nodes[i].op->normalizes_sum() || nodes[i].inputs.size() != 1 ||
        nodes[i].outputs.size() != 1 || !nodes[j].op->is_add() || nodes[j].inputs.size() != 2 ||
        nodes[j].outputs.size() != 1 || fused_into_[j] >= 0 || fused_into_[i] >= 0 ||
        node_activation_[j] != Activation::none || node_activation_[i] != Activation::none)
      continue;
    const int u = nodes[i].inputs[0], a = nodes[j].inputs[0], b = nodes[j].inputs[1];
    if (u < 0 || a < 0 || b < 0 || u != nodes[j].outputs[0]) continue;
    const auto f32_like_u = [&](int v) {
      const ValueType& t = types_[static_cast<size_t>(v)];
      return t.dtype == DType::F32 &&
             concrete_shape(t.shape) == concrete_shape(types_[static_cast<size_t>(u)].shape);
    };
    if (!f32_like_u(u) || !f32_like_u(a) || !f32_like_u(b) ||
        last_position_node_[i] != last_position_node_[j] || reads_last_position_copy(i, u) ||
        reads_last_position_copy(j, a) || reads_last_position_copy(j, b))
      continue;
    if (decode && (decode->roles_[i] != StepRole::per_position ||
                   decode->roles_[j] != StepRole::per_position))
      continue;
    summed_add_[i] = static_cast<int>(j);
    writes_sum_[i] = readers[static_cast<size_t>(u)] > 1;
    fused_into_[j] = static_cast<int>(i);
    runs_with_next[j] = 1;
  }
  BufferAssignment assignment = assign_buffers(net, types_, in_place, runs_with_next);
  std::vector<int64_t> held = assignment.capacity;
  held.insert(held.end(), copy_floats.begin(), copy_floats.end());
  check_run_memory(model, inputs, held, workspace);
  value_buffer_ = std::move(assignment.value_buffer);
  for (int64_t cap : assignment.capacity)
    buffers_.push_back(Tensor::empty({std::max<int64_t>(cap, 1)}));
  workspace_ = Tensor::empty({static_cast<int64_t>(workspace / sizeof(float)) + 1});
  for (size_t v = 0; v < n_values; ++v)
    if (copy_axis_[v] >= 0)
      last_position_copy_[v] =
          Tensor::empty(concrete_shape(copy_types[v].shape), copy_types[v].dtype);

  planned_.resize(n_values);
  values_.resize(n_values);
  for (size_t v = 0; v < n_values; ++v) {
    const NetworkValue& nv = net.values()[v];
    if (nv.port < 0) {  // a node's parameter another node reads: the tensor itself, no buffer
      values_[v] = model.layer(static_cast<size_t>(nv.producer)).parameters()->tensor(nv.parameter);
      continue;
    }
    const int b = value_buffer_[v];
    if (b < 0) continue;
    planned_[v] = buffers_[static_cast<size_t>(b)].reinterpret(
        types_[v].dtype, concrete_shape(types_[v].shape));
    values_[v] = planned_[v];
  }
  // Float inputs stored in another dtype are converted into a float32 buffer of their own, int32
  // ids into an int64 one.
  input_conversion_.resize(spec.inputs.size());
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const TensorDesc& d = inputs.at(spec.inputs[i].name);
    input_dtype_.push_back(d.dtype);
    input_shapes_.push_back(d.shape);
    if (dtype_is_floating(d.dtype) && d.dtype != DType::F32)
      input_conversion_[i] = Tensor::empty(d.shape);
    if (d.dtype == DType::I32) input_conversion_[i] = Tensor::empty(d.shape, DType::I64);
  }

  node_in_.resize(nodes.size());
  node_out_.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (int id : nodes[i].inputs) {
      const size_t v = static_cast<size_t>(id);
      node_in_[i].push_back(id < 0                               ? nullptr
                            : reads_last_position_copy(i, id) ? &last_position_copy_[v]
                                                              : &values_[v]);
    }
    for (int id : nodes[i].outputs) node_out_[i].push_back(&values_[static_cast<size_t>(id)]);
  }
  for (const auto& out : net.outputs()) outputs_.emplace_back(out.first, Tensor());
}

const std::vector<std::pair<std::string, Tensor>>& Plan::run(
    const std::map<std::string, Tensor>& inputs) {
  bind_inputs(inputs);
  run_nodes(nullptr);
  return outputs_;
}

const std::vector<std::pair<std::string, Tensor>>& Plan::run(
    const std::map<std::string, Tensor>& inputs, DecodeState& state) {
  if (decode_ != &state)
    fail(ErrorCode::Internal, "generate", "the plan was not made for this decode state");
  const int64_t T = input_shapes_[0][1];
  if (state.past_ + T > state.capacity_)
    fail(ErrorCode::Shape, "generate",
         str(state.past_) + " positions so far and " + str(T) + " more pass the capacity of " +
             str(state.capacity_));
  bind_inputs(inputs);
  run_nodes(&state);
  state.past_ += T;
  return outputs_;
}

void Plan::bind_inputs(const std::map<std::string, Tensor>& inputs) {
  const Network& net = model_->network();
  const NetworkSpec& spec = net.spec();
  if (inputs.size() != spec.inputs.size())
    fail(ErrorCode::Arg, "inputs",
         "got " + str(static_cast<int64_t>(inputs.size())) + " inputs, the network has " +
             str(static_cast<int64_t>(spec.inputs.size())));
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const std::string& name = spec.inputs[i].name;
    const auto it = inputs.find(name);
    if (it == inputs.end()) fail(ErrorCode::Arg, "inputs", "missing network input " + name);
    const Tensor& t = it->second;
    const size_t id = static_cast<size_t>(net.inputs()[i]);
    const ValueType& want = types_[id];
    if (t.shape() != input_shapes_[i])
      fail(ErrorCode::Shape, "input " + name,
           "shape " + t.shape_str() + " is not the planned " + sym_shape_to_string(want.shape));
    if (t.dtype() != input_dtype_[i])
      fail(ErrorCode::DType, "input " + name,
           std::string("dtype ") + dtype_safetensors_name(t.dtype()) + " is not the planned " +
               dtype_safetensors_name(input_dtype_[i]));
    const DType graph = want.dtype == DType::Bool ? DType::Bool
                        : want.dtype == DType::I64 ? DType::I64
                                                   : DType::F32;
    if (graph == DType::Bool || (t.dtype() == graph && t.is_contiguous())) {
      values_[id] = t;
    } else {
      // Another float dtype or int32 ids (buffer made at construction), or a strided input
      // (buffer made on first need, then reused).
      if (!input_conversion_[i].defined()) input_conversion_[i] = Tensor::empty(t.shape(), graph);
      input_conversion_[i].copy_from(t);
      values_[id] = input_conversion_[i];
    }
  }
}

bool Plan::reads_last_position_copy(size_t node, int id) const {
  return id >= 0 && last_position_node_[node] && copy_axis_[static_cast<size_t>(id)] >= 0;
}

void Plan::set_node_timing(bool on) {
  node_timing_ = on;
  if (on) node_seconds_.assign(model_->network().nodes().size(), 0.0);
}

void Plan::run_nodes(DecodeState* state) {
  const Network& net = model_->network();
  const auto& nodes = net.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (fused_into_[i] >= 0) continue;  // runs inside node fused_into_[i] (an activation, an add)
    const auto start = node_timing_ ? std::chrono::steady_clock::now()
                                    : std::chrono::steady_clock::time_point{};
    try {
      for (int id : nodes[i].inputs) {
        if (!reads_last_position_copy(i, id)) continue;
        const size_t v = static_cast<size_t>(id);
        const Tensor& full = values_[v];
        const int64_t len = full.size(copy_axis_[v]);
        last_position_copy_[v].copy_from(full.narrow(copy_axis_[v], len - 1, 1));
      }
      Workspace ws(workspace_.raw_data(), workspace_.nbytes());
      if (const int j = summed_add_[i]; j >= 0) {
        // The add's node, skipped above, runs here (a per_position pair: steps too).
        const auto& add_in = node_in_[static_cast<size_t>(j)];
        model_->layer(i).forward_summed(*add_in[0], *add_in[1],
                                        writes_sum_[i] ? node_out_[static_cast<size_t>(j)][0]
                                                       : nullptr,
                                        node_out_[i], ws);
      } else if (node_activation_[i] != Activation::none) {
        // A per_position op (applies_activation): its step is its plain forward.
        model_->layer(i).forward_activated(node_in_[i], node_out_[i], ws, node_activation_[i]);
      } else if (state) {
        StepState step;
        step.past = state->past_;
        step.capacity = state->capacity_;
        const Tensor& cache = state->caches_[i];
        step.cache = cache.defined() ? cache.data<float>() : nullptr;
        model_->layer(i).forward_step(node_in_[i], node_out_[i], ws, step);
      } else {
        model_->layer(i).forward(node_in_[i], node_out_[i], ws);
      }
    } catch (const Error& e) {
      // Name the node, whatever name the layer gave itself.
      if (e.where() == nodes[i].op->where()) throw;
      throw Error(e.code(), nodes[i].op->where(), e.detail());
    }
    if (node_timing_)
      node_seconds_[i] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  for (size_t k = 0; k < outputs_.size(); ++k)
    outputs_[k].second = values_[static_cast<size_t>(net.outputs()[k].second)];
}

std::vector<Plan::Buffer> Plan::buffers() const {
  std::vector<Buffer> out;
  for (const Tensor& b : buffers_) out.push_back({b.raw_data(), b.nbytes()});
  for (const Tensor& b : input_conversion_)
    if (b.defined()) out.push_back({b.raw_data(), b.nbytes()});
  for (const Tensor& b : last_position_copy_)
    if (b.defined()) out.push_back({b.raw_data(), b.nbytes()});
  return out;
}

}  // namespace tessera
