// FP8 checkpoints end to end: `llmts generate` through bin/llmts against transformers, the server
// (startServer, as `llmts serve` runs it), and the one-line refusal of other quantized checkpoints.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, test } from 'node:test';

import { startServer } from '../../src/api/index.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { compareToReference } from '../helpers/closeness.ts';
import { runBin } from '../helpers/run-bin.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const MODEL = join(ROOT, 'test/fixtures/fp8/llama_fp8_block');
const ref = JSON.parse(readFileSync(join(MODEL, 'reference.json'), 'utf8'));
const tmp = mkdtempSync(join(tmpdir(), 'llmts-fp8-cli-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

const run = (args: string[]) => runBin(args);

test('llmts generate on an FP8 checkpoint matches transformers (bf16 dequantization: tolerance 0.1)', async () => {
  const c = ref.cases[1];
  const r = await run(['generate', '--model', MODEL, '--prompt', loadModelDir(MODEL).tokenizer.decode(c.prompt_token_ids),
    '--max-tokens', String(c.steps.length), '--temperature', '0', '--ignore-eos', '--top-logprobs', '5', '--json', '--device', 'cpu']);
  assert.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.deepEqual(out.prompt_token_ids, c.prompt_token_ids);
  const close = compareToReference(out.logprobs, c.steps, 0.1);
  assert.ok(close.ok, close.problem);
});

test('the server (startServer, as llmts serve runs it) serves an FP8 checkpoint', async () => {
  const srv = await startServer({ model: MODEL, device: 'cpu', port: 0, servedModelName: 'f', kvBudgetBytes: 1 << 20, warmup: false });
  try {
    const c = ref.cases[0];
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'f', prompt: c.prompt_token_ids, max_tokens: 8, temperature: 0, ignore_eos: true }),
    });
    assert.equal(res.status, 200);
    assert.equal((await res.json()).usage.completion_tokens, 8);
  } finally {
    await srv.close(1000);
  }
});

test('an AWQ checkpoint is refused with one line naming its quant_method', async () => {
  const d = join(tmp, 'awq');
  cpSync(MODEL, d, { recursive: true });
  const cfg = JSON.parse(readFileSync(join(d, 'config.json'), 'utf8'));
  cfg.quantization_config = { quant_method: 'awq', bits: 4, group_size: 128, version: 'gemm', zero_point: true };
  writeFileSync(join(d, 'config.json'), JSON.stringify(cfg));
  const r = await run(['generate', '--model', d, '--prompt', 'hi', '--max-tokens', '1', '--device', 'cpu']);
  assert.equal(r.code, 1);
  const lines = r.stderr.trim().split('\n');
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0]!, /quantization_config: quant_method "awq" is not loadable; supported: quant_method "fp8"/);
});
