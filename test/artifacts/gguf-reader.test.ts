// The GGUF reader (src/artifacts/gguf/reader.ts) on files written byte by byte: every metadata
// value type, alignment, versions 2 and 3, and one clear error line for each kind of bad file.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { ArtifactError } from '../../src/artifacts/errors.ts';
import { readGgufHeader, readTensorBytes } from '../../src/artifacts/gguf/reader.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { encodeGguf, f32Bytes, writeGguf, type GgufSpec } from '../helpers/gguf-writer.ts';
import { tempDir } from './helpers.ts';

const dir = tempDir('llmts-gguf-');
let n = 0;
const file = (spec: GgufSpec) => writeGguf(path.join(dir, `t${n++}.gguf`), spec);

function fails(spec: GgufSpec | string, re: RegExp): void {
  const f = typeof spec === 'string' ? spec : file(spec);
  assert.throws(() => readGgufHeader(f), (e: unknown) => {
    assert.ok(e instanceof ArtifactError, `not an ArtifactError: ${String(e)}`);
    assert.match(e.message, re);
    assert.ok(!e.message.includes('\n'), 'one line');
    assert.ok(e.message.includes(f), 'names the file');
    return true;
  });
}

const tensor = (name: string, dims: number[], values?: number[]) => ({
  name, dims, type: 0, data: f32Bytes(values ?? Array.from({ length: dims.reduce((a, b) => a * b, 1) }, (_, i) => i + 0.5)),
});

test('every metadata value type reads back, arrays as typed arrays, 64-bit integers exactly', () => {
  const h = readGgufHeader(file({
    metadata: [
      ['u8', { type: 'u8', value: 200 }], ['i8', { type: 'i8', value: -100 }], ['u16', { type: 'u16', value: 60000 }],
      ['i16', { type: 'i16', value: -30000 }], ['u32', { type: 'u32', value: 4_000_000_000 }], ['i32', { type: 'i32', value: -2_000_000_000 }],
      ['f32', { type: 'f32', value: 0.25 }], ['f64', { type: 'f64', value: 1e-300 }], ['bool', { type: 'bool', value: true }],
      ['u64', { type: 'u64', value: 2n ** 60n }], ['i64', { type: 'i64', value: -5 }], ['s', { type: 'string', value: 'héllo 🙂' }],
      ['af', { type: 'array', elem: 'f32', value: [1.5, -2] }], ['ai', { type: 'array', elem: 'i32', value: [1, -2, 3] }],
      ['as', { type: 'array', elem: 'string', value: ['a', '', 'bc'] }], ['ab', { type: 'array', elem: 'bool', value: [true, false] }],
      ['au64', { type: 'array', elem: 'u64', value: [1, 2] }],
      ['nested', { type: 'array', elem: 'array', value: [{ type: 'array', elem: 'u8', value: [1, 2] }, { type: 'array', elem: 'u8', value: [] }] }],
    ],
    tensors: [tensor('a', [4, 2]), tensor('b', [3])],
  }));
  const m = h.metadata;
  assert.deepEqual([m.get('u8'), m.get('i8'), m.get('u16'), m.get('i16'), m.get('u32'), m.get('i32')], [200, -100, 60000, -30000, 4_000_000_000, -2_000_000_000]);
  assert.equal(m.get('f32'), 0.25);
  assert.equal(m.get('f64'), 1e-300);
  assert.equal(m.get('bool'), true);
  assert.equal(m.get('u64'), 2n ** 60n);
  assert.equal(m.get('i64'), -5);
  assert.equal(m.get('s'), 'héllo 🙂');
  assert.deepEqual([...(m.get('af') as Float32Array)], [1.5, -2]);
  assert.ok(m.get('ai') instanceof Int32Array);
  assert.deepEqual(m.get('as'), ['a', '', 'bc']);
  assert.deepEqual(m.get('ab'), [true, false]);
  assert.deepEqual(m.get('au64'), [1, 2]);
  assert.deepEqual((m.get('nested') as Uint8Array[]).map((x) => [...x]), [[1, 2], []]);
  assert.equal(h.version, 3);
  assert.deepEqual(h.tensors.map((t) => [t.name, t.type.name, t.shape, t.byteLength]), [['a', 'F32', [2, 4], 32], ['b', 'F32', [3], 12]]);
  assert.equal(h.dataStart % 32, 0);
  assert.deepEqual([...new Float32Array(readTensorBytes(h.tensors[0]!).buffer)], [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]);
  assert.deepEqual([...new Float32Array(readTensorBytes(h.tensors[1]!, 4, 8).buffer)], [1.5, 2.5]);
});

test('version 2 files and general.alignment place the data section and tensors on the alignment', () => {
  const h = readGgufHeader(file({ version: 2, alignment: 64, tensors: [tensor('a', [3]), tensor('b', [5])] }));
  assert.equal(h.version, 2);
  assert.equal(h.alignment, 64);
  assert.equal(h.dataStart % 64, 0);
  assert.equal(h.tensors[1]!.offset - h.dataStart, 64);
  assert.deepEqual([...new Float32Array(readTensorBytes(h.tensors[1]!).buffer)], [0.5, 1.5, 2.5, 3.5, 4.5]);
});

