// Networks (shared/docs/interfaces.md §2-3) in three steps:
//   Network: the resolved description. Every source found, every op's arguments checked, every
//     value's shape inferred with open dimensions kept symbolic (B, T, ...), parameters counted.
//   Model: a Network with its layers built and parameters initialised or loaded. Immutable once
//     loaded; several threads may run one Model at once, each through its own Plan.
//   Plan: a Model bound to concrete input shapes. Every intermediate buffer and one workspace
//     (the most scratch any node reports, Op::cost) are allocated once at construction, buffers
//     whose lifetimes do not overlap shared, so run() allocates nothing (tests/test_allocations).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/function_ref.h"
#include "core/tensor.h"
#include "io/network_file.h"
#include "layers/op.h"

namespace tessera {

// A value of the network: a network input, one output port of a node, or a parameter of a node
// that another node reads (a tied LM head reading "tok.weight").
struct NetworkValue {
  std::string name;  // as a source names it: "x", "n0" (its first port), "n0.weights", "tok.weight"
  ValueType type;     // as resolved: open dims stay symbolic unless something fixed them
  int producer = -1;  // node index; -1 for a network input
  int port = 0;       // the producer's output port, the network input's index, or -1 (a parameter)
  std::string parameter;  // for port -1: the producer's parameter, by its name within the node
};

// A parameter's state_dict key: "<node>.<param>", or the node's own name for the one unnamed
// parameter of a node that is a learned tensor (ViT's "class_token", interfaces.md §1).
std::string parameter_key(const std::string& node, const std::string& param);

struct ResolvedNode {
  std::string name;
  std::shared_ptr<const Op> op;
  std::vector<std::string> input_ports;  // the op's ports, in its order
  std::vector<int> inputs;               // value per input port, -1 for an absent optional one
  std::vector<std::string> output_ports;
  std::vector<int> outputs;                               // value per output port
  std::vector<std::pair<std::string, Shape>> parameters;  // name within the node -> shape
};

class Network {
 public:
  // Resolves `spec`: a source names a network input, else the node with the longest name that
  // equals it or is followed in it by '.', then one of the node's output ports or parameters
  // (interfaces.md §2). `input_shapes` fixes the shapes of some inputs (summary --shape); the
  // symbols they bind are bound everywhere. Errors: E_ARG (unknown op, argument, port, source or
  // input name; wrong argument type), E_CONSTRAINT, E_SHAPE, E_DTYPE, E_UNSUPPORTED (a plan
  // dtype other than float32).
  static Network resolve(const NetworkSpec& spec,
                         const std::map<std::string, Shape>& input_shapes = {});

  const NetworkSpec& spec() const { return spec_; }
  DType dtype() const { return spec_.dtype; }
  const std::vector<NetworkValue>& values() const { return values_; }
  const std::vector<ResolvedNode>& nodes() const { return nodes_; }
  const std::vector<int>& inputs() const { return inputs_; }  // value ids, in file order
  const std::vector<std::pair<std::string, int>>& outputs() const { return outputs_; }
  // Symbols fixed by input_shapes or by the network itself (a spatial_shape grid fixes T).
  const SymbolBindings& bindings() const { return bindings_; }
  // Elements of every parameter, each once (PyTorch's model.parameters(): a tensor another node
  // reads is still counted once; persistent buffers are not parameters).
  int64_t parameter_count() const;

  // The text `tessera summary` prints (interfaces.md §3), newline-terminated lines.
  std::string summary() const;

  // Concrete types of every value (indexed like values()) for concrete inputs, in the order of
  // inputs(); a float input's dtype is the plan dtype, a mask's bool or the plan dtype.
  // E_SHAPE when a shape does not fit its declaration or one symbol gets two values; then every
  // check that waited for open dimensions (E_SHAPE, E_CONSTRAINT).
  std::vector<ValueType> bind(const std::vector<ValueType>& inputs) const;

