// Batch-invariant mode's choices (CudaSettings.batchInvariant, `--batch-invariant`), no GPU needed:
// for every op whose kernel, tiling, split or reduction order the default mode picks by the number
// of rows (GEMM algorithm and GEMV kernels, the GEMV-fused ops, decode attention's splits and the
// prefill kernel, the MoE FFN's kernels), the choice for 1..256 rows (and prefill-sized row counts)
// is one per weight shape or context length; the default mode, for contrast, does vary. Also the
// setting itself (environment, code, conflicts) and how `--batch-invariant` reaches it. The kernels'
// bits: cuda-batch-invariant-sim.slow.ts (warp simulator, npm run test:slow), cuda-batch-invariant.test.ts (GPU).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { resolveServeOptions } from '../../src/api/serve-options.ts';
import { attBiMaxSplits, attBiSplits, planAttention } from '../../src/backends/cuda/attention.ts';
import { ATT_DEC_MAX_RUN, attentionKernels } from '../../src/backends/cuda/attention-kernels.ts';
import { fusedGemvMaxRows } from '../../src/backends/cuda/cuda-fused-ops.ts';
import { CUDA_DEFAULTS, cudaSettingsFrom } from '../../src/backends/cuda/cuda-settings.ts';
import { gemmPickRule, INVARIANT_PROBE_ROWS } from '../../src/backends/cuda/gemm-tuning.ts';
import { kernelModules } from '../../src/backends/cuda/kernels.ts';
import { moeFfnPath } from '../../src/backends/cuda/moe-kernels.ts';
import { serveOptionsOf } from '../../src/cli/serve.ts';

const BI = cudaSettingsFrom({}, { batchInvariant: true });
/** 1..256 rows, then prefill-sized chunks */
const ROWS = [...Array.from({ length: 256 }, (_, i) => i + 1), 300, 512, 1000, 2048, 8192];
/** weight shapes (N, K) and types of Llama-3.1-8B's projections and lm_head, the demo model's, and an f32 fixture's */
const SHAPES: [string, number, number][] = [
  ['bf16', 6144, 4096], ['bf16', 4096, 4096], ['bf16', 28672, 4096], ['bf16', 4096, 14336], ['bf16', 128256, 4096],
  ['bf16', 640, 384], ['bf16', 8192, 384], ['f32', 128, 64], ['f32', 512, 64],
];

