// What loading a large checkpoint costs through the C API (tessera_model_load, the same path as
// `tessera run`): time, resident memory and bytes read from the file, at load and at the first
// and second run.
//
// The checkpoint is generated once (default: 16 linears of 4096 x 4096 with bias, float32,
// 1.07 GB, the network in its metadata) and reused. Before loading, the file is dropped from
// the page cache (posix_fadvise DONTNEED; no root needed), so "file read" counts what loading
// really pulled in: mincore() over a mapping of the file tells which pages are resident.
// Memory is split as /proc/self/status does: RssAnon (private copies: allocations) and RssFile
// (pages of mapped files: the checkpoint's weights when they are used in place).
//
//   bench_load [--file PATH] [--layers L] [--width D] [--rows B] [--regenerate]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/tessera.h"

namespace {

struct Options {
  std::string file;
  int layers = 16;
  int width = 4096;
  int rows = 8;
  bool regenerate = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_load: %s\n", what.c_str());
  std::exit(1);
}

// Fields of /proc/self/status in kB ("VmRSS", "VmHWM", "RssAnon", "RssFile").
double status_mb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::strtod(line.c_str() + key.size(), nullptr) / 1024.0;
  return -1.0;
}

// Resets VmHWM to the current RSS (Linux >= 4.0), so each phase reports its own peak.
void reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

// Megabytes of `path` in the page cache (mincore over a fresh read-only mapping).
double cached_mb(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + path);
  struct stat st;
  fstat(fd, &st);
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) die("cannot map " + path);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  mincore(p, size, resident.data());
  size_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  munmap(p, size);
  return static_cast<double>(n * page) / 1e6;
}

void drop_from_page_cache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + path);
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// A deterministic weight in [-s, s): a 32-bit hash of the element index, no generator state,
// so the 268M values of the default file cost ~0.3 s.
inline float weight_value(uint64_t i, float s) {
  uint32_t h = static_cast<uint32_t>(i * 0x9E3779B97F4A7C15ull >> 32);
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return (static_cast<float>(h) * (1.0f / 4294967296.0f) * 2.0f - 1.0f) * s;
}

// "l3", "l3.weight". Appended piecewise: GCC 12 raises a false -Wrestrict on "l" + to_string().
std::string layer_name(int l, const char* suffix = "") {
  std::string s = "l";
  s += std::to_string(l);
  s += suffix;
  return s;
}

// Writes the checkpoint tensor by tensor through a 4 MB buffer (no 1 GB image in memory).
// Layout as the reference writer makes it: header padded with spaces to 8 bytes, tensors by
// name (all F32), the network in __metadata__["tessera.network"].
void generate(const Options& o) {
  nlohmann::ordered_json net;
  net["inputs"]["x"] = {"B", o.width};
  std::string prev = "x";
  for (int l = 0; l < o.layers; ++l) {
    const std::string name = layer_name(l);
    net["nodes"].push_back({{"name", name},
                            {"op", "linear"},
                            {"args", {{"out_features", o.width}}},
                            {"inputs", {{"x", prev}}}});
    prev = name;
  }
  net["outputs"]["y"] = prev;

  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t bytes;
  };
  std::vector<Entry> entries;
  const uint64_t D = static_cast<uint64_t>(o.width);
  for (int l = 0; l < o.layers; ++l) {
    entries.push_back({layer_name(l, ".bias"), {o.width}, D * 4});
    entries.push_back({layer_name(l, ".weight"), {o.width, o.width}, D * D * 4});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"tessera.network", net.dump()}};
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    header[e.name] = {
        {"dtype", "F32"}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';

  const std::string tmp = o.file + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) die("cannot create " + tmp);
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  std::fwrite(len, 1, 8, f);
  std::fwrite(text.data(), 1, text.size(), f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(o.width));  // keeps activations O(1)
  std::vector<float> chunk(1 << 20);
  uint64_t index = 0;
  for (const Entry& e : entries) {
    for (uint64_t left = e.bytes / 4; left > 0;) {
      const size_t m = static_cast<size_t>(std::min<uint64_t>(left, chunk.size()));
      for (size_t i = 0; i < m; ++i) chunk[i] = weight_value(index++, scale);
      if (std::fwrite(chunk.data(), 4, m, f) != m) die("cannot write " + tmp);
      left -= m;
    }
  }
  if (std::fflush(f) != 0 || fdatasync(fileno(f)) != 0 || std::fclose(f) != 0)
    die("cannot write " + tmp);
  if (std::rename(tmp.c_str(), o.file.c_str()) != 0) die("cannot rename to " + o.file);
}

