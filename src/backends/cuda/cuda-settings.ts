// The CUDA backend's settings: every LLMTS_CUDA_* knob as one typed, frozen object per backend,
// built by cudaSettingsFrom when the backend is created (CudaBackendOptions.settings over the
// environment) and handed to the modules that use a group of it (the runtime, the kernel sources,
// the GEMM tuner, attention, the fused and MoE ops). The defaults are what runs; the other values
// are for measuring (what each trades, measured: TUNING.md beside this file). No koffi here: the
// fit planner reads them without loading the driver.
import { homedir } from 'node:os';
import { join } from 'node:path';

import type { Env } from '../common/env.ts';
import {
  choiceKnob, intKnob, type Knobs, mappedKnob, numberKnob, settingsFrom, switchKnob, textKnob,
} from '../common/knobs.ts';
import { type Fp8GemvEngine, GEMV_FP8_MAX_M } from './fp8-kernels.ts';
import { parseGemvPicks, TUNE_MAX_M } from './gemm-tuning.ts';

/** Tuning macros put before a module's source, NAME -> integer value, in order. */
export type KernelDefines = Readonly<Record<string, number>>;

export interface CudaRuntimeSettings {
  /** device ordinal ($LLMTS_CUDA_DEVICE; default 0, 0-1023) */
  readonly device: number;
  /**
   * Launch the decode kernels (pdl.ts PDL_KERNELS) with programmatic dependent launch on sm_90 and
   * newer ($LLMTS_CUDA_PDL, on by default): each hides its ramp-up behind the kernel before. Off:
   * plain launches (a graph profile turns it off too).
   */
  readonly pdl: boolean;
  /**
   * Bracket every call captured into a graph with event nodes (graph-profiler.ts;
   * $LLMTS_CUDA_GRAPH_PROFILE=1, default 0): per-call device times of a replay, which runs slower.
   */
  readonly graphProfile: boolean;
  /**
   * Graph launches FROM .. FROM+COUNT-1 (0-based) run between cuProfilerStart and cuProfilerStop,
   * for Nsight Compute with --profile-from-start off ($LLMTS_CUDA_PROFILER_GRAPHS=FROM[:COUNT];
   * default none). A diagnostic: it synchronizes after the window's last launch.
   */
  readonly profilerGraphs: { readonly from: number; readonly count: number } | null;
  /**
   * Report on stderr, with the JS stack, every synchronous driver or cuBLASLt call that holds the
   * main thread this many ms ($LLMTS_CUDA_SLOW_CALL_MS; default 0: off, 0-1e6). A diagnostic for
   * event-loop stalls (a call that waits for the device blocks the whole server).
   */
  readonly slowCallMs: number;
  /**
   * Where compiled kernel modules are cached ($LLMTS_CACHE_DIR/cuda; default
   * $XDG_CACHE_HOME/llmts/cuda or ~/.cache/llmts/cuda).
   */
  readonly cacheDir: string;
}

export interface CudaKernelSettings {
  /**
   * Tuning macros of the attention module ($LLMTS_CUDA_ATT_DEFINES="NAME=VALUE,..."; default none:
   * attention-kernels.ts and attention-decode-tc.ts list them). Not ATT_TC_MIN_CHUNK or
   * ATT_TC_TRIGGER, which the host plans with: CudaAttentionSettings sets those.
   */
  readonly attentionDefines: KernelDefines;
  /** tuning macros of the gemv module (gemv-kernels.ts, moe-kernels.ts; $LLMTS_CUDA_GEMV_DEFINES) */
  readonly gemvDefines: KernelDefines;
  /** tuning macros of the fused module (fused-kernels.ts; $LLMTS_CUDA_FUSED_DEFINES) */
  readonly fusedDefines: KernelDefines;
}

