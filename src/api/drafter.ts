// The drafter a `--draft-model DIR` names, loaded beside its target on the same backend: an
// EAGLE-3 head (its config names an EAGLE-3 architecture; it shares the target's embedding) or an
// ordinary model (a draft model). `proposer`, when given, must be the one the directory serves.

import type { Backend } from '../contracts/backend.ts';
import { isEagle3Dir, loadEagle3Dir } from '../artifacts/eagle3.ts';
import { loadModel, type LoadedModel } from '../execution/load-model.ts';
import { Eagle3Head } from '../models/eagle3.ts';

export type Drafter = { draftModel: LoadedModel; draftHead?: undefined } | { draftHead: Eagle3Head; draftModel?: undefined };

export async function loadDrafter(backend: Backend, dir: string, target: LoadedModel, proposer?: string,
  onWarning?: (message: string) => void): Promise<Drafter> {
  const eagle = isEagle3Dir(dir);
  if (proposer === 'draft' && eagle) throw new RangeError(`${dir} is an EAGLE-3 head, not a draft model: speculate with proposer eagle3`);
  if (proposer === 'eagle3' && !eagle) throw new RangeError(`${dir} is not an EAGLE-3 head (its config.json names no EAGLE-3 architecture)`);
  if (eagle) return { draftHead: await Eagle3Head.load(backend, loadEagle3Dir(dir, target.config), target.model.weights.embed) };
  return { draftModel: await loadModel(backend, dir, { maxModelLen: target.maxContext, ...(onWarning ? { onWarning } : {}) }) };
}

/** Frees a drafter's weights (the backend keeps running). */
export function disposeDrafter(d: Drafter | undefined): void {
  d?.draftModel?.model.dispose();
  d?.draftHead?.dispose();
}
