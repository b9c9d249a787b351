// Decode and verify steps replayed from captured graphs (Backend.captureGraph), one per bucket.
//
// A decode step enqueues a few hundred small ops; issuing them one by one costs more host time
// than the device needs to run them. A graph records a step once and replays it with one launch.
// What changes between steps travels in one packed i32 input buffer, copied in before each replay:
//   [ids T | tokenRow T | tokenPos T | pick T | per KV group: slots T, blockTables rows x width]
// The block tables have a fixed width (the longest sequence the engine allows), so a growing
// sequence never changes a shape.
//
// Two kinds of bucket, both with logits for every token:
// - decode (one token a row): R rows run in the bucket of B = bucketFor(R) rows and tokens;
//   padding rows have position -1 and slot -1: they write no KV and attend to nothing (zeros, no
//   error), and the layout promises one token a row (StepLayout.oneTokenPerRow);
// - multi-token (a row's token and its drafts, verified in one step): R rows of T tokens in all run
//   in the bucket (B = bucketFor(R) rows, bucketFor(T) tokens) whose tables have one row more, a
//   spare row that owns the padding tokens (position -1, slot -1). The attention kernels classify
//   tokens from tokenRow on the device and size their launches from shapes only, so one graph
//   serves every split of its tokens among its rows.
// A pipelined decode step's ids are still on the device (the previous step's greedy picks): copied
// over the ids part of the buffer after the host inputs, they need a backend with copyTensor.
import type { Backend, CapturedGraph, HostStepLayout, StepLayout, Tensor } from '../contracts/backend.ts';
import { gatherDeviceIds, type DeviceIds } from './device-ids.ts';

export type GraphBackend = Backend & Required<Pick<Backend, 'captureGraph' | 'copyInto' | 'rowView'>>;

/**
 * Whether `b` can capture decode graphs. Whether a step uses them is its batch's (StepBatch.graphWidth:
 * the engine leaves it unset with EngineSettings.graphs off).
 */
export function canCaptureGraphs(b: Backend): b is GraphBackend {
  return !!(b.captureGraph && b.copyInto && b.rowView);
}

/** What a captured step body reads: views into the packed input buffer. */
export interface GraphInputs {
  ids: Tensor;
  layouts: StepLayout[];
  pick: Tensor;
}

/** A capture (or the eager run before it) failed; the caller may run the step op by op. */
export class GraphCaptureError extends Error {}

/**
 * Most tokens a multi-token step replays a graph for (more run op by op): each bucket's graph keeps
 * its activations, logits [tokens, vocab] the largest, for as long as it lives.
 */
export const MULTI_TOKEN_GRAPH_MAX_TOKENS = 128;

/** Batch (and token) sizes that get their own graph: exact up to 8, then multiples of 16. */
export function bucketFor(rows: number): number {
  return rows <= 8 ? rows : Math.ceil(rows / 16) * 16;
}

/**
 * One row count per graph bucket a batch of at most `maxRows` rows can use: 1..8, then the
 * largest count each bucket of 16 holds (capped at maxRows), so running each once captures every
 * graph the engine can replay.
 */
export function bucketRowCounts(maxRows: number): number[] {
  const out: number[] = [];
  for (let r = 1; r <= Math.min(8, maxRows); r++) out.push(r);
  for (let b = 16; b < maxRows + 16 && maxRows > 8; b += 16) out.push(Math.min(b, maxRows));
  return out;
}

/** Where each input sits in a bucket's packed buffer (element offsets). */
interface PackedLayout {
  /** tokens */
  T: number;
  /** block-table rows */
  tableRows: number;
  /** a multi-token bucket: tokenRow comes with each step (a decode bucket's is 0 .. B-1, fixed) */
  multi: boolean;
  ids: number;
  tokenRow: number;
  tokenPos: number;
  pick: number;
  /** per KV group: its slots [T], then its block tables [tableRows, width] */
  groups: { slots: number; tables: number }[];
  total: number;
}

function packedLayout(T: number, tableRows: number, multi: boolean, groups: number, width: number): PackedLayout {
  const at = (g: number) => 4 * T + g * (T + tableRows * width);
  return {
    T, tableRows, multi, ids: 0, tokenRow: T, tokenPos: 2 * T, pick: 3 * T,
    groups: Array.from({ length: groups }, (_, g) => ({ slots: at(g), tables: at(g) + T })),
    total: at(groups),
  };
}

interface Bucket {
  /** null until captured (a capture that failed is retried by the next step of this size) */
  graph: CapturedGraph | null;
  input: Tensor;
  host: Int32Array;
  at: PackedLayout;
}

export class DecodeGraphs {
  private readonly buckets = new Map<string, Bucket>();
  /** graphs captured so far (tests and logs) */
  captures = 0;
  /** whether the last run captured its bucket's graph (its time holds the one-off capture) */
  lastRunCaptured = false;

  constructor(
    private readonly backend: GraphBackend,
    /** KV groups (one layout each) */
    private readonly groups: number,
    /** fixed block-table width */
    readonly width: number,
    private readonly blockSize: number,
  ) {}

