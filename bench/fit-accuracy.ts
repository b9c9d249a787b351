// How close the fit planner's predictions are to real runs on the CPU backend: peak resident
// memory (VmHWM of a fresh process per case) and decode tok/s, for the demo model, committed
// fixtures, and random-weight models at larger shapes (written by --make). Also the
// measurements behind the CPU constants in src/execution/fit/constants.ts (--calibrate).
//
//   node --import tsx bench/fit-accuracy.ts --make [--models DIR]     write the random-weight models
//   node --import tsx bench/fit-accuracy.ts [--models DIR] [--only NAME,...] [--json out.json] [--markdown]
//   node --import tsx bench/fit-accuracy.ts --calibrate [--models DIR]  runtime, tokenizer, decode constants
//
// Each case runs in its own child process (`--child`), so its VmHWM is that case's peak. The
// prediction for a case is the planner's model applied to what the case ran: the weights and
// KV pools of the engine it built, the runtime reserve, and the step shapes the engine actually
// executed (recorded in the child) simulated on the CPU pool model. The `fit total` column is
// what `llmts fit` reports for the same context (every step shape the token budget allows), an
// upper bound for a long-running server; the "sweep" cases run every step shape and approach it.

import { spawnSync } from 'node:child_process';
import { execSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { FitPlanner, type StepShape } from '../src/execution/fit/plan.ts';
import { cpuMachine, measureCopyBandwidth, type Machine } from '../src/execution/fit/machines.ts';
import * as K from '../src/execution/fit/constants.ts';
import { tensorsFor, writeCheckpoint } from '../test/fit/checkpoints.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const SELF = path.join(ROOT, 'bench', 'fit-accuracy.ts');

const { values } = parseArgs({
  options: {
    make: { type: 'boolean' },
    calibrate: { type: 'boolean' },
    child: { type: 'string' },
    models: { type: 'string', default: path.join(os.tmpdir(), 'llmts-fit-models') },
    only: { type: 'string' },
    json: { type: 'string' },
    repeats: { type: 'string', default: '3' },
  },
});
const REPEATS = Number(values.repeats);
const MODELS = values.models!;

// ---- random-weight models at larger shapes ----------------------------------------------------

const SYNTHETIC: Record<string, Record<string, unknown>> = {
  // Llama-3.2-1B shapes (1.24B parameters, tied embeddings, 128k vocabulary)
  'llama-1b': {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 128256, hidden_size: 2048,
    intermediate_size: 8192, num_hidden_layers: 16, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 64,
    max_position_embeddings: 8192, rms_norm_eps: 1e-5, rope_theta: 500000, hidden_act: 'silu',
    tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
  },
  // gemma2 layout (alternating sliding / full layers), window 512, 8 KV heads of 128
  'gemma2-sliding': {
    architectures: ['Gemma2ForCausalLM'], model_type: 'gemma2', vocab_size: 32000, hidden_size: 1024,
    intermediate_size: 4096, num_hidden_layers: 8, num_attention_heads: 8, num_key_value_heads: 8, head_dim: 128,
    max_position_embeddings: 8192, rms_norm_eps: 1e-6, rope_theta: 10000, hidden_activation: 'gelu_pytorch_tanh',
    query_pre_attn_scalar: 128, sliding_window: 512, attn_logit_softcapping: 50, final_logit_softcapping: 30,
    tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0,
  },
  // many tiny layers and a tiny vocabulary: decode time is all per-step and per-layer overhead
  'layers-24': {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 512, hidden_size: 64,
    intermediate_size: 128, num_hidden_layers: 24, num_attention_heads: 4, num_key_value_heads: 2,
    max_position_embeddings: 4096, rms_norm_eps: 1e-5, rope_theta: 10000, hidden_act: 'silu',
    tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
  },
  'layers-12': {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 512, hidden_size: 64,
    intermediate_size: 128, num_hidden_layers: 12, num_attention_heads: 4, num_key_value_heads: 2,
    max_position_embeddings: 4096, rms_norm_eps: 1e-5, rope_theta: 10000, hidden_act: 'silu',
    tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
  },
  // attention-heavy: small weights, 16 query heads of 128 on 4 KV heads; decode time grows with the context
  'attention-heavy': {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 512, hidden_size: 512,
    intermediate_size: 1024, num_hidden_layers: 4, num_attention_heads: 16, num_key_value_heads: 4, head_dim: 128,
    max_position_embeddings: 4096, rms_norm_eps: 1e-5, rope_theta: 10000, hidden_act: 'silu',
    tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
  },
  // qwen3_moe layout: 32 experts, 4 per token
  'qwen3-moe': {
    architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', vocab_size: 32000, hidden_size: 1024,
    intermediate_size: 3072, moe_intermediate_size: 768, num_hidden_layers: 8, num_attention_heads: 16,
    num_key_value_heads: 4, head_dim: 64, num_experts: 32, num_experts_per_tok: 4, norm_topk_prob: true,
    decoder_sparse_step: 1, mlp_only_layers: [], max_position_embeddings: 8192, rms_norm_eps: 1e-6,
    rope_theta: 1000000, hidden_act: 'silu', tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
  },
};

/** A byte-level BPE tokenizer.json with `vocab` tokens built by `vocab - 256` merges. */
function syntheticTokenizer(vocab: number): string {
  const demo = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/demo/tokenizer.json'), 'utf8'));
  const base = Object.keys(demo.model.vocab).filter((t) => [...t].length === 1).slice(0, 256);
  const tokens = [...base];
  const have = new Set(tokens);
  const merges: string[] = [];
  let s = 12345;
  const rnd = (n: number) => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s % n;
  };
  while (tokens.length < vocab) {
    const a = tokens[rnd(tokens.length)]!, b = tokens[rnd(Math.min(tokens.length, 4096))]!;
    const m = a + b;
    if (have.has(m) || [...m].length > 16) continue;
    have.add(m);
    tokens.push(m);
    merges.push(`${a} ${b}`);
  }
  demo.model.vocab = Object.fromEntries(tokens.map((t, i) => [t, i]));
  demo.model.merges = merges;
  demo.added_tokens = [];
  return JSON.stringify(demo);
}

