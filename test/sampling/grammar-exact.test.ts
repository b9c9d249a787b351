// The grammars llmts writes itself because xgrammar 0.1.27 compiles them wrongly: JSON-schema
// numeric ranges (minimum/maximum/exclusive*), enums (also anyOf/oneOf of consts), guided_choice. Checked by brute force
// through real matchers on a byte vocabulary (token id = byte): every string a matcher accepts is
// a member, and (up to the fraction digits a number range generates) every member is accepted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { GrammarCompiler, GrammarRowError, maskAllows, type GrammarSpec, type GrammarVocab } from '../../src/sampling/grammar/index.ts';
import { byteLevelCharToByte } from '../../src/artifacts/byte-level.ts';
import { dfaEbnf, alt, str } from '../../src/sampling/grammar/dfa.ts';

const EOS = 256;
const tokens: string[] = new Array(EOS + 1).fill('');
for (const [ch, b] of byteLevelCharToByte()) tokens[b] = ch;
tokens[EOS] = '<eos>';
const VOCAB: GrammarVocab = {
  tokens, vocabType: 'byte_level', prependSpace: false, vocabSize: EOS + 1, stopTokenIds: [EOS],
  encode: (t) => [...Buffer.from(t)], decode: (ids) => Buffer.from(ids).toString(),
};
// in-thread: these tests are about what the grammars accept, not where they compile
const compiler = new GrammarCompiler(VOCAB, { worker: false });

/** spec -> "does a row under it accept exactly this text, then end?" */
async function acceptor(spec: GrammarSpec): Promise<(s: string) => boolean> {
  const g = await compiler.compile(spec);
  return (s) => {
    const m = g.createMatcher({ jumpForward: false });
    try {
      for (const b of Buffer.from(s)) {
        if (!maskAllows(m.mask(), b)) return false;
        m.accept(b);
      }
      return maskAllows(m.mask(), EOS);
    } catch (err) {
      if (err instanceof GrammarRowError) return false;
      throw err;
    } finally {
      m.dispose();
    }
  };
}

test('integer ranges: exactly the integers in range, no leading zeros, no "-0" (xgrammar allowed 121 under maximum 120)', async () => {
  const bounds = [undefined, -125, -7, 0, 1, 5, 19, 100, 120, 999];
  let checked = 0;
  for (const lo of bounds) for (const hi of bounds) {
    if (lo !== undefined && hi !== undefined && lo > hi) continue;
    if (lo === undefined && hi === undefined) continue;
    for (const exclusive of [false, true]) {
      if (exclusive && lo !== undefined && hi !== undefined && hi - lo < 2) continue;
      const schema: Record<string, unknown> = { type: 'integer' };
      if (lo !== undefined) schema[exclusive ? 'exclusiveMinimum' : 'minimum'] = lo;
      if (hi !== undefined) schema[exclusive ? 'exclusiveMaximum' : 'maximum'] = hi;
      const ok = await acceptor({ type: 'json_schema', schema });
      for (let n = -300; n <= 1100; n++) {
        const want = (lo === undefined || (exclusive ? n > lo : n >= lo)) && (hi === undefined || (exclusive ? n < hi : n <= hi));
        assert.equal(ok(String(n)), want, `${JSON.stringify(schema)} on ${n}`);
      }
      for (const s of ['-0', '00', '01', '-', '1.5', '1e3', '+1', '']) assert.equal(ok(s), false, `${JSON.stringify(schema)} on ${JSON.stringify(s)}`);
      checked++;
    }
  }
  assert.ok(checked > 90);
  // several bounds at once: the tightest of each side
  const both = await acceptor({ type: 'json_schema', schema: { type: 'integer', minimum: 3, exclusiveMinimum: 3, maximum: 10, exclusiveMaximum: 12 } });
  for (let n = -5; n < 20; n++) assert.equal(both(String(n)), n > 3 && n <= 10, String(n));
});

test('number ranges: every accepted text is valid JSON in range; every value with up to 6 fraction digits is accepted', async () => {
  const bounds = [undefined, -1.5, -0.25, 0, 0.1, 1, 2.75, 99.99];
  const probes = new Set<string>();
  for (let i = -1200; i <= 1200; i++) probes.add((i / 8).toString());
  for (let i = -300; i <= 300; i++) for (const s of [(i / 100).toFixed(2), (i / 10).toFixed(1), String(i), (i / 1000).toFixed(3)]) probes.add(s);
  for (const s of ['0.1', '0.10', '0.0999999', '99.99', '99.990', '99.991', '99.989999', '-1.5', '-1.50', '-1.49', '-1.51', '-1.500001', '2.750000', '2.7500001',
    '-0', '-0.0', '.5', '-', '1.', '1e2', '00.5', '01', '+1', '0.1234567']) probes.add(s);
  const json = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?$/;
  for (const lo of bounds) for (const hi of bounds) {
    if (lo === undefined && hi === undefined) continue;
    if (lo !== undefined && hi !== undefined && lo >= hi) continue;
    for (const exclusive of [false, true]) {
      const schema: Record<string, unknown> = { type: 'number' };
      if (lo !== undefined) schema[exclusive ? 'exclusiveMinimum' : 'minimum'] = lo;
      if (hi !== undefined) schema[exclusive ? 'exclusiveMaximum' : 'maximum'] = hi;
      const ok = await acceptor({ type: 'json_schema', schema });
      for (const s of probes) {
        const v = Number(s);
        const inRange = json.test(s) && !/^-0(\.0*)?$/.test(s) && (lo === undefined || (exclusive ? v > lo : v >= lo)) && (hi === undefined || (exclusive ? v < hi : v <= hi));
        const got = ok(s);
        if (got) assert.ok(inRange, `${JSON.stringify(schema)} accepted ${s}`);
        else if (inRange && (s.split('.')[1]?.length ?? 0) <= 6) assert.fail(`${JSON.stringify(schema)} refused ${s}`);
      }
    }
  }
});

