// On-device sampling (the Backend's optional `sampleRows`): what one row asks for, the packed
// upload a backend sends to the device (one buffer per call), and the packed result it returns.
//
// The semantics are exactly the host sampler's (src/sampling/): for a row of raw logits x [V]
//   1. processing: logit bias (x += bias), repetition penalty over the listed ids
//      (x > 0 ? x / p : x * p), then frequency/presence penalty over the ids generated so far
//      (x -= frequency * count + presence), each step computed in float64 and stored as float32
//      exactly as the host does; then the grammar mask (a disallowed id becomes -Infinity);
//   2. temperature 0: the argmax of the processed row (lowest id on ties);
//   3. else weights w = exp((x - max) / T); top-k keeps every value >= the k-th largest (ties
//      with it included); top-p keeps, in (value desc, id asc) order, each token whose mass before
//      it is < topP * (mass of the top-k set); min-p keeps w >= minP;
//   4. the draw: with Z the total weight left, the first token in ASCENDING ID order whose
//      cumulative weight exceeds u * Z (the last positive one when rounding leaves none).
// `u` comes from the host: the request's RNG stays on the host and is consumed exactly when the
// host sampler would consume it (once per non-greedy draw), so a seed reproduces the same tokens
// wherever sampling ran. Logprobs are those of src/sampling/logprobs.ts: log-softmax of the RAW
// row (before bias, penalties, mask and temperature), the chosen token's and the k best
// (value desc, id asc).
//
// Exactness: processing, greedy and top-k compare float32 values and match the host bit for bit.
// Weights and masses are float64 on the host and the reference backend (equal tokens), f32 expf
// with 40-bit fixed-point sums on CUDA: there a token may differ from the host's only when u * Z
// lies within ~1e-5 * Z of a cumulative boundary of the draw, or the mass before a token lies that
// close to the top-p target, or a weight lies within ~1e-5 relative of minP (the device's error
// bound is ~1e-6: f32 expf and its argument's rounding, < 2^-40 per token from the fixed point).
// Rows whose logits hold NaN: the device treats NaN as -Infinity (never chosen); the host sampler's
// behaviour on such a row is itself degenerate, so the two may differ there.

/** The most top logprobs a row may ask for (OpenAI's limit). */
export const DEVICE_SAMPLING_MAX_LOGPROBS = 20;

/** One row of on-device sampling. Built on the host by sampling/device-sampling.ts. */
export interface DeviceSampleRow {
  /** 0 = greedy: the argmax of the processed logits (u unused) */
  temperature: number;
  /** <= 0 or >= V: off; else keep the values >= the k-th largest */
  topK: number;
  /** >= 1: off */
  topP: number;
  /** <= 0: off */
  minP: number;
  /** the uniform draw in [0, 1) the host's RNG made for this row (ignored when greedy) */
  u: number;
  /** 1 = off; applies to every id of penaltyIds */
  repetitionPenalty: number;
  /** 0 = off; applies to the ids of penaltyIds whose outputCounts entry is > 0 */
  frequencyPenalty: number;
  /** 0 = off; as frequencyPenalty */
  presencePenalty: number;
  /** distinct ids seen in prompt or output (what the repetition penalty touches) */
  penaltyIds?: Int32Array;
  /** per penaltyIds entry: occurrences among the generated tokens (0 = prompt only) */
  outputCounts?: Int32Array;
  /** distinct logit_bias ids and their biases (added in float64, as the host does) */
  biasIds?: Int32Array;
  biasValues?: Float64Array;
  /** grammar token bitmask: bit (id & 31) of word (id >> 5) set = allowed; ids past it are disallowed */
  mask?: Int32Array;
  /** undefined: no logprobs; else report the chosen token's logprob and this many (0..20) best */
  topLogprobs?: number;
}

// ---- packed upload: Int32 words ------------------------------------------------------------
// header [SR_HDR words]: P, V, K (the widest topLogprobs of the call, 0 when none), scratch rows
// row r at SR_HDR + r * SR_ROW_WORDS (fields SR_* below; f64 fields take two words, little-endian,
//   at even word offsets so the device reads them as aligned doubles)
// entries (SR_ENT_WORDS each), at an even offset: id, count (-1 = not seen: bias only; else the
//   id's output count, 0 = prompt only), hasBias (0/1), 0, bias (f64)
// mask words: exactly ceil(V / 32), zero-padded

