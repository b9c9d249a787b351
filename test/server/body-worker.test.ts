// Large request bodies are parsed and prepared on a text worker, never on the event loop, and the
// answer is the one the event loop would have given: each ~4 MiB body of many small values
// (messages, logit_bias entries, token ids, stop strings, tools, choices, content blocks) is
// prepared on a worker (the server's count of off-thread bodies says so) and gets the same answer
// as from a server that prepares every body on its event loop; so do the fuzz suite's bodies when
// every one of them is prepared on a worker; a client that leaves while its body is prepared
// cancels the worker's job. Properties are counts and equal answers, not times.

import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { Engine } from '../../src/execution/engine.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { LlmServer, DEFAULT_MAX_BODY_BYTES } from '../../src/server/server.ts';
import { INLINE_BODY_BYTES, ServedModel } from '../../src/server/served-model.ts';
import { HttpError } from '../../src/server/errors.ts';
import { testBackend } from '../state/helpers.ts';
import { heavyBodies } from '../helpers/heavy-bodies.ts';
import { mulberry32 } from '../helpers/mulberry32.ts';
import { comboCases, fieldCases, isAnthropic, malformedBodyCases, MODEL, unicodeCases, type BodyCase } from './fuzz-cases.ts';
import { eventually } from './helpers.ts';

const DEMO = fileURLToPath(new URL('../../models/demo', import.meta.url));
const loaded: LoadedModel = await loadModel(await testBackend(), DEMO);

interface Running {
  url: string;
  server: LlmServer;
}
const running: Running[] = [];
async function serve(inlineBodyBytes: number | undefined): Promise<Running> {
  const engine = new Engine(loaded.model, loaded, { maxBatch: 4 });
  const server = new LlmServer({ engine, loaded, servedModelName: MODEL, processMetrics: false, inlineBodyBytes, log: () => {} });
  const addr = await server.listen(0, '127.0.0.1');
  const r = { url: `http://127.0.0.1:${addr.port}`, server };
  running.push(r);
  return r;
}
after(async () => {
  for (const r of running) {
    await r.server.shutdown(1000);
    await r.server.model.close();
  }
  await loaded.model.backend.close();
});

/** every body prepared on the event loop, as before text workers prepared any */
const inline = await serve(Number.MAX_SAFE_INTEGER);
/** the default: bodies over INLINE_BODY_BYTES on a text worker */
const split = await serve(undefined);
/** every body, however small, on a text worker */
const worker = await serve(0);

/** The answer, without what differs between any two answers (ids, times, the prefix cache's share). */
async function answer(url: string, route: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<{ status: number; body: unknown }> {
  const res = await fetch(url + route, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(isAnthropic(route) ? { 'anthropic-version': '2023-06-01' } : {}), ...headers },
    body: typeof body === 'string' ? body : new Uint8Array(body),
  });
  const text = await res.text();
  let parsed: unknown = text.replace(/"id":"[^"]*"/g, '"id":""').replace(/"created":\d+/g, '"created":0');
  try {
    parsed = JSON.parse(parsed as string);
  } catch {
    // SSE or not JSON: compared as text
  }
  return { status: res.status, body: parsed };
}

test('each ~4 MiB body of small values is prepared on a text worker and answered as on the event loop', async () => {
  const bodies = heavyBodies(DEFAULT_MAX_BODY_BYTES - 200, MODEL, split.server.model.vocabSize);
  assert.ok(bodies.length >= 12);
  for (const b of bodies) {
    const before = { inline: inline.server.model.bodyStats, split: split.server.model.bodyStats };
    const expected = await answer(inline.url, b.route, b.body);
    const got = await answer(split.url, b.route, b.body);
    assert.deepEqual(got, expected, b.name);
    assert.ok(expected.status === 200 || expected.status === 400, `${b.name}: ${JSON.stringify(expected).slice(0, 300)}`);
    assert.deepEqual(split.server.model.bodyStats, { inline: before.split.inline, worker: before.split.worker + 1 }, `${b.name}: prepared on a worker`);
    assert.deepEqual(inline.server.model.bodyStats, { inline: before.inline.inline + 1, worker: 0 }, `${b.name}: prepared inline`);
  }
  assert.equal(split.server.model.textWorkers.died, 0, 'no worker died on a 4 MiB body');
});

