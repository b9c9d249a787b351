// A GGUF model as a ModelDir: the file (or its split parts), its architecture mapped onto a
// config (arch.ts -> normalizeConfig), its tensors under Hugging Face names (weights.ts), the
// tokenizer and chat template from tokenizer.* metadata (tokenizer.ts), generation defaults from
// general.sampling.*. Reads headers only; tensor data is read when a backend loads it.
//
// `--model` may name a .gguf file, a file of any name that starts with the GGUF magic (an Ollama
// blob), one part of a split model (NAME-00001-of-00003.gguf: every part is opened), or a
// directory without config.json that holds one GGUF model.

import fs from 'node:fs';
import path from 'node:path';
import { ChatTemplate } from '../chat-template.ts';
import { normalizeConfig } from '../config.ts';
import { ArtifactError } from '../errors.ts';
import type { GenerationConfig } from '../generation-config.ts';
import { TextTokenizer } from '../tokenizer.ts';
import { mapArchitecture, type MappedArchitecture } from './arch.ts';
import { GGUF_MAGIC, readGgufHeader, type GgufHeader, type GgufValue } from './reader.ts';
import { ggufTokenizer } from './tokenizer.ts';
import { GgufWeightIndex } from './weights.ts';
import type { ModelConfig } from '../../contracts/model-config.ts';

const SPLIT_RE = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/;

export interface GgufModel {
  /** the path the model was named by */
  dir: string;
  /** the GGUF files, first part first */
  files: string[];
  header: GgufHeader;
  mapped: MappedArchitecture;
  config: ModelConfig;
  /** the config.json the metadata amounts to */
  rawConfig: Record<string, unknown>;
  weights: GgufWeightIndex;
  tokenizer?: TextTokenizer;
  chatTemplate?: ChatTemplate;
  generationConfig?: GenerationConfig;
  /** bytes of the tokenizer metadata (tokens, scores, types, merges): the planner's tokenizer size */
  tokenizerBytes: number;
}

export interface LoadGgufOptions {
  tokenizer?: boolean;
  /** what quantized tensors dequantize into (default bf16) */
  quantizedDtype?: 'bf16' | 'f32';
}

/** Whether `p` names a GGUF model: a file starting with the magic, or a directory of .gguf files without config.json. */
export function isGgufModelPath(p: string): boolean {
  let st: fs.Stats;
  try {
    st = fs.statSync(p);
  } catch {
    return false;
  }
  if (st.isFile()) return p.endsWith('.gguf') || startsWithMagic(p);
  if (!st.isDirectory() || fs.existsSync(path.join(p, 'config.json'))) return false;
  return fs.readdirSync(p).some((f) => f.endsWith('.gguf'));
}

function startsWithMagic(file: string): boolean {
  const fd = fs.openSync(file, 'r');
  try {
    const b = Buffer.alloc(4);
    return fs.readSync(fd, b, 0, 4, 0) === 4 && b.readUInt32LE(0) === GGUF_MAGIC;
  } finally {
    fs.closeSync(fd);
  }
}

/** The GGUF files of the model `p` names, first part first. */
export function ggufFiles(p: string): string[] {
  let file = p;
  if (fs.statSync(p).isDirectory()) {
    const all = fs.readdirSync(p).filter((f) => f.endsWith('.gguf')).sort();
    const firsts = all.filter((f) => !SPLIT_RE.test(f) || SPLIT_RE.exec(f)![2] === '00001');
    if (firsts.length !== 1) {
      throw new ArtifactError(
        `${p} holds ${firsts.length === 0 ? 'no whole GGUF model' : `several GGUF models (${firsts.join(', ')})`}; name the .gguf file with --model`,
        p,
      );
    }
    file = path.join(p, firsts[0]!);
  }
  const m = SPLIT_RE.exec(path.basename(file));
  if (!m) return [file];
  const count = Number(m[3]);
  if (count < 1) throw new ArtifactError(`${file}: a split GGUF of ${count} parts`, file);
  const parts = Array.from({ length: count }, (_, i) => path.join(path.dirname(file), `${m[1]}-${String(i + 1).padStart(5, '0')}-of-${m[3]}.gguf`));
  for (const part of parts) if (!fs.existsSync(part)) throw new ArtifactError(`split GGUF part ${part} is missing (the model has ${count} parts)`, part);
  return parts;
}

