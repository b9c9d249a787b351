// Device time per kernel, for finding where a step goes (bench/cuda-generate.ts --profile-steps).
//
// Each profiled launch is bracketed by two timing events on the backend's one stream. Events
// on the same stream do not reorder or overlap work, so the per-kernel device times are exact
// while the host-side cost of recording them (two driver calls per launch) makes a profiled step
// slower on the host: profile for device times, measure wall time without it.
import { check, num, out64, type Driver } from './cuda-lib.ts';

export interface KernelTime {
  /** kernel name, or `gemm MxNxK` for a cuBLASLt call */
  name: string;
  calls: number;
  /** device milliseconds, summed over calls */
  ms: number;
}

/** a bracketed call: its name and its start and end events */
export interface Span { name: string; start: number; end: number }

/** Timing events, reused: created on demand, given back, destroyed by close (both profilers). */
export class TimingEvents {
  private readonly idle: number[] = [];

  constructor(private readonly d: Driver) {}

  get(): number {
    const ev = this.idle.pop();
    if (ev !== undefined) return ev;
    const e = out64();
    check(this.d.cuEventCreate(e, 0), 'cuEventCreate (timing)');
    return num(e);
  }

  /** gives back the events of spans (null: none) */
  put(spans: readonly Span[] | null): void {
    for (const s of spans ?? []) this.idle.push(s.start, s.end);
  }

  close(): void {
    for (const ev of this.idle) this.d.cuEventDestroy_v2(ev);
    this.idle.length = 0;
  }
}

export class KernelProfiler {
  private readonly spans: Span[] = [];
  private readonly events: TimingEvents;

  constructor(private readonly d: Driver, private readonly stream: number) {
    this.events = new TimingEvents(d);
  }

  /** Records a start event; pass its result to `end`. */
  begin(): number {
    const ev = this.events.get();
    check(this.d.cuEventRecord(ev, this.stream), 'cuEventRecord (profile)');
    return ev;
  }

  end(name: string, start: number): void {
    const ev = this.events.get();
    check(this.d.cuEventRecord(ev, this.stream), 'cuEventRecord (profile)');
    this.spans.push({ name, start, end: ev });
  }

  /** After the stream is idle: device time per name, longest first. Clears what was recorded. */
  collect(): KernelTime[] {
    const by = new Map<string, KernelTime>();
    const ms = new Float32Array(1);
    for (const s of this.spans) {
      check(this.d.cuEventElapsedTime(ms, s.start, s.end), 'cuEventElapsedTime');
      const k = by.get(s.name) ?? { name: s.name, calls: 0, ms: 0 };
      k.calls++;
      k.ms += ms[0]!;
      by.set(s.name, k);
    }
    this.events.put(this.spans);
    this.spans.length = 0;
    return [...by.values()].sort((a, b) => b.ms - a.ms);
  }

  close(): void {
    this.events.put(this.spans);
    this.spans.length = 0;
    this.events.close();
  }
}
