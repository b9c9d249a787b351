// Decode steps through captured graphs (models/decode-graphs.ts), off the GPU: a reference backend
// that "captures" by keeping the body and re-running it on replay, copying the fresh outputs into
// the captured ones. What this checks is everything around the device graph: the packed input
// buffer, bucket padding (rows at position -1 that must disturb nothing), fixed-width block
// tables, buckets coming and going as rows join and leave, and that the tokens equal the eager
// path's and the transformers fixtures' (also when greedy rows take the backend's argmax). The CUDA twin runs on the GPU (cuda-fixtures.test.ts).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import type { CapturedGraph, Tensor } from '../../src/contracts/backend.ts';
import { bucketFor } from '../../src/models/decode-graphs.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';
import { ReplayingReference } from '../helpers/replaying-reference.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');

test('buckets: exact to 8, then multiples of 16', () => {
  assert.deepEqual([1, 2, 7, 8, 9, 16, 17, 33].map(bucketFor), [1, 2, 7, 8, 16, 16, 32, 48]);
});

for (const name of ['qwen3', 'gemma2', 'llama']) {
  test(`${name}: graph-replayed decode equals the eager path and the fixtures, alone and batched`, async () => {
    const dir = join(FIXTURES, name);
    const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[]; steps: StepRecord[] }[] };
    const request = (c: (typeof ref.cases)[number], logprobs = true) => ({
      promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true,
      topLogprobs: logprobs ? 5 : undefined,
    });
    const run = async (backend: ReferenceBackend, maxBatch: number, logprobs = true) => {
      const m = await loadModel(backend, dir, { maxModelLen: 4096 });
      const e = new Engine(m.model, m, { maxBatch, tokenBudget: 16, maxModelLen: m.maxContext });
      // staggered: later requests join while earlier ones decode, so buckets change size
      const out = await Promise.all(ref.cases.map(async (c, k) => {
        await new Promise((r) => setTimeout(r, 3 * k));
        return e.complete(request(c, logprobs));
      }));
      await e.close(0);
      return out;
    };
    const graphed = new ReplayingReference();
    const eager = await run(new ReferenceBackend(), ref.cases.length);
    const viaGraphs = await run(graphed, ref.cases.length);
    assert.ok(graphed.replays > 0, 'no step replayed a graph');
    viaGraphs.forEach((g, k) => {
      assert.deepEqual(g.tokenIds, eager[k]!.tokenIds, `case ${k}: graph path differs from eager`);
      const r = compareToReference(g.logprobs!, ref.cases[k]!.steps, 0.05);
      assert.ok(r.ok, `case ${k}: ${r.problem}`);
    });
    // without logprobs, greedy rows take the device's argmax and read back no logits
    const argmaxRuns = await run(new ReplayingReference(), ref.cases.length, false);
    argmaxRuns.forEach((g, k) => assert.deepEqual(g.tokenIds, eager[k]!.tokenIds, `case ${k}: device argmax differs`));
    // a lone request: bucket 1 throughout its decode
    const lone = new ReplayingReference();
    const [solo] = await run(lone, 1).then((x) => x.slice(0, 1));
    assert.deepEqual(solo!.tokenIds, eager[0]!.tokenIds);
    assert.ok(lone.captures >= 1 && lone.replays >= ref.cases[0]!.steps.length - 2, `captures ${lone.captures}, replays ${lone.replays}`);
  });
}

test('a capture that fails turns graphs off and the steps run op by op, same tokens', async () => {
  const dir = join(FIXTURES, 'llama');
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[]; steps: StepRecord[] }[] };
  const c = ref.cases[0]!;
  const req = { promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true };
  const failing = new (class extends ReplayingReference {
    override captureGraph(): CapturedGraph {
      throw new Error('out of device memory (test)');
    }
  })();
  const m = await loadModel(failing, dir, { maxModelLen: 4096 });
  const errors: string[] = [];
  const orig = console.error;
  console.error = (line: string) => errors.push(line);
  try {
    const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
    const out = await e.complete(req);
    await e.close(0);
    assert.equal(out.finishReason, 'length');
    assert.deepEqual(out.tokenIds, c.steps.map((s) => s.token_id));
  } finally {
    console.error = orig;
  }
  assert.match(m.model.graphsOff ?? '', /out of device memory \(test\)/);
  assert.equal(errors.filter((l) => /decode graphs are off/.test(l)).length, 1, 'logged once');
});

