#!/usr/bin/python3
"""Cold start of two or more tessera builds, alternating, each process after an idle gap.

benchmarks/models.py reports one cold start per process (load_ms + first_run_ms of
`tessera bench --json`), three per row: too few to tell two builds apart when the first run moves
by tens of ms with the machine's state. This runs the builds' processes in turns (A B, B A, ...),
each after --gap seconds of idle (models.py waits for an idle machine too), on one model directory
that models.py prepared, and prints per build the median cold start, the first run's excess over
the steady run, and the steady run.

  benchmarks/cold_start_ab.py --bins /tmp/tessera_old,build/apps/tessera --threads 2 \\
      --shape ids=1,512 --n 8 --gap 2      # the gpt model of models.py's work directory
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def main():
    work = f"/tmp/tessera-models-{os.getuid()}"  # models.py's default --workdir
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bins", required=True, help="comma-separated tessera executables")
    p.add_argument("--model", default=os.path.join(work, "models", "gpt"),
                   help="a model directory of models.py's work directory (net.json, weights.safetensors)")
    p.add_argument("--shape", default="ids=1,512", help="--shape for tessera bench")
    p.add_argument("--threads", default="2")
    p.add_argument("--n", type=int, default=8, help="processes per build")
    p.add_argument("--gap", type=float, default=2.0, help="idle seconds before each process")
    p.add_argument("--panel-cache", default=os.path.join(work, "panel-cache"))
    a = p.parse_args()
    bins = a.bins.split(",")
    for b in bins:
        if not os.access(b, os.X_OK):
            sys.exit(f"not an executable: {b}")
    res = {b: [] for b in bins}
    for i in range(a.n):
        for b in (bins if i % 2 == 0 else bins[::-1]):
            time.sleep(a.gap)
            cmd = [b, "bench", os.path.join(a.model, "net.json"), "--weights",
                   os.path.join(a.model, "weights.safetensors"), "--shape", a.shape, "--threads", a.threads,
                   "--warmup", "1", "--reps", "3", "--json", "--panel-cache", a.panel_cache]
            out = subprocess.run(cmd, capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not lines:
                sys.exit(f"{b} failed (rc {out.returncode}): {out.stderr.strip()[-300:]}")
            r = json.loads(lines[-1])
            res[b].append((r["load_ms"] + r["first_run_ms"], r["first_run_ms"] - r["median_ms"], r["median_ms"]))
    for b, v in res.items():
        cold = [x[0] for x in v]
        print(f"{b}: cold start median {statistics.median(cold):.1f} ms ({min(cold):.0f}-{max(cold):.0f}), "
              f"first run over the steady run {statistics.median(x[1] for x in v):.1f} ms, "
              f"steady run {statistics.median(x[2] for x in v):.1f} ms")


if __name__ == "__main__":
    main()
