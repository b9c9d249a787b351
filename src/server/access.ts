// Who may call the server from a browser (CORS), and the one log line each request leaves.

import type { IncomingMessage, ServerResponse } from 'node:http';

/** A --cors-origin value: `*`, or an origin as browsers send it (scheme://host[:port], no path). */
export function checkCorsOrigin(origin: string): string | undefined {
  if (origin === '*') return undefined;
  let u: URL;
  try {
    u = new URL(origin);
  } catch {
    return `"${origin}" is not an origin (scheme://host[:port]) or *`;
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return `"${origin}" is not an origin: its scheme must be http or https (scheme://host[:port])`;
  if (u.origin !== origin) return `"${origin}" is not an origin as browsers send it: did you mean "${u.origin}"?`;
  return undefined;
}

/** the request headers a preflight may ask for when it names none */
const DEFAULT_ALLOWED_HEADERS = 'authorization, content-type, x-api-key, anthropic-version, anthropic-beta, openai-beta';

/**
 * CORS for `origins` (empty: off, no header is ever sent). A request from an allowed origin gets
 * Access-Control-Allow-Origin (and Vary: Origin); its preflight (OPTIONS with
 * Access-Control-Request-Method) is answered 204 here, before routing and authentication, as
 * browsers send no credentials in a preflight. Returns true when the request was answered.
 */
export function applyCors(origins: ReadonlySet<string>, req: IncomingMessage, res: ServerResponse): boolean {
  const origin = req.headers.origin;
  if (origins.size === 0 || typeof origin !== 'string') return false;
  const any = origins.has('*');
  if (!any && !origins.has(origin)) return false;
  res.setHeader('Access-Control-Allow-Origin', any ? '*' : origin);
  if (!any) res.setHeader('Vary', 'Origin');
  res.setHeader('Access-Control-Expose-Headers', 'content-type, retry-after');
  if (req.method !== 'OPTIONS' || req.headers['access-control-request-method'] === undefined) return false;
  const asked = req.headers['access-control-request-headers'];
  res.writeHead(204, {
    'Access-Control-Allow-Methods': 'GET, POST, DELETE, OPTIONS',
    'Access-Control-Allow-Headers': typeof asked === 'string' && asked.trim() !== '' ? asked : DEFAULT_ALLOWED_HEADERS,
    'Access-Control-Max-Age': '600',
    'Content-Length': '0',
  });
  res.end();
  return true;
}

/** The tokens a request used, as its sequences report them (the log line's). */
export interface RequestUsage {
  promptTokens: number;
  completionTokens: number;
}

/** at most this much of a path goes into a log line */
const MAX_LOGGED_PATH = 200;

/**
 * One request's log line: method, path (control characters replaced, cut at 200 characters:
 * the client chose it), status, tokens when it generated, milliseconds.
 */
export function requestLine(method: string, path: string, status: string, ms: number, usage?: RequestUsage): string {
  let p = path.replace(/[\u0000-\u001f\u007f-\u009f]/g, '?');
  if (p.length > MAX_LOGGED_PATH) p = `${p.slice(0, MAX_LOGGED_PATH)}...`;
  const tokens = usage && (usage.promptTokens > 0 || usage.completionTokens > 0)
    ? ` ${usage.promptTokens} prompt + ${usage.completionTokens} completion tokens` : '';
  return `llmts serve: ${method.slice(0, 16)} ${p} ${status}${tokens} ${ms.toFixed(0)} ms`;
}
