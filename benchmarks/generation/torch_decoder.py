#!/usr/bin/python3
"""The PyTorch peers of bench_generate: one process per config and thread count, one JSON line.

  torch_decoder.py --settings '{"d_model": 512, ...}' --weights W.pt --threads 1
                   [--batch 1] [--prompt 128] [--new 128] [--contexts 1024,4096]
                   [--recompute-tokens 8]

benchmarks/generation.py runs it beside bench_generate on the same weights. Two ways to generate
with the gpt recipe's model (GPT of tests/fixtures/gpt_reference.py, built from --settings):

- cached: GPT.forward rewritten with torch.nn.functional over a preallocated key/value cache
  [B, H, C, D] per layer, so a step runs one position, as tessera's GenerationSession does.
  Checked once against GPT.forward before anything is timed (max abs diff of the logits < 1e-3
  over a prefill followed by steps; exit status 1 otherwise). Timed as bench_generate times
  tessera: prefill (one warm-up, best and median of 3), `new` greedy steps each timed alone,
  and 16 steps at positions C-16..C-1 of each context C after one warm-up step.
- recompute: GPT.forward over the whole growing sequence for every token (no cache), the
  baseline a cache exists to beat; only --recompute-tokens tokens after the prompt, it is slow.

Peak RSS (VmHWM; ru_maxrss would carry the runner's peak across fork and exec): once after
loading (the randomly initialised model and the loaded state_dict coexist for a moment), then
from there to the end of the cached runs (Linux's /proc/self/clear_refs "5" resets the
high-water mark): what decoding itself holds.
"""
import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFILL_RUNS = 3
CONTEXT_STEPS = 16  # timed steps per context, after one warm-up
# Untimed prefills run in chunks of this many positions: one chunk's scores are
# [B, H, chunk, C] floats (a 4096-position prefill in one go would take 0.5 GB of them).
FILL_CHUNK = 512


def gpt_class():
    """GPT from tests/fixtures/gpt_reference.py, loaded directly: gen_model_fixtures.gpt_class
    would import torchvision too, ~40 MiB of RSS that this process would then report."""
    path = os.path.join(REPO, "tests", "fixtures", "gpt_reference.py")
    spec = importlib.util.spec_from_file_location("gpt_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GPT


class CachedGPT:
    """GPT.forward over new positions only; every layer's keys and values kept in a cache."""

    def __init__(self, model, batch, capacity):
        self.p = dict(model.named_parameters())  # the model's own tensors: no copy
        self.d_model = model.tok.weight.shape[1]
        self.heads = model.blocks.layers[0].self_attn.num_heads
        self.head_dim = self.d_model // self.heads
        self.eps = model.ln_f.eps
        self.capacity = capacity
        shape = (batch, self.heads, capacity, self.head_dim)
        self.k_cache = [torch.empty(shape) for _ in model.blocks.layers]
        self.v_cache = [torch.empty(shape) for _ in model.blocks.layers]
        self.past = 0

    def reset(self):
        self.past = 0

    def forward(self, ids, all_positions=False):
        """ids [B, T] at positions past..past+T-1 -> logits [B, vocab] of the last position
        ([B, T, vocab] of every one with all_positions)."""
        p, E, H, D = self.p, self.d_model, self.heads, self.head_dim
        B, T = ids.shape
        start, end = self.past, self.past + T
        assert end <= self.capacity, f"{end} positions exceed the cache of {self.capacity}"
        h = F.embedding(ids, p["tok.weight"]) + F.embedding(torch.arange(start, end),
                                                            p["pos.weight"])
        # New position i sees every cached one and the new ones up to itself: key j > start + i
        # is masked. One new position sees everything, no mask needed.
        masked = torch.ones(T, end, dtype=torch.bool).triu(start + 1) if T > 1 else None
        for i, (k_cache, v_cache) in enumerate(zip(self.k_cache, self.v_cache)):
            layer = f"blocks.layers.{i}."
            x = F.layer_norm(h, (E,), p[layer + "norm1.weight"], p[layer + "norm1.bias"], self.eps)
            qkv = F.linear(x, p[layer + "self_attn.in_proj_weight"],
                           p[layer + "self_attn.in_proj_bias"])
            q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # each [B, H, T, D]
            k_cache[:, :, start:end] = k
            v_cache[:, :, start:end] = v
            scores = torch.matmul(q * D ** -0.5, k_cache[:, :, :end].transpose(-1, -2))
            if masked is not None:
                scores.masked_fill_(masked, float("-inf"))
            attended = torch.matmul(torch.softmax(scores, dim=-1), v_cache[:, :, :end])
            attended = attended.transpose(1, 2).reshape(B, T, E)
            h = h + F.linear(attended, p[layer + "self_attn.out_proj.weight"],
                             p[layer + "self_attn.out_proj.bias"])
            x = F.layer_norm(h, (E,), p[layer + "norm2.weight"], p[layer + "norm2.bias"], self.eps)
            x = F.gelu(F.linear(x, p[layer + "linear1.weight"], p[layer + "linear1.bias"]))
            h = h + F.linear(x, p[layer + "linear2.weight"], p[layer + "linear2.bias"])
        self.past = end
        h = h if all_positions else h[:, -1]
        h = F.layer_norm(h, (E,), p["ln_f.weight"], p["ln_f.bias"], self.eps)
        return F.linear(h, p["tok.weight"])  # the head tied to the token embedding

    def prefill(self, ids):
        self.reset()
        return self.forward(ids)

    def fill(self, ids):
        """An untimed prefill, in chunks (FILL_CHUNK says why)."""
        self.reset()
        for begin in range(0, ids.shape[1], FILL_CHUNK):
            logits = self.forward(ids[:, begin:begin + FILL_CHUNK])
        return logits


def check_against_model(model, vocab, batch, context):
    """Max abs diff between GPT.forward and the cached decoder (a prefill, then steps) over
    every position of a short sequence."""
    length = min(16, context)
    split = length // 2
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(7))
    expected = model(ids)
    decoder = CachedGPT(model, batch, length)
    got = [decoder.forward(ids[:, :split], all_positions=True)]
    for j in range(split, length):
        got.append(decoder.forward(ids[:, j:j + 1], all_positions=True))
    return (torch.cat(got, dim=1) - expected).abs().max().item()


