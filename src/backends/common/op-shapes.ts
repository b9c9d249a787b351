// Each op's argument rules, in one place for every backend (CPU, CUDA, reference, dry run): the
// role of each tensor argument (which picks its dtypes from the backend's own sets), its rank, how
// the arguments' dimensions must agree, the scalars that must be finite, and the message a bad
// call throws. A backend calls its op's rule first and does only its own work with what the rule
// returns (the checked tensors in its own tensor class and the dimensions), so a call that breaks
// a rule throws before anything is enqueued, with the same message on every backend but for the
// backend's name.
//
// A backend plugs in through OpChecks: whether it can take an op now (open), its check of one
// tensor (its tensor class, instance, liveness; the dtype and rank part is checkDtypeRank below)
// and its dtype set per role. A rule checks in that order: open, then each argument, then how
// they agree. What only one backend can take (a kernel's head-dim limit, a grid's size) stays in
// that backend, after the rule.
import type { Activation, AttentionParams, DType, MoeRouting, PagedKv, StepLayout, Tensor } from '../../contracts/backend.ts';
import { isRowScaled, numel } from '../../contracts/backend.ts';

export const F32: readonly DType[] = ['f32'];
export const I32: readonly DType[] = ['i32'];
export const FLOATS: readonly DType[] = ['f32', 'f16', 'bf16'];
export const ANY: readonly DType[] = ['f32', 'f16', 'bf16', 'i32'];
/** ANY and the row-scaled KV pool dtypes: what free and the KV block copies take */
export const ANY_STORED: readonly DType[] = [...ANY, 'int8', 'fp8'];
/** the activations every backend implements (contracts/backend.ts Activation) */
const ACTIVATIONS: readonly string[] = ['silu', 'gelu_tanh', 'gelu'] satisfies readonly Activation[];

/** The dtypes a backend takes per role of a float argument (index arguments are always i32). */
export interface OpDtypes {
  /** activations: the float inputs of every op (x, q, k, v, gate, up, logits of argmax / moeRoute) */
  readonly act: readonly DType[];
  /** checkpoint weights: matmul's w, the embedding table, the experts */
  readonly weight: readonly DType[];
  /** small float operands: biases, norm weights, rope tables */
  readonly param: readonly DType[];
  /** the KV pools */
  readonly kv: readonly DType[];
  /** the logits sampleRows samples from */
  readonly logits: readonly DType[];
}

export interface OpErrors {
  /** an error of op `op`, its message prefixed with the backend's name */
  error(op: string, message: string): Error;
}

/** What a backend gives the rules. */
export interface OpChecks<X extends Tensor> extends OpErrors {
  readonly dtypes: OpDtypes;
  /** throws (`error(op, ...)`) unless the backend can take op `op` now: it is not closed */
  open(op: string): void;
  /**
   * `t` as a tensor of this backend (its class, instance, liveness: the backend's own checks)
   * with one of `dtypes` and, if given, rank `rank` (checkDtypeRank's messages).
   */
  arg(op: string, name: string, t: Tensor | undefined, dtypes: readonly DType[], rank?: number): X;
}

export function describe(t: Tensor): string {
  return `${t.dtype}[${t.shape.join(', ')}]`;
}

export function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** "a", "a or b", "a, b or c" */
export function oneOf(names: readonly string[]): string {
  return names.length < 2 ? names.join('') : `${names.slice(0, -1).join(', ')} or ${names[names.length - 1]}`;
}

/** The dtype and rank part of OpChecks.arg, for every backend. */
export function checkDtypeRank(e: OpErrors, op: string, name: string, t: Tensor, dtypes: readonly DType[], rank?: number): void {
  if (!dtypes.includes(t.dtype)) throw e.error(op, `${name} must be ${oneOf(dtypes)}, got ${describe(t)}`);
  if (rank !== undefined && t.shape.length !== rank) throw e.error(op, `${name} must have rank ${rank}, got ${describe(t)}`);
}

export function checkShape(e: OpErrors, op: string, shape: readonly number[]): void {
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 0) throw e.error(op, `invalid shape [${shape.join(', ')}]`);
  }
}

