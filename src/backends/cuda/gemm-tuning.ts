// Which GEMMs the cuBLASLt tuner (gemm.ts) times, and what timing holds: plain values, so the fit
// planner's dry run (execution/fit/dry-run-backend.ts) models the tuner from the same numbers.

import type { CudaAttentionSettings, CudaGemvSettings, CudaSettings } from './cuda-settings.ts';
import { GEMV_MAX_M, gemvCandidates } from './gemv-kernels.ts';

/**
 * GEMMs with at most this many rows get their algorithm timed (decode shapes: the heuristic's
 * first pick read 4096 x 4096 bf16 weights at 2.0 TB/s on the H200, the best of its list faster).
 * Larger ones (prefill chunks) keep the heuristic's choice: timing them held the event loop ~0.1 s
 * per new chunk size while a long prompt prefilled. CudaGemmSettings.tuneMaxM overrides it.
 */
export const TUNE_MAX_M = 64;

/** The tuning class of a GEMM with M rows (gemm.ts TuneClass). */
export function tuneClassOf(M: number): number {
  return M <= 8 ? M : Math.ceil(M / 16) * 16;
}

/**
 * How gemm.ts picks the algorithm of a GEMM with M rows: shapes whose rule has the same `key` run
 * the same algorithm (where cuBLASLt accepts it for their own rows); `gemv`: our GEMV kernels are
 * candidates too (timed against cuBLASLt, or forced by CudaGemvSettings).
 * - invariant (CudaSettings.batchInvariant): the weight shape and types alone, whatever M: the
 *   heuristic's first algorithm at CudaGemmSettings.invariantRows rows; never a GEMV.
 * - timed: the tuning class (tuneClassOf), timed once by its first shape.
 * - bucket: prefill-sized, never timed: the heuristic's pick of the first shape in the row bucket.
 * - exact: the heuristic's pick for these rows (tuning off, or rows between tuneMaxM and GEMV_MAX_M).
 */
export interface GemmPickRule {
  kind: 'invariant' | 'timed' | 'bucket' | 'exact';
  key: string;
  gemv: boolean;
}

/** The rule of an [M, K] x [N, K]^T product of weight type wt, input xt and output dt (bf16 all: GEMVs may apply). */
export function gemmPickRule(wt: string, xt: string, dt: string, M: number, N: number, K: number,
  s: Pick<CudaSettings, 'gemm' | 'gemv' | 'batchInvariant'>): GemmPickRule {
  const types = `${wt}.${xt}.${dt}`;
  if (s.batchInvariant) return { kind: 'invariant', key: `${types}.${N}.${K}`, gemv: false };
  const gemv = s.gemv.mode !== 'off' && wt === 'bf16' && xt === 'bf16' && dt === 'bf16' && gemvCandidates(M, K).length > 0;
  const { tune, tuneMaxM, pickBucketRows } = s.gemm;
  if (tune && M <= tuneMaxM) return { kind: 'timed', key: `${types}.${tuneClassOf(M)}.${N}.${K}`, gemv };
  if (M > Math.max(tuneMaxM, GEMV_MAX_M)) return { kind: 'bucket', key: `${types}.${Math.ceil(M / pickBucketRows)}.${N}.${K}`, gemv };
  return { kind: 'exact', key: `${types}.${M}.${N}.${K}`, gemv };
}

/**
 * Row counts at which batch-invariant mode checks, once per weight shape, that cuBLASLt takes the
 * shape's algorithm (cublasLtMatmulAlgoCheck): the first of the heuristic's list that it takes at
 * all of them runs every row count, so no step meets one it refuses.
 */
export const INVARIANT_PROBE_ROWS: readonly number[] = [
  ...new Set([1, 2, 3, 4, 5, 6, 7, ...[8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096].flatMap((p) => [p - 1, p, p + 1]),
    8192, 16384, 32768, 65536]),
];

/**
 * Written between timed calls so each reads its weights from HBM, as it will in a step: larger
 * than the H200's 50 MB L2 (a 4096 x 4096 bf16 weight fits in it, and timed back to back it
 * favoured algorithms that are slower when the weight streams from memory).
 */
export const L2_FLUSH_BYTES = 128 * 1024 * 1024;

/**
 * The GEMV margin of a shape tuned with `previousKernel` the last kernel enqueued before it: our
 * GEMV takes a timed class within this factor of cuBLASLt's best alone. Not strictly faster
 * because in a decode graph a GEMV is launched with programmatic dependent launch (its first
 * weights load under the kernel before) and cuBLASLt's kernels are not, which a lone timing
 * misses (CudaGemvSettings.margin). Right after an attention kernel that lets the next launch at
 * its start, that overlap does not happen (the attention is a latency-bound chain that early
 * blocks only slow): marginAfterAttention. Behind the tensor-core decode attention triggering once
 * its splits are done (`tcTrigger` not entry) the GEMV's blocks do not wait beside the chain, and
 * its PDL into gate/up, which cuBLASLt does not give, pays: marginAfterTcAttention. The figures
 * behind the defaults: TUNING.md.
 */
export function gemvMarginAfter(previousKernel: string | undefined,
  gemv: Pick<CudaGemvSettings, 'margin' | 'marginAfterAttention' | 'marginAfterTcAttention'>,
  tcTrigger: CudaAttentionSettings['tcTrigger']): number {
  if (previousKernel === undefined || !previousKernel.startsWith('k_attn_')) return gemv.margin;
  if (!previousKernel.startsWith('k_attn_decode_tc_')) return gemv.marginAfterAttention;
  return tcTrigger === 'entry' ? gemv.marginAfterAttention : gemv.marginAfterTcAttention;
}

/** The time a GEMV of a timed class must beat to take it: cuBLASLt's best x the margin; 'prefer': any. */
export function gemvBar(cublasLtMs: number, gemvMode: string, margin: number): number {
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
