// A /v1/messages (or count_tokens) body, validated and turned into prompt ids: the system prompt
// becomes a leading system message, content blocks become template messages (tool_use blocks
// OpenAI-style tool calls, tool_result blocks `tool` messages), a final assistant message is a
// prefill; then the conversation is rendered and encoded. The same code runs on the event loop for
// a small body and on a text worker for a large one (request-prep.ts), so both refuse with the
// same 400s.

import type { SpeculativeOptions } from '../execution/methods/speculative.ts';
import { speculativeParam } from './openai-params.ts';
import type { ChatMessage } from '../artifacts/chat-template.ts';
import { validatedLogitBias, validateSamplingParams, type SamplingParamsInput } from '../sampling/index.ts';
import { badRequest, notSupported } from './http-error.ts';
import { Fields, isObject, type Json, type JsonObject } from './fields.ts';
import { checkModel, MAX_STOPS } from './openai-params.ts';
import { oversizedSpecReason, parseAnthropicTools, planTools, toolMessages, type Constraint, type ToolPlan } from './structured.ts';
import type { ModelFacts, PromptIds, RequestModel } from './request-model.ts';

const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

/** a string or a list of text blocks -> text */
function blocksText(v: Json | undefined, where: string, param: string): string {
  if (typeof v === 'string') return v;
  if (!Array.isArray(v)) throw badRequest(`${where} must be a string or an array of content blocks, got ${kind(v)}`, param);
  return v.map((b, j) => {
    if (!isObject(b) || typeof b.type !== 'string') throw badRequest(`${where}[${j}] must be a content block object with a "type"`, param);
    if (b.type !== 'text') throw notSupported(`content block type "${b.type}" (${where}[${j}])`, param);
    if (typeof b.text !== 'string') throw badRequest(`${where}[${j}].text must be a string, got ${kind(b.text)}`, param);
    return b.text;
  }).join('\n');
}

/** a tool_result's content: a string or text blocks */
function toolResultText(v: Json | undefined, where: string): string {
  if (v === undefined || v === null) return '';
  return blocksText(v, where, 'messages');
}

/**
 * One Anthropic message as template messages: text blocks joined; an assistant's tool_use blocks
 * become OpenAI-style tool_calls; a user's tool_result blocks become `tool` messages (before the
 * user's own text, as Anthropic requires results to come first).
 */
function convertMessage(role: 'user' | 'assistant' | 'system', content: Json | undefined, where: string): ChatMessage[] {
  if (role === 'system') return [{ role, content: blocksText(content, where, 'messages') }];
  if (typeof content === 'string') return [{ role, content }];
  if (!Array.isArray(content)) throw badRequest(`${where} must be a string or an array of content blocks, got ${kind(content)}`, 'messages');
  const texts: string[] = [];
  const thoughts: string[] = [];
  const calls: unknown[] = [];
  const results: ChatMessage[] = [];
  content.forEach((b, j) => {
    const at = `${where}[${j}]`;
    if (!isObject(b) || typeof b.type !== 'string') throw badRequest(`${at} must be a content block object with a "type"`, 'messages');
    if (b.type === 'text') {
      if (typeof b.text !== 'string') throw badRequest(`${at}.text must be a string, got ${kind(b.text)}`, 'messages');
      texts.push(b.text);
    } else if (b.type === 'thinking' && role === 'assistant') {
      // earlier reasoning (a conversation carried over): the template renders it if it renders
      // reasoning_content, else it is left out; its signature is not checked (nothing here signs)
      if (typeof b.thinking !== 'string') throw badRequest(`${at}.thinking must be a string, got ${kind(b.thinking)}`, 'messages');
      thoughts.push(b.thinking);
    } else if (b.type === 'redacted_thinking' && role === 'assistant') {
      // another server's encrypted reasoning: nothing here can read it, so it is left out
    } else if (b.type === 'tool_use' && role === 'assistant') {
      if (typeof b.id !== 'string' || typeof b.name !== 'string') throw badRequest(`${at} (tool_use) needs a string id and name`, 'messages');
      calls.push({ id: b.id, type: 'function', function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } });
    } else if (b.type === 'tool_result' && role === 'user') {
      if (typeof b.tool_use_id !== 'string') throw badRequest(`${at}.tool_use_id must be a string`, 'messages');
      const text = toolResultText(b.content, `${at}.content`);
      results.push({ role: 'tool', tool_call_id: b.tool_use_id, content: b.is_error === true ? `Error: ${text}` : text });
    } else throw notSupported(`content block type "${b.type}" in ${role === 'assistant' ? 'an' : 'a'} ${role} message (${at})`, 'messages');
  });
  const out: ChatMessage[] = [...results];
  const reasoning = thoughts.length > 0 ? { reasoning_content: thoughts.join('\n') } : {};
  if (calls.length > 0) out.push({ role, content: texts.join('\n'), tool_calls: calls, ...reasoning });
  else if (texts.length > 0 || results.length === 0 || thoughts.length > 0) out.push({ role, content: texts.join('\n'), ...reasoning });
  return out;
}

