// Runs a ```ts block of README.md's "## Library API" section as written, from a module inside the
// repository so `import ... from 'llmts'` resolves to this package; returns its stdout's lines.

import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');

/** The first block of the section that contains `marker` (any text of it), run; throws when there is none. */
export function runReadmeBlock(marker: string): string[] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Library API'));
  const code = [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!).find((c) => c.includes(marker));
  if (code === undefined) throw new Error(`README has no \`\`\`ts block with ${marker} under "## Library API"`);
  const file = join(ROOT, `.readme-block-${process.pid}-${Date.now()}.mts`);
  writeFileSync(file, code);
  try {
    return execFileSync(process.execPath, ['--import', 'tsx', file], { cwd: ROOT, encoding: 'utf8' }).trim().split('\n');
  } finally {
    rmSync(file, { force: true });
  }
}
