// Launch logic of the CUDA backend's paged attention: which kernels, their grids, split counts and
// scratch. The kernels and the decode/prefill classification are described in
// attention-kernels.ts; cuda-kv-ops.ts validates the call and hands it here.
//
// CUDA-graph friendly: every launch parameter below is a function of host-known shapes only
// (T, H, KVH, D, R, maxBlocksPerRow, blockSize, window, the SM count), never of the positions in
// tokenPos. A captured decode step replayed while its sequences grow keeps splitting their keys
// evenly, because each decode kernel block derives its token, split and key range from tokenPos
// on the device. The decode kernels always run (a step may hold decode tokens whatever its
// shape); the prefill kernel runs whenever T > ATT_DEC_MAX_RUN (with fewer tokens every run is
// short enough to be decode), unless the layout promises one token a row (StepLayout.oneTokenPerRow).
//
// The plan follows the backend's CudaAttentionSettings: which kernels, the decode grid's aims and
// order, and the tensor-core decode kernel's resident blocks an SM (its __launch_bounds__ minimum
// ATT_TC_MINB: 128 threads of at most 168 registers), the wave its slots fill.
import type { DType } from '../../contracts/backend.ts';
import {
  ATT_BQ, ATT_DEC_INLINE_T, ATT_DEC_MAX_RUN, ATT_FAST_HEAD_DIMS, ATT_MIN_CHUNK, attPfBiSharedBytes, attPfSharedBytes,
} from './attention-kernels.ts';
import { attTcSharedBytes } from './attention-decode-tc.ts';
import type { CudaAttentionSettings } from './cuda-settings.ts';
import { DT_CODE } from './cuda-tensor.ts';
import { ATT_THREADS, type KernelName } from './kernels.ts';
import type { KernelArg } from './runtime.ts';

const MAX_GRID_Y = 65535;
/**
 * Ints in the backend's buffer of split counters (AttentionCall.counters: zeroed once, every
 * counter set back to 0 by the kernel that used it): one per (decode token, kv head) of a call.
 */
export const ATT_COUNTERS = 1 << 20;

/** What the launch code needs of the runtime (CudaRuntime; a simulator in tools). */
export interface AttentionDevice {
  readonly smCount: number;
  launch(name: KernelName, grid: [number, number, number], block: number, shmem: number, args: KernelArg[]): void;
  /** lets `name` launch with up to `bytes` of dynamic shared memory (past the 48 KiB that need no opt-in) */
  allowDynamicShared(name: KernelName, bytes: number): void;
}

/** Stream-ordered scratch memory (DevicePool): released blocks are reused only by later work. */
export interface AttentionScratch {
  alloc(bytes: number): { addr: number };
  release(addr: number, bytes: number): void;
}

/** Shapes of one attention call (validated by the backend). */
export interface AttentionShape {
  /** tokens, query heads, kv heads, head dim */
  T: number;
  H: number;
  KVH: number;
  D: number;
  numBlocks: number;
  blockSize: number;
  /** rows of the block tables, and their width */
  R: number;
  maxBlocksPerRow: number;
  window: number;
  qDtype: DType;
  poolDtype: DType;
  /** StepLayout.oneTokenPerRow: every token is a decode token, so the prefill kernel has nothing to do */
  oneTokenPerRow?: boolean;
}

/** Device addresses and scalars of one call. */
export interface AttentionCall extends AttentionShape {
  q: number;
  k: number;
  v: number;
  tokenRow: number;
  tokenPos: number;
  blockTables: number;
  out: number;
  /** the backend's error word (int[4]) */
  err: number;
  /** ATT_COUNTERS zeroed ints that the tensor-core decode kernel merges its splits with (AttentionPlan.fusedCombine) */
  counters?: number;
  scale: number;
  softcap: number;
}

