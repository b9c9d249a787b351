// The EAGLE-3 head of the demo model (models/demo-eagle3) against PyTorch, and the target's
// hidden-state option against transformers' output_hidden_states. The reference is
// models/demo-eagle3/eagle3_reference.json (tools/demo/eagle3_reference.py): the demo's hidden
// states for a short prompt at the head's fused layers, the head's logits over the prompt's context
// pairs, and a chain of draft steps from its end.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { hasFusedOps, type Backend, type Tensor } from '../../src/contracts/backend.ts';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { loadEagle3Dir } from '../../src/artifacts/eagle3.ts';
import { Eagle3Head, type Eagle3Hidden, type Eagle3PendingStep } from '../../src/models/eagle3.ts';
import { KvCache, type StepRow } from '../../src/state/kv-cache.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const DEMO = join(ROOT, 'models/demo');
const HEAD = join(ROOT, 'models/demo-eagle3');
const TOLERANCE = 0.05;

interface Reference {
  prompt_token_ids: number[];
  layers: number[];
  hidden_states: Record<string, number[][]>;
  context: StepRecord[];
  chain: StepRecord[];
}
const ref = JSON.parse(readFileSync(join(HEAD, 'eagle3_reference.json'), 'utf8')) as Reference;
const ids = ref.prompt_token_ids, n = ids.length;

function targetKv(backend: Backend, m: LoadedModel): KvCache {
  const c = m.config;
  return new KvCache(backend, c.layers.map((l) => l.window), { numKvHeads: c.numKvHeads, headDim: c.headDim, blockSize: 16 }, () => 16);
}

function headKv(backend: Backend, head: Eagle3Head): KvCache {
  const c = head.config.layer;
  return new KvCache(backend, Eagle3Head.layerWindows, { numKvHeads: c.numKvHeads, headDim: c.headDim, blockSize: 16 }, () => 4);
}

/** Largest |ours - ref| over a [positions, hidden] block, relative to the block's largest |ref|. */
function relativeDiff(ours: Float32Array, want: number[][], rows: number[]): number {
  const D = want[0]!.length;
  let diff = 0, scale = 0;
  rows.forEach((r, i) => {
    for (let d = 0; d < D; d++) {
      diff = Math.max(diff, Math.abs(ours[i * D + d]! - want[r]![d]!));
      scale = Math.max(scale, Math.abs(want[r]![d]!));
    }
  });
  return diff / scale;
}

/** A draft-vocabulary logits row as a StepRecord over target ids: argmax, its logprob, the top 5. */
function record(head: Eagle3Head, logits: Float32Array, row: number): StepRecord {
  const Vd = head.config.draftVocabSize;
  const x = logits.subarray(row * Vd, (row + 1) * Vd);
  let max = -Infinity;
  for (const v of x) max = Math.max(max, v);
  let sum = 0;
  for (const v of x) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  const order = Array.from({ length: Vd }, (_, d) => d).sort((a, b) => x[b]! - x[a]!).slice(0, 5);
  const top = order.map((d) => ({ token_id: head.draftToTarget[d]!, logprob: x[d]! - lse }));
  return { token_id: top[0]!.token_id, logprob: top[0]!.logprob, top };
}

/**
 * The head over the prompt's context pairs (hidden state at i, token i + 1) at positions 0..n-2,
 * then a chain of draft steps, each fed the previous step's argmax and output.
 */
async function runHead(head: Eagle3Head, backend: Backend, hidden: readonly [Tensor, Tensor, Tensor]): Promise<{ context: StepRecord[]; chain: StepRecord[] }> {
  const kv = headKv(backend, head);
  const seq = kv.newSequence();
  kv.grow(seq, 0, n - 1 + ref.chain.length);
  const rows: StepRow[] = [{ seq, start: 0, count: n - 1 }];
  const ctx = head.launch({
    tokens: Int32Array.from(ids.slice(1)), rows, logitTokens: Array.from({ length: n - 1 }, (_, i) => i),
    hidden: { kind: 'target', states: hidden, index: Array.from({ length: n - 1 }, (_, i) => i) },
  }, kv);
  const logits = (await ctx.result).logits;
  const context = Array.from({ length: n - 1 }, (_, i) => record(head, logits, i));
  const chain = [context[n - 2]!];
  let prev: Eagle3PendingStep = ctx;
  let from: Eagle3Hidden = { kind: 'draft', state: ctx.hidden, index: [n - 2] };
  for (let j = 1; j < ref.chain.length; j++) {
    const step: Eagle3PendingStep = head.launch({
      tokens: Int32Array.of(chain[j - 1]!.token_id), rows: [{ seq, start: n - 2 + j, count: 1 }], logitTokens: [0], hidden: from,
    }, kv);
    chain.push(record(head, (await step.result).logits, 0));
    prev.release();
    prev = step;
    from = { kind: 'draft', state: step.hidden };
  }
  prev.release();
  kv.dispose();
  return { context, chain };
}

