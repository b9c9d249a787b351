// POST /v1/messages through the official @anthropic-ai/sdk client against a spawned server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { spawnServer, postJson, parseSse, type Spawned } from './helpers.ts';

let srv: Spawned;
let client: Anthropic;

before(async () => {
  srv = await spawnServer({ args: ['--api-key', 'sk-test'] });
  client = new Anthropic({ baseURL: srv.url, apiKey: 'sk-test', maxRetries: 0 });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const user = (text: string) => [{ role: 'user' as const, content: text }];
// this SDK version's types no longer list temperature/top_p/top_k; it still sends them
type Params = Anthropic.MessageCreateParamsNonStreaming;
const P = (p: Record<string, unknown>) => p as unknown as Params;

test('messages.create: text content, usage, max_tokens stop reason', async () => {
  const m = await client.messages.create(P({ model: 'tiny', max_tokens: 12, messages: user('hello'), temperature: 0 }));
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'tiny');
  assert.match(m.id, /^msg_/);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.usage.input_tokens > 5);
  assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 12);
  if (m.usage.output_tokens === 12) assert.equal(m.stop_reason, 'max_tokens');
  else assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
});

test('system prompt (string and blocks) and text blocks render the same prompt', async () => {
  const a = await client.messages.create(P({ model: 'tiny', max_tokens: 6, system: 'be brief', messages: user('hi'), temperature: 0 }));
  const b = await client.messages.create(P({
    model: 'tiny', max_tokens: 6, temperature: 0,
    system: [{ type: 'text', text: 'be brief' }],
    messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }],
  }));
  // the whole prompt: input_tokens excludes what the prefix cache served (cache_read_input_tokens)
  const prompt = (u: { input_tokens: number; cache_read_input_tokens?: number | null }) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
  assert.equal(prompt(a.usage), prompt(b.usage));
  assert.ok((b.usage.cache_read_input_tokens ?? 0) > 0, 'the same prompt again reuses its cached blocks');
  assert.deepEqual(a.content, b.content);
  const c = await client.messages.create(P({ model: 'tiny', max_tokens: 6, messages: user('hi'), temperature: 0 }));
  assert.ok(prompt(c.usage) < prompt(a.usage));
  const counted = await client.messages.countTokens({ model: 'tiny', system: 'be brief', messages: user('hi') });
  assert.equal(counted.input_tokens, prompt(a.usage));
});

test('streaming events in order; text equals the non-streamed reply', async () => {
  const params = P({ model: 'tiny', max_tokens: 10, messages: user('stream this'), temperature: 0 });
  const full = await client.messages.create(params);
  const stream = client.messages.stream(params);
  const types: string[] = [];
  let text = '';
  for await (const e of stream) {
    types.push(e.type);
    if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') text += e.delta.text;
  }
  const final = await stream.finalMessage();
  assert.equal(text, (full.content[0] as { text: string }).text);
  assert.deepEqual(final.content, full.content);
  assert.equal(final.stop_reason, full.stop_reason);
  assert.equal(final.usage.output_tokens, full.usage.output_tokens);
  const order = types.filter((t, i) => t !== types[i - 1]);
  assert.deepEqual(order.filter((t) => t !== 'content_block_delta'), ['message_start', 'content_block_start', 'content_block_stop', 'message_delta', 'message_stop']);
  // the raw wire has the ping too
  const raw = await fetch(`${srv.url}/v1/messages`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test' },
    body: JSON.stringify({ ...params, stream: true }),
  });
  const events = parseSse(await raw.text()).map((f) => f.event);
  assert.deepEqual(events.slice(0, 3), ['message_start', 'content_block_start', 'ping']);
  assert.deepEqual(events.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
});

test('stop_sequences: stop_reason stop_sequence and the sequence that hit', async () => {
  const base = P({ model: 'tiny', max_tokens: 60, messages: user('the quick brown fox'), temperature: 0 });
  const full = await client.messages.create(base);
  const text = (full.content[0] as { text: string }).text;
  let stop: string | undefined;
  for (let i = 3; i + 2 <= text.length && !stop; i++) {
    const s = text.slice(i, i + 2);
    if (/^[\x21-\x7e]{2}$/.test(s) && text.indexOf(s) === i) stop = s;
  }
  assert.ok(stop, `no printable window in ${JSON.stringify(text)}`);
  const r = await client.messages.create({ ...base, stop_sequences: ['zz-never', stop] });
  assert.equal((r.content[0] as { text: string }).text, text.slice(0, text.indexOf(stop)));
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, stop);
  const final = await client.messages.stream({ ...base, stop_sequences: [stop] }).finalMessage();
  assert.equal(final.stop_reason, 'stop_sequence');
  assert.equal(final.stop_sequence, stop);
  assert.equal((final.content[0] as { text: string }).text, text.slice(0, text.indexOf(stop)));
});

