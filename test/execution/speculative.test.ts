// Speculative decoding in the engine (src/execution/methods/): the oracle is plain decoding, which
// the fixture tests check against transformers. The CPU backend computes a verify chunk's rows as
// it computes decode rows, so every comparison here is bit for bit: tokens, text, finish reasons,
// and logprobs with Object.is. Every test also checks that drafts were really verified (and, where
// it matters, accepted and rejected), so none passes with speculation silently off.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import type { Backend } from '../../src/contracts/backend.ts';
import { ReplayingReference } from '../helpers/replaying-reference.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import { Engine, type EngineOptions, type TextCodec } from '../../src/execution/engine.ts';
import type { EngineRequest } from '../../src/execution/sequence.ts';
import type { SpeculativeOptions } from '../../src/execution/methods/speculative.ts';
import { chainHashes } from '../../src/state/block-hash.ts';
import { writeTinyLlama } from '../helpers/tiny-model.ts';
import { runOf, sameRun, scripted, type Run } from '../helpers/speculation.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const FIXTURES = join(ROOT, 'test/fixtures');
const FAMILIES = readdirSync(FIXTURES).filter((d) => existsSync(join(FIXTURES, d, 'config.json')));

interface Case {
  prompt_token_ids: number[];
  generated_token_ids: number[];
}
const casesOf = (dir: string): Case[] => JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')).cases;

const NGRAM: SpeculativeOptions = { proposer: 'ngram', numDraftTokens: 4, ngramMin: 1, ngramMax: 3 };
const ADAPTIVE: SpeculativeOptions = { proposer: 'ngram', numDraftTokens: 'adaptive', ngramMin: 1, ngramMax: 3 };

const greedy = (promptIds: readonly number[], maxTokens: number, extra: Partial<EngineRequest> = {}): EngineRequest =>
  ({ promptIds, maxTokens, sampling: { temperature: 0 }, ignoreEos: true, ...extra });

async function withCpu<T>(dir: string, body: (m: LoadedModel) => Promise<T>): Promise<T> {
  const backend = await createCpuBackend();
  try {
    return await body(await loadModel(backend, dir, { maxModelLen: 512 }));
  } finally {
    await backend.close();
  }
}

/** Each request run alone on a fresh engine of `opts`, in order. */
async function alone(m: LoadedModel, opts: EngineOptions, reqs: readonly EngineRequest[]): Promise<Run[]> {
  const out: Run[] = [];
  for (const r of reqs) {
    const e = new Engine(m.model, m, { maxBatch: 4, maxModelLen: m.maxContext, ...opts });
    out.push(await runOf(e, r));
    assert.equal(e.stats.kvBlocksUsed, 0);
    await e.close(0);
  }
  return out;
}

/** Demo model prompts with repeats for the n-gram proposer to find. */
function demoPrompts(m: LoadedModel): number[][] {
  return [
    'def add(a, b):\n    return a + b\n\n\ndef add(',
    'import os\nimport sys\n\n\ndef main(argv):',
    'class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def __repr__(self):',
  ].map((t) => m.encode(t));
}

test('every fixture family and the demo model: greedy tokens and top-k logprobs with n-gram drafts equal plain decoding bit for bit', async () => {
  for (const name of [...FAMILIES, 'demo']) {
    const dir = name === 'demo' ? join(ROOT, 'models/demo') : join(FIXTURES, name);
    await withCpu(dir, async (m) => {
      const prompts = name === 'demo' ? demoPrompts(m) : casesOf(dir).map((c) => c.prompt_token_ids);
      const probe = new Engine(m.model, m, { maxBatch: 1, maxModelLen: m.maxContext });
      const blocked = probe.speculationOff;
      await probe.close(0);
      for (const topLogprobs of [undefined, 3]) {
        const reqs = prompts.map((p) => greedy(p, 40, { topLogprobs }));
        const plain = await alone(m, {}, reqs);
        for (const speculative of [NGRAM, ADAPTIVE]) {
          const runs = await alone(m, { speculative }, reqs);
          runs.forEach((r, i) => sameRun(r, plain[i]!, `${name} ${speculative.numDraftTokens} logprobs ${topLogprobs} prompt ${i}`));
          const drafted = runs.reduce((n, r) => n + (r.speculation?.draftTokens ?? 0), 0);
          const accepted = runs.reduce((n, r) => n + (r.speculation?.acceptedTokens ?? 0), 0);
          if (blocked) {
            assert.ok(runs.every((r) => r.speculation === undefined), `${name}: speculation is off (${blocked})`);
          } else {
            assert.ok(drafted > 0, `${name}: drafts were verified`);
            if (speculative === NGRAM) assert.ok(accepted > 0 && accepted < drafted, `${name}: drafts accepted and rejected (${accepted} of ${drafted})`);
          }
        }
      }
      // the families whose rope follows the sequence length decode plainly, and say why
      if (/dynamic|longrope/.test(name)) assert.match(blocked ?? '', /rope depends on the sequence length/);
      else assert.equal(blocked, undefined, `${name} speculates`);
    });
  }
});

