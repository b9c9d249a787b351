// How deep each row of a step drafts (Scheduler.addDrafts asks), and the measurements that
// decide it: the engine's step costs and the rows' acceptance.
//
// A row whose method has a fixed depth computes its whole proposal. A row with an adaptive depth
// drafts only what pays. With a per-token acceptance a (the method's recent rate), the k-th draft
// token of a row is used with probability a^k, so it adds a^k expected tokens; every token a step
// computes costs b (the slope of a step's time in its tokens, measured). A step of T tokens whose
// rows are expected to emit S tokens makes S / c(T) tokens per millisecond, c(T) = a0 + b T; one
// more draft token of gain g raises that exactly when g > b * S / c(T). So the draft tokens of all
// rows are taken best gain first while they pass that bar (which rises as S does): a row whose
// acceptance is low, or a step already so large that one more token costs more than it brings
// (large batches), drafts nothing, and the step is a plain one.
//
// c is fitted by exponentially weighted least squares over recent steps (their tokens and
// wall-clock milliseconds, schedule to postprocess), with a weak prior that a step's fixed cost
// is PRIOR_STEP_TOKENS tokens' worth, which settles the slope until steps of different sizes have
// been seen.
//
// A step with a draft is not pipelined (pipeline.ts), and a plain step of the same rows may be:
// then it costs what the pipelined steps measured at that batch size (one step's interval, which
// hides the host's work behind the device's), less than c. Drafting pays only when the step's
// rate with the drafts beats that: otherwise the adaptive rows draft nothing.
//
// The line is a model; what it leaves out (a draft model's or head's own steps, a verify step's
// host work, what leaving the pipeline costs on a device) shows in the tokens the steps emit. So
// the planner also keeps, per batch size, the tokens emitted per millisecond of wall time (one
// step's end to the next's) of steps with drafts and of steps without. Once drafting is measured
// at a batch size and plain decoding is not, its rows take PLAIN_PROBE_STEPS plain steps in a
// row, which pipeline, so plain decoding is measured at its best (the pipelined interval). Once
// both are measured and drafting is the slower, adaptive rows decode plainly there for a stretch
// of steps, then drafting is measured afresh (the text may have turned repetitive); each stretch
// that ends in drafting measured slower again is twice as long as the one before, so exploring
// costs a share of the steps that shrinks the longer drafting does not pay. The stretches count
// decode steps, not decisions: a step asks once per row. A batch size met for the first time
// starts in the stretch of the nearest one measured.

import type { DraftAsk, DraftPlanning, ScheduledRow } from '../scheduler.ts';

/** the prior's fixed cost of a step, in tokens' worth of per-token cost (until measured) */
const PRIOR_STEP_TOKENS = 8;
/** the prior's weight, in steps */
const PRIOR_WEIGHT = 0.05;
/** the weight a step's measurement keeps per later step (about 30 steps remembered) */
const FORGET = 0.97;
/** the slope is never taken below this fraction of a step's mean cost per token: drafting is never free */
const MIN_SLOPE_SHARE = 0.02;
/** how far one pipelined step's interval moves the mean at its batch size */
const PIPELINED_RATE = 0.1;
/** how far one step moves the emitted-tokens rate of its batch size and kind */
const EMITTED_RATE = 0.1;
/** steps of a kind measured before its emitted rate is trusted */
const EMITTED_MIN_STEPS = 4;
/** plain steps in a row a batch size takes while its plain decoding is unmeasured (the first drains the pipeline) */
const PLAIN_PROBE_STEPS = 6;
/** the first plain stretch, in decode steps, after drafting measured slower; doubled each time it is again */
const EXPLORE_FIRST_STEPS = 32;
/** the longest plain stretch between two measurements of drafting */
const EXPLORE_MAX_STEPS = 1024;

/** A step's wall-clock cost as a line in its tokens, fitted to the steps measured. */
export class StepCosts {
  private w = 0;
  private sT = 0;
  private sTT = 0;
  private sY = 0;
  private sTY = 0;
  /** steps recorded */
  count = 0;

  /** One step of `tokens` tokens that took `ms`. */
  record(tokens: number, ms: number): void {
    if (!(ms > 0) || !(tokens > 0)) return;
    this.w = this.w * FORGET + 1;
    this.sT = this.sT * FORGET + tokens;
    this.sTT = this.sTT * FORGET + tokens * tokens;
    this.sY = this.sY * FORGET + ms;
    this.sTY = this.sTY * FORGET + tokens * ms;
    this.count++;
  }

