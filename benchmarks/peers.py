#!/usr/bin/python3
"""tessera against PyTorch and ONNX Runtime: CPU multi-head self-attention, one run, one table.

Issue 6's benchmark suite. For every (shape, causal, threads) it runs tessera and the peers one
after another (one fresh process per runtime and config, each warmed up, so machine drift hits
all of them alike), and prints one table: ms, GFLOP/s, % of the FMA peak measured by
build/benchmarks/fma_probe in the same run, peak RSS, and tessera's speed-up over each peer. Then
the extras (memory at T=16384, need_weights=true against PyTorch, the `attention` op with rope
and relative position bias against its plain form), the issue's targets checked one by one, and
a PNG of GFLOP/s against T.

  benchmarks/peers.py                       # everything, ~30-40 min on an idle machine
  benchmarks/peers.py --quick               # a small subset to check the pipeline
  benchmarks/peers.py --shapes 1,2048,768,12 --threads 2 --causal 0 --no-extras
  benchmarks/peers.py --rounds 3 --peers ort-fused --no-extras   # main table, 3 rounds each

Peers come from the shared harness (../shared/bench/peers: torch_mha.py, ort_mha.js), copied to a
work directory (default /tmp/tessera-peers-<uid>) where `npm ci` installs onnxruntime-node; the
runner installs what is missing (python3-torch, python3-matplotlib via apt-get, node modules via
npm) itself. Peers: torch (Debian python3-torch, default malloc), torch-heap (the same with glibc
told to keep freed memory: no page faults per call), ort-fused (onnxruntime-node,
com.microsoft.MultiHeadAttention), ort-plain (plain ONNX ops, optional: --peers).

tessera runs `tessera bench NET --shape x=B,T,D --threads N --warmup K --reps R --json` on a
network file generated into the work directory: one multihead_attention node (batch_first,
need_weights false, is_causal per row) fed by the input x, or one `attention` node.

FLOPs are B*(8*T*D^2 + 4*T^2*D) for every runtime, the dense count also for causal rows (so a
causal row's GFLOP/s is "effective": proportional to 1/time). tessera's own reported GFLOP/s
(its plan's FLOP count) is kept in the raw JSON as tessera_gflops.

Like the harness's run_all.sh, before each process the runner waits (up to --idle-wait s) until
other processes use less than --idle-max-cores of the CPUs, and flags a row CONTENDED when other
load overlapped it anyway. Outputs: benchmarks/results/<label>.txt (machine, exact command,
tables, targets), <label>.jsonl (raw rows) and <label>.png. Only /usr/bin/python3 with the
standard library (and matplotlib for the plot).

With --hwy-target AVX2 on a CPU with AVX-512 the peers run under benchmarks/hide_avx512.cpp (an
LD_PRELOAD module that hides AVX-512 from their CPUID: ONNX Runtime's MLAS and PyTorch take their
AVX2 kernels, as on an AVX2 desktop; --peer-isa native keeps them on AVX-512).

With --rounds R the main table's processes run R times per config, the runtimes' order rotating
from round to round, and a row's ms is the median of its R processes' medians (spread = (max -
min) / median of those): on a shared host whose speed drifts by 20-30% within minutes (the Xeon
of 2026-12-06), one process per runtime lets the drift decide rows near a target, and R rounds in
rotating order give every runtime the same share of slow and fast minutes.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SHAPES = "1,128,512,8 8,128,512,8 1,512,768,12 1,2048,768,12 1,4096,512,8 1,8192,512,8"
HZ = os.sysconf("SC_CLK_TCK")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", default=os.path.join(REPO, "build/apps/tessera"),
                   help="the tessera CLI (default: build/apps/tessera)")
    p.add_argument("--probe", default=None,
                   help="fma_probe executable (default: benchmarks/fma_probe next to --tessera's build)")
    p.add_argument("--harness", default=os.environ.get("PEERS_HARNESS",
                                                       os.path.join(os.path.dirname(REPO), "shared/bench/peers")),
                   help="the peer harness to copy (torch_mha.py, ort_mha.js, package*.json)")
    p.add_argument("--workdir", default=f"/tmp/tessera-peers-{os.getuid()}",
                   help="where the harness copy, node_modules and generated networks live")
    p.add_argument("--shapes", default=os.environ.get("SHAPES", DEFAULT_SHAPES), help="B,T,D,H ...")
    p.add_argument("--causal", default=os.environ.get("CAUSAL", "0 1"))
    p.add_argument("--threads", default=os.environ.get("THREADS", "1 2"))
    p.add_argument("--peers", default=os.environ.get("PEERS", "torch torch-heap ort-fused"),
                   help="any of: torch torch-heap ort-fused ort-plain ('' for tessera alone)")
    p.add_argument("--target-s", type=float, default=float(os.environ.get("TARGET_S", "1.5")),
                   help="timed work per config and runtime, seconds (reps = target / one call)")
    p.add_argument("--max-call-s", type=float, default=float(os.environ.get("MAX_CALL_S", "20")),
                   help="peers skip a config whose calls take longer than this")
    p.add_argument("--min-reps", type=int, default=5)
    # the harness's peers cap their reps at 1000 too: at 200, a 2 ms call timed 0.4 s against the
    # peers' 1.5 s, and a burst of host noise moved its median more
    p.add_argument("--max-reps", type=int, default=1000, help="tessera's timed calls at most")
    p.add_argument("--warmup", type=int, default=3, help="tessera warm-up runs")
    p.add_argument("--rounds", type=int, default=1,
                   help="processes per runtime and main-table config, in rotating order; "
                        "ms = median of their medians")
    p.add_argument("--memory-shapes", default="1,16384,512,8",
                   help="tessera alone, causal 0 and 1, 2 threads: the peak RSS target")
    p.add_argument("--weights-shapes", default="1,512,768,12 1,2048,768,12",
                   help="need_weights=true against PyTorch (causal 0, --threads)")
    p.add_argument("--attention-shapes", default="1,1024,512,8 1,4096,512,8",
                   help="the `attention` op plain / rope / relative position bias (square T)")
    p.add_argument("--no-extras", action="store_true", help="only the main table")
    p.add_argument("--quick", action="store_true",
                   help="a subset to validate the pipeline: 2 small shapes, 2 threads, short timings")
    p.add_argument("--idle-max-cores", type=float, default=float(os.environ.get("IDLE_MAX_CORES", "0.25")))
    p.add_argument("--idle-wait", type=float, default=float(os.environ.get("IDLE_WAIT_MAX_S", "1800")),
                   help="max seconds to wait for an idle machine before each process (0: never wait)")
    p.add_argument("--resume", default=None,
                   help="a previous run's .jsonl: reuse its uncontended rows, rerun the rest")
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks/results"))
    p.add_argument("--label", default=None, help="output file stem (default: today's date)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-setup", action="store_true", help="do not apt-get/npm install anything")
    p.add_argument("--hwy-target", default=None, metavar="NAME",
                   help="run tessera's kernels and the FMA probe on this Highway target only "
                        "(TESSERA_HWY_TARGET, fma_probe --target): how an AVX-512 machine reports "
                        "the AVX2 path")
    add_peer_isa_option(p, "--hwy-target")
    p.add_argument("--report-only", default=None, metavar="RUN.jsonl",
                   help="rebuild RUN.txt and RUN.png from a run's raw rows, running nothing")
    p.add_argument("--rev", default=None,
                   help="what tessera build this is, for the header (default: git describe of this checkout)")
    a = p.parse_args()
    if a.quick:
        a.shapes = "1,128,512,8 1,2048,768,12"
        a.threads = "2"
        a.target_s = min(a.target_s, 0.5)
        a.memory_shapes = "1,16384,512,8"
        a.weights_shapes = "1,512,768,12"
        a.attention_shapes = "1,1024,512,8"
        a.idle_wait = min(a.idle_wait, 0)
    if a.probe is None:
        a.probe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.tessera))),
                               "benchmarks/fma_probe")
    a.shape_list = [tuple(int(x) for x in s.split(",")) for s in a.shapes.split()]
    a.causal_list = [int(c) for c in a.causal.split()]
    a.thread_list = [int(n) for n in a.threads.split()]
    a.peer_list = a.peers.split()
    a.label = a.label or datetime.date.today().isoformat()
    return a


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def flops(B, T, D):
    return B * (8 * T * D * D + 4 * T * T * D)


# ---------------------------------------------------------------- setup
def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), check=True, **kw)


def apt_install(pkgs):
    log(f"installing {' '.join(pkgs)} (apt-get)")
    pre = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(pre + ["apt-get", "install", "-y"] + pkgs, env=env,
                      stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(pre + ["apt-get", "update"], env=env, stdout=subprocess.DEVNULL)
        sh(pre + ["apt-get", "install", "-y"] + pkgs, env=env, stdout=subprocess.DEVNULL)


def has_module(mod):
    return subprocess.run(["/usr/bin/python3", "-c", f"import {mod}"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def setup(a):
    for exe, what in ((a.tessera, "tessera"), (a.probe, "fma_probe")):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{what} not found at {exe}: build it (ninja -C build) or pass --tessera/--probe")
    os.makedirs(a.workdir, exist_ok=True)
    h = os.path.join(a.workdir, "harness")
    needs_torch = any(p.startswith("torch") for p in a.peer_list) or not a.no_extras
    needs_ort = any(p.startswith("ort") for p in a.peer_list)
    if not a.no_setup:
        missing = []
        if needs_torch and not has_module("torch"):
            missing.append("python3-torch")
        if not a.no_plot and not has_module("matplotlib"):
            missing.append("python3-matplotlib")
        if missing:
            apt_install(missing)
    # A fresh copy of the harness scripts (the shared folder may be read-only); node_modules
    # survive between runs unless package-lock.json changed.
    os.makedirs(h, exist_ok=True)
    lock_old = open(os.path.join(h, "package-lock.json")).read() \
        if os.path.exists(os.path.join(h, "package-lock.json")) else None
    for f in ("torch_mha.py", "ort_mha.js", "package.json", "package-lock.json", "README.md"):
        src = os.path.join(a.harness, f)
        if os.path.exists(src):
            dst = os.path.join(h, f)
            if os.path.exists(dst):
                os.chmod(dst, 0o644)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755 if f.endswith((".py", ".js")) else 0o644)
    if needs_ort and not a.no_setup:
        lock_new = open(os.path.join(h, "package-lock.json")).read()
        if not os.path.isdir(os.path.join(h, "node_modules/onnxruntime-node")) or lock_old != lock_new:
            log("npm ci (onnxruntime-node) in " + h)
            sh(["npm", "ci", "--no-audit", "--no-fund"], cwd=h,
               env=dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip"), stdout=subprocess.DEVNULL)
    # need_weights=true variant of the torch script (the harness times need_weights=False only)
    src = open(os.path.join(h, "torch_mha.py")).read()
    old_call = "return m(x, x, x, need_weights=False, attn_mask=mask)[0]"
    old_peer = '"peer": "torch-heap" if a.malloc == "heap" else "torch"'
    if src.count(old_call) != 1 or src.count(old_peer) != 1:
        log("warning: torch_mha.py changed shape; the need_weights=true rows are skipped")
    else:
        src = src.replace(old_call, "return m(x, x, x, need_weights=True, attn_mask=mask)")
        src = src.replace(old_peer, '"peer": ("torch-heap" if a.malloc == "heap" else "torch") + "-nw"')
        with open(os.path.join(h, "torch_mha_nw.py"), "w") as f:
            f.write(src)
    os.makedirs(os.path.join(a.workdir, "nets"), exist_ok=True)
    return h


# ---------------------------------------------------------------- networks
def mha_net(D, H, causal, need_weights=False):
    return {
        "dtype": "float32",
        "inputs": {"x": ["B", "T", D]},
        "nodes": [{"name": "mha", "op": "multihead_attention",
                   "args": {"embed_dim": D, "num_heads": H, "batch_first": True,
                            "need_weights": need_weights, "is_causal": bool(causal)},
                   "inputs": {"query": "x"}}],
        "outputs": {"y": "mha"},
    }


def attention_net(D, H, T, variant, causal=False):
    args = {"heads": H}
    if causal:
        args["causal"] = True
    if variant == "rope":
        args["rope"] = True
    elif variant == "relbias":
        side = int(round(math.sqrt(T)))
        if side * side != T:
            raise ValueError(f"relative position bias needs a square T, got {T}")
        args["relative_position_bias"] = True
        args["spatial_shape"] = [side, side]
    return {
        "dtype": "float32",
        "inputs": {"x": ["B", "T", D]},
        "nodes": [{"name": "attn", "op": "attention@1" if variant == "relbias" else "attention",
                   "args": args, "inputs": {"x": "x"}}],
        "outputs": {"y": "attn"},
    }


def write_net(a, name, spec):
    path = os.path.join(a.workdir, "nets", name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    return path


# ---------------------------------------------------------------- running one process
def cpu_busy_ticks():
    with open("/proc/stat") as f:
        v = f.readline().split()
    return sum(int(v[i]) for i in (1, 2, 3, 6, 7, 8))


def wait_idle(a):
    lim = a.idle_max_cores * HZ
    waited = 0.0
    while True:
        b0 = cpu_busy_ticks()
        time.sleep(1)
        if cpu_busy_ticks() - b0 <= lim:
            return True
        if waited >= a.idle_wait:
            if a.idle_wait > 0:
                log(f"machine still busy after {waited:.0f}s; running anyway (row will be flagged)")
            return False
        if waited == 0:
            log(f"machine busy ({os.getloadavg()[0]:.1f} load): waiting up to {a.idle_wait:.0f}s")
        time.sleep(9)
        waited += 10


def run_proc(a, cmd, cwd=None, env=None, timeout=None):
    """Runs cmd after waiting for idle; returns (last JSON line or None, info dict)."""
    wait_idle(a)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0 = cpu_busy_ticks()
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    wall = time.time() - t0
    b1 = cpu_busy_ticks()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    # children's cumulative CPU: the difference across this call is this process's own
    own = (ru.ru_utime + ru.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    info = {"rc": proc.returncode, "proc_wall_s": round(wall, 2), "proc_cpu_s": round(own, 2),
            "foreign_load": round(max(0.0, (b1 - b0) / HZ - own) / max(wall, 1e-3), 3),
            "stderr": err.strip()[-300:]}
    rec = None
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                pass
    return rec, info


def finish(rec, info, a):
    rec.update({k: v for k, v in info.items() if k != "stderr"})
    if rec.get("foreign_load", 0) >= a.idle_max_cores:
        rec["note"] = f"CONTENDED(other procs {rec['foreign_load']:.2f} cores) " + rec.get("note", "")
    return rec


def clean(r):
    return r.get("status") in ("ok", "skip") and "CONTENDED" not in (r.get("note") or "")


class Resume:
    def __init__(self, path):
        self.rows = {}
        if path:
            with open(path) as f:
                for line in f:
                    if line.startswith("{"):
                        r = json.loads(line)
                        if clean(r):
                            self.rows[self.key(r)] = r

    @staticmethod
    def key(r):
        return (r.get("peer"), r.get("section", "main"), r.get("variant", ""), r.get("B"), r.get("T"),
                r.get("D"), r.get("H"), r.get("causal"), r.get("threads"), r.get("round", 0))

    def get(self, **k):
        r = self.rows.get(self.key(k))
        if r:
            r = dict(r, reused=True)
        return r


def run_tessera(a, net, B, T, D, H, causal, threads, **tags):
    base = {"peer": "tessera", "B": B, "T": T, "D": D, "H": H, "causal": causal, "threads": threads,
            "flops": flops(B, T, D), **tags}
    hit = a.resume.get(**{k: base.get(k) for k in ("peer", "B", "T", "D", "H", "causal", "threads")},
                       section=tags.get("section", "main"), variant=tags.get("variant", ""),
                       round=tags.get("round", 0))
    if hit:
        log(f"tessera {tags} B={B} T={T} D={D} H={H} causal={causal} threads={threads} -> reused")
        return hit
    cmd = [a.tessera, "bench", net, "--shape", f"x={B},{T},{D}", "--threads", str(threads), "--json"]
    # reps from one calibration process (1 warm-up, 1 timed): aims at --target-s of timed work
    rec, info = run_proc(a, cmd + ["--warmup", "1", "--reps", "1"], timeout=600)
    if not rec:
        return finish(dict(base, status="error", note=f"rc={info['rc']} {info['stderr']}"), info, a)
    one = max(rec["median_ms"] / 1e3, 1e-5)
    reps = max(a.min_reps, min(a.max_reps, int(math.ceil(a.target_s / one))))
    warm = max(a.warmup, int(math.ceil(0.3 / one)))  # >= 0.3 s of warm-up as the peers do
    warm = min(warm, 200)
    full = cmd + ["--warmup", str(warm), "--reps", str(reps)]
    rec, info = run_proc(a, full, timeout=1800)
    if not rec:
        return finish(dict(base, status="error", note=f"rc={info['rc']} {info['stderr']}"), info, a)
    r = dict(base, status="ok", reps=reps, warmup=warm, median_ms=rec["median_ms"],
             min_ms=rec["min_ms"], max_ms=rec["max_ms"], tessera_gflops=round(rec["gflops"], 2),
             gflops=round(base["flops"] / (rec["median_ms"] * 1e-3) / 1e9, 2),
             peak_rss_mb=round(rec["peak_rss_mb"], 1), command=" ".join(shlex.quote(c) for c in full),
             simd_target=rec.get("simd_target", "?"))
    return finish(r, info, a)


def run_peer(a, h, peer, B, T, D, H, causal, threads, section="main", rnd=0):
    hit = a.resume.get(peer=peer, section=section, variant="", B=B, T=T, D=D, H=H, causal=causal,
                       threads=threads, round=rnd)
    if hit:
        log(f"{peer} B={B} T={T} D={D} H={H} causal={causal} threads={threads} -> reused")
        return hit
    common = ["--B", str(B), "--T", str(T), "--D", str(D), "--H", str(H), "--causal", str(causal),
              "--threads", str(threads), "--max-call-s", str(a.max_call_s), "--target-s", str(a.target_s)]
    torch_cmd = ["/usr/bin/python3"]
    core = torch_openblas_core(a)
    cmds = {
        "torch": torch_cmd + ["torch_mha.py"] + common + ["--openblas-coretype", core],
        "torch-heap": torch_cmd + ["torch_mha.py"] + common + ["--openblas-coretype", core, "--malloc", "heap"],
        "torch-nw": torch_cmd + ["torch_mha_nw.py"] + common + ["--openblas-coretype", core],
        "torch-heap-nw": torch_cmd + ["torch_mha_nw.py"] + common + ["--openblas-coretype", core,
                                                                     "--malloc", "heap"],
        "ort-fused": ["node", "ort_mha.js", "--variant", "fused"] + common,
        "ort-plain": ["node", "ort_mha.js", "--variant", "plain"] + common,
    }
    base = {"peer": peer, "B": B, "T": T, "D": D, "H": H, "causal": causal, "threads": threads,
            "section": section, "round": rnd}
    if peer not in cmds:
        return dict(base, status="error", note="unknown peer")
    if peer.endswith("-nw") and not os.path.exists(os.path.join(h, "torch_mha_nw.py")):
        return dict(base, status="skip", note="no need_weights variant of torch_mha.py")
    hard = int(a.max_call_s * 12 + 60)
    rec, info = run_proc(a, cmds[peer], cwd=h, env=peer_env(a), timeout=hard)
    if not rec:
        why = f"killed after {hard}s" if info["rc"] in (-9, 124, 137) else f"rc={info['rc']}"
        rec = dict(base, status="skip", note=f"{why} {info['stderr'][-150:]}")
    rec["section"] = section
    rec["peer"] = peer
    rec["round"] = rnd
    if rec.get("status") == "ok":
        rec["gflops"] = round(flops(B, T, D) / (rec["median_ms"] * 1e-3) / 1e9, 2)
    return finish(rec, info, a)


# ---------------------------------------------------------------- the peers' ISA
def add_peer_isa_option(p, target_option):
    p.add_argument("--peer-isa", choices=("auto", "avx2", "native"), default="auto",
                   help="avx2: start the peers under benchmarks/hide_avx512.cpp (LD_PRELOAD), so that "
                        "ONNX Runtime's MLAS and PyTorch see no AVX-512 in CPUID and run their AVX2 "
                        "kernels, and give PyTorch's OpenBLAS Haswell kernels unless the environment "
                        "sets OPENBLAS_CORETYPE; native: the CPU as it is; auto (default): avx2 when "
                        f"{target_option} AVX2 runs on a CPU with AVX-512")


def cpu_flags():
    """The CPU's feature flags as /proc/cpuinfo lists them (the first CPU's). Shared with models.py."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return line.split(":", 1)[1].split()
    return []


