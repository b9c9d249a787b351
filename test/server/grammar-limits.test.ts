// Grammar limits through a spawned `llmts serve` on a tiny random model: a schema no JSON can
// satisfy (a required $ref recursion with no base case) is a 400 naming the field and the reason
// before any token, on every route that takes a schema; a run of hostile schemas leaves the
// server's memory (RSS and Node external memory, read from its own /metrics) within 100 MB of
// where it started; a large but fine schema still works; /metrics reports the compiled-grammar
// cache against its --grammar-cache budget.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, runServeCli, scrape, spawnServer, type Spawned } from './helpers.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

let srv: Spawned;
const BUDGET = 2 * 2 ** 20;

before(async () => {
  srv = await spawnServer({ model: { maxPositions: 4096 }, args: ['--grammar-cache', '2M'] });
});
after(async () => {
  await srv.stop();
  assert.doesNotMatch(srv.stderr(), /internal error/);
});

const user = [{ role: 'user', content: 'hi' }];
const chat = (extra: Record<string, unknown>) => postJson(`${srv.url}/v1/chat/completions`, { model: 'tiny', messages: user, max_tokens: 64, ...extra });
const schemaFormat = (schema: unknown) => ({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });

const SELF = { type: 'object', properties: { a: { $ref: '#' } }, required: ['a'] };
const UNSATISFIABLE = /no JSON value satisfies it: its recursion \(a \$ref back into itself\) has no way to end/;

function assertRefused(r: { status: number; body: any }, param: string, message: RegExp): void {
  assert.equal(r.status, 400, JSON.stringify(r.body));
  assert.equal(r.body.error.type, 'invalid_request_error');
  assert.equal(r.body.error.param, param);
  assert.match(r.body.error.message, message);
}

test('an unsatisfiable recursive schema is a 400 with the reason on every route, not a generation ending in error', async () => {
  assertRefused(await chat(schemaFormat(SELF)), 'response_format', UNSATISFIABLE);
  assertRefused(await chat({ guided_json: SELF }), 'guided_json', UNSATISFIABLE);
  assertRefused(await postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt: 'x', max_tokens: 8, structured_outputs: { json: SELF } }),
    'structured_outputs', UNSATISFIABLE);
  const tools = [{ type: 'function', function: { name: 'f', parameters: SELF } }];
  assertRefused(await chat({ tools, tool_choice: 'required' }), 'tools', UNSATISFIABLE);
  const m = await postJson(`${srv.url}/v1/messages`, {
    model: 'tiny', max_tokens: 16, messages: user, tools: [{ name: 'f', input_schema: SELF }], tool_choice: { type: 'any' },
  });
  assert.equal(m.status, 400, JSON.stringify(m.body));
  assert.equal(m.body.error.type, 'invalid_request_error');
  assert.match(m.body.error.message, UNSATISFIABLE);
  // the same shape with a way out works, and its output is the JSON it describes
  const ok = await chat({ ...schemaFormat({ type: 'object', properties: { a: { $ref: '#' } } }), max_tokens: 256 });
  assert.equal(ok.status, 200, JSON.stringify(ok.body));
  if (ok.body.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(ok.body.choices[0].message.content), 'object');
  assert.notEqual(ok.body.choices[0].finish_reason, 'error');
});

/** hostile schemas and grammars, `k` making each distinct */
function hostile(k: number): Record<string, unknown>[] {
  const defs: Record<string, unknown> = { d0: { type: 'integer' } };
  for (let i = 1; i <= 30; i++) defs[`d${i}`] = { type: 'array', prefixItems: [{ $ref: `#/$defs/d${i - 1}` }, { $ref: `#/$defs/d${i - 1}` }], items: false };
  let deep: unknown = { type: 'integer' };
  for (let i = 0; i < 60; i++) deep = { type: 'object', properties: { [`a${k}`]: deep }, required: [`a${k}`] };
  return [
    schemaFormat({ type: 'object', properties: { [`p${k}`]: { $ref: '#' } }, required: [`p${k}`] }),
    schemaFormat({ $defs: { n: { type: 'array', items: { $ref: '#/$defs/n' }, minItems: 1 + k } }, $ref: '#/$defs/n' }),
    schemaFormat({ $defs: defs, $ref: '#/$defs/d30', title: `t${k}` }),
    schemaFormat(deep),
    schemaFormat({ type: 'array', items: { type: 'integer' }, minItems: 1_000_000 + k }),
    { guided_regex: `(a{1000}){${1000 + k}}` },
    { guided_grammar: `root ::= "x" root${k}\nroot${k} ::= "y" root` },
    { guided_grammar: `root ::= ${'('.repeat(300)}"a${k}"${')'.repeat(300)}` },
  ];
}

