// The CUDA backend: validates in TypeScript, enqueues kernels and cuBLASLt GEMMs on one stream.
//
// Dtypes: activations are bf16 (every op's float output); math inside kernels is f32. `upload` of
// a Float32Array keeps f32 (rope tables need f32 angles; every op accepts f32 or bf16 inputs),
// Int32Array stays i32. Weights keep their stored dtype ('keep') or become f32 ('f32'). KV pools
// are whatever `zeros` was asked for (the KV cache asks for activationDtype: bf16).
//
// Ownership rules (Backend contract, as the CPU backend): tensors made by ops and `upload` belong
// to the innermost open scope; `zeros`, `load*` and views never do. Memory is recycled in stream
// order by the DevicePool. Index errors inside kernels are recorded in a device error word that
// `read` / `sync` check, so they reject instead of faulting.
import { open } from 'node:fs/promises';

import type {
  Activation, AttentionParams, Backend, CapturedGraph, DType, MoeRouting, PagedKv, QkNorm, QkvHeads, StepLayout, Tensor,
  WeightSource,
} from '../../contracts/backend.ts';
import { dtypeBytes } from '../../contracts/backend.ts';
import { ScopeStack } from '../common/scopes.ts';
import { check, CudaUnavailableError, loadCublasLt, probeCuda } from './cuda-lib.ts';
import { ACT_CODE, CudaTensor, DT_CODE } from './cuda-tensor.ts';
import { numel } from '../../contracts/backend.ts';
import { DevicePool, sizeClass } from './device-pool.ts';
import { KernelProfiler, type KernelTime } from './profiler.ts';
import { type GemmType, LtGemm, type TuneRecord } from './gemm.ts';
import { ATT_COUNTERS, enqueueAttention } from './attention.ts';
import { ATT_MAX_HEAD_DIM, type KernelName } from './kernels.ts';
import { ROPE_QKV_MAX_HEAD_DIM } from './fused-kernels.ts';
import { type DeviceSampleRow, type PackedSampleRows, sampleResultWidth } from '../../contracts/device-sampling.ts';
import { enqueueSampleRows, planSampleRows } from './sampling.ts';
import { GEMV_THREADS, GEMVP_MAX_SHARED_BYTES, gemvFusedChoice, gemvLaunchGrid } from './gemv-kernels.ts';
import { cudaCacheDir } from './nvrtc.ts';
import { CudaRuntime, type KernelArg, type PinnedBuffer } from './runtime.ts';
import { StagingChunks, uploadFileRange } from './weight-staging.ts';
import { checkShape, describe, expectDim, expectFinite, opError, sameShape, tensorArg } from './validate.ts';

const I32: readonly DType[] = ['i32'];
/** float tensors an op accepts as activations */
const ACTS: readonly DType[] = ['bf16', 'f32'];
const FLOAT: readonly DType[] = ['f32', 'f16', 'bf16'];
const ANY: readonly DType[] = ['f32', 'f16', 'bf16', 'i32'];

/**
 * The most rows the fused GEMV paths take (gluMatmul, addRmsnormMatmul); more run the two ops. On
 * the H200 (8B shapes) the fused norm gained 1.9-3.5% at one row, but at 4 rows the m4 kernel made
 * decode 25% slower (7.02 vs 5.24 ms a step); 2-3 rows are unmeasured.
 */
const FUSED_GEMV_MAX_ROWS = 1;

/** $LLMTS_CUDA_FUSE_GLU=on: gluMatmul fuses the GLU into the decode GEMV (opt-in until measured) */
let FUSE_GLU = process.env.LLMTS_CUDA_FUSE_GLU === 'on';

/** Turns the GLU-into-GEMV fusion of gluMatmul on or off (tests, benchmarks); returns the old setting. */
export function setCudaFuseGlu(on: boolean): boolean {
  const old = FUSE_GLU;
  FUSE_GLU = on;
  return old;
}

/**
 * addRmsnormMatmul fuses the norm into the decode GEMV unless $LLMTS_CUDA_FUSE_NORM=off: B=1 decode
 * of the 8B on the H200 211.8 tok/s fused (mid, input and final norms), 204.7 unfused
 */
let FUSE_NORM = process.env.LLMTS_CUDA_FUSE_NORM !== 'off';

/** Turns the norm-into-GEMV fusion of addRmsnormMatmul on or off (tests, benchmarks); returns the old setting. */
export function setCudaFuseNorm(on: boolean): boolean {
  const old = FUSE_NORM;
  FUSE_NORM = on;
  return old;
}
/** idle pinned read buffers kept for reuse, in bytes */
const READ_PIN_CACHE = 256 * 1024 * 1024;

const ELEMWISE_THREADS = 256;
const MAX_GRID_X = 1 << 20; // grid-stride loops cover the rest
const MAX_GRID_Y = 65535;

let nextBackendId = 1;

export interface CudaBackendOptions {
  /** device ordinal (default $LLMTS_CUDA_DEVICE or 0) */
  device?: number;
  /** 'simple' forces the plain GEMM kernel instead of cuBLASLt (default $LLMTS_CUDA_GEMM or cublaslt) */
  gemm?: 'cublaslt' | 'simple';
  /**
   * 'wait' (default): resolve once every kernel module is compiled and loaded. 'background': resolve
   * while they still compile, so weights can load meanwhile; `ready()` must resolve before any op
   * runs a kernel (loadModel awaits it after the weights; conversions during loading wait for their
   * module themselves).
   */
  kernels?: 'wait' | 'background';
}

/** One kernel module of CudaBackendInfo. */
export interface CudaKernelModuleInfo {
  name: string;
  /** where its cubin came from once loaded; 'compiling' or 'failed' before */
  kernels: 'cache' | 'nvrtc' | 'compiling' | 'failed';
  /** time in NVRTC (0 from the cache) */
  compileMs: number;
  /** ms from the start of the kernel build until the module was loaded */
  readyMs?: number;
  cachePath?: string;
}

export interface CudaBackendInfo {
  device: string;
  arch: string;
  sms: number;
  driverVersion: number;
  /** '' until a module has been compiled or read from the cache */
  nvrtcVersion: string;
  /** 'cache' when every module came from the disk cache */
  kernels: 'cache' | 'nvrtc';
  /**
   * ms from the start of the kernel build until every module was loaded (the modules compile
   * concurrently, so this is about the slowest one, not the sum); undefined while they build
   */
  kernelCompileMs: number | undefined;
  /** the cache directory (one file per module: kernelModules[].cachePath) */
  kernelCachePath: string;
  /** 'async' (NVRTC on the libuv thread pool) or 'sync (why)' */
  kernelCompile: string;
  kernelModules: CudaKernelModuleInfo[];
  /** 'cublaslt <version>' or 'simple (<why>)' */
  gemm: string;
}

const KERNEL_ERRORS: Record<number, (a: number, b: number, c: number) => string> = {
  1: (a, b, c) => `embedding: token id ${b} (token ${a}) is outside the table [0, ${c})`,
  2: (a, b, c) => `writeKv: slot ${b} (token ${a}) is outside the pool's ${c} slots`,
  3: (a, b, c) => `attention: token ${a} belongs to row ${b}, outside the block tables' ${c} rows`,
  4: (a, b, c) => `attention: row ${a} holds no block for position ${b} (block table entry ${c})`,
  5: (a, b, c) => `gatherRows: index ${b} (entry ${a}) is outside [0, ${c})`,
  6: (a, b, c) => `moeFfn: expert ${b} (token ${a}) is outside [0, ${c})`,
};

export class CudaBackend implements Backend {
  readonly name = 'cuda' as const;
  readonly activationDtype: DType = 'bf16';
  /** GEMMs cuBLASLt declined (run by the plain kernel instead) */
  gemmFallbacks = 0;
  private readonly id = nextBackendId++;
  private readonly scopes: ScopeStack<CudaTensor>;
  /** device int[4]: first kernel error (code, a, b, c); 0 = none */
  private readonly errWord: number;
  /** attention.ts ATT_COUNTERS split counters of the tensor-core decode kernel (zero between calls) */
  private readonly attCounters: number;
  private chunks: StagingChunks | null = null;
  private readonly readPins = new Map<number, PinnedBuffer[]>();
  private readPinBytes = 0;
  private closed = false;
  /** captured graphs not yet disposed (close disposes them) */
  private readonly liveGraphs = new Set<CapturedGraph>();
  /** static shared bytes by kernel (sharedFits) */
  private readonly staticShared = new Map<KernelName, number>();

