// The CPU backend's settings: one object per backend, built by cpuSettingsFrom when the backend is
// created (CpuBackendOptions.settings over the LLMTS_* environment). No koffi here: the fit planner
// reads them without loading the native library.
import { fileURLToPath } from 'node:url';

import type { Env } from '../common/env.ts';
import { choiceKnob, intKnob, type Knobs, settingsFrom, switchKnob, textKnob } from '../common/knobs.ts';

export const DEFAULT_LIBRARY_PATH = fileURLToPath(new URL('../../../build/libllmts_cpu.so', import.meta.url));

export interface CpuSettings {
  /**
   * The native library ($LLMTS_CPU_LIB; default build/libllmts_cpu.so, which `npm ci` builds). It
   * loads once per process: the first backend's path is the one.
   */
  readonly libraryPath: string;
  /**
   * Weight bytes below which a small-M matmul runs on one thread, and KV bytes below which a step's
   * attention does ($LLMTS_GEMV_PAR_MIN_BYTES; default 1 MiB, 0 to 2^50; native/isa.c documents
   * the trade: waking the OpenMP team costs about what one thread needs to stream a few hundred
   * KiB). The native library is process-wide: a backend created with another value sets it for
   * every CPU backend of the process.
   */
  readonly gemvParallelMinBytes: number;
  /**
   * Whether matmuls of bf16 weights may round x to bf16 and use the CPU's AVX512-BF16 dot
   * products (native/gemm_bf16.c; $LLMTS_CPU_BF16_DOT, on by default): about 1.85x the f32
   * kernel's multiply-adds, at a relative 2^-9 a product of rounding (transformers' bf16 inference
   * rounds every activation so). Off keeps them f32 (the ISA capped at AVX-512). Process-wide, as
   * gemvParallelMinBytes; native/isa.c also reads $LLMTS_CPU_BF16_DOT=off itself, which `true` in
   * code does not undo.
   */
  readonly bf16Dot: boolean;
  /**
   * Where bf16 matmul weights are stored in panels of 16 rows (native/weight_pack.c;
   * $LLMTS_CPU_PACK_WEIGHTS): 'auto' (the default) when the kernels in effect at load use
   * AVX512-BF16, whose matmuls then need no reduction tree and whose decode reads the panels as
   * they lie; 'on' on any CPU (other ISAs read panels with a portable kernel: for tests); 'off'
   * keeps the checkpoint's row-major layout.
   */
  readonly packWeights: 'auto' | 'on' | 'off';
  /**
   * Whether GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 matmul weights (and Q5_0 / IQ4_NL / Q3_K ones, as Q8_0 / Q6_K) stay quantized, in panels of their own (native/quant_pack.c;
   * $LLMTS_CPU_QUANT_WEIGHTS, on by default): integer dot products on activations quantized per
   * block of 32 (AVX512-VNNI where the CPU has it, a portable kernel computing the same numbers
   * elsewhere), from a bit over a quarter (Q4_0, Q4_K) to a half (Q8_0) of bf16's bytes. Off
   * dequantizes them at load as every other ggml type is.
   */
  readonly quantWeights: boolean;
}

const CPU_KNOBS: Knobs<CpuSettings> = {
  libraryPath: textKnob('LLMTS_CPU_LIB', (text) => text ?? DEFAULT_LIBRARY_PATH,
    (v) => (typeof v === 'string' && v !== '' ? undefined : 'a path')),
  // native/isa.c reads the variable itself (strtoull reads "abc" as 0: every matmul parallel), so
  // a value it would read as something else stops here first
  gemvParallelMinBytes: intKnob('LLMTS_GEMV_PAR_MIN_BYTES', 2 ** 20, { min: 0, max: 2 ** 50 }),
  bf16Dot: switchKnob('LLMTS_CPU_BF16_DOT', true),
  packWeights: choiceKnob('LLMTS_CPU_PACK_WEIGHTS', ['auto', 'on', 'off']),
  quantWeights: switchKnob('LLMTS_CPU_QUANT_WEIGHTS', true),
};

/** The CPU backend's settings: `overrides` where given (checked), the rest from `env`. */
export function cpuSettingsFrom(env: Env, overrides: Partial<CpuSettings> = {}): CpuSettings {
  return settingsFrom(CPU_KNOBS, env, overrides);
}
