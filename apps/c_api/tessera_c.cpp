// The C API (include/tessera/tessera.h): handles around the library's Session and Tensor, and
// every exception turned into a code and a message. Like the command line, this file only maps
// calls and errors: loading is tessera::load_model and running is tessera::Session (both shared
// with `tessera run`); the session's pool of plans is what lets one model run from many threads.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "layers/network.h"
#include "runtime/generation.h"
#include "runtime/loader.h"
#include "runtime/session.h"
#include "tessera/tessera.h"

#ifndef TESSERA_VERSION
#error "TESSERA_VERSION comes from meson (apps/c_api/meson.build)"
#endif

struct tessera_error {
  tessera_code code;
  std::string message;
};

struct tessera_tensor {
  tessera::Tensor tensor;  // contiguous: a view of the caller's buffer, or the library's own
};

namespace {

using tessera::DType;
using tessera::ErrorCode;
using tessera::Tensor;

// Handed out when even the error object cannot be allocated; tessera_error_free skips it. Never
// written after static initialisation.
tessera_error g_out_of_memory{TESSERA_E_INTERNAL, "E_INTERNAL: out of memory"};

tessera_code to_code(ErrorCode code) {
  switch (code) {
    case ErrorCode::Constraint:
      return TESSERA_E_CONSTRAINT;
    case ErrorCode::Shape:
      return TESSERA_E_SHAPE;
    case ErrorCode::DType:
      return TESSERA_E_DTYPE;
    case ErrorCode::Arg:
      return TESSERA_E_ARG;
    case ErrorCode::Weights:
      return TESSERA_E_WEIGHTS;
    case ErrorCode::Format:
      return TESSERA_E_FORMAT;
    case ErrorCode::IO:
      return TESSERA_E_IO;
    case ErrorCode::Unsupported:
      return TESSERA_E_UNSUPPORTED;
    case ErrorCode::Internal:
      return TESSERA_E_INTERNAL;
  }
  return TESSERA_E_INTERNAL;
}

std::optional<DType> to_dtype(tessera_dtype dtype) {
  switch (dtype) {
    case TESSERA_F32:
      return DType::F32;
    case TESSERA_F16:
      return DType::F16;
    case TESSERA_BF16:
      return DType::BF16;
    case TESSERA_F64:
      return DType::F64;
    case TESSERA_I64:
      return DType::I64;
    case TESSERA_I32:
      return DType::I32;
    case TESSERA_U8:
      return DType::U8;
    case TESSERA_I8:
      return DType::I8;
    case TESSERA_BOOL:
      return DType::Bool;
    case TESSERA_DTYPE_UNDEFINED:
      break;
  }
  return std::nullopt;
}

tessera_dtype from_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return TESSERA_F32;
    case DType::F16:
      return TESSERA_F16;
    case DType::BF16:
      return TESSERA_BF16;
    case DType::F64:
      return TESSERA_F64;
    case DType::I64:
      return TESSERA_I64;
    case DType::I32:
      return TESSERA_I32;
    case DType::U8:
      return TESSERA_U8;
    case DType::I8:
      return TESSERA_I8;
    case DType::Bool:
      return TESSERA_BOOL;
  }
  return TESSERA_DTYPE_UNDEFINED;
}

// Stores the failure in *error (when asked for) and returns its code. Never throws: if the
// message cannot be allocated, the static out-of-memory error stands in.
tessera_code report(tessera_error** error, tessera_code code, const char* message) noexcept {
  if (error == nullptr) return code;
  try {
    std::string text = message;
    // One line, as the command line prints it, whatever a nested message carried.
    std::replace(text.begin(), text.end(), '\n', ' ');
    std::replace(text.begin(), text.end(), '\r', ' ');
    *error = new tessera_error{code, std::move(text)};
  } catch (...) {
    *error = &g_out_of_memory;
  }
  return code;
}

