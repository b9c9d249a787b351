// Batch-invariant mode's attention (CudaSettings.batchInvariant) on the warp simulator (cuda-sim/):
// the kernels' own source, compiled on the CPU, launched as attention.ts plans them. A query's
// output must be bitwise the same whatever else its call holds: alone or beside other rows, as a
// decode token (the tensor-core decode kernel, split at multiples of invariantChunk key positions)
// or inside a prefill chunk of any size (k_attn_prefill_bi_d<D>), on simulated GPUs of different
// sizes (other slot counts) and block tables of other widths. Each output is also checked against
// a float64 attention, and the default mode is shown to differ on the same calls (so the
// comparison sees a difference where there is one).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { bf16ToF32, decodeHalf, encodeHalf } from '../../src/backends/common/half.ts';
import { planAttention } from '../../src/backends/cuda/attention.ts';
import { CUDA_DEFAULTS, type CudaAttentionSettings } from '../../src/backends/cuda/cuda-settings.ts';
import { runAttentionSim, type SimCall, simUnavailable } from './cuda-sim/attention-sim.ts';
import { randomF32, rng, scatteredBlockTables } from './helpers.ts';

const SKIP = simUnavailable();
if (SKIP) console.log(`# cuda-batch-invariant-sim: skipping: ${SKIP}`);

/** Sequences of known keys, values and queries: a call takes any of their (row, position) tokens. */
interface World {
  D: number; H: number; KVH: number; BS: number; NB: number; window: number; softcap: number; scale: number;
  /** each row's length (positions 0 .. len - 1 have keys, values and a query) */
  lens: number[];
  /** per row, its blocks (scattered over the pool) */
  blocks: number[][];
  k: Uint16Array; v: Uint16Array;
  /** the query of (row, position): [H, D] bf16 bits */
  q: Uint16Array[][];
}

function world(o: { D: number; H: number; KVH: number; BS: number; lens: number[]; window?: number; softcap?: number; seed: number }): World {
  const r = rng(o.seed);
  const need = o.lens.map((n) => Math.ceil(n / o.BS));
  const NB = need.reduce((a, b) => a + b, 0) + 3;
  const width = Math.max(...need);
  const tables = scatteredBlockTables(r, need, width, NB);
  const blocks = need.map((n, row) => Array.from(tables.subarray(row * width, row * width + n)));
  const pool = NB * o.BS * o.KVH * o.D;
  return {
    D: o.D, H: o.H, KVH: o.KVH, BS: o.BS, NB, window: o.window ?? 0, softcap: o.softcap ?? 0, scale: 4 / Math.sqrt(o.D),
    lens: o.lens, blocks,
    k: encodeHalf(randomF32(r, pool), 'bf16'),
    v: encodeHalf(randomF32(r, pool).map((x) => x + 0.5), 'bf16'),
    q: o.lens.map((n) => Array.from({ length: n }, () => encodeHalf(randomF32(r, o.H * o.D, 2), 'bf16'))),
  };
}

/** A call of `tokens` ([row, position], in this order) with block tables `width` blocks wide (at least what the rows need). */
function call(w: World, tokens: readonly (readonly [number, number])[], width?: number): SimCall {
  const MBR = width ?? Math.max(...w.blocks.map((b) => b.length));
  const R = w.lens.length;
  const tables = new Int32Array(R * MBR).fill(-1);
  w.blocks.forEach((b, row) => tables.set(b, row * MBR));
  const q = new Uint16Array(tokens.length * w.H * w.D);
  tokens.forEach(([row, p], t) => q.set(w.q[row]![p]!, t * w.H * w.D));
  return {
    T: tokens.length, H: w.H, KVH: w.KVH, D: w.D, NB: w.NB, BS: w.BS, R, MBR, window: w.window, scale: w.scale, softcap: w.softcap,
    q, k: w.k, v: w.v, rows: Int32Array.from(tokens, (t) => t[0]), poss: Int32Array.from(tokens, (t) => t[1]), tables,
  };
}

/** Tokens [from, to) of a row. */
const run = (row: number, from: number, to: number): [number, number][] => Array.from({ length: to - from }, (_, i) => [row, from + i]);

/**
 * The kernels' outputs as a 16-bit hash of each f32 (ATT_OUT_PACK2): rounded to bf16, a difference
 * of a few f32 ulps mostly vanishes; hashed, it shows.
 */
