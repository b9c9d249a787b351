// The prefix cache's SSD tier: whole prefixes (a chain of full KV blocks from position 0) spilled
// to files under DIR/<namespace>/ when the engine is idle, restored block-exactly into the KV pool
// for a new request whose prompt starts with one, and kept under a byte cap by evicting the least
// recently used file. Files are named by the hash of their last block; a file that is a prefix of
// a newer one is replaced by it (a multi-turn conversation keeps one file, its newest turn).
//
// Trust: every file is checked when it is indexed (magic, version, header SHA-256, namespace =
// model + tokenizer + KV scheme, shapes, exact length) and every block's CRC-32 when it is read
// back. A file failing any check is removed and counted, never used; I/O errors never throw out of
// this class (a restore that fails is a cache miss).

import { closeSync, fstatSync, mkdirSync, openSync, readdirSync, readSync, statSync, unlinkSync } from 'node:fs';
import { open, rename, unlink, utimes } from 'node:fs/promises';
import { join } from 'node:path';
import { hashTokens, kvBlockBytes, prefixNamespace, type KvScheme } from './block-hash.ts';
import {
  KV_FILE_PREFIX_BYTES, KvFileError, blockCrc, encodeKvFileHeader, kvFileHeaderLength, parseKvFileHeader,
  type ExpectedKvFile,
} from './kv-file.ts';
import type { RestoredBlocks } from './kv-cache.ts';

export interface SsdTierOptions {
  /** the cache directory (--cache-dir); this model's files go in a subdirectory named by its namespace */
  dir: string;
  /** byte cap on this namespace's files */
  maxBytes: number;
  /** model fingerprint (fingerprint.ts) */
  model: string;
  /** tokenizer fingerprint */
  tokenizer?: string;
  kv: KvScheme;
  /** problems worth telling an operator (a corrupt file removed, a failed write) */
  log?: (line: string) => void;
}

/** What the tier reads spilled content from: the KV cache. */
export interface PrefixSource {
  /** contents of the longest leading run of `hashes` in the pool, one buffer per block */
  readPrefix(hashes: readonly string[]): Promise<Uint8Array[]>;
}

export interface SsdStats {
  files: number;
  bytes: number;
  maxBytes: number;
  /** prefixes written */
  writes: number;
  bytesWritten: number;
  /** prefixes read back into the pool, and their blocks */
  restores: number;
  restoredBlocks: number;
  /** files removed because they failed a check (corrupt, truncated, foreign) */
  rejected: number;
  /** files removed by the byte cap */
  evictions: number;
  /** finished sequences' prefixes waiting to be spilled */
  pending: number;
}

interface Entry {
  name: string;
  path: string;
  bytes: number;
  hashes: string[];
  crc: number[];
  payloadOffset: number;
  lastUsed: number;
}

interface Candidate {
  tokens: number[];
  hashes: string[];
  hashSet: Set<string>;
}

const FILE_EXT = '.kvc';
const MAX_PENDING = 256;
/** temporary files of a write that never finished are removed once this old */
const STALE_TMP_MS = 3600_000;

export class SsdTier {
  readonly namespace: string;
  /** the directory holding this namespace's files */
  readonly path: string;
  private readonly expect: ExpectedKvFile;
  private readonly blockBytes: number;
  private readonly entries = new Map<string, Entry>();
  /** block hash -> the files holding it (a hash always sits at the same block index) */
  private readonly byHash = new Map<string, Set<Entry>>();
  private totalBytes = 0;
  private pending: Candidate[] = [];
  private chain: Promise<unknown> = Promise.resolve();
  private tmpCounter = 0;
  private readonly counters = { writes: 0, bytesWritten: 0, restores: 0, restoredBlocks: 0, rejected: 0, evictions: 0 };
  private readonly log: (line: string) => void;

  constructor(private readonly opts: SsdTierOptions) {
    this.namespace = prefixNamespace({ model: opts.model, tokenizer: opts.tokenizer, kv: opts.kv });
    this.path = join(opts.dir, this.namespace.slice(0, 16));
    this.blockBytes = kvBlockBytes(opts.kv);
    this.expect = { namespace: this.namespace, kv: opts.kv, blockBytes: this.blockBytes };
    this.log = opts.log ?? (() => {});
    mkdirSync(this.path, { recursive: true });
    this.scan();
  }

  /** the KV layout its files hold */
  get scheme(): KvScheme {
    return this.opts.kv;
  }

  get stats(): SsdStats {
    return { files: this.entries.size, bytes: this.totalBytes, maxBytes: this.opts.maxBytes, ...this.counters, pending: this.pending.length };
  }