test('graphs: false (EngineSettings.graphs, $LLMTS_GRAPHS=off) runs every step op by op, same tokens', async () => {
  const dir = join(FIXTURES, 'llama');
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[]; steps: StepRecord[] }[] };
  const c = ref.cases[0]!;
  const backend = new ReplayingReference();
  const m = await loadModel(backend, dir, { maxModelLen: 4096 });
  const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext, graphs: false });
  const out = await e.complete({ promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true });
  await e.close(0);
  assert.deepEqual(out.tokenIds, c.steps.map((s) => s.token_id));
  assert.deepEqual([backend.captures, backend.replays], [0, 0], 'nothing captured or replayed');
});

test('padding rows (10 rows in the 16-row bucket) write no KV and change no row', async () => {
  const dir = join(FIXTURES, 'llama');
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[] }[] };
  const base = ref.cases.flatMap((c) => c.prompt_token_ids);
  // ten distinct prompts, so no two rows share KV blocks through the prefix cache
  const prompts = Array.from({ length: 10 }, (_, k) => base.slice(k, k + 5 + 3 * k));
  const run = async (backend: ReferenceBackend) => {
    const m = await loadModel(backend, dir, { maxModelLen: 4096 });
    const e = new Engine(m.model, m, { maxBatch: 16, maxModelLen: m.maxContext, prefixCache: { promptCacheBytes: 0 } });
    const out = await Promise.all(prompts.map((p) => e.complete({ promptIds: p, maxTokens: 12, sampling: { temperature: 0 }, ignoreEos: true })));
    await e.close(0);
    return out.map((o) => o.tokenIds);
  };
  // the graphs' layouts promise one token a row (the CUDA backend then skips its prefill
  // attention kernel); the reference backend checks the promise on every call that makes it
  let promised = 0;
  const graphed = new (class extends ReplayingReference {
    override attention(...args: Parameters<ReplayingReference['attention']>) {
      if (args[2].oneTokenPerRow) promised++;
      return super.attention(...args);
    }
  })();
  const viaGraphs = await run(graphed);
  assert.deepEqual(viaGraphs, await run(new ReferenceBackend()));
  assert.ok(graphed.replays > 0);
  assert.ok(promised > 0, 'no attention call of a decode graph promised one token a row');
});

test('the reference backend refuses a layout that breaks its one-token-a-row promise', () => {
  const b = new ReferenceBackend();
  const kv = { k: b.zeros([4, 4, 1, 8], 'f32'), v: b.zeros([4, 4, 1, 8], 'f32') };
  const layout = (rows: number[]) => ({
    tokenRow: b.upload(Int32Array.from(rows), [rows.length]), tokenPos: b.upload(Int32Array.from(rows.map((_, k) => k)), [rows.length]),
    slots: b.upload(Int32Array.from(rows.map((_, k) => k)), [rows.length]), blockTables: b.upload(Int32Array.from([0, 1, 2, 3]), [2, 2]),
    blockSize: 4, oneTokenPerRow: true,
  });
  const q = b.zeros([2, 1, 8], 'f32');
  const params = { scale: 1, window: 0, softcap: 0 };
  b.attention(q, kv, layout([0, 1]), params); // kept
  assert.throws(() => b.attention(q, kv, layout([0, 0]), params), /promises one token a row/);
});

