// Checks a spec needs before xgrammar parses it: what xgrammar accepts yet cannot serve (a grammar
// whose root never terminates compiles, then allows no token at the first step), what it
// refuses only with a C++ exception pointer for a message (a lone surrogate in a regex, a
// fractional maxLength), and what is too big or too deep to convert safely (GrammarLimits: a
// schema nested past xgrammar's stack aborts its instance with "memory access out of bounds").
// Each returns the reason as a sentence, or undefined when the spec passes.

import type { GrammarSpec } from './spec.ts';

/** How big a spec may be; a spec past any of them is refused before it is compiled. */
export interface GrammarLimits {
  /** UTF-8 bytes of the spec's JSON text (schema, grammar, pattern, choices or structural tag) */
  maxSpecBytes: number;
  /**
   * subschemas nested in subschemas (a `$ref` followed counts as one more level), or parentheses
   * in parentheses in a grammar or regex
   */
  maxDepth: number;
  /** characters the shortest text of any rule the grammar can enter may need */
  maxShortestChars: number;
}

/**
 * Measured against xgrammar 0.1.27: a schema of objects nested 56 deep (arrays or anyOf: 100)
 * overflows its stack, and a grammar of 200 nested parentheses; jump-forward takes about 6 us a
 * character of forced text on the 2-core VM (0.2 s for the longest shortest text allowed).
 */
export const DEFAULT_GRAMMAR_LIMITS: Readonly<GrammarLimits> = { maxSpecBytes: 256 * 1024, maxDepth: 32, maxShortestChars: 32_768 };

/** a UTF-16 surrogate not part of a pair: not a character, so no output can contain it */
const LONE_SURROGATE = /\p{Cs}/u;

const loneSurrogate = (s: string, where: string): string | undefined =>
  LONE_SURROGATE.test(s) ? `${where} contains a lone UTF-16 surrogate (U+D800-U+DFFF), which is not a character` : undefined;

/** The reason `spec` is refused before compiling, or undefined. */
export function precheckSpec(spec: GrammarSpec, limits: Readonly<GrammarLimits> = DEFAULT_GRAMMAR_LIMITS): string | undefined {
  switch (spec.type) {
    case 'regex':
      if (typeof spec.pattern !== 'string') return undefined;
      return loneSurrogate(spec.pattern, 'the pattern') ?? nestingReason(spec.pattern, 'regex', limits.maxDepth);
    case 'ebnf':
      if (typeof spec.grammar !== 'string') return undefined;
      return loneSurrogate(spec.grammar, 'the grammar') ?? nestingReason(spec.grammar, 'ebnf', limits.maxDepth);
    case 'choice':
      if (!Array.isArray(spec.choices)) return undefined;
      for (const c of spec.choices) if (typeof c === 'string' && LONE_SURROGATE.test(c)) return loneSurrogate(c, 'a choice');
      return undefined;
    case 'json_schema':
      return precheckSchema(spec.schema, limits);
    default:
      return undefined;
  }
}

/** The checks of a JSON schema (also one inside a structural tag). */
export function precheckSchema(schema: unknown, limits: Readonly<GrammarLimits> = DEFAULT_GRAMMAR_LIMITS): string | undefined {
  return checkSchemaStrings(schema, 0) ?? new SchemaWalk(schema, limits.maxDepth).walk(schema, '#', 0);
}

/** For a schema xgrammar accepted: why no JSON value satisfies it, found in its keywords (SchemaWalk), or undefined. */
export function unsatisfiableSchemaReason(schema: unknown, limits: Readonly<GrammarLimits> = DEFAULT_GRAMMAR_LIMITS): string | undefined {
  return new SchemaWalk(schema, limits.maxDepth, true).walk(schema, '#', 0);
}

/** how a spec's JSON text is measured against maxSpecBytes */
export function specSizeReason(text: string, what: string, limits: Readonly<GrammarLimits>): string | undefined {
  // a UTF-16 unit is at most 3 UTF-8 bytes: count exactly only near the limit
  if (text.length * 3 <= limits.maxSpecBytes) return undefined;
  const bytes = Buffer.byteLength(text, 'utf8');
  return bytes > limits.maxSpecBytes ? `the ${what} is ${bytes} bytes as JSON, more than the limit of ${limits.maxSpecBytes}` : undefined;
}

