// ggml's tensor types as a GGUF file names them: the type id stored in each tensor info, and the
// block layout (elements per block, bytes per block) of gguf-py's GGML_QUANT_SIZES, which is the
// spec this loader follows. `dequantizable` types are the ones dequant.ts turns into floats; the
// others are known (so a file using them gets a message naming the type) but not loadable.

export interface GgmlType {
  id: number;
  name: string;
  /** elements per block (1 for plain float/int types) */
  blockSize: number;
  /** bytes per block */
  typeSize: number;
  /** dequant.ts can turn it into f32 */
  dequantizable: boolean;
}

const QK_K = 256;

// id, name, block elements, block bytes, dequantizable
const TABLE: [number, string, number, number, boolean][] = [
  [0, 'F32', 1, 4, true],
  [1, 'F16', 1, 2, true],
  [2, 'Q4_0', 32, 2 + 16, true],
  [3, 'Q4_1', 32, 2 + 2 + 16, true],
  [6, 'Q5_0', 32, 2 + 4 + 16, true],
  [7, 'Q5_1', 32, 2 + 2 + 4 + 16, true],
  [8, 'Q8_0', 32, 2 + 32, true],
  [9, 'Q8_1', 32, 4 + 4 + 32, false],
  [10, 'Q2_K', 256, 2 + 2 + QK_K / 16 + QK_K / 4, true],
  [11, 'Q3_K', 256, 2 + QK_K / 4 + QK_K / 8 + 12, true],
  [12, 'Q4_K', 256, 2 + 2 + QK_K / 2 + 12, true],
  [13, 'Q5_K', 256, 2 + 2 + QK_K / 2 + QK_K / 8 + 12, true],
  [14, 'Q6_K', 256, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16, true],
  [15, 'Q8_K', 256, 4 + QK_K + QK_K / 8, false],
  [16, 'IQ2_XXS', 256, 2 + QK_K / 4, false],
  [17, 'IQ2_XS', 256, 2 + QK_K / 4 + QK_K / 32, false],
  [18, 'IQ3_XXS', 256, 2 + QK_K / 4 + QK_K / 8, false],
  [19, 'IQ1_S', 256, 2 + QK_K / 8 + QK_K / 16, false],
  [20, 'IQ4_NL', 32, 2 + 16, true],
  [21, 'IQ3_S', 256, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, false],
  [22, 'IQ2_S', 256, 2 + QK_K / 4 + QK_K / 16, false],
  [23, 'IQ4_XS', 256, 2 + 2 + QK_K / 2 + QK_K / 64, true],
  [24, 'I8', 1, 1, false],
  [25, 'I16', 1, 2, false],
  [26, 'I32', 1, 4, false],
  [27, 'I64', 1, 8, false],
  [28, 'F64', 1, 8, false],
  [29, 'IQ1_M', 256, QK_K / 8 + QK_K / 16 + QK_K / 32, false],
  [30, 'BF16', 1, 2, true],
  [34, 'TQ1_0', 256, 2 + 4 * 13, false],
  [35, 'TQ2_0', 256, 2 + 64, false],
  [39, 'MXFP4', 32, 1 + 16, false],
  [40, 'NVFP4', 64, 4 + 32, false],
  [41, 'Q1_0', 128, 2 + 16, false],
];

export const GGML_TYPES: ReadonlyMap<number, GgmlType> = new Map(
  TABLE.map(([id, name, blockSize, typeSize, dequantizable]) => [id, { id, name, blockSize, typeSize, dequantizable }]),
);

export const GGML_TYPE_BY_NAME: ReadonlyMap<string, GgmlType> = new Map([...GGML_TYPES.values()].map((t) => [t.name, t]));

/** Names of the types this loader dequantizes, for messages. */
export const LOADABLE_TYPE_NAMES: readonly string[] = [...GGML_TYPES.values()].filter((t) => t.dequantizable).map((t) => t.name);

/** Whether the type is stored as plain floats the backends read as-is (F32, F16, BF16). */
export function isPlainFloat(t: GgmlType): boolean {
  return t.name === 'F32' || t.name === 'F16' || t.name === 'BF16';
}
