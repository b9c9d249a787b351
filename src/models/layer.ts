// One decoder layer: how its attention and MLP blocks join the residual stream for each norm
// placement ('pre', 'pre_post', 'post'), op by op or with the residual adds fused into the norms
// that follow them.

import type { Backend, FusedOps, StepLayout, Tensor } from '../contracts/backend.ts';
import { attention, attentionFromQ, attentionFromQkv } from './attention-block.ts';
import type { KvAccess, RowSpan } from './kv-access.ts';
import { mlp, mlpFromGateUp } from './mlp-block.ts';
import { norm, type ModelParts } from './model-parts.ts';
import type { RopeTable } from './rope-tables.ts';

/** Layer l over the residual stream x [T, hidden]; returns the new residual stream. */
export function layer(model: ModelParts, l: number, x: Tensor, layout: StepLayout, rope: RopeTable, kv: KvAccess<RowSpan>): Tensor {
  const b = model.backend, c = model.config, w = model.weights.layers[l];
  const rs = c.residualScale;
  switch (c.normPlacement) {
    case 'pre': {
      x = b.add(x, attention(model, l, norm(model, x, w.inputNorm), w, layout, rope, kv), rs);
      return b.add(x, mlp(model, norm(model, x, w.postAttnNorm), w), rs);
    }
    case 'pre_post': {
      const a = norm(model, attention(model, l, norm(model, x, w.inputNorm), w, layout, rope, kv), w.postAttnNorm);
      x = b.add(x, a, rs);
      const m = norm(model, mlp(model, norm(model, x, w.preFfNorm), w), w.postFfNorm);
      return b.add(x, m, rs);
    }
    case 'post': {
      x = b.add(x, norm(model, attention(model, l, x, w, layout, rope, kv), w.postAttnNorm), rs);
      return b.add(x, norm(model, mlp(model, x, w), w.postFfNorm), rs);
    }
  }
}

/**
 * The residual stream between fused layers: x and the next norm of it, either computed (h) or
 * pending (h = norm(x + residualScale r), left to the one GEMM that reads it: a backend with
 * addRmsnormMatmul may fuse that norm into its decode GEMV).
 */
export type FusedStream = { x: Tensor; h: Tensor; r?: undefined } | { x: Tensor; r: Tensor; h?: undefined };

/**
 * A 'pre' or 'pre_post' norm layer with the residual adds fused into the norms that follow them:
 * takes the residual stream (x and its input norm, maybe pending); returns the new stream, whose
 * norm (the next layer's input norm, or the final norm after the last layer) is left pending when
 * the backend fuses norms into GEMMs and the next reader is one GEMM (packed q/k/v, or lm_head).
 * 'pre_post' (gemma2/3) norms each branch's output before its add, as the plain path does.
 */
export function layerFused(model: ModelParts, b: Backend & FusedOps, l: number, s: FusedStream, layout: StepLayout,
  rope: RopeTable, kv: KvAccess<RowSpan>): FusedStream {
  const c = model.config, w = model.weights.layers[l];
  const last = l + 1 >= c.numLayers;
  const next = last ? model.weights.finalNorm : model.weights.layers[l + 1].inputNorm;
  const post = c.normPlacement === 'pre_post';
  const midNorm = post ? w.preFfNorm : w.postAttnNorm;
  if (!midNorm || !next || (s.r && !w.inputNorm)) throw new Error('decoder: a norm weight required by the norm placement is missing');
  const at = attentionOfStream(model, b, l, s, layout, rope, kv);
  const attn = post ? norm(model, at.attn, w.postAttnNorm) : at.attn;
  const { sum, ffn: f } = mlpAfterNorm(model, b, l, at.x, attn, midNorm);
  const ffn = post ? norm(model, f, w.postFfNorm) : f;
  // the next norm's reader: lm_head (one GEMM, step-body.ts) or the next layer's packed q/k/v
  if (b.addRmsnormMatmul && (last || model.weights.layers[l + 1].attn.qkv)) return { x: sum, r: ffn };
  const m = b.addRmsnorm(sum, ffn, c.residualScale, next, c.rmsNormEps, c.normWeightOffset);
  return { x: m.sum, h: m.normed };
}

/**
 * Layer l's attention of the stream: its residual x (the pending add done) and the attention
 * output, through the most fused op the backend has for the input norm and what reads it.
 */
function attentionOfStream(model: ModelParts, b: Backend & FusedOps, l: number, s: FusedStream, layout: StepLayout,
  rope: RopeTable, kv: KvAccess<RowSpan>): { x: Tensor; attn: Tensor } {
  const c = model.config, w = model.weights.layers[l], a = w.attn;
  if (!s.r) return { x: s.x, attn: attention(model, l, s.h, w, layout, rope, kv) };
  const normArgs = [s.x, s.r, c.residualScale, w.inputNorm!, c.rmsNormEps, c.normWeightOffset] as const;
  if (b.addRmsnormQkvRope && a.qkv && !a.qkvBias && c.qkNorm === 'none') {
    // the input norm, the packed q/k/v GEMM, rope and the KV write: a backend may make them one kernel
    const f = b.addRmsnormQkvRope(...normArgs, a.qkv, { heads: c.numHeads, kvHeads: c.numKvHeads, headDim: c.headDim },
      layout.tokenPos, rope.invFreq, rope.attentionScaling, kv.kvOfLayer(l), layout);
    return { x: f.sum, attn: attentionFromQ(model, l, f.q, w, layout, kv) };
  }
  if (b.addRmsnormMatmul && a.qkv) {
    const f = b.addRmsnormMatmul(...normArgs, a.qkv, a.qkvBias);
    return { x: f.sum, attn: attentionFromQkv(model, l, f.y, w, layout, rope, kv) };
  }
  const n = b.addRmsnorm(...normArgs);
  return { x: n.sum, attn: attention(model, l, n.normed, w, layout, rope, kv) };
}

/**
 * Layer l's MLP after the mid norm of x + attn: the new residual and the MLP output, through the
 * most fused op the backend has for the norm and the gate/up GEMM that reads it.
 */
function mlpAfterNorm(model: ModelParts, b: Backend & FusedOps, l: number, x: Tensor, attn: Tensor, midNorm: Tensor):
  { sum: Tensor; ffn: Tensor } {
  const c = model.config, w = model.weights.layers[l], m = w.mlp;
  const normArgs = [x, attn, c.residualScale, midNorm, c.rmsNormEps, c.normWeightOffset] as const;
  if (b.addRmsnormGateUpGlu && m.kind === 'dense' && m.gateUp && !m.gateUpBias) {
    // the mid norm, the packed gate/up GEMM and the GLU: a backend may make them one kernel
    const f = b.addRmsnormGateUpGlu(...normArgs, m.gateUp, c.activation);
    return { sum: f.sum, ffn: b.matmul(f.y, m.down, m.downBias) };
  }
  if (b.addRmsnormMatmul && m.kind === 'dense' && m.gateUp) {
    // the mid norm's only reader is the packed gate/up GEMM: a backend may fuse the two
    const f = b.addRmsnormMatmul(...normArgs, m.gateUp, m.gateUpBias);
    return { sum: f.sum, ffn: mlpFromGateUp(model, f.y, w) };
  }
  const n = b.addRmsnorm(...normArgs);
  return { sum: n.sum, ffn: mlp(model, n.normed, w) };
}
