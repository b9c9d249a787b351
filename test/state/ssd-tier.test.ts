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

test('SSD tier with sliding-window layers: the window restores, and shorter prefixes while the pool held them', async () => {
  const m = await tinyModel({ slidingWindow: 8 }); // every layer sliding; 8 tokens reach one 16-token block back
  const dirs = [tmp(), tmp()];
  try {
    const A = tokens(21, 70); // 4 full blocks computed after 8 tokens (77)
    const B = [...A.slice(0, 40), ...tokens(22, 30)]; // shares A's first two blocks
    const cold = await coldOutputs(m, [A, B], 8);
    const blockBytes = 2 * 2 * 16 * 2 * 8 * 4;
    // 1. room to keep every block: the file holds A's window and every earlier block
    const e1 = ssdEngine(m, dirs[0]);
    assert.equal(e1.stats.prefixCache.ssdOff, undefined);
    assert.deepEqual((await e1.complete(greedy(A, 8))).tokenIds, cold[0]);
    await e1.close();
    const { sub, files } = kvcFiles(dirs[0]);
    assert.equal(files.length, 1);
    assert.equal(readFileSync(join(sub, files[0])).readUInt32LE(8), 2, 'a file with layer groups is version 2');
    for (const [k, p] of [A, B].entries()) {
      const e = ssdEngine(m, dirs[0]); // a restart for each: nothing in RAM
      const r = await e.complete(greedy(p, 8));
      assert.deepEqual(r.tokenIds, cold[k], `prompt ${k}`);
      assert.equal(r.cachedTokens, k === 0 ? 64 : 32, `prompt ${k}`);
      assert.equal(e.stats.prefixCache.ssdHits, 1);
      assert.equal(e.stats.kvBlocksUsed, 0);
      await e.close();
    }
    // 2. a one-block RAM tier drops the blocks A's window passed while A runs: the file holds only
    // the window at A's end, which restores A but no shorter prefix (B computes everything)
    const e2 = new Engine(m.model, m, {
      maxBatch: 2,
      prefixCache: {
        promptCacheBytes: blockBytes, modelFingerprint: modelFingerprint(m.dir), tokenizerFingerprint: m.tokenizer.fingerprint,
        ssd: { dir: dirs[1], maxBytes: 64 << 20 },
      },
    });
    assert.deepEqual((await e2.complete(greedy(A, 8))).tokenIds, cold[0]);
    await e2.close();
    const two = kvcFiles(dirs[1]);
    assert.equal(two.files.length, 1);
    assert.ok(readFileSync(join(two.sub, two.files[0])).length < readFileSync(join(sub, files[0])).length, 'the window-only file is smaller');
    for (const [k, p] of [A, B].entries()) {
      const e = ssdEngine(m, dirs[1]);
      const r = await e.complete(greedy(p, 8));
      assert.deepEqual(r.tokenIds, cold[k], `window-only, prompt ${k}`);
      assert.equal(r.cachedTokens, k === 0 ? 64 : 0, `window-only, prompt ${k}`);
      await e.close();
    }
    // 3. a corrupt block in a sliding group is caught when read: a miss, the file removed
    const { sub: s1, files: [f1] } = kvcFiles(dirs[1]);
    const bytes = readFileSync(join(s1, f1));
    bytes[bytes.length - 5] ^= 0x5a;
    writeFileSync(join(s1, f1), bytes);
    const e3 = ssdEngine(m, dirs[1]);
    const r3 = await e3.complete(greedy(A, 8));
    assert.deepEqual(r3.tokenIds, cold[0]);
    assert.equal(r3.cachedTokens, 0);
    assert.equal(e3.stats.prefixCache.ssd!.rejected, 1);
    await e3.close();
  } finally {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    await m.model.backend.close();
  }
});