function assertClose(ours: { context: StepRecord[]; chain: StepRecord[] }, t: { diagnostic(m: string): void }): void {
  let worst = 0;
  ours.context.forEach((rec, i) => {
    const r = compareToReference([rec], [ref.context[i]!], TOLERANCE);
    worst = Math.max(worst, r.maxLogprobDiff);
    assert.ok(r.ok, `context pair ${i}: ${r.problem}`);
  });
  const c = compareToReference(ours.chain, ref.chain, TOLERANCE);
  assert.ok(c.ok, `chain: ${c.problem}`);
  t.diagnostic(`max |Δ logprob|: context ${worst.toExponential(2)}, chain ${c.maxLogprobDiff.toExponential(2)} over ${c.matched} steps`);
}

/** The reference backend without its fused ops: the decoder's plain (unfused) graph. */
function plainReference(): Backend {
  return Object.assign(new ReferenceBackend(), { loadConcat: undefined, rowView: undefined, addRmsnorm: undefined, gluPacked: undefined, ropeQkvWriteKv: undefined });
}

// The fused graph (pending residual adds) and the plain one on the reference backend; the CPU
// backend has no fused ops and runs the plain graph. Its default bf16 dot products round x to
// bf16 (a relative 2^-9 per product): with them the states agree to that rounding, without them
// to f32 rounding.
const VARIANTS = [
  { name: 'reference backend, plain ops', make: async () => plainReference(), fused: false, tolerance: 1e-4 },
  { name: 'reference backend', make: async (): Promise<Backend> => new ReferenceBackend(), fused: true, tolerance: 1e-4 },
  { name: 'cpu backend, f32 dot products', make: () => createCpuBackend({ settings: { bf16Dot: false } }), fused: false, tolerance: 1e-4 },
  { name: 'cpu backend', make: () => createCpuBackend(), fused: false, tolerance: 5e-3 },
];

for (const { name, make, fused, tolerance } of VARIANTS) {
  test(`${name}: the hidden-state option returns transformers' output_hidden_states, alone, chunked and batched`, async (t) => {
    const backend = await make();
    try {
      assert.equal(hasFusedOps(backend), fused);
      const m = await loadModel(backend, DEMO, { onProgress: () => {} });
      const layers = ref.layers;
      const kv = targetKv(backend, m);
      const all = Array.from({ length: n }, (_, i) => i);
      // alone: the whole prompt in one step
      const a = kv.newSequence();
      kv.grow(a, 0, n);
      const solo = await m.model.step({
        tokens: Int32Array.from(ids), rows: [{ seq: a, start: 0, count: n }], logitTokens: [n - 1],
        hidden: { layers, tokens: all, read: true },
      }, kv);
      assert.equal(solo.hidden?.length, layers.length);
      let worst = 0;
      layers.forEach((l, k) => {
        const d = relativeDiff(solo.hidden![k]!, ref.hidden_states[String(l)]!, all);
        worst = Math.max(worst, d);
        assert.ok(d < tolerance, `layer ${l}: relative difference ${d}`);
      });
      // chunked and batched: a second sequence's prompt in two chunks, the second chunk beside a
      // third sequence's whole prompt in one step; states taken from both rows, layers reordered
      const b = kv.newSequence(), c = kv.newSequence();
      kv.grow(b, 0, n);
      kv.grow(c, 0, n);
      const cut = 5;
      await m.model.step({ tokens: Int32Array.from(ids.slice(0, cut)), rows: [{ seq: b, start: 0, count: cut }], logitTokens: [cut - 1] }, kv);
      const reordered = [...layers].reverse();
      const mixed = await m.model.step({
        tokens: Int32Array.from([...ids.slice(cut), ...ids]),
        rows: [{ seq: b, start: cut, count: n - cut }, { seq: c, start: 0, count: n }],
        logitTokens: [n - cut - 1, 2 * n - cut - 1],
        hidden: { layers: reordered, tokens: [0, n - cut - 1, n - cut, 2 * n - cut - 1], read: true },
      }, kv);
      reordered.forEach((l, k) => {
        const d = relativeDiff(mixed.hidden![k]!, ref.hidden_states[String(l)]!, [cut, n - 1, 0, n - 1]);
        worst = Math.max(worst, d);
        assert.ok(d < tolerance, `batched, layer ${l}: relative difference ${d}`);
      });
      t.diagnostic(`largest difference relative to the layer's scale: ${worst.toExponential(2)}`);
      // a layer the target does not have is refused
      assert.throws(() => m.model.launch({
        tokens: Int32Array.from(ids), rows: [{ seq: a, start: 0, count: n }], logitTokens: [n - 1],
        hidden: { layers: [m.config.numLayers], tokens: [0] },
      }, kv), /hidden states: layer 6 is not in \[0, 6\)/);
      kv.dispose();
    } finally {
      await backend.close();
    }
  });
}

