// CUDA prefill and decode throughput of one model, through the engine (the path users take).
// Prints tok/s, achieved weight-read bandwidth for decode against the H200's copy bandwidth
// (measured in the same run when --ceilings names bench/gpu_ceilings.py's JSON; otherwise the
// H200's 4,275 GB/s of BENCHMARKS.md "Machines", bytes read + written), kernel launches per decode step
// (small kernels are launch-bound until decode is fused and graph-captured), time from launch to
// ready, and with --prefill-prompts the time to first token and prefill MFU for each prompt length.
//
//   node --import tsx bench/cuda-generate.ts --model models/demo [--prompt-tokens 512] [--decode-tokens 128]
//        [--repeats 3] [--prefill-prompts 1024,8192] [--prefill-repeats 2] [--token-budget 512]
//        [--max-model-len N] [--ceilings ceilings.json] [--device cuda|cpu] [--json out.json]
//        [--profile-graph [--profile-batch N]]
//
// --profile-graph prints where a decode step's time goes inside its graph; with --profile-batch N
// (default 1) the profiled step is one of N requests decoding together (N different prompts of
// --prompt-tokens, 32 tokens each, after the B=1 runs).
//
// Every run uses a different prompt (no shared prefix) and the engine's prefix cache is off, so a
// repeat never reuses the KV of an earlier one. Prompt r (r = 0 is the warm-up) of n tokens:
// ids[k] = (k * 7919 + 13 + 31 * r) % min(vocab, 5000); bench/peers/transformers_gpu.py uses the same.
// --device cpu only smoke-tests this script off the GPU machine. With LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1
// one more run counts the tensor-core decode attention's cycles by phase (attention-decode-tc.ts).
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import type { Backend, Tensor } from '../src/contracts/backend.ts';
import { dtypeBytes } from '../src/contracts/backend.ts';
import { DEFAULT_TOKEN_BUDGET, Engine } from '../src/execution/engine.ts';
import { loadModel } from '../src/execution/load-model.ts';
import { benchCommit } from './commit.ts';

const README_COPY_GBPS = 4275; // H200 device-to-device copy (bench/gpu_ceilings.py, PyTorch; BENCHMARKS.md "Machines")
const README_GEMM_TFLOPS = 797; // H200 bf16 GEMM at 8192^3 (bench/gpu_ceilings.py, PyTorch; BENCHMARKS.md "Machines")

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    'prompt-tokens': { type: 'string', default: '512' },
    'decode-tokens': { type: 'string', default: '128' },
    repeats: { type: 'string', default: '3' },
    'prefill-prompts': { type: 'string', default: '' },
    'prefill-repeats': { type: 'string', default: '2' },
    'token-budget': { type: 'string' },
    'max-model-len': { type: 'string' },
    ceilings: { type: 'string' },
    device: { type: 'string', default: 'cuda' },
    json: { type: 'string' },
    'profile-steps': { type: 'string', default: '0' },
    'profile-graph': { type: 'boolean', default: false },
    'profile-batch': { type: 'string', default: '1' },
  },
});
// --profile-graph: event nodes around every call captured into a graph (graph-profiler.ts;
// CudaRuntimeSettings.graphProfile, passed when the backend is created). Profiled replays run
// slower: the decode figures of such a run are not the engine's.
const promptTokens = Number(values['prompt-tokens']);
const decodeTokens = Number(values['decode-tokens']);
const repeats = Number(values.repeats);
const sweep = values['prefill-prompts']!.split(',').filter((s) => s.trim() !== '').map(Number);
const prefillRepeats = Number(values['prefill-repeats']);
const tokenBudget = values['token-budget'] === undefined ? undefined : Number(values['token-budget']);
const profileBatch = Number(values['profile-batch']);
for (const n of [promptTokens, decodeTokens, repeats, prefillRepeats, profileBatch, ...sweep])
  if (!Number.isInteger(n) || n < 1) throw new Error(`bad count ${n}`);

let copyGBps = README_COPY_GBPS, gemmTflops = README_GEMM_TFLOPS, ceilingSource = 'BENCHMARKS.md Machines (H200, bench/gpu_ceilings.py)';
if (values.ceilings) {
  const c = JSON.parse(readFileSync(values.ceilings, 'utf8')) as { copyGBps: number; gemmTflops: number };
  copyGBps = c.copyGBps;
  gemmTflops = c.gemmTflops;
  ceilingSource = `same run (${values.ceilings})`;
}

