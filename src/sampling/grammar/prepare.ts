// Turning a GrammarSpec into what a compiler instance compiles, and compiling that. Shared by the
// compile worker (compile-worker.ts) and the in-thread fallback (checker.ts): both check a spec in
// a throwaway "validator" instance first, because a bad schema, regex or grammar aborts the
// xgrammar instance that parses it (see xgrammar-runtime.ts).
//
// JSON is compact and on one line (separators ", " and ": "): grammars that allow any whitespace
// let small models loop on blank space, and a fixed layout gives jump-forward longer spans.
// Numeric ranges, enums and choices get rules of our own (schema-rewrite.ts, dfa.ts): xgrammar
// 0.1.27 compiles them wrongly.

import { XGrammarError, type XgCompiledGrammar, type XgCompiler, type XgInstance } from './xgrammar-runtime.ts';
import { describeGrammar, type GrammarSpec, type StructuralFormat } from './spec.ts';
import { applySchemaRules, rewriteSchema } from './schema-rewrite.ts';
import { alt, dfaEbnf, str } from './dfa.ts';
import { DEFAULT_GRAMMAR_LIMITS, languageProblem, languageReason, precheckSchema, precheckSpec, unsatisfiableSchemaReason, type GrammarLimits } from './precheck.ts';

/** The request's schema, regex or grammar is invalid; `message` is the compiler's. */
export class GrammarSpecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GrammarSpecError';
  }
}

/**
 * What a compiler instance compiles once a validator accepted the spec: plain strings, so it
 * crosses threads as it is (a compiled grammar cannot: see compiler.ts).
 */
export type Prepared =
  | { kind: 'ebnf'; grammar: string; root: string }
  | { kind: 'structural_tag'; json: string };

const JSON_OBJECT_SCHEMA = '{"type": "object"}';

/**
 * Checks `spec` with `check` (which runs a function on a validator instance and turns an
 * XGrammarError into a GrammarSpecError carrying the compiler's message) and returns its
 * prepared form. JSON schemas, also those inside structural tags, become compact EBNF here.
 * Every grammar is then read back in xgrammar's normalized form and refused when it can match
 * nothing, can enter a rule that never ends, or needs a longer text than the limits allow
 * (precheck.ts languageProblem).
 */
export function prepareSpec(
  spec: GrammarSpec,
  check: <T>(fn: Parameters<XgInstance['call']>[0]) => T,
  limits: Readonly<GrammarLimits> = DEFAULT_GRAMMAR_LIMITS,
): Prepared {
  const invalid = (message: string): never => {
    throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${message}`);
  };
  const refused = precheckSpec(spec, limits);
  if (refused !== undefined) invalid(refused);
  /** refuses a grammar (normalized text) that cannot be served */
  const servable = (normalized: string, root: string | undefined, schema: boolean): void => {
    const p = languageProblem(normalized, root, limits.maxShortestChars);
    if (p) invalid(languageReason(p, schema));
  };
  const normalizedEbnf = (grammar: string, root: string): string => check<string>((b) => {
    const g = new b.Grammar.FromEBNF(grammar, root);
    try {
      return g.ToString();
    } finally {
      g.delete();
    }
  });
  const normalizedTag = (json: string): string => check<string>((b) => {
    const g = b.Grammar.FromStructuralTag(json);
    try {
      return g.ToString();
    } finally {
      g.delete();
    }
  });
  /** xgrammar's EBNF for a schema's JSON */
  const fromSchema = (text: string, strict: boolean): string => check<string>((b) => {
    const g = new b.Grammar.FromJSONSchema(text, false, undefined, undefined, strict, undefined, false);
    try {
      return fixStringRules(g.ToString());
    } finally {
      g.delete();
    }
  });
  /** compact JSON for a schema, as EBNF, with our rules for ranges and enums (schema-rewrite.ts) */
  const jsonEbnf = (schema: unknown): string => {
    const original = schemaText(schema, invalid);
    const rw = rewriteSchema(schema);
    const asWritten = fromSchema(original, true); // xgrammar's message, should the schema be invalid
    const unsatisfiable = unsatisfiableSchemaReason(schema, limits);
    if (unsatisfiable !== undefined) invalid(unsatisfiable);
    const ebnf = rw.rules.size === 0 ? asWritten : applySchemaRules(fromSchema(JSON.stringify(rw.schema), true), rw) ?? asWritten;
    servable(normalizedEbnf(ebnf, 'root'), 'root', true);
    return ebnf;
  };
  /** a schema inside a structural tag: the checks a json_schema spec gets first */
  const nodeEbnf = (schema: unknown): string => {
    const r = precheckSchema(schema, limits);
    if (r !== undefined) invalid(r);
    return jsonEbnf(schema);
  };
  switch (spec.type) {
    case 'json_object':
      return { kind: 'ebnf', grammar: fromSchema(JSON_OBJECT_SCHEMA, false), root: 'root' };
    case 'json_schema':
      return { kind: 'ebnf', grammar: jsonEbnf(spec.schema), root: 'root' };
    case 'ebnf': {
      if (typeof spec.grammar !== 'string' || spec.grammar.trim() === '') invalid('the grammar is empty');
      const root = spec.root ?? 'root';
      servable(normalizedEbnf(spec.grammar, root), root, false);
      return { kind: 'ebnf', grammar: spec.grammar, root };
    }
    case 'regex': {
      if (typeof spec.pattern !== 'string' || spec.pattern === '') invalid('the pattern is empty');
      const json = JSON.stringify({ type: 'structural_tag', format: { type: 'regex', pattern: spec.pattern } });
      // the regex's rule is the text's "root"
      servable(normalizedTag(json), 'root', false);
      return { kind: 'structural_tag', json };
    }
    case 'choice': {
      if (!Array.isArray(spec.choices) || spec.choices.length === 0) invalid('the list of choices is empty');
      if (spec.choices.some((c) => typeof c !== 'string' || c === '')) invalid('every choice must be a non-empty string');
      // deterministic EBNF, not xgrammar's alternation of strings (see dfa.ts)
      const g = dfaEbnf(alt(...[...new Set(spec.choices)].map(str)), 'choice')!;
      const grammar = [`root ::= ${g.expr}`, ...g.rules].join('\n');
      servable(normalizedEbnf(grammar, 'root'), 'root', false);
      return { kind: 'ebnf', grammar, root: 'root' };
    }
    case 'structural_tag': {
      const format = compactJsonNodes(spec.format, nodeEbnf);
      const json = JSON.stringify({ type: 'structural_tag', format });
      servable(normalizedTag(json), undefined, false);
      return { kind: 'structural_tag', json };
    }
  }
}

/** `check` for prepareSpec over one instance: the compiler's failures become GrammarSpecErrors. */
export function checkIn(inst: XgInstance, spec: GrammarSpec): <T>(fn: Parameters<XgInstance['call']>[0]) => T {
  return <T>(fn: Parameters<XgInstance['call']>[0]): T => {
    try {
      return inst.call(fn) as T;
    } catch (err) {
      if (err instanceof XGrammarError) throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${compilerReason(err.message)}`);
      throw err;
    }
  };
}

