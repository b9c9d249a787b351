// The backend interface: the only thing model graphs and the execution layer know about a device.
//
// Semantics are those of a CUDA stream: every op is *enqueued* and returns at once with a handle
// to its (future) result; ops run in enqueue order; only `read`/`sync` wait, and they are async so
// the Node event loop never blocks on compute. A backend decides its activation dtype (f32 on the
// CPU, bf16 on CUDA); model code never names a dtype for activations.
//
// Layout conventions (all row-major, contiguous):
//   activations  [T, D]          T = tokens of the flattened step batch (all rows together)
//   weights      [N, K]          Hugging Face nn.Linear layout (out_features, in_features)
//   heads        [T, H, headDim]
//   paged KV     [numBlocks, blockSize, kvHeads, headDim], one pool for K and one for V per layer

import type { DeviceSampleRow } from './device-sampling.ts';

/**
 * Element types. 'int8' and 'fp8' (e4m3) are KV pool dtypes: every row along the last dimension
 * (one token's keys or values of one kv head) is its one-byte values followed by the row's f32
 * scale (native/kv_format.h), so it takes rowBytes, not numel * dtypeBytes. 'fp8' is also the
 * dtype of the CUDA backend's FP8 matmul weights, whose bytes are the elements alone, their scales
 * a tensor of their own (cuda-tensor.ts CudaFp8Tensor).
 */
export type DType = 'f32' | 'f16' | 'bf16' | 'i32' | 'int8' | 'fp8';

/** the float dtypes of checkpoint tensors */
export type FloatDType = 'f32' | 'f16' | 'bf16';

/** bytes of one element (a row-scaled dtype's rows add their scale: rowBytes) */
export const dtypeBytes: Record<DType, number> = { f32: 4, f16: 2, bf16: 2, i32: 4, int8: 1, fp8: 1 };

/** whether each row of a tensor of this dtype carries an f32 scale after its elements */
export function isRowScaled(dtype: DType): boolean {
  return dtype === 'int8' || dtype === 'fp8';
}

/** bytes of one row of `lastDim` elements */
export function rowBytes(dtype: DType, lastDim: number): number {
  return lastDim * dtypeBytes[dtype] + (isRowScaled(dtype) ? 4 : 0);
}

/** bytes of a tensor of this shape and dtype */
export function tensorBytes(shape: readonly number[], dtype: DType): number {
  if (!isRowScaled(dtype)) return numel(shape) * dtypeBytes[dtype];
  if (shape.length === 0) throw new Error(`a ${dtype} tensor needs a last dimension to scale its rows by`);
  return numel(shape.slice(0, -1)) * rowBytes(dtype, shape[shape.length - 1]!);
}

/** elements of a tensor of this shape (1 for a scalar) */
export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** An opaque device tensor. Backends attach their own fields; callers only read shape/dtype. */
export interface Tensor {
  readonly shape: readonly number[];
  readonly dtype: DType;
}

/** Raw little-endian tensor bytes inside a file (a safetensors payload, a GGUF tensor). */
export interface WeightSource {
  path: string;
  /** absolute byte offset of the first element in the file */
  offset: number;
  dtype: FloatDType;
  shape: number[];
  /** human-readable name for error messages, e.g. "model.layers.0.self_attn.q_proj.weight" */
  name: string;
  /**
   * Present when the file's bytes are not the values as they stand (GGUF: quantized blocks, or
   * rows stored permuted): the whole tensor's values in `dtype` (the source's own, or f32 for a
   * load `as` f32), computed on the host when the backend loads it. `offset` is then where the
   * raw bytes sit, and a byte range of the tensor maps to the same element range of the result.
   */
  decode?: (dtype: 'f32' | 'f16' | 'bf16') => Uint8Array;
  /**
   * GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 matrices (2-D, rows of whole blocks): the file's ggml blocks, rows
   * in the order of `shape` (llama.cpp's q/k permutation undone), for a backend that keeps such
   * matmul weights quantized (the CPU backend, `loadWeight(.., 'keep', 'matmul')`); `decode` still
   * gives the values for every other use.
   */
  quantized?: { type: QuantizedType; blocks: () => Uint8Array };
  /**
   * FP8 (e4m3) matrices of an FP8 checkpoint (2-D, K a multiple of 16): the e4m3 bytes [N, K] and
   * an f32 scale per row per `scaleCols` columns (a power of two, 16 or more), [N, ceil(K /
   * scaleCols)] (the checkpoint's tensor, row or block scales laid out so), for a backend that
   * multiplies FP8 (the CUDA backend, `loadWeight(.., 'keep')`); `decode` still gives the
   * dequantized values.
   */
  fp8?: () => Fp8Matrix;
  /** with `fp8`: the `scaleCols` its matrix will have, known from the headers (the fit planner's sizes) */
  fp8ScaleCols?: number;
}

