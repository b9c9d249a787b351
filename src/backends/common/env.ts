// The parser of the LLMTS_* knobs' text (knobs.ts declares the knobs; each backend's settings
// object is built from them once, when the backend is created). One parser for all of them so that
// a typo stops with a line naming the variable, its allowed values and what it got, instead of
// silently meaning the default (`Number(v) || d` reads "abc" as the default and "0.5" as a fraction
// of a row count). Unset or empty: the default.

/** An environment: process.env, or a plain object in tests. */
export type Env = Readonly<Record<string, string | undefined>>;

/** The value of `name` when set and not empty (surrounding spaces trimmed), else undefined. */
function raw(name: string, env: Env): string | undefined {
  const v = env[name]?.trim();
  return v === undefined || v === '' ? undefined : v;
}

export interface IntRange {
  min: number;
  max: number;
  /** the value must be a multiple of this (e.g. 32 for a split of key tiles) */
  multipleOf?: number;
}

export interface NumberRange {
  min: number;
  max: number;
}

/** What an integer in `range` is, for messages ("an integer from 1 to 32"). */
export function intWhat(range: IntRange): string {
  const step = range.multipleOf ?? 1;
  return step > 1 ? `a multiple of ${step} from ${range.min} to ${range.max}` : `an integer from ${range.min} to ${range.max}`;
}

/** Whether `n` is an integer in `range` (and a multiple of its step). */
export function intFits(n: number, range: IntRange): boolean {
  return Number.isSafeInteger(n) && n >= range.min && n <= range.max && n % (range.multipleOf ?? 1) === 0;
}

/** What a number in `range` is, for messages. */
export function numberWhat(range: NumberRange): string {
  return `a number from ${range.min} to ${range.max}`;
}

/** Whether `n` is a finite number in `range`. */
export function numberFits(n: number, range: NumberRange): boolean {
  return Number.isFinite(n) && n >= range.min && n <= range.max;
}

/** What one of `choices` is, for messages ('"on" or "off"'). */
export function choiceWhat(choices: readonly string[]): string {
  return choices.map((c) => JSON.stringify(c)).join(' or ');
}

/** An integer knob in [min, max] (a multiple of multipleOf when given); `fallback` when unset. */
export function envInt(name: string, fallback: number, range: IntRange, env: Env): number {
  const v = raw(name, env);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!/^-?\d+$/.test(v) || !intFits(n, range)) throw new Error(`${name} must be ${intWhat(range)}, got ${JSON.stringify(env[name])}`);
  return n;
}

/** A number knob in [min, max] (a factor, milliseconds); `fallback` when unset. */
export function envNumber(name: string, fallback: number, range: NumberRange, env: Env): number {
  const v = raw(name, env);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!numberFits(n, range)) throw new Error(`${name} must be ${numberWhat(range)}, got ${JSON.stringify(env[name])}`);
  return n;
}

/** One of `choices` (the first is the default when unset). */
export function envChoice<T extends string>(name: string, choices: readonly [T, ...T[]], env: Env): T {
  const v = raw(name, env);
  if (v === undefined) return choices[0];
  if (!(choices as readonly string[]).includes(v)) throw new Error(`${name} must be ${choiceWhat(choices)}, got ${JSON.stringify(env[name])}`);
  return v as T;
}

/** An on/off switch: `on` or `off`, `fallback` when unset. */
export function envSwitch(name: string, fallback: boolean, env: Env): boolean {
  return envChoice(name, fallback ? ['on', 'off'] : ['off', 'on'], env) === 'on';
}

/** The text of `name` (trimmed; undefined when unset or empty), for knobs with a syntax of their own. */
export function envText(name: string, env: Env): string | undefined {
  return raw(name, env);
}
