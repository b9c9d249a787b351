// Prompt lookup (n-gram) drafts: the longest suffix of the sequence, between `min` and `max`
// tokens, that occurred earlier in it (prompt or output) proposes the tokens that followed its
// latest earlier occurrence. Copying text (editing a file, quoting the prompt, repeating a
// structure) is where it wins; it costs no model.
//
// Every n-gram of the sequence with min <= n <= max is indexed as it appears (one map per length:
// hash -> the latest position it ends before), so a proposal looks up the suffix of each length,
// longest first, and checks that occurrence's tokens (a hash collision costs a proposal, never a
// wrong one). Indexing a token costs O(max), a proposal O(max) lookups; the index holds one entry
// per distinct n-gram and length. A long prompt is indexed INDEX_PER_PROPOSAL positions a call
// (a 32k-token prompt in eight steps), so no step holds the event loop for all of it; until then
// a proposal looks only at what is indexed.

import type { Sequence } from '../sequence.ts';
import type { Draft, Proposer } from './method.ts';

/** positions a proposal indexes at most before it looks up the suffix */
const INDEX_PER_PROPOSAL = 4096;

export class NgramProposer implements Proposer {
  /** grams[n - min]: hash of the n tokens before position j -> the latest such j */
  private readonly grams: Map<number, number>[];
  /** positions j < this are indexed */
  private indexed = 1;

  constructor(
    readonly min: number,
    readonly max: number,
  ) {
    if (!(Number.isInteger(min) && min >= 1)) throw new RangeError(`ngram min must be an integer >= 1, got ${min}`);
    if (!(Number.isInteger(max) && max >= min)) throw new RangeError(`ngram max must be an integer >= ngram min (${min}), got ${max}`);
    this.grams = Array.from({ length: max - min + 1 }, () => new Map());
  }

  propose(seq: Sequence, max: number): Draft | undefined {
    const n = seq.known;
    if (max <= 0 || n <= this.min) return undefined;
    // the grams ending before j are indexed once t[j] (what followed them) is known
    const end = Math.min(n, this.indexed + INDEX_PER_PROPOSAL);
    for (; this.indexed < end; this.indexed++) {
      const j = this.indexed;
      this.eachGram(seq, j, (g, h) => this.grams[g]!.set(h, j));
    }
    const hashes: number[] = [];
    this.eachGram(seq, n, (g, h) => (hashes[g] = h));
    for (let g = hashes.length - 1; g >= 0; g--) {
      const j = this.grams[g]!.get(hashes[g]!);
      if (j !== undefined && this.matches(seq, j, n, g + this.min)) return this.following(seq, j, n, max);
    }
    return undefined;
  }

  /** Calls `fn(n - min, hash)` for every gram of min..max tokens that ends before position j. */
  private eachGram(seq: Sequence, j: number, fn: (g: number, hash: number) => void): void {
    let h = 0x811c9dc5;
    const longest = Math.min(this.max, j);
    for (let len = 1; len <= longest; len++) {
      h = Math.imul(h ^ seq.tokenAt(j - len), 0x01000193);
      if (len >= this.min) fn(len - this.min, h);
    }
  }

  /** true when the `len` tokens before j equal those before n */
  private matches(seq: Sequence, j: number, n: number, len: number): boolean {
    for (let i = 1; i <= len; i++) if (seq.tokenAt(j - i) !== seq.tokenAt(n - i)) return false;
    return true;
  }

  /** The tokens from j on, `max` at most, up to the end of what is known (n). */
  private following(seq: Sequence, j: number, n: number, max: number): Draft {
    const end = Math.min(j + max, n);
    const tokens: number[] = [];
    for (let p = j; p < end; p++) tokens.push(seq.tokenAt(p));
    return { tokens };
  }
}
