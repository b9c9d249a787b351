// The CUDA mixture-of-experts FFN kernels run on the CPU by the warp simulator (cuda-sim/): the
// bf16 twins k_moe_hidden_v / k_moe_down_v (moe-kernels.ts) against the generic k_moe_hidden /
// k_moe_down (kernels.ts) and a float64 reference, on random bf16 inputs: 1-5 tokens, 1-8 experts
// a token (shared between tokens, some repeated within one), D and I off the kernels' passes
// (a lane's 8 chunks of 8 values: 2056 = 2048 + 8, 776, 264), a capped grid y (blocks loop over
// pairs), and experts outside [0, E) (error 6, zeros). Their GPU twins are cuda-ops.test.ts' moeFfn
// tests, run with both kernel settings.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { ACT_CODE } from '../../src/backends/cuda/cuda-tensor.ts';
import { CUDA_DEFAULTS } from '../../src/backends/cuda/cuda-settings.ts';
import { moeGroupedScratch, moeRunsGrouped } from '../../src/backends/cuda/moe-kernels.ts';
import { simUnavailable } from './cuda-sim/build.ts';
import { type MoeSimCase, type MoeSimResult, runMoeSim, runRouteSim } from './cuda-sim/moe-sim.ts';
import { randomF32, rng } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-moe-sim: skipping: ${SKIP}`);

type Act = 'silu' | 'gelu_tanh';
const ACTIVATE: Record<Act, (x: number) => number> = {
  silu: (x) => x / (1 + Math.exp(-x)),
  gelu_tanh: (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x))),
};
/** relative error of an f32 dot product against its sum of |terms| (f32 sums of <= a few thousand random terms) */
const F32_DOT = 1e-5;
/** bf16 output rounding (2^-9 relative) with room */
const BF16_OUT = 2 ** -8;

interface Spec { T: number; K: number; E: number; D: number; I: number; act: Act; gridY?: number; seed: number }

/** Random bf16 inputs; experts drawn with replacement from [0, E), so tokens share experts and a token may repeat one. */
function makeCase(s: Spec): MoeSimCase & { act_: Act } {
  const r = rng(s.seed);
  const bf = (n: number, scale: number) => encodeHalf(randomF32(r, n, scale), 'bf16');
  const experts = Int32Array.from({ length: s.T * s.K }, () => Math.floor(r() * s.E));
  return {
    T: s.T, K: s.K, D: s.D, I: s.I, E: s.E, act: ACT_CODE[s.act], act_: s.act, gridY: s.gridY,
    x: bf(s.T * s.D, 1), gate: bf(s.E * s.I * s.D, 0.1), up: bf(s.E * s.I * s.D, 0.1), down: bf(s.E * s.D * s.I, 0.1),
    experts, weights: randomF32(r, s.T * s.K),
  };
}

interface Reference {
  hidden: Float64Array;
  /** per hidden value: the bound on an f32 kernel's error */
  hiddenTol: Float64Array;
  out: Float64Array;
  /** per output: the bound on the f32 sums' error (bf16 rounding not included) */
  outTol: Float64Array;
}

/** float64 moeFfn (experts outside [0, E) give zero hidden rows and are skipped), with error bounds for f32 kernels. */
function reference(c: MoeSimCase & { act_: Act }): Reference {
  const { T, K, D, I, E } = c;
  const x = decodeHalf(c.x, 'bf16'), gate = decodeHalf(c.gate, 'bf16'), up = decodeHalf(c.up, 'bf16');
  const down = decodeHalf(c.down, 'bf16');
  const hidden = new Float64Array(T * K * I), hiddenTol = new Float64Array(T * K * I);
  const out = new Float64Array(T * D), outTol = new Float64Array(T * D);
  for (let t = 0; t < T; t++) {
    for (let k = 0; k < K; k++) {
      const e = c.experts[t * K + k]!, tk = t * K + k;
      if (e < 0 || e >= E) continue;
      for (let n = 0; n < I; n++) {
        let g = 0, u = 0, ga = 0, ua = 0;
        for (let d = 0; d < D; d++) {
          const xv = x[t * D + d]!, w = (e * I + n) * D + d;
          g += gate[w]! * xv;
          u += up[w]! * xv;
          ga += Math.abs(gate[w]! * xv);
          ua += Math.abs(up[w]! * xv);
        }
        const a = ACTIVATE[c.act_](g);
        hidden[tk * I + n] = a * u;
        // first order: |act'| <= 1.2 for silu and gelu_tanh
        hiddenTol[tk * I + n] = F32_DOT * (1.2 * ga * Math.abs(u) + Math.abs(a) * ua) + 1e-30;
      }
      const w = c.weights[tk]!;
      for (let d = 0; d < D; d++) {
        let s = 0, sa = 0;
        for (let n = 0; n < I; n++) {
          const dv = down[(e * D + d) * I + n]!, h = hidden[tk * I + n]!;
          s += dv * h;
          sa += Math.abs(dv) * (Math.abs(h) + hiddenTol[tk * I + n]! / F32_DOT);
        }
        out[t * D + d] += w * s;
        outTol[t * D + d] += F32_DOT * Math.abs(w) * sa;
      }
    }
  }
  return { hidden, hiddenTol, out, outTol };
}

/** Both kernel pairs on `c`: each against the reference, and the vec pair against the scalar one. */
function check(label: string, c: MoeSimCase & { act_: Act }): { vec: MoeSimResult; scalar: MoeSimResult } {
  const want = reference(c);
  const vec = runMoeSim('vec', c), scalar = runMoeSim('scalar', c);
  for (const [kind, got] of [['vec', vec], ['scalar', scalar]] as const) {
    for (let i = 0; i < want.hidden.length; i++) {
      const g = got.hidden[i]!, w = want.hidden[i]!;
      assert.ok(Math.abs(g - w) <= want.hiddenTol[i]!, `${label} ${kind}: hidden[${i}] = ${g}, want ${w} (tol ${want.hiddenTol[i]})`);
    }
    const out = decodeHalf(got.out, 'bf16');
    for (let i = 0; i < want.out.length; i++) {
      const g = out[i]!, w = want.out[i]!;
      const tol = BF16_OUT * Math.abs(w) + want.outTol[i]!;
      assert.ok(Math.abs(g - w) <= tol, `${label} ${kind}: out[${i}] = ${g}, want ${w} (tol ${tol})`);
    }
  }
  // the two f32 pairs: each within its bound of the reference, so within twice it of each other
  const vo = decodeHalf(vec.out, 'bf16'), so = decodeHalf(scalar.out, 'bf16');
  for (let i = 0; i < want.hidden.length; i++) {
    assert.ok(Math.abs(vec.hidden[i]! - scalar.hidden[i]!) <= 2 * want.hiddenTol[i]!,
      `${label}: hidden[${i}] vec ${vec.hidden[i]} vs scalar ${scalar.hidden[i]}`);
  }
  for (let i = 0; i < want.out.length; i++) {
    const tol = BF16_OUT * Math.max(Math.abs(vo[i]!), Math.abs(so[i]!)) + 2 * want.outTol[i]!;
    assert.ok(Math.abs(vo[i]! - so[i]!) <= tol, `${label}: out[${i}] vec ${vo[i]} vs scalar ${so[i]}`);
  }
  return { vec, scalar };
}

describe('CUDA MoE FFN kernels on the warp simulator', { skip: SKIP ?? false }, () => {
  it('k_moe_hidden_v / k_moe_down_v give the generic kernels\' outputs (f32 summation order aside) and the float64 ones', () => {
    const specs: Spec[] = [
      { T: 1, K: 1, E: 2, D: 8, I: 8, act: 'silu', seed: 1 },
      { T: 5, K: 2, E: 4, D: 24, I: 40, act: 'gelu_tanh', seed: 2 },
      // a decode token's 8 experts; D = a lane's 8 chunks in every lane and one more (2 passes); grid y
      // 1: one block row loops over all 8 pairs (hidden)
      { T: 1, K: 8, E: 10, D: 2056, I: 8, act: 'silu', gridY: 1, seed: 3 },
      // down: 3 x 97 = 291 chunks a row's stream (a full pass of 256 and 35); grid y 2 of 6 pairs
      { T: 2, K: 3, E: 6, D: 24, I: 776, act: 'silu', gridY: 2, seed: 4 },
      // down: 8 x 33 = 264 chunks, a pass and 8; 8 experts of 8 drawn with replacement a token
      { T: 2, K: 8, E: 8, D: 16, I: 264, act: 'gelu_tanh', gridY: 1, seed: 5 },
      { T: 3, K: 4, E: 5, D: 32, I: 24, act: 'silu', gridY: 2, seed: 9 },
      { T: 1, K: 8, E: 16, D: 64, I: 64, act: 'silu', seed: 6 },
    ];
    for (const s of specs) {
      const c = makeCase(s);
      const { vec, scalar } = check(`T=${s.T} K=${s.K} E=${s.E} D=${s.D} I=${s.I} ${s.act}`, c);
      assert.deepEqual([...vec.err], [0, 0, 0, 0]);
      assert.deepEqual([...scalar.err], [0, 0, 0, 0]);
    }
  });

  it('grouped by expert (k_moe_group, k_moe_hidden_g, k_moe_down_g, k_moe_combine): vec\'s hidden bits, the float64 outputs', () => {
    const specs: (Spec & { chunk?: number })[] = [
      // 16 tokens of 8 experts drawn from 10: most experts shared by many tokens (batches of 8 and a rest)
      { T: 16, K: 8, E: 10, D: 64, I: 32, act: 'silu', seed: 21 },
      // D over a lane's pass (2 passes), I over a lane's pass in down (776: 97 chunks); chunks of 3
      // tokens (5 passes, the last of 2); grid y capped at 2 (blocks loop over active experts)
      { T: 14, K: 2, E: 6, D: 2056, I: 776, act: 'gelu_tanh', gridY: 2, chunk: 3, seed: 22 },
      // one expert for everyone (one group of 40 pairs), and many experts, few used
      { T: 20, K: 2, E: 1, D: 16, I: 24, act: 'silu', seed: 23 },
      { T: 9, K: 4, E: 300, D: 24, I: 16, act: 'silu', seed: 24 },
    ];
    for (const s of specs) {
      const c = makeCase(s);
      c.chunk = s.chunk;
      const label = `grouped T=${s.T} K=${s.K} E=${s.E} D=${s.D} I=${s.I} chunk=${s.chunk ?? 'all'}`;
      const want = reference(c);
      const grouped = runMoeSim('grouped', c), vec = runMoeSim('vec', c);
      assert.deepEqual([...grouped.err], [0, 0, 0, 0], label);
      // a warp's 4 rows of k_moe_down_g4 and 2 of k_moe_hidden_g2 (the defaults) against one row: the same bits
      const oneRow = runMoeSim('grouped', { ...c, downRows: 1, hiddenRows: 1 });
      assert.deepEqual([...oneRow.hidden], [...grouped.hidden], `${label}: k_moe_hidden_g vs g2`);
      assert.deepEqual([...oneRow.out], [...grouped.out], `${label}: k_moe_down_g vs g4`);
      for (let i = 0; i < want.hidden.length; i++) {
        assert.ok(Object.is(grouped.hidden[i], vec.hidden[i]), `${label}: hidden[${i}] ${grouped.hidden[i]} vs vec ${vec.hidden[i]}`);
      }
      const out = decodeHalf(grouped.out, 'bf16');
      for (let i = 0; i < want.out.length; i++) {
        const tol = BF16_OUT * Math.abs(want.out[i]!) + want.outTol[i]!;
        assert.ok(Math.abs(out[i]! - want.out[i]!) <= tol, `${label}: out[${i}] = ${out[i]}, want ${want.out[i]} (tol ${tol})`);
      }
    }
    // bad experts in the second chunk: reported with the token's index in the whole input, zero rows, skipped
    const bad = makeCase({ T: 6, K: 2, E: 4, D: 16, I: 8, act: 'silu', seed: 25 });
    bad.chunk = 4;
    bad.experts.set([0, 1, 2, 3, 1, 1, 0, 2, 3, 7, 2, 2]); // token 4's second expert is 7 of 4
    const want = reference(bad), got = runMoeSim('grouped', bad);
    assert.deepEqual([...got.err], [6, 4, 7, 4]);
    assert.deepEqual([...got.hidden.subarray(9 * 8, 10 * 8)], new Array(8).fill(0), 'pair (4, 1)\'s hidden row');
    const out = decodeHalf(got.out, 'bf16');
    for (let i = 0; i < want.out.length; i++) {
      assert.ok(Math.abs(out[i]! - want.out[i]!) <= BF16_OUT * Math.abs(want.out[i]!) + want.outTol[i]!, `bad: out[${i}]`);
    }
  });

  it('grouped, gate/up and down on tensor cores (k_moe_hidden_tc, k_moe_down_tc): the float64 hidden values and outputs', () => {
    const specs: (Spec & { chunk?: number })[] = [
      // 40 pairs on 3 experts: tiles of 16 and a rest; D 72: two 32-column tiles and a partial one
      { T: 20, K: 2, E: 3, D: 72, I: 24, act: 'silu', seed: 31 },
      // I over a block's 64 rows (2 blocks, the second partial); chunks of 5 tokens; grid y capped
      { T: 11, K: 3, E: 5, D: 64, I: 136, act: 'gelu_tanh', gridY: 2, chunk: 5, seed: 32 },
      // D spanning many tiles, one pair an expert at most in places
      { T: 3, K: 2, E: 8, D: 520, I: 16, act: 'silu', seed: 33 },
    ];
    for (const s of specs) {
      const c = makeCase(s);
      c.chunk = s.chunk;
      const want = reference(c);
      for (const kind of ['grouped-tc', 'grouped-tc2'] as const) {
        const label = `${kind} T=${s.T} K=${s.K} E=${s.E} D=${s.D} I=${s.I} chunk=${s.chunk ?? 'all'}`;
        const got = runMoeSim(kind, c);
        assert.deepEqual([...got.err], [0, 0, 0, 0], label);
        for (let i = 0; i < want.hidden.length; i++) {
          const g = got.hidden[i]!, w = want.hidden[i]!;
          assert.ok(Math.abs(g - w) <= want.hiddenTol[i]!, `${label}: hidden[${i}] = ${g}, want ${w} (tol ${want.hiddenTol[i]})`);
        }
        const out = decodeHalf(got.out, 'bf16');
        for (let i = 0; i < want.out.length; i++) {
          // k_moe_down_tc rounds the hidden values to bf16 (2^-9 relative each): outTol / F32_DOT bounds sum |w down hidden|
          const bf16Hidden = kind === 'grouped-tc2' ? 2 ** -9 * (want.outTol[i]! / F32_DOT) : 0;
          const tol = BF16_OUT * Math.abs(want.out[i]!) + want.outTol[i]! + bf16Hidden;
          assert.ok(Math.abs(out[i]! - want.out[i]!) <= tol, `${label}: out[${i}] = ${out[i]}, want ${want.out[i]} (tol ${tol})`);
        }
      }
    }
  });

  it('an expert outside [0, E): error 6 (token, expert, E), its hidden row zeros, skipped in the sum; the others as usual', () => {
    const c = makeCase({ T: 3, K: 2, E: 4, D: 24, I: 16, act: 'silu', seed: 7 });
    c.experts.set([0, 1, 2, 5, 1, 1]); // token 1's second expert is 5 of 4; token 2 uses expert 1 twice
    const { vec, scalar } = check('one bad expert', c);
    for (const [kind, r] of [['vec', vec], ['scalar', scalar]] as const) {
      assert.deepEqual([...r.err], [6, 1, 5, 4], kind);
      assert.deepEqual([...r.hidden.subarray(3 * 16, 4 * 16)], new Array(16).fill(0), `${kind}: pair (1, 1)'s hidden row`);
    }
    // two bad pairs: one of them is reported
    const c2 = makeCase({ T: 2, K: 3, E: 5, D: 16, I: 24, act: 'gelu_tanh', gridY: 2, seed: 8 });
    c2.experts.set([4, -1, 0, 2, 3, 5]);
    const two = check('two bad experts', c2);
    for (const [kind, r] of [['vec', two.vec], ['scalar', two.scalar]] as const) {
      const [code, t, e, E] = [...r.err];
      assert.equal(code, 6, kind);
      assert.equal(E, 5, kind);
      assert.ok((t === 0 && e === -1) || (t === 1 && e === 5), `${kind}: reported token ${t} expert ${e}`);
    }
  });
});

