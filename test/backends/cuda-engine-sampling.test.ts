// Device sampling through the engine on CUDA (Backend.sampleRows after the decode graph's replay;
// pipelined steps taking their ids from the op's token column): seeded non-greedy requests give
// exactly the same tokens and logprobs with the pipeline on and off (the same kernels on the same
// logits), and the host sampler's tokens but where a draw sits within the op's rounding tolerance
// of a boundary (contracts/device-sampling.ts; rare, counted). Grammar rows validate. Reports the
// time per decode step of each mode (host sampling reads every row's logits back). Skipped
// without a usable CUDA.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';

import { type CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import { Engine, type Completion, type EngineOptions } from '../../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import { GrammarCompiler, grammarVocabFrom } from '../../src/sampling/grammar/index.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-engine-sampling: skipping every test: ${SKIP}`);

const LLAMA = resolve(import.meta.dirname, '../fixtures/llama');

let backend: CudaBackend;
before(async () => {
  if (SKIP) return;
  backend = await createCudaBackend();
  await backend.ready?.();
});
after(async () => {
  if (SKIP) return;
  await backend.close();
});

interface Run {
  out: Completion[];
  steps: number;
  pipelinedSteps: number;
  ms: number;
}

/** `reqs` submitted together on a fresh engine (so every mode batches them alike). */
async function run(m: LoadedModel, reqs: EngineRequest[], opts: EngineOptions): Promise<Run> {
  const e = new Engine(m.model, m, { maxModelLen: m.maxContext, maxBatch: 16, ...opts });
  const t0 = performance.now();
  const out = await Promise.all(reqs.map((r) => e.complete(r)));
  const ms = performance.now() - t0;
  const { steps, pipelinedSteps, kvBlocksUsed } = e.stats;
  await e.close(0);
  assert.equal(kvBlocksUsed, 0);
  return { out, steps, pipelinedSteps, ms };
}

/** Requests that agree token for token, and the first position where each other one differs. */
function agreement(a: Completion[], b: Completion[]): { same: number; diverged: string[] } {
  let same = 0;
  const diverged: string[] = [];
  a.forEach((x, k) => {
    const y = b[k]!;
    if (JSON.stringify(x.tokenIds) === JSON.stringify(y.tokenIds)) same++;
    else diverged.push(`request ${k} at token ${x.tokenIds.findIndex((id, j) => id !== y.tokenIds[j])}`);
  });
  return { same, diverged };
}

test('seeded sampled requests on CUDA: device sampling pipelined = unpipelined exactly; host sampling agrees but at boundaries', { skip: SKIP }, async (t) => {
  const m = await loadModel(backend, LLAMA, { maxModelLen: 4096 });
  const cases: { prompt_token_ids: number[] }[] = JSON.parse(readFileSync(join(LLAMA, 'reference.json'), 'utf8')).cases;
  const specs: Partial<EngineRequest>[] = [
    { sampling: { temperature: 0.9 } },
    { sampling: { temperature: 1.2, topK: 20 } },
    { sampling: { temperature: 1, topP: 0.8 } },
    { sampling: { temperature: 1.5, minP: 0.05 } },
    { sampling: { temperature: 1, logitBias: { 223: -100, 270: 4 } } },
    { sampling: { temperature: 1 }, topLogprobs: 3 },
    { sampling: { temperature: 0.8, repetitionPenalty: 1.3, frequencyPenalty: 0.4 }, maxTokens: 12 }, // no step is pipelined while it runs
    { sampling: { temperature: 0 }, topLogprobs: 2 },
    { sampling: { temperature: 0.9 }, topLogprobs: 25, maxTokens: 8 }, // host-sampled (past the device's 20) for 8 tokens
    { sampling: { temperature: 0 } },
  ];
  const reqs: EngineRequest[] = [];
  for (let k = 0; k < 2 * specs.length; k++) {
    const s = specs[k % specs.length]!;
    reqs.push({
      promptIds: cases[k % cases.length]!.prompt_token_ids, maxTokens: 40 + (k % 3) * 8, ignoreEos: true, ...s,
      sampling: { ...s.sampling, seed: 1000 + k },
    });
  }
  await run(m, reqs, {}); // warm-up: kernels, GEMM plans, every graph bucket these batches use
  const host = await run(m, reqs, { deviceSampling: false });
  const device = await run(m, reqs, { deviceSampling: true, pipeline: false });
  const piped = await run(m, reqs, { deviceSampling: true, pipeline: true });
  assert.equal(m.model.graphsOff, undefined, 'decode steps replayed graphs');
  for (const [name, r] of [['host', host], ['device', device], ['device + pipeline', piped]] as const) {
    t.diagnostic(`${name}: ${r.steps} steps (${r.pipelinedSteps} pipelined), ${r.ms.toFixed(1)} ms, ${(r.ms / r.steps).toFixed(3)} ms/step`);
  }
  assert.equal(device.pipelinedSteps, 0);
  assert.ok(piped.pipelinedSteps > piped.steps / 2, `${piped.pipelinedSteps} of ${piped.steps} steps pipelined`);
  // the same op on the same logits: pipelining changes nothing
  assert.deepEqual(piped.out.map((c) => c.tokenIds), device.out.map((c) => c.tokenIds));
  assert.deepEqual(piped.out.map((c) => c.logprobs), device.out.map((c) => c.logprobs));
  // against the host sampler (float64): equal but where a draw sits at a rounding boundary
  const vsHost = agreement(device.out, host.out);
  t.diagnostic(`device vs host sampling: ${vsHost.same}/${reqs.length} requests identical${vsHost.diverged.length ? `; ${vsHost.diverged.join(', ')}` : ''}`);
  assert.ok(vsHost.same >= reqs.length - 1, `device and host sampling diverged: ${vsHost.diverged.join(', ')}`);
  host.out.forEach((h, k) => {
    const d = device.out[k]!;
    if (!h.logprobs || JSON.stringify(h.tokenIds) !== JSON.stringify(d.tokenIds)) return;
    h.logprobs.forEach((lp, j) => assert.ok(Math.abs(lp.logprob - d.logprobs![j]!.logprob) <= 1e-4, `request ${k} token ${j} logprob`));
  });
  for (const c of [...host.out, ...piped.out]) assert.equal(c.finishReason, 'length', c.error);
  assert.ok(new Set(piped.out[0]!.tokenIds).size > 5, 'the sequences are random');
  m.model.dispose();
});

test('grammar rows (JSON schema) sampled on the device on CUDA validate; pipelined = unpipelined', { skip: SKIP }, async () => {
  const m = await loadModel(backend, writeTinyLlama({ maxPositions: 512 }));
  const compiler = new GrammarCompiler(grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds));
  const g = await compiler.compile({
    type: 'json_schema',
    schema: {
      type: 'object', properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer', minimum: 0, maximum: 99 } },
      required: ['name', 'age'], additionalProperties: false,
    },
  });
  const prompt = m.tokenizer.encode('Person:', { addSpecialTokens: false });
  const reqs: EngineRequest[] = [];
  for (let seed = 0; seed < 8; seed++) {
    reqs.push({ promptIds: prompt, maxTokens: 120, sampling: { temperature: 1, seed }, grammar: { createMatcher: () => g.createMatcher() } });
    reqs.push({ promptIds: prompt, maxTokens: 16, ignoreEos: true, sampling: { temperature: 0.9, seed: 50 + seed } });
  }
  await run(m, reqs, {}); // warm-up
  const device = await run(m, reqs, { deviceSampling: true, pipeline: false });
  const piped = await run(m, reqs, { deviceSampling: true, pipeline: true });
  g.release();
  await compiler.close();
  assert.deepEqual(piped.out.map((c) => c.tokenIds), device.out.map((c) => c.tokenIds));
  piped.out.forEach((c, k) => {
    if (k % 2 === 1) return;
    assert.equal(c.finishReason, 'stop', `${c.error ?? ''} ${JSON.stringify(c.text)}`);
    const v = JSON.parse(c.text) as { name: unknown; age: unknown };
    assert.ok(typeof v.name === 'string' && Number.isInteger(v.age), c.text);
  });
  m.model.dispose();
});
