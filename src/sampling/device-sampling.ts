// Sampling on the device (Backend.sampleRows) with the host sampler's exact semantics: the host
// side of it. Each request keeps its RNG here on the host; building a row consumes one uniform
// exactly where Sampler.sample would (none for a greedy row), so a seeded request yields the same
// tokens whether its rows were sampled on the host or on the device (up to float rounding: a token
// may differ only when u falls within ~1e-5, relative to the total mass, of a cumulative boundary
// of the draw, or a top-p / min-p cut sits that close; see contracts/device-sampling.ts).
//
// How the engine uses it (execution/engine.ts launch / deviceRow), per step:
//   1. the forward pass is enqueued (a graph replay on CUDA); DecoderModel.launch then calls back
//      for the rows, so the host work below overlaps the device;
//   2. for each sampled row, in row order, with the grammar mask computed and after the
//      onlyStopAllowed() check (which ends the row without sampling, so it must not draw):
//        deviceSampleRow({ sampler, history, mask, topLogprobs })   (draws the row's uniform)
//   3. the decoder enqueues backend.sampleRows on those rows' logits and reads the i32 result
//      back; decodeDeviceSamples turns it into per row { tokenId, logprobs? } or { error }, and
//      the engine accepts tokenId as a sampled token (or ends the row on { error }, as a sampler
//      error would). A pipelined next step takes its ids from the result's token column.
// (sampleOnDevice below does 2 and 3 in one call, for callers holding a logits tensor.)
// Only rows whose request fits (deviceSamplable) go this way; the rest keep reading their logits.
// One difference in RNG use: the host sampler draws nothing for a row it cannot sample (every
// logit -Infinity, or a +Infinity), the device row drew its uniform before; such a row ends with
// an error either way, so no later token depends on it.

import type { Backend, Tensor } from '../contracts/backend.ts';
import {
  decodeSampleResults, DEVICE_SAMPLING_MAX_LOGPROBS, type DeviceSampleRow, SAMPLE_ERR_INF, SAMPLE_ERR_MASKED,
} from '../contracts/device-sampling.ts';
import type { TokenHistory } from './history.ts';
import type { TokenLogprobs } from './logprobs.ts';
import { isGreedy } from './params.ts';
import type { Sampler } from './sampler.ts';

/** One row to sample, as the engine's accept() would hand it to Sampler.sample. */
export interface DeviceSamplingRequest {
  /** the request's Sampler (its params, and its RNG through nextUniform) */
  sampler: Pick<Sampler, 'params' | 'nextUniform'>;
  /** required when a penalty is set (as for Sampler.sample) */
  history?: TokenHistory;
  /** the row's grammar bitmask, when it has a grammar */
  mask?: Int32Array;
  /** undefined: no logprobs; else the chosen token's logprob and this many best */
  topLogprobs?: number;
}

/** True when `backend` samples on the device and the request fits its limits. */
export function deviceSamplable(backend: Backend, topLogprobs?: number): boolean {
  return backend.sampleRows !== undefined && (topLogprobs === undefined || topLogprobs <= DEVICE_SAMPLING_MAX_LOGPROBS);
}

/**
 * A request's logit_bias as the rows' arrays, built once per resolved map (resolveSamplingParams
 * makes it, nothing changes it after): a whole-vocabulary bias on n sequences is then copied
 * once, not once per row per step.
 */
const biasArrayCache = new WeakMap<ReadonlyMap<number, number>, { ids: Int32Array; values: Float64Array }>();
function biasArrays(bias: ReadonlyMap<number, number>): { ids: Int32Array; values: Float64Array } {
  let b = biasArrayCache.get(bias);
  if (!b) {
    const ids = new Int32Array(bias.size), values = new Float64Array(bias.size);
    let i = 0;
    for (const [id, v] of bias) (ids[i] = id), (values[i++] = v);
    biasArrayCache.set(bias, (b = { ids, values }));
  }
  return b;
}

/**
 * The device row of one request. Consumes one uniform from the request's RNG unless the request
 * is greedy: call it exactly once per token, where Sampler.sample would have been called.
 */
