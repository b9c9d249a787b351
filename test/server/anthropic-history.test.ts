// /v1/messages with the history agent harnesses send: system messages inside `messages` (Claude
// Code's default mode), assistant turns carrying thinking / redacted_thinking blocks (from other
// servers), and `thinking` as the template's enable_thinking switch. The template below renders
// reasoning_content and enable_thinking as Qwen3's does, so count_tokens shows what was rendered.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { spawnServer, postJson, type Spawned } from './helpers.ts';

const THINKING_TEMPLATE =
  "{%- for m in messages %}<|im_start|>{{ m.role }}\n{%- if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n{%- endif %}" +
  "{{ m.content }}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n" +
  "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n{%- endif %}{%- endif %}";

let srv: Spawned;
let client: Anthropic;

before(async () => {
  srv = await spawnServer({ model: { chatTemplate: THINKING_TEMPLATE } });
  client = new Anthropic({ baseURL: srv.url, apiKey: 'x', maxRetries: 0 });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const count = async (body: Record<string, unknown>): Promise<number> => {
  const r = await postJson(`${srv.url}/v1/messages/count_tokens`, { model: 'tiny', ...body });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body.input_tokens as number;
};
const hi = { role: 'user', content: 'hi' };

test('a system message inside messages renders as the system prompt does, and anywhere in the conversation', async () => {
  assert.equal(await count({ messages: [{ role: 'system', content: 'be brief' }, hi] }), await count({ system: 'be brief', messages: [hi] }));
  assert.equal(await count({ messages: [{ role: 'system', content: [{ type: 'text', text: 'be brief' }] }, hi] }), await count({ system: 'be brief', messages: [hi] }));
  const mid = [hi, { role: 'assistant', content: 'hello' }, { role: 'system', content: 'now answer in French' }, { role: 'user', content: 'ok?' }];
  assert.ok(await count({ messages: mid }) > await count({ messages: [hi, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'ok?' }] }));
  const m = await client.messages.create({ model: 'tiny', max_tokens: 3, messages: mid as Anthropic.MessageParam[] });
  assert.equal(m.type, 'message');
  // still no conversation of system messages alone
  const r = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 3, messages: [{ role: 'system', content: 'x' }] });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /must contain a user message/);
});

test('thinking blocks in assistant history render as its reasoning; redacted_thinking is left out', async () => {
  const turn = (content: unknown) => ({ messages: [hi, { role: 'assistant', content }, { role: 'user', content: 'and?' }] });
  const plain = await count(turn([{ type: 'text', text: 'hello' }]));
  const thought = await count(turn([{ type: 'thinking', thinking: 'the user greets me', signature: 'sig' }, { type: 'text', text: 'hello' }]));
  const redacted = await count(turn([{ type: 'redacted_thinking', data: 'opaque' }, { type: 'text', text: 'hello' }]));
  assert.ok(thought > plain, `${thought} > ${plain}`);
  assert.equal(redacted, plain);
  // a turn that was only thinking still counts as the assistant's turn
  assert.ok(await count(turn([{ type: 'thinking', thinking: 'hmm', signature: 's' }])) > await count(turn('')));
  const bad = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 3, ...turn([{ type: 'thinking', thinking: 7 }]) });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /messages\[1\]\.content\[0\]\.thinking must be a string, got number/);
  const inUser = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', max_tokens: 3, messages: [{ role: 'user', content: [{ type: 'thinking', thinking: 'x' }] }] });
  assert.equal(inUser.status, 400);
  assert.match(inUser.body.error.message, /content block type "thinking" in a user message/);
  const toolResult = await postJson(`${srv.url}/v1/messages`, {
    model: 'tiny', max_tokens: 3, messages: [hi, { role: 'assistant', content: [{ type: 'tool_result', tool_use_id: 'a', content: 'x' }] }, hi],
  });
  assert.equal(toolResult.status, 400);
  assert.match(toolResult.body.error.message, /content block type "tool_result" in an assistant message/);
});

test('thinking: enabled / disabled / adaptive drive enable_thinking; the budget is checked as Anthropic checks it', async () => {
  const base = { max_tokens: 4096, messages: [hi] };
  const adaptive = await count({ ...base, thinking: { type: 'adaptive' } });
  assert.equal(adaptive, await count(base));
  assert.equal(await count({ ...base, thinking: { type: 'enabled', budget_tokens: 2048 } }), adaptive);
  assert.ok(await count({ ...base, thinking: { type: 'disabled' } }) > adaptive, 'disabled: the empty think block');
  // count_tokens takes no max_tokens: the budget is not compared with it there
  assert.equal(await count({ messages: [hi], thinking: { type: 'enabled', budget_tokens: 2048 } }), adaptive);
  const refused: [Record<string, unknown>, RegExp][] = [
    [{ type: 'enabled' }, /thinking\.budget_tokens must be an integer, got null/],
    [{ type: 'enabled', budget_tokens: 100 }, /thinking\.budget_tokens must be at least 1024, got 100/],
    [{ type: 'enabled', budget_tokens: 4096 }, /thinking\.budget_tokens \(4096\) must be less than max_tokens \(4096\)/],
    [{ type: 'sometimes' }, /thinking\.type must be "enabled", "disabled" or "adaptive", got "sometimes"/],
  ];
  for (const [thinking, why] of refused) {
    const r = await postJson(`${srv.url}/v1/messages`, { model: 'tiny', ...base, thinking });
    assert.equal(r.status, 400, JSON.stringify(thinking));
    assert.match(r.body.error.message, why);
  }
  const m = await client.messages.create({ model: 'tiny', max_tokens: 2048, messages: [{ role: 'user', content: 'hi' }], thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(m.type, 'message');
});
