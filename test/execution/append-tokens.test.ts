// appendTokens (src/execution/append-tokens.ts), the one path by which tokens join an output: a
// run ends exactly where the same tokens appended one at a time end (a stop string, an EOS,
// max_tokens), with the same events; and tokenSources, each row's token sources built once a step.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { appendTokens, type RunToken } from '../../src/execution/append-tokens.ts';
import { Sequence, type EngineRequest, type FinishReason, type SequenceEvent } from '../../src/execution/sequence.ts';
import { tokenSources } from '../../src/execution/token-accept.ts';
import type { InFlight } from '../../src/execution/step-launch.ts';
import type { PendingStep, RowPick, StepResult } from '../../src/models/decoder.ts';

/** token i spells letter i; token 9 is the EOS */
const LETTERS = 'abcdefghi';
const EOS = 9;
const decode = (ids: number[]) => ids.map((i) => (i === EOS ? '' : LETTERS[i]!)).join('');

/** A sequence with a 2-token prompt, and what it emitted and how it finished. */
function sequence(request: Partial<EngineRequest> = {}) {
  const events: SequenceEvent[] = [];
  const finishes: FinishReason[] = [];
  const seq = new Sequence(1, { promptIds: [0, 1], maxTokens: 100, ...request }, 1000, 10, [EOS], decode, (e) => events.push(e));
  const finish = (s: Sequence, reason: FinishReason) => {
    s.finished = reason;
    finishes.push(reason);
  };
  return { seq, events, finishes, finish };
}

/** The run appended at once, and the same tokens appended one at a time (stopping once finished), side by side. */
function both(ids: number[], request: Partial<EngineRequest> = {}) {
  const run = sequence(request);
  const appended = appendTokens(run.seq, ids.map((id): RunToken => ({ id })), run.finish);
  const one = sequence(request);
  for (const id of ids) {
    if (one.seq.finished) break;
    appendTokens(one.seq, [{ id }], one.finish);
  }
  assert.deepEqual(run.seq.output, one.seq.output, 'same output as one at a time');
  assert.deepEqual(run.events, one.events, 'same events as one at a time');
  assert.deepEqual(run.finishes, one.finishes, 'same ending as one at a time');
  return { ...run, appended };
}

describe('appendTokens', () => {
  it('a run that meets no end is appended whole, its text emitted token by token', () => {
    const { seq, events, finishes, appended } = both([2, 3, 4]);
    assert.equal(appended, 3);
    assert.deepEqual(seq.output, [2, 3, 4]);
    assert.deepEqual(seq.history.outputTokens, [2, 3, 4]);
    assert.equal(events.map((e) => (e.type === 'token' ? e.text : '')).join(''), 'cde');
    assert.deepEqual(finishes, []);
    assert.ok(seq.firstTokenAt !== undefined);
  });

  it('a stop string completed mid-run ends the sequence at that token; the rest is dropped', () => {
    const { seq, events, finishes, appended } = both([2, 3, 4, 5, 6], { stop: ['de'] });
    assert.equal(appended, 3); // c, d, e: "de" completes at e
    assert.deepEqual(seq.output, [2, 3, 4]);
    assert.deepEqual(finishes, ['stop']);
    // the stop string is never emitted: "c" and nothing after it
    assert.equal(events.map((e) => (e.type === 'token' ? e.text : '')).join(''), 'c');
  });

  it('an EOS mid-run ends the sequence there, emitted with no text', () => {
    const { seq, events, finishes, appended } = both([2, EOS, 3, 4]);
    assert.equal(appended, 2);
    assert.deepEqual(seq.output, [2, EOS]);
    assert.deepEqual(finishes, ['stop']);
    assert.deepEqual(events.at(-1), { type: 'token', tokenId: EOS, text: '', logprobs: undefined });
  });

  it('an EOS is an ordinary token with ignoreEos', () => {
    const { seq, finishes, appended } = both([2, EOS, 3], { ignoreEos: true });
    assert.equal(appended, 3);
    assert.deepEqual(seq.output, [2, EOS, 3]);
    assert.deepEqual(finishes, []);
  });

  it('max_tokens reached mid-run ends it by length', () => {
    const { seq, finishes, appended } = both([2, 3, 4, 5], { maxTokens: 2 });
    assert.equal(appended, 2);
    assert.deepEqual(seq.output, [2, 3]);
    assert.deepEqual(finishes, ['length']);
  });

  it('the first end wins: an EOS before a stop string or the length', () => {
    const { seq, finishes } = both([EOS, 3, 4], { stop: ['d'], maxTokens: 2 });
    assert.deepEqual(seq.output, [EOS]);
    assert.deepEqual(finishes, ['stop']);
  });

  it("each token's logprobs travel with its event", () => {
    const { seq, events, finish } = sequence();
    const lp = { token_id: 2, logprob: -0.5, top: [{ token_id: 2, logprob: -0.5 }] };
    appendTokens(seq, [{ id: 2, logprobs: lp }, { id: 3 }], finish);
    assert.deepEqual(events, [
      { type: 'token', tokenId: 2, text: 'c', logprobs: lp },
      { type: 'token', tokenId: 3, text: 'd', logprobs: undefined },
    ]);
  });
});

