// A line-by-line TypeScript model of k_sample_rows (src/backends/cuda/sampling-kernels.ts), so
// the kernel's algorithm (radix selects over key digits, the lane scans of warp 0, the ordered
// chunk scans, the fixed-point draw) is checked against the host sampler in CPU CI, where no GPU
// runs it. Block-wide passes become loops over the SR_THREADS "threads"; warp 0's lane logic
// keeps its 32 lanes. f32 maths is Math.fround; expf is Math.exp rounded to f32 (the device's
// expf is within 2 ulp of it). Masses are Numbers: exact while V * 2^40 < 2^53 (V <= 8192).
import {
  type DeviceSampleRow, packSampleRows, SR, SR_ENT_WORDS, SR_F_GREEDY, SR_F_LOGPROBS, SR_F_MASK, SR_F_MINP, SR_F_TOPP,
  SR_HDR, SR_ROW_WORDS,
} from '../../src/contracts/device-sampling.ts';
import { SAMPLE_THREADS } from '../../src/backends/cuda/sampling-kernels.ts';

const T = SAMPLE_THREADS;
const Q_SCALE = 2 ** 40;
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const fr = Math.fround;

function srLd(x: Float32Array, i: number): number {
  const v = x[i]!;
  if (v !== v) return -Infinity;
  return v === 0 ? 0 : v;
}
function srKey(v: number): number {
  f32[0] = v;
  const b = u32[0]!;
  return (b & 0x80000000 ? ~b : b | 0x80000000) >>> 0;
}
function srW(x: number, xmax: number, invT: number): number {
  return fr(Math.exp(fr((x - xmax) * invT)));
}
function srQ(x: number, xmax: number, invT: number): number {
  return Math.ceil(fr(srW(x, xmax, invT) * Q_SCALE));
}
function chunk(V: number, t: number): [number, number] {
  const C = Math.ceil(V / T);
  const c0 = Math.min(V, t * C);
  return [c0, Math.min(V, c0 + C)];
}
/** exclusive scan over the threads' values */
function scan(vals: number[]): { pre: number[]; total: number } {
  const pre: number[] = [];
  let s = 0;
  for (const v of vals) {
    pre.push(s);
    s += v;
  }
  return { pre, total: s };
}

function selectCount(x: Float32Array, V: number, k: number): { key: number; above: number; ties: number } {
  let prefix = 0, pmask = 0, ab = 0, tc = 0;
  for (let shift = 24; shift >= 0; shift -= 8) {
    const hist = new Array<number>(256).fill(0);
    for (let i = 0; i < V; i++) {
      const key = srKey(srLd(x, i));
      if (((key & pmask) >>> 0) === prefix) hist[(key >>> shift) & 255]!++;
    }
    // warp 0: lane l holds bins 255 - 8l .. 248 - 8l
    const s: number[] = [], c: number[][] = [];
    for (let lane = 0; lane < 32; lane++) {
      c.push(Array.from({ length: 8 }, (_, j) => hist[255 - 8 * lane - j]!));
      s.push(c[lane]!.reduce((a, b) => a + b, 0));
    }
    const incl: number[] = [];
    s.reduce((a, v, l) => (incl[l] = a + v), 0);
    const L = incl.findIndex((v) => ab + v >= k); // __ffs of the ballot
    if (L < 0) throw new Error('selectCount: no lane (bad k)');
    let run = ab + incl[L]! - s[L]!;
    let sel = -1, nab = 0, ntc = 0;
    for (let j = 0; j < 8; j++) {
      if (run + c[L]![j]! >= k) {
        sel = 255 - 8 * L - j;
        nab = run;
        ntc = c[L]![j]!;
        break;
      }
      run += c[L]![j]!;
    }
    prefix = (prefix | (sel << shift)) >>> 0;
    pmask = (pmask | (255 << shift)) >>> 0;
    ab = nab;
    tc = ntc;
  }
  return { key: prefix, above: ab, ties: tc };
}