 private:
  NetworkSpec spec_;
  std::vector<NetworkValue> values_;
  std::vector<ResolvedNode> nodes_;
  std::vector<int> inputs_;
  std::vector<std::pair<std::string, int>> outputs_;
  SymbolBindings bindings_;
};

// What a non-strict load did not find or did not use.
struct WeightsReport {
  std::vector<std::string> missing;     // left as initialised from the seed
  std::vector<std::string> unexpected;  // ignored
};

// Finds a projection weight's packed panels elsewhere: (checkpoint key, rows, cols, floats) ->
// the panels, or an undefined tensor to have them packed.
using PanelLookup = FunctionRef<Tensor(const std::string& key, int64_t rows, int64_t cols,
                                       int64_t floats)>;

struct PackedProjection {
  std::string key;  // "<node>.<param>"
  int64_t rows, cols;
  const Tensor* panels;
};

class Model {
 public:
  // Builds every layer, its parameters initialised as the layer's reset does from a seed derived
  // from `seed` and the node's position; without a seed nothing is drawn (Op::instantiate),
  // for a caller that loads all of them next. E_SHAPE, before any layer is built,
  // when the parameters and what the layers precompute exceed the memory budget
  // (core/limits.h).
  explicit Model(Network network, std::optional<uint64_t> seed = 0);
  explicit Model(const NetworkSpec& spec, std::optional<uint64_t> seed = 0);
  Model(Model&&) = default;
  Model& operator=(Model&&) = default;

  const Network& network() const { return network_; }
  const OpLayer& layer(size_t node) const { return *layers_[node]; }
  int64_t parameter_count() const { return network_.parameter_count(); }
  // Bytes the layers hold: parameters plus what they precompute (Op::resident_bytes), plus the
  // projection weights' packed panels once made (at construction with a seed, at each load).
  double memory_bytes() const { return memory_bytes_ + panel_bytes_; }

  // Loads `state` (keys "<node>.<param>", as PyTorch's state_dict names them; F32, F16, BF16
  // and F64 converted). Every problem is named in one E_WEIGHTS error (where = `where`, the
  // checkpoint): with `strict` every missing, unexpected and mis-shaped key, otherwise only the
  // mis-shaped ones (missing parameters keep their initial values, unexpected keys are ignored
  // and both are reported). `unusable` lists tensors of the checkpoint that cannot be read as
  // numbers (name -> dtype): a parameter's counts as mis-shaped, any other as unexpected.
  // Nothing changes when loading fails.
  // `packed`, when given, is asked for each projection weight's panels (by checkpoint key,
  // [rows, cols] and the float count the layout needs) before packing it: a defined tensor it
  // returns is taken as the panels (a panel cache's mapping, io/panel_cache.h).
  WeightsReport load_weights(const std::map<std::string, Tensor>& state, bool strict,
                             const std::string& where,
                             const std::map<std::string, std::string>& unusable = {},
                             const PanelLookup* packed = nullptr);
  // Every projection weight's panels, by checkpoint key (what a panel cache stores).
  std::vector<PackedProjection> packed_projections() const;
  // Every parameter as "<node>.<param>". Parameters loaded in place from a checkpoint are its
  // read-only views (Tensor::read_only()): clone() one before writing it.
  std::map<std::string, Tensor> state_dict() const;

 private:
  // Packs every layer's projection weights not packed yet (ParameterSet::pack_projections),
  // after checking what that adds against the memory budget (E_SHAPE); `packed` as in
  // load_weights.
  void pack_projections(const PanelLookup* packed = nullptr);
  void drop_unread_checkpoint_pages() const;
  const Parameter* tied_projection(size_t node, int port) const;
  // fn(slot, weight, key) for every layer port that reads another node's projection weight (a
  // tied LM head): the port's panel slot, writable only through a non-const Model.
  template <typename Fn>
  void for_each_tied_projection(Fn&& fn);
  template <typename Fn>
  void for_each_tied_projection(Fn&& fn) const;
  template <typename Self, typename Fn>
  static void visit_tied_projections(Self& self, Fn&& fn);

