// Pipelined decode (engine.ts launchAhead): greedy steps enqueued one ahead of reading their tokens
// back must change nothing a user sees. Most tests run the same work with the pipeline on and off
// and compare everything that comes out (tokens, text, events, finish reasons, usage, KV and
// prefix-cache accounting), and check that steps really were pipelined (pipelinedSteps > 0), so
// no test passes with the pipeline silently off. The rest: graph replays taking their ids from
// the device, a pipelined step that fails, and the switches.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import type { Tensor } from '../../src/contracts/backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions, type TextCodec } from '../../src/execution/engine.ts';
import { engineSettingsFrom } from '../../src/execution/engine-settings.ts';
import type { EngineRequest, SequenceEvent } from '../../src/execution/sequence.ts';
import { ReplayingReference } from '../helpers/replaying-reference.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { FailingAhead } from '../helpers/failing-ahead.ts';
import { record, tokensOf } from '../helpers/engine-events.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');

interface Case {
  prompt_token_ids: number[];
  generated_token_ids: number[];
}
const casesOf = (name: string): Case[] => JSON.parse(readFileSync(join(FIXTURES, name, 'reference.json'), 'utf8')).cases;

const greedy = (promptIds: readonly number[], maxTokens: number, extra: Partial<EngineRequest> = {}): EngineRequest =>
  ({ promptIds, maxTokens, sampling: { temperature: 0 }, ignoreEos: true, ...extra });

/** A fixture model on the CPU backend, for the duration of `body`. */
async function withFixture<T>(name: string, body: (m: LoadedModel) => Promise<T>): Promise<T> {
  const backend = await createCpuBackend();
  try {
    return await body(await loadModel(backend, join(FIXTURES, name), { maxModelLen: 4096 }));
  } finally {
    await backend.close();
  }
}


/** Runs `work` on a fresh engine with the pipeline on and off; returns both results and the stats. */
async function onAndOff<T>(m: LoadedModel, opts: EngineOptions, work: (e: Engine) => Promise<T>, codec: TextCodec = m) {
  const run = async (pipeline: boolean) => {
    const e = new Engine(m.model, codec, { maxModelLen: m.maxContext, ...opts, pipeline });
    const out = await work(e);
    const stats = e.stats;
    await e.close(0);
    return { out, stats };
  };
  const off = await run(false);
  const on = await run(true);
  assert.equal(off.stats.pipelinedSteps, 0, 'pipeline off pipelines nothing');
  assert.ok(on.stats.pipelinedSteps > 0, 'pipeline on pipelined no step');
  for (const r of [on, off]) {
    assert.equal(r.stats.kvBlocksUsed, 0, 'every KV block returned');
    assert.equal(r.stats.running + r.stats.waiting, 0);
  }
  return { on, off };
}

/**
 * 18 requests joining a running batch at staggered moments (each when the batch has produced a few
 * more tokens), leaving at different lengths, queueing when it is full (batched-parity.test.ts).
 */
async function staggered(e: Engine, cases: Case[]): Promise<number[][]> {
  const jobs: Promise<number[]>[] = [];
  let produced = 0; // tokens produced so far by all requests: the clock joins are timed on
  for (let k = 0; k < 18; k++) {
    const c = cases[k % cases.length]!;
    jobs.push(record(e, greedy(c.prompt_token_ids, 8 + ((k * 7) % 25)), undefined, (ev) => ev.type === 'token' && produced++).then(tokensOf));
    const target = produced + 3;
    while (produced < target && e.stats.running + e.stats.waiting > 0) await new Promise((r) => setTimeout(r, 1));
  }
  return Promise.all(jobs);
}

for (const name of ['llama', 'gemma2']) {
  test(`${name}: 18 staggered greedy requests produce the same tokens pipelined, and the fixtures'`, async () => {
    const cases = casesOf(name);
    await withFixture(name, async (m) => {
      const { on, off } = await onAndOff(m, { maxBatch: 8, tokenBudget: 24 }, (e) => staggered(e, cases));
      assert.deepEqual(on.out, off.out);
      on.out.forEach((got, k) => assert.deepEqual(got, cases[k % cases.length]!.generated_token_ids.slice(0, got.length), `request ${k}`));
    });
  });
}

