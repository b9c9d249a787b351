// The op rules every backend shares (src/backends/common/op-shapes.ts): each rule, broken on
// purpose, throws its message on the CPU, reference and dry-run backends alike, prefixed with the
// backend's name, before the op does anything. (The CUDA backend runs the same rules: its own
// checks beyond them are in cuda-ops.test.ts.)
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type { Backend, StepLayout, Tensor } from '../../src/contracts/backend.ts';
import { ReferenceBackend } from '../../src/backends/reference/reference-backend.ts';
import { createCpuBackend, type CpuBackend } from '../../src/backends/cpu/index.ts';
import { DryRunBackend } from '../../src/execution/fit/dry-run-backend.ts';
import { ExactModel } from '../../src/execution/fit/allocator.ts';

let cpu: CpuBackend;
before(async () => {
  cpu = await createCpuBackend();
});
after(async () => {
  await cpu.close();
});

const f32 = (b: Backend, shape: number[]) => b.upload(new Float32Array(shape.reduce((a, d) => a * d, 1)), shape);
const i32 = (b: Backend, shape: number[]) => b.upload(new Int32Array(shape.reduce((a, d) => a * d, 1)), shape);
/** pools [1 block, 4 a block, 2 kv heads, headDim 4] */
const pools = (b: Backend, v = [1, 4, 2, 4]) => ({ k: f32(b, [1, 4, 2, 4]), v: f32(b, v) });
const layout = (b: Backend, T: number, blockSize = 4): StepLayout => ({
  tokenRow: i32(b, [T]), tokenPos: i32(b, [T]), slots: i32(b, [T]), blockTables: i32(b, [1, 1]), blockSize,
});
const ok = { scale: 1, window: 0, softcap: 0 };
const moe = (b: Backend, o: { rows?: number; gate?: number[]; up?: number[]; down?: number[]; act?: string } = {}) =>
  b.moeFfn(f32(b, [2, 4]), { weights: f32(b, [o.rows ?? 2, 1]), experts: i32(b, [o.rows ?? 2, 1]) },
    f32(b, o.gate ?? [3, 5, 4]), f32(b, o.up ?? [3, 5, 4]), f32(b, o.down ?? [3, 4, 5]), (o.act ?? 'silu') as 'silu');
const sampleRow = { temperature: 1, topK: 0, topP: 1, minP: 0, u: 0.5, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0 };

