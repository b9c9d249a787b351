// A reference backend whose reads fail once, right after the k-th gather of device ids (the gather
// that feeds a pipelined step its ids): the pipelined-step failure path of the engine. It counts
// its sampleRows calls too, so a test can see the step sampled on the "device".

import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import type { Tensor } from '../../src/contracts/backend.ts';
import type { DeviceSampleRow } from '../../src/contracts/device-sampling.ts';

export class FailingAhead extends ReferenceBackend {
  gathers = 0;
  /** sampleRows calls so far */
  calls = 0;
  private armed = false;
  constructor(private readonly failAt: number) {
    super();
  }
  override gatherRows(x: Tensor, idx: Tensor): Tensor {
    if (x.dtype === 'i32' && ++this.gathers === this.failAt) this.armed = true;
    return super.gatherRows(x, idx);
  }
  override sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    this.calls++;
    return super.sampleRows(logits, rows);
  }
  override read(t: Tensor): Promise<Float32Array | Int32Array> {
    if (!this.armed) return super.read(t);
    this.armed = false;
    return Promise.reject(new Error('device fault (test)'));
  }
}