test('the threshold: a body of INLINE_BODY_BYTES is prepared on the event loop, one byte more on a text worker', async () => {
  const model = split.server.model;
  const sized = (bytes: number) => {
    const head = `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"user":"`;
    return Buffer.from(head + 'u'.repeat(bytes - head.length - 2) + '"}');
  };
  const before = model.bodyStats;
  const small = await model.prepareBody('chat', sized(INLINE_BODY_BYTES));
  assert.deepEqual(model.bodyStats, { inline: before.inline + 1, worker: before.worker });
  const large = await model.prepareBody('chat', sized(INLINE_BODY_BYTES + 1));
  assert.deepEqual(model.bodyStats, { inline: before.inline + 1, worker: before.worker + 1 });
  assert.ok(small.route === 'chat' && large.route === 'chat');
  assert.ok(Array.isArray(small.ids) && large.ids instanceof Int32Array, 'a worker sends ids as an Int32Array');
  assert.deepEqual({ ...large, ids: [...large.ids] }, small, 'the same request, prepared in either place');
  // invalid JSON and nesting past 256 are the same 400 (invalid_json) from a worker
  for (const body of ['{"messages": [' + ' '.repeat(INLINE_BODY_BYTES), `{"m":${'['.repeat(INLINE_BODY_BYTES)}`]) {
    const errs = await Promise.all([Number.MAX_SAFE_INTEGER, 0].map(async (limit) => {
      const m = limit === 0 ? model : inline.server.model;
      try {
        await m.prepareBody('chat', Buffer.from(body));
      } catch (e) {
        assert.ok(e instanceof HttpError, String(e));
        return { status: e.status, message: e.message, ...e.options };
      }
      assert.fail('expected a 400');
    }));
    assert.equal(errs[0].code, 'invalid_json');
    assert.deepEqual(errs[1], errs[0]);
  }
});

test('the fuzz suite\'s bodies, each prepared on a text worker, get the answers they get on the event loop', async () => {
  const rng = mulberry32(20261201);
  const cases: BodyCase[] = [...malformedBodyCases(), ...fieldCases(rng, 2), ...comboCases(rng, 12), ...unicodeCases(rng, 2, 1)];
  const before = worker.server.model.bodyStats;
  let nonEmpty = 0;
  for (const c of cases) {
    if (c.body.length > 0) nonEmpty++;
    const expected = await answer(inline.url, c.route, c.body, c.headers);
    const got = await answer(worker.url, c.route, c.body, c.headers);
    // sampled outputs (a temperature without a seed) differ run to run: successes compare their status and prompt
    if (expected.status === 200 && got.status === 200 && typeof expected.body === 'object') {
      // the prompt's tokens (Anthropic's input_tokens leave out the prefix cache's, which differ between the servers)
      const usage = (b: unknown) => {
        const u = (b as { usage?: Record<string, number>; input_tokens?: number }).usage;
        return u ? u.prompt_tokens ?? u.input_tokens! + u.cache_read_input_tokens! : (b as { input_tokens?: number }).input_tokens;
      };
      assert.equal(usage(got.body), usage(expected.body), c.name);
    } else assert.deepEqual(got.status === 200 ? got.status : got, expected.status === 200 ? expected.status : expected, c.name);
  }
  const after = worker.server.model.bodyStats;
  assert.equal(after.worker - before.worker, nonEmpty, 'every non-empty body went to a worker');
  assert.equal(worker.server.model.textWorkers.died, 0);
});

test('a client that leaves while its body is prepared on a text worker cancels the job; the next body is prepared', async () => {
  const model = split.server.model;
  const slow = heavyBodies(DEFAULT_MAX_BODY_BYTES - 200, MODEL, model.vocabSize).find((b) => b.name.includes('two-letter messages'))!;
  const before = model.bodyStats;
  const ac = new AbortController();
  const gone = fetch(split.url + slow.route, { method: 'POST', headers: { 'content-type': 'application/json' }, body: slow.body, signal: ac.signal });
  // its template renders 135k messages on the worker: seconds
  await eventually('the body job to run', async () => model.textWorkers.running, (n) => n === 1, 30_000);
  const started = model.textWorkers.started;
  ac.abort();
  await assert.rejects(gone);
  await eventually('the job to be cancelled', async () => model.textWorkers, (s) => s.running === 0 && s.queued === 0);
  assert.deepEqual(model.bodyStats, before, 'the job never answered');
  assert.equal(model.textWorkers.died, 0, 'terminated by the pool, not died');
  const again = await answer(split.url, slow.route, slow.body);
  assert.equal(again.status, 400, JSON.stringify(again.body).slice(0, 300));
  assert.equal(model.bodyStats.worker, before.worker + 1);
  assert.ok(model.textWorkers.started > started, 'a fresh worker took the next body');
});

test('when no text worker can start, a large body is prepared on the event loop with the same answer', async () => {
  // a heap too small for a worker to load the tokenizer in: each one dies before it is ready
  const engine = new Engine(loaded.model, loaded, { maxBatch: 1 });
  const starved = new ServedModel(MODEL, loaded, engine, undefined, { workers: { size: 1, resourceLimits: { maxOldGenerationSizeMb: 1, maxYoungGenerationSizeMb: 1 } } });
  try {
    const body = () => Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], user: 'u'.repeat(INLINE_BODY_BYTES) }));
    const got = await starved.prepareBody('chat', body());
    const expected = await inline.server.model.prepareBody('chat', body());
    assert.deepEqual(got, expected);
    assert.deepEqual(starved.bodyStats, { inline: 1, worker: 0 });
    assert.ok(starved.textWorkers.died >= 1);
  } finally {
    await starved.close();
  }
});