async function memory(): Promise<{ rss: number; external: number }> {
  const m = await scrape(srv.url);
  return { rss: m.get('llmts_process_resident_memory_bytes')!, external: m.get('llmts_nodejs_external_memory_bytes')! };
}

test('memory after many hostile schemas stays within 100 MB of where it started', async () => {
  // the grammar compiler loaded and a grammar cached first: that is the baseline
  const warm = await chat({ ...schemaFormat({ type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] }), max_tokens: 16 });
  assert.equal(warm.status, 200);
  const base = await memory();
  assert.ok(base.rss > 0 && base.external > 0, JSON.stringify(base));
  let refusals = 0;
  for (let k = 0; k < 4; k++) {
    for (const body of hostile(k)) {
      const r = await chat(body);
      assert.equal(r.status, 400, `${JSON.stringify(body).slice(0, 120)}: ${JSON.stringify(r.body).slice(0, 300)}`);
      assert.equal(r.body.error.type, 'invalid_request_error');
      refusals++;
    }
  }
  const end = await memory();
  const MB = 1e6;
  assert.ok(end.rss - base.rss < 100 * MB, `RSS ${base.rss / MB} MB -> ${end.rss / MB} MB`);
  assert.ok(end.external - base.external < 100 * MB, `external ${base.external / MB} MB -> ${end.external / MB} MB`);
  const m = await scrape(srv.url);
  assert.ok(m.get('llmts_grammar_refused_total')! >= refusals, `refused ${m.get('llmts_grammar_refused_total')}`);
  // the server still serves structured output
  const after = await chat({ ...schemaFormat({ type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] }), max_tokens: 16 });
  assert.equal(after.status, 200);
});

test('a large but fine schema still works', async () => {
  const n = 120;
  const schema = {
    type: 'object',
    properties: Object.fromEntries(Array.from({ length: n }, (_, i) => [`field_${i}`, i % 3 === 0 ? { enum: ['a', 'b'] } : i % 3 === 1 ? { type: 'boolean' } : { type: 'integer', minimum: 0, maximum: 9 }])),
    required: Array.from({ length: n }, (_, i) => `field_${i}`),
    additionalProperties: false,
  };
  const r = await chat({ ...schemaFormat(schema), max_tokens: 3000, temperature: 0 });
  assert.equal(r.status, 200, JSON.stringify(r.body).slice(0, 500));
  const choice = r.body.choices[0];
  assert.equal(choice.finish_reason, 'stop');
  const v = JSON.parse(choice.message.content);
  assert.deepEqual(Object.keys(v), schema.required);
});

test('/metrics reports the compiled-grammar cache against its --grammar-cache budget', async () => {
  for (let i = 0; i < 3; i++) {
    const r = await chat({ ...schemaFormat({ type: 'object', properties: { [`k${i}`]: { type: 'string', maxLength: 4 } }, required: [`k${i}`] }), max_tokens: 16 });
    assert.equal(r.status, 200);
  }
  const m = await scrape(srv.url);
  assert.equal(m.get('llmts_grammar_cache_capacity_bytes'), BUDGET);
  assert.ok(m.get('llmts_grammar_cache_entries')! >= 3, `entries ${m.get('llmts_grammar_cache_entries')}`);
  const bytes = m.get('llmts_grammar_cache_bytes')!;
  assert.ok(bytes > 0 && bytes <= BUDGET, `bytes ${bytes}`);
  assert.ok(m.get('llmts_grammar_compiles_total')! >= 3);
  assert.ok(m.get('llmts_grammar_heap_bytes')! > 0);
  assert.ok(m.has('llmts_grammar_cache_evictions_total'));
  assert.ok(m.has('llmts_grammar_instances_replaced_total{thread="main"}'));
});

test('--grammar-cache below 1 MiB or not a size is a usage error naming the flag', async () => {
  const dir = writeTinyLlama();
  for (const bad of ['512K', 'lots']) {
    const r = await runServeCli(['--model', dir, '--port', '0', '--grammar-cache', bad]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /--grammar-cache/);
  }
});
