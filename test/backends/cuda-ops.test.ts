// Every CUDA backend op against the reference backend on random (never zero) inputs, odd shapes and
// each weight dtype: the CUDA twin of cpu-ops.test.ts. Without a usable CUDA (no libcuda, cuInit
// fails, no device: CI and most machines) every test is skipped with the reason.
//
// Inputs: activations are rounded to bf16 first and reach the CUDA ops as bf16 tensors (the dtype
// model graphs feed them), and the reference gets the same rounded values, so the comparison sees
// only the backend's own error. Outputs are bf16 (rounding to nearest: relative error <= 2^-9).
// Tolerances (|cuda - ref| <= atol + rtol * |ref|):
//   elementwise (add, scale, embedding, gatherRows, writeKv):      atol 1e-6, rtol 4e-3
//   rmsnorm, glu, softcap (f32 math, then bf16):                    atol 1e-5, rtol 4e-3
//   rope (cos/sin of f32 angles up to 65535 rad, then bf16):        atol 1e-4, rtol 8e-3
//   matmul, moeFfn (f32 accumulation over K <= 300, then bf16):      atol 2e-3, rtol 8e-3
//   attention, generic kernel (f32 online softmax, then bf16):      atol 5e-4, rtol 8e-3
//   attention, bf16 fast paths (also P rounded to bf16 before P.V):  atol 4e-3, rtol 1e-2
//   moeRoute weights (f32 softmax, f32 output):                     atol 1e-6, rtol 1e-5; experts exact
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import type { Activation, Backend, MoeRouting, StepLayout, Tensor } from '../../src/contracts/backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import type { CudaMoeSettings, CudaSettingsOverrides } from '../../src/backends/cuda/cuda-settings.ts';
import { parseGemvPicks } from '../../src/backends/cuda/gemm-tuning.ts';
import { GEMV_KERNEL_NAMES, GEMVP_KERNEL_NAMES, gemvCandidates } from '../../src/backends/cuda/gemv-kernels.ts';
import { assertClose, randomF32, rng, scatteredBlockTables, type Tolerance, WeightDir, withCudaBackend } from './helpers.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-ops: skipping every test: ${SKIP}`);

const WDTYPES = ['f32', 'f16', 'bf16'] as const;
const ELEM: Tolerance = { atol: 1e-6, rtol: 4e-3 };
const MATHS: Tolerance = { atol: 1e-5, rtol: 4e-3 };
const ROPE: Tolerance = { atol: 1e-4, rtol: 8e-3 };
const GEMM: Tolerance = { atol: 2e-3, rtol: 8e-3 };
const ATTN: Tolerance = { atol: 5e-4, rtol: 8e-3 };
/**
 * bf16 KV on the fast kernels (attention.ts): the output is rounded to bf16 (<= 2^-9 relative) and
 * the prefill kernel rounds the softmax weights P to bf16 for the tensor-core P.V (<= 2^-9 * max|v|
 * absolute, |v| <= 1 here). A warp-level CPU simulation of the kernels on these inputs peaked at
 * 2.9e-3 absolute (0.46 of atol 2.5e-3 + rtol 8e-3).
 */
const ATTN_BF16: Tolerance = { atol: 4e-3, rtol: 1e-2 };
const EXACT: Tolerance = { atol: 0, rtol: 0 };

let ref: ReferenceBackend;
let cuda: CudaBackend;
/** a second backend forced onto the plain GEMM kernel (cross-checks cuBLASLt) */
let cudaSimple: CudaBackend;
let files: WeightDir;

before(async () => {
  if (SKIP) return;
  ref = new ReferenceBackend();
  cuda = await createCudaBackend();
  cudaSimple = await createCudaBackend({ settings: { gemm: { engine: 'simple' } } });
  files = new WeightDir();
  console.log(`# ${cuda.describe()}`);
});
after(async () => {
  if (SKIP) return;
  console.log(`# launches ${cuda.launches}, gemm fallbacks ${cuda.gemmFallbacks}, memory ${JSON.stringify(cuda.memoryStats())}`);
  await cuda.close();
  await cudaSimple.close();
  files.cleanup();
});

/**
 * Runs `f` with `cuda` (compare's default backend) a backend created with `settings`, the kernels a
 * test compares; the shared one again after.
 */
async function withSettings(settings: CudaSettingsOverrides, f: () => Promise<void>): Promise<void> {
  const main = cuda;
  try {
    await withCudaBackend(settings, (b) => {
      cuda = b;
      return f();
    });
  } finally {
    cuda = main;
  }
}

/** x rounded to bf16 (what a bf16 activation holds). */
function bf(x: Float32Array): Float32Array {
  return decodeHalf(encodeHalf(x, 'bf16'), 'bf16');
}

/** An activation on b: bf16-rounded data; a bf16 tensor on CUDA, f32 on the reference. */
function act(b: Backend, data: Float32Array, shape: number[]): Tensor {
  const t = b.upload(bf(data), shape);
  return b.name === 'cuda' ? b.scale(t, 1) : t; // scale by 1 is exact: the bf16 copy of the data
}

/** A weight of `dtype` on backend b: loaded from a file (the only way to get f16/bf16). */
function weight(values: Float32Array, dtype: 'f32' | 'f16' | 'bf16', shape: number[]) {
  const src = files.write(values, dtype, shape);
  return (b: Backend) => b.loadWeight(src, 'keep');
}

/** Runs `graph` on the reference and on `on` (default: cuda) and compares every returned tensor. */
async function compare(label: string, graph: (b: Backend) => Promise<Tensor[]> | Tensor[], tol: Tolerance,
  on: Backend = cuda): Promise<void> {
  const want = await graph(ref);
  const got = await graph(on);
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) {
    assert.deepEqual([...got[i]!.shape], [...want[i]!.shape], `${label}: output ${i} shape`);
    assert.equal(got[i]!.dtype === 'i32', want[i]!.dtype === 'i32', `${label}: output ${i} integer-ness`);
    assertClose(`${label} (output ${i})`, await on.read(got[i]!), await ref.read(want[i]!), tol);
  }
}

