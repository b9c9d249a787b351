// A text worker's thread (one of a TextWorkerPool's, text-worker-pool.ts): rebuilds the model's
// tokenizer and chat template from workerData, checks the tokenizer's fingerprint is the one the
// pool was made for (files changed on disk since the model loaded would tokenize differently),
// posts {type: 'ready'}, then runs each {id, job} (prompt-jobs.ts) and answers {id, ok, ...}.
// Token ids travel as transferred Int32Arrays.

import { parentPort, workerData } from 'node:worker_threads';
import { ChatTemplate } from './chat-template.ts';
import { TextTokenizer, type TokenizerSource } from './tokenizer.ts';
import { runChat, runEncode, type TextJob } from './prompt-jobs.ts';
import { PromptTooLongError } from './token-bound.ts';

export interface TextWorkerData {
  tokenizer: TokenizerSource;
  fingerprint: string;
  template?: { sources: Record<string, string>; origin: string };
}

export interface TextRequest {
  id: number;
  job: TextJob;
}

/** An error as it crosses the thread boundary: its class name and message (and a PromptTooLongError's numbers). */
export interface SerializedError {
  name: string;
  message: string;
  tooLong?: { chars: number; perToken: number; contextLen: number };
}

export type TextReply =
  | { type: 'ready' }
  | { type: 'fatal'; message: string }
  | { type: 'result'; id: number; ok: true; ids: Int32Array[]; text?: string }
  | { type: 'result'; id: number; ok: false; error: SerializedError };

const port = parentPort!;
const data = workerData as TextWorkerData;

function load(): { tokenizer: TextTokenizer; template?: ChatTemplate } {
  const src = data.tokenizer;
  const tokenizer = 'dir' in src ? TextTokenizer.fromDir(src.dir) : new TextTokenizer(src.json, src.config, src.source);
  if (tokenizer.fingerprint !== data.fingerprint) {
    throw new Error(`the tokenizer files ${'dir' in src ? `in ${src.dir} ` : ''}differ from the ones the model was loaded with`);
  }
  const template = data.template ? new ChatTemplate(data.template.sources, tokenizer, data.template.origin) : undefined;
  return { tokenizer, template };
}

function serialize(err: unknown): SerializedError {
  if (!(err instanceof Error)) return { name: 'Error', message: String(err) };
  const out: SerializedError = { name: err.name, message: err.message };
  if (err instanceof PromptTooLongError) out.tooLong = { chars: err.chars, perToken: err.perToken, contextLen: err.contextLen };
  return out;
}

let loaded: ReturnType<typeof load> | undefined;
try {
  loaded = load();
  port.postMessage({ type: 'ready' } satisfies TextReply);
} catch (err) {
  port.postMessage({ type: 'fatal', message: err instanceof Error ? err.message : String(err) } satisfies TextReply);
}

if (loaded) {
  const { tokenizer, template } = loaded;
  port.on('message', ({ id, job }: TextRequest) => {
    let reply: TextReply;
    let transfer: ArrayBuffer[] = [];
    try {
      if (job.kind === 'encode') {
        const ids = runEncode(tokenizer, job).map((a) => Int32Array.from(a));
        reply = { type: 'result', id, ok: true, ids };
        transfer = ids.map((a) => a.buffer as ArrayBuffer);
      } else {
        if (!template) throw new Error('the model has no chat template');
        const r = runChat(template, tokenizer, job);
        const ids = Int32Array.from(r.ids);
        reply = { type: 'result', id, ok: true, ids: [ids], text: r.text };
        transfer = [ids.buffer as ArrayBuffer];
      }
    } catch (err) {
      reply = { type: 'result', id, ok: false, error: serialize(err) };
    }
    port.postMessage(reply, transfer);
  });
}
