// Prefix cache: time to first token for a request whose long prefix is cold (computed), warm (RAM
// tier: the same prefix ran before in this engine) or restored from the SSD tier (a new engine on
// the same --cache-dir, empty RAM tier: the restart case); and decode tok/s with the cache on vs
// off. Engine-direct (--device cpu by default, or cuda), greedy, the path `llmts serve` takes.
//
// Each request is the shared prefix plus a short suffix of its own (as an agent's next call is
// the same system prompt + tools + history, then something new), max_tokens 1.
//
//   node --import tsx bench/prefix-cache.ts --model models/demo [--lengths 1024,2000,8192]
//        [--repeats 3] [--decode-tokens 128] [--decode-batch 1,8] [--json out.json]
//
// Warm and restored TTFTs are medians of --repeats requests (each with its own suffix; each
// restore in a new engine); cold is a median too for prefixes up to 4096 tokens, one run above.
//
// A length past the model's context runs with --max-model-len raised to fit (timings only; the
// model was not trained that long).

import { parseArgs } from 'node:util';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { execSync } from 'node:child_process';
import os from 'node:os';
import { join } from 'node:path';
import { openBackend, parseDevice } from '../src/execution/devices.ts';
import { loadModel, type LoadedModel } from '../src/execution/load-model.ts';
import { Engine, type EngineOptions } from '../src/execution/engine.ts';
import { modelFingerprint } from '../src/state/fingerprint.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    lengths: { type: 'string', default: '1024,2000,8192' },
    'decode-tokens': { type: 'string', default: '128' },
    'decode-batch': { type: 'string', default: '1,8' },
    repeats: { type: 'string', default: '3' },
    device: { type: 'string', default: 'cpu' },
    json: { type: 'string' },
  },
});
const lengths = values.lengths!.split(',').filter((x) => x.trim() !== '').map(Number);
const decodeTokens = Number(values['decode-tokens']);
const decodeBatches = values['decode-batch']!.split(',').map(Number);
const repeats = Number(values.repeats);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const SUFFIX = 16;

const backend = await openBackend(parseDevice(values.device));
const base = await loadModel(backend, values.model!);
const longest = Math.max(64, ...lengths) + SUFFIX + 8;
const m: LoadedModel = longest > base.maxContext ? await loadModel(backend, values.model!, { maxModelLen: longest }) : base;
if (m !== base) base.model.dispose();
const vocab = Math.min(m.config.vocabSize, 5000);
const ids = (seed: number, n: number) => Array.from({ length: n }, (_, k) => (k * 7919 + seed * 104729 + 13) % vocab);
const fingerprint = modelFingerprint(values.model!);

function engine(extra: EngineOptions = {}): Engine {
  return new Engine(m.model, m, { maxBatch: 8, tokenBudget: 512, maxModelLen: m.maxContext, kvTokens: 2 * longest + 8 * 512, ...extra });
}
const ssdOptions = (dir: string): EngineOptions => ({
  prefixCache: { modelFingerprint: fingerprint, tokenizerFingerprint: m.tokenizer.fingerprint, ssd: { dir, maxBytes: 4 * 2 ** 30 } },
});

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

