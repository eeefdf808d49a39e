/* Embedding tessera in a C program: load a model, describe it, run it twice (into a tensor the
 * library allocates, then into the caller's own buffer) and print a checksum of the output.
 *
 *   cc main.c $(pkg-config --cflags --libs tessera) -o embed_c
 *   ./embed_c MODEL.safetensors INPUT.safetensors [EXPECTED.safetensors]
 *
 * INPUT holds one tensor per model input, by input name. With EXPECTED (one tensor per output,
 * by output name) the program also prints the largest difference and fails above 1e-4. The
 * shipped example: examples/encoder/{encoder,input,expected}.safetensors.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/tessera.h>

/* Prints the failure and frees the error; returns 1 for main. */
static int fail(const char* what, tessera_error* error) {
  fprintf(stderr, "embed_c: %s: %s\n", what, tessera_error_message(error));
  tessera_error_free(error);
  return 1;
}

/* "[B, T, 64]" from the model's declared shape of input (or output) `index`. */
static void print_declared_shape(const tessera_model* model, int input, size_t index, size_t rank) {
  printf("[");
  for (size_t axis = 0; axis < rank; ++axis) {
    int64_t size = 0;
    const char* symbol = NULL;
    if (input)
      tessera_model_input_dim(model, index, axis, &size, &symbol, NULL);
    else
      tessera_model_output_dim(model, index, axis, &size, &symbol, NULL);
    if (symbol)
      printf("%s%s", axis ? ", " : "", symbol);
    else
      printf("%s%lld", axis ? ", " : "", (long long)size);
  }
  printf("]");
}

/* FNV-1a over the bytes: equal only for bitwise equal outputs. */
static uint64_t fnv1a(const void* data, size_t bytes) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s MODEL.safetensors INPUT.safetensors [EXPECTED.safetensors]\n",
            argv[0]);
    return 2;
  }
  if (strcmp(tessera_version(), TESSERA_VERSION_STRING) != 0) {
    fprintf(stderr, "embed_c: built against tessera %s, running with %s\n", TESSERA_VERSION_STRING,
            tessera_version());
    return 1;
  }
  printf("tessera %s\n", tessera_version());

  tessera_error* error = NULL;
  tessera_model* model = NULL;
  if (tessera_model_load(argv[1], NULL, 0, &model, &error) != TESSERA_OK)
    return fail("load", error);

  const size_t n_in = tessera_model_num_inputs(model);
  const size_t n_out = tessera_model_num_outputs(model);
  tessera_tensor** inputs = calloc(n_in ? n_in : 1, sizeof *inputs);
  tessera_tensor** outputs = calloc(n_out ? n_out : 1, sizeof *outputs);
  tessera_tensor** mine = calloc(n_out ? n_out : 1, sizeof *mine);
  void** buffers = calloc(n_out ? n_out : 1, sizeof *buffers);
  if (!inputs || !outputs || !mine || !buffers) return 1;
  int status = 0;

  for (size_t i = 0; i < n_in && status == 0; ++i) {
    const char* name = NULL;
    tessera_dtype dtype = TESSERA_DTYPE_UNDEFINED;
    size_t rank = 0;
    tessera_model_input(model, i, &name, &dtype, &rank, NULL);
    printf("input %s ", name);
    print_declared_shape(model, 1, i, rank);
    printf(" %s\n", tessera_dtype_name(dtype));
    if (tessera_tensor_read(argv[2], name, &inputs[i], &error) != TESSERA_OK)
      status = fail("input", error);
  }

  /* First run: every output slot NULL, so the library allocates the outputs. */
  if (status == 0 && tessera_model_run(model, (const tessera_tensor* const*)inputs, n_in, outputs,
                                       n_out, &error) != TESSERA_OK)
    status = fail("run", error);

  /* Second run: into buffers this program owns, shaped like the first run's outputs. */
  for (size_t k = 0; k < n_out && status == 0; ++k) {
    buffers[k] = malloc(tessera_tensor_nbytes(outputs[k]) + 1);
    if (!buffers[k] ||
        tessera_tensor_wrap(buffers[k], tessera_tensor_dtype(outputs[k]),
                            tessera_tensor_shape(outputs[k]), tessera_tensor_rank(outputs[k]),
                            &mine[k], &error) != TESSERA_OK)
      status = buffers[k] ? fail("wrap", error) : 1;
  }
  if (status == 0 && tessera_model_run(model, (const tessera_tensor* const*)inputs, n_in, mine,
                                       n_out, &error) != TESSERA_OK)
    status = fail("run into own buffers", error);

  for (size_t k = 0; k < n_out && status == 0; ++k) {
    const char* name = NULL;
    tessera_model_output(model, k, &name, NULL, NULL, NULL);
    const size_t bytes = tessera_tensor_nbytes(outputs[k]);
    if (memcmp(buffers[k], tessera_tensor_data(outputs[k]), bytes) != 0) {
      fprintf(stderr, "embed_c: output %s differs between the two runs\n", name);
      status = 1;
      break;
    }
    const size_t rank = tessera_tensor_rank(outputs[k]);
    const int64_t* shape = tessera_tensor_shape(outputs[k]);
    printf("output %s [", name);
    for (size_t a = 0; a < rank; ++a) printf("%s%lld", a ? ", " : "", (long long)shape[a]);
    printf("] %s checksum fnv1a=%016llx", tessera_dtype_name(tessera_tensor_dtype(outputs[k])),
           (unsigned long long)fnv1a(buffers[k], bytes));
    if (tessera_tensor_dtype(outputs[k]) != TESSERA_F32) { /* a mask passed through */
      printf("\n");
      continue;
    }
    const float* y = (const float*)buffers[k];
    const int64_t n = tessera_tensor_numel(outputs[k]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += y[i];
    printf(" sum=%.6f\n", sum);

    if (argc == 4) {
      tessera_tensor* expected = NULL;
      if (tessera_tensor_read(argv[3], name, &expected, &error) != TESSERA_OK) {
        status = fail("expected", error);
        break;
      }
      double worst = 1e300; /* a dtype or size mismatch fails */
      if (tessera_tensor_dtype(expected) == TESSERA_F32 && tessera_tensor_numel(expected) == n) {
        const float* e = (const float*)tessera_tensor_data(expected);
        worst = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double d = (double)y[i] - e[i];
          const double a = d < 0 ? -d : d;
          if (a != a) /* NaN */
            worst = 1e300;
          else if (a > worst)
            worst = a;
        }
      }
      tessera_tensor_free(expected);
      printf("output %s: max |difference| from %s = %.3g\n", name, argv[3], worst);
      if (!(worst <= 1e-4)) status = 1;
    }
  }

  for (size_t i = 0; i < n_in; ++i) tessera_tensor_free(inputs[i]);
  for (size_t k = 0; k < n_out; ++k) {
    tessera_tensor_free(outputs[k]);
    tessera_tensor_free(mine[k]);
    free(buffers[k]);
  }
  free(inputs);
  free(outputs);
  free(mine);
  free(buffers);
  tessera_model_free(model);
  return status;
}
