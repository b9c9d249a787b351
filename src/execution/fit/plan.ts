// The memory fit planner: from config.json and safetensors headers alone, how much memory a model
// needs at a context length, whether that fits a machine, the largest context that does, and how
// fast decode will be.
//
//   total(ctx) = weights + KV(ctx) + transient(step) + runtime reserve   <=   usable memory
//
// weights    the tensors the loader would load (models/weights.ts run on a DryRunBackend, so the
//            same names, fused layouts and shape checks), in the dtype they are kept: matrices
//            as stored, norms and biases widened to f32. Tied embeddings are one tensor.
// KV         the pools the engine allocates (one per layer, K and V), sized as engine.ts sizes
//            them: full-attention layers hold batch x ctx tokens, sliding layers only what their
//            window can still reach (state/kv-cache.ts blocksPerSequence), in the KV dtype.
// transient  the decoder graph run on the DryRunBackend for every step shape the scheduler can
//            produce (1 .. token budget tokens, up to `batch` sampled rows): activations of the
//            step, logits of the sampled rows, op scratch, and on the CPU the pool's cached
//            blocks (see allocator.ts), plus block tables, which grow with the context; on CUDA
//            also the decode graphs captured per batch bucket (what each capture holds).
// drafter    with speculative decoding (fit/drafter.ts): a drafter's weights and KV, and its
//            draft logit rows in the transient memory.
// reserve    the runtime: measured RSS of the process on the CPU; on CUDA the context, module and
//            cuBLASLt handle, the cuBLASLt workspace and what appears outside the pool while
//            running (constants.ts, measured by bench/fit-cuda.ts).
//
// total is non-decreasing in ctx (every term is), so the largest safe context is found by
// bisection.

import type { OnlineQuantization } from '../../artifacts/online-quant.ts';
import path from 'node:path';
import fs from 'node:fs';
import type { Backend, DType, Tensor } from '../../contracts/backend.ts';
import { dtypeBytes, hasFusedOps, numel, rowBytes } from '../../contracts/backend.ts';
import type { ModelConfig } from '../../contracts/model-config.ts';
import { loadModelDir } from '../../artifacts/model-dir.ts';
import { ArtifactError } from '../../artifacts/errors.ts';
import { derivedContextLength } from '../../artifacts/context-length.ts';
import type { WeightIndex } from '../../artifacts/safetensors.ts';
import { TOKENIZER_FILE } from '../../artifacts/tokenizer.ts';
import { loadModelWeights, MissingWeightError, type ModelWeights, type WeightLookup } from '../../models/weights.ts';
import { DecoderModel, type KvAccess, type RowSpan } from '../../models/decoder.ts';
import { blocksPerSequence, kvGroupsOf } from '../../state/kv-cache.ts';
import { bucketFor } from '../../models/decode-graphs.ts';
import { CPU_POOL, CUDA_POOL, ExactModel, PoolModel, pooledBytes } from './allocator.ts';
import { type CudaTuning, DryRunBackend, DryTensor } from './dry-run-backend.ts';
import type { Machine } from './machines.ts';
import * as K from './constants.ts';
import { decodeFeatures, decodeSeconds, decodeTerms, termSeconds, type DecodeFeatures, type DecodeTerm, type DecodeWeights } from './decode-model.ts';
import { moeVecKernelsApply } from '../../backends/cuda/moe-kernels.ts';
import { type CpuSettings, cpuSettingsFrom } from '../../backends/cpu/cpu-settings.ts';
import { type CudaSettings, cudaSettingsFrom, type CudaSettingsOverrides } from '../../backends/cuda/cuda-settings.ts';
import { batchInvariantPartialBytes } from '../../backends/cuda/attention.ts';
import type { SpeculationMemory } from './serve-plan.ts';
import type { DrafterInfo } from './drafter.ts';

/** Knobs of the backends the plan is for, set in code (the rest from the environment, as the backends read them). */
export interface PlannerSettings {
  cpu?: Partial<CpuSettings>;
  cuda?: CudaSettingsOverrides;
  /** the checkpoint's matrices quantized as they load (`--quantization`): planned at those blocks' bytes */
  quantization?: OnlineQuantization;
}
import { DEFAULT_TOKEN_BUDGET } from '../engine.ts';

/** the engine's defaults (engine.ts): block size and per-step token budget */
export const DEFAULT_BLOCK_SIZE = 16;
export const DEFAULT_CHUNK = DEFAULT_TOKEN_BUDGET;

export type KvDtype = 'f32' | 'bf16' | 'f16' | 'int8' | 'fp8';
export const KV_DTYPES: readonly KvDtype[] = ['f32', 'bf16', 'f16', 'int8', 'fp8'];
/** the KV dtypes only the CPU backend keeps (one byte an element and an f32 scale a row) */
const CPU_ONLY_KV: readonly KvDtype[] = ['int8', 'fp8'];

export class FitError extends Error {}

export interface FitRequest {
  /** tokens per sequence, prompt + output */
  ctx: number;
  /** sequences resident together (default 1) */
  batch?: number;
  /** tokens per engine step, decode rows + prefill chunk (default 512, the engine's) */
  chunk?: number;
  /** KV cache dtype (default: f32 on the CPU backend, bf16 on CUDA) */
  kvDtype?: KvDtype;
  blockSize?: number;
  /** GPU only: fraction of device memory the engine may use (default 0.9) */
  utilization?: number;
  /** what a speculative drafter adds (fit/drafter.ts planDrafter; none without one) */
  speculation?: SpeculationMemory & { drafter?: DrafterInfo };
}

type ResolvedFitRequest = Required<Omit<FitRequest, 'speculation'>> & Pick<FitRequest, 'speculation'>;

