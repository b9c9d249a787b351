import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TokenHistory } from '../../src/sampling/history.ts';
import { applyBiasAndPenalties } from '../../src/sampling/penalties.ts';
import { resolveSamplingParams, type SamplingParamsInput } from '../../src/sampling/params.ts';
import { Sampler, processLogits } from '../../src/sampling/sampler.ts';

function run(logits: number[], params: SamplingParamsInput, prompt: number[], output: number[]): number[] {
  const h = new TokenHistory(prompt);
  for (const id of output) h.push(id);
  const x = Float32Array.from(logits);
  applyBiasAndPenalties(x, resolveSamplingParams(params), h);
  return Array.from(x);
}

test('repetition penalty (HF): divides positive, multiplies negative, over prompt and output', () => {
  // token 0 in prompt (positive), token 1 in output (negative), token 2 unseen
  assert.deepEqual(run([2, -2, 1, 0.5], { repetitionPenalty: 2 }, [0, 0], [1]), [1, -4, 1, 0.5]);
  // a token in both prompt and output is penalised once, not twice
  assert.deepEqual(run([8, 0], { repetitionPenalty: 2 }, [0], [0, 0]), [4, 0]);
});

test('frequency and presence (OpenAI): generated tokens only, count-weighted vs once', () => {
  // output counts {3: 2, 1: 1}; token 2 appears only in the prompt and is untouched
  const got = run([1, 1, 1, 1], { frequencyPenalty: 0.5, presencePenalty: 1 }, [2], [3, 3, 1]);
  assert.deepEqual(got, [1, 1 - 0.5 - 1, 1, 1 - 2 * 0.5 - 1]);
  // negative penalties encourage
  assert.deepEqual(run([0, 0], { presencePenalty: -1 }, [], [1]), [0, 1]);
});

test('logit bias adds to the raw logits, applied before repetition penalty (vLLM v1 order)', () => {
  assert.deepEqual(run([1, 1, 1], { logitBias: { 0: 5, 2: -100 } }, [], []), [6, 1, -99]);
  // bias first: (1 + 3) / 2 = 2, not 1 / 2 + 3 = 3.5
  assert.deepEqual(run([1, 0], { logitBias: { 0: 3 }, repetitionPenalty: 2 }, [0], []), [2, 0]);
});

test('the raw row is never modified, and is returned as is when nothing is active', () => {
  const raw = Float32Array.from([1, 2, 3]);
  const h = new TokenHistory([0]);
  assert.equal(processLogits(raw, resolveSamplingParams({}), h), raw);
  const out = processLogits(raw, resolveSamplingParams({ repetitionPenalty: 2 }), h);
  assert.notEqual(out, raw);
  assert.deepEqual(Array.from(raw), [1, 2, 3]);
  assert.deepEqual(Array.from(out), [0.5, 2, 3]);
});

test('greedy still applies penalties and bias', () => {
  const h = new TokenHistory();
  h.push(0);
  const row = Float32Array.from([3, 2.5]);
  assert.equal(new Sampler({ temperature: 0 }).sample(row, h), 0);
  assert.equal(new Sampler({ temperature: 0, repetitionPenalty: 2 }).sample(row, h), 1);
  assert.equal(new Sampler({ temperature: 0, logitBias: { 1: 1 } }).sample(row), 1);
  assert.throws(() => new Sampler({ presencePenalty: 1 }).sample(row), /no TokenHistory/);
});

test('history counts are incremental and truncate undoes them', () => {
  const h = new TokenHistory([5, 6]);
  for (const id of [1, 2, 2, 5]) h.push(id);
  assert.equal(h.count(2), 2);
  assert.equal(h.count(5), 1);
  assert.deepEqual([...h.seen()].sort(), [1, 2, 5, 6]);
  h.truncate(2); // drops the last 2 and 5
  assert.deepEqual(h.outputTokens, [1, 2]);
  assert.equal(h.count(2), 1);
  assert.equal(h.count(5), 0);
  assert.ok(h.seen().has(5), 'prompt token stays seen');
  h.truncate(0);
  assert.deepEqual([...h.seen()].sort(), [5, 6]);
  assert.deepEqual([...h.outputCountEntries()], []);
});
