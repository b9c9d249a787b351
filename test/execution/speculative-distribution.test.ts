// Rejection sampling keeps the target's distribution: many seeded samples of a short continuation
// (the first two tokens) with drafts verified, against plain sampling's empirical distribution,
// compared by a chi-square test of homogeneity. Drafts of both kinds: deterministic ones (a point
// mass, as n-gram drafts are: the target's draw is kept, the draft accepted when it equals it) and
// drafts drawn at random from a distribution q the proposer reports (judged by the rule of
// Leviathan et al. / Chen et al.: keep x with probability min(1, p(x) / q(x)), else draw from the
// residual). The arms use different seeds, so agreement is statistical, not the coupling of equal
// seeds (test/execution/speculative.test.ts checks that).
//
// The test fails when the rule is broken. With the acceptance rule of speculative.ts replaced by
// "keep the draft token" (the target's token at a draft position overwritten by the draft), the
// point-mass arm's statistic was chi2 = 7253 on 58 degrees of freedom and the random-draft arm's
// 2609 on 64 (p ~ 0 both; its check that drafts are both accepted and rejected fails first);
// with the rule of verifyDraftToken replaced by "keep x with probability p(x)" (`u * qx < px` made
// `u < px`), the random-draft arm's was chi2 = 480 on 127 (p = 4e-41). Unbroken: 114.5 on 117
// (p = 0.55) and 136.4 on 121 (p = 0.16); the statistics are printed as diagnostics. A
// sensitivity check in the test itself: the same statistic tells temperature 1.0 from 1.2
// (chi2 = 384 on 112).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { readFileSync } from 'node:fs';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import type { Draft, Proposer } from '../../src/execution/methods/method.ts';
import type { EngineRequest, Sequence } from '../../src/execution/sequence.ts';
import { mulberry32 } from '../helpers/mulberry32.ts';

const LLAMA = resolve(import.meta.dirname, '../fixtures/llama');
const PROMPT: number[] = JSON.parse(readFileSync(join(LLAMA, 'reference.json'), 'utf8')).cases[0].prompt_token_ids;
const SAMPLES = 4000;

/** The first two tokens of SAMPLES seeded requests (seeds from `seed0`), as "t1,t2" keys. */
async function pairs(m: LoadedModel, seed0: number, extra: (k: number) => Partial<EngineRequest> = () => ({}), temperature = 1): Promise<string[]> {
  const e = new Engine(m.model, m, { maxBatch: 64, maxQueued: SAMPLES, maxModelLen: m.maxContext, tokenBudget: 1024 });
  const out = await Promise.all(Array.from({ length: SAMPLES }, (_, k) => e.complete({
    promptIds: PROMPT, maxTokens: 2, ignoreEos: true, sampling: { temperature, seed: seed0 + k }, ...extra(k),
  }).then((c) => {
    assert.equal(c.tokenIds.length, 2, c.error);
    return c.tokenIds.join(',');
  })));
  await e.close(0);
  return out;
}

/** Chi-square test of homogeneity of two samples over their categories (those expected below 5 pooled). */
function homogeneity(a: string[], b: string[]): { chi2: number; df: number; p: number } {
  const count = (xs: string[]) => xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map<string, number>());
  const ca = count(a), cb = count(b);
  const keys = [...new Set([...ca.keys(), ...cb.keys()])];
  const rows: [number, number][] = [];
  let pooled: [number, number] = [0, 0];
  const na = a.length, nb = b.length, n = na + nb;
  for (const k of keys) {
    const x = ca.get(k) ?? 0, y = cb.get(k) ?? 0;
    if (((x + y) * Math.min(na, nb)) / n < 5) pooled = [pooled[0] + x, pooled[1] + y];
    else rows.push([x, y]);
  }
  if (pooled[0] + pooled[1] > 0) rows.push(pooled);
  let chi2 = 0;
  for (const [x, y] of rows) {
    const ex = ((x + y) * na) / n, ey = ((x + y) * nb) / n;
    chi2 += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey;
  }
  const df = rows.length - 1;
  return { chi2, df, p: chiSquareSurvival(chi2, df) };
}

/** P(X > x) for X ~ chi-square(df): the Wilson-Hilferty normal approximation (ample for df >= 10). */
function chiSquareSurvival(x: number, df: number): number {
  const z = (Math.cbrt(x / df) - (1 - 2 / (9 * df))) / Math.sqrt(2 / (9 * df));
  return 0.5 * erfc(z / Math.SQRT2);
}

