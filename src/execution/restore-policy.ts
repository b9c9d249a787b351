// Whether reading a prefix back from the SSD tier beats computing it again.
//
// On the CPU a restore is 6-230x faster than prefilling (BENCHMARKS.md, prefix cache). On a fast
// GPU it can be the other way round: an H200 prefills Llama-3.1-8B at 22-33k tok/s while a restore
// reads 128 KiB a token from disk, and restoring measured 0.19x (1k tokens) to 0.66x (32k) of the
// cold prefill. So the engine keeps two running rates, both measured on this machine: prefill
// tokens per ms (from its own prefill-heavy steps) and restore bytes per ms (from finished
// restores), and restores only when the predicted read is faster than the predicted prefill.
// Until both rates are known it restores (the first restore is what measures the disk).

/** steps with at least this many tokens count as prefill for the rate (decode steps are latency-bound) */
export const PREFILL_RATE_MIN_TOKENS = 256;
/** weight of the newest sample in each running rate */
const EWMA = 0.3;

export class RestorePolicy {
  /** prefill tokens per ms, once a prefill-heavy step was timed */
  prefillTokensPerMs?: number;
  /** restore bytes per ms, once a restore was timed */
  restoreBytesPerMs?: number;
  /** restores skipped because computing was predicted faster */
  skipped = 0;

  /** A timed engine step that computed `tokens` tokens. */
  recordStep(tokens: number, ms: number): void {
    if (tokens < PREFILL_RATE_MIN_TOKENS || !(ms > 0)) return;
    this.prefillTokensPerMs = mix(this.prefillTokensPerMs, tokens / ms);
  }

  /** A finished restore of `bytes` that took `ms` from request to data in host memory. */
  recordRestore(bytes: number, ms: number): void {
    if (bytes <= 0 || !(ms > 0)) return;
    this.restoreBytesPerMs = mix(this.restoreBytesPerMs, bytes / ms);
  }

  /** true: read the `bytes` that hold `tokens` prompt tokens; false: compute them (counted). */
  shouldRestore(tokens: number, bytes: number): boolean {
    if (this.prefillTokensPerMs === undefined || this.restoreBytesPerMs === undefined) return true;
    const readMs = bytes / this.restoreBytesPerMs;
    const computeMs = tokens / this.prefillTokensPerMs;
    if (readMs < computeMs) return true;
    this.skipped++;
    return false;
  }
}

const mix = (old: number | undefined, sample: number) => (old === undefined ? sample : old + EWMA * (sample - old));
