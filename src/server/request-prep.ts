// A request body prepared for its route: parsed, validated and turned into prompt ids
// (chat-request.ts, completions-request.ts, anthropic-request.ts), everything short of the grammar
// compiler and the engine. A small body is prepared on the event loop. A large one is prepared on
// a text worker (ServedModel.prepareBody): its bytes are moved there, not copied; the worker
// parses them and runs the same preparation, and what comes back is compact (ids and logit
// biases as typed arrays, moved too; the parameters as a small plain object), so the event loop
// never parses, walks or deserialises the body's object graph. On the 2-core dev VM each of those
// takes 20-220 ms over a 4 MiB body of small objects (bench/server-stall.ts).
//
// This module is also the text workers' extension (createCustomJobRunner, text-worker.ts): the
// worker's RequestModel runs every text job where it is, with the same prompt jobs ServedModel
// places on the event loop or a worker, so both paths give the same ids and the same errors.

import type { ChatTemplate } from '../artifacts/chat-template.ts';
import { ChatTemplateError } from '../artifacts/chat-template.ts';
import { runChat, runEncode } from '../artifacts/prompt-jobs.ts';
import type { TextTokenizer } from '../artifacts/tokenizer.ts';
import type { CustomJobRunner } from '../artifacts/text-worker.ts';
import { toolCallFormat, type ToolCallFormatName } from '../generation/tool-calls/index.ts';
import type { GrammarLimits } from '../sampling/grammar/index.ts';
import { markValidatedBias, type SamplingParamsInput } from '../sampling/index.ts';
import { HttpError, type HttpErrorOptions } from './http-error.ts';
import type { JsonObject } from './fields.ts';
import { parseJsonObject } from './json-depth.ts';
import { prepareChat, type PreparedChat } from './chat-request.ts';
import { prepareCompletions, type PreparedCompletions } from './completions-request.ts';
import { prepareCountTokens, prepareMessages, type MessagesParams, type PreparedCountTokens, type PreparedMessages } from './anthropic-request.ts';
import type { GenerationParams } from './openai-params.ts';
import type { ToolPlan } from './structured.ts';
import { chatJobOf, textRequestError, type ChatRenderOptions, type ModelFacts, type PromptIds, type RequestModel } from './request-model.ts';
import type { ChatMessage } from '../artifacts/chat-template.ts';

export type Prepared = PreparedChat | PreparedCompletions | PreparedMessages | PreparedCountTokens;
export type BodyRoute = Prepared['route'];
export type PreparedOf<R extends BodyRoute> = Extract<Prepared, { route: R }>;

/** Prepares a parsed body for its route (wherever `model` runs its text work). */
export function prepareRequest(route: BodyRoute, body: JsonObject, model: RequestModel, signal?: AbortSignal): Promise<Prepared> {
  switch (route) {
    case 'chat': return prepareChat(body, model, signal);
    case 'completions': return prepareCompletions(body, model, signal);
    case 'messages': return prepareMessages(body, model, signal);
    case 'count_tokens': return prepareCountTokens(body, model, signal);
  }
}

// ---------------------------------------------------------------------------------------------
// What crosses between the threads

/** The facts a text worker's RequestModel is started with (grammar limits come with each job). */
export type WorkerFacts = Omit<ModelFacts, 'grammarLimits'>;

/** One body to prepare on a text worker; `bytes` is transferred. */
export interface BodyJob {
  route: BodyRoute;
  bytes: Uint8Array;
  limits: Readonly<GrammarLimits>;
}

/** logit_bias as validated: token ids and their biases */
interface PackedBias {
  ids: Int32Array;
  values: Float64Array;
}

type PackedSampling = Omit<SamplingParamsInput, 'logitBias'> & { logitBias?: PackedBias };
type PackedTools = Omit<ToolPlan, 'format'>;
type PackedParams = Omit<GenerationParams, 'sampling'> & { sampling: PackedSampling };
type PackedMessagesParams = Omit<MessagesParams, 'sampling' | 'tools'> & { sampling: PackedSampling; tools?: PackedTools };

