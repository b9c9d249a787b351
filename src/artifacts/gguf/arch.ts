// GGUF architecture metadata -> the config.json llmts would read for the same model, and GGUF
// tensor names -> the Hugging Face names models/weights.ts looks up. The metadata means what
// llama.cpp reads it as (its converter wrote it for llama.cpp), so each key below is interpreted
// the way llama.cpp's loader does, and the defaults are llama.cpp's where the file says nothing:
//
//   llama      llama; mixtral when it has experts; mistral when it states a sliding window
//              (q/k rows are stored permuted for llama.cpp's interleaved rope: undone on load)
//   granite    granite (q/k permuted as llama; attention/embedding/residual/logit scales)
//   qwen2, qwen3, qwen3moe, olmo2, phi3 (fused attn_qkv, ffn_up = gate and up rows), gemma2,
//   gemma3 (gemma3_text; sliding window on all layers but every 6th, local rope base 10000)
//
// gemma's converter stores every RMSNorm weight as (1 + w) (llama.cpp multiplies by it as is), so
// those models load with normWeightOffset 0 rather than transformers' 1 + w.

import type { ModelConfig } from '../../contracts/model-config.ts';
import { ArtifactError } from '../errors.ts';
import { dequantize } from './dequant.ts';
import { readTensorBytes, type GgufHeader, type GgufTensorInfo, type GgufValue } from './reader.ts';

/** GGUF general.architecture values this loader maps, and the model types they become. */
export const SUPPORTED_GGUF_ARCHITECTURES = ['llama', 'granite', 'qwen2', 'qwen3', 'qwen3moe', 'gemma2', 'gemma3', 'phi3', 'olmo2'] as const;
export type GgufArchitecture = (typeof SUPPORTED_GGUF_ARCHITECTURES)[number];

/** How one Hugging Face tensor name is read from the GGUF tensors. */
export interface TensorRef {
  info: GgufTensorInfo;
  /** rows [start, start + count) of dim 0 (one expert of a stacked [E, rows, cols] tensor) */
  slice?: { index: number; count: number };
  /** llama.cpp's q/k permutation to undo: heads of this projection */
  unpermuteHeads?: number;
}

export interface MappedArchitecture {
  architecture: GgufArchitecture;
  /** a config.json for normalizeConfig */
  config: Record<string, unknown>;
  /** Hugging Face tensor name -> where it lives in the GGUF */
  tensors: Map<string, TensorRef>;
  /** GGUF tensors no Hugging Face name maps to (rope factor tables are read into the config) */
  unmapped: string[];
  /** ModelConfig fields that GGUF storage changes (gemma's norm offset) */
  overrides: Partial<ModelConfig>;
}

type Meta = Map<string, GgufValue>;

/** Typed reads of architecture keys with one-line errors naming the key and file. */
class Keys {
  constructor(readonly meta: Meta, readonly arch: string, readonly file: string) {}
  fail(msg: string): ArtifactError {
    return new ArtifactError(`GGUF file ${this.file}: ${msg}`, this.file);
  }
  raw(key: string): GgufValue | undefined {
    return this.meta.get(key.replace('{arch}', this.arch));
  }
  num(key: string): number | undefined {
    const v = this.raw(key);
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw this.fail(`${key.replace('{arch}', this.arch)} must be a number, got ${show(v)}`);
    return v;
  }
  /** a positive integer; arrays (per-layer values) must hold one value */
  int(key: string, required: true): number;
  int(key: string, required?: false): number | undefined;
  int(key: string, required = false): number | undefined {
    const name = key.replace('{arch}', this.arch);
    let v = this.raw(key);
    if (v === undefined) {
      if (required) throw this.fail(`metadata ${name} is missing`);
      return undefined;
    }
    if (ArrayLike(v)) {
      const vals = Array.from(v as ArrayLike<number>);
      if (vals.length > 0 && vals.every((x) => x === vals[0])) v = vals[0]!;
      else throw this.fail(`${name} varies per layer (${show(v)}); only one value for every layer is supported`);
    }
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw this.fail(`${name} must be a non-negative integer, got ${show(v!)}`);
    return v;
  }
  str(key: string): string | undefined {
    const v = this.raw(key);
    if (v === undefined) return undefined;
    if (typeof v !== 'string') throw this.fail(`${key.replace('{arch}', this.arch)} must be a string, got ${show(v)}`);
    return v;
  }
  bool(key: string): boolean | undefined {
    const v = this.raw(key);
    if (v === undefined) return undefined;
    if (typeof v !== 'boolean') throw this.fail(`${key.replace('{arch}', this.arch)} must be a bool, got ${show(v)}`);
    return v;
  }
}