describe('runtime', { skip: SKIP }, () => {
  it('reports the device, compiles kernels for its architecture and caches the cubin on disk', () => {
    assert.match(cuda.info.arch, /^sm_\d+$/);
    assert.ok(existsSync(cuda.info.kernelCachePath), `no cubin at ${cuda.info.kernelCachePath}`);
    assert.equal(cuda.activationDtype, 'bf16');
  });

  it('uses cuBLASLt for GEMMs', () => {
    assert.match(cuda.info.gemm, /^cublaslt/, cuda.info.gemm);
  });

  it('upload/read round-trips f32 and i32 exactly; zeros of every dtype read as zeros', async () => {
    const x = randomF32(rng(1), 1001, 1e6);
    const xi = Int32Array.from({ length: 777 }, (_, i) => i * 7919 - 3_000_000);
    assert.deepEqual([...(await cuda.read(cuda.upload(x, [7, 11, 13])))], [...x]);
    assert.deepEqual([...(await cuda.read(cuda.upload(xi, [777])))], [...xi]);
    for (const dt of ['f32', 'f16', 'bf16', 'i32'] as const) {
      const z = cuda.zeros([3, 5], dt);
      assert.deepEqual([...(await cuda.read(z))], new Array(15).fill(0));
      cuda.free(z);
    }
    assert.deepEqual([...(await cuda.read(cuda.upload(new Float32Array(0), [0, 4])))], []);
  });

  it('loads weights (keep, f32 conversion, rows, stacked, multi-chunk) exactly', async () => {
    const r = rng(2);
    for (const dtype of WDTYPES) {
      const v = bf(randomF32(r, 37 * 21, 3)); // bf16-exact values are exact in every dtype
      const src = files.write(v, dtype, [37, 21]);
      const keep = await cuda.loadWeight(src, 'keep');
      assert.equal(keep.dtype, dtype);
      assert.deepEqual([...(await cuda.read(keep))], [...v]);
      const asF32 = await cuda.loadWeight(src, 'f32');
      assert.equal(asF32.dtype, 'f32');
      assert.deepEqual([...(await cuda.read(asF32))], [...v]);
      const rows = await cuda.loadWeightRows(src, 5, 9, 'keep');
      assert.deepEqual([...rows.shape], [9, 21]);
      assert.deepEqual([...(await cuda.read(rows))], [...v.subarray(5 * 21, 14 * 21)]);
      const b = bf(randomF32(r, 37 * 21));
      const stacked = await cuda.loadStacked([src, files.write(b, dtype, [37, 21])], 'f32');
      assert.deepEqual([...stacked.shape], [2, 37, 21]);
      assert.deepEqual([...(await cuda.read(stacked))], [...v, ...b]);
      for (const t of [keep, asF32, rows, stacked]) cuda.free(t);
    }
    // 40 MiB of f32: three pinned staging chunks in flight
    const big = randomF32(r, 10 * 1024 * 1024);
    const t = await cuda.loadWeight(files.write(big, 'f32', [10, 1024 * 1024]), 'keep');
    const back = await cuda.read(t);
    let same = back.length === big.length;
    for (let i = 0; same && i < big.length; i++) same = back[i] === big[i];
    assert.ok(same, 'multi-chunk weight load differs');
    cuda.free(t);
    const short = { ...files.write(randomF32(r, 10), 'f32', [10]), shape: [1000] };
    await assert.rejects(cuda.loadWeight(short, 'keep'), /file ends before the tensor does/);
  });

  it('scopes free intermediates; kept tensors survive; memory returns to the pool', async () => {
    const before = cuda.memoryStats().liveBlocks;
    cuda.beginScope();
    const x = cuda.upload(randomF32(rng(3), 64), [8, 8]);
    const y = cuda.scale(x, 2);
    const z = cuda.add(y, x, 1);
    cuda.endScope([z]);
    assert.equal(cuda.memoryStats().liveBlocks, before + 1);
    assert.ok(x instanceof Object && (x as { freed?: boolean }).freed);
    const got = await cuda.read(z);
    assert.equal(got.length, 64);
    cuda.free(z);
    assert.equal(cuda.memoryStats().liveBlocks, before);
    assert.throws(() => cuda.scale(z, 1), /already freed/);
  });

  it('readBlocks / writeBlocks move KV pool blocks as raw bytes, in stream order', async () => {
    const per = 4 * 2 * 8;
    const vals = bf(randomF32(rng(5), 6 * per));
    const p = act(cuda, vals, [6, 4, 2, 8]); // a bf16 pool
    /** the bf16 bytes of those blocks */
    const want = (blocks: number[]) => [...new Uint8Array(encodeHalf(
      Float32Array.from(blocks.flatMap((b) => [...vals.subarray(b * per, (b + 1) * per)])), 'bf16').buffer)];
    const got = await cuda.readBlocks!(p, [4, 1, 4]);
    assert.deepEqual([...got], want([4, 1, 4]));
    cuda.writeBlocks!(p, [0, 5, 2], got);
    got.fill(0); // staged: changing data after the call changes nothing
    assert.deepEqual([...(await cuda.readBlocks!(p, [0, 5, 2, 3]))], want([4, 1, 4, 3]));
    assert.throws(() => cuda.writeBlocks!(p, [6], new Uint8Array(per * 2)), /block 6 outside \[0, 6\)/);
  });

  it('kernel index errors reject read/sync with the op named, and the backend stays usable', async () => {
    const table = cuda.upload(randomF32(rng(4), 10 * 4), [10, 4]);
    const bad = cuda.embedding(table, cuda.upload(new Int32Array([1, 12]), [2]), 1);
    await assert.rejects(cuda.read(bad), /embedding: token id 12 \(token 1\) is outside the table \[0, 10\)/);
    await cuda.sync();
    const ok = cuda.embedding(table, cuda.upload(new Int32Array([9]), [1]), 1);
    assert.equal((await cuda.read(ok)).length, 4);
  });
});

describe('matmul', { skip: SKIP }, () => {
  const shapes: [number, number, number][] = [
    [1, 129, 67], [2, 7, 16], [4, 33, 96], [5, 129, 67], [8, 17, 3], [9, 33, 64], [37, 129, 67], [70, 100, 300],
    [33, 1, 5], [16, 40, 100], [17, 40, 100], [64, 256, 128], [3, 1000, 64],
  ];
  for (const dtype of WDTYPES) {
    it(`${dtype} weights, cuBLASLt and the plain kernel, with and without bias (f32 and bf16)`, async () => {
      const r = rng(11);
      for (const [M, N, K] of shapes) {
        const x = randomF32(r, M * K);
        const w = weight(randomF32(r, N * K), dtype, [N, K]);
        const bias = randomF32(r, N);
        for (const on of [cuda, cudaSimple]) {
          await compare(`matmul M=${M} N=${N} K=${K} ${dtype} ${on.info.gemm.split(' ')[0]}`, async (b) => {
            const xt = act(b, x, [M, K]);
            const wt = await w(b);
            const bt = b.upload(bias, [N]);
            return [b.matmul(xt, wt), b.matmul(xt, wt, bt), b.matmul(b.upload(bf(x), [M, K]), wt, bt)];
          }, GEMM, on);
        }
      }
    });
  }

  it('each GEMV kernel (bf16 decode shapes, forced through CudaGemvSettings.mode, $LLMTS_CUDA_GEMV) matches the reference', async () => {
    const r = rng(12);
    // K: one pass, a ragged tail, 2-8 warps per row (4104, 20488) and more than one pass (40968)
    // N 5000 / 3000: more row groups than a persistent grid holds, so its blocks loop
    const shapes: [number, number, number][] = [[1, 13, 8], [1, 300, 4104], [1, 37, 20488], [1, 11, 40968], [2, 129, 1032],
      [2, 20, 16392], [3, 70, 4096], [4, 9, 264], [5, 33, 2056], [8, 130, 520], [8, 17, 9224], [1, 5000, 4096],
      [2, 3000, 1032], [7, 3000, 264]];
    for (const name of [...GEMV_KERNEL_NAMES, ...GEMVP_KERNEL_NAMES]) {
      await withCudaBackend({ gemv: { mode: name } }, async (on) => {
        let ran = 0;
        for (const [M, N, K] of shapes) {
          if (!gemvCandidates(M, K).some((c) => c.kernel === name)) continue;
          ran++;
          const x = randomF32(r, M * K);
          const w = randomF32(r, N * K);
          await compare(`gemv ${name} M=${M} N=${N} K=${K}`, async (b) => [b.matmul(act(b, x, [M, K]), act(b, w, [N, K]))], GEMM, on);
        }
        assert.ok(ran > 0, `no shape exercised ${name}`);
      });
    }
  });

  it('$LLMTS_CUDA_GEMV_PICKS: listed shapes run their pick untimed and exact; a pick its shape has no launch for is refused', async () => {
    const r = rng(14);
    const picks = parseGemvPicks('1x300x4104=k_gemv_m1_u16/w4,1x37x20488=cublaslt,1x13x8=k_gemv_m1_u8/w16');
    await withCudaBackend({ gemv: { picks } }, async (on) => {
      for (const [N, K] of [[300, 4104], [37, 20488]] as const) {
        const x = randomF32(r, K), w = randomF32(r, N * K);
        await compare(`picked 1x${N}x${K}`, async (b) => [b.matmul(act(b, x, [1, K]), act(b, w, [N, K]))], GEMM, on);
      }
      assert.deepEqual(on.gemmTuning.filter((t) => t.shape === '1x300x4104' || t.shape === '1x37x20488'), [], 'picked shapes are not timed');
      assert.throws(() => on.matmul(act(on, randomF32(r, 8), [1, 8]), act(on, randomF32(r, 13 * 8), [13, 8])),
        /k_gemv_m1_u8\/w16 is not a launch for 1x13x8/);
    });
  });

  it('GEMM shapes of one tuning class share one timing; the others adopt its winner and stay exact', async () => {
    const r = rng(13);
    const N = 96, K = 136; // a shape no other test uses
    const w = randomF32(r, N * K);
    const tunedHere = () => cuda.gemmTuning.filter((t) => t.shape.endsWith(`x${N}x${K}`)).map((t) => t.shape);
    // 20 times class 32; 17, 25, 31 and 32 adopt it (the first while its timing may still run);
    // 3 is its own class; 100 rows is above the tuned range
    for (const M of [20, 17, 25, 31, 32, 3, 100]) {
      const x = randomF32(r, M * K);
      await compare(`tuning class M=${M} N=${N} K=${K}`, async (b) => [b.matmul(act(b, x, [M, K]), act(b, w, [N, K]))], GEMM);
    }
    assert.deepEqual(tunedHere().sort(), [`20x${N}x${K}`, `3x${N}x${K}`].sort());
  });

  it('bf16 products of long sums at a few rows are the f32 sum rounded once (split-K slices add up in f32)', async () => {
    // N 300, K 1040 at 8-64 rows: shapes where cuBLASLt's heuristic takes split-K on the H200; adding
    // the slices in bf16 put some outputs many bf16 units off
    const r = rng(17);
    const N = 300, K = 1040;
    const w = bf(randomF32(r, N * K, 4));
    const wt = await weight(w, 'bf16', [N, K])(cuda);
    for (const M of [8, 9, 17, 64]) {
      const x = bf(randomF32(r, M * K));
      // twice: the heuristic's first algorithm, then the tuned one
      for (const pass of [1, 2]) {
        cuda.beginScope();
        let y: Float32Array;
        try {
          y = (await cuda.read(cuda.matmul(act(cuda, x, [M, K]), wt))) as Float32Array;
        } finally {
          cuda.endScope();
        }
        for (let m = 0; m < M; m++) {
          for (let n = 0; n < N; n++) {
            let s = 0, a = 0;
            for (let k = 0; k < K; k++) {
              const p = x[m * K + k]! * w[n * K + k]!;
              s += p;
              a += Math.abs(p);
            }
            const got = y[m * N + n]!, big = Math.max(Math.abs(got), Math.abs(s));
            const halfUlp = big === 0 ? 0 : 2 ** (Math.floor(Math.log2(big)) - 8);
            assert.ok(Math.abs(got - s) <= halfUlp + 1e-6 * a, `M ${M} pass ${pass}: y[${m}, ${n}] ${got} vs ${s}`);
          }
        }
      }
    }
    cuda.free(wt);
  });

  it('handles M = 0 and K = 0 (empty sum = bias)', async () => {
    const y0 = cuda.matmul(cuda.upload(new Float32Array(0), [0, 8]), cuda.upload(randomF32(rng(1), 24), [3, 8]));
    const yk = cuda.matmul(cuda.upload(new Float32Array(0), [2, 0]), cuda.upload(new Float32Array(0), [3, 0]),
      cuda.upload(new Float32Array([1, 2, 3]), [3]));
    assert.deepEqual([...y0.shape], [0, 3]);
    assert.deepEqual([...(await cuda.read(y0))], []);
    assert.deepEqual([...(await cuda.read(yk))], [1, 2, 3, 1, 2, 3]);
  });
});

