// Runs bin/llmts as a user does (a child process, from a directory outside the repository) and
// collects its exit code and output.

import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

export const BIN = join(resolve(import.meta.dirname, '../..'), 'bin/llmts');

export interface BinRun { code: number; stdout: string; stderr: string }

/** `bin/llmts ...args` with the given environment (default: this process's). */
export function runBin(args: string[], env?: NodeJS.ProcessEnv): Promise<BinRun> {
  return new Promise((done) => {
    execFile(BIN, args, { cwd: tmpdir(), maxBuffer: 1 << 24, env: env ?? process.env }, (err, stdout, stderr) => {
      done({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}
