// A model may declare that KV computed below some length goes stale once a sequence grows past it
// (ModelConfig.recomputeKvPastLength: phi3 LongRoPE switches rope factors; transformers then
// re-prefills). Such a sequence starts over: the catch-up rule recomputes all its known tokens,
// then it samples as usual.

import type { KvCache } from '../state/kv-cache.ts';
import type { Sequence } from './sequence.ts';

/**
 * true when `seq`, with `computed` tokens of KV and `known` tokens, must start over: once per
 * sequence (the recompute itself may be chunked below the limit), and only when KV computed at or
 * below `limit` meets a length past it.
 */
export function kvGoesStale(seq: Sequence, computed: number, known: number, limit: number | undefined): boolean {
  return limit !== undefined && !seq.kvRecomputed && computed > 0 && computed <= limit && known > limit;
}

/** Restarts every running sequence whose KV went stale (before a schedule). */
export function recomputeStaleKv(running: readonly Sequence[], kv: KvCache, limit: number | undefined): void {
  if (limit === undefined) return;
  for (const seq of running) {
    if (kvGoesStale(seq, seq.computed, seq.known, limit)) {
      kv.release(seq.kv!);
      seq.computed = 0;
      seq.kvRecomputed = true;
    }
  }
}
