// config.json -> ModelConfig: the one place that knows how each family's Hugging Face config
// maps onto the normalised description the model graphs and planners read. Maths and defaults
// follow transformers 5.x (configuration_*.py / modeling_*.py of each family).

import type { Activation } from '../contracts/backend.ts';
import { SUPPORTED_MODEL_TYPES, type LayerSpec, type ModelConfig, type MoeSpec } from '../contracts/model-config.ts';
import { ArtifactError } from './errors.ts';
import { FAMILIES, type Family, type ModelType } from './families.ts';
import { layerKinds } from './layer-types.ts';
import { resolveRope } from './rope-config.ts';

export interface NormalizeOptions {
  /** file name for messages (default "config.json") */
  file?: string;
  /** eos ids from generation_config.json, merged with the config's */
  generationEosIds?: readonly number[];
  /**
   * Probes the checkpoint for a tensor name. Used to pick the tensor prefix where checkpoints of
   * one family differ (gemma3: "language_model.model." or "model.language_model."; others:
   * "model." or none). Without it the first, most common layout is assumed.
   */
  hasTensor?: (name: string) => boolean;
}

type Dict = Record<string, any>;

export function normalizeConfig(raw: unknown, opts: NormalizeOptions = {}): ModelConfig {
  const file = opts.file ?? 'config.json';
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ArtifactError(`${file} must hold a JSON object`, file);
  }
  const top = raw as Dict;
  const modelType = top.model_type;
  if (!(SUPPORTED_MODEL_TYPES as readonly string[]).includes(modelType)) {
    const got = modelType === undefined ? 'no model_type' : `model_type "${modelType}"`;
    throw new ArtifactError(
      `${file} has ${got}; supported model types: ${SUPPORTED_MODEL_TYPES.join(', ')}`,
      file,
    );
  }
  const mt = modelType as ModelType;
  const family = FAMILIES[mt];
  // gemma3 (multimodal) keeps the language model's settings in text_config
  const isWrapper = mt === 'gemma3';
  const c: Dict = isWrapper ? (isObject(top.text_config) ? top.text_config : {}) : top;
  const prefix = isWrapper ? 'text_config.' : '';
  const where = isWrapper ? `${file} (text_config)` : file;

  const need = (key: string): number => {
    const v = c[key];
    if (v === undefined || v === null) throw new ArtifactError(`${file} is missing required field "${prefix}${key}"`, file);
    return positiveInt(v, prefix + key, file);
  };
  const num = (key: string, dflt: number): number => {
    const v = c[key];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'number' || !Number.isFinite(v)) {
      throw new ArtifactError(`${file} field "${prefix}${key}" must be a number, got ${JSON.stringify(v)}`, file);
    }
    return v;
  };

  if (c.use_bidirectional_attention) {
    throw new ArtifactError(`${file}: use_bidirectional_attention (encoder-style gemma) is not supported`, file);
  }

  const vocabSize = need('vocab_size');
  const hiddenSize = need('hidden_size');
  const numLayers = need('num_hidden_layers');
  const numHeads = need('num_attention_heads');
  const kvDefault = family.kvHeads === 'heads' ? numHeads : family.kvHeads;
  // explicit null means "same as num_attention_heads" (the configs' __post_init__)
  const numKvHeads = c.num_key_value_heads === null
    ? numHeads
    : positiveInt(num('num_key_value_heads', kvDefault), prefix + 'num_key_value_heads', file);
  if (numHeads % numKvHeads !== 0) {
    throw new ArtifactError(`${file}: num_attention_heads (${numHeads}) is not a multiple of num_key_value_heads (${numKvHeads})`, file);
  }
  const derivedHeadDim = Math.floor(hiddenSize / numHeads);
  const headDim = positiveInt(
    c.head_dim ?? (family.headDim === 'derived' ? derivedHeadDim : family.headDim),
    prefix + 'head_dim', file,
  );
  const maxPositionEmbeddings = positiveInt(num('max_position_embeddings', family.maxPositionEmbeddings), prefix + 'max_position_embeddings', file);

  const ropes = resolveRope({ modelType: mt, family, config: c, headDim, maxPositions: maxPositionEmbeddings, where, file });
  const kinds = layerKinds(c, family, mt, numLayers, file);
  const { moe, moeLayer } = moeOf(mt, c, need, num, file);
  const layers: LayerSpec[] = kinds.map((k, i) => ({
    attention: k.window > 0 ? 'sliding' : 'full',
    window: k.window,
    rope: ropes[k.type],
    mlp: moeLayer(i) ? 'moe' : 'dense',
  }));
  const anyDense = layers.some((l) => l.mlp === 'dense');

  const gemmaLike = family.normWeightOffset === 1;
  const granite = mt === 'granite';
  const names = weightNames(mt, opts.hasTensor);
  const attentionBias = family.attentionBias === 'qkv' || (family.attentionBias === 'config' && !!c.attention_bias);

  return {
    modelType: mt,
    vocabSize,
    hiddenSize,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize: anyDense ? need('intermediate_size') : 0,
    rmsNormEps: num('rms_norm_eps', family.rmsNormEps),
    activation: activationOf(c, family, file, prefix),
    // the multimodal wrapper ties from its own (top-level) config
    tieWordEmbeddings: Boolean((isWrapper ? top : c).tie_word_embeddings ?? family.tieWordEmbeddings),
    maxPositionEmbeddings,
    layers,
    moe,
    normPlacement: family.normPlacement,
    normWeightOffset: family.normWeightOffset,
    qkNorm: family.qkNorm,
    attentionScale: granite
      ? num('attention_multiplier', 1)
      : gemmaLike
        ? Math.pow(num('query_pre_attn_scalar', 256), -0.5)
        : Math.pow(headDim, -0.5),
    attnLogitSoftcap: gemmaLike ? softcap(c, 'attn_logit_softcapping', mt === 'gemma2' ? 50 : 0) : 0,
    finalLogitSoftcap: gemmaLike ? softcap(c, 'final_logit_softcapping', mt === 'gemma2' ? 30 : 0) : 0,
    embeddingScale: gemmaLike ? Math.sqrt(hiddenSize) : granite ? num('embedding_multiplier', 1) : 1,
    residualScale: granite ? num('residual_multiplier', 1) : 1,
    logitScale: granite ? 1 / num('logits_scaling', 1) : 1,
    fusedQkv: family.fusedQkv,
    fusedGateUp: family.fusedGateUp,
    weightPrefix: names.prefix,
    lmHeadWeight: names.lmHead,
    ...tokenIds(top, c, family, isWrapper, opts.generationEosIds ?? [], file),
    attentionBias,
    attentionOutBias: family.attentionBias === 'config' && !!c.attention_bias,
    mlpBias: family.mlpBiasFromConfig && !!c.mlp_bias,
    embeddingScaleInWeightDtype: gemmaLike,
    recomputeKvPastLength: mt === 'phi3' ? longropeSwitchLength(layers) : undefined,
  };
}

