// The prefix cache through `llmts serve`: cached_tokens in usage (multi-turn reuse up to the
// newest turn), /metrics, POST /admin/cache/flush behind --api-key, and restore after a restart
// from --cache-dir with the same greedy output.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { spawnServer, postJson, scrape } from './helpers.ts';

const KEY = { authorization: 'Bearer sk-cache' };
const ids = (seed: number, n: number) => Array.from({ length: n }, (_, k) => (seed * 37 + k * 11) % 256);

test('serve: cached_tokens, metrics, flush, and restore from --cache-dir after a restart', async () => {
  const dir = writeTinyLlama({ maxPositions: 512 });
  const cacheDir = mkdtempSync(join(tmpdir(), 'llmts-serve-kvc-'));
  const args = ['--api-key', 'sk-cache', '--cache-dir', cacheDir, '--cache-dir-size', '64M'];
  let srv = await spawnServer({ dir, args });
  try {
    assert.match(srv.stderr(), /prefix cache: up to .* SSD tier/);
    const complete = (prompt: number[], max = 10) => postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt, max_tokens: max, temperature: 0, ignore_eos: true }, KEY);

    const turn1 = ids(1, 45);
    const r1 = await complete(turn1);
    assert.equal(r1.status, 200);
    assert.equal(r1.body.usage.prompt_tokens_details.cached_tokens, 0);
    const r1again = await complete(turn1);
    assert.equal(r1again.body.choices[0].text, r1.body.choices[0].text);
    assert.equal(r1again.body.usage.prompt_tokens_details.cached_tokens, 32); // floor(44 / 16) blocks
    // chat, multi-turn: the second turn's prompt starts with all of the first turn's
    const chat = (messages: { role: string; content: string }[]) =>
      postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', messages, max_tokens: 6, temperature: 0 }, KEY);
    const m1 = [{ role: 'system', content: 'You are a terse assistant for cache tests.' }, { role: 'user', content: 'first question, fairly long' }];
    const c1 = await chat(m1);
    assert.equal(c1.status, 200);
    const c2 = await chat([...m1, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'second question' }]);
    // every full block of turn 1's prompt (turn 1 computed it all)
    assert.ok(c2.body.usage.prompt_tokens_details.cached_tokens >= Math.floor(c1.body.usage.prompt_tokens / 16) * 16,
      JSON.stringify([c1.body.usage, c2.body.usage]));

    const m = await scrape(srv.url);
    assert.equal(m.get('llmts_prefix_cache_hits_total{tier="ram"}'), 2);
    assert.ok((m.get('llmts_prefix_cache_misses_total') ?? 0) >= 1);
    assert.ok((m.get('llmts_prefix_cache_cached_tokens_total{tier="ram"}') ?? 0) >= 32);
    assert.ok((m.get('llmts_prefix_cache_bytes{tier="ram"}') ?? 0) > 0);
    assert.equal(m.get('llmts_prefix_cache_capacity_bytes{tier="ssd"}'), 64 * 2 ** 20);
    assert.ok(m.has('llmts_kv_blocks_cached'));

    // flush: behind the API key; writes what is pending
    assert.equal((await postJson(`${srv.url}/admin/cache/flush`, {})).status, 401);
    const f = await postJson(`${srv.url}/admin/cache/flush`, {}, KEY);
    assert.equal(f.status, 200);
    assert.equal(f.body.ssd_enabled, true);
    assert.ok(f.body.ssd_files >= 1, JSON.stringify(f.body));
    const late = ids(9, 50);
    const lateRun = await complete(late, 5); // written by the idle spill or at SIGTERM
    await srv.stop();
    assert.equal(await srv.exited, 0);
    assert.ok(readdirSync(cacheDir).length === 1);

    // a restart: the same prompts come back from disk with the same output
    srv = await spawnServer({ dir, args });
    const again = await complete(turn1);
    assert.equal(again.body.choices[0].text, r1.body.choices[0].text);
    assert.equal(again.body.usage.prompt_tokens_details.cached_tokens, 32);
    const lateAgain = await complete(late, 5);
    assert.equal(lateAgain.body.choices[0].text, lateRun.body.choices[0].text);
    assert.equal(lateAgain.body.usage.prompt_tokens_details.cached_tokens, 48);
    const m2 = await scrape(srv.url);
    assert.equal(m2.get('llmts_prefix_cache_hits_total{tier="ssd"}'), 2);
    assert.equal(m2.get('llmts_prefix_cache_cached_tokens_total{tier="ssd"}'), 80);
    assert.ok((m2.get('llmts_prefix_cache_bytes{tier="ssd"}') ?? 0) > 0);
    assert.ok((m2.get('llmts_prefix_cache_ssd_files') ?? 0) >= 2);
    for (const name of ['llmts_prefix_cache_ssd_captures_total', 'llmts_prefix_cache_ssd_dropped_total',
      'llmts_prefix_cache_ssd_restores_skipped_total', 'llmts_prefix_cache_ssd_pending', 'llmts_prefix_cache_ssd_capture_bytes']) {
      assert.equal(m2.get(name), 0, `${name} (nothing evicted or skipped in this run)`);
    }
  } finally {
    await srv.stop();
    rmSync(cacheDir, { recursive: true, force: true });
    rmSync(dir, { recursive: true, force: true });
  }
});

test('serve: --prompt-cache 0 turns reuse off', async () => {
  const srv = await spawnServer({ args: ['--prompt-cache', '0'] });
  try {
    assert.match(srv.stderr(), /prefix cache: off/);
    const body = { model: 'tiny', prompt: ids(3, 40), max_tokens: 3, temperature: 0 };
    await postJson(`${srv.url}/v1/completions`, body);
    const r = await postJson(`${srv.url}/v1/completions`, body);
    assert.equal(r.body.usage.prompt_tokens_details.cached_tokens, 0);
    const f = await postJson(`${srv.url}/admin/cache/flush`, {});
    assert.equal(f.status, 200);
    assert.equal(f.body.ssd_enabled, false);
  } finally {
    await srv.stop();
  }
});