export interface WeightsReport {
  /** elements of every tensor the model loads (tied embeddings once) */
  params: number;
  /** bytes as kept in memory: matrices in their stored dtype, vectors widened to f32 */
  residentBytes: number;
  /** bytes of the same tensors in the checkpoint */
  checkpointBytes: number;
  /** checkpoint bytes per stored dtype ("BF16": ...) */
  checkpointBytesByDtype: Record<string, number>;
  /** resident bytes per kept dtype ("Q8_0" / "Q4_0" / "Q4_K" / "Q6_K" / "Q5_K" / "IQ4_XS" / "Q4_1" / "Q5_1": matrices the CPU backend keeps quantized) */
  residentBytesByDtype: Record<string, number>;
  tensors: number;
  /** checkpoint tensors the model never reads (a tied lm_head copy, rotary buffers, ...) */
  unusedTensors: string[];
  unusedBytes: number;
  /** MoE: bytes of expert matrices (read top_k / num_experts of them per token) */
  expertBytes: number;
  /** bytes read per decoded token apart from experts and the embedding table */
  denseReadBytes: number;
  /** one embedding row (what a token reads of the table) */
  embeddingRowBytes: number;
}

export interface KvGroupReport {
  attention: 'full' | 'sliding';
  /** 0 for full attention */
  window: number;
  layers: number;
  /** bytes one token adds in this group's layers (K and V) */
  bytesPerToken: number;
  /** tokens of one sequence the group holds at ctx (sliding: saturates at its window + a chunk) */
  tokensPerSequence: number;
  poolBlocks: number;
  /** memory of the group's pools as allocated */
  bytes: number;
}

export interface FitPlan {
  model: {
    dir: string;
    modelType: string;
    layers: number;
    /** the context the model was built for (derived as the engine derives it) */
    contextLength: number;
    vocabSize: number;
    moe?: { experts: number; topK: number };
  };
  machine: Machine;
  ctx: number;
  batch: number;
  chunk: number;
  blockSize: number;
  kvDtype: KvDtype;
  activationDtype: DType;
  weightsBytes: number;
  weights: WeightsReport;
  /** KV bytes per token across all layers, before any sliding window saturates */
  kvBytesPerToken: number;
  /** tokens of KV the full-attention pools hold (the engine's kvTokens) */
  kvTokens: number;
  kvBytes: number;
  kv: KvGroupReport[];
  transientBytes: number;
  transient: {
    /** tokens of the largest step */
    stepTokens: number;
    /** rows sampled in it (each reads back a logits row) */
    sampledRows: number;
    /** resident peak of the largest step alone */
    largestStepBytes: number;
    /** block tables of `batch` rows at ctx */
    blockTableBytes: number;
    /** CUDA: memory the captured decode graphs hold (every batch bucket up to `batch`) */
    graphBytes: number;
    /** how activations were modelled */
    model: string;
  };
  reserveBytes: number;
  reserve: { name: string; bytes: number; measured: boolean }[];
  totalBytes: number;
  usableBytes: number;
  usable: string;
  fits: boolean;
  headroomBytes: number;
  maxSafeContext: number;
  /** what bounds maxSafeContext: memory, or the model's own context length */
  maxSafeContextLimitedBy: 'memory' | 'model';
  /** decode tok/s of the whole batch at ctx (equals per-sequence when batch is 1) */
  predictedDecodeTps: number;
  decode: {
    perSequenceTps: number;
    /** bytes read per decode step: weights (MoE: the experts a batch touches) + KV of every row */
    bytesPerStep: number;
    weightBytesPerStep: number;
    kvBytesPerStep: number;
    bandwidthGBps: number;
    efficiency: number;
    overheadMs: number;
  };
  /**
   * A speculative drafter's share, in the totals above: its draft logit rows (in transientBytes),
   * its weights and its KV (as many tokens as kvTokens)
   */
  speculation?: { drafter?: DrafterInfo; logitBytes: number; drafterBytes: number; drafterKvBytes: number; drafterKvBytesPerToken: number };
  /** constants used by this plan that are not measured yet (CUDA) */
  unmeasured: string[];
}

/** A step shape: tokens in the flattened batch, batch rows, rows sampled (default: all rows). */
export interface StepShape {
  tokens: number;
  rows: number;
  sampled?: number;
  /** width of the block tables (blocks of the longest row); default 1 (see blockTableBytes) */
  tableBlocks?: number;
}

type BackendKind = 'cpu' | 'cuda';
/** allocator model of a simulation: exact sizes, the pool as a plan counts it, the pool as a run leaves it */
type PoolMode = 'exact' | 'plan' | 'real';

interface Simulation {
  backend: DryRunBackend;
  model: DecoderModel;
  kv: StepKv;
  /** resident bytes before any step (weights) */
  base: number;
}

/** The KV a dry-run step reads: placeholders for the pools, real-shaped layout tensors. */
class StepKv implements KvAccess<RowSpan> {
  private readonly groupOf: number[];
  private readonly pools: { k: Tensor; v: Tensor };
  readonly groups: number;
  constructor(private readonly backend: DryRunBackend, cfg: ModelConfig, private readonly blockSize: number) {
    const specs = kvGroupsOf(cfg.layers.map((l) => l.window));
    this.groups = specs.length;
    this.groupOf = [];
    specs.forEach((s, g) => s.layers.forEach((l) => (this.groupOf[l] = g)));
    const dims = [1, blockSize, cfg.numKvHeads, cfg.headDim];
    this.pools = { k: backend.placeholder(dims, backend.activationDtype), v: backend.placeholder(dims, backend.activationDtype) };
  }
  /** width of the next step's block tables */
  tableBlocks = 1;
  kvOfLayer(): { k: Tensor; v: Tensor } {
    return this.pools;
  }
  groupIndexOfLayer(layer: number): number {
    return this.groupOf[layer]!;
  }
  isAllocated(): boolean {
    return true;
  }
  get groupCount(): number {
    return this.groups;
  }
  hostLayouts(rows: readonly RowSpan[]) {
    const T = rows.reduce((a, r) => a + r.count, 0);
    return Array.from({ length: this.groups }, () => ({
      tokenRow: new Int32Array(T), tokenPos: new Int32Array(T), slots: new Int32Array(T),
      blockTables: new Int32Array(rows.length * this.tableBlocks), maxBlocks: this.tableBlocks, blockSize: this.blockSize,
    }));
  }
  // as state/kv-cache.ts: row and position shared by every group, slots and tables per group;
  // tables are `tableBlocks` wide (1 when planning: their real width is counted by blockTableBytes)
  layouts(rows: readonly RowSpan[]) {
    const T = rows.reduce((a, r) => a + r.count, 0);
    const tokenRow = this.backend.upload(new Int32Array(T), [T]);
    const tokenPos = this.backend.upload(new Int32Array(T), [T]);
    return Array.from({ length: this.groups }, () => ({
      tokenRow, tokenPos,
      slots: this.backend.upload(new Int32Array(T), [T]),
      blockTables: this.backend.upload(new Int32Array(rows.length * this.tableBlocks), [rows.length, this.tableBlocks]),
      blockSize: this.blockSize,
    }));
  }
}

