// A client that drops mid-upload is an abort (one log line, counted under status 499), never an
// internal error; SSD write failures show in the flush response and /metrics with their errno.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnServer, postJson, scrape, eventually } from './helpers.ts';
import { Engine } from '../../src/execution/engine.ts';
import { modelFingerprint } from '../../src/state/fingerprint.ts';
import { LlmServer } from '../../src/server/server.ts';
import { greedy, tinyModel, tokens } from '../state/helpers.ts';

test('a client that closes the connection mid-body is logged as an abort and counted as 499', async () => {
  const srv = await spawnServer();
  try {
    const u = new URL(srv.url);
    const sock = net.connect(Number(u.port), u.hostname);
    await new Promise((r) => sock.once('connect', r));
    sock.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": "tiny", "mess');
    await new Promise((r) => setTimeout(r, 100));
    sock.destroy();
    const key = 'llmts_http_requests_total{route="/v1/chat/completions",method="POST",status="499"}';
    const m = await eventually('the abort to be counted', () => scrape(srv.url), (x) => x.get(key) === 1);
    assert.equal(m.get('llmts_http_requests_total{route="/v1/chat/completions",method="POST",status="200"}'), undefined);
    assert.equal(m.get('llmts_http_requests_total{route="/v1/chat/completions",method="POST",status="500"}'), undefined);
    // the server keeps serving
    assert.equal((await postJson(`${srv.url}/v1/completions`, { prompt: 'hi', max_tokens: 2 })).status, 200);
  } finally {
    await srv.stop();
  }
  const err = srv.stderr();
  assert.match(err, /client aborted POST \/v1\/chat\/completions: the client closed the connection while sending the body \(\d+ of 1000 bytes received\)/);
  assert.doesNotMatch(err, /internal error/);
  assert.doesNotMatch(err, /\n\s+at /, 'no stack trace');
});

test('POST /admin/cache/flush reports SSD write failures by errno code; /metrics counts them', async () => {
  const m = await tinyModel({ maxPositions: 8192 });
  const dir = mkdtempSync(join(tmpdir(), 'llmts-flush-err-'));
  const logs: string[] = [];
  // a disk that is full: every write fails with ENOSPC
  const fullDisk = async (path: string): Promise<FileHandle> => {
    const fh = await open(path, 'w');
    fh.writev = (async () => {
      throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
    }) as FileHandle['writev'];
    return fh;
  };
  const engine = new Engine(m.model, m, {
    maxBatch: 2,
    prefixCache: {
      modelFingerprint: modelFingerprint(m.dir), tokenizerFingerprint: m.tokenizer.fingerprint,
      ssd: { dir, maxBytes: 64 << 20, log: (l) => logs.push(l), openForWrite: fullDisk },
    },
  });
  const server = new LlmServer({ engine, loaded: m, servedModelName: 'tiny', processMetrics: false, log: (l) => logs.push(l) });
  try {
    const addr = await server.listen(0, '127.0.0.1');
    const url = `http://127.0.0.1:${addr.port}`;
    // a flush while a sequence runs writes its computed prefix: that write fails
    const ac = new AbortController();
    const running = engine.complete(greedy(tokens(31, 70), 8000), { signal: ac.signal }).catch(() => undefined);
    await eventually('the sequence to run', async () => engine.stats.running, (n) => n === 1);
    // and to have computed its prompt (a flush before its first step ends has nothing to write)
    await eventually('its prompt computed', async () => engine.stats.steps, (n) => n >= 1);
    const f = await postJson(`${url}/admin/cache/flush`, {});
    ac.abort();
    await running;
    assert.equal(f.status, 200);
    assert.equal(f.body.files_written, 0);
    assert.equal(f.body.write_errors.length, 1);
    assert.equal(f.body.write_errors[0].code, 'ENOSPC');
    assert.equal(f.body.write_errors[0].count, 1);
    assert.match(f.body.write_errors[0].message, /no space left/);
    // background (idle) spills fail too: the totals since start are in every flush response and /metrics
    await eventually('the idle spill', async () => engine.stats.prefixCache.ssd!.pending, (n) => n === 0);
    await engine.flushPrefixCache();
    const total = engine.stats.prefixCache.ssd!.writeErrors.ENOSPC;
    assert.ok(total >= 1);
    const g = await postJson(`${url}/admin/cache/flush`, {});
    assert.deepEqual(g.body.write_errors, [], 'nothing pending: this flush failed nothing');
    assert.deepEqual(g.body.ssd_write_errors, { ENOSPC: total });
    const metrics = await scrape(url);
    assert.equal(metrics.get('llmts_prefix_cache_ssd_write_errors_total{code="ENOSPC"}'), total);
    assert.ok(logs.some((l) => /could not write .*ENOSPC/.test(l)), logs.join('\n'));
  } finally {
    await server.shutdown(1000);
    rmSync(dir, { recursive: true, force: true });
    await m.model.backend.close();
  }
});