describe('elementwise and row ops', { skip: SKIP }, () => {
  it('embedding: every table dtype, repeated ids, scale', async () => {
    const r = rng(2);
    for (const dtype of WDTYPES) {
      const table = weight(bf(randomF32(r, 50 * 67)), dtype, [50, 67]);
      const ids = new Int32Array([3, 49, 0, 3, 17]);
      await compare(`embedding ${dtype}`, async (b) => [
        b.embedding(await table(b), b.upload(ids, [5]), 1),
        b.embedding(await table(b), b.upload(ids, [5]), 1.7),
      ], ELEM);
    }
  });

  it('rmsnorm: weightOffset 0 and 1, 2-D and 3-D, bf16 and f32 inputs', async () => {
    const r = rng(3);
    for (const shape of [[5, 67], [2, 3, 24], [1, 4096], [3, 1000]]) {
      const D = shape[shape.length - 1]!;
      const n = shape.reduce((a, b) => a * b, 1);
      const x = randomF32(r, n, 3);
      const w = randomF32(r, D);
      await compare(`rmsnorm [${shape}]`, (b) => [
        b.rmsnorm(act(b, x, shape), b.upload(w, [D]), 1e-6, 0),
        b.rmsnorm(act(b, x, shape), b.upload(w, [D]), 1e-5, 1),
        b.rmsnorm(b.upload(bf(x), shape), b.upload(w, [D]), 1e-6, 0),
      ], MATHS);
    }
  });

  it('add (bScale 1, -0.5, mixed dtypes), scale, softcap', async () => {
    const r = rng(4);
    const a = randomF32(r, 5 * 67, 40);
    const c = randomF32(r, 5 * 67, 40);
    await compare('add/scale', (b) => {
      const at = act(b, a, [5, 67]);
      const ct = act(b, c, [5, 67]);
      return [b.add(at, ct, 1), b.add(at, ct, -0.5), b.add(at, b.upload(bf(c), [5, 67]), 2), b.scale(at, 0.125),
        b.scale(at, -3.3)];
    }, ELEM);
    await compare('softcap', (b) => [b.softcap(act(b, a, [5, 67]), 30), b.softcap(act(b, a, [335]), 7.5)], MATHS);
  });

  it('glu: silu, gelu_tanh, gelu', async () => {
    const r = rng(5);
    const g = randomF32(r, 3 * 129, 6);
    const u = randomF32(r, 3 * 129, 2);
    for (const a of ['silu', 'gelu_tanh', 'gelu'] as const) {
      await compare(`glu ${a}`, (b) => [b.glu(act(b, g, [3, 129]), act(b, u, [3, 129]), a)], MATHS);
    }
  });

  it('rope: partial rotary dims, scattered positions, attentionScaling, per-token tables', async () => {
    const r = rng(6);
    const [T, H, D, rot] = [5, 3, 24, 12];
    const x = randomF32(r, T * H * D, 2);
    const pos = new Int32Array([0, 7, 3, 1000, 65535]);
    const inv = Float32Array.from({ length: rot / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / rot));
    for (const scaling of [1, 0.8]) {
      await compare(`rope scaling ${scaling}`, (b) =>
        [b.rope(act(b, x, [T, H, D]), b.upload(pos, [T]), b.upload(inv, [rot / 2]), scaling)], ROPE);
    }
    const invFull = Float32Array.from({ length: D / 2 }, (_, i) => 1 / 500000 ** ((2 * i) / D));
    await compare('rope full', (b) =>
      [b.rope(act(b, x, [T, H, D]), b.upload(pos, [T]), b.upload(invFull, [D / 2]), 1)], ROPE);
    const perToken = randomF32(r, T * (rot / 2), 1).map((v) => Math.abs(v) + 1e-3);
    await compare('rope per-token tables', (b) =>
      [b.rope(act(b, x, [T, H, D]), b.upload(pos, [T]), b.upload(perToken, [T, rot / 2]), 0.9)], ROPE);
    // a real head size: 128 dims, 8 heads, 33 tokens
    const [T2, H2, D2] = [33, 8, 128];
    const x2 = randomF32(r, T2 * H2 * D2, 2);
    const pos2 = Int32Array.from({ length: T2 }, (_, i) => i * 37);
    const inv2 = Float32Array.from({ length: D2 / 2 }, (_, i) => 1 / 1e6 ** ((2 * i) / D2));
    await compare('rope 128', (b) =>
      [b.rope(act(b, x2, [T2, H2, D2]), b.upload(pos2, [T2]), b.upload(inv2, [D2 / 2]), 1)], ROPE);
  });

  it('gatherRows: repeated and out-of-order rows, bf16, f32 and i32', async () => {
    const r = rng(7);
    const x = randomF32(r, 7 * 13);
    const xi = Int32Array.from({ length: 7 * 13 }, (_, i) => i * 3 - 50);
    const idx = new Int32Array([6, 0, 6, 2]);
    await compare('gatherRows', (b) => [b.gatherRows(act(b, x, [7, 13]), b.upload(idx, [4])),
      b.gatherRows(b.upload(bf(x), [7, 13]), b.upload(idx, [4]))], ELEM);
    const got = await cuda.read(cuda.gatherRows(cuda.upload(xi, [7, 13]), cuda.upload(idx, [4])));
    const want = [...idx].flatMap((i) => [...xi.subarray(i * 13, i * 13 + 13)]);
    assert.deepEqual([...got], want);
  });

  it('copyTensor: a device copy into an existing tensor (a row view too), in stream order', async () => {
    const src = Int32Array.from({ length: 12 }, (_, i) => i * 7 - 3);
    const t = cuda.zeros([20], 'i32');
    const s = cuda.upload(src, [12]);
    cuda.copyTensor(cuda.rowView(t, 5, 12), s);
    cuda.copyTensor(s, cuda.upload(new Int32Array(12), [12])); // ordered after the copy above
    assert.deepEqual([...await cuda.read(t)], [0, 0, 0, 0, 0, ...src, 0, 0, 0]);
    assert.throws(() => cuda.copyTensor(t, cuda.upload(new Int32Array(11), [11])), /copyTensor/);
    cuda.free(t);
  });
});

