// Quantizing a safetensors checkpoint as it loads (`--quantization q8_0|q4_0`,
// src/artifacts/online-quant.ts) against llama.cpp's own quantizers: test/fixtures/gguf's
// llama_q8_0 and mistral_q4_0 are test/fixtures/llama and mistral quantized by gguf-py
// (scripts/make_gguf_fixtures.py). Every matrix's blocks equal the GGUF's byte for byte; the
// engine on the quantized checkpoint gives the GGUF's tokens and logprobs exactly (both kept
// quantized on the CPU backend) and matches transformers on that GGUF within the kept-quantized
// tolerance; the fit plans it at the GGUF's bytes; misuse fails with one clear line. fp8 (the
// CUDA backend's): e4m3 rounding against PyTorch's float8_e4m3fn (test/fixtures/kv-quant/e4m3.json),
// which matrices it takes, their values, the fit's bytes on CUDA, and the CPU's refusal.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';

import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { quantizeBlocks, quantizeFp8Rows, QuantizingWeightIndex } from '../../src/artifacts/online-quant.ts';
import { E4M3_VALUES } from '../../src/artifacts/fp8-checkpoint.ts';
import { readSourceValues } from '../../src/artifacts/source-values.ts';
import { dtypeBytes } from '../../src/contracts/backend.ts';
import { decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
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
  await assert.rejects(loadModel(ref, join(FIXTURES, 'llama'), { quantization: 'q3' as 'q8_0' }), /quantization must be one of q8_0, q4_0, fp8, got "q3"/);
  await assert.rejects(loadModel(ref, join(FIXTURES, 'llama'), { quantization: 'q8_0' }), /--quantization q8_0 is for the CPU backend/);
  const cpu = await createCpuBackend();
  try {
    await assert.rejects(loadModel(cpu, join(FIXTURES, 'llama'), { quantization: 'fp8' }),
      /--quantization fp8 is for the CUDA backend \(the cpu backend has no kernels for fp8 weights; q8_0 and q4_0 are the CPU ones\)/);
  } finally {
    await cpu.close();
  }
});

test('fp8: the CUDA plan holds the layers\' matrices at a byte a weight and a scale a row', async () => {
  const dir = join(FIXTURES, 'llama');
  const stored = loadModelDir(dir, { tokenizer: false }).weights;
  const fp8 = stored.names().map((n) => stored.get(n)).filter((w) => w.shape.length === 2 && w.name.includes('.layers.'));
  const plain = await (await FitPlanner.open(dir)).weights('cuda');
  const online = await (await FitPlanner.open(dir, { quantization: 'fp8' })).weights('cuda');
  // each matrix as stored (f32 in this fixture) against its e4m3 bytes and a scale a row
  const saved = fp8.reduce((a, w) => a + w.shape[0]! * w.shape[1]! * (dtypeBytes[w.dtype] - 1) - 4 * w.shape[0]!, 0);
  assert.equal(online.residentBytes, plain.residentBytes - saved);
});

test('fp8: rows scaled by max|x| / 448 and rounded as PyTorch rounds to float8_e4m3fn (ties to even, subnormals, 448)', () => {
  const fx = JSON.parse(readFileSync(join(FIXTURES, 'kv-quant', 'e4m3.json'), 'utf8')) as { x: number[]; bits: number[] };
  // rows of 15 fixture values and 448 (the scale is then exactly 1: x / s = x), and the same rows
  // times 2^-5 (scale 2^-5: x / s exact again), so each byte is PyTorch's for that x
  const K = 16, rows = Math.ceil(fx.x.length / (K - 1));
  for (const f of [1, 2 ** -5]) {
    const x = new Float32Array(rows * K), want: number[] = [];
    for (let r = 0; r < rows; r++) {
      for (let k = 0; k < K - 1; k++) {
        const i = (r * (K - 1) + k) % fx.x.length;
        x[r * K + k] = fx.x[i]! * f;
        want.push(fx.bits[i]!);
      }
      x[r * K + K - 1] = 448 * f;
      want.push(0x7e);
    }
    const m = quantizeFp8Rows(x, rows, K, 'w');
    assert.deepEqual([...m.scales], new Array(rows).fill(f), 'a scale a row, max|x| / 448');
    assert.equal(m.scaleCols, 16);
    assert.deepEqual([...m.bits], want, `factor ${f}: the bytes`);
  }
  const z = quantizeFp8Rows(new Float32Array(32), 2, 16, 'w');
  assert.deepEqual([...z.scales], [1, 1], 'a row of zeros: scale 1, bytes 0');
  assert.throws(() => quantizeFp8Rows(Float32Array.of(1, NaN, ...new Array(14).fill(0)), 1, 16, 'layers.0.q'),
    /layers\.0\.q: row 0 holds NaN; fp8 quantization needs finite weights/);
});

test('fp8: the decoder layers\' matrices become e4m3 with a scale a row; the embedding, the head and vectors load as stored', async () => {
  const dir = join(FIXTURES, 'llama');
  const stored = loadModelDir(dir, { tokenizer: false }).weights;
  const online = loadModelDir(dir, { tokenizer: false, quantization: 'fp8' }).weights;
  let matrices = 0;
  for (const name of online.names()) {
    const src = online.get(name);
    if (src.shape.length !== 2 || !name.includes('.layers.')) {
      assert.equal(src.fp8, undefined, `${name} stays as stored`);
      continue;
    }
    const [N, K] = src.shape as [number, number];
    const m = src.fp8!();
    assert.equal(src.fp8ScaleCols, m.scaleCols, name);
    assert.ok(m.scaleCols >= K && m.scales.length === N, `${name}: one scale a row`);
    // each byte the nearest e4m3 of x / s: no other byte's value is closer
    const x = readSourceValues(stored.get(name));
    const dv = src.decode!('bf16');
    const values = decodeHalf(new Uint16Array(dv.buffer, dv.byteOffset, dv.byteLength / 2), 'bf16');
    for (let i = 0; i < N * K; i += 7) {
      const s = m.scales[Math.floor(i / K)]!, y = Math.fround(x[i]! / s);
      const err = Math.abs(E4M3_VALUES[m.bits[i]!]! - y);
      for (const b of [m.bits[i]! - 1, m.bits[i]! + 1]) if ((b & 0x7f) < 0x7f && b >= 0) assert.ok(Math.abs(E4M3_VALUES[b]! - y) >= err, `${name}[${i}]`);
      const v = Math.fround(E4M3_VALUES[m.bits[i]!]! * s);
      assert.equal(values[i], decodeHalf(encodeHalf(Float32Array.of(v), 'bf16'), 'bf16')[0], `${name}[${i}]: the value is e4m3 x s in bf16`);
    }
    matrices++;
  }
  assert.ok(matrices >= 14, `${matrices} matrices`);
});