interface TtftRow { prefix: number; coldMs: number; warmMs: number; restoredMs: number; warmCached: number; restoredCached: number; fileMiB: number }
const rows: TtftRow[] = [];
for (const L of lengths) {
  const prefix = ids(L, L);
  const withSuffix = (k: number) => [...prefix, ...ids(1000 + k, SUFFIX)];
  const dir = mkdtempSync(join(os.tmpdir(), 'llmts-bench-kvc-'));
  try {
    // warm-up (first-touch of the KV pool, kernels), not measured
    const w = engine({ prefixCache: { promptCacheBytes: 0 } });
    await ttft(w, ids(9, 64));
    await w.close();

    const e1 = engine(ssdOptions(dir));
    const cold = [(await ttft(e1, withSuffix(0))).ms];
    const warm: { ms: number; cached: number }[] = [];
    for (let k = 1; k <= repeats; k++) warm.push(await ttft(e1, withSuffix(k)));
    await e1.close(); // writes the prefix to the SSD tier
    const ssd = e1.stats.prefixCache.ssd;
    const fileMiB = ssd && ssd.files > 0 ? ssd.bytes / ssd.files / 2 ** 20 : 0; // one file per suffix, each holding the whole prefix
    const restored: { ms: number; cached: number }[] = [];
    for (let k = 1; k <= repeats; k++) {
      const e2 = engine(ssdOptions(dir)); // a restart: empty RAM tier
      restored.push(await ttft(e2, withSuffix(k)));
      await e2.close();
    }
    if (L <= 4096) {
      for (let k = 1; k < repeats; k++) {
        const e3 = engine({ prefixCache: { promptCacheBytes: 0 } });
        cold.push((await ttft(e3, withSuffix(k))).ms);
        await e3.close();
      }
    }
    const row = {
      prefix: L, coldMs: median(cold), warmMs: median(warm.map((x) => x.ms)), restoredMs: median(restored.map((x) => x.ms)),
      warmCached: Math.min(...warm.map((x) => x.cached)), restoredCached: Math.min(...restored.map((x) => x.cached)), fileMiB,
    };
    rows.push(row);
    console.error(`prefix ${L}: cold ${row.coldMs.toFixed(0)} ms, warm ${row.warmMs.toFixed(1)} ms, restored ${row.restoredMs.toFixed(1)} ms`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** decode tok/s of `batch` concurrent greedy requests (distinct 64-token prompts) */
async function decodeTps(prefixCache: EngineOptions['prefixCache'], batch: number, trial: number): Promise<number> {
  const e = engine({ prefixCache });
  const prompts = Array.from({ length: batch }, (_, k) => ids(100 + k + trial * 50, 64));
  // prefill first (not timed), then time the decode of everyone together
  let started = 0, tokens = 0, t0 = 0;
  await Promise.all(prompts.map(async (p) => {
    for await (const ev of e.generate({ promptIds: p, maxTokens: decodeTokens + 1, sampling: { temperature: 0 }, ignoreEos: true })) {
      if (ev.type !== 'token') continue;
      if (++started === batch) t0 = performance.now(); // every row has its first token
      else if (t0 > 0) tokens++;
    }
  }));
  const tps = tokens / ((performance.now() - t0) / 1000);
  await e.close();
  return tps;
}
// on and off alternate, so load from elsewhere on the machine hits both alike; best of each
const decodeTrials = Math.max(3, repeats + 2);
const decode: { batch: number; onTps: number; offTps: number; trials: number }[] = [];
for (const batch of decodeBatches) {
  let onTps = 0, offTps = 0;
  for (let t = 0; t < decodeTrials; t++) {
    offTps = Math.max(offTps, await decodeTps({ promptCacheBytes: 0 }, batch, t));
    onTps = Math.max(onTps, await decodeTps(undefined, batch, t));
  }
  decode.push({ batch, onTps, offTps, trials: decodeTrials });
}

const cpu = os.cpus()[0]?.model ?? 'unknown cpu';
let commit = 'unknown';
try { commit = execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}
const result = {
  machine: `${cpu}, ${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB`,
  commit, device: backend.name, model: values.model, modelType: m.config.modelType, contextUsed: m.maxContext, modelContext: base.maxContext,
  suffixTokens: SUFFIX, repeats, ttft: rows, decodeTokens, decode,
};
console.log(`machine  ${result.machine}   commit ${commit}   backend ${backend.name}`);
console.log(`model    ${values.model} (${m.config.modelType}; context ${base.maxContext}${m !== base ? `, run at ${m.maxContext} for the longest prefix` : ''})`);
console.log(`TTFT of prefix + ${SUFFIX} new tokens, max_tokens 1 (ms; median of ${repeats}; cold above 4096 tokens: one run):`);
console.log('  prefix    cold     warm (RAM)   restored (SSD)   cached warm/SSD   file');
for (const r of rows) {
  console.log(`  ${String(r.prefix).padStart(6)}  ${r.coldMs.toFixed(0).padStart(7)}  ${r.warmMs.toFixed(1).padStart(9)} (${(r.coldMs / r.warmMs).toFixed(0)}x)` +
    `  ${r.restoredMs.toFixed(1).padStart(9)} (${(r.coldMs / r.restoredMs).toFixed(0)}x)   ${r.warmCached}/${r.restoredCached}   ${r.fileMiB.toFixed(1)} MiB`);
}
console.log(`decode tok/s (${decodeTokens} tokens per row, 64-token prompts, best of ${decodeTrials} alternating on/off):`);
for (const d of decode) console.log(`  batch ${d.batch}: cache on ${d.onTps.toFixed(1)}, off ${d.offTps.toFixed(1)} (on/off ${(d.onTps / d.offTps).toFixed(3)})`);
if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));
m.model.dispose();
await backend.close();
