// Batch-invariant mode on the GPU (CudaSettings.batchInvariant): a request's tokens and logprobs do
// not depend on the other rows of its steps. Ops first, bit for bit: a GEMM's row at M = 1..300
// rows (bf16 weights of Llama-3.1-8B's shapes and lm_head, f32 weights), the MoE FFN's token at 1
// and at 40 tokens (bf16 experts: grouped, on tensor cores), attention at head dim 128 of a prompt
// whole, in chunks whose tails are decode tokens, and its decode tokens beside other rows. Then
// the engine: B concurrent requests (B = 1..32; identical prompts, mixed prompts with greedy and
// seeded sampling) against each request alone, a prompt chunked by a small token budget, and one
// served from the prefix cache, on the demo model (bf16: the tensor-core attention pair, graphs),
// the llama fixture (f32 weights, generic attention) and the qwen3_moe fixture (experts). Logprobs
// compare with Object.is. Skipped with the reason where CUDA is not usable (CI).
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { type CudaBackend, createCudaBackend, probeCuda } from '../../src/backends/cuda/index.ts';
import type { PagedKv, Tensor } from '../../src/contracts/backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { randomF32, rng, scatteredBlockTables, WeightDir } from './helpers.ts';
import { batchInvarianceCases } from '../helpers/batch-invariance.ts';

const probe = probeCuda();
const SKIP: string | false = probe.ok ? false : `CUDA is not usable here: ${probe.reason}`;
if (SKIP) console.log(`# cuda-batch-invariant: skipping every test: ${SKIP}`);

const ROOT = resolve(import.meta.dirname, '../..');
const OUTPUT_TOKENS = 8;

let backend: CudaBackend;
const weights = new WeightDir();
before(async () => {
  if (SKIP) return;
  backend = await createCudaBackend({ settings: { batchInvariant: true } });
  console.log(`# ${backend.describe()}`);
});
after(async () => {
  weights.cleanup();
  if (SKIP) return;
  await backend.close();
});

/** The bits of a read-back tensor (bf16 reads come back as f32 values: their bits as u32). */
async function bits(t: Tensor): Promise<Uint32Array> {
  const v = await backend.read(t);
  return new Uint32Array(v.buffer, v.byteOffset, v.length);
}

/** The first index where rows [0, n) of `got` ([n, width]) differ from `want`'s, or -1. */
function firstDiff(got: Uint32Array, want: Uint32Array, n: number, width: number): number {
  for (let i = 0; i < n * width; i++) if (got[i] !== want[i]) return i;
  return -1;
}

/** bf16 activations [rows, cols] of seeded values (a bf16 tensor: scale by 1 rounds the upload) */
function activations(seed: number, rows: number, cols: number, scale = 1): Tensor {
  return backend.scale(backend.upload(randomF32(rng(seed), rows * cols, scale), [rows, cols]), 1);
}