/** `context` describes the shapes involved; it is only evaluated on failure (hot path). */
export function expectDim(e: OpErrors, op: string, what: string, actual: number, expected: number, context: () => string): void {
  if (actual !== expected) throw e.error(op, `${what} is ${actual} but must be ${expected} (${context()})`);
}

export function expectFinite(e: OpErrors, op: string, name: string, v: number): void {
  if (!Number.isFinite(v)) throw e.error(op, `${name} must be a finite number, got ${v}`);
}

/** op's two activations `an` and `bn`, of one shape (add's a and b, glu's gate and up), once the backend is open */
function activationPair<X extends Tensor>(c: OpChecks<X>, op: string, an: string, a: Tensor, bn: string, b: Tensor): [X, X] {
  c.open(op);
  const x = c.arg(op, an, a, c.dtypes.act);
  const z = c.arg(op, bn, b, c.dtypes.act);
  if (!sameShape(x.shape, z.shape)) throw c.error(op, `shapes differ: ${an} ${describe(x)}, ${bn} ${describe(z)}`);
  return [x, z];
}

function expectActivation(e: OpErrors, op: string, act: Activation): void {
  if (!ACTIVATIONS.includes(act)) throw e.error(op, `unknown activation ${String(act)}`);
}

// ---- memory --------------------------------------------------------------------------------

/** upload's data and shape; returns the tensor's dtype (an upload keeps its array's). */
export function upload<X extends Tensor>(c: OpChecks<X>, data: Float32Array | Int32Array, shape: readonly number[]): DType {
  c.open('upload');
  checkShape(c, 'upload', shape);
  if (!(data instanceof Int32Array) && !(data instanceof Float32Array)) {
    throw c.error('upload', 'data must be a Float32Array or an Int32Array');
  }
  if (numel(shape) !== data.length) {
    throw c.error('upload', `shape [${shape.join(', ')}] has ${numel(shape)} elements but data has ${data.length}`);
  }
  return data instanceof Int32Array ? 'i32' : 'f32';
}

/** zeros: a known dtype; a row-scaled one (contracts/backend.ts) only as one of the backend's KV pool dtypes */
export function zeros<X extends Tensor>(c: OpChecks<X>, shape: readonly number[], dtype: DType): void {
  c.open('zeros');
  checkShape(c, 'zeros', shape);
  if (isRowScaled(dtype)) {
    if (!c.dtypes.kv.includes(dtype)) throw c.error('zeros', `${dtype} tensors are KV pools, which this backend keeps in ${oneOf(c.dtypes.kv)}`);
    if (shape.length === 0) throw c.error('zeros', `a ${dtype} tensor needs a last dimension to scale its rows by`);
  } else if (!ANY.includes(dtype)) throw c.error('zeros', `unknown dtype ${dtype}`);
}

/** reshape: a view of as many elements; returns the viewed tensor (a view needs no open backend). */
export function reshape<X extends Tensor>(c: OpChecks<X>, t: Tensor, shape: readonly number[]): X {
  const x = c.arg('reshape', 't', t, ANY);
  checkShape(c, 'reshape', shape);
  if (numel(shape) !== numel(x.shape)) {
    throw c.error('reshape', `cannot view ${describe(x)} as [${shape.join(', ')}] (element counts differ)`);
  }
  return x;
}

/** copyTensor: the same dtype and element count. */
export function copyTensor<X extends Tensor>(c: OpChecks<X>, t: Tensor, src: Tensor): { t: X; src: X } {
  const op = 'copyTensor';
  c.open(op);
  const x = c.arg(op, 't', t, ANY);
  const s = c.arg(op, 'src', src, ANY);
  if (x.dtype !== s.dtype || numel(x.shape) !== numel(s.shape)) {
    throw c.error(op, `src ${describe(s)} does not match t ${describe(x)} (same dtype and element count)`);
  }
  return { t: x, src: s };
}

// ---- ops -----------------------------------------------------------------------------------

/** table [V, D], ids [T] */
export function embedding<X extends Tensor>(c: OpChecks<X>, table: Tensor, ids: Tensor, scale: number) {
  const op = 'embedding';
  c.open(op);
  const tb = c.arg(op, 'table', table, c.dtypes.weight, 2);
  const id = c.arg(op, 'ids', ids, I32, 1);
  expectFinite(c, op, 'scale', scale);
  const [V, D] = tb.shape as [number, number];
  return { table: tb, ids: id, V, D, T: id.shape[0]! };
}

