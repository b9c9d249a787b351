// Loads build/libllmts_cpu.so through koffi and exposes its functions with TypeScript types.
//
// Addresses cross the boundary as int64 numbers (x86-64 user addresses fit in 53 bits), so a view
// is just base + offset in JS. Every llm_op_* call only enqueues (~0.1 us); waits go through
// koffi's `.async` on a worker thread so the event loop never blocks.
import { existsSync } from 'node:fs';
import koffi from 'koffi';

import type { DType } from '../../contracts/backend.ts';
import { type CpuSettings, cpuSettingsFrom } from './cpu-settings.ts';

/** dtype codes of native/llm.h (int8 and fp8: DT_KV_INT8 / DT_KV_FP8, the row-scaled KV pools of native/kv_format.h) */
export const DT_CODE: Record<DType, number> = { f32: 0, f16: 1, bf16: 2, i32: 3, int8: 9, fp8: 10 };
/** native/llm.h's DT_BF16_P16: bf16 weights in 16-row panels of k pairs (native/weight_pack.c) */
export const DT_BF16_P16 = 4;
/** native/llm.h's DT_Q8_0_P16 .. DT_Q6_K_P16, DT_Q5_K_P16 .. DT_Q5_1_P16: GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 weights kept quantized in 16-row panels (native/quant_pack.c) */
export const DT_Q8_0_P16 = 5;
export const DT_Q4_0_P16 = 6;
export const DT_Q4_K_P16 = 7;
export const DT_Q6_K_P16 = 8;
export const DT_Q5_K_P16 = 11;
export const DT_IQ4_XS_P16 = 12;
export const DT_Q4_1_P16 = 13;
export const DT_Q5_1_P16 = 14;
/** native/llm.h's ISA_AVX512_BF16 */
export const ISA_AVX512_BF16 = 3;
export const ACT_CODE = { silu: 0, gelu_tanh: 1, gelu: 2 } as const;

type Addr = number;
type HostArray = Float32Array | Int32Array | Uint32Array | Uint16Array | Uint8Array;
type AsyncFn<A extends unknown[]> = (...args: [...A, (err: unknown, rc: number) => void]) => void;

export interface NativeLib {
  readonly path: string;
  init(): number;
  /** drains the queue and joins the worker thread (process exit) */
  shutdown(): void;
  setIsa(level: number): number;
  /** the ISA the kernels run now (ISA_* of native/llm.h) */
  isa(): number;
  /** weight bytes below which small-M matmuls run on one thread; -1 = default (tests) */
  setGemvParallelMinBytes(bytes: number): void;
  alloc(bytes: number): Addr;
  freeNow(addr: Addr): void;
  writeNow(dst: Addr, src: HostArray, bytes: number): void;
  readNow(src: Addr, dst: HostArray, bytes: number): void;
  fence(): number;
  /** async: (fence, cb(err, rc)); rc 0, or the sequence number of the first failed op <= fence (then lastError()) */
  waitAsync: AsyncFn<[number]>;
  lastError(): string;
  /** async: (path, fileOffset, nbytes, dst, srcDtype, dstDtype, cb(err, rc)); rc 0 or negative code */
  readFileAsync: AsyncFn<[string, number, number, Addr, number, number]>;

