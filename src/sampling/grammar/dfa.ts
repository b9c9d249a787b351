// Regular languages written as *deterministic* EBNF, to keep clear of an xgrammar 0.1.27 bug.
//
// xgrammar turns a rule into a finite automaton and merges "equivalent" states; in 0.1.27 that
// merge over-simplifies (upstream issue mlc-ai/xgrammar#618, fixed by #632 after the last
// @mlc-ai/web-xgrammar release): measured here, `root ::= "baaa" | "baa"` accepts "baaaa", a
// JSON-schema enum ["xx", "x"] accepts "xxx" (168 of 1,500 random small enums accept a
// non-member), and guided_choice / regex alternations misbehave the same way. The merge needs two
// edges with the same label leaving one state; a deterministic grammar, where the alternatives
// at every branch begin with disjoint characters, has none. So the grammars llmts writes itself
// (numeric ranges, enums, choices) are built here as a minimal DFA and printed with one
// alternative per distinct next-character set.

/** A regular expression over characters (code points). */
export type Re =
  | { t: 'set'; chars: readonly string[] }
  | { t: 'seq'; items: readonly Re[] }
  | { t: 'alt'; items: readonly Re[] }
  | { t: 'star'; item: Re };

export const set = (chars: Iterable<string>): Re => ({ t: 'set', chars: [...chars] });
export const seq = (...items: Re[]): Re => ({ t: 'seq', items });
export const alt = (...items: Re[]): Re => ({ t: 'alt', items });
export const star = (item: Re): Re => ({ t: 'star', item });
export const empty: Re = { t: 'seq', items: [] };
/** the literal text */
export const str = (s: string): Re => seq(...[...s].map((c) => set([c])));
/** the digits lo..hi */
export const digits = (lo: number, hi: number): Re => set(Array.from({ length: hi - lo + 1 }, (_, i) => String(lo + i)));

interface Dfa {
  /** per state: next character -> state */
  next: Map<string, number>[];
  accepting: boolean[];
  start: number;
}

/** Thompson NFA -> subset construction -> Moore minimisation (states that can no longer accept are dropped). */
export function toDfa(re: Re): Dfa {
  // NFA
  const edges: Map<string, number[]>[] = [];
  const eps: number[][] = [];
  const state = () => {
    edges.push(new Map());
    eps.push([]);
    return edges.length - 1;
  };
  const build = (r: Re, from: number): number => {
    switch (r.t) {
      case 'set': {
        const to = state();
        for (const c of new Set(r.chars)) {
          const l = edges[from]!.get(c) ?? [];
          l.push(to);
          edges[from]!.set(c, l);
        }
        return to;
      }
      case 'seq': {
        let cur = from;
        for (const item of r.items) cur = build(item, cur);
        return cur;
      }
      case 'alt': {
        const end = state();
        for (const item of r.items) eps[build(item, from)]!.push(end);
        return end;
      }
      case 'star': {
        const loop = state();
        eps[from]!.push(loop);
        eps[build(r.item, loop)]!.push(loop);
        return loop;
      }
    }
  };
  const nStart = state();
  const nEnd = build(re, nStart);
  const closure = (states: Iterable<number>): number[] => {
    const seen = new Set<number>(states);
    const stack = [...seen];
    while (stack.length) for (const t of eps[stack.pop()!]!) if (!seen.has(t)) { seen.add(t); stack.push(t); }
    return [...seen].sort((a, b) => a - b);
  };
  // subset construction
  const ids = new Map<string, number>();
  const subsets: number[][] = [];
  const next: Map<string, number>[] = [];
  const intern = (s: number[]): number => {
    const key = s.join(',');
    let id = ids.get(key);
    if (id === undefined) {
      id = subsets.length;
      ids.set(key, id);
      subsets.push(s);
      next.push(new Map());
    }
    return id;
  };
  intern(closure([nStart]));
  for (let i = 0; i < subsets.length; i++) {
    const moves = new Map<string, Set<number>>();
    for (const s of subsets[i]!) for (const [c, ts] of edges[s]!) {
      const m = moves.get(c) ?? new Set<number>();
      for (const t of ts) m.add(t);
      moves.set(c, m);
    }
    for (const [c, ts] of moves) next[i]!.set(c, intern(closure(ts)));
  }
  const accepting = subsets.map((s) => s.includes(nEnd));
  return minimise({ next, accepting, start: 0 });
}