def resolve_peer_isa(a, forced_target, probe_exe):
    """Sets a.peer_preload (the LD_PRELOAD value for peer processes, or None) and a.peer_isa_text
    (the report's line). Checks the module on the FMA probe first: Highway's dispatch reads the
    same CPUID bits as MLAS, so under the module the probe's best target must be AVX2."""
    want = a.peer_isa
    if want == "auto":
        want = "avx2" if forced_target == "AVX2" and "avx512f" in cpu_flags() else "native"
    a.peer_isa = want
    a.peer_preload, a.peer_isa_text = None, "native: the peers see the CPU's own CPUID"
    if want == "native":
        return
    module = os.path.join(os.path.dirname(os.path.abspath(probe_exe)), "libhide_avx512.so")
    if not os.path.exists(module):
        sys.exit(f"--peer-isa avx2: {module} is missing (built with the benchmarks)")
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_HWY_TARGET"}
    env["LD_PRELOAD"] = (module + " " + env.get("LD_PRELOAD", "")).strip()
    r = subprocess.run([probe_exe, "--threads", "1", "--ms", "1", "--rounds", "1", "--json"], env=env,
                       capture_output=True, text=True)
    seen = json.loads(r.stdout).get("target") if r.returncode == 0 and r.stdout.startswith("{") else None
    if seen != "AVX2":
        sys.exit(f"--peer-isa avx2: under {module} the FMA probe's best target is {seen or r.stderr.strip()}, "
                 "not AVX2: the peers would not run their AVX2 kernels")
    a.peer_preload = env["LD_PRELOAD"]
    a.peer_isa_text = ("avx2: the peers ran under benchmarks/hide_avx512.cpp (LD_PRELOAD): AVX-512 hidden from "
                       "CPUID, so ONNX Runtime's MLAS and PyTorch took their AVX2 kernels (checked: the FMA "
                       "probe's best target under it is AVX2; PyTorch's OpenBLAS core: the OpenBLAS line)")


