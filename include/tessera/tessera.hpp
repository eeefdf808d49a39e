// tessera's C++ API: RAII handles over the C API (tessera.h), errors as exceptions.
//
// Header-only on purpose: everything here is inline code calling the stable C functions, so a
// program built against one release keeps working with a later libtessera.so.0, whatever
// compiler or standard library either was built with (C++ classes exported from a .so would tie
// both to one libstdc++ ABI). Needs C++17.
//
//   tessera::Model model = tessera::Model::load("encoder.safetensors");
//   tessera::Tensor x = tessera::Tensor::wrap(buffer.data(), {2, 16, 64});
//   std::vector<tessera::Tensor> y = model.run({&x});
//
// The classes live in an inline namespace (tessera::v0) so their mangled names differ from
// the library's internal C++ classes, which share the `tessera` namespace: never include this
// next to tessera's internal headers (layers/, core/) in one file.
#ifndef TESSERA_TESSERA_HPP_
#define TESSERA_TESSERA_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/tessera.h"

namespace tessera {
inline namespace v0 {

// A failed call: the C API's code and its one-line message ("E_SHAPE: input x: ...").
class Error : public std::runtime_error {
 public:
  Error(tessera_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  tessera_code code() const noexcept { return code_; }

 private:
  tessera_code code_;
};

namespace detail {

// Turns a C result into an exception, freeing the C error object. `error` by reference: in
// check(tessera_f(..., &error), error) a by-value copy could be taken before tessera_f runs
// (argument evaluation order is unspecified; GCC goes right to left) and would miss the error.
inline void check(tessera_code code, tessera_error*& error) {
  if (code == TESSERA_OK) return;
  const std::string message = error ? tessera_error_message(error) : tessera_code_name(code);
  tessera_error_free(error);
  throw Error(code, message);
}

template <class T>
constexpr tessera_dtype dtype_of() {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return TESSERA_F32;
  else if constexpr (std::is_same_v<U, double>)
    return TESSERA_F64;
  else if constexpr (std::is_same_v<U, int64_t>)
    return TESSERA_I64;
  else if constexpr (std::is_same_v<U, int32_t>)
    return TESSERA_I32;
  else if constexpr (std::is_same_v<U, uint8_t>)
    return TESSERA_U8;
  else if constexpr (std::is_same_v<U, int8_t>)
    return TESSERA_I8;
  else if constexpr (std::is_same_v<U, bool>)
    return TESSERA_BOOL;
  else
    static_assert(sizeof(U) == 0, "no tessera dtype for this element type");
}

}  // namespace detail

inline std::string version() { return tessera_version(); }

// Process-wide cap on worker threads: n >= 1, or 0 for all cores (tessera_set_num_threads).
inline void set_num_threads(int n) {
  tessera_error* error = nullptr;
  detail::check(tessera_set_num_threads(n, &error), error);
}
inline int num_threads() { return tessera_num_threads(); }

// A tensor handle: the caller's buffer (wrap) or the library's (read, run outputs). Move-only.
class Tensor {
 public:
  Tensor() = default;  // no handle: as a run() output slot, receives a library-owned tensor
  explicit Tensor(tessera_tensor* handle) : handle_(handle) {}  // adopts

  // Views `data` (product(shape) elements, row-major) without copying; the buffer must
  // outlive the tensor.
  static Tensor wrap(void* data, tessera_dtype dtype, const std::vector<int64_t>& shape) {
    tessera_tensor* t = nullptr;
    tessera_error* error = nullptr;
    detail::check(tessera_tensor_wrap(data, dtype, shape.data(), shape.size(), &t, &error), error);
    return Tensor(t);
  }
  // The dtype follows T (float: F32, double: F64, int64_t: I64, ..., bool: BOOL). Inputs are
  // never written, so const data is accepted; do not pass it as an output.
  template <class T>
  static Tensor wrap(T* data, const std::vector<int64_t>& shape) {
    return wrap(const_cast<std::remove_const_t<T>*>(data), detail::dtype_of<T>(), shape);
  }
  // Tensor `name` of a safetensors file, copied.
  static Tensor read(const std::string& path, const std::string& name) {
    tessera_tensor* t = nullptr;
    tessera_error* error = nullptr;
    detail::check(tessera_tensor_read(path.c_str(), name.c_str(), &t, &error), error);
    return Tensor(t);
  }

  explicit operator bool() const { return handle_ != nullptr; }
  tessera_tensor* get() const { return handle_.get(); }
  tessera_tensor* release() { return handle_.release(); }
  void reset(tessera_tensor* handle = nullptr) { handle_.reset(handle); }

  tessera_dtype dtype() const { return tessera_tensor_dtype(get()); }
  std::vector<int64_t> shape() const {
    const int64_t* dims = tessera_tensor_shape(get());
    return dims ? std::vector<int64_t>(dims, dims + tessera_tensor_rank(get()))
                : std::vector<int64_t>();
  }
  int64_t numel() const { return tessera_tensor_numel(get()); }
  size_t nbytes() const { return tessera_tensor_nbytes(get()); }
  void* data() const { return tessera_tensor_data(get()); }
  // Typed access; Error (E_DTYPE) when T is not the tensor's element type.
  template <class T>
  T* data() const {
    if (dtype() != detail::dtype_of<T>())
      throw Error(TESSERA_E_DTYPE, std::string("E_DTYPE: tensor: the tensor is ") +
                                       tessera_dtype_name(dtype()) + ", not " +
                                       tessera_dtype_name(detail::dtype_of<T>()));
    return static_cast<T*>(data());
  }

 private:
  struct Free {
    void operator()(tessera_tensor* t) const noexcept { tessera_tensor_free(t); }
  };
  std::unique_ptr<tessera_tensor, Free> handle_;
};

// One dimension of a declared shape: a size, or (size -1) a symbol such as "B" or "T/2".
struct Dim {
  int64_t size = -1;
  std::string symbol;
};

// A network input or output as declared.
struct ValueInfo {
  std::string name;
  tessera_dtype dtype = TESSERA_DTYPE_UNDEFINED;
  std::vector<Dim> shape;
};

// A loaded model. Immutable: run() may be called from any number of threads at once.
// Move-only.
class Model {
 public:
  // `network_path`: a network JSON file or a checkpoint carrying its network; `weights_path`:
  // a checkpoint whose weights replace the stored ones ("" for none). `flags`:
  // TESSERA_LOAD_NON_STRICT or 0.
  static Model load(const std::string& network_path, const std::string& weights_path = "",
                    uint32_t flags = 0) {
    tessera_model* m = nullptr;
    tessera_error* error = nullptr;
    detail::check(tessera_model_load(network_path.c_str(),
                                     weights_path.empty() ? nullptr : weights_path.c_str(), flags,
                                     &m, &error),
                  error);
    return Model(m);
  }

  explicit Model(tessera_model* handle) : handle_(handle) {}  // adopts
  tessera_model* get() const { return handle_.get(); }

  std::vector<ValueInfo> inputs() const { return values(true); }
  std::vector<ValueInfo> outputs() const { return values(false); }

  // Runs on `inputs` (in inputs() order). Each output slot with a handle (a wrapped buffer of
  // the output's exact shape and dtype) receives the values; each without receives a new
  // library-owned tensor.
  void run(const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs) const {
    std::vector<const tessera_tensor*> in;
    for (const Tensor* t : inputs) in.push_back(t ? t->get() : nullptr);
    std::vector<tessera_tensor*> out;
    for (Tensor* t : outputs) {
      if (!t) throw Error(TESSERA_E_ARG, "E_ARG: Model::run: an output slot is null");
      out.push_back(t->get());
    }
    tessera_error* error = nullptr;
    detail::check(tessera_model_run(get(), in.data(), in.size(), out.data(), out.size(), &error),
                  error);
    for (size_t k = 0; k < outputs.size(); ++k)
      if (!*outputs[k]) outputs[k]->reset(out[k]);
  }
  // Runs on `inputs`; every output library-owned, in outputs() order.
  std::vector<Tensor> run(const std::vector<const Tensor*>& inputs) const {
    std::vector<Tensor> out(tessera_model_num_outputs(get()));
    std::vector<Tensor*> slots;
    for (Tensor& t : out) slots.push_back(&t);
    run(inputs, slots);
    return out;
  }

  // Frees the idle workspaces kept for later runs.
  void trim() { tessera_model_trim(get()); }

 private:
  std::vector<ValueInfo> values(bool input) const {
    const size_t n = input ? tessera_model_num_inputs(get()) : tessera_model_num_outputs(get());
    std::vector<ValueInfo> out(n);
    for (size_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      size_t rank = 0;
      tessera_error* error = nullptr;
      detail::check(input ? tessera_model_input(get(), i, &name, &out[i].dtype, &rank, &error)
                          : tessera_model_output(get(), i, &name, &out[i].dtype, &rank, &error),
                    error);
      out[i].name = name;
      out[i].shape.resize(rank);
      for (size_t a = 0; a < rank; ++a) {
        const char* symbol = nullptr;
        Dim& d = out[i].shape[a];
        detail::check(input ? tessera_model_input_dim(get(), i, a, &d.size, &symbol, &error)
                            : tessera_model_output_dim(get(), i, a, &d.size, &symbol, &error),
                      error);
        if (symbol) d.symbol = symbol;
      }
    }
    return out;
  }

  struct Free {
    void operator()(tessera_model* m) const noexcept { tessera_model_free(m); }
  };
  std::unique_ptr<tessera_model, Free> handle_;
};

// Sampling for a Generator: greedy by default (tessera_generator_create has the rules).
struct Sampling {
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
};

// Token generation with a key/value cache (tessera.h, generation). Holds its own reference to
// the model: it stays valid after the Model object that made it is gone. One thread at a time.
class Generator {
 public:
  // `capacity` 0: the model's context.
  Generator(const Model& model, int64_t batch, int64_t capacity = 0, const Sampling& s = {}) {
    tessera_generator* g = nullptr;
    tessera_error* error = nullptr;
    detail::check(tessera_generator_create(model.get(), batch, capacity, s.temperature, s.top_k,
                                           s.top_p, s.seed, &g, &error),
                  error);
    handle_.reset(g);
  }
  tessera_generator* get() const { return handle_.get(); }
  int64_t batch() const { return tessera_generator_batch(get()); }
  int64_t capacity() const { return tessera_generator_capacity(get()); }
  int64_t vocab() const { return tessera_generator_vocab(get()); }
  int64_t position() const { return tessera_generator_position(get()); }

  // The prompt, batch rows of `length` ids row-major; then logits() holds the next token's.
  void prefill(const std::vector<int64_t>& ids) {
    const int64_t length = rows_of(ids, "Generator::prefill");
    tessera_error* error = nullptr;
    detail::check(tessera_generator_prefill(get(), ids.data(), length, &error), error);
  }
  // More positions after those so far (batch rows of `length` ids), without a reset.
  void append(const std::vector<int64_t>& ids) {
    const int64_t length = rows_of(ids, "Generator::append");
    tessera_error* error = nullptr;
    detail::check(tessera_generator_append(get(), ids.data(), length, &error), error);
  }
  void step(const std::vector<int64_t>& tokens) {
    check_batch(tokens, "Generator::step");
    tessera_error* error = nullptr;
    detail::check(tessera_generator_step(get(), tokens.data(), &error), error);
  }
  // [batch, vocab] row-major, valid until the next call; null before the first prefill.
  const float* logits() const { return tessera_generator_logits(get()); }
  std::vector<int64_t> sample() {
    std::vector<int64_t> tokens(static_cast<size_t>(batch()));
    tessera_error* error = nullptr;
    detail::check(tessera_generator_sample(get(), tokens.data(), &error), error);
    return tokens;
  }
  // max_new tokens per row after the prompt (batch rows of equal length, row-major).
  std::vector<std::vector<int64_t>> generate(const std::vector<int64_t>& prompt,
                                             int64_t max_new) {
    const int64_t B = batch();
    std::vector<int64_t> flat(static_cast<size_t>(B * std::max<int64_t>(max_new, 0)));
    tessera_error* error = nullptr;
    detail::check(tessera_generator_generate(get(), prompt.data(),
                                             rows_of(prompt, "Generator::generate"), max_new,
                                             flat.data(), &error),
                  error);
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      rows[static_cast<size_t>(b)].assign(flat.begin() + b * max_new,
                                          flat.begin() + (b + 1) * max_new);
    return rows;
  }
  void reset() { tessera_generator_reset(get()); }

 private:
  // The row length of batch equal rows.
  int64_t rows_of(const std::vector<int64_t>& ids, const char* fn) const {
    const int64_t n = static_cast<int64_t>(ids.size()), B = batch();
    if (n % B != 0)
      throw Error(TESSERA_E_ARG, std::string("E_ARG: ") + fn + ": " + std::to_string(n) +
                                     " ids are not " + std::to_string(B) + " equal rows");
    return n / B;
  }
  void check_batch(const std::vector<int64_t>& tokens, const char* fn) const {
    if (static_cast<int64_t>(tokens.size()) != batch())
      throw Error(TESSERA_E_ARG, std::string("E_ARG: ") + fn + ": " +
                                     std::to_string(tokens.size()) + " tokens for a batch of " +
                                     std::to_string(batch()));
  }
  struct Free {
    void operator()(tessera_generator* g) const noexcept { tessera_generator_free(g); }
  };
  std::unique_ptr<tessera_generator, Free> handle_;
};

}  // namespace v0
}  // namespace tessera

#endif  // TESSERA_TESSERA_HPP_
