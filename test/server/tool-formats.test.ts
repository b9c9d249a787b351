// Tool calling in the Llama 3 JSON and Mistral formats through a spawned `llmts serve`, with the
// official openai client: tool_choice required / named / auto, streaming and not. One server
// detects llama3_json from a Llama-3.1-style chat template that renders `tools` itself; the other
// is told `--tool-call-format mistral` over a ChatML template without tool support (tools are then
// written into the prompt in Mistral's syntax). Random weights: the grammar alone makes forced
// calls valid; in auto mode the output is pinned with a one-element guided_choice so that both
// "a call" and "plain text" reach the parser deterministically.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { spawnServer, type Spawned } from './helpers.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { runServe } from '../../src/cli/serve.ts';
import { UsageError } from '../../src/cli/errors.ts';

/** A shortened Llama 3.1 template: tools as JSON in a user turn, calls as {"name", "parameters"}, results as ipython. */
const LLAMA31 = `{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none and tools %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none and tools %}
    {{- "<|start_header_id|>user<|end_header_id|>\\n\\n" }}
    {{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\\n\\n' }}
    {%- for t in tools %}
        {{- t | tojson }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- "<|eot_id|>" }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- "<|start_header_id|>assistant<|end_header_id|>\\n\\n" }}
        {%- for tool_call in message.tool_calls %}
            {{- '{"name": "' + tool_call.function.name + '", "parameters": ' }}
            {{- tool_call.function.arguments | tojson }}
            {{- "}" }}
        {%- endfor %}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" + message.content + "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>" + message.role + "<|end_header_id|>\\n\\n" + message.content + "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|start_header_id|>assistant<|end_header_id|>\\n\\n" }}
{%- endif %}`;

/** a tiny random model whose tokenizer_config carries `template` (undefined: the ChatML default) */
function modelDir(template?: string): string {
  const dir = writeTinyLlama({ maxPositions: 4096 });
  if (template !== undefined) {
    const file = join(dir, 'tokenizer_config.json');
    writeFileSync(file, JSON.stringify({ ...JSON.parse(readFileSync(file, 'utf8')), chat_template: template }));
  }
  return dir;
}

interface Format {
  name: 'llama3_json' | 'mistral';
  srv?: Spawned;
  client?: OpenAI;
  /** the id every call gets */
  id: RegExp;
  /** the model's own text for a call of get_time (what auto mode parses) */
  callText: (tz: string) => string;
}

const FORMATS: Format[] = [
  { name: 'llama3_json', id: /^call_[A-Za-z0-9]{24}$/, callText: (tz) => `{"name": "get_time", "parameters": {"tz": "${tz}"}}` },
  { name: 'mistral', id: /^[A-Za-z0-9]{9}$/, callText: (tz) => `[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "${tz}"}}]` },
];

