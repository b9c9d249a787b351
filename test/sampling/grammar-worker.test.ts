// Grammar compilation off the event loop: new specs are parsed and validated on the check worker
// (compile-worker.ts) and compiled on a grammar host (grammar-host.ts) while this thread keeps
// serving, and a spec whose compile runs past the deadline is refused. Ordering assertions only
// (no timing thresholds).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  GrammarCompiler, GrammarSpecError, GrammarTimeoutError, countAllowed, type GrammarSpec, type GrammarVocab,
} from '../../src/sampling/grammar/index.ts';

/** A synthetic 32k-token byte-level vocabulary: big enough that compiling a large schema takes a while. */
function bigVocab(size = 32_000): GrammarVocab {
  const printable: string[] = [];
  for (let c = 0x21; c < 0x7f; c++) if (c !== 0x22 && c !== 0x5c) printable.push(String.fromCharCode(c));
  const tokens = ['<eos>', ...printable];
  const seen = new Set(tokens);
  let s = 99;
  const next = () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s;
  };
  while (tokens.length < size) {
    let t = '';
    const len = 2 + (next() % 6);
    for (let i = 0; i < len; i++) t += printable[next() % printable.length];
    if (!seen.has(t)) {
      seen.add(t);
      tokens.push(t);
    }
  }
  return { tokens, vocabType: 'raw', prependSpace: false, vocabSize: size, stopTokenIds: [0], encode: () => [], decode: () => '' };
}

/** 40 required fields of mixed kinds: hundreds of milliseconds to compile against 32k tokens */
const BIG: GrammarSpec = {
  type: 'json_schema',
  schema: {
    type: 'object',
    properties: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`field_${i}`,
      i % 4 === 0 ? { type: 'string', maxLength: 20 } : i % 4 === 1 ? { type: 'integer', minimum: 0, maximum: 1000 }
        : i % 4 === 2 ? { enum: ['a', 'b', 'c'] } : { type: 'array', items: { type: 'object', properties: { x: { type: 'number' }, y: { type: 'string' } }, required: ['x', 'y'] } }])),
    required: Array.from({ length: 40 }, (_, i) => `field_${i}`),
    additionalProperties: false,
  },
};

const VOCAB = bigVocab();

/**
 * Runs `work` while counting event-loop turns and /health answers of a local HTTP server polled
 * back to back: what this thread managed to do while `work` was pending.
 */
