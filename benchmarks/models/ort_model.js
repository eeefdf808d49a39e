#!/usr/bin/env node
// One ONNX Runtime (onnxruntime-node, CPU EP) whole-model benchmark process for
// benchmarks/models.py. The model is prepare.py's torch.onnx.export (opset 14) of the PyTorch
// module; its inputs are read from prepare.py's input.safetensors (F32, or I64 token ids).
//
//   node ort_model.js --model DIR/model.onnx --input DIR/input.safetensors --threads 2 \
//        [--warmup 2] [--reps R | --target-s 2.5 --min-reps 3 --max-reps 200]
//   node ort_model.js --model DIR/model.onnx --input DIR/input.safetensors --verify OUT.safetensors
//
// Needs onnxruntime-node on NODE_PATH (benchmarks/models.py points it at its work directory's
// node_modules, installed from the shared peer harness's package-lock.json). Session options as
// the harness's ort_mha.js: graphOptimizationLevel 'all', intraOpNumThreads N,
// interOpNumThreads 1, executionMode 'sequential'.
// Timing: cold_start_ms = InferenceSession.create(file) + the first run (node start-up and
// require excluded); then --warmup untimed runs in all (the first included, at least 1), then
// the timed runs: --reps, or enough to fill --target-s judged from the last warm-up run. Prints
// one JSON line: median_ms min_ms max_ms reps warmup session_create_ms first_run_ms
// cold_start_ms peak_rss_mb (process.resourceUsage().maxRSS, KiB -> MiB) cpu_ms_per_call
// (process.cpuUsage over the timed runs, all threads / reps).
// --verify writes the first run's outputs (F32, by the graph's output names) as safetensors.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function parseArgs(argv) {
  const a = {
    model: null, input: null, threads: 1, warmup: 2, reps: 0, 'target-s': 2.5, 'min-reps': 3,
    'max-reps': 200, verify: null,
  };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '');
    if (!(k in a)) throw new Error(`unknown option ${argv[i]}`);
    a[k] = argv[++i];
  }
  for (const k of ['threads', 'warmup', 'reps', 'target-s', 'min-reps', 'max-reps']) a[k] = Number(a[k]);
  if (!a.model || !a.input) throw new Error('--model FILE.onnx and --input FILE.safetensors are required');
  return a;
}

// ---------------------------------------------------------------- safetensors
function readSafetensors(file) {
  const b = fs.readFileSync(file);
  const n = Number(b.readBigUInt64LE(0));
  const header = JSON.parse(b.subarray(8, 8 + n).toString('utf8'));
  const body = 8 + n;
  const out = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [s, e] = info.data_offsets;
    const bytes = new Uint8Array(e - s);
    bytes.set(b.subarray(body + s, body + e)); // a copy: aligned for the typed array
    let data;
    let type;
    if (info.dtype === 'F32') { data = new Float32Array(bytes.buffer); type = 'float32'; }
    else if (info.dtype === 'I64') { data = new BigInt64Array(bytes.buffer); type = 'int64'; }
    else throw new Error(`${file}: ${name}: dtype ${info.dtype} not handled`);
    out[name] = new ort.Tensor(type, data, info.shape);
  }
  return out;
}

function writeSafetensorsF32(file, tensors) {
  const names = Object.keys(tensors).sort();
  const header = {};
  let off = 0;
  const chunks = [];
  for (const k of names) {
    const t = tensors[k];
    const f = t.data instanceof Float32Array ? t.data : Float32Array.from(t.data, Number);
    const bytes = Buffer.from(f.buffer, f.byteOffset, f.byteLength);
    header[k] = { dtype: 'F32', shape: t.dims.map(Number), data_offsets: [off, off + bytes.length] };
    off += bytes.length;
    chunks.push(bytes);
  }
  let h = JSON.stringify(header);
  h += ' '.repeat((8 - (Buffer.byteLength(h) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(h)));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(h, 'utf8'), ...chunks]));
}

// ---------------------------------------------------------------- timing
function maxrssMB() { return process.resourceUsage().maxRSS / 1024; } // KiB -> MiB
function nowS() { return Number(process.hrtime.bigint()) / 1e9; }
const r4 = (x) => +x.toFixed(4);

async function main() {
  const a = parseArgs(process.argv);
  const rec = {
    runtime: 'ort', threads: a.threads, ort: ort.env.versions.node, base_rss_mb: +maxrssMB().toFixed(1),
  };
  const feeds = readSafetensors(a.input);
  const opts = {
    executionProviders: ['cpu'], intraOpNumThreads: a.threads, interOpNumThreads: 1,
    graphOptimizationLevel: 'all', executionMode: 'sequential', logSeverityLevel: 3,
  };
  const t0 = nowS();
  const s = await ort.InferenceSession.create(a.model, opts);
  const t1 = nowS();
  for (const name of s.inputNames) if (!(name in feeds)) throw new Error(`input ${name} not in ${a.input}`);
  const mine = {};
  for (const name of s.inputNames) mine[name] = feeds[name];
  const out = await s.run(mine);
  const t2 = nowS();
  Object.assign(rec, {
    session_create_ms: +((t1 - t0) * 1e3).toFixed(1), first_run_ms: +((t2 - t1) * 1e3).toFixed(1),
    cold_start_ms: +((t2 - t0) * 1e3).toFixed(1),
  });
  if (a.verify) {
    writeSafetensorsF32(a.verify, out);
    Object.assign(rec, { status: 'ok', mode: 'verify', outputs: s.outputNames, peak_rss_mb: +maxrssMB().toFixed(1) });
    console.log(JSON.stringify(rec));
    return;
  }
  let last = t2 - t1;
  const warmup = Math.max(1, a.warmup);
  for (let i = 1; i < warmup; i++) {
    const w0 = nowS();
    await s.run(mine);
    last = nowS() - w0;
  }
  const reps = a.reps > 0 ? a.reps
    : Math.max(a['min-reps'], Math.min(a['max-reps'], Math.ceil(a['target-s'] / Math.max(last, 1e-6))));
  const ts = [];
  const c0 = process.cpuUsage();
  for (let i = 0; i < reps; i++) {
    const r0 = nowS();
    await s.run(mine);
    ts.push(nowS() - r0);
  }
  const c = process.cpuUsage(c0); // microseconds, all threads of the process
  ts.sort((p, q) => p - q);
  const n = ts.length;
  const med = n % 2 ? ts[(n - 1) / 2] : 0.5 * (ts[n / 2 - 1] + ts[n / 2]);
  Object.assign(rec, {
    status: 'ok', warmup, reps, median_ms: r4(med * 1e3), min_ms: r4(ts[0] * 1e3), max_ms: r4(ts[n - 1] * 1e3),
    cpu_ms_per_call: +((c.user + c.system) / 1e3 / reps).toFixed(3), peak_rss_mb: +maxrssMB().toFixed(1),
  });
  console.log(JSON.stringify(rec));
}

main().catch((e) => {
  console.log(JSON.stringify({ runtime: 'ort', status: 'error', error: String(e.stack || e).slice(0, 500) }));
  process.exitCode = 1;
});