function make(): void {
  const demo = path.join(ROOT, 'models/demo');
  const tok = fs.readFileSync(path.join(demo, 'tokenizer.json'), 'utf8');
  const tokCfg = fs.readFileSync(path.join(demo, 'tokenizer_config.json'), 'utf8');
  for (const [name, config] of Object.entries(SYNTHETIC)) {
    const dir = path.join(MODELS, name);
    process.stderr.write(`writing ${dir}\n`);
    writeCheckpoint(dir, config, tensorsFor(config), { data: 'random', files: { 'tokenizer.json': tok, 'tokenizer_config.json': tokCfg } });
  }
  const dir = path.join(MODELS, 'tokenizer-128k');
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), syntheticTokenizer(128000));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), tokCfg);
}

// ---- one measured run (child process) ---------------------------------------------------------

interface ChildArgs {
  /** run: one case; tokenizer: RSS of a parsed tokenizer; attention: decode steps at two contexts, alternating */
  kind: 'run' | 'tokenizer' | 'attention';
  dir: string;
  prompt: number;
  gen: number;
  chunk: number;
  batch: number;
  /** run prompts of every length in [from, to] (step), 2 tokens each, one after the other */
  sweep?: { from: number; to: number; step: number };
}

interface ChildResult {
  importsRss: number;
  peakRss: number;
  loadedRss: number;
  tokenizerRss?: number;
  /** rows x 1 / median interval between consecutive tokens of a row */
  decodeTps: number;
  /** tokens over the whole decode span (includes scheduling noise) */
  meanTps: number;
  steps: StepShape[];
  decodePositions: [number, number];
  kvTokens: number;
  poolLiveBytes: number;
  poolIdleBytes: number;
  /** copy bandwidth measured right after the run, in the same process (GB/s) */
  copyGBps: number;
  /** decodeTps of every repeat (measure()) */
  decodeRuns?: number[];
  /** kind 'attention': median step ms of each repeat, by prompt length */
  attention?: Record<string, number[]>;
}

