// y = x · w^T through cuBLASLt on the backend's stream (tensor cores for 16-bit inputs, f32
// accumulation; f32 inputs use plain fp32 compute, not TF32).
//
// Row-major [M, N] = x [M, K] · w [N, K]^T is, in cuBLASLt's column-major terms,
// D (N x M, ld N) = op(A) · B with A = w viewed as K x N (ld K) transposed, B = x as K x M (ld K):
// the "TN" layout. Plans (descriptors + the heuristic's algorithm) are cached per shape and types.
import { type CublasLt, check, num, out64 } from './cuda-lib.ts';
import type { CudaRuntime } from './runtime.ts';
import type { DevicePool } from './device-pool.ts';

export type GemmType = 'f32' | 'f16' | 'bf16';
const CUDA_R: Record<GemmType, number> = { f32: 0, f16: 2, bf16: 14 };
const CUBLAS_COMPUTE_32F = 68;
const CUBLASLT_MATMUL_DESC_TRANSA = 3;
const CUBLASLT_MATMUL_DESC_TRANSB = 4;
const CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;
const CUBLAS_OP_N = 0;
const CUBLAS_OP_T = 1;
/** sizeof(cublasLtMatmulHeuristicResult_t): algo (8 x u64), size_t workspaceSize, int state, float waves, int[4] */
const HEURISTIC_BYTES = 96;
const WORKSPACE_BYTES = 32 * 1024 * 1024;
const MAX_PLANS = 4096;

interface Plan {
  op: number;
  a: number;
  b: number;
  d: number;
  algo: Uint8Array;
  /** the heuristic's valid algorithms, best guess first; emptied once timed */
  candidates: Uint8Array[];
}

/** GEMMs with at most this many rows get their algorithm timed (decode shapes: the heuristic's
 * first pick read 4096 x 4096 bf16 weights at 2.0 TB/s on the H200, the best of its list faster) */
const TUNE_MAX_M = 1024;
const TUNE_CANDIDATES = 16;
const TUNE_REPEATS = 3;
/**
 * Written between timed calls so each reads its weights from HBM, as it will in a step: larger
 * than the H200's 50 MB L2 (a 4096 x 4096 bf16 weight fits in it, and timed back to back it
 * favoured algorithms that are slower when the weight streams from memory).
 */
const L2_FLUSH_BYTES = 128 * 1024 * 1024;

export class LtGemm {
  private readonly handle: number;
  private readonly pref: number;
  private readonly workspace: number;
  private readonly plans = new Map<string, Plan | null>();
  private readonly one = new Float32Array([1]);
  private readonly zero = new Float32Array([0]);
  readonly version: number;

  constructor(private readonly lt: CublasLt, private readonly rt: CudaRuntime, private readonly pool: DevicePool) {
    this.version = Number(lt.cublasLtGetVersion());
    const h = out64();
    checkLt(lt.cublasLtCreate(h), 'cublasLtCreate');
    this.handle = num(h);
    const p = out64();
    checkLt(lt.cublasLtMatmulPreferenceCreate(p), 'cublasLtMatmulPreferenceCreate');
    this.pref = num(p);
    const ws = new BigUint64Array([BigInt(WORKSPACE_BYTES)]);
    checkLt(lt.cublasLtMatmulPreferenceSetAttribute(this.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws, 8),
      'setting the workspace size');
    this.workspace = pool.alloc(WORKSPACE_BYTES, true).addr;
  }

  /**
   * Enqueues D[M, N] = x[M, K] · w[N, K]^T. Returns false (enqueuing nothing) when cuBLASLt has no
   * algorithm for these shapes and types; the caller then uses its own kernel.
   */
  run(w: number, wt: GemmType, x: number, xt: GemmType, d: number, dt: GemmType, M: number, N: number, K: number): boolean {
    const plan = this.plan(wt, xt, dt, M, N, K);
    if (!plan) return false;
    const call = (algo: Uint8Array) => this.lt.cublasLtMatmul(this.handle, plan.op, this.one, w, plan.a, x, plan.b,
      this.zero, d, plan.d, d, plan.d, algo, this.workspace, WORKSPACE_BYTES, this.rt.stream);
    if (plan.candidates.length > 1 && !this.rt.capturing) {
      this.tune(plan, call);
      plan.candidates.length = 0;
    }
    const t0 = this.rt.capturing ? undefined : this.rt.profiler?.begin();
    const rc = call(plan.algo);
    checkLt(rc, `cublasLtMatmul (M=${M} N=${N} K=${K}, w ${wt}, x ${xt}, out ${dt})`);
    if (t0 !== undefined) this.rt.profiler!.end(`gemm ${M}x${N}x${K}`, t0);
    this.rt.launches++;
    return true;
  }

