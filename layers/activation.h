// An activation a projection applies to its own outputs instead of a separate elementwise node
// reading them back (Plan fuses `linear` -> relu / gelu where the linear's output has no other
// reader). The fused form calls the same kernels on the same floats, so it gives the same bits.
#pragma once

namespace tessera {

enum class Activation { none, relu, gelu, gelu_tanh };

inline const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::none: break;
  }
  return "none";
}

}  // namespace tessera
