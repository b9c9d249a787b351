// The prefix cache's SSD tier: whole prefixes (a chain of full KV blocks from position 0) spilled
// to files under DIR/<namespace>/, restored block-exactly into the KV pool for a new request whose
// prompt starts with one, and kept under a byte cap by evicting the least recently used file.
// Files are named by the hash of their last block; a file that is a prefix of a newer one is
// replaced by it (a multi-turn conversation keeps one file, its newest turn).
//
// When prefixes are written (never inside a decode step):
// - idle: a finished sequence's prefix is offered (pending) and spilled when the engine has
//   nothing to do, or on an explicit flush (SIGTERM, POST /admin/cache/flush);
// - under load: the engine may never be idle, and the RAM tier then evicts prefixes that were
//   never spilled. The KV cache announces each eviction before the block is reused (onEvicted):
//   a pending prefix one of whose blocks goes is read into host memory there and then (the reads
//   are enqueued ahead of the step that reuses the block: one copy per prefix, not per token)
//   and written in the background. Host memory for such captures is bounded (captureBytes): past
//   it the longest leading part that fits is kept, or the prefix is dropped (counted).
//
// Sliding-window models: a sliding group keeps only its window, so a file stores every block of
// the full-attention groups and, of each sliding group, the window's blocks before the end plus
// the contiguous run of earlier blocks the pool still held (kv-cache.ts readPrefix). A file of n
// blocks restores at length k <= n when each sliding group's stored blocks reach back to its
// window at k (always at n).
//
// Trust: every file is checked when it is indexed (magic, version, header SHA-256, namespace =
// model + tokenizer + KV scheme, layer groups, shapes, exact length) and every block's CRC-32 when
// it is read back. A file failing any check is removed and counted, never used; I/O errors never
// throw out of this class (a restore that fails is a cache miss).

import { closeSync, fstatSync, mkdirSync, openSync, readdirSync, readSync, statSync, unlinkSync } from 'node:fs';
import { open, rename, unlink, utimes, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { hashTokens, kvBlockBytes, prefixNamespace, type KvScheme } from './block-hash.ts';
import {
  KV_FILE_PREFIX_BYTES, KvFileError, blockCrc, encodeKvFileHeader, expectedGroups, isPlainLayout, kvFileHeaderLength,
  parseKvFileHeader, type ExpectedKvFile, type KvFileHeader,
} from './kv-file.ts';
import { firstLiveBlock, type KvGroupSpec, type PrefixBlocks, type RestoredBlocks } from './kv-cache.ts';

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
  /** the KV cache's layer groups (kvGroupsOf order); default one full-attention group of every layer */
  groups?: readonly KvGroupSpec[];
  /** most host bytes held by prefixes read at eviction and not yet written (default min(512 MiB, maxBytes)) */
  captureBytes?: number;
  /** problems worth telling an operator (a corrupt file removed, a failed write) */
  log?: (line: string) => void;
  /** opens a temporary file for writing (default fs/promises open); a seam for injecting write failures */
  openForWrite?: (path: string) => Promise<FileHandle>;
}

/** A prefix file that could not be written: the errno code (ENOSPC, EROFS, EACCES, ...; EIO when the OS gave none). */
export interface SsdWriteError {
  code: string;
  message: string;
}

/** What one spill or flush wrote, and the writes that failed. */
export interface SpillResult {
  files: number;
  bytes: number;
  errors: SsdWriteError[];
}

/** What the tier reads spilled content from: the KV cache. */
export interface PrefixSource {
  /**
   * The longest restorable prefix of `hashes` the pool holds (kv-cache.ts readPrefix). Every
   * device read is enqueued before it returns: called while a block is being evicted, it reads
   * the block's content before anything reuses it.
   */
  readPrefix(hashes: readonly string[]): Promise<PrefixBlocks>;
}

