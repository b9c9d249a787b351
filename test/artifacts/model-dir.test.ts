// loadModelDir end to end on a small directory, generation_config.json, and the errors a user
// sees for broken directories.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ArtifactError } from '../../src/artifacts/errors.ts';
import { parseGenerationConfig, readGenerationConfig } from '../../src/artifacts/generation-config.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { CHATML, TINY, tempDir, tinyTokenizerJson, writeSafetensors } from './helpers.ts';

const config = {
  model_type: 'qwen3', vocab_size: 268, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
  num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, eos_token_id: TINY.endoftext, tie_word_embeddings: true,
};

function makeDir(): string {
  const dir = tempDir();
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  fs.writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [TINY.imEnd, TINY.endoftext], do_sample: true, temperature: 0.7, top_p: 0.8, top_k: 20 }));
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tinyTokenizerJson()));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: '<|im_end|>', chat_template: CHATML }));
  writeSafetensors(path.join(dir, 'model.safetensors'), [
    { name: 'model.embed_tokens.weight', dtype: 'BF16', shape: [268, 16] },
    { name: 'model.norm.weight', dtype: 'F32', shape: [16] },
  ]);
  return dir;
}

function throwsArtifact(fn: () => unknown, pattern: RegExp) {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ArtifactError, `not an ArtifactError: ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

describe('loadModelDir', () => {
  it('loads config, weights, tokenizer, template and generation config together', () => {
    const dir = makeDir();
    const m = loadModelDir(dir);
    assert.equal(m.config.modelType, 'qwen3');
    assert.deepEqual(m.config.eosTokenIds, [TINY.endoftext, TINY.imEnd]); // config ∪ generation_config
    assert.equal(m.rawConfig.model_type, 'qwen3');
    assert.deepEqual(m.weights.expectShape('model.embed_tokens.weight', [268, 16]).dtype, 'bf16');
    assert.equal(m.config.weightPrefix, 'model.');
    assert.deepEqual(m.tokenizer.encode('hello'), [TINY.hello]);
    assert.deepEqual(m.chatTemplate!.encode([{ role: 'user', content: 'hello' }], { addGenerationPrompt: true }),
      [TINY.imStart, ...m.tokenizer.encode('user\nhello'), TINY.imEnd, ...m.tokenizer.encode('\n'), TINY.imStart, ...m.tokenizer.encode('assistant\n')]);
    assert.equal(m.generationConfig!.doSample, true);
    assert.equal(m.generationConfig!.temperature, 0.7);
    assert.equal(m.generationConfig!.topK, 20);
  });

  it('header-only mode skips the tokenizer', () => {
    const dir = makeDir();
    fs.rmSync(path.join(dir, 'tokenizer.json'));
    const m = loadModelDir(dir, { tokenizer: false });
    assert.equal(m.tokenizer, undefined);
    assert.equal(m.config.numLayers, 1);
  });

  it('clear errors for a broken directory', () => {
    throwsArtifact(() => loadModelDir('/nonexistent/llmts-model'), /model directory \/nonexistent\/llmts-model does not exist/);
    const file = path.join(tempDir(), 'x');
    fs.writeFileSync(file, '');
    throwsArtifact(() => loadModelDir(file), /is not a directory/);

    const noConfig = makeDir();
    fs.rmSync(path.join(noConfig, 'config.json'));
    throwsArtifact(() => loadModelDir(noConfig), /model config .*config\.json is missing/);

    const badConfig = makeDir();
    fs.writeFileSync(path.join(badConfig, 'config.json'), '{"model_type": "qwen3",');
    throwsArtifact(() => loadModelDir(badConfig), /config\.json is not valid JSON/);

    const arrayConfig = makeDir();
    fs.writeFileSync(path.join(arrayConfig, 'config.json'), '[]');
    throwsArtifact(() => loadModelDir(arrayConfig), /must hold a JSON object/);

    const noTok = makeDir();
    fs.rmSync(path.join(noTok, 'tokenizer.json'));
    throwsArtifact(() => loadModelDir(noTok), /tokenizer\.json is missing/);

    const noWeights = makeDir();
    fs.rmSync(path.join(noWeights, 'model.safetensors'));
    throwsArtifact(() => loadModelDir(noWeights), /no safetensors weights/);

    const badGen = makeDir();
    fs.writeFileSync(path.join(badGen, 'generation_config.json'), 'nope');
    throwsArtifact(() => loadModelDir(badGen), /generation_config\.json is not valid JSON/);
  });
});

describe('generation config', () => {
  it('maps the sampling fields present and nothing else', () => {
    const g = parseGenerationConfig({ eos_token_id: 3, bos_token_id: 1, repetition_penalty: 1.1, min_p: 0.05, max_new_tokens: 64 });
    assert.deepEqual(g.eosTokenIds, [3]);
    assert.equal(g.bosTokenId, 1);
    assert.equal(g.repetitionPenalty, 1.1);
    assert.equal(g.minP, 0.05);
    assert.equal(g.maxNewTokens, 64);
    assert.equal(g.temperature, undefined);
    assert.equal(g.topK, undefined);
    assert.equal(g.doSample, undefined);
  });

  it('rejects wrong types naming the field', () => {
    throwsArtifact(() => parseGenerationConfig({ temperature: 'hot' }), /"temperature" must be a number/);
    throwsArtifact(() => parseGenerationConfig({ eos_token_id: [1, 'x'] }), /"eos_token_id" must be a token id/);
    throwsArtifact(() => parseGenerationConfig({ do_sample: 1 }), /"do_sample" must be true or false/);
    throwsArtifact(() => parseGenerationConfig(7), /must hold a JSON object/);
  });

  it('absent file is undefined', () => {
    assert.equal(readGenerationConfig(tempDir()), undefined);
  });
});
