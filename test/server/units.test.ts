// In-process tests of the server's parsing and formatting functions (no HTTP).
import { test } from 'node:test';
import { readFileSync, writeFileSync } from 'node:fs';
import assert from 'node:assert/strict';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine, ContextLengthError, EngineClosedError } from '../../src/execution/engine.ts';
import { NeverFitsError, QueueFullError } from '../../src/execution/scheduler.ts';
import { SamplingParamsError } from '../../src/sampling/index.ts';
import { ChatTemplateError } from '../../src/artifacts/chat-template.ts';
import { ServedModel } from '../../src/server/served-model.ts';
import { Fields } from '../../src/server/fields.ts';
import { HttpError, clientErrorOf, openaiErrorBody, anthropicErrorBody } from '../../src/server/errors.ts';
import { parseGenerationParams, planSequences, stopReasonOf } from '../../src/server/openai-params.ts';
import { parsePrompts } from '../../src/server/openai-completions.ts';
import { parseChatMessages } from '../../src/server/openai-chat.ts';
import { parseMessagesRequest, anthropicStop } from '../../src/server/anthropic.ts';
import { ThinkSplitter, splitThink, promptOpensThink } from '../../src/server/reasoning.ts';
import { chatLogprob, legacyLogprobs } from '../../src/server/logprobs-format.ts';
import { parseJsonObject } from '../../src/server/http-io.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const loaded = await loadModel(new ReferenceBackend(), writeTinyLlama({ maxPositions: 64 }));
const engine = new Engine(loaded.model, loaded, { maxBatch: 2 });
const model = new ServedModel('tiny', loaded, engine);

function status(fn: () => unknown): { status: number; message: string; param?: string | null } {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof HttpError, `expected an HttpError, got ${e}`);
    return { status: e.status, message: e.message, param: e.options.param };
  }
  assert.fail('expected a throw');
}

async function statusAsync(fn: () => Promise<unknown>): Promise<{ status: number; message: string; param?: string | null }> {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof HttpError, `expected an HttpError, got ${e}`);
    return { status: e.status, message: e.message, param: e.options.param };
  }
  assert.fail('expected a rejection');
}

test('Fields: null is absent; wrong types and ranges name the field', () => {
  const f = new Fields({ a: null, n: 3, s: 'x', b: true, o: { inner: 'y' } });
  assert.equal(f.number('a'), undefined);
  assert.equal(f.number('n', { integer: true, min: 1, max: 3 }), 3);
  assert.deepEqual(status(() => f.number('s')), { status: 400, message: 's must be a number, got string', param: 's' });
  assert.deepEqual(status(() => f.number('n', { max: 2 })), { status: 400, message: 'n must be <= 2, got 3', param: 'n' });
  assert.deepEqual(status(() => f.number('n', { min: 3, minExclusive: true })), { status: 400, message: 'n must be > 3, got 3', param: 'n' });
  assert.deepEqual(status(() => f.boolean('n')), { status: 400, message: 'n must be a boolean, got number', param: 'n' });
  assert.deepEqual(status(() => f.object('o')!.number('inner')), { status: 400, message: 'o.inner must be a number, got string', param: 'o.inner' });
  assert.deepEqual(f.stringList('s', 4), ['x']);
  assert.equal(status(() => new Fields({ l: ['a', 'b', 'c'] }).stringList('l', 2)).status, 400);
});

test('parseJsonObject: empty, malformed and non-object bodies are 400s', () => {
  assert.deepEqual(parseJsonObject(Buffer.from('{"a":1}')), { a: 1 });
  for (const bad of ['', '{', '[]', '"x"', 'null', '12'])
    assert.equal(status(() => parseJsonObject(Buffer.from(bad))).status, 400, JSON.stringify(bad));
});

