// The HTTP server: routes, auth, body limits, error shapes, metrics, graceful shutdown.
//
// Invariants: a request a client got wrong is answered with a 4xx before it reaches the engine
// and never affects another request; every request owns an AbortController that the response's
// 'close' (client gone) aborts, which cancels all its sequences; an unexpected error is a 500,
// logged once to stderr; a request whose client left before any response is counted as 499,
// and one that left mid-body is logged as one "client aborted" line (an abort, not an error).

import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createHash, timingSafeEqual } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { Engine } from '../execution/engine.ts';
import type { LoadedModel } from '../execution/load-model.ts';
import { HttpError, anthropicErrorBody, badRequest, clientErrorOf, openaiErrorBody } from './errors.ts';
import { applyCors, requestLine, type RequestUsage } from './access.ts';
import { ClientAbortedError, ClientGoneError, clientErrorAnswer, expectationFailed, readBody, sendJson } from './http-io.ts';
import { ServerMetrics } from './metrics.ts';
import { ServedModel } from './served-model.ts';
import type { BodyRoute, Prepared, PreparedOf } from './request-prep.ts';
import type { HandlerContext } from './context.ts';
import { handleChat } from './openai-chat.ts';
import { handleCompletions } from './openai-completions.ts';
import { handleCountTokens, handleMessages } from './anthropic.ts';
import type { ToolCallFormatName } from '../generation/tool-calls/index.ts';
import type { SsdWriteError } from '../state/ssd-tier.ts';

export interface ServerOptions {
  engine: Engine;
  loaded: LoadedModel;
  /** the `model` name clients must use */
  servedModelName: string;
  /** when set, every /v1 route needs `Authorization: Bearer KEY` or `x-api-key: KEY` */
  apiKey?: string;
  /** request bodies larger than this get 413 (default 4 MiB) */
  maxBodyBytes?: number;
  /** a request's line and headers must arrive within this, from its first byte (default 60 s); else 408 and the connection closes */
  headersTimeoutMs?: number;
  /** its body within this, from the end of its headers (default 60 s); else 408 and the connection closes */
  bodyTimeoutMs?: number;
  /** internal errors are written here (default stderr) */
  log?: (line: string) => void;
  /** include Node process metrics in /metrics (default true) */
  processMetrics?: boolean;
  /** tool-call format (hermes, llama3_json, mistral); default: detected from the template and vocabulary */
  toolCallFormat?: ToolCallFormatName;
  /** request bodies larger than this are parsed and prepared on a text worker (default served-model.ts INLINE_BODY_BYTES) */
  inlineBodyBytes?: number;
  /** origins browsers may call from (`*`: any; default none: no CORS headers) */
  corsOrigins?: readonly string[];
  /** one line per request on `log` (default true) */
  logRequests?: boolean;
}

export const DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024;
export const DEFAULT_HEADERS_TIMEOUT_MS = 60_000;
export const DEFAULT_BODY_TIMEOUT_MS = 60_000;
/** the status a request is counted under when its client closed the connection before any response (nginx's) */
export const CLIENT_CLOSED_REQUEST = 499;

/** A route's answer to its prepared body (request-prep.ts). */
type Handler = (ctx: HandlerContext, prepared: Prepared) => Promise<void>;

interface Route {
  method: 'GET' | 'POST';
  /** the /v1 routes need the API key and take a JSON body (POST) */
  v1: boolean;
  anthropic?: boolean;
  run: (req: IncomingMessage, res: ServerResponse, route: string) => Promise<void>;
}

export class LlmServer {
  readonly http: http.Server;
  readonly metrics: ServerMetrics;
  readonly model: ServedModel;
  private readonly engine: Engine;
  private readonly apiKeyHash?: Buffer;
  private readonly maxBody: number;
  private readonly bodyTimeoutMs: number;
  private readonly log: (line: string) => void;
  private readonly corsOrigins: ReadonlySet<string>;
  private readonly logRequests: boolean;
  /** tokens of each generation request, for its log line */
  private readonly usageOf = new WeakMap<ServerResponse, RequestUsage>();
  private readonly routes: Map<string, Route[]>;
  private readonly active = new Set<ServerResponse>();
  private shuttingDown = false;