/** An FP8 matrix's bytes and scales (WeightSource.fp8). */
export interface Fp8Matrix {
  /** e4m3 bytes [N, K] */
  bits: Uint8Array;
  /** f32 [N, ceil(K / scaleCols)]: each row's scale for each scaleCols of its columns */
  scales: Float32Array;
  /** a power of two, >= 16 */
  scaleCols: number;
}

/** ggml types a backend may keep quantized (WeightSource.quantized) */
export type QuantizedType = 'Q8_0' | 'Q4_0' | 'Q4_K' | 'Q6_K' | 'Q5_K' | 'IQ4_XS' | 'Q4_1' | 'Q5_1';

export type Activation = 'silu' | 'gelu_tanh' | 'gelu';

/** Paged KV storage of one attention layer. */
export interface PagedKv {
  k: Tensor; // [numBlocks, blockSize, kvHeads, headDim]
  v: Tensor; // [numBlocks, blockSize, kvHeads, headDim]
}

/**
 * Where every token of a step sits. Built once per step per KV group (full / sliding layers may
 * have different block tables) and shared by all layers of that group.
 */
export interface StepLayout {
  /** i32 [T]: which batch row each token belongs to */
  tokenRow: Tensor;
  /** i32 [T]: absolute position of each token in its sequence */
  tokenPos: Tensor;
  /** i32 [T]: flat KV slot (block * blockSize + pos % blockSize) the token's K/V are written to */
  slots: Tensor;
  /** i32 [R, maxBlocksPerRow]: physical block of each logical block; -1 where not held */
  blockTables: Tensor;
  blockSize: number;
  /**
   * true: no two tokens of the step share a row (the decode graphs' layouts, whose tokenRow is
   * 0 .. B-1), so a backend may leave out work that only rows of several tokens need (the CUDA
   * backend's prefill attention kernel). Absent or false: no promise. Whoever sets it must keep it:
   * a backend does not check it on the device.
   */
  oneTokenPerRow?: boolean;
}

/** The host arrays a StepLayout is uploaded from (graph replays copy them into fixed buffers). */
export interface HostStepLayout {
  tokenRow: Int32Array;
  tokenPos: Int32Array;
  slots: Int32Array;
  /** [rows, maxBlocks], -1 where not held */
  blockTables: Int32Array;
  maxBlocks: number;
  blockSize: number;
}

export interface AttentionParams {
  /** multiplier applied to q·k before the softmax */
  scale: number;
  /** 0 = full causal attention; W > 0 = a query at position p sees keys at p-W+1 .. p */
  window: number;
  /** 0 = none; else scores = cap * tanh(scores / cap) before the softmax */
  softcap: number;
}

export interface MoeRouting {
  weights: Tensor; // f32 [T, topK]
  experts: Tensor; // i32 [T, topK]
}

export interface Backend {
  readonly name: 'reference' | 'cpu' | 'cuda';
  /** dtype the backend keeps activations in (f32 on CPU) */
  readonly activationDtype: DType;
  /**
   * dtypes its paged KV pools may hold (writeKv, attention, block reads and writes); absent:
   * activationDtype only. The CPU backend: f32 and bf16 (half the bytes a decode step reads).
   */
  readonly kvDtypes?: readonly DType[];

