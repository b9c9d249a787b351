// Cases for on-device sampling tests (the reference backend here, CUDA in test/backends): random
// logit rows, every parameter combination, histories, masks and uniforms, with the host sampler's
// answer for each and how close the case sits to a rounding boundary.
import { TokenHistory } from '../../src/sampling/history.ts';
import { type SamplingParams, type SamplingParamsInput } from '../../src/sampling/params.ts';
import { sampleRow } from '../../src/sampling/sample-row.ts';
import { processLogits } from '../../src/sampling/sampler.ts';
import { assertValidSamplingParams } from '../../src/sampling/validate.ts';
import { deviceSampleRow } from '../../src/sampling/device-sampling.ts';
import assert from 'node:assert/strict';

import type { Backend } from '../../src/contracts/backend.ts';
import { decodeSampleResults, type DeviceSample, type DeviceSampleRow } from '../../src/contracts/device-sampling.ts';
import { topLogprobs } from '../../src/sampling/logprobs.ts';
import { testRandom } from './reference.ts';

export interface Case {
  label: string;
  raw: Float32Array;
  params: SamplingParams;
  history: TokenHistory;
  mask?: Int32Array;
  u: number;
  topLogprobs?: number;
}

/** Roughly normal logits (sd `scale`), never all equal. `quantum` > 0 rounds them (many ties). */
export function normalLogits(V: number, seed: number, scale = 3, quantum = 0): Float32Array {
  const r = testRandom(seed);
  const out = new Float32Array(V);
  for (let i = 0; i < V; i++) {
    const g = Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
    out[i] = quantum > 0 ? Math.round((scale * g) / quantum) * quantum : scale * g;
  }
  if (out.every((v) => v === out[0])) out[0] += 1;
  return out;
}

/** Rounds to bf16 (round to nearest even), as the CUDA backend's activations are. */
export function toBf16(x: Float32Array): Float32Array {
  const u = new Uint32Array(x.buffer.slice(x.byteOffset, x.byteOffset + x.byteLength));
  for (let i = 0; i < u.length; i++) u[i] = ((u[i]! + 0x7fff + ((u[i]! >>> 16) & 1)) >>> 16) << 16;
  return new Float32Array(u.buffer);
}

interface Combo {
  label: string;
  params: (V: number, raw: Float32Array) => SamplingParamsInput;
  mask?: boolean;
  topLogprobs?: number;
}

const argmaxOf = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);
const bias = (V: number, raw: Float32Array): Record<number, number> => ({
  [argmaxOf(raw)]: -100, [Math.floor(V / 3)]: 4.5, [V - 1]: 0.3, [Math.floor(V / 7)]: -1.25,
});

export const COMBOS: Combo[] = [
  { label: 'greedy', params: () => ({ temperature: 0 }) },
  { label: 'greedy + logprobs', params: () => ({ temperature: 0 }), topLogprobs: 3 },
  { label: 'temperature 1', params: () => ({}) },
  { label: 'temperature 0.6 + logprobs 0', params: () => ({ temperature: 0.6 }), topLogprobs: 0 },
  { label: 'temperature 1.7', params: () => ({ temperature: 1.7 }) },
  { label: 'top-k 1', params: () => ({ topK: 1 }) },
  { label: 'top-k 7', params: () => ({ topK: 7 }) },
  { label: 'top-k 40, T 0.8, logprobs 20', params: () => ({ topK: 40, temperature: 0.8 }), topLogprobs: 20 },
  { label: 'top-p 0.9', params: () => ({ topP: 0.9 }) },
  { label: 'top-p 0.5, T 0.6', params: () => ({ topP: 0.5, temperature: 0.6 }) },
  { label: 'top-p 0.995, T 1.3', params: () => ({ topP: 0.995, temperature: 1.3 }) },
  { label: 'min-p 0.05', params: () => ({ minP: 0.05 }) },
  { label: 'min-p 0.3, T 1.5', params: () => ({ minP: 0.3, temperature: 1.5 }) },
  { label: 'top-k + top-p + min-p', params: () => ({ topK: 50, topP: 0.9, minP: 0.02 }) },
  { label: 'top-k + top-p', params: () => ({ topK: 20, topP: 0.7, temperature: 0.9 }) },
  { label: 'repetition', params: () => ({ repetitionPenalty: 1.3 }) },
  { label: 'frequency + presence, top-p', params: () => ({ frequencyPenalty: 0.7, presencePenalty: 0.4, topP: 0.95 }) },
  {
    label: 'all penalties + top-k',
    params: () => ({ repetitionPenalty: 0.85, frequencyPenalty: -0.5, presencePenalty: 1.5, topK: 30 }),
  },
  { label: 'frequency only', params: () => ({ frequencyPenalty: 2 }) },
  { label: 'logit bias + top-p', params: (V, raw) => ({ logitBias: bias(V, raw), topP: 0.8 }) },
  {
    label: 'greedy + penalties + bias',
    params: (V, raw) => ({ temperature: 0, repetitionPenalty: 1.8, presencePenalty: 1, logitBias: bias(V, raw) }),
  },
  { label: 'mask', params: () => ({}), mask: true },
  { label: 'mask + top-k + top-p', params: () => ({ topK: 10, topP: 0.9 }), mask: true },
  { label: 'mask, greedy, logprobs 5', params: () => ({ temperature: 0 }), mask: true, topLogprobs: 5 },
  {
    label: 'everything',
    params: (V, raw) => ({
      temperature: 0.8, topK: 100, topP: 0.92, minP: 0.01, repetitionPenalty: 1.1, frequencyPenalty: 0.2,
      presencePenalty: 0.1, logitBias: bias(V, raw),
    }),
    mask: true,
    topLogprobs: 4,
  },
];

