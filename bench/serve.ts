// Serving benchmark: `llmts bench` (src/cli/bench.ts) with models/demo on the CPU as its defaults
// (the commands in BENCHMARKS.md and bench/serve.figures.csv):
//
//   node --import tsx bench/serve.ts [--model models/demo] [--tokens 128] [--device cpu|cuda]
//        [--prompt-tokens 64] [--long-prompt 1900] [--max-model-len N] [--warmup] [--json out.json]
//        [--concurrency 1,4,16,64] [--repeats 5]
import { runBench } from '../src/cli/bench.ts';
import { exitWithError } from '../src/cli/errors.ts';

const argv = process.argv.slice(2);
const defaults: [string, string][] = [['--model', 'models/demo'], ['--device', 'cpu']];
for (const [flag, value] of defaults) if (!argv.includes(flag)) argv.push(flag, value);
runBench(argv).catch(exitWithError);
