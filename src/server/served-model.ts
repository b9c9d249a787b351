// What the wire formats need to know about the model being served: its name, text helpers, the
// chat template, and the longest sequence a request can actually get (the context, further
// bounded by the KV cache the engine was given).

import type { Engine } from '../execution/engine.ts';
import type { LoadedModel } from '../execution/load-model.ts';
import type { ChatMessage, ChatTemplate } from '../artifacts/chat-template.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';
import { TokenTexts } from './token-text.ts';
import { GrammarCompiler, grammarDefaults, grammarVocabFrom, type GrammarLimits } from '../sampling/grammar/index.ts';
import { detectToolCallFormat, templateRendersTools, toolCallFormat, type ToolCallFormatName } from '../generation/tool-calls/index.ts';
import { ClientGoneError, parseJsonObject } from './http-io.ts';
import { checkFitsContext } from '../artifacts/token-bound.ts';
import { renderChatText, runChat, textWeight, type ChatJob } from '../artifacts/prompt-jobs.ts';
import { TextJobAbortedError, TextWorkerPool, TextWorkerStartError, type PoolStats, type TextWorkerPoolOptions } from '../artifacts/text-worker-pool.ts';
import { chatJobOf, textRequestError, type ChatRenderOptions, type RequestModel } from './request-model.ts';
import { prepareRequest, unpackError, unpackPrepared, type BodyJob, type BodyReply, type BodyRoute, type Prepared, type WorkerFacts } from './request-prep.ts';

/**
 * Text work (characters to tokenize, or a conversation's textWeight) above this runs on a text
 * worker; up to it, here: a short chat message tokenizes in about the time a worker round trip
 * adds, and even the slowest text this long (a run of one character) takes a few milliseconds.
 */
export const INLINE_TEXT_WEIGHT = 1024;

/**
 * Request bodies larger than this are parsed and prepared on a text worker (request-prep.ts); up
 * to it, here. bench/body-cost.figures.csv (2-core dev VM): the costliest body of this size
 * (chat_template_kwargs of 5203 keys: parsed, walked, copied to a text worker to render) keeps the
 * event loop busy 13 ms, the other shapes at most 5 ms; at 4 MiB the same shapes keep it busy up
 * to 0.6 s when prepared here, at most 3 ms when prepared on a worker.
 */
export const INLINE_BODY_BYTES = 64 * 1024;

export interface ServedModelOptions {
  /** the text worker pool's size and heap limits */
  workers?: Omit<TextWorkerPoolOptions, 'extension'>;
  /** default INLINE_TEXT_WEIGHT */
  inlineWeight?: number;
  /** default INLINE_BODY_BYTES */
  inlineBodyBytes?: number;
}

/** Where request bodies were prepared: on this thread, or on a text worker. */
export interface BodyStats {
  inline: number;
  worker: number;
}

export class ServedModel implements RequestModel {
  readonly created = Math.floor(Date.now() / 1000);
  /** valid token ids are [0, vocabSize) */
  readonly vocabSize: number;
  /** prompt + generated tokens one sequence can hold here */
  readonly contextLen: number;
  readonly eosIds: ReadonlySet<number>;
  readonly samplingDefaults: SamplingParamsInput;
  readonly chatTemplate?: ChatTemplate;
  readonly tokens: TokenTexts;
  /** the chat template knows <think>: split reasoning from content in chat responses */
  readonly thinks: boolean;
  /** how this model writes tool calls */
  readonly toolFormat: ToolCallFormatName;
  /** the chat template renders the `tools` variable (else tools are written into the messages) */
  readonly rendersTools: boolean;
  /** ids of control tokens the tool-call parser must see although decoding drops them */
  readonly toolTriggerTokens: ReadonlyMap<number, string>;
  readonly hasChatTemplate: boolean;
  private grammar?: Promise<GrammarCompiler>;
  private textPool?: TextWorkerPool;
  private readonly inlineWeight: number;
  private readonly inlineBodyBytes: number;
  private readonly bodies: BodyStats = { inline: 0, worker: 0 };

