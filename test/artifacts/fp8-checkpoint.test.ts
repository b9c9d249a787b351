// FP8 checkpoints' reading: the e4m3 values against torch's float8_e4m3fn, the scale layouts
// (including blocks that do not divide the matrix), and the clear errors for what is not an FP8
// checkpoint llmts can load. The models against transformers: test/models/fp8-fixtures.test.ts.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { E4M3_VALUES, fp8SchemeOf, Fp8WeightIndex, type Fp8Scheme } from '../../src/artifacts/fp8-checkpoint.ts';
import { openWeights } from '../../src/artifacts/safetensors.ts';
import { tempDir, writeSafetensors, type TensorSpec } from './helpers.ts';

const FIXTURE = path.resolve(import.meta.dirname, '../fixtures/fp8/e4m3-values.json');

test('e4m3 bytes decode to torch float8_e4m3fn values, NaN where torch has NaN', () => {
  const want = (JSON.parse(fs.readFileSync(FIXTURE, 'utf8')) as { values: (number | null)[] }).values;
  assert.equal(want.length, 256);
  for (let b = 0; b < 256; b++) {
    if (want[b] === null) assert.ok(Number.isNaN(E4M3_VALUES[b]), `byte ${b}: NaN expected`);
    else assert.equal(E4M3_VALUES[b], want[b], `byte 0x${b.toString(16)}`);
  }
});

const BLOCK: Fp8Scheme = { method: 'fp8', scaleSuffix: '_scale_inv', block: [2, 2] };
/** e4m3 bytes of small values: 0x38 = 1, 0x40 = 2, 0x44 = 3, 0x48 = 4, 0xb8 = -1, 0x01 = 2^-9 */
const W = [0x38, 0x40, 0x44, 0x48, 0xb8, 0x01, 0x38, 0x38, 0x40];

function indexOf(tensors: TensorSpec[], scheme: Fp8Scheme, dtype: 'f32' | 'bf16' = 'f32'): Fp8WeightIndex {
  const d = tempDir();
  writeSafetensors(path.join(d, 'model.safetensors'), tensors);
  return new Fp8WeightIndex(openWeights(d), scheme, dtype);
}

function values(ix: Fp8WeightIndex, name: string): number[] {
  const b = ix.get(name).decode!('f32');
  return [...new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4)];
}

