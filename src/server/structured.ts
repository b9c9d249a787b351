// Structured output and tool calling on the wire: OpenAI `response_format`, vLLM's `guided_*` and
// `structured_outputs`, OpenAI `tools` / `tool_choice` / `parallel_tool_calls`, and Anthropic's
// tools, mapped onto grammar specs (compiled per request, cached by content hash) and tool-call
// formats. An invalid schema, regex or grammar is a 400 carrying the compiler's message.

import type { CompiledGrammar, GrammarLimits, GrammarSpec } from '../sampling/grammar/index.ts';
import { GrammarSpecError, describeGrammar, specText } from '../sampling/grammar/index.ts';
import { specSizeReason } from '../sampling/grammar/precheck.ts';
import {
  templateToolMessages, toolCallFormat, type ToolCallFormat, type ToolChatMessage, type ToolChoice, type ToolFunction,
} from '../generation/tool-calls/index.ts';
import type { ChatMessage } from '../artifacts/chat-template.ts';
import { badRequest } from './http-error.ts';
import { isObject, type Fields, type Json } from './fields.ts';
import type { ServedModel } from './served-model.ts';
import type { ModelFacts } from './request-model.ts';

/** A constraint and the request field it came from (for the 400's `param`). */
export interface Constraint {
  spec: GrammarSpec;
  param: string;
}

const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

/** guided_json / structured_outputs.json: a schema object, or its JSON text */
function schemaValue(v: Json, param: string): unknown {
  if (typeof v === 'string') {
    try {
      return JSON.parse(v);
    } catch (err) {
      throw badRequest(`${param} is not valid JSON: ${(err as Error).message}`, param, 'invalid_json_schema');
    }
  }
  if (typeof v === 'boolean' || isObject(v)) return v;
  throw badRequest(`${param} must be a JSON schema object, got ${kind(v)}`, param);
}

function stringValue(v: Json, param: string): string {
  if (typeof v !== 'string') throw badRequest(`${param} must be a string, got ${kind(v)}`, param);
  return v;
}

function choiceValue(v: Json, param: string): string[] {
  if (!Array.isArray(v) || v.length === 0 || v.some((c) => typeof c !== 'string'))
    throw badRequest(`${param} must be a non-empty array of strings`, param);
  return v as string[];
}

/**
 * Why compiling `spec` would refuse it for its size (the compiler's own message, from the same
 * measure), or undefined. Checked while a request is parsed, so that a body's huge schema or
 * choice list is refused where the body was parsed (a text worker, for a large one) and never has
 * to be copied to the event loop to be refused there.
 */
export function oversizedSpecReason(spec: GrammarSpec, limits: Readonly<GrammarLimits>): string | undefined {
  const what = describeGrammar(spec);
  const big = specSizeReason(specText(spec), what, limits);
  return big === undefined ? undefined : `invalid ${what}: ${big}`;
}

/**
 * The output constraint of an OpenAI request, if any: `response_format` (json_object,
 * json_schema), vLLM's `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, or
 * `structured_outputs` ({json | regex | choice | grammar | json_object}). At most one, and no
 * larger than `limits` allow (the 400 compileConstraint would give).
 */
