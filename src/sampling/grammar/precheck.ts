// Checks a spec needs before xgrammar parses it: what xgrammar accepts yet cannot serve (a grammar
// whose root never terminates compiles, then allows no token at the first step), and what it
// refuses only with a C++ exception pointer for a message (a lone surrogate in a regex, a
// fractional maxLength). Each returns the reason as a sentence, or undefined when the spec passes.

import type { GrammarSpec } from './spec.ts';

/** a UTF-16 surrogate not part of a pair: not a character, so no output can contain it */
const LONE_SURROGATE = /\p{Cs}/u;

const loneSurrogate = (s: string, where: string): string | undefined =>
  LONE_SURROGATE.test(s) ? `${where} contains a lone UTF-16 surrogate (U+D800-U+DFFF), which is not a character` : undefined;

/** The reason `spec` is refused before compiling, or undefined. */
export function precheckSpec(spec: GrammarSpec): string | undefined {
  switch (spec.type) {
    case 'regex':
      return typeof spec.pattern === 'string' ? loneSurrogate(spec.pattern, 'the pattern') : undefined;
    case 'ebnf':
      if (typeof spec.grammar !== 'string') return undefined;
      return loneSurrogate(spec.grammar, 'the grammar');
    case 'choice':
      if (!Array.isArray(spec.choices)) return undefined;
      for (const c of spec.choices) if (typeof c === 'string' && LONE_SURROGATE.test(c)) return loneSurrogate(c, 'a choice');
      return undefined;
    case 'json_schema':
      return checkSchemaStrings(spec.schema, 0) ?? checkSchemaCounts(spec.schema, '#', 0);
    default:
      return undefined;
  }
}

/** deeper than this the walks stop (xgrammar's own depth handling applies) */
const MAX_WALK_DEPTH = 256;

function checkSchemaStrings(v: unknown, depth: number): string | undefined {
  if (depth > MAX_WALK_DEPTH) return undefined;
  if (typeof v === 'string') return loneSurrogate(v, 'the schema');
  if (v === null || typeof v !== 'object') return undefined;
  if (Array.isArray(v)) {
    for (const x of v) {
      const r = checkSchemaStrings(x, depth + 1);
      if (r) return r;
    }
    return undefined;
  }
  for (const [k, x] of Object.entries(v)) {
    const r = (LONE_SURROGATE.test(k) ? loneSurrogate(k, 'the schema') : undefined) ?? checkSchemaStrings(x, depth + 1);
    if (r) return r;
  }
  return undefined;
}

/** count keywords: a non-negative integer each (JSON Schema), paired as [min, max] */
const COUNT_PAIRS: readonly [string, string][] = [
  ['minLength', 'maxLength'], ['minItems', 'maxItems'], ['minProperties', 'maxProperties'], ['minContains', 'maxContains'],
];
/** keywords whose value is a map of names to subschemas */
const SCHEMA_MAPS = ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas'];
/** keywords whose value is a subschema or a list of them */
const SCHEMA_VALUES = [
  'items', 'prefixItems', 'additionalItems', 'contains', 'additionalProperties', 'propertyNames', 'unevaluatedItems',
  'unevaluatedProperties', 'not', 'if', 'then', 'else', 'allOf', 'anyOf', 'oneOf',
];

/**
 * Count keywords in schema positions only: a property named "minItems" is a name, not a keyword.
 * `at` is the JSON pointer of the schema, for the message.
 */
function checkSchemaCounts(schema: unknown, at: string, depth: number): string | undefined {
  if (depth > MAX_WALK_DEPTH || schema === null || typeof schema !== 'object' || Array.isArray(schema)) return undefined;
  const s = schema as Record<string, unknown>;
  for (const [minKey, maxKey] of COUNT_PAIRS) {
    for (const key of [minKey, maxKey]) {
      const v = s[key];
      if (v !== undefined && !(typeof v === 'number' && Number.isSafeInteger(v) && v >= 0))
        return `${key} at ${at} must be a non-negative integer, got ${JSON.stringify(v)}`;
    }
    const lo = s[minKey] as number | undefined;
    const hi = s[maxKey] as number | undefined;
    if (lo !== undefined && hi !== undefined && lo > hi) return `${minKey} ${lo} exceeds ${maxKey} ${hi} at ${at}: no value satisfies both`;
  }
  const sub = (x: unknown, path: string): string | undefined => checkSchemaCounts(x, path, depth + 1);
  for (const key of SCHEMA_MAPS) {
    const m = s[key];
    if (m === null || typeof m !== 'object' || Array.isArray(m)) continue;
    for (const [name, x] of Object.entries(m)) {
      const r = sub(x, `${at}/${key}/${name}`);
      if (r) return r;
    }
  }
  for (const key of SCHEMA_VALUES) {
    const v = s[key];
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const r = sub(v[i], `${at}/${key}/${i}`);
        if (r) return r;
      }
    } else {
      const r = sub(v, `${at}/${key}`);
      if (r) return r;
    }
  }
  return undefined;
}

