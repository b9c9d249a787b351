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
//
// This file keeps the bookkeeping (scopes, graphs, memory), the plain ops and the GEMM dispatch.
// Split out, each behind a thin method here (they reach the backend only through the object of
// cuda-op-context.ts): weight loading (cuda-weight-loader.ts), device-to-host reads and KV block
// copies (cuda-readback.ts), the fused decode ops (cuda-fused-ops.ts), the paged-KV ops
// (cuda-kv-ops.ts), the MoE ops (cuda-moe-ops.ts), argmax and sampleRows (cuda-pick-ops.ts), and
// what the backend reports about itself (cuda-backend-info.ts).
import type {
  Activation, AttentionParams, Backend, CapturedGraph, DType, MoeRouting, PagedKv, QkNorm, QkvHeads, StepLayout, Tensor,
  WeightSource,
} from '../../contracts/backend.ts';
import { dtypeBytes, numel } from '../../contracts/backend.ts';
import { ScopeStack } from '../common/scopes.ts';
import { check, CudaUnavailableError, loadCublasLt, probeCuda, traceSlowCalls } from './cuda-lib.ts';
import { type CudaSettings, cudaSettingsFrom, type CudaSettingsOverrides } from './cuda-settings.ts';
import { ACT_CODE, CudaFp8Tensor, CudaTensor, DT_CODE } from './cuda-tensor.ts';
import { DevicePool } from './device-pool.ts';
import type { GraphProfile } from './graph-profiler.ts';
import { KernelProfiler, type KernelTime } from './profiler.ts';
import { type GemmType, LtGemm, type TuneRecord } from './gemm.ts';
import { ATT_COUNTERS } from './attention.ts';
import { ATT_TC_PHASE_NAMES } from './attention-decode-tc.ts';
import type { KernelName } from './kernels.ts';
import type { DeviceSampleRow } from '../../contracts/device-sampling.ts';
import { CudaRuntime, type KernelArg } from './runtime.ts';
import * as shapes from '../common/op-shapes.ts';
import { describe, opChecks, opError, tensorArg } from './validate.ts';
import { fp8Matmul, fp8RowView } from './cuda-fp8-weights.ts';
import { backendInfo, type CudaBackendInfo, describeInfo } from './cuda-backend-info.ts';
import { CudaFusedOps } from './cuda-fused-ops.ts';
import * as kvOps from './cuda-kv-ops.ts';
import * as moeOps from './cuda-moe-ops.ts';
import {
  ANY, type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid, MAX_GRID_X, MAX_GRID_Y,
} from './cuda-op-context.ts';
import * as pickOps from './cuda-pick-ops.ts';
import { CudaReadback } from './cuda-readback.ts';
import { CudaWeightLoader } from './cuda-weight-loader.ts';

export type { CudaBackendInfo, CudaKernelModuleInfo } from './cuda-backend-info.ts';

let nextBackendId = 1;

/** what rowView and free take: every tensor dtype, FP8 matrices among them */
const VIEWABLE: readonly DType[] = [...ANY, 'fp8'];

export interface CudaBackendOptions {
  /**
   * knobs set in code (cuda-settings.ts: the device, the GEMM engine, kernels, fusions...); the
   * others come from the environment
   */
  settings?: CudaSettingsOverrides;
  /**
   * 'wait' (default): resolve once every kernel module is compiled and loaded. 'background': resolve
   * while they still compile, so weights can load meanwhile; `ready()` must resolve before any op
   * runs a kernel (loadModel awaits it after the weights; conversions during loading wait for their
   * module themselves).
   */
  kernels?: 'wait' | 'background';
}

export class CudaBackend implements Backend {
  readonly name = 'cuda' as const;
  readonly activationDtype: DType = 'bf16';
  /** GEMMs cuBLASLt declined (run by the plain kernel instead) */
  gemmFallbacks = 0;
  private readonly id = nextBackendId++;
  /** this backend's tensors as the op rules check them (common/op-shapes.ts) */
  private readonly checks = opChecks(this.id, (op) => this.assertOpen(op));
  private readonly scopes: ScopeStack<CudaTensor>;
  /** device int[4]: first kernel error (code, a, b, c); 0 = none */
  private readonly errWord: number;
  /** attention.ts ATT_COUNTERS split counters of the tensor-core decode kernel (zero between calls) */
  private readonly attCounters: number;
  /** what the split-out op modules get of this backend (opContext) */
  private readonly ctx: CudaOpContext;
  private readonly loader: CudaWeightLoader;
  private readonly readback: CudaReadback;
  private readonly fused: CudaFusedOps;
  private closed = false;
  /** captured graphs not yet disposed (close disposes them) */
  private readonly liveGraphs = new Set<CapturedGraph>();

