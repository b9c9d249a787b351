// The CPU backend's LLMTS_* knobs that the native library reads itself, parsed here too (no
// koffi: the fit planner reads them without loading the library).
import { envInt } from '../common/env.ts';

/**
 * Weight bytes below which the native library runs a small-M matmul on one thread
 * ($LLMTS_GEMV_PAR_MIN_BYTES, default 1 MiB: native/isa.c reads the variable itself). Checked here
 * when the library loads (native-lib.ts loadNativeLib), so that a value the C side would read as something else (strtoull reads
 * "abc" as 0: every matmul parallel) stops the process with a line naming the variable instead.
 */
export function gemvParallelMinBytes(env: Readonly<Record<string, string | undefined>> = process.env): number {
  return envInt('LLMTS_GEMV_PAR_MIN_BYTES', 2 ** 20, { min: 0, max: 2 ** 50 }, env);
}
