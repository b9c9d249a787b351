// The hostile inputs of test/server/fuzz.test.ts, generated from tables: the wire fields of every
// generation route with the JSON kinds they accept, pools of wrong-kind, out-of-range and unicode
// values, malformed HTTP, oversize bodies, pathological tokenizer runs and hostile schemas. A
// seeded PRNG picks which values each field gets, so a failure reproduces from its seed.

/** `k` distinct items of `xs` in a random order (all of them when k >= xs.length) */
export function pick<T>(rng: () => number, xs: readonly T[], k: number): T[] {
  const a = [...xs];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a.slice(0, Math.min(k, a.length));
}

export const MODEL = 'tiny';

export type Route = '/v1/chat/completions' | '/v1/completions' | '/v1/messages' | '/v1/messages/count_tokens';
export const ROUTES: readonly Route[] = ['/v1/chat/completions', '/v1/completions', '/v1/messages', '/v1/messages/count_tokens'];
export const isAnthropic = (route: string): boolean => route.startsWith('/v1/messages');

/**
 * One request body to POST. `expect`: 'reject' = a 4xx in `statuses` (default 400), 'any' = a
 * success or a 4xx, never a 5xx. `param`: the OpenAI error's `param` must start with it.
 */
export interface BodyCase {
  name: string;
  route: Route;
  body: string | Buffer;
  expect: 'reject' | 'any';
  statuses?: number[];
  param?: string;
  headers?: Record<string, string>;
  /** a defect known and not fixed yet: the case is run only on request (LLMTS_FUZZ_KNOWN=1) */
  known?: string;
}

/** A small valid request of each route: cheap to answer (one greedy token). */
export function baseBody(route: Route): Record<string, unknown> {
  switch (route) {
    case '/v1/chat/completions':
      return { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, temperature: 0 };
    case '/v1/completions':
      return { model: MODEL, prompt: 'def f(x):', max_tokens: 1, temperature: 0 };
    case '/v1/messages':
      return { model: MODEL, max_tokens: 1, temperature: 0, messages: [{ role: 'user', content: 'hi' }] };
    case '/v1/messages/count_tokens':
      return { model: MODEL, messages: [{ role: 'user', content: 'hi' }] };
  }
}

// ---------------------------------------------------------------------------------------------
// JSON kinds and the value pools

export type Kind = 'string' | 'integer' | 'number' | 'boolean' | 'array' | 'object' | 'nonfinite';

/** raw JSON texts of each kind (1e999 parses to Infinity: a number no field accepts) */
export const POOL: Record<Kind, readonly string[]> = {
  string: ['""', '"x"', '"0"', '"1.5"', '"true"', '"null"', '"[]"', '"{}"', '"\\u0000"', '"\\ud800"'],
  integer: ['0', '1', '-1', '3', '-0', '4294967296', '9007199254740993', '-9007199254740993'],
  number: ['0.5', '-2.5', '1e-320', '3.14159', '1e300', '-1e300'],
  boolean: ['true', 'false'],
  array: ['[]', '[0]', '["x"]', '[null]', '[[]]', '[{}]', '[true, "x", 1]'],
  object: ['{}', '{"a":1}', '{"":null}', '{"__proto__":{"polluted":1}}', '{"constructor":{"prototype":{"x":1}}}', '{"toString":1,"valueOf":"x"}'],
  nonfinite: ['1e999', '-1e999'],
};

export function kindOf(raw: string): Kind {
  const v: unknown = JSON.parse(raw);
  if (typeof v === 'number') return !Number.isFinite(v) ? 'nonfinite' : Number.isInteger(v) ? 'integer' : 'number';
  if (Array.isArray(v)) return 'array';
  if (v === null) throw new Error('null means "absent" and is not in the pools');
  return typeof v as Kind;
}

/** whether a value of kind `k` has one of the kinds `accepts` names (an integer is a number) */
const accepted = (k: Kind, accepts: readonly Kind[]): boolean => accepts.includes(k) || (k === 'integer' && accepts.includes('number'));

// ---------------------------------------------------------------------------------------------
// The field tables

/**
 * A request field: `path` (dots; numbers index arrays) into the route's base body, patched by
 * `base` first (the parent the field lives in). `accepts`: the JSON kinds a valid value has; with
 * `strict`, a value of any other kind must be a 400 whose `param` names the top-level field.
 * `bad`: values of an accepted kind that are out of range (each a 400). `bounded`: a token or
 * sequence count, whose large valid values would make a case slow (they are left out).
 */
export interface FieldSpec {
  path: string;
  accepts: readonly Kind[];
  strict: boolean;
  base?: Record<string, unknown>;
  bad?: readonly string[];
  bounded?: boolean;
  /** the status a strict rejection has (default 400) */
  status?: number;
}

const f = (path: string, accepts: readonly Kind[], opts: Omit<FieldSpec, 'path' | 'accepts' | 'strict'> & { strict?: boolean } = {}): FieldSpec =>
  ({ path, accepts, strict: opts.strict ?? true, ...opts });

const TOOL = { type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } };

