// The CUDA backend's paged-KV ops (Backend.writeKv, attention): the op rules' checks of a KV pool
// pair and a step layout against the tensors (common/op-shapes.ts; poolDims gives them to
// cuda-fused-ops.ts ropeQkvWriteKv), then one KV write kernel or the attention launch plan of
// attention.ts. Separate from cuda-backend.ts because they are the only ops that address the
// paged pools.
import type { AttentionParams, PagedKv, StepLayout, Tensor } from '../../contracts/backend.ts';
import { enqueueAttention } from './attention.ts';
import * as shapes from '../common/op-shapes.ts';
import { type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid, MAX_GRID_Y } from './cuda-op-context.ts';
import { DT_CODE } from './cuda-tensor.ts';
import { ATT_MAX_HEAD_DIM } from './kernels.ts';
import { opError } from './validate.ts';

/** Checks a KV pair of pools (op-shapes.ts kvPools); returns [numBlocks, blockSize, kvHeads, headDim]. */
export function poolDims(c: CudaOpContext, op: string, kv: PagedKv, layout: StepLayout): [number, number, number, number] {
  const { NB, BS, KVH, D } = shapes.kvPools(c.checks, op, kv, layout);
  return [NB, BS, KVH, D];
}

export function writeKv(c: CudaOpContext, kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
  const { kPool: kp, vPool: vp, NB, BS, KVH, D, k: kk, v: vv, slots, T } = shapes.writeKv(c.checks, kv, k, v, layout);
  c.rt.launch('k_write_kv', elementwiseGrid(T * KVH * D), ELEMWISE_THREADS, 0, [
    ['p', kp.addr], ['p', vp.addr], ['i', DT_CODE[kp.dtype]], ['p', kk.addr], ['i', DT_CODE[kk.dtype]], ['p', vv.addr],
    ['i', DT_CODE[vv.dtype]], ['p', slots.addr], ['p', T], ['p', KVH * D], ['p', NB * BS], ['p', c.errWord]]);
}

/** `counters`: the backend's attention.ts ATT_COUNTERS split counters (zero between calls). */
export function attention(c: CudaOpContext, counters: number, q: Tensor, kv: PagedKv, layout: StepLayout,
  params: AttentionParams): Tensor {
  const op = 'attention';
  const {
    kPool: kp, vPool: vp, NB, BS, KVH, D, q: qq, tokenRow: row, tokenPos: pos, blockTables: bt, T, H, R, MBR,
  } = shapes.attention(c.checks, q, kv, layout, params);
  if (D > ATT_MAX_HEAD_DIM) throw opError(op, `head dim ${D} is above the ${ATT_MAX_HEAD_DIM} this kernel handles`);
  if (H > MAX_GRID_Y) throw opError(op, `${H} heads is above ${MAX_GRID_Y}`);
  const { scale, window, softcap } = params;
  const y = c.out(qq.shape);
  // split-KV decode + tensor-core prefill for bf16, k_attention otherwise (see attention.ts; batch-invariant
  // mode: its batchInvariantPlan)
  enqueueAttention(c.rt, c.pool, {
    q: qq.addr, k: kp.addr, v: vp.addr, tokenRow: row.addr, tokenPos: pos.addr, blockTables: bt.addr, out: y.addr,
    err: c.errWord, counters, T, H, KVH, D, numBlocks: NB, blockSize: BS, R, maxBlocksPerRow: MBR, window, scale, softcap,
    qDtype: qq.dtype, poolDtype: kp.dtype, oneTokenPerRow: layout.oneTokenPerRow === true,
  }, c.settings.attention, c.settings.batchInvariant);
  return y;
}
