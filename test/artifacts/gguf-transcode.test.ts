// The transcodings into kept types (src/artifacts/gguf/transcode.ts): each source type's random
// valid blocks (test/fixtures/gguf/dequant-samples.gguf), rewritten, dequantize as their new type
// to gguf-py's values of the source blocks, bit for bit.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { dequantize } from '../../src/artifacts/gguf/dequant.ts';
import { GGML_TYPE_BY_NAME } from '../../src/artifacts/gguf/ggml-types.ts';
import { readGgufHeader, readTensorBytes } from '../../src/artifacts/gguf/reader.ts';
import { TRANSCODED, transcodeBlocks } from '../../src/artifacts/gguf/transcode.ts';

const SAMPLES = path.resolve(import.meta.dirname, '../fixtures/gguf/dequant-samples.gguf');

test('Q5_0, IQ4_NL and Q3_K blocks rewritten into Q8_0 / Q6_K give gguf-py\'s values bit for bit', () => {
  const h = readGgufHeader(SAMPLES);
  const byName = new Map(h.tensors.map((t) => [t.name, t]));
  assert.deepEqual(Object.keys(TRANSCODED).sort(), ['IQ4_NL', 'Q3_K', 'Q5_0']);
  for (const [from, to] of Object.entries(TRANSCODED)) {
    const blocks = byName.get(from)!, expected = byName.get(`${from}.expected`)!;
    const raw = readTensorBytes(blocks);
    const out = transcodeBlocks(from, raw);
    const toType = GGML_TYPE_BY_NAME.get(to)!;
    assert.equal(out.length / toType.typeSize, blocks.elements / toType.blockSize, `${from}: block count`);
    const values = new Float32Array(blocks.elements);
    dequantize(toType, out, values);
    const got = new Uint32Array(values.buffer), want = new Uint32Array(readTensorBytes(expected).buffer);
    assert.equal(got.length, want.length);
    for (let i = 0; i < got.length; i++) {
      if (got[i] !== want[i]) assert.fail(`${from} -> ${to} element ${i}: ${values[i]} vs gguf-py ${new Float32Array(want.buffer)[i]}`);
    }
  }
});

test('transcoding refuses partial blocks and types it does not rewrite', () => {
  assert.throws(() => transcodeBlocks('Q5_0', new Uint8Array(23)), /not a whole number of 22-byte blocks/);
  assert.throws(() => transcodeBlocks('Q4_1', new Uint8Array(20)), /Q4_1 has no transcoding/);
});
