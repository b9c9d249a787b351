// TextWorkerPool: the text workers give exactly the ids and errors of the calling thread, and a
// cancelled job, a crashed worker or a worker that cannot start never wedges the pool.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';
import { ChatTemplate, ChatTemplateError } from '../../src/artifacts/chat-template.ts';
import { TextJobAbortedError, TextWorkerError, TextWorkerPool, TextWorkerStartError } from '../../src/artifacts/text-worker-pool.ts';
import { ContinueFinalError, runChat, runEncode, textWeight } from '../../src/artifacts/prompt-jobs.ts';
import { PromptTooLongError } from '../../src/artifacts/token-bound.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const DEMO = 'models/demo';
const demoTok = TextTokenizer.fromDir(DEMO);
const demoTpl = ChatTemplate.fromDir(DEMO, demoTok)!;

/** A long run of spaces: the demo tokenizer takes on the order of a second over it (its BPE merges grow faster than linearly). */
const SLOW = ' '.repeat(150_000);

test('encode and chat on a worker give the ids the calling thread gives', async () => {
  const pool = new TextWorkerPool(demoTok, demoTpl, { size: 2 });
  try {
    const texts = ['hello world', ' '.repeat(3000), 'a'.repeat(2500), '😀 emoji\nand lines\n', '<|im_start|>user\nhi<|im_end|>'];
    for (const addSpecialTokens of [true, false]) {
      assert.deepEqual(await pool.encode({ texts, addSpecialTokens }), runEncode(demoTok, { kind: 'encode', texts, addSpecialTokens }));
    }
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'q '.repeat(2000) }, { role: 'assistant', content: 'the answer' }];
    for (const continueFinal of [false, true]) {
      const job = { messages, render: { addGenerationPrompt: !continueFinal }, continueFinal };
      assert.deepEqual(await pool.chat(job), runChat(demoTpl, demoTok, { kind: 'chat', ...job }));
    }
    assert.equal(pool.stats.running, 0);
    assert.equal(pool.stats.died, 0);
  } finally {
    await pool.close();
  }
});

test('a worker refuses what the calling thread refuses, with the same error classes', async () => {
  const pool = new TextWorkerPool(demoTok, demoTpl, { size: 1 });
  try {
    const per = demoTok.maxCharsPerToken!;
    await assert.rejects(pool.encode({ texts: ['x'.repeat(10 * per + 1)], addSpecialTokens: true, contextLen: 10 }), (e: unknown) =>
      e instanceof PromptTooLongError && e.chars === 10 * per + 1 && e.contextLen === 10 && /at least 11 tokens/.test(e.message));
    await assert.rejects(pool.chat({ messages: [{ role: 'user', content: 'y'.repeat(20 * per) }], render: {}, continueFinal: false, contextLen: 10 }),
      PromptTooLongError);
    // an empty final message cannot be continued
    await assert.rejects(pool.chat({ messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: '' }], render: {}, continueFinal: true }),
      ContinueFinalError);
    // the pool still serves after refusals
    assert.deepEqual(await pool.encode({ texts: ['ok'], addSpecialTokens: false }), [demoTok.encode('ok', { addSpecialTokens: false })]);
  } finally {
    await pool.close();
  }
  // a template's raise_exception is a ChatTemplateError, as on the calling thread
  const strict = new ChatTemplate("{{ raise_exception('no system messages') }}", demoTok);
  const p2 = new TextWorkerPool(demoTok, strict, { size: 1 });
  try {
    await assert.rejects(p2.chat({ messages: [{ role: 'system', content: 's' }], render: {}, continueFinal: false }),
      (e: unknown) => e instanceof ChatTemplateError && e.message === 'no system messages');
  } finally {
    await p2.close();
  }
});

test('a cancelled job leaves the queue, or has its worker terminated, and the next job runs', async () => {
  const pool = new TextWorkerPool(demoTok, demoTpl, { size: 1 });
  try {
    const running = new AbortController();
    const queued = new AbortController();
    const slow = pool.encode({ texts: [SLOW], addSpecialTokens: false }, running.signal);
    const waiting = pool.encode({ texts: ['never runs'], addSpecialTokens: false }, queued.signal);
    const after = pool.encode({ texts: ['runs after'], addSpecialTokens: false });
    assert.deepEqual({ running: pool.stats.running, queued: pool.stats.queued }, { running: 1, queued: 2 });
    queued.abort();
    await assert.rejects(waiting, TextJobAbortedError);
    assert.equal(pool.stats.queued, 1);
    running.abort();
    await assert.rejects(slow, TextJobAbortedError);
    // the terminated worker's place went to a fresh one, which took the job behind
    assert.deepEqual(await after, [demoTok.encode('runs after', { addSpecialTokens: false })]);
    assert.deepEqual({ ...pool.stats, workers: undefined }, { workers: undefined, running: 0, queued: 0, started: 2, died: 0 });
    // an already aborted signal never queues
    await assert.rejects(pool.encode({ texts: ['x'], addSpecialTokens: false }, AbortSignal.abort()), TextJobAbortedError);
  } finally {
    await pool.close();
  }
});

