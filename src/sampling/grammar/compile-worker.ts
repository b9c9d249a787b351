// The grammar compile worker's thread: checks and trial-compiles specs (checker.ts) for the
// GrammarCompiler that started it (compile-worker-client.ts), one at a time, in its own
// xgrammar instances. Started with the vocabulary as workerData; posts {type: 'ready'} once
// both instances are loaded, then answers each {id, spec, trial} with {id, ok, ...}.

import { parentPort, workerData } from 'node:worker_threads';
import { SpecChecker, type VocabData } from './checker.ts';
import { GrammarSpecError } from './prepare.ts';
import type { GrammarSpec } from './spec.ts';

export interface CheckRequest {
  id: number;
  spec: GrammarSpec;
  trial: boolean;
}

export type CheckReply =
  | { type: 'ready' }
  | { type: 'fatal'; message: string }
  | { type: 'result'; id: number; ok: true; prepared: import('./prepare.ts').Prepared; trialMs?: number }
  | { type: 'result'; id: number; ok: false; invalid: boolean; message: string };

const port = parentPort!;
const checker = new SpecChecker((workerData as { vocab?: VocabData }).vocab);
// one request at a time: the instances are replaced after an abort, never shared by two checks
let queue: Promise<unknown> = checker.warm().then(
  () => port.postMessage({ type: 'ready' } satisfies CheckReply),
  (err: unknown) => port.postMessage({ type: 'fatal', message: err instanceof Error ? err.message : String(err) } satisfies CheckReply),
);

port.on('message', (req: CheckRequest) => {
  queue = queue.then(async () => {
    let reply: CheckReply;
    try {
      const r = await checker.check(req.spec, req.trial);
      reply = { type: 'result', id: req.id, ok: true, prepared: r.prepared, ...(r.trialMs !== undefined ? { trialMs: r.trialMs } : {}) };
    } catch (err) {
      reply = { type: 'result', id: req.id, ok: false, invalid: err instanceof GrammarSpecError, message: err instanceof Error ? err.message : String(err) };
    }
    port.postMessage(reply);
  });
});
