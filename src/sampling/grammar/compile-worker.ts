// The grammar compile worker's thread: checks and trial-compiles specs (checker.ts) for the
// GrammarCompiler that started it (compile-worker-client.ts), one at a time, in its own
// xgrammar instances. Started with WorkerInit as workerData; posts {type: 'ready'} once both
// instances are loaded, then answers each {id, spec, trial} with {id, ok, ...} and the bytes
// this thread's instances hold (the client replaces a worker that holds too many).

import v8 from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import { SpecChecker, type SpecCheckerOptions, type VocabData } from './checker.ts';
import { GrammarSpecError } from './prepare.ts';
import type { GrammarSpec } from './spec.ts';

export interface WorkerInit extends SpecCheckerOptions {
  vocab?: VocabData;
}

export interface CheckRequest {
  id: number;
  spec: GrammarSpec;
  trial: boolean;
}

export type CheckReply =
  | { type: 'ready' }
  | { type: 'fatal'; message: string }
  | ({ type: 'result'; id: number; ok: true; prepared: import('./prepare.ts').Prepared; trialMs?: number; trialBytes?: number } & Held)
  | ({ type: 'result'; id: number; ok: false; invalid: boolean; message: string } & Held);

/** memory outside the JS heap this thread holds (its xgrammar instances' heaps, dropped ones not yet collected included) */
interface Held {
  externalBytes: number;
}

const port = parentPort!;
const init = workerData as WorkerInit;
const checker = new SpecChecker(init.vocab, { limits: init.limits, trialMaxBytes: init.trialMaxBytes });
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
      reply = {
        type: 'result', id: req.id, ok: true, prepared: r.prepared, externalBytes: held(),
        ...(r.trialMs !== undefined ? { trialMs: r.trialMs } : {}), ...(r.trialBytes !== undefined ? { trialBytes: r.trialBytes } : {}),
      };
    } catch (err) {
      reply = { type: 'result', id: req.id, ok: false, invalid: err instanceof GrammarSpecError, message: err instanceof Error ? err.message : String(err), externalBytes: held() };
    }
    port.postMessage(reply);
  });
});

function held(): number {
  return v8.getHeapStatistics().external_memory;
}
