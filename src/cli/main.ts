// Entry point of `bin/llmts`: dispatches to one command module per subcommand.

import { exitWithError, UsageError } from './errors.ts';

const USAGE = `usage: llmts <command> [options]

commands:
  generate --model DIR (--prompt TEXT | --messages JSON) [options]   generate text
  serve --model DIR [options]                                        OpenAI/Anthropic-compatible HTTP server
  fit --model DIR --ctx N [options]                                  memory plan: does it fit, max context, decode tok/s
  bench --model DIR [options]                                        serving performance, engine-direct and through HTTP
  help                                                               this text

Run "llmts <command> --help" for a command's options.`;

async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'generate': {
      const { runGenerate } = await import('./generate.ts');
      return runGenerate(rest);
    }
    case 'serve': {
      const { runServe } = await import('./serve.ts');
      return runServe(rest);
    }
    case 'fit': {
      const { runFit } = await import('./fit.ts');
      return runFit(rest);
    }
    case 'bench': {
      const { runBench } = await import('./bench.ts');
      await runBench(rest);
      return;
    }
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(`${USAGE}\n`);
      return;
    default:
      throw new UsageError(`unknown command "${command}" (commands: generate, serve, fit, bench, help)`);
  }
}

main(process.argv.slice(2)).catch(exitWithError);
