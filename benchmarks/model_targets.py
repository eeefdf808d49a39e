#!/usr/bin/env python3
"""What issue 15's whole-model targets ask for, in FLOP/s against the FMA probe of the same run.

  benchmarks/model_targets.py RUN.jsonl [RUN.jsonl ...]
  benchmarks/model_targets.py --across RUN.jsonl RUN.jsonl ...

Reads the raw rows models.py wrote (benchmarks/results/*-models-*.jsonl) and prints, per run,
model and thread count: tessera's median and its share of the probe; the ORT time the target
asks for (models.ORT_TARGETS: 1.05x for vit_b_16, 1.2x / 1.3x for swin_t on 1 / 2 threads, 1.3x
for gpt and nn.Transformer) and the share of the probe a tessera run at that time would need; the
same for 2x PyTorch at its best thread count; and the 85%-of-peak alternative in ms. The run is
read and aggregated by models.py's own functions (median over rounds of each process's median
call, contended rows left out when clean ones exist, the higher of the start / end probe). The
results files' targets sections say MET / NOT MET; this says how far each bar is from the FMA
ceiling.

--across: one line per model and thread count over several runs of one machine and ISA: in how
many runs the row met its ORT target and the 2x-PyTorch-or-85% one, with the range of tessera's
speed-up over ORT and of its share of the probe. Rows near a line flip from run to run on a
shared host; this says how often, where one run's verdict cannot.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (stdlib only; its main() does not run on import)


def load(path):
    """One run aggregated as models.py does: (probe peak per thread count, all rows, the clean
    rows, the models, the thread counts)."""
    meta, _, probes, rows = models.read_run(path)
    peak = models.probe_peaks(probes)[2]
    res = models.agg(rows)
    ok = {k: s for k, s in res.items() if s.get("ok")}
    models_run = meta.get("model_list") or sorted({k[0] for k in ok})
    threads = meta.get("thread_list") or sorted({k[1] for k in ok})
    return peak, res, ok, models_run, threads


def tessera_rows(peak, res, ok, models_run, threads):
    """(model, threads, tessera's aggregate, PyTorch's best (ms, threads) or None) for each
    clean tessera row with a FLOP count and a probe at its thread count."""
    for model in models_run:
        best = models.torch_best(res, model, threads)
        for n in threads:
            t = ok.get((model, n, "tessera"))
            if t is not None and t.get("flops") and n in peak:
                yield model, n, t, best


def probe_share(flops, ms, peak_gflops):
    """% of the FMA probe that `flops` in `ms` milliseconds amounts to."""
    return 100.0 * flops / (ms * 1e-3) / 1e9 / peak_gflops


def report(path):
    peak, res, ok, models_run, threads = load(path)
    probe_text = " / ".join(f"{peak[n]:.1f}" for n in threads if n in peak)
    print(f"## {Path(path).name} (FMA probe {probe_text} GFLOP/s on "
          f"{' / '.join(str(n) for n in threads)} threads)")
    print("model        thr  GFLOP  tessera ms (% peak)  | ORT ms  need x ORT -> ms (% peak)    "
          "| torch best ms  2x -> ms (% peak)    | 85% of peak -> ms")
    for model, n, t, best in tessera_rows(peak, res, ok, models_run, threads):
        flops = t["flops"]

        def share(ms):
            return probe_share(flops, ms, peak[n])

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
        line += f" {flops / (models.PEAK_SHARE_MET / 100 * peak[n] * 1e9) * 1e3:6.1f}"
        print(line)
    print()


def row_verdicts(path):
    """{(model, threads): (x ORT or None, % of probe, ORT target met, 2x-torch-or-85% met)}."""
    peak, res, ok, models_run, threads = load(path)
    out = {}
    for model, n, t, best in tessera_rows(peak, res, ok, models_run, threads):
        pct = models.peak_share(t, peak, n)
        x = models.speedup(res, model, n, "ort")
        met_ort = models.meets_ort_target(model, n, x, pct) if model in models.ORT_TARGETS else None
        met_torch = models.meets_torch_target(best[0] / t["median_ms"] if best else None, pct)
        out[(model, n)] = (x, pct, met_ort, met_torch)
    return out


def across(paths):
    runs = [row_verdicts(p) for p in paths]
    print(f"## {len(paths)} runs: " + ", ".join(Path(p).stem for p in paths))
    print("model        thr | ORT target met | x ORT min-max | % of probe min-max | 2x torch or 85% met")
    keys = sorted({k for r in runs for k in r}, key=lambda k: (list(models.ORT_TARGETS).index(k[0])
                                                               if k[0] in models.ORT_TARGETS else 99, k[1]))
    for k in keys:
        vals = [r[k] for r in runs if k in r]
        xs = [v[0] for v in vals if v[0] is not None]
        ps = [v[1] for v in vals]
        ort_n = [v[2] for v in vals if v[2] is not None]
        xr = f"{min(xs):.2f}-{max(xs):.2f}x" if xs else "-"
        print(f"{k[0]:<12} {k[1]:>3} | {sum(ort_n):>4} of {len(ort_n):<5} | {xr:>13} | "
              f"{min(ps):7.0f}-{max(ps):.0f}%      | {sum(v[3] for v in vals):>4} of {len(vals)}")
    print()


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    if sys.argv[1] == "--across":
        if len(sys.argv) < 3:
            print(__doc__.strip())
            return 2
        across(sys.argv[2:])
        return 0
    for path in sys.argv[1:]:
        report(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
