// The native CPU backend: validates in TypeScript, enqueues onto the native command queue.
//
// Ownership rules (Backend contract): tensors made by ops and `upload` belong to the innermost
// open scope; `zeros`, `load*` and views from `reshape` never do (they live until `free`). A kept
// view keeps the tensor it looks at. Memory is recycled in stream order by a BlockPool.
import type {
  Activation, AttentionParams, Backend, DType, MoeRouting, PagedKv, StepLayout, Tensor, WeightSource,
} from '../../contracts/backend.ts';
import { dtypeBytes } from '../../contracts/backend.ts';
import { type DeviceSampleRow, packSampleRows, sampleResultWidth } from '../../contracts/device-sampling.ts';
import { decodeHalf } from '../common/half.ts';
import { ScopeStack } from '../common/scopes.ts';
import { BlockPool } from './block-pool.ts';
import { CpuTensor } from './cpu-tensor.ts';
import { numel } from '../../contracts/backend.ts';
import { FenceWaiter } from './fence-waiter.ts';
import { ACT_CODE, DT_CODE, loadNativeLib, type NativeLib } from './native-lib.ts';
import { type CpuSettings, cpuSettingsFrom } from './cpu-settings.ts';
import {
  attentionParams, checkShape, describe, expectDim, expectFinite, moeShapes, opError, sameShape, tensorArg, weightRows,
} from './validate.ts';
import { readInto } from './weight-io.ts';

