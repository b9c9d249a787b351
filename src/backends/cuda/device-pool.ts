// A stream-ordered caching allocator over cuMemAlloc (the idea of PyTorch's caching allocator,
// for one stream).
//
// Invariant that makes immediate reuse safe: every op runs on the backend's one stream, so a
// block released after op A is handed only to ops enqueued later, which run after A. The host
// never writes a device block directly (uploads are enqueued copies).
//
// Sizes are rounded up to classes (512 B steps up to 64 KiB, then 8 steps per power of two,
// <= 12.5% slack) so a decode step's intermediates find the previous step's blocks. Blocks above
// POOL_MAX (weights, KV pools) are exact-size; they, and idle blocks beyond CACHE_LIMIT, go back
// to the driver once the work enqueued before their release has run (an event per block).
import { check, describeCuResult, num, out64 } from './cuda-lib.ts';
import type { CudaRuntime } from './runtime.ts';

const POOL_MAX = 512 * 1024 * 1024;
const CACHE_LIMIT = 8 * 1024 * 1024 * 1024;
const CUDA_ERROR_OUT_OF_MEMORY = 2;

export function sizeClass(bytes: number): number {
  const b = Math.max(bytes, 512);
  if (b <= 65536) return Math.ceil(b / 512) * 512;
  const step = 2 ** (Math.floor(Math.log2(b)) - 3);
  return Math.ceil(b / step) * step;
}

export class DevicePool {
  private readonly idle = new Map<number, number[]>(); // class -> idle block addresses
  /** live blocks: address -> class (0 = exact-size, not pooled) */
  private readonly live = new Map<number, number>();
  private deferred: { addr: number; ev: number }[] = [];
  private idleBytes = 0;
  private liveBytes = 0;
  /** cuMemAlloc calls so far (a warm decode step should make none) */
  driverAllocs = 0;
  /**
   * While a graph is being captured, its allocations come from (and return to) this arena, never
   * the shared lists: a replay rewrites them, so no tensor outside the graph may ever get one.
   */
  private arena: { idle: Map<number, number[]>; owned: Map<number, number> } | null = null;
  /** bytes held by captured graphs */
  private graphBytes = 0;

  constructor(private readonly rt: CudaRuntime) {}

  /** A device block of at least `bytes` (256-byte aligned); `exact` = not from the size classes. */
  alloc(bytes: number, exact = false): { addr: number; cls: number } {
    if (this.arena) return this.arenaAlloc(this.arena, bytes);
    const pooled = !exact && bytes <= POOL_MAX;
    const cls = pooled ? sizeClass(bytes) : 0;
    if (pooled) {
      const addr = this.idle.get(cls)?.pop();
      if (addr !== undefined) {
        this.idleBytes -= cls;
        this.live.set(addr, cls);
        this.liveBytes += cls;
        return { addr, cls };
      }
    }
    const size = pooled ? cls : Math.max(bytes, 256);
    let addr = this.driverAlloc(size);
    if (addr === 0) {
      this.trim(); // give cached memory back and try once more
      addr = this.driverAlloc(size);
    }
    if (addr === 0) {
      const { free, total } = this.rt.memInfo();
      throw new Error(`cuda backend: out of device memory allocating ${bytes} bytes ` +
        `(${(free / 2 ** 30).toFixed(2)} GiB free of ${(total / 2 ** 30).toFixed(2)} GiB; ` +
        `${(this.liveBytes / 2 ** 30).toFixed(2)} GiB held by live tensors)`);
    }
    this.live.set(addr, cls);
    this.liveBytes += cls || size;
    return { addr, cls };
  }

  private arenaAlloc(arena: NonNullable<DevicePool['arena']>, bytes: number): { addr: number; cls: number } {
    const cls = sizeClass(bytes);
    let addr = arena.idle.get(cls)?.pop();
    if (addr === undefined) {
      addr = this.driverAlloc(cls, false);
      if (addr === 0) throw new Error(`cuda backend: out of device memory allocating ${bytes} bytes while capturing a graph`);
      arena.owned.set(addr, cls);
    }
    this.live.set(addr, cls);
    this.liveBytes += cls;
    return { addr, cls };
  }