export interface SsdStats {
  files: number;
  bytes: number;
  maxBytes: number;
  /** prefixes written */
  writes: number;
  bytesWritten: number;
  /** prefixes read back into the pool, and their (logical) blocks */
  restores: number;
  restoredBlocks: number;
  /** files removed because they failed a check (corrupt, truncated, foreign) */
  rejected: number;
  /** files removed by the byte cap */
  evictions: number;
  /** finished sequences' prefixes waiting to be spilled */
  pending: number;
  /** pending prefixes read into host memory because the RAM tier evicted them first (busy engine) */
  captures: number;
  /** host bytes of captured prefixes not yet written */
  captureBytes: number;
  /** pending prefixes lost before they were written (no room to capture them, too many pending) */
  dropped: number;
  /** failed prefix writes, by errno code */
  writeErrors: Record<string, number>;
  /** bytes of temporary files (writes in progress, another live process's) counted against the cap */
  tempBytes: number;
}

interface Entry {
  name: string;
  path: string;
  bytes: number;
  /** hashes of blocks [0, n) */
  hashes: string[];
  /** per group: first stored block (0 for full-attention groups) */
  from: number[];
  /** per group: CRC-32 of stored blocks [from, n) */
  crc: number[][];
  /** per group: file offset of its block `from` */
  offsets: number[];
  lastUsed: number;
}

interface Candidate {
  tokens: Int32Array;
  hashes: string[];
  last: string;
}

const FILE_EXT = '.kvc';
/** pending prefixes kept at most (count, tokens); past either the oldest are dropped */
const MAX_PENDING = 1024;
const MAX_PENDING_TOKENS = 8 << 20;
/**
 * A prefix that extends one already on disk by fewer than 1/16 of its blocks is not written:
 * restoring the shorter file and computing the rest is nearly as good, and a whole new file per
 * request (the same long system prompt + a short new message) would churn the disk.
 */
const MIN_NEW_FRACTION = 16;
const DEFAULT_CAPTURE_BYTES = 512 << 20;
/** file reads and writes go in pieces of at most this (the OS caps one call near 2 GiB) */
const IO_CHUNK_BYTES = 64 << 20;
/** checksumming hands the event loop back this often, so a write under load never holds it long */
const YIELD_MS = 4;
/** temporary files of a write that never finished are removed once this old */
const STALE_TMP_MS = 3600_000;
/** temporary files this process is writing now (any tier): names are unique per process, never swept as orphans */
const writingNow = new Set<string>();
let tmpCounter = 0;

export class SsdTier {
  readonly namespace: string;
  /** the directory holding this namespace's files */
  readonly path: string;
  private readonly expect: ExpectedKvFile;
  private readonly blockBytes: number;
  private readonly groups: { window: number; layers: number[] }[];
  private readonly groupBytes: number[];
  private readonly captureLimit: number;
  private readonly entries = new Map<string, Entry>();
  /** block hash -> the files holding it (a hash always sits at the same block index) */
  private readonly byHash = new Map<string, Set<Entry>>();
  private totalBytes = 0;
  private pending: Candidate[] = [];
  /** block hash -> pending prefixes holding it */
  private readonly pendingByHash = new Map<string, Set<Candidate>>();
  private pendingTokens = 0;
  private capturedBytes = 0;
  private chain: Promise<unknown> = Promise.resolve();
  private readonly counters = { writes: 0, bytesWritten: 0, restores: 0, restoredBlocks: 0, rejected: 0, evictions: 0, captures: 0, dropped: 0 };
  private readonly writeErrors: Record<string, number> = {};
  /** bytes of this process's writes in progress (their temporary files) */
  private writingBytes = 0;
  /** another live process's temporary files found at startup: path -> bytes (re-checked by enforceCap) */
  private readonly foreignTmp = new Map<string, number>();
  private readonly log: (line: string) => void;

