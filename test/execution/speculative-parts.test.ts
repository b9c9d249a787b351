// The parts of speculative decoding on their own: the n-gram proposer (methods/ngram.ts) against a
// brute-force search, and the draft planner (methods/draft-depth.ts): the step-cost fit and the
// depths it gives fixed and adaptive rows.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { NgramProposer } from '../../src/execution/methods/ngram.ts';
import { DraftPlanner, StepCosts } from '../../src/execution/methods/draft-depth.ts';
import type { DraftAsk, ScheduledRow } from '../../src/execution/scheduler.ts';
import type { Sequence } from '../../src/execution/sequence.ts';
import { mulberry32 } from '../helpers/mulberry32.ts';

/** What NgramProposer reads of a sequence: its known tokens. */
function seqOf(tokens: number[]): Sequence {
  return { get known() { return tokens.length; }, tokenAt: (p: number) => tokens[p]! } as unknown as Sequence;
}

/** The proposal by definition: the longest suffix (min..max) seen before, its latest occurrence, what followed. */
function bruteForce(t: readonly number[], min: number, max: number, k: number): number[] | undefined {
  const n = t.length;
  for (let len = Math.min(max, n - 1); len >= min; len--) {
    for (let j = n - 1; j >= len; j--) {
      let ok = true;
      for (let i = 0; i < len && ok; i++) ok = t[j - 1 - i] === t[n - 1 - i];
      if (ok) return t.slice(j, Math.min(j + k, n));
    }
  }
  return undefined;
}

describe('NgramProposer', () => {
  it('proposes what followed the latest occurrence of the longest matching suffix', () => {
    //              0  1  2  3  4  5  6  7  8  9 10 11
    const tokens = [5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 2, 3];
    // suffix [2, 3] occurred at 1..2 (then 3? no: 2,3 then 9) and 5..6 (then 7); [1, 2, 3] does not end the sequence
    assert.deepEqual(new NgramProposer(2, 4).propose(seqOf(tokens), 3)?.tokens, [7, 8, 2]);
    // a longer match wins over a later one: ... 1 2 3 | x ... 9 2 3 | y ... 1 2 3 -> x
    const t2 = [1, 2, 3, 40, 41, 9, 2, 3, 50, 1, 2, 3];
    assert.deepEqual(new NgramProposer(2, 4).propose(seqOf(t2), 2)?.tokens, [40, 41]);
    assert.deepEqual(new NgramProposer(2, 2).propose(seqOf(t2), 2)?.tokens, [50, 1], 'max 2: the latest of the equal matches');
    // no earlier occurrence, or a match shorter than min: nothing
    assert.equal(new NgramProposer(2, 4).propose(seqOf([1, 2, 3, 4, 5]), 3), undefined);
    assert.equal(new NgramProposer(3, 4).propose(seqOf([7, 2, 3, 1, 2, 3]), 3), undefined);
    // a proposal stops at the end of what is known
    assert.deepEqual(new NgramProposer(1, 3).propose(seqOf([4, 4, 4]), 5)?.tokens, [4]);
  });

  it('agrees with a brute-force search as the sequence grows, token by token', () => {
    const rand = mulberry32(9);
    for (const [min, max, alphabet] of [[1, 3, 4], [2, 5, 6], [3, 3, 3], [2, 8, 12]] as const) {
      const tokens: number[] = [];
      const p = new NgramProposer(min, max);
      for (let step = 0; step < 400; step++) {
        tokens.push(Math.floor(rand() * alphabet));
        const got = p.propose(seqOf(tokens), 6)?.tokens;
        assert.deepEqual(got, bruteForce(tokens, min, max, 6), `min ${min} max ${max} at length ${tokens.length}`);
      }
    }
  });

  it('indexes a long sequence a part per proposal, earliest first, so no proposal pays for all of it', () => {
    // a 20k-token sequence whose only repeat is its last 3 tokens, first seen at its very start
    const tokens = Array.from({ length: 20_000 }, (_, i) => 10 + i);
    tokens.push(10, 11, 12);
    const p = new NgramProposer(2, 3);
    const got: (readonly number[] | undefined)[] = [];
    for (let k = 0; k < 6; k++) got.push(p.propose(seqOf(tokens), 2)?.tokens);
    // the start is indexed by the first call: found at once, and every time after
    assert.deepEqual(got, Array(6).fill([13, 14]));
    // a repeat near the end is found once the index gets there (4096 positions a call)
    const late = Array.from({ length: 20_000 }, (_, i) => 10 + i);
    late.push(19_000, 19_001);
    const q = new NgramProposer(2, 2);
    const found = Array.from({ length: 6 }, () => q.propose(seqOf(late), 1)?.tokens[0]);
    assert.deepEqual(found, [undefined, undefined, undefined, undefined, 19_002, 19_002]);
  });

  it('refuses bounds that make no sense', () => {
    assert.throws(() => new NgramProposer(0, 3), /ngram min must be an integer >= 1/);
    assert.throws(() => new NgramProposer(3, 2), /ngram max must be an integer >= ngram min/);
  });
});

