// Device-to-host reads of the CUDA backend (Backend.read, sync) and the KV block copies between
// device pools and host bytes (readBlocks, writeBlocks): a cache of pinned read buffers, the one
// place that waits on the stream and checks the device error word (turning a kernel's recorded
// index error into a rejection: KERNEL_ERRORS), and the gather/scatter kernel of whole blocks.
// Separate from cuda-backend.ts because these are the host transfers the ops never make.
import type { Tensor } from '../../contracts/backend.ts';
import { dtypeBytes, numel } from '../../contracts/backend.ts';
import { check } from './cuda-lib.ts';
import { ANY, type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid } from './cuda-op-context.ts';
import type { CudaTensor } from './cuda-tensor.ts';
import { sizeClass } from './device-pool.ts';
import type { PinnedBuffer } from './runtime.ts';
import { opError } from './validate.ts';

/** idle pinned read buffers kept for reuse, in bytes */
const READ_PIN_CACHE = 256 * 1024 * 1024;

const KERNEL_ERRORS: Record<number, (a: number, b: number, c: number) => string> = {
  1: (a, b, c) => `embedding: token id ${b} (token ${a}) is outside the table [0, ${c})`,
  2: (a, b, c) => `writeKv: slot ${b} (token ${a}) is outside the pool's ${c} slots`,
  3: (a, b, c) => `attention: token ${a} belongs to row ${b}, outside the block tables' ${c} rows`,
  4: (a, b, c) => `attention: row ${a} holds no block for position ${b} (block table entry ${c})`,
  5: (a, b, c) => `gatherRows: index ${b} (entry ${a}) is outside [0, ${c})`,
  6: (a, b, c) => `moeFfn: expert ${b} (token ${a}) is outside [0, ${c})`,
};

export class CudaReadback {
  private readonly readPins = new Map<number, PinnedBuffer[]>();
  private readPinBytes = 0;

  constructor(private readonly c: CudaOpContext) {}

  private pinnedForRead(bytes: number): PinnedBuffer {
    const cls = sizeClass(bytes);
    const b = this.readPins.get(cls)?.pop();
    if (b) {
      this.readPinBytes -= cls;
      return b;
    }
    return this.c.rt.hostAlloc(cls);
  }

  private returnPinned(b: PinnedBuffer): void {
    if (this.c.isClosed() || this.readPinBytes + b.bytes > READ_PIN_CACHE) {
      this.c.rt.hostFree(b);
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
      const rt = this.c.rt;
      const d = rt.d;
      if (bytes > 0) check(d.cuMemcpyDtoHAsync_v2(pin.addr, src, bytes, rt.stream), 'device-to-host copy');
      check(d.cuMemcpyDtoHAsync_v2(pin.addr + dataBytes, this.c.errWord, 16, rt.stream), 'error word copy');
      release?.();
      await rt.wait(rt.record());
      const err = new Int32Array(pin.view.buffer, pin.view.byteOffset + dataBytes, 4);
      if (err[0] !== 0) {
        const [code, a, b, c] = [err[0]!, err[1]!, err[2]!, err[3]!];
        check(d.cuMemsetD32Async(this.c.errWord, 0, 4, rt.stream), 'clearing the error word');
        const msg = KERNEL_ERRORS[code]?.(a, b, c) ?? `kernel error ${code} (${a}, ${b}, ${c})`;
        throw new Error(`cuda backend: op failed: ${msg}`);
      }
      return pin;
    } catch (e) {
      this.returnPinned(pin);
      throw e;
    }
  }

  /** `bytes` at device address `src` once everything enqueued before has run (a measurement's counters). */
  async readDevice(src: number, bytes: number): Promise<Uint8Array> {
    this.c.assertOpen('readDevice');
    this.c.assertNotCapturing('readDevice');
    const pin = await this.fetch(src, bytes);
    try {
      return new Uint8Array(pin.view.buffer, pin.view.byteOffset, bytes).slice();
    } finally {
      this.returnPinned(pin);
    }
  }

