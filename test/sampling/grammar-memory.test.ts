// Bounded grammars and bounded grammar memory: specs that can never be finished (a required
// $ref recursion with no base case), or that are too big, too deep or need too long an output,
// are GrammarSpecErrors before anything compiles them; large but fine ones still compile; the
// compiled-grammar cache stays within its byte budget (least recently used evicted, a grammar
// heavier than the budget refused); a grammar host that outgrew its bound retires and goes once
// nothing uses it; a check worker that holds too much is replaced. Memory is asserted through
// the wasm heaps' sizes (stats.heapBytes), not timings.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  GrammarCompiler, GrammarSpecError, countAllowed, type CompiledGrammar, type GrammarSpec,
} from '../../src/sampling/grammar/index.ts';
import { asciiGrammarVocab as vocabOf } from '../helpers/grammar-vocab.ts';
import { WorkerChecker } from '../../src/sampling/grammar/compile-worker-client.ts';


const SMALL = vocabOf(512);
const MIB = 2 ** 20;

async function refused(c: GrammarCompiler, spec: GrammarSpec, message: RegExp): Promise<void> {
  await assert.rejects(c.compile(spec), (e: unknown) => {
    assert.ok(e instanceof GrammarSpecError, String(e));
    assert.match((e as Error).message, message);
    return true;
  }, JSON.stringify(spec).slice(0, 200));
}

async function compiles(c: GrammarCompiler, spec: GrammarSpec): Promise<void> {
  const g = await c.compile(spec);
  const m = g.createMatcher();
  assert.ok(countAllowed(m.mask(), c.vocab.vocabSize) > 0, JSON.stringify(spec).slice(0, 200));
  m.dispose();
  g.release();
}

