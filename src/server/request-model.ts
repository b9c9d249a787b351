// What validating a request body and turning it into prompt ids needs from the served model: a few
// facts (plain data, the same on every thread) and its text work. ServedModel is one, on the event
// loop (small texts there, large ones on a text worker); a text worker that prepares a large body
// holds another (request-prep.ts, everything on that worker). Both build their jobs here and run
// the same prompt jobs (artifacts/prompt-jobs.ts), so both give the same ids and the same errors.

import type { ChatMessage, RenderOptions } from '../artifacts/chat-template.ts';
import { ContinueFinalError, type ChatJob } from '../artifacts/prompt-jobs.ts';
import { PromptTooLongError } from '../artifacts/token-bound.ts';
import type { ToolCallFormatName } from '../generation/tool-calls/index.ts';
import type { GrammarLimits } from '../sampling/grammar/index.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';
import { badRequest } from './http-error.ts';

export interface ModelFacts {
  /** the `model` name clients must use */
  readonly name: string;
  /** valid token ids are [0, vocabSize) */
  readonly vocabSize: number;
  /** prompt + generated tokens one sequence can hold */
  readonly contextLen: number;
  readonly samplingDefaults: SamplingParamsInput;
  /** how this model writes tool calls */
  readonly toolFormat: ToolCallFormatName;
  /** the chat template renders the `tools` variable (else tools are written into the messages) */
  readonly rendersTools: boolean;
  /** the chat template knows <think> */
  readonly thinks: boolean;
  readonly hasChatTemplate: boolean;
  /** what grammar specs are compiled under: a spec past the size limit is refused while the body is read */
  readonly grammarLimits: Readonly<GrammarLimits>;
}

export interface ChatRenderOptions {
  continueFinal?: boolean;
  addGenerationPrompt?: boolean;
  variables?: Record<string, unknown>;
  tools?: unknown[];
}

/** Prompt ids as a route hands them on: a list, or the Int32Array a text worker sent. */
export type PromptIds = readonly number[] | Int32Array;

export interface RequestModel extends ModelFacts {
  /** Completions prompts -> ids, with the tokenizer's special tokens; a text too long for the context is a 400 (`prompt`). */
  encodePrompts(texts: string[], signal?: AbortSignal): Promise<PromptIds[]>;
  /** A conversation rendered with the chat template and encoded (chatJobOf); a 400 (`messages`) as the job refuses it. */
  renderChat(messages: ChatMessage[], opts?: ChatRenderOptions, signal?: AbortSignal): Promise<{ ids: PromptIds; text: string }>;
}

/**
 * The job that renders and encodes a conversation. `continueFinal` leaves the last message open
 * (its text is continued instead of a new assistant turn: Anthropic prefill, vLLM
 * continue_final_message). A model without a chat template refuses it.
 */
export function chatJobOf(model: ModelFacts, messages: ChatMessage[], opts: ChatRenderOptions = {}): ChatJob {
  if (!model.hasChatTemplate)
    throw badRequest(`the model "${model.name}" has no chat template; use /v1/completions with a raw prompt`, 'messages', 'no_chat_template');
  const render: Omit<RenderOptions, 'now'> = {
    addGenerationPrompt: !opts.continueFinal && (opts.addGenerationPrompt ?? true), variables: opts.variables, tools: opts.tools,
  };
  return { kind: 'chat', messages, render, continueFinal: opts.continueFinal ?? false, contextLen: model.contextLen };
}

/** A prompt job's refusal as the request's 400: too long for the context, or a final message that cannot be continued. */
export function textRequestError(err: unknown, param: string): unknown {
  if (err instanceof PromptTooLongError) return badRequest(err.message, param, 'context_length_exceeded');
  if (err instanceof ContinueFinalError) return badRequest(err.message, 'messages');
  return err;
}

/** Ids as a list, converted once a route knows it will use them (a loop: Array.from of an Int32Array is several times slower). */
export function idList(ids: PromptIds): number[] {
  if (Array.isArray(ids)) return ids as number[];
  const out = new Array<number>(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = ids[i]!;
  return out;
}
