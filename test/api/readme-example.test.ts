// Runs the README's first library example as written (the ```ts block under "## Library API").
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runReadmeBlock } from './readme-block.ts';

test('the README library example runs and prints what it promises', () => {
  const lines = runReadmeBlock("import { load } from 'llmts'");
  assert.match(lines[0]!, /^length 24$/);
  assert.ok(lines.length >= 2 && lines.slice(1).join('\n').length > 0);
});
