export { CpuBackend, createCpuBackend, type CpuBackendOptions } from './cpu-backend.ts';
export { CpuTensor } from './cpu-tensor.ts';
export { type CpuSettings, cpuSettingsFrom } from './cpu-settings.ts';