  Network network_;
  std::vector<std::unique_ptr<OpLayer>> layers_;
  double memory_bytes_ = 0.0;
  double panel_bytes_ = 0.0;  // of the packed projection weights held now
};

// What incremental runs (generation, interfaces.md §6) keep between calls: the caches of the
// network's causal attention nodes for `batch` sequences of up to `capacity` positions, and how
// many positions of each sequence have run. A network runs incrementally when it has one int64
// input [B, T] (T a symbol: the sequence) and every node acts per position, is an arange over T
// (offset by the positions run before) or is causal self-attention (cached). The plans that run
// on a state (Plan with a DecodeState) share it; the state must outlive them, and one state
// serves one thread at a time.
class DecodeState {
 public:
  // E_ARG naming the ids input that is missing or the node that prevents incremental runs;
  // E_SHAPE when the caches exceed the memory budget (with the model). `model` must outlive the
  // state.
  DecodeState(const Model& model, int64_t batch, int64_t capacity);
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;

  // The network input holding the ids, and the symbol of its sequence dim (E_ARG as above).
  static std::pair<std::string, std::string> ids_input(const Network& network);
  // Every node's role (E_ARG as above), indexed like network.nodes().
  static std::vector<StepRole> step_roles(const Network& network);
  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t past() const { return past_; }  // positions of each sequence run so far
  // Bytes of every cache.
  double cache_bytes() const;
  // Forgets every position (the caches are overwritten as positions run again).
  void reset() { past_ = 0; }

 private:
  friend class Plan;
  const Model* model_;
  int64_t batch_, capacity_;
  int64_t past_ = 0;
  std::vector<StepRole> roles_;  // per node
  std::vector<Tensor> caches_;   // per node; defined for cached nodes
};

// A tensor's shape and stored dtype, for binding a plan.
struct TensorDesc {
  Shape shape;
  DType dtype = DType::F32;
};

class Plan {
 public:
  // Binds every network input (by name: E_ARG for a missing or unknown one) to a concrete shape
  // and stored dtype (float inputs: F32, F16, BF16 or F64; masks: BOOL or float; otherwise
  // E_DTYPE), infers every value's shape, and allocates the buffers. E_SHAPE, before allocating
  // anything, when a run would need more than the memory budget (core/limits.h) together with
  // the model: inputs, buffers, outputs layers allocate and the largest scratch of any node.
  // `model` must outlive the plan. A plan runs on one thread at a time; give each thread its
  // own.
  // With `decode`, the plan runs incrementally on that state (run(inputs, state)): the ids input
  // holds the new positions, [state.batch(), T] (E_SHAPE otherwise), and the workspace covers
  // the cached nodes' steps at the state's capacity.
  // With `last_position_only` as well (a prompt whose logits only the last position of are read),
  // the nodes that act per position and reach the outputs only through such nodes (a language
  // model's last block after its attention, final norm and head) run on the last position of
  // each sequence: the outputs are [B, 1, ...], the values of those nodes have T = 1 in types(),
  // and their inputs from earlier nodes are cut to the last position. For the gpt recipe at
  // 124M and a prompt of 128 this skips ~30% of the prefill's FLOPs (the head's 50257 columns).
  Plan(const Model& model, const std::map<std::string, TensorDesc>& inputs,
       const DecodeState* decode = nullptr, bool last_position_only = false);
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Runs the network. `inputs` must have the bound shapes and dtypes (E_SHAPE, E_DTYPE, E_ARG).
  // Returns every network output by name, float32 contiguous (a mask passed straight through
  // keeps its dtype); the tensors live in the plan's buffers and are overwritten by the next run.
  const std::vector<std::pair<std::string, Tensor>>& run(
      const std::map<std::string, Tensor>& inputs);

  // An incremental run of a plan made with `state`: the ids are positions state.past() ..
  // past + T - 1 of each sequence; E_SHAPE when they would pass the state's capacity. Cached
  // nodes read and extend the state's caches; past() advances by T.
  const std::vector<std::pair<std::string, Tensor>>& run(
      const std::map<std::string, Tensor>& inputs, DecodeState& state);

