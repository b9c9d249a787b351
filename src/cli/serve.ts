// `llmts serve`: the OpenAI/Anthropic-compatible HTTP server (README.md, "llmts serve"). Flags
// become ServeOptions and api/serve.ts's startServer does the rest; this prints exactly one line
// `listening on http://HOST:PORT` on stdout, everything else goes to stderr. SIGTERM/SIGINT: stop
// accepting, let running requests finish within the grace period, exit 0 (a second signal exits
// at once).

import { parseFlags, stringFlag, requiredString, numberFlag, parseSize, kvDtypeFlag, quantizationFlag, type Options, type Values } from './args.ts';
import { UsageError } from './errors.ts';
import { draftModelFlag, SPECULATIVE_OPTIONS, speculativeFlags, speculativeHelp } from './speculative-flags.ts';
import { parseDevice } from '../execution/devices.ts';
import type { ToolCallFormatName } from '../generation/tool-calls/index.ts';
import { startServer, ServeOptionsError, SERVE_DEFAULTS, type ServeOptions, type ServeOptionName, type ServerHandle } from '../api/index.ts';

const OPTIONS: Options = {
  model: { type: 'string' },
  host: { type: 'string' },
  port: { type: 'string' },
  'served-model-name': { type: 'string' },
  'api-key': { type: 'string' },
  'max-batch': { type: 'string' },
  'max-queued': { type: 'string' },
  'max-model-len': { type: 'string' },
  'kv-budget': { type: 'string' },
  'kv-dtype': { type: 'string' },
  quantization: { type: 'string' },
  device: { type: 'string' },
  'max-body': { type: 'string' },
  'header-timeout': { type: 'string' },
  'body-timeout': { type: 'string' },
  'shutdown-grace': { type: 'string' },
  'prompt-cache': { type: 'string' },
  'cache-dir': { type: 'string' },
  'cache-dir-size': { type: 'string' },
  'grammar-cache': { type: 'string' },
  'gpu-memory-utilization': { type: 'string' },
  'tool-call-format': { type: 'string' },
  warmup: { type: 'boolean' },
  'no-warmup': { type: 'boolean' },
  'batch-invariant': { type: 'boolean' },
  'cors-origin': { type: 'string', multiple: true },
  'log-requests': { type: 'boolean' },
  'no-log-requests': { type: 'boolean' },
  ...SPECULATIVE_OPTIONS,
  help: { type: 'boolean', short: 'h' },
};

