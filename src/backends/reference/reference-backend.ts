// A plain TypeScript implementation of the Backend interface: slow, obvious, float64 where it
// accumulates. It is the yardstick every native op is tested against, and it lets model graphs
// run anywhere. Ops execute immediately (there is no queue), which the interface allows.

import { openSync, readSync, closeSync } from 'node:fs';
import type {
  Activation, AttentionParams, Backend, DType, MoeRouting, PagedKv, QkNorm, QkvHeads, StepLayout, Tensor, WeightSource,
} from '../../contracts/backend.ts';
import { dtypeBytes, numel } from '../../contracts/backend.ts';
import { decodeHalf, encodeHalf } from '../common/half.ts';
import * as shapes from '../common/op-shapes.ts';
import { checkDtypeRank, FLOATS, type OpChecks } from '../common/op-shapes.ts';
import type { DeviceSampleRow } from '../../contracts/device-sampling.ts';
import { referenceSampleRows } from './sampling.ts';

class RefTensor implements Tensor {
  constructor(
    readonly shape: readonly number[],
    readonly dtype: DType,
    /** f32 values (weights of dtype f16/bf16 are stored decoded, exactly) or i32 */
    readonly data: Float32Array | Int32Array,
  ) {}
}

/**
 * The op rules' checks of a reference tensor (common/op-shapes.ts). Its float tensors all hold f32
 * values (a dtype tag records what a native backend would hold), so every float role takes every
 * float dtype.
 */
const checks: OpChecks<RefTensor> = {
  dtypes: { act: FLOATS, weight: FLOATS, param: FLOATS, kv: FLOATS, logits: FLOATS },
  error: (op, message) => new Error(`reference backend ${op}: ${message}`),
  open() {}, // it has nothing to close
  arg(op, name, t, dtypes, rank) {
    if (!(t instanceof RefTensor)) throw checks.error(op, `${name} is not a reference backend tensor`);
    checkDtypeRank(checks, op, name, t, dtypes, rank);
    return t;
  },
};

function asRef(t: Tensor): RefTensor {
  if (!(t instanceof RefTensor)) throw new Error('reference backend: foreign tensor');
  return t;
}
function f(t: Tensor): Float32Array {
  const d = asRef(t).data;
  if (!(d instanceof Float32Array)) throw new Error('reference backend: expected a float tensor');
  return d;
}
function i(t: Tensor): Int32Array {
  const d = asRef(t).data;
  if (!(d instanceof Int32Array)) throw new Error('reference backend: expected an i32 tensor');
  return d;
}

function activate(x: number, act: Activation): number {
  switch (act) {
    case 'silu': return x / (1 + Math.exp(-x));
    case 'gelu_tanh': return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x)));
    case 'gelu': return 0.5 * x * (1 + erf(x / Math.SQRT2));
  }
}

/** erf to ~1e-15 (Numerical Recipes erfc Chebyshev fit). */
export function erf(x: number): number {
  const z = Math.abs(x);
  const t = 2 / (2 + z);
  const ty = 4 * t - 2;
  const cof = [-1.3026537197817094, 6.4196979235649026e-1, 1.9476473204185836e-2, -9.561514786808631e-3,
    -9.46595344482036e-4, 3.66839497852761e-4, 4.2523324806907e-5, -2.0278578112534e-5, -1.624290004647e-6,
    1.30365583558e-6, 1.5626441722e-8, -8.5238095915e-8, 6.529054439e-9, 5.059343495e-9, -9.91364156e-10,
    -2.27365122e-10, 9.6467911e-11, 2.394038e-12, -6.886027e-12, 8.94487e-13, 3.13092e-13, -1.12708e-13,
    3.81e-16, 7.106e-15, -1.523e-15, -9.4e-17, 1.21e-16, -2.8e-17];
  let d = 0, dd = 0;
  for (let j = cof.length - 1; j > 0; j--) {
    const tmp = d;
    d = ty * d - dd + cof[j];
    dd = tmp;
  }
  const erfc = t * Math.exp(-z * z + 0.5 * (cof[0] + ty * d) - dd);
  return x >= 0 ? 1 - erfc : erfc - 1;
}

