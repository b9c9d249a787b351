// Logprobs in the two OpenAI shapes: chat (`choices[].logprobs.content[]`, one entry per token
// with its text, bytes and top alternatives) and legacy completions (parallel arrays).

import type { TokenLogprob } from '../execution/sequence.ts';
import type { TokenTexts } from './token-text.ts';

/** JSON has no -Infinity; vLLM's stand-in */
const finite = (x: number): number => (Number.isFinite(x) ? x : -9999);

export interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** a token as logprobs name it: its text, or "token_id:N" (vLLM's return_tokens_as_token_ids) */
const nameOf = (texts: TokenTexts, id: number, asIds: boolean): string => (asIds ? `token_id:${id}` : texts.get(id).token);

export function chatLogprob(texts: TokenTexts, lp: TokenLogprob, asIds = false): ChatTokenLogprob {
  const t = texts.get(lp.token_id);
  return {
    token: asIds ? nameOf(texts, lp.token_id, true) : t.token,
    logprob: finite(lp.logprob),
    bytes: t.bytes,
    top_logprobs: lp.top.map((x) => {
      const u = texts.get(x.token_id);
      return { token: asIds ? nameOf(texts, x.token_id, true) : u.token, logprob: finite(x.logprob), bytes: u.bytes };
    }),
  };
}

export interface LegacyLogprobs {
  tokens: string[];
  token_logprobs: number[];
  /** per token: the top alternatives and the chosen token, by token text */
  top_logprobs: Record<string, number>[];
  /** per token: offset of its text in the choice's text */
  text_offset: number[];
}

export function legacyLogprobs(texts: TokenTexts, lps: readonly TokenLogprob[], offsets: readonly number[], asIds = false): LegacyLogprobs {
  const out: LegacyLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  lps.forEach((lp, k) => {
    const token = nameOf(texts, lp.token_id, asIds);
    out.tokens.push(token);
    out.token_logprobs.push(finite(lp.logprob));
    const top: Record<string, number> = {};
    for (const x of lp.top) {
      const s = nameOf(texts, x.token_id, asIds);
      if (!(s in top)) top[s] = finite(x.logprob);
    }
    if (!(token in top)) top[token] = finite(lp.logprob);
    out.top_logprobs.push(top);
    out.text_offset.push(offsets[k] ?? 0);
  });
  return out;
}
