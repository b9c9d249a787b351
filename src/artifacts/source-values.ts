// A float weight source's values as f32, read on the host: the file's bytes widened, or what its
// decode computes (GGUF blocks, FP8 matrices). For the loaders that compute on values before a
// backend sees them (quantizing at load, FP8 scales).

import { closeSync, openSync } from 'node:fs';

import { decodeHalf } from '../backends/common/half.ts';
import { dtypeBytes, numel, type WeightSource } from '../contracts/backend.ts';
import { ArtifactError } from './errors.ts';
import { readExactly } from './safetensors-header.ts';

/** A float source's values as f32 (its file bytes, or what its decode computes). */
export function readSourceValues(src: WeightSource): Float32Array {
  if (src.decode) {
    const b = src.decode('f32');
    return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
  }
  const n = numel(src.shape);
  const fd = openSync(src.path, 'r');
  let bytes: Buffer;
  try {
    bytes = readExactly(fd, src.offset, n * dtypeBytes[src.dtype]);
  } catch (e) {
    throw new ArtifactError(`${src.path}: tensor ${src.name}: ${(e as Error).message}`, src.path);
  } finally {
    closeSync(fd);
  }
  if (src.dtype === 'f32') return new Float32Array(bytes.buffer, bytes.byteOffset, n);
  return decodeHalf(new Uint16Array(bytes.buffer, bytes.byteOffset, n), src.dtype);
}
