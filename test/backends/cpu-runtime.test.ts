// The CPU backend's runtime behaviour: scopes free what they should, stream ordering with block
// reuse, op errors (TypeScript and native) are clear and leave the backend usable, and the event
// loop keeps running while a long op executes.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { StepLayout } from '../../src/contracts/backend.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { randomF32, rng, WeightDir } from './helpers.ts';

let cpu: CpuBackend;
let files: WeightDir;

before(async () => {
  cpu = await createCpuBackend();
  files = new WeightDir();
});
after(async () => {
  await cpu.close();
  files.cleanup();
});

const live = () => cpu.memoryStats().liveBlocks;
const f32 = (...v: number[]) => new Float32Array(v);

describe('scopes', () => {
  it('endScope frees op outputs and uploads except the kept ones', async () => {
    const base = live();
    cpu.beginScope();
    const a = cpu.upload(f32(1, 2, 3, 4), [4]);
    const b = cpu.add(a, a, 1);
    const c = cpu.scale(b, 0.5);
    assert.equal(live(), base + 3);
    cpu.endScope([c]);
    assert.equal(live(), base + 1);
    assert.deepEqual([...(await cpu.read(c))], [1, 2, 3, 4]);
    assert.throws(() => cpu.scale(a, 1), /scale: x f32\[4\] was already freed/);
    await assert.rejects(cpu.read(b), /read: t f32\[4\] was already freed/);
    cpu.free(c);
    assert.equal(live(), base);
  });

  it('nested scopes hand kept tensors to the enclosing scope', async () => {
    const base = live();
    cpu.beginScope();
    const x = cpu.upload(f32(1, 2), [2]);
    cpu.beginScope();
    const y = cpu.scale(x, 2);
    const z = cpu.scale(y, 2);
    cpu.endScope([z]);
    assert.equal(live(), base + 2); // x, z
    assert.deepEqual([...(await cpu.read(z))], [4, 8]);
    cpu.endScope();
    assert.equal(live(), base);
  });

  it('keeping a view keeps the tensor it looks at', async () => {
    const base = live();
    cpu.beginScope();
    const y = cpu.scale(cpu.upload(f32(1, 2, 3, 4, 5, 6), [6]), 1);
    const v = cpu.reshape(y, [2, 3]);
    cpu.endScope([v]);
    assert.equal(live(), base + 1);
    assert.deepEqual([...(await cpu.read(v))], [1, 2, 3, 4, 5, 6]);
    cpu.free(v); // views free nothing
    assert.equal(live(), base + 1);
    cpu.free(y);
    assert.equal(live(), base);
    await assert.rejects(cpu.read(v), /already freed/);
  });

  it('zeros and loaded weights are not owned by scopes; explicit frees inside a scope are not repeated', async () => {
    const base = live();
    const src = files.write(randomF32(rng(1), 6), 'bf16', [2, 3]);
    cpu.beginScope();
    const pool = cpu.zeros([4, 2], 'f32');
    const w = await cpu.loadWeight(src, 'keep');
    const tmp = cpu.upload(f32(1), [1]);
    cpu.free(tmp);
    cpu.endScope();
    assert.equal(live(), base + 2);
    assert.deepEqual([...(await cpu.read(pool))], new Array(8).fill(0));
    cpu.free(pool);
    cpu.free(w);
    assert.equal(live(), base);
    assert.throws(() => cpu.free(w), /already freed/);
  });

  it('endScope without beginScope is an error', () => {
    assert.throws(() => cpu.endScope(), /endScope: no scope is open/);
  });

  it('a decode-like loop reuses blocks and holds memory steady', async () => {
    const r = rng(2);
    const w = cpu.upload(randomF32(r, 64 * 32), [64, 32]);
    let x = cpu.upload(randomF32(r, 32), [1, 32]);
    const base = live();
    const wv = await cpu.read(w);
    let expect = await cpu.read(x);
    for (let step = 0; step < 50; step++) {
      cpu.beginScope();
      const h = cpu.matmul(x, w); // [1, 64]
      const y = cpu.scale(cpu.reshape(h, [2, 32]), 0.05);
      const next = cpu.add(cpu.gatherRows(y, cpu.upload(new Int32Array([1]), [1])), x, 0.5);
      cpu.endScope([next]);
      cpu.free(x);
      x = next;
      // host mirror of the same step
      const hv = new Float32Array(64);
      for (let n = 0; n < 64; n++) {
        let s = 0;
        for (let k = 0; k < 32; k++) s += expect[k]! * wv[n * 32 + k]!;
        hv[n] = s;
      }
      expect = Float32Array.from({ length: 32 }, (_, k) => hv[32 + k]! * 0.05 + 0.5 * expect[k]!);
      assert.equal(live(), base);
    }
    const got = await cpu.read(x);
    for (let k = 0; k < 32; k++) assert.ok(Math.abs(got[k]! - expect[k]!) < 1e-4, `element ${k}`);
    assert.ok(cpu.memoryStats().idleBytes > 0, 'freed blocks are pooled for reuse');
  });
});

