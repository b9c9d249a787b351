// What a speculative drafter adds to a plan (`llmts fit --draft-model DIR`), from its headers
// alone, counted as the server counts it (api/serve.ts): a verify step's draft logit rows (f32,
// Scheduler's STEP_DRAFT_TOKENS) in the transient memory; the drafter's weights; its own KV, every
// layer at the backend's activation dtype, as many tokens as the model's full-attention pools
// (methods/draft-model.ts, eagle3.ts). A draft model's weights are planned as the model's are (the
// loader on a dry run); an EAGLE-3 head's are its weight files (it shares the target's embedding).

import fs from 'node:fs';
import path from 'node:path';
import { dtypeBytes, type DType } from '../../contracts/backend.ts';
import { isEagle3Dir, loadEagle3Dir } from '../../artifacts/eagle3.ts';
import { STEP_DRAFT_TOKENS } from '../scheduler.ts';
import { FitError, FitPlanner, type PlannerSettings } from './plan.ts';
import type { SpeculationMemory } from './serve-plan.ts';

/** What the plan says of the drafter it counts. */
export interface DrafterInfo {
  dir: string;
  kind: 'draft model' | 'EAGLE-3 head';
  layers: number;
}

export interface DrafterPlan extends SpeculationMemory {
  drafter: DrafterInfo;
}

/** The drafter at `dir` for `target`'s model, on a backend of `kind` (its activation dtype: f32 on the CPU, bf16 on CUDA). */
export async function planDrafter(dir: string, target: FitPlanner, kind: 'cpu' | 'cuda', settings: PlannerSettings = {}): Promise<DrafterPlan> {
  const activation: DType = kind === 'cpu' ? 'f32' : 'bf16';
  const vocab = { extraLogitRows: STEP_DRAFT_TOKENS, vocabSize: target.config.vocabSize };
  if (isEagle3Dir(dir)) {
    const c = loadEagle3Dir(dir, target.config).config.layer;
    return {
      drafter: { dir, kind: 'EAGLE-3 head', layers: c.numLayers }, ...vocab,
      drafterBytes: safetensorsBytes(dir),
      drafterKvBytesPerToken: c.numLayers * 2 * c.numKvHeads * c.headDim * dtypeBytes[activation],
    };
  }
  const draft = await FitPlanner.open(dir, settings);
  const c = draft.config;
  // the server also checks the tokenizations agree (methods/draft-model.ts checkDraftModel); the plan reads no tokenizer
  if (c.vocabSize !== target.config.vocabSize) {
    throw new FitError(`the draft model has a vocabulary of ${c.vocabSize} tokens, the model ${target.config.vocabSize}: a draft model must share the model's tokenizer`);
  }
  return {
    drafter: { dir, kind: 'draft model', layers: c.numLayers }, ...vocab,
    drafterBytes: (await draft.weights(kind)).residentBytes,
    drafterKvBytesPerToken: c.numLayers * 2 * c.numKvHeads * c.headDim * dtypeBytes[activation],
  };
}

/** Bytes of a directory's safetensors files. */
export function safetensorsBytes(dir: string): number {
  return fs.readdirSync(dir).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0);
}
