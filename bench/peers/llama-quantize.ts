// Quantizes a GGUF file with llama.cpp's own quantizer (llama_model_quantize in libllama), to make
// K-quant files (Q4_K_M, Q5_K_M, Q6_K, ...) for bench/peers/llama-cpp.ts --gguf. gguf-py, which
// tools/gguf/convert_qwen3.py writes with, has no K-quant quantizer; llama.cpp's mixes (which
// tensors get Q6_K in a Q4_K_M file) are also what published GGUF files contain.
//
// The library is node-llama-cpp's prebuilt CPU build, called through koffi; nothing is compiled.
// The peer is not a dependency (CI never installs it); install it without saving:
//   npm install --no-save node-llama-cpp@3.22.1
//   python3 tools/gguf/convert_qwen3.py MODEL_DIR /tmp/model-bf16.gguf --outtype bf16
//   node --import tsx bench/peers/llama-quantize.ts --input /tmp/model-bf16.gguf
//        --output /tmp/model-q4_k_m.gguf --type Q4_K_M [--threads 2]
// llama.cpp logs each tensor's conversion to stderr itself; this prints the sizes at the end.
//
// ABI: written against llama.h of the llama.cpp release node-llama-cpp 3.22.1 bundles, "v0.5.0"
// (node_modules/node-llama-cpp/llama/binariesGithubRelease.json; the source is the git bundle
// llama/gitRelease.bundle beside it, squashed commit de3ff815ea7d559ee917f063901b8986f038abc6).
// There llama_model_quantize_params is, on x86-64 (sizeof 64, alignment 8):
//    0 int32_t nthread            4 enum llama_ftype ftype
//    8 enum ggml_type output_tensor_type    12 enum ggml_type token_embedding_type
//   16 bool allow_requantize, quantize_output_tensor, only_copy, pure, keep_split, dry_run (16..21)
//   24 imatrix *   32 kv_overrides *   40 tt_overrides *   48 prune_layers *   56 size_t max_buf_size
// The struct has gained fields across llama.cpp releases, so rather than mirror it, this treats it
// as 64 opaque bytes: llama_model_quantize_default_params fills them, only nthread and ftype are
// overwritten. The defaults are checked against that layout first, so a different build is
// refused instead of being handed a misread struct.
import { parseArgs } from 'node:util';
import { createRequire } from 'node:module';
import { existsSync, readFileSync, readdirSync, statSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import koffi from 'koffi';

const INSTALL_HINT = 'run `npm install --no-save node-llama-cpp@3.22.1`';
const MATCHED_RELEASE = 'v0.5.0';
const PARAMS_BYTES = 64;
const OFF_NTHREAD = 0;
const OFF_FTYPE = 4;

/** enum llama_ftype of llama.h v0.5.0, by the names llama.cpp's llama-quantize tool accepts (no imatrix needed). */
const FTYPES: Record<string, number> = {
  F32: 0, F16: 1, BF16: 32,
  Q4_0: 2, Q4_1: 3, Q5_0: 8, Q5_1: 9, Q8_0: 7,
  Q2_K: 10, Q2_K_S: 21,
  Q3_K_S: 11, Q3_K_M: 12, Q3_K_L: 13, Q3_K: 12,
  Q4_K_S: 14, Q4_K_M: 15, Q4_K: 15,
  Q5_K_S: 16, Q5_K_M: 17, Q5_K: 17,
  Q6_K: 18,
  IQ4_NL: 25, IQ4_XS: 30,
};

function fail(msg: string): never {
  console.error(`llama-quantize: ${msg}`);
  process.exit(1);
}

const { values } = parseArgs({
  options: {
    input: { type: 'string' },
    output: { type: 'string' },
    type: { type: 'string', default: 'Q4_K_M' },
    threads: { type: 'string', default: String(os.availableParallelism()) },
  },
});
if (!values.input || !values.output) fail('usage: --input IN.gguf --output OUT.gguf --type Q4_K_M [--threads N]');
const input = path.resolve(values.input);
const output = path.resolve(values.output);
const typeName = values.type!.toUpperCase();
const ftype = FTYPES[typeName];
if (ftype === undefined) fail(`unknown --type ${values.type}; one of ${Object.keys(FTYPES).join(', ')}`);
const threads = Number(values.threads);
if (!Number.isInteger(threads) || threads < 1) fail(`--threads must be a positive integer, got ${values.threads}`);
if (!existsSync(input)) fail(`no such file: ${input}`);
if (input === output) fail('--output must differ from --input (llama.cpp reads the input while writing)');
if (process.platform !== 'linux' || process.arch !== 'x64') fail(`needs linux x64 (the @node-llama-cpp/linux-x64 build), this is ${process.platform} ${process.arch}`);

// ---- find the prebuilt binaries ----------------------------------------------------------------
// The package exports only its index, so resolve that and walk up to bins/. npm normally hoists it
// to the top level; otherwise it sits under node-llama-cpp's own node_modules.
function findBinsDir(): string {
  const require = createRequire(import.meta.url);
  const bases = [require];
  try { bases.push(createRequire(require.resolve('node-llama-cpp'))); } catch { /* not installed: the first base decides */ }
  for (const base of bases) {
    try {
      const index = base.resolve('@node-llama-cpp/linux-x64'); // .../dist/index.js
      const dir = path.join(path.dirname(index), '..', 'bins', 'linux-x64');
      if (existsSync(dir)) return dir;
    } catch { /* try the next base */ }
  }
  fail(`node-llama-cpp's prebuilt CPU binaries (@node-llama-cpp/linux-x64) are not installed; ${INSTALL_HINT}`);
}
const binsDir = findBinsDir();
// The library is versioned (libllama.v0.5.0.so), and libllama-common.so sits beside it.
const libName = readdirSync(binsDir).find((f) => /^libllama(\.v[\d.]+)?\.so$/.test(f));
if (!libName) fail(`no libllama*.so in ${binsDir}; ${INSTALL_HINT}`);
const ggmlName = readdirSync(binsDir).find((f) => /^libggml(\.v[\d.]+)?\.so$/.test(f));
let release = '?';
try {
  release = JSON.parse(readFileSync(path.join(binsDir, '_nlcBuildMetadata.json'), 'utf8')).buildOptions.llamaCpp.release;
} catch { /* the layout check below is what matters */ }
if (release !== MATCHED_RELEASE) {
  console.error(`llama-quantize: warning: binaries are llama.cpp ${release}, this script matched llama.h ${MATCHED_RELEASE}; the params layout check decides`);
}

// ---- bind -----------------------------------------------------------------------------------------
// libllama's RUNPATH is $ORIGIN, so its libggml dependencies load from the same folder.
const lib = koffi.load(path.join(binsDir, libName));
// Returned by value: a 64-byte struct comes back through a hidden pointer (SysV MEMORY class)
// whatever its members are, so an 8-aligned byte array of the same size is the same ABI.
const ParamsBytes = koffi.struct('llama_model_quantize_params_bytes', { b: [8, koffi.array('uint8_t', PARAMS_BYTES)] });
if (koffi.sizeof(ParamsBytes) !== PARAMS_BYTES) fail(`internal: opaque params type is ${koffi.sizeof(ParamsBytes)} bytes`);
const llamaVersion = lib.func('const char *llama_version(void)');
const llamaBackendInit = lib.func('void llama_backend_init(void)');
const defaultParams = lib.func('llama_model_quantize_default_params', ParamsBytes, []);
const quantize = lib.func('llama_model_quantize', 'uint32_t', ['const char *', 'const char *', 'void *']);

// llama_backend_init loads ggml's backends from the executable's folder (node's) unless some are
// registered already; register the CPU variants shipped beside libllama instead, as a llama.cpp
// install has them. Quantizing runs on llama.cpp's own threads, not a backend, so this is for a
// clean log rather than speed.
if (ggmlName) {
  const ggml = koffi.load(path.join(binsDir, ggmlName));
  ggml.func('void ggml_backend_load_all_from_path(const char *dir)')(binsDir);
}
llamaBackendInit();

// ---- params ---------------------------------------------------------------------------------------
const params = Buffer.from((defaultParams() as { b: Uint8Array }).b);
{
  // The defaults of v0.5.0 (src/llama-quant.cpp): nthread 0, ftype Q8_0 (7), both tensor-type
  // overrides GGML_TYPE_COUNT, only quantize_output_tensor true, null pointers, max_buf_size 8 GiB.
  // Reading them back at the offsets above confirms the layout before anything is written into it.
  const bools = [...params.subarray(16, 22)];
  const ptrsNull = [24, 32, 40, 48].every((o) => params.readBigUInt64LE(o) === 0n);
  const ok = params.readInt32LE(OFF_NTHREAD) === 0 && params.readInt32LE(OFF_FTYPE) === 7
    && params.readInt32LE(8) === params.readInt32LE(12) && params.readInt32LE(8) > 30
    && bools.join() === '0,1,0,0,0,0' && ptrsNull && params.readBigUInt64LE(56) === 8n << 30n;
  if (!ok) {
    fail(`llama_model_quantize_default_params() does not match llama.h ${MATCHED_RELEASE}'s layout `
      + `(bytes: ${params.toString('hex')}); this script needs node-llama-cpp 3.22.1's build (${INSTALL_HINT})`);
  }
}
params.writeInt32LE(threads, OFF_NTHREAD);
params.writeInt32LE(ftype, OFF_FTYPE);

// ---- run ------------------------------------------------------------------------------------------
mkdirSync(path.dirname(output), { recursive: true });
const inBytes = statSync(input).size;
const gb = (n: number) => `${(n / 1e9).toFixed(3)} GB`;
console.error(`llama-quantize: llama.cpp ${llamaVersion()} (${release}) from ${binsDir}`);
console.error(`llama-quantize: ${input} (${gb(inBytes)}) -> ${output} as ${typeName} (ftype ${ftype}), ${threads} threads`);
const t0 = performance.now();
// Synchronous on purpose: nothing else runs in this process, and llama.cpp spawns its own threads.
const rc = quantize(input, output, params) as number;
const secs = (performance.now() - t0) / 1000;
if (rc !== 0) fail(`llama_model_quantize returned ${rc} after ${secs.toFixed(1)} s; llama.cpp's log above says why`);
if (!existsSync(output)) fail(`llama_model_quantize returned 0 but ${output} does not exist`);
const outBytes = statSync(output).size;
console.log(`${output}: ${typeName}, ${outBytes} bytes (${gb(outBytes)}, ${(outBytes / inBytes * 100).toFixed(1)}% of the input), ${secs.toFixed(1)} s`);
