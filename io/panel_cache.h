// The panel cache: a checkpoint's projection weights as the projection kernel packs them
// (LinearKernels::pack_weights), kept in a file so that the next process maps them from the
// page cache instead of packing again. Packing ViT-B/16's 330 MB of projections costs
// 250-750 ms of every load on these machines, most of it first touches of fresh memory; mapping
// packed panels that are already in the page cache costs a fraction of that.
//
// File layout (little-endian): "TSPANEL1", u64 header length H, H bytes of JSON, zero padding
// to a multiple of 4096, then the panels, each at a 4096-aligned offset from the data start:
//   {"version": 1, "layout": "...",
//    "checkpoint": {"device": D, "inode": I, "size": S, "mtime_ns": M},
//    "entries": [{"key": "...", "rows": N, "cols": K, "offset": O, "floats": F}, ...]}
// A file is used only when its layout and checkpoint identity match the caller's exactly; it is
// a cache, so a file that is missing, stale, foreign or malformed is a miss (with the reason),
// never an error, and whatever it holds cannot make a load read outside it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace tessera {

// One packed projection weight to store: the checkpoint key of its [rows, cols] weight and its
// `floats` floats of panels.
struct PanelCacheEntry {
  std::string key;
  int64_t rows = 0, cols = 0;
  const float* panels = nullptr;
  int64_t floats = 0;
};

class PanelCacheFile {
 public:
  // dir/<16 hex digits>.tpanels, the digits a hash of the checkpoint's canonical path: one cache
  // file per checkpoint, replaced when the checkpoint changes.
  static std::string path_for(const std::string& dir, const std::string& checkpoint_path);

  // Maps `path` and validates it against `checkpoint` and `layout`. nullopt when it cannot be
  // used, with the reason in *why ("absent", "the checkpoint changed", "malformed: ...").
  static std::optional<PanelCacheFile> open(const std::string& path,
                                            const FileIdentity& checkpoint,
                                            const std::string& layout, std::string* why);

  // A read-only view of the panels stored for `key` when the entry is for a [rows, cols] weight
  // and holds exactly `floats` floats; undefined otherwise.
  Tensor panels(const std::string& key, int64_t rows, int64_t cols, int64_t floats) const;

  struct Entry {
    int64_t rows, cols, floats;
    uint64_t offset;  // bytes from the start of the file
  };
  // Every entry by key, each checked to lie inside the file, 4096-aligned.
  const std::unordered_map<std::string, Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  uint64_t file_size() const;

 private:
  struct Mapping;
  PanelCacheFile() = default;

  std::shared_ptr<const Mapping> mapping_;
  std::unordered_map<std::string, Entry> entries_;
};

// Writes the cache file for `entries` atomically (write_file_atomically), creating `path`'s
// directory if it does not exist. E_IO on failure; an existing file is then left as it was.
void write_panel_cache(const std::string& path, const FileIdentity& checkpoint,
                       const std::string& layout, const std::vector<PanelCacheEntry>& entries);

}  // namespace tessera