export function parseConstraint(f: Fields, limits: Readonly<GrammarLimits>): Constraint | undefined {
  const found: Constraint[] = [];
  const rf = f.raw('response_format');
  if (rf !== undefined) {
    if (!isObject(rf) || typeof rf.type !== 'string') throw badRequest('response_format must be an object with a string "type"', 'response_format');
    if (rf.type === 'json_object') found.push({ spec: { type: 'json_object' }, param: 'response_format' });
    else if (rf.type === 'json_schema') {
      const js = rf.json_schema;
      if (!isObject(js)) throw badRequest('response_format.json_schema must be an object with a "schema"', 'response_format');
      if (js.name !== undefined && typeof js.name !== 'string') throw badRequest('response_format.json_schema.name must be a string', 'response_format');
      if (js.strict !== undefined && js.strict !== null && typeof js.strict !== 'boolean') throw badRequest('response_format.json_schema.strict must be a boolean', 'response_format');
      // OpenAI allows the schema to be omitted ("any JSON object"), as json_object
      const schema = js.schema ?? null;
      found.push({ spec: schema === null ? { type: 'json_object' } : { type: 'json_schema', schema: schemaValue(schema, 'response_format') }, param: 'response_format' });
    } else if (rf.type !== 'text') {
      throw badRequest(`response_format.type must be "text", "json_object" or "json_schema", got ${JSON.stringify(rf.type)}`, 'response_format');
    }
  }
  const guided = (name: string, make: (v: Json) => GrammarSpec) => {
    const v = f.raw(name);
    if (v !== undefined) found.push({ spec: make(v), param: name });
  };
  guided('guided_json', (v) => ({ type: 'json_schema', schema: schemaValue(v, 'guided_json') }));
  guided('guided_regex', (v) => ({ type: 'regex', pattern: stringValue(v, 'guided_regex') }));
  guided('guided_choice', (v) => ({ type: 'choice', choices: choiceValue(v, 'guided_choice') }));
  guided('guided_grammar', (v) => ({ type: 'ebnf', grammar: stringValue(v, 'guided_grammar') }));
  const so = f.object('structured_outputs');
  if (so) {
    const p = 'structured_outputs';
    const b = so.body;
    if (b.json !== undefined && b.json !== null) found.push({ spec: { type: 'json_schema', schema: schemaValue(b.json, `${p}.json`) }, param: p });
    if (b.regex !== undefined && b.regex !== null) found.push({ spec: { type: 'regex', pattern: stringValue(b.regex, `${p}.regex`) }, param: p });
    if (b.choice !== undefined && b.choice !== null) found.push({ spec: { type: 'choice', choices: choiceValue(b.choice, `${p}.choice`) }, param: p });
    if (b.grammar !== undefined && b.grammar !== null) found.push({ spec: { type: 'ebnf', grammar: stringValue(b.grammar, `${p}.grammar`) }, param: p });
    if (b.json_object === true) found.push({ spec: { type: 'json_object' }, param: p });
    for (const k of ['structural_tag', 'grammar_json'])
      if (b[k] !== undefined && b[k] !== null) throw badRequest(`${p}.${k} is not supported yet`, p, 'not_supported');
  }
  if (found.length > 1)
    throw badRequest(`only one output constraint may be given; got ${found.map((c) => c.param).join(' and ')}`, found[1]!.param);
  const c = found[0];
  const big = c && oversizedSpecReason(c.spec, limits);
  if (big) throw badRequest(big, c.param, 'invalid_grammar');
  return c;
}

/** Compiles a constraint with the model's grammar compiler; an invalid one is a 400. */
export async function compileConstraint(model: ServedModel, c: Constraint): Promise<CompiledGrammar> {
  try {
    return await (await model.grammarCompiler()).compile(c.spec);
  } catch (err) {
    if (err instanceof GrammarSpecError) throw badRequest(err.message, c.param, 'invalid_grammar');
    throw err;
  }
}

/** The tools of a request, its choice, and what follows from them. */
export interface ToolsRequest {
  tools: ToolFunction[];
  choice: ToolChoice;
  parallel: boolean;
}

const NAME = /^[A-Za-z0-9_.:-]{1,128}$/;

function toolFunction(name: unknown, description: unknown, parameters: unknown, where: string, param: string): ToolFunction {
  if (typeof name !== 'string' || !NAME.test(name))
    throw badRequest(`${where}.name must be 1-128 letters, digits, "_", "-", "." or ":", got ${JSON.stringify(name ?? null)}`, param);
  if (description !== undefined && description !== null && typeof description !== 'string') throw badRequest(`${where}.description must be a string`, param);
  if (parameters !== undefined && parameters !== null && !isObject(parameters)) throw badRequest(`${where}.parameters must be a JSON schema object`, param);
  return {
    name,
    ...(typeof description === 'string' && description !== '' ? { description } : {}),
    ...(isObject(parameters) ? { parameters: parameters as Record<string, unknown> } : {}),
  };
}

function uniqueNames(tools: ToolFunction[], param: string): void {
  const seen = new Set<string>();
  for (const t of tools) {
    if (seen.has(t.name)) throw badRequest(`tool name ${JSON.stringify(t.name)} appears twice`, param);
    seen.add(t.name);
  }
}