const ceilDiv = (a: number, b: number) => Math.ceil(a / b);

/** Records which checkpoint tensors the loader reads. */
class RecordingLookup implements WeightLookup {
  readonly used = new Set<string>();
  constructor(private readonly index: WeightIndex) {}
  has(name: string): boolean {
    return this.index.has(name);
  }
  get(name: string) {
    this.used.add(name);
    return this.index.get(name);
  }
  names(): string[] {
    return this.index.names();
  }
}

export interface PlannerSource {
  dir: string;
  config: ModelConfig;
  weights: WeightIndex;
  /** bytes of tokenizer.json (the CPU reserve grows with it); 0 when absent */
  tokenizerFileBytes?: number;
}

export class FitPlanner {
  readonly config: ModelConfig;
  readonly contextLength: number;
  /** per backend kind: the CPU keeps GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 (and, rewritten, Q5_0 / IQ4_NL / Q3_K) matrices quantized (CpuSettings.quantWeights), CUDA dequantizes them */
  private readonly weightsByKind = new Map<BackendKind, { report: WeightsReport; decode: DecodeWeights }>();
  private readonly sims = new Map<string, Promise<Simulation>>();
  /** per (backend kind, batch): worst resident over every step of 1..T tokens, minus the base */
  private readonly worstByTokens = new Map<string, number[]>();
  private readonly largestByShape = new Map<string, number>();
  /** CUDA: bytes a captured decode graph of each batch bucket holds (its arena), and the simulation capturing them */
  private readonly arenaByBucket = new Map<number, number>();
  private graphSim?: Promise<Simulation>;
  private readonly kernelsByBatch = new Map<number, number>();

  /** the backends' settings the plan models (what they would run with: PlannerSettings over the environment) */
  readonly cpu: CpuSettings;
  readonly cuda: CudaSettings;

  private constructor(readonly source: PlannerSource, settings: PlannerSettings) {
    this.config = source.config;
    this.contextLength = derivedContextLength(source.config);
    this.cpu = cpuSettingsFrom(process.env, settings.cpu);
    this.cuda = cudaSettingsFrom(process.env, settings.cuda);
  }

  /**
   * Reads config.json and the safetensors headers of `dir` (no tensor data, no tokenizer); plans for
   * backends created with `settings`.
   */
  static async open(dir: string, settings: PlannerSettings = {}): Promise<FitPlanner> {
    const art = loadModelDir(dir, { tokenizer: false, quantization: settings.quantization });
    let tokenizerFileBytes = art.tokenizerBytes ?? 0;
    try {
      if (art.tokenizerBytes === undefined) tokenizerFileBytes = fs.statSync(path.join(dir, TOKENIZER_FILE)).size;
    } catch {
      // no tokenizer.json: plan without its memory (loading the model would fail anyway)
    }
    const moe = art.config.moe;
    // the loader takes any positive top-k; routing, and the planner's share of experts a token reads, need k <= E
    if (moe && moe.topK > moe.numExperts) {
      throw new ArtifactError(`${path.join(dir, 'config.json')}: num_experts_per_tok ${moe.topK} is more than the ` +
        `${moe.numExperts} experts (num_experts / num_local_experts); a token is routed to at most every expert`, path.join(dir, 'config.json'));
    }
    const planner = new FitPlanner({ dir, config: art.config, weights: art.weights, tokenizerFileBytes }, settings);
    await planner.weights(); // every header/shape disagreement surfaces here, before any planning
    return planner;
  }

  private async loadDry(backend: DryRunBackend, lookup: WeightLookup): Promise<ModelWeights> {
    try {
      return await loadModelWeights(backend, this.config, lookup);
    } catch (err) {
      if (err instanceof MissingWeightError) throw new ArtifactError(`${this.source.dir}: ${err.message}`, this.source.dir);
      throw err;
    }
  }

