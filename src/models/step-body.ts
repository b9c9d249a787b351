// The decoder-only transformer graph of one step, written once for every supported family against
// the Backend interface: the embedding, the layer loop, the final norm of the logit rows, lm_head,
// the logit scale and soft-cap. Family differences arrive as data in ModelConfig (norm placement,
// qk-norm, multipliers, soft-caps, windows, MoE); this file never looks at model_type.
//
// One forward = one flattened step batch: the tokens of every row concatenated ([T]), each row
// at its own positions, KV read and written through the paged cache.

import type { Backend, StepLayout, Tensor } from '../contracts/backend.ts';
import type { KvAccess, RowSpan } from './kv-access.ts';
import { type FusedStream, layer, layerFused } from './layer.ts';
import { norm, type ModelParts } from './model-parts.ts';
import type { RopeTable } from './rope-tables.ts';

/**
 * Hidden states a step hands out beside its logits (an EAGLE-3 head reads the target's): for each
 * entry of `layers`, the residual stream entering that layer (transformers' output_hidden_states[l];
 * 0 is the embedding output), at the step's tokens `tokens`.
 */
export interface HiddenCapture {
  /** layer ids in [0, numLayers), any order, repeats allowed */
  layers: readonly number[];
  /** i32 [P]: indices into the step's tokens */
  tokens: Tensor;
}

/** Enqueues one step from device inputs; returns the logits [pick rows, vocab]. */
export function enqueueStep<Row extends RowSpan>(model: ModelParts, ids: Tensor, layouts: StepLayout[], pick: Tensor,
  ropes: RopeTable[], kv: KvAccess<Row>): Tensor {
  return enqueueForward(model, ids, layouts, pick, ropes, kv).logits;
}

/**
 * enqueueStep, and the hidden states `capture` asks for: hidden[k] is [P, hidden] for
 * capture.layers[k], in the step's scope (taken before the layer's own scope opens).
 */
export function enqueueForward<Row extends RowSpan>(model: ModelParts, ids: Tensor, layouts: StepLayout[], pick: Tensor,
  ropes: RopeTable[], kv: KvAccess<Row>, capture?: HiddenCapture): { logits: Tensor; hidden: Tensor[] } {
  const b = model.backend, c = model.config, fused = model.fused;
  const hidden: Tensor[] = [];
  for (const l of capture?.layers ?? []) {
    if (!Number.isInteger(l) || l < 0 || l >= c.numLayers) throw new Error(`hidden states: layer ${l} is not in [0, ${c.numLayers})`);
  }
  // the stream entering layer l is x, or x + residualScale r while a fused add is still pending
  const take = (l: number, x: Tensor, r?: Tensor) => capture?.layers.forEach((want, k) => {
    if (want !== l) return;
    const at = b.gatherRows(x, capture.tokens);
    hidden[k] = r ? b.add(at, b.gatherRows(r, capture.tokens), c.residualScale) : at;
  });
  let x = b.embedding(model.weights.embed, ids, model.embeddingScale);
  let logits: Tensor;
  if (fused && (c.normPlacement === 'pre' || c.normPlacement === 'pre_post')) {
    // Each residual add runs inside the norm after it: the next layer's input norm, or the
    // final norm after the last layer (row-wise, so norming every token then picking rows is
    // what picking then norming computes), maybe inside the GEMM that reads that norm.
    let s: FusedStream = { x, h: norm(model, x, model.weights.layers[0]?.inputNorm ?? model.weights.finalNorm) };
    for (let l = 0; l < c.numLayers; l++) {
      take(l, s.x, s.r);
      const inputs = streamTensors(s);
      b.beginScope();
      try {
        s = layerFused(model, fused, l, s, layouts[kv.groupIndexOfLayer(l)], ropes[l], kv);
      } finally {
        b.endScope(streamTensors(s));
      }
      freeDeadInputs(b, inputs, streamTensors(s));
    }
    if (s.r && fused.addRmsnormMatmul) {
      const f = fused.addRmsnormMatmul(b.gatherRows(s.x, pick), b.gatherRows(s.r, pick), c.residualScale,
        model.weights.finalNorm, c.rmsNormEps, c.normWeightOffset, model.weights.lmHead);
      logits = f.y;
    } else {
      logits = b.matmul(b.gatherRows(s.h!, pick), model.weights.lmHead);
    }
  } else {
    for (let l = 0; l < c.numLayers; l++) {
      // A scope per layer frees its intermediates (q/k/v, MLP activations) as soon as the next
      // layer is enqueued, so a step's peak is one layer's worth, not all of them.
      take(l, x);
      const input = x;
      b.beginScope();
      try {
        x = layer(model, l, x, layouts[kv.groupIndexOfLayer(l)], ropes[l], kv);
      } finally {
        b.endScope([x]);
      }
      freeDeadInputs(b, [input], [x]);
    }
    logits = b.matmul(b.rmsnorm(b.gatherRows(x, pick), model.weights.finalNorm, c.rmsNormEps, c.normWeightOffset),
      model.weights.lmHead);
  }
  if (c.logitScale !== 1) logits = b.scale(logits, c.logitScale);
  if (c.finalLogitSoftcap > 0) logits = b.softcap(logits, c.finalLogitSoftcap);
  return { logits, hidden };
}

function streamTensors(s: FusedStream): Tensor[] {
  return [s.x, s.r ?? s.h!];
}

/**
 * A layer's inputs are dead once the layer is enqueued (nothing after it reads them): freeing them
 * here, rather than when the step's scope ends, keeps one layer's residual stream live instead of
 * every layer's (on the 8B, 336 MiB of a 512-token chunk). A free waits for the ops enqueued before
 * it, so the layer still reads them. An input the layer passed through unchanged stays.
 */
function freeDeadInputs(b: Backend, inputs: readonly Tensor[], outputs: readonly Tensor[]): void {
  for (const t of inputs) if (!outputs.includes(t)) b.free(t);
}
