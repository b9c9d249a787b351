// `llmts serve`'s flags as the ServeOptions startServer takes (in process, nothing is loaded):
// sizes in bytes, the grace period in milliseconds, the warm-up pair as one switch,
// $LLMTS_API_KEY as the key's default, and every option named by its flag in messages.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serveOptionsOf } from '../../src/cli/serve.ts';
import { UsageError } from '../../src/cli/errors.ts';
import { resolveServeOptions, ServeOptionsError } from '../../src/api/serve-options.ts';

test('serve flags become ServeOptions in their units', () => {
  const o = serveOptionsOf([
    '--model', 'm', '--host', '::1', '--port', '0', '--served-model-name', 'x', '--api-key', 'k', '--max-batch', '4',
    '--max-queued', '0', '--max-model-len', '64', '--kv-budget', '16K', '--kv-dtype', 'bf16', '--device', 'cpu',
    '--max-body', '1M', '--shutdown-grace', '2.5', '--prompt-cache', 'off', '--cache-dir-size', '1G',
    '--tool-call-format', 'llama3', '--no-warmup', '--header-timeout', '30', '--body-timeout', '0.5',
    '--grammar-cache', '8M', '--batch-invariant',
  ]);
  const { log, optionNames, ...rest } = o;
  assert.equal(typeof log, 'function');
  assert.equal(optionNames?.kvBudgetBytes, '--kv-budget');
  assert.deepEqual(rest, {
    model: 'm', host: '::1', port: 0, servedModelName: 'x', apiKey: 'k', maxBatch: 4, maxQueued: 0, maxModelLen: 64,
    kvBudgetBytes: 16384, kvDtype: 'bf16', quantization: undefined, gpuMemoryUtilization: undefined, maxBodyBytes: 2 ** 20, shutdownGraceMs: 2500,
    headersTimeoutMs: 30_000, bodyTimeoutMs: 500, grammarCacheBytes: 8 * 2 ** 20, batchInvariant: true,
    device: 'cpu', promptCacheBytes: 0, cacheDir: undefined, cacheDirBytes: 2 ** 30, toolCallFormat: 'llama3_json', warmup: false,
  });
  assert.equal(serveOptionsOf(['--model', 'm', '--warmup']).warmup, true);
  assert.equal(serveOptionsOf(['--model', 'm']).warmup, undefined);
  assert.equal(serveOptionsOf(['--model', 'm']).shutdownGraceMs, 30_000);
  assert.throws(() => serveOptionsOf(['--model', 'm', '--warmup', '--no-warmup']), UsageError);
  // a deadline of 0 would mean none to Node: refused, like a negative one
  for (const v of ['0', '-1', 'soon']) assert.throws(() => serveOptionsOf(['--model', 'm', '--header-timeout', v]), UsageError, v);
});

test('$LLMTS_API_KEY is the key when --api-key is not given; empty means none', () => {
  const saved = process.env.LLMTS_API_KEY;
  try {
    process.env.LLMTS_API_KEY = 'from-env';
    assert.equal(serveOptionsOf(['--model', 'm']).apiKey, 'from-env');
    assert.equal(serveOptionsOf(['--model', 'm', '--api-key', 'flag']).apiKey, 'flag');
    process.env.LLMTS_API_KEY = '';
    assert.equal(serveOptionsOf(['--model', 'm']).apiKey, undefined);
  } finally {
    if (saved === undefined) delete process.env.LLMTS_API_KEY;
    else process.env.LLMTS_API_KEY = saved;
  }
});

test("startServer's option checks name the flags the CLI was given", () => {
  for (const [argv, message] of [
    [['--max-batch', '0'], '--max-batch must be >= 1, got 0'],
    [['--port', '70000'], '--port must be <= 65535, got 70000'],
    [['--kv-budget', '1M', '--gpu-memory-utilization', '0.5'], 'give --kv-budget or --gpu-memory-utilization, not both'],
    [['--cache-dir-size', '1G'], '--cache-dir-size needs --cache-dir'],
    [['--max-body', '0'], '--max-body must be at least 1 byte'],
    [['--body-timeout', '0.0001'], '--body-timeout must be between 1 ms and 24 days, got 0.1 ms'],
  ] as const) {
    assert.throws(() => resolveServeOptions(serveOptionsOf(['--model', 'm', ...argv])),
      (e: unknown) => e instanceof ServeOptionsError && e.message === message, argv.join(' '));
  }
});
