// A layer's feed-forward block: a dense GLU (gate and up as one packed GEMM with fused ops) or a
// routed mixture of experts.

import type { Tensor } from '../contracts/backend.ts';
import type { ModelParts } from './model-parts.ts';
import type { LayerWeights } from './weights.ts';

/** The MLP over the normed input h [T, hidden]; returns its output [T, hidden]. */
export function mlp(model: ModelParts, h: Tensor, w: LayerWeights): Tensor {
  const b = model.backend, c = model.config, m = w.mlp;
  if (m.kind === 'dense' && model.fused && m.gateUp) return mlpFromGateUp(model, b.matmul(h, m.gateUp, m.gateUpBias), w);
  if (m.kind === 'dense') {
    const g = b.matmul(h, m.gate, m.gateBias);
    const u = b.matmul(h, m.up, m.upBias);
    return b.matmul(b.glu(g, u, c.activation), m.down, m.downBias);
  }
  const routing = b.moeRoute(b.matmul(h, m.router), c.moe!.topK, c.moe!.normTopK);
  return b.moeFfn(h, routing, m.gate, m.up, m.down, c.activation);
}

/** A dense MLP with packed gate/up rows, from that GEMM's output gu [T, 2 intermediate]. */
export function mlpFromGateUp(model: ModelParts, gu: Tensor, w: LayerWeights): Tensor {
  const b = model.backend, c = model.config, m = w.mlp;
  if (m.kind !== 'dense' || !model.fused) throw new Error('mlpFromGateUp: the MLP is not a dense one with packed gate/up');
  if (b.gluMatmul) return b.gluMatmul(gu, c.activation, m.down, m.downBias);
  return b.matmul(model.fused.gluPacked(gu, c.activation), m.down, m.downBias);
}
