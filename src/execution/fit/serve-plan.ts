// How the server sizes its KV pool: with the same numbers `llmts fit` reports. The pool is
// allocated once at startup; admission then queues what does not fit now and refuses what never
// can (scheduler.ts), so the pool size is the server's whole memory decision.
//
//   --kv-budget SIZE               the pools get at most SIZE bytes
//   --gpu-memory-utilization F     (CUDA) device memory x F, minus weights, transient, reserve
//   neither                        room for max-batch sequences of max-model-len, but no more than
//                                  the usable memory (fit's rule) and what is free right now leave
//
// With speculative decoding the plan also holds what it adds: a verify step's extra logit rows
// (f32, up to the draft tokens a step verifies), and a drafter's weights and its own KV (as many
// tokens as the model's pools), counted per token beside the model's.

import type { DType } from '../../contracts/backend.ts';
import { DEFAULT_GPU_MEMORY_UTILIZATION, cpuSystemReserveBytes } from './constants.ts';
import { DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK, FitError, KV_DTYPES, type FitPlanner, type KvDtype, type KvGroupReport } from './plan.ts';

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
  /** what speculative decoding adds (none without it) */
  speculation?: SpeculationMemory;
}

/** Memory speculative decoding takes beside the model's. */
export interface SpeculationMemory {
  /** logit rows a step may take beyond one per sampled row (its draft tokens), f32 [rows, vocab] */
  extraLogitRows: number;
  vocabSize: number;
  /** a drafter's weights, already loaded when the plan is made */
  drafterBytes: number;
  /** the drafter's KV per token of the model's pools */
  drafterKvBytesPerToken: number;
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
  /** speculative decoding's share (ServeKvRequest.speculation): its transient logits, the drafter's weights and KV */
  speculation?: { logitBytes: number; drafterBytes: number; drafterKvBytes: number };
  /** why the pool is the size it is */
  why: string;
}

export class KvBudgetError extends Error {}

type Resolved = Required<Omit<ServeKvRequest, 'kvBudgetBytes' | 'utilization' | 'speculation'>> & Pick<ServeKvRequest, 'speculation'>;

/** KV pools for a pool of `tokens` full-attention tokens (engine.ts sizing), with a drafter's KV beside them. */
function poolsFor(planner: FitPlanner, tokens: number, r: Resolved) {
  const kind = r.backend === 'cuda' ? 'cuda' : 'cpu';
  const pools = planner.kvPools(r.maxModelLen, r.maxBatch, r.chunk, r.blockSize, r.kvDtype as KvDtype, kind, tokens);
  const drafterKvBytes = tokens * (r.speculation?.drafterKvBytesPerToken ?? 0);
  return { ...pools, bytes: pools.bytes + drafterKvBytes, drafterKvBytes };
}

/** Largest whole-block token count whose pools fit `budget` bytes (0 when not even one block). */
function tokensForBudget(planner: FitPlanner, budget: number, r: Resolved): number {
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
  const r: Resolved = {
    backend: req.backend, kvDtype: req.kvDtype, maxBatch: req.maxBatch, maxModelLen: req.maxModelLen,
    chunk: req.chunk ?? DEFAULT_CHUNK, blockSize: req.blockSize ?? DEFAULT_BLOCK_SIZE, memory: req.memory, speculation: req.speculation,
  };
  const sp = req.speculation;
  const kvDtype = r.kvDtype as KvDtype;
  if (!KV_DTYPES.includes(kvDtype)) throw new FitError(`KV dtype ${r.kvDtype} cannot be planned`);
  const kind = r.backend === 'cuda' ? 'cuda' : 'cpu';
  const bytesPerToken = planner.kvBytesPerToken(kvDtype);
  const weightsBytes = (await planner.weights(kind)).residentBytes;
  const planned = await planner.transient(r.maxModelLen, r.maxBatch, r.chunk, r.blockSize, kind);
  const logitBytes = sp ? sp.extraLogitRows * sp.vocabSize * 4 : 0;
  const transient = { bytes: planned.bytes + logitBytes };
  const drafterBytes = sp?.drafterBytes ?? 0;
  const reserveBytes = planner.reserve(kind).reduce((a, x) => a + x.bytes, 0);
  const base = { bytesPerToken, weightsBytes, transientBytes: transient.bytes, reserveBytes };
  const finish = (tokens: number, why: string, usableBytes?: number): ServeKvPlan => {
    const pools = poolsFor(planner, tokens, r);
    return {
      kvTokens: tokens, kvBytes: pools.bytes - pools.drafterKvBytes, groups: pools.groups, ...base, usableBytes, why,
      ...(sp ? { speculation: { logitBytes, drafterBytes, drafterKvBytes: pools.drafterKvBytes } } : {}),
    };
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
  // the weights (and a drafter's) are loaded by now: what is free must still take the steps' transient memory
  const byPlan = usable - weightsBytes - drafterBytes - transient.bytes - reserveBytes;
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
