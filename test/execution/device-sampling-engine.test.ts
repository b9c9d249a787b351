// Device sampling in the engine (Backend.sampleRows; engine.ts launch / deviceRow / launchAhead):
// non-greedy rows take their token and logprobs from the device op, and steps of rows whose next
// draw needs nothing of the token in flight are pipelined. On the reference backend (whose
// sampleRows is exact in float64) seeded outputs must be IDENTICAL whether rows are sampled on the
// host, on the device, or on the device with the pipeline (tokens, text, finish reasons, usage;
// logprobs within 1e-5: the device reports f32); on the CPU backend (native/sampling.c, the same
// float64 maths) host and device sampling must agree the same way. Every test checks the device path really ran
// (sampleRows calls, pipelined steps), so none passes with it silently off.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import { cpuSettingsFrom } from '../../src/backends/cpu/cpu-settings.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import type { Tensor } from '../../src/contracts/backend.ts';
import type { DeviceSampleRow } from '../../src/contracts/device-sampling.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions, type EngineStats, type TextCodec } from '../../src/execution/engine.ts';
import { engineSettingsFrom } from '../../src/execution/engine-settings.ts';
import type { EngineRequest, SequenceEvent } from '../../src/execution/sequence.ts';
import { GrammarCompiler, grammarVocabFrom } from '../../src/sampling/grammar/index.ts';
import { ReplayingReference } from '../helpers/replaying-reference.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { FailingAhead } from '../helpers/failing-ahead.ts';
import { record, tokensOf } from '../helpers/engine-events.ts';

const LLAMA = resolve(import.meta.dirname, '../fixtures/llama');
const cases: { prompt_token_ids: number[] }[] = JSON.parse(readFileSync(join(LLAMA, 'reference.json'), 'utf8')).cases;

/** Counts the sampleRows calls and rows (to prove the device path ran). */
class CountingReference extends ReferenceBackend {
  calls = 0;
  rows = 0;
  override sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    this.calls++;
    this.rows += rows.length;
    return super.sampleRows(logits, rows);
  }
}

/** The same with graph capture (decode steps replayed; sampleRows follows the replay). */
class CountingReplay extends ReplayingReference {
  calls = 0;
  override sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    this.calls++;
    return super.sampleRows(logits, rows);
  }
}

type Mode = 'host' | 'device' | 'pipelined' | 'graphed';
const MODES: Mode[] = ['host', 'device', 'pipelined', 'graphed'];
const OPTIONS: Record<Mode, EngineOptions> = {
  host: { deviceSampling: false }, // greedy rows still pipeline here
  device: { deviceSampling: true, pipeline: false },
  pipelined: { deviceSampling: true, pipeline: true },
  graphed: { deviceSampling: true, pipeline: true },
};

interface Run<T> {
  out: T;
  stats: EngineStats;
  sampleCalls: number;
}

/**
 * Runs `work` on a fresh engine per mode (the llama fixture on a reference backend; the graphed
 * mode replays decode graphs), checks every KV block came back, and returns each mode's result.
 */
async function inEveryMode<T>(opts: EngineOptions, work: (e: Engine, m: LoadedModel) => Promise<T>,
  codecOf: (m: LoadedModel) => TextCodec = (m) => m, dir = LLAMA): Promise<Record<Mode, Run<T>>> {
  const runs = {} as Record<Mode, Run<T>>;
  for (const mode of MODES) {
    const backend = mode === 'graphed' ? new CountingReplay() : new CountingReference();
    const m = await loadModel(backend, dir, { maxModelLen: 4096 });
    const e = new Engine(m.model, codecOf(m), { maxModelLen: m.maxContext, ...opts, ...OPTIONS[mode] });
    assert.equal(e.deviceSampling, mode !== 'host');
    const out = await work(e, m);
    const stats = e.stats;
    await e.close(0);
    assert.equal(stats.kvBlocksUsed, 0, `${mode}: every KV block returned`);
    assert.equal(stats.running + stats.waiting, 0);
    if (mode === 'graphed') assert.ok((backend as CountingReplay).replays > 0, 'graphs were replayed');
    runs[mode] = { out, stats, sampleCalls: backend.calls };
  }
  assert.equal(runs.host.sampleCalls, 0, 'host sampling never calls sampleRows');
  for (const mode of ['device', 'pipelined', 'graphed'] as const) assert.ok(runs[mode].sampleCalls > 0, `${mode}: sampleRows ran`);
  assert.equal(runs.device.stats.pipelinedSteps, 0, 'pipeline off pipelines nothing');
  return runs;
}


