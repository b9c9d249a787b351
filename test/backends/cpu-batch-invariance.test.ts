// The CPU kernels give a row the same bits whatever else shares the call: a matmul row equals
// itself in a matmul of any other number of rows (the decode and prefill kernels, the bf16 dot
// products, every ISA, one thread or the team), and an attention token equals itself computed
// alone, in a block of its row's tokens, or in a chunk split elsewhere (windows, soft-caps; f32,
// bf16, int8 and fp8 pools). test/execution/batch-invariance.test.ts checks the same end to end.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { StepLayout, Tensor } from '../../src/contracts/backend.ts';
import { encodeHalf } from '../../src/backends/common/half.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import { CPU_ISA_NAMES, forEachCpuIsa, randomF32, rng, WeightDir } from './helpers.ts';
import { quantizeRows } from './kv-quant-model.ts';

let cpu: CpuBackend;
let files: WeightDir;

before(async () => {
  cpu = await createCpuBackend();
  files = new WeightDir();
});
after(async () => {
  loadNativeLib().setIsa(-1);
  await cpu.close();
  files.cleanup();
});

/** Runs `body` for every kernel ISA this CPU supports, small matmuls on one thread and on the team. */
const forEachIsa = (body: (label: string) => Promise<void>) =>
  forEachCpuIsa(cpu, (isa, parallel) => body(`${CPU_ISA_NAMES[isa]}${parallel ? ', parallel' : ''}`));

