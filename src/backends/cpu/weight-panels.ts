// bf16 matmul weights in panels (native/weight_pack.c): what the TS side of the CPU backend needs
// to know of the layout. A panel tensor keeps its logical dtype and shape (bf16 [N, K]); only the
// ops that read the layout may take it, every other op refuses it by name. The same holds for GGUF
// Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 weights kept quantized in panels (native/quant_pack.c).
import type { OpChecks } from '../common/op-shapes.ts';
import type { CpuTensor } from './cpu-tensor.ts';

/** the ops and arguments that read a panel tensor's layout */
const READS_PANELS = new Set(['matmul:w', 'embedding:table']);

/** `checks` refusing panel tensors wherever the op would read them as row-major */
export function panelsOnlyWhereRead(checks: OpChecks<CpuTensor>): OpChecks<CpuTensor> {
  return {
    ...checks,
    arg(op, name, t, dtypes, rank) {
      const x = checks.arg(op, name, t, dtypes, rank);
      if (x.layout !== 'rows' && !READS_PANELS.has(`${op}:${name}`)) {
        throw checks.error(op, x.layout === 'p16'
          ? `${name} bf16[${x.shape.join(', ')}] is a matmul weight stored in panels (LLMTS_CPU_PACK_WEIGHTS): only matmul and embedding take it`
          : `${name} [${x.shape.join(', ')}] is a ${x.layout.toUpperCase()} matmul weight kept quantized (LLMTS_CPU_QUANT_WEIGHTS): ` +
            'only matmul and embedding take it');
      }
      return x;
    },
  };
}

/**
 * The f32 values of a bf16 [N][K] matrix from its panel words: panel p's word k2 * 16 + l holds
 * row 16p + l's pair (2 k2, 2 k2 + 1), the low half first.
 */
export function fromPanels(words: Uint32Array, N: number, K: number): Float32Array {
  const out = new Float32Array(N * K);
  const bits = new Uint32Array(out.buffer);
  const K2 = K / 2;
  for (let n = 0; n < N; n++) {
    const base = Math.floor(n / 16) * 16 * K2 + (n % 16);
    for (let k2 = 0; k2 < K2; k2++) {
      const w = words[base + k2 * 16]!;
      bits[n * K + 2 * k2] = (w & 0xffff) << 16;
      bits[n * K + 2 * k2 + 1] = w & 0xffff0000;
    }
  }
  return out;
}
