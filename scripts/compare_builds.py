#!/usr/bin/python3
"""Runs two tessera CLI builds on the same inputs and compares what they write, byte for byte.

Issue 13's check that a refactor changed no result bit and no message:

    scripts/compare_builds.py OLD_TESSERA NEW_TESSERA [--threads 1,2] [--keep DIR] [-v]

Cases (each run once with OLD and once with NEW, at every --threads count unless it says not):
  - `run` of every network in fuzz/corpus/network/*.json, examples/spec/*.json and
    examples/encoder/encoder.json (with --weights examples/encoder/encoder.safetensors), and of
    the checkpoint examples/encoder/encoder.safetensors itself, on seeded random inputs built
    from the network's `inputs`: every symbolic dim bound to a small value (one value per
    symbol; bindings are tried until the NEW binary accepts one, as spatial_shape fixes T in
    some networks), two draws per network (a second binding and a larger scale when possible);
    float32 normal values, bool inputs random True/False;
  - the shipped example on its own input (examples/encoder/input.safetensors), as a checkpoint
    and as encoder.json + --weights;
  - every test fixture of tests/fixtures/attention/ and tests/fixtures/mha/ turned into a
    one-node network (its metadata `config` as the node's args, its weights as --weights, its
    inputs as --input), so the networks the C++ test suites run through the layers also go
    through both binaries;
  - larger shapes on networks built as benchmarks/peers.py builds them, the `attention` op and
    the example encoder (T past the kernels' tiles: 257, 300, 513, 1029 ...);
  - `summary` of every network above, `inspect` of the safetensors test fixtures and examples;
  - error cases (wrong input shape, rank, dtype, missing or extra inputs, mismatched symbols,
    broken files, bad options, ...): exit code, stdout and stderr text must match.

A case is `same` when the exit codes, stdout, stderr and the output file (bytes; or its absence)
all match. For a DIFFERENT output the differing tensors are decoded and the element counts and
largest differences printed, and OLD is run again to tell a build difference from a run-to-run
one. A case that OLD refuses with E_ARG and NEW runs (an op, a dotted node name or an int64 input
added after OLD) is `new-only`: a new capability, not a change. One line per case, then
`N same, M different, K new-only`; exit status 1 when any differ.

Only /usr/bin/python3 and its standard library (safetensors files are written by hand, as
tests/fixtures/st_format.py describes the format, without its numpy dependency). The test suite
does not use this script.
"""
import argparse
import glob
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# safetensors dtype <-> the network file's dtype names, and element sizes
NET_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
             "BOOL": "bool", "I64": "int64", "I32": "int32", "U8": "uint8"}
ST_DTYPE = {v: k for k, v in NET_DTYPE.items()}
ITEM = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "BOOL": 1, "I64": 8, "I32": 4, "U8": 1}


# ---------------------------------------------------------------- safetensors by hand
def st_bytes(entries, metadata=None):
    """entries: list of (name, dtype, shape, raw bytes) -> the file's bytes (names sorted)."""
    entries = sorted(entries, key=lambda e: e[0])
    head = {}
    if metadata:
        head["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, raw in entries:
        n = math.prod(shape) * ITEM[dtype]
        assert n == len(raw), (name, dtype, shape, len(raw))
        head[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(e[3] for e in entries)


def st_write(path, entries, metadata=None):
    with open(path, "wb") as f:
        f.write(st_bytes(entries, metadata))


def st_parse(data):
    """-> (metadata dict, {name: (dtype, shape, raw)})"""
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    meta = head.pop("__metadata__", {}) or {}
    body = data[8 + n:]
    out = {}
    for name, info in head.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), body[b:e])
    return meta, out


def st_read(path):
    with open(path, "rb") as f:
        return st_parse(f.read())


def decode(dtype, raw):
    """raw little-endian elements -> list of Python floats (bools as 0/1)"""
    if dtype == "F32":
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if dtype == "F64":
        return list(struct.unpack(f"<{len(raw) // 8}d", raw))
    if dtype == "F16":
        return list(struct.unpack(f"<{len(raw) // 2}e", raw))
    if dtype == "BF16":
        hs = struct.unpack(f"<{len(raw) // 2}H", raw)
        return list(struct.unpack(f"<{len(hs)}f", struct.pack(f"<{len(hs)}I", *(h << 16 for h in hs))))
    if dtype in ("BOOL", "U8"):
        return list(raw)
    raise ValueError(dtype)


def to_f32(dtype, raw):
    v = decode(dtype, raw)
    return struct.pack(f"<{len(v)}f", *v)


def rand_tensor(rng, dtype, shape, scale):
    n = math.prod(shape)
    if dtype == "BOOL":
        return bytes(1 if rng.random() < 0.5 else 0 for _ in range(n))
    vals = [rng.gauss(0.0, scale) for _ in range(n)]
    if dtype == "F32":
        return struct.pack(f"<{n}f", *vals)
    if dtype == "F64":
        return struct.pack(f"<{n}d", *vals)
    if dtype == "F16":
        return struct.pack(f"<{n}e", *vals)
    if dtype == "I32":
        return struct.pack(f"<{n}i", *(int(v) for v in vals))
    if dtype == "I64":  # token ids: 0 and 1 are inside every embedding table
        return struct.pack(f"<{n}q", *(rng.randrange(2) for _ in range(n)))
    raise ValueError(dtype)


