// What `llmts serve` means, as a typed object an application passes to startServer (serve.ts):
// every serve flag has a field here, with the same default. This module checks what can be
// checked before a backend is opened and fills in the defaults; serve.ts checks the rest
// (what the backend keeps, what the KV budget holds) as it opens them.
//
// Messages name the options as ServeOptions spells them, or as `optionNames` does (the CLI:
// its flags), so one check speaks to both callers.

import { ONLINE_QUANTIZATIONS, type OnlineQuantization } from '../artifacts/online-quant.ts';
import fs from 'node:fs';
import path from 'node:path';
import type { DType } from '../contracts/backend.ts';
import { parseDevice, type BackendSettings, type Device } from '../execution/devices.ts';
import type { EngineSettings } from '../execution/engine-settings.ts';
import { DEFAULT_BODY_TIMEOUT_MS, DEFAULT_HEADERS_TIMEOUT_MS, DEFAULT_MAX_BODY_BYTES } from '../server/server.ts';
import { TOOL_CALL_FORMATS, type ToolCallFormatName } from '../generation/tool-calls/index.ts';
import { DEFAULT_GRAMMAR_CACHE_BYTES, MIN_GRAMMAR_CACHE_BYTES, setGrammarDefaults } from '../sampling/grammar/index.ts';
import { resolveSpeculative, type SpeculativeOptions } from '../execution/methods/speculative.ts';
import { checkCorsOrigin } from '../server/access.ts';

export interface ServeOptions {
  /** Hugging Face model directory */
  model: string;
  /** address to listen on (default 127.0.0.1) */
  host?: string;
  /** port (default 8000; 0 = any free port: the handle's `port` says which) */
  port?: number;
  /** the `model` clients must send (default: the directory's base name) */
  servedModelName?: string;
  /** when set, /v1 routes need `Authorization: Bearer KEY` or `x-api-key: KEY` (default: no auth) */
  apiKey?: string;
  /** sequences decoding together (default 16) */
  maxBatch?: number;
  /** sequences waiting for admission before 429 (default: the engine's, 256) */
  maxQueued?: number;
  /** longest sequence, prompt + output (default: the model's maximum) */
  maxModelLen?: number;
  /** bytes for the KV cache (default: room for maxBatch sequences of maxModelLen, as far as the memory plan allows) */
  kvBudgetBytes?: number;
  /** what the KV cache holds (default: the backend's activation dtype) */
  kvDtype?: DType;
  /** CPU: quantize a safetensors checkpoint's matrices as they load ('q8_0' | 'q4_0') */
  quantization?: OnlineQuantization;
  /** CUDA: fraction of device memory for weights, KV cache and activations (default 0.9) */
  gpuMemoryUtilization?: number;
  /** default auto: CUDA where it is usable, else the CPU */
  device?: Device;
  /** largest request body (default 4 MiB); larger gets 413 */
  maxBodyBytes?: number;
  /** a request's line and headers must arrive within this, from its first byte (default 60 s); else 408 and the connection closes */
  headersTimeoutMs?: number;
  /** a request's body must arrive within this, from the end of its headers (default 60 s); else 408 and the connection closes */
  bodyTimeoutMs?: number;
  /** how long running requests may finish when the handle closes (default 30 s) */
  shutdownGraceMs?: number;
  /** prefix cache (RAM tier) bytes (default: the whole KV pool; 0 = off) */
  promptCacheBytes?: number;
  /** prefix cache SSD tier: a writable directory (created if missing) */
  cacheDir?: string;
  /** byte cap of the SSD tier (default: 8 GiB, or half the directory's free space if less) */
  cacheDirBytes?: number;
  /**
   * bytes of compiled grammars (structured output, forced tool calls) kept for reuse; a grammar
   * that alone needs more is a 400 (default 256 MiB, at least 1 MiB). Process-wide: it applies
   * to the grammar compilers created after startServer resolves it.
   */
  grammarCacheBytes?: number;
  /** how the model writes tool calls (default: detected from the chat template and vocabulary) */
  toolCallFormat?: ToolCallFormatName;
  /** run every decode batch size once before listening (default: on for CUDA, off for the CPU) */
  warmup?: boolean;
  /** origins browsers may call the server from: `*`, or scheme://host[:port] (default none: no CORS) */
  corsOrigins?: string[];
  /** one line per request on stderr: method, path, status, tokens, milliseconds (default true) */
  logRequests?: boolean;
  /**
   * CUDA: batch-invariant mode, a request's tokens and logprobs the same whatever other requests
   * share its steps (backendSettings.cuda.batchInvariant; default: $LLMTS_CUDA_BATCH_INVARIANT, off)
   */
  batchInvariant?: boolean;
  /**
   * speculative decoding for every request (default: none): `{ proposer: 'ngram', numDraftTokens:
   * N | 'adaptive', ngramMin, ngramMax }` (`--speculative ngram`, `--num-draft-tokens`,
   * `--ngram-min`, `--ngram-max`)
   */
  speculative?: SpeculativeOptions;
  /**
   * the drafter of `speculative: { proposer: 'draft' | 'eagle3' }` (`--draft-model DIR`): a draft
   * model's directory (sharing the target's tokenizer) or an EAGLE-3 head's (made for the target),
   * loaded on the same backend
   */
  draftModel?: string;
  /** the backend's knobs set in code, as load() takes them; the rest come from the LLMTS_* environment */
  backendSettings?: BackendSettings;
  /** the engine's knobs set in code (pipeline, deviceSampling, graphs); the rest come from the environment */
  engineSettings?: Partial<EngineSettings>;
  /** startup and shutdown notes, one line each (default: none) */
  log?: (line: string) => void;
  /** how messages name the options (default: as ServeOptions spells them) */
  optionNames?: Partial<Record<ServeOptionName, string>>;
}

