// Network files (shared/docs/interfaces.md §2): the JSON description of a network, read from a
// file or from a checkpoint's `tessera.network` metadata, checked for structure only. What the
// ops make of their arguments, ports and shapes is the resolver's business (layers/network.h):
// this floor knows no op.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "io/safetensors.h"

namespace tessera {

struct NetworkInput {
  std::string name;
  SymShape shape;
  DType dtype = DType::F32;  // the plan dtype unless the file says otherwise
};

struct NetworkNode {
  std::string name;
  std::string op;               // without the identity's version ("attention@1" -> "attention")
  nlohmann::ordered_json args;  // an object, as written
  std::vector<std::pair<std::string, std::string>> inputs;  // port -> source, in file order
};

struct NetworkSpec {
  DType dtype = DType::F32;  // the plan compute dtype
  std::vector<NetworkInput> inputs;
  std::vector<NetworkNode> nodes;
  std::vector<std::pair<std::string, std::string>> outputs;  // output name -> source
  std::string origin;  // the file (or "file (tessera.network)") it came from, for messages
};

// A JSON value's type as a user reads it in an error message: "an integer", "a number",
// "string", "boolean", "array", "object", "null".
const char* json_type(const nlohmann::ordered_json& j);

// The metadata key a checkpoint stores its network under.
inline constexpr const char* kNetworkMetadataKey = "tessera.network";

// Parses network JSON text. `origin` names its file in messages. E_FORMAT (where = origin) for
// text that is not JSON or nests deeper than kMaxJsonDepth (128) levels; E_ARG for a wrong
// structure or an unknown key; E_SHAPE for a negative dimension or a rank over kMaxRank (64);
// E_DTYPE for a dtype name tessera does not know.
NetworkSpec parse_network(const std::string& json_text, const std::string& origin);
NetworkSpec parse_network(const nlohmann::ordered_json& json, const std::string& origin);

// The network of a checkpoint: its `tessera.network` metadata (E_ARG when absent).
NetworkSpec network_from_checkpoint(const SafetensorsFile& file);

// True when `path` names a safetensors checkpoint rather than JSON text: a ".safetensors" name,
// or a NUL among the first 8 bytes (the high bytes of the little-endian header length are zero
// for every header under 2^56 bytes, and JSON text never contains a NUL). E_IO when unreadable.
bool is_safetensors_path(const std::string& path);

// A network file: JSON text, or a checkpoint carrying `tessera.network` (then `checkpoint`, when
// not null, receives the opened file so its tensors can serve as weights; it is reset for JSON).
// E_IO, E_FORMAT, E_ARG.
NetworkSpec load_network(const std::string& path,
                         std::optional<SafetensorsFile>* checkpoint = nullptr);

}  // namespace tessera
