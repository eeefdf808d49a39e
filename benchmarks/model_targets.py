#!/usr/bin/env python3
"""What issue 15's whole-model targets ask for, in FLOP/s against the FMA probe of the same run.

  benchmarks/model_targets.py RUN.jsonl [RUN.jsonl ...]

Reads the raw rows models.py wrote (benchmarks/results/*-models-*.jsonl) and prints, per run,
model and thread count: tessera's median and its share of the probe; the ORT time the target
asks for (1.05x for vit_b_16, 1.2x / 1.3x for swin_t on 1 / 2 threads, 1.3x for gpt and
nn.Transformer) and the share of the probe a tessera run at that time would need; the same for
2x PyTorch at its best thread count; and the 85%-of-peak alternative in ms. The statistics are
the runner's: the median over rounds of each process's median call, tessera's plan FLOPs, the
higher of the start / end probe at the row's thread count. The results files' targets sections
say MET / NOT MET; this says how far each bar is from the FMA ceiling.
"""
import json
import statistics
import sys
from pathlib import Path


def ort_multiple(model, threads):
    if model == "vit_b_16":
        return 1.05
    if model == "swin_t":
        return 1.2 if threads == 1 else 1.3
    return 1.3


def load(path):
    rows, probes, meta = [], [], {}
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "row":
            rows.append(r)
        elif "probe" in r:
            probes.append(r["probe"])
        elif r.get("meta") == "start":
            meta = r
    return rows, probes, meta


def report(path):
    rows, probes, meta = load(path)
    peak = {}
    for p in probes:
        for k, v in p.items():
            peak[int(k)] = max(peak.get(int(k), 0.0), v)
    med, flops = {}, {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        med.setdefault((r["model"], r["threads"], r["runtime"]), []).append(r["median_ms"])
        if r["runtime"] == "tessera":
            flops[r["model"]] = r["flops"]
    med = {k: statistics.median(v) for k, v in med.items()}
    models = meta.get("model_list") or sorted({k[0] for k in med})
    threads = meta.get("thread_list") or sorted({k[1] for k in med})
    probe_text = " / ".join(f"{peak[n]:.1f}" for n in threads if n in peak)
    print(f"## {Path(path).name} (FMA probe {probe_text} GFLOP/s on "
          f"{' / '.join(str(n) for n in threads)} threads)")
    print("model        thr  GFLOP  tessera ms (% peak)  | ORT ms  need x ORT -> ms (% peak)    "
          "| torch best ms  2x -> ms (% peak)    | 85% of peak -> ms")

    def share(ms, model, n):
        return 100.0 * flops[model] / (ms * 1e-3) / 1e9 / peak[n]

    for model in models:
        if model not in flops:
            continue
        torch_times = [med[(model, n, "torch")] for n in threads if (model, n, "torch") in med]
        torch_best = min(torch_times) if torch_times else None
        for n in threads:
            t = med.get((model, n, "tessera"))
            if t is None or n not in peak:
                continue
            line = f"{model:<12} {n:>3}  {flops[model] / 1e9:5.1f}  {t:9.1f} ({share(t, model, n):3.0f}%)      |"
            ort = med.get((model, n, "ort"))
            if ort is not None:
                m = ort_multiple(model, n)
                need = ort / m
                line += f" {ort:6.1f}  {m:.2f}x -> {need:6.1f} ({share(need, model, n):3.0f}%)   |"
            else:
                line += "      -                             |"
            if torch_best is not None:
                need = torch_best / 2
                line += f" {torch_best:8.1f}      {need:7.1f} ({share(need, model, n):3.0f}%)   |"
            else:
                line += "        -                          |"
            ms85 = flops[model] / (0.85 * peak[n] * 1e9) * 1e3
            line += f" {ms85:6.1f}"
            print(line)
    print()


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    for path in sys.argv[1:]:
        report(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