/**
 * transformers' Phi3ForCausalLM drops its KV cache and re-prefills when a sequence first grows
 * past original_max_position_embeddings, so every position is rotated with the long factors.
 */
function longropeSwitchLength(layers: LayerSpec[]): number | undefined {
  const r = layers.find((l) => l.rope.type === 'longrope')?.rope;
  return r?.originalMaxPositions;
}

function moeOf(
  mt: ModelType, c: Dict,
  need: (k: string) => number, num: (k: string, d: number) => number, file: string,
): { moe?: MoeSpec; moeLayer: (i: number) => boolean } {
  if (mt === 'mixtral') {
    // mixtral: softmax -> top-k -> always renormalised; experts have the dense width
    const moe: MoeSpec = {
      numExperts: positiveInt(c.num_local_experts ?? c.num_experts ?? 8, 'num_local_experts', file),
      topK: positiveInt(num('num_experts_per_tok', 2), 'num_experts_per_tok', file),
      normTopK: true,
      intermediateSize: need('intermediate_size'),
    };
    return { moe, moeLayer: () => true };
  }
  if (mt === 'qwen3_moe') {
    const numExperts = c.num_experts ?? c.num_local_experts ?? 128;
    if (numExperts === 0) return { moeLayer: () => false }; // num_experts 0: every layer dense
    const moe: MoeSpec = {
      numExperts: positiveInt(numExperts, 'num_experts', file),
      topK: positiveInt(num('num_experts_per_tok', 8), 'num_experts_per_tok', file),
      normTopK: Boolean(c.norm_topk_prob ?? false),
      intermediateSize: positiveInt(num('moe_intermediate_size', 768), 'moe_intermediate_size', file),
    };
    const mlpOnly: number[] = Array.isArray(c.mlp_only_layers) ? c.mlp_only_layers : [];
    const step = positiveInt(num('decoder_sparse_step', 1), 'decoder_sparse_step', file);
    // modeling_qwen3_moe.py: sparse unless listed in mlp_only_layers or off the sparse step
    return { moe, moeLayer: (i) => !mlpOnly.includes(i) && (i + 1) % step === 0 };
  }
  return { moeLayer: () => false };
}

