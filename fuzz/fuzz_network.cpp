// Fuzz target: the network file parser (io/network_file.h) and the resolver (layers/network.h)
// on arbitrary text, as `tessera summary NET [--shape ...]` runs them.
//
// Properties, each a bug when it fails (besides crashes, hangs and sanitizer reports):
//  - every failure is a tessera Error with a user-error code (never E_INTERNAL, never another
//    exception type);
//  - a network that resolves prints a summary, and resolves again with its open dimensions
//    bound to concrete values (all 1, then all 3), or fails with a user error.
#include <cstdint>
#include <map>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_common.h"
#include "io/network_file.h"
#include "layers/network.h"

using namespace tessera;

namespace {

constexpr const char* kTarget = "fuzz_network";

// The inputs' declared shapes with every open dimension set to `open`.
std::map<std::string, Shape> bound_shapes(const NetworkSpec& spec, int64_t open) {
  std::map<std::string, Shape> shapes;
  for (const NetworkInput& in : spec.inputs) {
    Shape s;
    for (const Dim& d : in.shape) s.push_back(d.is_fixed() ? d.value : open);
    shapes.emplace(in.name, s);
  }
  return shapes;
}

template <class Fn>
void expect_user_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::Internal) fuzz::bug(kTarget, "E_INTERNAL: " + e.message());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  expect_user_error([&] {
    const NetworkSpec spec = parse_network(text, "fuzz.json");
    const Network network = Network::resolve(spec);
    if (network.summary().empty()) fuzz::bug(kTarget, "empty summary");
    for (int64_t open : {1, 3})
      expect_user_error([&] { (void)Network::resolve(spec, bound_shapes(spec, open)).summary(); });
  });
  return 0;
}