/**
 * 16 requests joining a running batch at staggered moments (each once the batch has produced a
 * few more tokens), of every kind at once: plain rows, n-gram rows of fixed and adaptive depth,
 * and rows whose scripted drafts are right for a while and then wrong, of different depths. A
 * small token budget splits prompts into chunks beside the verify rows and trims drafts.
 */
async function staggeredMix(m: LoadedModel, reqs: EngineRequest[], opts: EngineOptions): Promise<{ runs: Run[]; engine: Engine }> {
  const e = new Engine(m.model, m, { maxBatch: 8, tokenBudget: 24, maxModelLen: m.maxContext, ...opts });
  const jobs: Promise<Run>[] = [];
  let produced = 0;
  for (const r of reqs) {
    jobs.push(runOf(e, r, undefined, () => produced++));
    const target = produced + 3;
    while (produced < target && e.stats.running + e.stats.waiting > 0) await new Promise((res) => setTimeout(res, 1));
  }
  const runs = await Promise.all(jobs);
  assert.equal(e.stats.kvBlocksUsed, 0, 'every KV block returned');
  await e.close(0);
  return { runs, engine: e };
}

function mixedRequests(m: LoadedModel, prompts: readonly number[][], plain: readonly Run[], topLogprobs?: number): EngineRequest[] {
  const V = m.config.vocabSize;
  return plain.map((p, k) => {
    const base = greedy(prompts[k % prompts.length]!, p.tokens.length, { topLogprobs });
    switch (k % 5) {
      case 0: return { ...base, speculative: false };
      case 1: return { ...base, speculative: NGRAM };
      case 2: return { ...base, speculative: ADAPTIVE };
      // right for a stretch, then wrong every few tokens: long accepted runs and rejections
      case 3: return { ...base, speculative: { proposer: scripted(p.tokens, V, (i) => i > 12 && i % 5 === 0), numDraftTokens: 6 } };
      default: return { ...base, speculative: { proposer: scripted(p.tokens, V, (i) => i % 3 === 2), numDraftTokens: 2 + (k % 3) } };
    }
  });
}

for (const name of ['llama', 'gemma2', 'qwen3_moe']) {
  test(`${name}: 16 staggered requests mixing plain and speculative rows of different depths equal their plain runs alone`, async () => {
    await withCpu(join(FIXTURES, name), async (m) => {
      const cases = casesOf(join(FIXTURES, name));
      const prompts = cases.map((c) => c.prompt_token_ids);
      for (const topLogprobs of [undefined, 2]) {
        const solo = await alone(m, {}, Array.from({ length: 16 }, (_, k) => greedy(prompts[k % prompts.length]!, 10 + ((k * 7) % 23), { topLogprobs })));
        const reqs = mixedRequests(m, prompts, solo, topLogprobs);
        const { runs, engine } = await staggeredMix(m, reqs, {});
        runs.forEach((r, k) => sameRun(r, solo[k]!, `request ${k} (kind ${k % 5})`));
        const s = engine.stats.speculation;
        assert.ok(s.acceptedTokens > 0 && s.acceptedTokens < s.draftTokens, `drafts accepted and rejected: ${s.acceptedTokens} of ${s.draftTokens}`);
        assert.ok(new Set(runs.filter((r) => r.speculation).map((r) => r.speculation!.draftTokens)).size > 1, 'rows drafted different amounts');
        assert.equal(runs[0]!.speculation, undefined, 'a plain row reports no speculation');
      }
    });
  });
}