function ArrayLike(v: unknown): boolean {
  return Array.isArray(v) || ArrayBuffer.isView(v);
}

function show(v: GgufValue): string {
  if (ArrayLike(v)) return `[${Array.from(v as ArrayLike<unknown>).slice(0, 8).join(', ')}${(v as ArrayLike<unknown>).length > 8 ? ', ...' : ''}]`;
  return typeof v === 'string' ? JSON.stringify(v) : String(v);
}

/** Maps a GGUF header's architecture; throws naming the architecture when it is not supported. */
export function mapArchitecture(h: GgufHeader): MappedArchitecture {
  const general = h.metadata.get('general.architecture');
  if (typeof general !== 'string') {
    throw new ArtifactError(`GGUF file ${h.file}: metadata general.architecture is missing`, h.file);
  }
  if (!(SUPPORTED_GGUF_ARCHITECTURES as readonly string[]).includes(general)) {
    throw new ArtifactError(
      `GGUF file ${h.file} has architecture "${general}"; supported architectures: ${SUPPORTED_GGUF_ARCHITECTURES.join(', ')}`,
      h.file,
    );
  }
  const arch = general as GgufArchitecture;
  const k = new Keys(h.metadata, arch, h.file);
  const byName = new Map(h.tensors.map((t) => [t.name, t]));
  const has = (n: string) => byName.has(n);

  const hidden = k.int('{arch}.embedding_length', true);
  const layers = k.int('{arch}.block_count', true);
  const heads = k.int('{arch}.attention.head_count', true);
  const kvHeads = k.int('{arch}.attention.head_count_kv') ?? heads;
  if (hidden === 0 || layers === 0 || heads === 0 || kvHeads === 0) throw k.fail('embedding_length, block_count and head counts must be positive');
  const keyLength = k.int('{arch}.attention.key_length');
  const valueLength = k.int('{arch}.attention.value_length');
  const headDim = keyLength ?? Math.floor(hidden / heads);
  if (valueLength !== undefined && valueLength !== headDim) {
    throw k.fail(`${arch}.attention.value_length ${valueLength} differs from the key length ${headDim}; only equal lengths are supported`);
  }
  const embd = byName.get('token_embd.weight');
  if (!embd) throw k.fail('has no tensor token_embd.weight');
  const vocab = k.int('{arch}.vocab_size') ?? embd.shape[0]!;
  const experts = k.int('{arch}.expert_count') ?? 0;

  let modelType: string;
  if (arch === 'llama') {
    modelType = experts > 0 ? 'mixtral' : k.int('{arch}.attention.sliding_window') ? 'mistral' : 'llama';
  } else if (arch === 'qwen3moe') modelType = 'qwen3_moe';
  else if (arch === 'gemma3') modelType = 'gemma3_text';
  else modelType = arch;

  const eps = k.num('{arch}.attention.layer_norm_rms_epsilon');
  const cfg: Record<string, unknown> = {
    model_type: modelType,
    vocab_size: vocab,
    hidden_size: hidden,
    num_hidden_layers: layers,
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    head_dim: headDim,
    max_position_embeddings: k.int('{arch}.context_length') ?? undefined,
    tie_word_embeddings: !has('output.weight'),
    ...(eps !== undefined ? { rms_norm_eps: eps } : {}),
  };
  const ffn = k.int('{arch}.feed_forward_length');
  if (ffn) cfg.intermediate_size = ffn;

  // token ids: the tokenizer's (llama.cpp reads them from tokenizer.ggml.*)
  for (const [key, field] of [['bos_token_id', 'bos_token_id'], ['eos_token_id', 'eos_token_id'], ['padding_token_id', 'pad_token_id']] as const) {
    const v = h.metadata.get(`tokenizer.ggml.${key}`);
    if (typeof v === 'number') cfg[field] = v;
  }
  if (cfg.eos_token_id === undefined) cfg.eos_token_id = null;

  const window = k.int('{arch}.attention.sliding_window');
  const overrides: Partial<ModelConfig> = {};
  cfg.rope_parameters = ropeParameters(k, h, arch, headDim, byName);

  switch (arch) {
    case 'llama':
      cfg.attention_bias = has('blk.0.attn_q.bias');
      cfg.mlp_bias = has('blk.0.ffn_gate.bias') || has('blk.0.ffn_up.bias');
      if (modelType === 'mixtral') {
        cfg.num_local_experts = experts;
        cfg.num_experts_per_tok = k.int('{arch}.expert_used_count', true);
        cfg.sliding_window = window || null;
      } else if (modelType === 'mistral') {
        cfg.sliding_window = window;
      }
      break;
    case 'granite': {
      cfg.attention_bias = has('blk.0.attn_q.bias');
      cfg.mlp_bias = has('blk.0.ffn_gate.bias') || has('blk.0.ffn_up.bias');
      const scale = (key: string, field: string) => {
        const v = k.num(key);
        if (v !== undefined) cfg[field] = v;
      };
      scale('{arch}.attention.scale', 'attention_multiplier');
      scale('{arch}.embedding_scale', 'embedding_multiplier');
      scale('{arch}.residual_scale', 'residual_multiplier');
      scale('{arch}.logit_scale', 'logits_scaling');
      break;
    }
    case 'qwen2':
    case 'qwen3':
      cfg.use_sliding_window = false;
      cfg.sliding_window = null;
      break;
    case 'qwen3moe': {
      cfg.num_experts = experts;
      cfg.num_experts_per_tok = k.int('{arch}.expert_used_count', true);
      cfg.moe_intermediate_size = k.int('{arch}.expert_feed_forward_length', true);
      cfg.norm_topk_prob = k.bool('{arch}.expert_weights_norm') ?? true;
      cfg.decoder_sparse_step = 1;
      cfg.mlp_only_layers = Array.from({ length: layers }, (_, i) => i).filter((i) => !has(`blk.${i}.ffn_gate_exps.weight`));
      cfg.use_sliding_window = false;
      cfg.sliding_window = null;
      break;
    }
    case 'phi3':
      cfg.sliding_window = window || null;
      break;
    case 'olmo2':
      break;
    case 'gemma2':
    case 'gemma3': {
      cfg.hidden_activation = 'gelu_pytorch_tanh';
      cfg.sliding_window = window || null;
      // llama.cpp: 1/sqrt(head_dim), except the 27B models' 1/sqrt(hidden / heads) (told apart by
      // their layer count); an explicit attention.scale wins
      const scale = k.num('{arch}.attention.scale');
      const big = (arch === 'gemma2' && layers === 46) || (arch === 'gemma3' && layers === 62);
      cfg.query_pre_attn_scalar = scale !== undefined ? 1 / (scale * scale) : big ? hidden / heads : headDim;
      if (arch === 'gemma2') {
        cfg.attn_logit_softcapping = k.num('{arch}.attn_logit_softcapping') ?? 50;
        cfg.final_logit_softcapping = k.num('{arch}.final_logit_softcapping') ?? 30;
        cfg.layer_types = Array.from({ length: layers }, (_, i) => (i % 2 === 0 ? 'sliding_attention' : 'full_attention'));
      } else {
        cfg.final_logit_softcapping = k.num('{arch}.final_logit_softcapping') ?? null;
        cfg.attn_logit_softcapping = k.num('{arch}.attn_logit_softcapping') ?? null;
        cfg.layer_types = gemma3LayerTypes(k, layers);
      }
      if (!window) cfg.layer_types = Array.from({ length: layers }, () => 'full_attention');
      overrides.normWeightOffset = 0;
      break;
    }
  }

  const { tensors, unmapped } = mapTensorNames(h, arch, modelType, heads, kvHeads, headDim, ffn ?? 0);
  return { architecture: arch, config: cfg, tensors, unmapped, overrides };
}

