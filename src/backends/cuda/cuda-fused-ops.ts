// The CUDA backend's fused decode ops (Backend's optional FusedOps and their GEMV-fused twins):
// addRmsnorm, addRmsnormMatmul, gluPacked, gluMatmul, ropeQkvWriteKv, under the backend's
// CudaFusedSettings (which GEMV fusions are on), and the shared-memory check that decides whether a
// fused GEMV launch fits. Separate from cuda-backend.ts
// because these are the decoder's fast path, with their own tuning rules; the plain ops stay there.
import type { Activation, PagedKv, QkNorm, QkvHeads, StepLayout, Tensor } from '../../contracts/backend.ts';
import { numel } from '../../contracts/backend.ts';
import { ACTS, type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid, FLOAT, I32, MAX_GRID_X, WEIGHTS } from './cuda-op-context.ts';
import { poolDims } from './cuda-kv-ops.ts';
import { ACT_CODE, type CudaTensor, DT_CODE } from './cuda-tensor.ts';
import { ROPE_QKV_MAX_HEAD_DIM } from './fused-kernels.ts';
import {
  GEMV_THREADS, GEMVP_MAX_SHARED_BYTES, gemvFusedChoice, gemvLaunchGrid, gemvNormGluChoice, gemvNormRopeChoice, gemvRopeUnits,
} from './gemv-kernels.ts';
import type { CudaSettings } from './cuda-settings.ts';
import type { KernelName } from './kernels.ts';
import { describe, expectDim, expectFinite, opError, sameShape } from './validate.ts';

/**
 * The most rows the fused GEMV paths take (gluMatmul, addRmsnormMatmul); more run the two ops. On
 * the H200 (8B shapes) the fused norm gained 1.9-3.5% at one row, but at 4 rows the m4 kernel made
 * decode 25% slower (7.02 vs 5.24 ms a step); 2-3 rows are unmeasured.
 */
const FUSED_GEMV_MAX_ROWS = 1;

/**
 * The most rows the GEMV-fused paths take under `s`: none in batch-invariant mode, where every
 * row count runs the plain ops (the norm kernel, then the GEMM of cuBLASLt's one algorithm for the
 * weight shape), since a GEMV sums a row in another order than cuBLASLt does.
 */
export function fusedGemvMaxRows(s: Pick<CudaSettings, 'batchInvariant'>): number {
  return s.batchInvariant ? 0 : FUSED_GEMV_MAX_ROWS;
}

export class CudaFusedOps {
  /** static shared bytes by kernel (sharedFits) */
  private readonly staticShared = new Map<KernelName, number>();

  constructor(private readonly c: CudaOpContext) {}

  /**
   * Whether the norm-fused GEMV kernels (k_gemvp_norm*) take these operands of x + rScale r, normed
   * by g, times w: the norm fusion on, bf16 x, r and w, x and r of one shape whose rows w's columns
   * and g match, at most fusedGemvMaxRows rows, 16-byte aligned, finite scalars.
   */
  private normGemvApplies(a: CudaTensor, rr: CudaTensor, g: CudaTensor, m: CudaTensor, rScale: number, eps: number,
    weightOffset: number): boolean {
    const [T, D] = a.shape as [number, number];
    return this.c.settings.fused.fuseNorm && a.dtype === 'bf16' && rr.dtype === 'bf16' && m.dtype === 'bf16' && sameShape(a.shape, rr.shape) &&
      m.shape[1] === D && g.shape[0] === D && T >= 1 && T <= fusedGemvMaxRows(this.c.settings) &&
      a.addr % 16 === 0 && rr.addr % 16 === 0 && m.addr % 16 === 0 &&
      Number.isFinite(rScale) && Number.isFinite(eps) && Number.isFinite(weightOffset);
  }

  /**
   * Whether a launch of `name` with `dynamicBytes` of dynamic shared memory stays within the
   * 48 KiB a block may use without opting in (static + dynamic: the fused GEMV kernels' own
   * reduction arrays count too; 6 rows x 4096 of staged x alone is 48 KiB).
   */
  private sharedFits(name: KernelName, dynamicBytes: number): boolean {
    let fixed = this.staticShared.get(name);
    if (fixed === undefined) {
      fixed = this.c.kernelResources(name).sharedBytes;
      this.staticShared.set(name, fixed);
    }
    return fixed + dynamicBytes <= GEMVP_MAX_SHARED_BYTES;
  }

