// The prefix cache against transformers: on the committed fixtures (tools/oracle), a request whose
// prompt comes from the RAM tier, and one restored from the SSD tier by a second engine, still
// match the reference (greedy tokens + top-5 logprobs, the closeness rule of ARCHITECTURE.md). Block size 4,
// so the fixtures' short prompts span several reusable blocks.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import { compareToReference, type StepRecord } from '../helpers/closeness.ts';

const FIXTURES = resolve(import.meta.dirname, '../fixtures');
const TOLERANCE = 0.05;

interface Reference {
  cases: { prompt_token_ids: number[]; steps: StepRecord[] }[];
}

const request = (c: Reference['cases'][number]) => ({
  promptIds: c.prompt_token_ids, maxTokens: c.steps.length, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: 5,
});

function engine(m: LoadedModel, opts: EngineOptions = {}): Engine {
  return new Engine(m.model, m, { maxBatch: 3, blockSize: 4, maxModelLen: m.maxContext, ...opts });
}

/** the closeness rule (test/helpers/closeness.ts) for one case's steps */
function check(label: string, steps: StepRecord[] | undefined, c: Reference['cases'][number], tolerance = TOLERANCE): void {
  const r = compareToReference(steps!, c.steps, tolerance);
  assert.ok(r.ok, `${label}: ${r.problem}`);
}

/** A fixture on a fresh CPU backend, with a prefix cache whose SSD tier is a fresh directory (both removed after). */
async function withFixture(name: string,
  body: (f: { ref: Reference; m: LoadedModel; prefixCache: NonNullable<EngineOptions['prefixCache']> }) => Promise<void>): Promise<void> {
  const dir = join(FIXTURES, name);
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as Reference;
  const backend = await createCpuBackend();
  const cacheDir = mkdtempSync(join(tmpdir(), 'llmts-fixture-kvc-'));
  try {
    const m = await loadModel(backend, dir, { maxModelLen: 4096 });
    const prefixCache = {
      modelFingerprint: modelFingerprint(dir), tokenizerFingerprint: m.tokenizer.fingerprint,
      ssd: { dir: cacheDir, maxBytes: 1 << 30 },
    };
    await body({ ref, m, prefixCache });
  } finally {
    rmSync(cacheDir, { recursive: true, force: true });
    await backend.close();
  }
}

for (const name of ['llama', 'llama_yarn', 'qwen3_moe', 'olmo2', 'granite']) {
  test(`${name}: cached and SSD-restored prefixes match transformers`, () => withFixture(name, async ({ ref, m, prefixCache }) => {
      // RAM tier: every case twice on one engine; the second run reuses its prompt's blocks
      const e = engine(m, { prefixCache });
      assert.equal(e.stats.prefixCache.enabled, true);
      for (const [k, c] of ref.cases.entries()) {
        check(`case ${k} cold`, (await e.complete(request(c))).logprobs, c);
        const warm = await e.complete(request(c));
        assert.equal(warm.cachedTokens, Math.floor((c.prompt_token_ids.length - 1) / 4) * 4, `case ${k}`);
        check(`case ${k} warm`, warm.logprobs, c);
      }
      await e.close(); // flushes to the SSD tier
      // SSD tier: a second engine (empty RAM tier), all cases at once
      const e2 = engine(m, { prefixCache });
      const restored = await Promise.all(ref.cases.map((c) => e2.complete(request(c))));
      restored.forEach((r, k) => {
        assert.ok(r.cachedTokens > 0, `case ${k} restored nothing`);
        check(`case ${k} restored`, r.logprobs, ref.cases[k]);
      });
      assert.ok(e2.stats.prefixCache.ssdHits >= 1);
      assert.equal(e2.stats.kvBlocksUsed, 0);
      await e2.close();
  }));
}

