// Rules of our own for the JSON-schema nodes xgrammar 0.1.27 compiles wrongly: numeric ranges
// (numeric-ranges.ts) and enums, also written as anyOf/oneOf of const/enum nodes (a flat
// alternation of literals, which its automaton merge breaks: see dfa.ts). A lone `const` is one
// literal, nothing to merge: it is left to xgrammar. Before a schema reaches xgrammar each such node is swapped for a constant
// placeholder string; in the EBNF xgrammar writes for it, the placeholder's literal is replaced by
// our deterministic grammar for the node, whose rules are appended.

import { randomBytes } from 'node:crypto';
import { alt, dfaEbnf, str, type Re } from './dfa.ts';
import { numericRangeRe } from './numeric-ranges.ts';

export interface SchemaRewrite {
  /** the schema with the nodes we take over replaced by placeholder constants */
  schema: unknown;
  /** placeholder literal as xgrammar writes it in EBNF -> our expression and its rules */
  rules: Map<string, { expr: string; rules: string[] }>;
}

/** keywords whose values are data, not schemas */
const DATA_KEYS = new Set(['const', 'enum', 'default', 'examples']);
/** keywords that do not constrain a value (an enum node may carry them, and `type`, for us to take it over) */
const ANNOTATIONS = new Set(['title', 'description', 'default', 'examples', '$comment', 'deprecated', 'readOnly', 'writeOnly']);
const PREFIX = '__llmts_rule_';

export function rewriteSchema(schema: unknown): SchemaRewrite {
  const rules = new Map<string, { expr: string; rules: string[] }>();
  const nonce = randomBytes(6).toString('hex');
  const walk = (node: unknown): unknown => {
    if (Array.isArray(node)) return node.map(walk);
    if (node === null || typeof node !== 'object') return node;
    const obj = node as Record<string, unknown>;
    const re = numericRangeRe(obj) ?? ('const' in obj && !('anyOf' in obj) && !('oneOf' in obj) ? undefined : enumRe(obj));
    const name = `llmts_${nonce}_${rules.size}`;
    const ebnf = re && dfaEbnf(re, name);
    if (ebnf) {
      const placeholder = `${PREFIX}${nonce}_${rules.size}__`;
      rules.set(`"\\"${placeholder}\\""`, ebnf);
      return { const: placeholder };
    }
    const out: Record<string, unknown> = {};
    for (const [key, v] of Object.entries(obj)) out[key] = DATA_KEYS.has(key) ? v : walk(v);
    return out;
  };
  return { schema: walk(schema), rules };
}

/**
 * Puts our rules into xgrammar's EBNF for the rewritten schema; undefined when a placeholder
 * survives in any other form (then the caller compiles the schema as written).
 */
export function applySchemaRules(ebnf: string, rw: SchemaRewrite): string | undefined {
  let out = ebnf;
  const defs: string[] = [];
  for (const [literal, { expr, rules }] of rw.rules) {
    const parts = out.split(literal);
    if (parts.length < 2) continue; // a node the grammar never reaches
    out = parts.join(`(${expr})`);
    defs.push(...rules);
  }
  if (out.includes(PREFIX)) return undefined;
  return defs.length === 0 ? out : `${out.trimEnd()}\n${defs.join('\n')}\n`;
}

/** The values of an enum node, or of anyOf/oneOf over enum/const nodes, as JSON texts; or undefined. */
function enumRe(node: Record<string, unknown>): Re | undefined {
  const texts = literalValues(node);
  return texts && texts.length > 0 ? alt(...texts.map(str)) : undefined;
}

/** distinct JSON texts of the values `node` allows, when it allows only listed values */
function literalValues(node: Record<string, unknown>): string[] | undefined {
  const branches = Array.isArray(node.anyOf) ? node.anyOf : Array.isArray(node.oneOf) ? node.oneOf : undefined;
  if (branches) {
    // anyOf/oneOf of literal nodes (a Pydantic union of Literals), and nothing else but annotations
    if (branches.length === 0 || Object.keys(node).some((k) => k !== 'anyOf' && k !== 'oneOf' && !ANNOTATIONS.has(k))) return undefined;
    if ('anyOf' in node && 'oneOf' in node) return undefined;
    const sets: string[][] = [];
    for (const b of branches) {
      if (b === null || typeof b !== 'object' || Array.isArray(b)) return undefined;
      const vs = literalValues(b as Record<string, unknown>);
      if (!vs) return undefined;
      sets.push(vs);
    }
    const count = new Map<string, number>();
    for (const vs of sets) for (const v of vs) count.set(v, (count.get(v) ?? 0) + 1);
    // oneOf: a value two branches allow matches both, which oneOf forbids
    return [...count].filter(([, n]) => n === 1 || 'anyOf' in node).map(([v]) => v);
  }
  let values: unknown[];
  if (Array.isArray(node.enum) && node.enum.length > 0 && !('const' in node)) values = node.enum;
  else if ('const' in node && !('enum' in node)) values = [node.const];
  else return undefined;
  if (Object.keys(node).some((k) => k !== 'enum' && k !== 'const' && k !== 'type' && !ANNOTATIONS.has(k))) return undefined;
  if (node.type !== undefined) {
    const types = Array.isArray(node.type) ? node.type : [node.type];
    if (!types.every((t) => typeof t === 'string')) return undefined;
    values = values.filter((v) => types.some((t) => hasType(v, t as string)));
  }
  return [...new Set(values.map(jsonText))];
}

function hasType(v: unknown, t: string): boolean {
  switch (t) {
    case 'string': return typeof v === 'string';
    case 'number': return typeof v === 'number';
    case 'integer': return Number.isInteger(v);
    case 'boolean': return typeof v === 'boolean';
    case 'null': return v === null;
    case 'array': return Array.isArray(v);
    case 'object': return v !== null && typeof v === 'object' && !Array.isArray(v);
    default: return false;
  }
}

/** JSON on one line with the separators the rest of the output uses (", " and ": "). */
export function jsonText(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(jsonText).join(', ')}]`;
  if (v !== null && typeof v === 'object') return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${jsonText(x)}`).join(', ')}}`;
  return JSON.stringify(v) ?? 'null';
}
