// An EAGLE-3 draft head's directory, read and checked against its target: the published checkpoint
// layout (the EAGLE repository, SpecForge's LlamaForCausalLMEagle3, read by vLLM's llama_eagle3 and
// sglang): config.json with `architectures: ["LlamaForCausalLMEagle3"]`, a one-layer llama config,
// `draft_vocab_size`, and the target layers whose hidden states it fuses
// (`eagle_aux_hidden_state_layer_ids`, top level or in `eagle_config`); tensors
//   fc.weight                                [hidden, 3 * target_hidden]   concat(low, mid, high) -> hidden
//   midlayer.hidden_norm.weight              [hidden]
//   midlayer.input_layernorm.weight          [hidden]
//   midlayer.self_attn.{q,k,v}_proj.weight   [heads * head_dim, 2 * hidden] over concat(embedding, hidden)
//   midlayer.self_attn.o_proj.weight         [hidden, heads * head_dim]
//   midlayer.post_attention_layernorm.weight [hidden]
//   midlayer.mlp.{gate,up,down}_proj.weight
//   norm.weight                              [hidden]
//   lm_head.weight                           [draft_vocab, hidden]
//   d2t                                      int64 [draft_vocab]: target id = draft id + d2t[draft id]
//   t2d                                      bool [vocab] (optional): target id in the draft vocabulary
//   embed_tokens.weight                      [vocab, hidden] (optional: else the target's embedding)
// (vLLM's spelling layers.0.* for midlayer.* is read too). Nothing here reads weight data except
// the small d2t / t2d maps.

import fs from 'node:fs';
import path from 'node:path';
import type { WeightSource } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { decodeHalf, encodeHalf } from '../backends/common/half.ts';
import { normalizeConfig } from './config.ts';
import { ArtifactError } from './errors.ts';
import { expectObject, readJsonFile } from './json-file.ts';
import { openWeights, type WeightIndex } from './safetensors.ts';
import type { TensorEntry } from './safetensors-header.ts';

export interface Eagle3Config {
  /** the head's decoder layer as a one-layer llama config (hidden size, heads, rope, eps, MLP) */
  layer: ModelConfig;
  /** hidden size of the target's states that fc fuses */
  targetHiddenSize: number;
  /** the target's vocabulary */
  vocabSize: number;
  draftVocabSize: number;
  /** target layers whose entering hidden states fc fuses (output_hidden_states indices), low/mid/high */
  targetLayers: readonly [number, number, number];
  /** 'config': the checkpoint names them; 'default': vLLM's choice for the target's depth */
  targetLayersFrom: 'config' | 'default';
  /** the residual stream starts at hidden_norm(h) instead of h (vLLM's norm_before_residual) */
  normBeforeResidual: boolean;
}

/** The checkpoint's tensor names, resolved (midlayer.* or layers.0.*). */
export interface Eagle3TensorNames {
  fc: string;
  hiddenNorm: string;
  inputNorm: string;
  q: string; k: string; v: string; o: string;
  postAttnNorm: string;
  gate: string; up: string; down: string;
  norm: string;
  lmHead: string;
  /** the head's own token embedding, when it carries one */
  embed?: string;
}

export interface Eagle3Dir {
  dir: string;
  config: Eagle3Config;
  rawConfig: Record<string, unknown>;
  weights: WeightIndex;
  names: Eagle3TensorNames;
  /** target id of each draft id (draft id + d2t[draft id]) */
  draftToTarget: Int32Array;
}

/** What the head must agree with in its target. */
export type Eagle3Target = Pick<ModelConfig, 'hiddenSize' | 'vocabSize' | 'numLayers'>;

const ARCHITECTURES = ['LlamaForCausalLMEagle3', 'Eagle3LlamaForCausalLM'];

/** Whether `dir` holds an EAGLE-3 head (its config.json names an EAGLE-3 architecture), not a model. */
export function isEagle3Dir(dir: string): boolean {
  try {
    const raw = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as { architectures?: unknown };
    return Array.isArray(raw.architectures) && raw.architectures.some((a) => typeof a === 'string' && ARCHITECTURES.includes(a));
  } catch {
    return false; // loading it as a model reports what is wrong
  }
}

