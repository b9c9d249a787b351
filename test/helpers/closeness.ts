// The closeness rule of ARCHITECTURE.md's "Correctness" (vLLM's check_logprobs_close): tokens equal up to the first
// divergence; at a divergence each side's token must be in the other's top-k; on the matched
// prefix the chosen tokens' logprobs agree within `tolerance`.

export interface StepRecord {
  token_id: number;
  logprob: number;
  top: { token_id: number; logprob: number }[];
}

export interface Closeness {
  ok: boolean;
  /** steps equal before the first divergence (= all steps when none) */
  matched: number;
  /** largest |logprob difference| of the chosen token on the matched prefix */
  maxLogprobDiff: number;
  problem?: string;
}

export function compareToReference(ours: StepRecord[], ref: StepRecord[], tolerance: number): Closeness {
  const n = Math.min(ours.length, ref.length);
  let maxDiff = 0;
  for (let s = 0; s < n; s++) {
    const a = ours[s], b = ref[s];
    if (a.token_id !== b.token_id) {
      const aInB = b.top.some((t) => t.token_id === a.token_id);
      const bInA = a.top.some((t) => t.token_id === b.token_id);
      const ok = aInB && bInA && maxDiff <= tolerance;
      return {
        ok, matched: s, maxLogprobDiff: maxDiff,
        problem: ok ? undefined : `step ${s}: ours ${a.token_id} (in ref top: ${aInB}) vs ref ${b.token_id} (in our top: ${bInA}); max diff ${maxDiff.toFixed(4)}`,
      };
    }
    maxDiff = Math.max(maxDiff, Math.abs(a.logprob - b.logprob));
  }
  const ok = maxDiff <= tolerance && ours.length >= ref.length;
  return {
    ok, matched: n, maxLogprobDiff: maxDiff,
    problem: ok ? undefined : `max logprob diff ${maxDiff.toFixed(4)} over ${n} steps (ours ${ours.length}, ref ${ref.length})`,
  };
}
