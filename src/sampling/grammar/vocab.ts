// The vocabulary as xgrammar needs it: every token id's *encoded* string (as the tokenizer's
// vocabulary stores it), how to decode those strings to bytes (byte-level BPE, SentencePiece
// byte fallback, or raw), and the stop tokens a finished grammar allows.
//
// Special tokens that are not stop tokens are given the empty string: xgrammar then treats them
// as special and never allows them, so the literal text "<|im_start|>" inside a JSON string can
// only be spelled with ordinary tokens, never with the control token. Ids past the tokenizer (a
// model's padded vocab_size) are masked the same way.

/** What a tokenizer offers; artifacts' TextTokenizer satisfies it. */
export interface VocabSource {
  /** highest token id + 1 */
  readonly vocabSize: number;
  idToToken(id: number): string | undefined;
  isSpecial(id: number): boolean;
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
  decode(ids: readonly number[], opts?: { skipSpecialTokens?: boolean }): string;
}

export type VocabType = 'byte_level' | 'byte_fallback' | 'raw';

export interface GrammarVocab {
  /** encoded token strings by id ('' = special, never allowed by a grammar) */
  tokens: string[];
  vocabType: VocabType;
  /** SentencePiece "legacy" tokenizers prepend a space to the text they encode */
  prependSpace: boolean;
  /** logits row length (the model's vocab_size; may exceed tokens.length) */
  vocabSize: number;
  /** what a grammar allows once it is complete */
  stopTokenIds: number[];
  /** text -> ids without special tokens (jump-forward spells forced text with it) */
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
}

/**
 * Derives the grammar vocabulary from a tokenizer. The decoding style is read off the tokens
 * themselves: byte-level BPE spells a space as "Ġ" (U+0120), SentencePiece byte fallback has
 * <0x00>..<0xFF> tokens, anything else is taken literally.
 */
export function grammarVocabFrom(tok: VocabSource, modelVocabSize: number, stopTokenIds: readonly number[]): GrammarVocab {
  const stops = new Set(stopTokenIds);
  const tokens: string[] = [];
  let byteFallback = 0;
  for (let id = 0; id < tok.vocabSize; id++) {
    const t = tok.idToToken(id);
    if (t === undefined || (tok.isSpecial(id) && !stops.has(id))) tokens.push('');
    else tokens.push(t);
    if (t !== undefined && /^<0x[0-9A-Fa-f]{2}>$/.test(t)) byteFallback++;
  }
  const space = tok.encode(' ', { addSpecialTokens: false });
  let vocabType: VocabType = 'raw';
  if (space.length === 1 && tok.idToToken(space[0]) === '\u0120') vocabType = 'byte_level';
  else if (byteFallback >= 256) vocabType = 'byte_fallback';
  let prependSpace = false;
  if (vocabType === 'byte_fallback') {
    const a = tok.encode('a', { addSpecialTokens: false });
    prependSpace = a.length > 0 && (tok.idToToken(a[0]) ?? '').startsWith('\u2581');
  }
  return {
    tokens,
    vocabType,
    prependSpace,
    vocabSize: Math.max(modelVocabSize, tokens.length),
    stopTokenIds: [...stops].filter((id) => id >= 0 && id < Math.max(modelVocabSize, tokens.length)),
    encode: (text) => tok.encode(text, { addSpecialTokens: false }),
    decode: (ids) => tok.decode(ids, { skipSpecialTokens: false }),
  };
}