function minimise(d: Dfa): Dfa {
  const n = d.next.length;
  // live states: those that can still reach an accepting one
  const live = d.accepting.slice();
  for (let changed = true; changed;) {
    changed = false;
    for (let i = 0; i < n; i++) if (!live[i] && [...d.next[i]!.values()].some((t) => live[t])) live[i] = changed = true;
  }
  let cls: number[] = d.accepting.map((a) => (a ? 1 : 0));
  for (;;) {
    const sigs = new Map<string, number>();
    const refined = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      if (!live[i]) {
        refined[i] = -1;
        continue;
      }
      const out = [...d.next[i]!].filter(([, t]) => live[t]).map(([c, t]) => `${c}\u0000${cls[t]}`).sort().join('\u0001');
      const key = `${cls[i]}|${out}`;
      if (!sigs.has(key)) sigs.set(key, sigs.size);
      refined[i] = sigs.get(key)!;
    }
    const stable = new Set(refined.filter((c) => c >= 0)).size === new Set(cls.filter((c, i) => live[i] && c >= 0)).size;
    cls = refined;
    if (stable) break;
  }
  const count = Math.max(-1, ...cls) + 1;
  const next = Array.from({ length: count }, () => new Map<string, number>());
  const accepting = new Array<boolean>(count).fill(false);
  for (let i = 0; i < n; i++) {
    const c = cls[i]!;
    if (c < 0) continue;
    accepting[c] = d.accepting[i]!;
    for (const [ch, t] of d.next[i]!) if (cls[t]! >= 0) next[c]!.set(ch, cls[t]!);
  }
  if (cls[d.start]! < 0) return { next: [new Map()], accepting: [false], start: 0 };
  return { next, accepting, start: cls[d.start]! };
}

/** a character as EBNF writes it inside "..." or [...] (letters and digits raw, the rest escaped) */
function esc(c: string): string {
  if (/^[A-Za-z0-9]$/.test(c)) return c;
  const cp = c.codePointAt(0)!;
  return cp <= 0xffff ? `\\u${cp.toString(16).padStart(4, '0')}` : `\\U${cp.toString(16).padStart(8, '0')}`;
}

/** one character, or a class of several (consecutive code points as ranges) */
function charClass(chars: string[]): string {
  const cps = chars.map((c) => c.codePointAt(0)!).sort((a, b) => a - b);
  if (cps.length === 1) return `"${esc(String.fromCodePoint(cps[0]!))}"`;
  let out = '';
  for (let i = 0; i < cps.length;) {
    let j = i;
    while (j + 1 < cps.length && cps[j + 1] === cps[j]! + 1) j++;
    const a = esc(String.fromCodePoint(cps[i]!));
    out += j === i ? a : j === i + 1 ? a + esc(String.fromCodePoint(cps[j]!)) : `${a}-${esc(String.fromCodePoint(cps[j]!))}`;
    i = j + 1;
  }
  return `[${out}]`;
}

/**
 * The language of `re` as deterministic EBNF: an expression (what to write where the language is
 * used) and the rule definitions it refers to (named `${name}_s<k>`; states reached from more than
 * one place, or on a cycle, get a rule; the rest is written inline). Undefined for the empty
 * language.
 */
export function dfaEbnf(re: Re, name: string): { expr: string; rules: string[] } | undefined {
  const d = toDfa(re);
  if (!d.accepting[d.start] && d.next[d.start]!.size === 0) return undefined;
  const n = d.next.length;
  const indegree = new Array<number>(n).fill(0);
  for (let i = 0; i < n; i++) for (const t of new Set(d.next[i]!.values())) indegree[t]!++;
  // states on a cycle (targets of back edges in a depth-first walk) get rules, so inlining ends
  const ruled = indegree.map((k) => k > 1);
  const color = new Array<number>(n).fill(0);
  const dfs = (i: number): void => {
    color[i] = 1;
    for (const t of new Set(d.next[i]!.values())) {
      if (color[t] === 1) ruled[t] = true;
      else if (color[t] === 0) dfs(t);
    }
    color[i] = 2;
  };
  dfs(d.start);
  const ruleName = (i: number) => `${name}_s${i}`;
  const expr = (i: number): string => {
    const byTarget = new Map<number, string[]>();
    for (const [c, t] of d.next[i]!) {
      const l = byTarget.get(t) ?? [];
      l.push(c);
      byTarget.set(t, l);
    }
    const parts: string[] = d.accepting[i] ? ['""'] : [];
    for (const [t, chars] of byTarget) {
      const cls = charClass(chars);
      if (d.next[t]!.size === 0) parts.push(cls); // accepting leaf
      else parts.push(`${cls} ${ruled[t] ? ruleName(t) : `(${expr(t)})`}`);
    }
    return parts.length === 1 ? parts[0]! : parts.map((p) => `(${p})`).join(' | ');
  };
  const rules: string[] = [];
  for (let i = 0; i < n; i++) if (ruled[i]) rules.push(`${ruleName(i)} ::= ${expr(i)}`);
  return { expr: ruled[d.start] ? ruleName(d.start) : expr(d.start), rules };
}