test('finishing by max_tokens, eos and a stop string while pipelined: same events, text and usage', async () => {
  const [c] = casesOf('llama');
  await withFixture('llama', async (m) => {
    // what the model says, so an eos id and a stop string can be placed mid-answer
    const probe = new Engine(m.model, m, { maxModelLen: m.maxContext, pipeline: false });
    const full = await probe.complete(greedy(c!.prompt_token_ids, 30));
    await probe.close(0);
    const eosId = full.tokenIds[9]!;
    const stop = full.text.slice(20, 24);
    assert.ok(stop.length === 4 && full.text.indexOf(stop) >= 10, `stop string ${JSON.stringify(stop)} sits mid-answer`);
    const codec: TextCodec = { eosIds: [eosId], decode: (ids) => m.decode(ids) };
    const requests: EngineRequest[] = [
      greedy(c!.prompt_token_ids, 17), // length
      greedy(c!.prompt_token_ids, 30, { ignoreEos: false }), // eos
      greedy(c!.prompt_token_ids, 30, { stop: [stop] }), // stop string
    ];
    const expect = ['length', 'stop', 'stop'];
    // alone (the pipeline runs from the first decode to the last), then all three in one batch
    // beside a longer sibling that keeps the pipeline going after each of them ends
    const { on, off } = await onAndOff(m, { maxBatch: 4 }, async (e) => {
      const alone: SequenceEvent[][] = [];
      for (const r of requests) alone.push(await record(e, r));
      const together = await Promise.all([...requests, greedy(casesOf('llama')[1]!.prompt_token_ids, 32)].map((r) => record(e, r)));
      return { alone, together: together.slice(0, 3) };
    }, codec);
    assert.deepEqual(on.out, off.out);
    for (const runs of [on.out.alone, on.out.together]) {
      runs.forEach((events, k) => {
        const fin = events.at(-1)!;
        assert.ok(fin.type === 'finish' && fin.finishReason === expect[k], `request ${k}: ${JSON.stringify(fin)}`);
        assert.equal(fin.completionTokens, events.length - 1, 'usage counts exactly the tokens emitted');
      });
      const [length, eos, stopped] = runs.map(tokensOf);
      assert.equal(length!.length, 17);
      assert.deepEqual(eos, full.tokenIds.slice(0, full.tokenIds.indexOf(eosId) + 1));
      assert.equal(runs[2]!.map((ev) => ev.text).join(''), full.text.slice(0, full.text.indexOf(stop)), 'the stop string ends the text, unprinted');
      assert.deepEqual(stopped, full.tokenIds.slice(0, stopped!.length));
    }
  });
});

test('a request arriving mid-pipeline is admitted at the next boundary (the pipeline drains for it)', async () => {
  const cases = casesOf('llama');
  await withFixture('llama', async (m) => {
    const { on } = await onAndOff(m, { maxBatch: 4 }, async (e) => {
      const waits: number[] = [];
      const long = record(e, greedy(cases[0]!.prompt_token_ids, 400));
      for (let k = 0; k < 3; k++) {
        await new Promise((r) => setTimeout(r, 15));
        const submittedAt = e.stats.steps;
        let firstAt = -1;
        await record(e, greedy(cases[1 + (k % 2)]!.prompt_token_ids, 4), undefined, (ev) => {
          if (firstAt < 0) firstAt = e.stats.steps;
        });
        waits.push(firstAt - submittedAt);
      }
      await long;
      return waits;
    });
    // unpipelined: the step in progress, then its prefill; pipelined: at most the one behind it too
    for (const w of on.out) assert.ok(w <= 3, `admitted after ${w} steps`);
  });
});

test('cancellation mid-pipeline: the row ends at a step boundary, no rows left, KV back to baseline', async () => {
  const cases = casesOf('llama');
  await withFixture('llama', async (m) => {
    const { on, off } = await onAndOff(m, { maxBatch: 4 }, async (e) => {
      const baseline = e.stats.kvBlocksUsed;
      // aborted from its own token callback (deterministic: after its 5th token) while a sibling runs
      const ac = new AbortController();
      let seen = 0;
      const victim = new Promise<SequenceEvent[]>((resolve) => {
        const events: SequenceEvent[] = [];
        e.submit(greedy(cases[0]!.prompt_token_ids, 200), (ev) => {
          events.push(ev);
          if (ev.type === 'token' && ++seen === 5) ac.abort();
          if (ev.type === 'finish') resolve(events);
        }, ac.signal);
      });
      const sibling = record(e, greedy(cases[1]!.prompt_token_ids, 24));
      const [v, s] = await Promise.all([victim, sibling]);
      // a stream left early
      let read = 0;
      for await (const ev of e.generate(greedy(cases[2]!.prompt_token_ids, 500))) if (ev.type === 'token' && ++read === 3) break;
      await new Promise((r) => setTimeout(r, 30));
      // aborted from outside, at whatever step the pipeline is in
      const timed = new AbortController();
      const late = record(e, greedy(cases[2]!.prompt_token_ids, 3000), timed.signal);
      setTimeout(() => timed.abort(), 20);
      const l = await late;
      const lateFin = l.at(-1)!;
      assert.ok(lateFin.type === 'finish' && lateFin.finishReason === 'cancelled' && lateFin.completionTokens === l.length - 1);
      assert.equal(e.stats.running, 0);
      assert.equal(e.stats.kvBlocksUsed, baseline);
      return { v, s };
    });
    assert.deepEqual(on.out, off.out);
    const fin = on.out.v.at(-1)!;
    assert.ok(fin.type === 'finish' && fin.finishReason === 'cancelled' && fin.completionTokens === 5, JSON.stringify(fin));
  });
});

