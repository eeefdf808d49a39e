#include "layers/parameters.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/allocator.h"
#include "core/device.h"
#include "core/parallel.h"
#include "core/random.h"

namespace tessera {

Parameter& ParameterSet::add(const std::string& name, const Shape& shape, DType dtype) {
  if (contains(name)) fail(ErrorCode::Internal, "ParameterSet", "duplicate parameter " + name);
  params_.push_back(Parameter{name, shape, Tensor::zeros(shape, dtype), true, false, Tensor()});
  return params_.back();
}

Parameter& ParameterSet::add_projection(const std::string& name, int64_t out_features,
                                        int64_t in_features) {
  Parameter& p = add(name, {out_features, in_features});
  p.projection = true;
  return p;
}

bool ParameterSet::contains(std::string_view name) const { return find(name) != nullptr; }

Parameter* ParameterSet::find(std::string_view name) {
  for (Parameter& p : params_)
    if (p.name == name) {
      p.panels = Tensor();
      return &p;
    }
  return nullptr;
}

ProjectionWeight ParameterSet::projection(std::string_view name) const {
  const Tensor& t = tensor(name);
  const Parameter* p = find(name);
  return {t.data<float>(), p->panels.defined() ? p->panels.data<float>() : nullptr};
}

namespace {

// The device's F32 projection kernels when they pack weights, else null.
const LinearKernels* weight_packer(const Device& device) {
  const LinearKernels* lk = device.kernels().linear(DType::F32);
  return lk != nullptr && lk->pack_weights != nullptr ? lk : nullptr;
}

bool packable(const Parameter& p) {
  return p.projection && !p.panels.defined() && projection_weight_packable(p.value);
}

}  // namespace

int64_t ParameterSet::unpacked_panel_floats(const Device& device) const {
  const LinearKernels* lk = weight_packer(device);
  int64_t floats = 0;
  if (lk == nullptr) return 0;
  for (const Parameter& p : params_)
    if (packable(p)) floats += lk->weight_panel_floats(p.value.size(0), p.value.size(1));
  return floats;
}

int64_t projection_panel_floats(const Device& device, int64_t n, int64_t k) {
  const LinearKernels* lk = weight_packer(device);
  return lk ? lk->weight_panel_floats(n, k) : 0;
}

bool projection_weight_packable(const Tensor& w) {
  return w.dtype() == DType::F32 && w.dim() == 2 && w.is_contiguous() && w.numel() > 0;
}

Tensor pack_projection_panels(const Device& device, const Tensor& weight) {
  const LinearKernels* lk = weight_packer(device);
  if (lk == nullptr) return {};
  const int64_t n = weight.size(0), k = weight.size(1);
  const float* w = weight.data<float>();
  const int64_t panels = (n + lk->weight_panel - 1) / lk->weight_panel;
  Tensor packed = Tensor::empty({lk->weight_panel_floats(n, k)}, DType::F32);
  float* dst = packed.data<float>();
  parallel_for(0, panels, std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1)),
               [&](int64_t q0, int64_t q1) { lk->pack_weights(n, k, w, k, q0, q1, dst); });
  // Only the panels are read from now on: the checkpoint's pages of the rows can go (they come
  // back from the file if something else reads them, as an embedding's lookups do).
  if (weight.file_mapped()) release_file_pages(w, weight.nbytes());
  return packed;
}

std::string projection_panel_layout(const Device& device) {
  const LinearKernels* lk = weight_packer(device);
  // pack_weights' layout (core/kernels.h): panel q holds w[q * P + j][kk] at [q][kk][j], zeros
  // past n; the same on every SIMD target.
  return lk ? "f32 k-major panels of " + std::to_string(lk->weight_panel) + " rows, v1" : "";
}

void ParameterSet::pack_projections(const Device& device) {
  pack_projections(device, [](const Parameter&, int64_t) { return Tensor(); });
}

void ParameterSet::pack_projections(
    const Device& device, FunctionRef<Tensor(const Parameter& p, int64_t floats)> cached) {
  const LinearKernels* packer = weight_packer(device);
  if (packer == nullptr) return;
  const LinearKernels& lk = *packer;
  for (Parameter& p : params_) {
    if (!packable(p)) continue;
    const int64_t n = p.value.size(0), k = p.value.size(1);
    if (Tensor found = cached(p, lk.weight_panel_floats(n, k)); found.defined()) {
      p.panels = std::move(found);
      continue;
    }
    p.panels = pack_projection_panels(device, p.value);
  }
}

