import { test } from 'node:test';
import assert from 'node:assert/strict';
import { validateSamplingParams, assertValidSamplingParams, SamplingParamsError } from '../../src/sampling/validate.ts';
import { resolveSamplingParams } from '../../src/sampling/params.ts';

const messages = (input: Parameters<typeof validateSamplingParams>[0], vocab?: number): string[] =>
  validateSamplingParams(input, vocab).map((i) => `${i.param}: ${i.message}`);

test('valid parameters give no issues', () => {
  assert.deepEqual(
    messages({ temperature: 0, topK: -1, topP: 1, minP: 0, presencePenalty: -2, frequencyPenalty: 2, repetitionPenalty: 1.3, seed: -5, logitBias: { '3': 100, 4: -100 } }, 10),
    [],
  );
  assert.deepEqual(messages({}), []);
});

test('each out-of-range value is reported with its wire name and value', () => {
  assert.deepEqual(messages({ temperature: -0.1 }), ['temperature: temperature must be >= 0 (0 = greedy), got -0.1']);
  assert.deepEqual(messages({ topP: 0 }), ['top_p: top_p must be in (0, 1], got 0']);
  assert.deepEqual(messages({ topP: 1.5 }), ['top_p: top_p must be in (0, 1], got 1.5']);
  assert.deepEqual(messages({ topK: -2 }), ['top_k: top_k must be an integer >= -1 (0 or -1 = disabled), got -2']);
  assert.deepEqual(messages({ topK: 2.5 }), ['top_k: top_k must be an integer >= -1 (0 or -1 = disabled), got 2.5']);
  assert.deepEqual(messages({ minP: 1.01 }), ['min_p: min_p must be in [0, 1], got 1.01']);
  assert.deepEqual(messages({ presencePenalty: 2.5 }), ['presence_penalty: presence_penalty must be in [-2, 2], got 2.5']);
  assert.deepEqual(messages({ frequencyPenalty: -3 }), ['frequency_penalty: frequency_penalty must be in [-2, 2], got -3']);
  assert.deepEqual(messages({ repetitionPenalty: 0 }), ['repetition_penalty: repetition_penalty must be > 0 (1 = disabled), got 0']);
  assert.deepEqual(messages({ seed: 1.5 }), ['seed: seed must be an integer within +-(2^53 - 1), got 1.5']);
  assert.deepEqual(messages({ temperature: NaN }), ['temperature: temperature must be a finite number, got NaN']);
  assert.deepEqual(messages({ topP: '0.5' as unknown as number }), ['top_p: top_p must be a finite number, got "0.5"']);
});

test('logit_bias ids and values are checked', () => {
  assert.deepEqual(messages({ logitBias: { '10': 1 } }, 10), ['logit_bias: logit_bias token id 10 is out of range [0, 9]']);
  assert.deepEqual(messages({ logitBias: new Map([[-1, 1]]) }), ['logit_bias: logit_bias token id -1 is out of range >= 0']);
  const canonical = (key: string) => `logit_bias: logit_bias key ${JSON.stringify(key)} is not an integer token id in canonical form (decimal digits, no sign, spaces or leading zeros)`;
  for (const key of ['abc', '-1', '+1', '01', '00', ' 1', '1 ', '1.0', '1e2', ''])
    assert.deepEqual(messages({ logitBias: { [key]: 1 } }), [canonical(key)], key);
  assert.deepEqual(messages({ logitBias: { '0': 1, '10': 2 } }, 20), []);
});

test('logit_bias: one token named twice is refused', () => {
  // as JSON keys "01" and "1" would both be token 1; the non-canonical one is refused
  assert.deepEqual(messages({ logitBias: { '1': 1, '01': 2 } }, 10), [
    'logit_bias: logit_bias key "01" is not an integer token id in canonical form (decimal digits, no sign, spaces or leading zeros)',
  ]);
  // a Map can hold the number and the string
  assert.deepEqual(messages({ logitBias: new Map<string | number, number>([[1, 1], ['1', 2]]) as unknown as Map<number, number> }, 10), [
    'logit_bias: logit_bias names token id 1 twice (keys 1 and "1")',
  ]);
  assert.deepEqual(messages({ logitBias: new Map([[2, 101]]) }, 10), [
    'logit_bias: logit_bias value for token 2 must be a number in [-100, 100], got 101',
  ]);
});

test('every issue is reported, and assert throws them all', () => {
  assert.equal(messages({ temperature: -1, topP: 2, minP: -1 }).length, 3);
  assert.throws(
    () => assertValidSamplingParams({ temperature: -1, topK: -5 }),
    (e: unknown) => e instanceof SamplingParamsError && e.issues.length === 2 && /temperature.*; top_k/.test(e.message),
  );
});

test('resolve fills defaults and turns record keys into numeric ids', () => {
  const p = resolveSamplingParams({ topP: 0.9, logitBias: { '7': 2 } });
  assert.equal(p.temperature, 1);
  assert.equal(p.topK, 0);
  assert.equal(p.topP, 0.9);
  assert.equal(p.logitBias.get(7), 2);
});