  /** Indexes the files already on disk (a restart), removing every one that fails a check. */
  private scan(): void {
    const now = Date.now();
    for (const name of readdirSync(this.path)) {
      const path = join(this.path, name);
      if (name.startsWith('.tmp-')) {
        try {
          if (now - statSync(path).mtimeMs > STALE_TMP_MS) unlinkSync(path);
        } catch { /* another process's, or gone */ }
        continue;
      }
      if (!name.endsWith(FILE_EXT)) continue;
      let fd: number | undefined;
      try {
        fd = openSync(path, 'r');
        const st = fstatSync(fd);
        const prefix = Buffer.alloc(KV_FILE_PREFIX_BYTES);
        if (readSync(fd, prefix, 0, prefix.length, 0) !== prefix.length) throw new KvFileError('truncated before the end of the header');
        const n = kvFileHeaderLength(prefix);
        if (KV_FILE_PREFIX_BYTES + n > st.size) throw new KvFileError('truncated inside the header');
        const json = Buffer.alloc(n);
        if (readSync(fd, json, 0, n, KV_FILE_PREFIX_BYTES) !== n) throw new KvFileError('truncated inside the header');
        const { header, payloadOffset } = parseKvFileHeader(prefix, json, st.size, this.expect);
        const hashes = hashTokens(this.namespace, header.tokens, this.opts.kv.blockSize);
        this.add({ name, path, bytes: st.size, hashes, crc: header.blockCrc, payloadOffset, lastUsed: st.mtimeMs });
      } catch (err) {
        this.reject(path, err);
      } finally {
        if (fd !== undefined) closeSync(fd);
      }
    }
    this.enforceCap();
  }

  private reject(path: string, err: unknown): void {
    this.counters.rejected++;
    this.log(`prefix cache: removed ${path}: ${err instanceof KvFileError ? err.message : (err as Error).message}`);
    try {
      unlinkSync(path);
    } catch { /* already gone */ }
  }

  private add(e: Entry): void {
    const old = this.entries.get(e.name);
    if (old) this.forget(old);
    this.entries.set(e.name, e);
    this.totalBytes += e.bytes;
    for (const h of e.hashes) {
      let set = this.byHash.get(h);
      if (!set) this.byHash.set(h, (set = new Set()));
      set.add(e);
    }
  }

  private forget(e: Entry): void {
    if (this.entries.get(e.name) !== e) return;
    this.entries.delete(e.name);
    this.totalBytes -= e.bytes;
    for (const h of e.hashes) {
      const set = this.byHash.get(h);
      set?.delete(e);
      if (set?.size === 0) this.byHash.delete(h);
    }
  }

  private async remove(e: Entry): Promise<void> {
    this.forget(e);
    await unlink(e.path).catch(() => {});
  }

  /** How many leading blocks of `hashes` some file holds. */
  longestPrefix(hashes: readonly string[]): number {
    for (let k = hashes.length; k > 0; k--) if (this.byHash.has(hashes[k - 1])) return k;
    return 0;
  }

  /**
   * Reads blocks [from, to) of the prefix `hashes` from the file that holds them, checking each
   * block's CRC. Resolves to undefined (a miss) when no file holds them or the read or a check
   * fails (the file is then removed).
   */
  async load(hashes: readonly string[], from: number, to: number): Promise<RestoredBlocks | undefined> {
    if (to <= from || to > hashes.length) return undefined;
    const entry = [...(this.byHash.get(hashes[to - 1]) ?? [])][0];
    if (!entry) return undefined;
    const bb = this.blockBytes;
    let fh;
    try {
      fh = await open(entry.path, 'r');
      const buf = Buffer.alloc((to - from) * bb);
      const { bytesRead } = await fh.read(buf, 0, buf.length, entry.payloadOffset + from * bb);
      if (bytesRead !== buf.length) throw new KvFileError(`truncated: read ${bytesRead} of ${buf.length} payload bytes`);
      const blocks: Uint8Array[] = [];
      for (let b = from; b < to; b++) {
        const data = buf.subarray((b - from) * bb, (b - from + 1) * bb);
        if (blockCrc(data) !== entry.crc[b]) throw new KvFileError(`block ${b} checksum mismatch`);
        blocks.push(data);
      }
      entry.lastUsed = Date.now();
      const t = new Date();
      await utimes(entry.path, t, t).catch(() => {});
      this.counters.restores++;
      this.counters.restoredBlocks += to - from;
      return { from, blocks };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') this.forget(entry); // removed under us
      else {
        this.forget(entry);
        this.reject(entry.path, err);
      }
      return undefined;
    } finally {
      await fh?.close().catch(() => {});
    }
  }

