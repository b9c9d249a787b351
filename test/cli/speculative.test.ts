// The speculative decoding flags of `generate` and `serve`: generate --json's "speculation" and its
// tokens (those of a run without the flags), the flags as ServeOptions, and one-line errors for
// bad values.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { serveOptionsOf } from '../../src/cli/serve.ts';
import { UsageError } from '../../src/cli/errors.ts';
import { resolveServeOptions, ServeOptionsError } from '../../src/api/serve-options.ts';
import { runBin } from '../helpers/run-bin.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const LLAMA = join(ROOT, 'test/fixtures/llama');

const run = (args: string[]) => runBin(args);

test('generate --json --speculative ngram: the tokens of a run without it, and "speculation" with the draft counts', async () => {
  const c = JSON.parse(readFileSync(join(LLAMA, 'reference.json'), 'utf8')).cases[2];
  const args = ['generate', '--model', LLAMA, '--prompt', c.prompt_text, '--max-tokens', '40', '--temperature', '0', '--ignore-eos', '--json', '--device', 'cpu', '--top-logprobs', '2'];
  const [plain, spec, fixed] = await Promise.all([
    run(args),
    run([...args, '--speculative', 'ngram', '--ngram-min', '1']),
    run([...args, '--speculative', 'ngram', '--num-draft-tokens', '3', '--ngram-min', '1', '--ngram-max', '2']),
  ]);
  for (const r of [plain, spec, fixed]) assert.equal(r.code, 0, r.stderr);
  const [a, b, f] = [plain, spec, fixed].map((r) => JSON.parse(r.stdout));
  assert.equal(a.speculation, undefined);
  assert.deepEqual(Object.keys(b), ['prompt_token_ids', 'token_ids', 'text', 'finish_reason', 'logprobs', 'speculation', 'timings']);
  for (const x of [b, f]) {
    assert.deepEqual(x.token_ids, a.token_ids);
    assert.deepEqual(x.logprobs, a.logprobs);
    assert.deepEqual(Object.keys(x.speculation), ['draft_tokens', 'accepted_tokens']);
    assert.ok(x.speculation.accepted_tokens <= x.speculation.draft_tokens, JSON.stringify(x.speculation));
  }
  // the adaptive depth drafts what the measured step costs say pays (machine-dependent); a fixed one always drafts
  assert.ok(f.speculation.draft_tokens > 0, JSON.stringify(f.speculation));
});

test('bad speculative flags are one-line errors that name the flag', async () => {
  for (const [flags, message] of [
    [['--num-draft-tokens', '3'], /--num-draft-tokens needs --speculative ngram\|draft/],
    [['--speculative', 'eagle'], /--speculative must be ngram \(prompt lookup\), draft \(a draft model\) or eagle3 \(an EAGLE-3 head\), got "eagle"/],
    [['--speculative', 'eagle3'], /--speculative eagle3 needs --draft-model DIR/],
    [['--speculative', 'eagle3', '--draft-model', 'd', '--ngram-max', '2'], /--ngram-max needs --speculative ngram/],
    [['--speculative', 'draft'], /--speculative draft needs --draft-model DIR/],
    [['--draft-model', 'd'], /--draft-model needs --speculative draft/],
    [['--speculative', 'ngram', '--draft-model', 'd'], /--draft-model needs --speculative draft/],
    [['--speculative', 'draft', '--draft-model', 'd', '--ngram-min', '2'], /--ngram-min needs --speculative ngram/],
    [['--speculative', 'ngram', '--num-draft-tokens', '0'], /--num-draft-tokens must be an integer from 1 to 64 or "adaptive", got "0"/],
    [['--speculative', 'ngram', '--num-draft-tokens', 'lots'], /--num-draft-tokens must be an integer from 1 to 64 or "adaptive", got "lots"/],
    [['--speculative', 'ngram', '--ngram-min', '5', '--ngram-max', '2'], /--ngram-min \(5\) must not be above --ngram-max \(2\)/],
    [['--speculative', 'ngram', '--ngram-max', '0'], /--ngram-max must be >= 1, got 0/],
  ] as const) {
    const r = await run(['generate', '--model', LLAMA, '--prompt', 'x', '--device', 'cpu', ...flags]);
    assert.notEqual(r.code, 0);
    const lines = r.stderr.trimEnd().split('\n');
    assert.equal(lines.length, 1, r.stderr);
    assert.match(lines[0]!, message);
    assert.throws(() => serveOptionsOf(['--model', 'm', ...flags]), (e: unknown) => e instanceof UsageError && message.test(e.message), flags.join(' '));
  }
});

