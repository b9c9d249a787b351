// The fit planner against real CUDA runs: measures every CUDA constant of
// src/execution/fit/constants.ts on the GPU machine and compares the planner's predictions
// (the `llmts fit` code path) with what the real backend, loader and engine do.
//
//   node --import tsx bench/fit-cuda.ts --out DIR [--budget-s 330] [--device cuda|cpu] [--gpu h200]
//        [--models DIR] [--llama8b DIR] [--only NAME,...] [--skip NAME,...]
//
// One command, within --budget-s seconds (it stops starting work when the budget runs low, and
// writes what it has after every case; SIGTERM/SIGINT also write before exiting):
//  1. the models, when absent: a random-weight Llama-3.1-8B (bench/make_random_llama.py, ~25 s
//     on the H200; --llama8b, default /tmp/llmts-llama8b-random, reused when present), a
//     Gemma-2-2B (sliding window 4096 on alternate layers), a Qwen3-30B-A3B-layer MoE with 6
//     layers and two small llama "probes" of 4 and 32 layers (bench/make_random_models.py).
//  2. each case in a fresh process (`--child`) on the real CUDA backend (createCudaBackend), the
//     real loader (loadModel) and the engine (prefix cache off): a prompt of `prompt` tokens per
//     row in `chunk`-token steps, then `gen` greedy tokens. Measured:
//     - device memory used by the process: NVML (else nvidia-smi) before the process touches CUDA
//       and right after the backend exists (context + module + cuBLASLt handle + the pool's
//       first blocks), and cuMemGetInfo after every driver allocation of the backend's pool and
//       around every step (the peak), through the run;
//     - the pool's own accounting (memoryStats): live, idle and graph-arena bytes after creation,
//       after the weights, after the KV pools, at the end, and their high-water marks during the
//       steps (the pool's alloc is wrapped at run time to read them after every allocation);
//     - the step shapes the engine ran, and decode tok/s (median interval between a row's tokens).
//  3. in this process, for each case: the planner's plan for the same context, batch and chunk
//     (weights, KV, transient, reserve, `fit` total, decode tok/s) and its model of the run
//     (the recorded steps through the decoder graph on the CUDA pool model, plus the decode graphs
//     captured for the batch buckets its decode steps used), beside the measured values and their
//     ratios.
//  4. the constants, fitted from all cases: context, workspace, runtime growth, the activation
//     scale and the four decode constants (non-negative least squares; each case's held-out error
//     says how well the decode model predicts a case it was not fitted on); the predictions again
//     with them. DIR/constants.ts.txt is the CUDA block of constants.ts with the values and the
//     measurement behind each, to paste over the provisional one.
//
// Output: DIR/fit-cuda.json (everything), DIR/summary.md (tables), DIR/constants.ts.txt,
// DIR/cases/*.log (each child's stderr), and the tables on stdout.
//
// --from-json FILE --out DIR [--measured-tree TEXT]: no GPU. Re-runs steps 3 and 4 from a saved fit-cuda.json (its recorded
// measurements: step shapes, pool marks, driver memory, decode times) with the planner of this
// tree, on header-only (sparse) checkpoints of the same models written from
// bench/make_random_*.py's own configs and tensor lists (under --models, default a temp dir).
//
// --device cpu runs the same plumbing on the CPU backend with tiny models (--tiny versions made
// with numpy, models/demo and test fixtures), to test this script off the GPU machine; its
// numbers are not CUDA constants (RSS stands in for device memory).

