// Per-step rotary frequency tables, one per distinct RopeSpec in the model (gemma3 has a local
// and a global one). Most rope types are static and uploaded once. Dynamic NTK and LongRoPE
// depend on the sequence length (transformers recomputes them from the forward's largest
// position); here each batch row follows its *own* length, so a row computes what it would
// compute alone: when rows disagree the step gets one table per token.

import type { Backend, Tensor } from '../contracts/backend.ts';
import type { RopeSpec } from '../contracts/model-config.ts';
import { ropeFrequencies } from './rope-frequencies.ts';

export interface RopeTable {
  /** f32 [rotaryDim / 2], or [T, rotaryDim / 2] when rows need different tables */
  invFreq: Tensor;
  attentionScaling: number;
}

/** A row as rope sees it: `count` tokens whose table follows a sequence length `length`. */
export interface RopeRow {
  length: number;
  count: number;
}

const lengthDependent = (spec: RopeSpec) => spec.type === 'dynamic' || spec.type === 'longrope';

export class RopeTables {
  private readonly specs: RopeSpec[] = [];
  private readonly specOfLayer: number[];
  /** long-lived shared tables by spec index; length-dependent ones keyed by their values */
  private readonly cached = new Map<number, { table: RopeTable; key: string }>();

  constructor(
    private readonly backend: Backend,
    layerSpecs: readonly RopeSpec[],
  ) {
    const keys: string[] = [];
    this.specOfLayer = layerSpecs.map((spec) => {
      const key = JSON.stringify(spec);
      let idx = keys.indexOf(key);
      if (idx < 0) {
        idx = keys.push(key) - 1;
        this.specs.push(spec);
      }
      return idx;
    });
  }

  /** true when no table depends on the sequence length (each step reuses the same tensors) */
  get lengthIndependent(): boolean {
    return !this.specs.some(lengthDependent);
  }

  /**
   * Phase 1, outside any backend scope: uploads (or reuses) the shared tables this step needs.
   * Phase 2, the returned function, inside the step's scope: uploads per-token tables for specs
   * whose rows disagree (scope-owned, freed with the step) and returns every layer's table.
   */
  plan(rows: readonly RopeRow[]): () => RopeTable[] {
    const perSpec: (RopeTable | (() => RopeTable))[] = this.specs.map((spec, idx) => {
      if (!lengthDependent(spec)) return this.shared(idx, () => ropeFrequencies(spec, 1), 'static');
      const lengths = [...new Set(rows.map((r) => r.length))];
      if (lengths.length === 1) {
        const f = ropeFrequencies(spec, lengths[0]);
        return this.shared(idx, () => f, `${f.attentionScaling}:${f.invFreq.join(',')}`);
      }
      return () => this.perToken(spec, rows);
    });
    return () => {
      const tables = perSpec.map((t) => (typeof t === 'function' ? t() : t));
      return this.specOfLayer.map((idx) => tables[idx]);
    };
  }

  private shared(idx: number, compute: () => ReturnType<typeof ropeFrequencies>, key: string): RopeTable {
    const hit = this.cached.get(idx);
    if (hit && hit.key === key) return hit.table;
    if (hit) this.backend.free(hit.table.invFreq);
    const { invFreq, attentionScaling } = compute();
    const table = { invFreq: this.backend.upload(invFreq, [invFreq.length]), attentionScaling };
    this.cached.set(idx, { table, key });
    return table;
  }

  private perToken(spec: RopeSpec, rows: readonly RopeRow[]): RopeTable {
    const T = rows.reduce((a, r) => a + r.count, 0);
    let data: Float32Array | undefined;
    let scaling: number | undefined;
    let t = 0;
    for (const row of rows) {
      const f = ropeFrequencies(spec, row.length);
      data ??= new Float32Array(T * f.invFreq.length);
      // attention scaling does not vary with length for either length-dependent type
      scaling ??= f.attentionScaling;
      for (let k = 0; k < row.count; k++, t++) data.set(f.invFreq, t * f.invFreq.length);
    }
    const half = data!.length / T;
    return { invFreq: this.backend.upload(data!, [T, half]), attentionScaling: scaling! };
  }

  dispose(): void {
    for (const { table } of this.cached.values()) this.backend.free(table.invFreq);
    this.cached.clear();
  }
}
