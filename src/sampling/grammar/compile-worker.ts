// The grammar check worker's thread: checks specs and prepares what gets compiled (checker.ts)
// for the GrammarCompiler that started it (compile-worker-client.ts), one at a time, in its own
// validator instance. Started with WorkerInit as workerData; posts {type: 'ready'} once the
// instance is loaded, then answers each {id, spec} with {id, ok, ...} and the bytes this
// thread's instances hold (the client replaces a worker that holds too many).

import v8 from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import { SpecChecker, type SpecCheckerOptions } from './checker.ts';
import { GrammarSpecError } from './prepare.ts';
import type { GrammarSpec } from './spec.ts';

export type WorkerInit = SpecCheckerOptions;

export interface CheckRequest {
  id: number;
  spec: GrammarSpec;
}

export type CheckReply =
  | { type: 'ready' }
  | { type: 'fatal'; message: string }
  | ({ type: 'result'; id: number; ok: true; prepared: import('./prepare.ts').Prepared } & Held)
  | ({ type: 'result'; id: number; ok: false; invalid: boolean; message: string } & Held);

/** memory outside the JS heap this thread holds (its xgrammar instances' heaps, dropped ones not yet collected included) */
interface Held {
  externalBytes: number;
}

const port = parentPort!;
const init = workerData as WorkerInit;
const checker = new SpecChecker({ limits: init.limits });
// one request at a time: the validator is replaced after an abort, never shared by two checks
let queue: Promise<unknown> = checker.warm().then(
  () => port.postMessage({ type: 'ready' } satisfies CheckReply),
  (err: unknown) => port.postMessage({ type: 'fatal', message: err instanceof Error ? err.message : String(err) } satisfies CheckReply),
);

port.on('message', (req: CheckRequest) => {
  queue = queue.then(async () => {
    let reply: CheckReply;
    try {
      const r = await checker.check(req.spec);
      reply = { type: 'result', id: req.id, ok: true, prepared: r.prepared, externalBytes: held() };
    } catch (err) {
      reply = { type: 'result', id: req.id, ok: false, invalid: err instanceof GrammarSpecError, message: err instanceof Error ? err.message : String(err), externalBytes: held() };
    }
    port.postMessage(reply);
  });
});

function held(): number {
  return v8.getHeapStatistics().external_memory;
}
