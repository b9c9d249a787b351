// The context length a model is built for, derived as vLLM does: max_position_embeddings, times
// the rope scaling factor for rope types whose max_position_embeddings is the pre-scaling length
// (linear, dynamic; yarn counts from original_max_position_embeddings). llama3 and longrope
// configs already state the extended length.

import type { ModelConfig } from '../contracts/model-config.ts';

export function derivedContextLength(cfg: ModelConfig): number {
  let best = cfg.maxPositionEmbeddings;
  for (const layer of cfg.layers) {
    const r = layer.rope;
    if (r.factor <= 1 || r.type === 'llama3' || r.type === 'longrope' || r.type === 'default') continue;
    const base = r.type === 'yarn' && r.originalMaxPositions ? r.originalMaxPositions : cfg.maxPositionEmbeddings;
    best = Math.max(best, Math.floor(base * r.factor));
  }
  return best;
}