import { spawn, spawnSync, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { FitPlanner, type FitPlan, type StepShape } from '../src/execution/fit/plan.ts';
import { cpuMachine, gpuMachine, measureCopyBandwidth, type Machine } from '../src/execution/fit/machines.ts';
import * as K from '../src/execution/fit/constants.ts';
import { fitDecodeConstants, meanTerms, type DecodeFit, type DecodeSample } from '../src/execution/fit/calibrate.ts';
import type { DecodeTerm } from '../src/execution/fit/decode-model.ts';
import { bucketFor } from '../src/models/decode-graphs.ts';
import { writeCheckpoint } from '../test/fit/checkpoints.ts';
import { recordStepShapes } from '../src/execution/fit/step-recorder.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const SELF = path.join(ROOT, 'bench', 'fit-cuda.ts');

const { values } = parseArgs({
  options: {
    out: { type: 'string' },
    device: { type: 'string', default: 'cuda' },
    'budget-s': { type: 'string', default: '330' },
    gpu: { type: 'string', default: 'h200' },
    models: { type: 'string' },
    llama8b: { type: 'string' },
    only: { type: 'string' },
    skip: { type: 'string' },
    child: { type: 'string' },
    'from-json': { type: 'string' },
    'measured-tree': { type: 'string' },
  },
});
const DEVICE = values.device === 'cpu' ? 'cpu' : 'cuda';
if (values.device !== 'cpu' && values.device !== 'cuda') throw new Error(`--device must be cuda or cpu, got ${values.device}`);
const TINY = DEVICE === 'cpu';

// ---- models ------------------------------------------------------------------------------------

interface ModelSpec {
  key: string;
  dir: string;
  /** command that writes it (absent: a committed model) */
  make?: string[];
  /** seconds the make may take */
  makeLimitS?: number;
}

function modelSpecs(): Record<string, ModelSpec> {
  const base = values.models ?? path.join(os.tmpdir(), TINY ? 'llmts-fit-cuda-models-tiny' : 'llmts-fit-cuda-models');
  const tiny = TINY ? ['--tiny'] : [];
  const tok = ['--tokenizer', 'models/demo/tokenizer.json'];
  const preset = (key: string, name: string, extra: string[] = [], limit = 90): ModelSpec => ({
    key, dir: path.join(base, key), makeLimitS: limit,
    make: ['python3', 'bench/make_random_models.py', '--preset', name, '--out', path.join(base, key), ...tok, ...tiny, ...extra],
  });
  const llama8b = values.llama8b ?? (TINY ? path.join(base, 'llama8b') : '/tmp/llmts-llama8b-random');
  return {
    llama8b: { key: 'llama8b', dir: llama8b, makeLimitS: 150, make: ['python3', 'bench/make_random_llama.py', '--out', llama8b, ...tok, ...tiny] },
    gemma2: preset('gemma2', 'gemma2-2b'),
    moe: preset('moe', 'qwen3-moe-6l', [], 120),
    probe4: preset('probe4', 'llama-probe', ['--layers', '4'], 60),
    probe32: preset('probe32', 'llama-probe', ['--layers', '32'], 60),
    // --device cpu only: committed models, so the plumbing also meets real checkpoints
    ...(TINY ? {
      demo: { key: 'demo', dir: path.join(ROOT, 'models/demo') },
      gemma2fx: { key: 'gemma2fx', dir: path.join(ROOT, 'test/fixtures/gemma2') },
      moefx: { key: 'moefx', dir: path.join(ROOT, 'test/fixtures/qwen3_moe') },
    } : {}),
  };
}

// ---- cases -------------------------------------------------------------------------------------

interface Case {
  name: string;
  model: string;
  /** prompt tokens per row; the context of each row is prompt + gen */
  prompt: number;
  gen: number;
  chunk: number;
  batch: number;
  /** seconds the child may take */
  limitS: number;
}

const c = (model: string, prompt: number, gen: number, chunk: number, batch: number, limitS: number, label = ''): Case => ({
  name: `${model} ctx ${prompt + gen} chunk ${chunk}${batch > 1 ? ` batch ${batch}` : ''}${label}`, model, prompt, gen, chunk, batch, limitS,
});

/**
 * Cheap and most telling first; the long contexts last (prefill attention grows with the square
 * of the context, and the budget guard skips what it estimates cannot finish).
 */
function cases(): Case[] {
  if (TINY) {
    return [
      c('probe4', 96, 32, 64, 1, 120), c('probe32', 96, 32, 64, 1, 120),
      c('llama8b', 224, 32, 64, 1, 120), c('llama8b', 224, 32, 128, 2, 120), c('llama8b', 480, 32, 256, 1, 120),
      c('gemma2', 224, 32, 64, 1, 120), c('moe', 224, 32, 64, 1, 120), c('moe', 96, 32, 512, 4, 120),
      c('demo', 448, 64, 128, 1, 120), c('gemma2fx', 192, 32, 64, 1, 120), c('moefx', 96, 32, 512, 2, 120),
    ];
  }
  return [
    c('probe4', 256, 64, 512, 1, 60),
    c('probe32', 256, 64, 512, 1, 60),
    c('llama8b', 960, 64, 512, 1, 90),
    c('llama8b', 4032, 64, 512, 1, 120),
    c('llama8b', 4032, 64, 2048, 1, 120),
    c('llama8b', 4032, 64, 128, 1, 120),
    c('llama8b', 448, 64, 512, 4, 90),
    c('llama8b', 448, 64, 512, 16, 120),
    c('gemma2', 1984, 64, 512, 1, 90),
    c('gemma2', 448, 64, 512, 4, 90),
    c('gemma2', 8128, 64, 1024, 1, 150),
    c('moe', 960, 64, 512, 1, 90),
    c('moe', 448, 64, 512, 4, 90),
    c('moe', 1984, 64, 256, 1, 120),
    c('llama8b', 8128, 64, 512, 1, 150),
    c('llama8b', 16320, 64, 1024, 1, 240),
    c('llama8b', 32704, 64, 2048, 1, 240),
    c('llama8b', 65472, 64, 4096, 1, 240),
  ];
}

// ---- one measured run (child process) ---------------------------------------------------------

interface ChildArgs {
  device: 'cuda' | 'cpu';
  dir: string;
  prompt: number;
  gen: number;
  chunk: number;
  batch: number;
}

/** Device memory at one moment: driver-reported used (CUDA: total - free; CPU: RSS) and the pool's own accounting. */
interface Snap {
  used: number;
  live: number;
  idle: number;
  /** held by captured decode graphs (their arenas) */
  graph: number;
  /** used memory by NVML / nvidia-smi (CUDA), whole-device, when available */
  external?: number;
}

interface ChildResult {
  device: string;
  total: number;
  externalSource: string | null;
  /** before the backend exists (external reading; CPU: RSS) */
  before: number | null;
  created: Snap;
  loaded: Snap;
  engine: Snap;
  end: Snap;
  /** highest readings during the run (after creation) */
  peak: { used: number; live: number; pool: number; nonPool: number; hooked: boolean };
  steps: StepShape[];
  kvTokens: number;
  decodeTps: number;
  decodeStepMs: number;
  decodePositions: [number, number];
  prefillMs: number;
  createMs: number;
  loadMs: number;
  launchesPerStep: number | null;
  driverAllocs: number | null;
  copyGBps?: number;
}

type AnyBackend = {
  name: string;
  memoryStats?: () => { liveBytes: number; idleBytes: number; driverAllocs?: number; graphBytes?: number };
  memoryInfo?: () => { free: number; total: number };
  describe?: () => string;
  launches?: number;
  sync(): Promise<void>;
  close(): Promise<void>;
};

function procStatus(): { rss: number; hwm: number } {
  const s = fs.readFileSync('/proc/self/status', 'utf8');
  const g = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(s)![1]) * 1024;
  return { rss: g('VmRSS'), hwm: g('VmHWM') };
}

/** Device memory used (bytes) as NVML reports it, without creating a CUDA context; null when NVML cannot be read. */
async function nvmlUsed(index: number): Promise<number | null> {
  try {
    const koffi = (await import('koffi')).default;
    const lib = koffi.load('libnvidia-ml.so.1');
    const init = lib.func('int nvmlInit_v2()');
    const byIndex = lib.func('int nvmlDeviceGetHandleByIndex_v2(unsigned int, void *)');
    const memInfo = lib.func('int nvmlDeviceGetMemoryInfo(uint64_t, void *)');
    if (init() !== 0) return null;
    const h = new BigUint64Array(1);
    if (byIndex(index, h) !== 0) return null;
    const m = new BigUint64Array(3); // nvmlMemory_t: total, free, used
    if (memInfo(Number(h[0]!), m) !== 0) return null;
    return Number(m[2]!);
  } catch {
    return null;
  }
}

function smiUsed(index: number): number | null {
  try {
    const out = execFileSync('nvidia-smi', ['-i', String(index), '--query-gpu=memory.used', '--format=csv,noheader,nounits'],
      { encoding: 'utf8', timeout: 10_000, stdio: ['ignore', 'pipe', 'ignore'] });
    const mib = Number(out.trim().split('\n')[0]);
    return Number.isFinite(mib) ? mib * 2 ** 20 : null;
  } catch {
    return null;
  }
}

