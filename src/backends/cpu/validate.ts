// The CPU backend's argument checks (shared implementation in ../common/validate.ts): nothing
// that fails them reaches the native queue.
import { validators } from '../common/validate.ts';
import { CpuTensor } from './cpu-tensor.ts';

export const {
  opError, describe, checkShape, tensorArg, sameShape, expectDim, expectFinite, weightRows, attentionParams, moeShapes,
} = validators('cpu', CpuTensor);