function erfc(x: number): number {
  // Numerical Recipes' erfc (fractional error < 1.2e-7)
  const t = 1 / (1 + 0.5 * Math.abs(x));
  const y = t * Math.exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 +
    t * (-1.13520398 + t * (1.48851499 + t * (-0.82215223 + t * 0.17087277)))))))));
  return x >= 0 ? y : 2 - y;
}

/** The most frequent first token and the most frequent second token after it, in `sample`. */
function likely(sample: string[]): [number, number] {
  const count = (xs: string[]) => [...xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map<string, number>())].sort((p, q) => q[1] - p[1]);
  const first = Number(count(sample.map((s) => s.split(',')[0]!))[0]![0]);
  const second = Number(count(sample.filter((s) => s.startsWith(`${first},`)).map((s) => s.split(',')[1]!))[0]![0]);
  return [first, second];
}

test('drafts verified by rejection sampling leave the distribution of a sampled continuation the target\'s', async () => {
  const backend = await createCpuBackend();
  try {
    const m = await loadModel(backend, LLAMA, { maxModelLen: 256 });
    const V = m.config.vocabSize;
    const plain = await pairs(m, 0);
    const [g1, g2] = likely(plain);
    // point-mass drafts: the most likely continuation, at every step (accepted often, not always)
    const pointMass = (): Proposer => ({
      propose: (seq: Sequence, max: number): Draft => ({ tokens: (seq.output.length === 0 ? [g1, g2] : [g2]).slice(0, max) }),
    });
    let drafted = 0, accepted = 0;
    const spec = await pairs(m, 1_000_000, () => ({ speculative: { proposer: pointMass, numDraftTokens: 2 } }));
    // drafts drawn from q: half its mass on the likely tokens, half spread over the vocabulary
    const q = new Float32Array(V).fill(0.5 / V);
    q[g1] += 0.3;
    q[g2] += 0.2;
    const draw = (u: number) => {
      let c = 0;
      for (let i = 0; i < V; i++) if ((c += q[i]!) > u) return i;
      return V - 1;
    };
    const random = (k: number) => (): Proposer => {
      const rng = mulberry32(k + 1);
      return {
        propose: (_seq: Sequence, max: number): Draft => {
          const n = Math.min(max, 2);
          return { tokens: Array.from({ length: n }, () => draw(rng())), probs: Array.from({ length: n }, () => q) };
        },
      };
    };
    const e = new Engine(m.model, m, { maxBatch: 64, maxModelLen: m.maxContext });
    const probe = await Promise.all(Array.from({ length: 200 }, (_, k) => e.complete({
      promptIds: PROMPT, maxTokens: 2, ignoreEos: true, sampling: { temperature: 1, seed: k }, speculative: { proposer: random(k), numDraftTokens: 2 },
    })));
    for (const c of probe) (drafted += c.speculation!.draftTokens), (accepted += c.speculation!.acceptedTokens);
    await e.close(0);
    assert.ok(accepted > 0 && accepted < drafted, `random drafts accepted and rejected (${accepted} of ${drafted})`);
    const randomDrafts = await pairs(m, 2_000_000, (k) => ({ speculative: { proposer: random(k), numDraftTokens: 2 } }));
    const hotter = await pairs(m, 3_000_000, () => ({}), 1.2);

    const a = homogeneity(plain, spec);
    const b = homogeneity(plain, randomDrafts);
    const c = homogeneity(plain, hotter);
    console.log(`point-mass drafts: chi2 ${a.chi2.toFixed(1)} df ${a.df} p ${a.p.toExponential(2)}; random drafts: chi2 ${b.chi2.toFixed(1)} df ${b.df} p ${b.p.toExponential(2)}; temperature 1.2: chi2 ${c.chi2.toFixed(1)} df ${c.df} p ${c.p.toExponential(2)}`);
    assert.ok(a.df >= 10 && b.df >= 10, 'enough categories');
    assert.ok(a.p > 0.001, `point-mass drafts keep the distribution (chi2 ${a.chi2.toFixed(1)}, df ${a.df}, p ${a.p})`);
    assert.ok(b.p > 0.001, `random drafts keep the distribution (chi2 ${b.chi2.toFixed(1)}, df ${b.df}, p ${b.p})`);
    assert.ok(c.p < 1e-6, `the test tells a different distribution apart (chi2 ${c.chi2.toFixed(1)}, df ${c.df}, p ${c.p})`);
    // how often the point-mass drafts were accepted: neither never nor always
    const share = spec.filter((s) => s === `${g1},${g2}`).length / SAMPLES;
    assert.ok(share > 0.05 && share < 0.95, `the likely continuation is likely, not certain (${share})`);
  } finally {
    await backend.close();
  }
});
