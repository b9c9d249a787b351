// Keeps grammar-constrained output valid UTF-8.
//
// xgrammar 0.1.27 matches characters by their UTF-8 lead byte alone, so inside a string it lets a
// byte-level vocabulary spell overlong forms (C0 xx), surrogates (ED A0 xx) and "code points"
// past U+10FFFF (F5 xx xx xx): measured on a random model, a `maxLength: 6` string came out as
// bytes the decoder turns into nine U+FFFD. A row therefore also tracks where it stands inside
// a UTF-8 character (eight states, Unicode Table 3-7) and its mask is ANDed with the precomputed
// set of tokens whose bytes continue validly from that state: one more pass over the mask words.

import { byteLevelCharToByte } from '../../artifacts/byte-level.ts';
import type { GrammarVocab } from './vocab.ts';

/**
 * States: 0 = between characters; otherwise how many continuation bytes are still needed and the
 * range the next one must fall in.
 */
const NEED = [0, 1, 2, 2, 2, 3, 3, 3];
const LO = [0, 0x80, 0x80, 0xa0, 0x80, 0x80, 0x90, 0x80];
const HI = [0, 0xbf, 0xbf, 0xbf, 0x9f, 0xbf, 0xbf, 0x8f];
export const UTF8_STATES = 8;
const INVALID = -1;

/** The state after byte `b` from state `s`, or INVALID. */
export function utf8Step(s: number, b: number): number {
  if (s !== 0) {
    if (b < LO[s]! || b > HI[s]!) return INVALID;
    const need = NEED[s]! - 1;
    return need === 0 ? 0 : need === 1 ? 1 : 2;
  }
  if (b < 0x80) return 0;
  if (b >= 0xc2 && b <= 0xdf) return 1;
  if (b === 0xe0) return 3;
  if (b === 0xed) return 4;
  if (b >= 0xe1 && b <= 0xef) return 2;
  if (b === 0xf0) return 6;
  if (b === 0xf4) return 7;
  if (b >= 0xf1 && b <= 0xf3) return 5;
  return INVALID; // 80-BF without a lead, C0, C1, F5-FF
}


const utf8 = new TextEncoder();

/** The bytes each token stands for (null: special, never produced by a grammar). */
export function tokenBytes(vocab: GrammarVocab): (Uint8Array | null)[] {
  const table = vocab.vocabType === 'byte_level' ? byteLevelCharToByte() : undefined;
  return vocab.tokens.map((t) => {
    if (t === '') return null;
    if (table) {
      const out = new Uint8Array(t.length * 2);
      let n = 0;
      for (const ch of t) {
        const b = table.get(ch);
        if (b === undefined) return utf8.encode(t); // an added token stored as plain text
        out[n++] = b;
      }
      return out.slice(0, n);
    }
    if (vocab.vocabType === 'byte_fallback') {
      const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(t);
      if (m) return Uint8Array.of(parseInt(m[1]!, 16));
      return utf8.encode(t.replace(/\u2581/g, ' '));
    }
    return utf8.encode(t);
  });
}

/** Per-state masks of tokens that continue validly, and each token's bytes for state updates. */
export class Utf8Guard {
  /** masks[state]: bit set = the token's bytes are valid UTF-8 continuing from `state` */
  readonly masks: Int32Array[];
  private readonly bytes: (Uint8Array | null)[];
  /** true when no token can leave a character unfinished or break one (nothing to guard) */
  readonly trivial: boolean;

  constructor(vocab: GrammarVocab) {
    this.bytes = tokenBytes(vocab);
    const words = (vocab.vocabSize + 31) >>> 5;
    this.masks = Array.from({ length: UTF8_STATES }, () => new Int32Array(words).fill(-1));
    let trivial = true;
    for (let id = 0; id < this.bytes.length; id++) {
      const b = this.bytes[id];
      if (b === null || b === undefined) continue; // specials: the grammar decides
      for (let s = 0; s < UTF8_STATES; s++) {
        if (this.run(s, b) === INVALID) {
          this.masks[s]![id >>> 5]! &= ~(1 << (id & 31));
          if (s === 0) trivial = false;
        } else if (s === 0 && this.run(0, b) !== 0) trivial = false;
      }
    }
    this.trivial = trivial;
  }

  private run(s: number, b: Uint8Array): number {
    for (let i = 0; i < b.length && s !== INVALID; i++) s = utf8Step(s, b[i]!);
    return s;
  }

  /** True when the tokens' bytes, concatenated, are exactly `text` in UTF-8 (no special among them). */
  spells(ids: readonly number[], text: string): boolean {
    const want = utf8.encode(text);
    let at = 0;
    for (const id of ids) {
      const b = this.bytes[id];
      if (b === null || b === undefined || at + b.length > want.length) return false;
      for (let i = 0; i < b.length; i++) if (b[i] !== want[at + i]) return false;
      at += b.length;
    }
    return at === want.length;
  }

  /** The state after `id` from `state` (unchanged for specials; INVALID never happens for masked rows). */
  next(state: number, id: number): number {
    const b = this.bytes[id];
    if (b === null || b === undefined) return state;
    const s = this.run(state, b);
    return s === INVALID ? 0 : s;
  }
}
