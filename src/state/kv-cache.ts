// Paged KV cache. Layers are grouped by attention window: every group has its own block pool
// and each sequence one block table per group, so sliding-window layers hold only the blocks
// their window can still reach (vLLM's hybrid KV layout) while full layers keep everything.
//
// Invariant: for a sequence whose tokens [0, computed) are cached, group g's table maps logical
// block b -> physical block for every b that a query at position >= computed can still read;
// entries a sliding window has passed are -1 and their blocks are back in the pool.
//
// Prefix reuse: every full, computed block of a sequence is registered in each group's pool under
// its chained hash (block-hash.ts), so a later sequence whose prompt starts with the same blocks
// takes references to them instead of recomputing them. A block registered under a hash is never
// written again (only full blocks are registered, and a sequence only writes positions >= its
// `computed`). Sliding-window groups share too: a prefix of k blocks is reusable when every full
// group holds blocks [0, k) and every sliding group the blocks its window reaches back to from
// position k*blockSize (the blocks it passed earlier went to its LRU and may be gone).
//
// The same rule says what the SSD tier must keep of a prefix (PrefixBlocks): full groups every
// block, sliding groups at least their window's blocks before its end. readPrefix also hands over
// the earlier sliding blocks the pool still holds (a contiguous run back from the window), so
// shorter prefixes of a spilled one restore too.

import type { Backend, DType, HostStepLayout, PagedKv, StepLayout, Tensor } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { BlockPool } from './block-pool.ts';
import { chainHashes, kvBlockBytes, type KvScheme } from './block-hash.ts';
import { rowBytes } from '../contracts/backend.ts';
import type { KvAccess } from '../models/decoder.ts';

export interface KvGroupSpec {
  /** 0 = full attention; W = sliding window */
  window: number;
  layers: number[];
}

/** Groups layer indices by their window (0 = full). */
export function kvGroupsOf(layerWindows: readonly number[]): KvGroupSpec[] {
  const byWindow = new Map<number, number[]>();
  layerWindows.forEach((w, layer) => {
    const list = byWindow.get(w) ?? [];
    list.push(layer);
    byWindow.set(w, list);
  });
  return [...byWindow.entries()].map(([window, layers]) => ({ window, layers }));
}

export interface KvShape {
  numKvHeads: number;
  headDim: number;
  blockSize: number;
  /** what the pools hold (default: the backend's activation dtype) */
  dtype?: DType;
}

/**
 * First logical block a query at position `pos` can read in a group with `window` (0 = full
 * attention: block 0). A sequence resuming at pos = k * blockSize needs blocks [this, k).
 */
export function firstLiveBlock(window: number, pos: number, blockSize: number): number {
  return window === 0 ? 0 : Math.floor(Math.max(0, pos - window + 1) / blockSize);
}

/** Blocks one sequence of `tokens` needs in a group, when it is computed in chunks of `chunk`. */
export function blocksPerSequence(window: number, tokens: number, blockSize: number, chunk: number): number {
  const full = Math.ceil(tokens / blockSize);
  if (window === 0) return full;
  // a chunk starting at s reads from s - W + 1; the span (W - 1 + chunk) can straddle one extra block
  return Math.min(full, Math.ceil((window - 1 + chunk) / blockSize) + 1);
}

class KvGroup {
  readonly pool: BlockPool;
  constructor(readonly spec: KvGroupSpec, numBlocks: number) {
    this.pool = new BlockPool(numBlocks);
  }
}

/** The KV state of one sequence: a block table per group. */
export class SequenceKv {
  /** tables[g][logicalBlock] = physical block, or -1 once a sliding window has passed it */
  readonly tables: number[][];
  /** prefix hashes of logical blocks [0, hashes.length): full, computed, and (maybe) shared */
  hashes: string[] = [];
  constructor(groupCount: number) {
    this.tables = Array.from({ length: groupCount }, () => []);
  }
}

/** Prefix reuse settings of a KV cache. */
export interface PrefixCacheOptions {
  /** seeds every block hash (block-hash.ts prefixNamespace) */
  namespace: string;
  /** bytes of evictable cached blocks kept in the pool; 0 = reuse off (default: the whole pool) */
  maxCachedBytes?: number;
}

/**
 * Content of one group's blocks [from, from + blocks.length) of a prefix: per block, for each of
 * the group's layers (kvGroupsOf order) its K block then its V block, raw bytes of the pool dtype.
 */
export interface GroupBlocks {
  from: number;
  blocks: Uint8Array[];
}