async function child(a: ChildArgs): Promise<ChildResult> {
  const index = Number(process.env.LLMTS_CUDA_DEVICE ?? 0);
  let externalSource: string | null = null;
  const external = async (): Promise<number | undefined> => {
    if (a.device === 'cpu') return undefined;
    const n = await nvmlUsed(index);
    if (n !== null) return (externalSource = 'nvml'), n;
    const s = smiUsed(index);
    if (s !== null) return (externalSource = 'nvidia-smi'), s;
    return undefined;
  };
  const { loadModel } = await import('../src/execution/load-model.ts');
  const { Engine } = await import('../src/execution/engine.ts');
  // before anything of CUDA exists in this process
  const before = a.device === 'cpu' ? procStatus().rss : (await external()) ?? null;
  const t0 = performance.now();
  let backend: AnyBackend;
  if (a.device === 'cpu') {
    const { createCpuBackend } = await import('../src/backends/cpu/cpu-backend.ts');
    backend = await createCpuBackend() as unknown as AnyBackend;
  } else {
    const { createCudaBackend } = await import('../src/backends/cuda/index.ts');
    backend = await createCudaBackend() as unknown as AnyBackend;
  }
  const createMs = performance.now() - t0;
  let total = os.totalmem();
  const used = (): number => {
    if (a.device === 'cpu') return procStatus().rss;
    const i = backend.memoryInfo!();
    total = i.total;
    return i.total - i.free;
  };
  const pool = () => backend.memoryStats?.() ?? { liveBytes: 0, idleBytes: 0 };
  const peak = { used: 0, live: 0, pool: 0, nonPool: -Infinity, hooked: false };
  const snap = (): Snap => {
    const u = used(), p = pool(), g = p.graphBytes ?? 0;
    peak.used = Math.max(peak.used, u);
    peak.live = Math.max(peak.live, p.liveBytes);
    peak.pool = Math.max(peak.pool, p.liveBytes + p.idleBytes + g);
    peak.nonPool = Math.max(peak.nonPool, u - p.liveBytes - p.idleBytes - g);
    return { used: u, live: p.liveBytes, idle: p.idleBytes, graph: g };
  };
  // right after creation: the pool holds the cuBLASLt workspace and the error word
  const created: Snap = { ...snap(), external: await external() };
  // The pool's high-water marks: read its accounting after every allocation, and the driver's
  // after every allocation the driver sees. Duck-typed on the backend's private pool, so a change
  // of its internals only loses the in-step peaks (the samples around each step remain).
  const p = (backend as unknown as { pool?: Record<string, unknown> }).pool;
  if (p && typeof p.alloc === 'function' && typeof p.stats === 'function') {
    const alloc = (p.alloc as (...x: unknown[]) => unknown).bind(p);
    const stats = (p.stats as () => { liveBytes: number; idleBytes: number; graphBytes?: number }).bind(p);
    p.alloc = (...x: unknown[]) => {
      const r = alloc(...x);
      const s = stats();
      peak.live = Math.max(peak.live, s.liveBytes);
      peak.pool = Math.max(peak.pool, s.liveBytes + s.idleBytes + (s.graphBytes ?? 0));
      return r;
    };
    peak.hooked = true;
    if (a.device === 'cuda' && typeof p.driverAlloc === 'function') {
      const driverAlloc = (p.driverAlloc as (...x: unknown[]) => number).bind(p);
      p.driverAlloc = (...x: unknown[]) => {
        const r = driverAlloc(...x);
        peak.used = Math.max(peak.used, used());
        return r;
      };
    }
  }
  const ctx = a.prompt + a.gen;
  const t1 = performance.now();
  const m = await loadModel(backend as never, a.dir, { maxModelLen: ctx });
  await backend.sync();
  const loadMs = performance.now() - t1;
  const loaded = snap();
  // the KV pools as the server sizes them for max-batch sequences of max-model-len (the plan's kvTokens)
  const kvTokens = a.batch * Math.ceil(ctx / 16) * 16;
  const engine = new Engine(m.model, m, { maxBatch: a.batch, tokenBudget: a.chunk, maxModelLen: ctx, kvTokens, prefixCache: { promptCacheBytes: 0 } });
  await backend.sync();
  const engineSnap = snap();
  // the pool's high-water marks from here on are the steps' (loading made its own)
  peak.live = engineSnap.live;
  peak.pool = engineSnap.live + engineSnap.idle + engineSnap.graph;
  // every op of a step is enqueued (and allocated) when launch returns; its results come later
  const steps = recordStepShapes(m.model, 16, (out) => {
    snap();
    out.result.then(() => snap(), () => undefined);
  });
  const V = m.config.vocabSize;
  const promptOf = (n: number, seed: number) => Array.from({ length: n }, (_, k) => (k * 7919 + 13 + seed * 101) % Math.min(V, 5000));
  const times: number[][] = [];
  const tStart = performance.now();
  let launches0 = 0, firstDecode = 0;
  await Promise.all(Array.from({ length: a.batch }, async (_, r) => {
    const t: number[] = [];
    times.push(t);
    for await (const e of engine.generate({ promptIds: promptOf(a.prompt, r), maxTokens: a.gen, sampling: { temperature: 0 }, ignoreEos: true })) {
      if (e.type === 'token') {
        t.push(performance.now());
        if (t.length === 2 && !firstDecode) (firstDecode = steps.length), (launches0 = backend.launches ?? 0);
      }
      if (e.type === 'finish' && e.finishReason === 'error') throw new Error(`generation failed: ${e.error}`);
    }
  }));
  const launchesPerStep = backend.launches !== undefined && firstDecode ? (backend.launches - launches0) / Math.max(1, steps.length - firstDecode) : null;
  await backend.sync();
  // blocks freed to the driver only once their last use has run (exact-size, or past the cache)
  const reap = p && typeof p.reap === 'function' ? (p.reap as () => void).bind(p) : undefined;
  reap?.();
  const end: Snap = { ...snap(), external: await external() };
  const gaps = times.flatMap((t) => t.slice(2).map((x, i) => x - t[i + 1]!)).sort((x, y) => x - y);
  const med = gaps[gaps.length >> 1] ?? NaN;
  const result: ChildResult = {
    device: backend.describe?.() ?? backend.name, total, externalSource, before, created, loaded, engine: engineSnap, end,
    peak: { ...peak, used: a.device === 'cpu' ? procStatus().hwm : peak.used },
    steps, kvTokens, decodeTps: (a.batch * 1000) / med, decodeStepMs: med, decodePositions: [a.prompt, a.prompt + a.gen - 1],
    prefillMs: Math.min(...times.map((t) => t[0]!)) - tStart, createMs, loadMs, launchesPerStep,
    driverAllocs: (backend.memoryStats?.() as { driverAllocs?: number } | undefined)?.driverAllocs ?? null,
  };
  await engine.close();
  await backend.close();
  if (a.device === 'cpu') result.copyGBps = measureCopyBandwidth(64, 5);
  return result;
}

