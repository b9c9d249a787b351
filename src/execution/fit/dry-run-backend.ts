// A backend that computes nothing: tensors are shapes, and every allocation goes through an
// AllocatorModel. The planner loads a checkpoint's weights through it (so the loader's own
// name mapping and shape checks decide what is loaded, in which dtype) and runs the real decoder
// graph on it (so the transient memory of a step is whatever the graph actually allocates, for
// every family, and stays true when the graph changes). Ops follow the Backend contract's
// ownership rules exactly as the native backends implement them: op outputs and uploads belong to
// the innermost scope, weights / zeros / views do not. Memory an op takes for its own duration
// is modelled per backend: malloc'd scratch outside the pool on the CPU (native/*.c), pool blocks
// taken and given back inside the op on CUDA (backends/cuda/cuda-backend.ts: dtype conversions,
// f32 GEMM accumulators, the MoE hidden buffer, the f32 copy a read widens into).

import os from 'node:os';
import type {
  Activation, AttentionParams, Backend, CapturedGraph, DType, FusedOps, MoeRouting, PagedKv, QkvHeads, QkNorm, QuantizedType,
  StepLayout, Tensor, WeightSource,
} from '../../contracts/backend.ts';
import { dtypeBytes, numel, tensorBytes } from '../../contracts/backend.ts';
import { GGML_TYPE_BY_NAME } from '../../artifacts/gguf/ggml-types.ts';
import { ScopeStack } from '../../backends/common/scopes.ts';
import * as shapes from '../../backends/common/op-shapes.ts';
import { checkDtypeRank, FLOATS, type OpChecks } from '../../backends/common/op-shapes.ts';
import { CUDA_POOL, PoolModel, type AllocatorModel, type Block } from './allocator.ts';
import { L2_FLUSH_BYTES, TUNE_MAX_M, tuneClassOf } from '../../backends/cuda/gemm-tuning.ts';
import { moeGroupedScratch, moeRunsGrouped, moeVecKernelsApply } from '../../backends/cuda/moe-kernels.ts';
import { type CudaSettings, cudaSettingsFrom } from '../../backends/cuda/cuda-settings.ts';
import { gemvFp8Choice } from '../../backends/cuda/fp8-kernels.ts';

/** CPU backend: uploads above this get a fresh exact block, smaller ones are staged (cpu-backend.ts) */
const STAGED_UPLOAD_MAX = 1 << 20;
/** native/attention.c: keys per softmax rescale; sizes each thread's scratch */
const ATTENTION_CHUNK = 16;
/** native/matmul.c: above this many rows a matmul packs x into panels of PACK_WIDTH rows (AVX-512's width, the widest) */
const ROWS_MAX_M = 16;
const PACK_WIDTH = 32;
/** native/gemm_impl.h: per-thread weight and output blocks of the packed path, (6 x 8) x 128 floats each */
const PACK_THREAD_BYTES = 2 * 48 * 128 * 4;
/**
 * backends/cuda/gemm.ts: the first GEMM shape of a tuning class (same N, K and types; at most
 * TUNE_MAX_M rows, exact up to 8, then by 16) has its algorithm timed the first time it runs
 * outside a graph capture, and the timing writes an L2-flush buffer of L2_FLUSH_BYTES (a pool
 * block of its own size class) between calls: live for that op on top of everything the step holds then (on
 * the H200 it was the step's live high-water mark in most runs: the lm_head of a prefill chunk's
 * last step is a new shape once every layer's residual is live). CudaGemmSettings.tune off skips it.
 */
export const CUDA_TUNE_MAX_M = TUNE_MAX_M;
export const CUDA_L2_FLUSH_BYTES = L2_FLUSH_BYTES;


export class DryTensor implements Tensor {
  freed = false;
  constructor(
    readonly shape: readonly number[],
    readonly dtype: DType,
    /** null for views and for tensors that hold no memory (KV stand-ins) */
    readonly block: Block | null,
    readonly base: DryTensor | null,
    /** weights: bytes of the checkpoint data this tensor was loaded from, and its stored dtype */
    readonly source?: { bytes: number; dtype: DType },
    /** the allocator its block came from (a graph's arena while one is captured) */
    readonly allocator?: AllocatorModel,
    /**
     * a layout other than numel x dtype: its name and bytes (the CPU backend's quantized panels; a
     * CUDA FP8 matrix's bytes and scales, which take a second block and colShift)
     */
    readonly layout?: { name: string; bytes: number; fp8?: { colShift: number; scales: Block } },
  ) {}
  get owner(): DryTensor {
    return this.base ?? this;
  }
  get bytes(): number {
    return this.layout?.bytes ?? tensorBytes(this.shape, this.dtype);
  }
}

