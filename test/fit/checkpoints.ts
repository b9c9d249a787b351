// Real-shape checkpoints without real weights, for the fit planner's tests and benchmark:
// config.json + the tensor list a Hugging Face checkpoint of that architecture has, written as
// safetensors files whose headers are real and whose data is either absent (sparse: the file is
// extended with ftruncate, so data_offsets are valid but no block is written) or filled with
// small pseudo-random bf16 values (bench/fit-accuracy.ts runs those on the CPU backend).

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export interface TensorSpec {
  name: string;
  dtype: 'BF16' | 'F16' | 'F32';
  shape: number[];
}

const DTYPE_BYTES = { BF16: 2, F16: 2, F32: 4 } as const;
export const numel = (shape: readonly number[]) => shape.reduce((a, d) => a * d, 1);
export const bytesOf = (t: TensorSpec) => numel(t.shape) * DTYPE_BYTES[t.dtype];

export interface ArchSpec {
  config: Record<string, unknown>;
  tensors: TensorSpec[];
}

/** llama / mistral / qwen2 / qwen3 / qwen3_moe / gemma2 tensor names, as transformers saves them. */
export function tensorsFor(config: Record<string, any>, dtype: TensorSpec['dtype'] = 'BF16'): TensorSpec[] {
  const D: number = config.hidden_size, L: number = config.num_hidden_layers, V: number = config.vocab_size;
  const H: number = config.num_attention_heads, Hk: number = config.num_key_value_heads ?? H;
  const hd: number = config.head_dim ?? D / H;
  const type: string = config.model_type;
  const t = (name: string, shape: number[]): TensorSpec => ({ name, dtype, shape });
  const out: TensorSpec[] = [t('model.embed_tokens.weight', [V, D])];
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    out.push(
      t(`${p}input_layernorm.weight`, [D]),
      t(`${p}post_attention_layernorm.weight`, [D]),
      t(`${p}self_attn.q_proj.weight`, [H * hd, D]),
      t(`${p}self_attn.k_proj.weight`, [Hk * hd, D]),
      t(`${p}self_attn.v_proj.weight`, [Hk * hd, D]),
      t(`${p}self_attn.o_proj.weight`, [D, H * hd]),
    );
    if (type === 'qwen2') out.push(t(`${p}self_attn.q_proj.bias`, [H * hd]), t(`${p}self_attn.k_proj.bias`, [Hk * hd]), t(`${p}self_attn.v_proj.bias`, [Hk * hd]));
    if (type === 'qwen3' || type === 'qwen3_moe') out.push(t(`${p}self_attn.q_norm.weight`, [hd]), t(`${p}self_attn.k_norm.weight`, [hd]));
    if (type === 'gemma2') out.push(t(`${p}pre_feedforward_layernorm.weight`, [D]), t(`${p}post_feedforward_layernorm.weight`, [D]));
    if (type === 'qwen3_moe') {
      const E: number = config.num_experts, I: number = config.moe_intermediate_size;
      out.push(t(`${p}mlp.gate.weight`, [E, D]));
      for (let e = 0; e < E; e++) {
        out.push(
          t(`${p}mlp.experts.${e}.gate_proj.weight`, [I, D]),
          t(`${p}mlp.experts.${e}.up_proj.weight`, [I, D]),
          t(`${p}mlp.experts.${e}.down_proj.weight`, [D, I]),
        );
      }
    } else {
      const I: number = config.intermediate_size;
      out.push(t(`${p}mlp.gate_proj.weight`, [I, D]), t(`${p}mlp.up_proj.weight`, [I, D]), t(`${p}mlp.down_proj.weight`, [D, I]));
    }
  }
  out.push(t('model.norm.weight', [D]));
  if (!config.tie_word_embeddings) out.push(t('lm_head.weight', [V, D]));
  return out;
}

// ---- configs at real sizes (values from the models' published config.json files) ----------

