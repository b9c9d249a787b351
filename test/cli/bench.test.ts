// `llmts bench` through bin/llmts (README.md: reproducible performance runs, engine-direct and
// through HTTP; a table, and JSON): a small run on a tiny model, and its usage errors.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { runBin } from '../helpers/run-bin.ts';


const run = (args: string[]) => runBin(args, { ...process.env, LLMTS_BACKEND: '' });

test('llmts bench: engine-direct and HTTP figures, concurrency levels, /health during a prefill; a table and JSON', async () => {
  const model = writeTinyLlama({ maxPositions: 512 });
  const out = mkdtempSync(join(tmpdir(), 'llmts-bench-'));
  try {
    const json = join(out, 'bench.json');
    const r = await run(['bench', '--model', model, '--device', 'cpu', '--tokens', '8', '--prompt-tokens', '6', '--repeats', '2',
      '--concurrency', '1,3', '--long-prompt', '40', '--json', json]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /lone\/dedicated [0-9.]+/);
    assert.match(r.stdout, /HTTP\/engine [0-9.]+/);
    assert.match(r.stdout, /\n +3 streams: +[0-9.]+ output tok\/s/);
    assert.match(r.stdout, /\/health during a 40-token prefill/);
    const j = JSON.parse(readFileSync(json, 'utf8'));
    for (const k of ['dedicatedTokPerS', 'engineDirectTokPerS', 'engineEndToEndTokPerS', 'httpTokPerS', 'loneVsDedicated', 'httpVsEngine']) {
      assert.ok(Number.isFinite(j[k]) && j[k] > 0, `${k} = ${j[k]}`);
    }
    assert.deepEqual(j.concurrency.map((c: { streams: number }) => c.streams), [1, 3]);
    assert.ok(j.concurrency.every((c: { outputTokPerS: number }) => c.outputTokPerS > 0));
    assert.equal(j.health.prefillTokens, 40);
    assert.ok(j.health.samples >= 1);
    assert.equal(j.repeats, 2);
  } finally {
    rmSync(out, { recursive: true, force: true });
    rmSync(model, { recursive: true, force: true });
  }
});

test('llmts bench: usage errors are one line and exit 2', async () => {
  for (const [args, why] of [
    [['bench'], /--model is required/],
    [['bench', '--model', '/nonexistent', '--concurrency', '1,x'], /--concurrency takes positive integers/],
    [['bench', '--model', '/nonexistent', '--tokens', '1'], /--tokens must be >= 2/],
  ] as [string[], RegExp][]) {
    const r = await run(args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, why);
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
  }
});
