// The text work that turns a request into prompt ids: encoding texts, and rendering a conversation
// with the chat template and encoding that. One implementation, run on the calling thread for
// small inputs and on a text worker (text-worker.ts) for large ones, so both give the same ids
// and refuse the same inputs with the same errors.

import { type ChatMessage, type ChatTemplate, type RenderOptions } from './chat-template.ts';
import { checkFitsContext } from './token-bound.ts';
import type { TextTokenizer } from './tokenizer.ts';

/** Encodes each text (`contextLen`: refuse, before tokenizing, a text that cannot fit it). */
export interface EncodeJob {
  kind: 'encode';
  texts: string[];
  addSpecialTokens: boolean;
  contextLen?: number;
}

/**
 * Renders `messages` and encodes the text without adding special tokens (the template wrote them).
 * `continueFinal` cuts the rendering right after the final message's text (vLLM's rule), so the
 * model continues it instead of starting a new turn.
 */
export interface ChatJob {
  kind: 'chat';
  messages: ChatMessage[];
  render: Omit<RenderOptions, 'now'>;
  continueFinal: boolean;
  contextLen?: number;
}

export type TextJob = EncodeJob | ChatJob;

/** The rendering does not contain the final message's text, so it cannot be continued. */
export class ContinueFinalError extends Error {
  constructor() {
    super('cannot continue the final message: its text does not appear in the rendered chat template');
    this.name = 'ContinueFinalError';
  }
}

export function runEncode(tokenizer: TextTokenizer, job: EncodeJob): number[][] {
  if (job.contextLen !== undefined) for (const t of job.texts) checkFitsContext(t.length, tokenizer.maxCharsPerToken, job.contextLen);
  return job.texts.map((t) => tokenizer.encode(t, { addSpecialTokens: job.addSpecialTokens }));
}

export function runChat(template: ChatTemplate, tokenizer: TextTokenizer, job: ChatJob): { ids: number[]; text: string } {
  const text = renderChatText(template, job);
  if (job.contextLen !== undefined) checkFitsContext(text.length, tokenizer.maxCharsPerToken, job.contextLen);
  return { ids: tokenizer.encode(text, { addSpecialTokens: false }), text };
}

/** runChat's first half: the rendered text, cut after the final message when continuing it. */
export function renderChatText(template: ChatTemplate, job: ChatJob): string {
  const text = template.render(job.messages, job.render);
  if (!job.continueFinal) return text;
  const last = job.messages[job.messages.length - 1];
  const content = typeof last?.content === 'string' ? last.content : '';
  const at = content === '' ? -1 : text.lastIndexOf(content);
  if (at < 0) throw new ContinueFinalError();
  return text.slice(0, at + content.length);
}

/**
 * How much text work a value stands for: the characters of its strings and keys, plus one for
 * every value (many small messages cost a template as much as one long one). Iterative, so any
 * nesting a parsed request body holds is walked without recursion.
 */
export function textWeight(value: unknown): number {
  let weight = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    weight++;
    if (typeof v === 'string') weight += v.length;
    else if (Array.isArray(v)) for (const x of v) stack.push(x);
    else if (v !== null && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) {
        weight += k.length;
        stack.push(x);
      }
    }
  }
  return weight;
}
