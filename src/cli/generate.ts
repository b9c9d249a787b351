// `llmts generate`: one completion from the command line (README.md, `llmts generate`). Streams
// text to stdout, or prints exactly one JSON object with --json.

import { performance } from 'node:perf_hooks';
import { parseFlags, stringFlag, requiredString, numberFlag, listFlag, kvDtypeFlag, quantizationFlag, type Options } from './args.ts';
import { UsageError } from './errors.ts';
import { draftModelFlag, SPECULATIVE_OPTIONS, speculationJson, speculativeFlags, speculativeHelp } from './speculative-flags.ts';
import type { SpeculationCounts } from '../execution/methods/method.ts';
import { parseDevice } from '../execution/devices.ts';
import { load } from '../api/index.ts';
import type { TokenLogprob } from '../execution/sequence.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';

const OPTIONS: Options = {
  model: { type: 'string' },
  prompt: { type: 'string' },
  messages: { type: 'string' },
  'max-tokens': { type: 'string' },
  temperature: { type: 'string' },
  'top-p': { type: 'string' },
  'top-k': { type: 'string' },
  'min-p': { type: 'string' },
  'repetition-penalty': { type: 'string' },
  'presence-penalty': { type: 'string' },
  'frequency-penalty': { type: 'string' },
  seed: { type: 'string' },
  stop: { type: 'string', multiple: true },
  'ignore-eos': { type: 'boolean' },
  'top-logprobs': { type: 'string' },
  'max-model-len': { type: 'string' },
  'kv-dtype': { type: 'string' },
  quantization: { type: 'string' },
  device: { type: 'string' },
  'batch-invariant': { type: 'boolean' },
  json: { type: 'boolean' },
  ...SPECULATIVE_OPTIONS,
  help: { type: 'boolean', short: 'h' },
};

const HELP = `usage: llmts generate --model DIR (--prompt TEXT | --messages JSON) [options]

  --model DIR              Hugging Face model directory (config.json, *.safetensors, tokenizer.json)
  --prompt TEXT            raw completion prompt (no chat template)
  --messages JSON          chat messages [{"role","content"}...], rendered with the model's template
  --max-tokens N           tokens to generate (default 256; capped by the context)
  --temperature T          0 = greedy (default: generation_config.json, else greedy)
  --top-p P  --top-k K  --min-p P
  --repetition-penalty R  --presence-penalty P  --frequency-penalty F
  --seed N                 same seed, same output
  --stop TEXT              stop string (repeatable); the text ends before it
  --ignore-eos             keep generating past end-of-sequence tokens
  --top-logprobs K         report the chosen token's logprob and the K best (0..20)
  --max-model-len N        context limit (default: the model's max_position_embeddings)
  --kv-dtype DTYPE         what the KV cache holds (default: the backend's, f32 on the CPU, bf16 on
                           CUDA); the CPU backend also keeps bf16 (half the bytes a decode step
                           reads) and int8 / fp8 with a scale per token and head (about a quarter)
  --quantization q8_0|q4_0|fp8  quantize a safetensors checkpoint's matrices as they load
                           (default: as stored): q8_0 / q4_0 on the CPU, kept as a GGUF's of that
                           type; fp8 on CUDA, the layers' matrices e4m3 with a scale a row
  --device auto|cpu|cuda   (default auto)
  --batch-invariant        CUDA: results that do not depend on other rows of a step (the server's
                           mode, for comparing; default: $LLMTS_CUDA_BATCH_INVARIANT, off)
${speculativeHelp(27)}
  --json                   print one JSON object instead of streaming text (with --speculative:
                           "speculation": {"draft_tokens", "accepted_tokens"})`;

function parseMessages(raw: string): { role: string; content: string }[] {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (err) {
    throw new UsageError(`--messages is not valid JSON: ${(err as Error).message}`);
  }
  if (!Array.isArray(value) || value.length === 0) throw new UsageError('--messages must be a non-empty JSON array');
  return value.map((m, i) => {
    if (!m || typeof m !== 'object') throw new UsageError(`--messages[${i}] must be an object`);
    const { role, content } = m as Record<string, unknown>;
    if (typeof role !== 'string' || !['system', 'user', 'assistant', 'tool'].includes(role))
      throw new UsageError(`--messages[${i}].role must be system, user, assistant or tool`);
    if (typeof content !== 'string') throw new UsageError(`--messages[${i}].content must be a string`);
    return { ...(m as Record<string, unknown>), role, content };
  });
}