  /** `settings`: what the backend was created with; every op reads its group of them */
  constructor(private readonly rt: CudaRuntime, private readonly pool: DevicePool,
    private readonly gemm: LtGemm | null, private readonly gemmNote: string, readonly settings: CudaSettings) {
    this.scopes = new ScopeStack<CudaTensor>((t) => this.release(t), (t) => t.owner);
    this.errWord = pool.alloc(16, true).addr;
    check(rt.d.cuMemsetD32Async(this.errWord, 0, 4, rt.stream), 'clearing the error word');
    this.attCounters = pool.alloc(ATT_COUNTERS * 4, true).addr;
    check(rt.d.cuMemsetD32Async(this.attCounters, 0, ATT_COUNTERS, rt.stream), 'clearing the attention split counters');
    this.ctx = this.opContext();
    this.loader = new CudaWeightLoader(this.ctx);
    this.readback = new CudaReadback(this.ctx);
    this.fused = new CudaFusedOps(this.ctx);
  }

  /** What the modules split out of this class get of it (cuda-op-context.ts). */
  private opContext(): CudaOpContext {
    return {
      rt: this.rt, pool: this.pool, settings: this.settings, errWord: this.errWord,
      isClosed: () => this.closed,
      assertOpen: (op) => this.assertOpen(op),
      assertNotCapturing: (op) => this.assertNotCapturing(op),
      arg: (op, name, t, dtypes, rank) => this.arg(op, name, t, dtypes, rank),
      checks: this.checks,
      make: (shape, dtype, scoped, exact) => this.make(shape, dtype, scoped, exact),
      out: (shape, dtype) => this.out(shape, dtype),
      release: (t) => this.release(t),
      convert: (src, sdt, dst, ddt, n) => this.convert(src, sdt, dst, ddt, n),
      kernelResources: (name) => this.kernelResources(name),
      matmul: (x, w, bias) => this.matmul(x, w, bias),
      free: (t) => this.free(t),
    };
  }

  /** Device, kernel modules (as they are now: they may still be compiling) and GEMM engine. */
  get info(): CudaBackendInfo {
    return backendInfo(this.rt, this.gemmNote);
  }

  /**
   * One line for logs: device, kernel modules (how long until all were loaded; per module its NVRTC
   * time or 'cache'), GEMM engine.
   */
  describe(): string {
    return describeInfo(this.info);
  }

  /**
   * Resolves once every kernel module is loaded (at once unless created with kernels: 'background');
   * rejects with the failed module's name and NVRTC's log.
   */
  ready(): Promise<void> {
    return this.rt.ready();
  }

  /** What the GEMM tuner measured per shape (cuBLASLt's best vs our GEMV kernels), in tuning order. */
  get gemmTuning(): readonly TuneRecord[] {
    this.gemm?.settleTuning(true); // for reports: waits for timings still on the stream
    return this.gemm?.tuned ?? [];
  }

  /** Starts timing every kernel on the device (see profiler.ts); stopProfile reports. */
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
   * With CudaRuntimeSettings.graphProfile ($LLMTS_CUDA_GRAPH_PROFILE=1): waits for the stream and
   * returns each captured graph's kernels as its last replay ran them (graph-profiler.ts); else [].
   */
  async graphProfile(): Promise<GraphProfile[]> {
    await this.sync();
    return this.rt.graphProfiler?.collect() ?? [];
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
    const { t: x, src: s } = shapes.copyTensor(this.checks, t, src);
    this.assertNotCapturing(op);
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

  /** Enqueues dst = src converted between float dtypes (n elements). */
  private convert(src: number, sdt: DType, dst: number, ddt: DType, n: number): void {
    this.rt.launch('k_convert', elementwiseGrid(n), ELEMWISE_THREADS, 0,
      [['p', src], ['i', DT_CODE[sdt]], ['p', dst], ['i', DT_CODE[ddt]], ['p', n]]);
  }

  // ---- memory ------------------------------------------------------------------------------

  upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor {
    const dtype = shapes.upload(this.checks, data, shape);
    this.assertNotCapturing('upload');
    const t = this.make(shape, dtype, true);
    // From pageable memory the driver stages the bytes before returning: `data` may change after.
    if (t.bytes > 0) check(this.rt.d.cuMemcpyHtoDAsync_v2(t.addr, data, t.bytes, this.rt.stream), 'upload copy');
    return t;
  }

  loadWeight(src: WeightSource, as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loader.loadWeight(src, as);
  }

  loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loader.loadWeightRows(src, rowStart, rows, as);
  }

  loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loader.loadStacked(srcs, as);
  }

  loadConcat(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loader.loadConcat(srcs, as);
  }

  zeros(shape: readonly number[], dtype: DType): Tensor {
    shapes.zeros(this.checks, shape, dtype);
    const t = this.make(shape, dtype, false);
    if (t.bytes > 0) check(this.rt.d.cuMemsetD8Async(t.addr, 0, t.bytes, this.rt.stream), 'zeros');
    return t;
  }

  reshape(t: Tensor, shape: readonly number[]): Tensor {
    const x = shapes.reshape(this.checks, t, shape);
    return new CudaTensor(Object.freeze([...shape]), x.dtype, x.addr, x.bytes, x.owner, this.id);
  }

  rowView(t: Tensor, start: number, rows: number): Tensor {
    const x = this.arg('rowView', 't', t, VIEWABLE);
    if (x.shape.length === 0) throw opError('rowView', 'a scalar has no rows');
    const total = x.shape[0]!;
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(rows) || start < 0 || rows < 0 || start + rows > total) {
      throw opError('rowView', `rows [${start}, ${start + rows}) outside [0, ${total}) of ${describe(x)}`);
    }
    if (x instanceof CudaFp8Tensor) return fp8RowView(x, start, rows);
    const rowBytes = numel(x.shape.slice(1)) * dtypeBytes[x.dtype];
    return new CudaTensor(Object.freeze([rows, ...x.shape.slice(1)]), x.dtype, x.addr + start * rowBytes, rows * rowBytes,
      x.owner, this.id);
  }

  read(t: Tensor): Promise<Float32Array | Int32Array> {
    return this.readback.read(t);
  }

  readBlocks(pool: Tensor, blocks: readonly number[]): Promise<Uint8Array> {
    return this.readback.readBlocks(pool, blocks);
  }

  writeBlocks(pool: Tensor, blocks: readonly number[], data: Uint8Array): void {
    this.readback.writeBlocks(pool, blocks, data);
  }

  free(t: Tensor): void {
    const x = this.arg('free', 't', t, VIEWABLE);
    if (x.isView) return; // views free nothing
    if (x instanceof CudaFp8Tensor) this.release(x.scales);
    this.release(x);
  }

  async sync(): Promise<void> {
    if (this.closed) throw opError('sync', 'the backend is closed');
    this.assertNotCapturing('sync');
    await this.readback.waitStream();
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
    this.loader.close();
    this.readback.close();
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
    const { table: tb, ids: id, V, D, T } = shapes.embedding(this.checks, table, ids, scale);
    if (tb.dtype === 'fp8') throw opError('embedding', `the table is ${describe(tb)}: FP8 matrices are matmul weights only`);
    const y = this.out([T, D]);
    this.rt.launch('k_embedding', elementwiseGrid(T * D), ELEMWISE_THREADS, 0, [
      ['p', tb.addr], ['i', DT_CODE[tb.dtype]], ['p', id.addr], ['p', y.addr], ['p', T], ['p', V], ['p', D],
      ['f', scale], ['p', this.errWord]]);
    return y;
  }

  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor {
    const { x: a, w: b, bias: checkedBias, M, N, K } = shapes.matmul(this.checks, x, w, bias);
    const c = checkedBias ?? null;
    const y = this.out([M, N]);
    if (M === 0 || N === 0) return y;
    if (b instanceof CudaFp8Tensor) {
      fp8Matmul(this.ctx, a, b, c, y, M, N, K, (xa, wb, bb, yy, m, n, k) => this.matmulInto(xa, wb, bb, yy, m, n, k));
      return y;
    }
    this.matmulInto(a, b, c, y, M, N, K);
    return y;
  }

  /** y = a · b^T (+ c) for a weight of a float dtype: cuBLASLt, or the simple kernel where it has no algorithm. */
  private matmulInto(a: CudaTensor, b: CudaTensor, c: CudaTensor | null, y: CudaTensor, M: number, N: number, K: number): void {
    if (K > 0 && this.gemm && this.lt(a, b, c, y, M, N, K)) return;
    if (K > 0 && this.gemm) this.gemmFallbacks++;
    this.simpleMatmul(a, b, c, y, M, N, K);
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
        this.rt.launch('k_matmul_finish', elementwiseGrid(M * N), ELEMWISE_THREADS, 0, [
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
    const { x: a, w: g, D, rows } = shapes.rmsnorm(this.checks, x, w, eps, weightOffset);
    const y = this.out(a.shape);
    this.rt.launch('k_rmsnorm', [Math.min(rows, MAX_GRID_X), 1, 1], 256, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', y.addr], ['p', rows],
      ['i', D], ['f', eps], ['f', weightOffset]]);
    return y;
  }

  add(a: Tensor, b: Tensor, bScale: number): Tensor {
    const { a: x, b: z, n } = shapes.add(this.checks, a, b, bScale);
    const y = this.out(x.shape);
    this.rt.launch('k_add', elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', x.addr], ['i', DT_CODE[x.dtype]], ['p', z.addr], ['i', DT_CODE[z.dtype]], ['p', y.addr], ['p', n],
      ['f', bScale]]);
    return y;
  }

  scale(x: Tensor, s: number): Tensor {
    const { x: a, n } = shapes.scale(this.checks, x, s);
    const y = this.out(a.shape);
    this.rt.launch('k_scale', elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', y.addr], ['p', n], ['f', s]]);
    return y;
  }

  glu(gate: Tensor, up: Tensor, act: Activation): Tensor {
    const { gate: g, up: u, n } = shapes.glu(this.checks, gate, up, act);
    const y = this.out(g.shape);
    this.rt.launch('k_glu', elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', u.addr], ['i', DT_CODE[u.dtype]], ['p', y.addr], ['p', n],
      ['i', ACT_CODE[act]]]);
    return y;
  }

  rope(x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number): Tensor {
    const { x: a, pos: p, invFreq: f, T, H, D, half, perToken } = shapes.rope(this.checks, x, pos, invFreq, attentionScaling);
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

  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
    kvOps.writeKv(this.ctx, kv, k, v, layout);
  }

  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor {
    return kvOps.attention(this.ctx, this.attCounters, q, kv, layout, params);
  }

  addRmsnorm(x: Tensor, r: Tensor, rScale: number, w: Tensor, eps: number, weightOffset: number): { sum: Tensor; normed: Tensor } {
    return this.fused.addRmsnorm(x, r, rScale, w, eps, weightOffset);
  }

  /** addRmsnorm, then matmul(normed, w, bias); fused into one decode GEMV where it can be (cuda-fused-ops.ts). */
  addRmsnormMatmul(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, w: Tensor,
    bias?: Tensor): { sum: Tensor; y: Tensor } {
    return this.fused.addRmsnormMatmul(x, r, rScale, normW, eps, weightOffset, w, bias);
  }

  addRmsnormGateUpGlu(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number,
    gateUp: Tensor, act: Activation): { sum: Tensor; y: Tensor } {
    return this.fused.addRmsnormGateUpGlu(x, r, rScale, normW, eps, weightOffset, gateUp, act);
  }

  addRmsnormQkvRope(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, qkv: Tensor,
    heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number, kv: PagedKv, layout: StepLayout): { sum: Tensor; q: Tensor } {
    return this.fused.addRmsnormQkvRope(x, r, rScale, normW, eps, weightOffset, qkv, heads, pos, invFreq, attentionScaling, kv, layout);
  }

  /**
   * The tensor-core decode attention's phase counters (CudaKernelSettings.attentionDefines ATT_TC_PHASES=1,
   * attention-decode-tc.ts): each phase's cycles over the blocks that had it, and how many, since
   * the module loaded or resetAttentionPhases; null where the module was compiled without them.
   */
  async attentionPhases(): Promise<{ phase: (typeof ATT_TC_PHASE_NAMES)[number]; cycles: number; blocks: number }[] | null> {
    this.assertOpen('attentionPhases');
    await this.rt.moduleReady('k_attn_decode_tc_d128');
    const g = this.rt.moduleGlobal('attention', 'att_tc_phases');
    if (!g) return null;
    const words = new BigUint64Array((await this.readback.readDevice(g.addr, g.bytes)).buffer);
    return ATT_TC_PHASE_NAMES.map((phase, k) => ({ phase, cycles: Number(words[2 * k]), blocks: Number(words[2 * k + 1]) }));
  }

  /**
   * Zeroes the attention's phase counters (enqueued: work before it still counts; the attention
   * module must be loaded); false where they are compiled out.
   */
  resetAttentionPhases(): boolean {
    this.assertOpen('resetAttentionPhases');
    this.assertNotCapturing('resetAttentionPhases');
    const g = this.rt.moduleGlobal('attention', 'att_tc_phases');
    if (!g) return false;
    check(this.rt.d.cuMemsetD8Async(g.addr, 0, g.bytes, this.rt.stream), 'zeroing the attention phases');
    return true;
  }

  argmax(x: Tensor): Tensor {
    return pickOps.argmax(this.ctx, x);
  }

  sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    return pickOps.sampleRows(this.ctx, logits, rows);
  }

  gluPacked(gu: Tensor, act: Activation): Tensor {
    return this.fused.gluPacked(gu, act);
  }

  /** matmul(gluPacked(gu, act), w, bias); the GLU fused into the decode GEMV with CudaFusedSettings.fuseGlu (cuda-fused-ops.ts). */
  gluMatmul(gu: Tensor, act: Activation, w: Tensor, bias?: Tensor): Tensor {
    return this.fused.gluMatmul(gu, act, w, bias);
  }

  ropeQkvWriteKv(qkv: Tensor, heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number,
    qkNorm: QkNorm | undefined, kv: PagedKv, layout: StepLayout): Tensor {
    return this.fused.ropeQkvWriteKv(qkv, heads, pos, invFreq, attentionScaling, qkNorm, kv, layout);
  }

  softcap(x: Tensor, cap: number): Tensor {
    const { x: a, n } = shapes.softcap(this.checks, x, cap);
    const y = this.out(a.shape);
    this.rt.launch('k_softcap', elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', y.addr], ['p', n], ['f', cap]]);
    return y;
  }

  gatherRows(x: Tensor, idx: Tensor): Tensor {
    const { x: a, idx: ix, T, D, R } = shapes.gatherRows(this.checks, x, idx);
    const y = this.out([R, D], a.dtype);
    const rowUnits = (D * dtypeBytes[a.dtype]) / 2;
    this.rt.launch('k_gather_rows', elementwiseGrid(R * rowUnits), ELEMWISE_THREADS, 0, [
      ['p', a.addr], ['p', ix.addr], ['p', y.addr], ['p', R], ['p', T], ['p', rowUnits], ['p', this.errWord]]);
    return y;
  }

  moeRoute(logits: Tensor, topK: number, renormalize: boolean): MoeRouting {
    return moeOps.moeRoute(this.ctx, logits, topK, renormalize);
  }

  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor {
    return moeOps.moeFfn(this.ctx, x, routing, gate, up, down, act);
  }
}

