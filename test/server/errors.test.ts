// Bad requests get the right 4xx with a useful message, in OpenAI's error shape, and never
// disturb the server: it keeps serving and logs no internal error.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { spawnServer, postJson, type Spawned } from './helpers.ts';

let srv: Spawned;

before(async () => {
  // small limits so body-size and queue cases are cheap to provoke
  srv = await spawnServer({ args: ['--max-body', '64K', '--max-batch', '1', '--max-queued', '1', '--api-key', 'k1'], model: { maxPositions: 128 } });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const AUTH = { authorization: 'Bearer k1' };
const chat = (extra: Record<string, unknown>) => ({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...extra });
const cmpl = (extra: Record<string, unknown>) => ({ model: 'tiny', prompt: 'hi', max_tokens: 2, ...extra });

interface Case {
  name: string;
  path: string;
  body: unknown;
  status: number;
  message: RegExp;
  param?: string | null;
  code?: string;
}

const CASES: Case[] = [
  { name: 'malformed JSON', path: '/v1/chat/completions', body: '{"model": "tiny", "messages": [', status: 400, message: /not valid JSON/, code: 'invalid_json' },
  { name: 'empty body', path: '/v1/completions', body: '', status: 400, message: /body is empty/ },
  { name: 'body is not an object', path: '/v1/completions', body: '[1, 2]', status: 400, message: /must be a JSON object/ },
  { name: 'messages missing', path: '/v1/chat/completions', body: { model: 'tiny' }, status: 400, message: /messages is required/, param: 'messages' },
  { name: 'messages wrong type', path: '/v1/chat/completions', body: chat({ messages: 'hi' }), status: 400, message: /messages must be an array, got string/, param: 'messages' },
  { name: 'messages empty', path: '/v1/chat/completions', body: chat({ messages: [] }), status: 400, message: /must not be empty/ },
  { name: 'bad role', path: '/v1/chat/completions', body: chat({ messages: [{ role: 'wizard', content: 'x' }] }), status: 400, message: /role must be one of/ },
  { name: 'content wrong type', path: '/v1/chat/completions', body: chat({ messages: [{ role: 'user', content: 5 }] }), status: 400, message: /content must be a string or an array/ },
  { name: 'image part', path: '/v1/chat/completions', body: chat({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), status: 400, message: /image_url.*not supported yet/ },
  { name: 'temperature wrong type', path: '/v1/chat/completions', body: chat({ temperature: 'hot' }), status: 400, message: /temperature must be a number, got string/, param: 'temperature' },
  { name: 'temperature negative', path: '/v1/chat/completions', body: chat({ temperature: -0.5 }), status: 400, message: /temperature must be >= 0/, param: 'temperature' },
  { name: 'top_p out of range', path: '/v1/completions', body: cmpl({ top_p: 1.5 }), status: 400, message: /top_p must be in \(0, 1\]/, param: 'top_p' },
  { name: 'top_k not an integer', path: '/v1/completions', body: cmpl({ top_k: 2.5 }), status: 400, message: /top_k must be an integer/, param: 'top_k' },
  { name: 'min_p out of range', path: '/v1/completions', body: cmpl({ min_p: 2 }), status: 400, message: /min_p must be in \[0, 1\]/, param: 'min_p' },
  { name: 'presence_penalty out of range', path: '/v1/completions', body: cmpl({ presence_penalty: 3 }), status: 400, message: /presence_penalty must be in \[-2, 2\]/ },
  { name: 'repetition_penalty zero', path: '/v1/completions', body: cmpl({ repetition_penalty: 0 }), status: 400, message: /repetition_penalty must be > 0/ },
  { name: 'n zero', path: '/v1/completions', body: cmpl({ n: 0 }), status: 400, message: /n must be >= 1/, param: 'n' },
  { name: 'n fractional', path: '/v1/completions', body: cmpl({ n: 1.5 }), status: 400, message: /n must be an integer/, param: 'n' },
  { name: 'max_tokens zero', path: '/v1/chat/completions', body: chat({ max_tokens: 0 }), status: 400, message: /max_tokens must be >= 1/, param: 'max_tokens' },
  { name: 'max_tokens string', path: '/v1/chat/completions', body: chat({ max_tokens: '10' }), status: 400, message: /max_tokens must be a integer|max_tokens must be an? integer/ },
  { name: 'seed fractional', path: '/v1/chat/completions', body: chat({ seed: 1.25 }), status: 400, message: /seed must be an integer/ },
  { name: 'stop wrong type', path: '/v1/chat/completions', body: chat({ stop: 5 }), status: 400, message: /stop must be a string or an array of strings/, param: 'stop' },
  { name: 'stop list with a number', path: '/v1/chat/completions', body: chat({ stop: ['a', 3] }), status: 400, message: /stop\[1\] must be a string/ },
  { name: 'stream wrong type', path: '/v1/chat/completions', body: chat({ stream: 'yes' }), status: 400, message: /stream must be a boolean/ },
  { name: 'stream_options without stream', path: '/v1/chat/completions', body: chat({ stream_options: { include_usage: true } }), status: 400, message: /only allowed when stream is true/ },
  { name: 'logit_bias bad key', path: '/v1/completions', body: cmpl({ logit_bias: { abc: 1 } }), status: 400, message: /logit_bias key "abc" is not an integer token id/, param: 'logit_bias' },
  { name: 'logit_bias id out of vocab', path: '/v1/completions', body: cmpl({ logit_bias: { 999999: 1 } }), status: 400, message: /out of range/ },
  { name: 'logit_bias value out of range', path: '/v1/completions', body: cmpl({ logit_bias: { 5: 500 } }), status: 400, message: /\[-100, 100\]/ },
  { name: 'top_logprobs too many', path: '/v1/chat/completions', body: chat({ logprobs: true, top_logprobs: 21 }), status: 400, message: /top_logprobs must be <= 20/ },
  { name: 'top_logprobs without logprobs', path: '/v1/chat/completions', body: chat({ top_logprobs: 2 }), status: 400, message: /requires logprobs/ },
  { name: 'completions logprobs too many', path: '/v1/completions', body: cmpl({ logprobs: 50 }), status: 400, message: /logprobs must be <= 20/ },
  { name: 'prompt missing', path: '/v1/completions', body: { model: 'tiny' }, status: 400, message: /prompt is required/, param: 'prompt' },
  { name: 'prompt wrong type', path: '/v1/completions', body: cmpl({ prompt: { text: 'x' } }), status: 400, message: /prompt must be a string, an array/ },
  { name: 'prompt mixed list', path: '/v1/completions', body: cmpl({ prompt: ['a', 1] }), status: 400, message: /prompt must be a string, an array/ },
  { name: 'prompt token outside vocab', path: '/v1/completions', body: cmpl({ prompt: [1, 2, 100000] }), status: 400, message: /outside the vocabulary/ },
  { name: 'prompt empty string', path: '/v1/completions', body: cmpl({ prompt: '' }), status: 400, message: /prompt is empty/ },
  { name: 'prompt longer than the context', path: '/v1/completions', body: cmpl({ prompt: 'x'.repeat(200) }), status: 400, message: /the prompt has 200 tokens, but this model's context holds 128/, code: 'context_length_exceeded' },
  { name: 'chat longer than the context', path: '/v1/chat/completions', body: chat({ messages: [{ role: 'user', content: 'y'.repeat(300) }] }), status: 400, message: /context holds 128/, code: 'context_length_exceeded' },
  // refused from its length alone, before tokenizing (a token of this tokenizer covers at most 13 characters)
  { name: 'prompt too long to fit in any tokenization', path: '/v1/completions', body: cmpl({ prompt: ' '.repeat(5000) }), status: 400, message: /the prompt has 5000 characters: at least 385 tokens .*context holds 128 tokens/, param: 'prompt', code: 'context_length_exceeded' },
  { name: 'chat too long to fit in any tokenization', path: '/v1/chat/completions', body: chat({ messages: [{ role: 'user', content: 'z'.repeat(5000) }] }), status: 400, message: /characters: at least \d+ tokens .*context holds 128 tokens/, param: 'messages', code: 'context_length_exceeded' },
  { name: 'unknown model', path: '/v1/chat/completions', body: chat({ model: 'gpt-17' }), status: 404, message: /"gpt-17" does not exist/, code: 'model_not_found' },
  { name: 'response_format unknown type', path: '/v1/chat/completions', body: chat({ response_format: { type: 'yaml' } }), status: 400, message: /response_format.type must be/, param: 'response_format' },
  { name: 'response_format bad schema', path: '/v1/chat/completions', body: chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 12 } } } }), status: 400, message: /invalid JSON schema: Type should be a string/, param: 'response_format', code: 'invalid_grammar' },
  { name: 'tool_choice without tools', path: '/v1/chat/completions', body: chat({ tool_choice: 'auto' }), status: 400, message: /tool_choice "auto" requires tools/ },
  { name: 'guided_regex bad', path: '/v1/completions', body: cmpl({ guided_regex: '(a' }), status: 400, message: /invalid regex: .*parenthesis/, param: 'guided_regex' },
  { name: 'guided_grammar bad', path: '/v1/chat/completions', body: chat({ guided_grammar: 'root ::= ' }), status: 400, message: /invalid grammar: EBNF parser error/, param: 'guided_grammar' },
  { name: 'echo', path: '/v1/completions', body: cmpl({ echo: true }), status: 400, message: /echo is not supported yet/ },
  { name: 'best_of > n', path: '/v1/completions', body: cmpl({ best_of: 3 }), status: 400, message: /best_of other than n is not supported yet/ },
  { name: 'too many sequences', path: '/v1/completions', body: cmpl({ n: 100, prompt: ['a', 'b', 'c'] }), status: 400, message: /at most 256/ },
  // the server runs with --max-queued 1: a request of two sequences can never be admitted
  { name: 'n above --max-queued', path: '/v1/completions', body: cmpl({ n: 2 }), status: 400, message: /^n x prompts = 2 sequences exceed --max-queued 1; the request can never be admitted$/, param: 'n', code: 'too_many_sequences' },
  { name: 'prompts above --max-queued', path: '/v1/completions', body: cmpl({ prompt: ['a', 'b'] }), status: 400, message: /n x prompts = 2 sequences exceed --max-queued 1/, code: 'too_many_sequences' },
  { name: 'chat n above --max-queued', path: '/v1/chat/completions', body: chat({ n: 3 }), status: 400, message: /n x prompts = 3 sequences exceed --max-queued 1/, code: 'too_many_sequences' },
  { name: 'guided_regex lone surrogate', path: '/v1/completions', body: cmpl({ guided_regex: 'a\ud800b' }), status: 400, message: /^invalid regex: the pattern contains a lone UTF-16 surrogate/, param: 'guided_regex', code: 'invalid_grammar' },
  { name: 'guided_grammar that never ends', path: '/v1/completions', body: cmpl({ guided_grammar: 'root ::= root' }), status: 400, message: /^invalid grammar: the grammar matches no string: rule "root" can never finish/, param: 'guided_grammar' },
  { name: 'guided_grammar without a base case', path: '/v1/chat/completions', body: chat({ guided_grammar: 'root ::= "a" root' }), status: 400, message: /matches no string/ },
  { name: 'guided_json minItems negative', path: '/v1/completions', body: cmpl({ guided_json: { type: 'array', minItems: -1 } }), status: 400, message: /invalid JSON schema: minItems at # must be a non-negative integer, got -1/, param: 'guided_json' },
  { name: 'response_format maxLength fractional', path: '/v1/chat/completions', body: chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { s: { type: 'string', maxLength: 2.5 } } } } } }), status: 400, message: /maxLength at #\/properties\/s must be a non-negative integer, got 2.5/ },
  { name: 'logit_bias key with a leading zero', path: '/v1/completions', body: '{"model": "tiny", "prompt": "hi", "max_tokens": 2, "logit_bias": {"01": 1, "1": 2}}', status: 400, message: /logit_bias key "01" is not an integer token id in canonical form/, param: 'logit_bias' },
  { name: 'logit_bias key with a sign', path: '/v1/completions', body: cmpl({ logit_bias: { '+5': 1 } }), status: 400, message: /logit_bias key "\+5" is not an integer token id in canonical form/ },
];