export async function runGenerate(argv: string[]): Promise<void> {
  const v = parseFlags(argv, OPTIONS);
  if (v.help) {
    process.stdout.write(`${HELP}\n`);
    return;
  }
  const dir = requiredString(v, 'model');
  const prompt = stringFlag(v, 'prompt');
  const messagesRaw = stringFlag(v, 'messages');
  if ((prompt === undefined) === (messagesRaw === undefined)) throw new UsageError('give exactly one of --prompt or --messages');
  const messages = messagesRaw === undefined ? undefined : parseMessages(messagesRaw);
  const maxTokens = numberFlag(v, 'max-tokens', { integer: true, min: 1 }) ?? 256;
  const topLogprobs = numberFlag(v, 'top-logprobs', { integer: true, min: 0, max: 20 });
  const maxModelLen = numberFlag(v, 'max-model-len', { integer: true, min: 2 });
  const explicit: SamplingParamsInput = {
    temperature: numberFlag(v, 'temperature', { min: 0 }),
    topP: numberFlag(v, 'top-p'),
    topK: numberFlag(v, 'top-k', { integer: true }),
    minP: numberFlag(v, 'min-p'),
    repetitionPenalty: numberFlag(v, 'repetition-penalty'),
    presencePenalty: numberFlag(v, 'presence-penalty'),
    frequencyPenalty: numberFlag(v, 'frequency-penalty'),
    seed: numberFlag(v, 'seed', { integer: true }),
  };
  const device = parseDevice(stringFlag(v, 'device'));
  const kvDtype = kvDtypeFlag(v);
  const quantization = quantizationFlag(v);
  const speculative = speculativeFlags(v);
  const draftModel = draftModelFlag(v);

  const t0 = performance.now();
  // One request through the same engine the server uses (a lone row is just a batch of one).
  const llm = await load({
    model: dir, device, maxBatch: 1, maxModelLen, kvDtype, speculative, quantization, ...(draftModel !== undefined ? { draftModel } : {}),
    backendSettings: v['batch-invariant'] ? { cuda: { batchInvariant: true } } : undefined,
    onWarning: (w) => process.stderr.write(`llmts: warning: ${w}\n`),
  });
  try {
    const loadMs = performance.now() - t0;
    if (speculative && llm.engine.speculationOff) process.stderr.write(`llmts: warning: speculative decoding is off for this model (${llm.engine.speculationOff})\n`);
    const request = messages ? { messages } : { prompt: prompt! };
    const promptIds = llm.promptIdsOf(request);
    const stream = !v.json;
    const tStart = performance.now();
    let tFirst = tStart;
    const tokenIds: number[] = [];
    const logprobs: TokenLogprob[] = [];
    let text = '';
    let finishReason = 'length';
    let speculation: SpeculationCounts | undefined;
    const events = llm.generate({
      promptIds,
      maxTokens,
      ...explicit,
      stop: listFlag(v, 'stop'),
      ignoreEos: v['ignore-eos'] === true,
      topLogprobs,
    });
    for await (const e of events) {
      if (e.type === 'token') {
        if (tokenIds.length === 0) tFirst = performance.now();
        tokenIds.push(e.tokenId);
        if (e.logprobs) logprobs.push(e.logprobs);
      } else {
        finishReason = e.finishReason;
        speculation = e.speculation;
        if (e.error) throw new Error(e.error);
      }
      text += e.text;
      if (stream && e.text) process.stdout.write(e.text);
    }
    const tEnd = performance.now();
    if (stream) {
      process.stdout.write('\n');
    } else {
      const out: Record<string, unknown> = {
        prompt_token_ids: promptIds,
        token_ids: tokenIds,
        text,
        finish_reason: finishReason,
      };
      if (topLogprobs !== undefined) out.logprobs = logprobs;
      if (speculation) out.speculation = speculationJson(speculation);
      out.timings = {
        load_ms: round(loadMs),
        prefill_ms: round(tFirst - tStart),
        decode_ms: round(tEnd - tFirst),
        prompt_tokens: promptIds.length,
        generated_tokens: tokenIds.length,
      };
      process.stdout.write(`${JSON.stringify(out)}\n`);
    }
  } finally {
    await llm.close(0);
  }
}

const round = (ms: number) => Math.round(ms * 1000) / 1000;