/** x [M, K], w [N, K], bias [N] */
export function matmul<X extends Tensor>(c: OpChecks<X>, x: Tensor, w: Tensor, bias: Tensor | undefined) {
  const op = 'matmul';
  c.open(op);
  const a = c.arg(op, 'x', x, c.dtypes.act, 2);
  const b = c.arg(op, 'w', w, c.dtypes.weight, 2);
  const [M, K] = a.shape as [number, number];
  const [N, Kw] = b.shape as [number, number];
  if (K !== Kw) throw c.error(op, `x ${describe(a)} and w ${describe(b)} disagree on K (w is [N, K])`);
  let bb: X | undefined;
  if (bias !== undefined) {
    bb = c.arg(op, 'bias', bias, c.dtypes.param, 1);
    expectDim(c, op, 'bias length', bb.shape[0]!, N, () => `w ${describe(b)}`);
  }
  return { x: a, w: b, bias: bb, M, N, K };
}

/** x [..., D], w [D]; `rows`: the rows of D that x holds */
export function rmsnorm<X extends Tensor>(c: OpChecks<X>, x: Tensor, w: Tensor, eps: number, weightOffset: number) {
  const op = 'rmsnorm';
  c.open(op);
  const a = c.arg(op, 'x', x, c.dtypes.act);
  const g = c.arg(op, 'w', w, c.dtypes.param, 1);
  if (a.shape.length === 0) throw c.error(op, 'x must have at least one dimension');
  const D = a.shape[a.shape.length - 1]!;
  expectDim(c, op, 'w length', g.shape[0]!, D, () => `last dim of x ${describe(a)}`);
  expectFinite(c, op, 'eps', eps);
  expectFinite(c, op, 'weightOffset', weightOffset);
  return { x: a, w: g, D, rows: D === 0 ? 0 : numel(a.shape) / D };
}

/** a and b of one shape; `n`: their elements */
export function add<X extends Tensor>(c: OpChecks<X>, a: Tensor, b: Tensor, bScale: number) {
  const [x, z] = activationPair(c, 'add', 'a', a, 'b', b);
  expectFinite(c, 'add', 'bScale', bScale);
  return { a: x, b: z, n: numel(x.shape) };
}

export function scale<X extends Tensor>(c: OpChecks<X>, x: Tensor, s: number) {
  const op = 'scale';
  c.open(op);
  const a = c.arg(op, 'x', x, c.dtypes.act);
  expectFinite(c, op, 's', s);
  return { x: a, n: numel(a.shape) };
}

/** gate and up of one shape, a known activation */
export function glu<X extends Tensor>(c: OpChecks<X>, gate: Tensor, up: Tensor, act: Activation) {
  const [g, u] = activationPair(c, 'glu', 'gate', gate, 'up', up);
  expectActivation(c, 'glu', act);
  return { gate: g, up: u, n: numel(g.shape) };
}

/** x [T, H, D], pos [T], invFreq [half] or [T, half] (perToken) with 2 half <= D */
export function rope<X extends Tensor>(c: OpChecks<X>, x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number) {
  const op = 'rope';
  c.open(op);
  const a = c.arg(op, 'x', x, c.dtypes.act, 3);
  const p = c.arg(op, 'pos', pos, I32, 1);
  const perToken = invFreq.shape.length === 2; // [T, half]: one table per token
  const f = c.arg(op, 'invFreq', invFreq, c.dtypes.param, perToken ? 2 : 1);
  const [T, H, D] = a.shape as [number, number, number];
  expectDim(c, op, 'pos length', p.shape[0]!, T, () => `x ${describe(a)} is [T, H, headDim]`);
  if (perToken) expectDim(c, op, 'invFreq rows', f.shape[0]!, T, () => `per-token invFreq ${describe(f)} needs one row per token`);
  const half = f.shape[f.shape.length - 1]!;
  if (2 * half > D) throw c.error(op, `invFreq ${describe(f)} rotates ${2 * half} dims but headDim is ${D}`);
  expectFinite(c, op, 'attentionScaling', attentionScaling);
  return { x: a, pos: p, invFreq: f, T, H, D, half, perToken };
}