/** Elements per block (dim 0 entry) of `pool`, after checking every block index. */
function blockElems(op: string, pool: Tensor, blocks: readonly number[]): number {
  if (pool.shape.length === 0) throw new Error(`${op}: the pool must have at least one dimension`);
  const nb = pool.shape[0];
  for (const b of blocks) if (!Number.isInteger(b) || b < 0 || b >= nb) throw new Error(`${op}: block ${b} outside [0, ${nb})`);
  return numel(pool.shape.slice(1));
}

/** Decodes little-endian raw bytes of the given dtype into f32 (exactly). */
function decodeToF32(bytes: Uint8Array, dtype: 'f32' | 'f16' | 'bf16'): Float32Array {
  const copy = bytes.slice(); // aligned for the typed-array views below
  if (dtype === 'f32') return new Float32Array(copy.buffer, 0, copy.byteLength / 4);
  return decodeHalf(new Uint16Array(copy.buffer, 0, copy.byteLength / 2), dtype);
}

export class ReferenceBackend implements Backend {
  readonly name = 'reference' as const;
  readonly activationDtype: DType = 'f32';
  private scopes: RefTensor[][] = [];

  private make(shape: readonly number[], dtype: DType, data: Float32Array | Int32Array): RefTensor {
    const t = new RefTensor([...shape], dtype, data);
    this.scopes[this.scopes.length - 1]?.push(t);
    return t;
  }
  private floats(shape: readonly number[]): RefTensor {
    return this.make(shape, 'f32', new Float32Array(numel(shape)));
  }