export interface DryRunOptions {
  /** 'cpu' mirrors the native CPU backend (f32 activations); 'cuda' the CUDA backend (bf16) */
  name: 'cpu' | 'cuda';
  activationDtype: DType;
  allocator: AllocatorModel;
  /** native threads (per-thread attention scratch); default os.availableParallelism() */
  threads?: number;
  /**
   * Offer the optional packed-weight and fused ops (contracts/backend.ts FusedOps), as the real
   * backend does when it has them: the loader then packs q/k/v and gate/up and the decoder takes
   * its fused path, so the simulated step allocates what that path allocates.
   */
  fused?: boolean;
  /**
   * Offer graph capture (captureGraph, copyInto), as the CUDA backend does:
   * the decoder then captures decode steps per batch bucket, and what a capture allocates stays
   * with the graph (an arena, as backends/cuda/device-pool.ts keeps it).
   */
  graphs?: boolean;
  /** offer a device argmax (greedy rows read back one id) */
  argmax?: boolean;
  /**
   * CUDA GEMM tuning (see CUDA_L2_FLUSH_BYTES): 'once' per shape, as one process does (a replay of
   * recorded steps); 'always' counts the flush buffer at every GEMM that could be a new shape (a
   * plan: a long-running server meets new shapes at any time); 'off' never. Default 'always'.
   */
  gemmTune?: 'once' | 'always' | 'off';
  /**
   * Which GEMMs the CUDA tuner times (default: gemm.ts's, TUNE_MAX_M rows by class); a replay of
   * a run recorded before gemm.ts tuned by class passes what that run's tuner did.
   */
  cudaTuning?: CudaTuning;
  /** the CUDA backend's settings it mirrors (the tuner's on/off, the MoE grouping); default from the environment */
  cuda?: CudaSettings;
  /**
   * CPU: GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 matmul weights stay quantized, in panels of 16 rows (CpuSettings.quantWeights,
   * native/quant_pack.c), and take those panels' bytes; default false
   */
  quantWeights?: boolean;
  /**
   * CUDA: FP8 checkpoint matrices stay FP8 (CudaGemvSettings.fp8Weights; cuda-weight-loader.ts
   * keepsFp8): a byte a weight plus an f32 scale per row per scale run, multiplied by the FP8 GEMV
   * at decode rows and through a bf16 copy made for the op at more. Default false
   */
  fp8Weights?: boolean;
}

/**
 * native/llm.h quant_p16_bytes: rows rounded up to panels of 16; a panel's block of 32 k takes 16 x 34
 * bytes (Q8_0), 16 x 18 (Q4_0), 16 x 18.5 (Q4_K: nibbles, a scale and a min byte, its super-block's two
 * f16s), 16 x 26.25 (Q6_K: nibbles, 2-bit high parts, two int8 scales, its super-block's f16), 16 x 22.5
 * (Q5_K: Q4_K's and the fifth bits), 16 x 17.25 (IQ4_XS: nibbles, an int8 scale, its super-block's f16), 16 x 20
 * (Q4_1: nibbles, an f16 scale and min) or 16 x 24 (Q5_1: the same and the fifth bits)
 */
const PANEL_BLOCK_BYTES: Record<QuantizedType, number> = { Q8_0: 544, Q4_0: 288, Q4_K: 296, Q6_K: 420, Q5_K: 360, IQ4_XS: 276, Q4_1: 320, Q5_1: 384 };

export function quantPanelBytes(type: QuantizedType, N: number, K: number): number {
  return Math.ceil(N / 16) * (K / 32) * PANEL_BLOCK_BYTES[type];
}

export interface CudaTuning {
  maxM: number;
  /** shapes share a timing by row class (exact up to 8, then by 16), else each row count apart */
  byClass: boolean;
}