describe('batch-invariant mode: the setting', () => {
  it('off by default; $LLMTS_CUDA_BATCH_INVARIANT on / off; a value in code wins and is checked', () => {
    assert.equal(CUDA_DEFAULTS.batchInvariant, false);
    assert.equal(cudaSettingsFrom({ LLMTS_CUDA_BATCH_INVARIANT: 'on' }).batchInvariant, true);
    assert.equal(cudaSettingsFrom({ LLMTS_CUDA_BATCH_INVARIANT: 'off' }).batchInvariant, false);
    assert.equal(cudaSettingsFrom({ LLMTS_CUDA_BATCH_INVARIANT: 'on' }, { batchInvariant: false }).batchInvariant, false);
    assert.throws(() => cudaSettingsFrom({ LLMTS_CUDA_BATCH_INVARIANT: 'yes please' }), /LLMTS_CUDA_BATCH_INVARIANT/);
    assert.throws(() => cudaSettingsFrom({}, { batchInvariant: 1 as unknown as boolean }), /batchInvariant \(\$LLMTS_CUDA_BATCH_INVARIANT\) must be true or false/);
    assert.ok(Object.isFrozen(BI));
  });

  it('its two sizes: the GEMM rows each weight shape\'s algorithm is chosen for, the decode splits\' key positions', () => {
    assert.equal(BI.gemm.invariantRows, 256);
    assert.equal(BI.attention.invariantChunk, 512);
    assert.equal(cudaSettingsFrom({ LLMTS_CUDA_GEMM_INVARIANT_ROWS: '64' }).gemm.invariantRows, 64);
    assert.equal(cudaSettingsFrom({ LLMTS_CUDA_ATT_INVARIANT_CHUNK: '96' }).attention.invariantChunk, 96);
    for (const bad of ['0', '65537', '1.5']) assert.throws(() => cudaSettingsFrom({ LLMTS_CUDA_GEMM_INVARIANT_ROWS: bad }), /LLMTS_CUDA_GEMM_INVARIANT_ROWS/);
    for (const bad of ['16', '100', '65568']) assert.throws(() => cudaSettingsFrom({ LLMTS_CUDA_ATT_INVARIANT_CHUNK: bad }), /multiple of 32 from 32 to 65536/);
    assert.throws(() => cudaSettingsFrom({ LLMTS_CUDA_ATT_DEFINES: 'ATT_BI=1' }), /cannot set ATT_BI .*LLMTS_CUDA_BATCH_INVARIANT/);
    assert.throws(() => cudaSettingsFrom({ LLMTS_CUDA_ATT_DEFINES: 'ATT_BI_CHUNK=64' }), /cannot set ATT_BI_CHUNK .*LLMTS_CUDA_ATT_INVARIANT_CHUNK/);
  });

  it('knobs that bring back a choice by row count are refused with it, naming both', () => {
    const bi = (env: Record<string, string>) => cudaSettingsFrom({ LLMTS_CUDA_BATCH_INVARIANT: 'on', ...env });
    assert.throws(() => bi({ LLMTS_CUDA_GEMV: 'prefer' }), /batchInvariant \(\$LLMTS_CUDA_BATCH_INVARIANT\) cannot be used with LLMTS_CUDA_GEMV=prefer/);
    assert.throws(() => bi({ LLMTS_CUDA_GEMV: 'k_gemv_m1_u8' }), /cannot be used with LLMTS_CUDA_GEMV=k_gemv_m1_u8/);
    assert.throws(() => bi({ LLMTS_CUDA_GEMV_PICKS: '1x4096x4096=cublaslt' }), /cannot be used with LLMTS_CUDA_GEMV_PICKS/);
    assert.throws(() => bi({ LLMTS_CUDA_ATT_DECODE: 'cuda-core' }), /cannot be used with LLMTS_CUDA_ATT_DECODE=cuda-core/);
    const fine: Record<string, string>[] = [{ LLMTS_CUDA_GEMV: 'off' }, { LLMTS_CUDA_GEMM: 'simple' }, { LLMTS_CUDA_ATTENTION: 'generic' },
      { LLMTS_CUDA_MOE: 'scalar' }];
    for (const ok of fine) {
      assert.equal(bi(ok).batchInvariant, true, JSON.stringify(ok));
    }
    assert.equal(cudaSettingsFrom({ LLMTS_CUDA_GEMV: 'prefer' }).gemv.mode, 'prefer', 'without the mode, as before');
  });

  it('the attention module\'s source: ATT_BI and its chunk only in batch-invariant mode', () => {
    const att = (s: typeof BI) => kernelModules(s).find((m) => m.name === 'attention')!.source;
    assert.ok(!att(CUDA_DEFAULTS).includes('#define ATT_BI 1'));
    assert.ok(att(BI).includes('#define ATT_BI 1\n#define ATT_BI_CHUNK 512\n'));
    assert.equal(attentionKernels(CUDA_DEFAULTS.attention), attentionKernels(CUDA_DEFAULTS.attention, false));
    const others = (s: typeof BI) => kernelModules(s).filter((m) => m.name !== 'attention').map((m) => m.source);
    assert.deepEqual(others(BI), others(CUDA_DEFAULTS), 'the other modules are the same');
  });
});