describe('tokenSources', () => {
  it("each sampling row's source, whatever the mix of picks; rows that sample nothing have none", () => {
    const { seq } = sequence();
    const V = 3;
    // rows: logits, a prefill chunk (no sample), argmax, sample, logits, sample (its row failed)
    const sample = [true, false, true, true, true, true];
    const picks: RowPick[] = ['logits', 'argmax', 'sample', 'logits', 'sample'];
    const idle = { temperature: 0, topK: 0, topP: 1, minP: 0, u: 0, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0 };
    const cur = {
      rows: sample.map((s) => ({ seq, start: 0, count: 1, sample: s })),
      step: { picks } as unknown as PendingStep,
      sampled: [{ row: idle }, { row: idle, failed: { error: 'mask failed' } }],
    } as unknown as InFlight;
    const result: StepResult = {
      logits: Float32Array.from([0, 1, 2, 3, 4, 5]), // the two 'logits' rows
      tokens: Int32Array.from([-1, 7, -1, -1, -1]), // one per logit row
      samples: Int32Array.from([8, 0, -1, 0]), // the two 'sample' rows, 2 words each
    };
    const got = tokenSources(cur, result, V);
    assert.equal(got.length, 6);
    assert.deepEqual(got[0], [{ logits: Float32Array.from([0, 1, 2]) }]);
    assert.equal(got[1], undefined);
    assert.deepEqual(got[2], [{ greedy: 7 }]);
    assert.deepEqual(got[3], [{ device: { tokenId: 8 } }]);
    assert.deepEqual(got[4], [{ logits: Float32Array.from([3, 4, 5]) }]);
    assert.deepEqual(got[5], [{ failed: 'mask failed' }]);
  });

  it('a step without picks reads every row from its logits', () => {
    const { seq } = sequence();
    const cur = { rows: [{ seq, start: 0, count: 1, sample: true }, { seq, start: 0, count: 1, sample: true }], step: {}, sampled: [] } as unknown as InFlight;
    const got = tokenSources(cur, { logits: Float32Array.from([1, 2, 3, 4]) }, 2);
    assert.deepEqual(got, [[{ logits: Float32Array.from([1, 2]) }], [{ logits: Float32Array.from([3, 4]) }]]);
  });

  it('a row with a draft has one source per logit row: its last known position, then each draft token', () => {
    const { seq } = sequence();
    const V = 2;
    // rows: a plain logits row, a row with a 2-token draft (argmax), a row with a 1-token draft (sampled, the second drew u)
    const picks: RowPick[] = ['logits', 'argmax', 'argmax', 'argmax', 'sample', 'sample'];
    const idle = { temperature: 0, topK: 0, topP: 1, minP: 0, u: 0, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0 };
    const cur = {
      rows: [
        { seq, start: 0, count: 1, sample: true },
        { seq, start: 0, count: 3, sample: true, draft: { tokens: [4, 5] } },
        { seq, start: 0, count: 2, sample: true, draft: { tokens: [6] } },
      ],
      step: { picks } as unknown as PendingStep,
      sampled: [{ row: idle }, { row: { ...idle, u: 0.25 }, u: 0.25 }],
    } as unknown as InFlight;
    const result: StepResult = {
      logits: Float32Array.from([1, 2]),
      tokens: Int32Array.from([-1, 4, 5, 3, -1, -1]),
      samples: Int32Array.from([6, 0, 1, 0]),
    };
    const got = tokenSources(cur, result, V);
    assert.deepEqual(got, [
      [{ logits: Float32Array.from([1, 2]) }],
      [{ greedy: 4 }, { greedy: 5 }, { greedy: 3 }],
      [{ device: { tokenId: 6 } }, { device: { tokenId: 1 }, u: 0.25 }],
    ]);
  });
});