  constructor(
    readonly name: string,
    private readonly loaded: LoadedModel,
    engine: Engine,
    /** overrides the tool-call format detected from the template and vocabulary */
    toolFormat?: ToolCallFormatName,
    private readonly textOpts: ServedModelOptions = {},
  ) {
    this.inlineWeight = textOpts.inlineWeight ?? INLINE_TEXT_WEIGHT;
    this.inlineBodyBytes = textOpts.inlineBodyBytes ?? INLINE_BODY_BYTES;
    // ids the model can score AND the tokenizer can decode (a padded embedding has more rows)
    this.vocabSize = Math.min(loaded.config.vocabSize, loaded.tokenizer.vocabSize);
    this.eosIds = new Set(loaded.eosIds);
    this.samplingDefaults = loaded.samplingDefaults;
    this.chatTemplate = loaded.chatTemplate;
    this.hasChatTemplate = loaded.chatTemplate !== undefined;
    this.tokens = new TokenTexts(loaded.tokenizer);
    this.thinks = Object.values(loaded.chatTemplate?.sources ?? {}).some((s) => s.includes('<think>'));
    const templates = Object.values(loaded.chatTemplate?.sources ?? {});
    const hasToken = (t: string) => loaded.tokenizer.tokenToId(t) !== undefined;
    this.toolFormat = toolFormat ?? detectToolCallFormat(templates, hasToken);
    this.rendersTools = templates.some(templateRendersTools);
    const triggers = new Map<number, string>();
    for (const t of toolCallFormat(this.toolFormat).triggerStrings) {
      const id = loaded.tokenizer.tokenToId(t);
      if (id !== undefined) triggers.set(id, t);
    }
    this.toolTriggerTokens = triggers;
    // Full-attention KV groups hold every token of a sequence; sliding ones only their window.
    const bs = engine.kv.shape.blockSize;
    let kvTokens = Infinity;
    for (const g of engine.kv.groups) if (g.spec.window === 0) kvTokens = Math.min(kvTokens, g.pool.numBlocks * bs);
    this.contextLen = Math.min(engine.maxModelLen, kvTokens);
  }

  /**
   * The grammar compiler for this model's tokenizer, created on first use (the first structured
   * request pays ~0.4 s to start the check worker and a grammar host, and index the vocabulary).
   */
  grammarCompiler(): Promise<GrammarCompiler> {
    this.grammar ??= (async () => {
      const vocab = grammarVocabFrom(this.loaded.tokenizer, this.loaded.config.vocabSize, this.loaded.eosIds);
      const compiler = new GrammarCompiler(vocab);
      await compiler.warm();
      return compiler;
    })();
    const p = this.grammar;
    p.catch(() => {
      if (this.grammar === p) this.grammar = undefined;
    });
    return p;
  }

  /** the limits the grammar compiler checks specs against (a spec past the size limit is refused while its body is prepared) */
  get grammarLimits(): Readonly<GrammarLimits> {
    return grammarDefaults().limits;
  }

  /**
   * A request body parsed and prepared for its route (request-prep.ts): here when it is at most
   * `inlineBodyBytes`, else on a text worker, its bytes moved there (`raw` is unusable after).
   * Either way the same code parses and validates it, so both refuse a body with the same 400. A
   * job cancelled by `signal` (the client left) ends the request quietly; when no worker can
   * start, the body is prepared here.
   */
  async prepareBody(route: BodyRoute, raw: Buffer, signal?: AbortSignal): Promise<Prepared> {
    const inline = () => {
      this.bodies.inline++;
      return prepareRequest(route, parseJsonObject(raw), this, signal);
    };
    if (raw.length <= this.inlineBodyBytes) return inline();
    // a Buffer this large owns its memory; anything else is copied into memory of its own first
    const bytes = raw.byteOffset === 0 && raw.byteLength === raw.buffer.byteLength ? raw : new Uint8Array(raw);
    const job: BodyJob = { route, bytes, limits: this.grammarLimits };
    let reply: BodyReply;
    try {
      reply = (await this.pool().custom(job, [bytes.buffer as ArrayBuffer], signal)) as BodyReply;
    } catch (err) {
      if (err instanceof TextWorkerStartError) return inline();
      throw this.textError(err, 'messages');
    }
    this.bodies.worker++;
    if (!reply.ok) throw unpackError(reply.error);
    return unpackPrepared(reply.prepared, this);
  }

  /** How many request bodies were prepared here and on text workers. */
  get bodyStats(): Readonly<BodyStats> {
    return { ...this.bodies };
  }