/** float64 router: softmax over each row's E logits, the top K by logit (the first of equal values), optionally renormalised */
function routeReference(logits: Float32Array, T: number, E: number, K: number, renorm: boolean) {
  const experts = new Int32Array(T * K), weights = new Float64Array(T * K);
  for (let t = 0; t < T; t++) {
    const row = Array.from(logits.subarray(t * E, (t + 1) * E));
    const mx = Math.max(...row);
    const z = row.reduce((a, v) => a + Math.exp(v - mx), 0);
    const order = row.map((v, e) => [v, e] as const).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
    let sum = 0;
    for (let k = 0; k < K; k++) {
      experts[t * K + k] = order[k]![1];
      sum += weights[t * K + k] = Math.exp(order[k]![0] - mx) / z;
    }
    if (renorm) for (let k = 0; k < K; k++) weights[t * K + k]! /= sum;
  }
  return { experts, weights };
}

describe('CUDA MoE router on the warp simulator', { skip: SKIP ?? false }, () => {
  it('k_moe_route: a warp a token picks the float64 top K (ties to the lower index) and its softmax weights', () => {
    // E: a lane's single expert (8), experts past the last full pass (60), Qwen3's 128, two 64-bit
    // mask words' worth of passes (300: j up to 9), the most the host allows (2048: j up to 63); T
    // not a multiple of the block's 4 warps
    for (const [T, E, K, seed] of [[3, 8, 2, 1], [5, 60, 8, 2], [2, 128, 8, 3], [7, 300, 13, 4], [1, 2048, 64, 5]] as const) {
      const r = rng(seed);
      const logits = randomF32(r, T * E, 3);
      // ties: token 0's experts 1, E - 1 and one in another lane share the largest value; the
      // last token has a three-way tie below its top
      logits[1] = logits[E - 1] = logits[Math.min(E - 2, 34)] = 9;
      const last = (T - 1) * E;
      logits[last + 2] = logits[last + E - 3] = logits[last + Math.floor(E / 2)] = 3.5;
      for (const renorm of [false, true]) {
        const got = runRouteSim(logits, T, E, K, renorm);
        const want = routeReference(logits, T, E, K, renorm);
        const label = `T=${T} E=${E} K=${K} renorm=${renorm}`;
        assert.deepEqual([...got.experts], [...want.experts], `${label}: experts`);
        for (let i = 0; i < T * K; i++) {
          assert.ok(Math.abs(got.weights[i]! - want.weights[i]!) <= 1e-6 + 1e-5 * want.weights[i]!,
            `${label}: weight ${i} = ${got.weights[i]}, want ${want.weights[i]}`);
        }
      }
    }
  });
});