/**
 * The compiler's message, or a fixed sentence where xgrammar threw a C++ exception without one
 * (the WASM build surfaces only the exception's address, a number that changes run to run).
 */
export function compilerReason(message: string): string {
  return /^\d+$/.test(message.trim()) ? 'the compiler refused it without giving a reason' : message;
}

/** Compiles a prepared spec in `inst` (synchronous: the expensive part, see compiler.ts). */
export function compilePrepared(inst: XgInstance, compiler: XgCompiler, prepared: Prepared): XgCompiledGrammar {
  return inst.call((b) => {
    switch (prepared.kind) {
      case 'ebnf': {
        const g = new b.Grammar.FromEBNF(prepared.grammar, prepared.root);
        try {
          return compiler.CompileGrammar(g);
        } finally {
          g.delete();
        }
      }
      case 'structural_tag':
        return compiler.CompileStructuralTag(prepared.json);
    }
  });
}

/**
 * xgrammar 0.1.27 writes length-limited strings (minLength/maxLength) with the character class
 * [^"\\\r\n], which lets raw control characters (U+0000-U+001F) into a JSON string, where
 * JSON.parse rejects them; its unlimited strings exclude them. Same exclusion here.
 */
export function fixStringRules(ebnf: string): string {
  return ebnf.split('[^\\"\\\\\\r\\n]').join('[^\\0-\\x1f\\"\\\\\\r\\n]');
}

/** A schema as xgrammar takes it: JSON text of an object or a boolean. */
function schemaText(schema: unknown, invalid: (m: string) => never): string {
  if (typeof schema === 'boolean') return JSON.stringify(schema);
  if (schema === null || typeof schema !== 'object' || Array.isArray(schema)) return invalid('the schema must be a JSON object');
  return JSON.stringify(schema);
}

/** Replaces every {type: "json_schema", json_schema} node with {type: "grammar", grammar: EBNF}. */
function compactJsonNodes(node: unknown, toEbnf: (schema: unknown) => string): unknown {
  if (Array.isArray(node)) return node.map((n) => compactJsonNodes(n, toEbnf));
  if (node === null || typeof node !== 'object') return node;
  const obj = node as StructuralFormat;
  if (obj.type === 'json_schema' && 'json_schema' in obj) return { type: 'grammar', grammar: toEbnf(obj.json_schema) };
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) out[k] = compactJsonNodes(v, toEbnf);
  return out;
}