const tStart = performance.now(); // ms since the process started (node + tsx startup before it)
let backend: Backend & { launches?: number; describe?: () => string; sync(): Promise<void>; close?: () => Promise<void> | void };
if (values.device === 'cpu') {
  const { createCpuBackend } = await import('../src/backends/cpu/cpu-backend.ts');
  backend = await createCpuBackend() as typeof backend;
} else {
  const { createCudaBackend } = await import('../src/backends/cuda/index.ts');
  backend = await createCudaBackend(values['profile-graph'] ? { settings: { runtime: { graphProfile: true } } } : {}) as typeof backend;
}
const launchCount = () => backend.launches ?? 0;
const tBackend = performance.now();
const m = await loadModel(backend, values.model!);
await backend.sync();
const tLoaded = performance.now();
const cfg = m.config;
// --profile-graph --profile-batch N: N requests decode together. Their prompts prefill at most a
// token budget a step while the first ones already decode, so each
// decodes long enough to outlast all the prefill: the last steps hold all N (with 32 tokens each,
// 64 prompts of 1k never decoded together and the profile showed the 16-row graph)
const profileDecodeTokens = profileBatch > 1 ? 32 + Math.ceil((profileBatch * promptTokens) / (tokenBudget ?? DEFAULT_TOKEN_BUDGET)) : 0;
const maxModelLen = values['max-model-len'] !== undefined
  ? Number(values['max-model-len'])
  : Math.max(promptTokens + decodeTokens, promptTokens + profileDecodeTokens, ...sweep.map((n) => n + 1)) + 16;
const engine = new Engine(m.model, m, {
  maxBatch: profileBatch, tokenBudget, maxModelLen, kvTokens: maxModelLen * profileBatch, prefixCache: { promptCacheBytes: 0 },
});
const tReady = performance.now();

const numel = (t: Tensor) => t.shape.reduce((x, y) => x * y, 1);
// an FP8 matrix (CudaFp8Tensor) reads its scales beside its bytes
const size = (t: Tensor): number => numel(t) * dtypeBytes[t.dtype] + ('scales' in t ? size((t as Tensor & { scales: Tensor }).scales) : 0);
// bytes every decode step must read: all layer matrices and the lm_head (not the embedding table);
// a mixture-of-experts layer: its router and, of its stacked experts, the topK of E one token uses
const w = m.model.weights;
const topK = m.model.config.moe?.topK ?? 0;
const layerBytes = (l: (typeof w.layers)[number]) => {
  const attn = [l.attn.q, l.attn.k, l.attn.v, l.attn.o].reduce((a, t) => a + size(t), 0);
  const experts = size(l.mlp.gate) + size(l.mlp.up) + size(l.mlp.down);
  if (l.mlp.kind === 'dense') return attn + experts;
  return attn + size(l.mlp.router) + (experts * topK) / l.mlp.gate.shape[0]!;
};
const weightBytes = w.layers.reduce((a, l) => a + layerBytes(l), 0) + size(w.lmHead);
// every matrix the load wrote (all experts): the load's own rate
const loadedBytes = w.layers.reduce((a, l) => a + [l.attn.q, l.attn.k, l.attn.v, l.attn.o, l.mlp.gate, l.mlp.up, l.mlp.down]
  .reduce((x, t) => x + size(t), 0), 0) + size(w.lmHead);
// parameters: every distinct tensor of the model (embedding, norms, lm_head unless tied)
const PACKED = new Set(['qkv', 'qkvBias', 'gateUp', 'gateUpBias']);
const seen = new Set<unknown>();
let totalParams = 0;
const walk = (o: unknown): void => {
  if (o === null || typeof o !== 'object' || seen.has(o)) return;
  seen.add(o);
  const t = o as Partial<Tensor>;
  if (Array.isArray(t.shape) && typeof t.dtype === 'string' && t.dtype in dtypeBytes) {
    totalParams += numel(t as Tensor);
    return;
  }
  // packed q/k/v and gate/up are counted through their row views (q, k, v, gate, up)
  for (const [k, v] of Object.entries(o)) if (!PACKED.has(k)) walk(v);
};
walk(w);

const vocabForPrompts = Math.min(cfg.vocabSize, 5000);
const promptIds = (n: number, r: number) => Array.from({ length: n }, (_, k) => (k * 7919 + 13 + 31 * r) % vocabForPrompts);

