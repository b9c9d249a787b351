// Shared helpers of the prefix-cache tests: tiny models on the test backend, prompts, and the
// cold (cache off) yardstick.
import assert from 'node:assert/strict';
import type { Backend } from '../../src/contracts/backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import { writeTinyLlama, type TinyLlamaOptions } from '../helpers/tiny-model.ts';

export async function testBackend(): Promise<Backend> {
  return process.env.LLMTS_TEST_BACKEND === 'reference' ? new ReferenceBackend() : createCpuBackend();
}

export async function tinyModel(opts: TinyLlamaOptions = {}): Promise<LoadedModel> {
  return loadModel(await testBackend(), writeTinyLlama({ maxPositions: 512, ...opts }));
}

export function tokens(seed: number, n: number): number[] {
  return Array.from({ length: n }, (_, k) => (seed * 131 + k * 29 + ((seed * k) % 7)) % 256);
}

export const greedy = (promptIds: number[], maxTokens: number) => ({ promptIds, maxTokens, sampling: { temperature: 0 }, ignoreEos: true });

/** Solo outputs with the prefix cache off: the yardstick. */
export async function coldOutputs(m: LoadedModel, prompts: number[][], maxTokens: number, opts: EngineOptions = {}): Promise<number[][]> {
  const e = new Engine(m.model, m, { maxBatch: 1, ...opts, prefixCache: { promptCacheBytes: 0 } });
  const out: number[][] = [];
  for (const p of prompts) out.push((await e.complete(greedy(p, maxTokens))).tokenIds);
  assert.equal(e.stats.prefixCache.enabled, false);
  await e.close();
  return out;
}