const Parameter* ParameterSet::find(std::string_view name) const {
  for (const Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const Tensor& ParameterSet::tensor(std::string_view name) const {
  const Parameter* p = find(name);
  if (!p) fail(ErrorCode::Internal, "ParameterSet", "no parameter " + std::string(name));
  return p->value;
}

Tensor& ParameterSet::mutable_tensor(std::string_view name) {
  Parameter* p = find(name);
  if (!p) fail(ErrorCode::Internal, "ParameterSet", "no parameter " + std::string(name));
  detach(*p);
  p->panels = Tensor();
  return p->value;
}

std::vector<Parameter>& ParameterSet::all() {
  for (Parameter& p : params_) {
    detach(p);
    p.panels = Tensor();
  }
  return params_;
}

void ParameterSet::detach(Parameter& p) {
  if (p.value.read_only()) p.value = p.value.clone();
}

int64_t ParameterSet::count() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += shape_numel(p.shape);
  return n;
}

static std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

std::string describe_weight_problems(const std::vector<std::string>& missing,
                                     const std::vector<std::string>& unexpected,
                                     const std::vector<std::string>& misshaped) {
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back("missing: " + join(missing));
  if (!unexpected.empty()) parts.push_back("unexpected: " + join(unexpected));
  if (!misshaped.empty()) parts.push_back("mis-shaped: " + join(misshaped));
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? "; " : "") + parts[i];
  return s;
}

LoadResult ParameterSet::check(const std::map<std::string, Tensor>& state,
                               const std::string& prefix) const {
  LoadResult result;
  for (const Parameter& p : params_) {
    auto it = state.find(prefix + p.name);
    if (it == state.end()) {
      result.missing.push_back(prefix + p.name);
      continue;
    }
    const Tensor& t = it->second;
    if (t.shape() != p.shape)
      result.misshaped.push_back(prefix + p.name + " (expected " + shape_to_string(p.shape) +
                                 ", got " + t.shape_str() + ")");
    else if (!dtype_is_floating(t.dtype()))
      result.misshaped.push_back(prefix + p.name + " (dtype " + dtype_name(t.dtype()) +
                                 " is not a float type)");
  }
  for (const auto& [key, t] : state) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    if (!contains(key.substr(prefix.size()))) result.unexpected.push_back(key);
  }
  return result;
}

LoadResult ParameterSet::load(const std::map<std::string, Tensor>& state, bool strict,
                              const std::string& where, const std::string& prefix) {
  LoadResult result = check(state, prefix);
  const bool fatal = !result.misshaped.empty() ||
                     (strict && (!result.missing.empty() || !result.unexpected.empty()));
  if (fatal)
    fail(ErrorCode::Weights, where,
         strict ? describe_weight_problems(result.missing, result.unexpected, result.misshaped)
                : describe_weight_problems({}, {}, result.misshaped));
  // Everything checked: now convert and store (nothing changes when loading fails). A read-only
  // view (a checkpoint's mapping) already in the parameter's dtype and layout is kept as is:
  // no copy, and its pages are read from the file only when a forward first touches them.
  for (Parameter& p : params_) {
    auto it = state.find(prefix + p.name);
    if (it == state.end()) continue;
    const Tensor& src = it->second;
    p.panels = Tensor();
    if (src.read_only() && src.dtype() == p.value.dtype() && src.is_contiguous()) {
      p.value = src;
      continue;
    }
    Tensor fresh = Tensor::empty(p.shape, p.value.dtype());
    fresh.copy_from(src);
    p.value = fresh;
  }
  return result;
}

std::map<std::string, Tensor> ParameterSet::state_dict(const std::string& prefix) const {
  std::map<std::string, Tensor> out;
  for (const Parameter& p : params_) out[prefix + p.name] = p.value;
  return out;
}

// ---------------------------------------------------------------- initialisers

static void fill(Tensor& t, Generator& gen, double (*draw)(Generator&, double, double), double a,
                 double b) {
  Tensor f = Tensor::empty(t.shape(), DType::F32);
  float* p = f.data<float>();
  const int64_t n = f.numel();  // numel() walks the shape: once, not per element
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(draw(gen, a, b));
  t.copy_from(f);
}

void init_uniform(Tensor& t, Generator& gen, double bound) {
  fill(
      t, gen, [](Generator& g, double lo, double hi) { return lo + (hi - lo) * g.uniform(); },
      -bound, bound);
}

void init_xavier_uniform(Tensor& t, Generator& gen, int64_t fan_in, int64_t fan_out) {
  init_uniform(t, gen, std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
}

void init_xavier_normal(Tensor& t, Generator& gen, int64_t fan_in, int64_t fan_out) {
  const double std = std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  fill(
      t, gen, [](Generator& g, double s, double) { return s * g.normal(); }, std, 0.0);
}

void init_trunc_normal(Tensor& t, Generator& gen, double std) {
  if (std == 0.0) {
    t.copy_from(Tensor::zeros(t.shape(), t.dtype()));
    return;
  }
  // Rejection sampling: 95.4% of draws land inside +-2 std, so ~1.05 draws per element.
  fill(
      t, gen,
      [](Generator& g, double s, double) {
        for (;;) {
          const double x = g.normal();
          if (std::abs(x) <= 2.0) return s * x;
        }
      },
      std, 0.0);
}

void init_linear_weight(Tensor& w, Generator& gen, int64_t in_features) {
  // kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound = gain*sqrt(3/fan_in) = 1/sqrt(fan_in).
  init_uniform(w, gen, in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0);
}

void init_linear_bias(Tensor& b, Generator& gen, int64_t in_features) {
  init_uniform(b, gen, in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0);
}

}  // namespace tessera
