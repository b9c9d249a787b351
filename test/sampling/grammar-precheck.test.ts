// Specs refused before compiling: grammars whose root never terminates, lone surrogates, bad
// count keywords in schemas; and the compiler's address-only exceptions as a fixed sentence.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';
import { GrammarCompiler, GrammarSpecError, countAllowed, grammarVocabFrom, type GrammarSpec } from '../../src/sampling/grammar/index.ts';
import { emptyLanguageReason, precheckSpec } from '../../src/sampling/grammar/precheck.ts';
import { compilerReason } from '../../src/sampling/grammar/prepare.ts';

const FIXTURE = new URL('../fixtures/qwen3/', import.meta.url).pathname;

test('normalized EBNF: a root with no terminating alternative matches no string', () => {
  const never = [
    'root ::= ((root))',
    'root ::= (("a" root))',
    'root ::= ((a))\na ::= (("x" a) | (root))',
    'root ::= ((a b))\na ::= ("x")\nb ::= ((b "y")) (=("z"))',
  ];
  for (const g of never) assert.match(emptyLanguageReason(g, 'root') ?? '', /matches no string: rule "root" can never finish/, g);
  const fine = [
    'root ::= ("")',
    'root ::= (("a") | (root "b"))',
    'root ::= ((root_1 root_2))\nroot_1 ::= ("" | (root_1_1 root_1))\nroot_1_1 ::= (("a") | ([^\\]"]))\nroot_2 ::= ("" | ("q"))',
    'root ::= ((b))\nb ::= ((b_1 "\\"")) (=("x"))\nb_1 ::= (([a-z] b_1) | ([a-z]))',
    // not understood: no verdict
    'root ::= TagDispatch(("<a>", x))',
  ];
  for (const g of fine) assert.equal(emptyLanguageReason(g, 'root'), undefined, g);
});

test('precheck: lone surrogates and count keywords, in schema positions only', () => {
  assert.match(precheckSpec({ type: 'regex', pattern: 'a\ud800' }) ?? '', /lone UTF-16 surrogate/);
  assert.match(precheckSpec({ type: 'regex', pattern: '\udc00' }) ?? '', /lone UTF-16 surrogate/);
  assert.equal(precheckSpec({ type: 'regex', pattern: 'a\ud83d\ude00' }), undefined);
  assert.match(precheckSpec({ type: 'choice', choices: ['ok', 'x\udfff'] }) ?? '', /a choice contains a lone/);
  assert.match(precheckSpec({ type: 'ebnf', grammar: 'root ::= "\ud800"' }) ?? '', /the grammar contains a lone/);
  assert.match(precheckSpec({ type: 'json_schema', schema: { enum: ['\ud800'] } }) ?? '', /the schema contains a lone/);
  for (const key of ['minLength', 'maxLength', 'minItems', 'maxItems', 'minProperties', 'maxProperties']) {
    for (const bad of [-1, 1.5, '2', null, true])
      assert.match(precheckSpec({ type: 'json_schema', schema: { [key]: bad } }) ?? '', new RegExp(`^${key} at # must be a non-negative integer`), `${key} ${bad}`);
    assert.equal(precheckSpec({ type: 'json_schema', schema: { [key]: 0 } }), undefined);
  }
  assert.match(precheckSpec({ type: 'json_schema', schema: { type: 'array', items: { type: 'array', minItems: -2 } } }) ?? '', /minItems at #\/items must be/);
  assert.match(precheckSpec({ type: 'json_schema', schema: { anyOf: [{}, { maxProperties: -1 }] } }) ?? '', /maxProperties at #\/anyOf\/1 must be/);
  assert.match(precheckSpec({ type: 'json_schema', schema: { $defs: { s: { minLength: 4, maxLength: 3 } } } }) ?? '', /minLength 4 exceeds maxLength 3 at #\/\$defs\/s/);
  // a property named like a keyword is a name
  assert.equal(precheckSpec({ type: 'json_schema', schema: { type: 'object', properties: { minItems: { type: 'integer' }, maxLength: {} } } }), undefined);
});

test('compilerReason: an exception address becomes a fixed sentence, a message stays', () => {
  assert.equal(compilerReason('185096'), 'the compiler refused it without giving a reason');
  assert.equal(compilerReason('Type should be a string'), 'Type should be a string');
});

test('compiler: prechecked specs are GrammarSpecErrors with stable messages; valid ones still compile', async () => {
  const tok = TextTokenizer.fromDir(FIXTURE);
  const c = new GrammarCompiler(grammarVocabFrom(tok, 512, [0, 2]), { cacheSize: 2 });
  const bad: [GrammarSpec, RegExp][] = [
    [{ type: 'regex', pattern: 'a\ud800b' }, /^invalid regex: the pattern contains a lone UTF-16 surrogate \(U\+D800-U\+DFFF\), which is not a character$/],
    [{ type: 'ebnf', grammar: 'root ::= root' }, /^invalid grammar: the grammar matches no string: rule "root" can never finish/],
    [{ type: 'ebnf', grammar: 'root ::= "a" root' }, /^invalid grammar: the grammar matches no string/],
    [{ type: 'json_schema', schema: { type: 'array', minItems: -1 } }, /^invalid JSON schema: minItems at # must be a non-negative integer, got -1$/],
    [{ type: 'json_schema', schema: { type: 'string', maxLength: 1.5 } }, /^invalid JSON schema: maxLength at # must be a non-negative integer, got 1.5$/],
  ];
  for (const [spec, message] of bad) {
    await assert.rejects(c.compile(spec), (e: unknown) => {
      assert.ok(e instanceof GrammarSpecError, String(e));
      assert.match((e as Error).message, message);
      return true;
    });
  }
  for (const spec of [
    { type: 'ebnf', grammar: 'root ::= "a" | root "b"' },
    { type: 'ebnf', grammar: 'root ::= "x"*' },
    { type: 'regex', pattern: 'a\ud83d\ude00b' },
  ] as GrammarSpec[]) {
    const g = await c.compile(spec);
    const m = g.createMatcher();
    assert.ok(countAllowed(m.mask(), 512) > 0, JSON.stringify(spec));
    m.dispose();
    g.release();
  }
});
