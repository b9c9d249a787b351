// Builds and runs warp-simulator programs (warp-sim.h + kernels.ts' prelude + a CUDA module's own
// source + a driver main()) with the system g++, cached by source hash in the OS temp directory.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { KERNEL_PRELUDE } from '../../../src/backends/cuda/kernels.ts';

const DIR = path.join(os.tmpdir(), 'llmts-cuda-sim');

/** Why the simulator cannot be built here (no g++), or null. */
export function simUnavailable(): string | null {
  try {
    execFileSync('g++', ['--version'], { stdio: 'ignore' });
    return null;
  } catch {
    return 'g++ is not installed';
  }
}

const built = new Map<string, string>();

/**
 * -fno-strict-aliasing: the kernels write 16-byte vectors through u16 pointers (as CUDA code
 * does); g++'s type-based alias analysis drops those writes. Part of the cache key.
 */
const GXX_FLAGS = ['-O2', '-std=c++17', '-fno-strict-aliasing', '-w'];

/** Compiles warp-sim.h + the kernels' prelude + `source` (a module's kernels and a driver main()); returns the binary's path. */
export function buildSim(name: string, source: string): string {
  const header = readFileSync(path.join(import.meta.dirname, 'warp-sim.h'), 'utf8');
  const full = `${header}\n${KERNEL_PRELUDE}\n${source}`;
  const hash = createHash('sha256').update(GXX_FLAGS.join(' ')).update(full).digest('hex').slice(0, 16);
  const bin = path.join(DIR, `${name}-${hash}`);
  const known = built.get(bin);
  if (known) return known;
  if (!existsSync(bin)) {
    mkdirSync(DIR, { recursive: true });
    const src = path.join(DIR, `${name}-${hash}-${process.pid}.cpp`);
    writeFileSync(src, full);
    const tmp = `${bin}.${process.pid}`;
    try {
      execFileSync('g++', [...GXX_FLAGS, '-o', tmp, src], { stdio: ['ignore', 'ignore', 'pipe'] });
      renameSync(tmp, bin); // atomic: concurrent test processes never run a half-written binary
    } finally {
      rmSync(src, { force: true });
    }
  }
  built.set(bin, bin);
  return bin;
}

/**
 * Runs a simulator binary on one input file; returns its output file's bytes (a buffer of their
 * own). Unless $WARP_SIM_SCHEDULE picks one, it runs under each of warp-sim.h's schedules and
 * requires the same bytes from all, but for `scheduleDependent` [start, end) ranges (an error
 * report's details: the first thread to report wins, on a GPU as here).
 */
export function runSim(bin: string, input: Buffer, opts: { scheduleDependent?: readonly [number, number][] } = {}): ArrayBuffer {
  mkdirSync(DIR, { recursive: true });
  const inp = path.join(DIR, `in-${process.pid}-${Math.random().toString(36).slice(2)}.bin`);
  const outp = `${inp}.out`;
  writeFileSync(inp, input);
  try {
    // each schedule (warp-sim.h): a kernel whose result depends on which warp runs ahead has a race
    const run = (schedule: string) => {
      execFileSync(bin, [inp, outp], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 120_000,
        env: { ...process.env, WARP_SIM_SCHEDULE: schedule } });
      return readFileSync(outp);
    };
    const chosen = process.env.WARP_SIM_SCHEDULE;
    const raw = run(chosen ?? 'round-robin');
    if (chosen === undefined) {
      // bytes that may rightly differ between schedules (which thread reports an error first) compare as zeros
      const masked = (b: Buffer) => {
        const m = Buffer.from(b);
        for (const [start, end] of opts.scheduleDependent ?? []) m.fill(0, start, end);
        return m;
      };
      const want = masked(raw);
      for (const schedule of ['warp-first', 'warp-first-reverse']) {
        if (!want.equals(masked(run(schedule)))) {
          throw new Error(`warp-sim: ${path.basename(bin)} gave different bytes when each warp ran ahead (${schedule}) ` +
            'than round-robin: the kernel has a race between warps');
        }
      }
    }
    return raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength);
  } finally {
    rmSync(inp, { force: true });
    rmSync(outp, { force: true });
  }
}

/** The bytes of typed arrays, back to back. */
export function bytesOf(...arrays: ArrayBufferView[]): Buffer {
  return Buffer.concat(arrays.map((a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength)));
}
