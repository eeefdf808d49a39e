#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus: fuzz/corpus/{safetensors,network,run,panel_cache}/.

Standard library only; deterministic (fixed seeds), so rerunning it reproduces the committed
files byte for byte. Seeds are small valid inputs that reach every feature the targets check:
libFuzzer mutates from them, and a seed that is already refused teaches it little.

  safetensors/  every reference dtype (sub-byte F4 and F6 included), scalars, zero-size tensors
                (also with huge dims), metadata-only and empty files, whitespace padding around
                the header, unaligned offsets, the array and dtype-object entry forms, extra keys
  network/      the spec's five examples, the encoder, and one small network per op and option
  run/          fuzz_run's layout (fuzz/fuzz_run.cpp): flags, NET, W, IN; networks with random
                initialisation, with weights, and a checkpoint carrying its network
  panel_cache/  panel cache files (io/panel_cache.h) with entries, none, one ending the file, and
                refused ones: another checkpoint identity or layout, an offset past the end, cut short

Usage: /usr/bin/python3 fuzz/make_corpus.py   (from anywhere; writes next to this file)
"""

import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")

# The reference's dtypes (safetensors/src/tensor.rs) and their widths in bits.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}

rng = random.Random(20240601)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def randn_f32(shape, scale=1.0):
    return f32_bytes([rng.gauss(0.0, scale) for _ in range(numel(shape))])


def safetensors(entries, metadata=None, before="", after=None, align=True):
    """entries: (name, dtype, shape, raw bytes) in data order. The header is compact JSON with
    `before` prepended and, when `align`, spaces appended to a multiple of 8 (as writers pad);
    `after` replaces that padding."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = before + json.dumps(header, separators=(",", ":"))
    if after is not None:
        text += after
    elif align:
        text += " " * ((8 - (8 + len(text)) % 8) % 8)
    h = text.encode()
    return struct.pack("<Q", len(h)) + h + b"".join(raw for _, _, _, raw in entries)


def raw_file(header_text, data=b""):
    h = header_text.encode()
    return struct.pack("<Q", len(h)) + h + data


def write(sub, name, data):
    d = os.path.join(CORPUS, sub)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ------------------------------------------------------------------------------ safetensors


