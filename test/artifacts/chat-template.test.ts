// Chat templates: sources and precedence, variables, helpers, and encoding without re-adding
// special tokens.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ChatTemplate, ChatTemplateError } from '../../src/artifacts/chat-template.ts';
import { ArtifactError } from '../../src/artifacts/errors.ts';
import { TextTokenizer } from '../../src/artifacts/tokenizer.ts';
import { CHATML, TINY, tempDir, tinyTokenizerJson } from './helpers.ts';

const msgs = [
  { role: 'system', content: 'be brief' },
  { role: 'user', content: 'hello' },
];

function modelDir(tokenizerConfig: Record<string, unknown>, files: Record<string, string> = {}) {
  const dir = tempDir();
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tinyTokenizerJson({ addBos: true })));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig));
  for (const [name, text] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, name)), { recursive: true });
    fs.writeFileSync(path.join(dir, name), text);
  }
  const tok = TextTokenizer.fromDir(dir);
  return { dir, tok, tpl: ChatTemplate.fromDir(dir, tok) };
}

describe('ChatTemplate', () => {
  it('renders ChatML with and without the generation prompt', () => {
    const { tpl } = modelDir({ chat_template: CHATML });
    assert.ok(tpl);
    assert.equal(tpl.render(msgs), '<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n');
    assert.equal(tpl.render(msgs, { addGenerationPrompt: true }), tpl.render(msgs) + '<|im_start|>assistant\n');
  });

  it('encodes without adding special tokens again (no second bos)', () => {
    const tmpl = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    const { tpl, tok } = modelDir({ bos_token: '<s>', chat_template: tmpl });
    assert.deepEqual(tok.encode('hello'), [TINY.bos, TINY.hello]); // the post-processor adds bos...
    assert.deepEqual(tpl!.encode([{ role: 'user', content: 'hello' }]), [TINY.bos, TINY.hello]); // ...but only once here
  });

  it('passes named special tokens, tools and extra variables', () => {
    const tmpl =
      "{{ eos_token }}|{% if tools %}{{ tools | length }} tools: {{ tools[0].name }}{% else %}no tools{% endif %}|{{ custom }}";
    const { tpl } = modelDir({ eos_token: '<|im_end|>', chat_template: tmpl });
    assert.equal(tpl!.render(msgs, { variables: { custom: 'x' } }), '<|im_end|>|no tools|x');
    assert.equal(tpl!.render(msgs, { tools: [{ name: 'search' }] }), '<|im_end|>|1 tools: search|');
  });

  it('raise_exception becomes a ChatTemplateError with the template message', () => {
    const tmpl = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
    const { tpl } = modelDir({ chat_template: tmpl });
    assert.throws(() => tpl!.render(msgs), (e: unknown) => e instanceof ChatTemplateError && e.message === 'Conversation must start with user');
    assert.equal(tpl!.render([{ role: 'user', content: 'x' }]), 'ok');
  });

  it('strftime_now formats like Python (C locale); range works', () => {
    const { tpl } = modelDir({ chat_template: "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A %B %j %%') }}|{% for i in range(3) %}{{ i }}{% endfor %}" });
    const now = () => new Date(2024, 6, 26, 9, 5); // 26 July 2024, a Friday, day 208
    assert.equal(tpl!.render([], { now }), '26 Jul 2024|Friday July 208 %|012');
  });

  it('caller variables shadow helpers and special tokens', () => {
    const { tpl } = modelDir({ bos_token: '<s>', chat_template: '{{ bos_token }}{{ strftime_now }}' });
    assert.equal(tpl!.render([], { variables: { bos_token: 'B', strftime_now: 'S' } }), 'BS');
  });

  it('a list of named templates uses "default", or "tool_use" when tools are given', () => {
    const { tpl } = modelDir({ chat_template: [{ name: 'default', template: 'D' }, { name: 'tool_use', template: 'T' }] });
    assert.equal(tpl!.render(msgs), 'D');
    assert.equal(tpl!.render(msgs, { tools: [] }), 'T');
    assert.equal(tpl!.render(msgs, { templateName: 'tool_use' }), 'T');
    assert.throws(() => tpl!.render(msgs, { templateName: 'rag' }), ChatTemplateError);
    const { tpl: noDefault } = modelDir({ chat_template: [{ name: 'rag', template: 'R' }] });
    assert.throws(() => noDefault!.render(msgs), /none is named "default"/);
  });

  it('chat_template.jinja beats tokenizer_config; additional_chat_templates add named ones', () => {
    const { tpl } = modelDir({ chat_template: 'CONFIG' }, {
      'chat_template.jinja': 'FILE',
      'additional_chat_templates/tool_use.jinja': 'TOOLS',
    });
    assert.equal(tpl!.render(msgs), 'FILE');
    assert.equal(tpl!.render(msgs, { tools: [] }), 'TOOLS');
  });

  it('falls back to the legacy chat_template.json; none at all is undefined', () => {
    const { tpl } = modelDir({}, { 'chat_template.json': JSON.stringify({ chat_template: 'LEGACY' }) });
    assert.equal(tpl!.render(msgs), 'LEGACY');
    assert.equal(modelDir({}).tpl, undefined);
  });

  it('a template that does not parse is an ArtifactError naming its file', () => {
    assert.throws(() => modelDir({ chat_template: '{% for m in messages %}' }), (e: unknown) =>
      e instanceof ArtifactError && /tokenizer_config\.json does not parse/.test(e.message));
    assert.throws(() => modelDir({ chat_template: 42 }), /chat_template must be a string or a list/);
  });
});