describe('batch-invariant mode: `--batch-invariant`', () => {
  it('llmts serve: the flag becomes ServeOptions.batchInvariant, resolved into the CUDA settings', () => {
    const o = serveOptionsOf(['--model', 'm', '--batch-invariant']);
    assert.equal(o.batchInvariant, true);
    assert.equal(serveOptionsOf(['--model', 'm']).batchInvariant, undefined);
    const r = resolveServeOptions({ model: 'm', batchInvariant: true, backendSettings: { cuda: { moe: { passRows: 256 } }, cpu: {} } });
    assert.deepEqual(r.backendSettings, { cuda: { moe: { passRows: 256 }, batchInvariant: true }, cpu: {} });
    assert.equal(resolveServeOptions({ model: 'm' }).backendSettings, undefined);
    assert.throws(() => resolveServeOptions({ model: 'm', batchInvariant: 'yes' as unknown as boolean }), /batchInvariant must be true or false/);
    assert.throws(() => resolveServeOptions({ model: 'm', batchInvariant: 1 as unknown as boolean, optionNames: { batchInvariant: '--batch-invariant' } }),
      /--batch-invariant must be true or false/);
  });
});

describe('batch-invariant mode: one choice per weight shape or context length', () => {
  it('GEMM: the algorithm is keyed by the weight shape and types alone, never timed per row class, never a GEMV', () => {
    for (const [t, N, K] of SHAPES) {
      const rules = ROWS.map((M) => gemmPickRule(t, t, 'bf16', M, N, K, BI));
      assert.ok(rules.every((r) => r.kind === 'invariant' && !r.gemv), `${N}x${K}: invariant, no GEMV`);
      assert.equal(new Set(rules.map((r) => r.key)).size, 1, `${N}x${K}: one key for every row count`);
      // the default mode: row classes, buckets and GEMVs (the property above is the mode's, not the rule's)
      const plain = ROWS.map((M) => gemmPickRule(t, t, 'bf16', M, N, K, CUDA_DEFAULTS));
      assert.ok(new Set(plain.map((r) => r.key)).size > 10, `${N}x${K}: the default keys by rows`);
      assert.equal(plain[0]!.gemv, t === 'bf16', `${N}x${K}: a GEMV competes at one row by default`);
    }
    const keys = new Set(SHAPES.map(([t, N, K]) => gemmPickRule(t, t, 'bf16', 1, N, K, BI).key));
    assert.equal(keys.size, SHAPES.length, 'shapes do not share an algorithm');
    assert.notEqual(gemmPickRule('bf16', 'bf16', 'bf16', 1, 4096, 4096, BI).key, gemmPickRule('bf16', 'bf16', 'f32', 1, 4096, 4096, BI).key,
      'nor output types');
  });

  it('GEMM: a shape\'s algorithm is checked at 1..9 rows, at every power of two to 65536 and on either side of each to 4096', () => {
    for (let m = 1; m <= 9; m++) assert.ok(INVARIANT_PROBE_ROWS.includes(m), `${m}`);
    for (let p = 1; p <= 65536; p *= 2) assert.ok(INVARIANT_PROBE_ROWS.includes(p), `${p}`);
    for (let p = 8; p <= 4096; p *= 2) assert.ok(INVARIANT_PROBE_ROWS.includes(p - 1) && INVARIANT_PROBE_ROWS.includes(p + 1), `${p} +- 1`);
    assert.deepEqual([...INVARIANT_PROBE_ROWS].sort((a, b) => a - b), [...INVARIANT_PROBE_ROWS], 'in increasing order');
  });

  it('the GEMV-fused ops (norm + GEMM, norm + gate/up + GLU, norm + q/k/v + rope, GLU + down) take no row count', () => {
    assert.equal(fusedGemvMaxRows(BI), 0);
    assert.equal(fusedGemvMaxRows(CUDA_DEFAULTS), 1, 'by default one row');
  });

  it('MoE: the same kernels for every token count (grouped, on tensor cores by default); a 0 threshold means never', () => {
    const paths = (moe: typeof BI.moe, bi: boolean) => new Set(ROWS.map((T) => JSON.stringify(moeFfnPath(T, 128, 8, moe, bi))));
    assert.deepEqual([...paths(BI.moe, true)], [JSON.stringify({ grouped: true, tc: true, tcDown: true })]);
    assert.deepEqual([...paths({ ...BI.moe, tcMinRows: 0, tcDownMinRows: 0 }, true)], [JSON.stringify({ grouped: true, tc: false, tcDown: false })]);
    assert.deepEqual([...paths({ ...BI.moe, tcDownMinRows: 0 }, true)], [JSON.stringify({ grouped: true, tc: true, tcDown: false })]);
    assert.deepEqual([...paths({ ...BI.moe, groupedMinRows: 0 }, true)], [JSON.stringify({ grouped: false, tc: false, tcDown: false })]);
    assert.equal(paths(CUDA_DEFAULTS.moe, false).size, 3, 'by default: pairs below 8 tokens, CUDA cores below 64, tensor cores');
    assert.equal(moeFfnPath(1, 4096, 8, BI.moe, true).grouped, false, 'more experts than k_moe_group takes: pairs, at every T');
  });
});