async function servedDuring<T>(work: () => Promise<T>): Promise<{ value: T; turns: number; health: number }> {
  const server = http.createServer((_req, res) => res.end('ok'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/health`;
  let pending = true, turns = 0, health = 0;
  const spin = () => {
    if (!pending) return;
    turns++;
    setImmediate(spin);
  };
  const poll = (async () => {
    while (pending) {
      const r = await fetch(url);
      await r.text();
      if (pending) health++;
    }
  })();
  try {
    setImmediate(spin);
    const value = await work();
    pending = false;
    // counted up to the moment `work` finished (a fetch that completes later does not count)
    const result = { value, turns, health };
    await poll;
    return result;
  } finally {
    pending = false;
    server.close();
  }
}

test('a large schema is checked and compiled off this thread while it serves /health; without workers it blocks it', async () => {
  const off = new GrammarCompiler(VOCAB);
  await off.warm();
  assert.equal(off.stats.offThread, true);
  const r = await servedDuring(() => off.compile(BIG));
  assert.ok(r.turns > 0, 'the event loop turned while the host compiled');
  assert.ok(r.health > 0, '/health was answered while the host compiled');
  assert.ok(off.stats.lastCheckMs > 0 && off.stats.lastCompileMs > 0);
  // the compiled grammar works: its matcher's masks come from its host
  const m = r.value.createMatcher();
  assert.ok(countAllowed(m.mask(), VOCAB.vocabSize) > 0);
  m.dispose();
  r.value.release();
  // a cache hit compiles nothing
  const hit = await off.compile(BIG);
  assert.equal(hit.compileMs, 0);
  hit.release();
  await off.close();

  // the same compile on this thread: not one turn of the event loop until it is done
  const inThread = new GrammarCompiler(VOCAB, { worker: false });
  await inThread.warm();
  const b = await servedDuring(() => inThread.compile(BIG));
  assert.equal(b.turns, 0);
  assert.equal(b.health, 0);
  b.value.release();
});

/**
 * Length-limited strings, each limit different: xgrammar 0.1.27 compiles these very slowly and
 * superlinearly (against this vocabulary on the 2-core VM: 20 such fields 8 s, 50 fields 50 s).
 */
const HEAVY: GrammarSpec = {
  type: 'json_schema',
  schema: {
    type: 'object',
    properties: Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`f${i}`, { type: 'string', maxLength: 20 + i }])),
    required: Array.from({ length: 30 }, (_, i) => `f${i}`),
  },
};

test('a spec whose compile runs past the deadline is refused (a GrammarSpecError: 400); a fresh host takes the next one', async () => {
  // the deadline is far below HEAVY's compile time (well over 10 s here) and far above a small spec's (tens of ms)
  const c = new GrammarCompiler(VOCAB, { compileTimeoutMs: 1500 });
  const before = await c.compile({ type: 'choice', choices: ['yes', 'no'] });
  const main = await servedDuring(() => assert.rejects(c.compile(HEAVY), (err: unknown) => {
    assert.ok(err instanceof GrammarTimeoutError && err instanceof GrammarSpecError, String(err));
    assert.match((err as Error).message, /^JSON schema is too complex: compiling it took longer than 1500 ms$/);
    return true;
  }));
  assert.ok(main.health > 0, 'this thread served meanwhile: the runaway compile ran on a host');
  assert.equal(c.stats.timeouts, 1);
  assert.equal(c.stats.invalid, 1);
  assert.equal(c.stats.compiles, 1, 'HEAVY never compiled');
  // the next requests go on (a fresh host for the next compile)
  await assert.rejects(c.compile({ type: 'regex', pattern: '(ab' }), /^GrammarSpecError: invalid regex: Regex parsing error/);
  const after = await c.compile({ type: 'regex', pattern: '[0-9]{3}' });
  // grammars compiled before the timeout keep working
  for (const g of [before, after]) {
    const m = g.createMatcher();
    assert.ok(countAllowed(m.mask(), VOCAB.vocabSize) > 0);
    m.dispose();
    g.release();
  }
  await c.close();
});

test('concurrent requests for one new spec share one compile; invalid specs get the same message on or off the worker', async () => {
  const c = new GrammarCompiler(VOCAB);
  const spec: GrammarSpec = { type: 'json_schema', schema: { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 12 } }, required: ['n'] } };
  const all = await Promise.all([c.compile(spec), c.compile(spec), c.compile(spec), c.compile(spec)]);
  assert.equal(c.stats.compiles, 1);
  assert.equal(c.stats.cacheHits, 3);
  assert.equal(all.filter((g) => g.compileMs > 0).length, 1);
  for (const g of all) g.release();
  const inThread = new GrammarCompiler(VOCAB, { worker: false });
  const bad: GrammarSpec[] = [
    { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'strang' } } } },
    { type: 'regex', pattern: '[a-' },
    { type: 'ebnf', grammar: 'root ::= "a" | ' },
    { type: 'choice', choices: [] },
    { type: 'structural_tag', format: { type: 'tag', begin: '<a>', content: { type: 'json_schema', json_schema: { type: 'nope' } }, end: '</a>' } },
  ];
  for (const spec of bad) {
    const message = async (k: GrammarCompiler) => {
      try {
        await k.compile(spec);
      } catch (err) {
        assert.ok(err instanceof GrammarSpecError, String(err));
        return (err as Error).message;
      }
      assert.fail(`${JSON.stringify(spec)} compiled`);
    };
    assert.equal(await message(c), await message(inThread));
  }
  await c.checkJsonSchema({ type: 'object' });
  await assert.rejects(c.checkJsonSchema({ type: 'object', required: 3 }), GrammarSpecError);
  assert.equal(c.stats.invalid, bad.length + 1);
  await c.close();
});