test('seeded sampling with drafts takes the tokens plain sampling takes, on the host and on the device, with penalties, and for n > 1 with seed + i', async () => {
  await withCpu(join(FIXTURES, 'llama'), async (m) => {
    const V = m.config.vocabSize;
    const prompts = casesOf(join(FIXTURES, 'llama')).map((c) => c.prompt_token_ids);
    const sampled = (k: number, extra: Partial<EngineRequest> = {}): EngineRequest => ({
      promptIds: prompts[k % prompts.length]!, maxTokens: 30, ignoreEos: true, topLogprobs: 2,
      sampling: { temperature: 0.8, topP: 0.95, seed: 77 + k, ...(k % 2 === 1 ? { repetitionPenalty: 1.3, presencePenalty: 0.4 } : {}) },
      ...extra,
    });
    for (const deviceSampling of [false, true]) {
      const opts = { deviceSampling };
      // four choices of one request: seeds 77..80, all in one batch
      const e = new Engine(m.model, m, { maxBatch: 8, maxModelLen: m.maxContext, ...opts });
      const plain = await Promise.all([0, 1, 2, 3].map((k) => runOf(e, sampled(k))));
      await e.close(0);
      const spec = new Engine(m.model, m, { maxBatch: 8, maxModelLen: m.maxContext, ...opts });
      const runs = await Promise.all([0, 1, 2, 3].map((k) => runOf(spec, sampled(k, {
        // drafts right for the first 8 tokens, then every other one: runs accepted and rejected
        speculative: k < 2 ? { proposer: scripted(plain[k]!.tokens, V, (i) => i >= 8 && i % 2 === 0), numDraftTokens: 4 } : NGRAM,
      }))));
      runs.forEach((r, k) => sameRun(r, plain[k]!, `device sampling ${deviceSampling}, choice ${k}`));
      const s = spec.stats.speculation;
      assert.ok(s.acceptedTokens > 0 && s.acceptedTokens < s.draftTokens, `drafts accepted and rejected: ${s.acceptedTokens} of ${s.draftTokens}`);
      assert.equal(spec.stats.kvBlocksUsed, 0);
      await spec.close(0);
    }
  });
});

test('stop strings, EOS and max_tokens inside an accepted run end the row where plain decoding ends it', async () => {
  await withCpu(join(FIXTURES, 'llama'), async (m) => {
    const V = m.config.vocabSize;
    const prompt = casesOf(join(FIXTURES, 'llama'))[1]!.prompt_token_ids;
    const [full] = await alone(m, {}, [greedy(prompt, 40)]);
    const text = m.decode(full!.tokens);
    // a stop string that completes in the middle of the run, an EOS at token 11, max_tokens 7
    const stop = m.decode(full!.tokens.slice(9, 12));
    assert.ok(text.indexOf(stop) > 0);
    const eos = full!.tokens[11]!;
    const variants: [string, EngineRequest, TextCodec][] = [
      ['stop string', greedy(prompt, 40, { stop: [stop] }), m],
      ['EOS', { ...greedy(prompt, 40), ignoreEos: false }, { eosIds: [eos], decode: (ids) => m.decode(ids) }],
      ['max_tokens', greedy(prompt, 7), m],
    ];
    for (const [what, req, codec] of variants) {
      for (const topLogprobs of [undefined, 1]) {
        const r = { ...req, topLogprobs };
        const plainEngine = new Engine(m.model, codec, { maxBatch: 2, maxModelLen: m.maxContext });
        const plain = await runOf(plainEngine, r);
        await plainEngine.close(0);
        // every draft right: the row's end lands inside a run of 8 accepted tokens
        const e = new Engine(m.model, codec, { maxBatch: 2, maxModelLen: m.maxContext });
        const got = await runOf(e, { ...r, speculative: { proposer: scripted(full!.tokens, V), numDraftTokens: 8 } });
        sameRun(got, plain, what);
        assert.ok(plain.tokens.length <= 12 && plain.finish !== '', `${what}: plain decoding ended early (${plain.tokens.length} tokens, ${plain.finish})`);
        assert.ok(got.speculation!.acceptedTokens >= plain.tokens.length - 1, `${what}: the end came inside an accepted run`);
        assert.equal(e.stats.kvBlocksUsed, 0);
        await e.close(0);
      }
    }
  });
});

