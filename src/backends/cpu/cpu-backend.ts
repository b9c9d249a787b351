// The native CPU backend: validates in TypeScript, enqueues onto the native command queue.
//
// Ownership rules (Backend contract): tensors made by ops and `upload` belong to the innermost
// open scope; `zeros`, `load*` and views from `reshape` never do (they live until `free`). A kept
// view keeps the tensor it looks at. Memory is recycled in stream order by a BlockPool.
import type {
  Activation, AttentionParams, Backend, DType, MoeRouting, PagedKv, QuantizedType, StepLayout, Tensor, WeightSource,
} from '../../contracts/backend.ts';
import { dtypeBytes, tensorBytes } from '../../contracts/backend.ts';
import { type DeviceSampleRow, packSampleRows, sampleResultWidth } from '../../contracts/device-sampling.ts';
import { decodeHalf } from '../common/half.ts';
import { ScopeStack } from '../common/scopes.ts';
import { BlockPool } from './block-pool.ts';
import { type CpuLayout, CpuTensor } from './cpu-tensor.ts';
import { numel } from '../../contracts/backend.ts';
import { FenceWaiter } from './fence-waiter.ts';
import {
  ACT_CODE, DT_BF16_P16, DT_CODE, DT_IQ4_XS_P16, DT_Q4_0_P16, DT_Q4_1_P16, DT_Q4_K_P16, DT_Q5_1_P16, DT_Q5_K_P16, DT_Q6_K_P16, DT_Q8_0_P16, ISA_AVX512_BF16, loadNativeLib, type NativeLib,
} from './native-lib.ts';
import { fromPanels, panelsOnlyWhereRead } from './weight-panels.ts';
import { type CpuSettings, cpuSettingsFrom } from './cpu-settings.ts';
import * as shapes from '../common/op-shapes.ts';
import { ANY, ANY_STORED } from '../common/op-shapes.ts';
import { checkShape, CPU_DTYPES, describe, opChecks, opError, sameShape, tensorArg, weightRows } from './validate.ts';
import { readInto } from './weight-io.ts';

const WEIGHT = CPU_DTYPES.weight;
/** what the KV pools may hold (CPU_DTYPES.kv) */
const KV = CPU_DTYPES.kv;
/** uploads up to this size are staged through the queue; larger ones get a fresh block */
const STAGED_UPLOAD_MAX = 1 << 20;
/** ggml types kept quantized: their panel layout, its native dtype code, the ggml block's bytes and weights */
const QUANTIZED: Record<QuantizedType, { layout: CpuLayout; code: number; blockBytes: number; blockSize: number }> = {
  Q8_0: { layout: 'q8_0', code: DT_Q8_0_P16, blockBytes: 34, blockSize: 32 },
  Q4_0: { layout: 'q4_0', code: DT_Q4_0_P16, blockBytes: 18, blockSize: 32 },
  Q4_K: { layout: 'q4_k', code: DT_Q4_K_P16, blockBytes: 144, blockSize: 256 },
  Q6_K: { layout: 'q6_k', code: DT_Q6_K_P16, blockBytes: 210, blockSize: 256 },
  Q5_K: { layout: 'q5_k', code: DT_Q5_K_P16, blockBytes: 176, blockSize: 256 },
  IQ4_XS: { layout: 'iq4_xs', code: DT_IQ4_XS_P16, blockBytes: 136, blockSize: 256 },
  Q4_1: { layout: 'q4_1', code: DT_Q4_1_P16, blockBytes: 20, blockSize: 32 },
  Q5_1: { layout: 'q5_1', code: DT_Q5_1_P16, blockBytes: 24, blockSize: 32 },
};
const QUANT_LAYOUT_CODE: Partial<Record<CpuLayout, number>> = Object.fromEntries(Object.values(QUANTIZED).map((q) => [q.layout, q.code]));
/** the native dtype code an op passes for a weight of `t`'s layout */
const weightCode = (t: CpuTensor): number =>
  t.layout === 'p16' ? DT_BF16_P16 : QUANT_LAYOUT_CODE[t.layout] ?? DT_CODE[t.dtype];

let nextBackendId = 1;

export interface CpuBackendOptions {
  /** knobs set in code (cpu-settings.ts); the others come from the environment */
  settings?: Partial<CpuSettings>;
}