/** Opens a GGUF model: headers, config, tensor index and (unless told not to) the tokenizer. */
export function loadGgufModel(p: string, opts: LoadGgufOptions = {}): GgufModel {
  const files = ggufFiles(p);
  const headers = files.map(readGgufHeader);
  const header = mergeSplits(headers);
  const mapped = mapArchitecture(header);
  const meta = header.metadata;
  const where = `${header.file} (GGUF metadata)`;
  const generationConfig = samplingDefaults(meta, header.file);
  const config = {
    ...normalizeConfig(mapped.config, { file: where, generationEosIds: generationConfig.eosTokenIds }),
    ...mapped.overrides,
  };
  const weights = new GgufWeightIndex(p, files, mapped.tensors, opts.quantizedDtype ?? 'bf16');
  const tokenizerBytes = ['tokenizer.ggml.tokens', 'tokenizer.ggml.scores', 'tokenizer.ggml.token_type', 'tokenizer.ggml.merges']
    .reduce((a, k) => a + valueBytes(meta.get(k)), 0);
  const model: GgufModel = { dir: p, files, header, mapped, config, rawConfig: mapped.config, weights, generationConfig, tokenizerBytes };
  if (opts.tokenizer === false) return model;
  const tk = ggufTokenizer(meta, mapped.architecture, header.file);
  const tokenizer = new TextTokenizer(tk.json, tk.config, `${header.file} (tokenizer.ggml metadata)`);
  model.tokenizer = tokenizer;
  const templates = chatTemplates(meta, header.file);
  if (templates) model.chatTemplate = new ChatTemplate(templates, tokenizer, `${header.file} (tokenizer.chat_template)`);
  return model;
}

/** One header from the parts of a split model: the first part's metadata, every part's tensors. */
function mergeSplits(headers: GgufHeader[]): GgufHeader {
  const first = headers[0]!;
  if (headers.length === 1) return first;
  const count = first.metadata.get('split.count');
  if (count !== undefined && count !== headers.length) {
    throw new ArtifactError(`GGUF file ${first.file} says split.count ${String(count)}, but ${headers.length} parts are named`, first.file);
  }
  const seen = new Map<string, string>();
  headers.forEach((h, i) => {
    const no = h.metadata.get('split.no');
    if (no !== undefined && no !== i) throw new ArtifactError(`GGUF file ${h.file} says split.no ${String(no)}; expected ${i}`, h.file);
    for (const t of h.tensors) {
      if (seen.has(t.name)) throw new ArtifactError(`tensor "${t.name}" is in both ${seen.get(t.name)} and ${h.file}`, h.file);
      seen.set(t.name, h.file);
    }
  });
  return { ...first, tensors: headers.flatMap((h) => h.tensors) };
}

/** Chat templates: tokenizer.chat_template, plus the named ones of tokenizer.chat_templates. */
function chatTemplates(meta: Map<string, GgufValue>, file: string): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  const main = meta.get('tokenizer.chat_template');
  if (typeof main === 'string') out.default = main;
  const names = meta.get('tokenizer.chat_templates');
  if (Array.isArray(names)) {
    for (const n of names) {
      const t = meta.get(`tokenizer.chat_template.${String(n)}`);
      if (typeof t !== 'string') throw new ArtifactError(`GGUF file ${file}: tokenizer.chat_templates names "${String(n)}" but tokenizer.chat_template.${String(n)} is missing`, file);
      out[String(n)] = t;
    }
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

/** general.sampling.* as generation defaults; eos = the tokenizer's eos, eot and eom ids. */
function samplingDefaults(meta: Map<string, GgufValue>, file: string): GenerationConfig {
  const num = (key: string): number | undefined => {
    const v = meta.get(key);
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new ArtifactError(`GGUF file ${file}: ${key} must be a number, got ${String(v)}`, file);
    return v;
  };
  const eos: number[] = [];
  for (const key of ['tokenizer.ggml.eos_token_id', 'tokenizer.ggml.eot_token_id', 'tokenizer.ggml.eom_token_id']) {
    const v = num(key);
    if (v !== undefined && !eos.includes(v)) eos.push(v);
  }
  const g: GenerationConfig = {
    eosTokenIds: eos,
    temperature: num('general.sampling.temp'),
    topK: num('general.sampling.top_k'),
    topP: num('general.sampling.top_p'),
    minP: num('general.sampling.min_p'),
    repetitionPenalty: num('general.sampling.penalty_repeat'),
    raw: {},
  };
  // a file that states sampling settings asks for sampling (greedy otherwise, as without a generation_config.json)
  if ([g.temperature, g.topK, g.topP, g.minP].some((v) => v !== undefined)) g.doSample = true;
  for (const [k, v] of meta) if (k.startsWith('general.sampling.')) g.raw[k.slice('general.sampling.'.length)] = typeof v === 'bigint' ? Number(v) : v;
  return g;
}

function valueBytes(v: GgufValue | undefined): number {
  if (v === undefined) return 0;
  if (typeof v === 'string') return v.length;
  if (ArrayBuffer.isView(v)) return v.byteLength;
  if (Array.isArray(v)) return v.reduce((a: number, x) => a + valueBytes(x), 0);
  return 8;
}
