#!/usr/bin/python3
"""Full-size check of the recipes (interfaces.md §5, issue 14): every architecture at its defaults
(plus vit_b_32 at image_size 384), built by PyTorch itself, against `tessera run`.

    /usr/bin/python3 scripts/check_full_models.py [--build build] [--only ARCH ...] [--threads N]

For each model: torchvision 0.14 / torch 1.13 / shared GPT reference, every parameter drawn at
random (torchvision zero-initialises the heads, which would hide a wrong graph), eval mode; its
state_dict written as is (tests/fixtures/st_format.py, the reference safetensors layout), a
random input, `tessera recipe ARCH --set ...` then `tessera run` with `--weights`; compares the
output with PyTorch's (max |d| / max(1, max |ref|) <= 1e-4) and `tessera summary`'s parameter
count with sum(p.numel() for p in model.parameters()). Also times one forward of each with
`tessera bench --reps 3` (median ms) and torch (median of 3, same thread count). Prints one line
per model; exits 1 when any check fails. Needs ~3x the largest model in free disk and memory
(vit_h_14: 2.5 GB of weights).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
from st_format import save_file  # noqa: E402
from gen_model_fixtures import gpt_class  # noqa: E402


def vision(arch, settings, batch=1):
    def make():
        return getattr(torchvision.models, arch)(**settings)
    size = settings.get("image_size", 224)
    return make, {"x": lambda: torch.randn(batch, 3, size, size)}, lambda m, i: {"y": m(i["x"])}


def transformer(S=32, T=32, batch=1):
    def run(m, i):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
        return {"y": m(i["src"], i["tgt"], tgt_mask=mask)}
    return (lambda: torch.nn.Transformer(batch_first=True),
            {"src": lambda: torch.randn(batch, S, 512), "tgt": lambda: torch.randn(batch, T, 512)},
            run)


def gpt(T=64, batch=1):
    return (lambda: gpt_class()(),
            {"ids": lambda: torch.randint(0, 50257, (batch, T))},
            lambda m, i: {"logits": m(i["ids"])})


MODELS = [
    ("vit_b_16", {}, vision("vit_b_16", {})),
    ("vit_b_32", {}, vision("vit_b_32", {})),
    ("vit_b_32", {"image_size": 384}, vision("vit_b_32", {"image_size": 384})),
    ("vit_l_16", {}, vision("vit_l_16", {})),
    ("vit_l_32", {}, vision("vit_l_32", {})),
    ("vit_h_14", {}, vision("vit_h_14", {})),
    ("swin_t", {}, vision("swin_t", {})),
    ("swin_s", {}, vision("swin_s", {})),
    ("swin_b", {}, vision("swin_b", {})),
    ("transformer", {}, transformer()),
    ("gpt", {}, gpt()),
]


def randomize(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("class_token", "encoder.pos_embedding"):
                p.normal_(0, 0.5)
            elif p.dim() >= 2:
                p.normal_(0, p[0].numel() ** -0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            else:
                p.normal_(0, 0.2)


def tessera(build, *args):
    r = subprocess.run([os.path.join(build, "apps", "tessera"), *args], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tessera {' '.join(args[:2])}: {r.stderr.strip()}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    failed = False
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{args.threads} threads")
    for arch, settings, (make, inputs, run) in MODELS:
        if args.only and arch not in args.only:
            continue
        label = arch + "".join(f" {k}={v}" for k, v in settings.items())
        with tempfile.TemporaryDirectory() as tmp:
            model = make()
            randomize(model)
            model.eval()
            values = {k: f() for k, f in inputs.items()}
            with torch.no_grad():
                expected = run(model, values)
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    run(model, values)
                    times.append((time.perf_counter() - t0) * 1e3)
            count = sum(p.numel() for p in model.parameters())
            weights = os.path.join(tmp, "w.safetensors")
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
            del model
            inp = os.path.join(tmp, "in.safetensors")
            save_file({k: v.contiguous() for k, v in values.items()}, inp)
            net = os.path.join(tmp, "net.json")
            sets = []
            for k, v in settings.items():
                sets += ["--set", f"{k}={json.dumps(v)}"]
            tessera(args.build, "recipe", arch, *sets, "--output", net)
            summary = tessera(args.build, "summary", net).strip().splitlines()[-1]
            ours = int(summary.split(":")[1].replace(",", ""))
            out = os.path.join(tmp, "out.safetensors")
            tessera(args.build, "run", net, "--weights", weights, "--input", inp, "--output", out,
                    "--threads", str(args.threads))
            from st_format import load_file
            got = load_file(out)
            worst = 0.0
            for k, ref in expected.items():
                d = (got[k].double() - ref.double()).abs().max().item()
                worst = max(worst, d / max(1.0, ref.abs().max().item()))
            shapes = " ".join(f"{k}={list(v.shape)}" for k, v in values.items())
            bench = json.loads(tessera(args.build, "bench", net, "--weights", weights,
                                       *sum((["--shape", f"{k}={','.join(map(str, v.shape))}"]
                                             for k, v in values.items()), []),
                                       "--threads", str(args.threads), "--warmup", "1",
                                       "--reps", "3", "--json"))
            ok = worst <= 1e-4 and ours == count
            failed |= not ok
            print(f"{label}: {shapes}: parameters {ours:,} (torch {count:,}), "
                  f"worst error {worst:.2e}, tessera {bench['median_ms']:.1f} ms, "
                  f"torch {statistics.median(times):.1f} ms: {'ok' if ok else 'FAIL'}",
                  flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