  constructor(private readonly rt: CudaRuntime, private readonly pool: DevicePool,
    private readonly gemm: LtGemm | null, private readonly gemmNote: string) {
    this.scopes = new ScopeStack<CudaTensor>((t) => this.release(t), (t) => t.owner);
    this.errWord = pool.alloc(16, true).addr;
    check(rt.d.cuMemsetD32Async(this.errWord, 0, 4, rt.stream), 'clearing the error word');
    this.attCounters = pool.alloc(ATT_COUNTERS * 4, true).addr;
    check(rt.d.cuMemsetD32Async(this.attCounters, 0, ATT_COUNTERS, rt.stream), 'clearing the attention split counters');
  }

  /** Device, kernel modules (as they are now: they may still be compiling) and GEMM engine. */
  get info(): CudaBackendInfo {
    const rt = this.rt;
    const modules: CudaKernelModuleInfo[] = rt.modules.map((m) => ({
      name: m.name, kernels: m.state === 'loaded' ? m.compiled!.source : m.state,
      compileMs: m.compiled?.compileMs ?? 0, readyMs: m.readyMs, cachePath: m.compiled?.cachePath,
    }));
    return {
      device: rt.deviceName, arch: rt.arch, sms: rt.smCount, driverVersion: rt.driverVersion,
      nvrtcVersion: rt.modules.find((m) => m.compiled)?.compiled!.nvrtcVersion ?? '',
      kernels: modules.every((m) => m.kernels === 'cache') ? 'cache' : 'nvrtc', kernelCompileMs: rt.kernelsMs,
      kernelCachePath: cudaCacheDir(), kernelCompile: rt.compileMode, kernelModules: modules, gemm: this.gemmNote,
    };
  }

  /**
   * One line for logs: device, kernel modules (how long until all were loaded; per module its NVRTC
   * time or 'cache'), GEMM engine.
   */
  describe(): string {
    const i = this.info;
    const mods = i.kernelModules.map((m) =>
      `${m.name} ${m.kernels === 'nvrtc' ? `${m.compileMs.toFixed(0)} ms` : m.kernels}`).join(', ');
    const kernels = i.kernelCompileMs === undefined ? `kernels building: ${mods}`
      : `kernels ${i.kernelCompileMs.toFixed(0)} ms: ${i.kernels === 'cache' ? `${i.kernelModules.length} modules from cache`
        : `${mods}; NVRTC ${i.kernelCompile}`}`;
    return `cuda: ${i.device} (${i.arch}, ${i.sms} SMs), driver ${i.driverVersion}, NVRTC ${i.nvrtcVersion || '?'} ` +
      `(${kernels}), gemm ${i.gemm}`;
  }

  /**
   * Resolves once every kernel module is loaded (at once unless created with kernels: 'background');
   * rejects with the failed module's name and NVRTC's log.
   */
  ready(): Promise<void> {
    return this.rt.ready();
  }

  /** Starts timing every kernel on the device (see profiler.ts); stopProfile reports. */
  /** What the GEMM tuner measured per shape (cuBLASLt's best vs our GEMV kernels), in tuning order. */
  get gemmTuning(): readonly TuneRecord[] {
    this.gemm?.settleTuning(true); // for reports: waits for timings still on the stream
    return this.gemm?.tuned ?? [];
  }

  startProfile(): void {
    this.assertOpen('startProfile');
    this.rt.profiler ??= new KernelProfiler(this.rt.d, this.rt.stream);
  }

  /** Waits for the stream, stops timing, and returns device time per kernel since startProfile. */
  async stopProfile(): Promise<KernelTime[]> {
    await this.sync();
    const p = this.rt.profiler;
    this.rt.profiler = null;
    if (!p) return [];
    const rows = p.collect();
    p.close();
    return rows;
  }

  /**
   * Whether a launch of `name` with `dynamicBytes` of dynamic shared memory stays within the
   * 48 KiB a block may use without opting in (static + dynamic: the fused GEMV kernels' own
   * reduction arrays count too; 6 rows x 4096 of staged x alone is 48 KiB).
   */
  private sharedFits(name: KernelName, dynamicBytes: number): boolean {
    let fixed = this.staticShared.get(name);
    if (fixed === undefined) {
      fixed = this.kernelResources(name).sharedBytes;
      this.staticShared.set(name, fixed);
    }
    return fixed + dynamicBytes <= GEMVP_MAX_SHARED_BYTES;
  }

  /** A kernel's resources as compiled for this device (registers per thread, local and static shared bytes). */
  kernelResources(name: KernelName): { registers: number; localBytes: number; sharedBytes: number } {
    const f = this.rt.kernel(name);
    const v = new Int32Array(1);
    const get = (attr: number) => {
      check(this.rt.d.cuFuncGetAttribute(v, attr, f), 'cuFuncGetAttribute');
      return v[0]!;
    };
    // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1, LOCAL_SIZE_BYTES = 3, NUM_REGS = 4
    return { registers: get(4), localBytes: get(3), sharedBytes: get(1) };
  }

  /** Kernel launches (cuBLASLt calls included) so far. */
  get launches(): number {
    return this.rt.launches;
  }

  // ---- bookkeeping -------------------------------------------------------------------------

  private assertOpen(op: string): void {
    if (this.closed) throw opError(op, 'the backend is closed');
  }

  private assertNotCapturing(op: string): void {
    if (this.rt.capturing) throw opError(op, 'not allowed while a graph is being captured (the body may only enqueue ops)');
  }

  // ---- graphs ------------------------------------------------------------------------------

  captureGraph(body: () => Tensor[]): CapturedGraph {
    const op = 'captureGraph';
    this.assertOpen(op);
    this.assertNotCapturing(op);
    if (this.scopes.depth > 0) throw opError(op, 'call it with no scope open (its outputs belong to the graph)');
    // a capture freezes each GEMM's algorithm: timings still running on the stream decide it first
    this.gemm?.settleTuning(true);
    this.pool.beginArena();
    this.rt.beginCapture();
    let outputs: Tensor[];
    let exec = 0;
    try {
      this.scopes.begin();
      try {
        outputs = body();
        for (const o of outputs) this.arg(op, 'output', o, ANY);
      } catch (e) {
        this.scopes.end();
        throw e;
      }
      this.scopes.end(outputs as CudaTensor[]); // no enclosing scope: the outputs become the graph's
      exec = this.rt.endCapture();
    } catch (e) {
      if (this.rt.capturing) {
        try {
          this.rt.endCapture(true);
        } catch {
          // the capture was already invalid; the body's error is the one to report
        }
      }
      this.pool.freeArena(this.pool.endArena());
      throw e;
    }
    const blocks = this.pool.endArena();
    let disposed = false;
    const rt = this.rt, pool = this.pool;
    const graph: CapturedGraph = {
      outputs,
      replay: () => {
        if (disposed) throw opError('replay', 'the graph was disposed');
        this.assertOpen('replay');
        this.assertNotCapturing('replay');
        rt.launchGraph(exec);
      },
      dispose: () => {
        if (disposed) return;
        disposed = true;
        this.liveGraphs.delete(graph);
        pool.freeArena(blocks); // after the work enqueued so far, its last replay included
        rt.destroyGraph(exec); // the driver keeps a launched graph's resources until it completes
      },
    };
    this.liveGraphs.add(graph);
    return graph;
  }

  copyInto(t: Tensor, data: Float32Array | Int32Array): void {
    const op = 'copyInto';
    this.assertOpen(op);
    this.assertNotCapturing(op);
    const x = this.arg(op, 't', t, ANY);
    const matches = x.dtype === 'i32' ? data instanceof Int32Array : x.dtype === 'f32' && data instanceof Float32Array;
    if (!matches) {
      throw opError(op, `data (${data?.constructor?.name}) does not match ${describe(x)}: i32 takes an Int32Array, f32 a Float32Array`);
    }
    if (data.length !== numel(x.shape)) throw opError(op, `${data.length} values for ${describe(x)}`);
    // From pageable memory the driver stages the bytes before returning: `data` may change after.
    if (x.bytes > 0) check(this.rt.d.cuMemcpyHtoDAsync_v2(x.addr, data, x.bytes, this.rt.stream), 'copyInto');
  }