describe('paged KV: writeKv and attention', { skip: SKIP }, () => {
  // 12 blocks of 4 slots, 2 KV heads, 6 query heads (GQA groups of 3), headDim 24.
  const [NB, BS, KVH, H, D] = [12, 4, 2, 6, 24];
  const MBR = 5;
  const tables = new Int32Array([
    5, 2, 9, 11, -1, // row 0
    0, 7, -1, -1, -1, // row 1
    3, -1, -1, -1, -1, // row 2
  ]);
  // row 0 prefills 9..13 after a cached prefix, row 1 decodes at 6, row 2 prefills 0..2; the last
  // token is padding (slot -1: skipped, but it still attends as row 2 at position 2)
  const tokenRow = new Int32Array([0, 0, 0, 0, 0, 1, 2, 2, 2, 2]);
  const tokenPos = new Int32Array([9, 10, 11, 12, 13, 6, 0, 1, 2, 2]);
  const T = tokenRow.length;
  const slots = Int32Array.from(tokenRow, (row, t) => {
    if (t === T - 1) return -1;
    const p = tokenPos[t]!;
    return tables[row * MBR + Math.floor(p / BS)]! * BS + (p % BS);
  });
  const r = rng(8);
  const kPool0 = randomF32(r, NB * BS * KVH * D);
  const vPool0 = randomF32(r, NB * BS * KVH * D);
  const k = randomF32(r, T * KVH * D);
  const v = randomF32(r, T * KVH * D);
  const q = randomF32(r, T * H * D, 2);

  const step = (b: Backend, params: { scale: number; window: number; softcap: number }, f32Pools = false): Tensor[] => {
    const pool = (data: Float32Array) => f32Pools ? b.upload(bf(data), [NB, BS, KVH, D]) : act(b, data, [NB, BS, KVH, D]);
    const kv = { k: pool(kPool0), v: pool(vPool0) };
    const layout: StepLayout = {
      tokenRow: b.upload(tokenRow, [T]), tokenPos: b.upload(tokenPos, [T]), slots: b.upload(slots, [T]),
      blockTables: b.upload(tables, [3, MBR]), blockSize: BS,
    };
    b.writeKv(kv, act(b, k, [T, KVH, D]), act(b, v, [T, KVH, D]), layout);
    return [b.attention(act(b, q, [T, H, D]), kv, layout, params), kv.k, kv.v];
  };

  for (const params of [
    { scale: 1 / Math.sqrt(D), window: 0, softcap: 0 },
    { scale: 1 / Math.sqrt(D), window: 3, softcap: 0 },
    { scale: 0.35, window: 0, softcap: 5 },
    { scale: 0.2, window: 1, softcap: 50 },
  ]) {
    it(`window ${params.window}, softcap ${params.softcap}, bf16 and f32 pools`, async () => {
      await compare(`attention ${JSON.stringify(params)}`, (b) => step(b, params), ATTN);
      await compare(`attention f32 pools ${JSON.stringify(params)}`, (b) => step(b, params, true), ATTN);
    });
  }

  it('MQA (one KV head), long context across many blocks (> one 128-key chunk), head dims 64..256', async () => {
    for (const d of [64, 128, 256]) {
      const [nb, bs, kvh, h] = [40, 16, 1, 4];
      const rr = rng(9 + d);
      const perm = Array.from({ length: nb }, (_, i) => i).sort(() => rr() - 0.5);
      const tab = new Int32Array(perm.slice(0, 38));
      const pos = new Int32Array([599, 600, 17, 129, 127]);
      const rows = new Int32Array([0, 0, 0, 0, 0]);
      const kp = randomF32(rr, nb * bs * kvh * d);
      const vp = randomF32(rr, nb * bs * kvh * d);
      const qq = randomF32(rr, 5 * h * d);
      await compare(`attention MQA long d=${d}`, (b) => {
        const kv = { k: act(b, kp, [nb, bs, kvh, d]), v: act(b, vp, [nb, bs, kvh, d]) };
        const layout: StepLayout = {
          tokenRow: b.upload(rows, [5]), tokenPos: b.upload(pos, [5]), slots: b.upload(new Int32Array(5).fill(-1), [5]),
          blockTables: b.upload(tab, [1, 38]), blockSize: bs,
        };
        return [b.attention(act(b, qq, [5, h, d]), kv, layout, { scale: 0.125, window: 0, softcap: 0 }),
          b.attention(act(b, qq, [5, h, d]), kv, layout, { scale: 0.125, window: 100, softcap: 0 })];
      }, ATTN_BF16); // 5 tokens of one row: the tensor-core prefill kernel
    }
  });

  it('a position without a block rejects with the row and position', async () => {
    const b = cuda;
    const kv = { k: b.zeros([NB, BS, KVH, D], 'bf16'), v: b.zeros([NB, BS, KVH, D], 'bf16') };
    const layout: StepLayout = {
      tokenRow: b.upload(new Int32Array([1]), [1]), tokenPos: b.upload(new Int32Array([9]), [1]),
      slots: b.upload(new Int32Array([-1]), [1]), blockTables: b.upload(tables, [3, MBR]), blockSize: BS,
    };
    const y = b.attention(b.upload(randomF32(rng(1), H * D), [1, H, D]), kv, layout, { scale: 1, window: 0, softcap: 0 });
    await assert.rejects(b.read(y), /attention: row 1 holds no block for position (8|9)/);
  });
});