interface Run { ttftMs: number; decodeMs: number; tokens: number; launchesPerStep: number; cachedTokens: number; enqueueMsPerStep: number }
async function once(prompt: number[], maxTokens: number, onFirst?: () => void): Promise<Run> {
  const t0 = performance.now();
  let tFirst = 0, l0 = 0, n = 0, cachedTokens = -1, enqueueMs = 0;
  for await (const e of engine.generate({ promptIds: prompt, maxTokens, sampling: { temperature: 0 }, ignoreEos: true })) {
    if (e.type === 'token' && n > 0) enqueueMs += m.model.lastEnqueueMs;
    if (e.type === 'token' && n++ === 0) {
      tFirst = performance.now();
      l0 = launchCount();
      onFirst?.();
    }
    if (e.type === 'finish') {
      cachedTokens = e.cachedTokens;
      if (e.finishReason === 'error') throw new Error(`generation failed: ${e.error}`);
    }
  }
  const t1 = performance.now();
  return {
    ttftMs: tFirst - t0, decodeMs: t1 - tFirst, tokens: n, launchesPerStep: (launchCount() - l0) / Math.max(1, n - 1), cachedTokens,
    enqueueMsPerStep: enqueueMs / Math.max(1, n - 1),
  };
}
const median = (xs: number[]) => { const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h]! : (s[h - 1]! + s[h]!) / 2; };
const log = (s: string) => console.log(s);

// ---- decode (and the prefill of its prompt) ----
const prefill: number[] = [], decode: number[] = [], launches: number[] = [], cached: number[] = [], enqueue: number[] = [];
for (let r = 0; r <= repeats; r++) {
  const run = await once(promptIds(promptTokens, r), decodeTokens);
  if (r === 0) continue; // warm-up
  if (run.tokens !== decodeTokens) throw new Error(`expected ${decodeTokens} tokens, got ${run.tokens}`);
  prefill.push(promptTokens / (run.ttftMs / 1000));
  decode.push((run.tokens - 1) / (run.decodeMs / 1000));
  launches.push(run.launchesPerStep);
  cached.push(run.cachedTokens);
  enqueue.push(run.enqueueMsPerStep);
}
const decodeTps = median(decode);
const gbps = (decodeTps * weightBytes) / 1e9;
// the KV a decode step reads besides the weights, at the decode's mean context (the prompt and half
// the decoded tokens): every layer's keys and values in view (its window where it has one), in the
// KV cache's dtype (the activations'). The ratio above counts weights only, as the issue's goal does;
// this one is the MBU-style figure that counts every byte the step must read.
const meanContext = promptTokens + decodeTokens / 2;
const kvBytes = cfg.layers.reduce((a, l) => a + Math.min(meanContext, l.window > 0 ? l.window : Infinity), 0) *
  2 * cfg.numKvHeads * cfg.headDim * dtypeBytes[backend.activationDtype];
const readGbps = (decodeTps * (weightBytes + kvBytes)) / 1e9;
const commit = benchCommit();
const ttft: { promptTokens: number; ttftMs: number; ttftMsAll: number[]; prefillTokPerS: number; mfu: number; mfuWithAttention: number; cachedTokens: number[] }[] = [];
const result = {
  device: backend.describe?.() ?? backend.name, commit, model: values.model, modelType: cfg.modelType,
  totalParams, tokenBudget: tokenBudget ?? 'engine default', maxModelLen,
  // ms since process start; node + tsx startup come before backendStartMs
  backendStartMs: tStart, backendInitMs: tBackend - tStart, loadMs: tLoaded - tBackend, readyMs: tReady,
  weightBytesPerDecodeStep: weightBytes, promptTokens, decodeTokens,
  prefillTokPerS: median(prefill), decodeTokPerS: decodeTps, decodeTokPerSAll: decode, decodeWeightGBps: gbps,
  copyBandwidthGBps: copyGBps, gemmTflops, ceilingSource, decodeBandwidthRatio: gbps / copyGBps,
  kvBytesPerDecodeStep: kvBytes, decodeReadGBps: readGbps, decodeReadRatio: readGbps / copyGBps,
  launchesPerDecodeStep: median(launches), msPerDecodeStep: 1000 / decodeTps, cachedTokens: cached,
  // host time to enqueue one decode step's ops (the device runs meanwhile; above the step time = host-bound)
  hostEnqueueMsPerDecodeStep: median(enqueue),
  profile: [] as { name: string; callsPerStep: number; usPerStep: number; share: number }[],
  ttft,
};
// written after every phase: a run stopped part-way still leaves what it measured
const save = () => { if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2)); };
save();
log(`device   ${result.device}   commit ${commit}`);
log(`model    ${values.model} (${cfg.modelType}, ${(totalParams / 1e9).toFixed(3)} B params, ` +
  `${(weightBytes / 2 ** 20).toFixed(1)} MiB read per decode step)`);
