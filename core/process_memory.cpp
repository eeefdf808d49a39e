#include "core/process_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace tessera {

double process_status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key, 0) == 0) return 1024.0 * std::strtod(line.c_str() + key.size(), nullptr);
  return -1.0;
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5" << std::flush;
  return clear.is_open() && !clear.fail();
}

}  // namespace tessera