export interface CudaGemmSettings {
  /** 'simple' runs every GEMM on the plain kernel instead of cuBLASLt ($LLMTS_CUDA_GEMM; default cublaslt) */
  readonly engine: 'cublaslt' | 'simple';
  /**
   * Time cuBLASLt's candidate algorithms (and our GEMVs) once per tuning class of a decode-sized
   * shape ($LLMTS_CUDA_GEMM_TUNE, on by default). Off: the heuristic's first choice everywhere.
   */
  readonly tune: boolean;
  /**
   * GEMMs of up to this many rows are timed ($LLMTS_CUDA_GEMM_TUNE_MAX_M; default gemm-tuning.ts
   * TUNE_MAX_M, 1-2^20): timing costs the host ~0.4 ms a call, so larger (prefill) shapes keep the
   * heuristic's pick.
   */
  readonly tuneMaxM: number;
  /**
   * Untimed shapes whose row counts fall in one bucket of this many rows share the heuristic's pick
   * where cuBLASLt accepts it ($LLMTS_CUDA_GEMM_PICK_BUCKET; default 64, 1-2^20; 1: every row count
   * asks the heuristic, a host-side search).
   */
  readonly pickBucketRows: number;
  /**
   * How the tuner empties L2 between timed calls ($LLMTS_CUDA_TUNE_FLUSH; default read: reading a
   * 128 MB buffer; write: writing it, which makes the timed call also write back dirty lines).
   */
  readonly tuneFlush: 'read' | 'write';
  /**
   * With CudaSettings.batchInvariant: every GEMM of a weight shape (types, N, K) runs the algorithm
   * cuBLASLt's heuristic puts first for this many rows, whatever its own row count
   * ($LLMTS_CUDA_GEMM_INVARIANT_ROWS; default 256, 1-65536): one tile shape and split-K for decode
   * rows and prefill chunks alike, chosen for mid-sized and large batches.
   */
  readonly invariantRows: number;
}

export interface CudaGemvSettings {
  /**
   * Our bf16 GEMV kernels for decode shapes ($LLMTS_CUDA_GEMV; default auto: where one times within
   * `margin` of cuBLASLt; off: cuBLASLt only; prefer: the fastest GEMV whatever cuBLASLt timed; a
   * kernel name or a launch label such as k_gemvp_m1_u16/w1/b2: that launch wherever it applies,
   * untimed).
   */
  readonly mode: string;
  /**
   * The pick of each listed shape, untimed: a launch label or `cublaslt`
   * ($LLMTS_CUDA_GEMV_PICKS="MxNxK=PICK,..."; default none), e.g. to reproduce a plain run's picks
   * under a profiler.
   */
  readonly picks: ReadonlyMap<string, string>;
  /**
   * A GEMV takes a timed class within this factor of cuBLASLt's best alone ($LLMTS_CUDA_GEMV_MARGIN;
   * default 1.1, 1-4): in a decode graph it overlaps its first weight loads with the kernel before
   * under PDL, which a lone timing misses. 1: only when faster alone.
   */
  readonly margin: number;
  /**
   * The margin of a shape tuned right after an attention kernel that lets the next launch at its
   * start ($LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION; default 1, 1-4): early blocks there slow the
   * attention's latency-bound chain.
   */
  readonly marginAfterAttention: number;
  /**
   * The margin behind the tensor-core decode attention when it triggers after its splits
   * (CudaAttentionSettings.tcTrigger not entry; $LLMTS_CUDA_GEMV_MARGIN_AFTER_TC_ATTENTION;
   * default 1.2, 1-4).
   */
  readonly marginAfterTcAttention: number;
  /**
   * Resident blocks an SM of a fused persistent GEMV ($LLMTS_CUDA_GEMVP_FUSED_BPS; default 2, or 1
   * or 3): one leaves half the SM's registers to the next kernel's early blocks; three needs
   * GEMVP_MINB=3 in gemvDefines.
   */
  readonly fusedBlocksPerSm: 1 | 2 | 3;
  /**
   * FP8 (e4m3) checkpoint matrices stay FP8 on the device ($LLMTS_CUDA_FP8_WEIGHTS, on by default):
   * half the bytes of bf16, multiplied by the FP8 GEMV at decode rows and dequantized into bf16 for
   * cuBLASLt at more (cuda-fp8-weights.ts). Off: they load dequantized into bf16, as on the CPU.
   */
  readonly fp8Weights: boolean;
  /**
   * The most x rows an FP8 GEMV takes ($LLMTS_CUDA_FP8_GEMV_MAX_ROWS; default 16, 0-16; 0: never;
   * the CUDA-core GEMV takes at most 8); more rows multiply the dequantized weights with cuBLASLt.
   */
  readonly fp8GemvMaxRows: number;
  /**
   * Which FP8 GEMV ($LLMTS_CUDA_FP8_GEMV; default tensor-core: k_gemv_fp8_tc_*, mma tiles to 16
   * rows where a scale covers 64 columns or more, else the CUDA-core one; cuda-core: k_gemv_fp8_m*,
   * FMAs to 8 rows: 3x its time a step at 8 and 16 requests on the H200, TUNING.md).
   */
  readonly fp8Gemv: Fp8GemvEngine;
  /** Warps of a tensor-core FP8 GEMV block, each a share of the columns ($LLMTS_CUDA_FP8_TC_WARPS: 4, 8 or 16; default 4). */
  readonly fp8TcWarps: 4 | 8 | 16;
}