def f32_bits(x):
    """float32 value -> ordered integer (for ulp distances)"""
    (i,) = struct.unpack("<i", struct.pack("<f", x))
    return i if i >= 0 else -(i & 0x7FFFFFFF)


# ---------------------------------------------------------------- networks and inputs
def input_specs(net):
    """network JSON -> [(name, shape list with ints and symbol strings, safetensors dtype)]"""
    out = []
    for name, v in net["inputs"].items():
        if isinstance(v, dict):
            out.append((name, v["shape"], ST_DTYPE.get(v.get("dtype", "float32"), "F32")))
        else:
            out.append((name, v, "F32"))
    return out


def symbols_of(specs):
    seen = []
    for _, shape, _ in specs:
        for d in shape:
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


# candidate values per symbol position, tried in order
BINDINGS = [[2, 3, 5, 7], [3, 5, 7, 2], [1, 4, 6, 3], [2, 2, 2, 2], [3, 3, 3, 3], [1, 1, 1, 1],
            [4, 4, 4, 4], [5, 5, 5, 5], [2, 4, 4, 4], [3, 9, 9, 9], [2, 16, 16, 16],
            [2, 6, 6, 6], [2, 8, 8, 8], [2, 12, 12, 12], [2, 64, 64, 64]]


def bind(shape, binding):
    return [binding[d] if isinstance(d, str) else d for d in shape]


def case_seed(*parts):
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def random_inputs(specs, binding, seed, scale):
    rng = random.Random(seed)
    return [(name, dt, bind(shape, binding), rand_tensor(rng, dt, bind(shape, binding), scale))
            for name, shape, dt in specs]


def rel(path):
    return os.path.relpath(path, REPO)