  // ---- memory ------------------------------------------------------------------------------
  /**
   * Copies host data to the device. f32 data stays f32 (rope tables must keep f32 precision) and
   * every op accepts f32 inputs beside activationDtype ones; i32 stays i32.
   */
  upload(data: Float32Array | Int32Array, shape: readonly number[]): Tensor;
  /**
   * Loads a weight from a file without passing it through the JS heap. `as` = 'keep' keeps the
   * stored dtype (for matmul weights), 'f32' converts (norm weights, biases, small vectors).
   * `use` = 'matmul': the tensor will only ever be a matmul's w or an embedding's table, so the
   * backend may keep it in a layout of its own (the CPU backend's bf16 panels); its dtype and
   * shape stay as stored.
   */
  loadWeight(src: WeightSource, as: 'keep' | 'f32', use?: 'matmul'): Promise<Tensor>;
  /** Loads rows [rowStart, rowStart+rows) of a 2-D (or leading dim of an N-D) weight. */
  loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor>;
  /** Stacks equally shaped weights into one [n, ...shape] tensor (MoE experts). */
  loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor>;
  /** Zero-filled tensor (KV pools). */
  zeros(shape: readonly number[], dtype: DType): Tensor;
  /** A view with a different shape over the same contiguous memory (same element count). */
  reshape(t: Tensor, shape: readonly number[]): Tensor;
  /** Waits for every enqueued op, then copies the tensor to the host (f32 or i32). */
  read(t: Tensor): Promise<Float32Array | Int32Array>;
  /**
   * Copies blocks (indices along dim 0) of a KV pool `pool` [numBlocks, ...] to the host, as they
   * are once every op enqueued before this call has run; ops enqueued after it never affect the
   * result. Resolves to the raw little-endian bytes of pool.dtype, [blocks.length, ...pool.shape
   * minus dim 0], blocks in the order given (repeats allowed). Throws (or rejects) for a block
   * outside [0, numBlocks). The prefix cache's SSD tier spills with it; optional (with
   * writeBlocks): a backend without them runs without the SSD tier.
   */
  readBlocks?(pool: Tensor, blocks: readonly number[]): Promise<Uint8Array>;
  /**
   * Enqueues a copy of `data` (raw little-endian bytes of pool.dtype, [blocks.length, ...pool.shape
   * minus dim 0]) into those blocks of `pool`, ordered with the other ops. `data` may be reused or
   * changed as soon as this returns (the backend stages it). Blocks must be distinct and inside
   * [0, numBlocks). The SSD tier restores cached prefixes with it.
   */
  writeBlocks?(pool: Tensor, blocks: readonly number[], data: Uint8Array): void;
  /** Frees the tensor once the ops enqueued before this call have run. Views free nothing. */
  free(t: Tensor): void;
  /**
   * Device memory as its driver reports it (free now, other processes included; total). Only
   * backends with memory of their own (CUDA) have it; the CPU backends use the host's RAM.
   */
  memoryInfo?(): { free: number; total: number };
  /** Waits until every enqueued op has run; rejects with the first op error, if any. */
  sync(): Promise<void>;
  /**
   * Resolves once every op can run; rejects when the backend cannot get there. Only a backend that
   * finishes its setup in the background has it (CUDA created with kernels: 'background' compiles
   * its kernels while weights load); the load* methods work before it resolves, other ops may not.
   */
  ready?(): Promise<void>;
  /** Releases every resource; the backend is unusable afterwards. */
  close(): Promise<void>;

  /**
   * Scopes bound the lifetime of intermediates: every tensor created by an op or `upload` while
   * a scope is open belongs to the innermost scope; `endScope` frees all of them except `keep`,
   * which move to the enclosing scope (or become unowned when none is open).
   */
  beginScope(): void;
  endScope(keep?: readonly Tensor[]): void;

