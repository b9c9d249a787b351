// One CUDA device as the backend sees it: its primary context, one stream that every op is
// enqueued on, the kernel modules, a reusable kernel-parameter block, events, pinned host memory,
// and waits that never block the Node event loop (events are polled, not synchronized).
//
// Every driver call is made on the Node main thread, where the primary context is current. Kernel
// modules (kernels.ts kernelModules) compile concurrently off the main thread (nvrtc.ts) from the
// moment `create` knows the architecture; each is loaded (cuModuleLoadData, main thread) as soon as
// its cubin is there. `create` resolves once all are loaded, or at once with `background`: then
// `ready()` / `moduleReady(kernel)` must resolve before a kernel of an unloaded module is launched
// (launch throws otherwise).
import koffi from 'koffi';

import {
  check, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, CUDA_ERROR_NOT_READY,
  CudaUnavailableError, describeCuResult, type Driver, loadDriver, loadNvrtc, num, out64, traceSlowCalls,
} from './cuda-lib.ts';
import type { CudaSettings } from './cuda-settings.ts';
import { kernelModules, type KernelModule, type KernelName } from './kernels.ts';
import { type CompiledModule, type CompileModule, compileModule, nvrtcCompileMode } from './nvrtc.ts';
import { GraphProfiler } from './graph-profiler.ts';
import { KernelProfiler } from './profiler.ts';
import { LAUNCH_CONFIG_BYTES, PDL_KERNELS, pdlEnabled, writePdlLaunchConfig } from './pdl.ts';

/** CU_STREAM_CAPTURE_MODE_RELAXED: cuMemAlloc and event queries stay legal while capturing */
const CU_STREAM_CAPTURE_MODE_RELAXED = 2;
/** CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: allowDynamicShared's opt-in past 48 KiB */
const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
/** CUDA_ERROR_NOT_FOUND: cuModuleGetGlobal's answer for a name the module does not define */
const CUDA_ERROR_NOT_FOUND = 500;

/** A kernel argument: device pointer / 64-bit int ('p'), 32-bit int ('i'), f32 ('f'). */
export type KernelArg = ['p' | 'i' | 'f', number];

const MAX_ARGS = 64;
/** how long `wait` polls on every event-loop turn before it backs off to 1 ms timers */
const WAIT_SPIN_MS = 50;

/** Replacements for the driver and the compiler (tests of the host-side plumbing). */
export interface RuntimeDeps {
  driver?: Driver;
  compile?: CompileModule;
  /** default kernelModules(settings) */
  modules?: readonly KernelModule[];
}

/** What the runtime takes of the backend's settings: its own group, and the kernel sources' inputs. */
export type RuntimeSettings = Pick<CudaSettings, 'runtime' | 'kernels' | 'attention'> & Partial<Pick<CudaSettings, 'batchInvariant'>>;

export interface RuntimeOptions {
  /** resolve `create` before the kernel modules are loaded (await `ready()` before launching) */
  background?: boolean;
}

/** One kernel module's state (the backend's describe() reports it). */
export interface KernelModuleStatus {
  name: string;
  state: 'compiling' | 'loaded' | 'failed';
  /** set once compiled or read from the cache */
  compiled?: CompiledModule;
  /** ms from the start of the kernel build until the module was loaded */
  readyMs?: number;
  error?: Error;
}

interface ModuleSlot extends KernelModuleStatus {
  spec: KernelModule;
  /** driver handle once loaded, else 0 */
  handle: number;
  loaded: Promise<void>;
}

export interface PinnedBuffer {
  addr: number;
  bytes: number;
  /** the pinned memory itself (no copy) */
  view: Uint8Array;
}

