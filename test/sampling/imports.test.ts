// Layering: sampling/ imports only sampling/, contracts/ and node builtins; the generation
// files owned here import only generation/, sampling/ and contracts/.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const src = resolve(dirname(fileURLToPath(import.meta.url)), '../../src');

function check(file: string, allowed: string[]): string[] {
  const bad: string[] = [];
  const text = readFileSync(file, 'utf8');
  for (const m of text.matchAll(/^\s*(?:import|export)[^'"]*from\s+['"]([^'"]+)['"]/gm)) {
    const spec = m[1]!;
    if (spec.startsWith('node:')) continue;
    const layer = spec.startsWith('.') ? relative(src, resolve(dirname(file), spec)).split('/')[0]! : `package ${spec}`;
    if (!allowed.includes(layer)) bad.push(`${relative(src, file)} imports ${spec}`);
  }
  return bad;
}

test('sampling and generation imports point only down', () => {
  const bad = [
    ...readdirSync(join(src, 'sampling'))
      .filter((f) => f.endsWith('.ts'))
      .flatMap((f) => check(join(src, 'sampling', f), ['sampling', 'contracts'])),
    ...['detokenizer.ts', 'stop-strings.ts'].flatMap((f) =>
      check(join(src, 'generation', f), ['generation', 'sampling', 'contracts']),
    ),
  ];
  assert.deepEqual(bad, []);
});