  constructor(opts: ServerOptions) {
    this.engine = opts.engine;
    this.model = new ServedModel(opts.servedModelName, opts.loaded, opts.engine, opts.toolCallFormat,
      opts.inlineBodyBytes === undefined ? {} : { inlineBodyBytes: opts.inlineBodyBytes });
    this.metrics = new ServerMetrics(() => this.engine.stats, { processMetrics: opts.processMetrics });
    this.apiKeyHash = opts.apiKey === undefined ? undefined : sha256(opts.apiKey);
    this.maxBody = opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    this.log = opts.log ?? ((line) => process.stderr.write(`${line}\n`));
    this.corsOrigins = new Set(opts.corsOrigins ?? []);
    this.logRequests = opts.logRequests ?? true;
    const post = <R extends BodyRoute>(body: R, handler: (ctx: HandlerContext, prepared: PreparedOf<R>) => Promise<void>, anthropic = false): Route => ({
      method: 'POST', v1: true, anthropic, run: (req, res, route) => this.generation(req, res, route, body, handler as Handler),
    });
    this.routes = new Map<string, Route[]>([
      ['/', [{ method: 'GET', v1: false, run: async (_req, res) => sendJson(res, 200, { object: 'server', name: 'llmts', model: this.model.name }) }]],
      ['/health', [{ method: 'GET', v1: false, run: async (_req, res) => this.health(res) }]],
      ['/metrics', [{ method: 'GET', v1: false, run: async (_req, res) => this.sendMetrics(res) }]],
      ['/v1/models', [{ method: 'GET', v1: true, run: async (req, res) => this.models(req, res) }]],
      ['/v1/chat/completions', [post('chat', handleChat)]],
      ['/v1/completions', [post('completions', handleCompletions)]],
      ['/v1/messages', [post('messages', handleMessages, true)]],
      ['/v1/messages/count_tokens', [post('count_tokens', handleCountTokens, true)]],
      ['/v1/models/{id}', [{ method: 'GET', v1: true, run: async (req, res, route) => this.model1(req, res, route) }]],
      // v1: true = behind --api-key like the /v1 routes
      ['/admin/cache/flush', [{ method: 'POST', v1: true, run: async (_req, res) => this.flushCache(res) }]],
    ]);
    // Node's timers take whole milliseconds
    const headersTimeout = Math.ceil(opts.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS);
    this.bodyTimeoutMs = Math.ceil(opts.bodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS);
    this.http = http.createServer({
      headersTimeout,
      // bounds receiving a request, never a long generation; readBody's own deadline cuts a slow
      // body first (with a JSON 408), this is the backstop
      requestTimeout: headersTimeout + this.bodyTimeoutMs + 1000,
      // Node checks those deadlines this often (default 30 s, which would let a slow client stay
      // up to 30 s past its deadline)
      connectionsCheckingInterval: Math.min(1000, headersTimeout),
      // dispatch refuses a missing Host itself, in the error shape (Node's 400 has no body)
      requireHostHeader: false,
    }, (req, res) => void this.dispatch(req, res));
    this.http.on('clientError', clientErrorAnswer(headersTimeout));
    this.http.on('checkExpectation', expectationFailed);
  }

