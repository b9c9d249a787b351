// What a step's rows are and how the graph reaches their paged KV: the types the step body and a
// layer's attention read, below the DecoderModel that launches steps.

import type { HostStepLayout, PagedKv, StepLayout } from '../contracts/backend.ts';

/** A batch row: tokens at positions [start, start + count) of one sequence. */
export interface RowSpan {
  start: number;
  count: number;
  /**
   * The sequence length length-dependent rope (dynamic NTK, LongRoPE) follows for this row:
   * transformers uses the length the forward reaches, so a chunk of a longer prompt passes the
   * whole known length to compute what a single-shot prefill computes. Default start + count.
   */
  ropeLength?: number;
}

/**
 * The paged KV the graph reads and writes (state/kv-cache implements it). Declared here so the
 * model layer does not import the state layer above it.
 */
export interface KvAccess<Row extends RowSpan> {
  kvOfLayer(layer: number): PagedKv;
  groupIndexOfLayer(layer: number): number;
  /** true when every row already holds the blocks its positions need */
  isAllocated(row: Row): boolean;
  /** uploads one layout per KV group (tensors belong to the caller's open scope) */
  layouts(rows: readonly Row[]): StepLayout[];
  /** the same layouts as host arrays */
  hostLayouts(rows: readonly Row[]): HostStepLayout[];
  /** KV groups (layouts per step) */
  readonly groupCount: number;
}
