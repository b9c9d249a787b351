// Every CPU backend op against the reference backend on random (never zero) inputs, odd shapes and
// each weight dtype.
//
// Tolerances (|cpu - ref| <= atol + rtol * |ref|): the reference accumulates in f64, the CPU
// backend in f32 (FMA, blocked sums), so the bound scales with the reduction length:
//   matmul / moeFfn: atol 1e-4, rtol 1e-4 (K <= 300, |x|,|w| <= 1: f32 error ~ K * 6e-8 * |terms|)
//   attention: 2e-5 / 1e-4; rmsnorm, rope, glu, softcap, moeRoute weights: 1e-5 / 1e-5
//   embedding, gatherRows, add, scale, writeKv, moeRoute experts: exact or 1 ulp (1e-7 rel)
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { Backend, DType, StepLayout, Tensor } from '../../src/contracts/backend.ts';
import { decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import { assertClose, compareBackends, CPU_ISA_NAMES, forEachCpuIsa, ISA_AVX512_BF16, randomF32, rng, WeightDir } from './helpers.ts';

const WDTYPES = ['f32', 'f16', 'bf16'] as const;
const EXACT = { atol: 0, rtol: 1.2e-7 };
const TIGHT = { atol: 1e-5, rtol: 1e-5 };
const GEMM = { atol: 1e-4, rtol: 1e-4 };

let ref: ReferenceBackend;
let cpu: CpuBackend;
let files: WeightDir;

before(async () => {
  ref = new ReferenceBackend();
  cpu = await createCpuBackend();
  files = new WeightDir();
});
after(async () => {
  loadNativeLib().setIsa(-1);
  await cpu.close();
  files.cleanup();
});

/** A weight of `dtype` on backend b: loaded from a file (the only way to get f16/bf16). */
function weight(values: Float32Array, dtype: 'f32' | 'f16' | 'bf16', shape: number[]) {
  const src = files.write(values, dtype, shape);
  return (b: Backend) => b.loadWeight(src, 'keep');
}

const roundBf16 = (x: Float32Array) => decodeHalf(encodeHalf(x, 'bf16'), 'bf16');

const forEachIsa = (body: (isa: number) => Promise<void>) => forEachCpuIsa(cpu, body);

describe('matmul', () => {
  const shapes: [number, number, number][] = [
    [1, 129, 67], [2, 7, 16], [4, 33, 96], [5, 129, 67], [8, 17, 3], [9, 33, 64], [37, 129, 67], [70, 100, 300],
    [33, 1, 5], [16, 40, 100], [17, 40, 100],
  ];
  for (const dtype of WDTYPES) {
    it(`${dtype} weights, every ISA's kernels, with and without bias`, async () => {
      await forEachIsa(async (isa) => {
        const r = rng(11 + isa);
        for (const [M, N, K] of shapes) {
          const x = randomF32(r, M * K);
          const w = weight(randomF32(r, N * K), dtype, [N, K]);
          const bias = randomF32(r, N);
          // the bf16 dot products' x is x rounded to bf16 (nearest even): the reference gets it so
          const bf16Dot = isa === ISA_AVX512_BF16 && dtype === 'bf16' && K % 2 === 0;
          const xRef = bf16Dot ? roundBf16(x) : x;
          await compareBackends(`matmul M=${M} N=${N} K=${K} ${dtype} ${CPU_ISA_NAMES[isa]}`, ref, cpu, async (b) => {
            const xt = b.upload(b === ref ? xRef : x, [M, K]);
            const wt = await w(b);
            return [b.matmul(xt, wt), b.matmul(xt, wt, b.upload(bias, [N]))];
          }, GEMM);
        }
      });
    });
  }

  it('handles M = 0 and K = 0 (empty sum = bias)', async () => {
    const y0 = cpu.matmul(cpu.upload(new Float32Array(0), [0, 8]), cpu.upload(randomF32(rng(1), 24), [3, 8]));
    const yk = cpu.matmul(cpu.upload(new Float32Array(0), [2, 0]), cpu.upload(new Float32Array(0), [3, 0]),
      cpu.upload(new Float32Array([1, 2, 3]), [3]));
    assert.deepEqual([...y0.shape], [0, 3]);
    assert.deepEqual([...(await cpu.read(y0))], []);
    assert.deepEqual([...(await cpu.read(yk))], [1, 2, 3, 1, 2, 3]);
  });
});

describe('elementwise and row ops', () => {
  it('embedding: every table dtype, repeated ids, scale', async () => {
    const r = rng(2);
    for (const dtype of WDTYPES) {
      const table = weight(randomF32(r, 50 * 67), dtype, [50, 67]);
      const ids = new Int32Array([3, 49, 0, 3, 17]);
      await compareBackends(`embedding ${dtype}`, ref, cpu, async (b) => [
        b.embedding(await table(b), b.upload(ids, [5]), 1),
        b.embedding(await table(b), b.upload(ids, [5]), 1.7),
      ], EXACT);
    }
  });

  it('rmsnorm: weightOffset 0 and 1, 2-D and 3-D', async () => {
    const r = rng(3);
    for (const shape of [[5, 67], [2, 3, 24], [1, 4096]]) {
      const D = shape[shape.length - 1]!;
      const x = randomF32(r, shape.reduce((a, b) => a * b, 1), 3);
      const w = randomF32(r, D);
      await compareBackends(`rmsnorm [${shape}]`, ref, cpu, (b) => [
        b.rmsnorm(b.upload(x, shape), b.upload(w, [D]), 1e-6, 0),
        b.rmsnorm(b.upload(x, shape), b.upload(w, [D]), 1e-5, 1),
      ], TIGHT);
    }
  });

  it('add (bScale 1, -0.5), scale, softcap', async () => {
    const r = rng(4);
    const a = randomF32(r, 5 * 67, 40);
    const c = randomF32(r, 5 * 67, 40);
    await compareBackends('add/scale', ref, cpu, (b) => {
      const at = b.upload(a, [5, 67]);
      const ct = b.upload(c, [5, 67]);
      return [b.add(at, ct, 1), b.add(at, ct, -0.5), b.scale(at, 0.125), b.scale(at, -3.3)];
    }, EXACT);
    await compareBackends('softcap', ref, cpu, (b) => [b.softcap(b.upload(a, [5, 67]), 30),
      b.softcap(b.upload(a, [335]), 7.5)], TIGHT);
  });

  it('glu: silu, gelu_tanh, gelu', async () => {
    const r = rng(5);
    const g = randomF32(r, 3 * 129, 6);
    const u = randomF32(r, 3 * 129, 2);
    for (const act of ['silu', 'gelu_tanh', 'gelu'] as const) {
      await compareBackends(`glu ${act}`, ref, cpu, (b) => [b.glu(b.upload(g, [3, 129]), b.upload(u, [3, 129]), act)],
        TIGHT);
    }
  });

  it('rope: partial rotary dims, scattered positions, attentionScaling', async () => {
    const r = rng(6);
    const [T, H, D, rot] = [5, 3, 24, 12];
    const x = randomF32(r, T * H * D, 2);
    const pos = new Int32Array([0, 7, 3, 1000, 65535]);
    const inv = Float32Array.from({ length: rot / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / rot));
    for (const scaling of [1, 0.8]) {
      await compareBackends(`rope scaling ${scaling}`, ref, cpu, (b) =>
        [b.rope(b.upload(x, [T, H, D]), b.upload(pos, [T]), b.upload(inv, [rot / 2]), scaling)], TIGHT);
    }
    // full rotary dims too
    const invFull = Float32Array.from({ length: D / 2 }, (_, i) => 1 / 500000 ** ((2 * i) / D));
    await compareBackends('rope full', ref, cpu, (b) =>
      [b.rope(b.upload(x, [T, H, D]), b.upload(pos, [T]), b.upload(invFull, [D / 2]), 1)], TIGHT);
    // one table per token (rows of different lengths under dynamic NTK / LongRoPE)
    const perToken = randomF32(r, T * (rot / 2), 1).map((v) => Math.abs(v) + 1e-3);
    await compareBackends('rope per-token tables', ref, cpu, (b) =>
      [b.rope(b.upload(x, [T, H, D]), b.upload(pos, [T]), b.upload(perToken, [T, rot / 2]), 0.9)], TIGHT);
  });

  it('gatherRows: repeated and out-of-order rows, f32 and i32', async () => {
    const r = rng(7);
    const x = randomF32(r, 7 * 13);
    const xi = Int32Array.from({ length: 7 * 13 }, (_, i) => i * 3 - 50);
    const idx = new Int32Array([6, 0, 6, 2]);
    await compareBackends('gatherRows', ref, cpu, (b) => [b.gatherRows(b.upload(x, [7, 13]), b.upload(idx, [4]))],
      EXACT);
    const got = await cpu.read(cpu.gatherRows(cpu.upload(xi, [7, 13]), cpu.upload(idx, [4])));
    const want = [...idx].flatMap((i) => [...xi.subarray(i * 13, i * 13 + 13)]);
    assert.deepEqual([...got], want);
    // i32 rows on the reference too (a pipelined step gathers its ids from the previous picks)
    assert.deepEqual([...await ref.read(ref.gatherRows(ref.upload(xi, [7, 13]), ref.upload(idx, [4])))], want);
  });

  it('argmax: the host sampler\'s greedy pick (lowest index on ties, never NaN, -1 when nothing beats -Infinity)', async () => {
    const r = rng(8);
    const V = 1031;
    const x = randomF32(r, 6 * V);
    x[1 * V + 17] = 5; x[1 * V + 900] = 5; // a tie: the lower index wins
    x.fill(NaN, 2 * V, 3 * V); x[2 * V + 400] = -3; // NaN is never chosen
    x.fill(-Infinity, 3 * V, 4 * V); // nothing above -Infinity
    x.fill(NaN, 4 * V, 5 * V);
    x[5 * V + V - 1] = Infinity;
    const got = await cpu.read(cpu.argmax(cpu.upload(x, [6, V])));
    const want = await ref.read(ref.argmax(ref.upload(x, [6, V])));
    assert.deepEqual([...got], [...want]);
    assert.deepEqual([...got].slice(1), [17, 400, -1, -1, V - 1]);
    assert.equal((await cpu.read(cpu.argmax(cpu.upload(new Float32Array(0), [0, 5])))).length, 0);
  });

  it('copyTensor: an enqueued device copy into an existing tensor, same dtype and element count', async () => {
    const src = Int32Array.from({ length: 12 }, (_, i) => i * 7 - 3);
    const t = cpu.zeros([3, 4], 'i32');
    const s = cpu.upload(src, [12]);
    cpu.copyTensor(t, s);
    cpu.copyTensor(s, cpu.upload(new Int32Array(12), [12])); // ordered after the copy above
    assert.deepEqual([...await cpu.read(t)], [...src]);
    assert.throws(() => cpu.copyTensor(t, cpu.upload(new Float32Array(12), [12])), /copyTensor/);
    assert.throws(() => cpu.copyTensor(t, cpu.upload(new Int32Array(11), [11])), /copyTensor/);
    cpu.free(t);
  });
});

describe('paged KV: writeKv and attention', () => {
  // 12 blocks of 4 slots, 2 KV heads, 6 query heads (GQA groups of 3), headDim 24.
  const [NB, BS, KVH, H, D] = [12, 4, 2, 6, 24];
  const MBR = 5;
  // Non-contiguous, shuffled block tables; -1 where a row holds no block.
  const tables = new Int32Array([
    5, 2, 9, 11, -1, // row 0
    0, 7, -1, -1, -1, // row 1
    3, -1, -1, -1, -1, // row 2
  ]);
  // One flattened step: row 0 prefills positions 9..13 (chunk after a cached prefix), row 1
  // decodes at position 6, row 2 prefills 0..2; the last token is padding (slot -1 -> skipped,
  // but it still attends as row 2 at position 2).
  const tokenRow = new Int32Array([0, 0, 0, 0, 0, 1, 2, 2, 2, 2]);
  const tokenPos = new Int32Array([9, 10, 11, 12, 13, 6, 0, 1, 2, 2]);
  const T = tokenRow.length;
  const slots = Int32Array.from(tokenRow, (row, t) => {
    if (t === T - 1) return -1;
    const p = tokenPos[t]!;
    return tables[row * MBR + Math.floor(p / BS)]! * BS + (p % BS);
  });
  const r = rng(8);
  const kPool0 = randomF32(r, NB * BS * KVH * D); // earlier steps' keys (and garbage elsewhere)
  const vPool0 = randomF32(r, NB * BS * KVH * D);
  const k = randomF32(r, T * KVH * D);
  const v = randomF32(r, T * KVH * D);
  const q = randomF32(r, T * H * D, 2);

  const step = (b: Backend, params: { scale: number; window: number; softcap: number }): Tensor[] => {
    const kv = { k: b.upload(kPool0, [NB, BS, KVH, D]), v: b.upload(vPool0, [NB, BS, KVH, D]) };
    const layout: StepLayout = {
      tokenRow: b.upload(tokenRow, [T]), tokenPos: b.upload(tokenPos, [T]), slots: b.upload(slots, [T]),
      blockTables: b.upload(tables, [3, MBR]), blockSize: BS,
    };
    b.writeKv(kv, b.upload(k, [T, KVH, D]), b.upload(v, [T, KVH, D]), layout);
    return [b.attention(b.upload(q, [T, H, D]), kv, layout, params), kv.k, kv.v];
  };

  for (const params of [
    { scale: 1 / Math.sqrt(D), window: 0, softcap: 0 },
    { scale: 1 / Math.sqrt(D), window: 3, softcap: 0 },
    { scale: 0.35, window: 0, softcap: 5 },
    { scale: 0.2, window: 1, softcap: 50 },
  ]) {
    it(`window ${params.window}, softcap ${params.softcap}, every ISA's kernel`, async () => {
      await forEachIsa(() => compareBackends(`attention ${JSON.stringify(params)}`, ref, cpu, (b) => step(b, params),
        { atol: 2e-5, rtol: 1e-4 }));
    });
  }

  it('MQA (one KV head) and long context across many blocks', async () => {
    const [nb, bs, kvh, h, d] = [40, 16, 1, 4, 64];
    const rr = rng(9);
    const perm = Array.from({ length: nb }, (_, i) => i).sort(() => rr() - 0.5);
    const tab = new Int32Array(perm.slice(0, 38));
    const pos = new Int32Array([599, 600, 17]);
    const rows = new Int32Array([0, 0, 0]);
    const kp = randomF32(rr, nb * bs * kvh * d);
    const vp = randomF32(rr, nb * bs * kvh * d);
    const qq = randomF32(rr, 3 * h * d);
    await forEachIsa(() => compareBackends('attention MQA long', ref, cpu, (b) => {
      const kv = { k: b.upload(kp, [nb, bs, kvh, d]), v: b.upload(vp, [nb, bs, kvh, d]) };
      const layout: StepLayout = {
        tokenRow: b.upload(rows, [3]), tokenPos: b.upload(pos, [3]), slots: b.upload(new Int32Array([-1, -1, -1]), [3]),
        blockTables: b.upload(tab, [1, 38]), blockSize: bs,
      };
      return [b.attention(b.upload(qq, [3, h, d]), kv, layout, { scale: 0.125, window: 0, softcap: 0 }),
        b.attention(b.upload(qq, [3, h, d]), kv, layout, { scale: 0.125, window: 100, softcap: 0 })];
    }, { atol: 2e-5, rtol: 1e-4 }));
  });
});

describe('bf16 KV pools (half the bytes a decode step reads)', () => {
  // decode at 300 keys and a 20-token prefill chunk after a 40-token prefix, head dims 64 and 40 (a
  // vector tail), G = 3; the reference attends over the same bf16-rounded keys and values in f32
  const cases = [[64, 'decode and prefill'], [40, 'head dim 40: scalar tails']] as const;
  for (const [d, what] of cases) {
    it(`writeKv rounds to nearest even; attention matches the reference on the rounded pools (${what}), every ISA`, async () => {
      const [nb, bs, kvh, h] = [24, 16, 2, 6];
      const rr = rng(31 + d);
      const rows = new Int32Array([0, ...Array(20).fill(1)]);
      const pos = new Int32Array([299, ...Array.from({ length: 20 }, (_, i) => 40 + i)]);
      const T = rows.length;
      // row 0: keys 0..299 in 19 blocks (shuffled), row 1: keys 0..59 in 4; slots of this step's tokens
      const perm = Array.from({ length: nb }, (_, i) => i).sort(() => rr() - 0.5);
      const table = new Int32Array([...perm.slice(0, 19), ...perm.slice(19, 23), ...Array(15).fill(-1)]);
      const slots = Int32Array.from(rows, (r, t) => table[r * 19 + Math.floor(pos[t]! / bs)]! * bs + (pos[t]! % bs));
      const kp = randomF32(rr, nb * bs * kvh * d), vp = randomF32(rr, nb * bs * kvh * d);
      const k = randomF32(rr, T * kvh * d), v = randomF32(rr, T * kvh * d), qq = randomF32(rr, T * h * d, 2);
      const round = (x: Float32Array) => decodeHalf(encodeHalf(x, 'bf16'), 'bf16');
      // the pools before the step (bf16 values, so the f32 reference holds them exactly) and after it
      const [kp16, vp16] = [round(kp), round(vp)];
      const [kAfter, vAfter] = [Float32Array.from(kp16), Float32Array.from(vp16)];
      slots.forEach((slot, t) => {
        kAfter.set(round(k.subarray(t * kvh * d, (t + 1) * kvh * d)), slot * kvh * d);
        vAfter.set(round(v.subarray(t * kvh * d, (t + 1) * kvh * d)), slot * kvh * d);
      });
      const layoutOf = (b: Backend): StepLayout => ({
        tokenRow: b.upload(rows, [T]), tokenPos: b.upload(pos, [T]), slots: b.upload(slots, [T]),
        blockTables: b.upload(table, [2, 19]), blockSize: bs,
      });
      const params = [{ scale: 0.125, window: 0, softcap: 0 }, { scale: 0.3, window: 25, softcap: 5 }];
      await forEachIsa(async () => {
        const kv = { k: cpu.zeros([nb, bs, kvh, d], 'bf16'), v: cpu.zeros([nb, bs, kvh, d], 'bf16') };
        cpu.writeBlocks(kv.k, [...Array(nb).keys()], new Uint8Array(encodeHalf(kp16, 'bf16').buffer));
        cpu.writeBlocks(kv.v, [...Array(nb).keys()], new Uint8Array(encodeHalf(vp16, 'bf16').buffer));
        const layout = layoutOf(cpu);
        cpu.writeKv(kv, cpu.upload(k, [T, kvh, d]), cpu.upload(v, [T, kvh, d]), layout);
        assert.deepEqual(await cpu.read(kv.k), kAfter, 'keys rounded to bf16 (nearest even) in their slots');
        assert.deepEqual(await cpu.read(kv.v), vAfter, 'values likewise');
        const q = cpu.upload(qq, [T, h, d]);
        const refKv = { k: ref.upload(kAfter, [nb, bs, kvh, d]), v: ref.upload(vAfter, [nb, bs, kvh, d]) };
        for (const p of params) {
          const got = await cpu.read(cpu.attention(q, kv, layout, p));
          const want = await ref.read(ref.attention(ref.upload(qq, [T, h, d]), refKv, layoutOf(ref), p));
          assertClose(`bf16 pools ${JSON.stringify(p)}`, got, want, { atol: 2e-5, rtol: 1e-4 });
        }
      });
    });
  }
  it('pools of two dtypes, or f16 pools, throw naming them', () => {
    const layout: StepLayout = {
      tokenRow: cpu.upload(new Int32Array([0]), [1]), tokenPos: cpu.upload(new Int32Array([0]), [1]),
      slots: cpu.upload(new Int32Array([0]), [1]), blockTables: cpu.upload(new Int32Array([0]), [1, 1]), blockSize: 4,
    };
    const x = cpu.upload(new Float32Array(8), [1, 2, 4]);
    assert.throws(() => cpu.writeKv({ k: cpu.zeros([1, 4, 2, 4], 'bf16'), v: cpu.zeros([1, 4, 2, 4], 'f32') }, x, x, layout),
      /kv\.k bf16\[1, 4, 2, 4\] and kv\.v f32\[1, 4, 2, 4\] differ/);
    assert.throws(() => cpu.writeKv({ k: cpu.zeros([1, 4, 2, 4], 'f16'), v: cpu.zeros([1, 4, 2, 4], 'f16') }, x, x, layout),
      /kv\.k must be f32, bf16, int8 or fp8/);
  });
});

describe('attention: a long prefill chunk (blocks of up to 32 tokens, their query heads in vector lanes)', () => {
  // 70 tokens of one row after a 9-token cached prefix, then a second row's 37: blocks of 32 + 32 + 6
  // and 32 + 5 tokens at G = 3 (96 rows: 6 vectors of 16, 12 of 8), head dim 40 (vector and scalar tails)
  it('matches the reference with and without a window and softcap, every ISA', async () => {
    const [nb, bs, kvh, h, d] = [16, 8, 2, 6, 40];
    const rr = rng(21);
    const rows = new Int32Array([...Array(70).fill(0), ...Array(37).fill(1)]);
    const pos = new Int32Array([...Array.from({ length: 70 }, (_, i) => 9 + i), ...Array.from({ length: 37 }, (_, i) => i)]);
    const T = rows.length;
    // row 0: positions 0..78 in 10 scattered blocks; row 1: 0..36 in 5; -1 past them
    const table = new Int32Array([3, 0, 7, 12, 5, 9, 14, 1, 2, 4, -1, 6, 8, 10, 11, 13, -1, -1, -1, -1, -1, -1]);
    const kp = randomF32(rr, nb * bs * kvh * d), vp = randomF32(rr, nb * bs * kvh * d), qq = randomF32(rr, T * h * d);
    for (const params of [{ scale: 0.16, window: 0, softcap: 0 }, { scale: 0.3, window: 20, softcap: 4 }]) {
      await forEachIsa(() => compareBackends(`attention long prefill ${JSON.stringify(params)}`, ref, cpu, (b) => {
        const kv = { k: b.upload(kp, [nb, bs, kvh, d]), v: b.upload(vp, [nb, bs, kvh, d]) };
        const layout: StepLayout = {
          tokenRow: b.upload(rows, [T]), tokenPos: b.upload(pos, [T]), slots: b.upload(new Int32Array(T).fill(-1), [T]),
          blockTables: b.upload(table, [2, 11]), blockSize: bs,
        };
        return [b.attention(b.upload(qq, [T, h, d]), kv, layout, params)];
      }, { atol: 2e-5, rtol: 1e-4 }));
    }
  });
});

describe('attention padding (graph replays pad a batch with rows at position -1)', () => {
  it('a token at position -1 reads no key and gets zeros, beside real tokens, without an error', async () => {
    const [nb, bs, kvh, h, d] = [4, 4, 2, 4, 16];
    const rr = rng(13);
    const kp = randomF32(rr, nb * bs * kvh * d), vp = randomF32(rr, nb * bs * kvh * d), qq = randomF32(rr, 3 * h * d);
    const run = (b: Backend) => {
      const kv = { k: b.upload(kp, [nb, bs, kvh, d]), v: b.upload(vp, [nb, bs, kvh, d]) };
      const layout: StepLayout = {
        tokenRow: b.upload(new Int32Array([0, 1, 2]), [3]), tokenPos: b.upload(new Int32Array([5, -1, 2]), [3]),
        slots: b.upload(new Int32Array([-1, -1, -1]), [3]),
        blockTables: b.upload(new Int32Array([1, 3, 0, -1, -1, -1, 2, -1, -1]), [3, 3]), blockSize: bs,
      };
      return [b.attention(b.upload(qq, [3, h, d]), kv, layout, { scale: 0.25, window: 0, softcap: 0 })];
    };
    await forEachIsa(() => compareBackends('attention with a padding row', ref, cpu, run, { atol: 2e-5, rtol: 1e-4 }));
    const out = (await cpu.read(run(cpu)[0]!)) as Float32Array;
    assert.ok(out.subarray(h * d, 2 * h * d).every((x) => x === 0), 'the padding row is zeros');
  });
});

describe('mixture of experts', () => {
  it('moeRoute: softmax top-k with ties to the lower index, with and without renormalisation', async () => {
    const r = rng(10);
    const [T, E] = [5, 8];
    const logits = randomF32(r, T * E, 3);
    logits[1] = logits[5] = 4; // token 0: experts 1 and 5 tie for first
    logits[8 + 2] = logits[8 + 3] = logits[8 + 6] = -0.5; // token 1: a three-way tie
    for (const topK of [1, 2, 3, 8]) {
      for (const renorm of [false, true]) {
        await compareBackends(`moeRoute k=${topK} renorm=${renorm}`, ref, cpu, (b) => {
          const { weights, experts } = b.moeRoute(b.upload(logits, [T, E]), topK, renorm);
          return [experts, weights];
        }, { atol: 1e-6, rtol: 1e-5 });
      }
    }
  });

  for (const dtype of WDTYPES) {
    it(`moeFfn: ${dtype} experts, shared and unused experts`, async () => {
      const r = rng(12);
      const [T, D, I, E, K] = [5, 24, 20, 4, 2];
      const x = randomF32(r, T * D);
      const gate = weight(randomF32(r, E * I * D), dtype, [E, I, D]);
      const up = weight(randomF32(r, E * I * D), dtype, [E, I, D]);
      const down = weight(randomF32(r, E * D * I), dtype, [E, D, I]);
      // expert 3 unused; expert 0 used by 4 tokens
      const experts = new Int32Array([0, 1, 0, 2, 1, 0, 2, 0, 0, 1]);
      const weights = randomF32(r, T * K);
      // bf16 experts with bf16 dot products: x and the GLU's output rounded to bf16 (see below)
      const tol = dtype === 'bf16' && loadNativeLib().setIsa(-1) === ISA_AVX512_BF16 ? { atol: 0.1, rtol: 1e-2 } : GEMM;
      for (const act of ['silu', 'gelu_tanh'] as const) {
        await compareBackends(`moeFfn ${dtype} ${act}`, ref, cpu, async (b) => {
          const routing = { weights: b.upload(weights, [T, K]), experts: b.upload(experts, [T, K]) };
          return [b.moeFfn(b.upload(x, [T, D]), routing, await gate(b), await up(b), await down(b), act)];
        }, tol);
      }
    });
  }

  it('moeFfn after moeRoute, prefill-sized batch (grouped gemm path)', async () => {
    const r = rng(13);
    const [T, D, I, E, K] = [40, 32, 24, 6, 3];
    const x = randomF32(r, T * D);
    const logits = randomF32(r, T * E, 2);
    const gate = weight(randomF32(r, E * I * D), 'bf16', [E, I, D]);
    const up = weight(randomF32(r, E * I * D), 'bf16', [E, I, D]);
    const down = weight(randomF32(r, E * D * I), 'bf16', [E, D, I]);
    await forEachIsa(async (isa) => {
      // with bf16 dot products (bf16 experts, any number of rows) x and the GLU's output are rounded to bf16 (2^-9
      // relative each) before their matmuls: errors of ~2^-8 of the sums of |terms| (outputs here
      // reach ~20), so an absolute bound of that size (a wrong expert or row is off by units)
      const tol = isa === ISA_AVX512_BF16 ? { atol: 0.1, rtol: 1e-2 } : GEMM;
      await compareBackends(`moe prefill ${CPU_ISA_NAMES[isa]}`, ref, cpu, async (b) => {
        const routing = b.moeRoute(b.upload(logits, [T, E]), K, true);
        return [b.moeFfn(b.upload(x, [T, D]), routing, await gate(b), await up(b), await down(b), 'silu')];
      }, tol);
    });
  });
});

describe('shape checks', () => {
  const bad: [string, (b: Backend) => unknown, RegExp][] = [
    ['matmul K mismatch', (b) => b.matmul(b.upload(new Float32Array(6), [2, 3]), b.upload(new Float32Array(8), [2, 4])),
      /matmul: .*f32\[2, 3\].*f32\[2, 4\]/],
    ['rope odd invFreq', (b) => b.rope(b.upload(new Float32Array(8), [1, 1, 8]), b.upload(new Int32Array(1), [1]),
      b.upload(new Float32Array(5), [5]), 1), /rope: .*rotates 10 dims but headDim is 8/],
    ['add shape mismatch', (b) => b.add(b.upload(new Float32Array(4), [4]), b.upload(new Float32Array(4), [2, 2]), 1),
      /add: shapes differ/],
    ['ids must be i32', (b) => b.embedding(b.upload(new Float32Array(4), [2, 2]), b.upload(new Float32Array(1), [1]), 1),
      /embedding: ids must be i32/],
    // the checks the CPU and CUDA backends share (common/validate.ts)
    ['moeFfn down shape', (b) => b.moeFfn(b.upload(new Float32Array(8), [2, 4]),
      { weights: b.upload(new Float32Array(2), [2, 1]), experts: b.upload(new Int32Array(2), [2, 1]) },
      b.upload(new Float32Array(3 * 5 * 4), [3, 5, 4]), b.upload(new Float32Array(3 * 5 * 4), [3, 5, 4]),
      b.upload(new Float32Array(3 * 5 * 4), [3, 5, 4]), 'silu'), /moeFfn: down f32\[3, 5, 4\] must be \[3, 4, 5\]/],
    ['moeFfn routing rows', (b) => b.moeFfn(b.upload(new Float32Array(8), [2, 4]),
      { weights: b.upload(new Float32Array(3), [3, 1]), experts: b.upload(new Int32Array(3), [3, 1]) },
      b.upload(new Float32Array(3 * 5 * 4), [3, 5, 4]), b.upload(new Float32Array(3 * 5 * 4), [3, 5, 4]),
      b.upload(new Float32Array(3 * 4 * 5), [3, 4, 5]), 'silu'), /moeFfn: routing weights .* must both be \[2, topK\]/],
  ];
  for (const [name, call, msg] of bad) {
    it(`${name} throws a clear error`, async () => {
      assert.throws(() => call(cpu), msg);
    });
  }

  it('attention: a negative window or soft-cap, or a non-finite scale, throws naming the parameter', () => {
    const pool = () => cpu.upload(new Float32Array(4), [1, 1, 1, 4]);
    const kv = { k: pool(), v: pool() };
    const one = () => cpu.upload(new Int32Array(1), [1]);
    const layout = { tokenRow: one(), tokenPos: one(), slots: one(), blockTables: cpu.upload(new Int32Array(1), [1, 1]), blockSize: 1 };
    const q = cpu.upload(new Float32Array(4), [1, 1, 4]);
    assert.throws(() => cpu.attention(q, kv, layout, { scale: 1, window: -1, softcap: 0 }), /attention: params\.window must be an integer >= 0, got -1/);
    assert.throws(() => cpu.attention(q, kv, layout, { scale: 1, window: 0, softcap: -2 }), /params\.softcap must be >= 0, got -2/);
    assert.throws(() => cpu.attention(q, kv, layout, { scale: NaN, window: 0, softcap: 0 }), /params\.scale must be a finite number, got NaN/);
  });

  it('loadWeightRows: a row range outside the weight, or a scalar, rejects with its name', async () => {
    const src = { path: '/nonexistent', offset: 0, dtype: 'f32' as const, shape: [4, 2], name: 'w.weight' };
    await assert.rejects(cpu.loadWeightRows(src, 3, 2, 'keep'), /loadWeightRows: rows \[3, 5\) outside \[0, 4\) of w\.weight/);
    await assert.rejects(cpu.loadWeightRows(src, -1, 1, 'keep'), /outside \[0, 4\)/);
    await assert.rejects(cpu.loadWeightRows({ ...src, shape: [] }, 0, 1, 'keep'), /w\.weight is a scalar/);
  });

  it('zeros of every dtype reads back as zeros', async () => {
    for (const dt of ['f32', 'f16', 'bf16', 'i32'] as DType[]) {
      const z = cpu.zeros([3, 5], dt);
      assert.deepEqual([...(await cpu.read(z))], new Array(15).fill(0));
      cpu.free(z);
    }
  });
});