test('bad-input matrix: each case gets its 4xx and message in the OpenAI shape', async () => {
  for (const c of CASES) {
    const r = await postJson(srv.url + c.path, c.body, AUTH);
    assert.equal(r.status, c.status, `${c.name}: status ${r.status} ${JSON.stringify(r.body)}`);
    assert.ok(r.body && typeof r.body.error === 'object', `${c.name}: body ${JSON.stringify(r.body)}`);
    assert.deepEqual(Object.keys(r.body.error).sort(), ['code', 'message', 'param', 'type'], c.name);
    assert.match(r.body.error.message, c.message, c.name);
    assert.equal(r.body.error.type, c.status === 404 ? 'not_found_error' : 'invalid_request_error', c.name);
    if (c.param !== undefined) assert.equal(r.body.error.param, c.param, `${c.name}: param`);
    if (c.code !== undefined) assert.equal(r.body.error.code, c.code, `${c.name}: code`);
  }
  // the server is unharmed
  const ok = await postJson(`${srv.url}/v1/chat/completions`, chat({}), AUTH);
  assert.equal(ok.status, 200);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
});

test('body too large: 413 without reading it all, then the server still serves', async () => {
  const big = JSON.stringify(cmpl({ prompt: 'z'.repeat(100 * 1024) }));
  const r = await postJson(`${srv.url}/v1/completions`, big, AUTH);
  assert.equal(r.status, 413);
  assert.match(r.body.error.message, /larger than the server's limit of 65536 bytes/);
  // chunked upload (no Content-Length) is cut off at the limit too
  const chunked = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...AUTH },
    body: new ReadableStream({
      start(c) {
        for (let k = 0; k < 4; k++) c.enqueue(new TextEncoder().encode(' '.repeat(40 * 1024)));
        c.close();
      },
    }),
    duplex: 'half',
  } as RequestInit);
  assert.equal(chunked.status, 413);
  await chunked.text();
  const ok = await postJson(`${srv.url}/v1/completions`, cmpl({}), AUTH);
  assert.equal(ok.status, 200);
});

