// Many concurrent clients: a bounded load test (every stream completes, no token lost or
// duplicated) and a cancellation storm (clients leaving mid-stream free everything).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawnServer, postJson, scrape, eventually, parseSse, promptText, type Spawned } from './helpers.ts';

let srv: Spawned;

before(async () => {
  srv = await spawnServer({ model: { maxPositions: 2048 } });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const engineIdle = (m: Map<string, number>) =>
  m.get('llmts_running_rows') === 0 && m.get('llmts_queue_depth') === 0 && m.get('llmts_kv_blocks_used') === 0;

interface Outcome {
  text: string;
  tokens: string[];
  finish: string;
  completionTokens: number;
}

/** request k: even = completions, odd = chat; greedy, fixed length, with per-token logprobs */
function body(k: number, stream: boolean, maxTokens: number): Record<string, unknown> {
  const common = { model: 'tiny', max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream };
  const extra = stream ? { stream_options: { include_usage: true } } : {};
  return k % 2 === 0
    ? { ...common, ...extra, prompt: promptText(k), logprobs: 0 }
    : { ...common, ...extra, messages: [{ role: 'user', content: promptText(k) }], logprobs: true };
}
const route = (k: number) => (k % 2 === 0 ? '/v1/completions' : '/v1/chat/completions');

async function nonStreamed(k: number, maxTokens: number): Promise<Outcome> {
  const r = await postJson(srv.url + route(k), body(k, false, maxTokens));
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const c = r.body.choices[0];
  return k % 2 === 0
    ? { text: c.text, tokens: c.logprobs.tokens, finish: c.finish_reason, completionTokens: r.body.usage.completion_tokens }
    : { text: c.message.content, tokens: c.logprobs.content.map((e: { token: string }) => e.token), finish: c.finish_reason, completionTokens: r.body.usage.completion_tokens };
}

async function streamed(k: number, maxTokens: number): Promise<Outcome> {
  const res = await fetch(srv.url + route(k), {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body(k, true, maxTokens)),
  });
  assert.equal(res.status, 200);
  const raw = await res.text();
  assert.ok(raw.endsWith('data: [DONE]\n\n'), `stream ${k} did not end with [DONE]`);
  const out: Outcome = { text: '', tokens: [], finish: '', completionTokens: -1 };
  for (const f of parseSse(raw).slice(0, -1)) {
    const chunk = JSON.parse(f.data);
    if (chunk.usage) out.completionTokens = chunk.usage.completion_tokens;
    for (const c of chunk.choices) {
      out.text += (k % 2 === 0 ? c.text : c.delta.content) ?? '';
      if (c.logprobs) out.tokens.push(...(k % 2 === 0 ? c.logprobs.tokens : c.logprobs.content.map((e: { token: string }) => e.token)));
      if (c.finish_reason) {
        assert.equal(out.finish, '', `stream ${k} finished twice`);
        out.finish = c.finish_reason;
      }
    }
  }
  return out;
}

test('load: 40 concurrent streams x 10 rounds match the non-streamed greedy results, memory flat', async () => {
  const N = 40, ROUNDS = 10, MAX = 16;
  const rss: number[] = [];
  const before = await scrape(srv.url);
  // the non-streamed results, 8 at a time (a different batching from the rounds below)
  const expected: Outcome[] = [];
  for (let k = 0; k < N; k += 8) expected.push(...await Promise.all(Array.from({ length: 8 }, (_, j) => nonStreamed(k + j, MAX))));
  for (const e of expected) {
    assert.equal(e.finish, 'length');
    assert.equal(e.tokens.length, MAX);
  }
  for (let round = 0; round < ROUNDS; round++) {
    const got = await Promise.all(Array.from({ length: N }, (_, k) => streamed(k, MAX)));
    got.forEach((g, k) => {
      assert.equal(g.finish, 'length', `round ${round} stream ${k}`);
      assert.equal(g.completionTokens, MAX, `round ${round} stream ${k}`);
      assert.deepEqual(g.tokens, expected[k].tokens, `round ${round} stream ${k}: tokens`);
      assert.equal(g.text, expected[k].text, `round ${round} stream ${k}: text`);
    });
    rss.push((await scrape(srv.url)).get('llmts_process_resident_memory_bytes') ?? NaN);
  }
  // V8 grows its heap in steps before it collects (here up to ~21 MiB over the first rounds, at
  // this commit and before it; with a forced GC every round RSS and the heap stay flat, measured),
  // so only a gross bound holds reliably: it catches a leak of ~150 KB a request (checked with an
  // injected 200 KB one).
  const growth = rss[rss.length - 1]! - rss[0]!;
  assert.ok(Number.isFinite(growth), 'resident memory is reported');
  assert.ok(growth < 40 * 2 ** 20, `resident memory grew ${(growth / 2 ** 20).toFixed(1)} MiB over ${ROUNDS - 1} rounds ` +
    `(${rss.map((b) => (b / 2 ** 20).toFixed(0)).join(', ')} MiB)`);
  const after = await eventually('the engine to be idle', () => scrape(srv.url), engineIdle);
  const delta = (name: string) => (after.get(name) ?? 0) - (before.get(name) ?? 0);
  assert.equal(delta('llmts_generation_tokens_total'), N * MAX * (ROUNDS + 1));
  assert.equal(delta('llmts_sequences_finished_total{reason="length"}'), N * (ROUNDS + 1));
  assert.equal(delta('llmts_time_to_first_token_seconds_count'), N * (ROUNDS + 1));
  assert.equal(delta('llmts_inter_token_latency_seconds_count'), N * (MAX - 1) * (ROUNDS + 1));
  assert.ok(delta('llmts_http_requests_total{route="/v1/completions",method="POST",status="200"}') >= (N / 2) * (ROUNDS + 1));
});

test('seeded sampling under load: 40 concurrent sampled streams reproduce their non-streamed results', async () => {
  // temperature, top-p and a seed per request: the rows sample on the backend (sampleRows) and
  // their steps pipeline; a seed must give the same tokens whatever the batch around it
  const N = 40, MAX = 12;
  const sampled = (k: number, stream: boolean) => ({
    ...body(k, stream, MAX), temperature: 0.9, top_p: 0.95, seed: 1000 + k,
  });
  const one = async (k: number, stream: boolean): Promise<string[]> => {
    if (!stream) {
      const r = await postJson(srv.url + route(k), sampled(k, false));
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const c = r.body.choices[0];
      return k % 2 === 0 ? c.logprobs.tokens : c.logprobs.content.map((e: { token: string }) => e.token);
    }
    const res = await fetch(srv.url + route(k), {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(sampled(k, true)),
    });
    const tokens: string[] = [];
    for (const f of parseSse(await res.text()).slice(0, -1)) {
      for (const c of JSON.parse(f.data).choices) {
        if (c.logprobs) tokens.push(...(k % 2 === 0 ? c.logprobs.tokens : c.logprobs.content.map((e: { token: string }) => e.token)));
      }
    }
    return tokens;
  };
  const alone: string[][] = [];
  for (let k = 0; k < N; k += 10) alone.push(...await Promise.all(Array.from({ length: 10 }, (_, j) => one(k + j, false))));
  const together = await Promise.all(Array.from({ length: N }, (_, k) => one(k, true)));
  together.forEach((t, k) => {
    assert.equal(t.length, MAX, `stream ${k}`);
    assert.deepEqual(t, alone[k], `stream ${k}: seeded tokens`);
  });
  // it really sampled: most requests differ from their greedy output (else this proves nothing)
  const greedy = await Promise.all(Array.from({ length: 10 }, (_, k) => nonStreamed(k, MAX)));
  assert.ok(greedy.filter((g, k) => g.tokens.join('\u0000') !== alone[k]!.join('\u0000')).length >= 5, 'sampled like greedy');
  await eventually('the engine to be idle', () => scrape(srv.url), engineIdle);
});

test('cancellation storm: clients leaving mid-stream leave 0 running rows and 0 KV blocks', async () => {
  const before = await scrape(srv.url);
  const STREAMS = 40, PLAIN = 8, MAX = 1500;
  const midStream = async (k: number) => {
    const ac = new AbortController();
    const b = body(k, true, MAX);
    if (k % 5 === 0) b.n = 2; // n > 1: leaving cancels every choice
    const res = await fetch(srv.url + route(k), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b), signal: ac.signal });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    let chunks = 0, text = '';
    while (chunks < 4 + (k % 7)) {
      const { value, done } = await reader.read();
      assert.ok(!done, `stream ${k} ended before the client left`);
      text += new TextDecoder().decode(value);
      chunks = text.split('\n\n').length - 1;
    }
    assert.ok(!text.includes('[DONE]'));
    ac.abort();
    await reader.read().catch(() => undefined);
    return b.n === 2 ? 2 : 1;
  };
  const plainLeaving = async (k: number) => {
    const ac = new AbortController();
    const p = fetch(srv.url + route(k), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body(k, false, MAX)), signal: ac.signal });
    setTimeout(() => ac.abort(), 30 + k * 5);
    await p.then((r) => r.text()).then(
      () => assert.fail('a non-streamed request of 1500 tokens finished before its client left'),
      (err: Error) => assert.equal(err.name, 'AbortError'),
    );
    return 1;
  };
  const counts = await Promise.all([
    ...Array.from({ length: STREAMS }, (_, k) => midStream(k)),
    ...Array.from({ length: PLAIN }, (_, k) => plainLeaving(STREAMS + k)),
  ]);
  const sequences = counts.reduce((a, b) => a + b, 0);
  // every streamed sequence had started (the client saw chunks); a non-streamed client may leave
  // before the server has even read its request, so those may or may not have become sequences
  const streamedSequences = counts.slice(0, STREAMS).reduce((a, b) => a + b, 0);
  const after = await eventually('running rows and KV blocks back to 0', () => scrape(srv.url), engineIdle, 15_000);
  assert.equal(after.get('llmts_running_rows'), 0);
  assert.equal(after.get('llmts_kv_blocks_used'), 0);
  const cancelled = (after.get('llmts_sequences_finished_total{reason="cancelled"}') ?? 0) - (before.get('llmts_sequences_finished_total{reason="cancelled"}') ?? 0);
  assert.ok(cancelled >= streamedSequences && cancelled <= sequences, `cancelled ${cancelled}, expected ${streamedSequences}..${sequences}`);
  const generated = (after.get('llmts_generation_tokens_total') ?? 0) - (before.get('llmts_generation_tokens_total') ?? 0);
  assert.ok(generated < (sequences * MAX) / 10, `cancelled sequences kept generating (${generated} tokens)`);
  // and the server serves normally afterwards
  const ok = await nonStreamed(0, 8);
  assert.equal(ok.finish, 'length');
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
});