def timed_steps(decoder, logits, steps):
    """Milliseconds of each greedy step, the step alone (the argmax is outside, as in
    bench_generate)."""
    ms = []
    for _ in range(steps):
        tokens = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
        t0 = time.perf_counter()
        logits = decoder.forward(tokens)
        ms.append((time.perf_counter() - t0) * 1e3)
    return ms


def reset_peak_rss():
    """True when the kernel took it (needs Linux >= 4.0 and a writable clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib():
    """VmHWM: the high-water mark of this program (since the last reset_peak_rss)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", required=True, help="GPT's keyword arguments, a JSON object")
    ap.add_argument("--weights", required=True, help="a state_dict saved by torch.save")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--recompute-tokens", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = gpt_class()(**json.loads(args.settings)).eval()
    state = torch.load(args.weights)
    model.load_state_dict(state)
    del state
    gc.collect()
    load_rss = peak_rss_mib()
    peak_was_reset = reset_peak_rss()
    vocab, context = model.tok.weight.shape[0], model.context
    if args.prompt + args.new > context:
        sys.exit(f"torch_decoder: --prompt + --new is more than the context of {context}")
    out = {"threads": args.threads, "torch": torch.__version__, "batch": args.batch,
           "prompt": args.prompt, "new": args.new, "peak_rss_load_mib": load_rss}

    with torch.inference_mode():
        diff = check_against_model(model, vocab, args.batch, context)
        out["check_max_abs_diff"] = diff
        if not diff < 1e-3:
            print(json.dumps(out))
            sys.exit(f"torch_decoder: the cached decoder's logits differ from GPT.forward's "
                     f"by {diff:.3g} (>= 1e-3)")

        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (args.batch, args.prompt), generator=gen)
        decoder = CachedGPT(model, args.batch, args.prompt + args.new)
        t0 = time.perf_counter()
        logits = decoder.prefill(ids)
        out["first_prefill_ms"] = (time.perf_counter() - t0) * 1e3
        prefill_ms = []
        for _ in range(PREFILL_RUNS):
            t0 = time.perf_counter()
            logits = decoder.prefill(ids)
            prefill_ms.append((time.perf_counter() - t0) * 1e3)
        step_ms = timed_steps(decoder, logits, args.new)
        del decoder
        out.update(prefill_ms_best=min(prefill_ms), prefill_ms_median=statistics.median(prefill_ms),
                   step_ms_median=statistics.median(step_ms), step_ms_best=min(step_ms),
                   tokens_per_s=args.batch / (statistics.median(step_ms) * 1e-3))

        runs, skipped = [], []
        for C in sorted({int(c) for c in args.contexts.split(",") if c}):
            if C > context or C < CONTEXT_STEPS + 2:
                skipped.append(C)
                continue
            decoder = CachedGPT(model, args.batch, C)
            fill = torch.randint(0, vocab, (args.batch, C - CONTEXT_STEPS - 1), generator=gen)
            logits = decoder.fill(fill)
            logits = decoder.forward(logits.argmax(dim=-1, keepdim=True))  # warm-up at C-17
            runs.append({"context": C,
                         "step_ms": statistics.median(timed_steps(decoder, logits, CONTEXT_STEPS))})
            del decoder
        out["contexts"], out["contexts_skipped"] = runs, skipped
        out["peak_rss_mib"] = peak_rss_mib() if peak_was_reset else None

        # Recomputation: the whole sequence again for every token.
        seq = ids
        model(seq)  # warm-up at the prompt's length
        recompute_ms = []
        for _ in range(min(args.recompute_tokens, context - args.prompt)):
            t0 = time.perf_counter()
            logits = model(seq)[:, -1]
            recompute_ms.append((time.perf_counter() - t0) * 1e3)
            seq = torch.cat([seq, logits.argmax(dim=-1, keepdim=True)], dim=1)
        out["recompute_tokens"] = len(recompute_ms)
        out["recompute_ms_per_token"] = statistics.median(recompute_ms) if recompute_ms else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
