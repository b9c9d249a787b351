// Chained prefix-block hashes. Block b of a sequence is identified by
//   h(b) = sha256(h(b - 1) || token ids of block b as int32 LE)   (first 16 bytes, hex)
//   h(-1) = the namespace: everything besides the token ids that the KV content depends on
// so equal hashes mean equal tokens from position 0 up to the end of the block, under the same
// model weights and KV layout: exactly when K/V content can be shared. Only full blocks are hashed.

import { createHash } from 'node:crypto';
import { rowBytes, type DType } from '../contracts/backend.ts';

/** How KV content is laid out: two caches agree on content only when these agree. */
export interface KvScheme {
  /** element type of the KV pools ('f32' on the CPU backends by default; int8 / fp8 rows carry a scale: rowBytes) */
  dtype: DType;
  blockSize: number;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
}

/** Bytes one logical block takes across every layer, K and V. */
export function kvBlockBytes(s: KvScheme): number {
  return s.numLayers * 2 * s.blockSize * s.numKvHeads * rowBytes(s.dtype, s.headDim);
}

/** What the KV of a token sequence depends on besides its token ids. */
export interface PrefixNamespaceParts {
  /** model fingerprint (config + weight headers), see fingerprint.ts */
  model: string;
  kv: KvScheme;
  /** tokenizer fingerprint: token ids mean the same text only under the same tokenizer */
  tokenizer?: string;
  /** LoRA adapter id, when adapters exist */
  adapter?: string | null;
}

/** The namespace hash (64 hex digits) that seeds every chain. */
export function prefixNamespace(p: PrefixNamespaceParts): string {
  const kv = { dtype: p.kv.dtype, blockSize: p.kv.blockSize, numLayers: p.kv.numLayers, numKvHeads: p.kv.numKvHeads, headDim: p.kv.headDim };
  const canonical = JSON.stringify({ v: 1, model: p.model, kv, tokenizer: p.tokenizer ?? null, adapter: p.adapter ?? null });
  return createHash('sha256').update(canonical).digest('hex');
}

/**
 * Hashes of full blocks [fromBlock, toBlock) of a token sequence. `prev` is the hash of block
 * fromBlock - 1 (ignored when fromBlock is 0: the chain starts at the namespace).
 */
export function chainHashes(
  namespace: string,
  tokenAt: (pos: number) => number,
  blockSize: number,
  fromBlock: number,
  toBlock: number,
  prev?: string,
): string[] {
  const out: string[] = [];
  const ids = new Int32Array(blockSize);
  const bytes = new Uint8Array(ids.buffer);
  let parent = fromBlock === 0 ? namespace.slice(0, 32) : prev;
  if (parent === undefined) throw new Error(`chainHashes: block ${fromBlock} needs the hash of block ${fromBlock - 1}`);
  for (let b = fromBlock; b < toBlock; b++) {
    for (let k = 0; k < blockSize; k++) ids[k] = tokenAt(b * blockSize + k);
    parent = createHash('sha256').update(parent, 'hex').update(bytes).digest('hex').slice(0, 32);
    out.push(parent);
  }
  return out;
}

/** Hashes of the full blocks among tokens[0, count). */
export function hashTokens(namespace: string, tokens: readonly number[], blockSize: number, count = tokens.length): string[] {
  return chainHashes(namespace, (p) => tokens[p], blockSize, 0, Math.floor(count / blockSize));
}
