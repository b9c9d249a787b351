// maxCharsPerToken: the bound that lets the server refuse a prompt too long for the context
// before tokenizing it. It must hold for every text (a token never covers more input characters
// than the bound) and be withheld whenever the tokenizer could make one token of any length.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { maxCharsPerToken } from '../../src/artifacts/token-bound.ts';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';
import { byteLevelTokenizerJson } from '../helpers/tiny-model.ts';

const base = () => byteLevelTokenizerJson() as Record<string, any>;

test('byte-level BPE: the longest vocab string or added token', () => {
  assert.equal(maxCharsPerToken(base()), '<|endoftext|>'.length);
});

test('withheld where one token can cover any length, or the text can shrink before tokenizing', () => {
  const cases: [string, (t: Record<string, any>) => void][] = [
    ['fused unknown tokens', (t) => { t.model.unk_token = '<unk>'; t.model.fuse_unk = true; }],
    ['an added token that strips whitespace', (t) => { t.added_tokens[0].rstrip = true; }],
    ['an NFC normalizer', (t) => { t.normalizer = { type: 'NFC' }; }],
    ['a normalizer sequence with Lowercase', (t) => { t.normalizer = { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Lowercase' }] }; }],
    ['a Replace that shortens', (t) => { t.normalizer = { type: 'Replace', pattern: { String: '  ' }, content: ' ' }; }],
    ['WhitespaceSplit (drops spaces)', (t) => { t.pre_tokenizer = { type: 'WhitespaceSplit' }; }],
    ['a Split that removes what it matches', (t) => { t.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Split', pattern: { Regex: '\\s+' }, behavior: 'Removed' }] }; }],
    ['a WordPiece model', (t) => { t.model = { type: 'WordPiece', vocab: { a: 0 }, unk_token: '[UNK]' }; }],
  ];
  for (const [what, edit] of cases) {
    const t = base();
    edit(t);
    assert.equal(maxCharsPerToken(t), undefined, what);
  }
});

test('kept for SentencePiece-style normalizers that only widen the text', () => {
  const t = base();
  t.normalizer = { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] };
  t.pre_tokenizer = null;
  assert.equal(maxCharsPerToken(t), 13);
});

test('the bound holds on every fixture tokenizer: tokens x bound >= characters, for hostile and plain texts', () => {
  const dirs = ['models/demo', ...fs.readdirSync('test/fixtures').map((d) => path.join('test/fixtures', d))]
    .filter((d) => fs.existsSync(path.join(d, 'tokenizer.json')));
  assert.ok(dirs.length > 5);
  const source = fs.readFileSync('src/execution/engine.ts', 'utf8');
  const texts = [' '.repeat(3000), 'a'.repeat(3000), '\n'.repeat(500) + 'x', '😀'.repeat(400), source.slice(0, 6000),
    '<|im_start|>'.repeat(50), 'def f():\n    return 1\n'.repeat(40)];
  for (const dir of dirs) {
    const tok = TextTokenizer.fromDir(dir);
    const per = tok.maxCharsPerToken;
    assert.ok(per !== undefined && per >= 1, `${dir}: a bound`);
    for (const text of texts) {
      const n = tok.encode(text, { addSpecialTokens: false }).length;
      assert.ok(n * per >= text.length, `${dir}: ${n} tokens x ${per} < ${text.length} characters`);
    }
  }
});
