// A stream-ordered block pool over native memory (like cudaMallocAsync's pools).
//
// Invariant that makes immediate reuse safe: a block released after op A is handed only to ops
// enqueued later, which run after A (the queue is FIFO). Hence no host code may write a pooled
// block directly: uploads are staged and enqueued, reads copy through a fresh block.
//
// Sizes are rounded up to classes (64 B steps up to 4 KiB, then 4 steps per power of two, <= 25%
// slack) so a decode step's intermediates find last step's blocks. Blocks above POOL_MAX (KV
// pools, weights) are exact-size and go straight back to the system via an enqueued free.
import type { NativeLib } from './native-lib.ts';

const POOL_MAX = 256 * 1024 * 1024;
/** cached (idle) bytes above this are returned to the system instead of kept */
const CACHE_LIMIT = 2 * 1024 * 1024 * 1024;

export function sizeClass(bytes: number): number {
  const b = Math.max(bytes, 64);
  if (b <= 4096) return Math.ceil(b / 64) * 64;
  // step = 2^(floor(log2 b) - 2); clz32 is exact where log2 may round, for b < 2^31
  const step = b < 2 ** 31 ? 2 ** (29 - Math.clz32(b)) : 2 ** (Math.floor(Math.log2(b)) - 2);
  return Math.ceil(b / step) * step;
}

export class BlockPool {
  private readonly idle = new Map<number, number[]>(); // class -> idle block addresses
  /** live blocks: address -> class (0 = exact-size, not pooled) */
  private readonly live = new Map<number, number>();
  private idleBytes = 0;
  private liveBytes = 0;

  constructor(private readonly lib: NativeLib) {}

  /** A block of at least `bytes`; `fresh` = never a reused block (host may write it directly). */
  alloc(bytes: number, fresh = false): { addr: number; cls: number } {
    let cls = 0;
    let addr = 0;
    if (bytes <= POOL_MAX && !fresh) {
      cls = sizeClass(bytes);
      addr = this.idle.get(cls)?.pop() ?? 0;
      if (addr !== 0) this.idleBytes -= cls;
      else addr = this.lib.alloc(cls);
    } else {
      addr = this.lib.alloc(Math.max(bytes, 64));
    }
    if (addr === 0) throw new Error(`CPU backend: out of memory allocating ${bytes} bytes`);
    this.live.set(addr, cls);
    this.liveBytes += cls || bytes;
    return { addr, cls };
  }

  /** Returns a block; ops enqueued before this call may still read it, later ones may reuse it. */
  release(addr: number, bytes: number): void {
    const cls = this.live.get(addr);
    if (cls === undefined) throw new Error(`CPU backend: releasing unknown block 0x${addr.toString(16)}`);
    this.live.delete(addr);
    this.liveBytes -= cls || bytes;
    if (cls !== 0 && this.idleBytes + cls <= CACHE_LIMIT) {
      let list = this.idle.get(cls);
      if (!list) this.idle.set(cls, (list = []));
      list.push(addr);
      this.idleBytes += cls;
    } else {
      this.lib.opFree(addr);
    }
  }

  /** Enqueues frees of every idle block (live ones stay). */
  trim(): void {
    for (const list of this.idle.values()) for (const addr of list) this.lib.opFree(addr);
    this.idle.clear();
    this.idleBytes = 0;
  }

  /** Enqueues frees of every block, live or idle. */
  releaseAll(): void {
    this.trim();
    for (const addr of this.live.keys()) this.lib.opFree(addr);
    this.live.clear();
    this.liveBytes = 0;
  }

  stats(): { liveBlocks: number; liveBytes: number; idleBytes: number } {
    return { liveBlocks: this.live.size, liveBytes: this.liveBytes, idleBytes: this.idleBytes };
  }
}
