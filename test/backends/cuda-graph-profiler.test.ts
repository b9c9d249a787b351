// The in-graph kernel profiler (src/backends/cuda/graph-profiler.ts) against a fake driver: event
// nodes only during a capture, recorded as capture nodes (CU_EVENT_RECORD_EXTERNAL), per-name sums
// of the last replay, graphs never replayed left out, events reused and destroyed. (On the GPU:
// bench/cuda-generate.ts --profile-graph.)
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import type { Driver } from '../../src/backends/cuda/cuda-lib.ts';
import { CU_EVENT_RECORD_EXTERNAL, GraphProfiler } from '../../src/backends/cuda/graph-profiler.ts';

/** Events whose "time" is set by replay(): the ms at which each recorded node ran. */
function fakeDriver() {
  let next = 1;
  const created = new Set<number>();
  const destroyed: number[] = [];
  const flags: number[] = [];
  const time = new Map<number, number>();
  const driver = {
    cuEventCreate: (o: BigUint64Array) => { o[0] = BigInt(next); created.add(next++); return 0; },
    cuEventRecordWithFlags: (_e: number, _s: number, f: number) => { flags.push(f); return 0; },
    cuEventElapsedTime: (ms: Float32Array, a: number, b: number) => {
      const ta = time.get(a), tb = time.get(b);
      if (ta === undefined || tb === undefined) return 600; // CUDA_ERROR_NOT_READY
      ms[0] = tb - ta;
      return 0;
    },
    cuEventDestroy_v2: (e: number) => { destroyed.push(e); return 0; },
  };
  return {
    driver: driver as unknown as Driver, created, destroyed, flags,
    /** a replay: the given events ran at the given times */
    replay(at: [number, number][]) { for (const [e, t] of at) time.set(e, t); },
  };
}

describe('GraphProfiler', () => {
  it('brackets calls only during a capture, as capture nodes, and sums the last replay by name', () => {
    const f = fakeDriver();
    const p = new GraphProfiler(f.driver, 9);
    assert.equal(p.begin(), undefined, 'outside a capture nothing is recorded');
    p.beginCapture();
    const marks: number[] = [];
    for (const name of ['gemv', 'attn', 'gemv']) {
      const s = p.begin()!;
      const e = (p.end(name, s), f.created.size);
      marks.push(s, e);
    }
    p.endCapture(77);
    assert.ok(f.flags.length === 6 && f.flags.every((x) => x === CU_EVENT_RECORD_EXTERNAL), 'six event-record nodes');
    assert.deepEqual(p.collect(), [], 'a graph not replayed yet is left out');
    // replay: gemv 0-10, gap 2, attn 12-15, gap 1, gemv 16-26 (ms)
    f.replay([[marks[0]!, 0], [marks[1]!, 10], [marks[2]!, 12], [marks[3]!, 15], [marks[4]!, 16], [marks[5]!, 26]]);
    const [g] = p.collect();
    assert.equal(g!.graph, 77);
    assert.equal(g!.calls, 3);
    assert.equal(g!.spanMs, 26);
    assert.equal(g!.kernelMs, 23);
    assert.deepEqual(g!.kernels.map((k) => [k.name, k.calls, k.ms]), [['gemv', 2, 20], ['attn', 1, 3]]);
    assert.deepEqual(g!.sequence, [{ name: 'gemv', us: 10000 }, { name: 'attn', us: 3000 }, { name: 'gemv', us: 10000 }],
      'each call in graph order');
  });

  it('drops an aborted capture and reuses its events; destroyGraph and close release them', () => {
    const f = fakeDriver();
    const p = new GraphProfiler(f.driver, 9);
    p.beginCapture();
    p.end('k', p.begin()!);
    p.endCapture(0); // aborted
    assert.equal(f.created.size, 2);
    p.beginCapture();
    p.end('k', p.begin()!);
    p.endCapture(5);
    assert.equal(f.created.size, 2, 'the aborted capture\'s two events were reused');
    p.destroyGraph(5);
    p.beginCapture();
    p.end('k', p.begin()!);
    p.endCapture(6);
    assert.equal(f.created.size, 2, 'a destroyed graph\'s events were reused');
    p.close();
    assert.deepEqual([...f.destroyed].sort(), [...f.created].sort(), 'close destroys every event');
  });
});
