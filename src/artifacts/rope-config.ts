// Resolves a config's rotary settings into one RopeSpec per layer type, from either style:
//   old: top-level rope_theta + rope_scaling {type | rope_type, factor, ...}
//   new: rope_parameters {rope_type, rope_theta, ...}, or nested per layer type
//        {"full_attention": {...}, "sliding_attention": {...}} (gemma3 in transformers 5)
// Precedence follows transformers' convert_rope_params_to_dict / standardize_rope_params:
// rope_scaling (when non-empty) replaces rope_parameters; keys inside the dict beat top-level
// rope_theta / partial_rotary_factor; a top-level original_max_position_embeddings beats the
// dict's for llama3 / yarn / longrope (phi3 keeps that field at top level, default 4096).

import type { RopeSpec, RopeType } from '../contracts/model-config.ts';
import { ArtifactError } from './errors.ts';
import type { Family, ModelType } from './families.ts';

export type LayerTypeName = 'full_attention' | 'sliding_attention';
type Dict = Record<string, any>;

export interface RopeContext {
  modelType: ModelType;
  family: Family;
  /** the text config (gemma3: text_config) */
  config: Dict;
  headDim: number;
  maxPositions: number;
  /** names the file (and section) in messages: "/m/config.json" or "/m/config.json (text_config)" */
  where: string;
  file: string;
}

const isDict = (v: unknown): v is Dict => v !== null && typeof v === 'object' && !Array.isArray(v);
const nonEmpty = (v: unknown): v is Dict => isDict(v) && Object.keys(v).length > 0;

export function resolveRope(ctx: RopeContext): Record<LayerTypeName, RopeSpec> {
  const raw = ctx.modelType === 'gemma3' || ctx.modelType === 'gemma3_text' ? gemma3Params(ctx) : flatParams(ctx);
  return {
    full_attention: toSpec(ctx, raw.full_attention, 'full_attention', raw.nested),
    sliding_attention: toSpec(ctx, raw.sliding_attention, 'sliding_attention', raw.nested),
  };
}

interface RawParams {
  full_attention: Dict;
  sliding_attention: Dict;
  /** transformers treats the dict as per-layer-type (changes a few precedence rules) */
  nested: boolean;
}

/** Families with one rope for every layer (a nested dict is accepted too: each type picks its own). */
function flatParams(ctx: RopeContext): RawParams {
  const c = ctx.config;
  const source = nonEmpty(c.rope_scaling) ? c.rope_scaling : isDict(c.rope_parameters) ? c.rope_parameters : {};
  const withDefaults = (d: Dict): Dict => {
    const p = { ...d };
    p.rope_theta ??= c.rope_theta ?? ctx.family.ropeTheta;
    p.partial_rotary_factor ??= c.partial_rotary_factor;
    return p;
  };
  if (isNested(source)) {
    const full = source.full_attention ?? source.sliding_attention;
    const sliding = source.sliding_attention ?? source.full_attention;
    return { full_attention: withDefaults(full ?? {}), sliding_attention: withDefaults(sliding ?? {}), nested: true };
  }
  const p = withDefaults(source);
  return { full_attention: p, sliding_attention: p, nested: false };
}

/**
 * gemma3: full layers default to theta 1e6 (top-level rope_theta), sliding layers to 1e4
 * (rope_local_base_freq); old-style rope_scaling only touches the full layers. A flat
 * rope_parameters dict is treated like rope_scaling (transformers would silently drop it).
 */
function gemma3Params(ctx: RopeContext): RawParams {
  const c = ctx.config;
  let full: Dict = { rope_type: 'default' };
  let sliding: Dict = { rope_type: 'default' };
  const rp = c.rope_parameters;
  if (isNested(rp)) {
    if (isDict(rp.full_attention)) full = { ...rp.full_attention };
    if (isDict(rp.sliding_attention)) sliding = { ...rp.sliding_attention };
  } else if (nonEmpty(rp)) {
    full = { ...full, ...rp };
  }
  if (isDict(c.rope_scaling)) full = { ...full, ...c.rope_scaling };
  full.rope_theta ??= c.rope_theta ?? 1_000_000;
  sliding.rope_theta ??= c.rope_local_base_freq ?? 10_000;
  return { full_attention: full, sliding_attention: sliding, nested: true };
}

function isNested(d: unknown): d is Dict {
  return isDict(d) && ('full_attention' in d || 'sliding_attention' in d);
}