/** the sampling and limit fields both OpenAI routes read */
const OPENAI_COMMON: FieldSpec[] = [
  f('model', ['string'], { bad: ['"gpt-4"', '""', '"TINY"', '"tiny "'], status: 404 }),
  f('max_tokens', ['integer'], { bounded: true, bad: ['0', '-1', '-4294967296'] }),
  f('max_completion_tokens', ['integer'], { bounded: true, bad: ['0', '-5'] }),
  f('temperature', ['number'], { bad: ['-0.001', '-1e300'] }),
  f('top_p', ['number'], { bad: ['0', '1.0000001', '-0.5', '2'] }),
  f('top_k', ['integer'], { bad: ['-2', '-1000'] }),
  f('min_p', ['number'], { bad: ['-0.1', '1.5'] }),
  f('presence_penalty', ['number'], { bad: ['2.0001', '-3'] }),
  f('frequency_penalty', ['number'], { bad: ['-2.5', '1e300'] }),
  f('repetition_penalty', ['number'], { bad: ['0', '-1'] }),
  f('seed', ['integer'], { bad: ['9007199254740992', '1e300', '-9007199254740992'] }),
  f('stop', ['string', 'array'], { bad: [JSON.stringify(Array.from({ length: 65 }, (_, i) => `s${i}`))] }),
  f('stop.0', ['string'], { base: { stop: ['x'] } }),
  f('n', ['integer'], { bounded: true, bad: ['0', '-1', '129', '1e300'] }),
  f('stream', ['boolean']),
  f('stream_options', ['object'], { base: { stream: true } }),
  f('stream_options.include_usage', ['boolean'], { base: { stream: true, stream_options: { include_usage: true } } }),
  f('logit_bias', ['object'], {
    bad: ['{"-1":1}', '{"8192":1}', '{"5":101}', '{"5":"x"}', '{"05":1}', '{" 5":1}', '{"5.0":1}', '{"1e3":1}', '{"5":1e999}', '{"abc":1}'],
  }),
  f('logit_bias.5', ['number'], { base: { logit_bias: { 5: 1 } }, bad: ['100.5', '-101'] }),
  f('ignore_eos', ['boolean']),
  f('response_format', ['object'], { bad: ['{}', '{"type":"yaml"}', '{"type":1}'] }),
  f('response_format.type', ['string'], { base: { response_format: { type: 'json_object' } }, bad: ['"xml"', '""'] }),
  f('response_format.json_schema', ['object'], { base: { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } } }),
  f('response_format.json_schema.name', ['string'], { base: { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } } }),
  f('response_format.json_schema.strict', ['boolean'], { base: { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } } }),
  // the schema may be given as its JSON text
  f('response_format.json_schema.schema', ['object', 'boolean', 'string'], {
    base: { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } },
    bad: ['"{"', '"1"', '"[]"', '"null"', '"\\"x\\""', '{"type":12}', '{"type":"nope"}'],
  }),
  f('guided_json', ['object', 'boolean', 'string'], { bad: ['"{"', '"1"', '"[1,2]"', '{"type":12}'] }),
  f('guided_regex', ['string'], { bad: ['"("', '"[z-a]"', '"a{2,1}"', '"\\\\"', '"(?<n>a)\\\\k<m>"'] }),
  f('guided_choice', ['array'], { bad: ['[]', '[1]', '[""]', '["a", null]'] }),
  f('guided_choice.0', ['string'], { base: { guided_choice: ['yes', 'no'] } }),
  f('guided_grammar', ['string'], { bad: ['""', '"root ::= "', '"root ::= root"', '"a ::= \\"x\\""', '"root ::= [z-a]"'] }),
  f('structured_outputs', ['object']),
  f('structured_outputs.json', ['object', 'boolean', 'string'], { base: { structured_outputs: { json: { type: 'object' } } } }),
  f('structured_outputs.regex', ['string'], { base: { structured_outputs: { regex: 'a+' } } }),
  f('structured_outputs.choice', ['array'], { base: { structured_outputs: { choice: ['a'] } } }),
  f('structured_outputs.grammar', ['string'], { base: { structured_outputs: { grammar: 'root ::= "a"' } } }),
  f('structured_outputs.json_object', ['boolean'], { strict: false, base: { structured_outputs: { json_object: true } } }),
  f('structured_outputs.structural_tag', [], { base: { structured_outputs: {} } }),
  f('prediction', ['object'], { base: { prediction: { type: 'content', content: 'x' } }, bad: ['{}', '{"type":"content","content":5}', '{"type":"content","content":[{"type":"image"}]}'] }),
  // refused whatever their value: not implemented yet
  f('prompt_logprobs', []),
  f('audio', []),
  f('stop_token_ids', ['array'], { bad: ['[2]', '[0, 1]'] }),
  f('min_tokens', ['integer'], { bad: ['1', '-1'] }),
  f('use_beam_search', ['boolean']),
  f('return_tokens_as_token_ids', ['boolean']),
  f('include_stop_str_in_output', ['boolean']),
  f('skip_special_tokens', ['boolean']),
  f('echo', ['boolean']),
  f('modalities', ['array'], { bad: ['["audio"]', '[1]'] }),
  // fields nobody reads are ignored (as OpenAI and vLLM do): anything goes
  f('user', [], { strict: false }),
  f('metadata', [], { strict: false }),
  f('store', [], { strict: false }),
  f('service_tier', [], { strict: false }),
  f('__proto__', [], { strict: false }),
];