  /**
   * Times each candidate algorithm on the real operands (the output is rewritten by the call that
   * follows) and keeps the fastest. Blocks the host for a few milliseconds, once per shape.
   */
  private tune(plan: Plan, call: (algo: Uint8Array) => number): void {
    const d = this.rt.d;
    const ev = [out64(), out64()];
    for (const e of ev) check(d.cuEventCreate(e, 0), 'cuEventCreate (gemm tuning)');
    const [e0, e1] = ev.map(num) as [number, number];
    const ms = new Float32Array(1);
    const flush = this.pool.alloc(L2_FLUSH_BYTES, true).addr;
    let best = plan.algo, bestMs = Infinity;
    try {
      for (const algo of plan.candidates) {
        if (call(algo) !== 0) continue; // warm-up; an algorithm that fails here is skipped
        let total = 0, ok = true;
        for (let i = 0; i < TUNE_REPEATS && ok; i++) {
          check(d.cuMemsetD8Async(flush, i & 0xff, L2_FLUSH_BYTES, this.rt.stream), 'L2 flush');
          check(d.cuEventRecord(e0, this.rt.stream), 'cuEventRecord');
          ok = call(algo) === 0;
          check(d.cuEventRecord(e1, this.rt.stream), 'cuEventRecord');
          check(d.cuEventSynchronize(e1), 'cuEventSynchronize (gemm tuning)');
          check(d.cuEventElapsedTime(ms, e0, e1), 'cuEventElapsedTime');
          total += ms[0]!;
        }
        if (ok && total < bestMs) {
          bestMs = total;
          best = algo;
        }
      }
    } finally {
      this.pool.release(flush, L2_FLUSH_BYTES);
      d.cuEventDestroy_v2(e0);
      d.cuEventDestroy_v2(e1);
    }
    plan.algo = best;
  }

  private plan(wt: GemmType, xt: GemmType, dt: GemmType, M: number, N: number, K: number): Plan | null {
    const key = `${wt}.${xt}.${dt}.${M}.${N}.${K}`;
    const cached = this.plans.get(key);
    if (cached !== undefined) return cached;
    const lt = this.lt;
    const h = out64();
    checkLt(lt.cublasLtMatmulDescCreate(h, CUBLAS_COMPUTE_32F, CUDA_R.f32), 'cublasLtMatmulDescCreate');
    const op = num(h);
    checkLt(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, new Int32Array([CUBLAS_OP_T]), 4), 'TRANSA');
    checkLt(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, new Int32Array([CUBLAS_OP_N]), 4), 'TRANSB');
    const layout = (t: GemmType, rows: number, cols: number, ld: number) => {
      const l = out64();
      checkLt(lt.cublasLtMatrixLayoutCreate(l, CUDA_R[t], rows, cols, ld), 'cublasLtMatrixLayoutCreate');
      return num(l);
    };
    const a = layout(wt, K, N, K);
    const b = layout(xt, K, M, K);
    const d = layout(dt, N, M, N);
    const tune = M <= TUNE_MAX_M && process.env.LLMTS_CUDA_GEMM_TUNE !== 'off';
    const requested = TUNE_CANDIDATES;
    const results = new Uint8Array(HEURISTIC_BYTES * requested);
    const count = new Int32Array(1);
    const rc = lt.cublasLtMatmulAlgoGetHeuristic(this.handle, op, a, b, d, d, this.pref, requested, results, count);
    let plan: Plan | null = null;
    if (rc === 0) {
      const view = new DataView(results.buffer);
      const candidates: Uint8Array[] = [];
      for (let i = 0; i < count[0]!; i++) {
        const base = i * HEURISTIC_BYTES;
        const wsNeeded = Number(view.getBigUint64(base + 64, true));
        const state = view.getInt32(base + 72, true);
        if (state === 0 && wsNeeded <= WORKSPACE_BYTES) candidates.push(results.slice(base, base + 64));
      }
      if (candidates.length > 0) plan = { op, a, b, d, algo: candidates[0]!, candidates: tune ? candidates : [] };
    }
    if (!plan) {
      lt.cublasLtMatrixLayoutDestroy(a);
      lt.cublasLtMatrixLayoutDestroy(b);
      lt.cublasLtMatrixLayoutDestroy(d);
      lt.cublasLtMatmulDescDestroy(op);
    }
    if (this.plans.size >= MAX_PLANS) this.clearPlans();
    this.plans.set(key, plan);
    return plan;
  }

  private clearPlans(): void {
    for (const p of this.plans.values()) {
      if (!p) continue;
      this.lt.cublasLtMatrixLayoutDestroy(p.a);
      this.lt.cublasLtMatrixLayoutDestroy(p.b);
      this.lt.cublasLtMatrixLayoutDestroy(p.d);
      this.lt.cublasLtMatmulDescDestroy(p.op);
    }
    this.plans.clear();
  }

  /** After the stream is idle. */
  close(): void {
    this.clearPlans();
    this.lt.cublasLtMatmulPreferenceDestroy(this.pref);
    this.lt.cublasLtDestroy(this.handle);
    this.pool.release(this.workspace, WORKSPACE_BYTES);
  }
}

function checkLt(rc: number, what: string): void {
  if (rc !== 0) throw new Error(`cuda backend: cuBLASLt ${what} failed: cublasStatus_t ${rc}`);
}

