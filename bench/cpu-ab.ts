// Two builds of the CPU backend, same model, same run: prefill and decode tok/s of each
// (bench/cpu-generate.ts in a child process, the builds alternating round by round so that a
// machine's drift hits both alike), and the ratio of the candidate to the base. For a kernel change:
// build the base from the commit before it, the candidate from the working tree.
//
// --base (and --candidate) is either a native library, run by this tree's TypeScript (a change
// inside native/ only), or a whole tree with its build (a change that crosses into the TypeScript
// backend): its own bench/cpu-generate.ts and build/libllmts_cpu.so then run.
//
//   git archive <base-commit> | tar -x -C /tmp/base && ln -s $PWD/node_modules /tmp/base/ && \
//     (cd /tmp/base && node scripts/build-native.mjs --force)
//   node --import tsx bench/cpu-ab.ts --base /tmp/base[/build/libllmts_cpu.so] [--candidate build/libllmts_cpu.so]
//     [--model models/demo] [--prompt-tokens 512] [--decode-tokens 128] [--kv-dtype f32|bf16] [--rounds 5]

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    base: { type: 'string' },
    candidate: { type: 'string', default: 'build/libllmts_cpu.so' },
    model: { type: 'string', default: 'models/demo' },
    'prompt-tokens': { type: 'string', default: '512' },
    'decode-tokens': { type: 'string', default: '128' },
    'kv-dtype': { type: 'string', default: 'f32' },
    rounds: { type: 'string', default: '5' },
  },
});
if (!values.base) {
  console.error('cpu-ab: --base <path to the base build of libllmts_cpu.so> is required');
  process.exit(2);
}
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) {
  console.error(`cpu-ab: --rounds must be an integer >= 1, got ${values.rounds}`);
  process.exit(2);
}
/** what one side runs: a tree's own script and build, or this tree's script with a library */
function sideOf(path: string): { lib: string; script: string; cwd: string } {
  const p = resolve(path);
  if (statSync(p).isDirectory()) return { lib: join(p, 'build/libllmts_cpu.so'), script: join(p, 'bench/cpu-generate.ts'), cwd: p };
  return { lib: p, script: resolve(import.meta.dirname, 'cpu-generate.ts'), cwd: process.cwd() };
}
const sides = { base: sideOf(values.base), candidate: sideOf(values.candidate!) };
const libs = { base: sides.base.lib, candidate: sides.candidate.lib };
const model = resolve(values.model!);
const dir = mkdtempSync(join(tmpdir(), 'llmts-cpu-ab-'));

interface Run { prefillTokPerS: number; decodeTokPerS: number; machine: string; commit: string }
const runs: Record<keyof typeof libs, Run[]> = { base: [], candidate: [] };
try {
  for (let r = 0; r < rounds; r++) {
    // alternate which build goes first, so neither always runs on a warmer machine
    const order = (r % 2 === 0 ? ['base', 'candidate'] : ['candidate', 'base']) as (keyof typeof libs)[];
    for (const which of order) {
      const json = join(dir, `${which}-${r}.json`);
      const res = spawnSync(process.execPath, ['--import', 'tsx', sides[which].script, '--model', model,
        '--prompt-tokens', values['prompt-tokens']!, '--decode-tokens', values['decode-tokens']!,
        '--kv-dtype', values['kv-dtype']!, '--repeats', '3', '--json', json], {
        env: { ...process.env, LLMTS_CPU_LIB: libs[which] }, cwd: sides[which].cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'],
      });
      if (res.status !== 0) throw new Error(`cpu-generate with ${libs[which]} exited with ${res.status}:\n${res.stdout}`);
      const run = JSON.parse(readFileSync(json, 'utf8')) as Run;
      runs[which].push(run);
      console.log(`round ${r + 1}/${rounds} ${which.padEnd(9)} prefill ${run.prefillTokPerS.toFixed(1)} tok/s  decode ${run.decodeTokPerS.toFixed(1)} tok/s`);
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const summary = (which: keyof typeof libs) => ({
  prefill: median(runs[which].map((r) => r.prefillTokPerS)), decode: median(runs[which].map((r) => r.decodeTokPerS)),
});
const b = summary('base'), c = summary('candidate');
console.log(`machine   ${runs.base[0]!.machine}   commit ${runs.candidate[0]!.commit}`);
console.log(`model     ${values.model}, ${values['prompt-tokens']}-token prompt, ${values['decode-tokens']} decoded, KV ${values['kv-dtype']}; medians of ${rounds} rounds`);
console.log(`base      ${libs.base}: prefill ${b.prefill.toFixed(1)} tok/s, decode ${b.decode.toFixed(1)} tok/s`);
console.log(`candidate ${libs.candidate}: prefill ${c.prefill.toFixed(1)} tok/s, decode ${c.decode.toFixed(1)} tok/s`);
console.log(`ratio     candidate / base: prefill ${(c.prefill / b.prefill).toFixed(3)}, decode ${(c.decode / b.decode).toFixed(3)}`);
