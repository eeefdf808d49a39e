#!/usr/bin/python3
"""tessera against PyTorch eager and ONNX Runtime on whole models: one run, one table (issue 15).

Models (benchmarks/models/catalog.py): torchvision's vit_b_16 and swin_t on a 224x224 image, the
`gpt` recipe with vocab_size=8192 d_model=512 nhead=8 num_layers=6 dim_feedforward=2048 on a
prefill of T=512 ids, and nn.Transformer base (batch_first, causal tgt_mask) on S=T=128; B=1.
Each runs through tessera (`tessera bench` on the recipe's network; it draws int64 ids in
[0, vocab)), PyTorch eager (the torchvision / torch module itself, benchmarks/models/
torch_model.py) and ONNX Runtime (torch.onnx.export of the same module at opset 14, run by
onnxruntime-node with graph optimisation level all, benchmarks/models/ort_model.js): one fresh
process per (round, model, threads, runtime), the runtimes' order rotating from round to round,
at 1 and 2 threads. Table: median ms (median over rounds of each process's median), GFLOP/s
(tessera's plan FLOP count for every runtime), % of the FMA peak (build/benchmarks/fma_probe at
the row's thread count, same run), peak RSS, cold start, CPU time per call, tessera's speed-up
over each peer; then the issue's targets, MET / NOT MET with the numbers.

  benchmarks/models.py                                    # everything: 4 models x 2 threads x 3 runtimes x 3 rounds,
                                                          #   ~10-15 min on an idle machine (+1.5 min the first time)
  benchmarks/models.py --quick                            # swin_t and gpt, 2 threads, 1 round, short timings
  benchmarks/models.py --quick --models gpt --threads 1 --runtimes tessera,ort
  benchmarks/models.py --target AVX2                      # an AVX-512 machine measuring the AVX2 path
                                                          #   (the peers' AVX2 kernels too: --peer-isa)
  benchmarks/models.py --report-only benchmarks/results/RUN.jsonl   # rebuild RUN.txt / RUN.png

Options: --models vit_b_16,swin_t,gpt,transformer  --threads 1,2  --rounds 3
--runtimes tessera,torch,ort  --target NAME (a Highway target: tessera gets TESSERA_HWY_TARGET=NAME,
and OPENBLAS_CORETYPE of the same ISA for the GEMMs it leaves to OpenBLAS (AVX2 -> Haswell,
SSE4 -> Nehalem, unless the environment sets OPENBLAS_CORETYPE; --tessera-openblas-coretype
overrides), the probe gets --target NAME; a target
this CPU or build lacks is an error before anything runs)  --out LABEL (file stem in
benchmarks/results/, or a path; default <date>-models-<cpu-tag>-<isa>, +"-quick" with --quick)
--peer-isa auto|avx2|native (avx2: ORT and PyTorch run under benchmarks/hide_avx512.cpp, which hides
AVX-512 from their CPUID, so that they take their AVX2 kernels, and PyTorch's OpenBLAS gets Haswell
kernels unless the environment sets OPENBLAS_CORETYPE; auto: avx2 with --target AVX2 on an AVX-512 CPU)
--panel-cache on|off (on: tessera's packed projection weights are cached in <workdir>/panel-cache by the
verification run, so every timed process, cold start included, maps them; off: each load packs)
--tessera PATH (default build/apps/tessera)  --probe PATH (default benchmarks/fma_probe of that
build)  --workdir DIR (default /tmp/tessera-models-<uid>)  --idle-wait S  --target-s S.

Once per model, cached in the work directory (benchmarks/models/prepare.py; vit_b_16 takes a
minute and ~1.5 GB of memory): the torch module with every parameter drawn from a fixed seed, its
state_dict as weights.safetensors (PyTorch's own names, float32) and state_dict.pt, the fixed
input, PyTorch's output of it, and model.onnx. Every run then writes the recipe's network
(`tessera recipe ARCH --set ... --output net.json`) and verifies: the same input through
`tessera run`, ORT and a fresh torch process, max |d| against PyTorch's output in the header; a
runtime off by more than --verify-tol (1e-3) of max |output| stops the run (--allow-mismatch
goes on). Reps: one calibration `tessera bench --warmup 1 --reps 1` per (model, threads) sizes
the warm-up (>= 1 call, ~0.3 s) and tessera's reps (~--target-s of timed work, >= 3); torch and
ORT get the same warm-up count and size their reps from their own last warm-up call.

Cold start: tessera = load_ms + first_run_ms of `tessera bench --json` (network and weights
loaded, plan built, inputs drawn, first run: process start to first output less exec and
dynamic linking); torch = module construction + torch.load + load_state_dict + first forward
(import torch excluded); ORT = InferenceSession.create(model.onnx) + first run (require
excluded). Peak RSS: each process's getrusage maxrss. CPU ms/call: torch and ORT measure their
own user+sys over the timed calls; tessera's is the whole process's over all its calls; 'cores'
= CPU per call / wall per call shows a "1 thread" run that uses more.

Like peers.py: waits (up to --idle-wait s) for an idle machine before each process and flags
CONTENDED rows; peers come from a copy of the shared harness's package.json / package-lock.json
(`ONNXRUNTIME_NODE_INSTALL=skip npm ci` in <workdir>/node, NODE_PATH pointed at it); the runner
apt-installs python3-torch / python3-torchvision / python3-matplotlib when missing. Outputs:
benchmarks/results/<label>.txt (machine, versions, command, verification, table, targets),
<label>.jsonl (raw rows) and <label>.png (GFLOP/s per model and runtime). The runner itself uses
/usr/bin/python3 and the standard library (matplotlib for the plot).
"""
import argparse
import array
import datetime
import json
import math
import os
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HELPERS = os.path.join(HERE, "models")
sys.path.insert(0, HERE)
sys.path.insert(0, HELPERS)
import peers  # noqa: E402  (stdlib only; its main() does not run on import)
from catalog import MODELS, cache_key  # noqa: E402

