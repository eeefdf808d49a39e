// Fuzz target: the safetensors reader (io/safetensors.h) on arbitrary bytes.
//
// Properties, each a bug when it fails (besides crashes, hangs and sanitizer reports):
//  - a file is either read or refused with E_FORMAT, nothing else;
//  - every tensor of a file that was read and that tessera computes with loads, and every byte
//    of it is readable; one it does not compute with is refused with E_DTYPE or E_SHAPE;
//  - the tensors and metadata written back by serialize_safetensors read again to the same
//    names, dtypes, shapes and bytes (the writer and the reader agree on every accepted file).
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz/fuzz_common.h"
#include "io/safetensors.h"

using namespace tessera;

namespace {

constexpr const char* kTarget = "fuzz_safetensors";

std::vector<uint8_t> bytes_of(const Tensor& t) {
  if (t.nbytes() == 0) return {};
  const auto* p = static_cast<const uint8_t*>(t.contiguous().raw_data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<SafetensorsFile> file;
  try {
    file.emplace(
        SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.safetensors"));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Format)
      fuzz::bug(kTarget, "refused, but not E_FORMAT: " + e.message());
    return 0;
  }

  std::map<std::string, Tensor> tensors;
  for (const std::string& name : file->names()) {
    const SafetensorsTensorInfo& info = file->info(name);
    if (!info.computable()) {
      try {
        (void)file->tensor(name);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::DType && e.code() != ErrorCode::Shape)
          fuzz::bug(kTarget, "a tensor tessera cannot compute with gave " + e.message());
        continue;
      }
      fuzz::bug(kTarget, "tensor() returned " + name + ", which computable() refuses");
    }
    // Any exception here escapes to libFuzzer, which reports it as a crash.
    const Tensor t = file->tensor(name);
    if (static_cast<uint64_t>(t.nbytes()) != info.nbytes())
      fuzz::bug(kTarget, name + ": the tensor has " + std::to_string(t.nbytes()) +
                             " bytes, the header says " + std::to_string(info.nbytes()));
    // Read every byte (ASan checks each access against the buffer it belongs to).
    volatile uint8_t sink = 0;
    for (uint8_t b : bytes_of(t)) sink = sink ^ b;
    (void)sink;
    tensors.emplace(name, t);
  }

  const std::vector<uint8_t> written = serialize_safetensors(tensors, file->metadata());
  const SafetensorsFile again = SafetensorsFile::from_bytes(written, "rewritten.safetensors");
  if (again.size() != tensors.size() || again.metadata() != file->metadata())
    fuzz::bug(kTarget, "the rewritten file lost tensors or metadata");
  for (const auto& [name, t] : tensors) {
    const Tensor u = again.tensor(name);
    if (u.dtype() != t.dtype() || u.shape() != t.shape() || bytes_of(u) != bytes_of(t))
      fuzz::bug(kTarget, "tensor " + name + " changed in the round trip");
  }
  return 0;
}
