// Flag parsing helpers on top of node:util parseArgs: typed numeric flags with range checks
// and messages that name the flag.

import { ONLINE_QUANTIZATIONS, type OnlineQuantization } from '../artifacts/online-quant.ts';
import { KV_DTYPES, type KvDtype } from '../execution/fit/plan.ts';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { UsageError } from './errors.ts';

export type Options = NonNullable<ParseArgsConfig['options']>;
export type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

export function parseFlags(argv: string[], options: Options): Values {
  try {
    return parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as Values;
  } catch (err) {
    throw new UsageError((err as Error).message.replace(/^TypeError \[[A-Z_]+\]: /, ''));
  }
}

export function stringFlag(v: Values, name: string): string | undefined {
  const x = v[name];
  return typeof x === 'string' ? x : undefined;
}

export function requiredString(v: Values, name: string): string {
  const x = stringFlag(v, name);
  if (x === undefined) throw new UsageError(`--${name} is required`);
  return x;
}

export function numberFlag(
  v: Values,
  name: string,
  opts: { integer?: boolean; min?: number; max?: number } = {},
): number | undefined {
  const raw = stringFlag(v, name);
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n)) throw new UsageError(`--${name} must be a number, got "${raw}"`);
  if (opts.integer && !Number.isInteger(n)) throw new UsageError(`--${name} must be an integer, got "${raw}"`);
  if (opts.min !== undefined && n < opts.min) throw new UsageError(`--${name} must be >= ${opts.min}, got ${n}`);
  if (opts.max !== undefined && n > opts.max) throw new UsageError(`--${name} must be <= ${opts.max}, got ${n}`);
  return n;
}

export function listFlag(v: Values, name: string): string[] {
  const x = v[name];
  if (x === undefined) return [];
  return (Array.isArray(x) ? x : [x]).filter((s): s is string => typeof s === 'string');
}

const UNITS: Record<string, number> = { '': 1, b: 1, k: 1024, kb: 1024, kib: 1024, m: 1024 ** 2, mb: 1024 ** 2, mib: 1024 ** 2, g: 1024 ** 3, gb: 1024 ** 3, gib: 1024 ** 3, t: 1024 ** 4, tb: 1024 ** 4, tib: 1024 ** 4 };

/** "512M", "8GiB", "1.5g", "1048576" -> bytes */
export function parseSize(raw: string, flag: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(raw);
  const unit = m ? UNITS[m[2].toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new UsageError(`--${flag} must be a size like 512M or 8G, got "${raw}"`);
  return Math.round(Number(m[1]) * unit);
}

/** --kv-dtype f32|bf16|f16|int8|fp8: what the KV cache holds (undefined: the backend's default) */
export function kvDtypeFlag(v: Values): KvDtype | undefined {
  const raw = stringFlag(v, 'kv-dtype');
  if (raw === undefined) return undefined;
  if (!(KV_DTYPES as readonly string[]).includes(raw)) throw new UsageError(`--kv-dtype must be one of ${KV_DTYPES.join(', ')}, got "${raw}"`);
  return raw as KvDtype;
}

/** --quantization q8_0|q4_0|fp8: quantize a safetensors checkpoint's matrices as they load (undefined: as stored) */
export function quantizationFlag(v: Values): OnlineQuantization | undefined {
  const raw = stringFlag(v, 'quantization');
  if (raw === undefined) return undefined;
  if (!(ONLINE_QUANTIZATIONS as readonly string[]).includes(raw)) throw new UsageError(`--quantization must be one of ${ONLINE_QUANTIZATIONS.join(', ')}, got "${raw}"`);
  return raw as OnlineQuantization;
}
