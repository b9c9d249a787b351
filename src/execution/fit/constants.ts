// Every constant the fit planner uses that is not read from the model or derived from the
// engine's own code, each with the measurement behind it. Two groups:
//
//  * CPU constants: measured on this project's CPU machine (AMD EPYC, 2 vCPUs, 23.5 GiB, a KVM
//    guest shared with other jobs) with bench/fit-accuracy.ts; the command and numbers are
//    written beside each. They describe the CPU backend on this machine; on another CPU the
//    runtime and tokenizer constants carry over, the decode ones may not.
//  * CUDA constants: measured by bench/fit-cuda.ts on the H200 (device memory through the driver
//    during real runs at several context lengths and chunk sizes; decode steps of several models,
//    contexts and batch sizes). The script prints each value with its measurement
//    (constants.ts.txt), so only the values and `how` change here.
// A constant with `measured: false` is a placeholder: every plan that uses one lists it in
// `unmeasured`, and it must not be cited as a measurement.
//
// The decode constants are the terms of decode-model.ts, one constant each; the registries at the
// end say which constants a backend kind uses. Policies (utilization, the RAM left to the OS) are
// choices, not measurements, and say so.

import os from 'node:os';

export interface Constant {
  value: number;
  /** true when `how` describes a measurement that produced `value` */
  measured: boolean;
  how: string;
}

// ---------------------------------------------------------------------------------------------
// CPU (native CPU backend), measured
// ---------------------------------------------------------------------------------------------

// Measured by `node --import tsx bench/fit-accuracy.ts --calibrate --repeats 5` on the CPU machine
// above, commit 42d6701, 2026-11-30 (/proc/loadavg 0.43 at the start, 2.14 at the end; copy
// bandwidth 42.4 GB/s, the best of the run's 102 measurements): every case of the script in a fresh
// process, decode the fastest of 5 processes' median step. Where a second calibration run measured
// the same quantity directly (commit 0d5c97d, the same day, 41.4 GB/s, the same kernels), its value
// is given beside; its fitted values are not (its decode model ran every layer's attention on the
// OpenMP team), so the fitted decode constants are those of decode-model.ts as it is.

/** The command, machine, commit and date of the CPU calibration every CPU constant below comes from. */
const CPU_CALIBRATION = 'node --import tsx bench/fit-accuracy.ts --calibrate --repeats 5, AMD EPYC 2-vCPU VM, commit 42d6701, 2026-11-30';

/**
 * Resident memory of a `llmts` process that holds neither weights nor KV cache: Node, tsx, the
 * llmts modules, the native library and its threads, the V8 heap of a running engine.
 */
export const CPU_RUNTIME_BYTES: Constant = {
  value: 97 * 2 ** 20,
  measured: true,
  how: `${CPU_CALIBRATION}: peak RSS (VmHWM) of 21 runs (demo model, fixtures, random-weight 1.2B llama / ` +
    'gemma2 sliding / qwen3_moe, 12- and 24-layer and small-matrix models; ctx 256-4128; chunks 64-512; batch 1, 4, 8; ' +
    'sweeps of 512 and 128 prompt lengths) minus the modelled weights, KV pools, step memory and tokenizer: median 97.0 ' +
    'MiB (97.2 in the second calibration run), min 77.4, max 104.1 (RSS after the imports alone 87-95 MiB)',
};

/**
 * Resident memory of a parsed tokenizer per byte of tokenizer.json (the tokenizers WASM heap
 * and the JS-side vocabulary), added to CPU_RUNTIME_BYTES.
 */
export const CPU_TOKENIZER_BYTES_PER_FILE_BYTE: Constant = {
  value: 20,
  measured: true,
  how: `${CPU_CALIBRATION}: RSS after TextTokenizer.fromDir minus before, 3 processes each, in both calibration runs: test/fixtures/llama ` +
    '(21,834 B file) 0.1-0.3 MiB; models/demo (545,130 B) 6.4-8.1 MiB (12-16x); a synthetic 128k-token byte-level BPE ' +
    '(7,099,024 B, as large as Llama 3\'s) 132.3-133.6 MiB (19.5-19.7x)',
};

