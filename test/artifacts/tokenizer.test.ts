// TextTokenizer on a hand-built byte-level BPE tokenizer.json (see helpers.ts for its merges).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ArtifactError } from '../../src/artifacts/errors.ts';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';
import { TINY, tempDir, tinyTokenizerJson } from './helpers.ts';

describe('TextTokenizer', () => {
  it('encodes with BPE merges and keeps added tokens whole', () => {
    const t = new TextTokenizer(tinyTokenizerJson());
    // "hello" merges to one token, " the" to one, " world" stays bytes
    assert.deepEqual(t.encode('hello the'), [TINY.hello, TINY.space_the]);
    assert.deepEqual(t.encode('hi<|im_end|>'), [104, 105, TINY.imEnd]);
    assert.deepEqual(t.encode(''), []);
  });

  it('round-trips text, including non-ASCII bytes', () => {
    const t = new TextTokenizer(tinyTokenizerJson());
    for (const s of ['hello the world', '  leading spaces', 'naïve café ☕ — 日本', 'a\nb\tc', 'x .', "don 't"]) {
      assert.equal(t.decode(t.encode(s)), s, s);
    }
  });

  it('addSpecialTokens follows the post-processor (bos), default on, off for templates', () => {
    const t = new TextTokenizer(tinyTokenizerJson({ addBos: true }), { bos_token: '<s>' });
    assert.deepEqual(t.encode('hello'), [TINY.bos, TINY.hello]);
    assert.deepEqual(t.encode('hello', { addSpecialTokens: true }), [TINY.bos, TINY.hello]);
    assert.deepEqual(t.encode('hello', { addSpecialTokens: false }), [TINY.hello]);
  });

  it('skipSpecialTokens drops special added tokens only', () => {
    const t = new TextTokenizer(tinyTokenizerJson());
    const ids = [TINY.imStart, ...t.encode('hello'), TINY.tool, TINY.imEnd];
    assert.equal(t.decode(ids), '<|im_start|>hello<tool><|im_end|>');
    assert.equal(t.decode(ids, { skipSpecialTokens: true }), 'hello<tool>');
    assert.ok(t.isSpecial(TINY.imEnd));
    assert.ok(!t.isSpecial(TINY.tool));
  });

  it('never cleans up tokenization spaces by default (the library would)', () => {
    const t = new TextTokenizer(tinyTokenizerJson(), {});
    assert.equal(t.cleanUpTokenizationSpaces, false);
    assert.equal(t.decode(t.encode("x . y , don 't")), "x . y , don 't");
    // transformers 5 ignores the flag for BPE models unless forced
    const asked = new TextTokenizer(tinyTokenizerJson(), { clean_up_tokenization_spaces: true });
    assert.equal(asked.decode(asked.encode('x .')), 'x .');
    const forced = new TextTokenizer(tinyTokenizerJson(), {
      clean_up_tokenization_spaces: true,
      clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output: true,
    });
    assert.equal(forced.cleanUpTokenizationSpaces, true);
    assert.equal(forced.decode(forced.encode('x .')), 'x.');
  });

  it('named special tokens and ids from tokenizer_config (string or AddedToken form)', () => {
    const t = new TextTokenizer(tinyTokenizerJson(), {
      bos_token: '<s>',
      eos_token: { __type: 'AddedToken', content: '<|im_end|>', special: true },
      pad_token: '<|endoftext|>',
      unk_token: null,
      image_token: '<tool>',
      add_bos_token: true,
    });
    assert.equal(t.bosTokenId, TINY.bos);
    assert.equal(t.eosTokenId, TINY.imEnd);
    assert.equal(t.padTokenId, TINY.endoftext);
    assert.equal(t.unkTokenId, undefined);
    assert.deepEqual(t.specialTokens, { bos_token: '<s>', eos_token: '<|im_end|>', pad_token: '<|endoftext|>', image_token: '<tool>' });
    assert.equal(t.tokenToId('<|im_start|>'), TINY.imStart);
    assert.equal(t.idToToken(TINY.imStart), '<|im_start|>');
    assert.equal(t.tokenToId('not-a-token'), undefined);
  });

  it('vocab size counts added tokens; ids without a token decode to nothing (padded model vocab)', () => {
    const t = new TextTokenizer(tinyTokenizerJson());
    assert.equal(t.vocabSize, TINY.tool + 1);
    assert.equal(t.decode([TINY.hello, TINY.tool + 1, -1, 1.5, TINY.space_the]), 'hello the');
    assert.equal(t.decode([TINY.tool + 1]), '');
    assert.equal(t.decode([]), '');
  });

  it('fingerprint changes with the tokenizer', () => {
    const a = new TextTokenizer(tinyTokenizerJson());
    const b = new TextTokenizer(tinyTokenizerJson({ addBos: true }));
    assert.equal(a.fingerprint, new TextTokenizer(tinyTokenizerJson()).fingerprint);
    assert.notEqual(a.fingerprint, b.fingerprint);
  });

  it('fromDir: tokenizer_config optional; missing or corrupt tokenizer.json are ArtifactErrors', () => {
    const dir = tempDir();
    assert.throws(() => TextTokenizer.fromDir(dir), (e: unknown) => e instanceof ArtifactError && /tokenizer\.json is missing/.test(e.message));
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tinyTokenizerJson()));
    assert.deepEqual(TextTokenizer.fromDir(dir).encode('hello'), [TINY.hello]);
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), '{bad');
    assert.throws(() => TextTokenizer.fromDir(dir), /tokenizer_config\.json is not valid JSON/);
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), '{}');
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify({ model: { type: 'Nope' } }));
    assert.throws(() => TextTokenizer.fromDir(dir), (e: unknown) => e instanceof ArtifactError && /cannot be loaded/.test(e.message));
  });
});