export class DryRunBackend implements Backend {
  loadConcat?: FusedOps['loadConcat'];
  rowView?: FusedOps['rowView'];
  addRmsnorm?: FusedOps['addRmsnorm'];
  gluPacked?: FusedOps['gluPacked'];
  ropeQkvWriteKv?: FusedOps['ropeQkvWriteKv'];
  argmax?: (x: Tensor) => Tensor;
  captureGraph?: (body: () => Tensor[]) => CapturedGraph;
  copyInto?: (t: Tensor, data: Float32Array | Int32Array) => void;
  /** the arena of the graph being captured */
  private arena: PoolModel | null = null;
  /** bytes the captured graphs hold (the real pool counts them apart from its live bytes) */
  graphBytes = 0;
  /**
   * Device kernels the ops so far would launch on the CUDA backend (cuda-backend.ts, attention.ts;
   * cuBLASLt calls count one): a decode step's count times the time of a small kernel is what a
   * replayed graph spends beside streaming weights and KV (decode-model.ts).
   */
  kernels = 0;
  private readonly gemmTune: 'once' | 'always' | 'off';
  private readonly tuned = new Set<string>();
  private reads = new ArrayBuffer(0);
  private readonly cudaTuning: CudaTuning;
  private readonly cuda: CudaSettings;
  private readonly quantWeights: boolean;
  private readonly fp8Weights: boolean;
  readonly name: 'cpu' | 'cuda';
  readonly activationDtype: DType;
  readonly allocator: AllocatorModel;
  private readonly threads: number;
  private readonly scopes: ScopeStack<DryTensor>;
  /**
   * The op rules' checks of a dry-run tensor (common/op-shapes.ts): a plan runs the shapes the
   * real backend would check, so a graph it would refuse fails here too; dtypes are the loader's
   * and the real backend's business, so every float role takes every float dtype.
   */
  private readonly checks: OpChecks<DryTensor> = {
    dtypes: { act: FLOATS, weight: [...FLOATS, 'fp8'], param: FLOATS, kv: [...FLOATS, 'int8', 'fp8'], logits: FLOATS },
    error: (op, message) => new Error(`${this.name} backend (dry run) ${op}: ${message}`),
    open: () => {}, // it has nothing to close
    arg: (op, name, t, dtypes, rank) => {
      if (!(t instanceof DryTensor)) throw this.checks.error(op, `${name} is not a dry-run tensor`);
      checkDtypeRank(this.checks, op, name, t, dtypes, rank);
      return t;
    },
  };

  constructor(opts: DryRunOptions) {
    this.name = opts.name;
    this.activationDtype = opts.activationDtype;
    this.allocator = opts.allocator;
    this.threads = opts.threads ?? os.availableParallelism();
    this.cuda = opts.cuda ?? cudaSettingsFrom(process.env);
    this.quantWeights = opts.name === 'cpu' && opts.quantWeights === true;
    this.fp8Weights = opts.fp8Weights === true;
    this.gemmTune = !this.cuda.gemm.tune ? 'off' : opts.gemmTune ?? 'always';
    this.cudaTuning = opts.cudaTuning ?? { maxM: CUDA_TUNE_MAX_M, byClass: true };
    this.scopes = new ScopeStack<DryTensor>((t) => this.release(t), (t) => t.owner);
    if (opts.fused || opts.graphs) {
      this.rowView = (t, _start, rows) => {
        const x = t as DryTensor;
        return new DryTensor(Object.freeze([rows, ...x.shape.slice(1)]), x.dtype, null, x.owner);
      };
    }
    if (opts.argmax) this.argmax = (x: Tensor) => ((this.kernels += 2), this.out([x.shape[0]!], 'i32'));
    if (opts.graphs) {
      this.copyInto = () => {};
      this.captureGraph = (body) => this.capture(body);
    }
    if (opts.fused) {
      this.loadConcat = async (srcs, as) => {
        const rows = srcs.reduce((a, x) => a + x.shape[0]!, 0);
        if (this.keepsFp8(srcs, as)) return this.loadedFp8(srcs[0]!, rows, srcs[0]!.shape[1]!);
        return this.loaded(srcs[0]!, as, [rows, ...srcs[0]!.shape.slice(1)], srcs.length);
      };
      this.addRmsnorm = (x: Tensor) => ((this.kernels += 1), { sum: this.out(x.shape), normed: this.out(x.shape) });
      this.gluPacked = (gu: Tensor) => ((this.kernels += 1), this.out([gu.shape[0]!, gu.shape[1]! / 2]));
      this.ropeQkvWriteKv = (qkv: Tensor, heads: QkvHeads, _pos: Tensor, inv: Tensor, _s: number, _n: QkNorm | undefined) => {
        this.kernels += inv.dtype !== 'f32' ? 2 : 1;
        const q = this.out([qkv.shape[0]!, heads.heads, heads.headDim]);
        if (this.name === 'cuda' && inv.dtype !== 'f32') this.transient([numel(inv.shape) * 4]);
        return q;
      };
    }
  }

