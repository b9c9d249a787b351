// What the decoder's maths reads, gathered once per model: the backend, its fused ops when it has
// them, the normalised config and the weights. The step body (step-body.ts) and a layer's blocks
// (layer.ts, attention-block.ts, mlp-block.ts) are free functions over it; none of them holds
// state, and none looks at model_type: family differences arrive as data in ModelConfig.

import { hasFusedOps, type Backend, type FusedOps, type Tensor } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from '../backends/common/half.ts';
import type { ModelWeights } from './weights.ts';

export interface ModelParts {
  readonly backend: Backend;
  /** the backend's fused ops, when it has them (packed weights were loaded for them) */
  readonly fused: (Backend & FusedOps) | undefined;
  readonly config: ModelConfig;
  readonly weights: ModelWeights;
  /** the embedding multiplier as the model applies it (gemma rounds it to the table's dtype) */
  readonly embeddingScale: number;
}

export function modelParts(backend: Backend, config: ModelConfig, weights: ModelWeights): ModelParts {
  const dt = weights.embed.dtype;
  const embeddingScale = config.embeddingScaleInWeightDtype && (dt === 'bf16' || dt === 'f16')
    ? roundToHalf(config.embeddingScale, dt)
    : config.embeddingScale;
  return { backend, fused: hasFusedOps(backend) ? backend : undefined, config, weights, embeddingScale };
}

/** The model's rmsnorm (its eps and weight offset) with weight w, which the caller's norm placement requires. */
export function norm(model: ModelParts, x: Tensor, w: Tensor | undefined): Tensor {
  if (!w) throw new Error('decoder: a norm weight required by the norm placement is missing');
  return model.backend.rmsnorm(x, w, model.config.rmsNormEps, model.config.normWeightOffset);
}

function roundToHalf(x: number, dtype: 'bf16' | 'f16'): number {
  return dtype === 'bf16' ? bf16ToF32(f32ToBf16(x)) : f16ToF32(f32ToF16(x));
}
