#!/usr/bin/python3
"""Builds the example model in PyTorch and writes what tessera runs and compares against.

A small pre-norm transformer encoder: 2 blocks of
    h = x + attention(layer_norm(x))              (4 heads, rotary embeddings)
    h = h + linear(gelu(linear(layer_norm(h))))   (64 -> 256 -> 64)
and a final layer_norm, width 64. Every module is an attribute named like its network node, so
`model.state_dict()` names are exactly the `<node>.<param>` names tessera expects
(shared/docs/interfaces.md §1), and the attention module follows the formulas of
shared/reference/attention_op_spec.txt (q_proj/k_proj/v_proj/o_proj, rotate-half rope with base
10000 and float32 angles, softmax(q k^T / sqrt(head_dim)) v).

Writes, next to this script (about 420 KB in all):
  encoder.json           the network description
  encoder.safetensors    the weights, with the network in the metadata key `tessera.network`
  input.safetensors      x [2, 16, 64] float32
  expected.safetensors   y [2, 16, 64]: PyTorch's float32 output for x

Run with Debian's torch: /usr/bin/python3 examples/encoder/make_encoder.py
Deterministic: the same files on every run (torch.manual_seed, one thread).
"""

import json
import math
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from st_format import save_file  # noqa: E402  (the hand-written safetensors writer)

WIDTH, HEADS, HIDDEN, BLOCKS = 64, 4, 256, 2
BATCH, SEQ = 2, 16


class Attention(nn.Module):
    """attention@1 with rope=True, causal=False, bias=True (shared/reference/attention_op_spec.txt)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    @staticmethod
    def rotate_half(v):
        a, b = v.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.heads
        split = lambda t: t.view(B, T, self.heads, hd).transpose(1, 2)  # [B, heads, T, hd]
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        # theta_i = 10000 ** (-2i / head_dim), angles t * theta_i, both in float32.
        i = torch.arange(hd // 2, dtype=torch.float64)
        theta = torch.pow(10000.0, -2.0 * i / hd).to(torch.float32)
        angle = torch.arange(T, dtype=torch.float32)[:, None] * theta[None, :]  # [T, hd/2]
        cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(x.dtype)
        sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(x.dtype)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        out = torch.softmax(scores, dim=-1) @ v  # [B, heads, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, D))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.nodes = []  # (name, op, args, inputs) in network order
        src = "x"
        for b in range(BLOCKS):
            p = f"b{b}_"
            self.add(p + "ln1", "layer_norm", {}, {"x": src}, nn.LayerNorm(WIDTH))
            self.add(p + "attn", "attention", {"heads": HEADS, "rope": True}, {"x": p + "ln1"},
                     Attention(WIDTH, HEADS))
            self.add(p + "res1", "add", {}, {"a": src, "b": p + "attn"})
            self.add(p + "ln2", "layer_norm", {}, {"x": p + "res1"}, nn.LayerNorm(WIDTH))
            self.add(p + "fc1", "linear", {"out_features": HIDDEN}, {"x": p + "ln2"},
                     nn.Linear(WIDTH, HIDDEN))
            self.add(p + "gelu", "gelu", {}, {"x": p + "fc1"}, nn.GELU())
            self.add(p + "fc2", "linear", {"out_features": WIDTH}, {"x": p + "gelu"},
                     nn.Linear(HIDDEN, WIDTH))
            self.add(p + "res2", "add", {}, {"a": p + "res1", "b": p + "fc2"})
            src = p + "res2"
        self.add("ln_f", "layer_norm", {}, {"x": src}, nn.LayerNorm(WIDTH))

    def add(self, name, op, args, inputs, module=None):
        if module is not None:
            setattr(self, name, module)  # state_dict names: "<name>.<param>"
        self.nodes.append((name, op, args, inputs))

    def network(self):
        return {
            "dtype": "float32",
            "inputs": {"x": ["B", "T", WIDTH]},
            "nodes": [{"name": n, "op": op, "args": a, "inputs": i} for n, op, a, i in self.nodes],
            "outputs": {"y": "ln_f"},
        }

    def forward(self, x):
        values = {"x": x}
        for name, op, _, inputs in self.nodes:
            if op == "add":
                values[name] = values[inputs["a"]] + values[inputs["b"]]
            else:
                values[name] = getattr(self, name)(values[inputs["x"]])
        return values["ln_f"]


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Encoder().eval()
    with torch.no_grad():
        # nn.LayerNorm starts at weight 1, bias 0; move them so the affine part is exercised.
        for name, module in model.named_children():
            if isinstance(module, nn.LayerNorm):
                module.weight.add_(0.1 * torch.randn(WIDTH))
                module.bias.add_(0.1 * torch.randn(WIDTH))
        x = torch.randn(BATCH, SEQ, WIDTH)
        y = model(x)

    network = model.network()
    with open(os.path.join(HERE, "encoder.json"), "w") as f:
        json.dump(network, f, indent=2)
        f.write("\n")
    save_file(model.state_dict(), os.path.join(HERE, "encoder.safetensors"),
              metadata={"format": "pt", "tessera.network": json.dumps(network)})
    save_file({"x": x}, os.path.join(HERE, "input.safetensors"))
    save_file({"y": y}, os.path.join(HERE, "expected.safetensors"))
    params = sum(p.numel() for p in model.parameters())
    print(f"encoder: {params:,} parameters; x {list(x.shape)} -> y {list(y.shape)}, "
          f"max |y| {y.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
