// Same-run CPU comparison with llama.cpp (node-llama-cpp's prebuilt CPU build) on the same model.
//
// 1. Converts the model directory to GGUF (tools/gguf/convert_qwen3.py; bf16 matrices, f32 norms).
// 2. Correctness first: greedy tokens from the model's sample_reference.json prompt for llama.cpp,
//    for `bin/llmts generate --json --temperature 0` and for transformers (the file itself); and
//    llama.cpp's tokenizer against ours on a few source files.
// 3. Throughput: prefill and decode tok/s for llmts (engine-direct, as bench/cpu-generate.ts) and
//    llama.cpp, same prompt ids, same thread count, greedy, end-of-sequence ignored; repeats
//    interleaved (the order rotates every repeat) after one warm-up each; medians, spread, ratios.
//
// The peer is not a dependency (CI never installs it). Install it without saving; its postinstall
// is not needed (npm 11 skips it): the prebuilt @node-llama-cpp/linux-x64 binary loads as it is.
//   npm install --no-save node-llama-cpp@3.22.1
//   pip install gguf numpy
//   node --import tsx bench/peers/llama-cpp.ts [--model models/demo] [--prompt-tokens 512]
//        [--decode-tokens 128] [--repeats 7] [--threads 2] [--gguf PATH] [--outtype bf16|f16|f32]
//        [--llama-kv f16|f32] [--kv-dtype f32|bf16|int8|fp8 (llmts's KV cache)] [--peers spin,spin1000,passive,uv4]
//        [--quiet-below 0.25] [--json out.json]
//
// Other work on a shared machine skews single runs badly (llama.cpp's 2-thread decode drops 10-100x
// when another process wants a core). Each run therefore records how many cores other processes
// kept busy meanwhile (CPU time the kernel counted, hypervisor steal included, minus this bench's
// own processes); runs under --quiet-below cores are "quiet", and the summary gives medians of the
// quiet runs and of all runs, and the ratio of the quiet medians.
//
// Each engine runs in its own process: llmts here, llama.cpp in forked workers. Both link the
// system libgomp, and one process would share one OpenMP runtime (and its wait policy) between
// them. --peers picks the llama.cpp workers (default spin,spin1000):
//   spin     UV_THREADPOOL_SIZE=1, libgomp's default wait policy (threads spin up to 300,000 times
//            before sleeping): llama.cpp's out-of-the-box threading. On a busy 2-core machine a
//            spinning barrier waits for a descheduled partner, and decode collapses.
//   spin1000 UV_THREADPOOL_SIZE=1, GOMP_SPINCOUNT=1000: the OpenMP setting llmts's loader uses for
//            itself (src/backends/cpu/native-lib.ts), so both sides share a threading runtime setup.
//   passive  UV_THREADPOOL_SIZE=1, OMP_WAIT_POLICY=passive (idle threads sleep at once).
//   uv4      node's default libuv pool of 4, default wait policy: what a plain node-llama-cpp user
//            gets. Its decodes hop between libuv threads and libgomp keeps one thread team per
//            calling thread, so idle teams spin on the cores the next decode needs (measured here,
//            machine quiet: 2-thread decode 3-8x slower than with one libuv thread).
// For each, "internal" is llama.cpp's llama_perf counters over the same runs (graph compute only:
// no JS, no sampling), an upper bound on what any caller could see.

import { parseArgs } from 'node:util';
import { readFileSync, writeFileSync, mkdtempSync } from 'node:fs';
import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import os from 'node:os';
import path from 'node:path';

import { loadNativeLib } from '../../src/backends/cpu/native-lib.ts';
import type { DType } from '../../src/contracts/backend.ts';
import type { CpuTensor } from '../../src/backends/cpu/cpu-tensor.ts';
import { decodeMatrices, decodeWeightBytes } from '../decode-weights.ts';