export class CudaRuntime {
  readonly d: Driver;
  readonly deviceName: string;
  readonly arch: string;
  readonly smCount: number;
  readonly driverVersion: number;
  readonly stream: number;
  /** 'async' (NVRTC off the main thread) or 'sync (why)' (nvrtc.ts nvrtcCompileMode) */
  readonly compileMode: string;
  /** ms the whole kernel build took, from its start until every module was loaded (set then) */
  kernelsMs: number | undefined = undefined;
  /** kernel launches so far (a tracked number: small kernels are launch-bound) */
  launches = 0;
  /** allowDynamicShared's limits so far */
  private readonly dynamicSharedAllowed = new Map<KernelName, number>();
  /** graph launches so far (the profiler window counts them) */
  private graphLaunches = 0;
  /**
   * CudaRuntimeSettings.profilerGraphs: graph launches FROM .. FROM+COUNT-1 run between
   * cuProfilerStart and cuProfilerStop, so that Nsight Compute started with --profile-from-start off
   * measures those replays' kernels and nothing else (the GEMM tuner's timings, prefill, warm-up).
   */
  private readonly profilerWindow: CudaSettings['runtime']['profilerGraphs'];
  /** where the kernel modules' cubins are cached (CudaRuntimeSettings.cacheDir) */
  readonly cacheDir: string;
  /** set while kernels are being timed (startProfile / stopProfile) */
  profiler: KernelProfiler | null = null;
  /**
   * CudaRuntimeSettings.graphProfile: brackets every call captured into a graph with event nodes
   * (graph-profiler.ts; profiled replays run slower)
   */
  readonly graphProfiler: GraphProfiler | null;
  private readonly ctx: number;
  private readonly dev: number;
  private readonly slots: ModuleSlot[] = [];
  /** kernel name -> its module */
  private readonly slotOf = new Map<string, ModuleSlot>();
  /** kernel name -> function handle (filled as modules load) */
  private readonly fns = new Map<string, number>();
  private readonly allLoaded: Promise<void>;
  private readonly params: PinnedBuffer;
  /** host memory for cuLaunchKernelEx's CUlaunchConfig (pdl.ts) */
  private readonly launchConfig: PinnedBuffer;
  private readonly launchConfigView: DataView;
  /** launches PDL_KERNELS with programmatic dependent launch (pdl.ts) */
  readonly pdl: boolean;
  private readonly paramView: DataView;
  private readonly idleEvents: number[] = [];
  private closed = false;

  /**
   * Opens device `settings.runtime.device` and builds the kernel modules as `settings` makes them
   * (all started at once; see nvrtc.ts for how many compile at a time). Resolves once every module
   * is loaded (rejects, naming the module, with NVRTC's log, when one fails; the device is then
   * released), or at once with `background`.
   */
  static async create(settings: RuntimeSettings, deps: RuntimeDeps = {}, options: RuntimeOptions = {}): Promise<CudaRuntime> {
    const rt = new CudaRuntime(settings, deps);
    if (!options.background) {
      try {
        await rt.ready();
      } catch (e) {
        rt.close();
        throw e;
      }
    }
    return rt;
  }

  /** the device ordinal */
  readonly ordinal: number;

