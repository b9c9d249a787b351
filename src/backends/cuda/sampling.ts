// Launch logic of on-device sampling (Backend.sampleRows): one packed upload of every row's
// parameters, sparse penalty/bias entries and grammar masks (contracts/device-sampling.ts), a
// scratch row for each row that is processed (bias, penalties or a mask), then one launch of
// k_sample_rows (sampling-kernels.ts), one block per row. The backend validates the call.
//
// Stream-ordered and free of host decisions on device data: the grid, the scratch size and the
// output width follow from the rows alone, and nothing waits. The upload is a copy from pageable
// memory, so the op is not capturable into a graph as is; a captured variant would keep the packed
// buffer in a fixed tensor (copyInto) sized for the largest call, scratch for every row and K = 20.
import { type DeviceSampleRow, packSampleRows, type PackedSampleRows } from '../../contracts/device-sampling.ts';
import type { DType } from '../../contracts/backend.ts';
import { check } from './cuda-lib.ts';
import { DT_CODE } from './cuda-tensor.ts';
import type { DevicePool } from './device-pool.ts';
import type { CudaRuntime } from './runtime.ts';
import { SAMPLE_THREADS } from './sampling-kernels.ts';

/** The packed rows of one call (its K fixes the output width). Throws RangeError on a bad row. */
export function planSampleRows(rows: readonly DeviceSampleRow[], V: number): PackedSampleRows {
  return packSampleRows(rows, V);
}

/** Enqueues the upload and the kernel: logits [P, V] -> out i32 [P, 2 + 2 * plan.k]. */
export function enqueueSampleRows(rt: CudaRuntime, pool: DevicePool, plan: PackedSampleRows, logits: number,
  logitsDtype: DType, out: number): void {
  const P = plan.rows, V = plan.vocab;
  if (P === 0) return;
  const words = plan.words;
  const packedBytes = words.byteLength;
  const packed = pool.alloc(packedBytes).addr;
  const scratchBytes = plan.scratchRows * V * 4;
  const scratch = scratchBytes > 0 ? pool.alloc(scratchBytes).addr : 0;
  try {
    // from pageable memory: the driver stages the bytes before returning
    check(rt.d.cuMemcpyHtoDAsync_v2(packed, words, packedBytes, rt.stream), 'sampleRows upload');
    rt.launch('k_sample_rows', [P, 1, 1], SAMPLE_THREADS, 0, [
      ['p', logits], ['i', DT_CODE[logitsDtype]], ['p', packed], ['p', scratch], ['p', out], ['i', V],
      ['i', 2 + 2 * plan.k]]);
  } finally {
    // stream order: the kernel enqueued above runs before any later user of these blocks
    pool.release(packed, packedBytes);
    if (scratch) pool.release(scratch, scratchBytes);
  }
}