// ---- the parent: models, cases, predictions ----------------------------------------------------

const START = Date.now();
const BUDGET_MS = Number(values['budget-s']) * 1000;
const left = () => BUDGET_MS - (Date.now() - START);
const log = (s: string) => process.stdout.write(`${s}\n`);
const mib = (b: number) => (b / 2 ** 20).toFixed(1);
const gib = (b: number) => (b / 2 ** 30).toFixed(2);
const pct = (x: number) => (Number.isFinite(x) ? `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)}%` : '—');

interface Measured {
  /** device memory the process holds outside the pool once the backend exists (context, module, cuBLASLt handle) */
  context: number | null;
  /** what the pool holds right after creation (the cuBLASLt workspace, the error word) */
  workspace: number;
  /** non-pool memory that appeared during the run */
  growth: number;
  /** held by the decode graphs captured during the run (their arenas) */
  graphs: number;
  weights: number;
  kv: number;
  /** pool live high-water mark during the steps, above weights and KV */
  stepLive: number;
  /** pool live + idle high-water mark during the steps, above what it held before them */
  stepPool: number;
  /** peak device memory of the process (driver) */
  peakTotal: number | null;
  /** what must fit when the pool gives its cache back: non-pool + live peak */
  needed: number | null;
}

interface Predicted {
  weights: number;
  kv: number;
  /** the recorded steps on the CUDA pool model: live peak, and live + cached peak */
  stepLive: number;
  stepPool: number;
  /** the decode graphs of the batch buckets the run's decode steps used */
  graphs: number;
  reserve: number;
  /** weights + KV + stepPool + reserve: the model of this run's driver peak */
  peakTotal: number;
  /** the same with the run's own measured non-pool growth in place of CUDA_RUNTIME_GROWTH_BYTES (the largest over models) */
  peakRunGrowth?: number;
  /** `llmts fit` for the same ctx, batch and chunk */
  fitTotal: number;
  fitTransient: number;
  decodeTps: number;
  terms: DecodeTerm[];
}

interface CaseResult {
  case: Case;
  status: 'ok' | 'failed' | 'timeout' | 'skipped';
  why?: string;
  wallS: number;
  child?: ChildResult;
  measured?: Measured;
  predicted?: Predicted;
  /** predictions with the constants fitted in this run */
  calibrated?: Predicted;
}

function measuredOf(r: ChildResult): Measured {
  const nonPool = (s: Snap) => s.used - s.live - s.idle - (s.graph ?? 0);
  // CUDA: the external reading (NVML) is the only one that sees memory before the context; CPU: RSS
  const context = DEVICE === 'cpu'
    ? r.created.used - (r.before ?? r.created.used) - r.created.live
    : r.before !== null && r.created.external !== undefined ? r.created.external - r.before - r.created.live : null;
  const stepPoolBase = r.engine.live + r.engine.idle;
  const peakTotal = DEVICE === 'cpu' ? r.peak.used
    : context === null ? null : context + r.created.live + (r.peak.used - r.created.used);
  const growth = nonPool(r.end) - nonPool(r.created);
  return {
    context, workspace: r.created.live, growth, graphs: r.end.graph ?? 0,
    weights: r.loaded.live - r.created.live, kv: r.engine.live - r.loaded.live,
    stepLive: r.peak.live - r.engine.live, stepPool: r.peak.pool - stepPoolBase,
    peakTotal, needed: context === null || DEVICE === 'cpu' ? null : context + Math.max(growth, 0) + r.peak.live + (r.end.graph ?? 0),
  };
}

const planners = new Map<string, Promise<FitPlanner>>();
/** one planner per model: its step simulations are cached, and do not depend on the constants */
function plannerFor(dir: string): Promise<FitPlanner> {
  let p = planners.get(dir);
  if (!p) planners.set(dir, (p = FitPlanner.open(dir)));
  return p;
}

async function predict(cs: Case, dir: string, r: ChildResult, machine: Machine): Promise<Predicted> {
  const planner = await plannerFor(dir);
  const kind = DEVICE;
  const ctx = cs.prompt + cs.gen;
  const plan: FitPlan = await planner.plan(machine, { ctx, batch: cs.batch, chunk: cs.chunk });
  const real = await planner.simulatePool(kind, r.steps);
  const scale = kind === 'cuda' ? K.CUDA_ACTIVATION_SCALE.value : 1;
  // decode-only steps replay a graph captured per batch bucket (tables as wide as the engine's limit)
  const buckets = r.steps.filter((x) => x.tokens === x.rows && x.sampled === x.rows).map((x) => bucketFor(x.rows));
  const graphs = kind === 'cuda' ? await planner.graphBytes(buckets, Math.ceil(ctx / 16) + 1) : 0;
  // decode steps run at positions prompt .. prompt + gen - 2 (the first token comes from prefill)
  const steps: DecodeTerm[][] = [];
  let seconds = 0;
  for (let p = r.decodePositions[0]; p < Math.max(r.decodePositions[1], r.decodePositions[0] + 1); p++) {
    const d = await planner.decodeStep(machine, p, cs.batch, plan.kvDtype);
    steps.push(d.terms);
    seconds += d.seconds;
  }
  const terms = meanTerms(steps);
  const n = steps.length;
  return {
    weights: plan.weightsBytes, kv: plan.kvBytes, stepLive: Math.round(real.livePeak * scale), stepPool: Math.round(real.peak * scale), graphs,
    // the simulated pool holds the captured graphs' arenas already (dry-run-backend.ts capture)
    reserve: plan.reserveBytes, peakTotal: plan.weightsBytes + plan.kvBytes + Math.round(real.peak * scale) + plan.reserveBytes,
    peakRunGrowth: plan.weightsBytes + plan.kvBytes + Math.round(real.peak * scale) + plan.reserveBytes - K.CUDA_RUNTIME_GROWTH_BYTES.value +
      Math.max(0, measuredOf(r).growth),
    fitTotal: plan.totalBytes, fitTransient: plan.transientBytes, decodeTps: (cs.batch * n) / seconds, terms,
  };
}

