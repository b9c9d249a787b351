import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, ContextLengthError } from '../../src/execution/engine.ts';
import { QueueFullError, NeverFitsError } from '../../src/execution/scheduler.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

async function tiny(opts = {}): Promise<LoadedModel> {
  return loadModel(new ReferenceBackend(), writeTinyLlama(opts));
}

function prompt(seed: number, n: number): number[] {
  return Array.from({ length: n }, (_, k) => (seed * 31 + k * 17) % 256);
}

const greedy = (promptIds: number[], maxTokens: number) => ({ promptIds, maxTokens, sampling: { temperature: 0 }, ignoreEos: true });

test('batched requests joining at staggered times produce their solo outputs', async () => {
  const m = await tiny({ slidingWindow: 6 });
  const prompts = Array.from({ length: 6 }, (_, k) => prompt(k + 1, 3 + ((k * 5) % 11)));
  const solo: number[][] = [];
  for (const p of prompts) {
    const e = new Engine(m.model, m, { maxBatch: 1, tokenBudget: 4 });
    solo.push((await e.complete(greedy(p, 7 + (p.length % 4)))).tokenIds);
    await e.close();
  }
  // small token budget forces chunked prefill to interleave with other rows' decode steps
  const e = new Engine(m.model, m, { maxBatch: 4, tokenBudget: 5 });
  const pending: Promise<number[]>[] = [];
  for (let k = 0; k < prompts.length; k++) {
    pending.push(e.complete(greedy(prompts[k], 7 + (prompts[k].length % 4))).then((c) => c.tokenIds));
    await new Promise((r) => setTimeout(r, k * 3)); // join while others run
  }
  assert.deepEqual(await Promise.all(pending), solo);
  assert.equal(e.stats.kvBlocksUsed, 0);
  assert.ok(e.stats.steps > 0);
  await e.close();
});

test('cancellation removes the row, frees its blocks, and siblings finish', async () => {
  const m = await tiny();
  const e = new Engine(m.model, m, { maxBatch: 4 });
  const ac = new AbortController();
  let victimTokens = 0;
  const victim = new Promise<{ finishReason: string; completionTokens: number }>((resolve) =>
    e.submit(greedy(prompt(1, 5), 200), (ev) => {
      if (ev.type === 'token' && ++victimTokens === 5) ac.abort(); // mid-stream, while the sibling runs
      if (ev.type === 'finish') resolve(ev);
    }, ac.signal));
  const sibling = e.complete(greedy(prompt(2, 5), 12));
  const [v, s] = await Promise.all([victim, sibling]);
  assert.equal(v.finishReason, 'cancelled');
  assert.ok(v.completionTokens < 200);
  assert.equal(s.finishReason, 'length');
  assert.equal(s.completionTokens, 12);
  assert.equal(e.stats.running, 0);
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
});

test('a stream left early cancels its sequence', async () => {
  const m = await tiny();
  const e = new Engine(m.model, m, { maxBatch: 2 });
  let seen = 0;
  for await (const ev of e.generate(greedy(prompt(3, 4), 500))) {
    if (ev.type === 'token' && ++seen === 3) break;
  }
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(e.stats.running, 0);
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
});

test('a signal already aborted: generate ends at once with cancelled; a finished request leaves no listener on a long-lived signal', async () => {
  const m = await tiny();
  const e = new Engine(m.model, m, { maxBatch: 2 });
  const gone = new AbortController();
  gone.abort();
  const events = [];
  for await (const ev of e.generate(greedy(prompt(4, 4), 50), { signal: gone.signal })) events.push(ev);
  assert.deepEqual(events.map((ev) => ev.type === 'finish' && ev.finishReason), ['cancelled']);
  // a signal shared by many requests (an application's shutdown signal) must not collect one
  // listener per finished request
  const shared = new AbortController();
  let added = 0, removed = 0;
  const add = shared.signal.addEventListener.bind(shared.signal), remove = shared.signal.removeEventListener.bind(shared.signal);
  shared.signal.addEventListener = ((...a: Parameters<typeof add>) => (added++, add(...a))) as typeof add;
  shared.signal.removeEventListener = ((...a: Parameters<typeof remove>) => (removed++, remove(...a))) as typeof remove;
  for (let k = 0; k < 3; k++) await e.complete(greedy(prompt(5 + k, 4), 3), { signal: shared.signal });
  assert.equal(added, 3);
  assert.equal(removed, 3);
  assert.equal(e.stats.running, 0);
  await e.close();
});

test('bad requests are refused before they are queued', async () => {
  const m = await tiny({ maxPositions: 32 });
  const e = new Engine(m.model, m, { maxBatch: 1, maxQueued: 1, kvTokens: 32 });
  assert.throws(() => e.submit(greedy(prompt(1, 40), 4), () => {}), ContextLengthError);
  assert.throws(() => e.submit(greedy([], 4), () => {}), ContextLengthError);
  assert.throws(() => e.submit(greedy([999999], 4), () => {}), /outside the vocabulary/);
  assert.throws(() => e.submit({ promptIds: [1], maxTokens: 4, sampling: { temperature: -1 } }, () => {}), /temperature/);
  const small = new Engine(m.model, m, { maxBatch: 1, maxQueued: 1, kvTokens: 16, blockSize: 16 });
  assert.throws(() => small.submit(greedy(prompt(1, 10), 20), () => {}), NeverFitsError);
  // queue: one running, one waiting, the third is refused
  const a = e.complete(greedy(prompt(1, 4), 3));
  const b = e.complete(greedy(prompt(2, 4), 3));
  assert.rejects(e.complete(greedy(prompt(3, 4), 3)), QueueFullError);
  await Promise.all([a, b]);
  await e.close();
  await small.close();
});

test('a failing consumer callback ends only its own row', async () => {
  const m = await tiny();
  const e = new Engine(m.model, m, { maxBatch: 2 });
  let finish: string | undefined;
  e.submit(greedy(prompt(5, 4), 50), (ev) => {
    if (ev.type === 'token') throw new Error('consumer bug');
    finish = ev.finishReason;
  });
  const ok = await e.complete(greedy(prompt(6, 4), 10));
  assert.equal(ok.completionTokens, 10);
  assert.equal(finish, 'error');
  assert.equal(e.stats.kvBlocksUsed, 0);
  await e.close();
});

test('a KV dtype the backend does not keep is refused at construction, naming what it keeps', async () => {
  const m = await tiny();
  assert.throws(() => new Engine(m.model, m, { maxBatch: 1, kvDtype: 'bf16' }), /the reference backend keeps its KV cache in f32, not bf16/);
});
