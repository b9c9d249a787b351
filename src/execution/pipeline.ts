// Pipelined decode: when every row of step N takes its token on the device (a greedy pick, or a
// device-sampled row whose next draw needs nothing of N's token: no penalty, no grammar), and the
// schedule after N would be a plain decode of those same sequences, step N+1 is enqueued before
// N's tokens are read back, its ids N's tokens copied on the device; N's bookkeeping then runs
// while N+1 computes. At most one step is in flight beyond the one being postprocessed. A row
// that ends at N has one extra token computed by N+1, which is dropped: never emitted, counted or
// hashed (a sampled row drew one uniform for it, which nothing later uses). Its KV write goes to a
// block the row still held when N+1 was enqueued, at a position no block hash covers; a step that
// gets the block later is enqueued later, so (ops run in enqueue order) it writes each position
// before reading it.
//
// A step with a draft (methods/) is never followed by a pipelined one, and a row whose method
// would draft is not pipelined: where its next step starts, and what it computes, depend on the
// verdict over its draft. A speculative row whose drafting is off (adaptive depth at zero) is a
// plain row and pipelines like one.

import type { ModelConfig } from '../contracts/model-config.ts';
import type { KvCache } from '../state/kv-cache.ts';
import { hasPenalties } from '../sampling/index.ts';
import type { Scheduler, ScheduledRow } from './scheduler.ts';
import type { Sequence } from './sequence.ts';
import { greedyOnly, type InFlight, type StepLauncher } from './step-launch.ts';
import { kvGoesStale } from './stale-kv.ts';

/** What the pipeline needs of a request beyond its sequence (the engine's handle of it). */
export interface RequestState {
  cancelled?: string;
  stream?: { readonly room: number };
}

export class DecodePipeline {
  constructor(
    private readonly launcher: StepLauncher,
    private readonly scheduler: Scheduler,
    private readonly kv: KvCache,
    private readonly config: ModelConfig,
    /** undefined: the request is gone (finished) */
    private readonly requestOf: (seq: Sequence) => RequestState | undefined,
  ) {}

  /**
   * Enqueues step N+1 behind `cur` (step N) before N's tokens are read back: a decode of each of
   * N's sequences, its id N's token on the device (greedy pick or sampled), gathered there. Only
   * when every row's next token needs nothing of N's but its id (pipelinable) and the schedule
   * after N would plan exactly these rows; undefined otherwise (the pipeline drains: N is read
   * back and the scheduler plans the next step).
   */
  launchAhead(cur: InFlight): InFlight | undefined {
    const ids = cur.step.deviceTokens, at = cur.step.deviceTokenAt;
    if (!ids || !at || cur.discard) return undefined;
    const next: { seq: Sequence; start: number; pick: number }[] = [];
    let ending = false;
    let li = 0; // logit row of `row` in cur (every row of a pipelinable step samples)
    for (const row of cur.rows) {
      const seq = row.seq;
      if (!row.sample) return undefined; // a prefill chunk follows
      if (row.draft) return undefined; // its method judges the draft on the host before the row goes on
      const pick = at[li++]!;
      if (seq.finished) continue; // ended while cur was in flight: its token is dropped
      if (pick < 0 || !this.pipelinable(seq) || !this.staysDecoding(seq, row)) return undefined;
      if (seq.known + 1 >= seq.maxTokensTotal) {
        ending = true; // cur's token ends it (length): the schedule after cur drops it too
        continue;
      }
      const start = row.start + row.count;
      if (this.kv.passesUnhashed(seq.kv!, start)) return undefined; // cur's commit must hash what the window passes
      next.push({ seq, start, pick });
    }
    if (next.length === 0 || !this.scheduleWouldMatch(cur, next.length, ending)) return undefined;
    return this.launcher.launch(this.scheduler.scheduleAhead(next), { ids, index: Int32Array.from(next, (n) => n.pick) });
  }

  /**
   * A row whose next token may be computed before its current one reaches the host: one the
   * device picks or samples, whose next draw depends on the current token only through its id
   * (and its RNG, which stays in order: one draw per token). Penalties need the token in the
   * history and a grammar needs it accepted, so those rows are not (no on-device counts). A row
   * whose method drafts is not either: its drafts follow the token in flight (the method says).
   */
  private pipelinable(seq: Sequence): boolean {
    const plain = greedyOnly(seq) || (this.launcher.pickOf(seq) === 'sample' && !seq.grammar && !hasPenalties(seq.sampler.params));
    return seq.method.pipelinable(seq, plain);
  }

  /**
   * false when the schedule after `row`'s step would not plan a plain decode of `seq`: it was
   * cancelled, its stream is full once that step's token is in, or its KV is about to be
   * recomputed (recomputeStaleKv).
   */
  private staysDecoding(seq: Sequence, row: ScheduledRow): boolean {
    const h = this.requestOf(seq);
    if (!h || h.cancelled) return false;
    if (h.stream && h.stream.room <= 1) return false;
    return !kvGoesStale(seq, row.start + row.count, seq.known + 1, this.config.recomputeKvPastLength);
  }

  /**
   * true when the scheduler, run after `cur`, would plan a decode of its `rows` continuing
   * sequences and nothing else: no other running sequence is owed tokens (paused, left out by
   * the budget) and the queue's head would not be admitted (nor could it be once a row `ending`
   * frees its room).
   */
  private scheduleWouldMatch(cur: InFlight, rows: number, ending: boolean): boolean {
    const inCur = new Set(cur.rows.map((r) => r.seq));
    if (this.scheduler.running.some((s) => !inCur.has(s))) return false;
    return this.scheduler.waiting.length === 0 || (!ending && !this.scheduler.wouldAdmit(rows));
  }
}
