// Incremental detokenization: token ids in, text deltas out, correct for characters whose
// UTF-8 bytes are split across byte-level BPE tokens.
//
// Technique (vLLM detokenize_incrementally / TGI decode_token): keep two offsets into the ids,
//   prefixOffset .. readOffset  tokens already emitted, decoded again only as left context;
//   readOffset .. end           tokens not yet emitted.
// Each push decodes ids[prefixOffset..readOffset) and ids[prefixOffset..end) and emits the
// difference. Decoding a window with left context (not tokens one by one) keeps decoders that
// depend on neighbours (SentencePiece's leading-space "▁", cleanup rules) right, and the window
// spans only the tokens since the last emission, so a push costs O(window), not O(n).
// While the new text ends in U+FFFD the last character is still incomplete (a decoder renders
// a truncated UTF-8 sequence as U+FFFD): emit nothing and let the window grow. A U+FFFD that is
// followed by more text is real (invalid bytes) and is emitted as is; `flush` emits whatever is
// left at the end, U+FFFD included.
// Invariant: prefixOffset <= readOffset <= ids.length, and the emitted text so far equals
// decode(ids[0..readOffset)) when the decoder is context-free (byte-level BPE).

/** The tokenizer's decode (with skip_special_tokens etc. already bound). */
export type DecodeFn = (ids: number[]) => string;

export interface DetokenizerOptions {
  /**
   * Tokens before the first generated one (usually the prompt). Only the last few are decoded,
   * as left context, so the first generated token is rendered as it is in the full text.
   */
  contextTokens?: readonly number[];
  /** how many context tokens to use (vLLM: 5) */
  contextWindow?: number;
}

const REPLACEMENT = '\uFFFD';

export class IncrementalDetokenizer {
  private readonly ids: number[];
  private prefixOffset: number;
  private readOffset: number;
  private emitted = '';

  constructor(
    private readonly decode: DecodeFn,
    opts: DetokenizerOptions = {},
  ) {
    const window = opts.contextWindow ?? 5;
    const ctx = opts.contextTokens ?? [];
    this.ids = ctx.slice(Math.max(0, ctx.length - window));
    this.prefixOffset = 0;
    this.readOffset = this.ids.length;
  }

  /** All text emitted so far (the concatenation of every returned delta). */
  get text(): string {
    return this.emitted;
  }

  /** Adds one generated token; returns the text it completes ('' while a character is split). */
  push(id: number): string {
    this.ids.push(id);
    return this.advance(false);
  }

  /**
   * Adds several tokens (a speculative step); returns their combined delta. Token by token, so
   * complete text before a split character is not held back with it.
   */
  pushMany(ids: readonly number[]): string {
    let out = '';
    for (const id of ids) out += this.push(id);
    return out;
  }

  /** End of stream: emits what was held back, U+FFFD included if the bytes really are invalid. */
  flush(): string {
    return this.advance(true);
  }

  private advance(final: boolean): string {
    if (this.readOffset === this.ids.length) return '';
    const prefixText = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const newText = this.decode(this.ids.slice(this.prefixOffset));
    // newText.length <= prefixText.length: the new tokens decoded to nothing yet (a skipped
    // special token, or a lone lead byte some decoders drop); wait for more.
    if (newText.length <= prefixText.length) return '';
    if (!final && newText.endsWith(REPLACEMENT)) return '';
    const delta = newText.slice(prefixText.length);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    // Drop ids no longer needed as context so memory stays O(window), not O(generated).
    if (this.prefixOffset > 0) {
      this.ids.splice(0, this.prefixOffset);
      this.readOffset -= this.prefixOffset;
      this.prefixOffset = 0;
    }
    this.emitted += delta;
    return delta;
  }
}