function toSpec(ctx: RopeContext, p: Dict, layerType: LayerTypeName, nested: boolean): RopeSpec {
  const c = ctx.config;
  const where = `${ctx.where} rope parameters (${layerType})`;
  const fail = (msg: string) => new ArtifactError(`${where}: ${msg}`, ctx.file);
  let type: string = p.rope_type ?? p.type ?? 'default';
  // phi3 calls its LongRoPE variants "su" and "yarn" (configuration_phi3.py renames both)
  if (ctx.modelType === 'phi3' && (type === 'su' || type === 'yarn')) type = 'longrope';
  if (!['default', 'linear', 'dynamic', 'yarn', 'llama3', 'longrope'].includes(type)) {
    throw fail(`unsupported rope type "${type}" (supported: default, linear, dynamic, yarn, llama3, longrope)`);
  }
  if (ctx.modelType === 'phi3' && type !== 'default' && type !== 'longrope') {
    throw fail(`phi3 supports only default and longrope rope types, got "${type}"`);
  }
  const theta = num(p.rope_theta, 'rope_theta', fail);
  const prf = ctx.family.partialRotary ? (p.partial_rotary_factor ?? 1) : 1;
  const rotaryDim = Math.trunc(ctx.headDim * num(prf, 'partial_rotary_factor', fail));
  if (rotaryDim <= 0 || rotaryDim > ctx.headDim) throw fail(`rotary dim ${rotaryDim} is outside 1..head_dim`);
  const spec: RopeSpec = { type: type as RopeType, theta, rotaryDim, factor: 1, maxPositions: ctx.maxPositions };

  if (type === 'llama3' || type === 'yarn' || type === 'longrope') {
    // phi3's field always exists (dataclass default 4096) and wins over the dict's value;
    // per-layer-type dicts ignore the top-level field
    const topLevel = c.original_max_position_embeddings ?? (ctx.modelType === 'phi3' ? 4096 : undefined);
    spec.originalMaxPositions = num(
      (nested ? undefined : topLevel) ?? p.original_max_position_embeddings ?? ctx.maxPositions,
      'original_max_position_embeddings', fail,
    );
  }
  const optional = (key: string) => (p[key] === undefined || p[key] === null ? undefined : num(p[key], key, fail));
  switch (type) {
    case 'linear':
    case 'dynamic':
      spec.factor = required(p, 'factor', fail);
      break;
    case 'llama3':
      spec.factor = required(p, 'factor', fail);
      spec.lowFreqFactor = required(p, 'low_freq_factor', fail);
      spec.highFreqFactor = required(p, 'high_freq_factor', fail);
      break;
    case 'yarn':
      if (!('factor' in p)) throw fail('missing required key "factor"');
      // factor: null means "max_position_embeddings / original_max_position_embeddings"
      spec.factor = optional('factor') ?? ctx.maxPositions / spec.originalMaxPositions!;
      spec.attentionFactor = optional('attention_factor');
      spec.betaFast = optional('beta_fast');
      spec.betaSlow = optional('beta_slow');
      spec.mscale = optional('mscale');
      spec.mscaleAllDim = optional('mscale_all_dim');
      // transformers reads truncate from the top-level rope dict, default true
      spec.truncate = (nested ? undefined : p.truncate) ?? true;
      break;
    case 'longrope': {
      spec.shortFactor = factorList(p, 'short_factor', rotaryDim, fail);
      spec.longFactor = factorList(p, 'long_factor', rotaryDim, fail);
      spec.factor = optional('factor') ?? ctx.maxPositions / spec.originalMaxPositions!;
      spec.attentionFactor = optional('attention_factor');
      break;
    }
  }
  return spec;
}

function num(v: unknown, key: string, fail: (m: string) => Error): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw fail(`"${key}" must be a number, got ${JSON.stringify(v)}`);
  return v;
}

function required(p: Dict, key: string, fail: (m: string) => Error): number {
  if (p[key] === undefined || p[key] === null) throw fail(`missing required key "${key}"`);
  return num(p[key], key, fail);
}

function factorList(p: Dict, key: string, rotaryDim: number, fail: (m: string) => Error): number[] {
  const v = p[key];
  if (!Array.isArray(v) || !v.every((x) => typeof x === 'number')) throw fail(`"${key}" must be a list of numbers`);
  const want = Math.ceil(rotaryDim / 2);
  if (v.length !== want) throw fail(`"${key}" has ${v.length} entries, expected ${want} (rotary dim / 2)`);
  return v;
}