test('a schema no JSON satisfies, or with a part that can never end, is refused with the reason', async () => {
  const c = new GrammarCompiler(SMALL);
  try {
    const loop = { type: 'object', properties: { next: { $ref: '#/$defs/loop' } }, required: ['next'] };
    await refused(c, { type: 'json_schema', schema: { type: 'object', properties: { a: { $ref: '#' } }, required: ['a'] } },
      /^invalid JSON schema: no JSON value satisfies it: its recursion \(a \$ref back into itself\) has no way to end$/);
    await refused(c, { type: 'json_schema', schema: { $defs: { loop }, $ref: '#/$defs/loop' } }, /no JSON value satisfies it/);
    await refused(c, { type: 'json_schema', schema: { $defs: { loop }, anyOf: [{ type: 'integer' }, { $ref: '#/$defs/loop' }] } },
      /^invalid JSON schema: part of it can never end .*so an output that enters it never ends$/);
    await refused(c, { type: 'ebnf', grammar: 'root ::= "a" | "b" x\nx ::= "c" x' }, /^invalid grammar: rule "x" can never finish/);
    // a checked tool schema is refused the same way
    await assert.rejects(c.checkJsonSchema({ type: 'array', items: { $ref: '#' }, minItems: 1 }), /no JSON value satisfies it/);
    // what xgrammar would ignore (not, allOf) or drop (a required property it does not know), where it must hold
    for (const [schema, why] of [
      [{ not: {} }, /"not": \{\} at # excludes every value/],
      [{ type: 'object', properties: { a: { allOf: [{ type: 'string' }, { type: 'integer' }] } }, required: ['a'] }, /allOf at #\/properties\/a requires types that exclude each other/],
      [{ type: [] }, /"type": \[\] at # allows no type/],
      [{ type: 'object', properties: { b: { type: 'integer' } }, required: ['a'] }, /property "a" is required at # but not in its properties/],
    ] as [unknown, RegExp][]) await refused(c, { type: 'json_schema', schema }, new RegExp(`^invalid JSON schema: no JSON value satisfies it: ${why.source}`));
    await refused(c, { type: 'json_schema', schema: { type: 'array', items: { enum: [] } } }, /^invalid JSON schema: "enum": \[\] at #\/items allows no value$/);
    // only where it must hold: an unused definition, or other properties allowed, are fine
    await compiles(c, { type: 'json_schema', schema: { $defs: { never: { not: {} } }, type: 'integer' } });
    await compiles(c, { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: true } });
    // recursion with a way out is fine
    await compiles(c, { type: 'json_schema', schema: { type: 'object', properties: { a: { $ref: '#' } } } });
    await compiles(c, { type: 'json_schema', schema: { type: 'array', items: { $ref: '#' } } });
    await compiles(c, { type: 'ebnf', grammar: 'root ::= "a" | "b" root' });
    assert.equal(c.stats.compiles, 5, 'the refused specs never reached this thread');
  } finally {
    await c.close();
  }
});

test('limits: spec size, nesting depth and the shortest output, each named; large but fine specs still compile', async () => {
  const c = new GrammarCompiler(SMALL, { limits: { maxSpecBytes: 20_000 } });
  try {
    const nest = (n: number) => {
      let s: unknown = { type: 'integer' };
      for (let i = 0; i < n; i++) s = { type: 'object', properties: { a: s }, required: ['a'] };
      return s;
    };
    await refused(c, { type: 'json_schema', schema: nest(33) }, /^invalid JSON schema: the schema nests subschemas more than 32 deep \(at #\/properties\/a\//);
    await compiles(c, { type: 'json_schema', schema: nest(30) });
    // through $refs: each one followed is a level (xgrammar expands it in place)
    const defs: Record<string, unknown> = { d0: { type: 'integer' } };
    for (let i = 1; i <= 40; i++) defs[`d${i}`] = { type: 'array', items: { $ref: `#/$defs/d${i - 1}` } };
    await refused(c, { type: 'json_schema', schema: { $defs: defs, $ref: '#/$defs/d40' } }, /nests subschemas more than 32 deep/);
    await refused(c, { type: 'ebnf', grammar: `root ::= ${'('.repeat(40)}"a"${')'.repeat(40)}` }, /^invalid grammar: the grammar nests parentheses more than 32 deep$/);
    await refused(c, { type: 'regex', pattern: `${'('.repeat(33)}a${')'.repeat(33)}` }, /^invalid regex: the pattern nests parentheses more than 32 deep$/);
    const wide = (n: number) => ({
      type: 'object',
      properties: Object.fromEntries(Array.from({ length: n }, (_, i) => [`property_${i}`, i % 2 ? { type: 'integer' } : { enum: ['x', 'y'] }])),
      required: Array.from({ length: n }, (_, i) => `property_${i}`),
    });
    await refused(c, { type: 'json_schema', schema: wide(600) }, /^invalid JSON schema: the JSON schema is \d+ bytes as JSON, more than the limit of 20000$/);
    await compiles(c, { type: 'json_schema', schema: wide(200) });
    // the shortest output: counts that multiply, and forced text
    await refused(c, { type: 'json_schema', schema: { type: 'array', items: { type: 'integer' }, minItems: 100_000 } },
      /^invalid JSON schema: its shortest valid JSON is 300000 characters, more than the limit of 32768$/);
    await refused(c, { type: 'json_schema', schema: { type: 'array', minItems: 40, items: { type: 'array', minItems: 40, items: { type: 'array', minItems: 40, items: { type: 'integer' } } } } },
      /shortest valid JSON is \d+ characters, more than the limit of 32768/);
    await refused(c, { type: 'regex', pattern: '(ab{1000}){1000}' }, /^invalid regex: its shortest output is 1001000 characters, more than the limit of 32768$/);
    await refused(c, { type: 'ebnf', grammar: 'root ::= "x" | "y" big\nbig ::= "z"{40000}' }, /^invalid grammar: the shortest text of rule "big" is 40000 characters/);
    await compiles(c, { type: 'json_schema', schema: { type: 'array', items: { type: 'integer' }, minItems: 1000 } });
    await compiles(c, { type: 'json_schema', schema: { type: 'string', minLength: 20_000 } });
  } finally {
    await c.close();
  }
});

/** n distinct schemas that each compile to a few hundred KiB over a 32k vocabulary */
const strings = (i: number): GrammarSpec => ({ type: 'json_schema', schema: { type: 'array', items: { type: 'string', maxLength: 4 + (i % 4) }, maxItems: 100 + i } });

test('the compiled-grammar cache stays within its byte budget and evicts the least recently used', async () => {
  const budget = 1 * MIB;
  const c = new GrammarCompiler(vocabOf(32_000), { cacheBytes: budget });
  try {
    const first = await c.compile(strings(0));
    first.release();
    const one = c.stats.cacheBytes;
    assert.ok(one > 64 * 1024 && one < budget / 2, `one grammar weighs ${one} bytes`);
    for (let i = 1; i < 8; i++) {
      (await c.compile(strings(i))).release();
      // the first stays the most recently used: always a hit
      const hits = c.stats.cacheHits;
      (await c.compile(strings(0))).release();
      assert.equal(c.stats.cacheHits, hits + 1, `strings(0) after ${i}`);
      const s = c.stats;
      assert.ok(s.cacheBytes <= budget, `cache ${s.cacheBytes} > budget ${budget}`);
      assert.equal(s.cacheCapacityBytes, budget);
    }
    const s = c.stats;
    assert.ok(s.evictions >= 4, `evictions ${s.evictions}`);
    assert.ok(s.cacheEntries >= 2 && s.cacheEntries < 8, `entries ${s.cacheEntries}`);
    // an evicted one compiles again; the most recently used one does not
    const compiles = s.compiles;
    (await c.compile(strings(1))).release();
    assert.equal(c.stats.compiles, compiles + 1);
    (await c.compile(strings(0))).release();
    assert.equal(c.stats.compiles, compiles + 1);
    assert.ok(c.stats.cacheBytes <= budget);
  } finally {
    await c.close();
  }
});

test('a grammar heavier than the whole budget is refused while it compiles', async () => {
  const c = new GrammarCompiler(vocabOf(32_000), { cacheBytes: MIB });
  try {
    const heavy: GrammarSpec = {
      type: 'json_schema',
      schema: { type: 'object', properties: Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`f${i}`, { type: 'array', items: { type: 'string', maxLength: 3 + i } }])) },
    };
    await refused(c, heavy, /^JSON schema is too large: its compiled grammar needs (more than )?\d+\.\d MiB, more than the grammar cache holds \(1\.0 MiB\)$/);
    assert.equal(c.stats.compiles, 0);
    assert.equal(c.stats.cacheBytes, 0);
    await compiles(c, strings(0));
  } finally {
    await c.close();
  }
});

test('a grammar host whose heap outgrew its bound retires: it takes no new compile, and goes once its last lease and matcher are', async () => {
  // 1 MiB of budget: a host may grow 3 MiB past its start. Leases of evicted grammars keep their
  // memory in the host until released, so holding enough of them grows its heap.
  const c = new GrammarCompiler(vocabOf(32_000), { cacheBytes: MIB, maxHosts: 1 });
  try {
    await c.warm();
    const start = c.stats.heapBytes;
    const [first] = c.hostStates();
    const held: CompiledGrammar[] = [];
    let i = 0;
    while (c.stats.instanceReplacements === 0) {
      assert.ok(i < 200, 'the host was never replaced');
      const g = await c.compile(strings(100 + i++));
      g.createMatcher().dispose(); // a request's rows start right away, and end
      held.push(g);
    }
    // it retired: out of the cache, but its leases still start rows there
    const retiring = c.hostStates().find((h) => h.id === first!.id)!;
    assert.ok(retiring.retiring && retiring.heapBytes > start + 3 * MIB, JSON.stringify(retiring));
    assert.ok(held.every((g) => g.hostId === first!.id));
    const matcher = held[0]!.createMatcher();
    assert.ok(countAllowed(matcher.mask(), c.vocab.vocabSize) > 0);
    // new compiles go to a fresh host (a retiring one does not count against maxHosts)
    const next = await c.compile(strings(0));
    assert.notEqual(next.hostId, first!.id);
    next.release();
    for (const g of held) g.release();
    const old = c.hostStates().find((h) => h.id === first!.id);
    assert.ok(old, 'a live matcher keeps its host');
    const before = c.stats.heapBytes;
    matcher.accept(c.vocab.tokens.indexOf('['));
    matcher.dispose();
    // the old host is gone, and its heap with it
    assert.deepEqual(c.hostStates().map((h) => h.id), [next.hostId]);
    assert.equal(c.stats.heapBytes, before - old.heapBytes);
    assert.ok(c.stats.cacheBytes <= MIB);
    assert.equal(c.stats.hostFailures, 0);
  } finally {
    await c.close();
  }
});

test('a check worker that holds more than its bound after a check is replaced, and checks go on', async () => {
  const w = new WorkerChecker(0, { recycleBytes: 1 });
  try {
    for (let i = 0; i < 3; i++) {
      const r = await w.check({ type: 'json_schema', schema: { type: 'string', maxLength: 3 + i } });
      assert.equal(r.prepared.kind, 'ebnf');
    }
    await assert.rejects(w.check({ type: 'json_schema', schema: { type: 'object', properties: { a: { $ref: '#' } }, required: ['a'] } }), GrammarSpecError);
    assert.equal(w.recycled, 4);
  } finally {
    await w.close();
  }
});