log(`ready    ${tReady.toFixed(0)} ms after launch (node+tsx ${tStart.toFixed(0)}, backend init ${result.backendInitMs.toFixed(0)}, ` +
  `weights ${result.loadMs.toFixed(0)} ms = ${(loadedBytes / (result.loadMs / 1000) / 1e9).toFixed(2)} GB/s of matrices)`);
log(`prefill  ${result.prefillTokPerS.toFixed(1)} tok/s  (${promptTokens}-token prompt, median of ${repeats})`);
log(`decode   ${decodeTps.toFixed(2)} tok/s (${result.msPerDecodeStep.toFixed(2)} ms/step, ` +
  `${result.launchesPerDecodeStep.toFixed(0)} launches/step) = ${gbps.toFixed(1)} GB/s of weights; ` +
  `copy bandwidth ${copyGBps.toFixed(0)} GB/s (${ceilingSource}) -> ratio ${result.decodeBandwidthRatio.toFixed(4)}; ` +
  `with the KV read (${(kvBytes / 2 ** 20).toFixed(1)} MiB a step) ${result.decodeReadRatio.toFixed(4)}`);
log(`host     ${result.hostEnqueueMsPerDecodeStep.toFixed(2)} ms to enqueue a decode step`);

// ---- the decode attention's phases ($LLMTS_CUDA_ATT_DEFINES=ATT_TC_PHASES=1): one more run, counted from its first token ----
type PhaseRow = { phase: string; cycles: number; blocks: number };
const att = backend as Backend & { attentionPhases?: () => Promise<PhaseRow[] | null>; resetAttentionPhases?: () => boolean };
if (att.attentionPhases && att.resetAttentionPhases && (await att.attentionPhases()) !== null) {
  await once(promptIds(promptTokens, 998), decodeTokens, () => att.resetAttentionPhases!());
  const rows = (await att.attentionPhases())!;
  (result as Record<string, unknown>).attentionPhases = rows;
  save();
  const block = rows.find((r) => r.phase === 'block')!;
  log(`attention phases over ${block.blocks} blocks of ${decodeTokens - 1} decode steps (thread 0's clock64 cycles, mean a block that had the phase):`);
  for (const r of rows) {
    log(`  ${r.phase.padEnd(8)} ${(r.blocks ? r.cycles / r.blocks : 0).toFixed(0).padStart(8)} cycles  ${String(r.blocks).padStart(8)} blocks`);
  }
}

// ---- device time per kernel over some decode steps ----
const profileSteps = Number(values['profile-steps']);
const prof = backend as Backend & { startProfile?: () => void; stopProfile?: () => Promise<{ name: string; calls: number; ms: number }[]> };
if (profileSteps > 0 && prof.startProfile && prof.stopProfile) {
  await once(promptIds(promptTokens, 999), profileSteps + 1, () => prof.startProfile!());
  const rows = await prof.stopProfile();
  const total = rows.reduce((a, r) => a + r.ms, 0);
  result.profile = rows.map((r) => ({ name: r.name, callsPerStep: r.calls / profileSteps, usPerStep: (1000 * r.ms) / profileSteps, share: r.ms / total }));
  save();
  log(`profile  device time per decode step over ${profileSteps} steps: ${((1000 * total) / profileSteps).toFixed(0)} us of kernels`);
  for (const r of result.profile.slice(0, 30))
    log(`  ${r.name.padEnd(28)} ${r.callsPerStep.toFixed(1).padStart(6)} calls ${r.usPerStep.toFixed(1).padStart(9)} us ${(100 * r.share).toFixed(1).padStart(5)}%`);
}

