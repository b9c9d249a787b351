// How long a GGUF model of Qwen3-0.6B's shapes takes to load on the CPU backend: a file of random
// valid blocks (every matrix one ggml type, norms F32) is written to a temp dir, then
// loadModel (header, config, tokenizer from the fixture vocabulary, every tensor dequantized into
// bf16 on the host and copied into the backend) is timed, and the dequantizer alone per type.
//
//   node --import tsx bench/gguf-load.ts [--type Q4_K] [--layers 28]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { createCpuBackend } from '../src/backends/cpu/cpu-backend.ts';
import { dequantize, f32ToBf16 } from '../src/artifacts/gguf/dequant.ts';
import { GGML_TYPE_BY_NAME } from '../src/artifacts/gguf/ggml-types.ts';
import { readGgufHeader } from '../src/artifacts/gguf/reader.ts';
import { loadModel } from '../src/execution/load-model.ts';
import { mulberry32 } from '../test/helpers/mulberry32.ts';
import { writeGguf, type MetaValue, type TensorDef } from '../test/helpers/gguf-writer.ts';

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : dflt;
};
const typeName = arg('--type', 'Q4_K');
const layers = Number(arg('--layers', '28'));
const type = GGML_TYPE_BY_NAME.get(typeName);
if (!type || !type.dequantizable) throw new Error(`--type ${typeName}: not a loadable ggml type`);

// Qwen3-0.6B: hidden 1024, 16 heads of 128, 8 KV heads, intermediate 3072, vocab 151936, tied
const D = 1024, H = 16, Hk = 8, hd = 128, I = 3072, V = 151936;
const rand = mulberry32(1);
const D_FIELDS: Record<string, number[]> = { Q2_K: [80, 82], Q3_K: [108], Q6_K: [208], Q4_1: [0, 2], Q5_1: [0, 2], Q4_K: [0, 2], Q5_K: [0, 2] };

function blocks(rows: number, cols: number): Uint8Array {
  const n = (rows * cols) / type!.blockSize;
  const b = new Uint8Array(n * type!.typeSize);
  for (let i = 0; i < b.length; i++) b[i] = (rand() * 256) | 0;
  for (let k = 0; k < n; k++) for (const off of D_FIELDS[typeName] ?? [0]) { b[k * type!.typeSize + off] = 0; b[k * type!.typeSize + off + 1] = 0x20; }
  return b;
}
const f32 = (n: number) => new Uint8Array(new Float32Array(n).fill(1).buffer);

const src = readGgufHeader(path.resolve(import.meta.dirname, '../test/fixtures/gguf/qwen3_q5_0.gguf'));
const tokens = src.metadata.get('tokenizer.ggml.tokens') as string[];
const vocab = Array.from({ length: V }, (_, i) => tokens[i] ?? `[PAD${i}]`);
const meta: [string, MetaValue][] = [
  ['general.architecture', { type: 'string', value: 'qwen3' }],
  ['qwen3.embedding_length', { type: 'u32', value: D }], ['qwen3.block_count', { type: 'u32', value: layers }],
  ['qwen3.attention.head_count', { type: 'u32', value: H }], ['qwen3.attention.head_count_kv', { type: 'u32', value: Hk }],
  ['qwen3.attention.key_length', { type: 'u32', value: hd }], ['qwen3.feed_forward_length', { type: 'u32', value: I }],
  ['qwen3.context_length', { type: 'u32', value: 40960 }], ['qwen3.rope.freq_base', { type: 'f32', value: 1e6 }],
  ['tokenizer.ggml.model', { type: 'string', value: 'gpt2' }],
  ['tokenizer.ggml.tokens', { type: 'array', elem: 'string', value: vocab }],
  ['tokenizer.ggml.merges', { type: 'array', elem: 'string', value: src.metadata.get('tokenizer.ggml.merges') as string[] }],
  ['tokenizer.ggml.eos_token_id', { type: 'u32', value: 0 }],
];
const gg = (name: string, rows: number, cols: number): TensorDef => ({ name, dims: [cols, rows], type: type.id, data: blocks(rows, cols) });
const tensors: TensorDef[] = [gg('token_embd.weight', V, D), { name: 'output_norm.weight', dims: [D], type: 0, data: f32(D) }];
for (let l = 0; l < layers; l++) {
  tensors.push(gg(`blk.${l}.attn_q.weight`, H * hd, D), gg(`blk.${l}.attn_k.weight`, Hk * hd, D), gg(`blk.${l}.attn_v.weight`, Hk * hd, D),
    gg(`blk.${l}.attn_output.weight`, D, H * hd), gg(`blk.${l}.ffn_gate.weight`, I, D), gg(`blk.${l}.ffn_up.weight`, I, D),
    gg(`blk.${l}.ffn_down.weight`, D, I));
  for (const [n, len] of [['attn_norm', D], ['ffn_norm', D], ['attn_q_norm', hd], ['attn_k_norm', hd]] as const) {
    tensors.push({ name: `blk.${l}.${n}.weight`, dims: [len], type: 0, data: f32(len) });
  }
}
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmts-gguf-bench-'));
const file = writeGguf(path.join(dir, `qwen3-0.6b-shapes-${typeName}.gguf`), { metadata: meta, tensors });
const bytes = fs.statSync(file).size;
const params = tensors.reduce((a, t) => a + t.dims.reduce((x, y) => x * y, 1), 0);

// the dequantizer alone, on the largest matrix kind (ffn_gate)
const one = tensors.find((t) => t.name === 'blk.0.ffn_gate.weight')!;
const out = new Float32Array(I * D);
let t0 = performance.now();
dequantize(type, one.data, out);
const bf = f32ToBf16(out);
const deqMs = performance.now() - t0;

const backend = await createCpuBackend();
t0 = performance.now();
const m = await loadModel(backend, file, { maxModelLen: 4096, onProgress: () => {} });
const loadMs = performance.now() - t0;
await backend.close();
fs.rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify({
  command: `node --import tsx bench/gguf-load.ts --type ${typeName} --layers ${layers}`,
  machine: `${os.cpus()[0]?.model} x${os.cpus().length}, ${Math.round(os.totalmem() / 2 ** 30)} GiB`,
  date: new Date().toISOString().slice(0, 10),
  type: typeName, params, fileBytes: bytes, layers: m.config.numLayers,
  dequantToBf16MsPerMElements: +(deqMs / (out.length / 1e6)).toFixed(2), bf16Elements: bf.length,
  loadModelSeconds: +(loadMs / 1000).toFixed(2),
}));
