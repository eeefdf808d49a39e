// Named parameters of a layer, as PyTorch's state_dict names them, and the one loader that
// checks a checkpoint against them (strict: every missing, unexpected and mis-shaped key in one
// E_WEIGHTS error; non-strict: lists returned, mis-shaped still an error).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/function_ref.h"
#include "core/tensor.h"

namespace tessera {

struct Parameter {
  std::string name;   // "in_proj_weight", "q_proj.bias", ...
  Shape shape;
  Tensor value;       // contiguous, in the layer's parameter dtype
  bool trainable = true;  // metadata only: inference never changes parameters
  bool projection = false;  // a float32 [out, in] weight the layer projects with
  Tensor panels;      // value packed for the projection kernel (defined after pack_projections)
};

// A projection's weight [out, in] as linear_forward_f32 takes it: its rows, and the backend's
// packed panels of them when the layer has packed its weights (else null: rows read in place).
struct ProjectionWeight {
  ProjectionWeight(const float* rows_ = nullptr, const float* panels_ = nullptr)  // NOLINT
      : rows(rows_), panels(panels_) {}
  const float* rows;
  const float* panels;
};

class Device;

struct LoadResult {
  std::vector<std::string> missing;     // declared, not in the checkpoint (left as they were)
  std::vector<std::string> unexpected;  // in the checkpoint, not declared (ignored)
  std::vector<std::string> misshaped;   // "key (expected [4, 4], got [4, 5])": always an error
};

class ParameterSet {
 public:
  // Declares a parameter (zero-filled until initialised or loaded).
  Parameter& add(const std::string& name, const Shape& shape, DType dtype = DType::F32);
  // Declares a float32 projection weight [out, in]: as add(), and pack_projections() packs it.
  Parameter& add_projection(const std::string& name, int64_t out_features, int64_t in_features);
  bool contains(std::string_view name) const;
  Parameter* find(std::string_view name);
  const Parameter* find(std::string_view name) const;
  const Tensor& tensor(std::string_view name) const;  // E_INTERNAL when absent
  // Write access copies a parameter that is a read-only view of a checkpoint first (see
  // load()), so writes never reach the mapping: mutable_tensor() that one, all() every one.
  // find() gives the Parameter to inspect or to replace its value, not to write its data.
  Tensor& mutable_tensor(std::string_view name);
  // The projection weight `name` (E_INTERNAL when absent), with its panels once packed.
  ProjectionWeight projection(std::string_view name) const;
  // Packs every projection weight not packed yet into the layout of `device`'s projection
  // kernel (LinearKernels::pack_weights), so that forwards read the panels and never the rows;
  // a weight that is a view of a checkpoint's file mapping then has its resident pages dropped
  // (release_file_pages), so the process holds one copy, not two. Anything that
  // changes a value (load, mutable_tensor, all, find) drops its panels until packed again.
  void pack_projections(const Device& device);
  // As above, but a weight for which `cached(p, floats)` returns a defined tensor takes it as
  // its panels (floats F32 elements, as pack_weights would write them) instead of packing.
  void pack_projections(const Device& device,
                        FunctionRef<Tensor(const Parameter& p, int64_t floats)> cached);
  // Floats pack_projections would allocate now.
  int64_t unpacked_panel_floats(const Device& device) const;
  const std::vector<Parameter>& all() const { return params_; }
  std::vector<Parameter>& all();
  int64_t count() const;  // total number of elements

  // `where` names the layer in messages ("n0 (attention)"). Keys are matched as
  // prefix + parameter name. Stored F16/BF16/F64/F32 are converted to the parameter dtype; any
  // other dtype is E_WEIGHTS. With strict, missing or unexpected keys are E_WEIGHTS too.
  // What load() would report, without throwing or changing anything. Keys outside `prefix`
  // are not this set's business and are not reported as unexpected (unless prefix is empty).
  LoadResult check(const std::map<std::string, Tensor>& state,
                   const std::string& prefix = "") const;
  // A source tensor that is read_only() (a view of a checkpoint's mapping), of the parameter's
  // dtype and contiguous becomes the parameter itself, without a copy; any other is copied.
  LoadResult load(const std::map<std::string, Tensor>& state, bool strict, const std::string& where,
                  const std::string& prefix = "");
  std::map<std::string, Tensor> state_dict(const std::string& prefix = "") const;

 private:
  static void detach(Parameter& p);

  std::vector<Parameter> params_;
};

// Whether a weight can be packed into panels: float32 [n, k], contiguous, not empty.
bool projection_weight_packable(const Tensor& w);
// Floats of w [n, k] packed in `device`'s projection kernel layout (0 when it packs nothing),
// and the packed panels of a packable weight (pack_weights over every panel, split over the
// threads; a weight in a checkpoint's mapping then has its resident pages dropped).
int64_t projection_panel_floats(const Device& device, int64_t n, int64_t k);
Tensor pack_projection_panels(const Device& device, const Tensor& weight);

// The panel layout of `device`'s projection kernel as a name ("" when it packs nothing): panels
// made under one name are valid wherever the same name is reported (a panel cache's check).
std::string projection_panel_layout(const Device& device);

// The E_WEIGHTS message listing every offending key: "missing: a, b; unexpected: c;
// mis-shaped: d (expected [4, 4], got [4, 5])".
std::string describe_weight_problems(const std::vector<std::string>& missing,
                                     const std::vector<std::string>& unexpected,
                                     const std::vector<std::string>& misshaped);

// PyTorch-style initialisers (seeded; parity with PyTorch's random stream is not a goal).
class Generator;
void init_uniform(Tensor& t, Generator& gen, double bound);          // U(-bound, bound)
void init_xavier_uniform(Tensor& t, Generator& gen, int64_t fan_in, int64_t fan_out);
void init_xavier_normal(Tensor& t, Generator& gen, int64_t fan_in, int64_t fan_out);
void init_trunc_normal(Tensor& t, Generator& gen, double std);       // truncated at +-2 std
// nn.Linear's reset: weight kaiming_uniform(a=sqrt(5)) == U(+-1/sqrt(in)), bias U(+-1/sqrt(in)).
void init_linear_weight(Tensor& w, Generator& gen, int64_t in_features);
void init_linear_bias(Tensor& b, Generator& gen, int64_t in_features);

}  // namespace tessera