// ---- device time per kernel inside the decode graph (its last replay) ----
type GraphRows = {
  graph: number; calls: number; kernelMs: number; spanMs: number; kernels: { name: string; calls: number; ms: number }[];
  sequence: { name: string; us: number }[];
}[];
const gprof = backend as Backend & { graphProfile?: () => Promise<GraphRows> };
if (values['profile-graph'] && gprof.graphProfile) {
  if (profileBatch > 1) {
    const runs = await Promise.all(Array.from({ length: profileBatch }, (_, i) => once(promptIds(promptTokens, 1000 + i), profileDecodeTokens)));
    if (runs.some((r) => r.tokens !== profileDecodeTokens)) throw new Error('a batch request stopped early');
  }
  const graphs = await gprof.graphProfile();
  (result as Record<string, unknown>).graphProfile = graphs;
  save();
  // the decode step's graph: the one with the most calls, then the longest (with --profile-batch,
  // the N-row graph: its step does more than the 1-row one's)
  const g = [...graphs].sort((a, b) => b.calls - a.calls || b.spanMs - a.spanMs)[0];
  if (!g) log('graph    no replayed graph to profile (graphs off?)');
  else {
    log(`graph    last replay of the largest graph (${g.calls} calls${profileBatch > 1 ? `; ${profileBatch} requests decoding` : ''}): ` +
      `${(1000 * g.spanMs).toFixed(0)} us from its first call's ` +
      `start to its last one's end, ${(1000 * g.kernelMs).toFixed(0)} us in calls, ${(1000 * (g.spanMs - g.kernelMs)).toFixed(0)} us ` +
      `between them (launch gaps and the profile's own event nodes; PDL is off while profiling)`);
    for (const k of g.kernels.slice(0, 30))
      log(`  ${k.name.padEnd(36)} ${String(k.calls).padStart(4)} calls ${(1000 * k.ms).toFixed(1).padStart(9)} us ${(100 * k.ms / g.spanMs).toFixed(1).padStart(5)}%`);
    // one layer in the middle, call by call: from an attention call to the next one
    const att = g.sequence.flatMap((c, i) => (c.name.includes('attn') ? [i] : []));
    const mid = Math.floor(att.length / 2);
    if (att.length > 1 && mid + 1 < att.length) {
      log(`layer    calls ${att[mid]}-${att[mid + 1]! - 1} of the graph, in order (us): ` +
        g.sequence.slice(att[mid], att[mid + 1]).map((c) => `${c.name} ${c.us}`).join(', '));
    }
  }
}

// ---- what the GEMM tuner chose per decode shape (cuBLASLt vs our GEMV kernels) ----
const tuning = (backend as Backend & { gemmTuning?: readonly { shape: string; cublasLtMs: number; firstMs: number; gemvMs: Record<string, number>; chosen: string }[] }).gemmTuning ?? [];
(result as Record<string, unknown>).gemmTuning = tuning;
for (const t of tuning.filter((r) => Number(r.shape.split('x')[0]) <= 8)) {
  const [M, N, K] = t.shape.split('x').map(Number) as [number, number, number];
  const gbs = (ms: number) => ((N * K * 2) / (ms / 1000) / 1e9).toFixed(0);
  log(`gemm     ${t.shape.padEnd(18)} cublasLt ${(1000 * t.cublasLtMs).toFixed(1)} us (${gbs(t.cublasLtMs)} GB/s; ` +
    `heuristic's first ${(1000 * t.firstMs).toFixed(1)} us)` +
    Object.entries(t.gemvMs).map(([k, ms]) => `  ${k} ${(1000 * ms).toFixed(1)} us (${gbs(ms)} GB/s)`).join('') + `  -> ${t.chosen}`);
  void M;
}
save();

// ---- time to first token for each prompt length (one token generated) ----
for (const [i, n] of sweep.entries()) {
  const ms: number[] = [], c: number[] = [];
  for (let r = 1; r <= prefillRepeats; r++) {
    const run = await once(promptIds(n, 1000 * (i + 1) + r), 1);
    ms.push(run.ttftMs);
    c.push(run.cachedTokens);
  }
  const t = median(ms) / 1000;
  // convention: 2 * parameters * prompt tokens (embedding included, attention excluded)
  const flops = 2 * totalParams * n;
  // causal attention adds QK^T and PV: 2 * 2 * (n^2 / 2) * heads * headDim per layer
  const attnFlops = 2 * n * n * cfg.numHeads * cfg.headDim * cfg.numLayers;
  ttft.push({
    promptTokens: n, ttftMs: median(ms), ttftMsAll: ms, prefillTokPerS: n / t,
    mfu: flops / t / (gemmTflops * 1e12), mfuWithAttention: (flops + attnFlops) / t / (gemmTflops * 1e12), cachedTokens: c,
  });
  save();
  log(`ttft     ${n}-token prompt: ${median(ms).toFixed(1)} ms (runs ${ms.map((x) => x.toFixed(0)).join(', ')}) = ` +
    `${(n / t).toFixed(0)} tok/s, MFU ${(100 * flops / t / (gemmTflops * 1e12)).toFixed(2)}% of ${gemmTflops.toFixed(0)} TFLOP/s ` +
    `(${(100 * (flops + attnFlops) / t / (gemmTflops * 1e12)).toFixed(2)}% counting attention)`);
}
await engine.close();
await backend.close?.();
