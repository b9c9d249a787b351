// Q8_0 / Q4_0 GGUF weights on the CPU backend, kept quantized (LLMTS_CPU_QUANT_WEIGHTS on: integer
// dot products, native/quant_pack.c) against dequantized to bf16 at load (off), in the same run:
// prefill and decode tok/s through the engine (as bench/cpu-generate.ts), and decode's GB/s of the
// weight bytes each path holds. Each file is a Qwen3-0.6B-shaped model (random weights, 28
// layers, the demo tokenizer) converted by tools/gguf/convert_qwen3.py; both paths load in one
// process and their repeats alternate (the order flips every repeat), after one warm-up each.
// llama.cpp is not run: node-llama-cpp is not among the project's packages.
//
//   python3 bench/make_random_models.py --preset qwen3-0.6b --out /tmp/qb/qwen3-0.6b
//   python3 tools/gguf/convert_qwen3.py /tmp/qb/qwen3-0.6b /tmp/qb/q8_0.gguf --outtype q8_0   (and q4_0)
//   OMP_NUM_THREADS=2 node --import tsx bench/cpu-quant.ts --gguf /tmp/qb/q8_0.gguf --gguf /tmp/qb/q4_0.gguf
//     [--prompt-tokens 512] [--decode-tokens 64] [--repeats 3] [--json out.json]
//
// A shared machine skews wall time: each run also prints the process CPU seconds a token (all its
// threads) and the load average around it.
import os from 'node:os';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { createCpuBackend } from '../src/backends/cpu/cpu-backend.ts';
import type { CpuTensor } from '../src/backends/cpu/cpu-tensor.ts';
import { Engine } from '../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../src/execution/load-model.ts';
import { decodeWeightBytes } from './decode-weights.ts';
import { benchCommit } from './commit.ts';

const { values } = parseArgs({
  options: {
    gguf: { type: 'string', multiple: true },
    'prompt-tokens': { type: 'string', default: '512' },
    'decode-tokens': { type: 'string', default: '64' },
    repeats: { type: 'string', default: '3' },
    json: { type: 'string' },
  },
});
if (!values.gguf?.length) throw new Error('--gguf FILE (one or more) is required; see the header for how to make them');
const promptTokens = Number(values['prompt-tokens']), decodeTokens = Number(values['decode-tokens']), repeats = Number(values.repeats);

interface Path { label: string; quantWeights: boolean; m: LoadedModel; engine: Engine; weightBytes: number; layouts: string }
interface Sample { prefill: number; decode: number; cpuMsPerDecodeToken: number }

async function runOnce(p: Path, prompt: number[]): Promise<Sample> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  let tFirst = 0, cFirst = c0, n = 0;
  for await (const e of p.engine.generate({ promptIds: prompt, maxTokens: decodeTokens, sampling: { temperature: 0 }, ignoreEos: true })) {
    if (e.type === 'token' && n++ === 0) {
      tFirst = performance.now();
      cFirst = process.cpuUsage();
    }
  }
  const t1 = performance.now(), c1 = process.cpuUsage(cFirst);
  return {
    prefill: promptTokens / ((tFirst - t0) / 1000),
    decode: (n - 1) / ((t1 - tFirst) / 1000),
    cpuMsPerDecodeToken: (c1.user + c1.system) / 1000 / (n - 1),
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const results: Record<string, unknown>[] = [];
for (const file of values.gguf) {
  const paths: Path[] = [];
  for (const quantWeights of [true, false]) {
    const backend = await createCpuBackend({ settings: { quantWeights } });
    // the KV cache sized for this prompt alone (the model's 40960-token context would take 9.4 GB a path)
    const m = await loadModel(backend, file, { maxModelLen: promptTokens + decodeTokens + 64 });
    const engine = new Engine(m.model, m, { maxBatch: 1, tokenBudget: 512, maxModelLen: m.maxContext, prefixCache: { promptCacheBytes: 0 } });
    const layouts = [...new Set([m.model.weights.lmHead, m.model.weights.layers[0]!.mlp.gate].map((t) => (t as CpuTensor).layout))].join(',');
    paths.push({ label: quantWeights ? 'kept quantized' : 'dequantized to bf16 at load', quantWeights, m, engine, weightBytes: decodeWeightBytes(m), layouts });
  }
  const vocab = paths[0]!.m.config.vocabSize;
  const prompt = Array.from({ length: promptTokens }, (_, k) => (k * 7919 + 13) % Math.min(vocab, 5000));
  const samples = new Map<Path, Sample[]>(paths.map((p) => [p, []]));
  const load0 = os.loadavg()[0]!;
  for (let r = 0; r <= repeats; r++) {
    const order = r % 2 === 0 ? paths : [...paths].reverse();
    for (const p of order) {
      const s = await runOnce(p, prompt);
      if (r > 0) samples.get(p)!.push(s); // r = 0: warm-up
    }
  }
  const load1 = os.loadavg()[0]!;
  for (const p of paths) {
    const ss = samples.get(p)!;
    const decode = median(ss.map((s) => s.decode));
    results.push({
      file, path: p.label, layouts: p.layouts, quantWeights: p.quantWeights,
      prefillTps: +median(ss.map((s) => s.prefill)).toFixed(1), decodeTps: +decode.toFixed(2),
      prefillRuns: ss.map((s) => +s.prefill.toFixed(1)), decodeRuns: ss.map((s) => +s.decode.toFixed(2)),
      decodeCpuMsPerToken: +median(ss.map((s) => s.cpuMsPerDecodeToken)).toFixed(1),
      decodeWeightBytes: p.weightBytes, decodeWeightGBps: +((decode * p.weightBytes) / 1e9).toFixed(2),
    });
    await p.engine.close();
  }
  const [q, d] = results.slice(-2) as { prefillTps: number; decodeTps: number }[];
  results.push({ file, path: 'kept quantized / dequantized', prefillRatio: +(q!.prefillTps / d!.prefillTps).toFixed(2),
    decodeRatio: +(q!.decodeTps / d!.decodeTps).toFixed(2), loadAverage: [+load0.toFixed(2), +load1.toFixed(2)] });
}
const out = {
  command: `OMP_NUM_THREADS=${process.env.OMP_NUM_THREADS ?? ''} node --import tsx bench/cpu-quant.ts ${values.gguf.map((g) => `--gguf ${g}`).join(' ')} ` +
    `--prompt-tokens ${promptTokens} --decode-tokens ${decodeTokens} --repeats ${repeats}`,
  machine: `${os.cpus()[0]?.model ?? 'unknown cpu'}, ${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB`,
  commit: benchCommit(), date: new Date().toISOString().slice(0, 10), results,
};
console.log(JSON.stringify(out, null, 1));
if (values.json) writeFileSync(values.json, JSON.stringify(out, null, 1));
