// HTTP errors and their two wire shapes. Every failure a client can cause becomes an HttpError
// with a 4xx status before anything reaches the engine; engine refusals (context, queue, KV,
// sampling ranges, template) are mapped here. Anything else is an internal error: 500.

import { ContextLengthError, EngineClosedError } from '../execution/engine.ts';
import { NeverFitsError, QueueFullError } from '../execution/scheduler.ts';
import { SamplingParamsError } from '../sampling/index.ts';
import { ChatTemplateError } from '../artifacts/chat-template.ts';
import { GrammarSpecError } from '../sampling/grammar/index.ts';
import { HttpError, badRequest } from './http-error.ts';

export { HttpError, badRequest, notSupported, type HttpErrorOptions } from './http-error.ts';

const OPENAI_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  404: 'not_found_error',
  405: 'invalid_request_error',
  413: 'invalid_request_error',
  429: 'rate_limit_error',
  500: 'server_error',
  503: 'service_unavailable',
};

const ANTHROPIC_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  404: 'not_found_error',
  405: 'invalid_request_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  503: 'overloaded_error',
};

export function openaiErrorBody(e: HttpError): { error: { message: string; type: string; param: string | null; code: string | null } } {
  return {
    error: {
      message: e.message,
      type: e.options.type ?? OPENAI_TYPES[e.status] ?? (e.status >= 500 ? 'server_error' : 'invalid_request_error'),
      param: e.options.param ?? null,
      code: e.options.code ?? null,
    },
  };
}

export function anthropicErrorBody(e: HttpError): { type: 'error'; error: { type: string; message: string } } {
  return {
    type: 'error',
    error: { type: ANTHROPIC_TYPES[e.status] ?? (e.status >= 500 ? 'api_error' : 'invalid_request_error'), message: e.message },
  };
}

/**
 * The client-caused errors the layers below throw, as HTTP errors; undefined for anything else
 * (an internal error). RangeError is a client error only where the engine validates a request
 * (`submit`), so callers pass `fromSubmit` to say where it came from.
 */
export function clientErrorOf(err: unknown, fromSubmit = false): HttpError | undefined {
  if (err instanceof HttpError) return err;
  if (err instanceof ContextLengthError) return badRequest(err.message, undefined, 'context_length_exceeded');
  if (err instanceof NeverFitsError) return badRequest(err.message, 'max_tokens', 'context_length_exceeded');
  if (err instanceof QueueFullError) return new HttpError(429, `${err.message}; retry later`, { code: 'queue_full', headers: { 'Retry-After': '1' } });
  if (err instanceof EngineClosedError) return new HttpError(503, err.message, { code: 'shutting_down' });
  if (err instanceof SamplingParamsError) return badRequest(err.message, err.issues[0]?.param);
  if (err instanceof GrammarSpecError) return badRequest(err.message, undefined, 'invalid_grammar');
  if (err instanceof ChatTemplateError) return badRequest(`the chat template refused the messages: ${err.message}`, 'messages', 'chat_template_error');
  if (fromSubmit && err instanceof RangeError) return badRequest(err.message);
  return undefined;
}
