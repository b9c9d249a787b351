// Grammar hosts (grammar-host.ts, compiler.ts): the xgrammar instances that compile grammars and
// serve rows' matchers live on worker threads. While a slow spec compiles on one host, this
// thread keeps turning and rows on another host keep getting masks; a compile never lands on a
// host with live matchers (a waiting compile drains one, then runs); a host that dies ends only
// its rows; a compile past its deadline is refused and its host replaced; the stats follow
// evictions and lost hosts; and without workers the same hosts run inline with identical masks
// and tokens. Orderings, counts and progress only (no timing thresholds).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setImmediate as turn } from 'node:timers/promises';
import { performance } from 'node:perf_hooks';
import {
  GrammarCompiler, GrammarRowError, GrammarTimeoutError, countAllowed, grammarCompilerStats, grammarVocabFrom, maskAllows,
  type CompiledGrammar, type GrammarSpec, type RowGrammar,
} from '../../src/sampling/grammar/index.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import { asciiGrammarVocab } from '../helpers/grammar-vocab.ts';
import { mulberry32 } from '../helpers/mulberry32.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const BIG = asciiGrammarVocab(32_000);
const SMALL = asciiGrammarVocab(2_000);

/** length-limited strings, each limit different: seconds to compile against 32k tokens (xgrammar 0.1.27 is slow on them) */
const slowSpec = (n: number, tag: string): GrammarSpec => ({
  type: 'json_schema',
  schema: {
    type: 'object',
    properties: Object.fromEntries(Array.from({ length: n }, (_, i) => [`${tag}${i}`, { type: 'string', maxLength: 20 + i }])),
    required: Array.from({ length: n }, (_, i) => `${tag}${i}`),
  },
});

/** letters, without end: a row that can always go on */
const LETTERS: GrammarSpec = { type: 'regex', pattern: '[a-z]+' };

/** the first allowed token that is not a stop token */
function pick(m: RowGrammar, vocabSize: number, skip = 0): number {
  const mask = m.mask();
  for (let id = 1; id < vocabSize; id++) if (maskAllows(mask, id) && skip-- === 0) return id;
  throw new Error('no token allowed');
}

/** One step of a row: its mask, then a token from it. */
function step(m: RowGrammar, vocabSize: number): void {
  m.accept(pick(m, vocabSize));
}

/** The internals a crash reaches: a host's worker thread. */
function hostWorker(c: GrammarCompiler, id: number): { terminate(): Promise<number> } {
  const hosts = (c as unknown as { hosts: { h: { id: number; worker?: { terminate(): Promise<number> } } }[] }).hosts;
  return hosts.find((h) => h.h.id === id)!.h.worker!;
}

test('while a slow spec compiles on one host, the event loop turns and a row on another host gets masks, to the end of the compile', async () => {
  const c = new GrammarCompiler(BIG, { maxHosts: 2, compileTimeoutMs: 0 });
  try {
    const letters = await c.compile(LETTERS);
    const row = letters.createMatcher({ jumpForward: false });
    const ticks: number[] = [], steps: number[] = [];
    let done = false;
    const spin = () => {
      ticks.push(performance.now());
      if (!done) setImmediate(spin);
    };
    setImmediate(spin);
    const slow = c.compile(slowSpec(4, 'slow_'));
    let end = 0;
    void slow.finally(() => {
      end = performance.now();
      done = true;
    });
    while (!done) {
      step(row, BIG.vocabSize);
      steps.push(performance.now());
      await turn();
    }
    const g = await slow;
    // it compiled on the other host: this one had a live matcher
    assert.notEqual(g.hostId, letters.hostId);
    assert.ok(c.stats.lastCompileMs > 0);
    // this thread was free through the whole compile, its second half included (a compile on
    // this thread would leave no turn in it)
    const from = end - c.stats.lastCompileMs / 2;
    const inSecondHalf = (ts: number[]) => ts.filter((t) => t >= from && t <= end).length;
    assert.ok(inSecondHalf(ticks) > 0, `event-loop turns in the compile's second half: ${inSecondHalf(ticks)} of ${ticks.length}`);
    assert.ok(inSecondHalf(steps) > 0, `row steps in the compile's second half: ${inSecondHalf(steps)} of ${steps.length}`);
    // the row is still fine, and the slow grammar works
    assert.ok(countAllowed(row.mask(), BIG.vocabSize) > 0);
    row.dispose();
    const m = g.createMatcher();
    assert.ok(countAllowed(m.mask(), BIG.vocabSize) > 0);
    m.dispose();
    g.release();
    letters.release();
  } finally {
    await c.close();
  }
});

