// Decode steps replayed from captured graphs (Backend.captureGraph), one per batch-size bucket.
//
// A decode step enqueues a few hundred small ops; issuing them one by one costs more host time
// than the device needs to run them. A graph records a step once and replays it with one launch.
// What changes between steps travels in one packed i32 input buffer, copied in before each replay:
//   [ids B | tokenRow B | tokenPos B | pick B | per KV group: slots B, blockTables B x width]
// The block tables have a fixed width (the longest sequence the engine allows), so a growing
// sequence never changes a shape. A batch of R rows runs in the smallest bucket B >= R; padding
// rows have position -1 and slot -1: they write no KV and attend to nothing (zeros, no error).

import type { Backend, CapturedGraph, HostStepLayout, StepLayout, Tensor } from '../contracts/backend.ts';

export type GraphBackend = Backend & Required<Pick<Backend, 'captureGraph' | 'copyInto' | 'rowView'>>;

export function canCaptureGraphs(b: Backend): b is GraphBackend {
  return !!(b.captureGraph && b.copyInto && b.rowView) && process.env.LLMTS_GRAPHS !== 'off';
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

interface Bucket {
  /** null until captured (a capture that failed is retried by the next step of this size) */
  graph: CapturedGraph | null;
  input: Tensor;
  host: Int32Array;
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
   * returns the body's outputs for the bucket; their first R rows are this step's.
   */
  run(tokens: Int32Array, layouts: readonly HostStepLayout[], body: (inputs: GraphInputs) => Tensor[]): readonly Tensor[] {
    const B = bucketFor(tokens.length);
    let bucket = this.buckets.get(B);
    if (!bucket) {
      const total = 4 * B + this.groups * (B + B * this.width);
      bucket = { graph: null, input: this.backend.zeros([total], 'i32'), host: new Int32Array(total) };
      this.buckets.set(B, bucket);
    }
    // inputs first: a capture records, it does not run (a backend that runs it sees real inputs)
    this.fill(bucket.host, B, tokens, layouts);
    this.backend.copyInto(bucket.input, bucket.host);
    if (!bucket.graph) {
      try {
        bucket.graph = this.capture(B, bucket.input, body);
      } catch (err) {
        throw new GraphCaptureError(`capturing the decode graph of ${B} rows failed: ${(err as Error).message}`);
      }
    }
    bucket.graph.replay();
    return bucket.graph.outputs;
  }

  private capture(B: number, input: Tensor, body: (inputs: GraphInputs) => Tensor[]): CapturedGraph {
    const b = this.backend, W = this.width;
    const view = (at: number, n: number, shape: number[]) => b.reshape(b.rowView(input, at, n), shape);
    const ids = view(0, B, [B]);
    const tokenRow = view(B, B, [B]);
    const tokenPos = view(2 * B, B, [B]);
    const pick = view(3 * B, B, [B]);
    const layouts: StepLayout[] = [];
    for (let g = 0, at = 4 * B; g < this.groups; g++, at += B + B * W) {
      layouts.push({ tokenRow, tokenPos, slots: view(at, B, [B]), blockTables: view(at + B, B * W, [B, W]), blockSize: this.blockSize });
    }
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
  private fill(host: Int32Array, B: number, tokens: Int32Array, layouts: readonly HostStepLayout[]): void {
    const R = tokens.length, W = this.width;
    host.set(tokens, 0);
    host.fill(0, R, B);
    for (let r = 0; r < B; r++) {
      host[B + r] = r; // padding rows read their own table row (never, at position -1)
      host[3 * B + r] = r;
    }
    host.set(layouts[0]!.tokenPos, 2 * B);
    host.fill(-1, 2 * B + R, 3 * B);
    for (let g = 0, at = 4 * B; g < this.groups; g++, at += B + B * W) {
      const l = layouts[g]!, n = l.maxBlocks;
      if (n > W) throw new Error(`decode graph: a row holds ${n} blocks, the graph's tables ${W}`);
      host.set(l.slots.subarray(0, R), at);
      host.fill(-1, at + R, at + B);
      for (let r = 0; r < R; r++) host.set(l.blockTables.subarray(r * n, (r + 1) * n), at + B + r * W);
    }
  }

  dispose(): void {
    for (const bucket of this.buckets.values()) {
      bucket.graph?.dispose();
      this.backend.free(bucket.input);
    }
    this.buckets.clear();
  }
}
