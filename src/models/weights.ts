// Loads a decoder's weights onto a backend. Checkpoint naming differs between families and
// between transformers versions (mixtral's w1/w2/w3 vs gate/up/down, per-expert tensors vs
// fused 3-D expert tensors, phi3's fused projections); this file maps every spelling seen in
// the wild onto one LayerWeights shape so the graph (step-body.ts, layer.ts) has a single form.

import { hasFusedOps, type Backend, type FusedOps, type Tensor, type WeightSource } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';

/** What the loader needs from a checkpoint (artifacts/safetensors implements it). */
export interface WeightLookup {
  has(name: string): boolean;
  get(name: string): WeightSource;
  names(): string[];
}

export interface AttentionWeights {
  q: Tensor; k: Tensor; v: Tensor; o: Tensor; // [out, in]
  qBias?: Tensor; kBias?: Tensor; vBias?: Tensor; oBias?: Tensor;
  /** packed [(H + 2 KVH) * headDim, in] when the backend has fused ops; q/k/v are row views of it */
  qkv?: Tensor;
  qkvBias?: Tensor;
  qNorm?: Tensor; kNorm?: Tensor; // [headDim] ('head') or [heads*headDim] ('full')
}

export interface DenseMlpWeights {
  kind: 'dense';
  gate: Tensor; up: Tensor; down: Tensor; // [I, D], [I, D], [D, I]
  gateBias?: Tensor; upBias?: Tensor; downBias?: Tensor;
  /** packed [2I, D] (gate rows first) when the backend has fused ops; gate/up are row views of it */
  gateUp?: Tensor;
  gateUpBias?: Tensor;
}

export interface MoeWeights {
  kind: 'moe';
  router: Tensor; // [E, D]
  gate: Tensor; up: Tensor; down: Tensor; // [E, I, D], [E, I, D], [E, D, I]
}

export interface LayerWeights {
  attn: AttentionWeights;
  mlp: DenseMlpWeights | MoeWeights;
  /** norms present depend on ModelConfig.normPlacement */
  inputNorm?: Tensor;
  postAttnNorm?: Tensor;
  preFfNorm?: Tensor;
  postFfNorm?: Tensor;
}

export interface ModelWeights {
  embed: Tensor; // [V, D]
  lmHead: Tensor; // [V, D] (the embedding itself when tied)
  finalNorm: Tensor; // [D]
  layers: LayerWeights[];
}

export class MissingWeightError extends Error {}

/** Finds the prefix in front of "embed_tokens.weight" (e.g. "model.", "model.language_model."). */
function detectPrefix(w: WeightLookup, configured: string): string {
  if (w.has(`${configured}embed_tokens.weight`)) return configured;
  const hit = w.names().find((n) => n.endsWith('embed_tokens.weight'));
  if (!hit) throw new MissingWeightError(`no embedding tensor (*embed_tokens.weight) in the checkpoint`);
  return hit.slice(0, hit.length - 'embed_tokens.weight'.length);
}

class Loader {
  constructor(
    readonly backend: Backend,
    private readonly w: WeightLookup,
  ) {}