function selectMass(x: Float32Array, V: number, lo: number, xmax: number, invT: number, topP: number):
  { key: number; above: number; ties: number; target: number } {
  let prefix = 0, pmask = 0, ab = 0, tc = 0, target = 0;
  for (let shift = 24; shift >= 0; shift -= 8) {
    const hist = new Array<number>(256).fill(0);
    const mass = new Array<number>(256).fill(0);
    for (let i = 0; i < V; i++) {
      const v = srLd(x, i);
      const key = srKey(v);
      if (key >= lo && ((key & pmask) >>> 0) === prefix) {
        const d = (key >>> shift) & 255;
        hist[d]!++;
        mass[d]! += srQ(v, xmax, invT);
      }
    }
    const ms: number[][] = [], cs: number[][] = [], s: number[] = [];
    for (let lane = 0; lane < 32; lane++) {
      ms.push(Array.from({ length: 8 }, (_, j) => mass[255 - 8 * lane - j]!));
      cs.push(Array.from({ length: 8 }, (_, j) => hist[255 - 8 * lane - j]!));
      s.push(ms[lane]!.reduce((a, b) => a + b, 0));
    }
    const incl: number[] = [];
    s.reduce((a, v, l) => (incl[l] = a + v), 0);
    if (shift === 24) target = topP * incl[31]!;
    let best: { sel: number; ties: number; above: number } | undefined;
    for (let lane = 0; lane < 32; lane++) { // the highest lane with a candidate wins
      let run = ab + incl[lane]! - s[lane]!;
      let cand: typeof best;
      for (let j = 0; j < 8; j++) {
        if (run < target && cs[lane]![j]! > 0) cand = { sel: 255 - 8 * lane - j, ties: cs[lane]![j]!, above: run };
        run += ms[lane]![j]!;
      }
      if (cand) best = cand;
    }
    if (!best) throw new Error('selectMass: no candidate bin');
    prefix = (prefix | (best.sel << shift)) >>> 0;
    pmask = (pmask | (255 << shift)) >>> 0;
    tc = best.ties;
    ab = best.above;
  }
  return { key: prefix, above: ab, ties: tc, target };
}

interface Row {
  x: Float32Array;
  V: number;
  xmax: number;
  invT: number;
  kthKey: number;
  topp: boolean;
  cKey: number;
  cutId: number;
  minp: boolean;
  minP: number;
}

function finalQ(R: Row, i: number): number {
  const v = srLd(R.x, i);
  const key = srKey(v);
  if (key < R.kthKey) return 0;
  if (R.topp && (key < R.cKey || (key === R.cKey && i >= R.cutId))) return 0;
  const w = srW(v, R.xmax, R.invT);
  if (R.minp && !(w >= R.minP)) return 0;
  return Math.ceil(fr(w * Q_SCALE));
}

function tieCut(R: Row, above: number, target: number): number {
  const sums: number[] = [];
  for (let t = 0; t < T; t++) {
    const [c0, c1] = chunk(R.V, t);
    let s = 0;
    for (let i = c0; i < c1; i++) {
      const v = srLd(R.x, i);
      if (srKey(v) === R.cKey) s += srQ(v, R.xmax, R.invT);
    }
    sums.push(s);
  }
  const { pre } = scan(sums);
  let cut = R.V;
  for (let t = 0; t < T; t++) {
    const [c0, c1] = chunk(R.V, t);
    let run = above + pre[t]!;
    for (let i = c0; i < c1; i++) {
      const v = srLd(R.x, i);
      if (srKey(v) !== R.cKey) continue;
      if (run >= target) {
        cut = Math.min(cut, i);
        break;
      }
      run += srQ(v, R.xmax, R.invT);
    }
  }
  return cut;
}

function draw(R: Row, u: number): number {
  const sums: number[] = [];
  let lastPos = -1;
  for (let t = 0; t < T; t++) {
    const [c0, c1] = chunk(R.V, t);
    let s = 0;
    for (let i = c0; i < c1; i++) {
      const q = finalQ(R, i);
      if (q !== 0) {
        s += q;
        lastPos = Math.max(lastPos, i);
      }
    }
    sums.push(s);
  }
  const { pre, total: Z } = scan(sums);
  const r = u * Z;
  let tok = -1;
  let owners = 0;
  for (let t = 0; t < T; t++) {
    if (!(pre[t]! <= r && pre[t]! + sums[t]! > r)) continue;
    owners++;
    const [c0, c1] = chunk(R.V, t);
    let cum = pre[t]!;
    for (let i = c0; i < c1; i++) {
      const q = finalQ(R, i);
      if (q === 0) continue;
      cum += q;
      if (cum > r) {
        tok = i;
        break;
      }
    }
  }
  if (owners > 1) throw new Error('draw: more than one thread owns the crossing');
  return tok >= 0 ? tok : lastPos;
}

function collect(x: Float32Array, V: number, kk: number, above: number, K: number): number[] {
  const list = new Array<number>(K).fill(-1);
  const counts: number[] = [];
  for (let t = 0; t < T; t++) {
    const [c0, c1] = chunk(V, t);
    let n = 0;
    for (let i = c0; i < c1; i++) n += srKey(srLd(x, i)) === kk ? 1 : 0;
    counts.push(n);
  }
  const { pre } = scan(counts);
  let n = 0;
  const need = K - above;
  for (let t = 0; t < T; t++) {
    const [c0, c1] = chunk(V, t);
    let rank = pre[t]!;
    for (let i = c0; i < c1; i++) {
      const key = srKey(srLd(x, i));
      if (key > kk) list[n++] = i;
      else if (key === kk) {
        if (rank < need) list[above + rank] = i;
        rank++;
      }
    }
  }
  if (n !== above) throw new Error(`collect: ${n} ids above the k-th, radix select said ${above}`);
  return list;
}

