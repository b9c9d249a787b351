// The OpenAI routes through the official `openai` client against a spawned `llmts serve`.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { spawnServer, postJson, parseSse, type Spawned } from './helpers.ts';

let srv: Spawned;
let client: OpenAI;

before(async () => {
  srv = await spawnServer();
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

type ChatParams = OpenAI.ChatCompletionCreateParamsNonStreaming;
type ChatStreamParams = OpenAI.ChatCompletionCreateParamsStreaming;
type CmplParams = OpenAI.CompletionCreateParamsNonStreaming;
type CmplStreamParams = OpenAI.CompletionCreateParamsStreaming;

const userMsg = (content: string) => [{ role: 'user' as const, content }];

async function chatStream(params: Omit<ChatStreamParams, 'stream'>) {
  const stream = await client.chat.completions.create({ ...params, stream: true } as ChatStreamParams);
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

async function completionStream(params: Omit<CmplStreamParams, 'stream'>) {
  const stream = await client.completions.create({ ...params, stream: true } as CmplStreamParams);
  const chunks: OpenAI.Completion[] = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

/** per choice index: concatenated text and the finish reason */
function collect(chunks: { choices: { index: number; text?: string; delta?: { content?: string | null }; finish_reason: string | null }[] }[]) {
  const out = new Map<number, { text: string; finish?: string }>();
  for (const c of chunks)
    for (const ch of c.choices) {
      const st = out.get(ch.index) ?? { text: '' };
      st.text += ch.text ?? ch.delta?.content ?? '';
      if (ch.finish_reason) {
        assert.equal(st.finish, undefined, `choice ${ch.index} finished twice`);
        st.finish = ch.finish_reason;
      }
      out.set(ch.index, st);
    }
  return out;
}

test('GET /v1/models lists the served model', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny']);
  assert.equal(models.data[0].object, 'model');
  assert.equal((await client.models.retrieve('tiny')).id, 'tiny');
  await assert.rejects(client.models.retrieve('other'), (e: unknown) => e instanceof OpenAI.NotFoundError);
});

test('chat: non-streaming and streaming give the same greedy text; usage and include_usage', async () => {
  const params = { model: 'tiny', messages: userMsg('hello there'), max_tokens: 16, temperature: 0, ignore_eos: true } as ChatParams;
  const full = await client.chat.completions.create(params);
  assert.equal(full.object, 'chat.completion');
  assert.equal(full.choices.length, 1);
  assert.equal(full.choices[0].message.role, 'assistant');
  assert.equal(full.choices[0].finish_reason, 'length');
  assert.equal(full.usage!.completion_tokens, 16);
  assert.ok(full.usage!.prompt_tokens > 10);
  assert.equal(full.usage!.total_tokens, full.usage!.prompt_tokens + 16);
  assert.equal(full.usage!.prompt_tokens_details?.cached_tokens, 0);
  assert.equal(full.choices[0].logprobs, null);

  const chunks = await chatStream({ ...params, stream_options: { include_usage: true } });
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  // the same prompt again: its blocks (16 tokens each) but the last prompt token's come from the prefix cache
  const { prompt_tokens_details: cachedDetails, ...lastUsage } = last.usage!;
  const { prompt_tokens_details: _, ...fullUsage } = full.usage!;
  assert.deepEqual(lastUsage, fullUsage);
  assert.equal(cachedDetails?.cached_tokens, Math.floor((full.usage!.prompt_tokens - 1) / 16) * 16);
  for (const c of chunks.slice(0, -1)) {
    assert.equal(c.usage, null);
    assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(c.id, chunks[0].id);
  }
  const got = collect(chunks).get(0)!;
  assert.equal(got.text, full.choices[0].message.content);
  assert.equal(got.finish, 'length');

  // without include_usage there is no usage field at all
  const plain = await chatStream(params);
  assert.ok(plain.every((c) => !('usage' in c)));
  assert.equal(collect(plain).get(0)!.text, full.choices[0].message.content);
});

test('completions: string, string list, token ids and token-id lists; n per prompt', async () => {
  const base = { model: 'tiny', max_tokens: 10, temperature: 0, ignore_eos: true };
  const a = await client.completions.create({ ...base, prompt: 'hello' } as CmplParams);
  const b = await client.completions.create({ ...base, prompt: 'world wide' } as CmplParams);
  assert.equal(a.object, 'text_completion');
  assert.equal(a.usage!.prompt_tokens, 5);
  assert.equal(a.choices[0].finish_reason, 'length');
  // the tiny tokenizer is byte-level with no BOS: "hello" is its bytes
  const ids = await client.completions.create({ ...base, prompt: [104, 101, 108, 108, 111] } as CmplParams);
  assert.equal(ids.choices[0].text, a.choices[0].text);
  const lists = await client.completions.create({ ...base, prompt: [[104, 101, 108, 108, 111], [...Buffer.from('world wide')]] } as CmplParams);
  assert.deepEqual(lists.choices.map((c) => c.text), [a.choices[0].text, b.choices[0].text]);
  // two prompts x n=2: choice index = prompt * n + i; greedy choices of a prompt agree
  const multi = await client.completions.create({ ...base, prompt: ['hello', 'world wide'], n: 2 } as CmplParams);
  assert.deepEqual(multi.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(multi.choices.map((c) => c.text), [a.choices[0].text, a.choices[0].text, b.choices[0].text, b.choices[0].text]);
  assert.equal(multi.usage!.prompt_tokens, 5 + 10);
  assert.equal(multi.usage!.completion_tokens, 40);

  const streamed = collect(await completionStream({ ...base, prompt: ['hello', 'world wide'] }));
  assert.equal(streamed.get(0)!.text, a.choices[0].text);
  assert.equal(streamed.get(1)!.text, b.choices[0].text);
  assert.equal(streamed.get(1)!.finish, 'length');
});

test('n > 1 with a seed: choice i uses seed + i, repeatable, streaming too', async () => {
  const base = { model: 'tiny', messages: userMsg('tell me'), max_tokens: 12, temperature: 1, ignore_eos: true } as ChatParams;
  const three = await client.chat.completions.create({ ...base, n: 3, seed: 42 });
  assert.deepEqual(three.choices.map((c) => c.index), [0, 1, 2]);
  const texts = three.choices.map((c) => c.message.content);
  assert.equal(new Set(texts).size, 3, 'independent samples differ');
  assert.equal(three.usage!.completion_tokens, 36);
  const again = await client.chat.completions.create({ ...base, n: 3, seed: 42 });
  assert.deepEqual(again.choices.map((c) => c.message.content), texts);
  const single = await client.chat.completions.create({ ...base, n: 1, seed: 43 });
  assert.equal(single.choices[0].message.content, texts[1]);
  const streamed = collect(await chatStream({ ...base, n: 3, seed: 42 }));
  assert.deepEqual([0, 1, 2].map((i) => streamed.get(i)!.text), texts);
  assert.deepEqual([0, 1, 2].map((i) => streamed.get(i)!.finish), ['length', 'length', 'length']);
});

/** a 3-character window of `text` made of printable ASCII, starting at or after `from` */
function pickStop(text: string, from: number): string {
  for (let i = from; i + 3 <= text.length; i++) {
    const s = text.slice(i, i + 3);
    if (/^[\x21-\x7e]{3}$/.test(s) && text.indexOf(s) === i) return s;
  }
  throw new Error(`no printable window in ${JSON.stringify(text)}`);
}

test('stop strings end the text before the stop; never a partial stop string streamed', async () => {
  const prompts = ['The quick brown fox', 'jumps over', 'the lazy dog', 'lorem ipsum dolor'];
  let checked = 0;
  for (const prompt of prompts) {
    const base = { model: 'tiny', prompt, max_tokens: 60, temperature: 0, ignore_eos: true };
    const full = (await client.completions.create(base as CmplParams)).choices[0].text;
    let stop: string;
    try {
      stop = pickStop(full, 4);
    } catch {
      continue;
    }
    const expected = full.slice(0, full.indexOf(stop));
    const r = await client.completions.create({ ...base, stop: [stop, 'never-appears-zz'] } as CmplParams);
    assert.equal(r.choices[0].text, expected);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal((r.choices[0] as unknown as { stop_reason: string }).stop_reason, stop);
    const chunks = await completionStream({ ...base, stop });
    const streamed = collect(chunks).get(0)!;
    assert.equal(streamed.text, expected);
    assert.equal(streamed.finish, 'stop');
    for (const c of chunks) for (const ch of c.choices) assert.ok(!ch.text.includes(stop));
    // chat as well
    const chatBase = { model: 'tiny', messages: userMsg(prompt), max_tokens: 60, temperature: 0, ignore_eos: true } as ChatParams;
    const chatFull = (await client.chat.completions.create(chatBase)).choices[0].message.content!;
    let chatStop: string;
    try {
      chatStop = pickStop(chatFull, 4);
    } catch {
      continue;
    }
    const chatExpected = chatFull.slice(0, chatFull.indexOf(chatStop));
    const chatStreamed = collect(await chatStream({ ...chatBase, stop: chatStop })).get(0)!;
    assert.equal(chatStreamed.text, chatExpected);
    assert.equal(chatStreamed.finish, 'stop');
    assert.equal((await client.chat.completions.create({ ...chatBase, stop: chatStop })).choices[0].message.content, chatExpected);
    checked++;
  }
  assert.ok(checked >= 2, `only ${checked} prompts had a usable stop window`);
});

test('chat logprobs: content entries with token, logprob, bytes and top_logprobs; stream agrees', async () => {
  const params = { model: 'tiny', messages: userMsg('abc'), max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3 } as ChatParams;
  const r = await client.chat.completions.create(params);
  const content = r.choices[0].logprobs!.content!;
  assert.equal(content.length, 8);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes) && e.bytes.length >= 1);
    assert.equal(e.top_logprobs.length, 3);
    for (let k = 1; k < 3; k++) assert.ok(e.top_logprobs[k - 1].logprob >= e.top_logprobs[k].logprob);
    // greedy: the chosen token is the best one
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
  }
  // the tokens' bytes make up the text (byte-level tokens; all printable output decodes exactly)
  const bytes = Buffer.from(content.flatMap((e) => e.bytes ?? [])).toString('utf8');
  assert.equal(bytes, r.choices[0].message.content);

  const chunks = await chatStream(params);
  const streamed = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.logprobs?.content ?? []));
  // the same tokens; logprobs to float rounding (the repeated prompt's blocks now come from the
  // prefix cache, so its last block is computed in a smaller chunk)
  const shape = (es: typeof content) => es.map((e) => ({ ...e, logprob: 0, top_logprobs: e.top_logprobs.map((t) => ({ ...t, logprob: 0 })) }));
  assert.deepEqual(shape(streamed), shape(content));
  streamed.forEach((e, i) => {
    assert.ok(Math.abs(e.logprob - content[i].logprob) < 1e-5);
    e.top_logprobs.forEach((t, k) => assert.ok(Math.abs(t.logprob - content[i].top_logprobs[k].logprob) < 1e-5));
  });

  const noTop = await client.chat.completions.create({ ...params, top_logprobs: undefined } as ChatParams);
  assert.deepEqual(noTop.choices[0].logprobs!.content!.map((e) => e.top_logprobs.length), Array(8).fill(0));
});