/** Fraction of the measured copy bandwidth at which the OpenMP team streams a decode matmul's weights. */
export const CPU_DECODE_EFFICIENCY: Constant = {
  value: 0.92,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the decode constants below (non-negative least squares on relative error over 23 decode ` +
    'samples; the 1.2B llama, 2.47 GB a step, weighs most): 0.921. The kernel alone on 16 matrices of ' +
    '8 MiB streams at 0.73 of the copy bandwidth (0.76 in the second run); a whole step reads its matrices back to back',
};

/** Fraction of the measured copy bandwidth at which one thread streams a matrix under the threshold below. */
export const CPU_SMALL_MATMUL_EFFICIENCY: Constant = {
  value: 0.74,
  measured: true,
  how: `${CPU_CALIBRATION}: the decode matmul kernel alone, one row through 64 bf16 matrices of 960 x 512 (0.94 MiB, under the ` +
    '1 MiB threshold: one thread), fastest of 5 passes in each of 3 processes: 31.35 GB/s = 0.739 of 42.4 GB/s ' +
    '(the second run: 31.06 GB/s = 0.750 of 41.4)',
};

/** Multiply-adds per second per core of the decode (few-row) matmul kernel, bf16 weights and f32 rows, G. */
export const CPU_MATMUL_GMACS_PER_CORE: Constant = {
  value: 38.6,
  measured: true,
  how: `${CPU_CALIBRATION}: the same 64 matrices, 16 rows on one thread: 38.6 GMAC/s (37.5 in the second run; processes 33.8-38.6). 16 rows on ` +
    'the team over 8 MiB matrices reached 23.0-24.3 per core: the plan\'s team matmuls are bandwidth-bound up to 16 rows ' +
    'at either rate',
};

/** Time of one OpenMP parallel region of a decode matmul (waking the team, joining it), ms. */
export const CPU_PARALLEL_MATMUL_MS: Constant = {
  value: 0.044,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the other decode constants (the MoE model, 96 expert regions a step, and ` +
    'each layer whose attention runs on the team carry it): 0.044. The kernel alone: 128 matrices of 1.02 MiB ' +
    '(just over the threshold) take 0.014-0.016 ms more each than streaming them at the team\'s rate',
};

/** Fraction of the measured copy bandwidth at which decode attention reads the f32 KV cache. */
export const CPU_KV_READ_EFFICIENCY: Constant = {
  value: 0.64,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the other decode constants, chiefly from two small-weight models decoding at 64 and 2048 ` +
    'tokens in turn in one process (16 query heads of 128 on 4 and on 16 KV heads) and the gemma2 sliding model at 4k: ' +
    '0.64. Paged f32 blocks read per (token, KV head) stream slower than weights',
};

/**
 * Decode attention's arithmetic on the CPU backend, FLOPs per second per core (4 per key, head
 * dim and query head: q.k and p.v), on top of reading the KV.
 */
export const CPU_ATTENTION_GFLOPS_PER_CORE: Constant = {
  value: Infinity,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the other decode constants: unbounded in both calibration runs (the ` +
    'least-squares weight of this term is 0: the vectorized decode attention\'s arithmetic hides behind its KV read, ' +
    'at G = 1 and 4 alike). Kept as a term so a machine where it shows can refit it',
};
export function cpuAttentionFlops(): number {
  return CPU_ATTENTION_GFLOPS_PER_CORE.value * 1e9 * os.availableParallelism();
}

/** Fixed time per decode step on the CPU backend (JS scheduling, op dispatch), ms. */
export const CPU_STEP_OVERHEAD_MS: Constant = {
  value: 0.095,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the other decode constants (models of 2 to 24 layers at batch 1, 4 and 8): 0.095`,
};

/** Dispatch time per decoder layer per step on the CPU backend (about 20 ops: queue round trips), ms. */
export const CPU_LAYER_OVERHEAD_MS: Constant = {
  value: 0.019,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the other decode constants over models of 2, 3, 6, 8, 12, 16 and 24 layers: 0.019`,
};

/** Work per row of a decode step outside the model (sampling, detokenizing, events), ms. */
export const CPU_ROW_OVERHEAD_MS: Constant = {
  value: 0.0013,
  measured: true,
  how: `${CPU_CALIBRATION}: fitted with the other decode constants from the batch 4 and 8 cases (demo, small-matrix model, MoE): ` +
    '0.0013: sampling and events per row cost little next to the rows\' matmul work',
};

/** Policy: RAM left to the operating system and other processes when planning for a CPU. */
export function cpuSystemReserveBytes(totalBytes: number): number {
  return Math.max(2 ** 30, Math.round(totalBytes * 0.1));
}
export const CPU_SYSTEM_RESERVE_POLICY = 'max(1 GiB, 10% of RAM) left to the OS and other processes (a policy, not a measurement)';

// ---------------------------------------------------------------------------------------------
// CUDA: measured by `node --import tsx bench/fit-cuda.ts --out DIR --budget-s 444` on an NVIDIA H200
// (driver 580.159.04, CUDA 13.0), commit eeecf94, 2026-11-30: 18 cases in fresh processes. The run's
// recorded measurements are test/fit/fixtures/fit-cuda-h200-2026-11-30-eeecf94/fit-cuda.json;
// `node --import tsx bench/fit-cuda.ts --from-json <that file> --out DIR` refits them offline (no
// GPU) and gives back every value below.
// ---------------------------------------------------------------------------------------------

/** The command, machine, commit and date of the CUDA calibration every CUDA constant below comes from. */
const CUDA_CALIBRATION = 'node --import tsx bench/fit-cuda.ts --out DIR --budget-s 444 on NVIDIA H200, commit eeecf94, 2026-11-30';

/** Policy (vLLM's default): fraction of device memory the engine may use. */
export const DEFAULT_GPU_MEMORY_UTILIZATION = 0.9;

/**
 * Device memory a CUDA backend holds outside its block pool once created: the context, the
 * NVRTC module, the cuBLASLt handle.
 */
export const CUDA_CONTEXT_BYTES: Constant = {
  value: 560791296,
  measured: true,
  how: `${CUDA_CALIBRATION}: device memory used (nvml) right after createCudaBackend minus before the process touched CUDA, minus the pool's live bytes then; 18 processes: median 534.8 MiB (min 534.8, max 534.8)`,
};

/**
 * What the pool holds right after creation: the cuBLASLt workspace, the error word and the
 * tensor-core decode attention's split counters (attention.ts ATT_COUNTERS).
 */
export const CUDA_CUBLASLT_WORKSPACE_BYTES: Constant = {
  value: 37748992,
  measured: true,
  how: `${CUDA_CALIBRATION}: the pool's live bytes (memoryStats) right after createCudaBackend, 18 processes: 37748992 B`,
};

/**
 * Device memory outside the pool that appears once steps run: kernels and cuBLASLt kernels loaded
 * lazily on first use, cuBLASLt's internal buffers, captured CUDA graphs.
 */
export const CUDA_RUNTIME_GROWTH_BYTES: Constant = {
  value: 139847680,
  measured: true,
  how: `${CUDA_CALIBRATION}: device memory used (cuMemGetInfo) minus the pool's live and idle bytes, at the end of each run minus right after creation; largest of 18 cases: 133.4 MiB (gemma2 ctx 8192 chunk 1024); median 8.0 MiB`,
};

/** Fraction of peak HBM bandwidth at which a decode step reads the weights. */
export const CUDA_DECODE_EFFICIENCY: Constant = {
  value: 0.8995,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/** Fraction of peak HBM bandwidth at which decode attention reads the KV cache. */
export const CUDA_KV_READ_EFFICIENCY: Constant = {
  value: 0.6492,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/** Fixed time per CUDA decode step (host work, sampling, the logits copy), ms. */
export const CUDA_STEP_OVERHEAD_MS: Constant = {
  value: 0.2023,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/** Time per kernel of a CUDA decode step (a replayed graph's small kernels and the gaps between them), ms. */
export const CUDA_KERNEL_OVERHEAD_MS: Constant = {
  value: 0,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/**
 * Fixed time per attention layer of a CUDA decode step, per 128 of head dim (the split-KV decode
 * kernel and its combine, latency-bound at decode sizes), ms.
 */
export const CUDA_ATTENTION_LAYER_MS: Constant = {
  value: 0.02995,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/**
 * Fraction of peak HBM bandwidth at which the MoE kernels read the experts of each (token, expert) pair.
 * The fit's MoE cases decode 1 and 4 rows, which run per (token, expert) pair: the grouped path (8
 * tokens and more, where decode-model.ts counts each chosen expert read once: groupedExpertReads)
 * is not in it. Checked against a 16-row decode graph profile (`PROFILE=1 bash bench/cuda-moe.sh DIR`:
 * 24 of Qwen3-30B-A3B's layers, NVIDIA H200, commit 94141ef, 2026-11-30: 245 us a layer of MoE
 * kernels, event nodes included), this value gives 208 us for the 778 MB of distinct experts a layer
 * reads; counting per pair would give 322.
 */
export const CUDA_MOE_EFFICIENCY: Constant = {
  value: 0.7812,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/** Fixed time per MoE layer per CUDA decode step (k_moe_hidden / k_moe_down latency), ms. */
export const CUDA_MOE_LAYER_MS: Constant = {
  value: 0,
  measured: true,
  how: `${CUDA_CALIBRATION}: fitted with the other decode constants (non-negative least squares on relative error) to the median decode step of 18 cases (models probe4, probe32, llama8b, gemma2, moe; contexts 320, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536; batch 1, 4, 16) against 4800 GB/s; fitted errors within +18.2% (gemma2 ctx 8192 chunk 1024); each case predicted from a fit without it: worst +177.4% (probe32 ctx 320 chunk 512)`,
};

/**
 * Activation memory on CUDA: the planner runs the decoder graph with bf16 activations on the CUDA
 * pool's size classes (backends/cuda/device-pool.ts), op-internal scratch included (dry-run-backend.ts),
 * counting one step's live blocks (the pool gives its cache back when an allocation fails).
 * `value` multiplies that simulated step memory: 1 = as simulated.
 */
export const CUDA_ACTIVATION_SCALE: Constant = {
  value: 1.002,
  measured: true,
  how: `${CUDA_CALIBRATION}: the pool's live high-water mark during the steps (above weights and KV) over the simulated one for the same recorded steps, 18 cases (contexts 320, 1024, 4096, 512, 2048, 8192, 16384, 32768, 65536; chunks 512, 2048, 128, 1024, 256, 4096): ratios 0.818-1.002, the largest kept (llama8b ctx 512 chunk 512 batch 16)`,
};
export const CUDA_ACTIVATION_MODEL =
  'decoder graph, bf16 activations and op scratch on the CUDA pool size classes, one step live';

// ---------------------------------------------------------------------------------------------
// Registries: what plans list as `unmeasured`, and what the benches print and override.
// ---------------------------------------------------------------------------------------------

export const CPU_CONSTANTS = {
  CPU_RUNTIME_BYTES, CPU_TOKENIZER_BYTES_PER_FILE_BYTE, CPU_DECODE_EFFICIENCY, CPU_SMALL_MATMUL_EFFICIENCY,
  CPU_MATMUL_GMACS_PER_CORE, CPU_PARALLEL_MATMUL_MS, CPU_KV_READ_EFFICIENCY, CPU_ATTENTION_GFLOPS_PER_CORE,
  CPU_STEP_OVERHEAD_MS, CPU_LAYER_OVERHEAD_MS, CPU_ROW_OVERHEAD_MS,
} as const;

export const CUDA_CONSTANTS = {
  CUDA_CONTEXT_BYTES, CUDA_CUBLASLT_WORKSPACE_BYTES, CUDA_RUNTIME_GROWTH_BYTES, CUDA_DECODE_EFFICIENCY,
  CUDA_KV_READ_EFFICIENCY, CUDA_STEP_OVERHEAD_MS, CUDA_KERNEL_OVERHEAD_MS, CUDA_ATTENTION_LAYER_MS, CUDA_MOE_EFFICIENCY, CUDA_MOE_LAYER_MS,
  CUDA_ACTIVATION_SCALE,
} as const;

export type CpuConstantName = keyof typeof CPU_CONSTANTS;
export type CudaConstantName = keyof typeof CUDA_CONSTANTS;
export type ConstantName = CpuConstantName | CudaConstantName;

/** Names of the constants of a backend kind that are not measured yet. */
export function unmeasuredConstants(kind: 'cpu' | 'cuda'): string[] {
  const all: Record<string, Constant> = kind === 'cpu' ? CPU_CONSTANTS : CUDA_CONSTANTS;
  return Object.entries(all).filter(([, c]) => !c.measured).map(([n]) => n);
}

/**
 * Runs `fn` with some constants replaced (benches: predictions with freshly measured values
 * before they are written here), restoring them afterwards. Never used by the planner itself.
 */
export async function withConstants<T>(values: Partial<Record<ConstantName, number>>, fn: () => Promise<T>): Promise<T> {
  const all: Record<string, Constant> = { ...CPU_CONSTANTS, ...CUDA_CONSTANTS };
  const saved = new Map<Constant, number>();
  for (const [name, v] of Object.entries(values)) {
    const c = all[name];
    if (!c) throw new Error(`unknown constant ${name}`);
    if (v === undefined) continue;
    saved.set(c, c.value);
    c.value = v;
  }
  try {
    return await fn();
  } finally {
    for (const [c, v] of saved) c.value = v;
  }
}
