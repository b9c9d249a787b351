// An EAGLE-3 head directory is checked against its target before anything loads: each wrong
// layout (config, tensor names and shapes, the d2t / t2d vocabulary maps) is an ArtifactError
// that names the file and what is wrong. The heads here are tiny synthetic ones.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { columnSource, defaultEagle3Layers, loadEagle3Dir } from '../../src/artifacts/eagle3.ts';
import { ArtifactError } from '../../src/artifacts/errors.ts';
import { openWeights } from '../../src/artifacts/safetensors.ts';

const TARGET = { hiddenSize: 8, vocabSize: 16, numLayers: 6 };
const D = 8, H = 2, KVH = 1, HD = 4, I = 12, V = 16, VD = 6;

type Raw = { dtype: 'F32' | 'I64' | 'BOOL'; shape: number[]; bytes: Uint8Array };

const f32 = (shape: number[], seed = 1): Raw => {
  const n = shape.reduce((a, b) => a * b, 1);
  const v = Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 31 + i * 0.7));
  return { dtype: 'F32', shape, bytes: new Uint8Array(v.buffer) };
};
const i64 = (values: number[]): Raw => ({ dtype: 'I64', shape: [values.length], bytes: new Uint8Array(BigInt64Array.from(values.map(BigInt)).buffer) });
const bool = (values: boolean[]): Raw => ({ dtype: 'BOOL', shape: [values.length], bytes: Uint8Array.from(values, (b) => (b ? 1 : 0)) });

function writeSafetensors(file: string, tensors: Record<string, Raw>): void {
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.bytes.length] };
    offset += t.bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(file, Buffer.concat([head, Buffer.from(json), ...Object.values(tensors).map((t) => Buffer.from(t.bytes))]));
}

/** draft ids 0..5 -> target ids 1, 3, 4, 8, 9, 15 */
const DRAFT_IDS = [1, 3, 4, 8, 9, 15];

function config(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    architectures: ['LlamaForCausalLMEagle3'], model_type: 'llama', hidden_size: D, intermediate_size: I,
    num_hidden_layers: 1, num_attention_heads: H, num_key_value_heads: KVH, head_dim: HD, rms_norm_eps: 1e-6,
    max_position_embeddings: 64, rope_theta: 10000, vocab_size: V, draft_vocab_size: VD, tie_word_embeddings: false,
    eagle_config: { eagle_aux_hidden_state_layer_ids: [1, 3, 5], use_aux_hidden_state: true },
    ...over,
  };
}

function tensors(over: Record<string, Raw | undefined> = {}, layer = 'midlayer.'): Record<string, Raw> {
  const t: Record<string, Raw | undefined> = {
    'fc.weight': f32([D, 3 * D], 1),
    [`${layer}hidden_norm.weight`]: f32([D], 2),
    [`${layer}input_layernorm.weight`]: f32([D], 3),
    [`${layer}self_attn.q_proj.weight`]: f32([H * HD, 2 * D], 4),
    [`${layer}self_attn.k_proj.weight`]: f32([KVH * HD, 2 * D], 5),
    [`${layer}self_attn.v_proj.weight`]: f32([KVH * HD, 2 * D], 6),
    [`${layer}self_attn.o_proj.weight`]: f32([D, H * HD], 7),
    [`${layer}post_attention_layernorm.weight`]: f32([D], 8),
    [`${layer}mlp.gate_proj.weight`]: f32([I, D], 9),
    [`${layer}mlp.up_proj.weight`]: f32([I, D], 10),
    [`${layer}mlp.down_proj.weight`]: f32([D, I], 11),
    'norm.weight': f32([D], 12),
    'lm_head.weight': f32([VD, D], 13),
    d2t: i64(DRAFT_IDS.map((t, d) => t - d)),
    t2d: bool(Array.from({ length: V }, (_, t) => DRAFT_IDS.includes(t))),
    ...over,
  };
  return Object.fromEntries(Object.entries(t).filter(([, v]) => v !== undefined)) as Record<string, Raw>;
}

