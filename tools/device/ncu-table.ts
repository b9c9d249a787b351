// Per-kernel table of a decode step measured by Nsight Compute: reads the raw CSV of a report
// (`ncu --import R.ncu-rep --csv --page raw > R.csv`, metrics gpu__time_duration.sum and
// dram__bytes_read.sum at least; bench/cuda-step-costs.sh makes one) and prints, per kernel name,
// its calls, mean / min / max duration and DRAM bytes read with the rate they imply against a copy
// bandwidth, then the kernels of one layer in order (from the second launch of the kernel that
// starts a layer). Each kernel is measured alone (ncu serializes them: no PDL overlap, no event
// nodes), so the sum of a layer's rows is above its time in the graph by what PDL hides.
//
//   node --import tsx tools/device/ncu-table.ts R.csv [--copy-gbps 4275] [--layer-start k_rope_qkv] [--json out.json]
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    'copy-gbps': { type: 'string', default: '4275' },
    'layer-start': { type: 'string', default: 'k_rope_qkv' },
    json: { type: 'string' },
  },
});
if (positionals.length !== 1) {
  console.error('usage: node --import tsx tools/device/ncu-table.ts REPORT.csv [--copy-gbps N] [--layer-start KERNEL] [--json OUT]');
  process.exit(2);
}

/** Rows of a CSV file with quoted fields (ncu quotes every field; numbers may hold thousands separators). */
export function parseCsv(text: string): string[][] {
  const rows: string[][] = [];
  let row: string[] = [], field = '', quoted = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (quoted) {
      if (ch === '"' && text[i + 1] === '"') {
        field += '"';
        i++;
      } else if (ch === '"') quoted = false;
      else field += ch;
    } else if (ch === '"') quoted = true;
    else if (ch === ',') {
      row.push(field);
      field = '';
    } else if (ch === '\n' || ch === '\r') {
      if (ch === '\r' && text[i + 1] === '\n') i++;
      row.push(field);
      field = '';
      if (row.length > 1 || row[0] !== '') rows.push(row);
      row = [];
    } else field += ch;
  }
  if (field !== '' || row.length > 0) {
    row.push(field);
    rows.push(row);
  }
  return rows;
}

const SCALE: Record<string, number> = { ns: 1e-3, us: 1, usecond: 1, ms: 1e3, msecond: 1e3, byte: 1, Kbyte: 1e3, Mbyte: 1e6, Gbyte: 1e9 };

const [header, units, ...data] = parseCsv(readFileSync(positionals[0]!, 'utf8'));
if (!header || !units) throw new Error(`${positionals[0]}: no header`);
const col = (name: string) => {
  const i = header.indexOf(name);
  if (i < 0) throw new Error(`${positionals[0]}: no column ${name} (columns: ${header.slice(0, 12).join(', ')}, ...)`);
  return i;
};
const num = (row: string[], i: number) => {
  const scale = SCALE[units[i] ?? ''] ?? 1;
  return Number((row[i] ?? '').replace(/,/g, '')) * scale;
};
const iName = col('Kernel Name'), iTime = col('gpu__time_duration.sum'), iRead = col('dram__bytes_read.sum');
const launches = data.map((r) => ({ name: r[iName]!, us: num(r, iTime), bytes: num(r, iRead) }));
const copy = Number(values['copy-gbps']);

const byName = new Map<string, { calls: number; us: number[]; bytes: number }>();
for (const l of launches) {
  const e = byName.get(l.name) ?? { calls: 0, us: [], bytes: 0 };
  e.calls++;
  e.us.push(l.us);
  e.bytes += l.bytes;
  byName.set(l.name, e);
}
const total = launches.reduce((a, l) => a + l.us, 0);
console.log(`${launches.length} launches, ${total.toFixed(1)} us in all (each alone); rates against ${copy} GB/s`);
console.log(`${'kernel'.padEnd(44)} ${'calls'.padStart(5)} ${'mean us'.padStart(8)} ${'min'.padStart(7)} ${'max'.padStart(7)} ${'MB read'.padStart(8)} ${'GB/s'.padStart(6)} ${'share'.padStart(6)}`);
const table = [...byName.entries()].sort((a, b) => b[1].us.reduce((x, y) => x + y, 0) - a[1].us.reduce((x, y) => x + y, 0));
for (const [name, e] of table) {
  const sum = e.us.reduce((a, b) => a + b, 0), mean = sum / e.calls, mb = e.bytes / e.calls / 1e6;
  console.log(`${name.slice(0, 44).padEnd(44)} ${String(e.calls).padStart(5)} ${mean.toFixed(1).padStart(8)} ` +
    `${Math.min(...e.us).toFixed(1).padStart(7)} ${Math.max(...e.us).toFixed(1).padStart(7)} ${mb.toFixed(1).padStart(8)} ` +
    `${((mb * 1e6) / (mean * 1e-6) / 1e9).toFixed(0).padStart(6)} ${((100 * sum) / total).toFixed(1).padStart(5)}%`);
}
// one layer: from the second launch of the layer's first kernel to the launch before the third
const starts = launches.flatMap((l, i) => (l.name === values['layer-start'] ? [i] : []));
let layer: typeof launches = [];
if (starts.length >= 3) {
  layer = launches.slice(starts[1], starts[2]);
  const sum = layer.reduce((a, l) => a + l.us, 0), bytes = layer.reduce((a, l) => a + l.bytes, 0);
  console.log(`one layer (launches ${starts[1]}-${starts[2]! - 1}): ${sum.toFixed(1)} us alone for ${(bytes / 1e6).toFixed(1)} MB ` +
    `(${((bytes / (copy * 1e9)) * 1e6).toFixed(1)} us at ${copy} GB/s)`);
  for (const l of layer) console.log(`  ${l.name.slice(0, 40).padEnd(40)} ${l.us.toFixed(1).padStart(7)} us ${(l.bytes / 1e6).toFixed(1).padStart(7)} MB`);
} else console.log(`one layer: fewer than 3 launches of ${values['layer-start']} (--layer-start)`);
if (values.json) {
  writeFileSync(values.json, JSON.stringify({ copyGBps: copy, totalUs: total, launches, layer }, null, 1));
}
