// Structured output and tool calling through a spawned `llmts serve` on a tiny random model (the
// grammar alone makes its output valid): response_format / guided_* / structured_outputs, forced
// tool calls that always parse, streamed tool-call deltas that rebuild the non-streamed calls
// exactly, Anthropic tool_use, and 400s carrying the compiler's message.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { spawnServer, postJson, parseSse, type Spawned } from './helpers.ts';

let srv: Spawned;
let client: OpenAI;
let anthropic: Anthropic;

before(async () => {
  // a byte-level vocabulary spells the tool prompt one token per byte: give it room
  srv = await spawnServer({ model: { maxPositions: 4096 }, args: ['--max-batch', '8'] });
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 5 }, age: { type: 'integer', minimum: 0, maximum: 99 }, pet: { enum: ['cat', 'dog'] } },
  required: ['name', 'age', 'pet'],
  additionalProperties: false,
};
const validPerson = (v: any) => v && typeof v.name === 'string' && [...v.name].length <= 5 && Number.isInteger(v.age) && v.age >= 0 && v.age <= 99 &&
  (v.pet === 'cat' || v.pet === 'dog') && Object.keys(v).join() === 'name,age,pet';

const WEATHER = { type: 'object', properties: { city: { type: 'string', maxLength: 6 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] };
const TIME = { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'] };
const TOOLS: OpenAI.ChatCompletionTool[] = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: WEATHER } },
  { type: 'function', function: { name: 'get_time', parameters: TIME } },
];
const validArgs = (name: string, args: string): boolean => {
  const v = JSON.parse(args);
  if (name === 'get_weather') return typeof v.city === 'string' && [...v.city].length <= 6 && (v.unit === 'c' || v.unit === 'f') && Object.keys(v).join() === 'city,unit';
  if (name === 'get_time') return v.tz === 'UTC' || v.tz === 'CET';
  return false;
};

const user = (content: string) => [{ role: 'user' as const, content }];

/** SSE chat chunks -> per choice: content, tool calls rebuilt from deltas, finish reason */
function reassemble(chunks: OpenAI.ChatCompletionChunk[]) {
  const out = new Map<number, { content: string; calls: { id?: string; name?: string; arguments: string }[]; finish?: string | null }>();
  for (const c of chunks)
    for (const ch of c.choices) {
      const st = out.get(ch.index) ?? { content: '', calls: [] };
      st.content += ch.delta.content ?? '';
      for (const d of ch.delta.tool_calls ?? []) {
        const call = (st.calls[d.index] ??= { arguments: '' });
        if (d.id) {
          assert.equal(call.id, undefined, 'a tool call id came twice');
          assert.equal(d.type, 'function');
          call.id = d.id;
          call.name = d.function?.name;
        }
        call.arguments += d.function?.arguments ?? '';
      }
      if (ch.finish_reason) st.finish = ch.finish_reason;
      out.set(ch.index, st);
    }
  return out;
}

async function chatStream(params: Omit<OpenAI.ChatCompletionCreateParamsStreaming, 'stream'>) {
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  for await (const c of await client.chat.completions.create({ ...params, stream: true })) chunks.push(c);
  return chunks;
}

