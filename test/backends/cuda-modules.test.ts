// The CUDA backend's kernel modules and how they are built, on the CPU (no GPU needed): the module
// list (kernels.ts), the NVRTC plumbing (nvrtc.ts) against a fake NVRTC whose "compile" is a real
// native call that blocks a libuv pool thread, the disk cache, and CudaRuntime.create with a fake
// driver. One test compiles every module with the real NVRTC when libnvrtc is present (it needs no GPU).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import koffi from 'koffi';

import { type Driver, loadNvrtc, type Nvrtc, NVRTC_ASYNC_STACK_BYTES } from '../../src/backends/cuda/cuda-lib.ts';
import { CUDA_DEFAULTS } from '../../src/backends/cuda/cuda-settings.ts';
import { kernelModules, KERNEL_NAMES, KERNEL_PRELUDE, type KernelModule } from '../../src/backends/cuda/kernels.ts';
import {
  type CompiledModule, compileModule, forgetCompiledModules, kernelCompileOptions, moduleCacheKey, type ModuleSource,
  nvrtcCompileMode, nvrtcJobs,
} from '../../src/backends/cuda/nvrtc.ts';
import { CudaBackend } from '../../src/backends/cuda/cuda-backend.ts';
import { DevicePool } from '../../src/backends/cuda/device-pool.ts';
import { CudaRuntime } from '../../src/backends/cuda/runtime.ts';
import { loadModel } from '../../src/execution/load-model.ts';

