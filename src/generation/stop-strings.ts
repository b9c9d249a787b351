// Stop strings over streamed text.
//
// Feed text deltas as the detokenizer produces them. Text that could still be the start of a
// stop string is held back (never shown to the client, then taken back); everything before it
// is safe to emit at once. When a stop string completes, the text before it is emitted, the
// stop string itself is not (OpenAI; vLLM's include_stop_str_in_output=false), and the matcher
// is finished. `flush()` at the end of generation releases the held-back tail.
//
// If several stop strings complete within one feed, the one starting earliest wins (least text
// emitted); on equal starts, the longest. The engine stops generating at the token that
// completes a stop string, so a longer stop string that would have completed later never does.
// Cost per feed: O((held + delta) * stops), with held < the longest stop string.

export interface StopFeedResult {
  /** text safe to emit now */
  text: string;
  /** true once a stop string has been hit (this feed or earlier) */
  stopped: boolean;
  /** the stop string that was hit, on the feed that hit it */
  stop?: string;
}

export interface StopMatcherOptions {
  /** emit the stop string itself too (vLLM include_stop_str_in_output) */
  includeStop?: boolean;
}

export class StopStringMatcher {
  private readonly stops: readonly string[];
  private readonly maxLen: number;
  private readonly includeStop: boolean;
  /** held-back tail: always shorter than maxLen and a proper prefix of some stop string */
  private held = '';
  private done = false;

  constructor(stops: readonly string[], opts: StopMatcherOptions = {}) {
    // An empty stop string would match before any text; no caller means that, so it is ignored.
    this.stops = [...new Set(stops.filter((s) => s.length > 0))];
    this.maxLen = this.stops.reduce((m, s) => Math.max(m, s.length), 0);
    this.includeStop = opts.includeStop ?? false;
  }

  get stopped(): boolean {
    return this.done;
  }

  feed(delta: string): StopFeedResult {
    if (this.done) return { text: '', stopped: true };
    if (this.stops.length === 0) return { text: delta, stopped: false };
    const buf = this.held + delta;

    let at = -1;
    let hit = '';
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (at < 0 || i < at || (i === at && s.length > hit.length))) {
        at = i;
        hit = s;
      }
    }
    if (at >= 0) {
      this.done = true;
      this.held = '';
      return { text: buf.slice(0, this.includeStop ? at + hit.length : at), stopped: true, stop: hit };
    }

    const keep = this.partialSuffixLength(buf);
    this.held = buf.slice(buf.length - keep);
    return { text: buf.slice(0, buf.length - keep), stopped: false };
  }

  /** End of stream: the held-back text (empty after a stop). */
  flush(): string {
    const t = this.held;
    this.held = '';
    return t;
  }

  /** Length of the longest suffix of `buf` that is a proper prefix of some stop string. */
  private partialSuffixLength(buf: string): number {
    for (let len = Math.min(this.maxLen - 1, buf.length); len > 0; len--) {
      const tail = buf.slice(buf.length - len);
      for (const s of this.stops) if (s.length > len && s.startsWith(tail)) return len;
    }
    return 0;
  }
}