  private constructor(settings: RuntimeSettings, deps: RuntimeDeps) {
    const { device: ordinal, slowCallMs, cacheDir } = settings.runtime;
    this.ordinal = ordinal;
    this.cacheDir = cacheDir;
    this.profilerWindow = settings.runtime.profilerGraphs;
    const d = (this.d = traceSlowCalls(deps.driver ?? loadDriver(), slowCallMs));
    const rcInit = d.cuInit(0);
    if (rcInit !== 0) throw new CudaUnavailableError(`cuInit failed: ${describeCuResult(rcInit)}`);
    const count = new Int32Array(1);
    check(d.cuDeviceGetCount(count), 'cuDeviceGetCount');
    if (ordinal >= count[0]!) {
      throw new CudaUnavailableError(count[0] === 0 ? 'no CUDA device is visible'
        : `CUDA device ${ordinal} requested but only ${count[0]} visible`);
    }
    const dev = new Int32Array(1);
    check(d.cuDeviceGet(dev, ordinal), 'cuDeviceGet');
    const attr = (a: number) => {
      const v = new Int32Array(1);
      check(d.cuDeviceGetAttribute(v, a, dev[0]!), `cuDeviceGetAttribute(${a})`);
      return v[0]!;
    };
    const major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    const minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    this.arch = `sm_${major}${minor}`;
    // The compiles need only the architecture: they start here, and the rest of the setup (context,
    // stream, pinned memory) runs while they do.
    this.compileMode = deps.compile ? 'async' : nvrtcCompileMode();
    const t0 = performance.now();
    const compile = deps.compile ??
      ((m, arch) => compileModule(m, arch, { nvrtc: traceSlowCalls(loadNvrtc(), slowCallMs), cacheDir }));
    for (const spec of deps.modules ?? kernelModules(settings)) {
      const slot: ModuleSlot = { spec, name: spec.name, state: 'compiling', handle: 0, loaded: Promise.resolve() };
      for (const k of spec.kernels) {
        if (this.slotOf.has(k)) throw new Error(`cuda backend: kernel ${k} is in modules ${this.slotOf.get(k)!.name} and ${spec.name}`);
        this.slotOf.set(k, slot);
      }
      this.slots.push(slot);
    }
    for (const slot of this.slots) {
      const spec = slot.spec;
      let started: Promise<CompiledModule>;
      try {
        started = compile(spec, this.arch);
      } catch (e) {
        started = Promise.reject(e);
      }
      slot.loaded = started.then((compiled) => {
        slot.compiled = compiled;
        if (this.closed) throw new Error('cuda backend: closed while its kernels were compiling');
        this.loadModule(slot);
        slot.state = 'loaded';
        slot.readyMs = performance.now() - t0;
      }).catch((e: unknown) => {
        slot.state = 'failed';
        const msg = (e instanceof Error ? e.message : String(e)).replace(/^cuda backend: /, '');
        slot.error = new Error(`cuda backend: kernel module '${spec.name}' (${this.arch}): ${msg}`, { cause: e });
        throw slot.error;
      });
    }
    this.allLoaded = Promise.all(this.slots.map((s) => s.loaded)).then(() => {
      this.kernelsMs = performance.now() - t0;
    });
    this.allLoaded.catch(() => {}); // reported by ready(), moduleReady() and launch, never unhandled
    const devNo = dev[0]!;
    let retained = false;
    try {
      this.smCount = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
      const nameBuf = new Uint8Array(256);
      check(d.cuDeviceGetName(nameBuf, 256, devNo), 'cuDeviceGetName');
      this.deviceName = Buffer.from(nameBuf).toString('utf8').replace(/\0.*$/s, '');
      const ver = new Int32Array(1);
      d.cuDriverGetVersion(ver);
      this.driverVersion = ver[0]!;

      this.dev = devNo;
      const ctx = out64();
      check(d.cuDevicePrimaryCtxRetain(ctx, devNo), 'cuDevicePrimaryCtxRetain');
      this.ctx = num(ctx);
      retained = true;
      check(d.cuCtxSetCurrent(this.ctx), 'cuCtxSetCurrent');
      const s = out64();
      check(d.cuStreamCreate(s, CU_STREAM_NON_BLOCKING), 'cuStreamCreate');
      this.stream = num(s);

      // Kernel parameters: 64 value slots of 8 bytes, then 64 pointers to them (fixed addresses,
      // so only the values are written per launch; cuLaunchKernel copies them at the call).
      this.params = this.hostAlloc(MAX_ARGS * 16);
      this.paramView = new DataView(this.params.view.buffer, this.params.view.byteOffset, this.params.bytes);
      this.launchConfig = this.hostAlloc(LAUNCH_CONFIG_BYTES);
      this.launchConfigView = new DataView(this.launchConfig.view.buffer, this.launchConfig.view.byteOffset, LAUNCH_CONFIG_BYTES);
      this.graphProfiler = settings.runtime.graphProfile ? new GraphProfiler(this.d, this.stream) : null;
      // a profiled graph has event nodes between its kernels, where programmatic edges would join
      // kernel to kernel: profile without PDL
      this.pdl = pdlEnabled(major, settings.runtime.pdl) && !this.graphProfiler;
      for (let i = 0; i < MAX_ARGS; i++) {
        this.paramView.setBigUint64(MAX_ARGS * 8 + i * 8, BigInt(this.params.addr + i * 8), true);
      }
    } catch (e) {
      this.closed = true; // compiles still running load nothing
      if (retained) d.cuDevicePrimaryCtxRelease_v2(devNo);
      throw e;
    }
  }