function procStatus(): { rss: number; hwm: number } {
  const s = fs.readFileSync('/proc/self/status', 'utf8');
  const g = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(s)![1]) * 1024;
  return { rss: g('VmRSS'), hwm: g('VmHWM') };
}

async function child(a: ChildArgs): Promise<ChildResult> {
  // imports first, measured before anything is loaded
  const { createCpuBackend } = await import('../src/backends/cpu/cpu-backend.ts');
  const { loadModel } = await import('../src/execution/load-model.ts');
  const { Engine } = await import('../src/execution/engine.ts');
  const { TextTokenizer } = await import('../src/artifacts/tokenizer.ts');
  const importsRss = procStatus().rss;
  if (a.kind === 'attention') {
    // the same process decodes at a short and a long context in turn, so a change in the load
    // other jobs put on the machine hits both alike; the difference is attention alone
    const backend = await createCpuBackend();
    const m = await loadModel(backend, a.dir, { maxModelLen: a.prompt + a.gen });
    const engine = new Engine(m.model, m, { maxBatch: 1, tokenBudget: a.chunk, maxModelLen: a.prompt + a.gen, kvTokens: a.prompt + a.gen });
    const medians: Record<string, number[]> = {};
    for (let rep = 0; rep < 3; rep++) {
      for (const p of [a.chunk, a.prompt]) {
        const t: number[] = [];
        for await (const e of engine.generate({ promptIds: Array.from({ length: p }, (_, k) => (k * 7 + rep) % 500 + 1), maxTokens: a.gen, sampling: { temperature: 0 }, ignoreEos: true })) {
          if (e.type === 'token') t.push(performance.now());
        }
        const gaps = t.slice(2).map((x, i) => x - t[i + 1]!).sort((x, y) => x - y);
        (medians[p] ??= []).push(gaps[gaps.length >> 1]!);
      }
    }
    await engine.close();
    await backend.close();
    return {
      importsRss, peakRss: 0, loadedRss: 0, decodeTps: 0, meanTps: 0, steps: [], decodePositions: [0, 0], kvTokens: 0,
      poolLiveBytes: 0, poolIdleBytes: 0, copyGBps: measureCopyBandwidth(), attention: medians,
    };
  }
  if (a.kind === 'tokenizer') {
    const backend = await createCpuBackend();
    const before = procStatus().rss;
    const tok = TextTokenizer.fromDir(a.dir);
    tok.encode('warm up the tokenizer once', { addSpecialTokens: false });
    const after = procStatus();
    await backend.close();
    return {
      importsRss: before, peakRss: after.hwm, loadedRss: after.rss, tokenizerRss: after.rss - before, decodeTps: 0, meanTps: 0,
      steps: [], decodePositions: [0, 0], kvTokens: 0, poolLiveBytes: 0, poolIdleBytes: 0, copyGBps: 0,
    };
  }
  const ctx = a.sweep ? a.sweep.to + 2 : a.prompt + a.gen;
  const backend = await createCpuBackend();
  const m = await loadModel(backend, a.dir, { maxModelLen: ctx });
  const loadedRss = procStatus().rss;
  // the KV pools serve sizes from the plan: every sequence can hold ctx tokens
  const kvTokens = a.batch * Math.ceil(ctx / 16) * 16;
  const engine = new Engine(m.model, m, { maxBatch: a.batch, tokenBudget: a.chunk, maxModelLen: ctx, kvTokens });
  const steps: StepShape[] = [];
  const forward = m.model.forward.bind(m.model);
  m.model.forward = ((batch, kv) => {
    steps.push({
      tokens: batch.tokens.length, rows: batch.rows.length, sampled: batch.logitTokens.length,
      tableBlocks: Math.max(...batch.rows.map((r) => Math.ceil((r.start + r.count) / 16))),
    });
    return forward(batch, kv);
  }) as typeof m.model.forward;
  const V = m.config.vocabSize;
  const promptOf = (n: number, seed: number) => Array.from({ length: n }, (_, k) => (k * 7919 + 13 + seed * 101) % Math.min(V, 5000));
  let decodeTps = 0, meanTps = 0;
  if (a.sweep) {
    for (let p = a.sweep.from; p <= a.sweep.to; p += a.sweep.step) {
      await engine.complete({ promptIds: promptOf(p, p), maxTokens: 2, sampling: { temperature: 0 }, ignoreEos: true });
    }
  } else {
    const times: number[][] = [];
    await Promise.all(Array.from({ length: a.batch }, async (_, r) => {
      const t: number[] = [];
      times.push(t);
      for await (const e of engine.generate({ promptIds: promptOf(a.prompt, r), maxTokens: a.gen, sampling: { temperature: 0 }, ignoreEos: true })) {
        if (e.type === 'token') t.push(performance.now());
      }
    }));
    // decode rate: the median interval between a row's tokens after its first (robust to the
    // scheduling spikes of a shared machine), times the rows decoding together
    const gaps = times.flatMap((t) => t.slice(2).map((x, i) => x - t[i + 1]!)).sort((x, y) => x - y);
    decodeTps = (a.batch * 1000) / gaps[gaps.length >> 1]!;
    const first = Math.max(...times.map((t) => t[0]!)), last = Math.max(...times.map((t) => t[t.length - 1]!));
    meanTps = times.reduce((acc, t) => acc + t.filter((x) => x > first).length, 0) / ((last - first) / 1000);
  }
  const peakRss = procStatus().hwm;
  const stats = backend.memoryStats();
  await engine.close();
  await backend.close();
  // after the peak was read: the copy's buffers must not count
  const copyGBps = a.sweep ? 0 : measureCopyBandwidth();
  return {
    importsRss, peakRss, loadedRss, decodeTps, meanTps, steps, decodePositions: [a.prompt, a.prompt + a.gen - 1], kvTokens,
    poolLiveBytes: stats.liveBytes, poolIdleBytes: stats.idleBytes, copyGBps,
  };
}

