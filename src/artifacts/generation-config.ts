// generation_config.json: extra eos ids and the model author's sampling defaults.
// Only what the file states is reported; transformers' own fallbacks (top_k 50, temperature 1)
// are deliberately not invented here. Note: transformers samples only when do_sample is true;
// otherwise it decodes greedily whatever temperature says.

import path from 'node:path';
import { ArtifactError } from './errors.ts';
import { expectObject, readOptionalJsonFile } from './json-file.ts';

export interface GenerationConfig {
  eosTokenIds: number[];
  bosTokenId?: number;
  padTokenId?: number;
  doSample?: boolean;
  temperature?: number;
  topP?: number;
  topK?: number;
  minP?: number;
  repetitionPenalty?: number;
  maxNewTokens?: number;
  maxLength?: number;
  /** the parsed file, for fields not mapped above */
  raw: Record<string, unknown>;
}

export const GENERATION_CONFIG_FILE = 'generation_config.json';

/** Reads DIR/generation_config.json; undefined when the file does not exist. */
export function readGenerationConfig(dir: string): GenerationConfig | undefined {
  const file = path.join(dir, GENERATION_CONFIG_FILE);
  const raw = readOptionalJsonFile(file, 'generation config');
  return raw === undefined ? undefined : parseGenerationConfig(raw, file);
}

export function parseGenerationConfig(raw: unknown, file = GENERATION_CONFIG_FILE): GenerationConfig {
  const g = expectObject(raw, 'generation config', file);
  const bad = (key: string, want: string): never => {
    throw new ArtifactError(`${file} field "${key}" must be ${want}, got ${JSON.stringify(g[key])}`, file);
  };
  const present = (key: string) => g[key] !== undefined && g[key] !== null;
  const number = (key: string): number | undefined => {
    if (!present(key)) return undefined;
    return typeof g[key] === 'number' && Number.isFinite(g[key]) ? g[key] : bad(key, 'a number');
  };
  const int = (key: string): number | undefined => {
    if (!present(key)) return undefined;
    return Number.isInteger(g[key]) && g[key] >= 0 ? g[key] : bad(key, 'a non-negative integer');
  };
  let eos: number[] = [];
  if (present('eos_token_id')) {
    eos = Array.isArray(g.eos_token_id) ? g.eos_token_id : [g.eos_token_id];
    if (!eos.every((x) => Number.isInteger(x) && x >= 0)) bad('eos_token_id', 'a token id or a list of them');
  }
  if (present('do_sample') && typeof g.do_sample !== 'boolean') bad('do_sample', 'true or false');
  return {
    eosTokenIds: [...new Set(eos)],
    bosTokenId: int('bos_token_id'),
    padTokenId: int('pad_token_id'),
    doSample: present('do_sample') ? g.do_sample : undefined,
    temperature: number('temperature'),
    topP: number('top_p'),
    topK: int('top_k'),
    minP: number('min_p'),
    repetitionPenalty: number('repetition_penalty'),
    maxNewTokens: int('max_new_tokens'),
    maxLength: int('max_length'),
    raw: g,
  };
}