  /** Main thread: loads a compiled module into this runtime's context and looks up its kernels. */
  private loadModule(slot: ModuleSlot): void {
    check(this.d.cuCtxSetCurrent(this.ctx), 'cuCtxSetCurrent'); // current already, unless another runtime changed it
    const m = out64();
    check(this.d.cuModuleLoadData(m, slot.compiled!.cubin), `cuModuleLoadData (${slot.name}, ${this.arch} cubin)`);
    slot.handle = num(m);
    for (const name of slot.spec.kernels) {
      const f = out64();
      check(this.d.cuModuleGetFunction(f, slot.handle, name), `cuModuleGetFunction(${name})`);
      this.fns.set(name, num(f));
    }
  }

  /**
   * The device address and size of module `moduleName`'s `__device__` variable `symbol` (loaded
   * modules only), or null where the module has none of that name (a measurement compiled out).
   */
  moduleGlobal(moduleName: string, symbol: string): { addr: number; bytes: number } | null {
    const slot = this.slots.find((s) => s.name === moduleName);
    if (!slot?.handle) throw new Error(`cuda backend: module ${moduleName} is not loaded`);
    const dptr = out64(), bytes = out64();
    const rc = this.d.cuModuleGetGlobal_v2(dptr, bytes, slot.handle, symbol);
    if (rc === CUDA_ERROR_NOT_FOUND) return null;
    check(rc, `cuModuleGetGlobal(${moduleName}, ${symbol})`);
    return { addr: num(dptr), bytes: num(bytes) };
  }

  /** Resolves once every kernel module is loaded; rejects with the first module's failure. */
  ready(): Promise<void> {
    return this.allLoaded;
  }

  /** Resolves once the module defining `kernel` is loaded. */
  moduleReady(kernel: KernelName): Promise<void> {
    return this.slotOf.get(kernel)?.loaded ?? Promise.reject(new Error(`cuda backend: no module defines kernel ${kernel}`));
  }

  /** Throws the first module failure, if any (cheap: loads check it before their work). */
  throwIfKernelsFailed(): void {
    for (const s of this.slots) if (s.error) throw s.error;
  }

  /** Every kernel module, in kernelModules order. */
  get modules(): readonly KernelModuleStatus[] {
    return this.slots;
  }

  /** The function handle of `name`, or a readable error when its module is not loaded. */
  private fn(name: string): number {
    const f = this.fns.get(name);
    if (f !== undefined) return f;
    const slot = this.slotOf.get(name);
    if (!slot) throw new Error(`cuda backend: no module defines kernel ${name}`);
    if (slot.error) throw slot.error;
    throw new Error(`cuda backend: kernel ${name} is not loaded yet (module '${slot.name}' is ${slot.state}); ` +
      'await the backend\'s ready() before running ops');
  }

