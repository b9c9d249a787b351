// ropeFrequencies against values worked out by hand (float64 formulas; the implementation rounds
// to float32 like torch, so agreement is to ~1e-6 relative). Exact float32 agreement with torch is
// checked in transformers-reference.test.ts.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { RopeSpec } from '../../src/contracts/model-config.ts';
import { ropeFrequencies } from '../../src/models/rope-frequencies.ts';

const spec = (s: Partial<RopeSpec>): RopeSpec => ({ type: 'default', theta: 10000, rotaryDim: 8, factor: 1, maxPositions: 2048, ...s });

function near(actual: ArrayLike<number>, expected: number[], rel = 2e-6) {
  assert.equal(actual.length, expected.length, 'length');
  for (let i = 0; i < expected.length; i++) {
    const ok = Math.abs(actual[i] - expected[i]) <= rel * Math.abs(expected[i]);
    assert.ok(ok, `[${i}] ${actual[i]} != ${expected[i]}`);
  }
}

// theta 10000, dim 8: 10000^(-2i/8) = 1, 0.1, 0.01, 0.001
const BASE = [1, 0.1, 0.01, 0.001];

describe('ropeFrequencies', () => {
  it('default: theta^(-2i/dim), scaling 1, float32 output', () => {
    const r = ropeFrequencies(spec({}), 1);
    assert.ok(r.invFreq instanceof Float32Array);
    near(r.invFreq, BASE);
    assert.equal(r.attentionScaling, 1);
    assert.equal(r.invFreq[0], 1);
    // odd rotary dims: arange(0, dim, 2) has ceil(dim / 2) entries
    assert.equal(ropeFrequencies(spec({ rotaryDim: 7 }), 1).invFreq.length, 4);
  });

  it('linear: divides by factor', () => {
    near(ropeFrequencies(spec({ type: 'linear', factor: 4 }), 1).invFreq, BASE.map((v) => v / 4));
  });

  it('dynamic NTK: unchanged up to max_position_embeddings, rescaled base past it', () => {
    const s = spec({ type: 'dynamic', factor: 2, maxPositions: 64, rotaryDim: 4 });
    near(ropeFrequencies(s, 10).invFreq, [1, 0.01]);
    near(ropeFrequencies(s, 64).invFreq, [1, 0.01]);
    // seq 128: base = 10000 * (2 * 128 / 64 - 1)^(4 / 2) = 90000 -> [1, 1/300]
    near(ropeFrequencies(s, 128).invFreq, [1, 1 / 300]);
  });

  it('llama3: keeps high frequencies, divides low ones, smooths the band between', () => {
    const oldCtx = 1024;
    const s = spec({ type: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositions: oldCtx });
    // wavelengths 2*pi/inv: 6.3, 62.8 (< 256 keep), 628 (between 256 and 1024: smooth), 6283 (> 1024: / 8)
    const smooth = (oldCtx / ((2 * Math.PI) / 0.01) - 1) / (4 - 1);
    const mid = (1 - smooth) * 0.01 / 8 + smooth * 0.01;
    near(ropeFrequencies(s, 1).invFreq, [1, 0.1, mid, 0.001 / 8]);
    assert.equal(ropeFrequencies(s, 1).attentionScaling, 1);
  });

  it('yarn: ramp between interpolation and extrapolation, default attention factor 0.1 ln(s) + 1', () => {
    // original 32: correction dims -0.8 and 0.71 -> truncated range [0, 1] -> only dim 0 extrapolates
    const small = ropeFrequencies(spec({ type: 'yarn', factor: 4, originalMaxPositions: 32 }), 1);
    near(small.invFreq, [1, 0.1 / 4, 0.01 / 4, 0.001 / 4]);
    assert.ok(Math.abs(small.attentionScaling - (0.1 * Math.log(4) + 1)) < 1e-12);

    // original 4096: correction dims 1.309 and 2.814
    const dims = (rot: number) => (8 * Math.log(4096 / (rot * 2 * Math.PI))) / (2 * Math.log(10000));
    const blend = (i: number, lo: number, hi: number) => {
      const w = 1 - Math.min(1, Math.max(0, (i - lo) / (hi - lo))); // extrapolation weight
      return (BASE[i] / 4) * (1 - w) + BASE[i] * w;
    };
    const truncated = ropeFrequencies(spec({ type: 'yarn', factor: 4, originalMaxPositions: 4096, truncate: true }), 1);
    near(truncated.invFreq, [0, 1, 2, 3].map((i) => blend(i, 1, 3)));
    near(truncated.invFreq, [1, 0.1, 0.00625, 0.00025]);
    const exact = ropeFrequencies(spec({ type: 'yarn', factor: 4, originalMaxPositions: 4096, truncate: false }), 1);
    near(exact.invFreq, [0, 1, 2, 3].map((i) => blend(i, dims(32), dims(1))));
    // beta_fast / beta_slow move the ramp
    const betas = ropeFrequencies(spec({ type: 'yarn', factor: 4, originalMaxPositions: 4096, betaFast: 1, betaSlow: 0.5 }), 1);
    const lo = Math.floor(dims(1));
    const hi = Math.ceil(dims(0.5));
    near(betas.invFreq, [0, 1, 2, 3].map((i) => blend(i, lo, hi)));
  });

  it('yarn attention factor: mscale / mscale_all_dim ratio, or the explicit attention_factor', () => {
    const m = (s: number, k: number) => 0.1 * k * Math.log(s) + 1;
    const both = ropeFrequencies(spec({ type: 'yarn', factor: 40, originalMaxPositions: 4096, mscale: 1, mscaleAllDim: 0.707 }), 1);
    assert.ok(Math.abs(both.attentionScaling - m(40, 1) / m(40, 0.707)) < 1e-12);
    // python truthiness: mscale_all_dim 0 falls back to get_mscale(factor)
    const zero = ropeFrequencies(spec({ type: 'yarn', factor: 40, originalMaxPositions: 4096, mscale: 1, mscaleAllDim: 0 }), 1);
    assert.ok(Math.abs(zero.attentionScaling - m(40, 1)) < 1e-12);
    const explicit = ropeFrequencies(spec({ type: 'yarn', factor: 40, originalMaxPositions: 4096, attentionFactor: 1.25 }), 1);
    assert.equal(explicit.attentionScaling, 1.25);
    // factor <= 1: no correction
    assert.equal(ropeFrequencies(spec({ type: 'yarn', factor: 1, originalMaxPositions: 4096 }), 1).attentionScaling, 1);
  });

  it('longrope: short factors up to original_max_position_embeddings, long past it; sqrt attention factor', () => {
    const s = spec({
      type: 'longrope', factor: 4, originalMaxPositions: 32, maxPositions: 128,
      shortFactor: [1, 1.1, 1.25, 1.5], longFactor: [1, 2, 4, 8],
    });
    const short = ropeFrequencies(s, 32);
    near(short.invFreq, [1, 0.1 / 1.1, 0.01 / 1.25, 0.001 / 1.5]);
    const long = ropeFrequencies(s, 33);
    near(long.invFreq, [1, 0.05, 0.0025, 0.000125]);
    const want = Math.sqrt(1 + Math.log(4) / Math.log(32));
    assert.ok(Math.abs(short.attentionScaling - want) < 1e-12);
    assert.equal(long.attentionScaling, short.attentionScaling);
    assert.equal(ropeFrequencies({ ...s, factor: 1 }, 1).attentionScaling, 1);
    assert.equal(ropeFrequencies({ ...s, attentionFactor: 0.9 }, 1).attentionScaling, 0.9);
  });

  it('partial rotary: one frequency per rotated pair, exponent over the rotary dim', () => {
    // phi3 partial_rotary_factor 0.5 of head 16 -> rotaryDim 8 -> same as BASE
    near(ropeFrequencies(spec({ rotaryDim: 8 }), 1).invFreq, BASE);
  });

  it('rounds like torch: the exponent 2i/dim is a float32 before the power', () => {
    // theta 1e6, dim 6: 1e6^(-1/3) = 0.01 exactly in float64, but torch raises to float32(1/3)
    const r = ropeFrequencies(spec({ theta: 1e6, rotaryDim: 6 }), 1);
    const f32Exponent = Math.fround(2 / 6);
    assert.notEqual(f32Exponent, 1 / 3);
    const torchLike = Math.fround(1 / Math.fround(Math.pow(1e6, f32Exponent)));
    assert.equal(r.invFreq[1], torchLike);
    assert.notEqual(r.invFreq[1], Math.fround(0.01));
  });
});
