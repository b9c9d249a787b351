// Starting the OpenAI/Anthropic-compatible server from code: what `llmts serve` runs, with its
// flags as ServeOptions (serve-options.ts). Opens the backend, loads the model, sizes the KV pool
// with the memory plan `llmts fit` reports, builds the engine (prefix cache, SSD tier), warms it
// up, listens, and hands back a handle that closes it all.
//
//   const srv = await startServer({ model: 'models/demo', device: 'cpu', port: 0 });
//   console.log(srv.url); // http://127.0.0.1:PORT, OpenAI routes under /v1
//   await srv.close();
//
// Invariant: when startServer rejects, everything it opened is closed again (backend, model,
// engine, listener); a process that embeds it keeps running.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { dtypeBytes, type Backend, type DType } from '../contracts/backend.ts';
import { STEP_DRAFT_TOKENS } from '../execution/scheduler.ts';
import { openBackend } from '../execution/devices.ts';
import { disposeDrafter, loadDrafter, type Drafter } from './drafter.ts';
import { loadModel, type LoadedModel } from '../execution/load-model.ts';
import { Engine, resolveKvDtype } from '../execution/engine.ts';
import { warmUp } from '../execution/warmup.ts';
import { FitPlanner, planServeKv, KvBudgetError, safetensorsBytes, type ServeKvPlan, type SpeculationMemory } from '../execution/fit/index.ts';
import { modelFingerprint } from '../state/fingerprint.ts';
import { LlmServer } from '../server/server.ts';
import { resolveServeOptions, ServeOptionsError, type ResolvedServeOptions, type ServeOptions } from './serve-options.ts';
import { reportPrefixCache, reportStartup } from './serve-report.ts';

export interface ServerHandle {
  /** `http://HOST:PORT`, the port the listener got (also with `port: 0`) */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly engine: Engine;
  readonly server: LlmServer;
  /** the KV pool's size and why, as the memory plan gave it */
  readonly kvPlan: ServeKvPlan;
  /**
   * Stops accepting, lets running requests finish for up to `graceMs` (default: the options'
   * shutdownGraceMs), cancels the rest, writes the prefix cache to the SSD tier, frees the model
   * and closes the backend. Calling it again returns the same promise.
   */
  close(graceMs?: number): Promise<void>;
}

export async function startServer(options: ServeOptions): Promise<ServerHandle> {
  const o = resolveServeOptions(options);
  const backend = await openBackend(o.device, o.backendSettings);
  let loaded: LoadedModel | undefined;
  let draft: Drafter | undefined;
  let engine: Engine | undefined;
  try {
    const kvDtype = checkBackend(backend, o);
    loaded = await loadModel(backend, o.model, { maxModelLen: o.maxModelLen, quantization: o.quantization });
    // the draft model's weights are in memory before the plan measures what is free
    if (o.draftModel !== undefined) draft = await loadDraft(backend, o.draftModel, loaded, o);
    const kvPlan = await planKv(backend, loaded, kvDtype, o, o.speculative ? speculationMemory(backend, loaded, draft, o.draftModel) : undefined);
    engine = new Engine(loaded.model, loaded, {
      ...o.engineSettings,
      maxBatch: o.maxBatch, maxQueued: o.maxQueued, maxModelLen: loaded.maxContext, kvTokens: kvPlan.kvTokens, kvDtype,
      speculative: o.speculative,
      ...(draft ?? {}),
      prefixCache: {
        promptCacheBytes: o.promptCacheBytes,
        tokenizerFingerprint: loaded.tokenizer.fingerprint,
        // the SSD tier outlives the process: its files must name the exact weights
        ...(o.cacheDir !== undefined ? { modelFingerprint: modelFingerprint(o.model, o.quantization), ssd: { dir: o.cacheDir, maxBytes: o.cacheDirBytes, log: o.log } } : {}),
      },
    });
    const server = new LlmServer({
      engine, loaded, servedModelName: o.servedModelName, apiKey: o.apiKey, maxBodyBytes: o.maxBodyBytes, toolCallFormat: o.toolCallFormat,
      headersTimeoutMs: o.headersTimeoutMs, bodyTimeoutMs: o.bodyTimeoutMs,
      ...(o.corsOrigins ? { corsOrigins: o.corsOrigins } : {}), ...(o.logRequests !== undefined ? { logRequests: o.logRequests } : {}),
    });
    reportStartup(o, { backend, engine, server, kvDtype, kvPlan });
    if (o.warmup ?? backend.name === 'cuda') {
      const w = await warmUp(engine);
      o.log(`warm-up: decode batch sizes ${w.rowCounts.join(', ')} in ${(w.ms / 1000).toFixed(1)} s`);
    }
    let port: number;
    try {
      port = (await server.listen(o.port, o.host)).port;
    } catch (err) {
      throw new Error(`cannot listen on ${o.host}:${o.port}: ${(err as Error).message}`);
    }
    return handle(o, backend, server, engine, kvPlan, port);
  } catch (err) {
    // the engine owns the model once it exists; before that the model is freed here
    if (engine) await engine.close(0);
    else loaded?.model.dispose();
    if (!engine) disposeDrafter(draft);
    await backend.close();
    throw err;
  }
}

