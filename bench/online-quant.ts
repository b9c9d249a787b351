// Host cost of quantizing at load (`--quantization`, src/artifacts/online-quant.ts): ns an element
// of the Q8_0 and Q4_0 quantizers over a 16M-element tensor, after a warm-up.
//   node --import tsx bench/online-quant.ts
import { quantizeQ4_0, quantizeQ8_0 } from '../src/artifacts/online-quant.ts';

const x = new Float32Array(1 << 24);
for (let i = 0; i < x.length; i++) x[i] = Math.sin(i) * 3;
for (const [name, quantize] of [['Q8_0', quantizeQ8_0], ['Q4_0', quantizeQ4_0]] as const) {
  quantize(x.subarray(0, 1 << 16));
  const t0 = performance.now();
  quantize(x);
  console.log(`${name}: ${(((performance.now() - t0) * 1e6) / x.length).toFixed(1)} ns an element`);
}
