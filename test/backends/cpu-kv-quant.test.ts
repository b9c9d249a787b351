// int8 and fp8 KV pools on the CPU backend (native/kv_format.h, native/kv.c): writeKv stores each
// row (one token, one kv head) as kv-quant-model.ts says, byte for byte; attention over such pools
// equals, bit for bit, attention over f32 pools holding the values they read back (the kernels
// widen each chunk and then run the f32 arithmetic); e4m3 rounding agrees with PyTorch's
// float8_e4m3fn (test/fixtures/kv-quant/e4m3.json, tools/oracle/kv_quant_reference.py).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';

import type { StepLayout, Tensor } from '../../src/contracts/backend.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { assertClose, forEachCpuIsa, randomF32, rng } from './helpers.ts';
import { dequantizeRows, e4m3Value, f32ToE4m3, quantizeRow, quantizeRows, type KvByteDtype } from './kv-quant-model.ts';

let cpu: CpuBackend;
let ref: ReferenceBackend;
before(async () => {
  cpu = await createCpuBackend();
  ref = new ReferenceBackend();
});
after(async () => {
  loadNativeLib().setIsa(-1);
  await cpu.close();
});

const DTYPES: readonly KvByteDtype[] = ['int8', 'fp8'];
const forEachIsa = (body: (isa: number) => Promise<void>) => forEachCpuIsa(cpu, (isa) => body(isa));

/** writeKv of rows [n, kvh, d] into slots 0..n-1 of fresh pools of dt; the pools' bytes */
async function written(dt: KvByteDtype, rows: Float32Array, n: number, kvh: number, d: number): Promise<Uint8Array> {
  const kv = { k: cpu.zeros([n, 1, kvh, d], dt), v: cpu.zeros([n, 1, kvh, d], dt) };
  const x = cpu.upload(rows, [n, kvh, d]);
  const layout: StepLayout = {
    tokenRow: cpu.upload(new Int32Array(n), [n]), tokenPos: cpu.upload(new Int32Array(n), [n]),
    slots: cpu.upload(Int32Array.from({ length: n }, (_, i) => i), [n]), blockTables: cpu.upload(new Int32Array(1), [1, 1]), blockSize: 1,
  };
  cpu.writeKv(kv, x, x, layout);
  const [k, v] = await Promise.all([cpu.readBlocks(kv.k, [...Array(n).keys()]), cpu.readBlocks(kv.v, [...Array(n).keys()])]);
  assert.deepEqual(v, k, 'keys and values of the same rows are stored alike');
  cpu.free(kv.k);
  cpu.free(kv.v);
  return k;
}

describe('e4m3 rounding', () => {
  it('matches PyTorch float8_e4m3fn on ties, subnormals, the largest values and random magnitudes', () => {
    const fx = JSON.parse(readFileSync(new URL('../fixtures/kv-quant/e4m3.json', import.meta.url), 'utf8')) as { x: number[]; bits: number[] };
    assert.ok(fx.x.length > 1000);
    const x = Float32Array.from(fx.x);
    const bad = [...x].map((v, i) => [v, f32ToE4m3(v), fx.bits[i]!] as const).filter(([, got, want]) => got !== want);
    assert.deepEqual(bad.slice(0, 5), [], `${bad.length} of ${x.length} values round differently from PyTorch`);
    for (let b = 0; b < 256; b++) {
      if ((b & 0x7f) === 0x7f) continue; // NaN
      assert.equal(f32ToE4m3(e4m3Value(b)), b === 0x80 ? 0x80 : b, `byte ${b} round-trips`);
    }
  });
});

