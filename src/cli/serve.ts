// `llmts serve`: the OpenAI/Anthropic-compatible HTTP server (CONTRACT.md). Loads the model,
// then prints exactly one line `listening on http://HOST:PORT` on stdout; everything else goes
// to stderr. SIGTERM/SIGINT: stop accepting, let running requests finish within the grace
// period, exit 0 (a second signal exits at once).

import os from 'node:os';
import path from 'node:path';
import { parseFlags, stringFlag, requiredString, numberFlag, parseSize, type Options } from './args.ts';
import { UsageError } from './errors.ts';
import { openBackend, parseDevice } from '../execution/devices.ts';
import { loadModel } from '../execution/load-model.ts';
import { Engine } from '../execution/engine.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { LlmServer, DEFAULT_MAX_BODY_BYTES } from '../server/server.ts';

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
  device: { type: 'string' },
  'max-body': { type: 'string' },
  'shutdown-grace': { type: 'string' },
  // in CONTRACT.md but not built yet: parsed only to refuse them clearly
  'gpu-memory-utilization': { type: 'string' },
  'prompt-cache': { type: 'string' },
  'cache-dir': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

const NOT_YET: Record<string, string> = {
  'gpu-memory-utilization': 'there is no CUDA backend yet; size the KV cache with --kv-budget',
  'prompt-cache': 'the prefix cache is not built yet',
  'cache-dir': 'the prefix cache (and its SSD tier) is not built yet',
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
                              max-batch sequences of max-model-len tokens, at most half
                              the free memory)
  --device auto|cpu|cuda      (default auto)
  --max-body SIZE             largest request body (default 4M); larger gets 413
  --shutdown-grace SECONDS    on SIGTERM/SIGINT, how long running requests may finish (default 30)

Not supported yet (refused): --gpu-memory-utilization, --prompt-cache, --cache-dir.
Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions,
POST /v1/completions, POST /v1/messages. Prints "listening on http://HOST:PORT" when ready.`;

/** the engine's default; passed explicitly so the default KV size below agrees with it */
const DEFAULT_MAX_BATCH = 16;
const DEFAULT_KV_MEMORY_FRACTION = 0.5;

/** KV bytes one token takes in every layer: K and V, f32 (the KV dtype of the current backends). */
export function kvBytesPerToken(cfg: Pick<ModelConfig, 'numLayers' | 'numKvHeads' | 'headDim'>): number {
  return 2 * cfg.numLayers * cfg.numKvHeads * cfg.headDim * 4;
}

function formatUrlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

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
  const maxBodyRaw = stringFlag(v, 'max-body');
  const maxBody = maxBodyRaw === undefined ? DEFAULT_MAX_BODY_BYTES : parseSize(maxBodyRaw, 'max-body');
  if (maxBody < 1) throw new UsageError('--max-body must be at least 1 byte');
  const graceS = numberFlag(v, 'shutdown-grace', { min: 0 }) ?? 30;
  const device = parseDevice(stringFlag(v, 'device'));

  const backend = await openBackend(device);
  const loaded = await loadModel(backend, dir, { maxModelLen });
  const perToken = kvBytesPerToken(loaded.config);
  const batch = maxBatch ?? DEFAULT_MAX_BATCH;
  let kvTokens: number;
  let kvNote = '';
  if (kvBudget !== undefined) {
    kvTokens = Math.floor(kvBudget / perToken);
    if (kvTokens < 1) throw new UsageError(`--kv-budget ${kvRaw} holds no token of KV cache (one token needs ${perToken} bytes)`);
  } else {
    // Room for max-batch full-length sequences, unless that is more than half the free memory:
    // the KV pool is allocated up front, and a long-context model would not start otherwise.
    kvTokens = batch * loaded.maxContext;
    const affordable = Math.floor((os.freemem() * DEFAULT_KV_MEMORY_FRACTION) / perToken);
    if (affordable < kvTokens) {
      if (affordable < 1) throw new Error(`not enough free memory for any KV cache (one token needs ${perToken} bytes); pass --kv-budget`);
      kvTokens = affordable;
      kvNote = ' (no --kv-budget: half the free memory)';
    }
  }
  const engine = new Engine(loaded.model, loaded, { maxBatch: batch, maxQueued, maxModelLen: loaded.maxContext, kvTokens });
  const server = new LlmServer({ engine, loaded, servedModelName: servedName, apiKey, maxBodyBytes: maxBody });
  const cap = server.model.contextLen;
  process.stderr.write(
    `llmts serve: model "${servedName}" from ${dir} on the ${backend.name} backend; context ${engine.maxModelLen} tokens; ` +
    `KV cache for ${kvTokens} tokens (${perToken} bytes/token, ${mib(kvTokens * perToken)})${kvNote}` +
    `${cap < engine.maxModelLen ? `; one sequence is limited to ${cap} tokens by the KV budget` : ''}\n`,
  );

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
    void server.shutdown(graceS * 1000)
      .then(() => backend.close())
      .then(() => process.exit(0), (err) => {
        process.stderr.write(`llmts serve: error while shutting down: ${(err as Error).message}\n`);
        process.exit(1);
      });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  process.stdout.write(`listening on http://${formatUrlHost(host)}:${addr.port}\n`);
}
