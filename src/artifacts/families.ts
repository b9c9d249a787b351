// Per-family facts from transformers 5.x: the defaults of each configuration_*.py dataclass
// (used when config.json omits a field) and the architectural traits of each modeling_*.py.
// Everything family-specific that is plain data lives here; config.ts holds the logic.

import type { NormPlacement, QkNorm, SUPPORTED_MODEL_TYPES } from '../contracts/model-config.ts';

export type ModelType = (typeof SUPPORTED_MODEL_TYPES)[number];

/**
 * How a family decides which layers use a sliding window:
 *  none        never (llama, granite, olmo2 ignore sliding_window and layer_types)
 *  all         every layer when sliding_window is non-null (mistral, mixtral, phi3)
 *  all_if_used every layer when use_sliding_window (qwen3_moe)
 *  qwen        layer_types, else layers >= max_window_layers when use_sliding_window (qwen2, qwen3)
 *  alternate   layer_types, else even layers (gemma2: (i + 1) % 2 != 0)
 *  pattern     layer_types, else every layer but each sliding_window_pattern-th (gemma3)
 */
export type WindowRule = 'none' | 'all' | 'all_if_used' | 'qwen' | 'alternate' | 'pattern';

export interface Family {
  rmsNormEps: number;
  /** num_key_value_heads when absent: a number, or 'heads' (= num_attention_heads) */
  kvHeads: number | 'heads';
  /** head_dim when absent: a number (qwen3 128, gemma 256) or 'derived' = hidden / heads */
  headDim: number | 'derived';
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  /** rope_theta when absent (gemma3's sliding layers: rope_local_base_freq, see rope-config.ts) */
  ropeTheta: number;
  /** config key naming the MLP activation; gemma reads hidden_activation, ignoring hidden_act */
  activationKey: 'hidden_act' | 'hidden_activation';
  activation: string;
  bosTokenId?: number;
  eosTokenId?: number;
  padTokenId?: number;
  windowRule: WindowRule;
  /** sliding_window when the key is absent */
  slidingWindow?: number;
  normPlacement: NormPlacement;
  normWeightOffset: number;
  qkNorm: QkNorm;
  /** 'qkv' = q/k/v always biased, o never (qwen2); 'config' = attention_bias on all four; 'none' */
  attentionBias: 'qkv' | 'config' | 'none';
  /** mlp_bias is read from the config (llama, granite) */
  mlpBiasFromConfig: boolean;
  /** partial_rotary_factor is honoured (phi3 only: the others rotate the whole head) */
  partialRotary: boolean;
  fusedQkv: boolean;
  fusedGateUp: boolean;
}

const llamaLike: Family = {
  rmsNormEps: 1e-6,
  kvHeads: 'heads',
  headDim: 'derived',
  tieWordEmbeddings: false,
  maxPositionEmbeddings: 2048,
  ropeTheta: 10_000,
  activationKey: 'hidden_act',
  activation: 'silu',
  windowRule: 'none',
  normPlacement: 'pre',
  normWeightOffset: 0,
  qkNorm: 'none',
  attentionBias: 'config',
  mlpBiasFromConfig: false,
  partialRotary: false,
  fusedQkv: false,
  fusedGateUp: false,
};

const gemma: Family = {
  ...llamaLike,
  kvHeads: 4,
  headDim: 256,
  tieWordEmbeddings: true,
  activationKey: 'hidden_activation',
  activation: 'gelu_pytorch_tanh',
  bosTokenId: 2,
  eosTokenId: 1,
  padTokenId: 0,
  slidingWindow: 4096,
  normPlacement: 'pre_post',
  normWeightOffset: 1,
};

export const FAMILIES: Record<ModelType, Family> = {
  llama: { ...llamaLike, bosTokenId: 1, eosTokenId: 2, mlpBiasFromConfig: true },
  granite: { ...llamaLike, bosTokenId: 1, eosTokenId: 2, mlpBiasFromConfig: true },
  mistral: {
    ...llamaLike,
    kvHeads: 8,
    maxPositionEmbeddings: 4096 * 32,
    bosTokenId: 1,
    eosTokenId: 2,
    windowRule: 'all',
    slidingWindow: 4096,
    attentionBias: 'none',
  },
  mixtral: {
    ...llamaLike,
    rmsNormEps: 1e-5,
    kvHeads: 8,
    maxPositionEmbeddings: 4096 * 32,
    ropeTheta: 1_000_000,
    bosTokenId: 1,
    eosTokenId: 2,
    windowRule: 'all',
    attentionBias: 'none',
  },
  qwen2: {
    ...llamaLike,
    kvHeads: 32,
    maxPositionEmbeddings: 32768,
    windowRule: 'qwen',
    slidingWindow: 4096,
    attentionBias: 'qkv',
  },
  qwen3: {
    ...llamaLike,
    kvHeads: 32,
    headDim: 128,
    maxPositionEmbeddings: 32768,
    windowRule: 'qwen',
    slidingWindow: 4096,
    qkNorm: 'head',
  },
  qwen3_moe: {
    ...llamaLike,
    kvHeads: 4,
    maxPositionEmbeddings: 32768,
    windowRule: 'all_if_used',
    slidingWindow: 4096,
    qkNorm: 'head',
  },
  phi3: {
    ...llamaLike,
    rmsNormEps: 1e-5,
    maxPositionEmbeddings: 4096,
    bosTokenId: 1,
    eosTokenId: 32000,
    padTokenId: 32000,
    windowRule: 'all',
    attentionBias: 'none',
    partialRotary: true,
    fusedQkv: true,
    fusedGateUp: true,
  },
  olmo2: {
    ...llamaLike,
    rmsNormEps: 1e-5,
    eosTokenId: 50279,
    padTokenId: 1,
    normPlacement: 'post',
    qkNorm: 'full',
  },
  gemma2: { ...gemma, maxPositionEmbeddings: 8192, windowRule: 'alternate' },
  gemma3_text: { ...gemma, maxPositionEmbeddings: 131_072, windowRule: 'pattern', qkNorm: 'head' },
  gemma3: { ...gemma, maxPositionEmbeddings: 131_072, windowRule: 'pattern', qkNorm: 'head' },
};
