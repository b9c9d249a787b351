// The on-disk format of one spilled prefix (SSD tier): a chain of full KV blocks and the token ids
// they hold. Nothing in a file is trusted until checked: the header carries its own SHA-256, the
// namespace (model + tokenizer + KV scheme) and shapes must be ours, the file length must be
// exactly header + blocks, and every block's CRC-32 is checked when it is read back.
//
//   offset 0   8 bytes   magic "LLMTSKV\n"
//          8   u32 LE    format version (1: every layer full attention; 2: layer groups)
//         12   u32 LE    header length H
//         16   32 bytes  SHA-256 of the header bytes
//         48   H bytes   header, UTF-8 JSON (KvFileHeader)
//     48 + H   payload   version 1: blocks in chain order; block b = for each layer: K block,
//                        V block (raw little-endian bytes of kv.dtype), blockBytes in all.
//                        version 2: per group (header.groups order) its blocks [from, blocks) in
//                        chain order; a block = for each of the group's layers: K block, V block.
//
// Version 2 exists for models with sliding-window layers: such a group keeps only the blocks its
// window reaches, so a file holds, for a prefix of n blocks, every block of the full-attention
// groups and blocks [from, n) of each sliding group, from <= the window's first block at n.

import { createHash } from 'node:crypto';
import { crc32 } from 'node:zlib';
import type { KvScheme } from './block-hash.ts';
import { firstLiveBlock } from './kv-cache.ts';

export const KV_FILE_MAGIC = Buffer.from('LLMTSKV\n', 'latin1');
/** the version written for full-attention models (one group of every layer, whole blocks) */
export const KV_FILE_VERSION = 1;
/** the version written when the header carries a layer-group layout */
export const KV_FILE_VERSION_GROUPS = 2;
export const KV_FILE_PREFIX_BYTES = 48;
/** larger headers are refused before they are read (a 1M-token prefix needs ~10 MB) */
const MAX_HEADER_BYTES = 64 << 20;

export interface KvFileHeader {
  /** prefix namespace: seeds the block hash chain (model + tokenizer + KV scheme) */
  namespace: string;
  model: string;
  tokenizer: string | null;
  kv: KvScheme;
  /** payload bytes of one block (every layer, K and V) */
  blockBytes: number;
  /** token ids of every block: blocks * kv.blockSize of them */
  tokens: number[];
  /** CRC-32 of each stored block's payload, in payload order */
  blockCrc: number[];
  /** ms since the epoch */
  createdAt: number;
  /** version 2: the layer groups and the first block each stores (absent: one full group) */
  groups?: KvFileGroup[];
}

/** One layer group of a version 2 file: its window (0 = full), layers, and first stored block. */
export interface KvFileGroup {
  window: number;
  layers: number[];
  from: number;
}

/** Where a checked file's blocks are: `blocks` logical blocks; per group its first stored block. */
export interface KvFileLayout {
  blocks: number;
  from: number[];
  /** bytes of one stored block of each group */
  groupBytes: number[];
}

/** A file that is not a valid prefix of this model: skipped and removed, never trusted. */
export class KvFileError extends Error {}

export function blockCrc(data: Uint8Array): number {
  return crc32(data) >>> 0;
}

/** The header bytes (prefix + JSON) of a file holding `h`. */
export function encodeKvFileHeader(h: KvFileHeader): Buffer {
  const json = Buffer.from(JSON.stringify(h), 'utf8');
  const prefix = Buffer.alloc(KV_FILE_PREFIX_BYTES);
  KV_FILE_MAGIC.copy(prefix, 0);
  prefix.writeUInt32LE(h.groups ? KV_FILE_VERSION_GROUPS : KV_FILE_VERSION, 8);
  prefix.writeUInt32LE(json.length, 12);
  createHash('sha256').update(json).digest().copy(prefix, 16);
  return Buffer.concat([prefix, json]);
}

/** Header length H from the first 48 bytes, after checking magic and version. */
export function kvFileHeaderLength(prefix: Uint8Array): number {
  if (prefix.byteLength < KV_FILE_PREFIX_BYTES) throw new KvFileError('truncated before the end of the header');
  const b = Buffer.from(prefix.buffer, prefix.byteOffset, prefix.byteLength);
  if (!b.subarray(0, 8).equals(KV_FILE_MAGIC)) throw new KvFileError('not a llmts KV cache file (bad magic)');
  const version = b.readUInt32LE(8);
  if (version !== KV_FILE_VERSION && version !== KV_FILE_VERSION_GROUPS)
    throw new KvFileError(`format version ${version}, expected ${KV_FILE_VERSION} or ${KV_FILE_VERSION_GROUPS}`);
  const n = b.readUInt32LE(12);
  if (n < 2 || n > MAX_HEADER_BYTES) throw new KvFileError(`implausible header length ${n}`);
  return n;
}