before(async () => {
  const [llama, mistral] = await Promise.all([
    spawnServer({ dir: modelDir(LLAMA31), args: ['--max-batch', '8'] }),
    spawnServer({ dir: modelDir(), args: ['--max-batch', '8', '--tool-call-format', 'mistral'] }),
  ]);
  FORMATS[0]!.srv = llama;
  FORMATS[1]!.srv = mistral;
  for (const f of FORMATS) f.client = new OpenAI({ baseURL: `${f.srv!.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  for (const f of FORMATS) {
    await f.srv?.stop();
    if (f.srv) assert.doesNotMatch(f.srv.stderr(), /internal error/);
  }
});

const WEATHER = { type: 'object', properties: { city: { type: 'string', maxLength: 6 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] };
const TIME = { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'] };
const TOOLS: OpenAI.ChatCompletionTool[] = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: WEATHER } },
  { type: 'function', function: { name: 'get_time', parameters: TIME } },
];
const validArgs = (name: string, args: string): boolean => {
  const v = JSON.parse(args);
  if (name === 'get_weather') return typeof v.city === 'string' && [...v.city].length <= 6 && (v.unit === 'c' || v.unit === 'f') && Object.keys(v).join() === 'city,unit';
  if (name === 'get_time') return (v.tz === 'UTC' || v.tz === 'CET') && Object.keys(v).join() === 'tz';
  return false;
};
const user = (content: string) => [{ role: 'user' as const, content }];
const fn = (c: OpenAI.ChatCompletionMessageToolCall) => (c as OpenAI.ChatCompletionMessageFunctionToolCall).function;

/** streamed chunks -> per choice: content, calls rebuilt from their deltas, finish reason */
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
        } else assert.ok(call.id !== undefined, 'arguments before the call header');
        call.arguments += d.function?.arguments ?? '';
      }
      if (ch.finish_reason) st.finish = ch.finish_reason;
      out.set(ch.index, st);
    }
  return out;
}

async function chatStream(client: OpenAI, params: Omit<OpenAI.ChatCompletionCreateParamsStreaming, 'stream'>) {
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  for await (const c of await client.chat.completions.create({ ...params, stream: true })) chunks.push(c);
  return chunks;
}

/** The non-streamed response's choices and the same request streamed agree exactly. */
function assertSame(whole: OpenAI.ChatCompletion, chunks: OpenAI.ChatCompletionChunk[]): void {
  const streamed = reassemble(chunks);
  assert.equal(streamed.size, whole.choices.length);
  for (const ch of whole.choices) {
    const s = streamed.get(ch.index)!;
    assert.equal(s.finish, ch.finish_reason);
    assert.equal(s.content, ch.message.content ?? '');
    assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]), (ch.message.tool_calls ?? []).map((c) => [fn(c).name, fn(c).arguments]));
  }
}

for (const f of FORMATS) {
  test(`${f.name}: tool_choice required, streaming and not: every call parses and matches its schema; deltas reassemble exactly`, async () => {
    const client = f.client!;
    let calls = 0;
    for (const seed of [0, 1, 2]) {
      const params = { model: 'tiny', messages: user('weather?'), tools: TOOLS, tool_choice: 'required' as const, n: 3, temperature: 1, seed, max_tokens: 300 };
      const whole = await client.chat.completions.create(params);
      for (const ch of whole.choices) {
        // parallel calls: a random model may keep calling until max_tokens cuts the last one
        assert.ok(ch.finish_reason === 'tool_calls' || ch.finish_reason === 'length', JSON.stringify(ch));
        assert.equal(ch.message.content, null);
        assert.ok(ch.message.tool_calls!.length >= 1);
        const complete = ch.finish_reason === 'length' ? ch.message.tool_calls!.slice(0, -1) : ch.message.tool_calls!;
        for (const call of complete) {
          assert.equal(call.type, 'function');
          assert.match(call.id, f.id);
          assert.ok(validArgs(fn(call).name, fn(call).arguments), `${fn(call).name} ${fn(call).arguments}`);
          calls++;
        }
      }
      assertSame(whole, await chatStream(client, params));
    }
    assert.ok(calls >= 9);
  });

  test(`${f.name}: a named function and parallel_tool_calls false force exactly one valid call; the SDK's stream helper agrees`, async () => {
    const client = f.client!;
    const named = { model: 'tiny', messages: user('time?'), tools: TOOLS, tool_choice: { type: 'function' as const, function: { name: 'get_time' } }, n: 4, temperature: 1, seed: 5, max_tokens: 100 };
    const whole = await client.chat.completions.create(named);
    for (const ch of whole.choices) {
      assert.equal(ch.finish_reason, 'tool_calls');
      assert.equal(ch.message.tool_calls!.length, 1);
      assert.equal(fn(ch.message.tool_calls![0]!).name, 'get_time');
      assert.ok(validArgs('get_time', fn(ch.message.tool_calls![0]!).arguments));
    }
    assertSame(whole, await chatStream(client, named));
    for (const seed of [7, 8]) {
      const single = { model: 'tiny', messages: user('x'), tools: TOOLS, tool_choice: 'required' as const, parallel_tool_calls: false, temperature: 1, seed, max_tokens: 300 };
      const one = await client.chat.completions.create(single);
      assert.equal(one.choices[0]!.finish_reason, 'tool_calls');
      assert.equal(one.choices[0]!.message.tool_calls!.length, 1);
      const call = fn(one.choices[0]!.message.tool_calls![0]!);
      assert.ok(validArgs(call.name, call.arguments), `${call.name} ${call.arguments}`);
      const final = await client.chat.completions.stream(single).finalChatCompletion();
      assert.equal(final.choices[0]!.finish_reason, 'tool_calls');
      assert.deepEqual(final.choices[0]!.message.tool_calls!.map((c) => [fn(c).name, fn(c).arguments]), [[call.name, call.arguments]]);
    }
  });

  test(`${f.name}: tool_choice auto parses a call the model writes in its format, and leaves plain text alone`, async () => {
    const client = f.client!;
    for (const [text, isCall] of [[f.callText('CET'), true], ['plain answer', false]] as const) {
      // pin the output: the grammar allows exactly this text
      const params = { model: 'tiny', messages: user('time?'), tools: TOOLS, tool_choice: 'auto' as const, n: 2, temperature: 1, seed: 3, max_tokens: 120, guided_choice: [text] } as OpenAI.ChatCompletionCreateParamsNonStreaming;
      const whole = await client.chat.completions.create(params);
      for (const ch of whole.choices) {
        if (isCall) {
          assert.equal(ch.finish_reason, 'tool_calls');
          assert.equal(ch.message.content, null);
          assert.deepEqual(ch.message.tool_calls!.map((c) => [fn(c).name, fn(c).arguments]), [['get_time', '{"tz": "CET"}']]);
          assert.match(ch.message.tool_calls![0]!.id, f.id);
        } else {
          assert.equal(ch.finish_reason, 'stop');
          assert.equal(ch.message.content, 'plain answer');
          assert.equal(ch.message.tool_calls, undefined);
        }
      }
      assertSame(whole, await chatStream(client, params as Omit<OpenAI.ChatCompletionCreateParamsStreaming, 'stream'>));
    }
  });

  test(`${f.name}: a conversation carrying earlier calls and results renders; tool_choice none parses nothing`, async () => {
    const client = f.client!;
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'user', content: 'weather in Oslo?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'abcDEF123', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo", "unit": "c"}' } }] },
      { role: 'tool', tool_call_id: 'abcDEF123', content: '{"temp": 3}' },
    ];
    for (const tool_choice of ['auto', 'none'] as const) {
      const r = await client.chat.completions.create({ model: 'tiny', messages, tools: TOOLS, tool_choice, max_tokens: 8 });
      assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0]!.finish_reason));
    }
    const none = await client.chat.completions.create({ model: 'tiny', messages: user('x'), tools: TOOLS, tool_choice: 'none', max_tokens: 120, guided_choice: [f.callText('UTC')] } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    assert.equal(none.choices[0]!.message.content, f.callText('UTC'));
    assert.equal(none.choices[0]!.message.tool_calls, undefined);
  });
}