/** small words over a 3-letter alphabet: many share prefixes and suffixes (what breaks xgrammar) */
function randomWords(next: () => number): string[] {
  const n = 2 + (next() % 4);
  return [...new Set(Array.from({ length: n }, () => Array.from({ length: 1 + (next() % 5) }, () => 'abx'[next() % 3]).join('')))];
}

function near(words: string[], next: () => number): string[] {
  const out: string[] = [];
  for (const w of words) {
    for (const c of 'abx') out.push(w + c, c + w, w.slice(0, -1) + c);
    out.push(w.slice(0, -1), w.slice(1), w + w);
  }
  for (let k = 0; k < 10; k++) out.push(Array.from({ length: 1 + (next() % 6) }, () => 'abx'[next() % 3]).join(''));
  return out;
}

test('enums and guided_choice accept exactly their members (xgrammar: enum ["xx", "x"] accepted "xxx")', async () => {
  let s = 17;
  const next = () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s;
  };
  for (let trial = 0; trial < 120; trial++) {
    const words = randomWords(next);
    const members = new Set(words);
    const probes = [...words, ...near(words, next)];
    const choice = await acceptor({ type: 'choice', choices: words });
    const en = await acceptor({ type: 'json_schema', schema: { enum: words } });
    const typed = await acceptor({ type: 'json_schema', schema: { type: 'object', properties: { k: { type: 'string', enum: [...words, 7] } }, required: ['k'] } });
    const union = await acceptor({ type: 'json_schema', schema: { anyOf: words.map((w) => ({ const: w, title: w })) } });
    for (const p of probes) {
      assert.equal(choice(p), members.has(p), `choice ${JSON.stringify(words)} on ${p}`);
      assert.equal(en(JSON.stringify(p)), members.has(p), `enum ${JSON.stringify(words)} on ${JSON.stringify(p)}`);
      assert.equal(union(JSON.stringify(p)), members.has(p), `anyOf of consts ${JSON.stringify(words)} on ${JSON.stringify(p)}`);
      assert.equal(typed(`{"k": ${JSON.stringify(p)}}`), members.has(p), `typed enum ${JSON.stringify(words)} on ${p}`);
    }
    assert.equal(typed('{"k": 7}'), false, 'a value of another type than the node is not generated');
  }
  // oneOf: a value two branches allow is not allowed
  const one = await acceptor({ type: 'json_schema', schema: { oneOf: [{ enum: ['a', 'ab'] }, { enum: ['ab', 'abc'] }, { const: 'b' }] } });
  for (const [text, want] of [['"a"', true], ['"ab"', false], ['"abc"', true], ['"b"', true], ['"abcc"', false]] as const) assert.equal(one(text), want, text);
  // mixed-type enums (numbers, null, objects) in the output's one-line layout
  const mixed = await acceptor({ type: 'json_schema', schema: { enum: [1, 10, 'a', null, { x: [1, 2] }, true] } });
  for (const [text, want] of [['1', true], ['10', true], ['100', false], ['"a"', true], ['null', true], ['{"x": [1, 2]}', true], ['true', true], ['false', false]] as const)
    assert.equal(mixed(text), want, text);
});

test('canary: xgrammar 0.1.27 still merges alternations wrongly (drop dfa.ts workarounds once this fails)', async () => {
  // a plain alternation written by hand, which llmts passes through as it is
  const raw = await acceptor({ type: 'ebnf', grammar: 'root ::= "baaa" | "baa"' });
  assert.equal(raw('baaaa'), true, 'if this fails, xgrammar fixed mlc-ai/xgrammar#618: the rewrite in schema-rewrite.ts may be unnecessary');
  // the same language, written deterministically
  const g = dfaEbnf(alt(str('baaa'), str('baa')), 'x')!;
  const fixed = await acceptor({ type: 'ebnf', grammar: [`root ::= ${g.expr}`, ...g.rules].join('\n') });
  assert.deepEqual(['baa', 'baaa', 'baaaa', 'ba'].map(fixed), [true, true, false, false]);
});