/**
 * Content of a prefix of `blocks` full blocks, one range per group (kvGroupsOf order). Spilled
 * (readPrefix): full groups [0, blocks), sliding groups from at most their first live block at the
 * end. Restored (SsdTier.load): the same, less what the pool already held when it was read.
 */
export interface PrefixBlocks {
  blocks: number;
  groups: GroupBlocks[];
}

/** What the SSD tier read back for a waiting sequence, until admission writes it into the pool. */
export type RestoredBlocks = PrefixBlocks;

/** Where a sequence's reused prefix came from, in blocks. */
export interface AttachedPrefix {
  ramBlocks: number;
  ssdBlocks: number;
  tokens: number;
}

/** One batch row of a step: tokens at positions [start, start + count) of `seq`. */
export interface StepRow {
  seq: SequenceKv;
  start: number;
  count: number;
  ropeLength?: number;
}

export class KvCache implements KvAccess<StepRow> {
  readonly groups: KvGroup[];
  private readonly groupOfLayer: number[];
  private readonly layerKv: PagedKv[];
  /** seeds block hashes; undefined when prefix reuse is off */
  readonly prefixNamespace?: string;
  /**
   * Called with the hash of a cached block about to be evicted, while its content is intact (see
   * BlockPool.onEvict); the SSD tier reads a never-spilled prefix then. Errors are swallowed.
   */
  onEvict?: (hash: string) => void;
  /** why prefix reuse is off (undefined when it is on) */
  readonly prefixOff?: string;

  constructor(
    private readonly backend: Backend,
    layerWindows: readonly number[],
    readonly shape: KvShape,
    /** physical blocks for each group, in kvGroupsOf order */
    blocksPerGroup: (spec: KvGroupSpec) => number,
    prefix?: PrefixCacheOptions,
  ) {
    const specs = kvGroupsOf(layerWindows);
    this.groups = specs.map((s) => new KvGroup(s, blocksPerGroup(s)));
    for (const g of this.groups) {
      g.pool.onEvict = (hash) => {
        try {
          this.onEvict?.(hash);
        } catch { /* a listener's failure must not break allocation */ }
      };
    }
    this.groupOfLayer = [];
    specs.forEach((s, g) => s.layers.forEach((l) => (this.groupOfLayer[l] = g)));
    const { numKvHeads, headDim, blockSize } = shape;
    this.layerKv = layerWindows.map((_, layer) => {
      const blocks = this.groups[this.groupOfLayer[layer]].pool.numBlocks;
      const dims = [blocks, blockSize, numKvHeads, headDim];
      return { k: backend.zeros(dims, this.dtype), v: backend.zeros(dims, this.dtype) };
    });
    const off = !prefix ? 'not configured' : prefix.maxCachedBytes === 0 ? 'disabled (--prompt-cache 0)' : undefined;
    if (off === undefined && prefix) {
      // the same number of logical blocks in every group: SIZE / bytes of a block across all layers
      const cap = Math.floor((prefix.maxCachedBytes ?? Infinity) / this.blockBytes);
      if (cap > 0) {
        for (const g of this.groups) g.pool.setMaxCached(Math.min(g.pool.numBlocks, cap));
        this.prefixNamespace = prefix.namespace;
      } else this.prefixOff = `--prompt-cache is smaller than one KV block (${this.blockBytes} bytes)`;
    } else this.prefixOff = off;
  }

  /** What the pools hold. */
  get dtype(): DType {
    return this.shape.dtype ?? this.backend.activationDtype;
  }

  /** The KV layout (for namespaces and SSD files). */
  get scheme(): KvScheme {
    return {
      dtype: this.dtype, blockSize: this.shape.blockSize, numLayers: this.layerKv.length,
      numKvHeads: this.shape.numKvHeads, headDim: this.shape.headDim,
    };
  }

  /** Bytes one logical block takes across every layer (K and V). */
  get blockBytes(): number {
    return kvBlockBytes(this.scheme);
  }

  /** Bytes one logical block takes in group g's layers (K and V): the unit of GroupBlocks. */
  groupBlockBytes(g: number): number {
    const { blockSize, numKvHeads, headDim } = this.shape;
    return this.groups[g].spec.layers.length * 2 * blockSize * numKvHeads * rowBytes(this.dtype, headDim);
  }

  kvOfLayer(layer: number): PagedKv {
    return this.layerKv[layer];
  }
  groupIndexOfLayer(layer: number): number {
    return this.groupOfLayer[layer];
  }

