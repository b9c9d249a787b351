// A Hugging Face model directory, loaded and cross-checked: config.json -> ModelConfig,
// safetensors headers -> WeightIndex, tokenizer, chat template and generation defaults. A GGUF
// file (or a directory of one) loads through gguf/model.ts into the same shape.
// Nothing here reads tensor data, so `fit` can call it with { tokenizer: false } cheaply.

import fs from 'node:fs';
import path from 'node:path';
import type { ModelConfig } from '../contracts/model-config.ts';
import { ChatTemplate } from './chat-template.ts';
import { normalizeConfig } from './config.ts';
import { ArtifactError } from './errors.ts';
import { readGenerationConfig, type GenerationConfig } from './generation-config.ts';
import { expectObject, readJsonFile } from './json-file.ts';
import { fp8SchemeOf, Fp8WeightIndex } from './fp8-checkpoint.ts';
import { QuantizingWeightIndex, type OnlineQuantization } from './online-quant.ts';
import { openWeights, type WeightIndex } from './safetensors.ts';
import { TextTokenizer, TOKENIZER_FILE } from './tokenizer.ts';
import { isGgufModelPath, loadGgufModel } from './gguf/model.ts';

export const CONFIG_FILE = 'config.json';

export interface ModelDir {
  dir: string;
  config: ModelConfig;
  /** config.json as parsed */
  rawConfig: Record<string, unknown>;
  weights: WeightIndex;
  tokenizer: TextTokenizer;
  /** undefined when the model ships no chat template */
  chatTemplate?: ChatTemplate;
  generationConfig?: GenerationConfig;
  /** GGUF: bytes of the tokenizer metadata (a directory's is tokenizer.json) */
  tokenizerBytes?: number;
}

export interface LoadModelDirOptions {
  /** load tokenizer and chat template (default true); false for header-only work such as fit */
  tokenizer?: boolean;
  /** GGUF, FP8 checkpoints: what quantized tensors dequantize into (default bf16) */
  quantizedDtype?: 'bf16' | 'f32';
  /** a safetensors checkpoint: quantize its matrices as they load (online-quant.ts) */
  quantization?: OnlineQuantization;
}

export function loadModelDir(dir: string, opts?: { tokenizer?: true; quantizedDtype?: 'bf16' | 'f32'; quantization?: OnlineQuantization }): ModelDir;
export function loadModelDir(dir: string, opts: LoadModelDirOptions): Omit<ModelDir, 'tokenizer'> & { tokenizer?: TextTokenizer };
export function loadModelDir(
  dir: string, opts: LoadModelDirOptions = {},
): Omit<ModelDir, 'tokenizer'> & { tokenizer?: TextTokenizer } {
  // a .gguf file, an Ollama blob, or a directory of GGUF files (no config.json): src/artifacts/gguf/
  if (isGgufModelPath(dir)) {
    if (opts.quantization) {
      throw new ArtifactError(`${dir} is a GGUF model, whose tensors keep the types they were quantized to: --quantization ` +
        `${opts.quantization} applies to safetensors checkpoints`, dir);
    }
    return loadGgufModel(dir, opts);
  }
  if (!fs.existsSync(dir)) throw new ArtifactError(`model directory ${dir} does not exist`, dir);
  if (!fs.statSync(dir).isDirectory()) throw new ArtifactError(`model path ${dir} is not a directory`, dir);

  const configFile = path.join(dir, CONFIG_FILE);
  const rawConfig = expectObject(readJsonFile(configFile, 'model config'), 'model config', configFile);
  const generationConfig = readGenerationConfig(dir);
  const files = openWeights(dir);
  // an FP8 checkpoint's matrices dequantize as they load (fp8-checkpoint.ts); any other quantized
  // checkpoint fails here, naming its quant_method
  const fp8 = fp8SchemeOf(rawConfig, configFile);
  const stored = fp8 ? new Fp8WeightIndex(files, fp8, opts.quantizedDtype ?? 'bf16') : files;
  const weights = opts.quantization ? new QuantizingWeightIndex(stored, opts.quantization) : stored;
  const config = normalizeConfig(rawConfig, {
    file: configFile,
    generationEosIds: generationConfig?.eosTokenIds,
    hasTensor: (name) => weights.has(name),
  });

  if (opts.tokenizer === false) return { dir, config, rawConfig, weights, generationConfig };

  const tokenizerFile = path.join(dir, TOKENIZER_FILE);
  if (!fs.existsSync(tokenizerFile)) {
    throw new ArtifactError(`${tokenizerFile} is missing (only tokenizer.json tokenizers are supported)`, tokenizerFile);
  }
  const tokenizer = TextTokenizer.fromDir(dir);
  const chatTemplate = ChatTemplate.fromDir(dir, tokenizer);
  return { dir, config, rawConfig, weights, tokenizer, chatTemplate, generationConfig };
}
