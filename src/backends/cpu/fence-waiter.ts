// Waits for queue fences with at most one blocking native call in flight.
//
// Each llm_wait occupies a koffi worker thread (libuv's pool, shared with fs work) until the queue
// reaches its fence. Many concurrent `read`/`sync` calls therefore share one wait: the call in
// flight waits for the highest fence requested so far, and when it returns every request at or
// below it settles; requests above it start the next wait.
import type { NativeLib } from './native-lib.ts';

interface Pending {
  fence: number;
  resolve: () => void;
  reject: (e: Error) => void;
}

export class FenceWaiter {
  private pending: Pending[] = [];
  private inFlight = false;

  constructor(private readonly lib: NativeLib) {}

  /** Resolves once every op enqueued up to `fence` has run; rejects if one of them failed. */
  wait(fence: number): Promise<void> {
    return new Promise((resolve, reject) => {
      this.pending.push({ fence, resolve, reject });
      this.pump();
    });
  }

  private pump(): void {
    if (this.inFlight || this.pending.length === 0) return;
    this.inFlight = true;
    const target = Math.max(...this.pending.map((p) => p.fence));
    this.lib.waitAsync(target, (err, rc) => {
      this.inFlight = false;
      const done = this.pending.filter((p) => p.fence <= target);
      this.pending = this.pending.filter((p) => p.fence > target);
      const failure = err ? (err instanceof Error ? err : new Error(String(err)))
        : rc !== 0 ? new Error(`cpu backend: op failed: ${this.lib.lastError()}`) : null;
      for (const p of done) {
        // an op error reaches the waiters whose fence covers the failed op (sequence rc)
        if (failure && (err || p.fence >= rc)) p.reject(failure);
        else p.resolve();
      }
      this.pump();
    });
  }
}