  /** What the model's weights occupy on a backend of `kind` and what a decode step reads of them. */
  async weights(kind: BackendKind = 'cpu'): Promise<WeightsReport> {
    const known = this.weightsByKind.get(kind);
    if (known) return known.report;
    const backend = new DryRunBackend({
      name: 'cpu', activationDtype: 'f32', allocator: new ExactModel(), quantWeights: kind === 'cpu' && this.cpu.quantWeights,
      fp8Weights: kind === 'cuda' && this.cuda.gemv.fp8Weights,
    });
    const lookup = new RecordingLookup(this.source.weights);
    const w = await this.loadDry(backend, lookup);
    const seen = new Set<DryTensor>();
    const dw: DecodeWeights = { matrices: [], vectorBytes: 0, embeddingRowBytes: 0 };
    const r: WeightsReport = {
      params: 0, residentBytes: 0, checkpointBytes: 0, checkpointBytesByDtype: {}, residentBytesByDtype: {},
      tensors: 0, unusedTensors: [], unusedBytes: 0, expertBytes: 0, denseReadBytes: 0, embeddingRowBytes: 0,
    };
    const add = (t: Tensor | undefined, read: 'all' | 'expert' | 'none') => {
      const x = t as DryTensor | undefined;
      // views (rows of a packed tensor) are counted with the tensor they view
      if (!x || x.base || seen.has(x)) return;
      seen.add(x);
      const src = x.source!;
      r.tensors++;
      r.params += src.bytes / dtypeBytes[src.dtype];
      r.checkpointBytes += src.bytes;
      r.residentBytes += x.bytes;
      const sk = src.dtype.toUpperCase();
      r.checkpointBytesByDtype[sk] = (r.checkpointBytesByDtype[sk] ?? 0) + src.bytes;
      const rk = x.layout?.name ?? x.dtype; // matrices kept quantized (CPU) under their ggml type
      r.residentBytesByDtype[rk] = (r.residentBytesByDtype[rk] ?? 0) + x.bytes;
      if (read === 'all') {
        r.denseReadBytes += x.bytes;
        if (x.shape.length === 2) dw.matrices.push({ bytes: x.bytes, params: numel(x.shape) });
        else dw.vectorBytes += x.bytes;
      } else if (read === 'expert') {
        r.expertBytes += x.bytes;
      }
    };
    // the lm_head is read whole every step; when tied it is the embedding table itself
    add(w.lmHead, 'all');
    add(w.embed, 'none');
    r.embeddingRowBytes = dw.embeddingRowBytes = (w.embed as DryTensor).bytes / w.embed.shape[0]!;
    add(w.finalNorm, 'all');
    for (const l of w.layers) {
      for (const t of Object.values(l.attn)) add(t, 'all');
      for (const t of [l.inputNorm, l.postAttnNorm, l.preFfNorm, l.postFfNorm]) add(t, 'all');
      if (l.mlp.kind === 'moe') {
        add(l.mlp.router, 'all');
        const stacks = [l.mlp.gate, l.mlp.up, l.mlp.down];
        for (const t of stacks) add(t, 'expert');
        // [E, rows, cols] stacks: one expert's gate, up and down
        const E = stacks[0]!.shape[0]!;
        // the CUDA backend's bf16 expert kernels (grouped by expert from 8 rows): bf16 stacks, gate [E, I, D]
        const groupedKernels = moeVecKernelsApply(stacks.map((t) => t.dtype), stacks[0]!.shape[2]!, stacks[0]!.shape[1]!);
        dw.experts ??= {
          layers: 0, perExpert: stacks.map((t) => ({ bytes: (t as DryTensor).bytes / E, params: numel(t.shape) / E })), numExperts: E,
          topK: this.config.moe?.topK ?? 1, groupedKernels,
        };
        dw.experts.layers++;
      } else {
        for (const t of Object.values(l.mlp)) if (typeof t === 'object') add(t, 'all');
      }
    }
    for (const name of this.source.weights.names()) {
      if (lookup.used.has(name)) continue;
      r.unusedTensors.push(name);
      r.unusedBytes += this.source.weights.entry(name).byteLength;
    }
    this.weightsByKind.set(kind, { report: r, decode: dw });
    return r;
  }

  /**
   * A dry-run model on an allocator model of `kind`: 'exact' sizes (one step alone), the backend's
   * pool as a 'plan' counts it, or the 'real' pool with its cache as a run leaves it. A plan counts
   * the CPU pool's cache in full (it never gives it back: malloc fails, or the kernel's OOM killer
   * acts) but not the CUDA pool's (device-pool.ts gives its cache back when an allocation fails,
   * so a step can only count on its own live blocks).
   */
  private newSimulation(kind: BackendKind, pool: PoolMode, cudaTuning?: CudaTuning): Promise<Simulation> {
    return (async () => {
      const params = kind === 'cpu' ? CPU_POOL : pool === 'plan' ? { ...CUDA_POOL, cacheLimit: 0 } : CUDA_POOL;
      const backend = new DryRunBackend({
        name: kind,
        activationDtype: kind === 'cpu' ? 'f32' : 'bf16',
        allocator: pool === 'exact' ? new ExactModel() : new PoolModel(params),
        ...(await realBackendCaps(kind)),
        // a run tunes each GEMM shape once; a plan counts the tuner's flush buffer at any GEMM
        gemmTune: pool === 'real' ? 'once' : 'always',
        ...(cudaTuning ? { cudaTuning } : {}),
        cuda: this.cuda,
        quantWeights: kind === 'cpu' && this.cpu.quantWeights,
        fp8Weights: kind === 'cuda' && this.cuda.gemv.fp8Weights,
      });
      const w = await this.loadDry(backend, this.source.weights);
      const model = new DecoderModel(backend, this.config, w);
      const kv = new StepKv(backend, this.config, DEFAULT_BLOCK_SIZE);
      backend.allocator.resetPeak();
      return { backend, model, kv, base: backend.allocator.resident };
    })();
  }

  private simulation(kind: BackendKind, pool: PoolMode): Promise<Simulation> {
    const key = `${kind}:${pool}`;
    let sim = this.sims.get(key);
    if (!sim) this.sims.set(key, (sim = this.newSimulation(kind, pool)));
    return sim;
  }

  /** One dry-run forward of a step: `rows - 1` decode rows and one chunk with the rest; the last `sampled` rows sample. */
  private static async step(sim: Simulation, shape: StepShape): Promise<void> {
    const { tokens: T, rows: R } = shape;
    const rows: RowSpan[] = [];
    for (let r = 0; r < R - 1; r++) rows.push({ start: T + r, count: 1 });
    rows.push({ start: 0, count: T - (R - 1) });
    let t = 0;
    const ends = rows.map((row) => (t += row.count) - 1);
    const logitTokens = ends.slice(R - (shape.sampled ?? R));
    sim.kv.tableBlocks = shape.tableBlocks ?? 1;
    await sim.model.forward({ tokens: new Int32Array(T), rows, logitTokens }, sim.kv);
  }

