// Writes small random-weight Hugging Face model directories for tests that exercise behaviour
// (engine, server, errors) rather than numerics: config.json, model.safetensors, a byte-level
// tokenizer.json (256 byte tokens + specials, no merges) and a ChatML template.

import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { byteLevelCharToByte } from '../../src/artifacts/byte-level.ts';

export const SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

export function byteLevelTokenizerJson(): object {
  const vocab: Record<string, number> = {};
  for (const [ch, b] of byteLevelCharToByte()) vocab[ch] = b;
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: SPECIALS.map((content, k) => ({
      id: 256 + k, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [],
    },
  };
}

const CHATML =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** Deterministic pseudo-random floats in [-scale, scale). */
function randomFloats(n: number, seed: number, scale: number): Float32Array {
  let s = seed >>> 0 || 1;
  const out = new Float32Array(n);
  for (let k = 0; k < n; k++) {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    out[k] = ((s / 2 ** 32) * 2 - 1) * scale;
  }
  return out;
}

export function writeSafetensors(file: string, tensors: Record<string, { shape: number[]; data: Float32Array }>): void {
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  const body = Buffer.concat(Object.values(tensors).map((t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength)));
  writeFileSync(file, Buffer.concat([head, Buffer.from(json), body]));
}

export interface TinyLlamaOptions {
  hidden?: number;
  layers?: number;
  heads?: number;
  kvHeads?: number;
  intermediate?: number;
  maxPositions?: number;
  slidingWindow?: number;
  seed?: number;
  /** the chat template (default: plain ChatML) */
  chatTemplate?: string;
}

/** A random llama-family (qwen2 when slidingWindow is set) model directory; returns its path. */
export function writeTinyLlama(opts: TinyLlamaOptions = {}): string {
  const D = opts.hidden ?? 32, L = opts.layers ?? 2, H = opts.heads ?? 4, Hk = opts.kvHeads ?? 2;
  const I = opts.intermediate ?? 64, V = 256 + SPECIALS.length, hd = D / H;
  const dir = mkdtempSync(join(tmpdir(), 'llmts-tiny-'));
  let seed = opts.seed ?? 7;
  const t = (shape: number[], scale = 0.2) => ({ shape, data: randomFloats(shape.reduce((a, b) => a * b), seed++, scale) });
  const ones = (n: number) => ({ shape: [n], data: new Float32Array(n).fill(1) });
  const tensors: Record<string, { shape: number[]; data: Float32Array }> = { 'model.embed_tokens.weight': t([V, D], 1) };
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    Object.assign(tensors, {
      [`${p}input_layernorm.weight`]: ones(D),
      [`${p}post_attention_layernorm.weight`]: ones(D),
      [`${p}self_attn.q_proj.weight`]: t([H * hd, D]),
      [`${p}self_attn.k_proj.weight`]: t([Hk * hd, D]),
      [`${p}self_attn.v_proj.weight`]: t([Hk * hd, D]),
      [`${p}self_attn.o_proj.weight`]: t([D, H * hd]),
      [`${p}mlp.gate_proj.weight`]: t([I, D]),
      [`${p}mlp.up_proj.weight`]: t([I, D]),
      [`${p}mlp.down_proj.weight`]: t([D, I]),
    });
  }
  tensors['model.norm.weight'] = ones(D);
  tensors['lm_head.weight'] = t([V, D]);
  writeSafetensors(join(dir, 'model.safetensors'), tensors);
  const config: Record<string, unknown> = {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: V, hidden_size: D,
    intermediate_size: I, num_hidden_layers: L, num_attention_heads: H, num_key_value_heads: Hk,
    max_position_embeddings: opts.maxPositions ?? 256, rms_norm_eps: 1e-6, rope_theta: 10000,
    hidden_act: 'silu', tie_word_embeddings: false, bos_token_id: 256, eos_token_id: 256,
  };
  if (opts.slidingWindow) Object.assign(config, { model_type: 'mistral', sliding_window: opts.slidingWindow });
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(byteLevelTokenizerJson()));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({
    eos_token: '<|endoftext|>', pad_token: '<|endoftext|>', chat_template: opts.chatTemplate ?? CHATML, clean_up_tokenization_spaces: false,
  }));
  writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [256, 258] }));
  return dir;
}