/** A KV pair of pools [NB blocks, BS block size, KVH kv heads, D head dim] of one dtype, and the layout's block size. */
export function kvPools<X extends Tensor>(c: OpChecks<X>, op: string, kv: PagedKv, layout: StepLayout) {
  const kp = c.arg(op, 'kv.k', kv.k, c.dtypes.kv, 4);
  const vp = c.arg(op, 'kv.v', kv.v, c.dtypes.kv, 4);
  if (!sameShape(kp.shape, vp.shape) || kp.dtype !== vp.dtype) throw c.error(op, `kv.k ${describe(kp)} and kv.v ${describe(vp)} differ`);
  const [NB, BS, KVH, D] = kp.shape as [number, number, number, number];
  expectDim(c, op, 'layout.blockSize', layout.blockSize, BS, () => `pool ${describe(kp)} is [blocks, blockSize, kvHeads, headDim]`);
  return { kPool: kp, vPool: vp, NB, BS, KVH, D };
}

/** the pools, k and v [T, KVH, D], layout.slots [T] */
export function writeKv<X extends Tensor>(c: OpChecks<X>, kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout) {
  const op = 'writeKv';
  c.open(op);
  const pools = kvPools(c, op, kv, layout);
  const { NB, BS, KVH, D } = pools;
  const kk = c.arg(op, 'k', k, c.dtypes.act, 3);
  const vv = c.arg(op, 'v', v, c.dtypes.act, 3);
  if (!sameShape(kk.shape, vv.shape)) throw c.error(op, `k ${describe(kk)} and v ${describe(vv)} differ`);
  const T = kk.shape[0]!;
  if (kk.shape[1] !== KVH || kk.shape[2] !== D) {
    throw c.error(op, `k ${describe(kk)} must be [T, ${KVH}, ${D}] to match the pool [${NB}, ${BS}, ${KVH}, ${D}]`);
  }
  const slots = c.arg(op, 'layout.slots', layout.slots, I32, 1);
  expectDim(c, op, 'layout.slots length', slots.shape[0]!, T, () => `k ${describe(kk)}`);
  return { ...pools, k: kk, v: vv, slots, T };
}

/** attention's scalars: a finite scale, an integer window >= 0, a soft-cap >= 0 */
function attentionParams(e: OpErrors, op: string, params: AttentionParams): void {
  const { scale, window, softcap } = params;
  if (!Number.isFinite(scale)) throw e.error(op, `params.scale must be a finite number, got ${scale}`);
  if (!Number.isSafeInteger(window) || window < 0) throw e.error(op, `params.window must be an integer >= 0, got ${window}`);
  if (!Number.isFinite(softcap) || softcap < 0) throw e.error(op, `params.softcap must be >= 0, got ${softcap}`);
}

/**
 * the pools, q [T, H, D] with H a multiple of KVH, layout.tokenRow and tokenPos [T], blockTables
 * [R rows, MBR blocks a row], the params
 */
export function attention<X extends Tensor>(c: OpChecks<X>, q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams) {
  const op = 'attention';
  c.open(op);
  const pools = kvPools(c, op, kv, layout);
  const { KVH, D } = pools;
  const qq = c.arg(op, 'q', q, c.dtypes.act, 3);
  const [T, H, Dq] = qq.shape as [number, number, number];
  expectDim(c, op, 'q headDim', Dq, D, () => `pool ${describe(pools.kPool)}`);
  if (KVH === 0 || H % KVH !== 0) throw c.error(op, `q heads ${H} is not a multiple of kv heads ${KVH}`);
  const row = c.arg(op, 'layout.tokenRow', layout.tokenRow, I32, 1);
  const pos = c.arg(op, 'layout.tokenPos', layout.tokenPos, I32, 1);
  const bt = c.arg(op, 'layout.blockTables', layout.blockTables, I32, 2);
  expectDim(c, op, 'layout.tokenRow length', row.shape[0]!, T, () => `q ${describe(qq)}`);
  expectDim(c, op, 'layout.tokenPos length', pos.shape[0]!, T, () => `q ${describe(qq)}`);
  attentionParams(c, op, params);
  const [R, MBR] = bt.shape as [number, number];
  return { ...pools, q: qq, tokenRow: row, tokenPos: pos, blockTables: bt, T, H, R, MBR };
}

