// The notes startServer writes through ServeOptions.log: what it serves, the memory plan behind
// the KV pool (with the `llmts fit` command that reproduces it), the tool-call format and the
// prefix cache; on close, what the SSD tier holds. Options are named as the caller names them.

import type { Backend, DType } from '../contracts/backend.ts';
import type { Engine } from '../execution/engine.ts';
import type { ServeKvPlan } from '../execution/fit/index.ts';
import type { LlmServer } from '../server/server.ts';
import type { ResolvedServeOptions } from './serve-options.ts';

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

export interface StartupFacts {
  backend: Backend;
  engine: Engine;
  server: LlmServer;
  kvDtype: DType;
  kvPlan: ServeKvPlan;
}

export function reportStartup(o: ResolvedServeOptions, { backend, engine, server, kvDtype, kvPlan: kv }: StartupFacts): void {
  const cap = server.model.contextLen;
  o.log(
    `model "${o.servedModelName}" from ${o.model}${o.quantization ? ` (matrices quantized to ${o.quantization} as they loaded)` : ''} on the ${backend.name} backend; context ${engine.maxModelLen} tokens; ` +
    `KV cache (${kvDtype}) for ${kv.kvTokens} tokens (${kv.bytesPerToken} bytes/token, ${mib(kv.kvBytes)}; ${kv.why})` +
    `${cap < engine.maxModelLen ? `; one sequence is limited to ${cap} tokens by the KV budget` : ''}`,
  );
  const spMem = kv.speculation;
  const drafter = spMem ? spMem.drafterBytes + spMem.drafterKvBytes : 0;
  o.log(`memory plan: weights ${mib(kv.weightsBytes)} + KV ${mib(kv.kvBytes)} + transient ${mib(kv.transientBytes)} + ` +
    `${drafter > 0 ? `drafter ${mib(drafter)} (weights ${mib(spMem!.drafterBytes)}, KV ${mib(spMem!.drafterKvBytes)}) + ` : ''}` +
    `reserve ${mib(kv.reserveBytes)} = ${mib(kv.weightsBytes + kv.kvBytes + kv.transientBytes + drafter + kv.reserveBytes)}` +
    `${kv.usableBytes !== undefined ? ` of ${mib(kv.usableBytes)} usable` : ''} (llmts fit --model ${o.model} --ctx ${engine.maxModelLen} --batch ${o.maxBatch}` +
    `${kvDtype !== backend.activationDtype ? ` --kv-dtype ${kvDtype}` : ''}${o.quantization ? ` --quantization ${o.quantization}` : ''})`);
  o.log(`tool calls: ${server.model.toolFormat} format (${o.toolCallFormat ? o.nameOf('toolCallFormat') : 'detected from the chat template and vocabulary'})`);
  const sp = engine.speculative;
  if (sp) {
    const depth = sp.numDraftTokens === 'adaptive' ? 'adaptive depth' : `${sp.numDraftTokens} draft tokens`;
    const dm = engine.draftModel?.draft;
    const drafts = sp.proposer === 'ngram' ? `n-gram drafts (suffixes of ${sp.ngramMin} to ${sp.ngramMax} tokens)`
      : sp.proposer === 'draft' && dm ? `drafts of the draft model ${dm.dir} (${dm.config.numLayers} layers, hidden ${dm.config.hiddenSize})`
        : sp.proposer === 'eagle3' && engine.draftHead
          ? `drafts of the EAGLE-3 head (target layers ${engine.draftHead.head.targetLayers.join(', ')}, draft vocabulary ${engine.draftHead.head.config.draftVocabSize})`
          : 'drafts of the given proposer';
    o.log(engine.speculationOff ? `speculative decoding: off for this model (${engine.speculationOff})` : `speculative decoding: ${drafts}, ${depth}`);
  }
  const pc = engine.stats.prefixCache;
  if (!pc.enabled) o.log(`prefix cache: off (${pc.off})${o.cacheDir !== undefined ? `; ${o.nameOf('cacheDir')} is unused` : ''}`);
  else {
    o.log(`prefix cache: up to ${mib(pc.ramCapacityBytes)} of finished prompts kept in the KV pool` +
      (pc.ssd ? `; SSD tier ${o.cacheDir} (${pc.ssd.files} prefixes, ${mib(pc.ssd.bytes)} of ${mib(pc.ssd.maxBytes)})` : '') +
      (pc.ssdOff ? `; SSD tier off (${pc.ssdOff})` : ''));
  }
}

/** After the engine closed: the prefixes the SSD tier holds for the next start. */
export function reportPrefixCache(o: ResolvedServeOptions, engine: Engine): void {
  const ssd = engine.stats.prefixCache.ssd;
  if (ssd) o.log(`prefix cache: ${ssd.files} prefixes (${mib(ssd.bytes)}) in ${o.cacheDir}`);
}
