// Hands one scheduled step to the model: its token ids, and per sampling row how its token is
// taken (the row's pick): the device's greedy argmax, the device's sampleRows, or its logits read
// back for the host sampler.
//
// Device sampling: on a backend with Backend.sampleRows, a row that is not a plain greedy pick
// (temperature, top-k/p, min-p, penalties, bias, logprobs up to 20, a grammar mask) takes its token
// and logprobs from that op instead of reading its logits back. The request's RNG stays here: the
// row's uniform is drawn when the op is enqueued, one per sampled token as the host sampler draws
// it, so a seed gives the same tokens either way (EngineOptions.deviceSampling switches it).
//
// A row with a draft (methods/) computes the draft's tokens after its known ones, and every one
// of its logit rows (the last known position, then each draft) takes the pick the row would take
// alone: a draft position's token is then exactly what a plain step would have produced there,
// once the drafts before it are accepted. A device-sampled draft position is built with those
// drafts in the history (penalties) and draws its uniform in order; the ones a rejection leaves
// unused go back to the sequence (Sequence.uniformsBack), so each token takes the same uniform
// it would take without drafts.

import type { DecoderModel, HiddenRequest, PendingStep, RowPick } from '../models/decoder.ts';
import type { DeviceIds } from '../models/device-ids.ts';
import type { DeviceSampleRow } from '../contracts/device-sampling.ts';
import type { KvCache } from '../state/kv-cache.ts';
import { deviceSamplable, deviceSampleRow, isGreedy, needsLogitProcessing } from '../sampling/index.ts';
import { logitRowsOf, type ScheduledRow } from './scheduler.ts';
import type { Sequence } from './sequence.ts';

/** A sampleRows row of the step: its sequence, and the draft tokens before its position (its history's tail). */
interface SampledPosition {
  seq: Sequence;
  drafted: readonly number[];
}

/** A row handed to Backend.sampleRows. */
export interface DeviceRow {
  row: DeviceSampleRow;
  /** it could not be built (its grammar failed): the row ends with this, its result unused */
  failed?: { error: unknown };
  /** the uniform it drew from its sequence's RNG (none when greedy) */
  u?: number;
}

/** A step handed to the model whose results have not been postprocessed yet. */
export interface InFlight {
  rows: ScheduledRow[];
  step: PendingStep;
  /** the step's 'sample' rows, in logit-row order (filled when the step is enqueued) */
  sampled: DeviceRow[];
  /**
   * uniforms its sampled rows drew, in order: handed back to their sequences if it is dropped;
   * `at` is the row's logit row among its sequence's (0: its last known position, j: draft j - 1)
   */
  draws: { seq: Sequence; u: number; at: number }[];
  /** tokens the step computes, and when its enqueue ended (restore policy) */
  tokens: number;
  launchedAt: number;
  /** enqueued behind the step before it, its ids that step's device picks */
  pipelined: boolean;
  /** when its schedule began (a step run end to end; Engine: its cost for the draft depth) */
  plannedAt?: number;
  /** the step before it failed: nothing of this one is taken */
  discard?: boolean;
}

export interface StepLaunchOptions {
  /** StepBatch.graphWidth: a decode-only step may replay a captured graph with tables this wide (undefined: never) */
  graphWidth: number | undefined;
  /** keep each step's device tokens, for a pipelined step's ids (EngineOptions.pipeline) */
  keepDeviceTokens: boolean;
  /** non-greedy rows sample on the device (EngineOptions.deviceSampling) */
  deviceSampling: boolean;
  /** the hidden states a step of these rows must hand out (an EAGLE-3 head's: methods/eagle3.ts) */
  hiddenFor?: (rows: readonly ScheduledRow[]) => HiddenRequest | undefined;
}

/** a sampleRows row that draws nothing and whose result is not used (a row that samples no token) */
const IDLE_ROW: DeviceSampleRow = {
  temperature: 0, topK: 0, topP: 1, minP: 0, u: 0, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0,
};

/**
 * A row whose next token is the plain argmax of its logits (greedy; no penalty, bias, grammar
 * or logprobs): the device may pick it, and its logits need not come back.
 */
export function greedyOnly(seq: Sequence): boolean {
  const p = seq.sampler.params;
  return isGreedy(p) && !needsLogitProcessing(p) && !seq.grammar && seq.request.topLogprobs === undefined;
}

/**
 * A pipelined step that is dropped (it failed, or the one before it did) computed nothing its
 * rows keep: the uniforms it drew go back to them, in order, so the step that computes those
 * tokens again draws the same ones (a seeded row's tokens do not depend on a device fault).
 */
export function returnDraws(cur: InFlight): void {
  for (const { seq, u } of cur.draws) if (!seq.finished) seq.uniformsBack.push(u);
  cur.draws = [];
}

export class StepLauncher {
  constructor(
    private readonly model: DecoderModel,
    private readonly kv: KvCache,
    private readonly opts: StepLaunchOptions,
    /** a step that could not be enqueued (Engine: its rows end, or get their draws back) */
    private readonly onFailed: (cur: InFlight, err: unknown) => void,
  ) {}