test('unknown route 404, wrong method 405, both in the OpenAI shape', async () => {
  const nf = await postJson(`${srv.url}/v1/embeddings`, {}, AUTH);
  assert.equal(nf.status, 404);
  assert.match(nf.body.error.message, /no route POST \/v1\/embeddings/);
  const nf2 = await fetch(`${srv.url}/nothing-here`);
  assert.equal(nf2.status, 404);
  await nf2.text();
  const wm = await fetch(`${srv.url}/v1/chat/completions`, { headers: AUTH });
  assert.equal(wm.status, 405);
  assert.equal(wm.headers.get('allow'), 'POST');
  assert.match((await wm.json()).error.message, /GET is not allowed/);
  const wm2 = await postJson(`${srv.url}/health`, {});
  assert.equal(wm2.status, 405);
});

test('auth: every /v1 route needs the key (Bearer or x-api-key); /health and /metrics do not', async () => {
  for (const [method, path] of [['GET', '/v1/models'], ['POST', '/v1/chat/completions'], ['POST', '/v1/completions']]) {
    const none = await fetch(srv.url + path, { method, body: method === 'POST' ? JSON.stringify(cmpl({})) : undefined });
    assert.equal(none.status, 401, path);
    const body = await none.json();
    assert.equal(body.error.type, 'authentication_error');
    assert.match(body.error.message, /missing API key/);
    const wrong = await fetch(srv.url + path, { method, headers: { authorization: 'Bearer k2' }, body: method === 'POST' ? '{}' : undefined });
    assert.equal(wrong.status, 401, path);
    assert.match((await wrong.json()).error.message, /invalid API key/);
  }
  assert.equal((await postJson(`${srv.url}/v1/completions`, cmpl({}), { 'x-api-key': 'k1' })).status, 200);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  assert.equal((await fetch(`${srv.url}/metrics`)).status, 200);
  // the official client sends Bearer
  const bad = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e: unknown) => e instanceof OpenAI.AuthenticationError);
  const good = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'k1', maxRetries: 0 });
  assert.equal((await good.models.list()).data[0].id, 'tiny');
});