/**
 * Asserts two runs' events are the same: everything exactly, logprobs' token ids exactly and
 * their values within 1e-5 (the host reports float64, the device float32).
 */
function assertSameEvents(got: SequenceEvent[][], want: SequenceEvent[][], what: string): void {
  assert.equal(got.length, want.length);
  let logprobs = 0;
  got.forEach((events, k) => {
    const strip = (evs: SequenceEvent[]) => evs.map((ev) => (ev.type === 'token' ? { ...ev, logprobs: undefined } : ev));
    assert.deepEqual(strip(events), strip(want[k]!), `${what}: request ${k}`);
    events.forEach((ev, j) => {
      const w = want[k]![j]!;
      if (ev.type !== 'token' || w.type !== 'token') return;
      assert.equal(ev.logprobs === undefined, w.logprobs === undefined, `${what}: request ${k} token ${j} logprobs`);
      if (!ev.logprobs || !w.logprobs) return;
      logprobs++;
      assert.equal(ev.logprobs.token_id, w.logprobs.token_id);
      assert.deepEqual(ev.logprobs.top.map((t) => t.token_id), w.logprobs.top.map((t) => t.token_id), `${what}: request ${k} token ${j} top ids`);
      const pairs = [[ev.logprobs.logprob, w.logprobs.logprob], ...ev.logprobs.top.map((t, i) => [t.logprob, w.logprobs!.top[i]!.logprob])];
      for (const [a, b] of pairs) assert.ok(Math.abs(a! - b!) <= 1e-5, `${what}: request ${k} token ${j}: logprob ${a} vs ${b}`);
    });
  });
  if (want.some((evs) => evs.some((ev) => ev.type === 'token' && ev.logprobs))) assert.ok(logprobs > 0);
}

/** Every mode's events equal the host-sampled run's. */
function assertAllSame(runs: Record<Mode, Run<SequenceEvent[][]>>): void {
  for (const mode of ['device', 'pipelined', 'graphed'] as const) assertSameEvents(runs[mode].out, runs.host.out, `${mode} vs host`);
}

// A token the llama fixture says often (its eos for the requests below that honour eos).
const EOS = 270;
const codecWithEos = (m: LoadedModel): TextCodec => ({ eosIds: [EOS], decode: (ids) => m.decode(ids) });

/** What the staggered mix asks for: every sampling feature, and rows the device may not take. */
const SPECS: [string, Partial<EngineRequest>, { pipelinable: boolean }][] = [
  ['greedy', { sampling: { temperature: 0 } }, { pipelinable: true }],
  ['temperature', { sampling: { temperature: 0.9, seed: 1 } }, { pipelinable: true }],
  ['top-k', { sampling: { temperature: 1.2, topK: 20, seed: 2 } }, { pipelinable: true }],
  ['top-p', { sampling: { temperature: 1, topP: 0.8, seed: 3 } }, { pipelinable: true }],
  ['min-p', { sampling: { temperature: 1.5, minP: 0.05, seed: 4 } }, { pipelinable: true }],
  ['every truncation', { sampling: { temperature: 0.7, topK: 50, topP: 0.9, minP: 0.02, seed: 5 } }, { pipelinable: true }],
  ['penalties', { sampling: { temperature: 0.8, repetitionPenalty: 1.3, frequencyPenalty: 0.4, presencePenalty: 0.2, seed: 6 } }, { pipelinable: false }],
  ['greedy, repetition penalty', { sampling: { temperature: 0, repetitionPenalty: 1.5 } }, { pipelinable: false }],
  ['logit bias', { sampling: { temperature: 1, seed: 7, logitBias: { 223: -100, 270: 4, 309: 2 } } }, { pipelinable: true }],
  ['logprobs', { sampling: { temperature: 1, seed: 8 }, topLogprobs: 3 }, { pipelinable: true }],
  ['greedy, logprobs', { sampling: { temperature: 0 }, topLogprobs: 0 }, { pipelinable: true }],
  ['logprobs past the device limit (host)', { sampling: { temperature: 0.9, seed: 9 }, topLogprobs: 25 }, { pipelinable: false }],
  ['stop strings', { sampling: { temperature: 0.9, seed: 10 }, stop: ['self', 'the '] }, { pipelinable: true }],
  ['eos', { sampling: { temperature: 1, seed: 11 }, ignoreEos: false }, { pipelinable: true }],
];