  addRmsnorm(x: Tensor, r: Tensor, rScale: number, w: Tensor, eps: number, weightOffset: number): { sum: Tensor; normed: Tensor } {
    const op = 'addRmsnorm';
    this.c.assertOpen(op);
    const a = this.c.arg(op, 'x', x, ACTS);
    const b = this.c.arg(op, 'r', r, ACTS);
    const g = this.c.arg(op, 'w', w, FLOAT, 1);
    if (!sameShape(a.shape, b.shape)) throw opError(op, `shapes differ: x ${describe(a)}, r ${describe(b)}`);
    if (a.shape.length === 0) throw opError(op, 'x must have at least one dimension');
    const D = a.shape[a.shape.length - 1]!;
    expectDim(op, 'w length', g.shape[0]!, D, () => `last dim of x ${describe(a)}`);
    expectFinite(op, 'rScale', rScale);
    expectFinite(op, 'eps', eps);
    expectFinite(op, 'weightOffset', weightOffset);
    const sum = this.c.out(a.shape);
    const normed = this.c.out(a.shape);
    const rows = D === 0 ? 0 : numel(a.shape) / D;
    const threads = Math.min(1024, Math.max(32, Math.ceil(Math.ceil(D / 8) / 32) * 32));
    this.c.rt.launch('k_add_rmsnorm', [Math.min(rows, MAX_GRID_X), 1, 1], threads, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', b.addr], ['i', DT_CODE[b.dtype]], ['f', rScale], ['p', g.addr],
      ['i', DT_CODE[g.dtype]], ['p', sum.addr], ['p', normed.addr], ['p', rows], ['i', D], ['f', eps], ['f', weightOffset]]);
    return { sum, normed };
  }

  /**
   * addRmsnorm, then matmul(normed, w, bias). Fused (the default), a decode shape (at
   * most FUSED_GEMV_MAX_ROWS rows, bf16 x, r and w, no bias, 16-byte aligned, the normed rows within
   * GEMVP_MAX_SHARED_BYTES, weights within GEMVP_FUSED_MAX_WEIGHT_BYTES) runs one persistent GEMV
   * kernel whose blocks each make the normed rows once into shared memory while their first weights
   * stream (gemv-kernels.ts k_gemvp_norm_*), writing the new residual too: a kernel and the normed
   * copy less (the default; CudaFusedSettings.fuseNorm off: never); otherwise the two ops.
   */
  addRmsnormMatmul(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, w: Tensor,
    bias?: Tensor): { sum: Tensor; y: Tensor } {
    const op = 'addRmsnormMatmul';
    this.c.assertOpen(op);
    const a = this.c.arg(op, 'x', x, ACTS, 2);
    const rr = this.c.arg(op, 'r', r, ACTS, 2);
    const g = this.c.arg(op, 'normW', normW, FLOAT, 1);
    const m = this.c.arg(op, 'w', w, WEIGHTS, 2);
    const [T, D] = a.shape as [number, number];
    const N = m.shape[0]!;
    if (!sameShape(a.shape, rr.shape)) throw opError(op, `shapes differ: x ${describe(a)}, r ${describe(rr)}`);
    expectDim(op, 'w columns', m.shape[1]!, D, () => `x ${describe(a)}`);
    const gemv = bias === undefined && N > 0 && this.normGemvApplies(a, rr, g, m, rScale, eps, weightOffset)
      ? gemvFusedChoice(T, N, D, this.c.settings.gemv.fusedBlocksPerSm) : undefined;
    if (!gemv || !this.sharedFits(gemv.norm, gemv.sharedBytes)) {
      const { sum, normed } = this.addRmsnorm(a, rr, rScale, g, eps, weightOffset);
      const y = this.c.matmul(normed, m, bias);
      this.c.free(normed); // stream-ordered: the matmul enqueued above reads it first
      return { sum, y };
    }
    const sum = this.c.out([T, D]);
    const y = this.c.out([T, N]);
    this.c.rt.launch(gemv.norm, [gemvLaunchGrid(gemv.choice, N, this.c.rt.smCount), 1, 1], GEMV_THREADS, gemv.sharedBytes, [
      ['p', m.addr], ['p', a.addr], ['p', rr.addr], ['f', rScale], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['f', eps],
      ['f', weightOffset], ['p', sum.addr], ['p', y.addr], ['i', T], ['i', N], ['i', D], ['i', gemv.choice.warpsPerRow]]);
    return { sum, y };
  }

  /**
   * addRmsnormMatmul(x, r, ..., gateUp), then gluPacked(·, act): y [T, I]. With the norm fusion and
   * CudaFusedSettings.gluEpilogue on (the default), a one-row decode shape (bf16, 16-byte aligned, the normed row
   * within GEMVP_MAX_SHARED_BYTES) is one kernel whose warps sum the gate and the up row of each
   * output and store its GLU (gemv-kernels.ts k_gemvp_normglu_*); otherwise the ops above.
   */
  addRmsnormGateUpGlu(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number,
    gateUp: Tensor, act: Activation): { sum: Tensor; y: Tensor } {
    const op = 'addRmsnormGateUpGlu';
    this.c.assertOpen(op);
    const a = this.c.arg(op, 'x', x, ACTS, 2);
    const rr = this.c.arg(op, 'r', r, ACTS, 2);
    const g = this.c.arg(op, 'normW', normW, FLOAT, 1);
    const m = this.c.arg(op, 'gateUp', gateUp, WEIGHTS, 2);
    const [T, D] = a.shape as [number, number];
    const N2 = m.shape[0]!;
    if (N2 % 2 !== 0) throw opError(op, `gateUp ${describe(m)} must be packed gate/up rows [2I, ${D}]`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const I = N2 / 2;
    const fuse = this.c.settings.fused.gluEpilogue && I > 0 && this.normGemvApplies(a, rr, g, m, rScale, eps, weightOffset)
      ? gemvNormGluChoice(T, I, D, this.c.settings.gemv.fusedBlocksPerSm) : undefined;
    if (!fuse || !this.sharedFits(fuse.kernel, fuse.sharedBytes)) {
      const f = this.addRmsnormMatmul(a, rr, rScale, g, eps, weightOffset, m); // checks the shapes
      const y = this.gluPacked(f.y, act);
      this.c.free(f.y); // stream-ordered: the glu enqueued above reads it first
      return { sum: f.sum, y };
    }
    const sum = this.c.out([T, D]);
    const y = this.c.out([T, I]);
    this.c.rt.launch(fuse.kernel, [gemvLaunchGrid(fuse.choice, I, this.c.rt.smCount), 1, 1], GEMV_THREADS, fuse.sharedBytes, [
      ['p', m.addr], ['p', a.addr], ['p', rr.addr], ['f', rScale], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['f', eps],
      ['f', weightOffset], ['p', sum.addr], ['p', y.addr], ['i', T], ['i', I], ['i', D], ['i', fuse.choice.warpsPerRow],
      ['i', code]]);
    return { sum, y };
  }

  gluPacked(gu: Tensor, act: Activation): Tensor {
    const op = 'gluPacked';
    this.c.assertOpen(op);
    const g = this.c.arg(op, 'gu', gu, ACTS, 2);
    const [T, I2] = g.shape as [number, number];
    if (I2 % 2 !== 0) throw opError(op, `gu ${describe(g)} must be [T, 2I]`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const I = I2 / 2;
    const y = this.c.out([T, I]);
    const n = g.dtype === 'bf16' && I % 8 === 0 ? (T * I) / 8 : T * I;
    this.c.rt.launch('k_glu_packed', elementwiseGrid(n), ELEMWISE_THREADS, 0, [
      ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', y.addr], ['p', T], ['p', I], ['i', code]]);
    return y;
  }

  /**
   * matmul(gluPacked(gu, act), w, bias). With CudaFusedSettings.fuseGlu on, a decode shape (at most
   * FUSED_GEMV_MAX_ROWS rows, bf16 gu and w, no bias, 16-byte aligned, the [T, I] glu within
   * GEMVP_MAX_SHARED_BYTES) runs one persistent GEMV kernel whose blocks each make the GLU once
   * into shared memory (gemv-kernels.ts k_gemvp_glu_*): a kernel and the [T, I] glu output less
   * per layer. Off by default (a small loss at B=1: TUNING.md); otherwise the two ops.
   */
  gluMatmul(gu: Tensor, act: Activation, w: Tensor, bias?: Tensor): Tensor {
    const op = 'gluMatmul';
    this.c.assertOpen(op);
    const g = this.c.arg(op, 'gu', gu, ACTS, 2);
    const b = this.c.arg(op, 'w', w, WEIGHTS, 2);
    const [T, I2] = g.shape as [number, number];
    const [N, I] = b.shape as [number, number];
    if (I2 !== 2 * I) throw opError(op, `gu ${describe(g)} must be [T, 2I] for w ${describe(b)} ([N, I])`);
    const code = ACT_CODE[act];
    if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
    const gemv = this.c.settings.fused.fuseGlu && bias === undefined && g.dtype === 'bf16' && b.dtype === 'bf16' && T >= 1 &&
      T <= fusedGemvMaxRows(this.c.settings) && N > 0 &&
      g.addr % 16 === 0 && b.addr % 16 === 0 ? gemvFusedChoice(T, N, I, this.c.settings.gemv.fusedBlocksPerSm) : undefined;
    if (!gemv || !this.sharedFits(gemv.glu, gemv.sharedBytes)) {
      const h = this.gluPacked(g, act);
      const y = this.c.matmul(h, b, bias);
      this.c.free(h); // stream-ordered: the matmul enqueued above reads it first
      return y;
    }
    const y = this.c.out([T, N]);
    this.c.rt.launch(gemv.glu, [gemvLaunchGrid(gemv.choice, N, this.c.rt.smCount), 1, 1], GEMV_THREADS, gemv.sharedBytes, [
      ['p', b.addr], ['p', g.addr], ['p', y.addr], ['i', T], ['i', N], ['i', I], ['i', gemv.choice.warpsPerRow], ['i', code]]);
    return y;
  }

  /**
   * The checks of a rope + KV write over T tokens of q/k/v rows `width` wide (`what` describes
   * them): the heads, the pools, positions, invFreq ([half] or [T, half]) and slots.
   */
  private ropeArgs(op: string, T: number, width: number, what: () => string, heads: QkvHeads, pos: Tensor, invFreq: Tensor,
    attentionScaling: number, kv: PagedKv, layout: StepLayout) {
    const { heads: H, kvHeads: KVH, headDim: D } = heads;
    for (const [k, v] of Object.entries(heads)) {
      if (!Number.isSafeInteger(v) || v < 1) throw opError(op, `heads.${k} must be a positive integer, got ${v}`);
    }
    expectDim(op, 'qkv width', width, (H + 2 * KVH) * D, () => `(heads ${H} + 2 x kvHeads ${KVH}) x headDim ${D}`);
    if (D > ROPE_QKV_MAX_HEAD_DIM) throw opError(op, `head dim ${D} is above the ${ROPE_QKV_MAX_HEAD_DIM} this kernel handles`);
    const [NB, BS, PKVH, PD] = poolDims(this.c, op, kv, layout);
    if (PKVH !== KVH || PD !== D) throw opError(op, `pool ${describe(kv.k)} must be [blocks, blockSize, ${KVH}, ${D}]`);
    const p = this.c.arg(op, 'pos', pos, I32, 1);
    expectDim(op, 'pos length', p.shape[0]!, T, () => `qkv ${what()}`);
    const perToken = invFreq.shape.length === 2;
    const f = this.c.arg(op, 'invFreq', invFreq, ['f32'], perToken ? 2 : 1);
    if (perToken) expectDim(op, 'invFreq rows', f.shape[0]!, T, () => `per-token invFreq ${describe(f)} needs one row per token`);
    const half = f.shape[f.shape.length - 1]!;
    if (2 * half > D) throw opError(op, `invFreq ${describe(f)} rotates ${2 * half} dims but headDim is ${D}`);
    expectFinite(op, 'attentionScaling', attentionScaling);
    const slots = this.c.arg(op, 'layout.slots', layout.slots, I32, 1);
    expectDim(op, 'layout.slots length', slots.shape[0]!, T, () => `qkv ${what()}`);
    return { H, KVH, D, numSlots: NB * BS, p, f, perToken, half, slots };
  }

  /**
   * addRmsnormMatmul(x, r, ..., qkv), then ropeQkvWriteKv without qk-norm: { sum, q }. With the norm
   * fusion and CudaFusedSettings.ropeEpilogue on (off by default: slower at B=1 under PDL, for reasons
   * not known; TUNING.md), a one-row decode shape (bf16 x, r, weights and
   * pools, 16-byte aligned, the normed row within GEMVP_MAX_SHARED_BYTES) is one kernel whose
   * warps sum the rows of each rotated pair and store them roped, to q or the pools
   * (gemv-kernels.ts k_gemvp_normrope_*); otherwise the ops above.
   */
  addRmsnormQkvRope(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, qkv: Tensor,
    heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number, kv: PagedKv, layout: StepLayout): { sum: Tensor; q: Tensor } {
    const op = 'addRmsnormQkvRope';
    this.c.assertOpen(op);
    const a = this.c.arg(op, 'x', x, ACTS, 2);
    const rr = this.c.arg(op, 'r', r, ACTS, 2);
    const g = this.c.arg(op, 'normW', normW, FLOAT, 1);
    const m = this.c.arg(op, 'qkv', qkv, WEIGHTS, 2);
    const [T, Dh] = a.shape as [number, number];
    const rows = m.shape[0]!;
    const kp = kv.k as CudaTensor, vp = kv.v as CudaTensor;
    const fuse = this.c.settings.fused.ropeEpilogue && kp.dtype === 'bf16' && vp.dtype === 'bf16' &&
      this.normGemvApplies(a, rr, g, m, rScale, eps, weightOffset)
      ? gemvNormRopeChoice(T, rows, Dh, this.c.settings.gemv.fusedBlocksPerSm) : undefined;
    if (!fuse || !this.sharedFits(fuse.kernel, fuse.sharedBytes)) {
      const f = this.addRmsnormMatmul(a, rr, rScale, g, eps, weightOffset, m); // checks the shapes
      const q = this.ropeQkvWriteKv(f.y, heads, pos, invFreq, attentionScaling, undefined, kv, layout);
      this.c.free(f.y); // stream-ordered: the rope enqueued above reads it first
      return { sum: f.sum, q };
    }
    const ra = this.ropeArgs(op, T, rows, () => `rows ${describe(m)}`, heads, pos, invFreq, attentionScaling, kv, layout);
    const sum = this.c.out([T, Dh]);
    const q = this.c.out([T, ra.H, ra.D]);
    const units = gemvRopeUnits(ra.H, ra.KVH, ra.D, ra.half);
    this.c.rt.launch(fuse.kernel, [gemvLaunchGrid(fuse.choice, units, this.c.rt.smCount), 1, 1], GEMV_THREADS, fuse.sharedBytes, [
      ['p', m.addr], ['p', a.addr], ['p', rr.addr], ['f', rScale], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['f', eps],
      ['f', weightOffset], ['p', sum.addr], ['p', q.addr], ['i', T], ['i', Dh], ['i', fuse.choice.warpsPerRow], ['i', ra.H],
      ['i', ra.KVH], ['i', ra.D], ['i', ra.half], ['p', ra.p.addr], ['p', ra.f.addr], ['i', ra.perToken ? ra.half : 0],
      ['f', attentionScaling], ['p', kp.addr], ['p', vp.addr], ['p', ra.slots.addr], ['p', ra.numSlots], ['p', this.c.errWord]]);
    return { sum, q };
  }

  ropeQkvWriteKv(qkv: Tensor, heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number,
    qkNorm: QkNorm | undefined, kv: PagedKv, layout: StepLayout): Tensor {
    const op = 'ropeQkvWriteKv';
    this.c.assertOpen(op);
    const x = this.c.arg(op, 'qkv', qkv, ACTS, 2);
    const T = x.shape[0]!;
    const { H, KVH, D, numSlots, p, f, perToken, half, slots } = this.ropeArgs(op, T, x.shape[1]!, () => describe(x), heads, pos,
      invFreq, attentionScaling, kv, layout);
    let qn: CudaTensor | null = null, kn: CudaTensor | null = null;
    if (qkNorm) {
      qn = this.c.arg(op, 'qkNorm.q', qkNorm.q, FLOAT, 1);
      kn = this.c.arg(op, 'qkNorm.k', qkNorm.k, FLOAT, 1);
      expectDim(op, 'qkNorm.q length', qn.shape[0]!, D, () => 'per-head norm weights are [headDim]');
      expectDim(op, 'qkNorm.k length', kn.shape[0]!, D, () => 'per-head norm weights are [headDim]');
      if (qn.dtype !== kn.dtype) throw opError(op, `qkNorm.q ${describe(qn)} and qkNorm.k ${describe(kn)} differ in dtype`);
      expectFinite(op, 'qkNorm.eps', qkNorm.eps);
      expectFinite(op, 'qkNorm.weightOffset', qkNorm.weightOffset);
    }
    const q = this.c.out([T, H, D]);
    const kp = kv.k as CudaTensor;
    const vp = kv.v as CudaTensor;
    this.c.rt.launch('k_rope_qkv', [T, H + KVH, 1], Math.min(256, Math.max(32, Math.ceil(D / 32) * 32)), 0, [
      ['p', x.addr], ['i', DT_CODE[x.dtype]], ['p', p.addr], ['p', f.addr], ['i', perToken ? half : 0], ['f', attentionScaling],
      ['p', qn ? qn.addr : 0], ['p', kn ? kn.addr : 0], ['i', qn ? DT_CODE[qn.dtype] : 0], ['f', qkNorm?.eps ?? 0],
      ['f', qkNorm?.weightOffset ?? 0], ['p', q.addr], ['p', kp.addr], ['p', vp.addr], ['i', DT_CODE[kp.dtype]],
      ['p', slots.addr], ['i', T], ['i', H], ['i', KVH], ['i', D], ['i', half], ['p', numSlots], ['p', this.c.errWord]]);
    return q;
  }
}
