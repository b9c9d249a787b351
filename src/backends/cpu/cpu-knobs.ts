// The CPU backend's LLMTS_* knobs that the native library reads itself, parsed here too (no
// koffi: the fit planner reads them without loading the library).
import { envInt, envSwitch } from '../common/env.ts';

/**
 * Weight bytes below which the native library runs a small-M matmul on one thread (and KV bytes
 * below which it runs a step's attention on one)
 * ($LLMTS_GEMV_PAR_MIN_BYTES, default 1 MiB: native/isa.c reads the variable itself). Checked here
 * when the library loads (native-lib.ts loadNativeLib), so that a value the C side would read as something else (strtoull reads
 * "abc" as 0: every matmul parallel) stops the process with a line naming the variable instead.
 */
export function gemvParallelMinBytes(env: Readonly<Record<string, string | undefined>> = process.env): number {
  return envInt('LLMTS_GEMV_PAR_MIN_BYTES', 2 ** 20, { min: 0, max: 2 ** 50 }, env);
}

/**
 * Whether prefill matmuls of bf16 weights may round x to bf16 and use the CPU's AVX512-BF16 dot
 * products ($LLMTS_CPU_BF16_DOT, on by default; native/isa.c reads the variable itself,
 * native/gemm_bf16.c is the kernel): about 1.85x the f32 kernel's multiply-adds on the dev VM, at a
 * relative 2^-9 a product of rounding (transformers' bf16 inference rounds every activation so).
 * `off` keeps them f32. Checked here when the library loads, as gemvParallelMinBytes.
 */
export function cpuBf16Dot(env: Readonly<Record<string, string | undefined>> = process.env): boolean {
  return envSwitch('LLMTS_CPU_BF16_DOT', true, env);
}
