// y = x · w^T through cuBLASLt on the backend's stream (tensor cores for 16-bit inputs, f32
// accumulation; f32 inputs use plain fp32 compute, not TF32).
//
// Row-major [M, N] = x [M, K] · w [N, K]^T is, in cuBLASLt's column-major terms,
// D (N x M, ld N) = op(A) · B with A = w viewed as K x N (ld K) transposed, B = x as K x M (ld K):
// the "TN" layout. Plans (descriptors + the heuristic's algorithm) are cached per shape and types.
//
// Split-K algorithms may only sum their K slices in f32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE):
// the default mask also allows adding the slices up in the output's type, which for bf16 outputs
// rounds each partial sum to 8 significant bits (on the H200, outputs up to a third off at 8-64 rows,
// N 300, K 1040; test/backends/cuda-ops.test.ts). Throughput at 8-64 requests did not move.
import { type CublasLt, check, num, out64 } from './cuda-lib.ts';
import type { CudaSettings } from './cuda-settings.ts';
import type { CudaRuntime } from './runtime.ts';
import type { DevicePool } from './device-pool.ts';
import { gemmPickRule, gemvBar, gemvMarginAfter, INVARIANT_PROBE_ROWS, L2_FLUSH_BYTES } from './gemm-tuning.ts';
import { GEMV_THREADS, type GemvChoice, gemvCandidates, gemvLabel, gemvLaunchGrid } from './gemv-kernels.ts';

export type GemmType = 'f32' | 'f16' | 'bf16';
const CUDA_R: Record<GemmType, number> = { f32: 0, f16: 2, bf16: 14 };
const CUBLAS_COMPUTE_32F = 68;
const CUBLASLT_MATMUL_DESC_TRANSA = 3;
const CUBLASLT_MATMUL_DESC_TRANSB = 4;
const CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;
const CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3;
/** cublasLtReductionScheme_t: COMPUTE_TYPE (2) only; algorithms without split-K pass any mask */
const REDUCTION_IN_F32 = 2;
const CUBLAS_OP_N = 0;
const CUBLAS_OP_T = 1;
/** sizeof(cublasLtMatmulHeuristicResult_t): algo (8 x u64), size_t workspaceSize, int state, float waves, int[4] */
const HEURISTIC_BYTES = 96;
const WORKSPACE_BYTES = 32 * 1024 * 1024;
const MAX_PLANS = 4096;

interface Plan {
  M: number;
  K: number;
  op: number;
  a: number;
  b: number;
  d: number;
  /** the algorithm this shape runs: the heuristic's first, then its tuning class's winner */
  algo: Uint8Array;
  /** the heuristic's valid algorithms, best guess first; emptied once timed */
  candidates: Uint8Array[];
  /** bf16 decode shapes: our GEMV kernels to time against cuBLASLt (emptied once timed) */
  gemvCandidates: GemvChoice[];
  /** set when a GEMV launch timed faster than every cuBLASLt algorithm */
  gemv?: GemvChoice;
  /** the tuning class this shape belongs to (undefined: not tuned) */
  tuneClass?: TuneClass;
}

/**
 * The shapes that share one tuning: same types, N and K, and rows in one class (exact up to 8,
 * then by 16, like the decode graph buckets). The first shape of a class to run is timed; every
 * shape of the class then takes the winner where cuBLASLt accepts it for its own rows
 * (cublasLtMatmulAlgoCheck). Timing is costly on the host (~0.4 ms a call: about 0.1 s for a
 * layer's four GEMM shapes on the H200), so a mixed step's ever-new row count must not each pay it.
 */
interface TuneClass {
  state: 'untuned' | 'pending' | 'done';
  algo?: Uint8Array;
  gemv?: GemvChoice;
  /** shapes planned while the class was being timed: they adopt the winner when it settles */
  waiting: Plan[];
}

/** A tuning enqueued on the stream whose timings are not read yet (LtGemm.settleTuning). */
interface PendingTune {
  plan: Plan;
  record: TuneRecord;
  /** per candidate: its (start, end) event pairs */
  runs: { algo?: Uint8Array; gemv?: GemvChoice; pairs: [number, number][] }[];
  /** every event created for it, in record order (the last completes last) */
  events: number[];
  /** the GEMV margin (gemvMarginAfter the kernel enqueued before the shape's first run) */
  margin: number;
}