describe('batch-invariant attention plans (planAttention)', () => {
  const shape = { T: 16, H: 32, KVH: 8, D: 128, numBlocks: 4096, blockSize: 16, R: 16, maxBlocksPerRow: 256, window: 0,
    qDtype: 'bf16', poolDtype: 'bf16' } as const;
  const att = CUDA_DEFAULTS.attention;

  it(`the same kernels for 1..256 rows and tokens: tensor-core decode, the matching prefill kernel past ${ATT_DEC_MAX_RUN} tokens a row`, () => {
    for (let rows = 1; rows <= 256; rows++) {
      for (const T of [rows, rows * 3, rows + 500]) {
        const p = planAttention({ ...shape, T, R: rows }, 132, att, true);
        assert.equal(p.decodeKernel, 'k_attn_decode_tc_d128');
        assert.equal(p.prefillKernel, T > ATT_DEC_MAX_RUN ? 'k_attn_prefill_bi_d128' : undefined, `${rows} rows, ${T} tokens`);
        assert.ok(p.fusedCombine && !p.combine);
      }
      const decode = planAttention({ ...shape, T: rows, R: rows, oneTokenPerRow: true }, 132, att, true);
      assert.ok(decode.identityList && !decode.prefillKernel);
    }
  });

  it('a token\'s splits follow its position alone (multiples of invariantChunk), the partials hold every decode token\'s', () => {
    assert.deepEqual([0, 1, 511, 512, 513, 4096].map((len) => attBiSplits(0, len, 512)), [1, 1, 1, 1, 2, 8]);
    assert.equal(attBiSplits(500, 37, 512), 2, 'a window across a multiple');
    assert.equal(attBiSplits(513, 37, 512), 1);
    assert.equal(attBiMaxSplits(256, 16, 0, 512), 8);
    assert.equal(attBiMaxSplits(256, 16, 4096, 512), 8, 'a window as long as the table');
    assert.equal(attBiMaxSplits(256, 16, 1000, 512), 3, 'a window: one more than its length takes');
    for (const T of [1, 16, 200]) {
      const p = planAttention({ ...shape, T, R: T }, 132, att, true);
      assert.equal(p.partRows, Math.min(T, ATT_DEC_MAX_RUN * T) * 8);
    }
    const mixed = planAttention({ ...shape, T: 3000, R: 20 }, 132, att, true);
    assert.equal(mixed.partRows, 20 * ATT_DEC_MAX_RUN * 8, `at most ${ATT_DEC_MAX_RUN} decode tokens a row`);
  });

  it('shapes the tensor-core pair does not take run the generic kernel for every token, whatever the rows', () => {
    for (const s of [{ D: 256 }, { D: 64, H: 64, KVH: 2 }, { D: 16 }] as const) {
      for (const T of [1, 7, 300]) assert.equal(planAttention({ ...shape, ...s, T, R: 1 }, 132, att, true).path, 'generic');
    }
    assert.equal(planAttention({ ...shape, poolDtype: 'f32' }, 132, att, true).path, 'generic');
  });
});