test('placement: a compile never lands on a host with live matchers; a waiting compile drains a host (its cached grammars wait too) and runs once its rows end', async () => {
  const c = new GrammarCompiler(SMALL, { maxHosts: 2 });
  try {
    const a = await c.compile({ type: 'choice', choices: ['alpha', 'apple'] });
    const rowA = a.createMatcher({ jumpForward: false });
    const b = await c.compile({ type: 'choice', choices: ['beta', 'bravo'] });
    assert.notEqual(b.hostId, a.hostId, 'the first host has a live matcher');
    const rowB = b.createMatcher({ jumpForward: false });
    rowB.mask();
    // both hosts have live matchers and there may be no third: the new spec waits
    let settled = '';
    const c1 = c.compile({ type: 'choice', choices: ['gamma', 'golf'] }).then((g) => ((settled += 'C'), g));
    c1.catch(() => {}); // awaited below
    // once it is checked, it looks for a host
    while (c.hostStates().every((h) => !h.draining) && settled === '') await new Promise((r) => setTimeout(r, 5));
    const draining = c.hostStates().filter((h) => h.draining);
    assert.equal(draining.length, 1, JSON.stringify(c.hostStates()));
    assert.ok(c.hostStates().every((h) => !h.compiling));
    const drainingId = draining[0]!.id;
    const [drainingRow, drainingLease, otherRow] = drainingId === a.hostId ? [rowA, a, rowB] : [rowB, b, rowA];
    const otherLease = drainingId === a.hostId ? b : a;
    // a request for the draining host's cached grammar waits too; rows on both hosts go on
    const hit = c.compile(drainingId === a.hostId ? { type: 'choice', choices: ['alpha', 'apple'] } : { type: 'choice', choices: ['beta', 'bravo'] })
      .then((g) => ((settled += 'H'), { g, compiles: c.stats.compiles }));
    hit.catch(() => {}); // awaited below
    assert.ok(countAllowed(drainingRow.mask(), SMALL.vocabSize) > 0);
    for (let i = 0; i < 100; i++) {
      assert.ok(countAllowed(otherRow.mask(), SMALL.vocabSize) > 0);
      await turn();
    }
    assert.equal(settled, '', 'nothing compiled or leased on a host with live matchers');
    assert.equal(c.stats.compiles, 2);
    // its rows end: the waiting compile runs there, then the host serves its cached grammar again
    drainingRow.dispose();
    const gC = await c1;
    assert.equal(gC.hostId, drainingId);
    const h = await hit;
    assert.equal(h.g.hostId, drainingId);
    assert.equal(h.compiles, 3, 'the cache hit was served after the compile');
    assert.equal(c.stats.cacheHits, 1);
    assert.ok(c.hostStates().every((s) => !s.draining));
    // the other host's row never stopped
    assert.ok(countAllowed(otherRow.mask(), SMALL.vocabSize) > 0);
    otherRow.dispose();
    for (const g of [gC, h.g, drainingLease, otherLease]) g.release();
  } finally {
    await c.close();
  }
});

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer', minimum: 0, maximum: 99 }, kind: { const: 'person-record-v1' } },
  required: ['name', 'age', 'kind'],
  additionalProperties: false,
};
const CODE: GrammarSpec = { type: 'regex', pattern: '[a-c]{2,4}-[0-9]{1,3}' };

async function tinyModel(): Promise<LoadedModel> {
  return loadModel(new ReferenceBackend(), writeTinyLlama({ maxPositions: 512 }));
}

const request = (m: LoadedModel, g: CompiledGrammar, seed: number): EngineRequest => ({
  promptIds: m.tokenizer.encode('go', { addSpecialTokens: false }), maxTokens: 120, sampling: { temperature: 1, seed },
  grammar: { createMatcher: () => g.createMatcher() },
});