  /** Enqueues a kernel. Grid dims of 0 enqueue nothing. */
  launch(name: KernelName, grid: [number, number, number], block: number, shmem: number, args: KernelArg[]): void {
    if (grid[0] === 0 || grid[1] === 0 || grid[2] === 0) return;
    if (args.length > MAX_ARGS) throw new Error(`cuda backend: ${name} has too many arguments`);
    const v = this.paramView;
    for (let i = 0; i < args.length; i++) {
      const [type, value] = args[i]!;
      const off = i * 8;
      if (type === 'p') v.setBigUint64(off, BigInt(Math.trunc(value)), true);
      else if (type === 'i') v.setInt32(off, value, true);
      else v.setFloat32(off, value, true);
    }
    const f = this.fns.get(name) ?? this.fn(name); // fn throws: module not loaded (yet)
    const prof = this.capturing ? this.graphProfiler : this.profiler;
    const t0 = prof?.begin();
    const rc = this.pdl && PDL_KERNELS.has(name)
      ? this.d.cuLaunchKernelEx(writePdlLaunchConfig(this.launchConfigView, this.launchConfig.addr, grid, block, shmem,
        this.stream), f, this.params.addr + MAX_ARGS * 8, 0)
      : this.d.cuLaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, shmem, this.stream, this.params.addr + MAX_ARGS * 8, 0);
    check(rc, `launching ${name} (grid ${grid.join('x')}, block ${block}, shared ${shmem} B)`);
    if (t0 !== undefined) prof!.end(name, t0);
    this.launches++;
    this.lastLaunch = name;
  }

  /**
   * The kernel this runtime enqueued last, for choices that depend on what runs just before
   * (gemvMarginAfter); undefined after a graph launch, and set so by callers that enqueue work of
   * their own (cuBLASLt). Other stream work (copies) leaves it as it was: it steers tuning, not results.
   */
  lastLaunch: string | undefined = undefined;

  /** true between beginCapture and endCapture: enqueued work is recorded, not run */
  capturing = false;

  /** Starts recording the stream's work into a graph (relaxed mode: allocations stay legal). */
  beginCapture(): void {
    check(this.d.cuStreamBeginCapture_v2(this.stream, CU_STREAM_CAPTURE_MODE_RELAXED), 'cuStreamBeginCapture');
    this.capturing = true;
    this.graphProfiler?.beginCapture();
  }

  /** Ends recording; returns an instantiated graph, or throws (then nothing is kept) when `abort`. */
  endCapture(abort = false): number {
    this.capturing = false;
    const g = out64();
    const rc = this.d.cuStreamEndCapture(this.stream, g);
    const graph = num(g);
    if (abort || rc !== 0) {
      this.graphProfiler?.endCapture(0);
      if (graph) this.d.cuGraphDestroy(graph);
      check(rc, 'cuStreamEndCapture');
      return 0;
    }
    const exec = out64();
    try {
      check(this.d.cuGraphInstantiateWithFlags(exec, graph, 0), 'cuGraphInstantiate');
    } catch (e) {
      this.graphProfiler?.endCapture(0);
      throw e;
    } finally {
      this.d.cuGraphDestroy(graph);
    }
    this.graphProfiler?.endCapture(num(exec));
    return num(exec);
  }

  /** The NVRTC version the kernel modules were built with ('' before any module is), e.g. '13.0'. */
  nvrtcVersion(): string {
    return this.modules.find((m) => m.compiled)?.compiled!.nvrtcVersion ?? '';
  }

  /** Enqueues a captured graph (counted as one launch). */
  launchGraph(exec: number): void {
    const t0 = this.profiler?.begin();
    const window = this.profilerWindow;
    const inWindow = window !== null && this.graphLaunches >= window.from && this.graphLaunches < window.from + window.count;
    if (inWindow && this.graphLaunches === window.from) check(this.d.cuProfilerStart(), 'cuProfilerStart');
    check(this.d.cuGraphLaunch(exec, this.stream), 'cuGraphLaunch');
    if (inWindow && this.graphLaunches === window.from + window.count - 1) {
      check(this.d.cuStreamSynchronize(this.stream), 'cuStreamSynchronize');
      check(this.d.cuProfilerStop(), 'cuProfilerStop');
    }
    this.graphLaunches++;
    if (t0 !== undefined) this.profiler!.end('graph replay', t0);
    this.launches++;
    this.lastLaunch = undefined;
  }

  destroyGraph(exec: number): void {
    this.graphProfiler?.destroyGraph(exec);
    this.d.cuGraphExecDestroy(exec);
  }

  /**
   * Lets `name` launch with up to `bytes` of dynamic shared memory: past 48 KiB a kernel must opt in
   * (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES); raised once, never lowered.
   */
  allowDynamicShared(name: KernelName, bytes: number): void {
    if ((this.dynamicSharedAllowed.get(name) ?? 0) >= bytes) return;
    check(this.d.cuFuncSetAttribute(this.fn(name), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
      `cuFuncSetAttribute (${name}: ${bytes} bytes of dynamic shared memory)`);
    this.dynamicSharedAllowed.set(name, bytes);
  }

  /** The driver handle of a kernel (attributes such as dynamic shared memory limits). */
  kernel(name: KernelName): number {
    return this.fn(name);
  }

  /** Pinned (page-locked) host memory: the source / target of truly asynchronous copies. */
  hostAlloc(bytes: number): PinnedBuffer {
    const p = out64();
    check(this.d.cuMemHostAlloc(p, Math.max(bytes, 64), 0), `cuMemHostAlloc(${bytes} bytes)`);
    const addr = num(p);
    return { addr, bytes, view: new Uint8Array(koffi.view(addr, Math.max(bytes, 64)), 0, bytes) };
  }

  hostFree(b: PinnedBuffer): void {
    this.d.cuMemFreeHost(b.addr);
  }

  /** Records an event after everything enqueued so far. */
  record(): number {
    let ev = this.idleEvents.pop();
    if (ev === undefined) {
      const e = out64();
      check(this.d.cuEventCreate(e, CU_EVENT_DISABLE_TIMING), 'cuEventCreate');
      ev = num(e);
    }
    check(this.d.cuEventRecord(ev, this.stream), 'cuEventRecord');
    return ev;
  }

  /** true once the work before `ev` has run; throws on a device error (e.g. an illegal address). */
  done(ev: number): boolean {
    const rc = this.d.cuEventQuery(ev);
    if (rc === 0) return true;
    if (rc === CUDA_ERROR_NOT_READY) return false;
    throw new Error(`cuda backend: the device reported an error: ${describeCuResult(rc)}`);
  }

  /** Resolves once `ev` has completed, polling without blocking the event loop; recycles `ev`. */
  async wait(ev: number): Promise<void> {
    try {
      const t0 = performance.now();
      while (!this.done(ev)) {
        // Immediate polls (I/O still runs between them) for the length of a few decode steps, then
        // 1 ms timers. A timer poll wakes up to 1 ms late: polling a 5 ms decode step that way
        // left the GPU idle ~0.9 ms a step (measured on the H200, Llama-3.1-8B shapes).
        if (performance.now() - t0 < WAIT_SPIN_MS) await new Promise<void>((r) => setImmediate(r));
        else await new Promise<void>((r) => setTimeout(r, 1));
      }
    } finally {
      this.releaseEvent(ev);
    }
  }

  releaseEvent(ev: number): void {
    if (this.closed) this.d.cuEventDestroy_v2(ev);
    else this.idleEvents.push(ev);
  }

  /** Blocks the calling thread until the stream is idle (close and out-of-memory recovery only). */
  syncBlocking(): void {
    check(this.d.cuStreamSynchronize(this.stream), 'cuStreamSynchronize');
  }

  memInfo(): { free: number; total: number } {
    const f = out64();
    const t = out64();
    check(this.d.cuMemGetInfo_v2(f, t), 'cuMemGetInfo');
    return { free: num(f), total: num(t) };
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.profiler?.close();
    this.profiler = null;
    this.graphProfiler?.close();
    for (const ev of this.idleEvents) this.d.cuEventDestroy_v2(ev);
    this.idleEvents.length = 0;
    this.hostFree(this.params);
    this.hostFree(this.launchConfig);
    for (const s of this.slots) if (s.handle) this.d.cuModuleUnload(s.handle);
    this.d.cuStreamDestroy_v2(this.stream);
    this.d.cuDevicePrimaryCtxRelease_v2(this.dev);
  }
}