/**
 * Parentheses nested in a grammar or regex, outside strings and classes (and escapes, in a
 * regex): the reason when deeper than `max`.
 */
function nestingReason(text: string, syntax: 'ebnf' | 'regex', max: number): string | undefined {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '\\') i++;
    else if (c === '[') {
      for (i++; i < text.length && text[i] !== ']'; i++) if (text[i] === '\\') i++;
    } else if (c === '"' && syntax === 'ebnf') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === '\\') i++;
    } else if (c === '(') {
      if (++depth > max) return `the ${syntax === 'ebnf' ? 'grammar' : 'pattern'} nests parentheses more than ${max} deep`;
    } else if (c === ')') depth = Math.max(0, depth - 1);
  }
  return undefined;
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
 * Count keywords and nesting, in schema positions only: a property named "minItems" is a name,
 * not a keyword. A local `$ref` is followed the first time it is met, one level deeper, as
 * xgrammar's converter expands it there (a reference met again becomes a rule reference).
 * Where a subschema must hold for the whole to (the root, a required property, items an array
 * must have, allOf members, what they reference), a subschema no value satisfies is refused:
 * xgrammar ignores `not` and `allOf`, and drops a required property `properties` does not name,
 * so such a schema would compile to a grammar whose outputs it rejects.
 */
class SchemaWalk {
  /** refs followed, with whether they were followed where they must hold */
  private readonly followed = new Map<string, boolean>();

  constructor(
    private readonly root: unknown,
    private readonly maxDepth: number,
    /** also look for subschemas no value satisfies (once xgrammar accepted the schema: its own message comes first) */
    private readonly satisfiable = false,
  ) {}

  /** `at` is the JSON pointer of the schema, for the message; `must`: the whole needs it to hold */
  walk(schema: unknown, at: string, depth: number, must = true): string | undefined {
    if (schema === null || typeof schema !== 'object' || Array.isArray(schema)) return undefined;
    if (depth > this.maxDepth) return `the schema nests subschemas more than ${this.maxDepth} deep (at ${shortPointer(at)})`;
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
    // xgrammar's own message for it is an EBNF parser error
    if (Array.isArray(s.enum) && s.enum.length === 0) return `"enum": [] at ${at} allows no value`;
    if (must && this.satisfiable) {
      const r = unsatisfiable(s, at);
      if (r) return `no JSON value satisfies it: ${r}`;
    }
    const sub = (x: unknown, path: string, m: boolean): string | undefined => this.walk(x, path, depth + 1, m);
    const ref = s.$ref;
    if (typeof ref === 'string' && ref.startsWith('#') && !(this.followed.get(ref) ?? false) && (must || !this.followed.has(ref))) {
      this.followed.set(ref, must);
      const r = sub(resolvePointer(this.root, ref), ref, must);
      if (r) return r;
    }
    const required = new Set(Array.isArray(s.required) ? s.required.filter((x) => typeof x === 'string') : []);
    const minItems = typeof s.minItems === 'number' ? s.minItems : 0;
    const prefix = Array.isArray(s.prefixItems) ? s.prefixItems.length : 0;
    for (const key of SCHEMA_MAPS) {
      const m = s[key];
      if (m === null || typeof m !== 'object' || Array.isArray(m)) continue;
      for (const [name, x] of Object.entries(m)) {
        const r = sub(x, `${at}/${key}/${name}`, must && key === 'properties' && required.has(name));
        if (r) return r;
      }
    }
    for (const key of SCHEMA_VALUES) {
      const v = s[key];
      if (Array.isArray(v)) {
        for (let i = 0; i < v.length; i++) {
          const m = must && (key === 'allOf' || (key === 'prefixItems' && i < minItems) || ((key === 'anyOf' || key === 'oneOf') && v.length === 1));
          const r = sub(v[i], `${at}/${key}/${i}`, m);
          if (r) return r;
        }
      } else {
        const r = sub(v, `${at}/${key}`, must && key === 'items' && minItems > prefix);
        if (r) return r;
      }
    }
    return undefined;
  }
}