/**
 * Runs a case REPEATS times, each in a fresh process. Peak memory is the same every time (same
 * steps); decode speed varies with the load other processes put on a shared machine, so the
 * run with the fastest median step is kept (as a benchmark keeps its minimum time).
 */
function measure(c: Case): ChildResult {
  const runs = Array.from({ length: c.args.sweep ? 1 : REPEATS }, () => runChild({ kind: 'run', dir: path.resolve(ROOT, c.model), ...c.args }));
  const best = runs.reduce((a, b) => (b.decodeTps > a.decodeTps ? b : a));
  return { ...best, peakRss: Math.max(...runs.map((r) => r.peakRss)), decodeRuns: runs.map((r) => r.decodeTps) };
}

function runChild(a: ChildArgs): ChildResult {
  const r = spawnSync(process.execPath, ['--import', 'tsx', SELF, '--child', JSON.stringify(a)], {
    cwd: ROOT, encoding: 'utf8', maxBuffer: 64 * 2 ** 20,
  });
  if (r.status !== 0) throw new Error(`child ${JSON.stringify(a)} failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

// ---- cases -------------------------------------------------------------------------------------

interface Case {
  name: string;
  model: string;
  args: Omit<ChildArgs, 'kind' | 'dir'>;
}

const demo = 'models/demo';
const fx = (n: string) => `test/fixtures/${n}`;
const syn = (n: string) => path.join(MODELS, n);

const CASES: Case[] = [
  { name: 'demo ctx 320 chunk 512', model: demo, args: { prompt: 256, gen: 64, chunk: 512, batch: 1 } },
  { name: 'demo ctx 1088 chunk 512', model: demo, args: { prompt: 1024, gen: 64, chunk: 512, batch: 1 } },
  { name: 'demo ctx 2048 chunk 512', model: demo, args: { prompt: 1984, gen: 64, chunk: 512, batch: 1 } },
  { name: 'demo ctx 2048 chunk 64', model: demo, args: { prompt: 1984, gen: 64, chunk: 64, batch: 1 } },
  { name: 'demo ctx 2048 chunk 256 batch 4', model: demo, args: { prompt: 1984, gen: 64, chunk: 256, batch: 4 } },
  { name: 'demo sweep 1..512 chunk 512', model: demo, args: { prompt: 0, gen: 2, chunk: 512, batch: 1, sweep: { from: 1, to: 512, step: 1 } } },
  { name: 'llama fixture ctx 256', model: fx('llama'), args: { prompt: 192, gen: 64, chunk: 512, batch: 1 } },
  { name: 'layers-12 ctx 256', model: syn('layers-12'), args: { prompt: 192, gen: 64, chunk: 512, batch: 1 } },
  { name: 'layers-24 ctx 256', model: syn('layers-24'), args: { prompt: 192, gen: 64, chunk: 512, batch: 1 } },
  { name: 'gemma2 fixture ctx 256 (sliding 8)', model: fx('gemma2'), args: { prompt: 192, gen: 64, chunk: 64, batch: 1 } },
  { name: 'qwen3_moe fixture ctx 256', model: fx('qwen3_moe'), args: { prompt: 192, gen: 64, chunk: 512, batch: 1 } },
  { name: 'llama-1b ctx 544 chunk 512', model: syn('llama-1b'), args: { prompt: 512, gen: 32, chunk: 512, batch: 1 } },
  { name: 'llama-1b ctx 2080 chunk 512', model: syn('llama-1b'), args: { prompt: 2048, gen: 32, chunk: 512, batch: 1 } },
  { name: 'llama-1b ctx 2080 chunk 128', model: syn('llama-1b'), args: { prompt: 2048, gen: 32, chunk: 128, batch: 1 } },
  { name: 'llama-1b sweep 1..128 chunk 128', model: syn('llama-1b'), args: { prompt: 0, gen: 2, chunk: 128, batch: 1, sweep: { from: 1, to: 128, step: 1 } } },
  { name: 'gemma2-sliding ctx 4128 chunk 256', model: syn('gemma2-sliding'), args: { prompt: 4096, gen: 32, chunk: 256, batch: 1 } },
  { name: 'qwen3-moe ctx 576 chunk 512', model: syn('qwen3-moe'), args: { prompt: 512, gen: 64, chunk: 512, batch: 1 } },
];

interface Row {
  name: string;
  measuredPeak: number;
  predictedPeak: number;
  peakError: number;
  fitTotal: number;
  measuredTps: number;
  predictedTps: number;
  tpsError: number;
  weights: number;
  kv: number;
  transient: number;
  reserve: number;
  child: ChildResult;
}

async function predict(c: Case, r: ChildResult, machine: Machine): Promise<Omit<Row, 'name' | 'child'>> {
  const planner = await FitPlanner.open(path.resolve(ROOT, c.model));
  const ctx = c.args.sweep ? c.args.sweep.to + 2 : c.args.prompt + c.args.gen;
  const plan = await planner.plan(machine, { ctx, batch: c.args.batch, chunk: c.args.chunk });
  const transient = await planner.simulateSteps('cpu', r.steps);
  const predictedPeak = plan.weightsBytes + plan.kvBytes + transient + plan.reserveBytes;
  let predictedTps = 0;
  if (!c.args.sweep) {
    // decode steps run at positions prompt .. prompt + gen - 2 (the first token comes from prefill)
    let seconds = 0, n = 0;
    for (let p = r.decodePositions[0]; p < r.decodePositions[1]; p++, n++) {
      seconds += (await planner.decodeStep(machine, p, c.args.batch, plan.kvDtype)).seconds;
    }
    predictedTps = (n * c.args.batch) / seconds;
  }
  return {
    measuredPeak: r.peakRss, predictedPeak, peakError: predictedPeak / r.peakRss - 1, fitTotal: plan.totalBytes,
    measuredTps: r.decodeTps, predictedTps, tpsError: predictedTps ? predictedTps / r.decodeTps - 1 : 0,
    weights: plan.weightsBytes, kv: plan.kvBytes, transient, reserve: plan.reserveBytes,
  };
}

const mib = (b: number) => (b / 2 ** 20).toFixed(1);
const pct = (x: number) => `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)}%`;

function commit(): string {
  try {
    return execSync('git rev-parse --short HEAD', { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
  } catch {
    return 'unknown';
  }
}

async function main(): Promise<void> {
  if (values.child) {
    process.stdout.write(`${JSON.stringify(await child(JSON.parse(values.child)))}\n`);
    return;
  }
  if (values.make) return make();
  const bw = measureCopyBandwidth();
  const machine = cpuMachine(bw);
  if (values.calibrate) return calibrate(machine);
  const only = values.only?.split(',').map((s) => s.trim());
  const rows: Row[] = [];
  for (const c of CASES) {
    if (only && !only.some((o) => c.name.includes(o))) continue;
    if (!fs.existsSync(path.resolve(ROOT, c.model))) {
      process.stderr.write(`skipping ${c.name}: ${c.model} is missing (run with --make)\n`);
      continue;
    }
    const r = measure(c);
    // decode is predicted with the copy bandwidth measured in the case's own process, right after it
    const p = await predict(c, r, r.copyGBps ? cpuMachine(r.copyGBps) : machine);
    rows.push({ name: c.name, ...p, child: r });
    process.stderr.write(`${c.name}: peak ${mib(r.peakRss)} MiB predicted ${mib(p.predictedPeak)} (${pct(p.peakError)}); ` +
      `decode ${r.decodeTps.toFixed(1)} tok/s predicted ${p.predictedTps.toFixed(1)} (${pct(p.tpsError)})\n`);
  }
  const head = `machine ${machine.description}, copy bandwidth ${bw.toFixed(1)} GB/s; load average ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}; ` +
    `commit ${commit()}; command: node --import tsx bench/fit-accuracy.ts${values.only ? ` --only "${values.only}"` : ''}; ` +
    `decode: best of ${REPEATS} processes' median step`;
  const lines = [
    '| case | measured peak RSS MiB | predicted MiB | error | `fit` total MiB | measured decode tok/s | predicted tok/s | error |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
    ...rows.map((r) => `| ${r.name} | ${mib(r.measuredPeak)} | ${mib(r.predictedPeak)} | ${pct(r.peakError)} | ${mib(r.fitTotal)} | ` +
      (r.measuredTps ? `${r.measuredTps.toFixed(1)} | ${r.predictedTps.toFixed(1)} | ${pct(r.tpsError)} |` : '— | — | — |')),
  ];
  console.log(head);
  console.log(lines.join('\n'));
  if (values.json) fs.writeFileSync(values.json, JSON.stringify({ machine, bandwidthGBps: bw, commit: commit(), rows }, null, 2));
}