  /** live class bytes of the arena of a graph being captured (the real pool counts them as live then) */
  get arenaLiveBytes(): number {
    return this.arena?.liveClassBytes ?? 0;
  }

  /** where allocations go now: the arena of a graph being captured, else the allocator */
  private get current(): AllocatorModel {
    return this.arena ?? this.allocator;
  }

  private make(shape: readonly number[], dtype: DType, scoped: boolean, fresh = false, source?: DryTensor['source'],
    layout?: DryTensor['layout']): DryTensor {
    const bytes = layout?.bytes ?? tensorBytes(shape, dtype);
    const at = this.current;
    const t = new DryTensor(Object.freeze([...shape]), dtype, at.alloc(Math.max(bytes, 0), fresh), null, source, at, layout);
    if (scoped) this.scopes.adopt(t);
    return t;
  }
  private out(shape: readonly number[], dtype: DType = this.activationDtype): DryTensor {
    return this.make(shape, dtype, true);
  }
  private release(t: DryTensor): void {
    if (t.freed || t.base || !t.block) return;
    t.freed = true;
    (t.allocator ?? this.allocator).release(t.block);
    if (t.layout?.fp8) (t.allocator ?? this.allocator).release(t.layout.fp8.scales);
  }

  // ---- memory ------------------------------------------------------------------------------

  upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor {
    // both backends keep an upload's own dtype (CUDA keeps f32: rope tables need f32 angles)
    const dtype = shapes.upload(this.checks, data, shape);
    const bytes = numel(shape) * dtypeBytes[dtype];
    const fresh = this.name === 'cpu' && bytes > STAGED_UPLOAD_MAX;
    // CPU: a small upload is staged through a malloc'd copy until the queue runs it
    if (this.name === 'cpu' && !fresh) this.current.scratch(bytes);
    return this.make(shape, dtype, true, fresh);
  }

  /** as cuda-weight-loader.ts keepsFp8: every source an FP8 matrix kept in its stored form */
  private keepsFp8(srcs: readonly WeightSource[], as: 'keep' | 'f32'): boolean {
    return this.fp8Weights && as === 'keep' && srcs.every((s) => s.fp8 !== undefined && s.fp8ScaleCols !== undefined && s.shape.length === 2);
  }

  /** An FP8 matrix [N, K] as the CUDA loader makes it: the e4m3 bytes, then its scales [N, KB] f32, two blocks. */
  private loadedFp8(src: WeightSource, N: number, K: number): DryTensor {
    const cols = src.fp8ScaleCols!;
    const scaleBytes = N * Math.ceil(K / cols) * 4;
    const at = this.current;
    const block = at.alloc(N * K, true);
    const scales = at.alloc(scaleBytes, true);
    return new DryTensor(Object.freeze([N, K]), 'fp8', block, null, { bytes: N * K, dtype: 'fp8' }, at,
      { name: 'fp8', bytes: N * K + scaleBytes, fp8: { colShift: Math.log2(cols), scales } });
  }

