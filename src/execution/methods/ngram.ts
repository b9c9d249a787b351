// Prompt lookup (n-gram) drafts: the longest suffix of the sequence, between `min` and `max`
// tokens, that occurred earlier in it (prompt or output) proposes the tokens that followed that
// occurrence. Copying text (editing a file, quoting the prompt, repeating a structure) is where it
// wins; it costs no model.
//
// The sequence's min-grams are indexed as they appear (hash -> the positions they end at), so a
// proposal looks only at earlier occurrences of the last `min` tokens, most recent first, and
// extends each match backwards up to `max`. The longest wins; among equal lengths, the most
// recent. At most SCAN occurrences are looked at, so a common n-gram in a long sequence costs no
// more than a rare one.

import type { Sequence } from '../sequence.ts';
import type { Draft, Proposer } from './method.ts';

/** earlier occurrences of the suffix's min-gram looked at per proposal, most recent first */
const SCAN = 32;

export class NgramProposer implements Proposer {
  /** hash of the min-gram ending before position j -> the positions j, ascending */
  private readonly index = new Map<number, number[]>();
  /** positions j < this are indexed */
  private indexed: number;

  constructor(
    readonly min: number,
    readonly max: number,
  ) {
    if (!(Number.isInteger(min) && min >= 1)) throw new RangeError(`ngram min must be an integer >= 1, got ${min}`);
    if (!(Number.isInteger(max) && max >= min)) throw new RangeError(`ngram max must be an integer >= ngram min (${min}), got ${max}`);
    this.indexed = min;
  }

  propose(seq: Sequence, max: number): Draft | undefined {
    const n = seq.known;
    if (max <= 0 || n <= this.min) return undefined;
    // a gram ending before j is indexed once t[j] (what followed it) is known
    for (; this.indexed < n; this.indexed++) {
      const h = this.hashBefore(seq, this.indexed);
      const at = this.index.get(h);
      if (at) at.push(this.indexed);
      else this.index.set(h, [this.indexed]);
    }
    const at = this.index.get(this.hashBefore(seq, n));
    if (!at) return undefined;
    let best = -1, bestLength = 0;
    for (let c = at.length - 1; c >= Math.max(0, at.length - SCAN); c--) {
      const j = at[c]!;
      let length = 0;
      while (length < this.max && j - 1 - length >= 0 && seq.tokenAt(j - 1 - length) === seq.tokenAt(n - 1 - length)) length++;
      if (length > bestLength) {
        best = j;
        bestLength = length;
        if (length === this.max) break;
      }
    }
    if (bestLength < this.min) return undefined; // a hash collision
    const end = Math.min(best + max, n);
    const tokens: number[] = [];
    for (let p = best; p < end; p++) tokens.push(seq.tokenAt(p));
    return { tokens };
  }

  /** A hash of the `min` tokens before position `j`. */
  private hashBefore(seq: Sequence, j: number): number {
    let h = 0x811c9dc5;
    for (let p = j - this.min; p < j; p++) h = Math.imul(h ^ seq.tokenAt(p), 0x01000193);
    return h;
  }
}