export interface AttentionPlan {
  path: 'fast' | 'generic';
  /** fast path: the decode kernel, its query heads per block and blocks per kv head */
  decodeKernel?: KernelName;
  /** the decode kernel is the tensor-core one (it takes the split counters as a last argument) */
  tensorCores?: boolean;
  /** the tensor-core decode grid is (KVH, W), kv heads first (CudaAttentionSettings.tcGrid), not (W, KVH) */
  headsFirst?: boolean;
  /** the decode kernel's dynamic shared memory (the tensor-core kernel's ring of tiles, attTcSharedBytes) */
  decodeSharedBytes: number;
  headChunk?: number;
  headChunks?: number;
  /** decode slots (grid x of the decode kernel): the decode tokens share them on the device */
  slots: number;
  /** T > ATT_DEC_INLINE_T: k_attn_plan lists the decode tokens first (not with identityList) */
  planKernel: boolean;
  /**
   * the tensor-core decode kernel takes every token as a decode token, in order (planReady 2): the
   * layout promises one token a row, so no list is made, by k_attn_plan or inline from tokenRow
   */
  identityList: boolean;
  /**
   * rows of the split partials (f32 [rows, H, D] and [rows, H, 2]): the slots, or in
   * batch-invariant mode every split a decode token may have (batchInvariantPlan)
   */
  partRows: number;
  /** slots >= 2: some token may be split, k_attn_combine merges the splits */
  combine: boolean;
  /** slots >= 2 on the tensor-core decode kernel: the last split of a token merges them itself */
  fusedCombine: boolean;
  /** T > ATT_DEC_MAX_RUN: some token may be a prefill token */
  prefillKernel?: KernelName;
  prefillTiles: number;
  /** the prefill kernel's dynamic shared memory (its ring of key / value tiles, attPfSharedBytes) */
  prefillSharedBytes: number;
}

/**
 * Slots of the tensor-core decode kernel for T tokens (all of them decode tokens, as in a decode
 * step): T x s, s splits per token, s the fewest that fill the resident blocks' waves to 90% (the
 * kernel's blocks are alike, so a partly filled last wave costs a whole block's time, and every
 * split costs a partial to merge). Many tokens: one slot each. Measured on the H200 (8B shapes,
 * BENCHMARKS.md): at 1 and 8 rows one full wave beat two or more; at 32 rows, 3 splits (two full
 * waves) beat 1 (0.65 of a wave) by 1.45x at 16k context. Capped at 8 waves of slots: a prefill
 * step's T counts its prompt tokens too, whose slots have nothing to do.
 */
export function tcDecodeSlots(T: number, KVH: number, maxSplits: number, smCount: number, resident: number): number {
  const cap = smCount * resident;
  const items = T * KVH;
  let s = 1;
  if (items < 2 * cap) {
    const most = Math.max(1, Math.min(maxSplits, Math.ceil((2 * cap) / items)));
    for (s = 1; s < most; s++) {
      const waves = (items * s) / cap;
      if (waves / Math.ceil(waves) >= 0.9) break;
    }
  }
  return Math.max(1, Math.min(T * s, 8 * Math.ceil(cap / KVH)));
}

/**
 * The most splits a token of a call gets in batch-invariant mode (the kernels' att_bi_max_splits):
 * the keys a query may see (the table's capacity, or the window) over `chunk`
 * (CudaAttentionSettings.invariantChunk), one more for a window whose start is not at a multiple.
 */
export function attBiMaxSplits(maxBlocksPerRow: number, blockSize: number, window: number, chunk: number): number {
  const keys = maxBlocksPerRow * blockSize;
  const all = keys > 0 ? Math.ceil(keys / chunk) : 1;
  return window > 0 ? Math.min(all, Math.ceil(window / chunk) + 1) : all;
}

/**
 * The splits of a token whose keys are [start, start + len) in batch-invariant mode (the kernels'
 * att_bi_splits): the multiples of `chunk` its key positions cross, and one; a function of its
 * position and window alone.
 */
export function attBiSplits(start: number, len: number, chunk: number): number {
  return len > 0 ? Math.floor((start + len - 1) / chunk) - Math.floor(start / chunk) + 1 : 1;
}

/**
 * Batch-invariant mode's work items on the tensor-core pair (none: the generic kernel runs): the
 * decode tokens a call may have (runs of at most ATT_DEC_MAX_RUN tokens of a row; the kernel runs
 * any past these unsplit, a layout whose rows come in several runs, never the engine's), each with
 * every split its position may have.
 */
