// `llmts generate` end to end through bin/llmts: the JSON shape of README.md's `llmts generate`,
// transformers parity through the CLI, streaming, and the one-line errors for bad models and bad
// input.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, writeFileSync, truncateSync, statSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { compareToReference } from '../helpers/closeness.ts';
import { runBin } from '../helpers/run-bin.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const QWEN3 = join(ROOT, 'test/fixtures/qwen3');

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

const run = (args: string[]) => runBin(args);

/** A user error: non-zero exit, exactly one line on stderr, no stack trace, matching `pattern`. */
function assertOneLineError(r: Run, pattern: RegExp): void {
  assert.notEqual(r.code, 0, `expected failure, got stdout ${r.stdout}`);
  const lines = r.stderr.trimEnd().split('\n');
  assert.equal(lines.length, 1, `stderr should be one line:\n${r.stderr}`);
  assert.match(lines[0], /^llmts: /);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(r.stderr, /\n\s+at /);
}

function copyFixture(name = 'qwen3'): string {
  const dir = mkdtempSync(join(tmpdir(), 'llmts-cli-'));
  cpSync(join(ROOT, 'test/fixtures', name), dir, { recursive: true });
  return dir;
}

test('generate --json matches transformers through the CLI', async () => {
  const ref = JSON.parse(readFileSync(join(QWEN3, 'reference.json'), 'utf8'));
  const c = ref.cases[1];
  const r = await run(['generate', '--model', QWEN3, '--prompt', c.prompt_text, '--max-tokens', '32',
    '--temperature', '0', '--ignore-eos', '--top-logprobs', '5', '--json', '--device', 'cpu']);
  assert.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.deepEqual(Object.keys(out), ['prompt_token_ids', 'token_ids', 'text', 'finish_reason', 'logprobs', 'timings']);
  assert.deepEqual(out.prompt_token_ids, c.prompt_token_ids);
  assert.equal(out.finish_reason, 'length');
  assert.equal(out.logprobs.length, 32);
  assert.equal(out.logprobs[0].top.length, 5);
  const close = compareToReference(out.logprobs, c.steps, 0.05);
  assert.ok(close.ok, close.problem);
  for (const k of ['load_ms', 'prefill_ms', 'decode_ms', 'prompt_tokens', 'generated_tokens'])
    assert.equal(typeof out.timings[k], 'number', k);
  assert.equal(out.timings.generated_tokens, 32);
});

test('generate --kv-dtype bf16 (the CPU backend\'s bf16 KV cache) still matches transformers', async () => {
  const ref = JSON.parse(readFileSync(join(QWEN3, 'reference.json'), 'utf8'));
  const c = ref.cases[1];
  const r = await run(['generate', '--model', QWEN3, '--prompt', c.prompt_text, '--max-tokens', '32',
    '--temperature', '0', '--ignore-eos', '--top-logprobs', '5', '--json', '--device', 'cpu', '--kv-dtype', 'bf16']);
  assert.equal(r.code, 0, r.stderr);
  const close = compareToReference(JSON.parse(r.stdout).logprobs, c.steps, 0.05);
  assert.ok(close.ok, close.problem);
});

test('--messages renders the chat template exactly as transformers', async () => {
  const ref = JSON.parse(readFileSync(join(QWEN3, 'reference.json'), 'utf8'));
  for (const chat of ref.chat) {
    const r = await run(['generate', '--model', QWEN3, '--messages', JSON.stringify(chat.messages), '--max-tokens', '2', '--json']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout).prompt_token_ids, chat.ids);
  }
});

test('streamed text equals the --json text; stop strings end it; seeds reproduce', async () => {
  const args = ['generate', '--model', QWEN3, '--prompt', 'def main():', '--max-tokens', '24', '--ignore-eos', '--temperature', '0'];
  const json = JSON.parse((await run([...args, '--json'])).stdout);
  const streamed = await run(args);
  assert.equal(streamed.stdout, `${json.text}\n`);
  // a stop string taken from the middle of the greedy text cuts it there
  const cut = json.text.slice(3, 6);
  if (cut.length === 3) {
    const stopped = JSON.parse((await run([...args, '--json', '--stop', cut])).stdout);
    assert.equal(stopped.finish_reason, 'stop');
    assert.equal(stopped.text, json.text.slice(0, json.text.indexOf(cut)));
  }
  const sampled = ['generate', '--model', QWEN3, '--prompt', 'x', '--max-tokens', '16', '--temperature', '1', '--json', '--ignore-eos'];
  const a = JSON.parse((await run([...sampled, '--seed', '7'])).stdout);
  const b = JSON.parse((await run([...sampled, '--seed', '7'])).stdout);
  assert.deepEqual(a.token_ids, b.token_ids);
});

