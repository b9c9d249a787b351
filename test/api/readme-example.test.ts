// Runs the README's library example as written (the ```ts block under "## Library API"), from a
// module inside the repository so `import ... from 'llmts'` resolves to this package.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');

test('the README library example runs and prints what it promises', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Library API'));
  const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(code, 'README has a ```ts block under "## Library API"');
  const file = join(ROOT, `.readme-example-${process.pid}.mts`);
  writeFileSync(file, code);
  try {
    const out = execFileSync(process.execPath, ['--import', 'tsx', file], { cwd: ROOT, encoding: 'utf8' });
    const lines = out.trim().split('\n');
    assert.match(lines[0], /^length 24$/);
    assert.ok(lines.length >= 2 && lines.slice(1).join('\n').length > 0);
  } finally {
    rmSync(file, { force: true });
  }
});
