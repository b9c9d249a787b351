// The CUDA backend's paged-KV ops (Backend.writeKv, attention): the checks of a KV pool pair and
// a step layout against the tensors, then one KV write kernel or the attention launch plan of
// attention.ts. Separate from cuda-backend.ts because they share the pool checks (poolDims, also
// used by cuda-fused-ops.ts ropeQkvWriteKv) and are the only ops that address the paged pools.
import type { AttentionParams, PagedKv, StepLayout, Tensor } from '../../contracts/backend.ts';
import { enqueueAttention } from './attention.ts';
import { ACTS, type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid, FLOAT, I32, MAX_GRID_Y } from './cuda-op-context.ts';
import { type CudaTensor, DT_CODE } from './cuda-tensor.ts';
import { ATT_MAX_HEAD_DIM } from './kernels.ts';
import { attentionParams, describe, expectDim, opError, sameShape } from './validate.ts';

/** Checks a KV pair of pools; returns [numBlocks, blockSize, kvHeads, headDim]. */
export function poolDims(c: CudaOpContext, op: string, kv: PagedKv, layout: StepLayout): [number, number, number, number] {
  const kp = c.arg(op, 'kv.k', kv.k, FLOAT, 4);
  const vp = c.arg(op, 'kv.v', kv.v, FLOAT, 4);
  if (!sameShape(kp.shape, vp.shape) || kp.dtype !== vp.dtype) {
    throw opError(op, `kv.k ${describe(kp)} and kv.v ${describe(vp)} differ`);
  }
  const dims = kp.shape as [number, number, number, number];
  expectDim(op, 'layout.blockSize', layout.blockSize, dims[1], () => `pool ${describe(kp)} is [blocks, blockSize, kvHeads, headDim]`);
  return dims;
}

export function writeKv(c: CudaOpContext, kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
  const op = 'writeKv';
  c.assertOpen(op);
  const [NB, BS, KVH, D] = poolDims(c, op, kv, layout);
  const kk = c.arg(op, 'k', k, ACTS, 3);
  const vv = c.arg(op, 'v', v, ACTS, 3);
  if (!sameShape(kk.shape, vv.shape)) throw opError(op, `k ${describe(kk)} and v ${describe(vv)} differ`);
  const T = kk.shape[0]!;
  if (kk.shape[1] !== KVH || kk.shape[2] !== D) {
    throw opError(op, `k ${describe(kk)} must be [T, ${KVH}, ${D}] to match the pool [${NB}, ${BS}, ${KVH}, ${D}]`);
  }
  const slots = c.arg(op, 'layout.slots', layout.slots, I32, 1);
  expectDim(op, 'layout.slots length', slots.shape[0]!, T, () => `k ${describe(kk)}`);
  const kp = kv.k as CudaTensor;
  const vp = kv.v as CudaTensor;
  c.rt.launch('k_write_kv', elementwiseGrid(T * KVH * D), ELEMWISE_THREADS, 0, [
    ['p', kp.addr], ['p', vp.addr], ['i', DT_CODE[kp.dtype]], ['p', kk.addr], ['i', DT_CODE[kk.dtype]], ['p', vv.addr],
    ['i', DT_CODE[vv.dtype]], ['p', slots.addr], ['p', T], ['p', KVH * D], ['p', NB * BS], ['p', c.errWord]]);
}

/** `counters`: the backend's attention.ts ATT_COUNTERS split counters (zero between calls). */
export function attention(c: CudaOpContext, counters: number, q: Tensor, kv: PagedKv, layout: StepLayout,
  params: AttentionParams): Tensor {
  const op = 'attention';
  c.assertOpen(op);
  const [NB, BS, KVH, D] = poolDims(c, op, kv, layout);
  const qq = c.arg(op, 'q', q, ACTS, 3);
  const [T, H, Dq] = qq.shape as [number, number, number];
  expectDim(op, 'q headDim', Dq, D, () => `pool ${describe(kv.k)}`);
  if (KVH === 0 || H % KVH !== 0) throw opError(op, `q heads ${H} is not a multiple of kv heads ${KVH}`);
  if (D > ATT_MAX_HEAD_DIM) throw opError(op, `head dim ${D} is above the ${ATT_MAX_HEAD_DIM} this kernel handles`);
  if (H > MAX_GRID_Y) throw opError(op, `${H} heads is above ${MAX_GRID_Y}`);
  const row = c.arg(op, 'layout.tokenRow', layout.tokenRow, I32, 1);
  const pos = c.arg(op, 'layout.tokenPos', layout.tokenPos, I32, 1);
  const bt = c.arg(op, 'layout.blockTables', layout.blockTables, I32, 2);
  expectDim(op, 'layout.tokenRow length', row.shape[0]!, T, () => `q ${describe(qq)}`);
  expectDim(op, 'layout.tokenPos length', pos.shape[0]!, T, () => `q ${describe(qq)}`);
  attentionParams(op, params);
  const { scale, window, softcap } = params;
  const [R, MBR] = bt.shape as [number, number];
  const y = c.out(qq.shape);
  const kp = kv.k as CudaTensor;
  const vp = kv.v as CudaTensor;
  // split-KV decode + tensor-core prefill for bf16, k_attention otherwise (see attention.ts)
  enqueueAttention(c.rt, c.pool, {
    q: qq.addr, k: kp.addr, v: vp.addr, tokenRow: row.addr, tokenPos: pos.addr, blockTables: bt.addr, out: y.addr,
    err: c.errWord, counters, T, H, KVH, D, numBlocks: NB, blockSize: BS, R, maxBlocksPerRow: MBR, window, scale, softcap,
    qDtype: qq.dtype, poolDtype: kp.dtype, oneTokenPerRow: layout.oneTokenPerRow === true,
  }, c.settings.attention);
  return y;
}
