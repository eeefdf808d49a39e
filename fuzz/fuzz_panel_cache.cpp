// Fuzz target: the panel cache reader (io/panel_cache.h) on arbitrary bytes, written to a file
// in /tmp (the reader maps files), checked against a fixed checkpoint identity and layout that
// the seed corpus carries (fuzz/corpus/panel_cache/).
//
// Properties, each a bug when it fails (besides crashes, hangs and sanitizer reports):
//  - open() never throws: a file is used or refused with a reason;
//  - every entry of a used file lies inside it, 4096-aligned, and every byte of its panels is
//    readable through panels();
//  - write_panel_cache() of a used file's entries reads back to the same entries and bytes (the
//    writer and the reader agree on every accepted file).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz/fuzz_common.h"
#include "io/panel_cache.h"

using namespace tessera;

namespace {

constexpr const char* kTarget = "fuzz_panel_cache";
const FileIdentity kCheckpoint{1, 2, 3, 4};
const std::string kLayout = "fuzz layout";

std::string temp_path(const char* what) {
  return "/tmp/tessera_fuzz_panel_cache_" + std::to_string(::getpid()) + "_" + what;
}

std::optional<PanelCacheFile> open_checked(const std::string& path) {
  std::string why;
  std::optional<PanelCacheFile> f;
  try {
    f = PanelCacheFile::open(path, kCheckpoint, kLayout, &why);
  } catch (const std::exception& e) {
    fuzz::bug(kTarget, std::string("open() threw: ") + e.what());
  }
  if (!f && why.empty()) fuzz::bug(kTarget, "refused without a reason");
  return f;
}

// key -> (rows, cols, the panels' bytes), reading every byte through panels().
std::map<std::string, std::pair<std::pair<int64_t, int64_t>, std::vector<uint8_t>>> contents(
    const PanelCacheFile& f) {
  std::map<std::string, std::pair<std::pair<int64_t, int64_t>, std::vector<uint8_t>>> out;
  for (const auto& [key, e] : f.entries()) {
    if (e.offset % 4096 != 0 || e.floats <= 0 ||
        e.offset + static_cast<uint64_t>(e.floats) * sizeof(float) > f.file_size())
      fuzz::bug(kTarget, "entry " + key + " accepted outside the file");
    const Tensor t = f.panels(key, e.rows, e.cols, e.floats);
    if (!t.defined() || t.numel() != e.floats) fuzz::bug(kTarget, "panels() lost entry " + key);
    const auto* b = static_cast<const uint8_t*>(t.raw_data());
    out[key] = {{e.rows, e.cols}, std::vector<uint8_t>(b, b + t.nbytes())};
    if (f.panels(key, e.rows + 1, e.cols, e.floats).defined())
      fuzz::bug(kTarget, "panels() ignored the shape of " + key);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = temp_path("in"), again = temp_path("again");
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size > 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    fuzz::bug(kTarget, "cannot write " + path);
  }
  const std::optional<PanelCacheFile> file = open_checked(path);
  ::unlink(path.c_str());
  if (!file) return 0;
  const auto read = contents(*file);

  std::vector<PanelCacheEntry> entries;
  for (const auto& [key, e] : file->entries())
    entries.push_back(
        {key, e.rows, e.cols, file->panels(key, e.rows, e.cols, e.floats).data<float>(), e.floats});
  try {
    write_panel_cache(again, kCheckpoint, kLayout, entries);
  } catch (const Error& e) {
    fuzz::bug(kTarget, "cannot write back an accepted file: " + e.message());
  }
  const std::optional<PanelCacheFile> back = open_checked(again);
  ::unlink(again.c_str());
  if (!back) fuzz::bug(kTarget, "an accepted file, written back, is refused");
  if (contents(*back) != read) fuzz::bug(kTarget, "written back, the entries differ");
  return 0;
}
