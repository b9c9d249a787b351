// The tokenizer and chat template built from tokenizer.* metadata (src/artifacts/gguf/tokenizer.ts)
// against transformers' conversion of the same GGUF (scripts/make_gguf_fixtures.py): byte-level
// BPE ("gpt2") on every model fixture, SentencePiece ("llama") under the llama, gemma2 and phi3
// architectures; plus llama.cpp's add_bos / add_eos flags, which transformers does not apply.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { loadGgufModel } from '../../src/artifacts/gguf/model.ts';
import { readGgufHeader } from '../../src/artifacts/gguf/reader.ts';
import { generateMerges, ggufTokenizer } from '../../src/artifacts/gguf/tokenizer.ts';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';

const DIR = path.resolve(import.meta.dirname, '../fixtures/gguf');
const refs = readdirSync(DIR).filter((f) => f.endsWith('.reference.json')).map((f) => JSON.parse(readFileSync(path.join(DIR, f), 'utf8')));

test('byte-level BPE: every model fixture encodes as transformers does, decodes back, renders the chat template', () => {
  const models = refs.filter((r) => !r.gguf.startsWith('vocab-'));
  assert.ok(models.length >= 12);
  for (const ref of models) {
    const m = loadGgufModel(path.join(DIR, ref.gguf));
    for (const t of ref.tokenizer) {
      assert.deepEqual(m.tokenizer!.encode(t.text, { addSpecialTokens: false }), t.ids, `${ref.name}: ${JSON.stringify(t.text)}`);
      // add_bos_token is false in these files: nothing is added
      assert.deepEqual(m.tokenizer!.encode(t.text), t.ids);
      assert.equal(m.tokenizer!.decode(t.ids), t.text);
    }
    for (const c of ref.chat) assert.equal(m.chatTemplate!.render(c.messages, { addGenerationPrompt: true }), c.text, ref.name);
    assert.equal(m.tokenizer!.specialTokens.eos_token, '<|endoftext|>');
    assert.ok(m.tokenizer!.isSpecial(2), '<|im_end|> (a control token) is special');
  }
});

test('SentencePiece under llama, gemma2 and phi3: transformers ids, and the BOS llama.cpp adds', () => {
  const vocabs = refs.filter((r) => r.gguf.startsWith('vocab-'));
  assert.deepEqual(vocabs.map((r) => r.architecture).sort(), ['gemma2', 'llama', 'phi3']);
  for (const ref of vocabs) {
    const h = readGgufHeader(path.join(DIR, ref.gguf));
    const tk = ggufTokenizer(h.metadata, ref.architecture, h.file);
    const tok = new TextTokenizer(tk.json, tk.config, ref.gguf);
    for (const t of ref.tokenizer) {
      assert.deepEqual(tok.encode(t.text, { addSpecialTokens: false }), t.ids, `${ref.architecture}: ${JSON.stringify(t.text)}`);
      assert.deepEqual(tok.encode(t.text), [ref.bos_token_id, ...t.ids], 'add_bos_token: BOS first');
      assert.equal(tok.decode(t.ids), t.decoded, `${ref.architecture}: decode`);
    }
  }
});

test('add_bos / add_eos flags and their defaults; bad tokenizer metadata is one line naming the key', () => {
  const h = readGgufHeader(path.join(DIR, 'vocab-llama.gguf'));
  const with_ = (patch: Record<string, unknown>) => {
    const meta = new Map(h.metadata);
    for (const [k, v] of Object.entries(patch)) {
      if (v === undefined) meta.delete(k);
      else meta.set(k, v as never);
    }
    return meta;
  };
  const enc = (meta: Map<string, unknown>, text = 'def') => {
    const tk = ggufTokenizer(meta as never, 'llama', 'x.gguf');
    return new TextTokenizer(tk.json, tk.config).encode(text);
  };
  const plain = enc(with_({ 'tokenizer.ggml.add_bos_token': false }));
  assert.deepEqual(enc(with_({ 'tokenizer.ggml.add_bos_token': undefined })), [1, ...plain], 'SentencePiece default: BOS');
  assert.deepEqual(enc(with_({ 'tokenizer.ggml.add_bos_token': false, 'tokenizer.ggml.add_eos_token': true })), [...plain, 2]);
  assert.throws(() => enc(with_({ 'tokenizer.ggml.model': 'rwkv' })), /tokenizer\.ggml\.model is "rwkv"; supported: "gpt2" \(byte-level BPE\), "llama" \(SentencePiece BPE\)/);
  assert.throws(() => enc(with_({ 'tokenizer.ggml.model': undefined })), /has no tokenizer \(metadata tokenizer\.ggml\.model is missing\)/);
  assert.throws(() => enc(with_({ 'tokenizer.ggml.bos_token_id': 99999 })), /tokenizer\.ggml\.bos_token_id is 99999, not a token id below 700/);
  assert.throws(() => enc(with_({ 'tokenizer.ggml.scores': new Float32Array(3) })), /tokenizer\.ggml\.scores has 3 entries for 700 tokens/);
  assert.throws(() => enc(with_({ 'tokenizer.ggml.scores': undefined })), /neither tokenizer\.ggml\.merges nor tokenizer\.ggml\.scores/);
});

test('generateMerges: splits into vocabulary pieces, best score first, ties by piece lengths then ids', () => {
  const vocab = new Map([['a', 0], ['b', 1], ['c', 2], ['ab', 3], ['bc', 4], ['abc', 5]]);
  const scores = new Map([['a', 0], ['b', 0], ['c', 0], ['ab', -1], ['bc', -2], ['abc', -3]]);
  assert.deepEqual(generateMerges(vocab, scores), [['a', 'b'], ['b', 'c'], ['ab', 'c'], ['a', 'bc']]);
});
