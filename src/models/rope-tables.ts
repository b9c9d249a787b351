// Per-step rotary frequency tables, one per distinct RopeSpec in the model (gemma3 has a local
// and a global one). Most rope types are static and uploaded once; dynamic NTK and LongRoPE
// depend on the sequence length the step reaches (transformers recomputes them from the step's
// largest position), so those are rebuilt when that length changes their result.

import type { Backend, Tensor } from '../contracts/backend.ts';
import type { RopeSpec } from '../contracts/model-config.ts';
import { ropeFrequencies } from './rope-frequencies.ts';

export interface RopeTable {
  invFreq: Tensor;
  attentionScaling: number;
}

const lengthDependent = (spec: RopeSpec) => spec.type === 'dynamic' || spec.type === 'longrope';

export class RopeTables {
  private readonly specs: RopeSpec[] = [];
  private readonly keyOfLayer: number[];
  /** uploaded tables by spec index, and for length-dependent specs the length they were built for */
  private readonly cached = new Map<number, { table: RopeTable; builtFor: string }>();

  constructor(
    private readonly backend: Backend,
    layerSpecs: readonly RopeSpec[],
  ) {
    const keys: string[] = [];
    this.keyOfLayer = layerSpecs.map((spec) => {
      const key = JSON.stringify(spec);
      let idx = keys.indexOf(key);
      if (idx < 0) {
        idx = keys.push(key) - 1;
        this.specs.push(spec);
      }
      return idx;
    });
  }

  /**
   * Tables for every layer for a step whose largest position is maxPos. Call it outside any
   * backend scope: the uploaded tables are long-lived and replaced only when stale.
   */
  prepare(maxPos: number): RopeTable[] {
    const tables = this.specs.map((spec, idx) => this.table(spec, idx, maxPos + 1));
    return this.keyOfLayer.map((idx) => tables[idx]);
  }

  private table(spec: RopeSpec, idx: number, seqLen: number): RopeTable {
    const hit = this.cached.get(idx);
    if (hit && hit.builtFor === 'static') return hit.table;
    const { invFreq, attentionScaling } = ropeFrequencies(spec, seqLen);
    // Length-dependent specs are keyed by their actual result, so they re-upload only on change.
    const builtFor = lengthDependent(spec) ? `${attentionScaling}:${invFreq.join(',')}` : 'static';
    if (hit && hit.builtFor === builtFor) return hit.table;
    if (hit) this.backend.free(hit.table.invFreq);
    const table = { invFreq: this.backend.upload(invFreq, [invFreq.length]), attentionScaling };
    this.cached.set(idx, { table, builtFor });
    return table;
  }

  dispose(): void {
    for (const { table } of this.cached.values()) this.backend.free(table.invFreq);
    this.cached.clear();
  }
}
