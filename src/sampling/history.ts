// Token counts a request's penalties read, kept incrementally.
//
// Penalties need "which tokens appeared" (repetition: prompt + output) and "how often each
// generated token appeared" (presence/frequency: output only). Rescanning the history every
// step would cost O(length); instead the engine pushes each accepted token once, and the
// penalty pass walks only the distinct ids (O(distinct) per step, independent of the vocab).

export class TokenHistory {
  /** every accepted output token, in order (owned here so truncate can undo counts) */
  private readonly output: number[] = [];
  /** output token id -> occurrences in `output`; an id is present only while its count > 0 */
  private readonly outputCounts = new Map<number, number>();
  /** distinct prompt ids */
  private readonly promptIds: Set<number>;
  /** distinct ids of prompt ∪ output: what repetition penalty touches */
  private readonly seenIds: Set<number>;

  constructor(promptTokens: Iterable<number> = []) {
    this.promptIds = new Set(promptTokens);
    this.seenIds = new Set(this.promptIds);
  }

  /** Records one generated token. O(1). */
  push(id: number): void {
    this.output.push(id);
    this.outputCounts.set(id, (this.outputCounts.get(id) ?? 0) + 1);
    this.seenIds.add(id);
  }

  /**
   * Drops generated tokens beyond `length` (speculative decoding rejects drafted tokens).
   * O(removed tokens).
   */
  truncate(length: number): void {
    while (this.output.length > length) {
      const id = this.output.pop()!;
      const c = this.outputCounts.get(id)! - 1;
      if (c > 0) {
        this.outputCounts.set(id, c);
      } else {
        this.outputCounts.delete(id);
        if (!this.promptIds.has(id)) this.seenIds.delete(id);
      }
    }
  }

  /** Number of generated tokens so far. */
  get outputLength(): number {
    return this.output.length;
  }

  /** The generated tokens (read-only view; do not hold across push/truncate). */
  get outputTokens(): readonly number[] {
    return this.output;
  }

  /** Occurrences of `id` among generated tokens. */
  count(id: number): number {
    return this.outputCounts.get(id) ?? 0;
  }

  /** Distinct generated ids with their counts (> 0). */
  outputCountEntries(): IterableIterator<[number, number]> {
    return this.outputCounts.entries();
  }

  /** Distinct ids of prompt and output together. */
  seen(): ReadonlySet<number> {
    return this.seenIds;
  }
}
