// The CUDA backend's packed-weight and fused ops against the reference
// backend (which composes the plain ops) on random inputs. Skipped without a usable CUDA.
//
// Tolerances (|cuda - ref| <= atol + rtol * |ref|), as in cuda-ops.test.ts:
//   addRmsnorm, gluPacked (f32 math, then bf16):                    atol 1e-5, rtol 8e-3
//   ropeQkvWriteKv (norm, rope of f32 angles, then bf16):           atol 1e-4, rtol 1.2e-2
// The sum in addRmsnorm is one bf16 rounding of an exact f32 sum (the reference's is exact): the
// norm then sees values within 2^-9 relative, hence the looser rtol than a plain rmsnorm.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { Backend, PagedKv, StepLayout, Tensor } from '../../src/contracts/backend.ts';
import { hasFusedOps } from '../../src/contracts/backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import { assertClose, randomF32, rng, type Tolerance, WeightDir, withCudaBackend } from './helpers.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-fused: skipping every test: ${SKIP}`);

const NORM: Tolerance = { atol: 1e-5, rtol: 8e-3 };
const ROPE: Tolerance = { atol: 1e-4, rtol: 1.2e-2 };

let ref: ReferenceBackend;
let cuda: CudaBackend;
let files: WeightDir;

before(async () => {
  if (SKIP) return;
  ref = new ReferenceBackend();
  cuda = await createCudaBackend();
  files = new WeightDir();
});
after(async () => {
  if (SKIP) return;
  await cuda.close();
  files.cleanup();
});

const bf = (x: Float32Array) => decodeHalf(encodeHalf(x, 'bf16'), 'bf16');
function act(b: Backend, data: Float32Array, shape: number[]): Tensor {
  const t = b.upload(bf(data), shape);
  return b.name === 'cuda' ? b.scale(t, 1) : t;
}
/** t with its values rounded to bf16 (the reference backend's stand-in for a stored bf16 activation) */
async function roundedBf16(b: Backend, t: Tensor): Promise<Tensor> {
  return b.upload(bf(Float32Array.from(await b.read(t))), [...t.shape]);
}
const fused = (b: Backend) => {
  assert.ok(hasFusedOps(b), `${b.name} lacks fused ops`);
  return b;
};

/** `graph` on the reference and on `on` (default: the shared backend), within `tol`. */
async function compare(label: string, graph: (b: Backend) => Promise<Tensor[]> | Tensor[], tol: Tolerance,
  on: Backend = cuda): Promise<void> {
  const want = await graph(ref);
  const got = await graph(on);
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) {
    assert.deepEqual([...got[i]!.shape], [...want[i]!.shape], `${label}: output ${i} shape`);
    assertClose(`${label} (output ${i})`, await on.read(got[i]!), await ref.read(want[i]!), tol);
  }
}

describe('packed weights', { skip: SKIP }, () => {
  it('loadConcat joins along dim 0 and rowView sees each part', async () => {
    const r = rng(11);
    for (const dtype of ['f32', 'bf16'] as const) {
      const parts = [[6, 40], [2, 40], [3, 40]].map((s) => bf(randomF32(r, s[0]! * s[1]!, 2)));
      const srcs = parts.map((p, i) => files.write(p, dtype, [[6, 2, 3][i]!, 40]));
      const t = await fused(cuda).loadConcat!(srcs, 'keep');
      assert.deepEqual([...t.shape], [11, 40]);
      assert.equal(t.dtype, dtype);
      assert.deepEqual([...(await cuda.read(t))], parts.flatMap((p) => [...p]));
      const v = cuda.rowView!(t, 6, 2);
      assert.deepEqual([...v.shape], [2, 40]);
      assert.deepEqual([...(await cuda.read(v))], [...parts[1]!]);
      assert.throws(() => cuda.rowView!(t, 10, 2), /outside/);
      await assert.rejects(cuda.loadConcat!([srcs[0]!, files.write(parts[1]!, dtype, [2, 40].reverse())], 'keep'), /only dim 0/);
      cuda.free(t);
    }
  });
});

/**
 * addRmsnormMatmul of [T, D] rows into N outputs on the CUDA backend; elsewhere the reference
 * composes the ops, rounding the sum and the normed rows to bf16 where the CUDA kernels store them.
 */
function addRmsnormMatmulGraph(T: number, D: number, N: number, x: Float32Array, res: Float32Array, nw: Float32Array,
  w: Float32Array, rScale: number, off: number): (b: Backend) => Promise<Tensor[]> {
  return async (b) => {
    const xx = act(b, x, [T, D]), rr = act(b, res, [T, D]), g = act(b, nw, [D]), ww = act(b, w, [N, D]);
    if (b.name === 'cuda') {
      const f = b.addRmsnormMatmul!(xx, rr, rScale, g, 1e-5, off, ww);
      return [f.sum, f.y];
    }
    const sum = await roundedBf16(b, b.add(xx, rr, rScale));
    const normed = await roundedBf16(b, b.rmsnorm(sum, g, 1e-5, off));
    return [sum, b.matmul(normed, ww)];
  };
}

describe('fused ops', { skip: SKIP }, () => {
  it('addRmsnorm: vector and generic paths, weight dtypes, offsets, residual scales', async () => {
    const r = rng(12);
    for (const [rows, D] of [[1, 4096], [7, 72], [3, 70], [2, 5120]] as const) {
      const x = randomF32(r, rows * D, 3), y = randomF32(r, rows * D, 3), w = randomF32(r, D, 1);
      for (const [scale, off] of [[1, 0], [0.22, 1]] as const) {
        await compare(`addRmsnorm ${rows}x${D} scale ${scale} off ${off}`, (b) => {
          const o = fused(b).addRmsnorm!(act(b, x, [rows, D]), act(b, y, [rows, D]), scale, b.upload(w, [D]), 1e-6, off);
          return [o.sum, o.normed];
        }, NORM);
      }
    }
  });

  it('gluPacked: vector and generic paths, each activation', async () => {
    const r = rng(13);
    for (const [T, I] of [[1, 14336], [5, 40], [3, 21]] as const) {
      const gu = randomF32(r, T * 2 * I, 4);
      for (const a of ['silu', 'gelu_tanh', 'gelu'] as const)
        await compare(`gluPacked ${T}x${I} ${a}`, (b) => [fused(b).gluPacked!(act(b, gu, [T, 2 * I]), a)], NORM);
    }
  });

  // The reference rounds the glu / normed rows to bf16 as the kernels do, but its f32 maths (and
  // its gelu_tanh) can land a value on the other side of a rounding boundary; over thousands of
  // terms those flips add up to ~0.3% of the rows' typical |y| (~sqrt(K) x the inputs' scale):
  // seen 0.078 at 6 x 4096 (norm) and 0.30 at 3 x 7168 (gelu_tanh glu, |y| ~ 100). A wrong row or
  // weight is off by O(|y|). Short rows keep the tight tolerance.
  const longK = (K: number, scale: number) => ({ atol: K > 1024 ? 4e-3 * Math.sqrt(K) * scale : 4e-3, rtol: 1.2e-2 });

  it('gluMatmul: the two ops, and fused into the decode GEMV (fuseGlu, $LLMTS_CUDA_FUSE_GLU=on) at one row (more: the two ops), each activation', async () => {
    const r = rng(14);
    for (const fuse of [false, true]) {
      await withCudaBackend({ fused: { fuseGlu: fuse } }, async (on) => {
        for (const [T, I, N] of [[1, 520, 40], [3, 264, 17], [8, 136, 9], [12, 136, 5], [2, 136, 3000], [1, 4096, 700],
          [3, 7168, 20], [6, 4096, 30]] as const) { // the last: 48 KiB of x, no room for the kernel's own: unfused
          const gu = randomF32(r, T * 2 * I, 3), w = randomF32(r, N * I);
          for (const a of ['silu', 'gelu_tanh'] as const) {
            // the reference composes the two ops, its glu output rounded to bf16 as the CUDA
            // activations are
            await compare(`gluMatmul ${T}x${I} -> ${N} ${a} fused ${fuse}`, async (b) => {
              const g = act(b, gu, [T, 2 * I]), ww = act(b, w, [N, I]);
              if (b.name === 'cuda') return [b.gluMatmul!(g, a, ww)];
              return [b.matmul(await roundedBf16(b, b.gluPacked!(g, a)), ww)];
            }, longK(I, 3), on);
          }
        }
      });
    }
  });

  it('addRmsnormMatmul: the two ops, and fused into the decode GEMV at one row (the default; fuseNorm off unfuses; more rows: the two ops)', async () => {
    const r = rng(15);
    for (const fuse of [false, true]) {
      await withCudaBackend({ fused: { fuseNorm: fuse } }, async (on) => {
        for (const [T, D, N, rScale, off] of [[1, 520, 40, 1, 0], [3, 264, 17, 0.5, 1], [8, 136, 9, 1, 0], [12, 136, 5, 1, 0],
          [1, 264, 3000, 1, 0], [2, 4096, 900, 1, 0], [5, 4096, 40, 1, 0], [6, 4096, 50, 1, 0]] as const) { // 6 x 4096: unfused
          const x = randomF32(r, T * D, 2), res = randomF32(r, T * D, 2), nw = randomF32(r, D), w = randomF32(r, N * D);
          await compare(`addRmsnormMatmul ${T}x${D} -> ${N} fused ${fuse}`, addRmsnormMatmulGraph(T, D, N, x, res, nw, w, rScale, off),
            longK(D, 0.6), on);
        }
      });
    }
  });

  it('addRmsnormGateUpGlu: the ops, and one kernel with the GLU in its epilogue (the default at one row)', async () => {
    const r = rng(16);
    for (const epi of [false, true]) {
      await withCudaBackend({ fused: { gluEpilogue: epi } }, async (on) => {
        for (const [T, D, I] of [[1, 520, 40], [1, 4096, 700], [3, 264, 17], [1, 264, 1500]] as const) {
          const x = randomF32(r, T * D, 2), res = randomF32(r, T * D, 2), nw = randomF32(r, D), w = randomF32(r, 2 * I * D);
          for (const a of ['silu', 'gelu_tanh'] as const) {
            // the reference composes the ops, rounding the sum, the normed rows and the gate/up
            // product to bf16 where the CUDA kernels store them
            await compare(`addRmsnormGateUpGlu ${T}x${D} -> ${I} ${a} epilogue ${epi}`, async (b) => {
              const xx = act(b, x, [T, D]), rr = act(b, res, [T, D]), g = act(b, nw, [D]), ww = act(b, w, [2 * I, D]);
              if (b.name === 'cuda') {
                const f = b.addRmsnormGateUpGlu!(xx, rr, 1, g, 1e-5, 0, ww, a);
                return [f.sum, f.y];
              }
              const sum = await roundedBf16(b, b.add(xx, rr, 1));
              const normed = await roundedBf16(b, b.rmsnorm(sum, g, 1e-5, 0));
              return [sum, b.gluPacked!(await roundedBf16(b, b.matmul(normed, ww)), a)];
            }, longK(D, 1.5), on);
          }
        }
      });
    }
  });

  it('addRmsnormQkvRope: one kernel with rope and the KV write in its epilogue (ropeEpilogue, $LLMTS_CUDA_ROPE_EPILOGUE=on) gives the two ops\' results at one row', async () => {
    const r = rng(17);
    const [NB, BS] = [6, 4];
    // heads, kv heads, head dim, rotated dims, per-token invFreq, hidden size, slot (-1: skipped)
    for (const [H, KVH, D, rot, perToken, Dh, slot] of [[8, 2, 64, 64, false, 512, 5], [4, 4, 128, 64, true, 1032, 22],
      [8, 2, 128, 128, false, 4096, -1]] as const) {
      const x = randomF32(r, Dh, 2), res = randomF32(r, Dh, 2), nw = randomF32(r, Dh), w = randomF32(r, (H + 2 * KVH) * D * Dh);
      const inv = perToken ? randomF32(r, rot / 2, 1).map((v) => Math.abs(v) + 1e-3)
        : Float32Array.from({ length: rot / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / rot));
      const kPool0 = bf(randomF32(r, NB * BS * KVH * D)), vPool0 = bf(randomF32(r, NB * BS * KVH * D));
      const run = (epilogue: boolean) => withCudaBackend({ fused: { ropeEpilogue: epilogue } }, async (on) => {
        const kv: PagedKv = { k: act(on, kPool0, [NB, BS, KVH, D]), v: act(on, vPool0, [NB, BS, KVH, D]) };
        const layout: StepLayout = {
          tokenRow: on.upload(new Int32Array(1), [1]), tokenPos: on.upload(new Int32Array([77]), [1]),
          slots: on.upload(new Int32Array([slot]), [1]), blockTables: on.upload(new Int32Array([0, 1, 2, 3, 4, 5]), [1, 6]),
          blockSize: BS,
        };
        const f = on.addRmsnormQkvRope(act(on, x, [1, Dh]), act(on, res, [1, Dh]), 1, act(on, nw, [Dh]), 1e-5, 0,
          act(on, w, [(H + 2 * KVH) * D, Dh]), { heads: H, kvHeads: KVH, headDim: D }, layout.tokenPos,
          on.upload(inv, perToken ? [1, rot / 2] : [rot / 2]), 0.9, kv, layout);
        return await Promise.all([f.sum, f.q, kv.k, kv.v].map((t) => on.read(t)));
      });
      const [plain, fusedOut] = [await run(false), await run(true)];
      // the same sums (the same row split); the rope's a c - b s may contract into an FMA
      // differently in the two kernels, so a roped value may land one bf16 step apart
      for (const [i, what] of ['sum', 'q', 'k pool', 'v pool'].entries()) {
        assertClose(`addRmsnormQkvRope H ${H} KVH ${KVH} D ${D} rot ${rot}: ${what}`, fusedOut[i]!, plain[i]!, { atol: 1e-6, rtol: 8e-3 });
      }
    }
  });

  it('ropeQkvWriteKv: q out and k/v in the pools, with and without head norms, partial rotary, per-token tables', async () => {
    const r = rng(14);
    const [NB, BS, H, KVH] = [6, 4, 6, 2];
    for (const [D, rot, perToken, norm] of [[64, 64, false, false], [128, 128, false, true], [24, 12, true, true], [96, 96, true, false]] as const) {
      const T = 5;
      const qkv = randomF32(r, T * (H + 2 * KVH) * D, 2);
      const pos = new Int32Array([0, 7, 3, 1000, 65535]);
      const slots = new Int32Array([3, -1, 22, 5, 17]);
      const inv = perToken
        ? randomF32(r, T * (rot / 2), 1).map((v) => Math.abs(v) + 1e-3)
        : Float32Array.from({ length: rot / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / rot));
      const kPool0 = bf(randomF32(r, NB * BS * KVH * D)), vPool0 = bf(randomF32(r, NB * BS * KVH * D));
      const qn = randomF32(r, D, 1), kn = randomF32(r, D, 1);
      const label = `ropeQkvWriteKv D ${D} rot ${rot}${perToken ? ' per-token' : ''}${norm ? ' norm' : ''}`;
      const setup = (b: Backend) => {
        const kv: PagedKv = { k: act(b, kPool0, [NB, BS, KVH, D]), v: act(b, vPool0, [NB, BS, KVH, D]) };
        const layout: StepLayout = {
          tokenRow: b.upload(new Int32Array(T), [T]), tokenPos: b.upload(pos, [T]), slots: b.upload(slots, [T]),
          blockTables: b.upload(new Int32Array([0, 1, 2, 3, 4, 5]), [1, 6]), blockSize: BS,
        };
        const invT = b.upload(inv, perToken ? [T, rot / 2] : [rot / 2]);
        const qkNorm = norm ? { q: b.upload(qn, [D]), k: b.upload(kn, [D]), eps: 1e-6, weightOffset: 0.5 } : undefined;
        return { kv, layout, invT, qkNorm };
      };
      const viaFused = (b: Backend) => {
        const { kv, layout, invT, qkNorm } = setup(b);
        const q = fused(b).ropeQkvWriteKv!(act(b, qkv, [T, (H + 2 * KVH) * D]), { heads: H, kvHeads: KVH, headDim: D },
          layout.tokenPos, invT, 0.9, qkNorm, kv, layout);
        return [q, kv.k, kv.v];
      };
      // the plain ops, fed the same bf16 values: norm and rope round where the fused kernel does
      const part = (from: number, n: number) => {
        const out = new Float32Array(T * n * D);
        const W = (H + 2 * KVH) * D;
        for (let t = 0; t < T; t++) out.set(qkv.subarray(t * W + from * D, t * W + (from + n) * D), t * n * D);
        return out;
      };
      const viaPlain = (b: Backend) => {
        const { kv, layout, invT, qkNorm } = setup(b);
        let q = act(b, part(0, H), [T, H, D]), k = act(b, part(H, KVH), [T, KVH, D]);
        if (qkNorm) {
          q = b.rmsnorm(q, qkNorm.q, qkNorm.eps, qkNorm.weightOffset);
          k = b.rmsnorm(k, qkNorm.k, qkNorm.eps, qkNorm.weightOffset);
        }
        q = b.rope(q, layout.tokenPos, invT, 0.9);
        b.writeKv(kv, b.rope(k, layout.tokenPos, invT, 0.9), act(b, part(H + KVH, KVH), [T, KVH, D]), layout);
        return [q, kv.k, kv.v];
      };
      const got = viaFused(cuda), plain = viaPlain(cuda);
      for (let i = 0; i < 3; i++) assertClose(`${label} vs the plain CUDA ops (output ${i})`, await cuda.read(got[i]!), await cuda.read(plain[i]!), { atol: 1e-4, rtol: 8e-3 });
      if (!norm) await compare(`${label} vs the reference`, viaFused, ROPE);
    }
  });
});

describe('argmax', { skip: SKIP }, () => {
  it('picks the largest per row, the lowest index on ties, -1 for an all -Infinity row', async () => {
    const r = rng(16);
    const [R, V] = [5, 128256];
    const x = bf(randomF32(r, R * V, 4));
    x[1 * V + 7] = 100; x[1 * V + 70000] = 100; // a tie: 7 wins
    x.fill(-Infinity, 2 * V, 3 * V);
    x[3 * V + V - 1] = 50; // the last index
    const t = cuda.upload(x, [R, V]);
    for (const input of [t, cuda.scale(t, 1)]) { // f32 and bf16 rows
      const got = [...(await cuda.read(cuda.argmax!(input)))];
      const want = [...(await ref.read(ref.argmax(ref.upload(x, [R, V]))))];
      assert.deepEqual(got, want);
      assert.equal(got[1], 7);
      assert.equal(got[2], -1);
      assert.equal(got[3], V - 1);
    }
  });
});