export function softcap<X extends Tensor>(c: OpChecks<X>, x: Tensor, cap: number) {
  const op = 'softcap';
  c.open(op);
  const a = c.arg(op, 'x', x, c.dtypes.act);
  if (!Number.isFinite(cap) || cap <= 0) throw c.error(op, `cap must be > 0, got ${cap}`);
  return { x: a, n: numel(a.shape) };
}

/** x [T, D] of any dtype, idx [R] */
export function gatherRows<X extends Tensor>(c: OpChecks<X>, x: Tensor, idx: Tensor) {
  const op = 'gatherRows';
  c.open(op);
  const a = c.arg(op, 'x', x, ANY, 2);
  const ix = c.arg(op, 'idx', idx, I32, 1);
  const [T, D] = a.shape as [number, number];
  return { x: a, idx: ix, T, D, R: ix.shape[0]! };
}

/** x [R, V] */
export function argmax<X extends Tensor>(c: OpChecks<X>, x: Tensor) {
  c.open('argmax');
  const a = c.arg('argmax', 'x', x, c.dtypes.act, 2);
  const [R, V] = a.shape as [number, number];
  return { x: a, R, V };
}

/** logits [P, V] and P rows (each row's own checks are the sampling contract's: contracts/device-sampling.ts) */
export function sampleRows<X extends Tensor>(c: OpChecks<X>, logits: Tensor, rows: readonly unknown[]) {
  const op = 'sampleRows';
  c.open(op);
  const a = c.arg(op, 'logits', logits, c.dtypes.logits, 2);
  const [P, V] = a.shape as [number, number];
  if (rows.length !== P) throw c.error(op, `${rows.length} rows for logits ${describe(a)}`);
  return { logits: a, P, V };
}

/** logits [T, E], topK in [1, E] */
export function moeRoute<X extends Tensor>(c: OpChecks<X>, logits: Tensor, topK: number) {
  const op = 'moeRoute';
  c.open(op);
  const l = c.arg(op, 'logits', logits, c.dtypes.act, 2);
  const [T, E] = l.shape as [number, number];
  if (!Number.isSafeInteger(topK) || topK < 1 || topK > E) {
    throw c.error(op, `topK must be an integer in [1, ${E}] for logits ${describe(l)}, got ${topK}`);
  }
  return { logits: l, T, E };
}

/**
 * x [T, D], routing weights (f32) and experts [T, K], gate and up [E, I, D], down [E, D, I], a
 * known activation
 */
export function moeFfn<X extends Tensor>(c: OpChecks<X>, x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor,
  down: Tensor, act: Activation) {
  const op = 'moeFfn';
  c.open(op);
  const a = c.arg(op, 'x', x, c.dtypes.act, 2);
  const rw = c.arg(op, 'routing.weights', routing.weights, F32, 2);
  const re = c.arg(op, 'routing.experts', routing.experts, I32, 2);
  const g = c.arg(op, 'gate', gate, c.dtypes.weight, 3);
  const u = c.arg(op, 'up', up, c.dtypes.weight, 3);
  const d = c.arg(op, 'down', down, c.dtypes.weight, 3);
  const [T, D] = a.shape as [number, number];
  const [E, I, Dg] = g.shape as [number, number, number];
  if (!sameShape(rw.shape, re.shape) || rw.shape[0] !== T) {
    throw c.error(op, `routing weights ${describe(rw)} / experts ${describe(re)} must both be [${T}, topK]`);
  }
  if (Dg !== D) throw c.error(op, `gate ${describe(g)} must be [E, I, ${D}] for x ${describe(a)}`);
  if (!sameShape(u.shape, g.shape)) throw c.error(op, `up ${describe(u)} must match gate ${describe(g)}`);
  if (!sameShape(d.shape, [E, D, I])) throw c.error(op, `down ${describe(d)} must be [${E}, ${D}, ${I}]`);
  expectActivation(c, op, act);
  return { x: a, weights: rw, experts: re, gate: g, up: u, down: d, T, D, E, I, K: rw.shape[1]! };
}
