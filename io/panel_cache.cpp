#include "io/panel_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/error.h"
#include "io/atomic_file.h"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'P', 'A', 'N', 'E', 'L', '1'};
constexpr uint64_t kAlign = 4096;
// A header lists one entry per projection (ViT-H/14: 128, ~100 bytes each); 16 MiB is far past
// any model and keeps a corrupt length from asking for the whole file as JSON.
constexpr uint64_t kMaxHeader = 16u << 20;
constexpr int kMaxDepth = 4;  // {"entries": [{...}]} is 3 deep

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// FNV-1a, 64 bits: a stable name for a path, not a security boundary (the header's identity
// decides whether a file is used).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Nesting depth of JSON text, brackets inside strings not counted. nlohmann parses without
// recursion, but a cap keeps a hostile header from building a deep tree at all.
int json_depth(const char* p, size_t n) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

bool get_u64(const nlohmann::json& j, const char* name, uint64_t* out) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  *out = it->get<uint64_t>();
  return true;
}

bool get_i64(const nlohmann::json& j, const char* name, int64_t* out) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer()) return false;
  *out = it->get<int64_t>();
  return true;
}

}  // namespace

struct PanelCacheFile::Mapping {
  void* map = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (map) ::munmap(map, size);
  }
};

std::string PanelCacheFile::path_for(const std::string& dir, const std::string& checkpoint_path) {
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(checkpoint_path, ec);
  if (ec) canonical = std::filesystem::absolute(checkpoint_path, ec);
  if (ec) canonical = checkpoint_path;
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.tpanels",
                static_cast<unsigned long long>(fnv1a(canonical.string())));
  return (std::filesystem::path(dir) / name).string();
}

std::optional<PanelCacheFile> PanelCacheFile::open(const std::string& path,
                                                   const FileIdentity& checkpoint,
                                                   const std::string& layout, std::string* why) {
  auto miss = [&](const std::string& reason) -> std::optional<PanelCacheFile> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return miss(errno == ENOENT ? "absent" : std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return miss("not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 16) {
    ::close(fd);
    return miss("malformed: " + std::to_string(size) + " bytes, shorter than its 16-byte prefix");
  }
  // 2 MiB-aligned, advised for huge pages: where the page cache holds the file in 2 MiB folios
  // (filesystems with large folios, ext4 among them; a read-ahead into a mapping advised so
  // makes them), the MADV_POPULATE_READ below fills 44 page-table entries for the gpt recipe's
  // 88 MiB, not 22,500 (0.05-0.1 ms against 7.5-22 ms: the bulk of that model's one-thread
  // load, Zen 4 guest), and the first run's reads of the panels take no 4 KiB TLB misses.
  void* map = map_huge_page_aligned(size, PROT_READ, MAP_PRIVATE, fd);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) return miss(std::string("cannot map: ") + std::strerror(err));
  auto mapping = std::make_shared<Mapping>();
  mapping->map = map;
  mapping->size = size;
  const auto* bytes = static_cast<const char*>(map);

  if (std::memcmp(bytes, kMagic, sizeof kMagic) != 0) return miss("malformed: not a panel cache");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes + 8, 8);
  if (header_len > kMaxHeader || header_len > size - 16)
    return miss("malformed: header length " + std::to_string(header_len) + " past the file");
  const char* text = bytes + 16;
  if (json_depth(text, header_len) > kMaxDepth) return miss("malformed: header nested too deep");
  const nlohmann::json h = nlohmann::json::parse(text, text + header_len, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return miss("malformed: header is not a JSON object");
  uint64_t version = 0;
  if (!get_u64(h, "version", &version) || version != 1)
    return miss("malformed: not version 1");
  const auto lay = h.find("layout");
  if (lay == h.end() || !lay->is_string()) return miss("malformed: no layout");
  if (lay->get<std::string>() != layout) return miss("packed for another kernel layout");
  const auto ck = h.find("checkpoint");
  FileIdentity id;
  if (ck == h.end() || !ck->is_object() || !get_u64(*ck, "device", &id.device) ||
      !get_u64(*ck, "inode", &id.inode) || !get_u64(*ck, "size", &id.size) ||
      !get_i64(*ck, "mtime_ns", &id.mtime_ns))
    return miss("malformed: no checkpoint identity");
  if (!(id == checkpoint)) return miss("the checkpoint changed");

  const uint64_t data_start = align_up(16 + header_len);
  const auto list = h.find("entries");
  if (list == h.end() || !list->is_array()) return miss("malformed: no entries");
  if (data_start > size && !list->empty()) return miss("malformed: no data after the header");
  const uint64_t data_bytes = size - std::min(size, data_start);
  PanelCacheFile f;
  for (const nlohmann::json& e : *list) {
    if (!e.is_object()) return miss("malformed: an entry is not an object");
    const auto key = e.find("key");
    int64_t rows = 0, cols = 0, floats = 0;
    uint64_t offset = 0;
    if (key == e.end() || !key->is_string() || !get_i64(e, "rows", &rows) ||
        !get_i64(e, "cols", &cols) || !get_i64(e, "floats", &floats) ||
        !get_u64(e, "offset", &offset))
      return miss("malformed: an entry lacks key, rows, cols, floats or offset");
    const std::string name = key->get<std::string>();
    // Overflow-safe bounds: the length, then the offset, each against what the file holds.
    if (rows <= 0 || cols <= 0 || floats <= 0 || offset % kAlign != 0 ||
        static_cast<uint64_t>(floats) > data_bytes / sizeof(float) ||
        offset > data_bytes - static_cast<uint64_t>(floats) * sizeof(float))
      return miss("malformed: entry " + name + " lies outside the file");
    if (!f.entries_.emplace(name, Entry{rows, cols, floats, data_start + offset}).second)
      return miss("malformed: entry " + name + " twice");
  }
  // Only now that the file is known to be used: every panel is read by the first run, so the
  // page tables are filled in one call rather than fault by fault (and a stale file is never
  // read past its header). Advisory: without it the pages fault in as they are read.
  ::madvise(map, size, MADV_POPULATE_READ);
  f.mapping_ = std::move(mapping);
  return f;
}

