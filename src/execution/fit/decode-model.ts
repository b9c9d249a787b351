// The time of one decode step, as a sum of terms each proportional to one constant of
// constants.ts (or inversely proportional: an efficiency, a rate). A step's work is described by
// features computed from the model alone, and each backend turns what it is bound by into seconds:
//
//   CPU   step + layers x per-layer dispatch + rows x per-row work (sampling, events)
//         + each matrix of the OpenMP team (>= the native code's 1 MiB threshold, or > 16 rows):
//           one parallel region, and the longer of streaming it (copy bandwidth x efficiency) and
//           its multiply-adds on every core (rows x params)
//         + each matrix under the threshold, on one thread: the longer of streaming it at one
//           thread's rate and its multiply-adds on one core (so batch rows cost once it is
//           compute-bound)
//         + attention: KV bytes / (copy bandwidth x KV efficiency) + its arithmetic at the rate
//           per core (its own term, for machines where the arithmetic does not hide behind the
//           read; on this project's machine it fits as unbounded: constants.ts); a layer
//           whose attention reads under the matmuls' 1 MiB threshold runs it on one thread (as
//           native/attention.c does), one that reads more runs it on the team: one more parallel
//           region
//   CUDA  step + kernels x per-kernel time (a replayed graph's small kernels and the gaps between
//         them; the kernels a decode step launches are counted on the dry run of the real decoder
//         graph, so a family with more ops per layer, gemma2's extra norms and adds, pays for them)
//         + dense weight bytes / (peak bandwidth x efficiency) + KV bytes / (peak bandwidth x KV efficiency)
//         + attention layers x head dim / 128 x a fixed time: the split-KV decode kernel and its
//           combine are latency-bound at decode sizes, longer with the head dim (a key's row is
//           8 bf16 values a lane: 256 takes a whole warp per key where 128 takes half)
//         + MoE: the expert rows the MoE kernels read: below 8 rows one warp per output row and
//           (token, expert) pair with no sharing between a batch's tokens (rows x top-k experts'
//           bytes), from 8 rows grouped by expert (each chosen expert once: groupedExpertReads),
//           / (peak bandwidth x MoE efficiency), plus a fixed time per MoE
//           layer (those kernels' loops are latency-bound, far from the bandwidth at decode sizes)
//
// The longer-of choices (rooflines) are made with the constants' current values, so each term
// stays linear in one constant: the benches fit the constants by non-negative least squares over
// measured steps (calibrate.ts), and the planner reads them back from constants.ts.

import os from 'node:os';
import * as K from './constants.ts';
import type { ConstantName } from './constants.ts';
import type { Machine } from './machines.ts';
import { moeRunsGrouped } from '../../backends/cuda/moe-kernels.ts';
import type { CudaMoeSettings } from '../../backends/cuda/cuda-settings.ts';

/** What the decode model takes of the backends' settings (FitPlanner's, as the real backends would run). */
export interface DecodeSettings {
  /** CpuSettings.gemvParallelMinBytes: matrices (and a layer's KV) under it run on one thread */
  cpuGemvParallelMinBytes: number;
  /** CudaSettings.moe: when MoE layers run grouped by expert, in passes of how many tokens */
  cudaMoe: Pick<CudaMoeSettings, 'groupedMinRows' | 'passRows'>;
}

/** A 2-D weight matrix a decode step reads whole. */
export interface MatrixRead {
  bytes: number;
  params: number;
}

/** What the model's weights make a decode step read (built with the weights report). */
export interface DecodeWeights {
  /** every matrix read each step: attention projections, dense MLP, MoE routers, lm_head */
  matrices: MatrixRead[];
  /** vectors read each step (norms, biases) */
  vectorBytes: number;
  /** one embedding row (a token reads one row of the table) */
  embeddingRowBytes: number;
  /**
   * MoE layers: the matrices of one expert (gate, up, down) and the routing; groupedKernels: the
   * CUDA backend's bf16 expert kernels apply (bf16 stacks, sizes in 16-byte chunks), so a step of
   * CudaMoeSettings.groupedMinRows rows or more runs grouped by expert
   */
  experts?: { layers: number; perExpert: MatrixRead[]; numExperts: number; topK: number; groupedKernels?: boolean };
}