export type { KernelArg };

/**
 * Opens the device of its settings (CudaRuntimeSettings.device: options.settings over the
 * environment, read once here). Throws CudaUnavailableError (with the reason) when CUDA cannot be
 * used here, and an Error naming the variable or field of a knob set to a value it does not allow.
 */
export async function createCudaBackend(options: CudaBackendOptions = {}): Promise<CudaBackend> {
  const settings = cudaSettingsFrom(process.env, options.settings);
  const probe = probeCuda();
  if (!probe.ok) throw new CudaUnavailableError(probe.reason ?? 'CUDA is not usable');
  // The kernel modules start compiling (off the main thread) inside create; the rest of the setup
  // (cuBLASLt included) overlaps with them, and so does weight loading with kernels: 'background'.
  const rt = await CudaRuntime.create(settings, {}, { background: true });
  const pool = new DevicePool(rt);
  let gemm: LtGemm | null = null;
  let note: string;
  if (settings.gemm.engine === 'simple') {
    note = 'simple (forced)';
  } else {
    try {
      gemm = new LtGemm(traceSlowCalls(loadCublasLt(), settings.runtime.slowCallMs), rt, pool, settings);
      note = `cublaslt ${gemm.version}`;
    } catch (e) {
      note = `simple (cuBLASLt unusable: ${(e as Error).message})`;
    }
  }
  const backend = new CudaBackend(rt, pool, gemm, note, settings);
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
