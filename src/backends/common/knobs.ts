// Knobs: one declaration per LLMTS_* variable (its name, default and allowed values) from which a
// settings object is built once, when a backend or the engine is created (settingsFrom). A field
// given in code (an override) wins over the environment and is checked against the same rule, so
// that a test, a benchmark or an application sets a knob by passing it, not by editing a global.
import {
  choiceWhat, type Env, envChoice, envInt, envNumber, envSwitch, envText, type IntRange, intFits, intWhat, numberFits,
  type NumberRange, numberWhat,
} from './env.ts';

export interface Knob<T> {
  /** the environment variable (named in every refusal) */
  readonly variable: string;
  /** the value `env` gives (the default when the variable is unset or empty); throws naming it */
  read(env: Env): T;
  /** `v`, given in code as `field`, when the knob allows it; throws naming the field and the variable */
  check(v: T, field: string): T;
}

/** A knob per field of a settings object T. */
export type Knobs<T> = { readonly [K in keyof T]-?: Knob<T[K]> };

function refuse(field: string, variable: string, what: string, got: unknown): never {
  throw new Error(`${field} ($${variable}) must be ${what}, got ${JSON.stringify(got)}`);
}

export function intKnob(variable: string, fallback: number, range: IntRange): Knob<number> {
  return {
    variable,
    read: (env) => envInt(variable, fallback, range, env),
    check: (v, field) => (intFits(v, range) ? v : refuse(field, variable, intWhat(range), v)),
  };
}

export function numberKnob(variable: string, fallback: number, range: NumberRange): Knob<number> {
  return {
    variable,
    read: (env) => envNumber(variable, fallback, range, env),
    check: (v, field) => (numberFits(v, range) ? v : refuse(field, variable, numberWhat(range), v)),
  };
}

/** One of `choices`; the first is the default. */
export function choiceKnob<T extends string>(variable: string, choices: readonly [T, ...T[]]): Knob<T> {
  return {
    variable,
    read: (env) => envChoice(variable, choices, env),
    check: (v, field) => ((choices as readonly string[]).includes(v) ? v : refuse(field, variable, choiceWhat(choices), v)),
  };
}

/** `on` / `off` in the environment, a boolean in code. */
export function switchKnob(variable: string, fallback: boolean): Knob<boolean> {
  return {
    variable,
    read: (env) => envSwitch(variable, fallback, env),
    check: (v, field) => (typeof v === 'boolean' ? v : refuse(field, variable, 'true or false', v)),
  };
}

/** One of `choices`' texts in the environment (the first is the default), its value in `values` in code. */
export function mappedKnob<S extends string, T>(variable: string, choices: readonly [S, ...S[]], values: Readonly<Record<S, T>>): Knob<T> {
  const allowed = choices.map((c) => values[c]);
  return {
    variable,
    read: (env) => values[envChoice(variable, choices, env)],
    check: (v, field) => (allowed.includes(v) ? v : refuse(field, variable, allowed.map((a) => JSON.stringify(a)).join(' or '), v)),
  };
}

/**
 * A knob with a syntax of its own: `parse` reads the trimmed text (undefined when unset or empty;
 * `env` for a default that another variable gives) and throws naming the variable; `check` says
 * what a value given in code must be when it is not (default: any value).
 */
export function textKnob<T>(variable: string, parse: (text: string | undefined, env: Env) => T,
  check?: (v: T) => string | undefined): Knob<T> {
  return {
    variable,
    read: (env) => parse(envText(variable, env), env),
    check: (v, field) => {
      const problem = check?.(v);
      return problem === undefined ? v : refuse(field, variable, problem, v);
    },
  };
}

/**
 * The settings `knobs` declare: each field from `overrides` where given there (checked, named
 * `prefix` + field), else from `env`.
 */
export function settingsFrom<T>(knobs: Knobs<T>, env: Env, overrides: Partial<T> = {}, prefix = ''): T {
  const out = {} as T;
  for (const key of Object.keys(knobs) as (keyof T & string)[]) {
    const knob = knobs[key];
    const given = overrides[key];
    out[key] = given === undefined ? knob.read(env) : knob.check(given as T[typeof key], `${prefix}${key}`);
  }
  return Object.freeze(out);
}