function runChild(a: ChildArgs, limitS: number, logFile: string): Promise<{ status: 'ok' | 'failed' | 'timeout'; result?: ChildResult; why?: string }> {
  return new Promise((resolve) => {
    const proc = spawn(process.execPath, ['--import', 'tsx', SELF, '--child', JSON.stringify(a)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    proc.stdout.on('data', (d) => (out += d));
    proc.stderr.on('data', (d) => (err += d));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      proc.kill('SIGKILL');
    }, Math.max(1, limitS) * 1000);
    proc.on('close', (code) => {
      clearTimeout(timer);
      fs.writeFileSync(logFile, `${err}\n--- stdout ---\n${out}`);
      if (timedOut) return resolve({ status: 'timeout', why: `killed after ${limitS.toFixed(0)} s` });
      if (code !== 0) return resolve({ status: 'failed', why: (err.trim().split('\n').filter((l) => l.trim()).slice(-3).join(' | ') || `exit ${code}`).slice(0, 500) });
      try {
        resolve({ status: 'ok', result: JSON.parse(out.trim().split('\n').pop()!) });
      } catch (e) {
        resolve({ status: 'failed', why: `unreadable child output: ${(e as Error).message}` });
      }
    });
  });
}

function haveModel(dir: string): boolean {
  return fs.existsSync(path.join(dir, 'config.json')) &&
    (fs.existsSync(path.join(dir, 'model.safetensors.index.json')) || fs.existsSync(path.join(dir, 'model.safetensors')));
}

// ---- constants from the measurements -----------------------------------------------------------

interface ConstantOut {
  name: K.ConstantName;
  value: number;
  how: string;
}

const median = (xs: number[]) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[s.length >> 1]! : NaN; };

function deriveConstants(results: CaseResult[], decode: DecodeFit | null, machine: Machine, where: string): ConstantOut[] {
  const ok = results.filter((r) => r.status === 'ok' && r.measured && r.predicted);
  const out: ConstantOut[] = [];
  const list = (f: (r: CaseResult) => number | null) => ok.map((r) => ({ r, v: f(r) })).filter((x): x is { r: CaseResult; v: number } => x.v !== null && Number.isFinite(x.v));
  const ctxs = list((r) => r.measured!.context);
  if (ctxs.length) {
    const v = ctxs.map((x) => x.v);
    out.push({
      name: 'CUDA_CONTEXT_BYTES', value: Math.round(median(v)),
      how: `${where}: device memory used (${ok[0]!.child!.externalSource ?? 'external'}) right after createCudaBackend minus before ` +
        `the process touched CUDA, minus the pool's live bytes then; ${v.length} processes: median ${mib(median(v))} MiB ` +
        `(min ${mib(Math.min(...v))}, max ${mib(Math.max(...v))})`,
    });
  }
  const ws = ok.map((r) => r.measured!.workspace);
  if (ws.length) {
    out.push({
      name: 'CUDA_CUBLASLT_WORKSPACE_BYTES', value: Math.max(...ws),
      how: `${where}: the pool's live bytes (memoryStats) right after createCudaBackend, ${ws.length} processes: ` +
        `${[...new Set(ws)].map((x) => `${x} B`).join(', ')}`,
    });
  }
  const growth = list((r) => r.measured!.growth);
  if (growth.length) {
    const top = growth.reduce((a, b) => (b.v > a.v ? b : a));
    out.push({
      name: 'CUDA_RUNTIME_GROWTH_BYTES', value: Math.max(0, Math.round(top.v)),
      how: `${where}: device memory used (cuMemGetInfo) minus the pool's live and idle bytes, at the end of each run minus ` +
        `right after creation; largest of ${growth.length} cases: ${mib(top.v)} MiB (${top.r.case.name}); median ${mib(median(growth.map((x) => x.v)))} MiB`,
    });
  }
  const ratios = ok.filter((r) => r.measured!.stepLive > 0 && r.predicted!.stepLive > 0)
    .map((r) => ({ r, v: r.measured!.stepLive / (r.predicted!.stepLive / K.CUDA_ACTIVATION_SCALE.value) }));
  if (ratios.length) {
    const top = ratios.reduce((a, b) => (b.v > a.v ? b : a));
    out.push({
      name: 'CUDA_ACTIVATION_SCALE', value: Math.round(top.v * 1000) / 1000,
      how: `${where}: the pool's live high-water mark during the steps (above weights and KV) over the simulated one for the ` +
        `same recorded steps, ${ratios.length} cases (contexts ${[...new Set(ratios.map((x) => x.r.case.prompt + x.r.case.gen))].join(', ')}; ` +
        `chunks ${[...new Set(ratios.map((x) => x.r.case.chunk))].join(', ')}): ratios ${Math.min(...ratios.map((x) => x.v)).toFixed(3)}-` +
        `${top.v.toFixed(3)}, the largest kept (${top.r.case.name})`,
    });
  }
  if (decode) {
    const rows = decode.rows;
    const worst = rows.reduce((a, b) => (Math.abs(b.heldOutError) > Math.abs(a.heldOutError) ? b : a), rows[0]!);
    const worstFit = rows.reduce((a, b) => (Math.abs(b.error) > Math.abs(a.error) ? b : a), rows[0]!);
    const cases = ok.filter((r) => rows.some((x) => x.name === r.case.name)).map((r) => r.case);
    const models = [...new Set(cases.map((x) => x.model))].join(', ');
    const ctxs = [...new Set(cases.map((x) => x.prompt + x.gen))].sort((a, b) => a - b).join(', ');
    const batches = [...new Set(cases.map((x) => x.batch))].sort((a, b) => a - b).join(', ');
    for (const [n, v] of Object.entries(decode.values) as [K.ConstantName, number][]) {
      // a term no sample could see (an efficiency fitted to Infinity) is not a measurement
      if (!Number.isFinite(v) || v <= 0 && /EFFICIENCY|GMACS|GFLOPS/.test(n)) continue;
      out.push({
        name: n, value: Number(v.toPrecision(4)),
        how: `${where}: fitted with the other decode constants (non-negative least squares on relative error) to the median ` +
          `decode step of ${rows.length} cases (models ${models}; contexts ${ctxs}; batch ${batches}) against ` +
          `${machine.bandwidthGBps.toFixed(0)} GB/s; fitted errors within ${pct(Math.abs(worstFit.error))} (${worstFit.name}); ` +
          `each case predicted from a fit without it: worst ${pct(worst.heldOutError)} (${worst.name})`,
      });
    }
  }
  return out;
}