export interface DecodeFeatures {
  rows: number;
  /** bytes of weights read (MoE: the experts the batch touches) */
  weightBytes: number;
  /** CPU: matrices the OpenMP team runs, each with the rows that pass through it */
  parallel: { bytes: number; macs: number; count: number };
  /** CPU: matrices under the threshold, run on one thread */
  small: { bytes: number; macs: number; count: number };
  /** KV bytes the rows' attention reads (a sliding layer at most its window) */
  kvBytes: number;
  /** q.k and p.v: 4 FLOPs per key, head dimension and query head */
  attentionFlops: number;
  /** CPU: the part of kvBytes / attentionFlops in layers whose attention runs on one thread */
  attentionOneThread: { kvBytes: number; flops: number };
  /** CPU: layers whose attention runs on the OpenMP team (a parallel region each) */
  attentionRegions: number;
  layers: number;
  /** CUDA: attention layers x head dim / 128 (the decode attention kernels' fixed time) */
  attentionLayerUnits: number;
  /** CUDA: kernels one decode step launches (0 when not counted) */
  kernels: number;
  /** CUDA: expert bytes the MoE kernels read (rows x top-k experts, every MoE layer); 0 for dense models */
  expertPairBytes: number;
  /** MoE layers */
  moeLayers: number;
}

/** A term of the step time: `unit` x the constant's value, or `unit` / it when `inverse`. */
export interface DecodeTerm {
  constant: ConstantName;
  unit: number;
  inverse: boolean;
}

/** Rows above which a CPU matmul takes the packed (always parallel) path: native/matmul.c ROWS_MAX_M. */
const CPU_GEMV_MAX_ROWS = 16;

/**
 * What `rows` rows of decode make a step do (kind: whose rules split the matmuls and attention);
 * `attention`: each layer's KV bytes and attention FLOPs for the step's rows.
 */
export function decodeFeatures(
  w: DecodeWeights, layers: number, kind: 'cpu' | 'cuda', rows: number,
  attention: readonly { kvBytes: number; flops: number }[], kernels: number, headDim: number, settings: DecodeSettings,
): DecodeFeatures {
  const f: DecodeFeatures = {
    rows, weightBytes: w.vectorBytes + w.embeddingRowBytes * rows, kvBytes: 0, attentionFlops: 0, layers,
    attentionOneThread: { kvBytes: 0, flops: 0 }, attentionRegions: 0,
    attentionLayerUnits: (layers * headDim) / 128,
    parallel: { bytes: 0, macs: 0, count: 0 }, small: { bytes: 0, macs: 0, count: 0 },
    kernels, expertPairBytes: 0, moeLayers: w.experts?.layers ?? 0,
  };
  const threshold = settings.cpuGemvParallelMinBytes;
  for (const a of attention) {
    f.kvBytes += a.kvBytes;
    f.attentionFlops += a.flops;
    if (kind !== 'cpu') continue;
    if (a.kvBytes >= threshold) {
      f.attentionRegions++;
    } else {
      f.attentionOneThread.kvBytes += a.kvBytes;
      f.attentionOneThread.flops += a.flops;
    }
  }
  // one matrix read `times` times a step, with `macs` multiply-adds in all
  const read = (m: MatrixRead, times: number, macs: number) => {
    f.weightBytes += m.bytes * times;
    if (kind === 'cuda') return;
    const g = m.bytes >= threshold || rows > CPU_GEMV_MAX_ROWS ? f.parallel : f.small;
    g.bytes += m.bytes * times;
    g.macs += macs;
    g.count += times;
  };
  for (const m of w.matrices) read(m, 1, m.params * rows);
  if (w.experts && kind === 'cuda') {
    // backends/cuda/moe-kernels.ts: below cudaMoe.groupedMinRows every (token, expert) pair reads its
    // expert's rows (k_moe_hidden_v / k_moe_down_v); from there the step is grouped by expert and
    // each chosen expert's rows stream from HBM once (groupedExpertReads)
    const { layers: n, perExpert, numExperts: E, topK: k } = w.experts;
    const moe = settings.cudaMoe;
    const reads = w.experts.groupedKernels && moeRunsGrouped(rows, E, k, moe) ? groupedExpertReads(rows, E, k, moe.passRows) : rows * k;
    for (const m of perExpert) f.expertPairBytes += m.bytes * n * reads;
  } else if (w.experts) {
    const { layers: n, perExpert, numExperts: E, topK: k } = w.experts;
    // every row passes k experts; the touched ones are read once (touchedExperts)
    for (const m of perExpert) read(m, n * touchedExperts(rows, E, k), m.params * n * rows * k);
  }
  return f;
}

/** Experts that `tokens` tokens choose k of E each touch under uniform routing: E (1 - (1 - k / E)^tokens). */
export function touchedExperts(tokens: number, E: number, k: number): number {
  return E * (1 - (1 - Math.min(1, k / E)) ** tokens);
}