def torch_openblas_core(a):
    """The torch peers' --openblas-coretype: OpenBLAS detects (the harness default), but with the
    peers held to AVX2 the Haswell kernels OpenBLAS picks on AVX2 desktops (on this Xeon it falls
    back to Prescott's SSE3), unless the environment sets OPENBLAS_CORETYPE."""
    if getattr(a, "peer_preload", None) is None:
        return "auto"
    return "env" if "OPENBLAS_CORETYPE" in os.environ else "Haswell"


def peer_env(a, env=None):
    """The environment of a peer process: env (default the runner's) plus the CPUID module."""
    env = dict(os.environ if env is None else env)
    if getattr(a, "peer_preload", None):
        env["LD_PRELOAD"] = a.peer_preload
    return env


def run_fma_probe(exe, threads, target):
    """fma_probe on 1..threads threads (on Highway `target` if given): (GFLOP/s per thread count,
    the target that ran, [{cpu, gflops, read_gbs}] per vCPU). Shared with benchmarks/models.py."""
    out = subprocess.run([exe, "--threads", str(threads), "--json", "--ms", "300", "--per-cpu"]
                         + (["--target", target] if target else []),
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    return {int(k): v for k, v in r["gflops"].items()}, r["target"], r.get("per_cpu", [])


def probe(a):
    return run_fma_probe(a.probe, max(a.thread_list + [2]), a.hwy_target)


def per_cpu_text(start, end):
    """The header line for fma_probe --per-cpu at a run's start and end (lists of {cpu, gflops,
    read_gbs}): a vCPU whose reads run slower than the other's slows memory-bound work the FMA
    probe does not see."""
    if not start and not end:
        return "# per vCPU: not recorded (a run before fma_probe --per-cpu)"
    def one(rates):
        return ", ".join(f"cpu {c['cpu']} {c['gflops']:.1f} / {c['read_gbs']:.1f}" for c in rates) or "?"
    return ("# per vCPU, one pinned thread each (fma_probe --per-cpu: FMA GFLOP/s / read GB/s over 256 MiB): "
            f"start {one(start)}; end {one(end)}")


# ---------------------------------------------------------------- report
def fmt(v, nd=1, dash="-"):
    if v is None:
        return dash
    if isinstance(v, str):
        return v
    return f"{v:.{nd}f}"


def table(header, rows, left=()):
    w = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w[i]) if i in left else c.rjust(w[i]) for i, c in enumerate(cells)).rstrip()
    return "\n".join([line(header), line(["-" * x for x in w])] + [line(r) for r in rows])


