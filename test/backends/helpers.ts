// Shared helpers for backend op tests: seeded random data (never zero), weight files in a temp
// dir, running the same graph on the reference and CPU backends, tolerance checks, every CPU kernel
// ISA in turn, and a CUDA backend created with the settings a test compares.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { Backend, Tensor, WeightSource } from '../../src/contracts/backend.ts';
import { encodeHalf } from '../../src/backends/common/half.ts';
import type { CudaBackend } from '../../src/backends/cuda/cuda-backend.ts';
import type { CudaSettingsOverrides } from '../../src/backends/cuda/cuda-settings.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';

/** seeded test data */
export { mulberry32 as rng } from '../helpers/mulberry32.ts';

/** n values with |v| in [0.05, 1] (so never zero) and random sign, times `scale`. */
export function randomF32(r: () => number, n: number, scale = 1): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (r() < 0.5 ? -1 : 1) * (0.05 + 0.95 * r()) * scale;
  return out;
}

export interface Tolerance {
  atol: number;
  rtol: number;
}

/** Asserts |got - want| <= atol + rtol * |want| everywhere (NaN only where want is NaN). */
/**
 * Block tables for rows holding need[i] blocks each, scattered over a pool of `numBlocks` in a
 * random order (paging bugs hide when a row's blocks are consecutive); width `width`, -1 past a
 * row's blocks.
 */
export function scatteredBlockTables(r: () => number, need: readonly number[], width: number, numBlocks: number): Int32Array {
  const perm = Array.from({ length: numBlocks }, (_, i) => i);
  for (let i = numBlocks - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [perm[i], perm[j]] = [perm[j]!, perm[i]!];
  }
  const tables = new Int32Array(need.length * width).fill(-1);
  let next = 0;
  need.forEach((n, row) => {
    for (let b = 0; b < n; b++) tables[row * width + b] = perm[next++]!;
  });
  return tables;
}

export function assertClose(label: string, got: ArrayLike<number>, want: ArrayLike<number>, tol: Tolerance): void {
  assert.equal(got.length, want.length, `${label}: length ${got.length} != ${want.length}`);
  let worst = -1;
  let worstExcess = 0;
  for (let i = 0; i < want.length; i++) {
    const g = got[i]!;
    const w = want[i]!;
    if (Number.isNaN(w) || Number.isNaN(g)) {
      assert.ok(Number.isNaN(w) && Number.isNaN(g), `${label}[${i}]: got ${g}, want ${w}`);
      continue;
    }
    if (g === w) continue; // also covers equal infinities
    const excess = Math.abs(g - w) - (tol.atol + tol.rtol * Math.abs(w));
    if (!(excess <= 0) && (worst < 0 || excess > worstExcess)) {
      worst = i;
      worstExcess = excess;
    }
  }
  if (worst >= 0) {
    assert.fail(`${label}: element ${worst} is ${got[worst]}, want ${want[worst]} ` +
      `(|diff| ${Math.abs(got[worst]! - want[worst]!)} > atol ${tol.atol} + rtol ${tol.rtol} * |want|)`);
  }
}

/** A temp dir for weight files, removed by `cleanup`. */
export class WeightDir {
  readonly dir = mkdtempSync(join(tmpdir(), 'llmts-backend-test-'));
  private n = 0;

  /**
   * Writes `values` encoded as `dtype` after `pad` bytes of junk (so offsets matter) and returns
   * its WeightSource.
   */
  write(values: Float32Array, dtype: 'f32' | 'f16' | 'bf16', shape: number[], pad = 24): WeightSource {
    const body = dtype === 'f32' ? new Uint8Array(values.buffer, values.byteOffset, values.byteLength)
      : new Uint8Array(encodeHalf(values, dtype).buffer);
    return this.writeRaw(body, dtype, shape, pad);
  }

  writeRaw(body: Uint8Array, dtype: 'f32' | 'f16' | 'bf16', shape: number[], pad = 24): WeightSource {
    const bytes = new Uint8Array(pad + body.byteLength + 8).fill(0xa5);
    bytes.set(body, pad);
    const name = `w${this.n++}`;
    const path = join(this.dir, `${name}.bin`);
    writeFileSync(path, bytes);
    return { path, offset: pad, dtype, shape, name };
  }

  cleanup(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Reads a tensor as f32 values (i32 converted) for comparison. */
export async function readF(b: Backend, t: Tensor): Promise<Float32Array | Int32Array> {
  return b.read(t);
}

/** Runs `graph` on both backends and compares every returned tensor. */
export async function compareBackends(label: string, ref: Backend, cpu: Backend,
  graph: (b: Backend) => Promise<Tensor[]> | Tensor[], tol: Tolerance): Promise<void> {
  const want = await graph(ref);
  const got = await graph(cpu);
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) {
    assert.deepEqual([...got[i]!.shape], [...want[i]!.shape], `${label}: output ${i} shape`);
    assert.equal(got[i]!.dtype, want[i]!.dtype, `${label}: output ${i} dtype`);
    assertClose(`${label} (output ${i})`, await cpu.read(got[i]!), await ref.read(want[i]!), tol);
  }
}

/**
 * Runs `body` on a CUDA backend created with `settings` (the knobs a test compares; the others from
 * the environment), closed after. The CUDA modules load only when it is called, so CPU tests
 * importing this file never load them.
 */
export async function withCudaBackend<T>(settings: CudaSettingsOverrides, body: (b: CudaBackend) => Promise<T>): Promise<T> {
  const { createCudaBackend } = await import('../../src/backends/cuda/cuda-backend.ts');
  const b = await createCudaBackend({ settings });
  try {
    return await body(b);
  } finally {
    await b.close();
  }
}

/** The CPU library's kernel ISAs by level (native/llm.h llm_isa). */
export const CPU_ISA_NAMES = ['generic', 'avx2', 'avx512', 'avx512-bf16'] as const;
/** native/llm.h ISA_AVX512_BF16: matmuls of bf16 weights (K even) round x to bf16 */
export const ISA_AVX512_BF16 = 3;

/**
 * Runs `body` once per kernel ISA this CPU supports (matmul and attention dispatch by hand), and
 * for each both with small matmuls on one thread (the default) and on the whole OpenMP team;
 * `cpu` is synced before each switch, and the defaults come back at the end.
 */
export async function forEachCpuIsa(cpu: Backend, body: (isa: number, parallel: boolean) => Promise<void>): Promise<void> {
  const lib = loadNativeLib();
  try {
    for (let isa = lib.setIsa(-1); isa >= 0; isa--) {
      for (const parallelMin of [-1, 0]) {
        await cpu.sync();
        lib.setIsa(isa);
        lib.setGemvParallelMinBytes(parallelMin);
        await body(isa, parallelMin === 0);
      }
    }
  } finally {
    await cpu.sync();
    lib.setIsa(-1);
    lib.setGemvParallelMinBytes(-1);
  }
}