test('completions logprobs: legacy tokens, token_logprobs, top_logprobs, text_offset', async () => {
  const params = { model: 'tiny', prompt: 'xyz', max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 2 } as CmplParams;
  const r = await client.completions.create(params);
  const lp = r.choices[0].logprobs!;
  assert.equal(lp.tokens!.length, 8);
  assert.equal(lp.token_logprobs!.length, 8);
  assert.equal(lp.top_logprobs!.length, 8);
  assert.equal(lp.text_offset!.length, 8);
  assert.equal(lp.text_offset![0], 0);
  lp.top_logprobs!.forEach((top, k) => {
    assert.ok(Object.keys(top).length >= 2 && Object.keys(top).length <= 3);
    assert.equal(top[lp.tokens![k]], lp.token_logprobs![k]);
  });
  for (let k = 1; k < 8; k++) assert.ok(lp.text_offset![k] >= lp.text_offset![k - 1]);

  const chunks = await completionStream(params);
  const s = { tokens: [] as string[], token_logprobs: [] as number[], text_offset: [] as number[] };
  for (const c of chunks)
    for (const ch of c.choices)
      if (ch.logprobs) {
        s.tokens.push(...ch.logprobs.tokens!);
        s.token_logprobs.push(...ch.logprobs.token_logprobs!);
        s.text_offset.push(...ch.logprobs.text_offset!);
      }
  assert.deepEqual(s, { tokens: lp.tokens, token_logprobs: lp.token_logprobs, text_offset: lp.text_offset });
});