export interface ExpectedKvFile {
  namespace: string;
  kv: KvScheme;
  blockBytes: number;
  /** the KV cache's layer groups (default: one full-attention group of every layer) */
  groups?: readonly { window: number; layers: readonly number[] }[];
}

/** The layer groups files of `expect` must have. */
export function expectedGroups(expect: ExpectedKvFile): { window: number; layers: number[] }[] {
  return (expect.groups ?? [{ window: 0, layers: Array.from({ length: expect.kv.numLayers }, (_, l) => l) }])
    .map((g) => ({ window: g.window, layers: [...g.layers] }));
}

/** true when files of these groups are written as version 1 (a single full-attention group) */
export function isPlainLayout(groups: readonly { window: number }[]): boolean {
  return groups.length === 1 && groups[0].window === 0;
}


/**
 * Checks a file's prefix + header bytes against what this cache holds and the file's size.
 * Returns the header, where the payload starts and its layout; throws KvFileError for anything off.
 */
export function parseKvFileHeader(
  prefix: Uint8Array, json: Uint8Array, fileSize: number, expect: ExpectedKvFile,
): { header: KvFileHeader; payloadOffset: number; layout: KvFileLayout } {
  const n = kvFileHeaderLength(prefix);
  if (json.byteLength !== n) throw new KvFileError('truncated inside the header');
  const digest = createHash('sha256').update(json).digest();
  if (!digest.equals(Buffer.from(prefix.buffer, prefix.byteOffset + 16, 32))) throw new KvFileError('header checksum mismatch');
  const version = Buffer.from(prefix.buffer, prefix.byteOffset, prefix.byteLength).readUInt32LE(8);
  let h: KvFileHeader;
  try {
    h = JSON.parse(Buffer.from(json.buffer, json.byteOffset, json.byteLength).toString('utf8')) as KvFileHeader;
  } catch {
    throw new KvFileError('header is not JSON');
  }
  if (typeof h !== 'object' || h === null) throw new KvFileError('header is not an object');
  if (h.namespace !== expect.namespace) throw new KvFileError('written for another model, tokenizer or KV layout (namespace differs)');
  const kv = h.kv ?? ({} as KvScheme);
  for (const k of ['dtype', 'blockSize', 'numLayers', 'numKvHeads', 'headDim'] as const) {
    if (kv[k] !== expect.kv[k]) throw new KvFileError(`KV ${k} is ${String(kv[k])}, expected ${expect.kv[k]}`);
  }
  if (h.blockBytes !== expect.blockBytes) throw new KvFileError(`block size ${h.blockBytes} bytes, expected ${expect.blockBytes}`);
  const bs = expect.kv.blockSize;
  if (!Array.isArray(h.tokens) || h.tokens.length === 0 || h.tokens.length % bs !== 0 || !h.tokens.every((t) => Number.isInteger(t) && t >= 0))
    throw new KvFileError('bad token ids');
  const blocks = h.tokens.length / bs;
  const want = expectedGroups(expect);
  const perLayer = expect.blockBytes / expect.kv.numLayers;
  let from: number[];
  if (version === KV_FILE_VERSION) {
    if (h.groups !== undefined) throw new KvFileError('a version 1 header with layer groups');
    if (!isPlainLayout(want)) throw new KvFileError('a full-attention file for a model with sliding-window layers');
    from = [0];
  } else {
    const g = h.groups;
    if (!Array.isArray(g) || g.length !== want.length) throw new KvFileError('layer groups differ from the model\'s');
    from = g.map((x, i) => {
      if (typeof x !== 'object' || x === null || x.window !== want[i].window || JSON.stringify(x.layers) !== JSON.stringify(want[i].layers))
        throw new KvFileError(`layer group ${i} differs from the model's`);
      // full groups store every block; a sliding group at least its window at the end
      if (!Number.isInteger(x.from) || x.from < 0 || x.from > firstLiveBlock(x.window, blocks * bs, bs))
        throw new KvFileError(`layer group ${i} starts at block ${String(x.from)}, which does not cover its window`);
      return x.from;
    });
  }
  const stored = from.reduce((a, f) => a + blocks - f, 0);
  if (!Array.isArray(h.blockCrc) || h.blockCrc.length !== stored || !h.blockCrc.every((c) => Number.isInteger(c) && c >= 0 && c <= 0xffffffff))
    throw new KvFileError('bad block checksums');
  const groupBytes = want.map((g) => perLayer * g.layers.length);
  const payloadOffset = KV_FILE_PREFIX_BYTES + n;
  const size = payloadOffset + from.reduce((a, f, i) => a + (blocks - f) * groupBytes[i], 0);
  if (fileSize !== size) throw new KvFileError(fileSize < size ? `truncated: ${fileSize} bytes of ${size}` : `${fileSize - size} stray bytes after the payload`);
  return { header: h, payloadOffset, layout: { blocks, from, groupBytes } };
}
