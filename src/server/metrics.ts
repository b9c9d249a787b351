// Prometheus metrics (GET /metrics). A registry per server (never prom-client's global one), so
// several servers in one process (tests) do not share counters. Engine gauges are read from
// Engine.stats at scrape time; latency histograms are observed as tokens reach the server.

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { EngineStats } from '../execution/engine.ts';

const TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
const ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5];
const E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];

export class ServerMetrics {
  readonly registry = new Registry();
  readonly requests: Counter<'route' | 'method' | 'status'>;
  readonly inFlight: Gauge;
  readonly promptTokens: Counter;
  readonly generatedTokens: Counter;
  readonly finished: Counter<'reason'>;
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly e2e: Histogram;

  constructor(stats: () => EngineStats, opts: { processMetrics?: boolean } = {}) {
    const registers = [this.registry];
    this.requests = new Counter({
      name: 'llmts_http_requests_total', help: 'HTTP requests answered, by route, method and status',
      labelNames: ['route', 'method', 'status'], registers,
    });
    this.inFlight = new Gauge({ name: 'llmts_http_requests_in_flight', help: 'HTTP requests being answered', registers });
    this.promptTokens = new Counter({ name: 'llmts_prompt_tokens_total', help: 'prompt tokens of admitted sequences (each of n choices counts its prompt)', registers });
    this.generatedTokens = new Counter({ name: 'llmts_generation_tokens_total', help: 'tokens generated', registers });
    this.finished = new Counter({
      name: 'llmts_sequences_finished_total', help: 'sequences finished, by reason (stop, length, cancelled, error)',
      labelNames: ['reason'], registers,
    });
    this.ttft = new Histogram({ name: 'llmts_time_to_first_token_seconds', help: 'request arrival to first generated token', buckets: TTFT_BUCKETS, registers });
    this.itl = new Histogram({ name: 'llmts_inter_token_latency_seconds', help: 'time between consecutive tokens of a sequence', buckets: ITL_BUCKETS, registers });
    this.e2e = new Histogram({ name: 'llmts_request_duration_seconds', help: 'request arrival to last token, per sequence', buckets: E2E_BUCKETS, registers });
    const gauge = (name: string, help: string, read: (s: EngineStats) => number) =>
      new Gauge({
        name, help, registers,
        collect() {
          this.set(read(stats()));
        },
      });
    gauge('llmts_queue_depth', 'sequences waiting for admission', (s) => s.waiting);
    gauge('llmts_running_rows', 'sequences admitted and decoding', (s) => s.running);
    gauge('llmts_kv_blocks_used', 'KV cache blocks in use', (s) => s.kvBlocksUsed);
    gauge('llmts_kv_blocks_total', 'KV cache blocks in the pool', (s) => s.kvBlocksTotal);
    gauge('llmts_engine_steps', 'engine steps run since start', (s) => s.steps);
    if (opts.processMetrics ?? true) collectDefaultMetrics({ register: this.registry, prefix: 'llmts_' });
  }

  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