const f64At = (w: Int32Array, at: number) => new Float64Array(w.buffer, w.byteOffset + at * 4, 1)[0]!;

/** k_sample_rows on logits [P, V] -> the i32 [P, 2 + 2K] result (logprobs as f32 bits). */
export function modelSampleRows(logits: Float32Array, V: number, rows: readonly DeviceSampleRow[]): Int32Array {
  const pk = packSampleRows(rows, V);
  const w = pk.words;
  const OW = 2 + 2 * pk.k;
  const P = rows.length;
  const out = new Int32Array(P * OW);
  const outF = new Float32Array(out.buffer);
  for (let r = 0; r < P; r++) {
    const row = SR_HDR + r * SR_ROW_WORDS;
    const flags = w[row + SR.FLAGS]!;
    const raw = logits.subarray(r * V, (r + 1) * V);
    let x: Float32Array = raw;
    if (w[row + SR.SCRATCH]! >= 0) {
      const maskAt = flags & SR_F_MASK ? w[row + SR.MASK_OFF]! : -1;
      const allowed = (i: number) => maskAt < 0 || ((w[maskAt + (i >> 5)]! >>> (i & 31)) & 1) === 1;
      const s = new Float32Array(V);
      for (let i = 0; i < V; i++) s[i] = allowed(i) ? srLd(raw, i) : -Infinity;
      const ne = w[row + SR.NENT]!, ent = w[row + SR.ENT_OFF]!;
      const rep = f64At(w, row + SR.REP), fq = f64At(w, row + SR.FREQ), pr = f64At(w, row + SR.PRES);
      for (let e = 0; e < ne; e++) {
        const en = ent + e * SR_ENT_WORDS;
        const id = w[en]!, cnt = w[en + 1]!;
        if (id < 0 || id >= V || !allowed(id)) continue;
        let v = s[id]!;
        if (w[en + 2]) v = fr(v + f64At(w, en + 4));
        if (cnt >= 0 && rep !== 1) v = fr(v > 0 ? v / rep : v * rep);
        if (cnt > 0 && (fq !== 0 || pr !== 0)) v = fr(v - fq * cnt - pr);
        s[id] = v;
      }
      x = s;
    }
    let best = -Infinity, bi = -1;
    for (let i = 0; i < V; i++) {
      const v = srLd(x, i);
      if (v > best) {
        best = v;
        bi = i;
      }
    }
    let token: number;
    if (flags & SR_F_GREEDY) token = bi;
    else if (bi < 0) token = -1;
    else if (best === Infinity) token = -2;
    else {
      const R: Row = {
        x, V, xmax: best, invT: 1 / f64At(w, row + SR.TEMP), kthKey: 0, topp: (flags & SR_F_TOPP) !== 0, cKey: 0, cutId: V,
        minp: (flags & SR_F_MINP) !== 0, minP: f64At(w, row + SR.MINP),
      };
      const topK = w[row + SR.TOPK]!;
      if (topK > 0) R.kthKey = selectCount(x, V, topK).key;
      if (R.topp) {
        const m = selectMass(x, V, R.kthKey, R.xmax, R.invT, f64At(w, row + SR.TOPP));
        R.cKey = m.key;
        if (m.ties > 1) R.cutId = tieCut(R, m.above, m.target);
      }
      token = draw(R, f64At(w, row + SR.U));
    }
    const o = r * OW;
    out[o] = token;
    outF[o + 1] = NaN;
    for (let j = 0; 2 + 2 * j < OW; j++) {
      out[o + 2 + 2 * j] = -1;
      outF[o + 3 + 2 * j] = NaN;
    }
    if (!(flags & SR_F_LOGPROBS) || token < 0) continue;
    let m = -Infinity;
    for (let i = 0; i < V; i++) m = Math.max(m, srLd(raw, i));
    let sum = 0;
    if (Number.isFinite(m)) for (let i = 0; i < V; i++) sum += Math.exp(srLd(raw, i) - m);
    const lse = Number.isFinite(m) ? m + Math.log(sum) : m;
    outF[o + 1] = srLd(raw, token) - lse;
    const nlp = w[row + SR.NLP]!;
    if (nlp === 0) continue;
    const sel = selectCount(raw, V, nlp);
    const list = collect(raw, V, sel.key, sel.above, nlp);
    list.sort((a, b) => srLd(raw, b) - srLd(raw, a) || a - b);
    list.forEach((id, j) => {
      out[o + 2 + 2 * j] = id;
      outF[o + 3 + 2 * j] = srLd(raw, id) - lse;
    });
  }
  return out;
}