/** A prompt of 30 ids and 25 generated ones (repeats among them). */
export function randomHistory(V: number, seed: number): TokenHistory {
  const r = testRandom(seed);
  const h = new TokenHistory(Array.from({ length: 30 }, () => Math.floor(r() * V)));
  const pool = Array.from({ length: 8 }, () => Math.floor(r() * V));
  for (let i = 0; i < 25; i++) h.push(r() < 0.6 ? pool[Math.floor(r() * pool.length)]! : Math.floor(r() * V));
  return h;
}

/** About half the ids allowed; sometimes shorter than the row (ids past it are disallowed). */
export function randomMask(V: number, seed: number): Int32Array {
  const r = testRandom(seed);
  const words = Math.ceil(V / 32) - (seed % 3 === 0 && V > 64 ? 1 : 0);
  const m = new Int32Array(words);
  for (let w = 0; w < words; w++) m[w] = (r() * 2 ** 32) | 0;
  m[0] = m[0]! | 1; // never everything masked
  return m;
}

/** The ends of [0, 1) exactly: where a token of negligible weight (below 1e-12) decides. */
export const EXACT_ENDS = [0, 1 - 2 ** -40];
/**
 * Near the ends, for the device (40-bit fixed-point masses: a weight below 2^-40 counts as
 * 2^-40, which at the exact ends decides the token; that is within the stated tolerance).
 */
export const NEAR_ENDS = [1e-7, 1 - 1e-7];

/** `n` uniforms: the two `ends`, the rest random. */
export function uniforms(n: number, seed: number, ends: readonly number[] = EXACT_ENDS): number[] {
  const r = testRandom(seed);
  return [...ends, ...Array.from({ length: Math.max(0, n - ends.length) }, () => r())];
}

/** Every combination for one logits row. */
export function casesFor(raw: Float32Array, seed: number, us: number, ends: readonly number[] = EXACT_ENDS): Case[] {
  const V = raw.length;
  const out: Case[] = [];
  let k = 0;
  for (const c of COMBOS) {
    const params = assertValidSamplingParams(c.params(V, raw), V);
    const history = randomHistory(V, seed * 1000 + k);
    const mask = c.mask ? randomMask(V, seed * 1000 + k) : undefined;
    const list = params.temperature === 0 ? [0] : uniforms(us, seed * 7919 + k, ends);
    for (const u of list) out.push({ label: c.label, raw, params, history, mask, u, topLogprobs: c.topLogprobs });
    k++;
  }
  return out;
}

/** The host sampler's token for the case, or undefined when it throws. */
export function hostToken(c: Case): number | undefined {
  try {
    return sampleRow(processLogits(c.raw, c.params, c.history, c.mask), c.params, { nextFloat64: () => c.u });
  } catch {
    return undefined;
  }
}

/** The device row of the case, built by the engine-facing helper (its uniform is c.u). */
export function deviceRow(c: Case): DeviceSampleRow {
  return deviceSampleRow({
    sampler: { params: c.params, nextUniform: () => c.u },
    history: c.history,
    mask: c.mask,
    topLogprobs: c.topLogprobs,
  });
}

/**
 * How close the case is to a decision that float rounding could flip, from a naive float64
 * recomputation: relative to the mass, the nearest top-p cut (mass before a token vs topP * mass)
 * and the nearest cumulative boundary of the draw (ascending ids) to u * Z; relative to minP,
 * the nearest min-p weight. Infinity for greedy rows (argmax and top-k compare values only).
 */