function mixRequest(k: number): { req: EngineRequest; name: string; pipelinable: boolean } {
  const [name, spec, { pipelinable }] = SPECS[k % SPECS.length]!;
  const sampling = spec.sampling?.seed === undefined ? spec.sampling : { ...spec.sampling, seed: spec.sampling.seed + 100 * k };
  return {
    name, pipelinable,
    req: { promptIds: cases[k % cases.length]!.prompt_token_ids, maxTokens: 6 + ((k * 11) % 35), ignoreEos: true, ...spec, sampling },
  };
}

test('staggered seeded requests mixing every sampling feature: identical on the host, the device, pipelined, graph-replayed', async () => {
  // per non-pipelinable request: pipelined steps counted at its first event and at its finish
  const during = new Map<Mode, [string, number, number][]>();
  let mode = 0;
  const runs = await inEveryMode({ maxBatch: 8, tokenBudget: 40 }, async (e) => {
    const spans: [string, number, number][] = [];
    during.set(MODES[mode++]!, spans);
    const jobs: Promise<SequenceEvent[]>[] = [];
    let produced = 0;
    for (let k = 0; k < 2 * SPECS.length; k++) {
      const { req, name, pipelinable } = mixRequest(k);
      let first = -1;
      jobs.push(record(e, req, undefined, (ev) => {
        if (ev.type === 'token') produced++;
        if (first < 0) first = e.stats.pipelinedSteps;
        if (ev.type === 'finish' && !pipelinable) spans.push([`${k} ${name}`, first, e.stats.pipelinedSteps]);
      }));
      const target = produced + 4;
      while (produced < target && e.stats.running + e.stats.waiting > 0) await new Promise((r) => setTimeout(r, 1));
    }
    return Promise.all(jobs);
  }, codecWithEos);
  assertAllSame(runs);
  // from a non-pipelinable row's first token to its last, no step was pipelined (penalties, a
  // host-sampled row)
  for (const [m, spans] of during) {
    assert.equal(spans.length, 2 * SPECS.filter(([, , p]) => !p.pipelinable).length);
    for (const [what, first, last] of spans) assert.equal(last, first, `${m}: request ${what}`);
  }
  const out = runs.host.out;
  // the mix is what it claims: several finish reasons, logprobs, random sequences
  const reasons = new Set(out.map((evs) => (evs.at(-1) as { finishReason: string }).finishReason));
  assert.deepEqual([...reasons].sort(), ['length', 'stop']);
  out.forEach((evs, k) => {
    const fin = evs.at(-1)!;
    assert.ok(fin.type === 'finish' && fin.completionTokens === evs.length - 1 && !fin.error, `request ${k}: ${JSON.stringify(fin)}`);
  });
  const stopped = out.filter((_, k) => SPECS[k % SPECS.length]![0] === 'stop strings');
  assert.ok(stopped.some((evs) => (evs.at(-1) as { finishReason: string }).finishReason === 'stop'), 'a stop string ended a request');
  assert.ok(runs.pipelined.stats.pipelinedSteps > 0 && runs.graphed.stats.pipelinedSteps > 0);
});