def ok(r):
    return r is not None and r.get("status") == "ok"


def ratio(t, p):
    """tessera's speed-up over the peer (peer ms / tessera ms)"""
    if ok(t) and ok(p):
        return p["median_ms"] / t["median_ms"]
    return None


def note_of(*rs):
    n = []
    for r in rs:
        if r is None:
            continue
        s = (r.get("note") or "").strip()
        if "CONTENDED" in s:
            n.append(f"{r['peer']}:CONTENDED")
        elif r.get("status") != "ok":
            n.append(f"{r['peer']}:{r.get('status')} {s[:60]}")
    return "; ".join(n)


def main_table(a, res, peak):
    peers = a.peer_list
    header = ["B,T,D,H", "causal", "thr", "tessera ms", "GFLOP/s", "% peak", "RSS MB"]
    for p in peers:
        header += [f"{p} ms"]
    for p in peers:
        header += [f"x {p}"]
    header += [f"{p} RSS" for p in peers if p.startswith("ort")] + ["note"]
    rows = []
    for (B, T, D, H) in a.shape_list:
        for c in a.causal_list:
            for n in a.thread_list:
                t = res.get(("tessera", B, T, D, H, c, n))
                cells = [f"{B},{T},{D},{H}", str(c), str(n),
                         fmt(t["median_ms"], 2) if ok(t) else (t or {}).get("status", "-"),
                         fmt(t.get("gflops")) if ok(t) else "-",
                         fmt(100 * t["gflops"] / peak[n], 0) + "%" if ok(t) and n in peak else "-",
                         fmt(t.get("peak_rss_mb"), 0) if t else "-"]
                prs = [res.get((p, B, T, D, H, c, n)) for p in peers]
                for pr in prs:
                    cells += [fmt(pr["median_ms"], 2) if ok(pr) else (pr or {}).get("status", "-")]
                for pr in prs:
                    x = ratio(t, pr)
                    cells += [fmt(x, 2) + "x" if x else "-"]
                for p, pr in zip(peers, prs):
                    if p.startswith("ort"):
                        cells += [fmt(pr.get("peak_rss_mb"), 0) if pr else "-"]
                cells += [note_of(t, *prs)]
                rows.append(cells)
    return table(header, rows, left={0, len(header) - 1})