  // ---- memory ----
  upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor {
    return this.make(shape, shapes.upload(checks, data, shape), data.slice());
  }
  async loadWeight(src: WeightSource, as: 'keep' | 'f32'): Promise<Tensor> {
    return this.loadWeightRows(src, 0, src.shape[0] ?? 1, as);
  }
  async loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    const rowElems = numel(src.shape.slice(1));
    const esz = dtypeBytes[src.dtype];
    let bytes = new Uint8Array(rows * rowElems * esz);
    if (src.decode) {
      bytes = src.decode(src.dtype).slice(rowStart * rowElems * esz, (rowStart + rows) * rowElems * esz);
      if (bytes.length !== rows * rowElems * esz) throw new Error(`${src.path}: tensor ${src.name} decoded to too few bytes`);
    } else {
      const fd = openSync(src.path, 'r');
      try {
        const got = readSync(fd, bytes, 0, bytes.length, src.offset + rowStart * rowElems * esz);
        if (got !== bytes.length) throw new Error(`${src.path}: tensor ${src.name} is truncated`);
      } finally {
        closeSync(fd);
      }
    }
    const shape = src.shape.length ? [rows, ...src.shape.slice(1)] : [];
    // Values are stored decoded; the dtype tag records what the weight was.
    return new RefTensor(shape, as === 'keep' ? src.dtype : 'f32', decodeToF32(bytes, src.dtype));
  }
  async loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    const parts = await Promise.all(srcs.map((s) => this.loadWeight(s, as)));
    const per = numel(parts[0].shape);
    const out = new Float32Array(per * parts.length);
    parts.forEach((p, k) => out.set(f(p), k * per));
    return new RefTensor([parts.length, ...parts[0].shape], parts[0].dtype, out);
  }
  zeros(shape: readonly number[], dtype: DType): Tensor {
    shapes.zeros(checks, shape, dtype);
    const n = numel(shape);
    return new RefTensor([...shape], dtype, dtype === 'i32' ? new Int32Array(n) : new Float32Array(n));
  }
  reshape(t: Tensor, shape: readonly number[]): Tensor {
    const x = shapes.reshape(checks, t, shape);
    return new RefTensor([...shape], x.dtype, x.data);
  }
  async read(t: Tensor): Promise<Float32Array | Int32Array> {
    return asRef(t).data.slice();
  }
  async readBlocks(pool: Tensor, blocks: readonly number[]): Promise<Uint8Array> {
    const per = blockElems('readBlocks', pool, blocks);
    const src = asRef(pool).data;
    const vals = src instanceof Int32Array ? new Int32Array(blocks.length * per) : new Float32Array(blocks.length * per);
    blocks.forEach((b, k) => vals.set(src.subarray(b * per, (b + 1) * per), k * per));
    if (pool.dtype === 'f16' || pool.dtype === 'bf16') return new Uint8Array(encodeHalf(vals, pool.dtype).buffer);
    return new Uint8Array(vals.buffer);
  }
  writeBlocks(pool: Tensor, blocks: readonly number[], data: Uint8Array): void {
    const per = blockElems('writeBlocks', pool, blocks);
    if (new Set(blocks).size !== blocks.length) throw new Error('writeBlocks: blocks must be distinct');
    const esz = dtypeBytes[pool.dtype];
    if (data.byteLength !== blocks.length * per * esz)
      throw new Error(`writeBlocks: ${data.byteLength} bytes for ${blocks.length} blocks of ${per * esz} bytes`);
    const copy = data.slice(); // aligned for the typed views
    const dst = asRef(pool).data;
    const vals: Float32Array | Int32Array = pool.dtype === 'f16' || pool.dtype === 'bf16'
      ? decodeHalf(new Uint16Array(copy.buffer), pool.dtype)
      : pool.dtype === 'i32' ? new Int32Array(copy.buffer) : new Float32Array(copy.buffer);
    blocks.forEach((b, k) => dst.set(vals.subarray(k * per, (k + 1) * per), b * per));
  }
  copyTensor(t: Tensor, src: Tensor): void {
    const { t: x, src: s } = shapes.copyTensor(checks, t, src);
    x.data.set(s.data);
  }
  free(_t: Tensor): void {}
  async sync(): Promise<void> {}
  async close(): Promise<void> {}
  beginScope(): void {
    this.scopes.push([]);
  }
  endScope(keep: readonly Tensor[] = []): void {
    const scope = this.scopes.pop();
    if (!scope) throw new Error('endScope without beginScope');
    const parent = this.scopes[this.scopes.length - 1];
    for (const t of scope) if (keep.includes(t)) parent?.push(t);
  }

  // ---- ops ----
  embedding(table: Tensor, ids: Tensor, scale: number): Tensor {
    const { V, D } = shapes.embedding(checks, table, ids, scale);
    const idv = i(ids), tab = f(table);
    const out = this.floats([idv.length, D]);
    idv.forEach((id, t) => {
      if (id < 0 || id >= V) throw new Error(`embedding: token id ${id} out of range [0, ${V})`);
      for (let d = 0; d < D; d++) out.data[t * D + d] = tab[id * D + d] * scale;
    });
    return out;
  }
  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor {
    const { M, N, K } = shapes.matmul(checks, x, w, bias);
    const xv = f(x), wv = f(w), bv = bias ? f(bias) : undefined;
    const out = this.floats([M, N]);
    for (let m = 0; m < M; m++)
      for (let n = 0; n < N; n++) {
        let s = 0;
        for (let k = 0; k < K; k++) s += xv[m * K + k] * wv[n * K + k];
        out.data[m * N + n] = s + (bv ? bv[n] : 0);
      }
    return out;
  }
  rmsnorm(x: Tensor, w: Tensor, eps: number, weightOffset: number): Tensor {
    const { D } = shapes.rmsnorm(checks, x, w, eps, weightOffset);
    const xv = f(x), wv = f(w);
    const out = this.floats(x.shape);
    for (let r = 0; r < xv.length / D; r++) {
      let ss = 0;
      for (let d = 0; d < D; d++) ss += xv[r * D + d] ** 2;
      const inv = 1 / Math.sqrt(ss / D + eps);
      for (let d = 0; d < D; d++) out.data[r * D + d] = xv[r * D + d] * inv * (weightOffset + wv[d]);
    }
    return out;
  }
  add(a: Tensor, b: Tensor, bScale: number): Tensor {
    shapes.add(checks, a, b, bScale);
    const av = f(a), bv = f(b);
    const out = this.floats(a.shape);
    for (let k = 0; k < av.length; k++) out.data[k] = av[k] + bScale * bv[k];
    return out;
  }
  scale(x: Tensor, s: number): Tensor {
    shapes.scale(checks, x, s);
    const out = this.floats(x.shape);
    f(x).forEach((v, k) => (out.data[k] = v * s));
    return out;
  }
  glu(gate: Tensor, up: Tensor, act: Activation): Tensor {
    shapes.glu(checks, gate, up, act);
    const gv = f(gate), uv = f(up);
    const out = this.floats(gate.shape);
    for (let k = 0; k < gv.length; k++) out.data[k] = activate(gv[k], act) * uv[k];
    return out;
  }
  rope(x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number): Tensor {
    const { T, H, D: hd, half, perToken } = shapes.rope(checks, x, pos, invFreq, attentionScaling);
    const xv = f(x), pv = i(pos), fv = f(invFreq);
    const out = this.floats(x.shape);
    out.data.set(xv);
    for (let t = 0; t < T; t++)
      for (let j = 0; j < half; j++) {
        // PyTorch computes the angle as an f32 product, then cos/sin in f32.
        const ang = Math.fround(Math.fround(pv[t]) * fv[(perToken ? t * half : 0) + j]);
        const c = Math.fround(Math.cos(ang)) * attentionScaling, s = Math.fround(Math.sin(ang)) * attentionScaling;
        for (let h = 0; h < H; h++) {
          const base = (t * H + h) * hd;
          const a = xv[base + j], b = xv[base + j + half];
          out.data[base + j] = a * c - b * s;
          out.data[base + j + half] = b * c + a * s;
        }
      }
    return out;
  }
  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void {
    const { T, KVH: Hk, D: hd } = shapes.writeKv(checks, kv, k, v, layout);
    const slots = i(layout.slots), kc = f(kv.k), vc = f(kv.v), kv_ = f(k), vv = f(v);
    const per = Hk * hd;
    for (let t = 0; t < T; t++) {
      if (slots[t] < 0) continue;
      kc.set(kv_.subarray(t * per, (t + 1) * per), slots[t] * per);
      vc.set(vv.subarray(t * per, (t + 1) * per), slots[t] * per);
    }
  }
  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor {
    const { T, H, D: hd, BS: bs, KVH: Hk, MBR: maxBlocks } = shapes.attention(checks, q, kv, layout, params);
    const group = H / Hk;
    const qv = f(q), kc = f(kv.k), vc = f(kv.v);
    const rows = i(layout.tokenRow), poss = i(layout.tokenPos), tables = i(layout.blockTables);
    if (layout.oneTokenPerRow && new Set(rows.subarray(0, T)).size !== T) {
      // the oracle checks the promise a device backend acts on unchecked
      throw new Error(`attention: the layout promises one token a row, but tokenRow is [${[...rows.subarray(0, T)].join(', ')}]`);
    }
    const out = this.floats(q.shape);
    for (let t = 0; t < T; t++) {
      const r = rows[t], p = poss[t];
      const start = params.window > 0 ? Math.max(0, p - params.window + 1) : 0;
      for (let h = 0; h < H; h++) {
        const kh = Math.floor(h / group);
        const scores: number[] = [];
        const slotsOf: number[] = [];
        for (let j = start; j <= p; j++) {
          const block = tables[r * maxBlocks + Math.floor(j / bs)];
          if (block < 0) throw new Error(`attention: row ${r} holds no block for position ${j}`);
          const slot = block * bs + (j % bs);
          let s = 0;
          for (let d = 0; d < hd; d++) s += qv[(t * H + h) * hd + d] * kc[(slot * Hk + kh) * hd + d];
          s *= params.scale;
          if (params.softcap > 0) s = params.softcap * Math.tanh(s / params.softcap);
          scores.push(s);
          slotsOf.push(slot);
        }
        if (scores.length === 0) continue; // no key (a padding token at position -1): zeros
        const mx = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - mx));
        const z = e.reduce((a, b) => a + b, 0);
        for (let d = 0; d < hd; d++) {
          let acc = 0;
          for (let n = 0; n < e.length; n++) acc += e[n] * vc[(slotsOf[n] * Hk + kh) * hd + d];
          out.data[(t * H + h) * hd + d] = acc / z;
        }
      }
    }
    return out;
  }
  softcap(x: Tensor, cap: number): Tensor {
    shapes.softcap(checks, x, cap);
    const out = this.floats(x.shape);
    f(x).forEach((v, k) => (out.data[k] = cap * Math.tanh(v / cap)));
    return out;
  }
  gatherRows(x: Tensor, idx: Tensor): Tensor {
    const { D } = shapes.gatherRows(checks, x, idx);
    const xv = asRef(x).data, iv = i(idx);
    // rows of any dtype (i32 ids too: a step's input ids gathered from the previous step's picks)
    const out = xv instanceof Int32Array ? this.make([iv.length, D], 'i32', new Int32Array(iv.length * D)) : this.floats([iv.length, D]);
    iv.forEach((r, k) => out.data.set(xv.subarray(r * D, (r + 1) * D), k * D));
    return out;
  }
  moeRoute(logits: Tensor, topK: number, renormalize: boolean): MoeRouting {
    const { T, E } = shapes.moeRoute(checks, logits, topK);
    const lv = f(logits);
    const weights = this.floats([T, topK]);
    const experts = this.make([T, topK], 'i32', new Int32Array(T * topK));
    for (let t = 0; t < T; t++) {
      const row = Array.from(lv.subarray(t * E, (t + 1) * E));
      const mx = Math.max(...row);
      const e = row.map((v) => Math.exp(v - mx));
      const z = e.reduce((a, b) => a + b, 0);
      const p = e.map((v) => v / z);
      const order = p.map((v, k) => k).sort((a, b) => p[b] - p[a] || a - b).slice(0, topK);
      const sum = order.reduce((a, k) => a + p[k], 0);
      order.forEach((ex, k) => {
        experts.data[t * topK + k] = ex;
        weights.data[t * topK + k] = renormalize ? p[ex] / sum : p[ex];
      });
    }
    return { weights, experts };
  }
  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor {
    const { T, D, I, K: topK } = shapes.moeFfn(checks, x, routing, gate, up, down, act);
    const xv = f(x), gv = f(gate), uv = f(up), dv = f(down), wv = f(routing.weights), ev = i(routing.experts);
    const out = this.floats([T, D]);
    const hidden = new Float64Array(I);
    for (let t = 0; t < T; t++)
      for (let k = 0; k < topK; k++) {
        const e = ev[t * topK + k], w = wv[t * topK + k];
        for (let n = 0; n < I; n++) {
          let g = 0, u = 0;
          for (let d = 0; d < D; d++) {
            g += gv[(e * I + n) * D + d] * xv[t * D + d];
            u += uv[(e * I + n) * D + d] * xv[t * D + d];
          }
          hidden[n] = activate(g, act) * u;
        }
        for (let d = 0; d < D; d++) {
          let s = 0;
          for (let n = 0; n < I; n++) s += dv[(e * D + d) * I + n] * hidden[n];
          out.data[t * D + d] += w * s;
        }
      }
    return out;
  }

  argmax(x: Tensor): Tensor {
    const { R, V } = shapes.argmax(checks, x);
    const xv = f(x);
    const out = this.make([R], 'i32', new Int32Array(R));
    for (let r = 0; r < R; r++) {
      let best = -1, bv = -Infinity;
      for (let k = 0; k < V; k++) if (xv[r * V + k] > bv) { bv = xv[r * V + k]; best = k; }
      out.data[r] = best;
    }
    return out;
  }

  sampleRows(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor {
    const { P, V } = shapes.sampleRows(checks, logits, rows);
    const { data, width } = referenceSampleRows(f(logits), V, rows);
    return this.make([P, width], 'i32', data);
  }

  // ---- packed weights and fused ops: the plain ops composed ----
  async loadConcat(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    const parts = await Promise.all(srcs.map((src) => this.loadWeight(src, as)));
    const tail = parts[0].shape.slice(1);
    for (const p of parts)
      if (p.shape.length !== parts[0].shape.length || p.shape.slice(1).some((d, k) => d !== tail[k]))
        throw new Error(`loadConcat: [${p.shape}] does not match [${parts[0].shape}] past dim 0`);
    const out = new Float32Array(parts.reduce((a, p) => a + numel(p.shape), 0));
    let off = 0;
    for (const p of parts) {
      out.set(f(p), off);
      off += numel(p.shape);
    }
    return new RefTensor([parts.reduce((a, p) => a + p.shape[0], 0), ...tail], parts[0].dtype, out);
  }
  rowView(t: Tensor, start: number, rows: number): Tensor {
    const total = t.shape[0];
    if (!Number.isInteger(start) || !Number.isInteger(rows) || start < 0 || rows < 0 || start + rows > total)
      throw new Error(`rowView: rows [${start}, ${start + rows}) outside [0, ${total})`);
    const per = numel(t.shape.slice(1));
    return new RefTensor([rows, ...t.shape.slice(1)], t.dtype, asRef(t).data.subarray(start * per, (start + rows) * per));
  }
  addRmsnorm(x: Tensor, r: Tensor, rScale: number, w: Tensor, eps: number, weightOffset: number): { sum: Tensor; normed: Tensor } {
    const sum = this.add(x, r, rScale);
    return { sum, normed: this.rmsnorm(sum, w, eps, weightOffset) };
  }
  /** matmul(gluPacked(gu, act), w, bias): the reference of the op a backend may fuse */
  gluMatmul(gu: Tensor, act: Activation, w: Tensor, bias?: Tensor): Tensor {
    return this.matmul(this.gluPacked(gu, act), w, bias);
  }
  /** addRmsnorm, then matmul(normed, w, bias): the reference of the op a backend may fuse */
  addRmsnormMatmul(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, w: Tensor,
    bias?: Tensor): { sum: Tensor; y: Tensor } {
    const { sum, normed } = this.addRmsnorm(x, r, rScale, normW, eps, weightOffset);
    return { sum, y: this.matmul(normed, w, bias) };
  }
  /** addRmsnormMatmul, then gluPacked: the reference of the op a backend may fuse */
  addRmsnormGateUpGlu(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number,
    gateUp: Tensor, act: Activation): { sum: Tensor; y: Tensor } {
    const { sum, y } = this.addRmsnormMatmul(x, r, rScale, normW, eps, weightOffset, gateUp);
    return { sum, y: this.gluPacked(y, act) };
  }
  /** addRmsnormMatmul, then ropeQkvWriteKv without qk-norm: the reference of the op a backend may fuse */
  addRmsnormQkvRope(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, qkv: Tensor,
    heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number, kv: PagedKv, layout: StepLayout): { sum: Tensor; q: Tensor } {
    const { sum, y } = this.addRmsnormMatmul(x, r, rScale, normW, eps, weightOffset, qkv);
    return { sum, q: this.ropeQkvWriteKv(y, heads, pos, invFreq, attentionScaling, undefined, kv, layout) };
  }
  gluPacked(gu: Tensor, act: Activation): Tensor {
    const [T, I2] = gu.shape;
    const I = I2 / 2;
    const g = this.floats([T, I]), u = this.floats([T, I]);
    const v = f(gu);
    for (let t = 0; t < T; t++) {
      g.data.set(v.subarray(t * I2, t * I2 + I), t * I);
      u.data.set(v.subarray(t * I2 + I, (t + 1) * I2), t * I);
    }
    return this.glu(g, u, act);
  }
  ropeQkvWriteKv(qkv: Tensor, heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number,
    qkNorm: QkNorm | undefined, kv: PagedKv, layout: StepLayout): Tensor {
    const { heads: H, kvHeads: Hk, headDim: D } = heads;
    const T = qkv.shape[0];
    const W = (H + 2 * Hk) * D;
    if (qkv.shape[1] !== W) throw new Error(`ropeQkvWriteKv: qkv [${qkv.shape}] is not [T, ${W}]`);
    const v = f(qkv);
    const part = (from: number, n: number) => {
      const out = this.floats([T, n, D]);
      for (let t = 0; t < T; t++) out.data.set(v.subarray(t * W + from * D, t * W + (from + n) * D), t * n * D);
      return out;
    };
    let q: Tensor = part(0, H), k: Tensor = part(H, Hk);
    if (qkNorm) {
      q = this.rmsnorm(q, qkNorm.q, qkNorm.eps, qkNorm.weightOffset);
      k = this.rmsnorm(k, qkNorm.k, qkNorm.eps, qkNorm.weightOffset);
    }
    q = this.rope(q, pos, invFreq, attentionScaling);
    k = this.rope(k, pos, invFreq, attentionScaling);
    this.writeKv(kv, k, part(H + Hk, Hk), layout);
    return q;
  }
}