# ---------------------------------------------------------------- running and comparing
class Compare:
    def __init__(self, old, new, work, verbose):
        self.old, self.new, self.work, self.verbose = old, new, work, verbose
        self.same = 0
        self.different = []
        self.new_only = []
        self.errors_both = 0
        self.n = 0

    def _exec(self, exe, argv, out_path):
        if out_path and os.path.exists(out_path):
            os.remove(out_path)
        proc = subprocess.Popen([exe] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        stdout, stderr = proc.communicate(timeout=900)
        out = None
        if out_path and os.path.exists(out_path):
            with open(out_path, "rb") as f:
                out = f.read()
            os.remove(out_path)
        # not differences: the binary's own path (usage messages) and the process id in the name
        # of the output's temporary file (`cannot create OUT.tmp.<pid>.<n>`)
        def norm(b):
            return b.replace(exe.encode(), b"TESSERA").replace(f".tmp.{proc.pid}.".encode(), b".tmp.PID.")
        return {"rc": proc.returncode, "stdout": norm(stdout), "stderr": norm(stderr), "out": out}

    def run_new(self, argv, out_path=None):
        return self._exec(self.new, argv, out_path)

    def case(self, label, argv, out_path=None, expect_ok=None):
        """Runs argv with OLD then NEW (same paths), compares, prints one line."""
        self.n += 1
        a = self._exec(self.old, argv, out_path)
        b = self._exec(self.new, argv, out_path)
        diffs = []
        for k in ("rc", "stdout", "stderr"):
            if a[k] != b[k]:
                diffs.append(k)
        if a["out"] != b["out"]:
            diffs.append("output")
        tag = "" if a["rc"] == 0 else f" (exit {a['rc']})"
        if a["rc"] != 0 and b["rc"] != 0:
            self.errors_both += 1
        if diffs and a["rc"] == 2 and b["rc"] == 0 and b"E_ARG" in a["stderr"]:
            # OLD refuses what NEW runs (an op, a dotted node name or an int64 input added
            # since): a new capability, not a changed result.
            self.new_only.append(label)
            print(f"new-only   {label}: old: " + a["stderr"].decode(errors="replace").strip()[:160],
                  flush=True)
            return
        if not diffs:
            self.same += 1
            print(f"same       {label}{tag}", flush=True)
            if self.verbose and a["stderr"]:
                print("           stderr: " + a["stderr"].decode(errors="replace").strip()[:300])
            if expect_ok is not None and (a["rc"] == 0) != expect_ok:
                print(f"           note: expected {'success' if expect_ok else 'an error'}, "
                      f"both exited {a['rc']}: " + a["stderr"].decode(errors="replace").strip()[:200])
            return
        self.different.append(label)
        print(f"DIFFERENT  {label}: {', '.join(diffs)}", flush=True)
        print(f"           command: tessera {' '.join(argv)}")
        for k in ("rc", "stdout", "stderr"):
            if k in diffs:
                sa = a[k] if k == "rc" else a[k].decode(errors="replace").strip()
                sb = b[k] if k == "rc" else b[k].decode(errors="replace").strip()
                print(f"           old {k}: {str(sa)[:400]!r}")
                print(f"           new {k}: {str(sb)[:400]!r}")
        if "output" in diffs:
            for line in describe_output_diff(a["out"], b["out"]):
                print("           " + line)
            again = self._exec(self.old, argv, out_path)
            print("           old run again: " + ("identical to the first old run" if again["out"] == a["out"]
                                                   else "DIFFERS from the first old run (old is not deterministic)"))


def describe_output_diff(a, b):
    if a is None or b is None:
        return [f"output written: old {a is not None}, new {b is not None}"]
    try:
        ma, ta = st_parse(a)
        mb, tb = st_parse(b)
    except Exception as e:  # noqa: BLE001
        return [f"outputs differ ({len(a)} vs {len(b)} bytes) and do not parse: {e}"]
    lines = []
    if ma != mb:
        lines.append(f"metadata: old {ma} new {mb}")
    if sorted(ta) != sorted(tb):
        lines.append(f"tensor names: old {sorted(ta)} new {sorted(tb)}")
    if a[:8 + struct.unpack('<Q', a[:8])[0]] != b[:8 + struct.unpack('<Q', b[:8])[0]] and not lines:
        lines.append("headers differ")
    for name in sorted(set(ta) & set(tb)):
        (da, sa, ra), (db, sb, rb) = ta[name], tb[name]
        if (da, sa) != (db, sb):
            lines.append(f"{name}: old {da} {sa}, new {db} {sb}")
            continue
        if ra == rb:
            lines.append(f"{name}: identical")
            continue
        va, vb = decode(da, ra), decode(db, rb)
        idx = [i for i, (x, y) in enumerate(zip(va, vb)) if struct.pack("<f", x) != struct.pack("<f", y)] \
            if da == "F32" else [i for i, (x, y) in enumerate(zip(va, vb)) if x != y]
        fin = [i for i in idx if math.isfinite(va[i]) and math.isfinite(vb[i])]
        mad = max((abs(va[i] - vb[i]) for i in fin), default=0.0)
        mref = max((abs(x) for x in va if math.isfinite(x)), default=0.0)
        ulp = max((abs(f32_bits(va[i]) - f32_bits(vb[i])) for i in fin), default=0) if da == "F32" else "-"
        first = idx[0]
        lines.append(f"{name} {da} {sa}: {len(idx)} of {len(va)} elements differ; max |old-new| {mad:.3g} "
                     f"(max |old| {mref:.3g}), max {ulp} ulp; first at flat index {first}: "
                     f"old {va[first]!r} new {vb[first]!r}; non-finite mismatches {len(idx) - len(fin)}")
    return lines


# ---------------------------------------------------------------- the cases
def network_files():
    nets = sorted(glob.glob(os.path.join(REPO, "fuzz/corpus/network/*.json")))
    nets += sorted(glob.glob(os.path.join(REPO, "examples/spec/*.json")))
    nets.append(os.path.join(REPO, "examples/encoder/encoder.json"))
    return nets


ENC_DIR = os.path.join(REPO, "examples/encoder")
ENC_JSON = os.path.join(ENC_DIR, "encoder.json")
ENC_CKPT = os.path.join(ENC_DIR, "encoder.safetensors")
ENC_INPUT = os.path.join(ENC_DIR, "input.safetensors")


def find_bindings(cmp, netarg, extra, specs, work, stem, want=2):
    """Bindings of the symbolic dims that the NEW binary runs; at most `want`, distinct."""
    syms = symbols_of(specs)
    if not syms:
        return [{}]
    found = []
    probe_in = os.path.join(work, stem + ".probe.in.safetensors")
    probe_out = os.path.join(work, stem + ".probe.out.safetensors")
    last_err = ""
    for vals in BINDINGS:
        b = dict(zip(syms, vals))
        if b in found:
            continue
        st_write(probe_in, [(n, dt, s, raw) for n, dt, s, raw in random_inputs(specs, b, 1, 1.0)])
        r = cmp.run_new(["run", netarg] + extra + ["--input", probe_in, "--output", probe_out, "--threads", "1"],
                        probe_out)
        if r["rc"] == 0:
            found.append(b)
            if len(found) == want:
                break
        else:
            last_err = r["stderr"].decode(errors="replace").strip()
    if not found:
        print(f"# {stem}: no binding of {syms} runs with NEW; last error: {last_err[:300]}")
    return found


def run_network_cases(cmp, threads, work, netpath, netarg, extra, label, bindings=None):
    with open(netpath) as f:
        net = json.load(f)
    specs = input_specs(net)
    stem = label.replace("/", "_").replace(" ", "_")
    if bindings is None:
        bindings = find_bindings(cmp, netarg, extra, specs, work, stem)
    out = os.path.join(work, stem + ".out.safetensors")
    draws = [(bindings[0], 1.0)] + [(bindings[1] if len(bindings) > 1 else bindings[0], 4.0)]
    for k, (b, scale) in enumerate(draws if bindings else []):
        inp = os.path.join(work, f"{stem}.in{k}.safetensors")
        st_write(inp, [(n, dt, s, raw) for n, dt, s, raw in random_inputs(specs, b, case_seed(label, k), scale)])
        bdesc = ",".join(f"{s}={v}" for s, v in b.items()) or "fixed"
        for t in threads:
            cmp.case(f"run {label} [{bdesc}] draw{k} scale{scale:g} threads={t}",
                     ["run", netarg] + extra + ["--input", inp, "--output", out, "--seed", "0",
                                                "--threads", str(t)], out, expect_ok=True)
        if k == 0:
            sh = []
            for n, _, s, _ in random_inputs(specs, b, 0, 1.0):
                sh += ["--shape", f"{n}={','.join(map(str, s))}"]
            cmp.case(f"summary {label} [{bdesc}]", ["summary", netarg] + sh)
    cmp.case(f"summary {label}", ["summary", netarg])
    return specs, bindings


def fixture_attention(path, work):
    """tests/fixtures/attention/X.safetensors -> (net path, weights path, input path) variants"""
    meta, t = st_read(path)
    cfg = json.loads(meta["config"])
    name = os.path.basename(path)[:-len(".safetensors")]
    xd, xs, xr = t["x"]
    weights = [("attn." + n, d, s, r) for n, (d, s, r) in t.items() if n not in ("x", "out")]
    wpath = os.path.join(work, f"fx_att_{name}.weights.safetensors")
    st_write(wpath, weights)
    variants = []
    for tag, dt, raw in [("", xd, xr)] + ([("x-as-f32", "F32", to_f32(xd, xr))] if xd != "F32" else []):
        net = {"inputs": {"x": {"shape": xs, "dtype": NET_DTYPE[dt]}},
               "nodes": [{"name": "attn", "op": "attention", "args": cfg, "inputs": {"x": "x"}}],
               "outputs": {"y": "attn"}}
        npath = os.path.join(work, f"fx_att_{name}{tag}.json")
        with open(npath, "w") as f:
            json.dump(net, f)
        ipath = os.path.join(work, f"fx_att_{name}{tag}.in.safetensors")
        st_write(ipath, [("x", dt, xs, raw)])
        variants.append((f"{name}{' ' + tag if tag else ''}", npath, wpath, ipath))
    return variants


MHA_ARGS = ("embed_dim", "num_heads", "dropout", "bias", "add_bias_kv", "add_zero_attn", "kdim", "vdim",
            "batch_first", "need_weights", "average_attn_weights", "is_causal")


def fixture_mha(path, work):
    meta, t = st_read(path)
    cfg = json.loads(meta["config"])
    name = os.path.basename(path)[:-len(".safetensors")]
    args = {k: cfg[k] for k in MHA_ARGS if k in cfg and cfg[k] is not None}
    weights = [("m." + n[2:], d, s, r) for n, (d, s, r) in t.items() if n.startswith("w.")]
    wpath = os.path.join(work, f"fx_mha_{name}.weights.safetensors")
    st_write(wpath, weights)
    names = [n for n in ("query", "key", "value", "attn_mask", "key_padding_mask") if n in t]
    node_in = {"query": "query"}
    node_in["key"] = "key" if "key" in t else "query"
    node_in["value"] = "value" if "value" in t else node_in["key"]
    for n in ("attn_mask", "key_padding_mask"):
        if n in t:
            node_in[n] = n
    outputs = {"y": "m"}
    if cfg.get("need_weights", True):
        outputs["w"] = "m.weights"
    variants = []
    lowp = any(t[n][0] not in ("F32", "BOOL") for n in names)
    for tag in [""] + (["inputs-as-f32"] if lowp else []):
        ins = []
        for n in names:
            d, s, r = t[n]
            if tag and d not in ("F32", "BOOL"):
                d, r = "F32", to_f32(d, r)
            ins.append((n, d, s, r))
        net = {"inputs": {n: {"shape": s, "dtype": NET_DTYPE[d]} for n, d, s, _ in ins},
               "nodes": [{"name": "m", "op": "multihead_attention", "args": args, "inputs": node_in}],
               "outputs": outputs}
        npath = os.path.join(work, f"fx_mha_{name}{tag}.json")
        with open(npath, "w") as f:
            json.dump(net, f)
        ipath = os.path.join(work, f"fx_mha_{name}{tag}.in.safetensors")
        st_write(ipath, ins)
        variants.append((f"{name}{' ' + tag if tag else ''}", npath, wpath, ipath))
    return variants


def fixture_cases(cmp, threads, work):
    for d, make in (("attention", fixture_attention), ("mha", fixture_mha)):
        for path in sorted(glob.glob(os.path.join(REPO, f"tests/fixtures/{d}/*.safetensors"))):
            for label, npath, wpath, ipath in make(path, work):
                out = os.path.join(work, "fx.out.safetensors")
                for t in threads:
                    cmp.case(f"run fixture {d}/{label} threads={t}",
                             ["run", npath, "--weights", wpath, "--input", ipath, "--output", out,
                              "--threads", str(t)], out)
                cmp.case(f"summary fixture {d}/{label}", ["summary", npath])


def mha_net(D, H, causal):
    """benchmarks/peers.py's MultiheadAttention network (batch_first self-attention)"""
    return {"dtype": "float32", "inputs": {"x": ["B", "T", D]},
            "nodes": [{"name": "mha", "op": "multihead_attention",
                       "args": {"embed_dim": D, "num_heads": H, "batch_first": True, "need_weights": False,
                                "is_causal": bool(causal)}, "inputs": {"query": "x"}}],
            "outputs": {"y": "mha"}}


def large_cases(cmp, threads, work):
    """Shapes past the kernels' tiles and panels (T not a multiple of them), random-init weights."""
    nets = []
    for causal in (0, 1):
        nets.append((f"peers-style mha D=64 H=4 causal={causal}", mha_net(64, 4, causal),
                     [{"B": 2, "T": 300}, {"B": 1, "T": 513}]))
    nets.append(("peers-style mha D=512 H=8 causal=1", mha_net(512, 8, 1), [{"B": 1, "T": 257}]))
    nets.append(("peers-style mha D=96 H=3 need_weights", dict(mha_net(96, 3, 0), outputs={"y": "mha",
                 "w": "mha.weights"}), [{"B": 2, "T": 130}]))
    nets[-1][1]["nodes"][0]["args"]["need_weights"] = True
    for causal, rope in ((0, False), (1, True)):
        args = {"heads": 4, "causal": bool(causal), "rope": rope}
        nets.append((f"attention D=64 H=4 causal={causal} rope={int(rope)}",
                     {"inputs": {"x": ["B", "T", 64]}, "nodes": [{"name": "a", "op": "attention", "args": args,
                      "inputs": {"x": "x"}}], "outputs": {"y": "a"}}, [{"B": 2, "T": 300}, {"B": 1, "T": 515}]))
    nets.append(("attention relpos 17x19", {"inputs": {"x": ["B", 323, 32]}, "nodes": [{"name": "a",
                 "op": "attention", "args": {"heads": 2, "relative_position_bias": True, "spatial_shape": [17, 19]},
                 "inputs": {"x": "x"}}], "outputs": {"y": "a"}}, [{"B": 2}]))
    for label, spec, bindings in nets:
        p = os.path.join(work, "large_" + label.replace(" ", "_").replace("=", "") + ".json")
        with open(p, "w") as f:
            json.dump(spec, f)
        run_network_cases(cmp, threads, work, p, p, [], "large " + label, bindings)
    run_network_cases(cmp, threads, work, ENC_JSON, ENC_JSON, ["--weights", ENC_CKPT],
                      "large examples/encoder/encoder.json +weights", [{"B": 2, "T": 300}, {"B": 1, "T": 1029}])


def error_cases(cmp, threads, work):
    """Failures (and a few warnings): the exit code and every byte of the messages must match."""
    t = str(threads[-1])
    out = os.path.join(work, "err.out.safetensors")
    ex1 = os.path.join(REPO, "examples/spec/example1.json")
    ex4 = os.path.join(REPO, "examples/spec/example4.json")
    sym = os.path.join(REPO, "fuzz/corpus/network/symbolic.json")
    masks = os.path.join(REPO, "fuzz/corpus/network/mha_masks.json")
    kdim = os.path.join(REPO, "fuzz/corpus/network/mha_batch_first_kdim.json")
    rng = random.Random(13)

    def inp(stem, tensors):
        p = os.path.join(work, f"err_{stem}.safetensors")
        st_write(p, [(n, dt, s, rand_tensor(rng, dt, s, 1.0)) for n, dt, s in tensors])
        return p

    def run(label, net, input_path, extra=(), expect_ok=False):
        cmp.case(f"error {label}", ["run", net] + list(extra) + ["--input", input_path, "--output", out,
                                                                  "--threads", t], out, expect_ok=expect_ok)

    run("example1 wrong last dim", ex1, inp("ex1_dim", [("x", "F32", [2, 8, 31])]))
    run("example1 wrong fixed dim", ex1, inp("ex1_fixed", [("x", "F32", [2, 9, 32])]))
    run("example1 wrong rank", ex1, inp("ex1_rank", [("x", "F32", [8, 32])]))
    run("example1 zero batch", ex1, inp("ex1_zero", [("x", "F32", [0, 8, 32])]), expect_ok=None)
    run("example1 missing input", ex1, inp("ex1_missing", [("y", "F32", [2, 8, 32])]))
    run("example1 extra input", ex1, inp("ex1_extra", [("x", "F32", [2, 8, 32]), ("z", "F32", [1])]),
        expect_ok=None)
    run("example1 float64 input", ex1, inp("ex1_f64", [("x", "F64", [2, 8, 32])]), expect_ok=None)
    run("example1 float16 input", ex1, inp("ex1_f16", [("x", "F16", [2, 8, 32])]), expect_ok=None)
    run("example1 int32 input", ex1, inp("ex1_i32", [("x", "I32", [2, 8, 32])]))
    run("example1 bool input", ex1, inp("ex1_bool", [("x", "BOOL", [2, 8, 32])]), expect_ok=None)
    run("example4 T not the spatial grid", ex4, inp("ex4_t", [("x", "F32", [2, 15, 16])]))
    run("symbolic B mismatch", sym, inp("sym_b", [("x", "F32", [2, 3, 8]), ("z", "F32", [3, 3, 8])]))
    run("symbolic T mismatch", sym, inp("sym_t", [("x", "F32", [2, 3, 8]), ("z", "F32", [2, 4, 8])]))
    run("mha_masks float pad mask", masks, inp("mha_padf", [("q", "F32", [3, 2, 8]), ("k", "F32", [5, 2, 8]),
                                                           ("pad", "F32", [2, 5]), ("am", "F32", [3, 5])]),
        expect_ok=None)
    run("mha_masks attn_mask wrong shape", masks, inp("mha_am", [("q", "F32", [3, 2, 8]), ("k", "F32", [5, 2, 8]),
                                                                ("pad", "BOOL", [2, 5]), ("am", "F32", [3, 4])]))
    run("mha kdim wrong", kdim, inp("mha_kdim", [("q", "F32", [2, 3, 8]), ("k", "F32", [2, 4, 7]),
                                                ("v", "F32", [2, 4, 5])]))
    run("mha key/value length mismatch", kdim, inp("mha_kv", [("q", "F32", [2, 3, 8]), ("k", "F32", [2, 4, 6]),
                                                             ("v", "F32", [2, 5, 5])]))
    # the encoder with weights: wrong width, strict and non-strict weight problems
    enc_in = inp("enc_ok", [("x", "F32", [2, 5, 64])])
    run("encoder wrong width", ENC_JSON, inp("enc_w", [("x", "F32", [2, 5, 63])]), ["--weights", ENC_CKPT])
    _, ck = st_read(ENC_CKPT)
    partial = os.path.join(work, "err_enc_partial.safetensors")
    st_write(partial, [(n, d, s, r) for n, (d, s, r) in ck.items() if not n.startswith("b1_fc2")])
    run("encoder missing weights (strict)", ENC_JSON, enc_in, ["--weights", partial])
    run("encoder missing weights (non-strict)", ENC_JSON, enc_in, ["--weights", partial, "--non-strict"],
        expect_ok=True)
    extra_w = os.path.join(work, "err_enc_extra.safetensors")
    st_write(extra_w, [(n, d, s, r) for n, (d, s, r) in ck.items()] + [("unused.weight", "F32", [2], b"\0" * 8)])
    run("encoder unexpected weight (strict)", ENC_JSON, enc_in, ["--weights", extra_w])
    run("encoder unexpected weight (non-strict)", ENC_JSON, enc_in, ["--weights", extra_w, "--non-strict"],
        expect_ok=True)
    bad_shape = os.path.join(work, "err_enc_badshape.safetensors")
    st_write(bad_shape, [(n, d, [s[0] - 1] + s[1:], r[:len(r) // s[0] * (s[0] - 1)]) if n == "b0_fc1.bias"
                         else (n, d, s, r) for n, (d, s, r) in ck.items()])
    run("encoder weight of wrong shape", ENC_JSON, enc_in, ["--weights", bad_shape])
    f64w = os.path.join(work, "err_enc_f64.safetensors")
    st_write(f64w, [(n, "F64", s, struct.pack(f"<{len(r) // 4}d", *decode("F32", r))) if n == "final_ln.weight"
                    else (n, d, s, r) for n, (d, s, r) in ck.items()])
    run("encoder one float64 weight", ENC_JSON, enc_in, ["--weights", f64w], expect_ok=None)
    # non-finite inputs are not errors: the bytes must still match
    nan_in = os.path.join(work, "err_nan.safetensors")
    vals = [rng.gauss(0, 1) for _ in range(2 * 8 * 32)]
    vals[3], vals[100], vals[300] = float("nan"), float("inf"), float("-inf")
    st_write(nan_in, [("x", "F32", [2, 8, 32], struct.pack(f"<{len(vals)}f", *vals))])
    run("example1 NaN/Inf in input", ex1, nan_in, expect_ok=True)
    enc_nan = os.path.join(work, "err_enc_nan.safetensors")
    vals = [rng.gauss(0, 1) for _ in range(2 * 3 * 64)]
    vals[5], vals[64 * 4 + 1] = float("nan"), float("inf")
    st_write(enc_nan, [("x", "F32", [2, 3, 64], struct.pack(f"<{len(vals)}f", *vals))])
    run("encoder NaN/Inf in input", ENC_CKPT, enc_nan, expect_ok=True)
    # broken files
    garbage = os.path.join(work, "err_garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"this is not a safetensors file")
    trunc = os.path.join(work, "err_trunc.safetensors")
    with open(trunc, "wb") as f:
        f.write(st_bytes([("x", "F32", [2, 8, 32], b"\0" * 2048)])[:-100])
    run("input not safetensors", ex1, garbage)
    run("input truncated", ex1, trunc)
    run("input missing file", ex1, os.path.join(work, "no_such_input.safetensors"))
    run("weights not safetensors", ENC_JSON, enc_in, ["--weights", garbage])
    bad_json = os.path.join(work, "err_bad.json")
    with open(bad_json, "w") as f:
        f.write('{"inputs": {"x": [1]}, "nodes": [')
    nets = {
        "unknown op": {"inputs": {"x": [2, 4]}, "nodes": [{"name": "n", "op": "conv", "inputs": {"x": "x"}}],
                       "outputs": {"y": "n"}},
        "heads do not divide": {"inputs": {"x": ["B", 8, 30]}, "nodes": [{"name": "n", "op": "attention",
                                "args": {"heads": 4}, "inputs": {"x": "x"}}], "outputs": {"y": "n"}},
        "unknown arg": {"inputs": {"x": [2, 4]}, "nodes": [{"name": "n", "op": "gelu", "args": {"bogus": 1},
                        "inputs": {"x": "x"}}], "outputs": {"y": "n"}},
        "add shapes do not broadcast": {"inputs": {"a": [2, 4], "b": [2, 5]}, "nodes": [{"name": "s", "op": "add",
                                        "inputs": {"a": "a", "b": "b"}}], "outputs": {"y": "s"}},
        "int64 input": {"inputs": {"x": {"shape": [2, 4], "dtype": "int64"}}, "nodes": [{"name": "n", "op": "gelu",
                        "inputs": {"x": "x"}}], "outputs": {"y": "n"}},
        "float16 network": {"dtype": "float16", "inputs": {"x": [2, 4]}, "nodes": [{"name": "n", "op": "gelu",
                            "inputs": {"x": "x"}}], "outputs": {"y": "n"}},
        "undefined node input": {"inputs": {"x": [2, 4]}, "nodes": [{"name": "n", "op": "gelu",
                                 "inputs": {"x": "nope"}}], "outputs": {"y": "n"}},
        "mha embed_dim mismatch": {"inputs": {"x": [4, 2, 6]}, "nodes": [{"name": "m", "op": "multihead_attention",
                                   "args": {"embed_dim": 8, "num_heads": 2}, "inputs": {"query": "x"}}],
                                   "outputs": {"y": "m"}},
        "mha num_heads does not divide": {"inputs": {"x": [4, 2, 8]}, "nodes": [{"name": "m",
                                          "op": "multihead_attention", "args": {"embed_dim": 8, "num_heads": 3},
                                          "inputs": {"query": "x"}}], "outputs": {"y": "m"}},
        "linear unknown argument": {"inputs": {"x": [2, 5]}, "nodes": [{"name": "l", "op": "linear",
                                    "args": {"in_features": 4, "out_features": 3}, "inputs": {"x": "x"}}],
                                    "outputs": {"y": "l"}},
        "linear out_features 0": {"inputs": {"x": [2, 5]}, "nodes": [{"name": "l", "op": "linear",
                                  "args": {"out_features": 0}, "inputs": {"x": "x"}}], "outputs": {"y": "l"}},
        "layer_norm wrong normalized_shape": {"inputs": {"x": [2, 5]}, "nodes": [{"name": "n", "op": "layer_norm",
                                              "args": {"normalized_shape": [4]}, "inputs": {"x": "x"}}],
                                              "outputs": {"y": "n"}},
        "concat mismatched dims": {"inputs": {"a": [2, 4], "b": [3, 5]}, "nodes": [{"name": "c", "op": "concat",
                                   "args": {"dim": -1}, "inputs": {"x0": "a", "x1": "b"}}], "outputs": {"y": "c"}},
        "chunk does not divide": {"inputs": {"x": [2, 5]}, "nodes": [{"name": "c", "op": "chunk",
                                  "args": {"chunks": 2, "dim": -1}, "inputs": {"x": "x"}}],
                                  "outputs": {"y": "c.0"}},
    }
    x24 = inp("x24", [("x", "F32", [2, 4])])
    for label, spec in nets.items():
        p = os.path.join(work, "err_net_" + label.replace(" ", "_").replace("/", "_") + ".json")
        with open(p, "w") as f:
            json.dump(spec, f)
        cmp.case(f"error summary net: {label}", ["summary", p])
        run(f"net: {label}", p, x24, expect_ok=None)
    cmp.case("error summary broken JSON", ["summary", bad_json])
    cmp.case("error summary missing network", ["summary", os.path.join(work, "missing.json")])
    cmp.case("error summary bad --shape", ["summary", sym, "--shape", "x=2,,8"])
    cmp.case("error summary --shape unknown input", ["summary", sym, "--shape", "q=2,3,8"])
    cmp.case("error summary --shape wrong rank", ["summary", sym, "--shape", "x=2,3"])
    good_in = inp("ex1_ok", [("x", "F32", [2, 8, 32])])
    for label, extra in (("--threads 0", ["--threads", "0"]), ("--threads abc", ["--threads", "abc"]),
                         ("--seed -1", ["--seed", "-1"]), ("--seed abc", ["--seed", "abc"]),
                         ("unknown option", ["--frobnicate"])):
        cmp.case(f"error run {label}", ["run", ex1, "--input", good_in, "--output", out] + extra, out)
    cmp.case("error run no --output", ["run", ex1, "--input", good_in])
    cmp.case("error run no --input", ["run", ex1, "--output", out], out)
    cmp.case("error run output in a missing directory",
             ["run", ex1, "--input", good_in, "--output", os.path.join(work, "no/such/dir/o.safetensors")])
    cmp.case("error no command", [])
    cmp.case("error unknown command", ["frobnicate"])
    cmp.case("--version", ["--version"])
    cmp.case("--help", ["--help"])
    for c in ("run", "summary", "inspect", "bench"):
        cmp.case(f"{c} --help", [c, "--help"])
    cmp.case("error bench without --shape", ["bench", ex1, "--reps", "1", "--warmup", "0"])
    cmp.case("error bench wrong shape", ["bench", ex1, "--shape", "x=2,8,31", "--reps", "1", "--warmup", "0"])
    cmp.case("error bench --reps 0", ["bench", ex1, "--shape", "x=2,8,32", "--reps", "0"])
    cmp.case("error inspect garbage", ["inspect", garbage])
    cmp.case("error inspect truncated", ["inspect", trunc])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="the old tessera CLI binary")
    p.add_argument("new", help="the new tessera CLI binary")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts for `run` (default 1,2)")
    p.add_argument("--keep", default=None, help="write inputs, networks and outputs here and keep them")
    p.add_argument("--no-fixtures", action="store_true", help="skip the tests/fixtures/{attention,mha} cases")
    p.add_argument("--no-large", action="store_true", help="skip the larger-shape cases")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the (identical) stderr of each case")
    a = p.parse_args()
    threads = [int(x) for x in a.threads.split(",") if x]
    old, new = os.path.abspath(a.old), os.path.abspath(a.new)
    for exe in (old, new):
        if not os.access(exe, os.X_OK):
            sys.exit(f"compare_builds: {exe} is not an executable")
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        work = os.path.abspath(a.keep)
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tessera-compare-")
        work = tmp.name
    cmp = Compare(old, new, work, a.verbose)
    print(f"# old: {old}\n# new: {new}\n# threads: {threads}; work dir: {work}", flush=True)

    # the networks, on random inputs
    for net in network_files():
        label = rel(net)
        extra = ["--weights", ENC_CKPT] if net == ENC_JSON else []
        run_network_cases(cmp, threads, work, net, net, extra, label + (" +weights" if extra else ""))
    # the checkpoint itself (network in its metadata) on random inputs
    run_network_cases(cmp, threads, work, ENC_JSON, ENC_CKPT, [], rel(ENC_CKPT))
    # the shipped example on its own input
    out = os.path.join(work, "example.out.safetensors")
    for t in threads:
        cmp.case(f"run example {rel(ENC_CKPT)} on {rel(ENC_INPUT)} threads={t}",
                 ["run", ENC_CKPT, "--input", ENC_INPUT, "--output", out, "--threads", str(t)], out, True)
        cmp.case(f"run example {rel(ENC_JSON)} --weights {rel(ENC_CKPT)} on {rel(ENC_INPUT)} threads={t}",
                 ["run", ENC_JSON, "--weights", ENC_CKPT, "--input", ENC_INPUT, "--output", out,
                  "--threads", str(t)], out, True)
    cmp.case(f"summary {rel(ENC_CKPT)}", ["summary", ENC_CKPT])
    # inspect of the shipped and test safetensors files
    for f in sorted(glob.glob(os.path.join(ENC_DIR, "*.safetensors")) +
                    glob.glob(os.path.join(REPO, "tests/fixtures/safetensors/*.safetensors"))):
        cmp.case(f"inspect {rel(f)}", ["inspect", f])
    if not a.no_fixtures:
        fixture_cases(cmp, threads, work)
    if not a.no_large:
        large_cases(cmp, threads, work)
    error_cases(cmp, threads, work)

    print(f"# {cmp.n} cases, {cmp.errors_both} of them exit non-zero with both builds")
    if cmp.different:
        print("# different: " + "; ".join(cmp.different))
    print(f"{cmp.same} same, {len(cmp.different)} different, {len(cmp.new_only)} new-only "
          "(OLD refuses with E_ARG what NEW runs)")
    if tmp:
        tmp.cleanup()
    return 1 if cmp.different else 0


if __name__ == "__main__":
    sys.exit(main())