export const LLAMA_3_1_8B = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 128256, hidden_size: 4096,
  intermediate_size: 14336, num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8,
  max_position_embeddings: 131072, rms_norm_eps: 1e-5, rope_theta: 500000, hidden_act: 'silu',
  rope_scaling: { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192, rope_type: 'llama3' },
  tie_word_embeddings: false, bos_token_id: 128000, eos_token_id: [128001, 128008, 128009], torch_dtype: 'bfloat16',
};
/** published parameter count of meta-llama/Llama-3.1-8B */
export const LLAMA_3_1_8B_PARAMS = 8_030_261_248;

export const GEMMA_2_9B = {
  architectures: ['Gemma2ForCausalLM'], model_type: 'gemma2', vocab_size: 256000, hidden_size: 3584,
  intermediate_size: 14336, num_hidden_layers: 42, num_attention_heads: 16, num_key_value_heads: 8,
  head_dim: 256, max_position_embeddings: 8192, rms_norm_eps: 1e-6, rope_theta: 10000,
  hidden_activation: 'gelu_pytorch_tanh', query_pre_attn_scalar: 256, sliding_window: 4096,
  attn_logit_softcapping: 50.0, final_logit_softcapping: 30.0, tie_word_embeddings: true,
  bos_token_id: 2, eos_token_id: 1, pad_token_id: 0, torch_dtype: 'bfloat16',
};
/** published parameter count of google/gemma-2-9b */
export const GEMMA_2_9B_PARAMS = 9_241_705_984;

/** google/gemma-2-2b (bench/make_random_models.py's gemma2-2b preset writes the same config) */
export const GEMMA_2_2B = {
  architectures: ['Gemma2ForCausalLM'], model_type: 'gemma2', vocab_size: 256000, hidden_size: 2304,
  intermediate_size: 9216, num_hidden_layers: 26, num_attention_heads: 8, num_key_value_heads: 4,
  head_dim: 256, max_position_embeddings: 8192, rms_norm_eps: 1e-6, rope_theta: 10000,
  hidden_activation: 'gelu_pytorch_tanh', query_pre_attn_scalar: 256, sliding_window: 4096,
  attn_logit_softcapping: 50.0, final_logit_softcapping: 30.0, tie_word_embeddings: true,
  bos_token_id: 2, eos_token_id: 1, pad_token_id: 0, torch_dtype: 'bfloat16',
};
/** published parameter count of google/gemma-2-2b */
export const GEMMA_2_2B_PARAMS = 2_614_341_888;

export const QWEN3_30B_A3B = {
  architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', vocab_size: 151936, hidden_size: 2048,
  intermediate_size: 6144, moe_intermediate_size: 768, num_hidden_layers: 48, num_attention_heads: 32,
  num_key_value_heads: 4, head_dim: 128, num_experts: 128, num_experts_per_tok: 8, norm_topk_prob: true,
  decoder_sparse_step: 1, mlp_only_layers: [], max_position_embeddings: 40960, rms_norm_eps: 1e-6,
  rope_theta: 1000000, hidden_act: 'silu', tie_word_embeddings: false, bos_token_id: 151643,
  eos_token_id: 151645, torch_dtype: 'bfloat16',
};
/** published parameter count of Qwen/Qwen3-30B-A3B (30.5B total, 3.3B activated) */
export const QWEN3_30B_A3B_PARAMS = 30_532_122_624;

// ---- writing ---------------------------------------------------------------------------------

export interface WriteOptions {
  /** number of shards (model-0000k-of-0000n.safetensors + index); default 1 (model.safetensors) */
  shards?: number;
  /** 'sparse': headers only (ftruncate); 'random': small pseudo-random values of the dtype */
  data?: 'sparse' | 'random';
  /** change the header JSON before it is written (to make inconsistent files) */
  mutateHeader?: (header: Record<string, any>, shard: number) => void;
  /** extra files (name -> contents) */
  files?: Record<string, string>;
}