describe('mixture of experts', { skip: SKIP }, () => {
  it('moeRoute: softmax top-k with ties to the lower index, with and without renormalisation', async () => {
    const r = rng(10);
    // 8 experts (a lane each in k_moe_route's warp), Qwen3-30B-A3B's 128, 60 (a partial last pass)
    for (const [T, E, topKs] of [[5, 8, [1, 2, 3, 8]], [3, 128, [8]], [6, 60, [4, 60]]] as const) {
      const logits = bf(randomF32(r, T * E, 3));
      logits[1] = logits[5] = 4; // token 0: experts 1 and 5 tie for first
      logits[E + 2] = logits[E + 3] = logits[E + 6] = -0.5; // token 1: a three-way tie
      for (const topK of topKs) {
        for (const renorm of [false, true]) {
          await compare(`moeRoute E=${E} k=${topK} renorm=${renorm}`, (b) => {
            const { weights, experts } = b.moeRoute(act(b, logits, [T, E]), topK, renorm);
            return [experts, weights];
          }, { atol: 1e-6, rtol: 1e-5 });
        }
      }
      // experts are exact
      const e = cuda.moeRoute(cuda.upload(logits, [T, E]), 3, true).experts;
      const want = ref.moeRoute(ref.upload(logits, [T, E]), 3, true).experts;
      assertClose(`moeRoute E=${E} experts`, await cuda.read(e), await ref.read(want), EXACT);
    }
  });

  /** Runs `f` on a backend with the MoE FFN kernels `kind` (CudaMoeSettings.kernels) and the other MoE knobs `moe`. */
  const withMoeKernels = (kind: CudaMoeSettings['kernels'], f: () => Promise<void>, moe: Partial<CudaMoeSettings> = {}) =>
    withSettings({ moe: { ...moe, kernels: kind } }, f);

  /** Random expert weights (values times `scale`): gate and up [E, I, D], down [E, D, I]. */
  function expertWeights(r: () => number, [E, I, D]: [number, number, number], dtype: 'f32' | 'f16' | 'bf16', scale = 1) {
    const gate = weight(randomF32(r, E * I * D, scale), dtype, [E, I, D]);
    const up = weight(randomF32(r, E * I * D, scale), dtype, [E, I, D]);
    const down = weight(randomF32(r, E * D * I, scale), dtype, [E, D, I]);
    return async (b: Backend, x: Tensor, routing: MoeRouting, a: Activation): Promise<Tensor[]> =>
      [b.moeFfn(x, routing, await gate(b), await up(b), await down(b), a)];
  }

  /** routing weights and experts [T, K] uploaded to b */
  const upRouting = (b: Backend, weights: Float32Array, experts: Int32Array, T: number, K: number): MoeRouting =>
    ({ weights: b.upload(weights, [T, K]), experts: b.upload(experts, [T, K]) });

  // 'vec' runs k_moe_hidden_v / k_moe_down_v where they apply (bf16 weights, D and I multiples of 8:
  // I 16 and 768, and the prefill case below), the generic kernels elsewhere
  for (const kind of ['scalar', 'vec'] as const) {
    for (const dtype of WDTYPES) {
      it(`moeFfn (${kind} kernels): ${dtype} experts, shared and unused experts`, () => withMoeKernels(kind, async () => {
        for (const I of [20, 16]) {
          const r = rng(12);
          const [T, D, E, K] = [5, 24, 4, 2];
          const x = randomF32(r, T * D);
          const ffn = expertWeights(r, [E, I, D], dtype);
          // expert 3 unused; expert 0 used by 4 tokens
          const experts = new Int32Array([0, 1, 0, 2, 1, 0, 2, 0, 0, 1]);
          const weights = randomF32(r, T * K);
          for (const a of ['silu', 'gelu_tanh'] as const) {
            await compare(`moeFfn ${kind} ${dtype} I=${I} ${a}`,
              (b) => ffn(b, act(b, x, [T, D]), upRouting(b, weights, experts, T, K), a), GEMM);
          }
        }
      }));
    }

    it(`moeFfn (${kind} kernels): Qwen3-30B-A3B-sized experts (D 2048, I 768, 8 of 16), 3 tokens`, () => withMoeKernels(kind, async () => {
      const r = rng(14);
      const [T, D, I, E, K] = [3, 2048, 768, 16, 8];
      const x = randomF32(r, T * D);
      // weights ~1 / sqrt(inner size), so hidden and out stay O(1), as in a trained model
      const ffn = expertWeights(r, [E, I, D], 'bf16', 0.05);
      // 8 distinct experts a token, some shared between tokens
      const experts = new Int32Array([0, 3, 5, 7, 9, 11, 13, 15, 1, 3, 4, 7, 8, 12, 14, 15, 0, 2, 5, 6, 9, 10, 13, 14]);
      const weights = randomF32(r, T * K, 0.25);
      await compare(`moeFfn ${kind} D=${D} I=${I}`, (b) => ffn(b, act(b, x, [T, D]), upRouting(b, weights, experts, T, K), 'silu'), GEMM);
    }));

    it(`moeFfn (${kind} kernels): an expert outside [0, E) rejects with the token and expert`, () => withMoeKernels(kind, async () => {
      const r = rng(15);
      const [T, D, I, E, K] = [2, 16, 8, 3, 2];
      const ffn = expertWeights(r, [E, I, D], 'bf16');
      const [y] = await ffn(cuda, act(cuda, randomF32(r, T * D), [T, D]),
        upRouting(cuda, randomF32(r, T * K), new Int32Array([0, 1, 2, 7]), T, K), 'silu');
      await assert.rejects(cuda.read(y!), /moeFfn: expert 7 \(token 1\) is outside \[0, 3\)/);
    }));

    if (kind === 'vec') {
      it('moeFfn grouped by expert (vec kernels, 8 tokens or more): 300 tokens in two passes, a bad expert in the second', async () => {
        const r = rng(16);
        const [T, D, I, E, K] = [300, 256, 64, 16, 4];
        const x = randomF32(r, T * D);
        const ffn = expertWeights(r, [E, I, D], 'bf16', 0.1);
        const logits = randomF32(r, T * E, 2);
        // grouped (the default from 8 tokens) with gate/up on CUDA cores, then on tensor cores, then
        // down too, then per (token, expert) pair; passes of 256: two passes of the 300 tokens
        // (rows: a warp of the CUDA-core down projection takes 4 output rows, k_moe_down_g4, or 1, and of
        // the gate/up products 2, k_moe_hidden_g2, or 1)
        for (const [minRows, tcRows, tcDownRows, rows] of [[8, 0, 0, 4], [8, 0, 0, 1], [8, 1, 0, 4], [8, 1, 1, 4],
          [0, 0, 0, 4]] as const) {
          await withMoeKernels(kind, () => compare(`moe 300 tokens, grouped from ${minRows}, tensor cores from ${tcRows}, ` +
            `down from ${tcDownRows}, ${rows} down rows a warp`,
          (b) => ffn(b, act(b, x, [T, D]), b.moeRoute(act(b, logits, [T, E]), K, true), 'silu'), GEMM), {
            passRows: 256, groupedMinRows: minRows, tcMinRows: tcRows, tcDownMinRows: tcDownRows, downRows: rows,
            hiddenRows: rows === 4 ? 2 : 1,
          });
        }
        await withMoeKernels(kind, async () => {
          const experts = new Int32Array(T * K).map((_, i) => i % E);
          experts[258 * K + 1] = 21;
          const [y] = await ffn(cuda, act(cuda, x, [T, D]), upRouting(cuda, randomF32(r, T * K), experts, T, K), 'silu');
          await assert.rejects(cuda.read(y!), /moeFfn: expert 21 \(token 258\) is outside \[0, 16\)/);
        }, { passRows: 256 });
      });
    }

    it(`moeFfn (${kind} kernels) after moeRoute, prefill-sized batch`, () => withMoeKernels(kind, async () => {
      const r = rng(13);
      const [T, D, I, E, K] = [40, 32, 24, 6, 3];
      const x = randomF32(r, T * D);
      const logits = randomF32(r, T * E, 2);
      const ffn = expertWeights(r, [E, I, D], 'bf16');
      await compare(`moe prefill ${kind}`, (b) => ffn(b, act(b, x, [T, D]), b.moeRoute(act(b, logits, [T, E]), K, true), 'silu'),
        GEMM);
    }));
  }
});

