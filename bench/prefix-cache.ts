// Prefix cache, engine-direct (the path `llmts serve` takes), greedy:
//   ttft    time to first token of a long prefix + 16 new tokens, max_tokens 1: cold (computed),
//           warm (RAM tier: the prefix ran before in this engine) and restored (a new engine on the
//           same --cache-dir, empty RAM tier: the restart case), per prefix length
//   decode  decode tok/s with the prefix cache on (RAM tier) vs off, B=1 and B=8 (goal: no cost)
//   load    sustained load: many distinct requests queued at once into a small KV pool, so the
//           engine is never idle and the RAM tier evicts prefixes that were never spilled; output
//           tok/s with the cache off, RAM tier only, and RAM + SSD tier (evicted prefixes are read
//           at eviction and written in the background), and what the SSD tier kept or lost
//
// CPU (this repo's 2-core VM):
//   node --import tsx bench/prefix-cache.ts --random-model small --sections ttft --out bench-out/prefix-cache-small
//   node --import tsx bench/prefix-cache.ts --model models/demo --sections decode,load --out bench-out/prefix-cache-demo
// GPU (repository root, after `source .device/env.sh`; writes the model once to /tmp):
//   node --import tsx bench/prefix-cache.ts --device cuda --random-model llama8b --budget-s 270 --out "$OUT/prefix-cache"
//
// Options: --model DIR (default models/demo) | --random-model small|llama8b [--model DIR]
//   small: a 2-layer llama (hidden 256, 4 heads of 64, 2 KV heads, bf16) with a 40,960-token
//     context and the demo tokenizer, written to DIR or a temp dir (removed after): long prefixes
//     on the CPU in reasonable time. llama8b: bench/make_random_llama.py's Llama-3.1-8B shapes
//     (random bf16 weights) in DIR (default /tmp/llmts-llama8b-random), made when missing
//     (--random-model-args passes e.g. --tiny to it, to test this path off the GPU machine).
//   --device cpu|cuda, --sections ttft,decode,load, --lengths (default 1024,8192,32768),
//   --repeats 3, --decode-tokens 128, --decode-batch 1,8, --decode-trials 5, --load-requests 24,
//   --load-prompt 256, --load-tokens 64, --load-batch 4, --load-trials 3,
//   --budget-s S: everything, model making included, within S seconds: a cell predicted not to
//     fit is skipped (said in the output), and at S + 20 s the bench writes what it has and exits.
//   --out DIR: DIR/prefix-cache.json (rewritten after every measurement) and DIR/summary.txt;
//   --json FILE: the JSON there too.
//
// Cold TTFT is the median of --repeats for prefixes up to 4,096 tokens, one run above. A cold run
// predicted (quadratically from the last measured length) to take more than the budget leaves is
// not run: the prefix's SSD file is then written directly (zero KV content; timings only), and
// warm = a second request in the engine that restored it. A length past the model's context runs
// with the context raised to fit (timings only). Restores read files the OS has just cached.

import { parseArgs } from 'node:util';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import { execFileSync, execSync } from 'node:child_process';
import os from 'node:os';
import { join } from 'node:path';
import { openBackend, parseDevice } from '../src/execution/devices.ts';
import { loadModel, type LoadedModel } from '../src/execution/load-model.ts';
import { Engine, type EngineOptions } from '../src/execution/engine.ts';
import { modelFingerprint } from '../src/state/fingerprint.ts';
import { SsdTier } from '../src/state/ssd-tier.ts';
import { hashTokens, kvBlockBytes, type KvScheme } from '../src/state/block-hash.ts';
import { kvGroupsOf } from '../src/state/kv-cache.ts';
import { benchCommit } from './commit.ts';