test('greedy rows beside seeded sampled rows: same tokens; a sampled row keeps every step unpipelined', async () => {
  const cases = casesOf('llama');
  await withFixture('llama', async (m) => {
    // host-sampled rows (the CPU backend samples on its worker thread otherwise, and those steps pipeline)
    const { on, off } = await onAndOff(m, { maxBatch: 6, deviceSampling: false }, async (e) => {
      const during: [number, number][] = [];
      const jobs = cases.flatMap((c, k) => [
        record(e, greedy(c.prompt_token_ids, 32)),
        new Promise<SequenceEvent[]>((resolve) => {
          const events: SequenceEvent[] = [];
          let first = -1;
          e.submit({ promptIds: c.prompt_token_ids, maxTokens: 10 + 3 * k, sampling: { temperature: 0.8, topP: 0.9, seed: 11 + k } }, (ev) => {
            events.push(ev);
            if (first < 0) first = e.stats.pipelinedSteps;
            if (ev.type === 'finish') {
              during.push([first, e.stats.pipelinedSteps]);
              resolve(events);
            }
          });
        }),
      ]);
      return { events: await Promise.all(jobs), during };
    });
    assert.deepEqual(on.out.events, off.out.events);
    // from a sampled row's first token to its last, no step was pipelined
    for (const [first, last] of on.out.during) assert.equal(last, first);
  });
});

// gemma2: sliding-window layers (window 8) beside full ones; its prompt is longer than the window
for (const [name, k] of [['llama', 0], ['gemma2', 2]] as const) {
  test(`${name}: prefix cache hashes the tokens that arrived; a repeat and a continuation get the same cached tokens`, async () => {
    const c = casesOf(name)[k]!;
    await withFixture(name, async (m) => {
      const blockSize = 4;
      const { on, off } = await onAndOff(m, { maxBatch: 4, blockSize }, async (e) => {
        const first = await e.complete(greedy(c.prompt_token_ids, 30));
        // the same prompt again, and the conversation continued (its generated blocks were hashed too)
        const again = await e.complete(greedy(c.prompt_token_ids, 30));
        const continued = await e.complete(greedy([...c.prompt_token_ids, ...first.tokenIds], 8));
        return { first, again, continued, prefixCache: e.stats.prefixCache, hashed: e.kv.prefixStats };
      });
      assert.deepEqual(on.out, off.out);
      const n = c.prompt_token_ids.length;
      assert.equal(on.out.again.cachedTokens, Math.floor((n - 1) / blockSize) * blockSize);
      // computed: the prompt and every output token but the last
      assert.equal(on.out.continued.cachedTokens, Math.floor((n + 30 - 1) / blockSize) * blockSize);
      assert.ok(on.out.continued.cachedTokens > n);
    });
  });
}

test('eos while pipelined: the dropped extra token never reaches the prefix cache', async () => {
  const [c] = casesOf('llama');
  await withFixture('llama', async (m) => {
    const blockSize = 4;
    const n = c!.prompt_token_ids.length;
    const probe = new Engine(m.model, m, { maxModelLen: m.maxContext, pipeline: false });
    const full = await probe.complete(greedy(c!.prompt_token_ids, 30));
    await probe.close(0);
    // An eos whose own KV would complete a block: the extra step computes it, so hashing anything
    // that step wrote would make one more block of the continuation below match.
    const at = full.tokenIds.findIndex((id, k) => k >= 6 && full.tokenIds.indexOf(id) === k && (n + k + 1) % blockSize === 0);
    assert.ok(at > 0, 'an eos candidate');
    const eosId = full.tokenIds[at]!;
    const codec: TextCodec = { eosIds: [eosId], decode: (ids) => m.decode(ids) };
    const { on, off } = await onAndOff(m, { maxBatch: 4, blockSize }, async (e) => {
      const first = await e.complete(greedy(c!.prompt_token_ids, 30, { ignoreEos: false }));
      const next = await e.complete(greedy([...c!.prompt_token_ids, ...first.tokenIds, 1, 2, 3, 4, 5], 4));
      return { first, next, hashed: e.kv.prefixStats.hashedBytes };
    }, codec);
    assert.deepEqual(on.out, off.out);
    assert.equal(on.out.first.completionTokens, at + 1);
    assert.equal(on.out.first.finishReason, 'stop');
    // computed before it ended: the prompt and its tokens but the eos
    assert.equal(on.out.next.cachedTokens, Math.floor((n + at) / blockSize) * blockSize);
  });
});

