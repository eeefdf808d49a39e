// The ops a network can use (shared/docs/interfaces.md §2, the ops table): one table from an op
// name to its ports, its arguments with their types and defaults, shape inference, parameter
// declaration, FLOP count and forward. Each op is built on the layers and kernels of layers/ and
// backends/; nothing here computes on its own.
//
// An Op is a node's definition: its arguments, parsed and checked (E_ARG for an unknown or
// mistyped argument, E_CONSTRAINT for a value out of range). It infers output types from input
// types, symbolic or concrete, and instantiates an OpLayer: the op with its parameters, ready to
// run. Ops are immutable and OpLayer::forward is const, so one model serves several threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/network_file.h"
#include "layers/parameters.h"

namespace tessera {

// The type of a value flowing between nodes.
struct ValueType {
  SymShape shape;
  DType dtype = DType::F32;  // the plan dtype for computed values; bool (or float) for masks
};

// A fully fixed shape as a SymShape, and back (E_INTERNAL when a dim is open).
SymShape fixed_shape(const Shape& shape);
Shape concrete_shape(const SymShape& shape);
bool is_fixed(const SymShape& shape);

struct PortSpec {
  std::string name;
  bool optional = false;
};

struct InferResult {
  std::vector<ValueType> outputs;                         // one per output port
  std::vector<std::pair<std::string, Shape>> parameters;  // name within the node -> shape
};

// Symbols an op fixed while inferring (an attention grid fixes T: H*W == T).
using SymbolBindings = std::map<std::string, int64_t>;

// An op with its parameters, ready to run.
class OpLayer {
 public:
  virtual ~OpLayer() = default;
  // Null when the op has no parameters.
  virtual ParameterSet* parameters() { return nullptr; }
  const ParameterSet* parameters() const { return const_cast<OpLayer*>(this)->parameters(); }
  // Loads parameters (keys without the node prefix) that the caller has already checked.
  virtual void load(const std::map<std::string, Tensor>& state) { (void)state; }
  // True when forward() assigns its outputs (layers that allocate them: attention,
  // multihead_attention); otherwise it writes into the caller's tensors.
  virtual bool allocates_outputs() const { return false; }
  // `in`: one per input port (null for an absent optional port); float inputs are contiguous
  // float32. `out`: one per output port, contiguous float32 tensors of the inferred shapes,
  // written in place (or assigned, see allocates_outputs()). Thread-safe.
  virtual void forward(const std::vector<const Tensor*>& in,
                       const std::vector<Tensor*>& out) const = 0;
};

class Op {
 public:
  explicit Op(std::string where) : where_(std::move(where)) {}
  virtual ~Op() = default;
  // "n0 (attention)": prefixes every message about this node.
  const std::string& where() const { return where_; }
  virtual const char* name() const = 0;
  virtual std::vector<PortSpec> input_ports() const = 0;
  virtual std::vector<std::string> output_ports() const = 0;
  // `in` follows input_ports(), null for an absent optional port. Checks every constraint and
  // shape it can (E_CONSTRAINT, E_SHAPE, E_DTYPE); a check that involves an open dimension waits
  // until the dimension is bound. May fix symbols in `bound` (E_CONSTRAINT on a conflict).
  virtual InferResult infer(const std::vector<const ValueType*>& in,
                            SymbolBindings& bound) const = 0;
  // Floating-point operations of one forward pass on concrete input types. Convention (fvcore's):
  // a matrix product counts 2*m*n*k, layer_norm 5 per element (4 without affine), other
  // elementwise ops one per element produced, data movement (chunk, concat) nothing; causal
  // attention counts the full score matrix.
  virtual double flops(const std::vector<const ValueType*>& in) const = 0;
  // Memory, in bytes, for the budget checks (core/limits.h) made before anything is allocated.
  // resident_bytes: what the layer allocates when built besides its parameters (attention: its
  // packed q/k/v weights, the relative-position index); `in` as for instantiate().
  // scratch_bytes: the most one forward allocates and frees again, on concrete input types;
  // outputs a layer allocates itself are counted by the plan from their types. Both 0 for ops
  // that compute straight from the plan's buffers.
  virtual double resident_bytes(const std::vector<const ValueType*>& in) const {
    (void)in;
    return 0.0;
  }
  virtual double scratch_bytes(const std::vector<const ValueType*>& in) const {
    (void)in;
    return 0.0;
  }
  // The op with its parameters, initialised from `seed` as the layer's reset does; without a
  // seed nothing is drawn (parameters stay zero, layer_norm's take their constant ones) and
  // large ones stay untouched memory, for a caller that loads every one next (a complete
  // checkpoint: 1 GB of weights is then never drawn nor written, ~3 s and 1 GB of RSS saved
  // here). `in` as for infer() (the dims the parameters depend on are fixed by then).
  virtual std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>& in,
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