function batchInvariantItems(s: AttentionShape, a: CudaAttentionSettings) {
  const G = s.H / s.KVH;
  if (a.mode !== 'auto' || s.qDtype !== 'bf16' || s.poolDtype !== 'bf16' || (s.D !== 64 && s.D !== 128) || G > 16) return undefined;
  const oneToken = !!s.oneTokenPerRow && a.oneTokenHint;
  const decodeTokens = oneToken ? s.T : Math.min(s.T, ATT_DEC_MAX_RUN * s.R);
  const nsMax = attBiMaxSplits(s.maxBlocksPerRow, s.blockSize, s.window, a.invariantChunk);
  return { G, oneToken, decodeTokens, nsMax, items: decodeTokens * nsMax };
}

/**
 * Device scratch a call takes for its split partials in batch-invariant mode (f32 [items, H, D] and
 * [items, H, 2]; attention()'s scratch): what the fit planner's dry run counts for it. The default
 * mode's partials are bounded by the device's resident blocks instead (a few MB).
 */
export function batchInvariantPartialBytes(s: AttentionShape, a: CudaAttentionSettings): number {
  const bi = batchInvariantItems(s, a);
  return bi && bi.nsMax > 1 ? bi.items * s.H * (s.D + 2) * 4 : 0;
}

/**
 * The plan in batch-invariant mode (CudaSettings.batchInvariant): every kernel and the way each
 * token's keys are summed follow from the model's shapes and the token's own position, never from
 * how many rows or tokens share the call. Head dims 64 / 128 with GQA groups of up to 16 (bf16):
 * the tensor-core decode kernel with splits at multiples of invariantChunk key positions, and for
 * prefill tokens k_attn_prefill_bi_d<D>, which sums a query exactly as that kernel does, so a prompt
 * token comes out the same whatever its chunk. Every other shape: the generic kernel for every
 * token (one block a token and head, its keys in fixed order from the token's own window start).
 * The slots (grid) may follow the shapes as they like: they change who computes an item, not how.
 */
function batchInvariantPlan(s: AttentionShape, smCount: number, a: CudaAttentionSettings): AttentionPlan {
  const generic: AttentionPlan = {
    path: 'generic', slots: 0, partRows: 0, planKernel: false, identityList: false, combine: false, fusedCombine: false,
    prefillTiles: 0, decodeSharedBytes: 0, prefillSharedBytes: 0,
  };
  const bi = batchInvariantItems(s, a);
  if (!bi) return generic;
  const { G, oneToken, decodeTokens, nsMax, items } = bi;
  const tiles = Math.ceil(s.T / ATT_BQ);
  if (tiles > MAX_GRID_Y || s.T * s.KVH > ATT_COUNTERS || items > 2 ** 31 - 1) {
    throw new Error(`attention: ${s.T} tokens (${decodeTokens} decode tokens of up to ${nsMax} splits) are more than batch-invariant ` +
      `mode's kernels take (${MAX_GRID_Y * ATT_BQ} tokens, ${ATT_COUNTERS} tokens x kv heads)`);
  }
  const slots = Math.max(1, Math.min(items, 8 * Math.ceil((smCount * a.tcResident) / s.KVH)));
  const prefill = s.T > ATT_DEC_MAX_RUN && !oneToken;
  return {
    path: 'fast',
    decodeKernel: `k_attn_decode_tc_d${s.D}` as KernelName,
    tensorCores: true,
    headsFirst: a.tcGrid === 'heads-first',
    decodeSharedBytes: attTcSharedBytes(s.D, a.tcStages),
    headChunk: G,
    headChunks: 1,
    slots,
    partRows: nsMax > 1 ? items : 0,
    planKernel: s.T > ATT_DEC_INLINE_T && !oneToken,
    identityList: oneToken,
    combine: false,
    fusedCombine: nsMax > 1,
    prefillKernel: prefill ? `k_attn_prefill_bi_d${s.D}` as KernelName : undefined,
    prefillTiles: prefill ? tiles : 0,
    prefillSharedBytes: prefill ? attPfBiSharedBytes(s.D, a.pfStages) : 0,
  };
}