  // ---- ops (enqueued; each returns a new tensor in activationDtype unless stated) -----------
  /** rows of `table` [V, D] (f32, f16 or bf16) picked by `ids` i32 [T], times `scale` -> [T, D] */
  embedding(table: Tensor, ids: Tensor, scale: number): Tensor;
  /** x [M, K] · w [N, K]^T (+ bias [N]) -> [M, N]; w may be f32, f16 or bf16 */
  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor;
  /** over the last dim: y = x / sqrt(mean(x^2) + eps) * (weightOffset + w); x [..., D], w [D] */
  rmsnorm(x: Tensor, w: Tensor, eps: number, weightOffset: number): Tensor;
  /** a + bScale * b, same shapes */
  add(a: Tensor, b: Tensor, bScale: number): Tensor;
  /** x * s */
  scale(x: Tensor, s: number): Tensor;
  /** act(gate) * up, same shapes */
  glu(gate: Tensor, up: Tensor, act: Activation): Tensor;
  /**
   * Rotary embedding, rotate-half (GPT-NeoX / HF llama) convention, on the first
   * 2 * invFreq.length dims of every head; the rest pass through.
   * x [T, H, headDim], pos i32 [T], invFreq f32 [rotaryDim / 2] shared by every token, or
   * [T, rotaryDim / 2] with one table per token (length-dependent rope — dynamic NTK, LongRoPE —
   * where each batch row's table follows its own length); cos/sin are multiplied by
   * attentionScaling (YaRN / LongRoPE magnitude correction; 1 otherwise).
   */
  rope(x: Tensor, pos: Tensor, invFreq: Tensor, attentionScaling: number): Tensor;
  /** writes k, v [T, kvHeads, headDim] into the pools at layout.slots (slot -1 = skip) */
  writeKv(kv: PagedKv, k: Tensor, v: Tensor, layout: StepLayout): void;
  /**
   * Causal attention of q [T, H, headDim] over the paged KV of each token's row, reading keys at
   * positions 0..tokenPos (limited by the window) through the row's block table. GQA: query head
   * h reads KV head floor(h / (H / kvHeads)). A token at position -1 (graph padding) reads no
   * key and gets zeros, without an error. -> [T, H, headDim]
   */
  attention(q: Tensor, kv: PagedKv, layout: StepLayout, params: AttentionParams): Tensor;
  /** cap * tanh(x / cap) */
  softcap(x: Tensor, cap: number): Tensor;
  /** x [T, D], idx i32 [R] -> [R, D] */
  gatherRows(x: Tensor, idx: Tensor): Tensor;
  /**
   * softmax over experts (f32), top-k (ties: lower expert index first), then, when `renormalize`,
   * divide the k weights by their sum. logits [T, E].
   */
  moeRoute(logits: Tensor, topK: number, renormalize: boolean): MoeRouting;
  /**
   * sum over k of weight_k * down_e(act(gate_e(x)) * up_e(x)) with e = experts[t, k].
   * x [T, D]; gate/up [E, I, D]; down [E, D, I] -> [T, D]
   */
  moeFfn(x: Tensor, routing: MoeRouting, gate: Tensor, up: Tensor, down: Tensor, act: Activation): Tensor;

  // ---- optional packed weights and fused ops ------------------------------------------------
  // A backend with all of these (hasFusedOps) lets the model load q/k/v and gate/up packed, run one
  // GEMM for each, and fuse the small ops around them: fewer launches and fewer passes over the
  // activations, which is what decode on a GPU is bound by once the weights stream at full speed.
  // Each op equals the composition of plain ops its comment states.

