// The reference backend with graph capture, off the GPU: a capture keeps the body and a replay
// re-runs it, copying the fresh outputs into the captured ones (so, as on the device, outputs are
// rewritten by every replay and inputs change only through copyInto / copyTensor).

import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import type { CapturedGraph, Tensor } from '../../src/contracts/backend.ts';

export class ReplayingReference extends ReferenceBackend {
  captures = 0;
  replays = 0;
  private capturing = false;

  override upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor {
    if (this.capturing) throw new Error('upload inside a graph body');
    return super.upload(data, shape);
  }

  captureGraph(body: () => Tensor[]): CapturedGraph {
    const run = () => {
      this.capturing = true;
      this.beginScope();
      try {
        const out = body();
        this.endScope(out);
        return out;
      } finally {
        this.capturing = false;
      }
    };
    const outputs = run();
    this.captures++;
    return {
      outputs,
      replay: () => {
        this.replays++;
        const fresh = run();
        fresh.forEach((t, i) => (outputs[i] as unknown as { data: Float32Array }).data.set((t as unknown as { data: Float32Array }).data));
      },
      dispose: () => {},
    };
  }

  copyInto(t: Tensor, data: Float32Array | Int32Array): void {
    (t as unknown as { data: Float32Array | Int32Array }).data.set(data);
  }
}
