#include "runtime/loader.h"

#include <cstdlib>
#include <map>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/error.h"
#include "io/network_file.h"
#include "io/panel_cache.h"
#include "layers/parameters.h"

namespace tessera {

WeightsReport load_checkpoint_weights(Model& model, const SafetensorsFile& file, bool strict,
                                      const PanelLookup* packed) {
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
  return model.load_weights(state, strict, file.path(), unusable, packed);
}

std::string default_panel_cache_dir() {
  const char* dir = std::getenv("TESSERA_PANEL_CACHE");
  return dir ? dir : "";
}

namespace {

// load_checkpoint_weights through the panel cache in `dir` (see load_model).
void load_through_panel_cache(LoadedModel& loaded, const SafetensorsFile& source, bool strict,
                              const std::string& dir) {
  const std::string layout = projection_panel_layout(cpu_device());
  if (layout.empty() || !source.identity().known()) {
    loaded.report = load_checkpoint_weights(loaded.model, source, strict);
    return;
  }
  loaded.panel_cache = PanelCacheFile::path_for(dir, source.path());
  std::string why;
  const std::optional<PanelCacheFile> cache =
      PanelCacheFile::open(loaded.panel_cache, source.identity(), layout, &why);
  int64_t asked = 0, found = 0;
  auto find = [&](const std::string& key, int64_t rows, int64_t cols, int64_t floats) {
    if (!source.contains(key)) return Tensor();  // seeded, not the checkpoint's: never cached
    ++asked;
    Tensor t = cache ? cache->panels(key, rows, cols, floats) : Tensor();
    found += t.defined() ? 1 : 0;
    return t;
  };
  const PanelLookup lookup = find;
  loaded.report = load_checkpoint_weights(loaded.model, source, strict, &lookup);
  loaded.panel_cache_hit = found == asked;
  if (found == asked) return;
  std::vector<PanelCacheEntry> entries;
  for (const PackedProjection& p : loaded.model.packed_projections())
    if (source.contains(p.key))
      entries.push_back({p.key, p.rows, p.cols, p.panels->data<float>(), p.panels->numel()});
  try {
    write_panel_cache(loaded.panel_cache, source.identity(), layout, entries);
  } catch (const Error& e) {
    loaded.panel_cache_warning = std::string(error_code_name(e.code())) + ": " + e.message();
  }
}

}  // namespace

LoadedModel load_model(const std::string& net_path, const std::optional<std::string>& weights_path,
                       bool strict, uint64_t seed,
                       const std::optional<std::string>& panel_cache_dir) {
  std::optional<SafetensorsFile> checkpoint;
  const NetworkSpec spec = load_network(net_path, &checkpoint);
  // A strict load from a checkpoint replaces every parameter or fails, so nothing is initialised
  // first: for 1 GB of weights that skips ~3 s of random draws and first-touch writes and 1 GB
  // of RSS, and float32 weights are then used in place in the mapping (ParameterSet::load).
  const bool complete = strict && (weights_path || (checkpoint && checkpoint->size() > 0));
  LoadedModel loaded{Model(spec, complete ? std::nullopt : std::optional<uint64_t>(seed)),
                     {}, {}, {}, false, {}};
  std::optional<SafetensorsFile> weights;
  const SafetensorsFile* source = nullptr;
  if (weights_path) {
    weights.emplace(SafetensorsFile::open(*weights_path));
    source = &*weights;
  } else if (checkpoint && checkpoint->size() > 0) {
    source = &*checkpoint;
  }
  if (source) {
    const std::string dir = panel_cache_dir ? *panel_cache_dir : default_panel_cache_dir();
    if (dir.empty())
      loaded.report = load_checkpoint_weights(loaded.model, *source, strict);
    else
      load_through_panel_cache(loaded, *source, strict, dir);
    loaded.weights = source->path();
  }
  return loaded;
}

}  // namespace tessera