type PackedPrepared =
  | { route: 'chat'; params: PackedParams; tools?: PackedTools; ids: Int32Array; opensThink: boolean }
  | { route: 'completions'; params: PackedParams; prompts: Int32Array[] }
  | { route: 'messages'; req: PackedMessagesParams; ids: Int32Array }
  | { route: 'count_tokens'; req: PackedMessagesParams; inputTokens: number };

/** A request's refusal as it crosses: an HttpError, a template's refusal (a 400 where clientErrorOf maps it), or anything else (a 500). */
type PackedError =
  | { kind: 'http'; status: number; message: string; options: HttpErrorOptions }
  | { kind: 'template'; message: string }
  | { kind: 'internal'; message: string };

export type BodyReply = { ok: true; prepared: PackedPrepared } | { ok: false; error: PackedError };

/** `prepared` as the compact value a worker posts back, and the buffers it moves with it. */
export function packPrepared(prepared: Prepared): { value: PackedPrepared; transfer: ArrayBuffer[] } {
  const transfer: ArrayBuffer[] = [];
  const ids = (x: PromptIds): Int32Array => {
    const a = x instanceof Int32Array ? x : Int32Array.from(x);
    transfer.push(a.buffer as ArrayBuffer);
    return a;
  };
  const sampling = (s: SamplingParamsInput): PackedSampling => {
    const { logitBias, ...rest } = s;
    if (logitBias === undefined) return rest;
    const entries = logitBias instanceof Map ? [...logitBias.entries()] : Object.entries(logitBias);
    // validated: every key a canonical token id, named once
    const bias: PackedBias = { ids: new Int32Array(entries.length), values: new Float64Array(entries.length) };
    entries.forEach(([k, v], i) => {
      bias.ids[i] = Number(k);
      bias.values[i] = v;
    });
    transfer.push(bias.ids.buffer as ArrayBuffer, bias.values.buffer as ArrayBuffer);
    return { ...rest, logitBias: bias };
  };
  const tools = (t: ToolPlan | undefined): PackedTools | undefined => {
    if (!t) return undefined;
    const { format: _format, ...rest } = t;
    return rest;
  };
  const messagesParams = (r: MessagesParams): PackedMessagesParams => ({ ...r, sampling: sampling(r.sampling), tools: tools(r.tools) });
  let value: PackedPrepared;
  switch (prepared.route) {
    case 'chat':
      value = { ...prepared, params: { ...prepared.params, sampling: sampling(prepared.params.sampling) }, tools: tools(prepared.tools), ids: ids(prepared.ids) };
      break;
    case 'completions':
      value = { ...prepared, params: { ...prepared.params, sampling: sampling(prepared.params.sampling) }, prompts: prepared.prompts.map(ids) };
      break;
    case 'messages':
      value = { ...prepared, req: messagesParams(prepared.req), ids: ids(prepared.ids) };
      break;
    case 'count_tokens':
      value = { ...prepared, req: messagesParams(prepared.req) };
      break;
  }
  return { value, transfer };
}

/** The prepared request a worker's reply describes, for the model that sent the job. */
export function unpackPrepared(value: PackedPrepared, model: Pick<ModelFacts, 'toolFormat' | 'vocabSize'>): Prepared {
  const sampling = (s: PackedSampling): SamplingParamsInput => {
    const { logitBias, ...rest } = s;
    if (logitBias === undefined) return rest;
    const map = new Map<number, number>();
    for (let i = 0; i < logitBias.ids.length; i++) map.set(logitBias.ids[i]!, logitBias.values[i]!);
    // the worker validated it against this model's vocabulary, as the event loop would have
    markValidatedBias(map, model.vocabSize);
    return { ...rest, logitBias: map };
  };
  const tools = (t: PackedTools | undefined): ToolPlan | undefined => (t ? { ...t, format: toolCallFormat(model.toolFormat) } : undefined);
  const messagesParams = (r: PackedMessagesParams): MessagesParams => ({ ...r, sampling: sampling(r.sampling), tools: tools(r.tools) });
  switch (value.route) {
    case 'chat': return { ...value, params: { ...value.params, sampling: sampling(value.params.sampling) }, tools: tools(value.tools) };
    case 'completions': return { ...value, params: { ...value.params, sampling: sampling(value.params.sampling) } };
    case 'messages': return { ...value, req: messagesParams(value.req) };
    case 'count_tokens': return { ...value, req: messagesParams(value.req) };
  }
}

