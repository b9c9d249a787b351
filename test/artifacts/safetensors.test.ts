// Safetensors headers and the weight index, on real files written to a temp dir.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ArtifactError } from '../../src/artifacts/errors.ts';
import { readSafetensorsHeader } from '../../src/artifacts/safetensors-header.ts';
import { openWeights } from '../../src/artifacts/safetensors.ts';
import { f32ToBf16, f32ToF16, tempDir, writeSafetensors } from './helpers.ts';

/** reads the bytes a WeightSource points at, the way a backend would */
function bytesAt(file: string, offset: number, length: number): Buffer {
  const fd = fs.openSync(file, 'r');
  try {
    const b = Buffer.alloc(length);
    fs.readSync(fd, b, 0, length, offset);
    return b;
  } finally {
    fs.closeSync(fd);
  }
}

function throwsArtifact(fn: () => unknown, pattern: RegExp) {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ArtifactError, `not an ArtifactError: ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

describe('safetensors: single file', () => {
  it('maps names to dtype, shape and absolute offsets of the right bytes (F32, BF16, F16)', () => {
    const dir = tempDir();
    const file = path.join(dir, 'model.safetensors');
    const datas = writeSafetensors(file, [
      { name: 'a.f32', dtype: 'F32', shape: [2, 3], values: [1, 2, 3, 4, 5, 6] },
      { name: 'b.bf16', dtype: 'BF16', shape: [4], values: [1.5, -2, 3.25, 0.125] },
      { name: 'c.f16', dtype: 'F16', shape: [2, 1], values: [0.5, -7] },
    ], { metadata: { format: 'pt' } });
    const w = openWeights(dir);
    assert.deepEqual(w.names().sort(), ['a.f32', 'b.bf16', 'c.f16']);
    const a = w.get('a.f32');
    assert.deepEqual({ ...a, offset: 0 }, { path: file, offset: 0, dtype: 'f32', shape: [2, 3], name: 'a.f32' });
    assert.deepEqual([...new Float32Array(bytesAt(file, a.offset, 24).buffer.slice(0))], [1, 2, 3, 4, 5, 6]);
    const b = w.get('b.bf16');
    assert.equal(b.dtype, 'bf16');
    assert.deepEqual(bytesAt(file, b.offset, 8), datas.get('b.bf16'));
    assert.equal(new Uint16Array(bytesAt(file, b.offset, 8).buffer.slice(0))[1], f32ToBf16(-2));
    const c = w.get('c.f16');
    assert.equal(c.dtype, 'f16');
    assert.equal(new Uint16Array(bytesAt(file, c.offset, 4).buffer.slice(0))[1], f32ToF16(-7));
    assert.equal(w.totalBytes(), 24 + 8 + 4);
    assert.equal(readSafetensorsHeader(file).metadata.format, 'pt');
    assert.ok(w.has('a.f32'));
    assert.ok(!w.has('nope'));
    // a single file can be opened directly too
    assert.deepEqual(openWeights(file).get('c.f16'), c);
  });

  it('expectShape returns the source or names tensor, expected and actual shape', () => {
    const dir = tempDir();
    writeSafetensors(path.join(dir, 'model.safetensors'), [{ name: 'w', dtype: 'F32', shape: [4, 2] }]);
    const w = openWeights(dir);
    assert.deepEqual(w.expectShape('w', [4, 2]).shape, [4, 2]);
    throwsArtifact(() => w.expectShape('w', [2, 4]), /tensor "w" .* has shape \[4, 2\], expected \[2, 4\]/);
    throwsArtifact(() => w.expectShape('w', [8]), /expected \[8\]/);
  });

  it('a missing tensor names the tensor and the checkpoint', () => {
    const dir = tempDir();
    writeSafetensors(path.join(dir, 'model.safetensors'), [{ name: 'w', dtype: 'F32', shape: [1] }]);
    throwsArtifact(() => openWeights(dir).get('model.norm.weight'), new RegExp(`"model.norm.weight" is not in the checkpoint ${dir}`));
  });

  it('an unsupported dtype is reported when the tensor is used, with file and dtype', () => {
    const dir = tempDir();
    writeSafetensors(path.join(dir, 'model.safetensors'), [
      { name: 'ids', dtype: 'I64', shape: [3] },
      { name: 'w', dtype: 'F32', shape: [1] },
    ]);
    const w = openWeights(dir);
    assert.equal(w.entry('ids').dtype, 'I64');
    throwsArtifact(() => w.get('ids'), /tensor "ids" in .*model\.safetensors has dtype I64; supported: F32, F16, BF16/);
    assert.equal(w.get('w').dtype, 'f32');
  });

  it('merges several files without an index; a duplicate name is an error', () => {
    const dir = tempDir();
    writeSafetensors(path.join(dir, 'a.safetensors'), [{ name: 'x', dtype: 'F32', shape: [1] }]);
    writeSafetensors(path.join(dir, 'b.safetensors'), [{ name: 'y', dtype: 'F32', shape: [1] }]);
    assert.deepEqual(openWeights(dir).names().sort(), ['x', 'y']);
    writeSafetensors(path.join(dir, 'c.safetensors'), [{ name: 'x', dtype: 'F32', shape: [1] }]);
    throwsArtifact(() => openWeights(dir), /"x" is in both .*a\.safetensors and .*c\.safetensors/);
  });

  it('no weights / no directory', () => {
    throwsArtifact(() => openWeights(tempDir()), /no safetensors weights in/);
    throwsArtifact(() => openWeights('/nonexistent/llmts/dir'), /does not exist/);
  });
});

describe('safetensors: broken files', () => {
  function broken(mutate: (file: string) => void): string {
    const dir = tempDir();
    const file = path.join(dir, 'model.safetensors');
    writeSafetensors(file, [
      { name: 'a', dtype: 'F32', shape: [2, 2] },
      { name: 'b', dtype: 'BF16', shape: [3] },
    ]);
    mutate(file);
    return dir;
  }

  it('header length larger than the file', () => {
    const dir = broken((f) => {
      const b = fs.readFileSync(f);
      b.writeBigUInt64LE(BigInt(b.length), 0);
      fs.writeFileSync(f, b);
    });
    throwsArtifact(() => openWeights(dir), /model\.safetensors: header length \d+ is invalid/);
  });

  it('absurd header length (over the format limit)', () => {
    const dir = broken((f) => {
      const b = fs.readFileSync(f);
      b.writeBigUInt64LE(2n ** 40n, 0);
      fs.writeFileSync(f, b);
    });
    throwsArtifact(() => openWeights(dir), /header length 1099511627776 is invalid/);
  });

  it('file shorter than the length prefix', () => {
    const dir = broken((f) => fs.writeFileSync(f, Buffer.from([1, 2, 3])));
    throwsArtifact(() => openWeights(dir), /3 bytes, too small/);
  });

  it('header is not JSON', () => {
    const dir = broken((f) => {
      const b = fs.readFileSync(f);
      b.write('#', 8); // clobber the opening brace
      fs.writeFileSync(f, b);
    });
    throwsArtifact(() => openWeights(dir), /header is not valid JSON/);
  });

  it('truncated data names the file and the tensor that runs past the end', () => {
    const dir = broken((f) => fs.truncateSync(f, fs.statSync(f).size - 2));
    throwsArtifact(() => openWeights(dir), /model\.safetensors: is truncated: tensor "b" needs bytes up to \d+, but the file has \d+/);
  });

  it('data_offsets inconsistent with shape x dtype size', () => {
    const dir = tempDir();
    writeSafetensors(path.join(dir, 'model.safetensors'), [{ name: 'a', dtype: 'F32', shape: [2, 2] }], {
      mutateHeader: (h) => (h.a.shape = [2, 3]),
    });
    throwsArtifact(() => openWeights(dir), /tensor "a" data_offsets \[0, 16\] span 16 bytes, but shape \[2, 3\] of F32 needs 24/);
  });

  it('unknown dtype, bad shape, bad offsets, overlap', () => {
    const cases: Array<[(h: Record<string, any>) => void, RegExp]> = [
      [(h) => (h.a.dtype = 'Q4_K'), /tensor "a" has unknown dtype "Q4_K"/],
      [(h) => (h.a.shape = [2, -2]), /tensor "a" has an invalid shape/],
      [(h) => (h.a.data_offsets = [16, 0]), /tensor "a" has invalid data_offsets/],
      [(h) => (h.b.data_offsets = [10, 16]), /tensors "a" and "b" overlap/],
    ];
    for (const [mutateHeader, pattern] of cases) {
      const dir = tempDir();
      writeSafetensors(path.join(dir, 'model.safetensors'), [
        { name: 'a', dtype: 'F32', shape: [2, 2] },
        { name: 'b', dtype: 'BF16', shape: [3] },
      ], { mutateHeader });
      throwsArtifact(() => openWeights(dir), pattern);
    }
  });
});

describe('safetensors: sharded', () => {
  function sharded(): string {
    const dir = tempDir();
    writeSafetensors(path.join(dir, 'model-00001-of-00002.safetensors'), [
      { name: 'model.embed_tokens.weight', dtype: 'BF16', shape: [8, 4] },
      { name: 'model.layers.0.mlp.up_proj.weight', dtype: 'BF16', shape: [6, 4] },
    ]);
    writeSafetensors(path.join(dir, 'model-00002-of-00002.safetensors'), [
      { name: 'model.norm.weight', dtype: 'F32', shape: [4] },
      { name: 'unlisted', dtype: 'F32', shape: [1] },
    ]);
    fs.writeFileSync(path.join(dir, 'model.safetensors.index.json'), JSON.stringify({
      metadata: { total_size: 64 + 48 + 16 },
      weight_map: {
        'model.embed_tokens.weight': 'model-00001-of-00002.safetensors',
        'model.layers.0.mlp.up_proj.weight': 'model-00001-of-00002.safetensors',
        'model.norm.weight': 'model-00002-of-00002.safetensors',
      },
    }));
    return dir;
  }

  it('follows weight_map to each shard', () => {
    const dir = sharded();
    const w = openWeights(dir);
    assert.deepEqual(w.names().sort(), ['model.embed_tokens.weight', 'model.layers.0.mlp.up_proj.weight', 'model.norm.weight']);
    assert.equal(w.get('model.norm.weight').path, path.join(dir, 'model-00002-of-00002.safetensors'));
    assert.equal(w.get('model.embed_tokens.weight').path, path.join(dir, 'model-00001-of-00002.safetensors'));
    assert.equal(w.files.length, 2);
    assert.equal(w.totalBytes(), 64 + 48 + 16);
  });

  it('the index wins over a stray model.safetensors', () => {
    const dir = sharded();
    writeSafetensors(path.join(dir, 'model.safetensors'), [{ name: 'other', dtype: 'F32', shape: [1] }]);
    assert.ok(openWeights(dir).has('model.norm.weight'));
  });

  it('a shard named by the index is missing', () => {
    const dir = sharded();
    fs.rmSync(path.join(dir, 'model-00002-of-00002.safetensors'));
    throwsArtifact(() => openWeights(dir), /shard model-00002-of-00002\.safetensors named by .*index\.json \(for "model\.norm\.weight"\) is missing/);
  });

  it('a tensor listed in the index is absent from its shard', () => {
    const dir = sharded();
    const idx = path.join(dir, 'model.safetensors.index.json');
    const j = JSON.parse(fs.readFileSync(idx, 'utf8'));
    j.weight_map['lm_head.weight'] = 'model-00002-of-00002.safetensors';
    fs.writeFileSync(idx, JSON.stringify(j));
    throwsArtifact(() => openWeights(dir), /"lm_head\.weight" is listed in .* but missing from shard/);
  });

  it('corrupt index JSON / no weight_map / path escaping the directory', () => {
    const dir = sharded();
    const idx = path.join(dir, 'model.safetensors.index.json');
    fs.writeFileSync(idx, '{"weight_map": ');
    throwsArtifact(() => openWeights(dir), /safetensors index .* is not valid JSON/);
    fs.writeFileSync(idx, '{"metadata": {}}');
    throwsArtifact(() => openWeights(dir), /has no "weight_map" object/);
    fs.writeFileSync(idx, JSON.stringify({ weight_map: { x: '../evil.safetensors' } }));
    throwsArtifact(() => openWeights(dir), /maps "x" to an invalid file/);
  });
});