export class CpuBackend implements Backend {
  readonly name = 'cpu' as const;
  readonly activationDtype: DType = 'f32';
  readonly kvDtypes: readonly DType[] = KV;
  private readonly id = nextBackendId++;
  /** this backend's tensors as the op rules check them (common/op-shapes.ts) */
  private readonly checks = panelsOnlyWhereRead(opChecks(this.id, (op) => this.assertOpen(op)));
  private readonly pool: BlockPool;
  private readonly scopes: ScopeStack<CpuTensor>;
  private readonly waiter: FenceWaiter;
  private closed = false;

  /** `settings`: what the backend was created with (the native library's process-wide knobs among them) */
  constructor(private readonly lib: NativeLib, readonly settings: CpuSettings) {
    this.pool = new BlockPool(lib);
    this.waiter = new FenceWaiter(lib);
    this.scopes = new ScopeStack<CpuTensor>((t) => this.release(t), (t) => t.owner);
  }

  // ---- bookkeeping -------------------------------------------------------------------------

  private assertOpen(op: string): void {
    if (this.closed) throw opError(op, 'the backend is closed');
  }

  /** A new owning tensor. `scoped`: adopt into the innermost scope; `fresh`: never a reused block. */
  private make(shape: readonly number[], dtype: DType, scoped: boolean, fresh = false): CpuTensor {
    const bytes = tensorBytes(shape, dtype);
    const { addr, cls } = this.pool.alloc(bytes, fresh);
    const t = new CpuTensor(Object.freeze([...shape]), dtype, addr, bytes, null, cls, this.id);
    if (scoped) this.scopes.adopt(t);
    return t;
  }

  private out(shape: readonly number[], dtype: DType = 'f32'): CpuTensor {
    return this.make(shape, dtype, true);
  }

  private release(t: CpuTensor): void {
    if (t.freed || t.isView) return;
    t.freed = true;
    this.pool.release(t.addr, t.bytes);
  }

  private arg(op: string, name: string, t: Tensor | undefined, dtypes: readonly DType[], rank?: number): CpuTensor {
    return tensorArg(op, name, t, this.id, dtypes, rank);
  }

  /** Live/idle memory of this backend (tests and diagnostics). */
  memoryStats(): { liveBlocks: number; liveBytes: number; idleBytes: number; scopeDepth: number } {
    return { ...this.pool.stats(), scopeDepth: this.scopes.depth };
  }

  // ---- memory ------------------------------------------------------------------------------

  upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor {
    const dtype = shapes.upload(this.checks, data, shape);
    const bytes = data.length * 4;
    const fresh = bytes > STAGED_UPLOAD_MAX;
    const t = this.make(shape, dtype, true, fresh);
    if (fresh) this.lib.writeNow(t.addr, data, bytes); // no queued op can know this block yet
    else if (this.lib.opUpload(t.addr, data, bytes) !== 0) throw opError('upload', 'out of memory for staging');
    return t;
  }

  async loadWeight(src: WeightSource, as: 'keep' | 'f32', use?: 'matmul'): Promise<Tensor> {
    if (use === 'matmul' && as === 'keep' && this.keepsQuantized(src)) return this.loadQuantized(src);
    const n = src.shape[0] ?? 1;
    const t = await this.loadRows('loadWeight', src, 0, src.shape.length === 0 ? 1 : n, as, src.shape);
    return use === 'matmul' && this.packsWeights(t) ? this.toPanels(t) : t;
  }