function constantsSnippet(cs: ConstantOut[]): string {
  const lines = [
    '// Generated by bench/fit-cuda.ts: paste each over the provisional CUDA constant of the same name in',
    '// src/execution/fit/constants.ts (value, measured: true, how).',
    '',
  ];
  for (const x of cs) {
    lines.push(`export const ${x.name}: Constant = {`, `  value: ${Number.isFinite(x.value) ? x.value : 'Infinity'},`, '  measured: true,',
      `  how: ${JSON.stringify(x.how)},`, '};', '');
  }
  return lines.join('\n');
}

// ---- main ----------------------------------------------------------------------------------------

/** Header-only checkpoints of the bench's models, from bench/make_random_*.py's configs and tensor lists. */
function sparseModel(key: string, base: string): string {
  const dir = path.join(base, key);
  if (haveModel(dir)) return dir;
  const py = [
    'import json, sys; sys.path.insert(0, "bench")',
    'import make_random_llama as L, make_random_models as M',
    `key = ${JSON.stringify(key)}`,
    'if key == "llama8b": c = L.llama31_8b_config(False); specs = L.tensor_specs(c)',
    'else:',
    '    c = {"gemma2": M.gemma2_2b, "moe": M.qwen3_moe_6l, "probe4": M.llama_probe, "probe32": M.llama_probe}[key](False)',
    '    if key.startswith("probe"): c["num_hidden_layers"] = int(key[5:])',
    '    specs = M.tensor_specs(c)',
    'print(json.dumps({"config": c, "tensors": [[s[0], list(s[1])] for s in specs]}))',
  ].join('\n');
  const out = execFileSync('python3', ['-c', py], { cwd: ROOT, encoding: 'utf8' });
  const { config, tensors } = JSON.parse(out) as { config: Record<string, unknown>; tensors: [string, number[]][] };
  writeCheckpoint(dir, config, tensors.map(([name, shape]) => ({ name, dtype: 'BF16' as const, shape })), { data: 'sparse' });
  return dir;
}

/**
 * The command line a run records (its JSON, summary and each constant's `how`), with the --out folder
 * written as DIR: a constant's provenance is the command, the machine, the commit and the date, not
 * where one run happened to write.
 */
function recordedCommand(args: readonly string[]): string {
  const shown = args.map((a, i) => (args[i - 1] === '--out' ? 'DIR' : a.startsWith('--out=') ? '--out=DIR' : a));
  return `node --import tsx bench/fit-cuda.ts ${shown.join(' ')}`;
}

/** --from-json: the comparison and the fit again, from a saved run's measurements. */
async function replay(file: string, OUT: string): Promise<void> {
  const saved = JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, any>;
  if (saved.device !== 'cuda') throw new Error(`${file}: a CUDA run is needed (device ${saved.device})`);
  let commit = 'unknown';
  try { commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}
  const base = values.models ?? path.join(os.tmpdir(), 'llmts-fit-cuda-sparse');
  const machine = saved.machine as Machine;
  const results = (saved.results as CaseResult[]).map((r) => ({ case: r.case, status: r.status, why: r.why, wallS: r.wallS, child: r.child }) as CaseResult);
  const dirs = new Map<string, string>();
  for (const r of results) {
    if (r.status !== 'ok') continue;
    if (!dirs.has(r.case.model)) dirs.set(r.case.model, sparseModel(r.case.model, base));
    r.measured = measuredOf(r.child!);
    r.predicted = await predict(r.case, dirs.get(r.case.model)!, r.child!, machine);
  }
  const header = {
    command: `${saved.command} (recomputed: ${recordedCommand(process.argv.slice(2))})`,
    commit: `${saved.commit} (measured); predictions recomputed at ${commit}`, device: 'cuda', gpuInfo: saved.gpuInfo, machine,
    budgetS: saved.budgetS, started: saved.started, host: saved.host, loadavg: saved.loadavg,
  };
  // --measured-tree: what the device ran when the recorded commit does not say it (an uncommitted tree)
  const ran = values['measured-tree'] ?? `commit ${saved.commit}`;
  const where = `${saved.command} on ${String(saved.gpuInfo).split(',')[0]}, ${ran}, ${String(saved.started).slice(0, 10)} ` +
    `(recorded measurements: ${path.relative(ROOT, path.resolve(file))}, refitted offline by --from-json at commit ${commit})`;
  const { decodeFit, constants } = await fitAndRecompute(results, machine, where, (m) => dirs.get(m)!);
  fs.mkdirSync(OUT, { recursive: true });
  fs.writeFileSync(path.join(OUT, 'fit-cuda.json'), JSON.stringify({ ...header, recomputedFrom: file, finished: true, results, decodeFit, constants }, null, 2));
  fs.writeFileSync(path.join(OUT, 'summary.md'), summary(header, results, decodeFit, constants, true));
  if (constants.length) fs.writeFileSync(path.join(OUT, 'constants.ts.txt'), constantsSnippet(constants));
  log(fs.readFileSync(path.join(OUT, 'summary.md'), 'utf8'));
}

/** Fits the constants from every case, then predicts every case again with them. */
async function fitAndRecompute(results: CaseResult[], machine: Machine, where: string, dirOf: (model: string) => string):
  Promise<{ decodeFit: DecodeFit | null; constants: ConstantOut[] }> {
  const ok = results.filter((r) => r.status === 'ok');
  // tiny probes are overhead-only: their decode times fit the step and kernel constants
  const samples: DecodeSample[] = ok.filter((r) => Number.isFinite(r.child!.decodeTps))
    .map((r) => ({ name: r.case.name, terms: r.predicted!.terms, seconds: r.case.batch / r.child!.decodeTps }));
  const decodeFit = samples.length >= 2 ? fitDecodeConstants(samples) : null;
  const constants = deriveConstants(results, decodeFit, machine, where);
  const fitted = Object.fromEntries(constants.filter((x) => Number.isFinite(x.value)).map((x) => [x.name, x.value])) as Partial<Record<K.ConstantName, number>>;
  if (DEVICE === 'cpu') for (const k of Object.keys(fitted) as K.ConstantName[]) if (k.startsWith('CUDA_')) delete fitted[k];
  await K.withConstants(fitted, async () => {
    for (const r of ok) {
      const mach = DEVICE === 'cpu' ? cpuMachine(r.child!.copyGBps ?? machine.bandwidthGBps) : machine;
      r.calibrated = await predict(r.case, dirOf(r.case.model), r.child!, mach);
    }
  });
  return { decodeFit, constants };
}