test('the EAGLE-3 head matches PyTorch from the reference hidden states', async (t) => {
  const backend = await createCpuBackend();
  try {
    const m = await loadModel(backend, DEMO, { onProgress: () => {} });
    const dir = loadEagle3Dir(HEAD, m.config);
    assert.deepEqual([...dir.config.targetLayers], ref.layers);
    const head = await Eagle3Head.load(backend, dir, m.model.weights.embed);
    const D = m.config.hiddenSize;
    const states = ref.layers.map((l) => backend.upload(Float32Array.from(ref.hidden_states[String(l)]!.slice(0, n - 1).flat()), [n - 1, D]));
    assertClose(await runHead(head, backend, states as [Tensor, Tensor, Tensor]), t);
    states.forEach((s) => backend.free(s));
    head.dispose();
  } finally {
    await backend.close();
  }
});

test("the EAGLE-3 head matches PyTorch from the target's own hidden states (the hidden-state option, on the device)", async (t) => {
  const backend = await createCpuBackend();
  try {
    const m = await loadModel(backend, DEMO, { onProgress: () => {} });
    const head = await Eagle3Head.load(backend, loadEagle3Dir(HEAD, m.config), m.model.weights.embed);
    const kv = targetKv(backend, m);
    const seq = kv.newSequence();
    kv.grow(seq, 0, n);
    const pending = m.model.launch({
      tokens: Int32Array.from(ids), rows: [{ seq, start: 0, count: n }], logitTokens: [n - 1],
      hidden: { layers: head.targetLayers, tokens: Array.from({ length: n }, (_, i) => i) },
    }, kv);
    await pending.result;
    assert.equal(pending.hidden?.length, 3);
    assertClose(await runHead(head, backend, pending.hidden as [Tensor, Tensor, Tensor]), t);
    pending.release();
    head.dispose();
    kv.dispose();
  } finally {
    await backend.close();
  }
});

test('the EAGLE-3 head maps draft logits onto target ids', async () => {
  const backend = await createCpuBackend();
  try {
    const m = await loadModel(backend, DEMO, { onProgress: () => {} });
    const head = await Eagle3Head.load(backend, loadEagle3Dir(HEAD, m.config), m.model.weights.embed);
    const Vd = head.config.draftVocabSize, V = head.config.vocabSize;
    assert.ok(Vd < V, 'the demo head has a smaller draft vocabulary');
    const draft = Float32Array.from({ length: 2 * Vd }, (_, i) => (i % 7) - 3);
    const full = head.targetLogits(draft);
    assert.equal(full.length, 2 * V);
    const mapped = new Set(head.draftToTarget);
    for (let p = 0; p < 2; p++) {
      for (let d = 0; d < Vd; d++) assert.equal(full[p * V + head.draftToTarget[d]!], draft[p * Vd + d]);
      for (let t = 0; t < V; t++) if (!mapped.has(t)) assert.equal(full[p * V + t], -Infinity);
    }
    head.dispose();
  } finally {
    await backend.close();
  }
});
