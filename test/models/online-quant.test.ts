// Quantizing a safetensors checkpoint as it loads (`--quantization q8_0|q4_0`,
// src/artifacts/online-quant.ts) against llama.cpp's own quantizers: test/fixtures/gguf's
// llama_q8_0 and mistral_q4_0 are test/fixtures/llama and mistral quantized by gguf-py
// (scripts/make_gguf_fixtures.py). Every matrix's blocks equal the GGUF's byte for byte; the
// engine on the quantized checkpoint gives the GGUF's tokens and logprobs exactly (both kept
// quantized on the CPU backend) and matches transformers on that GGUF within the kept-quantized
// tolerance; the fit plans it at the GGUF's bytes; misuse fails with one clear line.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';

import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { quantizeBlocks, QuantizingWeightIndex } from '../../src/artifacts/online-quant.ts';
import { Engine } from '../../src/execution/engine.ts';
import { FitPlanner } from '../../src/execution/fit/plan.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const CASES = [
  { family: 'llama', gguf: 'llama_q8_0', quantization: 'q8_0' },
  { family: 'mistral', gguf: 'mistral_q4_0', quantization: 'q4_0' },
] as const;

interface Reference {
  cases: { prompt_token_ids: number[]; steps: StepRecord[] }[];
}

for (const { family, gguf, quantization } of CASES) {
  const dir = join(FIXTURES, family), file = join(FIXTURES, 'gguf', `${gguf}.gguf`);

  test(`${family} --quantization ${quantization}: every matrix's blocks are gguf-py's, byte for byte`, () => {
    const online = loadModelDir(dir, { tokenizer: false, quantization }).weights;
    const ggufWeights = loadModelDir(file, { tokenizer: false }).weights;
    assert.ok(online instanceof QuantizingWeightIndex);
    let matrices = 0;
    for (const name of online.names()) {
      const src = online.get(name);
      if (src.shape.length !== 2) {
        assert.equal(src.quantized, undefined, `${name} is not a matrix`);
        continue;
      }
      const want = ggufWeights.get(name).quantized;
      assert.ok(src.quantized && want, `${name}: both quantized`);
      assert.equal(src.quantized.type, want.type, name);
      assert.deepEqual(src.quantized.blocks(), want.blocks(), name);
      matrices++;
    }
    assert.ok(matrices >= 16, `${matrices} matrices`);
  });

  test(`${family} --quantization ${quantization}: the GGUF's tokens and logprobs exactly, and transformers' on it within 0.1`, async () => {
    const ref = JSON.parse(readFileSync(join(FIXTURES, 'gguf', `${gguf}.reference.json`), 'utf8')) as Reference;
    const backend = await createCpuBackend();
    try {
      const run = async (path: string, opts: { quantization?: typeof quantization }) => {
        const m = await loadModel(backend, path, { maxModelLen: 512, ...opts });
        const out = [];
        for (const c of ref.cases) {
          const e = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
          out.push(await e.complete({ promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 5 }));
          await e.close(0);
        }
        const layout = (m.model.weights.layers[0]!.attn as unknown as Record<string, { layout?: string }>);
        return { out, layouts: new Set(Object.values(layout).map((w) => w?.layout)) };
      };
      const online = await run(dir, { quantization });
      const fromFile = await run(file, {});
      assert.ok(online.layouts.has(quantization), `attention matrices kept as ${quantization} (${[...online.layouts].join(', ')})`);
      ref.cases.forEach((c, k) => {
        assert.deepEqual(online.out[k]!.tokenIds, fromFile.out[k]!.tokenIds, `case ${k} tokens`);
        assert.deepEqual(online.out[k]!.logprobs, fromFile.out[k]!.logprobs, `case ${k} logprobs`);
        const r = compareToReference(online.out[k]!.logprobs!, c.steps, 0.1);
        assert.ok(r.ok, `case ${k}: ${r.problem}`);
      });
    } finally {
      await backend.close();
    }
  });

  test(`${family} --quantization ${quantization}: planned at the GGUF's resident bytes; its prefix cache is another model's`, async () => {
    const online = await FitPlanner.open(dir, { quantization });
    const plain = await FitPlanner.open(dir);
    const fromFile = await FitPlanner.open(file);
    const bytes = async (p: FitPlanner) => (await p.weights('cpu')).residentBytes;
    assert.equal(await bytes(online), await bytes(fromFile), 'the GGUF\'s resident bytes');
    assert.ok((await bytes(online)) < (await bytes(plain)) * 0.7, 'fewer bytes than the checkpoint as stored');
    assert.notEqual(modelFingerprint(dir, quantization), modelFingerprint(dir));
  });
}

test('quantizers: zero blocks, exact ties, and the sign of Q4_0\'s largest value', () => {
  const x = new Float32Array(64);
  for (let j = 0; j < 32; j++) x[32 + j] = (j - 16) * 0.5; // largest magnitude -8: d = 1
  const q8 = quantizeBlocks('Q8_0', x);
  assert.deepEqual([...q8.subarray(0, 34)], new Array(34).fill(0), 'a zero block is d 0, q 0');
  const q4 = quantizeBlocks('Q4_0', x);
  assert.deepEqual([...q4.subarray(18, 20)], [0x00, 0x3c], 'd = -8 / -8 = 1 (f16 0x3c00)');
  // x * 1 + 8.5 truncated: -8 -> 0, -7.5 -> 1, ..., 7.5 -> 16 -> 15
  const nib = (j: number) => (j < 16 ? q4[20 + j]! & 0xf : q4[20 + j - 16]! >> 4);
  assert.deepEqual(Array.from({ length: 32 }, (_, j) => nib(j)), Array.from({ length: 32 }, (_, j) => Math.min(15, Math.trunc((j - 16) * 0.5 + 8.5))));
  assert.throws(() => quantizeBlocks('Q8_0', new Float32Array(33)), /33 values are not whole blocks of 32/);
});

test('--quantization misuse: a GGUF model, an unknown method, a backend other than the CPU', async () => {
  assert.throws(() => loadModelDir(join(FIXTURES, 'gguf', 'llama_q8_0.gguf'), { quantization: 'q8_0' }),
    /is a GGUF model, whose tensors keep the types they were quantized to: --quantization q8_0 applies to safetensors checkpoints/);
  const ref = new ReferenceBackend();
  await assert.rejects(loadModel(ref, join(FIXTURES, 'llama'), { quantization: 'q3' as 'q8_0' }), /quantization must be one of q8_0, q4_0, got "q3"/);
  await assert.rejects(loadModel(ref, join(FIXTURES, 'llama'), { quantization: 'q8_0' }), /--quantization q8_0 is for the CPU backend/);
});
