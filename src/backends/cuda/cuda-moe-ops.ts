// The CUDA backend's mixture-of-experts ops (Backend.moeRoute, moeFfn): top-k routing of each
// token's expert logits, then each token's experts' GLU FFN weighted by its routing weights: per
// (token, expert) pair in two kernels through an f32 hidden scratch, or from
// CudaMoeSettings.groupedMinRows tokens grouped by expert in four kernels a pass (moeFfnGrouped);
// which kernels run is the backend's CudaMoeSettings (c.settings.moe; in batch-invariant mode the
// same for every row count: moe-kernels.ts moeFfnPath). Separate from
// cuda-backend.ts because only MoE models reach them; their argument checks are the op rules'
// (common/op-shapes.ts) but for the router's expert limit.
import type { Activation, MoeRouting, Tensor } from '../../contracts/backend.ts';
import * as shapes from '../common/op-shapes.ts';
import { type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid, MAX_GRID_Y } from './cuda-op-context.ts';
import { ACT_CODE, type CudaTensor, DT_CODE } from './cuda-tensor.ts';
import {
  MOE_GROUP_THREADS, MOE_ROUTE_MAX_EXPERTS, MOE_ROUTE_WARPS, MOE_ROWS_PER_BLOCK,
  MOE_TC_ROWS, MOE_TC_THREADS, MOE_THREADS, type MoeFfnPath, moeFfnPath, moeGroupedScratch, moeVecKernelsApply,
} from './moe-kernels.ts';
import { describe, opError } from './validate.ts';

export function moeRoute(c: CudaOpContext, logits: Tensor, topK: number, renormalize: boolean): MoeRouting {
  const op = 'moeRoute';
  const { logits: l, T, E } = shapes.moeRoute(c.checks, logits, topK);
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
  const {
    x: a, weights: rw, experts: re, gate: g, up: u, down: d, T, D, E, I, K,
  } = shapes.moeFfn(c.checks, x, routing, gate, up, down, act);
  // experts load stacked, dequantized (loadStacked keeps no FP8 matrix)
  for (const [name, t] of [['gate', g], ['up', u], ['down', d]] as const) {
    if (t.dtype === 'fp8') throw opError('moeFfn', `${name} is ${describe(t)}: FP8 experts are not multiplied as FP8`);
  }
  const code = ACT_CODE[act];
  const y = c.out([T, D]);
  if (T === 0 || D === 0) return y;
  // (pool blocks are 256-byte aligned, so the hidden scratch needs no check)
  const moe = c.settings.moe;
  const vec = moe.kernels === 'vec' && moeVecKernelsApply([a, g, u, d].map((t) => t.dtype), D, I) &&
    [a.addr, g.addr, u.addr, d.addr].every((p) => p % 16 === 0);
  const path = moeFfnPath(T, E, K, moe, c.settings.batchInvariant);
  if (vec && path.grouped) {
    moeFfnGrouped(c, { a, rw, re, g, u, d, y }, { T, D, E, I, K }, code, path);
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
 * moeFfn grouped by expert, in passes of up to CudaMoeSettings.passRows tokens: per pass k_moe_group
 * (one block: the chunk's pairs by expert), then k_moe_hidden_g and k_moe_down_g over the active
 * experts (grid y: at most min(E, pairs) of them), then k_moe_combine (a token's pairs in k order).
 */
function moeFfnGrouped(c: CudaOpContext, t: { a: CudaTensor; rw: CudaTensor; re: CudaTensor; g: CudaTensor; u: CudaTensor;
  d: CudaTensor; y: CudaTensor }, s: { T: number; D: number; E: number; I: number; K: number }, act: number,
  path: MoeFfnPath): void {
  const { T, D, E, I, K } = s;
  const moe = c.settings.moe;
  const [hiddenBytes, ypairBytes, grpBytes] = moeGroupedScratch(T, K, D, I, moe);
  const hidden = c.pool.alloc(hiddenBytes).addr, ypair = c.pool.alloc(ypairBytes).addr, grp = c.pool.alloc(grpBytes).addr;
  const { passRows, hiddenRows, downRows } = moe;
  // prefill-sized groups on tensor cores (gate/up from tcMinRows tokens, down from tcDownMinRows;
  // batch-invariant mode: at every row count, moeFfnPath)
  const { tc, tcDown } = path;
  for (let t0 = 0; t0 < T; t0 += passRows) {
    const Tc = Math.min(passRows, T - t0), TKc = Tc * K;
    const x = t.a.addr + t0 * D * 2, experts = t.re.addr + t0 * K * 4, weights = t.rw.addr + t0 * K * 4;
    const y = t.y.addr + t0 * D * 2;
    const gridY = Math.min(E, TKc, MAX_GRID_Y);
    c.rt.launch('k_moe_group', [1, 1, 1], MOE_GROUP_THREADS, 0, [
      ['p', experts], ['i', TKc], ['i', K], ['i', E], ['i', I], ['i', t0], ['p', grp], ['p', hidden], ['p', c.errWord]]);
    const hiddenKernel = tc ? 'k_moe_hidden_tc' : hiddenRows === 2 ? 'k_moe_hidden_g2' : 'k_moe_hidden_g';
    c.rt.launch(hiddenKernel, tc ? [Math.ceil(I / MOE_TC_ROWS), gridY, 1]
      : [Math.ceil(I / (MOE_ROWS_PER_BLOCK * hiddenRows)), gridY, 1], tc ? MOE_TC_THREADS : MOE_THREADS, 0, [
      ['p', x], ['p', grp], ['p', t.g.addr], ['p', t.u.addr], ['p', hidden], ['i', TKc], ['i', K], ['i', D], ['i', I],
      ['i', act]]);
    const down = tcDown ? 'k_moe_down_tc' : downRows === 4 ? 'k_moe_down_g4' : 'k_moe_down_g';
    c.rt.launch(down, tcDown ? [Math.ceil(D / MOE_TC_ROWS), gridY, 1]
      : [Math.ceil(D / (MOE_ROWS_PER_BLOCK * downRows)), gridY, 1], tcDown ? MOE_TC_THREADS : MOE_THREADS, 0, [
      ['p', hidden], ['p', grp], ['p', t.d.addr], ['p', ypair], ['i', TKc], ['i', D], ['i', I]]);
    c.rt.launch('k_moe_combine', elementwiseGrid(Tc * D), ELEMWISE_THREADS, 0, [
      ['p', ypair], ['p', weights], ['p', experts], ['p', y], ['i', Tc], ['i', K], ['i', D], ['i', E]]);
  }
  c.pool.release(grp, grpBytes);
  c.pool.release(ypair, ypairBytes);
  c.pool.release(hidden, hiddenBytes);
}