RUNTIMES = ("tessera", "torch", "ort")
# the OpenBLAS core of the ISA a forced Highway target stands for (tessera leaves some GEMMs,
# e.g. convolutions and attention's batched products, to OpenBLAS)
OPENBLAS_CORE_FOR = {"AVX2": "Haswell", "SSE4": "Nehalem", "SSSE3": "Core2", "SSE2": "Prescott"}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma-separated, of: " + ",".join(MODELS))
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2)")
    p.add_argument("--rounds", type=int, default=None, help="processes per runtime and config (default 3)")
    p.add_argument("--runtimes", default="tessera,torch,ort")
    p.add_argument("--target", default=None, metavar="NAME",
                   help="force this Highway target (AVX3, AVX2, SSE4, ...) in tessera and the FMA probe")
    p.add_argument("--tessera-openblas-coretype", default="match",
                   help="OPENBLAS_CORETYPE for tessera: match (the --target's ISA unless the environment sets one), "
                        "env (the environment's), or a core name")
    p.add_argument("--torch-openblas-coretype", default="match",
                   help="for torch_model.py: match (auto, or Haswell when the peers are held to AVX2: "
                        "--peer-isa), auto (OpenBLAS detects; the harness default), env, or a core name")
    peers.add_peer_isa_option(p, "--target")
    p.add_argument("--quick", action="store_true",
                   help="check the pipeline: swin_t,gpt (unless --models), 2 threads (unless --threads), "
                        "1 round, ~0.3 s of timed work, no idle waiting")
    p.add_argument("--out", default=None, metavar="LABEL",
                   help="output stem: a name in benchmarks/results/ or a path (default <date>-models-<cpu>-<isa>)")
    p.add_argument("--panel-cache", choices=("on", "off"), default="on",
                   help="on (default): tessera keeps its packed projection weights in <workdir>/panel-cache "
                        "(written by the verification run), so cold starts map them; off: every load packs")
    p.add_argument("--tessera", default=os.path.join(REPO, "build/apps/tessera"))
    p.add_argument("--probe", default=None, help="fma_probe (default: benchmarks/fma_probe of --tessera's build)")
    p.add_argument("--harness", default=os.environ.get("PEERS_HARNESS", os.path.join(os.path.dirname(REPO),
                                                                                       "shared/bench/peers")),
                   help="the shared peer harness (its package.json / package-lock.json)")
    p.add_argument("--workdir", default=f"/tmp/tessera-models-{os.getuid()}")
    p.add_argument("--target-s", type=float, default=2.5, help="timed work per process, seconds")
    p.add_argument("--warmup-s", type=float, default=0.3, help="warm-up per process, seconds (>= 1 call)")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--idle-max-cores", type=float, default=0.25)
    p.add_argument("--idle-wait", type=float, default=1800.0,
                   help="max seconds to wait for an idle machine before each process (0: never wait)")
    p.add_argument("--timeout", type=float, default=1800.0, help="hard limit per process, seconds")
    p.add_argument("--verify-tol", type=float, default=1e-3,
                   help="max |runtime - torch| / max |torch output| allowed in the verification")
    p.add_argument("--allow-mismatch", action="store_true", help="go on when a runtime fails the verification")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-setup", action="store_true", help="do not apt-get / npm install anything")
    p.add_argument("--report-only", default=None, metavar="RUN.jsonl",
                   help="rebuild RUN.txt and RUN.png from a run's raw rows, running nothing")
    p.add_argument("--rev", default=None, help="what tessera build this is (default: git describe)")
    a = p.parse_args()
    if a.quick:
        a.models = a.models or "swin_t,gpt"
        a.threads = a.threads or "2"
        a.rounds = a.rounds or 1
        a.target_s = min(a.target_s, 0.3)
        a.warmup_s = min(a.warmup_s, 0.1)
        a.idle_wait = 0.0
    a.model_list = (a.models or ",".join(MODELS)).replace(" ", ",").split(",")
    a.model_list = [m for m in a.model_list if m]
    for m in a.model_list:
        if m not in MODELS:
            p.error(f"unknown model {m} (known: {', '.join(MODELS)})")
    a.thread_list = [int(n) for n in (a.threads or "1,2").replace(" ", ",").split(",") if n]
    a.rounds = a.rounds or 3
    a.runtime_list = [r for r in a.runtimes.replace(" ", ",").split(",") if r]
    for r in a.runtime_list:
        if r not in RUNTIMES:
            p.error(f"unknown runtime {r} (known: {', '.join(RUNTIMES)})")
    a.tessera = os.path.abspath(a.tessera)
    if a.probe is None:
        a.probe = os.path.join(os.path.dirname(os.path.dirname(a.tessera)), "benchmarks/fma_probe")
    a.probe = os.path.abspath(a.probe)
    a.node_dir = os.path.join(a.workdir, "node")
    return a


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- environments
def tessera_env(a):
    env = dict(os.environ)
    if a.target:
        env["TESSERA_HWY_TARGET"] = a.target
    else:
        env.pop("TESSERA_HWY_TARGET", None)
    c = a.tessera_openblas_coretype
    if c == "match":
        # Never over a value the environment sets (the machine's owner chose it).
        if a.target and a.target in OPENBLAS_CORE_FOR and "OPENBLAS_CORETYPE" not in os.environ:
            env["OPENBLAS_CORETYPE"] = OPENBLAS_CORE_FOR[a.target]
    elif c != "env":
        env["OPENBLAS_CORETYPE"] = c
    return env


def node_env(a):
    return peers.peer_env(a, dict(os.environ, NODE_PATH=os.path.join(a.node_dir, "node_modules")))


def py_env(threads):
    return dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))


def torch_env(a, threads):
    return peers.peer_env(a, py_env(threads))


def torch_core(a):
    """torch_model.py's --openblas-coretype."""
    c = a.torch_openblas_coretype
    return peers.torch_openblas_core(a) if c == "match" else c


def quiet(cmd, env=None, cwd=None, timeout=300):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
        return r.returncode, r.stdout.strip(), r.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, "", str(e)