describe('shape checks', { skip: SKIP }, () => {
  const bad: [string, (b: Backend) => unknown, RegExp][] = [
    ['matmul K mismatch', (b) => b.matmul(b.upload(new Float32Array(6), [2, 3]), b.upload(new Float32Array(8), [2, 4])),
      /matmul: .*f32\[2, 3\].*f32\[2, 4\]/],
    ['rope odd invFreq', (b) => b.rope(b.upload(new Float32Array(8), [1, 1, 8]), b.upload(new Int32Array(1), [1]),
      b.upload(new Float32Array(5), [5]), 1), /rope: .*rotates 10 dims but headDim is 8/],
    ['add shape mismatch', (b) => b.add(b.upload(new Float32Array(4), [4]), b.upload(new Float32Array(4), [2, 2]), 1),
      /add: shapes differ/],
    ['ids must be i32', (b) => b.embedding(b.upload(new Float32Array(4), [2, 2]), b.upload(new Float32Array(1), [1]), 1),
      /embedding: ids must be i32/],
    ['foreign tensor', (b) => b.scale(new ReferenceBackend().upload(new Float32Array(1), [1]), 1),
      /not a CUDA backend tensor/],
  ];
  for (const [name, call, msg] of bad) {
    it(`${name} throws a clear error`, () => {
      assert.throws(() => call(cuda), msg);
    });
  }
});

