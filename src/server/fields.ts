// Typed reads of a JSON request body. Each accessor returns undefined for an absent field (null
// counts as absent: SDKs send null for "unset") and throws a 400 naming the field for a value of
// the wrong type or out of range. Fields nobody reads are ignored, as OpenAI and vLLM do.

import { badRequest } from './http-error.ts';

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

export function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export interface NumberRange {
  integer?: boolean;
  min?: number;
  max?: number;
  /** min is exclusive */
  minExclusive?: boolean;
}

export class Fields {
  /** @param prefix names nested objects in messages, e.g. "stream_options." */
  constructor(
    readonly body: JsonObject,
    readonly prefix = '',
  ) {}

  private name(field: string): string {
    return this.prefix + field;
  }

  has(field: string): boolean {
    return this.body[field] !== undefined && this.body[field] !== null;
  }

  raw(field: string): Json | undefined {
    const v = this.body[field];
    return v === null ? undefined : v;
  }

  string(field: string): string | undefined {
    const v = this.raw(field);
    if (v === undefined) return undefined;
    if (typeof v !== 'string') throw badRequest(`${this.name(field)} must be a string, got ${kind(v)}`, this.name(field));
    return v;
  }

  boolean(field: string): boolean | undefined {
    const v = this.raw(field);
    if (v === undefined) return undefined;
    if (typeof v !== 'boolean') throw badRequest(`${this.name(field)} must be a boolean, got ${kind(v)}`, this.name(field));
    return v;
  }

  number(field: string, range: NumberRange = {}): number | undefined {
    const v = this.raw(field);
    if (v === undefined) return undefined;
    return checkNumber(v, this.name(field), range);
  }

  object(field: string): Fields | undefined {
    const v = this.raw(field);
    if (v === undefined) return undefined;
    if (!isObject(v)) throw badRequest(`${this.name(field)} must be an object, got ${kind(v)}`, this.name(field));
    return new Fields(v, `${this.name(field)}.`);
  }

  array(field: string): Json[] | undefined {
    const v = this.raw(field);
    if (v === undefined) return undefined;
    if (!Array.isArray(v)) throw badRequest(`${this.name(field)} must be an array, got ${kind(v)}`, this.name(field));
    return v;
  }

  /** a string or a list of strings (OpenAI `stop`), as a list */
  stringList(field: string, maxItems: number): string[] | undefined {
    const v = this.raw(field);
    if (v === undefined) return undefined;
    const list = typeof v === 'string' ? [v] : Array.isArray(v) ? v : undefined;
    if (!list) throw badRequest(`${this.name(field)} must be a string or an array of strings, got ${kind(v)}`, this.name(field));
    if (list.length > maxItems) throw badRequest(`${this.name(field)} has ${list.length} entries; at most ${maxItems} are allowed`, this.name(field));
    list.forEach((s, i) => {
      if (typeof s !== 'string') throw badRequest(`${this.name(field)}[${i}] must be a string, got ${kind(s)}`, this.name(field));
    });
    return list as string[];
  }

  /** one of a fixed set of strings */
  oneOf<T extends string>(field: string, values: readonly T[]): T | undefined {
    const v = this.string(field);
    if (v === undefined) return undefined;
    if (!(values as readonly string[]).includes(v))
      throw badRequest(`${this.name(field)} must be one of ${values.map((x) => JSON.stringify(x)).join(', ')}, got ${JSON.stringify(v)}`, this.name(field));
    return v as T;
  }
}

export function checkNumber(v: unknown, name: string, range: NumberRange = {}): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw badRequest(`${name} must be a ${range.integer ? 'integer' : 'number'}, got ${kind(v)}`, name);
  if (range.integer && !Number.isInteger(v)) throw badRequest(`${name} must be an integer, got ${v}`, name);
  if (range.min !== undefined && (range.minExclusive ? v <= range.min : v < range.min))
    throw badRequest(`${name} must be ${range.minExclusive ? '>' : '>='} ${range.min}, got ${v}`, name);
  if (range.max !== undefined && v > range.max) throw badRequest(`${name} must be <= ${range.max}, got ${v}`, name);
  return v;
}
