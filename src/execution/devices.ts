// Picks the backend for `--device auto|cpu|cuda`.

import type { Backend } from '../contracts/backend.ts';
import { createCpuBackend } from '../backends/cpu/cpu-backend.ts';
import type { CpuSettings } from '../backends/cpu/cpu-settings.ts';
import { createCudaBackend, probeCuda } from '../backends/cuda/index.ts';
import type { CudaSettingsOverrides } from '../backends/cuda/cuda-settings.ts';
import { ReferenceBackend } from '../backends/reference/reference-backend.ts';

export const DEVICES = ['auto', 'cpu', 'cuda'] as const;
export type Device = (typeof DEVICES)[number];

export class DeviceError extends Error {}

export function parseDevice(raw: string | undefined): Device {
  const d = raw ?? 'auto';
  if (!(DEVICES as readonly string[]).includes(d)) throw new DeviceError(`--device must be one of ${DEVICES.join(', ')}, got "${d}"`);
  return d as Device;
}

/** Why CUDA cannot be used here (no libcuda, cuInit fails, no device), or undefined when it can. */
export function cudaUnavailableReason(): string | undefined {
  const probe = probeCuda();
  return probe.ok ? undefined : probe.reason;
}

/** Knobs set in code for whichever backend opens (cpu-settings.ts, cuda-settings.ts); the rest come from the environment. */
export interface BackendSettings {
  cpu?: Partial<CpuSettings>;
  cuda?: CudaSettingsOverrides;
}

export async function openBackend(device: Device, settings: BackendSettings = {}): Promise<Backend> {
  // Test-only, undocumented for users: LLMTS_BACKEND=reference runs the plain TypeScript reference
  // backend (slow, no native build needed) so spawned-process tests (server, CLI) do not depend on
  // the native library. Any other value is an error rather than silently ignored.
  const forced = process.env.LLMTS_BACKEND;
  if (forced === 'reference') return new ReferenceBackend();
  if (forced !== undefined && forced !== '') throw new DeviceError(`LLMTS_BACKEND must be "reference" (test-only) or unset, got "${forced}"`);
  if (device === 'cpu') return createCpuBackend({ settings: settings.cpu });
  const why = cudaUnavailableReason();
  // auto = CUDA when usable. Its kernels compile while the caller loads weights: loadModel awaits
  // backend.ready() before the first op.
  if (why === undefined) return createCudaBackend({ kernels: 'background', settings: settings.cuda });
  if (device === 'cuda') throw new DeviceError(`--device cuda: CUDA is not usable here: ${why}`);
  return createCpuBackend({ settings: settings.cpu });
}