/** gemma3: sliding_window_pattern (per-layer bools, true = sliding, or a period), else llama.cpp's period 6. */
function gemma3LayerTypes(k: Keys, layers: number): string[] {
  const p = k.raw('{arch}.attention.sliding_window_pattern');
  if (p !== undefined && ArrayLike(p)) {
    const list = Array.from(p as ArrayLike<unknown>);
    if (list.length !== layers || !list.every((x) => typeof x === 'boolean' || x === 0 || x === 1)) {
      throw k.fail(`gemma3.attention.sliding_window_pattern must hold one bool per layer (${layers}), got ${show(p)}`);
    }
    return list.map((x) => (x ? 'sliding_attention' : 'full_attention'));
  }
  const period = p === undefined ? 6 : k.int('{arch}.attention.sliding_window_pattern')!;
  if (period <= 0) throw k.fail(`gemma3.attention.sliding_window_pattern must be positive, got ${period}`);
  return Array.from({ length: layers }, (_, i) => ((i + 1) % period === 0 ? 'full_attention' : 'sliding_attention'));
}

function f32Tensor(t: GgufTensorInfo): number[] {
  const out = new Float32Array(t.elements);
  dequantize(t.type, readTensorBytes(t), out);
  return [...out];
}

/** rope_parameters for the config (per layer type for gemma3). */
function ropeParameters(k: Keys, h: GgufHeader, arch: GgufArchitecture, headDim: number, byName: Map<string, GgufTensorInfo>): Record<string, unknown> {
  const theta = k.num('{arch}.rope.freq_base') ?? (arch === 'gemma3' ? 1_000_000 : 10_000);
  const dims = k.int('{arch}.rope.dimension_count');
  const p: Record<string, unknown> = { rope_type: 'default', rope_theta: theta };
  if (arch === 'phi3') {
    if (dims !== undefined) p.partial_rotary_factor = dims / headDim;
  } else if (dims !== undefined && dims !== headDim) {
    throw k.fail(`${arch}.rope.dimension_count ${dims} differs from the head dimension ${headDim}; partial rotary embeddings are only supported for phi3`);
  }
  const type = k.str('{arch}.rope.scaling.type') ?? 'none';
  const factor = k.num('{arch}.rope.scaling.factor');
  const orig = k.int('{arch}.rope.scaling.original_context_length');
  const ctx = k.int('{arch}.context_length');
  const long = byName.get('rope_factors_long.weight'), short = byName.get('rope_factors_short.weight');
  const freqs = byName.get('rope_freqs.weight');
  if (long || short) {
    if (!long || !short) throw k.fail('has only one of rope_factors_long.weight and rope_factors_short.weight');
    Object.assign(p, { rope_type: 'longrope', long_factor: f32Tensor(long), short_factor: f32Tensor(short), original_max_position_embeddings: orig ?? ctx });
    const attn = k.num('{arch}.rope.scaling.attn_factor');
    if (attn !== undefined) p.attention_factor = attn;
  } else if (freqs) {
    // llama.cpp keeps llama3-style scaling as a table of per-frequency divisors (rope_freqs):
    // inv_freq[i] / factor[i] at every length, which is longrope with one table and no switch
    const table = f32Tensor(freqs);
    Object.assign(p, { rope_type: 'longrope', long_factor: table, short_factor: table, original_max_position_embeddings: ctx, factor: 1, attention_factor: 1 });
  } else if (type === 'linear') {
    if (!factor) throw k.fail(`${arch}.rope.scaling.type is linear but rope.scaling.factor is missing`);
    Object.assign(p, { rope_type: 'linear', factor });
  } else if (type === 'yarn') {
    if (!factor) throw k.fail(`${arch}.rope.scaling.type is yarn but rope.scaling.factor is missing`);
    Object.assign(p, { rope_type: 'yarn', factor, original_max_position_embeddings: orig ?? ctx });
    const fast = k.num('{arch}.rope.scaling.yarn_beta_fast'), slow = k.num('{arch}.rope.scaling.yarn_beta_slow');
    if (fast !== undefined) p.beta_fast = fast;
    if (slow !== undefined) p.beta_slow = slow;
  } else if (type !== 'none') {
    throw k.fail(`${arch}.rope.scaling.type "${type}" is not supported (none, linear, yarn)`);
  }
  if (arch !== 'gemma3') return p;
  // gemma3: the scaling applies to the full-attention layers; local layers use their own base
  const local = k.num('{arch}.rope.freq_base_swa') ?? 10_000;
  return { full_attention: p, sliding_attention: { rope_type: 'default', rope_theta: local } };
}

