#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace tessera {

namespace {
std::atomic<uint64_t> g_temp_counter{0};
}  // namespace

void write_all(int fd, const void* data, size_t n, const std::string& where) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    // Linux transfers at most 0x7ffff000 bytes per write(2).
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::IO, where, std::string("cannot write: ") + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void write_file_atomically(const std::string& path, FunctionRef<void(int fd)> write_body) {
  std::string tmp = path;
  tmp += ".tmp.";
  tmp += std::to_string(::getpid());
  tmp += '.';
  tmp += std::to_string(g_temp_counter.fetch_add(1));
  // O_EXCL: never adopt (or clobber) someone else's file of that name.
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0)
    fail(ErrorCode::IO, path, "cannot create " + tmp + ": " + std::strerror(errno));
  try {
    write_body(fd);
    if (::fsync(fd) != 0)
      fail(ErrorCode::IO, path, std::string("cannot sync: ") + std::strerror(errno));
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail(ErrorCode::IO, path, std::string("cannot close: ") + std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail(ErrorCode::IO, path, "cannot rename " + tmp + " over it: " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable. Best effort: the data is already in place, and some
  // filesystems refuse fsync on a directory.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tessera