  /**
   * Offers a finished sequence's prefix (its full computed blocks: `tokens` holds exactly
   * hashes.length blocks) for the next spill. Prefixes already on disk or covered by a pending
   * one are dropped; pending prefixes it extends are replaced by it.
   */
  offer(tokens: readonly number[], hashes: readonly string[]): void {
    const n = hashes.length;
    if (n === 0) return;
    const last = hashes[n - 1];
    if (this.byHash.has(last)) return;
    if (this.pending.some((c) => c.hashSet.has(last))) return;
    const set = new Set(hashes);
    this.pending = this.pending.filter((c) => !set.has(c.hashes[c.hashes.length - 1]));
    this.pending.push({ tokens: tokens.slice(0, n * this.opts.kv.blockSize), hashes: [...hashes], hashSet: set });
    if (this.pending.length > MAX_PENDING) this.pending.shift();
  }

  get pendingCount(): number {
    return this.pending.length;
  }

  /**
   * Writes pending prefixes (oldest first) from `source`, one at a time, until none is left or
   * `stop()` says the engine has work again. Spills never overlap (calls queue up).
   */
  spill(source: PrefixSource, stop: () => boolean = () => false): Promise<{ files: number; bytes: number }> {
    const run = this.chain.then(async () => {
      let files = 0, bytes = 0;
      while (this.pending.length > 0 && !stop()) {
        const c = this.pending.shift()!;
        const written = await this.write(source, c);
        if (written > 0) {
          files++;
          bytes += written;
        }
      }
      return { files, bytes };
    });
    this.chain = run.catch(() => {});
    return run;
  }

  /** Writes one prefix; returns the bytes written (0 when there was nothing to write). */
  private async write(source: PrefixSource, c: Candidate): Promise<number> {
    let data: Uint8Array[];
    try {
      data = await source.readPrefix(c.hashes);
    } catch (err) {
      this.log(`prefix cache: could not read KV blocks to spill: ${(err as Error).message}`);
      return 0;
    }
    const bb = this.blockBytes;
    let m = data.length; // blocks still in the pool, from the start
    if (m === 0) return 0;
    const header = (k: number) => encodeKvFileHeader({
      namespace: this.namespace, model: this.opts.model, tokenizer: this.opts.tokenizer ?? null, kv: this.opts.kv,
      blockBytes: bb, tokens: c.tokens.slice(0, k * this.opts.kv.blockSize), blockCrc: data.slice(0, k).map(blockCrc),
      createdAt: Date.now(),
    });
    let head = header(m);
    if (head.length + m * bb > this.opts.maxBytes) {
      m = Math.floor((this.opts.maxBytes - head.length) / bb); // a prefix of it fits (the header only shrinks)
      if (m <= 0) return 0;
      head = header(m);
    }
    const hashes = c.hashes.slice(0, m);
    if (this.longestPrefix(hashes) === m) return 0; // already on disk
    const name = `${hashes[m - 1]}${FILE_EXT}`;
    const path = join(this.path, name);
    const tmp = join(this.path, `.tmp-${process.pid}-${++this.tmpCounter}`);
    const size = head.length + m * bb;
    try {
      const fh = await open(tmp, 'w');
      try {
        await fh.writev([head, ...data.slice(0, m)]);
      } finally {
        await fh.close();
      }
      await rename(tmp, path);
    } catch (err) {
      await unlink(tmp).catch(() => {});
      this.log(`prefix cache: could not write ${path}: ${(err as Error).message}`);
      return 0;
    }
    // files holding a strict prefix of this one are superseded by it
    for (let b = 0; b < m - 1; b++)
      for (const e of [...(this.byHash.get(hashes[b]) ?? [])]) if (e.hashes.length === b + 1) await this.remove(e);
    this.add({ name, path, bytes: size, hashes, crc: data.slice(0, m).map(blockCrc), payloadOffset: head.length, lastUsed: Date.now() });
    this.counters.writes++;
    this.counters.bytesWritten += size;
    this.enforceCap(name);
    return size;
  }

  /** Removes least recently used files until the total fits the cap (never `keep`). */
  private enforceCap(keep?: string): void {
    if (this.totalBytes <= this.opts.maxBytes) return;
    const byAge = [...this.entries.values()].filter((e) => e.name !== keep).sort((a, b) => a.lastUsed - b.lastUsed);
    for (const e of byAge) {
      if (this.totalBytes <= this.opts.maxBytes) break;
      this.forget(e);
      this.counters.evictions++;
      try {
        unlinkSync(e.path);
      } catch { /* gone */ }
    }
  }

  /** Waits for a running spill to finish. */
  async idle(): Promise<void> {
    await this.chain;
  }

  static readonly fileExtension = FILE_EXT;
}