def safetensors_seeds():
    every = []
    for dtype, bits in DTYPE_BITS.items():
        # 2 elements of 4 bits, 4 of 6 bits, 3 of anything else: whole bytes every time.
        n = {4: 2, 6: 4}.get(bits, 3)
        raw = bytes(rng.randrange(256) for _ in range(n * bits // 8))
        every.append((dtype.lower(), dtype, [n], raw))
    every.sort(key=lambda e: -DTYPE_BITS[e[1]])  # alignment descending, as the writer lays out
    write("safetensors", "every_dtype", safetensors(every, {"format": "pt"}))

    write("safetensors", "scalars", safetensors([
        ("f64", "F64", [], struct.pack("<d", 3.25)),
        ("f32", "F32", [], f32_bytes([-1.5])),
        ("bf16", "BF16", [], b"\x80\x3f"),
        ("mask", "BOOL", [], b"\x01"),
    ]))
    write("safetensors", "zero_size", safetensors([
        ("a", "F32", [0], b""),
        ("b", "F16", [2, 0, 3], b""),
        ("huge", "I64", [0, 4611686018427387904], b""),
        ("c", "F32", [2], f32_bytes([1.0, 2.0])),
        ("d", "BOOL", [0, 5], b""),
    ]))
    write("safetensors", "metadata_only",
          safetensors([], {"format": "pt", "tessera.network": "{}", "note": "no tensors"}))
    write("safetensors", "empty", raw_file("{}      "))
    write("safetensors", "null_metadata", raw_file(
        '{"__metadata__":null,"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        f32_bytes([0.5])))
    write("safetensors", "whitespace", safetensors(
        [("w", "F32", [2, 2], randn_f32([2, 2]))], {"format": "pt"},
        before=" \t\r\n", after="\n\t  \r\n   "))
    # A header of odd length puts the F32 tensor at an unaligned file offset: copied on load.
    write("safetensors", "unaligned", safetensors(
        [("x", "F32", [3], randn_f32([3])), ("y", "F16", [1], b"\x00\x3c")], align=False,
        after=" "))
    write("safetensors", "entry_forms", raw_file(
        '{"seq":["F32",[2],[0,8]],"obj":{"dtype":{"I32":null},"shape":[1],'
        '"data_offsets":[8,12],"extra":{"ignored":[1,2,3]}}}',
        f32_bytes([1.0, 2.0]) + struct.pack("<i", -7)))
    write("safetensors", "shared_empty_offsets", raw_file(
        '{"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
        '"e2":{"dtype":"U8","shape":[0,0],"data_offsets":[0,0]},'
        '"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"\x01\x02"))
    write("safetensors", "many_dims", safetensors([("x", "U8", [1] * 70, b"\x05")]))
    write("safetensors", "duplicate_metadata_keys", raw_file(
        '{"__metadata__":{"k":"1","k":"2"},"t":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}',
        b"\xff"))


# ------------------------------------------------------------------------------ networks


def net(inputs, nodes, outputs, dtype=None):
    n = {}
    if dtype:
        n["dtype"] = dtype
    n["inputs"] = inputs
    n["nodes"] = [{"name": a, "op": b, "args": c, "inputs": d} for a, b, c, d in nodes]
    n["outputs"] = outputs
    return n


# Small networks with every op, port and option; fixed shapes where fuzz_run needs them.
SMALL = {
    "linear": net({"x": [2, 3, 8]}, [("n0", "linear", {"out_features": 4}, {"x": "x"})],
                  {"y": "n0"}),
    "linear_no_bias": net({"x": ["B", 8]},
                          [("n0", "linear", {"out_features": 8, "bias": False}, {"x": "x"})],
                          {"y": "n0"}),
    "norm_gelu_add": net({"x": [2, 4, 8]}, [
        ("ln", "layer_norm", {"eps": 1e-6}, {"x": "x"}),
        ("g", "gelu", {"approximate": "tanh"}, {"x": "ln"}),
        ("ln2", "layer_norm", {"elementwise_affine": False}, {"x": "g"}),
        ("g2", "gelu", {}, {"x": "ln2"}),
        ("s", "add", {}, {"a": "g2", "b": "x"}),
    ], {"y": "s"}),
    "broadcast_add": net({"a": [2, 1, 8], "b": {"shape": [3, 1], "dtype": "float32"}},
                         [("s", "add", {}, {"a": "a", "b": "b"})], {"y": "s"}),
    "chunk_concat": net({"x": [2, 6, 4]}, [
        ("c", "chunk", {"chunks": 3, "dim": 1}, {"x": "x"}),
        ("j", "concat", {"dim": -1}, {"x0": "c.out2", "x1": "c", "x2": "c.out1"}),
    ], {"y": "j", "first": "c.out0"}),
    "attention_rope_causal": net({"x": [2, 4, 8]}, [
        ("a", "attention@1", {"heads": 2, "rope": True, "causal": True}, {"x": "x"}),
    ], {"y": "a"}),
    "attention_relpos": net({"x": [1, 6, 8]}, [
        ("a", "attention", {"heads": 2, "relative_position_bias": True, "spatial_shape": [2, 3],
                            "qkv_bias": False, "init": {"relative_position_bias_table": 0.02},
                            "trainable": {"q_proj.weight": False}}, {"x": "x"}),
    ], {"y": "a"}),
    "mha_masks": net({"q": [3, 2, 8], "k": [5, 2, 8],
                      "pad": {"shape": [2, 5], "dtype": "bool"},
                      "am": {"shape": [3, 5], "dtype": "float32"}}, [
        ("m", "multihead_attention",
         {"embed_dim": 8, "num_heads": 2, "add_bias_kv": True, "add_zero_attn": True,
          "average_attn_weights": False},
         {"query": "q", "key": "k", "value": "k", "key_padding_mask": "pad", "attn_mask": "am"}),
    ], {"y": "m", "w": "m.weights"}),
    "mha_batch_first_kdim": net({"q": [2, 3, 8], "k": [2, 4, 6], "v": [2, 4, 5]}, [
        ("m", "multihead_attention",
         {"embed_dim": 8, "num_heads": 4, "kdim": 6, "vdim": 5, "batch_first": True,
          "need_weights": False, "is_causal": True, "bias": False},
         {"query": "q", "key": "k", "value": "v"}),
    ], {"y": "m"}),
    "mha_self_unbatched": net({"x": [4, 8]}, [
        ("m", "multihead_attention", {"embed_dim": 8, "num_heads": 2}, {"query": "x"}),
    ], {"y": "m", "w": "m.weights"}),
    "symbolic": net({"x": ["B", "T", 8], "z": ["B", "T", 8]}, [
        ("s", "add", {}, {"a": "x", "b": "z"}),
        ("a", "attention", {"heads": 4}, {"x": "s"}),
        ("c", "concat", {"dim": 1}, {"x0": "a", "x1": "s"}),
    ], {"y": "c"}, dtype="float32"),
    # The layout ops: Swin's window shuffle (pad, roll, window partition) and patch merging,
    # ViT's token handling on an open batch.
    "layout_window": net({"x": [1, 6, 6, 4]}, [
        ("p", "pad", {"pad": [0, 0, 0, 2, 0, 2], "value": 0.5}, {"x": "x"}),
        ("r", "roll", {"shifts": [-1, -1], "dims": [1, 2]}, {"x": "p"}),
        ("v", "reshape", {"shape": [1, 2, 4, 2, 4, 4]}, {"x": "r"}),
        ("w", "permute", {"dims": [0, 1, 3, 2, 4, 5]}, {"x": "v"}),
        ("f", "reshape", {"shape": [-1, 16, 4]}, {"x": "w"}),
        ("s", "slice", {"dim": 1, "start": -10, "stop": None, "step": 3}, {"x": "f"}),
        ("b", "roll", {"shifts": 5}, {"x": "s"}),
    ], {"y": "b", "windows": "f"}),
    "layout_merge": net({"x": [2, 4, 4, 3]}, [
        ("a", "slice", {"dim": [1, 2], "start": [0, 0], "step": 2}, {"x": "x"}),
        ("b", "slice", {"dim": [-3, -2], "start": [1, 0], "step": [2, 2]}, {"x": "x"}),
        ("c", "slice", {"dim": [1, 2], "start": [0, 1], "stop": [None, 4], "step": 2},
         {"x": "x"}),
        ("j", "concat", {"dim": -1}, {"x0": "a", "x1": "b", "x2": "c"}),
        ("f", "flatten", {"start_dim": 1, "end_dim": 2}, {"x": "j"}),
    ], {"y": "f"}),
    "layout_tokens": net({"x": ["B", 4, 9]}, [
        ("t", "transpose", {"dim0": 1, "dim1": -1}, {"x": "x"}),
        ("c", "select", {"dim": 1, "index": 0}, {"x": "t"}),
        ("u", "unsqueeze", {"dim": 1}, {"x": "c"}),
        ("e", "expand", {"sizes": [-1, 3, -1]}, {"x": "u"}),
        ("f", "flatten", {"start_dim": 1}, {"x": "e"}),
        ("q", "squeeze", {"dim": [1]}, {"x": "u"}),
        ("r", "reshape", {"shape": [-1, 2, 6]}, {"x": "f"}),
        ("g", "expand", {"sizes": [2, -1, -1, -1]}, {"x": "r"}),
    ], {"y": "g", "cls": "q"}),
    "conv_patch_mean": net({"x": [2, 3, 16, 16]}, [
        ("p", "conv2d", {"in_channels": 3, "out_channels": 8, "kernel_size": 4, "stride": 4},
         {"x": "x"}),
        ("c", "conv2d", {"in_channels": 8, "out_channels": 8, "kernel_size": [3, 2],
                         "padding": "same", "dilation": [1, 2], "groups": 4, "bias": False},
         {"x": "p"}),
        ("m", "mean", {"dim": [-1, -2]}, {"x": "c"}),
    ], {"y": "m"}),
    "conv_strided_pool": net({"x": [3, 9, 11]}, [
        ("c", "conv2d", {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "stride": [2, 1],
                         "padding": [1, 0], "padding_mode": "zeros"}, {"x": "x"}),
        ("a", "adaptive_avg_pool2d", {"output_size": [2, None]}, {"x": "c"}),
        ("m", "mean", {"dim": 0, "keepdim": True}, {"x": "a"}),
    ], {"y": "m", "pooled": "a"}),
    "relu": net({"x": [3, 17]}, [
        ("r", "relu", {}, {"x": "x"}),
        ("l", "linear", {"out_features": 9}, {"x": "r"}),
        ("r2", "relu", {}, {"x": "l"}),
    ], {"y": "r2"}),
    "math_ops": net({"x": [2, 3, 9], "w": [9, 5], "z": [5]}, [
        ("m", "matmul", {}, {"a": "x", "b": "w"}),
        ("s", "softmax", {"dim": -1}, {"x": "m"}),
        ("s0", "softmax", {"dim": 0}, {"x": "m"}),
        ("a", "silu", {}, {"x": "s"}),
        ("t", "tanh", {}, {"x": "s0"}),
        ("g", "sigmoid", {}, {"x": "m"}),
        ("u", "mul", {}, {"a": "a", "b": "t"}),
        ("v", "sub", {"alpha": 1}, {"a": "u", "b": "g"}),
        ("q", "div", {}, {"a": "v", "b": "z"}),
        ("d", "dropout", {"p": 0.1, "inplace": False, "training": False}, {"x": "q"}),
    ], {"y": "d"}),
    # A GPT in miniature: ids, token and position embeddings, a learned tensor, module-path
    # node names, the tied head reading tok.weight.
    "gpt_parts": net({"ids": {"shape": [2, 3], "dtype": "int64"}}, [
        ("tok", "embedding", {"num_embeddings": 5, "embedding_dim": 8}, {"x": "ids"}),
        ("positions", "arange", {"dim": 1}, {"like": "ids"}),
        ("pos", "embedding", {"num_embeddings": 4, "embedding_dim": 8}, {"x": "positions"}),
        ("blocks.0.scale", "parameter", {"shape": [1, 1, 8], "std": 0.5}, {}),
        ("blocks.0.sum", "add", {}, {"a": "tok", "b": "pos"}),
        ("blocks.0.scaled", "mul", {}, {"a": "blocks.0.sum", "b": "blocks.0.scale"}),
        ("logits", "linear", {"out_features": 5, "bias": False},
         {"x": "blocks.0.scaled", "weight": "tok.weight"}),
    ], {"logits": "logits"}),
    # Swin's (shifted) window attention: padded 5x7 map, 4x4 windows, then a non-square window
    # with the H shift dropped (window covers the padded height); module-path node names.
    # Swin's patch merging on an odd, open map: pad to even, four phases, norm, reduction.
    "swin_patch_merging": net({"x": ["B", 5, "W", 4]}, [
        ("features.2.merge", "patch_merging_pad", {}, {"x": "x"}),
        ("features.2.norm", "layer_norm", {}, {"x": "features.2.merge"}),
        ("features.2.reduction", "linear", {"out_features": 8, "bias": False},
         {"x": "features.2.norm"}),
    ], {"y": "features.2.reduction"}),
    "swin_window_attention": net({"x": [1, 5, 7, 8]}, [
        ("features.1.0.attn", "shifted_window_attention",
         {"dim": 8, "window_size": [4, 4], "shift_size": [2, 2], "num_heads": 2}, {"x": "x"}),
        ("features.1.1.attn", "shifted_window_attention",
         {"dim": 8, "window_size": [8, 3], "shift_size": 1, "num_heads": 1, "qkv_bias": False,
          "proj_bias": False, "attention_dropout": 0.0, "dropout": 0.1},
         {"x": "features.1.0.attn"}),
    ], {"y": "features.1.1.attn"}),
    # A causal decoder that can generate (tessera generate, the incremental path): position table,
    # MultiheadAttention with is_causal, attention@1 with causal rope, a tied head.
    "gpt_causal": net({"ids": {"shape": ["B", "T"], "dtype": "int64"}}, [
        ("tok", "embedding", {"num_embeddings": 5, "embedding_dim": 8}, {"x": "ids"}),
        ("positions", "arange", {"dim": 1}, {"like": "ids"}),
        ("pos", "embedding", {"num_embeddings": 6, "embedding_dim": 8}, {"x": "positions"}),
        ("h", "add", {}, {"a": "tok", "b": "pos"}),
        ("norm", "layer_norm", {}, {"x": "h"}),
        ("sa", "multihead_attention", {"embed_dim": 8, "num_heads": 2, "batch_first": True,
                                        "need_weights": False, "is_causal": True},
         {"query": "norm"}),
        ("res", "add", {}, {"a": "h", "b": "sa"}),
        ("rope", "attention", {"heads": 2, "causal": True, "rope": True}, {"x": "res"}),
        ("g", "gelu", {}, {"x": "rope"}),
        ("logits", "linear", {"out_features": 5, "bias": False}, {"x": "g", "weight": "tok.weight"}),
    ], {"logits": "logits"}),
    "matmul_broadcast": net({"a": ["B", 1, 4, 3], "b": [5, 3, 2], "v": [3], "u": [4]}, [
        ("p", "matmul", {}, {"a": "a", "b": "b"}),
        ("mv", "matmul", {}, {"a": "a", "b": "v"}),
        ("mvv", "matmul", {}, {"a": "mv", "b": "u"}),
        ("vb", "matmul", {}, {"a": "v", "b": "b"}),
        ("dot", "matmul", {}, {"a": "v", "b": "v"}),
    ], {"p": "p", "mvv": "mvv", "vb": "vb", "dot": "dot"}),
}


def network_seeds():
    for i in range(1, 6):
        with open(os.path.join(ROOT, "examples", "spec", "example%d.json" % i)) as f:
            write("network", "spec_example%d.json" % i, f.read())
    with open(os.path.join(ROOT, "examples", "encoder", "encoder.json")) as f:
        write("network", "encoder.json", f.read())
    with open(os.path.join(ROOT, "examples", "digits", "digits.json")) as f:
        write("network", "digits.json", f.read())
    for name, n in SMALL.items():
        write("network", name + ".json", json.dumps(n, separators=(",", ":")))


# ------------------------------------------------------------------------------ run


def run_seed(flags, net_bytes, weights, inputs):
    return (bytes([flags]) + struct.pack("<I", len(net_bytes)) + net_bytes +
            struct.pack("<I", len(weights)) + weights + inputs)


def input_file(n, dtypes=None):
    """One random tensor per input of network `n`, open dims as 2; bool inputs alternate."""
    entries = []
    for name, spec in n["inputs"].items():
        shape = spec["shape"] if isinstance(spec, dict) else spec
        shape = [d if isinstance(d, int) else 2 for d in shape]
        kind = spec.get("dtype", "float32") if isinstance(spec, dict) else "float32"
        if kind == "bool":
            entries.append((name, "BOOL", shape, bytes((i % 3 == 0) for i in range(numel(shape)))))
        elif kind == "int64":  # token ids, in range for the corpus networks' tables (< 5)
            entries.append((name, "I64", shape,
                            struct.pack("<%dq" % numel(shape), *[i % 5 for i in range(numel(shape))])))
        elif (dtypes or {}).get(name) == "F16":
            values = [rng.gauss(0, 1) for _ in range(numel(shape))]
            entries.append((name, "F16", shape, struct.pack("<%de" % len(values), *values)))
        else:
            entries.append((name, "F32", shape, randn_f32(shape)))
    return safetensors(entries)


def run_seeds():
    for name in ["linear", "norm_gelu_add", "broadcast_add", "chunk_concat",
                 "attention_rope_causal", "attention_relpos", "mha_masks",
                 "mha_batch_first_kdim", "mha_self_unbatched", "symbolic"]:
        n = SMALL[name]
        text = json.dumps(n, separators=(",", ":")).encode()
        write("run", name + "_random_init", run_seed(1, text, b"", input_file(n)))

    # Weights given, F16 input converted on the way in.
    n = SMALL["linear"]
    w = safetensors([("n0.weight", "F32", [4, 8], randn_f32([4, 8], 0.3)),
                     ("n0.bias", "F32", [4], randn_f32([4], 0.1))])
    write("run", "linear_weights_f16_input",
          run_seed(1, json.dumps(n).encode(), w, input_file(n, {"x": "F16"})))
    # Non-strict: one weight missing, one unexpected.
    w = safetensors([("n0.weight", "F32", [4, 8], randn_f32([4, 8], 0.3)),
                     ("stray", "F32", [1], f32_bytes([0.0]))])
    write("run", "linear_non_strict", run_seed(0, json.dumps(n).encode(), w, input_file(n)))

    # A complete model: the checkpoint carries the network (layer_norm -> linear -> gelu).
    n = net({"x": [2, 8]}, [
        ("ln", "layer_norm", {}, {"x": "x"}),
        ("fc", "linear", {"out_features": 8}, {"x": "ln"}),
        ("g", "gelu", {}, {"x": "fc"}),
    ], {"y": "g"})
    ckpt = safetensors([("fc.weight", "F32", [8, 8], randn_f32([8, 8], 0.3)),
                        ("fc.bias", "F32", [8], randn_f32([8], 0.1)),
                        ("ln.weight", "F32", [8], randn_f32([8], 1.0)),
                        ("ln.bias", "F32", [8], randn_f32([8], 0.1))],
                       {"format": "pt", "tessera.network": json.dumps(n)})
    write("run", "checkpoint_with_network", run_seed(1, ckpt, b"", input_file(n)))

    # MultiheadAttention with PyTorch's parameter names.
    n = SMALL["mha_self_unbatched"]
    w = safetensors([("m.in_proj_weight", "F32", [24, 8], randn_f32([24, 8], 0.3)),
                     ("m.out_proj.weight", "F32", [8, 8], randn_f32([8, 8], 0.3)),
                     ("m.in_proj_bias", "F32", [24], randn_f32([24], 0.1)),
                     ("m.out_proj.bias", "F32", [8], randn_f32([8], 0.1))])
    write("run", "mha_weights", run_seed(1, json.dumps(n).encode(), w, input_file(n)))

    # Added later than the seeds above, so that their random draws stay as they were.
    for name in ["relu", "layout_window", "layout_merge", "layout_tokens", "conv_patch_mean",
                 "conv_strided_pool", "math_ops", "matmul_broadcast", "gpt_parts",
                 "swin_window_attention", "swin_patch_merging", "gpt_causal"]:
        n = SMALL[name]
        text = json.dumps(n, separators=(",", ":")).encode()
        write("run", name + "_random_init", run_seed(1, text, b"", input_file(n)))


# ------------------------------------------------------------------------------ panel_cache
# fuzz_panel_cache checks files against checkpoint identity (1, 2, 3, 4) and layout "fuzz layout".


def panel_cache(entries, identity=(1, 2, 3, 4), layout="fuzz layout", version=1, pad_last=True):
    """The io/panel_cache.h layout: magic, u64 header length, JSON, zeros to 4096, 4096-aligned panels."""
    listed, data, offset = [], b"", 0
    for i, (key, rows, cols, floats) in enumerate(entries):
        listed.append({"key": key, "rows": rows, "cols": cols, "offset": offset, "floats": floats})
        body = f32_bytes([(i + 1) * 0.5 + j for j in range(floats)])
        if pad_last or i + 1 < len(entries):
            body += b"\0" * (-len(body) % 4096)
        data += body
        offset += len(body)
    dev, ino, size, mtime = identity
    header = json.dumps({"version": version, "layout": layout,
                         "checkpoint": {"device": dev, "inode": ino, "size": size, "mtime_ns": mtime},
                         "entries": listed}, separators=(",", ":")).encode()
    head = b"TSPANEL1" + struct.pack("<Q", len(header)) + header
    return head + b"\0" * (-len(head) % 4096) + data


def panel_cache_seeds():
    write("panel_cache", "two_entries", panel_cache([("a.weight", 3, 2, 32), ("b.in_proj_weight", 17, 4, 128)]))
    write("panel_cache", "no_entries", panel_cache([]))
    write("panel_cache", "ends_at_last_panel", panel_cache([("w", 16, 1, 16)], pad_last=False))
    write("panel_cache", "other_identity", panel_cache([("w", 16, 1, 16)], identity=(1, 2, 3, 5)))
    write("panel_cache", "other_layout", panel_cache([("w", 16, 1, 16)], layout="f32 k-major panels of 16 rows, v1"))
    good = panel_cache([("w", 16, 1, 16)])
    write("panel_cache", "offset_past_end", good.replace(b'"offset":0', b'"offset":8192'))
    write("panel_cache", "truncated", good[:4096 + 32])


def main():
    safetensors_seeds()
    network_seeds()
    run_seeds()
    panel_cache_seeds()


if __name__ == "__main__":
    main()
