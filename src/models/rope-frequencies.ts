// Rotary inverse frequencies, as transformers 5.x computes them (modeling_rope_utils.py,
// `_compute_*_parameters`, and each family's `compute_default_rope_parameters`).
//
// Precision: transformers builds inv_freq as a float32 tensor, and every tensor op rounds to
// float32 (python scalars are cast to float32 first). The exponent 2i/dim alone, rounded to f32,
// moves a frequency by up to ~1e-6 relative, more than an f32 ulp, so each step below rounds
// with `f32` where torch does. Scalar maths that transformers does in python stays in float64.
//
// Sequence-length dependence (the caller passes seqLen = highest position of the step + 1):
//   dynamic  - frequencies change once seqLen exceeds maxPositions (transformers recomputes them
//              when max(position_ids) + 1 grows past max_position_embeddings).
//   longrope - long_factor when seqLen > originalMaxPositions, else short_factor.

import type { RopeSpec } from '../contracts/model-config.ts';

export interface RopeFrequencies {
  /** f32 [ceil(rotaryDim / 2)] */
  invFreq: Float32Array;
  /** multiplies cos and sin (YaRN / LongRoPE magnitude correction); 1 otherwise */
  attentionScaling: number;
}

const f32 = Math.fround;

export function ropeFrequencies(spec: RopeSpec, seqLen: number): RopeFrequencies {
  switch (spec.type) {
    case 'default':
      return { invFreq: defaultInvFreq(spec.theta, spec.rotaryDim), attentionScaling: 1 };
    case 'linear':
      return { invFreq: linear(spec), attentionScaling: 1 };
    case 'dynamic':
      return { invFreq: dynamicNtk(spec, seqLen), attentionScaling: 1 };
    case 'llama3':
      return { invFreq: llama3(spec), attentionScaling: 1 };
    case 'yarn':
      return yarn(spec);
    case 'longrope':
      return longrope(spec, seqLen);
    default:
      throw new Error(`unknown rope type ${(spec as RopeSpec).type}`);
  }
}

/** torch: base ** (torch.arange(0, dim, 2).float() / dim), all in float32 */
function powers(base: number, dim: number): Float32Array {
  const n = Math.ceil(dim / 2);
  const out = new Float32Array(n);
  const b = f32(base);
  for (let i = 0; i < n; i++) out[i] = f32(Math.pow(b, f32((2 * i) / dim)));
  return out;
}

/** 1.0 / tensor: torch computes reciprocal(x) * 1.0 */
function reciprocal(x: Float32Array): Float32Array {
  return x.map((v) => f32(1 / v));
}

function defaultInvFreq(theta: number, dim: number): Float32Array {
  return reciprocal(powers(theta, dim));
}

function linear(spec: RopeSpec): Float32Array {
  const factor = f32(spec.factor);
  return defaultInvFreq(spec.theta, spec.rotaryDim).map((v) => f32(v / factor));
}

function dynamicNtk(spec: RopeSpec, seqLen: number): Float32Array {
  const dim = spec.rotaryDim;
  const maxPos = spec.maxPositions;
  // Below the threshold transformers keeps (or resets to) the frequencies computed at init, where
  // seq_len = max_position_embeddings makes the base correction exactly 1.
  if (!(seqLen > maxPos)) return defaultInvFreq(spec.theta, dim);
  // Past it, seq_len arrives as an int64 tensor, so the base correction is float32 tensor maths:
  // base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
  const factor = spec.factor;
  let t = f32(f32(factor) * f32(seqLen));
  t = f32(t / f32(maxPos));
  t = f32(t - f32(factor - 1));
  t = f32(Math.pow(t, f32(dim / (dim - 2))));
  const base = f32(f32(spec.theta) * t);
  return reciprocal(powers(base, dim));
}

