// Speculative decoding in the engine (src/execution/methods/): the oracle is plain decoding, which
// the fixture tests check against transformers. The CPU backend computes a verify chunk's rows as
// it computes decode rows, so every comparison here is bit for bit: tokens, text, finish reasons,
// and logprobs with Object.is. Every test also checks that drafts were really verified (and, where
// it matters, accepted and rejected), so none passes with speculation silently off.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import type { Backend } from '../../src/contracts/backend.ts';
import { ReplayingReference } from '../helpers/replaying-reference.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import type { SpeculativeOptions } from '../../src/execution/methods/speculative.ts';
import { chainHashes } from '../../src/state/block-hash.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { runOf, sameRun, scripted, type Run } from '../helpers/speculation.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const FIXTURES = join(ROOT, 'test/fixtures');
const FAMILIES = readdirSync(FIXTURES).filter((d) => existsSync(join(FIXTURES, d, 'config.json')));

interface Case {
  prompt_token_ids: number[];
  generated_token_ids: number[];
}
const casesOf = (dir: string): Case[] => JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')).cases;

const NGRAM: SpeculativeOptions = { proposer: 'ngram', numDraftTokens: 4, ngramMin: 1, ngramMax: 3 };
const ADAPTIVE: SpeculativeOptions = { proposer: 'ngram', numDraftTokens: 'adaptive', ngramMin: 1, ngramMax: 3 };

const greedy = (promptIds: readonly number[], maxTokens: number, extra: Partial<EngineRequest> = {}): EngineRequest =>
  ({ promptIds, maxTokens, sampling: { temperature: 0 }, ignoreEos: true, ...extra });

async function withCpu<T>(dir: string, body: (m: LoadedModel) => Promise<T>): Promise<T> {
  const backend = await createCpuBackend();
  try {
    return await body(await loadModel(backend, dir, { maxModelLen: 512 }));
  } finally {
    await backend.close();
  }
}

/** Each request run alone on a fresh engine of `opts`, in order. */
async function alone(m: LoadedModel, opts: EngineOptions, reqs: readonly EngineRequest[]): Promise<Run[]> {
  const out: Run[] = [];
  for (const r of reqs) {
    const e = new Engine(m.model, m, { maxBatch: 4, maxModelLen: m.maxContext, ...opts });
    out.push(await runOf(e, r));
    assert.equal(e.stats.kvBlocksUsed, 0);
    await e.close(0);
  }
  return out;
}

/** Demo model prompts with repeats for the n-gram proposer to find. */
function demoPrompts(m: LoadedModel): number[][] {
  return [
    'def add(a, b):\n    return a + b\n\n\ndef add(',
    'import os\nimport sys\n\n\ndef main(argv):',
    'class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def __repr__(self):',
  ].map((t) => m.encode(t));
}

test('every fixture family and the demo model: greedy tokens and top-k logprobs with n-gram drafts equal plain decoding bit for bit', async () => {
  for (const name of [...FAMILIES, 'demo']) {
    const dir = name === 'demo' ? join(ROOT, 'models/demo') : join(FIXTURES, name);
    await withCpu(dir, async (m) => {
      const prompts = name === 'demo' ? demoPrompts(m) : casesOf(dir).map((c) => c.prompt_token_ids);
      const probe = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
      const blocked = probe.speculationOff;
      await probe.close(0);
      for (const topLogprobs of [undefined, 3]) {
        const reqs = prompts.map((p) => greedy(p, 40, { topLogprobs }));
        const plain = await alone(m, {}, reqs);
        for (const speculative of [NGRAM, ADAPTIVE]) {
          const runs = await alone(m, { speculative }, reqs);
          runs.forEach((r, i) => sameRun(r, plain[i]!, `${name} ${speculative.numDraftTokens} logprobs ${topLogprobs} prompt ${i}`));
          const drafted = runs.reduce((n, r) => n + (r.speculation?.draftTokens ?? 0), 0);
          const accepted = runs.reduce((n, r) => n + (r.speculation?.acceptedTokens ?? 0), 0);
          if (blocked) {
            assert.ok(runs.every((r) => r.speculation === undefined), `${name}: speculation is off (${blocked})`);
          } else {
            assert.ok(drafted > 0, `${name}: drafts were verified`);
            if (speculative === NGRAM) assert.ok(accepted > 0 && accepted < drafted, `${name}: drafts accepted and rejected (${accepted} of ${drafted})`);
          }
        }
      }
      // the families whose rope follows the sequence length decode plainly, and say why
      if (/dynamic|longrope/.test(name)) assert.match(blocked ?? '', /rope depends on the sequence length/);
      else assert.equal(blocked, undefined, `${name} speculates`);
    });
  }
});