// Runs `body`, mapping every exception to a code: tessera::Error keeps its code and message;
// anything else is E_INTERNAL naming `fn`, the C function that failed.
template <class Body>
tessera_code guarded(const char* fn, tessera_error** error, Body&& body) noexcept {
  try {
    body();
    return TESSERA_OK;
  } catch (const tessera::Error& e) {
    return report(error, to_code(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return report(error, TESSERA_E_INTERNAL,
                  (std::string("E_INTERNAL: ") + fn + ": out of memory").c_str());
  } catch (const std::exception& e) {
    try {
      return report(error, TESSERA_E_INTERNAL,
                    (std::string("E_INTERNAL: ") + fn + ": " + e.what()).c_str());
    } catch (...) {
      return report(error, TESSERA_E_INTERNAL, "E_INTERNAL: out of memory");
    }
  } catch (...) {
    try {
      return report(error, TESSERA_E_INTERNAL,
                    (std::string("E_INTERNAL: ") + fn + ": unknown exception").c_str());
    } catch (...) {
      return report(error, TESSERA_E_INTERNAL, "E_INTERNAL: out of memory");
    }
  }
}

void require(const void* p, const char* what, const char* fn) {
  if (p == nullptr) tessera::fail(ErrorCode::Arg, fn, std::string(what) + " is NULL");
}

}  // namespace

struct tessera_model {
  explicit tessera_model(tessera::Model m) : session(std::move(m)) {
    const tessera::Network& net = session.model().network();
    for (int id : net.inputs()) {
      const tessera::NetworkValue& v = net.values()[static_cast<size_t>(id)];
      inputs.push_back({v.name, v.type});
    }
    for (const auto& [name, id] : net.outputs())
      outputs.push_back({name, net.values()[static_cast<size_t>(id)].type});
  }

  struct Port {
    std::string name;
    tessera::ValueType type;  // as resolved: open dims symbolic unless the network fixes them
  };

  tessera::Session session;  // the model and its pool of plans, the only state runs share
  std::vector<Port> inputs, outputs;
  // The caller's reference and one per generator (tessera.h, generation): the last release
  // deletes the model, so no generator outlives it.
  mutable std::atomic<int64_t> references{1};
};

void release(const tessera_model* model) {
  if (model && model->references.fetch_sub(1, std::memory_order_acq_rel) == 1) delete model;
}

struct tessera_generator {
  const tessera_model* model;  // referenced
  std::unique_ptr<tessera::GenerationSession> session;
  const float* logits = nullptr;  // of the last position run; null before the first prefill
};

namespace {

const tessera_model::Port& port(const tessera_model* model, bool input, size_t index,
                                const char* fn) {
  require(model, "model", fn);
  const auto& ports = input ? model->inputs : model->outputs;
  if (index >= ports.size())
    tessera::fail(ErrorCode::Arg, fn,
                  std::string(input ? "input" : "output") + " index " + std::to_string(index) +
                      " is out of range (the model has " + std::to_string(ports.size()) + ")");
  return ports[index];
}

tessera_code port_info(const tessera_model* model, bool input, size_t index, const char** name,
                       tessera_dtype* dtype, size_t* rank, tessera_error** error, const char* fn) {
  return guarded(fn, error, [&] {
    const tessera_model::Port& p = port(model, input, index, fn);
    if (name) *name = p.name.c_str();
    if (dtype) *dtype = from_dtype(p.type.dtype);
    if (rank) *rank = p.type.shape.size();
  });
}

tessera_code port_dim(const tessera_model* model, bool input, size_t index, size_t axis,
                      int64_t* size, const char** symbol, tessera_error** error, const char* fn) {
  return guarded(fn, error, [&] {
    const tessera_model::Port& p = port(model, input, index, fn);
    if (axis >= p.type.shape.size())
      tessera::fail(ErrorCode::Arg, fn,
                    "axis " + std::to_string(axis) + " is out of range (" +
                        std::string(input ? "input " : "output ") + p.name + " has rank " +
                        std::to_string(p.type.shape.size()) + ")");
    const tessera::Dim& d = p.type.shape[axis];
    if (size) *size = d.is_fixed() ? d.value : -1;
    if (symbol) *symbol = d.is_fixed() ? nullptr : d.text.c_str();
  });
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------------------------ errors

tessera_code tessera_error_code(const tessera_error* error) {
  return error ? error->code : TESSERA_OK;
}

const char* tessera_error_message(const tessera_error* error) {
  return error ? error->message.c_str() : "";
}

void tessera_error_free(tessera_error* error) {
  if (error != &g_out_of_memory) delete error;
}

const char* tessera_code_name(tessera_code code) {
  switch (code) {
    case TESSERA_OK:
      return "OK";
    case TESSERA_E_CONSTRAINT:
      return "E_CONSTRAINT";
    case TESSERA_E_SHAPE:
      return "E_SHAPE";
    case TESSERA_E_DTYPE:
      return "E_DTYPE";
    case TESSERA_E_ARG:
      return "E_ARG";
    case TESSERA_E_WEIGHTS:
      return "E_WEIGHTS";
    case TESSERA_E_FORMAT:
      return "E_FORMAT";
    case TESSERA_E_IO:
      return "E_IO";
    case TESSERA_E_UNSUPPORTED:
      return "E_UNSUPPORTED";
    case TESSERA_E_INTERNAL:
      return "E_INTERNAL";
  }
  return "E_UNKNOWN";
}

// ----------------------------------------------------------------------------------- version

const char* tessera_version(void) { return TESSERA_VERSION; }

uint32_t tessera_version_number(void) { return TESSERA_VERSION_NUMBER; }

// ----------------------------------------------------------------------------------- threads

tessera_code tessera_set_num_threads(int n, tessera_error** error) {
  return guarded("tessera_set_num_threads", error, [&] {
    if (n < 0)
      tessera::fail(ErrorCode::Arg, "tessera_set_num_threads",
                    "n=" + std::to_string(n) + " must be >= 1, or 0 for all cores");
    tessera::set_num_threads(n);
  });
}

int tessera_num_threads(void) {
  try {
    return tessera::num_threads();
  } catch (...) {
    return 1;  // oneTBB could not report the cores: a run would use at least one thread
  }
}

// ------------------------------------------------------------------------------------ dtypes

const char* tessera_dtype_name(tessera_dtype dtype) {
  const std::optional<DType> d = to_dtype(dtype);
  return d ? tessera::dtype_safetensors_name(*d) : "UNDEFINED";
}

size_t tessera_dtype_size(tessera_dtype dtype) {
  const std::optional<DType> d = to_dtype(dtype);
  return d ? tessera::dtype_size(*d) : 0;
}

// ----------------------------------------------------------------------------------- tensors

tessera_code tessera_tensor_wrap(void* data, tessera_dtype dtype, const int64_t* shape, size_t rank,
                                 tessera_tensor** tensor, tessera_error** error) {
  constexpr const char* fn = "tessera_tensor_wrap";
  return guarded(fn, error, [&] {
    require(tensor, "tensor", fn);
    if (rank > 0) require(shape, "shape", fn);
    const std::optional<DType> d = to_dtype(dtype);
    if (!d)
      tessera::fail(ErrorCode::Arg, fn,
                    "dtype " + std::to_string(static_cast<int>(dtype)) + " is not a tessera_dtype");
    const tessera::Shape dims(shape, shape + rank);
    const int64_t numel = tessera::shape_numel(dims);  // E_SHAPE: negative dim, overflow
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(tessera::dtype_size(*d)), &bytes))
      tessera::fail(ErrorCode::Shape, fn,
                    "the byte size of " + tessera::shape_to_string(dims) + " " +
                        tessera::dtype_safetensors_name(*d) + " overflows");
    if (data == nullptr && numel > 0)
      tessera::fail(ErrorCode::Arg, fn, "data is NULL for " + std::to_string(numel) + " elements");
    if (reinterpret_cast<uintptr_t>(data) % tessera::dtype_size(*d) != 0)
      tessera::fail(ErrorCode::Arg, fn,
                    std::string("data is not aligned to the ") +
                        std::to_string(tessera::dtype_size(*d)) + "-byte elements of " +
                        tessera::dtype_safetensors_name(*d));
    // A zero-size view of no buffer still needs an address: point at a static byte, never read.
    static char no_elements;
    *tensor = new tessera_tensor{Tensor::wrap(data ? data : &no_elements, dims, *d, nullptr)};
  });
}

tessera_code tessera_tensor_read(const char* path, const char* name, tessera_tensor** tensor,
                                 tessera_error** error) {
  constexpr const char* fn = "tessera_tensor_read";
  return guarded(fn, error, [&] {
    require(path, "path", fn);
    require(name, "name", fn);
    require(tensor, "tensor", fn);
    // clone(): a private, writable copy (the file's mapping is read-only and is unmapped here).
    Tensor t = tessera::SafetensorsFile::open(path).tensor(name).clone();
    *tensor = new tessera_tensor{std::move(t)};
  });
}

void tessera_tensor_free(tessera_tensor* tensor) { delete tensor; }

tessera_dtype tessera_tensor_dtype(const tessera_tensor* tensor) {
  return tensor ? from_dtype(tensor->tensor.dtype()) : TESSERA_DTYPE_UNDEFINED;
}

size_t tessera_tensor_rank(const tessera_tensor* tensor) {
  return tensor ? tensor->tensor.shape().size() : 0;
}

const int64_t* tessera_tensor_shape(const tessera_tensor* tensor) {
  if (!tensor || tensor->tensor.shape().empty()) return nullptr;
  return tensor->tensor.shape().data();
}

int64_t tessera_tensor_numel(const tessera_tensor* tensor) {
  return tensor ? tensor->tensor.numel() : 0;
}

size_t tessera_tensor_nbytes(const tessera_tensor* tensor) {
  return tensor ? tensor->tensor.nbytes() : 0;
}

void* tessera_tensor_data(const tessera_tensor* tensor) {
  return tensor ? tensor->tensor.raw_data() : nullptr;
}

// ------------------------------------------------------------------------------------ models

tessera_code tessera_model_load(const char* network_path, const char* weights_path, uint32_t flags,
                                tessera_model** model, tessera_error** error) {
  constexpr const char* fn = "tessera_model_load";
  return guarded(fn, error, [&] {
    require(network_path, "network_path", fn);
    require(model, "model", fn);
    if (flags & ~TESSERA_LOAD_NON_STRICT)
      tessera::fail(ErrorCode::Arg, fn,
                    "unknown flag bits " + std::to_string(flags & ~TESSERA_LOAD_NON_STRICT));
    const bool strict = (flags & TESSERA_LOAD_NON_STRICT) == 0;
    std::optional<std::string> weights;
    if (weights_path) weights = weights_path;
    tessera::LoadedModel loaded = tessera::load_model(network_path, weights, strict);
    // The command line runs such a network with random parameters and a warning; a library has
    // nowhere to put the warning, so it takes the flag that says random weights are intended.
    if (strict && loaded.weights.empty() && loaded.model.parameter_count() > 0)
      tessera::fail(ErrorCode::Weights, network_path,
                    "no weights: the network has " +
                        std::to_string(loaded.model.parameter_count()) +
                        " parameters, it stores none and no weights file was given "
                        "(TESSERA_LOAD_NON_STRICT initialises them from seed 0)");
    *model = new tessera_model(std::move(loaded.model));
  });
}

void tessera_model_free(tessera_model* model) { release(model); }

size_t tessera_model_num_inputs(const tessera_model* model) {
  return model ? model->inputs.size() : 0;
}

size_t tessera_model_num_outputs(const tessera_model* model) {
  return model ? model->outputs.size() : 0;
}

tessera_code tessera_model_input(const tessera_model* model, size_t index, const char** name,
                                 tessera_dtype* dtype, size_t* rank, tessera_error** error) {
  return port_info(model, true, index, name, dtype, rank, error, "tessera_model_input");
}

tessera_code tessera_model_output(const tessera_model* model, size_t index, const char** name,
                                  tessera_dtype* dtype, size_t* rank, tessera_error** error) {
  return port_info(model, false, index, name, dtype, rank, error, "tessera_model_output");
}

tessera_code tessera_model_input_dim(const tessera_model* model, size_t index, size_t axis,
                                     int64_t* size, const char** symbol, tessera_error** error) {
  return port_dim(model, true, index, axis, size, symbol, error, "tessera_model_input_dim");
}

tessera_code tessera_model_output_dim(const tessera_model* model, size_t index, size_t axis,
                                      int64_t* size, const char** symbol, tessera_error** error) {
  return port_dim(model, false, index, axis, size, symbol, error, "tessera_model_output_dim");
}

tessera_code tessera_model_run(const tessera_model* model, const tessera_tensor* const* inputs,
                               size_t num_inputs, tessera_tensor** outputs, size_t num_outputs,
                               tessera_error** error) {
  constexpr const char* fn = "tessera_model_run";
  return guarded(fn, error, [&] {
    require(model, "model", fn);
    if (num_inputs > 0) require(inputs, "inputs", fn);
    if (num_outputs > 0) require(outputs, "outputs", fn);
    if (num_inputs != model->inputs.size())
      tessera::fail(ErrorCode::Arg, fn,
                    "got " + std::to_string(num_inputs) + " inputs, the network has " +
                        std::to_string(model->inputs.size()));
    if (num_outputs != model->outputs.size())
      tessera::fail(ErrorCode::Arg, fn,
                    "got " + std::to_string(num_outputs) + " output slots, the network has " +
                        std::to_string(model->outputs.size()) + " outputs");
    std::map<std::string, Tensor> tensors;
    std::map<std::string, tessera::TensorDesc> descs;
    for (size_t i = 0; i < num_inputs; ++i) {
      const std::string& name = model->inputs[i].name;
      if (!inputs[i]) tessera::fail(ErrorCode::Arg, fn, "input " + name + " is NULL");
      const Tensor& t = inputs[i]->tensor;
      tensors.emplace(name, t);
      descs[name] = tessera::TensorDesc{t.shape(), t.dtype()};
    }
    // Binding checks every input (E_DTYPE, E_SHAPE, E_CONSTRAINT) before anything runs. The
    // lease, not Session::run: caller-owned slots take the values straight from the plan.
    tessera::Session::Lease lease = model->session.lease(descs);

    // Caller-owned outputs must match exactly: checked before the run, so a mismatch costs
    // nothing and writes nothing (and the workspace, still good, goes back to the pool).
    const tessera::Network& net = model->session.model().network();
    for (size_t k = 0; k < num_outputs; ++k) {
      if (!outputs[k]) continue;
      const tessera::ValueType& want =
          lease.plan().types()[static_cast<size_t>(net.outputs()[k].second)];
      const Tensor& have = outputs[k]->tensor;
      const std::string where = "output " + model->outputs[k].name;
      if (have.dtype() != want.dtype)
        tessera::fail(ErrorCode::DType, where,
                      std::string("the buffer is ") +
                          tessera::dtype_safetensors_name(have.dtype()) + ", the output is " +
                          tessera::dtype_safetensors_name(want.dtype));
      if (have.shape() != tessera::concrete_shape(want.shape))
        tessera::fail(ErrorCode::Shape, where,
                      "the buffer is " + have.shape_str() + ", the output is " +
                          tessera::sym_shape_to_string(want.shape));
    }

    const std::vector<std::pair<std::string, Tensor>>& results = lease.run(tensors);
    // New tensors first, slots after: a failed allocation leaves every slot as it was.
    std::vector<std::unique_ptr<tessera_tensor>> fresh(num_outputs);
    for (size_t k = 0; k < num_outputs; ++k)
      if (!outputs[k])
        fresh[k] = std::make_unique<tessera_tensor>(tessera_tensor{results[k].second.clone()});
    for (size_t k = 0; k < num_outputs; ++k)
      if (outputs[k]) outputs[k]->tensor.copy_from(results[k].second);
    for (size_t k = 0; k < num_outputs; ++k)
      if (fresh[k]) outputs[k] = fresh[k].release();
  });
}

void tessera_model_trim(tessera_model* model) {
  if (model) model->session.trim();
}

// -------------------------------------------------------------------------------- generation

tessera_code tessera_model_context(const tessera_model* model, int64_t* context,
                                   tessera_error** error) {
  constexpr const char* fn = "tessera_model_context";
  return guarded(fn, error, [&] {
    require(model, "model", fn);
    require(context, "context", fn);
    const tessera::Network& net = model->session.model().network();
    tessera::GenerationSession::check(net);
    *context = tessera::GenerationSession::context(net).value_or(0);
  });
}

tessera_code tessera_generator_create(const tessera_model* model, int64_t batch, int64_t capacity,
                                      double temperature, int64_t top_k, double top_p,
                                      uint64_t seed, tessera_generator** generator,
                                      tessera_error** error) {
  constexpr const char* fn = "tessera_generator_create";
  return guarded(fn, error, [&] {
    require(model, "model", fn);
    require(generator, "generator", fn);
    const tessera::Model& m = model->session.model();
    tessera::GenerationSession::check(m.network());
    tessera::SamplingOptions sampling;
    sampling.temperature = temperature;
    sampling.top_k = top_k;
    sampling.top_p = top_p;
    sampling.seed = seed;
    tessera::check_sampling_options(sampling, fn);
    if (batch < 1)
      tessera::fail(ErrorCode::Arg, fn, "batch=" + std::to_string(batch) + " must be >= 1");
    if (capacity < 0)
      tessera::fail(ErrorCode::Arg, fn, "capacity=" + std::to_string(capacity) + " must be >= 0");
    if (capacity == 0) {
      const std::optional<int64_t> context = tessera::GenerationSession::context(m.network());
      if (!context)
        tessera::fail(ErrorCode::Arg, fn,
                      "capacity=0 asks for the model's context, and the network has none: give "
                      "the positions to keep");
      capacity = *context;
    }
    auto g = std::make_unique<tessera_generator>();
    g->model = model;
    g->session = std::make_unique<tessera::GenerationSession>(m, batch, capacity, sampling);
    model->references.fetch_add(1, std::memory_order_relaxed);
    *generator = g.release();
  });
}

void tessera_generator_free(tessera_generator* generator) {
  if (!generator) return;
  const tessera_model* model = generator->model;
  delete generator;  // the session first: it refers to the model
  release(model);
}

int64_t tessera_generator_batch(const tessera_generator* g) {
  return g ? g->session->batch() : 0;
}
int64_t tessera_generator_capacity(const tessera_generator* g) {
  return g ? g->session->capacity() : 0;
}
int64_t tessera_generator_vocab(const tessera_generator* g) {
  return g ? g->session->vocab() : 0;
}
int64_t tessera_generator_position(const tessera_generator* g) {
  return g ? g->session->past() : 0;
}

void tessera_generator_reset(tessera_generator* g) {
  if (!g) return;
  g->session->reset();
  g->logits = nullptr;
}

namespace {

// ids [batch, length] from the caller's row-major buffer. (An out-parameter: these helpers sit
// in the extern "C" block, where returning a C++ type is -Wreturn-type-c-linkage.)
void prompt_tensor(const tessera_generator* g, const int64_t* ids, int64_t length,
                   const char* fn, Tensor& t) {
  if (length < 1)
    tessera::fail(ErrorCode::Shape, fn, "length=" + std::to_string(length) + " must be >= 1");
  t = Tensor::empty({g->session->batch(), length}, tessera::DType::I64);
  std::memcpy(t.data<int64_t>(), ids, static_cast<size_t>(t.numel()) * sizeof(int64_t));
}

void require_prefill(const tessera_generator* g, const char* fn) {
  if (!g->logits)
    tessera::fail(ErrorCode::Arg, fn, "no prompt has run yet (tessera_generator_prefill)");
}

}  // namespace

tessera_code tessera_generator_prefill(tessera_generator* g, const int64_t* ids, int64_t length,
                                       tessera_error** error) {
  constexpr const char* fn = "tessera_generator_prefill";
  return guarded(fn, error, [&] {
    require(g, "generator", fn);
    require(ids, "ids", fn);
    Tensor prompt;
    prompt_tensor(g, ids, length, fn, prompt);
    g->logits = nullptr;
    g->logits = g->session->prefill(prompt);
  });
}

tessera_code tessera_generator_append(tessera_generator* g, const int64_t* ids, int64_t length,
                                      tessera_error** error) {
  constexpr const char* fn = "tessera_generator_append";
  return guarded(fn, error, [&] {
    require(g, "generator", fn);
    require(ids, "ids", fn);
    Tensor chunk;
    prompt_tensor(g, ids, length, fn, chunk);
    g->logits = g->session->append(chunk);
  });
}

tessera_code tessera_generator_step(tessera_generator* g, const int64_t* tokens,
                                    tessera_error** error) {
  constexpr const char* fn = "tessera_generator_step";
  return guarded(fn, error, [&] {
    require(g, "generator", fn);
    require(tokens, "tokens", fn);
    require_prefill(g, fn);
    g->logits = g->session->step(tokens);
  });
}

const float* tessera_generator_logits(const tessera_generator* g) {
  return g ? g->logits : nullptr;
}

tessera_code tessera_generator_sample(tessera_generator* g, int64_t* tokens,
                                      tessera_error** error) {
  constexpr const char* fn = "tessera_generator_sample";
  return guarded(fn, error, [&] {
    require(g, "generator", fn);
    require(tokens, "tokens", fn);
    require_prefill(g, fn);
    const int64_t B = g->session->batch(), V = g->session->vocab();
    for (int64_t b = 0; b < B; ++b) tokens[b] = g->session->sample(b, g->logits + b * V);
  });
}

tessera_code tessera_generator_generate(tessera_generator* g, const int64_t* prompt,
                                        int64_t length, int64_t max_new, int64_t* tokens,
                                        tessera_error** error) {
  constexpr const char* fn = "tessera_generator_generate";
  return guarded(fn, error, [&] {
    require(g, "generator", fn);
    require(prompt, "prompt", fn);
    if (max_new > 0) require(tokens, "tokens", fn);
    Tensor ids;
    prompt_tensor(g, prompt, length, fn, ids);
    g->logits = nullptr;
    const std::vector<std::vector<int64_t>> rows = g->session->generate(ids, max_new);
    for (size_t b = 0; b < rows.size(); ++b)
      std::copy(rows[b].begin(), rows[b].end(), tokens + static_cast<int64_t>(b) * max_new);
    // The last token was sampled, not run: the logits on hand are the position before it.
    if (max_new > 0) g->logits = g->session->logits();
  });
}

}  // extern "C"
