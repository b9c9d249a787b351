// What a decode step reads of a loaded model's weights on the CPU backend: every layer matrix and
// the lm_head once (tied: the embedding), as the backend holds them (bf16 panels or a GGUF's
// quantized blocks); the embedding table aside (a step reads one row of it).

import type { CpuTensor } from '../src/backends/cpu/cpu-tensor.ts';
import type { LoadedModel } from '../src/execution/load-model.ts';

/** The matrices a decode step streams, each once. */
export function decodeMatrices(m: LoadedModel): CpuTensor[] {
  const w = m.model.weights;
  return [...new Set([...w.layers.flatMap((l) => [l.attn.q, l.attn.k, l.attn.v, l.attn.o, l.mlp.gate, l.mlp.up, l.mlp.down]),
    w.lmHead])] as unknown as CpuTensor[];
}

/** Bytes a decode step reads of the weights. */
export function decodeWeightBytes(m: LoadedModel): number {
  return decodeMatrices(m).reduce((a, t) => a + t.bytes, 0);
}
