// The model's tokenizer: tokenizer.json (+ tokenizer_config.json for named special tokens and
// decode options), wrapped around @huggingface/tokenizers so the rest of the engine sees plain
// number[] in and string out with transformers 5 semantics:
//  - encode adds special tokens (the tokenizer.json post-processor's bos/eos) unless told not to;
//  - decode never "cleans up tokenization spaces" unless tokenizer_config.json asks for it, and
//    transformers 5 refuses even that for BPE models (it corrupts " ." etc.). The library's own
//    default is to clean up, so the flag is always passed explicitly.

import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { ArtifactError } from './errors.ts';
import { expectObject, readJsonFile } from './json-file.ts';
import { maxCharsPerToken } from './token-bound.ts';

export const TOKENIZER_FILE = 'tokenizer.json';
export const TOKENIZER_CONFIG_FILE = 'tokenizer_config.json';

/** transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens a chat template sees */
const NAMED_SPECIAL_TOKENS = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];

export interface EncodeOptions {
  /** add the post-processor's special tokens (e.g. bos); default true, as in transformers */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  /** drop added tokens marked special; default false, as in transformers */
  skipSpecialTokens?: boolean;
}

/**
 * What a text worker (text-worker.ts) rebuilds the same tokenizer from: the model directory when
 * it was loaded from one (the worker reads the files itself), else the parsed files.
 */
export type TokenizerSource = { dir: string } | { json: unknown; config: unknown; source: string };

export class TextTokenizer {
  /** tokenizer_config.json as parsed ({} when absent) */
  readonly config: Readonly<Record<string, unknown>>;
  /** named special tokens as strings (bos_token, eos_token, ...), for chat templates */
  readonly specialTokens: Readonly<Record<string, string>>;
  readonly bosTokenId?: number;
  readonly eosTokenId?: number;
  readonly padTokenId?: number;
  readonly unkTokenId?: number;
  /** ids of added tokens marked special (what skipSpecialTokens drops) */
  readonly specialTokenIds: ReadonlySet<number>;
  /** highest token id + 1, added tokens included; may be below the model's (padded) vocab_size */
  readonly vocabSize: number;
  readonly cleanUpTokenizationSpaces: boolean;
  /** sha256 of tokenizer.json and tokenizer_config.json: keys caches that hold token ids */
  readonly fingerprint: string;
  /**
   * The most characters of input one token covers (token-bound.ts), or undefined when the tokenizer
   * gives no such bound: a text longer than context x this cannot fit, tokenized or not.
   */
  readonly maxCharsPerToken?: number;
  private readonly tok: Tokenizer;
  private origin: TokenizerSource;

  /** @param source names the files in messages */
  constructor(tokenizerJson: unknown, tokenizerConfig: unknown = {}, source = TOKENIZER_FILE) {
    const tj = expectObject(tokenizerJson, 'tokenizer', source);
    const tc = expectObject(tokenizerConfig ?? {}, 'tokenizer config', source);
    try {
      this.tok = new Tokenizer(tj, tc);
    } catch (e) {
      throw new ArtifactError(`tokenizer ${source} cannot be loaded: ${(e as Error).message}`, source);
    }
    this.config = tc;
    this.origin = { json: tj, config: tc, source };
    this.maxCharsPerToken = maxCharsPerToken(tj);
    // transformers 5 treats every "*_token" string (e.g. image_token) as a named special token,
    // as well as the entries of an extra_special_tokens dict
    const named: Record<string, string> = {};
    const extra = tc.extra_special_tokens;
    const candidates = { ...(isDict(extra) ? extra : {}), ...tc };
    for (const [key, value] of Object.entries(candidates)) {
      if (!NAMED_SPECIAL_TOKENS.includes(key) && !key.endsWith('_token') && !(isDict(extra) && key in extra)) continue;
      const s = tokenString(value);
      if (s !== undefined) named[key] = s;
    }
    this.specialTokens = named;
    this.bosTokenId = named.bos_token === undefined ? undefined : this.tokenToId(named.bos_token);
    this.eosTokenId = named.eos_token === undefined ? undefined : this.tokenToId(named.eos_token);
    this.padTokenId = named.pad_token === undefined ? undefined : this.tokenToId(named.pad_token);
    this.unkTokenId = named.unk_token === undefined ? undefined : this.tokenToId(named.unk_token);
    const special = new Set<number>();
    for (const [id, t] of this.tok.get_added_tokens_decoder()) if (t.special) special.add(id);
    this.specialTokenIds = special;
    let maxId = -1;
    for (const id of this.tok.get_vocab(true).values()) maxId = Math.max(maxId, id);
    this.vocabSize = maxId + 1;
    const isBpe = (tj.model as { type?: string } | undefined)?.type === 'BPE';
    this.cleanUpTokenizationSpaces = tc.clean_up_tokenization_spaces === true &&
      (!isBpe || tc.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output === true);
    this.fingerprint = createHash('sha256').update(JSON.stringify(tj)).update(JSON.stringify(tc)).digest('hex');
  }

  /** Loads DIR/tokenizer.json (required) and DIR/tokenizer_config.json (optional). */
  static fromDir(dir: string): TextTokenizer {
    const file = path.join(dir, TOKENIZER_FILE);
    const tj = readJsonFile(file, 'tokenizer');
    const configFile = path.join(dir, TOKENIZER_CONFIG_FILE);
    const tc = fs.existsSync(configFile) ? readJsonFile(configFile, 'tokenizer config') : {};
    const t = new TextTokenizer(tj, tc, file);
    t.origin = { dir }; // the worker re-reads the files instead of holding a copy of them here
    return t;
  }

  /** Where a text worker loads this tokenizer from (it checks the fingerprint matches). */
  get source(): TokenizerSource {
    return this.origin;
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    return this.tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids;
  }

  /**
   * Ids the tokenizer has no token for (a model's vocab_size is often padded past the tokenizer's)
   * decode to nothing, as in the Rust tokenizers transformers uses.
   */
  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    const known = ids.filter((id) => Number.isInteger(id) && id >= 0 && this.tok.id_to_token(id) !== undefined);
    if (known.length === 0) return '';
    return this.tok.decode(known, {
      skip_special_tokens: opts.skipSpecialTokens ?? false,
      clean_up_tokenization_spaces: this.cleanUpTokenizationSpaces,
    });
  }

  /** id of a vocabulary or added token, e.g. "<|im_end|>" */
  tokenToId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.tok.id_to_token(id);
  }

  isSpecial(id: number): boolean {
    return this.specialTokenIds.has(id);
  }
}

/** tokenizer_config stores a token as a string or as a serialised AddedToken {content, ...} */
function tokenString(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (v !== null && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') {
    return (v as { content: string }).content;
  }
  return undefined;
}

function isDict(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}