/**
 * The launch plan of a call under `a` (batch-invariant mode: batchInvariantPlan): a function of
 * shapes only (see the top of this file).
 */
export function planAttention(s: AttentionShape, smCount: number, a: CudaAttentionSettings, batchInvariant = false): AttentionPlan {
  if (batchInvariant) return batchInvariantPlan(s, smCount, a);
  const tiles = Math.ceil(s.T / ATT_BQ);
  const fast = a.mode === 'auto' && s.qDtype === 'bf16' && s.poolDtype === 'bf16' &&
    (ATT_FAST_HEAD_DIMS as readonly number[]).includes(s.D) && tiles <= MAX_GRID_Y;
  if (!fast) {
    return {
      path: 'generic', slots: 0, partRows: 0, planKernel: false, identityList: false, combine: false, fusedCombine: false,
      prefillTiles: 0, decodeSharedBytes: 0, prefillSharedBytes: 0,
    };
  }
  const G = s.H / s.KVH;
  // the tensor-core kernel merges its splits itself (its splits differ from k_attn_combine's)
  const tc = a.decodeKernel === 'tc' && (s.D === 64 || s.D === 128) && G <= 16 && s.T * s.KVH <= ATT_COUNTERS;
  // the CUDA-core decode kernels are instantiated for 4 and 8 heads per block; the tensor-core one
  // takes the whole group
  const headChunk = tc ? G : G <= 4 ? 4 : 8;
  const headChunks = Math.ceil(G / headChunk);
  // most keys a query can see: the table's capacity, or the window
  const maxKeys = Math.max(1, s.window > 0 ? Math.min(s.window, s.maxBlocksPerRow * s.blockSize)
    : s.maxBlocksPerRow * s.blockSize);
  const maxSplits = Math.ceil(maxKeys / (tc ? a.tcMinChunk : ATT_MIN_CHUNK));
  const slots = tc ? tcDecodeSlots(s.T, s.KVH, maxSplits, smCount, a.tcResident)
    : Math.max(1, Math.min(Math.ceil((smCount * a.decodeBlocksPerSm) / (s.KVH * headChunks)), s.T * maxSplits));
  // a decode graph's layout promises one token a row: the prefill kernel's blocks would all exit
  // (at 16 rows on the H200, 4.3 us a layer of an 8B step's 203 us; oneTokenHint off launches it
  // anyway, for A/B runs)
  const oneToken = !!s.oneTokenPerRow && a.oneTokenHint;
  const prefill = s.T > ATT_DEC_MAX_RUN && !oneToken;
  const fused = tc && slots >= 2;
  const identityList = tc && oneToken;
  return {
    path: 'fast',
    decodeKernel: (tc ? `k_attn_decode_tc_d${s.D}` : `k_attn_decode_d${s.D}_g${headChunk}`) as KernelName,
    tensorCores: tc,
    headsFirst: tc && a.tcGrid === 'heads-first',
    decodeSharedBytes: tc ? attTcSharedBytes(s.D, a.tcStages) : 0,
    headChunk,
    headChunks,
    slots,
    partRows: slots >= 2 ? slots : 0,
    planKernel: s.T > ATT_DEC_INLINE_T && !identityList,
    identityList,
    combine: slots >= 2 && !fused,
    fusedCombine: fused,
    prefillKernel: prefill ? `k_attn_prefill_d${s.D}` as KernelName : undefined,
    prefillTiles: prefill ? tiles : 0,
    prefillSharedBytes: prefill ? attPfSharedBytes(s.D, a.pfStages) : 0,
  };
}

/** The decode kernel's grid: W slots by the kv heads' chunks (the tensor-core kernel: its plan's headsFirst order). */
export function decodeGrid(p: AttentionPlan, W: number, KVH: number): [number, number, number] {
  const heads = KVH * p.headChunks!;
  return p.headsFirst ? [heads, W, 1] : [W, heads, 1];
}

