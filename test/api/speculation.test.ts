// The library API takes the speculative options: load()'s for every request, a request's own (or
// false for none); a completion reports its draft counts; a constrained request drafts under its grammar.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { resolve } from 'node:path';
import { load } from '../../src/api/index.ts';

test('load({ speculative }) speculates every request; a request may turn it off or choose its own', async () => {
  const llm = await load({ model: resolve(import.meta.dirname, '../fixtures/llama'), device: 'cpu', speculative: { proposer: 'ngram', ngramMin: 1, numDraftTokens: 4 } });
  try {
    const o = { prompt: 'the cat sat on the mat. the cat sat on the', maxTokens: 24, temperature: 0, ignoreEos: true };
    const spec = await llm.complete(o);
    const off = await llm.complete({ ...o, speculative: false });
    const own = await llm.complete({ ...o, speculative: { proposer: 'ngram', numDraftTokens: 2, ngramMin: 1, ngramMax: 2 } });
    assert.deepEqual(spec.tokenIds, off.tokenIds);
    assert.deepEqual(own.tokenIds, off.tokenIds);
    assert.equal(off.speculation, undefined);
    assert.ok(spec.speculation!.draftTokens > 0, JSON.stringify(spec.speculation));
    assert.ok(own.speculation!.draftTokens > 0);
    await assert.rejects(llm.complete({ ...o, speculative: { proposer: 'ngram', ngramMin: 0 } }), /speculative.ngramMin must be an integer from 1 to 64, got 0/);
    // a constrained request drafts too, its drafts judged under the grammar: the text of plain constrained decoding
    const json = { prompt: 'the cat sat on the mat. the cat sat on the', maxTokens: 40, temperature: 0, responseFormat: { type: 'json_schema' as const, json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string', maxLength: 24 } }, required: ['a'] } } } };
    const constrained = await llm.complete(json);
    const constrainedOff = await llm.complete({ ...json, speculative: false });
    assert.equal(constrained.text, constrainedOff.text);
    assert.deepEqual(constrained.tokenIds, constrainedOff.tokenIds);
    assert.ok(constrained.speculation!.draftTokens > 0, JSON.stringify(constrained.speculation));
    assert.equal(typeof JSON.parse(constrained.text).a, 'string');
  } finally {
    await llm.close(0);
  }
});

test('load({ draftModel }): a request asks for the draft model (or it is the default), the same tokens as without', async () => {
  const fixtures = resolve(import.meta.dirname, '../fixtures');
  const llm = await load({ model: `${fixtures}/llama`, device: 'cpu', draftModel: `${fixtures}/qwen3` });
  try {
    const o = { prompt: 'the cat sat on the mat. the cat sat on the', maxTokens: 24, temperature: 0, ignoreEos: true };
    const plain = await llm.complete(o);
    const drafted = await llm.complete({ ...o, speculative: { proposer: 'draft', numDraftTokens: 3 } });
    assert.deepEqual(drafted.tokenIds, plain.tokenIds);
    assert.equal(plain.speculation, undefined, 'no default speculation: plain');
    assert.ok(drafted.speculation!.draftTokens > 0, JSON.stringify(drafted.speculation));
  } finally {
    await llm.close(0);
  }
  await assert.rejects(load({ model: `${fixtures}/llama`, device: 'cpu', speculative: { proposer: 'draft' } }), /proposer 'draft' needs a draft model/);
});

test('load({ draftModel: an EAGLE-3 head }): requests with proposer eagle3 draft from it, the same tokens as without', async () => {
  const root = resolve(import.meta.dirname, '../..');
  const llm = await load({ model: `${root}/models/demo`, device: 'cpu', draftModel: `${root}/models/demo-eagle3` });
  try {
    const o = { prompt: 'class Stack:', maxTokens: 32, temperature: 0, ignoreEos: true };
    const plain = await llm.complete(o);
    const drafted = await llm.complete({ ...o, speculative: { proposer: 'eagle3', numDraftTokens: 3 } });
    assert.deepEqual(drafted.tokenIds, plain.tokenIds);
    assert.ok(drafted.speculation!.draftTokens > 0, JSON.stringify(drafted.speculation));
    await assert.rejects(llm.complete({ ...o, speculative: { proposer: 'draft' } }), /proposer 'draft' needs a draft model/);
  } finally {
    await llm.close(0);
  }
});