export function boundaryMargin(c: Case): number {
  const p = c.params;
  if (p.temperature === 0) return Infinity;
  let x: Float32Array;
  try {
    x = Float32Array.from(processLogits(c.raw, p, c.history, c.mask));
  } catch {
    return Infinity;
  }
  const V = x.length;
  let xmax = -Infinity;
  for (const v of x) if (v > xmax) xmax = v;
  if (!Number.isFinite(xmax)) return Infinity;
  const w = Float64Array.from(x, (v) => Math.exp((v - xmax) / p.temperature));
  const byValue = Array.from({ length: V }, (_, i) => i).sort((a, b) => x[b]! - x[a]! || a - b);
  let cand = byValue;
  if (p.topK > 0 && p.topK < V) {
    const kth = x[byValue[p.topK - 1]!]!;
    cand = byValue.filter((i) => x[i]! >= kth);
  }
  let margin = Infinity;
  if (p.topP < 1) {
    const z = cand.reduce((a, i) => a + w[i]!, 0);
    const target = p.topP * z;
    let before = 0;
    let n = 0;
    for (const id of cand) {
      margin = Math.min(margin, Math.abs(before - target) / z);
      if (before >= target) break;
      before += w[id]!;
      n++;
    }
    cand = cand.slice(0, n);
  }
  if (p.minP > 0) {
    for (const id of cand) margin = Math.min(margin, Math.abs(w[id]! - p.minP) / p.minP);
    cand = cand.filter((id) => w[id]! >= p.minP);
  }
  // the boundaries between consecutive drawable tokens (0 and Z decide nothing)
  const ids = [...cand].sort((a, b) => a - b).filter((id) => w[id]! > 0);
  const z = ids.reduce((a, i) => a + w[i]!, 0);
  const r = c.u * z;
  let cum = 0;
  for (let j = 0; j + 1 < ids.length; j++) {
    cum += w[ids[j]!]!;
    margin = Math.min(margin, Math.abs(cum - r) / z);
  }
  return margin;
}

/** Runs the cases as one sampleRows call (one row each). */
export async function sampleCases(b: Backend, cases: Case[]): Promise<DeviceSample[]> {
  const V = cases[0]!.raw.length;
  const logits = new Float32Array(cases.length * V);
  cases.forEach((c, i) => logits.set(c.raw, i * V));
  const rows = cases.map(deviceRow);
  const out = b.sampleRows!(b.upload(logits, [cases.length, V]), rows);
  return decodeSampleResults((await b.read(out)) as Int32Array, rows);
}

/** Compares device results with the host; returns how many cases sat within `tol` of a boundary. */
export function compareWithHost(cases: Case[], got: DeviceSample[], tol: number): { skipped: number; checked: number } {
  let skipped = 0;
  let checked = 0;
  cases.forEach((c, i) => {
    const want = hostToken(c);
    const g = got[i]!;
    const where = `${c.label}, V ${c.raw.length}, u ${c.u}`;
    if (want === undefined) {
      assert.ok(g.tokenId < 0, `${where}: the host cannot sample, the device gave ${g.tokenId}`);
      return;
    }
    if (g.tokenId !== want) {
      const margin = boundaryMargin(c);
      if (margin < tol) {
        skipped++;
        return;
      }
      assert.fail(`${where}: token ${g.tokenId}, the host's ${want} (boundary margin ${margin})`);
    }
    checked++;
    if (c.topLogprobs === undefined) {
      assert.equal(g.logprob, undefined);
      return;
    }
    const lp = topLogprobs(c.raw, c.topLogprobs, want);
    assert.ok(Math.abs(g.logprob! - lp.logprob) <= 1e-5, `${where}: logprob ${g.logprob} vs ${lp.logprob}`);
    assert.equal(g.top!.length, lp.top.length, `${where}: top logprobs`);
    lp.top.forEach((t, j) => {
      assert.equal(g.top![j]!.tokenId, t.tokenId, `${where}: top ${j} id`);
      assert.ok(Math.abs(g.top![j]!.logprob - t.logprob) <= 1e-5, `${where}: top ${j} logprob ${g.top![j]!.logprob} vs ${t.logprob}`);
    });
  });
  return { skipped, checked };
}

/** The logits rows of every comparison: plain normal, coarse (many ties), bf16-rounded. */
export function logitRows(V: number, seed: number): Float32Array[] {
  return [normalLogits(V, seed, 3), normalLogits(V, seed + 1, 2, 0.25), toBf16(normalLogits(V, seed + 2, 4))];
}

/** Seeded requests covering each sampling stage, for whole-sequence comparisons against the host sampler. */
export const SEEDED_REQUESTS: readonly SamplingParamsInput[] = [
  { temperature: 0.9, topP: 0.95, seed: 11 },
  { topK: 20, repetitionPenalty: 1.2, frequencyPenalty: 0.3, seed: 5 },
  { temperature: 0, presencePenalty: 0.5, seed: 1 },
  { minP: 0.1, temperature: 1.4, logitBias: { 3: 2, 10: -5 }, seed: 99 },
  { topK: 3, topP: 0.6, minP: 0.2, seed: -7 },
];