export interface CudaAttentionSettings {
  /** 'generic' runs every call on the plain k_attention kernel ($LLMTS_CUDA_ATTENTION; default auto: the fast kernels where they apply) */
  readonly mode: 'auto' | 'generic';
  /**
   * The decode kernel ($LLMTS_CUDA_ATT_DECODE; default tc: tensor cores, for head dims 64 and 128
   * and GQA groups of up to 16; cuda-core: k_attn_decode_d<D>_g<GC> everywhere).
   */
  readonly decodeKernel: 'tc' | 'cuda-core';
  /** CUDA-core decode blocks aimed for per SM ($LLMTS_CUDA_ATT_DECODE_BLOCKS; default 8, about two waves; 1-64) */
  readonly decodeBlocksPerSm: number;
  /**
   * Blocks of the tensor-core decode kernel resident per SM, the wave its slots are planned in
   * ($LLMTS_CUDA_ATT_TC_RESIDENT; default 3, its __launch_bounds__ minimum; 1-32).
   */
  readonly tcResident: number;
  /**
   * Skip the prefill kernel where the layout promises one token a row, as a decode graph's does
   * ($LLMTS_CUDA_ATT_ONE_TOKEN_HINT, on by default; off launches it anyway, every block exiting).
   */
  readonly oneTokenHint: boolean;
  /**
   * Fewest keys a split of the tensor-core decode kernel gets: the host's slot plan and the kernel
   * alike ($LLMTS_CUDA_ATT_TC_MIN_CHUNK; default 64, two tiles; a multiple of 32 from 32 to 1024).
   */
  readonly tcMinChunk: number;
  /**
   * The tensor-core decode grid ($LLMTS_CUDA_ATT_TC_GRID; default heads-first: (KVH, W), so the
   * working blocks come first, one an SM; slots-first: (W, KVH)).
   */
  readonly tcGrid: 'heads-first' | 'slots-first';
  /**
   * When a tensor-core decode block lets the next kernel launch under PDL
   * ($LLMTS_CUDA_ATT_TC_TRIGGER; default loaded: once its split is counted, a merging block once its
   * merge's first partials landed; split: a merging block before its merge; entry: right after its
   * wait; exit: at its end). A launched block waits beside the attention's chain and slows it.
   */
  readonly tcTrigger: 'loaded' | 'split' | 'entry' | 'exit';
  /**
   * Stages of the tensor-core decode kernel's key / value ring ($LLMTS_CUDA_ATT_TC_STAGES; default
   * 2, 2-4): more keep more bytes in flight a block, where many rows make it bandwidth-bound.
   */
  readonly tcStages: number;
  /**
   * Stages of the prefill kernel's key / value ring ($LLMTS_CUDA_ATT_PF_STAGES; default 2, 2-4): 2
   * fits the 99 KB a block may use on sm_86 / sm_89 at head dim 128, where 3 does not.
   */
  readonly pfStages: number;
  /**
   * With CudaSettings.batchInvariant: the keys of one split of the tensor-core decode kernel, split
   * at the multiples of this many key positions, so a token's splits depend on its own position
   * alone; the batch-invariant prefill kernel sums over the same splits
   * ($LLMTS_CUDA_ATT_INVARIANT_CHUNK; default 512, a multiple of 32 from 32 to 65536). Fewer keys
   * a split: more splits at a few rows (shorter chains), more partials at many.
   */
  readonly invariantChunk: number;
}

