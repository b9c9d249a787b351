// How deep a request body nests, found before JSON.parse: V8 parses a body of millions of nested
// arrays (4 MiB of "[[[[...") in about a second on the event loop, and every walk of the parsed
// value after it risks the stack. No request field needs more than a few dozen levels.
// parseJsonObject is the one body parser, on the event loop for small bodies and on a text worker
// for large ones (request-prep.ts), so both refuse the same bodies with the same messages.

import { badRequest } from './http-error.ts';
import { isObject, type JsonObject } from './fields.ts';

/** arrays and objects a request body may nest (serde_json's default is 128) */
export const MAX_JSON_DEPTH = 256;

/** Whether the JSON text in `buf` opens more than `max` arrays or objects inside each other. */
export function jsonDepthExceeds(buf: Uint8Array, max: number): boolean {
  let depth = 0;
  const n = buf.length;
  for (let i = 0; i < n; i++) {
    const c = buf[i];
    if (c === 0x22) i = stringEnd(buf, i + 1); // '"': brackets inside strings do not count
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/**
 * The index of the quote that closes the string starting at `from` (or the end). UTF-8 never puts
 * a quote or backslash byte inside a multi-byte character, so bytes are enough. Short strings are
 * stepped through here; a long one's next quote is found by indexOf, and is the closing one when
 * an even run of backslashes precedes it.
 */
function stringEnd(buf: Uint8Array, from: number): number {
  const n = buf.length;
  const near = Math.min(n, from + 32);
  let i = from;
  for (; i < near; i++) {
    const c = buf[i];
    if (c === 0x5c) i++;
    else if (c === 0x22) return i;
  }
  if (i >= n) return n;
  for (;;) {
    const q = buf.indexOf(0x22, i);
    if (q < 0) return n;
    let k = q - 1;
    while (k >= from && buf[k] === 0x5c) k--;
    if ((q - 1 - k) % 2 === 0) return q;
    i = q + 1;
  }
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
