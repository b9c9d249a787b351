// The CUDA backend's mixture-of-experts ops (Backend.moeRoute, moeFfn): top-k routing of each
// token's expert logits, then each token's experts' GLU FFN weighted by its routing weights: per
// (token, expert) pair in two kernels through an f32 hidden scratch, or from MOE_GROUPED_MIN_ROWS
// tokens grouped by expert in four kernels a pass (moeFfnGrouped). Separate from cuda-backend.ts because only MoE
// models reach them and their checks (expert-stacked weights, routing pairs) are their own.
import type { Activation, MoeRouting, Tensor } from '../../contracts/backend.ts';
import { envChoice, envInt } from '../common/env.ts';
import { Setting } from '../common/setting.ts';
import { ACTS, type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid, FLOAT, I32, MAX_GRID_Y } from './cuda-op-context.ts';
import { ACT_CODE, type CudaTensor, DT_CODE } from './cuda-tensor.ts';
import {
  MOE_GROUP_THREADS, MOE_GROUPED_MIN_ROWS, MOE_PASS_ROWS, MOE_ROUTE_MAX_EXPERTS, MOE_ROUTE_WARPS, MOE_ROWS_PER_BLOCK,
  MOE_TC_ROWS, MOE_TC_THREADS, MOE_THREADS, moeGroupedScratch, moeRunsGrouped, moeVecKernelsApply,
} from './moe-kernels.ts';
import { describe, moeShapes, opError } from './validate.ts';

/**
 * The FFN kernels: 'scalar' (k_moe_hidden / k_moe_down in kernels.ts: any dtype, one 2-byte load a
 * lane and step; they read a Qwen3-30B-A3B-style decode's expert rows at ~0.24 of the H200's copy
 * bandwidth) or 'vec' (k_moe_hidden_v / k_moe_down_v in moe-kernels.ts: bf16, 16-byte streaming
 * loads with 8-16 in flight a lane, as the decode GEMVs; used where they apply: bf16 x and weights,
 * D and I multiples of 8, 16-byte aligned buffers), the default: on the H200 (Qwen3-30B-A3B layers, random
 * weights, session 6) B=1 decode ran 156.1 tok/s with them and 130.2 with the scalar ones, and 16
 * requests 420 output tok/s where the scalar kernels had not finished in two minutes.
 * $LLMTS_CUDA_MOE=scalar picks 'scalar' at startup.
 */
export type MoeKernels = 'scalar' | 'vec';
const moeKernels = new Setting<MoeKernels>(envChoice('LLMTS_CUDA_MOE', ['vec', 'scalar']));

/** Sets the FFN kernels for later moeFfn calls (tests, benchmarks); returns the old setting. */
export function setMoeKernels(k: MoeKernels): MoeKernels {
  return moeKernels.set(k);
}

/**
 * Grouped inputs of at least this many tokens make the experts' gate/up products on tensor cores
 * (k_moe_hidden_tc) instead of CUDA cores (k_moe_hidden_g): prefill. On the H200 (Qwen3-30B-A3B
 * layers, session 6) a 2048-token prefill ran 4,179 tok/s with them and 2,828 without, 16 x 512/256
 * 849 output tok/s and 712 (TTFT 1.98 s and 2.91). $LLMTS_CUDA_MOE_TC_MIN_ROWS sets it (0: never).
 */
const tcMinRows = new Setting<number>(envInt('LLMTS_CUDA_MOE_TC_MIN_ROWS', 64, { min: 0, max: 1 << 20 }));

/** Sets the token count from which grouped moeFfn runs gate/up on tensor cores (0: never); returns the old one. */
export function setMoeTcMinRows(n: number): number {
  return tcMinRows.set(n);
}

/**
 * Grouped inputs of at least this many tokens run the down projection on tensor cores too
 * (k_moe_down_tc, which rounds the hidden values to bf16 on the way in) instead of k_moe_down_g.
 * On the H200 (Qwen3-30B-A3B layers, session 7, passes of 256 tokens) a 2048-token prefill ran
 * 9,605 tok/s with it and 4,086 without; 16 x 512/256 1,113 output tok/s and 843 (TTFT 0.84 s and
 * 2.02). $LLMTS_CUDA_MOE_TC_DOWN_MIN_ROWS sets it (default 64; 0: never).
 */
const tcDownMinRows = new Setting<number>(envInt('LLMTS_CUDA_MOE_TC_DOWN_MIN_ROWS', 64, { min: 0, max: 1 << 20 }));

/** Sets the token count from which grouped moeFfn runs the down projection on tensor cores (0: never); returns the old one. */
export function setMoeTcDownMinRows(n: number): number {
  return tcDownMinRows.set(n);
}

/**
 * Output rows a warp of the grouped CUDA-core down projection streams together: 4 (k_moe_down_g4,
 * the default) or 1 (k_moe_down_g; $LLMTS_CUDA_MOE_DOWN_ROWS=1). Decode-sized groups (a few tokens
 * an expert) made k_moe_down_g a long chain of short waves: see moe-kernels.ts. On the H200
 * (Qwen3-30B-A3B layers, session 7) 16 x 512/256 ran 1,420 output tok/s with 4 and 1,189 with 1
 * (8.99 and 11.17 ms between tokens).
 */
