// The GEMM tuner's rules that need no GPU (gemm-tuning.ts): tuning classes, when our GEMV takes
// a class from cuBLASLt, and the per-shape picks of $LLMTS_CUDA_GEMV_PICKS (applied on the GPU by
// cuda-ops.test.ts).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { CUDA_DEFAULTS, cudaSettingsFrom } from '../../src/backends/cuda/cuda-settings.ts';
import { gemvBar, gemvMarginAfter, parseGemvPicks, tuneClassOf } from '../../src/backends/cuda/gemm-tuning.ts';

const { gemv: GEMV, attention: { tcTrigger: TRIGGER } } = CUDA_DEFAULTS;
/** the margin behind `before` with the default knobs */
const after = (before: string | undefined) => gemvMarginAfter(before, GEMV, TRIGGER);

describe('the GEMM tuner', () => {
  it('times rows exactly up to 8, then by classes of 16', () => {
    assert.deepEqual([1, 2, 8, 9, 16, 17, 64].map(tuneClassOf), [1, 2, 8, 16, 16, 32, 64]);
  });

  it('gives a class to a GEMV within the margin of cuBLASLt alone (default 1.1), to any GEMV with prefer', () => {
    assert.equal(GEMV.margin, 1.1, 'default when $LLMTS_CUDA_GEMV_MARGIN is unset');
    assert.ok(Math.abs(gemvBar(14.8, 'auto', GEMV.margin) - 16.28) < 1e-9);
    assert.ok(15.8 < gemvBar(14.8, 'auto', GEMV.margin), 'o at 8B shapes: our 15.8 us against cuBLASLt 14.8 takes it');
    assert.ok(!(16.5 < gemvBar(14.8, 'auto', GEMV.margin)), 'more than 10% slower alone keeps cuBLASLt');
    assert.equal(gemvBar(14.8, 'auto', 1), 14.8, 'margin 1: only when faster alone');
    assert.equal(gemvBar(14.8, 'prefer', GEMV.margin), Infinity);
  });

  it('right after an attention kernel that triggers at its start a GEMV gets no margin; after the tc decode kernel (trigger once its splits are done) 1.2', () => {
    assert.equal(GEMV.marginAfterAttention, 1, 'default when $LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION is unset');
    assert.equal(GEMV.marginAfterTcAttention, 1.2, 'default when $LLMTS_CUDA_GEMV_MARGIN_AFTER_TC_ATTENTION is unset');
    assert.equal(TRIGGER, 'loaded', 'default when $LLMTS_CUDA_ATT_TC_TRIGGER is unset');
    assert.equal(after('k_attn_decode_tc_d128'), 1.2);
    assert.equal(after('k_attn_decode_tc_d64'), 1.2);
    assert.equal(after('k_attn_combine'), 1);
    assert.equal(after('k_attn_decode_d128_g4'), 1, 'the CUDA-core decode kernel triggers at entry');
    assert.equal(gemvMarginAfter('k_attn_combine', { ...GEMV, marginAfterAttention: 1.05 }, TRIGGER), 1.05, 'the knob');
    assert.equal(gemvMarginAfter('k_attn_decode_tc_d128', { ...GEMV, marginAfterTcAttention: 1.3 }, TRIGGER), 1.3, 'the tc knob');
    assert.equal(gemvMarginAfter('k_attn_decode_tc_d128', GEMV, 'entry'), 1, 'a tc attention that triggers at entry: as any other');
    for (const before of [undefined, 'k_gemvp_normglu_m1_u16', 'k_rope_qkv', 'k_gemv_m1_u8']) assert.equal(after(before), GEMV.margin);
    // o timings on the H200 at 8B shapes: cuBLASLt 14.3 us, k_gemv_m1_u8/w4 15.9 (1.11x; 0.9-1.1% faster in the step)
    assert.ok(15.9 < gemvBar(14.3, 'auto', after('k_attn_decode_tc_d128')), 'o takes the GEMV behind the tc attention');
    assert.ok(!(15.9 < gemvBar(14.3, 'auto', after('k_attn_combine'))), 'behind a kernel that triggers at entry cuBLASLt keeps it');
    assert.ok(!(15.9 < gemvBar(14.3, 'auto', after('k_gemvp_normglu_m1_u16'))), 'elsewhere 1.1');
  });

  it('$LLMTS_CUDA_ATT_TC_TRIGGER: loaded, split, entry or exit; LLMTS_CUDA_ATT_DEFINES may not set the macro', () => {
    const trigger = (env: Record<string, string>) => cudaSettingsFrom(env).attention.tcTrigger;
    assert.equal(trigger({}), 'loaded');
    assert.equal(trigger({ LLMTS_CUDA_ATT_TC_TRIGGER: 'split' }), 'split');
    assert.equal(trigger({ LLMTS_CUDA_ATT_TC_TRIGGER: 'entry' }), 'entry');
    assert.equal(trigger({ LLMTS_CUDA_ATT_TC_TRIGGER: 'exit' }), 'exit');
    assert.throws(() => trigger({ LLMTS_CUDA_ATT_TC_TRIGGER: 'late' }), /LLMTS_CUDA_ATT_TC_TRIGGER/);
    assert.throws(() => trigger({ LLMTS_CUDA_ATT_DEFINES: 'ATT_TC_TRIGGER=2' }), /LLMTS_CUDA_ATT_DEFINES cannot set ATT_TC_TRIGGER .*use LLMTS_CUDA_ATT_TC_TRIGGER/);
  });

  it('$LLMTS_CUDA_GEMV_PICKS: MxNxK=launch label or cublaslt, each shape once; anything else is refused', () => {
    assert.deepEqual(parseGemvPicks(undefined), new Map());
    assert.deepEqual(parseGemvPicks(''), new Map());
    assert.deepEqual([...parseGemvPicks(' 1x4096x4096=k_gemv_m1_u8/w4, 1x128256x4096=cublaslt ,1x4096x14336=k_gemvp_m1_u16/w2/b2')], [
      ['1x4096x4096', 'k_gemv_m1_u8/w4'], ['1x128256x4096', 'cublaslt'], ['1x4096x14336', 'k_gemvp_m1_u16/w2/b2']]);
    assert.throws(() => parseGemvPicks('1x4096=k_gemv_m1_u8/w4'), /"1x4096=k_gemv_m1_u8\/w4" is not MxNxK=PICK/);
    assert.throws(() => parseGemvPicks('1x2x3='), /is not MxNxK=PICK/);
    assert.throws(() => parseGemvPicks('1x2x8=a,1x2x8=b'), /1x2x8 is listed twice/);
  });
});
