// The algorithm of the CUDA sampling kernel, run as its TypeScript model (sampling-kernel-model.ts)
// in CPU CI: its tokens equal the host sampler's except where a case sits within the device's
// stated tolerance (1e-5 of the mass) of a rounding boundary; its logprobs are within 1e-5.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { decodeSampleResults } from '../../src/contracts/device-sampling.ts';
import { type Case, casesFor, compareWithHost, deviceRow, logitRows, NEAR_ENDS } from '../sampling/device-sampling-cases.ts';
import { modelSampleRows } from './sampling-kernel-model.ts';

function runModel(cases: Case[]) {
  const V = cases[0]!.raw.length;
  const logits = new Float32Array(cases.length * V);
  cases.forEach((c, i) => logits.set(c.raw, i * V));
  const rows = cases.map(deviceRow);
  return decodeSampleResults(modelSampleRows(logits, V, rows), rows);
}

for (const V of [50, 1000, 5000]) {
  test(`kernel model = host sampler within the device tolerance, V ${V}`, (t) => {
    let skipped = 0;
    let checked = 0;
    for (const [k, raw] of logitRows(V, 3 * V).entries()) {
      const cases = casesFor(raw, V + k, 12, NEAR_ENDS);
      const r = compareWithHost(cases, runModel(cases), 1e-5);
      skipped += r.skipped;
      checked += r.checked;
    }
    t.diagnostic(`${checked} cases equal, ${skipped} within 1e-5 of a boundary`);
    assert.ok(skipped <= Math.max(2, checked / 100), `${skipped} of ${checked + skipped} cases within 1e-5 of a boundary`);
  });
}