describe('batch-invariant ops on CUDA, bit for bit', { skip: SKIP }, () => {
  it('matmul: each row at M = 1..300 is the M = 300 row (one cuBLASLt algorithm per weight shape)', async () => {
    const MS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 100, 128, 129, 255, 256, 257, 300];
    const shapes: [number, number, 'bf16' | 'f32'][] = [
      [6144, 4096, 'bf16'], [4096, 4096, 'bf16'], [28672, 4096, 'bf16'], [4096, 14336, 'bf16'], [128256, 4096, 'bf16'],
      [1024, 4096, 'bf16'], [640, 384, 'bf16'], [512, 64, 'f32'],
    ];
    for (const [N, K, dt] of shapes) {
      backend.beginScope();
      try {
        const w = await backend.loadWeight(weights.write(randomF32(rng(N + K), N * K, 0.05), dt, [N, K]), 'keep');
        const x = activations(K, 300, K);
        const full = await bits(backend.matmul(x, w));
        for (const M of MS) {
          const got = await bits(backend.matmul(backend.rowView(x, 0, M), w));
          const at = firstDiff(got, full, M, N);
          assert.equal(at, -1, `${N}x${K} ${dt}: at M = ${M}, row ${Math.floor(at / N)} column ${at % N} differs from M = 300`);
        }
        backend.free(w);
      } finally {
        backend.endScope();
      }
    }
  });

  it('moeFfn with bf16 experts: each token alone is the same token among 40 (grouped by expert, tensor cores)', async () => {
    const T = 40, D = 256, I = 128, E = 16, K = 4;
    backend.beginScope();
    try {
      const load = async (seed: number, shape: number[]) =>
        backend.loadWeight(weights.write(randomF32(rng(seed), shape.reduce((a, b) => a * b), 0.1), 'bf16', shape), 'keep');
      const gate = await load(1, [E, I, D]), up = await load(2, [E, I, D]), down = await load(3, [E, D, I]);
      const x = activations(4, T, D);
      const logits = backend.upload(randomF32(rng(5), T * E, 3), [T, E]);
      const route = backend.moeRoute(logits, K, true);
      const all = await bits(backend.moeFfn(x, route, gate, up, down, 'silu'));
      for (let t = 0; t < T; t++) {
        const one = backend.moeFfn(backend.rowView(x, t, 1), backend.moeRoute(backend.rowView(logits, t, 1), K, true), gate, up, down, 'silu');
        const got = await bits(one);
        const at = firstDiff(got, all.subarray(t * D), 1, D);
        assert.equal(at, -1, `token ${t}: column ${at} alone differs from among ${T}`);
      }
    } finally {
      backend.endScope();
    }
  });

  it('attention, head dim 128, GQA 4: a prompt whole, in chunks with 1-3-token tails (decode kernel), and decode tokens beside other rows', async () => {
    const H = 32, KVH = 8, D = 128, BS = 16, lens = [1500, 700, 90];
    const need = lens.map((n) => Math.ceil(n / BS));
    const NB = need.reduce((a, b) => a + b, 0) + 4, MBR = Math.max(...need) + 2;
    const r = rng(31);
    const tables = scatteredBlockTables(r, need, MBR, NB);
    backend.beginScope();
    try {
      const pool = () => backend.scale(backend.upload(randomF32(r, NB * BS * KVH * D), [NB, BS, KVH, D]), 1);
      const kv: PagedKv = { k: pool(), v: pool() };
      const qAll = lens.map((n) => randomF32(r, n * H * D, 2));
      const bt = backend.upload(tables, [lens.length, MBR]);
      /** each token's output bits ([H, D] as u32 per bf16 value) by "row:position" */
      const attend = async (tokens: [number, number][], oneTokenPerRow = false) => {
        const q = new Float32Array(tokens.length * H * D);
        tokens.forEach(([row, p], t) => q.set(qAll[row]!.subarray(p * H * D, (p + 1) * H * D), t * H * D));
        const layout = {
          tokenRow: backend.upload(Int32Array.from(tokens, (t) => t[0]), [tokens.length]),
          tokenPos: backend.upload(Int32Array.from(tokens, (t) => t[1]), [tokens.length]),
          slots: backend.upload(new Int32Array(tokens.length).fill(-1), [tokens.length]),
          blockTables: bt, blockSize: BS, oneTokenPerRow,
        };
        const out = await bits(backend.attention(backend.scale(backend.upload(q, [tokens.length, H, D]), 1), kv, layout,
          { scale: 1 / Math.sqrt(D), window: 0, softcap: 0 }));
        return new Map(tokens.map(([row, p], t) => [`${row}:${p}`, out.slice(t * H * D, (t + 1) * H * D)]));
      };
      const run = (row: number, from: number, to: number): [number, number][] => Array.from({ length: to - from }, (_, i) => [row, from + i]);
      const calls: [string, [number, number][], boolean?][] = [
        ['row 0 whole', run(0, 0, 1500)],
        ['row 0 chunk 1000-1497 beside row 1 whole', [...run(1, 0, 700), ...run(0, 1000, 1497)]],
        ['row 0 tail of 3', run(0, 1497, 1500)],
        ['row 0 tail of 1 beside row 2 whole', [[0, 1499], ...run(2, 0, 90)]],
        ['decode tokens, one a row', [[0, 1499], [1, 699], [2, 89]], true],
        ['decode alone', [[0, 1499]]],
        ['row 1 tail of 2 beside decode tokens', [...run(1, 698, 700), [0, 1499], [2, 50]]],
      ];
      const first = new Map<string, { bits: Uint32Array; what: string }>();
      let compared = 0;
      for (const [what, tokens, one] of calls) {
        for (const [token, b] of await attend(tokens, one)) {
          const seen = first.get(token);
          if (!seen) {
            first.set(token, { bits: b, what });
            continue;
          }
          const at = b.findIndex((v, i) => v !== seen.bits[i]);
          assert.equal(at, -1, `token ${token} element ${at}: ${what} differs from ${seen.what}`);
          compared++;
        }
      }
      // every token of each call after the first that holds it: 497 + 3 + 1 + 3 + 1 + 4
      assert.equal(compared, 509, 'outputs compared');
    } finally {
      backend.endScope();
    }
  });
});

for (const { name, dir } of [
  { name: 'demo (bf16 weights, head dim 64: the tensor-core attention pair)', dir: join(ROOT, 'models/demo') },
  { name: 'llama fixture (f32 weights)', dir: join(ROOT, 'test/fixtures/llama') },
  { name: 'qwen3_moe fixture (experts)', dir: join(ROOT, 'test/fixtures/qwen3_moe') },
]) {
  describe(`batch invariance on CUDA: ${name}`, { skip: SKIP }, () => {
    let m: LoadedModel;
    before(async () => {
      m = await loadModel(backend, dir, { maxModelLen: 512 });
    });

    batchInvarianceCases(() => m, OUTPUT_TOKENS);
  });
}