test('seeded temperature rows alone: their steps are pipelined on the device, never on the host; same tokens and logprobs', async () => {
  const requests: EngineRequest[] = [
    { sampling: { temperature: 0.9, seed: 21 } },
    { sampling: { temperature: 1.1, topK: 30, seed: 22 } },
    { sampling: { temperature: 0.8, topP: 0.85, seed: 23 } },
    { sampling: { temperature: 1.3, minP: 0.1, seed: 24 } },
    { sampling: { temperature: 1, seed: 25, logitBias: { 223: -5 } } },
    { sampling: { temperature: 1, seed: 26 }, topLogprobs: 5 },
  ].map((r, k) => ({ promptIds: cases[k % cases.length]!.prompt_token_ids, maxTokens: 24 + 3 * k, ignoreEos: true, ...r }));
  const runs = await inEveryMode({ maxBatch: 8 }, async (e) => {
    // alone first (the pipeline runs from the first decode to the last), then all together
    const alone: SequenceEvent[][] = [];
    for (const r of requests.slice(0, 2)) alone.push(await record(e, r));
    const together = await Promise.all(requests.map((r) => record(e, r)));
    return [...alone, ...together];
  });
  assertAllSame(runs);
  assert.equal(runs.host.stats.pipelinedSteps, 0, 'host-sampled rows are never pipelined');
  for (const mode of ['pipelined', 'graphed'] as const) {
    // nearly every decode step: only each batch's first decode (behind its prefill) is not
    const { steps, pipelinedSteps } = runs[mode].stats;
    assert.ok(pipelinedSteps > steps / 2, `${mode}: ${pipelinedSteps} of ${steps} steps pipelined`);
  }
  assert.ok(new Set(tokensOf(runs.host.out[0]!)).size > 5, 'the sequences are random');
});

test('cancellation while device-sampled steps are pipelined: the row ends at a step boundary, KV back to baseline', async () => {
  const sampled = (k: number, maxTokens: number): EngineRequest =>
    ({ promptIds: cases[k]!.prompt_token_ids, maxTokens, ignoreEos: true, sampling: { temperature: 0.9, topP: 0.95, seed: 40 + k } });
  const runs = await inEveryMode({ maxBatch: 4 }, async (e) => {
    const baseline = e.stats.kvBlocksUsed;
    // aborted from its own token callback (deterministic: after its 5th token) while a sibling runs
    const ac = new AbortController();
    let seen = 0;
    const victim = record(e, sampled(0, 200), ac.signal, (ev) => ev.type === 'token' && ++seen === 5 && ac.abort());
    const sibling = record(e, sampled(1, 24));
    const [v, s] = await Promise.all([victim, sibling]);
    // a stream left early
    let read = 0;
    for await (const ev of e.generate(sampled(2, 500))) if (ev.type === 'token' && ++read === 3) break;
    await new Promise((r) => setTimeout(r, 20));
    // aborted from outside, at whatever step the pipeline is in
    const timed = new AbortController();
    const late = record(e, sampled(2, 3000), timed.signal);
    setTimeout(() => timed.abort(), 20);
    const l = await late;
    const lateFin = l.at(-1)!;
    assert.ok(lateFin.type === 'finish' && lateFin.finishReason === 'cancelled' && lateFin.completionTokens === l.length - 1);
    assert.equal(e.stats.running, 0);
    assert.equal(e.stats.kvBlocksUsed, baseline);
    return [v, s];
  });
  assertAllSame(runs);
  const fin = runs.pipelined.out[0]!.at(-1)!;
  assert.ok(fin.type === 'finish' && fin.finishReason === 'cancelled' && fin.completionTokens === 5, JSON.stringify(fin));
  assert.ok(runs.pipelined.stats.pipelinedSteps > 0);
});