export function tempModelDir(prefix = 'llmts-fit-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/**
 * A 64 KiB block of small bf16/f16/f32 values (|x| in ~[0.001, 0.06], random signs); `seed` picks
 * the sequence, so every block of a checkpoint differs (rows of an embedding table, experts of a
 * router: a repeated block would route every token alike).
 */
function randomBlock(dtype: TensorSpec['dtype'], seed: number): Buffer {
  let s = (0x9e3779b9 ^ Math.imul(seed + 1, 0x85ebca6b)) >>> 0 || 1;
  const next = () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 2 ** 32;
  };
  const n = 32768;
  if (dtype === 'F32') {
    const f = new Float32Array(n / 2);
    for (let i = 0; i < f.length; i++) f[i] = (next() * 2 - 1) * 0.06;
    return Buffer.from(f.buffer);
  }
  const u = new Uint16Array(n);
  for (let i = 0; i < n; i++) {
    const sign = next() < 0.5 ? 0x8000 : 0;
    if (dtype === 'BF16') u[i] = sign | ((117 + Math.floor(next() * 6)) << 7) | Math.floor(next() * 128);
    else u[i] = sign | ((5 + Math.floor(next() * 6)) << 10) | Math.floor(next() * 1024);
  }
  return Buffer.from(u.buffer);
}

function writeShard(file: string, tensors: TensorSpec[], opts: WriteOptions, shard: number): void {
  const header: Record<string, any> = {};
  let offset = 0;
  for (const t of tensors) {
    const n = bytesOf(t);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + n] };
    offset += n;
  }
  opts.mutateHeader?.(header, shard);
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  const fd = fs.openSync(file, 'w');
  try {
    fs.writeSync(fd, len, 0, 8, 0);
    fs.writeSync(fd, Buffer.from(json), 0, Buffer.byteLength(json), 8);
    const start = 8 + Buffer.byteLength(json);
    if (opts.data === 'random') {
      let pos = start;
      let seed = shard * 1_000_003;
      for (const t of tensors) {
        let left = bytesOf(t);
        // 64 MiB writes of fresh 64 KiB blocks
        const big = Buffer.alloc(Math.min(left, 64 * 2 ** 20));
        while (left > 0) {
          const n = Math.min(left, big.length);
          for (let o = 0; o < n; o += 65536) {
            const block = randomBlock(t.dtype, seed++);
            block.copy(big, o, 0, Math.min(block.length, n - o));
          }
          fs.writeSync(fd, big, 0, n, pos);
          pos += n;
          left -= n;
        }
      }
    } else {
      fs.ftruncateSync(fd, start + offset);
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** Writes config.json and the checkpoint into `dir` (created when absent); returns dir. */
export function writeCheckpoint(dir: string, config: Record<string, unknown>, tensors: TensorSpec[], opts: WriteOptions = {}): string {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 2));
  for (const [name, text] of Object.entries(opts.files ?? {})) fs.writeFileSync(path.join(dir, name), text);
  const shards = opts.shards ?? 1;
  if (shards === 1) {
    writeShard(path.join(dir, 'model.safetensors'), tensors, opts, 0);
    return dir;
  }
  // split by bytes, in order, as transformers' save_pretrained does
  const total = tensors.reduce((a, t) => a + bytesOf(t), 0);
  const groups: TensorSpec[][] = Array.from({ length: shards }, () => []);
  let acc = 0;
  for (const t of tensors) {
    groups[Math.min(shards - 1, Math.floor((acc / total) * shards))]!.push(t);
    acc += bytesOf(t);
  }
  const weightMap: Record<string, string> = {};
  groups.forEach((g, k) => {
    const name = `model-${String(k + 1).padStart(5, '0')}-of-${String(shards).padStart(5, '0')}.safetensors`;
    writeShard(path.join(dir, name), g, opts, k);
    for (const t of g) weightMap[t.name] = name;
  });
  fs.writeFileSync(path.join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2));
  return dir;
}
