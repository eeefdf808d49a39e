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
// `packed` as in Model::load_weights.
WeightsReport load_checkpoint_weights(Model& model, const SafetensorsFile& file, bool strict,
                                      const PanelLookup* packed = nullptr);

// A model as `tessera run NET [--weights W]` and the C API load it.
struct LoadedModel {
  Model model;
  std::string weights;   // the checkpoint the weights came from; empty when none was
  WeightsReport report;  // non-strict: missing (initialised from the seed) and unexpected keys
  // The panel cache file the load used (empty: none), whether every packed projection weight
  // came from it, and why it could not be written when that failed (the model is fine then).
  std::string panel_cache;
  bool panel_cache_hit = false;
  std::string panel_cache_warning;
};

// The directory of panel caches when the caller names none: $TESSERA_PANEL_CACHE, or "" (no
// cache) when it is unset or empty.
std::string default_panel_cache_dir();

// NET (a network JSON file or a checkpoint carrying `tessera.network`) with the weights of
// `weights_path`, else those stored in NET, else none (parameters stay initialised from `seed`:
// then `weights` is empty; whether that is acceptable is the caller's call). Loading is strict
// or not as Model::load_weights. E_IO, E_FORMAT, the network's errors, E_WEIGHTS.
//
// With a non-empty `panel_cache_dir` (default: default_panel_cache_dir()), the projection
// weights' packed panels come from that directory's cache file for the checkpoint when it is
// valid for the checkpoint as it is now and for this build's panel layout (io/panel_cache.h);
// otherwise they are packed and the file is (re)written atomically for the next load. Only
// weights read from the checkpoint are cached, never seeded ones. A cache never changes a
// result: the panels are the same bytes either way.
LoadedModel load_model(const std::string& net_path, const std::optional<std::string>& weights_path,
                       bool strict, uint64_t seed = 0,
                       const std::optional<std::string>& panel_cache_dir = std::nullopt);

}  // namespace tessera
