// Request bodies with a size limit, JSON responses, and an SSE writer that respects backpressure.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { HttpError, badRequest } from './errors.ts';
import { isObject, type JsonObject } from './fields.ts';
import { jsonDepthExceeds, MAX_JSON_DEPTH } from './json-depth.ts';

/**
 * Reads the whole body, or throws 413 as soon as it passes `limit` bytes (a declared
 * Content-Length over the limit is refused before reading anything). After a 413 the rest of
 * the body is never read: the caller answers with `Connection: close`.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const tooLarge = () => new HttpError(413, `the request body is larger than the server's limit of ${limit} bytes`, { code: 'body_too_large' });
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) return Promise.reject(tooLarge());
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        req.pause();
        reject(tooLarge());
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(chunks, size));
    };
    const aborted = () => {
      const of = Number.isFinite(declared) ? ` of ${declared}` : '';
      return new ClientAbortedError(`the client closed the connection while sending the body (${size}${of} bytes received)`);
    };
    // a peer that drops mid-body makes Node emit 'error' (ECONNRESET "aborted"): that is the
    // client leaving, not a server fault
    const onError = (err: Error) => {
      cleanup();
      reject(!req.complete && ((err as NodeJS.ErrnoException).code === 'ECONNRESET' || req.destroyed) ? aborted() : err);
    };
    const onClose = () => {
      cleanup();
      reject(aborted());
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

/** The body as a JSON object, or a 400 that says what is wrong with it. */
export function parseJsonObject(body: Buffer): JsonObject {
  if (body.length === 0) throw badRequest('the request body is empty; expected a JSON object', undefined, 'invalid_json');
  if (jsonDepthExceeds(body, MAX_JSON_DEPTH))
    throw badRequest(`the request body nests arrays and objects more than ${MAX_JSON_DEPTH} deep`, undefined, 'invalid_json');
  let value: unknown;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw badRequest(`the request body is not valid JSON: ${(err as Error).message}`, undefined, 'invalid_json');
  }
  if (!isObject(value)) throw badRequest('the request body must be a JSON object', undefined, 'invalid_json');
  return value;
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    ...headers,
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(text),
  });
  res.end(text);
}

/** The peer went away: nothing more can be written. */
export class ClientGoneError extends Error {}

/** The peer went away before its request body was complete. */
export class ClientAbortedError extends ClientGoneError {}

/**
 * Writes SSE frames one at a time: each write resolves once the socket has taken the data (or
 * after 'drain' when the kernel buffer was full), so a slow reader slows the producer down and
 * the engine pauses its sequence instead of buffering without bound. Writes are serialised, so
 * several producers (n > 1 choices) can share one writer. Once the client is gone every write
 * rejects with ClientGoneError.
 */
export class SseWriter {
  private chain: Promise<void> = Promise.resolve();
  private gone = false;

  constructor(private readonly res: ServerResponse) {
    res.once('close', () => (this.gone = true));
  }

  /** Sends the response head; call once, before the first frame. */
  start(): void {
    this.res.writeHead(200, {
      'Content-Type': 'text/event-stream; charset=utf-8',
      'Cache-Control': 'no-cache',
      Connection: 'keep-alive',
      'X-Accel-Buffering': 'no',
    });
    this.res.flushHeaders();
  }

  get closed(): boolean {
    return this.gone || this.res.destroyed;
  }

  /** `data: JSON\n\n` (OpenAI) or `event: NAME\ndata: JSON\n\n` (Anthropic) */
  send(data: unknown, event?: string): Promise<void> {
    const frame = `${event ? `event: ${event}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`;
    return this.raw(frame);
  }

  raw(frame: string): Promise<void> {
    this.chain = this.chain.then(() => this.writeNow(frame));
    return this.chain;
  }

  end(): void {
    if (!this.closed) this.res.end();
  }

  private writeNow(frame: string): Promise<void> | void {
    if (this.closed) throw new ClientGoneError('the client disconnected');
    if (this.res.write(frame)) return;
    return new Promise<void>((resolve) => {
      const done = () => {
        this.res.off('drain', done);
        this.res.off('close', done);
        resolve();
      };
      this.res.on('drain', done);
      this.res.on('close', done);
    });
  }
}