  /** Routes allocations to a fresh arena until endArena (graph capture). */
  beginArena(): void {
    if (this.arena) throw new Error('cuda backend: a graph capture is already in progress');
    this.arena = { idle: new Map(), owned: new Map() };
  }

  /** Ends the arena; its blocks (live or not) now belong to the graph: free them with freeArena. */
  endArena(): { addr: number; bytes: number }[] {
    const arena = this.arena;
    if (!arena) throw new Error('cuda backend: no graph capture in progress');
    this.arena = null;
    for (const [addr, cls] of arena.owned) {
      if (this.live.delete(addr)) this.liveBytes -= cls;
      this.graphBytes += cls;
    }
    return [...arena.owned].map(([addr, bytes]) => ({ addr, bytes }));
  }

  /** Frees a graph's blocks once the work enqueued so far (its last replay included) has run. */
  freeArena(blocks: readonly { addr: number; bytes: number }[]): void {
    for (const b of blocks) {
      this.graphBytes -= b.bytes;
      this.deferred.push({ addr: b.addr, ev: this.rt.record() });
    }
  }

  private driverAlloc(bytes: number, reap = true): number {
    if (reap) this.reap();
    const p = out64();
    const rc = this.rt.d.cuMemAlloc_v2(p, bytes);
    if (rc === CUDA_ERROR_OUT_OF_MEMORY) return 0;
    check(rc, `cuMemAlloc(${bytes} bytes)`);
    this.driverAllocs++;
    return num(p);
  }

  /** Returns a block; ops enqueued before this call may still use it, later ones may reuse it. */
  release(addr: number, bytes: number): void {
    if (this.arena) {
      const own = this.arena.owned.get(addr);
      if (own === undefined) throw new Error('cuda backend: a graph body freed memory it did not allocate (it must not free inputs)');
      this.live.delete(addr);
      this.liveBytes -= own;
      let list = this.arena.idle.get(own);
      if (!list) this.arena.idle.set(own, (list = []));
      list.push(addr);
      return;
    }
    const cls = this.live.get(addr);
    if (cls === undefined) throw new Error(`cuda backend: releasing unknown block 0x${addr.toString(16)}`);
    this.live.delete(addr);
    this.liveBytes -= cls || Math.max(bytes, 256);
    if (cls !== 0 && this.idleBytes + cls <= CACHE_LIMIT) {
      let list = this.idle.get(cls);
      if (!list) this.idle.set(cls, (list = []));
      list.push(addr);
      this.idleBytes += cls;
    } else {
      this.deferred.push({ addr, ev: this.rt.record() });
    }
  }

  /** Frees the deferred blocks whose last use has run. */
  reap(): void {
    if (this.deferred.length === 0) return;
    const keep: { addr: number; ev: number }[] = [];
    for (const x of this.deferred) {
      if (this.rt.done(x.ev)) {
        this.rt.releaseEvent(x.ev);
        const rc = this.rt.d.cuMemFree_v2(x.addr);
        if (rc !== 0) throw new Error(`cuda backend: cuMemFree failed: ${describeCuResult(rc)}`);
      } else keep.push(x);
    }
    this.deferred = keep;
  }

  /** Waits for the stream (blocking: rare) and returns every idle and deferred block to the driver. */
  trim(): void {
    this.rt.syncBlocking();
    for (const list of this.idle.values()) for (const addr of list) this.rt.d.cuMemFree_v2(addr);
    this.idle.clear();
    this.idleBytes = 0;
    this.reap();
  }

  /** After the stream is idle: frees every block, live or idle (backend close). */
  releaseAll(): void {
    this.trim();
    for (const addr of this.live.keys()) this.rt.d.cuMemFree_v2(addr);
    this.live.clear();
    this.liveBytes = 0;
  }

  stats(): { liveBlocks: number; liveBytes: number; idleBytes: number; driverAllocs: number; graphBytes: number } {
    return { liveBlocks: this.live.size, liveBytes: this.liveBytes, idleBytes: this.idleBytes,
      driverAllocs: this.driverAllocs, graphBytes: this.graphBytes };
  }
}
