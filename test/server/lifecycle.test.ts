// The `serve` process: flags, the listening line, capacity flags, health/metrics, reasoning
// models, and graceful shutdown on SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { spawnServer, runServeCli, postJson, parseSse, scrape } from './helpers.ts';
import { runServe } from '../../src/cli/serve.ts';
import { UsageError } from '../../src/cli/errors.ts';

test('flags not supported yet are refused with one clear line; bad values too', async () => {
  // in-process: runServe throws before it loads anything
  for (const [flag, value, why] of [
    ['--prompt-cache', 'lots', /--prompt-cache must be a size/],
    ['--cache-dir-size', '1G', /--cache-dir-size needs --cache-dir/],
    ['--gpu-memory-utilization', '0.9', /^--gpu-memory-utilization is not supported yet \(/],
    ['--port', 'abc', /--port must be a number/],
    ['--port', '70000', /--port must be <= 65535/],
    ['--kv-budget', 'lots', /--kv-budget must be a size/],
    ['--max-body', 'huge', /--max-body must be a size/],
    ['--max-batch', '0', /--max-batch must be >= 1/],
    ['--shutdown-grace', 'soon', /--shutdown-grace must be a number/],
    ['--device', 'tpu', /--device must be one of/],
    ['--bogus', 'x', /Unknown option '--bogus'/],
    ['--warmup', '--no-warmup', /--warmup and --no-warmup contradict each other/],
  ] as const) await assert.rejects(runServe(['--model', '/nonexistent', flag, value]), (e: Error) => (e instanceof UsageError || flag === '--device') && why.test(e.message), flag);
  // through the process: one line on stderr, nothing on stdout, exit 2
  const dir = writeTinyLlama();
  const results = await Promise.all([
    runServeCli(['--model', dir, '--prompt-cache', 'lots']),
    runServeCli(['--model', dir, '--kv-budget', '100']),
    runServeCli([]),
  ]);
  const whys = [/--prompt-cache must be a size/, /holds no token of KV cache \(one token needs 256 bytes\)/, /--model is required/];
  results.forEach((r, k) => {
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, whys[k]);
    assert.equal(r.stderr.trim().split('\n').length, 1, `one line, got ${r.stderr}`);
  });
});

test('one listening line on stdout; health, models and metrics; --kv-budget bounds a sequence', async () => {
  // 256 bytes of KV per token (2 layers x 2 kv heads x 8 dims x K,V x f32): 16K holds 64 tokens
  const srv = await spawnServer({ args: ['--kv-budget', '16K'] });
  try {
    assert.match(srv.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(srv.stdout(), `listening on ${srv.url}\n`);
    const health = await fetch(`${srv.url}/health`);
    assert.equal(health.status, 200);
    assert.deepEqual(await health.json(), { status: 'ok' });
    const models = await (await fetch(`${srv.url}/v1/models`)).json();
    assert.equal(models.data[0].id, 'tiny');
    assert.equal(models.data[0].max_model_len, 64);
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: 'abcdefghij', temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200);
    assert.equal(r.body.usage.prompt_tokens + r.body.usage.completion_tokens, 64);
    const capped = await postJson(`${srv.url}/v1/completions`, { prompt: 'abcdefghij', temperature: 0, ignore_eos: true, max_tokens: 1000 });
    assert.equal(capped.body.usage.completion_tokens, 54);
    const long = await postJson(`${srv.url}/v1/completions`, { prompt: 'x'.repeat(100) });
    assert.equal(long.status, 400);
    assert.match(long.body.error.message, /context holds 64 tokens/);
    const metrics = await fetch(`${srv.url}/metrics`);
    assert.match(metrics.headers.get('content-type')!, /^text\/plain/);
    const text = await metrics.text();
    for (const name of [
      'llmts_http_requests_total{route="/v1/completions",method="POST",status="200"} 2',
      'llmts_http_requests_total{route="/v1/completions",method="POST",status="400"} 1',
      'llmts_queue_depth 0', 'llmts_running_rows 0', 'llmts_kv_blocks_used 0', 'llmts_kv_blocks_total 4',
      'llmts_prompt_tokens_total 20', 'llmts_generation_tokens_total 108',
      'llmts_time_to_first_token_seconds_bucket', 'llmts_inter_token_latency_seconds_bucket',
    ]) assert.ok(text.includes(name), `metrics lack ${name}`);
  } finally {
    await srv.stop();
  }
});