const ROOT = join(import.meta.dirname, '..', '..');
/** the modules as a backend with the default settings builds them */
const KERNEL_MODULES = kernelModules(CUDA_DEFAULTS);
const tmp = mkdtempSync(join(tmpdir(), 'llmts-cuda-modules-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
let dirs = 0;
const freshDir = () => join(tmp, `cache${dirs++}`);

// libc through koffi (after the imports above: cuda-lib.ts configures koffi before any library loads)
const libc = koffi.load('libc.so.6');
const usleep = libc.func('int usleep(uint32_t)');
const malloc = libc.func('uint64_t malloc(size_t)');
const free = libc.func('void free(uint64_t)');

/** Kernels a CUDA source defines: `extern "C" __global__` functions, macro-made ones expanded. */
function definedKernels(source: string): string[] {
  const out: string[] = [];
  for (const m of source.matchAll(/extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s+)?([\w#]+)\s*\(/g)) {
    if (!m[1]!.includes('#')) out.push(m[1]!);
  }
  for (const m of source.matchAll(/^#define\s+(\w+)\(([^)]*)\)((?:.*\\\n)+.*)$/gm)) {
    const tpls = [...m[3]!.matchAll(/__global__\s+void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s+)?([\w#]+)\s*\(/g)].map((t) => t[1]!);
    const params = m[2]!.split(',').map((p) => p.trim());
    for (const inst of source.matchAll(new RegExp(`^${m[1]}\\(([^)]*)\\)\\s*$`, 'gm'))) {
      const args = inst[1]!.split(',').map((a) => a.trim());
      for (const tpl of tpls) out.push(tpl.split('##').map((tok) => (params.includes(tok) ? args[params.indexOf(tok)]! : tok)).join(''));
    }
  }
  return out;
}

describe('kernel modules (kernels.ts)', () => {
  test('every kernel is in exactly one module, and each module defines exactly its own kernels', () => {
    assert.ok(KERNEL_MODULES.length >= 3);
    for (const required of ['base', 'fused', 'attention']) assert.ok(KERNEL_MODULES.some((m) => m.name === required), required);
    assert.equal(new Set(KERNEL_MODULES.map((m) => m.name)).size, KERNEL_MODULES.length, 'module names are unique');
    const owner = new Map<string, string>();
    for (const m of KERNEL_MODULES) {
      assert.match(m.name, /^[a-z][a-z0-9_]*$/, 'a module name is file-name safe');
      for (const k of m.kernels) {
        assert.equal(owner.get(k), undefined, `${k} is in ${owner.get(k)} and ${m.name}`);
        owner.set(k, m.name);
      }
      assert.deepEqual([...definedKernels(m.source)].sort(), [...m.kernels].sort(), `${m.name}: defined vs listed kernels`);
    }
    assert.deepEqual([...KERNEL_NAMES].sort(), [...owner.keys()].sort());
    assert.deepEqual(definedKernels(KERNEL_PRELUDE), [], 'the prelude defines no kernel');
  });

  test('every module compiles on its own: it starts with the prelude (bf2f, f2bf, report, warp_sum, ...)', () => {
    for (const helper of ['bf2f(', 'f2bf(', 'report(', 'warp_sum(', 'block_sum(', 'GRID_STRIDE(', 'typedef unsigned short u16']) {
      assert.ok(KERNEL_PRELUDE.includes(helper), helper);
    }
    for (const m of KERNEL_MODULES) {
      assert.ok(m.source.startsWith(KERNEL_PRELUDE), `${m.name} starts with the prelude`);
      assert.ok(m.source.length > KERNEL_PRELUDE.length, `${m.name} has kernels of its own`);
    }
  });

  test('cache keys: one per module, stable, and changed by source, arch, NVRTC version and options', () => {
    const key = (m: ModuleSource, arch = 'sm_90', v = '12.8') => moduleCacheKey(m.source, arch, v, kernelCompileOptions(arch));
    const keys = KERNEL_MODULES.map((m) => key(m));
    for (const k of keys) assert.match(k, /^[0-9a-f]{64}$/);
    assert.equal(new Set(keys).size, keys.length, 'keys differ per module');
    assert.deepEqual(KERNEL_MODULES.map((m) => key(m)), keys, 'stable');
    const m0 = KERNEL_MODULES[0];
    // sha256(source, arch, NVRTC version, options), NUL-separated
    assert.equal(moduleCacheKey('src', 'sm_90', '12.8', ['--gpu-architecture=sm_90']),
      createHash('sha256').update(['src', 'sm_90', '12.8', '--gpu-architecture=sm_90'].join('\0')).digest('hex'));
    assert.notEqual(key(m0, 'sm_80'), key(m0));
    assert.notEqual(key(m0, 'sm_90', '12.9'), key(m0));
    assert.notEqual(moduleCacheKey(m0.source, 'sm_90', '12.8', ['--gpu-architecture=sm_90', '-lineinfo']), key(m0));
    assert.notEqual(key({ name: m0.name, source: m0.source + ' ' }), key(m0));
  });
});

interface FakeNvrtc extends Nvrtc {
  /** module names in the order their compiles started (async) or ran (sync) */
  started: string[];
  finished: string[];
  maxInFlight: number;
}

/**
 * An NVRTC whose compile sleeps `ms` in native code (libc usleep, through koffi: `.async` blocks a
 * libuv pool thread exactly as nvrtcCompileProgram does), producing the module's name as its
 * "cubin"; modules in `fail` fail to compile with a log naming them.
 */
function fakeNvrtc(ms: number, fail: readonly string[] = []): FakeNvrtc {
  const programs = new Map<number, string>(); // handle -> module name
  let next = 1;
  let inFlight = 0;
  const rcOf = (h: number) => (fail.includes(programs.get(h)!) ? 6 : 0);
  const logOf = (h: number) => (fail.includes(programs.get(h)!)
    ? `llmts_${programs.get(h)}.cu(12): error: identifier "nope" is undefined\n1 error detected` : '');
  const compile = (h: number, _n: number, options: string[]) => {
    assert.deepEqual(options, kernelCompileOptions('sm_90'));
    fake.started.push(programs.get(h)!);
    usleep(ms * 1000);
    fake.finished.push(programs.get(h)!);
    return rcOf(h);
  };
  const fake: FakeNvrtc = {
    path: 'fake', started: [], finished: [], maxInFlight: 0,
    nvrtcVersion: (a, b) => { a[0] = 12; b[0] = 8; return 0; },
    nvrtcCreateProgram: (out, _src, name) => {
      const h = next++;
      programs.set(h, /^llmts_(\w+)\.cu$/.exec(name)![1]!);
      out[0] = BigInt(h);
      return 0;
    },
    nvrtcCompileProgram: Object.assign(compile, {
      async: (h: number, _n: number, options: string[], cb: (err: unknown, rc: number) => void) => {
        assert.deepEqual(options, kernelCompileOptions('sm_90'));
        fake.started.push(programs.get(h)!);
        fake.maxInFlight = Math.max(fake.maxInFlight, ++inFlight);
        usleep.async(ms * 1000, (err: unknown) => {
          inFlight--;
          fake.finished.push(programs.get(h)!);
          cb(err, rcOf(h));
        });
      },
    }),
    nvrtcGetProgramLogSize: (h, out) => { out[0] = BigInt(Buffer.byteLength(logOf(h)) + 1); return 0; },
    nvrtcGetProgramLog: (h, buf) => { buf.set(Buffer.from(`${logOf(h)}\0`)); return 0; },
    nvrtcGetCUBINSize: (h, out) => { out[0] = BigInt(Buffer.byteLength(programs.get(h)!)); return 0; },
    nvrtcGetCUBIN: (h, buf) => { buf.set(Buffer.from(programs.get(h)!)); return 0; },
    nvrtcDestroyProgram: (p) => { programs.delete(Number(p[0])); return 0; },
    nvrtcGetErrorString: (rc) => (rc === 6 ? 'NVRTC_ERROR_COMPILATION' : `nvrtc error ${rc}`),
  };
  return fake;
}

/** Ticks of a 5 ms interval while `p` settles, and how long that took. */
async function ticksDuring<T>(p: Promise<T>): Promise<{ value: T; ticks: number; ms: number }> {
  let ticks = 0;
  const t0 = performance.now();
  const iv = setInterval(() => ticks++, 5);
  try {
    const value = await p;
    return { value, ticks, ms: performance.now() - t0 };
  } finally {
    clearInterval(iv);
  }
}

describe('compiling a module (nvrtc.ts)', () => {
  test('koffi gives asynchronous calls the stack NVRTC needs, so compiles run off the main thread', () => {
    assert.ok(koffi.config().async_stack_size! >= NVRTC_ASYNC_STACK_BYTES);
    assert.equal(nvrtcCompileMode(), 'async');
    assert.equal(nvrtcJobs(), Math.max(1, (Number(process.env.UV_THREADPOOL_SIZE) || 4) - 1));
  });

  test('the compile runs on the thread pool: compileModule returns at once and the event loop keeps ticking', async () => {
    const nv = fakeNvrtc(300);
    const t0 = performance.now();
    const p = compileModule({ name: 'solo', source: 'a' }, 'sm_90', { nvrtc: nv, cacheDir: freshDir() });
    assert.ok(performance.now() - t0 < 150, `compileModule blocked for ${(performance.now() - t0).toFixed(0)} ms`);
    const { value, ticks, ms } = await ticksDuring(p);
    assert.ok(ms >= 250, `the fake compile takes 300 ms, took ${ms.toFixed(0)}`);
    assert.ok(ticks >= 10, `only ${ticks} ticks of a 5 ms interval in ${ms.toFixed(0)} ms`);
    assert.equal(value.source, 'nvrtc');
    assert.equal(value.name, 'solo');
    assert.ok(value.compileMs >= 250);
    assert.equal(Buffer.from(value.cubin).toString(), 'solo');
  });

  test('(control) with async: false the same compile blocks the caller', async () => {
    const nv = fakeNvrtc(200);
    const t0 = performance.now();
    const p = compileModule({ name: 'blocking', source: 'b' }, 'sm_90', { nvrtc: nv, cacheDir: freshDir(), async: false });
    assert.ok(performance.now() - t0 >= 180, 'a synchronous compile blocks the call');
    assert.equal((await p).source, 'nvrtc');
  });

  test('modules compile concurrently, at most nvrtcJobs() at once', async () => {
    const nv = fakeNvrtc(150);
    const dir = freshDir();
    const mods = ['m0', 'm1', 'm2', 'm3', 'm4'].map((name) => ({ name, source: `// ${name}` }));
    const all = Promise.all(mods.map((m) => compileModule(m, 'sm_90', { nvrtc: nv, cacheDir: dir })));
    const jobs = Math.min(nvrtcJobs(), mods.length);
    assert.equal(nv.started.length, jobs, 'the first jobs start at once');
    assert.equal(nv.finished.length, 0);
    const { value } = await ticksDuring(all);
    assert.deepEqual(value.map((c) => c.name), mods.map((m) => m.name));
    assert.deepEqual(nv.started, mods.map((m) => m.name), 'started in list order');
    assert.equal(nv.maxInFlight, jobs);
  });

  test('disk cache: <module>-<key>.cubin written atomically, read back by the next process; memoized in-process', async () => {
    const dir = freshDir();
    const nv = fakeNvrtc(10);
    const mod = { name: 'cached', source: 'source of cached' };
    const [a, b] = await Promise.all([compileModule(mod, 'sm_90', { nvrtc: nv, cacheDir: dir }),
      compileModule(mod, 'sm_90', { nvrtc: nv, cacheDir: dir })]);
    assert.equal(a, b, 'one compile for concurrent callers');
    assert.deepEqual(nv.started, ['cached']);
    const key = moduleCacheKey(mod.source, 'sm_90', '12.8', kernelCompileOptions('sm_90'));
    assert.equal(a.cachePath, join(dir, `cached-${key}.cubin`));
    assert.deepEqual(readdirSync(dir), [`cached-${key}.cubin`], 'no temporary file left');
    assert.equal(readFileSync(a.cachePath).toString(), 'cached');

    forgetCompiledModules(); // as a new process
    const c = await compileModule(mod, 'sm_90', { nvrtc: nv, cacheDir: dir });
    assert.equal(c.source, 'cache');
    assert.equal(c.compileMs, 0);
    assert.equal(Buffer.from(c.cubin).toString(), 'cached');
    assert.deepEqual(nv.started, ['cached'], 'no second compile');
    // another module, arch or version is another file
    await compileModule({ name: 'other', source: 'source of other' }, 'sm_90', { nvrtc: nv, cacheDir: dir });
    assert.equal(readdirSync(dir).length, 2);
  });

  test('an unwritable cache is no error', async () => {
    const file = join(tmp, 'not-a-dir');
    writeFileSync(file, 'x');
    const nv = fakeNvrtc(5);
    const c = await compileModule({ name: 'nocache', source: 'n' }, 'sm_90', { nvrtc: nv, cacheDir: join(file, 'cuda') });
    assert.equal(c.source, 'nvrtc');
    assert.equal(Buffer.from(c.cubin).toString(), 'nocache');
  });

  test('a failed compile rejects with NVRTC\'s error and log, and is retried by the next caller', async () => {
    const dir = freshDir();
    const nv = fakeNvrtc(5, ['broken']);
    const mod = { name: 'broken', source: 'x' };
    await assert.rejects(compileModule(mod, 'sm_90', { nvrtc: nv, cacheDir: dir }),
      /NVRTC 12\.8 failed: NVRTC_ERROR_COMPILATION\nllmts_broken\.cu\(12\): error: identifier "nope" is undefined/);
    await assert.rejects(compileModule(mod, 'sm_90', { nvrtc: nv, cacheDir: dir }));
    assert.deepEqual(nv.started, ['broken', 'broken']);
    assert.ok(!existsSync(dir) || readdirSync(dir).length === 0, 'nothing cached');
  });
});

interface FakeDevice {
  driver: Driver;
  log: string[];
  /** function handles passed to cuLaunchKernel */
  launched: number[];
  /** module name of a function handle */
  moduleOf(f: number): string;
}

/** A driver with one sm_90 device; a "cubin" is its module's name (as the fake compiles make them). */
function fakeDevice(): FakeDevice {
  const log: string[] = [];
  const launched: number[] = [];
  const modules = new Map<number, KernelModule>();
  let nextModule = 1;
  let nextAddr = 1 << 30;
  const ok = 0;
  const driver = {
    path: 'fake',
    cuInit: () => ok,
    cuDriverGetVersion: (o: Int32Array) => { o[0] = 12080; return ok; },
    cuDeviceGetCount: (o: Int32Array) => { o[0] = 1; return ok; },
    cuDeviceGet: (o: Int32Array, i: number) => { o[0] = i; return ok; },
    cuDeviceGetAttribute: (o: Int32Array, a: number) => { o[0] = a === 75 ? 9 : a === 76 ? 0 : 132; return ok; },
    cuDeviceGetName: (buf: Uint8Array) => { buf.set(Buffer.from('Fake GPU\0')); return ok; },
    cuDevicePrimaryCtxRetain: (o: BigUint64Array) => { o[0] = 77n; log.push('ctx retain'); return ok; },
    cuDevicePrimaryCtxRelease_v2: () => { log.push('ctx release'); return ok; },
    cuCtxSetCurrent: () => ok,
    cuStreamCreate: (o: BigUint64Array) => { o[0] = 99n; return ok; },
    cuStreamDestroy_v2: () => { log.push('stream destroy'); return ok; },
    cuEventDestroy_v2: () => ok,
    cuMemHostAlloc: (o: BigUint64Array, bytes: number) => { o[0] = BigInt(malloc(bytes)); return ok; },
    cuMemFreeHost: (p: number) => { free(p); return ok; },
    cuModuleLoadData: (o: BigUint64Array, image: Uint8Array) => {
      const name = Buffer.from(image).toString();
      const spec = KERNEL_MODULES.find((m) => m.name === name);
      if (!spec) return 200; // CUDA_ERROR_INVALID_IMAGE
      const h = nextModule++;
      modules.set(h, spec);
      o[0] = BigInt(h);
      log.push(`load ${name}`);
      return ok;
    },
    cuModuleUnload: (h: number) => { log.push(`unload ${modules.get(h)!.name}`); return ok; },
    cuModuleGetFunction: (o: BigUint64Array, h: number, name: string) => {
      const i = (modules.get(h)?.kernels as readonly string[] | undefined)?.indexOf(name) ?? -1;
      if (i < 0) return 500; // CUDA_ERROR_NOT_FOUND
      o[0] = BigInt(h * 1000 + i);
      return ok;
    },
    cuLaunchKernel: (f: number) => { launched.push(f); return ok; },
    cuLaunchKernelEx: (_config: number, f: number) => { launched.push(f); return ok; },
    // enough memory and events for a CudaBackend around the runtime
    cuMemAlloc_v2: (o: BigUint64Array) => { o[0] = BigInt(nextAddr += 1 << 20); return ok; },
    cuMemFree_v2: () => ok,
    cuMemGetInfo_v2: (f: BigUint64Array, t: BigUint64Array) => { f[0] = 1n << 36n; t[0] = 1n << 37n; return ok; },
    cuMemsetD8Async: () => ok,
    cuMemsetD32Async: () => ok,
    cuEventCreate: (o: BigUint64Array) => { o[0] = BigInt(nextAddr += 1); return ok; },
    cuEventRecord: () => ok,
    cuEventQuery: () => ok,
    cuStreamSynchronize: () => ok,
    cuMemcpyHtoDAsync_v2: () => { log.push('upload'); return ok; },
    cuMemcpyHtoDAsyncPinned: () => { log.push('weight copy'); return ok; },
    cuMemcpyDtoDAsync_v2: () => ok,
  };
  return {
    driver: driver as unknown as Driver, log, launched,
    moduleOf: (f) => modules.get(Math.floor(f / 1000))!.name,
  };
}

/** A compile that waits for `release(name)` (or rejects with `fail(name, message)`). */
function gatedCompile() {
  const started: string[] = [];
  const gates = new Map<string, { resolve: (c: CompiledModule) => void; reject: (e: Error) => void }>();
  const compile = (m: ModuleSource, arch: string) => {
    assert.equal(arch, 'sm_90');
    started.push(m.name);
    return new Promise<CompiledModule>((resolve, reject) => gates.set(m.name, { resolve, reject }));
  };
  const release = (name: string, source: 'cache' | 'nvrtc' = 'nvrtc') => gates.get(name)!.resolve({
    name, cubin: new Uint8Array(Buffer.from(name)), source, cachePath: `/fake/${name}.cubin`, nvrtcVersion: '12.8',
    compileMs: source === 'cache' ? 0 : 1000,
  });
  const fail = (name: string, message: string) => gates.get(name)!.reject(new Error(message));
  return { compile, started, release, fail };
}

const settled = async (p: Promise<unknown>) => {
  let done = false;
  void p.then(() => { done = true; }, () => { done = true; });
  await new Promise((r) => setImmediate(r));
  return done;
};

describe('CudaRuntime.create (fake driver)', () => {
  test('starts every module before any finishes, stays responsive, and looks kernels up in their own module', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const created = CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile });
    assert.deepEqual(g.started, KERNEL_MODULES.map((m) => m.name), 'every module started before any finished');
    assert.equal(await settled(created), false, 'create waits for the modules');
    // release them one by one from timers: the event loop runs meanwhile
    let ticks = 0;
    const iv = setInterval(() => ticks++, 1);
    for (const m of [...KERNEL_MODULES].reverse()) {
      await new Promise((r) => setTimeout(r, 20));
      g.release(m.name, m.name === 'fused' ? 'cache' : 'nvrtc');
    }
    const rt = await created;
    clearInterval(iv);
    assert.ok(ticks >= 10, `${ticks} ticks`);
    try {
      assert.equal(rt.arch, 'sm_90');
      assert.equal(rt.compileMode, 'async');
      assert.ok(rt.kernelsMs !== undefined && rt.kernelsMs >= 60);
      assert.deepEqual(rt.modules.map((m) => [m.name, m.state, m.compiled?.source]),
        KERNEL_MODULES.map((m) => [m.name, 'loaded', m.name === 'fused' ? 'cache' : 'nvrtc']));
      for (const m of KERNEL_MODULES) {
        for (const k of m.kernels) {
          rt.launch(k, [1, 1, 1], 32, 0, [['i', 1]]);
          assert.equal(dev.moduleOf(dev.launched.at(-1)!), m.name, k);
        }
      }
      assert.equal(rt.launches, KERNEL_NAMES.length);
    } finally {
      rt.close();
    }
    for (const m of KERNEL_MODULES) assert.ok(dev.log.includes(`unload ${m.name}`));
    assert.ok(dev.log.includes('ctx release'));
  });

  test('an error in one module rejects create with that module\'s name and NVRTC\'s log, and releases the device', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const created = CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile });
    g.release('base');
    g.fail('fused', 'compiling for sm_90 with NVRTC 12.8 failed: NVRTC_ERROR_COMPILATION\n' +
      'llmts_fused.cu(40): error: identifier "warp_summ" is undefined');
    await assert.rejects(created, (e: Error) => {
      assert.match(e.message, /kernel module 'fused' \(sm_90\)/);
      assert.match(e.message, /NVRTC_ERROR_COMPILATION\nllmts_fused\.cu\(40\): error: identifier "warp_summ" is undefined/);
      return true;
    });
    assert.ok(dev.log.includes('ctx release') && dev.log.includes('stream destroy'), 'the device is released');
    assert.ok(dev.log.includes('unload base'), 'what loaded is unloaded');
    // modules that finish later load nothing
    for (const m of KERNEL_MODULES) if (m.name !== 'base' && m.name !== 'fused') g.release(m.name);
    await new Promise((r) => setTimeout(r, 5));
    assert.deepEqual(dev.log.filter((l) => l.startsWith('load ')), ['load base']);
  });

  test('with the real NVRTC plumbing (fake NVRTC on the thread pool): create rejects naming the module', async () => {
    const dev = fakeDevice();
    const nv = fakeNvrtc(50, ['attention']);
    const dir = freshDir();
    const compile = (m: ModuleSource, arch: string) => compileModule(m, arch, { nvrtc: nv, cacheDir: dir });
    const { value: err, ticks } = await ticksDuring(CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile }).then(
      () => assert.fail('create resolved'), (e: Error) => e));
    assert.match(err.message, /kernel module 'attention' \(sm_90\): compiling for sm_90 with NVRTC 12\.8 failed/);
    assert.match(err.message, /llmts_attention\.cu\(12\): error: identifier "nope" is undefined/);
    assert.ok(ticks >= 3, `${ticks} ticks`);
    assert.ok(dev.log.includes('ctx release'));
    // and without the failure every module builds and loads through it
    forgetCompiledModules();
    const ok = fakeNvrtc(50);
    const dev2 = fakeDevice();
    const rt = await CudaRuntime.create(CUDA_DEFAULTS, { driver: dev2.driver,
      compile: (m, arch) => compileModule(m, arch, { nvrtc: ok, cacheDir: freshDir() }) });
    try {
      assert.deepEqual(ok.started, KERNEL_MODULES.map((m) => m.name));
      assert.deepEqual(rt.modules.map((m) => m.state), KERNEL_MODULES.map(() => 'loaded'));
      rt.launch('k_convert', [1, 1, 1], 256, 0, []);
      assert.equal(dev2.moduleOf(dev2.launched[0]!), 'base');
    } finally {
      rt.close();
    }
  });

  test('background: create resolves while modules compile; launch waits for ready(); close during a compile', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const rt = await CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile }, { background: true });
    assert.deepEqual(rt.modules.map((m) => m.state), KERNEL_MODULES.map(() => 'compiling'));
    assert.throws(() => rt.launch('k_convert', [1, 1, 1], 256, 0, []),
      /kernel k_convert is not loaded yet \(module 'base' is compiling\)/);
    const base = rt.moduleReady('k_convert');
    g.release('base');
    await base;
    rt.launch('k_convert', [1, 1, 1], 256, 0, []);
    assert.equal(await settled(rt.ready()), false);
    assert.equal(rt.kernelsMs, undefined);
    for (const m of KERNEL_MODULES) if (m.name !== 'base' && m.name !== 'attention') g.release(m.name);
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(rt.modules.map((m) => m.state), KERNEL_MODULES.map((m) => (m.name === 'attention' ? 'compiling' : 'loaded')));
    rt.close(); // attention still compiling
    g.release('attention');
    await assert.rejects(rt.ready(), /kernel module 'attention'.*closed while its kernels were compiling/);
    assert.ok(!dev.log.includes('load attention'));
  });

  test('the backend\'s describe() line: per module NVRTC ms or cache, the total, while building and after', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const rt = await CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile }, { background: true });
    const backend = new CudaBackend(rt, new DevicePool(rt), null, 'simple (forced)', CUDA_DEFAULTS);
    try {
      g.release('base');
      await rt.moduleReady('k_convert');
      const modules = (f: (name: string) => string) => KERNEL_MODULES.map((m) => `${m.name} ${f(m.name)}`).join(', ');
      assert.equal(backend.describe(), 'cuda: Fake GPU (sm_90, 132 SMs), driver 12080, NVRTC 12.8 ' +
        `(kernels building: ${modules((n) => (n === 'base' ? '1000 ms' : 'compiling'))}), gemm simple (forced)`);
      assert.equal(backend.info.kernelCompileMs, undefined);
      for (const m of KERNEL_MODULES) if (m.name !== 'base') g.release(m.name, m.name === 'fused' ? 'cache' : 'nvrtc');
      await backend.ready();
      const line = backend.describe();
      const want = `: ${modules((n) => (n === 'fused' ? 'cache' : '1000 ms'))}; NVRTC async), gemm simple (forced)`;
      assert.ok(/\(kernels \d+ ms: /.test(line) && line.endsWith(want), line);
      assert.ok(!line.includes('\n'));
      const info = backend.info;
      assert.equal(info.kernels, 'nvrtc');
      assert.equal(typeof info.kernelCompileMs, 'number');
      assert.deepEqual(info.kernelModules.map((m) => [m.name, m.kernels, m.cachePath]),
        KERNEL_MODULES.map((m) => [m.name, m.name === 'fused' ? 'cache' : 'nvrtc', `/fake/${m.name}.cubin`]));
    } finally {
      rt.close();
    }
    // every module from the cache
    const g2 = gatedCompile();
    const rt2 = await CudaRuntime.create(CUDA_DEFAULTS, { driver: fakeDevice().driver, compile: g2.compile }, { background: true });
    for (const m of KERNEL_MODULES) g2.release(m.name, 'cache');
    await rt2.ready();
    const b2 = new CudaBackend(rt2, new DevicePool(rt2), null, 'simple (forced)', CUDA_DEFAULTS);
    try {
      assert.match(b2.describe(), new RegExp(`\\(kernels \\d+ ms: ${KERNEL_MODULES.length} modules from cache\\)`));
      assert.equal(b2.info.kernels, 'cache');
    } finally {
      rt2.close();
    }
  });

  test('background: the demo model\'s weights load while the kernels compile; loadModel awaits ready()', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const rt = await CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile }, { background: true });
    const backend = new CudaBackend(rt, new DevicePool(rt), null, 'simple (forced)', CUDA_DEFAULTS);
    try {
      const loading = loadModel(backend, join(ROOT, 'models/demo'), { onProgress: () => {} });
      // f32 conversions (norm weights) wait for the base module; copies go on meanwhile
      while (!dev.log.includes('weight copy')) await new Promise((r) => setTimeout(r, 1));
      assert.equal(await settled(loading), false);
      assert.equal(dev.launched.length, 0, 'no kernel before its module is loaded');
      g.release('base');
      for (let i = 0; i < 200 && dev.launched.length === 0; i++) await new Promise((r) => setTimeout(r, 1));
      assert.ok(dev.launched.length > 0 && dev.launched.every((f) => dev.moduleOf(f) === 'base'), 'conversions ran once base loaded');
      // however long the weights take, loadModel waits for the other modules
      for (let i = 0; i < 20; i++) await new Promise((r) => setTimeout(r, 1));
      assert.equal(await settled(loading), false);
      for (const m of KERNEL_MODULES) if (m.name !== 'base') g.release(m.name);
      const loaded = await loading;
      assert.ok(loaded.config.numLayers > 0);
      assert.deepEqual(rt.modules.map((m) => m.state), KERNEL_MODULES.map(() => 'loaded'));
    } finally {
      rt.close();
    }
  });

  test('background: a failed module stops weight loading early', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const rt = await CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile }, { background: true });
    const backend = new CudaBackend(rt, new DevicePool(rt), null, 'simple (forced)', CUDA_DEFAULTS);
    try {
      g.fail('attention', 'compiling for sm_90 with NVRTC 12.8 failed: NVRTC_ERROR_COMPILATION\nbroken');
      await assert.rejects(backend.ready(), /kernel module 'attention'/);
      await assert.rejects(loadModel(backend, join(ROOT, 'models/demo'), { onProgress: () => {} }),
        /kernel module 'attention' \(sm_90\): compiling for sm_90 with NVRTC 12\.8 failed: NVRTC_ERROR_COMPILATION\nbroken/);
      assert.ok(!dev.log.includes('weight copy'), 'no weight was loaded');
    } finally {
      rt.close();
    }
  });

  test('a module list naming a kernel twice is refused', async () => {
    const dev = fakeDevice();
    const g = gatedCompile();
    const dup = [KERNEL_MODULES[0], { name: 'again', source: KERNEL_MODULES[0].source, kernels: [KERNEL_MODULES[0].kernels[0]] }];
    await assert.rejects(CudaRuntime.create(CUDA_DEFAULTS, { driver: dev.driver, compile: g.compile, modules: dup }),
      /is in modules attention and again/);
    assert.deepEqual(g.started, [], 'nothing compiled');
  });
});

