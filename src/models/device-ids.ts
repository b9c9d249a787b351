// Token ids a step takes from the device instead of the host: an earlier step's greedy picks or
// sampled tokens that were never read back (the engine's pipelined decode enqueues step N+1 before
// step N's tokens reach the host). Gathering them on the device keeps the host out of the dependency.

import type { Backend, Tensor } from '../contracts/backend.ts';

/** Token t of a step is `ids[index[t]]`, `ids` read as flat. */
export interface DeviceIds {
  /**
   * i32 on the device, any shape, indexed flat: the greedy picks [P] of the previous step's logit
   * rows, or its sampleRows result [P, 2 + 2K] (each row's token at row * (2 + 2K))
   */
  ids: Tensor;
  /** which entry of `ids` each token of the step takes, one per token */
  index: Int32Array;
}

/** Enqueues the step's ids, i32 [index.length]; the tensor belongs to the open scope. */
export function gatherDeviceIds(b: Backend, from: DeviceIds): Tensor {
  const n = from.ids.shape.reduce((a, d) => a * d, 1), T = from.index.length;
  for (const k of from.index) if (!Number.isInteger(k) || k < 0 || k >= n) throw new Error(`device ids: index ${k} outside [0, ${n})`);
  return b.reshape(b.gatherRows(b.reshape(from.ids, [n, 1]), b.upload(from.index, [T])), [T]);
}