test('response_format json_schema: every choice validates, streamed equals non-streamed', async () => {
  const params = {
    model: 'tiny', messages: user('a person please'), n: 4, temperature: 1, seed: 11, max_tokens: 200,
    response_format: { type: 'json_schema' as const, json_schema: { name: 'person', strict: true, schema: PERSON } },
  };
  const r = await client.chat.completions.create(params);
  assert.equal(r.choices.length, 4);
  for (const ch of r.choices) {
    assert.equal(ch.finish_reason, 'stop');
    assert.ok(validPerson(JSON.parse(ch.message.content!)), ch.message.content!);
  }
  const streamed = reassemble(await chatStream(params));
  for (const ch of r.choices) assert.equal(streamed.get(ch.index)!.content, ch.message.content);
  // json_object: a JSON object (bounded here only by max_tokens)
  const o = await client.chat.completions.create({ model: 'tiny', messages: user('x'), temperature: 1, seed: 3, max_tokens: 8, response_format: { type: 'json_object' } });
  assert.match(o.choices[0]!.message.content!, /^\{/);
});

test('guided_choice, guided_regex, guided_grammar, guided_json and structured_outputs', async () => {
  const cmpl = (extra: Record<string, unknown>, n = 3) => postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt: 'Q:', n, temperature: 1, seed: 5, max_tokens: 80, ...extra });
  const choice = await cmpl({ guided_choice: ['alpha', 'beta gamma', 'δ'] });
  assert.equal(choice.status, 200, JSON.stringify(choice.body));
  for (const c of choice.body.choices) assert.ok(['alpha', 'beta gamma', 'δ'].includes(c.text), c.text);
  const regex = await cmpl({ guided_regex: '[0-9]{3}-[a-z]{2}' });
  for (const c of regex.body.choices) assert.match(c.text, /^[0-9]{3}-[a-z]{2}$/);
  const grammar = await cmpl({ guided_grammar: 'root ::= "(" [xy]+ ")"' });
  for (const c of grammar.body.choices) assert.ok(/^\([xy]+\)$/.test(c.text) || c.finish_reason === 'length', c.text);
  const json = await postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', messages: user('x'), n: 3, temperature: 1, seed: 2, max_tokens: 200, guided_json: JSON.stringify(PERSON) });
  for (const c of json.body.choices) assert.ok(validPerson(JSON.parse(c.message.content)), c.message.content);
  const so = await cmpl({ structured_outputs: { choice: ['yes', 'no'] } }, 2);
  for (const c of so.body.choices) assert.ok(['yes', 'no'].includes(c.text));
});

