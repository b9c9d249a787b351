// Turns a step's results into each row's progress, through the row's decoding method
// (methods/): how many of the KV positions it computed hold verified tokens (a plain row: all;
// a speculative row: those of its accepted drafts), that KV committed (so the prefix cache can
// hash it), then the row's tokens (sampled from its logits, or the device's picks or samples),
// then the tokens its grammar forces after them, appended through append-tokens.ts (which checks
// the stop conditions after each). A row that fails here (sampler error, grammar rejection) ends
// alone.

import type { ModelConfig } from '../contracts/model-config.ts';
import type { RowPick, StepResult } from '../models/decoder.ts';
import type { KvCache } from '../state/kv-cache.ts';
import { decodeDeviceSamples, type DeviceSampleOutcome } from '../sampling/index.ts';
import { GrammarRowError } from '../sampling/grammar/index.ts';
import type { FinishFn } from './append-tokens.ts';
import { logitRowsOf } from './scheduler.ts';
import type { Sequence } from './sequence.ts';
import type { InFlight } from './step-launch.ts';

export type { FinishFn } from './append-tokens.ts';

/** what one logit row's token comes from (a method's verify and accept) */
export type TokenSource =
  | { logits: Float32Array }
  | { greedy: number }
  /** `u`: the uniform its sampleRows row drew (none when greedy) */
  | { device: DeviceSampleOutcome; u?: number }
  | { failed: unknown };

/**
 * Where each scheduled row's tokens come from this step, one source per logit row of the row (its
 * last known position, then each draft; undefined for a row that samples nothing), built once
 * per step from the rows' picks. The results are packed by pick, in logit-row order: the device's
 * greedy tokens one per logit row, the logits one row per 'logits' pick, the sampleRows results
 * one per 'sample' pick.
 */
export function tokenSources({ rows, step, sampled }: InFlight, result: StepResult, vocabSize: number): (TokenSource[] | undefined)[] {
  const outcomes = result.samples ? decodeDeviceSamples(result.samples, sampled.map((d) => d.row)) : [];
  /** how many rows of each pick came before */
  const before: Record<RowPick, number> = { logits: 0, argmax: 0, sample: 0 };
  let logitRow = 0;
  const source = (): TokenSource => {
    const li = logitRow++;
    const pick = step.picks?.[li] ?? 'logits';
    const k = before[pick]++;
    switch (pick) {
      case 'logits': return { logits: result.logits.subarray(k * vocabSize, (k + 1) * vocabSize) };
      case 'argmax': return { greedy: result.tokens![li]! };
      case 'sample': {
        const d = sampled[k]!;
        if (d.failed) return { failed: d.failed.error };
        return d.u === undefined ? { device: outcomes[k]! } : { device: outcomes[k]!, u: d.u };
      }
    }
  };
  return rows.map((row): TokenSource[] | undefined => {
    const n = logitRowsOf(row);
    return n === 0 ? undefined : Array.from({ length: n }, source);
  });
}

export class TokenAcceptor {
  constructor(
    private readonly kv: KvCache,
    private readonly config: ModelConfig,
    private readonly finish: FinishFn,
  ) {}

  /**
   * Takes a step's results, row by row through its method: the positions it keeps (verify), their
   * KV committed (and block hashes), the row's tokens (accept); then the tokens grammars force
   * after them (a row's grammar host works out what it forces while this thread takes the other
   * rows' tokens).
   */
  postprocess(cur: InFlight, result: StepResult): void {
    const sources = tokenSources(cur, result, this.config.vocabSize);
    const forcing: Sequence[] = [];
    cur.rows.forEach((row, r) => {
      const { seq } = row;
      const src = sources[r];
      let kept = row.count;
      if (src && !seq.finished) this.guarded(seq, () => (kept = seq.method.verify(seq, row, src)));
      seq.computed += kept;
      // a verify row keeps the KV of drafts its tokens accept: they are hashed once in the output
      if (!seq.finished) this.kv.commit(seq.kv!, Math.min(seq.computed, seq.known), (p) => seq.tokenAt(p));
      if (!src || seq.finished) return;
      const known = seq.known;
      this.guarded(seq, () => {
        seq.method.accept(seq, row, src, this.finish);
        if (seq.grammar && !seq.finished) forcing.push(seq);
      });
      if (seq.computed > known && !seq.finished) this.kv.commit(seq.kv!, Math.min(seq.computed, seq.known), (p) => seq.tokenAt(p));
    });
    for (const seq of forcing) this.guarded(seq, () => seq.method.advance(seq, this.finish));
  }

  /** Runs a row's part of the step; a failure ends that row alone. */
  private guarded(seq: Sequence, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.finish(seq, 'error', (err as Error).message, err instanceof GrammarRowError ? 'grammar' : undefined);
    }
  }
}