  /**
   * Resident memory above the weights while the engine runs steps of up to `maxTokens` tokens
   * with up to `batch` sampled rows, over any order of such steps (see allocator.ts). Simulated
   * once per (backend kind, batch) for 1, 2, ... tokens; the prefix answers every smaller budget.
   */
  private async stepMemory(kind: BackendKind, batch: number, maxTokens: number): Promise<number> {
    const key = `${kind}:${batch}`;
    let worst = this.worstByTokens.get(key);
    if (!worst) this.worstByTokens.set(key, (worst = [0]));
    if (worst.length <= maxTokens) {
      const sim = await this.simulation(kind, 'plan');
      for (let T = worst.length; T <= maxTokens; T++) {
        await FitPlanner.step(sim, { tokens: T, rows: Math.min(batch, T) });
        worst.push(sim.backend.allocator.worstCase() - sim.base);
      }
    }
    return worst[maxTokens]!;
  }

  /** Peak of one step alone, on an allocator with nothing cached. */
  async largestStep(kind: BackendKind, shape: StepShape): Promise<number> {
    const key = `${kind}:${shape.tokens}:${shape.rows}`;
    let v = this.largestByShape.get(key);
    if (v === undefined) {
      const sim = await this.simulation(kind, 'exact');
      sim.backend.allocator.resetPeak();
      const before = sim.backend.allocator.resident;
      await FitPlanner.step(sim, shape);
      v = sim.backend.allocator.peak - before;
      this.largestByShape.set(key, v);
    }
    return v;
  }

  /**
   * Peak resident memory above the weights for a given sequence of steps, starting from an empty
   * pool (what one run of the engine does: bench/fit-accuracy.ts compares it with RSS).
   */
  async simulateSteps(kind: BackendKind, steps: readonly StepShape[]): Promise<number> {
    return (await this.simulatePool(kind, steps)).peak;
  }

  /**
   * The pool model after `steps`, from an empty pool: resident peak above the weights (with the
   * pool's cache as the backend keeps it, or with `cache: false` a CUDA pool that keeps nothing:
   * live blocks only), the highest live class bytes above the weights, and the pool's own
   * class-byte accounting at the end (what the backend's memoryStats() reports).
   */
  async simulatePool(kind: BackendKind, steps: readonly StepShape[], opts: { cache?: boolean; cudaTuning?: CudaTuning } = {}): Promise<{
    peak: number; livePeak: number; liveClassBytes: number; idleClassBytes: number;
  }> {
    const sim = await this.newSimulation(kind, opts.cache === false ? 'plan' : 'real', opts.cudaTuning);
    const pool = sim.backend.allocator as PoolModel;
    const liveBase = pool.liveClassBytes;
    let livePeak = 0;
    // as backends/cuda/device-pool.ts counts live bytes: a capturing arena's blocks are live, a
    // captured graph's are not (its own graphBytes)
    const backend = sim.backend;
    pool.onChange = () => (livePeak = Math.max(livePeak, pool.liveClassBytes - backend.graphBytes + backend.arenaLiveBytes - liveBase));
    for (const shape of steps) await FitPlanner.step(sim, shape);
    pool.onChange = undefined;
    return { peak: pool.peak - sim.base, livePeak, liveClassBytes: pool.liveClassBytes, idleClassBytes: pool.idleClassBytes };
  }

  /**
   * The KV pools the engine allocates (engine.ts rules) for `batch` sequences of `ctx` tokens:
   * full-attention pools hold kvTokens (default: every sequence at ctx, in whole blocks), sliding
   * pools at most every sequence's window span. Bytes are resident bytes on the backend kind.
   */
  kvPools(ctx: number, batch: number, chunk: number, blockSize: number, kvDtype: KvDtype, kind: BackendKind,
    kvTokens = batch * ceilDiv(ctx, blockSize) * blockSize): { kvTokens: number; bytes: number; groups: KvGroupReport[] } {
    const cfg = this.config;
    const perLayerToken = 2 * cfg.numKvHeads * rowBytes(kvDtype, cfg.headDim);
    const alloc = allocatedBytes(kind);
    const groups = kvGroupsOf(cfg.layers.map((l) => l.window)).map((spec): KvGroupReport => {
      const fullBlocks = Math.max(1, ceilDiv(kvTokens, blockSize));
      const poolBlocks = spec.window === 0
        ? fullBlocks
        : Math.min(fullBlocks, batch * blocksPerSequence(spec.window, ctx, blockSize, chunk));
      const poolBytes = poolBlocks * blockSize * cfg.numKvHeads * rowBytes(kvDtype, cfg.headDim);
      return {
        attention: spec.window === 0 ? 'full' : 'sliding',
        window: spec.window,
        layers: spec.layers.length,
        bytesPerToken: perLayerToken * spec.layers.length,
        tokensPerSequence: blocksPerSequence(spec.window, ctx, blockSize, chunk) * blockSize,
        poolBlocks,
        // K and V pools per layer
        bytes: spec.layers.length * 2 * alloc(poolBytes),
      };
    });
    return { kvTokens, bytes: groups.reduce((a, g) => a + g.bytes, 0), groups };
  }

  /** KV bytes per token across all layers (before any window saturates). */
  kvBytesPerToken(kvDtype: KvDtype): number {
    return this.config.numLayers * 2 * this.config.numKvHeads * rowBytes(kvDtype, this.config.headDim);
  }