const downRows = new Setting<1 | 4>(envChoice('LLMTS_CUDA_MOE_DOWN_ROWS', ['4', '1']) === '1' ? 1 : 4);

/** Sets the rows a warp of k_moe_down_g(4) takes (tests, benchmarks); returns the old one. */
export function setMoeDownRows(r: 1 | 4): 1 | 4 {
  return downRows.set(r);
}

/**
 * Rows a warp of the grouped CUDA-core gate/up products streams together: 2 (k_moe_hidden_g2, the
 * default) or 1 (k_moe_hidden_g; $LLMTS_CUDA_MOE_HIDDEN_ROWS=1), as downRows for the down projection.
 * On the H200 (as above, with 4 down rows) 1,641 output tok/s with 2 and 1,415 with 1 (7.43 and
 * 8.99 ms between tokens).
 */
const hiddenRows = new Setting<1 | 2>(envChoice('LLMTS_CUDA_MOE_HIDDEN_ROWS', ['2', '1']) === '1' ? 1 : 2);

/** Sets the rows a warp of k_moe_hidden_g(2) takes (tests, benchmarks); returns the old one. */
export function setMoeHiddenRows(r: 1 | 2): 1 | 2 {
  return hiddenRows.set(r);
}

/** Sets the token count from which moeFfn groups by expert (0: never; tests, benchmarks); returns the old one. */
export function setMoeGroupedMinRows(n: number): number {
  return MOE_GROUPED_MIN_ROWS.set(n);
}

export function moeRoute(c: CudaOpContext, logits: Tensor, topK: number, renormalize: boolean): MoeRouting {
  const op = 'moeRoute';
  c.assertOpen(op);
  const l = c.arg(op, 'logits', logits, ACTS, 2);
  const [T, E] = l.shape as [number, number];
  if (!Number.isSafeInteger(topK) || topK < 1 || topK > E) {
    throw opError(op, `topK must be an integer in [1, ${E}] for logits ${describe(l)}, got ${topK}`);
  }
  if (E > MOE_ROUTE_MAX_EXPERTS) {
    throw opError(op, `the CUDA router takes at most ${MOE_ROUTE_MAX_EXPERTS} experts, logits ${describe(l)} have ${E}`);
  }
  const weights = c.out([T, topK], 'f32');
  const experts = c.out([T, topK], 'i32');
  if (T > 0) {
    c.rt.launch('k_moe_route', [Math.ceil(T / MOE_ROUTE_WARPS), 1, 1], 32 * MOE_ROUTE_WARPS, 0, [
      ['p', l.addr], ['i', DT_CODE[l.dtype]], ['p', weights.addr], ['p', experts.addr], ['i', T], ['i', E], ['i', topK],
      ['i', renormalize ? 1 : 0]]);
  }
  return { weights, experts };
}

export function moeFfn(c: CudaOpContext, x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor,
  act: Activation): Tensor {
  const op = 'moeFfn';
  c.assertOpen(op);
  const a = c.arg(op, 'x', x, ACTS, 2);
  const rw = c.arg(op, 'routing.weights', routing.weights, ['f32'], 2);
  const re = c.arg(op, 'routing.experts', routing.experts, I32, 2);
  const g = c.arg(op, 'gate', gate, FLOAT, 3);
  const u = c.arg(op, 'up', up, FLOAT, 3);
  const d = c.arg(op, 'down', down, FLOAT, 3);
  const { T, D, E, I, K } = moeShapes(op, a, rw, re, g, u, d);
  const code = ACT_CODE[act];
  if (code === undefined) throw opError(op, `unknown activation ${String(act)}`);
  const y = c.out([T, D]);
  if (T === 0 || D === 0) return y;
  // (pool blocks are 256-byte aligned, so the hidden scratch needs no check)
  const vec = moeKernels.value === 'vec' && moeVecKernelsApply([a, g, u, d].map((t) => t.dtype), D, I) &&
    [a.addr, g.addr, u.addr, d.addr].every((p) => p % 16 === 0);
  if (vec && moeRunsGrouped(T, E, K)) {
    moeFfnGrouped(c, { a, rw, re, g, u, d, y }, { T, D, E, I, K }, code);
    return y;
  }
  const hiddenBytes = Math.max(T * K * I * 4, 4);
  const hidden = c.pool.alloc(hiddenBytes).addr;
  // grids of T, K, D and I only (graph-friendly): a warp an output row, T K (or T) pairs in y
  const hiddenGrid: [number, number, number] = [Math.ceil(I / MOE_ROWS_PER_BLOCK), Math.min(T * K, MAX_GRID_Y), 1];
  const downGrid: [number, number, number] = [Math.ceil(D / MOE_ROWS_PER_BLOCK), Math.min(T, MAX_GRID_Y), 1];
  if (vec) {
    c.rt.launch('k_moe_hidden_v', hiddenGrid, MOE_THREADS, 0, [
      ['p', a.addr], ['p', re.addr], ['p', g.addr], ['p', u.addr], ['p', hidden], ['i', T * K], ['i', K], ['i', D],
      ['i', I], ['i', E], ['i', code], ['p', c.errWord]]);
    c.rt.launch('k_moe_down_v', downGrid, MOE_THREADS, 0, [
      ['p', hidden], ['p', rw.addr], ['p', re.addr], ['p', d.addr], ['p', y.addr], ['i', T], ['i', K], ['i', D],
      ['i', I], ['i', E]]);
  } else {
    c.rt.launch('k_moe_hidden', hiddenGrid, MOE_THREADS, 0, [
      ['p', a.addr], ['i', DT_CODE[a.dtype]], ['p', re.addr], ['p', g.addr], ['i', DT_CODE[g.dtype]], ['p', u.addr],
      ['i', DT_CODE[u.dtype]], ['p', hidden], ['i', T * K], ['i', K], ['i', D], ['i', I], ['i', E], ['i', code],
      ['p', c.errWord]]);
    c.rt.launch('k_moe_down', downGrid, MOE_THREADS, 0, [
      ['p', hidden], ['p', rw.addr], ['p', re.addr], ['p', d.addr], ['i', DT_CODE[d.dtype]], ['p', y.addr], ['i', T],
      ['i', K], ['i', D], ['i', I], ['i', E]]);
  }
  c.pool.release(hidden, hiddenBytes);
  return y;
}

