// `llmts fit`: does a model fit a machine at a context length, what is the largest context that
// does, and how fast will decode be (README.md, `llmts fit`). Reads config.json and safetensors
// headers only; no weight data, no tokenizer parsing.

import { parseFlags, stringFlag, requiredString, numberFlag, parseSize, kvDtypeFlag, quantizationFlag, type Options } from './args.ts';
import { UsageError } from './errors.ts';
import { QUANTIZATION_BACKEND } from '../artifacts/online-quant.ts';
import {
  FitPlanner, FitError, DEFAULT_CHUNK, GPU_NAMES, GPUS, MachineError, gpuMachine, customMachine, cpuMachine,
  DEFAULT_GPU_MEMORY_UTILIZATION, planDrafter, type DrafterPlan, type FitPlan, type KvDtype, type Machine,
} from '../execution/fit/index.ts';
import { ArtifactError } from '../artifacts/errors.ts';

const OPTIONS: Options = {
  model: { type: 'string' },
  ctx: { type: 'string' },
  json: { type: 'boolean' },
  gpu: { type: 'string' },
  memory: { type: 'string' },
  bandwidth: { type: 'string' },
  device: { type: 'string' },
  skus: { type: 'boolean' },
  'kv-dtype': { type: 'string' },
  quantization: { type: 'string' },
  batch: { type: 'string' },
  chunk: { type: 'string' },
  'gpu-memory-utilization': { type: 'string' },
  'draft-model': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

const HELP = `usage: llmts fit --model DIR --ctx N [options]

Memory plan and decode speed estimate, from config.json and safetensors headers only.

  --model DIR                 Hugging Face model directory
  --ctx N                     tokens per sequence (prompt + output)
  --gpu NAME                  plan for a GPU from the table (see --skus); e.g. h200, h100, rtx-4090
  --memory SIZE               plan for a custom device with this much memory (e.g. 80G) ...
  --bandwidth GBps            ... and this memory bandwidth (GB/s). With the CPU: skips measuring it
  --device cpu|cuda           what --memory describes (default cuda); without --gpu/--memory,
                              cpu (the default) plans for this machine's CPU
  --skus                      plan for every GPU in the table and this CPU
  --quantization q8_0|q4_0|fp8  the matrices quantized as they load (serve's flag; q8_0 / q4_0
                              CPU, fp8 CUDA): planned at those blocks' bytes
  --kv-dtype DTYPE            KV cache dtype: f32, bf16, f16, or int8 / fp8 (CPU only) (default:
                              f32 on the CPU backend, bf16 on CUDA)
  --batch N                   sequences resident together (default 1)
  --chunk N                   tokens per engine step (default ${DEFAULT_CHUNK}, the engine's)
  --gpu-memory-utilization F  fraction of GPU memory the engine may use (default ${DEFAULT_GPU_MEMORY_UTILIZATION})
  --draft-model DIR           plan a speculative drafter beside it (a draft model or an EAGLE-3
                              head, as serve's --draft-model): its weights, KV and draft logits
  --json                      print one JSON object

GPUs: ${GPU_NAMES.join(', ')}`;

export async function runFit(argv: string[]): Promise<void> {
  const v = parseFlags(argv, OPTIONS);
  if (v.help) {
    process.stdout.write(`${HELP}\n`);
    return;
  }
  const dir = requiredString(v, 'model');
  const ctx = numberFlag(v, 'ctx', { integer: true, min: 1 });
  if (ctx === undefined) throw new UsageError('--ctx is required (tokens per sequence, prompt + output)');
  const batch = numberFlag(v, 'batch', { integer: true, min: 1 });
  const chunk = numberFlag(v, 'chunk', { integer: true, min: 1 });
  const utilization = numberFlag(v, 'gpu-memory-utilization');
  if (utilization !== undefined && !(utilization > 0 && utilization <= 1))
    throw new UsageError(`--gpu-memory-utilization must be in (0, 1], got ${utilization}`);
  const kvDtype: KvDtype | undefined = kvDtypeFlag(v);
  const machines = resolveMachines(v);
  const quantization = quantizationFlag(v);
  if (quantization && machines.some((m) => m.kind !== (QUANTIZATION_BACKEND[quantization] === 'cpu' ? 'cpu' : 'gpu'))) {
    throw new UsageError(QUANTIZATION_BACKEND[quantization] === 'cpu'
      ? `--quantization ${quantization} is for the CPU backend: plan it without a GPU`
      : `--quantization ${quantization} is for the CUDA backend: plan it with --gpu`);
  }

  let planner: FitPlanner;
  try {
    planner = await FitPlanner.open(dir, { quantization });
  } catch (err) {
    if (err instanceof FitError) throw new UsageError(err.message);
    throw err;
  }
  const draftDir = stringFlag(v, 'draft-model');
  const drafters = new Map<'cpu' | 'cuda', DrafterPlan>();
  const drafterFor = async (kind: 'cpu' | 'cuda'): Promise<DrafterPlan | undefined> => {
    if (draftDir === undefined) return undefined;
    let d = drafters.get(kind);
    if (!d) {
      try {
        d = await planDrafter(draftDir, planner, kind);
      } catch (err) {
        if (err instanceof FitError || err instanceof ArtifactError) throw new UsageError(`--draft-model ${draftDir}: ${err.message}`);
        throw err;
      }
      drafters.set(kind, d);
    }
    return d;
  };
  const plans: FitPlan[] = [];
  for (const m of machines) {
    const speculation = await drafterFor(m.kind === 'cpu' ? 'cpu' : 'cuda');
    try {
      plans.push(await planner.plan(m, { ctx, batch, chunk, kvDtype, utilization, speculation }));
    } catch (err) {
      if (err instanceof FitError) throw new UsageError(err.message);
      throw err;
    }
  }
  if (v.json) {
    const out = v.skus ? { model: plans[0]!.model, ctx, skus: plans } : plans[0];
    process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
    return;
  }
  process.stdout.write(v.skus ? skuTable(plans) : planText(plans[0]!));
}

function resolveMachines(v: ReturnType<typeof parseFlags>): Machine[] {
  const gpu = stringFlag(v, 'gpu');
  const memRaw = stringFlag(v, 'memory');
  const bwRaw = stringFlag(v, 'bandwidth');
  const device = stringFlag(v, 'device');
  if (device !== undefined && device !== 'cpu' && device !== 'cuda') throw new UsageError(`--device must be cpu or cuda, got "${device}"`);
  const memory = memRaw === undefined ? undefined : parseSize(memRaw, 'memory');
  if (memory !== undefined && memory <= 0) throw new UsageError(`--memory must be more than 0 bytes, got "${memRaw}"`);
  const bandwidth = numberFlag(v, 'bandwidth');
  if (bandwidth !== undefined && !(bandwidth > 0)) throw new UsageError(`--bandwidth must be a positive number of GB/s, got "${bwRaw}"`);
  if (v.skus) {
    if (gpu !== undefined || memory !== undefined) throw new UsageError('--skus plans for every machine in the table; drop --gpu / --memory');
    return [...GPUS.map((g) => gpuMachine(g.name)), cpuMachine(bandwidth)];
  }
  if (gpu !== undefined) {
    if (memory !== undefined || bandwidth !== undefined) throw new UsageError('give either --gpu NAME or --memory SIZE --bandwidth GBps, not both');
    if (device === 'cpu') throw new UsageError('--gpu plans for a GPU; drop --device cpu');
    try {
      return [gpuMachine(gpu)];
    } catch (err) {
      if (err instanceof MachineError) throw new UsageError(`--gpu: ${err.message}`);
      throw err;
    }
  }
  const kind = memory !== undefined ? (device === 'cpu' ? 'cpu' : 'gpu') : (device === 'cuda' ? 'gpu' : 'cpu');
  if (kind === 'gpu') {
    if (memory === undefined || bandwidth === undefined)
      throw new UsageError(`a GPU needs --gpu NAME (accepted: ${GPU_NAMES.join(', ')}) or both --memory SIZE and --bandwidth GBps`);
    return [customMachine('gpu', memory, bandwidth)];
  }
  const cpu = cpuMachine(bandwidth);
  return [memory === undefined ? cpu : { ...customMachine('cpu', memory, cpu.bandwidthGBps), description: `custom CPU (${cpu.description.split(',')[0]} bandwidth)`, source: `--memory; ${cpu.source}` }];
}

// ---- text output -------------------------------------------------------------------------------

export function formatBytes(b: number): string {
  const a = Math.abs(b);
  if (a >= 2 ** 30) return `${(b / 2 ** 30).toFixed(2)} GiB`;
  if (a >= 2 ** 20) return `${(b / 2 ** 20).toFixed(1)} MiB`;
  if (a >= 2 ** 10) return `${(b / 2 ** 10).toFixed(1)} KiB`;
  return `${b} B`;
}

function formatCount(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}K`;
  return String(n);
}

const tps = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));

function planText(p: FitPlan): string {
  const w = p.weights;
  const moe = p.model.moe ? `, MoE ${p.model.moe.topK} of ${p.model.moe.experts} experts` : '';
  const dtypes = Object.entries(w.checkpointBytesByDtype).map(([d, b]) => `${d} ${formatBytes(b)}`).join(', ');
  const kvKinds = p.kv.map((g) => g.attention === 'full'
    ? `${g.layers} full layers ${formatBytes(g.bytesPerToken)}/token`
    : `${g.layers} sliding layers (window ${g.window}) ${formatBytes(g.bytesPerToken)}/token up to ${g.tokensPerSequence} tokens`).join('; ');
  const row = (label: string, value: string, note = '') => `  ${label.padEnd(13)}${value.padStart(12)}   ${note}`.trimEnd();
  const lines = [
    `${p.model.dir}: ${p.model.modelType}, ${p.model.layers} layers, context ${p.model.contextLength}${moe}`,
    `machine: ${p.machine.description} (${formatBytes(p.machine.memoryBytes)}, ${p.machine.bandwidthGBps.toFixed(1)} GB/s; ${p.machine.source})`,
    `plan: ctx ${p.ctx} x batch ${p.batch}, ${p.chunk} tokens per step, KV ${p.kvDtype}, activations ${p.activationDtype}`,
    '',
    row('weights', formatBytes(p.weightsBytes), `${formatCount(w.params)} params; checkpoint ${dtypes}${w.unusedTensors.length ? `; ${w.unusedTensors.length} unused tensors (${formatBytes(w.unusedBytes)}) not loaded` : ''}`),
    row('KV cache', formatBytes(p.kvBytes), `${formatBytes(p.kvBytesPerToken)}/token: ${kvKinds}`),
    row('transient', formatBytes(p.transientBytes), `steps of up to ${p.transient.stepTokens} tokens, ${p.transient.sampledRows} sampled row(s); the largest alone ${formatBytes(p.transient.largestStepBytes)}` +
      `${p.transient.graphBytes ? `; decode graphs ${formatBytes(p.transient.graphBytes)}` : ''}`),
    ...(p.speculation ? [row('drafter', formatBytes(p.speculation.drafterBytes + p.speculation.drafterKvBytes),
      `${drafterName(p)} weights ${formatBytes(p.speculation.drafterBytes)}, KV ${formatBytes(p.speculation.drafterKvBytesPerToken)}/token ` +
      `${formatBytes(p.speculation.drafterKvBytes)}; draft logits ${formatBytes(p.speculation.logitBytes)} in transient`)] : []),
    row('reserve', formatBytes(p.reserveBytes), p.reserve.map((r) => `${r.name} ${formatBytes(r.bytes)}${r.measured ? '' : ' (not yet measured)'}`).join('; ')),
    row('total', formatBytes(p.totalBytes)),
    row('usable', formatBytes(p.usableBytes), p.machine.kind === 'gpu' ? `${formatBytes(p.machine.memoryBytes)} x utilization` : 'RAM minus the OS reserve'),
    row('fits', p.fits ? 'yes' : 'NO', p.fits ? `headroom ${formatBytes(p.headroomBytes)}` : `short by ${formatBytes(-p.headroomBytes)}`),
    row('max context', String(p.maxSafeContext), p.maxSafeContext === 0
      ? 'nothing fits: the weights, reserve and one step exceed usable memory'
      : p.maxSafeContextLimitedBy === 'model' ? "the model's own context length" : `largest ctx that fits (batch ${p.batch})`),
    row('decode', `${tps(p.predictedDecodeTps)} tok/s`, `${formatBytes(p.decode.bytesPerStep)} read per step at ${p.decode.bandwidthGBps.toFixed(1)} GB/s x ${p.decode.efficiency}` +
      `${p.decode.overheadMs ? ` + ${p.decode.overheadMs.toFixed(2)} ms` : ''}${p.batch > 1 ? `; ${tps(p.decode.perSequenceTps)} tok/s per sequence` : ''}`),
  ];
  if (p.unmeasured.length) lines.push('', `not yet measured (provisional values): ${p.unmeasured.join(', ')}`);
  return `${lines.join('\n')}\n`;
}

function drafterName(p: FitPlan): string {
  const d = p.speculation?.drafter;
  return d ? `${d.kind} (${d.layers} layer${d.layers === 1 ? '' : 's'}):` : 'drafter:';
}

function skuTable(plans: FitPlan[]): string {
  const p0 = plans[0]!;
  const head = ['machine', 'memory', 'GB/s', 'usable', 'total', 'fits', 'max ctx', 'decode tok/s'];
  const rows = plans.map((p) => [
    p.machine.name, formatBytes(p.machine.memoryBytes), p.machine.bandwidthGBps.toFixed(0), formatBytes(p.usableBytes),
    formatBytes(p.totalBytes), p.fits ? 'yes' : 'no', String(p.maxSafeContext), p.fits ? tps(p.predictedDecodeTps) : '-',
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const fmt = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  const unmeasured = [...new Set(plans.flatMap((p) => p.unmeasured))];
  return [
    `${p0.model.dir}: ${p0.model.modelType}, ${p0.model.layers} layers, context ${p0.model.contextLength}; ctx ${p0.ctx} x batch ${p0.batch}`,
    '',
    fmt(head),
    ...rows.map(fmt),
    ...(unmeasured.length ? ['', `not yet measured (provisional values): ${unmeasured.join(', ')}`] : []),
    '',
  ].join('\n');
}
