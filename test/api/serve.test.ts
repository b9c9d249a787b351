// startServer: the server of `llmts serve`, started from code in this process on a tiny random
// model (CPU backend). A chat completion through it, its startup notes, close(); option errors
// as ServeOptionsError, spelled as the caller names the options; a start that fails after the
// backend opened leaves nothing open. Also runs the README's example of it.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { startServer, ServeOptionsError, type ServeOptions } from '../../src/api/index.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { runReadmeBlock } from './readme-block.ts';

const dir = writeTinyLlama();
after(() => rmSync(dir, { recursive: true, force: true }));

const base: ServeOptions = { model: dir, device: 'cpu', port: 0, servedModelName: 'tiny' };

test('startServer on port 0: a chat completion, the startup notes, close()', async () => {
  const notes: string[] = [];
  const srv = await startServer({ ...base, maxBatch: 2, kvBudgetBytes: 64 * 1024, log: (l) => notes.push(l) });
  assert.match(srv.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(srv.url, `http://127.0.0.1:${srv.port}`);
  assert.ok(srv.port > 0);
  // 256 bytes of KV per token: 64 KiB holds 256 tokens
  assert.equal(srv.kvPlan.kvTokens, 256);
  assert.equal(srv.engine.maxBatch, 2);
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, temperature: 0, ignore_eos: true }),
  });
  assert.equal(res.status, 200);
  const body = await res.json();
  assert.equal(body.choices[0].finish_reason, 'length');
  assert.equal(body.usage.completion_tokens, 5);
  assert.equal(typeof body.choices[0].message.content, 'string');
  assert.match(notes[0]!, /^model "tiny" from .* on the cpu backend; context \d+ tokens; KV cache \(f32\) for 256 tokens/);
  assert.ok(notes.some((l) => /^memory plan: .*\(llmts fit --model /.test(l)), notes.join('\n'));
  assert.ok(notes.some((l) => l === 'tool calls: hermes format (detected from the chat template and vocabulary)'), notes.join('\n'));
  const closing = srv.close(1000);
  assert.equal(srv.close(), closing, 'close() twice is one close');
  await closing;
  await assert.rejects(fetch(`${srv.url}/health`), 'the listener is closed');
});

test('option errors: ServeOptionsError naming the field, or as optionNames spells it', async () => {
  const cases: [Partial<ServeOptions>, string, RegExp][] = [
    [{ maxBatch: 0 }, 'maxBatch', /^maxBatch must be >= 1, got 0$/],
    [{ port: 70000 }, 'port', /^port must be <= 65535, got 70000$/],
    [{ servedModelName: ' ' }, 'servedModelName', /^servedModelName must not be empty$/],
    [{ kvBudgetBytes: 1 << 20, gpuMemoryUtilization: 0.5 }, 'kvBudgetBytes', /^give kvBudgetBytes or gpuMemoryUtilization, not both$/],
    [{ cacheDirBytes: 1 << 30 }, 'cacheDirBytes', /^cacheDirBytes needs cacheDir$/],
    // these two are found once the backend is open
    [{ gpuMemoryUtilization: 0.5 }, 'gpuMemoryUtilization', /^gpuMemoryUtilization is not supported yet \(on the cpu backend .* with kvBudgetBytes\)$/],
    [{ kvBudgetBytes: 100 }, 'kvBudgetBytes', /^kvBudgetBytes 100 holds no token of KV cache \(one token needs 256 bytes\)$/],
  ];
  for (const [given, option, message] of cases) {
    await assert.rejects(startServer({ ...base, ...given }), (e: unknown) =>
      e instanceof ServeOptionsError && e.option === option && message.test(e.message), JSON.stringify(given));
  }
  await assert.rejects(startServer({ ...base, maxBatch: 0, optionNames: { maxBatch: '--max-batch' } }),
    (e: unknown) => e instanceof ServeOptionsError && e.message === '--max-batch must be >= 1, got 0');
});

test('a start that fails at listen closes what it opened; the port stays with its owner; engine settings reach the engine', async () => {
  const first = await startServer({ ...base, kvBudgetBytes: 64 * 1024, engineSettings: { pipeline: false } });
  try {
    assert.equal(first.engine.pipeline, false);
    await assert.rejects(startServer({ ...base, kvBudgetBytes: 64 * 1024, port: first.port }),
      (e: Error) => e.message.startsWith(`cannot listen on 127.0.0.1:${first.port}: `));
    const r = await fetch(`${first.url}/health`);
    assert.equal(r.status, 200);
  } finally {
    await first.close(0);
  }
});

test("the README's startServer example runs and prints what it promises", () => {
  const lines = runReadmeBlock('startServer');
  assert.match(lines[0]!, /^200 (length|stop)$/);
  assert.equal(lines[1], 'maxBatch maxBatch must be >= 1, got 0');
});
