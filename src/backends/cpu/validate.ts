// The CPU backend's argument checks (shared implementation in ../common/validate.ts, the ops'
// rules in ../common/op-shapes.ts): nothing that fails them reaches the native queue.
import { F32, FLOATS, type OpDtypes } from '../common/op-shapes.ts';
import { validators } from '../common/validate.ts';
import { CpuTensor } from './cpu-tensor.ts';

/** f32 activations and small operands; the KV pools hold f32 (the default), bf16 (half the bytes a decode step reads), or int8 / fp8 with a scale per row (about a quarter) */
export const CPU_DTYPES: OpDtypes = { act: F32, weight: FLOATS, param: F32, kv: ['f32', 'bf16', 'int8', 'fp8'], logits: FLOATS };

export const {
  opError, describe, checkShape, tensorArg, sameShape, expectDim, expectFinite, weightRows, opChecks,
} = validators('cpu', CpuTensor, CPU_DTYPES);