const F32_PROBE = 'ATT_OUT_PACK2(lo,hi)=(((__float_as_uint(lo)^(__float_as_uint(lo)>>16))&0xffffu)|' +
  '(((__float_as_uint(hi)^(__float_as_uint(hi)>>16))&0xffffu)<<16))';

/**
 * Runs a call as batch-invariant mode (or the default, `invariant` false) plans it; each token's
 * output by "row:position": bf16 bits, or with `probe` every f32 bit hashed (F32_PROBE).
 */
function attend(w: World, tokens: readonly (readonly [number, number])[], att: CudaAttentionSettings, o: { sms?: number; width?: number;
  oneTokenPerRow?: boolean; invariant?: boolean; probe?: boolean } = {}): Map<string, Uint16Array> {
  const s = call(w, tokens, o.width);
  const invariant = o.invariant ?? true;
  const plan = planAttention({ T: s.T, H: s.H, KVH: s.KVH, D: s.D, numBlocks: s.NB, blockSize: s.BS, R: s.R, maxBlocksPerRow: s.MBR,
    window: s.window, qDtype: 'bf16', poolDtype: 'bf16', oneTokenPerRow: o.oneTokenPerRow }, o.sms ?? 2, att, invariant);
  const { out, err, countersLeft } = runAttentionSim(s, plan, o.probe ? [F32_PROBE] : [], att.tcStages, invariant ? att : undefined);
  assert.deepEqual([...err], [0, 0, 0, 0], 'no error reported');
  assert.equal(countersLeft, 0, 'every split counter is back to 0');
  const per = w.H * w.D;
  return new Map(tokens.map(([row, p], t) => [`${row}:${p}`, out.slice(t * per, (t + 1) * per)]));
}

/** float64 attention of (row, position): [H, D] */
function reference(w: World, row: number, p: number): Float64Array {
  const out = new Float64Array(w.H * w.D);
  const G = w.H / w.KVH;
  const start = w.window > 0 ? Math.max(0, p - w.window + 1) : 0;
  const q = w.q[row]![p]!;
  for (let h = 0; h < w.H; h++) {
    const kh = Math.floor(h / G);
    const slots: number[] = [], scores: number[] = [];
    for (let j = start; j <= p; j++) {
      const slot = w.blocks[row]![Math.floor(j / w.BS)]! * w.BS + (j % w.BS);
      let d = 0;
      for (let e = 0; e < w.D; e++) d += bf16ToF32(q[h * w.D + e]!) * bf16ToF32(w.k[(slot * w.KVH + kh) * w.D + e]!);
      let x = d * w.scale;
      if (w.softcap > 0) x = w.softcap * Math.tanh(x / w.softcap);
      scores.push(x);
      slots.push(slot);
    }
    const m = Math.max(...scores);
    const e = scores.map((x) => Math.exp(x - m));
    const L = e.reduce((a, b) => a + b, 0);
    for (let d = 0; d < w.D; d++) {
      let acc = 0;
      slots.forEach((slot, i) => (acc += e[i]! * bf16ToF32(w.v[(slot * w.KVH + kh) * w.D + d]!)));
      out[h * w.D + d] = acc / L;
    }
  }
  return out;
}

/**
 * Runs every call and requires each token's output to be the same in all of them, every f32 bit
 * (F32_PROBE), and its bf16 output, the first time it is seen, close to the float64 attention;
 * returns how many (token, call) outputs were compared.
 */
function sameEverywhere(label: string, w: World, att: CudaAttentionSettings,
  calls: { what: string; tokens: [number, number][]; sms?: number; width?: number; oneTokenPerRow?: boolean }[]): number {
  const first = new Map<string, { bits: Uint16Array; what: string }>();
  let compared = 0;
  for (const c of calls) {
    const fresh = c.tokens.filter(([row, p]) => !first.has(`${row}:${p}`));
    if (fresh.length > 0) {
      for (const [token, bits] of attend(w, c.tokens, att, c)) {
        const [row, p] = token.split(':').map(Number) as [number, number];
        if (first.has(token)) continue;
        const want = reference(w, row, p), got = decodeHalf(bits, 'bf16');
        for (let i = 0; i < want.length; i++) {
          assert.ok(Math.abs(got[i]! - want[i]!) <= 4e-3 + 1e-2 * Math.abs(want[i]!),
            `${label}, ${c.what}: token ${token} element ${i} is ${got[i]}, want ${want[i]}`);
        }
      }
    }
    for (const [token, bits] of attend(w, c.tokens, att, { ...c, probe: true })) {
      const seen = first.get(token);
      if (!seen) {
        first.set(token, { bits, what: c.what });
        continue;
      }
      const at = bits.findIndex((b, i) => b !== seen.bits[i]);
      assert.equal(at, -1, `${label}: token ${token} element ${at}: ${c.what} gives f32 hash ${bits[at]?.toString(16)}, ` +
        `${seen.what} gave ${seen.bits[at]?.toString(16)}`);
      compared++;
    }
  }
  return compared;
}

