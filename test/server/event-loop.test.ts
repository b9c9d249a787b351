// A request's text work never holds the server's event loop: a long run of one character (which
// the demo tokenizer takes on the order of a second over) is tokenized on a text worker while
// /health and other requests keep being answered; a client that leaves mid-tokenization, and a
// worker that dies, cost only their own request. Properties are orderings and counts, not times.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { postJson, spawnServer, type Spawned } from './helpers.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { ServedModel } from '../../src/server/served-model.ts';
import { clientErrorOf } from '../../src/server/errors.ts';
import { TextWorkerError } from '../../src/artifacts/text-worker-pool.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

/** Under the demo's bound (2048 tokens x 80 characters), so it is tokenized, slowly. */
const SPACES = ' '.repeat(150_000);

/** Sends /health one after another until `done` settles; how many answers (all 200) arrived before it did. */
async function healthWhile(url: string, done: Promise<unknown>): Promise<number> {
  let settled = false;
  void done.then(() => (settled = true), () => (settled = true));
  let answered = 0;
  while (!settled) {
    const r = await fetch(`${url}/health`);
    assert.equal(r.status, 200);
    await r.text();
    if (!settled) answered++;
  }
  return answered;
}

let demo: Spawned | undefined;
async function demoServer(): Promise<Spawned> {
  demo ??= await spawnServer({ dir: 'models/demo' });
  return demo;
}
test.after(async () => {
  await demo?.stop();
});

test('while a long run of spaces is tokenized, /health answers and a short completion finishes first', async () => {
  const srv = await demoServer();
  const order: string[] = [];
  const slow = postJson(`${srv.url}/v1/messages/count_tokens`, { model: 'tiny', messages: [{ role: 'user', content: SPACES }] })
    .then((r) => (order.push('slow'), r));
  const normal = postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 })
    .then((r) => (order.push('normal'), r));
  const answered = await healthWhile(srv.url, slow);
  const [s, n] = await Promise.all([slow, normal]);
  assert.equal(s.status, 200, JSON.stringify(s.body));
  assert.ok(s.body.input_tokens > 0 && s.body.input_tokens < SPACES.length, JSON.stringify(s.body));
  assert.equal(n.status, 200, JSON.stringify(n.body));
  assert.equal(n.body.choices[0].finish_reason, 'length');
  assert.equal(n.body.usage.completion_tokens, 8);
  assert.deepEqual(order, ['normal', 'slow']);
  // inline tokenization answers none (the loop is held from the body's arrival to the answer)
  assert.ok(answered >= 5, `only ${answered} /health answers arrived before the tokenization finished`);
});

test('completions and chat tokenize a long run of "a"s off the event loop too; the answers are the usual 400s', async () => {
  const srv = await demoServer();
  for (const [path, body] of [
    ['/v1/completions', { model: 'tiny', prompt: 'a'.repeat(150_000), max_tokens: 1 }],
    ['/v1/chat/completions', { model: 'tiny', messages: [{ role: 'user', content: 'a'.repeat(150_000) }], max_tokens: 1 }],
  ] as const) {
    const slow = postJson(`${srv.url}${path}`, body);
    const answered = await healthWhile(srv.url, slow);
    const r = await slow;
    assert.equal(r.status, 400, path);
    assert.equal(r.body.error.code, 'context_length_exceeded', path);
    assert.match(r.body.error.message, /the prompt has \d+ tokens, but this model's context holds 2048/, path);
    assert.ok(answered >= 5, `${path}: only ${answered} /health answers arrived before the tokenization finished`);
  }
});

test('a client that leaves mid-tokenization wedges nothing: the next large requests are answered', async () => {
  const srv = await demoServer();
  for (let round = 0; round < 3; round++) {
    const ac = new AbortController();
    const gone = fetch(`${srv.url}/v1/messages/count_tokens`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: SPACES }] }),
    });
    const health = await fetch(`${srv.url}/health`); // the request is in by now
    await health.text();
    ac.abort();
    await assert.rejects(gone);
  }
  const text = 'The committee met on Tuesday to review the budget. '.repeat(400);
  const expected = await postJson(`${srv.url}/v1/messages/count_tokens`, { model: 'tiny', messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(expected.status, 200);
  const [a, b] = await Promise.all([0, 1].map(() => postJson(`${srv.url}/v1/messages/count_tokens`, { model: 'tiny', messages: [{ role: 'user', content: text }] })));
  assert.equal(a.status, 200);
  assert.equal(b.status, 200);
  assert.equal(a.body.input_tokens, b.body.input_tokens);
  assert.ok(a.body.input_tokens > expected.body.input_tokens);
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

test('a text worker that dies fails its request alone (an internal error: 500); a fresh worker serves the next', async () => {
  // a template that, for one message text, renders 20,000 upper-cased copies of it: past the worker's heap limit
  const dir = writeTinyLlama({ maxPositions: 4096 });
  const file = `${dir}/tokenizer_config.json`;
  const cfg = JSON.parse(readFileSync(file, 'utf8'));
  cfg.chat_template = "{% if messages[0]['content'].startswith('boom') %}{% for i in range(20000) %}{{ messages[0]['content'] | upper }}{% endfor %}{% endif %}" + cfg.chat_template;
  writeFileSync(file, JSON.stringify(cfg));
  const loaded = await loadModel(new ReferenceBackend(), dir);
  const model = new ServedModel('tiny', loaded, new Engine(loaded.model, loaded, { maxBatch: 1 }), undefined, {
    workers: { size: 1, resourceLimits: { maxOldGenerationSizeMb: 32, maxYoungGenerationSizeMb: 4 } },
  });
  try {
    const long = 'x'.repeat(3000); // over the inline limit: rendered on a worker
    let caught: unknown;
    try {
      await model.renderChat([{ role: 'user', content: `boom ${long}` }]);
    } catch (err) {
      caught = err;
    }
    assert.ok(caught instanceof TextWorkerError, `expected a TextWorkerError, got ${caught}`);
    assert.match((caught as Error).message, /died while working on this request/);
    assert.equal(clientErrorOf(caught), undefined, 'not a client error: the server answers 500');
    const ok = await model.renderChat([{ role: 'user', content: long }]);
    assert.equal(ok.text, `<|im_start|>user\n${long}<|im_end|>\n<|im_start|>assistant\n`);
    assert.deepEqual(ok.ids, loaded.tokenizer.encode(ok.text, { addSpecialTokens: false }));
    assert.deepEqual({ died: model.textWorkers.died, started: model.textWorkers.started }, { died: 1, started: 2 });
  } finally {
    await model.close();
  }
});
