// A model's fingerprint for the prefix cache's SSD tier: KV content depends on the architecture
// and the weights, so the fingerprint covers config.json and every safetensors file's name, size,
// header (tensor names, dtypes, shapes and offsets) and a sample of its weight data: 64 evenly
// spaced 4 KiB pieces (two fine-tunes of one base share config and headers, never their data).
// Reading all the weights would take seconds for a large model; the sample takes milliseconds.
// Weights quantized as they load (`--quantization`) are other weights: the method is hashed too.

import { createHash } from 'node:crypto';
import { closeSync, openSync, readFileSync, readSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

const MAX_HEADER = 100 << 20;
const SAMPLES = 64;
const SAMPLE_BYTES = 4096;

export function modelFingerprint(dir: string, quantization?: string): string {
  const h = createHash('sha256');
  h.update('config.json\0').update(readFileSync(join(dir, 'config.json')));
  if (quantization !== undefined) h.update(`\0quantization\0${quantization}\0`);
  for (const name of readdirSync(dir).filter((f) => f.endsWith('.safetensors')).sort()) {
    const path = join(dir, name);
    const size = statSync(path).size;
    h.update(`\0${name}\0${size}\0`);
    const fd = openSync(path, 'r');
    try {
      const len = Buffer.alloc(8);
      if (readSync(fd, len, 0, 8, 0) === 8) {
        const n = Number(len.readBigUInt64LE(0));
        const header = Buffer.alloc(Math.min(n, MAX_HEADER, Math.max(0, size - 8)));
        readSync(fd, header, 0, header.length, 8);
        h.update(header);
        const start = 8 + header.length, dataLen = size - start;
        const piece = Buffer.alloc(SAMPLE_BYTES);
        for (let k = 0; k < SAMPLES && dataLen > 0; k++) {
          const at = start + Math.floor((dataLen * k) / SAMPLES);
          const got = readSync(fd, piece, 0, Math.min(SAMPLE_BYTES, size - at), at);
          h.update(piece.subarray(0, got));
        }
      }
    } finally {
      closeSync(fd);
    }
  }
  return h.digest('hex');
}