test('generation params: defaults from the model, overrides, seeds per choice, max_tokens capped to the context', () => {
  const p = parseGenerationParams(new Fields({ temperature: 0.7, top_k: 5, seed: 10, n: 3, stop: 'END', max_tokens: 1000, logit_bias: { 65: 2 } }), model, 'completions');
  assert.equal(p.n, 3);
  assert.deepEqual(p.stop, ['END']);
  assert.equal(p.sampling.temperature, 0.7);
  assert.equal(p.sampling.topK, 5);
  const plans = planSequences([[1, 2, 3], [4, 5]], p, model);
  assert.equal(plans.length, 6);
  assert.deepEqual(plans.map((x) => x.promptIndex), [0, 0, 0, 1, 1, 1]);
  assert.deepEqual(plans.map((x) => x.request.sampling!.seed), [10, 11, 12, 10, 11, 12]);
  assert.deepEqual(plans.map((x) => x.request.maxTokens), [61, 61, 61, 62, 62, 62]); // context 64
  // no seed: no seed on any choice (each draws its own randomness)
  const q = parseGenerationParams(new Fields({ n: 2 }), model, 'chat');
  assert.deepEqual(planSequences([[1]], q, model).map((x) => x.request.sampling!.seed), [undefined, undefined]);
  // defaults: the tiny model's generation config is greedy
  assert.equal(q.sampling.temperature, 0);
  assert.equal(q.topLogprobs, undefined);
  assert.equal(parseGenerationParams(new Fields({ logprobs: true }), model, 'chat').topLogprobs, 0);
  assert.equal(parseGenerationParams(new Fields({ logprobs: 3 }), model, 'completions').topLogprobs, 3);
  assert.equal(parseGenerationParams(new Fields({ max_tokens: 5, max_completion_tokens: 7 }), model, 'chat').maxTokens, 7);
  const ctx = status(() => planSequences([Array(64).fill(1)], q, model));
  assert.equal(ctx.status, 400);
  assert.match(ctx.message, /the prompt has 64 tokens, but this model's context holds 64/);
  assert.match(status(() => parseGenerationParams(new Fields({ top_p: 0 }), model, 'chat')).message, /top_p must be in \(0, 1\]/);
  assert.match(status(() => parseGenerationParams(new Fields({ logit_bias: { 9999: 1 } }), model, 'chat')).message, /out of range \[0, 258\]/);
  assert.match(status(() => parseGenerationParams(new Fields({ response_format: { type: 'yaml' } }), model, 'chat')).message, /response_format.type must be/);
  assert.deepEqual(parseGenerationParams(new Fields({ response_format: { type: 'json_object' } }), model, 'chat').constraint, { spec: { type: 'json_object' }, param: 'response_format' });
  assert.match(status(() => parseGenerationParams(new Fields({ guided_regex: 'a', guided_choice: ['b'] }), model, 'chat')).message, /only one output constraint/);
  assert.doesNotThrow(() => parseGenerationParams(new Fields({ response_format: { type: 'text' }, tools: [], tool_choice: 'none', user: 'u' }), model, 'chat'));
});

test('completions prompts: every accepted form, and the rejected ones', async () => {
  assert.deepEqual(await parsePrompts('hi', model), [[104, 105]]);
  assert.deepEqual(await parsePrompts(['hi', 'a'], model), [[104, 105], [97]]);
  assert.deepEqual(await parsePrompts([5, 6], model), [[5, 6]]);
  assert.deepEqual(await parsePrompts([[5], [6, 7]], model), [[5], [6, 7]]);
  // one long token-id prompt is not "too many prompts"
  const long = Array.from({ length: 1000 }, (_, k) => k % 250);
  assert.deepEqual(await parsePrompts(long, model), [long]);
  await assert.rejects(parsePrompts(Array.from({ length: 300 }, () => "a"), model), /300 prompts; at most 256/);
  for (const bad of [undefined, 3, {}, [], ['a', 1], [[1], 'a'], [1.5], [[-1]], [[]], [259]])
    assert.equal((await statusAsync(() => parsePrompts(bad as never, model))).status, 400, JSON.stringify(bad));
});

test('chat messages: roles, content parts, developer as system, nullable assistant content', async () => {
  const m = parseChatMessages([
    { role: 'developer', content: 'rules' },
    { role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] },
    { role: 'assistant', content: null, name: null },
    { role: 'tool', content: 'result', tool_call_id: 'c1' },
  ]);
  assert.deepEqual(m, [
    { role: 'system', content: 'rules' },
    { role: 'user', content: 'a\nb' },
    { role: 'assistant', content: '' },
    { role: 'tool', content: 'result', tool_call_id: 'c1' },
  ]);
  assert.equal(status(() => parseChatMessages([{ role: 'user', content: null }])).status, 400);
  assert.match(status(() => parseChatMessages([{ role: 'user', content: [{ type: 'input_audio' }] }])).message, /not supported yet/);
  assert.deepEqual((await model.renderChat(m)).ids.slice(0, 1), [257]); // <|im_start|> as one special token
  assert.ok((await model.renderChat(m)).text.endsWith('<|im_start|>assistant\n'));
  assert.ok((await model.renderChat([{ role: 'user', content: 'q' }, { role: 'assistant', content: 'pre' }], { continueFinal: true })).text.endsWith('assistant\npre'));
});