  copyTensor(t: Tensor, src: Tensor): void {
    const op = 'copyTensor';
    this.assertOpen(op);
    this.assertNotCapturing(op);
    const x = this.arg(op, 't', t, ANY);
    const s = this.arg(op, 'src', src, ANY);
    if (x.dtype !== s.dtype || numel(x.shape) !== numel(s.shape)) {
      throw opError(op, `src ${describe(s)} does not match t ${describe(x)} (same dtype and element count)`);
    }
    // a plain driver copy on the stream: no kernel
    if (x.bytes > 0) check(this.rt.d.cuMemcpyDtoDAsync_v2(x.addr, s.addr, x.bytes, this.rt.stream), op);
  }

  /** A new owning tensor; `scoped`: adopt into the innermost scope. */
  private make(shape: readonly number[], dtype: DType, scoped: boolean, exact = false): CudaTensor {
    const bytes = numel(shape) * dtypeBytes[dtype];
    const { addr } = this.pool.alloc(bytes, exact);
    const t = new CudaTensor(Object.freeze([...shape]), dtype, addr, bytes, null, this.id);
    if (scoped) this.scopes.adopt(t);
    return t;
  }

  private out(shape: readonly number[], dtype: DType = 'bf16'): CudaTensor {
    return this.make(shape, dtype, true);
  }

  private release(t: CudaTensor): void {
    if (t.freed || t.isView) return;
    t.freed = true;
    this.pool.release(t.addr, t.bytes);
  }

  private arg(op: string, name: string, t: Tensor | undefined, dtypes: readonly DType[], rank?: number): CudaTensor {
    return tensorArg(op, name, t, this.id, dtypes, rank);
  }

  /** Live/idle device memory of this backend (tests and diagnostics). */
  memoryStats(): { liveBlocks: number; liveBytes: number; idleBytes: number; driverAllocs: number; scopeDepth: number } {
    return { ...this.pool.stats(), scopeDepth: this.scopes.depth };
  }

  /** Device memory as the driver reports it: free now (other processes included) and total. */
  memoryInfo(): { free: number; total: number } {
    this.assertOpen('memoryInfo');
    return this.rt.memInfo();
  }

  private elementwiseGrid(n: number): [number, number, number] {
    return [Math.min(Math.ceil(n / ELEMWISE_THREADS), MAX_GRID_X), 1, 1];
  }

  /** Enqueues dst = src converted between float dtypes (n elements). */
  private convert(src: number, sdt: DType, dst: number, ddt: DType, n: number): void {
    this.rt.launch('k_convert', this.elementwiseGrid(n), ELEMWISE_THREADS, 0,
      [['p', src], ['i', DT_CODE[sdt]], ['p', dst], ['i', DT_CODE[ddt]], ['p', n]]);
  }

  // ---- memory ------------------------------------------------------------------------------

  upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor {
    this.assertOpen('upload');
    this.assertNotCapturing('upload');
    checkShape('upload', shape);
    if (!(data instanceof Int32Array) && !(data instanceof Float32Array)) {
      throw opError('upload', 'data must be a Float32Array or an Int32Array');
    }
    const dtype: DType = data instanceof Int32Array ? 'i32' : 'f32';
    if (numel(shape) !== data.length) {
      throw opError('upload', `shape [${shape.join(', ')}] has ${numel(shape)} elements but data has ${data.length}`);
    }
    const t = this.make(shape, dtype, true);
    // From pageable memory the driver stages the bytes before returning: `data` may change after.
    if (t.bytes > 0) check(this.rt.d.cuMemcpyHtoDAsync_v2(t.addr, data, t.bytes, this.rt.stream), 'upload copy');
    return t;
  }

  async loadWeight(src: WeightSource, as: 'keep' | 'f32'): Promise<Tensor> {
    const n = src.shape[0] ?? 1;
    return this.loadRows('loadWeight', src, 0, src.shape.length === 0 ? 1 : n, as, src.shape);
  }

