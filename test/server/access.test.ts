// CORS (--cors-origin), the per-request log line (--log-requests, on by default) and GET/HEAD /.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { requestLine } from '../../src/server/access.ts';
import { checkCorsOrigin } from '../../src/server/access.ts';
import { postJson, runServeCli, spawnServer, type Spawned } from './helpers.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';

const servers: Spawned[] = [];
after(async () => {
  for (const s of servers) await s.stop();
});

/** a raw request: status and headers (a preflight has no body to parse) */
function send(url: string, method: string, headers: Record<string, string>, body?: string): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, headers }, (res) => {
      let text = '';
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('CORS: allowed origins get the headers and their preflights a 204 before authentication; others nothing', async () => {
  const srv = await spawnServer({ args: ['--cors-origin', 'http://localhost:5173', '--cors-origin', 'https://app.example', '--api-key', 'k'] });
  servers.push(srv);
  const pre = await send(`${srv.url}/v1/chat/completions`, 'OPTIONS', {
    Origin: 'http://localhost:5173', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type',
  });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers['access-control-allow-origin'], 'http://localhost:5173');
  assert.equal(pre.headers['access-control-allow-headers'], 'authorization, content-type');
  assert.match(String(pre.headers['access-control-allow-methods']), /POST/);
  assert.equal(pre.headers.vary, 'Origin');
  const body = JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  const ok = await send(`${srv.url}/v1/chat/completions`, 'POST', { Origin: 'https://app.example', Authorization: 'Bearer k', 'Content-Type': 'application/json' }, body);
  assert.equal(ok.status, 200);
  assert.equal(ok.headers['access-control-allow-origin'], 'https://app.example');
  // an error answer carries it too (the browser must be able to read the 401)
  const denied = await send(`${srv.url}/v1/chat/completions`, 'POST', { Origin: 'https://app.example', 'Content-Type': 'application/json' }, body);
  assert.equal(denied.status, 401);
  assert.equal(denied.headers['access-control-allow-origin'], 'https://app.example');
  const other = await send(`${srv.url}/v1/chat/completions`, 'OPTIONS', { Origin: 'https://evil.example', 'Access-Control-Request-Method': 'POST' });
  assert.equal(other.headers['access-control-allow-origin'], undefined);
  assert.equal(other.status, 405);
});

test('CORS is off by default; * allows any origin; a bad --cors-origin stops the server with the reason', async () => {
  const plain = await spawnServer();
  servers.push(plain);
  const r = await send(`${plain.url}/health`, 'GET', { Origin: 'http://localhost:3000' });
  assert.equal(r.status, 200);
  assert.equal(r.headers['access-control-allow-origin'], undefined);
  const any = await spawnServer({ args: ['--cors-origin', '*'] });
  servers.push(any);
  const a = await send(`${any.url}/v1/models`, 'GET', { Origin: 'http://whatever.test:8080' });
  assert.equal(a.headers['access-control-allow-origin'], '*');
  assert.equal(a.headers.vary, undefined);
  const dir = writeTinyLlama();
  for (const [bad, why] of [['localhost:3000', /is not an origin/], ['http://x.test/path', /did you mean "http:\/\/x\.test"/], ['ftp://x.test', /scheme must be http or https/]] as const) {
    const cli = await runServeCli(['--model', dir, '--port', '0', '--cors-origin', bad]);
    assert.notEqual(cli.code, 0);
    assert.match(cli.stderr, /--cors-origin/);
    assert.match(cli.stderr, why);
  }
  assert.equal(checkCorsOrigin('https://a.example:8443'), undefined);
});

test('one log line per request: method, path, status, tokens, ms; --no-log-requests turns it off; GET and HEAD /', async () => {
  const srv = await spawnServer();
  servers.push(srv);
  const r = await postJson(`${srv.url}/v1/completions`, { model: 'tiny', prompt: 'hello', max_tokens: 3, ignore_eos: true });
  assert.equal(r.status, 200);
  const root = await send(`${srv.url}/`, 'GET', {});
  assert.equal(root.status, 200);
  assert.deepEqual(JSON.parse(root.body), { object: 'server', name: 'llmts', model: 'tiny' });
  const head = await send(`${srv.url}/`, 'HEAD', {});
  assert.equal(head.status, 200);
  assert.equal(head.body, '');
  await send(`${srv.url}/nope\u0007`.replace('\u0007', '%07'), 'GET', {});
  const lines = () => srv.stderr().split('\n').filter((l) => /^llmts serve: (GET|POST|HEAD) /.test(l));
  const wait = async (n: number) => {
    for (let i = 0; i < 100 && lines().length < n; i++) await new Promise((res) => setTimeout(res, 20));
  };
  await wait(4);
  const got = lines();
  assert.ok(got.some((l) => /^llmts serve: POST \/v1\/completions 200 \d+ prompt \+ 3 completion tokens \d+ ms$/.test(l)), got.join('\n'));
  assert.ok(got.some((l) => /^llmts serve: GET \/ 200 \d+ ms$/.test(l)), got.join('\n'));
  assert.ok(got.some((l) => /^llmts serve: HEAD \/ 200 \d+ ms$/.test(l)), got.join('\n'));
  assert.ok(got.some((l) => /^llmts serve: GET \/nope%07 404 \d+ ms$/.test(l)), got.join('\n'));
  const quiet = await spawnServer({ args: ['--no-log-requests'] });
  servers.push(quiet);
  assert.equal((await postJson(`${quiet.url}/v1/completions`, { model: 'tiny', prompt: 'hello', max_tokens: 2 })).status, 200);
  await new Promise((res) => setTimeout(res, 100));
  assert.doesNotMatch(quiet.stderr(), /^llmts serve: POST /m);
});

test('requestLine: control characters replaced and long paths cut (the client chose them)', () => {
  assert.equal(requestLine('GET', '/a\nb\u0000c', '404', 1.4), 'llmts serve: GET /a?b?c 404 1 ms');
  const long = requestLine('GET', `/${'x'.repeat(500)}`, '404', 2);
  assert.ok(long.length < 260 && long.includes('...'), long);
  assert.equal(requestLine('POST', '/v1/completions', '200', 12, { promptTokens: 5, completionTokens: 2 }), 'llmts serve: POST /v1/completions 200 5 prompt + 2 completion tokens 12 ms');
});