export interface CudaFusedSettings {
  /** gluMatmul fuses the GLU into the decode GEMV ($LLMTS_CUDA_FUSE_GLU; default off: its persistent loop is slower than the tuned GEMV at K=14336) */
  readonly fuseGlu: boolean;
  /** addRmsnormMatmul fuses the norm into the decode GEMV ($LLMTS_CUDA_FUSE_NORM; default on: a kernel and a copy less a norm) */
  readonly fuseNorm: boolean;
  /**
   * addRmsnormQkvRope runs the norm, the q/k/v GEMV, rope and the KV write as one kernel
   * ($LLMTS_CUDA_ROPE_EPILOGUE; default off: slower at B=1 on the H200 with PDL on, for reasons
   * not known).
   */
  readonly ropeEpilogue: boolean;
  /** addRmsnormGateUpGlu runs the norm, the gate/up GEMV and the GLU as one kernel ($LLMTS_CUDA_GLU_EPILOGUE; default on) */
  readonly gluEpilogue: boolean;
}

export interface CudaMoeSettings {
  /**
   * The FFN kernels ($LLMTS_CUDA_MOE; default vec: bf16 16-byte streaming loads where they apply;
   * scalar: any dtype, one 2-byte load a lane and step, several times slower).
   */
  readonly kernels: 'vec' | 'scalar';
  /**
   * With the vec kernels, inputs of at least this many tokens run grouped by expert, each active
   * expert's rows streamed once per pass ($LLMTS_CUDA_MOE_GROUPED_MIN_ROWS; default 8; 0: never).
   */
  readonly groupedMinRows: number;
  /**
   * The most tokens one grouped pass takes: each pass reads its experts again, and its scratch grows
   * with it ($LLMTS_CUDA_MOE_PASS_ROWS; default 2048, 16-65536).
   */
  readonly passRows: number;
  /** grouped inputs of at least this many tokens run gate/up on tensor cores ($LLMTS_CUDA_MOE_TC_MIN_ROWS; default 64; 0: never) */
  readonly tcMinRows: number;
  /**
   * grouped inputs of at least this many tokens run the down projection on tensor cores too, the
   * hidden values rounded to bf16 on the way in ($LLMTS_CUDA_MOE_TC_DOWN_MIN_ROWS; default 64; 0: never)
   */
  readonly tcDownMinRows: number;
  /** output rows a warp of the grouped CUDA-core down projection streams together ($LLMTS_CUDA_MOE_DOWN_ROWS; default 4, or 1) */
  readonly downRows: 1 | 4;
  /** rows a warp of the grouped CUDA-core gate/up products streams together ($LLMTS_CUDA_MOE_HIDDEN_ROWS; default 2, or 1) */
  readonly hiddenRows: 1 | 2;
}

export interface CudaSettings {
  /**
   * Batch-invariant mode ($LLMTS_CUDA_BATCH_INVARIANT, off by default; `--batch-invariant`): a
   * row's results are bitwise the same whatever other rows share its step. Every kernel choice that
   * depended on the row count is fixed by the weight shape or the context length alone: one
   * cuBLASLt algorithm per weight shape (CudaGemmSettings.invariantRows) and no GEMV kernels or
   * GEMV-fused ops; the tensor-core decode attention split at fixed key positions
   * (CudaAttentionSettings.invariantChunk) and a prefill kernel that sums the same way, so a
   * prompt's tokens come out the same however the step's token budget chunks it; the MoE FFN
   * grouped by expert at every row count. TUNING.md lists each choice.
   */
  readonly batchInvariant: boolean;
  readonly runtime: CudaRuntimeSettings;
  readonly kernels: CudaKernelSettings;
  readonly gemm: CudaGemmSettings;
  readonly gemv: CudaGemvSettings;
  readonly attention: CudaAttentionSettings;
  readonly fused: CudaFusedSettings;
  readonly moe: CudaMoeSettings;
}

/** Knobs set in code: any field of any group (batchInvariant: a boolean); the rest come from the environment. */
export type CudaSettingsOverrides = {
  readonly [G in Exclude<keyof CudaSettings, 'batchInvariant'>]?: Partial<CudaSettings[G]>
} & { readonly batchInvariant?: boolean };

