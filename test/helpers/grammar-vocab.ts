// A synthetic vocabulary for grammar tests and benches: no tokenizer file, any size.
import type { GrammarVocab } from '../../src/sampling/grammar/index.ts';

/** `size` distinct tokens of 2-4 printable ASCII characters (quotes and brackets included), id 0 the stop token */
export function asciiGrammarVocab(size: number): GrammarVocab {
  const chars: string[] = [];
  for (let c = 0x20; c < 0x7f; c++) if (c !== 0x5c) chars.push(String.fromCharCode(c));
  const tokens = ['<eos>', ...chars];
  const seen = new Set(tokens);
  let s = 12345;
  const next = () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s;
  };
  while (tokens.length < size) {
    let t = '';
    for (let i = 0, n = 2 + (next() % 3); i < n; i++) t += chars[next() % chars.length];
    if (!seen.has(t)) {
      seen.add(t);
      tokens.push(t);
    }
  }
  const ids = new Map(tokens.map((t, i) => [t, i]));
  return {
    tokens, vocabType: 'raw', prependSpace: false, vocabSize: size, stopTokenIds: [0],
    encode: (text) => [...text].map((ch) => ids.get(ch)!), decode: (x) => x.map((i) => tokens[i]).join(''),
  };
}
