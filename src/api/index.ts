// The library API a Node application embeds: load a model directory once, then stream or collect
// completions. Text in, text out; everything below (tokenizer, template, engine, backend) is
// wired here so callers never touch it.
//
//   const llm = await load({ model: 'models/demo' });
//   for await (const e of llm.generate({ prompt: 'def add(a, b):', maxTokens: 32 })) process.stdout.write(e.text);
//   await llm.close();

import type { Backend } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { openBackend, parseDevice } from '../execution/devices.ts';
import { loadModel, type ChatMessage, type LoadedModel } from '../execution/load-model.ts';
import { Engine, type Completion, type EngineOptions } from '../execution/engine.ts';
import type { EngineRequest, SequenceEvent } from '../execution/sequence.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';

export type { ChatMessage, Completion, SequenceEvent, SamplingParamsInput };

export interface LoadOptions extends EngineOptions {
  /** Hugging Face model directory */
  model: string;
  device?: 'auto' | 'cpu' | 'cuda';
  /** called with non-fatal notes (e.g. a context limit past what the model was built for) */
  onWarning?: (message: string) => void;
}

export interface GenerateOptions extends SamplingParamsInput {
  /** raw completion text (no template) */
  prompt?: string;
  /** chat messages, rendered with the model's chat template */
  messages?: ChatMessage[];
  /** token ids, used as they are */
  promptIds?: number[];
  /** default 256 */
  maxTokens?: number;
  stop?: string[];
  ignoreEos?: boolean;
  topLogprobs?: number;
  signal?: AbortSignal;
}

export class Llm {
  private constructor(
    private readonly backend: Backend,
    private readonly loaded: LoadedModel,
    readonly engine: Engine,
  ) {}

  static async load(opts: LoadOptions): Promise<Llm> {
    const backend = await openBackend(parseDevice(opts.device));
    try {
      const loaded = await loadModel(backend, opts.model, { maxModelLen: opts.maxModelLen, onWarning: opts.onWarning });
      return new Llm(backend, loaded, new Engine(loaded.model, loaded, { ...opts, maxModelLen: loaded.maxContext }));
    } catch (err) {
      await backend.close();
      throw err;
    }
  }

  get config(): ModelConfig {
    return this.loaded.config;
  }

  encode(text: string): number[] {
    return this.loaded.encode(text);
  }

  decode(ids: number[]): string {
    return this.loaded.decode(ids);
  }

  /** The prompt token ids a request runs on: its promptIds, its rendered messages, or its encoded prompt. */
  promptIdsOf(o: Pick<GenerateOptions, 'prompt' | 'messages' | 'promptIds'>): number[] {
    const given = [o.prompt, o.messages, o.promptIds].filter((x) => x !== undefined).length;
    if (given !== 1) throw new TypeError('give exactly one of prompt, messages or promptIds');
    return o.promptIds ?? (o.messages ? this.loaded.applyChatTemplate(o.messages) : this.loaded.encode(o.prompt!));
  }

  private request(o: GenerateOptions): EngineRequest {
    const { prompt: _p, messages: _m, promptIds: _i, maxTokens, stop, ignoreEos, topLogprobs, signal: _s, ...sampling } = o;
    return {
      promptIds: this.promptIdsOf(o),
      maxTokens: maxTokens ?? 256,
      sampling: { ...this.loaded.samplingDefaults, ...dropUndefined(sampling) },
      stop,
      ignoreEos,
      topLogprobs,
    };
  }

  /** Streams token events, then one finish event. Breaking out of the loop cancels the request. */
  generate(o: GenerateOptions): AsyncIterable<SequenceEvent> {
    return this.engine.generate(this.request(o), { signal: o.signal });
  }

  /** Runs to the end and returns the whole completion. */
  complete(o: GenerateOptions): Promise<Completion> {
    return this.engine.complete(this.request(o), { signal: o.signal });
  }

  /** Finishes running requests (up to graceMs), then frees the model and the backend. */
  async close(graceMs = 30_000): Promise<void> {
    await this.engine.close(graceMs);
    this.loaded.model.dispose();
    await this.backend.close();
  }
}

export const load = (opts: LoadOptions): Promise<Llm> => Llm.load(opts);

function dropUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, x]) => x !== undefined)) as Partial<T>;
}
