// The op framework: what every op of a network (shared/docs/interfaces.md §2, the ops table)
// provides, in one place per op.
//
// An Op is a node's definition: its arguments, parsed and checked once (E_ARG for an unknown or
// mistyped argument, E_CONSTRAINT for a value out of range). From input types, symbolic or
// concrete, it infers the output types and names and shapes its parameters (infer), and from
// concrete ones it reports what one forward costs (cost: FLOPs, workspace bytes, resident
// bytes). instantiate() makes an OpLayer: the op with its parameters, ready to run. Ops are
// immutable and OpLayer::forward is const, so one model serves several threads, each through
// its own plan.
//
// Each family of ops (linear, norm, elementwise, shape, attention, multihead attention) lives in
// one file of layers/ beside the C++ layer it shares its rules with; the registry
// (op_registry.cpp) is a table with one line per op. ARCHITECTURE.md has the recipe for a new op.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"
#include "core/workspace.h"
#include "io/network_file.h"
#include "layers/activation.h"
#include "layers/parameters.h"

namespace tessera {

// The type of a value flowing between nodes.
struct ValueType {
  SymShape shape;
  // The plan dtype for computed values; bool (or float) for masks; int64 for indices (token ids).
  DType dtype = DType::F32;
  // For int64 values known to lie in [0, limit) (arange's positions): lets an embedding refuse a
  // sequence longer than its table when the plan is made, before anything runs. The default Dim
  // (neither fixed nor a symbol) means unknown.
  Dim index_limit = {};
};

struct PortSpec {
  std::string name;
  bool optional = false;
};

struct InferResult {
  std::vector<ValueType> outputs;                         // one per output port
  std::vector<std::pair<std::string, Shape>> parameters;  // name within the node -> shape
};

// Symbols bound so far: by the inputs, or fixed by an op while inferring (an attention grid fixes
// T: H*W == T). Ops read it to resolve symbols their arguments name (reshape to ["B", -1]).
using SymbolBindings = std::map<std::string, int64_t>;

// What one forward on concrete input types costs.
struct OpCost {
  // Convention (fvcore's): a matrix product counts 2*m*n*k, layer_norm 5 per element (4
  // without affine), other elementwise ops one per element produced, data movement (chunk,
  // concat) nothing; causal attention counts the full score matrix.
  double flops = 0.0;
  // Scratch the forward takes from the plan's workspace (Workspace: the same layout function
  // sizes it and hands it out).
  double workspace_bytes = 0.0;
};

// Input and output types of one node, as the resolver and the plan pass them: `in` follows
// input_ports() (null for an absent optional port).
using InputTypes = std::vector<const ValueType*>;

// How a node takes part in incremental runs (generation, interfaces.md §6: the network runs on
// the new positions of each sequence only, T of them, the ones before already run).
enum class StepRole {
  none,          // its output at a position depends on other positions: no incremental runs
  per_position,  // its output at a position depends only on its inputs at that position
  positions,     // arange over the sequence: its values are offset by the positions run before
  cached,        // causal self-attention: keeps every position's keys and values (a cache)
};

// What an incremental run hands a node (Plan::run with a DecodeState).
struct StepState {
  int64_t past = 0;        // positions of each sequence run before this call
  int64_t capacity = 0;    // positions the caches hold (past + T <= capacity)
  float* cache = nullptr;  // a cached node's own cache: Op::cache_floats floats
};

// An op with its parameters, ready to run.
// A projection weight a layer reads through an input port (a tied LM head's `weight`, which is
// another node's parameter), packed once by the model: `panels` of the tensor at `rows`.
struct PortPanels {
  Tensor panels;
  const float* rows = nullptr;
};

class OpLayer {
 public:
  virtual ~OpLayer() = default;
  // The slot for the packed panels of the projection weight read through input `port`, or null
  // when that port takes none. Model::pack_projections fills it when the port reads a
  // parameter; a forward uses the panels only while the port's data is still `rows`.
  virtual PortPanels* port_panels(int port) {
    (void)port;
    return nullptr;
  }
  // Null when the op has no parameters.
  virtual ParameterSet* parameters() { return nullptr; }
  const ParameterSet* parameters() const { return const_cast<OpLayer*>(this)->parameters(); }
  // Loads parameters (keys without the node prefix) that the caller has already checked.
  virtual void load(const std::map<std::string, Tensor>& state) { (void)state; }
  // `in`: one per input port (null for an absent optional port), of the types the plan was
  // made for; float inputs are contiguous float32. `out`: one per output port, contiguous
  // float32 tensors of the inferred shapes in the plan's buffers, written in place.
  // `workspace`: at least Op::cost(in).workspace_bytes. Allocates nothing; thread-safe.
  virtual void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                       Workspace& workspace) const = 0;
  // An incremental run over the new positions (`in` holds only those): for per_position nodes
  // the plain forward; `positions` and `cached` nodes override it. `workspace`: at least
  // Op::step_workspace_bytes.
  virtual void forward_step(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                            Workspace& workspace, const StepState& step) const {
    (void)step;
    forward(in, out, workspace);
  }
  // forward, then `act` over the outputs, for a layer whose op applies_activation() (the plan
  // calls it in place of the activation's own node; a per_position op, so also for steps).
  virtual void forward_activated(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                                 Workspace& workspace, Activation act) const;
  // forward on the single input x + residual, with that sum also written to `sum` when not null,
  // for a layer whose op normalizes_sum() (the plan calls it in place of an add's node and this
  // one's; both per_position ops, so also for steps). x and residual: contiguous float32 of the
  // input's shape.
  virtual void forward_summed(const Tensor& x, const Tensor& residual, Tensor* sum,
                              std::span<Tensor* const> out, Workspace& workspace) const;
};