const HELP = `usage: llmts serve --model DIR [options]

  --model DIR                 Hugging Face model directory
  --host HOST                 address to listen on (default 127.0.0.1)
  --port N                    port (default 8000; 0 = any free port)
  --served-model-name NAME    the "model" clients must send (default: the directory's base name)
  --api-key KEY               require "Authorization: Bearer KEY" or "x-api-key: KEY" on /v1
                              routes (default: $LLMTS_API_KEY; unset = no auth)
  --max-batch N               sequences decoding together (default 16)
  --max-queued N              sequences waiting for admission before 429 (default 256)
  --max-model-len N           longest sequence, prompt + output (default: the model's maximum)
  --kv-budget SIZE            memory for the KV cache, e.g. 512M, 4G (default: room for
                              max-batch sequences of max-model-len tokens, as far as the
                              memory plan of "llmts fit" allows)
  --kv-dtype DTYPE            what the KV cache holds (default: the backend's, f32 on the CPU, bf16
                              on CUDA); the CPU backend also keeps bf16 (half the bytes a decode
                              step reads, twice the tokens in the same memory) and int8 / fp8 with
                              a scale per token and head (about a quarter of f32's bytes)
  --quantization q8_0|q4_0|fp8  quantize a safetensors checkpoint's matrices as they load
                              (default: as stored): q8_0 / q4_0 on the CPU, kept as a GGUF's of
                              that type; fp8 on CUDA, the layers' matrices e4m3 with a scale a row
  --gpu-memory-utilization F  CUDA: fraction of device memory for weights, KV cache and
                              activations (default 0.9); the KV cache gets what is left
  --device auto|cpu|cuda      (default auto)
  --max-body SIZE             largest request body (default 4M); larger gets 413
  --header-timeout SECONDS    a request's line and headers must arrive within this (default 60);
                              else 408 and the connection closes
  --body-timeout SECONDS      its body within this, from the end of the headers (default 60)
  --shutdown-grace SECONDS    on SIGTERM/SIGINT, how long running requests may finish (default 30)
  --prompt-cache SIZE         prefix cache (RAM tier): KV bytes of finished requests' prompt blocks
                              kept for reuse inside the KV pool (default: the whole pool; 0 = off)
  --cache-dir DIR             prefix cache SSD tier: prefixes written to DIR when idle, on SIGTERM
                              and on POST /admin/cache/flush; restored after a restart
  --cache-dir-size SIZE       byte cap of the SSD tier (default: 8G or half the free space, if less)
  --grammar-cache SIZE        compiled grammars (structured output, forced tool calls) kept for
                              reuse, least recently used evicted; a grammar that alone needs more
                              is a 400 (default 256M, at least 1M)
  --cors-origin ORIGIN        let browsers on ORIGIN (scheme://host[:port], or * for any) call
                              the server (CORS; repeatable; default: none)
  --log-requests, --no-log-requests
                              one line per request on stderr: method, path, status, tokens,
                              milliseconds (default on)
  --tool-call-format F        auto|hermes|llama3|mistral: how the model writes tool calls (the
                              syntax parsed, forced and shown in prompts); auto (default) detects it
                              from the chat template and vocabulary
  --warmup, --no-warmup       before listening, run every decode batch size once (CUDA: captures
                              each batch size's graph and times its GEMMs, so the first requests
                              do not pay for it, nor stall the server while they do; default: on
                              for CUDA, off for the CPU)
  --batch-invariant           CUDA: a request's tokens and logprobs do not depend on the other
                              requests in its steps (every kernel choice fixed by shapes alone;
                              default: $LLMTS_CUDA_BATCH_INVARIANT, off)
${speculativeHelp(30)}

Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions,
POST /v1/completions, POST /v1/messages, POST /admin/cache/flush. Prints
"listening on http://HOST:PORT" when ready.`;

/** --tool-call-format values (vLLM's parser name llama3_json too); auto = detect */
const TOOL_CALL_FORMATS: Record<string, ToolCallFormatName | undefined> = {
  auto: undefined, hermes: 'hermes', llama3: 'llama3_json', llama3_json: 'llama3_json', mistral: 'mistral',
};

function toolCallFormatFlag(raw: string | undefined): ToolCallFormatName | undefined {
  if (raw === undefined) return undefined;
  if (!Object.hasOwn(TOOL_CALL_FORMATS, raw)) throw new UsageError(`--tool-call-format must be auto, hermes, llama3 or mistral, got "${raw}"`);
  return TOOL_CALL_FORMATS[raw];
}

/** --prompt-cache: undefined = the whole KV pool; 0 (or "off") = no prefix reuse */
function promptCacheFlag(raw: string | undefined): number | undefined {
  if (raw === undefined || raw === 'auto') return undefined;
  if (raw === 'off') return 0;
  return parseSize(raw, 'prompt-cache');
}

function sizeFlag(v: Values, name: string): number | undefined {
  const raw = stringFlag(v, name);
  return raw === undefined ? undefined : parseSize(raw, name);
}

/** a duration in seconds (fractions allowed) as milliseconds; more than 0 */
function secondsFlag(v: Values, name: string): number | undefined {
  const s = numberFlag(v, name);
  if (s === undefined) return undefined;
  if (!(s > 0)) throw new UsageError(`--${name} must be > 0 seconds, got ${s}`);
  return s * 1000;
}

/** How startServer's messages name its options: as the flags that set them. */
const FLAG_OF: Record<ServeOptionName, string> = {
  model: '--model', host: '--host', port: '--port', servedModelName: '--served-model-name', apiKey: '--api-key',
  maxBatch: '--max-batch', maxQueued: '--max-queued', maxModelLen: '--max-model-len', kvBudgetBytes: '--kv-budget',
  kvDtype: '--kv-dtype', quantization: '--quantization', gpuMemoryUtilization: '--gpu-memory-utilization', device: '--device', maxBodyBytes: '--max-body',
  headersTimeoutMs: '--header-timeout', bodyTimeoutMs: '--body-timeout',
  shutdownGraceMs: '--shutdown-grace', promptCacheBytes: '--prompt-cache', cacheDir: '--cache-dir',
  cacheDirBytes: '--cache-dir-size', toolCallFormat: '--tool-call-format', warmup: '--warmup',
  grammarCacheBytes: '--grammar-cache',
  batchInvariant: '--batch-invariant',
  speculative: '--speculative', draftModel: '--draft-model',
  corsOrigins: '--cors-origin', logRequests: '--log-requests',
};