export interface MessagesRequest {
  messages: ChatMessage[];
  /** the last message is an assistant prefill */
  prefill: boolean;
  maxTokens: number;
  sampling: SamplingParamsInput;
  stop: string[];
  stream: boolean;
  tools?: ToolPlan;
  /** output_config.format, or the tools' forcing grammar */
  constraint?: Constraint;
  /** template variables (`thinking` as enable_thinking) */
  variables?: Record<string, unknown>;
  /** llmts's `speculative`, as on chat completions (openai-params.ts speculativeParam) */
  speculative?: SpeculativeOptions | false;
}

/** `countTokens`: for /v1/messages/count_tokens, whose refusals of output_config.format name the schema */
export function parseMessagesRequest(body: JsonObject, model: ModelFacts, countTokens = false): MessagesRequest {
  const f = new Fields(body);
  checkModel(f, model);
  const maxTokens = f.number('max_tokens', { integer: true, min: 1 });
  if (maxTokens === undefined) throw badRequest('max_tokens is required', 'max_tokens');
  const raw = f.array('messages');
  if (raw === undefined) throw badRequest('messages is required', 'messages');
  if (raw.length === 0) throw badRequest('messages must not be empty', 'messages');
  const messages: ChatMessage[] = [];
  const system = f.raw('system');
  if (system !== undefined) messages.push({ role: 'system', content: blocksText(system, 'system', 'system') });
  raw.forEach((m, i) => {
    const where = `messages[${i}]`;
    if (!isObject(m)) throw badRequest(`${where} must be an object, got ${kind(m)}`, 'messages');
    // a system message anywhere in the conversation (Claude Code sends one there), rendered where
    // it stands, as the template renders system messages
    if (m.role !== 'user' && m.role !== 'assistant' && m.role !== 'system') {
      throw badRequest(`${where}.role must be "user", "assistant" or "system", got ${JSON.stringify(m.role ?? null)}`, 'messages');
    }
    messages.push(...convertMessage(m.role, m.content, `${where}.content`));
  });
  const last = messages[messages.length - 1];
  let prefill = last.role === 'assistant' && last.tool_calls === undefined;
  if (prefill && (messages[messages.length - 1].content as string).trim() === '') {
    messages.pop(); // an empty prefill is no prefill
    prefill = false;
  }
  if (messages.length === 0 || messages.every((m) => m.role === 'system')) throw badRequest('messages must contain a user message', 'messages');

  const tools = planTools(model, parseAnthropicTools(f));
  let constraint: Constraint | undefined = tools?.constraint;
  const variables = thinkingVariables(f, countTokens ? Infinity : maxTokens);
  const format = f.object('output_config')?.object('format');
  if (format) {
    if (format.raw('type') !== 'json_schema') throw badRequest('output_config.format.type must be "json_schema"', 'output_config');
    const schema = format.raw('schema');
    if (!isObject(schema)) throw badRequest('output_config.format.schema must be a JSON schema object', 'output_config');
    if (constraint) throw badRequest('output_config.format cannot be combined with a tool_choice that forces a tool', 'output_config');
    constraint = { spec: { type: 'json_schema', schema }, param: 'output_config' };
    // the 400 its check (count_tokens) or compile (messages) would give
    const big = oversizedSpecReason(constraint.spec, model.grammarLimits);
    if (big) throw badRequest(countTokens ? `output_config.format.schema: ${big}` : big, 'output_config', 'invalid_grammar');
  }
  f.object('metadata');

  const explicit: SamplingParamsInput = {
    temperature: f.number('temperature', { min: 0, max: 1 }),
    topP: f.number('top_p'),
    topK: f.number('top_k', { integer: true, min: 0 }),
  };
  const sampling: SamplingParamsInput = { ...model.samplingDefaults };
  for (const [k, v] of Object.entries(explicit)) if (v !== undefined) (sampling as Record<string, unknown>)[k] = v;
  const issues = validateSamplingParams(sampling, model.vocabSize);
  if (issues.length > 0) throw badRequest(issues.map((i) => i.message).join('; '), issues[0].param);
  // resolved once: the request's sequences share it (their Samplers neither check nor copy it again)
  if (sampling.logitBias !== undefined) sampling.logitBias = validatedLogitBias(sampling.logitBias, model.vocabSize);
  const stopRaw = f.array('stop_sequences') ?? [];
  if (stopRaw.length > MAX_STOPS) throw badRequest(`stop_sequences has ${stopRaw.length} entries; at most ${MAX_STOPS} are allowed`, 'stop_sequences');
  const stop = stopRaw.map((s, i) => {
    if (typeof s !== 'string') throw badRequest(`stop_sequences[${i}] must be a string, got ${kind(s)}`, 'stop_sequences');
    return s;
  });
  return {
    messages, prefill, maxTokens, sampling, stop, stream: f.boolean('stream') ?? false, tools, constraint, ...(variables ? { variables } : {}),
    ...speculativeParam(f.raw('speculative')),
  };
}