/** Counts device-id copies into graph inputs; can fail the step after a pipelined step's gather. */
class CountingReplay extends ReplayingReference {
  copies = 0;
  override copyTensor(t: Tensor, src: Tensor): void {
    this.copies++;
    super.copyTensor(t, src);
  }
}

test('graph-replayed pipelined steps take their ids from the device: same tokens as unpipelined and eager', async () => {
  const dir = join(FIXTURES, 'llama');
  const cases = casesOf('llama');
  const run = async (backend: ReferenceBackend, pipeline: boolean) => {
    const m = await loadModel(backend, dir, { maxModelLen: 4096 });
    const e = new Engine(m.model, m, { maxBatch: 4, tokenBudget: 16, maxModelLen: m.maxContext, pipeline });
    const out = await Promise.all(cases.map(async (c, k) => {
      await new Promise((r) => setTimeout(r, 3 * k));
      return (await e.complete(greedy(c.prompt_token_ids, 20))).tokenIds;
    }));
    const { pipelinedSteps, kvBlocksUsed } = e.stats;
    await e.close(0);
    return { out, pipelinedSteps, kvBlocksUsed };
  };
  const graphed = new CountingReplay();
  const viaGraphs = await run(graphed, true);
  const eager = await run(new ReferenceBackend(), false);
  assert.ok(viaGraphs.pipelinedSteps > 0 && graphed.replays > 0 && graphed.copies > 0, 'pipelined graph replays with device ids');
  assert.deepEqual(viaGraphs.out, eager.out);
  viaGraphs.out.forEach((got, k) => assert.deepEqual(got, cases[k]!.generated_token_ids.slice(0, 20)));
  assert.equal(viaGraphs.kvBlocksUsed, 0);
});

test('a pipelined step that fails is only a head start lost: its rows recompute normally, same tokens', async () => {
  const dir = writeTinyLlama();
  const prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [40, 41, 42, 43]];
  const run = async (backend: ReferenceBackend, pipeline: boolean) => {
    const m = await loadModel(backend, dir);
    const e = new Engine(m.model, m, { maxBatch: 4, pipeline });
    const out = await Promise.all(prompts.map((p) => e.complete(greedy(p, 24))));
    const stats = e.stats;
    await e.close(0);
    return { out, stats };
  };
  const failing = new FailingAhead(6);
  const faulted = await run(failing, true);
  const clean = await run(new ReferenceBackend(), false);
  assert.ok(failing.gathers >= 6 && faulted.stats.pipelinedSteps > 0);
  assert.deepEqual(faulted.out, clean.out);
  for (const c of faulted.out) assert.equal(c.finishReason, 'length');
  assert.equal(faulted.stats.kvBlocksUsed, 0);
});

test('LLMTS_PIPELINE=off, pipeline: false and a backend without a device argmax turn the pipeline off', async () => {
  assert.equal(engineSettingsFrom({ LLMTS_PIPELINE: 'off' }).pipeline, false);
  assert.equal(engineSettingsFrom({ LLMTS_PIPELINE: 'off' }, { pipeline: true }).pipeline, true, 'the option wins');
  assert.equal(engineSettingsFrom({}).pipeline, true);
  const m = await loadModel(new ReferenceBackend(), writeTinyLlama());
  const plain = new Engine(m.model, m), optedOut = new Engine(m.model, m, { pipeline: false });
  assert.equal(plain.pipeline, true);
  assert.equal(optedOut.pipeline, false);
  for (const x of [plain, optedOut]) await x.close(0);
  const noArgmax = new (class extends ReferenceBackend {})();
  Object.defineProperty(noArgmax, 'argmax', { value: undefined });
  const m2 = await loadModel(noArgmax, writeTinyLlama());
  const e = new Engine(m2.model, m2);
  assert.equal(e.pipeline, false);
  const out = await e.complete(greedy([1, 2, 3], 6));
  assert.equal(out.completionTokens, 6);
  assert.equal(e.stats.pipelinedSteps, 0);
  await e.close(0);
});