# ---------------------------------------------------------------- setup
def setup(a):
    for exe, what in ((a.tessera, "tessera"), (a.probe, "fma_probe")):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{what} not found at {exe}: build it (ninja -C build) or pass --tessera/--probe")
    if a.target:
        rc, _, err = quiet([a.tessera, "--version"], env=tessera_env(a))
        if rc != 0:
            sys.exit(f"--target {a.target}: tessera refuses TESSERA_HWY_TARGET={a.target}: {err}")
        rc, _, err = quiet([a.probe, "--target", a.target, "--threads", "1", "--ms", "1", "--rounds", "1", "--json"])
        if rc != 0:
            sys.exit(f"--target {a.target}: fma_probe refuses it: {err}")
    os.makedirs(a.workdir, exist_ok=True)
    needs_torch = True  # prepare.py always needs it (cached after the first run)
    if not a.no_setup:
        missing = []
        if needs_torch and not peers.has_module("torch"):
            missing.append("python3-torch")
        if any(MODELS[m]["arch"] in ("vit_b_16", "swin_t") for m in a.model_list) and not peers.has_module("torchvision"):
            missing.append("python3-torchvision")
        if not a.no_plot and not peers.has_module("matplotlib"):
            missing.append("python3-matplotlib")
        if missing:
            peers.apt_install(missing)
    needs_ort = "ort" in a.runtime_list or not a.no_verify
    if needs_ort:
        os.makedirs(a.node_dir, exist_ok=True)
        lock = os.path.join(a.node_dir, "package-lock.json")
        lock_old = open(lock).read() if os.path.exists(lock) else None
        for f in ("package.json", "package-lock.json"):
            src = os.path.join(a.harness, f)
            if not os.path.exists(src):
                sys.exit(f"{src} missing: pass --harness (the shared peer harness)")
            dst = os.path.join(a.node_dir, f)
            if os.path.exists(dst):
                os.chmod(dst, 0o644)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o644)
        have = os.path.isdir(os.path.join(a.node_dir, "node_modules/onnxruntime-node"))
        if not a.no_setup and (not have or lock_old != open(lock).read()):
            log("npm ci (onnxruntime-node) in " + a.node_dir)
            peers.sh(["npm", "ci", "--no-audit", "--no-fund"], cwd=a.node_dir,
                     env=dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip"), stdout=subprocess.DEVNULL)
        elif not have:
            sys.exit(f"onnxruntime-node missing in {a.node_dir}/node_modules (and --no-setup)")


def model_dir(a, name):
    return os.path.join(a.workdir, "models", name)


def prepare(a, name):
    """The cached torch side of one model (prepare.py), then tessera's network for it."""
    d = model_dir(a, name)
    meta_path = os.path.join(d, "meta.json")
    meta = None
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        files = ("weights.safetensors", "state_dict.pt", "input.safetensors", "inputs.pt",
                 "expected.safetensors", "model.onnx")
        if meta.get("key") != cache_key(name) or not all(os.path.exists(os.path.join(d, x)) for x in files):
            meta = None
    if meta is None:
        log(f"{name}: building the torch module, weights, input, reference output and model.onnx in {d}")
        t0 = time.time()
        n = max(a.thread_list)
        r = subprocess.run(["/usr/bin/python3", os.path.join(HELPERS, "prepare.py"), "--model", name, "--dir", d,
                            "--threads", str(n)], capture_output=True, text=True, env=py_env(n))
        if r.returncode != 0:
            sys.exit(f"{name}: prepare.py failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        with open(meta_path) as f:
            meta = json.load(f)
        log(f"{name}: prepared in {time.time() - t0:.0f} s (onnx export {meta.get('onnx', {}).get('export_s')} s)")
    m = MODELS[name]
    net = os.path.join(d, "net.json")
    cmd = [a.tessera, "recipe", m["arch"]]
    for k, v in m["sets"].items():
        cmd += ["--set", f"{k}={json.dumps(v)}"]
    rc, _, err = quiet(cmd + ["--output", net], env=tessera_env(a))
    if rc != 0:
        sys.exit(f"{name}: {' '.join(cmd)} failed: {err}")
    rc, out, err = quiet([a.tessera, "summary", net] + shape_args(name), env=tessera_env(a))
    meta["tessera_parameters"] = None
    if rc == 0:
        mm = re.search(r"^Parameters:\s*([\d,]+)", out, re.M)
        if mm:
            meta["tessera_parameters"] = int(mm.group(1).replace(",", ""))
    meta["dir"] = d
    meta["recipe_command"] = " ".join(shlex.quote(c) for c in cmd)
    return meta


def shape_args(name):
    out = []
    for k, spec in MODELS[name]["inputs"].items():
        out += ["--shape", f"{k}={','.join(str(x) for x in spec['shape'])}"]
    return out


# ---------------------------------------------------------------- verification
ST_FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8)}