/** Anthropic's smallest thinking budget */
const MIN_THINKING_BUDGET = 1024;

/**
 * `thinking` as the template's reasoning switch, `enable_thinking` (Qwen3's and others'; a
 * template without it ignores it): "enabled" (with a budget_tokens of at least 1024 and below
 * max_tokens, as Anthropic requires; the budget itself is not enforced) turns it on, "disabled"
 * off, "adaptive" leaves the template's default.
 */
function thinkingVariables(f: Fields, maxTokens: number): Record<string, unknown> | undefined {
  const thinking = f.object('thinking');
  if (!thinking) return undefined;
  const mode = thinking.raw('type');
  if (mode === 'adaptive') return undefined;
  if (mode === 'disabled') return { enable_thinking: false };
  if (mode !== 'enabled') throw badRequest(`thinking.type must be "enabled", "disabled" or "adaptive", got ${JSON.stringify(mode ?? null)}`, 'thinking');
  const budget = thinking.raw('budget_tokens');
  if (typeof budget !== 'number' || !Number.isInteger(budget)) throw badRequest(`thinking.budget_tokens must be an integer, got ${JSON.stringify(budget ?? null)}`, 'thinking');
  if (budget < MIN_THINKING_BUDGET) throw badRequest(`thinking.budget_tokens must be at least ${MIN_THINKING_BUDGET}, got ${budget}`, 'thinking');
  if (budget >= maxTokens) throw badRequest(`thinking.budget_tokens (${budget}) must be less than max_tokens (${maxTokens})`, 'thinking');
  return { enable_thinking: true };
}

/** A messages request without its messages: what answering it needs once they are rendered. */
export type MessagesParams = Omit<MessagesRequest, 'messages'>;

export interface PreparedMessages {
  route: 'messages';
  req: MessagesParams;
  /** the rendered conversation's ids */
  ids: PromptIds;
}

export interface PreparedCountTokens {
  route: 'count_tokens';
  req: MessagesParams;
  inputTokens: number;
}

/** The conversation parsed and rendered as the model's template renders it, tools included. */
async function rendered(body: JsonObject, model: RequestModel, countTokens: boolean, signal?: AbortSignal): Promise<{ req: MessagesParams; ids: PromptIds }> {
  const { messages: parsed, ...req } = parseMessagesRequest(body, model, countTokens);
  const { messages, tools } = toolMessages(model, parsed, req.tools);
  const { ids } = await model.renderChat(messages, { continueFinal: req.prefill, tools, variables: req.variables }, signal);
  return { req, ids };
}

/**
 * Everything about a /v1/messages request that needs neither the grammar compiler nor the engine.
 * The schemas are checked afterwards, then the prompt's length against the context, as
 * count_tokens checks the same schemas and counts any length: both refuse the same schemas.
 */
export async function prepareMessages(body: JsonObject, model: RequestModel, signal?: AbortSignal): Promise<PreparedMessages> {
  return { route: 'messages', ...(await rendered(body, model, false, signal)) };
}

/** count_tokens: the request as /v1/messages would read it (max_tokens may be left out), and its prompt's length. */
export async function prepareCountTokens(body: JsonObject, model: RequestModel, signal?: AbortSignal): Promise<PreparedCountTokens> {
  const { req, ids } = await rendered({ max_tokens: 1, ...body }, model, true, signal);
  return { route: 'count_tokens', req, inputTokens: ids.length };
}