  /** Waits for everything enqueued so far; rejects on a kernel error (Backend.sync). */
  async waitStream(): Promise<void> {
    this.returnPinned(await this.fetch(0, 0));
  }

  async read(t: Tensor): Promise<Float32Array | Int32Array> {
    this.c.assertOpen('read');
    this.c.assertNotCapturing('read');
    const x = this.c.arg('read', 't', t, ANY);
    const n = numel(x.shape);
    let src = x.addr;
    let release: (() => void) | undefined;
    if ((x.dtype === 'bf16' || x.dtype === 'f16') && n > 0) {
      // widen on the device: the host then copies f32 out of pinned memory with no per-element loop
      const scratch = this.c.pool.alloc(n * 4).addr;
      this.c.convert(x.addr, x.dtype, scratch, 'f32', n);
      src = scratch;
      release = () => this.c.pool.release(scratch, n * 4);
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
    this.c.assertOpen(op);
    const p = this.c.arg(op, 'pool', pool, ANY);
    const per = this.blockBytes(op, p, blocks);
    const bytes = blocks.length * per;
    // gather the blocks into one device buffer in stream order (one kernel), then one copy to pinned memory
    const gathered = this.c.pool.alloc(bytes).addr;
    this.copyBlocks(p.addr, gathered, blocks, per, false);
    const pin = await this.fetch(gathered, bytes, () => this.c.pool.release(gathered, bytes));
    try {
      return pin.view.slice(0, bytes);
    } finally {
      this.returnPinned(pin);
    }
  }

  writeBlocks(pool: Tensor, blocks: readonly number[], data: Uint8Array): void {
    const op = 'writeBlocks';
    this.c.assertOpen(op);
    const p = this.c.arg(op, 'pool', pool, ANY);
    const per = this.blockBytes(op, p, blocks);
    if (new Set(blocks).size !== blocks.length) throw opError(op, 'blocks must be distinct');
    if (data.byteLength !== blocks.length * per) {
      throw opError(op, `${data.byteLength} bytes for ${blocks.length} blocks of ${per} bytes`);
    }
    if (data.byteLength === 0) return;
    // one copy into a device buffer (pageable source: the driver stages it before returning, so
    // `data` may change afterwards), then one kernel scatters the blocks into place
    const staged = this.c.pool.alloc(data.byteLength).addr;
    check(this.c.rt.d.cuMemcpyHtoDAsync_v2(staged, data, data.byteLength, this.c.rt.stream), op);
    this.copyBlocks(staged, p.addr, blocks, per, true);
    this.c.pool.release(staged, data.byteLength);
  }

  /** Enqueues gather (pool blocks -> packed) or scatter (packed -> pool blocks) of `per`-byte blocks. */
  private copyBlocks(src: number, dst: number, blocks: readonly number[], per: number, scatter: boolean): void {
    if (blocks.length === 0 || per === 0) return;
    const wide = per % 16 === 0 && src % 16 === 0 && dst % 16 === 0;
    const units = per / (wide ? 16 : 2);
    const idxBytes = blocks.length * 4;
    const idx = this.c.pool.alloc(idxBytes).addr;
    check(this.c.rt.d.cuMemcpyHtoDAsync_v2(idx, Int32Array.from(blocks), idxBytes, this.c.rt.stream), 'block indices');
    this.c.rt.launch('k_copy_blocks', elementwiseGrid(blocks.length * units), ELEMWISE_THREADS, 0, [
      ['p', src], ['p', dst], ['p', idx], ['p', blocks.length], ['p', units], ['i', wide ? 1 : 0], ['i', scatter ? 1 : 0]]);
    this.c.pool.release(idx, idxBytes);
  }

  /** Frees the cached pinned buffers; after the stream is idle (CudaBackend.close). */
  close(): void {
    for (const list of this.readPins.values()) for (const b of list) this.c.rt.hostFree(b);
    this.readPins.clear();
  }
}