test('a <think> template: reasoning goes to reasoning_content, streaming too', async () => {
  const dir = writeTinyLlama();
  const cfgFile = join(dir, 'tokenizer_config.json');
  const cfg = JSON.parse(readFileSync(cfgFile, 'utf8'));
  // a template that opens the reasoning block in the generation prompt (as Qwen3 / R1 can)
  cfg.chat_template = cfg.chat_template.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'");
  assert.ok(cfg.chat_template.includes('<think>'));
  writeFileSync(cfgFile, JSON.stringify(cfg));
  const srv = await spawnServer({ dir });
  try {
    const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const params = { model: 'tiny', messages: [{ role: 'user' as const, content: 'think' }], max_tokens: 12, temperature: 0, ignore_eos: true };
    const r = await client.chat.completions.create(params);
    const msg = r.choices[0].message as unknown as { content: string; reasoning_content: string };
    // the random model never closes </think>: everything is reasoning
    assert.equal(msg.content, '');
    assert.ok(msg.reasoning_content.length > 0);
    const raw = await postJson(`${srv.url}/v1/completions`, { model: 'tiny', max_tokens: 12, temperature: 0, ignore_eos: true, prompt: '<|im_start|>user\nthink<|im_end|>\n<|im_start|>assistant\n<think>\n' });
    assert.equal(msg.reasoning_content, raw.body.choices[0].text);
    const stream = await client.chat.completions.create({ ...params, stream: true });
    let reasoning = '', content = '';
    for await (const c of stream) {
      const d = c.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
      reasoning += d?.reasoning_content ?? '';
      content += d?.content ?? '';
    }
    assert.equal(reasoning, msg.reasoning_content);
    assert.equal(content, '');
  } finally {
    await srv.stop();
  }
});

test('SIGTERM: the running request finishes, new ones are refused, exit code 0', async () => {
  const srv = await spawnServer({ model: { hidden: 64, intermediate: 128, maxPositions: 1024 } });
  const res = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'long one', max_tokens: 600, temperature: 0, ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  let text = new TextDecoder().decode((await reader.read()).value);
  srv.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 100));
  // no new work: the listener is closed (connection refused) or answers 503
  const late = await fetch(`${srv.url}/v1/completions`, { method: 'POST', body: '{"prompt":"x"}' }).then((r) => r.status, () => 'refused');
  assert.ok(late === 'refused' || late === 503, `late request got ${late}`);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  const frames = parseSse(text);
  assert.equal(frames[frames.length - 1].data, '[DONE]');
  const last = JSON.parse(frames[frames.length - 2].data);
  assert.equal(last.choices[0].finish_reason, 'length');
  const generated = frames.slice(0, -1).map((f) => JSON.parse(f.data).choices[0]).filter((c) => c.text !== undefined);
  assert.ok(generated.length >= 300, `only ${generated.length} chunks: the stream was cut short`);
  assert.equal(await srv.exited, 0);
  await srv.stop(); // removes its model directory
  assert.match(srv.stderr(), /SIGTERM: finishing 1 running request/);
});

test('SIGTERM with a short grace: what is still running ends with finish_reason abort, exit 0', async () => {
  const srv = await spawnServer({ args: ['--shutdown-grace', '0.2'], model: { hidden: 128, intermediate: 512, maxPositions: 4096 } });
  const res = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'very long', max_tokens: 4000, temperature: 0, ignore_eos: true, stream: true }),
  });
  const reader = res.body!.getReader();
  let text = new TextDecoder().decode((await reader.read()).value);
  const t0 = Date.now();
  srv.proc.kill('SIGTERM');
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  assert.equal(await srv.exited, 0);
  await srv.stop(); // removes its model directory
  assert.ok(Date.now() - t0 < 5000);
  const frames = parseSse(text);
  assert.equal(frames[frames.length - 1].data, '[DONE]');
  assert.equal(JSON.parse(frames[frames.length - 2].data).choices[0].finish_reason, 'abort');
});

test('--warmup runs every decode batch size before listening, and the server then answers as usual', async () => {
  const srv = await spawnServer({ args: ['--warmup', '--max-batch', '3'] });
  try {
    assert.match(srv.stderr(), /warm-up: decode batch sizes 1, 2, 3 in [0-9.]+ s/);
    // it ran before the listening line
    assert.ok(srv.stderr().includes('warm-up') && srv.stdout().includes('listening on'));
    const r = await postJson(`${srv.url}/v1/completions`, { prompt: 'hello', max_tokens: 4, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200);
    assert.equal(r.body.usage.completion_tokens, 4);
    const m = await scrape(srv.url);
    assert.equal(m.get('llmts_kv_blocks_cached'), 0, 'warm-up left nothing in the prefix cache');
  } finally {
    await srv.stop();
  }
});

test('without --warmup the CPU backend does not warm up (it is the default on CUDA only)', async () => {
  const srv = await spawnServer({ args: ['--device', 'cpu', '--max-batch', '3'] });
  try {
    assert.doesNotMatch(srv.stderr(), /warm-up/);
  } finally {
    await srv.stop();
  }
});