test('a final assistant message is a prefill the reply continues', async () => {
  const r = await client.messages.create(P({
    model: 'tiny', max_tokens: 5, temperature: 0,
    messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Sure, here' }],
  }));
  const plain = await client.messages.create(P({ model: 'tiny', max_tokens: 5, temperature: 0, messages: user('hi') }));
  // the prefill's text is in the prompt (no end-of-turn after it), not repeated in the reply:
  // the same as completing the rendered ChatML text by hand
  const prompt = (u: { input_tokens: number; cache_read_input_tokens?: number | null }) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
  assert.ok(prompt(r.usage) > prompt(plain.usage));
  const raw = await postJson(`${srv.url}/v1/completions`, {
    model: 'tiny', max_tokens: 5, temperature: 0,
    prompt: '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure, here',
  }, { 'x-api-key': 'sk-test' });
  assert.equal(raw.status, 200);
  assert.equal(raw.body.usage.prompt_tokens, prompt(r.usage));
  assert.equal((r.content[0] as { text: string }).text, raw.body.choices[0].text);
});

test('errors in Anthropic shape: bad key 401, missing max_tokens 400, unknown model 404, tools refused', async () => {
  const bad = new Anthropic({ baseURL: srv.url, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: 'tiny', max_tokens: 5, messages: user('x') }), (e: unknown) => {
    assert.ok(e instanceof Anthropic.AuthenticationError);
    assert.equal(e.status, 401);
    return true;
  });
  const h = { 'x-api-key': 'sk-test' };
  const missing = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', messages: user('x') }, h);
  assert.equal(missing.status, 400);
  assert.deepEqual(missing.body, { type: 'error', error: { type: 'invalid_request_error', message: 'max_tokens is required' } });
  const unknown = await postJson(`${srv.url}/v1/messages`, { model: 'claude-nope', max_tokens: 5, messages: user('x') }, h);
  assert.equal(unknown.status, 404);
  assert.equal(unknown.body.error.type, 'not_found_error');
  const tools = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 5, messages: user('x'), tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, h);
  assert.equal(tools.status, 400);
  assert.match(tools.body.error.message, /a server tool\) is not supported yet/);
  const temp = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 5, messages: user('x'), temperature: 1.5 }, h);
  assert.equal(temp.status, 400);
  assert.match(temp.body.error.message, /temperature must be <= 1/);
  const role = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 5, messages: [{ role: 'system', content: 'x' }] }, h);
  assert.equal(role.status, 400);
  const image = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }, h);
  assert.equal(image.status, 400);
  assert.match(image.body.error.message, /content block type "image".*not supported yet/);
  // still serving
  const ok = await client.messages.create({ model: 'tiny', max_tokens: 2, messages: user('x') });
  assert.equal(ok.type, 'message');
});

test('count_tokens refuses the tool and output schemas /v1/messages refuses, with the same message', async () => {
  const h = { 'x-api-key': 'sk-test' };
  const base = { model: 'tiny', max_tokens: 5, messages: user('x') };
  const bodies = [
    { ...base, tools: [{ name: 'f', input_schema: { type: 12 } }] },
    { ...base, tools: [{ name: 'f', input_schema: { type: 'array', minItems: -1 } }] },
    { ...base, output_config: { format: { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'string', maxLength: -3 } } } } } },
  ];
  for (const body of bodies) {
    const messages = await postJson(`${srv.url}/v1/messages`, body, h);
    const count = await postJson(`${srv.url}/v1/messages/count_tokens`, body, h);
    assert.equal(messages.status, 400, JSON.stringify(messages.body));
    assert.equal(count.status, 400, JSON.stringify(count.body));
    assert.equal(count.body.error.type, 'invalid_request_error');
    assert.match(count.body.error.message, /invalid JSON schema/);
    assert.equal(count.body.error.message.replace(/^output_config\.format\.schema: /, ''), messages.body.error.message.replace(/^output_config\.format\.schema: /, ''));
  }
  const ok = await postJson(`${srv.url}/v1/messages/count_tokens`, { ...base, tools: [{ name: 'f', input_schema: { type: 'object', properties: { minItems: { type: 'integer' } } } }] }, h);
  assert.equal(ok.status, 200);
  assert.ok(ok.body.input_tokens > 0);
});