// A parameterless op's layer: forward is a function of the inputs and the op's arguments.
template <class Fn>
class FunctionLayer : public OpLayer {
 public:
  explicit FunctionLayer(Fn fn) : fn_(std::move(fn)) {}
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace&) const override {
    fn_(in, out);
  }

 private:
  Fn fn_;
};

template <class Fn>
std::unique_ptr<OpLayer> function_layer(Fn fn) {
  return std::make_unique<FunctionLayer<Fn>>(std::move(fn));
}

class Op {
 public:
  explicit Op(std::string where) : where_(std::move(where)) {}
  virtual ~Op() = default;
  // "n0 (attention)": prefixes every message about this node.
  const std::string& where() const { return where_; }
  virtual const char* name() const = 0;
  virtual std::vector<PortSpec> input_ports() const = 0;
  virtual std::vector<std::string> output_ports() const = 0;
  // Checks every constraint and shape it can (E_CONSTRAINT, E_SHAPE, E_DTYPE); a check that
  // involves an open dimension waits until the dimension is bound. `bound` holds the symbols
  // bound so far; the op may fix more in it (E_CONSTRAINT on a conflict).
  virtual InferResult infer(const InputTypes& in, SymbolBindings& bound) const = 0;
  // On concrete input types that infer() accepted.
  virtual OpCost cost(const InputTypes& in) const = 0;
  // What the layer holds besides its parameters once built (attention: its packed q/k/v
  // weights), for the model's memory budget check before anything is built; on the resolved
  // types, whose open dims the layer does not depend on.
  virtual double resident_bytes(const InputTypes& in) const {
    (void)in;
    return 0.0;
  }
  // Persistent buffers a state_dict carries for this node (Swin's relative_position_index), as
  // the op computes them from its arguments: name within the node -> value. A checkpoint may
  // omit them; one it carries must equal them (E_WEIGHTS otherwise). Not parameters: not
  // counted, not loaded.
  virtual std::vector<std::pair<std::string, Tensor>> persistent_buffers() const { return {}; }

  // Incremental runs. `in` are the resolved types, `seq` the symbol of the sequence dim (the ids
  // input's T). The role, or none with the reason in `why` (an op that does not say is none).
  virtual StepRole step_role(const InputTypes& in, const std::string& seq,
                             std::string& why) const {
    (void)in;
    (void)seq;
    why = std::string("op ") + name() + " does not run one position at a time";
    return StepRole::none;
  }
  // Fusion (Plan): an elementwise activation says which one it is; an op whose layer can apply
  // one to its own outputs (forward_activated) says so. A plan then runs the pair as one node
  // where the producer's output has no other reader.
  virtual Activation as_activation() const { return Activation::none; }
  virtual bool applies_activation() const { return false; }
  // The same for a residual sum: an `add` of two inputs says so, and an op whose layer can form
  // that sum itself ahead of its own work (forward_summed: layer_norm) says so. A plan runs an
  // add and such a node right after it, reading its output, as one node.
  virtual bool is_add() const { return false; }
  virtual bool normalizes_sum() const { return false; }
  // A cached node's cache for `batch` sequences of `capacity` positions, in floats.
  virtual int64_t cache_floats(const InputTypes& in, int64_t batch, int64_t capacity) const {
    (void)in;
    (void)batch;
    (void)capacity;
    return 0;
  }
  // The scratch of forward_step on concrete types, for any past <= capacity - T.
  virtual double step_workspace_bytes(const InputTypes& in, int64_t capacity) const {
    (void)capacity;
    return cost(in).workspace_bytes;
  }
  // The op with its parameters, initialised from `seed` as the layer's reset does; without a
  // seed nothing is drawn (parameters stay zero, layer_norm's take their constant ones) and
  // large ones stay untouched memory, for a caller that loads every one next (a complete
  // checkpoint: 1 GB of weights is then never drawn nor written, ~3 s and 1 GB of RSS saved
  // here). `in` as for infer() (the dims the parameters depend on are fixed by then).
  virtual std::unique_ptr<OpLayer> instantiate(const InputTypes& in,
                                               std::optional<uint64_t> seed) const = 0;

 private:
  std::string where_;
};

// The op of a node: E_ARG for an unknown op, an unknown or mistyped argument, an unknown input
// port or a missing required one; E_CONSTRAINT for an argument value out of range.
std::unique_ptr<Op> make_op(const NetworkNode& node);
// Every op name, in the order of the ops table.
const std::vector<std::string>& op_names();

}  // namespace tessera