def long_table(a, res, peak):
    """every runtime's row (as the harness prints them), tessera first in each config"""
    multi = getattr(a, "rounds", 1) > 1
    header = (["runtime", "B,T,D,H", "causal", "thr", "ms", "min ms", "GFLOP/s", "% peak", "RSS MB", "reps"]
              + (["rounds ms", "spread"] if multi else []) + ["note"])
    rows = []
    for (B, T, D, H) in a.shape_list:
        for c in a.causal_list:
            for n in a.thread_list:
                for p in ["tessera"] + a.peer_list:
                    r = res.get((p, B, T, D, H, c, n))
                    if r is None:
                        continue
                    good = ok(r)
                    p10 = r.get("min_ms")
                    rows.append([p, f"{B},{T},{D},{H}", str(c), str(n),
                                 fmt(r["median_ms"], 2) if good else r.get("status", "?"),
                                 fmt(p10, 2) if good else "-",
                                 fmt(r.get("gflops")) if good else "-",
                                 fmt(100 * r["gflops"] / peak[n], 0) + "%" if good and n in peak else "-",
                                 fmt(r.get("peak_rss_mb"), 0), str(r.get("reps", "-"))]
                                + ([" / ".join(fmt(x, 2) for x in r.get("round_ms", [])) or "-",
                                    fmt(100 * r["spread"], 0) + "%" if "spread" in r else "-"]
                                   if multi else [])
                                + [(r.get("note") or "").strip()[:90]])
    return table(header, rows, left={0, 1, len(header) - 1})


def check_targets(a, res, extra, peak):
    """The issue's targets, one line each: MET / NOT MET with the numbers."""
    lines = []

    def verdict(good, text):
        lines.append(("MET      " if good else "NOT MET  ") + text)

    def rows_for(pred):
        out = []
        for (B, T, D, H) in a.shape_list:
            for c in a.causal_list:
                for n in a.thread_list:
                    if pred(B, T, D, H, c, n):
                        out.append((B, T, D, H, c, n))
        return out

    def worst(peer, keys, need):
        xs = []
        for k in keys:
            x = ratio(res.get(("tessera",) + k), res.get((peer,) + k))
            if x is not None:
                xs.append((x, k))
        if not xs:
            return None
        xs.sort()
        fails = [f"{k[0]},{k[1]},{k[2]},{k[3]} c{k[4]} t{k[5]}: {x:.2f}x" for x, k in xs if x < need]
        return xs[0], fails, len(xs)

    def report(peer, keys, need, what):
        w = worst(peer, keys, need)
        if w is None:
            lines.append(f"n/a      {what}: no rows")
            return
        (x, k), fails, n = w
        verdict(not fails, f"{what}: min {x:.2f}x (B,T,D,H={k[0]},{k[1]},{k[2]},{k[3]} causal={k[4]} "
                           f"threads={k[5]}); {n - len(fails)}/{n} rows meet it"
                           + (f"; below: {', '.join(fails)}" if fails else ""))

    if "ort-fused" in a.peer_list:
        # Issue 15: every row >= 1.2x ORT fused, or >= 80% of the probe at the row's threads.
        keys = rows_for(lambda *k: True)
        met, fails = 0, []
        for k in keys:
            t, o = res.get(("tessera",) + k), res.get(("ort-fused",) + k)
            x = ratio(t, o)
            share = 100 * t["gflops"] / peak[k[5]] if ok(t) and k[5] in peak else None
            if (x is not None and x >= 1.2) or (share is not None and share >= 80):
                met += 1
            else:
                fails.append(f"{k[0]},{k[1]},{k[2]},{k[3]} c{k[4]} t{k[5]}: "
                             + (f"{x:.2f}x" if x is not None else "n/a") + ", "
                             + (f"{share:.0f}% of peak" if share is not None else "n/a"))
        verdict(not fails and met > 0, f"issue 15: >= 1.2x ORT fused or >= 80% of the FMA peak, every row: "
                                       f"{met}/{len(keys)} rows meet it" + (f"; below: {'; '.join(fails)}" if fails else ""))
        report("ort-fused", rows_for(lambda *k: True), 1.2, ">= 1.2x ORT fused MHA, every shape, 1 and 2 threads")
        report("ort-fused", rows_for(lambda B, T, D, H, c, n: T >= 2048 and c == 0), 1.5,
               ">= 1.5x ORT fused at T >= 2048, non-causal")
        report("ort-fused", rows_for(lambda B, T, D, H, c, n: T >= 2048 and c == 1), 2.5,
               ">= 2.5x ORT fused at T >= 2048, causal")
    keys = rows_for(lambda B, T, D, H, c, n: T >= 2048 and c == 0)
    pk = [(100 * res[("tessera",) + k]["gflops"] / peak[k[5]], k) for k in keys
          if ok(res.get(("tessera",) + k)) and k[5] in peak]
    if pk:
        pk.sort()
        fails = [f"{k[1]},{k[2]} t{k[5]}: {p:.0f}%" for p, k in pk if p < 60]
        verdict(not fails, f">= 60% of the FMA peak at T >= 2048 non-causal: min {pk[0][0]:.0f}% "
                           f"(T={pk[0][1][1]} threads={pk[0][1][5]}); peak = probe {peak}"
                           + (f"; below: {', '.join(fails)}" if fails else ""))
    if "torch" in a.peer_list:
        report("torch", rows_for(lambda B, T, D, H, c, n: T >= 2048), 10.0, ">= 10x PyTorch (default) at T >= 2048")
    if "torch-heap" in a.peer_list:
        report("torch-heap", rows_for(lambda *k: True), 2.0, ">= 2x heap-tuned PyTorch everywhere")
    mem = [r for r in extra if r.get("section") == "memory" and r["peer"] == "tessera"]
    if mem:
        bad = [r for r in mem if not ok(r) or r["peak_rss_mb"] >= 1024]
        verdict(not bad, "peak RSS < 1 GB at " + ", ".join(
            f"B,T,D,H={r['B']},{r['T']},{r['D']},{r['H']} causal={r['causal']}: "
            f"{fmt(r.get('peak_rss_mb'), 0)} MB" for r in mem))
    nw = [r for r in extra if r.get("section") == "weights" and r["peer"] == "tessera"]
    if nw:
        parts, good = [], True
        for r in nw:
            for p in ("torch-nw", "torch-heap-nw"):
                pr = next((x for x in extra if x.get("section") == "weights" and x["peer"] == p
                           and all(x.get(k) == r.get(k) for k in ("B", "T", "D", "H", "causal", "threads"))), None)
                x = ratio(r, pr)
                if x is not None:
                    parts.append(f"{r['T']},{r['D']} t{r['threads']} vs {p}: {x:.2f}x")
                    if p == "torch-nw":
                        good = good and x >= 3.0
                else:
                    good = False if p == "torch-nw" else good
        verdict(good and bool(parts), "need_weights=true >= 3x PyTorch (default): " + "; ".join(parts))
    att = [r for r in extra if r.get("section") == "attention"]
    if att:
        parts, good = [], True
        for r in att:
            if r.get("variant") in ("rope", "relbias"):
                base = next((x for x in att if x.get("variant") == "plain" and
                             all(x.get(k) == r.get(k) for k in ("B", "T", "D", "H", "causal", "threads"))), None)
                if ok(r) and ok(base):
                    slow = r["median_ms"] / base["median_ms"]
                    parts.append(f"{r['variant']} T={r['T']} t{r['threads']}: {slow:.2f}x plain's time")
                    good = good and slow <= 1.15
                else:
                    good = False
                    parts.append(f"{r['variant']} T={r['T']} t{r['threads']}: {r.get('status')}")
        verdict(good and bool(parts), "attention rope / relative position bias within 15% of plain: " + "; ".join(parts))
    if 1 in a.thread_list and 2 in a.thread_list:
        sp = []
        for (B, T, D, H) in a.shape_list:
            for c in a.causal_list:
                t1, t2 = res.get(("tessera", B, T, D, H, c, 1)), res.get(("tessera", B, T, D, H, c, 2))
                if T >= 2048 and ok(t1) and ok(t2):
                    sp.append((t1["median_ms"] / t2["median_ms"], T, c))
        if sp:
            verdict(all(s >= 1.8 for s, _, _ in sp), "2 threads >= 1.8x 1 thread at T >= 2048: " +
                    ", ".join(f"T={T} c{c}: {s:.2f}x" for s, T, c in sp))
    return "\n".join(lines)


