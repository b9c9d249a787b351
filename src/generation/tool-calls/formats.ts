// The tool-call formats of the model families: how calls look in the output (parsed back by
// parsers.ts), the grammar that forces calls when tool_choice requires them (so a forced call
// always parses and its arguments always match the function's schema), and how tools, calls and
// results are written into the prompt for chat templates that know nothing of tools.

import { randomBytes } from 'node:crypto';
import type { GrammarSpec, StructuralFormat } from '../../sampling/grammar/spec.ts';
import { HermesParser, Llama3JsonParser, MistralParser, type ParserOptions, type ToolCallParser } from './parsers.ts';
import type { ToolFunction } from './types.ts';

export type ToolCallFormatName = 'hermes' | 'llama3_json' | 'mistral';
export const TOOL_CALL_FORMATS: readonly ToolCallFormatName[] = ['hermes', 'llama3_json', 'mistral'];

/** A chat message as templates see it (OpenAI shape: tool_calls, tool_call_id...). */
export interface ToolChatMessage {
  role: string;
  content: unknown;
  [key: string]: unknown;
}

export interface ForcedCalls {
  /** exactly one call of this function; otherwise at least one call of any tool */
  only?: string;
  /** more than one call allowed (OpenAI parallel_tool_calls, default true) */
  parallel: boolean;
}

export interface ToolCallFormat {
  readonly name: ToolCallFormatName;
  /** control-token texts the parser must see even when the detokenizer drops them */
  readonly triggerStrings: readonly string[];
  newId(): string;
  createParser(opts: Omit<ParserOptions, 'newId'>): ToolCallParser;
  /** the grammar of forced calls (the parser is then created with `forced: true`) */
  forcedGrammar(tools: readonly ToolFunction[], forced: ForcedCalls): GrammarSpec;
  /**
   * For templates without tool support: tools in the system prompt (none when `tools` is empty),
   * earlier calls and results as text.
   */
  inlineTools(messages: readonly ToolChatMessage[], tools: readonly ToolFunction[]): ToolChatMessage[];
}

const ALNUM = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
function randomAlnum(n: number): string {
  const bytes = randomBytes(n);
  let s = '';
  for (const b of bytes) s += ALNUM[b % ALNUM.length];
  return s;
}

/** what a function without `parameters` takes: an empty object (OpenAI's rule) */
export function parametersSchema(t: ToolFunction): Record<string, unknown> {
  return t.parameters ?? { type: 'object', properties: {} };
}

const openAiTool = (t: ToolFunction) => ({ type: 'function', function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: parametersSchema(t) } });

/** the arguments of a call in a message, as JSON text */
function argumentsText(args: unknown): string {
  if (typeof args === 'string') {
    try {
      JSON.parse(args);
      return args;
    } catch {
      return JSON.stringify(args);
    }
  }
  return JSON.stringify(args ?? {});
}

interface MessageCall {
  name: string;
  arguments: string;
}

function callsOf(m: ToolChatMessage): MessageCall[] {
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
  return calls.map((c: any) => ({ name: String(c?.function?.name ?? c?.name ?? ''), arguments: argumentsText(c?.function?.arguments ?? c?.arguments) }));
}

const textOf = (content: unknown): string => (typeof content === 'string' ? content : content == null ? '' : JSON.stringify(content));

/** Puts `text` into the system message (appended to an existing one, else a new first message). */
function withSystem(messages: readonly ToolChatMessage[], text: string | undefined): ToolChatMessage[] {
  const out = messages.map((m) => ({ ...m }));
  if (text === undefined) return out;
  if (out.length > 0 && out[0]!.role === 'system') out[0]!.content = `${textOf(out[0]!.content)}\n\n${text}`;
  else out.unshift({ role: 'system', content: text });
  return out;
}

