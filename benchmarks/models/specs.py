"""The PyTorch side of benchmarks/models/catalog.py: each model as the module PyTorch itself
defines (torchvision 0.14 / torch 1.13 / tests/fixtures/gpt_reference.py), wrapped only so that
forward takes the recipe's inputs positionally and returns its one output.

  module(name)          the bare module (torchvision / torch / GPT), default initialisation
  wrapped(name, m)      nn.Module whose forward(*inputs) is the recipe's contract; for
                        `transformer` it builds the causal tgt_mask inside forward (so the ONNX
                        export carries it too). state_dict names of the bare module are kept
                        in the bare module: save m.state_dict(), not the wrapper's
  randomize(m, gen)     every parameter drawn (as tests/fixtures/gen_model_fixtures.py does)
  make_inputs(name, g)  the fixed inputs, name -> tensor
"""
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from catalog import MODELS  # noqa: E402


def gpt_class():
    """GPT of tests/fixtures/gpt_reference.py (the verbatim copy of the shared reference)."""
    path = os.path.join(REPO, "tests", "fixtures", "gpt_reference.py")
    namespace = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace["GPT"]


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


def randomize(model, gen):
    """Every parameter drawn (torchvision zero-initialises heads and class token: left so, a
    graph that dropped them would still verify): matrices N(0, 1/fan_in), 1-D weights
    (LayerNorm scales) 1 + N(0, 0.2^2), biases N(0, 0.2^2), ViT's class token and position
    embedding N(0, 0.5^2). Same rule as tests/fixtures/gen_model_fixtures.py."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("class_token", "encoder.pos_embedding"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def make_inputs(name, gen):
    out = {}
    for k, spec in MODELS[name]["inputs"].items():
        if spec["dtype"] == "I64":
            out[k] = torch.randint(0, spec["high"], spec["shape"], generator=gen, dtype=torch.int64)
        else:
            out[k] = torch.randn(spec["shape"], generator=gen)
    return out