  listen(port: number, host: string): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      this.http.once('error', reject);
      this.http.listen(port, host, () => {
        this.http.off('error', reject);
        resolve(this.http.address() as AddressInfo);
      });
    });
  }

  /** requests being answered now */
  get inFlight(): number {
    return this.active.size;
  }

  /**
   * Graceful stop: refuse new connections and requests (503), let the running ones finish for
   * up to `graceMs`, then cancel what is left and close every connection. The engine is closed
   * (its model freed); the caller closes the backend.
   */
  async shutdown(graceMs: number): Promise<void> {
    this.shuttingDown = true;
    const closed = new Promise<void>((resolve) => this.http.close(() => resolve()));
    this.http.closeIdleConnections();
    await waitFor(() => this.active.size === 0, graceMs);
    await this.engine.close(0); // cancels whatever is still running; their responses end now
    await waitFor(() => this.active.size === 0, 2000);
    this.http.closeAllConnections();
    await closed;
  }

  private async dispatch(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    const key = path.length > 1 ? path.replace(/\/+$/, '') : path;
    const candidates = this.routes.get(key.startsWith('/v1/models/') ? '/v1/models/{id}' : key);
    const route = candidates?.find((r) => r.method === req.method || (req.method === 'HEAD' && r.method === 'GET'));
    const label = !candidates ? 'unmatched' : key.startsWith('/v1/models/') ? '/v1/models/{id}' : key;
    const anthropic = candidates?.[0]?.anthropic ?? false;
    const startedAt = performance.now();
    this.active.add(res);
    this.metrics.inFlight.inc();
    res.once('close', () => {
      this.active.delete(res);
      this.metrics.inFlight.dec();
      // closed before any response was sent: the client left (nginx's 499), whatever statusCode holds
      const status = !res.headersSent && !res.writableFinished ? String(CLIENT_CLOSED_REQUEST) : String(res.statusCode);
      this.metrics.requests.inc({ route: label, method: req.method ?? '', status });
      if (this.logRequests) this.log(requestLine(req.method ?? '', path, status, performance.now() - startedAt, this.usageOf.get(res)));
    });
    if (this.shuttingDown) res.setHeader('Connection', 'close');
    if (applyCors(this.corsOrigins, req, res)) return;
    try {
      if (req.httpVersionMajor === 1 && req.httpVersionMinor >= 1 && req.headers.host === undefined)
        throw new HttpError(400, 'an HTTP/1.1 request needs a Host header', { code: 'malformed_http', headers: { Connection: 'close' } });
      if (!candidates) throw new HttpError(404, `no route ${req.method} ${path}`, { code: 'unknown_route' });
      if (!route) {
        const allow = candidates.map((r) => r.method).join(', ');
        throw new HttpError(405, `${req.method} is not allowed on ${path} (allowed: ${allow})`, { code: 'method_not_allowed', headers: { Allow: allow } });
      }
      if (this.shuttingDown && path !== '/metrics' && path !== '/health')
        throw new HttpError(503, 'the server is shutting down', { code: 'shutting_down' });
      if (route.v1) this.authenticate(req);
      await route.run(req, res, path);
    } catch (err) {
      this.fail(req, res, err, anthropic);
    }
  }

  private authenticate(req: IncomingMessage): void {
    if (!this.apiKeyHash) return;
    const auth = req.headers.authorization;
    const bearer = typeof auth === 'string' && /^Bearer\s+/i.test(auth) ? auth.replace(/^Bearer\s+/i, '').trim() : undefined;
    const xKey = req.headers['x-api-key'];
    const given = [bearer, typeof xKey === 'string' ? xKey.trim() : undefined].filter((k): k is string => k !== undefined);
    if (given.length === 0) throw new HttpError(401, 'missing API key: send "Authorization: Bearer KEY" or "x-api-key: KEY"', { code: 'invalid_api_key' });
    if (!given.some((k) => timingSafeEqual(sha256(k), this.apiKeyHash!))) throw new HttpError(401, 'invalid API key', { code: 'invalid_api_key' });
  }

  private async generation(req: IncomingMessage, res: ServerResponse, route: string, bodyRoute: BodyRoute, handler: Handler): Promise<void> {
    const startedAt = performance.now();
    const ac = new AbortController();
    res.once('close', () => {
      if (!res.writableFinished) ac.abort();
    });
    let raw: Buffer;
    try {
      raw = await readBody(req, this.maxBody, this.bodyTimeoutMs);
    } catch (err) {
      if (err instanceof HttpError && err.status === 413) {
        // The rest of the body is never buffered, only discarded while the client finishes
        // sending it: closing with unread data would reset the connection and the client might
        // lose the 413. A client still sending after 5 s is cut off.
        req.resume();
        setTimeout(() => {
          if (!req.complete) req.socket.destroy();
        }, 5000).unref();
      }
      throw err;
    }
    // parsed and validated here or, when large, on a text worker (which the client leaving cancels)
    const prepared = await this.model.prepareBody(bodyRoute, raw, ac.signal);
    const usage: RequestUsage = { promptTokens: 0, completionTokens: 0 };
    this.usageOf.set(res, usage);
    const ctx: HandlerContext = {
      engine: this.engine,
      metrics: this.metrics,
      usage,
      model: this.model,
      res,
      signal: ac.signal,
      abort: () => ac.abort(),
      startedAt,
      logError: (where, err) => this.logInternal(`${req.method} ${route}`, where, err),
    };
    await handler(ctx, prepared);
  }

  /** POST /admin/cache/flush: writes the prefix cache's pending prefixes to the SSD tier now. */
  private async flushCache(res: ServerResponse): Promise<void> {
    const written = await this.engine.flushPrefixCache();
    const p = this.engine.stats.prefixCache;
    sendJson(res, 200, {
      object: 'prefix_cache.flush',
      ssd_enabled: p.ssd !== undefined,
      ...(p.ssd ? {} : { reason: p.ssdOff ?? (p.enabled ? 'no --cache-dir' : `prefix reuse is off: ${p.off}`) }),
      files_written: written.files,
      bytes_written: written.bytes,
      // writes that failed (disk full, read-only, ...), one entry per errno code
      write_errors: groupWriteErrors(written.errors),
      ssd_files: p.ssd?.files ?? 0,
      ssd_bytes: p.ssd?.bytes ?? 0,
      // failed writes since start by errno code, background (idle, eviction) spills included
      ssd_write_errors: p.ssd?.writeErrors ?? {},
    });
  }

  private health(res: ServerResponse): void {
    if (this.shuttingDown) sendJson(res, 503, { status: 'shutting_down' });
    else sendJson(res, 200, { status: 'ok' });
  }

  private async sendMetrics(res: ServerResponse): Promise<void> {
    const text = await this.metrics.text();
    res.writeHead(200, { 'Content-Type': this.metrics.contentType, 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  }

  /** GET /v1/models/{id}: the served model, or 404 */
  private model1(req: IncomingMessage, res: ServerResponse, path: string): void {
    let id: string;
    try {
      id = decodeURIComponent(path.slice('/v1/models/'.length).replace(/\/+$/, ''));
    } catch {
      throw badRequest(`malformed model id in ${path}`, 'model');
    }
    const m = this.model;
    if (id !== m.name) throw new HttpError(404, `the model "${id}" does not exist; this server serves "${m.name}"`, { param: 'model', code: 'model_not_found' });
    if (req.headers['anthropic-version'] !== undefined)
      sendJson(res, 200, { type: 'model', id: m.name, display_name: m.name, created_at: new Date(m.created * 1000).toISOString() });
    else sendJson(res, 200, { id: m.name, object: 'model', created: m.created, owned_by: 'llmts', max_model_len: m.contextLen });
  }

  private models(req: IncomingMessage, res: ServerResponse): void {
    const m = this.model;
    if (req.headers['anthropic-version'] !== undefined) {
      // Anthropic's list shape, for its SDK's models.list()
      const created_at = new Date(m.created * 1000).toISOString();
      sendJson(res, 200, { data: [{ type: 'model', id: m.name, display_name: m.name, created_at }], has_more: false, first_id: m.name, last_id: m.name });
      return;
    }
    sendJson(res, 200, {
      object: 'list',
      data: [{ id: m.name, object: 'model', created: m.created, owned_by: 'llmts', max_model_len: m.contextLen }],
    });
  }

  private fail(req: IncomingMessage, res: ServerResponse, err: unknown, anthropic: boolean): void {
    if (err instanceof ClientAbortedError) {
      this.log(`llmts serve: client aborted ${req.method} ${req.url}: ${err.message}`);
      if (!res.destroyed) res.destroy();
      return;
    }
    if (err instanceof ClientGoneError) return;
    let httpErr = clientErrorOf(err);
    if (!httpErr) {
      this.logInternal(`${req.method} ${req.url}`, 'request', err);
      httpErr = new HttpError(500, `internal error: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (res.headersSent || res.destroyed) {
      if (!res.writableEnded) res.end();
      return;
    }
    sendJson(res, httpErr.status, anthropic ? anthropicErrorBody(httpErr) : openaiErrorBody(httpErr), httpErr.options.headers);
  }

  private logInternal(request: string, where: string, err: unknown): void {
    const detail = err instanceof Error ? err.stack ?? err.message : String(err);
    this.log(`llmts serve: internal error in ${request} (${where}): ${detail}`);
  }
}

function groupWriteErrors(errors: readonly SsdWriteError[]): { code: string; count: number; message: string }[] {
  const byCode = new Map<string, { code: string; count: number; message: string }>();
  for (const e of errors) {
    const g = byCode.get(e.code);
    if (g) g.count++;
    else byCode.set(e.code, { code: e.code, count: 1, message: e.message });
  }
  return [...byCode.values()];
}

function sha256(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

async function waitFor(cond: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
}