test('a pipelined sampled step that fails: its rows recompute with the uniforms it drew, same tokens', async () => {
  const dir = writeTinyLlama();
  const requests: EngineRequest[] = [[1, 2, 3, 4, 5], [9, 8, 7], [40, 41, 42, 43]]
    .map((p, k) => ({ promptIds: p, maxTokens: 24, ignoreEos: true, sampling: { temperature: 1, topK: 40, seed: 60 + k } }));
  const run = async (backend: ReferenceBackend, opts: EngineOptions) => {
    const m = await loadModel(backend, dir);
    const e = new Engine(m.model, m, { maxBatch: 4, ...opts });
    const out = await Promise.all(requests.map((r) => e.complete(r)));
    const stats = e.stats;
    await e.close(0);
    return { out, stats };
  };
  const clean = await run(new CountingReference(), { deviceSampling: false });
  for (const failAt of [3, 6]) {
    const failing = new FailingAhead(failAt);
    const faulted = await run(failing, {});
    assert.ok(failing.gathers >= failAt && faulted.stats.pipelinedSteps > 0 && failing.calls > 0);
    assert.deepEqual(faulted.out, clean.out);
    for (const c of faulted.out) assert.equal(c.finishReason, 'length');
    assert.equal(faulted.stats.kvBlocksUsed, 0);
  }
});

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    age: { type: 'integer', minimum: 0, maximum: 99 },
    tags: { type: 'array', items: { enum: ['x', 'y z'] }, maxItems: 2 },
  },
  required: ['name', 'age', 'tags'],
  additionalProperties: false,
};

function validPerson(text: string): boolean {
  let v: any;
  try {
    v = JSON.parse(text);
  } catch {
    return false;
  }
  return v !== null && typeof v === 'object' && Object.keys(v).join(',') === 'name,age,tags' && typeof v.name === 'string' &&
    [...v.name].length <= 6 && Number.isInteger(v.age) && v.age >= 0 && v.age <= 99 && Array.isArray(v.tags) &&
    v.tags.length <= 2 && v.tags.every((t: unknown) => t === 'x' || t === 'y z');
}

test('grammar rows (JSON schema) sampled on the device validate, beside pipelinable rows; same output as the host', async () => {
  const dir = writeTinyLlama({ maxPositions: 512 });
  let compiler: GrammarCompiler | undefined;
  const runs = await inEveryMode({ maxBatch: 8 }, async (e, m) => {
    compiler ??= new GrammarCompiler(grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds));
    const g = await compiler.compile({ type: 'json_schema', schema: PERSON });
    const prompt = m.tokenizer.encode('Person:', { addSpecialTokens: false });
    const jobs: Promise<SequenceEvent[]>[] = [];
    for (let seed = 0; seed < 6; seed++) {
      jobs.push(record(e, {
        promptIds: prompt, maxTokens: 150, sampling: { temperature: 1, seed }, topLogprobs: seed % 3 === 0 ? 2 : undefined,
        grammar: { createMatcher: () => g.createMatcher({ jumpForward: seed % 2 === 0 }) },
      }));
      jobs.push(record(e, { promptIds: prompt, maxTokens: 10 + seed, ignoreEos: true, sampling: { temperature: 0.9, seed: 70 + seed } }));
    }
    const out = await Promise.all(jobs);
    g.release();
    return out;
  }, undefined, dir);
  await compiler?.close();
  assertAllSame(runs);
  runs.pipelined.out.forEach((evs, k) => {
    if (k % 2 === 1) return;
    const fin = evs.at(-1)!;
    const text = evs.map((ev) => ev.text).join('');
    assert.ok(fin.type === 'finish' && fin.finishReason === 'stop', `grammar row ${k}: ${JSON.stringify(fin)} ${JSON.stringify(text)}`);
    assert.ok(validPerson(text), `grammar row ${k}: ${JSON.stringify(text)}`);
  });
});

