// `llmts serve`: the OpenAI/Anthropic-compatible HTTP server (CONTRACT.md). Loads the model,
// then prints exactly one line `listening on http://HOST:PORT` on stdout; everything else goes
// to stderr. SIGTERM/SIGINT: stop accepting, let running requests finish within the grace
// period, exit 0 (a second signal exits at once).

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseFlags, stringFlag, requiredString, numberFlag, parseSize, kvDtypeFlag, type Options } from './args.ts';
import { UsageError } from './errors.ts';
import { openBackend, parseDevice } from '../execution/devices.ts';
import { loadModel } from '../execution/load-model.ts';
import { Engine, resolveKvDtype } from '../execution/engine.ts';
import { warmUp } from '../execution/warmup.ts';
import { LlmServer, DEFAULT_MAX_BODY_BYTES } from '../server/server.ts';
import type { Backend } from '../contracts/backend.ts';
import { FitPlanner, planServeKv, KvBudgetError, type ServeKvPlan } from '../execution/fit/index.ts';
import { modelFingerprint } from '../state/fingerprint.ts';
import type { ToolCallFormatName } from '../generation/tool-calls/index.ts';

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
  device: { type: 'string' },
  'max-body': { type: 'string' },
  'shutdown-grace': { type: 'string' },
  'prompt-cache': { type: 'string' },
  'cache-dir': { type: 'string' },
  'cache-dir-size': { type: 'string' },
  'gpu-memory-utilization': { type: 'string' },
  'tool-call-format': { type: 'string' },
  warmup: { type: 'boolean' },
  'no-warmup': { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
};

// in CONTRACT.md but not built yet: parsed only to refuse them clearly
const NOT_YET: Record<string, string> = {};

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
  --kv-dtype f32|bf16         what the KV cache holds (default: the backend's, f32 on the CPU, bf16
                              on CUDA; the CPU backend also keeps bf16: half the bytes a decode
                              step reads, twice the tokens in the same memory)
  --gpu-memory-utilization F  CUDA: fraction of device memory for weights, KV cache and
                              activations (default 0.9); the KV cache gets what is left
  --device auto|cpu|cuda      (default auto)
  --max-body SIZE             largest request body (default 4M); larger gets 413
  --shutdown-grace SECONDS    on SIGTERM/SIGINT, how long running requests may finish (default 30)
  --prompt-cache SIZE         prefix cache (RAM tier): KV bytes of finished requests' prompt blocks
                              kept for reuse inside the KV pool (default: the whole pool; 0 = off)
  --cache-dir DIR             prefix cache SSD tier: prefixes written to DIR when idle, on SIGTERM
                              and on POST /admin/cache/flush; restored after a restart
  --cache-dir-size SIZE       byte cap of the SSD tier (default: 8G or half the free space, if less)
  --tool-call-format F        auto|hermes|llama3|mistral: how the model writes tool calls (the
                              syntax parsed, forced and shown in prompts); auto (default) detects it
                              from the chat template and vocabulary
  --warmup, --no-warmup       before listening, run every decode batch size once (CUDA: captures
                              each batch size's graph and times its GEMMs, so the first requests
                              do not pay for it, nor stall the server while they do; default: on
                              for CUDA, off for the CPU)

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

/** the engine's default; passed explicitly so the default KV size below agrees with it */
const DEFAULT_MAX_BATCH = 16;

function formatUrlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

/** RAM (CPU backends) or device memory (CUDA): total, and free now. */
function machineMemory(backend: Backend): { totalBytes: number; freeBytes: number } {
  if (backend.name !== 'cuda') return { totalBytes: os.totalmem(), freeBytes: os.freemem() };
  const info = backend.memoryInfo?.();
  if (!info) throw new Error('the CUDA backend does not report its device memory; size the KV cache with --kv-budget');
  return { totalBytes: info.total, freeBytes: info.free };
}

const DEFAULT_CACHE_DIR_BYTES = 8 * 2 ** 30;

/** --prompt-cache: undefined = the whole KV pool; 0 (or "off") = no prefix reuse */
function promptCacheFlag(raw: string | undefined): number | undefined {
  if (raw === undefined || raw === 'auto') return undefined;
  if (raw === 'off') return 0;
  return parseSize(raw, 'prompt-cache');
}

/** --cache-dir-size, or the default: 8 GiB, or half the free space of the directory's file system */
function cacheDirBytes(dir: string, raw: string | undefined): number {
  if (raw !== undefined) {
    const n = parseSize(raw, 'cache-dir-size');
    if (n < 1) throw new UsageError('--cache-dir-size must be at least 1 byte');
    return n;
  }
  try {
    const st = fs.statfsSync(dir);
    return Math.min(DEFAULT_CACHE_DIR_BYTES, Math.floor((st.bavail * st.bsize) / 2));
  } catch {
    return DEFAULT_CACHE_DIR_BYTES;
  }
}

