#include "runtime/loader.h"

#include <map>

#include "io/network_file.h"

namespace tessera {

WeightsReport load_checkpoint_weights(Model& model, const SafetensorsFile& file, bool strict) {
  std::map<std::string, Tensor> state;
  std::map<std::string, std::string> unusable;
  for (const std::string& name : file.names()) {
    const SafetensorsTensorInfo& info = file.info(name);
    // A number tensor that cannot be a Tensor (rank over 64, dims past int64) is E_SHAPE naming
    // it, from tensor(); only dtypes tessera does not compute with are `unusable`.
    if (info.dtype)
      state.emplace(name, file.tensor(name));
    else
      unusable.emplace(name, info.dtype_name);
  }
  return model.load_weights(state, strict, file.path(), unusable);
}

LoadedModel load_model(const std::string& net_path, const std::optional<std::string>& weights_path,
                       bool strict, uint64_t seed) {
  std::optional<SafetensorsFile> checkpoint;
  const NetworkSpec spec = load_network(net_path, &checkpoint);
  // A strict load from a checkpoint replaces every parameter or fails, so nothing is initialised
  // first: for 1 GB of weights that skips ~3 s of random draws and first-touch writes and 1 GB
  // of RSS, and float32 weights are then used in place in the mapping (ParameterSet::load).
  const bool complete = strict && (weights_path || (checkpoint && checkpoint->size() > 0));
  LoadedModel loaded{Model(spec, complete ? std::nullopt : std::optional<uint64_t>(seed)), {}, {}};
  std::optional<SafetensorsFile> weights;
  const SafetensorsFile* source = nullptr;
  if (weights_path) {
    weights.emplace(SafetensorsFile::open(*weights_path));
    source = &*weights;
  } else if (checkpoint && checkpoint->size() > 0) {
    source = &*checkpoint;
  }
  if (source) {
    loaded.report = load_checkpoint_weights(loaded.model, *source, strict);
    loaded.weights = source->path();
  }
  return loaded;
}

}  // namespace tessera
