#!/usr/bin/python3
"""One PyTorch eager benchmark process for benchmarks/models.py: a whole model, one thread count.

  /usr/bin/python3 benchmarks/models/torch_model.py --model swin_t --dir WORK/models/swin_t \
      --threads 2 [--warmup 2] [--reps R | --target-s 2.5 --min-reps 3 --max-reps 200]
  /usr/bin/python3 benchmarks/models/torch_model.py --model swin_t --dir DIR --verify OUT.safetensors

Builds the module PyTorch defines (specs.py: torchvision / torch.nn / the GPT reference), loads
DIR/state_dict.pt (prepare.py's weights), eval, and runs DIR/inputs.pt under
torch.inference_mode() (so the fused inference kernels PyTorch has are used). Threads:
torch.set_num_threads(N), set_num_interop_threads(1), and OPENBLAS_NUM_THREADS=N /
OMP_NUM_THREADS=N set before torch is imported (Debian's pthread OpenBLAS ignores
set_num_threads); OMP_WAIT_POLICY=PASSIVE unless set; OPENBLAS_CORETYPE removed (OpenBLAS
detects the CPU) unless --openblas-coretype env|NAME: the shared peer harness's rules.

Timing: cold_start_ms = module construction (default init) + torch.load + load_state_dict + the
first forward (import torch excluded); then --warmup untimed calls in all (the first one
included, at least 1), then the timed calls: --reps, or as many as fill --target-s judged from
the last warm-up call (within --min-reps..--max-reps). Prints one JSON line: median_ms min_ms
max_ms reps warmup cold_start_ms (build_ms load_ms first_run_ms) peak_rss_mb (getrusage maxrss,
the whole process) cpu_ms_per_call (user+sys of all threads over the timed calls / reps: a
"1 thread" run whose BLAS uses more cores shows here) torch_threads openblas_core.
--verify writes the first call's output (recipe output names) to OUT and prints the record.
"""
import argparse
import json
import math
import os
import resource
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dir", required=True, help="prepare.py's directory of this model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2, help="untimed calls, the first included (>= 1)")
    p.add_argument("--reps", type=int, default=0, help="timed calls (0: from --target-s)")
    p.add_argument("--target-s", type=float, default=2.5)
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--openblas-coretype", default="auto",
                   help="auto (unset, OpenBLAS detects), env (keep the environment's), or a core name")
    p.add_argument("--verify", default=None, metavar="OUT.safetensors")
    return p.parse_args()


args = parse()
# before torch (OpenBLAS, libgomp) is loaded
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if args.openblas_coretype == "auto":
    os.environ.pop("OPENBLAS_CORETYPE", None)
elif args.openblas_coretype != "env":
    os.environ["OPENBLAS_CORETYPE"] = args.openblas_coretype

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ctypes  # noqa: E402

import torch  # noqa: E402

import specs  # noqa: E402
from catalog import MODELS  # noqa: E402


def maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def openblas_core():
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except Exception as e:  # pragma: no cover
        return f"unknown({e.__class__.__name__})"


def main():
    a = args
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    spec = MODELS[a.model]
    rec = {"runtime": "torch", "model": a.model, "threads": a.threads, "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(), "openblas_core": openblas_core(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "base_rss_mb": round(maxrss_mb(), 1)}
    inputs = torch.load(os.path.join(a.dir, "inputs.pt"))
    xs = tuple(inputs[k] for k in spec["inputs"])

    t0 = time.perf_counter()
    bare = specs.module(a.model)
    t1 = time.perf_counter()
    sd = torch.load(os.path.join(a.dir, "state_dict.pt"))
    bare.load_state_dict(sd)
    del sd
    bare.eval()
    model = specs.wrapped(a.model, bare).eval()
    t2 = time.perf_counter()
    with torch.inference_mode():
        y = model(*xs)
        t3 = time.perf_counter()
        rec.update(build_ms=round((t1 - t0) * 1e3, 1), load_ms=round((t2 - t1) * 1e3, 1),
                   first_run_ms=round((t3 - t2) * 1e3, 1), cold_start_ms=round((t3 - t0) * 1e3, 1))
        if a.verify:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures"))
            from st_format import save_file
            save_file({spec["outputs"][0]: y.contiguous()}, a.verify)
            rec.update(status="ok", mode="verify", peak_rss_mb=round(maxrss_mb(), 1))
            print(json.dumps(rec))
            return
        last = t3 - t2
        for _ in range(max(1, a.warmup) - 1):
            s = time.perf_counter()
            model(*xs)
            last = time.perf_counter() - s
        reps = a.reps or max(a.min_reps, min(a.max_reps, int(math.ceil(a.target_s / max(last, 1e-6)))))
        ts = []
        c0 = cpu_s()
        for _ in range(reps):
            s = time.perf_counter()
            model(*xs)
            ts.append(time.perf_counter() - s)
        cpu = cpu_s() - c0
    ts.sort()
    n = len(ts)
    med = ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
    rec.update(status="ok", warmup=max(1, a.warmup), reps=reps, median_ms=round(med * 1e3, 4),
               min_ms=round(ts[0] * 1e3, 4), max_ms=round(ts[-1] * 1e3, 4),
               cpu_ms_per_call=round(cpu * 1e3 / reps, 3), peak_rss_mb=round(maxrss_mb(), 1))
    print(json.dumps(rec))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one JSON line whatever happens
        print(json.dumps({"runtime": "torch", "model": args.model, "threads": args.threads,
                          "status": "error", "error": f"{e.__class__.__name__}: {e}"[:400]}))
        sys.exit(1)
