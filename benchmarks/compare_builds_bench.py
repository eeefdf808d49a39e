#!/usr/bin/python3
"""Two tessera builds on benchmarks/peers.py's MultiheadAttention table, alternately, in one run.

Issue 13's speed and memory check for a refactor: every row of the table (shape B,T,D,H, causal,
threads) is timed with OLD and NEW one after the other, for several rounds (the order within a
pair alternates from round to round), so that drift of the machine hits both builds alike.

  benchmarks/compare_builds_bench.py OLD_TESSERA NEW_TESSERA [--rounds 5] [--out FILE]
  benchmarks/compare_builds_bench.py OLD NEW --rows 1,128,512,8:0 --threads 2 --rounds 3
  benchmarks/compare_builds_bench.py OLD NEW --all          # all 24 rows of peers.py's table

Default rows (about 10-15 min on 2 idle-ish cores): peers.py's shapes 1,128,512,8 8,128,512,8
1,512,768,12 1,2048,768,12 causal 0 and 1, and 1,8192,512,8 causal 1; threads 1 and 2.

Each process is `tessera bench NET --shape x=B,T,D --threads N --warmup W --reps R --json` on the
network peers.py generates (its mha_net: one multihead_attention node, batch_first,
need_weights false, is_causal per row). W and R come from one calibration run of NEW per row
(1 warm-up, 1 timed call): R aims at --target-s of timed work per process, at least --min-reps;
W at 0.2 s of warm-up, at least 1; a row whose one call takes longer than --big-s gets 1 warm-up
and --big-reps reps. The reps and warm-ups are the same for both builds. --idle-wait S makes
each pair wait up to S seconds for the machine to be quiet first (default: no waiting).

Per row: the median over rounds of each build's per-process median_ms, new/old, the paired
per-round ratios (new_i / old_i: their range and in how many rounds NEW was slower), the CPU time
per call of each build's processes (user+sys of all threads, start-up included, over warm-ups +
reps: on a shared machine it moves less with other load than wall time does), and the
largest peak_rss_mb over the rounds of each build. A row is flagged `SLOWER` when NEW was slower
in every round (of at least 3) and the ratio of medians exceeds 1 + --tolerance; `rss+` when NEW's peak RSS is
higher by more than 1 MB. Other load on the machine is measured per process as peers.py does
(CPU time of other processes during it, in cores) and the row's largest value is printed.

Header: the CPU (lscpu model name, whether it has avx512f), the Highway target the kernels
dispatch to (benchmarks/fma_probe of the NEW build, which links the same libhwy; and the targets
compiled into each binary, from its symbols) and OpenBLAS's core. Only /usr/bin/python3 and the
standard library; peers.py is imported for its network, machine description and table helpers.
"""
import argparse
import datetime
import json
import math
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# The MultiheadAttention table's rows timed by default: peers.py's shapes less 1,4096,512,8, and
# 1,8192,512,8 causal only (its non-causal rows alone would take half the time budget here).
DEFAULT_ROWS = "1,128,512,8:0,1 8,128,512,8:0,1 1,512,768,12:0,1 1,2048,768,12:0,1 1,8192,512,8:1"

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peers  # noqa: E402  (stdlib only; main() is not run on import)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="the old tessera CLI")
    p.add_argument("new", help="the new tessera CLI")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rows", default=DEFAULT_ROWS,
                   help="'B,T,D,H:CAUSAL[,CAUSAL]' ... (default: %(default)s)")
    p.add_argument("--all", action="store_true",
                   help="every row of peers.py's table (its DEFAULT_SHAPES x causal 0,1): about 2x the time")
    p.add_argument("--threads", default="1 2")
    p.add_argument("--target-s", type=float, default=0.5, help="timed work per process, seconds")
    p.add_argument("--warmup-s", type=float, default=0.2, help="warm-up per process, seconds")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--big-s", type=float, default=1.0,
                   help="rows whose one call takes longer than this get --big-reps reps and 1 warm-up")
    p.add_argument("--big-reps", type=int, default=2)
    p.add_argument("--idle-max-cores", type=float, default=0.5,
                   help="before each OLD/NEW pair wait (up to --idle-wait s) until other processes use less")
    p.add_argument("--idle-wait", type=float, default=0.0,
                   help="max seconds to wait for a quiet machine before each pair (default 0: never wait)")
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="a row is SLOWER when NEW lost every round and new/old > 1 + this")
    p.add_argument("--probe", default=None,
                   help="fma_probe for the Highway target (default: benchmarks/fma_probe of NEW's build)")
    p.add_argument("--old-label", default="(no --old-label)", help="what OLD was built from, for the header")
    p.add_argument("--new-label", default=None,
                   help="what NEW was built from (default: git describe of this checkout)")
    p.add_argument("--out", default=None, help="also write the report here")
    a = p.parse_args()
    if a.all:
        a.rows = " ".join(s + ":0,1" for s in peers.DEFAULT_SHAPES.split())
    a.row_list = []
    for item in a.rows.split():
        shape, _, causal = item.partition(":")
        for c in (causal or "0,1").split(","):
            a.row_list.append(tuple(int(x) for x in shape.split(",")) + (int(c),))
    a.thread_list = [int(n) for n in a.threads.replace(",", " ").split()]
    a.old, a.new = os.path.abspath(a.old), os.path.abspath(a.new)
    if a.probe is None:
        a.probe = os.path.join(os.path.dirname(os.path.dirname(a.new)), "benchmarks/fma_probe")
    return a


