// What bounds the event-loop time of a request body before any route sees it: nesting deeper than
// MAX_JSON_DEPTH is refused before JSON.parse (which takes about a second over 4 MiB of "[[[["),
// and a logit_bias map with more entries than the vocabulary is refused before its entries are
// checked one by one, with an error message that lists a few problems, not all of them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { ServedModel } from '../../src/server/served-model.ts';
import { Fields } from '../../src/server/fields.ts';
import { HttpError } from '../../src/server/errors.ts';
import { parseJsonObject } from '../../src/server/http-io.ts';
import { jsonDepthExceeds, MAX_JSON_DEPTH } from '../../src/server/json-depth.ts';
import { parseGenerationParams } from '../../src/server/openai-params.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const loaded = await loadModel(new ReferenceBackend(), writeTinyLlama({ maxPositions: 64 }));
const model = new ServedModel('tiny', loaded, new Engine(loaded.model, loaded, { maxBatch: 1 }));

function httpError(fn: () => unknown): HttpError {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof HttpError, `expected an HttpError, got ${e}`);
    return e;
  }
  assert.fail('expected a throw');
}

const nested = (depth: number, open = '[', close = ']') => open.repeat(depth) + close.repeat(depth);

test('jsonDepthExceeds counts arrays and objects, never brackets inside strings', () => {
  assert.equal(jsonDepthExceeds(Buffer.from(nested(3)), 3), false);
  assert.equal(jsonDepthExceeds(Buffer.from(nested(4)), 3), true);
  assert.equal(jsonDepthExceeds(Buffer.from('{"a":{"b":{"c":[1]}}}'), 4), false);
  assert.equal(jsonDepthExceeds(Buffer.from('{"a":{"b":{"c":[1]}}}'), 3), true);
  // brackets in strings, escaped quotes and backslashes, short strings and long ones
  for (const s of ['[[[[', '\\"[[[[', 'x\\\\', `${'y'.repeat(100)}\\"[[[[`, `${'z'.repeat(31)}\\\\`, `é${'[{'.repeat(50)}`]) {
    const body = Buffer.from(JSON.stringify({ s, t: [[1]] }));
    assert.equal(jsonDepthExceeds(body, 3), false, s); // the object and two arrays
    assert.equal(jsonDepthExceeds(body, 2), true, s);
  }
  // values after a long string are still counted
  assert.equal(jsonDepthExceeds(Buffer.from(JSON.stringify({ s: 'q'.repeat(5000), t: JSON.parse(nested(5)) })), 5), true);
});

test('a request body nested past MAX_JSON_DEPTH is a 400 (invalid_json) before it is parsed', () => {
  assert.deepEqual(parseJsonObject(Buffer.from(`{"a":${nested(MAX_JSON_DEPTH - 1)}}`)), { a: JSON.parse(nested(MAX_JSON_DEPTH - 1)) });
  for (const body of [`{"a":${nested(MAX_JSON_DEPTH)}}`, `{"m":${nested(2_000_000)}}`, `{"o":${'{"k":'.repeat(MAX_JSON_DEPTH)}1${'}'.repeat(MAX_JSON_DEPTH)}}`]) {
    const e = httpError(() => parseJsonObject(Buffer.from(body)));
    assert.equal(e.status, 400);
    assert.equal(e.options.code, 'invalid_json');
    assert.equal(e.message, `the request body nests arrays and objects more than ${MAX_JSON_DEPTH} deep`);
  }
});

test('logit_bias: more entries than the vocabulary is one 400; many bad entries list ten problems and a count', () => {
  const huge = Object.fromEntries(Array.from({ length: 100_000 }, (_, i) => [String(i), 1]));
  const e = httpError(() => parseGenerationParams(new Fields({ logit_bias: huge }), model, 'chat'));
  assert.equal(e.status, 400);
  assert.equal(e.options.param, 'logit_bias');
  assert.equal(e.message, `logit_bias has 100000 entries; the vocabulary has ${model.vocabSize} tokens`);
  // as many entries as the vocabulary, all out of range: the message stays short
  const bad = Object.fromEntries(Array.from({ length: model.vocabSize }, (_, i) => [String(10_000 + i), 1]));
  const m = httpError(() => parseGenerationParams(new Fields({ logit_bias: bad }), model, 'chat')).message;
  assert.equal(m.split('; ').length, 11, m);
  assert.match(m, /^logit_bias token id 10000 is out of range \[0, 258\];/);
  assert.match(m, new RegExp(`; and ${model.vocabSize - 10} more$`));
  // a full valid map is fine
  const full = Object.fromEntries(Array.from({ length: model.vocabSize }, (_, i) => [String(i), 0.5]));
  assert.equal(parseGenerationParams(new Fields({ logit_bias: full }), model, 'chat').sampling.logitBias !== undefined, true);
});
