// Grammar masks and compilation: the bitmask loop against a plain reference, the vocabulary as
// xgrammar sees it, compiler errors as messages (and the compiler surviving them), the cache.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';
import {
  GrammarCompiler, GrammarRowError, GrammarSpecError, applyTokenBitmask, countAllowed, grammarVocabFrom, maskAllows, type GrammarSpec,
} from '../../src/sampling/grammar/index.ts';
import { processLogits } from '../../src/sampling/sampler.ts';
import { resolveSamplingParams } from '../../src/sampling/params.ts';
import { utf8Step } from '../../src/sampling/grammar/utf8.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const FIXTURE = new URL('../fixtures/qwen3/', import.meta.url).pathname;

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 2 ** 32;
  };
}

test('applyTokenBitmask matches a per-token reference for odd sizes and every word pattern', () => {
  for (const V of [1, 31, 32, 33, 95, 259, 512, 8192 + 7]) {
    const r = rng(V);
    const words = (V + 31) >>> 5;
    for (const style of ['random', 'zeros', 'ones', 'mixed', 'short']) {
      const mask = new Int32Array(style === 'short' ? Math.max(0, words - 1) : words);
      for (let w = 0; w < mask.length; w++) {
        const pick = style === 'mixed' ? Math.floor(r() * 3) : -1;
        mask[w] = style === 'zeros' || pick === 0 ? 0 : style === 'ones' || pick === 1 ? -1 : (r() * 2 ** 32) | 0;
      }
      const logits = Float32Array.from({ length: V }, () => r() * 10 - 5);
      const want = logits.map((x, id) => (((mask[id >> 5] ?? 0) >>> (id & 31)) & 1 ? x : -Infinity));
      const got = logits.slice();
      applyTokenBitmask(got, mask);
      assert.deepEqual(got, want, `V=${V} ${style}`);
      let allowed = 0;
      for (let id = 0; id < V; id++) if (maskAllows(mask, id)) allowed++;
      assert.equal(countAllowed(mask, V), allowed);
    }
  }
});

test('processLogits applies the mask after bias and never touches the raw row', () => {
  const raw = Float32Array.from([1, 2, 3, 4, 5]);
  const p = resolveSamplingParams({ logitBias: { 0: 10 } });
  const x = processLogits(raw, p, undefined, Int32Array.from([0b10011]));
  assert.deepEqual([...x], [11, 2, -Infinity, -Infinity, 5]);
  assert.deepEqual([...raw], [1, 2, 3, 4, 5]);
  assert.equal(processLogits(raw, resolveSamplingParams({})), raw);
});

test('the vocabulary as xgrammar sees it: byte-level tokens, specials masked, stop tokens kept', () => {
  const tok = TextTokenizer.fromDir(FIXTURE);
  const v = grammarVocabFrom(tok, 520, [0, 2]);
  assert.equal(v.vocabType, 'byte_level');
  assert.equal(v.vocabSize, 520);
  assert.equal(v.tokens[1], ''); // <|im_start|>: special, not a stop token
  assert.equal(v.tokens[2], '<|im_end|>');
  assert.deepEqual(v.stopTokenIds, [0, 2]);
  assert.equal(v.decode(v.encode('{"a": 1}')), '{"a": 1}');
});

test('compiler: invalid schemas, regexes and grammars give the compiler message; the compiler survives them', async () => {
  const tok = TextTokenizer.fromDir(FIXTURE);
  const c = new GrammarCompiler(grammarVocabFrom(tok, 512, [0, 2]), { cacheSize: 2 });
  const bad: [GrammarSpec, RegExp][] = [
    [{ type: 'json_schema', schema: { type: 12 } }, /^invalid JSON schema: Type should be a string/],
    [{ type: 'json_schema', schema: { type: 'object', properties: { a: { $ref: '#/defs/x' } } } }, /^invalid JSON schema: .*defs/],
    [{ type: 'json_schema', schema: [1] }, /^invalid JSON schema: the schema must be a JSON object/],
    [{ type: 'regex', pattern: '(ab' }, /^invalid regex: Regex parsing error at position \d+: The parenthesis is not closed/],
    [{ type: 'ebnf', grammar: 'root ::= ' }, /^invalid grammar: EBNF parser error at line 1/],
    [{ type: 'ebnf', grammar: 'root ::= undefined_rule' }, /^invalid grammar: .*undefined_rule/],
    [{ type: 'choice', choices: [] }, /^invalid choice: the list of choices is empty/],
    [{ type: 'structural_tag', format: { type: 'tag', begin: '<a>', content: { type: 'json_schema', json_schema: { type: 'nope' } }, end: '</a>' } }, /^invalid structural tag: /],
  ];
  for (const [spec, message] of bad) {
    await assert.rejects(c.compile(spec), (e: unknown) => {
      assert.ok(e instanceof GrammarSpecError, String(e));
      assert.match((e as Error).message, message);
      return true;
    });
  }
  await assert.rejects(c.checkJsonSchema({ type: 'object', required: 'x' }), GrammarSpecError);
  await c.checkJsonSchema({ type: 'object', properties: { x: { type: 'string' } } });
  // after all those aborts a matcher still works, and the cache serves repeats
  const spec: GrammarSpec = { type: 'json_schema', schema: { type: 'object', properties: { k: { const: 'constant value' } }, required: ['k'] } };
  const first = await c.compile(spec);
  assert.ok(first.compileMs > 0);
  const again = await c.compile(spec);
  assert.equal(again.compileMs, 0);
  const m = first.createMatcher();
  assert.ok(countAllowed(m.mask(), 512) > 0);
  const forced = m.jumpForward(100);
  assert.equal(v(tok, forced), '{"k": "constant value"'.slice(0, v(tok, forced).length));
  assert.ok(v(tok, forced).startsWith('{"k": "constant'));
  m.dispose();
  // eviction (cache of 2) frees compiled grammars, never the ones still leased or matching
  const m2 = again.createMatcher();
  for (const pattern of ['a+', 'b+', 'c+']) (await c.compile({ type: 'regex', pattern })).release();
  first.release();
  again.release();
  assert.ok(countAllowed(m2.mask(), 512) > 0);
  m2.accept(tok.encode('{', { addSpecialTokens: false })[0]!);
  m2.dispose();
  assert.equal(c.stats.cacheHits, 1);
});