/** the types a schema's own `type` allows (integer counted in number), or undefined for any */
function typesOf(s: Record<string, unknown>): Set<string> | undefined {
  const t = s.type;
  const list = typeof t === 'string' ? [t] : Array.isArray(t) ? t.filter((x) => typeof x === 'string') : undefined;
  if (!list) return undefined;
  const out = new Set<string>();
  for (const x of list) {
    if (x === 'number') out.add('number').add('integer');
    else out.add(x);
  }
  return out;
}

/** Why a subschema, taken alone, admits no value (the obvious cases), or undefined. */
function unsatisfiable(s: Record<string, unknown>, at: string): string | undefined {
  if (Array.isArray(s.type) && s.type.length === 0) return `"type": [] at ${at} allows no type`;
  const not = s.not;
  if (not === true || (not !== null && typeof not === 'object' && !Array.isArray(not) && Object.keys(not).length === 0))
    return `"not": ${JSON.stringify(not)} at ${at} excludes every value`;
  if (Array.isArray(s.allOf)) {
    let types = typesOf(s);
    for (const m of s.allOf) {
      if (m === false) return `allOf at ${at} contains false`;
      if (m === null || typeof m !== 'object' || Array.isArray(m)) continue;
      const t = typesOf(m as Record<string, unknown>);
      if (!t) continue;
      types = types ? new Set([...types].filter((x) => t.has(x))) : t;
      if (types.size === 0) return `allOf at ${at} requires types that exclude each other`;
    }
  }
  if (Array.isArray(s.required) && (s.additionalProperties === undefined || s.additionalProperties === false) && s.patternProperties === undefined) {
    const props = s.properties !== null && typeof s.properties === 'object' && !Array.isArray(s.properties) ? s.properties as Record<string, unknown> : {};
    for (const name of s.required)
      if (typeof name === 'string' && !Object.hasOwn(props, name))
        return `property ${JSON.stringify(name)} is required at ${at} but not in its properties, and the output may hold no other property`;
  }
  return undefined;
}

/** a JSON pointer for a message: its start and end when long */
function shortPointer(at: string): string {
  return at.length <= 100 ? at : `${at.slice(0, 40)}...${at.slice(-50)}`;
}

/** `#/a/b~1c` in `root`, or undefined */
function resolvePointer(root: unknown, ref: string): unknown {
  if (ref === '#') return root;
  if (!ref.startsWith('#/')) return undefined;
  let v: unknown = root;
  for (const raw of ref.slice(2).split('/')) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (v === null || typeof v !== 'object' || !Object.hasOwn(v, key)) return undefined;
    v = (v as Record<string, unknown>)[key];
  }
  return v;
}

// ---- EBNF: which strings can the grammar finish? ----

type Expr =
  /** a literal or a character class: `len` characters */
  | { k: 'term'; len: number }
  | { k: 'ref'; name: string }
  | { k: 'seq'; items: Expr[] }
  | { k: 'alt'; items: Expr[] }
  /** `e` repeated at least `min` times (`*` and `?`: 0, `+`: 1, `{n,m}`: n) */
  | { k: 'rep'; e: Expr; min: number };

/**
 * The rules of xgrammar's normalized grammar text (Grammar.ToString: `name ::= body`, a rule per
 * line, an optional lookahead `(=...)` after the body), or undefined when a line is not in the
 * expected form: the caller then decides nothing.
 */