test('a worker that dies (out of memory) fails its job alone; a fresh worker takes the next', async () => {
  const dir = writeTinyLlama();
  const tok = TextTokenizer.fromDir(dir);
  const pool = new TextWorkerPool(tok, ChatTemplate.fromDir(dir, tok), { size: 1, resourceLimits: { maxOldGenerationSizeMb: 16, maxYoungGenerationSizeMb: 4 } });
  try {
    const big = pool.encode({ texts: ['x'.repeat(4_000_000)], addSpecialTokens: false });
    const next = pool.encode({ texts: ['hello'], addSpecialTokens: false });
    await assert.rejects(big, (e: unknown) => e instanceof TextWorkerError && !(e instanceof TextWorkerStartError) && /died while working on this request/.test((e as Error).message));
    assert.deepEqual(await next, [tok.encode('hello', { addSpecialTokens: false })]);
    assert.equal(pool.stats.died, 1);
    assert.equal(pool.stats.started, 2);
  } finally {
    await pool.close();
  }
});

test('a worker whose tokenizer files changed on disk does not start: its jobs fail with TextWorkerStartError', async () => {
  const dir = writeTinyLlama();
  const tok = TextTokenizer.fromDir(dir);
  const file = join(dir, 'tokenizer_config.json');
  writeFileSync(file, JSON.stringify({ ...JSON.parse(readFileSync(file, 'utf8')), eos_token: '<|im_end|>' }));
  const pool = new TextWorkerPool(tok, undefined, { size: 2 });
  try {
    const jobs = [pool.encode({ texts: ['a'], addSpecialTokens: false }), pool.encode({ texts: ['b'], addSpecialTokens: false })];
    await Promise.all(jobs.map((j) => assert.rejects(j, (e: unknown) =>
      e instanceof TextWorkerStartError && /differ from the ones the model was loaded with/.test((e as Error).message))));
    assert.equal(pool.stats.workers, 0);
  } finally {
    await pool.close();
  }
});

test('a tokenizer built from parsed files (no directory) reaches the workers as those files', async () => {
  const dir = writeTinyLlama();
  const tok = new TextTokenizer(JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')), JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')));
  const pool = new TextWorkerPool(tok, undefined, { size: 1 });
  try {
    assert.deepEqual(await pool.encode({ texts: ['héllo'], addSpecialTokens: true }), [tok.encode('héllo')]);
  } finally {
    await pool.close();
  }
});

test('idle workers never keep the process alive', () => {
  const script = join(mkdtempSync(join(tmpdir(), 'llmts-pool-')), 'pool.mts');
  const src = (f: string) => JSON.stringify(new URL(`../../src/artifacts/${f}`, import.meta.url).href);
  writeFileSync(script, `
    import { TextTokenizer } from ${src('tokenizer.ts')};
    import { TextWorkerPool } from ${src('text-worker-pool.ts')};
    const pool = new TextWorkerPool(TextTokenizer.fromDir(${JSON.stringify(DEMO)}), undefined, { size: 1 });
    const [ids] = await pool.encode({ texts: ['hello'], addSpecialTokens: false });
    console.log(ids.length > 0 ? 'encoded' : 'empty');
  `);
  const r = spawnSync(process.execPath, ['--import', 'tsx', script], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.signal, null, `the process had to be killed: ${r.stderr}`);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim(), 'encoded');
});

test('textWeight counts characters and values, at any nesting, without recursion', () => {
  assert.equal(textWeight('abc'), 4);
  assert.equal(textWeight([{ role: 'user', content: 'hi' }]), 1 + 1 + 4 + 1 + 4 + 7 + 1 + 2);
  assert.equal(textWeight(null), 1);
  let deep: unknown = 'x';
  for (let i = 0; i < 200_000; i++) deep = [deep];
  assert.equal(textWeight(deep), 200_002);
});
