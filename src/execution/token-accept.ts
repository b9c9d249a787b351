// Turns a step's results into each row's progress: the KV it computed (committed, so the prefix
// cache can hash it), then for every row that reached its end one token (sampled from its logits,
// or the device's pick or sample), then the tokens its grammar forces after it, appended through
// append-tokens.ts (which checks the stop conditions after each). A row that fails here (sampler
// error, grammar rejection) ends alone.

import type { ModelConfig } from '../contracts/model-config.ts';
import type { RowPick, StepResult } from '../models/decoder.ts';
import type { KvCache } from '../state/kv-cache.ts';
import { decodeDeviceSamples, topLogprobs, type DeviceSampleOutcome, type TokenLogprobs } from '../sampling/index.ts';
import { GrammarRowError, type RowGrammar } from '../sampling/grammar/index.ts';
import { appendTokens, type FinishFn, type RunToken } from './append-tokens.ts';
import type { Sequence } from './sequence.ts';
import type { InFlight } from './step-launch.ts';

export type { FinishFn } from './append-tokens.ts';

/** what a sampling row's token comes from (TokenAcceptor.accept) */
export type TokenSource =
  | { logits: Float32Array }
  | { greedy: number }
  | { device: DeviceSampleOutcome }
  | { failed: unknown };

/**
 * Where each scheduled row's token comes from this step (undefined for a row that samples
 * nothing), built once per step from the rows' picks. The results are packed by pick, in
 * logit-row order: the device's greedy tokens one per logit row, the logits one row per 'logits'
 * pick, the sampleRows results one per 'sample' pick.
 */
export function tokenSources({ rows, step, sampled }: InFlight, result: StepResult, vocabSize: number): (TokenSource | undefined)[] {
  const outcomes = result.samples ? decodeDeviceSamples(result.samples, sampled.map((d) => d.row)) : [];
  /** how many rows of each pick came before */
  const before: Record<RowPick, number> = { logits: 0, argmax: 0, sample: 0 };
  let logitRow = 0;
  return rows.map((row): TokenSource | undefined => {
    if (!row.sample) return undefined;
    const li = logitRow++;
    const pick = step.picks?.[li] ?? 'logits';
    const k = before[pick]++;
    switch (pick) {
      case 'logits': return { logits: result.logits.subarray(k * vocabSize, (k + 1) * vocabSize) };
      case 'argmax': return { greedy: result.tokens![li]! };
      case 'sample': {
        const d = sampled[k]!;
        return d.failed ? { failed: d.failed.error } : { device: outcomes[k]! };
      }
    }
  });
}

export class TokenAcceptor {
  constructor(
    private readonly kv: KvCache,
    private readonly config: ModelConfig,
    private readonly finish: FinishFn,
  ) {}

  /**
   * Takes a step's results: computed KV (and its block hashes), then each sampling row's token,
   * then the tokens grammars force after them (a row's grammar host works out what it forces
   * while this thread takes the other rows' tokens).
   */
  postprocess(cur: InFlight, result: StepResult): void {
    const sources = tokenSources(cur, result, this.config.vocabSize);
    const forcing: Sequence[] = [];
    cur.rows.forEach(({ seq, count }, r) => {
      seq.computed += count;
      if (!seq.finished) this.kv.commit(seq.kv!, seq.computed, (p) => seq.tokenAt(p));
      const src = sources[r];
      if (!src || seq.finished) return;
      this.guarded(seq, () => {
        this.accept(seq, src);
        if (seq.grammar && !seq.finished) forcing.push(seq);
      });
    });
    for (const seq of forcing) this.guarded(seq, () => this.advanceGrammar(seq, seq.grammar!));
  }

  /** Runs a row's part of the step; a failure ends that row alone. */
  private guarded(seq: Sequence, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.finish(seq, 'error', (err as Error).message, err instanceof GrammarRowError ? 'grammar' : undefined);
    }
  }

  /** Takes one token of `seq` from `src` (advancing its grammar over it) and appends it. */
  private accept(seq: Sequence, src: TokenSource): void {
    const grammar = seq.grammar;
    // a complete grammar that allows nothing but a stop token: end here, no token to sample
    if (grammar?.onlyStopAllowed()) return this.finish(seq, 'stop');
    const token = this.take(seq, src);
    grammar?.accept(token.id);
    appendTokens(seq, [token], this.finish);
  }

  /** The token `src` gives: sampled from its logits, the device's sample, or its greedy pick; with the logprobs asked for. */
  private take(seq: Sequence, src: TokenSource): RunToken {
    let id: number;
    let r: TokenLogprobs | undefined;
    if ('logits' in src) {
      id = seq.sampler.sample(src.logits, seq.history, seq.grammar?.mask());
      if (seq.request.topLogprobs !== undefined) r = topLogprobs(src.logits, seq.request.topLogprobs, id);
    } else if ('device' in src) {
      if ('error' in src.device) throw new Error(src.device.error);
      id = src.device.tokenId;
      r = src.device.logprobs;
    } else if ('failed' in src) throw src.failed;
    else if (src.greedy >= 0) id = src.greedy;
    else throw new Error('cannot sample: every logit is -Infinity or NaN');
    return { id, logprobs: r && { token_id: id, logprob: r.logprob, top: r.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) } };
  }

  /**
   * After a grammar row's token: when the grammar forces the next characters, they are appended
   * without sampling (jump-forward; the matcher has accepted them), and the catch-up rule computes
   * them with the next step as one chunk. Not with logprobs: forced tokens have no logits of their
   * own to report.
   */
  private advanceGrammar(seq: Sequence, grammar: RowGrammar): void {
    if (seq.request.topLogprobs !== undefined) return;
    const forced = grammar.jumpForward(seq.maxTokensTotal - seq.known);
    if (forced.length > 0) appendTokens(seq, forced.map((id) => ({ id })), this.finish);
  }
}