  /**
   * CUDA: memory held by the decode graphs the engine captures (models/decode-graphs.ts), one per
   * batch bucket of `buckets`: what each capture allocates (its arena, found by capturing a decode
   * step of that many rows on the dry run, as the decoder does) and its packed input buffer, whose
   * block tables are `width` blocks wide. 0 where the real backend captures no graphs (or the
   * model's rope depends on the length: the decoder then runs every step op by op).
   */
  async graphBytes(buckets: readonly number[], width: number, blockSize = DEFAULT_BLOCK_SIZE): Promise<number> {
    if (!(await realBackendCaps('cuda')).graphs) return 0;
    const groups = kvGroupsOf(this.config.layers.map((l) => l.window)).length;
    const input = (B: number, W: number) => pooledBytes(CUDA_POOL, (4 * B + groups * (B + B * W)) * 4);
    let total = 0;
    for (const B of new Set(buckets)) {
      let arena = this.arenaByBucket.get(B);
      if (arena === undefined) {
        this.graphSim ??= this.newSimulation('cuda', 'plan');
        const sim = await this.graphSim;
        const before = sim.backend.allocator.resident;
        sim.kv.tableBlocks = 1;
        const rows: RowSpan[] = Array.from({ length: B }, (_, r) => ({ start: r, count: 1 }));
        await sim.model.step({ tokens: new Int32Array(B), rows, logitTokens: rows.map((_, r) => r), graphWidth: 1 }, sim.kv, rows.map(() => false));
        const held = sim.backend.allocator.resident - before;
        // nothing held: no graph was captured (a rope that depends on the length)
        arena = held === 0 ? 0 : held - input(B, 1);
        this.arenaByBucket.set(B, arena);
      }
      if (arena > 0) total += arena + input(B, width) + this.invariantPartialBytes(B, B, width, blockSize, true);
    }
    return total;
  }

  /**
   * CUDA batch-invariant mode: the attention partials a call of T tokens on R rows with tables
   * `width` blocks of `blockSize` wide takes (every split each decode token may have: attention.ts), the largest
   * over the model's windows; each call takes them from the step's memory, each captured decode
   * graph keeps its own. Counted for bf16 KV pools (the CUDA default; others run a kernel without
   * partials). 0 outside the mode.
   */
  private invariantPartialBytes(T: number, R: number, width: number, blockSize: number, oneTokenPerRow: boolean): number {
    if (!this.cuda.batchInvariant) return 0;
    const cfg = this.config;
    let worst = 0;
    for (const window of new Set(cfg.layers.map((l) => l.window))) {
      worst = Math.max(worst, batchInvariantPartialBytes({
        T, H: cfg.numHeads, KVH: cfg.numKvHeads, D: cfg.headDim, numBlocks: 1, blockSize, R,
        maxBlocksPerRow: width, window, qDtype: 'bf16', poolDtype: 'bf16', oneTokenPerRow,
      }, this.cuda.attention));
    }
    return worst === 0 ? 0 : allocatedBytes('cuda')(worst);
  }

  /** Transient memory of the largest steps at ctx. */
  async transient(ctx: number, batch: number, chunk: number, blockSize: number, kind: BackendKind): Promise<{
    bytes: number; stepTokens: number; sampledRows: number; largestStepBytes: number; blockTableBytes: number; graphBytes: number;
    /** CUDA batch-invariant mode: the largest step's attention partials (invariantPartialBytes) */
    partialBytes: number;
  }> {
    const stepTokens = Math.max(1, Math.min(chunk, batch * ctx));
    const sampledRows = Math.min(batch, stepTokens);
    // CUDA: the simulated step times what the H200 showed of it (constants.ts; 1 = as simulated)
    const scale = kind === 'cuda' ? K.CUDA_ACTIVATION_SCALE.value : 1;
    const worst = Math.round(scale * await this.stepMemory(kind, batch, stepTokens));
    const largest = Math.round(scale * await this.largestStep(kind, { tokens: stepTokens, rows: sampledRows }));
    const groups = kvGroupsOf(this.config.layers.map((l) => l.window)).length;
    const blockTableBytes = groups * allocatedBytes(kind)(sampledRows * ceilDiv(ctx, blockSize) * 4);
    // CUDA: decode steps of 1 .. batch rows replay graphs captured per bucket, whose memory stays
    // (the engine's table width: the longest sequence in blocks, plus one)
    const graphBytes = kind === 'cuda'
      ? await this.graphBytes(Array.from({ length: batch }, (_, r) => bucketFor(r + 1)), ceilDiv(ctx, blockSize) + 1, blockSize)
      : 0;
    const partialBytes = kind === 'cuda' ? this.invariantPartialBytes(stepTokens, batch, ceilDiv(ctx, blockSize) + 1, blockSize, false) : 0;
    return {
      bytes: worst + blockTableBytes + graphBytes + partialBytes, stepTokens, sampledRows, largestStepBytes: largest, blockTableBytes,
      graphBytes, partialBytes,
    };
  }

  /** The runtime's own memory on a machine kind. */
  reserve(kind: BackendKind): { name: string; bytes: number; measured: boolean }[] {
    if (kind === 'cpu') {
      return [
        { name: 'runtime (Node, llmts, native threads, V8 heap)', bytes: K.CPU_RUNTIME_BYTES.value, measured: K.CPU_RUNTIME_BYTES.measured },
        {
          name: 'tokenizer',
          bytes: Math.round((this.source.tokenizerFileBytes ?? 0) * K.CPU_TOKENIZER_BYTES_PER_FILE_BYTE.value),
          measured: K.CPU_TOKENIZER_BYTES_PER_FILE_BYTE.measured,
        },
      ];
    }
    return [
      { name: 'CUDA context, module, cuBLASLt handle', bytes: K.CUDA_CONTEXT_BYTES.value, measured: K.CUDA_CONTEXT_BYTES.measured },
      { name: 'cuBLASLt workspace', bytes: K.CUDA_CUBLASLT_WORKSPACE_BYTES.value, measured: K.CUDA_CUBLASLT_WORKSPACE_BYTES.measured },
      {
        name: 'runtime growth (lazily loaded kernels, cuBLASLt, CUDA graphs)',
        bytes: K.CUDA_RUNTIME_GROWTH_BYTES.value, measured: K.CUDA_RUNTIME_GROWTH_BYTES.measured,
      },
    ];
  }

