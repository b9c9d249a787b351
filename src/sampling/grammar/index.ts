// Grammar-constrained decoding (xgrammar): compile a spec once per tokenizer (checked on the
// check worker, compiled on a grammar host thread), start one matcher per row on that host, mask
// each row's logits with its matcher's bitmask, advance the matcher with the token.
export * from './spec.ts';
export * from './vocab.ts';
export * from './mask.ts';
export * from './matcher.ts';
export * from './compiler.ts';
export { XGrammarError } from './xgrammar-runtime.ts';
