// CUDA prefill and decode throughput of one model, through the engine (the path users take).
// Prints tok/s, achieved weight-read bandwidth for decode against the H200's measured copy
// bandwidth (shared/device/README.md: 4,275 GB/s, bytes read + written), and kernel launches per
// decode step (small kernels are launch-bound until decode is fused and graph-captured).
//
//   node --import tsx bench/cuda-generate.ts --model models/demo [--prompt-tokens 512] [--decode-tokens 128] [--json out.json]
import { execSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { dtypeBytes } from '../src/contracts/backend.ts';
import { createCudaBackend } from '../src/backends/cuda/index.ts';
import { Engine } from '../src/execution/engine.ts';
import { loadModel } from '../src/execution/load-model.ts';

const COPY_BANDWIDTH_GBPS = 4275; // measured on the H200 with PyTorch (device-to-device copy)

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    'prompt-tokens': { type: 'string', default: '512' },
    'decode-tokens': { type: 'string', default: '128' },
    repeats: { type: 'string', default: '3' },
    json: { type: 'string' },
  },
});
const promptTokens = Number(values['prompt-tokens']);
const decodeTokens = Number(values['decode-tokens']);
const repeats = Number(values.repeats);

const backend = await createCudaBackend();
const tLoad = performance.now();
const m = await loadModel(backend, values.model!);
await backend.sync();
const loadMs = performance.now() - tLoad;
const cfg = m.config;
const size = (t: { shape: readonly number[]; dtype: keyof typeof dtypeBytes }) =>
  t.shape.reduce((x, y) => x * y, 1) * dtypeBytes[t.dtype];
// bytes every decode step must read: all layer matrices and the lm_head (not the embedding table)
const weightBytes = m.model.weights.layers.reduce((sum, l) =>
  sum + [l.attn.q, l.attn.k, l.attn.v, l.attn.o, l.mlp.gate, l.mlp.up, l.mlp.down].reduce((a, t) => a + size(t), 0), 0) +
  size(m.model.weights.lmHead);

const prompt = Array.from({ length: promptTokens }, (_, k) => (k * 7919 + 13) % Math.min(cfg.vocabSize, 5000));
const engine = new Engine(m.model, m, { maxBatch: 1, tokenBudget: 512 });
const prefill: number[] = [], decode: number[] = [], launches: number[] = [];
for (let r = 0; r <= repeats; r++) {
  const t0 = performance.now();
  let tFirst = 0, l0 = 0, n = 0;
  for await (const e of engine.generate({ promptIds: prompt, maxTokens: decodeTokens, sampling: { temperature: 0 }, ignoreEos: true })) {
    if (e.type === 'token' && n++ === 0) {
      tFirst = performance.now();
      l0 = backend.launches;
    }
  }
  const t1 = performance.now();
  if (r === 0) continue; // warm-up
  prefill.push(promptTokens / ((tFirst - t0) / 1000));
  decode.push((n - 1) / ((t1 - tFirst) / 1000));
  launches.push((backend.launches - l0) / Math.max(1, n - 1));
}
await engine.close();
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
let commit = 'unknown';
try { commit = execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch {}
const decodeTps = median(decode);
const gbps = (decodeTps * weightBytes) / 1e9;
const result = {
  device: backend.describe(), commit, model: values.model, modelType: cfg.modelType, loadMs,
  weightBytesPerDecodeStep: weightBytes, promptTokens, decodeTokens,
  prefillTokPerS: median(prefill), decodeTokPerS: decodeTps, decodeWeightGBps: gbps,
  copyBandwidthGBps: COPY_BANDWIDTH_GBPS, decodeBandwidthRatio: gbps / COPY_BANDWIDTH_GBPS,
  launchesPerDecodeStep: median(launches), msPerDecodeStep: 1000 / decodeTps,
};
console.log(`device   ${result.device}   commit ${commit}`);
console.log(`model    ${values.model} (${cfg.modelType}, ${(weightBytes / 2 ** 20).toFixed(1)} MiB read per decode step), loaded in ${loadMs.toFixed(0)} ms`);
console.log(`prefill  ${result.prefillTokPerS.toFixed(1)} tok/s  (${promptTokens}-token prompt, median of ${repeats})`);
console.log(`decode   ${decodeTps.toFixed(1)} tok/s (${result.msPerDecodeStep.toFixed(2)} ms/step, ` +
  `${result.launchesPerDecodeStep.toFixed(0)} launches/step) = ${gbps.toFixed(2)} GB/s of weights; ` +
  `copy bandwidth ${COPY_BANDWIDTH_GBPS} GB/s -> ratio ${result.decodeBandwidthRatio.toFixed(4)}`);
if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));
await backend.close();