  /**
   * One decode step with `batch` rows at position `pos` (each row reads its KV up to pos): its
   * features (bytes of weights and KV read, matmuls, attention arithmetic) and their time on
   * `machine` by the model of decode-model.ts, with the constants of constants.ts.
   */
  async decodeStep(machine: Machine, pos: number, batch: number, kvDtype: KvDtype): Promise<{
    seconds: number; weightBytes: number; kvBytes: number; attentionFlops: number; efficiency: number; overheadMs: number;
    features: DecodeFeatures; terms: DecodeTerm[];
  }> {
    const cpu = machine.kind === 'cpu';
    await this.weights(cpu ? 'cpu' : 'cuda');
    const cfg = this.config;
    const perLayerToken = 2 * cfg.numKvHeads * rowBytes(kvDtype, cfg.headDim);
    // each layer's keys (a sliding layer at most its window); q.k and p.v: 2 multiply-adds per
    // head dim, per key, per query head
    const attention = cfg.layers.map((l) => {
      const keys = Math.min(pos + 1, l.window === 0 ? Infinity : l.window);
      return { kvBytes: keys * perLayerToken * batch, flops: keys * cfg.numHeads * cfg.headDim * 4 * batch };
    });
    const kernels = cpu ? 0 : await this.decodeKernels(batch);
    const features = decodeFeatures(this.weightsByKind.get(cpu ? 'cpu' : 'cuda')!.decode, cfg.numLayers, cpu ? 'cpu' : 'cuda', batch, attention, kernels, cfg.headDim,
      { cpuGemvParallelMinBytes: this.cpu.gemvParallelMinBytes, cudaMoe: this.cuda.moe });
    const { kvBytes, attentionFlops } = features;
    const terms = decodeTerms(features, machine);
    const overheadMs = 1000 * terms.filter((t) => /_OVERHEAD_MS$/.test(t.constant)).reduce((a, t) => a + termSeconds(t), 0);
    return {
      // CUDA MoE: the expert rows the kernels read, every (token, expert) pair its own
      seconds: decodeSeconds(terms), weightBytes: features.weightBytes + features.expertPairBytes, kvBytes, attentionFlops,
      efficiency: cpu ? K.CPU_DECODE_EFFICIENCY.value : K.CUDA_DECODE_EFFICIENCY.value, overheadMs, features, terms,
    };
  }

  /**
   * CUDA: kernels one decode step of `batch` rows launches (the decoder graph on the dry run, plus
   * the device argmax a captured decode graph ends with).
   */
  async decodeKernels(batch: number): Promise<number> {
    let n = this.kernelsByBatch.get(batch);
    if (n === undefined) {
      const sim = await this.simulation('cuda', 'exact');
      const before = sim.backend.kernels;
      await FitPlanner.step(sim, { tokens: batch, rows: batch });
      n = sim.backend.kernels - before + ((await realBackendCaps('cuda')).argmax ? 2 : 0);
      this.kernelsByBatch.set(batch, n);
    }
    return n;
  }

  /** Everything but the search: memory at ctx on a machine. */
  private async totals(machine: Machine, ctx: number, r: ResolvedFitRequest) {
    const kind: BackendKind = machine.kind === 'cpu' ? 'cpu' : 'cuda';
    const w = await this.weights(kind);
    const kv = this.kvPools(ctx, r.batch, r.chunk, r.blockSize, r.kvDtype, kind);
    const planned = await this.transient(ctx, r.batch, r.chunk, r.blockSize, kind);
    const sp = r.speculation;
    const speculation = sp && {
      ...(sp.drafter ? { drafter: sp.drafter } : {}),
      logitBytes: sp.extraLogitRows * sp.vocabSize * 4, drafterBytes: sp.drafterBytes,
      drafterKvBytes: kv.kvTokens * sp.drafterKvBytesPerToken, drafterKvBytesPerToken: sp.drafterKvBytesPerToken,
    };
    const transient = speculation ? { ...planned, bytes: planned.bytes + speculation.logitBytes } : planned;
    const reserve = this.reserve(kind);
    const reserveBytes = reserve.reduce((a, x) => a + x.bytes, 0);
    const drafter = speculation ? speculation.drafterBytes + speculation.drafterKvBytes : 0;
    return { kind, w, kv, transient, reserve, reserveBytes, speculation, total: w.residentBytes + kv.bytes + transient.bytes + reserveBytes + drafter };
  }

  usableBytes(machine: Machine, utilization: number): { bytes: number; how: string } {
    if (machine.kind === 'gpu') {
      return { bytes: Math.floor(machine.memoryBytes * utilization), how: `${machine.memoryBytes} bytes x ${utilization} (--gpu-memory-utilization)` };
    }
    const reserve = K.cpuSystemReserveBytes(machine.memoryBytes);
    return { bytes: machine.memoryBytes - reserve, how: `RAM minus ${reserve} bytes: ${K.CPU_SYSTEM_RESERVE_POLICY}` };
  }

  /** Total bytes needed at ctx (monotone in ctx). */
  async totalBytes(machine: Machine, req: FitRequest): Promise<number> {
    return (await this.totals(machine, req.ctx, this.resolve(machine, req))).total;
  }

