// Turns a model directory into a runnable model on a backend: artifacts (config, tokenizer,
// template, weights index) -> weights on the device -> the decoder graph, plus the text helpers
// the CLI and server need.

import type { Backend } from '../contracts/backend.ts';
import { loadModelDir } from '../artifacts/model-dir.ts';
import { loadModelWeights, MissingWeightError } from '../models/weights.ts';
import { DecoderModel } from '../models/decoder.ts';
import { ArtifactError } from '../artifacts/errors.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';

export interface ChatMessage {
  role: string;
  content: string;
  [key: string]: unknown;
}

export interface LoadedModel {
  dir: string;
  model: DecoderModel;
  /** eos ids from config + generation_config */
  eosIds: readonly number[];
  /** longest sequence (prompt + output) allowed */
  maxContext: number;
  decode(ids: number[]): string;
  encode(text: string): number[];
  applyChatTemplate(messages: ChatMessage[]): number[];
  /** sampling defaults from generation_config.json (greedy unless it sets do_sample) */
  samplingDefaults: SamplingParamsInput;
}

export interface LoadOptions {
  maxModelLen?: number;
  /** progress of weight upload, (layersDone, layersTotal) */
  onProgress?: (done: number, total: number) => void;
}

export async function loadModel(backend: Backend, dir: string, opts: LoadOptions = {}): Promise<LoadedModel> {
  const art = loadModelDir(dir);
  const cfg = art.config;
  const progress =
    opts.onProgress ??
    (process.stderr.isTTY ? (d: number, t: number) => process.stderr.write(`\rloading weights: layer ${d}/${t}${d === t ? '\n' : ''}`) : undefined);
  let weights;
  try {
    weights = await loadModelWeights(backend, cfg, art.weights, progress);
  } catch (err) {
    if (err instanceof MissingWeightError) throw new ArtifactError(`${dir}: ${err.message}`);
    throw err;
  }
  const model = new DecoderModel(backend, cfg, weights);
  const maxContext = Math.min(opts.maxModelLen ?? Infinity, cfg.maxPositionEmbeddings);
  const tok = art.tokenizer;
  const gen = art.generationConfig;
  const samplingDefaults: SamplingParamsInput = gen?.doSample
    ? { temperature: gen.temperature ?? 1, topP: gen.topP, topK: gen.topK, minP: gen.minP, repetitionPenalty: gen.repetitionPenalty }
    : { temperature: 0, repetitionPenalty: gen?.repetitionPenalty };
  return {
    dir,
    model,
    eosIds: cfg.eosTokenIds,
    maxContext,
    decode: (ids) => tok.decode(ids, { skipSpecialTokens: true }),
    encode: (text) => tok.encode(text, { addSpecialTokens: true }),
    applyChatTemplate: (messages) => {
      if (!art.chatTemplate) throw new ArtifactError(`${dir}: the model has no chat template (use --prompt)`);
      return art.chatTemplate.encode(messages, { addGenerationPrompt: true });
    },
    samplingDefaults,
  };
}