describe('stream ordering', () => {
  it('a block freed while an op still reads it is reused only by later ops', async () => {
    for (const n of [4, 300_000]) { // staged upload and fresh-block upload
      const r = rng(n);
      const av = randomF32(r, n);
      const a = cpu.upload(av, [n]);
      const y = cpu.scale(a, 2);
      cpu.free(a);
      const b = cpu.upload(randomF32(r, n), [n]); // may take a's block
      const z = cpu.scale(b, 1);
      const got = await cpu.read(y);
      for (let i = 0; i < n; i += Math.max(1, n >> 6)) assert.equal(got[i], av[i]! * 2);
      assert.ok((await cpu.read(z)).length === n);
      cpu.free(b);
      cpu.free(y);
      cpu.free(z);
    }
  });

  it('upload copies exactly the elements a subarray views (staged and fresh-block paths)', async () => {
    const big = Int32Array.from({ length: 400_000 }, (_, i) => i);
    assert.deepEqual([...(await cpu.read(cpu.upload(big.subarray(3, 7), [4])))], [3, 4, 5, 6]);
    const r = await cpu.read(cpu.upload(big.subarray(5, 300_005), [300_000]));
    assert.equal(r[0], 5);
    assert.equal(r[299_999], 300_004);
  });

  it('hundreds of concurrent reads all settle with their own values', async () => {
    const ts = Array.from({ length: 400 }, (_, i) => cpu.upload(f32(i, -i), [2]));
    const got = await Promise.all(ts.map((t) => cpu.read(t)));
    got.forEach((v, i) => assert.deepEqual([...v], [i, -i]));
    for (const t of ts) cpu.free(t);
  });

  it('read returns the value at the time of the call, not after later in-place writes', async () => {
    const kv = { k: cpu.zeros([2, 2, 1, 2], 'f32'), v: cpu.zeros([2, 2, 1, 2], 'f32') };
    const layout: StepLayout = {
      tokenRow: cpu.upload(new Int32Array([0]), [1]), tokenPos: cpu.upload(new Int32Array([0]), [1]),
      slots: cpu.upload(new Int32Array([3]), [1]), blockTables: cpu.upload(new Int32Array([1]), [1, 1]), blockSize: 2,
    };
    const before = cpu.read(kv.k);
    cpu.writeKv(kv, cpu.upload(f32(7, 8), [1, 1, 2]), cpu.upload(f32(9, 10), [1, 1, 2]), layout);
    const afterWrite = cpu.read(kv.k);
    assert.deepEqual([...(await before)], [0, 0, 0, 0, 0, 0, 0, 0]);
    assert.deepEqual([...(await afterWrite)], [0, 0, 0, 0, 0, 0, 7, 8]);
  });
});

