// The GEMM tuner's rules that need no GPU (gemm-tuning.ts): tuning classes, when our GEMV takes
// a class from cuBLASLt, and the per-shape picks of $LLMTS_CUDA_GEMV_PICKS (applied on the GPU by
// cuda-ops.test.ts).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { GEMV_MARGIN, GEMV_MARGIN_AFTER_ATTENTION, gemvBar, gemvMarginAfter, parseGemvPicks, tuneClassOf } from '../../src/backends/cuda/gemm-tuning.ts';

describe('the GEMM tuner', () => {
  it('times rows exactly up to 8, then by classes of 16', () => {
    assert.deepEqual([1, 2, 8, 9, 16, 17, 64].map(tuneClassOf), [1, 2, 8, 16, 16, 32, 64]);
  });

  it('gives a class to a GEMV within GEMV_MARGIN of cuBLASLt alone (default 1.1), to any GEMV with prefer', () => {
    assert.equal(GEMV_MARGIN, 1.1, 'default when $LLMTS_CUDA_GEMV_MARGIN is unset');
    assert.ok(Math.abs(gemvBar(14.8, 'auto') - 16.28) < 1e-9);
    assert.ok(15.8 < gemvBar(14.8, 'auto'), 'o at 8B shapes: our 15.8 us against cuBLASLt 14.8 takes it');
    assert.ok(!(16.5 < gemvBar(14.8, 'auto')), 'more than 10% slower alone keeps cuBLASLt');
    assert.equal(gemvBar(14.8, undefined, 1), 14.8, 'margin 1: only when faster alone');
    assert.equal(gemvBar(14.8, 'prefer'), Infinity);
  });

  it('right after an attention kernel a GEMV gets no margin (the o projection: cuBLASLt when it is faster alone)', () => {
    assert.equal(GEMV_MARGIN_AFTER_ATTENTION, 1, 'default when $LLMTS_CUDA_GEMV_MARGIN_AFTER_ATTENTION is unset');
    assert.equal(gemvMarginAfter('k_attn_decode_tc_d128'), 1);
    assert.equal(gemvMarginAfter('k_attn_combine'), 1);
    assert.equal(gemvMarginAfter('k_attn_decode_tc_d128', 1.1, 1.05), 1.05, 'the knob');
    for (const before of [undefined, 'k_gemvp_normglu_m1_u16', 'k_rope_qkv', 'k_gemv_m1_u8']) assert.equal(gemvMarginAfter(before), GEMV_MARGIN);
    // session 9's o timings (H200, 8B shapes): cuBLASLt 14.5 us, k_gemv_m1_u8/w4 15.3
    assert.ok(!(15.3 < gemvBar(14.5, 'auto', gemvMarginAfter('k_attn_decode_tc_d128'))), 'o stays on cuBLASLt after attention');
    assert.ok(15.3 < gemvBar(14.5, 'auto', gemvMarginAfter('k_gemvp_normglu_m1_u16')), 'elsewhere the GEMV takes it');
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