function v(tok: TextTokenizer, ids: number[]): string {
  return tok.decode(ids);
}

test('grammar rows stay valid UTF-8 and JSON strings exclude raw control characters (xgrammar gaps)', async () => {
  const tok = TextTokenizer.fromDir(writeTinyLlama()); // 256 byte tokens: ids are the bytes
  const c = new GrammarCompiler(grammarVocabFrom(tok, 259, [256, 258]));
  const g = await c.compile({ type: 'json_schema', schema: { type: 'object', properties: { s: { type: 'string', maxLength: 4 } }, required: ['s'] } });
  const m = g.createMatcher({ jumpForward: false });
  for (const ch of '{"s": "') m.accept(ch.charCodeAt(0));
  const allowed = (id: number) => maskAllows(m.mask(), id);
  assert.ok(allowed(0x61) && allowed(0xc3) && allowed(0xe0) && allowed(0xf0));
  for (const bad of [0x0f, 0x00, 0x80, 0xbf, 0xc0, 0xc1, 0xf5, 0xff]) assert.ok(!allowed(bad), `byte ${bad.toString(16)} allowed`);
  m.accept(0xe0); // a 3-byte lead: the next byte must be A0-BF (no overlong form)
  assert.ok(!allowed(0x80) && !allowed(0x9f) && allowed(0xa0) && allowed(0xbf) && !allowed(0x61) && !allowed(0x22));
  m.accept(0xa0);
  assert.ok(allowed(0x80) && !allowed(0x22));
  m.accept(0x80);
  assert.ok(allowed(0x22) && allowed(0x61));
  m.dispose();
  for (const [s, b, want] of [[0, 0x41, 0], [0, 0xc2, 1], [0, 0xe0, 3], [0, 0xed, 4], [0, 0xf0, 6], [0, 0xf4, 7], [4, 0xa0, -1], [4, 0x9f, 1], [3, 0xa0, 1], [5, 0x80, 2], [7, 0x90, -1], [6, 0x8f, -1], [1, 0xbf, 0], [0, 0x80, -1], [0, 0xf8, -1]] as const)
    assert.equal(utf8Step(s, b), want, `${s} ${b.toString(16)}`);
});

test('a grammar host that dies ends only the rows matching on it; later compiles get a fresh host', async () => {
  const tok = TextTokenizer.fromDir(FIXTURE);
  const c = new GrammarCompiler(grammarVocabFrom(tok, 512, [0, 2]), { maxHosts: 2 });
  const id = (text: string) => tok.encode(text, { addSpecialTokens: false })[0]!;
  try {
    const spec: GrammarSpec = { type: 'choice', choices: ['yes', 'no'] };
    const g = await c.compile(spec);
    const live = g.createMatcher();
    assert.ok(countAllowed(live.mask(), 512) > 0);
    // another grammar, on another host (a compile never lands on a host with live matchers)
    const other = await c.compile({ type: 'choice', choices: ['up', 'down'] });
    assert.notEqual(other.hostId, g.hostId);
    const bystander = other.createMatcher();
    assert.ok(countAllowed(bystander.mask(), 512) > 0);
    // what a crash of the host's thread does (a wasm abort while matching ends the same way)
    const hosts = (c as unknown as { hosts: { h: { id: number; worker?: { terminate(): Promise<number> } } }[] }).hosts;
    await hosts.find((h) => h.h.id === g.hostId)!.h.worker!.terminate();
    assert.throws(() => live.accept(id('y')), GrammarRowError);
    assert.throws(() => live.mask(), GrammarRowError);
    live.dispose();
    g.release();
    bystander.accept(id('u'));
    assert.ok(countAllowed(bystander.mask(), 512) > 0, 'the other host serves on');
    bystander.dispose();
    other.release();
    assert.equal(c.stats.hostFailures, 1);
    const fresh = await c.compile(spec); // not the cached grammar of the dead host
    assert.ok(fresh.compileMs > 0);
    assert.notEqual(fresh.hostId, g.hostId);
    const m = fresh.createMatcher();
    m.accept(id('y'));
    m.dispose();
    fresh.release();
  } finally {
    await c.close();
  }
});
