// Greedy continuations of given prompts by llmts itself (CPU backend), with each generated
// token's top-k logprobs: the demo's own text that train_draft.py and train_eagle3.py train on
// (spec_common.greedy_corpus runs this; transformers' generate on the CPU is ~20x slower).
//
//   node --import tsx tools/demo/greedy_corpus.ts --model models/demo --prompts IN.json --out OUT.json \
//     [--max-tokens 64] [--top-logprobs 16] [--max-batch 32]
//
// IN.json: [[token ids], ...]. OUT.json: {"tokens": [[generated ids]], "top_ids": [[[k ids] per
// step]], "top_logprobs": [[[k logprobs] per step]]}, in prompt order; EOS does not end a
// continuation (every one is --max-tokens long).

import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';

const { values: a } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    prompts: { type: 'string' },
    out: { type: 'string' },
    'max-tokens': { type: 'string', default: '64' },
    'top-logprobs': { type: 'string', default: '16' },
    'max-batch': { type: 'string', default: '32' },
  },
});
if (!a.prompts || !a.out) throw new Error('--prompts and --out are required');
const prompts = JSON.parse(readFileSync(a.prompts, 'utf8')) as number[][];
const maxTokens = Number(a['max-tokens']), k = Number(a['top-logprobs']), maxBatch = Number(a['max-batch']);

const backend = await createCpuBackend();
const m = await loadModel(backend, a.model!, { onProgress: () => {} });
const longest = Math.max(...prompts.map((p) => p.length)) + maxTokens;
const engine = new Engine(m.model, m, { maxBatch, maxModelLen: longest, maxQueued: prompts.length });
const t0 = performance.now();
let done = 0;
const results = await Promise.all(prompts.map(async (promptIds) => {
  const r = await engine.complete({ promptIds, maxTokens, sampling: { temperature: 0 }, ignoreEos: true, topLogprobs: k });
  if (++done % 256 === 0) console.error(`greedy corpus: ${done}/${prompts.length} (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
  return r;
}));
await engine.close(0);
await backend.close();
const seconds = (performance.now() - t0) / 1000;
writeFileSync(a.out, JSON.stringify({
  tokens: results.map((r) => r.tokenIds),
  top_ids: results.map((r) => r.logprobs!.map((s) => s.top.map((t) => t.token_id))),
  top_logprobs: results.map((r) => r.logprobs!.map((s) => s.top.map((t) => t.logprob))),
}));
console.error(`greedy corpus: ${prompts.length} continuations of ${maxTokens} tokens in ${seconds.toFixed(0)} s ` +
  `(${(prompts.length * maxTokens / seconds).toFixed(0)} tok/s)`);