/**
 * moeFfn grouped by expert, in passes of up to MOE_PASS_ROWS tokens: per pass k_moe_group
 * (one block: the chunk's pairs by expert), then k_moe_hidden_g and k_moe_down_g over the active
 * experts (grid y: at most min(E, pairs) of them), then k_moe_combine (a token's pairs in k order).
 */
function moeFfnGrouped(c: CudaOpContext, t: { a: CudaTensor; rw: CudaTensor; re: CudaTensor; g: CudaTensor; u: CudaTensor;
  d: CudaTensor; y: CudaTensor }, s: { T: number; D: number; E: number; I: number; K: number }, act: number): void {
  const { T, D, E, I, K } = s;
  const [hiddenBytes, ypairBytes, grpBytes] = moeGroupedScratch(T, K, D, I);
  const hidden = c.pool.alloc(hiddenBytes).addr, ypair = c.pool.alloc(ypairBytes).addr, grp = c.pool.alloc(grpBytes).addr;
  const passRows = MOE_PASS_ROWS.value;
  const tc = tcMinRows.value > 0 && T >= tcMinRows.value;
  const tcDown = tcDownMinRows.value > 0 && T >= tcDownMinRows.value;
  for (let t0 = 0; t0 < T; t0 += passRows) {
    const Tc = Math.min(passRows, T - t0), TKc = Tc * K;
    const x = t.a.addr + t0 * D * 2, experts = t.re.addr + t0 * K * 4, weights = t.rw.addr + t0 * K * 4;
    const y = t.y.addr + t0 * D * 2;
    const gridY = Math.min(E, TKc, MAX_GRID_Y);
    c.rt.launch('k_moe_group', [1, 1, 1], MOE_GROUP_THREADS, 0, [
      ['p', experts], ['i', TKc], ['i', K], ['i', E], ['i', I], ['i', t0], ['p', grp], ['p', hidden], ['p', c.errWord]]);
    const hiddenKernel = tc ? 'k_moe_hidden_tc' : hiddenRows.value === 2 ? 'k_moe_hidden_g2' : 'k_moe_hidden_g';
    c.rt.launch(hiddenKernel, tc ? [Math.ceil(I / MOE_TC_ROWS), gridY, 1]
      : [Math.ceil(I / (MOE_ROWS_PER_BLOCK * hiddenRows.value)), gridY, 1], tc ? MOE_TC_THREADS : MOE_THREADS, 0, [
      ['p', x], ['p', grp], ['p', t.g.addr], ['p', t.u.addr], ['p', hidden], ['i', TKc], ['i', K], ['i', D], ['i', I],
      ['i', act]]);
    const down = tcDown ? 'k_moe_down_tc' : downRows.value === 4 ? 'k_moe_down_g4' : 'k_moe_down_g';
    c.rt.launch(down, tcDown ? [Math.ceil(D / MOE_TC_ROWS), gridY, 1]
      : [Math.ceil(D / (MOE_ROWS_PER_BLOCK * downRows.value)), gridY, 1], tcDown ? MOE_TC_THREADS : MOE_THREADS, 0, [
      ['p', hidden], ['p', grp], ['p', t.d.addr], ['p', ypair], ['i', TKc], ['i', D], ['i', I]]);
    c.rt.launch('k_moe_combine', elementwiseGrid(Tc * D), ELEMWISE_THREADS, 0, [
      ['p', ypair], ['p', weights], ['p', experts], ['p', y], ['i', Tc], ['i', K], ['i', D], ['i', E]]);
  }
  c.pool.release(grp, grpBytes);
  c.pool.release(ypair, ypairBytes);
  c.pool.release(hidden, hiddenBytes);
}