test('deviceSampling: on by default with sampleRows; off by option (over the environment), by LLMTS_DEVICE_SAMPLING=off, and without the op', async () => {
  assert.equal(engineSettingsFrom({ LLMTS_DEVICE_SAMPLING: 'off' }).deviceSampling, false);
  assert.equal(engineSettingsFrom({ LLMTS_DEVICE_SAMPLING: 'off' }, { deviceSampling: true }).deviceSampling, true, 'the option wins');
  assert.throws(() => engineSettingsFrom({ LLMTS_DEVICE_SAMPLING: 'no' }), /LLMTS_DEVICE_SAMPLING must be "on" or "off", got "no"/);
  const m = await loadModel(new ReferenceBackend(), writeTinyLlama());
  const plain = new Engine(m.model, m), optedOut = new Engine(m.model, m, { deviceSampling: false });
  assert.deepEqual([plain.deviceSampling, optedOut.deviceSampling], [true, false]);
  assert.equal(optedOut.settings.deviceSampling, false);
  for (const x of [plain, optedOut]) await x.close(0);
  const noOp = new (class extends ReferenceBackend {})();
  Object.defineProperty(noOp, 'sampleRows', { value: undefined });
  const m2 = await loadModel(noOp, writeTinyLlama());
  const e = new Engine(m2.model, m2);
  assert.equal(e.deviceSampling, false);
  const out = await e.complete({ promptIds: [1, 2, 3], maxTokens: 6, ignoreEos: true, sampling: { temperature: 1, seed: 3 } });
  assert.equal(out.completionTokens, 6);
  assert.equal(e.stats.pipelinedSteps, 0);
  await e.close(0);
});

/** The CPU backend, counting its sampleRows calls (native/sampling.c). */
class CountingCpu extends CpuBackend {
  calls = 0;
  override sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    this.calls++;
    return super.sampleRows(logits, rows);
  }
}

test('CPU backend: deviceSampling off and on give identical seeded outputs; on, temperature rows are pipelined', async () => {
  const requests: EngineRequest[] = [
    { sampling: { temperature: 0.9, seed: 121 } },
    { sampling: { temperature: 1.1, topK: 30, seed: 122 } },
    { sampling: { temperature: 0.8, topP: 0.85, seed: 123 } },
    { sampling: { temperature: 1.3, minP: 0.1, seed: 124 } },
    { sampling: { temperature: 1, seed: 125, logitBias: { 223: -5, 270: 2 } } },
    { sampling: { temperature: 1, seed: 126 }, topLogprobs: 5 },
    { sampling: { temperature: 0.7, topK: 50, topP: 0.9, minP: 0.02, seed: 127 }, topLogprobs: 0 },
    { sampling: { temperature: 0 } },
  ].map((r, k) => ({ promptIds: cases[k % cases.length]!.prompt_token_ids, maxTokens: 20 + 3 * k, ignoreEos: true, ...r }));
  const penalised: EngineRequest = {
    promptIds: cases[0]!.prompt_token_ids, maxTokens: 16, ignoreEos: true,
    sampling: { temperature: 0.8, repetitionPenalty: 1.3, frequencyPenalty: 0.4, presencePenalty: 0.2, seed: 128 },
  };
  const run = async (off: boolean) => {
    const settings = cpuSettingsFrom(process.env);
    const backend = new CountingCpu(loadNativeLib(settings), settings);
    try {
      const m = await loadModel(backend, LLAMA, { maxModelLen: 4096 });
      const e = new Engine(m.model, m, { maxModelLen: m.maxContext, maxBatch: 8, deviceSampling: !off });
      assert.equal(e.deviceSampling, !off);
      // alone first (pipelined from its first decode to its last), then all together
      const alone = await record(e, requests[0]!);
      const pipelinedAlone = e.stats.pipelinedSteps;
      const together = await Promise.all([...requests, penalised].map((r) => record(e, r)));
      const stats = e.stats;
      await e.close(0);
      assert.equal(stats.kvBlocksUsed, 0);
      return { out: [alone, ...together], stats, pipelinedAlone, calls: backend.calls };
    } finally {
      await backend.close();
    }
  };
  const host = await run(true);
  const device = await run(false);
  assertSameEvents(device.out, host.out, 'CPU device vs host');
  assert.equal(host.calls, 0, 'host sampling never calls sampleRows');
  assert.equal(host.pipelinedAlone, 0, 'a host-sampled temperature row is never pipelined');
  assert.ok(device.calls > 0, 'the CPU sampleRows ran');
  assert.ok(device.pipelinedAlone > 10, `a seeded temperature row alone: ${device.pipelinedAlone} steps pipelined`);
  assert.ok(device.stats.pipelinedSteps > device.pipelinedAlone);
  assert.ok(new Set(tokensOf(host.out[0]!)).size > 5, 'the sequences are random');
});
