// The CUDA decode attention kernels, run on the CPU by the warp simulator (cuda-sim/), against a
// plain float64 attention on the same bf16 inputs. The CUDA-core kernels are verified on the
// H200 (cuda-ops.test.ts); their passing here is the simulator's own check. The tensor-core kernel
// (attention-decode-tc.ts) is checked here before any GPU has run it.
// Tolerance as cuda-ops.test.ts' bf16 fast paths: |sim - ref| <= 4e-3 + 1e-2 |ref|.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { planAttention, tcDecodeSlots } from '../../src/backends/cuda/attention.ts';
import { CUDA_DEFAULTS, type CudaAttentionSettings, cudaSettingsFrom } from '../../src/backends/cuda/cuda-settings.ts';
import { runAttentionSim, type SimCall, simUnavailable, tcSplitsSim } from './cuda-sim/attention-sim.ts';
import { randomF32, rng, scatteredBlockTables } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-attention-sim: skipping: ${SKIP}`);
/** a small simulated GPU: few slots, so splits, strides over tokens and the combine all happen */
const SIM_SMS = 2;
/** the backend's default attention settings, and with the CUDA-core decode kernel */
const ATT: CudaAttentionSettings = CUDA_DEFAULTS.attention;
const withDecode = (kind: 'cuda-core' | 'tc'): CudaAttentionSettings => ({ ...ATT, decodeKernel: kind });


interface Case {
  D: number; H: number; KVH: number; BS: number;
  /** per row: its first query token's position and how many tokens it has (one: decode) */
  rows: { start: number; count?: number }[];
  window?: number; softcap?: number; scale?: number; seed?: number;
  /** table entries to knock out (row, block): attending them reports error 4 */
  holes?: [number, number][];
  /** the layout promises one token a row (StepLayout.oneTokenPerRow; every row has count 1) */
  oneTokenPerRow?: boolean;
  /** added to every value (outputs near it rather than near 0: a wrong normalization shows) */
  vOffset?: number;
}

function build(c: Case): SimCall {
  const r = rng(c.seed ?? 7);
  const R = c.rows.length;
  const tokens = c.rows.flatMap((row, i) => Array.from({ length: row.count ?? 1 }, (_, k) => [i, row.start + k]));
  const T = tokens.length;
  const need = c.rows.map((row) => Math.floor((row.start + (row.count ?? 1) - 1) / c.BS) + 1);
  const MBR = Math.max(...need) + 1;
  const NB = need.reduce((a, b) => a + b, 0) + 2;
  const tables = scatteredBlockTables(r, need, MBR, NB);
  for (const [row, b] of c.holes ?? []) tables[row * MBR + b] = -1;
  return {
    T, H: c.H, KVH: c.KVH, D: c.D, NB, BS: c.BS, R, MBR, window: c.window ?? 0,
    scale: c.scale ?? 4 / Math.sqrt(c.D), softcap: c.softcap ?? 0,
    q: encodeHalf(randomF32(r, T * c.H * c.D, 2), 'bf16'),
    k: encodeHalf(randomF32(r, NB * c.BS * c.KVH * c.D), 'bf16'),
    v: encodeHalf(randomF32(r, NB * c.BS * c.KVH * c.D).map((x) => x + (c.vOffset ?? 0)), 'bf16'),
    rows: Int32Array.from(tokens, (t) => t[0]!), poss: Int32Array.from(tokens, (t) => t[1]!), tables,
  };
}

/** float64 attention of every token, keys read through the block tables (a hole: left out) */
function reference(s: SimCall): Float64Array {
  const out = new Float64Array(s.T * s.H * s.D);
  const G = s.H / s.KVH;
  for (let t = 0; t < s.T; t++) {
    const r = s.rows[t]!, p = s.poss[t]!;
    const start = s.window > 0 ? Math.max(0, p - s.window + 1) : 0;
    for (let h = 0; h < s.H; h++) {
      const kh = Math.floor(h / G);
      const scores: number[] = [], slots: number[] = [];
      for (let j = start; j <= p; j++) {
        const blk = s.tables[r * s.MBR + Math.floor(j / s.BS)]!;
        if (blk < 0) continue;
        const slot = blk * s.BS + (j % s.BS);
        let d = 0;
        for (let e = 0; e < s.D; e++) d += bf16ToF32(s.q[(t * s.H + h) * s.D + e]!) * bf16ToF32(s.k[(slot * s.KVH + kh) * s.D + e]!);
        let x = d * s.scale;
        if (s.softcap > 0) x = s.softcap * Math.tanh(x / s.softcap);
        scores.push(x);
        slots.push(slot);
      }
      const m = Math.max(...scores);
      const w = scores.map((x) => Math.exp(x - m));
      const L = w.reduce((a, b) => a + b, 0);
      for (let e = 0; e < s.D; e++) {
        let acc = 0;
        slots.forEach((slot, i) => (acc += w[i]! * bf16ToF32(s.v[(slot * s.KVH + kh) * s.D + e]!)));
        out[(t * s.H + h) * s.D + e] = L > 0 ? acc / L : 0;
      }
    }
  }
  return out;
}

function check(label: string, c: Case, kind: 'cuda-core' | 'tc', expectErr?: number, sms = SIM_SMS,
  defines: readonly string[] = [], stages?: number): void {
  const s = build(c);
  const plan = planAttention({ T: s.T, H: s.H, KVH: s.KVH, D: s.D, numBlocks: s.NB, blockSize: s.BS, R: s.R,
    maxBlocksPerRow: s.MBR, window: s.window, qDtype: 'bf16', poolDtype: 'bf16', oneTokenPerRow: c.oneTokenPerRow }, sms,
  { ...withDecode(kind), ...(stages ? { tcStages: stages } : {}) });
  assert.equal(plan.tensorCores, kind === 'tc', `${label}: the plan picked ${plan.decodeKernel}`);
  const { out, err, countersLeft } = runAttentionSim(s, plan, defines, stages);
  assert.equal(err[0], expectErr ?? 0, `${label}: error word ${[...err].join(', ')}`);
  assert.equal(plan.fusedCombine, kind === 'tc' && plan.slots >= 2, `${label}: the tensor-core kernel merges its own splits`);
  assert.equal(countersLeft, 0, `${label}: every split counter is back to 0`);
  const want = reference(s);
  const got = decodeHalf(out, 'bf16');
  let worst = 0, at = -1;
  for (let i = 0; i < want.length; i++) {
    // (a NaN, e.g. from a tile read before its copies landed, fails: it compares false)
    const diff = Math.abs(got[i]! - want[i]!), excess = Number.isNaN(diff) ? Infinity : diff - (4e-3 + 1e-2 * Math.abs(want[i]!));
    if (excess > worst) [worst, at] = [excess, i];
  }
  assert.ok(at < 0, `${label} (${plan.decodeKernel}, ${plan.slots} slots): element ${at} (token ${Math.floor(at / (s.H * s.D))}, ` +
    `head ${Math.floor(at / s.D) % s.H}, dim ${at % s.D}) is ${got[at]}, want ${want[at]}`);
}

describe('CUDA decode attention kernels on the warp simulator', { skip: SKIP ?? false }, () => {
  const cases: [string, Case][] = [
    ['GQA 4, head dim 128, contexts 1..300', { D: 128, H: 8, KVH: 2, BS: 16, rows: [0, 16, 299, 64, 65].map((start) => ({ start })) }],
    ['GQA 8, head dim 64, block size 12, a window', { D: 64, H: 8, KVH: 1, BS: 12, rows: [200, 11, 12].map((start) => ({ start })), window: 37, seed: 3 }],
    ['GQA 2, head dim 128, soft-capping', { D: 128, H: 4, KVH: 2, BS: 16, rows: [150, 3].map((start) => ({ start })), softcap: 5, scale: 0.35, seed: 4 }],
    ['GQA 16, head dim 64, one row', { D: 64, H: 16, KVH: 1, BS: 16, rows: [{ start: 96 }], seed: 5 }],
    ['MHA (GQA 1), head dim 64, block size 1', { D: 64, H: 2, KVH: 2, BS: 1, rows: [40, 0].map((start) => ({ start })), seed: 6 }],
  ];
  for (const kind of ['cuda-core', 'tc'] as const) {
    it(`${kind}: ${cases.map(([l]) => l).join('; ')}`, () => {
      for (const [label, c] of cases) check(`${kind} ${label}`, c, kind);
    });
  }

  it('prefill on tensor cores beside decode rows (the GPU-verified prefill kernel: the simulator\'s own check of ldmatrix and mma)', () => {
    for (const kind of ['cuda-core', 'tc'] as const) {
      check(`${kind} mixed`, { D: 128, H: 8, KVH: 2, BS: 16, rows: [{ start: 0, count: 70 }, { start: 90 }, { start: 40, count: 30 }, { start: 5 }], seed: 10 }, kind);
      check(`${kind} prefill d64 window`, { D: 64, H: 4, KVH: 1, BS: 16, rows: [{ start: 20, count: 50 }, { start: 7 }], window: 24, seed: 11 }, kind);
    }
  });

  it('prefill: long enough that the key / value ring wraps (4-9 tiles), head dims 64/128/256, a missing block', () => {
    check('prefill d128 4 tiles', { D: 128, H: 4, KVH: 1, BS: 16, rows: [{ start: 180, count: 75 }], seed: 12 }, 'tc');
    check('prefill d256 5 tiles', { D: 256, H: 2, KVH: 1, BS: 16, rows: [{ start: 100, count: 40 }], seed: 13 }, 'cuda-core');
    check('prefill d64 a hole', { D: 64, H: 2, KVH: 1, BS: 16, rows: [{ start: 150, count: 20 }], holes: [[0, 3]], seed: 14 }, 'tc', 4);
  });

  it('tc: one long row on a bigger simulated GPU, 20 splits (the merge: 2 chunks of up to 18 splits through shared memory, 4 heads x 64 dims)', () => {
    // 16 SMs: 48 resident blocks, so one row of one kv head may take up to 96 splits of >= 128 keys
    const c: Case = { D: 64, H: 4, KVH: 1, BS: 16, rows: [{ start: 2559 }], seed: 12 };
    const s = build(c);
    const plan = planAttention({ T: s.T, H: s.H, KVH: s.KVH, D: s.D, numBlocks: s.NB, blockSize: s.BS, R: s.R,
      maxBlocksPerRow: s.MBR, window: s.window, qDtype: 'bf16', poolDtype: 'bf16' }, 16, ATT);
    // att_tc_splits: 80 tiles, round(sqrt(80 / 6.5)) = 4 tiles a split
    assert.ok(plan.slots >= 20, `${plan.slots} slots: the case must split its 2,560 keys 20 ways (128 keys each)`);
    check('tc long row', c, 'tc', undefined, 16);
  });

  it('tc: one row split 131 ways on a 64-SM simulated GPU, 16 heads (the merge: 33 chunks of 4 splits through shared memory folded online, two float4 columns a thread)', () => {
    const c: Case = { D: 64, H: 16, KVH: 1, BS: 16, rows: [{ start: 16700 }], seed: 13, vOffset: 1 }; // 16 heads x 64 dims: 256 float4 columns, two a thread
    const s = build(c);
    const plan = planAttention({ T: s.T, H: s.H, KVH: s.KVH, D: s.D, numBlocks: s.NB, blockSize: s.BS, R: s.R,
      maxBlocksPerRow: s.MBR, window: s.window, qDtype: 'bf16', poolDtype: 'bf16' }, 64, ATT);
    // a tile worth 1000 partials: the shortest splits the slots allow (173 slots: 4 tiles each, 131 splits)
    assert.ok(plan.slots >= 131, `${plan.slots} slots: the case must split its 16,701 keys 131 ways (128 keys each)`);
    check('tc 131 splits', c, 'tc', undefined, 64, ['ATT_TC_TILE_RATIO10=10000']);
  });

  it('tc splits (att_tc_splits): whole 32-key tiles, round(sqrt(tiles / 6.5)) a split, at least 2 tiles, at most the slots\' splits', () => {
    const cases: [number, number][] = [
      [512, 13], // 16 tiles: 2 a split
      [513, 13], // 17 tiles: 2 a split, the last split 1 key
      [1024, 45], // 32 tiles: round(2.22) = 2
      [2048, 45], // 64 tiles: round(3.14) = 3
      [4096, 45], // 128 tiles: round(4.44) = 4
      [16384, 45], // 512 tiles: 9 a split would be 57 splits, over 45: 12 tiles (384 keys), 43 splits
      [100, 45], // 4 tiles: round(0.78) = 1, raised to the default tcMinChunk's 2
      [16, 45], // one tile: one split
      [0, 45], // no keys: one (empty) split
      [4096, 1], // one slot: one split of every key
    ];
    assert.deepEqual(tcSplitsSim(cases), [[8, 64], [9, 64], [16, 64], [22, 96], [32, 128], [43, 384], [2, 64], [1, 64], [1, 64], [1, 4096]]);
    // a tile worth 1000 partials: splits as short as tcMinChunk allows; 0.1 partial: round(sqrt(160)) = 13 tiles a split
    assert.deepEqual(tcSplitsSim([[512, 45], [16701, 173]], ['ATT_TC_TILE_RATIO10=10000']), [[8, 64], [131, 128]]);
    assert.deepEqual(tcSplitsSim([[512, 45]], ['ATT_TC_TILE_RATIO10=1']), [[2, 416]]);
  });

  it('tc with ATT_TC_EARLY=0 (its first reads after the PDL wait; the default reads them before it): the same results, holes and many rows', () => {
    const early = ['ATT_TC_EARLY=0'];
    for (const [label, c] of cases) check(`early ${label}`, c, 'tc', undefined, SIM_SMS, early);
    check('early 40 rows', { D: 128, H: 8, KVH: 2, BS: 16, rows: Array.from({ length: 40 }, (_, i) => ({ start: (i * 13) % 90 })), seed: 8 },
      'tc', undefined, SIM_SMS, early);
    check('early hole', { D: 128, H: 4, KVH: 1, BS: 16, rows: [100, 50].map((start) => ({ start })), holes: [[0, 2]], seed: 9 }, 'tc', 4,
      SIM_SMS, early);
    check('early 150 rows (the plan kernel)', { D: 64, H: 4, KVH: 2, BS: 16, rows: Array.from({ length: 150 }, (_, i) => ({ start: (i * 7) % 60 })),
      seed: 13 }, 'tc', undefined, SIM_SMS, early);
  });

  it('tc with ATT_TC_PHASES=1 (the phase counters compiled in), alone, with early reads and with ATT_TC_SYNC=0 (every thread fences): the same results, splits merged and not', () => {
    for (const defines of [['ATT_TC_PHASES=1'], ['ATT_TC_PHASES=1', 'ATT_TC_EARLY=0'], ['ATT_TC_PHASES=1', 'ATT_TC_SYNC=0']]) {
      for (const [label, c] of cases) check(`${defines.join(' ')} ${label}`, c, 'tc', undefined, SIM_SMS, defines);
      check(`${defines.join(' ')} 40 rows`, { D: 128, H: 8, KVH: 2, BS: 16, rows: Array.from({ length: 40 }, (_, i) => ({ start: (i * 13) % 90 })),
        seed: 8 }, 'tc', undefined, SIM_SMS, defines);
    }
  });

  it('tc with a ring of 3 and 4 stages (3 or 4 tiles in flight; fewer tiles than stages; a hole; early reads): the same results', () => {
    for (const stages of [3, 4]) {
      for (const [label, c] of cases) check(`${stages} stages ${label}`, c, 'tc', undefined, SIM_SMS, [], stages);
      check(`${stages} stages 40 rows`, { D: 128, H: 8, KVH: 2, BS: 16, rows: Array.from({ length: 40 }, (_, i) => ({ start: (i * 13) % 90 })),
        seed: 8 }, 'tc', undefined, SIM_SMS, [], stages);
      check(`${stages} stages hole`, { D: 128, H: 4, KVH: 1, BS: 16, rows: [100, 50].map((start) => ({ start })), holes: [[0, 2]], seed: 9 },
        'tc', 4, SIM_SMS, [], stages);
      check(`${stages} stages early`, { D: 64, H: 16, KVH: 1, BS: 16, rows: [{ start: 96 }, { start: 2 }], seed: 14 }, 'tc', undefined,
        SIM_SMS, ['ATT_TC_EARLY=0'], stages);
    }
  });

  it('tc with a one-token-a-row layout: every token in order, no list made (no k_attn_plan past 128 rows); holes; early reads', () => {
    const one = (c: Case): Case => ({ ...c, oneTokenPerRow: true });
    for (const [label, c] of cases) check(`one token a row ${label}`, one(c), 'tc');
    const many = one({ D: 64, H: 4, KVH: 2, BS: 16, rows: Array.from({ length: 150 }, (_, i) => ({ start: (i * 7) % 60 })), seed: 13 });
    const s = build(many);
    const plan = planAttention({ T: s.T, H: s.H, KVH: s.KVH, D: s.D, numBlocks: s.NB, blockSize: s.BS, R: s.R, maxBlocksPerRow: s.MBR,
      window: 0, qDtype: 'bf16', poolDtype: 'bf16', oneTokenPerRow: true }, SIM_SMS, ATT);
    assert.ok(plan.identityList && !plan.planKernel && !plan.prefillKernel, '150 rows: no plan kernel, no prefill kernel');
    check('one token a row, 150 rows', many, 'tc');
    check('one token a row, hole', one({ D: 128, H: 4, KVH: 1, BS: 16, rows: [100, 50].map((start) => ({ start })), holes: [[0, 2]], seed: 9 }),
      'tc', 4);
    check('one token a row, early', one({ D: 128, H: 8, KVH: 2, BS: 16, rows: [0, 16, 299].map((start) => ({ start })), seed: 15 }), 'tc',
      undefined, SIM_SMS, ['ATT_TC_EARLY=0']);
  });

  it('cuda-core and tc: more decode tokens than slots (each slot strides over tokens), and a missing block reports error 4', () => {
    const many: Case = { D: 128, H: 8, KVH: 2, BS: 16, rows: Array.from({ length: 40 }, (_, i) => ({ start: (i * 13) % 90 })), seed: 8 };
    for (const kind of ['cuda-core', 'tc'] as const) {
      check(`${kind} 40 rows`, many, kind);
      check(`${kind} hole`, { D: 128, H: 4, KVH: 1, BS: 16, rows: [100, 50].map((start) => ({ start })), holes: [[0, 2]], seed: 9 }, kind, 4);
    }
  });
});

describe('the prefill kernel in the plan (planAttention)', () => {
  const shape = { T: 16, H: 32, KVH: 8, D: 128, numBlocks: 64, blockSize: 16, R: 16, maxBlocksPerRow: 8, window: 0,
    qDtype: 'bf16', poolDtype: 'bf16' } as const;
  it('past ATT_DEC_MAX_RUN tokens, unless the layout promises one token a row (a decode graph)', () => {
    assert.equal(planAttention(shape, 132, ATT).prefillKernel, 'k_attn_prefill_d128');
    assert.equal(planAttention({ ...shape, T: 4 }, 132, ATT).prefillKernel, undefined);
    const decodeOnly = planAttention({ ...shape, oneTokenPerRow: true }, 132, ATT);
    assert.equal(decodeOnly.prefillKernel, undefined);
    assert.equal(decodeOnly.prefillTiles, 0);
    assert.equal(decodeOnly.decodeKernel, 'k_attn_decode_tc_d128');
    assert.ok(decodeOnly.identityList, 'the tensor-core kernel takes every token in order');
    assert.ok(!planAttention(shape, 132, ATT).identityList);
    // past 128 rows: k_attn_plan lists the decode tokens, unless one token a row makes the list every token
    assert.ok(planAttention({ ...shape, T: 200, R: 200 }, 132, ATT).planKernel);
    assert.ok(!planAttention({ ...shape, T: 200, R: 200, oneTokenPerRow: true }, 132, ATT).planKernel);
    // the CUDA-core kernel (its k_attn_combine reads a stored list) never takes the identity
    const cc = planAttention({ ...shape, T: 200, R: 200, oneTokenPerRow: true }, 132, withDecode('cuda-core'));
    assert.ok(!cc.identityList && cc.planKernel && !cc.prefillKernel);
  });
});

describe('tensor-core decode slots (tcDecodeSlots: whole waves of 3 resident blocks an SM)', () => {
  // the H200's 132 SMs, Llama-3.1-8B's 8 kv heads: a wave is 396 blocks
  const slots = (T: number, maxSplits: number) => tcDecodeSlots(T, 8, maxSplits, 132, ATT.tcResident);
  it('one row: enough splits to fill a wave to 90%, no more than its keys allow', () => {
    assert.equal(slots(1, 128), 45); // 360 blocks: 0.91 of a wave
    assert.equal(slots(1, 32), 32); // a 4k table at 128 keys a split
    assert.equal(slots(1, 1), 1);
  });
  it('8 rows: one wave; 32 rows: two full waves rather than 0.65 of one', () => {
    assert.equal(slots(8, 128), 48); // 6 splits: 384 blocks
    assert.equal(slots(32, 128), 96); // 3 splits: 768 blocks, 1.94 waves
  });
  it('many rows: a slot a token, capped at 8 waves of slots', () => {
    assert.equal(slots(128, 128), 128);
    assert.equal(slots(256, 128), 256);
    assert.equal(slots(8192, 128), 400);
  });
  it('$LLMTS_CUDA_ATT_TC_MIN_CHUNK: a multiple of 32 from 32 to 1024 (default 64), not through $LLMTS_CUDA_ATT_DEFINES', () => {
    const chunk = (v?: string, defines?: string) =>
      cudaSettingsFrom({ LLMTS_CUDA_ATT_TC_MIN_CHUNK: v, LLMTS_CUDA_ATT_DEFINES: defines }).attention.tcMinChunk;
    assert.equal(chunk(), 64);
    assert.equal(chunk(''), 64);
    assert.equal(chunk('32', 'ATT_TC_EARLY=1'), 32);
    assert.equal(chunk('1024'), 1024);
    for (const bad of ['16', '48', '2048', 'x', '64.5']) assert.throws(() => chunk(bad), /LLMTS_CUDA_ATT_TC_MIN_CHUNK must be a multiple of 32 from 32 to 1024/);
    assert.throws(() => chunk(undefined, 'ATT_TC_EARLY=1,ATT_TC_MIN_CHUNK=32'), /use LLMTS_CUDA_ATT_TC_MIN_CHUNK/);
  });
});
