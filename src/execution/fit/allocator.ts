// How a backend turns tensor allocations into resident memory, as a model the fit planner runs
// without a device. Two models:
//
//  PoolModel      a stream-ordered caching block pool, as both native backends implement one
//                 (backends/cpu/block-pool.ts, backends/cuda/device-pool.ts): requests up to
//                 poolMax bytes that are not `fresh` are rounded up to a size class and, when
//                 released, kept idle for reuse as long as the idle total stays under cacheLimit;
//                 `fresh` and larger requests are exact and go back to the system when released.
//                 CPU_POOL and CUDA_POOL hold each backend's parameters.
//  ExactModel     every request is its exact size and is freed when released (one step alone).
//
// What is resident differs: cuMemAlloc commits the whole class, but a CPU block is malloc'd
// memory whose pages become resident only when written, and a tensor writes only its own bytes
// of the class. So on the CPU a block is resident up to the largest tensor ever placed in it
// (measured: a 4128-token KV pool of 16.9 MB sits in a 21 MB class and adds 16.9 MB of RSS).
//
// Besides the resident peak of the simulated sequence of steps, the pool model tracks, per size
// class, the most blocks ever live at once. A pool that never frees a cached block ends up
// holding exactly that many blocks of every class once every step shape has run, so
// sum(maxLive[class] * resident per block) bounds what it can ever hold (the long-running server).

import { sizeClass as cpuSizeClass } from '../../backends/cpu/block-pool.ts';

export interface PoolParams {
  name: string;
  sizeClass: (bytes: number) => number;
  /** blocks above this are exact-size and never cached */
  poolMax: number;
  /** idle (cached) bytes above this are returned to the system */
  cacheLimit: number;
  /** smallest exact-size block */
  minExact: number;
  /** resident memory of a block is what was written into it (CPU), not its class (CUDA) */
  residentIsTouched: boolean;
}

/** backends/cpu/block-pool.ts */
export const CPU_POOL: PoolParams = {
  name: 'cpu', sizeClass: cpuSizeClass, poolMax: 256 * 2 ** 20, cacheLimit: 2 * 2 ** 30, minExact: 0, residentIsTouched: true,
};

/**
 * backends/cuda/device-pool.ts (its sizeClass: 512 B steps up to 64 KiB, then 8 steps per power
 * of two; copied here so planning never loads the CUDA driver bindings; test/fit checks they agree).
 */
export function cudaSizeClass(bytes: number): number {
  const b = Math.max(bytes, 512);
  if (b <= 65536) return Math.ceil(b / 512) * 512;
  const step = 2 ** (Math.floor(Math.log2(b)) - 3);
  return Math.ceil(b / step) * step;
}
export const CUDA_POOL: PoolParams = {
  name: 'cuda', sizeClass: cudaSizeClass, poolMax: 512 * 2 ** 20, cacheLimit: 8 * 2 ** 30, minExact: 256, residentIsTouched: false,
};

/** Resident bytes of one allocation of `bytes` that is fully written (KV pools, block tables). */
export function pooledBytes(p: PoolParams, bytes: number, fresh = false): number {
  if (bytes > p.poolMax || fresh) return Math.max(bytes, p.minExact);
  return p.residentIsTouched ? bytes : p.sizeClass(bytes);
}

export interface Block {
  /** bytes the block occupies (its class, or the exact size) */
  bytes: number;
  /** size class, 0 = exact (never cached) */
  cls: number;
  /** most bytes any tensor placed in this block has written */
  touched: number;
}

export interface AllocatorModel {
  alloc(bytes: number, fresh: boolean): Block;
  release(b: Block): void;
  /** memory outside the allocator held for the duration of one op (native scratch, staging) */
  scratch(bytes: number): void;
  /** live + cached bytes now */
  readonly resident: number;
  /** highest resident (+ scratch) since the last resetPeak */
  readonly peak: number;
  resetPeak(): void;
  /** the most this allocator can hold over any order of the steps simulated since resetPeak */
  worstCase(): number;
}

export class ExactModel implements AllocatorModel {
  private live = 0;
  private top = 0;
  alloc(bytes: number): Block {
    this.live += bytes;
    this.top = Math.max(this.top, this.live);
    return { bytes, cls: 0, touched: bytes };
  }
  release(b: Block): void {
    this.live -= b.bytes;
  }
  scratch(bytes: number): void {
    this.top = Math.max(this.top, this.live + bytes);
  }
  get resident(): number {
    return this.live;
  }
  get peak(): number {
    return this.top;
  }
  resetPeak(): void {
    this.top = this.live;
  }
  worstCase(): number {
    return this.top;
  }
}