async function main(): Promise<void> {
  if (values.child) {
    process.stdout.write(`${JSON.stringify(await child(JSON.parse(values.child)))}\n`);
    return;
  }
  if (values['from-json']) {
    if (!values.out) throw new Error('--out DIR is required');
    await replay(values['from-json'], path.resolve(values.out));
    return;
  }
  if (!values.out) throw new Error('--out DIR is required');
  const OUT = path.resolve(values.out);
  fs.mkdirSync(path.join(OUT, 'cases'), { recursive: true });
  const specs = modelSpecs();
  const only = values.only?.split(',').map((s) => s.trim()).filter(Boolean);
  const skip = values.skip?.split(',').map((s) => s.trim()).filter(Boolean);
  const selected = cases().filter((x) => (!only || only.some((o) => x.name.includes(o))) && !(skip ?? []).some((o) => x.name.includes(o)));
  let commit = process.env.LLMTS_COMMIT ?? 'unknown';
  try { commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}
  let gpuInfo = '';
  if (DEVICE === 'cuda') {
    try {
      gpuInfo = execFileSync('nvidia-smi', ['--query-gpu=name,driver_version,memory.total,memory.used', '--format=csv,noheader'], { encoding: 'utf8', timeout: 10_000 }).trim();
    } catch { gpuInfo = 'nvidia-smi unavailable'; }
  }
  const machine: Machine = DEVICE === 'cuda' ? gpuMachine(values.gpu!) : cpuMachine(measureCopyBandwidth());
  const header = {
    command: recordedCommand(process.argv.slice(2)), commit, device: DEVICE, gpuInfo,
    machine, budgetS: BUDGET_MS / 1000, started: new Date().toISOString(), host: `${os.cpus()[0]?.model ?? ''}, ${os.availableParallelism()} cpus`,
    loadavg: fs.readFileSync('/proc/loadavg', 'utf8').trim(),
  };
  log(`fit-cuda: ${header.command}\n  commit ${commit}; ${gpuInfo || machine.description}; budget ${BUDGET_MS / 1000} s`);
  const results: CaseResult[] = [];
  const makes: { model: string; status: string; wallS: number; out: string }[] = [];
  let decodeFit: DecodeFit | null = null;
  let constants: ConstantOut[] = [];
  let finished = false;

  const save = () => {
    fs.writeFileSync(path.join(OUT, 'fit-cuda.json'), JSON.stringify({ ...header, finished, elapsedS: (Date.now() - START) / 1000, makes, results, decodeFit, constants }, null, 2));
    fs.writeFileSync(path.join(OUT, 'summary.md'), summary(header, results, decodeFit, constants, finished));
    if (constants.length) fs.writeFileSync(path.join(OUT, 'constants.ts.txt'), constantsSnippet(constants));
  };
  const onSignal = (sig: string) => {
    log(`fit-cuda: ${sig}: writing what it has`);
    save();
    process.exit(130);
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));

  // models the selected cases need, made in the order the cases need them
  const needed = [...new Set(selected.map((x) => x.model))];
  const ready = new Set<string>();
  for (const key of needed) {
    const spec = specs[key];
    if (!spec) throw new Error(`no model "${key}"`);
    if (haveModel(spec.dir)) {
      ready.add(key);
      continue;
    }
    if (!spec.make) continue;
    const limit = Math.min(spec.makeLimitS ?? 120, left() / 1000 - 30);
    if (limit < 10) {
      makes.push({ model: key, status: 'skipped (budget)', wallS: 0, out: '' });
      continue;
    }
    log(`make ${key}: ${spec.make.join(' ')} (limit ${limit.toFixed(0)} s)`);
    const t = Date.now();
    const r = spawnSync(spec.make[0]!, spec.make.slice(1), { cwd: ROOT, encoding: 'utf8', timeout: limit * 1000 });
    const out = `${r.stdout ?? ''}${r.stderr ?? ''}`.trim();
    const status = r.status === 0 && haveModel(spec.dir) ? 'ok' : r.error ? `failed: ${r.error.message}` : `failed: exit ${r.status}`;
    makes.push({ model: key, status, wallS: (Date.now() - t) / 1000, out: out.slice(-2000) });
    log(`  ${status} in ${((Date.now() - t) / 1000).toFixed(1)} s${out ? `: ${out.split('\n').pop()}` : ''}`);
    if (status === 'ok') ready.add(key);
  }
  save();

  // per model: prefill seconds per (token^2) of its longest case done, to skip what cannot finish.
  // The longest, not the worst: a short prompt's prefill is mostly fixed costs (kernel loads, GEMM
  // timing of new shapes), which extrapolated as n^2 put 32k at 340 s where it takes seconds.
  const prefillRate = new Map<string, { tokens: number; rate: number }>();
  const loadS = new Map<string, number>();
  for (const cs of selected) {
    const spec = specs[cs.model]!;
    const t = Date.now();
    const record = (r: Omit<CaseResult, 'case' | 'wallS'>) => {
      results.push({ case: cs, wallS: (Date.now() - t) / 1000, ...r });
      save();
    };
    if (!ready.has(cs.model)) {
      record({ status: 'skipped', why: `model ${cs.model} is missing (${spec.dir})` });
      continue;
    }
    const rate = prefillRate.get(cs.model)?.rate;
    const estimate = (loadS.get(cs.model) ?? 0) + 5 + (rate ? rate * (cs.prompt * cs.batch) ** 2 : 0);
    const budgetS = left() / 1000 - 15;
    if (budgetS < 10 || estimate > budgetS) {
      record({ status: 'skipped', why: `${budgetS.toFixed(0)} s of the budget left; estimated ${estimate.toFixed(0)} s` });
      log(`${cs.name}: skipped (${budgetS.toFixed(0)} s left, estimated ${estimate.toFixed(0)} s)`);
      continue;
    }
    const limit = Math.min(cs.limitS, budgetS);
    const args: ChildArgs = { device: DEVICE, dir: spec.dir, prompt: cs.prompt, gen: cs.gen, chunk: cs.chunk, batch: cs.batch };
    const res = await runChild(args, limit, path.join(OUT, 'cases', `${cs.name.replace(/[^a-z0-9]+/gi, '-')}.log`));
    if (res.status !== 'ok') {
      record({ status: res.status, why: res.why });
      log(`${cs.name}: ${res.status}: ${res.why}`);
      continue;
    }
    const r = res.result!;
    const tokens = cs.prompt * cs.batch;
    if (tokens >= (prefillRate.get(cs.model)?.tokens ?? 0)) prefillRate.set(cs.model, { tokens, rate: (r.prefillMs / 1000) / tokens ** 2 });
    loadS.set(cs.model, (r.createMs + r.loadMs) / 1000);
    const measured = measuredOf(r);
    const mach = DEVICE === 'cpu' ? cpuMachine(r.copyGBps ?? machine.bandwidthGBps) : machine;
    const predicted = await predict(cs, spec.dir, r, mach);
    record({ status: 'ok', child: r, measured, predicted });
    log(`${cs.name}: peak ${gib(measured.peakTotal ?? NaN)} GiB predicted ${gib(predicted.peakTotal)} (${pct(predicted.peakTotal / (measured.peakTotal ?? NaN) - 1)}); ` +
      `weights ${pct(predicted.weights / measured.weights - 1)}, KV ${pct(predicted.kv / measured.kv - 1)}, step live ${mib(measured.stepLive)} MiB ` +
      `predicted ${mib(predicted.stepLive)}; decode ${r.decodeTps.toFixed(1)} tok/s predicted ${predicted.decodeTps.toFixed(1)} ` +
      `(${pct(predicted.decodeTps / r.decodeTps - 1)}); ${((Date.now() - t) / 1000).toFixed(1)} s`);
  }

  // constants from every case, then the predictions again with them
  const where = `${header.command} on ${DEVICE === 'cuda' ? (gpuInfo.split(',')[0] ?? 'the GPU') : 'the CPU (plumbing test)'}, commit ${commit}, ${header.started.slice(0, 10)}`;
  ({ decodeFit, constants } = await fitAndRecompute(results, machine, where, (m) => specs[m]!.dir));
  finished = true;
  save();
  log('');
  log(fs.readFileSync(path.join(OUT, 'summary.md'), 'utf8'));
  log(`fit-cuda: done in ${((Date.now() - START) / 1000).toFixed(0)} s; ${OUT}/{fit-cuda.json,summary.md,constants.ts.txt}`);
}

