// The committed transformers fixtures (test/fixtures/<name>/, made by tools/oracle/make_fixtures.py):
// every directory must load, and our tokenizer and chat template must reproduce transformers'
// encode / decode / apply_chat_template ids recorded in its reference.json.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';

const fixturesDir = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'fixtures');
const names = fs.existsSync(fixturesDir)
  ? fs.readdirSync(fixturesDir).filter((n) => fs.existsSync(path.join(fixturesDir, n, 'reference.json'))).sort()
  : [];

describe('transformers fixtures', () => {
  if (names.length === 0) {
    it('fixtures present', { skip: `no fixtures under ${fixturesDir} yet` }, () => {});
    return;
  }
  for (const name of names) {
    describe(name, () => {
      const dir = path.join(fixturesDir, name);
      const ref = JSON.parse(fs.readFileSync(path.join(dir, 'reference.json'), 'utf8'));
      const m = loadModelDir(dir);

      it('loads, with the model type, eos ids and tensor names transformers used', () => {
        assert.equal(m.config.modelType, ref.model_type);
        for (const id of ref.generation?.eos_token_ids ?? []) assert.ok(m.config.eosTokenIds.includes(id), `eos ${id}`);
        m.weights.expectShape(`${m.config.weightPrefix}embed_tokens.weight`, [m.config.vocabSize, m.config.hiddenSize]);
        if (!m.config.tieWordEmbeddings) m.weights.expectShape(m.config.lmHeadWeight, [m.config.vocabSize, m.config.hiddenSize]);
      });

      it('encode and decode match transformers', () => {
        assert.ok(ref.tokenizer.length > 0);
        for (const t of ref.tokenizer) {
          assert.deepEqual(m.tokenizer.encode(t.text), t.ids, `encode ${JSON.stringify(t.text)}`);
          assert.equal(m.tokenizer.decode(t.ids), t.decoded, `decode ${JSON.stringify(t.text)}`);
        }
      });

      it('apply_chat_template text and ids match transformers', () => {
        assert.ok(ref.chat.length > 0);
        assert.ok(m.chatTemplate, 'fixture has a chat template');
        for (const c of ref.chat) {
          assert.equal(m.chatTemplate.render(c.messages, { addGenerationPrompt: true }), c.text);
          assert.deepEqual(m.chatTemplate.encode(c.messages, { addGenerationPrompt: true }), c.ids);
        }
      });

      it('prompt ids decode to the recorded prompt text', () => {
        for (const c of ref.cases ?? []) assert.equal(m.tokenizer.decode(c.prompt_token_ids), c.prompt_text);
      });
    });
  }
});