/** [rule broken, the call that breaks it, its message after "<backend> backend "] */
const cases: [string, (b: Backend) => unknown, RegExp][] = [
  ['upload: data and shape disagree', (b) => b.upload(new Float32Array(3), [2]), /upload: shape \[2\] has 2 elements but data has 3/],
  ['upload: a negative dimension', (b) => b.upload(new Float32Array(0), [-1]), /upload: invalid shape \[-1\]/],
  ['zeros: an unknown dtype', (b) => b.zeros([2], 'q8' as 'f32'), /zeros: unknown dtype q8/],
  ['reshape: another element count', (b) => b.reshape(f32(b, [4]), [3]),
    /reshape: cannot view f32\[4\] as \[3\] \(element counts differ\)/],
  ['copyTensor: another dtype', (b) => b.copyTensor!(f32(b, [4]), i32(b, [4])),
    /copyTensor: src i32\[4\] does not match t f32\[4\] \(same dtype and element count\)/],
  ['embedding: float ids', (b) => b.embedding(f32(b, [3, 2]), f32(b, [1]), 1), /embedding: ids must be i32, got f32\[1\]/],
  ['embedding: a table of rank 1', (b) => b.embedding(f32(b, [6]), i32(b, [1]), 1), /embedding: table must have rank 2, got f32\[6\]/],
  ['embedding: a NaN scale', (b) => b.embedding(f32(b, [3, 2]), i32(b, [1]), NaN), /embedding: scale must be a finite number, got NaN/],
  ['matmul: K differs', (b) => b.matmul(f32(b, [2, 3]), f32(b, [2, 4])),
    /matmul: x f32\[2, 3\] and w f32\[2, 4\] disagree on K \(w is \[N, K\]\)/],
  ['matmul: x of rank 1', (b) => b.matmul(f32(b, [3]), f32(b, [2, 3])), /matmul: x must have rank 2, got f32\[3\]/],
  ['matmul: a bias of another length', (b) => b.matmul(f32(b, [1, 3]), f32(b, [2, 3]), f32(b, [3])),
    /matmul: bias length is 3 but must be 2 \(w f32\[2, 3\]\)/],
  ['rmsnorm: w of another length', (b) => b.rmsnorm(f32(b, [2, 4]), f32(b, [3]), 1e-6, 0),
    /rmsnorm: w length is 3 but must be 4 \(last dim of x f32\[2, 4\]\)/],
  ['rmsnorm: a scalar x', (b) => b.rmsnorm(f32(b, []), f32(b, [1]), 1e-6, 0), /rmsnorm: x must have at least one dimension/],
  ['rmsnorm: an infinite eps', (b) => b.rmsnorm(f32(b, [2, 4]), f32(b, [4]), Infinity, 0), /rmsnorm: eps must be a finite number, got Infinity/],
  ['add: shapes differ', (b) => b.add(f32(b, [4]), f32(b, [2, 2]), 1), /add: shapes differ: a f32\[4\], b f32\[2, 2\]/],
  ['add: a NaN bScale', (b) => b.add(f32(b, [4]), f32(b, [4]), NaN), /add: bScale must be a finite number, got NaN/],
  ['scale: an infinite factor', (b) => b.scale(f32(b, [4]), -Infinity), /scale: s must be a finite number, got -Infinity/],
  ['glu: shapes differ', (b) => b.glu(f32(b, [2, 3]), f32(b, [3, 2]), 'silu'), /glu: shapes differ: gate f32\[2, 3\], up f32\[3, 2\]/],
  ['glu: an unknown activation', (b) => b.glu(f32(b, [2]), f32(b, [2]), 'relu' as 'silu'), /glu: unknown activation relu/],
  ['rope: x of rank 2', (b) => b.rope(f32(b, [1, 8]), i32(b, [1]), f32(b, [4]), 1), /rope: x must have rank 3, got f32\[1, 8\]/],
  ['rope: positions for another token count', (b) => b.rope(f32(b, [1, 1, 8]), i32(b, [2]), f32(b, [4]), 1),
    /rope: pos length is 2 but must be 1 \(x f32\[1, 1, 8\] is \[T, H, headDim\]\)/],
  ['rope: a per-token table of other rows', (b) => b.rope(f32(b, [1, 1, 8]), i32(b, [1]), f32(b, [2, 4]), 1),
    /rope: invFreq rows is 2 but must be 1/],
  ['rope: a table wider than the head', (b) => b.rope(f32(b, [1, 1, 8]), i32(b, [1]), f32(b, [5]), 1),
    /rope: invFreq f32\[5\] rotates 10 dims but headDim is 8/],
  ['rope: a NaN attentionScaling', (b) => b.rope(f32(b, [1, 1, 8]), i32(b, [1]), f32(b, [4]), NaN),
    /rope: attentionScaling must be a finite number, got NaN/],
  ['writeKv: pools that differ', (b) => b.writeKv(pools(b, [1, 4, 2, 2]), f32(b, [1, 2, 4]), f32(b, [1, 2, 4]), layout(b, 1)),
    /writeKv: kv.k f32\[1, 4, 2, 4\] and kv.v f32\[1, 4, 2, 2\] differ/],
  ['writeKv: a layout of another block size', (b) => b.writeKv(pools(b), f32(b, [1, 2, 4]), f32(b, [1, 2, 4]), layout(b, 1, 8)),
    /writeKv: layout.blockSize is 8 but must be 4 \(pool f32\[1, 4, 2, 4\] is \[blocks, blockSize, kvHeads, headDim\]\)/],
  ['writeKv: k and v differ', (b) => b.writeKv(pools(b), f32(b, [1, 2, 4]), f32(b, [2, 2, 4]), layout(b, 1)),
    /writeKv: k f32\[1, 2, 4\] and v f32\[2, 2, 4\] differ/],
  ['writeKv: k of other heads', (b) => b.writeKv(pools(b), f32(b, [1, 1, 4]), f32(b, [1, 1, 4]), layout(b, 1)),
    /writeKv: k f32\[1, 1, 4\] must be \[T, 2, 4\] to match the pool \[1, 4, 2, 4\]/],
  ['writeKv: slots for another token count', (b) => b.writeKv(pools(b), f32(b, [2, 2, 4]), f32(b, [2, 2, 4]), layout(b, 1)),
    /writeKv: layout.slots length is 1 but must be 2 \(k f32\[2, 2, 4\]\)/],
  ['attention: q of another head dim', (b) => b.attention(f32(b, [1, 2, 8]), pools(b), layout(b, 1), ok),
    /attention: q headDim is 8 but must be 4 \(pool f32\[1, 4, 2, 4\]\)/],
  ['attention: q heads not a multiple of kv heads', (b) => b.attention(f32(b, [1, 3, 4]), pools(b), layout(b, 1), ok),
    /attention: q heads 3 is not a multiple of kv heads 2/],
  ['attention: positions for another token count', (b) => b.attention(f32(b, [2, 2, 4]), pools(b), layout(b, 1), ok),
    /attention: layout.tokenRow length is 1 but must be 2 \(q f32\[2, 2, 4\]\)/],
  ['attention: a negative window', (b) => b.attention(f32(b, [1, 2, 4]), pools(b), layout(b, 1), { ...ok, window: -1 }),
    /attention: params.window must be an integer >= 0, got -1/],
  ['attention: a negative soft-cap', (b) => b.attention(f32(b, [1, 2, 4]), pools(b), layout(b, 1), { ...ok, softcap: -2 }),
    /attention: params.softcap must be >= 0, got -2/],
  ['attention: a NaN scale', (b) => b.attention(f32(b, [1, 2, 4]), pools(b), layout(b, 1), { ...ok, scale: NaN }),
    /attention: params.scale must be a finite number, got NaN/],
  ['softcap: a cap of 0', (b) => b.softcap(f32(b, [4]), 0), /softcap: cap must be > 0, got 0/],
  ['gatherRows: float indices', (b) => b.gatherRows(f32(b, [3, 2]), f32(b, [1])), /gatherRows: idx must be i32, got f32\[1\]/],
  ['gatherRows: x of rank 3', (b) => b.gatherRows(f32(b, [3, 2, 1]), i32(b, [1])), /gatherRows: x must have rank 2, got f32\[3, 2, 1\]/],
  ['argmax: x of rank 1', (b) => b.argmax!(f32(b, [5])), /argmax: x must have rank 2, got f32\[5\]/],
  ['sampleRows: rows for another logit count', (b) => b.sampleRows!(f32(b, [2, 5]), [sampleRow]),
    /sampleRows: 1 rows for logits f32\[2, 5\]/],
  ['moeRoute: topK above the experts', (b) => b.moeRoute(f32(b, [2, 3]), 4, true),
    /moeRoute: topK must be an integer in \[1, 3\] for logits f32\[2, 3\], got 4/],
  ['moeFfn: routing for other tokens', (b) => moe(b, { rows: 3 }),
    /moeFfn: routing weights f32\[3, 1\] \/ experts i32\[3, 1\] must both be \[2, topK\]/],
  ['moeFfn: gate of another hidden size', (b) => moe(b, { gate: [3, 5, 3], up: [3, 5, 3] }),
    /moeFfn: gate f32\[3, 5, 3\] must be \[E, I, 4\] for x f32\[2, 4\]/],
  ['moeFfn: up unlike gate', (b) => moe(b, { up: [3, 6, 4] }), /moeFfn: up f32\[3, 6, 4\] must match gate f32\[3, 5, 4\]/],
  ['moeFfn: down not [E, D, I]', (b) => moe(b, { down: [3, 5, 4] }), /moeFfn: down f32\[3, 5, 4\] must be \[3, 4, 5\]/],
  ['moeFfn: an unknown activation', (b) => moe(b, { act: 'relu' }), /moeFfn: unknown activation relu/],
];