// ---- calibration: the measurements behind constants.ts -----------------------------------------

async function calibrate(machine: Machine): Promise<void> {
  // runtime: RSS after imports + backend, and a tokenizer's RSS against its file size
  const toks = [fx('llama'), demo, syn('tokenizer-128k')].filter((d) => fs.existsSync(path.resolve(ROOT, d, 'tokenizer.json')));
  for (const d of toks) {
    const size = fs.statSync(path.resolve(ROOT, d, 'tokenizer.json')).size;
    const rs = [0, 1, 2].map(() => runChild({ kind: 'tokenizer', dir: path.resolve(ROOT, d), prompt: 0, gen: 0, chunk: 1, batch: 1 }));
    console.log(`tokenizer ${d}: file ${size} bytes; runtime RSS ${rs.map((r) => mib(r.importsRss)).join(', ')} MiB; ` +
      `tokenizer RSS ${rs.map((r) => mib(r.tokenizerRss!)).join(', ')} MiB (${rs.map((r) => (r.tokenizerRss! / size).toFixed(2)).join(', ')} x file)`);
  }
  // runtime: peak RSS minus everything the planner models except the runtime itself
  const residuals: number[] = [];
  const timed: { c: Case; r: ChildResult; planner: FitPlanner; bytes: number; weightBytes: number; flops: number }[] = [];
  const only = values.only?.split(',').map((x) => x.trim());
  for (const c of CASES) {
    if (!fs.existsSync(path.resolve(ROOT, c.model))) continue;
    if (only && !only.some((o) => c.name.includes(o))) continue;
    const r = measure(c);
    const planner = await FitPlanner.open(path.resolve(ROOT, c.model));
    const ctx = c.args.sweep ? c.args.sweep.to + 2 : c.args.prompt + c.args.gen;
    const plan = await planner.plan(machine, { ctx, batch: c.args.batch, chunk: c.args.chunk });
    const steps = await planner.simulateSteps('cpu', r.steps);
    const tokenizer = plan.reserve.find((x) => x.name === 'tokenizer')!.bytes;
    const residual = r.peakRss - (plan.weightsBytes + plan.kvBytes + steps + tokenizer);
    residuals.push(residual);
    let bytes = 0;
    if (!c.args.sweep && c.args.batch === 1) {
      const mid = Math.round((r.decodePositions[0] + r.decodePositions[1]) / 2);
      const d = await planner.decodeStep(machine, mid, 1, 'f32');
      bytes = d.weightBytes + d.kvBytes;
      timed.push({ c, r, planner, bytes, weightBytes: d.weightBytes, flops: d.attentionFlops });
    }
    console.log(`${c.name}: peak ${mib(r.peakRss)} MiB, runtime residual ${mib(residual)} MiB (imports ${mib(r.importsRss)} MiB)` +
      (bytes ? `; ${planner.config.numLayers} layers, ${mib(bytes)} MiB read/step, median step ${(1000 / r.decodeTps).toFixed(3)} ms ` +
        `(runs: ${r.decodeRuns!.map((x) => (1000 / x).toFixed(3)).join(', ')}), copy ${r.copyGBps.toFixed(1)} GB/s` : ''));
  }
  residuals.sort((a, b) => a - b);
  console.log(`runtime residual over ${residuals.length} cases: min ${mib(residuals[0]!)} median ${mib(residuals[residuals.length >> 1]!)} max ${mib(residuals[residuals.length - 1]!)} MiB`);
  // per-step and per-layer overhead: models whose decode reads under 8 MiB (time is all overhead)
  const small = timed.filter((t) => t.bytes < 8 * 2 ** 20);
  const ab = leastSquares(small.map((t) => [1, t.planner.config.numLayers]), small.map((t) => 1 / t.r.decodeTps));
  console.log(`overhead: ${(ab[0]! * 1000).toFixed(3)} ms per step + ${(ab[1]! * 1000).toFixed(4)} ms per layer ` +
    `(least squares over ${small.map((t) => `${t.c.name} (${t.planner.config.numLayers} layers)`).join(', ')})`);
  // efficiency: the models whose decode reads over 1 GiB (time is all bandwidth), against the copy
  // bandwidth measured in the same process
  // attention: one model, decode at a short and a long context in turn in one process (the
  // weights read are the same, so the difference in step time is attention), 3 rounds
  let flopRate = 0;
  const heavy = syn('attention-heavy');
  if (fs.existsSync(heavy)) {
    const short = 64, long = 2048, gen = 33;
    const r = runChild({ kind: 'attention', dir: heavy, prompt: long, gen, chunk: short, batch: 1 });
    const planner = await FitPlanner.open(heavy);
    const at = async (p: number) => (await planner.decodeStep(machine, p + (gen >> 1), 1, 'f32')).attentionFlops;
    const dFlops = (await at(long)) - (await at(short));
    const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1]!;
    const dMs = med(r.attention![long]!) - med(r.attention![short]!);
    flopRate = dFlops / (dMs / 1000);
    console.log(`attention: ${(flopRate / 1e9).toFixed(2)} GFLOP/s = ${(flopRate / 1e9 / os.availableParallelism()).toFixed(2)} per core ` +
      `(attention-heavy model, decode at ${short} vs ${long} tokens in one process: step ms ${r.attention![short]!.map((x) => x.toFixed(2)).join(', ')} vs ` +
      `${r.attention![long]!.map((x) => x.toFixed(2)).join(', ')}; ${(dFlops / 1e6).toFixed(1)} MFLOP more per step)`);
  }
  const big = timed.filter((x) => x.bytes > 2 ** 30);
  // efficiency: the models whose decode reads over 1 GiB (time is mostly weights), against the
  // copy bandwidth measured in the same process
  const effs: number[] = [];
  for (const t of big) {
    const over = ab[0]! + ab[1]! * t.planner.config.numLayers;
    const attn = flopRate ? t.flops / flopRate : 0;
    const eff = t.weightBytes / ((1 / t.r.decodeTps - over - attn) * t.r.copyGBps * 1e9);
    effs.push(eff);
    console.log(`efficiency ${eff.toFixed(3)}: ${t.c.name}, ${mib(t.weightBytes)} MiB of weights/step in ${(1000 / t.r.decodeTps).toFixed(1)} ms ` +
      `- ${(over * 1000).toFixed(2)} ms overhead - ${(attn * 1000).toFixed(2)} ms attention, copy ${t.r.copyGBps.toFixed(1)} GB/s`);
  }
  if (effs.length) console.log(`efficiency: mean ${(effs.reduce((a, b) => a + b, 0) / effs.length).toFixed(3)} over ${effs.length} cases`);
  void K;
}