test('anthropic request parsing', () => {
  const r = parseMessagesRequest({
    model: 'tiny', max_tokens: 9, system: [{ type: 'text', text: 'sys' }], stop_sequences: ['x'], top_k: 3,
    messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Sure' }],
  }, model);
  assert.equal(r.prefill, true);
  assert.deepEqual(r.messages[0], { role: 'system', content: 'sys' });
  assert.equal(r.sampling.topK, 3);
  assert.deepEqual(r.stop, ['x']);
  assert.equal(parseMessagesRequest({ max_tokens: 1, messages: [{ role: 'user', content: 'a' }, { role: 'assistant', content: '  ' }] }, model).prefill, false);
  assert.match(status(() => parseMessagesRequest({ messages: [] }, model)).message, /max_tokens is required/);
  assert.equal(status(() => parseMessagesRequest({ model: 'other', max_tokens: 1, messages: [{ role: 'user', content: 'a' }] }, model)).status, 404);
  assert.match(status(() => parseMessagesRequest({ max_tokens: 1, thinking: { type: 'enabled', budget_tokens: 100 }, messages: [{ role: 'user', content: 'a' }] }, model)).message, /thinking\.budget_tokens must be at least 1024, got 100/);
  assert.deepEqual(parseMessagesRequest({ max_tokens: 4096, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'a' }] }, model).variables, { enable_thinking: true });
  assert.deepEqual(parseMessagesRequest({ max_tokens: 9, thinking: { type: 'disabled' }, messages: [{ role: 'system', content: 's' }, { role: 'user', content: 'a' }] }, model).messages.map((m) => m.role), ['system', 'user']);
});

test('think splitter: any chunking gives the whole-text split; tags never leak', () => {
  const cases: [string, boolean, string, string][] = [
    ['<think>plan it</think>answer', false, 'plan it', 'answer'],
    ['  \n<think>a</think>\n\nb', false, 'a', '\n\nb'],
    ['no thinking here', false, '', 'no thinking here'],
    ['text <think>not at start</think>', false, '', 'text <think>not at start</think>'],
    ['inside already</think>done', true, 'inside already', 'done'],
    ['never closed <', true, 'never closed <', ''],
    ['<thin', false, '', '<thin'],
    ['<think>a</thin', false, 'a</thin', ''],
  ];
  for (const [text, inside, reasoning, content] of cases) {
    assert.deepEqual(splitThink(text, inside), { reasoning, content }, text);
    for (let step = 1; step <= 3; step++) {
      const s = new ThinkSplitter(inside);
      let r = '', c = '';
      for (let i = 0; i < text.length; i += step) {
        const o = s.push(text.slice(i, i + step));
        r += o.reasoning;
        c += o.content;
      }
      const f = s.flush();
      assert.deepEqual({ reasoning: r + f.reasoning, content: c + f.content }, { reasoning, content }, `${text} by ${step}`);
    }
  }
  assert.equal(promptOpensThink('<|im_start|>assistant\n<think>\n'), true);
  assert.equal(promptOpensThink('<think>x</think>\n<|im_start|>assistant\n'), false);
  assert.equal(promptOpensThink('plain'), false);
});

