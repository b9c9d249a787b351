// A single token's text and raw bytes, for logprobs. A token can hold part of a UTF-8 character
// (byte-level BPE splits them), so its bytes are recovered from the vocabulary entry rather than
// from decoding it alone: byte-level BPE maps each byte to a printable character (GPT-2's table),
// SentencePiece writes spaces as U+2581 and stray bytes as <0xNN>. A token whose bytes are not
// valid UTF-8 on their own is shown as "bytes:\xNN..." (OpenAI's convention); `bytes` is exact.

import type { TextTokenizer } from '../artifacts/tokenizer.ts';
import { byteLevelCharToByte } from '../artifacts/byte-level.ts';

export interface TokenText {
  token: string;
  bytes: number[];
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

export class TokenTexts {
  private readonly cache = new Map<number, TokenText>();
  private readonly byteLevel?: ReadonlyMap<string, number>;

  constructor(private readonly tokenizer: TextTokenizer) {
    // Byte-level BPE writes a space as "Ġ" (byte 0x20 -> U+0120).
    const space = tokenizer.encode(' ', { addSpecialTokens: false });
    if (space.length === 1 && tokenizer.idToToken(space[0]) === '\u0120') this.byteLevel = byteLevelCharToByte();
  }

  get(id: number): TokenText {
    let t = this.cache.get(id);
    if (!t) {
      t = this.compute(id);
      if (this.cache.size < 200_000) this.cache.set(id, t);
    }
    return t;
  }

  private compute(id: number): TokenText {
    const piece = this.tokenizer.idToToken(id);
    if (piece === undefined) return textOf(Buffer.from(safeDecode(this.tokenizer, id), 'utf8'));
    if (this.tokenizer.isSpecial(id)) return textOf(Buffer.from(piece, 'utf8'));
    if (this.byteLevel) {
      const bytes: number[] = [];
      for (const ch of piece) {
        const b = this.byteLevel.get(ch);
        if (b === undefined) return textOf(Buffer.from(safeDecode(this.tokenizer, id), 'utf8'));
        bytes.push(b);
      }
      return textOf(Buffer.from(bytes));
    }
    const byteFallback = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece);
    if (byteFallback) return textOf(Buffer.from([parseInt(byteFallback[1], 16)]));
    return textOf(Buffer.from(piece.replace(/\u2581/g, ' '), 'utf8'));
  }
}

function safeDecode(tokenizer: TextTokenizer, id: number): string {
  try {
    return tokenizer.decode([id]);
  } catch {
    return '';
  }
}

function textOf(buf: Buffer): TokenText {
  const bytes = [...buf];
  try {
    return { token: utf8.decode(buf), bytes };
  } catch {
    return { token: 'bytes:' + bytes.map((b) => '\\x' + b.toString(16).padStart(2, '0')).join(''), bytes };
  }
}
