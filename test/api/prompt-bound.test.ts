// The library API refuses, from its length alone, a prompt with more characters than the context's
// tokens can cover (the server's bound, token-bound.ts): a ContextLengthError naming characters,
// before any tokenizing, for prompts and for rendered messages alike.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { load, ContextLengthError, type Llm } from '../../src/api/index.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

let dir: string;
let llm: Llm;
const CONTEXT = 64;
const PER = '<|endoftext|>'.length; // the tiny tokenizer's longest token

before(async () => {
  dir = writeTinyLlama({ maxPositions: CONTEXT });
  llm = await load({ model: dir, device: 'cpu', maxBatch: 2 });
});
after(async () => {
  await llm.close();
  rmSync(dir, { recursive: true, force: true });
});

const refusedByLength = (chars: number) => (e: unknown) =>
  e instanceof ContextLengthError &&
  e.message === `the prompt has ${chars} characters: at least ${Math.ceil(chars / PER)} tokens (a token covers at most ${PER} characters), but this model's context holds ${CONTEXT} tokens`;

test('a prompt past the bound is a ContextLengthError from its length, from generate, complete and promptIdsOf', async () => {
  const prompt = ' '.repeat(4_000_000);
  assert.throws(() => llm.promptIdsOf({ prompt }), refusedByLength(prompt.length));
  assert.throws(() => llm.generate({ prompt, maxTokens: 1 }), refusedByLength(prompt.length));
  assert.throws(() => llm.complete({ prompt, maxTokens: 1 }), refusedByLength(prompt.length));
});

test('rendered messages past the bound are refused the same way, counting what the template adds', () => {
  const content = 'x'.repeat(CONTEXT * PER - 10); // fits alone; the template's markup takes it past
  const rendered = `<|im_start|>user\n${content}<|im_end|>\n<|im_start|>assistant\n`;
  assert.throws(() => llm.promptIdsOf({ messages: [{ role: 'user', content }] }), refusedByLength(rendered.length));
});

test('under the bound a prompt is tokenized; one with too many tokens is still refused by the engine, in tokens', async () => {
  const prompt = 'y'.repeat(CONTEXT * PER); // one token a byte here: 832 tokens
  assert.equal(llm.promptIdsOf({ prompt }).length, prompt.length);
  await assert.rejects(async () => llm.complete({ prompt, maxTokens: 1 }), (e: unknown) =>
    e instanceof ContextLengthError && /the prompt has 832 tokens; the context holds 64/.test((e as Error).message));
  const ok = await llm.complete({ prompt: 'hi', maxTokens: 2 });
  assert.equal(ok.completionTokens, 2);
  // token ids are taken as they are: no text, no bound
  assert.deepEqual(llm.promptIdsOf({ promptIds: [1, 2, 3] }), [1, 2, 3]);
});
