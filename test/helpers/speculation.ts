// Speculative decoding in the engine tests: a request's run (tokens, logprobs, text, finish), its
// bit-for-bit comparison with another run, and scripted proposers whose drafts a test controls
// (the continuation a plain run produced, corrupted at chosen positions, so acceptances and
// rejections land where the test wants them).
import assert from 'node:assert/strict';

import type { Engine } from '../../src/execution/engine.ts';
import type { Draft, Proposer, SpeculationCounts } from '../../src/execution/methods/method.ts';
import type { EngineRequest, Sequence } from '../../src/execution/sequence.ts';

export interface Run {
  tokens: number[];
  logprobs: number[];
  top: number[][];
  /** every event's text, in order */
  texts: string[];
  finish: string;
  completionTokens: number;
  cachedTokens: number;
  speculation?: SpeculationCounts;
  error?: string;
}

/** Runs a request to its end through Engine.submit, recording everything it emitted. */
export function runOf(engine: Engine, req: EngineRequest, signal?: AbortSignal, onToken?: (n: number) => void): Promise<Run> {
  return new Promise((resolve) => {
    const run: Run = { tokens: [], logprobs: [], top: [], texts: [], finish: '', completionTokens: 0, cachedTokens: 0 };
    engine.submit(req, (e) => {
      run.texts.push(e.text);
      if (e.type === 'token') {
        run.tokens.push(e.tokenId);
        if (e.logprobs) {
          run.logprobs.push(e.logprobs.logprob);
          run.top.push(e.logprobs.top.flatMap((t) => [t.token_id, t.logprob]));
        }
        onToken?.(run.tokens.length);
        return;
      }
      Object.assign(run, { finish: e.finishReason, completionTokens: e.completionTokens, cachedTokens: e.cachedTokens, speculation: e.speculation, error: e.error });
      resolve(run);
    }, signal);
  });
}

/** The same tokens, texts and finish as `want`, and logprobs equal bit for bit (Object.is). */
export function sameRun(got: Run, want: Run, what: string): void {
  assert.equal(got.error, want.error, `${what}: error`);
  assert.deepEqual(got.tokens, want.tokens, `${what}: tokens`);
  assert.equal(got.texts.join(''), want.texts.join(''), `${what}: text`);
  assert.equal(got.finish, want.finish, `${what}: finish reason`);
  assert.equal(got.completionTokens, want.completionTokens, `${what}: completion tokens`);
  assert.equal(got.logprobs.length, want.logprobs.length, `${what}: logprob count`);
  for (let i = 0; i < want.logprobs.length; i++) {
    assert.ok(Object.is(got.logprobs[i], want.logprobs[i]), `${what}: token ${i} logprob ${got.logprobs[i]} vs ${want.logprobs[i]}`);
    assert.deepEqual(got.top[i], want.top[i], `${what}: token ${i} top logprobs`);
  }
}

/**
 * A proposer that drafts the continuation `expected` (what a plain run of the same request
 * produced), each draft token replaced by another where `wrong(outputIndex)` holds: every draft
 * token is accepted where it is right, and the first wrong one is rejected.
 */
export function scripted(expected: readonly number[], vocab: number, wrong: (i: number) => boolean = () => false): () => Proposer {
  return () => ({
    propose(seq: Sequence, max: number): Draft | undefined {
      const at = seq.output.length;
      const tokens = expected.slice(at, at + max).map((t, k) => (wrong(at + k) ? (t + 1) % vocab : t));
      return tokens.length > 0 ? { tokens } : undefined;
    },
  });
}