test('bad schemas, regexes, grammars and tool choices get 400s with the compiler message', async () => {
  const chat = (extra: Record<string, unknown>) => postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', messages: user('x'), max_tokens: 4, ...extra });
  const cases: [Record<string, unknown>, RegExp, string][] = [
    [{ guided_json: { type: 'object', properties: { a: { type: 'strang' } } } }, /invalid JSON schema: .*strang/, 'guided_json'],
    [{ guided_json: '{not json' }, /guided_json is not valid JSON/, 'guided_json'],
    [{ guided_regex: '[a-' }, /invalid regex: /, 'guided_regex'],
    [{ guided_grammar: 'root ::= "a" | ' }, /invalid grammar: EBNF parser error/, 'guided_grammar'],
    [{ guided_choice: [] }, /guided_choice must be a non-empty array/, 'guided_choice'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 99 } } } } }] }, /tools\[0\]\.function\.parameters: invalid JSON schema: /, 'tools'],
    [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, /not in tools/, 'tool_choice'],
    [{ tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } }, /cannot be combined/, 'response_format'],
    [{ tools: [{ type: 'function', function: { name: 'bad name!' } }] }, /name must be/, 'tools'],
  ];
  for (const [extra, message, param] of cases) {
    const r = await chat(extra);
    assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${JSON.stringify(r.body)}`);
    assert.match(r.body.error.message, message);
    assert.equal(r.body.error.param, param);
  }
  const a = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 4, messages: user('x'), tools: [{ name: 't', input_schema: { type: 'object', required: 5 } }] });
  assert.equal(a.status, 400);
  assert.match(a.body.error.message, /tools\[0\]\.input_schema: invalid JSON schema/);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
});

test('tool_choice required / named / parallel_tool_calls false: calls always parse and match their schema', async () => {
  for (let seed = 0; seed < 3; seed++) {
    const r = await client.chat.completions.create({ model: 'tiny', messages: user('weather?'), tools: TOOLS, tool_choice: 'required', n: 3, temperature: 1, seed, max_tokens: 300 });
    for (const ch of r.choices) {
      // parallel calls: a random model may go on calling until max_tokens cuts the last one
      assert.ok(ch.finish_reason === 'tool_calls' || ch.finish_reason === 'length', JSON.stringify(ch));
      assert.equal(ch.message.content, null);
      assert.ok(ch.message.tool_calls!.length >= 1);
      const complete = ch.finish_reason === 'length' ? ch.message.tool_calls!.slice(0, -1) : ch.message.tool_calls!;
      for (const call of complete) {
        assert.equal(call.type, 'function');
        assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
        const fn = (call as OpenAI.ChatCompletionMessageFunctionToolCall).function;
        assert.ok(validArgs(fn.name, fn.arguments), `${fn.name} ${fn.arguments}`);
      }
    }
  }
  const named = await client.chat.completions.create({ model: 'tiny', messages: user('time?'), tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_time' } }, n: 4, temperature: 1, seed: 1, max_tokens: 100 });
  for (const ch of named.choices) {
    assert.equal(ch.message.tool_calls!.length, 1);
    const fn = (ch.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall).function;
    assert.equal(fn.name, 'get_time');
    assert.ok(validArgs(fn.name, fn.arguments));
  }
  const single = await client.chat.completions.create({ model: 'tiny', messages: user('x'), tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false, n: 4, temperature: 1, seed: 7, max_tokens: 300 });
  for (const ch of single.choices) {
    assert.equal(ch.finish_reason, 'tool_calls');
    assert.equal(ch.message.tool_calls!.length, 1);
    const fn = (ch.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall).function;
    assert.ok(validArgs(fn.name, fn.arguments), `${fn.name} ${fn.arguments}`);
  }
});

test('streamed tool-call deltas reassemble exactly to the non-streamed calls', async () => {
  for (const seed of [3, 4]) {
    const params = { model: 'tiny', messages: user('weather?'), tools: TOOLS, tool_choice: 'required' as const, n: 2, temperature: 1, seed, max_tokens: 300 };
    const whole = await client.chat.completions.create(params);
    const streamed = reassemble(await chatStream(params));
    for (const ch of whole.choices) {
      const s = streamed.get(ch.index)!;
      assert.equal(s.finish, ch.finish_reason);
      assert.equal(s.content, '');
      assert.deepEqual(
        s.calls.map((c) => [c.name, c.arguments]),
        ch.message.tool_calls!.map((c) => [(c as OpenAI.ChatCompletionMessageFunctionToolCall).function.name, (c as OpenAI.ChatCompletionMessageFunctionToolCall).function.arguments]),
      );
      assert.ok(s.calls.every((c) => /^call_/.test(c.id!)));
    }
  }
  // the SDK's own stream accumulator agrees
  const params = { model: 'tiny', messages: user('weather?'), tools: TOOLS, tool_choice: 'required' as const, parallel_tool_calls: false, temperature: 1, seed: 8, max_tokens: 300 };
  const final = await client.chat.completions.stream(params).finalChatCompletion();
  const whole = await client.chat.completions.create(params);
  const calls = (m: OpenAI.ChatCompletionMessage) => m.tool_calls!.map((c) => (c as OpenAI.ChatCompletionMessageFunctionToolCall).function);
  assert.deepEqual(calls(final.choices[0]!.message), calls(whole.choices[0]!.message));
  assert.equal(final.choices[0]!.finish_reason, 'tool_calls');
});

test('tool_choice auto and none, and a conversation carrying calls and results', async () => {
  const messages: OpenAI.ChatCompletionMessageParam[] = [
    { role: 'user', content: 'weather in Oslo?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo", "unit": "c"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 3}' },
  ];
  for (const tool_choice of ['auto', 'none'] as const) {
    const r = await client.chat.completions.create({ model: 'tiny', messages, tools: TOOLS, tool_choice, max_tokens: 8 });
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0]!.finish_reason));
  }
  const noTools = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 4 });
  assert.equal(noTools.choices[0]!.message.tool_calls, undefined);
});

test('Anthropic tools: forced tool_use blocks validate; streamed input_json_delta rebuilds the same input', async () => {
  const tools: Anthropic.Tool[] = [
    { name: 'get_weather', description: 'Weather in a city', input_schema: WEATHER as Anthropic.Tool.InputSchema },
    { name: 'get_time', input_schema: TIME as Anthropic.Tool.InputSchema },
  ];
  const params = { model: 'tiny', max_tokens: 300, temperature: 1, messages: user('weather?'), tools, tool_choice: { type: 'any' as const, disable_parallel_tool_use: true } };
  const whole = await anthropic.messages.create(params);
  assert.equal(whole.stop_reason, 'tool_use');
  const uses = whole.content.filter((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use');
  assert.equal(uses.length, 1);
  for (const u of uses) assert.ok(validArgs(u.name, JSON.stringify(u.input)), JSON.stringify(u));

  // the same request streamed (raw SSE, greedy so both runs agree)
  const greedy = { ...params, temperature: 0 };
  const ref = await anthropic.messages.create(greedy);
  const res = await fetch(`${srv.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...greedy, stream: true }) });
  const events = parseSse(await res.text()).map((e) => JSON.parse(e.data));
  const blocks: { type: string; name?: string; text?: string; json?: string }[] = [];
  for (const e of events) {
    if (e.type === 'content_block_start') blocks[e.index] = { type: e.content_block.type, name: e.content_block.name, text: '', json: '' };
    if (e.type === 'content_block_delta' && e.delta.type === 'input_json_delta') blocks[e.index]!.json += e.delta.partial_json;
    if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') blocks[e.index]!.text += e.delta.text;
  }
  const rebuilt = blocks.map((b) => (b.type === 'tool_use' ? { type: 'tool_use', name: b.name, input: JSON.parse(b.json!) } : { type: 'text', text: b.text }));
  assert.deepEqual(rebuilt, ref.content.map((b) => (b.type === 'tool_use' ? { type: 'tool_use', name: b.name, input: b.input } : { type: 'text', text: (b as Anthropic.TextBlock).text })));
  assert.equal(events.find((e) => e.type === 'message_delta').delta.stop_reason, 'tool_use');

  // a named tool, then the conversation continues with its result
  const named = await anthropic.messages.create({ ...params, tool_choice: { type: 'tool', name: 'get_time' } });
  const use = named.content.find((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use')!;
  assert.equal(use.name, 'get_time');
  const next = await anthropic.messages.create({
    model: 'tiny', max_tokens: 5, tools,
    messages: [...user('time?'), { role: 'assistant', content: named.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '12:00' }] }],
  });
  assert.ok(next.content.length >= 1);
  // output_config.format: structured output on /v1/messages
  const so = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 200, temperature: 1, messages: user('x'), output_config: { format: { type: 'json_schema', schema: PERSON } } });
  assert.equal(so.status, 200, JSON.stringify(so.body));
  assert.ok(validPerson(JSON.parse(so.body.content[0].text)));
});