uint64_t PanelCacheFile::file_size() const { return mapping_->size; }

Tensor PanelCacheFile::panels(const std::string& key, int64_t rows, int64_t cols,
                              int64_t floats) const {
  const auto it = entries_.find(key);
  if (it == entries_.end() || it->second.rows != rows || it->second.cols != cols ||
      it->second.floats != floats)
    return {};
  char* base = static_cast<char*>(mapping_->map);
  return Tensor::wrap(base + it->second.offset, {floats}, DType::F32, mapping_, /*read_only=*/true,
                      /*file_mapped=*/true);
}

void write_panel_cache(const std::string& path, const FileIdentity& checkpoint,
                       const std::string& layout, const std::vector<PanelCacheEntry>& entries) {
  nlohmann::json h;
  h["version"] = 1;
  h["layout"] = layout;
  h["checkpoint"] = {{"device", checkpoint.device},
                     {"inode", checkpoint.inode},
                     {"size", checkpoint.size},
                     {"mtime_ns", checkpoint.mtime_ns}};
  nlohmann::json list = nlohmann::json::array();
  uint64_t offset = 0;
  for (const PanelCacheEntry& e : entries) {
    list.push_back({{"key", e.key},
                    {"rows", e.rows},
                    {"cols", e.cols},
                    {"offset", offset},
                    {"floats", e.floats}});
    offset = align_up(offset + static_cast<uint64_t>(e.floats) * sizeof(float));
  }
  h["entries"] = std::move(list);
  const std::string text = h.dump();
  const uint64_t header_len = text.size();

  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) fail(ErrorCode::IO, path, "cannot create its directory: " + ec.message());
  }
  write_file_atomically(path, [&](int fd) {
    write_all(fd, kMagic, sizeof kMagic, path);
    write_all(fd, &header_len, sizeof header_len, path);
    write_all(fd, text.data(), text.size(), path);
    static const char kZeros[kAlign] = {};
    const uint64_t head = 16 + header_len;
    write_all(fd, kZeros, align_up(head) - head, path);
    for (const PanelCacheEntry& e : entries) {
      const uint64_t bytes = static_cast<uint64_t>(e.floats) * sizeof(float);
      write_all(fd, e.panels, bytes, path);
      write_all(fd, kZeros, align_up(bytes) - bytes, path);
    }
  });
}

}  // namespace tessera