def extras_tables(extra, peak):
    out = []
    mem = [r for r in extra if r.get("section") == "memory"]
    if mem:
        out.append("## Memory: tessera alone (peak RSS of the whole process)")
        out.append(table(["B,T,D,H", "causal", "thr", "ms", "GFLOP/s", "% peak", "peak RSS MB", "note"],
                         [[f"{r['B']},{r['T']},{r['D']},{r['H']}", str(r["causal"]), str(r["threads"]),
                           fmt(r.get("median_ms"), 1) if ok(r) else r.get("status"), fmt(r.get("gflops")),
                           fmt(100 * r["gflops"] / peak[r["threads"]], 0) + "%" if ok(r) else "-",
                           fmt(r.get("peak_rss_mb"), 0), note_of(r)] for r in mem], left={0, 7}))
    nw = [r for r in extra if r.get("section") == "weights"]
    if nw:
        out.append("\n## need_weights=true (averaged weights [B, T, T] returned), non-causal")
        rows = []
        for r in nw:
            if r["peer"] != "tessera":
                continue
            cells = [f"{r['B']},{r['T']},{r['D']},{r['H']}", str(r["threads"]),
                     fmt(r.get("median_ms"), 2) if ok(r) else r.get("status"), fmt(r.get("peak_rss_mb"), 0)]
            prs = []
            for p in ("torch-nw", "torch-heap-nw"):
                pr = next((x for x in nw if x["peer"] == p and all(
                    x.get(k) == r.get(k) for k in ("B", "T", "D", "H", "causal", "threads"))), None)
                prs.append(pr)
                x = ratio(r, pr)
                cells += [fmt(pr.get("median_ms"), 2) if ok(pr) else (pr or {}).get("status", "-"),
                          fmt(pr.get("peak_rss_mb"), 0) if pr else "-", fmt(x, 2) + "x" if x else "-"]
            cells.append(note_of(r, *prs))
            rows.append(cells)
        out.append(table(["B,T,D,H", "thr", "tessera ms", "RSS MB", "torch ms", "torch RSS", "x torch",
                          "torch-heap ms", "torch-heap RSS", "x torch-heap", "note"], rows, left={0, 10}))
    att = [r for r in extra if r.get("section") == "attention"]
    if att:
        out.append("\n## The `attention` op: plain vs rope vs relative position bias (spatial_shape = sqrt(T) x sqrt(T))")
        rows = []
        for r in att:
            base = next((x for x in att if x.get("variant") == "plain" and all(
                x.get(k) == r.get(k) for k in ("B", "T", "D", "H", "causal", "threads"))), None)
            rel = r["median_ms"] / base["median_ms"] if ok(r) and ok(base) else None
            rows.append([f"{r['B']},{r['T']},{r['D']},{r['H']}", str(r["causal"]), str(r["threads"]),
                         r["variant"], fmt(r.get("median_ms"), 2) if ok(r) else r.get("status"),
                         fmt(r.get("gflops")), fmt(r.get("peak_rss_mb"), 0),
                         fmt(rel, 2) + "x" if rel else "-", note_of(r)])
        out.append(table(["B,T,D,H", "causal", "thr", "variant", "ms", "GFLOP/s", "RSS MB",
                          "time / plain", "note"], rows, left={0, 3, 8}))
    return "\n".join(out)