/** Index and values of the first element where a and b differ bit for bit, or undefined. */
function firstDiff(a: ArrayLike<number>, b: ArrayLike<number>): string | undefined {
  assert.equal(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return `element ${i}: ${a[i]} vs ${b[i]}`;
  return undefined;
}

describe('matmul rows do not depend on the other rows of the call', () => {
  // K 67 (odd: no bf16 pairs), 64 and 300 (bf16 pairs and a tail of pairs), N with partial blocks
  const shapes: [number, number][] = [[129, 67], [33, 64], [70, 300], [40, 100]];
  const TOTAL = 40;
  for (const dtype of ['f32', 'f16', 'bf16'] as const) {
    it(`${dtype} weights: rows of M = 1..40 at any offset equal the same rows of M = 40, every ISA`, async () => {
      await forEachIsa(async (isa) => {
        const r = rng(5);
        for (const [N, K] of shapes) {
          const x = randomF32(r, TOTAL * K);
          const w = await cpu.loadWeight(files.write(randomF32(r, N * K), dtype, [N, K]), 'keep');
          const bias = cpu.upload(randomF32(r, N), [N]);
          const all = (await cpu.read(cpu.matmul(cpu.upload(x, [TOTAL, K]), w, bias))) as Float32Array;
          for (const M of [1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 33]) {
            for (const offset of [0, TOTAL - M]) {
              const part = cpu.matmul(cpu.upload(x.subarray(offset * K, (offset + M) * K), [M, K]), w, bias);
              const got = (await cpu.read(part)) as Float32Array;
              const diff = firstDiff(got, all.subarray(offset * N, (offset + M) * N));
              assert.equal(diff, undefined, `${dtype} N=${N} K=${K} ${isa}: rows ${offset}..${offset + M - 1} alone differ at ${diff}`);
            }
          }
        }
      });
    });
  }
});

describe('attention tokens do not depend on how their row is split into blocks', () => {
  // One row of 90 tokens in scattered blocks of 8 slots; its prefill computed whole, token by token
  // (each a lone token, as in decode), and in chunks of other sizes beside another row's tokens.
  const [NB, BS, KVH, H, D, L] = [16, 8, 2, 6, 40, 90];
  const r = rng(17);
  const table = new Int32Array([3, 0, 7, 12, 5, 9, 14, 1, 2, 4, 6, 8]);
  const MBR = table.length;
  const kp = randomF32(r, NB * BS * KVH * D), vp = randomF32(r, NB * BS * KVH * D);
  const q = randomF32(r, L * H * D, 2);
  const other = randomF32(r, 5 * H * D, 2); // a second row's decode tokens sharing the steps

  async function pools(dtype: 'f32' | 'bf16' | 'int8' | 'fp8') {
    if (dtype === 'f32') return { k: cpu.upload(kp, [NB, BS, KVH, D]), v: cpu.upload(vp, [NB, BS, KVH, D]) };
    const kv = { k: cpu.zeros([NB, BS, KVH, D], dtype), v: cpu.zeros([NB, BS, KVH, D], dtype) };
    const bytes = (x: Float32Array) => (dtype === 'bf16' ? new Uint8Array(encodeHalf(x, 'bf16').buffer) : quantizeRows(x, D, dtype));
    cpu.writeBlocks(kv.k, [...Array(NB).keys()], bytes(kp));
    cpu.writeBlocks(kv.v, [...Array(NB).keys()], bytes(vp));
    return kv;
  }

  /** Positions [from, to) of row 0, with `extra` lone tokens of row 1 (positions 40..) before them. */
  async function step(kv: { k: Tensor; v: Tensor }, from: number, to: number, extra: number,
    params: { scale: number; window: number; softcap: number }): Promise<Float32Array> {
    const n = to - from, T = n + extra;
    const rows = new Int32Array([...Array(extra).fill(1), ...Array(n).fill(0)]);
    const pos = new Int32Array([...Array.from({ length: extra }, (_, i) => 40 + i), ...Array.from({ length: n }, (_, i) => from + i)]);
    const qq = new Float32Array(T * H * D);
    qq.set(other.subarray(0, extra * H * D));
    qq.set(q.subarray(from * H * D, to * H * D), extra * H * D);
    const layout: StepLayout = {
      tokenRow: cpu.upload(rows, [T]), tokenPos: cpu.upload(pos, [T]), slots: cpu.upload(new Int32Array(T).fill(-1), [T]),
      blockTables: cpu.upload(new Int32Array([...table, ...table]), [2, MBR]), blockSize: BS,
    };
    const out = (await cpu.read(cpu.attention(cpu.upload(qq, [T, H, D]), kv, layout, params))) as Float32Array;
    return out.subarray(extra * H * D);
  }

  for (const dtype of ['f32', 'bf16', 'int8', 'fp8'] as const) {
    for (const params of [{ scale: 0.16, window: 0, softcap: 0 }, { scale: 0.3, window: 21, softcap: 4 }, { scale: 0.2, window: 7, softcap: 0 }]) {
      it(`${dtype} pools, window ${params.window}, softcap ${params.softcap}: whole, token by token and in other chunks, every ISA`, async () => {
        await forEachIsa(async (isa) => {
          const kv = await pools(dtype);
          const whole = await step(kv, 0, L, 0, params);
          const splits: [string, number[]][] = [
            ['token by token', Array.from({ length: L + 1 }, (_, i) => i)],
            ['chunks of 7', [0, 7, 14, 21, 28, 35, 42, 49, 56, 63, 70, 77, 84, 90]],
            ['1 + 33 + 16 + 40', [0, 1, 34, 50, 90]],
            ['89 + 1', [0, 89, 90]],
          ];
          for (const [what, cuts] of splits) {
            const got = new Float32Array(L * H * D);
            for (let c = 0; c + 1 < cuts.length; c++) {
              got.set(await step(kv, cuts[c]!, cuts[c + 1]!, c % 3, params), cuts[c]! * H * D);
            }
            const diff = firstDiff(got, whole);
            assert.equal(diff, undefined, `${dtype} ${JSON.stringify(params)} ${isa}: ${what} differs from the whole chunk at ${diff}`);
          }
        });
      });
    }
  }

  it('keys before a sliding window are never read: their blocks may be unmapped or hold anything (NaN here), every ISA', async () => {
    // the last 10 positions of the row, as one block and one by one, window 7 and 21: blocks wholly
    // before every window point at a block of NaN keys and values; outputs equal the mapped run's
    const nanBlock = 15; // not in the row's table
    const kpn = Float32Array.from(kp), vpn = Float32Array.from(vp);
    kpn.fill(NaN, nanBlock * BS * KVH * D, (nanBlock + 1) * BS * KVH * D);
    vpn.fill(NaN, nanBlock * BS * KVH * D, (nanBlock + 1) * BS * KVH * D);
    for (const window of [7, 21]) {
      const params = { scale: 0.2, window, softcap: 0 };
      const firstNeeded = Math.floor((L - 10 - window + 1) / BS); // the first block any of the tokens reads
      const poisoned = Int32Array.from(table, (b, i) => (i < firstNeeded ? nanBlock : b));
      await forEachIsa(async (isa) => {
        const run = async (k: Float32Array, v: Float32Array, tab: Int32Array, from: number, to: number) => {
          const n = to - from;
          const layout: StepLayout = {
            tokenRow: cpu.upload(new Int32Array(n), [n]), tokenPos: cpu.upload(Int32Array.from({ length: n }, (_, i) => from + i), [n]),
            slots: cpu.upload(new Int32Array(n).fill(-1), [n]), blockTables: cpu.upload(tab, [1, MBR]), blockSize: BS,
          };
          const kv = { k: cpu.upload(k, [NB, BS, KVH, D]), v: cpu.upload(v, [NB, BS, KVH, D]) };
          return (await cpu.read(cpu.attention(cpu.upload(q.subarray(from * H * D, to * H * D), [n, H, D]), kv, layout, params))) as Float32Array;
        };
        const want = await run(kp, vp, table, L - 10, L);
        const block = await run(kpn, vpn, poisoned, L - 10, L);
        assert.equal(firstDiff(block, want), undefined, `window ${window} ${isa}: a block of 10 tokens read a key before its window`);
        for (let t = L - 10; t < L; t++) {
          const lone = await run(kpn, vpn, poisoned, t, t + 1);
          const diff = firstDiff(lone, want.subarray((t - (L - 10)) * H * D, (t - (L - 10) + 1) * H * D));
          assert.equal(diff, undefined, `window ${window} ${isa}: token ${t} alone read a key before its window (${diff})`);
        }
      });
    }
  });
});