function summary(header: Record<string, unknown>, results: CaseResult[], decode: DecodeFit | null, constants: ConstantOut[], finished: boolean): string {
  const ok = results.filter((r) => r.status === 'ok');
  const L: string[] = [
    `# fit planner vs ${DEVICE === 'cuda' ? 'CUDA' : 'CPU (plumbing test)'} runs${finished ? '' : ' (partial)'}`,
    '',
    `command: \`${header.command}\`; commit ${header.commit}; ${header.gpuInfo || (header.machine as Machine).description}; ` +
      `${header.host}; load ${header.loadavg}; started ${header.started}`,
    '',
    '## Memory (GiB; measured = device memory the process used, predicted = the planner\'s model of the same run)',
    '',
    '| case | weights meas / plan | KV meas / plan | step live MiB meas / sim | error | graphs MiB meas / sim | peak meas | peak pred | error | peak pred, run\'s growth | error | `fit` total | needed meas | error |',
    '|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of ok) {
    const m = r.measured!, p = r.calibrated ?? r.predicted!;
    const rg = p.peakRunGrowth;
    L.push(`| ${r.case.name} | ${gib(m.weights)} / ${gib(p.weights)} | ${gib(m.kv)} / ${gib(p.kv)} | ${mib(m.stepLive)} / ${mib(p.stepLive)} | ` +
      `${pct(p.stepLive / m.stepLive - 1)} | ${mib(m.graphs)} / ${mib(p.graphs)} | ` +
      `${m.peakTotal === null ? '—' : gib(m.peakTotal)} | ${gib(p.peakTotal)} | ${m.peakTotal === null ? '—' : pct(p.peakTotal / m.peakTotal - 1)} | ` +
      `${rg === undefined ? '—' : gib(rg)} | ${rg === undefined || m.peakTotal === null ? '—' : pct(rg / m.peakTotal - 1)} | ` +
      `${gib(p.fitTotal)} | ${m.needed === null ? '—' : gib(m.needed)} | ${m.needed === null ? '—' : pct(p.fitTotal / m.needed - 1)} |`);
  }
  L.push('', '## Decode (tok/s of the batch; predicted with the constants.ts values of this tree, then with the constants fitted here)', '',
    '| case | measured | ms/step | launches/step | predicted now | error | predicted fitted | error | held out |', '|---|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of ok) {
    const h = decode?.rows.find((x) => x.name === r.case.name);
    L.push(`| ${r.case.name} | ${r.child!.decodeTps.toFixed(1)} | ${(1000 * r.case.batch / r.child!.decodeTps).toFixed(2)} | ` +
      `${r.child!.launchesPerStep?.toFixed(0) ?? '—'} | ${r.predicted!.decodeTps.toFixed(1)} | ${pct(r.predicted!.decodeTps / r.child!.decodeTps - 1)} | ` +
      `${r.calibrated ? r.calibrated.decodeTps.toFixed(1) : '—'} | ${r.calibrated ? pct(r.calibrated.decodeTps / r.child!.decodeTps - 1) : '—'} | ` +
      `${h && Number.isFinite(h.heldOutError) ? pct(-h.heldOutError / (1 + h.heldOutError)) : '—'} |`);
  }
  if (decode) L.push('', `decode fit (raw; Infinity = no cost seen, not written as a constant): ${Object.entries(decode.values).map(([n, v]) => `${n} = ${Number(v).toPrecision(4)}`).join(', ')}`);
  if (DEVICE === 'cuda' && ok.length && ok.every((r) => r.measured!.context === null)) {
    L.push('', 'Device memory before each process could not be read (neither NVML nor nvidia-smi answered): the context, the peaks and `needed` are not measured.');
  }
  L.push('', '## Phases and the rest', '', '| case | status | wall s | create ms | load ms | prefill ms | driver allocs | non-pool growth MiB |', '|---|---|---:|---:|---:|---:|---:|---:|');
  for (const r of results) {
    const ch = r.child;
    L.push(`| ${r.case.name} | ${r.status}${r.why ? `: ${r.why}` : ''} | ${r.wallS.toFixed(1)} | ${ch ? ch.createMs.toFixed(0) : ''} | ${ch ? ch.loadMs.toFixed(0) : ''} | ` +
      `${ch ? ch.prefillMs.toFixed(0) : ''} | ${ch?.driverAllocs ?? ''} | ${r.measured ? mib(r.measured.growth) : ''} |`);
  }
  if (constants.length) {
    L.push('', '## Constants measured in this run (constants.ts.txt has them as code)', '', '| constant | value | measurement |', '|---|---:|---|');
    for (const x of constants) L.push(`| ${x.name} | ${/_BYTES$/.test(x.name) ? `${x.value} (${mib(x.value)} MiB)` : x.value} | ${x.how} |`);
  }
  return `${L.join('\n')}\n`;
}

await main();