/** the options a message can name */
export type ServeOptionName = Exclude<keyof ServeOptions, 'backendSettings' | 'engineSettings' | 'log' | 'optionNames'>;

/** An option's value is not one startServer can serve with; `option` names the field at fault. */
export class ServeOptionsError extends Error {
  constructor(message: string, readonly option: ServeOptionName) {
    super(message);
    this.name = 'ServeOptionsError';
  }
}

export const SERVE_DEFAULTS = {
  host: '127.0.0.1',
  port: 8000,
  /** the engine's default; passed explicitly so the KV plan sizes the pool for the same batch */
  maxBatch: 16,
  maxBodyBytes: DEFAULT_MAX_BODY_BYTES,
  headersTimeoutMs: DEFAULT_HEADERS_TIMEOUT_MS,
  bodyTimeoutMs: DEFAULT_BODY_TIMEOUT_MS,
  shutdownGraceMs: 30_000,
  device: 'auto',
  cacheDirBytes: 8 * 2 ** 30,
} as const;

/** ServeOptions with their defaults in; those still optional mean "the engine's or the backend's choice". */
export interface ResolvedServeOptions extends Omit<ServeOptions, 'optionNames'> {
  host: string;
  port: number;
  servedModelName: string;
  maxBatch: number;
  maxBodyBytes: number;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
  shutdownGraceMs: number;
  device: Device;
  /** 0 without a cache directory */
  cacheDirBytes: number;
  log: (line: string) => void;
  /** spells an option as the caller's messages do */
  nameOf: (option: ServeOptionName) => string;
}

/**
 * Checks what needs no backend and fills in the defaults. Creates `cacheDir` if it is missing
 * (the SSD tier must be writable before the server says it listens).
 */