/** Rewrites assistant calls and tool results as text, merging consecutive results if asked. */
function inline(
  messages: readonly ToolChatMessage[],
  callsText: (calls: MessageCall[]) => string,
  result: (m: ToolChatMessage) => ToolChatMessage,
  mergeResults: boolean,
): ToolChatMessage[] {
  const out: ToolChatMessage[] = [];
  for (const m of messages) {
    if (m.role === 'assistant' && Array.isArray(m.tool_calls) && m.tool_calls.length > 0) {
      const { tool_calls: _drop, ...rest } = m;
      const text = textOf(m.content);
      out.push({ ...rest, content: (text ? `${text}\n` : '') + callsText(callsOf(m)) });
    } else if (m.role === 'tool') {
      const r = result(m);
      const prev = out[out.length - 1];
      if (mergeResults && prev && prev.__toolResults === true && prev.role === r.role) prev.content = `${textOf(prev.content)}\n${textOf(r.content)}`;
      else out.push({ ...r, __toolResults: true });
    } else out.push({ ...m });
  }
  for (const m of out) delete m.__toolResults;
  return out;
}

const hermes: ToolCallFormat = {
  name: 'hermes',
  triggerStrings: [],
  newId: () => `call_${randomAlnum(24)}`,
  createParser: (opts) => new HermesParser({ ...opts, newId: hermes.newId }),
  forcedGrammar(tools, forced) {
    const tag = (t: ToolFunction): StructuralFormat => ({
      type: 'tag',
      begin: `<tool_call>\n{"name": ${JSON.stringify(t.name)}, "arguments": `,
      content: { type: 'json_schema', json_schema: parametersSchema(t) },
      end: '}\n</tool_call>',
    });
    return { type: 'structural_tag', format: callsFormat(tools, forced, tag, '\n') };
  },
  inlineTools(messages, tools) {
    const system = [
      '# Tools', '', 'You may call one or more functions to assist with the user query.', '',
      'You are provided with function signatures within <tools></tools> XML tags:', '<tools>',
      ...tools.map((t) => JSON.stringify(openAiTool(t))), '</tools>', '',
      'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:',
      '<tool_call>', '{"name": <function-name>, "arguments": <args-json-object>}', '</tool_call>',
    ].join('\n');
    return withSystem(inline(messages,
      (calls) => calls.map((c) => `<tool_call>\n{"name": ${JSON.stringify(c.name)}, "arguments": ${c.arguments}}\n</tool_call>`).join('\n'),
      (m) => ({ role: 'user', content: `<tool_response>\n${textOf(m.content)}\n</tool_response>` }),
      true), tools.length > 0 ? system : undefined);
  },
};

const llama3Json: ToolCallFormat = {
  name: 'llama3_json',
  triggerStrings: [Llama3JsonParser.PYTHON_TAG],
  newId: () => `call_${randomAlnum(24)}`,
  createParser: (opts) => new Llama3JsonParser({ ...opts, newId: llama3Json.newId }),
  forcedGrammar(tools, forced) {
    const tag = (t: ToolFunction): StructuralFormat => ({
      type: 'tag',
      begin: `{"name": ${JSON.stringify(t.name)}, "parameters": `,
      content: { type: 'json_schema', json_schema: parametersSchema(t) },
      end: '}',
    });
    return { type: 'structural_tag', format: callsFormat(tools, forced, tag, '; ') };
  },
  inlineTools(messages, tools) {
    const system = [
      'Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.',
      '',
      'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.',
      '',
      ...tools.map((t) => JSON.stringify(openAiTool(t), null, 4) + '\n'),
    ].join('\n');
    return withSystem(inline(messages,
      (calls) => calls.map((c) => `{"name": ${JSON.stringify(c.name)}, "parameters": ${c.arguments}}`).join('; '),
      (m) => ({ role: 'tool', content: textOf(m.content) }),
      false), tools.length > 0 ? system : undefined);
  },
};