export function packError(err: unknown): PackedError {
  if (err instanceof HttpError) return { kind: 'http', status: err.status, message: err.message, options: err.options };
  if (err instanceof ChatTemplateError) return { kind: 'template', message: err.message };
  return { kind: 'internal', message: err instanceof Error ? err.stack ?? err.message : String(err) };
}

/** The error to throw for a refusal a worker sent back. */
export function unpackError(e: PackedError): Error {
  if (e.kind === 'http') return new HttpError(e.status, e.message, e.options);
  if (e.kind === 'template') return new ChatTemplateError(e.message);
  return new Error(`preparing the request body on a text worker failed: ${e.message}`);
}

// ---------------------------------------------------------------------------------------------
// The text worker's side

/** A text worker's model: the facts it was started with, every text job run on this thread. */
class WorkerModel implements RequestModel {
  readonly name: string;
  readonly vocabSize: number;
  readonly contextLen: number;
  readonly samplingDefaults: SamplingParamsInput;
  readonly toolFormat: ToolCallFormatName;
  readonly rendersTools: boolean;
  readonly thinks: boolean;
  readonly hasChatTemplate: boolean;
  grammarLimits: Readonly<GrammarLimits> = { maxSpecBytes: 0, maxDepth: 0, maxShortestChars: 0 };

  constructor(facts: WorkerFacts, private readonly tokenizer: TextTokenizer, private readonly template: ChatTemplate | undefined) {
    this.name = facts.name;
    this.vocabSize = facts.vocabSize;
    this.contextLen = facts.contextLen;
    this.samplingDefaults = facts.samplingDefaults;
    this.toolFormat = facts.toolFormat;
    this.rendersTools = facts.rendersTools;
    this.thinks = facts.thinks;
    this.hasChatTemplate = facts.hasChatTemplate && template !== undefined;
  }

  async encodePrompts(texts: string[]): Promise<PromptIds[]> {
    try {
      return runEncode(this.tokenizer, { kind: 'encode', texts, addSpecialTokens: true, contextLen: this.contextLen });
    } catch (err) {
      throw textRequestError(err, 'prompt');
    }
  }

  async renderChat(messages: ChatMessage[], opts?: ChatRenderOptions): Promise<{ ids: PromptIds; text: string }> {
    const job = chatJobOf(this, messages, opts);
    try {
      return runChat(this.template!, this.tokenizer, job);
    } catch (err) {
      throw textRequestError(err, 'messages');
    }
  }
}

/** The text workers' extension (text-worker.ts TextWorkerExtension): prepares each BodyJob, answering a BodyReply. */
export function createCustomJobRunner(data: unknown, loaded: { tokenizer: TextTokenizer; template?: ChatTemplate }): CustomJobRunner {
  const model = new WorkerModel(data as WorkerFacts, loaded.tokenizer, loaded.template);
  return async (payload) => {
    const job = payload as BodyJob;
    try {
      model.grammarLimits = job.limits;
      const body = parseJsonObject(Buffer.from(job.bytes.buffer, job.bytes.byteOffset, job.bytes.byteLength));
      const { value, transfer } = packPrepared(await prepareRequest(job.route, body, model));
      return { value: { ok: true, prepared: value } satisfies BodyReply, transfer };
    } catch (err) {
      return { value: { ok: false, error: packError(err) } satisfies BodyReply };
    }
  };
}