export const SR_HDR = 4;
export const SR_ROW_WORDS = 24;
export const SR_ENT_WORDS = 6;
/** row fields (word offsets inside a row record) */
export const SR = {
  FLAGS: 0,
  TOPK: 1, // effective: 0 when off (<= 0 or >= V)
  NENT: 2,
  ENT_OFF: 3, // word offset of the row's entries in the buffer
  MASK_OFF: 4, // word offset of the row's mask words (0 when none)
  NLP: 5, // top logprobs wanted (0..20)
  SCRATCH: 6, // processed-row slot in the scratch buffer, -1 = the raw row is used as is
  TEMP: 8, // f64
  TOPP: 10, // f64
  MINP: 12, // f64
  U: 14, // f64
  REP: 16, // f64
  FREQ: 18, // f64
  PRES: 20, // f64
} as const;
export const SR_F_GREEDY = 1;
export const SR_F_MASK = 2;
export const SR_F_LOGPROBS = 4;
export const SR_F_TOPP = 8;
export const SR_F_MINP = 16;

// ---- packed result: Int32 [P, 2 + 2K] ---------------------------------------------------------
// per row: token id (or SAMPLE_ERR_*), the chosen token's logprob (f32 bits; NaN when not asked),
// then K pairs (id, logprob f32 bits), best first; id -1 past the row's own topLogprobs.

/** every processed logit is -Infinity or NaN */
export const SAMPLE_ERR_MASKED = -1;
/** a processed logit is +Infinity (non-greedy rows) */
export const SAMPLE_ERR_INF = -2;

export function sampleResultWidth(k: number): number {
  return 2 + 2 * k;
}

export interface PackedSampleRows {
  words: Int32Array;
  /** rows P, vocabulary V, result pairs K */
  rows: number;
  vocab: number;
  k: number;
  /** rows with bias, penalties or a mask: each gets a processed copy of its logits on the device */
  scratchRows: number;
}

function pos(name: string, v: number, ok: boolean): void {
  if (!ok) throw new RangeError(`sampleRows: ${name} ${v} is out of range`);
}

/** id -> its entry in the row being merged, plus one (0 = none); every slot set is cleared after the row */
let slotOf = new Int32Array(0);
/**
 * Every row's merged entries, row after row (one per distinct id in a row: its penalty ids in
 * order, then bias-only ids): id, output count (-1 = bias only), has-bias, bias. Reused from
 * call to call, so a whole-vocabulary bias on many rows allocates nothing per step but the buffer.
 */
let entIds = new Int32Array(0);
let entCounts = new Int32Array(0);
let entHas = new Uint8Array(0);
let entBias = new Float64Array(0);

function reserveEntries(n: number): void {
  if (entIds.length >= n) return;
  const cap = Math.max(n, 2 * entIds.length);
  const grow = <T extends Int32Array | Uint8Array | Float64Array>(a: T, make: (n: number) => T): T => {
    const b = make(cap);
    b.set(a as never);
    return b;
  };
  entIds = grow(entIds, (k) => new Int32Array(k));
  entCounts = grow(entCounts, (k) => new Int32Array(k));
  entHas = grow(entHas, (k) => new Uint8Array(k));
  entBias = grow(entBias, (k) => new Float64Array(k));
}

/**
 * Merges a row's penalty ids and bias ids into the entries from `at` on (ids outside the row are
 * ignored, as the host ignores them); returns how many. No map: this runs for every row of every
 * step.
 */
function rowEntries(r: DeviceSampleRow, V: number, at: number): number {
  const ids = r.penaltyIds, counts = r.outputCounts, bids = r.biasIds, bvals = r.biasValues;
  if (ids && (!counts || counts.length !== ids.length)) throw new RangeError('sampleRows: outputCounts must match penaltyIds');
  if (bids && (!bvals || bvals.length !== bids.length)) throw new RangeError('sampleRows: biasValues must match biasIds');
  reserveEntries(at + (ids?.length ?? 0) + (bids?.length ?? 0));
  let n = 0;
  try {
    if (ids) {
      for (let j = 0; j < ids.length; j++) {
        const id = ids[j]!;
        if (!(id >= 0 && id < V)) continue;
        if (slotOf[id] !== 0) throw new RangeError(`sampleRows: penalty id ${id} is listed twice`);
        pos('outputCount', counts![j]!, counts![j]! >= 0);
        entIds[at + n] = id;
        entCounts[at + n] = counts![j]!;
        entHas[at + n] = 0;
        entBias[at + n] = 0;
        slotOf[id] = ++n;
      }
    }
    if (bids) {
      for (let j = 0; j < bids.length; j++) {
        const id = bids[j]!;
        if (!(id >= 0 && id < V)) continue;
        pos('bias', bvals![j]!, Number.isFinite(bvals![j]!));
        let k = slotOf[id]! - 1;
        if (k >= 0 && entHas[at + k]) throw new RangeError(`sampleRows: bias id ${id} is listed twice`);
        if (k < 0) {
          k = n;
          entIds[at + k] = id;
          entCounts[at + k] = -1;
          slotOf[id] = ++n;
        }
        entHas[at + k] = 1;
        entBias[at + k] = bvals![j]!;
      }
    }
  } finally {
    for (let j = 0; j < n; j++) slotOf[entIds[at + j]!] = 0;
  }
  return n;
}

