// Network files for real PyTorch models (shared/docs/interfaces.md §5): `tessera recipe ARCH`.
//
// A recipe is the model's forward written as a network of tessera ops, its node names the
// model's module paths, so that save_file(model.state_dict()) of the PyTorch model loads as is.
// Each one mirrors the PyTorch code it names (torchvision 0.14's VisionTransformer,
// torch.nn.Transformer of torch 1.13, shared/reference/gpt_reference.py) and takes the
// constructor's keyword arguments by their PyTorch names, with PyTorch's defaults.
//
// This floor writes JSON only: it knows op names and arguments, not how ops run; the resolver
// (layers/network.h) checks what it writes like any other network file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// One `--set NAME=VALUE`: the value already parsed as JSON.
using RecipeSetting = std::pair<std::string, nlohmann::ordered_json>;

// The architectures, in the order of interfaces.md §5.
const std::vector<std::string>& recipe_names();

// The network file of `arch` built with `settings`. E_ARG for an unknown arch, an unknown or
// duplicate name, a value of the wrong JSON type, or an argument that takes a Python callable or
// class; E_CONSTRAINT for a value PyTorch's constructor refuses (an assertion or ValueError).
nlohmann::ordered_json make_recipe(const std::string& arch,
                                   const std::vector<RecipeSetting>& settings);

// The network file's text as `tessera recipe` writes it: one line per input, node and output, so
// a diff of two recipes reads node by node.
std::string recipe_text(const nlohmann::ordered_json& network);

}  // namespace tessera
