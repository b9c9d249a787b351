// Structured output through the library API (`load()` -> complete / generate): the server's
// response_format / guided_* as responseFormat / guidedJson / guidedRegex / guidedChoice /
// guidedGrammar. A tiny random model, temperature 1, many seeds submitted together (batched): the
// grammar alone makes every output valid. Also runs the README's structured-output example.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { load, GrammarSpecError, type Llm, type GenerateOptions } from '../../src/api/index.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { runReadmeBlock } from './readme-block.ts';

let dir: string;
let llm: Llm;

before(async () => {
  dir = writeTinyLlama({ maxPositions: 1024 });
  llm = await load({ model: dir, device: 'cpu', maxBatch: 16 });
});
after(async () => {
  await llm.close();
  rmSync(dir, { recursive: true, force: true });
});

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    score: { type: 'number', exclusiveMinimum: -1, maximum: 1 },
    pet: { enum: ['cat', 'catfish', 'dog'] },
  },
  required: ['name', 'age', 'score', 'pet'],
  additionalProperties: false,
};

function validPerson(text: string): boolean {
  let v: any;
  try {
    v = JSON.parse(text);
  } catch {
    return false;
  }
  return v !== null && typeof v === 'object' && Object.keys(v).join() === 'name,age,score,pet' &&
    typeof v.name === 'string' && [...v.name].length <= 6 && Number.isInteger(v.age) && v.age >= 0 && v.age <= 120 &&
    typeof v.score === 'number' && v.score > -1 && v.score <= 1 && ['cat', 'catfish', 'dog'].includes(v.pet);
}

const CASES: { options: GenerateOptions; valid: (t: string) => boolean }[] = [
  { options: { guidedJson: PERSON }, valid: validPerson },
  { options: { guidedJson: JSON.stringify(PERSON) }, valid: validPerson },
  { options: { responseFormat: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } } }, valid: validPerson },
  { options: { guidedRegex: '[a-c]{2,4}-[0-9]{1,3}' }, valid: (t) => /^[a-c]{2,4}-[0-9]{1,3}$/.test(t) },
  { options: { guidedChoice: ['yes', 'yes!', 'no'] }, valid: (t) => ['yes', 'yes!', 'no'].includes(t) },
  { options: { guidedGrammar: 'root ::= "<" item ("," item)? ">"\nitem ::= [0-9] [0-9]?' }, valid: (t) => /^<\d\d?(,\d\d?)?>$/.test(t) },
];

test('complete(): every constraint validates over many seeds, all submitted together', async () => {
  const jobs: Promise<void>[] = [];
  for (let seed = 0; seed < 6; seed++) {
    CASES.forEach((c, k) => {
      jobs.push(llm.complete({ prompt: 'Q:', maxTokens: 200, temperature: 1, seed: seed * 10 + k, ...c.options }).then((r) => {
        assert.equal(r.finishReason, 'stop', `${JSON.stringify(c.options).slice(0, 60)} seed ${seed}: ${r.finishReason} ${JSON.stringify(r.text)}`);
        assert.ok(c.valid(r.text), `${JSON.stringify(c.options).slice(0, 60)} seed ${seed}: ${JSON.stringify(r.text)}`);
      }));
    });
  }
  // any JSON object: unbounded, so max_tokens may cut it; then it is a prefix of one
  for (let seed = 0; seed < 6; seed++) {
    jobs.push(llm.complete({ prompt: 'Q:', maxTokens: 60, temperature: 1, seed, responseFormat: { type: 'json_object' } }).then((r) => {
      assert.ok(r.text.startsWith('{'), r.text);
      if (r.finishReason === 'stop') assert.equal(typeof JSON.parse(r.text), 'object');
      else assert.equal(r.finishReason, 'length');
    }));
  }
  await Promise.all(jobs);
  assert.equal(llm.engine.stats.kvBlocksUsed, 0);
});

test('generate(): a constrained stream validates; chat messages too; leaving the loop early cancels', async () => {
  for (let seed = 0; seed < 3; seed++) {
    let text = '';
    let finish = '';
    for await (const e of llm.generate({ messages: [{ role: 'user', content: 'a person' }], maxTokens: 200, temperature: 1, seed, guidedJson: PERSON })) {
      text += e.text;
      if (e.type === 'finish') finish = e.finishReason;
    }
    assert.equal(finish, 'stop');
    assert.ok(validPerson(text), text);
  }
  let tokens = 0;
  for await (const e of llm.generate({ prompt: 'x', maxTokens: 200, temperature: 1, seed: 1, guidedRegex: '[a-z]{150}' })) {
    if (e.type === 'token' && ++tokens === 3) break;
  }
  assert.equal(tokens, 3);
  for (let k = 0; k < 50 && llm.engine.stats.running + llm.engine.stats.waiting > 0; k++) await new Promise((r) => setTimeout(r, 20));
  assert.equal(llm.engine.stats.running + llm.engine.stats.waiting, 0);
});

test('an invalid constraint rejects with GrammarSpecError (the compiler message); two constraints are a TypeError', async () => {
  await assert.rejects(llm.complete({ prompt: 'x', guidedRegex: '(ab' }), (err: unknown) => {
    assert.ok(err instanceof GrammarSpecError);
    assert.match((err as Error).message, /^invalid regex: Regex parsing error/);
    return true;
  });
  await assert.rejects(llm.complete({ prompt: 'x', guidedJson: { type: 'object', properties: { a: { type: 'strang' } } } }), /invalid JSON schema: .*strang/);
  await assert.rejects(llm.complete({ prompt: 'x', guidedJson: '{not json' }), (err: unknown) => err instanceof GrammarSpecError && /guidedJson is not valid JSON/.test((err as Error).message));
  const stream = llm.generate({ prompt: 'x', guidedGrammar: 'root ::= ' });
  await assert.rejects((async () => {
    for await (const _ of stream) { /* nothing is produced */ }
  })(), /invalid grammar: EBNF parser error/);
  assert.throws(() => llm.complete({ prompt: 'x', guidedRegex: 'a', guidedChoice: ['b'] }), /at most one output constraint; got guidedRegex and guidedChoice/);
  assert.throws(() => llm.generate({ prompt: 'x', responseFormat: { type: 'xml' } as never }), TypeError);
  // text = no constraint
  const plain = await llm.complete({ prompt: 'x', maxTokens: 3, responseFormat: { type: 'text' }, temperature: 0 });
  assert.equal(plain.completionTokens, 3);
});

test("the README's structured-output example runs and prints what it promises", () => {
  const lines = runReadmeBlock('guidedJson');
  const person = JSON.parse(lines[0]!);
  assert.deepEqual(Object.keys(person), ['name', 'age']);
  assert.ok(Number.isInteger(person.age) && person.age >= 0 && person.age <= 120, lines[0]);
  assert.ok(['red', 'green', 'blue'].includes(lines[1]!), lines[1]);
  assert.match(lines[2]!, /^invalid regex: /);
});
