#!/usr/bin/env node
// Builds the CPU backend's native library build/libllmts_cpu.so from native/*.c with the system
// C compiler. Runs as the package's own `install` script and as `npm run build:native` (--force).
//
// The build is skipped when the sources and flags are unchanged: their hash is stored beside the
// library. Kernels dispatch on the CPU at run time (target_clones / __builtin_cpu_supports), so
// no -march flag: the library runs on any x86-64 and uses AVX2/AVX-512 where present.
import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const srcDir = join(root, 'native');
const outDir = join(root, 'build');
const lib = join(outDir, 'libllmts_cpu.so');
const hashFile = `${lib}.hash`;
const force = process.argv.includes('--force');
const cc = process.env.CC || 'gcc';
// -fno-math-errno: no errno from libm calls (lets GCC inline sqrtf); never -ffast-math, which
// would also flush subnormals process-wide and reorder sums the tests compare.
// -z nodelete: the library (and the libgomp it pins) is never unloaded while its threads live.
const flags = ['-std=gnu11', '-O3', '-fopenmp', '-fPIC', '-shared', '-Wl,-z,nodelete', '-fvisibility=hidden', '-fno-math-errno',
  '-Wall', '-Wextra', '-Wno-psabi', '-Wno-unused-parameter'];

function fail(message) {
  console.error(`llmts: ${message}`);
  // Inside `npm install` a missing compiler must not abort the whole install: the CUDA backend
  // does not need it, and the CPU backend reports the missing library when it is created.
  process.exit(process.env.npm_lifecycle_event === 'install' && !force ? 0 : 1);
}

const sources = readdirSync(srcDir).filter((f) => f.endsWith('.c') || f.endsWith('.h')).sort();
const cFiles = sources.filter((f) => f.endsWith('.c')).map((f) => join(srcDir, f));
const hash = createHash('sha256');
hash.update(JSON.stringify({ cc, flags }));
for (const f of sources) hash.update(`${f}\0`).update(readFileSync(join(srcDir, f)));
const digest = hash.digest('hex');

if (!force && existsSync(lib) && existsSync(hashFile) && readFileSync(hashFile, 'utf8').trim() === digest) {
  console.log(`llmts: ${relative(root, lib)} is up to date`);
  process.exit(0);
}

const probe = spawnSync(cc, ['--version'], { encoding: 'utf8' });
if (probe.error) {
  fail(`cannot run the C compiler '${cc}' (${probe.error.code ?? probe.error.message}); the CPU backend needs ` +
    'gcc >= 10 with OpenMP (Debian/Ubuntu: apt-get install gcc). Then run: npm run build:native');
}

mkdirSync(outDir, { recursive: true });
const tmp = `${lib}.tmp-${process.pid}`;
// One progress line: started here, finished below.
process.stdout.write(`llmts: building ${relative(root, lib)} from ${cFiles.length} C files (${cc} ${flags.slice(0, 3).join(' ')} ...) `);
const t0 = Date.now();
const res = spawnSync(cc, [...flags, '-o', tmp, ...cFiles, '-lm'], { cwd: root, encoding: 'utf8' });
if (res.status !== 0) {
  process.stdout.write('failed\n');
  rmSync(tmp, { force: true });
  process.stderr.write(res.stderr ?? '');
  fail(`building ${relative(root, lib)} failed (${cc} exited with ${res.status ?? res.signal})`);
}
// Rename into place so a process that is loading the library never sees a half-written file.
renameSync(tmp, lib);
writeFileSync(hashFile, `${digest}\n`);
console.log(`done in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
if (res.stderr) process.stderr.write(res.stderr); // warnings