def plot(a, res, peak, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return False
    n = 2 if 2 in a.thread_list else a.thread_list[-1]
    shapes = sorted([s for s in a.shape_list if s[0] == 1], key=lambda s: s[1])
    if not shapes:
        return False
    fig, axes = plt.subplots(1, len(a.causal_list), figsize=(7.0 * len(a.causal_list), 4.6), squeeze=False)
    styles = {"tessera": ("#d62728", "o", 2.6), "ort-fused": ("#1f77b4", "s", 1.6),
              "ort-plain": ("#17becf", "v", 1.2), "torch-heap": ("#2ca02c", "^", 1.6),
              "torch": ("#7f7f7f", "D", 1.4)}
    for ax, c in zip(axes[0], a.causal_list):
        top = peak.get(n, 0.0)
        for p in ["tessera"] + a.peer_list:
            xs, ys = [], []
            for (B, T, D, H) in shapes:
                r = res.get((p, B, T, D, H, c, n))
                if ok(r):
                    xs.append(T)
                    ys.append(r["gflops"])
            if xs:
                col, mk, lw = styles.get(p, ("black", "x", 1.2))
                ax.plot(xs, ys, marker=mk, color=col, lw=lw, label=p)
                top = max([top] + ys)
        if n in peak:
            ax.axhline(peak[n], color="black", ls="--", lw=1)
            ax.text(shapes[-1][1], peak[n] * 1.01, f"FMA probe, {n} threads: {peak[n]:.0f}",
                    va="bottom", ha="right", fontsize=8)
            ax.axhline(0.6 * peak[n], color="black", ls=":", lw=0.8)
            ax.text(shapes[-1][1], 0.6 * peak[n] * 1.01, "60%", va="bottom", ha="right", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([s[1] for s in shapes])
        ax.set_xticklabels([f"{s[1]}\nD={s[2]}" for s in shapes], fontsize=8)
        ax.set_xlabel("T (B=1)")
        ax.set_ylabel("GFLOP/s = B(8TD² + 4T²D) / time" + ("  (dense count)" if c else ""))
        ax.set_title(f"{'causal' if c else 'non-causal'} self-attention, {n} threads")
        ax.set_ylim(0, top * 1.12)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(f"MultiheadAttention forward, float32 — {a.label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot -> {path}")
    return True


def machine():
    def lscpu(field):
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(rf"^{field}:\s*(.*)$", out, re.M)
        return m.group(1).strip() if m else "?"
    mem = open("/proc/meminfo").readline().split()[1]
    deb = open("/etc/debian_version").read().strip() if os.path.exists("/etc/debian_version") else "?"
    caches = subprocess.run(["lscpu", "-C"], capture_output=True, text=True).stdout.strip().replace("\n", "\n#   ")
    return (f"# host: {lscpu('Model name')} (family {lscpu('CPU family')} model {lscpu('Model')}), "
            f"{os.cpu_count()} cores, {int(mem) / 1048576:.1f} GiB, kernel {platform.release()}, Debian {deb}\n"
            f"# caches:\n#   {caches}")


def versions(a, h):
    def out(cmd, cwd=None):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=60).stdout.strip()
        except Exception:
            return "?"
    git = a.rev or out(["git", "-C", REPO, "describe", "--always", "--dirty"])
    torch_v = out(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"])
    ort_v = out(["node", "-e", "console.log(require('onnxruntime-node').env.versions.node)"], cwd=h)
    core = out(["/usr/bin/python3", "-c", "import ctypes; l = ctypes.CDLL('libopenblas.so.0'); "
                "l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())"])
    return (f"# tessera {git} ({a.tessera}); torch {torch_v}; onnxruntime-node {ort_v}; "
            f"node {out(['node', '--version'])}\n# OpenBLAS kernels: tessera runs with the environment's "
            f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} -> {core}; the torch peers "
            f"get --openblas-coretype {torch_openblas_core(a)}")


def over_rounds(rs):
    """One row from a config's processes (one per round): with two or more clean timed rows, the
    median of their medians, their fastest call and their spread; else the one clean timed row,
    else the last clean row (a skip), else the last row."""
    good = [r for r in rs if clean(r) and ok(r)]
    if len(good) < 2:
        return good[0] if good else ([r for r in rs if clean(r)] or rs)[-1]
    meds = [r["median_ms"] for r in good]
    med = statistics.median(meds)
    r = dict(good[0], median_ms=med,
             min_ms=min((x["min_ms"] for x in good if "min_ms" in x), default=None),
             rounds=len(good), spread=round((max(meds) - min(meds)) / med, 3),
             round_ms=[round(x["median_ms"], 3) for x in good])
    r["gflops"] = round(flops(r["B"], r["T"], r["D"]) / (med * 1e-3) / 1e9, 2)
    rss = [x["peak_rss_mb"] for x in good if x.get("peak_rss_mb") is not None]
    if rss:
        r["peak_rss_mb"] = max(rss)
    return r


def write_report(a, jsonl, stem):
    """Rebuilds the tables, the target checks and the plot from a run's raw rows."""
    meta, meta_end, peak, peak_end, target = {}, {}, {}, {}, "?"
    cpus, cpus_end = [], []
    res, extra = {}, []
    with open(jsonl) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "meta" in r:
                (meta if r["meta"] in ("start", "peers") else meta_end).update(r)
            elif "probe" in r:
                pk = {int(k): v for k, v in r["probe"].items()}
                if r.get("when") == "start":
                    peak, target, cpus = pk, r.get("target", "?"), r.get("per_cpu", [])
                else:
                    peak_end, cpus_end = pk, r.get("per_cpu", [])
            elif r.get("section", "main") == "main":
                k = (r["peer"], r["B"], r["T"], r["D"], r["H"], r["causal"], r["threads"])
                res.setdefault(k, []).append(r)
            else:
                extra.append(r)
    res = {k: over_rounds(rs) for k, rs in res.items()}
    # the run's own configuration (a --report-only call may not repeat it)
    for k in ("shape_list", "causal_list", "thread_list", "peer_list", "label", "rounds", "hwy_target"):
        if k in meta:
            setattr(a, k, [tuple(x) for x in meta[k]] if k == "shape_list" else meta[k])
    # % of peak uses the higher of the two probes: a probe that overlapped other load reads low,
    # and the higher one is the conservative ceiling
    probe_start = dict(peak)
    peak = {n: max(peak.get(n, 0.0), peak_end.get(n, 0.0)) for n in set(peak) | set(peak_end)}
    rows_all = list(res.values()) + extra
    simd = sorted({r.get("simd_target") for r in rows_all if r.get("peer") == "tessera" and r.get("simd_target")})
    contended = sum(1 for r in rows_all if "CONTENDED" in (r.get("note") or ""))
    head = [
        f"# tessera vs PyTorch / ONNX Runtime: MultiheadAttention self-attention forward, float32  {meta.get('started', '?')}",
        meta.get("machine", "# host: ?"),
        meta.get("versions", "# versions: ?"),
        "# peers' ISA: " + meta.get("peer_isa_text", "native (before --peer-isa existed)"),
        f"# FMA probe ({target}, register-only FMA loop, benchmarks/fma_probe): start "
        + ", ".join(f"{n} thr {g:.1f}" for n, g in probe_start.items()) + " GFLOP/s; end "
        + ", ".join(f"{n} thr {g:.1f}" for n, g in peak_end.items())
        + " GFLOP/s; '% peak' uses the higher of the two per thread count; tessera's kernels ran on "
        + (", ".join(simd) if simd else "?") + (f" (forced: --hwy-target {a.hwy_target})" if getattr(a, "hwy_target", None) else ""),
        per_cpu_text(cpus, cpus_end),
        "# flops = B*(8*T*D^2 + 4*T^2*D) for every runtime, dense count also for causal rows; "
        + ("ms = median of timed calls after warm-up; one process per runtime and config"
         if getattr(a, "rounds", 1) <= 1 else
         f"ms = median over {a.rounds} rounds of each process's median of timed calls after warm-up; "
         "one process per runtime, config and round, the runtimes' order rotating per round; "
         "spread = (max - min) / median of the rounds' medians"),
        "# 'x <peer>' = peer ms / tessera ms (> 1: tessera faster); RSS = peak resident set of the whole process",
        "# peers: torch = Debian python3-torch, default malloc; torch-heap = same with GLIBC_TUNABLES "
        "mmap_max=0:trim_threshold=64G; ort-fused = onnxruntime-node, com.microsoft.MultiHeadAttention "
        f"(harness {meta.get('harness', '?')})",
        f"# {meta.get('settings', '')}; loadavg start {meta.get('load', '?')}, end {meta_end.get('load', '?')}; "
        f"wall {meta_end.get('wall_min', '?')} min; {contended} CONTENDED rows",
        f"# command: {meta.get('command', '?')}",
        f"# raw rows: {os.path.relpath(jsonl, REPO)}",
    ]
    report = ("\n".join(head) + "\n\n## Main table: tessera and its speed-up over each peer\n"
              + main_table(a, res, peak) + "\n\n## Every runtime's row\n" + long_table(a, res, peak) + "\n")
    ex = extras_tables(extra, peak)
    if ex:
        report += "\n" + ex + "\n"
    report += "\n## Targets (issues 6, 12 and 15)\n"
    if contended:
        report += (f"(caution: {contended} rows overlapped other load (CONTENDED): verdicts below "
                   "include them)\n")
    report += check_targets(a, res, extra, peak) + "\n"
    with open(stem + ".txt", "w") as f:
        f.write(report)
    print(report)
    if not a.no_plot:
        plot(a, res, peak, stem + ".png")
    log(f"report -> {stem}.txt")


def main():
    a = parse()
    if a.report_only:
        stem = a.report_only[:-len(".jsonl")] if a.report_only.endswith(".jsonl") else a.report_only
        write_report(a, a.report_only, stem)
        return
    cmdline = f"cd {REPO} && benchmarks/peers.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    a.resume = Resume(a.resume)
    h = setup(a)
    resolve_peer_isa(a, a.hwy_target, a.probe)
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, a.label)
    jsonl = stem + ".jsonl"
    raw = open(jsonl, "w")
    t_start = time.time()

    def keep(r):
        raw.write(json.dumps(r) + "\n")
        raw.flush()
        if "peer" not in r:
            return r
        log(f"  {r['peer']:<14} {r.get('variant', ''):<8} B={r['B']} T={r['T']} D={r['D']} H={r['H']} "
            f"c={r['causal']} t={r['threads']}: {r.get('status')} {fmt(r.get('median_ms'), 2)} ms "
            f"{fmt(r.get('gflops'))} GF/s {fmt(r.get('peak_rss_mb'), 0)} MB {r.get('note', '')}")
        return r

    keep({"meta": "start", "started": datetime.datetime.now().isoformat(timespec="seconds"),
          "command": cmdline, "machine": machine(), "versions": versions(a, h), "harness": a.harness,
          "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
          "settings": f"target_s={a.target_s} max_call_s={a.max_call_s} idle_max_cores={a.idle_max_cores}",
          "shape_list": a.shape_list, "causal_list": a.causal_list, "thread_list": a.thread_list,
          "peer_list": a.peer_list, "label": a.label, "rounds": a.rounds, "hwy_target": a.hwy_target})
    wait_idle(a)
    if a.hwy_target:
        os.environ["TESSERA_HWY_TARGET"] = a.hwy_target  # read by every tessera process
    peak, target, cpus = probe(a)
    log(f"FMA probe ({target}): " + ", ".join(f"{n} thr {g:.1f} GFLOP/s" for n, g in peak.items()))
    keep({"probe": peak, "target": target, "when": "start", "per_cpu": cpus})
    keep({"meta": "peers", "peer_isa": a.peer_isa, "peer_isa_text": a.peer_isa_text})
    log("peers' ISA: " + a.peer_isa_text)

    for (B, T, D, H) in a.shape_list:
        for c in a.causal_list:
            net = write_net(a, f"mha_D{D}_H{H}_c{c}", mha_net(D, H, c))
            for n in a.thread_list:
                runtimes = ["tessera"] + a.peer_list
                for rnd in range(a.rounds):
                    log(f"config B={B} T={T} D={D} H={H} causal={c} threads={n}"
                        + (f" round {rnd + 1}/{a.rounds}" if a.rounds > 1 else ""))
                    k = rnd % len(runtimes)
                    for p in runtimes[k:] + runtimes[:k]:
                        if p == "tessera":
                            keep(run_tessera(a, net, B, T, D, H, c, n, section="main", round=rnd))
                        else:
                            keep(run_peer(a, h, p, B, T, D, H, c, n, rnd=rnd))

    if not a.no_extras:
        n2 = max(a.thread_list)
        for s in a.memory_shapes.split():
            B, T, D, H = (int(x) for x in s.split(","))
            for c in (0, 1):
                net = write_net(a, f"mha_D{D}_H{H}_c{c}", mha_net(D, H, c))
                keep(run_tessera(a, net, B, T, D, H, c, n2, section="memory"))
        for s in a.weights_shapes.split():
            B, T, D, H = (int(x) for x in s.split(","))
            net = write_net(a, f"mha_nw_D{D}_H{H}", mha_net(D, H, 0, need_weights=True))
            for n in a.thread_list:
                keep(run_tessera(a, net, B, T, D, H, 0, n, section="weights"))
                for p in ("torch-nw", "torch-heap-nw"):
                    keep(run_peer(a, h, p, B, T, D, H, 0, n, section="weights"))
        for s in a.attention_shapes.split():
            B, T, D, H = (int(x) for x in s.split(","))
            for n in a.thread_list:
                for variant in ("plain", "rope", "relbias"):
                    net = write_net(a, f"attn_{variant}_D{D}_H{H}_T{T}", attention_net(D, H, T, variant))
                    keep(run_tessera(a, net, B, T, D, H, 0, n, section="attention", variant=variant))

    wait_idle(a)
    peak_end, _, cpus_end = probe(a)
    keep({"probe": peak_end, "target": target, "when": "end", "per_cpu": cpus_end})
    keep({"meta": "end", "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
          "wall_min": round((time.time() - t_start) / 60, 1)})
    raw.close()
    write_report(a, jsonl, stem)


if __name__ == "__main__":
    main()
