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
    ['version', () => { const b = Buffer.from(bytes); b.writeUInt32LE(3, 8); return parse(b); }, /version 3/],
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

test('version 2: layer groups, each sliding group from at most its window at the end', () => {
  // layer 0 full, layer 1 sliding (window 5, block size 4: resuming after 3 blocks reads tokens
  // 8..12, so the sliding group needs block 2; this file also keeps block 1)
  const groups = [{ window: 0, layers: [0] }, { window: 5, layers: [1] }];
  const exp = { ...expect, groups };
  const perGroup = blockBytes / 2;
  const tokens = Array.from({ length: 12 }, (_, k) => k);
  const h2: KvFileHeader = { ...header, tokens, blockCrc: [1, 2, 3, 4, 5], groups: [{ ...groups[0], from: 0 }, { ...groups[1], from: 1 }] };
  const bytes = encodeKvFileHeader(h2);
  assert.equal(bytes.readUInt32LE(8), 2);
  const ok = parse(h2, bytes.length + 5 * perGroup, exp);
  assert.deepEqual(ok.layout, { blocks: 3, from: [0, 1], groupBytes: [perGroup, perGroup] });
  const bad: [string, () => unknown, RegExp][] = [
    ['v1 file for a sliding model', () => parse(header, undefined, exp), /sliding-window/],
    ['groups differ', () => parse({ ...h2, groups: [{ ...groups[0], from: 0 }, { window: 6, layers: [1], from: 1 }] }, bytes.length + 5 * perGroup, exp), /group 1/],
    ['window not covered', () => parse({ ...h2, blockCrc: [1, 2, 3], groups: [{ ...groups[0], from: 0 }, { ...groups[1], from: 3 }] }, bytes.length + 3 * perGroup, exp), /does not cover/],
    ['full group not from 0', () => parse({ ...h2, blockCrc: [1, 2, 3, 4], groups: [{ ...groups[0], from: 1 }, { ...groups[1], from: 1 }] }, bytes.length + 4 * perGroup, exp), /group 0/],
    ['checksum count', () => parse({ ...h2, blockCrc: [1, 2, 3, 4] }, bytes.length + 5 * perGroup, exp), /checksums/],
    ['length', () => parse(h2, bytes.length + 6 * perGroup, exp), /stray bytes/],
    ['groups in a plain model', () => parse(h2, bytes.length + 5 * perGroup), /groups differ/],
  ];
  for (const [name, run, why] of bad) assert.throws(run, (e: unknown) => e instanceof KvFileError && why.test((e as Error).message), name);
});