const started = performance.now();
const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    'random-model': { type: 'string' },
    'random-model-args': { type: 'string', default: '' },
    device: { type: 'string', default: 'cpu' },
    sections: { type: 'string', default: 'ttft,decode,load' },
    lengths: { type: 'string', default: '1024,8192,32768' },
    repeats: { type: 'string', default: '3' },
    'decode-tokens': { type: 'string', default: '128' },
    'decode-batch': { type: 'string', default: '1,8' },
    'decode-trials': { type: 'string', default: '5' },
    'load-requests': { type: 'string', default: '24' },
    'load-prompt': { type: 'string', default: '256' },
    'load-tokens': { type: 'string', default: '64' },
    'load-batch': { type: 'string', default: '4' },
    'load-trials': { type: 'string', default: '3' },
    'budget-s': { type: 'string' },
    out: { type: 'string' },
    json: { type: 'string' },
  },
});
const list = (s: string) => s.split(',').map((x) => x.trim()).filter((x) => x !== '');
const sections = new Set(list(values.sections!));
const lengths = list(values.lengths!).map(Number);
const repeats = Number(values.repeats);
const decodeTokens = Number(values['decode-tokens']);
const decodeBatches = list(values['decode-batch']!).map(Number);
const decodeTrials = Number(values['decode-trials']);
const load = {
  requests: Number(values['load-requests']), prompt: Number(values['load-prompt']), tokens: Number(values['load-tokens']),
  batch: Number(values['load-batch']), trials: Number(values['load-trials']),
};
const budgetMs = values['budget-s'] !== undefined ? Number(values['budget-s']) * 1000 : Infinity;
const left = () => budgetMs - (performance.now() - started);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const SUFFIX = 16;
const BS = 16;
const outDir = values.out;
if (outDir) mkdirSync(outDir, { recursive: true });
const log = (line: string) => process.stderr.write(`[${((performance.now() - started) / 1000).toFixed(0).padStart(4)} s] ${line}\n`);

// ---- the model -------------------------------------------------------------------------------

let modelDir = values.model;
let tempModel: string | undefined;
const random = values['random-model'];
if (random === 'small') {
  if (!modelDir) modelDir = tempModel = mkdtempSync(join(os.tmpdir(), 'llmts-bench-small-'));
  if (!existsSync(join(modelDir, 'config.json'))) writeSmallModel(modelDir);
} else if (random === 'llama8b') {
  modelDir ??= '/tmp/llmts-llama8b-random';
  if (!existsSync(join(modelDir, 'config.json')) || !existsSync(join(modelDir, 'model.safetensors.index.json'))) {
    log(`making ${modelDir} (bench/make_random_llama.py)`);
    execFileSync('python3', ['bench/make_random_llama.py', '--out', modelDir, '--tokenizer', 'models/demo/tokenizer.json', ...list(values['random-model-args']!.replace(/ /g, ','))],
      { stdio: ['ignore', 'inherit', 'inherit'], timeout: Number.isFinite(left()) ? Math.max(1000, Math.floor(left())) : undefined });
  }
} else if (random !== undefined) throw new Error(`--random-model must be small or llama8b, got ${random}`);
modelDir ??= 'models/demo';

/** A small random llama with a long context (bf16, demo tokenizer): long prefixes on the CPU in reasonable time. */
function writeSmallModel(dir: string): void {
  mkdirSync(dir, { recursive: true });
  const D = 256, L = 2, H = 4, Hk = 2, hd = 64, I = 768, V = 8192;
  let s = 0x9e3779b9;
  const bf16 = (n: number, fill?: number) => {
    const out = new Uint16Array(n), f = new Float32Array(1), u = new Uint32Array(f.buffer);
    for (let k = 0; k < n; k++) {
      if (fill === undefined) {
        s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
        f[0] = ((s / 2 ** 32) * 2 - 1) * 0.05;
      } else f[0] = fill;
      out[k] = u[0] >>> 16;
    }
    return out;
  };
  const tensors: [string, number[], Uint16Array][] = [['model.embed_tokens.weight', [V, D], bf16(V * D)]];
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    tensors.push(
      [`${p}input_layernorm.weight`, [D], bf16(D, 1)], [`${p}post_attention_layernorm.weight`, [D], bf16(D, 1)],
      [`${p}self_attn.q_proj.weight`, [H * hd, D], bf16(H * hd * D)], [`${p}self_attn.k_proj.weight`, [Hk * hd, D], bf16(Hk * hd * D)],
      [`${p}self_attn.v_proj.weight`, [Hk * hd, D], bf16(Hk * hd * D)], [`${p}self_attn.o_proj.weight`, [D, H * hd], bf16(D * H * hd)],
      [`${p}mlp.gate_proj.weight`, [I, D], bf16(I * D)], [`${p}mlp.up_proj.weight`, [I, D], bf16(I * D)], [`${p}mlp.down_proj.weight`, [D, I], bf16(D * I)],
    );
  }
  tensors.push(['model.norm.weight', [D], bf16(D, 1)]);
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const [name, shape, data] of tensors) {
    header[name] = { dtype: 'BF16', shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(join(dir, 'model.safetensors'), Buffer.concat([len, Buffer.from(json), ...tensors.map(([, , d]) => Buffer.from(d.buffer))]));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: V, hidden_size: D, intermediate_size: I,
    num_hidden_layers: L, num_attention_heads: H, num_key_value_heads: Hk, head_dim: hd, max_position_embeddings: 40960,
    rms_norm_eps: 1e-6, rope_theta: 1000000, hidden_act: 'silu', tie_word_embeddings: true, bos_token_id: null, eos_token_id: 2,
    torch_dtype: 'bfloat16',
  }, null, 2));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join('models/demo', f), join(dir, f));
}

