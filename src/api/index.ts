// The library API a Node application embeds: load a model directory once, then stream or collect
// completions. Text in, text out; everything below (tokenizer, template, engine, backend) is
// wired here so callers never touch it. startServer (serve.ts) starts the HTTP server of
// `llmts serve` from code, with its flags as ServeOptions.
//
//   const llm = await load({ model: 'models/demo' });
//   for await (const e of llm.generate({ prompt: 'def add(a, b):', maxTokens: 32 })) process.stdout.write(e.text);
//   await llm.close();
//
// Structured output mirrors the server's response_format / guided_* fields: at most one of
// responseFormat, guidedJson, guidedRegex, guidedChoice, guidedGrammar per request. The grammar is
// compiled (cached by content; checked and trial-compiled on a worker thread) before the request
// is queued; an invalid one rejects with GrammarSpecError carrying xgrammar's message.

import type { OnlineQuantization } from '../artifacts/online-quant.ts';
import type { Backend } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { type BackendSettings, openBackend, parseDevice } from '../execution/devices.ts';
import { loadDrafter } from './drafter.ts';
import { loadModel, type ChatMessage, type LoadedModel } from '../execution/load-model.ts';
import { ContextLengthError, Engine, type Completion, type EngineOptions } from '../execution/engine.ts';
import { checkFitsContext, PromptTooLongError } from '../artifacts/token-bound.ts';
import type { EngineRequest, SequenceEvent } from '../execution/sequence.ts';
import type { SpeculativeOptions } from '../execution/methods/speculative.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';
import { GrammarCompiler, GrammarSpecError, grammarVocabFrom, type CompiledGrammar, type GrammarSpec } from '../sampling/grammar/index.ts';

export type { ChatMessage, Completion, SequenceEvent, SamplingParamsInput, GrammarSpec, SpeculativeOptions };
export type { Proposer, Draft, SpeculationCounts } from '../execution/methods/method.ts';
export { GrammarSpecError, ContextLengthError };
export { startServer, type ServerHandle } from './serve.ts';
export type { BackendSettings } from '../execution/devices.ts';
export type { EngineSettings } from '../execution/engine-settings.ts';
export type { CpuSettings } from '../backends/cpu/cpu-settings.ts';
export type { CudaSettings, CudaSettingsOverrides } from '../backends/cuda/cuda-settings.ts';
export { ServeOptionsError, SERVE_DEFAULTS, type ServeOptions, type ServeOptionName } from './serve-options.ts';

/** OpenAI's `response_format`, as the server takes it. */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  /** no `schema`: any JSON object; the schema is always enforced strictly */
  | { type: 'json_schema'; json_schema: { name?: string; description?: string; schema?: unknown; strict?: boolean | null } };

export interface LoadOptions extends Omit<EngineOptions, 'draftModel'> {
  /** Hugging Face model directory */
  model: string;
  /**
   * the drafter of `speculative: { proposer: 'draft' | 'eagle3' }` (the default's or a
   * request's), loaded on the same backend: a draft model's directory (sharing the model's
   * tokenizer) or an EAGLE-3 head's (made for this model)
   */
  draftModel?: string;
  device?: 'auto' | 'cpu' | 'cuda';
  /**
   * the backend's knobs set in code, e.g. `{ cuda: { attention: { decodeKernel: 'cuda-core' } } }`
   * (cpu-settings.ts, cuda-settings.ts; the engine's are `pipeline`, `deviceSampling`, `graphs`);
   * whatever is not set here comes from the LLMTS_* environment
   */
  backendSettings?: BackendSettings;
  /** called with non-fatal notes (e.g. a context limit past what the model was built for) */
  onWarning?: (message: string) => void;
  /** CPU: quantize a safetensors checkpoint's matrices as they load ('q8_0' | 'q4_0'; README, "Quantizing at load") */
  quantization?: OnlineQuantization;
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
  /** output constraint, as the server's `response_format` (json_object, json_schema) */
  responseFormat?: ResponseFormat;
  /** JSON valid under this schema (an object, or its JSON text); the server's `guided_json` */
  guidedJson?: unknown;
  /** the whole output matches this regex; the server's `guided_regex` */
  guidedRegex?: string;
  /** exactly one of these strings; the server's `guided_choice` */
  guidedChoice?: string[];
  /** a sentence of this xgrammar EBNF grammar (`root ::= ...`); the server's `guided_grammar` */
  guidedGrammar?: string;
  /**
   * speculative decoding for this request (`{ proposer: 'ngram', numDraftTokens, ngramMin,
   * ngramMax }`), or false for none (default: load()'s `speculative`)
   */
  speculative?: SpeculativeOptions | false;
}

