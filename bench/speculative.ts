// Speculative decoding with n-gram (prompt lookup) drafts, or a draft model's, against plain decoding, through the
// engine (CPU backend, or --device cuda): output tok/s of both, and their ratio, in the same run,
// at 1, 4 and 16 concurrent streams, on three tasks:
// - editing: the prompt holds a file and the start of the file again; the output is the file
//   rewritten. The demo model cannot follow an edit instruction (it was trained on Python source
//   for a few minutes), so each stream's file is Python the demo writes itself from a module
//   header (its greedy continuation, made at the start of the run), which it can write again: the
//   prompt is header + file + blank lines + header, the output what the model writes next;
// - free generation: the prompt is the header alone, greedy;
// - sampled: the same prompts at temperature 1 (seed = the stream's index), where drafts are
//   rarely right and the adaptive depth has to turn drafting off;
// - json: editing under a JSON schema (structured output, jump-forward on): the file is what the
//   demo writes from the header as a JSON object {"source": "..."} (at least 1,000 characters, so
//   it does not close the string at once), and the output, constrained
//   by the same schema, is what it writes after header + that document + blank lines + header.
// Every stream has its own header (16 of them), greedy decoding but for `sampled`, 256 output tokens, the prefix
// cache off (each repeat computes its prompt). The two engines run alternately, the order flipping
// every repeat, after one warm-up each; figures are medians of the repeats. Prints the load
// average around each run: the machine is shared.
//
// A random-weight model (bench/make_random_llama.py, on the GPU machine) writes its own file
// as it would any text: what the editing task measures there is the cost of verifying drafts on
// that device, at whatever acceptance the model's repetitions give.
//
//   OMP_NUM_THREADS=2 node --import tsx bench/speculative.ts [--model models/demo] [--device cpu|cuda]
//     [--repeats 3] [--output-tokens 256] [--num-draft-tokens adaptive|N] [--streams 1,4,16]
//     [--proposer ngram|oracle|draft|eagle3 --draft-model DIR]
//
// --proposer oracle drafts, for each stream, what plain decoding wrote for its prompt in its
// warm-up run: every draft is right (but where a verify chunk rounds differently from a decode
// row on a GPU), so the ratio is the most any proposer gains at that depth on that device and
// model: what a verify step costs against the decode steps it replaces. A random-weight model,
// whose own text never repeats, has no other way to show that.
//     [--tasks editing,free,sampled,json] [--csv bench/speculative.figures.csv --machine NAME]

import os from 'node:os';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { openBackend, parseDevice } from '../src/execution/devices.ts';
import { loadModel, type LoadedModel } from '../src/execution/load-model.ts';
import { Engine, type Completion, type EngineOptions } from '../src/execution/engine.ts';
import type { SpeculativeOptions } from '../src/execution/methods/speculative.ts';
import { benchCommit } from './commit.ts';
import { loadDrafter } from '../src/api/drafter.ts';
import { GrammarCompiler, grammarVocabFrom } from '../src/sampling/grammar/index.ts';
import type { EngineRequest, Sequence } from '../src/execution/sequence.ts';
import type { Draft, Proposer } from '../src/execution/methods/method.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    device: { type: 'string', default: 'cpu' },
    repeats: { type: 'string', default: '3' },
    'output-tokens': { type: 'string', default: '256' },
    'file-tokens': { type: 'string', default: '320' },
    'num-draft-tokens': { type: 'string', default: 'adaptive' },
    proposer: { type: 'string', default: 'ngram' },
    'draft-model': { type: 'string' },
    streams: { type: 'string', default: '1,4,16' },
    tasks: { type: 'string', default: 'editing,free,sampled' },
    csv: { type: 'string' },
    machine: { type: 'string' },
  },
});
const repeats = Number(values.repeats);
const outputTokens = Number(values['output-tokens']);
const fileTokens = Number(values['file-tokens']);
const depth = values['num-draft-tokens'] === 'adaptive' ? 'adaptive' : Number(values['num-draft-tokens']);
const streamCounts = values.streams!.split(',').map(Number);
type Task = 'editing' | 'free' | 'sampled' | 'json';
const tasks = values.tasks!.split(',') as Task[];
const proposer = values.proposer as 'ngram' | 'oracle' | 'draft' | 'eagle3';
if (!['ngram', 'oracle', 'draft', 'eagle3'].includes(proposer)) throw new Error(`--proposer must be ngram, oracle, draft or eagle3, got ${proposer}`);
const modelProposer = proposer === 'draft' || proposer === 'eagle3';
if (modelProposer !== (values['draft-model'] !== undefined)) throw new Error('--proposer draft|eagle3 goes with --draft-model DIR');

