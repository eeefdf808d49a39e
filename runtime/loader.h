// Turning files into a Model: the loading policy the command line, the C API and the fuzzers
// share. io/ parses the files, layers/ builds and fills the layers; this decides which weights
// a model gets and whether it is initialised first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "layers/network.h"

namespace tessera {

// Model::load_weights with every tensor of a checkpoint; tensors tessera cannot read as numbers
// (F8_E4M3, U16, ...) are passed as `unusable` so the weight check can name them.
WeightsReport load_checkpoint_weights(Model& model, const SafetensorsFile& file, bool strict);

// A model as `tessera run NET [--weights W]` and the C API load it.
struct LoadedModel {
  Model model;
  std::string weights;   // the checkpoint the weights came from; empty when none was
  WeightsReport report;  // non-strict: missing (initialised from the seed) and unexpected keys
};

// NET (a network JSON file or a checkpoint carrying `tessera.network`) with the weights of
// `weights_path`, else those stored in NET, else none (parameters stay initialised from `seed`:
// then `weights` is empty; whether that is acceptable is the caller's call). Loading is strict
// or not as Model::load_weights. E_IO, E_FORMAT, the network's errors, E_WEIGHTS.
LoadedModel load_model(const std::string& net_path, const std::optional<std::string>& weights_path,
                       bool strict, uint64_t seed = 0);

}  // namespace tessera