test('a request cancelled in the middle of an accepted run ends at the step boundary; its blocks are freed and its sibling is unaffected', async () => {
  await withCpu(join(FIXTURES, 'llama'), async (m) => {
    const V = m.config.vocabSize;
    const cases = casesOf(join(FIXTURES, 'llama'));
    const [victimPlain, siblingPlain] = await alone(m, {}, [greedy(cases[1]!.prompt_token_ids, 60), greedy(cases[2]!.prompt_token_ids, 30)]);
    const e = new Engine(m.model, m, { maxBatch: 4, maxModelLen: m.maxContext });
    const ac = new AbortController();
    let after = -1;
    const spec = { proposer: scripted(victimPlain!.tokens, V, (i) => i % 9 === 8), numDraftTokens: 8 };
    const victim = runOf(e, { ...greedy(cases[1]!.prompt_token_ids, 60), speculative: spec }, ac.signal, (n) => {
      if (n === 5) {
        ac.abort(); // in the middle of a run of accepted drafts
        after = 0;
      } else if (after >= 0) after++;
    });
    const sibling = runOf(e, { ...greedy(cases[2]!.prompt_token_ids, 30), speculative: NGRAM });
    const [v, s] = await Promise.all([victim, sibling]);
    assert.equal(v.finish, 'cancelled');
    assert.ok(v.tokens.length < 60 && v.tokens.length >= 5);
    // what it emitted is what plain decoding emits, up to where it stopped
    assert.deepEqual(v.tokens, victimPlain!.tokens.slice(0, v.tokens.length));
    assert.ok(after <= 8, `at most the rest of one step's run after the cancel (${after} tokens)`);
    sameRun(s, siblingPlain!, 'sibling');
    assert.equal(e.stats.running, 0);
    assert.equal(e.stats.kvBlocksUsed, 0);
    await e.close(0);
  });
});

test('after rollbacks the prefix cache holds only blocks of verified tokens, and a prompt served from them decodes as it does uncached', async () => {
  await withCpu(join(FIXTURES, 'llama'), async (m) => {
    const V = m.config.vocabSize;
    const cases = casesOf(join(FIXTURES, 'llama'));
    const opts: EngineOptions = { maxBatch: 4, blockSize: 4, maxModelLen: m.maxContext };
    const reqs = cases.map((c) => greedy(c.prompt_token_ids, 45));
    const plain = await alone(m, { ...opts, prefixCache: { promptCacheBytes: 0 } }, reqs);
    const e = new Engine(m.model, m, opts);
    // rejections at every offset of a 4-token block: wrong at 3, 7, 8, 13, 17, 18, ...
    const runs = await Promise.all(reqs.map((r, k) => runOf(e, {
      ...r, speculative: { proposer: scripted(plain[k]!.tokens, V, (i) => i % 5 === 3 || i % 10 === 8), numDraftTokens: 3 + k },
    })));
    runs.forEach((r, k) => sameRun(r, plain[k]!, `request ${k}`));
    assert.ok(e.stats.speculation.acceptedTokens < e.stats.speculation.draftTokens, 'drafts were rejected');
    // every hashed block in the pool is a block of some request's verified tokens
    const verified = new Set<string>();
    reqs.forEach((r, k) => {
      const tokens = [...r.promptIds, ...runs[k]!.tokens];
      const n = Math.floor(tokens.length / 4);
      for (const h of chainHashes(e.kv.prefixNamespace!, (p) => tokens[p]!, 4, 0, n)) verified.add(h);
    });
    const pool = e.kv.groups[0]!.pool;
    let hashed = 0;
    for (let b = 0; b < pool.numBlocks; b++) {
      const h = pool.hashOfBlock(b);
      if (h === undefined) continue;
      hashed++;
      assert.ok(verified.has(h), `block ${b} is registered under a hash of no verified prefix`);
    }
    assert.ok(hashed > 20, `blocks were cached (${hashed})`);
    // a prompt that continues a finished request is served from those blocks and decodes as uncached
    const next = greedy([...reqs[2]!.promptIds, ...runs[2]!.tokens], 12, { topLogprobs: 2 });
    const cached = await runOf(e, { ...next, speculative: NGRAM });
    assert.ok(cached.cachedTokens >= 40, `served from the prefix cache (${cached.cachedTokens} tokens)`);
    const [uncached] = await alone(m, { ...opts, prefixCache: { promptCacheBytes: 0 } }, [next]);
    sameRun(cached, uncached!, 'continuation');
    await e.close(0);
  });
});