  newSequence(): SequenceKv {
    return new SequenceKv(this.groups.length);
  }

  /** First logical block a step starting at `start` must still hold in group g. */
  private firstLiveBlock(g: number, start: number): number {
    return firstLiveBlock(this.groups[g].spec.window, start, this.shape.blockSize);
  }

  /** New blocks each group needs before computing positions [start, end) of `seq`. */
  blocksNeeded(seq: SequenceKv, start: number, end: number): number[] {
    const bs = this.shape.blockSize;
    return this.groups.map((_, g) => {
      const table = seq.tables[g];
      const lastBlock = Math.ceil(end / bs) - 1;
      const first = Math.max(this.firstLiveBlock(g, start), table.length);
      return Math.max(0, lastBlock - first + 1);
    });
  }

  isAllocated(row: StepRow): boolean {
    return this.blocksNeeded(row.seq, row.start, row.start + row.count).every((n) => n === 0);
  }

  canGrow(seq: SequenceKv, start: number, end: number): boolean {
    // Blocks a sliding window releases count as free for the same step.
    return this.blocksNeeded(seq, start, end).every(
      (n, g) => n <= this.groups[g].pool.freeCount + this.releasable(seq, g, start),
    );
  }

  private releasable(seq: SequenceKv, g: number, start: number): number {
    const live = this.firstLiveBlock(g, start);
    let n = 0;
    for (let b = 0; b < Math.min(live, seq.tables[g].length); b++) if (seq.tables[g][b] >= 0) n++;
    return n;
  }

  /** Makes `seq` able to compute positions [start, end): releases passed window blocks, allocates new ones. */
  grow(seq: SequenceKv, start: number, end: number): void {
    const bs = this.shape.blockSize;
    this.groups.forEach((group, g) => {
      const table = seq.tables[g];
      const live = this.firstLiveBlock(g, start);
      for (let b = 0; b < Math.min(live, table.length); b++) {
        if (table[b] >= 0) {
          group.pool.release([table[b]]);
          table[b] = -1;
        }
      }
      while (table.length < live) table.push(-1);
      const need = Math.ceil(end / bs) - table.length;
      if (need > 0) table.push(...group.pool.allocate(need));
    });
  }

  /**
   * true when grow(seq, start, ...) would release a block that a sliding window passes but
   * commit() has not hashed yet (prefix reuse on): a step still in flight is computing it, and
   * released first it would never reach the prefix cache. The engine's pipelined decode waits for
   * that commit instead (only a chunk longer than the window can pass blocks it completes).
   */
  passesUnhashed(seq: SequenceKv, start: number): boolean {
    if (!this.prefixEnabled) return false;
    return this.groups.some((_, g) => {
      const table = seq.tables[g];
      const passed = Math.min(this.firstLiveBlock(g, start), table.length);
      for (let b = seq.hashes.length; b < passed; b++) if (table[b] >= 0) return true;
      return false;
    });
  }

  /** Returns every block of `seq` to the pools (tail first: the LRU then evicts prefix ends first). */
  release(seq: SequenceKv): void {
    this.groups.forEach((group, g) => {
      group.pool.release(seq.tables[g].filter((b) => b >= 0).reverse());
      seq.tables[g] = [];
    });
    seq.hashes = [];
  }

  // ---- prefix reuse --------------------------------------------------------------------------

  get prefixEnabled(): boolean {
    return this.prefixNamespace !== undefined;
  }

  /** true when the backend can copy blocks to and from the host (the SSD tier needs it) */
  get canCopyBlocks(): boolean {
    return typeof this.backend.readBlocks === 'function' && typeof this.backend.writeBlocks === 'function';
  }

  /**
   * Hashes of the prompt blocks a new sequence may reuse: full blocks, never the one holding the
   * last prompt token (it must be computed to produce logits), so floor((n - 1) / blockSize).
   */
  reusableHashes(prompt: readonly number[]): string[] {
    if (!this.prefixNamespace || prompt.length < 2) return [];
    const n = Math.floor((prompt.length - 1) / this.shape.blockSize);
    return chainHashes(this.prefixNamespace, (p) => prompt[p], this.shape.blockSize, 0, n);
  }

  /** How many leading blocks of `hashes` every full-attention group holds now (all of them without one). */
  cachedBlocks(hashes: readonly string[]): number {
    if (!this.prefixEnabled) return 0;
    let b = 0;
    while (b < hashes.length && this.groups.every((g) => g.spec.window !== 0 || g.pool.lookup(hashes[b]) !== undefined)) b++;
    return b;
  }

