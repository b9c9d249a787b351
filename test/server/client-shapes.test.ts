// Shapes clients send on /v1/chat/completions that must not be 400s: input_text parts (the
// Responses API's spelling), prediction (predicted outputs), custom tools (accepted, never
// offered), tool_choice allowed_tools (only the listed tools offered; required forces a call).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnServer, postJson, type Spawned } from './helpers.ts';

let srv: Spawned;
before(async () => {
  srv = await spawnServer({ model: { maxPositions: 2048 } });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const chat = (body: Record<string, unknown>) => postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', max_tokens: 4, temperature: 0, ...body });
const fn = (name: string) => ({ type: 'function', function: { name, parameters: { type: 'object', properties: { q: { type: 'string', maxLength: 3 } }, required: ['q'] } } });

test('input_text parts read as text parts; prediction is accepted (checked, not used)', async () => {
  const a = await chat({ messages: [{ role: 'user', content: [{ type: 'input_text', text: 'hello' }] }] });
  const b = await chat({ messages: [{ role: 'user', content: [{ type: 'text', text: 'hello' }] }] });
  assert.equal(a.status, 200, JSON.stringify(a.body));
  assert.equal(a.body.choices[0].message.content, b.body.choices[0].message.content);
  assert.equal(a.body.usage.prompt_tokens, b.body.usage.prompt_tokens);
  const p = await chat({ messages: [{ role: 'user', content: 'hello' }], prediction: { type: 'content', content: 'hello there' } });
  assert.equal(p.status, 200);
  assert.equal(p.body.choices[0].message.content, b.body.choices[0].message.content);
  const bad = await chat({ messages: [{ role: 'user', content: 'hello' }], prediction: { type: 'content', content: 7 } });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.error.param, 'prediction');
});

test('custom tools are accepted and not offered; naming one in tool_choice is a 400 that says so', async () => {
  const custom = { type: 'custom', custom: { name: 'shell', description: 'run a command' } };
  const r = await chat({ messages: [{ role: 'user', content: 'hi' }], tools: [custom, fn('lookup')], tool_choice: 'required', max_tokens: 40 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  for (const c of r.body.choices[0].message.tool_calls ?? []) assert.equal(c.function.name, 'lookup');
  const only = await chat({ messages: [{ role: 'user', content: 'hi' }], tools: [custom] });
  assert.equal(only.status, 200, 'a request whose only tool is custom runs as one without tools');
  const named = await chat({ messages: [{ role: 'user', content: 'hi' }], tools: [custom, fn('lookup')], tool_choice: { type: 'function', function: { name: 'shell' } } });
  assert.equal(named.status, 400);
  assert.match(named.body.error.message, /custom tool "shell".*not offered/);
  const nameless = await chat({ messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'custom', custom: {} }] });
  assert.equal(nameless.status, 400);
  assert.match(nameless.body.error.message, /tools\[0\]\.custom\.name must be a non-empty string/);
});

test('tool_choice allowed_tools: required forces a call of a listed tool; bad shapes are 400s', async () => {
  const tools = [fn('alpha'), fn('beta')];
  const allowed = (mode: string, names: string[]) => ({ type: 'allowed_tools', allowed_tools: { mode, tools: names.map((name) => ({ type: 'function', function: { name } })) } });
  for (const seed of [1, 2, 3]) {
    const r = await chat({ messages: [{ role: 'user', content: 'go' }], tools, tool_choice: allowed('required', ['beta']), temperature: 1, seed, max_tokens: 60 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const calls = r.body.choices[0].message.tool_calls;
    assert.ok(calls && calls.length >= 1, JSON.stringify(r.body.choices[0]));
    for (const c of calls) assert.equal(c.function.name, 'beta');
  }
  // the other spelling of a listed tool ({type, name}) and mode auto
  const auto = await chat({ messages: [{ role: 'user', content: 'go' }], tools, tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'auto', tools: [{ type: 'function', name: 'alpha' }] } } });
  assert.equal(auto.status, 200, JSON.stringify(auto.body));
  const refused: [unknown, RegExp][] = [
    [{ type: 'allowed_tools' }, /allowed_tools must be an object/],
    [allowed('sometimes', ['alpha']), /mode must be "auto" or "required"/],
    [allowed('auto', []), /tools must be a non-empty array/],
    [allowed('auto', ['gamma']), /names "gamma", which is not in tools/],
  ];
  for (const [choice, why] of refused) {
    const r = await chat({ messages: [{ role: 'user', content: 'go' }], tools, tool_choice: choice });
    assert.equal(r.status, 400, JSON.stringify(choice));
    assert.equal(r.body.error.param, 'tool_choice');
    assert.match(r.body.error.message, why);
  }
});

test('return_tokens_as_token_ids (vLLM): logprobs name tokens "token_id:N", the same tokens and numbers otherwise', async () => {
  const body = { messages: [{ role: 'user', content: 'hello' }], logprobs: true, top_logprobs: 2, max_tokens: 5 };
  const plain = await chat(body);
  const ids = await chat({ ...body, return_tokens_as_token_ids: true });
  assert.equal(ids.status, 200, JSON.stringify(ids.body));
  const a = plain.body.choices[0].logprobs.content, b = ids.body.choices[0].logprobs.content;
  assert.equal(a.length, b.length);
  for (let k = 0; k < a.length; k++) {
    assert.match(b[k].token, /^token_id:\d+$/);
    assert.equal(b[k].logprob, a[k].logprob);
    assert.deepEqual(b[k].bytes, a[k].bytes);
    assert.deepEqual(b[k].top_logprobs.map((t: { logprob: number }) => t.logprob), a[k].top_logprobs.map((t: { logprob: number }) => t.logprob));
    for (const t of b[k].top_logprobs) assert.match(t.token, /^token_id:\d+$/);
  }
  const legacy = await postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt: 'hello', max_tokens: 3, temperature: 0, logprobs: 1, return_tokens_as_token_ids: true });
  assert.equal(legacy.status, 200);
  for (const t of legacy.body.choices[0].logprobs.tokens) assert.match(t, /^token_id:\d+$/);
  const bad = await chat({ ...body, return_tokens_as_token_ids: 'yes' });
  assert.equal(bad.status, 400);
});
