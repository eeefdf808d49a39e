#!/usr/bin/python3
"""One model of benchmarks/models/catalog.py, made once for benchmarks/models.py (which caches it).

  /usr/bin/python3 benchmarks/models/prepare.py --model swin_t --dir /tmp/tessera-models-0/models/swin_t

Builds the PyTorch module itself (specs.py), draws every parameter from a fixed seed, eval mode,
and writes into DIR:
  weights.safetensors   model.state_dict() under PyTorch's own names, float32 (Swin's
                        relative_position_index buffers as they are, I64): what `tessera
                        bench/run --weights` loads (tests/fixtures/st_format.py writes it: there
                        is no safetensors package here). The gpt's head is tied: its state_dict
                        holds tok.weight once and the recipe reads the head from it.
  state_dict.pt         the same state_dict, torch.save'd, for torch_model.py
  input.safetensors     the fixed input (recipe input names; ids I64 in [0, vocab)), and inputs.pt
  expected.safetensors  PyTorch's eval-mode output of it (recipe output names), the reference
                        every runtime is verified against
  model.onnx            torch.onnx.export of the same module, opset 14, fixed shapes, input and
                        output names as the recipe's; for `transformer` the causal tgt_mask is
                        built inside the exported forward (specs.CausalTransformer)
  meta.json             written last (marks the directory complete): the cache key, versions,
                        parameter count, checkpoint / output bytes, export notes
Prints meta.json's content as one JSON line.
"""
import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))

import torch  # noqa: E402

import specs  # noqa: E402
from catalog import MODELS, SEED, cache_key  # noqa: E402
from st_format import save_file  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--dir", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX export")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.dir, exist_ok=True)
    meta_path = os.path.join(a.dir, "meta.json")
    if os.path.exists(meta_path):
        os.unlink(meta_path)
    spec = MODELS[a.model]
    t_all = time.time()
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    bare = specs.module(a.model)
    specs.randomize(bare, gen)
    bare.eval()
    model = specs.wrapped(a.model, bare).eval()
    inputs = specs.make_inputs(a.model, gen)
    args = tuple(inputs[k] for k in spec["inputs"])

    sd = {k: v.detach().contiguous() for k, v in bare.state_dict().items()}
    weights = os.path.join(a.dir, "weights.safetensors")
    save_file(sd, weights)
    torch.save(sd, os.path.join(a.dir, "state_dict.pt"))
    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(a.dir, "input.safetensors"))
    torch.save(inputs, os.path.join(a.dir, "inputs.pt"))
    with torch.inference_mode():
        out = model(*args)
    outs = {spec["outputs"][0]: out.detach().contiguous()}
    save_file(outs, os.path.join(a.dir, "expected.safetensors"))

    meta = {"key": cache_key(a.model), "torch": torch.__version__,
            "parameters": sum(p.numel() for p in bare.parameters()),
            "checkpoint_bytes": os.path.getsize(weights),
            "state_dict_dtypes": sorted({str(v.dtype).replace("torch.", "") for v in sd.values()}),
            "outputs": {k: list(v.shape) for k, v in outs.items()},
            "output_bytes": sum(v.numel() * v.element_size() for v in outs.values()),
            "max_abs_expected": max(v.abs().max().item() for v in outs.values())}
    try:
        import torchvision
        meta["torchvision"] = torchvision.__version__
    except ImportError:
        meta["torchvision"] = None

    if not a.no_onnx:
        # Grad stays enabled during the export (torch.onnx.export's default): nn.MultiheadAttention
        # and nn.TransformerEncoderLayer then take their plain-op paths, not the fused inference
        # kernels (torch._native_multi_head_attention, _transformer_encoder_layer_fwd), which have
        # no ONNX symbolic.
        t0 = time.time()
        onnx_path = os.path.join(a.dir, "model.onnx")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.onnx.export(model, args, onnx_path, opset_version=14, do_constant_folding=True,
                              input_names=list(spec["inputs"]), output_names=list(spec["outputs"]))
        kinds = {}
        for w in caught:
            kinds[w.category.__name__] = kinds.get(w.category.__name__, 0) + 1
        meta["onnx"] = {"opset": 14, "export_s": round(time.time() - t0, 1),
                        "bytes": os.path.getsize(onnx_path), "method": "torch.onnx.export (tracing), fixed shapes",
                        "warnings": kinds}
    meta["prepare_s"] = round(time.time() - t_all, 1)
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