test('logit_bias, penalties, top_k/min_p and max_completion_tokens are honoured', async () => {
  // +100 on byte "Q" makes it the greedy choice every step
  const r = await client.completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 5, temperature: 0, logit_bias: { 81: 100 } } as CmplParams);
  assert.equal(r.choices[0].text, 'QQQQQ');
  // a strong presence penalty then forbids repeating it
  const p = await client.completions.create({
    model: 'tiny', prompt: 'hi', max_tokens: 3, temperature: 0, logit_bias: { 81: 5 }, presence_penalty: 2, frequency_penalty: 2, top_k: 5, min_p: 0.01, repetition_penalty: 1.1,
  } as CmplParams);
  assert.equal(p.choices[0].finish_reason, 'length');
  const c = await client.chat.completions.create({ model: 'tiny', messages: userMsg('x'), max_completion_tokens: 4, temperature: 0, ignore_eos: true } as ChatParams);
  assert.equal(c.usage!.completion_tokens, 4);
});

test('no max_tokens: generation may run to the end of the context', async () => {
  const r = await postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt: 'abc', temperature: 0, ignore_eos: true });
  assert.equal(r.status, 200);
  assert.equal(r.body.choices[0].finish_reason, 'length');
  assert.equal(r.body.usage.prompt_tokens + r.body.usage.completion_tokens, 256);
});

test('raw SSE framing: data lines, blank-line separated, ending with [DONE]', async () => {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: userMsg('hi'), max_tokens: 3, stream: true }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type')!, /^text\/event-stream/);
  const text = await res.text();
  assert.ok(text.endsWith('data: [DONE]\n\n'));
  const frames = parseSse(text);
  assert.ok(frames.length >= 3);
  for (const f of frames.slice(0, -1)) JSON.parse(f.data);
});