  constructor(private readonly opts: SsdTierOptions) {
    this.namespace = prefixNamespace({ model: opts.model, tokenizer: opts.tokenizer, kv: opts.kv });
    this.path = join(opts.dir, this.namespace.slice(0, 16));
    this.blockBytes = kvBlockBytes(opts.kv);
    this.expect = { namespace: this.namespace, kv: opts.kv, blockBytes: this.blockBytes, groups: opts.groups };
    this.groups = expectedGroups(this.expect);
    const perLayer = this.blockBytes / opts.kv.numLayers;
    this.groupBytes = this.groups.map((g) => perLayer * g.layers.length);
    this.captureLimit = Math.max(0, opts.captureBytes ?? Math.min(DEFAULT_CAPTURE_BYTES, opts.maxBytes));
    this.log = opts.log ?? (() => {});
    mkdirSync(this.path, { recursive: true });
    this.scan();
  }

  /** the KV layout its files hold */
  get scheme(): KvScheme {
    return this.opts.kv;
  }

  get stats(): SsdStats {
    return {
      files: this.entries.size, bytes: this.totalBytes, maxBytes: this.opts.maxBytes, ...this.counters,
      pending: this.pending.length, captureBytes: this.capturedBytes, writeErrors: { ...this.writeErrors }, tempBytes: this.tempBytes,
    };
  }

  get pendingCount(): number {
    return this.pending.length;
  }

  /** First block group g must hold for a sequence to resume at block k. */
  private needFrom(g: number, k: number): number {
    return firstLiveBlock(this.groups[g].window, k * this.opts.kv.blockSize, this.opts.kv.blockSize);
  }

  // ---- the index -------------------------------------------------------------------------------

  /** bytes of temporary files present now (they take disk space, so they count against the cap) */
  private get tempBytes(): number {
    let n = this.writingBytes;
    for (const b of this.foreignTmp.values()) n += b;
    return n;
  }

