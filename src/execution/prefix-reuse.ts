// The engine's side of the prefix cache: what happens at submit (hash the prompt's reusable
// blocks; start reading a longer prefix back from the SSD tier), at finish (offer the sequence's
// computed blocks for spilling), when the loop goes idle (spill), and for /metrics. The block
// bookkeeping itself is the KV cache's (state/kv-cache.ts, state/block-pool.ts); admission takes
// the cached blocks (scheduler.ts).
//
// The SSD tier is touched only between steps: restores are read into host memory while the
// sequence waits (it is admitted once they are in), and spills run when the engine has nothing
// to do (or on an explicit flush), never inside a decode step. Under sustained load the RAM tier
// may evict a prefix before the engine is ever idle: the KV cache announces each eviction while
// the block is intact, and the SSD tier then reads that prefix (once) and writes it in the
// background (ssd-tier.ts onEvicted).

import { createHash } from 'node:crypto';
import type { ModelConfig } from '../contracts/model-config.ts';
import { prefixNamespace, type KvScheme } from '../state/block-hash.ts';
import { prefixReuseBlocker, type KvCache, type PrefixCacheOptions } from '../state/kv-cache.ts';
import { SsdTier, type SpillResult, type SsdStats, type SsdTierOptions } from '../state/ssd-tier.ts';
import type { PrefixCounters } from './scheduler.ts';
import { RestorePolicy } from './restore-policy.ts';
import type { Sequence } from './sequence.ts';

export interface PrefixCacheSettings {
  /** bytes of evictable cached blocks kept in the KV pool (default: the whole pool); 0 = reuse off */
  promptCacheBytes?: number;
  /**
   * model fingerprint that namespaces block hashes (state/fingerprint.ts modelFingerprint);
   * default, RAM tier only: a hash of the normalised config. Required for the SSD tier.
   */
  modelFingerprint?: string;
  /** tokenizer fingerprint (TextTokenizer.fingerprint), part of the namespace */
  tokenizerFingerprint?: string;
  /**
   * the SSD tier: files under `dir` (in a subdirectory per namespace), at most `maxBytes`;
   * `captureBytes`: most host memory for prefixes evicted before they were spilled (ssd-tier.ts)
   */
  ssd?: { dir: string; maxBytes: number; captureBytes?: number; log?: (line: string) => void; openForWrite?: SsdTierOptions['openForWrite'] };
}

export interface PrefixCacheStats {
  enabled: boolean;
  /** why reuse is off, when it is */
  off?: string;
  /** why an SSD tier that was asked for is not used */
  ssdOff?: string;
  queries: number;
  hits: number;
  ssdHits: number;
  misses: number;
  /** prompt tokens served from cache, by tier */
  ramTokens: number;
  ssdTokens: number;
  /** KV bytes of blocks holding a cached prefix in the pool (shared or evictable) and their cap */
  ramBytes: number;
  ramEvictableBytes: number;
  ramCapacityBytes: number;
  ramEvictions: number;
  /** SSD restores not made because computing the prefix was predicted faster (restore-policy.ts) */
  ssdRestoresSkipped: number;
  ssd?: SsdStats;
}

/** The KV cache's prefix options for this model, or why it has none. */
export function prefixOptionsFor(
  config: ModelConfig, scheme: KvScheme, settings: PrefixCacheSettings,
): { options?: PrefixCacheOptions; off?: string } {
  const blocker = prefixReuseBlocker(config);
  if (blocker) return { off: blocker };
  if (settings.promptCacheBytes === 0) return { off: 'disabled (prompt cache size 0)' };
  if (settings.ssd && !settings.modelFingerprint) throw new Error('the prefix cache\'s SSD tier needs a model fingerprint');
  const model = settings.modelFingerprint ?? createHash('sha256').update(JSON.stringify(config)).digest('hex');
  const namespace = prefixNamespace({ model, kv: scheme, tokenizer: settings.tokenizerFingerprint });
  return { options: { namespace, maxCachedBytes: settings.promptCacheBytes } };
}

/** Opens the SSD tier for an engine's KV cache (it shares the cache's namespace), when it can have one. */
export function openSsdTier(kv: KvCache, settings: PrefixCacheSettings): { ssd?: SsdTier; off?: string } {
  if (!settings.ssd) return {};
  if (!kv.prefixEnabled) return { off: `prefix reuse is off (${kv.prefixOff})` };
  if (!kv.canCopyBlocks) return { off: 'the backend cannot copy KV blocks to the host' };
  const ssd = new SsdTier({
    dir: settings.ssd.dir, maxBytes: settings.ssd.maxBytes, model: settings.modelFingerprint!,
    tokenizer: settings.tokenizerFingerprint, kv: kv.scheme, groups: kv.groups.map((g) => g.spec),
    captureBytes: settings.ssd.captureBytes, log: settings.ssd.log, openForWrite: settings.ssd.openForWrite,
  });
  if (ssd.namespace !== kv.prefixNamespace) throw new Error('the SSD tier and the KV cache disagree on the prefix namespace');
  return { ssd };
}

