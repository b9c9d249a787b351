// readBlocks / writeBlocks (the prefix cache's SSD tier copies KV blocks with them) on the
// reference, native CPU and (where usable) CUDA backends: exact bytes, stream order, staging, and
// refusals. Blocks of 120 bytes take CUDA's 2-byte path, blocks of 1 KiB its 16-byte path.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { Backend } from '../../src/contracts/backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { createCudaBackend, probeCuda, type CudaBackend } from '../../src/backends/cuda/index.ts';
import { randomF32, rng } from './helpers.ts';

const CUDA = probeCuda().ok;
let cpu: CpuBackend;
let cuda: CudaBackend | undefined;
before(async () => {
  cpu = await createCpuBackend();
  if (CUDA) cuda = await createCudaBackend();
});
after(async () => {
  await cpu.close();
  await cuda?.close();
});

const bytesOf = (a: Float32Array | Int32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

for (const dims of [[3, 2, 5], [2, 8, 16]]) describe(`readBlocks / writeBlocks, blocks [${dims}]`, () => {
  const NB = 7, per = dims.reduce((a, b) => a * b, 1);
  for (const which of ['reference', 'cpu', ...(CUDA ? ['cuda' as const] : [])] as const) {
    const backend = (): Backend => (which === 'cpu' ? cpu : which === 'cuda' ? cuda! : new ReferenceBackend());

    it(`${which}: writes land in the named blocks; reads gather them in the order given`, async () => {
      const b = backend();
      const pool = b.zeros([NB, ...dims], 'f32');
      const data = randomF32(rng(3), 3 * per);
      b.writeBlocks!(pool, [4, 1, 6], bytesOf(data));
      data.fill(0); // staged: the caller's buffer may change at once
      const want = randomF32(rng(3), 3 * per);
      const got = new Float32Array((await b.readBlocks!(pool, [6, 4, 1, 4])).slice().buffer);
      assert.deepEqual(got, Float32Array.from([...want.subarray(2 * per), ...want.subarray(0, per), ...want.subarray(per, 2 * per), ...want.subarray(0, per)]));
      const all = (await b.read(pool)) as Float32Array;
      for (const blk of [0, 2, 3, 5]) assert.ok(all.subarray(blk * per, (blk + 1) * per).every((v) => v === 0), `block ${blk} untouched`);
      assert.deepEqual(all.subarray(per, 2 * per), want.subarray(per, 2 * per));
      assert.equal((await b.readBlocks!(pool, [])).byteLength, 0);
      b.free(pool);
    });

    it(`${which}: a read sees the ops enqueued before it and none after`, async () => {
      const b = backend();
      const pool = b.zeros([NB, ...dims], 'i32');
      const first = Int32Array.from({ length: per }, (_, k) => k + 1);
      const second = Int32Array.from({ length: per }, (_, k) => -k - 1);
      b.writeBlocks!(pool, [2], bytesOf(first));
      const pending = b.readBlocks!(pool, [2]);
      b.writeBlocks!(pool, [2], bytesOf(second));
      assert.deepEqual(new Int32Array((await pending).slice().buffer), first);
      assert.deepEqual(new Int32Array((await b.readBlocks!(pool, [2])).slice().buffer), second);
      b.free(pool);
    });

    it(`${which}: refuses blocks out of range, repeated write blocks and wrong sizes`, async () => {
      const b = backend();
      const pool = b.zeros([NB, ...dims], 'f32');
      const one = bytesOf(new Float32Array(per));
      assert.throws(() => b.writeBlocks!(pool, [NB], one), /outside/);
      assert.throws(() => b.writeBlocks!(pool, [-1], one), /outside/);
      assert.throws(() => b.writeBlocks!(pool, [1, 1], bytesOf(new Float32Array(2 * per))), /distinct/);
      assert.throws(() => b.writeBlocks!(pool, [1], bytesOf(new Float32Array(per - 1))), /bytes/);
      await assert.rejects(async () => b.readBlocks!(pool, [NB]), /outside/);
      await assert.rejects(async () => b.readBlocks!(pool, [1.5]), /outside/);
      b.free(pool);
    });
  }
});
