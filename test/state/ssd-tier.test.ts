// The prefix cache's SSD tier: prefixes spilled when idle or on flush, restored after a restart
// (a second engine on the same directory) with identical greedy outputs, kept under a byte cap,
// and every corrupt, truncated or foreign file skipped and removed, never trusted.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine, type EngineOptions } from '../../src/execution/engine.ts';
import type { LoadedModel } from '../../src/execution/load-model.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import { KV_FILE_PREFIX_BYTES } from '../../src/state/kv-file.ts';
import { coldOutputs, greedy, tinyModel, tokens } from './helpers.ts';

const logs: string[] = [];

function ssdEngine(m: LoadedModel, dir: string, maxBytes = 64 << 20, opts: EngineOptions = {}): Engine {
  return new Engine(m.model, m, {
    maxBatch: 2, ...opts,
    prefixCache: {
      modelFingerprint: modelFingerprint(m.dir), tokenizerFingerprint: m.tokenizer.fingerprint,
      ssd: { dir, maxBytes, log: (l) => logs.push(l) },
    },
  });
}

/** the namespace directory the engine's files went to, and its .kvc files */
function kvcFiles(dir: string): { sub: string; files: string[] } {
  const [ns] = readdirSync(dir);
  const sub = join(dir, ns);
  return { sub, files: readdirSync(sub).filter((f) => f.endsWith('.kvc')).sort() };
}

const tmp = () => mkdtempSync(join(tmpdir(), 'llmts-kvc-'));

