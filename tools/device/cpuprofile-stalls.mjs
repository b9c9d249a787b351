// Finds event-loop stalls in V8 CPU profiles (node --cpu-prof) and says what ran during each:
// a stall is a run of consecutive samples that never reaches "(idle)" (the loop waiting for I/O)
// lasting at least MIN_MS. For each, the functions present in the most of its samples (inclusive
// time), deepest first among equals, so the caller chain that held the loop reads top-down.
//   node tools/device/cpuprofile-stalls.mjs [--min-ms 20] [--top 12] [--stalls 8] PROFILE.cpuprofile...
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';

const args = process.argv.slice(2);
let minMs = 20;
let top = 12;
let stallsShown = 8;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--min-ms') minMs = Number(args[++i]);
  else if (args[i] === '--top') top = Number(args[++i]);
  else if (args[i] === '--stalls') stallsShown = Number(args[++i]);
  else files.push(args[i]);
}
if (files.length === 0) {
  console.error('usage: cpuprofile-stalls.mjs [--min-ms N] [--top N] [--stalls N] PROFILE.cpuprofile...');
  process.exit(2);
}

for (const file of files) {
  const prof = JSON.parse(readFileSync(file, 'utf8'));
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const label = (n) => {
    const f = n.callFrame;
    const where = f.url ? `${basename(f.url)}:${f.lineNumber + 1}` : '';
    return `${f.functionName || '(anonymous)'} ${where}`.trim();
  };
  const stackOf = (id) => {
    const out = [];
    for (let x = id; x !== undefined; x = parent.get(x)) out.push(x);
    return out; // leaf first
  };
  const stalls = [];
  let cur = null;
  let t = prof.startTime;
  for (let i = 0; i < prof.samples.length; i++) {
    t += prof.timeDeltas[i] ?? 0;
    const dt = (prof.timeDeltas[i + 1] ?? 0) / 1000; // this sample stands for the time to the next
    const idle = byId.get(prof.samples[i]).callFrame.functionName === '(idle)';
    if (idle) {
      if (cur && cur.ms >= minMs) stalls.push(cur);
      cur = null;
      continue;
    }
    if (!cur) cur = { startMs: (t - prof.startTime) / 1000, ms: 0, counts: new Map(), depth: new Map() };
    cur.ms += dt;
    const stack = stackOf(prof.samples[i]);
    const seen = new Set();
    stack.forEach((id, k) => {
      const l = label(byId.get(id));
      if (seen.has(l)) return;
      seen.add(l);
      cur.counts.set(l, (cur.counts.get(l) ?? 0) + dt);
      cur.depth.set(l, Math.max(cur.depth.get(l) ?? 0, stack.length - k));
    });
  }
  if (cur && cur.ms >= minMs) stalls.push(cur);
  console.log(`${basename(file)}: ${prof.samples.length} samples, ${stalls.length} stalls of ${minMs} ms or more`);
  for (const s of stalls.sort((a, b) => b.ms - a.ms).slice(0, stallsShown)) {
    console.log(`  stall at ${s.startMs.toFixed(0)} ms: ${s.ms.toFixed(1)} ms`);
    const rows = [...s.counts].filter(([l]) => l !== '(root)')
      .sort((a, b) => b[1] - a[1] || s.depth.get(a[0]) - s.depth.get(b[0])).slice(0, top);
    for (const [l, ms] of rows) console.log(`    ${ms.toFixed(1).padStart(7)} ms  ${l}`);
  }
}