export function resolveServeOptions(o: ServeOptions): ResolvedServeOptions {
  const nameOf = (option: ServeOptionName) => o.optionNames?.[option] ?? option;
  const fail = (option: ServeOptionName, message: string): never => {
    throw new ServeOptionsError(message, option);
  };
  const wholeNumber = (option: 'port' | 'maxBatch' | 'maxQueued' | 'maxModelLen' | 'kvBudgetBytes' | 'promptCacheBytes', min: number, max = Infinity) => {
    const x = o[option];
    if (x === undefined) return;
    if (typeof x !== 'number' || !Number.isInteger(x)) fail(option, `${nameOf(option)} must be an integer, got ${JSON.stringify(x)}`);
    if (x < min) fail(option, `${nameOf(option)} must be >= ${min}, got ${x}`);
    if (x > max) fail(option, `${nameOf(option)} must be <= ${max}, got ${x}`);
  };

  if (typeof o.model !== 'string' || o.model === '') fail('model', `${nameOf('model')} is required`);
  wholeNumber('port', 0, 65535);
  const servedModelName = o.servedModelName ?? path.basename(path.resolve(o.model));
  if (servedModelName.trim() === '') fail('servedModelName', `${nameOf('servedModelName')} must not be empty`);
  if (o.apiKey === '') fail('apiKey', `${nameOf('apiKey')} must not be empty`);
  wholeNumber('maxBatch', 1);
  wholeNumber('maxQueued', 0);
  wholeNumber('maxModelLen', 2);
  wholeNumber('kvBudgetBytes', 0);
  const u = o.gpuMemoryUtilization;
  if (u !== undefined && !(u > 0 && u <= 1)) fail('gpuMemoryUtilization', `${nameOf('gpuMemoryUtilization')} must be in (0, 1], got ${u}`);
  if (u !== undefined && o.kvBudgetBytes !== undefined)
    fail('kvBudgetBytes', `give ${nameOf('kvBudgetBytes')} or ${nameOf('gpuMemoryUtilization')}, not both`);
  if (!atLeastOneByte(o.maxBodyBytes)) fail('maxBodyBytes', `${nameOf('maxBodyBytes')} must be at least 1 byte`);
  for (const option of ['headersTimeoutMs', 'bodyTimeoutMs'] as const) {
    const ms = o[option];
    // at least a millisecond: Node reads 0 as "no deadline", which would let slow clients stay forever
    if (ms !== undefined && !(typeof ms === 'number' && ms >= 1 && ms <= 2 ** 31 - 1))
      fail(option, `${nameOf(option)} must be between 1 ms and 24 days, got ${JSON.stringify(ms)} ms`);
  }
  const grace = o.shutdownGraceMs;
  if (grace !== undefined && !(typeof grace === 'number' && grace >= 0)) fail('shutdownGraceMs', `${nameOf('shutdownGraceMs')} must be >= 0, got ${grace}`);
  const device = parseDevice(o.device);
  wholeNumber('promptCacheBytes', 0);
  if (o.toolCallFormat !== undefined && !TOOL_CALL_FORMATS.includes(o.toolCallFormat))
    fail('toolCallFormat', `${nameOf('toolCallFormat')} must be one of ${TOOL_CALL_FORMATS.join(', ')}, got ${JSON.stringify(o.toolCallFormat)}`);
  const cacheDirBytes = cacheDirBytesOf(o, nameOf, fail);
  const g = o.grammarCacheBytes;
  if (g !== undefined && !(Number.isSafeInteger(g) && g >= MIN_GRAMMAR_CACHE_BYTES))
    fail('grammarCacheBytes', `${nameOf('grammarCacheBytes')} must be a whole number of bytes, at least 1 MiB, got ${JSON.stringify(g)}`);
  // the grammar compiler is created on the first structured request, with the defaults of then
  setGrammarDefaults({ cacheBytes: g ?? DEFAULT_GRAMMAR_CACHE_BYTES });

  if (o.corsOrigins !== undefined) {
    if (!Array.isArray(o.corsOrigins)) fail('corsOrigins', `${nameOf('corsOrigins')} must be a list of origins, got ${JSON.stringify(o.corsOrigins)}`);
    for (const origin of o.corsOrigins) {
      const bad = typeof origin === 'string' ? checkCorsOrigin(origin) : `${JSON.stringify(origin)} is not a string`;
      if (bad) fail('corsOrigins', `${nameOf('corsOrigins')}: ${bad}`);
    }
  }
  if (o.logRequests !== undefined && typeof o.logRequests !== 'boolean')
    fail('logRequests', `${nameOf('logRequests')} must be true or false, got ${JSON.stringify(o.logRequests)}`);
  if (o.speculative !== undefined) {
    try {
      resolveSpeculative(o.speculative);
    } catch (err) {
      fail('speculative', (err as Error).message);
    }
  }
  if (o.draftModel !== undefined && (typeof o.draftModel !== 'string' || o.draftModel === ''))
    fail('draftModel', `${nameOf('draftModel')} must be a model directory, got ${JSON.stringify(o.draftModel)}`);
  const drafts = o.speculative?.proposer === 'draft' || o.speculative?.proposer === 'eagle3';
  if (drafts && o.draftModel === undefined)
    fail('draftModel', `${nameOf('speculative')} ${o.speculative!.proposer as string} needs ${nameOf('draftModel')}`);
  if (o.draftModel !== undefined && !drafts)
    fail('draftModel', `${nameOf('draftModel')} needs ${nameOf('speculative')} draft or eagle3`);
  if (o.quantization !== undefined && !ONLINE_QUANTIZATIONS.includes(o.quantization))
    fail('quantization', `${nameOf('quantization')} must be one of ${ONLINE_QUANTIZATIONS.join(', ')}, got ${JSON.stringify(o.quantization)}`);
  if (o.batchInvariant !== undefined && typeof o.batchInvariant !== 'boolean')
    fail('batchInvariant', `${nameOf('batchInvariant')} must be true or false, got ${JSON.stringify(o.batchInvariant)}`);
  const { optionNames: _names, ...given } = o;
  return {
    ...given,
    backendSettings: o.batchInvariant === undefined ? o.backendSettings
      : { ...o.backendSettings, cuda: { ...o.backendSettings?.cuda, batchInvariant: o.batchInvariant } },
    host: o.host ?? SERVE_DEFAULTS.host,
    port: o.port ?? SERVE_DEFAULTS.port,
    servedModelName,
    maxBatch: o.maxBatch ?? SERVE_DEFAULTS.maxBatch,
    maxBodyBytes: o.maxBodyBytes ?? SERVE_DEFAULTS.maxBodyBytes,
    headersTimeoutMs: o.headersTimeoutMs ?? SERVE_DEFAULTS.headersTimeoutMs,
    bodyTimeoutMs: o.bodyTimeoutMs ?? SERVE_DEFAULTS.bodyTimeoutMs,
    shutdownGraceMs: o.shutdownGraceMs ?? SERVE_DEFAULTS.shutdownGraceMs,
    device,
    cacheDirBytes,
    log: o.log ?? (() => {}),
    nameOf,
  };
}

