// The CUDA backend's settings object (cuda-settings.ts), no GPU needed: every knob's default, the
// environment and code overrides, and the kernel sources the settings produce: for the defaults the
// host-planned macros are exactly the ones the kernels were tuned with and no tuning define is
// added, and the same settings written out in the environment give byte-identical sources (so
// their cache keys, nvrtc.ts, stay the same).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { attDecodeTcKernels } from '../../src/backends/cuda/attention-decode-tc.ts';
import { attentionKernels } from '../../src/backends/cuda/attention-kernels.ts';
import { CUDA_DEFAULTS, cudaSettingsFrom } from '../../src/backends/cuda/cuda-settings.ts';
import { KERNEL_PRELUDE, kernelModules, moduleDefines } from '../../src/backends/cuda/kernels.ts';

const sources = (s = CUDA_DEFAULTS) => Object.fromEntries(kernelModules(s).map((m) => [m.name, m.source]));

describe('CUDA settings', () => {
  it('every knob at its default with an empty environment', () => {
    const { runtime, ...rest } = CUDA_DEFAULTS;
    assert.deepEqual({ ...runtime, cacheDir: undefined }, {
      device: 0, pdl: true, graphProfile: false, profilerGraphs: null, slowCallMs: 0, cacheDir: undefined,
    });
    assert.match(runtime.cacheDir, /llmts[/\\]cuda$/);
    assert.deepEqual(rest, {
      batchInvariant: false,
      kernels: { attentionDefines: {}, gemvDefines: {}, fusedDefines: {} },
      gemm: { engine: 'cublaslt', tune: true, tuneMaxM: 64, pickBucketRows: 64, tuneFlush: 'read', invariantRows: 256 },
      gemv: {
        mode: 'auto', picks: new Map(), margin: 1.1, marginAfterAttention: 1, marginAfterTcAttention: 1.2, fusedBlocksPerSm: 2,
        fp8Weights: true, fp8GemvMaxRows: 16, fp8Gemv: 'tensor-core', fp8TcWarps: 4,
      },
      attention: {
        mode: 'auto', decodeKernel: 'tc', decodeBlocksPerSm: 8, tcResident: 3, oneTokenHint: true, tcMinChunk: 64,
        tcGrid: 'heads-first', tcTrigger: 'loaded', tcStages: 2, pfStages: 2, invariantChunk: 512,
      },
      fused: { fuseGlu: false, fuseNorm: true, ropeEpilogue: false, gluEpilogue: true },
      moe: { kernels: 'vec', groupedMinRows: 8, passRows: 2048, tcMinRows: 64, tcDownMinRows: 64, downRows: 4, hiddenRows: 2 },
    });
    for (const group of Object.values(CUDA_DEFAULTS)) assert.ok(Object.isFrozen(group));
    assert.ok(Object.isFrozen(CUDA_DEFAULTS));
  });

  it('reads each variable as its own meaning; code overrides win, group by group', () => {
    const s = cudaSettingsFrom({
      LLMTS_CUDA_DEVICE: '1', LLMTS_CUDA_PDL: 'off', LLMTS_CUDA_GRAPH_PROFILE: '1', LLMTS_CUDA_PROFILER_GRAPHS: '60:2',
      LLMTS_CUDA_SLOW_CALL_MS: '8', LLMTS_CACHE_DIR: '/tmp/c', LLMTS_CUDA_GEMM: 'simple', LLMTS_CUDA_GEMM_TUNE: 'off',
      LLMTS_CUDA_GEMV: 'prefer', LLMTS_CUDA_GEMV_PICKS: '1x2x8=cublaslt', LLMTS_CUDA_GEMVP_FUSED_BPS: '3',
      LLMTS_CUDA_ATT_DECODE: 'cuda-core', LLMTS_CUDA_ATT_TC_GRID: 'slots-first', LLMTS_CUDA_MOE_DOWN_ROWS: '1',
      LLMTS_CUDA_MOE_HIDDEN_ROWS: '1', LLMTS_CUDA_FUSE_GLU: 'on', LLMTS_CUDA_GEMV_DEFINES: 'GEMVP_MINB=3, GEMV_UNR=8',
      LLMTS_CUDA_FP8_WEIGHTS: 'off', LLMTS_CUDA_FP8_GEMV_MAX_ROWS: '2', LLMTS_CUDA_FP8_GEMV: 'cuda-core',
    }, { attention: { tcStages: 3 }, moe: { passRows: 256 } });
    assert.deepEqual([s.runtime.device, s.runtime.pdl, s.runtime.graphProfile, s.runtime.profilerGraphs, s.runtime.slowCallMs],
      [1, false, true, { from: 60, count: 2 }, 8]);
    assert.equal(s.runtime.cacheDir, '/tmp/c/cuda');
    assert.deepEqual([s.gemm.engine, s.gemm.tune, s.gemv.mode, [...s.gemv.picks], s.gemv.fusedBlocksPerSm],
      ['simple', false, 'prefer', [['1x2x8', 'cublaslt']], 3]);
    assert.deepEqual([s.attention.decodeKernel, s.attention.tcGrid, s.attention.tcStages], ['cuda-core', 'slots-first', 3]);
    assert.deepEqual([s.moe.downRows, s.moe.hiddenRows, s.moe.passRows, s.moe.tcMinRows], [1, 1, 256, 64]);
    assert.equal(s.fused.fuseGlu, true);
    assert.deepEqual([s.gemv.fp8Weights, s.gemv.fp8GemvMaxRows, s.gemv.fp8Gemv], [false, 2, 'cuda-core']);
    assert.throws(() => cudaSettingsFrom({ LLMTS_CUDA_FP8_GEMV_MAX_ROWS: '17' }), /LLMTS_CUDA_FP8_GEMV_MAX_ROWS/);
    assert.deepEqual(s.kernels.gemvDefines, { GEMVP_MINB: 3, GEMV_UNR: 8 });
    assert.equal(cudaSettingsFrom({ XDG_CACHE_HOME: '/x' }).runtime.cacheDir, '/x/llmts/cuda');
    assert.throws(() => cudaSettingsFrom({}, { gemv: { fusedBlocksPerSm: 4 as 2 } }), /gemv\.fusedBlocksPerSm \(\$LLMTS_CUDA_GEMVP_FUSED_BPS\) must be 2 or 1 or 3, got 4/);
    assert.throws(() => cudaSettingsFrom({}, { kernels: { attentionDefines: { ATT_TC_MIN_CHUNK: 32 } } }), /cannot set ATT_TC_MIN_CHUNK/);
  });

  it('the default kernel sources: the host-planned attention macros as tuned, no tuning defines in front of any module', () => {
    const att = attentionKernels(CUDA_DEFAULTS.attention);
    assert.ok(att.startsWith('\n#define ATT_DEC_MAX_RUN 8\n#define ATT_DEC_INLINE_T 128\n#define ATT_MIN_CHUNK 64\n#define ATT_TC_MIN_CHUNK 64\n' +
      '#define ATT_TC_BK 32\n#define ATT_TC_HEADS_FIRST 1\n#define ATT_TC_TRIGGER 3\n'), att.slice(0, 300));
    assert.ok(att.includes('\n#define ATT_BQ 64\n#define ATT_PF_STAGES 2\n'));
    assert.ok(attDecodeTcKernels(2).startsWith('#define ATT_TC_STAGES 2\n'));
    const src = sources();
    for (const [name, source] of Object.entries(src)) {
      assert.ok(source.startsWith(KERNEL_PRELUDE), name);
      assert.ok(!source.slice(KERNEL_PRELUDE.length, KERNEL_PRELUDE.length + 40).startsWith('#define'), `${name}: no define before its kernels`);
    }
    assert.ok(src.attention!.endsWith(attDecodeTcKernels(2)), 'the tensor-core decode kernel last, at the default stages');
    assert.equal(moduleDefines({}), '');
    assert.equal(moduleDefines({ ATT_TC_PHASES: 1, ATT_DEC_U4: -2 }), '#define ATT_TC_PHASES 1\n#define ATT_DEC_U4 -2\n');
  });

  it('the defaults written out in the environment give byte-identical sources; other values change only their module', () => {
    const explicit = cudaSettingsFrom({
      LLMTS_CUDA_ATT_TC_MIN_CHUNK: '64', LLMTS_CUDA_ATT_TC_GRID: 'heads-first', LLMTS_CUDA_ATT_TC_TRIGGER: 'loaded',
      LLMTS_CUDA_ATT_TC_STAGES: '2', LLMTS_CUDA_ATT_PF_STAGES: '2', LLMTS_CUDA_ATT_DEFINES: ' ', LLMTS_CUDA_GEMV_DEFINES: '',
    });
    assert.deepEqual(sources(explicit), sources());
    const base = sources();
    const changed = (s: ReturnType<typeof cudaSettingsFrom>) =>
      Object.entries(sources(s)).filter(([name, source]) => source !== base[name]).map(([name]) => name);
    assert.deepEqual(changed(cudaSettingsFrom({ LLMTS_CUDA_ATT_TC_STAGES: '3' })), ['attention']);
    assert.deepEqual(changed(cudaSettingsFrom({ LLMTS_CUDA_ATT_DEFINES: 'ATT_TC_PHASES=1' })), ['attention']);
    assert.deepEqual(changed(cudaSettingsFrom({ LLMTS_CUDA_GEMV_DEFINES: 'GEMVP_MINB=3' })), ['gemv']);
    assert.deepEqual(changed(cudaSettingsFrom({ LLMTS_CUDA_FUSED_DEFINES: 'ROPE_EARLY=0' })), ['fused']);
    assert.deepEqual(changed(cudaSettingsFrom({ LLMTS_CUDA_FUSE_NORM: 'off', LLMTS_CUDA_MOE: 'scalar' })), [], 'host-only knobs');
    const phases = sources(cudaSettingsFrom({ LLMTS_CUDA_ATT_DEFINES: 'ATT_TC_PHASES=1' })).attention!;
    assert.equal(phases, KERNEL_PRELUDE + '#define ATT_TC_PHASES 1\n' + base.attention!.slice(KERNEL_PRELUDE.length));
  });
});