describe('writeKv into int8 / fp8 pools', () => {
  for (const dt of DTYPES) {
    it(`${dt}: every row's bytes are the model's (random rows, head dims 64 and 40, every ISA)`, async () => {
      for (const d of [64, 40]) {
        const r = rng(5 + d), n = 37, kvh = 3;
        const x = randomF32(r, n * kvh * d, 3);
        // a few rows of other magnitudes: tiny, huge, one element dominating
        x.fill(0, 0, d);
        for (let i = 0; i < d; i++) x[d + i] = (r() - 0.5) * 1e-20;
        for (let i = 0; i < d; i++) x[2 * d + i] = (r() - 0.5) * 3e30;
        x[3 * d + 5] = 1000;
        const want = quantizeRows(x, d, dt);
        await forEachIsa(async () => assert.deepEqual(await written(dt, x, n, kvh, d), want));
      }
    });
  }

  it('int8 ties round to even, the largest magnitude to +-127, and the scale is amax / 127', async () => {
    const row = Float32Array.from([127, -127, 0.5, 1.5, 2.5, -0.5, -1.5, 63.5]);
    const b = await written('int8', row, 1, 1, 8);
    assert.deepEqual(b, quantizeRow(row, 'int8'));
    assert.deepEqual([...b.subarray(0, 8)].map((q) => (q << 24) >> 24), [127, -127, 0, 2, 2, 0, -2, 64]);
    assert.equal(new DataView(b.buffer, b.byteOffset).getFloat32(8, true), 1);
  });

  it('a row under 2^-100 is zeros with scale 0; a NaN or an infinity makes the scale NaN (attention gives NaN, as f32)', async () => {
    for (const dt of DTYPES) {
      const d = 16;
      const rows = new Float32Array(3 * d);
      rows.fill(2 ** -101, 0, d);
      rows.fill(1, d, 3 * d);
      rows[d + 3] = NaN;
      rows[2 * d + 7] = -Infinity;
      const got = await written(dt, rows, 3, 1, d);
      const view = new DataView(got.buffer, got.byteOffset);
      assert.deepEqual([...got.subarray(0, d)], new Array(d).fill(0));
      assert.equal(view.getFloat32(d, true), 0);
      for (const r of [1, 2]) {
        assert.deepEqual([...got.subarray(r * (d + 4), r * (d + 4) + d)], new Array(d).fill(0), `${dt} row ${r}`);
        assert.ok(Number.isNaN(view.getFloat32(r * (d + 4) + d, true)), `${dt} row ${r} scale`);
      }
    }
  });
});