export function parseNormalizedRules(text: string): Map<string, Expr> | undefined {
  const rules = new Map<string, Expr>();
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    if (line.trim() === '') continue;
    const m = /^([A-Za-z_][A-Za-z0-9_-]*) ::= (.*)$/.exec(line);
    if (!m) return undefined;
    if (m[2] === 'TagDispatch(') {
      // a structural tag's dispatch, one argument a line up to ")": free text (it may end at any
      // point) in which each trigger string starts its rule
      const refs: Expr[] = [];
      for (i++; i < lines.length && lines[i] !== ')'; i++) {
        const arg = /^\s*\("(?:[^"\\]|\\.)*", ([A-Za-z_][A-Za-z0-9_-]*)\),?$/.exec(lines[i]!);
        if (arg) refs.push({ k: 'ref', name: arg[1]! });
        else if (!/^\s*[a-z_]+=.*$/.test(lines[i]!)) return undefined;
      }
      if (i >= lines.length) return undefined;
      rules.set(m[1]!, { k: 'rep', e: { k: 'alt', items: refs }, min: 0 });
      continue;
    }
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
    if (c === '"') {
      const len = this.quoted('"');
      e = len === undefined ? undefined : { k: 'term', len };
    } else if (c === '[') e = this.quoted(']') === undefined ? undefined : { k: 'term', len: 1 };
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
      return { k: 'rep', e, min: 0 };
    }
    if (q === '+') {
      this.i++;
      return { k: 'rep', e, min: 1 };
    }
    if (q === '{') {
      const m = /^\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}/.exec(this.s.slice(this.i));
      if (!m) return undefined;
      this.i += m[0].length;
      return { k: 'rep', e, min: m[1] === '' ? 0 : Number(m[1]) };
    }
    return e;
  }
  /**
   * Skips a "..." string or [...] class (opening char at i), honouring backslash escapes; returns
   * how many characters it spells (an escape is one), or undefined when it does not close.
   */
  private quoted(close: string): number | undefined {
    this.i++;
    let n = 0;
    while (this.i < this.s.length) {
      const c = this.s[this.i]!;
      if (c === '\\') {
        const x = this.s[this.i + 1];
        this.i += x === 'x' ? 4 : x === 'u' ? 6 : x === 'U' ? 10 : 2;
      } else if (c === close) {
        this.i++;
        return n;
      } else this.i += c.codePointAt(0)! > 0xffff ? 2 : 1;
      n++;
    }
    return undefined;
  }
}

/**
 * The fewest characters each rule can finish with (Infinity: it never finishes), by Knuth's
 * generalisation of Dijkstra's algorithm: a rule's length is a sum-and-min of its references',
 * so taking the rules in increasing order settles each once. A reference to a rule the text does
 * not define counts as empty: the compiler reports undefined rules itself.
 */
export function shortestLengths(rules: ReadonlyMap<string, Expr>): Map<string, number> {
  const done = new Map<string, number>();
  const refsOf = (e: Expr, out: Set<string>): Set<string> => {
    if (e.k === 'ref') out.add(e.name);
    else if (e.k === 'seq' || e.k === 'alt') for (const x of e.items) refsOf(x, out);
    else if (e.k === 'rep') refsOf(e.e, out);
    return out;
  };
  const len = (e: Expr): number => {
    switch (e.k) {
      case 'term': return e.len;
      case 'ref': return done.get(e.name) ?? (rules.has(e.name) ? Infinity : 0);
      case 'seq': {
        let n = 0;
        for (const x of e.items) n += len(x);
        return n;
      }
      case 'alt': {
        let n = Infinity;
        for (const x of e.items) n = Math.min(n, len(x));
        return n;
      }
      case 'rep': return e.min === 0 ? 0 : e.min * len(e.e);
    }
  };
  const users = new Map<string, string[]>();
  for (const [name, e] of rules) for (const r of refsOf(e, new Set())) if (rules.has(r)) (users.get(r) ?? users.set(r, []).get(r)!).push(name);
  const heap = new MinHeap();
  for (const [name, e] of rules) {
    const n = len(e);
    if (n < Infinity) heap.push(n, name);
  }
  for (let top = heap.pop(); top; top = heap.pop()) {
    const [n, name] = top;
    if (done.has(name)) continue;
    done.set(name, n);
    for (const u of users.get(name) ?? []) {
      if (done.has(u)) continue;
      const m = len(rules.get(u)!);
      if (m < Infinity) heap.push(m, u);
    }
  }
  for (const name of rules.keys()) if (!done.has(name)) done.set(name, Infinity);
  return done;
}

/** A binary min-heap of [key, name]. */
class MinHeap {
  private readonly a: [number, string][] = [];
  push(key: number, name: string): void {
    const a = this.a;
    a.push([key, name]);
    for (let i = a.length - 1; i > 0;) {
      const p = (i - 1) >> 1;
      if (a[p]![0] <= a[i]![0]) break;
      [a[p], a[i]] = [a[i]!, a[p]!];
      i = p;
    }
  }
  pop(): [number, string] | undefined {
    const a = this.a;
    if (a.length === 0) return undefined;
    const top = a[0]!;
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      for (let i = 0; ;) {
        const l = 2 * i + 1, r = l + 1;
        let m = i;
        if (l < a.length && a[l]![0] < a[m]![0]) m = l;
        if (r < a.length && a[r]![0] < a[m]![0]) m = r;
        if (m === i) break;
        [a[m], a[i]] = [a[i]!, a[m]!];
        i = m;
      }
    }
    return top;
  }
}

