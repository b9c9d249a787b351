// Exact grammars for JSON-schema numeric ranges (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum on `integer` and `number`), replacing xgrammar's (see schema-rewrite.ts).
//
// xgrammar 0.1.27 gets many ranges wrong (measured over a grid of 179 integer ranges: 33 wrong):
// {minimum: 0, maximum: 120} allows 121..129, {minimum: 5} allows 1..4, {minimum: -125} refuses
// -125..-1, {maximum: -3} allows -2 and -1; and a `number` range can produce text that is not
// JSON at all ({minimum: -1.5} allows "-1x5" and a bare "-"). The language here: digit strings
// compared position by position (the classic range-to-regex construction), as a regular
// expression that dfa.ts writes deterministically.
//
// What it generates: integers without leading zeros (never "-0"); numbers as integers or with
// 1..F fraction digits (F = 6, or as many as a bound has up to 12), no exponent. That is a subset of the
// values in range, which is all a generator needs: every output is in range and valid JSON.

import { alt, digits, seq, set, star, str, type Re } from './dfa.ts';

/** fraction digits a `number` range generates: at least 6, more when a bound has more, at most 12 */
const MIN_FRACTION_DIGITS = 6;
const MAX_FRACTION_DIGITS = 12;

/** One bound: a decimal value m / 10^s, inclusive or not. */
interface Bound {
  mant: bigint;
  scale: number;
  exclusive: boolean;
}

/** The language of a ranged integer/number schema node, or undefined when it is not one we take over. */
export function numericRangeRe(node: Record<string, unknown>): Re | undefined {
  const type = node.type;
  if (type !== 'integer' && type !== 'number') return undefined;
  if ('multipleOf' in node || 'enum' in node || 'const' in node) return undefined;
  const num = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
  // (draft-4 booleans for exclusiveMinimum/Maximum: xgrammar refuses the schema as written)
  let lo: Bound | undefined, hi: Bound | undefined;
  const tighter = (a: Bound | undefined, b: Bound, isLow: boolean): Bound => {
    if (!a) return b;
    const c = compare(a, b);
    if (c === 0) return a.exclusive ? a : b;
    return (c > 0) === isLow ? a : b;
  };
  if (node.minimum !== undefined) {
    if (!num(node.minimum)) return undefined;
    lo = tighter(lo, { ...decimal(node.minimum), exclusive: false }, true);
  }
  if (node.maximum !== undefined) {
    if (!num(node.maximum)) return undefined;
    hi = tighter(hi, { ...decimal(node.maximum), exclusive: false }, false);
  }
  if (node.exclusiveMinimum !== undefined) {
    if (!num(node.exclusiveMinimum)) return undefined;
    lo = tighter(lo, { ...decimal(node.exclusiveMinimum), exclusive: true }, true);
  }
  if (node.exclusiveMaximum !== undefined) {
    if (!num(node.exclusiveMaximum)) return undefined;
    hi = tighter(hi, { ...decimal(node.exclusiveMaximum), exclusive: true }, false);
  }
  if (!lo && !hi) return undefined;
  // bounds past 1e18 keep xgrammar's rule (our digit strings would grow with them)
  if ([lo, hi].some((b) => b && (b.mant < 0n ? -b.mant : b.mant) >= 10n ** BigInt(18 + b.scale))) return undefined;
  const maxFraction = type === 'integer' ? 0 : Math.min(MAX_FRACTION_DIGITS, Math.max(MIN_FRACTION_DIGITS, lo?.scale ?? 0, hi?.scale ?? 0));
  const alts: Re[] = [];
  for (let f = 0; f <= maxFraction; f++) alts.push(...fixedPointAlternatives(lo, hi, f));
  return alts.length === 0 ? undefined : alt(...alts);
}

/** A finite JS number as an exact decimal m / 10^s (from its shortest decimal representation). */
function decimal(x: number): { mant: bigint; scale: number } {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:e([+-]\d+))?$/.exec(String(x));
  if (!m) throw new Error(`cannot read ${x} as a decimal`);
  const digits = m[2]! + (m[3] ?? '');
  let scale = (m[3] ?? '').length - Number(m[4] ?? 0);
  let mant = BigInt(digits);
  if (scale < 0) {
    mant *= 10n ** BigInt(-scale);
    scale = 0;
  }
  return { mant: m[1] === '-' ? -mant : mant, scale };
}