  // FLOPs of one run (the ops' convention, OpCost in op.h), and of each node (indexed like
  // network().nodes(); they sum to flops()).
  double flops() const { return flops_; }
  const std::vector<double>& node_flops() const { return node_flops_; }
  // Profiling (tessera bench --profile): while on, each node's wall time is added to
  // node_seconds() at every run; turning it on zeroes the sums. Off by default: no clock is read.
  void set_node_timing(bool on);
  const std::vector<double>& node_seconds() const { return node_seconds_; }
  // Bytes of the workspace the nodes share (the largest any one reports).
  size_t workspace_bytes() const { return workspace_.nbytes(); }
  // Concrete types of every value, indexed like network().values().
  const std::vector<ValueType>& types() const { return types_; }
  // The value's tensor after a run (undefined before the first).
  const Tensor& value(int id) const { return values_[static_cast<size_t>(id)]; }

  // The buffers the plan owns besides its workspace: intermediates (shared by values whose
  // lifetimes do not overlap) and input conversions. Allocated at construction, never
  // reallocated by run().
  struct Buffer {
    const void* data;
    size_t bytes;
  };
  std::vector<Buffer> buffers() const;
  // Which buffer holds each value (-1: none, for a network input).
  const std::vector<int>& value_buffers() const { return value_buffer_; }
  // Per node: the activation it applies for the node after it (a `linear` whose only reader is
  // a relu / gelu: the pair runs as one node, the activation in place in the linear's output,
  // which the activation's output then shares), and for such an activation's node the node that
  // runs it (-1 for every other node).
  // Also -1 or the node that runs it for an `add` whose output the layer_norm right after it
  // normalizes: that node forms the sum itself (summed_adds: per node, the add it runs, or -1).
  const std::vector<Activation>& node_activations() const { return node_activation_; }
  const std::vector<int>& fused_into() const { return fused_into_; }
  const std::vector<int>& summed_adds() const { return summed_add_; }

 private:
  void bind_inputs(const std::map<std::string, Tensor>& inputs);
  void run_nodes(DecodeState* state);

  const Model* model_;
  const DecodeState* decode_ = nullptr;  // the state the plan was made for, if any
  std::vector<ValueType> types_;
  double flops_ = 0.0;
  std::vector<double> node_flops_;
  bool node_timing_ = false;
  std::vector<double> node_seconds_;
  std::vector<Tensor> buffers_;           // the intermediate buffers, 1-D float32
  Tensor workspace_;                      // the nodes' scratch, shared (they run one by one)
  std::vector<Shape> input_shapes_;       // per network input: the bound shape
  std::vector<int> value_buffer_;         // value -> buffer, -1 when none
  std::vector<Tensor> planned_;           // value -> its view into a buffer (when it has one)
  std::vector<Tensor> values_;            // value -> tensor of the current run
  std::vector<DType> input_dtype_;        // per network input: the stored dtype planned for
  std::vector<Tensor> input_conversion_;  // per network input: float32 copy target, if needed
  // Last-position-only plans: per node, whether it runs on the last position; per value read
  // across that boundary, its last position (a copy, made before the node runs) and the axis.
  std::vector<char> last_position_node_;
  std::vector<Tensor> last_position_copy_;
  std::vector<int> copy_axis_;  // per value: the axis its copy is cut along, -1 when none
  // Whether `node` reads value `id` through its last-position copy.
  bool reads_last_position_copy(size_t node, int id) const;
  std::vector<Activation> node_activation_;  // per node
  std::vector<int> fused_into_;              // per node
  std::vector<int> summed_add_;              // per node: the add it runs first, or -1
  std::vector<char> writes_sum_;  // per node with a summed add: its output has other readers
  std::vector<std::vector<const Tensor*>> node_in_;
  std::vector<std::vector<Tensor*>> node_out_;
  std::vector<std::pair<std::string, Tensor>> outputs_;
};

}  // namespace tessera
