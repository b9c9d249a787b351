// Turns a step's results into each row's progress: the KV it computed (committed, so the prefix
// cache can hash it), then for every row that reached its end one token (sampled from its logits,
// or the device's pick or sample), recorded, detokenized and emitted, and the stop conditions
// checked. A row that fails here (sampler error, grammar rejection) ends alone.

import type { ModelConfig } from '../contracts/model-config.ts';
import type { StepResult } from '../models/decoder.ts';
import type { KvCache } from '../state/kv-cache.ts';
import { decodeDeviceSamples, topLogprobs, type DeviceSampleOutcome, type TokenLogprobs } from '../sampling/index.ts';
import { GrammarRowError, type RowGrammar } from '../sampling/grammar/index.ts';
import type { FinishReason, Sequence, TokenLogprob } from './sequence.ts';
import type { InFlight } from './step-launch.ts';

/** what a sampling row's token comes from (TokenAcceptor.accept) */
type TokenSource =
  | { logits: Float32Array }
  | { greedy: number }
  | { device: DeviceSampleOutcome }
  | { failed: unknown };

/** Ends a sequence (Engine.finish): retires it and emits its finish event. */
export type FinishFn = (seq: Sequence, reason: FinishReason, error?: string, errorKind?: 'grammar') => void;

export class TokenAcceptor {
  constructor(
    private readonly kv: KvCache,
    private readonly config: ModelConfig,
    private readonly finish: FinishFn,
  ) {}

  /** Takes a step's results: computed KV (and its block hashes), then each sampling row's token. */
  postprocess({ rows, step, sampled }: InFlight, result: StepResult): void {
    const V = this.config.vocabSize;
    const outcomes = result.samples ? decodeDeviceSamples(result.samples, sampled.map((d) => d.row)) : [];
    let li = 0, hi = 0, si = 0;
    for (const row of rows) {
      row.seq.computed += row.count;
      if (!row.seq.finished) this.kv.commit(row.seq.kv!, row.seq.computed, (p) => row.seq.tokenAt(p));
      if (!row.sample) continue;
      // where this row's token comes from: its logits (when they came back), the device's greedy
      // pick, or its sampleRows result
      const pick = step.picks?.[li] ?? 'logits';
      let src: TokenSource;
      if (pick === 'logits') src = { logits: result.logits.subarray(hi * V, ++hi * V) };
      else if (pick === 'argmax') src = { greedy: result.tokens![li]! };
      else {
        const d = sampled[si]!;
        src = d.failed ? { failed: d.failed.error } : { device: outcomes[si]! };
        si++;
      }
      li++;
      if (row.seq.finished) continue;
      try {
        this.accept(row.seq, src);
      } catch (err) {
        this.finish(row.seq, 'error', (err as Error).message, err instanceof GrammarRowError ? 'grammar' : undefined);
      }
    }
  }

  /**
   * Samples (or takes the device's greedy pick or sampled token), records and emits one token of
   * `seq`, finishing it when a stop condition holds.
   */
  private accept(seq: Sequence, src: TokenSource): void {
    const grammar = seq.grammar;
    // a complete grammar that allows nothing but a stop token: end here, no token to sample
    if (grammar?.onlyStopAllowed()) return this.finish(seq, 'stop');
    let id: number;
    let r: TokenLogprobs | undefined;
    if ('logits' in src) {
      id = seq.sampler.sample(src.logits, seq.history, grammar?.mask());
      if (seq.request.topLogprobs !== undefined) r = topLogprobs(src.logits, seq.request.topLogprobs, id);
    } else if ('device' in src) {
      if ('error' in src.device) throw new Error(src.device.error);
      id = src.device.tokenId;
      r = src.device.logprobs;
    } else if ('failed' in src) throw src.failed;
    else if (src.greedy >= 0) id = src.greedy;
    else throw new Error('cannot sample: every logit is -Infinity or NaN');
    grammar?.accept(id);
    seq.history.push(id);
    seq.output.push(id);
    seq.firstTokenAt ??= performance.now();
    const lp: TokenLogprob | undefined = r && { token_id: id, logprob: r.logprob, top: r.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) };
    if (seq.eos.has(id)) {
      seq.emit({ type: 'token', tokenId: id, text: '', logprobs: lp });
      return this.finish(seq, 'stop');
    }
    const fed = seq.stops.feed(seq.detok.push(id));
    seq.emit({ type: 'token', tokenId: id, text: fed.text, logprobs: lp });
    if (fed.stopped) return this.finish(seq, 'stop');
    if (seq.known >= seq.maxTokensTotal) return this.finish(seq, 'length');
    if (grammar) this.advanceGrammar(seq, grammar);
  }

  /**
   * After a grammar row's token: when the grammar forces the next characters, they are appended
   * without sampling (jump-forward), and the catch-up rule computes them with the next step as one
   * chunk. Not with logprobs: forced tokens have no logits of their own to report.
   */
  private advanceGrammar(seq: Sequence, grammar: RowGrammar): void {
    if (seq.request.topLogprobs !== undefined) return;
    const forced = grammar.jumpForward(seq.maxTokensTotal - seq.known);
    for (const id of forced) {
      seq.history.push(id);
      seq.output.push(id);
      const fed = seq.stops.feed(seq.detok.push(id));
      seq.emit({ type: 'token', tokenId: id, text: fed.text });
      if (fed.stopped) return this.finish(seq, 'stop');
      if (seq.known >= seq.maxTokensTotal) return this.finish(seq, 'length');
    }
  }
}