  /** Loads sources whose shapes differ only in dim 0 as one tensor, concatenated along dim 0. */
  loadConcat?(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor>;
  /** A view of rows [start, start + rows) along dim 0 (contiguous memory; frees nothing). */
  rowView?(t: Tensor, start: number, rows: number): Tensor;
  /** sum = add(x, r, rScale) and normed = rmsnorm(sum, w, eps, weightOffset), in one pass. */
  addRmsnorm?(x: Tensor, r: Tensor, rScale: number, w: Tensor, eps: number, weightOffset: number): { sum: Tensor; normed: Tensor };
  /** glu(gu[:, 0:I], gu[:, I:2I], act) for gu [T, 2I] -> [T, I] */
  gluPacked?(gu: Tensor, act: Activation): Tensor;
  /**
   * matmul(gluPacked(gu, act), w, bias): the dense MLP's down projection of packed gate/up rows. A
   * backend may fuse the GLU into the GEMM (CUDA: into its decode GEMV kernels); not part of
   * FusedOps, the model uses it where a backend has it.
   */
  gluMatmul?(gu: Tensor, act: Activation, w: Tensor, bias?: Tensor): Tensor;
  /**
   * addRmsnorm(x, r, rScale, normW, eps, weightOffset), then y = matmul(normed, w, bias): the norm
   * whose only reader is a GEMM (the MLP's gate/up after attention). A backend may fuse the norm
   * into the GEMM (CUDA: into its decode GEMV kernels); not part of FusedOps.
   */
  addRmsnormMatmul?(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, w: Tensor,
    bias?: Tensor): { sum: Tensor; y: Tensor };
  /**
   * addRmsnorm(x, r, rScale, normW, eps, weightOffset), then y = gluPacked(matmul(normed, gateUp),
   * act) [T, I] for packed gate/up rows gateUp [2I, D]: the dense MLP up to its down projection. A
   * backend may run all three as one GEMV with the GLU in its epilogue (CUDA, opt-in); not part of
   * FusedOps.
   */
  addRmsnormGateUpGlu?(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number,
    gateUp: Tensor, act: Activation): { sum: Tensor; y: Tensor };
  /**
   * addRmsnorm(x, r, rScale, normW, eps, weightOffset), then q = ropeQkvWriteKv(matmul(normed, qkv),
   * heads, pos, invFreq, attentionScaling, no qk-norm, kv, layout): the attention block up to its
   * attention, for packed q/k/v rows without bias or qk-norm. A backend may run it as one GEMV with
   * rope and the KV write in its epilogue (CUDA, opt-in); not part of FusedOps.
   */
  addRmsnormQkvRope?(x: Tensor, r: Tensor, rScale: number, normW: Tensor, eps: number, weightOffset: number, qkv: Tensor,
    heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number, kv: PagedKv, layout: StepLayout): { sum: Tensor; q: Tensor };
  /**
   * qkv [T, (H + 2 KVH) * D]: each token's q heads, then k heads, then v heads. Per-head rmsnorm
   * of q and k (when `qkNorm` is given), rope of q and k, k and v written to `kv` at layout.slots;
   * returns q [T, H, D]. Equals reshape + rmsnorm + rope + writeKv of the plain ops.
   */
  ropeQkvWriteKv?(qkv: Tensor, heads: QkvHeads, pos: Tensor, invFreq: Tensor, attentionScaling: number,
    qkNorm: QkNorm | undefined, kv: PagedKv, layout: StepLayout): Tensor;

  /**
   * Optional: index of the largest value of each row of x [R, V] (lowest index on ties, NaN never
   * chosen; -1 for a row with nothing above -Infinity) -> i32 [R]. Greedy rows then read back one
   * id instead of V logits.
   */
  argmax?(x: Tensor): Tensor;

  /**
   * Optional: samples one token per row of logits [P, V] (f32 or activationDtype) on the device,
   * with exactly the host sampler's semantics (contracts/device-sampling.ts): penalties, bias,
   * grammar mask, temperature, top-k, top-p, min-p, and a draw with the row's host-made uniform
   * `u`; plus logprobs of the raw row when asked. rows.length === P. Everything the rows carry
   * travels in one packed upload. -> i32 [P, 2 + 2K] (decodeSampleResults reads it), K = the
   * largest topLogprobs asked (0 when none). Enqueued like every op; nothing waits.
   */
  sampleRows?(logits: Tensor, rows: readonly DeviceSampleRow[]): Tensor;

  // ---- optional graph capture (decode steps replayed without re-enqueuing every op) ----------
  /**
   * Records the ops `body` enqueues (nothing runs) into a graph that `replay` enqueues again as
   * one unit. The body may only read tensors that outlive the graph (weights, KV pools, inputs it
   * was given) and may not upload, read or free them; the intermediates it makes belong to the
   * graph, and so do the returned outputs, rewritten by every replay. Inputs change between
   * replays through `copyInto`. Must be called with no scope open.
   */
  captureGraph?(body: () => Tensor[]): CapturedGraph;
  /** Enqueues a copy of host `data` into the existing tensor `t` (same element count and kind). */
  copyInto?(t: Tensor, data: Float32Array | Int32Array): void;
  /**
   * Enqueues a copy of the device tensor `src` into the existing tensor `t` (same dtype and element
   * count), ordered with the other ops. How a graph's fixed inputs take values that never left the
   * device: a pipelined decode step's ids are the previous step's greedy picks.
   */
  copyTensor?(t: Tensor, src: Tensor): void;
}

export interface CapturedGraph {
  readonly outputs: readonly Tensor[];
  /** enqueues the recorded ops */
  replay(): void;
  /** frees the graph and its memory once enqueued work has run */
  dispose(): void;
}

export interface QkvHeads {
  heads: number;
  kvHeads: number;
  headDim: number;
}

/** per-head rmsnorm of q and k (weights [headDim]) */
export interface QkNorm {
  q: Tensor;
  k: Tensor;
  eps: number;
  weightOffset: number;
}

/** The packed-weight and fused ops together (a backend has all or none of them in use). */
export type FusedOps = Required<Pick<Backend, 'loadConcat' | 'rowView' | 'addRmsnorm' | 'gluPacked' | 'ropeQkvWriteKv'>>;

export function hasFusedOps(b: Backend): b is Backend & FusedOps {
  return !!(b.loadConcat && b.rowView && b.addRmsnorm && b.gluPacked && b.ropeQkvWriteKv);
}