function headDir(cfg: Record<string, unknown> = config(), ts: Record<string, Raw> = tensors()): string {
  const dir = mkdtempSync(join(tmpdir(), 'llmts-eagle3-'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  writeSafetensors(join(dir, 'model.safetensors'), ts);
  return dir;
}

function refused(dir: string, pattern: RegExp, target = TARGET): void {
  assert.throws(() => loadEagle3Dir(dir, target), (e: unknown) => {
    assert.ok(e instanceof ArtifactError, `an ArtifactError, got ${String(e)}`);
    assert.match((e as Error).message, pattern);
    return true;
  });
}

test('a well-formed head loads: config, resolved names, draft -> target ids', () => {
  const h = loadEagle3Dir(headDir(), TARGET);
  assert.deepEqual([...h.config.targetLayers], [1, 3, 5]);
  assert.equal(h.config.targetLayersFrom, 'config');
  assert.equal(h.config.draftVocabSize, VD);
  assert.equal(h.config.layer.hiddenSize, D);
  assert.equal(h.config.layer.headDim, HD);
  assert.equal(h.config.normBeforeResidual, false);
  assert.deepEqual([...h.draftToTarget], DRAFT_IDS);
  assert.equal(h.names.q, 'midlayer.self_attn.q_proj.weight');
  assert.equal(h.names.embed, undefined);
});

test("vLLM's layers.0.* spelling, top-level layer ids, a full draft vocabulary without d2t, default layer ids", () => {
  const full = tensors({ 'lm_head.weight': f32([V, D], 13), d2t: undefined, t2d: undefined }, 'layers.0.');
  const h = loadEagle3Dir(headDir(config({ draft_vocab_size: V, eagle_config: undefined, eagle_aux_hidden_state_layer_ids: [0, 2, 4] }), full), TARGET);
  assert.equal(h.names.q, 'layers.0.self_attn.q_proj.weight');
  assert.deepEqual([...h.config.targetLayers], [0, 2, 4]);
  assert.deepEqual([...h.draftToTarget], Array.from({ length: V }, (_, i) => i));
  const d = loadEagle3Dir(headDir(config({ eagle_config: undefined })), TARGET);
  assert.deepEqual([...d.config.targetLayers], defaultEagle3Layers(TARGET.numLayers));
  assert.deepEqual(defaultEagle3Layers(32), [2, 16, 29]);
  assert.equal(d.config.targetLayersFrom, 'default');
});

test('config problems are refused, naming the file', () => {
  refused(join(tmpdir(), 'llmts-no-such-eagle3-head'), /does not exist/);
  refused(headDir(config({ architectures: ['Qwen3ForCausalLM'] })), /config\.json: architectures \["Qwen3ForCausalLM"\] is not an EAGLE-3 head/);
  refused(headDir(config({ model_type: 'qwen3' })), /must be model_type "llama", got "qwen3"/);
  refused(headDir(config({ num_hidden_layers: 2 })), /heads of 2 layers are not supported/);
  refused(headDir(config({ eagle_config: { use_aux_hidden_state: false } })), /use_aux_hidden_state false/);
  refused(headDir(config({ eagle_config: { eagle_aux_hidden_state_layer_ids: [1, 3] } })), /must be three layer ids, got \[1,3\]/);
  refused(headDir(config({ eagle_config: { eagle_aux_hidden_state_layer_ids: [1, 3, 6] } })), /6 is not a layer of the target \(0\.\.5\)/);
  refused(headDir(config({ vocab_size: 32 })), /vocab_size 32 differs from the target's 16/);
  refused(headDir(config({ draft_vocab_size: 20 })), /draft_vocab_size 20 exceeds vocab_size 16/);
  refused(headDir(config({ target_hidden_size: 16 })), /target_hidden_size 16 differs from the target's hidden size 8/);
  refused(headDir(config({ eagle_config: undefined })), /too few for the default/, { ...TARGET, numLayers: 2 });
});

test('tensor problems are refused, naming the tensor', () => {
  refused(headDir(config(), tensors({ 'fc.weight': undefined })), /tensor "fc\.weight" is not in the checkpoint/);
  refused(headDir(config(), tensors({ 'fc.weight': f32([D, 2 * D]) })), /tensor "fc\.weight" in .* has shape \[8, 16\], expected \[8, 24\]/);
  refused(headDir(config(), tensors({ 'midlayer.self_attn.q_proj.weight': f32([H * HD, D]) })), /q_proj\.weight" in .* has shape \[8, 8\], expected \[8, 16\]/);
  refused(headDir(config(), tensors({ 'lm_head.weight': f32([V, D]) })), /lm_head\.weight" in .* expected \[6, 8\]/);
  refused(headDir(config(), tensors({ d2t: undefined })), /no d2t tensor .* a draft vocabulary of 6 \(not the target's 16\) needs it/);
  refused(headDir(config(), tensors({ d2t: i64([0, 0, 0]) })), /tensor "d2t" .* has shape \[3\], expected \[6\]/);
  refused(headDir(config(), tensors({ d2t: { ...f32([VD]) } })), /tensor "d2t" .* has dtype F32; expected I64/);
  refused(headDir(config(), tensors({ d2t: i64([1, 2, 2, 5, 5, 11]) })), /draft id 5 maps to target id 16, outside the vocabulary of 16/);
  refused(headDir(config(), tensors({ d2t: i64([1, 0, 2, 5, 5, 10]) })), /target id 1 is mapped twice/);
  refused(headDir(config(), tensors({ t2d: bool(Array.from({ length: V }, (_, t) => t === 1)) })), /"t2d" and "d2t" .* disagree about target id 3/);
  refused(headDir(config(), tensors({ t2d: bool([true]) })), /"t2d" .* is BOOL\[1\], expected BOOL\[16\]/);
});

test('columnSource: a column block of a weight, in the stored dtype or as f32', () => {
  const dir = headDir();
  const w = openWeights(dir);
  const src = w.get('midlayer.self_attn.q_proj.weight'); // [8, 16] f32
  const all = new Float32Array(f32([H * HD, 2 * D], 4).bytes.buffer);
  const half = columnSource(src, D, D);
  assert.deepEqual(half.shape, [H * HD, D]);
  const got = new Float32Array(half.decode!('f32').buffer.slice(0));
  for (let r = 0; r < H * HD; r++) for (let c = 0; c < D; c++) assert.equal(got[r * D + c], all[r * 2 * D + D + c]);
  const bf = new Uint16Array(half.decode!('bf16').buffer.slice(0));
  assert.equal(bf.length, H * HD * D);
  assert.throws(() => columnSource(src, 12, 8), /columns 12\.\.20/);
});
