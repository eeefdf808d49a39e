/* tessera's C API: load a model once, run it from any number of threads.
 *
 * Stable ABI. Every type a caller holds is an opaque handle (tessera_model, tessera_tensor,
 * tessera_error) or a plain enum with fixed values; no struct layout is exposed, so later
 * releases add functions and enum values but never change these. Build against it with
 * `pkg-config --cflags --libs tessera` and include <tessera/tessera.h>.
 *
 * Errors. Every function that can fail returns a tessera_code (TESSERA_OK, or one of the error
 * codes of tessera's command line: E_SHAPE, E_IO, ...) and takes a last `tessera_error** error`
 * parameter. When it is not NULL and the call fails, *error receives a new error object holding
 * the code and a one-line message ("E_SHAPE: input x: shape [2, 5, 64] does not fit [B, T, 32]");
 * free it with tessera_error_free(). On success *error is not touched; start with NULL. Passing
 * NULL for `error` just drops the message.
 *   Why an out-parameter rather than a thread-local "last error": the message belongs to the
 *   call, whatever thread the caller resumes on. Runtimes that move a task between OS threads
 *   between two foreign calls (Go's cgo, Swift concurrency, C# async) would read another call's
 *   thread-local message, or none. No error state is shared by anything, so any thread may call
 *   anything at any time.
 * Null pointers where a handle or an output is required are TESSERA_E_ARG, naming the
 * parameter. No C++ exception crosses this boundary: an internal failure (a bug, or running out
 * of memory) is TESSERA_E_INTERNAL.
 *
 * Threads. A tessera_model is immutable once loaded: any number of threads may call
 * tessera_model_run() on one model at once. Each run borrows a workspace (the intermediate
 * buffers for its input shapes) from a pool kept by the model, so concurrent runs share the
 * weights (the checkpoint is memory-mapped once, read-only) and nothing else. A tessera_tensor
 * may be read by several threads, but written (as an output) by one run at a time.
 * tessera_model_free() must not race with anything else using that model through the caller's
 * reference (generators hold their own: see the generation section).
 */
#ifndef TESSERA_TESSERA_H_
#define TESSERA_TESSERA_H_

#include <stddef.h>
#include <stdint.h>

#include "tessera/version.h"

#if defined(_WIN32)
#define TESSERA_API
#else
#define TESSERA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------ errors */

/* The error codes of shared/docs/interfaces.md §3. Values are fixed forever. */
typedef enum tessera_code {
  TESSERA_OK = 0,
  TESSERA_E_CONSTRAINT = 1,  /* an argument constraint: heads must divide D, H*W == T, ... */
  TESSERA_E_SHAPE = 2,       /* a tensor's shape does not fit */
  TESSERA_E_DTYPE = 3,       /* a dtype that cannot be used here */
  TESSERA_E_ARG = 4,         /* a bad argument: NULL, unknown name, wrong count, bad flag, ... */
  TESSERA_E_WEIGHTS = 5,     /* missing, unexpected or mis-shaped weights */
  TESSERA_E_FORMAT = 6,      /* malformed safetensors or JSON */
  TESSERA_E_IO = 7,          /* missing or unreadable file */
  TESSERA_E_UNSUPPORTED = 8, /* a valid request this runtime does not serve */
  TESSERA_E_INTERNAL = 9     /* a bug in tessera, or out of memory */
} tessera_code;

typedef struct tessera_error tessera_error;

/* The error's code; TESSERA_OK for NULL. */
TESSERA_API tessera_code tessera_error_code(const tessera_error* error);
/* "E_CODE: <where>: <what>", one line, valid until the error is freed; "" for NULL. */
TESSERA_API const char* tessera_error_message(const tessera_error* error);
/* NULL is allowed. */
TESSERA_API void tessera_error_free(tessera_error* error);
/* "OK", "E_CONSTRAINT", ..., "E_INTERNAL"; "E_UNKNOWN" for a value outside the enum. */
TESSERA_API const char* tessera_code_name(tessera_code code);

/* ----------------------------------------------------------------------------------- version */

/* The loaded library's version, "0.1.0": compare with TESSERA_VERSION_STRING (tessera/version.h)
 * to detect a header/library mismatch. */
TESSERA_API const char* tessera_version(void);
/* major * 10000 + minor * 100 + patch, like TESSERA_VERSION_NUMBER. */
TESSERA_API uint32_t tessera_version_number(void);

/* ---------------------------------------------------------------------------------- threads */

/* Caps the worker threads of every run in the process: n >= 1, or 0 for all cores (the
 * default). Process-wide because one thread pool serves every model (two pools would fight for
 * the cores). E_ARG for n < 0. Safe to call while runs are in flight: they pick it up at their
 * next parallel step. */
