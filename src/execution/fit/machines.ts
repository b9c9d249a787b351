// The machines `llmts fit` plans for: a table of NVIDIA GPUs (memory and memory bandwidth) and
// this machine's CPU. A custom device comes from --memory and --bandwidth.
//
// GPU figures are the public spec values: memory and peak memory bandwidth from NVIDIA's product
// pages and datasheets (datacenter) and NVIDIA's GeForce / RTX spec pages (consumer). Memory is
// the nominal capacity read as GiB; the driver reports up to ~1% less on HBM parts (an H100 80GB
// shows 79.6 GiB), which the utilization margin covers.

import os from 'node:os';

export type MachineKind = 'cpu' | 'gpu';

export interface Machine {
  kind: MachineKind;
  /** table name, "cpu", or "custom" */
  name: string;
  description: string;
  memoryBytes: number;
  /** peak (GPU spec) or measured (CPU copy) memory bandwidth, GB/s (1e9 bytes) */
  bandwidthGBps: number;
  /** where memory and bandwidth come from */
  source: string;
}

interface GpuSpec {
  name: string;
  description: string;
  memoryGiB: number;
  bandwidthGBps: number;
  /** the kind of public source the figures were taken from */
  source: string;
}

const DC = 'NVIDIA datacenter datasheet';
const GF = 'NVIDIA GeForce spec page';
const WS = 'NVIDIA workstation datasheet';

// name: lower-case, as typed on the command line
export const GPUS: readonly GpuSpec[] = [
  // datacenter
  { name: 'b200', description: 'NVIDIA B200 (HGX)', memoryGiB: 180, bandwidthGBps: 8000, source: DC },
  { name: 'h200', description: 'NVIDIA H200 SXM 141GB', memoryGiB: 141, bandwidthGBps: 4800, source: DC },
  { name: 'h200-nvl', description: 'NVIDIA H200 NVL 141GB', memoryGiB: 141, bandwidthGBps: 4800, source: DC },
  { name: 'gh200', description: 'NVIDIA GH200 (96GB HBM3)', memoryGiB: 96, bandwidthGBps: 4000, source: DC },
  { name: 'h100', description: 'NVIDIA H100 SXM5 80GB', memoryGiB: 80, bandwidthGBps: 3350, source: DC },
  { name: 'h100-nvl', description: 'NVIDIA H100 NVL 94GB', memoryGiB: 94, bandwidthGBps: 3900, source: DC },
  { name: 'h100-pcie', description: 'NVIDIA H100 PCIe 80GB', memoryGiB: 80, bandwidthGBps: 2000, source: DC },
  { name: 'a100-80gb', description: 'NVIDIA A100 SXM4 80GB', memoryGiB: 80, bandwidthGBps: 2039, source: DC },
  { name: 'a100-40gb', description: 'NVIDIA A100 SXM4 40GB', memoryGiB: 40, bandwidthGBps: 1555, source: DC },
  { name: 'l40s', description: 'NVIDIA L40S 48GB', memoryGiB: 48, bandwidthGBps: 864, source: DC },
  { name: 'l40', description: 'NVIDIA L40 48GB', memoryGiB: 48, bandwidthGBps: 864, source: DC },
  { name: 'a10', description: 'NVIDIA A10 24GB', memoryGiB: 24, bandwidthGBps: 600, source: DC },
  { name: 'l4', description: 'NVIDIA L4 24GB', memoryGiB: 24, bandwidthGBps: 300, source: DC },
  { name: 'v100', description: 'NVIDIA V100 SXM2 32GB', memoryGiB: 32, bandwidthGBps: 900, source: DC },
  { name: 't4', description: 'NVIDIA T4 16GB', memoryGiB: 16, bandwidthGBps: 320, source: DC },
  // workstation
  { name: 'rtx-pro-6000', description: 'NVIDIA RTX PRO 6000 Blackwell 96GB', memoryGiB: 96, bandwidthGBps: 1792, source: WS },
  { name: 'rtx-6000-ada', description: 'NVIDIA RTX 6000 Ada 48GB', memoryGiB: 48, bandwidthGBps: 960, source: WS },
  { name: 'rtx-a6000', description: 'NVIDIA RTX A6000 48GB', memoryGiB: 48, bandwidthGBps: 768, source: WS },
  // consumer
  { name: 'rtx-5090', description: 'GeForce RTX 5090 32GB', memoryGiB: 32, bandwidthGBps: 1792, source: GF },
  { name: 'rtx-5080', description: 'GeForce RTX 5080 16GB', memoryGiB: 16, bandwidthGBps: 960, source: GF },
  { name: 'rtx-5070-ti', description: 'GeForce RTX 5070 Ti 16GB', memoryGiB: 16, bandwidthGBps: 896, source: GF },
  { name: 'rtx-5070', description: 'GeForce RTX 5070 12GB', memoryGiB: 12, bandwidthGBps: 672, source: GF },
  { name: 'rtx-4090', description: 'GeForce RTX 4090 24GB', memoryGiB: 24, bandwidthGBps: 1008, source: GF },
  { name: 'rtx-4080', description: 'GeForce RTX 4080 16GB', memoryGiB: 16, bandwidthGBps: 717, source: GF },
  { name: 'rtx-4070-ti-super', description: 'GeForce RTX 4070 Ti SUPER 16GB', memoryGiB: 16, bandwidthGBps: 672, source: GF },
  { name: 'rtx-4070', description: 'GeForce RTX 4070 12GB', memoryGiB: 12, bandwidthGBps: 504, source: GF },
  { name: 'rtx-4060-ti-16gb', description: 'GeForce RTX 4060 Ti 16GB', memoryGiB: 16, bandwidthGBps: 288, source: GF },
  { name: 'rtx-3090', description: 'GeForce RTX 3090 24GB', memoryGiB: 24, bandwidthGBps: 936, source: GF },
  { name: 'rtx-3080', description: 'GeForce RTX 3080 10GB', memoryGiB: 10, bandwidthGBps: 760, source: GF },
  { name: 'rtx-3060', description: 'GeForce RTX 3060 12GB', memoryGiB: 12, bandwidthGBps: 360, source: GF },
];

