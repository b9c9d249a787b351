// Programmatic dependent launch (PDL, compute capability 9.0+): a kernel launched with the
// programmatic-stream-serialization attribute may be scheduled while the kernel before it in the
// stream is still running; it must wait (griddepcontrol.wait, PDL_ENTRY in kernels.ts) before
// touching anything that kernel writes or reads. In a decode step of a few hundred short kernels
// this hides each launch's ramp-up behind the previous kernel's tail, and the GEMV kernels fetch
// their weights (which no kernel writes) before they wait.
//
// Only kernels that run PDL_ENTRY in every thread before any other memory access (weights aside)
// may be listed here: any other kernel launched with the attribute could race its predecessor.
import {
  GEMVP_GLU_KERNEL_NAMES, GEMVP_KERNEL_NAMES, GEMVP_NORM_KERNEL_NAMES, GEMVP_NORMGLU_KERNEL_NAMES, GEMVP_NORMROPE_KERNEL_NAMES,
} from './gemv-kernels.ts';
import type { KernelName } from './kernels.ts';

export const PDL_KERNELS: ReadonlySet<string> = new Set<KernelName>([
  'k_embedding', 'k_rmsnorm', 'k_gather_rows', 'k_add', 'k_scale', 'k_softcap', 'k_glu', 'k_write_kv', 'k_rope',
  'k_add_rmsnorm', 'k_glu_packed', 'k_rope_qkv', 'k_argmax_part', 'k_argmax_final',
  'k_attn_plan', 'k_attn_combine',
  'k_attn_decode_d64_g4', 'k_attn_decode_d64_g8', 'k_attn_decode_d128_g4', 'k_attn_decode_d128_g8',
  'k_attn_decode_d256_g4', 'k_attn_decode_d256_g8',
  'k_attn_decode_tc_d64', 'k_attn_decode_tc_d128',
  'k_gemv_m1_u16', 'k_gemv_m1_u8', 'k_gemv_m2_u16', 'k_gemv_m4_u8', 'k_gemv_m8_u4',
  // the persistent GEMVs: their first ring of weight loads before PDL_ENTRY, their staged x after
  ...GEMVP_KERNEL_NAMES, ...GEMVP_GLU_KERNEL_NAMES, ...GEMVP_NORM_KERNEL_NAMES, ...GEMVP_NORMGLU_KERNEL_NAMES,
  ...GEMVP_NORMROPE_KERNEL_NAMES,
]);

/**
 * Whether a device of compute capability `ccMajor` launches PDL_KERNELS with PDL: sm_90 and newer,
 * where CudaRuntimeSettings.pdl is on (the default; +1% at B=1 on the H200, TUNING.md).
 */
export function pdlEnabled(ccMajor: number, on: boolean): boolean {
  return ccMajor >= 9 && on;
}

// CUlaunchConfig (cuda.h): 7 unsigned ints (grid xyz, block xyz, shared bytes), 4 bytes padding,
// CUstream at 32, CUlaunchAttribute* at 40, unsigned numAttrs at 48: 56 bytes. One CUlaunchAttribute
// follows it at 56: id (u32) at +0, padding, the value union (64 bytes) at +8: 72 bytes.
export const LAUNCH_CONFIG_BYTES = 56 + 72;
const CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;

/**
 * Writes a launch config with the PDL attribute into `view` (host memory at address `addr`, which
 * must stay valid until cuLaunchKernelEx returns) and returns `addr`.
 */
export function writePdlLaunchConfig(view: DataView, addr: number, grid: readonly [number, number, number], block: number,
  shmem: number, stream: number): number {
  view.setUint32(0, grid[0], true);
  view.setUint32(4, grid[1], true);
  view.setUint32(8, grid[2], true);
  view.setUint32(12, block, true);
  view.setUint32(16, 1, true);
  view.setUint32(20, 1, true);
  view.setUint32(24, shmem, true);
  view.setUint32(28, 0, true);
  view.setBigUint64(32, BigInt(stream), true);
  view.setBigUint64(40, BigInt(addr + 56), true);
  view.setUint32(48, 1, true);
  view.setUint32(52, 0, true);
  view.setUint32(56, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, true);
  view.setUint32(60, 0, true);
  view.setInt32(64, 1, true); // programmaticStreamSerializationAllowed
  for (let o = 68; o < LAUNCH_CONFIG_BYTES; o += 4) view.setUint32(o, 0, true);
  return addr;
}