describe('errors', () => {
  it('a bad shape throws at the call, names op and shapes, and enqueues nothing', async () => {
    const x = cpu.upload(randomF32(rng(3), 6), [2, 3]);
    const w = cpu.upload(randomF32(rng(4), 12), [3, 4]);
    assert.throws(() => cpu.matmul(x, w), /cpu backend matmul: x f32\[2, 3\] and w f32\[3, 4\] disagree on K/);
    await cpu.sync();
    const y = cpu.matmul(x, cpu.reshape(w, [4, 3]));
    assert.deepEqual([...y.shape], [2, 4]);
    await cpu.sync();
  });

  it('a native op error rejects sync with its message; the backend stays usable', async () => {
    const table = cpu.upload(randomF32(rng(5), 50 * 4), [50, 4]);
    cpu.embedding(table, cpu.upload(new Int32Array([3, 99]), [2]), 1);
    const after = cpu.scale(cpu.upload(f32(1, 2), [2]), 3); // enqueued behind the failing op
    await assert.rejects(cpu.sync(), /embedding: token id 99 at index 1 is out of range \[0, 50\)/);
    await cpu.sync(); // the error was reported once
    assert.deepEqual([...(await cpu.read(after))], [3, 6]);
  });

  it('an op error reaches only the waits that cover it', async () => {
    const early = cpu.read(cpu.scale(cpu.upload(f32(1), [1]), 2)); // enqueued before the failure
    cpu.gatherRows(cpu.upload(f32(1, 2), [2, 1]), cpu.upload(new Int32Array([2]), [1]));
    const late = cpu.sync();
    assert.deepEqual([...(await early)], [2]);
    await assert.rejects(late, /gatherRows: row index 2 at index 0 is out of range \[0, 2\)/);
  });

  it('attention through an unmapped block and writeKv past the pool are op errors', async () => {
    const kv = { k: cpu.zeros([2, 2, 1, 4], 'f32'), v: cpu.zeros([2, 2, 1, 4], 'f32') };
    const layout: StepLayout = {
      tokenRow: cpu.upload(new Int32Array([0]), [1]), tokenPos: cpu.upload(new Int32Array([2]), [1]),
      slots: cpu.upload(new Int32Array([4]), [1]), blockTables: cpu.upload(new Int32Array([1, -1]), [1, 2]),
      blockSize: 2,
    };
    cpu.attention(cpu.upload(randomF32(rng(6), 4), [1, 1, 4]), kv, layout, { scale: 1, window: 0, softcap: 0 });
    await assert.rejects(cpu.sync(), /attention: token 0 \(row 0, position 2\) reads logical block 1, mapped to physical block -1/);
    cpu.writeKv(kv, cpu.upload(f32(1, 2, 3, 4), [1, 1, 4]), cpu.upload(f32(1, 2, 3, 4), [1, 1, 4]), layout);
    await assert.rejects(cpu.read(kv.k), /writeKv: slot 4 of token 0 is out of range \[-1, 4\)/);
    await cpu.sync();
  });

  it('tensors of another backend instance or a closed backend are refused', async () => {
    const other = await createCpuBackend();
    const t = other.upload(f32(1), [1]);
    assert.throws(() => cpu.scale(t, 1), /belongs to another backend instance/);
    await other.close();
    assert.throws(() => other.scale(t, 1), /the backend is closed/);
    assert.equal(other.memoryStats().liveBlocks, 0);
  });
});

describe('event loop', () => {
  it('keeps ticking while a long op runs; enqueueing returns at once', async () => {
    const r = rng(7);
    const [M, N, K] = [256, 1024, 1024];
    const x = cpu.upload(randomF32(r, M * K), [M, K]);
    const w = cpu.upload(randomF32(r, N * K), [N, K]);
    // size the work to ~400 ms on this machine, whatever its core count: a matmul's time after a
    // first, untimed one (the first pays for page faults and the team's start, often several times
    // a steady one), the fastest of three
    cpu.free(cpu.matmul(x, w));
    await cpu.sync();
    let t0 = 0;
    let oneMs = Infinity;
    for (let k = 0; k < 3; k++) {
      t0 = performance.now();
      cpu.free(cpu.matmul(x, w));
      await cpu.sync();
      oneMs = Math.min(oneMs, performance.now() - t0);
    }
    const reps = Math.min(4000, Math.max(10, Math.ceil(400 / Math.max(oneMs, 0.1))));
    let ticks = 0;
    const timer = setInterval(() => ticks++, 5);
    t0 = performance.now();
    cpu.beginScope();
    for (let i = 0; i < reps; i++) cpu.matmul(x, w);
    cpu.endScope();
    const enqueueMs = performance.now() - t0;
    await cpu.sync();
    const totalMs = performance.now() - t0;
    clearInterval(timer);
    assert.ok(totalMs > 100, `the work was too short to tell (${totalMs} ms for ${reps} matmuls)`);
    assert.ok(enqueueMs < Math.max(100, totalMs / 4), `enqueueing ${reps} matmuls took ${enqueueMs} ms of ${totalMs}`);
    // a blocked loop would tick 0-1 times; allow a loaded machine 4x slack on the 5 ms period
    assert.ok(ticks >= Math.min(10, totalMs / 20), `${ticks} ticks in ${totalMs.toFixed(0)} ms`);
    cpu.free(x);
    cpu.free(w);
  });
});
