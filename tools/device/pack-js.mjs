// Packs what the GPU machine needs to run the TypeScript sources without tsx and esbuild (whose
// binary alone is 3.7 MB of the 64 MiB a device call may carry): every .ts file of src/, bench/
// and test/ transformed to JavaScript here, into .device/js.tar.xz, and a stand-in `tsx` package
// whose load hook serves those transforms for the original .ts URLs (so import.meta.url and
// relative paths are unchanged), and the runtime dependencies as .device/node_modules.tar.xz (end
// of this file). Run once .device/ holds node and env.sh (the development environment's device kit,
// outside this repository, puts them there); then on the device:
//   source .device/env.sh && tar -xJf .device/js.tar.xz && node --import tsx ...
// (the stand-in replaces node_modules/tsx there; `tsx/esm/api` register() works too).
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { transformSync } from 'esbuild';

const root = execFileSync('git', ['rev-parse', '--show-toplevel']).toString().trim();
const out = join(root, '.device/js-build');
rmSync(out, { recursive: true, force: true });

function* tsFiles(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (name === 'node_modules' || name.startsWith('.')) continue;
    if (statSync(p).isDirectory()) yield* tsFiles(p);
    else if (p.endsWith('.ts') && !p.endsWith('.d.ts')) yield p;
  }
}
let n = 0;
for (const top of ['src', 'bench', 'test']) {
  for (const file of tsFiles(join(root, top))) {
    const rel = relative(root, file);
    const { code } = transformSync(readFileSync(file, 'utf8'), { loader: 'ts', format: 'esm', target: 'node20', sourcefile: rel });
    const dst = join(out, '.device/js', rel + '.js');
    mkdirSync(dirname(dst), { recursive: true });
    writeFileSync(dst, code);
    n++;
  }
}
// the stand-in tsx package
const pkg = join(out, 'node_modules/tsx');
mkdirSync(join(pkg, 'esm'), { recursive: true });
mkdirSync(join(pkg, 'dist'), { recursive: true });
writeFileSync(join(pkg, 'package.json'), JSON.stringify({
  name: 'tsx', version: '0.0.0-device', type: 'module',
  exports: { '.': './index.mjs', './esm/api': './esm/api.mjs', './dist/loader.mjs': './dist/loader.mjs' },
}, null, 2));
const registerCode = `import { register as nodeRegister } from 'node:module';
export function register() { nodeRegister(new URL('${'./hooks.mjs'}', import.meta.url)); return () => {}; }
`;
writeFileSync(join(pkg, 'esm/api.mjs'), registerCode.replace("'./hooks.mjs'", "'../hooks.mjs'"));
writeFileSync(join(pkg, 'index.mjs'), `import { register } from './esm/api.mjs';\nregister();\n`);
writeFileSync(join(pkg, 'dist/loader.mjs'), `import { register } from '../esm/api.mjs';\nregister();\n`); // bin/llmts imports this path
writeFileSync(join(pkg, 'hooks.mjs'), `// serves .device/js/<path>.js for <root>/<path>.ts (transformed by tools/device/pack-js.mjs)
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { relative } from 'node:path';
const root = fileURLToPath(new URL('../../', import.meta.url)); // <root>/node_modules/tsx/hooks.mjs
export async function load(url, context, next) {
  if (url.startsWith('file:') && url.endsWith('.ts')) {
    const rel = relative(root, fileURLToPath(url));
    if (!rel.startsWith('..')) {
      const source = await readFile(root + '/.device/js/' + rel + '.js', 'utf8');
      return { format: 'module', source, shortCircuit: true };
    }
  }
  return next(url, context);
}
`);
execFileSync('tar', ['-C', out, '-cJf', join(root, '.device/js.tar.xz'), '.device/js', 'node_modules/tsx']);
rmSync(out, { recursive: true, force: true });
console.log(`packed ${n} transformed .ts files and the stand-in tsx: ${(statSync(join(root, '.device/js.tar.xz')).size / 1024).toFixed(0)} KiB`);

// The runtime dependencies alone, as .device/node_modules.tar.xz (what env.sh unpacks): the lock
// file's non-dev packages for linux-x64, without tsx and esbuild (the stand-in replaces them) and
// without what koffi carries for building itself (C++ sources, vendored libraries, docs, the musl
// binary). The whole node_modules would not fit: the tree that travels to the GPU machine is capped
// at 64 MiB, and the stripped node binary already takes ~21 MB of it. On a machine kept warm
// between calls, remove node_modules there first: env.sh does not unpack over an existing one.
const lock = JSON.parse(readFileSync(join(root, 'package-lock.json'), 'utf8'));
const fits = (want, have) => !want || want.includes(have) || want.every((w) => w.startsWith('!') && w !== `!${have}`);
const runtime = Object.entries(lock.packages)
  .filter(([key, p]) => key.startsWith('node_modules/') && !p.dev && fits(p.os, 'linux') && fits(p.cpu, 'x64'))
  .map(([key]) => key)
  .filter((key) => !/^node_modules\/(tsx|esbuild|@esbuild\/)/.test(key) && statSync(join(root, key), { throwIfNoEntry: false }));
execFileSync('tar', ['-C', root, '-cJf', join(root, '.device/node_modules.tar.xz'),
  '--exclude=node_modules/koffi/src/koffi/src/*.cc', '--exclude=node_modules/koffi/src/koffi/src/*.hh',
  '--exclude=node_modules/koffi/vendor', '--exclude=node_modules/koffi/doc', '--exclude=*/musl_x64', ...runtime]);
console.log(`packed ${runtime.length} runtime packages: ${(statSync(join(root, '.device/node_modules.tar.xz')).size / 1024).toFixed(0)} KiB`);