const backend = await openBackend(parseDevice(values.device));
const base = await loadModel(backend, modelDir);
const longest = Math.max(64, load.prompt + load.tokens, ...(sections.has('ttft') ? lengths : [])) + SUFFIX + 8;
const m: LoadedModel = longest > base.maxContext ? await loadModel(backend, modelDir, { maxModelLen: longest }) : base;
if (m !== base) base.model.dispose();
const cfg = m.config;
const vocab = Math.min(cfg.vocabSize, 5000);
const ids = (seed: number, n: number) => Array.from({ length: n }, (_, k) => (k * 7919 + seed * 104729 + 13) % vocab);
const fingerprint = modelFingerprint(modelDir);
const scheme: KvScheme = { dtype: backend.activationDtype, blockSize: BS, numLayers: cfg.numLayers, numKvHeads: cfg.numKvHeads, headDim: cfg.headDim };
const kvBytesPerToken = kvBlockBytes(scheme) / BS;
let ssdCap = 4 * 2 ** 30;
try {
  const fs = statfsSync(os.tmpdir());
  ssdCap = Math.min(Math.max(ssdCap, 3 * kvBytesPerToken * longest), (fs.bavail * fs.bsize) / 2);
} catch { /* keep 4 GiB */ }

function engine(extra: EngineOptions = {}): Engine {
  return new Engine(m.model, m, { maxBatch: 8, tokenBudget: 512, maxModelLen: m.maxContext, kvTokens: 2 * longest + 8 * 512, ...extra });
}
const ssdOptions = (dir: string): EngineOptions['prefixCache'] => ({
  modelFingerprint: fingerprint, tokenizerFingerprint: m.tokenizer.fingerprint, ssd: { dir, maxBytes: ssdCap },
});
const OFF = { promptCacheBytes: 0 };

// ---- results, saved as they come ---------------------------------------------------------------

