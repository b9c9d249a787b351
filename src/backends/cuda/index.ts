export { CudaBackend, createCudaBackend, type CudaBackendInfo, type CudaBackendOptions } from './cuda-backend.ts';
export { CudaTensor } from './cuda-tensor.ts';
export { CudaUnavailableError, probeCuda, type CudaProbe } from './cuda-lib.ts';