/** What tuning measured for one shape (for benchmarks and the profiler's report). */
export interface TuneRecord {
  shape: string;
  /** the fastest cuBLASLt algorithm's time, and each GEMV kernel's, ms per call */
  cublasLtMs: number;
  /** the heuristic's first algorithm's time (what runs untuned), ms per call */
  firstMs: number;
  /** by gemvLabel (kernel/warps per row[/blocks per SM of a persistent kernel]) */
  gemvMs: Record<string, number>;
  chosen: string;
  /** the margin a GEMV had over cuBLASLt alone (gemvMarginAfter: 1 right after an attention kernel) */
  gemvMargin: number;
}

const TUNE_CANDIDATES = 16;
const TUNE_REPEATS = 3;

export class LtGemm {
  private readonly handle: number;
  private readonly pref: number;
  private readonly workspace: number;
  private readonly plans = new Map<string, Plan | null>();
  private readonly classes = new Map<string, TuneClass>();
  /** untuned shapes: the heuristic's pick per row bucket (CudaGemmSettings.pickBucketRows) */
  private readonly picks = new Map<string, Uint8Array>();
  /** batch-invariant mode: each weight shape's one algorithm (gemmPickRule key; null: cuBLASLt has none) */
  private readonly invariant = new Map<string, Uint8Array | null>();
  private readonly one = new Float32Array([1]);
  private readonly zero = new Float32Array([0]);
  readonly version: number;
  /** one entry per tuned shape, in the order their timings were read */
  readonly tuned: TuneRecord[] = [];
  private pending: PendingTune[] = [];

  /**
   * `settings`: the backend's (its gemm and gemv groups; the attention's trigger for the GEMV
   * margin; batch-invariant mode: gemmPickRule)
   */
  constructor(private readonly lt: CublasLt, private readonly rt: CudaRuntime, private readonly pool: DevicePool,
    private readonly settings: Pick<CudaSettings, 'gemm' | 'gemv' | 'attention' | 'batchInvariant'>) {
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
    checkLt(lt.cublasLtMatmulPreferenceSetAttribute(this.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, new Uint32Array([REDUCTION_IN_F32]), 4),
      'restricting split-K reductions to f32');
    this.workspace = pool.alloc(WORKSPACE_BYTES, true).addr;
  }

  /**
   * Enqueues D[M, N] = x[M, K] · w[N, K]^T. Returns false (enqueuing nothing) when cuBLASLt has no
   * algorithm for these shapes and types; the caller then uses its own kernel.
   */
  run(w: number, wt: GemmType, x: number, xt: GemmType, d: number, dt: GemmType, M: number, N: number, K: number): boolean {
    this.settleTuning();
    const plan = this.plan(wt, xt, dt, M, N, K, w);
    if (!plan) return false;
    const call = (algo: Uint8Array) => this.lt.cublasLtMatmul(this.handle, plan.op, this.one, w, plan.a, x, plan.b,
      this.zero, d, plan.d, d, plan.d, algo, this.workspace, WORKSPACE_BYTES, this.rt.stream);
    // the GEMV kernels load 16-byte chunks: operands off that alignment take cuBLASLt
    const aligned = (w % 16) === 0 && (x % 16) === 0;
    // (one-shot and persistent kernels take the same arguments; a persistent grid is sized to stay resident)
    const gemv = (c: GemvChoice) => this.rt.launch(c.kernel, [gemvLaunchGrid(c, N, this.rt.smCount), 1, 1], GEMV_THREADS, 0, [
      ['p', w], ['p', x], ['p', d], ['i', M], ['i', N], ['i', K], ['i', c.warpsPerRow]]);
    // the shape that times its class does so on its first run outside a capture (a class must
    // settle: shapes of it planned meanwhile wait for the winner)
    if ((plan.candidates.length > 0 || plan.gemvCandidates.length > 0) && !this.rt.capturing) {
      this.tune(plan, `${M}x${N}x${K}`, call, aligned ? gemv : undefined);
      plan.candidates.length = 0;
      plan.gemvCandidates.length = 0;
    }
    if (plan.gemv && aligned) {
      gemv(plan.gemv);
      return true;
    }
    const prof = this.rt.capturing ? this.rt.graphProfiler : this.rt.profiler;
    const t0 = prof?.begin();
    const rc = call(plan.algo);
    checkLt(rc, `cublasLtMatmul (M=${M} N=${N} K=${K}, w ${wt}, x ${xt}, out ${dt})`);
    if (t0 !== undefined) prof!.end(`gemm ${M}x${N}x${K}`, t0);
    this.rt.launches++;
    this.rt.lastLaunch = undefined;
    return true;
  }