async function eventually(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test('SSD tier: spilled when idle, restored after a restart with the same outputs', async () => {
  const m = await tinyModel();
  const dir = tmp();
  try {
    const A = tokens(11, 70), B = [...tokens(11, 70), ...tokens(12, 30)];
    const cold = await coldOutputs(m, [A, B], 8);
    const e1 = ssdEngine(m, dir);
    const a1 = await e1.complete(greedy(A, 8));
    assert.deepEqual(a1.tokenIds, cold[0]);
    // the loop went idle: the prefix is written without a flush
    await eventually(() => e1.stats.prefixCache.ssd!.files === 1, 'the idle spill');
    assert.equal(e1.stats.prefixCache.ssd!.pending, 0);
    await e1.close();
    assert.equal(kvcFiles(dir).files.length, 1);

    // a restart: the RAM tier is empty, the prefix comes back from disk
    const e2 = ssdEngine(m, dir);
    assert.equal(e2.stats.prefixCache.ssd!.files, 1);
    const a2 = await e2.complete(greedy(A, 8));
    assert.deepEqual(a2.tokenIds, cold[0]);
    assert.equal(a2.cachedTokens, 64); // floor(69 / 16) blocks
    let s = e2.stats.prefixCache;
    assert.equal(s.ssdHits, 1);
    assert.equal(s.ssdTokens, 64);
    assert.equal(s.ssd!.restores, 1);
    // B extends A: its first blocks are now in RAM (A just ran), the rest is computed
    const b2 = await e2.complete(greedy(B, 8));
    assert.deepEqual(b2.tokenIds, cold[1]);
    assert.ok(b2.cachedTokens >= 64);
    s = e2.stats.prefixCache;
    assert.equal(s.ssdHits, 1);
    assert.equal(e2.stats.kvBlocksUsed, 0);
    // flushing writes B's longer prefix; it supersedes A's file (A's blocks are a prefix of it)
    const flushed = await e2.flushPrefixCache();
    assert.equal(flushed.files, 1);
    await e2.close();
    assert.equal(kvcFiles(dir).files.length, 1);

    // a third engine restores B from disk, and A (a prefix of B's file) too
    const e3 = ssdEngine(m, dir);
    const b3 = await e3.complete(greedy(B, 8));
    assert.deepEqual(b3.tokenIds, cold[1]);
    assert.equal(b3.cachedTokens, Math.floor((B.length - 1) / 16) * 16);
    assert.equal(e3.stats.prefixCache.ssdHits, 1);
    await e3.close();
    const e4 = ssdEngine(m, dir);
    const a4 = await e4.complete(greedy(A, 8));
    assert.deepEqual(a4.tokenIds, cold[0]);
    assert.equal(a4.cachedTokens, 64);
    await e4.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});

test('SSD tier: corrupt, truncated and foreign files are removed and never used', async () => {
  const m = await tinyModel();
  const other = await tinyModel({ seed: 99 }); // another model: another namespace
  const good = tmp(), foreignDir = tmp();
  const dirs: string[] = [good, foreignDir];
  try {
    const A = tokens(13, 60);
    const [cold] = await coldOutputs(m, [A], 6);
    const e = ssdEngine(m, good);
    await e.complete(greedy(A, 6));
    await e.close();
    const { sub, files: [file] } = kvcFiles(good);
    const bytes = readFileSync(join(sub, file));
    const headerLen = bytes.readUInt32LE(12);

    const fo = ssdEngine(other, foreignDir);
    await fo.complete(greedy(A, 6));
    await fo.close();
    const foreign = kvcFiles(foreignDir);
    const foreignBytes = readFileSync(join(foreign.sub, foreign.files[0]));

    const flip = (b: Buffer, at: number) => {
      const c = Buffer.from(b);
      c[at] ^= 0x5a;
      return c;
    };
    const variants: { name: string; data: Buffer; atOpen: boolean }[] = [
      { name: 'payload byte flipped', data: flip(bytes, KV_FILE_PREFIX_BYTES + headerLen + 10), atOpen: false },
      { name: 'header byte flipped', data: flip(bytes, KV_FILE_PREFIX_BYTES + Math.floor(headerLen / 2)), atOpen: true },
      { name: 'bad magic', data: flip(bytes, 1), atOpen: true },
      { name: 'truncated', data: bytes.subarray(0, bytes.length - 100), atOpen: true },
      { name: 'truncated in the header', data: bytes.subarray(0, 30), atOpen: true },
      { name: 'stray bytes', data: Buffer.concat([bytes, Buffer.alloc(7)]), atOpen: true },
      { name: 'foreign model', data: foreignBytes, atOpen: true },
      { name: 'garbage', data: Buffer.from('not a cache file at all'), atOpen: true },
      { name: 'empty', data: Buffer.alloc(0), atOpen: true },
    ];
    for (const v of variants) {
      const dir = tmp();
      dirs.push(dir);
      cpSync(good, dir, { recursive: true });
      const target = kvcFiles(dir);
      writeFileSync(join(target.sub, file), v.data);
      writeFileSync(join(target.sub, 'notes.txt'), 'not ours'); // other files are left alone
      const before = logs.length;
      const e2 = ssdEngine(m, dir);
      assert.equal(e2.stats.prefixCache.ssd!.files, v.atOpen ? 0 : 1, v.name);
      const r = await e2.complete(greedy(A, 6));
      assert.deepEqual(r.tokenIds, cold, v.name);
      assert.equal(r.cachedTokens, 0, v.name);
      assert.equal(e2.stats.prefixCache.ssd!.rejected, 1, v.name);
      assert.ok(logs.length > before, `${v.name}: logged`);
      assert.equal(e2.stats.kvBlocksUsed, 0);
      await e2.close();
      assert.ok(readdirSync(target.sub).includes('notes.txt'));
      // the bad file is gone; the engine's own (re)written one, if any, is valid
      const e3 = ssdEngine(m, dir);
      assert.equal(e3.stats.prefixCache.ssd!.rejected, 0, `${v.name}: what is left is valid`);
      await e3.close();
    }
    // a truncation after the file was indexed is caught when the blocks are read
    const late = tmp();
    dirs.push(late);
    cpSync(good, late, { recursive: true });
    const e4 = ssdEngine(m, late);
    truncateSync(join(kvcFiles(late).sub, file), KV_FILE_PREFIX_BYTES + headerLen + 100); // inside block 0
    const r4 = await e4.complete(greedy(A, 6));
    assert.deepEqual(r4.tokenIds, cold);
    assert.equal(r4.cachedTokens, 0);
    assert.equal(e4.stats.prefixCache.ssd!.rejected, 1);
    await e4.close();
  } finally {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    await m.model.backend.close();
    await other.model.backend.close();
  }
});

test('SSD tier: the byte cap evicts the least recently used files', async () => {
  const m = await tinyModel();
  const dir = tmp();
  try {
    const prompts = Array.from({ length: 5 }, (_, k) => tokens(50 + k, 40));
    const probe = ssdEngine(m, dir);
    await probe.complete(greedy(prompts[0], 4));
    await probe.flushPrefixCache();
    const one = probe.stats.prefixCache.ssd!.bytes;
    await probe.close();
    rmSync(dir, { recursive: true, force: true });

    const cap = Math.floor(one * 2.5); // room for two files
    const e = ssdEngine(m, dir, cap);
    for (const p of prompts) {
      await e.complete(greedy(p, 4));
      await e.flushPrefixCache();
    }
    const s = e.stats.prefixCache.ssd!;
    assert.equal(s.files, 2);
    assert.ok(s.bytes <= cap);
    assert.equal(s.evictions, 3);
    await e.close();
    // the newest two survived a restart
    const e2 = ssdEngine(m, dir, cap);
    e2.dropPrefixCache();
    for (const [k, p] of prompts.entries()) {
      const r = await e2.complete(greedy(p, 4));
      assert.equal(r.cachedTokens > 0, k >= 3, `prompt ${k}`);
    }
    await e2.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});
