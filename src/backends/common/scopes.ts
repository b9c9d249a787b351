// Scope bookkeeping shared by backends (see Backend.beginScope/endScope).
//
// Invariants: a tensor belongs to at most one scope, the innermost one open when it was created;
// `end(keep)` moves the kept tensors (and, for a kept view, the tensor owning its memory) to the
// enclosing scope, or leaves them unowned when none is open, and releases the rest.

export class ScopeStack<T extends object> {
  private readonly stack: Set<T>[] = [];

  /**
   * @param release frees one tensor (called once per owned tensor still alive at scope end)
   * @param ownerOf the tensor owning t's memory (t itself unless t is a view)
   */
  constructor(
    private readonly release: (t: T) => void,
    private readonly ownerOf: (t: T) => T,
  ) {}

  get depth(): number {
    return this.stack.length;
  }

  begin(): void {
    this.stack.push(new Set());
  }

  /** Records a newly created tensor in the innermost scope, if any. */
  adopt(t: T): void {
    if (this.stack.length > 0) this.stack[this.stack.length - 1]!.add(t);
  }

  end(keep: readonly T[] = []): void {
    const top = this.stack.pop();
    if (!top) throw new Error('endScope: no scope is open (endScope without a matching beginScope)');
    const parent = this.stack[this.stack.length - 1];
    for (const k of keep) {
      for (const t of [k, this.ownerOf(k)]) {
        if (top.delete(t)) parent?.add(t);
      }
    }
    for (const t of top) this.release(t);
  }

  /** Releases everything still owned by open scopes (backend close). */
  clear(): void {
    while (this.stack.length > 0) this.end();
  }
}
