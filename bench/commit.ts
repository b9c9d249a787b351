// The commit a benchmark's JSON records: $LLMTS_COMMIT when set (the GPU machine's copy of the tree
// may hold a stale .git, or none: the device scripts pass the commit they were made from), else
// `git rev-parse --short HEAD`, else 'unknown'.
import { execSync } from 'node:child_process';

export function benchCommit(cwd?: string): string {
  if (process.env.LLMTS_COMMIT) return process.env.LLMTS_COMMIT;
  try {
    return execSync('git rev-parse --short HEAD', { cwd, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
  } catch {
    return 'unknown';
  }
}
