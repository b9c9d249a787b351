// A grammar host thread: a HostCore (grammar-host.ts) driven by the messages of the
// GrammarCompiler that started it (grammar-host-client.ts WorkerHost). Started with HostInit as
// workerData; posts {type: 'ready'} once the serving instance is loaded and the vocabulary
// indexed, then takes HostRequests in order. Compiles are answered by message; a row's answers
// go into its slot (a SharedArrayBuffer the main thread waits on), status first, then the mask.
//
// Masks are computed after everything that is already queued: a row's next operation (the
// tokens jump-forward forces) makes the mask of its state before it useless, so queued messages
// are taken first (receiveMessageOnPort) and a mask is computed only for a row's latest state.
// The heap's size is published in a shared word after each batch of work.

import { parentPort, receiveMessageOnPort, workerData } from 'node:worker_threads';
import { HostCore, Slot, type CompileReply } from './grammar-host.ts';
import type { Prepared } from './prepare.ts';
import type { VocabData } from './checker.ts';

export interface HostInit {
  /** the vocabulary's data, as UTF-8 JSON (shared: every host reads the same bytes) */
  vocab: SharedArrayBuffer;
  heapCapBytes: number;
  /** two Int32 words written by the host: the heap's size in 64 KiB pages, and its top (HostCore.top) */
  heap: SharedArrayBuffer;
}

export type HostRequest =
  | { op: 'compile'; id: number; prepared: Prepared; what: string; maxBytes: number }
  | { op: 'drop'; gid: number }
  | { op: 'create'; mid: number; gid: number; slot: SharedArrayBuffer; jump: boolean }
  | { op: 'accept'; mid: number; ids: number[] }
  | { op: 'dispose'; mid: number };

export type HostReply =
  | { type: 'ready'; baseHeap: number; baseTop: number }
  | { type: 'fatal'; message: string }
  | ({ type: 'compiled'; id: number } & CompileReply)
  /** the serving instance failed while matching: every row failed, the host must go */
  | { type: 'broken'; message: string };

const port = parentPort!;
const init = workerData as HostInit;
const heapWord = new Int32Array(init.heap);
let core: HostCore | undefined;
let reportedBroken = false;
/** rows whose mask is owed, oldest first */
const owed = new Set<number>();

HostCore.start(JSON.parse(Buffer.from(init.vocab).toString('utf8')) as VocabData, { heapCapBytes: init.heapCapBytes }).then((c) => {
  core = c;
  publishHeap();
  port.postMessage({ type: 'ready', baseHeap: c.baseHeap, baseTop: c.baseTop } satisfies HostReply);
}, (err: unknown) => port.postMessage({ type: 'fatal', message: err instanceof Error ? err.message : String(err) } satisfies HostReply));

port.on('message', (req: HostRequest) => {
  handle(req);
  pump();
});

function handle(req: HostRequest): void {
  const c = core!;
  switch (req.op) {
    case 'compile': {
      const r = c.compile(req.prepared, req.what, req.maxBytes);
      publishHeap(); // before the reply: the compiler reads the heap when it gets it
      port.postMessage({ type: 'compiled', id: req.id, ...r } satisfies HostReply);
      break;
    }
    case 'drop':
      c.drop(req.gid);
      break;
    case 'create':
      c.create(req.mid, req.gid, new Slot(req.slot, c.vocabSize), req.jump);
      c.status(req.mid);
      owed.add(req.mid);
      break;
    case 'accept':
      c.accept(req.mid, req.ids);
      c.status(req.mid);
      owed.delete(req.mid);
      owed.add(req.mid);
      break;
    case 'dispose':
      c.dispose(req.mid);
      owed.delete(req.mid);
      break;
  }
  reportBroken();
}

function reportBroken(): void {
  if (!core!.broken || reportedBroken) return;
  reportedBroken = true;
  port.postMessage({ type: 'broken', message: core!.failure ?? 'the grammar engine instance failed' } satisfies HostReply);
}

/** Takes every queued message, then computes the owed masks (taking any message that arrives first). */
function pump(): void {
  for (;;) {
    const next = receiveMessageOnPort(port);
    if (next) {
      handle(next.message as HostRequest);
      continue;
    }
    const mid = owed.values().next();
    if (mid.done) break;
    owed.delete(mid.value);
    core!.mask(mid.value);
    reportBroken();
  }
  publishHeap();
}

function publishHeap(): void {
  Atomics.store(heapWord, 0, Math.floor(core!.heapBytes() / 65536));
  Atomics.store(heapWord, 1, core!.top);
}