/** vLLM's layers when a checkpoint names none (gpu_model_runner: 2, N / 2, N - 3). */
export function defaultEagle3Layers(numLayers: number): [number, number, number] {
  return [2, Math.floor(numLayers / 2), numLayers - 3];
}

/** Reads and checks an EAGLE-3 head directory for `target`. Every problem is an ArtifactError naming the file. */
export function loadEagle3Dir(dir: string, target: Eagle3Target): Eagle3Dir {
  if (!fs.existsSync(dir)) throw new ArtifactError(`EAGLE-3 head directory ${dir} does not exist`, dir);
  if (!fs.statSync(dir).isDirectory()) throw new ArtifactError(`EAGLE-3 head path ${dir} is not a directory`, dir);
  const file = path.join(dir, 'config.json');
  const raw = expectObject(readJsonFile(file, 'EAGLE-3 head config'), 'EAGLE-3 head config', file);
  const archs = Array.isArray(raw.architectures) ? raw.architectures : [];
  if (!archs.some((a: unknown) => typeof a === 'string' && ARCHITECTURES.includes(a))) {
    throw new ArtifactError(
      `${file}: architectures ${JSON.stringify(raw.architectures ?? null)} is not an EAGLE-3 head (expected ${ARCHITECTURES.join(' or ')})`,
      file,
    );
  }
  if (raw.model_type !== 'llama') {
    throw new ArtifactError(`${file}: an EAGLE-3 head's decoder layer must be model_type "llama", got ${JSON.stringify(raw.model_type)}`, file);
  }
  if (raw.num_hidden_layers !== 1) {
    throw new ArtifactError(`${file}: EAGLE-3 heads of ${JSON.stringify(raw.num_hidden_layers)} layers are not supported (num_hidden_layers must be 1)`, file);
  }
  const eagle = raw.eagle_config;
  if (eagle !== undefined && (eagle === null || typeof eagle !== 'object' || Array.isArray(eagle))) {
    throw new ArtifactError(`${file}: "eagle_config" must be an object`, file);
  }
  if (eagle?.use_aux_hidden_state === false) {
    throw new ArtifactError(`${file}: eagle_config.use_aux_hidden_state false (one target hidden state, no fc) is not supported`, file);
  }

  const weights = openWeights(dir);
  const layer = normalizeConfig(raw, { file, hasTensor: (n) => weights.has(n) });
  const D = layer.hiddenSize, V = layer.vocabSize;
  const targetHiddenSize = raw.target_hidden_size === undefined ? D : positiveInt(raw.target_hidden_size, 'target_hidden_size', file);
  const draftVocabSize = raw.draft_vocab_size === undefined || raw.draft_vocab_size === null
    ? V
    : positiveInt(raw.draft_vocab_size, 'draft_vocab_size', file);
  if (draftVocabSize > V) throw new ArtifactError(`${file}: draft_vocab_size ${draftVocabSize} exceeds vocab_size ${V}`, file);
  if (V !== target.vocabSize) {
    throw new ArtifactError(`${file}: vocab_size ${V} differs from the target's ${target.vocabSize}: the head was trained for another model`, file);
  }
  if (targetHiddenSize !== target.hiddenSize) {
    throw new ArtifactError(`${file}: target_hidden_size ${targetHiddenSize} differs from the target's hidden size ${target.hiddenSize}`, file);
  }
  const layerIds = raw.eagle_aux_hidden_state_layer_ids ?? eagle?.eagle_aux_hidden_state_layer_ids;
  let targetLayers: [number, number, number];
  if (layerIds === undefined || layerIds === null) {
    targetLayers = defaultEagle3Layers(target.numLayers);
    if (targetLayers.some((l) => l < 0)) {
      throw new ArtifactError(`${file} names no eagle_aux_hidden_state_layer_ids, and the target's ${target.numLayers} layers are too few for the default`, file);
    }
  } else {
    if (!Array.isArray(layerIds) || layerIds.length !== 3 || !layerIds.every((l) => Number.isInteger(l))) {
      throw new ArtifactError(`${file}: eagle_aux_hidden_state_layer_ids must be three layer ids, got ${JSON.stringify(layerIds)}`, file);
    }
    const bad = layerIds.find((l: number) => l < 0 || l >= target.numLayers);
    if (bad !== undefined) {
      throw new ArtifactError(`${file}: eagle_aux_hidden_state_layer_ids ${JSON.stringify(layerIds)}: ${bad} is not a layer of the target (0..${target.numLayers - 1})`, file);
    }
    targetLayers = layerIds as [number, number, number];
  }

  const names = tensorNames(weights);
  const H = layer.numHeads, Hk = layer.numKvHeads, hd = layer.headDim, I = layer.intermediateSize;
  if (!names.embed && D !== target.hiddenSize) {
    throw new ArtifactError(
      `${file}: hidden_size ${D} differs from the target's ${target.hiddenSize}, and the head has no embed_tokens.weight of its own`, file);
  }
  const shapes: [string, number[]][] = [
    [names.fc, [D, 3 * targetHiddenSize]],
    [names.hiddenNorm, [D]], [names.inputNorm, [D]], [names.postAttnNorm, [D]], [names.norm, [D]],
    [names.q, [H * hd, 2 * D]], [names.k, [Hk * hd, 2 * D]], [names.v, [Hk * hd, 2 * D]], [names.o, [D, H * hd]],
    [names.gate, [I, D]], [names.up, [I, D]], [names.down, [D, I]],
    [names.lmHead, [draftVocabSize, D]],
  ];
  if (names.embed) shapes.push([names.embed, [V, D]]);
  for (const [name, shape] of shapes) weights.expectShape(name, shape);
  const draftToTarget = readDraftMap(weights, draftVocabSize, V);

  const config: Eagle3Config = {
    layer, targetHiddenSize, vocabSize: V, draftVocabSize, targetLayers,
    targetLayersFrom: layerIds === undefined || layerIds === null ? 'default' : 'config',
    normBeforeResidual: !!raw.norm_before_residual,
  };
  return { dir, config, rawConfig: raw, weights, names, draftToTarget };
}