test('a host killed mid-stream ends only its rows, with a grammar error; the other host\'s rows are untouched; a fresh host serves the next request', async () => {
  const m = await tinyModel();
  const c = new GrammarCompiler(grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds), { maxHosts: 2 });
  try {
    const person = await c.compile({ type: 'json_schema', schema: PERSON });
    const code = await c.compile(CODE);
    assert.notEqual(code.hostId, person.hostId, 'a lease just handed out keeps its host from compiling');
    const solo = new Engine(m.model, m, { maxBatch: 4 });
    const alone = await Promise.all([3, 4].map((s) => solo.complete(request(m, code, s))));
    await solo.close();
    assert.ok(alone.every((r) => r.finishReason === 'stop' && /^[a-c]{2,4}-[0-9]{1,3}$/.test(r.text)), JSON.stringify(alone.map((r) => r.text)));

    const e = new Engine(m.model, m, { maxBatch: 4 });
    let killed: Promise<number> | undefined;
    const doomed = [1, 2].map((seed) => new Promise<{ finishReason: string; errorKind?: string; error?: string; tokens: number }>((resolve) => {
      let tokens = 0;
      e.submit(request(m, person, seed), (ev) => {
        if (ev.type === 'token') {
          tokens++;
          // after its first tokens, the host's thread dies (as a crash or an OOM would end it)
          if (tokens === 2) killed ??= hostWorker(c, person.hostId).terminate();
        } else if (ev.type === 'finish') resolve({ finishReason: ev.finishReason, errorKind: ev.errorKind, error: ev.error, tokens });
      });
    }));
    const others = [3, 4].map((s) => e.complete(request(m, code, s)));
    const [d, o] = await Promise.all([Promise.all(doomed), Promise.all(others)]);
    await killed;
    for (const r of d) {
      assert.equal(r.finishReason, 'error', JSON.stringify(r));
      assert.equal(r.errorKind, 'grammar');
      assert.match(r.error!, /grammar host/);
    }
    assert.deepEqual(o.map((r) => r.tokenIds), alone.map((r) => r.tokenIds), 'the other host\'s rows produced what they produce alone');
    assert.equal(e.stats.kvBlocksUsed, 0);
    assert.equal(c.stats.hostFailures, 1);
    assert.ok(!c.hostStates().some((h) => h.id === person.hostId));
    person.release();
    // the dead host's grammar left the cache: compiled again, on a live host, and it works
    const again = await c.compile({ type: 'json_schema', schema: PERSON });
    assert.ok(again.compileMs > 0);
    assert.notEqual(again.hostId, person.hostId);
    const r = await e.complete(request(m, again, 1));
    assert.equal(r.finishReason, 'stop', `${r.finishReason} ${r.error ?? ''}`);
    const v = JSON.parse(r.text);
    assert.equal(v.kind, 'person-record-v1');
    again.release();
    code.release();
    await e.close();
  } finally {
    await c.close();
  }
});

test('a compile past the deadline is refused (GrammarTimeoutError: a 400) and its host terminated; rows on the other host go on; the next spec compiles on a fresh host', async () => {
  const c = new GrammarCompiler(BIG, { maxHosts: 2, compileTimeoutMs: 1500 });
  try {
    const letters = await c.compile(LETTERS);
    const row = letters.createMatcher({ jumpForward: false });
    let done = false, steps = 0;
    const heavy = c.compile(slowSpec(30, 'f')); // well over 10 s here
    heavy.then(() => (done = true), () => (done = true));
    while (!done) {
      step(row, BIG.vocabSize);
      steps++;
      await turn();
    }
    await assert.rejects(heavy, (err: unknown) => {
      assert.ok(err instanceof GrammarTimeoutError, String(err));
      assert.match((err as Error).message, /^JSON schema is too complex: compiling it took longer than 1500 ms$/);
      return true;
    });
    assert.ok(steps > 0);
    assert.equal(c.stats.timeouts, 1);
    assert.equal(c.stats.hostFailures, 0, 'a deadline is not a failure');
    assert.deepEqual(c.hostStates().map((h) => h.id), [letters.hostId], 'the compiling host was terminated');
    step(row, BIG.vocabSize);
    const next = await c.compile({ type: 'regex', pattern: '[0-9]{3}' });
    assert.notEqual(next.hostId, letters.hostId);
    const m = next.createMatcher();
    assert.ok(countAllowed(m.mask(), BIG.vocabSize) > 0);
    m.dispose();
    row.dispose();
    next.release();
    letters.release();
  } finally {
    await c.close();
  }
});

test('stats follow the cache and the hosts: evictions, bytes within budget, heap as the hosts report it, a lost host\'s grammars and heap gone', async () => {
  const MIB = 2 ** 20;
  const c = new GrammarCompiler(BIG, { cacheBytes: MIB, maxHosts: 2 });
  const mine = () => grammarCompilerStats().find((s) => s === c.stats)!;
  try {
    const strings = (i: number): GrammarSpec => ({ type: 'json_schema', schema: { type: 'array', items: { type: 'string', maxLength: 4 + (i % 4) }, maxItems: 100 + i } });
    const leases: CompiledGrammar[] = [];
    for (let i = 0; i < 6; i++) {
      const g = await c.compile(strings(i));
      g.createMatcher().dispose(); // a request's rows start, and end; its lease is kept
      leases.push(g);
    }
    // the least recently used idle host takes the next compile: both compiled
    assert.ok(leases.some((g) => g.hostId !== leases[0]!.hostId), 'both hosts compiled');
    let s = mine();
    assert.ok(s.evictions > 0 && s.cacheBytes <= MIB && s.cacheEntries < 6, JSON.stringify(s));
    assert.equal(s.heapBytes, c.hostStates().reduce((n, h) => n + h.heapBytes, 0));
    assert.equal(s.hosts, 2);
    // a host lost (the one holding the newest grammar, which is cached): its cached grammars
    // leave the cache, its heap leaves the count
    const lost = c.hostStates().find((h) => h.id === leases[5]!.hostId)!;
    const entries = s.cacheEntries, evictions = s.evictions, heap = s.heapBytes;
    await hostWorker(c, lost.id).terminate();
    s = mine();
    assert.equal(s.hosts, 1);
    assert.equal(s.hostFailures, 1);
    assert.equal(s.heapBytes, heap - lost.heapBytes);
    assert.ok(s.cacheEntries < entries && s.evictions > evictions, JSON.stringify(s));
    assert.equal(entries - s.cacheEntries, s.evictions - evictions);
    for (const g of leases) g.release();
  } finally {
    await c.close();
  }
  const s = c.stats;
  assert.equal(s.hosts, 0);
  assert.equal(s.heapBytes, 0);
});