/** "FROM" or "FROM:COUNT" (graph launches, COUNT >= 1), or null when unset; throws on anything else. */
export function parseProfilerWindow(v: string | undefined): { from: number; count: number } | null {
  if (v === undefined || v === '') return null;
  const m = /^(\d+)(?::(\d+))?$/.exec(v.trim());
  const count = m ? Number(m[2] ?? '1') : 0;
  if (!m || count < 1) throw new Error(`LLMTS_CUDA_PROFILER_GRAPHS must be FROM or FROM:COUNT (graph launches, COUNT >= 1), got ${JSON.stringify(v)}`);
  return { from: Number(m[1]), count };
}

/**
 * `variable`'s "NAME=INTEGER,..." as defines; throws naming the variable on anything else. Decimal
 * without leading zeros: a C compiler reads 010 as octal 8, so the value is written back as it was
 * meant.
 */
export function parseKernelDefines(variable: string, text: string | undefined): KernelDefines {
  const defines: Record<string, number> = {};
  for (const d of (text ?? '').split(',').filter((e) => e.trim() !== '')) {
    const m = /^\s*([A-Z_][A-Z0-9_]*)=(-?(?:0|[1-9]\d*))\s*$/.exec(d);
    if (!m || !Number.isSafeInteger(Number(m[2]))) throw new Error(`${variable}: "${d}" is not NAME=INTEGER (decimal)`);
    if (m[1]! in defines) throw new Error(`${variable}: ${m[1]} is listed twice`);
    defines[m[1]!] = Number(m[2]);
  }
  return Object.freeze(defines);
}

const definesProblem = (v: KernelDefines): string | undefined =>
  Object.entries(v).every(([k, n]) => /^[A-Z_][A-Z0-9_]*$/.test(k) && Number.isSafeInteger(n)) ? undefined
    : 'NAME -> integer entries';

const definesKnob = (variable: string) => textKnob(variable, (text) => parseKernelDefines(variable, text), definesProblem);

const RUNTIME_KNOBS: Knobs<CudaRuntimeSettings> = {
  device: intKnob('LLMTS_CUDA_DEVICE', 0, { min: 0, max: 1023 }),
  pdl: switchKnob('LLMTS_CUDA_PDL', true),
  graphProfile: mappedKnob('LLMTS_CUDA_GRAPH_PROFILE', ['0', '1'], { 0: false, 1: true }),
  profilerGraphs: textKnob('LLMTS_CUDA_PROFILER_GRAPHS', parseProfilerWindow,
    (v) => (v === null || (Number.isSafeInteger(v.from) && v.from >= 0 && Number.isSafeInteger(v.count) && v.count >= 1) ? undefined
      : 'null or { from >= 0, count >= 1 }')),
  slowCallMs: numberKnob('LLMTS_CUDA_SLOW_CALL_MS', 0, { min: 0, max: 1e6 }),
  cacheDir: textKnob('LLMTS_CACHE_DIR', (text, env) => (text !== undefined ? join(text, 'cuda')
    : join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'llmts', 'cuda')), (v) => (typeof v === 'string' && v !== '' ? undefined : 'a path')),
};

const KERNEL_KNOBS: Knobs<CudaKernelSettings> = {
  attentionDefines: definesKnob('LLMTS_CUDA_ATT_DEFINES'),
  gemvDefines: definesKnob('LLMTS_CUDA_GEMV_DEFINES'),
  fusedDefines: definesKnob('LLMTS_CUDA_FUSED_DEFINES'),
};

const GEMM_KNOBS: Knobs<CudaGemmSettings> = {
  engine: choiceKnob('LLMTS_CUDA_GEMM', ['cublaslt', 'simple']),
  tune: switchKnob('LLMTS_CUDA_GEMM_TUNE', true),
  tuneMaxM: intKnob('LLMTS_CUDA_GEMM_TUNE_MAX_M', TUNE_MAX_M, { min: 1, max: 1 << 20 }),
  pickBucketRows: intKnob('LLMTS_CUDA_GEMM_PICK_BUCKET', 64, { min: 1, max: 1 << 20 }),
  tuneFlush: choiceKnob('LLMTS_CUDA_TUNE_FLUSH', ['read', 'write']),
  invariantRows: intKnob('LLMTS_CUDA_GEMM_INVARIANT_ROWS', 256, { min: 1, max: 65536 }),
};