  /**
   * Indexes the files already on disk (a restart), removing every one that fails a check, and
   * every temporary file no live process is writing (`.tmp-PID-N`: a write cut off by a crash or
   * kill -9; a PID equal to ours is a previous process's, since this one has written nothing yet).
   */
  private scan(): void {
    const now = Date.now();
    let orphans = 0, orphanBytes = 0;
    for (const name of readdirSync(this.path)) {
      const path = join(this.path, name);
      if (name.startsWith('.tmp-')) {
        try {
          const st = statSync(path);
          const pid = Number(/^\.tmp-(\d+)-/.exec(name)?.[1]);
          if (writingNow.has(path)) continue;
          if (now - st.mtimeMs > STALE_TMP_MS || !Number.isInteger(pid) || pid === process.pid || !processAlive(pid)) {
            unlinkSync(path);
            orphans++;
            orphanBytes += st.size;
          } else this.foreignTmp.set(path, st.size);
        } catch { /* gone */ }
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
        const { header, payloadOffset, layout } = parseKvFileHeader(prefix, json, st.size, this.expect);
        const hashes = hashTokens(this.namespace, header.tokens, this.opts.kv.blockSize);
        const crc: number[][] = [], offsets: number[] = [];
        let at = 0, offset = payloadOffset;
        layout.from.forEach((f, g) => {
          const count = layout.blocks - f;
          crc.push(header.blockCrc.slice(at, at + count));
          offsets.push(offset);
          at += count;
          offset += count * this.groupBytes[g];
        });
        this.add({ name, path, bytes: st.size, hashes, from: layout.from, crc, offsets, lastUsed: st.mtimeMs });
      } catch (err) {
        this.reject(path, err);
      } finally {
        if (fd !== undefined) closeSync(fd);
      }
    }
    if (orphans > 0) this.log(`prefix cache: removed ${orphans} orphaned temporary file${orphans === 1 ? '' : 's'} (${orphanBytes} bytes) of writes that never finished in ${this.path}`);
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

  /** true when `e` stores what a file of blocks [0, k) with groups from `from` would (e holds block k - 1's hash) */
  private covers(e: Entry, from: readonly number[]): boolean {
    return e.from.every((f, g) => f <= from[g]);
  }

  /** A file holding hashes[0, k) that a sequence can resume from at block k. */
  private fileFor(hashes: readonly string[], k: number): Entry | undefined {
    const set = this.byHash.get(hashes[k - 1]);
    if (!set) return undefined;
    const need = this.groups.map((_, g) => this.needFrom(g, k));
    for (const e of set) if (this.covers(e, need)) return e;
    return undefined;
  }

  /** How many leading blocks of `hashes` some file can restore (a sequence resumes after them). */
  longestPrefix(hashes: readonly string[]): number {
    for (let k = hashes.length; k > 0; k--) if (this.byHash.has(hashes[k - 1]) && this.fileFor(hashes, k)) return k;
    return 0;
  }

  // ---- restore ---------------------------------------------------------------------------------

  /**
   * Reads blocks [from[g], to) of each group g of the prefix `hashes` (kv-cache.ts
   * blocksToRestore) from a file that restores it at `to`, checking each block's CRC. Resolves to
   * undefined (a miss) when no file holds them or the read or a check fails (the file is then
   * removed).
   */
  async load(hashes: readonly string[], to: number, from: readonly number[] = []): Promise<RestoredBlocks | undefined> {
    if (to <= 0 || to > hashes.length) return undefined;
    const entry = this.fileFor(hashes, to);
    if (!entry) return undefined;
    let fh: FileHandle | undefined;
    try {
      fh = await open(entry.path, 'r');
      const groups: { from: number; blocks: Uint8Array[] }[] = [];
      for (let g = 0; g < this.groups.length; g++) {
        const first = Math.min(to, Math.max(from[g] ?? 0, entry.from[g]));
        groups.push({ from: first, blocks: await this.readGroup(fh, entry, g, first, to) });
      }
      entry.lastUsed = Date.now();
      const t = new Date();
      await utimes(entry.path, t, t).catch(() => {});
      this.counters.restores++;
      this.counters.restoredBlocks += to - Math.min(...groups.map((g) => g.from));
      return { blocks: to, groups };
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

  /** Group g's stored blocks [from, to) of `entry`, each CRC-checked. */
  private async readGroup(fh: FileHandle, entry: Entry, g: number, from: number, to: number): Promise<Uint8Array[]> {
    const gb = this.groupBytes[g];
    const per = Math.max(1, Math.floor(IO_CHUNK_BYTES / gb));
    const out: Uint8Array[] = [];
    for (let b = from; b < to; b += per) {
      const n = Math.min(per, to - b);
      const buf = Buffer.allocUnsafe(n * gb);
      const position = entry.offsets[g] + (b - entry.from[g]) * gb;
      const { bytesRead } = await fh.read(buf, 0, buf.length, position);
      if (bytesRead !== buf.length) throw new KvFileError(`truncated: read ${bytesRead} of ${buf.length} payload bytes`);
      for (let j = 0; j < n; j++) {
        const data = buf.subarray(j * gb, (j + 1) * gb);
        if (blockCrc(data) !== entry.crc[g][b + j - entry.from[g]]) throw new KvFileError(`block ${b + j} (layer group ${g}) checksum mismatch`);
        out.push(data);
      }
    }
    return out;
  }

  // ---- spill -----------------------------------------------------------------------------------

  /**
   * Offers a finished sequence's prefix (its full computed blocks: `tokens` holds at least
   * hashes.length blocks) for the next spill. Prefixes (nearly) on disk already or held by a
   * pending one are dropped; pending prefixes it extends are replaced by it.
   */
  offer(tokens: readonly number[], hashes: readonly string[]): void {
    const n = hashes.length;
    if (n === 0) return;
    if ((n - this.longestPrefix(hashes)) * MIN_NEW_FRACTION < n) return;
    const last = hashes[n - 1];
    if (this.pendingByHash.has(last)) return;
    for (const h of hashes) for (const c of [...(this.pendingByHash.get(h) ?? [])]) if (c.last === h) this.unpend(c);
    const c: Candidate = { tokens: Int32Array.from(tokens.slice(0, n * this.opts.kv.blockSize)), hashes: [...hashes], last };
    this.pending.push(c);
    this.pendingTokens += c.tokens.length;
    for (const h of c.hashes) {
      let set = this.pendingByHash.get(h);
      if (!set) this.pendingByHash.set(h, (set = new Set()));
      set.add(c);
    }
    while (this.pending.length > MAX_PENDING || this.pendingTokens > MAX_PENDING_TOKENS) {
      this.unpend(this.pending[0]);
      this.counters.dropped++;
    }
  }

  private unpend(c: Candidate): void {
    const i = this.pending.indexOf(c);
    if (i < 0) return;
    this.pending.splice(i, 1);
    this.pendingTokens -= c.tokens.length;
    for (const h of c.hashes) {
      const set = this.pendingByHash.get(h);
      set?.delete(c);
      if (set?.size === 0) this.pendingByHash.delete(h);
    }
  }

  /**
   * The RAM tier is about to evict the block registered under `hash` (its content still intact).
   * Every pending prefix holding it is read from `source` now and written in the background.
   * Costs one map lookup when the block belongs to no pending prefix.
   */
  onEvicted(hash: string, source: PrefixSource): void {
    const set = this.pendingByHash.get(hash);
    if (!set) return;
    for (const c of [...set]) this.capture(c, source);
  }

  private capture(c: Candidate, source: PrefixSource): void {
    this.unpend(c);
    const m = Math.min(c.hashes.length, Math.floor((this.captureLimit - this.capturedBytes) / this.blockBytes));
    if (m <= 0) {
      this.counters.dropped++;
      return;
    }
    const hashes = c.hashes.slice(0, m);
    let data: Promise<PrefixBlocks>;
    try {
      data = source.readPrefix(hashes); // enqueued now, before the block is reused
    } catch (err) {
      this.counters.dropped++;
      this.log(`prefix cache: could not read KV blocks to spill: ${(err as Error).message}`);
      return;
    }
    data.catch(() => {}); // reported by the write below
    const bytes = m * this.blockBytes; // at most what the blocks of every group take
    this.capturedBytes += bytes;
    this.counters.captures++;
    const candidate: Candidate = { tokens: c.tokens.subarray(0, m * this.opts.kv.blockSize), hashes, last: hashes[m - 1] };
    this.enqueue(async () => {
      try {
        await this.write(candidate, await data);
      } catch (err) {
        this.log(`prefix cache: could not read KV blocks to spill: ${(err as Error).message}`);
      } finally {
        this.capturedBytes -= bytes;
      }
    });
  }

  private enqueue<T>(job: () => Promise<T>): Promise<T> {
    const run = this.chain.then(job);
    this.chain = run.catch(() => {});
    return run;
  }

  /**
   * Writes pending prefixes (oldest first) from `source`, one at a time, until none is left or
   * `stop()` says the engine has work again. Spills and captured writes never overlap (they queue).
   */
  spill(source: PrefixSource, stop: () => boolean = () => false): Promise<SpillResult> {
    return this.enqueue(async () => {
      let files = 0, bytes = 0;
      const errors: SsdWriteError[] = [];
      while (this.pending.length > 0 && !stop()) {
        const c = this.pending[0];
        this.unpend(c);
        let data: PrefixBlocks;
        try {
          data = await source.readPrefix(c.hashes);
        } catch (err) {
          this.log(`prefix cache: could not read KV blocks to spill: ${(err as Error).message}`);
          continue;
        }
        const written = await this.write(c, data, errors);
        if (written > 0) {
          files++;
          bytes += written;
        }
      }
      return { files, bytes, errors };
    });
  }

  /**
   * Writes one prefix's blocks; returns the bytes written (0 when there was nothing to write or
   * the write failed: the failure is counted by errno code, logged, and pushed onto `errors`).
   */
  private async write(c: Candidate, data: PrefixBlocks, errors?: SsdWriteError[]): Promise<number> {
    const k = data.blocks;
    if (k === 0 || data.groups.length !== this.groups.length) return 0;
    const have = data.groups.map((g) => g.from);
    const bs = this.opts.kv.blockSize;
    const plain = isPlainLayout(this.groups);
    const header = (n: number, from: readonly number[], crc: number[]) => {
      const h: KvFileHeader = {
        namespace: this.namespace, model: this.opts.model, tokenizer: this.opts.tokenizer ?? null, kv: this.opts.kv,
        blockBytes: this.blockBytes, tokens: Array.from(c.tokens.subarray(0, n * bs)), blockCrc: crc, createdAt: Date.now(),
      };
      if (!plain) h.groups = this.groups.map((g, i) => ({ window: g.window, layers: g.layers, from: from[i] }));
      return encodeKvFileHeader(h);
    };
    const payload = (n: number, from: readonly number[]) => from.reduce((a, f, g) => a + (n - f) * this.groupBytes[g], 0);
    // the byte cap: drop the sliding blocks past the window first, then shorten the prefix
    const headBound = header(k, have, new Array<number>(have.reduce((a, f) => a + k - f, 0)).fill(0xffffffff)).length;
    let n = k, from = have;
    if (headBound + payload(n, from) > this.opts.maxBytes) {
      n = 0;
      for (let m = k; m > 0; m--) {
        const f = this.groups.map((_, g) => this.needFrom(g, m));
        if (f.every((x, g) => x >= have[g]) && headBound + payload(m, f) <= this.opts.maxBytes) {
          n = m;
          from = f;
          break;
        }
      }
      if (n === 0) return 0;
    }
    const hashes = c.hashes.slice(0, n);
    for (const e of this.byHash.get(hashes[n - 1]) ?? []) if (this.covers(e, from)) return 0; // already on disk
    // checksums (handing the event loop back now and then: this may run beside a busy engine)
    const parts: Uint8Array[] = [], crc: number[][] = [];
    let t = performance.now();
    for (let g = 0; g < this.groups.length; g++) {
      const list: number[] = [];
      for (let b = from[g]; b < n; b++) {
        const d = data.groups[g].blocks[b - have[g]];
        parts.push(d);
        list.push(blockCrc(d));
        if (performance.now() - t > YIELD_MS) {
          await nextTurn();
          t = performance.now();
        }
      }
      crc.push(list);
    }
    const head = header(n, from, crc.flat());
    const name = `${hashes[n - 1]}${FILE_EXT}`;
    const path = join(this.path, name);
    const tmp = join(this.path, `.tmp-${process.pid}-${++tmpCounter}`);
    const size = head.length + payload(n, from);
    // files this one supersedes once written (a prefix of it, all of whose restore points it has)
    const superseded = new Set<Entry>();
    for (let b = 0; b < n - 1; b++)
      for (const e of this.byHash.get(hashes[b]) ?? []) if (e.hashes.length === b + 1 && from.every((f, g) => f <= e.from[g])) superseded.add(e);
    // the temporary file counts against the cap while it exists: room is made before it is
    // written (the files it supersedes go after it instead of being evicted for it)
    this.writingBytes += size;
    writingNow.add(tmp);
    try {
      this.enforceCap(undefined, superseded);
      const fh = await (this.opts.openForWrite ?? ((p: string) => open(p, 'w')))(tmp);
      try {
        await writeAll(fh, [head, ...parts]);
      } finally {
        await fh.close();
      }
      await rename(tmp, path);
    } catch (err) {
      await unlink(tmp).catch(() => {});
      const code = (err as NodeJS.ErrnoException).code ?? 'EIO';
      const message = (err as Error).message;
      this.writeErrors[code] = (this.writeErrors[code] ?? 0) + 1;
      errors?.push({ code, message });
      this.log(`prefix cache: could not write ${path}: ${code}: ${message}`);
      return 0;
    } finally {
      this.writingBytes -= size;
      writingNow.delete(tmp);
    }
    for (const e of superseded) await this.remove(e);
    const offsets: number[] = [];
    let offset = head.length;
    from.forEach((f, g) => {
      offsets.push(offset);
      offset += (n - f) * this.groupBytes[g];
    });
    this.add({ name, path, bytes: size, hashes, from: [...from], crc, offsets, lastUsed: Date.now() });
    this.counters.writes++;
    this.counters.bytesWritten += size;
    this.enforceCap(name);
    return size;
  }

  /**
   * Removes least recently used files until the total (temporary files included) fits the cap;
   * never `keep`, and never a file of `spare`, whose bytes are left out of the total (about to go).
   */
  private enforceCap(keep?: string, spare: ReadonlySet<Entry> = new Set()): void {
    for (const [path, bytes] of this.foreignTmp) {
      try {
        const st = statSync(path);
        if (Date.now() - st.mtimeMs > STALE_TMP_MS) {
          unlinkSync(path);
          this.foreignTmp.delete(path);
        } else if (st.size !== bytes) this.foreignTmp.set(path, st.size);
      } catch {
        this.foreignTmp.delete(path); // renamed into place or removed by its writer
      }
    }
    let spareBytes = 0;
    for (const e of spare) if (this.entries.get(e.name) === e) spareBytes += e.bytes;
    const other = this.tempBytes - spareBytes;
    if (this.totalBytes + other <= this.opts.maxBytes) return;
    const byAge = [...this.entries.values()].filter((e) => e.name !== keep && !spare.has(e)).sort((a, b) => a.lastUsed - b.lastUsed);
    for (const e of byAge) {
      if (this.totalBytes + other <= this.opts.maxBytes) break;
      this.forget(e);
      this.counters.evictions++;
      try {
        unlinkSync(e.path);
      } catch { /* gone */ }
    }
  }

  /** Waits for running spills and captured writes to finish. */
  async idle(): Promise<void> {
    await this.chain;
  }

  static readonly fileExtension = FILE_EXT;
}

/**
 * Writes `parts` in order from offset 0, in calls of at most IO_CHUNK_BYTES. A short write (the
 * disk filling up) is continued from where it stopped, so the call that cannot write anything
 * fails with the OS's errno (ENOSPC), not a byte count.
 */
async function writeAll(fh: FileHandle, parts: Uint8Array[]): Promise<void> {
  let position = 0;
  for (let i = 0; i < parts.length;) {
    let batch: Uint8Array[] = [];
    let bytes = 0;
    while (i < parts.length && batch.length < 512 && (batch.length === 0 || bytes + parts[i].byteLength <= IO_CHUNK_BYTES)) {
      bytes += parts[i].byteLength;
      batch.push(parts[i++]);
    }
    while (bytes > 0) {
      const { bytesWritten } = await fh.writev(batch, position);
      if (bytesWritten <= 0) throw Object.assign(new Error(`wrote 0 of ${bytes} bytes at offset ${position}`), { code: 'EIO' });
      position += bytesWritten;
      bytes -= bytesWritten;
      batch = skipBytes(batch, bytesWritten);
    }
  }
}

/** `parts` without their first `n` bytes */
function skipBytes(parts: Uint8Array[], n: number): Uint8Array[] {
  let i = 0;
  while (i < parts.length && n >= parts[i].byteLength) n -= parts[i++].byteLength;
  const rest = parts.slice(i);
  if (rest.length > 0 && n > 0) rest[0] = rest[0].subarray(n);
  return rest;
}

/** true when a process with this id exists (EPERM: it exists, owned by another user) */
function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
