// Weight loading into the CPU backend: every f16/bf16 bit pattern decodes exactly (load-time
// conversion, embedding rows and both matmul paths), row ranges, stacking, offsets, and errors.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { f32ToBf16, f32ToF16 } from '../../src/backends/common/half.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import { bf16ToF32, f16ToF32 } from '../../src/backends/common/half.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { assertClose, ISA_AVX512_BF16, randomF32, rng, WeightDir } from './helpers.ts';

let cpu: CpuBackend;
let files: WeightDir;

before(async () => {
  cpu = await createCpuBackend();
  files = new WeightDir();
});
after(async () => {
  await cpu.close();
  files.cleanup();
});

const EXACT = { atol: 0, rtol: 0 };
const decoders = { f16: f16ToF32, bf16: bf16ToF32 } as const;

function allPatterns(): Uint16Array {
  return Uint16Array.from({ length: 65536 }, (_, i) => i);
}

function rawSource(bits: Uint16Array, dtype: 'f16' | 'bf16', shape: number[]) {
  return files.writeRaw(new Uint8Array(bits.buffer, bits.byteOffset, bits.byteLength), dtype, shape, 13);
}

function isFinitePattern(bits: number, dtype: 'f16' | 'bf16'): boolean {
  return dtype === 'f16' ? (bits & 0x7c00) !== 0x7c00 : (bits & 0x7f80) !== 0x7f80;
}

describe('16-bit decoding is exact for every bit pattern', () => {
  for (const dtype of ['f16', 'bf16'] as const) {
    const bits = allPatterns();
    const want = Float32Array.from(bits, (b) => decoders[dtype](b));

    it(`${dtype}: loadWeight as f32 (load-time conversion)`, async () => {
      const t = await cpu.loadWeight(rawSource(bits, dtype, [4096, 16]), 'f32');
      assert.equal(t.dtype, 'f32');
      assertClose(`${dtype} -> f32`, await cpu.read(t), want, EXACT);
      cpu.free(t);
    });

    it(`${dtype}: kept dtype, read back and looked up by embedding`, async () => {
      const t = await cpu.loadWeight(rawSource(bits, dtype, [4096, 16]), 'keep');
      assert.equal(t.dtype, dtype);
      assertClose(`${dtype} read`, await cpu.read(t), want, EXACT);
      const ids = cpu.upload(Int32Array.from({ length: 4096 }, (_, i) => i), [4096]);
      assertClose(`${dtype} embedding`, await cpu.read(cpu.embedding(t, ids, 1)), want, EXACT);
      cpu.free(t);
    });

    it(`${dtype}: matmul against one-hot rows reproduces every finite weight (all kernels and ISAs)`, async () => {
      const finite = bits.filter((b) => isFinitePattern(b, dtype));
      const n = Math.floor(finite.length / 16) * 16;
      const w = await cpu.loadWeight(rawSource(finite.slice(0, n), dtype, [n / 16, 16]), 'keep');
      const wantT = Float32Array.from(finite.slice(0, n), (b) => decoders[dtype](b)); // [N, 16]
      const lib = loadNativeLib();
      const cases = [];
      for (let isa = lib.setIsa(-1); isa >= 0; isa--) for (const M of [1, 16, 17]) cases.push([isa, M] as const);
      for (const [isa, M] of cases) {
        await cpu.sync();
        lib.setIsa(isa);
        const eye = new Float32Array(M * 16);
        for (let m = 0; m < M; m++) eye[m * 16 + (m % 16)] = 1;
        const y = await cpu.read(cpu.matmul(cpu.upload(eye, [M, 16]), w)); // [M, N]: y[m][j] = w[j][m]
        const N = n / 16;
        const expect = new Float32Array(M * N);
        // AVX512-BF16's dot products (bf16 weights, every M) read subnormal inputs as zero
        const daz = isa === ISA_AVX512_BF16 && dtype === 'bf16';
        for (let m = 0; m < M; m++) for (let j = 0; j < N; j++) {
          const v = wantT[j * 16 + (m % 16)]!;
          expect[m * N + j] = daz && Math.abs(v) < 2 ** -126 ? 0 : v;
        }
        assertClose(`${dtype} one-hot M=${M} isa=${isa}`, y, expect, EXACT);
      }
      lib.setIsa(-1);
      cpu.free(w);
    });
  }

  it('test encoders round to nearest even at the edges', () => {
    // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> even (1); 1 + 3*2^-11 -> 1 + 2^-9
    assert.equal(f32ToF16(1 + 2 ** -11), 0x3c00);
    assert.equal(f32ToF16(1 + 3 * 2 ** -11), 0x3c02);
    assert.equal(f32ToF16(65504), 0x7bff);
    assert.equal(f32ToF16(65520), 0x7c00);
    assert.equal(f32ToF16(2 ** -25), 0x0000); // half the smallest subnormal: ties to even (0)
    assert.equal(f32ToF16(3 * 2 ** -26), 0x0001);
    assert.equal(f32ToF16(-(2 ** -24)), 0x8001);
    assert.equal(f32ToF16(2 ** -14 - 2 ** -25), 0x0400); // rounds up into the normals
    assert.equal(f32ToBf16(1 + 2 ** -8), 0x3f80);
    assert.equal(f32ToBf16(1 + 3 * 2 ** -8), 0x3f82);
    assert.equal(f32ToBf16(-0), 0x8000);
    assert.equal(f32ToBf16(2 ** -133), 0x0001); // bf16 subnormal
  });
});