test('bad models and bad input get one clear line and a non-zero exit', async (t) => {
  const p = ['--prompt', 'hello', '--max-tokens', '2'];
  await t.test('missing directory', async () =>
    assertOneLineError(await run(['generate', '--model', '/nonexistent/model', ...p]), /does not exist/));
  await t.test('unsupported model_type lists the supported ones', async () => {
    const dir = copyFixture();
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, model_type: 'gpt_bigcode' }));
    assertOneLineError(await run(['generate', '--model', dir, ...p]), /gpt_bigcode.*llama.*qwen3/);
    rmSync(dir, { recursive: true });
  });
  await t.test('corrupt config.json', async () => {
    const dir = copyFixture();
    writeFileSync(join(dir, 'config.json'), '{"model_type": "qwen3",');
    assertOneLineError(await run(['generate', '--model', dir, ...p]), /config\.json/);
    rmSync(dir, { recursive: true });
  });
  await t.test('bad safetensors header', async () => {
    const dir = copyFixture();
    const f = join(dir, 'model.safetensors');
    const buf = readFileSync(f);
    buf.writeBigUInt64LE(BigInt(buf.length * 4), 0);
    writeFileSync(f, buf);
    assertOneLineError(await run(['generate', '--model', dir, ...p]), /model\.safetensors/);
    rmSync(dir, { recursive: true });
  });
  await t.test('truncated tensor data names the file', async () => {
    const dir = copyFixture();
    const f = join(dir, 'model.safetensors');
    truncateSync(f, statSync(f).size - 1000);
    assertOneLineError(await run(['generate', '--model', dir, ...p]), /model\.safetensors.*(truncated|beyond|past)/i);
    rmSync(dir, { recursive: true });
  });
  await t.test('missing tensor and shape mismatch name the tensor', async () => {
    const dir = copyFixture();
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, num_hidden_layers: cfg.num_hidden_layers + 1, layer_types: undefined }));
    assertOneLineError(await run(['generate', '--model', dir, ...p]), new RegExp(`layers\\.${cfg.num_hidden_layers}\\.`));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, intermediate_size: cfg.intermediate_size + 8 }));
    assertOneLineError(await run(['generate', '--model', dir, ...p]), /mlp\.\w+_proj\.weight.*shape/);
    rmSync(dir, { recursive: true });
  });
  await t.test('prompt longer than the context', async () =>
    assertOneLineError(await run(['generate', '--model', QWEN3, '--prompt', 'hello world '.repeat(200), '--max-model-len', '64']), /prompt has \d+ (tokens|characters).*context holds 64/));
  await t.test('bad flags', async () => {
    assertOneLineError(await run(['generate', '--model', QWEN3, '--temperature', 'hot', ...p]), /--temperature must be a number/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--top-logprobs', '21', ...p]), /--top-logprobs must be <= 20/);
    assertOneLineError(await run(['generate', '--model', QWEN3]), /--prompt or --messages/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--messages', '[{"role":"user"}]']), /content/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--bogus', ...p]), /bogus/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--top-p', '0', ...p]), /top_p|top-p/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--kv-dtype', 'q8', ...p]), /--kv-dtype must be one of f32, bf16, f16, int8, fp8, got "q8"/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--kv-dtype', 'f16', '--device', 'cpu', ...p]),
      /the cpu backend keeps its KV cache in f32, bf16, int8 or fp8, not f16/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--quantization', 'q2', ...p]), /--quantization must be one of q8_0, q4_0, fp8, got "q2"/);
    assertOneLineError(await run(['generate', '--model', QWEN3, '--quantization', 'fp8', '--device', 'cpu', ...p]),
      /--quantization fp8 is for the CUDA backend \(the cpu backend has no kernels for fp8 weights/);
    assertOneLineError(await run(['fit', '--model', QWEN3, '--ctx', '64', '--quantization', 'fp8', '--device', 'cpu', '--memory', '8G', '--bandwidth', '10']),
      /--quantization fp8 is for the CUDA backend: plan it with --gpu/);
    const fit = await run(['fit', '--model', QWEN3, '--ctx', '64', '--quantization', 'fp8', '--gpu', 'h200', '--json']);
    assert.equal(fit.code, 0, fit.stderr);
    assert.ok(JSON.parse(fit.stdout).weights.residentBytesByDtype.fp8 > 0, 'the layers\' matrices planned in FP8');
  });
  await t.test('--device cuda without CUDA', async () =>
    assertOneLineError(await run(['generate', '--model', QWEN3, '--device', 'cuda', ...p]), /cuda/i));
});