/** The SSD tier's cap (0 without a tier), after making sure its directory is writable. */
function cacheDirBytesOf(
  o: ServeOptions,
  nameOf: (option: ServeOptionName) => string,
  fail: (option: ServeOptionName, message: string) => never,
): number {
  const dir = o.cacheDir;
  if (dir !== undefined && dir.trim() === '') fail('cacheDir', `${nameOf('cacheDir')} must not be empty`);
  if (dir === undefined) {
    if (o.cacheDirBytes !== undefined) fail('cacheDirBytes', `${nameOf('cacheDirBytes')} needs ${nameOf('cacheDir')}`);
    return 0;
  }
  try {
    fs.mkdirSync(dir, { recursive: true });
    fs.accessSync(dir, fs.constants.W_OK);
  } catch (err) {
    fail('cacheDir', `${nameOf('cacheDir')} ${dir} is not a writable directory (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  if (o.cacheDirBytes !== undefined) {
    if (!atLeastOneByte(o.cacheDirBytes)) fail('cacheDirBytes', `${nameOf('cacheDirBytes')} must be at least 1 byte`);
    return o.cacheDirBytes;
  }
  try {
    const st = fs.statfsSync(dir);
    return Math.min(SERVE_DEFAULTS.cacheDirBytes, Math.floor((st.bavail * st.bsize) / 2));
  } catch {
    return SERVE_DEFAULTS.cacheDirBytes;
  }
}

/** unset, or a whole number of bytes, at least one */
function atLeastOneByte(x: number | undefined): boolean {
  return x === undefined || (Number.isInteger(x) && x >= 1);
}