// The real NVRTC needs no GPU: where libnvrtc is installed, compile every module for sm_90 from an
// empty cache (prelude enough for each module; NVRTC on koffi's asynchronous stack).
let realNvrtc: Nvrtc | null = null;
try {
  realNvrtc = loadNvrtc();
} catch {
  // not installed here
}
test('every module compiles with the real NVRTC, concurrently and off the main thread', { skip: realNvrtc ? false : 'no libnvrtc' },
  async () => {
    const dir = freshDir();
    const t0 = performance.now();
    const all = Promise.all(KERNEL_MODULES.map((m) => compileModule(m, 'sm_90', { nvrtc: realNvrtc!, cacheDir: dir })));
    const blocked = performance.now() - t0;
    const { value, ticks, ms } = await ticksDuring(all);
    console.log(`# NVRTC ${value[0]!.nvrtcVersion}: ${value.map((c) => `${c.name} ${c.compileMs.toFixed(0)} ms`).join(', ')}; ` +
      `${ms.toFixed(0)} ms in all, ${ticks} ticks of 5 ms, the call blocked ${blocked.toFixed(0)} ms`);
    for (const c of value) {
      assert.equal(c.source, 'nvrtc');
      assert.ok(c.cubin.length > 1000);
      assert.equal(Buffer.from(c.cubin.subarray(0, 4)).toString('latin1'), '\x7fELF', `${c.name}: a cubin is an ELF file`);
    }
    assert.ok(ticks >= ms / 50, `the event loop ticked ${ticks} times in ${ms.toFixed(0)} ms`);
  });
