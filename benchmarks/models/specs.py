"""The PyTorch side of benchmarks/models/catalog.py: each model as the module PyTorch itself
defines (torchvision 0.14 / torch 1.13 / tests/fixtures/gpt_reference.py), wrapped only so that
forward takes the recipe's inputs positionally and returns its one output.

  module(name)          the bare module (torchvision / torch / GPT), default initialisation
  wrapped(name, m)      nn.Module whose forward(*inputs) is the recipe's contract; for
                        `transformer` it builds the causal tgt_mask inside forward (so the ONNX
                        export carries it too). state_dict names of the bare module are kept
                        in the bare module: save m.state_dict(), not the wrapper's
  randomize(m, gen)     every parameter drawn (tests/fixtures/gen_model_fixtures.py's, imported)
  make_inputs(name, g)  the fixed inputs, name -> tensor
"""
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))
from catalog import MODELS  # noqa: E402
# The test fixtures' GPT loader and parameter draw: one rule for fixtures and benchmarks.
from gen_model_fixtures import gpt_class, randomize  # noqa: E402,F401


def module(name):
    m = MODELS[name]
    arch, sets = m["arch"], m["sets"]
    if arch == "gpt":
        return gpt_class()(**sets)
    if arch == "transformer":
        return nn.Transformer(batch_first=True, **sets)
    import torchvision
    return getattr(torchvision.models, arch)(**sets)


class Plain(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *xs):
        return self.m(*xs)


class CausalTransformer(nn.Module):
    """model(src, tgt, tgt_mask=causal), causal = generate_square_subsequent_mask(T), as
    interfaces.md section 5 states the `transformer` recipe's contract."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.m(src, tgt, tgt_mask=mask)


def wrapped(name, m):
    return CausalTransformer(m) if MODELS[name]["arch"] == "transformer" else Plain(m)


def make_inputs(name, gen):
    out = {}
    for k, spec in MODELS[name]["inputs"].items():
        if spec["dtype"] == "I64":
            out[k] = torch.randint(0, spec["high"], spec["shape"], generator=gen, dtype=torch.int64)
        else:
            out[k] = torch.randn(spec["shape"], generator=gen)
    return out