describe('attention over int8 / fp8 pools', () => {
  // decode at 300 keys and a 20-token prefill chunk after a 40-token prefix in scattered blocks,
  // head dims 64 and 40 (a vector tail), G = 3, with and without a window and soft-cap
  const [nb, bs, kvh, h] = [24, 16, 2, 6];
  const rows = new Int32Array([0, ...Array(20).fill(1)]);
  const pos = new Int32Array([299, ...Array.from({ length: 20 }, (_, i) => 40 + i)]);
  const T = rows.length;
  const params = [{ scale: 0.125, window: 0, softcap: 0 }, { scale: 0.3, window: 25, softcap: 5 }];

  for (const dt of DTYPES) {
    for (const d of [64, 40]) {
      it(`${dt}, head dim ${d}: bit for bit the f32 attention over the values the pools read back, every ISA`, async () => {
        const r = rng(90 + d + (dt === 'fp8' ? 1 : 0));
        const perm = Array.from({ length: nb }, (_, i) => i).sort(() => r() - 0.5);
        const table = new Int32Array([...perm.slice(0, 19), ...perm.slice(19, 23), ...Array(15).fill(-1)]);
        const slots = Int32Array.from(rows, (row, t) => table[row * 19 + Math.floor(pos[t]! / bs)]! * bs + (pos[t]! % bs));
        const kAll = randomF32(r, nb * bs * kvh * d, 4), vAll = randomF32(r, nb * bs * kvh * d, 2);
        const qq = randomF32(r, T * h * d, 2);
        const kBytes = quantizeRows(kAll, d, dt), vBytes = quantizeRows(vAll, d, dt);
        const layoutOf = (b: CpuBackend | ReferenceBackend, s: Int32Array): StepLayout => ({
          tokenRow: b.upload(rows, [T]), tokenPos: b.upload(pos, [T]), slots: b.upload(s, [T]),
          blockTables: b.upload(table, [2, 19]), blockSize: bs,
        });
        const kf = dequantizeRows(kBytes, d, dt), vf = dequantizeRows(vBytes, d, dt);
        await forEachIsa(async () => {
          const kv = { k: cpu.zeros([nb, bs, kvh, d], dt), v: cpu.zeros([nb, bs, kvh, d], dt) };
          cpu.writeBlocks(kv.k, [...Array(nb).keys()], kBytes);
          cpu.writeBlocks(kv.v, [...Array(nb).keys()], vBytes);
          const f32 = { k: cpu.upload(kf, [nb, bs, kvh, d]), v: cpu.upload(vf, [nb, bs, kvh, d]) };
          const noWrite = new Int32Array(T).fill(-1);
          for (const p of params) {
            const q = cpu.upload(qq, [T, h, d]);
            const got = await cpu.read(cpu.attention(q, kv, layoutOf(cpu, noWrite), p));
            const want = await cpu.read(cpu.attention(q, f32, layoutOf(cpu, noWrite), p));
            assert.deepEqual(got, want, `${dt} ${JSON.stringify(p)}`);
            // and the reference backend over the same values agrees within attention's tolerance
            const refKv = { k: ref.upload(kf, [nb, bs, kvh, d]), v: ref.upload(vf, [nb, bs, kvh, d]) };
            const refOut = await ref.read(ref.attention(ref.upload(qq, [T, h, d]), refKv, layoutOf(ref, noWrite), p));
            assertClose(`${dt} vs reference ${JSON.stringify(p)}`, got, refOut, { atol: 2e-5, rtol: 1e-4 });
          }
          for (const t of [kv.k, kv.v, f32.k, f32.v] as Tensor[]) cpu.free(t);
        });
      });
    }
  }

  it('int8 keys and values stay close to the unquantized attention (per-row scales: ~1/254 of each row\'s largest)', async () => {
    const d = 64, r = rng(7);
    const table = new Int32Array([...Array(19).keys(), ...Array(19).keys()].slice(0, 38));
    const kAll = randomF32(r, nb * bs * kvh * d, 4), vAll = randomF32(r, nb * bs * kvh * d, 2);
    const qq = randomF32(r, T * h * d, 0.5);
    const layout: StepLayout = {
      tokenRow: cpu.upload(rows, [T]), tokenPos: cpu.upload(pos, [T]), slots: cpu.upload(new Int32Array(T).fill(-1), [T]),
      blockTables: cpu.upload(table, [2, 19]), blockSize: bs,
    };
    const q8 = { k: cpu.zeros([nb, bs, kvh, d], 'int8'), v: cpu.zeros([nb, bs, kvh, d], 'int8') };
    cpu.writeBlocks(q8.k, [...Array(nb).keys()], quantizeRows(kAll, d, 'int8'));
    cpu.writeBlocks(q8.v, [...Array(nb).keys()], quantizeRows(vAll, d, 'int8'));
    const f32 = { k: cpu.upload(kAll, [nb, bs, kvh, d]), v: cpu.upload(vAll, [nb, bs, kvh, d]) };
    const q = cpu.upload(qq, [T, h, d]);
    const p = { scale: 0.125, window: 0, softcap: 0 };
    assertClose('int8 vs f32 pools', await cpu.read(cpu.attention(q, q8, layout, p)), await cpu.read(cpu.attention(q, f32, layout, p)),
      { atol: 2e-2, rtol: 0 });
  });

  it('pools are (D + 4) bytes a row; mixed pools are refused naming both; other backends make none', () => {
    const k = cpu.zeros([2, 4, 3, 64], 'int8') as unknown as { bytes: number };
    assert.equal(k.bytes, 2 * 4 * 3 * 68);
    const layout: StepLayout = {
      tokenRow: cpu.upload(new Int32Array([0]), [1]), tokenPos: cpu.upload(new Int32Array([0]), [1]),
      slots: cpu.upload(new Int32Array([0]), [1]), blockTables: cpu.upload(new Int32Array([0]), [1, 1]), blockSize: 4,
    };
    const x = cpu.upload(new Float32Array(8), [1, 2, 4]);
    assert.throws(() => cpu.writeKv({ k: cpu.zeros([1, 4, 2, 4], 'int8'), v: cpu.zeros([1, 4, 2, 4], 'fp8') }, x, x, layout),
      /kv\.k int8\[1, 4, 2, 4\] and kv\.v fp8\[1, 4, 2, 4\] differ/);
    assert.throws(() => ref.zeros([1, 4, 2, 4], 'int8'), /int8 tensors are KV pools/);
  });
});
