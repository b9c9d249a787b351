// Which GEMMs the cuBLASLt tuner (gemm.ts) times, and what timing holds: plain values, so the fit
// planner's dry run (execution/fit/dry-run-backend.ts) models the tuner from the same numbers.

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