const GEMV_KNOBS: Knobs<CudaGemvSettings> = {
  mode: textKnob('LLMTS_CUDA_GEMV', (text) => text ?? 'auto', (v) => (typeof v === 'string' && v !== '' ? undefined : 'a mode')),
  picks: textKnob('LLMTS_CUDA_GEMV_PICKS', parseGemvPicks, (v) => (v instanceof Map ? undefined : 'a Map of MxNxK -> pick')),
  margin: numberKnob('LLMTS_CUDA_GEMV_MARGIN', 1.1, { min: 1, max: 4 }),
  marginAfterAttention: numberKnob('LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION', 1, { min: 1, max: 4 }),
  marginAfterTcAttention: numberKnob('LLMTS_CUDA_GEMV_MARGIN_AFTER_TC_ATTENTION', 1.2, { min: 1, max: 4 }),
  fusedBlocksPerSm: mappedKnob('LLMTS_CUDA_GEMVP_FUSED_BPS', ['2', '1', '3'], { 1: 1, 2: 2, 3: 3 } as const),
  fp8Weights: switchKnob('LLMTS_CUDA_FP8_WEIGHTS', true),
  fp8GemvMaxRows: intKnob('LLMTS_CUDA_FP8_GEMV_MAX_ROWS', GEMV_FP8_MAX_M, { min: 0, max: GEMV_FP8_MAX_M }),
  fp8Gemv: choiceKnob('LLMTS_CUDA_FP8_GEMV', ['tensor-core', 'cuda-core']),
  fp8TcWarps: mappedKnob('LLMTS_CUDA_FP8_TC_WARPS', ['4', '8', '16'], { 4: 4, 8: 8, 16: 16 } as const),
};

const ATTENTION_KNOBS: Knobs<CudaAttentionSettings> = {
  mode: choiceKnob('LLMTS_CUDA_ATTENTION', ['auto', 'generic']),
  decodeKernel: choiceKnob('LLMTS_CUDA_ATT_DECODE', ['tc', 'cuda-core']),
  decodeBlocksPerSm: intKnob('LLMTS_CUDA_ATT_DECODE_BLOCKS', 8, { min: 1, max: 64 }),
  tcResident: intKnob('LLMTS_CUDA_ATT_TC_RESIDENT', 3, { min: 1, max: 32 }),
  oneTokenHint: switchKnob('LLMTS_CUDA_ATT_ONE_TOKEN_HINT', true),
  tcMinChunk: intKnob('LLMTS_CUDA_ATT_TC_MIN_CHUNK', 64, { min: 32, max: 1024, multipleOf: 32 }),
  tcGrid: choiceKnob('LLMTS_CUDA_ATT_TC_GRID', ['heads-first', 'slots-first']),
  tcTrigger: choiceKnob('LLMTS_CUDA_ATT_TC_TRIGGER', ['loaded', 'split', 'entry', 'exit']),
  tcStages: intKnob('LLMTS_CUDA_ATT_TC_STAGES', 2, { min: 2, max: 4 }),
  pfStages: intKnob('LLMTS_CUDA_ATT_PF_STAGES', 2, { min: 2, max: 4 }),
  invariantChunk: intKnob('LLMTS_CUDA_ATT_INVARIANT_CHUNK', 512, { min: 32, max: 65536, multipleOf: 32 }),
};

const FUSED_KNOBS: Knobs<CudaFusedSettings> = {
  fuseGlu: switchKnob('LLMTS_CUDA_FUSE_GLU', false),
  fuseNorm: switchKnob('LLMTS_CUDA_FUSE_NORM', true),
  ropeEpilogue: switchKnob('LLMTS_CUDA_ROPE_EPILOGUE', false),
  gluEpilogue: switchKnob('LLMTS_CUDA_GLU_EPILOGUE', true),
};

