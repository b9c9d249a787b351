import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IncrementalDetokenizer, type DecodeFn } from '../../src/generation/detokenizer.ts';

// A fake byte-level BPE vocabulary: each token is a byte string, decode concatenates the bytes
// and decodes them as UTF-8 with replacement (what byte-level tokenizers do).
const enc = new TextEncoder();
const EMOJI = enc.encode('😀'); // F0 9F 98 80
const CJK = enc.encode('中'); // E4 B8 AD
const VOCAB: Uint8Array[] = [
  enc.encode('Hi '), // 0
  EMOJI.slice(0, 2), // 1: first half of the emoji
  EMOJI.slice(2), // 2: second half
  CJK.slice(0, 1), // 3: lead byte of 中
  CJK.slice(1), // 4: its two continuation bytes
  enc.encode('!'), // 5
  Uint8Array.of(0xff), // 6: never valid UTF-8
  new Uint8Array(0), // 7: a special token with skip_special_tokens (decodes to nothing)
  EMOJI.slice(0, 1), // 8..11: the emoji one byte per token
  EMOJI.slice(1, 2),
  EMOJI.slice(2, 3),
  EMOJI.slice(3, 4),
];

function byteDecoder(calls?: number[]): DecodeFn {
  const dec = new TextDecoder('utf-8');
  return (ids) => {
    calls?.push(ids.length);
    const bytes = ids.flatMap((id) => Array.from(VOCAB[id]!));
    return dec.decode(Uint8Array.from(bytes));
  };
}

function stream(ids: number[], decode = byteDecoder()): { deltas: string[]; tail: string; d: IncrementalDetokenizer } {
  const d = new IncrementalDetokenizer(decode);
  const deltas = ids.map((id) => d.push(id));
  return { deltas, tail: d.flush(), d };
}

test('a 4-byte emoji and a 3-byte CJK char split across tokens are held until complete', () => {
  const { deltas, tail, d } = stream([0, 1, 2, 3, 4, 5]);
  assert.deepEqual(deltas, ['Hi ', '', '😀', '', '中', '!']);
  assert.equal(tail, '');
  assert.equal(d.text, 'Hi 😀中!');
  assert.ok(deltas.every((s) => !s.includes('\uFFFD')));
});

test('an emoji one byte per token is emitted once, whole', () => {
  const { deltas } = stream([8, 9, 10, 11, 5]);
  assert.deepEqual(deltas, ['', '', '', '😀', '!']);
});

test('flush emits an incomplete trailing character as U+FFFD', () => {
  const { deltas, tail } = stream([0, 1]);
  assert.deepEqual(deltas, ['Hi ', '']);
  assert.equal(tail, '\uFFFD');
});

test('really invalid bytes mid-stream come out as U+FFFD once more text follows', () => {
  const { deltas, tail, d } = stream([0, 6, 5]);
  assert.deepEqual(deltas, ['Hi ', '', '\uFFFD!']);
  assert.equal(tail, '');
  assert.equal(d.text, 'Hi \uFFFD!');
});

test('tokens that decode to nothing emit nothing and break nothing', () => {
  const { deltas, d } = stream([0, 7, 3, 7, 4]);
  assert.deepEqual(deltas, ['Hi ', '', '', '', '中']);
  assert.equal(d.text, 'Hi 中');
});

test('pushMany returns the combined delta', () => {
  const d = new IncrementalDetokenizer(byteDecoder());
  assert.equal(d.pushMany([0, 1]), 'Hi ');
  assert.equal(d.pushMany([2, 3, 4, 5]), '😀中!');
});

test('per-token work is a small window, not the whole sequence', () => {
  const calls: number[] = [];
  const d = new IncrementalDetokenizer(byteDecoder(calls), { contextTokens: Array(100).fill(0) });
  let text = '';
  for (let i = 0; i < 2000; i++) for (const id of [0, 1, 2, 3, 4]) text += d.push(id);
  text += d.flush();
  assert.equal(text, 'Hi 😀中'.repeat(2000));
  assert.ok(Math.max(...calls) <= 8, `largest decode window ${Math.max(...calls)}`);
});

test('context tokens give the first generated token its left context', () => {
  // SentencePiece-like: "▁" marks a space, and a decoded string drops its leading space.
  const pieces = ['▁Hello', '▁world', '!'];
  const spDecode: DecodeFn = (ids) => ids.map((i) => pieces[i]!).join('').replaceAll('▁', ' ').replace(/^ /, '');
  const withCtx = new IncrementalDetokenizer(spDecode, { contextTokens: [0] });
  assert.equal(withCtx.push(1) + withCtx.push(2), ' world!');
  const without = new IncrementalDetokenizer(spDecode);
  assert.equal(without.push(1), 'world');
});