/** --proposer oracle: prompt (its tokens, joined) -> the tokens plain decoding wrote after it */
const plainOutputs = new Map<string, readonly number[]>();
class OracleProposer implements Proposer {
  propose(seq: Sequence, max: number): Draft | undefined {
    const out = plainOutputs.get(seq.prompt.join(','));
    const at = seq.known - seq.prompt.length;
    const tokens = out?.slice(at, at + max) ?? [];
    return tokens.length ? { tokens } : undefined;
  }
}
const speculative: SpeculativeOptions = { proposer: proposer === 'oracle' ? () => new OracleProposer() : proposer, numDraftTokens: depth };

const HEADERS = [
  'import os\nimport sys\n\n\ndef main(argv):',
  'def fibonacci(n):',
  'class Matrix:\n    def __init__(self, rows, cols):',
  'def parse_args(argv=None):',
  'class Node:\n',
  'def read_config(path):\n    """Read a configuration file."""',
  'import numpy as np\n\n\ndef normalize(x, axis=0):',
  'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):',
  'def binary_search(items, target):',
  'import json\n\n\ndef load(path):',
  'class Vector:\n    def __init__(self, x, y, z):',
  'def merge_sort(values):',
  'import re\n\n\ndef tokenize(text):',
  'class Cache(dict):\n    def __init__(self, maxsize=128):',
  'def gcd(a, b):',
  'import itertools\n\n\ndef pairwise(iterable):',
];

const device = parseDevice(values.device);
const backend = await openBackend(device);
const m = await loadModel(backend, values.model!, { maxModelLen: 2048 });
const base: EngineOptions = { maxBatch: 16, maxModelLen: 2048, prefixCache: { promptCacheBytes: 0 } };
const drafter = modelProposer ? await loadDrafter(backend, values['draft-model']!, m, proposer) : {};
const SOURCE_SCHEMA = { type: 'object', properties: { source: { type: 'string', minLength: 1000 } }, required: ['source'], additionalProperties: false };
const compiler = new GrammarCompiler(grammarVocabFrom(m.tokenizer, m.config.vocabSize, m.eosIds));
const sourceGrammar = await compiler.compile({ type: 'json_schema', schema: SOURCE_SCHEMA });
/** A request's output constraint in the json task: the schema, jump-forward on (as the server sets it). */
const constrained = (): Pick<EngineRequest, 'grammar'> => ({ grammar: { createMatcher: () => sourceGrammar.createMatcher({ jumpForward: true }) } });

/** Each stream's prompt for `task`: the header, or header + the file the model writes from it + blank lines + header. */
async function promptsFor(model: LoadedModel): Promise<Record<Task, number[][]>> {
  const e = new Engine(model.model, model, base);
  const headers = HEADERS.map((h) => model.encode(h));
  const files = await Promise.all(headers.map((h) => e.complete({ promptIds: h, maxTokens: fileTokens, sampling: { temperature: 0 }, ignoreEos: true })));
  const docs = tasks.includes('json')
    ? await Promise.all(headers.map((h) => e.complete({ promptIds: h, maxTokens: fileTokens, sampling: { temperature: 0 }, ignoreEos: true, ...constrained() })))
    : [];
  await e.close(0);
  const sep = model.encode('\n\n\n');
  return {
    free: headers,
    sampled: headers,
    editing: headers.map((h, k) => [...h, ...files[k]!.tokenIds, ...sep, ...h]),
    json: docs.map((d, k) => [...headers[k]!, ...d.tokenIds, ...sep, ...headers[k]!]),
  };
}

