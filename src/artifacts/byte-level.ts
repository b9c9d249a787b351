// GPT-2's byte-level BPE alphabet: every byte is written as a printable character in token
// strings. Tools that need a token's raw bytes (logprob `bytes`, grammar vocabularies) invert it.

let table: ReadonlyMap<string, number> | undefined;

/** printable character -> byte, for the 256 characters of the byte-level alphabet */
export function byteLevelCharToByte(): ReadonlyMap<string, number> {
  if (table) return table;
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  const m = new Map<string, number>();
  bs.forEach((b, k) => m.set(String.fromCodePoint(cs[k]!), b));
  return (table = m);
}