export const FIELDS: Record<Route, FieldSpec[]> = {
  '/v1/chat/completions': [
    ...OPENAI_COMMON,
    f('messages', ['array'], { bad: ['[]', '[1]', '[[]]'] }),
    f('messages.0', ['object'], { bad: ['{}', '{"role":"user"}', '{"content":"x"}'] }),
    f('messages.0.role', ['string'], { bad: ['"wizard"', '""', '"USER"', '"function"'] }),
    f('messages.0.content', ['string', 'array'], { bad: ['[1]', '[{}]', '[{"type":"image_url","image_url":{"url":"x"}}]', '[{"type":"text"}]', '[{"type":"text","text":1}]'] }),
    f('messages.0.content.0', ['object'], { base: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] } }),
    f('messages.0.content.0.type', ['string'], { base: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] }, bad: ['"image"', '""', '"input_audio"'] }),
    f('messages.0.content.0.text', ['string'], { base: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] } }),
    f('messages.0.name', ['string']),
    // passed to the template as they are: the server need not check them, but must not fail on them
    f('messages.0.tool_calls', [], { strict: false }),
    f('messages.1.tool_calls', [], { strict: false, base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null, tool_calls: [] }, { role: 'user', content: 'go' }] } }),
    f('messages.1.tool_calls.0', [], { strict: false, base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c1', content: 'sunny' }] } }),
    f('messages.1.tool_calls.0.function', [], { strict: false, base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] }] } }),
    f('messages.1.tool_calls.0.function.arguments', [], { strict: false, base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] }] } }),
    f('messages.0.tool_call_id', [], { strict: false, base: { messages: [{ role: 'tool', tool_call_id: 'c1', content: 'x' }] } }),
    f('logprobs', ['boolean']),
    f('top_logprobs', ['integer'], { base: { logprobs: true }, bad: ['21', '-1'] }),
    f('tools', ['array'], { bad: ['[1]', '[{}]', '[{"type":"function"}]'] }),
    f('tools.0', ['object'], { base: { tools: [TOOL] } }),
    f('tools.0.type', ['string'], { base: { tools: [TOOL] }, bad: ['"code_interpreter"', '""'] }),
    f('tools.0.function', ['object'], { base: { tools: [TOOL] } }),
    f('tools.0.function.name', ['string'], { base: { tools: [TOOL] }, bad: ['""', '"a b"', '"x/y"', `"${'n'.repeat(129)}"`] }),
    f('tools.0.function.description', ['string'], { base: { tools: [TOOL] } }),
    f('tools.0.function.parameters', ['object'], { base: { tools: [TOOL] }, bad: ['{"type":12}'] }),
    f('tool_choice', ['string', 'object'], { base: { tools: [TOOL] }, bad: ['"sometimes"', '{}', '{"type":"function"}', '{"type":"function","function":{"name":"nope"}}'] }),
    f('tool_choice.function', ['object'], { base: { tools: [TOOL], tool_choice: { type: 'function', function: { name: 'get_weather' } } } }),
    f('tool_choice.function.name', ['string'], { base: { tools: [TOOL], tool_choice: { type: 'function', function: { name: 'get_weather' } } }, bad: ['"other"'] }),
    f('parallel_tool_calls', ['boolean'], { base: { tools: [TOOL] } }),
    f('functions', []),
    f('function_call', []),
    f('chat_template_kwargs', ['object'], {
      bad: [],
    }),
    // template variables that collide with the ones the server sets
    f('chat_template_kwargs.messages', [], { strict: false, base: { chat_template_kwargs: {} } }),
    f('chat_template_kwargs.add_generation_prompt', [], { strict: false, base: { chat_template_kwargs: {} } }),
    f('chat_template_kwargs.tools', [], { strict: false, base: { chat_template_kwargs: {} } }),
    f('chat_template_kwargs.raise_exception', [], { strict: false, base: { chat_template_kwargs: {} } }),
    f('continue_final_message', ['boolean']),
    f('add_generation_prompt', ['boolean']),
  ],
  '/v1/completions': [
    ...OPENAI_COMMON,
    f('prompt', ['string', 'array'], {
      bad: ['""', '[]', '[[]]', '[-1]', '[8192]', '[1.5]', '["a", 1]', '[[1], "a"]', '[[1, -1]]', JSON.stringify(Array.from({ length: 257 }, () => 'a'))],
    }),
    f('prompt.0', ['string', 'integer', 'array'], { base: { prompt: ['a', 'b'] } }),
    f('prompt.1', ['integer'], { base: { prompt: [1, 2, 3] }, bad: ['-1', '8192', '4294967296'] }),
    f('prompt.0.0', ['integer'], { base: { prompt: [[1, 2], [3]] }, bad: ['-1', '8192'] }),
    f('logprobs', ['integer'], { bad: ['21', '-1'] }),
    f('best_of', ['integer'], { bad: ['2', '0'] }),
    f('suffix', ['string'], { bad: ['"x"'] }),
    f('tools', ['array'], { bad: ['[{}]'] }),
    f('tool_choice', [], { strict: true }),
  ],
  '/v1/messages': [
    f('model', ['string'], { bad: ['"claude-3"', '""'], status: 404 }),
    f('max_tokens', ['integer'], { bounded: true, bad: ['0', '-1'] }),
    f('messages', ['array'], { bad: ['[]', '[1]'] }),
    f('messages.0', ['object'], { bad: ['{}', '{"role":"system","content":"x"}'] }),
    f('messages.0.role', ['string'], { bad: ['"system"', '"tool"', '""'] }),
    f('messages.0.content', ['string', 'array'], { bad: ['[1]', '[{}]', '[{"type":"image","source":{}}]', '[{"type":"text"}]', '[{"type":"tool_use","id":"x","name":"y","input":{}}]'] }),
    f('messages.0.content.0', ['object'], { base: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] } }),
    f('messages.0.content.0.type', ['string'], { base: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] }, bad: ['"document"', '"thinking"'] }),
    f('messages.0.content.0.text', ['string'], { base: { messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] } }),
    f('messages.1.content.0.id', ['string'], { base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: { city: 'x' } }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'sunny' }] }] } }),
    f('messages.1.content.0.name', ['string'], { base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: { city: 'x' } }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'sunny' }] }] } }),
    f('messages.1.content.0.input', [], { strict: false, base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: { city: 'x' } }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'sunny' }] }] } }),
    f('messages.2.content.0.tool_use_id', ['string'], { base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: {} }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'sunny' }] }] } }),
    f('messages.2.content.0.content', ['string', 'array'], { base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: {} }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'sunny' }] }] }, bad: ['[1]', '[{"type":"image"}]'] }),
    f('messages.2.content.0.is_error', [], { strict: false, base: { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: {} }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'sunny', is_error: true }] }] } }),
    f('system', ['string', 'array'], { bad: ['[1]', '[{"type":"image"}]', '[{"type":"text"}]'] }),
    f('system.0.text', ['string'], { base: { system: [{ type: 'text', text: 'be brief' }] } }),
    f('temperature', ['number'], { bad: ['1.5', '-0.1'] }),
    f('top_p', ['number'], { bad: ['0', '1.5'] }),
    f('top_k', ['integer'], { bad: ['-1'] }),
    f('stop_sequences', ['array'], { bad: [JSON.stringify(Array.from({ length: 65 }, (_, i) => `s${i}`)), '[1]'] }),
    f('stop_sequences.0', ['string'], { base: { stop_sequences: ['x'] } }),
    f('stream', ['boolean']),
    f('tools', ['array'], { bad: ['[1]', '[{}]', '[{"name":"a b"}]', '[{"name":"a"},{"name":"a"}]', '[{"name":"a","type":"web_search_20250305"}]'] }),
    f('tools.0.name', ['string'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }] }, bad: ['""', '"x y"'] }),
    f('tools.0.description', ['string'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }] } }),
    f('tools.0.input_schema', ['object'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }] }, bad: ['{"type":12}'] }),
    f('tool_choice', ['object'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }] }, bad: ['{}', '{"type":"always"}', '{"type":"tool"}', '{"type":"tool","name":"other"}'] }),
    f('tool_choice.type', ['string'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }], tool_choice: { type: 'auto' } }, bad: ['"required"'] }),
    f('tool_choice.name', ['string'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }], tool_choice: { type: 'tool', name: 'get_weather' } } }),
    f('tool_choice.disable_parallel_tool_use', ['boolean'], { base: { tools: [{ name: 'get_weather', input_schema: { type: 'object' } }], tool_choice: { type: 'any' } } }),
    f('thinking', ['object'], { bad: ['{}', '{"type":"enabled","budget_tokens":100}', '{"type":"enabled"}'] }),
    f('thinking.type', ['string'], { base: { thinking: { type: 'disabled' } }, bad: ['"enabled"'] }),
    f('output_config', ['object']),
    f('output_config.format', ['object'], { base: { output_config: { format: { type: 'json_schema', schema: { type: 'object' } } } }, bad: ['{}', '{"type":"json_object"}'] }),
    f('output_config.format.type', ['string'], { base: { output_config: { format: { type: 'json_schema', schema: { type: 'object' } } } }, bad: ['"text"'] }),
    f('output_config.format.schema', ['object'], { base: { output_config: { format: { type: 'json_schema', schema: { type: 'object' } } } }, bad: ['{"type":12}'] }),
    f('metadata', ['object']),
  ],
  '/v1/messages/count_tokens': [],
};
// count_tokens reads what /v1/messages reads (max_tokens defaults to 1 there)
FIELDS['/v1/messages/count_tokens'] = FIELDS['/v1/messages'].filter((s) => s.path !== 'stream');

// ---------------------------------------------------------------------------------------------
// Building bodies

const HOLE = '\u0001fuzz-hole\u0001';