describe('loading layouts', () => {
  it('loadWeight matches the reference backend for f32/f16/bf16 as kept and as f32', async () => {
    const ref = new ReferenceBackend();
    const r = rng(21);
    for (const dtype of ['f32', 'f16', 'bf16'] as const) {
      const src = files.write(randomF32(r, 7 * 9), dtype, [7, 9]);
      for (const as of ['keep', 'f32'] as const) {
        const a = await cpu.loadWeight(src, as);
        const b = await ref.loadWeight(src, as);
        assert.deepEqual([...a.shape], [7, 9]);
        assert.equal(a.dtype, b.dtype);
        assertClose(`${dtype} as ${as}`, await cpu.read(a), await ref.read(b), EXACT);
        cpu.free(a);
      }
    }
  });

  it('loadWeightRows reads a row range of an N-D weight', async () => {
    const r = rng(22);
    const values = randomF32(r, 7 * 3 * 2);
    for (const dtype of ['f32', 'bf16'] as const) {
      const src = files.write(values, dtype, [7, 3, 2]);
      const t = await cpu.loadWeightRows(src, 2, 3, 'f32');
      assert.deepEqual([...t.shape], [3, 3, 2]);
      const full = await cpu.read(await cpu.loadWeight(src, 'f32'));
      assertClose(`rows ${dtype}`, await cpu.read(t), full.subarray(2 * 6, 5 * 6), EXACT);
      await assert.rejects(cpu.loadWeightRows(src, 5, 3, 'keep'), /rows \[5, 8\) outside \[0, 7\)/);
    }
  });

  it('loadStacked stacks experts in order', async () => {
    const r = rng(23);
    const parts = [0, 1, 2].map(() => randomF32(r, 4 * 5));
    const srcs = parts.map((p) => files.write(p, 'bf16', [4, 5]));
    const keep = await cpu.loadStacked(srcs, 'keep');
    assert.deepEqual([...keep.shape], [3, 4, 5]);
    assert.equal(keep.dtype, 'bf16');
    const asF32 = await cpu.loadStacked(srcs, 'f32');
    const want = Float32Array.from(parts.flatMap((p) => [...p]), (v) => bf16ToF32(f32ToBf16(v)));
    assertClose('stacked keep', await cpu.read(keep), want, EXACT);
    assertClose('stacked f32', await cpu.read(asF32), want, EXACT);
    await assert.rejects(cpu.loadStacked([srcs[0]!, files.write(parts[0]!, 'bf16', [5, 4])], 'keep'),
      /loadStacked: .* is bf16\[5, 4\] but .* is bf16\[4, 5\]/);
  });

  it('a large weight spanning several read chunks converts correctly', async () => {
    const n = 3_000_001; // > 4 MiB chunk of bf16, odd length
    const r = rng(24);
    const values = randomF32(r, n);
    const src = files.write(values, 'bf16', [n]);
    const got = await cpu.read(await cpu.loadWeight(src, 'f32'));
    const want = Float32Array.from(values, (v) => bf16ToF32(f32ToBf16(v)));
    assertClose('large bf16', got, want, EXACT);
  });

  it('missing and truncated files reject with the weight name, and the backend stays usable', async () => {
    const good = files.write(randomF32(rng(25), 8), 'f32', [2, 4]);
    await assert.rejects(cpu.loadWeight({ ...good, path: `${good.path}.missing`, name: 'model.missing' }, 'keep'),
      /model\.missing .*ENOENT/);
    await assert.rejects(cpu.loadWeight({ ...good, shape: [20, 4], name: 'model.short' }, 'f32'),
      /model\.short .*file ends before the tensor does/);
    const t = await cpu.loadWeight(good, 'keep');
    assert.equal((await cpu.read(t)).length, 8);
    await cpu.sync();
  });
});
