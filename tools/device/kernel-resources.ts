// Registers, spills and shared memory of every CUDA kernel as ptxas compiles it for a GPU
// architecture, without a GPU: each kernel module's source (kernels.ts kernelModules, as the
// LLMTS_CUDA_* environment sets the backend's settings, $LLMTS_CUDA_ATT_DEFINES among them)
// through a local nvcc (`-cubin --resource-usage`).
// Occupancy decisions rest on these numbers (the tensor-core decode kernel's 3 blocks an SM, the
// GEMV kernels' 2), and a change that adds registers can silently halve them; check here before
// spending device time. The SASS column counts each kernel's instructions (its .text section in the
// cubin, 16 bytes an instruction on sm_70+): at one row a block fetches its code anew on an SM
// whose caches the step's other kernels filled, so a latency-bound kernel pays for its length
// (loops that run once a tile stay rolled for it: src/backends/cuda/TUNING.md). nvcc's front end
// is not NVRTC's, so the GPU's own numbers (CudaBackend.kernelResources, printed by
// bench/cuda-attention.ts) are the last word.
//
//   node --import tsx tools/device/kernel-resources.ts [--arch sm_90] [--nvcc PATH] [--filter REGEX]
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { cudaSettingsFrom } from '../../src/backends/cuda/cuda-settings.ts';
import { kernelModules } from '../../src/backends/cuda/kernels.ts';

const { values } = parseArgs({
  options: {
    arch: { type: 'string', default: 'sm_90' },
    nvcc: { type: 'string' },
    filter: { type: 'string', default: '' },
  },
});
const nvcc = values.nvcc ?? ['/usr/local/cuda/bin/nvcc', '/usr/local/cuda-13.0/bin/nvcc'].find((p) => existsSync(p)) ?? 'nvcc';
const filter = new RegExp(values.filter!);

interface Row { module: string; kernel: string; registers: number; spillStores: number; spillLoads: number; smem: number; sass: number }

/** instructions of each kernel in an sm_70+ cubin (ELF64): its `.text.<name>` section's bytes / 16 */
function sassInstructions(cubin: Buffer): Map<string, number> {
  const shoff = Number(cubin.readBigUInt64LE(0x28));
  const shentsize = cubin.readUInt16LE(0x3a), shnum = cubin.readUInt16LE(0x3c), shstrndx = cubin.readUInt16LE(0x3e);
  const section = (i: number) => {
    const o = shoff + i * shentsize;
    return { name: cubin.readUInt32LE(o), offset: Number(cubin.readBigUInt64LE(o + 0x18)), size: Number(cubin.readBigUInt64LE(o + 0x20)) };
  };
  const names = section(shstrndx).offset;
  const out = new Map<string, number>();
  for (let i = 0; i < shnum; i++) {
    const sec = section(i);
    const start = names + sec.name;
    const name = cubin.toString('latin1', start, cubin.indexOf(0, start));
    if (name.startsWith('.text.')) out.set(name.slice(6), sec.size / 16);
  }
  return out;
}
const rows: Row[] = [];
const dir = mkdtempSync(path.join(tmpdir(), 'llmts-kernel-resources-'));
try {
  for (const m of kernelModules(cudaSettingsFrom(process.env))) {
    const src = path.join(dir, `${m.name}.cu`);
    writeFileSync(src, m.source);
    // ptxas reports on stderr
    const run = spawnSync(nvcc, [`-arch=${values.arch}`, '-cubin', '--resource-usage', '-o', path.join(dir, `${m.name}.cubin`), src],
      { encoding: 'utf8' });
    const log = `${run.stdout ?? ''}${run.stderr ?? ''}`;
    if (run.status !== 0) {
      console.error(`${m.name}: ${nvcc} failed (${run.error?.message ?? `exit ${run.status}`})\n${log}`);
      process.exitCode = 1;
      continue;
    }
    // ptxas prints, per entry: "Function properties for NAME", "N bytes stack frame, S bytes spill
    // stores, L bytes spill loads", "Used R registers, ... B bytes smem"
    let cur: Row | undefined;
    for (const line of log.split('\n')) {
      const fn = /Function properties for (\w+)/.exec(line);
      if (fn) {
        cur = { module: m.name, kernel: fn[1]!, registers: 0, spillStores: 0, spillLoads: 0, smem: 0, sass: 0 };
        rows.push(cur);
        continue;
      }
      if (!cur) continue;
      const spill = /(\d+) bytes spill stores, (\d+) bytes spill loads/.exec(line);
      if (spill) {
        cur.spillStores = Number(spill[1]);
        cur.spillLoads = Number(spill[2]);
      }
      const used = /Used (\d+) registers.*?(?:(\d+) bytes smem)?$/.exec(line);
      if (used) {
        cur.registers = Number(used[1]);
        cur.smem = Number(used[2] ?? 0);
      }
    }
    const sass = sassInstructions(readFileSync(path.join(dir, `${m.name}.cubin`)));
    for (const r of rows) if (r.module === m.name) r.sass = sass.get(r.kernel) ?? 0;
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

const shown = rows.filter((r) => filter.test(r.kernel) && r.kernel.startsWith('k_'));
console.log(`${nvcc} -arch=${values.arch}: ${shown.length} kernels`);
console.log(`${'kernel'.padEnd(32)} ${'module'.padEnd(10)} regs  spill(st/ld)  smem   SASS`);
for (const r of shown.sort((a, b) => a.module.localeCompare(b.module) || a.kernel.localeCompare(b.kernel))) {
  const spill = r.spillStores || r.spillLoads ? `${r.spillStores}/${r.spillLoads}` : '-';
  console.log(`${r.kernel.padEnd(32)} ${r.module.padEnd(10)} ${String(r.registers).padStart(4)}  ${spill.padStart(12)}  ${String(r.smem).padStart(5)}  ${String(r.sass).padStart(5)}`);
}