test('a step with a draft is not pipelined; an adaptive row whose drafts stop paying decodes plainly and pipelines', async () => {
  await withCpu(join(FIXTURES, 'llama'), async (m) => {
    const V = m.config.vocabSize;
    const prompt = casesOf(join(FIXTURES, 'llama'))[2]!.prompt_token_ids;
    const [plain] = await alone(m, {}, [greedy(prompt, 150)]);
    // fixed depth: every step of the row verifies a draft, none is pipelined
    const fixed = new Engine(m.model, m, { maxBatch: 2, maxModelLen: m.maxContext, pipeline: true });
    sameRun(await runOf(fixed, { ...greedy(prompt, 150), speculative: { proposer: scripted(plain!.tokens, V), numDraftTokens: 3 } }), plain!, 'fixed');
    assert.equal(fixed.stats.pipelinedSteps, 0);
    await fixed.close(0);
    // adaptive, drafts always wrong: its acceptance falls by a tenth at each wrong guess (every
    // step), below what any measured step cost makes pay long before the end: drafting stops and
    // the row's steps pipeline
    const adaptive = new Engine(m.model, m, { maxBatch: 2, maxModelLen: m.maxContext, pipeline: true });
    const draftedAt: number[] = [];
    const r = await runOf(adaptive, { ...greedy(prompt, 150), speculative: { proposer: scripted(plain!.tokens, V, () => true), numDraftTokens: 'adaptive' } },
      undefined, () => draftedAt.push(adaptive.stats.speculation.draftTokens));
    sameRun(r, plain!, 'adaptive');
    assert.ok(r.speculation!.draftTokens > 0 && r.speculation!.acceptedTokens === 0);
    assert.equal(draftedAt[99], draftedAt[149], `no drafts over the last 50 tokens (${draftedAt[99]} then ${draftedAt[149]})`);
    assert.ok(adaptive.stats.pipelinedSteps >= 40, `the plain steps pipelined (${adaptive.stats.pipelinedSteps})`);
    await adaptive.close(0);
  });
});

test('graph replay: plain decode steps replay their graph, verify steps run op by op, and the tokens are those of plain decoding', async () => {
  const backend = new ReplayingReference();
  const m = await loadModel(backend as Backend, writeTinyLlama({ seed: 11 }), { maxModelLen: 256 });
  const prompts = [[1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8], [5, 5, 5, 5, 6]];
  const reqs = prompts.map((p) => greedy(p, 24));
  const plain = await alone(m, { graphs: true }, reqs);
  const e = new Engine(m.model, m, { maxBatch: 4, maxModelLen: m.maxContext, graphs: true });
  const replaysBefore = backend.replays;
  const runs = await Promise.all(reqs.map((r, k) => runOf(e, { ...r, speculative: k === 0 ? false : { proposer: scripted(plain[k]!.tokens, m.config.vocabSize, (i) => i % 4 === 1), numDraftTokens: 3 } })));
  runs.forEach((r, k) => sameRun(r, plain[k]!, `request ${k}`));
  assert.ok(e.stats.speculation.draftTokens > 0);
  assert.ok(backend.replays > replaysBefore, 'plain steps replayed graphs');
  await e.close(0);
});

test('speculative options are checked where they are given: the engine default at construction, a request\'s at submit', async () => {
  const m = await loadModel(new ReplayingReference() as Backend, writeTinyLlama(), { maxModelLen: 64 });
  const bad: [unknown, RegExp][] = [
    [{ proposer: 'eagle' }, /speculative.proposer must be 'ngram', 'draft' or 'eagle3', got "eagle"/],
    [{ proposer: 'eagle3' }, /speculative.proposer 'eagle3' needs an EAGLE-3 head/],
    [{ proposer: 'draft' }, /speculative.proposer 'draft' needs a draft model/],
    [{ proposer: 'ngram', numDraftTokens: 0 }, /numDraftTokens must be 'adaptive' or an integer from 1 to 64, got 0/],
    [{ proposer: 'ngram', numDraftTokens: 2.5 }, /numDraftTokens/],
    [{ proposer: 'ngram', ngramMin: 0 }, /ngramMin must be an integer from 1 to 64, got 0/],
    [{ proposer: 'ngram', ngramMin: 4, ngramMax: 3 }, /ngramMin \(4\) must not be above speculative.ngramMax \(3\)/],
  ];
  for (const [o, msg] of bad) {
    assert.throws(() => new Engine(m.model, m, { speculative: o as SpeculativeOptions }), msg);
    const e = new Engine(m.model, m, { maxBatch: 1 });
    assert.throws(() => e.submit({ ...greedy([1, 2], 2), speculative: o as SpeculativeOptions }, () => {}), msg);
    assert.equal(e.stats.waiting, 0, 'nothing queued');
    await e.close(0);
  }
  // defaults: adaptive depth, n-grams of 2 to 5 tokens; a lone bound moves the other with it
  const e = new Engine(m.model, m, { maxBatch: 1, speculative: { proposer: 'ngram', ngramMax: 1 } });
  const r = await runOf(e, greedy([3, 3, 3, 3, 3], 6));
  assert.ok(r.speculation !== undefined);
  await e.close(0);
});