/** The constraint fields of GenerateOptions (not sampling parameters). */
type ConstraintFields = 'responseFormat' | 'guidedJson' | 'guidedRegex' | 'guidedChoice' | 'guidedGrammar';

/** guidedJson / json_schema.schema: a schema object (or boolean), or its JSON text */
function schemaOf(v: unknown, field: string): unknown {
  if (typeof v !== 'string') return v;
  try {
    return JSON.parse(v);
  } catch (err) {
    throw new GrammarSpecError(`${field} is not valid JSON: ${(err as Error).message}`);
  }
}

/** The request's output constraint, if any (at most one; a TypeError otherwise). */
export function constraintOf(o: Pick<GenerateOptions, ConstraintFields>): GrammarSpec | undefined {
  const found: [string, GrammarSpec][] = [];
  const rf = o.responseFormat;
  if (rf !== undefined) {
    if (rf === null || typeof rf !== 'object') throw new TypeError('responseFormat must be an object with a "type"');
    if (rf.type === 'json_object') found.push(['responseFormat', { type: 'json_object' }]);
    else if (rf.type === 'json_schema') {
      const schema = rf.json_schema?.schema ?? null;
      found.push(['responseFormat', schema === null ? { type: 'json_object' } : { type: 'json_schema', schema: schemaOf(schema, 'responseFormat.json_schema.schema') }]);
    } else if (rf.type !== 'text') throw new TypeError(`responseFormat.type must be "text", "json_object" or "json_schema", got ${JSON.stringify((rf as { type: unknown }).type)}`);
  }
  if (o.guidedJson !== undefined) found.push(['guidedJson', { type: 'json_schema', schema: schemaOf(o.guidedJson, 'guidedJson') }]);
  if (o.guidedRegex !== undefined) found.push(['guidedRegex', { type: 'regex', pattern: o.guidedRegex }]);
  if (o.guidedChoice !== undefined) found.push(['guidedChoice', { type: 'choice', choices: o.guidedChoice }]);
  if (o.guidedGrammar !== undefined) found.push(['guidedGrammar', { type: 'ebnf', grammar: o.guidedGrammar }]);
  if (found.length > 1) throw new TypeError(`give at most one output constraint; got ${found.map(([f]) => f).join(' and ')}`);
  return found[0]?.[1];
}

export class Llm {
  private grammar?: Promise<GrammarCompiler>;

  private constructor(
    private readonly backend: Backend,
    private readonly loaded: LoadedModel,
    readonly engine: Engine,
  ) {}

