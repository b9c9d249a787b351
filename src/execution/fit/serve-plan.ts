// How the server sizes its KV pool: with the same numbers `llmts fit` reports. The pool is
// allocated once at startup; admission then queues what does not fit now and refuses what never
// can (scheduler.ts), so the pool size is the server's whole memory decision.
//
//   --kv-budget SIZE               the pools get at most SIZE bytes
//   --gpu-memory-utilization F     (CUDA) device memory x F, minus weights, transient, reserve
//   neither                        room for max-batch sequences of max-model-len, but no more than
//                                  the usable memory (fit's rule) and what is free right now leave

import type { DType } from '../../contracts/backend.ts';
import { DEFAULT_GPU_MEMORY_UTILIZATION, cpuSystemReserveBytes } from './constants.ts';
import { DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK, FitError, type FitPlanner, type KvDtype, type KvGroupReport } from './plan.ts';

export interface ServeKvRequest {
  /** the backend the server runs ('reference' plans as the CPU) */
  backend: 'cpu' | 'cuda' | 'reference';
  /** KV dtype the backend stores (its activation dtype) */
  kvDtype: DType;
  maxBatch: number;
  maxModelLen: number;
  /** tokens per engine step (default the engine's 512) */
  chunk?: number;
  blockSize?: number;
  kvBudgetBytes?: number;
  /** CUDA: fraction of device memory (default 0.9) */
  utilization?: number;
  /** memory of the machine: RAM (CPU) or device memory (CUDA), and what is free right now */
  memory: { totalBytes: number; freeBytes: number };
}

export interface ServeKvPlan {
  /** the engine's kvTokens: tokens the full-attention pools hold (whole blocks) */
  kvTokens: number;
  kvBytes: number;
  groups: KvGroupReport[];
  /** KV bytes per token over all layers */
  bytesPerToken: number;
  weightsBytes: number;
  transientBytes: number;
  reserveBytes: number;
  /** usable memory by fit's rule (undefined with --kv-budget) */
  usableBytes?: number;
  /** why the pool is the size it is */
  why: string;
}

export class KvBudgetError extends Error {}

/** KV pools for a pool of `tokens` full-attention tokens (engine.ts sizing). */
function poolsFor(planner: FitPlanner, tokens: number, r: Required<Omit<ServeKvRequest, 'kvBudgetBytes' | 'utilization'>>) {
  const kind = r.backend === 'cuda' ? 'cuda' : 'cpu';
  return planner.kvPools(r.maxModelLen, r.maxBatch, r.chunk, r.blockSize, r.kvDtype as KvDtype, kind, tokens);
}

/** Largest whole-block token count whose pools fit `budget` bytes (0 when not even one block). */
function tokensForBudget(planner: FitPlanner, budget: number, r: Required<Omit<ServeKvRequest, 'kvBudgetBytes' | 'utilization'>>): number {
  const bs = r.blockSize;
  if (poolsFor(planner, bs, r).bytes > budget) return 0;
  // all-sliding models stop growing at maxBatch x maxModelLen; full layers grow without bound
  let lo = 1;
  let hi = 2;
  const cap = Math.ceil((r.maxBatch * r.maxModelLen) / bs) * 64;
  while (hi <= cap && poolsFor(planner, hi * bs, r).bytes <= budget) (lo = hi), (hi *= 2);
  if (hi > cap) return lo * bs;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (poolsFor(planner, mid * bs, r).bytes <= budget) lo = mid;
    else hi = mid;
  }
  return lo * bs;
}

export async function planServeKv(planner: FitPlanner, req: ServeKvRequest): Promise<ServeKvPlan> {
  const r = {
    backend: req.backend, kvDtype: req.kvDtype, maxBatch: req.maxBatch, maxModelLen: req.maxModelLen,
    chunk: req.chunk ?? DEFAULT_CHUNK, blockSize: req.blockSize ?? DEFAULT_BLOCK_SIZE, memory: req.memory,
  };
  if (r.kvDtype !== 'f32' && r.kvDtype !== 'bf16' && r.kvDtype !== 'f16') throw new FitError(`KV dtype ${r.kvDtype} cannot be planned`);
  const kind = r.backend === 'cuda' ? 'cuda' : 'cpu';
  const bytesPerToken = planner.kvBytesPerToken(r.kvDtype);
  const weightsBytes = (await planner.weights(kind)).residentBytes;
  const transient = await planner.transient(r.maxModelLen, r.maxBatch, r.chunk, r.blockSize, kind);
  const reserveBytes = planner.reserve(kind).reduce((a, x) => a + x.bytes, 0);
  const base = { bytesPerToken, weightsBytes, transientBytes: transient.bytes, reserveBytes };
  const finish = (tokens: number, why: string, usableBytes?: number): ServeKvPlan => {
    const pools = poolsFor(planner, tokens, r);
    return { kvTokens: tokens, kvBytes: pools.bytes, groups: pools.groups, ...base, usableBytes, why };
  };

  if (req.kvBudgetBytes !== undefined) {
    const budget = req.kvBudgetBytes;
    if (budget < bytesPerToken) throw new KvBudgetError(`holds no token of KV cache (one token needs ${bytesPerToken} bytes)`);
    const tokens = tokensForBudget(planner, budget, r);
    if (tokens === 0) {
      throw new KvBudgetError(`holds less than one KV block (${r.blockSize} tokens need ${poolsFor(planner, r.blockSize, r).bytes} bytes)`);
    }
    return finish(tokens, '--kv-budget');
  }

  const wantTokens = r.maxBatch * Math.ceil(r.maxModelLen / r.blockSize) * r.blockSize;
  const want = poolsFor(planner, wantTokens, r).bytes;
  let usable: number;
  let usableHow: string;
  if (kind === 'cuda') {
    const u = req.utilization ?? DEFAULT_GPU_MEMORY_UTILIZATION;
    usable = Math.floor(r.memory.totalBytes * u);
    usableHow = `${u} of the device's memory`;
  } else {
    if (req.utilization !== undefined) throw new FitError('--gpu-memory-utilization applies to CUDA devices; on the CPU use --kv-budget');
    usable = r.memory.totalBytes - cpuSystemReserveBytes(r.memory.totalBytes);
    usableHow = 'RAM minus the OS reserve';
  }
  // the weights are loaded by now: what is free must still take the steps' transient memory
  const byPlan = usable - weightsBytes - transient.bytes - reserveBytes;
  const byFree = r.memory.freeBytes - transient.bytes;
  const budget = Math.min(want, byPlan, byFree);
  const tokens = budget >= want ? wantTokens : tokensForBudget(planner, budget, r);
  if (tokens === 0) {
    throw new KvBudgetError(
      `not enough memory for any KV cache: usable ${fmt(usable)} (${usableHow}) - weights ${fmt(weightsBytes)} - ` +
      `transient ${fmt(transient.bytes)} - reserve ${fmt(reserveBytes)} leaves ${fmt(byPlan)}, ${fmt(r.memory.freeBytes)} free now; ` +
      'pass --kv-budget, or lower --max-batch / --max-model-len',
    );
  }
  const why = budget >= want
    ? `room for ${r.maxBatch} sequences of ${r.maxModelLen} tokens`
    : byPlan <= byFree
      ? `limited by usable memory: ${fmt(usable)} (${usableHow}) - weights - transient - reserve`
      : `limited by free memory now (${fmt(r.memory.freeBytes)} - transient)`;
  return finish(tokens, why, usable);
}

function fmt(b: number): string {
  return Math.abs(b) >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(2)} GiB` : `${(b / 2 ** 20).toFixed(1)} MiB`;
}
