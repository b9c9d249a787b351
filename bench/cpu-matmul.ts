// Matmul throughput of the CPU backend at decode (M=1) and prefill (M=128) shapes, f32 and bf16
// weights. Prints GFLOP/s (2*M*N*K per matmul) and GB/s (weight + x + y bytes moved once).
//
//   npx tsx bench/cpu-matmul.ts [--n 4096] [--k 4096] [--ms 1,128] [--isa -1|0|1|2] [--seconds 2]
import { availableParallelism, cpus } from 'node:os';
import { parseArgs } from 'node:util';

import { encodeHalf } from '../src/backends/common/half.ts';
import { createCpuBackend } from '../src/backends/cpu/index.ts';
import { loadNativeLib } from '../src/backends/cpu/native-lib.ts';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '4096' },
    k: { type: 'string', default: '4096' },
    ms: { type: 'string', default: '1,128' },
    dtypes: { type: 'string', default: 'f32,bf16' },
    isa: { type: 'string', default: '-1' },
    seconds: { type: 'string', default: '2' },
  },
});
const N = Number(values.n);
const K = Number(values.k);
const isaNames = ['generic', 'avx2', 'avx512'];
const isa = loadNativeLib().setIsa(Number(values.isa));
const backend = await createCpuBackend();
console.log(`cpu: ${cpus()[0]?.model ?? '?'}, ${availableParallelism()} threads, OMP_NUM_THREADS=` +
  `${process.env.OMP_NUM_THREADS ?? '(default)'}, matmul ISA ${isaNames[isa]}`);

// Ceiling for the memory-bound decode rows, measured in the same run: an elementwise add over
// 2 x 128 MiB inputs (2 reads + 1 write per element).
async function streamGBs(): Promise<number> {
  const n = 32 * 1024 * 1024;
  const a = backend.zeros([n], 'f32');
  const c = backend.zeros([n], 'f32');
  backend.free(backend.add(a, c, 1)); // touch pages
  await backend.sync();
  const reps = 5;
  const t0 = performance.now();
  for (let r = 0; r < reps; r++) backend.free(backend.add(a, c, 1));
  await backend.sync();
  const ms = (performance.now() - t0) / reps;
  backend.free(a);
  backend.free(c);
  return (3 * 4 * n) / (ms * 1e6);
}
const ceiling = await streamGBs();
console.log(`memory ceiling (elementwise add, 2 reads + 1 write): ${ceiling.toFixed(1)} GB/s`);
console.log('dtype  M      N      K   ms/op   GFLOP/s   GB/s  %ceiling');

const rand = (n: number) => Float32Array.from({ length: n }, () => Math.random() * 2 - 1);
for (const dtype of values.dtypes!.split(',') as ('f32' | 'bf16')[]) {
  const wf = rand(N * K);
  // bf16 weights reach the backend the way a checkpoint does: through loadWeight from a file
  let w;
  if (dtype === 'bf16') {
    const { writeFileSync, mkdtempSync, rmSync } = await import('node:fs');
    const { join } = await import('node:path');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(join(tmpdir(), 'llmts-bench-'));
    const path = join(dir, 'w.bin');
    writeFileSync(path, encodeHalf(wf, 'bf16'));
    w = await backend.loadWeight({ path, offset: 0, dtype: 'bf16', shape: [N, K], name: 'w' }, 'keep');
    rmSync(dir, { recursive: true });
  } else {
    w = backend.upload(wf, [N, K]);
  }
  const wBytes = N * K * (dtype === 'bf16' ? 2 : 4);
  for (const M of values.ms!.split(',').map(Number)) {
    const x = backend.upload(rand(M * K), [M, K]);
    const runFor = async (reps: number) => {
      const t0 = performance.now();
      backend.beginScope();
      for (let r = 0; r < reps; r++) backend.matmul(x, w);
      backend.endScope();
      await backend.sync();
      return (performance.now() - t0) / reps;
    };
    await runFor(2); // warm-up: page faults, pool
    let reps = 2;
    let ms = await runFor(reps);
    reps = Math.max(3, Math.ceil((Number(values.seconds) * 1000) / ms));
    ms = await runFor(reps);
    const gflops = (2 * M * N * K) / (ms * 1e6);
    const gbs = (wBytes + 4 * M * (K + N)) / (ms * 1e6);
    console.log(`${dtype.padEnd(5)} ${String(M).padStart(3)} ${String(N).padStart(6)} ${String(K).padStart(6)} ` +
      `${ms.toFixed(3).padStart(7)} ${gflops.toFixed(1).padStart(9)} ${gbs.toFixed(1).padStart(6)} ` +
      `${((100 * gbs) / ceiling).toFixed(0).padStart(8)}`);
    backend.free(x);
  }
  backend.free(w);
}
await backend.close();