export function deviceSampleRow(req: DeviceSamplingRequest): DeviceSampleRow {
  const p = req.sampler.params;
  const row: DeviceSampleRow = {
    temperature: p.temperature,
    topK: p.topK,
    topP: p.topP,
    minP: p.minP,
    u: 0,
    repetitionPenalty: p.repetitionPenalty,
    frequencyPenalty: p.frequencyPenalty,
    presencePenalty: p.presencePenalty,
  };
  if (p.logitBias.size > 0) {
    const b = biasArrays(p.logitBias);
    row.biasIds = b.ids;
    row.biasValues = b.values;
  }
  const repetition = p.repetitionPenalty !== 1;
  if (repetition || p.frequencyPenalty !== 0 || p.presencePenalty !== 0) {
    const h = req.history;
    if (h === undefined) throw new Error('penalties are set but no TokenHistory was passed to sample()');
    // repetition touches prompt ∪ output; frequency/presence only the generated ids
    const ids: number[] = [];
    const counts: number[] = [];
    if (repetition) {
      for (const id of h.seen()) {
        ids.push(id);
        counts.push(h.count(id));
      }
    } else {
      for (const [id, c] of h.outputCountEntries()) {
        ids.push(id);
        counts.push(c);
      }
    }
    row.penaltyIds = Int32Array.from(ids);
    row.outputCounts = Int32Array.from(counts);
  }
  if (req.mask !== undefined) row.mask = req.mask;
  if (req.topLogprobs !== undefined) row.topLogprobs = req.topLogprobs;
  // last: a row that fails to build draws nothing
  if (!isGreedy(p)) row.u = req.sampler.nextUniform();
  return row;
}

/** A row's result: its token (with logprobs when asked), or the error the host sampler would throw. */
export type DeviceSampleOutcome = { tokenId: number; logprobs?: TokenLogprobs } | { error: string };

export interface PendingDeviceSamples {
  /** the op's output, i32 [P, 2 + 2K]; owned by the scope open when sampleOnDevice was called */
  readonly result: Tensor;
  /** waits for the device and decodes one outcome per request, in order */
  read(): Promise<DeviceSampleOutcome[]>;
}

const MASKED = 'cannot sample: every logit is -Infinity or NaN';
const INF = 'cannot sample: a logit is +Infinity';

/**
 * Enqueues the sampling of logits [P, V] (one request per row, in row order) on the device.
 * Builds every row first (drawing the uniforms), so a request that cannot be built throws before
 * anything is enqueued or drawn for the rows after it.
 */
export function sampleOnDevice(backend: Backend, logits: Tensor, reqs: readonly DeviceSamplingRequest[]): PendingDeviceSamples {
  if (!backend.sampleRows) throw new Error(`the ${backend.name} backend cannot sample on the device`);
  for (const r of reqs) {
    if (r.topLogprobs !== undefined && r.topLogprobs > DEVICE_SAMPLING_MAX_LOGPROBS) {
      throw new RangeError(`top logprobs ${r.topLogprobs} is above the device's ${DEVICE_SAMPLING_MAX_LOGPROBS}`);
    }
  }
  const rows = reqs.map(deviceSampleRow);
  const result = backend.sampleRows(logits, rows);
  return {
    result,
    read: async () => decodeDeviceSamples((await backend.read(result)) as Int32Array, rows),
  };
}

/**
 * The outcomes of a sampleRows result read back (i32 [P, 2 + 2K]) for the `rows` it was enqueued
 * with: per row its token (with logprobs when asked), or the error the host sampler would throw.
 */
export function decodeDeviceSamples(data: Int32Array, rows: readonly DeviceSampleRow[]): DeviceSampleOutcome[] {
  return decodeSampleResults(data, rows).map((s): DeviceSampleOutcome => {
    if (s.tokenId === SAMPLE_ERR_MASKED || s.tokenId < 0) return { error: s.tokenId === SAMPLE_ERR_INF ? INF : MASKED };
    if (s.logprob === undefined) return { tokenId: s.tokenId };
    return { tokenId: s.tokenId, logprobs: { tokenId: s.tokenId, logprob: s.logprob, top: s.top ?? [] } };
  });
}
