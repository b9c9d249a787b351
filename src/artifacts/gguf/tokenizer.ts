// tokenizer.ggml.* -> a tokenizer.json (and the tokenizer_config.json fields llmts reads) for
// @huggingface/tokenizers, built the way transformers 5 converts a GGUF tokenizer
// (integrations/gguf/gguf_tokenizer_mapping.py), so the ids are transformers':
//   gpt2   byte-level BPE with the file's merges; tokens outside the byte alphabet respelled in it;
//          the pre-tokenizer split regex named by tokenizer.ggml.pre (GPT-2's when it names none
//          transformers knows)
//   llama  SentencePiece BPE with byte fallback; merges from the file, or rebuilt from the scores
//          (transformers' generate_merges); gemma* and phi3 files get those models' pre-tokenizers
// Control tokens (type 3) are special added tokens, user-defined ones (type 4) plain added tokens.
// Unlike transformers (which never adds them for a GGUF), tokenizer.ggml.add_bos_token /
// add_eos_token are honoured as llama.cpp does (defaults: bos for SentencePiece files, no eos), so
// encoding with special tokens gives the ids llama.cpp feeds the model.

import { ArtifactError } from '../errors.ts';
import type { GgufValue } from './reader.ts';

/** transformers' GGUF_PRE_TOKENIZER_SPLITS */
const LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const TEKKEN_SPLIT = '[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+' +
  '|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*' +
  '|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+';
const GPT4O_SPLIT = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?" +
  "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?" +
  '|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+';
const QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

export const PRE_TOKENIZER_SPLITS: Readonly<Record<string, string>> = {
  llama3: LLAMA3_SPLIT, 'llama-v3': LLAMA3_SPLIT, 'llama-bpe': LLAMA3_SPLIT, falcon3: LLAMA3_SPLIT, 'falcon-h1': LLAMA3_SPLIT,
  pixtral: LLAMA3_SPLIT, 'midm-2.0': LLAMA3_SPLIT, lfm2: LLAMA3_SPLIT, 'jina-v5-nano': LLAMA3_SPLIT, dbrx: LLAMA3_SPLIT,
  'smaug-bpe': LLAMA3_SPLIT, tekken: TEKKEN_SPLIT, qwen2: QWEN2_SPLIT, 'deepseek-r1-qwen': QWEN2_SPLIT, kormo: QWEN2_SPLIT,
  f2llmv2: QWEN2_SPLIT, megrez: QWEN2_SPLIT, qwen35: QWEN35_SPLIT, 'gpt-4o': GPT4O_SPLIT, llama4: GPT4O_SPLIT,
  kanana2: GPT4O_SPLIT, talkie: GPT4O_SPLIT, 'minimax-m2': GPT4O_SPLIT,
};

const TOKEN_TYPE = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

/** GPT-2's bytes_to_unicode: byte -> the character byte-level BPE spells it with. */
export const BYTE_TO_UNICODE: readonly string[] = (() => {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const out: string[] = new Array(256);
  bs.forEach((b, i) => (out[b] = String.fromCodePoint(cs[i]!)));
  return out;
})();
const BYTE_ALPHABET = new Set(BYTE_TO_UNICODE);

export interface GgufTokenizer {
  /** tokenizer.json for @huggingface/tokenizers */
  json: Record<string, unknown>;
  /** tokenizer_config.json fields: named special tokens, chat template, decode options */
  config: Record<string, unknown>;
}

type Meta = Map<string, GgufValue>;