  /**
   * Completions prompts -> ids, with the tokenizer's special tokens (BOS). A prompt longer than the
   * context whatever its tokens is refused first, from its length (checkFitsContext); prompts of
   * more than INLINE_TEXT_WEIGHT characters in all are tokenized on a text worker.
   */
  async encodePrompts(texts: string[], signal?: AbortSignal): Promise<number[][]> {
    for (const t of texts) this.refuseUnfittable(t.length, 'prompt');
    const total = texts.reduce((a, t) => a + t.length, 0);
    const inline = () => texts.map((t) => this.loaded.tokenizer.encode(t, { addSpecialTokens: true }));
    if (total <= this.inlineWeight) return inline();
    return this.offThread((pool) => pool.encode({ texts, addSpecialTokens: true }, signal), inline, 'prompt');
  }

  /** Refuses, before tokenizing it, a text too long for the context whatever its tokens. */
  private refuseUnfittable(chars: number, param: string): void {
    try {
      checkFitsContext(chars, this.loaded.tokenizer.maxCharsPerToken, this.contextLen);
    } catch (err) {
      throw this.textError(err, param);
    }
  }

  /**
   * Runs text work on a text worker; the pool's errors become the request's: a prompt too long
   * for the context or not continuable is a 400, a cancelled job (the client left) ends the
   * request quietly, and when no worker can start the work runs here instead.
   */
  private async offThread<T>(work: (pool: TextWorkerPool) => Promise<T>, inline: () => T, param: string): Promise<T> {
    try {
      return await work(this.pool());
    } catch (err) {
      if (err instanceof TextWorkerStartError) return inline();
      throw this.textError(err, param);
    }
  }

  /** The text workers, started on first use; they prepare large bodies too (request-prep.ts is their extension). */
  private pool(): TextWorkerPool {
    if (!this.textPool) {
      const facts: WorkerFacts = {
        name: this.name, vocabSize: this.vocabSize, contextLen: this.contextLen, samplingDefaults: this.samplingDefaults,
        toolFormat: this.toolFormat, rendersTools: this.rendersTools, thinks: this.thinks, hasChatTemplate: this.hasChatTemplate,
      };
      this.textPool = new TextWorkerPool(this.loaded.tokenizer, this.loaded.chatTemplate, {
        ...this.textOpts.workers, extension: { url: new URL('./request-prep.ts', import.meta.url).href, data: facts },
      });
    }
    return this.textPool;
  }

  private textError(err: unknown, param: string): unknown {
    if (err instanceof TextJobAbortedError) return new ClientGoneError('the client disconnected');
    return textRequestError(err, param);
  }

  /** The text workers' counts (none started yet: all zero). */
  get textWorkers(): PoolStats {
    return this.textPool?.stats ?? { workers: 0, running: 0, queued: 0, started: 0, died: 0 };
  }

  /** Stops the text workers (they never keep the process alive; this frees them sooner). */
  async close(): Promise<void> {
    const pool = this.textPool;
    this.textPool = undefined;
    await pool?.close();
  }

  decode(ids: readonly number[]): string {
    return this.loaded.decode([...ids]);
  }

  /**
   * Renders a conversation with the model's template and encodes it (request-model.ts chatJobOf).
   * Returns the ids and the rendered text. A conversation of more than INLINE_TEXT_WEIGHT
   * (textWeight) is rendered and encoded on a text worker; a smaller one is rendered here, and its
   * text encoded here when it is that short too.
   */
  async renderChat(messages: ChatMessage[], opts: ChatRenderOptions = {}, signal?: AbortSignal): Promise<{ ids: number[]; text: string }> {
    const job = chatJobOf(this, messages, opts);
    const tpl = this.chatTemplate!;
    const tok = this.loaded.tokenizer;
    const weight = textWeight(messages) + textWeight(opts.tools ?? null) + textWeight(opts.variables ?? null);
    if (weight > this.inlineWeight) {
      return this.offThread((pool) => pool.chat(job, signal), () => this.chatInline(tpl, job), 'messages');
    }
    let text: string;
    try {
      text = renderChatText(tpl, job);
    } catch (err) {
      throw this.textError(err, 'messages');
    }
    this.refuseUnfittable(text.length, 'messages');
    if (text.length <= this.inlineWeight) return { ids: tok.encode(text, { addSpecialTokens: false }), text };
    const [ids] = await this.offThread((pool) => pool.encode({ texts: [text], addSpecialTokens: false }, signal),
      () => [tok.encode(text, { addSpecialTokens: false })], 'messages');
    return { ids, text };
  }

  private chatInline(tpl: ChatTemplate, job: ChatJob): { ids: number[]; text: string } {
    try {
      return runChat(tpl, this.loaded.tokenizer, job);
    } catch (err) {
      throw this.textError(err, 'messages');
    }
  }
}