for (const sliding of [0, 8]) {
  test(`SSD tier under sustained load${sliding ? ' (sliding window)' : ''}: prefixes evicted before any idle spill are kept`, async () => {
    const m = await tinyModel(sliding ? { slidingWindow: sliding } : {});
    const dirs = [tmp(), tmp()];
    try {
      const prompts = Array.from({ length: 8 }, (_, k) => tokens(70 + k, 40));
      const cold = await coldOutputs(m, prompts, 6);
      // a pool of 8 blocks, two rows of 3 at a time, everything queued at once: the loop is never
      // idle until the end, and every admission evicts blocks of prefixes that finished earlier
      const busy = { maxBatch: 2, kvTokens: 128, tokenBudget: 16 };
      const run = async (dir: string, captureBytes?: number) => {
        const e = new Engine(m.model, m, {
          ...busy,
          prefixCache: {
            modelFingerprint: modelFingerprint(m.dir), tokenizerFingerprint: m.tokenizer.fingerprint,
            ssd: { dir, maxBytes: 64 << 20, captureBytes },
          },
        });
        const got = await Promise.all(prompts.map((p) => e.complete(greedy(p, 6))));
        assert.deepEqual(got.map((r) => r.tokenIds), cold);
        assert.ok(e.stats.prefixCache.ramEvictions > 0);
        const s = e.stats.prefixCache.ssd!;
        await e.close();
        return s;
      };
      const kept = await run(dirs[0]);
      assert.ok(kept.captures > 0, 'prefixes were captured at eviction');
      assert.equal(kept.dropped, 0);
      // with no room to capture, the same run loses prefixes (the engine was never idle to spill them)
      const lost = await run(dirs[1], 0);
      assert.ok(lost.dropped > 0);
      assert.equal(lost.captures, 0);
      const restoredFrom = async (dir: string) => {
        let n = 0;
        for (const [k, p] of prompts.entries()) {
          const e = ssdEngine(m, dir); // a restart for each prompt
          const r = await e.complete(greedy(p, 6));
          assert.deepEqual(r.tokenIds, cold[k], `prompt ${k}`);
          if (r.cachedTokens === 32) n++;
          await e.close();
        }
        return n;
      };
      assert.equal(await restoredFrom(dirs[0]), prompts.length, 'every prefix restores after a restart');
      assert.ok(await restoredFrom(dirs[1]) < prompts.length);
    } finally {
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
      await m.model.backend.close();
    }
  });
}

test('SSD tier: concurrent requests sharing a restored prefix produce their solo outputs', async () => {
  const m = await tinyModel();
  const dir = tmp();
  try {
    const P = tokens(31, 70);
    const prompts = Array.from({ length: 5 }, (_, k) => [...P, ...tokens(40 + k, 3 + 2 * k)]);
    const cold = await coldOutputs(m, prompts, 8);
    const e1 = ssdEngine(m, dir);
    await e1.complete(greedy(P, 2));
    await e1.close();
    // a restart; all at once, with a budget that interleaves their prefill chunks
    const e2 = ssdEngine(m, dir, 64 << 20, { maxBatch: 3, tokenBudget: 24 });
    const got = await Promise.all(prompts.map((p) => e2.complete(greedy(p, 8))));
    assert.deepEqual(got.map((r) => r.tokenIds), cold);
    assert.ok(got.every((r) => r.cachedTokens >= 64), `cached: ${got.map((r) => r.cachedTokens)}`);
    const s = e2.stats.prefixCache;
    assert.ok(s.ssdHits >= 1);
    assert.equal(s.hits, prompts.length);
    assert.equal(e2.stats.kvBlocksUsed, 0);
    await e2.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});

test('SSD tier: a prefix that extends a file on disk by under 1/16 of its blocks is not written again', async () => {
  const m = await tinyModel();
  const dir = tmp();
  try {
    const P = tokens(33, 320); // 20 blocks
    const e = ssdEngine(m, dir);
    await e.complete(greedy(P, 1));
    await e.flushPrefixCache();
    assert.equal(e.stats.prefixCache.ssd!.writes, 1);
    const near = [...P, ...tokens(34, 10)]; // computes 337 tokens: 21 blocks, 1 new
    const r = await e.complete(greedy(near, 8));
    assert.equal(r.cachedTokens, 320);
    await e.flushPrefixCache();
    assert.equal(e.stats.prefixCache.ssd!.writes, 1);
    const far = [...P, ...tokens(35, 40)]; // 367 tokens: 22 blocks, 2 new
    await e.complete(greedy(far, 8));
    await e.flushPrefixCache();
    const s = e.stats.prefixCache.ssd!;
    assert.equal(s.writes, 2);
    assert.equal(s.files, 1); // the longer file supersedes the 20-block one
    await e.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});
