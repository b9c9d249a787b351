// The on-disk format of one spilled prefix (SSD tier): a chain of full KV blocks and the token ids
// they hold. Nothing in a file is trusted until checked: the header carries its own SHA-256, the
// namespace (model + tokenizer + KV scheme) and shapes must be ours, the file length must be
// exactly header + blocks, and every block's CRC-32 is checked when it is read back.
//
//   offset 0   8 bytes   magic "LLMTSKV\n"
//          8   u32 LE    format version (1)
//         12   u32 LE    header length H
//         16   32 bytes  SHA-256 of the header bytes
//         48   H bytes   header, UTF-8 JSON (KvFileHeader)
//     48 + H   payload   blocks in chain order; block b = for each layer: K block, V block
//                        (raw little-endian bytes of kv.dtype), blockBytes in all

import { createHash } from 'node:crypto';
import { crc32 } from 'node:zlib';
import type { KvScheme } from './block-hash.ts';

export const KV_FILE_MAGIC = Buffer.from('LLMTSKV\n', 'latin1');
export const KV_FILE_VERSION = 1;
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
  /** CRC-32 of each block's payload */
  blockCrc: number[];
  /** ms since the epoch */
  createdAt: number;
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
  prefix.writeUInt32LE(KV_FILE_VERSION, 8);
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
  if (version !== KV_FILE_VERSION) throw new KvFileError(`format version ${version}, expected ${KV_FILE_VERSION}`);
  const n = b.readUInt32LE(12);
  if (n < 2 || n > MAX_HEADER_BYTES) throw new KvFileError(`implausible header length ${n}`);
  return n;
}

export interface ExpectedKvFile {
  namespace: string;
  kv: KvScheme;
  blockBytes: number;
}

/**
 * Checks a file's prefix + header bytes against what this cache holds and the file's size.
 * Returns the header and where the payload starts; throws KvFileError for anything off.
 */
export function parseKvFileHeader(prefix: Uint8Array, json: Uint8Array, fileSize: number, expect: ExpectedKvFile): { header: KvFileHeader; payloadOffset: number } {
  const n = kvFileHeaderLength(prefix);
  if (json.byteLength !== n) throw new KvFileError('truncated inside the header');
  const digest = createHash('sha256').update(json).digest();
  if (!digest.equals(Buffer.from(prefix.buffer, prefix.byteOffset + 16, 32))) throw new KvFileError('header checksum mismatch');
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
  if (!Array.isArray(h.blockCrc) || h.blockCrc.length === 0 || !h.blockCrc.every((c) => Number.isInteger(c) && c >= 0 && c <= 0xffffffff))
    throw new KvFileError('bad block checksums');
  const blocks = h.blockCrc.length;
  if (!Array.isArray(h.tokens) || h.tokens.length !== blocks * expect.kv.blockSize || !h.tokens.every((t) => Number.isInteger(t) && t >= 0))
    throw new KvFileError('bad token ids');
  const payloadOffset = KV_FILE_PREFIX_BYTES + n;
  const want = payloadOffset + blocks * expect.blockBytes;
  if (fileSize !== want) throw new KvFileError(fileSize < want ? `truncated: ${fileSize} bytes of ${want}` : `${fileSize - want} stray bytes after the payload`);
  return { header: h, payloadOffset };
}
