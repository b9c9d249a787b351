// Which GEMMs the cuBLASLt tuner (gemm.ts) times, and what timing holds: plain values, so the fit
// planner's dry run (execution/fit/dry-run-backend.ts) models the tuner from the same numbers.

import { ATT_TC_TRIGGER } from './attention-kernels.ts';
import { envNumber } from '../common/env.ts';

/**
 * GEMMs with at most this many rows get their algorithm timed (decode shapes: the heuristic's
 * first pick read 4096 x 4096 bf16 weights at 2.0 TB/s on the H200, the best of its list faster).
 * Larger ones (prefill chunks) keep the heuristic's choice: timing them held the event loop ~0.1 s
 * per new chunk size while a long prompt prefilled. $LLMTS_CUDA_GEMM_TUNE_MAX_M overrides it.
 */
export const TUNE_MAX_M = 64;

/** The tuning class of a GEMM with M rows (gemm.ts TuneClass). */
export function tuneClassOf(M: number): number {
  return M <= 8 ? M : Math.ceil(M / 16) * 16;
}

/**
 * Written between timed calls so each reads its weights from HBM, as it will in a step: larger
 * than the H200's 50 MB L2 (a 4096 x 4096 bf16 weight fits in it, and timed back to back it
 * favoured algorithms that are slower when the weight streams from memory).
 */
export const L2_FLUSH_BYTES = 128 * 1024 * 1024;

/**
 * Our GEMV kernels take a timed class when they time within this factor of cuBLASLt's best alone.
 * Why not strictly faster: in a decode graph a GEMV is launched with programmatic dependent launch
 * (its first weights load under the kernel before) and cuBLASLt's kernels are not, and the graph
 * profile showed ours faster in place even without it (H200, 8B shapes, session 7: o 14.4 us vs
 * cuBLASLt's 15.3, down 33.3 vs 33.6, where the lone timings read 15.8 vs 14.8 and 33.9 vs 33.7).
 * With o and down on k_gemv_m1_u8, B=1 went 222.5 -> 227.1 tok/s. $LLMTS_CUDA_GEMV_MARGIN sets it
 * (1: only when faster alone; $LLMTS_CUDA_GEMV=prefer: whatever the timings).
 */
export const GEMV_MARGIN = envNumber('LLMTS_CUDA_GEMV_MARGIN', 1.1, { min: 1, max: 4 });

/**
 * The margin a GEMV gets where the shape is tuned right after an attention kernel that lets the next
 * one launch at its start (the o projection; the tensor-core decode kernel does so only with
 * $LLMTS_CUDA_ATT_TC_TRIGGER=entry, see GEMV_MARGIN_AFTER_TC_ATTENTION): 1, only when faster alone
 * ($LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION sets it). What
 * GEMV_MARGIN's PDL overlap buys behind a bandwidth-bound kernel's tail does not happen behind the
 * decode attention, a latency-bound chain: there the GEMV's early blocks only add their loads to
 * the attention's. H200, 8B shapes, session 9: o on cuBLASLt (14.5 us alone against
 * k_gemv_m1_u8/w4's 15.3) made B=1 0.5-0.7% faster at a 512-token context (3 alternations) and
 * 1.5% at 4k, where down on cuBLASLt too made it 1.5% slower.
 */
export const GEMV_MARGIN_AFTER_ATTENTION = envNumber('LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION', 1, { min: 1, max: 4 });

/**
 * The margin behind the tensor-core decode attention when it lets the next kernel launch only once
 * its splits are done (ATT_TC_TRIGGER, attention-kernels.ts: not at `entry`): then the GEMV's blocks
 * do not wait beside the attention's chain, and PDL into gate/up (which cuBLASLt's kernel does not
 * give) pays. H200, 8B shapes, session 13: o on k_gemv_m1_u8/w4 ran B=1 0.9-1.1% faster at 512 and
 * 1.5-1.8% at 4k than on cuBLASLt, although alone it took 15.1-16.1 us against cuBLASLt's
 * 14.3-14.9 (up to 1.12x); u8/w2 (15.8-16.6 alone) 0.5% less. $LLMTS_CUDA_GEMV_MARGIN_AFTER_TC_ATTENTION
 * sets it.
 */
export const GEMV_MARGIN_AFTER_TC_ATTENTION = envNumber('LLMTS_CUDA_GEMV_MARGIN_AFTER_TC_ATTENTION', 1.2, { min: 1, max: 4 });

/** The GEMV margin of a shape tuned with `previousKernel` the last kernel enqueued before it. */
export function gemvMarginAfter(previousKernel: string | undefined, margin = GEMV_MARGIN,
    afterAttention = GEMV_MARGIN_AFTER_ATTENTION, afterTcAttention = ATT_TC_TRIGGER === 'entry' ? afterAttention : GEMV_MARGIN_AFTER_TC_ATTENTION): number {
  if (previousKernel === undefined || !previousKernel.startsWith('k_attn_')) return margin;
  return previousKernel.startsWith('k_attn_decode_tc_') ? afterTcAttention : afterAttention;
}

/** The time a GEMV of a timed class must beat to take it: cuBLASLt's best x the margin; 'prefer': any. */
export function gemvBar(cublasLtMs: number, gemvMode: string | undefined, margin = GEMV_MARGIN): number {
  return gemvMode === 'prefer' ? Infinity : cublasLtMs * margin;
}

/**
 * $LLMTS_CUDA_GEMV_PICKS="MxNxK=PICK,...": the pick of each listed shape, untimed: a GEMV launch label
 * (gemvLabel, e.g. k_gemv_m1_u8/w4) or `cublaslt` (cuBLASLt's heuristic choice). For runs that must
 * reproduce another run's choices, such as one under Nsight Compute, whose overhead changes the
 * timings (take the picks from a plain run's bench/cuda-generate.ts JSON, gemmTuning[].chosen).
 * Throws on a malformed entry; gemm.ts throws when a pick is not a candidate of its shape.
 */
export function parseGemvPicks(v: string | undefined): Map<string, string> {
  const picks = new Map<string, string>();
  for (const entry of (v ?? '').split(',').map((e) => e.trim()).filter((e) => e !== '')) {
    const m = /^(\d+x\d+x\d+)=(\S+)$/.exec(entry);
    if (!m) throw new Error(`LLMTS_CUDA_GEMV_PICKS: "${entry}" is not MxNxK=PICK (a GEMV launch label or cublaslt)`);
    if (picks.has(m[1]!)) throw new Error(`LLMTS_CUDA_GEMV_PICKS: ${m[1]} is listed twice`);
    picks.set(m[1]!, m[2]!);
  }
  return picks;
}