test('token texts and logprobs shapes: exact bytes, partial UTF-8 as bytes:\\x..', () => {
  // "é" is two bytes: c3 a9, each its own token in the byte-level tiny tokenizer
  assert.deepEqual(model.tokens.get(0xc3), { token: 'bytes:\\xc3', bytes: [0xc3] });
  assert.deepEqual(model.tokens.get(32), { token: ' ', bytes: [32] });
  assert.deepEqual(model.tokens.get(256), { token: '<|endoftext|>', bytes: [...Buffer.from('<|endoftext|>')] });
  const lp = { token_id: 104, logprob: -0.5, top: [{ token_id: 104, logprob: -0.5 }, { token_id: 105, logprob: -Infinity }] };
  assert.deepEqual(chatLogprob(model.tokens, lp), {
    token: 'h', logprob: -0.5, bytes: [104],
    top_logprobs: [{ token: 'h', logprob: -0.5, bytes: [104] }, { token: 'i', logprob: -9999, bytes: [105] }],
  });
  assert.deepEqual(legacyLogprobs(model.tokens, [lp, { token_id: 105, logprob: -1, top: [] }], [0, 1]), {
    tokens: ['h', 'i'], token_logprobs: [-0.5, -1], top_logprobs: [{ h: -0.5, i: -9999 }, { i: -1 }], text_offset: [0, 1],
  });
});

test('stop reasons: eos id, stop string, max tokens', () => {
  const req = { promptIds: [1], maxTokens: 5, stop: ['xy', 'q'] };
  const ids = [...Buffer.from('abxyz')];
  assert.equal(stopReasonOf(model, req, ids.slice(0, 4), 'ab', 'stop'), 'xy');
  assert.equal(stopReasonOf(model, req, [97, 256], 'a', 'stop'), 256);
  assert.equal(stopReasonOf(model, req, [97], 'a', 'length'), null);
  assert.deepEqual(anthropicStop(model, req, ids.slice(0, 4), 'ab', 'stop'), { stop_reason: 'stop_sequence', stop_sequence: 'xy' });
  assert.deepEqual(anthropicStop(model, req, [97, 256], 'a', 'stop'), { stop_reason: 'end_turn', stop_sequence: null });
  assert.deepEqual(anthropicStop(model, req, [97], 'a', 'length'), { stop_reason: 'max_tokens', stop_sequence: null });
});

test('engine refusals map to client errors; anything else stays internal', () => {
  const cases: [unknown, number][] = [
    [new ContextLengthError('long'), 400], [new NeverFitsError('kv'), 400], [new QueueFullError('full'), 429],
    [new EngineClosedError('bye'), 503], [new SamplingParamsError([{ param: 'top_p', message: 'bad' }]), 400],
    [new ChatTemplateError('no system role'), 400],
  ];
  for (const [err, code] of cases) assert.equal(clientErrorOf(err)?.status, code, String(err));
  assert.equal(clientErrorOf(new RangeError('x')), undefined);
  assert.equal(clientErrorOf(new RangeError('x'), true)?.status, 400);
  assert.equal(clientErrorOf(new TypeError('bug')), undefined);
  const e = new HttpError(429, 'slow down', { code: 'queue_full' });
  assert.deepEqual(openaiErrorBody(e), { error: { message: 'slow down', type: 'rate_limit_error', param: null, code: 'queue_full' } });
  assert.deepEqual(anthropicErrorBody(e), { type: 'error', error: { type: 'rate_limit_error', message: 'slow down' } });
});

test('served model: the context is bounded by the KV cache the engine got', async () => {
  const small = new Engine(loaded.model, loaded, { maxBatch: 1, kvTokens: 32 });
  assert.equal(new ServedModel('t', loaded, small).contextLen, 32);
  assert.equal(model.contextLen, 64);
});

test('chat templates: none at all is a 400; a template that refuses the messages is a 400', async () => {
  const bare = new ServedModel('bare', { ...loaded, chatTemplate: undefined }, engine);
  assert.match((await statusAsync(() => bare.renderChat([{ role: 'user', content: 'x' }]))).message, /has no chat template; use \/v1\/completions/);
  const dir = writeTinyLlama();
  const file = `${dir}/tokenizer_config.json`;
  const cfg = JSON.parse(readFileSync(file, 'utf8'));
  cfg.chat_template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" + cfg.chat_template;
  writeFileSync(file, JSON.stringify(cfg));
  const strict = await loadModel(new ReferenceBackend(), dir);
  const sm = new ServedModel('strict', strict, new Engine(strict.model, strict, { maxBatch: 1 }));
  await sm.renderChat([{ role: 'user', content: 'x' }]);
  let caught: unknown;
  try {
    await sm.renderChat([{ role: 'system', content: 's' }, { role: 'user', content: 'x' }]);
  } catch (e) {
    caught = e;
  }
  const http = clientErrorOf(caught);
  assert.equal(http?.status, 400);
  assert.match(http!.message, /System role not supported/);
});