function llama3(spec: RopeSpec): Float32Array {
  const invFreq = defaultInvFreq(spec.theta, spec.rotaryDim);
  const factor = f32(spec.factor);
  const low = need(spec.lowFreqFactor, 'lowFreqFactor');
  const high = need(spec.highFreqFactor, 'highFreqFactor');
  const oldContext = need(spec.originalMaxPositions, 'originalMaxPositions');
  const lowFreqWavelen = f32(oldContext / low);
  const highFreqWavelen = f32(oldContext / high);
  const twoPi = f32(2 * Math.PI);
  return invFreq.map((inv) => {
    const wavelen = f32(f32(1 / inv) * twoPi); // 2 * math.pi / inv_freq
    // wavelen > low_freq_wavelen: divide by factor; wavelen < high_freq_wavelen: keep
    const scaled = wavelen > lowFreqWavelen ? f32(inv / factor) : inv;
    if (wavelen < highFreqWavelen || wavelen > lowFreqWavelen) return scaled;
    // medium band: interpolate with a smooth factor (computed from the already-chosen value)
    const smooth = f32(f32(f32(f32(1 / wavelen) * f32(oldContext)) - f32(low)) / f32(high - low));
    const a = f32(f32(f32(1 - smooth) * scaled) / factor);
    return f32(a + f32(smooth * scaled));
  });
}

function yarn(spec: RopeSpec): RopeFrequencies {
  const dim = spec.rotaryDim;
  const base = spec.theta;
  const factor = spec.factor;
  const originalMax = need(spec.originalMaxPositions, 'originalMaxPositions');
  const getMscale = (scale: number, mscale = 1) => (scale <= 1 ? 1 : 0.1 * mscale * Math.log(scale) + 1);
  let attentionFactor = spec.attentionFactor;
  if (attentionFactor === undefined) {
    // python truthiness: both must be present and non-zero
    attentionFactor = spec.mscale && spec.mscaleAllDim
      ? getMscale(factor, spec.mscale) / getMscale(factor, spec.mscaleAllDim)
      : getMscale(factor);
  }
  const betaFast = spec.betaFast || 32;
  const betaSlow = spec.betaSlow || 1;
  const correctionDim = (rotations: number) =>
    (dim * Math.log(originalMax / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
  let low = correctionDim(betaFast);
  let high = correctionDim(betaSlow);
  if (spec.truncate ?? true) {
    low = Math.floor(low);
    high = Math.ceil(high);
  }
  low = Math.max(low, 0);
  high = Math.min(high, dim - 1);
  if (low === high) high += 0.001; // transformers: "prevent singularity"

  const posFreqs = powers(base, dim);
  const fFactor = f32(factor);
  const fLow = f32(low);
  const span = f32(high - low);
  const invFreq = new Float32Array(posFreqs.length);
  for (let i = 0; i < posFreqs.length; i++) {
    const extrapolation = f32(1 / posFreqs[i]);
    const interpolation = f32(1 / f32(fFactor * posFreqs[i]));
    // linear ramp over the dims, clamped to [0, 1]; extrapolation weight = 1 - ramp
    const ramp = Math.min(1, Math.max(0, f32(f32(i - fLow) / span)));
    const extrapolationWeight = f32(1 - ramp);
    invFreq[i] = f32(
      f32(interpolation * f32(1 - extrapolationWeight)) + f32(extrapolation * extrapolationWeight),
    );
  }
  return { invFreq, attentionScaling: attentionFactor };
}

function longrope(spec: RopeSpec, seqLen: number): RopeFrequencies {
  const originalMax = need(spec.originalMaxPositions, 'originalMaxPositions');
  const factor = spec.factor;
  let attentionFactor = spec.attentionFactor;
  if (attentionFactor === undefined) {
    attentionFactor = factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(originalMax));
  }
  const ext = seqLen > originalMax ? need(spec.longFactor, 'longFactor') : need(spec.shortFactor, 'shortFactor');
  const pows = powers(spec.theta, spec.rotaryDim);
  if (ext.length !== pows.length) {
    throw new Error(`longrope factors have ${ext.length} entries, expected ${pows.length} (rotaryDim / 2)`);
  }
  const invFreq = pows.map((p, i) => f32(1 / f32(f32(ext[i]) * p)));
  return { invFreq, attentionScaling: attentionFactor };
}

function need<T>(value: T | undefined, name: string): T {
  if (value === undefined) throw new Error(`RopeSpec.${name} is required for this rope type`);
  return value;
}