function tensorNames(w: WeightIndex): Eagle3TensorNames {
  const prefixes = ['', 'model.'];
  const top = (name: string): string => {
    const hit = prefixes.map((p) => p + name).find((n) => w.has(n));
    return hit ?? name; // absent: the shape check names it
  };
  const layerPrefix = ['midlayer.', 'layers.0.', 'model.midlayer.', 'model.layers.0.'].find((p) => w.has(`${p}self_attn.q_proj.weight`)) ?? 'midlayer.';
  const l = (name: string) => layerPrefix + name;
  const embed = prefixes.map((p) => `${p}embed_tokens.weight`).find((n) => w.has(n));
  return {
    fc: top('fc.weight'),
    hiddenNorm: l('hidden_norm.weight'),
    inputNorm: l('input_layernorm.weight'),
    q: l('self_attn.q_proj.weight'), k: l('self_attn.k_proj.weight'), v: l('self_attn.v_proj.weight'), o: l('self_attn.o_proj.weight'),
    postAttnNorm: l('post_attention_layernorm.weight'),
    gate: l('mlp.gate_proj.weight'), up: l('mlp.up_proj.weight'), down: l('mlp.down_proj.weight'),
    norm: top('norm.weight'),
    lmHead: w.has('lm_head.weight') ? 'lm_head.weight' : top('lm_head.weight'),
    embed,
  };
}