interface Measured {
  tps: number;
  drafted: number;
  accepted: number;
  /** the 1-minute load average before and after */
  load: [number, number];
  outputs: number[][];
  /** engine steps the run took, and how many of them were pipelined */
  steps: number;
  pipelined: number;
}

async function measure(engine: Engine, task: Task, streams: number): Promise<Measured> {
  const load0 = os.loadavg()[0]!;
  const before = engine.stats;
  const t0 = performance.now();
  const done: Completion[] = await Promise.all(prompts[task].slice(0, streams).map((p, k) =>
    engine.complete({
      promptIds: p, maxTokens: outputTokens, sampling: task === 'sampled' ? { temperature: 1, seed: k } : { temperature: 0 }, ignoreEos: true,
      ...(task === 'json' ? constrained() : {}),
    })));
  const ms = performance.now() - t0;
  const tokens = done.reduce((n, c) => n + c.tokenIds.length, 0);
  return {
    tps: tokens / (ms / 1000),
    drafted: done.reduce((n, c) => n + (c.speculation?.draftTokens ?? 0), 0),
    accepted: done.reduce((n, c) => n + (c.speculation?.acceptedTokens ?? 0), 0),
    load: [load0, os.loadavg()[0]!],
    outputs: done.map((c) => c.tokenIds),
    steps: engine.stats.steps - before.steps,
    pipelined: engine.stats.pipelinedSteps - before.pipelinedSteps,
  };
}

const prompts = await promptsFor(m);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const rows: { task: string; streams: number; plain: number; spec: number; ratio: number; acceptance: number; drafted: number; load: string }[] = [];
for (const task of tasks) {
  for (const streams of streamCounts) {
    const plain = new Engine(m.model, m, base);
    const spec = new Engine(m.model, m, { ...base, speculative, ...drafter });
    const warm = await measure(plain, task, streams);
    prompts[task].slice(0, streams).forEach((p, k) => plainOutputs.set(p.join(','), warm.outputs[k]!));
    await measure(spec, task, streams);
    const p: Measured[] = [], s: Measured[] = [];
    for (let r = 0; r < repeats; r++) {
      if (r % 2 === 0) {
        p.push(await measure(plain, task, streams));
        s.push(await measure(spec, task, streams));
      } else {
        s.push(await measure(spec, task, streams));
        p.push(await measure(plain, task, streams));
      }
    }
    // lossless, checked on every run: outputs with drafts are those without (sampled: the same
    // seeds). On the CPU bit for bit; a GPU's default GEMMs and attention round a verify chunk's
    // rows differently from decode rows, so there a stream may leave the plain one at a near-tie
    // (LLMTS_CUDA_BATCH_INVARIANT=on makes them equal): counted and printed, not fatal.
    let diverged = 0, firstDivergence = Infinity;
    for (let r = 0; r < repeats; r++) {
      s[r]!.outputs.forEach((out, k) => {
        const plainOut = p[r]!.outputs[k]!;
        const at = out.findIndex((t, i) => t !== plainOut[i]);
        if (at < 0 && out.length === plainOut.length) return;
        diverged++;
        firstDivergence = Math.min(firstDivergence, at < 0 ? Math.min(out.length, plainOut.length) : at);
      });
    }
    if (diverged && device === 'cpu') throw new Error(`${task} x${streams}: speculative outputs differ from plain ones`);
    if (diverged) console.log(`${task} x${streams}: ${diverged} of ${repeats * streams} speculative streams left the plain one (earliest at token ${firstDivergence})`);
    await plain.close(0);
    await spec.close(0);
    const drafted = s.reduce((n, x) => n + x.drafted, 0), accepted = s.reduce((n, x) => n + x.accepted, 0);
    const loads = [...p, ...s].flatMap((x) => x.load);
    const row = {
      task, streams, plain: median(p.map((x) => x.tps)), spec: median(s.map((x) => x.tps)),
      ratio: median(s.map((x, i) => x.tps / p[i]!.tps)), acceptance: drafted ? accepted / drafted : 0, drafted: drafted / repeats,
      load: `${Math.min(...loads).toFixed(1)}-${Math.max(...loads).toFixed(1)}`,
    };
    rows.push(row);
    const stepsOf = (xs: Measured[]) => `${median(xs.map((x) => x.steps))} steps (${median(xs.map((x) => x.pipelined))} pipelined)`;
    console.log(`${task.padEnd(8)} streams ${String(streams).padStart(2)}: plain ${row.plain.toFixed(1)} tok/s, ${proposer} ${row.spec.toFixed(1)} tok/s, ratio ${row.ratio.toFixed(3)} ` +
      `(drafted ${row.drafted.toFixed(0)}/run, accepted ${(row.acceptance * 100).toFixed(1)}%; load ${row.load}; plain ${stepsOf(p)}, ${proposer} ${stepsOf(s)})`);
  }
}
if (m.model.graphsOff) console.log(`decode graphs were off: ${m.model.graphsOff}`);
sourceGrammar.release();
await compiler.close();
await backend.close();

