// Paged KV cache. Layers are grouped by attention window: every group has its own block pool
// and each sequence one block table per group, so sliding-window layers hold only the blocks
// their window can still reach (vLLM's hybrid KV layout) while full layers keep everything.
//
// Invariant: for a sequence whose tokens [0, computed) are cached, group g's table maps logical
// block b -> physical block for every b that a query at position >= computed can still read;
// entries a sliding window has passed are -1 and their blocks are back in the pool.

import type { Backend, PagedKv, StepLayout, Tensor } from '../contracts/backend.ts';
import { BlockPool } from './block-pool.ts';
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
  constructor(groupCount: number) {
    this.tables = Array.from({ length: groupCount }, () => []);
  }
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

  constructor(
    private readonly backend: Backend,
    layerWindows: readonly number[],
    readonly shape: KvShape,
    /** physical blocks for each group, in kvGroupsOf order */
    blocksPerGroup: (spec: KvGroupSpec) => number,
  ) {
    const specs = kvGroupsOf(layerWindows);
    this.groups = specs.map((s) => new KvGroup(s, blocksPerGroup(s)));
    this.groupOfLayer = [];
    specs.forEach((s, g) => s.layers.forEach((l) => (this.groupOfLayer[l] = g)));
    const { numKvHeads, headDim, blockSize } = shape;
    this.layerKv = layerWindows.map((_, layer) => {
      const blocks = this.groups[this.groupOfLayer[layer]].pool.numBlocks;
      const dims = [blocks, blockSize, numKvHeads, headDim];
      return { k: backend.zeros(dims, backend.activationDtype), v: backend.zeros(dims, backend.activationDtype) };
    });
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
    const w = this.groups[g].spec.window;
    return w === 0 ? 0 : Math.floor(Math.max(0, start - w + 1) / this.shape.blockSize);
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

  /** Returns every block of `seq` to the pools. */
  release(seq: SequenceKv): void {
    this.groups.forEach((group, g) => {
      group.pool.release(seq.tables[g].filter((b) => b >= 0));
      seq.tables[g] = [];
    });
  }

  /**
   * Uploads the step layout of each group (shared by all layers of the group). The caller owns
   * the tensors (they live in the current backend scope).
   */
  layouts(rows: readonly StepRow[]): StepLayout[] {
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
    const rowTensor = this.backend.upload(tokenRow, [T]);
    const posTensor = this.backend.upload(tokenPos, [T]);
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
      const layout: StepLayout = {
        tokenRow: rowTensor,
        tokenPos: posTensor,
        slots: this.backend.upload(slots, [T]),
        blockTables: this.backend.upload(tables, [rows.length, maxBlocks]),
        blockSize: bs,
      };
      return layout;
    });
  }

  /** Blocks in use across all groups (metrics, leak checks). */
  get usedBlocks(): number {
    return this.groups.reduce((a, g) => a + g.pool.usedCount, 0);
  }

  /** Frees the pool tensors. */
  dispose(): void {
    const freed = new Set<Tensor>();
    for (const kv of this.layerKv)
      for (const t of [kv.k, kv.v]) if (!freed.has(t)) (freed.add(t), this.backend.free(t));
  }
}