/**
 * Expert reads from HBM of one grouped MoE layer under uniform routing: each pass of up to
 * `passRows` tokens (CudaMoeSettings.passRows) reads every expert its tokens chose once (touchedExperts; 16 rows, 8 of 128
 * experts: 82.4 reads where per pair it was 128). A block that takes an expert's rows for more than
 * 4 or 8 of its tokens (k_moe_hidden_g2 / k_moe_down_g4) reads them again right away, from L2; the
 * tensor-core kernels (64 tokens and more) likewise.
 */
export function groupedExpertReads(rows: number, E: number, k: number, passRows: number): number {
  let reads = 0;
  for (let done = 0; done < rows; done += passRows) reads += touchedExperts(Math.min(passRows, rows - done), E, k);
  return reads;
}

/**
 * The longer of streaming `bytes` (at `bw` x the efficiency constant) and `macs` multiply-adds (at
 * the per-core rate x `cores`), as the term of whichever constant bounds it now.
 */
function roofline(bytes: number, bw: number, efficiency: ConstantName, macs: number, cores: number): DecodeTerm {
  const memory: DecodeTerm = { constant: efficiency, unit: bytes / bw, inverse: true };
  const compute: DecodeTerm = { constant: 'CPU_MATMUL_GMACS_PER_CORE', unit: macs / (1e9 * cores), inverse: true };
  return termSeconds(compute) > termSeconds(memory) ? compute : memory;
}

/** The terms of a step on `machine` (CPU: its copy bandwidth and cores; GPU: its peak bandwidth). */
export function decodeTerms(f: DecodeFeatures, machine: Machine, cores = os.availableParallelism()): DecodeTerm[] {
  const bw = machine.bandwidthGBps * 1e9;
  if (machine.kind === 'cpu') {
    return [
      { constant: 'CPU_STEP_OVERHEAD_MS', unit: 1e-3, inverse: false },
      { constant: 'CPU_LAYER_OVERHEAD_MS', unit: 1e-3 * f.layers, inverse: false },
      { constant: 'CPU_ROW_OVERHEAD_MS', unit: 1e-3 * f.rows, inverse: false },
      roofline(f.parallel.bytes, bw, 'CPU_DECODE_EFFICIENCY', f.parallel.macs, cores),
      { constant: 'CPU_PARALLEL_MATMUL_MS', unit: 1e-3 * (f.parallel.count + f.attentionRegions), inverse: false },
      roofline(f.small.bytes, bw, 'CPU_SMALL_MATMUL_EFFICIENCY', f.small.macs, 1),
      { constant: 'CPU_KV_READ_EFFICIENCY', unit: f.kvBytes / bw, inverse: true },
      {
        constant: 'CPU_ATTENTION_GFLOPS_PER_CORE', inverse: true,
        unit: ((f.attentionFlops - f.attentionOneThread.flops) / cores + f.attentionOneThread.flops) / 1e9,
      },
    ];
  }
  return [
    { constant: 'CUDA_STEP_OVERHEAD_MS', unit: 1e-3, inverse: false },
    { constant: 'CUDA_KERNEL_OVERHEAD_MS', unit: 1e-3 * f.kernels, inverse: false },
    { constant: 'CUDA_DECODE_EFFICIENCY', unit: f.weightBytes / bw, inverse: true },
    { constant: 'CUDA_KV_READ_EFFICIENCY', unit: f.kvBytes / bw, inverse: true },
    { constant: 'CUDA_ATTENTION_LAYER_MS', unit: 1e-3 * f.attentionLayerUnits, inverse: false },
    { constant: 'CUDA_MOE_EFFICIENCY', unit: f.expertPairBytes / bw, inverse: true },
    { constant: 'CUDA_MOE_LAYER_MS', unit: 1e-3 * f.moeLayers, inverse: false },
  ];
}

const ALL: Record<string, K.Constant> = { ...K.CPU_CONSTANTS, ...K.CUDA_CONSTANTS };

/** Seconds of one term with the constants' current values (a zero unit costs nothing, whatever the value). */
export function termSeconds(t: DecodeTerm): number {
  if (t.unit === 0) return 0;
  const v = ALL[t.constant]!.value;
  return t.inverse ? t.unit / v : t.unit * v;
}

export function decodeSeconds(terms: readonly DecodeTerm[]): number {
  return terms.reduce((a, t) => a + termSeconds(t), 0);
}
