// The CUDA backend's token picks on the device (Backend.argmax, sampleRows): greedy argmax in two
// kernels (per-chunk partials, then a final pass), and the checks in front of on-device sampling,
// whose launch logic is sampling.ts. Separate from cuda-backend.ts because they end a step: what
// they return is all the host reads back of the logits.
import type { Tensor } from '../../contracts/backend.ts';
import { type DeviceSampleRow, type PackedSampleRows, sampleResultWidth } from '../../contracts/device-sampling.ts';
import { check } from './cuda-lib.ts';
import * as shapes from '../common/op-shapes.ts';
import { type CudaOpContext, MAX_GRID_Y } from './cuda-op-context.ts';
import { DT_CODE } from './cuda-tensor.ts';
import { enqueueSampleRows, planSampleRows } from './sampling.ts';
import { opError } from './validate.ts';

export function argmax(c: CudaOpContext, x: Tensor): Tensor {
  const op = 'argmax';
  const { x: a, R, V } = shapes.argmax(c.checks, x);
  if (R > MAX_GRID_Y) throw opError(op, `${R} rows is above ${MAX_GRID_Y}`);
  const y = c.out([R], 'i32');
  if (R === 0) return y;
  if (V === 0) {
    check(c.rt.d.cuMemsetD32Async(y.addr, 0xffffffff, R, c.rt.stream), 'argmax of empty rows');
    return y;
  }
  // chunks of >= 4096 values (a multiple of 8 for 16-byte loads), at most 64 per row
  const S = Math.max(1, Math.min(64, Math.ceil(V / 4096)));
  const chunk = Math.ceil(V / S / 8) * 8;
  const pv = c.pool.alloc(R * S * 4).addr, pi = c.pool.alloc(R * S * 4).addr;
  c.rt.launch('k_argmax_part', [Math.ceil(V / chunk), R, 1], 256, 0, [
    ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', pv], ['p', pi], ['i', V], ['i', chunk]]);
  c.rt.launch('k_argmax_final', [Math.ceil(R / 8), 1, 1], 256, 0, [
    ['p', pv], ['p', pi], ['p', y.addr], ['i', R], ['i', Math.ceil(V / chunk)]]);
  c.pool.release(pv, R * S * 4);
  c.pool.release(pi, R * S * 4);
  return y;
}

export function sampleRows(c: CudaOpContext, logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
  const op = 'sampleRows';
  const { logits: a, P, V } = shapes.sampleRows(c.checks, logits, rows);
  c.assertNotCapturing(op); // it uploads the rows
  let plan: PackedSampleRows;
  try {
    plan = planSampleRows(rows, Math.max(V, 1));
  } catch (e) {
    throw opError(op, (e as Error).message);
  }
  const y = c.out([P, sampleResultWidth(plan.k)], 'i32');
  if (V === 0 && P > 0) { // nothing to pick: every row is a masked row
    check(c.rt.d.cuMemsetD32Async(y.addr, 0xffffffff, P * sampleResultWidth(plan.k), c.rt.stream), 'sampleRows of empty rows');
    return y;
  }
  enqueueSampleRows(c.rt, c.pool, plan, a.addr, a.dtype, y.addr);
  return y;
}
