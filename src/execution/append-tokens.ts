// The one path by which tokens join a sequence's output: a sampled token (a run of one), the
// tokens a grammar forces (jump-forward), or any other run the caller has already decided on (a
// speculative draft's accepted tokens, a strict continuation). Each token is appended exactly as
// a lone sampled token would be (recorded, detokenized, emitted, then the stop conditions
// checked), so a run ends where the same tokens appended one at a time would have ended.

import type { FinishReason, Sequence, TokenLogprob } from './sequence.ts';

/** Ends a sequence (Engine.finish): retires it and emits its finish event. */
export type FinishFn = (seq: Sequence, reason: FinishReason, error?: string, errorKind?: 'grammar') => void;

/** One token of a run: its id and, where the request asked for them and the token has logits, its logprobs. */
export interface RunToken {
  id: number;
  logprobs?: TokenLogprob;
}

/**
 * Appends `run` to `seq` in order. Each token is pushed to the history and the output, then: an
 * EOS token is emitted with no text and ends the sequence ('stop'); any other is detokenized
 * through the stop-string matcher and emitted with the text it releases, and the sequence ends
 * ('stop') when that completes a stop string, or ('length') when it reaches maxTokensTotal. The
 * first ending drops the rest of the run. Returns how many tokens were appended (the ending one
 * included).
 *
 * The caller has advanced the grammar (if any) over these tokens; the sequence must not be
 * finished.
 */
export function appendTokens(seq: Sequence, run: readonly RunToken[], finish: FinishFn): number {
  for (let n = 0; n < run.length; n++) {
    const { id, logprobs } = run[n]!;
    seq.history.push(id);
    seq.output.push(id);
    seq.firstTokenAt ??= performance.now();
    if (seq.eos.has(id)) {
      seq.emit({ type: 'token', tokenId: id, text: '', logprobs });
      finish(seq, 'stop');
      return n + 1;
    }
    const fed = seq.stops.feed(seq.detok.push(id));
    seq.emit({ type: 'token', tokenId: id, text: fed.text, logprobs });
    if (fed.stopped) {
      finish(seq, 'stop');
      return n + 1;
    }
    if (seq.known >= seq.maxTokensTotal) {
      finish(seq, 'length');
      return n + 1;
    }
  }
  return run.length;
}