/** Packs rows for a [P, V] logits tensor. Throws RangeError on a bad parameter. */
export function packSampleRows(rows: readonly DeviceSampleRow[], V: number): PackedSampleRows {
  if (!Number.isSafeInteger(V) || V < 1 || V >= 2 ** 30) throw new RangeError(`sampleRows: vocabulary size ${V} is out of range`);
  const P = rows.length;
  const maskWords = Math.ceil(V / 32);
  let K = 0;
  let words = SR_HDR + P * SR_ROW_WORDS;
  // rows' entries: row i's are [entStart[i], entStart[i] + entCount[i]) of the shared arrays
  const entStart = new Int32Array(P), entCount = new Int32Array(P);
  let entries = 0;
  if (slotOf.length < V) slotOf = new Int32Array(V);
  for (let i = 0; i < P; i++) {
    const r = rows[i]!;
    pos('temperature', r.temperature, Number.isFinite(r.temperature) && r.temperature >= 0);
    pos('topK', r.topK, Number.isInteger(r.topK));
    pos('topP', r.topP, r.topP > 0 && r.topP <= Infinity);
    pos('minP', r.minP, r.minP <= 1 && !Number.isNaN(r.minP));
    pos('u', r.u, r.u >= 0 && r.u < 1);
    pos('repetitionPenalty', r.repetitionPenalty, Number.isFinite(r.repetitionPenalty) && r.repetitionPenalty > 0);
    pos('frequencyPenalty', r.frequencyPenalty, Number.isFinite(r.frequencyPenalty));
    pos('presencePenalty', r.presencePenalty, Number.isFinite(r.presencePenalty));
    if (r.topLogprobs !== undefined) {
      pos('topLogprobs', r.topLogprobs, Number.isInteger(r.topLogprobs) && r.topLogprobs >= 0 &&
        r.topLogprobs <= DEVICE_SAMPLING_MAX_LOGPROBS);
      K = Math.max(K, Math.min(r.topLogprobs, V));
    }
    const n = rowEntries(r, V, entries);
    entStart[i] = entries;
    entCount[i] = n;
    entries += n;
    words += n * SR_ENT_WORDS + (r.mask ? maskWords + (maskWords & 1) : 0);
  }
  const buf = new Int32Array(words);
  const f64 = new Float64Array(buf.buffer); // index = word offset / 2
  const setF64 = (word: number, v: number) => { f64[word >> 1] = v; };
  buf[0] = P;
  buf[1] = V;
  buf[2] = K;
  let scratch = 0;
  let at = SR_HDR + P * SR_ROW_WORDS; // even: SR_HDR and SR_ROW_WORDS are
  for (let i = 0; i < P; i++) {
    const r = rows[i]!;
    const e0 = entStart[i]!, n = entCount[i]!;
    const base = SR_HDR + i * SR_ROW_WORDS;
    const greedy = r.temperature === 0;
    const processed = n > 0 || r.mask !== undefined;
    let flags = 0;
    if (greedy) flags |= SR_F_GREEDY;
    if (r.mask) flags |= SR_F_MASK;
    if (r.topLogprobs !== undefined) flags |= SR_F_LOGPROBS;
    if (r.topP < 1) flags |= SR_F_TOPP;
    if (r.minP > 0) flags |= SR_F_MINP;
    buf[base + SR.FLAGS] = flags;
    buf[base + SR.TOPK] = r.topK > 0 && r.topK < V ? r.topK : 0;
    buf[base + SR.NENT] = n;
    buf[base + SR.NLP] = r.topLogprobs === undefined ? 0 : Math.min(r.topLogprobs, V);
    buf[base + SR.SCRATCH] = processed ? scratch++ : -1;
    setF64(base + SR.TEMP, r.temperature);
    setF64(base + SR.TOPP, r.topP);
    setF64(base + SR.MINP, r.minP);
    setF64(base + SR.U, r.u);
    setF64(base + SR.REP, r.repetitionPenalty);
    setF64(base + SR.FREQ, r.frequencyPenalty);
    setF64(base + SR.PRES, r.presencePenalty);
    buf[base + SR.ENT_OFF] = at;
    for (let j = e0; j < e0 + n; j++) {
      buf[at] = entIds[j]!;
      buf[at + 1] = entCounts[j]!;
      buf[at + 2] = entHas[j]!;
      setF64(at + 4, entBias[j]!);
      at += SR_ENT_WORDS;
    }
    if (r.mask) {
      buf[base + SR.MASK_OFF] = at;
      buf.set(r.mask.length > maskWords ? r.mask.subarray(0, maskWords) : r.mask, at);
      at += maskWords + (maskWords & 1);
    }
  }
  buf[3] = scratch;
  return { words: buf, rows: P, vocab: V, k: K, scratchRows: scratch };
}

