// A text worker's thread (one of a TextWorkerPool's, text-worker-pool.ts): rebuilds the model's
// tokenizer and chat template from workerData, checks the tokenizer's fingerprint is the one the
// pool was made for (files changed on disk since the model loaded would tokenize differently),
// loads the pool's extension module if it has one, posts {type: 'ready'}, then runs each
// {id, job} (prompt-jobs.ts, or the extension's for a 'custom' job) and answers {id, ok, ...}.
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
  extension?: TextWorkerExtensionSpec;
}

/**
 * A module (its URL) a pool's workers load for the pool's custom jobs: its export
 * `createCustomJobRunner(data, loaded)` returns the function that runs each job's payload with the
 * worker's tokenizer and template. It lets a layer above this one run its own work next to the
 * text work (the server prepares large request bodies there) without this layer knowing it.
 */
export interface TextWorkerExtensionSpec {
  url: string;
  data: unknown;
}

/** What a custom job's runner returns: the value to post back, and the buffers to transfer with it. */
export interface CustomJobResult {
  value: unknown;
  transfer?: ArrayBuffer[];
}

export type CustomJobRunner = (payload: unknown) => CustomJobResult | Promise<CustomJobResult>;

export interface TextWorkerExtension {
  createCustomJobRunner(data: unknown, loaded: { tokenizer: TextTokenizer; template?: ChatTemplate }): CustomJobRunner | Promise<CustomJobRunner>;
}

/** A job for the pool's extension (TextWorkerPool.custom). */
export interface CustomJob {
  kind: 'custom';
  payload: unknown;
}

export interface TextRequest {
  id: number;
  job: TextJob | CustomJob;
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
  | { type: 'result'; id: number; ok: true; ids: Int32Array[]; text?: string; value?: unknown }
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
let custom: CustomJobRunner | undefined;
try {
  loaded = load();
  if (data.extension) {
    const ext = (await import(data.extension.url)) as TextWorkerExtension;
    custom = await ext.createCustomJobRunner(data.extension.data, loaded);
  }
  port.postMessage({ type: 'ready' } satisfies TextReply);
} catch (err) {
  loaded = undefined;
  port.postMessage({ type: 'fatal', message: err instanceof Error ? err.message : String(err) } satisfies TextReply);
}

if (loaded) {
  const { tokenizer, template } = loaded;
  // the pool sends a worker its next job only once it answered the last, so an async custom job
  // never overlaps another
  port.on('message', async ({ id, job }: TextRequest) => {
    let reply: TextReply;
    let transfer: ArrayBuffer[] = [];
    try {
      if (job.kind === 'custom') {
        if (!custom) throw new Error('the text worker pool has no extension for custom jobs');
        const r = await custom(job.payload);
        reply = { type: 'result', id, ok: true, ids: [], value: r.value };
        transfer = r.transfer ?? [];
      } else if (job.kind === 'encode') {
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