export class PrefixReuse {
  /** prefixes spilled by the current idle spill, if one runs */
  private spilling?: Promise<unknown>;
  /** restore from SSD or recompute: rates measured on this machine */
  readonly policy = new RestorePolicy();

  constructor(
    private readonly kv: KvCache,
    private readonly ssd: SsdTier | undefined,
    /** wakes the engine loop (a restore finished) */
    private readonly kick: () => void,
    private readonly offReason?: string,
    /** why the SSD tier asked for is not used */
    readonly ssdOff?: string,
  ) {
    // a prefix the RAM tier evicts before any idle spill is read there and then (never lost)
    if (ssd) kv.onEvict = (hash) => ssd.onEvicted(hash, kv);
  }

  /** At submit: which prompt blocks could be reused; starts reading a longer prefix from SSD. */
  onSubmit(seq: Sequence): void {
    if (!this.kv.prefixEnabled) return;
    seq.prefixHashes = this.kv.reusableHashes(seq.prompt); // ~1 us a block
    const ssd = this.ssd;
    if (!ssd || seq.prefixHashes.length === 0) return;
    const inRam = this.kv.attachableBlocks(seq.prefixHashes);
    const onDisk = ssd.longestPrefix(seq.prefixHashes);
    if (onDisk <= inRam) return;
    const blocks = onDisk - inRam;
    if (!this.policy.shouldRestore(blocks * this.kv.shape.blockSize, blocks * this.kv.blockBytes)) return;
    seq.restoring = true;
    const from = this.kv.blocksToRestore(seq.prefixHashes, onDisk); // what the pool holds is not read
    const t0 = performance.now();
    void ssd.load(seq.prefixHashes, onDisk, from).catch(() => undefined).then((r) => {
      if (r) this.policy.recordRestore(r.groups.reduce((a, g) => a + g.blocks.reduce((b, x) => b + x.byteLength, 0), 0), performance.now() - t0);
      seq.restored = seq.finished ? undefined : r;
      seq.restoring = false;
      this.kick();
    });
  }

  /** At finish, before its blocks are released: its computed prefix may be spilled later. */
  onFinish(seq: Sequence): void {
    seq.restored = undefined;
    const kv = seq.kv;
    if (!this.ssd || !kv || kv.hashes.length === 0) return;
    const n = kv.hashes.length * this.kv.shape.blockSize;
    const tokens = seq.prompt.length >= n ? seq.prompt.slice(0, n) : [...seq.prompt, ...seq.output.slice(0, n - seq.prompt.length)];
    this.ssd.offer(tokens, kv.hashes);
  }

  /** The loop went idle: spill pending prefixes until there is work again. */
  onIdle(hasWork: () => boolean): void {
    if (!this.ssd || this.ssd.pendingCount === 0 || this.spilling) return;
    this.spilling = this.ssd.spill(this.kv, hasWork).finally(() => (this.spilling = undefined));
  }

  /**
   * Spills every pending prefix, plus the computed prefix of every running sequence, now (between
   * steps). Resolves to what was written.
   */
  async flush(running: readonly Sequence[]): Promise<SpillResult> {
    if (!this.ssd) return { files: 0, bytes: 0, errors: [] };
    for (const seq of running) this.onFinish(seq);
    return this.ssd.spill(this.kv);
  }

  /** Waits for a running idle spill. */
  async settle(): Promise<void> {
    await this.spilling;
    await this.ssd?.idle();
  }

  stats(c: PrefixCounters): PrefixCacheStats {
    const p = this.kv.prefixStats;
    return {
      enabled: this.kv.prefixEnabled,
      off: this.offReason ?? this.kv.prefixOff,
      ssdOff: this.ssdOff,
      queries: c.queries,
      hits: c.hits,
      ssdHits: c.ssdHits,
      misses: c.queries - c.hits,
      ramTokens: c.ramTokens,
      ssdTokens: c.ssdTokens,
      ramBytes: p.hashedBytes,
      ramEvictableBytes: p.cachedBytes,
      ramCapacityBytes: p.maxCachedBytes,
      ramEvictions: p.evictions,
      ssdRestoresSkipped: this.policy.skipped,
      ssd: this.ssd?.stats,
    };
  }
}
