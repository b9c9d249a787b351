// A /v1/chat/completions body, validated and turned into prompt ids: every check of the request
// (messages, parameters, tools) and the template rendering, up to what only the event loop can do
// (grammar checks and compiles, the engine). The same code runs on the event loop for a small body
// and on a text worker for a large one (request-prep.ts), so both refuse with the same 400s.

import type { ChatMessage } from '../artifacts/chat-template.ts';
import { badRequest, notSupported } from './http-error.ts';
import { Fields, isObject, type Json, type JsonObject } from './fields.ts';
import { promptOpensThink } from './reasoning.ts';
import { checkModel, parseGenerationParams, type GenerationParams } from './openai-params.ts';
import { parseOpenAiTools, planTools, toolMessages, type ToolPlan } from './structured.ts';
import type { PromptIds, RequestModel } from './request-model.ts';

const ROLES = ['system', 'developer', 'user', 'assistant', 'tool'];
const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

/** message content: a string or a list of text parts; null only where OpenAI allows it */
export function contentText(v: Json | undefined, where: string, nullable: boolean): string {
  if (typeof v === 'string') return v;
  if ((v === null || v === undefined) && nullable) return '';
  if (!Array.isArray(v)) throw badRequest(`${where} must be a string or an array of content parts, got ${kind(v)}`, 'messages');
  return v.map((part, j) => {
    if (!isObject(part) || typeof part.type !== 'string') throw badRequest(`${where}[${j}] must be a content part object with a "type"`, 'messages');
    // input_text: the Responses API's spelling, which clients also send on chat
    if (part.type !== 'text' && part.type !== 'input_text') throw notSupported(`content part type "${part.type}" (${where}[${j}])`, 'messages');
    if (typeof part.text !== 'string') throw badRequest(`${where}[${j}].text must be a string, got ${kind(part.text)}`, 'messages');
    return part.text;
  }).join('\n');
}

/** OpenAI messages -> template messages. `developer` is rendered as `system` (templates predate it). */
export function parseChatMessages(raw: Json[] | undefined): ChatMessage[] {
  if (raw === undefined) throw badRequest('messages is required', 'messages');
  if (raw.length === 0) throw badRequest('messages must not be empty', 'messages');
  return raw.map((m, i) => {
    const where = `messages[${i}]`;
    if (!isObject(m)) throw badRequest(`${where} must be an object, got ${kind(m)}`, 'messages');
    if (typeof m.role !== 'string' || !ROLES.includes(m.role))
      throw badRequest(`${where}.role must be one of ${ROLES.join(', ')}, got ${JSON.stringify(m.role ?? null)}`, 'messages');
    if (m.name !== undefined && m.name !== null && typeof m.name !== 'string') throw badRequest(`${where}.name must be a string`, 'messages');
    const content = contentText(m.content, `${where}.content`, m.role === 'assistant');
    const out: ChatMessage = { ...(m as JsonObject), role: m.role === 'developer' ? 'system' : m.role, content };
    for (const k of Object.keys(out)) if (out[k] === null) delete out[k];
    return out;
  });
}

export interface PreparedChat {
  route: 'chat';
  params: GenerationParams;
  tools?: ToolPlan;
  /** the rendered conversation's ids */
  ids: PromptIds;
  /** the rendering ends inside an open <think> block (a thinking model's reasoning comes first) */
  opensThink: boolean;
}

/**
 * Everything about a chat request that needs neither the grammar compiler nor the engine: the
 * model name, messages, sampling and generation parameters, tools and tool_choice, the template
 * options, and the rendered and encoded conversation. The tool schemas are checked afterwards,
 * then the prompt's length against the context (planSequences).
 */
export async function prepareChat(body: JsonObject, model: RequestModel, signal?: AbortSignal): Promise<PreparedChat> {
  const f = new Fields(body);
  checkModel(f, model);
  const parsedMessages = parseChatMessages(f.array('messages'));
  const params = parseGenerationParams(f, model, 'chat');
  const tools = planTools(model, parseOpenAiTools(f));
  if (tools?.forced && params.constraint)
    throw badRequest(`${params.constraint.param} cannot be combined with tool_choice "required" or a named function`, params.constraint.param);
  const variables = f.object('chat_template_kwargs')?.body;
  const continueFinal = f.boolean('continue_final_message') ?? false;
  const addGenerationPrompt = f.boolean('add_generation_prompt') ?? true;
  if (continueFinal && parsedMessages[parsedMessages.length - 1].role !== 'assistant')
    throw badRequest('continue_final_message requires the last message to be from the assistant', 'continue_final_message');
  const { messages, tools: templateTools } = toolMessages(model, parsedMessages, tools);
  const rendered = await model.renderChat(messages, { continueFinal, addGenerationPrompt, variables, tools: templateTools }, signal);
  return { route: 'chat', params, tools, ids: rendered.ids, opensThink: model.thinks && promptOpensThink(rendered.text) };
}