// ---- EBNF: does the root derive a finite string? ----

type Expr =
  | { k: 'term' }
  | { k: 'ref'; name: string }
  | { k: 'seq'; items: Expr[] }
  | { k: 'alt'; items: Expr[] }
  /** `*` or `?` (or {0,n}): may be skipped, so always productive */
  | { k: 'opt' };

/**
 * The rules of xgrammar's normalized grammar text (Grammar.ToString: `name ::= body`, a rule per
 * line, an optional lookahead `(=...)` after the body), or undefined when a line is not in the
 * expected form: the caller then decides nothing.
 */
export function parseNormalizedRules(text: string): Map<string, Expr> | undefined {
  const rules = new Map<string, Expr>();
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const m = /^([A-Za-z_][A-Za-z0-9_-]*) ::= (.*)$/.exec(line);
    if (!m) return undefined;
    const p = new ExprParser(m[2]!);
    const e = p.alt();
    if (e === undefined) return undefined;
    p.space();
    // what may follow the body is a lookahead assertion only
    if (!p.done() && !p.rest().startsWith('(=')) return undefined;
    rules.set(m[1]!, e);
  }
  return rules;
}

class ExprParser {
  private i = 0;
  constructor(private readonly s: string) {}
  done(): boolean {
    return this.i >= this.s.length;
  }
  rest(): string {
    return this.s.slice(this.i);
  }
  space(): void {
    while (this.s[this.i] === ' ' || this.s[this.i] === '\t') this.i++;
  }
  alt(): Expr | undefined {
    const items: Expr[] = [];
    for (;;) {
      const e = this.seq();
      if (e === undefined) return undefined;
      items.push(e);
      this.space();
      if (this.s[this.i] !== '|') break;
      this.i++;
    }
    return items.length === 1 ? items[0] : { k: 'alt', items };
  }
  private seq(): Expr | undefined {
    const items: Expr[] = [];
    for (;;) {
      this.space();
      const c = this.s[this.i];
      if (c === undefined || c === '|' || c === ')' || this.s.startsWith('(=', this.i)) break;
      const e = this.elem();
      if (e === undefined) return undefined;
      items.push(e);
    }
    return { k: 'seq', items };
  }
  private elem(): Expr | undefined {
    const c = this.s[this.i];
    let e: Expr | undefined;
    if (c === '"') e = this.quoted('"') ? { k: 'term' } : undefined;
    else if (c === '[') e = this.quoted(']') ? { k: 'term' } : undefined;
    else if (c === '(') {
      this.i++;
      e = this.alt();
      this.space();
      if (e === undefined || this.s[this.i] !== ')') return undefined;
      this.i++;
    } else {
      const m = /^[A-Za-z_][A-Za-z0-9_-]*/.exec(this.s.slice(this.i));
      if (!m) return undefined;
      this.i += m[0].length;
      e = { k: 'ref', name: m[0] };
    }
    if (e === undefined) return undefined;
    const q = this.s[this.i];
    if (q === '*' || q === '?') {
      this.i++;
      return { k: 'opt' };
    }
    if (q === '+') this.i++;
    else if (q === '{') {
      const m = /^\{(\d*)(?:,(\d*))?\}/.exec(this.s.slice(this.i));
      if (!m) return undefined;
      this.i += m[0].length;
      if (m[1] === '' || m[1] === '0') return { k: 'opt' };
    }
    return e;
  }
  /** skips a "..." string or [...] class (opening char at i), honouring backslash escapes */
  private quoted(close: string): boolean {
    this.i++;
    while (this.i < this.s.length) {
      const c = this.s[this.i];
      if (c === '\\') this.i += 2;
      else if (c === close) {
        this.i++;
        return true;
      } else this.i++;
    }
    return false;
  }
}

/**
 * The rules that derive at least one finite string (least fixpoint). A reference to a rule the
 * text does not define counts as productive: the compiler reports undefined rules itself.
 */
export function productiveRules(rules: ReadonlyMap<string, Expr>): Set<string> {
  const ok = new Set<string>();
  const prod = (e: Expr): boolean => {
    switch (e.k) {
      case 'term': case 'opt': return true;
      case 'ref': return ok.has(e.name) || !rules.has(e.name);
      case 'seq': return e.items.every(prod);
      case 'alt': return e.items.some(prod);
    }
  };
  for (let changed = true; changed;) {
    changed = false;
    for (const [name, e] of rules) {
      if (!ok.has(name) && prod(e)) {
        ok.add(name);
        changed = true;
      }
    }
  }
  return ok;
}

/** For a grammar's normalized text: the reason it matches no string, or undefined (it does, or the text was not understood). */
export function emptyLanguageReason(normalized: string, root: string): string | undefined {
  const rules = parseNormalizedRules(normalized);
  if (!rules || !rules.has(root)) return undefined;
  if (productiveRules(rules).has(root)) return undefined;
  return `the grammar matches no string: rule "${root}" can never finish (every alternative leads back into a rule that never ends)`;
}