  async loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loadRows('loadWeightRows', src, rowStart, rows, as, weightRows(src, rowStart, rows));
  }

  private async loadRows(op: string, src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32',
    shape: readonly number[]): Promise<CpuTensor> {
    this.assertOpen(op);
    this.checkSource(op, src);
    const rowElems = numel(src.shape.slice(1));
    const dtype: DType = as === 'keep' ? src.dtype : 'f32';
    const t = this.make(shape, dtype, false, true);
    try {
      const sz = dtypeBytes[src.dtype];
      await readInto(this.lib, src, src.offset + rowStart * rowElems * sz, rows * rowElems * sz, t.addr, as === 'f32');
    } catch (e) {
      this.release(t);
      throw e;
    }
    return t;
  }

  /** bf16 matrices go into panels when the kernels in effect use AVX512-BF16, or always (CpuSettings.packWeights) */
  private packsWeights(t: CpuTensor): boolean {
    const mode = this.settings.packWeights;
    return mode !== 'off' && t.dtype === 'bf16' && t.shape.length === 2 && t.shape[1]! % 2 === 0 && t.shape[0]! > 0 &&
      (mode === 'on' || this.lib.isa() === ISA_AVX512_BF16);
  }

  /** GGUF Q8_0 / Q4_0 / Q4_1 / Q5_1 / Q4_K / Q5_K / Q6_K / IQ4_XS matrices stay quantized (CpuSettings.quantWeights) */
  private keepsQuantized(src: WeightSource): boolean {
    const q = src.quantized && QUANTIZED[src.quantized.type];
    return this.settings.quantWeights && q !== undefined && src.shape.length === 2 && src.shape[0]! > 0 &&
      src.shape[1]! > 0 && src.shape[1]! % q.blockSize === 0;
  }

  /** `src`'s ggml blocks, copied in and packed into quantized panels of 16 rows (native/quant_pack.c) */
  private async loadQuantized(src: WeightSource): Promise<CpuTensor> {
    const op = 'loadWeight';
    this.assertOpen(op);
    this.checkSource(op, src);
    const [N, K] = src.shape as [number, number];
    const q = QUANTIZED[src.quantized!.type];
    if (!q) throw opError(op, `${src.name}: ggml type ${src.quantized!.type} is not kept quantized`);
    let raw: Uint8Array;
    try {
      raw = src.quantized!.blocks();
    } catch (e) {
      throw new Error(`loading weight ${src.name} ([${N}, ${K}]) from ${src.path}: ${(e as Error).message}`);
    }
    const rawBytes = (N * K / q.blockSize) * q.blockBytes;
    if (raw.length !== rawBytes) {
      throw opError(op, `${src.name}: ${raw.length} bytes of ${src.quantized!.type} blocks for [${N}, ${K}], want ${rawBytes}`);
    }
    const staged = this.pool.alloc(rawBytes, true);
    this.lib.writeNow(staged.addr, raw, rawBytes); // a fresh block: no queued op knows it yet
    const bytes = this.lib.quantP16Bytes(N, K, q.code);
    const { addr, cls } = this.pool.alloc(bytes, true);
    this.lib.opPackQuant(staged.addr, addr, N, K, q.code);
    this.pool.release(staged.addr, rawBytes); // the queue runs the pack before any later use of the block
    return new CpuTensor(Object.freeze([N, K]), src.dtype, addr, bytes, null, cls, this.id, q.layout);
  }

  /** `t` (a bf16 [N][K] matrix, freed here) in panels of 16 rows (native/weight_pack.c) */
  private toPanels(t: CpuTensor): CpuTensor {
    const [N, K] = t.shape as [number, number];
    const bytes = this.lib.p16Bytes(N, K);
    const { addr, cls } = this.pool.alloc(bytes, true);
    this.lib.opPackBf16P16(t.addr, addr, N, K);
    this.release(t); // the queue runs the pack before any later use of the block
    return new CpuTensor(t.shape, 'bf16', addr, bytes, null, cls, this.id, 'p16');
  }

  async loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    this.assertOpen('loadStacked');
    if (srcs.length === 0) throw opError('loadStacked', 'no sources');
    const first = srcs[0]!;
    for (const s of srcs) {
      this.checkSource('loadStacked', s);
      if (!sameShape(s.shape, first.shape) || (as === 'keep' && s.dtype !== first.dtype)) {
        throw opError('loadStacked', `${s.name} is ${s.dtype}[${s.shape.join(', ')}] but ${first.name} is ` +
          `${first.dtype}[${first.shape.join(', ')}]`);
      }
    }
    const dtype: DType = as === 'keep' ? first.dtype : 'f32';
    const per = numel(first.shape);
    const t = this.make([srcs.length, ...first.shape], dtype, false, true);
    try {
      await Promise.all(srcs.map((s, i) =>
        readInto(this.lib, s, s.offset, per * dtypeBytes[s.dtype], t.addr + i * per * dtypeBytes[dtype], as === 'f32')));
    } catch (e) {
      this.release(t);
      throw e;
    }
    return t;
  }

  private checkSource(op: string, src: WeightSource): void {
    checkShape(op, src.shape);
    if (!WEIGHT.includes(src.dtype)) throw opError(op, `${src.name}: unsupported stored dtype ${src.dtype}`);
    if (!Number.isSafeInteger(src.offset) || src.offset < 0) throw opError(op, `${src.name}: bad offset ${src.offset}`);
  }

  zeros(shape: readonly number[], dtype: DType): Tensor {
    shapes.zeros(this.checks, shape, dtype);
    const t = this.make(shape, dtype, false);
    this.lib.opZero(t.addr, t.bytes);
    return t;
  }

  reshape(t: Tensor, shape: readonly number[]): Tensor {
    const x = shapes.reshape(this.checks, t, shape);
    return new CpuTensor(Object.freeze([...shape]), x.dtype, x.addr, x.bytes, x.owner, 0, this.id);
  }

  async read(t: Tensor): Promise<Float32Array | Int32Array> {
    this.assertOpen('read');
    const x = this.arg('read', 't', t, ANY);
    if (QUANT_LAYOUT_CODE[x.layout] !== undefined) return this.readQuantized(x);
    const n = numel(x.shape);
    // Copy through a private block in queue order: later ops (even ones enqueued while we wait)
    // cannot change what is read.
    const staging = this.lib.alloc(Math.max(x.bytes, 64));
    if (staging === 0) throw opError('read', `out of memory staging ${x.bytes} bytes`);
    try {
      this.lib.opCopy(x.addr, staging, x.bytes);
      await this.waitFor(this.lib.fence());
      if (x.layout === 'p16') {
        const words = new Uint32Array(x.bytes / 4);
        this.lib.readNow(staging, words, x.bytes);
        return fromPanels(words, x.shape[0]!, x.shape[1]!);
      }
      if (x.dtype === 'f16' || x.dtype === 'bf16') {
        const bits = new Uint16Array(n);
        this.lib.readNow(staging, bits, x.bytes);
        return decodeHalf(bits, x.dtype);
      }
      const out = x.dtype === 'i32' ? new Int32Array(n) : new Float32Array(n);
      this.lib.readNow(staging, out, x.bytes);
      return out;
    } finally {
      // freed once the copy has run: either we waited for it, or the wait failed after it ran
      this.lib.opFree(staging);
    }
  }

  /** A quantized weight's values (f32 [N, K], exact), through the embedding op's row dequantizer. */
  private async readQuantized(x: CpuTensor): Promise<Float32Array> {
    const [N, K] = x.shape as [number, number];
    const out = new Float32Array(N * K);
    const staging = this.lib.alloc(Math.max(out.byteLength, 64));
    const ids = this.lib.alloc(N * 4);
    if (staging === 0 || ids === 0) {
      if (staging) this.lib.freeNow(staging);
      if (ids) this.lib.freeNow(ids);
      throw opError('read', `out of memory staging ${out.byteLength} bytes`);
    }
    try {
      this.lib.writeNow(ids, Int32Array.from({ length: N }, (_, i) => i), N * 4); // fresh: no queued op knows it
      this.lib.opEmbedding(x.addr, ids, staging, N, N, K, weightCode(x), 1);
      await this.waitFor(this.lib.fence());
      this.lib.readNow(staging, out, out.byteLength);
      return out;
    } finally {
      this.lib.opFree(staging);
      this.lib.opFree(ids);
    }
  }

  /** Checks a pool and block list; returns [rows of the pool, bytes per block]. */
  private blockArgs(op: string, pool: Tensor, blocks: readonly number[]): { p: CpuTensor; rows: number; rowBytes: number } {
    const p = this.arg(op, 'pool', pool, ANY_STORED);
    if (p.shape.length === 0) throw opError(op, 'the pool must have at least one dimension');
    const rows = p.shape[0]!;
    if (!Array.isArray(blocks) && !ArrayBuffer.isView(blocks)) throw opError(op, 'blocks must be an array of block indices');
    for (const b of blocks) {
      if (!Number.isInteger(b) || b < 0 || b >= rows) throw opError(op, `block ${b} is outside [0, ${rows}) of pool ${describe(p)}`);
    }
    return { p, rows, rowBytes: p.bytes / rows };
  }

  async readBlocks(pool: Tensor, blocks: readonly number[]): Promise<Uint8Array> {
    const op = 'readBlocks';
    this.assertOpen(op);
    const { p, rows, rowBytes } = this.blockArgs(op, pool, blocks);
    const bytes = blocks.length * rowBytes;
    if (bytes === 0) return new Uint8Array(0);
    // gathered in queue order into a private block, as `read` does
    const staging = this.lib.alloc(bytes);
    if (staging === 0) throw opError(op, `out of memory staging ${bytes} bytes`);
    if (this.lib.opReadRows(p.addr, staging, Int32Array.from(blocks), blocks.length, rowBytes, rows) !== 0) {
      this.lib.freeNow(staging);
      throw opError(op, 'out of memory for the block list');
    }
    try {
      await this.waitFor(this.lib.fence());
      const out = new Uint8Array(bytes);
      this.lib.readNow(staging, out, bytes);
      return out;
    } finally {
      this.lib.opFree(staging);
    }
  }

  writeBlocks(pool: Tensor, blocks: readonly number[], data: Uint8Array): void {
    const op = 'writeBlocks';
    this.assertOpen(op);
    const { p, rows, rowBytes } = this.blockArgs(op, pool, blocks);
    if (new Set(blocks).size !== blocks.length) throw opError(op, 'blocks must be distinct');
    if (!(data instanceof Uint8Array)) throw opError(op, 'data must be a Uint8Array');
    if (data.byteLength !== blocks.length * rowBytes) {
      throw opError(op, `${data.byteLength} bytes given for ${blocks.length} blocks of ${rowBytes} bytes (pool ${describe(p)})`);
    }
    if (blocks.length === 0) return;
    if (this.lib.opWriteRows(p.addr, data, Int32Array.from(blocks), blocks.length, rowBytes, rows) !== 0) {
      throw opError(op, `out of memory staging ${data.byteLength} bytes`);
    }
  }

  copyTensor(t: Tensor, src: Tensor): void {
    const { t: x, src: s } = shapes.copyTensor(this.checks, t, src);
    if (x.bytes > 0) this.lib.opCopy(s.addr, x.addr, x.bytes);
  }

  free(t: Tensor): void {
    const x = this.arg('free', 't', t, ANY_STORED);
    if (x.isView) return; // views free nothing
    this.release(x);
  }

  sync(): Promise<void> {
    if (this.closed) return Promise.reject(opError('sync', 'the backend is closed'));
    return this.waitFor(this.lib.fence());
  }

  private waitFor(fence: number): Promise<void> {
    return this.waiter.wait(fence);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    try {
      await this.sync();
    } catch {
      // an op error is no reason to leak: release everything anyway
    }
    this.closed = true;
    this.pool.releaseAll();
    await this.waitFor(this.lib.fence()).catch(() => undefined);
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
    const y = this.out([T, D]);
    this.lib.opEmbedding(tb.addr, id.addr, y.addr, T, V, D, weightCode(tb), scale);
    return y;
  }

  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor {
    const { x: a, w: b, bias: c, M, N, K } = shapes.matmul(this.checks, x, w, bias);
    const y = this.out([M, N]);
    this.lib.opMatmul(a.addr, b.addr, c?.addr ?? 0, y.addr, M, N, K, weightCode(b));
    return y;
  }

  rmsnorm(x: Tensor, w: Tensor, eps: number, weightOffset: number): Tensor {
    const { x: a, w: g, D, rows } = shapes.rmsnorm(this.checks, x, w, eps, weightOffset);
    const y = this.out(a.shape);
    this.lib.opRmsnorm(a.addr, g.addr, y.addr, rows, D, eps, weightOffset);
    return y;
  }

  add(a: Tensor, b: Tensor, bScale: number): Tensor {
    const { a: x, b: z, n } = shapes.add(this.checks, a, b, bScale);
    const y = this.out(x.shape);
    this.lib.opAdd(x.addr, z.addr, y.addr, n, bScale);
    return y;
  }

  scale(x: Tensor, s: number): Tensor {
    const { x: a, n } = shapes.scale(this.checks, x, s);
    const y = this.out(a.shape);
    this.lib.opScale(a.addr, y.addr, n, s);
    return y;
  }

  glu(gate: Tensor, up: Tensor, act: Activation): Tensor {
    const { gate: g, up: u, n } = shapes.glu(this.checks, gate, up, act);
    const y = this.out(g.shape);
    this.lib.opGlu(g.addr, u.addr, y.addr, n, ACT_CODE[act]);
    return y;
  }

  rope(x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number): Tensor {
    const { x: a, pos: p, invFreq: f, T, H, D, half, perToken } = shapes.rope(this.checks, x, pos, invFreq, attentionScaling);
    const y = this.out(a.shape);
    this.lib.opRope(a.addr, p.addr, f.addr, y.addr, T, H, D, half, perToken ? half : 0, attentionScaling);
    return y;
  }

  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
    const { kPool, vPool, NB, BS, KVH, D, k: kk, v: vv, slots, T } = shapes.writeKv(this.checks, kv, k, v, layout);
    this.lib.opWriteKv(kPool.addr, vPool.addr, kk.addr, vv.addr, slots.addr, T, KVH * D, NB * BS, DT_CODE[kPool.dtype], D);
  }

  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor {
    const {
      kPool, vPool, NB, BS, KVH, D, q: qq, tokenRow: row, tokenPos: pos, blockTables: bt, T, H, R, MBR,
    } = shapes.attention(this.checks, q, kv, layout, params);
    const { scale, window, softcap } = params;
    const y = this.out(qq.shape);
    this.lib.opAttention(qq.addr, kPool.addr, vPool.addr, row.addr, pos.addr, bt.addr,
      y.addr, T, H, KVH, D, NB, BS, R, MBR, window, DT_CODE[kPool.dtype], scale, softcap);
    return y;
  }

  softcap(x: Tensor, cap: number): Tensor {
    const { x: a, n } = shapes.softcap(this.checks, x, cap);
    const y = this.out(a.shape);
    this.lib.opSoftcap(a.addr, y.addr, n, cap);
    return y;
  }

  gatherRows(x: Tensor, idx: Tensor): Tensor {
    const { x: a, idx: ix, T, D, R } = shapes.gatherRows(this.checks, x, idx);
    const y = this.out([R, D], a.dtype);
    this.lib.opGatherRows(a.addr, ix.addr, y.addr, R, T, D * dtypeBytes[a.dtype]);
    return y;
  }

  argmax(x: Tensor): Tensor {
    const { x: a, R, V } = shapes.argmax(this.checks, x);
    const y = this.out([R], 'i32');
    this.lib.opArgmax(a.addr, y.addr, R, V);
    return y;
  }

  /**
   * On-device sampling (contracts/device-sampling.ts): the rows travel packed, and the native op
   * samples on the worker thread in stream order (native/sampling.c), exactly as the reference
   * backend does in float64.
   */
  sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    const op = 'sampleRows';
    const { logits: a, P, V } = shapes.sampleRows(this.checks, logits, rows);
    const { words, k } = packSampleRows(rows, V); // RangeError on a bad row, as the reference's
    const W = sampleResultWidth(k);
    const y = this.out([P, W], 'i32');
    if (P === 0) return y;
    if (this.lib.opSampleRows(a.addr, DT_CODE[a.dtype], words, words.length, y.addr, P, V, W) !== 0) {
      throw opError(op, `out of memory staging ${words.byteLength} bytes of rows`);
    }
    return y;
  }

  moeRoute(logits: Tensor, topK: number, renormalize: boolean): MoeRouting {
    const { logits: l, T, E } = shapes.moeRoute(this.checks, logits, topK);
    const weights = this.out([T, topK], 'f32');
    const experts = this.out([T, topK], 'i32');
    this.lib.opMoeRoute(l.addr, weights.addr, experts.addr, T, E, topK, renormalize ? 1 : 0);
    return { weights, experts };
  }

  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor {
    const {
      x: a, weights: rw, experts: re, gate: g, up: u, down: d, T, D, E, I, K,
    } = shapes.moeFfn(this.checks, x, routing, gate, up, down, act);
    const y = this.out([T, D]);
    this.lib.opMoeFfn(a.addr, rw.addr, re.addr, g.addr, u.addr, d.addr, y.addr, T, K, D, I, E,
      DT_CODE[g.dtype], DT_CODE[u.dtype], DT_CODE[d.dtype], ACT_CODE[act]);
    return y;
  }
}

/** Loads the native library (build/libllmts_cpu.so) and returns a ready backend. */
export async function createCpuBackend(options: CpuBackendOptions = {}): Promise<CpuBackend> {
  const settings = cpuSettingsFrom(process.env, options.settings);
  return new CpuBackend(loadNativeLib(settings), settings);
}