def read_safetensors(path):
    """name -> (dtype, shape, array.array) for F32 / F64 / I64 tensors (standard library only)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        code, _ = ST_FORMATS[info["dtype"]]
        arr = array.array(code)
        arr.frombytes(data[8 + n + b:8 + n + e])
        if sys.byteorder != "little":
            arr.byteswap()
        out[name] = (info["dtype"], info["shape"], arr)
    return out


def compare(ref_path, got_path):
    """{output: (max |got - ref|, max |ref|)}, inf when a value is not finite or a shape differs."""
    ref, got = read_safetensors(ref_path), read_safetensors(got_path)
    res = {}
    for k, (_, shape, r) in ref.items():
        if k not in got or got[k][1] != shape:
            res[k] = (math.inf, max(abs(x) for x in r))
            continue
        g = got[k][2]
        worst = max((abs(x - y) for x, y in zip(g, r)), default=0.0)
        if any(x != x or x in (math.inf, -math.inf) for x in g):
            worst = math.inf
        res[k] = (worst, max(abs(x) for x in r))
    return res


def verify(a, name, meta):
    d = meta["dir"]
    n = max(a.thread_list)
    inp, exp = os.path.join(d, "input.safetensors"), os.path.join(d, "expected.safetensors")
    cmds = {
        "tessera": ([a.tessera, "run", os.path.join(d, "net.json"), "--weights", os.path.join(d, "weights.safetensors"),
                     "--input", inp, "--output", os.path.join(d, "tessera_out.safetensors"), "--threads", str(n)]
                    + panel_cache_args(a),
                    tessera_env(a), None),
        "ort": (["node", os.path.join(HELPERS, "ort_model.js"), "--model", os.path.join(d, "model.onnx"),
                 "--input", inp, "--threads", str(n), "--verify", os.path.join(d, "ort_out.safetensors")],
                node_env(a), a.node_dir),
        "torch": (["/usr/bin/python3", os.path.join(HELPERS, "torch_model.py"), "--model", name, "--dir", d,
                   "--threads", str(n), "--verify", os.path.join(d, "torch_out.safetensors"),
                   "--openblas-coretype", torch_core(a)], torch_env(a, n), None),
    }
    out = {}
    for rt, (cmd, env, cwd) in cmds.items():
        path = os.path.join(d, f"{rt}_out.safetensors")
        if os.path.exists(path):
            os.unlink(path)
        rc, so, se = quiet(cmd, env=env, cwd=cwd, timeout=900)
        if rc != 0 or not os.path.exists(path):
            out[rt] = {"status": "error", "error": (se or so)[-400:]}
            continue
        diffs = compare(exp, path)
        worst = max(v[0] for v in diffs.values())
        ref = max(v[1] for v in diffs.values())
        out[rt] = {"status": "ok", "max_abs_diff": worst, "max_abs_ref": ref,
                   "rel": worst / max(ref, 1e-30), "ok": worst <= a.verify_tol * max(ref, 1e-30)}
    return out


def verification_text(name, v, tol):
    parts = []
    for rt in ("tessera", "ort", "torch"):
        r = v.get(rt)
        if r is None:
            continue
        if r["status"] != "ok":
            parts.append(f"{rt} ERROR ({r['error'][-120:]})")
        else:
            parts.append(f"{rt} {r['max_abs_diff']:.2e} (rel {r['rel']:.1e}{'' if r['ok'] else ' > tol: MISMATCH'})")
    return f"{name}: " + ", ".join(parts)


# ---------------------------------------------------------------- benchmark processes
def probe(a):
    return peers.run_fma_probe(a.probe, max(a.thread_list), a.target)


def panel_cache_args(a):
    return ["--panel-cache", os.path.join(a.workdir, "panel-cache")] if a.panel_cache == "on" else []


def tessera_cmd(a, meta, name, n, warm, reps):
    d = meta["dir"]
    return [a.tessera, "bench", os.path.join(d, "net.json"), "--weights", os.path.join(d, "weights.safetensors")] \
        + shape_args(name) + ["--threads", str(n), "--warmup", str(warm), "--reps", str(reps), "--json"] \
        + panel_cache_args(a)


def calibrate(a, meta, name, n):
    """One quick tessera process: (seconds per call, the plan's FLOPs, its record)."""
    rec, info = peers.run_proc(a, tessera_cmd(a, meta, name, n, 1, 1), env=tessera_env(a), timeout=a.timeout)
    if not rec:
        sys.exit(f"{name} threads={n}: tessera bench failed (rc {info['rc']}): {info['stderr']}")
    return max(rec["median_ms"] / 1e3, 1e-5), rec.get("flops"), rec


def run_one(a, meta, name, n, rt, cal, rnd):
    base = {"model": name, "threads": n, "runtime": rt, "round": rnd, "flops": cal["flops"],
            "warmup": cal["warmup"]}
    d = meta["dir"]
    if rt == "tessera":
        cmd = tessera_cmd(a, meta, name, n, cal["warmup"], cal["reps"])
        env, cwd = tessera_env(a), None
    elif rt == "torch":
        cmd = ["/usr/bin/python3", os.path.join(HELPERS, "torch_model.py"), "--model", name, "--dir", d,
               "--threads", str(n), "--warmup", str(cal["warmup"]), "--target-s", str(a.target_s),
               "--min-reps", str(a.min_reps), "--max-reps", str(a.max_reps),
               "--openblas-coretype", torch_core(a)]
        env, cwd = torch_env(a, n), None
    else:
        cmd = ["node", os.path.join(HELPERS, "ort_model.js"), "--model", os.path.join(d, "model.onnx"),
               "--input", os.path.join(d, "input.safetensors"), "--threads", str(n),
               "--warmup", str(cal["warmup"]), "--target-s", str(a.target_s),
               "--min-reps", str(a.min_reps), "--max-reps", str(a.max_reps)]
        env, cwd = node_env(a), a.node_dir
    rec, info = peers.run_proc(a, cmd, cwd=cwd, env=env, timeout=a.timeout)
    r = dict(base, command=" ".join(shlex.quote(c) for c in cmd))
    if not rec or rec.get("status", "ok") != "ok" or "median_ms" not in rec:
        err = (rec or {}).get("error") or info["stderr"]
        r.update(status="error", note=f"rc={info['rc']} {err}"[-300:])
        return peers.finish(r, info, a)
    r["status"] = "ok"
    for k in ("median_ms", "min_ms", "max_ms", "peak_rss_mb", "reps", "cpu_ms_per_call", "cold_start_ms",
              "session_create_ms", "first_run_ms", "load_ms", "build_ms", "simd_target", "openblas_core",
              "torch_threads", "base_rss_mb"):
        if k in rec:
            r[k] = rec[k]
    if rt == "tessera":
        r["reps"] = cal["reps"]
        r["tessera_gflops"] = rec.get("gflops")
        if "load_ms" in rec and "first_run_ms" in rec:
            r["cold_start_ms"] = round(rec["load_ms"] + rec["first_run_ms"], 2)
        else:
            r["note"] = "bench JSON lacks load_ms/first_run_ms: no cold start"
        calls = max(1, cal["warmup"]) + cal["reps"]
        r["cpu_ms_per_call"] = round(info["proc_cpu_s"] * 1e3 / calls, 3)
        r["cpu_scope"] = "process"
        if a.target and rec.get("simd_target") not in (None, a.target):
            r["note"] = (r.get("note", "") + f" simd_target {rec.get('simd_target')} != --target {a.target}").strip()
    else:
        r["cpu_scope"] = "timed calls"
    if r.get("flops"):
        r["gflops"] = round(r["flops"] / (r["median_ms"] * 1e-3) / 1e9, 2)
    return peers.finish(r, info, a)


# ---------------------------------------------------------------- report
def fmt(v, nd=1):
    return peers.fmt(v, nd)


def agg(rows):
    """Per (model, threads, runtime): the rounds' clean ok rows (all ok rows if none is clean)."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["threads"], r["runtime"]), []).append(r)
    res = {}
    for k, rs in by.items():
        good = [r for r in rs if r.get("status") == "ok"]
        clean = [r for r in good if "CONTENDED" not in (r.get("note") or "")]
        use = clean or good
        s = {"rows": rs, "n": len(rs), "n_ok": len(good), "n_contended": len(good) - len(clean)}
        notes = sorted({re.sub(r"CONTENDED\([^)]*\)", "", r.get("note") or "").strip()[:80] for r in rs} - {""})
        if use:
            meds = [r["median_ms"] for r in use]
            med = statistics.median(meds)
            s.update(ok=True, median_ms=med, spread=(max(meds) - min(meds)) / med * 100 if med else 0.0,
                     peak_rss_mb=max(r.get("peak_rss_mb") or 0 for r in use),
                     flops=use[0].get("flops"))
            cs = [r["cold_start_ms"] for r in use if r.get("cold_start_ms") is not None]
            s["cold_start_ms"] = statistics.median(cs) if cs else None
            cp = [r["cpu_ms_per_call"] for r in use if r.get("cpu_ms_per_call") is not None]
            s["cpu_ms_per_call"] = statistics.median(cp) if cp else None
            s["gflops"] = s["flops"] / (med * 1e-3) / 1e9 if s["flops"] else None
            s["reps"] = "/".join(str(r.get("reps", "?")) for r in use)
            for f in ("simd_target", "openblas_core"):
                vals = sorted({str(r[f]) for r in use if f in r})
                if vals:
                    s[f] = ",".join(vals)
        else:
            s["ok"] = False
        if s["n_contended"]:
            notes.append(f"CONTENDED {s['n_contended']}/{s['n_ok']}")
        s["note"] = "; ".join(notes)
        res[k] = s
    return res


def speedup(res, name, n, peer):
    t, p = res.get((name, n, "tessera")), res.get((name, n, peer))
    if t and p and t.get("ok") and p.get("ok"):
        return p["median_ms"] / t["median_ms"]
    return None


def torch_best(res, name, threads):
    xs = [(res[(name, n, "torch")]["median_ms"], n) for n in threads
          if res.get((name, n, "torch"), {}).get("ok")]
    return min(xs) if xs else None


def main_table(a, res, peak):
    header = ["model", "thr", "runtime", "ms", "spread", "GFLOP/s", "% peak", "peak RSS MB", "cold start ms",
              "CPU ms/call", "cores", "x ort", "x torch", "x torch best", "reps", "note"]
    rows = []
    for name in a.model_list:
        tb = torch_best(res, name, a.thread_list)
        for n in a.thread_list:
            for rt in RUNTIMES:
                s = res.get((name, n, rt))
                if s is None:
                    continue
                if not s.get("ok"):
                    rows.append([name, str(n), rt, "error"] + ["-"] * 11 + [s["note"][:90]])
                    continue
                pk = peak_share(s, peak, n)
                cpu = s.get("cpu_ms_per_call")
                cells = [name, str(n), rt, fmt(s["median_ms"], 2), f"{s['spread']:.0f}%" if s["n_ok"] > 1 else "-",
                         fmt(s.get("gflops")), fmt(pk, 0) + "%" if pk is not None else "-",
                         fmt(s["peak_rss_mb"], 0), fmt(s.get("cold_start_ms"), 0),
                         fmt(cpu, 1) + ("*" if rt == "tessera" and cpu is not None else ""),
                         fmt(cpu / s["median_ms"], 2) if cpu is not None else "-"]
                if rt == "tessera":
                    xo, xt = speedup(res, name, n, "ort"), speedup(res, name, n, "torch")
                    xb = tb[0] / s["median_ms"] if tb else None
                    cells += [fmt(xo, 2) + "x" if xo else "-", fmt(xt, 2) + "x" if xt else "-",
                              (fmt(xb, 2) + f"x (t{tb[1]})") if xb else "-"]
                else:
                    cells += ["", "", ""]
                cells += [s.get("reps", "-"), s["note"][:90]]
                rows.append(cells)
    return peers.table(header, rows, left={0, 2, len(header) - 1})


# Issue 15's speed targets against ORT, per model: (the multiple asked at a thread count, whether
# 85% of the FMA peak meets it instead, the verdict's text). benchmarks/model_targets.py reads it too.
ORT_TARGETS = {
    "vit_b_16": (lambda n: 1.05, True, "vit_b_16 >= 1.05x ORT or >= 85% of the FMA peak"),
    "swin_t": (lambda n: 1.2 if n == 1 else 1.3, False, "swin_t >= 1.3x ORT on 2 threads, 1.2x on 1"),
    "gpt": (lambda n: 1.3, True, "gpt prefill (T=512) >= 1.3x ORT or >= 85% of peak"),
    "transformer": (lambda n: 1.3, True, "nn.Transformer (S=T=128) >= 1.3x ORT or >= 85% of peak"),
}
# The share of the FMA probe (%) that meets a speed target in place of the ratio it asks for.
PEAK_SHARE_MET = 85


def peak_share(s, peak, n):
    """% of the FMA probe at n threads that aggregate s (agg's) reaches, or None without its
    GFLOP/s or a probe at n. The results table, check_targets and model_targets.py ask here."""
    return 100 * s["gflops"] / peak[n] if s.get("gflops") and n in peak else None


def meets_ort_target(name, n, x_ort, pct):
    """Whether a tessera row (x_ort: ORT ms / tessera ms, pct: % of the probe; either None) meets
    ORT_TARGETS[name] at n threads. check_targets and benchmarks/model_targets.py both ask here."""
    need_for, allow_peak, _ = ORT_TARGETS[name]
    return ((x_ort is not None and x_ort >= need_for(n))
            or (allow_peak and pct is not None and pct >= PEAK_SHARE_MET))


def meets_torch_target(x_torch_best, pct):
    """>= 2x PyTorch eager at its best thread count (x_torch_best: its ms / tessera ms), or 85%."""
    return ((x_torch_best is not None and x_torch_best >= 2.0)
            or (pct is not None and pct >= PEAK_SHARE_MET))


def check_targets(a, res, peak, metas, verif):
    lines = []

    def verdict(good, text):
        lines.append(("MET      " if good else "NOT MET  ") + text)

    def na(text):
        lines.append("n/a      " + text)

    def pct(name, n):
        t = res.get((name, n, "tessera"))
        return peak_share(t, peak, n) if t and t.get("ok") else None

    def vs_ort(name, need_for, allow_peak, what):
        parts, good, any_row = [], True, False
        for n in a.thread_list:
            need = need_for(n)
            x, p = speedup(res, name, n, "ort"), pct(name, n)
            if x is None and p is None:
                parts.append(f"t{n}: no rows")
                good = False
                continue
            any_row = True
            ok = meets_ort_target(name, n, x, p)
            good = good and ok
            parts.append(f"t{n}: " + (f"{x:.2f}x ORT" if x is not None else "no ORT row") + f" (need {need:g}x)"
                         + (f", {fmt(p, 0)}% of peak" if allow_peak else "")
                         + ("" if ok else " <-"))
        if not any_row:
            na(f"{what}: no rows")
        else:
            verdict(good, f"{what}: " + "; ".join(parts))

    for name, (need_for, allow_peak, what) in ORT_TARGETS.items():
        if name in a.model_list:
            vs_ort(name, need_for, allow_peak, what)
    # >= 2x PyTorch eager at PyTorch's best thread count (its fastest row over --threads), or 85%
    parts, good, seen = [], True, False
    for name in a.model_list:
        tb = torch_best(res, name, a.thread_list)
        for n in a.thread_list:
            t, p = res.get((name, n, "tessera")), pct(name, n)
            if not (t and t.get("ok")) or tb is None:
                parts.append(f"{name} t{n}: no rows")
                good = False
                continue
            seen = True
            x = tb[0] / t["median_ms"]
            ok = meets_torch_target(x, p)
            good = good and ok
            parts.append(f"{name} t{n}: {x:.2f}x torch@t{tb[1]}, {fmt(p, 0)}%" + ("" if ok else " <-"))
    if seen:
        verdict(good, ">= 2x PyTorch eager at its best thread count, or >= 85% of peak, everywhere: " + "; ".join(parts))
    else:
        na(">= 2x PyTorch eager: no rows")
    # peak RSS <= 1.15 x checkpoint + outputs + 32 MB (MiB as getrusage reports)
    for name in a.model_list:
        m = metas.get(name)
        rss = [res[(name, n, "tessera")]["peak_rss_mb"] for n in a.thread_list
               if res.get((name, n, "tessera"), {}).get("ok")]
        if not m or not rss:
            na(f"{name} peak RSS: no rows")
            continue
        ck, ob = m["checkpoint_bytes"] / 2**20, m["output_bytes"] / 2**20
        lim = 1.15 * ck + ob + 32
        verdict(max(rss) <= lim, f"{name} peak RSS {max(rss):.0f} MB <= 1.15 x checkpoint {ck:.1f} MB + outputs "
                                 f"{ob:.1f} MB + 32 MB = {lim:.0f} MB (max over threads and rounds; "
                                 f"(checkpoint + outputs + 32) x 1.15 would be {1.15 * (ck + ob + 32):.0f} MB)")
    # cold start <= half of ORT's session creation + first run
    for name in a.model_list:
        parts, good, seen = [], True, False
        for n in a.thread_list:
            t, o = res.get((name, n, "tessera")), res.get((name, n, "ort"))
            if not (t and t.get("ok") and o and o.get("ok")) or t.get("cold_start_ms") is None \
                    or o.get("cold_start_ms") is None:
                parts.append(f"t{n}: no rows")
                good = False
                continue
            seen = True
            ok = t["cold_start_ms"] <= 0.5 * o["cold_start_ms"]
            good = good and ok
            parts.append(f"t{n}: {t['cold_start_ms']:.0f} ms vs ORT {o['cold_start_ms']:.0f} ms "
                         f"(limit {0.5 * o['cold_start_ms']:.0f})" + ("" if ok else " <-"))
        if seen:
            verdict(good, f"{name} cold start <= half of ORT's session creation + first run: " + "; ".join(parts))
        else:
            na(f"{name} cold start: no rows")
    if verif:
        bad = [f"{name} {rt}" for name, v in verif.items() for rt, r in v.items()
               if r.get("status") != "ok" or not r.get("ok")]
        verdict(not bad, f"verification within {a.verify_tol:g} x max|output| of PyTorch: "
                         + ("all runtimes, all models" if not bad else "failed: " + ", ".join(bad)))
    return "\n".join(lines)


def plot(a, res, peak, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    colors = {"tessera": "#d62728", "ort": "#1f77b4", "torch": "#7f7f7f"}
    fig, axes = plt.subplots(1, len(a.thread_list), figsize=(1.5 + 1.6 * len(a.model_list) * len(a.thread_list), 4.4),
                             squeeze=False, sharey=True)
    rts = [rt for rt in RUNTIMES if any(res.get((m, n, rt)) for m in a.model_list for n in a.thread_list)]
    w = 0.8 / max(1, len(rts))
    for ax, n in zip(axes[0], a.thread_list):
        for j, rt in enumerate(rts):
            xs, ys, labels = [], [], []
            for i, name in enumerate(a.model_list):
                s = res.get((name, n, rt))
                if s and s.get("ok") and s.get("gflops"):
                    xs.append(i + (j - (len(rts) - 1) / 2) * w)
                    ys.append(s["gflops"])
                    labels.append(f"{s['median_ms']:.0f} ms" if s["median_ms"] >= 10 else f"{s['median_ms']:.1f} ms")
            bars = ax.bar(xs, ys, width=w * 0.95, color=colors[rt], label=rt)
            for b, lab in zip(bars, labels):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), lab, ha="center", va="bottom", fontsize=7,
                        rotation=90)
        if n in peak:
            ax.axhline(peak[n], color="black", ls="--", lw=1)
            ax.text(-0.45, peak[n], f"FMA probe {peak[n]:.0f} GFLOP/s", ha="left", va="bottom", fontsize=8)
            met_gflops = PEAK_SHARE_MET / 100 * peak[n]
            ax.axhline(met_gflops, color="black", ls=":", lw=0.8)
            ax.text(-0.45, met_gflops, f"{PEAK_SHARE_MET}%", ha="left", va="bottom", fontsize=7)
        top = max([peak.get(n, 0.0) for n in a.thread_list] + [s["gflops"] for s in res.values() if s.get("ok") and s.get("gflops")])
        ax.set_ylim(0, 1.25 * top)
        ax.set_xticks(range(len(a.model_list)))
        ax.set_xticklabels(a.model_list, fontsize=9)
        ax.set_title(f"{n} thread{'s' if n > 1 else ''}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("GFLOP/s (tessera's plan FLOPs / median time)")
    axes[0][-1].legend(fontsize=8, loc="upper right", ncol=len(rts))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot -> {path}")


def read_run(jsonl):
    """A run's .jsonl: (start meta, end meta, probes by "start"/"end", rows)."""
    meta, meta_end, probes, rows = {}, {}, {}, []
    with open(jsonl) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "meta" in r:
                (meta if r["meta"] == "start" else meta_end).update(r)
            elif "probe" in r:
                probes[r["when"]] = r
            elif r.get("kind") == "row":
                rows.append(r)
    return meta, meta_end, probes, rows


def probe_peaks(probes):
    """GFLOP/s per thread count at the run's start and end, and the peak '% peak' is taken
    against: the higher of the two."""
    pk0 = {int(k): v for k, v in probes.get("start", {}).get("probe", {}).items()}
    pk1 = {int(k): v for k, v in probes.get("end", {}).get("probe", {}).items()}
    peak = {n: max(pk0.get(n, 0.0), pk1.get(n, 0.0)) for n in set(pk0) | set(pk1)}
    return pk0, pk1, peak


def write_report(a, jsonl, stem):
    meta, meta_end, probes, rows = read_run(jsonl)
    pk0, pk1, peak = probe_peaks(probes)
    for k in ("model_list", "thread_list", "runtime_list", "target", "verify_tol"):
        if k in meta:
            setattr(a, k, meta[k])
    target = probes.get("start", {}).get("target", "?")
    res = agg(rows)
    metas = meta.get("models", {})
    verif = meta.get("verification", {})
    contended = sum(1 for r in rows if "CONTENDED" in (r.get("note") or ""))
    simd = sorted({str(r.get("simd_target")) for r in rows if r["runtime"] == "tessera" and r.get("simd_target")})
    head = [
        f"# tessera vs PyTorch eager / ONNX Runtime: whole models, float32, B=1  {meta.get('started', '?')}",
        meta.get("machine", "# host: ?"),
        meta.get("cpu", "# CPU: ?"),
        f"# Highway target: {target} (fma_probe{' --target ' + a.target if a.target else ', best available'}); "
        f"tessera bench reported simd_target {', '.join(simd) or '?'}"
        + (f"; forced with TESSERA_HWY_TARGET={a.target}" if a.target else ""),
        meta.get("versions", "# versions: ?"),
        "# peers' ISA: " + meta.get("peer_isa_text", "native (before --peer-isa existed)"),
        meta.get("openblas", "# OpenBLAS: ?"),
        f"# FMA probe (register-only FMA loop): start " + ", ".join(f"{n} thr {g:.1f}" for n, g in sorted(pk0.items()))
        + " GFLOP/s; end " + ", ".join(f"{n} thr {g:.1f}" for n, g in sorted(pk1.items()))
        + " GFLOP/s; '% peak' uses the higher of the two at the row's thread count",
        peers.per_cpu_text(probes.get("start", {}).get("per_cpu", []), probes.get("end", {}).get("per_cpu", [])),
        "# models:",
    ]
    for name in a.model_list:
        m = metas.get(name, {})
        ins = " ".join(f"{k}={v['shape']}{' int64' if v['dtype'] == 'I64' else ''}"
                       for k, v in MODELS[name]["inputs"].items())
        tp = m.get("tessera_parameters")
        ox = m.get("onnx", {})
        head.append(f"#   {name}: {MODELS[name]['what']}; inputs {ins}; {m.get('parameters', 0):,} parameters "
                    f"(tessera summary: {f'{tp:,}' if isinstance(tp, int) else '?'}); checkpoint "
                    f"{m.get('checkpoint_bytes', 0) / 2**20:.1f} MB, outputs {m.get('output_bytes', 0) / 2**20:.2f} MB; "
                    f"model.onnx {ox.get('bytes', 0) / 2**20:.1f} MB ({ox.get('method', '?')}, opset "
                    f"{ox.get('opset', '?')}, export warnings {ox.get('warnings', {})})")
    if verif:
        head.append(f"# verification: the fixed input (seed 0) through each runtime, max |runtime - PyTorch eager| "
                    f"over the output (rel = / max |PyTorch output|; tol {a.verify_tol:g}); torch = a fresh "
                    "torch_model.py process reloading state_dict.pt:")
        for name in a.model_list:
            if name in verif:
                head.append("#   " + verification_text(name, verif[name], a.verify_tol))
    else:
        head.append("# verification: skipped (--no-verify)")
    head += [
        "# ms = median over rounds of each process's median call; spread = (max - min) / median of the rounds' "
        "medians; one fresh process per round, model, threads and runtime, runtime order rotating per round",
        "# GFLOP/s = tessera's plan FLOPs (bench JSON 'flops') / ms, for every runtime; % peak = of the FMA probe "
        "at the row's thread count",
        "# cold start: tessera = load_ms + first_run_ms (network + weights + plan + inputs + first run); torch = module "
        "construction + torch.load + load_state_dict + first forward (import excluded); ORT = "
        "InferenceSession.create + first run",
        ("# tessera's panel cache: warm (--panel-cache <workdir>/panel-cache, written by the verification run): "
         "loads map the packed projection weights instead of packing them; ORT and torch keep no state between "
         "processes" if "panel_cache=on" in meta.get("settings", "") else
         "# tessera's panel cache: off (every load packs its projection weights)"),
        "# CPU ms/call: torch and ORT = user+sys of all their threads over the timed calls / calls; tessera (*) = "
        "the whole process's / all its calls (load included); cores = CPU ms/call / ms",
        "# 'x <peer>' = peer ms / tessera ms at the same thread count (> 1: tessera faster); 'x torch best' = "
        "PyTorch's fastest thread count",
        "# torch = Debian python3-torch under inference_mode (fused MHA / encoder-layer kernels where it has them), "
        "OMP_WAIT_POLICY=PASSIVE; ort = onnxruntime-node CPU EP, graphOptimizationLevel all, intraOp = threads, "
        "interOp 1, sequential",
        f"# {meta.get('settings', '')}; loadavg start {meta.get('load', '?')}, end {meta_end.get('load', '?')}; wall "
        f"{meta_end.get('wall_min', '?')} min; {contended} CONTENDED processes",
        f"# command: {meta.get('command', '?')}",
        f"# raw rows: {os.path.relpath(jsonl, REPO)}",
    ]
    raw = ["", "## Per-round medians (ms), in run order"]
    for name in a.model_list:
        for n in a.thread_list:
            for rt in RUNTIMES:
                s = res.get((name, n, rt))
                if s:
                    raw.append(f"#   {name} t{n} {rt}: " + " ".join(
                        fmt(r.get("median_ms"), 2) if r.get("status") == "ok" else r.get("status", "?")
                        for r in s["rows"]))
    report = "\n".join(head) + "\n\n## Whole models\n" + main_table(a, res, peak) + "\n"
    report += "\n## Targets (issue 15)\n"
    if contended:
        report += f"(caution: {contended} processes overlapped other load (CONTENDED))\n"
    report += check_targets(a, res, peak, metas, verif) + "\n" + "\n".join(raw) + "\n"
    with open(stem + ".txt", "w") as f:
        f.write(report)
    print(report)
    if not a.no_plot:
        plot(a, res, peak, stem + ".png", f"whole models, float32, B=1 - {os.path.basename(stem)} ({target})")
    log(f"report -> {stem}.txt")


# ---------------------------------------------------------------- header facts
def cpu_facts():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout

    def field(k):
        m = re.search(rf"^{k}:\s*(.*)$", out, re.M)
        return m.group(1).strip() if m else "?"
    flags = peers.cpu_flags()
    name = field("Model name")
    tag = re.sub(r"\(r\)|\(tm\)|\bcpu\b|@.*$|\bprocessor\b|\d+-core", "", name.lower())
    tag = re.sub(r"[^a-z0-9]+", "-", tag).strip("-") + f"-f{field('CPU family')}m{field('Model')}"
    avx = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni") if f in flags]
    line = (f"# CPU: {name} (family {field('CPU family')} model {field('Model')}); avx512f "
            f"{'present' if 'avx512f' in flags else 'ABSENT'} (flags: {' '.join(avx)})")
    return tag, line


def versions(a):
    git = a.rev or quiet(["git", "-C", REPO, "describe", "--always", "--dirty"])[1]
    tv = quiet(["/usr/bin/python3", "-c", "import torch, torchvision; print(torch.__version__, torchvision.__version__)"])[1]
    tv = (tv.split() + ["?", "?"])[:2]
    ort_v = quiet(["node", "-e", "console.log(require('onnxruntime-node').env.versions.node)"],
                  env=node_env(a), cwd=a.node_dir)[1] or "?"
    return (f"# tessera {git} ({a.tessera}); torch {tv[0]}; torchvision {tv[1]}; onnxruntime-node {ort_v}; "
            f"node {quiet(['node', '--version'])[1]}")


def openblas_line(a):
    code = ("import ctypes; l = ctypes.CDLL('libopenblas.so.0'); l.openblas_get_corename.restype = ctypes.c_char_p; "
            "print(l.openblas_get_corename().decode())")
    te = tessera_env(a)
    tcore = quiet(["/usr/bin/python3", "-c", code], env=te)[1] or "?"
    pe = peers.peer_env(a)
    c = torch_core(a)
    if c == "auto":
        pe.pop("OPENBLAS_CORETYPE", None)
    elif c != "env":
        pe["OPENBLAS_CORETYPE"] = c
    pcore = quiet(["/usr/bin/python3", "-c", code], env=pe)[1] or "?"
    return (f"# OpenBLAS core: tessera (GEMMs it leaves to OpenBLAS, one thread each) OPENBLAS_CORETYPE="
            f"{te.get('OPENBLAS_CORETYPE', '(unset)')} -> {tcore}; torch ({c}) -> {pcore}; ORT uses its own MLAS kernels")


def main():
    a = parse()
    if a.report_only:
        stem = a.report_only[:-len(".jsonl")] if a.report_only.endswith(".jsonl") else a.report_only
        write_report(a, a.report_only, stem)
        return 0
    cmdline = f"cd {REPO} && benchmarks/models.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    t_start = time.time()
    setup(a)
    peers.resolve_peer_isa(a, a.target, a.probe)
    log("peers' ISA: " + a.peer_isa_text)
    metas, verif = {}, {}
    for name in a.model_list:
        metas[name] = prepare(a, name)
    if not a.no_verify:
        for name in a.model_list:
            log(f"{name}: verification (tessera run, ORT, torch) against PyTorch's output")
            verif[name] = verify(a, name, metas[name])
            log("  " + verification_text(name, verif[name], a.verify_tol))
        bad = [f"{n} {rt}" for n, v in verif.items() for rt, r in v.items()
               if r.get("status") != "ok" or not r.get("ok")]
        if bad and not a.allow_mismatch:
            sys.exit("VERIFICATION FAILED: " + ", ".join(bad) + " (see above; --allow-mismatch to go on)")
    tag, cpu_line = cpu_facts()
    peers.wait_idle(a)
    peak, target, cpus = probe(a)
    log(f"FMA probe ({target}): " + ", ".join(f"{n} thr {g:.1f} GFLOP/s" for n, g in peak.items()))
    label = a.out or f"{datetime.date.today().isoformat()}-models-{tag}-{target.lower().replace('_', '-')}" \
        + ("-quick" if a.quick else "")
    stem = label if os.sep in label else os.path.join(REPO, "benchmarks/results", label)
    if stem.endswith(".txt") or stem.endswith(".jsonl"):
        stem = stem.rsplit(".", 1)[0]
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    jsonl = stem + ".jsonl"
    raw = open(jsonl, "w")

    def keep(r):
        raw.write(json.dumps(r) + "\n")
        raw.flush()
        return r

    keep({"meta": "start", "started": datetime.datetime.now().isoformat(timespec="seconds"), "command": cmdline,
          "machine": peers.machine(), "cpu": cpu_line, "versions": versions(a), "openblas": openblas_line(a),
          "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
          "settings": f"rounds={a.rounds} target_s={a.target_s} warmup_s={a.warmup_s} min_reps={a.min_reps} "
                      f"max_reps={a.max_reps} idle_max_cores={a.idle_max_cores} idle_wait={a.idle_wait:g} "
                      f"panel_cache={a.panel_cache}",
          "model_list": a.model_list, "thread_list": a.thread_list, "runtime_list": a.runtime_list,
          "target": a.target, "verify_tol": a.verify_tol, "models": metas, "verification": verif,
          "peer_isa": a.peer_isa, "peer_isa_text": a.peer_isa_text})
    keep({"probe": peak, "target": target, "when": "start", "per_cpu": cpus})

    cals = {}
    for name in a.model_list:
        for n in a.thread_list:
            one, fl, rec = calibrate(a, metas[name], name, n)
            reps = max(a.min_reps, min(a.max_reps, int(math.ceil(a.target_s / one))))
            warm = max(1, min(50, int(math.ceil(a.warmup_s / one))))
            cals[(name, n)] = {"one_s": one, "flops": fl, "reps": reps, "warmup": warm}
            keep({"calibration": name, "threads": n, "one_ms": round(one * 1e3, 3), "flops": fl, "reps": reps,
                  "warmup": warm, "record": rec})
            log(f"calibrated {name} t{n}: {one * 1e3:.1f} ms/call (tessera) -> warm-up {warm}, reps {reps}")
    est = sum(c["one_s"] * (c["reps"] + c["warmup"]) + 3.0 for c in cals.values()) * len(a.runtime_list) * a.rounds
    log(f"estimated time: {est / 60:.0f}+ min ({a.rounds} rounds x {len(cals)} configs x {len(a.runtime_list)} "
        "runtimes; peers slower than tessera take longer)")

    for k in range(a.rounds):
        order = a.runtime_list[k % len(a.runtime_list):] + a.runtime_list[:k % len(a.runtime_list)]
        for name in a.model_list:
            for n in a.thread_list:
                for rt in order:
                    r = keep(dict(run_one(a, metas[name], name, n, rt, cals[(name, n)], k), kind="row"))
                    log(f"round {k + 1}/{a.rounds} {name} t{n} {rt:<7}: {r['status']} {fmt(r.get('median_ms'), 2)} ms "
                        f"{fmt(r.get('gflops'))} GF/s RSS {fmt(r.get('peak_rss_mb'), 0)} MB cold "
                        f"{fmt(r.get('cold_start_ms'), 0)} ms {r.get('note', '')}")

    peers.wait_idle(a)
    peak_end, _, cpus_end = probe(a)
    keep({"probe": peak_end, "target": target, "when": "end", "per_cpu": cpus_end})
    keep({"meta": "end", "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
          "wall_min": round((time.time() - t_start) / 60, 1)})
    raw.close()
    write_report(a, jsonl, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