const originalEnv = { ...process.env };
const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    gguf: { type: 'string' },
    outtype: { type: 'string', default: 'bf16' },
    'prompt-tokens': { type: 'string', default: '512' },
    'decode-tokens': { type: 'string', default: '128' },
    repeats: { type: 'string', default: '7' },
    threads: { type: 'string', default: String(os.availableParallelism()) },
    'llama-kv': { type: 'string', default: 'f16' },
    'kv-dtype': { type: 'string', default: 'f32' },
    peers: { type: 'string', default: 'spin,spin1000' },
    'quiet-below': { type: 'string', default: '0.25' },
    json: { type: 'string' },
    worker: { type: 'boolean', default: false }, // internal: this process is a llama.cpp worker
  },
});
const batch = 512; // llmts token budget per step = llama.cpp n_batch (a 512-token prompt is one step on both)

/** One greedy run: the tokens and when the first and the last arrived (performance.now()). */
interface Run { out: number[]; t0: number; tFirst: number; t1: number }
/** llama.cpp's cumulative llama_perf counters. */
interface Perf { pMs: number; pN: number; eMs: number; eN: number }
type Req =
  | { cmd: 'init'; gguf: string; threads: number; kv: string }
  | { cmd: 'greedy'; promptIds: number[]; n: number }
  | { cmd: 'tokenize'; text: string }
  | { cmd: 'run'; promptIds: number[]; n: number }
  | { cmd: 'cpu' };

/** CPU seconds this process has used (all threads). */
const ownCpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };

// ================================= llama.cpp worker =============================================
if (values.worker) {
  const peerSpec = 'node-llama-cpp'; // resolved at run time so the type-check never needs the package
  const nlc: any = await import(peerSpec);
  let perfLines: string[] = [];
  const llama = await nlc.getLlama({
    gpu: false, build: 'never', logLevel: nlc.LlamaLogLevel.info,
    logger: (_level: unknown, message: string) => { if (message.includes('llama_perf_context_print')) perfLines.push(message); },
  });
  let model: any, ctx: any, seq: any;
  const perf = async (): Promise<Perf> => {
    perfLines = [];
    await ctx.printTimings();
    // the log lines arrive through node-llama-cpp's logger, a little after the call returns
    for (let i = 0; i < 200 && !/\beval time =[^\n]*runs/.test(perfLines.join('\n').replace(/prompt eval time/g, '')); i++) {
      await new Promise((r) => setTimeout(r, 5));
    }
    const txt = perfLines.join('\n');
    const num = (re: RegExp) => { const m = re.exec(txt); if (!m) throw new Error(`unparsed llama_perf output: ${txt}`); return [Number(m[1]), Number(m[2])]; };
    const [pMs, pN] = num(/prompt eval time =\s*([\d.]+) ms \/\s*(\d+) tokens/);
    const [eMs, eN] = num(/\beval time =\s*([\d.]+) ms \/\s*(\d+) runs/);
    return { pMs, pN, eMs, eN };
  };
  const greedy = async (promptIds: number[], n: number): Promise<Run> => {
    await seq.clearHistory();
    const out: number[] = [];
    const t0 = performance.now();
    let tFirst = 0;
    // yieldEogToken: keep going past end-of-sequence, as llmts's ignoreEos
    for await (const t of seq.evaluate(promptIds, { temperature: 0, yieldEogToken: true })) {
      if (out.length === 0) tFirst = performance.now();
      out.push(t);
      if (out.length >= n) break;
    }
    return { out, t0, tFirst, t1: performance.now() };
  };
  process.on('message', async (req: Req) => {
    try {
      if (req.cmd === 'init') {
        model = await llama.loadModel({ modelPath: req.gguf, gpuLayers: 0 });
        ctx = await model.createContext({
          contextSize: 2048, batchSize: batch, threads: req.threads, performanceTracking: true,
          experimentalKvCacheKeyType: req.kv, experimentalKvCacheValueType: req.kv,
        });
        seq = ctx.getSequence();
        process.send!({ ok: {
          nodeLlamaCpp: await nlc.getModuleVersion(), llamaCppRelease: llama.llamaCppRelease?.release, build: llama.buildType,
          gpu: llama.gpu, threads: ctx.currentThreads, flashAttention: ctx.flashAttention, cpuFeatures: String(llama.systemInfo ?? '').trim(),
          uvThreadpoolSize: process.env.UV_THREADPOOL_SIZE ?? 'default (4)', ompWaitPolicy: process.env.OMP_WAIT_POLICY ?? 'libgomp default',
          gompSpinCount: process.env.GOMP_SPINCOUNT ?? 'libgomp default',
        } });
      } else if (req.cmd === 'greedy') {
        process.send!({ ok: (await greedy(req.promptIds, req.n)).out });
      } else if (req.cmd === 'tokenize') {
        process.send!({ ok: [...model.tokenize(req.text, true)] }); // special tokens parsed, as transformers does
      } else if (req.cmd === 'cpu') {
        process.send!({ ok: ownCpu() });
      } else if (req.cmd === 'run') {
        const before = await perf();
        const run = await greedy(req.promptIds, req.n);
        const after = await perf();
        process.send!({ ok: { run, internal: { pMs: after.pMs - before.pMs, pN: after.pN - before.pN, eMs: after.eMs - before.eMs, eN: after.eN - before.eN } } });
      }
    } catch (err) {
      process.send!({ err: String((err as Error)?.stack ?? err) });
    }
  });
  process.on('disconnect', () => process.exit(0));
} else {
  await main();
}