  async loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    if (src.shape.length === 0) throw opError('loadWeightRows', `${src.name} is a scalar`);
    const total = src.shape[0]!;
    if (!Number.isSafeInteger(rowStart) || !Number.isSafeInteger(rows) || rowStart < 0 || rows < 0 ||
      rowStart + rows > total) {
      throw opError('loadWeightRows', `rows [${rowStart}, ${rowStart + rows}) outside [0, ${total}) of ${src.name}`);
    }
    return this.loadRows('loadWeightRows', src, rowStart, rows, as, [rows, ...src.shape.slice(1)]);
  }

  private async loadRows(op: string, src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32',
    shape: readonly number[]): Promise<Tensor> {
    this.assertOpen(op);
    this.rt.throwIfKernelsFailed(); // a background build that failed: stop loading now
    this.checkSource(op, src);
    const rowElems = numel(src.shape.slice(1));
    const dtype: DType = as === 'keep' ? src.dtype : 'f32';
    const t = this.make(shape, dtype, false, true);
    try {
      const sz = dtypeBytes[src.dtype];
      await this.loadInto(src, src.offset + rowStart * rowElems * sz, rows * rowElems * sz, t.addr, dtype);
    } catch (e) {
      this.release(t);
      throw e;
    }
    return t;
  }

  async loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    this.assertOpen('loadStacked');
    if (srcs.length === 0) throw opError('loadStacked', 'no sources');
    const first = srcs[0]!;
    for (const s of srcs) {
      if (!sameShape(s.shape, first.shape) || (as === 'keep' && s.dtype !== first.dtype)) {
        throw opError('loadStacked', `${s.name} is ${s.dtype}[${s.shape.join(', ')}] but ${first.name} is ` +
          `${first.dtype}[${first.shape.join(', ')}]`);
      }
    }
    return this.loadParts('loadStacked', srcs, as, [srcs.length, ...first.shape]);
  }

  async loadConcat(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    this.assertOpen('loadConcat');
    if (srcs.length === 0) throw opError('loadConcat', 'no sources');
    const first = srcs[0]!;
    if (first.shape.length === 0) throw opError('loadConcat', `${first.name} is a scalar`);
    for (const s of srcs) {
      if (s.shape.length !== first.shape.length || !sameShape(s.shape.slice(1), first.shape.slice(1)) ||
        (as === 'keep' && s.dtype !== first.dtype)) {
        throw opError('loadConcat', `${s.name} is ${s.dtype}[${s.shape.join(', ')}] but ${first.name} is ` +
          `${first.dtype}[${first.shape.join(', ')}] (only dim 0 may differ)`);
      }
    }
    return this.loadParts('loadConcat', srcs, as, [srcs.reduce((a, s) => a + s.shape[0]!, 0), ...first.shape.slice(1)]);
  }

  /** Loads each source whole, one after another, into one new tensor of `shape`. */
  private async loadParts(op: string, srcs: WeightSource[], as: 'keep' | 'f32', shape: number[]): Promise<Tensor> {
    this.rt.throwIfKernelsFailed();
    for (const s of srcs) this.checkSource(op, s);
    const dtype: DType = as === 'keep' ? srcs[0]!.dtype : 'f32';
    const t = this.make(shape, dtype, false, true);
    try {
      let at = t.addr;
      await Promise.all(srcs.map((s) => {
        const dst = at;
        at += numel(s.shape) * dtypeBytes[dtype];
        return this.loadInto(s, s.offset, numel(s.shape) * dtypeBytes[s.dtype], dst, dtype);
      }));
    } catch (e) {
      this.release(t);
      throw e;
    }
    return t;
  }

  private checkSource(op: string, src: WeightSource): void {
    checkShape(op, src.shape);
    if (!FLOAT.includes(src.dtype)) throw opError(op, `${src.name}: unsupported stored dtype ${src.dtype}`);
    if (!Number.isSafeInteger(src.offset) || src.offset < 0) throw opError(op, `${src.name}: bad offset ${src.offset}`);
  }

  /** Reads `nbytes` of `src` at `fileOffset` to device `dst`, converting to `dtype` on the device. */
  private async loadInto(src: WeightSource, fileOffset: number, nbytes: number, dst: number, dtype: DType): Promise<void> {
    if (dtype === src.dtype) return this.copyFile(src, fileOffset, nbytes, dst);
    const raw = this.pool.alloc(nbytes).addr;
    try {
      await this.copyFile(src, fileOffset, nbytes, raw);
      await this.rt.moduleReady('k_convert'); // kernels may still be compiling (kernels: 'background')
      this.assertOpen('loadWeight');
      this.convert(raw, src.dtype, dst, dtype, nbytes / dtypeBytes[src.dtype]);
    } finally {
      this.pool.release(raw, nbytes); // stream order: the conversion enqueued above runs first
    }
  }

  /** File bytes -> pinned chunks (positioned reads) -> device, copies overlapping the next read. */
  private async copyFile(src: WeightSource, fileOffset: number, nbytes: number, dst: number): Promise<void> {
    if (nbytes === 0) return;
    this.chunks ??= new StagingChunks(this.rt);
    const fh = await open(src.path, 'r');
    try {
      await uploadFileRange(this.rt, this.chunks, fh, fileOffset, nbytes, dst,
        `${src.name} (${src.dtype}[${src.shape.join(', ')}]) from ${src.path}`, () => this.assertOpen('loadWeight'));
    } finally {
      await fh.close();
    }
  }

  zeros(shape: readonly number[], dtype: DType): Tensor {
    this.assertOpen('zeros');
    checkShape('zeros', shape);
    if (!ANY.includes(dtype)) throw opError('zeros', `unknown dtype ${dtype}`);
    const t = this.make(shape, dtype, false);
    if (t.bytes > 0) check(this.rt.d.cuMemsetD8Async(t.addr, 0, t.bytes, this.rt.stream), 'zeros');
    return t;
  }

  reshape(t: Tensor, shape: readonly number[]): Tensor {
    const x = this.arg('reshape', 't', t, ANY);
    checkShape('reshape', shape);
    if (numel(shape) !== numel(x.shape)) {
      throw opError('reshape', `cannot view ${describe(x)} as [${shape.join(', ')}] (element counts differ)`);
    }
    return new CudaTensor(Object.freeze([...shape]), x.dtype, x.addr, x.bytes, x.owner, this.id);
  }

  rowView(t: Tensor, start: number, rows: number): Tensor {
    const x = this.arg('rowView', 't', t, ANY);
    if (x.shape.length === 0) throw opError('rowView', 'a scalar has no rows');
    const total = x.shape[0]!;
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(rows) || start < 0 || rows < 0 || start + rows > total) {
      throw opError('rowView', `rows [${start}, ${start + rows}) outside [0, ${total}) of ${describe(x)}`);
    }
    const rowBytes = numel(x.shape.slice(1)) * dtypeBytes[x.dtype];
    return new CudaTensor(Object.freeze([rows, ...x.shape.slice(1)]), x.dtype, x.addr + start * rowBytes, rows * rowBytes,
      x.owner, this.id);
  }

  private pinnedForRead(bytes: number): PinnedBuffer {
    const cls = sizeClass(bytes);
    const b = this.readPins.get(cls)?.pop();
    if (b) {
      this.readPinBytes -= cls;
      return b;
    }
    return this.rt.hostAlloc(cls);
  }

  private returnPinned(b: PinnedBuffer): void {
    if (this.closed || this.readPinBytes + b.bytes > READ_PIN_CACHE) {
      this.rt.hostFree(b);
      return;
    }
    let list = this.readPins.get(b.bytes);
    if (!list) this.readPins.set(b.bytes, (list = []));
    list.push(b);
    this.readPinBytes += b.bytes;
  }

  /**
   * Enqueues a copy of `bytes` at device `src` (may be 0 bytes) and of the error word into pinned
   * memory, waits for it without blocking the event loop, then rejects on a kernel error.
   * Returns the pinned buffer (caller returns it) holding the data at offset 0.
   */
  private async fetch(src: number, bytes: number, release?: () => void): Promise<PinnedBuffer> {
    const dataBytes = Math.ceil(bytes / 16) * 16;
    const pin = this.pinnedForRead(dataBytes + 16);
    try {
      const d = this.rt.d;
      if (bytes > 0) check(d.cuMemcpyDtoHAsync_v2(pin.addr, src, bytes, this.rt.stream), 'device-to-host copy');
      check(d.cuMemcpyDtoHAsync_v2(pin.addr + dataBytes, this.errWord, 16, this.rt.stream), 'error word copy');
      release?.();
      await this.rt.wait(this.rt.record());
      const err = new Int32Array(pin.view.buffer, pin.view.byteOffset + dataBytes, 4);
      if (err[0] !== 0) {
        const [code, a, b, c] = [err[0]!, err[1]!, err[2]!, err[3]!];
        check(d.cuMemsetD32Async(this.errWord, 0, 4, this.rt.stream), 'clearing the error word');
        const msg = KERNEL_ERRORS[code]?.(a, b, c) ?? `kernel error ${code} (${a}, ${b}, ${c})`;
        throw new Error(`cuda backend: op failed: ${msg}`);
      }
      return pin;
    } catch (e) {
      this.returnPinned(pin);
      throw e;
    }
  }

  async read(t: Tensor): Promise<Float32Array | Int32Array> {
    this.assertOpen('read');
    this.assertNotCapturing('read');
    const x = this.arg('read', 't', t, ANY);
    const n = numel(x.shape);
    let src = x.addr;
    let release: (() => void) | undefined;
    if ((x.dtype === 'bf16' || x.dtype === 'f16') && n > 0) {
      // widen on the device: the host then copies f32 out of pinned memory with no per-element loop
      const scratch = this.pool.alloc(n * 4).addr;
      this.convert(x.addr, x.dtype, scratch, 'f32', n);
      src = scratch;
      release = () => this.pool.release(scratch, n * 4);
    }
    const pin = await this.fetch(src, n * 4, release);
    try {
      const outArr = x.dtype === 'i32' ? new Int32Array(n) : new Float32Array(n);
      outArr.set(x.dtype === 'i32' ? new Int32Array(pin.view.buffer, pin.view.byteOffset, n)
        : new Float32Array(pin.view.buffer, pin.view.byteOffset, n));
      return outArr;
    } finally {
      this.returnPinned(pin);
    }
  }

  /** Bytes per block (dim-0 entry) of `pool`, after checking every block index. */
  private blockBytes(op: string, p: CudaTensor, blocks: readonly number[]): number {
    if (p.shape.length === 0) throw opError(op, 'the pool must have at least one dimension');
    const nb = p.shape[0]!;
    for (const b of blocks) {
      if (!Number.isSafeInteger(b) || b < 0 || b >= nb) throw opError(op, `block ${b} outside [0, ${nb})`);
    }
    return numel(p.shape.slice(1)) * dtypeBytes[p.dtype];
  }

  async readBlocks(pool: Tensor, blocks: readonly number[]): Promise<Uint8Array> {
    const op = 'readBlocks';
    this.assertOpen(op);
    const p = this.arg(op, 'pool', pool, ANY);
    const per = this.blockBytes(op, p, blocks);
    const bytes = blocks.length * per;
    // gather the blocks into one device buffer in stream order (one kernel), then one copy to pinned memory
    const gathered = this.pool.alloc(bytes).addr;
    this.copyBlocks(p.addr, gathered, blocks, per, false);
    const pin = await this.fetch(gathered, bytes, () => this.pool.release(gathered, bytes));
    try {
      return pin.view.slice(0, bytes);
    } finally {
      this.returnPinned(pin);
    }
  }

  writeBlocks(pool: Tensor, blocks: readonly number[], data: Uint8Array): void {
    const op = 'writeBlocks';
    this.assertOpen(op);
    const p = this.arg(op, 'pool', pool, ANY);
    const per = this.blockBytes(op, p, blocks);
    if (new Set(blocks).size !== blocks.length) throw opError(op, 'blocks must be distinct');
    if (data.byteLength !== blocks.length * per) {
      throw opError(op, `${data.byteLength} bytes for ${blocks.length} blocks of ${per} bytes`);
    }
    if (data.byteLength === 0) return;
    // one copy into a device buffer (pageable source: the driver stages it before returning, so
    // `data` may change afterwards), then one kernel scatters the blocks into place
    const staged = this.pool.alloc(data.byteLength).addr;
    check(this.rt.d.cuMemcpyHtoDAsync_v2(staged, data, data.byteLength, this.rt.stream), op);
    this.copyBlocks(staged, p.addr, blocks, per, true);
    this.pool.release(staged, data.byteLength);
  }

  /** Enqueues gather (pool blocks -> packed) or scatter (packed -> pool blocks) of `per`-byte blocks. */
  private copyBlocks(src: number, dst: number, blocks: readonly number[], per: number, scatter: boolean): void {
    if (blocks.length === 0 || per === 0) return;
    const wide = per % 16 === 0 && src % 16 === 0 && dst % 16 === 0;
    const units = per / (wide ? 16 : 2);
    const idxBytes = blocks.length * 4;
    const idx = this.pool.alloc(idxBytes).addr;
    check(this.rt.d.cuMemcpyHtoDAsync_v2(idx, Int32Array.from(blocks), idxBytes, this.rt.stream), 'block indices');
    this.rt.launch('k_copy_blocks', this.elementwiseGrid(blocks.length * units), ELEMWISE_THREADS, 0, [
      ['p', src], ['p', dst], ['p', idx], ['p', blocks.length], ['p', units], ['i', wide ? 1 : 0], ['i', scatter ? 1 : 0]]);
    this.pool.release(idx, idxBytes);
  }

  free(t: Tensor): void {
    const x = this.arg('free', 't', t, ANY);
    if (x.isView) return; // views free nothing
    this.release(x);
  }

  async sync(): Promise<void> {
    if (this.closed) throw opError('sync', 'the backend is closed');
    this.assertNotCapturing('sync');
    this.returnPinned(await this.fetch(0, 0));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    try {
      await this.sync();
    } catch {
      // an op error is no reason to leak: release everything anyway
    }
    this.closed = true;
    try {
      this.rt.syncBlocking();
    } catch {
      // a device error: free what can be freed
    }
    this.gemm?.close();
    for (const g of [...this.liveGraphs]) g.dispose();
    this.pool.releaseAll();
    this.chunks?.close();
    for (const list of this.readPins.values()) for (const b of list) this.rt.hostFree(b);
    this.readPins.clear();
    this.rt.close();
  }

  beginScope(): void {
    this.assertOpen('beginScope');
    this.scopes.begin();
  }

  endScope(keep: readonly Tensor[] = []): void {
    const kept = keep.map((t, i) => this.arg('endScope', `keep[${i}]`, t, ANY));
    this.scopes.end(kept);
  }

  // ---- ops ---------------------------------------------------------------------------------

  embedding(table: Tensor, ids: Tensor, scale: number): Tensor {
    const op = 'embedding';
    this.assertOpen(op);
    const tb = this.arg(op, 'table', table, FLOAT, 2);
    const id = this.arg(op, 'ids', ids, I32, 1);
    expectFinite(op, 'scale', scale);
    const [V, D] = tb.shape as [number, number];
    const T = id.shape[0]!;
    const y = this.out([T, D]);
    this.rt.launch('k_embedding', this.elementwiseGrid(T * D), ELEMWISE_THREADS, 0, [
      ['p', tb.addr], ['i', DT_CODE[tb.dtype]], ['p', id.addr], ['p', y.addr], ['p', T], ['p', V], ['p', D],
      ['f', scale], ['p', this.errWord]]);
    return y;
  }

  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor {
    const op = 'matmul';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS, 2);
    const b = this.arg(op, 'w', w, FLOAT, 2);
    const [M, K] = a.shape as [number, number];
    const [N, Kw] = b.shape as [number, number];
    if (K !== Kw) throw opError(op, `x ${describe(a)} and w ${describe(b)} disagree on K (w is [N, K])`);
    let c: CudaTensor | null = null;
    if (bias !== undefined) {
      c = this.arg(op, 'bias', bias, FLOAT, 1);
      expectDim(op, 'bias length', c.shape[0]!, N, () => `w ${describe(b)}`);
    }
    const y = this.out([M, N]);
    if (M === 0 || N === 0) return y;
    if (K > 0 && this.gemm && this.lt(a, b, c, y, M, N, K)) return y;
    if (K > 0 && this.gemm) this.gemmFallbacks++;
    this.simpleMatmul(a, b, c, y, M, N, K);
    return y;
  }

  private simpleMatmul(a: CudaTensor, b: CudaTensor, c: CudaTensor | null, y: CudaTensor, M: number, N: number,
    K: number): void {
    this.rt.launch('k_matmul_simple', [Math.ceil(N / 8), Math.min(M, MAX_GRID_Y), 1], 256, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', b.addr], ['i', DT_CODE[b.dtype]], ['p', c ? c.addr : 0],
      ['i', c ? DT_CODE[c.dtype] : 0], ['p', y.addr], ['i', M], ['i', N], ['i', K]]);
  }

  /** cuBLASLt path; false when it has no algorithm (nothing enqueued then). */
  private lt(a: CudaTensor, b: CudaTensor, c: CudaTensor | null, y: CudaTensor, M: number, N: number, K: number): boolean {
    const gemm = this.gemm!;
    const wt = b.dtype as GemmType;
    // x must have w's type (cuBLASLt takes A and B of one type): convert when they differ
    let xAddr = a.addr;
    let xScratch = 0;
    if (a.dtype !== wt) {
      xScratch = this.pool.alloc(M * K * dtypeBytes[wt]).addr;
      this.convert(a.addr, a.dtype, xScratch, wt, M * K);
      xAddr = xScratch;
    }
    try {
      if (wt === 'bf16' && c === null) return gemm.run(b.addr, wt, xAddr, wt, y.addr, 'bf16', M, N, K);
      // f32 result, then bias and rounding to bf16 in one pass
      const acc = this.pool.alloc(M * N * 4).addr;
      try {
        if (!gemm.run(b.addr, wt, xAddr, wt, acc, 'f32', M, N, K)) return false;
        this.rt.launch('k_matmul_finish', this.elementwiseGrid(M * N), ELEMWISE_THREADS, 0, [
          ['p', acc], ['p', c ? c.addr : 0], ['i', c ? DT_CODE[c.dtype] : 0], ['p', y.addr], ['p', M], ['p', N]]);
        return true;
      } finally {
        this.pool.release(acc, M * N * 4);
      }
    } finally {
      if (xScratch) this.pool.release(xScratch, M * K * dtypeBytes[wt]);
    }
  }

  rmsnorm(x: Tensor, w: Tensor, eps: number, weightOffset: number): Tensor {
    const op = 'rmsnorm';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS);
    const g = this.arg(op, 'w', w, FLOAT, 1);
    if (a.shape.length === 0) throw opError(op, 'x must have at least one dimension');
    const D = a.shape[a.shape.length - 1]!;
    expectDim(op, 'w length', g.shape[0]!, D, () => `last dim of x ${describe(a)}`);
    expectFinite(op, 'eps', eps);
    expectFinite(op, 'weightOffset', weightOffset);
    const y = this.out(a.shape);
    const rows = D === 0 ? 0 : numel(a.shape) / D;
    this.rt.launch('k_rmsnorm', [Math.min(rows, MAX_GRID_X), 1, 1], 256, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', y.addr], ['p', rows],
      ['i', D], ['f', eps], ['f', weightOffset]]);
    return y;
  }

  add(a: Tensor, b: Tensor, bScale: number): Tensor {
    const op = 'add';
    this.assertOpen(op);
    const x = this.arg(op, 'a', a, ACTS);
    const z = this.arg(op, 'b', b, ACTS);
    if (!sameShape(x.shape, z.shape)) throw opError(op, `shapes differ: a ${describe(x)}, b ${describe(z)}`);
    expectFinite(op, 'bScale', bScale);
    const y = this.out(x.shape);
    const n = numel(x.shape);
    this.rt.launch('k_add', this.elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', x.addr], ['i', DT_CODE[x.dtype]], ['p', z.addr], ['i', DT_CODE[z.dtype]], ['p', y.addr], ['p', n],
      ['f', bScale]]);
    return y;
  }

  scale(x: Tensor, s: number): Tensor {
    const op = 'scale';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS);
    expectFinite(op, 's', s);
    const y = this.out(a.shape);
    const n = numel(a.shape);
    this.rt.launch('k_scale', this.elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', y.addr], ['p', n], ['f', s]]);
    return y;
  }

  glu(gate: Tensor, up: Tensor, act: Activation): Tensor {
    const op = 'glu';
    this.assertOpen(op);
    const g = this.arg(op, 'gate', gate, ACTS);
    const u = this.arg(op, 'up', up, ACTS);
    if (!sameShape(g.shape, u.shape)) throw opError(op, `shapes differ: gate ${describe(g)}, up ${describe(u)}`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const y = this.out(g.shape);
    const n = numel(g.shape);
    this.rt.launch('k_glu', this.elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', u.addr], ['i', DT_CODE[u.dtype]], ['p', y.addr], ['p', n],
      ['i', code]]);
    return y;
  }

  rope(x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number): Tensor {
    const op = 'rope';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS, 3);
    const p = this.arg(op, 'pos', pos, I32, 1);
    const perToken = invFreq.shape.length === 2; // [T, half]: one table per token
    const f = this.arg(op, 'invFreq', invFreq, FLOAT, perToken ? 2 : 1);
    const [T, H, D] = a.shape as [number, number, number];
    expectDim(op, 'pos length', p.shape[0]!, T, () => `x ${describe(a)} is [T, H, headDim]`);
    if (perToken) expectDim(op, 'invFreq rows', f.shape[0]!, T, () => `per-token invFreq ${describe(f)} needs one row per token`);
    const half = f.shape[f.shape.length - 1]!;
    if (2 * half > D) throw opError(op, `invFreq ${describe(f)} rotates ${2 * half} dims but headDim is ${D}`);
    expectFinite(op, 'attentionScaling', attentionScaling);
    const y = this.out(a.shape);
    let fAddr = f.addr;
    let fScratch = 0;
    const fn = numel(f.shape);
    if (f.dtype !== 'f32') {
      fScratch = this.pool.alloc(fn * 4).addr;
      this.convert(f.addr, f.dtype, fScratch, 'f32', fn);
      fAddr = fScratch;
    }
    this.rt.launch('k_rope', [Math.min(T, MAX_GRID_X), 1, 1], 256, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', p.addr], ['p', fAddr], ['p', y.addr], ['i', T], ['i', H], ['i', D],
      ['i', half], ['i', perToken ? half : 0], ['f', attentionScaling]]);
    if (fScratch) this.pool.release(fScratch, fn * 4);
    return y;
  }

  /** Checks a KV pair of pools; returns [numBlocks, blockSize, kvHeads, headDim]. */
  private poolDims(op: string, kv: PagedKv, layout: StepLayout): [number, number, number, number] {
    const kp = this.arg(op, 'kv.k', kv.k, FLOAT, 4);
    const vp = this.arg(op, 'kv.v', kv.v, FLOAT, 4);
    if (!sameShape(kp.shape, vp.shape) || kp.dtype !== vp.dtype) {
      throw opError(op, `kv.k ${describe(kp)} and kv.v ${describe(vp)} differ`);
    }
    const dims = kp.shape as [number, number, number, number];
    expectDim(op, 'layout.blockSize', layout.blockSize, dims[1], () => `pool ${describe(kp)} is [blocks, blockSize, kvHeads, headDim]`);
    return dims;
  }

  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
    const op = 'writeKv';
    this.assertOpen(op);
    const [NB, BS, KVH, D] = this.poolDims(op, kv, layout);
    const kk = this.arg(op, 'k', k, ACTS, 3);
    const vv = this.arg(op, 'v', v, ACTS, 3);
    if (!sameShape(kk.shape, vv.shape)) throw opError(op, `k ${describe(kk)} and v ${describe(vv)} differ`);
    const T = kk.shape[0]!;
    if (kk.shape[1] !== KVH || kk.shape[2] !== D) {
      throw opError(op, `k ${describe(kk)} must be [T, ${KVH}, ${D}] to match the pool [${NB}, ${BS}, ${KVH}, ${D}]`);
    }
    const slots = this.arg(op, 'layout.slots', layout.slots, I32, 1);
    expectDim(op, 'layout.slots length', slots.shape[0]!, T, () => `k ${describe(kk)}`);
    const kp = kv.k as CudaTensor;
    const vp = kv.v as CudaTensor;
    this.rt.launch('k_write_kv', this.elementwiseGrid(T * KVH * D), ELEMWISE_THREADS, 0, [
      ['p', kp.addr], ['p', vp.addr], ['i', DT_CODE[kp.dtype]], ['p', kk.addr], ['i', DT_CODE[kk.dtype]], ['p', vv.addr],
      ['i', DT_CODE[vv.dtype]], ['p', slots.addr], ['p', T], ['p', KVH * D], ['p', NB * BS], ['p', this.errWord]]);
  }

  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor {
    const op = 'attention';
    this.assertOpen(op);
    const [NB, BS, KVH, D] = this.poolDims(op, kv, layout);
    const qq = this.arg(op, 'q', q, ACTS, 3);
    const [T, H, Dq] = qq.shape as [number, number, number];
    expectDim(op, 'q headDim', Dq, D, () => `pool ${describe(kv.k)}`);
    if (KVH === 0 || H % KVH !== 0) throw opError(op, `q heads ${H} is not a multiple of kv heads ${KVH}`);
    if (D > ATT_MAX_HEAD_DIM) throw opError(op, `head dim ${D} is above the ${ATT_MAX_HEAD_DIM} this kernel handles`);
    if (H > MAX_GRID_Y) throw opError(op, `${H} heads is above ${MAX_GRID_Y}`);
    const row = this.arg(op, 'layout.tokenRow', layout.tokenRow, I32, 1);
    const pos = this.arg(op, 'layout.tokenPos', layout.tokenPos, I32, 1);
    const bt = this.arg(op, 'layout.blockTables', layout.blockTables, I32, 2);
    expectDim(op, 'layout.tokenRow length', row.shape[0]!, T, () => `q ${describe(qq)}`);
    expectDim(op, 'layout.tokenPos length', pos.shape[0]!, T, () => `q ${describe(qq)}`);
    const { scale, window, softcap } = params;
    expectFinite(op, 'params.scale', scale);
    if (!Number.isSafeInteger(window) || window < 0) throw opError(op, `params.window must be an integer >= 0, got ${window}`);
    if (!Number.isFinite(softcap) || softcap < 0) throw opError(op, `params.softcap must be >= 0, got ${softcap}`);
    const [R, MBR] = bt.shape as [number, number];
    const y = this.out(qq.shape);
    const kp = kv.k as CudaTensor;
    const vp = kv.v as CudaTensor;
    // split-KV decode + tensor-core prefill for bf16, k_attention otherwise (see attention.ts)
    enqueueAttention(this.rt, this.pool, {
      q: qq.addr, k: kp.addr, v: vp.addr, tokenRow: row.addr, tokenPos: pos.addr, blockTables: bt.addr, out: y.addr,
      err: this.errWord, counters: this.attCounters, T, H, KVH, D, numBlocks: NB, blockSize: BS, R, maxBlocksPerRow: MBR, window, scale, softcap,
      qDtype: qq.dtype, poolDtype: kp.dtype,
    });
    return y;
  }

  addRmsnorm(x: Tensor, r: Tensor, rScale: number, w: Tensor, eps: number, weightOffset: number): { sum: Tensor; normed: Tensor } {
    const op = 'addRmsnorm';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS);
    const b = this.arg(op, 'r', r, ACTS);
    const g = this.arg(op, 'w', w, FLOAT, 1);
    if (!sameShape(a.shape, b.shape)) throw opError(op, `shapes differ: x ${describe(a)}, r ${describe(b)}`);
    if (a.shape.length === 0) throw opError(op, 'x must have at least one dimension');
    const D = a.shape[a.shape.length - 1]!;
    expectDim(op, 'w length', g.shape[0]!, D, () => `last dim of x ${describe(a)}`);
    expectFinite(op, 'rScale', rScale);
    expectFinite(op, 'eps', eps);
    expectFinite(op, 'weightOffset', weightOffset);
    const sum = this.out(a.shape);
    const normed = this.out(a.shape);
    const rows = D === 0 ? 0 : numel(a.shape) / D;
    const threads = Math.min(1024, Math.max(32, Math.ceil(Math.ceil(D / 8) / 32) * 32));
    this.rt.launch('k_add_rmsnorm', [Math.min(rows, MAX_GRID_X), 1, 1], threads, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', b.addr], ['i', DT_CODE[b.dtype]], ['f', rScale], ['p', g.addr],
      ['i', DT_CODE[g.dtype]], ['p', sum.addr], ['p', normed.addr], ['p', rows], ['i', D], ['f', eps], ['f', weightOffset]]);
    return { sum, normed };
  }

  /**
   * addRmsnorm, then matmul(normed, w, bias). Fused (the default), a decode shape (at
   * most FUSED_GEMV_MAX_ROWS rows, bf16 x, r and w, no bias, 16-byte aligned, the normed rows within
   * GEMVP_MAX_SHARED_BYTES, weights within GEMVP_FUSED_MAX_WEIGHT_BYTES) runs one persistent GEMV
   * kernel whose blocks each make the normed rows once into shared memory while their first weights
   * stream (gemv-kernels.ts k_gemvp_norm_*), writing the new residual too: a kernel and the normed
   * copy less (the default; $LLMTS_CUDA_FUSE_NORM=off); otherwise the two ops.
   */
  addRmsnormMatmul(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, w: Tensor,
    bias?: Tensor): { sum: Tensor; y: Tensor } {
    const op = 'addRmsnormMatmul';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS, 2);
    const rr = this.arg(op, 'r', r, ACTS, 2);
    const g = this.arg(op, 'normW', normW, FLOAT, 1);
    const m = this.arg(op, 'w', w, FLOAT, 2);
    const [T, D] = a.shape as [number, number];
    const N = m.shape[0]!;
    if (!sameShape(a.shape, rr.shape)) throw opError(op, `shapes differ: x ${describe(a)}, r ${describe(rr)}`);
    expectDim(op, 'w columns', m.shape[1]!, D, () => `x ${describe(a)}`);
    const gemv = FUSE_NORM && bias === undefined && a.dtype === 'bf16' && rr.dtype === 'bf16' && m.dtype === 'bf16' &&
      g.shape[0] === D && T >= 1 && T <= FUSED_GEMV_MAX_ROWS && N > 0 && a.addr % 16 === 0 && rr.addr % 16 === 0 && m.addr % 16 === 0 &&
      Number.isFinite(rScale) && Number.isFinite(eps) && Number.isFinite(weightOffset) ? gemvFusedChoice(T, N, D) : undefined;
    if (!gemv || !this.sharedFits(gemv.norm, gemv.sharedBytes)) {
      const { sum, normed } = this.addRmsnorm(a, rr, rScale, g, eps, weightOffset);
      const y = this.matmul(normed, m, bias);
      this.free(normed); // stream-ordered: the matmul enqueued above reads it first
      return { sum, y };
    }
    const sum = this.out([T, D]);
    const y = this.out([T, N]);
    this.rt.launch(gemv.norm, [gemvLaunchGrid(gemv.choice, N, this.rt.smCount), 1, 1], GEMV_THREADS, gemv.sharedBytes, [
      ['p', m.addr], ['p', a.addr], ['p', rr.addr], ['f', rScale], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['f', eps],
      ['f', weightOffset], ['p', sum.addr], ['p', y.addr], ['i', T], ['i', N], ['i', D], ['i', gemv.choice.warpsPerRow]]);
    return { sum, y };
  }

  argmax(x: Tensor): Tensor {
    const op = 'argmax';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS, 2);
    const [R, V] = a.shape as [number, number];
    if (R > MAX_GRID_Y) throw opError(op, `${R} rows is above ${MAX_GRID_Y}`);
    const y = this.out([R], 'i32');
    if (R === 0) return y;
    if (V === 0) {
      check(this.rt.d.cuMemsetD32Async(y.addr, 0xffffffff, R, this.rt.stream), 'argmax of empty rows');
      return y;
    }
    // chunks of >= 4096 values (a multiple of 8 for 16-byte loads), at most 64 per row
    const S = Math.max(1, Math.min(64, Math.ceil(V / 4096)));
    const chunk = Math.ceil(V / S / 8) * 8;
    const pv = this.pool.alloc(R * S * 4).addr, pi = this.pool.alloc(R * S * 4).addr;
    this.rt.launch('k_argmax_part', [Math.ceil(V / chunk), R, 1], 256, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', pv], ['p', pi], ['i', V], ['i', chunk]]);
    this.rt.launch('k_argmax_final', [Math.ceil(R / 8), 1, 1], 256, 0, [
      ['p', pv], ['p', pi], ['p', y.addr], ['i', R], ['i', Math.ceil(V / chunk)]]);
    this.pool.release(pv, R * S * 4);
    this.pool.release(pi, R * S * 4);
    return y;
  }

  sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    const op = 'sampleRows';
    this.assertOpen(op);
    this.assertNotCapturing(op); // it uploads the rows
    const a = this.arg(op, 'logits', logits, ACTS, 2);
    const [P, V] = a.shape as [number, number];
    if (rows.length !== P) throw opError(op, `${rows.length} rows for logits ${describe(a)}`);
    let plan: PackedSampleRows;
    try {
      plan = planSampleRows(rows, Math.max(V, 1));
    } catch (e) {
      throw opError(op, (e as Error).message);
    }
    const y = this.out([P, sampleResultWidth(plan.k)], 'i32');
    if (V === 0 && P > 0) { // nothing to pick: every row is a masked row
      check(this.rt.d.cuMemsetD32Async(y.addr, 0xffffffff, P * sampleResultWidth(plan.k), this.rt.stream), 'sampleRows of empty rows');
      return y;
    }
    enqueueSampleRows(this.rt, this.pool, plan, a.addr, a.dtype, y.addr);
    return y;
  }

  gluPacked(gu: Tensor, act: Activation): Tensor {
    const op = 'gluPacked';
    this.assertOpen(op);
    const g = this.arg(op, 'gu', gu, ACTS, 2);
    const [T, I2] = g.shape as [number, number];
    if (I2 % 2 !== 0) throw opError(op, `gu ${describe(g)} must be [T, 2I]`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const I = I2 / 2;
    const y = this.out([T, I]);
    const n = g.dtype === 'bf16' && I % 8 === 0 ? (T * I) / 8 : T * I;
    this.rt.launch('k_glu_packed', this.elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', y.addr], ['p', T], ['p', I], ['i', code]]);
    return y;
  }

  /**
   * matmul(gluPacked(gu, act), w, bias). With $LLMTS_CUDA_FUSE_GLU=on, a decode shape (at most
   * FUSED_GEMV_MAX_ROWS rows, bf16 gu and w, no bias, 16-byte aligned, the [T, I] glu within
   * GEMVP_MAX_SHARED_BYTES) runs one persistent GEMV kernel whose blocks each make the GLU once
   * into shared memory (gemv-kernels.ts k_gemvp_glu_*): a kernel and the [T, I] glu output less
   * per layer. Opt-in until measured on the GPU; otherwise the two ops.
   */
  gluMatmul(gu: Tensor, act: Activation, w: Tensor, bias?: Tensor): Tensor {
    const op = 'gluMatmul';
    this.assertOpen(op);
    const g = this.arg(op, 'gu', gu, ACTS, 2);
    const b = this.arg(op, 'w', w, FLOAT, 2);
    const [T, I2] = g.shape as [number, number];
    const [N, I] = b.shape as [number, number];
    if (I2 !== 2 * I) throw opError(op, `gu ${describe(g)} must be [T, 2I] for w ${describe(b)} ([N, I])`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const gemv = FUSE_GLU && bias === undefined && g.dtype === 'bf16' && b.dtype === 'bf16' && T >= 1 && T <= FUSED_GEMV_MAX_ROWS && N > 0 &&
      g.addr % 16 === 0 && b.addr % 16 === 0 ? gemvFusedChoice(T, N, I) : undefined;
    if (!gemv || !this.sharedFits(gemv.glu, gemv.sharedBytes)) {
      const h = this.gluPacked(g, act);
      const y = this.matmul(h, b, bias);
      this.free(h); // stream-ordered: the matmul enqueued above reads it first
      return y;
    }
    const y = this.out([T, N]);
    this.rt.launch(gemv.glu, [gemvLaunchGrid(gemv.choice, N, this.rt.smCount), 1, 1], GEMV_THREADS, gemv.sharedBytes, [
      ['p', b.addr], ['p', g.addr], ['p', y.addr], ['i', T], ['i', N], ['i', I], ['i', gemv.choice.warpsPerRow], ['i', code]]);
    return y;
  }

  ropeQkvWriteKv(qkv: Tensor, heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number,
    qkNorm: QkNorm | undefined, kv: PagedKv, layout: StepLayout): Tensor {
    const op = 'ropeQkvWriteKv';
    this.assertOpen(op);
    const x = this.arg(op, 'qkv', qkv, ACTS, 2);
    const { heads: H, kvHeads: KVH, headDim: D } = heads;
    for (const [k, v] of Object.entries(heads)) {
      if (!Number.isSafeInteger(v) || v < 1) throw opError(op, `heads.${k} must be a positive integer, got ${v}`);
    }
    const T = x.shape[0]!;
    expectDim(op, 'qkv width', x.shape[1]!, (H + 2 * KVH) * D, () => `(heads ${H} + 2 x kvHeads ${KVH}) x headDim ${D}`);
    if (D > ROPE_QKV_MAX_HEAD_DIM) throw opError(op, `head dim ${D} is above the ${ROPE_QKV_MAX_HEAD_DIM} this kernel handles`);
    const [NB, BS, PKVH, PD] = this.poolDims(op, kv, layout);
    if (PKVH !== KVH || PD !== D) throw opError(op, `pool ${describe(kv.k)} must be [blocks, blockSize, ${KVH}, ${D}]`);
    const p = this.arg(op, 'pos', pos, I32, 1);
    expectDim(op, 'pos length', p.shape[0]!, T, () => `qkv ${describe(x)}`);
    const perToken = invFreq.shape.length === 2;
    const f = this.arg(op, 'invFreq', invFreq, ['f32'], perToken ? 2 : 1);
    if (perToken) expectDim(op, 'invFreq rows', f.shape[0]!, T, () => `per-token invFreq ${describe(f)} needs one row per token`);
    const half = f.shape[f.shape.length - 1]!;
    if (2 * half > D) throw opError(op, `invFreq ${describe(f)} rotates ${2 * half} dims but headDim is ${D}`);
    expectFinite(op, 'attentionScaling', attentionScaling);
    const slots = this.arg(op, 'layout.slots', layout.slots, I32, 1);
    expectDim(op, 'layout.slots length', slots.shape[0]!, T, () => `qkv ${describe(x)}`);
    let qn: CudaTensor | null = null, kn: CudaTensor | null = null;
    if (qkNorm) {
      qn = this.arg(op, 'qkNorm.q', qkNorm.q, FLOAT, 1);
      kn = this.arg(op, 'qkNorm.k', qkNorm.k, FLOAT, 1);
      expectDim(op, 'qkNorm.q length', qn.shape[0]!, D, () => 'per-head norm weights are [headDim]');
      expectDim(op, 'qkNorm.k length', kn.shape[0]!, D, () => 'per-head norm weights are [headDim]');
      if (qn.dtype !== kn.dtype) throw opError(op, `qkNorm.q ${describe(qn)} and qkNorm.k ${describe(kn)} differ in dtype`);
      expectFinite(op, 'qkNorm.eps', qkNorm.eps);
      expectFinite(op, 'qkNorm.weightOffset', qkNorm.weightOffset);
    }
    const q = this.out([T, H, D]);
    const kp = kv.k as CudaTensor;
    const vp = kv.v as CudaTensor;
    this.rt.launch('k_rope_qkv', [T, H + KVH, 1], Math.min(256, Math.max(32, Math.ceil(D / 32) * 32)), 0, [
      ['p', x.addr], ['i', DT_CODE[x.dtype]], ['p', p.addr], ['p', f.addr], ['i', perToken ? half : 0], ['f', attentionScaling],
      ['p', qn ? qn.addr : 0], ['p', kn ? kn.addr : 0], ['i', qn ? DT_CODE[qn.dtype] : 0], ['f', qkNorm?.eps ?? 0],
      ['f', qkNorm?.weightOffset ?? 0], ['p', q.addr], ['p', kp.addr], ['p', vp.addr], ['i', DT_CODE[kp.dtype]],
      ['p', slots.addr], ['i', T], ['i', H], ['i', KVH], ['i', D], ['i', half], ['p', NB * BS], ['p', this.errWord]]);
    return q;
  }

  softcap(x: Tensor, cap: number): Tensor {
    const op = 'softcap';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS);
    if (!Number.isFinite(cap) || cap <= 0) throw opError(op, `cap must be > 0, got ${cap}`);
    const y = this.out(a.shape);
    const n = numel(a.shape);
    this.rt.launch('k_softcap', this.elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', y.addr], ['p', n], ['f', cap]]);
    return y;
  }

  gatherRows(x: Tensor, idx: Tensor): Tensor {
    const op = 'gatherRows';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ANY, 2);
    const ix = this.arg(op, 'idx', idx, I32, 1);
    const [T, D] = a.shape as [number, number];
    const R = ix.shape[0]!;
    const y = this.out([R, D], a.dtype);
    const rowUnits = (D * dtypeBytes[a.dtype]) / 2;
    this.rt.launch('k_gather_rows', this.elementwiseGrid(R * rowUnits), ELEMWISE_THREADS, 0, [
      ['p', a.addr], ['p', ix.addr], ['p', y.addr], ['p', R], ['p', T], ['p', rowUnits], ['p', this.errWord]]);
    return y;
  }

  moeRoute(logits: Tensor, topK: number, renormalize: boolean): MoeRouting {
    const op = 'moeRoute';
    this.assertOpen(op);
    const l = this.arg(op, 'logits', logits, ACTS, 2);
    const [T, E] = l.shape as [number, number];
    if (!Number.isSafeInteger(topK) || topK < 1 || topK > E) {
      throw opError(op, `topK must be an integer in [1, ${E}] for logits ${describe(l)}, got ${topK}`);
    }
    const weights = this.out([T, topK], 'f32');
    const experts = this.out([T, topK], 'i32');
    this.rt.launch('k_moe_route', [Math.ceil(T / 128), 1, 1], 128, 0, [
      ['p', l.addr], ['i', DT_CODE[l.dtype]], ['p', weights.addr], ['p', experts.addr], ['i', T], ['i', E], ['i', topK],
      ['i', renormalize ? 1 : 0]]);
    return { weights, experts };
  }

  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor {
    const op = 'moeFfn';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, ACTS, 2);
    const rw = this.arg(op, 'routing.weights', routing.weights, ['f32'], 2);
    const re = this.arg(op, 'routing.experts', routing.experts, I32, 2);
    const g = this.arg(op, 'gate', gate, FLOAT, 3);
    const u = this.arg(op, 'up', up, FLOAT, 3);
    const d = this.arg(op, 'down', down, FLOAT, 3);
    const [T, D] = a.shape as [number, number];
    const [E, I, Dg] = g.shape as [number, number, number];
    if (!sameShape(rw.shape, re.shape) || rw.shape[0] !== T) {
      throw opError(op, `routing weights ${describe(rw)} / experts ${describe(re)} must both be [${T}, topK]`);
    }
    if (Dg !== D) throw opError(op, `gate ${describe(g)} must be [E, I, ${D}] for x ${describe(a)}`);
    if (!sameShape(u.shape, g.shape)) throw opError(op, `up ${describe(u)} must match gate ${describe(g)}`);
    if (!sameShape(d.shape, [E, D, I])) throw opError(op, `down ${describe(d)} must be [${E}, ${D}, ${I}]`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const K = rw.shape[1]!;
    const y = this.out([T, D]);
    if (T === 0 || D === 0) return y;
    const hiddenBytes = Math.max(T * K * I * 4, 4);
    const hidden = this.pool.alloc(hiddenBytes).addr;
    this.rt.launch('k_moe_hidden', [Math.ceil(I / 8), Math.min(T * K, MAX_GRID_Y), 1], 256, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', re.addr], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', u.addr],
      ['i', DT_CODE[u.dtype]], ['p', hidden], ['i', T * K], ['i', K], ['i', D], ['i', I], ['i', E], ['i', code],
      ['p', this.errWord]]);
    this.rt.launch('k_moe_down', [Math.ceil(D / 8), Math.min(T, MAX_GRID_Y), 1], 256, 0, [
      ['p', hidden], ['p', rw.addr], ['p', re.addr], ['p', d.addr], ['i', DT_CODE[d.dtype]], ['p', y.addr], ['i', T],
      ['i', K], ['i', D], ['i', I], ['i', E]]);
    this.pool.release(hidden, hiddenBytes);
    return y;
  }
}