test('bad files: one line each, naming the file and what is wrong', () => {
  fails({ magic: 'GGML' }, /is not a GGUF file \(magic "GGML", expected "GGUF"\)/);
  fails({ version: 1 }, /has GGUF version 1; supported: 2, 3/);
  fails({ version: 7 }, /has GGUF version 7; supported: 2, 3/);
  fails({ version: 0x03000000 }, /is a big-endian GGUF \(version 3\); only little-endian files are supported/);
  const whole = encodeGguf({ metadata: [['k', { type: 'string', value: 'value' }]], tensors: [tensor('a', [8])] });
  fails({ metadata: [['k', { type: 'string', value: 'value' }]], truncateTo: 30 }, /is truncated: .*needs bytes/);
  fails({ metadata: [['k', { type: 'string', value: 'value' }]], tensors: [tensor('a', [8])], truncateTo: whole.length - 4 }, /is truncated: tensor "a" \(F32 \[8\]\) needs bytes up to \d+, but the file has \d+/);
  fails({ truncateTo: 2 }, /too small to hold a header/);
  fails({ tensors: [{ ...tensor('a', [4]), offset: 1 << 20 }] }, /tensor "a" \(F32 \[4\]\) needs bytes up to \d+, but the file has/);
  fails({ tensors: [tensor('a', [8]), { ...tensor('b', [8]), offset: 0 }] }, /tensors "a" and "b" overlap/);
  fails({ tensors: [{ ...tensor('a', [4]), offset: 4 }] }, /tensor "a" has offset 4, not a multiple of the alignment 32/);
  fails({ tensors: [{ name: 'a', dims: [2 ** 40, 2 ** 20], type: 0, data: new Uint8Array(4) }] }, /tensor "a" has dimensions whose product overflows/);
  fails({ tensors: [tensor('a', [0])] }, /tensor "a" has a zero dimension/);
  fails({ tensors: [tensor('a', [1, 1, 1, 1, 1])] }, /tensor "a" has 5 dimensions; ggml allows 1\.\.4/);
  fails({ tensors: [{ ...tensor('a', [4]), type: 99 }] }, /tensor "a" has unknown ggml type 99/);
  fails({ tensors: [{ name: 'q', dims: [33], type: 8, data: new Uint8Array(34) }] }, /tensor "q" has rows of 33 elements, not a multiple of the Q8_0 block size 32/);
  fails({ tensors: [tensor('a', [4]), tensor('a', [4])] }, /tensor "a" appears twice/);
  fails({ metadata: [['k', { type: 'u8', value: 1 }], ['k', { type: 'u8', value: 2 }]] }, /metadata key "k" appears twice/);
  fails({ metadata: [['general.alignment', { type: 'u32', value: 24 }]] }, /general\.alignment is 24; it must be a power of two/);
});

test('values the format cannot hold: unknown value types, lengths past the end of the file, bad bools and UTF-8', () => {
  const withKey = (patch: (b: Buffer, keyEnd: number) => void) => {
    const b = Buffer.from(encodeGguf({ metadata: [['key', { type: 'u32', value: 5 }]] }));
    patch(b, 24 + 8 + 3); // magic, version, counts; then the key's length and bytes
    const f = path.join(dir, `p${n++}.gguf`);
    require_write(f, b);
    return f;
  };
  fails(withKey((b, at) => b.writeUInt32LE(42, at)), /metadata "key" has unknown value type 42/);
  fails(withKey((b) => b.writeBigUInt64LE(1n << 40n, 24)), /the length of metadata key 0 is \d+, more than the file can hold/);
  const bad = Buffer.from(encodeGguf({ metadata: [['bb', { type: 'bool', value: true }]] }));
  bad[bad.indexOf('bb') + 2 + 4] = 2;
  const badBool = path.join(dir, `p${n++}.gguf`);
  require_write(badBool, bad);
  fails(badBool, /metadata "bb" is a bool stored as 2/);
  const utf = Buffer.from(encodeGguf({ metadata: [['s', { type: 'string', value: 'xyz' }]] }));
  utf[utf.indexOf('xyz') + 1] = 0xff;
  const badUtf = path.join(dir, `p${n++}.gguf`);
  require_write(badUtf, utf);
  fails(badUtf, /metadata "s" is not valid UTF-8/);
  const arr = Buffer.from(encodeGguf({ metadata: [['arr', { type: 'array', elem: 'u32', value: [1, 2] }]] }));
  arr.writeBigUInt64LE(1n << 50n, arr.indexOf('arr') + 3 + 4 + 4);
  const badArr = path.join(dir, `p${n++}.gguf`);
  require_write(badArr, arr);
  fails(badArr, /the length of metadata "arr" is \d+, more than the file can hold/);
});

function require_write(f: string, b: Buffer): void {
  fs.writeFileSync(f, b);
}

test('a model path: unknown architecture and a missing tokenizer are one line naming them', () => {
  const f = file({ metadata: [['general.architecture', { type: 'string', value: 'rwkv7' }]], tensors: [tensor('token_embd.weight', [4, 2])] });
  assert.throws(() => loadModelDir(f), /has architecture "rwkv7"; supported architectures: llama, granite, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, olmo2/);
  const g = file({
    metadata: [['general.architecture', { type: 'string', value: 'qwen3' }], ['qwen3.embedding_length', { type: 'u32', value: 2 }]],
    tensors: [tensor('token_embd.weight', [2, 4])],
  });
  assert.throws(() => loadModelDir(g), /metadata qwen3\.block_count is missing/);
});
