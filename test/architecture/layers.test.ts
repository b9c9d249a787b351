// Imports may only point down the layer stack of ARCHITECTURE.md ("Layers"). This test parses
// every import in src/ and fails on one that points up (or sideways into a peer backend).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, resolve, dirname } from 'node:path';

const SRC = resolve(import.meta.dirname, '../../src');
// Highest first. A file in layer i may import layers j >= i... only those listed as below it.
const ORDER = ['cli', 'api', 'server', 'execution', 'generation', 'sampling', 'state', 'models', 'artifacts', 'backends', 'contracts'];

function layerOf(file: string): string {
  return relative(SRC, file).split('/')[0];
}

function* tsFiles(dir: string): Generator<string> {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) yield* tsFiles(p);
    else if (p.endsWith('.ts')) yield p;
  }
}

export function importViolations(): string[] {
  const bad: string[] = [];
  for (const file of tsFiles(SRC)) {
    const from = layerOf(file);
    const src = readFileSync(file, 'utf8');
    for (const m of src.matchAll(/(?:import|export)[^'"]*?from\s+['"](\.[^'"]+)['"]/g)) {
      const target = resolve(dirname(file), m[1]);
      const to = layerOf(target);
      if (to === from) {
        // backends/cpu must not reach into backends/cuda and vice versa (common/ is shared)
        if (from === 'backends') {
          const a = relative(SRC, file).split('/')[1], b = relative(SRC, target).split('/')[1];
          if (a !== b && b !== 'common') bad.push(`${relative(SRC, file)} -> ${m[1]} (peer backend)`);
        }
        continue;
      }
      const fi = ORDER.indexOf(from), ti = ORDER.indexOf(to);
      if (fi < 0 || ti < 0) bad.push(`${relative(SRC, file)} -> ${m[1]} (unknown layer)`);
      else if (ti < fi) bad.push(`${relative(SRC, file)} -> ${m[1]} (${from} may not import ${to})`);
    }
  }
  return bad;
}

test('imports only point down the layers', () => {
  assert.deepEqual(importViolations(), []);
});

test('the layer check catches an upward import', () => {
  // A synthetic line run through the same regex and rule: models importing execution is upward.
  const line = "import { x } from '../execution/engine.ts';";
  const m = /(?:import|export)[^'"]*?from\s+['"](\.[^'"]+)['"]/.exec(line)!;
  const to = layerOf(resolve(SRC, 'models', m[1]));
  assert.ok(ORDER.indexOf(to) < ORDER.indexOf('models'));
});
