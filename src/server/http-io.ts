// Request bodies with a size limit, JSON responses, and an SSE writer that respects backpressure.

import { STATUS_CODES, maxHeaderSize, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { HttpError, openaiErrorBody } from './errors.ts';

export { parseJsonObject } from './json-depth.ts';

/**
 * Reads the whole body, or throws 413 as soon as it passes `limit` bytes (a declared
 * Content-Length over the limit is refused before reading anything). After a 413 the rest of
 * the body is never read: the caller answers with `Connection: close`. A body still incomplete
 * `timeoutMs` after the headers is a 408 (with `Connection: close`): a client trickling its body
 * would otherwise hold the connection for as long as it likes.
 */
export function readBody(req: IncomingMessage, limit: number, timeoutMs = 0): Promise<Buffer> {
  const tooLarge = () => new HttpError(413, `the request body is larger than the server's limit of ${limit} bytes`, { code: 'body_too_large' });
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) return Promise.reject(tooLarge());
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const of = () => (Number.isFinite(declared) ? ` of ${declared}` : '');
    const timer = timeoutMs > 0
      ? setTimeout(() => {
        cleanup();
        req.pause();
        reject(new HttpError(408, `the request body did not arrive within ${timeoutMs / 1000} s (${size}${of()} bytes received)`, {
          code: 'body_timeout', headers: { Connection: 'close' },
        }));
      }, timeoutMs)
      : undefined;
    const cleanup = () => {
      clearTimeout(timer);
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
    const aborted = () => new ClientAbortedError(`the client closed the connection while sending the body (${size}${of()} bytes received)`);
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

/**
 * The answer to what Node's HTTP parser refuses (a malformed request line, header or body
 * framing; headers over Node's size limit; headers that do not arrive within `headersTimeoutMs`):
 * an error in the OpenAI shape (no route is known yet; Node's own answer has no body), then the
 * connection is closed. A body that breaks the framing while its handler reads it is that
 * handler's 400, in its route's shape; bytes that break it after a pipelined request still being
 * answered get theirs once that answer is out. A connection the peer reset is only closed.
 */
export function clientErrorAnswer(headersTimeoutMs: number): (err: NodeJS.ErrnoException & { reason?: string }, socket: Duplex) => void {
  // the parser may report more errors on the same connection: the first one is answered
  const answered = new WeakSet<Duplex>();
  return (err, socket) => {
    if (answered.has(socket)) return;
    answered.add(socket);
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const inFlight = (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage;
    if (inFlight && !inFlight.writableFinished) {
      const req = inFlight.req;
      // the peer ended its side mid-request: answered here, then closed, and its handler sees a
      // client that left (499), as when it drops the connection
      if (req && !req.complete && err.code === 'HPE_INVALID_EOF_STATE') {
        answer(err, socket, headersTimeoutMs);
        return;
      }
      if (req && !req.complete && req.listenerCount('error') > 0) {
        req.emit('error', new HttpError(400, `the request body is not valid HTTP/1.1 framing: ${err.reason ?? err.message}`, {
          code: 'malformed_http', headers: { Connection: 'close' },
        }));
        return;
      }
      inFlight.once('finish', () => answer(err, socket, headersTimeoutMs));
      inFlight.once('close', () => {
        if (!inFlight.writableFinished) socket.destroy();
      });
      return;
    }
    answer(err, socket, headersTimeoutMs);
  };
}

function answer(err: NodeJS.ErrnoException & { reason?: string }, socket: Duplex, headersTimeoutMs: number): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const e =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new HttpError(431, `the request line and headers are larger than the server's limit of ${maxHeaderSize} bytes`, { code: 'headers_too_large' })
      : err.code === 'HPE_CHUNK_EXTENSIONS_OVERFLOW'
        ? new HttpError(413, 'the chunk extensions of the request body are too large', { code: 'body_too_large' })
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? new HttpError(408, `the request's headers did not arrive within ${headersTimeoutMs / 1000} s`, { code: 'header_timeout' })
          : new HttpError(400, `the request is not valid HTTP/1.1: ${err.reason ?? err.message}${err.code ? ` (${err.code})` : ''}`, { code: 'malformed_http' });
  const body = JSON.stringify(openaiErrorBody(e));
  // destroyed once written: a peer that keeps sending (or never reads) must not keep it open
  const timer = setTimeout(() => socket.destroy(), 2000);
  timer.unref();
  const head = `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n`;
  socket.end(head + body, () => {
    clearTimeout(timer);
    socket.destroy();
  });
}

/** Node's answer to an Expect header other than 100-continue (417), in the OpenAI error shape: Node's own has no body. */
export function expectationFailed(req: IncomingMessage, res: ServerResponse): void {
  const e = new HttpError(417, `the Expect header ${JSON.stringify(req.headers.expect ?? '')} is not supported (only "100-continue" is)`, { code: 'expectation_failed' });
  // the body a client may send anyway is never read: the connection closes after the answer
  sendJson(res, 417, openaiErrorBody(e), { Connection: 'close' });
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
