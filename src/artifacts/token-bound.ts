// The most characters of input text one token can stand for, read from tokenizer.json, so that a
// prompt that cannot fit the context is refused before it is tokenized: BPE on a megabyte-long run
// of one character takes time that grows faster than its length, on whichever thread runs it.
//
// The bound holds when every token covers at most as many UTF-16 units of the input as its vocab
// string (or added token's content) has characters:
//  - BPE: a byte-level vocab string has one character a byte, and a UTF-16 unit is at least one
//    byte; a SentencePiece-style string maps the text one to one ('▁' for ' '), and a byte-fallback
//    token (`<0x41>`) covers one byte with six characters. An unknown-token that fuses a run of
//    unknown characters (`fuse_unk`), and an added token that strips the whitespace beside it
//    (`lstrip` / `rstrip`), cover any length: no bound then.
//  - the normalizer must not shrink the text (none, Prepend, or Replace of a string by one at least
//    as long), and the pre-tokenizer must drop nothing (ByteLevel, Metaspace, Digits, and Split or
//    Punctuation unless their behaviour is "Removed"; WhitespaceSplit drops the spaces).
// Anything else (WordPiece and Unigram models, NFC/NFKC, Lowercase, Strip...) gives undefined.

/** Characters of input one token covers at most, or undefined when no bound is known to hold. */
export function maxCharsPerToken(tokenizerJson: unknown): number | undefined {
  if (!isObject(tokenizerJson)) return undefined;
  const model = tokenizerJson.model;
  if (!isObject(model) || model.type !== 'BPE' || !isObject(model.vocab)) return undefined;
  if (model.fuse_unk === true && model.unk_token != null) return undefined;
  if (!normalizerKeepsLength(tokenizerJson.normalizer) || !preTokenizerKeepsAll(tokenizerJson.pre_tokenizer)) return undefined;
  let most = 1; // an unknown character alone becomes one unknown-token
  for (const s of Object.keys(model.vocab)) if (s.length > most) most = s.length;
  const added = tokenizerJson.added_tokens;
  if (Array.isArray(added)) {
    for (const t of added) {
      if (!isObject(t) || typeof t.content !== 'string') return undefined;
      // lstrip / rstrip: the token also takes the whitespace beside it, however long
      if (t.lstrip === true || t.rstrip === true) return undefined;
      if (t.content.length > most) most = t.content.length;
    }
  }
  return most;
}

/** A text with more characters than the context's tokens can cover: refused before it is tokenized. */
export class PromptTooLongError extends Error {
  constructor(
    readonly chars: number,
    readonly perToken: number,
    readonly contextLen: number,
  ) {
    super(`the prompt has ${chars} characters: at least ${Math.ceil(chars / perToken)} tokens (a token covers at most ${perToken} ` +
      `characters), but this model's context holds ${contextLen} tokens`);
    this.name = 'PromptTooLongError';
  }
}

/**
 * Throws PromptTooLongError when `chars` characters need more than `contextLen` tokens however
 * they are tokenized (`perToken`: maxCharsPerToken; undefined = no bound known, nothing refused).
 */
export function checkFitsContext(chars: number, perToken: number | undefined, contextLen: number): void {
  if (perToken !== undefined && chars > contextLen * perToken) throw new PromptTooLongError(chars, perToken, contextLen);
}

function normalizerKeepsLength(n: unknown): boolean {
  if (n === null || n === undefined) return true;
  if (!isObject(n)) return false;
  switch (n.type) {
    case 'Prepend':
      return true;
    case 'Replace': {
      const pattern = isObject(n.pattern) ? n.pattern.String : undefined;
      return typeof pattern === 'string' && typeof n.content === 'string' && n.content.length >= pattern.length;
    }
    case 'Sequence':
      return Array.isArray(n.normalizers) && n.normalizers.every(normalizerKeepsLength);
    default:
      return false;
  }
}

function preTokenizerKeepsAll(p: unknown): boolean {
  if (p === null || p === undefined) return true;
  if (!isObject(p)) return false;
  switch (p.type) {
    case 'ByteLevel':
    case 'Metaspace':
    case 'Digits':
      return true;
    case 'Split':
    case 'Punctuation':
      return p.behavior !== 'Removed';
    case 'Sequence':
      return Array.isArray(p.pretokenizers) && p.pretokenizers.every(preTokenizerKeepsAll);
    default:
      return false;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
