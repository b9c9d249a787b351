// Every constant the fit planner uses that is not read from the model or derived from the
// engine's own code, each with the measurement behind it. Two groups:
//
//  * CPU constants: measured on this project's CPU machine (AMD EPYC, 2 vCPUs, 23.5 GiB, a KVM
//    guest shared with other jobs) with bench/fit-accuracy.ts; the command and numbers are
//    written beside each. They describe the CPU backend on this machine; on another CPU the
//    runtime and tokenizer constants carry over, the decode efficiency and overheads may not.
//  * CUDA constants: NOT YET MEASURED. The issue (#5) requires each to be measured on the H200
//    (peak device memory read through the driver during real runs at several context lengths
//    and chunk sizes); until then they are provisional placeholders, every plan that uses one
//    lists it in `unmeasured`, and the README says so. Do not cite them as measurements.
//
// Policies (utilization, the RAM left to the OS) are choices, not measurements, and say so.

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

/**
 * Resident memory of a `llmts` process that holds neither weights nor KV cache: Node, tsx, the
 * llmts modules, the native library and its threads, the V8 heap of a running engine.
 */
export const CPU_RUNTIME_BYTES: Constant = {
  value: 96 * 2 ** 20,
  measured: true,
  how: 'node --import tsx bench/fit-accuracy.ts --calibrate, run 4 times: peak RSS (VmHWM) of 17 runs each (demo model, ' +
    'fixtures, random-weight 1.2B llama / gemma2 sliding / qwen3_moe and 12- and 24-layer models; ctx 256-4128; chunks ' +
    '64-512; batch 1 and 4; sweeps of 512 and 128 prompt lengths) minus the modelled weights, KV pools, step memory and ' +
    'tokenizer: medians 96.4, 95.0, 95.2, 97.2 MiB (min 87.2, max 126.8; RSS after the imports alone 83.3-92.5 MiB)',
};

/**
 * Resident memory of a parsed tokenizer per byte of tokenizer.json (the tokenizers WASM heap
 * and the JS-side vocabulary), added to CPU_RUNTIME_BYTES.
 */
export const CPU_TOKENIZER_BYTES_PER_FILE_BYTE: Constant = {
  value: 20,
  measured: true,
  how: 'node --import tsx bench/fit-accuracy.ts --calibrate: RSS after TextTokenizer.fromDir minus before, 3 runs each: ' +
    'test/fixtures/llama (21,834 B file) 0.6 MiB (31x); models/demo (545,130 B) 7.2-8.1 MiB (14-16x); ' +
    'a synthetic 128k-token byte-level BPE (7,099,024 B, as large as Llama 3\'s) 134.9-135.9 MiB (19.9-20.1x)',
};

/** Fraction of the measured copy bandwidth a decode step achieves on the CPU backend. */
export const CPU_DECODE_EFFICIENCY: Constant = {
  value: 0.86,
  measured: true,
  how: 'node --import tsx bench/fit-accuracy.ts --calibrate: random-weight Llama-3.2-1B shapes (2.47 GB of weights ' +
    'read per step), median step of the fastest of 3 processes minus the overheads and attention below, against the copy ' +
    'bandwidth measured in the same process; two quiet runs (load average < 3): 0.82, 0.98, 0.86 and 0.84, 0.97, 0.86 ' +
    '(ctx 544, 2080, 2080 / chunk 128; 81-92 ms a step at 35-39 GB/s): median 0.86. Under heavy load from other jobs ' +
    '(load average 5-10 on the 2 vCPUs) the same runs gave 0.63-0.73',
};

/** Fixed time per decode step on the CPU backend (JS scheduling, sampling, op dispatch), ms. */
export const CPU_STEP_OVERHEAD_MS: Constant = {
  value: 0.2,
  measured: true,
  how: 'node --import tsx bench/fit-accuracy.ts --calibrate, 4 runs: least squares of the median decode step (per model, ' +
    'the median over the runs of the fastest-of-3 median) over models that read under 8 MiB a step, so the time is all ' +
    'overhead: llama fixture (2 layers) 0.61 ms (0.40-0.81), gemma2 fixture (3) 0.85 (0.44-0.90), qwen3_moe fixture (3) ' +
    '0.72 (0.50-0.84), 12 layers 2.5 (2.1-4.7), 24 layers 4.8 (3.5-10.8) -> 0.2 ms a step + 0.19 ms a layer. The spread ' +
    'between runs is large: the VM shares its cores',
};