  /**
   * Runs one step of `rows` rows and `tokens.length` tokens (one token a row, or more: see the
   * top of this file), logits for every token, and returns the body's outputs for the bucket;
   * their first tokens.length rows are this step's. With `fromDevice` (decode steps only), the
   * ids come from there and `tokens` only counts the rows.
   */
  run(tokens: Int32Array, rows: number, layouts: readonly HostStepLayout[], body: (inputs: GraphInputs) => Tensor[],
    fromDevice?: DeviceIds): readonly Tensor[] {
    const multi = tokens.length !== rows;
    if (multi && fromDevice) throw new Error('decode graph: a multi-token step takes its ids from the host');
    const B = bucketFor(rows), T = multi ? bucketFor(tokens.length) : B;
    const key = `${B}x${T}`;
    let bucket = this.buckets.get(key);
    if (!bucket) {
      const at = packedLayout(T, multi ? B + 1 : B, multi, this.groups, this.width);
      const host = new Int32Array(at.total);
      for (let t = 0; t < T; t++) {
        host[at.tokenRow + t] = t; // decode: padding rows read their own table row (never, at position -1)
        host[at.pick + t] = t;
      }
      bucket = { graph: null, input: this.backend.zeros([at.total], 'i32'), host, at };
      this.buckets.set(key, bucket);
    }
    // inputs first: a capture records, it does not run (a backend that runs it sees real inputs)
    this.fill(bucket, rows, tokens, layouts);
    this.backend.copyInto(bucket.input, bucket.host);
    if (fromDevice) this.copyIds(bucket, tokens.length, fromDevice);
    this.lastRunCaptured = !bucket.graph;
    if (!bucket.graph) {
      try {
        bucket.graph = this.capture(bucket, body);
      } catch (err) {
        throw new GraphCaptureError(`capturing the ${multi ? `graph of ${B} rows and ${T} tokens` : `decode graph of ${B} rows`} failed: ${(err as Error).message}`);
      }
    }
    bucket.graph.replay();
    return bucket.graph.outputs;
  }

  /** Overwrites the bucket's first R ids with ones on the device (enqueued after the host copy, so they win). */
  private copyIds({ input, at }: Bucket, R: number, from: DeviceIds): void {
    const b = this.backend;
    if (!b.copyTensor) throw new Error('decode graph: ids on the device need a backend with copyTensor');
    b.beginScope(); // closed again before any capture (which wants no scope open)
    try {
      b.copyTensor(b.rowView(input, at.ids, R), gatherDeviceIds(b, from));
    } finally {
      b.endScope();
    }
  }

  private capture({ input, at }: Bucket, body: (inputs: GraphInputs) => Tensor[]): CapturedGraph {
    const b = this.backend, W = this.width, T = at.T;
    const view = (from: number, n: number, shape: number[]) => b.reshape(b.rowView(input, from, n), shape);
    const ids = view(at.ids, T, [T]);
    const tokenRow = view(at.tokenRow, T, [T]);
    const tokenPos = view(at.tokenPos, T, [T]);
    const pick = view(at.pick, T, [T]);
    const layouts: StepLayout[] = at.groups.map((g) => ({
      tokenRow, tokenPos, slots: view(g.slots, T, [T]), blockTables: view(g.tables, at.tableRows * W, [at.tableRows, W]),
      blockSize: this.blockSize,
      oneTokenPerRow: !at.multi, // a decode bucket's tokenRow is 0 .. B-1 (run)
    }));
    // One eager run first: whatever the backend settles on first use (GEMM algorithms timed on
    // the real shapes, kernels loaded) is settled before the capture freezes it. It computes
    // this very step; the replay that follows writes the same KV again.
    b.beginScope();
    try {
      body({ ids, layouts, pick });
    } finally {
      b.endScope();
    }
    const graph = b.captureGraph(() => body({ ids, layouts, pick }));
    this.captures++;
    return graph;
  }

  /**
   * Writes a step's inputs into the packed host buffer. Block-table rows are copied only as far as
   * each step's layout reaches (`maxBlocks` <= width): a row at position p reads entries up to
   * p / blockSize only, so what lies beyond is never read and need not be cleared (at a 128k
   * context the full tables of 64 rows are 2 MB a step).
   */
  private fill({ host, at }: Bucket, R: number, tokens: Int32Array, layouts: readonly HostStepLayout[]): void {
    const N = tokens.length, T = at.T, W = this.width;
    host.set(tokens, at.ids);
    host.fill(0, at.ids + N, at.ids + T);
    host.set(layouts[0]!.tokenPos, at.tokenPos);
    host.fill(-1, at.tokenPos + N, at.tokenPos + T);
    if (at.multi) {
      // the padding tokens belong to the spare last table row, which no real token shares a run with
      host.set(layouts[0]!.tokenRow, at.tokenRow);
      host.fill(at.tableRows - 1, at.tokenRow + N, at.tokenRow + T);
    }
    at.groups.forEach((g, k) => {
      const l = layouts[k]!, n = l.maxBlocks;
      if (n > W) throw new Error(`decode graph: a row holds ${n} blocks, the graph's tables ${W}`);
      host.set(l.slots.subarray(0, N), g.slots);
      host.fill(-1, g.slots + N, g.slots + T);
      for (let r = 0; r < R; r++) host.set(l.blockTables.subarray(r * n, (r + 1) * n), g.tables + r * W);
    });
  }

  dispose(): void {
    for (const bucket of this.buckets.values()) {
      bucket.graph?.dispose();
      this.backend.free(bucket.input);
    }
    this.buckets.clear();
  }
}
