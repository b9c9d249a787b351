// What a route handler gets: the engine run context of its request, the model, the response.

import type { ServerResponse } from 'node:http';
import { randomBytes } from 'node:crypto';
import type { RunContext } from './run.ts';
import type { ServedModel } from './served-model.ts';
import { ClientGoneError, type SseWriter } from './http-io.ts';

export interface HandlerContext extends RunContext {
  model: ServedModel;
  res: ServerResponse;
  /** logs an internal error once (stderr) */
  logError(where: string, err: unknown): void;
}

/** a response id: prefix + 24 random hex digits */
export function newId(prefix: string): string {
  return prefix + randomBytes(12).toString('hex');
}

export const nowSeconds = (): number => Math.floor(Date.now() / 1000);

/**
 * An error after the SSE head went out: the status can no longer change, so it is logged and
 * sent as a final error frame (OpenAI shape, or Anthropic's `event: error`). A client that left
 * needs neither.
 */
export async function streamFailed(ctx: HandlerContext, sse: SseWriter, where: string, err: unknown, anthropic = false): Promise<void> {
  if (err instanceof ClientGoneError) return;
  ctx.logError(where, err);
  const message = `internal error: ${err instanceof Error ? err.message : String(err)}`;
  const frame = anthropic
    ? sse.send({ type: 'error', error: { type: 'api_error', message } }, 'error')
    : sse.send({ error: { message, type: 'server_error', param: null, code: null } });
  await frame.catch(() => {});
}