test('queue full: 429 while one request runs and one waits (max-batch 1, max-queued 1)', async () => {
  // a long context, and streams nobody reads: the two sequences stay in the engine (the unread
  // one is paused by backpressure) while the third request arrives
  const q = await spawnServer({ args: ['--max-batch', '1', '--max-queued', '1'], model: { hidden: 128, intermediate: 512, maxPositions: 4096 } });
  try {
    const ac = new AbortController();
    const long = (k: number) => fetch(`${q.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify(cmpl({ prompt: `p${k}`, max_tokens: 4000, ignore_eos: true, stream: true })),
    });
    const running = await long(1);
    const waiting = await long(2);
    assert.equal(running.status, 200);
    assert.equal(waiting.status, 200);
    const refused = await postJson(`${q.url}/v1/completions`, cmpl({}));
    assert.equal(refused.status, 429);
    assert.equal(refused.body.error.type, 'rate_limit_error');
    assert.match(refused.body.error.message, /queue full/);
    assert.equal(refused.headers.get('retry-after'), '1');
    ac.abort();
    await Promise.allSettled([running.text(), waiting.text()]);
    // once they are gone, requests are admitted again
    const deadline = Date.now() + 10_000;
    for (;;) {
      const r = await postJson(`${q.url}/v1/completions`, cmpl({}));
      if (r.status === 200) break;
      assert.equal(r.status, 429);
      assert.ok(Date.now() < deadline, 'the queue never drained');
      await new Promise((res) => setTimeout(res, 20));
    }
  } finally {
    await q.stop();
  }
  assert.doesNotMatch(q.stderr(), /internal error/);
});
