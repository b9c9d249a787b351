// The SSD tier's file header: what it checks before anything in a file is used.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  KV_FILE_PREFIX_BYTES, KvFileError, encodeKvFileHeader, parseKvFileHeader, type KvFileHeader,
} from '../../src/state/kv-file.ts';
import type { KvScheme } from '../../src/state/block-hash.ts';

const kv: KvScheme = { dtype: 'f32', blockSize: 4, numLayers: 2, numKvHeads: 1, headDim: 2 };
const blockBytes = 2 * 2 * 4 * 1 * 2 * 4;
const header: KvFileHeader = {
  namespace: 'ns', model: 'm', tokenizer: null, kv, blockBytes, tokens: [1, 2, 3, 4, 5, 6, 7, 8], blockCrc: [1, 2], createdAt: 0,
};
const expect = { namespace: 'ns', kv, blockBytes };

function parse(h: KvFileHeader | Buffer, size?: number, exp = expect) {
  const bytes = Buffer.isBuffer(h) ? h : encodeKvFileHeader(h);
  const json = bytes.subarray(KV_FILE_PREFIX_BYTES);
  return parseKvFileHeader(bytes.subarray(0, KV_FILE_PREFIX_BYTES), json, size ?? bytes.length + 2 * blockBytes, exp);
}

test('a header round-trips and locates the payload', () => {
  const bytes = encodeKvFileHeader(header);
  const r = parse(header);
  assert.deepEqual(r.header, header);
  assert.equal(r.payloadOffset, bytes.length);
});

test('every mismatch is a KvFileError naming what is off', () => {
  const bytes = encodeKvFileHeader(header);
  const cases: [string, () => unknown, RegExp][] = [
    ['version', () => { const b = Buffer.from(bytes); b.writeUInt32LE(2, 8); return parse(b); }, /version 2/],
    ['magic', () => { const b = Buffer.from(bytes); b[0] = 0; return parse(b); }, /magic/],
    ['header checksum', () => { const b = Buffer.from(bytes); b[b.length - 3] ^= 1; return parse(b); }, /checksum/],
    ['namespace', () => parse({ ...header, namespace: 'other' }), /namespace/],
    ['dtype', () => parse(header, undefined, { ...expect, kv: { ...kv, dtype: 'bf16' } }), /dtype/],
    ['head dim', () => parse(header, undefined, { ...expect, kv: { ...kv, headDim: 4 } }), /headDim/],
    ['block bytes', () => parse(header, undefined, { ...expect, blockBytes: 8 }), /block size/],
    ['token count', () => parse({ ...header, tokens: [1, 2, 3] }), /token ids/],
    ['token values', () => parse({ ...header, tokens: [1, 2, 3, 4, 5, 6, 7, -8] }), /token ids/],
    ['checksums', () => parse({ ...header, blockCrc: [] }), /checksums/],
    ['truncated', () => parse(header, bytes.length + blockBytes), /truncated/],
    ['longer', () => parse(header, bytes.length + 3 * blockBytes), /stray bytes/],
  ];
  for (const [name, run, why] of cases) assert.throws(run, (e: unknown) => e instanceof KvFileError && why.test((e as Error).message), name);
});
