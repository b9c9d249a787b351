// Warm-up before serving: a backend settles some things on first use (CUDA: each decode batch
// bucket's graph is captured, each GEMM shape's algorithm is timed), and a request that arrives
// first pays for them inside its time to first token (a bucket of 4 rows: ~0.2 s on the H200).
// Running the same path once per bucket at startup moves that cost before the server listens.
//
// It goes through the engine like any request (one code path): for each bucket, that many
// one-token prompts decode a few tokens together. One-token prompts fill no KV block, so nothing
// enters the prefix cache (or its SSD tier). Prefill chunk shapes are left to the first long
// prompt: their GEMM timing does not hold the host (backends/cuda/gemm.ts), and a warm-up prompt
// long enough to fill blocks would be cached like a user's.

import { bucketRowCounts } from '../models/decode-graphs.ts';
import type { Engine } from './engine.ts';

export interface WarmUpReport {
  /** row counts run, one per graph bucket */
  rowCounts: number[];
  ms: number;
}

/** decode steps each warm-up batch runs after its prefill: the first captures, the rest replay */
const DECODE_TOKENS = 3;

export async function warmUp(engine: Engine, onProgress?: (done: number, total: number) => void): Promise<WarmUpReport> {
  const t0 = performance.now();
  const rowCounts = bucketRowCounts(engine.maxBatch);
  const run = (rows: number, maxTokens: number) =>
    Promise.all(Array.from({ length: rows }, (_, k) => engine.complete({
      // one token id below the vocabulary size; different rows, different ids
      promptIds: [(k * 7 + 1) % engine.model.config.vocabSize],
      // plain decode steps: the ones whose graphs and GEMM shapes the first requests would pay for
      maxTokens, sampling: { temperature: 0 }, ignoreEos: true, speculative: false,
    }))).then((done) => {
      const bad = done.find((c) => c.finishReason === 'error');
      if (bad) throw new Error(`warm-up failed: ${bad.error}`);
    });
  for (const [i, rows] of rowCounts.entries()) {
    await run(rows, DECODE_TOKENS);
    onProgress?.(i + 1, rowCounts.length);
  }
  return { rowCounts, ms: performance.now() - t0 };
}