/** The drafter of `--speculative draft|eagle3`, on the target's backend; a failure names the option. */
async function loadDraft(backend: Backend, dir: string, target: LoadedModel, o: ResolvedServeOptions): Promise<Drafter> {
  try {
    const proposer = o.speculative?.proposer;
    return await loadDrafter(backend, dir, target, typeof proposer === 'string' ? proposer : undefined);
  } catch (err) {
    throw new ServeOptionsError(`${o.nameOf('draftModel')} ${dir}: ${(err as Error).message}`, 'draftModel');
  }
}

/**
 * What speculative decoding adds to the plan: a verify step's draft logit rows (Scheduler's
 * STEP_DRAFT_TOKENS), and a drafter's weights (its weight files) and KV (every layer at the
 * backend's activation dtype, as many tokens as the model's pools: methods/draft-model.ts, eagle3.ts).
 */
function speculationMemory(backend: Backend, target: LoadedModel, drafter: Drafter | undefined, dir: string | undefined): SpeculationMemory {
  // a head's decoder layer is a one-layer config (artifacts/eagle3.ts)
  const c = drafter?.draftModel?.config ?? drafter?.draftHead?.config.layer;
  const drafterBytes = c && dir !== undefined ? safetensorsBytes(dir) : 0;
  const drafterKvBytesPerToken = c ? c.numLayers * 2 * c.numKvHeads * c.headDim * dtypeBytes[backend.activationDtype] : 0;
  return { extraLogitRows: STEP_DRAFT_TOKENS, vocabSize: target.config.vocabSize, drafterBytes, drafterKvBytesPerToken };
}


/** What only the opened backend can say: whether it has GPU memory to size, which KV dtypes it keeps. */
function checkBackend(backend: Backend, o: ResolvedServeOptions): DType {
  if (o.gpuMemoryUtilization !== undefined && backend.name !== 'cuda') {
    throw new ServeOptionsError(
      `${o.nameOf('gpuMemoryUtilization')} is not supported yet (on the ${backend.name} backend it has no GPU memory to size; ` +
      `size the KV cache with ${o.nameOf('kvBudgetBytes')})`, 'gpuMemoryUtilization');
  }
  try {
    return resolveKvDtype(backend, o.kvDtype);
  } catch (err) {
    throw new ServeOptionsError(`${o.nameOf('kvDtype')}: ${(err as Error).message}`, 'kvDtype');
  }
}

/** The KV pool, sized from the memory plan `llmts fit` reports (execution/fit/serve-plan.ts). */
async function planKv(backend: Backend, loaded: LoadedModel, kvDtype: DType, o: ResolvedServeOptions,
  speculation?: SpeculationMemory): Promise<ServeKvPlan> {
  // the plan models the backend as it was opened: the same knobs set in code
  const planner = await FitPlanner.open(o.model, { ...o.backendSettings, quantization: o.quantization });
  try {
    return await planServeKv(planner, {
      backend: backend.name, kvDtype, maxBatch: o.maxBatch, maxModelLen: loaded.maxContext,
      kvBudgetBytes: o.kvBudgetBytes, utilization: o.gpuMemoryUtilization, memory: machineMemory(backend, o),
      ...(speculation ? { speculation } : {}),
    });
  } catch (err) {
    if (err instanceof KvBudgetError && o.kvBudgetBytes !== undefined)
      throw new ServeOptionsError(`${o.nameOf('kvBudgetBytes')} ${o.kvBudgetBytes} ${err.message}`, 'kvBudgetBytes');
    throw err;
  }
}

/** RAM (CPU backends) or device memory (CUDA): total, and free now. */
function machineMemory(backend: Backend, o: ResolvedServeOptions): { totalBytes: number; freeBytes: number } {
  if (backend.name !== 'cuda') return { totalBytes: os.totalmem(), freeBytes: os.freemem() };
  const info = backend.memoryInfo?.();
  if (!info) throw new Error(`the CUDA backend does not report its device memory; size the KV cache with ${o.nameOf('kvBudgetBytes')}`);
  return { totalBytes: info.total, freeBytes: info.free };
}

function handle(o: ResolvedServeOptions, backend: Backend, server: LlmServer, engine: Engine, kvPlan: ServeKvPlan, port: number): ServerHandle {
  let closing: Promise<void> | undefined;
  const host = o.host.includes(':') ? `[${o.host}]` : o.host;
  return {
    url: `http://${host}:${port}`, host: o.host, port, engine, server, kvPlan,
    close(graceMs = o.shutdownGraceMs) {
      closing ??= (async () => {
        await server.shutdown(graceMs); // the engine writes the prefix cache to the SSD tier as it closes
        reportPrefixCache(o, engine);
        await backend.close();
      })();
      return closing;
    },
  };
}