/** The rules that derive at least one finite string. */
export function productiveRules(rules: ReadonlyMap<string, Expr>): Set<string> {
  const ok = new Set<string>();
  for (const [name, n] of shortestLengths(rules)) if (n < Infinity) ok.add(name);
  return ok;
}

/** The rules `root` can reach, in the order first reached (root first). */
function reachable(rules: ReadonlyMap<string, Expr>, root: string): string[] {
  const seen = new Set<string>([root]);
  const order = [root];
  const walk = (e: Expr): void => {
    if (e.k === 'ref') {
      if (!seen.has(e.name) && rules.has(e.name)) {
        seen.add(e.name);
        order.push(e.name);
      }
    } else if (e.k === 'seq' || e.k === 'alt') for (const x of e.items) walk(x);
    else if (e.k === 'rep') walk(e.e);
  };
  for (let i = 0; i < order.length; i++) walk(rules.get(order[i]!)!);
  return order;
}

/** For a grammar's normalized text: the reason it matches no string, or undefined (it does, or the text was not understood). */
export function emptyLanguageReason(normalized: string, root: string): string | undefined {
  const rules = parseNormalizedRules(normalized);
  if (!rules || !rules.has(root)) return undefined;
  return rootNeverFinishes(shortestLengths(rules), root);
}

function rootNeverFinishes(lengths: ReadonlyMap<string, number>, root: string): string | undefined {
  if (lengths.get(root)! < Infinity) return undefined;
  return `the grammar matches no string: rule "${root}" can never finish (every alternative leads back into a rule that never ends)`;
}

/** What makes a grammar unservable (languageProblem). */
export type LanguageProblem =
  /** it matches no string */
  | { kind: 'empty'; rule: string }
  /** a rule it can enter never finishes: an output that enters it can never end (and jump-forward would follow it without end) */
  | { kind: 'endless'; rule: string }
  /** a rule it can enter needs more than the limit: its shortest text would be forced, or generated, for that long */
  | { kind: 'long'; rule: string; chars: number; limit: number; root: boolean };

/**
 * For a grammar's normalized text, what makes it unservable, or undefined (nothing, or the text
 * was not understood). Without a `root` (a structural tag's text does not name its start rule)
 * every rule is checked.
 */
export function languageProblem(normalized: string, root: string | undefined, maxShortest: number): LanguageProblem | undefined {
  const rules = parseNormalizedRules(normalized);
  if (!rules || (root !== undefined && !rules.has(root))) return undefined;
  const lengths = shortestLengths(rules);
  if (root !== undefined && lengths.get(root) === Infinity) return { kind: 'empty', rule: root };
  for (const name of root === undefined ? rules.keys() : reachable(rules, root)) {
    const n = lengths.get(name)!;
    if (n === Infinity) return { kind: 'endless', rule: name };
    if (n > maxShortest) return { kind: 'long', rule: name, chars: n, limit: maxShortest, root: name === root };
  }
  return undefined;
}

/** A LanguageProblem as a sentence; `schema`: the grammar is a JSON schema's */
export function languageReason(p: LanguageProblem, schema: boolean): string {
  const chars = (n: number) => (n < 1e15 ? String(n) : n.toExponential(2));
  switch (p.kind) {
    case 'empty':
      return schema
        ? 'no JSON value satisfies it: its recursion (a $ref back into itself) has no way to end'
        : `the grammar matches no string: rule "${p.rule}" can never finish (every alternative leads back into a rule that never ends)`;
    case 'endless':
      return schema
        ? `part of it can never end (rule "${p.rule}" of its grammar: a $ref recursion with no way to end), so an output that enters it never ends`
        : `rule "${p.rule}" can never finish (every alternative leads back into a rule that never ends), so an output that enters it never ends`;
    case 'long':
      return `${p.root ? (schema ? 'its shortest valid JSON' : 'its shortest output') : `the shortest text of rule "${p.rule}"${schema ? ' of its grammar' : ''}`} is ` +
        `${chars(p.chars)} characters, more than the limit of ${p.limit}`;
  }
}