test('while new schemas compile (on the worker thread), another stream and /health keep being served', async () => {
  // a schema this server has not seen (distinct names each run): a cache miss
  const tag = Math.random().toString(36).slice(2, 8);
  const big = {
    type: 'object',
    properties: Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`${tag}_${i}`,
      i % 3 === 0 ? { type: 'integer', minimum: -5, maximum: 250 } : i % 3 === 1 ? { enum: ['on', 'one', 'off'] } : { type: 'string', maxLength: 4 }])),
    required: Array.from({ length: 12 }, (_, i) => `${tag}_${i}`),
    additionalProperties: false,
  };
  const stream = await client.chat.completions.create({ model: 'tiny', messages: user('go on'), stream: true, stream_options: { include_usage: true }, max_tokens: 120, temperature: 0, ignore_eos: true } as OpenAI.ChatCompletionCreateParamsStreaming);
  const it = stream[Symbol.asyncIterator]();
  await it.next(); // the stream is running
  let inFlight = true, health = 0, chunksMeanwhile = 0;
  const structured = postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', messages: user('x'), temperature: 1, seed: 4, max_tokens: 400, guided_json: big })
    .finally(() => (inFlight = false));
  const invalid = postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', messages: user('x'), max_tokens: 4, guided_json: { ...big, properties: { a: { type: 'strang' } } } });
  const polls = (async () => {
    while (inFlight) {
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);
      if (inFlight) health++;
    }
  })();
  let tokens = 0, finish: string | null = null;
  for (let r = await it.next(); !r.done; r = await it.next()) {
    const ch = r.value.choices[0];
    if (r.value.usage) tokens = r.value.usage.completion_tokens;
    if (inFlight) chunksMeanwhile++;
    if (ch?.finish_reason) finish = ch.finish_reason;
  }
  const [s, bad] = await Promise.all([structured, invalid, polls]);
  assert.equal(s.status, 200, JSON.stringify(s.body));
  const v = JSON.parse(s.body.choices[0].message.content);
  for (let i = 0; i < 12; i++) {
    const x = v[`${tag}_${i}`];
    if (i % 3 === 0) assert.ok(Number.isInteger(x) && x >= -5 && x <= 250, String(x));
    else if (i % 3 === 1) assert.ok(['on', 'one', 'off'].includes(x), String(x));
    else assert.ok(typeof x === 'string' && [...x].length <= 4);
  }
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /invalid JSON schema: .*strang/);
  assert.equal(finish, 'length');
  assert.equal(tokens, 120, 'the other stream ran to its end');
  assert.ok(health > 0 && chunksMeanwhile > 0, `served meanwhile: ${health} /health, ${chunksMeanwhile} chunks`);
});