  /**
   * Enqueues the timing of each candidate (cuBLASLt algorithms, then GEMV kernels when given) on the
   * real operands (the output is rewritten by the call that follows), each timed call after an L2
   * flush, between two events. The host does not wait: the events are read by settleTuning() once
   * they have completed (the plan keeps the heuristic's algorithm until then): waiting here would
   * hold the event loop ~0.1 s at a long prefill's first chunk of a new shape.
   */
  private tune(plan: Plan, shape: string, call: (algo: Uint8Array) => number,
    gemv: ((c: GemvChoice) => void) | undefined): void {
    const d = this.rt.d;
    const flush = this.pool.alloc(L2_FLUSH_BYTES).addr; // pooled: freeing an exact block (cuMemFree) waits for the device
    const events: number[] = [];
    const margin = gemvMarginAfter(this.rt.lastLaunch, this.settings.gemv, this.settings.attention.tcTrigger);
    const pending: PendingTune = {
      plan, record: { shape, cublasLtMs: Infinity, firstMs: NaN, gemvMs: {}, chosen: 'cublaslt', gemvMargin: margin }, runs: [], events, margin,
    };
    /** enqueues one candidate's warm-up and timed calls; false when a call could not be enqueued */
    const time = (run: () => boolean): [number, number][] | null => {
      if (!run()) return null; // warm-up; a candidate that fails here is skipped
      const pairs: [number, number][] = [];
      for (let i = 0; i < TUNE_REPEATS; i++) {
        const e0 = this.event(events), e1 = this.event(events);
        // reading the flush buffer, not writing it (CudaGemmSettings.tuneFlush): a write leaves dirty
        // lines that the timed call would also write back
        if (this.settings.gemm.tuneFlush === 'read') {
          this.rt.launch('k_l2_flush_read', [4 * this.rt.smCount, 1, 1], 512, 0, [['p', flush], ['p', L2_FLUSH_BYTES / 16], ['p', 0]]);
        } else {
          check(d.cuMemsetD8Async(flush, i & 0xff, L2_FLUSH_BYTES, this.rt.stream), 'L2 flush');
        }
        check(d.cuEventRecord(e0, this.rt.stream), 'cuEventRecord');
        const ok = run();
        check(d.cuEventRecord(e1, this.rt.stream), 'cuEventRecord');
        if (!ok) return null;
        pairs.push([e0, e1]);
      }
      return pairs;
    };
    try {
      for (const algo of plan.candidates.length > 0 ? plan.candidates : [plan.algo]) {
        const pairs = time(() => call(algo) === 0);
        if (pairs) pending.runs.push({ algo, pairs });
      }
      for (const c of gemv ? plan.gemvCandidates : []) {
        const pairs = time(() => {
          gemv!(c);
          return true;
        });
        if (pairs) pending.runs.push({ gemv: c, pairs });
      }
    } catch (err) {
      for (const e of events) d.cuEventDestroy_v2(e);
      throw err;
    } finally {
      this.pool.release(flush, L2_FLUSH_BYTES); // stream-ordered: reused only by later work
    }
    this.pending.push(pending);
  }

  private event(into: number[]): number {
    const e = out64();
    check(this.rt.d.cuEventCreate(e, 0), 'cuEventCreate (gemm tuning)');
    into.push(num(e));
    return num(e);
  }