// ================================= driver (llmts side) ==========================================
async function main() {
  const modelDir = values.model!;
  const promptTokens = Number(values['prompt-tokens']);
  const decodeTokens = Number(values['decode-tokens']);
  const repeats = Number(values.repeats);
  const threads = Number(values.threads);
  const kvType = values['llama-kv']!.toUpperCase();

  try {
    import.meta.resolve('node-llama-cpp');
  } catch {
    console.error('llama-cpp bench: node-llama-cpp is not installed; run `npm install --no-save node-llama-cpp@3.22.1`');
    process.exit(2);
  }

  let gguf = values.gguf;
  if (!gguf) {
    gguf = path.join(mkdtempSync(path.join(os.tmpdir(), 'llmts-peer-')), `${path.basename(modelDir)}-${values.outtype}.gguf`);
    execFileSync('python3', ['tools/gguf/convert_qwen3.py', modelDir, gguf, '--outtype', values.outtype!], { stdio: ['ignore', 'ignore', 'inherit'] });
  }

  // ---- llama.cpp workers ----
  class Worker {
    private proc: ChildProcess;
    private pending: { resolve: (v: any) => void; reject: (e: Error) => void } | null = null;
    info: any;
    constructor(readonly name: string, uvPool: string | undefined, ompWait: string | undefined, spinCount: string | undefined) {
      const env = { ...originalEnv };
      if (uvPool === undefined) delete env.UV_THREADPOOL_SIZE; else env.UV_THREADPOOL_SIZE = uvPool;
      if (ompWait === undefined) delete env.OMP_WAIT_POLICY; else env.OMP_WAIT_POLICY = ompWait;
      if (spinCount === undefined) delete env.GOMP_SPINCOUNT; else env.GOMP_SPINCOUNT = spinCount;
      this.proc = fork(fileURLToPath(import.meta.url), ['--worker'], { env, execArgv: ['--import', 'tsx'], stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
      this.proc.on('message', (m: any) => { const p = this.pending!; this.pending = null; if ('err' in m) p.reject(new Error(`${name}: ${m.err}`)); else p.resolve(m.ok); });
      this.proc.on('exit', (code) => { if (this.pending) this.pending.reject(new Error(`${name} worker exited (${code})`)); });
    }
    call<T>(req: Req): Promise<T> {
      return new Promise((resolve, reject) => { this.pending = { resolve, reject }; this.proc.send(req); });
    }
    close() { this.proc.disconnect(); }
  }
  // [UV_THREADPOOL_SIZE, OMP_WAIT_POLICY, GOMP_SPINCOUNT]; undefined: unset
  const kinds: Record<string, [string | undefined, string | undefined, string | undefined]> = {
    spin: ['1', undefined, undefined], spin1000: ['1', undefined, '1000'], passive: ['1', 'passive', undefined], uv4: [undefined, undefined, undefined],
  };
  const peerNames = values.peers!.split(',');
  for (const n of peerNames) if (!(n in kinds)) { console.error(`--peers: unknown ${n} (${Object.keys(kinds).join(', ')})`); process.exit(2); }
  const peers = peerNames.map((n) => new Worker(`llama.cpp ${n}`, ...kinds[n]));
  for (const p of peers) p.info = await p.call({ cmd: 'init', gguf, threads, kv: kvType });

  // ---- llmts (OpenMP: libgomp reads OMP_NUM_THREADS when the library loads, below) ----
  if (process.env.OMP_NUM_THREADS && process.env.OMP_NUM_THREADS !== String(threads)) {
    console.error(`note: OMP_NUM_THREADS=${process.env.OMP_NUM_THREADS} replaced by --threads ${threads}`);
  }
  process.env.OMP_NUM_THREADS = String(threads);
  const { createCpuBackend } = await import('../../src/backends/cpu/cpu-backend.ts');
  const { loadModel } = await import('../../src/execution/load-model.ts');
  const { Engine } = await import('../../src/execution/engine.ts');
  const backend = await createCpuBackend();
  // the same GGUF file as llama.cpp (its Q8_0 / Q4_0 / Q4_K / Q6_K matrices kept quantized), and a
  // context of what the runs need: the model's whole context would size a KV cache of gigabytes
  const maxModelLen = Math.max(4096, promptTokens + decodeTokens + 64);
  const m = await loadModel(backend, gguf, { maxModelLen });
  // every repeat prefills (the same prompt would hit the prefix cache)
  const engine = new Engine(m.model, m, { maxBatch: 1, tokenBudget: batch, prefixCache: { promptCacheBytes: 0 },
    kvDtype: values['kv-dtype'] as DType });
  const runOurs = async (promptIds: number[], n: number): Promise<Run> => {
    const out: number[] = [];
    const t0 = performance.now();
    let tFirst = 0;
    for await (const e of engine.generate({ promptIds, maxTokens: n, sampling: { temperature: 0 }, ignoreEos: true })) {
      if (e.type !== 'token') continue;
      if (out.length === 0) tFirst = performance.now();
      out.push(e.tokenId);
    }
    return { out, t0, tFirst, t1: performance.now() };
  };
  // bytes a decode step reads (as bench/cpu-quant.ts): every matrix once as the backend holds it
  // (bf16 panels or quantized blocks), one embedding row aside
  const matrices = decodeMatrices(m);
  const weightBytes = decodeWeightBytes(m);
  // how the backend holds the matrices: 'rows' / 'p16' (bf16 or f32 values), or a quantized panel
  // layout ('q8_0', 'q4_0', 'q4_k', 'q6_k': the file's blocks, native/quant_pack.c)
  const layoutOf = (t: CpuTensor) => (t.layout === 'rows' || t.layout === 'p16' ? t.dtype : t.layout.toUpperCase());
  const weightKinds = [...new Set([...matrices].map(layoutOf))];
  const weightDtypes = weightKinds.join('/');
  const quantized = weightKinds.filter((k) => /^Q/.test(k));
  // ISA_AVX512_BF16 (native/llm.h): prefill matmuls of bf16 weights round x to bf16 (LLMTS_CPU_BF16_DOT)
  const bf16Dot = weightDtypes.includes('bf16') && loadNativeLib().setIsa(-1) === 3;

  // ---- correctness ----
  const prefixLen = (a: number[], b: number[]) => { let k = 0; while (k < a.length && k < b.length && a[k] === b[k]) k++; return k; };
  const refPath = path.join(modelDir, 'sample_reference.json');
  const ref = JSON.parse(readFileSync(refPath, 'utf8')) as { prompt_text: string; prompt_token_ids: number[]; generated_token_ids: number[] };
  const nRef = ref.generated_token_ids.length;
  const cli = JSON.parse(execFileSync('bin/llmts', ['generate', '--model', gguf, '--prompt', ref.prompt_text,
    '--max-tokens', String(nRef), '--json', '--temperature', '0', '--max-model-len', String(maxModelLen)], { encoding: 'utf8', env: { ...process.env } })) as { prompt_token_ids: number[]; token_ids: number[] };
  const peerGreedy = await peers[0].call<number[]>({ cmd: 'greedy', promptIds: ref.prompt_token_ids, n: nRef });
  const peerPromptIds = await peers[0].call<number[]>({ cmd: 'tokenize', text: ref.prompt_text });
  const same = (a: number[], b: number[]) => a.length === b.length && prefixLen(a, b) === a.length;
  const tokFiles = ['tools/gguf/convert_qwen3.py', 'src/execution/engine.ts', 'native/matmul.c', 'README.md'];
  const tokenizer = [];
  for (const f of tokFiles) {
    const text = readFileSync(f, 'utf8');
    const ours = m.encode(text), theirs = await peers[0].call<number[]>({ cmd: 'tokenize', text });
    tokenizer.push({ file: f, llmts: ours.length, llamaCpp: theirs.length, identical: same(ours, theirs) });
  }
  const correctness = {
    reference: refPath, steps: nRef,
    promptIdsEqualReference: { llamaCpp: same(peerPromptIds, ref.prompt_token_ids), llmts: same(cli.prompt_token_ids, ref.prompt_token_ids) },
    matchingPrefix: {
      llamaCppVsTransformers: prefixLen(peerGreedy, ref.generated_token_ids),
      llmtsVsTransformers: prefixLen(cli.token_ids, ref.generated_token_ids),
      llamaCppVsLlmts: prefixLen(peerGreedy, cli.token_ids),
    },
    tokenizer,
  };

  // ---- throughput ----
  const prompt = Array.from({ length: promptTokens }, (_, k) => (k * 7919 + 13) % Math.min(m.config.vocabSize, 5000));
  const quietBelow = Number(values['quiet-below']);
  /** tok/s of one run, and the cores other processes kept busy during it */
  type Sample = { prefill: number; decode: number; foreign: number };
  const rate = (r: Run, foreign: number): Sample => {
    if (r.out.length !== decodeTokens) throw new Error(`generated ${r.out.length} tokens, expected ${decodeTokens}`);
    return { prefill: promptTokens / ((r.tFirst - r.t0) / 1000), decode: (r.out.length - 1) / ((r.t1 - r.tFirst) / 1000), foreign };
  };
  /** CPU seconds the kernel counted as busy or stolen by the hypervisor, all cores (/proc/stat, USER_HZ = 100) */
  const busyCpu = () => {
    const [user, nice, system, , , irq, softirq, steal] = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    return (user + nice + system + irq + softirq + (steal || 0)) / 100;
  };
  /** CPU seconds of this bench: this process and every worker */
  const benchCpu = async () => ownCpu() + (await Promise.all(peers.map((p) => p.call<number>({ cmd: 'cpu' })))).reduce((a, b) => a + b, 0);
  /** runs fn, returning its result and the cores other processes used meanwhile */
  const measured = async <T>(fn: () => Promise<T>): Promise<[T, number]> => {
    const b0 = busyCpu(), c0 = await benchCpu(), t0 = performance.now();
    const out = await fn();
    const t1 = performance.now(), b1 = busyCpu(), c1 = await benchCpu();
    return [out, Math.max(0, (b1 - b0) - (c1 - c0)) / ((t1 - t0) / 1000)];
  };
  const sides = ['llmts', ...peers.flatMap((p) => [p.name, `${p.name} internal`])];
  const samples: Record<string, Sample[]> = Object.fromEntries(sides.map((s) => [s, []]));
  const contenders: (() => Promise<void>)[] = [];
  let warm = false;
  contenders.push(async () => {
    const [run, foreign] = await measured(() => runOurs(prompt, decodeTokens));
    if (warm) samples.llmts.push(rate(run, foreign));
  });
  for (const p of peers) {
    contenders.push(async () => {
      const [{ run, internal }, foreign] = await measured(() => p.call<{ run: Run; internal: Perf }>({ cmd: 'run', promptIds: prompt, n: decodeTokens }));
      if (warm) {
        samples[p.name].push(rate(run, foreign));
        samples[`${p.name} internal`].push({ prefill: internal.pN / (internal.pMs / 1000), decode: internal.eN / (internal.eMs / 1000), foreign });
      }
    });
  }
  const { measureCopyBandwidth } = await import('../../src/execution/fit/machines.ts');
  // the machine's copy bandwidth (bytes read + written, one thread: the fit planner's measure),
  // before and after the runs: the ceiling the decode GB/s are read against
  const copy0 = measureCopyBandwidth();
  const load0 = os.loadavg();
  for (let r = 0; r <= repeats; r++) {
    warm = r > 0;
    // rotate who goes first so a slow spell of the machine does not always land on one side
    for (let i = 0; i < contenders.length; i++) await contenders[(i + r) % contenders.length]();
  }
  const load1 = os.loadavg();
  const copyGBps = Math.max(copy0, measureCopyBandwidth());

  const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
  const median = (xs: number[]) => { const s = sorted(xs); const h = s.length >> 1; return xs.length === 0 ? NaN : s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
  const ks = ['prefill', 'decode'] as const;
  type K = (typeof ks)[number];
  const summary = (ss: Sample[], k: K) => {
    const all = ss.map((x) => x[k]), quiet = ss.filter((x) => x.foreign < quietBelow).map((x) => x[k]);
    return { median: median(all), min: sorted(all)[0], max: sorted(all).at(-1)!, quietMedian: median(quiet), quietRuns: quiet.length,
      runs: ss.map((x) => ({ tokPerS: +x[k].toFixed(1), otherCores: +x.foreign.toFixed(2) })) };
  };
  const tokPerS = Object.fromEntries(sides.map((s) => [s, Object.fromEntries(ks.map((k) => [k, summary(samples[s], k)]))])) as
    Record<string, Record<K, ReturnType<typeof summary>>>;
  // llmts / peer: ratio of the quiet medians and of all medians, and the range of the per-repeat ratios
  const ratio = (peer: string, k: K) => {
    const per = samples.llmts.map((s, i) => s[k] / samples[peer][i][k]);
    return { quietMedians: tokPerS.llmts[k].quietMedian / tokPerS[peer][k].quietMedian, allMedians: tokPerS.llmts[k].median / tokPerS[peer][k].median,
      perRepeatMin: Math.min(...per), perRepeatMax: Math.max(...per) };
  };
  const ratios = Object.fromEntries(sides.slice(1).map((s) => [s, Object.fromEntries(ks.map((k) => [k, ratio(s, k)]))]));
  const otherCores = sorted(Object.values(samples).flat().map((x) => x.foreign));

  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    if (execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' }).trim()) commit += ' + uncommitted changes';
  } catch {}
  const info = peers[0].info;
  const peerPrecision = quantized.length > 0
    ? `the file's ${weightDtypes} matrices, activations quantized per block (Q8_0 / Q8_K) for integer dot products, f32 norms and accumulation, ${kvType} KV cache`
    : `${weightDtypes} matrices (${weightDtypes === 'f32' ? 'f32 activations' : `activations rounded to ${weightDtypes} for the dot products`}), ` +
      `f32 norms and accumulation, ${kvType} KV cache`;
  const ourPrecision = quantized.length > 0
    ? `${weightDtypes} matrices (${quantized.join('/')} kept as the file's blocks), activations quantized per block of 32 to int8 ` +
      `for integer dot products (native/TUNING.md), f32 accumulation, ${values['kv-dtype']} KV cache`
    : bf16Dot
      ? `${weightDtypes} weights; prefill matmuls round activations to bf16 for the CPU's AVX512-BF16 dot products, decode ` +
        `widens the weights to f32 in registers (f32 activations); f32 accumulation, ${values['kv-dtype']} KV cache`
      : `${weightDtypes} weights widened to f32 in registers, f32 activations and accumulation, ${values['kv-dtype']} KV cache`;
  const openmpOf = (e: { OMP_WAIT_POLICY?: string; GOMP_SPINCOUNT?: string }) =>
    `OMP_WAIT_POLICY ${e.OMP_WAIT_POLICY ?? 'unset'}, GOMP_SPINCOUNT ${e.GOMP_SPINCOUNT ?? 'unset'}`;
  const result = {
    machine: `${os.cpus()[0]?.model ?? 'unknown cpu'}, ${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB, ${os.type()} ${os.release()}`,
    loadAvg: { before: load0, after: load1 }, quietBelowCores: quietBelow, copyBandwidthGBps: copyGBps,
    commit, node: process.version, model: modelDir, gguf, promptTokens, decodeTokens, repeats, batch, weightBytesPerDecodeStep: weightBytes,
    llmts: { threads, openmp: `OMP_NUM_THREADS ${threads}, ${openmpOf(process.env)}`, precision: ourPrecision },
    llamaCpp: { ...info, uvThreadpoolSize: undefined, ompWaitPolicy: undefined, gompSpinCount: undefined, precision: peerPrecision,
      workers: peers.map((p) => ({ name: p.name, uvThreadpoolSize: p.info.uvThreadpoolSize, ompWaitPolicy: p.info.ompWaitPolicy, gompSpinCount: p.info.gompSpinCount })) },
    correctness, tokPerS, ratioLlmtsOver: ratios,
  };

  const f = (x: number) => x.toFixed(1), g = (x: number) => x.toFixed(2);
  console.log(`machine   ${result.machine}`);
  console.log(`load avg  1/5/15 min ${load0.map(g).join(' ')} before, ${load1.map(g).join(' ')} after (shared machine: other work may run meanwhile)`);
  console.log(`commit    ${commit}   node ${process.version}   node-llama-cpp ${info.nodeLlamaCpp} (llama.cpp ${info.llamaCppRelease}, ${info.build}, gpu=${info.gpu})`);
  console.log(`model     ${modelDir} -> ${gguf}`);
  console.log(`threads   llmts ${threads} (${result.llmts.openmp})   llama.cpp ${info.threads} (flash attention ${info.flashAttention}; ` +
    peers.map((p) => `${p.name}: UV_THREADPOOL_SIZE ${p.info.uvThreadpoolSize}, OMP_WAIT_POLICY ${p.info.ompWaitPolicy}, GOMP_SPINCOUNT ${p.info.gompSpinCount}`).join('; ') + ')');
  console.log(`llmts     ${result.llmts.precision}`);
  console.log(`llama.cpp ${peerPrecision}; ${info.cpuFeatures}`);
  const cp = correctness.matchingPrefix;
  console.log(`correctness, ${nRef} greedy tokens of ${refPath}: matching prefix llama.cpp/transformers ${cp.llamaCppVsTransformers}, ` +
    `llmts/transformers ${cp.llmtsVsTransformers}, llama.cpp/llmts ${cp.llamaCppVsLlmts}; prompt ids equal to the reference's: ` +
    `llama.cpp ${correctness.promptIdsEqualReference.llamaCpp}, llmts ${correctness.promptIdsEqualReference.llmts}`);
  console.log(`tokenizer ${tokenizer.map((t) => `${t.file} ${t.identical ? 'identical' : `DIFFERENT (${t.llmts} vs ${t.llamaCpp})`}`).join('; ')}`);
  console.log(`other processes during the runs: median ${g(median(otherCores))} cores, max ${g(otherCores.at(-1)!)}; ` +
    `a run is quiet below ${quietBelow} cores`);
  console.log(`\n${promptTokens}-token prompt, ${decodeTokens} tokens, greedy, ${repeats} interleaved repeats; tok/s: median of quiet runs ` +
    `(their number), median of all [min .. max]; decode GB/s = quiet median x ${(weightBytes / 2 ** 20).toFixed(1)} MiB of weights per step, ` +
    `and its share of the copy bandwidth (${g(copyGBps)} GB/s, one thread's Buffer.copy, best of before and after)`);
  for (const k of ks) {
    for (const s of sides) {
      const st = tokPerS[s][k];
      const bw = k === 'decode' ? `  ${g(st.quietMedian * weightBytes / 1e9)} GB/s (${g(st.quietMedian * weightBytes / 1e9 / copyGBps)})` : '';
      const rt = s === 'llmts' ? '' : `  llmts/this ${g(ratios[s][k].quietMedians)} quiet, ${g(ratios[s][k].allMedians)} all`;
      console.log(`${k.padEnd(8)} ${s.padEnd(27)} ${f(st.quietMedian).padStart(8)} (${st.quietRuns})  ${f(st.median).padStart(8)} [${f(st.min)} .. ${f(st.max)}]${bw}${rt}`);
    }
  }
  if (values.json) writeFileSync(values.json, JSON.stringify(result, null, 2));

  for (const p of peers) p.close();
  await engine.close();
  await backend.close();
}
