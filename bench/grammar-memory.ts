// Grammar memory and refusals, in-process on a grammar compiler over a synthetic vocabulary:
//  1. hostile specs (unsatisfiable recursion, doubling $refs, huge counts, deep nesting, long
//     forced text, runaway grammars): how long each takes to be refused, and RSS / Node external
//     memory before and after them all;
//  2. --schemas distinct schemas compiled under a --budget byte budget: the cache's entries and
//     bytes, evictions, the xgrammar heap and instance replacements, RSS and external memory
//     after each tenth, with the leases released (and, at the end, with --hold of them kept).
// Memory is read after a full GC (run it with node --expose-gc for that).
//
//   node --expose-gc --import tsx bench/grammar-memory.ts [--vocab 64000] [--budget 16M] [--schemas 60] [--hold 20]

import { parseArgs } from 'node:util';
import { asciiGrammarVocab as vocabOf } from '../test/helpers/grammar-vocab.ts';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { GrammarCompiler, type CompiledGrammar, type GrammarSpec } from '../src/sampling/grammar/index.ts';
import { parseSize } from '../src/cli/args.ts';
import { benchCommit } from './commit.ts';

const { values } = parseArgs({
  options: {
    vocab: { type: 'string', default: '64000' },
    budget: { type: 'string', default: '16M' },
    schemas: { type: 'string', default: '60' },
    hold: { type: 'string', default: '20' },
  },
});
const V = Number(values.vocab), budget = parseSize(values.budget!, 'budget'), N = Number(values.schemas), hold = Number(values.hold);


const MB = 2 ** 20;
const gc = (globalThis as { gc?: () => void }).gc;
async function memory(): Promise<string> {
  gc?.();
  await new Promise((r) => setTimeout(r, 50));
  gc?.();
  const m = process.memoryUsage();
  return `rss ${(m.rss / MB).toFixed(0)} MiB, external ${(m.external / MB).toFixed(0)} MiB`;
}

function hostile(): [string, GrammarSpec][] {
  const defs: Record<string, unknown> = { d0: { type: 'integer' } };
  for (let i = 1; i <= 30; i++) defs[`d${i}`] = { type: 'array', prefixItems: [{ $ref: `#/$defs/d${i - 1}` }, { $ref: `#/$defs/d${i - 1}` }], items: false };
  let deep: unknown = { type: 'integer' };
  for (let i = 0; i < 60; i++) deep = { type: 'object', properties: { a: deep }, required: ['a'] };
  return [
    ['required self $ref', { type: 'json_schema', schema: { type: 'object', properties: { a: { $ref: '#' } }, required: ['a'] } }],
    ['required $defs recursion', { type: 'json_schema', schema: { $defs: { n: { type: 'object', properties: { next: { $ref: '#/$defs/n' } }, required: ['next'] } }, $ref: '#/$defs/n' } }],
    ['doubling $refs (2^30)', { type: 'json_schema', schema: { $defs: defs, $ref: '#/$defs/d30' } }],
    ['objects nested 60 deep', { type: 'json_schema', schema: deep }],
    ['minItems 1e6', { type: 'json_schema', schema: { type: 'array', items: { type: 'integer' }, minItems: 1_000_000 } }],
    ['regex (a{1000}){1000}', { type: 'regex', pattern: '(a{1000}){1000}' }],
    ['grammar without an end', { type: 'ebnf', grammar: 'root ::= "x" r\nr ::= "y" root' }],
    ['grammar of 300 nested parentheses', { type: 'ebnf', grammar: `root ::= ${'('.repeat(300)}"a"${')'.repeat(300)}` }],
  ];
}

const strings = (i: number): GrammarSpec => ({ type: 'json_schema', schema: { type: 'array', items: { type: 'string', maxLength: 4 + (i % 4) }, maxItems: 100 + i } });

console.log(`grammar-memory: vocab ${V}, budget ${(budget / MB).toFixed(1)} MiB, ${N} schemas, hold ${hold}; ${os.cpus().length} CPUs, commit ${benchCommit()}${gc ? '' : ' (no --expose-gc: memory read without a GC)'}`);
const c = new GrammarCompiler(vocabOf(V), { cacheBytes: budget });
await c.warm();
(await c.compile(strings(-1))).release();
console.log(`warm: ${await memory()}, xgrammar heap ${(c.stats.heapBytes / MB).toFixed(1)} MiB`);

console.log('1. hostile specs');
for (const [name, spec] of hostile()) {
  const t0 = performance.now();
  let verdict = 'compiled';
  try {
    (await c.compile(spec)).release();
  } catch (err) {
    verdict = `refused: ${(err as Error).message.slice(0, 110)}`;
  }
  console.log(`   ${name}: ${(performance.now() - t0).toFixed(0)} ms, ${verdict}`);
}
console.log(`   after: ${await memory()}`);

console.log(`2. ${N} schemas under the budget`);
const held: CompiledGrammar[] = [];
for (let i = 0; i < N; i++) {
  const g = await c.compile(strings(i));
  if (i >= N - hold) held.push(g);
  else g.release();
  if ((i + 1) % 10 === 0 || i === N - 1) {
    const s = c.stats;
    console.log(`   ${i + 1}: entries ${s.cacheEntries}, cache ${(s.cacheBytes / MB).toFixed(1)} MiB, evictions ${s.evictions}, xgrammar heap ${(s.heapBytes / MB).toFixed(1)} MiB, ` +
      `replaced ${s.instanceReplacements} main / ${s.workerReplacements} worker, held ${held.length}; ${await memory()}`);
  }
}
for (const g of held) g.release();
console.log(`   released: xgrammar heap ${(c.stats.heapBytes / MB).toFixed(1)} MiB; ${await memory()}`);
await c.close();
