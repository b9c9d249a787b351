// The normalised model description: what artifacts/ derives from a Hugging Face config.json and
// what models/ and the planners above read. Families declare capabilities here as data; nothing
// above artifacts/ inspects model_type to decide maths.

import type { Activation } from './backend.ts';

export const SUPPORTED_MODEL_TYPES = [
  'llama', 'mistral', 'qwen2', 'qwen3', 'gemma2', 'gemma3', 'gemma3_text', 'phi3', 'olmo2',
  'granite', 'qwen3_moe', 'mixtral',
] as const;

export type RopeType = 'default' | 'linear' | 'dynamic' | 'yarn' | 'llama3' | 'longrope';

/** One rotary configuration, already resolved from either config style. */
export interface RopeSpec {
  type: RopeType;
  theta: number;
  /** dims rotated per head (head_dim * partial_rotary_factor, even) */
  rotaryDim: number;
  /** scaling factor (linear/dynamic/yarn/llama3/longrope); 1 when absent */
  factor: number;
  /** original_max_position_embeddings where the scaling type uses one */
  originalMaxPositions?: number;
  /** model's max_position_embeddings (dynamic NTK and longrope thresholds) */
  maxPositions: number;
  // llama3
  lowFreqFactor?: number;
  highFreqFactor?: number;
  // yarn
  betaFast?: number;
  betaSlow?: number;
  mscale?: number;
  mscaleAllDim?: number;
  attentionFactor?: number;
  truncate?: boolean;
  // longrope
  shortFactor?: number[];
  longFactor?: number[];
}

export type AttentionKind = 'full' | 'sliding';

export interface LayerSpec {
  attention: AttentionKind;
  /** 0 for full attention; else the window W (a query at p sees keys p-W+1 .. p) */
  window: number;
  rope: RopeSpec;
  mlp: 'dense' | 'moe';
}

export interface MoeSpec {
  numExperts: number;
  topK: number;
  /** renormalise the top-k softmax weights to sum to 1 */
  normTopK: boolean;
  intermediateSize: number;
}

/**
 * Where norms sit in a decoder layer:
 *  'pre'       llama-style: x += attn(norm(x)); x += mlp(norm(x))
 *  'pre_post'  gemma2/3: x += post_attn_norm(attn(input_norm(x))); x += post_ff_norm(mlp(pre_ff_norm(x)))
 *  'post'      olmo2: x += post_attn_norm(attn(x)); x += post_ff_norm(mlp(x))
 */
export type NormPlacement = 'pre' | 'pre_post' | 'post';

/**
 * qk-norm: 'none'; 'head' = RMSNorm over each head's headDim (qwen3, gemma3);
 * 'full' = RMSNorm over the whole projection (numHeads*headDim) before the head split (olmo2).
 */
export type QkNorm = 'none' | 'head' | 'full';

export interface ModelConfig {
  modelType: (typeof SUPPORTED_MODEL_TYPES)[number];
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  /** dense MLP width (0 when every layer is MoE) */
  intermediateSize: number;
  rmsNormEps: number;
  activation: Activation;
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  layers: LayerSpec[];
  moe?: MoeSpec;
  normPlacement: NormPlacement;
  /** gemma stores RMSNorm weights as w - 1: effective weight = weightOffset + w */
  normWeightOffset: number;
  qkNorm: QkNorm;
  /** multiplier on q·k (head_dim^-0.5, gemma query_pre_attn_scalar^-0.5, granite attention_multiplier) */
  attentionScale: number;
  /** 0 = none */
  attnLogitSoftcap: number;
  /** 0 = none */
  finalLogitSoftcap: number;
  /** multiplies the embedding output (gemma sqrt(hidden), granite embedding_multiplier) */
  embeddingScale: number;
  /** multiplies each residual branch before it is added (granite residual_multiplier) */
  residualScale: number;
  /** multiplies the final logits (granite: 1 / logits_scaling) */
  logitScale: number;
  /** phi3 stores qkv_proj and gate_up_proj fused */
  fusedQkv: boolean;
  fusedGateUp: boolean;
  /** prefix in front of "layers.N..." / "embed_tokens" in tensor names, e.g. "model." */
  weightPrefix: string;
  bosTokenId?: number;
  eosTokenIds: number[];
  padTokenId?: number;
  /** q/k/v projections carry a bias (qwen2 always; attention_bias in llama/granite/olmo2/qwen3/gemma) */
  attentionBias: boolean;
  /** o_proj carries a bias (attention_bias families; qwen2 never) */
  attentionOutBias: boolean;
  /** gate/up/down projections carry a bias (llama/granite mlp_bias) */
  mlpBias: boolean;
  /** tensor name of the output projection, read when tieWordEmbeddings is false ("lm_head.weight") */
  lmHeadWeight: string;
  /**
   * gemma: transformers rounds embeddingScale to the embedding table's dtype before multiplying
   * (sqrt(1152) = 33.94 becomes 34.0 in bf16), so a bf16 model must do the same to match it.
   */
  embeddingScaleInWeightDtype: boolean;
  /**
   * When set (phi3 LongRoPE): KV computed while a sequence was at most this long is stale once
   * it grows longer (the rope switches to the long factors); the sequence is recomputed.
   */
  recomputeKvPastLength?: number;
}
