// Decode steps replayed from captured graphs (Backend.captureGraph), one per batch-size bucket.
//
// A decode step enqueues a few hundred small ops; issuing them one by one costs more host time
// than the device needs to run them. A graph records a step once and replays it with one launch.
// What changes between steps travels in one packed i32 input buffer, copied in before each replay:
//   [ids B | tokenRow B | tokenPos B | pick B | per KV group: slots B, blockTables B x width]
// The block tables have a fixed width (the longest sequence the engine allows), so a growing
// sequence never changes a shape. A batch of R rows runs in the smallest bucket B >= R; padding
// rows have position -1 and slot -1: they write no KV and attend to nothing (zeros, no error).
// A pipelined step's ids are still on the device (the previous step's greedy picks): copied over
// the ids part of the buffer after the host inputs, they need a backend with copyTensor.

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

/** Batch sizes that get their own graph: exact up to 8, then multiples of 16. */
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
  ids: number;
  tokenRow: number;
  tokenPos: number;
  pick: number;
  /** per KV group: its slots [B], then its block tables [B, width] */
  groups: { slots: number; tables: number }[];
  total: number;
}

function packedLayout(B: number, groups: number, width: number): PackedLayout {
  const at = (g: number) => 4 * B + g * (B + B * width);
  return {
    ids: 0, tokenRow: B, tokenPos: 2 * B, pick: 3 * B,
    groups: Array.from({ length: groups }, (_, g) => ({ slots: at(g), tables: at(g) + B })),
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
  private readonly buckets = new Map<number, Bucket>();
  /** graphs captured so far (tests and logs) */
  captures = 0;

  constructor(
    private readonly backend: GraphBackend,
    /** KV groups (one layout each) */
    private readonly groups: number,
    /** fixed block-table width */
    readonly width: number,
    private readonly blockSize: number,
  ) {}

  /**
   * Runs one decode step of `tokens.length` rows (one token each, logits for every row) and
   * returns the body's outputs for the bucket; their first R rows are this step's. With
   * `fromDevice`, the ids come from there and `tokens` only counts the rows.
   */
  run(tokens: Int32Array, layouts: readonly HostStepLayout[], body: (inputs: GraphInputs) => Tensor[],
    fromDevice?: DeviceIds): readonly Tensor[] {
    const B = bucketFor(tokens.length);
    let bucket = this.buckets.get(B);
    if (!bucket) {
      const at = packedLayout(B, this.groups, this.width);
      const host = new Int32Array(at.total);
      for (let r = 0; r < B; r++) {
        host[at.tokenRow + r] = r; // padding rows read their own table row (never, at position -1)
        host[at.pick + r] = r;
      }
      bucket = { graph: null, input: this.backend.zeros([at.total], 'i32'), host, at };
      this.buckets.set(B, bucket);
    }
    // inputs first: a capture records, it does not run (a backend that runs it sees real inputs)
    this.fill(bucket, B, tokens, layouts);
    this.backend.copyInto(bucket.input, bucket.host);
    if (fromDevice) this.copyIds(bucket, tokens.length, fromDevice);
    if (!bucket.graph) {
      try {
        bucket.graph = this.capture(B, bucket, body);
      } catch (err) {
        throw new GraphCaptureError(`capturing the decode graph of ${B} rows failed: ${(err as Error).message}`);
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

  private capture(B: number, { input, at }: Bucket, body: (inputs: GraphInputs) => Tensor[]): CapturedGraph {
    const b = this.backend, W = this.width;
    const view = (from: number, n: number, shape: number[]) => b.reshape(b.rowView(input, from, n), shape);
    const ids = view(at.ids, B, [B]);
    const tokenRow = view(at.tokenRow, B, [B]);
    const tokenPos = view(at.tokenPos, B, [B]);
    const pick = view(at.pick, B, [B]);
    const layouts: StepLayout[] = at.groups.map((g) => ({
      tokenRow, tokenPos, slots: view(g.slots, B, [B]), blockTables: view(g.tables, B * W, [B, W]), blockSize: this.blockSize,
      oneTokenPerRow: true, // tokenRow is 0 .. B-1 (run)
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
  private fill({ host, at }: Bucket, B: number, tokens: Int32Array, layouts: readonly HostStepLayout[]): void {
    const R = tokens.length, W = this.width;
    host.set(tokens, at.ids);
    host.fill(0, at.ids + R, at.ids + B);
    host.set(layouts[0]!.tokenPos, at.tokenPos);
    host.fill(-1, at.tokenPos + R, at.tokenPos + B);
    at.groups.forEach((g, k) => {
      const l = layouts[k]!, n = l.maxBlocks;
      if (n > W) throw new Error(`decode graph: a row holds ${n} blocks, the graph's tables ${W}`);
      host.set(l.slots.subarray(0, R), g.slots);
      host.fill(-1, g.slots + R, g.slots + B);
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