  /**
   * The fitted line: fixed cost `a` and cost per token `b`, in milliseconds (undefined before
   * any step). Least squares with the prior a = PRIOR_STEP_TOKENS * b as a pseudo-observation.
   */
  line(): { a: number; b: number } | undefined {
    if (this.w === 0) return undefined;
    const k = PRIOR_WEIGHT, r = PRIOR_STEP_TOKENS;
    // normal equations of sum w (y - a - b T)^2 + k (a - r b)^2
    const m00 = this.w + k, m01 = this.sT - k * r, m11 = this.sTT + k * r * r;
    const det = m00 * m11 - m01 * m01;
    const meanT = this.sT / this.w, meanY = this.sY / this.w;
    let a: number, b: number;
    if (det > 1e-9 * m00 * m11) {
      a = (m11 * this.sY - m01 * this.sTY) / det;
      b = (m00 * this.sTY - m01 * this.sY) / det;
    } else {
      b = meanY / (meanT + r);
      a = r * b;
    }
    b = Math.max(b, (MIN_SLOPE_SHARE * meanY) / meanT);
    a = Math.max(a, 0);
    return { a, b };
  }
}

/** Engine-wide speculation counts (EngineStats.speculation, /metrics). */
export interface SpeculationStats {
  /** draft tokens verified */
  draftTokens: number;
  /** of those, accepted */
  acceptedTokens: number;
  /** verify rows (a row with a draft, in a step) */
  verifies: number;
  /** acceptedLengths[n]: verify rows that accepted n draft tokens */
  acceptedLengths: number[];
}

interface Rate {
  mean: number;
  steps: number;
}

/** One batch size's measured rates and where its exploring stands. */
interface BatchRates {
  drafted: Rate;
  plain: Rate;
  /** adaptive rows decode plainly at this batch size until the decode-step clock reaches this */
  plainUntil: number;
  /** the next plain stretch's length, in decode steps */
  stretch: number;
}

export class DraftPlanner implements DraftPlanning {
  readonly costs = new StepCosts();
  readonly stats: SpeculationStats = { draftTokens: 0, acceptedTokens: 0, verifies: 0, acceptedLengths: [] };
  /** sampling rows and tokens of the last step measured: the batch an adaptive row judges itself against */
  private lastStep = { rows: 1, tokens: 1 };
  /** mean interval of pipelined plain steps, by their rows */
  private readonly pipelined = new Map<number, number>();
  /** emitted tokens per ms of steps with drafts and without, by their sampling rows */
  private readonly emitted = new Map<number, BatchRates>();
  /** decode steps recorded (recordEmitted): the clock of the plain stretches */
  private clock = 0;

  depths(asks: readonly DraftAsk[], rows: readonly ScheduledRow[], budget: number): number[] {
    const depth = asks.map(() => 0);
    let left = budget;
    let tokens = rows.reduce((n, r) => n + r.count, 0);
    // fixed depths: their proposals whole, in row order
    asks.forEach((ask, i) => {
      if (ask.row.seq.method.acceptance !== undefined) return;
      depth[i] = Math.min(ask.draft.tokens.length, left);
      left -= depth[i]!;
      tokens += depth[i]!;
    });
    // adaptive depths: draft tokens by expected gain, while each pays for itself
    const gains: { i: number; g: number }[] = [];
    asks.forEach((ask, i) => {
      const a = ask.row.seq.method.acceptance;
      if (a === undefined) return;
      let g = a;
      for (let k = 0; k < ask.draft.tokens.length; k++, g *= a) gains.push({ i, g });
    });
    if (gains.length === 0 || left <= 0 || !this.measuredPays(rows.filter((r) => r.sample).length)) return depth;
    gains.sort((x, y) => y.g - x.g); // stable: a row's gains stay in depth order
    const { a, b } = this.line();
    const sampling = rows.filter((r) => r.sample).length;
    const plain = { rate: sampling / this.plainCost(rows.length, tokens), fixed: tokens };
    let expected = sampling;
    const adaptive = depth.slice();
    for (const { i, g } of gains) {
      if (left <= 0 || g <= (b * expected) / (a + b * tokens)) break;
      adaptive[i]!++;
      expected += g;
      tokens++;
      left--;
    }
    // the drafts must beat the plain step they replace, pipelined where it would be
    if (tokens > plain.fixed && expected / (a + b * tokens) <= plain.rate) return depth;
    return adaptive;
  }

  /** What a plain step of `rows` rows and `tokens` tokens costs: the fitted line, or the pipelined steps' interval when less. */
  private plainCost(rows: number, tokens: number): number {
    const { a, b } = this.line();
    const c = a + b * tokens;
    return Math.min(c, this.pipelined.get(rows) ?? c);
  }