test('block scales whose last blocks are partial: each element times its block\'s scale', () => {
  // [3, 3] in 2 x 2 blocks: a 2 x 2 grid, the last row and column of blocks partial
  const ix = indexOf([
    { name: 'w.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W },
    { name: 'w.weight_scale_inv', dtype: 'F32', shape: [2, 2], values: [0.5, 2, 8, 0.25] },
  ], BLOCK);
  assert.deepEqual(values(ix, 'w.weight'), [1 * 0.5, 2 * 0.5, 3 * 2, 4 * 0.5, -1 * 0.5, 2 ** -9 * 2, 1 * 8, 1 * 8, 2 * 0.25]);
  assert.deepEqual(ix.names(), ['w.weight'], 'the scale is part of its weight');
  const src = ix.get('w.weight');
  assert.equal(src.dtype, 'f32');
  assert.deepEqual(src.shape, [3, 3]);
});

test('per-tensor and per-row scales (compressed-tensors), bf16 scales, static input scales dropped', () => {
  const scheme: Fp8Scheme = { method: 'compressed-tensors', scaleSuffix: '_scale' };
  const ix = indexOf([
    { name: 'a.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W },
    { name: 'a.weight_scale', dtype: 'F32', shape: [1], values: [0.125] },
    { name: 'a.input_scale', dtype: 'F32', shape: [1], values: [0.05] },
    { name: 'b.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W },
    { name: 'b.weight_scale', dtype: 'BF16', shape: [3, 1], values: [1, 0.5, 4] },
    { name: 'norm.weight', dtype: 'F32', shape: [3], values: [1, 2, 3] },
  ], scheme, 'bf16');
  assert.deepEqual(ix.names().sort(), ['a.weight', 'b.weight', 'norm.weight']);
  assert.deepEqual(values(ix, 'a.weight'), [1, 2, 3, 4, -1, 2 ** -9, 1, 1, 2].map((v) => v * 0.125));
  assert.deepEqual(values(ix, 'b.weight'), [1, 2, 3, 2, -0.5, 2 ** -10, 4, 4, 8]);
  assert.equal(ix.get('b.weight').dtype, 'bf16', 'the load\'s dtype');
  assert.equal(ix.get('norm.weight').decode, undefined, 'other tensors load as stored');
});

test('an FP8 weight without its scale, of the wrong scale grid, or in e5m2 fails naming the tensors', () => {
  assert.throws(() => indexOf([{ name: 'w.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W }], BLOCK),
    /tensor "w\.weight" .* is F8_E4M3 without its scale "w\.weight_scale_inv" \(quant_method fp8\)/);
  assert.throws(() => indexOf([
    { name: 'w.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W },
    { name: 'w.weight_scale_inv', dtype: 'F32', shape: [3, 3] },
  ], BLOCK), /tensor "w\.weight_scale_inv" .* has shape \[3, 3\]: not the grid of 2 x 2 blocks for "w\.weight" \[3, 3\]/);
  assert.throws(() => indexOf([
    { name: 'w.weight', dtype: 'F8_E4M3', shape: [4, 4], values: new Array(16).fill(0x38) },
    { name: 'w.weight_scale_inv', dtype: 'F32', shape: [3, 3] },
  ], { ...BLOCK, block: undefined }), /blocks that do not divide the matrix/);
  assert.throws(() => indexOf([{ name: 'w.weight', dtype: 'F8_E5M2', shape: [3, 3], values: W }], BLOCK),
    /tensor "w\.weight" .* is F8_E5M2; FP8 weights load from e4m3/);
  assert.throws(() => indexOf([
    { name: 'w.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W },
    { name: 'w.weight_scale_inv', dtype: 'I64', shape: [2, 2] },
  ], BLOCK).get('w.weight').decode!('f32'), /FP8 scales load from F32, BF16 or F16/);
});

test('quantization_config: fp8 and float8 compressed-tensors read; everything else fails with one line', () => {
  const f = 'config.json';
  assert.equal(fp8SchemeOf({}, f), undefined);
  assert.deepEqual(fp8SchemeOf({ quantization_config: { quant_method: 'fp8', fmt: 'e4m3', weight_block_size: [128, 128] } }, f),
    { method: 'fp8', scaleSuffix: '_scale_inv', block: [128, 128] });
  const ct = (weights: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
    quantization_config: { quant_method: 'compressed-tensors', format: 'float-quantized', config_groups: { group_0: { targets: ['Linear'], weights } }, ...extra },
  });
  assert.deepEqual(fp8SchemeOf(ct({ num_bits: 8, type: 'float', strategy: 'channel', symmetric: true }), f),
    { method: 'compressed-tensors', scaleSuffix: '_scale', block: undefined });
  assert.deepEqual(fp8SchemeOf(ct({ num_bits: 8, type: 'float', strategy: 'block', block_structure: [128, 128] }), f)?.block, [128, 128]);
  const bad: [unknown, RegExp][] = [
    [{ quantization_config: { quant_method: 'awq', bits: 4, group_size: 128 } }, /quant_method "awq" is not loadable/],
    [{ quantization_config: { quant_method: 'gptq', bits: 4 } }, /quant_method "gptq" is not loadable/],
    [{ quantization_config: { quant_method: 'fp8', fmt: 'e5m2' } }, /fmt "e5m2" is not loadable/],
    [{ quantization_config: { quant_method: 'fp8', weight_block_size: [128] } }, /weight_block_size \[128\] is not two positive integers/],
    [ct({ num_bits: 4, type: 'int', strategy: 'group', group_size: 128 }, { format: 'pack-quantized' }), /not 8-bit float weights/],
    [ct({ num_bits: 8, type: 'float', strategy: 'tensor', symmetric: false }), /asymmetric/],
    [ct({ num_bits: 8, type: 'float', strategy: 'token' }), /strategy "token" is not tensor, channel or block/],
    [ct({ num_bits: 8, type: 'float', strategy: 'tensor' }, { format: 'pack-quantized' }), /format "pack-quantized" is not loadable/],
    [{ quantization_config: 'fp8' }, /is not an object/],
  ];
  for (const [cfg, re] of bad) {
    assert.throws(() => fp8SchemeOf(cfg as Record<string, unknown>, f), (e: Error) => re.test(e.message) && /^config\.json: quantization_config: .*; supported: /.test(e.message), JSON.stringify(cfg));
  }
});

test('the FP8 form a backend keeps (WeightSource.fp8) gives the dequantized values of every fixture matrix; K off 16 or odd blocks offer none', async () => {
  const { loadModelDir } = await import('../../src/artifacts/model-dir.ts');
  const root = path.resolve(import.meta.dirname, '../fixtures/fp8');
  let kept = 0;
  for (const name of fs.readdirSync(root).filter((d) => fs.existsSync(path.join(root, d, 'config.json')))) {
    const { weights } = loadModelDir(path.join(root, name), { tokenizer: false, quantizedDtype: 'f32' });
    for (const t of weights.names()) {
      const src = weights.get(t);
      if (!src.fp8) continue;
      const { bits, scales, scaleCols } = src.fp8();
      const [N, K] = src.shape as [number, number];
      const KB = Math.ceil(K / scaleCols);
      assert.ok(scaleCols >= 16 && (scaleCols & (scaleCols - 1)) === 0, `${name} ${t}: scaleCols ${scaleCols}`);
      assert.equal(scales.length, N * KB);
      const d = src.decode!('f32');
      const want = new Float32Array(d.buffer, d.byteOffset, d.byteLength / 4);
      for (let i = 0; i < N * K; i++) {
        const got = Math.fround(E4M3_VALUES[bits[i]!]! * scales[Math.floor(i / K) * KB + Math.floor((i % K) / scaleCols)]!);
        if (got !== want[i]) assert.fail(`${name} ${t}[${i}]: ${got} vs ${want[i]}`);
      }
      kept++;
    }
  }
  assert.ok(kept >= 3 * 7, `${kept} matrices offered in FP8`);
  // blocks 3 columns wide (the partial-block case above) and K = 3: none
  const ix = indexOf([
    { name: 'w.weight', dtype: 'F8_E4M3', shape: [3, 3], values: W },
    { name: 'w.weight_scale_inv', dtype: 'F32', shape: [2, 2], values: [0.5, 2, 8, 0.25] },
  ], BLOCK);
  assert.equal(ix.get('w.weight').fp8, undefined);
});