/** d2t as target ids, checked: each in [0, V), no two alike, and inside t2d when the checkpoint has it. */
function readDraftMap(w: WeightIndex, draftVocab: number, V: number): Int32Array {
  const out = new Int32Array(draftVocab);
  if (!w.has('d2t')) {
    if (draftVocab !== V) throw new ArtifactError(`no d2t tensor in ${w.source}: a draft vocabulary of ${draftVocab} (not the target's ${V}) needs it`, w.source);
    for (let i = 0; i < draftVocab; i++) out[i] = i;
    return out;
  }
  const e = w.entry('d2t');
  if (e.shape.length !== 1 || e.shape[0] !== draftVocab) {
    throw new ArtifactError(`tensor "d2t" in ${e.file} has shape [${e.shape.join(', ')}], expected [${draftVocab}] (draft_vocab_size)`, e.file);
  }
  const bytes = readEntry(e);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const read = e.dtype === 'I64' ? (i: number) => Number(dv.getBigInt64(i * 8, true))
    : e.dtype === 'I32' ? (i: number) => dv.getInt32(i * 4, true)
      : undefined;
  if (!read) throw new ArtifactError(`tensor "d2t" in ${e.file} has dtype ${e.dtype}; expected I64 (or I32)`, e.file);
  const seen = new Uint8Array(V);
  for (let i = 0; i < draftVocab; i++) {
    const t = i + read(i);
    if (!Number.isInteger(t) || t < 0 || t >= V) {
      throw new ArtifactError(`tensor "d2t" in ${e.file}: draft id ${i} maps to target id ${t}, outside the vocabulary of ${V}`, e.file);
    }
    if (seen[t]) throw new ArtifactError(`tensor "d2t" in ${e.file}: target id ${t} is mapped twice`, e.file);
    seen[t] = 1;
    out[i] = t;
  }
  if (w.has('t2d')) {
    const t2d = w.entry('t2d');
    if (t2d.shape.length !== 1 || t2d.shape[0] !== V || (t2d.dtype !== 'BOOL' && t2d.dtype !== 'U8')) {
      throw new ArtifactError(`tensor "t2d" in ${t2d.file} is ${t2d.dtype}[${t2d.shape.join(', ')}], expected BOOL[${V}]`, t2d.file);
    }
    const mask = readEntry(t2d);
    for (let t = 0; t < V; t++) {
      if ((mask[t] !== 0) !== (seen[t] === 1)) {
        throw new ArtifactError(`tensors "t2d" and "d2t" in ${t2d.file} disagree about target id ${t}`, t2d.file);
      }
    }
  }
  return out;
}

function readEntry(e: TensorEntry): Uint8Array {
  const buf = Buffer.alloc(e.byteLength);
  const fd = fs.openSync(e.file, 'r');
  try {
    let done = 0;
    while (done < e.byteLength) {
      const n = fs.readSync(fd, buf, done, e.byteLength - done, e.offset + done);
      if (n === 0) throw new ArtifactError(`${e.file} ends inside tensor "${e.name}"`, e.file);
      done += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  return buf;
}

/**
 * Columns [start, start + cols) of a 2-D weight [N, K] as a source of its own ([N, cols]): the
 * head's q/k/v read concat(embedding, hidden) and fc concat(low, mid, high), so each half (third)
 * multiplies its input alone and the products add. The values come from the file at load.
 */
export function columnSource(src: WeightSource, start: number, cols: number): WeightSource {
  const [N, K] = src.shape as [number, number];
  if (src.shape.length !== 2 || start < 0 || cols <= 0 || start + cols > K) {
    throw new Error(`columnSource: columns ${start}..${start + cols} of ${src.name} [${src.shape.join(', ')}]`);
  }
  const esz = src.dtype === 'f32' ? 4 : 2;
  const slice = (want: 'f32' | 'f16' | 'bf16'): Uint8Array => {
    const whole = readRange(src.path, src.offset, N * K * esz, src.name);
    const part = new Uint8Array(N * cols * esz);
    for (let r = 0; r < N; r++) part.set(whole.subarray((r * K + start) * esz, (r * K + start + cols) * esz), r * cols * esz);
    if (want === src.dtype) return part;
    const values = src.dtype === 'f32'
      ? new Float32Array(part.buffer, part.byteOffset, N * cols)
      : decodeHalf(new Uint16Array(part.buffer, part.byteOffset, N * cols), src.dtype);
    const out = want === 'f32' ? new Float32Array(values) : encodeHalf(values, want);
    return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
  };
  return { path: src.path, offset: src.offset, dtype: src.dtype, shape: [N, cols], name: `${src.name}[:, ${start}:${start + cols}]`, decode: slice };
}

function readRange(file: string, offset: number, bytes: number, name: string): Uint8Array {
  return readEntry({ name, dtype: '', shape: [], offset, byteLength: bytes, file });
}

function positiveInt(v: unknown, key: string, file: string): number {
  if (!Number.isInteger(v) || (v as number) <= 0) {
    throw new ArtifactError(`${file} field "${key}" must be a positive integer, got ${JSON.stringify(v)}`, file);
  }
  return v as number;
}