  /**
   * The longest k <= hashes.length such that a sequence can start at position k * blockSize with
   * blocks the pools hold: every full group [0, k), every sliding group [first live, k).
   */
  attachableBlocks(hashes: readonly string[]): number {
    if (!this.prefixEnabled) return 0;
    return this.longestUsable(hashes.length, (g, b) => this.groups[g].pool.lookup(hashes[b]) !== undefined);
  }

  /** The longest k <= n whose needed blocks (full groups [0, k), sliding [first live, k)) are all `has`. */
  private longestUsable(n: number, has: (g: number, b: number) => boolean): number {
    let k = n;
    this.groups.forEach((g, gi) => {
      if (g.spec.window !== 0) return;
      let b = 0;
      while (b < k && has(gi, b)) b++;
      k = b;
    });
    const bs = this.shape.blockSize;
    for (; k > 0; k--) {
      const ok = this.groups.every((g, gi) => {
        if (g.spec.window === 0) return true;
        for (let b = this.firstLiveBlock(gi, k * bs); b < k; b++) if (!has(gi, b)) return false;
        return true;
      });
      if (ok) return k;
    }
    return 0;
  }

  /**
   * Which blocks of a k-block prefix a restore must read, per group: from the returned block to k.
   * Full groups skip the leading run every full group holds now; sliding groups read their window.
   */
  blocksToRestore(hashes: readonly string[], k: number): number[] {
    const held = Math.min(k, this.cachedBlocks(hashes.slice(0, k)));
    return this.groups.map((g, gi) => (g.spec.window === 0 ? held : this.firstLiveBlock(gi, k * this.shape.blockSize)));
  }

  /**
   * Gives a newly admitted (empty) sequence the longest cached prefix of `hashes` it can start
   * from: references to blocks the pools hold, and blocks `restored` from the SSD tier written into
   * new blocks (the pools' copy wins when both have one). The caller sets the sequence's computed
   * tokens to the result's `tokens`. Allocation is safe because admission promised the sequence
   * its worst case, which covers its prompt.
   */
  attachPrefix(seq: SequenceKv, hashes: readonly string[], restored?: RestoredBlocks): AttachedPrefix {
    const none = { ramBlocks: 0, ssdBlocks: 0, tokens: 0 };
    if (!this.prefixEnabled || hashes.length === 0) return none;
    if (seq.tables.some((t) => t.length > 0)) throw new Error('attachPrefix: the sequence already holds blocks');
    const given = restored && restored.groups.length === this.groups.length ? restored.groups : undefined;
    if (restored && !given) throw new Error(`attachPrefix: restored blocks for ${restored.groups.length} KV groups, expected ${this.groups.length}`);
    given?.forEach((rg, g) => {
      const want = this.groupBlockBytes(g);
      rg.blocks.forEach((d, j) => {
        if (d.byteLength !== want) throw new Error(`attachPrefix: restored block ${rg.from + j} of group ${g} has ${d.byteLength} bytes, expected ${want}`);
      });
    });
    const fromDisk = (g: number, b: number): Uint8Array | undefined => {
      const rg = given?.[g];
      return rg && b >= rg.from && b < rg.from + rg.blocks.length ? rg.blocks[b - rg.from] : undefined;
    };
    const k = this.longestUsable(hashes.length, (g, b) => this.groups[g].pool.lookup(hashes[b]) !== undefined || fromDisk(g, b) !== undefined);
    if (k === 0) return none;
    const bs = this.shape.blockSize;
    // references first: allocating below may evict evictable blocks, never referenced ones
    const RESTORE = -2;
    this.groups.forEach((g, gi) => {
      const first = this.firstLiveBlock(gi, k * bs);
      const table = seq.tables[gi];
      for (let b = 0; b < k; b++) {
        const block = b < first ? undefined : g.pool.lookup(hashes[b]);
        if (b < first) table.push(-1);
        else if (block !== undefined) {
          g.pool.acquire(block);
          table.push(block);
        } else table.push(RESTORE);
      }
    });
    const ssd = new Uint8Array(k);
    this.groups.forEach((g, gi) => {
      const table = seq.tables[gi];
      const at: number[] = [];
      table.forEach((x, b) => x === RESTORE && at.push(b));
      if (at.length === 0) return;
      const ids = g.pool.allocate(at.length);
      const items = at.map((b, j) => {
        table[b] = ids[j];
        ssd[b] = 1;
        return { block: ids[j], data: fromDisk(gi, b)! };
      });
      this.writeGroupBlocks(gi, items);
      // registered last: a restored block is registered only once its write is enqueued
      at.forEach((b, j) => g.pool.register(ids[j], hashes[b]));
    });
    seq.hashes = hashes.slice(0, k);
    const ssdBlocks = ssd.reduce((a, x) => a + x, 0);
    return { ramBlocks: k - ssdBlocks, ssdBlocks, tokens: k * bs };
  }

