// The CUDA backend's argument checks (shared implementation in ../common/validate.ts): nothing
// that fails them reaches the stream.
import { validators } from '../common/validate.ts';
import { CudaTensor } from './cuda-tensor.ts';

export const {
  opError, describe, checkShape, tensorArg, sameShape, expectDim, expectFinite, weightRows, attentionParams, moeShapes,
} = validators('cuda', CudaTensor);
