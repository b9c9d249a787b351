// One row's grammar state, as the engine sees it: synchronous calls over a matcher that lives on
// the row's grammar host (grammar-host.ts), with the bitmask of its next token.
//
// Pipelined: accept() posts the token and returns at once; the host applies it and computes what
// the next calls ask (accepted?, terminated, the jump-forward string, then the next bitmask), so
// by the time mask() or jumpForward() runs the answer is usually in the row's slot already; when
// it is not, the call waits for it (grammar-host-client.ts RowLink.wait, bounded). The UTF-8
// guard (utf8.ts) is applied here, to the mask read back.
//
// Invariants: `mask()` always describes the state after every accepted token; a token the
// grammar rejects, a state that allows nothing, or a host that failed is a GrammarRowError,
// which ends this row only. A token is checked against the mask of the state it is accepted in
// before it is sent (so a rejected token throws from accept(), as the grammar would refuse it).
// The matcher is a C++ object on the host: `dispose()` frees it (the engine does so when the
// row finishes, however it finishes).

import { F_FAILED, F_REJECTED, F_TERMINATED, S_FLAGS, S_MASK, S_STATUS, S_TOKEN, type Slot } from './grammar-host.ts';
import type { RowLink } from './grammar-host-client.ts';
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
  /** the current state's mask, UTF-8 guard applied; valid while `maskValid` */
  private readonly maskBuf: Int32Array;
  private maskValid = false;
  private disposed = false;
  /** a failure of the host or of the grammar: every later call throws it */
  private error?: GrammarRowError;
  /** operations sent to the host (its creation is the first): the answer the state needs */
  private sent = 1;
  /** tokens accepted so far (jump-forward included) */
  accepted = 0;
  /** where the output stands inside a UTF-8 character (utf8.ts); 0 = between characters */
  private utf8State = 0;

  constructor(
    private readonly link: RowLink,
    private readonly slot: Slot,
    private readonly vocab: GrammarVocab,
    private readonly utf8: Utf8Guard,
    /** append forced text without sampling (see jumpForward) */
    readonly jumpForwardEnabled: boolean,
    /** called once, when the matcher is freed (the compiler counts the matchers each host holds) */
    private readonly onDispose?: () => void,
  ) {
    this.maskBuf = new Int32Array(slot.mask.length);
  }

  /** Makes sure the host's answer for the current state is in the slot (`word`: S_STATUS or S_MASK); throws its failure. */
  private answer(word: number): void {
    if (this.disposed) throw new GrammarRowError('the grammar matcher was already released');
    if (this.error) throw this.error;
    const w = this.slot.words;
    const gone = this.link.dead();
    if (gone !== undefined) throw this.fail(gone);
    if (Atomics.load(w, word) < this.sent) {
      const why = this.link.wait(word, this.sent);
      if (why !== undefined) throw this.fail(why);
    }
    const flags = w[S_FLAGS]!;
    if (flags & F_FAILED) throw this.fail(this.slot.readText());
    if (flags & F_REJECTED) throw this.fail(this.rejection(w[S_TOKEN]!));
  }

  private fail(message: string): GrammarRowError {
    this.error = new GrammarRowError(message);
    return this.error;
  }

  private rejection(id: number): string {
    return `the grammar rejected token ${id} (${JSON.stringify(this.vocab.tokens[id] ?? '')})`;
  }

  /**
   * Resolves once the host's answers for the current state (its status, then its mask) are in the
   * slot, without blocking the thread; undefined when they already are, or when nothing can come
   * (the next call then fails as it would). The engine awaits it before a step whose rows need
   * their masks, so a slow host costs its rows' time, not the event loop's.
   */
  whenAnswered(): Promise<void> | undefined {
    if (this.disposed || this.error || this.maskValid) return undefined;
    return this.link.waitAsync(S_MASK, this.sent);
  }

  /** The bitmask of tokens allowed next (owned here; valid until the next accept). */
  mask(): Int32Array {
    if (this.error) throw this.error;
    if (!this.maskValid) {
      this.answer(S_MASK);
      const buf = this.maskBuf;
      const raw = this.slot.mask;
      let any = 0;
      if (this.utf8.trivial) {
        buf.set(raw);
        for (let w = 0; w < buf.length; w++) any |= buf[w]!;
      } else {
        const valid = this.utf8.masks[this.utf8State]!;
        for (let w = 0; w < buf.length; w++) any |= buf[w] = raw[w]! & valid[w]!;
      }
      if (any === 0) throw new GrammarRowError('the grammar allows no token at this point (no token of the vocabulary can continue it)');
      this.maskValid = true;
    }
    return this.maskBuf;
  }

  /** Advances the grammar by one token; throws GrammarRowError when the grammar rejects it. */
  accept(id: number): void {
    // the grammar's own mask of this state (before the UTF-8 guard): exactly what it accepts
    this.answer(S_MASK);
    const raw = this.slot.mask;
    const w = id >>> 5;
    if (!Number.isInteger(id) || id < 0 || w >= raw.length || ((raw[w]! >>> (id & 31)) & 1) === 0) throw new GrammarRowError(this.rejection(id));
    this.send([id]);
  }

  private send(ids: number[]): void {
    this.link.accept(ids);
    this.sent++;
    this.maskValid = false;
    this.accepted += ids.length;
    for (const id of ids) this.utf8State = this.utf8.next(this.utf8State, id);
  }

  /** True once a stop token was accepted: nothing more may follow. */
  get terminated(): boolean {
    this.answer(S_STATUS);
    return (this.slot.words[S_FLAGS]! & F_TERMINATED) !== 0;
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
   * (a constant key, a closing bracket), the host says what it is; it is spelled with the
   * tokenizer here and those tokens are accepted without sampling, as one batch; returns them
   * (the caller appends them, and the catch-up rule computes them as one prefill chunk). The
   * last token of the spelling is left to the model, because in the model's own tokenization it
   * may merge with the text that follows; so a one-token span is not jumped. At most `maxTokens`
   * tokens. Text the grammar forces is accepted by it: a token of it refused all the same ends
   * the row at its next call (a GrammarRowError).
   */
  jumpForward(maxTokens: number): number[] {
    const out = this.forcedTokens(maxTokens);
    if (out.length > 0) this.send(out);
    return out;
  }

  /**
   * The tokens jumpForward(maxTokens) would append now, without accepting them (a speculative
   * row ends its run of drafts where the plain path would append forced tokens instead).
   */
  forcedTokens(maxTokens: number): number[] {
    if (!this.jumpForwardEnabled || maxTokens <= 0 || this.utf8State !== 0) return [];
    this.answer(S_STATUS);
    if ((this.slot.words[S_FLAGS]! & F_TERMINATED) !== 0) return [];
    const text = this.slot.readText();
    if (text.length === 0) return [];
    const ids = this.vocab.encode(text);
    // the tokens must spell exactly the forced bytes (no prepended space, no special token)
    if (ids.length < 2 || !this.utf8.spells(ids, text)) return [];
    return ids.slice(0, Math.min(ids.length - 1, maxTokens));
  }

  /**
   * Whether the current state allows token `id`, when its mask is already in (undefined when the
   * host has not answered yet: asking would wait for it). The UTF-8 guard is not applied: a
   * speculative row uses it to cut a draft early, and the verify's masks decide.
   */
  allowsNow(id: number): boolean | undefined {
    if (this.disposed || this.error) return undefined;
    const w = this.slot.words;
    if (Atomics.load(w, S_MASK) < this.sent || (w[S_FLAGS]! & (F_FAILED | F_REJECTED | F_TERMINATED)) !== 0) return undefined;
    const raw = this.slot.mask;
    const word = id >>> 5;
    return Number.isInteger(id) && id >= 0 && word < raw.length && ((raw[word]! >>> (id & 31)) & 1) === 1;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.link.dispose();
    this.onDispose?.();
  }
}