  /**
   * Registers the blocks of `seq` that became full and computed (tokens [0, computed) are in the
   * cache), so later sequences can share them. Cheap when nothing new filled: one comparison.
   */
  commit(seq: SequenceKv, computed: number, tokenAt: (pos: number) => number): void {
    if (!this.prefixNamespace) return;
    const full = Math.floor(computed / this.shape.blockSize);
    if (full <= seq.hashes.length) return;
    const from = seq.hashes.length;
    const added = chainHashes(this.prefixNamespace, tokenAt, this.shape.blockSize, from, full, seq.hashes[from - 1]);
    added.forEach((h, k) => {
      this.groups.forEach((g, gi) => {
        const block = seq.tables[gi][from + k];
        // (a sliding group may already have passed a block: it was never written, nothing to share)
        if (block !== undefined && block >= 0 && g.pool.hashOfBlock(block) === undefined) g.pool.register(block, h);
      });
      seq.hashes.push(h);
    });
  }

  /**
   * Reads the longest prefix of `hashes` a sequence could start from with what the pools hold
   * (attachableBlocks), as it is once the ops enqueued so far have run: every read is enqueued
   * before this returns, so later ops (a step reusing an evicted block) cannot change it. Full
   * groups give [0, k), sliding groups their window plus the run of earlier blocks still held.
   * Resolves to { blocks: 0 } when nothing is held.
   */
  readPrefix(hashes: readonly string[]): Promise<PrefixBlocks> {
    const k = this.attachableBlocks(hashes);
    if (k === 0) return Promise.resolve({ blocks: 0, groups: [] });
    const read = this.backend.readBlocks?.bind(this.backend);
    if (!read) return Promise.reject(new Error(`the ${this.backend.name} backend cannot read KV blocks back (readBlocks)`));
    const bs = this.shape.blockSize;
    const parts = this.groups.map((g, gi) => {
      let from = this.firstLiveBlock(gi, k * bs);
      if (g.spec.window !== 0) while (from > 0 && g.pool.lookup(hashes[from - 1]) !== undefined) from--;
      const ids = hashes.slice(from, k).map((h) => g.pool.lookup(h)!);
      // all enqueued here, synchronously, before anything else can run
      const reads = g.spec.layers.flatMap((l) => [read(this.layerKv[l].k, ids), read(this.layerKv[l].v, ids)]);
      return { from, n: ids.length, reads };
    });
    return Promise.all(parts.map(async ({ from, n, reads }, gi) => {
      const got = await Promise.all(reads);
      const per = this.groupBlockBytes(gi) / got.length; // one layer's K (or V) block
      const blocks = Array.from({ length: n }, (_, b) => {
        const out = new Uint8Array(this.groupBlockBytes(gi));
        got.forEach((p, j) => out.set(p.subarray(b * per, (b + 1) * per), j * per));
        return out;
      });
      return { from, blocks };
    })).then((groups) => ({ blocks: k, groups }));
  }

  /** Enqueues the writes of restored block contents (GroupBlocks layout) into group g's blocks. */
  private writeGroupBlocks(g: number, items: { block: number; data: Uint8Array }[]): void {
    const write = this.backend.writeBlocks?.bind(this.backend);
    if (!write) throw new Error(`the ${this.backend.name} backend cannot write KV blocks (writeBlocks)`);
    const layers = this.groups[g].spec.layers;
    const per = this.groupBlockBytes(g) / (2 * layers.length);
    const ids = items.map((x) => x.block);
    const buf = new Uint8Array(items.length * per);
    layers.forEach((l, j) => {
      const kv = this.layerKv[l];
      [kv.k, kv.v].forEach((pool, kind) => {
        const at = (2 * j + kind) * per;
        items.forEach((x, i) => buf.set(x.data.subarray(at, at + per), i * per));
        write(pool, ids, buf);
      });
    });
  }

  /** Forgets every evictable cached block (in-use blocks stay shared). Returns how many. */
  dropCachedBlocks(): number {
    return this.groups.reduce((a, g) => a + g.pool.dropCached(), 0);
  }