test('backpressure: a client that stops reading pauses its sequences; leaving frees them', async () => {
  const big = await spawnServer({ model: { maxPositions: 4096 } });
  try {
    const u = new URL(big.url);
    // 8 choices with 20 top logprobs each: ~1.5 KB of SSE per token per choice
    const body = JSON.stringify({
      model: 'tiny', messages: [{ role: 'user', content: 'slow reader' }], n: 8, max_tokens: 3000,
      temperature: 0, ignore_eos: true, stream: true, logprobs: true, top_logprobs: 20,
    });
    const sock = net.connect(Number(u.port), u.hostname);
    await new Promise((r) => sock.once('connect', r));
    sock.pause(); // never read: the kernel buffers fill, then the server's writes wait for 'drain'
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    const steps = async () => (await scrape(big.url)).get('llmts_engine_steps')!;
    let last = -1;
    const plateau = await eventually('the engine to stop stepping', async () => {
      await new Promise((r) => setTimeout(r, 300));
      const prev = last;
      last = await steps();
      return { prev, now: last };
    }, (s) => s.prev === s.now && s.now > 0, 30_000);
    assert.ok(plateau.now < 2999, `paused only at step ${plateau.now}`);
    const m = await scrape(big.url);
    assert.equal(m.get('llmts_running_rows'), 8, 'paused sequences keep their rows');
    assert.ok(m.get('llmts_kv_blocks_used')! > 0);
    // the server still answers other clients while those rows are paused
    const other = await postJson(`${big.url}/v1/completions`, { prompt: 'meanwhile', max_tokens: 4 });
    assert.equal(other.status, 200);
    sock.destroy();
    await eventually('paused rows to be freed', () => scrape(big.url), engineIdle, 10_000);
  } finally {
    await big.stop();
  }
  assert.doesNotMatch(big.stderr(), /internal error/);
});
