// The CUDA backend's argument checks (shared implementation in ../common/validate.ts, the ops'
// rules in ../common/op-shapes.ts): nothing that fails them reaches the stream.
import type { OpDtypes } from '../common/op-shapes.ts';
import { validators } from '../common/validate.ts';
import { ACTS, FLOAT, WEIGHTS } from './cuda-op-context.ts';
import { CudaTensor } from './cuda-tensor.ts';

/** bf16 or f32 activations (and logits); weights of any float dtype or FP8; small operands and KV pools of any float dtype */
export const CUDA_DTYPES: OpDtypes = { act: ACTS, weight: WEIGHTS, param: FLOAT, kv: FLOAT, logits: ACTS };

export const {
  opError, describe, checkShape, tensorArg, sameShape, expectDim, expectFinite, weightRows, opChecks,
} = validators('cuda', CudaTensor, CUDA_DTYPES);