/** Builds the tokenizer a GGUF file's metadata describes; throws naming the key that is wrong. */
export function ggufTokenizer(meta: Meta, architecture: string, file: string): GgufTokenizer {
  const fail = (m: string) => new ArtifactError(`GGUF file ${file}: ${m}`, file);
  const model = meta.get('tokenizer.ggml.model');
  if (model === undefined) throw fail('has no tokenizer (metadata tokenizer.ggml.model is missing)');
  if (model !== 'gpt2' && model !== 'llama') {
    throw fail(`tokenizer.ggml.model is ${JSON.stringify(model)}; supported: "gpt2" (byte-level BPE), "llama" (SentencePiece BPE)`);
  }
  const tokensV = meta.get('tokenizer.ggml.tokens');
  if (!Array.isArray(tokensV) || tokensV.length === 0 || !tokensV.every((t) => typeof t === 'string')) {
    throw fail('tokenizer.ggml.tokens must be a non-empty array of strings');
  }
  const tokens = tokensV as string[];
  const typesV = meta.get('tokenizer.ggml.token_type');
  const types = typesV === undefined ? undefined : numbers(typesV, 'tokenizer.ggml.token_type', tokens.length, fail);
  const scoresV = meta.get('tokenizer.ggml.scores');
  const scores = scoresV === undefined ? undefined : numbers(scoresV, 'tokenizer.ggml.scores', tokens.length, fail);
  const mergesV = meta.get('tokenizer.ggml.merges');
  let merges: [string, string][] | undefined;
  if (mergesV !== undefined) {
    if (!Array.isArray(mergesV) || !mergesV.every((m) => typeof m === 'string')) throw fail('tokenizer.ggml.merges must be an array of strings');
    merges = (mergesV as string[]).map((m, i) => {
      const parts = m.split(' ');
      if (parts.length !== 2) throw fail(`tokenizer.ggml.merges[${i}] ${JSON.stringify(m)} is not "left right"`);
      return [parts[0]!, parts[1]!];
    });
  }
  const id = (key: string): number | undefined => {
    const v = meta.get(`tokenizer.ggml.${key}`);
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= tokens.length) {
      throw fail(`tokenizer.ggml.${key} is ${String(v)}, not a token id below ${tokens.length}`);
    }
    return v;
  };
  const flag = (key: string, dflt: boolean): boolean => {
    const v = meta.get(`tokenizer.ggml.${key}`);
    if (v === undefined) return dflt;
    if (typeof v !== 'boolean') throw fail(`tokenizer.ggml.${key} must be a bool, got ${String(v)}`);
    return v;
  };
  const bos = id('bos_token_id'), eos = id('eos_token_id'), unk = id('unknown_token_id'), pad = id('padding_token_id');
  const spm = model === 'llama';
  const addBos = flag('add_bos_token', spm), addEos = flag('add_eos_token', false);
  if (addBos && bos === undefined) throw fail('tokenizer.ggml.add_bos_token is set but tokenizer.ggml.bos_token_id is missing');
  if (addEos && eos === undefined) throw fail('tokenizer.ggml.add_eos_token is set but tokenizer.ggml.eos_token_id is missing');

  let json: Record<string, unknown>;
  let spelled = tokens;
  if (!spm) {
    spelled = tokens.map((t) => ([...t].every((ch) => BYTE_ALPHABET.has(ch)) ? t : [...new TextEncoder().encode(t)].map((b) => BYTE_TO_UNICODE[b]).join('')));
    const pre = meta.get('tokenizer.ggml.pre');
    const split = typeof pre === 'string' ? PRE_TOKENIZER_SPLITS[pre] : undefined;
    if (!merges) throw fail('is a gpt2 (byte-level BPE) tokenizer without tokenizer.ggml.merges');
    json = {
      normalizer: null,
      pre_tokenizer: split
        ? { type: 'Sequence', pretokenizers: [
          { type: 'Split', pattern: { Regex: split }, behavior: 'Isolated', invert: false },
          { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
        ] }
        : { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: bpe(vocabOf(spelled), merges, { unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false }),
    };
  } else {
    const gemma = gemmaArch(architecture);
    // gemma stores runs of spaces as real spaces; its tokenizer looks them up as "▁" runs
    if (gemma) spelled = tokens.map((t) => (t.length > 0 && t.trim() === '' && t.includes(' ') ? '\u2581'.repeat([...t].length) : t));
    const vocab = vocabOf(spelled);
    if (!merges) {
      if (gemma) {
        // gemma's scores do not follow its merge order; the order of the tokens in the file does
        const positions = new Map<string, number>();
        spelled.forEach((t, i) => positions.set(t, -i));
        merges = generateMerges(vocab, positions);
      } else {
        if (!scores) throw fail('is a SentencePiece tokenizer with neither tokenizer.ggml.merges nor tokenizer.ggml.scores');
        const s = new Map<string, number>();
        spelled.forEach((t, i) => s.set(t, scores[i]!));
        merges = generateMerges(vocab, s);
      }
    }
    const prepend = flag('add_space_prefix', true) ? 'first' : 'never';
    const decoders: unknown[] = [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' },
    ];
    if (gemma) {
      json = {
        normalizer: { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' },
        pre_tokenizer: { type: 'Split', pattern: { String: ' ' }, behavior: 'MergedWithPrevious', invert: false },
        decoder: { type: 'Sequence', decoders },
        model: bpe(vocab, merges, { unk_token: unk !== undefined ? spelled[unk] : '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true }),
      };
    } else {
      const phi3 = architecture === 'phi3';
      json = {
        normalizer: phi3
          ? { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '\u2581' }, { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] }
          : null,
        pre_tokenizer: phi3 ? null : { type: 'Metaspace', replacement: '\u2581', prepend_scheme: prepend, split: false },
        decoder: { type: 'Sequence', decoders: [...decoders, ...(prepend === 'first' ? [{ type: 'Strip', content: ' ', start: 1, stop: 0 }] : [])] },
        model: bpe(vocab, merges, { unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true }),
      };
    }
  }

  // control tokens are special added tokens (in a byte-level vocabulary only those spelled in its
  // alphabet: transformers skips llama.cpp's mislabels); user-defined ones plain added tokens
  // plus the special tokens the transformers tokenizer class names by default, where the
  // vocabulary has them (LlamaTokenizer's <unk> <s> </s>, GemmaTokenizer's, GPT2Tokenizer's)
  const vocab = vocabOf(spelled);
  const special = new Map<number, string>();
  const defaults = !spm ? ['<|endoftext|>'] : gemmaArch(architecture) ? ['<unk>', '<bos>', '<eos>', '<pad>', '<mask>'] : ['<unk>', '<s>', '</s>'];
  for (const t of defaults) if (vocab.has(t)) special.set(vocab.get(t)!, t);
  if (types) {
    tokens.forEach((t, i) => {
      if (types[i] === TOKEN_TYPE.CONTROL && (spm || [...t].every((ch) => BYTE_ALPHABET.has(ch)))) special.set(vocab.get(t) ?? i, t);
    });
  }
  const added: Record<string, unknown>[] = [...special].sort((a, b) => a[0] - b[0]).map(([i, t]) => addedToken(i, t, true));
  if (types) {
    tokens.forEach((t, i) => {
      if (types[i] === TOKEN_TYPE.USER_DEFINED && vocab.has(t) && !special.has(vocab.get(t)!)) added.push(addedToken(vocab.get(t)!, t, false));
    });
  }

  const single: unknown[] = [];
  const specials: Record<string, unknown> = {};
  if (addBos) {
    single.push({ SpecialToken: { id: spelled[bos!], type_id: 0 } });
    specials[spelled[bos!]!] = { id: spelled[bos!], ids: [bos], tokens: [spelled[bos!]] };
  }
  single.push({ Sequence: { id: 'A', type_id: 0 } });
  if (addEos) {
    single.push({ SpecialToken: { id: spelled[eos!], type_id: 0 } });
    specials[spelled[eos!]!] = { id: spelled[eos!], ids: [eos], tokens: [spelled[eos!]] };
  }
  const pair = [...single, ...single.map((x) => ((x as { Sequence?: unknown }).Sequence ? { Sequence: { id: 'B', type_id: 1 } } : x))];

  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    ...json,
    post_processor: { type: 'TemplateProcessing', single, pair, special_tokens: specials },
  };
  const config: Record<string, unknown> = { clean_up_tokenization_spaces: false };
  const named = (key: string, v: number | undefined) => {
    if (v !== undefined) config[key] = tokens[v];
  };
  named('bos_token', bos);
  named('eos_token', eos);
  named('unk_token', unk);
  named('pad_token', pad);
  const template = meta.get('tokenizer.chat_template');
  if (template !== undefined) {
    if (typeof template !== 'string') throw fail('tokenizer.chat_template must be a string');
    config.chat_template = template;
  }
  return { json: tokenizerJson, config };
}

function gemmaArch(a: string): boolean {
  return a === 'gemma' || a === 'gemma2' || a === 'gemma3';
}

function numbers(v: GgufValue, key: string, n: number, fail: (m: string) => Error): ArrayLike<number> {
  if (!ArrayBuffer.isView(v) && !(Array.isArray(v) && v.every((x) => typeof x === 'number'))) throw fail(`${key} must be an array of numbers`);
  const a = v as ArrayLike<number>;
  if (a.length !== n) throw fail(`${key} has ${a.length} entries for ${n} tokens`);
  return a;
}

/** {token: id} as a Python dict built from a list: a repeated token keeps its first place, the last id */
function vocabOf(tokens: readonly string[]): Map<string, number> {
  const m = new Map<string, number>();
  tokens.forEach((t, i) => m.set(t, i));
  return m;
}

function bpe(vocab: Map<string, number>, merges: [string, string][], opts: Record<string, unknown>): Record<string, unknown> {
  return { type: 'BPE', dropout: null, ...opts, ignore_merges: false, vocab: Object.fromEntries(vocab), merges };
}

function addedToken(id: number, content: string, special: boolean): Record<string, unknown> {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special };
}

/**
 * transformers' generate_merges(vocab, vocab_scores): every split of every scored token into two
 * vocabulary pieces, pieces ordered by their ids, then all merges by (score, left length, right
 * length) descending, ties in that order (Python's sort is stable under reverse=True).
 */
export function generateMerges(vocab: Map<string, number>, scores: Map<string, number>): [string, string][] {
  const all: { l: string; r: string; score: number; ll: number; rl: number }[] = [];
  for (const [merge, score] of scores) {
    const cps = [...merge];
    const local: { l: string; r: string; score: number; ll: number; rl: number }[] = [];
    for (let i = 1; i < cps.length; i++) {
      const l = cps.slice(0, i).join(''), r = cps.slice(i).join('');
      if (vocab.has(l) && vocab.has(r)) local.push({ l, r, score, ll: i, rl: cps.length - i });
    }
    local.sort((a, b) => vocab.get(a.l)! - vocab.get(b.l)! || vocab.get(a.r)! - vocab.get(b.r)!);
    all.push(...local);
  }
  all.sort((a, b) => b.score - a.score || b.ll - a.ll || b.rl - a.rl);
  return all.map((m) => [m.l, m.r]);
}
