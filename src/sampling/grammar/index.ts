// Grammar-constrained decoding (xgrammar): compile a spec once per tokenizer (checked and
// trial-compiled on a worker thread first), start one matcher per row, mask each row's logits
// with its matcher's bitmask, advance the matcher with the token.
export * from './spec.ts';
export * from './vocab.ts';
export * from './mask.ts';
export * from './matcher.ts';
export * from './compiler.ts';
export { XGrammarError } from './xgrammar-runtime.ts';
