// The HTTP error a request can be refused with, and its constructors: a module of its own, with
// no imports, so the code that validates a request body loads nothing else (a text worker parses
// large bodies with it: errors.ts, which maps engine refusals, would load the engine).

export interface HttpErrorOptions {
  /** OpenAI error type; derived from the status when omitted */
  type?: string;
  /** the request field at fault (OpenAI `param`) */
  param?: string | null;
  /** a stable machine-readable code (OpenAI `code`) */
  code?: string | null;
  /** extra response headers (Allow, Retry-After, ...) */
  headers?: Record<string, string>;
}

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly options: HttpErrorOptions = {},
  ) {
    super(message);
    this.name = 'HttpError';
  }
}

export const badRequest = (message: string, param?: string, code?: string): HttpError =>
  new HttpError(400, message, { param: param ?? null, code: code ?? null });

/** A parameter the contract names but this build does not implement yet: refused, never ignored. */
export const notSupported = (what: string, param: string): HttpError =>
  badRequest(`${what} is not supported yet`, param, 'not_supported');
