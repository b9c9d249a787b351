// Turns a model directory into a runnable model on a backend: artifacts (config, tokenizer,
// template, weights index) -> weights on the device -> the decoder graph, plus the text helpers
// the CLI and server need.

import { ONLINE_QUANTIZATIONS, type OnlineQuantization, QUANTIZATION_BACKEND } from '../artifacts/online-quant.ts';
import type { Backend } from '../contracts/backend.ts';
import { loadModelDir } from '../artifacts/model-dir.ts';
import { loadModelWeights, MissingWeightError } from '../models/weights.ts';
import { DecoderModel } from '../models/decoder.ts';
import { ArtifactError } from '../artifacts/errors.ts';
import { derivedContextLength } from '../artifacts/context-length.ts';
import type { TextTokenizer } from '../artifacts/tokenizer.ts';
import type { ChatTemplate } from '../artifacts/chat-template.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';

export interface ChatMessage {
  role: string;
  content: string;
  [key: string]: unknown;
}

export interface LoadedModel {
  dir: string;
  config: ModelConfig;
  tokenizer: TextTokenizer;
  chatTemplate?: ChatTemplate;
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
  /** context limit; default derivedContextLength(config) */
  maxModelLen?: number;
  onWarning?: (message: string) => void;
  /** progress of weight upload, (layersDone, layersTotal) */
  onProgress?: (done: number, total: number) => void;
  /** GGUF, FP8 checkpoints: what quantized tensors dequantize into at load (default bf16) */
  quantizedDtype?: 'bf16' | 'f32';
  /**
   * a safetensors checkpoint's matrices quantized as they load (src/artifacts/online-quant.ts):
   * q8_0 / q4_0 the CPU backend keeps quantized, as a GGUF's of that type; fp8 the CUDA backend
   * keeps FP8 (QUANTIZATION_BACKEND; the other backend refuses it)
   */
  quantization?: OnlineQuantization;
}

export async function loadModel(backend: Backend, dir: string, opts: LoadOptions = {}): Promise<LoadedModel> {
  if (opts.quantization !== undefined && !ONLINE_QUANTIZATIONS.includes(opts.quantization)) {
    throw new ArtifactError(`quantization must be one of ${ONLINE_QUANTIZATIONS.join(', ')}, got ${JSON.stringify(opts.quantization)}`, dir);
  }
  const keeper = opts.quantization && QUANTIZATION_BACKEND[opts.quantization];
  if (keeper && backend.name !== keeper) {
    throw new ArtifactError(`--quantization ${opts.quantization} is for the ${keeper === 'cpu' ? 'CPU' : 'CUDA'} backend (the ` +
      `${backend.name} backend has no kernels for ${opts.quantization} weights; ` +
      `${keeper === 'cpu' ? 'fp8 is the CUDA one' : 'q8_0 and q4_0 are the CPU ones'})`, dir);
  }
  const art = loadModelDir(dir, { quantizedDtype: opts.quantizedDtype, quantization: opts.quantization });
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
  // A backend still finishing its setup (CUDA kernels compiling, see openBackend) did so while the
  // weights loaded; the model's ops need it done.
  await backend.ready?.();
  const model = new DecoderModel(backend, cfg, weights);
  // An explicit --max-model-len may exceed what the model was built for (transformers does not
  // stop at max_position_embeddings either); the caller is told, not refused.
  const derived = derivedContextLength(cfg);
  const maxContext = opts.maxModelLen ?? derived;
  if (maxContext > derived) opts.onWarning?.(`--max-model-len ${maxContext} exceeds the model's context of ${derived} tokens; quality past it is not guaranteed`);
  const tok = art.tokenizer;
  const gen = art.generationConfig;
  const samplingDefaults: SamplingParamsInput = gen?.doSample
    ? { temperature: gen.temperature ?? 1, topP: gen.topP, topK: gen.topK, minP: gen.minP, repetitionPenalty: gen.repetitionPenalty }
    : { temperature: 0, repetitionPenalty: gen?.repetitionPenalty };
  return {
    dir,
    config: cfg,
    tokenizer: tok,
    chatTemplate: art.chatTemplate,
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
