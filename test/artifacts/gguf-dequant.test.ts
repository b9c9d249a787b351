// Each dequantizer bit for bit against gguf-py's gguf.quants.dequantize, on random valid blocks
// committed in test/fixtures/gguf/dequant-samples.gguf (scripts/make_gguf_fixtures.py), and the
// pieces of weight loading around them: bf16 rounding, llama.cpp's q/k permutation, expert slices.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { dequantize, f32ToBf16 } from '../../src/artifacts/gguf/dequant.ts';
import { GGML_TYPE_BY_NAME, LOADABLE_TYPE_NAMES } from '../../src/artifacts/gguf/ggml-types.ts';
import { readGgufHeader, readTensorBytes } from '../../src/artifacts/gguf/reader.ts';
import { unpermuteRows } from '../../src/artifacts/gguf/weights.ts';

const SAMPLES = path.resolve(import.meta.dirname, '../fixtures/gguf/dequant-samples.gguf');

test('every loadable ggml type dequantizes bit for bit as gguf-py does', () => {
  const h = readGgufHeader(SAMPLES);
  const byName = new Map(h.tensors.map((t) => [t.name, t]));
  const tested: string[] = [];
  for (const name of LOADABLE_TYPE_NAMES) {
    if (name === 'F32') continue;
    const blocks = byName.get(name), expected = byName.get(`${name}.expected`);
    assert.ok(blocks && expected, `no sample of ${name}`);
    assert.equal(blocks.type.name, name);
    const out = new Float32Array(blocks.elements);
    dequantize(blocks.type, readTensorBytes(blocks), out);
    const want = new Uint32Array(readTensorBytes(expected).buffer);
    const got = new Uint32Array(out.buffer);
    assert.equal(got.length, want.length, name);
    for (let i = 0; i < got.length; i++) {
      if (got[i] !== want[i]) {
        assert.fail(`${name} element ${i} (block ${Math.floor(i / blocks.type.blockSize)}): ${out[i]} vs gguf-py ${new Float32Array(want.buffer)[i]}`);
      }
    }
    tested.push(name);
  }
  assert.equal(tested.length, 14);
});

test('dequantize writes at an offset and refuses partial blocks and unknown types', () => {
  const q8 = GGML_TYPE_BY_NAME.get('Q8_0')!;
  const block = new Uint8Array(34);
  block[0] = 0x00; block[1] = 0x3c; // d = 1.0
  for (let i = 0; i < 32; i++) block[2 + i] = (i - 16) & 0xff;
  const out = new Float32Array(40).fill(7);
  dequantize(q8, block, out, 8);
  assert.deepEqual([...out.subarray(0, 8)], Array(8).fill(7));
  assert.deepEqual([...out.subarray(8)], Array.from({ length: 32 }, (_, i) => i - 16));
  assert.throws(() => dequantize(q8, new Uint8Array(33), new Float32Array(64)), /not a whole number of 34-byte blocks/);
  assert.throws(() => dequantize(GGML_TYPE_BY_NAME.get('IQ2_XXS')!, new Uint8Array(66), new Float32Array(256)), /no dequantizer for ggml type IQ2_XXS/);
});

test('f32 -> bf16 rounds to nearest even and keeps NaN quiet', () => {
  const x = new Float32Array([1, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, Infinity, NaN, 3.4e38]);
  const b = f32ToBf16(x);
  assert.deepEqual([...b].map((v) => v.toString(16)), ['3f80', '3f80', '3f82', 'c020', '7f80', '7fc0', '7f80']);
});

test('unpermuteRows undoes convert_hf_to_gguf permute() for q (heads) and k (kv heads)', () => {
  for (const [rows, heads] of [[16, 2], [24, 3], [8, 1]] as const) {
    const hd = rows / heads;
    // permute(): row (h, i, j) of the file is Hugging Face row (h, j, i)
    const hf = Array.from({ length: rows }, (_, r) => r);
    const file: number[] = [];
    for (let h = 0; h < heads; h++) for (let i = 0; i < hd / 2; i++) for (let j = 0; j < 2; j++) file.push(hf[h * hd + j * (hd / 2) + i]!);
    const src = new Uint8Array(new Uint32Array(file).buffer);
    const back = new Uint32Array(unpermuteRows(src, rows, 4, heads, 'q').buffer);
    assert.deepEqual([...back], hf);
  }
  assert.throws(() => unpermuteRows(new Uint8Array(12), 3, 4, 2, 'blk.0.attn_q.weight'), /3 rows do not split into 2 heads/);
});