const F32: readonly DType[] = ['f32'];
const I32: readonly DType[] = ['i32'];
const WEIGHT: readonly DType[] = ['f32', 'f16', 'bf16'];
/** what the KV pools may hold: f32 (the default) or bf16 (half the bytes a decode step reads) */
const KV: readonly DType[] = ['f32', 'bf16'];
const ANY: readonly DType[] = ['f32', 'f16', 'bf16', 'i32'];
/** uploads up to this size are staged through the queue; larger ones get a fresh block */
const STAGED_UPLOAD_MAX = 1 << 20;

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
    const bytes = numel(shape) * dtypeBytes[dtype];
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
    this.assertOpen('upload');
    checkShape('upload', shape);
    if (!(data instanceof Int32Array) && !(data instanceof Float32Array)) {
      throw opError('upload', 'data must be a Float32Array or an Int32Array');
    }
    const dtype: DType = data instanceof Int32Array ? 'i32' : 'f32';
    if (numel(shape) !== data.length) {
      throw opError('upload', `shape [${shape.join(', ')}] has ${numel(shape)} elements but data has ${data.length}`);
    }
    const bytes = data.length * 4;
    const fresh = bytes > STAGED_UPLOAD_MAX;
    const t = this.make(shape, dtype, true, fresh);
    if (fresh) this.lib.writeNow(t.addr, data, bytes); // no queued op can know this block yet
    else if (this.lib.opUpload(t.addr, data, bytes) !== 0) throw opError('upload', 'out of memory for staging');
    return t;
  }

  async loadWeight(src: WeightSource, as: 'keep' | 'f32'): Promise<Tensor> {
    const n = src.shape[0] ?? 1;
    return this.loadRows('loadWeight', src, 0, src.shape.length === 0 ? 1 : n, as, src.shape);
  }

  async loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loadRows('loadWeightRows', src, rowStart, rows, as, weightRows(src, rowStart, rows));
  }

  private async loadRows(op: string, src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32',
    shape: readonly number[]): Promise<Tensor> {
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
    this.assertOpen('zeros');
    checkShape('zeros', shape);
    if (!ANY.includes(dtype)) throw opError('zeros', `unknown dtype ${dtype}`);
    const t = this.make(shape, dtype, false);
    this.lib.opZero(t.addr, t.bytes);
    return t;
  }

  reshape(t: Tensor, shape: readonly number[]): Tensor {
    const x = this.arg('reshape', 't', t, ANY);
    checkShape('reshape', shape);
    if (numel(shape) !== numel(x.shape)) {
      throw opError('reshape', `cannot view ${describe(x)} as [${shape.join(', ')}] (element counts differ)`);
    }
    return new CpuTensor(Object.freeze([...shape]), x.dtype, x.addr, x.bytes, x.owner, 0, this.id);
  }

  async read(t: Tensor): Promise<Float32Array | Int32Array> {
    this.assertOpen('read');
    const x = this.arg('read', 't', t, ANY);
    const n = numel(x.shape);
    // Copy through a private block in queue order: later ops (even ones enqueued while we wait)
    // cannot change what is read.
    const staging = this.lib.alloc(Math.max(x.bytes, 64));
    if (staging === 0) throw opError('read', `out of memory staging ${x.bytes} bytes`);
    try {
      this.lib.opCopy(x.addr, staging, x.bytes);
      await this.waitFor(this.lib.fence());
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

  /** Checks a pool and block list; returns [rows of the pool, bytes per block]. */
  private blockArgs(op: string, pool: Tensor, blocks: readonly number[]): { p: CpuTensor; rows: number; rowBytes: number } {
    const p = this.arg(op, 'pool', pool, ANY);
    if (p.shape.length === 0) throw opError(op, 'the pool must have at least one dimension');
    const rows = p.shape[0]!;
    if (!Array.isArray(blocks) && !ArrayBuffer.isView(blocks)) throw opError(op, 'blocks must be an array of block indices');
    for (const b of blocks) {
      if (!Number.isInteger(b) || b < 0 || b >= rows) throw opError(op, `block ${b} is outside [0, ${rows}) of pool ${describe(p)}`);
    }
    return { p, rows, rowBytes: numel(p.shape.slice(1)) * dtypeBytes[p.dtype] };
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
    const op = 'copyTensor';
    this.assertOpen(op);
    const x = this.arg(op, 't', t, ANY);
    const s = this.arg(op, 'src', src, ANY);
    if (x.dtype !== s.dtype || numel(x.shape) !== numel(s.shape)) {
      throw opError(op, `src ${describe(s)} does not match t ${describe(x)} (same dtype and element count)`);
    }
    if (x.bytes > 0) this.lib.opCopy(s.addr, x.addr, x.bytes);
  }

  free(t: Tensor): void {
    const x = this.arg('free', 't', t, ANY);
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
    const op = 'embedding';
    this.assertOpen(op);
    const tb = this.arg(op, 'table', table, WEIGHT, 2);
    const id = this.arg(op, 'ids', ids, I32, 1);
    expectFinite(op, 'scale', scale);
    const [V, D] = tb.shape as [number, number];
    const T = id.shape[0]!;
    const y = this.out([T, D]);
    this.lib.opEmbedding(tb.addr, id.addr, y.addr, T, V, D, DT_CODE[tb.dtype], scale);
    return y;
  }

  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor {
    const op = 'matmul';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32, 2);
    const b = this.arg(op, 'w', w, WEIGHT, 2);
    const [M, K] = a.shape as [number, number];
    const [N, Kw] = b.shape as [number, number];
    if (K !== Kw) throw opError(op, `x ${describe(a)} and w ${describe(b)} disagree on K (w is [N, K])`);
    let biasAddr = 0;
    if (bias !== undefined) {
      const c = this.arg(op, 'bias', bias, F32, 1);
      expectDim(op, 'bias length', c.shape[0]!, N, () => `w ${describe(b)}`);
      biasAddr = c.addr;
    }
    const y = this.out([M, N]);
    this.lib.opMatmul(a.addr, b.addr, biasAddr, y.addr, M, N, K, DT_CODE[b.dtype]);
    return y;
  }

  rmsnorm(x: Tensor, w: Tensor, eps: number, weightOffset: number): Tensor {
    const op = 'rmsnorm';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32);
    const g = this.arg(op, 'w', w, F32, 1);
    if (a.shape.length === 0) throw opError(op, 'x must have at least one dimension');
    const D = a.shape[a.shape.length - 1]!;
    expectDim(op, 'w length', g.shape[0]!, D, () => `last dim of x ${describe(a)}`);
    expectFinite(op, 'eps', eps);
    expectFinite(op, 'weightOffset', weightOffset);
    const y = this.out(a.shape);
    this.lib.opRmsnorm(a.addr, g.addr, y.addr, D === 0 ? 0 : numel(a.shape) / D, D, eps, weightOffset);
    return y;
  }

  add(a: Tensor, b: Tensor, bScale: number): Tensor {
    const op = 'add';
    this.assertOpen(op);
    const x = this.arg(op, 'a', a, F32);
    const z = this.arg(op, 'b', b, F32);
    if (!sameShape(x.shape, z.shape)) throw opError(op, `shapes differ: a ${describe(x)}, b ${describe(z)}`);
    expectFinite(op, 'bScale', bScale);
    const y = this.out(x.shape);
    this.lib.opAdd(x.addr, z.addr, y.addr, numel(x.shape), bScale);
    return y;
  }

  scale(x: Tensor, s: number): Tensor {
    const op = 'scale';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32);
    expectFinite(op, 's', s);
    const y = this.out(a.shape);
    this.lib.opScale(a.addr, y.addr, numel(a.shape), s);
    return y;
  }

  glu(gate: Tensor, up: Tensor, act: Activation): Tensor {
    const op = 'glu';
    this.assertOpen(op);
    const g = this.arg(op, 'gate', gate, F32);
    const u = this.arg(op, 'up', up, F32);
    if (!sameShape(g.shape, u.shape)) throw opError(op, `shapes differ: gate ${describe(g)}, up ${describe(u)}`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const y = this.out(g.shape);
    this.lib.opGlu(g.addr, u.addr, y.addr, numel(g.shape), code);
    return y;
  }

  rope(x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number): Tensor {
    const op = 'rope';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32, 3);
    const p = this.arg(op, 'pos', pos, I32, 1);
    const perToken = invFreq.shape.length === 2; // [T, half]: one table per token
    const f = this.arg(op, 'invFreq', invFreq, F32, perToken ? 2 : 1);
    const [T, H, D] = a.shape as [number, number, number];
    expectDim(op, 'pos length', p.shape[0]!, T, () => `x ${describe(a)} is [T, H, headDim]`);
    if (perToken) expectDim(op, 'invFreq rows', f.shape[0]!, T, () => `per-token invFreq ${describe(f)} needs one row per token`);
    const half = f.shape[f.shape.length - 1]!;
    if (2 * half > D) throw opError(op, `invFreq ${describe(f)} rotates ${2 * half} dims but headDim is ${D}`);
    expectFinite(op, 'attentionScaling', attentionScaling);
    const y = this.out(a.shape);
    this.lib.opRope(a.addr, p.addr, f.addr, y.addr, T, H, D, half, perToken ? half : 0, attentionScaling);
    return y;
  }

  /** Checks a KV pair of pools; returns [numBlocks, blockSize, kvHeads, headDim]. */
  private poolDims(op: string, kv: PagedKv, layout: StepLayout): [number, number, number, number] {
    const kp = this.arg(op, 'kv.k', kv.k, KV, 4);
    const vp = this.arg(op, 'kv.v', kv.v, KV, 4);
    if (!sameShape(kp.shape, vp.shape) || kp.dtype !== vp.dtype) throw opError(op, `kv.k ${describe(kp)} and kv.v ${describe(vp)} differ`);
    const dims = kp.shape as [number, number, number, number];
    expectDim(op, 'layout.blockSize', layout.blockSize, dims[1], () => `pool ${describe(kp)} is [blocks, blockSize, kvHeads, headDim]`);
    return dims;
  }

  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
    const op = 'writeKv';
    this.assertOpen(op);
    const [NB, BS, KVH, D] = this.poolDims(op, kv, layout);
    const kk = this.arg(op, 'k', k, F32, 3);
    const vv = this.arg(op, 'v', v, F32, 3);
    if (!sameShape(kk.shape, vv.shape)) throw opError(op, `k ${describe(kk)} and v ${describe(vv)} differ`);
    const T = kk.shape[0]!;
    if (kk.shape[1] !== KVH || kk.shape[2] !== D) {
      throw opError(op, `k ${describe(kk)} must be [T, ${KVH}, ${D}] to match the pool [${NB}, ${BS}, ${KVH}, ${D}]`);
    }
    const slots = this.arg(op, 'layout.slots', layout.slots, I32, 1);
    expectDim(op, 'layout.slots length', slots.shape[0]!, T, () => `k ${describe(kk)}`);
    this.lib.opWriteKv((kv.k as CpuTensor).addr, (kv.v as CpuTensor).addr, kk.addr, vv.addr, slots.addr, T, KVH * D,
      NB * BS, DT_CODE[kv.k.dtype]);
  }

  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor {
    const op = 'attention';
    this.assertOpen(op);
    const [NB, BS, KVH, D] = this.poolDims(op, kv, layout);
    const qq = this.arg(op, 'q', q, F32, 3);
    const [T, H, Dq] = qq.shape as [number, number, number];
    expectDim(op, 'q headDim', Dq, D, () => `pool ${describe(kv.k)}`);
    if (KVH === 0 || H % KVH !== 0) throw opError(op, `q heads ${H} is not a multiple of kv heads ${KVH}`);
    const row = this.arg(op, 'layout.tokenRow', layout.tokenRow, I32, 1);
    const pos = this.arg(op, 'layout.tokenPos', layout.tokenPos, I32, 1);
    const bt = this.arg(op, 'layout.blockTables', layout.blockTables, I32, 2);
    expectDim(op, 'layout.tokenRow length', row.shape[0]!, T, () => `q ${describe(qq)}`);
    expectDim(op, 'layout.tokenPos length', pos.shape[0]!, T, () => `q ${describe(qq)}`);
    attentionParams(op, params);
    const { scale, window, softcap } = params;
    const [R, MBR] = bt.shape as [number, number];
    const y = this.out(qq.shape);
    this.lib.opAttention(qq.addr, (kv.k as CpuTensor).addr, (kv.v as CpuTensor).addr, row.addr, pos.addr, bt.addr,
      y.addr, T, H, KVH, D, NB, BS, R, MBR, window, DT_CODE[kv.k.dtype], scale, softcap);
    return y;
  }

  softcap(x: Tensor, cap: number): Tensor {
    const op = 'softcap';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32);
    if (!Number.isFinite(cap) || cap <= 0) throw opError(op, `cap must be > 0, got ${cap}`);
    const y = this.out(a.shape);
    this.lib.opSoftcap(a.addr, y.addr, numel(a.shape), cap);
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
    this.lib.opGatherRows(a.addr, ix.addr, y.addr, R, T, D * dtypeBytes[a.dtype]);
    return y;
  }

  argmax(x: Tensor): Tensor {
    const op = 'argmax';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32, 2);
    const [R, V] = a.shape as [number, number];
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
    this.assertOpen(op);
    const a = this.arg(op, 'logits', logits, WEIGHT, 2);
    const [P, V] = a.shape as [number, number];
    if (rows.length !== P) throw opError(op, `${rows.length} rows for logits ${describe(a)}`);
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
    const op = 'moeRoute';
    this.assertOpen(op);
    const l = this.arg(op, 'logits', logits, F32, 2);
    const [T, E] = l.shape as [number, number];
    if (!Number.isSafeInteger(topK) || topK < 1 || topK > E) {
      throw opError(op, `topK must be an integer in [1, ${E}] for logits ${describe(l)}, got ${topK}`);
    }
    const weights = this.out([T, topK], 'f32');
    const experts = this.out([T, topK], 'i32');
    this.lib.opMoeRoute(l.addr, weights.addr, experts.addr, T, E, topK, renormalize ? 1 : 0);
    return { weights, experts };
  }

  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor {
    const op = 'moeFfn';
    this.assertOpen(op);
    const a = this.arg(op, 'x', x, F32, 2);
    const rw = this.arg(op, 'routing.weights', routing.weights, F32, 2);
    const re = this.arg(op, 'routing.experts', routing.experts, I32, 2);
    const g = this.arg(op, 'gate', gate, WEIGHT, 3);
    const u = this.arg(op, 'up', up, WEIGHT, 3);
    const d = this.arg(op, 'down', down, WEIGHT, 3);
    const { T, D, E, I, K } = moeShapes(op, a, rw, re, g, u, d);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const y = this.out([T, D]);
    this.lib.opMoeFfn(a.addr, rw.addr, re.addr, g.addr, u.addr, d.addr, y.addr, T, K, D, I, E,
      DT_CODE[g.dtype], DT_CODE[u.dtype], DT_CODE[d.dtype], code);
    return y;
  }
}

/** Loads the native library (build/libllmts_cpu.so) and returns a ready backend. */
export async function createCpuBackend(options: CpuBackendOptions = {}): Promise<CpuBackend> {
  const settings = cpuSettingsFrom(process.env, options.settings);
  return new CpuBackend(loadNativeLib(settings), settings);
}
