// Request bodies as large as a body limit allows, made of many small JSON values: the shapes whose
// parsing, per-element checks and copies between threads cost the most per byte (a JSON.parse of
// 4 MiB of them alone takes tens of milliseconds). Shared by test/server/body-worker.test.ts and
// bench/server-stall.ts.

export type HeavyRoute = '/v1/chat/completions' | '/v1/completions' | '/v1/messages' | '/v1/messages/count_tokens';

export interface HeavyBody {
  name: string;
  route: HeavyRoute;
  body: string;
}

/**
 * `prefix` + as many `unit(i)`, comma-separated, as fit in `fill` bytes (ASCII units) + `suffix`;
 * the count of units comes back with it.
 */
function filled(fill: number, prefix: string, unit: (i: number) => string, suffix: string): { text: string; count: number } {
  const parts: string[] = [];
  let bytes = prefix.length + suffix.length;
  for (let i = 0; ; i++) {
    const u = unit(i);
    if (bytes + u.length + 1 > fill) break;
    parts.push(u);
    bytes += u.length + 1;
  }
  return { text: prefix + parts.join(',') + suffix, count: parts.length };
}

/**
 * One body of each shape, each at most `fill` bytes (a --max-body less some room), for the model
 * named `model`. The answers are 400s (a count or size limit, the context) or, for
 * chat_template_kwargs and a logit_bias of every token, a one-token completion.
 */
export function heavyBodies(fill: number, model: string, vocabSize: number): HeavyBody[] {
  const m = JSON.stringify(model);
  const hi = '{"role":"user","content":"hi"}';
  const chat = (rest: string) => `{"model":${m},"max_tokens":1,"temperature":0,"messages":[${hi}],${rest}}`;
  const out: HeavyBody[] = [];
  const add = (name: (count: number) => string, route: HeavyRoute, prefix: string, unit: (i: number) => string, suffix: string) => {
    const { text, count } = filled(fill, prefix, unit, suffix);
    out.push({ name: name(count), route, body: text });
  };
  add((n) => `chat, ${n} two-letter messages`, '/v1/chat/completions', `{"model":${m},"max_tokens":1,"messages":[`, () => hi, ']}');
  {
    const depth = Math.floor((fill - chat('"metadata":').length) / 2);
    out.push({ name: `chat, metadata nested ${depth} deep`, route: '/v1/chat/completions', body: chat(`"metadata":${'['.repeat(depth)}${']'.repeat(depth)}`) });
  }
  add((n) => `chat, logit_bias with ${n} entries`, '/v1/chat/completions', chat('"logit_bias":{').slice(0, -1), (i) => `"${i}":1`, '}}');
  out.push({
    name: `chat, logit_bias of all ${vocabSize} tokens, n 16`, route: '/v1/chat/completions',
    body: chat(`"n":16,"logit_bias":{${Array.from({ length: vocabSize }, (_, i) => `"${i}":${(i % 7) - 3}`).join(',')}}`),
  });
  add((n) => `chat, stop with ${n} strings`, '/v1/chat/completions', chat('"stop":[').slice(0, -1), () => '"ab"', ']}');
  add((n) => `chat, tools with ${n} functions`, '/v1/chat/completions', chat('"tools":[').slice(0, -1),
    (i) => `{"type":"function","function":{"name":"f${i}"}}`, ']}');
  add((n) => `chat, guided_choice of ${n} strings`, '/v1/chat/completions', chat('"guided_choice":[').slice(0, -1), (i) => `"c${i}"`, ']}');
  add((n) => `chat, response_format schema enum of ${n} strings`, '/v1/chat/completions',
    chat('"response_format":{"type":"json_schema","json_schema":{"name":"e","schema":{"enum":[').slice(0, -1), (i) => `"e${i}"`, ']}}}}');
  add((n) => `chat, chat_template_kwargs with ${n} keys`, '/v1/chat/completions', chat('"chat_template_kwargs":{').slice(0, -1), (i) => `"k${i}":${i}`, '}}');
  add((n) => `completions, prompt of ${n} token ids`, '/v1/completions', `{"model":${m},"max_tokens":1,"prompt":[`, (i) => String(i % vocabSize), ']}');
  add((n) => `completions, prompt of ${n} strings`, '/v1/completions', `{"model":${m},"max_tokens":1,"prompt":[`, () => '"ab"', ']}');
  const blocks = `{"model":${m},"max_tokens":1,"messages":[{"role":"user","content":[`;
  add((n) => `messages, ${n} text blocks`, '/v1/messages', blocks, () => '{"type":"text","text":"hi"}', ']}]}');
  add((n) => `count_tokens, ${n} text blocks`, '/v1/messages/count_tokens', blocks, () => '{"type":"text","text":"hi"}', ']}]}');
  return out;
}
