// A pool of fixed-size KV blocks: which physical blocks are free. The tensors live in the KV
// cache; this is only the bookkeeping, so it stays backend-free and cheap.

export class BlockPool {
  /** free block ids; allocation pops from the end (LIFO keeps recently used memory warm) */
  private readonly freeIds: number[];

  constructor(readonly numBlocks: number) {
    if (!Number.isInteger(numBlocks) || numBlocks <= 0) throw new Error(`BlockPool: bad size ${numBlocks}`);
    this.freeIds = Array.from({ length: numBlocks }, (_, k) => numBlocks - 1 - k);
  }

  get freeCount(): number {
    return this.freeIds.length;
  }
  get usedCount(): number {
    return this.numBlocks - this.freeIds.length;
  }

  canAllocate(n: number): boolean {
    return n <= this.freeIds.length;
  }

  /** Takes n blocks, or throws: callers check canAllocate first (admission decides, not us). */
  allocate(n: number): number[] {
    if (!this.canAllocate(n)) throw new Error(`KV block pool exhausted: need ${n}, ${this.freeIds.length} free`);
    return this.freeIds.splice(this.freeIds.length - n, n);
  }

  release(ids: Iterable<number>): void {
    for (const id of ids) {
      if (id < 0 || id >= this.numBlocks) throw new Error(`BlockPool.release: bad block ${id}`);
      this.freeIds.push(id);
    }
  }
}