/** the backends under test, each with what its messages start with */
const backends: [string, () => Backend, string][] = [
  ['cpu', () => cpu, 'cpu backend '],
  ['reference', () => new ReferenceBackend(), 'reference backend '],
  ['dry run', () => new DryRunBackend({ name: 'cpu', activationDtype: 'f32', allocator: new ExactModel() }), 'cpu backend (dry run) '],
];

for (const [name, make, prefix] of backends) {
  describe(`op rules on the ${name} backend`, () => {
    for (const [rule, call, msg] of cases) {
      it(rule, (t) => {
        const b = make();
        const op = rule.slice(0, rule.indexOf(':'));
        if (typeof (b as unknown as Record<string, unknown>)[op] !== 'function') return t.skip(`no ${op}`);
        b.beginScope();
        try {
          assert.throws(() => call(b), (e: Error) => {
            assert.ok(e.message.startsWith(prefix), `"${e.message}" names the ${name} backend`);
            assert.match(e.message, msg);
            return true;
          });
        } finally {
          b.endScope();
        }
      });
    }
  });
}

it('a foreign tensor is refused by name on each backend', () => {
  const other = new ReferenceBackend().upload(new Float32Array(1), [1]);
  assert.throws(() => cpu.scale(other, 1), /cpu backend scale: x is not a CPU backend tensor/);
  const foreign: Tensor = { shape: [1], dtype: 'f32' };
  assert.throws(() => new ReferenceBackend().scale(foreign, 1), /reference backend scale: x is not a reference backend tensor/);
  const dry = new DryRunBackend({ name: 'cuda', activationDtype: 'bf16', allocator: new ExactModel() });
  assert.throws(() => dry.scale(other, 1), /cuda backend \(dry run\) scale: x is not a dry-run tensor/);
});
