// Test helpers: temp dirs, a small safetensors writer (real files, as the safetensors library
// lays them out: u64 LE header length, JSON header padded with spaces to 8 bytes, data), and a
// tiny byte-level BPE tokenizer.json built by hand.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export function tempDir(prefix = 'llmts-artifacts-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export interface TensorSpec {
  name: string;
  dtype: 'F32' | 'F16' | 'BF16' | 'I64' | string;
  shape: number[];
  /** element values (converted to dtype; the bytes themselves for 8-bit dtypes); default: i * 0.5 + 1 */
  values?: number[];
}

export function f32ToBf16(v: number): number {
  const u = new Uint32Array(new Float32Array([v]).buffer)[0];
  return (u + 0x7fff + ((u >>> 16) & 1)) >>> 16; // round to nearest even
}

export function f32ToF16(v: number): number {
  const f = new Float32Array([v]);
  const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000;
  const exp = ((u >>> 23) & 0xff) - 127 + 15;
  const mant = u & 0x7fffff;
  if (exp <= 0) return sign; // tests use normal values only
  if (exp >= 31) return sign | 0x7c00;
  return sign | (exp << 10) | Math.round(mant / 8192);
}

function encodeTensor(t: TensorSpec): Buffer {
  const n = t.shape.reduce((a, d) => a * d, 1);
  const vals = t.values ?? Array.from({ length: n }, (_, i) => i * 0.5 + 1);
  switch (t.dtype) {
    case 'F32':
      return Buffer.from(new Float32Array(vals).buffer);
    case 'BF16':
      return Buffer.from(new Uint16Array(vals.map(f32ToBf16)).buffer);
    case 'F16':
      return Buffer.from(new Uint16Array(vals.map(f32ToF16)).buffer);
    case 'F8_E4M3':
    case 'F8_E5M2':
    case 'U8':
      return Buffer.from(new Uint8Array(vals)); // the raw bytes
    case 'I64':
      return Buffer.from(new BigInt64Array(vals.map((v) => BigInt(Math.trunc(v)))).buffer);
    default:
      throw new Error(`helper cannot write ${t.dtype}`);
  }
}

export interface WriteOptions {
  metadata?: Record<string, string>;
  /** rewrite the parsed header before it is serialised (to make broken files) */
  mutateHeader?: (header: Record<string, any>) => void;
}

/** Writes a real safetensors file; returns the data bytes of each tensor for later comparison. */
export function writeSafetensors(file: string, tensors: TensorSpec[], opts: WriteOptions = {}): Map<string, Buffer> {
  const header: Record<string, any> = {};
  if (opts.metadata) header.__metadata__ = opts.metadata;
  const datas = new Map<string, Buffer>();
  let offset = 0;
  for (const t of tensors) {
    const data = encodeTensor(t);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + data.length] };
    datas.set(t.name, data);
    offset += data.length;
  }
  opts.mutateHeader?.(header);
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(json), ...datas.values()]));
  return datas;
}

/** Byte-level BPE over a handful of merges, with ChatML-style added tokens and a bos template. */
export function tinyTokenizerJson(opts: { addBos?: boolean } = {}): Record<string, unknown> {
  // GPT-2 byte-to-unicode table, so the vocab covers every byte
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const vocab: Record<string, number> = {};
  const order = bs.map((b, i) => [b, cs[i]] as const).sort((a, b) => a[0] - b[0]);
  order.forEach(([, c], i) => (vocab[String.fromCodePoint(c)] = i));
  // ids 256.. : ll, ell, hell, hello, Ġt, he, Ġthe
  const merges = [['l', 'l'], ['e', 'll'], ['h', 'ell'], ['hell', 'o'], ['Ġ', 't'], ['h', 'e'], ['Ġt', 'he']];
  for (const [a, b] of merges) vocab[a + b] = Object.keys(vocab).length;
  const base = Object.keys(vocab).length; // 263
  const special = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<s>'];
  const added = special.map((content, i) => ({
    id: base + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  added.push({ id: base + special.length, content: '<tool>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: false });
  const bosId = base + 3;
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: opts.addBos
      ? {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { '<s>': { id: '<s>', ids: [bosId], tokens: ['<s>'] } },
        }
      : { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges: merges.map(([a, b]) => `${a} ${b}`),
    },
  };
}

export const TINY = { hello: 259, space_the: 262, base: 263, endoftext: 263, imStart: 264, imEnd: 265, bos: 266, tool: 267 };

export const CHATML =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}" +
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