// ---- attention fast paths: split-KV decode and tensor-core prefill (attention.ts) -------------
// Random pools with scattered physical blocks (a shuffled pool, -1 beyond each row's length and in
// extra columns), bf16 KV. The scale makes the softmax peaky (logit std ~2.7), so the outputs are
// O(0.3) and sensitive to errors (with a flat softmax over many random keys they average to ~0).
describe('attention fast paths (split-KV decode, tensor-core prefill)', { skip: SKIP }, () => {
  it('attentionPhases: null unless the attention module is built with ATT_TC_PHASES=1; with it, bench/cuda-generate.ts counts the decode attention\'s blocks by phase (a child process)', async () => {
    assert.equal(await cuda.attentionPhases(), null);
    assert.equal(cuda.resetAttentionPhases(), false);
    const dir = mkdtempSync(join(tmpdir(), 'llmts-att-phases-'));
    try {
      const json = join(dir, 'gen.json');
      // the demo model: head dim 64, 3 query heads a kv head (the tensor-core kernel); 300 tokens of context split
      const run = spawnSync(process.execPath, ['--import', 'tsx', 'bench/cuda-generate.ts', '--device', 'cuda', '--model', 'models/demo',
        '--prompt-tokens', '300', '--decode-tokens', '8', '--repeats', '1', '--json', json],
      { env: { ...process.env, LLMTS_CUDA_ATT_DEFINES: 'ATT_TC_PHASES=1' }, encoding: 'utf8', timeout: 300_000 });
      assert.equal(run.status, 0, `${run.stdout.slice(-1000)}\n${run.stderr.slice(-2000)}`);
      const rows = JSON.parse(readFileSync(json, 'utf8')).attentionPhases as { phase: string; cycles: number; blocks: number }[];
      const by = Object.fromEntries(rows.map((r) => [r.phase, r]));
      for (const p of ['wait', 'start', 'tiles', 'partial', 'fence', 'mload', 'mfold', 'block']) {
        assert.ok(by[p]!.blocks > 0 && by[p]!.cycles > 0, `phase ${p}: ${JSON.stringify(by[p])}`);
      }
      assert.ok(by.mfold!.blocks < by.block!.blocks, 'only the last split of a token merges');
      const parts = ['wait', 'start', 'tiles', 'partial', 'fence', 'mload', 'mfold'].reduce((a, p) => a + by[p]!.cycles, 0);
      assert.ok(parts <= by.block!.cycles, `the phases (${parts} cycles) within the blocks' whole (${by.block!.cycles})`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  interface Row { start: number; count: number }
  interface Case {
    D: number; H: number; KVH: number; BS: number;
    /** each row's step: positions start .. start + count - 1 (keys 0 .. start + count - 1 exist) */
    rows: Row[];
    /** [row, position] per token instead of the rows' tokens in order */
    tokens?: [number, number][];
    /** -1 in the tables before each row's first window (as the KV cache releases them) */
    releaseWindow?: number;
    padCols?: number;
    seed?: number;
  }
  interface Built {
    T: number; R: number; MBR: number; NB: number; c: Case;
    tables: Int32Array; rows: Int32Array; pos: Int32Array; kp: Float32Array; vp: Float32Array; q: Float32Array;
  }

  function build(c: Case): Built {
    const r = rng(c.seed ?? 21);
    const { D, H, KVH, BS } = c;
    const tokens = c.tokens ?? c.rows.flatMap((row, i) =>
      Array.from({ length: row.count }, (_, k) => [i, row.start + k] as [number, number]));
    const R = c.rows.length, T = tokens.length;
    const need = c.rows.map((row) => Math.ceil((row.start + row.count) / BS));
    const MBR = Math.max(1, ...need) + (c.padCols ?? 0);
    const NB = need.reduce((a, b) => a + b, 0) + 3;
    const tables = scatteredBlockTables(r, need, MBR, NB);
    c.rows.forEach((row, i) => {
      const w = c.releaseWindow ?? 0;
      if (w > 0) { // blocks wholly before the first query's window
        const first = Math.max(0, row.start - w + 1);
        for (let b = 0; b < need[i]!; b++) if ((b + 1) * BS <= first) tables[i * MBR + b] = -1;
      }
    });
    return {
      T, R, MBR, NB, c, tables,
      rows: Int32Array.from(tokens, (t) => t[0]), pos: Int32Array.from(tokens, (t) => t[1]),
      kp: randomF32(r, NB * BS * KVH * D), vp: randomF32(r, NB * BS * KVH * D), q: randomF32(r, T * H * D, 2),
    };
  }

  /** attention of the built case on b, once per params entry */
  function run(b: Backend, s: Built, params: { scale: number; window: number; softcap: number }[], f32Pools = false): Tensor[] {
    const { D, H, KVH, BS } = s.c;
    const pool = (x: Float32Array) => f32Pools ? b.upload(bf(x), [s.NB, BS, KVH, D]) : act(b, x, [s.NB, BS, KVH, D]);
    const kv = { k: pool(s.kp), v: pool(s.vp) };
    const layout: StepLayout = {
      tokenRow: b.upload(s.rows, [s.T]), tokenPos: b.upload(s.pos, [s.T]), slots: b.upload(new Int32Array(s.T).fill(-1), [s.T]),
      blockTables: b.upload(s.tables, [s.R, s.MBR]), blockSize: BS,
    };
    const q = act(b, s.q, [s.T, H, D]);
    return params.map((p) => b.attention(q, kv, layout, p));
  }

  const peaky = (D: number) => 4 / Math.sqrt(D);
  const label = (c: Case, extra = '') => `D=${c.D} H=${c.H}/${c.KVH} BS=${c.BS} rows ${c.rows.map((r) => `${r.start}+${r.count}`).join(',')}${extra}`;

  it('decode: 1..8 rows, contexts 1..4100, GQA 1/4/8/16, head dims 64/128/256', async () => {
    const heads = [
      { D: 64, H: 4, KVH: 4 }, { D: 128, H: 8, KVH: 2 }, { D: 128, H: 16, KVH: 2 }, { D: 256, H: 8, KVH: 1 },
      { D: 64, H: 16, KVH: 1 }, { D: 256, H: 12, KVH: 2 },
    ];
    const batches = [[4100], [1, 17, 300, 1000, 4100], [17, 1000, 1, 4100, 300, 64, 65, 2048]];
    for (const [i, h] of heads.entries()) {
      for (const ctx of batches) {
        const c: Case = { ...h, BS: 16, rows: ctx.map((n) => ({ start: n - 1, count: 1 })), seed: 100 + i };
        const s = build(c);
        await compare(`decode ${label(c)}`, (b) => run(b, s, [{ scale: peaky(c.D), window: 0, softcap: 0 }]), ATTN_BF16);
      }
    }
  });

  it('decode: windows (released blocks), soft-capping, padded tables, block sizes 1, 12, 32', async () => {
    const cases: [Case, { scale: number; window: number; softcap: number }[]][] = [
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 999, count: 1 }, { start: 40, count: 1 }, { start: 4099, count: 1 }], releaseWindow: 100 },
        [{ scale: peaky(128), window: 100, softcap: 0 }]],
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 777, count: 1 }, { start: 3, count: 1 }], padCols: 7 },
        [{ scale: 0.35, window: 0, softcap: 5 }, { scale: peaky(128), window: 1, softcap: 0 }, { scale: peaky(128), window: 5000, softcap: 30 }]],
      [{ D: 64, H: 8, KVH: 1, BS: 1, rows: [{ start: 300, count: 1 }, { start: 0, count: 1 }] }, [{ scale: peaky(64), window: 0, softcap: 0 }]],
      [{ D: 256, H: 4, KVH: 2, BS: 12, rows: [{ start: 500, count: 1 }, { start: 11, count: 1 }, { start: 12, count: 1 }] },
        [{ scale: peaky(256), window: 37, softcap: 0 }]],
      [{ D: 128, H: 4, KVH: 1, BS: 32, rows: [{ start: 2047, count: 1 }, { start: 31, count: 1 }, { start: 32, count: 1 }] },
        [{ scale: 0.5, window: 0, softcap: 50 }]],
      // short runs (speculative chunks of 2..8 tokens) also take the decode path
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 60, count: 3 }, { start: 500, count: 8 }, { start: 9, count: 2 }, { start: 130, count: 5 }] },
        [{ scale: peaky(128), window: 0, softcap: 0 }]],
    ];
    for (const [c, params] of cases) {
      const s = build(c);
      await compare(`decode ${label(c, ` ${JSON.stringify(params)}`)}`, (b) => run(b, s, params), ATTN_BF16);
    }
  });

  for (const kind of ['tc', 'cuda-core'] as const) it(`decode on ${kind === 'tc' ? 'tensor cores (k_attn_decode_tc, the default)' : 'CUDA cores (k_attn_decode_d<D>_g<GC>, $LLMTS_CUDA_ATT_DECODE=cuda-core)'}: GQA 1-16, head dims 64/128, windows, soft-capping, block sizes, many rows`, () => withSettings({ attention: { decodeKernel: kind } }, async () => {
    const many = Array.from({ length: 150 }, (_, i) => ({ start: (i * 37) % 900, count: 1 })); // T > 128: the plan kernel
    const cases: [Case, { scale: number; window: number; softcap: number }[]][] = [
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [4100, 1, 17, 300, 1000, 64, 65, 2048].map((n) => ({ start: n - 1, count: 1 })) },
        [{ scale: peaky(128), window: 0, softcap: 0 }]],
      [{ D: 128, H: 32, KVH: 8, BS: 16, rows: many }, [{ scale: peaky(128), window: 0, softcap: 0 }]],
      [{ D: 64, H: 4, KVH: 4, BS: 16, rows: [{ start: 4099, count: 1 }, { start: 0, count: 1 }] }, [{ scale: peaky(64), window: 0, softcap: 0 }]],
      [{ D: 64, H: 16, KVH: 1, BS: 16, rows: [{ start: 299, count: 1 }, { start: 16, count: 1 }] }, [{ scale: peaky(64), window: 0, softcap: 0 }]],
      [{ D: 128, H: 16, KVH: 2, BS: 16, rows: [{ start: 999, count: 1 }, { start: 40, count: 1 }, { start: 4099, count: 1 }], releaseWindow: 100 },
        [{ scale: peaky(128), window: 100, softcap: 0 }]],
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 777, count: 1 }, { start: 3, count: 1 }], padCols: 7 },
        [{ scale: 0.35, window: 0, softcap: 5 }, { scale: peaky(128), window: 1, softcap: 0 }, { scale: peaky(128), window: 5000, softcap: 30 }]],
      [{ D: 64, H: 8, KVH: 1, BS: 1, rows: [{ start: 300, count: 1 }, { start: 0, count: 1 }] }, [{ scale: peaky(64), window: 0, softcap: 0 }]],
      [{ D: 128, H: 12, KVH: 4, BS: 12, rows: [{ start: 500, count: 1 }, { start: 11, count: 1 }, { start: 12, count: 1 }] },
        [{ scale: peaky(128), window: 37, softcap: 0 }]],
      [{ D: 128, H: 4, KVH: 1, BS: 32, rows: [{ start: 2047, count: 1 }, { start: 31, count: 1 }, { start: 32, count: 1 }] },
        [{ scale: 0.5, window: 0, softcap: 50 }]],
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 60, count: 3 }, { start: 500, count: 8 }, { start: 9, count: 2 }, { start: 130, count: 5 }] },
        [{ scale: peaky(128), window: 0, softcap: 0 }]],
    ];
    for (const [i, [c, params]] of cases.entries()) {
      const s = build({ ...c, seed: 300 + i });
      await compare(`decode ${kind} ${label(c, ` ${JSON.stringify(params)}`)}`, (b) => run(b, s, params), ATTN_BF16);
    }
  }));

  it('prefill: fresh and after a cached prefix, ragged tails, windows, soft-capping, head dims 64/128/256', async () => {
    const cases: [Case, { scale: number; window: number; softcap: number }[]][] = [
      [{ D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 0, count: 200 }] },
        [{ scale: peaky(128), window: 0, softcap: 0 }, { scale: peaky(128), window: 64, softcap: 0 }]],
      [{ D: 64, H: 4, KVH: 1, BS: 16, rows: [{ start: 333, count: 150 }] },
        [{ scale: peaky(64), window: 0, softcap: 0 }, { scale: 0.3, window: 0, softcap: 30 }]],
      [{ D: 256, H: 4, KVH: 2, BS: 16, rows: [{ start: 40, count: 130 }] },
        [{ scale: peaky(256), window: 0, softcap: 0 }, { scale: peaky(256), window: 50, softcap: 20 }]],
      [{ D: 128, H: 4, KVH: 4, BS: 8, rows: [{ start: 300, count: 97 }], releaseWindow: 40 },
        [{ scale: peaky(128), window: 40, softcap: 0 }]],
      [{ D: 64, H: 2, KVH: 1, BS: 5, rows: [{ start: 0, count: 5 }, { start: 7, count: 66 }] },
        [{ scale: peaky(64), window: 0, softcap: 0 }]],
    ];
    for (const [c, params] of cases) {
      const s = build(c);
      await compare(`prefill ${label(c, ` ${JSON.stringify(params)}`)}`, (b) => run(b, s, params), ATTN_BF16);
    }
  });

  it('mixed batches: decode rows beside prefill chunks (T <= 128 and T > 128), odd token orders', async () => {
    const cases: Case[] = [
      { D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 20, count: 1 }, { start: 30, count: 10 }, { start: 100, count: 1 }, { start: 1000, count: 1 }] },
      { D: 128, H: 8, KVH: 2, BS: 16, padCols: 3, rows: [
        { start: 300, count: 1 }, { start: 60, count: 90 }, { start: 17, count: 1 }, { start: 0, count: 45 },
        { start: 4000, count: 1 }, { start: 4, count: 1 }, { start: 128, count: 64 }] },
      // interleaved rows, repeated and non-consecutive positions: still correct, only slower
      { D: 64, H: 4, KVH: 2, BS: 4, rows: [{ start: 0, count: 40 }, { start: 0, count: 40 }],
        tokens: [[0, 5], [0, 39], [1, 3], [1, 3], [1, 20], [1, 21], [1, 22], [1, 23], [1, 24], [0, 0], [0, 1], [0, 2],
          [0, 3], [0, 4], [0, 30], [1, 39], [1, 38], [1, 37], [1, 36], [1, 35], [1, 0]] },
      // a pure decode batch of 140 rows (the decode tokens are listed by k_attn_plan)
      { D: 64, H: 4, KVH: 2, BS: 16, rows: Array.from({ length: 140 }, (_, i) => ({ start: (i * 37) % 500, count: 1 })) },
    ];
    for (const c of cases) {
      const s = build(c);
      await compare(`mixed T=${s.T} ${label(c).slice(0, 120)}`, (b) => run(b, s, [
        { scale: peaky(c.D), window: 0, softcap: 0 }, { scale: peaky(c.D), window: 7, softcap: 10 }]), ATTN_BF16);
    }
  });

  it('generic path: head dim 80, f32 pools, and the generic kernel forced', async () => {
    const c: Case = { D: 80, H: 4, KVH: 2, BS: 16, rows: [{ start: 50, count: 1 }, { start: 10, count: 70 }] };
    const s = build(c);
    const params = [{ scale: peaky(80), window: 0, softcap: 0 }, { scale: 0.3, window: 20, softcap: 5 }];
    await compare('generic D=80', (b) => run(b, s, params), ATTN);
    const s128 = build({ ...c, D: 128 });
    const p128 = [{ scale: peaky(128), window: 0, softcap: 0 }];
    await compare('generic f32 pools', (b) => run(b, s128, p128, true), ATTN);
    await withCudaBackend({ attention: { mode: 'generic' } }, (generic) => compare('generic forced', (b) => run(b, s128, p128), ATTN, generic));
  });

  it('fast paths agree with the generic kernel at sizes the reference is too slow for', async () => {
    const cases: [Case, number][] = [
      [{ D: 128, H: 16, KVH: 4, BS: 16, rows: [{ start: 0, count: 4096 }] }, 0], // 4k prefill
      [{ D: 128, H: 16, KVH: 4, BS: 16, rows: [{ start: 3000, count: 1000 }, { start: 0, count: 1 }] }, 512],
      [{ D: 128, H: 32, KVH: 8, BS: 16, rows: [{ start: 32767, count: 1 }, { start: 20000, count: 1 }] }, 0], // 32k decode
      [{ D: 256, H: 8, KVH: 4, BS: 16, rows: [{ start: 2000, count: 600 }] }, 0],
    ];
    await withCudaBackend({ attention: { mode: 'generic' } }, async (generic) => {
      for (const [c, window] of cases) {
        const s = build(c);
        const params = [{ scale: peaky(c.D), window, softcap: 0 }];
        const fast = run(cuda, s, params)[0]!;
        const slow = run(generic, s, params)[0]!;
        assertClose(`fast vs generic ${label(c)} window ${window}`, await cuda.read(fast), await generic.read(slow), ATTN_BF16);
      }
    });
  });

  it('one captured graph serves growing positions (splits follow tokenPos on the device)', async () => {
    // fixed table width (capacity 1024 keys), 3 decode rows; only tokenPos changes between replays
    const c: Case = { D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 1023, count: 1 }, { start: 1023, count: 1 }, { start: 1023, count: 1 }] };
    const s = build(c);
    const params = { scale: peaky(128), window: 0, softcap: 0 };
    const kv = { k: act(cuda, s.kp, [s.NB, c.BS, c.KVH, c.D]), v: act(cuda, s.vp, [s.NB, c.BS, c.KVH, c.D]) };
    const pos = cuda.upload(s.pos, [3]);
    const layout: StepLayout = {
      tokenRow: cuda.upload(s.rows, [3]), tokenPos: pos, slots: cuda.upload(new Int32Array(3).fill(-1), [3]),
      blockTables: cuda.upload(s.tables, [3, s.MBR]), blockSize: c.BS,
    };
    const q = act(cuda, s.q, [3, c.H, c.D]);
    const graph = cuda.captureGraph(() => [cuda.attention(q, kv, layout, params)]);
    try {
      for (const p of [[0, 5, 17], [63, 64, 65], [100, 400, 700], [1023, 999, 2], [-1, 300, 1000]]) {
        const host = new Int32Array(p);
        cuda.copyInto(pos, host);
        graph.replay();
        const got = await cuda.read(graph.outputs[0]!);
        const direct = await cuda.read(cuda.attention(q, kv, layout, params));
        assert.deepEqual([...got], [...direct], `graph replay at positions ${p} differs from a direct launch`);
        // the reference for the rows with a position (position -1: a padding row, zeros)
        const live = [0, 1, 2].filter((r) => p[r]! >= 0);
        const sub = { ...s, T: live.length, rows: Int32Array.from(live), pos: Int32Array.from(live, (r) => p[r]!),
          q: Float32Array.from(live.flatMap((r) => [...s.q.subarray(r * c.H * c.D, (r + 1) * c.H * c.D)])) };
        const want = await ref.read(run(ref, sub, [params])[0]!);
        const gotLive = Float32Array.from(live.flatMap((r) => [...got.subarray(r * c.H * c.D, (r + 1) * c.H * c.D)]));
        assertClose(`graph replay at positions ${p}`, gotLive, want, ATTN_BF16);
        for (const r of [0, 1, 2].filter((x) => p[x]! < 0)) {
          assert.ok(got.subarray(r * c.H * c.D, (r + 1) * c.H * c.D).every((x) => x === 0), `row ${r} at position -1 is not zeros`);
        }
      }
    } finally {
      graph.dispose();
    }
  });

  it('errors: a row outside the tables (code 3) and a missing block (code 4), on both paths', async () => {
    const c: Case = { D: 128, H: 4, KVH: 2, BS: 16, rows: [{ start: 100, count: 1 }, { start: 10, count: 40 }] };
    const s = build(c);
    const params = [{ scale: 0.1, window: 0, softcap: 0 }];
    const bad = (mut: (x: Built) => void) => {
      const x: Built = { ...s, rows: s.rows.slice(), pos: s.pos.slice(), tables: s.tables.slice() };
      mut(x);
      return run(cuda, x, params)[0]!;
    };
    // decode token 0 in row 7 of 2
    await assert.rejects(cuda.read(bad((x) => { x.rows[0] = 7; })),
      /attention: token 0 belongs to row 7, outside the block tables' 2 rows/);
    // prefill tokens 5..9 in row -1 (a run of 5: prefill)
    await assert.rejects(cuda.read(bad((x) => { for (let t = 5; t < 10; t++) x.rows[t] = -1; })),
      /attention: token [5-9] belongs to row -1, outside the block tables' 2 rows/);
    // row 0 (decode at 100) loses block 2 (keys 32..47)
    await assert.rejects(cuda.read(bad((x) => { x.tables[2] = -1; })),
      /attention: row 0 holds no block for position (3[2-9]|4[0-7]) \(block table entry -1\)/);
    // row 1 (prefill 10..49) loses block 1 (keys 16..31)
    await assert.rejects(cuda.read(bad((x) => { x.tables[s.MBR + 1] = -1; })),
      /attention: row 1 holds no block for position (1[6-9]|2\d|3[01]) \(block table entry -1\)/);
    // positions past the table width
    await assert.rejects(cuda.read(bad((x) => { x.pos[0] = 16 * s.MBR + 3; })), /attention: row 0 holds no block for position \d+/);
    // the backend stays usable
    await compare('after errors', (b) => run(b, s, params), ATTN_BF16);
  });
});