  /** Prefix-cache bookkeeping in KV bytes (every group's pool, its own layers' share of a block). */
  get prefixStats(): { cachedBytes: number; hashedBytes: number; maxCachedBytes: number; evictions: number } {
    const out = { cachedBytes: 0, hashedBytes: 0, maxCachedBytes: 0, evictions: 0 };
    this.groups.forEach((g) => {
      const bytes = (this.blockBytes * g.spec.layers.length) / this.layerKv.length;
      out.cachedBytes += g.pool.cachedCount * bytes;
      out.hashedBytes += g.pool.hashedCount * bytes;
      out.maxCachedBytes += g.pool.maxCached * bytes;
      out.evictions += g.pool.evictions;
    });
    return out;
  }

  /** KV groups: one step layout each */
  get groupCount(): number {
    return this.groups.length;
  }

  /** The step layout of each group as host arrays (tables as wide as the longest row's). */
  hostLayouts(rows: readonly StepRow[]): HostStepLayout[] {
    const bs = this.shape.blockSize;
    const T = rows.reduce((a, r) => a + r.count, 0);
    const tokenRow = new Int32Array(T);
    const tokenPos = new Int32Array(T);
    let t = 0;
    rows.forEach((row, r) => {
      for (let k = 0; k < row.count; k++, t++) {
        tokenRow[t] = r;
        tokenPos[t] = row.start + k;
      }
    });
    return this.groups.map((_, g) => {
      const maxBlocks = Math.max(1, ...rows.map((r) => r.seq.tables[g].length));
      const tables = new Int32Array(rows.length * maxBlocks).fill(-1);
      const slots = new Int32Array(T);
      let tt = 0;
      rows.forEach((row, r) => {
        const table = row.seq.tables[g];
        tables.set(table, r * maxBlocks);
        for (let k = 0; k < row.count; k++, tt++) {
          const p = row.start + k;
          const block = table[Math.floor(p / bs)];
          if (block === undefined || block < 0) throw new Error(`KV layout: no block for position ${p} (grow first)`);
          slots[tt] = block * bs + (p % bs);
        }
      });
      return { tokenRow, tokenPos, slots, blockTables: tables, maxBlocks, blockSize: bs };
    });
  }

  /**
   * Uploads the step layout of each group (shared by all layers of the group). The caller owns
   * the tensors (they live in the current backend scope).
   */
  layouts(rows: readonly StepRow[]): StepLayout[] {
    const host = this.hostLayouts(rows);
    if (host.length === 0) return [];
    const T = host[0]!.tokenRow.length;
    const rowTensor = this.backend.upload(host[0]!.tokenRow, [T]);
    const posTensor = this.backend.upload(host[0]!.tokenPos, [T]);
    return host.map((h) => ({
      tokenRow: rowTensor,
      tokenPos: posTensor,
      slots: this.backend.upload(h.slots, [T]),
      blockTables: this.backend.upload(h.blockTables, [rows.length, h.maxBlocks]),
      blockSize: h.blockSize,
    }));
  }

  /** Blocks referenced by sequences across all groups (metrics, leak checks); evictable cached blocks are not in use. */
  get usedBlocks(): number {
    return this.groups.reduce((a, g) => a + g.pool.usedCount, 0);
  }

  /** Evictable cached blocks (held by no sequence, kept for reuse). */
  get cachedBlockCount(): number {
    return this.groups.reduce((a, g) => a + g.pool.cachedCount, 0);
  }

  /** Frees the pool tensors. */
  dispose(): void {
    const freed = new Set<Tensor>();
    for (const kv of this.layerKv)
      for (const t of [kv.k, kv.v]) if (!freed.has(t)) (freed.add(t), this.backend.free(t));
  }
}

/**
 * Why a model's KV cannot be shared between sequences, or undefined when it can: the K/V of a
 * token must depend only on the tokens up to it. Rope whose frequencies follow the sequence's
 * total length (dynamic NTK, LongRoPE: the same prefix gets different keys in a longer sequence)
 * breaks that.
 */
export function prefixReuseBlocker(cfg: Pick<ModelConfig, 'layers' | 'recomputeKvPastLength'>): string | undefined {
  const rope = cfg.layers.find((l) => l.rope.type === 'dynamic' || l.rope.type === 'longrope')?.rope.type;
  if (rope) return `the model's ${rope} rope depends on the sequence length`;
  if (cfg.recomputeKvPastLength !== undefined) return 'the model recomputes KV past a length';
  return undefined;
}