/** Enqueues attention (output to call.out, bf16 [T, H, D]) as `a` (and batch-invariant mode) plans it. */
export function enqueueAttention(dev: AttentionDevice, scratch: AttentionScratch, c: AttentionCall, a: CudaAttentionSettings,
  batchInvariant = false): void {
  if (c.T === 0 || c.H === 0) return;
  const p = planAttention(c, dev.smCount, a, batchInvariant);
  if (p.path === 'generic') {
    dev.launch('k_attention', [c.T, c.H, 1], ATT_THREADS, (c.D + 2 * ATT_THREADS + 32) * 4, [
      ['p', c.q], ['i', DT_CODE[c.qDtype]], ['p', c.k], ['p', c.v], ['i', DT_CODE[c.poolDtype]],
      ['p', c.tokenRow], ['p', c.tokenPos], ['p', c.blockTables], ['p', c.out], ['i', c.T], ['i', c.H], ['i', c.KVH],
      ['i', c.D], ['i', c.numBlocks], ['i', c.blockSize], ['i', c.R], ['i', c.maxBlocksPerRow], ['i', c.window],
      ['f', c.scale], ['f', c.softcap], ['p', c.err]]);
    return;
  }
  const W = p.slots;
  const planBytes = (c.T + 1) * 4;
  const partBytes = p.partRows * c.H * c.D * 4;
  const mlBytes = p.partRows * c.H * 2 * 4;
  if (p.fusedCombine && c.counters === undefined) throw new Error('attention: the tensor-core decode kernel needs the split counters');
  const plan = scratch.alloc(planBytes).addr;
  const part = partBytes ? scratch.alloc(partBytes).addr : 0;
  const partml = mlBytes ? scratch.alloc(mlBytes).addr : 0;
  try {
    if (p.planKernel) dev.launch('k_attn_plan', [1, 1, 1], 1024, 0, [['p', c.tokenRow], ['i', c.T], ['p', plan]]);
    if (p.decodeSharedBytes > 48 * 1024) dev.allowDynamicShared(p.decodeKernel!, p.decodeSharedBytes);
    dev.launch(p.decodeKernel!, decodeGrid(p, W, c.KVH), 128, p.decodeSharedBytes, [
      ['p', c.q], ['p', c.k], ['p', c.v], ['p', c.tokenRow], ['p', c.tokenPos], ['p', c.blockTables], ['p', plan],
      ['i', p.planKernel ? 1 : p.identityList ? 2 : 0], ['p', c.out], ['p', part], ['p', partml], ['i', c.T], ['i', c.H], ['i', c.KVH],
      ['i', c.numBlocks], ['i', c.blockSize], ['i', c.R], ['i', c.maxBlocksPerRow], ['i', c.window], ['f', c.scale],
      ['f', c.softcap], ['i', W], ['p', c.err],
      ...(p.tensorCores ? [['p', p.fusedCombine ? c.counters! : 0] as KernelArg] : [])]);
    if (p.combine) {
      dev.launch('k_attn_combine', [Math.ceil(W / 2), c.H, 1], 128, 0, [
        ['p', c.tokenRow], ['p', c.tokenPos], ['p', plan], ['p', part], ['p', partml], ['p', c.out], ['i', c.T],
        ['i', c.H], ['i', c.D], ['i', c.R], ['i', c.window], ['i', W]]);
    }
    if (p.prefillKernel) {
      if (p.prefillSharedBytes > 48 * 1024) dev.allowDynamicShared(p.prefillKernel, p.prefillSharedBytes);
      dev.launch(p.prefillKernel, [c.H, p.prefillTiles, 1], 128, p.prefillSharedBytes, [
        ['p', c.q], ['p', c.k], ['p', c.v], ['p', c.tokenRow], ['p', c.tokenPos], ['p', c.blockTables], ['p', c.out],
        ['i', c.T], ['i', c.H], ['i', c.KVH], ['i', c.numBlocks], ['i', c.blockSize], ['i', c.R],
        ['i', c.maxBlocksPerRow], ['i', c.window], ['f', c.scale], ['f', c.softcap], ['p', c.err]]);
    }
  } finally {
    // stream order: the kernels enqueued above run before any later user of these blocks
    scratch.release(plan, planBytes);
    if (part) scratch.release(part, partBytes);
    if (partml) scratch.release(partml, mlBytes);
  }
}
