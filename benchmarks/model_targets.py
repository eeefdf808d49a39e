#!/usr/bin/env python3
"""What issue 15's whole-model targets ask for, in FLOP/s against the FMA probe of the same run.

  benchmarks/model_targets.py RUN.jsonl [RUN.jsonl ...]

Reads the raw rows models.py wrote (benchmarks/results/*-models-*.jsonl) and prints, per run,
model and thread count: tessera's median and its share of the probe; the ORT time the target
asks for (models.ORT_TARGETS: 1.05x for vit_b_16, 1.2x / 1.3x for swin_t on 1 / 2 threads, 1.3x
for gpt and nn.Transformer) and the share of the probe a tessera run at that time would need; the
same for 2x PyTorch at its best thread count; and the 85%-of-peak alternative in ms. The run is
read and aggregated by models.py's own functions (median over rounds of each process's median
call, contended rows left out when clean ones exist, the higher of the start / end probe). The
results files' targets sections say MET / NOT MET; this says how far each bar is from the FMA
ceiling.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (stdlib only; its main() does not run on import)


def report(path):
    meta, _, probes, rows = models.read_run(path)
    peak = models.probe_peaks(probes)[2]
    res = models.agg(rows)
    ok = {k: s for k, s in res.items() if s.get("ok")}
    models_run = meta.get("model_list") or sorted({k[0] for k in ok})
    threads = meta.get("thread_list") or sorted({k[1] for k in ok})
    probe_text = " / ".join(f"{peak[n]:.1f}" for n in threads if n in peak)
    print(f"## {Path(path).name} (FMA probe {probe_text} GFLOP/s on "
          f"{' / '.join(str(n) for n in threads)} threads)")
    print("model        thr  GFLOP  tessera ms (% peak)  | ORT ms  need x ORT -> ms (% peak)    "
          "| torch best ms  2x -> ms (% peak)    | 85% of peak -> ms")
    for model in models_run:
        best = models.torch_best(res, model, threads)
        for n in threads:
            t = ok.get((model, n, "tessera"))
            if t is None or not t.get("flops") or n not in peak:
                continue
            flops = t["flops"]

            def share(ms):
                return 100.0 * flops / (ms * 1e-3) / 1e9 / peak[n]

            ms = t["median_ms"]
            line = f"{model:<12} {n:>3}  {flops / 1e9:5.1f}  {ms:9.1f} ({share(ms):3.0f}%)      |"
            ort = ok.get((model, n, "ort"))
            if ort is not None and model in models.ORT_TARGETS:
                m = models.ORT_TARGETS[model][0](n)
                need = ort["median_ms"] / m
                line += f" {ort['median_ms']:6.1f}  {m:.2f}x -> {need:6.1f} ({share(need):3.0f}%)   |"
            else:
                line += "      -                             |"
            if best is not None:
                need = best[0] / 2
                line += f" {best[0]:8.1f}      {need:7.1f} ({share(need):3.0f}%)   |"
            else:
                line += "        -                          |"
            line += f" {flops / (0.85 * peak[n] * 1e9) * 1e3:6.1f}"
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