  opFree(addr: Addr): void;
  opCopy(src: Addr, dst: Addr, bytes: number): void;
  opUpload(dst: Addr, src: HostArray, bytes: number): number;
  opZero(dst: Addr, bytes: number): void;
  /** enqueues dst[k] = src row idx[k]; returns 0 or -1 (out of memory) */
  opReadRows(src: Addr, dst: Addr, idx: Int32Array, n: number, rowBytes: number, srcRows: number): number;
  /** stages `data` now, enqueues dst row idx[k] = data row k; returns 0 or -1 (out of memory) */
  opWriteRows(dst: Addr, data: HostArray, idx: Int32Array, n: number, rowBytes: number, dstRows: number): number;
  /** enqueues dst (p16Bytes(N, K) bytes) = the bf16 matrix src [N][K] (K even) in panels */
  opPackBf16P16(src: Addr, dst: Addr, N: number, K: number): void;
  p16Bytes(N: number, K: number): number;
  /** enqueues dst (quantP16Bytes(N, K, dtype) bytes) = the ggml Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS blocks of src [N][K] (K % 32 == 0; the K-quants: % 256) in panels */
  opPackQuant(src: Addr, dst: Addr, N: number, K: number, dtype: number): void;
  quantP16Bytes(N: number, K: number, dtype: number): number;
  /** 1 when matmuls of quantized panels run the AVX512-VNNI kernel now, 0 for the portable one */
  quantVnni(): number;
  opMatmul(x: Addr, w: Addr, bias: Addr, y: Addr, M: number, N: number, K: number, wdtype: number): void;
  opEmbedding(table: Addr, ids: Addr, out: Addr, T: number, V: number, D: number, dtype: number, scale: number): void;
  opRmsnorm(x: Addr, w: Addr, out: Addr, rows: number, D: number, eps: number, offset: number): void;
  opAdd(a: Addr, b: Addr, out: Addr, n: number, bScale: number): void;
  opScale(x: Addr, out: Addr, n: number, s: number): void;
  opSoftcap(x: Addr, out: Addr, n: number, cap: number): void;
  opGlu(gate: Addr, up: Addr, out: Addr, n: number, act: number): void;
  opRope(x: Addr, pos: Addr, invFreq: Addr, out: Addr, T: number, H: number, D: number, half: number, invStride: number,
    attentionScaling: number): void;
  /** poolDtype: DT_CODE of the pools (f32, bf16, int8 or fp8: native/kv.c states each one's rounding); rowFloats = kvHeads * headDim */
  opWriteKv(kpool: Addr, vpool: Addr, k: Addr, v: Addr, slots: Addr, T: number, rowFloats: number,
    numSlots: number, poolDtype: number, headDim: number): void;
  opAttention(q: Addr, kpool: Addr, vpool: Addr, row: Addr, pos: Addr, tables: Addr, out: Addr, T: number,
    H: number, KVH: number, D: number, NB: number, BS: number, R: number, MBR: number, window: number,
    poolDtype: number, scale: number, softcap: number): void;
  opGatherRows(x: Addr, idx: Addr, out: Addr, R: number, T: number, rowBytes: number): void;
  /** out[r] = index of the largest value of row r of x [R, V] (f32), lowest on ties, -1 when none is above -Infinity */
  opArgmax(x: Addr, out: Addr, R: number, V: number): void;
  /**
   * Copies the packed rows (contracts/device-sampling.ts, `nwords` int32) now and enqueues the
   * sampling of logits [P, V] (dtype code) into out i32 [P, W]; returns 0 or -1 (out of memory)
   */
  opSampleRows(logits: Addr, dtype: number, packed: Int32Array, nwords: number, out: Addr, P: number, V: number,
    W: number): number;
  opMoeRoute(logits: Addr, weights: Addr, experts: Addr, T: number, E: number, topK: number, renorm: number): void;
  opMoeFfn(x: Addr, weights: Addr, experts: Addr, gate: Addr, up: Addr, down: Addr, out: Addr, T: number,
    K: number, D: number, I: number, E: number, gateDt: number, upDt: number, downDt: number, act: number): void;
}

/** native/llm.h ISA_AVX512: the best kernels without the bf16 dot products (CpuSettings.bf16Dot off) */
const ISA_AVX512 = 2;

/** The settings the library's process-wide knobs were last set to (applyNativeSettings). */
type NativeKnobs = Pick<CpuSettings, 'gemvParallelMinBytes' | 'bf16Dot'>;

const knobsOf = (s: NativeKnobs): NativeKnobs => ({ gemvParallelMinBytes: s.gemvParallelMinBytes, bf16Dot: s.bf16Dot });

let loaded: { lib: NativeLib; knobs: NativeKnobs } | null = null;

/**
 * Sets the library's process-wide knobs to `s` where they differ from what they were last set to
 * (so a backend created with the same settings leaves a test's llm_set_isa alone). Call while the
 * queue is idle: a backend is created before it enqueues anything.
 */
function applyNativeSettings(lib: NativeLib, s: NativeKnobs, last: NativeKnobs | null): void {
  if (last?.gemvParallelMinBytes !== s.gemvParallelMinBytes) lib.setGemvParallelMinBytes(s.gemvParallelMinBytes);
  if (last?.bf16Dot !== s.bf16Dot) lib.setIsa(s.bf16Dot ? -1 : ISA_AVX512);
}

/**
 * Loads the library once per process (the command queue and its worker thread are process-wide:
 * a later call's libraryPath is not loaded) and sets its knobs to `settings` (default: from the
 * environment on the first call, unchanged after).
 */
/** OpenMP spins before a thread sleeps, when the environment sets no wait policy (loadNativeLib). */
export const DEFAULT_GOMP_SPINCOUNT = 1000;