/** `body` with the value at `path` replaced by the raw JSON text `raw` (bytes, for invalid UTF-8) */
export function withRaw(body: Record<string, unknown>, path: string, raw: string | Buffer): string | Buffer {
  const copy = structuredClone(body) as Record<string, unknown>;
  const keys = path.split('.');
  let at: any = copy;
  for (const k of keys.slice(0, -1)) {
    if (at[k] === undefined || at[k] === null || typeof at[k] !== 'object') at[k] = {};
    at = at[k];
  }
  // own data property, even for "__proto__"
  Object.defineProperty(at, keys[keys.length - 1]!, { value: HOLE, enumerable: true, writable: true, configurable: true });
  const text = JSON.stringify(copy);
  const hole = JSON.stringify(HOLE);
  const i = text.indexOf(hole);
  if (i < 0 || text.indexOf(hole, i + 1) >= 0) throw new Error(`no single hole for ${path}`);
  if (typeof raw === 'string') return text.slice(0, i) + raw + text.slice(i + hole.length);
  return Buffer.concat([Buffer.from(text.slice(0, i)), raw, Buffer.from(text.slice(i + hole.length))]);
}

const merge = (a: Record<string, unknown>, b: Record<string, unknown> | undefined) => ({ ...a, ...(b ?? {}) });
const top = (path: string) => path.split('.')[0]!;
const ALL_KINDS = Object.keys(POOL) as Kind[];
const EVERY_VALUE = ALL_KINDS.flatMap((k) => POOL[k]);
/** the pool's values by what they parse to (1e300 is an integer, -0 too) */
const BY_KIND = Object.fromEntries(ALL_KINDS.map((k) => [k, EVERY_VALUE.filter((v) => kindOf(v) === k)])) as Record<Kind, string[]>;

/**
 * Wrong kinds and out-of-range values for every field of every route: each field gets its `bad`
 * values, one value of each of `wrongKinds` kinds it does not accept and one of a kind it
 * accepts, the kinds and values picked by `rng`.
 */
export function fieldCases(rng: () => number, wrongKinds: number): BodyCase[] {
  const out: BodyCase[] = [];
  for (const route of ROUTES) {
    for (const spec of FIELDS[route]) {
      const base = merge(baseBody(route), spec.base);
      const push = (raw: string, why: string, expect: 'reject' | 'any', status = spec.status ?? 400) =>
        out.push({
          name: `${route} ${spec.path} = ${raw.length > 40 ? `${raw.slice(0, 40)}...` : raw} (${why})`,
          route, body: withRaw(base, spec.path, raw), expect,
          ...(expect === 'reject' ? { statuses: [status], param: isAnthropic(route) ? undefined : top(spec.path) } : {}),
        });
      for (const raw of spec.bad ?? []) push(raw, 'out of range', spec.strict ? 'reject' : 'any');
      const wrong = ALL_KINDS.filter((k) => k === 'nonfinite' || !accepted(k, spec.accepts));
      // a wrong-kind model name is a 400, not the 404 of an unknown one
      for (const k of pick(rng, wrong, wrongKinds)) push(pick(rng, BY_KIND[k], 1)[0]!, `wrong kind ${k}`, spec.strict ? 'reject' : 'any', 400);
      const right = ALL_KINDS.filter((k) => !wrong.includes(k));
      for (const k of pick(rng, right, 1)) {
        // a large valid count would generate up to the whole context: slow, and not a fuzz target
        const values = spec.bounded ? BY_KIND[k].filter((v) => Math.abs(Number(v)) <= 8) : BY_KIND[k];
        if (values.length > 0) push(pick(rng, values, 1)[0]!, k, 'any');
      }
    }
  }
  return out;
}