/** Solves min |X b - y| by the normal equations. */
function leastSquares(X: number[][], y: number[]): number[] {
  const n = X[0]!.length;
  const A = Array.from({ length: n }, (_, i) => Array.from({ length: n }, (_, j) => X.reduce((s, r) => s + r[i]! * r[j]!, 0)));
  const b = Array.from({ length: n }, (_, i) => X.reduce((s, r, k) => s + r[i]! * y[k]!, 0));
  for (let i = 0; i < n; i++) {
    let p = i;
    for (let r = i + 1; r < n; r++) if (Math.abs(A[r]![i]!) > Math.abs(A[p]![i]!)) p = r;
    [A[i], A[p]] = [A[p]!, A[i]!];
    [b[i], b[p]] = [b[p]!, b[i]!];
    for (let r = i + 1; r < n; r++) {
      const f = A[r]![i]! / A[i]![i]!;
      for (let c = i; c < n; c++) A[r]![c]! -= f * A[i]![c]!;
      b[r]! -= f * b[i]!;
    }
  }
  const x = new Array<number>(n).fill(0);
  for (let i = n - 1; i >= 0; i--) {
    let s = b[i]!;
    for (let c = i + 1; c < n; c++) s -= A[i]![c]! * x[c]!;
    x[i] = s / A[i]![i]!;
  }
  return x;
}

await main();