const ACTIVATIONS: Record<string, Activation> = {
  silu: 'silu',
  swish: 'silu',
  gelu: 'gelu',
  // transformers' tanh approximations of gelu (same formula)
  gelu_pytorch_tanh: 'gelu_tanh',
  gelu_new: 'gelu_tanh',
  gelu_fast: 'gelu_tanh',
};

function activationOf(c: Dict, family: Family, file: string, prefix: string): Activation {
  const name = c[family.activationKey] ?? family.activation;
  const act = ACTIVATIONS[name];
  if (!act) {
    throw new ArtifactError(
      `${file} field "${prefix}${family.activationKey}" is "${name}"; supported: ${Object.keys(ACTIVATIONS).join(', ')}`,
      file,
    );
  }
  return act;
}

function softcap(c: Dict, key: string, dflt: number): number {
  if (!(key in c)) return dflt;
  return c[key] ?? 0; // explicit null disables it
}

/** Tensor prefix and lm_head name, probing the checkpoint when the family has several layouts. */
function weightNames(mt: ModelType, hasTensor?: (n: string) => boolean): { prefix: string; lmHead: string } {
  // gemma3: the Hub checkpoints, and transformers 5's save_pretrained (it reverses its load-time
  // renaming), use "language_model.model."; transformers 5's in-memory module path
  // "model.language_model." also appears in checkpoints written from a raw state dict
  const layouts = mt === 'gemma3'
    ? [
        { prefix: 'language_model.model.', lmHead: 'language_model.lm_head.weight' },
        { prefix: 'model.language_model.', lmHead: 'lm_head.weight' },
      ]
    : [
        { prefix: 'model.', lmHead: 'lm_head.weight' },
        { prefix: '', lmHead: 'lm_head.weight' },
      ];
  if (hasTensor) {
    const found = layouts.find((l) => hasTensor(`${l.prefix}embed_tokens.weight`));
    if (found) return found;
  }
  return layouts[0];
}

/** bos/pad from the config (family default when absent); eos = config ∪ generation_config. */
function tokenIds(top: Dict, c: Dict, family: Family, isWrapper: boolean, genEos: readonly number[], file: string) {
  const pick = (key: string): unknown => (isWrapper && top[key] !== undefined ? top[key] : c[key]);
  const ids = (v: unknown, key: string): number[] => {
    if (v === undefined || v === null) return [];
    const list = Array.isArray(v) ? v : [v];
    for (const x of list) {
      if (!Number.isInteger(x) || x < 0) throw new ArtifactError(`${file} field "${key}" must be token ids, got ${JSON.stringify(v)}`, file);
    }
    return list as number[];
  };
  const configEos = [...ids(c.eos_token_id, 'eos_token_id'), ...(isWrapper ? ids(top.eos_token_id, 'eos_token_id') : [])];
  let eos = [...configEos, ...genEos];
  if (eos.length === 0 && family.eosTokenId !== undefined && !('eos_token_id' in c) && !('eos_token_id' in top)) {
    eos = [family.eosTokenId];
  }
  const single = (key: 'bos_token_id' | 'pad_token_id', dflt?: number): number | undefined => {
    const v = pick(key);
    if (v === undefined) return dflt;
    const list = ids(v, key);
    return list[0];
  };
  return {
    bosTokenId: single('bos_token_id', family.bosTokenId),
    eosTokenIds: [...new Set(eos)],
    padTokenId: single('pad_token_id', family.padTokenId),
  };
}

function positiveInt(v: unknown, key: string, file: string): number {
  if (!Number.isInteger(v) || (v as number) <= 0) {
    throw new ArtifactError(`${file} field "${key}" must be a positive integer, got ${JSON.stringify(v)}`, file);
  }
  return v as number;
}

function isObject(v: unknown): v is Dict {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}
