// What a request may constrain its output to, before compilation. The wire formats (OpenAI
// response_format, vLLM guided_*, tool choices) are mapped onto these by the server.

import { createHash } from 'node:crypto';

/** xgrammar's structural-tag format objects (sequence, or, tag, const_string, json_schema, ...). */
export type StructuralFormat = { type: string; [key: string]: unknown };

export type GrammarSpec =
  /** a JSON value valid under the schema (strict: no properties the schema does not name) */
  | { type: 'json_schema'; schema: unknown }
  /** any JSON object */
  | { type: 'json_object' }
  | { type: 'regex'; pattern: string }
  /** xgrammar EBNF (GBNF-like: `root ::= ...`) */
  | { type: 'ebnf'; grammar: string; root?: string }
  /** exactly one of the strings */
  | { type: 'choice'; choices: string[] }
  /**
   * an xgrammar structural tag; every `json_schema` node inside is compiled to the same compact
   * JSON as the json_schema spec (used for tool calls)
   */
  | { type: 'structural_tag'; format: StructuralFormat };

/** The spec's JSON text: what its size is measured on and its key hashed from. */
export function specText(spec: GrammarSpec): string {
  return JSON.stringify(spec);
}

/** Content hash: the compile cache key (one cache per tokenizer). */
export function grammarKey(spec: GrammarSpec, text: string = specText(spec)): string {
  return createHash('sha256').update(text).digest('hex');
}

/** Short description for logs and errors. */
export function describeGrammar(spec: GrammarSpec): string {
  switch (spec.type) {
    case 'json_schema': return 'JSON schema';
    case 'json_object': return 'JSON object';
    case 'regex': return 'regex';
    case 'ebnf': return 'grammar';
    case 'choice': return 'choice';
    case 'structural_tag': return 'structural tag';
  }
}
