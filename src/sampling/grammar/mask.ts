// Token bitmasks (xgrammar's layout): bit (id & 31) of 32-bit word (id >> 5) is 1 when token id
// is allowed. Applying one to a logit row is a tight loop over words: an all-ones word (the
// common case inside free text) costs one compare, an all-zeros word one 32-wide fill.

/** Sets every disallowed logit to -Infinity, in place. Ids past the mask are disallowed. */
export function applyTokenBitmask(logits: Float32Array, mask: Int32Array): void {
  const V = logits.length;
  const full = Math.min(mask.length, V >>> 5); // words wholly inside the row
  for (let w = 0; w < full; w++) {
    const bits = mask[w]!;
    if (bits === -1) continue;
    const base = w << 5;
    if (bits === 0) {
      for (let i = base; i < base + 32; i++) logits[i] = -Infinity;
      continue;
    }
    for (let b = 0; b < 32; b++) if (((bits >>> b) & 1) === 0) logits[base + b] = -Infinity;
  }
  // a partial last word, then anything the mask does not cover
  let i = full << 5;
  if (full < mask.length) {
    const bits = mask[full]!;
    for (; i < V && i < (full + 1) << 5; i++) if (((bits >>> (i & 31)) & 1) === 0) logits[i] = -Infinity;
  }
  for (; i < V; i++) logits[i] = -Infinity;
}

/** True when token `id` is allowed. */
export function maskAllows(mask: Int32Array, id: number): boolean {
  const w = id >>> 5;
  return w < mask.length && ((mask[w]! >>> (id & 31)) & 1) === 1;
}

/** Number of allowed ids below `vocabSize`. */
export function countAllowed(mask: Int32Array, vocabSize: number): number {
  let n = 0;
  const last = ((vocabSize + 31) >>> 5) - 1; // the word holding id vocabSize - 1
  const words = Math.min(mask.length, last + 1);
  for (let w = 0; w < words; w++) {
    let x = mask[w]!;
    if (w === last && (vocabSize & 31) !== 0) x &= (1 << (vocabSize & 31)) - 1;
    x -= (x >>> 1) & 0x55555555;
    x = (x & 0x33333333) + ((x >>> 2) & 0x33333333);
    n += (Math.imul((x + (x >>> 4)) & 0x0f0f0f0f, 0x01010101) >>> 24);
  }
  return n;
}