export const GPU_NAMES: readonly string[] = GPUS.map((g) => g.name);

export class MachineError extends Error {}

/** Lower-cases and drops an "nvidia-" prefix, spaces and underscores become dashes. */
function normalizeName(raw: string): string {
  return raw.trim().toLowerCase().replace(/[\s_]+/g, '-').replace(/^nvidia-/, '').replace(/^geforce-/, '');
}

export function gpuMachine(raw: string): Machine {
  const name = normalizeName(raw);
  const g = GPUS.find((x) => x.name === name);
  if (!g) throw new MachineError(`unknown GPU "${raw}"; accepted: ${GPU_NAMES.join(', ')} (or --memory SIZE --bandwidth GBps)`);
  return {
    kind: 'gpu', name: g.name, description: g.description,
    memoryBytes: g.memoryGiB * 2 ** 30, bandwidthGBps: g.bandwidthGBps, source: g.source,
  };
}

export function customMachine(kind: MachineKind, memoryBytes: number, bandwidthGBps: number): Machine {
  if (!Number.isFinite(memoryBytes) || memoryBytes <= 0) throw new MachineError(`memory must be a positive size, got ${memoryBytes}`);
  if (!Number.isFinite(bandwidthGBps) || bandwidthGBps <= 0) throw new MachineError(`bandwidth must be a positive number of GB/s, got ${bandwidthGBps}`);
  return {
    kind, name: 'custom', description: `custom ${kind === 'gpu' ? 'GPU' : 'CPU'}`,
    memoryBytes, bandwidthGBps, source: '--memory and --bandwidth',
  };
}

/**
 * Copy bandwidth of this machine (bytes read + written per second, GB/s): best of `repeats`
 * copies of a `mib` MiB buffer. The same measurement bench/cpu-generate.ts makes, so the CPU
 * decode efficiency (constants.ts), measured against it, applies.
 */
export function measureCopyBandwidth(mib = 256, repeats = 10): number {
  const n = mib * 2 ** 20;
  const a = Buffer.alloc(n, 1), b = Buffer.alloc(n);
  let best = Infinity;
  for (let k = 0; k < repeats; k++) {
    const t = performance.now();
    a.copy(b);
    best = Math.min(best, performance.now() - t);
  }
  return (2 * n) / (best / 1000) / 1e9;
}

/** This machine's CPU: RAM from os.totalmem(), bandwidth measured now unless given. */
export function cpuMachine(bandwidthGBps?: number): Machine {
  const cpus = os.cpus();
  const measured = bandwidthGBps === undefined;
  return {
    kind: 'cpu', name: 'cpu',
    description: `${cpus[0]?.model?.trim() ?? 'CPU'}, ${cpus.length} cores, ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB`,
    memoryBytes: os.totalmem(),
    bandwidthGBps: bandwidthGBps ?? measureCopyBandwidth(),
    source: measured ? 'os.totalmem(); copy bandwidth measured now (256 MiB Buffer.copy, best of 10)' : 'os.totalmem(); --bandwidth',
  };
}
