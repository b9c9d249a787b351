// GGUF models end to end: `llmts generate --model x.gguf` through bin/llmts against transformers,
// the same file as an Ollama blob (no extension) and in a directory, a split model, `llmts fit`
// from the header alone, the server (startServer, as `llmts serve` runs it), and one-line errors.
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, test } from 'node:test';

import { startServer } from '../../src/api/index.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { readGgufHeader, readTensorBytes, type GgufValue } from '../../src/artifacts/gguf/reader.ts';
import { FitPlanner } from '../../src/execution/fit/index.ts';
import { compareToReference } from '../helpers/closeness.ts';
import { writeGguf, type MetaValue, type TensorDef } from '../helpers/gguf-writer.ts';
import { runBin } from '../helpers/run-bin.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const GGUF = join(ROOT, 'test/fixtures/gguf');
const LLAMA = join(GGUF, 'llama_q8_0.gguf');
const ref = JSON.parse(readFileSync(join(GGUF, 'llama_q8_0.reference.json'), 'utf8'));
const tmp = mkdtempSync(join(tmpdir(), 'llmts-gguf-cli-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

const run = (args: string[]) => runBin(args);

const tokenizer = loadModelDir(LLAMA).tokenizer;

/** The reference case's prompt as text (it encodes back to the same ids), generated through bin/llmts. */
async function generate(model: string, caseIndex = 1): Promise<{ token_ids: number[]; logprobs: never[] }> {
  const c = ref.cases[caseIndex];
  const r = await run(['generate', '--model', model, '--prompt', tokenizer.decode(c.prompt_token_ids), '--max-tokens', String(c.steps.length),
    '--temperature', '0', '--ignore-eos', '--top-logprobs', '5', '--json', '--device', 'cpu']);
  assert.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.deepEqual(out.prompt_token_ids, c.prompt_token_ids);
  return out;
}

test('llmts generate --model x.gguf matches transformers (bf16 dequantization: tolerance 0.1)', async () => {
  const out = await generate(LLAMA);
  const close = compareToReference(out.logprobs, ref.cases[1].steps, 0.1);
  assert.ok(close.ok, close.problem);
});

test('an Ollama blob (sha256-... without an extension) and a directory holding one .gguf load the same model', async () => {
  const blobs = join(tmp, 'models', 'blobs');
  mkdirSync(blobs, { recursive: true });
  const blob = join(blobs, 'sha256-0123456789abcdef');
  copyFileSync(LLAMA, blob);
  const d = join(tmp, 'one');
  mkdirSync(d);
  copyFileSync(LLAMA, join(d, 'model-q8_0.gguf'));
  const want = (await generate(LLAMA, 0)).token_ids;
  assert.deepEqual((await generate(blob, 0)).token_ids, want);
  assert.deepEqual((await generate(d, 0)).token_ids, want);
});

/** Rewrites a GGUF as split parts (metadata in the first, tensors spread over all), as gguf-split does. */
function split(file: string, parts: number): string[] {
  const h = readGgufHeader(file);
  const meta = (v: GgufValue): MetaValue => {
    if (typeof v === 'string') return { type: 'string', value: v };
    if (typeof v === 'boolean') return { type: 'bool', value: v };
    if (typeof v === 'number') return Number.isInteger(v) ? { type: 'i32', value: v } : { type: 'f32', value: v };
    if (v instanceof Int32Array) return { type: 'array', elem: 'i32', value: [...v] };
    if (v instanceof Float32Array) return { type: 'array', elem: 'f32', value: [...v] };
    if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return { type: 'array', elem: 'string', value: v };
    throw new Error(`cannot copy ${String(v)}`);
  };
  const all: [string, MetaValue][] = [...h.metadata].map(([k, v]) => [k, meta(v)]);
  const tensors: TensorDef[] = h.tensors.map((t) => ({ name: t.name, dims: t.dims, type: t.type.id, data: readTensorBytes(t) }));
  const per = Math.ceil(tensors.length / parts);
  return Array.from({ length: parts }, (_, i) => {
    const name = join(tmp, `llama-${String(i + 1).padStart(5, '0')}-of-${String(parts).padStart(5, '0')}.gguf`);
    const splitKeys: [string, MetaValue][] = [['split.no', { type: 'u16', value: i }], ['split.count', { type: 'u16', value: parts }],
      ['split.tensors.count', { type: 'i32', value: tensors.length }]];
    return writeGguf(name, { metadata: [...(i === 0 ? all : []), ...splitKeys], tensors: tensors.slice(i * per, (i + 1) * per) });
  });
}

test('a split model: naming any part opens every part; a missing part is one line', async () => {
  const files = split(LLAMA, 3);
  const want = (await generate(LLAMA, 2)).token_ids;
  assert.deepEqual((await generate(files[1]!, 2)).token_ids, want);
  rmSync(files[2]!);
  const r = await run(['generate', '--model', files[0]!, '--prompt', 'x', '--device', 'cpu']);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr.trim(), /^llmts: split GGUF part .*llama-00003-of-00003\.gguf is missing \(the model has 3 parts\)$/);
});

test('bad GGUF files through the CLI: one line naming the file and the problem', async () => {
  const bad = join(tmp, 'bad.gguf');
  writeFileSync(bad, 'GGML....');
  let r = await run(['generate', '--model', bad, '--prompt', 'x', '--device', 'cpu']);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr.trim(), /^llmts: GGUF file .*bad\.gguf: is not a GGUF file \(magic "GGML", expected "GGUF"\)$/);
  const cut = join(tmp, 'cut.gguf');
  writeFileSync(cut, readFileSync(LLAMA).subarray(0, 100_000));
  r = await run(['generate', '--model', cut, '--prompt', 'x', '--device', 'cpu']);
  assert.match(r.stderr.trim(), /^llmts: GGUF file .*cut\.gguf: is truncated: tensor "[^"]+" \(Q8_0 \[\d+, \d+\]\) needs bytes up to \d+, but the file has 100000$/);
  const two = join(tmp, 'two');
  mkdirSync(two);
  copyFileSync(LLAMA, join(two, 'a.gguf'));
  copyFileSync(LLAMA, join(two, 'b.gguf'));
  r = await run(['generate', '--model', two, '--prompt', 'x', '--device', 'cpu']);
  assert.match(r.stderr.trim(), /^llmts: .*two holds several GGUF models \(a\.gguf, b\.gguf\); name the \.gguf file with --model$/);
});

