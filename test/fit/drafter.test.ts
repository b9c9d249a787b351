// `llmts fit --draft-model DIR`: a speculative drafter planned from its headers, counted as the
// server counts it (its weights, its KV per token of the model's pools at the activation dtype,
// the draft logit rows in the transient memory), in the totals and the largest safe context.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { FitPlanner } from '../../src/execution/fit/plan.ts';
import { loadEagle3Dir } from '../../src/artifacts/eagle3.ts';
import { planDrafter, safetensorsBytes } from '../../src/execution/fit/drafter.ts';
import { customMachine, cpuMachine } from '../../src/execution/fit/machines.ts';
import { planServeKv } from '../../src/execution/fit/serve-plan.ts';
import { STEP_DRAFT_TOKENS } from '../../src/execution/scheduler.ts';
import { runFit } from '../../src/cli/fit.ts';
import { UsageError } from '../../src/cli/errors.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const DEMO = path.join(ROOT, 'models/demo');
const DRAFT = path.join(ROOT, 'models/demo-draft');
const HEAD = path.join(ROOT, 'models/demo-eagle3');

test('a draft model and an EAGLE-3 head: their weights and KV per token, on the CPU (f32) and CUDA (bf16)', async () => {
  const target = await FitPlanner.open(DEMO);
  const draftPlanner = await FitPlanner.open(DRAFT);
  const dc = draftPlanner.config;
  for (const [kind, bytes] of [['cpu', 4], ['cuda', 2]] as const) {
    const d = await planDrafter(DRAFT, target, kind);
    assert.deepEqual(d.drafter, { dir: DRAFT, kind: 'draft model', layers: dc.numLayers });
    assert.equal(d.drafterBytes, (await draftPlanner.weights(kind)).residentBytes);
    assert.equal(d.drafterKvBytesPerToken, dc.numLayers * 2 * dc.numKvHeads * dc.headDim * bytes);
    assert.deepEqual([d.extraLogitRows, d.vocabSize], [STEP_DRAFT_TOKENS, target.config.vocabSize]);
    const h = await planDrafter(HEAD, target, kind);
    assert.equal(h.drafter.kind, 'EAGLE-3 head');
    assert.equal(h.drafter.layers, 1);
    assert.equal(h.drafterBytes, safetensorsBytes(HEAD));
    const hc = loadEagle3Dir(HEAD, target.config).config.layer;
    assert.equal(h.drafterKvBytesPerToken, 2 * hc.numKvHeads * hc.headDim * bytes, 'one layer of KV');
  }
});

test('the plan adds the drafter to its totals and lowers the largest context that fits', async () => {
  const target = await FitPlanner.open(DEMO);
  const speculation = await planDrafter(DRAFT, target, 'cpu');
  const cpu = cpuMachine(20);
  const req = { ctx: 1024, batch: 4 };
  const [plain, spec] = await Promise.all([target.plan(cpu, req), target.plan(cpu, { ...req, speculation })]);
  const sp = spec.speculation!;
  assert.equal(plain.speculation, undefined);
  assert.equal(sp.logitBytes, STEP_DRAFT_TOKENS * target.config.vocabSize * 4);
  assert.equal(sp.drafterKvBytes, spec.kvTokens * speculation.drafterKvBytesPerToken);
  assert.equal(spec.transientBytes, plain.transientBytes + sp.logitBytes);
  assert.equal(spec.totalBytes, plain.totalBytes + sp.logitBytes + sp.drafterBytes + sp.drafterKvBytes);
  // the server's pool plan counts the drafter's KV the same way
  const serve = await planServeKv(target, { backend: 'cpu', kvDtype: 'f32', maxBatch: 4, maxModelLen: 1024, kvBudgetBytes: spec.kvBytes + sp.drafterKvBytes, memory: { totalBytes: 2 ** 34, freeBytes: 2 ** 34 }, speculation });
  assert.equal(serve.speculation!.drafterKvBytes, serve.kvTokens * speculation.drafterKvBytesPerToken);
  // the smallest machine (to a MiB) on which the model alone reaches its whole context: the model
  // and its drafter fit a shorter one there
  const machine = (bytes: number) => customMachine('cpu', bytes, 20);
  const whole = async (bytes: number) => (await target.plan(machine(bytes), { batch: 4, ctx: 1 })).maxSafeContextLimitedBy === 'model';
  let lo = 0, hi = 2 ** 40;
  while (hi - lo > 2 ** 20) {
    const mid = Math.floor((lo + hi) / 2);
    if (await whole(mid)) hi = mid;
    else lo = mid;
  }
  const bytes = hi;
  const [a, b] = await Promise.all([target.plan(machine(bytes), { batch: 4, ctx: 1 }), target.plan(machine(bytes), { batch: 4, ctx: 1, speculation })]);
  assert.equal(a.maxSafeContextLimitedBy, 'model');
  assert.ok(b.maxSafeContext < a.maxSafeContext && b.maxSafeContextLimitedBy === 'memory', `with the drafter ${b.maxSafeContext} < ${a.maxSafeContext}`);
});

/** runFit in-process, returning what it printed on stdout */
async function fitOutput(args: string[]): Promise<string> {
  let out = '';
  const write = process.stdout.write;
  // the test runner's own reports (buffers) go through
  process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) =>
    typeof chunk === 'string' ? ((out += chunk), true) : write.call(process.stdout, chunk, ...(rest as []))) as typeof process.stdout.write;
  try {
    await runFit(args);
  } finally {
    process.stdout.write = write;
  }
  return out;
}

test('llmts fit --draft-model: the drafter row and the JSON field; a drafter for another model is one line', async () => {
  const text = await fitOutput(['--model', DEMO, '--ctx', '2048', '--bandwidth', '20', '--draft-model', DRAFT]);
  assert.match(text, /\n {2}drafter +[\d.]+ MiB {3}draft model \(2 layers\): weights [\d.]+ MiB, KV [\d.]+ KiB\/token [\d.]+ MiB; draft logits 2\.0 MiB in transient\n/);
  const head = JSON.parse(await fitOutput(['--model', DEMO, '--ctx', '2048', '--gpu', 'h200', '--json', '--draft-model', HEAD]));
  assert.deepEqual(head.speculation.drafter, { dir: HEAD, kind: 'EAGLE-3 head', layers: 1 });
  assert.equal(head.speculation.drafterBytes, safetensorsBytes(HEAD));
  const skus = JSON.parse(await fitOutput(['--model', DEMO, '--ctx', '2048', '--skus', '--bandwidth', '20', '--json', '--draft-model', DRAFT]));
  assert.ok(skus.skus.every((p: { speculation?: unknown }) => p.speculation !== undefined), 'every machine plans the drafter');
  const fixture = path.join(ROOT, 'test/fixtures/llama');
  for (const [dir, why] of [
    [fixture, /--draft-model .*llama: the draft model has a vocabulary of 512 tokens, the model 8192: a draft model must share the model's tokenizer/],
    ['/nonexistent/draft', /--draft-model \/nonexistent\/draft: model directory \/nonexistent\/draft does not exist/],
  ] as const) {
    await assert.rejects(runFit(['--model', DEMO, '--ctx', '64', '--bandwidth', '20', '--draft-model', dir]), (e: Error) => e instanceof UsageError && why.test(e.message), String(why));
  }
  await assert.rejects(runFit(['--model', fixture, '--ctx', '64', '--bandwidth', '20', '--draft-model', HEAD]),
    (e: Error) => e instanceof UsageError && /vocab_size 8192 differs from the target's 512/.test(e.message));
});