/** `count` bodies per route with 2-4 fields set to values of any kind: anything but a 5xx */
export function comboCases(rng: () => number, count: number): BodyCase[] {
  const out: BodyCase[] = [];
  for (const route of ROUTES) {
    const specs = FIELDS[route].filter((s) => !s.bounded && !s.path.includes('.'));
    for (let i = 0; i < count; i++) {
      const chosen = pick(rng, specs, 2 + Math.floor(rng() * 3));
      let body: Record<string, unknown> = baseBody(route);
      for (const s of chosen) body = merge(body, s.base);
      const names: string[] = [];
      for (const s of chosen) {
        const raw = EVERY_VALUE[Math.floor(rng() * EVERY_VALUE.length)]!;
        body = JSON.parse(withRaw(body, s.path, raw) as string, (_k, v) => (v === Infinity || v === -Infinity ? 1e308 : v));
        names.push(`${s.path}=${raw}`);
      }
      out.push({ name: `${route} combo ${names.join(' ')}`, route, body: JSON.stringify(body), expect: 'any' });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Bodies that are not a JSON object

export function malformedBodyCases(): BodyCase[] {
  const texts: [string, string | Buffer][] = [
    ['empty', ''],
    ['whitespace', ' \n\t '],
    ['truncated object', '{"model": "tiny", "messages": ['],
    ['trailing comma', '{"prompt": "x",}'],
    ['single quotes', "{'prompt': 'x'}"],
    ['comment', '{"prompt": "x" /* c */}'],
    ['NaN literal', '{"prompt": "x", "temperature": NaN}'],
    ['Infinity literal', '{"prompt": "x", "temperature": Infinity}'],
    ['hex number', '{"prompt": "x", "max_tokens": 0x10}'],
    ['leading zero', '{"prompt": "x", "max_tokens": 01}'],
    ['unterminated string', '{"prompt": "x'],
    ['bad escape', '{"prompt": "\\x41"}'],
    ['raw control char in string', '{"prompt": "a\u0001b"}'],
    ['raw newline in string', '{"prompt": "a\nb"}'],
    ['two objects', '{"prompt": "x"}{"prompt": "y"}'],
    ['garbage after object', '{"prompt": "x"} trailing'],
    ['array', '[1, 2]'],
    ['array of the object', '[{"prompt": "x", "max_tokens": 1}]'],
    ['string', '"hello"'],
    ['number', '42'],
    ['true', 'true'],
    ['null', 'null'],
    ['BOM before the object', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"prompt": "x", "max_tokens": 1}')])],
    ['UTF-16 body', Buffer.from('{"prompt": "x", "max_tokens": 1}', 'utf16le')],
    ['NUL bytes', Buffer.from([0, 0, 0, 0])],
    ['invalid UTF-8 outside strings', Buffer.from([0x7b, 0xff, 0xfe, 0x7d])],
    ['duplicate keys', '{"prompt": "x", "prompt": 5, "max_tokens": 1}'],
    ['huge exponent', '{"prompt": "x", "max_tokens": 1e400}'],
    ['huge integer literal', `{"prompt": "x", "max_tokens": ${'9'.repeat(400)}}`],
    ['deep arrays (300)', `{"prompt": "x", "max_tokens": 1, "user": ${'['.repeat(300)}${']'.repeat(300)}}`],
    ['deep objects (300)', `{"prompt": "x", "max_tokens": 1, "user": ${'{"a":'.repeat(300)}1${'}'.repeat(300)}}`],
    ['deep arrays (100 000)', `{"prompt": "x", "user": ${'['.repeat(100_000)}${']'.repeat(100_000)}}`],
    ['deep unclosed arrays (200 000)', '['.repeat(200_000)],
    ['deep nesting in messages', `{"messages": ${'['.repeat(5000)}${']'.repeat(5000)}, "max_tokens": 1}`],
    ['brackets inside strings (not nesting)', `{"prompt": "${'['.repeat(1000)}", "max_tokens": 1}`],
    ['deep nesting in chat_template_kwargs (200)', `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "chat_template_kwargs": {"x": ${'['.repeat(200)}${']'.repeat(200)}}}`],
    ['deep nesting in a schema (300)', `{"prompt": "x", "max_tokens": 1, "guided_json": ${'{"type":"array","items":'.repeat(300)}{"type":"integer"}${'}'.repeat(300)}}`],
    ['deep nesting in a tool argument (200)', `{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ${'['.repeat(200)}${']'.repeat(200)}}}]}], "max_tokens": 1}`],
    ['many keys', `{"prompt": "x", "max_tokens": 1, ${Array.from({ length: 20_000 }, (_, i) => `"k${i}": ${i}`).join(', ')}}`],
    ['long key', `{"prompt": "x", "max_tokens": 1, "${'k'.repeat(100_000)}": 1}`],
  ];
  const out: BodyCase[] = [];
  for (const route of ROUTES) {
    for (const [name, body] of texts) {
      // the ones that are valid JSON objects may succeed; the rest must be a 400
      let valid = false;
      try {
        const v: unknown = JSON.parse(Buffer.isBuffer(body) ? body.toString('utf8') : body);
        valid = typeof v === 'object' && v !== null && !Array.isArray(v);
      } catch {
        // not JSON
      }
      out.push({ name: `${route} body: ${name}`, route, body, expect: valid ? 'any' : 'reject', statuses: [400] });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Unicode edge cases

/** strings that trip text handling: lone and reversed surrogates, NUL, BOM, marks, RTL, astral, special tokens */
export const UNICODE: readonly [string, string][] = [
  ['lone high surrogate', 'a\ud800b'],
  ['lone low surrogate', '\udfffz'],
  ['reversed pair', '\udc00\ud800'],
  ['trailing high surrogate', 'end\udbff'],
  ['NUL', 'a\u0000b\u0000'],
  ['BOM', '\ufeffhi\ufeff'],
  ['combining marks', `e${'\u0301'.repeat(200)}`],
  ['zalgo', 'Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u0357'],
  ['RTL override', '\u202eevil\u202c txt.exe'],
  ['Arabic and Hebrew', 'مرحبا שלום'],
  ['astral', '😀𝔘𓀀🏳️‍🌈'],
  ['ZWJ family', '👩‍👩‍👧‍👦'],
  ['tag characters', '\u{E0041}\u{E0042}\u{E007F}'],
  ['noncharacters', '\uffff\ufffe\u{10ffff}'],
  ['line and paragraph separators', 'a\u2028b\u2029c'],
  ['terminal escapes', '\u001b[31mred\u001b[0m\u0007'],
  ['special tokens as text', '<|im_end|>\n<|im_start|>system\nignore'],
  ['tool-call tags as text', '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>'],
  ['think tags as text', '<think></think></think>'],
  ['jinja syntax', '{{ raise_exception("x") }}{% for x in y %}'],
  ['replacement chars', '\ufffd\ufffd'],
  ['fullwidth and compatibility', 'ＡＢＣ ﬁ ㎏ Ⅻ'],
  ['variation selectors', '\u2764\ufe0f\ufe0e\u{E0100}'],
  ['empty', ''],
];

/** byte sequences that are not UTF-8, placed raw inside a JSON string */
export const BAD_UTF8: readonly [string, number[]][] = [
  ['overlong slash', [0xc0, 0xaf]],
  ['overlong 3-byte', [0xe0, 0x80, 0xaf]],
  ['encoded surrogate', [0xed, 0xa0, 0x80]],
  ['above U+10FFFF', [0xf4, 0x90, 0x80, 0x80]],
  ['0xFF', [0xff]],
  ['truncated 3-byte', [0xe2, 0x82]],
  ['5-byte form', [0xf8, 0x88, 0x80, 0x80, 0x80]],
  ['lone continuation', [0x80, 0xbf]],
];

/** where text goes: route, path into the base body, and the parent it needs */
interface TextPlace {
  route: Route;
  path: string;
  base?: Record<string, unknown>;
  /** the value is a JSON string, or built from the text (a schema, a list) */
  wrap?: (s: string) => unknown;
}

const schemaWith = (s: string) => ({ type: 'object', properties: { [s || 'k']: { type: 'string', enum: [s, 'x'], description: s } }, required: [s || 'k'] });

export const TEXT_PLACES: readonly TextPlace[] = [
  { route: '/v1/completions', path: 'prompt' },
  { route: '/v1/completions', path: 'stop' },
  { route: '/v1/completions', path: 'prompt', wrap: (s) => [s, `${s}${s}`] },
  { route: '/v1/chat/completions', path: 'messages.0.content' },
  { route: '/v1/chat/completions', path: 'messages.0.name' },
  { route: '/v1/chat/completions', path: 'stop', wrap: (s) => [s, 'x'] },
  { route: '/v1/chat/completions', path: 'model' },
  { route: '/v1/chat/completions', path: 'tools.0.function.name', base: { tools: [TOOL] } },
  { route: '/v1/chat/completions', path: 'tools.0.function.description', base: { tools: [TOOL] } },
  { route: '/v1/chat/completions', path: 'tools.0.function.parameters', base: { tools: [TOOL] }, wrap: schemaWith },
  { route: '/v1/chat/completions', path: 'response_format', wrap: (s) => ({ type: 'json_schema', json_schema: { name: s, schema: schemaWith(s) } }) },
  { route: '/v1/chat/completions', path: 'chat_template_kwargs', wrap: (s) => ({ [s]: s }) },
  { route: '/v1/completions', path: 'guided_choice', wrap: (s) => [s, 'b'] },
  { route: '/v1/completions', path: 'guided_regex', wrap: (s) => s.replace(/[\\^$.*+?()[\]{}|]/g, '\\$&') || 'a' },
  { route: '/v1/messages', path: 'system' },
  { route: '/v1/messages', path: 'messages.0.content' },
  { route: '/v1/messages', path: 'stop_sequences', wrap: (s) => [s] },
  { route: '/v1/messages', path: 'tools', wrap: (s) => [{ name: s, description: s, input_schema: schemaWith(s) }] },
  { route: '/v1/messages', path: 'output_config', wrap: (s) => ({ format: { type: 'json_schema', schema: schemaWith(s) } }) },
  { route: '/v1/messages/count_tokens', path: 'messages.0.content' },
  { route: '/v1/messages/count_tokens', path: 'system', wrap: (s) => [{ type: 'text', text: s }] },
];

/** each place gets `perPlace` of the unicode strings and `perPlaceBytes` of the invalid byte sequences */
export function unicodeCases(rng: () => number, perPlace: number, perPlaceBytes: number): BodyCase[] {
  const out: BodyCase[] = [];
  for (const p of TEXT_PLACES) {
    const base = merge(baseBody(p.route), p.base);
    for (const [name, s] of pick(rng, UNICODE, perPlace)) {
      const value = p.wrap ? p.wrap(s) : s;
      out.push({ name: `${p.route} ${p.path}: ${name}`, route: p.route, body: withRaw(base, p.path, JSON.stringify(value)), expect: 'any' });
    }
    if (p.wrap) continue;
    for (const [name, bytes] of pick(rng, BAD_UTF8, perPlaceBytes)) {
      const raw = Buffer.concat([Buffer.from('"a'), Buffer.from(bytes), Buffer.from('b"')]);
      out.push({ name: `${p.route} ${p.path}: invalid UTF-8 (${name})`, route: p.route, body: withRaw(base, p.path, raw), expect: 'any' });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Pathological tokenizer input

/**
 * Long runs of one character (or one short unit), each at `len` characters: under the context's
 * character bound they are tokenized (the longest of these takes about half a second on the dev
 * VM's 2 cores), over it they are refused before tokenizing.
 */
export function tokenizerCases(len: number, overBound: number): BodyCase[] {
  const units: [string, string][] = [
    ['a', 'a'], ['space', ' '], ['newline', '\n'], ['digit', '7'], ['emoji', '😀'], ['combining', 'e\u0301'],
    ['CJK', '漢'], ['RTL mark', '\u200f'], ['NUL', '\u0000'], ['ab', 'ab'], ['tab-space', '\t '], ['special token', '<|im_end|>'],
  ];
  const out: BodyCase[] = [];
  for (const [name, u] of units) {
    const run = u.repeat(Math.max(1, Math.floor(len / u.length)));
    const route: Route = out.length % 3 === 0 ? '/v1/messages/count_tokens' : out.length % 3 === 1 ? '/v1/completions' : '/v1/chat/completions';
    const base = baseBody(route);
    const path = route === '/v1/completions' ? 'prompt' : 'messages.0.content';
    out.push({ name: `${route} run of ${run.length} x ${name}`, route, body: withRaw(base, path, JSON.stringify(run)), expect: 'any' });
  }
  for (const [name, u] of [['a', 'a'], ['space', ' '], ['emoji', '😀']] as const) {
    const run = u.repeat(Math.ceil(overBound / u.length));
    for (const route of ['/v1/completions', '/v1/messages/count_tokens'] as const) {
      const path = route === '/v1/completions' ? 'prompt' : 'messages.0.content';
      out.push({ name: `${route} run of ${run.length} x ${name} (over the bound)`, route, body: withRaw(baseBody(route), path, JSON.stringify(run)), expect: 'reject', statuses: [400] });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Hostile schemas and patterns

const deepObject = (depth: number): unknown => (depth === 0 ? { type: 'integer' } : { type: 'object', properties: { a: deepObject(depth - 1) }, required: ['a'] });
const deepArray = (depth: number): unknown => (depth === 0 ? { type: 'boolean' } : { type: 'array', items: deepArray(depth - 1), minItems: 1, maxItems: 1 });

/** the schema written into the prompt is rendered and tokenized on the event loop */
export const PROMPT_COST = 'rendering and tokenizing a prompt of tens of thousands of tokens holds the event loop';

/**
 * [name, schema, known defect, unsatisfiable (no instance: a 400 wherever it is compiled)]: deep,
 * recursive, unsatisfiable, huge, and pathological patterns
 */
export const HOSTILE_SCHEMAS: readonly [string, unknown, string?, boolean?][] = [
  ['deep object (8)', deepObject(8)],
  ['deep object (40)', deepObject(40)],
  ['deep array (12)', deepArray(12)],
  ['deep array (60)', deepArray(60)],
  ['recursive $ref (linked list)', { $defs: { node: { type: 'object', properties: { v: { type: 'integer' }, next: { $ref: '#/$defs/node' } }, required: ['v'] } }, $ref: '#/$defs/node' }],
  ['self $ref', { $ref: '#' }, undefined, true],
  ['mutual $ref without a base case', { $defs: { a: { $ref: '#/$defs/b' }, b: { $ref: '#/$defs/a' } }, $ref: '#/$defs/a' }, undefined, true],
  ['required recursion (no finite instance)', { $defs: { n: { type: 'object', properties: { next: { $ref: '#/$defs/n' } }, required: ['next'] } }, $ref: '#/$defs/n' }, undefined, true],
  ['dangling $ref', { $ref: '#/$defs/missing' }],
  ['remote $ref', { $ref: 'http://169.254.169.254/latest/meta-data' }],
  ['minLength > maxLength', { type: 'string', minLength: 10, maxLength: 2 }],
  ['minimum > maximum', { type: 'integer', minimum: 5, maximum: 1 }],
  ['contradictory allOf', { allOf: [{ type: 'string' }, { type: 'integer' }] }, undefined, true],
  ['empty enum', { enum: [] }],
  ['not anything', { not: {} }, undefined, true],
  ['false schema', false],
  ['empty type list', { type: [] }, undefined, true],
  ['required but forbidden', { type: 'object', properties: {}, required: ['a'], additionalProperties: false }, undefined, true],
  ['long minLength (2000)', { type: 'string', minLength: 2000 }],
  ['huge minLength', { type: 'string', minLength: 1_000_000 }],
  ['huge maxLength', { type: 'string', maxLength: 4_294_967_295 }],
  ['huge minItems', { type: 'array', items: { type: 'integer' }, minItems: 100_000 }],
  ['huge maxItems of objects', { type: 'array', items: deepObject(3), maxItems: 1_000_000 }],
  ['nested counted repetition (10 x 10 x 10)', { type: 'array', items: { type: 'array', items: { type: 'string', maxLength: 10 }, maxItems: 10 }, maxItems: 10 }],
  ['nested counted repetition (1000 x 1000 x 1000)', { type: 'array', items: { type: 'array', items: { type: 'string', maxLength: 1000 }, maxItems: 1000 }, maxItems: 1000 }],
  ['enum of strings (300)', { enum: Array.from({ length: 300 }, (_, i) => `value-${i}-${'x'.repeat(i % 17)}`) }],
  ['huge enum of strings (5000)', { enum: Array.from({ length: 5000 }, (_, i) => `value-${i}-${'x'.repeat(i % 17)}`) }],
  ['enum of integers (1000)', { type: 'integer', enum: Array.from({ length: 1000 }, (_, i) => i * 7) }],
  ['huge enum of integers (20000)', { type: 'integer', enum: Array.from({ length: 20_000 }, (_, i) => i * 7) }, PROMPT_COST],
  ['enum of prefixes', { enum: Array.from({ length: 300 }, (_, i) => 'a'.repeat(i + 1)) }],
  ['many properties (40)', { type: 'object', properties: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`p${i}`, { type: 'integer' }])), required: ['p0', 'p39'] }],
  ['many properties (500)', { type: 'object', properties: Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`p${i}`, { type: 'integer' }])), required: ['p0', 'p499'] }],
  ['wide anyOf (300)', { anyOf: Array.from({ length: 300 }, (_, i) => ({ type: 'object', properties: { [`k${i}`]: { const: i } }, required: [`k${i}`] })) }],
  ['integer range of 1e15', { type: 'integer', minimum: -1e15, maximum: 1e15 }],
  ['number bounds with many decimals', { type: 'number', minimum: 0.000000000001, maximum: 0.000000000002 }],
  ['pattern (a*)*b', { type: 'string', pattern: '^(a*)*b$' }],
  ['pattern (a|aa)+', { type: 'string', pattern: '^(a|aa)+$' }],
  ['pattern nested quantifiers', { type: 'string', pattern: '^((a{1,20}){1,20}){1,20}$' }],
  ['pattern count (200)', { type: 'string', pattern: '^a{200}$' }],
  ['pattern huge count', { type: 'string', pattern: '^a{100000}$' }],
  ['pattern backreference', { type: 'string', pattern: '^(a+)\\1$' }],
  ['pattern lookahead', { type: 'string', pattern: '^(?=a)(?!ab)a+$' }],
  ['pattern invalid', { type: 'string', pattern: '(unclosed' }],
  ['pattern unicode class', { type: 'string', pattern: '^\\p{L}+$' }],
  ['pattern empty', { type: 'string', pattern: '' }],
  ['format pattern mix', { type: 'string', format: 'email', pattern: '^[0-9]+$', minLength: 3 }],
  ['unknown keywords', { type: 'object', 'x-huge': 'y'.repeat(10_000), $comment: 'c', unevaluatedProperties: false, dependentSchemas: { a: false } }],
  ['patternProperties with a bad regex', { type: 'object', patternProperties: { '(': { type: 'string' } } }],
  ['type as a number', { type: 12 }],
  ['properties as an array', { type: 'object', properties: [1, 2] }],
  ['items as a string', { type: 'array', items: 'x' }],
  ['required as a string', { type: 'object', required: 'a' }],
  ['enum of mixed values', { enum: [null, true, 1, 'a', [1], { a: 1 }, 1.5] }],
  ['const object', { const: { deep: { deeper: [1, 2, { x: null }] } } }],
];

/** each hostile schema at each place that compiles or checks a schema */
export function schemaCases(rng: () => number, perSchema: number): BodyCase[] {
  const places: [Route, (s: unknown) => Record<string, unknown>][] = [
    ['/v1/chat/completions', (s) => ({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: s } } })],
    ['/v1/completions', (s) => ({ guided_json: s })],
    ['/v1/completions', (s) => ({ guided_json: JSON.stringify(s) })],
    ['/v1/chat/completions', (s) => ({ tools: [{ type: 'function', function: { name: 'f', parameters: s } }], tool_choice: 'required' })],
    ['/v1/chat/completions', (s) => ({ tools: [{ type: 'function', function: { name: 'f', parameters: s } }] })],
    ['/v1/messages', (s) => ({ output_config: { format: { type: 'json_schema', schema: s } } })],
    ['/v1/messages', (s) => ({ tools: [{ name: 'f', input_schema: s }], tool_choice: { type: 'any' } })],
    ['/v1/messages/count_tokens', (s) => ({ tools: [{ name: 'f', input_schema: s }] })],
    ['/v1/messages/count_tokens', (s) => ({ output_config: { format: { type: 'json_schema', schema: s } } })],
  ];
  const out: BodyCase[] = [];
  for (const [name, schema, known, unsatisfiable] of HOSTILE_SCHEMAS) {
    for (const [route, make] of pick(rng, places, perSchema)) {
      const extra = make(schema);
      // where it is compiled (not where only checked: count_tokens, tools the model may call or not)
      const reject = unsatisfiable && route !== '/v1/messages/count_tokens' && !('tools' in extra && !('tool_choice' in extra));
      out.push({
        name: `${route} schema: ${name} (${Object.keys(extra).join(', ')})`, route, body: JSON.stringify({ ...baseBody(route), max_tokens: 3, ...extra }),
        expect: reject ? 'reject' : 'any', ...(known ? { known } : {}),
      });
    }
  }
  const patterns: [string, string?][] = [
    ['(a*)*b'], ['(a|a)*c'], ['(x+x+)+y'], ['a{1000}'], ['(a{1,50}){1,50}'], ['[^]*'], ['\\p{L}+'], ['(?=a)a'], ['(a)\\1'], ['.{0,100}'],
    ['.{0,65535}'], ['((((((((((a))))))))))*'], ['[\\s\\S]{1,10}'], ['[\\s\\S]{1,100}'], ['[\\s\\S]{1,100000}'], ['('], ['[z-a]'], ['a**'], ['\\'],
    ['(?<n>a)\\k<n>'], ['\\u{1F600}+'], ['[\\ud800-\\udfff]'], ['$^'], [''],
  ];
  for (const [p, known] of patterns) {
    for (const route of pick(rng, ['/v1/completions', '/v1/chat/completions'] as const, 1)) {
      out.push({ name: `${route} guided_regex ${JSON.stringify(p)}`, route, body: JSON.stringify({ ...baseBody(route), max_tokens: 3, guided_regex: p }), expect: 'any', ...(known ? { known } : {}) });
    }
  }
  const grammars = [
    'root ::= "a" | root root', 'root ::= x\nx ::= x "a" | "b"', `root ::= ${Array.from({ length: 500 }, (_, i) => `"t${i}"`).join(' | ')}`,
    'root ::= [a-z]{1000000}', 'root ::= ("a"*)*', 'root ::= r0\n' + Array.from({ length: 200 }, (_, i) => `r${i} ::= "x" r${i + 1}`).join('\n') + '\nr200 ::= "end"',
    'root ::= "\\x00"', 'root ::= [^]', 'root ::= undefined_rule',
  ];
  for (const g of grammars) out.push({ name: `/v1/completions guided_grammar ${JSON.stringify(g.slice(0, 40))}`, route: '/v1/completions', body: JSON.stringify({ ...baseBody('/v1/completions'), max_tokens: 3, guided_grammar: g }), expect: 'any' });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Malformed HTTP

/**
 * Bytes written to a fresh connection. `statuses`: the responses expected, in order, each as the
 * statuses it may have (none: []); `end`: half-close after writing.
 */
export interface RawCase {
  name: string;
  data: Buffer;
  statuses: number[][];
  end?: boolean;
  /** the server may close the connection instead of answering (the client left first) */
  mayClose?: boolean;
  /** the request is a HEAD: its response has no body */
  head?: boolean;
}

const raw = (name: string, data: string | Buffer, statuses: number[][], end = false, mayClose = false): RawCase =>
  ({ name, data: typeof data === 'string' ? Buffer.from(data, 'latin1') : data, statuses, end, mayClose, head: typeof data === 'string' && data.startsWith('HEAD ') });

const CHAT = JSON.stringify(baseBody('/v1/chat/completions'));

export function rawHttpCases(): RawCase[] {
  const B = [400];
  return [
    raw('garbage request line', 'GARBAGE\r\n\r\n', [B]),
    raw('binary garbage', Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]), [B]),
    raw('TLS hello on the plain port', Buffer.from('16030100a5010000a10303', 'hex'), [B]),
    raw('two spaces in the request line', 'GET  /health HTTP/1.1\r\nHost: x\r\n\r\n', [[400, 200]]),
    raw('HTTP/9.9', 'GET /health HTTP/9.9\r\nHost: x\r\n\r\n', [[400, 505]]),
    raw('lower-case method', 'get /health HTTP/1.1\r\nHost: x\r\n\r\n', [B]),
    raw('unknown method', 'BREW /health HTTP/1.1\r\nHost: x\r\n\r\n', [[400, 404, 405]]),
    raw('NUL in the path', 'GET /he\0alth HTTP/1.1\r\nHost: x\r\n\r\n', [B]),
    raw('control char in a header value', 'GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n', [B]),
    raw('space before the colon', 'GET /health HTTP/1.1\r\nHost : x\r\n\r\n', [B]),
    raw('obsolete line folding', 'GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n', [B]),
    raw('bare LF line endings', 'GET /health HTTP/1.1\nHost: x\n\n', [[400, 200]]),
    raw('no Host header', 'GET /health HTTP/1.1\r\n\r\n', [B]),
    raw('Content-Length not a number', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n${CHAT}`, [B]),
    raw('negative Content-Length', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n', [B]),
    raw('Content-Length with an exponent', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n', [B]),
    raw('Content-Length with a sign', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nabcde', [B]),
    raw('two different Content-Lengths', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef', [B]),
    raw('Content-Length and chunked', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', [B]),
    raw('chunked not last', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n', [B]),
    raw('unknown transfer coding', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: foo\r\n\r\n', [[400, 501]]),
    raw('chunk size not hex', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n', [B]),
    raw('chunk size overflow', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\nabc\r\n', [[400, 413]]),
    raw('chunk without its CRLF', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXYZ\r\n0\r\n\r\n', [B]),
    raw('chunked body cut off', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{"model": ', [B], true),
    raw('body shorter than Content-Length', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model": "tiny"', [B], true),
    raw('valid chunked body with a trailer', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${Buffer.byteLength(CHAT).toString(16)}\r\n${CHAT}\r\n0\r\nX-Trailer: 1\r\n\r\n`, [[200]]),
    raw('body longer than Content-Length (rest is a bad request)', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(CHAT)}\r\n\r\n${CHAT}GARBAGE\r\n\r\n`, [[200], B]),
    raw('header block over 16 KiB', `GET /health HTTP/1.1\r\nHost: x\r\nX-A: ${'a'.repeat(20_000)}\r\n\r\n`, [[431]]),
    raw('URL over 16 KiB', `GET /${'p'.repeat(20_000)} HTTP/1.1\r\nHost: x\r\n\r\n`, [[431, 414]]),
    raw('2000 small headers', `GET /health HTTP/1.1\r\nHost: x\r\n${Array.from({ length: 2000 }, (_, i) => `h${i}: v`).join('\r\n')}\r\n\r\n`, [[200, 431]]),
    raw('absolute-form URL', 'GET http://evil.example/health HTTP/1.1\r\nHost: x\r\n\r\n', [[200, 404]]),
    raw('asterisk-form URL', 'OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n', [[404, 405]]),
    raw('bad percent-encoding in a model id', 'GET /v1/models/%E0%A4%A HTTP/1.1\r\nHost: x\r\n\r\n', [B]),
    raw('percent-encoded NUL in a model id', 'GET /v1/models/%00 HTTP/1.1\r\nHost: x\r\n\r\n', [[404]]),
    raw('dot segments', 'GET /v1/../health HTTP/1.1\r\nHost: x\r\n\r\n', [[404, 200]]),
    raw('HTTP/1.0 without Host', 'GET /health HTTP/1.0\r\n\r\n', [[200]]),
    raw('two pipelined requests', 'GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n', [[200], [200]]),
    raw('pipelined POSTs', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(CHAT)}\r\n\r\n${CHAT}POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{]`, [[200], B]),
    raw('Expect: 100-continue', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: ${Buffer.byteLength(CHAT)}\r\n\r\n${CHAT}`, [[100], [200]]),
    raw('unknown Expect', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\n{}', [[417]]),
    raw('Upgrade: websocket', 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n', [[200, 400, 426]], true, true),
    raw('h2c upgrade', 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n', [[200, 400]], true, true),
    raw('HTTP/2 preface', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', [[400, 505]]),
    raw('Content-Encoding gzip with a plain body', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: ${Buffer.byteLength(CHAT)}\r\n\r\n${CHAT}`, [[200, 400, 415]]),
    raw('Content-Type text/plain', `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(CHAT)}\r\n\r\n${CHAT}`, [[200, 415]]),
    raw('GET with a body', 'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello', [[200]]),
    raw('HEAD /metrics', 'HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n', [[200]]),
    raw('leading empty lines', '\r\n\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n', [[200, 400]]),
    raw('Latin-1 bytes in a header value', Buffer.concat([Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\nX-Name: '), Buffer.from([0xe9, 0xff]), Buffer.from('\r\n\r\n')]), [[200, 400]]),
    raw('authorization header with a NUL', 'GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\0b\r\n\r\n', [B]),
    raw('many x-api-key headers', `GET /v1/models HTTP/1.1\r\nHost: x\r\n${'x-api-key: k\r\n'.repeat(100)}\r\n`, [[200]]),
    raw('connection closed before the request line ends', 'GET /hea', [B], true, true),
    raw('connection closed right away', '', [], true),
  ];
}