describe('StepCosts', () => {
  it('fits a line to steps of different sizes, and falls back to its prior on steps of one size', () => {
    const c = new StepCosts();
    assert.equal(c.line(), undefined);
    for (let i = 0; i < 200; i++) c.record(1 + (i % 17), 2 + 0.5 * (1 + (i % 17)));
    const { a, b } = c.line()!;
    assert.ok(Math.abs(a - 2) < 0.05 && Math.abs(b - 0.5) < 0.01, `a ${a} b ${b}`);
    const one = new StepCosts();
    for (let i = 0; i < 50; i++) one.record(4, 6);
    const l = one.line()!;
    assert.ok(Math.abs(l.a + 4 * l.b - 6) < 1e-6, 'the line passes through the steps seen');
    assert.ok(l.a > 0 && l.b > 0);
  });
});

describe('DraftPlanner', () => {
  const row = (acceptance: number | undefined, count = 1): ScheduledRow =>
    ({ seq: { method: { acceptance } }, start: 0, count, sample: true }) as unknown as ScheduledRow;
  const ask = (r: ScheduledRow, n: number): DraftAsk => ({ row: r, draft: { tokens: Array.from({ length: n }, (_, i) => i) } });
  /** a planner whose steps cost `a` + `b` per token, measured over steps of many sizes */
  const measured = (a: number, b: number) => {
    const p = new DraftPlanner();
    for (let i = 0; i < 100; i++) p.recordStep(1 + (i % 20), 1, a + b * (1 + (i % 20)));
    return p;
  };

  it('a fixed depth takes its whole draft, within the budget', () => {
    const rows = [row(undefined), row(undefined)];
    assert.deepEqual(measured(1, 1).depths([ask(rows[0]!, 5), ask(rows[1]!, 5)], rows, 7), [5, 2]);
  });

  it('an adaptive row drafts deeper the higher its acceptance and the cheaper a token is beside a step', () => {
    const r = row(0.9);
    const cheap = measured(10, 0.1).depths([ask(r, 16)], [r], 100)[0]!;
    const dear = measured(1, 1).depths([ask(r, 16)], [r], 100)[0]!;
    assert.ok(cheap > dear, `cheap tokens ${cheap} > dear ${dear}`);
    const low = measured(10, 0.1).depths([ask(row(0.3), 16)], [row(0.3)], 100)[0]!;
    assert.ok(low < cheap && low >= 1, `acceptance 0.3 drafts less (${low})`);
    assert.equal(measured(1, 1).depths([ask(row(0.05), 16)], [row(0.05)], 100)[0], 0, 'a row whose drafts rarely hold drafts nothing');
  });

  it('in a large batch the same row drafts less, down to nothing', () => {
    const p = measured(4, 0.5);
    const depthAt = (batch: number) => {
      const rows = Array.from({ length: batch }, () => row(0.6));
      return p.depths([ask(rows[0]!, 16)], rows, 1000)[0]!;
    };
    assert.ok(depthAt(1) > depthAt(8) && depthAt(8) >= depthAt(64), `${depthAt(1)} ${depthAt(8)} ${depthAt(64)}`);
    assert.equal(depthAt(64), 0);
  });

  it('a plain step that pipelines is harder to beat: drafting must pay for leaving the pipeline', () => {
    const p = measured(4, 0.5); // a plain step of one row: 4.5 ms run end to end
    assert.equal(p.drafts(0.5, 16), true);
    const r = row(0.5);
    assert.ok(p.depths([ask(r, 16)], [r], 100)[0]! > 0);
    for (let i = 0; i < 20; i++) p.recordPipelined(1, 2.5); // ... and 2.5 ms pipelined
    assert.equal(p.drafts(0.5, 16), false, 'a draft of acceptance 0.5 does not make up for it');
    assert.equal(p.depths([ask(r, 16)], [r], 100)[0], 0);
    assert.equal(p.drafts(0.95, 16), true, 'a long run of acceptance 0.95 does');
    assert.equal(p.drafts(0.95, 1), false, 'but not one token of it');
    const hot = row(0.95);
    assert.ok(p.depths([ask(hot, 16)], [hot], 100)[0]! >= 4);
  });

  /**
   * `steps` decode steps of one row: each asks whether a 0.9-acceptance row drafts (twice: every
   * row of a step asks, and the answer is the step's), then records what it emitted in wall time
   * (drafted: `drafted` tokens a ms; plain: `plain`). The decisions as a string, D drafted, P plain.
   */
  const decide = (p: DraftPlanner, steps: number, drafted: number, plain: number): string => {
    let out = '';
    for (let i = 0; i < steps; i++) {
      const d = p.drafts(0.9, 8);
      assert.equal(p.drafts(0.9, 8), d, `step ${i}: a second row of the step gets the same answer`);
      p.recordEmitted(1, 2 * (d ? drafted : plain), 2, d);
      out += d ? 'D' : 'P';
    }
    return out;
  };
  /** the string's runs, as [letter, length] */
  const runs = (s: string) => (s.match(/D+|P+/g) ?? []).map((x) => `${x[0]}${x.length}`).join(' ');

  it('what steps emit in wall time overrules the model: slower drafting stops there for stretches of steps that double', () => {
    const p = measured(10, 0.1); // by the line, drafting a 0.9-acceptance row pays well
    const r = row(0.9);
    assert.ok(p.drafts(0.9, 8) && p.depths([ask(r, 8)], [r], 100)[0]! > 0);
    // drafting measured (4 steps), then 6 plain steps measure plain decoding; drafting is the
    // slower, so 32 plain steps follow (38 in all), then drafting is measured afresh, and again
    // slower: 64 plain steps, then 128, ...
    assert.equal(runs(decide(p, 300, 0.1, 0.3)), 'D4 P38 D4 P64 D4 P128 D4 P54');
    // a batch size met for the first time starts in the nearest one's stretch (rows finishing one
    // by one do not explore drafting again at each size) ...
    const rows = [row(0.9), row(0.9)];
    assert.equal(p.depths([ask(rows[0]!, 8)], rows, 100)[0], 0);
    // ... and, outside a stretch, the line decides until it is measured
    const fresh = measured(10, 0.1);
    assert.equal(runs(decide(fresh, 20, 0.6, 0.3)), 'D4 P6 D10');
    assert.ok(fresh.depths([ask(rows[0]!, 8)], rows, 100)[0]! > 0);
    // drafting that emits more drafts on, once plain decoding is measured
    const q = measured(10, 0.1);
    assert.equal(runs(decide(q, 100, 0.6, 0.3)), 'D4 P6 D90');
    // the text turns repetitive: once the stretch ends, drafting is measured faster, and stays on
    const t = measured(10, 0.1);
    assert.equal(runs(decide(t, 50, 0.1, 0.3) + decide(t, 80, 0.6, 0.3)), 'D4 P38 D4 P64 D20');
    // plain decoding at its best is its pipelined interval: plain steps that emitted 0.2 tokens a
    // ms run to their end, 0.4 pipelined (one row every 2.5 ms), beat drafting's 0.3
    const u = measured(10, 0.1);
    for (let i = 0; i < 20; i++) u.recordPipelined(1, 2.5);
    assert.ok(u.drafts(0.9, 8), 'by the line, drafting still pays against the pipelined step');
    assert.equal(runs(decide(u, 50, 0.3, 0.2)), 'D4 P38 D4 P4');
  });

  it('counts verify rows by accepted length', () => {
    const p = new DraftPlanner();
    p.recordVerify(4, 2);
    p.recordVerify(3, 0);
    p.recordVerify(5, 2);
    assert.deepEqual(p.stats, { draftTokens: 12, acceptedTokens: 4, verifies: 3, acceptedLengths: [1, 0, 2] });
  });
});