/** OpenAI `tools`, `tool_choice`, `parallel_tool_calls`; undefined when the request has no tools. */
export function parseOpenAiTools(f: Fields): ToolsRequest | undefined {
  const raw = f.array('tools');
  const choiceRaw = f.raw('tool_choice');
  const parallel = f.boolean('parallel_tool_calls') ?? true;
  if (f.has('functions') || f.has('function_call'))
    throw badRequest('functions and function_call are deprecated and not supported; use tools and tool_choice', f.has('functions') ? 'functions' : 'function_call', 'not_supported');
  // custom tools (free-form text input) are accepted and not offered: the model can only call functions
  const custom = new Set<string>();
  const all = (raw ?? []).flatMap((t, i) => {
    const where = `tools[${i}]`;
    if (!isObject(t)) throw badRequest(`${where} must be an object`, 'tools');
    if (t.type === 'custom') {
      const name = isObject(t.custom) ? t.custom.name : undefined;
      if (typeof name !== 'string' || name === '') throw badRequest(`${where}.custom.name must be a non-empty string`, 'tools');
      custom.add(name);
      return [];
    }
    if (t.type !== 'function') throw badRequest(`${where}.type must be "function" or "custom", got ${JSON.stringify(t.type ?? null)}`, 'tools');
    const fn = t.function;
    if (!isObject(fn)) throw badRequest(`${where}.function must be an object`, 'tools');
    return [toolFunction(fn.name, fn.description, fn.parameters, `${where}.function`, 'tools')];
  });
  uniqueNames(all, 'tools');
  let tools = all;
  let choice: ToolChoice = tools.length > 0 ? 'auto' : 'none';
  if (choiceRaw !== undefined) {
    if (choiceRaw === 'none' || choiceRaw === 'auto' || choiceRaw === 'required') choice = choiceRaw;
    else if (isObject(choiceRaw) && choiceRaw.type === 'function' && isObject(choiceRaw.function) && typeof choiceRaw.function.name === 'string') choice = { name: choiceRaw.function.name };
    else if (isObject(choiceRaw) && choiceRaw.type === 'allowed_tools') {
      const allowed = allowedTools(choiceRaw.allowed_tools, all.map((t) => t.name), custom);
      tools = all.filter((t) => allowed.names.has(t.name));
      choice = allowed.mode;
    } else throw badRequest('tool_choice must be "none", "auto", "required", {"type": "function", "function": {"name": ...}} or {"type": "allowed_tools", ...}', 'tool_choice');
  }
  if (typeof choice === 'object' && custom.has(choice.name))
    throw badRequest(`tool_choice names the custom tool ${JSON.stringify(choice.name)}; custom tools are accepted but not offered to the model`, 'tool_choice');
  if (tools.length === 0) {
    if (choice === 'none' || (choiceRaw === undefined)) return undefined;
    throw badRequest(`tool_choice ${JSON.stringify(choiceRaw)} requires tools`, 'tool_choice');
  }
  if (typeof choice === 'object' && !tools.some((t) => t.name === (choice as { name: string }).name))
    throw badRequest(`tool_choice names the function ${JSON.stringify(choice.name)}, which is not in tools`, 'tool_choice');
  return { tools, choice, parallel };
}

/**
 * tool_choice {"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools":
 * [{"type": "function", "function": {"name"}} or {"type": "function", "name"}]}}: the tools the
 * model may call this turn (only they are offered), and whether it must call one.
 */
function allowedTools(v: Json | undefined, names: readonly string[], custom: ReadonlySet<string>): { mode: 'auto' | 'required'; names: Set<string> } {
  const where = 'tool_choice.allowed_tools';
  if (!isObject(v)) throw badRequest(`${where} must be an object with "mode" and "tools"`, 'tool_choice');
  if (v.mode !== 'auto' && v.mode !== 'required') throw badRequest(`${where}.mode must be "auto" or "required", got ${JSON.stringify(v.mode ?? null)}`, 'tool_choice');
  if (!Array.isArray(v.tools) || v.tools.length === 0) throw badRequest(`${where}.tools must be a non-empty array`, 'tool_choice');
  const out = new Set<string>();
  v.tools.forEach((t, i) => {
    const name = isObject(t) ? (isObject(t.function) ? t.function.name : t.name) : undefined;
    if (!isObject(t) || (t.type !== 'function' && t.type !== 'custom') || typeof name !== 'string')
      throw badRequest(`${where}.tools[${i}] must be {"type": "function", "function": {"name": ...}} or {"type": "function", "name": ...}`, 'tool_choice');
    if (custom.has(name)) return; // accepted, never offered
    if (!names.includes(name)) throw badRequest(`${where}.tools[${i}] names ${JSON.stringify(name)}, which is not in tools`, 'tool_choice');
    out.add(name);
  });
  if (out.size === 0) throw badRequest(`${where} allows only custom tools, which are not offered to the model`, 'tool_choice');
  return { mode: v.mode, names: out };
}