export type { KernelArg };

/**
 * Opens device `options.device` (default $LLMTS_CUDA_DEVICE or 0). Throws CudaUnavailableError
 * (with the reason) when CUDA cannot be used here.
 */
export async function createCudaBackend(options: CudaBackendOptions = {}): Promise<CudaBackend> {
  const probe = probeCuda();
  if (!probe.ok) throw new CudaUnavailableError(probe.reason ?? 'CUDA is not usable');
  const ordinal = options.device ?? Number(process.env.LLMTS_CUDA_DEVICE ?? 0);
  // The kernel modules start compiling (off the main thread) inside create; the rest of the setup
  // (cuBLASLt included) overlaps with them, and so does weight loading with kernels: 'background'.
  const rt = await CudaRuntime.create(ordinal, {}, { background: true });
  const pool = new DevicePool(rt);
  let gemm: LtGemm | null = null;
  let note: string;
  const mode = options.gemm ?? (process.env.LLMTS_CUDA_GEMM === 'simple' ? 'simple' : 'cublaslt');
  if (mode === 'simple') {
    note = 'simple (forced)';
  } else {
    try {
      gemm = new LtGemm(loadCublasLt(), rt, pool);
      note = `cublaslt ${gemm.version}`;
    } catch (e) {
      note = `simple (cuBLASLt unusable: ${(e as Error).message})`;
    }
  }
  const backend = new CudaBackend(rt, pool, gemm, note);
  if (options.kernels !== 'background') {
    try {
      await backend.ready();
    } catch (e) {
      await backend.close();
      throw e;
    }
  }
  return backend;
}
