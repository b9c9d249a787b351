// verifyDraftToken (src/sampling/rejection.ts): a draft token drawn from q, kept with probability
// min(1, p(x) / q(x)) and otherwise replaced by a draw from the residual max(0, p - q), is
// distributed exactly as p.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { verifyDraftToken } from '../../src/sampling/rejection.ts';
import { chiSquare, testRandom } from './reference.ts';

const P = new Map([[0, 0.5], [1, 0.25], [2, 0.15], [3, 0.1]]);
/** the draft distribution: too much on 1 and 4 (a token the target never produces), too little on 0 */
const Q = Float32Array.from([0.2, 0.4, 0.15, 0.05, 0.2]);

/** a uniform source that returns `us` in order */
const fixed = (...us: number[]) => ({ nextFloat64: () => us.shift()! });

test('x is kept exactly when u < p(x) / q(x); a rejected x is replaced from the residual, one more uniform', () => {
  // p(1) / q(1) = 0.625
  assert.deepEqual(verifyDraftToken(P, 1, Q, fixed(0.62)), { id: 1, accepted: true });
  // rejected: the residual max(0, p - q) = [0.3, 0, 0, 0.05, 0], v = 0.9 of its 0.35 lands on 3
  assert.deepEqual(verifyDraftToken(P, 1, Q, fixed(0.63, 0.9)), { id: 3, accepted: false });
  assert.deepEqual(verifyDraftToken(P, 1, Q, fixed(0.63, 0.5)), { id: 0, accepted: false });
  // p(x) >= q(x): always kept; a token the target never produces: never
  assert.deepEqual(verifyDraftToken(P, 0, Q, fixed(0.999)), { id: 0, accepted: true });
  assert.equal(verifyDraftToken(P, 4, Q, fixed(0, 0.1)).accepted, false);
});

test('the tokens it takes are distributed as the target (chi-square over 200k drafts)', () => {
  const rand = testRandom(5);
  const rng = { nextFloat64: rand };
  const counts = new Map<number, number>();
  const N = 200_000;
  let accepted = 0;
  for (let i = 0; i < N; i++) {
    // x ~ Q
    let u = rand(), x = 0;
    while (x < Q.length - 1 && (u -= Q[x]!) >= 0) x++;
    const v = verifyDraftToken(P, x, Q, rng);
    counts.set(v.id, (counts.get(v.id) ?? 0) + 1);
    if (v.accepted) accepted++;
  }
  // 3 degrees of freedom: 16.3 is the 0.001 critical value
  const chi = chiSquare(counts, P, N);
  assert.ok(chi < 16.3, `chi-square ${chi}`);
  assert.equal(counts.get(4), undefined, 'never a token the target cannot produce');
  // acceptance is sum_x min(p(x), q(x)) = 0.2 + 0.25 + 0.15 + 0.05 = 0.65
  assert.ok(Math.abs(accepted / N - 0.65) < 0.005, `acceptance ${accepted / N}`);
});
