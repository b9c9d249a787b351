// Prometheus metrics (GET /metrics). A registry per server (never prom-client's global one), so
// several servers in one process (tests) do not share counters. Engine gauges are read from
// Engine.stats at scrape time; latency histograms are observed as tokens reach the server.

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { EngineStats } from '../execution/engine.ts';
import { grammarCompilerStats, grammarDefaults, type GrammarCompilerStats } from '../sampling/grammar/index.ts';

const TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
const ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5];
const E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
const ACCEPTED_BUCKETS = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64];

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
    gauge('llmts_kv_blocks_cached', 'KV blocks held by no sequence, kept for prefix reuse (evictable)', (s) => s.kvBlocksCached);
    this.prefixCacheMetrics(stats, registers);
    this.speculationMetrics(stats, registers);
    this.grammarMetrics(registers);
    if (opts.processMetrics ?? true) collectDefaultMetrics({ register: this.registry, prefix: 'llmts_' });
  }

  /**
   * Prefix cache (README "Metrics"): hits/misses of admitted sequences, tokens served, bytes per
   * tier. Engine counters are totals read at scrape time; a Counter only goes up, so each scrape
   * adds what grew since the last one.
   */
  private prefixCacheMetrics(stats: () => EngineStats, registers: Registry[]): void {
    const counter = <L extends string>(name: string, help: string, labels: readonly L[], read: (s: EngineStats) => [Partial<Record<L, string>>, number][]) => {
      const seen = new Map<string, number>();
      return new Counter<L>({
        name, help, labelNames: labels, registers,
        collect() {
          for (const [lab, total] of read(stats())) {
            const key = JSON.stringify(lab);
            const last = seen.get(key);
            // every series shows from the first scrape, at 0 until something happens
            if (last === undefined || total > last) this.inc(lab as Record<L, string>, total - (last ?? 0));
            seen.set(key, Math.max(total, last ?? 0));
          }
        },
      });
    };
    const tierGauge = (name: string, help: string, read: (s: EngineStats) => [string, number][]) =>
      new Gauge({
        name, help, labelNames: ['tier'], registers,
        collect() {
          for (const [tier, v] of read(stats())) this.set({ tier }, v);
        },
      });
    const pc = (s: EngineStats) => s.prefixCache;
    counter('llmts_prefix_cache_queries_total', 'admitted sequences whose prompt had a reusable (full) block', [], (s) => [[{}, pc(s).queries]]);
    counter('llmts_prefix_cache_hits_total', 'admitted sequences that reused cached blocks, by tier (ssd: some came back from disk)', ['tier'],
      (s) => [[{ tier: 'ram' }, pc(s).hits - pc(s).ssdHits], [{ tier: 'ssd' }, pc(s).ssdHits]]);
    counter('llmts_prefix_cache_misses_total', 'admitted sequences that reused nothing', [], (s) => [[{}, pc(s).misses]]);
    counter('llmts_prefix_cache_cached_tokens_total', 'prompt tokens served from the prefix cache instead of computed, by tier', ['tier'],
      (s) => [[{ tier: 'ram' }, pc(s).ramTokens], [{ tier: 'ssd' }, pc(s).ssdTokens]]);
    counter('llmts_prefix_cache_evictions_total', 'cached blocks (ram) or prefix files (ssd) dropped to make room', ['tier'],
      (s) => [[{ tier: 'ram' }, pc(s).ramEvictions], [{ tier: 'ssd' }, pc(s).ssd?.evictions ?? 0]]);
    counter('llmts_prefix_cache_ssd_writes_total', 'prefixes written to the SSD tier', [], (s) => [[{}, pc(s).ssd?.writes ?? 0]]);
    counter('llmts_prefix_cache_ssd_write_errors_total', 'prefix files the SSD tier failed to write, by errno code (ENOSPC, EROFS, EACCES, EIO, ...)', ['code'],
      (s) => Object.entries(pc(s).ssd?.writeErrors ?? {}).map(([code, n]) => [{ code }, n]));
    counter('llmts_prefix_cache_ssd_rejected_files_total', 'SSD tier files removed because they were corrupt, truncated or foreign', [], (s) => [[{}, pc(s).ssd?.rejected ?? 0]]);
    tierGauge('llmts_prefix_cache_bytes', 'KV bytes held by the prefix cache: ram = pool blocks holding a cached prefix (shared or evictable), ssd = files',
      (s) => [['ram', pc(s).ramBytes], ['ssd', pc(s).ssd?.bytes ?? 0]]);
    tierGauge('llmts_prefix_cache_capacity_bytes', 'most bytes each tier keeps (ram: evictable blocks, --prompt-cache; ssd: --cache-dir-size)',
      (s) => [['ram', pc(s).ramCapacityBytes], ['ssd', pc(s).ssd?.maxBytes ?? 0]]);
    counter('llmts_prefix_cache_ssd_captures_total', 'prefixes read into host memory when the RAM tier evicted them before they were written (busy engine)', [],
      (s) => [[{}, pc(s).ssd?.captures ?? 0]]);
    counter('llmts_prefix_cache_ssd_dropped_total', 'prefixes lost before they were written (no room to capture them)', [], (s) => [[{}, pc(s).ssd?.dropped ?? 0]]);
    counter('llmts_prefix_cache_ssd_restores_skipped_total', 'SSD restores not made because computing the prefix was predicted faster', [],
      (s) => [[{}, pc(s).ssdRestoresSkipped]]);
    const ssdGauge = (name: string, help: string, value: (s: EngineStats) => number) =>
      new Gauge({
        name, help, registers,
        collect() {
          this.set(value(stats()));
        },
      });
    ssdGauge('llmts_prefix_cache_ssd_files', 'prefix files in the SSD tier', (s) => pc(s).ssd?.files ?? 0);
    ssdGauge('llmts_prefix_cache_ssd_pending', 'finished prefixes waiting to be written to the SSD tier', (s) => pc(s).ssd?.pending ?? 0);
    ssdGauge('llmts_prefix_cache_ssd_capture_bytes', 'host bytes of captured prefixes not yet written', (s) => pc(s).ssd?.captureBytes ?? 0);
  }

  /**
   * Speculative decoding (README "Metrics"): draft tokens verified and accepted, and the accepted
   * length of each verify row (a row with a draft, in a step). The engine keeps totals; each
   * scrape adds what grew since the last one.
   */
  private speculationMetrics(stats: () => EngineStats, registers: Registry[]): void {
    const total = (name: string, help: string, read: (s: EngineStats) => number) => {
      let seen = 0;
      return new Counter({
        name, help, registers,
        collect() {
          const n = read(stats());
          if (n > seen) this.inc(n - seen);
          seen = Math.max(seen, n);
        },
      });
    };
    total('llmts_spec_decode_draft_tokens_total', 'draft tokens verified (speculative decoding)', (s) => s.speculation.draftTokens);
    total('llmts_spec_decode_accepted_tokens_total', 'draft tokens accepted: equal to what the model produced at their position', (s) => s.speculation.acceptedTokens);
    const seen: number[] = [];
    new Histogram({
      name: 'llmts_spec_decode_acceptance_length', help: 'draft tokens accepted per verify row (a row with a draft, in a step)',
      buckets: ACCEPTED_BUCKETS, registers,
      collect() {
        stats().speculation.acceptedLengths.forEach((n, length) => {
          for (let k = seen[length] ?? 0; k < n; k++) this.observe(length);
          seen[length] = Math.max(n, seen[length] ?? 0);
        });
      },
    });
  }

  /**
   * Compiled grammars (README "Metrics"): the cache's entries, bytes and budget, and the
   * compilers' counters, summed over the grammar compilers of this process (one per served model).
   */
  private grammarMetrics(registers: Registry[]): void {
    const total = (read: (s: GrammarCompilerStats) => number) => grammarCompilerStats().reduce((n, s) => n + read(s), 0);
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({
        name, help, registers,
        collect() {
          this.set(read());
        },
      });
    const counter = <L extends string>(name: string, help: string, labels: readonly L[], read: () => [Partial<Record<L, string>>, number][]) => {
      const seen = new Map<string, number>();
      return new Counter<L>({
        name, help, labelNames: labels, registers,
        collect() {
          for (const [lab, n] of read()) {
            const key = JSON.stringify(lab);
            const last = seen.get(key);
            if (last === undefined || n > last) this.inc(lab as Record<L, string>, n - (last ?? 0));
            seen.set(key, Math.max(n, last ?? 0));
          }
        },
      });
    };
    gauge('llmts_grammar_cache_entries', 'compiled grammars in the cache', () => total((s) => s.cacheEntries));
    gauge('llmts_grammar_cache_bytes', 'bytes of the cached compiled grammars, as measured when each was first compiled', () => total((s) => s.cacheBytes));
    gauge('llmts_grammar_cache_capacity_bytes', 'the most bytes of compiled grammars the cache keeps (--grammar-cache)', () => {
      const all = grammarCompilerStats();
      return all.length === 0 ? grammarDefaults().cacheBytes : all.reduce((n, s) => n + s.cacheCapacityBytes, 0);
    });
    gauge('llmts_grammar_heap_bytes', 'memory of the xgrammar instances that hold compiled grammars and matchers', () => total((s) => s.heapBytes));
    counter('llmts_grammar_cache_evictions_total', 'compiled grammars dropped from the cache to stay within its budget', [], () => [[{}, total((s) => s.evictions)]]);
    counter('llmts_grammar_cache_hits_total', 'grammar requests served from the cache', [], () => [[{}, total((s) => s.cacheHits)]]);
    counter('llmts_grammar_compiles_total', 'grammars compiled', [], () => [[{}, total((s) => s.compiles)]]);
    counter('llmts_grammar_refused_total', 'schemas, grammars and regexes refused with a 400 (invalid, unsatisfiable, too large, too deep, too slow)', [],
      () => [[{}, total((s) => s.invalid)]]);
    counter('llmts_grammar_instances_replaced_total', 'xgrammar instances replaced to give memory back (main: a grammar host whose heap outgrew the budget; worker: the check worker held too much)', ['thread'],
      () => [[{ thread: 'main' }, total((s) => s.instanceReplacements)], [{ thread: 'worker' }, total((s) => s.workerReplacements)]]);
  }

  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
