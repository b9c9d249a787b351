// Where a large request body's time goes on the event loop: for each body shape of
// test/helpers/heavy-bodies.ts (as large as --max-body allows, many small values), the phases on
// this thread (the nesting scan, JSON.parse, a structured clone of the parsed body: what copying it
// to another thread costs) and the event loop's busy time while the body is prepared for its route
// (request-prep.ts) on this thread, as a server with every body inline would, and on a text
// worker, as the server does past INLINE_BODY_BYTES (its bytes moved there, a compact answer
// back). Busy time is performance.eventLoopUtilization's active time over the preparation: the
// most the event loop can have been held at once. Each figure is the least of --runs runs.
//
//   node --import tsx bench/body-cost.ts [--model models/demo] [--max-body 4194304] [--runs 3] [--only name,name] [--json out.json]

import { writeFileSync } from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { ReferenceBackend } from '../src/backends/reference/reference-backend.ts';
import { Engine } from '../src/execution/engine.ts';
import { loadModel } from '../src/execution/load-model.ts';
import { DEFAULT_MAX_BODY_BYTES } from '../src/server/server.ts';
import { ServedModel } from '../src/server/served-model.ts';
import { jsonDepthExceeds, MAX_JSON_DEPTH } from '../src/server/json-depth.ts';
import type { BodyRoute } from '../src/server/request-prep.ts';
import { heavyBodies, type HeavyRoute } from '../test/helpers/heavy-bodies.ts';
import { benchCommit } from './commit.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/demo' },
    'max-body': { type: 'string', default: String(DEFAULT_MAX_BODY_BYTES) },
    runs: { type: 'string', default: '3' },
    only: { type: 'string' },
    json: { type: 'string' },
  },
});
const runs = Number(values.runs);
const ROUTES: Record<HeavyRoute, BodyRoute> = {
  '/v1/chat/completions': 'chat', '/v1/completions': 'completions', '/v1/messages': 'messages', '/v1/messages/count_tokens': 'count_tokens',
};

// the model's weights are never run here: the reference backend loads them without the native library
const loaded = await loadModel(new ReferenceBackend(), values.model!);
const engine = new Engine(loaded.model, loaded, { maxBatch: 1 });
const onLoop = new ServedModel('m', loaded, engine, undefined, { inlineBodyBytes: Number.MAX_SAFE_INTEGER });
const offLoop = new ServedModel('m', loaded, engine);

/** the least of `runs` timings of a synchronous step, ms */
function timed(f: () => unknown): number {
  let best = Infinity;
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    f();
    best = Math.min(best, performance.now() - t0);
  }
  return best;
}

/** the least of `runs` of (wall ms, event-loop active ms) while `f` prepares a body; its outcome's status */
async function busy(f: () => Promise<unknown>): Promise<{ wall: number; active: number; status: number }> {
  let wall = Infinity, active = Infinity, status = 0;
  for (let i = 0; i < runs; i++) {
    const e0 = performance.eventLoopUtilization();
    const t0 = performance.now();
    try {
      await f();
      status = 200;
    } catch (err) {
      status = (err as { status?: number }).status ?? 500;
    }
    wall = Math.min(wall, performance.now() - t0);
    active = Math.min(active, performance.eventLoopUtilization(e0).active);
  }
  return { wall, active, status };
}

interface Row { name: string; bytes: number; status: number; depthScan: number; parse: number; clone: number; inlineWall: number; inlineBusy: number; workerWall: number; workerBusy: number }
const rows: Row[] = [];
const only = values.only?.split(',').map((s) => s.trim());
// warm both paths (the worker's first start loads the tokenizer and template)
await offLoop.prepareBody('chat', Buffer.from(`{"messages":[{"role":"user","content":"hi"}],"user":"${'u'.repeat(70_000)}"}`));
console.log(`${'body'.padEnd(52)} ${'bytes'.padStart(8)} st | depth   parse   clone | inline wall  busy | worker wall  busy (ms)`);
for (const b of heavyBodies(Number(values['max-body']) - 200, 'm', onLoop.vocabSize)) {
  if (only && !only.some((o) => b.name.includes(o))) continue;
  const buf = Buffer.from(b.body);
  const text = buf.toString('utf8');
  const depthScan = timed(() => jsonDepthExceeds(buf, MAX_JSON_DEPTH));
  let parsed: unknown;
  const parse = timed(() => {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
  });
  const clone = parsed === undefined || jsonDepthExceeds(buf, MAX_JSON_DEPTH) ? NaN : timed(() => structuredClone(parsed));
  const route = ROUTES[b.route];
  const inl = await busy(() => onLoop.prepareBody(route, Buffer.from(b.body)));
  const wrk = await busy(() => offLoop.prepareBody(route, Buffer.from(b.body)));
  const row = { name: b.name, bytes: buf.length, status: wrk.status, depthScan, parse, clone, inlineWall: inl.wall, inlineBusy: inl.active, workerWall: wrk.wall, workerBusy: wrk.active };
  rows.push(row);
  const f = (x: number, w = 7) => (Number.isNaN(x) ? '-' : x.toFixed(1)).padStart(w);
  console.log(`${b.name.padEnd(52)} ${String(row.bytes).padStart(8)} ${row.status} | ${f(depthScan, 5)} ${f(parse)} ${f(clone)} | ${f(inl.wall, 11)} ${f(inl.active, 5)} | ${f(wrk.wall, 11)} ${f(wrk.active, 5)}`);
}
const worst = rows.reduce((a, r) => (r.workerBusy > a.workerBusy ? r : a), rows[0]!);
console.log(`the event loop's most busy time with the body on a worker: ${worst.workerBusy.toFixed(1)} ms (${worst.name}); inline, that body held it ${worst.inlineBusy.toFixed(1)} ms`);
console.log(`load ${os.loadavg()[0].toFixed(1)}`);
if (values.json) {
  writeFileSync(values.json, JSON.stringify({ commit: benchCommit(), date: new Date().toISOString().slice(0, 10), host: os.cpus()[0]?.model, model: values.model, runs, rows }, null, 2));
}
await onLoop.close();
await offLoop.close();
await loaded.model.backend.close();