  /**
   * Applies the timings whose events have completed (`wait`: waits for all of them, as before a
   * graph capture, which must freeze the tuned choice). Cheap when nothing is pending.
   */
  settleTuning(wait = false): void {
    if (this.pending.length === 0) return;
    const d = this.rt.d;
    const ms = new Float32Array(1);
    this.pending = this.pending.filter((p) => {
      const last = p.events[p.events.length - 1];
      if (last !== undefined) {
        if (wait) check(d.cuEventSynchronize(last), 'cuEventSynchronize (gemm tuning)');
        else if (d.cuEventQuery(last) !== 0) return true; // still running (or failed: sync reports it)
      }
      const { plan, record } = p;
      const total = (pairs: [number, number][]) => pairs.reduce((a, [e0, e1]) => {
        check(d.cuEventElapsedTime(ms, e0, e1), 'cuEventElapsedTime');
        return a + ms[0]!;
      }, 0);
      try {
        for (const r of p.runs) {
          if (!r.algo) continue;
          const t = total(r.pairs) / TUNE_REPEATS;
          if (Number.isNaN(record.firstMs)) record.firstMs = t;
          if (t < record.cublasLtMs) {
            record.cublasLtMs = t;
            plan.algo = r.algo;
          }
        }
        // a GEMV within the margin of cuBLASLt alone wins (CudaGemvSettings.margin: in a decode graph it overlaps
        // its weight fetch with the kernel before, which a lone timing misses; 1 right after an
        // attention kernel); 'prefer': the fastest GEMV whatever cuBLASLt timed
        let bestMs = gemvBar(record.cublasLtMs, this.settings.gemv.mode, p.margin);
        for (const r of p.runs) {
          if (!r.gemv) continue;
          const t = total(r.pairs) / TUNE_REPEATS;
          record.gemvMs[gemvLabel(r.gemv)] = t;
          if (t < bestMs) {
            bestMs = t;
            plan.gemv = r.gemv;
            record.chosen = gemvLabel(r.gemv);
          }
        }
      } finally {
        for (const e of p.events) d.cuEventDestroy_v2(e);
      }
      const cls = plan.tuneClass;
      if (cls) {
        cls.state = 'done';
        cls.algo = plan.algo;
        cls.gemv = plan.gemv;
        for (const member of cls.waiting) this.adopt(member, cls);
        cls.waiting.length = 0;
      }
      this.tuned.push(record);
      return false;
    });
  }

  /** A shape of a timed class takes its winner: the same GEMV launch, or the algorithm where cuBLASLt accepts it. */
  private adopt(plan: Plan, cls: TuneClass): void {
    if (cls.gemv && gemvCandidates(plan.M, plan.K).some((g) => gemvLabel(g) === gemvLabel(cls.gemv!))) {
      plan.gemv = cls.gemv;
      return;
    }
    if (cls.algo && this.algoFits(plan.op, plan.a, plan.b, plan.d, cls.algo)) plan.algo = cls.algo;
  }

  /** Whether cuBLASLt accepts `algo` for these descriptors within our workspace. */
  private algoFits(op: number, a: number, b: number, d: number, algo: Uint8Array): boolean {
    const result = new Uint8Array(HEURISTIC_BYTES);
    const rc = this.lt.cublasLtMatmulAlgoCheck(this.handle, op, a, b, d, d, algo, result);
    const view = new DataView(result.buffer);
    return rc === 0 && view.getInt32(72, true) === 0 && Number(view.getBigUint64(64, true)) <= WORKSPACE_BYTES;
  }

