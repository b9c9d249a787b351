// CPU prefill and decode throughput of one model, through the engine (the path users take).
// Prints tok/s, achieved weight-read bandwidth for decode, and its ratio to this machine's
// copy bandwidth measured in the same run.
//
//   node --import tsx bench/cpu-generate.ts --model models/demo [--prompt-tokens 512] [--decode-tokens 128]
//     [--kv-dtype f32|bf16|int8|fp8] [--json out.json]

import { parseArgs } from 'node:util';
import { writeFileSync } from 'node:fs';
import os from 'node:os';
import { createCpuBackend } from '../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../src/execution/load-model.ts';
import { Engine } from '../src/execution/engine.ts';
import type { DType } from '../src/contracts/backend.ts';
import { decodeWeightBytes } from './decode-weights.ts';
import { benchCommit } from './commit.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    'prompt-tokens': { type: 'string', default: '512' },
    'decode-tokens': { type: 'string', default: '128' },
    repeats: { type: 'string', default: '3' },
    'kv-dtype': { type: 'string', default: 'f32' },
    json: { type: 'string' },
  },
});
const promptTokens = Number(values['prompt-tokens']);
const decodeTokens = Number(values['decode-tokens']);
const repeats = Number(values.repeats);

/** Copy bandwidth (bytes read + written per second) of a 256 MiB buffer, best of 5. */
function copyBandwidth(): number {
  const n = 256 * 1024 * 1024;
  const a = Buffer.alloc(n, 1), b = Buffer.alloc(n);
  let best = Infinity;
  for (let k = 0; k < 5; k++) {
    const t = performance.now();
    a.copy(b);
    best = Math.min(best, performance.now() - t);
  }
  return (2 * n) / (best / 1000);
}

const backend = await createCpuBackend();
const m = await loadModel(backend, values.model!);
const cfg = m.config;
const weightBytes = decodeWeightBytes(m);

const prompt = Array.from({ length: promptTokens }, (_, k) => (k * 7919 + 13) % Math.min(cfg.vocabSize, 5000));
// prefix cache off: every repeat uses the same prompt, and prefill must be measured cold
const kvDtype = values['kv-dtype'] as DType;
const engine = new Engine(m.model, m, { maxBatch: 1, tokenBudget: 512, prefixCache: { promptCacheBytes: 0 }, kvDtype });
const prefill: number[] = [], decode: number[] = [];
for (let r = 0; r <= repeats; r++) {
  const t0 = performance.now();
  let tFirst = 0;
  let n = 0;
  for await (const e of engine.generate({ promptIds: prompt, maxTokens: decodeTokens, sampling: { temperature: 0 }, ignoreEos: true })) {
    if (e.type === 'token' && n++ === 0) tFirst = performance.now();
  }
  const t1 = performance.now();
  if (r === 0) continue; // warm-up
  prefill.push(promptTokens / ((tFirst - t0) / 1000));
  decode.push((n - 1) / ((t1 - tFirst) / 1000));
}
await engine.close();
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const bw = copyBandwidth();
const decodeTps = median(decode);
const achieved = decodeTps * weightBytes;
const cpu = os.cpus()[0]?.model ?? 'unknown cpu';
const commit = benchCommit();
const result = {
  machine: `${cpu}, ${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB`,
  commit, model: values.model, modelType: cfg.modelType,
  weightBytesPerDecodeStep: weightBytes, promptTokens, decodeTokens, kvDtype,
  prefillTokPerS: median(prefill), decodeTokPerS: decodeTps,
  decodeWeightGBps: achieved / 1e9, copyBandwidthGBps: bw / 1e9,
  decodeBandwidthRatio: achieved / bw,
};
console.log(`machine  ${result.machine}   commit ${commit}`);
console.log(`model    ${values.model} (${cfg.modelType}, ${(weightBytes / 2 ** 20).toFixed(1)} MiB read per decode step; KV cache ${kvDtype})`);
console.log(`prefill  ${result.prefillTokPerS.toFixed(1)} tok/s  (${promptTokens}-token prompt, median of ${repeats})`);
console.log(`decode   ${decodeTps.toFixed(1)} tok/s  = ${result.decodeWeightGBps.toFixed(2)} GB/s of weights; copy bandwidth ${result.copyBandwidthGBps.toFixed(2)} GB/s -> ratio ${result.decodeBandwidthRatio.toFixed(3)}`);
if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));
await backend.close();