/** Anthropic `tools` and `tool_choice` ({type: auto | any | tool | none, name, disable_parallel_tool_use}). */
export function parseAnthropicTools(f: Fields): ToolsRequest | undefined {
  const raw = f.array('tools');
  const tc = f.object('tool_choice');
  const tools = (raw ?? []).map((t, i) => {
    const where = `tools[${i}]`;
    if (!isObject(t)) throw badRequest(`${where} must be an object`, 'tools');
    if (t.type !== undefined && t.type !== null && t.type !== 'custom')
      throw badRequest(`${where}.type ${JSON.stringify(t.type)} (a server tool) is not supported yet`, 'tools', 'not_supported');
    if (t.input_schema !== undefined && !isObject(t.input_schema)) throw badRequest(`${where}.input_schema must be a JSON schema object`, 'tools');
    return toolFunction(t.name, t.description, t.input_schema, where, 'tools');
  });
  uniqueNames(tools, 'tools');
  const type = tc?.raw('type');
  let choice: ToolChoice = tools.length > 0 ? 'auto' : 'none';
  if (tc) {
    if (type === 'auto' || type === 'none') choice = type;
    else if (type === 'any') choice = 'required';
    else if (type === 'tool') {
      const name = tc.string('name');
      if (name === undefined) throw badRequest('tool_choice.name is required when tool_choice.type is "tool"', 'tool_choice');
      choice = { name };
    } else throw badRequest('tool_choice.type must be "auto", "any", "tool" or "none"', 'tool_choice');
  }
  const parallel = !(tc?.boolean('disable_parallel_tool_use') ?? false);
  if (tools.length === 0) {
    if (choice === 'none' || choice === 'auto') return undefined;
    throw badRequest(`tool_choice ${JSON.stringify(type)} requires tools`, 'tool_choice');
  }
  if (typeof choice === 'object' && !tools.some((t) => t.name === (choice as { name: string }).name))
    throw badRequest(`tool_choice names the tool ${JSON.stringify(choice.name)}, which is not in tools`, 'tool_choice');
  return { tools, choice, parallel };
}

/** What a tools request means for one generation. */
export interface ToolPlan {
  format: ToolCallFormat;
  /** tools offered in the prompt (none when tool_choice is "none") */
  offered: ToolFunction[];
  /** the output is parsed for calls */
  parse: boolean;
  /** calls are forced by a grammar (required or a named function) */
  forced: boolean;
  constraint?: Constraint;
}

export function planTools(model: Pick<ModelFacts, 'toolFormat'>, req: ToolsRequest | undefined): ToolPlan | undefined {
  if (!req) return undefined;
  const format = toolCallFormat(model.toolFormat);
  if (req.choice === 'none') return { format, offered: [], parse: false, forced: false };
  const forced = req.choice !== 'auto';
  const constraint: Constraint | undefined = forced
    ? {
      spec: format.forcedGrammar(req.tools, { only: typeof req.choice === 'object' ? req.choice.name : undefined, parallel: req.parallel }),
      param: 'tools',
    }
    : undefined;
  return { format, offered: req.tools, parse: true, forced, constraint };
}

/** Checks every offered tool's parameters schema, so a bad one is blamed by name (400). */
export async function checkToolSchemas(model: ServedModel, tools: readonly ToolFunction[], where: (i: number) => string): Promise<void> {
  const compiler = await model.grammarCompiler();
  for (let i = 0; i < tools.length; i++) {
    const schema = tools[i]!.parameters;
    if (schema === undefined) continue;
    try {
      await compiler.checkJsonSchema(schema);
    } catch (err) {
      if (err instanceof GrammarSpecError) throw badRequest(`${where(i)}: ${err.message}`, 'tools', 'invalid_grammar');
      throw err;
    }
  }
}

/** True when any message carries tool calls or tool results (they need rendering even without tools). */
export function hasToolMessages(messages: readonly ChatMessage[]): boolean {
  return messages.some((m) => m.role === 'tool' || (Array.isArray(m.tool_calls) && m.tool_calls.length > 0));
}

/**
 * The messages (and tools) to render: a template that renders tools gets them as the `tools`
 * variable, with call arguments as objects; any other template gets them written into the
 * conversation in the model's format (system prompt, calls and results as text).
 */
export function toolMessages(model: Pick<ModelFacts, 'toolFormat' | 'rendersTools'>, messages: ChatMessage[], plan: ToolPlan | undefined): { messages: ChatMessage[]; tools?: unknown[] } {
  const offered = plan?.offered ?? [];
  if (offered.length === 0 && !hasToolMessages(messages)) return { messages };
  const format = plan?.format ?? toolCallFormat(model.toolFormat);
  if (model.rendersTools) {
    return {
      messages: templateToolMessages(messages as ToolChatMessage[]) as ChatMessage[],
      tools: offered.length > 0 ? offered.map((t) => ({ type: 'function', function: { name: t.name, description: t.description ?? '', parameters: t.parameters ?? { type: 'object', properties: {} } } })) : undefined,
    };
  }
  return { messages: format.inlineTools(messages as ToolChatMessage[], offered) as ChatMessage[] };
}
