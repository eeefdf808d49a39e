// Writing a file so that nothing already on disk is damaged: the bytes go to a new temporary
// file beside the target (O_EXCL, never someone else's), are synced, and the temporary is renamed
// over the target; on any failure it is removed and the target is untouched. Serves the
// safetensors writer and `tessera recipe --output`.
#pragma once

#include <cstddef>
#include <string>

#include "core/function_ref.h"

namespace tessera {

// Writes all of [data, data + n) to `fd`, retrying short writes and EINTR (E_IO at `where`).
void write_all(int fd, const void* data, size_t n, const std::string& where);

// Creates the temporary file, calls `write_body(fd)` (which writes with write_all and may throw),
// then syncs, closes and renames it over `path`, and syncs the directory (best effort). E_IO
// (where = path) when any step fails.
void write_file_atomically(const std::string& path, FunctionRef<void(int fd)> write_body);

}  // namespace tessera
