// The speculative decoding flags `generate` and `serve` share (README, "Speculative decoding"):
// --speculative ngram|draft|eagle3, --draft-model DIR, --num-draft-tokens N|adaptive, --ngram-min N,
// --ngram-max N, checked here with messages that name the flags.

import { numberFlag, stringFlag, type Options, type Values } from './args.ts';
import { UsageError } from './errors.ts';
import { MAX_DRAFT_TOKENS, MAX_NGRAM, SPECULATIVE_DEFAULTS, type SpeculativeOptions } from '../execution/methods/speculative.ts';

export const SPECULATIVE_OPTIONS: Options = {
  speculative: { type: 'string' },
  'num-draft-tokens': { type: 'string' },
  'ngram-min': { type: 'string' },
  'ngram-max': { type: 'string' },
  'draft-model': { type: 'string' },
};

/** The flags' lines of a command's help, its descriptions starting at column `col`. */
export function speculativeHelp(col: number): string {
  const rows: [string, string[]][] = [
    ['--speculative ngram|draft|eagle3', [
      'speculative decoding: draft tokens proposed by prompt lookup (ngram: the',
      'longest suffix of the text that occurred earlier in the prompt or the',
      'output proposes what followed it), a small model (draft) or an EAGLE-3',
      'head (eagle3), verified in one forward; the output is what decoding',
      'without it gives (default: off)']],
    ['--draft-model DIR', ['with draft: a model directory sharing the model\'s tokenizer; with', 'eagle3: an EAGLE-3 head made for the model']],
    ['--num-draft-tokens N|adaptive', [
      `draft tokens per step: 1..${MAX_DRAFT_TOKENS}, or adaptive (default: per request, from`,
      'its recent acceptance and the measured step costs, down to none)']],
    ['--ngram-min N  --ngram-max N', [`the shortest and longest suffix a match may have (default ${SPECULATIVE_DEFAULTS.ngramMin}, ${SPECULATIVE_DEFAULTS.ngramMax})`]],
  ];
  const pad = ' '.repeat(col);
  return rows.map(([flag, text]) => {
    const head = `  ${flag}`;
    const first = head.length < col ? head.padEnd(col) + text[0] : `${head}\n${pad}${text[0]}`;
    return [first, ...text.slice(1).map((t) => pad + t)].join('\n');
  }).join('\n');
}

/** The draft model directory of --speculative draft (--draft-model), checked against --speculative. */
export function draftModelFlag(v: Values): string | undefined {
  const dir = stringFlag(v, 'draft-model');
  const proposer = stringFlag(v, 'speculative');
  if ((proposer === 'draft' || proposer === 'eagle3') && dir === undefined) throw new UsageError(`--speculative ${proposer} needs --draft-model DIR`);
  if (dir !== undefined && proposer !== 'draft' && proposer !== 'eagle3') throw new UsageError('--draft-model needs --speculative draft or eagle3');
  return dir;
}

/** The speculative decoding the flags ask for, or undefined without --speculative. */
export function speculativeFlags(v: Values): SpeculativeOptions | undefined {
  const proposer = stringFlag(v, 'speculative');
  const depthRaw = stringFlag(v, 'num-draft-tokens');
  if (proposer === undefined) {
    for (const f of ['num-draft-tokens', 'ngram-min', 'ngram-max', 'draft-model']) {
      if (v[f] !== undefined) throw new UsageError(`--${f} needs --speculative ${f === 'draft-model' ? 'draft or eagle3' : f === 'num-draft-tokens' ? 'ngram|draft|eagle3' : 'ngram'}`);
    }
    return undefined;
  }
  if (proposer !== 'ngram' && proposer !== 'draft' && proposer !== 'eagle3')
    throw new UsageError(`--speculative must be ngram (prompt lookup), draft (a draft model) or eagle3 (an EAGLE-3 head), got "${proposer}"`);
  if (proposer !== 'ngram') {
    for (const f of ['ngram-min', 'ngram-max']) if (v[f] !== undefined) throw new UsageError(`--${f} needs --speculative ngram`);
  }
  let numDraftTokens: number | 'adaptive' | undefined;
  if (depthRaw === 'adaptive') numDraftTokens = 'adaptive';
  else if (depthRaw !== undefined) {
    const n = Number(depthRaw);
    if (depthRaw.trim() === '' || !Number.isInteger(n) || n < 1 || n > MAX_DRAFT_TOKENS)
      throw new UsageError(`--num-draft-tokens must be an integer from 1 to ${MAX_DRAFT_TOKENS} or "adaptive", got "${depthRaw}"`);
    numDraftTokens = n;
  }
  const ngramMin = numberFlag(v, 'ngram-min', { integer: true, min: 1, max: MAX_NGRAM });
  const ngramMax = numberFlag(v, 'ngram-max', { integer: true, min: 1, max: MAX_NGRAM });
  if (ngramMin !== undefined && ngramMax !== undefined && ngramMin > ngramMax)
    throw new UsageError(`--ngram-min (${ngramMin}) must not be above --ngram-max (${ngramMax})`);
  return { proposer, numDraftTokens, ngramMin, ngramMax };
}

/** generate --json's "speculation" field. */
export function speculationJson(c: { draftTokens: number; acceptedTokens: number }): { draft_tokens: number; accepted_tokens: number } {
  return { draft_tokens: c.draftTokens, accepted_tokens: c.acceptedTokens };
}