/** The inverse of packSampleRows (the reference backend reads the same buffer the device does). */
export function unpackSampleRows(buf: Int32Array): { vocab: number; k: number; rows: DeviceSampleRow[] } {
  const f64 = new Float64Array(buf.buffer, buf.byteOffset, buf.length >> 1);
  const getF64 = (word: number) => f64[word >> 1]!;
  const [P, V, K] = [buf[0]!, buf[1]!, buf[2]!];
  const maskWords = Math.ceil(V / 32);
  const rows: DeviceSampleRow[] = [];
  for (let i = 0; i < P; i++) {
    const base = SR_HDR + i * SR_ROW_WORDS;
    const flags = buf[base + SR.FLAGS]!;
    const n = buf[base + SR.NENT]!;
    const ent = buf[base + SR.ENT_OFF]!;
    const penaltyIds: number[] = [], outputCounts: number[] = [], biasIds: number[] = [], biasValues: number[] = [];
    for (let j = 0; j < n; j++) {
      const e = ent + j * SR_ENT_WORDS;
      if (buf[e + 1]! >= 0) {
        penaltyIds.push(buf[e]!);
        outputCounts.push(buf[e + 1]!);
      }
      if (buf[e + 2]) {
        biasIds.push(buf[e]!);
        biasValues.push(getF64(e + 4));
      }
    }
    const row: DeviceSampleRow = {
      temperature: getF64(base + SR.TEMP),
      topK: buf[base + SR.TOPK]!,
      topP: getF64(base + SR.TOPP),
      minP: getF64(base + SR.MINP),
      u: getF64(base + SR.U),
      repetitionPenalty: getF64(base + SR.REP),
      frequencyPenalty: getF64(base + SR.FREQ),
      presencePenalty: getF64(base + SR.PRES),
    };
    if (penaltyIds.length) {
      row.penaltyIds = Int32Array.from(penaltyIds);
      row.outputCounts = Int32Array.from(outputCounts);
    }
    if (biasIds.length) {
      row.biasIds = Int32Array.from(biasIds);
      row.biasValues = Float64Array.from(biasValues);
    }
    if (flags & SR_F_MASK) {
      const at = buf[base + SR.MASK_OFF]!;
      row.mask = buf.slice(at, at + maskWords);
    }
    if (flags & SR_F_LOGPROBS) row.topLogprobs = buf[base + SR.NLP]!;
    rows.push(row);
  }
  return { vocab: V, k: K, rows };
}

/** One row's result. */
export interface DeviceSample {
  /** the token, or SAMPLE_ERR_MASKED / SAMPLE_ERR_INF */
  tokenId: number;
  /** present when the row asked for logprobs (and a token was chosen) */
  logprob?: number;
  top?: { tokenId: number; logprob: number }[];
}

/** Decodes the i32 [P, 2 + 2K] result of sampleRows (read back from the device). */
export function decodeSampleResults(data: Int32Array, rows: readonly DeviceSampleRow[]): DeviceSample[] {
  const P = rows.length;
  if (P === 0) return [];
  const W = data.length / P;
  if (!Number.isInteger(W) || W < 2 || W % 2 !== 0) throw new RangeError(`sampleRows result has ${data.length} values for ${P} rows`);
  const f = new Float32Array(data.buffer, data.byteOffset, data.length);
  const out: DeviceSample[] = [];
  for (let i = 0; i < P; i++) {
    const o = i * W;
    const s: DeviceSample = { tokenId: data[o]! };
    const k = rows[i]!.topLogprobs;
    if (k !== undefined && s.tokenId >= 0) {
      s.logprob = f[o + 1]!;
      s.top = [];
      for (let j = 0; j < k && 2 + 2 * j < W; j++) {
        const id = data[o + 2 + 2 * j]!;
        if (id < 0) break;
        s.top.push({ tokenId: id, logprob: f[o + 3 + 2 * j]! });
      }
    }
    out.push(s);
  }
  return out;
}
