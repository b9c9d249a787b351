// Device time per kernel inside a CUDA graph (bench/cuda-generate.ts --profile-graph): where a
// decode step's time goes once it is a graph replay, which the per-launch profiler (profiler.ts)
// cannot see: a replay is one launch to it.
//
// With CudaRuntimeSettings.graphProfile ($LLMTS_CUDA_GRAPH_PROFILE=1), every kernel and cuBLASLt
// call captured into a graph is bracketed by two event-record nodes (cuEventRecordWithFlags, CU_EVENT_RECORD_EXTERNAL: during a
// capture that records a node instead of a capture dependency). After a replay has finished, each
// bracket's elapsed time is that kernel's device time in the graph, and the time from one bracket's
// end to the next one's start is the gap between them (launch latency inside the graph, plus the
// event nodes' own cost). The event nodes cost time, and the runtime turns programmatic dependent
// launch off while profiling (its edges join kernel to kernel), so a profiled replay runs slower
// than a plain one: read the shares, not the total.
import { check, type Driver } from './cuda-lib.ts';
import { type KernelTime, type Span, TimingEvents } from './profiler.ts';

/** cuEventRecordWithFlags: in a stream capture, add an event-record node */
export const CU_EVENT_RECORD_EXTERNAL = 1;

/** One captured graph's kernels as its last replay ran them. */
export interface GraphProfile {
  /** the graph's executable handle (an id: graphs of other batch sizes have other ones) */
  graph: number;
  /** kernels in graph order, summed by name, longest first */
  kernels: KernelTime[];
  /** calls bracketed: kernels and cuBLASLt calls */
  calls: number;
  /** every bracketed call in graph order: its name and device time, us (to tell apart calls of one kernel) */
  sequence: { name: string; us: number }[];
  /** device time inside the brackets, ms */
  kernelMs: number;
  /** from the first bracket's start to the last one's end, ms: kernels + gaps */
  spanMs: number;
}

export class GraphProfiler {
  private open: Span[] | null = null;
  private readonly byGraph = new Map<number, Span[]>();
  private readonly events: TimingEvents;

  constructor(private readonly d: Driver, private readonly stream: number) {
    this.events = new TimingEvents(d);
  }

  private record(): number {
    const ev = this.events.get();
    check(this.d.cuEventRecordWithFlags(ev, this.stream, CU_EVENT_RECORD_EXTERNAL), 'cuEventRecordWithFlags (graph profile)');
    return ev;
  }

  /** A capture starts: brackets go to its graph. */
  beginCapture(): void {
    this.events.put(this.open);
    this.open = [];
  }

  /** Before a call during a capture: its start node (undefined outside a capture). */
  begin(): number | undefined {
    return this.open ? this.record() : undefined;
  }

  /** After the call `begin` bracketed. */
  end(name: string, start: number): void {
    this.open?.push({ name, start, end: this.record() });
  }

  /** The capture ended as graph `exec` (0: aborted, its brackets are dropped). */
  endCapture(exec: number): void {
    const spans = this.open;
    this.open = null;
    if (exec && spans && spans.length > 0) this.byGraph.set(exec, spans);
    else this.events.put(spans);
  }

  /** Graph `exec` was destroyed: its events go back to the pool. */
  destroyGraph(exec: number): void {
    this.events.put(this.byGraph.get(exec) ?? null);
    this.byGraph.delete(exec);
  }

  /**
   * After the stream is idle: each graph's kernels as its last replay ran them (graphs never
   * replayed, whose events have not run, are left out).
   */
  collect(): GraphProfile[] {
    const out: GraphProfile[] = [];
    const ms = new Float32Array(1);
    const elapsed = (a: number, b: number) => (this.d.cuEventElapsedTime(ms, a, b) === 0 ? ms[0]! : undefined);
    for (const [graph, spans] of this.byGraph) {
      const total = elapsed(spans[0]!.start, spans[spans.length - 1]!.end);
      if (total === undefined) continue; // not replayed yet
      const by = new Map<string, KernelTime>();
      let kernelMs = 0;
      const sequence: { name: string; us: number }[] = [];
      for (const s of spans) {
        const t = elapsed(s.start, s.end) ?? 0;
        kernelMs += t;
        sequence.push({ name: s.name, us: Math.round(t * 10000) / 10 });
        const k = by.get(s.name) ?? { name: s.name, calls: 0, ms: 0 };
        k.calls++;
        k.ms += t;
        by.set(s.name, k);
      }
      out.push({ graph, kernels: [...by.values()].sort((a, b) => b.ms - a.ms), sequence, calls: spans.length, kernelMs,
        spanMs: total });
    }
    return out;
  }

  close(): void {
    this.events.put(this.open);
    this.open = null;
    for (const spans of this.byGraph.values()) this.events.put(spans);
    this.byGraph.clear();
    this.events.close();
  }
}