def run_bench(exe, net, B, T, D, n, warm, reps):
    """one `tessera bench` process -> (its JSON record or None, info)"""
    cmd = [exe, "bench", net, "--shape", f"x={B},{T},{D}", "--threads", str(n), "--warmup", str(warm),
           "--reps", str(reps), "--json"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0 = peers.cpu_busy_ticks()
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    b1 = peers.cpu_busy_ticks()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (ru.ru_utime + ru.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    foreign = max(0.0, (b1 - b0) / peers.HZ - own) / max(wall, 1e-3)
    rec = None
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
    if p.returncode != 0 or rec is None:
        raise SystemExit(f"failed (exit {p.returncode}): {' '.join(map(shlex.quote, cmd))}\n{p.stderr}")
    rec["cpu_ms_per_call"] = own * 1e3 / (warm + reps)
    return rec, {"wall_s": wall, "foreign": foreign}


def wait_idle(a):
    """Waits (up to --idle-wait s) until other processes use < --idle-max-cores; returns seconds waited."""
    if a.idle_wait <= 0:
        return 0.0
    t0 = time.time()
    while True:
        b0 = peers.cpu_busy_ticks()
        time.sleep(1)
        if peers.cpu_busy_ticks() - b0 <= a.idle_max_cores * peers.HZ or time.time() - t0 >= a.idle_wait:
            return time.time() - t0 - 1


def compiled_targets(exe):
    try:
        out = subprocess.run(["nm", "-C", exe], capture_output=True, text=True, timeout=120).stdout
    except OSError:
        return "?"
    return " ".join(sorted(set(re.findall(r"tessera::N_([A-Z0-9_]+)::", out)))) or "?"


def header(a):
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.strip()
        except OSError:
            return "?"
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    model = re.search(r"^Model name:\s*(.*)$", out(["lscpu"]), re.M)
    avx = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16") if f in flags]
    target = "?"
    if os.access(a.probe, os.X_OK):
        try:
            target = json.loads(out([a.probe, "--threads", "1", "--json", "--ms", "50"]))["target"]
        except ValueError:
            pass
    core = out(["/usr/bin/python3", "-c", "import ctypes; l = ctypes.CDLL('libopenblas.so.0'); "
                "l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())"])
    new_label = a.new_label or out(["git", "-C", REPO, "describe", "--always", "--dirty"])
    return "\n".join([
        f"# tessera old vs new: MultiheadAttention table (benchmarks/peers.py's rows), "
        f"{datetime.datetime.now().isoformat(timespec='seconds')}",
        peers.machine(),
        f"# CPU: {model.group(1).strip() if model else '?'}; avx512f {'present' if 'avx512f' in flags else 'ABSENT'}"
        f" (flags: {' '.join(avx)})",
        f"# Highway: dispatched target {target} (benchmarks/fma_probe, same libhwy); compiled targets: "
        f"old {compiled_targets(a.old)}; new {compiled_targets(a.new)}",
        f"# OpenBLAS core: {core} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')})",
        f"# old: {a.old_label} ({a.old})",
        f"# new: {new_label} ({a.new})",
    ])


def main():
    a = parse()
    for exe in (a.old, a.new):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe} is not an executable")
    t_start = time.time()
    cmdline = " ".join(shlex.quote(x) for x in [os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])
    head = header(a)
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    work = tempfile.mkdtemp(prefix="tessera-ab-")
    rows = []
    for (B, T, D, H, c) in a.row_list:
        net = os.path.join(work, f"mha_D{D}_H{H}_c{c}.json")
        with open(net, "w") as f:
            json.dump(peers.mha_net(D, H, c), f, indent=1)
        for n in a.thread_list:
            rows.append({"B": B, "T": T, "D": D, "H": H, "causal": c, "threads": n, "net": net,
                         "old": [], "new": [], "foreign": []})
    # calibration: one NEW process per row (1 warm-up, 1 timed call)
    est = 0.0
    for r in rows:
        rec, _ = run_bench(a.new, r["net"], r["B"], r["T"], r["D"], r["threads"], 1, 1)
        one = max(rec["median_ms"] / 1e3, 1e-5)
        r["reps"] = max(a.min_reps, min(a.max_reps, math.ceil(a.target_s / one)))
        r["warmup"] = max(1, min(200, math.ceil(a.warmup_s / one)))
        if one > a.big_s:
            r["reps"], r["warmup"] = a.big_reps, 1
        est += 2 * a.rounds * (one * (r["reps"] + r["warmup"]) + 0.05)
        log(f"calibrated {r['B']},{r['T']},{r['D']},{r['H']} c={r['causal']} t={r['threads']}: "
            f"{one * 1e3:.2f} ms/call -> warmup {r['warmup']} reps {r['reps']}")
    log(f"estimated time: {est / 60:.1f} min for {a.rounds} rounds x {len(rows)} rows x 2 builds")
    waited = 0.0
    for k in range(a.rounds):
        order = ("old", "new") if k % 2 == 0 else ("new", "old")
        for r in rows:
            waited += wait_idle(a)
            for which in order:
                exe = a.old if which == "old" else a.new
                rec, info = run_bench(exe, r["net"], r["B"], r["T"], r["D"], r["threads"], r["warmup"], r["reps"])
                r[which].append(rec)
                r["foreign"].append(info["foreign"])
            log(f"round {k + 1}/{a.rounds} {r['B']},{r['T']},{r['D']},{r['H']} c={r['causal']} t={r['threads']}: "
                f"old {r['old'][-1]['median_ms']:.3f} new {r['new'][-1]['median_ms']:.3f} ms")
    shutil.rmtree(work, ignore_errors=True)
    load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    wall = (time.time() - t_start) / 60

    table_rows = []
    slower, rss_up, worst = [], [], (0.0, None)
    for r in rows:
        om = [x["median_ms"] for x in r["old"]]
        nm = [x["median_ms"] for x in r["new"]]
        o, n = statistics.median(om), statistics.median(nm)
        paired = [y / x for x, y in zip(om, nm)]
        lost = sum(1 for p in paired if p > 1)
        oc = statistics.median(x["cpu_ms_per_call"] for x in r["old"])
        nc = statistics.median(x["cpu_ms_per_call"] for x in r["new"])
        orss = max(x["peak_rss_mb"] for x in r["old"])
        nrss = max(x["peak_rss_mb"] for x in r["new"])
        ratio = n / o
        name = f"{r['B']},{r['T']},{r['D']},{r['H']}"
        flag = []
        if len(paired) >= 3 and lost == len(paired) and ratio > 1 + a.tolerance:
            flag.append("SLOWER")
            slower.append(f"{name} c={r['causal']} t={r['threads']}")
        if nrss > orss + 1.0:
            flag.append("rss+")
            rss_up.append(f"{name} c={r['causal']} t={r['threads']}")
        if ratio > worst[0]:
            worst = (ratio, f"{name} causal={r['causal']} threads={r['threads']}")
        spread = lambda v: (max(v) - min(v)) / statistics.median(v) * 100  # noqa: E731
        table_rows.append([
            name, str(r["causal"]), str(r["threads"]), f"{r['warmup']}+{r['reps']}",
            f"{o:.3f}", f"{n:.3f}", f"{ratio:.3f}",
            f"{min(paired):.3f}..{max(paired):.3f}", f"{lost}/{len(paired)}",
            f"{spread(om):.1f}/{spread(nm):.1f}", f"{oc:.2f}", f"{nc:.2f}", f"{nc / oc:.3f}",
            f"{orss:.1f}", f"{nrss:.1f}", f"{max(r['foreign']):.2f}", " ".join(flag)])
    hdr = ["B,T,D,H", "causal", "thr", "warm+reps", "old ms", "new ms", "new/old", "paired new/old",
           "new slower", "spread % old/new",
           "old CPU ms", "new CPU ms", "CPU new/old", "old RSS MB", "new RSS MB", "other load", "flag"]
    report = "\n".join([
        head,
        f"# command: cd {REPO} && {cmdline}",
        f"# {a.rounds} rounds; {len(a.row_list) * len(a.thread_list)} rows; per round and row: OLD then NEW (NEW then OLD in odd rounds), one process each, "
        f"the same warm-up + reps; target_s={a.target_s} warmup_s={a.warmup_s} min_reps={a.min_reps} "
        f"(rows slower than {a.big_s:g} s a call: 1 warm-up + {a.big_reps} reps)",
        "# old/new ms = median over rounds of the process's median_ms; paired = range of new_i/old_i over "
        "rounds; spread = (max-min)/median of the per-round medians; CPU ms = the process's CPU time (user+sys, "
        "all threads, start-up included) / (warm-ups + reps), median over rounds: less sensitive to other "
        "load than wall time; RSS = largest peak_rss_mb over rounds; "
        "other load = largest CPU use of other processes during one of the row's processes, in cores "
        f"(of {os.cpu_count()})",
        f"# loadavg start {load0}, end {load1}; wall {wall:.1f} min; waited {waited:.0f} s for a quiet machine "
        f"(--idle-wait {a.idle_wait:g} s per pair, --idle-max-cores {a.idle_max_cores:g})",
        "",
        peers.table(hdr, table_rows, left={0, len(hdr) - 1}),
        "",
        f"largest new/old: {worst[0]:.3f} ({worst[1]})",
        f"rows flagged SLOWER (NEW slower in every round and new/old > {1 + a.tolerance:.2f}): "
        f"{', '.join(slower) if slower else 'none'}",
        f"rows where NEW's peak RSS is higher by > 1 MB: {', '.join(rss_up) if rss_up else 'none'}",
        "",
        "# raw per-round medians (ms), old | new:",
    ] + [f"#   {r['B']},{r['T']},{r['D']},{r['H']} c={r['causal']} t={r['threads']}: "
         + " ".join("%.3f" % x["median_ms"] for x in r["old"]) + " | "
         + " ".join("%.3f" % x["median_ms"] for x in r["new"]) for r in rows])
    print(report)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