const mistral: ToolCallFormat = {
  name: 'mistral',
  triggerStrings: [MistralParser.TRIGGER, MistralParser.ARGS],
  // Mistral templates require call ids of exactly 9 alphanumerics
  newId: () => randomAlnum(9),
  createParser: (opts) => new MistralParser({ ...opts, newId: mistral.newId }),
  forcedGrammar(tools, forced) {
    const tag = (t: ToolFunction): StructuralFormat => ({
      type: 'tag',
      begin: `{"name": ${JSON.stringify(t.name)}, "arguments": `,
      content: { type: 'json_schema', json_schema: parametersSchema(t) },
      end: '}',
    });
    // forced output starts at the list; the parser is told so (no [TOOL_CALLS] control token).
    // A tag around the calls, not a sequence: xgrammar 0.1.27 fails to compile tags_with_separator
    // followed by anything in a sequence (it aborts with a bare number).
    return { type: 'structural_tag', format: { type: 'tag', begin: '[', content: callsFormat(tools, forced, tag, ', '), end: ']' } };
  },
  inlineTools(messages, tools) {
    const system = [
      'You can call the following tools. To call tools, answer with [TOOL_CALLS] followed by a JSON list of calls:',
      '[TOOL_CALLS][{"name": <function-name>, "arguments": <args-json-object>}]',
      '',
      `[AVAILABLE_TOOLS]${JSON.stringify(tools.map(openAiTool))}[/AVAILABLE_TOOLS]`,
    ].join('\n');
    return withSystem(inline(messages,
      (calls) => `[TOOL_CALLS][${calls.map((c) => `{"name": ${JSON.stringify(c.name)}, "arguments": ${c.arguments}}`).join(', ')}]`,
      (m) => ({ role: 'tool', content: textOf(m.content) }),
      false), tools.length > 0 ? system : undefined);
  },
};

/** one call of `only`, or one or more (parallel) / exactly one of any tool */
function callsFormat(tools: readonly ToolFunction[], forced: ForcedCalls, tag: (t: ToolFunction) => StructuralFormat, separator: string): StructuralFormat {
  const chosen = forced.only === undefined ? tools : tools.filter((t) => t.name === forced.only);
  if (chosen.length === 0) throw new Error(`no tool named ${JSON.stringify(forced.only)}`);
  const tags = chosen.map(tag);
  if (forced.only !== undefined || !forced.parallel) return tags.length === 1 ? tags[0]! : { type: 'or', elements: tags };
  return { type: 'tags_with_separator', tags, separator, at_least_one: true, stop_after_first: false };
}

export const TOOL_FORMATS: Readonly<Record<ToolCallFormatName, ToolCallFormat>> = { hermes, llama3_json: llama3Json, mistral };

export function toolCallFormat(name: ToolCallFormatName): ToolCallFormat {
  return TOOL_FORMATS[name];
}

/**
 * The format a model writes calls in, read off its chat templates and vocabulary: Mistral's
 * [TOOL_CALLS] token, Llama 3's <|python_tag|> / "parameters" convention, else Hermes tags (Qwen,
 * Hermes, and the format taught by the inline prompt for models without one).
 */
export function detectToolCallFormat(templates: readonly string[], hasToken: (token: string) => boolean): ToolCallFormatName {
  const all = templates.join('\n');
  if (hasToken('[TOOL_CALLS]') || all.includes('[TOOL_CALLS]')) return 'mistral';
  if (all.includes('<tool_call>') || hasToken('<tool_call>')) return 'hermes';
  if (hasToken('<|python_tag|>') || all.includes('<|python_tag|>') || (all.includes('ipython') && all.includes('"parameters"'))) return 'llama3_json';
  return 'hermes';
}

/** True when a template renders the `tools` variable (otherwise tools are inlined as text). */
export function templateRendersTools(template: string): boolean {
  return /\btools\b/.test(template);
}

/**
 * Messages for a template that renders tools itself: call arguments as objects (templates apply
 * `tojson` to them, as transformers passes them), content never null.
 */
export function templateToolMessages(messages: readonly ToolChatMessage[]): ToolChatMessage[] {
  return messages.map((m) => {
    if (!Array.isArray(m.tool_calls)) return { ...m };
    const tool_calls = m.tool_calls.map((c: any) => {
      let args: unknown = c?.function?.arguments;
      if (typeof args === 'string') {
        try {
          args = JSON.parse(args);
        } catch {
          // leave as written
        }
      }
      return { ...c, function: { ...c?.function, arguments: args } };
    });
    return { ...m, content: m.content ?? '', tool_calls };
  });
}

export { openAiTool };