describe('when moeFfn groups by expert, and its scratch (shared with the fit planner)', () => {
  it('groups from groupedMinRows tokens (default 8; 0: never), up to 2048 experts; scratch for one pass of up to passRows tokens', () => {
    const moe = CUDA_DEFAULTS.moe;
    assert.equal(moe.groupedMinRows, 8, 'the default');
    assert.equal(moeRunsGrouped(7, 128, 8, moe), false);
    assert.equal(moeRunsGrouped(8, 128, 8, moe), true);
    assert.equal(moeRunsGrouped(8, 4096, 8, moe), false, 'k_moe_group holds 2048 experts');
    assert.equal(moeRunsGrouped(512, 128, 8, { groupedMinRows: 0 }), false);
    assert.equal(moe.passRows, 2048, 'the default pass length');
    assert.deepEqual(moeGroupedScratch(16, 8, 2048, 768, moe), [16 * 8 * 768 * 4, 16 * 8 * 2048 * 4, (2 + 3 * 128) * 4]);
    assert.deepEqual(moeGroupedScratch(8192, 8, 2048, 768, moe), [2048 * 8 * 768 * 4, 2048 * 8 * 2048 * 4, (2 + 3 * 16384) * 4]);
    // shorter passes ($LLMTS_CUDA_MOE_PASS_ROWS), less scratch
    assert.deepEqual(moeGroupedScratch(8192, 8, 2048, 768, { passRows: 256 }), [256 * 8 * 768 * 4, 256 * 8 * 2048 * 4, (2 + 3 * 2048) * 4]);
  });
});