  first(names: string[]): string | undefined {
    return names.find((n) => this.w.has(n));
  }
  source(names: string[], shape?: number[]): WeightSource {
    const name = this.first(names);
    if (!name) throw new MissingWeightError(`missing tensor ${names[0]}`);
    const src = this.w.get(name);
    if (shape && (src.shape.length !== shape.length || src.shape.some((d, k) => d !== shape[k])))
      throw new MissingWeightError(`tensor ${name} in ${src.path} has shape [${src.shape}], expected [${shape}] from config.json`);
    return src;
  }
  /** a matmul weight or embedding table (the backend may keep it in its own layout) */
  matrix(names: string[], shape: number[]): Promise<Tensor> {
    return this.backend.loadWeight(this.source(names, shape), 'keep', 'matmul');
  }
  vector(names: string[], shape: number[]): Promise<Tensor> {
    return this.backend.loadWeight(this.source(names, shape), 'f32');
  }
  optionalVector(names: string[], shape: number[]): Promise<Tensor> | undefined {
    return this.first(names) ? this.vector(names, shape) : undefined;
  }
  /** Sources packed along dim 0 into one tensor, and a row view of it per source. */
  async packed(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<{ whole: Tensor; parts: Tensor[] }> {
    const b = this.backend as Backend & FusedOps;
    const whole = await b.loadConcat(srcs, as);
    let row = 0;
    const parts = srcs.map((s) => {
      const v = b.rowView(whole, row, s.shape[0]!);
      row += s.shape[0]!;
      return v;
    });
    return { whole, parts };
  }
  /** rows [start, start+rows) of a fused [N, K] matrix (or vector when `as` is f32) */
  rows(name: string, start: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    return this.backend.loadWeightRows(this.source([name]), start, rows, as);
  }
}

/**
 * Whether q/k/v load packed: the backend has the fused ops, and the decoder's fused attention path
 * covers the model (it has no whole-projection qk-norm, which needs q and k apart).
 */
export function packsQkv(backend: Backend, cfg: ModelConfig): boolean {
  return hasFusedOps(backend) && cfg.qkNorm !== 'full';
}

/** Whether dense gate/up load packed (the decoder then runs one GEMM and gluPacked). */
export function packsGateUp(backend: Backend): boolean {
  return hasFusedOps(backend);
}

/** q/k/v (and biases when all three have one) as one packed tensor with row views. */
async function loadPackedQkv(ld: Loader, cfg: ModelConfig, a: string): Promise<Pick<AttentionWeights, 'q' | 'k' | 'v' | 'qkv' | 'qBias' | 'kBias' | 'vBias' | 'qkvBias'> | undefined> {
  const { hiddenSize: D, numHeads: H, numKvHeads: Hk, headDim: hd } = cfg;
  const fusedName = `${a}qkv_proj.weight`;
  const fusedSrc = cfg.fusedQkv && ld.first([fusedName]);
  const srcs = fusedSrc
    ? [ld.source([fusedName], [(H + 2 * Hk) * hd, D])]
    : [ld.source([`${a}q_proj.weight`], [H * hd, D]), ld.source([`${a}k_proj.weight`], [Hk * hd, D]), ld.source([`${a}v_proj.weight`], [Hk * hd, D])];
  const biasNames = fusedSrc ? [`${a}qkv_proj.bias`] : [`${a}q_proj.bias`, `${a}k_proj.bias`, `${a}v_proj.bias`];
  const biasCount = biasNames.filter((n) => ld.first([n])).length;
  if (biasCount !== 0 && biasCount !== biasNames.length) return undefined; // some but not all: load them apart
  const w = await ld.packed(srcs, 'keep');
  const b = ld.backend as Backend & FusedOps;
  const split = (t: Tensor) => [b.rowView(t, 0, H * hd), b.rowView(t, H * hd, Hk * hd), b.rowView(t, (H + Hk) * hd, Hk * hd)];
  const [q, k, v] = split(w.whole);
  let bias: Tensor | undefined;
  if (biasCount > 0) {
    bias = (await ld.packed(biasNames.map((n, i) => ld.source([n], [fusedSrc ? (H + 2 * Hk) * hd : [H * hd, Hk * hd, Hk * hd][i]!])), 'f32')).whole;
  }
  const [qBias, kBias, vBias] = bias ? split(bias) : [undefined, undefined, undefined];
  return { q: q!, k: k!, v: v!, qkv: w.whole, qBias, kBias, vBias, qkvBias: bias };
}

async function loadAttention(ld: Loader, cfg: ModelConfig, p: string, pack: boolean): Promise<AttentionWeights> {
  const { hiddenSize: D, numHeads: H, numKvHeads: Hk, headDim: hd } = cfg;
  const a = `${p}self_attn.`;
  const packed = pack ? await loadPackedQkv(ld, cfg, a) : undefined;
  let q: Promise<Tensor>, k: Promise<Tensor>, v: Promise<Tensor>;
  let qBias, kBias, vBias: Promise<Tensor> | undefined;
  if (packed) {
    q = Promise.resolve(packed.q);
    k = Promise.resolve(packed.k);
    v = Promise.resolve(packed.v);
    qBias = packed.qBias && Promise.resolve(packed.qBias);
    kBias = packed.kBias && Promise.resolve(packed.kBias);
    vBias = packed.vBias && Promise.resolve(packed.vBias);
  } else if (cfg.fusedQkv && ld.first([`${a}qkv_proj.weight`])) {
    ld.source([`${a}qkv_proj.weight`], [(H + 2 * Hk) * hd, D]);
    q = ld.rows(`${a}qkv_proj.weight`, 0, H * hd, 'keep');
    k = ld.rows(`${a}qkv_proj.weight`, H * hd, Hk * hd, 'keep');
    v = ld.rows(`${a}qkv_proj.weight`, (H + Hk) * hd, Hk * hd, 'keep');
    if (ld.first([`${a}qkv_proj.bias`])) {
      qBias = ld.rows(`${a}qkv_proj.bias`, 0, H * hd, 'f32');
      kBias = ld.rows(`${a}qkv_proj.bias`, H * hd, Hk * hd, 'f32');
      vBias = ld.rows(`${a}qkv_proj.bias`, (H + Hk) * hd, Hk * hd, 'f32');
    }
  } else {
    q = ld.matrix([`${a}q_proj.weight`], [H * hd, D]);
    k = ld.matrix([`${a}k_proj.weight`], [Hk * hd, D]);
    v = ld.matrix([`${a}v_proj.weight`], [Hk * hd, D]);
    qBias = ld.optionalVector([`${a}q_proj.bias`], [H * hd]);
    kBias = ld.optionalVector([`${a}k_proj.bias`], [Hk * hd]);
    vBias = ld.optionalVector([`${a}v_proj.bias`], [Hk * hd]);
  }
  const o = ld.matrix([`${a}o_proj.weight`, `${a}dense.weight`], [D, H * hd]);
  const oBias = ld.optionalVector([`${a}o_proj.bias`], [D]);
  let qNorm, kNorm: Promise<Tensor> | undefined;
  if (cfg.qkNorm !== 'none') {
    const qShape = cfg.qkNorm === 'head' ? [hd] : [H * hd];
    const kShape = cfg.qkNorm === 'head' ? [hd] : [Hk * hd];
    qNorm = ld.vector([`${a}q_norm.weight`, `${a}query_layernorm.weight`], qShape);
    kNorm = ld.vector([`${a}k_norm.weight`, `${a}key_layernorm.weight`], kShape);
  }
  return {
    q: await q, k: await k, v: await v, o: await o,
    qBias: await qBias, kBias: await kBias, vBias: await vBias, oBias: await oBias,
    qNorm: await qNorm, kNorm: await kNorm,
    qkv: packed?.qkv, qkvBias: packed?.qkvBias,
  };
}

async function loadDense(ld: Loader, cfg: ModelConfig, p: string, pack: boolean): Promise<DenseMlpWeights> {
  const D = cfg.hiddenSize, I = cfg.intermediateSize;
  const m = `${p}mlp.`;
  const fusedName = `${m}gate_up_proj.weight`;
  const fused = cfg.fusedGateUp && ld.first([fusedName]);
  const hasBias = !fused && !!ld.first([`${m}gate_proj.bias`]);
  if (pack && (!hasBias || ld.first([`${m}up_proj.bias`]))) {
    const srcs = fused ? [ld.source([fusedName], [2 * I, D])] : [ld.source([`${m}gate_proj.weight`], [I, D]), ld.source([`${m}up_proj.weight`], [I, D])];
    const w = await ld.packed(srcs, 'keep');
    const b = ld.backend as Backend & FusedOps;
    const bias = hasBias ? (await ld.packed([ld.source([`${m}gate_proj.bias`], [I]), ld.source([`${m}up_proj.bias`], [I])], 'f32')).whole : undefined;
    return {
      kind: 'dense',
      gate: b.rowView(w.whole, 0, I), up: b.rowView(w.whole, I, I), gateUp: w.whole,
      gateBias: bias && b.rowView(bias, 0, I), upBias: bias && b.rowView(bias, I, I), gateUpBias: bias,
      down: await ld.matrix([`${m}down_proj.weight`], [D, I]),
      downBias: await ld.optionalVector([`${m}down_proj.bias`], [D]),
    };
  }
  if (cfg.fusedGateUp && ld.first([`${m}gate_up_proj.weight`])) {
    ld.source([`${m}gate_up_proj.weight`], [2 * I, D]);
    return {
      kind: 'dense',
      gate: await ld.rows(`${m}gate_up_proj.weight`, 0, I, 'keep'),
      up: await ld.rows(`${m}gate_up_proj.weight`, I, I, 'keep'),
      down: await ld.matrix([`${m}down_proj.weight`], [D, I]),
    };
  }
  return {
    kind: 'dense',
    gate: await ld.matrix([`${m}gate_proj.weight`], [I, D]),
    up: await ld.matrix([`${m}up_proj.weight`], [I, D]),
    down: await ld.matrix([`${m}down_proj.weight`], [D, I]),
    gateBias: await ld.optionalVector([`${m}gate_proj.bias`], [I]),
    upBias: await ld.optionalVector([`${m}up_proj.bias`], [I]),
    downBias: await ld.optionalVector([`${m}down_proj.bias`], [D]),
  };
}

async function loadMoe(ld: Loader, backend: Backend, cfg: ModelConfig, p: string): Promise<MoeWeights> {
  const moe = cfg.moe!;
  const D = cfg.hiddenSize, I = moe.intermediateSize, E = moe.numExperts;
  // mixtral (<= transformers 4) names the block block_sparse_moe and its experts w1/w3/w2.
  const blocks = [`${p}mlp.`, `${p}block_sparse_moe.`];
  const router = await ld.matrix(blocks.map((b) => `${b}gate.weight`).concat(blocks.map((b) => `${b}router.weight`)), [E, D]);
  const perExpert = (suffixes: string[]) => (e: number) => blocks.flatMap((b) => suffixes.map((s) => `${b}experts.${e}.${s}.weight`));
  const gateNames = perExpert(['gate_proj', 'w1']);
  if (ld.first(gateNames(0))) {
    const stack = (names: (e: number) => string[], shape: number[]) =>
      backend.loadStacked(Array.from({ length: E }, (_, e) => ld.source(names(e), shape)), 'keep');
    return {
      kind: 'moe', router,
      gate: await stack(gateNames, [I, D]),
      up: await stack(perExpert(['up_proj', 'w3']), [I, D]),
      down: await stack(perExpert(['down_proj', 'w2']), [D, I]),
    };
  }
  // transformers 5 fused layout: experts.gate_up_proj [E, 2I, D] (gate rows first), experts.down_proj [E, D, I]
  const fused = ld.first(blocks.map((b) => `${b}experts.gate_up_proj`));
  if (!fused) throw new MissingWeightError(`missing tensor ${gateNames(0)[0]} (nor a fused ${blocks[0]}experts.gate_up_proj)`);
  const src = ld.source([fused], [E, 2 * I, D]);
  const halves = Array.from({ length: E }, (_, e) => e);
  const part = (offsetRows: number) =>
    backend.loadStacked(
      halves.map((e) => ({
        ...src,
        name: `${src.name}[${e}]`,
        shape: [I, D],
        offset: src.offset + (e * 2 * I + offsetRows) * D * bytesOf(src.dtype),
      })),
      'keep',
    );
  const downName = fused.replace('gate_up_proj', 'down_proj');
  return { kind: 'moe', router, gate: await part(0), up: await part(I), down: await ld.matrix([downName], [E, D, I]) };
}

const bytesOf = (dtype: WeightSource['dtype']) => (dtype === 'f32' ? 4 : 2);

export async function loadModelWeights(
  backend: Backend,
  cfg: ModelConfig,
  w: WeightLookup,
  onProgress?: (done: number, total: number) => void,
): Promise<ModelWeights> {
  const ld = new Loader(backend, w);
  const packQkv = packsQkv(backend, cfg), packGateUp = packsGateUp(backend);
  const prefix = detectPrefix(w, cfg.weightPrefix);
  const D = cfg.hiddenSize, V = cfg.vocabSize;
  const embed = await ld.matrix([`${prefix}embed_tokens.weight`], [V, D]);
  const layers: LayerWeights[] = [];
  for (let l = 0; l < cfg.numLayers; l++) {
    const p = `${prefix}layers.${l}.`;
    const norm = (name: string) => ld.vector([`${p}${name}.weight`], [D]);
    const lw: LayerWeights = {
      attn: await loadAttention(ld, cfg, p, packQkv),
      mlp: cfg.layers[l].mlp === 'moe' ? await loadMoe(ld, backend, cfg, p) : await loadDense(ld, cfg, p, packGateUp),
    };
    if (cfg.normPlacement !== 'post') lw.inputNorm = await norm('input_layernorm');
    lw.postAttnNorm = await norm('post_attention_layernorm');
    if (cfg.normPlacement !== 'pre') lw.postFfNorm = await norm('post_feedforward_layernorm');
    if (cfg.normPlacement === 'pre_post') lw.preFfNorm = await norm('pre_feedforward_layernorm');
    layers.push(lw);
    onProgress?.(l + 1, cfg.numLayers);
  }
  const finalNorm = await ld.vector([`${prefix}norm.weight`, `${prefix}final_layernorm.weight`], [D]);
  // lm_head sits beside the model prefix ("lm_head.weight", or "model.lm_head.weight"-style wrappers).
  const headNames = ['lm_head.weight', `${prefix.replace(/model\.$/, '')}lm_head.weight`];
  let lmHead = embed;
  if (!cfg.tieWordEmbeddings) {
    if (!ld.first(headNames)) throw new MissingWeightError(`missing tensor lm_head.weight (tie_word_embeddings is false)`);
    lmHead = await ld.matrix(headNames, [V, D]);
  }
  return { embed, lmHead, finalNorm, layers };
}