TESSERA_API tessera_code tessera_set_num_threads(int n, tessera_error** error);
/* The current cap (all cores when never set). */
TESSERA_API int tessera_num_threads(void);

/* ----------------------------------------------------------------------------------- dtypes */

typedef enum tessera_dtype {
  TESSERA_DTYPE_UNDEFINED = 0, /* what tessera_tensor_dtype(NULL) returns; no tensor has it */
  TESSERA_F32 = 1,
  TESSERA_F16 = 2,
  TESSERA_BF16 = 3,
  TESSERA_F64 = 4,
  TESSERA_I64 = 5,
  TESSERA_I32 = 6,
  TESSERA_U8 = 7,
  TESSERA_I8 = 8,
  TESSERA_BOOL = 9 /* one byte per element, 0 or 1 */
} tessera_dtype;

/* "F32", "F16", ... (safetensors' names); "UNDEFINED" otherwise. */
TESSERA_API const char* tessera_dtype_name(tessera_dtype dtype);
/* Bytes per element; 0 for TESSERA_DTYPE_UNDEFINED or a value outside the enum. */
TESSERA_API size_t tessera_dtype_size(tessera_dtype dtype);

/* ----------------------------------------------------------------------------------- tensors */

/* A dtype, a shape and contiguous row-major data, either the caller's (tessera_tensor_wrap) or
 * the library's (tessera_tensor_read, or an output tessera_model_run allocated). */
typedef struct tessera_tensor tessera_tensor;

/* Views the caller's buffer without copying: `data` holds product(shape) elements of `dtype`,
 * row-major, aligned to the element size, and must outlive the handle. rank 0 is a scalar
 * (`shape` may then be NULL). E_ARG: data or tensor NULL, shape NULL with rank > 0, an unknown
 * dtype, misaligned data. E_SHAPE: a negative dim, a byte size that overflows. */
TESSERA_API tessera_code tessera_tensor_wrap(void* data, tessera_dtype dtype, const int64_t* shape,
                                             size_t rank, tessera_tensor** tensor,
                                             tessera_error** error);
/* Reads tensor `name` of a safetensors file into a new library-owned tensor (a copy, in the
 * stored dtype). E_IO, E_FORMAT (the file); E_ARG (no such tensor, NULL arguments); E_DTYPE (a
 * stored dtype tessera does not compute with, e.g. F8_E4M3). */
TESSERA_API tessera_code tessera_tensor_read(const char* path, const char* name,
                                             tessera_tensor** tensor, tessera_error** error);
/* Frees the handle (and the data, when the library owns it). NULL is allowed. */
TESSERA_API void tessera_tensor_free(tessera_tensor* tensor);

/* Accessors; for NULL they return TESSERA_DTYPE_UNDEFINED, 0 or NULL. */
TESSERA_API tessera_dtype tessera_tensor_dtype(const tessera_tensor* tensor);
TESSERA_API size_t tessera_tensor_rank(const tessera_tensor* tensor);
/* `rank` dims, valid while the tensor lives; NULL for a scalar. */
TESSERA_API const int64_t* tessera_tensor_shape(const tessera_tensor* tensor);
TESSERA_API int64_t tessera_tensor_numel(const tessera_tensor* tensor);
TESSERA_API size_t tessera_tensor_nbytes(const tessera_tensor* tensor);
/* The first element; writable (the library's tensors are private copies). */
TESSERA_API void* tessera_tensor_data(const tessera_tensor* tensor);

/* ------------------------------------------------------------------------------------ models */

typedef struct tessera_model tessera_model;

/* tessera_model_load flags (a bitwise or). */
/* Unexpected weights are ignored and missing ones initialised (seed 0), as
 * `tessera run --non-strict` does; a mis-shaped weight is still E_WEIGHTS. Without this flag
 * every missing, unexpected or mis-shaped weight is named in one E_WEIGHTS error, and a network
 * whose parameters have no weights at all is E_WEIGHTS. */
#define TESSERA_LOAD_NON_STRICT 1u

/* Loads a model. `network_path` is a network JSON file or a .safetensors checkpoint carrying
 * its network in the metadata key `tessera.network` (shared/docs/interfaces.md §2).
 * `weights_path` is a .safetensors checkpoint whose weights replace any stored with the
 * network, or NULL to use the stored ones. Checkpoints are memory-mapped and float32 weights
 * are used in place, read from the file when a run first needs them. Copies are made only of
 * other dtypes (converted) and of the projection weights (linear layers, attention's
 * projections), packed once into the layout the kernels read; with the environment variable
 * TESSERA_PANEL_CACHE naming a directory, the packed weights are kept there (one file per
 * checkpoint, written atomically by the first load) and later loads map them instead of
 * packing (README, "the panel cache"; a cache that cannot be written changes nothing else).
 * The mapping lives as long as the model: meanwhile the file must not be truncated or rewritten
 * in place (reading a vanished page raises SIGBUS); replacing it by rename is safe.
 * E_IO, E_FORMAT (a file), E_ARG / E_CONSTRAINT / E_SHAPE / E_DTYPE / E_UNSUPPORTED (the
 * network), E_WEIGHTS, E_ARG (NULL network_path or model, unknown flag bits). */
