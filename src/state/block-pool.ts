// A pool of fixed-size KV blocks: which physical blocks are free, who references them, and which
// hold a cached prefix block. The tensors live in the KV cache; this is only the bookkeeping, so
// it stays backend-free and cheap.
//
// Every block is in exactly one state:
//   free       on `freeIds`, content meaningless
//   in use     refs > 0 (several sequences may share a cached block: refs counts them)
//   evictable  refs == 0 but it holds a hashed (full, computed) prefix block: kept on the LRU so a
//              later sequence with the same prefix can take it back; allocation evicts the least
//              recently released one when `freeIds` is empty.
// `available` = free + evictable: what allocation can hand out. A shared block is in use once,
// never counted as available.

export class BlockPool {
  /** free block ids; allocation pops from the end (LIFO keeps recently used memory warm) */
  private readonly freeIds: number[];
  private readonly refs: Int32Array;
  /** hashOf[block] = the prefix hash its content is registered under, if any */
  private readonly hashOf: (string | undefined)[];
  private readonly byHash = new Map<string, number>();
  /** refs == 0 blocks that keep their hash, least recently released first (Map keeps insertion order) */
  private readonly lru = new Map<number, true>();
  /** most evictable blocks kept; beyond it the oldest go back to the free list (0 = keep none) */
  private evictableCap: number;
  /** evictable blocks dropped so far (LRU or over the cap) */
  evictions = 0;
  /**
   * Called with an evictable block's hash just before allocation or the cap drops it, while its
   * content is still intact: a reader enqueued now (backend ops run in order) sees it before any
   * later op reuses the block. The SSD tier saves prefixes that were never spilled this way.
   */
  onEvict?: (hash: string) => void;

  constructor(readonly numBlocks: number, evictableCap = 0) {
    if (!Number.isInteger(numBlocks) || numBlocks <= 0) throw new Error(`BlockPool: bad size ${numBlocks}`);
    this.freeIds = Array.from({ length: numBlocks }, (_, k) => numBlocks - 1 - k);
    this.refs = new Int32Array(numBlocks);
    this.hashOf = new Array(numBlocks);
    this.evictableCap = Math.max(0, Math.floor(evictableCap));
  }

  /** blocks allocation can hand out: free + evictable */
  get freeCount(): number {
    return this.freeIds.length + this.lru.size;
  }
  /** blocks referenced by at least one sequence */
  get usedCount(): number {
    return this.numBlocks - this.freeCount;
  }
  /** evictable cached blocks (refs == 0, content kept) */
  get cachedCount(): number {
    return this.lru.size;
  }
  /** blocks holding a registered prefix hash, in use or evictable */
  get hashedCount(): number {
    return this.byHash.size;
  }
  get maxCached(): number {
    return this.evictableCap;
  }

  canAllocate(n: number): boolean {
    return n <= this.freeCount;
  }

  /** Takes n blocks (refs = 1 each), evicting cached ones when the free list runs out; or throws: admission decides, not us. */
  allocate(n: number): number[] {
    if (!this.canAllocate(n)) throw new Error(`KV block pool exhausted: need ${n}, ${this.freeCount} free`);
    const out: number[] = [];
    for (let k = 0; k < n; k++) {
      if (this.freeIds.length === 0) this.evict(this.lru.keys().next().value as number); // the least recently released
      const id = this.freeIds.pop()!;
      this.refs[id] = 1;
      out.push(id);
    }
    return out;
  }

  /**
   * Drops one reference to each block. A block nobody references any more becomes evictable when
   * it holds a hash (and the cap allows), else free. Release a sequence's blocks tail first, so
   * the LRU evicts the ends of prefixes before their beginnings.
   */
  release(ids: Iterable<number>): void {
    for (const id of ids) {
      if (!Number.isInteger(id) || id < 0 || id >= this.numBlocks) throw new Error(`BlockPool.release: bad block ${id}`);
      if (this.refs[id] <= 0) throw new Error(`BlockPool.release: block ${id} is not in use`);
      if (--this.refs[id] > 0) continue;
      if (this.hashOf[id] !== undefined && this.evictableCap > 0) this.lru.set(id, true);
      else this.free(id);
    }
    this.trim();
  }

  /** The block registered under `hash`, if any (in use or evictable). */
  lookup(hash: string): number | undefined {
    return this.byHash.get(hash);
  }

  /** Takes a reference to a hashed block (found with `lookup`), taking it off the LRU. */
  acquire(id: number): void {
    if (this.hashOf[id] === undefined) throw new Error(`BlockPool.acquire: block ${id} holds no cached prefix`);
    if (this.refs[id]++ === 0) this.lru.delete(id);
  }

  /**
   * Registers an in-use block's (now full and computed) content under `hash`. Returns false when
   * another block already holds that hash (two sequences computed the same prefix at once): this
   * one then stays private and is freed on release.
   */
  register(id: number, hash: string): boolean {
    if (this.refs[id] <= 0) throw new Error(`BlockPool.register: block ${id} is not in use`);
    if (this.evictableCap === 0 || this.byHash.has(hash) || this.hashOf[id] !== undefined) return false;
    this.byHash.set(hash, id);
    this.hashOf[id] = hash;
    return true;
  }

  hashOfBlock(id: number): string | undefined {
    return this.hashOf[id];
  }

  /** Changes the cap on evictable blocks; shrinking evicts the oldest at once. */
  setMaxCached(n: number): void {
    this.evictableCap = Math.max(0, Math.floor(n));
    this.trim();
  }

  /** Drops every evictable block (their content is forgotten); in-use blocks keep their hashes. */
  dropCached(): number {
    const n = this.lru.size;
    for (const id of [...this.lru.keys()]) this.drop(id);
    return n;
  }

  private trim(): void {
    while (this.lru.size > this.evictableCap) this.evict(this.lru.keys().next().value as number);
  }

  /** evictable -> free for room (counted, announced first) */
  private evict(id: number): void {
    this.onEvict?.(this.hashOf[id]!);
    this.drop(id);
    this.evictions++;
  }

  /** evictable -> free, forgetting its hash */
  private drop(id: number): void {
    this.lru.delete(id);
    this.free(id);
  }

  private free(id: number): void {
    const h = this.hashOf[id];
    if (h !== undefined) {
      this.byHash.delete(h);
      this.hashOf[id] = undefined;
    }
    this.freeIds.push(id);
  }
}