const commit = benchCommit();
let gpu: string | undefined;
if (backend.name === 'cuda') try { gpu = execSync('nvidia-smi --query-gpu=name,memory.total --format=csv,noheader', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}

interface TtftCell {
  prefix: number; coldMs?: number; coldRuns: number; coldPredictedMs?: number; synthetic: boolean;
  warmMs?: number; restoredMs?: number; warmCached?: number; restoredCached?: number; fileMiB?: number; notes: string[];
}
interface LoadRow { mode: 'off' | 'ram' | 'ssd'; tps: number; wallMs: number; evictions: number; captures?: number; dropped?: number; writes?: number; restorable?: number }
const result = {
  machine: `${os.cpus()[0]?.model ?? 'unknown cpu'}, ${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB${gpu ? `; ${gpu}` : ''}`,
  loadAverageStart: os.loadavg().map((x) => +x.toFixed(2)),
  loadAverageEnd: [] as number[],
  commit, device: backend.name, model: modelDir, randomModel: random ?? null, modelType: cfg.modelType,
  layers: cfg.numLayers, kvBytesPerToken, contextUsed: m.maxContext, modelContext: base.maxContext, budgetS: Number.isFinite(budgetMs) ? budgetMs / 1000 : null,
  suffixTokens: SUFFIX, repeats,
  decode: [] as { batch: number; onTps: number; offTps: number; trials: number }[], decodeTokens,
  ttft: [] as TtftCell[],
  load: { ...load, kvTokens: (load.batch + 2) * (load.prompt + load.tokens), rows: [] as LoadRow[], trialsRun: [] as LoadRow[] },
  skipped: [] as string[],
  stoppedByBudget: false,
  elapsedS: 0,
};
function save(): void {
  result.elapsedS = +((performance.now() - started) / 1000).toFixed(1);
  result.loadAverageEnd = os.loadavg().map((x) => +x.toFixed(2));
  const text = JSON.stringify(result, null, 2);
  if (outDir) writeFileSync(join(outDir, 'prefix-cache.json'), text);
  if (values.json) writeFileSync(values.json, text);
}
function skip(what: string): void {
  result.skipped.push(what);
  log(`skipped: ${what}`);
  save();
}
const tempDirs = new Set<string>();
const tempDir = () => {
  const d = mkdtempSync(join(os.tmpdir(), 'llmts-bench-kvc-'));
  tempDirs.add(d);
  return d;
};
const removeDir = (d: string) => {
  rmSync(d, { recursive: true, force: true });
  tempDirs.delete(d);
};
if (Number.isFinite(budgetMs)) {
  setTimeout(() => {
    result.stoppedByBudget = true;
    log('budget spent: writing what there is and exiting');
    save();
    summary();
    for (const d of tempDirs) rmSync(d, { recursive: true, force: true });
    if (tempModel) rmSync(tempModel, { recursive: true, force: true });
    process.exit(0);
  }, Math.max(0, left()) + 20_000).unref();
}
save();

/** submit -> first token, in ms; and how many prompt tokens came from the cache */
async function ttft(e: Engine, promptIds: number[]): Promise<{ ms: number; cached: number }> {
  const t0 = performance.now();
  let first = 0, cached = 0;
  for await (const ev of e.generate({ promptIds, maxTokens: 1, sampling: { temperature: 0 }, ignoreEos: true })) {
    if (ev.type === 'token' && first === 0) first = performance.now();
    if (ev.type === 'finish') cached = ev.cachedTokens;
  }
  return { ms: first - t0, cached };
}

// warm-up (kernels, first touch of memory), not measured
{
  const w = engine({ prefixCache: OFF });
  await ttft(w, ids(9, 64));
  await ttft(w, ids(10, 600)); // a full 512-token chunk and a partial one
  await ttft(w, ids(11, SUFFIX)); // the new tokens of warm and restored requests
  await Promise.all([1, 2].map((k) => w.complete({ promptIds: ids(12 + k, 32), maxTokens: 4, sampling: { temperature: 0 }, ignoreEos: true })));
  await w.close();
}
log(`model ${modelDir} (${cfg.modelType}, ${cfg.numLayers} layers, ${kvBytesPerToken} KV bytes/token) on ${backend.name}`);

// ---- TTFT: cold / warm / restored ----------------------------------------------------------------

/** Writes the prefix's SSD file directly (zero KV content), as an engine's spill would. */
async function writeSyntheticFile(dir: string, prefix: number[]): Promise<void> {
  const groups = kvGroupsOf(cfg.layers.map((l) => l.window));
  const tier = new SsdTier({ dir, maxBytes: ssdCap, model: fingerprint, tokenizer: m.tokenizer.fingerprint, kv: scheme, groups });
  const perLayer = kvBlockBytes(scheme) / scheme.numLayers;
  const zero = groups.map((g) => new Uint8Array(perLayer * g.layers.length));
  tier.offer(prefix, hashTokens(tier.namespace, prefix, BS));
  await tier.spill({
    readPrefix: async (h) => ({ blocks: h.length, groups: zero.map((z) => ({ from: 0, blocks: Array.from({ length: h.length }, () => z) })) }),
  });
  if (tier.stats.files !== 1) throw new Error('the synthetic prefix file was not written');
}

// what the later sections need of a budget (the TTFT cells adapt to the rest)
const laterReserveMs = (sections.has('decode') ? 45_000 : 0) + (sections.has('load') ? 35_000 : 0);
if (sections.has('ttft')) {
  let lastCold: { L: number; ms: number } | undefined;
  let restoreMsPerByte = 2e-6; // 0.5 GB/s until measured
  for (const L of lengths) {
    const cell: TtftCell = { prefix: L, coldRuns: 0, synthetic: false, notes: [] };
    const prefix = ids(L, L);
    const withSuffix = (k: number) => [...prefix, ...ids(1000 + k, SUFFIX)];
    const fileBytes = L * kvBytesPerToken;
    const restoreEstMs = 1000 + fileBytes * restoreMsPerByte;
    if (left() - laterReserveMs < 3 * restoreEstMs) {
      skip(`TTFT ${L}: not enough budget left`);
      continue;
    }
    result.ttft.push(cell);
    const dir = tempDir();
    try {
      const predicted = lastCold ? lastCold.ms * (L / lastCold.L) ** 2 : undefined;
      let restoredEngine: Engine | undefined;
      if (predicted === undefined || predicted + (repeats + 1) * restoreEstMs < left() - laterReserveMs) {
        const e1 = engine({ prefixCache: ssdOptions(dir) });
        const cold = await ttft(e1, withSuffix(0));
        cell.coldMs = cold.ms;
        cell.coldRuns = 1;
        lastCold = { L, ms: cold.ms };
        log(`TTFT ${L}: cold ${cold.ms.toFixed(0)} ms`);
        await e1.flushPrefixCache(); // the prefix is on disk before the warm runs (no spill beside them)
        const warm: { ms: number; cached: number }[] = [];
        for (let k = 1; k <= repeats; k++) warm.push(await ttft(e1, withSuffix(k)));
        cell.warmMs = median(warm.map((x) => x.ms));
        cell.warmCached = Math.min(...warm.map((x) => x.cached));
        await e1.close();
      } else {
        cell.synthetic = true;
        cell.coldPredictedMs = Math.round(predicted);
        cell.notes.push(`cold not run: predicted ${(predicted / 1000).toFixed(0)} s from ${lastCold!.L} tokens, more than the budget leaves; prefix file written directly`);
        log(`TTFT ${L}: ${cell.notes.at(-1)}`);
        await writeSyntheticFile(dir, prefix);
      }
      const ssd = new SsdTier({ dir, maxBytes: ssdCap, model: fingerprint, tokenizer: m.tokenizer.fingerprint, kv: scheme, groups: kvGroupsOf(cfg.layers.map((l) => l.window)) }).stats;
      cell.fileMiB = ssd.files > 0 ? +(ssd.bytes / ssd.files / 2 ** 20).toFixed(1) : 0;
      save();
      const restored: { ms: number; cached: number }[] = [];
      for (let k = 1; k <= repeats; k++) {
        if (k > 1 && left() - laterReserveMs < restoreEstMs) {
          cell.notes.push(`restored: ${k - 1} of ${repeats} runs (budget)`);
          break;
        }
        const e2 = engine({ prefixCache: ssdOptions(dir) }); // a restart: empty RAM tier
        const r = await ttft(e2, withSuffix(k));
        restored.push(r);
        restoreMsPerByte = Math.max(1e-9, r.ms / Math.max(1, fileBytes));
        if (cell.synthetic && (k === repeats || left() - laterReserveMs < 2 * restoreEstMs)) restoredEngine = e2;
        else await e2.close();
        if (restoredEngine) break;
      }
      cell.restoredMs = median(restored.map((x) => x.ms));
      cell.restoredCached = Math.min(...restored.map((x) => x.cached));
      if (restoredEngine) {
        // warm = the RAM tier of the engine that restored the prefix
        const warm: { ms: number; cached: number }[] = [];
        for (let k = 1; k <= repeats; k++) warm.push(await ttft(restoredEngine, withSuffix(100 + k)));
        cell.warmMs = median(warm.map((x) => x.ms));
        cell.warmCached = Math.min(...warm.map((x) => x.cached));
        await restoredEngine.close();
      }
      if (L <= 4096 && cell.coldMs !== undefined) {
        const colds = [cell.coldMs];
        for (let k = 1; k < repeats && left() - laterReserveMs > 4 * cell.coldMs; k++) {
          const e3 = engine({ prefixCache: OFF });
          colds.push((await ttft(e3, withSuffix(k))).ms);
          await e3.close();
        }
        cell.coldMs = median(colds);
        cell.coldRuns = colds.length;
      }
      log(`TTFT ${L}: cold ${cell.coldMs?.toFixed(0) ?? '-'} ms, warm ${cell.warmMs?.toFixed(1)} ms, restored ${cell.restoredMs?.toFixed(1)} ms (cached ${cell.warmCached}/${cell.restoredCached}, file ${cell.fileMiB} MiB)`);
      save();
    } finally {
      removeDir(dir);
    }
  }
}

// ---- decode tok/s, cache on vs off -------------------------------------------------------------

/** decode tok/s of `batch` concurrent greedy requests (distinct 64-token prompts) */
async function decodeTps(prefixCache: EngineOptions['prefixCache'], batch: number, trial: number): Promise<number> {
  const e = engine({ prefixCache });
  const prompts = Array.from({ length: batch }, (_, k) => ids(100 + k + trial * 50, 64));
  let firsts = 0, tokens = 0, t0 = 0;
  await Promise.all(prompts.map(async (p) => {
    for await (const ev of e.generate({ promptIds: p, maxTokens: decodeTokens + 1, sampling: { temperature: 0 }, ignoreEos: true })) {
      if (ev.type !== 'token') continue;
      if (++firsts === batch) t0 = performance.now(); // every row has its first token
      else if (t0 > 0) tokens++;
    }
  }));
  const tps = tokens / ((performance.now() - t0) / 1000);
  await e.close();
  return tps;
}
if (sections.has('decode')) {
  // the load section keeps its share of a budget
  const until = performance.now() + left() - (sections.has('load') ? 35_000 : 0);
  for (const batch of decodeBatches) {
    let onTps = 0, offTps = 0, trials = 0, trialMs = 0;
    // on and off alternate, so load from elsewhere on the machine hits both alike; best of each
    for (let t = 0; t < decodeTrials; t++) {
      if (trials > 0 && performance.now() + trialMs > until) break;
      const t0 = performance.now();
      offTps = Math.max(offTps, await decodeTps(OFF, batch, t));
      onTps = Math.max(onTps, await decodeTps(undefined, batch, t));
      trialMs = performance.now() - t0;
      trials++;
    }
    if (trials < decodeTrials) skip(`decode B=${batch}: ${decodeTrials - trials} of ${decodeTrials} trials (budget)`);
    result.decode.push({ batch, onTps, offTps, trials });
    log(`decode B=${batch}: cache on ${onTps.toFixed(1)} tok/s, off ${offTps.toFixed(1)} (best of ${trials})`);
    save();
  }
}

// ---- sustained load ------------------------------------------------------------------------------

async function loadRun(mode: LoadRow['mode'], trial: number): Promise<LoadRow> {
  const dir = mode === 'ssd' ? tempDir() : undefined;
  const kvTokens = (load.batch + 2) * (load.prompt + load.tokens);
  const e = new Engine(m.model, m, {
    maxBatch: load.batch, tokenBudget: 512, maxModelLen: m.maxContext, kvTokens,
    prefixCache: mode === 'off' ? OFF : mode === 'ram' ? undefined : ssdOptions(dir!),
  });
  const prompts = Array.from({ length: load.requests }, (_, k) => ids(5000 + trial * 1000 + k, load.prompt));
  let tokens = 0;
  const t0 = performance.now();
  await Promise.all(prompts.map(async (p) => {
    for await (const ev of e.generate({ promptIds: p, maxTokens: load.tokens, sampling: { temperature: 0 }, ignoreEos: true })) if (ev.type === 'token') tokens++;
  }));
  const wallMs = performance.now() - t0;
  const s = e.stats.prefixCache;
  const row: LoadRow = { mode, tps: tokens / (wallMs / 1000), wallMs, evictions: s.ramEvictions };
  if (s.ssd) Object.assign(row, { captures: s.ssd.captures, dropped: s.ssd.dropped });
  await e.close(); // the idle spill writes what the RAM tier still holds
  if (dir) {
    // how many of the prompts a restarted engine restores
    const e2 = engine({ prefixCache: ssdOptions(dir) });
    row.writes = e2.stats.prefixCache.ssd?.files;
    let restorable = 0;
    for (const p of prompts) if ((await ttft(e2, p)).cached > 0) restorable++;
    row.restorable = restorable;
    await e2.close();
    removeDir(dir);
  }
  return row;
}
if (sections.has('load')) {
  const best = new Map<LoadRow['mode'], LoadRow>();
  let trialMs = 0;
  for (let t = 0; t < load.trials; t++) {
    if (t > 0 && left() < trialMs + 5_000) {
      skip(`load: ${load.trials - t} of ${load.trials} trials (budget)`);
      break;
    }
    const t0 = performance.now();
    const modes = ['off', 'ram', 'ssd'] as const;
    for (let j = 0; j < modes.length; j++) {
      const mode = modes[(j + t) % modes.length]; // the order rotates: a drift from elsewhere hits each mode alike
      const row = await loadRun(mode, t);
      log(`load ${mode}: ${row.tps.toFixed(1)} tok/s${row.captures !== undefined ? `, captured ${row.captures}, dropped ${row.dropped}, files ${row.writes}, restorable ${row.restorable}/${load.requests}` : ''}`);
      if (!best.has(mode) || row.tps > best.get(mode)!.tps) best.set(mode, row);
      result.load.trialsRun.push(row);
      result.load.rows = modes.filter((x) => best.has(x)).map((x) => best.get(x)!);
      save();
    }
    trialMs = performance.now() - t0;
  }
}

// ---- report ------------------------------------------------------------------------------------

function summary(): void {
  const lines: string[] = [];
  lines.push(`machine  ${result.machine}   commit ${commit}   backend ${backend.name}   load average ${result.loadAverageStart.join(' ')} -> ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
  lines.push(`model    ${modelDir} (${cfg.modelType}, ${cfg.numLayers} layers; context ${base.maxContext}${m !== base ? `, run at ${m.maxContext}` : ''}; KV ${kvBytesPerToken} bytes/token)`);
  if (result.decode.length > 0) {
    lines.push(`decode tok/s (${decodeTokens} tokens per row, 64-token prompts, best of alternating on/off trials):`);
    for (const d of result.decode) lines.push(`  batch ${d.batch}: cache on ${d.onTps.toFixed(1)}, off ${d.offTps.toFixed(1)} (on/off ${(d.onTps / d.offTps).toFixed(3)}; ${d.trials} trials)`);
  }
  if (result.ttft.length > 0) {
    lines.push(`TTFT of prefix + ${SUFFIX} new tokens, max_tokens 1 (ms; median of ${repeats}; cold above 4096 tokens: one run):`);
    lines.push('  prefix     cold       warm (RAM)      restored (SSD)   cached warm/SSD   file');
    const f = (x: number | undefined, d: number) => (x === undefined ? '-' : x.toFixed(d));
    const ratio = (c: number | undefined, x: number | undefined) => (c && x ? ` (${(c / x).toFixed(0)}x)` : '');
    for (const r of result.ttft) {
      const cold = r.coldMs !== undefined ? f(r.coldMs, 0) : r.coldPredictedMs !== undefined ? `~${(r.coldPredictedMs / 1000).toFixed(0)} s?` : '-';
      lines.push(`  ${String(r.prefix).padStart(6)}  ${cold.padStart(8)}  ${f(r.warmMs, 1).padStart(9)}${ratio(r.coldMs, r.warmMs).padEnd(7)}` +
        `  ${f(r.restoredMs, 1).padStart(9)}${ratio(r.coldMs, r.restoredMs).padEnd(7)}  ${r.warmCached ?? '-'}/${r.restoredCached ?? '-'}   ${r.fileMiB ?? '-'} MiB${r.synthetic ? '  (file written directly)' : ''}`);
    }
  }
  if (result.load.rows.length > 0) {
    const l = result.load;
    lines.push(`sustained load: ${l.requests} distinct ${l.prompt}-token prompts x ${l.tokens} tokens, queued at once, batch ${l.batch}, KV pool ${l.kvTokens} tokens (best of ${l.trialsRun.length / 3} rotating trials; median in brackets):`);
    const off = l.rows.find((r) => r.mode === 'off')?.tps;
    for (const r of l.rows) {
      const med = median(l.trialsRun.filter((x) => x.mode === r.mode).map((x) => x.tps));
      lines.push(`  ${r.mode.padEnd(4)} ${r.tps.toFixed(1).padStart(8)} tok/s [${med.toFixed(1)}]${off ? ` (${(r.tps / off).toFixed(3)} of off)` : ''}, RAM evictions ${r.evictions}` +
        (r.captures !== undefined ? `; SSD: captured at eviction ${r.captures}, dropped ${r.dropped}, files ${r.writes}, restorable after restart ${r.restorable}/${l.requests}` : ''));
    }
  }
  if (result.skipped.length > 0) lines.push(`skipped: ${result.skipped.join('; ')}`);
  for (const r of result.ttft) for (const n of r.notes) lines.push(`note (${r.prefix}): ${n}`);
  const text = lines.join('\n');
  console.log(text);
  if (outDir) writeFileSync(join(outDir, 'summary.txt'), `${text}\n`);
}
save();
summary();
m.model.dispose();
await backend.close();
if (tempModel) rmSync(tempModel, { recursive: true, force: true });