/** Dispatch time per decoder layer per step on the CPU backend, ms. */
export const CPU_LAYER_OVERHEAD_MS: Constant = {
  value: 0.19,
  measured: true,
  how: 'the same least squares as CPU_STEP_OVERHEAD_MS (about 20 ops a layer, each a queue round trip and an OpenMP region)',
};

/**
 * Decode attention on the CPU backend, FLOPs per second per core (4 per key, head dim and query
 * head: q.k and p.v), when it is bounded by arithmetic rather than by reading the KV.
 */
export const CPU_ATTENTION_GFLOPS_PER_CORE: Constant = {
  value: 16.9,
  measured: true,
  how: 'node --import tsx bench/fit-accuracy.ts --calibrate: a random-weight attention-heavy model (4 layers, 16 query ' +
    'heads of 128 on 4 KV heads, small weights) decodes at 64 and at 2048 tokens of context in turn, 3 rounds in one ' +
    'process; the median step grows by 2.02 ms (2.16-2.54 -> 4.12-4.33) and 2.00 ms in two runs for 65.0 MFLOP more: ' +
    '31.5 and 36.0 GFLOP/s on the 2 vCPUs, 16.9 per core',
};
export function cpuAttentionFlops(): number {
  return CPU_ATTENTION_GFLOPS_PER_CORE.value * 1e9 * os.availableParallelism();
}

/** Policy: RAM left to the operating system and other processes when planning for a CPU. */
export function cpuSystemReserveBytes(totalBytes: number): number {
  return Math.max(2 ** 30, Math.round(totalBytes * 0.1));
}
export const CPU_SYSTEM_RESERVE_POLICY = 'max(1 GiB, 10% of RAM) left to the OS and other processes (a policy, not a measurement)';

// ---------------------------------------------------------------------------------------------
// CUDA: NOT YET MEASURED. Provisional placeholders; each must be measured on the H200.
// ---------------------------------------------------------------------------------------------

/** Policy (vLLM's default): fraction of device memory the engine may use. */
export const DEFAULT_GPU_MEMORY_UTILIZATION = 0.9;

/** CUDA context and module images resident on the device. NOT YET MEASURED. */
export const CUDA_CONTEXT_BYTES: Constant = {
  value: 512 * 2 ** 20,
  measured: false,
  how: 'NOT YET MEASURED: provisional 512 MiB. Measure on the H200: device memory used (driver, cuMemGetInfo) after context creation + NVRTC module load, before any allocation',
};

/** cuBLASLt workspace. NOT YET MEASURED. */
export const CUDA_CUBLASLT_WORKSPACE_BYTES: Constant = {
  value: 32 * 2 ** 20,
  measured: false,
  how: 'NOT YET MEASURED: provisional 32 MiB. Read the workspace size the CUDA backend configures and confirm with cuMemGetInfo on the H200',
};

/** Memory held by captured decode graphs (all batch buckets). NOT YET MEASURED. */
export const CUDA_GRAPH_BYTES: Constant = {
  value: 256 * 2 ** 20,
  measured: false,
  how: 'NOT YET MEASURED: provisional 256 MiB. Measure on the H200: cuMemGetInfo before and after capturing every batch-size bucket',
};

/** Fraction of peak HBM bandwidth a decode step achieves. NOT YET MEASURED. */
export const CUDA_DECODE_EFFICIENCY: Constant = {
  value: 0.25,
  measured: false,
  how: 'NOT YET MEASURED by the planner. Provisional 0.25 from the one CUDA decode figure on record (BENCHMARKS.md, ' +
    'issue 4, commit 6cbeef2: Llama-3.1-8B shapes, B=1, 81.1 tok/s x 15.01 GB per step = 1,217 GB/s = 0.254 of 4.8 TB/s; ' +
    'launch-bound, 517 launches a step, so it will move with CUDA graphs and fusion). Measure on the H200: decode tok/s ' +
    'x bytes read per step / 4.8 TB/s at several context lengths and model sizes',
};

/**
 * Activation memory on CUDA: the planner runs the decoder graph with bf16 activations on the CUDA
 * pool's size classes (backends/cuda/device-pool.ts), counting one step's live blocks (the pool
 * gives its cache back when an allocation fails). Scratch that ops allocate internally (cuBLASLt,
 * dtype conversions) is not modelled. NOT YET MEASURED: peak device memory during prefill at
 * several chunk sizes and context lengths on the H200 must confirm it.
 */
export const CUDA_ACTIVATION_MODEL =
  'NOT YET MEASURED: decoder graph, bf16 activations on the CUDA pool size classes, one step live; op-internal scratch not modelled';