if (values.csv) {
  const machine = values.machine ?? `${os.cpus()[0]?.model ?? 'cpu'}, ${os.cpus().length} cores`;
  const commit = benchCommit();
  const date = new Date().toISOString().slice(0, 10);
  const invariant = process.env.LLMTS_CUDA_BATCH_INVARIANT === 'on' ? 'LLMTS_CUDA_BATCH_INVARIANT=on ' : '';
  const command = `${invariant}OMP_NUM_THREADS=${process.env.OMP_NUM_THREADS ?? os.cpus().length} node --import tsx bench/speculative.ts --device ${values.device}${values.model === 'models/demo' ? '' : ` --model ${values.model}`}${values.streams === '1,4,16' ? '' : ` --streams ${values.streams}`}${proposer === 'ngram' ? '' : ` --proposer ${proposer}`}${modelProposer ? ` --draft-model ${values['draft-model']}` : ''} --repeats ${repeats} --output-tokens ${outputTokens} --num-draft-tokens ${values['num-draft-tokens']}${values.tasks === 'editing,free,sampled' ? '' : ` --tasks ${values.tasks}`}`;
  const q = (s: string) => `"${s.replace(/"/g, '""')}"`;
  const lines = ['what,configuration,machine,commit,date,value,unit,command'];
  for (const r of rows) {
    const conf = `${values.model}, ${values.device}${invariant ? ' (batch-invariant)' : ''}, ${r.task}, ${r.streams} streams, ${outputTokens} ${r.task === 'sampled' ? 'sampled (temperature 1)' : r.task === 'json' ? 'greedy JSON-schema-constrained (at most)' : 'greedy'} tokens each, ${proposer === 'ngram' ? 'n-gram' : modelProposer ? `${proposer} ${values['draft-model']}` : 'oracle (plain output) drafts'} ${depth} (accepted ${(r.acceptance * 100).toFixed(1)}% of ${r.drafted.toFixed(0)} drafts a run); load ${r.load}; medians of ${repeats}`;
    for (const [what, v, unit] of [['plain', r.plain, 'tok/s'], [proposer === 'ngram' ? 'n-gram' : proposer, r.spec, 'tok/s'], ['ratio', r.ratio, 'x']] as const) {
      lines.push([what, q(conf), q(machine), commit, date, unit === 'x' ? v.toFixed(3) : v.toFixed(1), unit, q(command)].join(','));
    }
  }
  writeFileSync(values.csv, `${lines.join('\n')}\n`);
}