const log = (line: string) => process.stderr.write(`llmts serve: ${line}\n`);

/** ServeOptions.speculative, when the flags ask for speculative decoding. */
function speculativeOf(v: Values): Pick<ServeOptions, 'speculative' | 'draftModel'> {
  const speculative = speculativeFlags(v);
  const draftModel = draftModelFlag(v);
  return { ...(speculative ? { speculative } : {}), ...(draftModel !== undefined ? { draftModel } : {}) };
}

/** The flags as ServeOptions: syntax is checked here, values by startServer. */
export function serveOptionsOf(argv: string[]): ServeOptions {
  const v = parseFlags(argv, OPTIONS);
  if (v.warmup && v['no-warmup']) throw new UsageError('--warmup and --no-warmup contradict each other');
  if (v['log-requests'] && v['no-log-requests']) throw new UsageError('--log-requests and --no-log-requests contradict each other');
  const cors = v['cors-origin'] as string[] | undefined;
  return {
    model: requiredString(v, 'model'),
    host: stringFlag(v, 'host'),
    port: numberFlag(v, 'port', { integer: true }),
    servedModelName: stringFlag(v, 'served-model-name'),
    apiKey: stringFlag(v, 'api-key') ?? (process.env.LLMTS_API_KEY || undefined),
    maxBatch: numberFlag(v, 'max-batch', { integer: true }),
    maxQueued: numberFlag(v, 'max-queued', { integer: true }),
    maxModelLen: numberFlag(v, 'max-model-len', { integer: true }),
    kvBudgetBytes: sizeFlag(v, 'kv-budget'),
    kvDtype: kvDtypeFlag(v),
    quantization: quantizationFlag(v),
    gpuMemoryUtilization: numberFlag(v, 'gpu-memory-utilization'),
    maxBodyBytes: sizeFlag(v, 'max-body'),
    headersTimeoutMs: secondsFlag(v, 'header-timeout'),
    bodyTimeoutMs: secondsFlag(v, 'body-timeout'),
    // seconds on the command line; a negative one is refused here, where its unit is known
    shutdownGraceMs: (numberFlag(v, 'shutdown-grace', { min: 0 }) ?? SERVE_DEFAULTS.shutdownGraceMs / 1000) * 1000,
    device: parseDevice(stringFlag(v, 'device')),
    promptCacheBytes: promptCacheFlag(stringFlag(v, 'prompt-cache')),
    cacheDir: stringFlag(v, 'cache-dir'),
    cacheDirBytes: sizeFlag(v, 'cache-dir-size'),
    grammarCacheBytes: sizeFlag(v, 'grammar-cache'),
    toolCallFormat: toolCallFormatFlag(stringFlag(v, 'tool-call-format')),
    ...(cors ? { corsOrigins: cors } : {}),
    ...(v['no-log-requests'] ? { logRequests: false } : {}),
    warmup: v.warmup ? true : v['no-warmup'] ? false : undefined,
    ...speculativeOf(v),
    ...(v['batch-invariant'] ? { batchInvariant: true } : {}),
    log,
    optionNames: FLAG_OF,
  };
}

export async function runServe(argv: string[]): Promise<void> {
  if (parseFlags(argv, OPTIONS).help) {
    process.stdout.write(`${HELP}\n`);
    return;
  }
  const options = serveOptionsOf(argv);
  let srv: ServerHandle;
  try {
    srv = await startServer(options);
  } catch (err) {
    if (err instanceof ServeOptionsError) throw new UsageError(err.message);
    throw err;
  }

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) {
      log(`${signal} again, exiting now`);
      process.exit(1);
    }
    stopping = true;
    log(`${signal}: finishing ${srv.server.inFlight} running request(s) (grace ${options.shutdownGraceMs! / 1000} s)`);
    void srv.close().then(() => process.exit(0), (err) => {
      log(`error while shutting down: ${(err as Error).message}`);
      process.exit(1);
    });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  process.stdout.write(`listening on ${srv.url}\n`);
}