const SPECS: GrammarSpec[] = [
  { type: 'json_schema', schema: PERSON },
  { type: 'json_schema', schema: { type: 'object', properties: { tags: { type: 'array', items: { enum: ['x', 'y z'] }, maxItems: 3 }, n: { type: 'number', minimum: -2.5, maximum: 10 } }, required: ['tags', 'n'] } },
  CODE,
  { type: 'choice', choices: ['red', 'green', 'blue sky'] },
  { type: 'ebnf', grammar: 'root ::= "<" item ("," item)* ">"\nitem ::= [0-9] [0-9]?' },
];

test('worker: false runs the same hosts inline: identical masks, jump-forward spans and engine tokens', async () => {
  const m = await tinyModel();
  const vocab = grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds);
  const off = new GrammarCompiler(vocab);
  const inline = new GrammarCompiler(vocab, { worker: false });
  try {
    assert.equal(off.stats.offThread, true);
    const a = await Promise.all(SPECS.map((s) => off.compile(s)));
    const b: CompiledGrammar[] = [];
    for (const s of SPECS) b.push(await inline.compile(s));
    assert.equal(inline.stats.offThread, false);
    assert.ok(inline.hostStates().every((h) => h.inline) && off.hostStates().every((h) => !h.inline));
    // the same walk through each grammar: masks compared at every step, tokens drawn from them
    for (let k = 0; k < SPECS.length; k++) {
      for (const jumpForward of [false, true]) {
        const rand = mulberry32(100 + k);
        const x = a[k]!.createMatcher({ jumpForward }), y = b[k]!.createMatcher({ jumpForward });
        for (let i = 0; i < 60 && !x.onlyStopAllowed(); i++) {
          assert.equal(y.onlyStopAllowed(), false);
          assert.deepEqual(x.mask(), y.mask(), `${SPECS[k]!.type} step ${i}`);
          const allowed = countAllowed(x.mask(), vocab.vocabSize);
          const id = pickNth(x.mask(), Math.floor(rand() * allowed));
          x.accept(id);
          y.accept(id);
          assert.deepEqual(x.jumpForward(8), y.jumpForward(8));
          assert.equal(x.terminated, y.terminated);
          if (x.terminated) break;
        }
        assert.equal(x.accepted, y.accepted);
        x.dispose();
        y.dispose();
      }
    }
    // a rejected token is refused alike
    const x = a[3]!.createMatcher(), y = b[3]!.createMatcher();
    const bad = m.tokenizer.encode('z', { addSpecialTokens: false })[0]!;
    assert.throws(() => x.accept(bad), GrammarRowError);
    assert.throws(() => y.accept(bad), GrammarRowError);
    x.dispose();
    y.dispose();
    // through the engine: batched rows of every grammar, the same tokens either way
    const run = async (gs: CompiledGrammar[]) => {
      const e = new Engine(m.model, m, { maxBatch: 16 });
      const out = await Promise.all(gs.flatMap((g, k) => [0, 1].map((seed) => e.complete(request(m, g, seed * 10 + k)))));
      await e.close();
      return out;
    };
    const [ra, rb] = [await run(a), await run(b)];
    assert.ok(ra.every((r) => r.finishReason === 'stop'), JSON.stringify(ra.map((r) => [r.finishReason, r.error])));
    assert.deepEqual(ra.map((r) => r.tokenIds), rb.map((r) => r.tokenIds));
    for (const g of [...a, ...b]) g.release();
  } finally {
    await off.close();
    await inline.close();
  }
});

function pickNth(mask: Int32Array, n: number): number {
  for (let id = 0; id < mask.length * 32; id++) if (maskAllows(mask, id) && n-- === 0) return id;
  throw new Error('no token allowed');
}
