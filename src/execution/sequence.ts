// One request inside the engine: its tokens, how far its KV has caught up, its decoding method,
// its sampler and text state. The scheduler only reads `known`/`computed` (and asks the method
// for drafts); the engine's postprocess appends tokens.

import type { RestoredBlocks, SequenceKv } from '../state/kv-cache.ts';
import { Sampler, TokenHistory, type SamplingParamsInput } from '../sampling/index.ts';
import type { RowGrammar } from '../sampling/grammar/index.ts';
import { IncrementalDetokenizer, type DecodeFn } from '../generation/detokenizer.ts';
import { StopStringMatcher } from '../generation/stop-strings.ts';
import { AUTOREGRESSIVE } from './methods/autoregressive.ts';
import type { DecodingMethod, SpeculationCounts } from './methods/method.ts';
import type { SpeculativeOptions } from './methods/speculative.ts';

export type FinishReason = 'stop' | 'length' | 'cancelled' | 'error';

export interface EngineRequest {
  promptIds: readonly number[];
  maxTokens: number;
  sampling?: SamplingParamsInput;
  stop?: readonly string[];
  ignoreEos?: boolean;
  /** undefined = no logprobs; K = the chosen token plus the K best */
  topLogprobs?: number;
  /**
   * Constrains the output (a compiled grammar): the sequence starts its own matcher when it is
   * created, and the engine frees it when the sequence finishes.
   */
  grammar?: { createMatcher(): RowGrammar };
  /**
   * Speculative decoding for this request: options of its own, or false for none (default: the
   * engine's, EngineOptions.speculative). Checked at submit (a RangeError names the bad field).
   */
  speculative?: SpeculativeOptions | false;
}

export interface TokenLogprob {
  token_id: number;
  logprob: number;
  top: { token_id: number; logprob: number }[];
}

/** Emitted for every accepted token; `text` is the printable delta it completed (may be ''). */
export interface TokenEvent {
  type: 'token';
  tokenId: number;
  text: string;
  logprobs?: TokenLogprob;
}

export interface FinishEvent {
  type: 'finish';
  finishReason: FinishReason;
  /** text held back until the end (an unfinished stop-string prefix, a split character) */
  text: string;
  promptTokens: number;
  completionTokens: number;
  /** prompt tokens served from the prefix cache (not computed) */
  cachedTokens: number;
  /** draft tokens verified and accepted, when the sequence speculated */
  speculation?: SpeculationCounts;
  error?: string;
  /** 'grammar': the row's grammar failed (rejected or could not continue), not the engine */
  errorKind?: 'grammar';
}

export type SequenceEvent = TokenEvent | FinishEvent;

export class Sequence {
  readonly prompt: readonly number[];
  readonly output: number[] = [];
  /** tokens whose K/V are in the cache: the catch-up rule schedules known - computed */
  computed = 0;
  /** set once the model's recomputeKvPastLength rule has restarted this sequence's KV */
  kvRecomputed = false;
  /** the KV block tables; set when admitted */
  kv?: SequenceKv;
  finished?: FinishReason;
  readonly sampler: Sampler;
  /**
   * Uniforms drawn from `sampler`'s RNG for a device-sampled token whose step was dropped (a
   * pipelined step that failed): the engine hands them out again, first, so the RNG order holds.
   */
  readonly uniformsBack: number[] = [];
  readonly history: TokenHistory;
  readonly detok: IncrementalDetokenizer;
  readonly stops: StopStringMatcher;
  readonly eos: ReadonlySet<number>;
  /** the row's grammar matcher, when the request is constrained */
  readonly grammar?: RowGrammar;
  /** blocks promised to this sequence at admission (its worst case), for admission accounting */
  reservedBlocks: number[] = [];
  /** hashes of the prompt blocks the prefix cache may serve (KvCache.reusableHashes) */
  prefixHashes: readonly string[] = [];
  /** true while prefix blocks are read back from the SSD tier: not admitted before that ends */
  restoring = false;
  /** what the SSD tier read back, until admission writes it into the pool */
  restored?: RestoredBlocks;
  /** prompt tokens served from the prefix cache at admission */
  cachedTokens = 0;
  readonly arrivedAt = performance.now();
  firstTokenAt?: number;

  constructor(
    readonly id: number,
    readonly request: EngineRequest,
    /** prompt + output can never exceed this */
    readonly maxLength: number,
    vocabSize: number,
    eosIds: readonly number[],
    decode: DecodeFn,
    readonly emit: (e: SequenceEvent) => void,
    /** how it produces its tokens (default: one per step) */
    readonly method: DecodingMethod = AUTOREGRESSIVE,
  ) {
    this.prompt = request.promptIds;
    this.sampler = new Sampler(request.sampling ?? {}, { vocabSize });
    this.history = new TokenHistory(this.prompt);
    this.detok = new IncrementalDetokenizer(decode, { contextTokens: this.prompt });
    this.stops = new StopStringMatcher(request.stop ?? []);
    this.eos = new Set(request.ignoreEos ? [] : eosIds);
    this.grammar = request.grammar?.createMatcher(); // last: nothing after it can throw and leak it
  }

  /** prompt + generated tokens */
  get known(): number {
    return this.prompt.length + this.output.length;
  }

  tokenAt(pos: number): number {
    return pos < this.prompt.length ? this.prompt[pos] : this.output[pos - this.prompt.length];
  }

  /** the most tokens this sequence can ever hold */
  get maxTokensTotal(): number {
    return Math.min(this.maxLength, this.prompt.length + this.request.maxTokens);
  }
}
