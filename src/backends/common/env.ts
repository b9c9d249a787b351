// The backends' LLMTS_* tuning and A/B knobs, read from the environment when their module loads.
// One parser for all of them so that a typo stops the process with a line naming the variable, its
// allowed values and what it got, instead of silently meaning the default (a `Number(v) || d` read
// "abc" as the default and "0.5" as a fraction of a row count). Unset or empty: the default.

type Env = Readonly<Record<string, string | undefined>>;

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

/** An integer knob in [min, max] (a multiple of multipleOf when given); `fallback` when unset. */
export function envInt(name: string, fallback: number, range: IntRange, env: Env = process.env): number {
  const v = raw(name, env);
  if (v === undefined) return fallback;
  const n = Number(v);
  const step = range.multipleOf ?? 1;
  if (!/^-?\d+$/.test(v) || !Number.isSafeInteger(n) || n < range.min || n > range.max || n % step !== 0) {
    const what = step > 1 ? `a multiple of ${step} from ${range.min} to ${range.max}` : `an integer from ${range.min} to ${range.max}`;
    throw new Error(`${name} must be ${what}, got ${JSON.stringify(env[name])}`);
  }
  return n;
}

/** A number knob in [min, max] (a factor, milliseconds); `fallback` when unset. */
export function envNumber(name: string, fallback: number, range: { min: number; max: number }, env: Env = process.env): number {
  const v = raw(name, env);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n < range.min || n > range.max) {
    throw new Error(`${name} must be a number from ${range.min} to ${range.max}, got ${JSON.stringify(env[name])}`);
  }
  return n;
}

/** One of `choices` (the first is the default when unset). */
export function envChoice<T extends string>(name: string, choices: readonly [T, ...T[]], env: Env = process.env): T {
  const v = raw(name, env);
  if (v === undefined) return choices[0];
  if (!(choices as readonly string[]).includes(v)) {
    throw new Error(`${name} must be ${choices.map((c) => JSON.stringify(c)).join(' or ')}, got ${JSON.stringify(env[name])}`);
  }
  return v as T;
}

/** An on/off switch: `on` or `off`, `fallback` when unset. */
export function envSwitch(name: string, fallback: boolean, env: Env = process.env): boolean {
  return envChoice(name, fallback ? ['on', 'off'] : ['off', 'on'], env) === 'on';
}
