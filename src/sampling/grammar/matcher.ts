// One row's grammar state: an xgrammar GrammarMatcher plus the bitmask of its next token.
//
// Invariants: `mask()` always describes the state after every accepted token (it is recomputed
// lazily after each accept); a token the grammar rejects, or a state that allows nothing, is a
// GrammarRowError, which ends this row only. The matcher is a C++ object: `dispose()` frees it
// (the engine does so when the row finishes, however it finishes).

import type { XgInstance, XgMatcher } from './xgrammar-runtime.ts';
import type { GrammarVocab } from './vocab.ts';
import type { Utf8Guard } from './utf8.ts';

/** A row's grammar failed (rejected token, nothing allowed, engine failure): that row ends. */
export class GrammarRowError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GrammarRowError';
  }
}

export class RowGrammar {
  /** the current state's mask; valid while `maskValid` */
  private readonly maskBuf: Int32Array;
  private maskValid = false;
  private disposed = false;
  /** tokens accepted so far (jump-forward included) */
  accepted = 0;
  /** where the output stands inside a UTF-8 character (utf8.ts); 0 = between characters */
  private utf8State = 0;

  constructor(
    private readonly inst: XgInstance,
    private readonly matcher: XgMatcher,
    private readonly vocab: GrammarVocab,
    private readonly utf8: Utf8Guard,
    /** append forced text without sampling (see jumpForward) */
    readonly jumpForwardEnabled: boolean,
    /** called once, when the matcher is freed (the compiler counts the matchers each instance holds) */
    private readonly onDispose?: () => void,
  ) {
    this.maskBuf = new Int32Array((vocab.vocabSize + 31) >>> 5);
  }

  private call<T>(fn: () => T): T {
    if (this.disposed) throw new GrammarRowError('the grammar matcher was already released');
    try {
      return this.inst.call(fn);
    } catch (err) {
      throw new GrammarRowError(`grammar engine failure: ${(err as Error).message}`);
    }
  }

  /** The bitmask of tokens allowed next (owned here; valid until the next accept). */
  mask(): Int32Array {
    if (!this.maskValid) {
      const buf = this.maskBuf;
      this.call(() => {
        const v = this.matcher.GetNextTokenBitmask(this.vocab.vocabSize);
        try {
          buf.set(this.inst.binding.vecIntToView(v).subarray(0, buf.length));
        } finally {
          v.delete();
        }
      });
      let any = 0;
      if (this.utf8.trivial) for (let w = 0; w < buf.length; w++) any |= buf[w]!;
      else {
        const valid = this.utf8.masks[this.utf8State]!;
        for (let w = 0; w < buf.length; w++) any |= buf[w]! &= valid[w]!;
      }
      if (any === 0) throw new GrammarRowError('the grammar allows no token at this point (no token of the vocabulary can continue it)');
      this.maskValid = true;
    }
    return this.maskBuf;
  }

  /** Advances the grammar by one token; throws GrammarRowError when the grammar rejects it. */
  accept(id: number): void {
    const ok = this.call(() => this.matcher.AcceptToken(id, false));
    if (!ok) throw new GrammarRowError(`the grammar rejected token ${id} (${JSON.stringify(this.vocab.tokens[id] ?? '')})`);
    this.maskValid = false;
    this.accepted++;
    this.utf8State = this.utf8.next(this.utf8State, id);
  }

  /** True once a stop token was accepted: nothing more may follow. */
  get terminated(): boolean {
    return this.call(() => this.matcher.IsTerminated());
  }

  /**
   * True when the grammar is complete and allows nothing but a stop token: the row can end now
   * (saving the step that would only sample the stop token).
   */
  onlyStopAllowed(): boolean {
    if (this.terminated) return true;
    const m = this.mask();
    const stops = this.vocab.stopTokenIds;
    if (stops.length === 0) return false;
    let stopBits = 0;
    for (const s of stops) if (((m[s >>> 5]! >>> (s & 31)) & 1) === 1) stopBits++;
    if (stopBits === 0) return false;
    let allowed = 0;
    for (let w = 0; w < m.length && allowed <= stopBits; w++) {
      let x = m[w]!;
      while (x !== 0 && allowed <= stopBits) {
        x &= x - 1;
        allowed++;
      }
    }
    return allowed === stopBits;
  }

  /**
   * Jump-forward: when the grammar admits exactly one continuation for the next characters
   * (a constant key, a closing bracket), spells it with the tokenizer and accepts those tokens
   * without sampling; returns them (the caller appends them, and the catch-up rule computes them
   * as one prefill chunk). The last token of the spelling is left to the model, because in the
   * model's own tokenization it may merge with the text that follows; so a one-token span is not
   * jumped. At most `maxTokens` tokens.
   */
  jumpForward(maxTokens: number): number[] {
    if (!this.jumpForwardEnabled || maxTokens <= 0 || this.utf8State !== 0) return [];
    const text = this.call(() => this.matcher.FindJumpForwardString());
    if (text.length === 0) return [];
    const ids = this.vocab.encode(text);
    // the tokens must spell exactly the forced bytes (no prepended space, no special token)
    if (ids.length < 2 || !this.utf8.spells(ids, text)) return [];
    const take = Math.min(ids.length - 1, maxTokens);
    const out: number[] = [];
    for (let k = 0; k < take; k++) {
      const ok = this.call(() => this.matcher.AcceptToken(ids[k]!, false));
      if (!ok) break; // cannot happen for text the grammar produced; stop rather than guess
      this.maskValid = false;
      this.accepted++;
      this.utf8State = this.utf8.next(this.utf8State, ids[k]!);
      out.push(ids[k]!);
    }
    return out;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    if (!this.inst.broken) {
      try {
        this.matcher.delete();
      } catch {
        // a matcher of a failed instance: nothing to free
      }
    }
    this.onDispose?.();
  }
}
