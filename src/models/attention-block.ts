// A layer's attention block: q/k/v projections, qk-norm, rope, the paged KV write, attention over
// the paged KV and the output projection. With fused ops and packed q/k/v, one GEMM and one
// norm + rope + KV-write pass replace the separate ops.

import type { StepLayout, Tensor } from '../contracts/backend.ts';
import type { KvAccess, RowSpan } from './kv-access.ts';
import { norm, type ModelParts } from './model-parts.ts';
import type { RopeTable } from './rope-tables.ts';
import type { AttentionWeights, LayerWeights } from './weights.ts';

/** Attention of layer l over the normed input h [T, hidden]; returns its output [T, hidden]. */
export function attention(model: ModelParts, l: number, h: Tensor, w: LayerWeights, layout: StepLayout, rope: RopeTable,
  kv: KvAccess<RowSpan>): Tensor {
  const b = model.backend, c = model.config, a: AttentionWeights = w.attn;
  const T = h.shape[0];
  const paged = kv.kvOfLayer(l);
  const params = { scale: c.attentionScale, window: c.layers[l].window, softcap: c.attnLogitSoftcap };
  // one GEMM for q/k/v; norm, rope and the KV write in one pass over its output
  if (model.fused && a.qkv) return attentionFromQkv(model, l, b.matmul(h, a.qkv, a.qkvBias), w, layout, rope, kv);
  let q = b.matmul(h, a.q, a.qBias);
  let k = b.matmul(h, a.k, a.kBias);
  const v = b.matmul(h, a.v, a.vBias);
  if (c.qkNorm === 'full') {
    q = norm(model, q, a.qNorm);
    k = norm(model, k, a.kNorm);
  }
  q = b.reshape(q, [T, c.numHeads, c.headDim]);
  k = b.reshape(k, [T, c.numKvHeads, c.headDim]);
  if (c.qkNorm === 'head') {
    q = norm(model, q, a.qNorm);
    k = norm(model, k, a.kNorm);
  }
  q = b.rope(q, layout.tokenPos, rope.invFreq, rope.attentionScaling);
  k = b.rope(k, layout.tokenPos, rope.invFreq, rope.attentionScaling);
  b.writeKv(paged, k, b.reshape(v, [T, c.numKvHeads, c.headDim]), layout);
  const o = b.attention(q, paged, layout, params);
  return b.matmul(b.reshape(o, [T, c.numHeads * c.headDim]), a.o, a.oBias);
}

/**
 * The rest of a fused attention block with packed q/k/v, from that GEMM's output qkv
 * [T, (H + 2 KVH) * D] (which the caller may have fused with the norm before it).
 */
export function attentionFromQkv(model: ModelParts, l: number, qkv: Tensor, w: LayerWeights, layout: StepLayout,
  rope: RopeTable, kv: KvAccess<RowSpan>): Tensor {
  const c = model.config, a: AttentionWeights = w.attn;
  if (!model.fused) throw new Error('attentionFromQkv: the backend has no fused ops');
  const paged = kv.kvOfLayer(l);
  const qkNorm = c.qkNorm === 'head' ? { q: a.qNorm!, k: a.kNorm!, eps: c.rmsNormEps, weightOffset: c.normWeightOffset } : undefined;
  const q = model.fused.ropeQkvWriteKv(qkv, { heads: c.numHeads, kvHeads: c.numKvHeads, headDim: c.headDim },
    layout.tokenPos, rope.invFreq, rope.attentionScaling, qkNorm, paged, layout);
  return attentionFromQ(model, l, q, w, layout, kv);
}

/** The rest of an attention block from its roped q [T, H, D] (its k and v already in the pool). */
export function attentionFromQ(model: ModelParts, l: number, q: Tensor, w: LayerWeights, layout: StepLayout,
  kv: KvAccess<RowSpan>): Tensor {
  const b = model.backend, c = model.config;
  const params = { scale: c.attentionScale, window: c.layers[l].window, softcap: c.attnLogitSoftcap };
  const o = b.attention(q, kv.kvOfLayer(l), layout, params);
  return b.matmul(b.reshape(o, [q.shape[0], c.numHeads * c.headDim]), w.attn.o, w.attn.oBias);
}