const BI = (chunk: number): CudaAttentionSettings => ({ ...CUDA_DEFAULTS.attention, invariantChunk: chunk });

describe('batch-invariant attention on the warp simulator', { skip: SKIP ?? false }, () => {
  it('head dim 128, GQA 4: a prompt whole, in chunks (tails of 1-3 tokens go to the decode kernel), beside other rows, decode tokens alone and together, on 1-8 SMs and wider tables: the same bits', () => {
    const w = world({ D: 128, H: 8, KVH: 2, BS: 16, lens: [300, 151, 41], seed: 21 });
    const att = BI(64);
    const n = sameEverywhere('d128', w, att, [
      { what: 'row 0 whole', tokens: run(0, 0, 300) },
      { what: 'row 0 in chunks 0-97', tokens: run(0, 0, 97) },
      { what: 'chunk 97-297 beside row 1 whole and row 2 at 40', tokens: [...run(1, 0, 151), ...run(0, 97, 297), [2, 40]] },
      { what: 'a 3-token tail (decode kernel)', tokens: run(0, 297, 300) },
      { what: 'a 1-token tail beside a 2-token run', tokens: [[0, 299], ...run(1, 149, 151)] },
      { what: 'decode tokens of each row, one a row', tokens: [[0, 299], [1, 150], [2, 40]], oneTokenPerRow: true },
      { what: 'decode alone on 1 SM', tokens: [[0, 299]], sms: 1 },
      { what: 'decode alone on 8 SMs, a 40-block table', tokens: [[0, 299]], sms: 8, width: 40 },
      { what: 'row 1 in chunks of 5 beside row 0', tokens: [...run(1, 145, 151), ...run(0, 290, 295)] },
      { what: 'row 2 whole on 8 SMs', tokens: run(2, 0, 41), sms: 8 },
    ]);
    assert.ok(n > 300, `${n} outputs compared`);
  });

  it('head dim 64, GQA 8, a 37-token window, block size 12, splits of 32 keys (windows start between tiles): the same bits', () => {
    const w = world({ D: 64, H: 8, KVH: 1, BS: 12, lens: [200, 70], window: 37, seed: 22 });
    const att = BI(32);
    sameEverywhere('d64 window', w, att, [
      { what: 'row 0 whole', tokens: run(0, 0, 200) },
      { what: 'row 0 in chunks of 7 and 2', tokens: [...run(0, 100, 107), ...run(1, 68, 70)] },
      { what: 'decode tokens', tokens: [[0, 199], [1, 69], [0, 150]], sms: 4 },
      { what: 'row 1 whole beside row 0 chunk', tokens: [...run(0, 180, 200), ...run(1, 0, 70)] },
      { what: 'row 0 one token at a time', tokens: [[0, 107]], sms: 1 },
    ]);
  });

  it('head dim 128, GQA 2, soft-capping, splits of 96 keys: the same bits', () => {
    const w = world({ D: 128, H: 4, KVH: 2, BS: 16, lens: [260, 9], softcap: 5, seed: 23 });
    sameEverywhere('softcap', w, BI(96), [
      { what: 'row 0 whole', tokens: run(0, 0, 260) },
      { what: 'decode', tokens: [[0, 259], [1, 8], [0, 191], [0, 192]], sms: 3 },
      { what: 'row 1 whole beside a chunk', tokens: [...run(1, 0, 9), ...run(0, 185, 200)] },
    ]);
  });

  it('the default mode differs on the same calls: its decode splits and prefill sums are not the prefill kernel\'s', () => {
    const w = world({ D: 128, H: 8, KVH: 2, BS: 16, lens: [300], seed: 21 });
    const whole = attend(w, run(0, 0, 300), CUDA_DEFAULTS.attention, { invariant: false, probe: true });
    const tail = attend(w, run(0, 297, 300), CUDA_DEFAULTS.attention, { invariant: false, probe: true });
    const differ = [...tail].filter(([token, bits]) => bits.some((b, i) => b !== whole.get(token)![i]));
    assert.ok(differ.length > 0, 'some tail token differs between the decode and the prefill kernel');
  });
});