test('the format comes from the template, or from --tool-call-format, which the server reports at startup', async () => {
  assert.match(FORMATS[0]!.srv!.stderr(), /tool calls: llama3_json format \(detected from the chat template and vocabulary\)/);
  assert.match(FORMATS[1]!.srv!.stderr(), /tool calls: mistral format \(--tool-call-format\)/);
  // the flag overrides what the Llama template says: calls are forced and parsed as Hermes tags
  const dir = modelDir(LLAMA31);
  const hermes = await spawnServer({ dir, args: ['--tool-call-format', 'hermes'] });
  try {
    assert.match(hermes.stderr(), /tool calls: hermes format \(--tool-call-format\)/);
    const client = new OpenAI({ baseURL: `${hermes.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const r = await client.chat.completions.create({ model: 'tiny', messages: user('time?'), tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_time' } }, temperature: 1, seed: 2, max_tokens: 100 });
    assert.equal(r.choices[0]!.finish_reason, 'tool_calls');
    assert.match(r.choices[0]!.message.tool_calls![0]!.id, /^call_/);
    assert.ok(validArgs('get_time', fn(r.choices[0]!.message.tool_calls![0]!).arguments));
  } finally {
    await hermes.stop();
  }
  // a bad value is a usage error before anything loads
  for (const bad of ['xml', 'llama3-json', '']) {
    await assert.rejects(runServe(['--model', dir, '--tool-call-format', bad]), (err: unknown) => {
      assert.ok(err instanceof UsageError);
      assert.match((err as Error).message, /--tool-call-format must be auto, hermes, llama3 or mistral/);
      return true;
    });
  }
});