  /**
   * Hands a step to the model. `ahead`: the rows' ids are an earlier step's picks still on the
   * device (a pipelined step). Returns undefined when it could not be enqueued: a scheduled
   * step's rows then end with the error; a pipelined step's rows are simply still owed their token.
   */
  launch(rows: ScheduledRow[], ahead?: DeviceIds): InFlight | undefined {
    const tokens: number[] = [];
    const logitTokens: number[] = [];
    const picks: RowPick[] = [];
    const samplers: SampledPosition[] = [];
    for (const row of rows) {
      const drafts = row.draft?.tokens ?? [];
      // a pipelined row's token is not on the host yet (the device supplies it)
      for (let p = row.start; p < row.start + row.count - drafts.length; p++) tokens.push(ahead ? 0 : row.seq.tokenAt(p));
      if (!row.sample) continue;
      // a draft drawn with its distributions is judged by rejection sampling, on the host's logits;
      // a grammar row's masks after its drafts are known only as verify accepts them, on the host
      const onHost = row.draft && (row.seq.grammar || (row.draft.probs && !isGreedy(row.seq.sampler.params)));
      const pick = onHost ? 'logits' : this.pickOf(row.seq);
      logitTokens.push(tokens.length - 1);
      picks.push(pick);
      for (const t of drafts) {
        tokens.push(t);
        logitTokens.push(tokens.length - 1);
        picks.push(pick);
      }
    }
    // A step that samples on the device takes its greedy rows' tokens from the same op (an argmax
    // there): the step's tokens are then one tensor, which a pipelined next step takes its ids from.
    const sampling = picks.includes('sample');
    let li = 0;
    for (const row of rows) {
      if (!row.sample) continue;
      const drafts = row.draft?.tokens ?? [];
      for (let j = 0; j <= drafts.length; j++) {
        if (sampling && picks[li] === 'argmax') picks[li] = 'sample';
        if (picks[li++] === 'sample') samplers.push({ seq: row.seq, drafted: drafts.slice(0, j) });
      }
    }
    // a pipelined step's rows never need hidden states (a row whose proposer reads them is never pipelined)
    const hidden = ahead ? undefined : this.opts.hiddenFor?.(rows);
    const cur: InFlight = { rows, step: undefined!, sampled: [], draws: [], tokens: tokens.length, launchedAt: 0, pipelined: !!ahead };
    try {
      cur.step = this.model.launch({
        tokens: Int32Array.from(tokens),
        // a pipelined row reaches one past the known tokens: its own input is still arriving
        rows: rows.map((r) => ({ seq: r.seq.kv!, start: r.start, count: r.count, ropeLength: Math.max(r.seq.known, r.start + r.count) })),
        logitTokens,
        graphWidth: this.opts.graphWidth,
        deviceIds: ahead,
        ...(hidden ? { hidden } : {}),
      }, this.kv, {
        rows: picks,
        // called once the forward is enqueued: masks and uniforms while the device computes
        sampleRows: () => {
          cur.sampled = samplers.map((s) => this.deviceRow(s, cur.draws));
          return cur.sampled.map((d) => d.row);
        },
        keep: this.opts.keepDeviceTokens,
      });
    } catch (err) {
      // The device step failed: its rows cannot continue; everyone else can. A pipelined step's
      // rows are still owed their token: the uniforms drawn for it go back to them.
      this.onFailed(cur, err);
      return undefined;
    }
    cur.launchedAt = performance.now();
    prepareGrammarMasks(rows, cur.step.picks); // host-sampled rows, while the device runs the step
    return cur;
  }

  /** How `seq`'s next token is taken: the device's greedy pick, the device's sampleRows, or its logits. */
  pickOf(seq: Sequence): RowPick {
    if (greedyOnly(seq)) return 'argmax';
    return this.opts.deviceSampling && deviceSamplable(this.model.backend, seq.request.topLogprobs) ? 'sample' : 'logits';
  }

  /**
   * The sampleRows row of `seq`'s next token (after the `drafted` tokens of its draft), as
   * accept() would sample it on the host: its grammar mask, then one uniform drawn (none when
   * greedy), recorded in `draws`. A grammar row that may only stop, or whose mask fails, draws
   * nothing: accept() ends it as it would on the host.
   */
  private deviceRow({ seq, drafted }: SampledPosition, draws: InFlight['draws']): DeviceRow {
    const length = seq.history.outputLength;
    try {
      let mask: Int32Array | undefined;
      if (seq.grammar) {
        if (seq.grammar.onlyStopAllowed()) return { row: IDLE_ROW };
        mask = seq.grammar.mask();
      }
      for (const t of drafted) seq.history.push(t); // the penalties at a draft position count the drafts before it
      const sampler = { params: seq.sampler.params, nextUniform: () => seq.uniformsBack.shift() ?? seq.sampler.nextUniform() };
      const row = deviceSampleRow({ sampler, history: seq.history, mask, topLogprobs: seq.request.topLogprobs });
      if (isGreedy(seq.sampler.params)) return { row };
      draws.push({ seq, u: row.u, at: drafted.length });
      return { row, u: row.u };
    } catch (error) {
      return { row: IDLE_ROW, failed: { error } };
    } finally {
      seq.history.truncate(length);
    }
  }
}

/**
 * Grammar rows about to sample on the host need their token bitmask; computing it here, after
 * the step was handed to the device and before its logits are awaited, takes it off the critical
 * path (device-sampled rows computed theirs before their op was enqueued). A failure is left for
 * accept() to report (the mask is recomputed there).
 */
function prepareGrammarMasks(rows: ScheduledRow[], picks: readonly RowPick[] | undefined): void {
  let li = 0;
  for (const row of rows) {
    if (!row.sample) continue;
    const pick = picks?.[li] ?? 'logits';
    li += logitRowsOf(row);
    if (pick !== 'logits' || !row.seq.grammar || row.seq.finished) continue;
    try {
      row.seq.grammar.mask();
    } catch {
      // accept() ends the row with the error
    }
  }
}