  /**
   * Whether a row of acceptance `acceptance` would draft at all (up to `depth` tokens) in a plain
   * step of as many rows as the last one measured: whether some depth makes the step's rate beat
   * the plain step's, pipelined where it would be. A row that would not is a plain row, and may
   * be pipelined.
   */
  drafts(acceptance: number, depth: number): boolean {
    const { a, b } = this.line();
    const rows = this.lastStep.rows;
    if (!this.measuredPays(rows)) return false;
    const plain = rows / this.plainCost(rows, rows);
    let expected = rows;
    for (let k = 1, g = acceptance; k <= depth; k++, g *= acceptance) {
      expected += g;
      if (expected / (a + b * (rows + k)) > plain) return true;
    }
    return false;
  }

  /** A step run to its end (not pipelined): its tokens, sampling rows and wall-clock milliseconds. */
  recordStep(tokens: number, rows: number, ms: number): void {
    this.costs.record(tokens, ms);
    this.lastStep = { rows: Math.max(1, rows), tokens: Math.max(1, tokens) };
  }

  /** A pipelined plain step of `rows` rows, `ms` after the step before it ended. */
  recordPipelined(rows: number, ms: number): void {
    if (!(ms > 0)) return;
    const old = this.pipelined.get(rows);
    this.pipelined.set(rows, old === undefined ? ms : old + PIPELINED_RATE * (ms - old));
  }

  /**
   * A step's outcome in wall time: `emitted` tokens appended to its `rows` sampling rows, `ms` from
   * the end of the step before it to its own end, `drafted` whether any row of it had a draft.
   */
  recordEmitted(rows: number, emitted: number, ms: number, drafted: boolean): void {
    if (!(ms > 0) || rows <= 0) return;
    this.clock++;
    const e = this.ratesAt(rows);
    const r = drafted ? e.drafted : e.plain;
    const x = emitted / ms;
    r.mean = r.steps === 0 ? x : r.mean + EMITTED_RATE * (x - r.mean);
    r.steps++;
  }

  /**
   * false while, at `rows` sampling rows, adaptive rows decode plainly: plain decoding is being
   * measured, or drafting was measured slower than it and the stretch that follows has not ended.
   * Deciding is idempotent within a step: every row of it asks.
   */
  private measuredPays(rows: number): boolean {
    const e = this.ratesAt(rows);
    if (this.clock < e.plainUntil) return false;
    if (e.drafted.steps < EMITTED_MIN_STEPS) return true;
    if (e.plain.steps < EMITTED_MIN_STEPS) {
      e.plainUntil = this.clock + PLAIN_PROBE_STEPS;
      return false;
    }
    // plain decoding at its best: pipelined where its steps were
    const interval = this.pipelined.get(rows);
    const plain = Math.max(e.plain.mean, interval === undefined ? 0 : rows / interval);
    if (e.drafted.mean >= plain) {
      e.stretch = EXPLORE_FIRST_STEPS;
      return true;
    }
    e.plainUntil = this.clock + e.stretch;
    e.stretch = Math.min(2 * e.stretch, EXPLORE_MAX_STEPS);
    e.drafted = { mean: 0, steps: 0 }; // measured afresh when the stretch ends
    return false;
  }

  /**
   * The rates at `rows` sampling rows. A batch size seen for the first time (rows finishing one by
   * one at the end of a batch make one after another) starts where the nearest measured one
   * stands: in its plain stretch, if it is in one, so that drafting found slower at 16 rows is not
   * explored again at 15, 14, ... Its rates are its own (a step's cost need not scale with rows).
   */
  private ratesAt(rows: number): BatchRates {
    let e = this.emitted.get(rows);
    if (e) return e;
    let near: BatchRates | undefined, gap = Infinity;
    for (const [r, x] of this.emitted) if (Math.abs(r - rows) < gap) [near, gap] = [x, Math.abs(r - rows)];
    e = { drafted: { mean: 0, steps: 0 }, plain: { mean: 0, steps: 0 }, plainUntil: near?.plainUntil ?? 0, stretch: near?.stretch ?? EXPLORE_FIRST_STEPS };
    this.emitted.set(rows, e);
    return e;
  }

  /** A verify row's outcome: `drafted` tokens, `accepted` of them. */
  recordVerify(drafted: number, accepted: number): void {
    const s = this.stats;
    s.draftTokens += drafted;
    s.acceptedTokens += accepted;
    s.verifies++;
    while (s.acceptedLengths.length <= accepted) s.acceptedLengths.push(0);
    s.acceptedLengths[accepted]!++;
  }

  private line(): { a: number; b: number } {
    return this.costs.line() ?? { a: PRIOR_STEP_TOKENS, b: 1 };
  }
}