  private loaded(src: WeightSource, as: 'keep' | 'f32', shape: readonly number[], parts = 1): DryTensor {
    const dtype: DType = as === 'keep' ? src.dtype : 'f32';
    const srcBytes = numel(shape) * dtypeBytes[src.dtype];
    const t = this.make(shape, dtype, false, true, { bytes: srcBytes, dtype: src.dtype });
    // CUDA widens on the device: the stored bytes land in a pool block first (one per part, all
    // in flight together), converted into the weight, then given back to the pool
    if (this.name === 'cuda' && dtype !== src.dtype) this.transient(Array(parts).fill(srcBytes / parts));
    return t;
  }
  async loadWeight(src: WeightSource, as: 'keep' | 'f32', use?: 'matmul'): Promise<Tensor> {
    // as cpu-backend.ts keepsQuantized: the panels replace the weight (the raw blocks staged for the
    // pack are a fresh block given back at once)
    const [N, K] = src.shape;
    if (this.quantWeights && use === 'matmul' && as === 'keep' && src.quantized && src.shape.length === 2 && N! > 0 &&
      K! > 0 && K! % GGML_TYPE_BY_NAME.get(src.quantized.type)!.blockSize === 0) {
      return this.make(src.shape, src.dtype, false, true, { bytes: numel(src.shape) * dtypeBytes[src.dtype], dtype: src.dtype },
        { name: src.quantized.type, bytes: quantPanelBytes(src.quantized.type, N!, K!) });
    }
    if (this.keepsFp8([src], as)) return this.loadedFp8(src, N!, K!);
    return this.loaded(src, as, src.shape);
  }
  async loadWeightRows(src: WeightSource, _rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    if (this.keepsFp8([src], as)) return this.loadedFp8(src, rows, src.shape[1]!);
    return this.loaded(src, as, [rows, ...src.shape.slice(1)]);
  }
  async loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loaded(srcs[0]!, as, [srcs.length, ...srcs[0]!.shape], srcs.length);
  }

  /**
   * CUDA: pool blocks an op takes (in this order) and gives back before it returns; `exact`: an
   * exact-size block taken last (the GEMM tuner's L2 flush).
   */
  private transient(sizes: readonly number[], exact = 0): void {
    const at = this.current;
    const blocks = sizes.map((b) => at.alloc(b, false));
    if (exact > 0) blocks.push(at.alloc(exact, true));
    for (let i = blocks.length - 1; i >= 0; i--) at.release(blocks[i]!);
  }

  /**
   * A graph capture as backends/cuda/cuda-backend.ts makes one: the body's allocations come from a
   * fresh arena (reused within it, never shared), and every block the arena made, live or idle,
   * belongs to the graph until it is disposed.
   */
  private capture(body: () => Tensor[]): CapturedGraph {
    if (this.arena) throw new Error('dry run: a graph capture is already in progress');
    const arena = new PoolModel({ ...CUDA_POOL, poolMax: Infinity, cacheLimit: Infinity });
    // the real pool counts an arena's blocks as live while the capture runs: report them
    arena.onChange = () => (this.allocator as Partial<PoolModel>).onChange?.();
    this.arena = arena;
    let outputs: Tensor[];
    this.scopes.begin();
    try {
      outputs = body();
    } catch (e) {
      this.scopes.end();
      this.arena = null;
      throw e;
    }
    this.scopes.end(outputs as DryTensor[]);
    this.arena = null;
    const held = arena.resident > 0 ? this.allocator.alloc(arena.resident, true) : null;
    const bytes = held ? arena.resident : 0;
    this.graphBytes += bytes;
    let disposed = false;
    return {
      outputs,
      replay: () => {},
      dispose: () => {
        if (disposed) return;
        disposed = true;
        this.graphBytes -= bytes;
        if (held) this.allocator.release(held);
      },
    };
  }

  zeros(shape: readonly number[], dtype: DType): Tensor {
    shapes.zeros(this.checks, shape, dtype);
    return this.make(shape, dtype, false);
  }

  /** A stand-in that holds no memory (the planner counts KV pools on its own). */
  placeholder(shape: readonly number[], dtype: DType): Tensor {
    return new DryTensor(Object.freeze([...shape]), dtype, null, null);
  }

  reshape(t: Tensor, shape: readonly number[]): Tensor {
    const x = shapes.reshape(this.checks, t, shape);
    return new DryTensor(Object.freeze([...shape]), x.dtype, null, x.owner);
  }

  async read(t: Tensor): Promise<Float32Array | Int32Array> {
    const x = t as DryTensor;
    const n = numel(x.shape);
    // the CPU backend copies through a private staging block, then into a new JS array; CUDA
    // widens a 16-bit tensor into an f32 pool block, copied to pinned host memory
    if (this.name === 'cpu') this.current.scratch(2 * n * 4);
    else if ((x.dtype === 'bf16' || x.dtype === 'f16') && n > 0) this.transient([n * 4]);
    return x.dtype === 'i32' ? new Int32Array(this.readBuffer(n * 4), 0, n) : new Float32Array(this.readBuffer(n * 4), 0, n);
  }

  /**
   * The dry run computes nothing, so what a read returns is never looked at: every read shares one
   * buffer (zeros, unless a caller wrote into an earlier read's array). A fresh array per read cost
   * most of a plan's time: a 128k-vocabulary model's logits are 0.5 MB a row, read at every step.
   */
  private readBuffer(bytes: number): ArrayBuffer {
    if (this.reads.byteLength < bytes) this.reads = new ArrayBuffer(Math.max(bytes, 2 * this.reads.byteLength));
    return this.reads;
  }

  free(t: Tensor): void {
    this.release(t as DryTensor);
  }
  async sync(): Promise<void> {}
  async close(): Promise<void> {
    this.scopes.clear();
  }
  beginScope(): void {
    this.scopes.begin();
  }
  endScope(keep: readonly Tensor[] = []): void {
    this.scopes.end(keep as DryTensor[]);
  }

  // ---- ops ---------------------------------------------------------------------------------

  embedding(table: Tensor, ids: Tensor, scale: number): Tensor {
    const { T, D } = shapes.embedding(this.checks, table, ids, scale);
    this.kernels += 1;
    return this.out([T, D]);
  }
  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor {
    const { M, N, K } = shapes.matmul(this.checks, x, w, bias);
    const y = this.out([M, N]);
    const fp8 = (w as DryTensor).owner.layout?.fp8;
    if (fp8) this.fp8MatmulCost(x, bias, M, N, K, fp8.colShift);
    else this.matmulCost(x, w.dtype, bias, M, N, K);
    return y;
  }

  /**
   * As cuda-fp8-weights.ts fp8Matmul: the FP8 GEMV at its rows (one kernel, no scratch); more rows
   * dequantize into a bf16 scratch held over the bf16 product
   */
  private fp8MatmulCost(x: Tensor, bias: Tensor | undefined, M: number, N: number, K: number, colShift: number): void {
    const g = this.cuda.gemv;
    const gemv = x.dtype === 'bf16' && !this.cuda.batchInvariant && M <= g.fp8GemvMaxRows
      ? gemvFp8Choice(M, N, K, colShift, g.fp8Gemv, g.fp8TcWarps) : undefined;
    if (gemv) {
      this.kernels += 1;
      return;
    }
    const at = this.current;
    const scratch = at.alloc(N * K * 2, false);
    this.kernels += 1;
    this.matmulCost(x, 'bf16', bias, M, N, K);
    at.release(scratch);
  }

  /** a matmul's kernels and scratch with a weight of `wDtype` */
  private matmulCost(x: Tensor, wDtype: DType, bias: Tensor | undefined, M: number, N: number, K: number): void {
    // the GEMM, a conversion of x when its dtype differs from w's, the f32 epilogue with a bias or a non-bf16 weight
    if (M > 0 && N > 0) this.kernels += 1 + (x.dtype !== wDtype ? 1 : 0) + (wDtype === 'bf16' && bias === undefined ? 0 : 1);
    this.packScratch(M, K);
    if (this.name === 'cuda' && M > 0 && N > 0 && K > 0) {
      // cuBLASLt takes x in w's dtype (a converted copy when they differ); an f32 accumulator
      // unless the weight is bf16 and there is no bias
      const sizes: number[] = [];
      if (x.dtype !== wDtype) sizes.push(M * K * dtypeBytes[wDtype]);
      const acc = !(wDtype === 'bf16' && bias === undefined);
      if (acc) sizes.push(M * N * 4);
      // gemm.ts tunes inside run(), after the converted x and the accumulator exist
      const rows = this.cudaTuning.byClass ? tuneClassOf(M) : M;
      const key = `${wDtype}.${acc ? 'f32' : 'bf16'}.${rows}.${N}.${K}`;
      const tune = this.gemmTune !== 'off' && M <= this.cudaTuning.maxM && this.arena === null &&
        (this.gemmTune === 'always' || !this.tuned.has(key));
      if (tune) this.tuned.add(key);
      this.transient(tune ? [...sizes, CUDA_L2_FLUSH_BYTES] : sizes);
    }
  }

  /** native/gemm_impl.h gemm_packed: x [M, K] copied into K-major panels for the op's duration */
  private packScratch(M: number, K: number): void {
    if (this.name !== 'cpu' || M <= ROWS_MAX_M) return;
    this.current.scratch(Math.ceil(M / PACK_WIDTH) * PACK_WIDTH * K * 4 + 64 + this.threads * PACK_THREAD_BYTES);
  }
  rmsnorm(x: Tensor, w: Tensor, eps: number, weightOffset: number): Tensor {
    shapes.rmsnorm(this.checks, x, w, eps, weightOffset);
    this.kernels += 1;
    return this.out(x.shape);
  }
  add(a: Tensor, b: Tensor, bScale: number): Tensor {
    shapes.add(this.checks, a, b, bScale);
    this.kernels += 1;
    return this.out(a.shape);
  }
  scale(x: Tensor, s: number): Tensor {
    shapes.scale(this.checks, x, s);
    this.kernels += 1;
    return this.out(x.shape);
  }
  glu(gate: Tensor, up: Tensor, act: Activation): Tensor {
    shapes.glu(this.checks, gate, up, act);
    this.kernels += 1;
    return this.out(gate.shape);
  }
  rope(x: Tensor, pos: Tensor, inv: Tensor, attentionScaling: number): Tensor {
    shapes.rope(this.checks, x, pos, inv, attentionScaling);
    this.kernels += inv.dtype !== 'f32' ? 2 : 1;
    const y = this.out(x.shape);
    if (this.name === 'cuda' && inv.dtype !== 'f32') this.transient([numel(inv.shape) * 4]);
    return y;
  }
  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
    shapes.writeKv(this.checks, kv, k, v, layout);
  }
  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor {
    const { H, KVH } = shapes.attention(this.checks, q, kv, layout, params);
    const G = H / KVH;
    // attention.ts (fast path): the plan kernel above ATT_DEC_INLINE_T tokens, the decode kernel, the combine of split keys
    this.kernels += (q.shape[0]! > 128 ? 1 : 0) + 2;
    // native/attention.c: each thread mallocs scores and pointers for one (token, kv head) item
    const y = this.out(q.shape);
    if (this.name === 'cpu') this.current.scratch(this.threads * ((G * ATTENTION_CHUNK + 2 * G) * 4 + 2 * ATTENTION_CHUNK * 8));
    return y;
  }
  softcap(x: Tensor, cap: number): Tensor {
    shapes.softcap(this.checks, x, cap);
    this.kernels += 1;
    return this.out(x.shape);
  }
  gatherRows(x: Tensor, idx: Tensor): Tensor {
    const { R, D } = shapes.gatherRows(this.checks, x, idx);
    this.kernels += 1;
    return this.out([R, D], x.dtype);
  }
  moeRoute(logits: Tensor, topK: number, _renorm: boolean): MoeRouting {
    const { T } = shapes.moeRoute(this.checks, logits, topK);
    this.kernels += 1;
    return { weights: this.out([T, topK], 'f32'), experts: this.out([T, topK], 'i32') };
  }
  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor {
    const { T, D, E, I, K } = shapes.moeFfn(this.checks, x, routing, gate, up, down, act);
    // backends/cuda/cuda-moe-ops.ts: bf16 experts with D and I multiples of 8 run grouped by expert
    // from CudaMoeSettings.groupedMinRows tokens (4 kernels a pass of up to passRows tokens, scratch
    // moeGroupedScratch), otherwise per (token, expert) pair (2 kernels, an f32 hidden [T K, I])
    const moe = this.cuda.moe;
    const grouped = this.name === 'cuda' && moeVecKernelsApply([gate.dtype], D, I) && moeRunsGrouped(T, E, K, moe);
    this.kernels += grouped ? 4 * Math.ceil(T / moe.passRows) : 2;
    const y = this.out([T, D]);
    // native/moe.c: per-call buckets (T*K + 2E int64) and gathered rows for the busiest expert
    // (at most T tokens): x [T, D], gate and up [T, I], expert output [T, D], all f32, plus the
    // packed copy of the largest matmul input
    if (grouped && D > 0) this.transient(moeGroupedScratch(T, K, D, I, moe));
    else if (this.name === 'cuda' && T > 0 && D > 0) this.transient([Math.max(T * K * I * 4, 4)]);
    if (this.name === 'cpu') {
      const packed = T > ROWS_MAX_M ? Math.ceil(T / PACK_WIDTH) * PACK_WIDTH * Math.max(D, I) * 4 + 64 + this.threads * PACK_THREAD_BYTES : 0;
      this.current.scratch((T * K + 2 * E + 3) * 8 + (2 * T * D + 2 * T * I + 4) * 4 + packed);
    }
    return y;
  }
}