  resolve(machine: Machine, req: FitRequest): ResolvedFitRequest {
    const r: ResolvedFitRequest = {
      ctx: req.ctx,
      batch: req.batch ?? 1,
      chunk: req.chunk ?? DEFAULT_CHUNK,
      kvDtype: req.kvDtype ?? (machine.kind === 'cpu' ? 'f32' : 'bf16'),
      blockSize: req.blockSize ?? DEFAULT_BLOCK_SIZE,
      utilization: req.utilization ?? K.DEFAULT_GPU_MEMORY_UTILIZATION,
      speculation: req.speculation,
    };
    const posInt = (name: string, v: number) => {
      if (!Number.isSafeInteger(v) || v < 1) throw new FitError(`${name} must be a positive integer, got ${v}`);
    };
    posInt('ctx', r.ctx);
    posInt('batch', r.batch);
    posInt('chunk', r.chunk);
    posInt('block size', r.blockSize);
    if (!KV_DTYPES.includes(r.kvDtype)) throw new FitError(`KV dtype must be one of ${KV_DTYPES.join(', ')}, got "${r.kvDtype}"`);
    if (machine.kind !== 'cpu' && CPU_ONLY_KV.includes(r.kvDtype)) throw new FitError(`KV dtype ${r.kvDtype} is kept by the CPU backend only`);
    if (!(r.utilization > 0 && r.utilization <= 1)) throw new FitError(`GPU memory utilization must be in (0, 1], got ${r.utilization}`);
    return r;
  }

  /** Largest ctx in [1, hi] whose total fits `usable` (0 when none does); total is monotone in ctx. */
  async maxContext(machine: Machine, r: ResolvedFitRequest, usable: number, hi: number): Promise<number> {
    const fits = async (c: number) => (await this.totals(machine, c, r)).total <= usable;
    if (!(await fits(1))) return 0;
    if (await fits(hi)) return hi;
    let lo = 1; // fits
    let up = hi; // does not
    while (up - lo > 1) {
      const mid = Math.floor((lo + up) / 2);
      if (await fits(mid)) lo = mid;
      else up = mid;
    }
    return lo;
  }

  async plan(machine: Machine, req: FitRequest): Promise<FitPlan> {
    const r = this.resolve(machine, req);
    const cfg = this.config;
    const t = await this.totals(machine, r.ctx, r);
    const usable = this.usableBytes(machine, r.utilization);
    const maxSafe = await this.maxContext(machine, r, usable.bytes, this.contextLength);
    const decode = await this.decodeStep(machine, r.ctx - 1, r.batch, r.kvDtype);
    const unmeasured = K.unmeasuredConstants(t.kind);
    return {
      model: {
        dir: this.source.dir, modelType: cfg.modelType, layers: cfg.numLayers, contextLength: this.contextLength,
        vocabSize: cfg.vocabSize, moe: cfg.moe ? { experts: cfg.moe.numExperts, topK: cfg.moe.topK } : undefined,
      },
      machine,
      ctx: r.ctx, batch: r.batch, chunk: r.chunk, blockSize: r.blockSize, kvDtype: r.kvDtype,
      activationDtype: t.kind === 'cpu' ? 'f32' : 'bf16',
      weightsBytes: t.w.residentBytes,
      weights: t.w,
      kvBytesPerToken: this.kvBytesPerToken(r.kvDtype),
      kvTokens: t.kv.kvTokens,
      kvBytes: t.kv.bytes,
      kv: t.kv.groups,
      transientBytes: t.transient.bytes,
      transient: {
        stepTokens: t.transient.stepTokens, sampledRows: t.transient.sampledRows,
        largestStepBytes: t.transient.largestStepBytes, blockTableBytes: t.transient.blockTableBytes,
        graphBytes: t.transient.graphBytes,
        model: t.kind === 'cpu'
          ? 'decoder graph on the CPU block-pool model: every step shape up to the token budget, cached idle blocks included'
          : `${K.CUDA_ACTIVATION_MODEL}${K.CUDA_ACTIVATION_SCALE.value !== 1 ? ` x ${K.CUDA_ACTIVATION_SCALE.value}` : ''}`,
      },
      reserveBytes: t.reserveBytes,
      reserve: t.reserve,
      totalBytes: t.total,
      usableBytes: usable.bytes,
      usable: usable.how,
      fits: t.total <= usable.bytes,
      headroomBytes: usable.bytes - t.total,
      maxSafeContext: maxSafe,
      maxSafeContextLimitedBy: maxSafe === this.contextLength ? 'model' : 'memory',
      predictedDecodeTps: r.batch / decode.seconds,
      decode: {
        perSequenceTps: 1 / decode.seconds,
        bytesPerStep: decode.weightBytes + decode.kvBytes,
        weightBytesPerStep: decode.weightBytes,
        kvBytesPerStep: decode.kvBytes,
        bandwidthGBps: machine.bandwidthGBps,
        efficiency: decode.efficiency,
        overheadMs: decode.overheadMs,
      },
      ...(t.speculation ? { speculation: t.speculation } : {}),
      unmeasured,
    };
  }
}

/**
 * Which optional ops the real backend of `kind` has: fused ops (the loader packs weights and the
 * decoder takes its fused path), graph capture (decode steps are captured per batch bucket) and a
 * device argmax. The simulation offers the same, so it allocates what the real path allocates.
 * Read from the backend's class, so it follows the backend as ops are added; nothing is opened
 * (no driver, no native library).
 */
type BackendCaps = { fused: boolean; graphs: boolean; argmax: boolean };
const capsByKind = new Map<BackendKind, Promise<BackendCaps>>();
export function realBackendCaps(kind: BackendKind): Promise<BackendCaps> {
  let v = capsByKind.get(kind);
  if (!v) {
    v = (async () => {
      try {
        const proto = (kind === 'cpu'
          ? (await import('../../backends/cpu/cpu-backend.ts')).CpuBackend.prototype
          : (await import('../../backends/cuda/cuda-backend.ts')).CudaBackend.prototype) as unknown as Backend;
        return { fused: hasFusedOps(proto), graphs: !!(proto.captureGraph && proto.copyInto && proto.rowView), argmax: !!proto.argmax };
      } catch {
        return { fused: false, graphs: false, argmax: false };
      }
    })();
    capsByKind.set(kind, v);
  }
  return v;
}

/** Bytes an allocation of `bytes` occupies on a backend kind (KV pools, block tables). */
function allocatedBytes(kind: BackendKind): (bytes: number) => number {
  const p = kind === 'cpu' ? CPU_POOL : CUDA_POOL;
  return (b) => pooledBytes(p, b);
}