/** GGUF tensor names -> Hugging Face names (the spellings models/weights.ts reads). */
function mapTensorNames(
  h: GgufHeader, arch: GgufArchitecture, modelType: string, heads: number, kvHeads: number, headDim: number, ffn: number,
): { tensors: Map<string, TensorRef>; unmapped: string[] } {
  const tensors = new Map<string, TensorRef>();
  const unmapped: string[] = [];
  const permuted = arch === 'llama' || arch === 'granite';
  const gemma = arch === 'gemma2' || arch === 'gemma3';
  const norms: Record<string, string> = gemma
    ? { attn_norm: 'input_layernorm', post_attention_norm: 'post_attention_layernorm', ffn_norm: 'pre_feedforward_layernorm', post_ffw_norm: 'post_feedforward_layernorm' }
    : arch === 'olmo2'
      ? { post_attention_norm: 'post_attention_layernorm', post_ffw_norm: 'post_feedforward_layernorm' }
      : { attn_norm: 'input_layernorm', ffn_norm: 'post_attention_layernorm' };
  const put = (name: string, ref: TensorRef) => {
    if (tensors.has(name)) throw new ArtifactError(`GGUF file ${h.file}: tensors ${tensors.get(name)!.info.name} and ${ref.info.name} both map to ${name}`, h.file);
    tensors.set(name, ref);
  };
  for (const t of h.tensors) {
    const n = t.name;
    if (n === 'token_embd.weight') put('model.embed_tokens.weight', { info: t });
    else if (n === 'output_norm.weight') put('model.norm.weight', { info: t });
    else if (n === 'output.weight') put('lm_head.weight', { info: t });
    else if (n === 'rope_freqs.weight' || n === 'rope_factors_long.weight' || n === 'rope_factors_short.weight') continue;
    else {
      const m = /^blk\.(\d+)\.([a-z_]+)(?:\.(\d+))?\.(weight|bias)$/.exec(n);
      const mapped = m ? blockName(m[2]!, m[4]!, m[3], t) : undefined;
      if (!m || !mapped) {
        unmapped.push(n);
        continue;
      }
      const p = `model.layers.${m[1]}.`;
      if (mapped.experts) {
        const E = t.shape[0]!;
        for (let e = 0; e < E; e++) put(`${p}mlp.experts.${e}.${mapped.experts}.weight`, { info: t, slice: { index: e, count: E } });
        continue;
      }
      const ref: TensorRef = { info: t };
      if (permuted && (m[2] === 'attn_q' || m[2] === 'attn_k')) ref.unpermuteHeads = m[2] === 'attn_q' ? heads : kvHeads;
      put(p + mapped.name, ref);
    }
  }
  return { tensors, unmapped };

  function blockName(base: string, kind: string, expert: string | undefined, t: GgufTensorInfo): { name: string; experts?: string } | undefined {
    if (expert !== undefined) {
      // pre-2024 mixtral files: one tensor per expert, blk.N.ffn_gate.E.weight
      const proj = { ffn_gate: 'gate_proj', ffn_up: 'up_proj', ffn_down: 'down_proj' }[base];
      return proj && kind === 'weight' ? { name: `mlp.experts.${expert}.${proj}.weight` } : undefined;
    }
    if (norms[base]) return kind === 'weight' ? { name: `${norms[base]}.weight` } : undefined;
    switch (base) {
      case 'attn_q': return { name: `self_attn.q_proj.${kind}` };
      case 'attn_k': return { name: `self_attn.k_proj.${kind}` };
      case 'attn_v': return { name: `self_attn.v_proj.${kind}` };
      case 'attn_output': return { name: `self_attn.o_proj.${kind}` };
      case 'attn_qkv': return { name: `self_attn.qkv_proj.${kind}` };
      case 'attn_q_norm': return kind === 'weight' ? { name: 'self_attn.q_norm.weight' } : undefined;
      case 'attn_k_norm': return kind === 'weight' ? { name: 'self_attn.k_norm.weight' } : undefined;
      case 'ffn_gate': return { name: `mlp.gate_proj.${kind}` };
      // phi3 stores its fused gate/up rows as ffn_up, twice the feed-forward length
      case 'ffn_up': return { name: arch === 'phi3' && t.shape[0] === 2 * ffn ? `mlp.gate_up_proj.${kind}` : `mlp.up_proj.${kind}` };
      case 'ffn_down': return { name: `mlp.down_proj.${kind}` };
      case 'ffn_gate_inp': return kind === 'weight' ? { name: 'mlp.gate.weight' } : undefined;
      case 'ffn_gate_exps': return kind === 'weight' ? { name: '', experts: 'gate_proj' } : undefined;
      case 'ffn_up_exps': return kind === 'weight' ? { name: '', experts: 'up_proj' } : undefined;
      case 'ffn_down_exps': return kind === 'weight' ? { name: '', experts: 'down_proj' } : undefined;
    }
    return undefined;
  }
}