  /** `w`: the weight's address (batch-invariant mode times each shape's candidates on it) */
  private plan(wt: GemmType, xt: GemmType, dt: GemmType, M: number, N: number, K: number, w: number): Plan | null {
    const key = `${wt}.${xt}.${dt}.${M}.${N}.${K}`;
    const cached = this.plans.get(key);
    if (cached !== undefined) return cached;
    const lt = this.lt;
    const h = out64();
    checkLt(lt.cublasLtMatmulDescCreate(h, CUBLAS_COMPUTE_32F, CUDA_R.f32), 'cublasLtMatmulDescCreate');
    const op = num(h);
    checkLt(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, new Int32Array([CUBLAS_OP_T]), 4), 'TRANSA');
    checkLt(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, new Int32Array([CUBLAS_OP_N]), 4), 'TRANSB');
    const a = this.layout(wt, K, N, K);
    const b = this.layout(xt, K, M, K);
    const d = this.layout(dt, N, M, N);
    const rule = gemmPickRule(wt, xt, dt, M, N, K, this.settings);
    if (rule.kind === 'invariant') return this.remember(key, this.invariantPlan(rule.key, { M, K, op, a, b, d }, w, wt, xt, dt, N));
    const tune = rule.kind === 'timed';
    // an untuned shape takes the heuristic's pick of the first shape in its row bucket where
    // cuBLASLt accepts it (cublasLtMatmulAlgoCheck): the heuristic is a host-side search (the first
    // query of a process took 70-190 ms on the H200; later ones stayed under the slow-call tracer's
    // 8 ms, not timed one by one), and mixed steps bring new row counts all the time
    const shared = rule.kind === 'bucket'; // prefill-sized: never timed, never a GEMV
    const bucketKey = shared ? rule.key : '';
    const known = shared ? this.picks.get(bucketKey) : undefined;
    if (known && this.algoFits(op, a, b, d, known)) {
      return this.remember(key, { M, K, op, a, b, d, algo: known, candidates: [], gemvCandidates: [] });
    }
    const requested = TUNE_CANDIDATES;
    const results = new Uint8Array(HEURISTIC_BYTES * requested);
    const count = new Int32Array(1);
    const rc = lt.cublasLtMatmulAlgoGetHeuristic(this.handle, op, a, b, d, d, this.pref, requested, results, count);
    let plan: Plan | null = null;
    if (rc === 0) {
      const candidates = usableAlgos(results, count[0]!);
      const gemvMode = this.settings.gemv.mode;
      const gemv = rule.gemv ? gemvCandidates(M, K) : [];
      if (candidates.length > 0) {
        plan = { M, K, op, a, b, d, algo: candidates[0]!, candidates: [], gemvCandidates: [] };
        if (shared && !known) this.picks.set(bucketKey, candidates[0]!);
        // CudaGemvSettings.picks: this shape's pick, untimed, outside any tuning class
        const pick = this.settings.gemv.picks.get(`${M}x${N}x${K}`);
        if (pick !== undefined) {
          const chosen = gemv.find((g) => gemvLabel(g) === pick);
          if (!chosen && pick !== 'cublaslt') {
            throw new Error(`LLMTS_CUDA_GEMV_PICKS: ${pick} is not a launch for ${M}x${N}x${K} (${gemv.map(gemvLabel).join(', ') || 'no GEMV applies'}, or cublaslt)`);
          }
          plan.gemv = chosen;
        } else {
          if (tune) {
            const classKey = rule.key;
            let cls = this.classes.get(classKey);
            if (!cls) this.classes.set(classKey, (cls = { state: 'untuned', waiting: [] }));
            if (cls.state === 'untuned' && candidates.length < 2 && gemv.length === 0) {
              cls.state = 'done'; // nothing to choose between
              cls.algo = plan.algo;
            } else if (cls.state === 'untuned') {
              // this shape times the class (on its first run outside a capture)
              cls.state = 'pending';
              plan.tuneClass = cls;
              plan.candidates = candidates;
              plan.gemvCandidates = gemv;
            } else if (cls.state === 'pending') cls.waiting.push(plan);
            else this.adopt(plan, cls);
          }
          // CudaGemvSettings.mode a kernel name: that kernel wherever it applies (its first
          // candidate), or a gemvLabel (e.g. k_gemvp_m1_u16/w1/b2): that launch; untimed (tests, A/B runs)
          const forced = gemv.find((g) => g.kernel === gemvMode) ?? gemv.find((g) => gemvLabel(g) === gemvMode);
          if (forced) {
            plan.gemv = forced;
            plan.gemvCandidates = [];
          }
        }
      }
    }
    if (!plan) this.destroyDescriptors({ op, a, b, d });
    return this.remember(key, plan);
  }

  private layout(t: GemmType, rows: number, cols: number, ld: number): number {
    const l = out64();
    checkLt(this.lt.cublasLtMatrixLayoutCreate(l, CUDA_R[t], rows, cols, ld), 'cublasLtMatrixLayoutCreate');
    return num(l);
  }

  private destroyDescriptors(p: Pick<Plan, 'op' | 'a' | 'b' | 'd'>): void {
    this.lt.cublasLtMatrixLayoutDestroy(p.a);
    this.lt.cublasLtMatrixLayoutDestroy(p.b);
    this.lt.cublasLtMatrixLayoutDestroy(p.d);
    this.lt.cublasLtMatmulDescDestroy(p.op);
  }

  /**
   * Batch-invariant mode: the plan of `desc`'s M rows runs its weight shape's one algorithm
   * (invariantAlgo), untimed and never a GEMV; null (the descriptors destroyed) where cuBLASLt has
   * none for the shape, so every row count of it takes the plain kernel.
   */
  private invariantPlan(shapeKey: string, desc: Pick<Plan, 'M' | 'K' | 'op' | 'a' | 'b' | 'd'>, w: number, wt: GemmType, xt: GemmType,
    dt: GemmType, N: number): Plan | null {
    const algo = this.invariantAlgo(shapeKey, desc.op, desc.a, w, wt, xt, dt, N, desc.K);
    if (algo && this.algoFits(desc.op, desc.a, desc.b, desc.d, algo)) return { ...desc, algo, candidates: [], gemvCandidates: [] };
    this.destroyDescriptors(desc);
    if (!algo) return null;
    // every probed row count took it (INVARIANT_PROBE_ROWS); another algorithm here would break the invariance
    throw new Error(`cuda backend: batch-invariant mode: cuBLASLt refuses the algorithm of weight shape ${N}x${desc.K} (${wt}) ` +
      `for ${desc.M} rows, which it took for every probed row count`);
  }

  /**
   * The one algorithm of a weight shape in batch-invariant mode, found once: of the heuristic's list
   * for CudaGemmSettings.invariantRows rows, those cuBLASLt takes at every INVARIANT_PROBE_ROWS row
   * count, the fastest at invariantRows rows (timed on the weight, CudaGemmSettings.tune; else, or
   * inside a graph capture, the first); null when none. Its tile shape, split-K and reduction then
   * serve every row count, so a row's sums run in the same order whatever rows share its GEMM.
   */
  private invariantAlgo(shapeKey: string, op: number, a: number, w: number, wt: GemmType, xt: GemmType, dt: GemmType, N: number,
    K: number): Uint8Array | null {
    const known = this.invariant.get(shapeKey);
    if (known !== undefined) return known;
    const ref = this.settings.gemm.invariantRows;
    const rows = [ref, ...INVARIANT_PROBE_ROWS];
    const layouts = rows.map((m) => ({ b: this.layout(xt, K, m, K), d: this.layout(dt, N, m, N) }));
    let chosen: Uint8Array | null = null;
    try {
      const results = new Uint8Array(HEURISTIC_BYTES * TUNE_CANDIDATES);
      const count = new Int32Array(1);
      const rc = this.lt.cublasLtMatmulAlgoGetHeuristic(this.handle, op, a, layouts[0]!.b, layouts[0]!.d, layouts[0]!.d, this.pref,
        TUNE_CANDIDATES, results, count);
      const candidates = rc === 0 ? usableAlgos(results, count[0]!) : [];
      const fitting = candidates.filter((algo) => layouts.every((l) => this.algoFits(op, a, l.b, l.d, algo)));
      chosen = fitting.length > 1 && this.settings.gemm.tune && !this.rt.capturing
        ? this.fastestAt(fitting, op, a, layouts[0]!.b, layouts[0]!.d, w, xt, dt, ref, N, K) : fitting[0] ?? null;
    } finally {
      for (const l of layouts) {
        this.lt.cublasLtMatrixLayoutDestroy(l.b);
        this.lt.cublasLtMatrixLayoutDestroy(l.d);
      }
    }
    this.invariant.set(shapeKey, chosen);
    return chosen;
  }

  /**
   * Batch-invariant mode's timing of a weight shape's candidates at `M` rows (invariantRows): each
   * on the weight and a scratch input of that many rows, after an L2 flush, TUNE_REPEATS times, as
   * tune() times a class, but waited for here, once per weight shape (the algorithm must be fixed
   * before the shape's first run: a later switch would change its rows' bits). Recorded in `tuned`.
   */
  private fastestAt(algos: Uint8Array[], op: number, a: number, b: number, d: number, w: number, xt: GemmType, dt: GemmType,
    M: number, N: number, K: number): Uint8Array {
    const dr = this.rt.d;
    const shape = `${M}x${N}x${K}`;
    const xBytes = M * K * (xt === 'f32' ? 4 : 2), dBytes = M * N * (dt === 'f32' ? 4 : 2);
    const x = this.pool.alloc(xBytes).addr, out = this.pool.alloc(dBytes).addr, flush = this.pool.alloc(L2_FLUSH_BYTES).addr;
    const events: number[] = [];
    const record: TuneRecord = { shape: `${shape} (batch-invariant)`, cublasLtMs: Infinity, firstMs: NaN, gemvMs: {}, chosen: 'cublaslt', gemvMargin: 1 };
    let best = algos[0]!;
    try {
      // small finite inputs (bf16 0.0099 pairs; as f32 about 0.0099)
      check(dr.cuMemsetD32Async(x, 0x3c223c22, Math.floor(xBytes / 4), this.rt.stream), 'batch-invariant timing input');
      const runs = algos.map((algo) => {
        const call = () => checkLt(this.lt.cublasLtMatmul(this.handle, op, this.one, w, a, x, b, this.zero, out, d, out, d, algo,
          this.workspace, WORKSPACE_BYTES, this.rt.stream), `cublasLtMatmul (batch-invariant timing of ${shape})`);
        call(); // warm-up
        const pairs: [number, number][] = [];
        for (let i = 0; i < TUNE_REPEATS; i++) {
          this.rt.launch('k_l2_flush_read', [4 * this.rt.smCount, 1, 1], 512, 0, [['p', flush], ['p', L2_FLUSH_BYTES / 16], ['p', 0]]);
          const e0 = this.event(events), e1 = this.event(events);
          check(dr.cuEventRecord(e0, this.rt.stream), 'cuEventRecord');
          call();
          check(dr.cuEventRecord(e1, this.rt.stream), 'cuEventRecord');
          pairs.push([e0, e1]);
        }
        return pairs;
      });
      check(dr.cuEventSynchronize(events[events.length - 1]!), 'cuEventSynchronize (batch-invariant timing)');
      const ms = new Float32Array(1);
      runs.forEach((pairs, i) => {
        let t = 0;
        for (const [e0, e1] of pairs) {
          check(dr.cuEventElapsedTime(ms, e0, e1), 'cuEventElapsedTime');
          t += ms[0]!;
        }
        t /= TUNE_REPEATS;
        if (i === 0) record.firstMs = t;
        if (t < record.cublasLtMs) {
          record.cublasLtMs = t;
          best = algos[i]!;
        }
      });
    } finally {
      for (const e of events) dr.cuEventDestroy_v2(e);
      // stream-ordered: reused only by later work
      this.pool.release(flush, L2_FLUSH_BYTES);
      this.pool.release(out, dBytes);
      this.pool.release(x, xBytes);
    }
    this.tuned.push(record);
    return best;
  }

  /** Caches a shape's plan (null: cuBLASLt has none), dropping every plan once MAX_PLANS are held. */
  private remember(key: string, plan: Plan | null): Plan | null {
    if (this.plans.size >= MAX_PLANS) this.clearPlans();
    this.plans.set(key, plan);
    return plan;
  }

  private clearPlans(): void {
    // a class whose timing never started is timed again by its next shape; nothing may adopt
    // through a dropped plan's descriptors
    const timing = new Set(this.pending.map((p) => p.plan.tuneClass));
    for (const c of this.classes.values()) {
      c.waiting.length = 0;
      if (c.state === 'pending' && !timing.has(c)) c.state = 'untuned';
    }
    for (const p of this.plans.values()) if (p) this.destroyDescriptors(p);
    this.plans.clear();
  }

  /** After the stream is idle. */
  close(): void {
    this.settleTuning(true);
    this.clearPlans();
    this.lt.cublasLtMatmulPreferenceDestroy(this.pref);
    this.lt.cublasLtDestroy(this.handle);
    this.pool.release(this.workspace, WORKSPACE_BYTES);
  }
}

/** The heuristic's results (count of them in `results`) that ran and fit our workspace, as algorithm bytes, in its order. */
function usableAlgos(results: Uint8Array, count: number): Uint8Array[] {
  const view = new DataView(results.buffer, results.byteOffset, results.byteLength);
  const out: Uint8Array[] = [];
  for (let i = 0; i < count; i++) {
    const base = i * HEURISTIC_BYTES;
    const wsNeeded = Number(view.getBigUint64(base + 64, true));
    const state = view.getInt32(base + 72, true);
    if (state === 0 && wsNeeded <= WORKSPACE_BYTES) out.push(results.slice(base, base + 64));
  }
  return out;
}

function checkLt(rc: number, what: string): void {
  if (rc !== 0) throw new Error(`cuda backend: cuBLASLt ${what} failed: cublasStatus_t ${rc}`);
}