export async function runServe(argv: string[]): Promise<void> {
  const v = parseFlags(argv, OPTIONS);
  if (v.help) {
    process.stdout.write(`${HELP}\n`);
    return;
  }
  for (const [flag, why] of Object.entries(NOT_YET))
    if (v[flag] !== undefined) throw new UsageError(`--${flag} is not supported yet (${why})`);
  const dir = requiredString(v, 'model');
  const host = stringFlag(v, 'host') ?? '127.0.0.1';
  if (v.warmup && v['no-warmup']) throw new UsageError('--warmup and --no-warmup contradict each other');
  const port = numberFlag(v, 'port', { integer: true, min: 0, max: 65535 }) ?? 8000;
  const servedName = stringFlag(v, 'served-model-name') ?? path.basename(path.resolve(dir));
  if (servedName.trim() === '') throw new UsageError('--served-model-name must not be empty');
  const apiKey = stringFlag(v, 'api-key') ?? (process.env.LLMTS_API_KEY || undefined);
  if (apiKey !== undefined && apiKey === '') throw new UsageError('--api-key must not be empty');
  const maxBatch = numberFlag(v, 'max-batch', { integer: true, min: 1 });
  const maxQueued = numberFlag(v, 'max-queued', { integer: true, min: 0 });
  const maxModelLen = numberFlag(v, 'max-model-len', { integer: true, min: 2 });
  const kvRaw = stringFlag(v, 'kv-budget');
  const kvBudget = kvRaw === undefined ? undefined : parseSize(kvRaw, 'kv-budget');
  const kvDtypeRequested = kvDtypeFlag(v);
  const utilization = numberFlag(v, 'gpu-memory-utilization');
  if (utilization !== undefined && !(utilization > 0 && utilization <= 1))
    throw new UsageError(`--gpu-memory-utilization must be in (0, 1], got ${utilization}`);
  if (utilization !== undefined && kvBudget !== undefined) throw new UsageError('give --kv-budget or --gpu-memory-utilization, not both');
  const maxBodyRaw = stringFlag(v, 'max-body');
  const maxBody = maxBodyRaw === undefined ? DEFAULT_MAX_BODY_BYTES : parseSize(maxBodyRaw, 'max-body');
  if (maxBody < 1) throw new UsageError('--max-body must be at least 1 byte');
  const graceS = numberFlag(v, 'shutdown-grace', { min: 0 }) ?? 30;
  const device = parseDevice(stringFlag(v, 'device'));
  const promptCacheBytes = promptCacheFlag(stringFlag(v, 'prompt-cache'));
  const cacheDir = stringFlag(v, 'cache-dir');
  if (cacheDir !== undefined && cacheDir.trim() === '') throw new UsageError('--cache-dir must not be empty');
  if (cacheDir === undefined && v['cache-dir-size'] !== undefined) throw new UsageError('--cache-dir-size needs --cache-dir');
  if (cacheDir !== undefined) {
    try {
      fs.mkdirSync(cacheDir, { recursive: true });
      fs.accessSync(cacheDir, fs.constants.W_OK);
    } catch (err) {
      throw new UsageError(`--cache-dir ${cacheDir} is not a writable directory (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
    }
  }
  const cacheDirSize = cacheDir === undefined ? 0 : cacheDirBytes(cacheDir, stringFlag(v, 'cache-dir-size'));
  const toolCallFormat = toolCallFormatFlag(stringFlag(v, 'tool-call-format'));

  const backend = await openBackend(device);
  if (utilization !== undefined && backend.name !== 'cuda') {
    await backend.close();
    throw new UsageError(`--gpu-memory-utilization is not supported yet (on the ${backend.name} backend it has no GPU memory to size; size the KV cache with --kv-budget)`);
  }
  let kvDtype;
  try {
    kvDtype = resolveKvDtype(backend, kvDtypeRequested);
  } catch (err) {
    await backend.close();
    throw new UsageError(`--kv-dtype: ${(err as Error).message}`);
  }
  const loaded = await loadModel(backend, dir, { maxModelLen });
  const batch = maxBatch ?? DEFAULT_MAX_BATCH;
  // The KV pool is sized from the memory plan `llmts fit` reports (execution/fit/serve-plan.ts).
  const planner = await FitPlanner.open(dir);
  let kv: ServeKvPlan;
  try {
    kv = await planServeKv(planner, {
      backend: backend.name, kvDtype, maxBatch: batch, maxModelLen: loaded.maxContext,
      kvBudgetBytes: kvBudget, utilization, memory: machineMemory(backend),
    });
  } catch (err) {
    if (err instanceof KvBudgetError && kvBudget !== undefined) throw new UsageError(`--kv-budget ${kvRaw} ${err.message}`);
    throw err;
  }
  const kvTokens = kv.kvTokens;
  const perToken = kv.bytesPerToken;
  const log = (line: string) => process.stderr.write(`llmts serve: ${line}\n`);
  const engine = new Engine(loaded.model, loaded, {
    maxBatch: batch, maxQueued, maxModelLen: loaded.maxContext, kvTokens, kvDtype,
    prefixCache: {
      promptCacheBytes,
      tokenizerFingerprint: loaded.tokenizer.fingerprint,
      // the SSD tier outlives the process: its files must name the exact weights
      ...(cacheDir !== undefined ? { modelFingerprint: modelFingerprint(dir), ssd: { dir: cacheDir, maxBytes: cacheDirSize, log } } : {}),
    },
  });
  const server = new LlmServer({ engine, loaded, servedModelName: servedName, apiKey, maxBodyBytes: maxBody, toolCallFormat });
  const cap = server.model.contextLen;
  process.stderr.write(
    `llmts serve: model "${servedName}" from ${dir} on the ${backend.name} backend; context ${engine.maxModelLen} tokens; ` +
    `KV cache (${kvDtype}) for ${kvTokens} tokens (${perToken} bytes/token, ${mib(kv.kvBytes)}; ${kv.why})` +
    `${cap < engine.maxModelLen ? `; one sequence is limited to ${cap} tokens by the KV budget` : ''}\n`,
  );
  log(`memory plan: weights ${mib(kv.weightsBytes)} + KV ${mib(kv.kvBytes)} + transient ${mib(kv.transientBytes)} + ` +
    `reserve ${mib(kv.reserveBytes)} = ${mib(kv.weightsBytes + kv.kvBytes + kv.transientBytes + kv.reserveBytes)}` +
    `${kv.usableBytes !== undefined ? ` of ${mib(kv.usableBytes)} usable` : ''} (llmts fit --model ${dir} --ctx ${engine.maxModelLen} --batch ${batch}` +
    `${kvDtype !== backend.activationDtype ? ` --kv-dtype ${kvDtype}` : ''})`);
  log(`tool calls: ${server.model.toolFormat} format (${toolCallFormat ? '--tool-call-format' : 'detected from the chat template and vocabulary'})`);
  const pc = engine.stats.prefixCache;
  if (!pc.enabled) log(`prefix cache: off (${pc.off})${cacheDir !== undefined ? '; --cache-dir is unused' : ''}`);
  else {
    log(`prefix cache: up to ${mib(pc.ramCapacityBytes)} of finished prompts kept in the KV pool` +
      (pc.ssd ? `; SSD tier ${cacheDir} (${pc.ssd.files} prefixes, ${mib(pc.ssd.bytes)} of ${mib(pc.ssd.maxBytes)})` : '') +
      (pc.ssdOff ? `; SSD tier off (${pc.ssdOff})` : ''));
  }

  if (v.warmup ?? (!v['no-warmup'] && backend.name === 'cuda')) {
    const w = await warmUp(engine);
    log(`warm-up: decode batch sizes ${w.rowCounts.join(', ')} in ${(w.ms / 1000).toFixed(1)} s`);
  }

  let addr;
  try {
    addr = await server.listen(port, host);
  } catch (err) {
    throw new Error(`cannot listen on ${host}:${port}: ${(err as Error).message}`);
  }

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) {
      process.stderr.write(`llmts serve: ${signal} again, exiting now\n`);
      process.exit(1);
    }
    stopping = true;
    process.stderr.write(`llmts serve: ${signal}: finishing ${server.inFlight} running request(s) (grace ${graceS} s)\n`);
    void server.shutdown(graceS * 1000) // the engine writes the prefix cache to the SSD tier as it closes
      .then(() => {
        const ssd = engine.stats.prefixCache.ssd;
        if (ssd) log(`prefix cache: ${ssd.files} prefixes (${mib(ssd.bytes)}) in ${cacheDir}`);
        return backend.close();
      })
      .then(() => process.exit(0), (err) => {
        process.stderr.write(`llmts serve: error while shutting down: ${(err as Error).message}\n`);
        process.exit(1);
      });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  process.stdout.write(`listening on http://${formatUrlHost(host)}:${addr.port}\n`);
}