TESSERA_API tessera_code tessera_model_load(const char* network_path, const char* weights_path,
                                            uint32_t flags, tessera_model** model,
                                            tessera_error** error);
/* NULL is allowed. Tensors a run returned stay valid: they own their data. */
TESSERA_API void tessera_model_free(tessera_model* model);

/* Inputs and outputs, in the network file's order; 0 for NULL. */
TESSERA_API size_t tessera_model_num_inputs(const tessera_model* model);
TESSERA_API size_t tessera_model_num_outputs(const tessera_model* model);
/* Input `index`: its name (valid while the model lives), the dtype it declares and its rank.
 * Every out-parameter may be NULL. A TESSERA_F32 input accepts F32, F16, BF16 or F64 data
 * (converted); a TESSERA_BOOL input (a mask) accepts BOOL or a float dtype.
 * E_ARG: NULL model, index out of range. */
TESSERA_API tessera_code tessera_model_input(const tessera_model* model, size_t index,
                                             const char** name, tessera_dtype* dtype, size_t* rank,
                                             tessera_error** error);
/* Output `index`: name, dtype (TESSERA_F32, or TESSERA_BOOL for a mask passed straight
 * through), rank. As tessera_model_input otherwise. */
TESSERA_API tessera_code tessera_model_output(const tessera_model* model, size_t index,
                                              const char** name, tessera_dtype* dtype, size_t* rank,
                                              tessera_error** error);
/* Dimension `axis` of input `index`: *size >= 0 when the network fixes it; otherwise *size is
 * -1 and *symbol names it ("B", bound when the model runs; for an output also an expression of
 * symbols such as "T/2"); *symbol is NULL for a fixed dimension. Either out-parameter may be
 * NULL. E_ARG: NULL model, index or axis out of range. */
TESSERA_API tessera_code tessera_model_input_dim(const tessera_model* model, size_t index,
                                                 size_t axis, int64_t* size, const char** symbol,
                                                 tessera_error** error);
TESSERA_API tessera_code tessera_model_output_dim(const tessera_model* model, size_t index,
                                                  size_t axis, int64_t* size, const char** symbol,
                                                  tessera_error** error);

/* Runs the model. Thread-safe: any number of threads may run one model at once.
 * `inputs`: one tensor per network input, in tessera_model_input order; read, never written.
 * `outputs`: one slot per network output, in tessera_model_output order. A NULL slot receives a
 * new library-owned tensor (free it with tessera_tensor_free); a non-NULL slot is a tensor the
 * caller made (tessera_tensor_wrap) with exactly the output's shape and dtype, and receives
 * the values. On failure no slot and no output buffer is touched.
 * E_ARG: NULL model, inputs or outputs (with a non-zero count), a NULL input, a count that is not
 * the network's. E_SHAPE: an input shape that does not fit the network (or binds a symbol two
 * ways), an output buffer of another shape. E_DTYPE: an input dtype the network does not accept,
 * an output buffer of another dtype. E_CONSTRAINT: a check that waited for the shapes (e.g. H*W
 * == T). E_INTERNAL. */
TESSERA_API tessera_code tessera_model_run(const tessera_model* model,
                                           const tessera_tensor* const* inputs, size_t num_inputs,
                                           tessera_tensor** outputs, size_t num_outputs,
                                           tessera_error** error);

/* Frees the idle workspaces the model keeps for later runs (each holds one set of input
 * shapes' intermediate buffers). Runs in flight keep theirs. NULL is allowed. */
TESSERA_API void tessera_model_trim(tessera_model* model);

/* ---------------------------------------------------------------------------- generation
 * Token generation with a key/value cache (shared/docs/interfaces.md §6), for a model with one
 * int64 ids input [B, T], one output of logits [B, T, vocab] and causal attention (the `gpt`
 * recipe). A generator runs the prompt once, keeping every attention layer's keys and values,
 * then one new position per step: each token costs one pass over the weights, not a forward over
 * the whole sequence.
 *
 * Lifetime: a generator holds a reference to its model. tessera_model_free() releases the
 * caller's reference; a model with live generators stays loaded until the last of them is freed
 * (tessera_generator_free), so a generator can never run on a freed model, whatever order the
 * two are freed in.
 *
 * Threads: a generator is one thread's at a time (it is one sequence state and its buffers);
 * any number of generators, on any threads, may run over one model at once, alongside
 * tessera_model_run. Results do not depend on the thread count: the same seed gives the same
 * tokens. */