  static async load(opts: LoadOptions): Promise<Llm> {
    const backend = await openBackend(parseDevice(opts.device), opts.backendSettings);
    try {
      const loaded = await loadModel(backend, opts.model, { maxModelLen: opts.maxModelLen, onWarning: opts.onWarning, quantization: opts.quantization });
      const { draftModel: draftDir, quantization: _q, ...engineOpts } = opts;
      const proposer = typeof opts.speculative?.proposer === 'string' ? opts.speculative.proposer : undefined;
      const drafter = draftDir === undefined ? {} : await loadDrafter(backend, draftDir, loaded, proposer, opts.onWarning);
      return new Llm(backend, loaded, new Engine(loaded.model, loaded, { ...engineOpts, maxModelLen: loaded.maxContext, ...drafter }));
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

  /**
   * The prompt token ids a request runs on: its promptIds, its rendered messages, or its encoded
   * prompt. A text with more characters than the context's tokens can cover (the tokenizer's
   * longest token each) is refused with ContextLengthError before it is tokenized: tokenizing a
   * long run of one character takes time that grows faster than its length.
   */
  promptIdsOf(o: Pick<GenerateOptions, 'prompt' | 'messages' | 'promptIds'>): number[] {
    const given = [o.prompt, o.messages, o.promptIds].filter((x) => x !== undefined).length;
    if (given !== 1) throw new TypeError('give exactly one of prompt, messages or promptIds');
    if (o.promptIds) return o.promptIds;
    const tok = this.loaded.tokenizer;
    const fits = (text: string) => {
      try {
        checkFitsContext(text.length, tok.maxCharsPerToken, this.engine.maxModelLen);
      } catch (err) {
        throw err instanceof PromptTooLongError ? new ContextLengthError(err.message) : err;
      }
    };
    if (!o.messages) {
      fits(o.prompt!);
      return this.loaded.encode(o.prompt!);
    }
    const tpl = this.loaded.chatTemplate;
    if (!tpl) return this.loaded.applyChatTemplate(o.messages); // its error names the model
    const text = tpl.render(o.messages, { addGenerationPrompt: true });
    fits(text);
    return tok.encode(text, { addSpecialTokens: false });
  }

  private request(o: GenerateOptions): EngineRequest {
    const {
      prompt: _p, messages: _m, promptIds: _i, maxTokens, stop, ignoreEos, topLogprobs, signal: _s,
      responseFormat: _rf, guidedJson: _gj, guidedRegex: _gr, guidedChoice: _gc, guidedGrammar: _gg, speculative, ...sampling
    } = o;
    return {
      promptIds: this.promptIdsOf(o),
      maxTokens: maxTokens ?? 256,
      sampling: { ...this.loaded.samplingDefaults, ...dropUndefined(sampling) },
      stop,
      ignoreEos,
      topLogprobs,
      ...(speculative === undefined ? {} : { speculative }),
    };
  }

  /**
   * Streams token events, then one finish event. Breaking out of the loop cancels the request.
   * With an output constraint the request is queued once the loop starts and its grammar is
   * compiled (an invalid one throws GrammarSpecError from the loop).
   */
  generate(o: GenerateOptions): AsyncIterable<SequenceEvent> {
    const spec = specOf(o);
    const req = this.request(o);
    if (!spec) return this.engine.generate(req, { signal: o.signal });
    const self = this;
    return (async function* () {
      if (spec instanceof GrammarSpecError) throw spec;
      const g = await self.compile(spec);
      let stream: AsyncIterable<SequenceEvent>;
      try {
        stream = self.engine.generate(withGrammar(req, g), { signal: o.signal });
      } finally {
        g.release(); // the sequence holds its own matcher
      }
      yield* stream;
    })();
  }

  /** Runs to the end and returns the whole completion. */
  complete(o: GenerateOptions): Promise<Completion> {
    const spec = specOf(o);
    const req = this.request(o);
    if (!spec) return this.engine.complete(req, { signal: o.signal });
    if (spec instanceof GrammarSpecError) return Promise.reject(spec);
    return this.compile(spec).then((g) => {
      try {
        return this.engine.complete(withGrammar(req, g), { signal: o.signal });
      } finally {
        g.release();
      }
    });
  }

  /** Compiles a grammar spec for this model's vocabulary (cached by content); release() the lease. */
  private async compile(spec: GrammarSpec): Promise<CompiledGrammar> {
    return (await this.grammarCompiler()).compile(spec);
  }

  /** The grammar compiler, created on first use (loads xgrammar and indexes the vocabulary). */
  private grammarCompiler(): Promise<GrammarCompiler> {
    this.grammar ??= (async () => {
      const l = this.loaded;
      const compiler = new GrammarCompiler(grammarVocabFrom(l.tokenizer, l.config.vocabSize, l.eosIds));
      await compiler.warm();
      return compiler;
    })();
    const p = this.grammar;
    p.catch(() => {
      if (this.grammar === p) this.grammar = undefined;
    });
    return p;
  }

  /** Finishes running requests (up to graceMs), then frees the model and the backend. */
  async close(graceMs = 30_000): Promise<void> {
    await this.engine.close(graceMs);
    const grammar = this.grammar;
    this.grammar = undefined;
    await (await grammar?.catch(() => undefined))?.close();
    this.loaded.model.dispose();
    await this.backend.close();
  }
}

export const load = (opts: LoadOptions): Promise<Llm> => Llm.load(opts);

/** constraintOf, with an invalid spec (bad JSON text) returned, to be reported as compile errors are */
function specOf(o: GenerateOptions): GrammarSpec | GrammarSpecError | undefined {
  try {
    return constraintOf(o);
  } catch (err) {
    if (err instanceof GrammarSpecError) return err;
    throw err;
  }
}

function withGrammar(req: EngineRequest, g: CompiledGrammar): EngineRequest {
  return { ...req, grammar: { createMatcher: () => g.createMatcher() } };
}

function dropUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, x]) => x !== undefined)) as Partial<T>;
}