test('llmts fit plans a GGUF model from its header: Q8_0 matrices resident as bf16 on CUDA, kept quantized on the CPU, norms f32', async () => {
  const art = loadModelDir(LLAMA, { tokenizer: false });
  const p = await FitPlanner.open(LLAMA); // LLMTS_CPU_QUANT_WEIGHTS on, the default (as the fit command below runs)
  const w = await p.weights('cuda');
  const { hiddenSize: D, vocabSize: V, numLayers: L, intermediateSize: I, numHeads: H, numKvHeads: Hk, headDim: hd } = art.config;
  const matrices = 2 * V * D + L * (D * H * hd * 2 + 2 * D * Hk * hd + 3 * D * I);
  assert.equal(w.residentBytesByDtype.bf16, matrices * 2);
  assert.equal(w.residentBytesByDtype.f32, (L * 2 + 1) * D * 4);
  assert.deepEqual(w.unusedTensors, []);
  assert.ok(art.tokenizerBytes! > 1000, 'the tokenizer metadata counts as the tokenizer');
  // the CPU: panels of 16 rows, 16 x 34 bytes a block of 32 (every matrix here has rows a multiple of 16)
  const c = await p.weights('cpu');
  assert.equal(c.residentBytesByDtype.Q8_0, (matrices / 32) * 34);
  assert.equal(c.residentBytesByDtype.bf16, undefined);
  assert.equal(c.residentBytesByDtype.f32, w.residentBytesByDtype.f32);
  const r = await run(['fit', '--model', LLAMA, '--ctx', '256', '--device', 'cpu', '--memory', '8G', '--bandwidth', '10', '--json']);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout).weights.residentBytes, c.residentBytes);
});

test('the server (startServer, as llmts serve runs it) serves a GGUF model', async () => {
  const srv = await startServer({ model: LLAMA, device: 'cpu', port: 0, servedModelName: 'g', kvBudgetBytes: 1 << 20, warmup: false });
  try {
    const c = ref.cases[0];
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'g', prompt: c.prompt_token_ids, max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 1 }),
    });
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.usage.completion_tokens, 8);
    const chat = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'g', messages: ref.chat[0].messages, max_tokens: 4, temperature: 0, ignore_eos: true }),
    });
    assert.equal(chat.status, 200);
    assert.equal((await chat.json()).usage.prompt_tokens, loadModelDir(LLAMA).chatTemplate!.encode(ref.chat[0].messages, { addGenerationPrompt: true }).length);
  } finally {
    await srv.close(1000);
  }
});