// Lossy KV caches: their blocks go to the SSD tier as they are (bf16, or int8 / fp8 values with
// their row scales) and come back into pools of that dtype, giving the cold run's logprobs bit for
// bit; an engine whose cache holds another dtype has another layout (the namespace names the
// dtype) and restores none of them. Tolerances as test/models/fixtures.test.ts states them.
for (const [kvDtype, other, tolerance] of [['bf16', 'f32', TOLERANCE], ['int8', 'bf16', 0.1], ['fp8', 'int8', 0.4]] as const) {
  test(`llama with a ${kvDtype} KV cache: cached and SSD-restored prefixes match transformers; a ${other} engine restores none`, () =>
    withFixture('llama', async ({ ref, m, prefixCache }) => {
      const e = engine(m, { prefixCache, kvDtype });
      const cold: StepRecord[][] = [];
      for (const [k, c] of ref.cases.entries()) {
        cold.push((await e.complete(request(c))).logprobs!);
        check(`case ${k} cold`, cold[k], c, tolerance);
        const warm = await e.complete(request(c));
        assert.ok(warm.cachedTokens > 0, `case ${k} reused nothing`);
        assert.deepEqual(warm.logprobs, cold[k], `case ${k}: warm equals cold`);
      }
      await e.close();
      const another = engine(m, { prefixCache, kvDtype: other });
      await Promise.all(ref.cases.map((c) => another.complete(request(c))));
      assert.equal(another.stats.prefixCache.ssdHits, 0, `a ${other} cache restores no ${kvDtype} blocks`);
      await another.close(0);
      const e2 = engine(m, { prefixCache, kvDtype });
      const restored = await Promise.all(ref.cases.map((c) => e2.complete(request(c))));
      restored.forEach((r, k) => {
        assert.ok(r.cachedTokens > 0, `case ${k} restored nothing`);
        assert.deepEqual(r.logprobs, cold[k], `case ${k}: restored equals cold`);
      });
      assert.ok(e2.stats.prefixCache.ssdHits >= 1);
      await e2.close();
    }));
}

// Sliding-window families (window 8 in every fixture): the RAM tier shares the blocks the window
// still reaches; the SSD tier stores every full-attention block and the sliding groups' windows
// (plus the earlier sliding blocks the pool still held), and a second engine restores from it.
for (const name of ['gemma2', 'gemma3_text', 'mistral', 'qwen2', 'phi3']) {
  test(`${name}: cached and SSD-restored prefixes match transformers with sliding-window layers`, () =>
    withFixture(name, async ({ ref, m, prefixCache }) => {
      const e = engine(m, { prefixCache });
      assert.equal(e.stats.prefixCache.enabled, true);
      assert.equal(e.stats.prefixCache.ssdOff, undefined);
      assert.ok(m.config.layers.some((l) => l.window > 0), 'the fixture has sliding-window layers');
      for (const [k, c] of ref.cases.entries()) {
        check(`case ${k} cold`, (await e.complete(request(c))).logprobs, c);
        const warm = await e.complete(request(c));
        assert.equal(warm.cachedTokens, Math.floor((c.prompt_token_ids.length - 1) / 4) * 4, `case ${k}`);
        check(`case ${k} warm`, warm.logprobs, c);
      }
      // all at once: rows sharing blocks decode side by side
      const together = await Promise.all(ref.cases.map((c) => e.complete(request(c))));
      together.forEach((r, k) => check(`case ${k} together`, r.logprobs, ref.cases[k]));
      assert.equal(e.stats.kvBlocksUsed, 0);
      await e.close(); // flushes to the SSD tier
      // a second engine (empty RAM tier) restores every case from disk, all at once
      const e2 = engine(m, { prefixCache });
      const restored = await Promise.all(ref.cases.map((c) => e2.complete(request(c))));
      restored.forEach((r, k) => {
        assert.equal(r.cachedTokens, Math.floor((ref.cases[k].prompt_token_ids.length - 1) / 4) * 4, `case ${k} restored`);
        check(`case ${k} restored`, r.logprobs, ref.cases[k]);
      });
      assert.ok(e2.stats.prefixCache.ssdHits >= 1);
      assert.equal(e2.stats.kvBlocksUsed, 0);
      await e2.close();
  }));
}

test('models whose KV cannot be shared report why the cache is off', async () => {
  const backend = await createCpuBackend();
  try {
    for (const [name, why] of [['llama_dynamic', /dynamic rope/], ['phi3_longrope', /longrope rope/]] as const) {
      const m = await loadModel(backend, join(FIXTURES, name), { maxModelLen: 4096 });
      const e = engine(m);
      assert.equal(e.stats.prefixCache.enabled, false, name);
      assert.match(e.stats.prefixCache.off ?? '', why, name);
      await e.close();
    }
  } finally {
    await backend.close();
  }
});