function compare(a: Bound, b: Bound): number {
  const s = Math.max(a.scale, b.scale);
  const x = a.mant * 10n ** BigInt(s - a.scale), y = b.mant * 10n ** BigInt(s - b.scale);
  return x < y ? -1 : x > y ? 1 : 0;
}

function floorDiv(a: bigint, b: bigint): bigint {
  const q = a / b;
  return (a % b !== 0n && (a < 0n) !== (b < 0n)) ? q - 1n : q;
}

function ceilDiv(a: bigint, b: bigint): bigint {
  return -floorDiv(-a, b);
}

/** The bound in units of 10^-f: the least (low) or greatest (high) allowed integer N. */
function scaled(b: Bound, f: number, isLow: boolean): bigint {
  const num = b.mant * 10n ** BigInt(f);
  const den = 10n ** BigInt(b.scale);
  if (isLow) return b.exclusive ? floorDiv(num, den) + 1n : ceilDiv(num, den);
  return b.exclusive ? ceilDiv(num, den) - 1n : floorDiv(num, den);
}

/** Alternatives for the values N / 10^f in range, written with exactly f fraction digits. */
function fixedPointAlternatives(lo: Bound | undefined, hi: Bound | undefined, f: number): Re[] {
  const a = lo ? scaled(lo, f, true) : undefined;
  const b = hi ? scaled(hi, f, false) : undefined;
  if (a !== undefined && b !== undefined && a > b) return [];
  const out: Re[] = [];
  // N >= 0 (N = 0 written "0", "0.0", ...)
  if (b === undefined || b >= 0n) out.push(...magnitudes(a === undefined || a < 0n ? 0n : a, b, f));
  // N < 0: "-" and the magnitude
  if (a === undefined || a < 0n) {
    const top = b === undefined || b >= 0n ? -1n : b;
    const neg = magnitudes(-top, a === undefined ? undefined : -a, f);
    if (neg.length > 0) out.push(seq(str('-'), alt(...neg)));
  }
  return out;
}

/**
 * The integers N in [a, b] (a >= 0; b undefined = no upper bound), each written with f fraction
 * digits (the integer part without leading zeros, "0" allowed).
 */
function magnitudes(a: bigint, b: bigint | undefined, f: number): Re[] {
  if (b !== undefined && a > b) return [];
  const text = (n: bigint) => n.toString().padStart(f + 1, '0');
  const out: Re[] = [];
  const first = text(a).length;
  const last = b === undefined ? first : text(b).length;
  for (let n = first; n <= last; n++) {
    const lowest = n === f + 1 ? 0n : 10n ** BigInt(n - 1);
    const highest = 10n ** BigInt(n) - 1n;
    const x = a > lowest ? a : lowest;
    const y = b !== undefined && b < highest ? b : highest;
    if (x > y) continue;
    out.push(sameLength(text(x), text(y), n - f, 0));
  }
  if (b === undefined) {
    // every integer part longer than `first - f` digits
    const any = Array.from({ length: first - f }, () => digits(0, 9));
    const fraction = f > 0 ? [str('.'), ...Array.from({ length: f }, () => digits(0, 9))] : [];
    out.push(seq(digits(1, 9), ...any, star(digits(0, 9)), ...fraction));
  }
  return out;
}

/**
 * The digit strings s with x <= s <= y (x, y of equal length), a "." written before position
 * `dot` (counted from the start of the whole string; `pos` is where x begins).
 */
function sameLength(x: string, y: string, dot: number, pos: number): Re {
  const d = (p: number, r: Re): Re => (p === dot ? seq(str('.'), r) : r);
  const any = (k: number, from: number): Re[] => Array.from({ length: k }, (_, i) => d(from + i, digits(0, 9)));
  if (x.length === 1) return d(pos, digits(Number(x), Number(y)));
  const rx = x.slice(1), ry = y.slice(1);
  if (x[0] === y[0]) return seq(d(pos, set([x[0]!])), sameLength(rx, ry, dot, pos + 1));
  const alts: Re[] = [];
  let lo = Number(x[0]), hi = Number(y[0]);
  if (!/^0*$/.test(rx)) {
    alts.push(seq(d(pos, set([x[0]!])), sameLength(rx, '9'.repeat(rx.length), dot, pos + 1)));
    lo++;
  }
  if (!/^9*$/.test(ry)) {
    alts.push(seq(d(pos, set([y[0]!])), sameLength('0'.repeat(ry.length), ry, dot, pos + 1)));
    hi--;
  }
  if (lo <= hi) alts.push(seq(d(pos, digits(lo, hi)), ...any(rx.length, pos + 1)));
  return alt(...alts);
}