export class PoolModel implements AllocatorModel {
  /** class bytes of live and idle blocks (what the pool's own cache limit counts) */
  private liveBytes = 0;
  private idleBytes = 0;
  /** resident bytes of every existing block, live or idle */
  private residentBytes = 0;
  private readonly idle = new Map<number, Block[]>(); // class -> idle blocks, last released on top
  private readonly liveCount = new Map<number, number>(); // class -> live blocks
  private readonly existing = new Map<number, number>(); // class -> live + idle blocks
  private readonly maxLive = new Map<number, number>(); // class -> most live at once since reset
  private readonly maxTouched = new Map<number, number>(); // class -> most bytes written to one block
  private exactLive = 0;
  /** bytes of live exact-size blocks as the pool counts them (their size, not what is resident) */
  private exactLiveBytes = 0;
  private top = 0;
  /** highest exact-size live + scratch since reset (never cached, so not part of maxLive) */
  private exactTop = 0;
  /** highest resident of live pooled blocks since reset */
  private pooledLiveTop = 0;
  private pooledLiveResident = 0;

  /** called after every allocation (a caller tracking the live high-water mark) */
  onChange?: () => void;

  constructor(readonly params: PoolParams) {}

  private residentOf(b: Block): number {
    return this.params.residentIsTouched ? b.touched : b.bytes;
  }

  alloc(bytes: number, fresh: boolean): Block {
    if (bytes > this.params.poolMax || fresh) {
      const n = Math.max(bytes, this.params.minExact);
      const b: Block = { bytes: n, cls: 0, touched: bytes };
      this.exactLive += this.residentOf(b);
      this.exactLiveBytes += b.bytes;
      this.residentBytes += this.residentOf(b);
      this.exactTop = Math.max(this.exactTop, this.exactLive);
      this.bump(0);
      this.onChange?.();
      return b;
    }
    const cls = this.params.sizeClass(bytes);
    let b = this.idle.get(cls)?.pop();
    if (b) {
      this.idleBytes -= cls;
      const before = this.residentOf(b);
      b.touched = Math.max(b.touched, bytes);
      this.residentBytes += this.residentOf(b) - before;
    } else {
      b = { bytes: cls, cls, touched: bytes };
      this.residentBytes += this.residentOf(b);
      this.existing.set(cls, (this.existing.get(cls) ?? 0) + 1);
    }
    this.liveBytes += cls;
    this.pooledLiveResident += this.residentOf(b);
    const n = (this.liveCount.get(cls) ?? 0) + 1;
    this.liveCount.set(cls, n);
    if (n > (this.maxLive.get(cls) ?? 0)) this.maxLive.set(cls, n);
    if (bytes > (this.maxTouched.get(cls) ?? 0)) this.maxTouched.set(cls, bytes);
    this.pooledLiveTop = Math.max(this.pooledLiveTop, this.pooledLiveResident);
    this.bump(0);
    this.onChange?.();
    return b;
  }

  release(b: Block): void {
    if (b.cls === 0) {
      this.exactLive -= this.residentOf(b);
      this.exactLiveBytes -= b.bytes;
      this.residentBytes -= this.residentOf(b);
      return;
    }
    this.liveBytes -= b.cls;
    this.pooledLiveResident -= this.residentOf(b);
    this.liveCount.set(b.cls, this.liveCount.get(b.cls)! - 1);
    if (this.idleBytes + b.cls <= this.params.cacheLimit) {
      let list = this.idle.get(b.cls);
      if (!list) this.idle.set(b.cls, (list = []));
      list.push(b);
      this.idleBytes += b.cls;
    } else {
      this.residentBytes -= this.residentOf(b);
      this.existing.set(b.cls, this.existing.get(b.cls)! - 1);
    }
  }

  scratch(bytes: number): void {
    this.bump(bytes);
    this.exactTop = Math.max(this.exactTop, this.exactLive + bytes);
  }

  private bump(extra: number): void {
    this.top = Math.max(this.top, this.residentBytes + extra);
  }

  get resident(): number {
    return this.residentBytes;
  }
  get peak(): number {
    return this.top;
  }
  /** class bytes of idle blocks (the pool's own accounting; backend memoryStats().idleBytes) */
  get idleClassBytes(): number {
    return this.idleBytes;
  }
  /** class bytes of live pooled blocks plus the size of live exact ones (backend memoryStats().liveBytes) */
  get liveClassBytes(): number {
    return this.liveBytes + this.exactLiveBytes;
  }

  resetPeak(): void {
    this.top = this.residentBytes;
    this.exactTop = this.exactLive;
    this.pooledLiveTop = this.pooledLiveResident;
    this.maxLive.clear();
    for (const [cls, n] of this.liveCount) if (n > 0) this.maxLive.set(cls, n);
  }

  /**
   * Pooled blocks: every class at its most-live count (what a never-freeing pool converges to),
   * each as resident as the largest tensor of its class made it, but never more than the
   * pooled live peak plus the idle cap; plus the exact-size peak. Blocks that exist now count
   * too: they exist whatever the order.
   */
  worstCase(): number {
    let pooled = 0;
    for (const cls of new Set([...this.maxLive.keys(), ...this.existing.keys()])) {
      const blocks = Math.max(this.maxLive.get(cls) ?? 0, this.existing.get(cls) ?? 0);
      pooled += blocks * (this.params.residentIsTouched ? (this.maxTouched.get(cls) ?? cls) : cls);
    }
    pooled = Math.min(pooled, this.pooledLiveTop + this.params.cacheLimit);
    return Math.max(this.top, pooled + this.exactTop);
  }
}