typedef struct tessera_generator tessera_generator;

/* The longest sequence (prompt plus generated tokens) the model accepts: the `gpt` recipe's
 * context. 0 when the network refuses no length. E_ARG: NULL arguments, a network that cannot
 * generate (the message names what is missing or the node that looks at later positions). */
TESSERA_API tessera_code tessera_model_context(const tessera_model* model, int64_t* context,
                                               tessera_error** error);

/* A generator for `batch` sequences of up to `capacity` positions (prompt plus new tokens; 0:
 * the model's context), sampling with `temperature` (0: greedy, the lowest index among equal
 * maxima), `top_k` (0: all tokens), `top_p` (in (0, 1]; 1: all) and `seed`. The caches are
 * allocated here: batch * capacity * 2 * (the model width) floats per attention layer.
 * E_ARG: NULL arguments, a network that cannot generate, temperature < 0 or not finite,
 * top_k < 0, top_p outside (0, 1], batch < 1, capacity 0 with a model that has no context.
 * E_SHAPE: capacity above the context, caches over the memory budget. */
TESSERA_API tessera_code tessera_generator_create(const tessera_model* model, int64_t batch,
                                                  int64_t capacity, double temperature,
                                                  int64_t top_k, double top_p, uint64_t seed,
                                                  tessera_generator** generator,
                                                  tessera_error** error);
/* Releases the generator and its reference to the model. NULL is allowed. */
TESSERA_API void tessera_generator_free(tessera_generator* generator);

TESSERA_API int64_t tessera_generator_batch(const tessera_generator* generator);
TESSERA_API int64_t tessera_generator_capacity(const tessera_generator* generator);
TESSERA_API int64_t tessera_generator_vocab(const tessera_generator* generator);
/* Positions of each sequence run so far (0 after create or reset). */
TESSERA_API int64_t tessera_generator_position(const tessera_generator* generator);

/* Forgets every position and restarts the sampler from its seed. NULL is allowed. */
TESSERA_API void tessera_generator_reset(tessera_generator* generator);

/* Resets, then runs the prompt: `ids` holds batch rows of `length` token ids, row-major.
 * Afterwards tessera_generator_logits() holds each row's logits for the next token.
 * E_ARG: NULL arguments. E_SHAPE: length < 1 or above the capacity, an id outside the
 * vocabulary (nothing has run then). */
TESSERA_API tessera_code tessera_generator_prefill(tessera_generator* generator,
                                                   const int64_t* ids, int64_t length,
                                                   tessera_error** error);
/* Runs one new position per row: `tokens` holds batch ids (usually the sampled ones).
 * E_ARG: NULL arguments, no prefill yet. E_SHAPE: the capacity is full, an id outside the
 * vocabulary. */
TESSERA_API tessera_code tessera_generator_step(tessera_generator* generator,
                                                const int64_t* tokens, tessera_error** error);
/* Runs `length` new positions per row after those so far, without resetting (a conversation's
 * next turn: the positions before it stay in the caches). `ids` holds batch rows of `length`
 * ids, row-major. One pass over the weights for the whole chunk, not one per token. Afterwards
 * tessera_generator_logits() holds each row's logits for the next token. Before any prefill it
 * runs as a prompt (without the reset). E_ARG: NULL arguments. E_SHAPE: length < 1, the
 * positions so far plus `length` above the capacity, an id outside the vocabulary (nothing has
 * run then). */
TESSERA_API tessera_code tessera_generator_append(tessera_generator* generator,
                                                  const int64_t* ids, int64_t length,
                                                  tessera_error** error);
/* The logits of the last position run, [batch, vocab] row-major float32, owned by the generator
 * and valid until its next prefill, append, step, reset or free; NULL before the first prefill
 * or append. */
TESSERA_API const float* tessera_generator_logits(const tessera_generator* generator);
/* Chooses each row's next token from tessera_generator_logits() into tokens[batch] (greedy, or
 * one draw per row from its seeded stream). E_ARG: NULL arguments, no prefill yet.
 * E_CONSTRAINT: sampling a row with a NaN logit. */
TESSERA_API tessera_code tessera_generator_sample(tessera_generator* generator, int64_t* tokens,
                                                  tessera_error** error);
/* The whole loop: prefill `prompt` (batch rows of `length`), then `max_new` tokens per row, each
 * sampled and fed back; tokens[batch * max_new] receives them row by row (prompt excluded).
 * As `tessera generate`: E_SHAPE before anything runs when length + max_new exceeds the
 * capacity. */
TESSERA_API tessera_code tessera_generator_generate(tessera_generator* generator,
                                                    const int64_t* prompt, int64_t length,
                                                    int64_t max_new, int64_t* tokens,
                                                    tessera_error** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TESSERA_TESSERA_H_ */