const MOE_KNOBS: Knobs<CudaMoeSettings> = {
  kernels: choiceKnob('LLMTS_CUDA_MOE', ['vec', 'scalar']),
  groupedMinRows: intKnob('LLMTS_CUDA_MOE_GROUPED_MIN_ROWS', 8, { min: 0, max: 1 << 20 }),
  passRows: intKnob('LLMTS_CUDA_MOE_PASS_ROWS', 2048, { min: 16, max: 65536 }),
  tcMinRows: intKnob('LLMTS_CUDA_MOE_TC_MIN_ROWS', 64, { min: 0, max: 1 << 20 }),
  tcDownMinRows: intKnob('LLMTS_CUDA_MOE_TC_DOWN_MIN_ROWS', 64, { min: 0, max: 1 << 20 }),
  downRows: mappedKnob('LLMTS_CUDA_MOE_DOWN_ROWS', ['4', '1'], { 4: 4, 1: 1 } as const),
  hiddenRows: mappedKnob('LLMTS_CUDA_MOE_HIDDEN_ROWS', ['2', '1'], { 2: 2, 1: 1 } as const),
};

/** Macros the attention module's host plans with: set through CudaAttentionSettings, never as defines. */
const HOST_PLANNED_DEFINES: Readonly<Record<string, string>> = {
  ATT_TC_MIN_CHUNK: 'the host plans the slots with it): use LLMTS_CUDA_ATT_TC_MIN_CHUNK',
  ATT_TC_TRIGGER: 'the GEMM tuner reads it): use LLMTS_CUDA_ATT_TC_TRIGGER',
  ATT_BI: 'the host plans batch-invariant launches with it): use LLMTS_CUDA_BATCH_INVARIANT',
  ATT_BI_CHUNK: 'the host sizes the partials with it): use LLMTS_CUDA_ATT_INVARIANT_CHUNK',
};

const BATCH_INVARIANT_KNOB = switchKnob('LLMTS_CUDA_BATCH_INVARIANT', false);

/**
 * Knobs that would bring back a choice by row count, refused with batch-invariant mode: a GEMV
 * forced or preferred (they run up to 8 rows only) and the CUDA-core decode attention (its splits
 * and the prefill kernel's sums differ).
 */
function batchInvariantConflicts(s: Omit<CudaSettings, 'batchInvariant'>): string | undefined {
  if (s.gemv.mode !== 'auto' && s.gemv.mode !== 'off') return `LLMTS_CUDA_GEMV=${s.gemv.mode} (GEMV kernels take decode rows only)`;
  if (s.gemv.picks.size > 0) return 'LLMTS_CUDA_GEMV_PICKS (a pick of one row count)';
  if (s.attention.decodeKernel !== 'tc') return 'LLMTS_CUDA_ATT_DECODE=cuda-core (its splits differ from the prefill kernel\'s sums)';
  return undefined;
}

/** The CUDA backend's settings: `overrides` where given (checked), the rest from `env`. */
export function cudaSettingsFrom(env: Env, overrides: CudaSettingsOverrides = {}): CudaSettings {
  const kernels = settingsFrom(KERNEL_KNOBS, env, overrides.kernels, 'kernels.');
  for (const [name, why] of Object.entries(HOST_PLANNED_DEFINES)) {
    if (name in kernels.attentionDefines) throw new Error(`LLMTS_CUDA_ATT_DEFINES cannot set ${name} (${why}`);
  }
  const groups = {
    runtime: settingsFrom(RUNTIME_KNOBS, env, overrides.runtime, 'runtime.'),
    kernels,
    gemm: settingsFrom(GEMM_KNOBS, env, overrides.gemm, 'gemm.'),
    gemv: settingsFrom(GEMV_KNOBS, env, overrides.gemv, 'gemv.'),
    attention: settingsFrom(ATTENTION_KNOBS, env, overrides.attention, 'attention.'),
    fused: settingsFrom(FUSED_KNOBS, env, overrides.fused, 'fused.'),
    moe: settingsFrom(MOE_KNOBS, env, overrides.moe, 'moe.'),
  };
  const batchInvariant = overrides.batchInvariant === undefined ? BATCH_INVARIANT_KNOB.read(env)
    : BATCH_INVARIANT_KNOB.check(overrides.batchInvariant, 'batchInvariant');
  const conflict = batchInvariant ? batchInvariantConflicts(groups) : undefined;
  if (conflict) throw new Error(`batchInvariant ($LLMTS_CUDA_BATCH_INVARIANT) cannot be used with ${conflict}`);
  return Object.freeze({ batchInvariant, ...groups });
}

/** Every knob at its default (an empty environment): what tests and the simulators plan with. */
export const CUDA_DEFAULTS: CudaSettings = cudaSettingsFrom({});
