// Compiles the kernel source with NVRTC for one GPU architecture, caching the cubin on disk under
// $LLMTS_CACHE_DIR or $XDG_CACHE_HOME/llmts/cuda or ~/.cache/llmts/cuda, named by
// sha256(source, arch, NVRTC version, options): a second start loads the cubin without compiling.
// A cache that cannot be written is no error (the compile result is used anyway).
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

import { loadNvrtc, num, out64 } from './cuda-lib.ts';

export function cudaCacheDir(): string {
  if (process.env.LLMTS_CACHE_DIR) return join(process.env.LLMTS_CACHE_DIR, 'cuda');
  const base = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
  return join(base, 'llmts', 'cuda');
}

export interface CompiledModule {
  cubin: Uint8Array;
  /** where the cubin came from */
  source: 'cache' | 'nvrtc';
  cachePath: string;
  nvrtcVersion: string;
  compileMs: number;
}

const memo = new Map<string, CompiledModule>();

/** `arch` as "sm_90". */
export function compileKernels(source: string, arch: string): CompiledModule {
  const nv = loadNvrtc();
  const major = new Int32Array(1);
  const minor = new Int32Array(1);
  nv.nvrtcVersion(major, minor);
  const version = `${major[0]}.${minor[0]}`;
  const options = [`--gpu-architecture=${arch}`];
  const key = createHash('sha256').update(source).update('\0').update(arch).update('\0').update(version)
    .update('\0').update(options.join(' ')).digest('hex');
  const hit = memo.get(key);
  if (hit) return hit;
  const dir = cudaCacheDir();
  const cachePath = join(dir, `${key}.cubin`);
  try {
    const cubin = new Uint8Array(readFileSync(cachePath));
    if (cubin.length > 0) {
      const m: CompiledModule = { cubin, source: 'cache', cachePath, nvrtcVersion: version, compileMs: 0 };
      memo.set(key, m);
      return m;
    }
  } catch {
    // not cached yet
  }
  const t0 = performance.now();
  const prog = out64();
  const rcCreate = nv.nvrtcCreateProgram(prog, source, 'llmts_kernels.cu', 0, null, null);
  if (rcCreate !== 0) throw new Error(`cuda backend: nvrtcCreateProgram failed: ${nv.nvrtcGetErrorString(rcCreate)}`);
  try {
    const rc = nv.nvrtcCompileProgram(num(prog), options.length, options);
    const logSize = out64();
    nv.nvrtcGetProgramLogSize(num(prog), logSize);
    const logBuf = new Uint8Array(Math.max(1, num(logSize)));
    nv.nvrtcGetProgramLog(num(prog), logBuf);
    const log = Buffer.from(logBuf).toString('utf8').replace(/\0+$/, '').trim();
    if (rc !== 0) {
      throw new Error(`cuda backend: compiling kernels for ${arch} with NVRTC ${version} failed: ` +
        `${nv.nvrtcGetErrorString(rc)}\n${log}`);
    }
    const size = out64();
    const rcSize = nv.nvrtcGetCUBINSize(num(prog), size);
    if (rcSize !== 0 || num(size) === 0) {
      throw new Error(`cuda backend: NVRTC ${version} produced no cubin for ${arch}: ${nv.nvrtcGetErrorString(rcSize)}`);
    }
    const cubin = new Uint8Array(num(size));
    const rcGet = nv.nvrtcGetCUBIN(num(prog), cubin);
    if (rcGet !== 0) throw new Error(`cuda backend: nvrtcGetCUBIN failed: ${nv.nvrtcGetErrorString(rcGet)}`);
    try {
      mkdirSync(dir, { recursive: true });
      const tmp = `${cachePath}.${process.pid}.tmp`;
      writeFileSync(tmp, cubin);
      renameSync(tmp, cachePath); // atomic: a concurrent start never reads half a file
    } catch {
      // an unwritable cache only costs the next start a compile
    }
    const m: CompiledModule = {
      cubin, source: 'nvrtc', cachePath, nvrtcVersion: version, compileMs: performance.now() - t0,
    };
    memo.set(key, m);
    return m;
  } finally {
    nv.nvrtcDestroyProgram(prog);
  }
}
