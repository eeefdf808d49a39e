/* Generating text with tessera from C: load a model, make a generator, run a prompt, then
 * sample and feed back one token at a time, printing each as it comes (the step-by-step API;
 * tessera_generator_generate does the whole loop in one call).
 *
 *   cc main.c $(pkg-config --cflags --libs tessera) -o generate_c
 *   ./generate_c MODEL.safetensors "PROMPT" [NEW_TOKENS [TEMPERATURE [SEED]]]
 *
 * For a character-level model whose token ids are ASCII codes, as the shipped example
 * examples/fortunes/fortunes.safetensors (a GPT trained on Debian's fortunes):
 *   ./generate_c examples/fortunes/fortunes.safetensors "The best way to" 200 0.8 1
 * TEMPERATURE 0 (the default) is greedy; otherwise sampling keeps the 40 most likely tokens.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/tessera.h>

static int fail(const char* what, tessera_error* error) {
  fprintf(stderr, "generate_c: %s: %s\n", what, tessera_error_message(error));
  tessera_error_free(error);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 6) {
    fprintf(stderr, "usage: %s MODEL.safetensors PROMPT [NEW_TOKENS [TEMPERATURE [SEED]]]\n",
            argv[0]);
    return 2;
  }
  const char* prompt = argv[2];
  const long new_tokens = argc > 3 ? strtol(argv[3], NULL, 10) : 100;
  const double temperature = argc > 4 ? strtod(argv[4], NULL) : 0.0;
  const uint64_t seed = argc > 5 ? strtoull(argv[5], NULL, 10) : 0;
  const int64_t length = (int64_t)strlen(prompt);
  if (length < 1 || new_tokens < 0) {
    fprintf(stderr, "generate_c: an empty prompt or a negative token count\n");
    return 2;
  }

  tessera_error* error = NULL;
  tessera_model* model = NULL;
  if (tessera_model_load(argv[1], NULL, 0, &model, &error) != TESSERA_OK)
    return fail("loading the model", error);

  /* One sequence, as many positions as the prompt and the new tokens need. */
  tessera_generator* gen = NULL;
  if (tessera_generator_create(model, 1, length + new_tokens, temperature,
                               temperature > 0.0 ? 40 : 0, 1.0, seed, &gen,
                               &error) != TESSERA_OK) {
    tessera_model_free(model);
    return fail("creating the generator", error);
  }
  /* The generator holds its own reference: the model stays loaded until the generator goes. */
  tessera_model_free(model);

  int64_t* ids = malloc((size_t)length * sizeof(int64_t));
  if (!ids) return 1;
  for (int64_t i = 0; i < length; ++i) ids[i] = (unsigned char)prompt[i];
  int status = 0;
  if (tessera_generator_prefill(gen, ids, length, &error) != TESSERA_OK) {
    status = fail("running the prompt", error);
  } else {
    fputs(prompt, stdout);
    for (long n = 0; n < new_tokens; ++n) {
      int64_t token = 0;
      if (tessera_generator_sample(gen, &token, &error) != TESSERA_OK) {
        status = fail("sampling", error);
        break;
      }
      putchar(token >= 0 && token < 128 ? (int)token : '?');
      fflush(stdout);
      if (n + 1 < new_tokens && tessera_generator_step(gen, &token, &error) != TESSERA_OK) {
        status = fail("a step", error);
        break;
      }
    }
    putchar('\n');
  }
  free(ids);
  tessera_generator_free(gen);
  return status;
}
