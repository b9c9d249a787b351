// Speculative decoding through the server (startServer in process, the llama fixture on the CPU
// backend): the same completions as a server without it, usage.speculation on every route that
// reports usage (chat and completions, streamed or not; Anthropic messages), and the /metrics
// drafted / accepted counters and acceptance-length histogram.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { resolve } from 'node:path';
import { startServer, type ServerHandle } from '../../src/api/index.ts';

const LLAMA = resolve(import.meta.dirname, '../fixtures/llama');
let plain: ServerHandle, spec: ServerHandle;
const notes: string[] = [];

before(async () => {
  const base = { model: LLAMA, device: 'cpu' as const, port: 0, servedModelName: 'm', maxBatch: 4 };
  plain = await startServer(base);
  spec = await startServer({ ...base, speculative: { proposer: 'ngram', numDraftTokens: 4, ngramMin: 1 }, log: (l) => notes.push(l) });
});
after(async () => {
  await plain?.close(0);
  await spec?.close(0);
});

const post = async (srv: ServerHandle, path: string, body: object) => {
  const res = await fetch(`${srv.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.equal(res.status, 200);
  return res;
};

/** The data events of an SSE response, parsed. */
async function events(res: Response): Promise<Record<string, unknown>[]> {
  const text = await res.text();
  return text.split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]').map((l) => JSON.parse(l.slice(6)));
}

const completion = { model: 'm', prompt: 'def f(x): return x\ndef f(x): return', max_tokens: 24, temperature: 0, ignore_eos: true, n: 2 };

test('the startup notes say how the server speculates', () => {
  assert.ok(notes.includes('speculative decoding: n-gram drafts (suffixes of 1 to 5 tokens), 4 draft tokens'), notes.join('\n'));
});

test('completions: the same text as without speculation, and usage.speculation summed over the choices', async () => {
  const a = await (await post(plain, '/v1/completions', completion)).json();
  const b = await (await post(spec, '/v1/completions', completion)).json();
  assert.deepEqual(b.choices.map((c: { text: string }) => c.text), a.choices.map((c: { text: string }) => c.text));
  assert.equal(a.usage.speculation, undefined, 'a server that does not speculate reports none');
  const s = b.usage.speculation;
  assert.deepEqual(Object.keys(s), ['draft_tokens', 'accepted_tokens']);
  assert.ok(s.draft_tokens > 0 && s.accepted_tokens <= s.draft_tokens, JSON.stringify(s));
  // streamed with usage: the same counts
  const streamed = await events(await post(spec, '/v1/completions', { ...completion, stream: true, stream_options: { include_usage: true } }));
  const usage = streamed.at(-1)!.usage as { speculation: unknown };
  assert.deepEqual(usage.speculation, s);
});

test('chat completions and Anthropic messages report usage.speculation too', async () => {
  const chat = { model: 'm', messages: [{ role: 'user', content: 'abc abc abc abc' }], max_tokens: 16, temperature: 0, ignore_eos: true };
  const a = await (await post(plain, '/v1/chat/completions', chat)).json();
  const b = await (await post(spec, '/v1/chat/completions', chat)).json();
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  assert.ok(b.usage.speculation.draft_tokens > 0);
  const streamed = await events(await post(spec, '/v1/chat/completions', { ...chat, stream: true, stream_options: { include_usage: true } }));
  assert.deepEqual((streamed.at(-1)!.usage as { speculation: unknown }).speculation, b.usage.speculation);
  const msg = await (await post(spec, '/v1/messages', { model: 'm', max_tokens: 16, messages: [{ role: 'user', content: 'abc abc abc abc' }] })).json();
  assert.ok(msg.usage.speculation.draft_tokens > 0, JSON.stringify(msg.usage));
});

test('/metrics counts draft tokens verified and accepted, and the accepted length of each verify row', async () => {
  const scrape = async () => (await (await fetch(`${spec.url}/metrics`)).text());
  const value = (text: string, name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
  const before = await scrape();
  await (await post(spec, '/v1/completions', completion)).json();
  const now = await scrape();
  const drafted = value(now, 'llmts_spec_decode_draft_tokens_total') - value(before, 'llmts_spec_decode_draft_tokens_total');
  const accepted = value(now, 'llmts_spec_decode_accepted_tokens_total') - value(before, 'llmts_spec_decode_accepted_tokens_total');
  assert.ok(drafted > 0 && accepted >= 0 && accepted <= drafted, `${drafted} ${accepted}`);
  // the histogram: its sum is the accepted tokens, its count the verify rows
  const sum = value(now, 'llmts_spec_decode_acceptance_length_sum') - value(before, 'llmts_spec_decode_acceptance_length_sum');
  const rows = value(now, 'llmts_spec_decode_acceptance_length_count') - value(before, 'llmts_spec_decode_acceptance_length_count');
  assert.equal(sum, accepted);
  assert.ok(rows > 0 && rows * 4 >= drafted, `${rows} verify rows of at most 4 draft tokens`);
  assert.match(now, /^llmts_spec_decode_acceptance_length_bucket\{le="0"\} \d+$/m);
  assert.equal(spec.engine.stats.speculation.draftTokens, value(now, 'llmts_spec_decode_draft_tokens_total'));
});

test('a server speculating with a draft model (--speculative draft --draft-model): the same text, usage.speculation, the startup note', async () => {
  const lines: string[] = [];
  const base = { model: LLAMA, device: 'cpu' as const, port: 0, servedModelName: 'm', maxBatch: 4 };
  const draft = await startServer({ ...base, speculative: { proposer: 'draft', numDraftTokens: 3 },
    draftModel: resolve(import.meta.dirname, '../fixtures/qwen3'), log: (l) => lines.push(l) });
  try {
    assert.ok(lines.some((l) => /^speculative decoding: drafts of the draft model .*qwen3 \(\d+ layers, hidden \d+\), 3 draft tokens$/.test(l)), lines.join('\n'));
    const a = await (await post(plain, '/v1/completions', completion)).json();
    const b = await (await post(draft, '/v1/completions', completion)).json();
    assert.deepEqual(b.choices.map((c: { text: string }) => c.text), a.choices.map((c: { text: string }) => c.text));
    assert.ok(b.usage.speculation.draft_tokens > 0, JSON.stringify(b.usage));
  } finally {
    await draft.close(0);
  }
  // the options are checked before anything loads
  await assert.rejects(startServer({ ...base, speculative: { proposer: 'draft' } }), /speculative draft needs draftModel/);
  await assert.rejects(startServer({ ...base, draftModel: LLAMA }), /draftModel needs speculative draft/);
  await assert.rejects(startServer({ ...base, speculative: { proposer: 'draft' }, draftModel: '/nonexistent/draft' }), /draftModel \/nonexistent\/draft: /);
});

test('a server speculating with an EAGLE-3 head (--speculative eagle3 --draft-model): the same text, usage.speculation, the startup note', async () => {
  const root = resolve(import.meta.dirname, '../..');
  const lines: string[] = [];
  const base = { model: `${root}/models/demo`, device: 'cpu' as const, port: 0, servedModelName: 'm', maxBatch: 4 };
  const [plainDemo, eagle] = await Promise.all([startServer(base),
    startServer({ ...base, speculative: { proposer: 'eagle3', numDraftTokens: 3 }, draftModel: `${root}/models/demo-eagle3`, log: (l) => lines.push(l) })]);
  try {
    assert.ok(lines.some((l) => /^speculative decoding: drafts of the EAGLE-3 head \(target layers 1, 3, 5, draft vocabulary 2048\), 3 draft tokens$/.test(l)), lines.join('\n'));
    const body = { model: 'm', prompt: 'def fibonacci(n):', max_tokens: 32, temperature: 0, ignore_eos: true, n: 2 };
    const a = await (await post(plainDemo, '/v1/completions', body)).json();
    const b = await (await post(eagle, '/v1/completions', body)).json();
    assert.deepEqual(b.choices.map((c: { text: string }) => c.text), a.choices.map((c: { text: string }) => c.text));
    assert.ok(b.usage.speculation.draft_tokens > 0, JSON.stringify(b.usage));
  } finally {
    await Promise.all([plainDemo.close(0), eagle.close(0)]);
  }
  await assert.rejects(startServer({ ...base, speculative: { proposer: 'eagle3' } }), /speculative eagle3 needs draftModel/);
  await assert.rejects(startServer({ ...base, speculative: { proposer: 'eagle3' }, draftModel: LLAMA }), /draftModel .*is not an EAGLE-3 head/);
});

test('a request\'s own "speculative": false turns it off, an object turns it on or changes it; bad values are 400s naming it', async () => {
  const body = { ...completion, n: 1 };
  const off = await (await post(spec, '/v1/completions', { ...body, speculative: false })).json();
  assert.equal(off.usage.speculation, undefined, 'speculative: false decodes plainly');
  const a = await (await post(plain, '/v1/completions', body)).json();
  const on = await (await post(plain, '/v1/completions', { ...body, speculative: { num_draft_tokens: 2, ngram_min: 1 } })).json();
  assert.equal(on.choices[0].text, a.choices[0].text);
  assert.ok(on.usage.speculation.draft_tokens > 0, JSON.stringify(on.usage));
  const chat = await (await post(plain, '/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'abc abc abc abc' }], max_tokens: 12, temperature: 0, ignore_eos: true, speculative: { proposer: 'ngram', ngram_min: 1 } })).json();
  assert.ok(chat.usage.speculation.draft_tokens >= 0);
  for (const [value, message] of [
    ['yes', /speculative must be false or an object/],
    [{ proposer: 'medusa' }, /speculative.proposer must be "ngram", "draft" or "eagle3", got "medusa"/],
    [{ num_draft_tokens: 0 }, /speculative.num_draft_tokens must be 'adaptive' or an integer from 1 to 64, got 0/],
    [{ ngram_min: 4, ngram_max: 2 }, /speculative.ngram_min \(4\) must not be above speculative.ngram_max \(2\)/],
    [{ depth: 3 }, /speculative: unknown field "depth"/],
    [{ proposer: 'draft' }, /proposer 'draft' needs a draft model/],
  ] as const) {
    const res = await fetch(`${plain.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, speculative: value }) });
    assert.equal(res.status, 400, JSON.stringify(value));
    const err = (await res.json()).error;
    assert.match(err.message, message);
  }
});

test('Anthropic messages take the request\'s "speculative" too', async () => {
  const msg = { model: 'm', max_tokens: 16, messages: [{ role: 'user', content: 'abc abc abc abc' }] };
  const off = await (await post(spec, '/v1/messages', { ...msg, speculative: false })).json();
  assert.equal(off.usage.speculation, undefined, JSON.stringify(off.usage));
  const on = await (await post(plain, '/v1/messages', { ...msg, speculative: { ngram_min: 1, num_draft_tokens: 3 } })).json();
  const base = await (await post(plain, '/v1/messages', msg)).json();
  assert.deepEqual(on.content, base.content);
  assert.ok(on.usage.speculation !== undefined, JSON.stringify(on.usage));
  const bad = await fetch(`${plain.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...msg, speculative: { proposer: 'x' } }) });
  assert.equal(bad.status, 400);
  assert.match(JSON.stringify(await bad.json()), /speculative.proposer must be/);
});
