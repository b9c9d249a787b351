// A bounded, single-consumer async stream of a sequence's events. The engine pushes without
// ever waiting; when the buffer passes its high-water mark the engine pauses that sequence (it
// is skipped by the scheduler, its KV kept) until the reader catches up. A reader that stays away
// longer than the idle timeout, or leaves the loop early, cancels the sequence.

export class EventStream<T> implements AsyncIterable<T> {
  private readonly buffer: T[] = [];
  private ended = false;
  private waiter?: () => void;
  private idleTimer?: NodeJS.Timeout;

  constructor(
    private readonly highWater: number,
    private readonly idleTimeoutMs: number,
    /** called once when the reader abandons the stream (early exit or idle timeout) */
    private readonly onAbandon: (why: string) => void,
    /** called when a full buffer drains below the mark, so the engine can resume the sequence */
    private readonly onDrain: () => void,
  ) {}

  get isFull(): boolean {
    return this.buffer.length >= this.highWater;
  }

  /** events it takes before it is full (<= 0 when it is) */
  get room(): number {
    return this.highWater - this.buffer.length;
  }

  push(event: T): void {
    if (this.ended) return;
    this.buffer.push(event);
    if (this.isFull && !this.idleTimer && this.idleTimeoutMs > 0) {
      this.idleTimer = setTimeout(() => this.onAbandon('stream not read for ' + this.idleTimeoutMs + ' ms'), this.idleTimeoutMs);
      this.idleTimer.unref();
    }
    this.wakeReader();
  }

  end(): void {
    this.ended = true;
    this.clearIdle();
    this.wakeReader();
  }

  private wakeReader(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }
  private clearIdle(): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    let finishedNormally = false;
    try {
      for (;;) {
        if (this.buffer.length > 0) {
          const wasFull = this.isFull;
          const e = this.buffer.shift()!;
          if (wasFull && !this.isFull) {
            this.clearIdle();
            this.onDrain();
          }
          yield e;
          continue;
        }
        if (this.ended) {
          finishedNormally = true;
          return;
        }
        await new Promise<void>((resolve) => (this.waiter = resolve));
      }
    } finally {
      if (!finishedNormally && !this.ended) this.onAbandon('reader left the stream');
      this.clearIdle();
    }
  }
}