struct Phase {
  const char* name;
  double ms, rss, anon, file, peak, cached;
};

Phase measure(const char* name, double ms, const std::string& path) {
  return {name,
          ms,
          status_mb("VmRSS"),
          status_mb("RssAnon"),
          status_mb("RssFile"),
          status_mb("VmHWM"),
          cached_mb(path)};
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void check(tessera_code code, tessera_error* error, const char* what) {
  if (code == TESSERA_OK) return;
  die(std::string(what) + ": " + tessera_error_message(error));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--file")
      o.file = value();
    else if (a == "--layers")
      o.layers = std::atoi(value().c_str());
    else if (a == "--width")
      o.width = std::atoi(value().c_str());
    else if (a == "--rows")
      o.rows = std::atoi(value().c_str());
    else if (a == "--regenerate")
      o.regenerate = true;
    else
      die("usage: bench_load [--file PATH] [--layers L] [--width D] [--rows B] [--regenerate]");
  }
  if (o.layers < 1 || o.width < 1 || o.rows < 1) die("--layers, --width, --rows must be >= 1");
  if (o.file.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    o.file = std::string(tmp ? tmp : "/tmp") + "/tessera_bench_load_" + std::to_string(o.layers) +
             "x" + std::to_string(o.width) + ".safetensors";
  }
  const uint64_t D = static_cast<uint64_t>(o.width);
  const uint64_t weight_bytes = static_cast<uint64_t>(o.layers) * (D * D + D) * 4;
  struct stat st;
  if (o.regenerate || stat(o.file.c_str(), &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < weight_bytes) {
    std::printf("generating %s (%.2f GB of weights)...\n", o.file.c_str(), weight_bytes / 1e9);
    const auto t0 = std::chrono::steady_clock::now();
    generate(o);
    std::printf("generated in %.1f s\n", ms_since(t0) / 1e3);
  }
  stat(o.file.c_str(), &st);
  drop_from_page_cache(o.file);

  std::vector<Phase> phases;
  reset_peak();
  phases.push_back(measure("before load", 0.0, o.file));

  tessera_error* error = nullptr;
  tessera_model* model = nullptr;
  reset_peak();
  auto t0 = std::chrono::steady_clock::now();
  check(tessera_model_load(o.file.c_str(), nullptr, 0, &model, &error), error, "load");
  phases.push_back(measure("load", ms_since(t0), o.file));

  std::vector<float> x(static_cast<size_t>(o.rows) * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = weight_value(i + (uint64_t{1} << 40), 1.0f);
  const int64_t shape[] = {o.rows, o.width};
  tessera_tensor* in = nullptr;
  check(tessera_tensor_wrap(x.data(), TESSERA_F32, shape, 2, &in, &error), error, "wrap");
  double checksum = 0.0;
  for (const char* name : {"first run", "second run"}) {
    tessera_tensor* y = nullptr;
    const tessera_tensor* inputs[] = {in};
    reset_peak();
    t0 = std::chrono::steady_clock::now();
    check(tessera_model_run(model, inputs, 1, &y, 1, &error), error, "run");
    phases.push_back(measure(name, ms_since(t0), o.file));
    const float* v = static_cast<const float*>(tessera_tensor_data(y));
    checksum = 0.0;
    for (int64_t i = 0; i < tessera_tensor_numel(y); ++i) checksum += v[i];
    tessera_tensor_free(y);
  }
  tessera_tensor_free(in);
  tessera_model_free(model);

  std::printf(
      "checkpoint: %s, %.3f GB (%d linears %dx%d + bias, F32), run on [%d, %d], "
      "%d threads\n",
      o.file.c_str(), static_cast<double>(st.st_size) / 1e9, o.layers, o.width, o.width, o.rows,
      o.width, tessera_num_threads());
  std::printf("%-12s %10s %10s %10s %10s %10s %12s\n", "phase", "time ms", "RSS MB", "anon MB",
              "file MB", "peak MB", "file read MB");
  for (const Phase& p : phases)
    std::printf("%-12s %10.1f %10.1f %10.1f %10.1f %10.1f %12.1f\n", p.name, p.ms, p.rss, p.anon,
                p.file, p.peak, p.cached);
  std::printf(
      "(peak: VmHWM within the phase; file read: the checkpoint's pages in the page cache "
      "after the phase)\noutput checksum %.6g\n",
      checksum);
  return 0;
}
