// SSD tier write failures and orphaned temporary files: a failed write (disk full) is reported
// with its errno by flush and in the stats, a short write is continued so the OS's errno is what
// surfaces, and temporary files left by a killed writer are removed at startup (or, while another
// live process owns them, counted against the byte cap).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine } from '../../src/execution/engine.ts';
import type { LoadedModel } from '../../src/execution/load-model.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import type { SsdTierOptions } from '../../src/state/ssd-tier.ts';
import { greedy, tinyModel, tokens } from './helpers.ts';

function ssdEngine(m: LoadedModel, dir: string, logs: string[], maxBytes = 64 << 20, openForWrite?: SsdTierOptions['openForWrite']): Engine {
  return new Engine(m.model, m, {
    maxBatch: 2,
    prefixCache: {
      modelFingerprint: modelFingerprint(m.dir), tokenizerFingerprint: m.tokenizer.fingerprint,
      ssd: { dir, maxBytes, log: (l) => logs.push(l), openForWrite },
    },
  });
}

const tmp = () => mkdtempSync(join(tmpdir(), 'llmts-kvc-err-'));

/** A file handle whose first writev writes 1 byte (short) and whose next fails as a full disk does. */
async function fullDiskOpen(path: string): Promise<FileHandle> {
  const fh = await open(path, 'w');
  let calls = 0;
  const real = fh.writev.bind(fh);
  fh.writev = (async (buffers: Uint8Array[], position?: number) => {
    if (++calls === 1) return real([buffers[0].subarray(0, 1)], position);
    throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
  }) as FileHandle['writev'];
  return fh;
}

test('SSD tier: a write that fills the disk is reported by flush and counted by errno code, and leaves no file', async () => {
  const m = await tinyModel();
  const dir = tmp();
  const logs: string[] = [];
  try {
    const e = ssdEngine(m, dir, logs, 64 << 20, fullDiskOpen);
    await e.complete(greedy(tokens(21, 70), 4));
    const flushed = await e.flushPrefixCache();
    assert.equal(flushed.files, 0);
    assert.deepEqual(flushed.errors.map((x) => x.code), ['ENOSPC']);
    const s = e.stats.prefixCache.ssd!;
    assert.deepEqual(s.writeErrors, { ENOSPC: 1 });
    assert.equal(s.files, 0);
    assert.equal(s.tempBytes, 0);
    const line = logs.find((l) => l.includes('could not write'));
    assert.match(line ?? '', /ENOSPC/);
    assert.doesNotMatch(line ?? '', /short write/);
    await e.close();
    const [ns] = readdirSync(dir);
    assert.deepEqual(readdirSync(join(dir, ns)), [], 'the temporary file is removed');
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});

test('SSD tier: a short write is continued, and the file is written whole', async () => {
  const m = await tinyModel();
  const dir = tmp();
  const logs: string[] = [];
  const shortOpen = async (path: string): Promise<FileHandle> => {
    const fh = await open(path, 'w');
    const real = fh.writev.bind(fh);
    // every call writes at most 1000 bytes, as a nearly full disk or a signal may
    fh.writev = (async (buffers: Uint8Array[], position?: number) => {
      const out: Uint8Array[] = [];
      let left = 1000;
      for (const b of buffers) {
        if (left === 0) break;
        out.push(b.subarray(0, Math.min(left, b.byteLength)));
        left -= out[out.length - 1].byteLength;
      }
      return real(out, position);
    }) as FileHandle['writev'];
    return fh;
  };
  try {
    const A = tokens(22, 70);
    const e1 = ssdEngine(m, dir, logs, 64 << 20, shortOpen);
    const a1 = await e1.complete(greedy(A, 6));
    const flushed = await e1.flushPrefixCache();
    assert.equal(flushed.files, 1);
    assert.deepEqual(flushed.errors, []);
    await e1.close();
    // the file passes every check on a restart and restores
    const e2 = ssdEngine(m, dir, logs);
    assert.equal(e2.stats.prefixCache.ssd!.files, 1);
    assert.equal(e2.stats.prefixCache.ssd!.rejected, 0);
    const a2 = await e2.complete(greedy(A, 6));
    assert.deepEqual(a2.tokenIds, a1.tokenIds);
    assert.equal(a2.cachedTokens, 64);
    await e2.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});

test('SSD tier: orphaned temporary files are removed at startup; a live process\'s count against the cap', async () => {
  const m = await tinyModel();
  const dir = tmp();
  const logs: string[] = [];
  try {
    const e1 = ssdEngine(m, dir, logs);
    await e1.complete(greedy(tokens(23, 70), 4));
    await e1.flushPrefixCache();
    const fileBytes = e1.stats.prefixCache.ssd!.bytes;
    assert.ok(fileBytes > 0);
    await e1.close();
    const [ns] = readdirSync(dir);
    const sub = join(dir, ns);
    // a writer killed with kill -9 (its pid no longer exists), and one with this process's pid (a
    // previous process in a container where the server is always the same pid)
    writeFileSync(join(sub, '.tmp-999999999-1'), Buffer.alloc(4096));
    writeFileSync(join(sub, `.tmp-${process.pid}-424242`), Buffer.alloc(4096));
    // a live process (pid 1 always exists) still writing: kept, and its bytes count against the cap
    const live = join(sub, '.tmp-1-7');
    writeFileSync(live, Buffer.alloc(4096));
    logs.length = 0;
    const e2 = ssdEngine(m, dir, logs, fileBytes + 1024);
    const names = readdirSync(sub);
    assert.ok(!names.includes('.tmp-999999999-1'));
    assert.ok(!names.includes(`.tmp-${process.pid}-424242`));
    assert.ok(names.includes('.tmp-1-7'));
    assert.ok(logs.some((l) => /removed 2 orphaned temporary files \(8192 bytes\)/.test(l)), logs.join('\n'));
    const s = e2.stats.prefixCache.ssd!;
    assert.equal(s.tempBytes, 4096);
    // files + temporary bytes passed the cap: the prefix file was evicted to make room
    assert.equal(s.files, 0);
    assert.equal(s.evictions, 1);
    await e2.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});