test('verify steps (n-gram drafts) replay multi-token graphs: the tokens and logprobs of eager plain decoding, alone and batched', async () => {
  const dir = join(FIXTURES, 'llama');
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[] }[] };
  // each prompt twice over and its start again: n-gram drafts find the continuation in the prompt
  const prompts = ref.cases.map((c) => [...c.prompt_token_ids, ...c.prompt_token_ids, ...c.prompt_token_ids.slice(0, 3)]);
  const run = async (backend: ReferenceBackend, speculative: boolean, together: boolean) => {
    const m = await loadModel(backend, dir, { maxModelLen: 4096 });
    const e = new Engine(m.model, m, {
      maxBatch: 8, maxModelLen: m.maxContext, prefixCache: { promptCacheBytes: 0 },
      ...(speculative ? { speculative: { proposer: 'ngram' as const, numDraftTokens: 4, ngramMin: 1, ngramMax: 3 } } : {}),
    });
    const req = (p: number[]) => e.complete({ promptIds: p, maxTokens: 24, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 2 });
    const out = together ? await Promise.all(prompts.map(req)) : await prompts.reduce<Promise<Awaited<ReturnType<typeof req>>[]>>(
      async (acc, p) => [...await acc, await req(p)], Promise.resolve([]));
    await e.close(0);
    return out;
  };
  // multi-token graphs: attention calls of a replay whose layout does not promise one token a row
  let multiTokenReplays = 0;
  const graphed = new (class extends ReplayingReference {
    private replaying = false;
    override captureGraph(body: () => Tensor[]): CapturedGraph {
      const g = super.captureGraph(body);
      return { ...g, replay: () => { this.replaying = true; try { g.replay(); } finally { this.replaying = false; } } };
    }
    override attention(...args: Parameters<ReplayingReference['attention']>) {
      if (this.replaying && !args[2].oneTokenPerRow) multiTokenReplays++;
      return super.attention(...args);
    }
  })();
  const plain = await run(new ReferenceBackend(), false, false);
  for (const together of [false, true]) {
    const before = multiTokenReplays;
    const spec = await run(graphed, true, together);
    assert.ok(multiTokenReplays > before, `no verify step replayed a graph (${together ? 'batched' : 'alone'})`);
    const drafted = spec.reduce((n, c) => n + (c.speculation?.draftTokens ?? 0), 0);
    const accepted = spec.reduce((n, c) => n + (c.speculation?.acceptedTokens ?? 0), 0);
    assert.ok(accepted > 0 && accepted < drafted, `drafts accepted and rejected (${accepted} of ${drafted})`);
    spec.forEach((s, k) => {
      assert.deepEqual(s.tokenIds, plain[k]!.tokenIds, `case ${k}: tokens`);
      s.logprobs!.forEach((l, i) => assert.ok(Object.is(l.logprob, plain[k]!.logprobs![i]!.logprob), `case ${k} token ${i}: logprob`));
    });
  }
});

test('a step that captured a graph is no measure of step cost: adaptive drafting survives slow captures', async () => {
  const dir = join(FIXTURES, 'llama');
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: { prompt_token_ids: number[] }[] };
  const p = ref.cases[0]!.prompt_token_ids;
  const prompt = [...p, ...p, ...p, ...p.slice(0, 3)];
  // every capture (the first step of each bucket: a new draft depth is a new bucket) takes 40 ms
  // more than the step, as instantiating a graph of a few hundred kernels can on a GPU
  const slow = new (class extends ReplayingReference {
    override captureGraph(body: () => Tensor[]): CapturedGraph {
      const until = performance.now() + 40;
      while (performance.now() < until) { /* the capture's one-off cost */ }
      return super.captureGraph(body);
    }
  })();
  const m = await loadModel(slow, dir, { maxModelLen: 4096 });
  const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext, prefixCache: { promptCacheBytes: 0 },
    speculative: { proposer: 'ngram', numDraftTokens: 'adaptive', ngramMin: 1, ngramMax: 3 } });
  const plain = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext, graphs: false });
  const req = { promptIds: prompt, maxTokens: 96, sampling: { temperature: 0 }, ignoreEos: true };
  const want = await plain.complete(req);
  await plain.close(0);
  // the first request's steps capture the buckets; the second's replay them
  for (let k = 0; k < 2; k++) {
    const got = await e.complete(req);
    assert.deepEqual(got.tokenIds, want.tokenIds);
  }
  const { draftTokens, acceptedTokens } = e.stats.speculation;
  await e.close(0);
  assert.ok(slow.captures >= 2, `captures ${slow.captures}`);
  assert.ok(acceptedTokens > 20, `drafting kept paying after the captures (${acceptedTokens} of ${draftTokens} drafts accepted)`);
});
