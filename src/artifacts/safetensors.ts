// The checkpoint's tensor index: name -> WeightSource (file, absolute offset, dtype, shape),
// built from safetensors headers alone. Layouts, in the order transformers prefers them:
//   model.safetensors.index.json  (sharded: weight_map name -> shard file)
//   model.safetensors             (single file)
//   *.safetensors                 (any other files, merged; a name in two files is an error)

import fs from 'node:fs';
import path from 'node:path';
import type { WeightSource } from '../contracts/backend.ts';
import { ArtifactError } from './errors.ts';
import { expectObject, readJsonFile } from './json-file.ts';
import { readSafetensorsHeader, type SafetensorsHeader, type TensorEntry } from './safetensors-header.ts';

export const INDEX_FILE = 'model.safetensors.index.json';
export const SINGLE_FILE = 'model.safetensors';

const LOADABLE: Record<string, WeightSource['dtype']> = { F32: 'f32', F16: 'f16', BF16: 'bf16' };

export class WeightIndex {
  /** where the tensors were found: the directory, or the single file opened */
  readonly source: string;
  readonly files: readonly string[];
  private readonly entries: Map<string, TensorEntry>;

  constructor(source: string, files: readonly string[], entries: Map<string, TensorEntry>) {
    this.source = source;
    this.files = files;
    this.entries = entries;
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  names(): string[] {
    return [...this.entries.keys()];
  }

  /** The raw header entry (any dtype); throws when the tensor is absent. */
  entry(name: string): TensorEntry {
    const e = this.entries.get(name);
    if (!e) {
      throw new ArtifactError(`tensor "${name}" is not in the checkpoint ${this.source} (${this.entries.size} tensors)`, this.source);
    }
    return e;
  }

  /** A loadable weight; throws naming the tensor when it is absent or of a dtype the engine cannot load. */
  get(name: string): WeightSource {
    const e = this.entry(name);
    const dtype = LOADABLE[e.dtype];
    if (!dtype) {
      throw new ArtifactError(
        `tensor "${name}" in ${e.file} has dtype ${e.dtype}; supported: ${Object.keys(LOADABLE).join(', ')}`,
        e.file,
      );
    }
    return { path: e.file, offset: e.offset, dtype, shape: [...e.shape], name };
  }

  /** get(), after checking the shape; a mismatch names the tensor, expected and actual shapes. */
  expectShape(name: string, shape: readonly number[]): WeightSource {
    const src = this.get(name);
    if (src.shape.length !== shape.length || src.shape.some((d, i) => d !== shape[i])) {
      throw new ArtifactError(
        `tensor "${name}" in ${src.path} has shape [${src.shape.join(', ')}], expected [${shape.join(', ')}]`,
        src.path,
      );
    }
    return src;
  }

  /** bytes of tensor data in the checkpoint (the fit planner's weight size) */
  totalBytes(): number {
    let sum = 0;
    for (const e of this.entries.values()) sum += e.byteLength;
    return sum;
  }
}

/** Opens the tensors of a model directory (or of one .safetensors file). Reads headers only. */
export function openWeights(dirOrFile: string): WeightIndex {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(dirOrFile);
  } catch {
    throw new ArtifactError(`weights: ${dirOrFile} does not exist`, dirOrFile);
  }
  if (stat.isFile()) {
    const h = readSafetensorsHeader(dirOrFile);
    return new WeightIndex(dirOrFile, [dirOrFile], h.tensors);
  }
  const indexFile = path.join(dirOrFile, INDEX_FILE);
  if (fs.existsSync(indexFile)) return openSharded(dirOrFile, indexFile);
  const single = path.join(dirOrFile, SINGLE_FILE);
  if (fs.existsSync(single)) return new WeightIndex(dirOrFile, [single], readSafetensorsHeader(single).tensors);
  const others = fs.readdirSync(dirOrFile).filter((f) => f.endsWith('.safetensors')).sort();
  if (others.length === 0) {
    throw new ArtifactError(
      `no safetensors weights in ${dirOrFile} (expected ${SINGLE_FILE} or ${INDEX_FILE})`,
      dirOrFile,
    );
  }
  return merge(dirOrFile, others.map((f) => readSafetensorsHeader(path.join(dirOrFile, f))));
}

function openSharded(dir: string, indexFile: string): WeightIndex {
  const index = expectObject(readJsonFile(indexFile, 'safetensors index'), 'safetensors index', indexFile);
  const map = index.weight_map;
  if (map === null || typeof map !== 'object' || Array.isArray(map)) {
    throw new ArtifactError(`safetensors index ${indexFile} has no "weight_map" object`, indexFile);
  }
  const headers = new Map<string, SafetensorsHeader>();
  const entries = new Map<string, TensorEntry>();
  for (const [name, shard] of Object.entries(map as Record<string, unknown>)) {
    if (typeof shard !== 'string' || shard.includes('..') || path.isAbsolute(shard)) {
      throw new ArtifactError(`safetensors index ${indexFile} maps "${name}" to an invalid file ${JSON.stringify(shard)}`, indexFile);
    }
    let h = headers.get(shard);
    if (!h) {
      const shardPath = path.join(dir, shard);
      if (!fs.existsSync(shardPath)) {
        throw new ArtifactError(`shard ${shard} named by ${indexFile} (for "${name}") is missing`, shardPath);
      }
      h = readSafetensorsHeader(shardPath);
      headers.set(shard, h);
    }
    const e = h.tensors.get(name);
    if (!e) {
      throw new ArtifactError(`tensor "${name}" is listed in ${indexFile} but missing from shard ${h.file}`, h.file);
    }
    entries.set(name, e);
  }
  return new WeightIndex(dir, [...headers.values()].map((h) => h.file), entries);
}

function merge(dir: string, headers: SafetensorsHeader[]): WeightIndex {
  const entries = new Map<string, TensorEntry>();
  for (const h of headers) {
    for (const [name, e] of h.tensors) {
      const prev = entries.get(name);
      if (prev) throw new ArtifactError(`tensor "${name}" is in both ${prev.file} and ${e.file}; add ${INDEX_FILE}`, e.file);
      entries.set(name, e);
    }
  }
  return new WeightIndex(dir, headers.map((h) => h.file), entries);
}