test('serve: the flags become ServeOptions.speculative; startServer checks what code passes', () => {
  assert.deepEqual(serveOptionsOf(['--model', 'm', '--speculative', 'ngram', '--num-draft-tokens', 'adaptive', '--ngram-max', '3']).speculative,
    { proposer: 'ngram', numDraftTokens: 'adaptive', ngramMin: undefined, ngramMax: 3 });
  assert.deepEqual(serveOptionsOf(['--model', 'm', '--speculative', 'ngram', '--num-draft-tokens', '6']).speculative,
    { proposer: 'ngram', numDraftTokens: 6, ngramMin: undefined, ngramMax: undefined });
  assert.equal(serveOptionsOf(['--model', 'm']).speculative, undefined);
  const d = serveOptionsOf(['--model', 'm', '--speculative', 'draft', '--draft-model', 'small', '--num-draft-tokens', '4']);
  assert.deepEqual([d.speculative, d.draftModel], [{ proposer: 'draft', numDraftTokens: 4, ngramMin: undefined, ngramMax: undefined }, 'small']);
  assert.doesNotThrow(() => resolveServeOptions(d), 'the directory loads later, at startServer');
  assert.throws(() => resolveServeOptions({ model: 'm', speculative: { proposer: 'draft' }, optionNames: undefined }),
    (e: unknown) => e instanceof ServeOptionsError && e.option === 'draftModel' && /speculative draft needs draftModel/.test(e.message));
  assert.throws(() => resolveServeOptions({ model: 'm', speculative: { proposer: 'ngram', numDraftTokens: 99 } }),
    (e: unknown) => e instanceof ServeOptionsError && e.option === 'speculative' && /numDraftTokens must be 'adaptive' or an integer from 1 to 64, got 99/.test(e.message));
});

test('generate --json --speculative draft --draft-model: the tokens of a run without it, drafts made and verified', async () => {
  const c = JSON.parse(readFileSync(join(LLAMA, 'reference.json'), 'utf8')).cases[2];
  const args = ['generate', '--model', LLAMA, '--prompt', c.prompt_text, '--max-tokens', '40', '--temperature', '0', '--ignore-eos', '--json', '--device', 'cpu', '--top-logprobs', '2'];
  const [plain, self, other] = await Promise.all([
    run(args),
    run([...args, '--speculative', 'draft', '--draft-model', LLAMA, '--num-draft-tokens', '4']),
    run([...args, '--speculative', 'draft', '--draft-model', join(ROOT, 'test/fixtures/qwen3'), '--num-draft-tokens', '2']),
  ]);
  for (const r of [plain, self, other]) assert.equal(r.code, 0, r.stderr);
  const [a, s, o] = [plain, self, other].map((r) => JSON.parse(r.stdout));
  for (const x of [s, o]) {
    assert.deepEqual(x.token_ids, a.token_ids);
    assert.deepEqual(x.logprobs, a.logprobs);
    assert.ok(x.speculation.draft_tokens > 0, JSON.stringify(x.speculation));
  }
  assert.equal(s.speculation.accepted_tokens, s.speculation.draft_tokens, 'the model drafting for itself');
});

test('generate --json --speculative eagle3 --draft-model (the demo and its head): the tokens of a run without it; a head where a draft model is asked for, one line', async () => {
  const demo = join(ROOT, 'models/demo'), head = join(ROOT, 'models/demo-eagle3');
  const args = ['generate', '--model', demo, '--prompt', 'def fibonacci(n):', '--max-tokens', '48', '--temperature', '0', '--ignore-eos', '--json', '--device', 'cpu', '--top-logprobs', '2'];
  const [plain, eagle, wrong] = await Promise.all([
    run(args),
    run([...args, '--speculative', 'eagle3', '--draft-model', head, '--num-draft-tokens', '3']),
    run([...args, '--speculative', 'draft', '--draft-model', head]),
  ]);
  for (const r of [plain, eagle]) assert.equal(r.code, 0, r.stderr);
  const [a, e] = [plain, eagle].map((r) => JSON.parse(r.stdout));
  assert.deepEqual(e.token_ids, a.token_ids);
  assert.deepEqual(e.logprobs, a.logprobs);
  assert.ok(e.speculation.draft_tokens > 0 && e.speculation.accepted_tokens > 0, JSON.stringify(e.speculation));
  assert.notEqual(wrong.code, 0);
  assert.match(wrong.stderr, /^llmts: .*demo-eagle3 is an EAGLE-3 head, not a draft model: speculate with proposer eagle3\n$/);
});

test('generate --speculative on a model whose rope follows the sequence length: a warning, plain decoding, no "speculation"', async () => {
  const r = await run(['generate', '--model', join(ROOT, 'test/fixtures/llama_dynamic'), '--prompt', 'ab ab ab', '--max-tokens', '5', '--speculative', 'ngram', '--device', 'cpu', '--json']);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stderr, 'llmts: warning: speculative decoding is off for this model (the model\'s dynamic rope depends on the sequence length)\n');
  const out = JSON.parse(r.stdout);
  assert.equal(out.speculation, undefined);
  assert.equal(out.token_ids.length, 5);
});