export function loadNativeLib(settings?: CpuSettings): NativeLib {
  if (loaded) {
    if (settings) {
      applyNativeSettings(loaded.lib, settings, loaded.knobs);
      loaded.knobs = knobsOf(settings);
    }
    return loaded.lib;
  }
  const s = settings ?? cpuSettingsFrom(process.env);
  const path = s.libraryPath;
  if (!existsSync(path)) {
    throw new Error(`CPU backend: native library ${path} is missing; build it with \`npm run build:native\` ` +
      '(needs gcc with OpenMP)');
  }
  // How long an OpenMP thread spins before it sleeps, unless the user chose: 1,000 spins (tens of
  // microseconds). A decode step runs a hundred or more team regions back to back; a thread that
  // sleeps at once is woken for each (a futex round trip, costly in a VM), and one that spins long
  // takes the core other work needs: at 3,000 spins a 2-core decode halved while another process
  // kept one core busy, where 1,000 cost 3% (libgomp's default is 300,000); on a quiet machine 1,000 decoded
  // 18-28% faster than sleeping at once (BENCHMARKS.md, "OpenMP wait"). libgomp reads it when it
  // is loaded, which is below.
  if (process.env.OMP_WAIT_POLICY === undefined && process.env.GOMP_SPINCOUNT === undefined) {
    process.env.GOMP_SPINCOUNT = String(DEFAULT_GOMP_SPINCOUNT);
  }
  const lib = koffi.load(path);
  const f = (decl: string) => lib.func(decl);
  const wait = f('int64_t llm_wait(int64_t fence)');
  const readFile = f('int llm_read_file(const char *path, int64_t off, int64_t nbytes, int64_t dst, int sdt, int ddt)');
  const i64 = 'int64_t';
  const native: NativeLib = {
    path,
    init: f('int llm_init()'),
    shutdown: f('void llm_shutdown()'),
    setIsa: f('int llm_set_isa(int level)'),
    isa: f('int llm_get_isa()'),
    setGemvParallelMinBytes: f('void llm_set_gemv_parallel_min_bytes(int64_t bytes)'),
    alloc: f('int64_t llm_alloc(int64_t bytes)'),
    freeNow: f('void llm_free_now(int64_t addr)'),
    writeNow: f('void llm_write_now(int64_t dst, const void *src, int64_t bytes)'),
    readNow: f('void llm_read_now(int64_t src, void *dst, int64_t bytes)'),
    fence: f('int64_t llm_fence()'),
    waitAsync: wait.async,
    lastError: f('const char *llm_last_error()'),
    readFileAsync: readFile.async,
    opFree: f('void llm_op_free(int64_t addr)'),
    opCopy: f('void llm_op_copy(int64_t src, int64_t dst, int64_t bytes)'),
    opUpload: f('int llm_op_upload(int64_t dst, const void *src, int64_t bytes)'),
    opZero: f('void llm_op_zero(int64_t dst, int64_t bytes)'),
    opReadRows: f(`int llm_op_read_rows(${i64}, ${i64}, const void *idx, ${i64}, ${i64}, ${i64})`),
    opWriteRows: f(`int llm_op_write_rows(${i64}, const void *data, const void *idx, ${i64}, ${i64}, ${i64})`),
    opPackBf16P16: f('void llm_op_pack_bf16_p16(int64_t src, int64_t dst, int64_t N, int64_t K)'),
    p16Bytes: f('int64_t llm_p16_bytes(int64_t N, int64_t K)'),
    opPackQuant: f('void llm_op_pack_quant(int64_t src, int64_t dst, int64_t N, int64_t K, int dtype)'),
    quantP16Bytes: f('int64_t llm_quant_p16_bytes(int64_t N, int64_t K, int dtype)'),
    quantVnni: f('int llm_quant_vnni()'),
    opMatmul: f('void llm_op_matmul(int64_t x, int64_t w, int64_t bias, int64_t y, int M, int N, int K, int wdt)'),
    opEmbedding: f(`void llm_op_embedding(${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64}, int, double)`),
    opRmsnorm: f(`void llm_op_rmsnorm(${i64}, ${i64}, ${i64}, ${i64}, ${i64}, double, double)`),
    opAdd: f(`void llm_op_add(${i64}, ${i64}, ${i64}, ${i64}, double)`),
    opScale: f(`void llm_op_scale(${i64}, ${i64}, ${i64}, double)`),
    opSoftcap: f(`void llm_op_softcap(${i64}, ${i64}, ${i64}, double)`),
    opGlu: f(`void llm_op_glu(${i64}, ${i64}, ${i64}, ${i64}, int)`),
    opRope: f(`void llm_op_rope(${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64}, double)`),
    opWriteKv: f(`void llm_op_write_kv(${Array(10).fill(i64).join(', ')})`),
    opAttention: f(`void llm_op_attention(${Array(17).fill(i64).join(', ')}, double, double)`),
    opGatherRows: f(`void llm_op_gather_rows(${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64})`),
    opArgmax: f(`void llm_op_argmax(${i64}, ${i64}, ${i64}, ${i64})`),
    opSampleRows: f(`int llm_op_sample_rows(${i64}, int, const void *packed, ${i64}, ${i64}, ${i64}, ${i64}, ${i64})`),
    opMoeRoute: f(`void llm_op_moe_route(${i64}, ${i64}, ${i64}, ${i64}, ${i64}, ${i64}, int)`),
    opMoeFfn: f(`void llm_op_moe_ffn(${Array(12).fill(i64).join(', ')}, int, int, int, int)`),
  };
  if (native.init() !== 0) throw new Error('CPU backend: could not start the native worker thread');
  // Join the worker before Node tears the process down: a native thread still parked inside the
  // library while the runtime unloads it crashed ~1 exit in 10 (SIGSEGV, exit code 139).
  process.once('exit', () => native.shutdown());
  applyNativeSettings(native, s, null);
  loaded = { lib: native, knobs: knobsOf(s) };
  return native;
}
