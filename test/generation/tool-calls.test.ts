// Tool-call parsers: content and calls come out the same however the text is split into pushes,
// and the streamed deltas rebuild the calls exactly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  TOOL_FORMATS, detectToolCallFormat, templateRendersTools, templateToolMessages,
  type ParsedPiece, type ToolCallFormatName, type ToolCallParser,
} from '../../src/generation/tool-calls/index.ts';

interface Result {
  content: string;
  calls: { name: string; arguments: string }[];
}

/** Feeds `text` in pieces cut at `cuts`; returns the content, calls and the reassembled deltas. */
function run(parser: ToolCallParser, pieces: string[]): { result: Result; fromDeltas: Result } {
  const got: ParsedPiece[] = pieces.map((p) => parser.push(p));
  got.push(parser.finish());
  const content = got.map((p) => p.content).join('');
  const byIndex = new Map<number, { id?: string; name?: string; arguments: string }>();
  for (const p of got)
    for (const d of p.calls) {
      const c = byIndex.get(d.index) ?? { arguments: '' };
      if (d.id !== undefined) {
        assert.equal(c.id, undefined, 'a call header came twice');
        c.id = d.id;
        c.name = d.name;
      } else assert.ok(c.id !== undefined, 'arguments before the call header');
      c.arguments += d.arguments;
      byIndex.set(d.index, c);
    }
  const fromDeltas = { content, calls: [...byIndex.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => ({ name: c.name!, arguments: c.arguments })) };
  const result = { content, calls: parser.calls.map((c) => ({ name: c.name, arguments: c.arguments })) };
  assert.deepEqual(parser.calls.map((c) => c.id), [...byIndex.values()].map((c) => c.id));
  return { result, fromDeltas };
}

function splits(text: string, seed: number): string[] {
  let s = seed;
  const out: string[] = [];
  for (let i = 0; i < text.length;) {
    s = (s * 1103515245 + 12345) >>> 0;
    const n = 1 + (s % 7);
    out.push(text.slice(i, i + n));
    i += n;
  }
  return out;
}

/** every split gives `expected`; deltas reassemble to it */
function check(format: ToolCallFormatName, text: string, expected: Result, opts: { forced?: boolean } = {}): void {
  const whole = run(TOOL_FORMATS[format].createParser(opts), [text]);
  assert.deepEqual(whole.result, expected, `${format}: ${JSON.stringify(text)}`);
  assert.deepEqual(whole.fromDeltas, expected);
  for (let seed = 1; seed <= 30; seed++) {
    const r = run(TOOL_FORMATS[format].createParser(opts), splits(text, seed));
    assert.deepEqual(r.result, expected, `${format} split ${seed}: ${JSON.stringify(text)}`);
    assert.deepEqual(r.fromDeltas, expected);
  }
  const chars = run(TOOL_FORMATS[format].createParser(opts), [...text]);
  assert.deepEqual(chars.result, expected);
  assert.deepEqual(chars.fromDeltas, expected);
}

test('hermes: content, several calls, whitespace around calls dropped', () => {
  const text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET \\"x\\" }"}}\n</tool_call>\n';
  check('hermes', text, {
    content: 'Let me check.',
    calls: [
      { name: 'get_weather', arguments: '{"city": "Paris", "days": [1, 2]}' },
      { name: 'get_time', arguments: '{"tz": "CET \\"x\\" }"}' },
    ],
  });
});

test('hermes: plain text, text that only looks like a tag, and a block that is not a call', () => {
  check('hermes', 'no tools here <tool and <tool_ca', { content: 'no tools here <tool and <tool_ca', calls: [] });
  check('hermes', 'a <tool_call>not json</tool_call> b', { content: 'a <tool_call>not json</tool_call> b', calls: [] });
  check('hermes', '  \n', { content: '  \n', calls: [] });
});

test('hermes: arguments before the name, string-encoded arguments, missing arguments', () => {
  check('hermes', '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', { content: '', calls: [{ name: 'f', arguments: '{"a": 1}' }] });
  check('hermes', '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', { content: '', calls: [{ name: 'f', arguments: '{"a": 1}' }] });
  check('hermes', '<tool_call>{"name": "f"}</tool_call>', { content: '', calls: [{ name: 'f', arguments: '{}' }] });
});

test('hermes: output cut inside a call keeps what was streamed; cut before the name is content', () => {
  check('hermes', 'x<tool_call>\n{"name": "f", "arguments": {"a": [1, ', { content: 'x', calls: [{ name: 'f', arguments: '{"a": [1, ' }] });
  check('hermes', 'x <tool_call>\n{"na', { content: 'x <tool_call>\n{"na', calls: [] });
});

test('an output max_tokens cut (finish(true)): held-back call markup is dropped, a call cut after its name kept as streamed, every format', () => {
  const cut = (format: ToolCallFormatName, pieces: string[]): Result => {
    const parser = TOOL_FORMATS[format].createParser({});
    let content = '';
    for (const piece of pieces) content += parser.push(piece).content;
    content += parser.finish(true).content;
    return { content, calls: parser.calls.map((c) => ({ name: c.name, arguments: c.arguments })) };
  };
  const done = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>';
  for (const text of ['Sure.\n<tool_call>\n{"name": "get_weather",', 'Sure.\n<tool_call>\n{"na', 'Sure.\n<tool_c']) {
    for (const pieces of [[text], splits(text, 3)]) assert.deepEqual(cut('hermes', pieces), { content: 'Sure.', calls: [] }, JSON.stringify(pieces));
  }
  assert.deepEqual(cut('hermes', [`${done}\n<tool_call>\n{"name": "g", "arguments": {"b": `]), {
    content: '', calls: [{ name: 'f', arguments: '{"a": 1}' }, { name: 'g', arguments: '{"b": ' }],
  });
  // a finished call, then plain text: nothing is held, nothing dropped
  assert.deepEqual(cut('hermes', [`${done} and then`]), run(TOOL_FORMATS.hermes.createParser({}), [`${done} and then`]).result);
  assert.deepEqual(cut('llama3_json', ['{"name": "get_we']), { content: '', calls: [] });
  // the second call's header is announced when its arguments begin: cut before that, it is markup
  assert.deepEqual(cut('llama3_json', ['{"name": "f", "parameters": {"x": 1}}; {"name": "g", "param']), { content: '', calls: [{ name: 'f', arguments: '{"x": 1}' }] });
  assert.deepEqual(cut('mistral', ['ok [TOOL_CALLS] [{"name": "f", "arguments": {"a":']), { content: 'ok', calls: [{ name: 'f', arguments: '{"a":' }] });
  assert.deepEqual(cut('mistral', ['ok [TOOL_CALLS] [{"name": "f"']), { content: 'ok', calls: [] });
  // not cut: unchanged (the markup before a name is content, as the test above says)
  const parser = TOOL_FORMATS.hermes.createParser({});
  assert.equal(parser.push('x <tool_call>\n{"na').content + parser.finish().content, 'x <tool_call>\n{"na');
});

test('llama3_json: calls at the start, several with ";", python tag; other text is content', () => {
  check('llama3_json', ' {"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}', {
    content: '', calls: [{ name: 'f', arguments: '{"x": 1}' }, { name: 'g', arguments: '{}' }],
  });
  check('llama3_json', '<|python_tag|>{"name": "f", "parameters": {"x": "}"}}', { content: '', calls: [{ name: 'f', arguments: '{"x": "}"}' }] });
  check('llama3_json', 'The answer is {"name": "f"}', { content: 'The answer is {"name": "f"}', calls: [] });
  check('llama3_json', '{"answer": 42}', { content: '{"answer": 42}', calls: [] });
});

test('mistral: [TOOL_CALLS] list, the newer name[ARGS] form, and the control token seen by id', () => {
  check('mistral', 'ok [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": [2]}}]', {
    content: 'ok', calls: [{ name: 'f', arguments: '{"a": 1}' }, { name: 'g', arguments: '{"b": [2]}' }],
  });
  check('mistral', '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}', { content: '', calls: [{ name: 'get_weather', arguments: '{"city": "Oslo"}' }] });
  check('mistral', 'brackets [TOOL_CALLS] are text here', { content: 'brackets [TOOL_CALLS] are text here', calls: [] });
  check('mistral', '[{"name": "f", "arguments": {}}]', { content: '', calls: [{ name: 'f', arguments: '{}' }] }, { forced: true });
  // the detokenizer drops the special token; the parser gets its id
  const p = TOOL_FORMATS.mistral.createParser({ triggerTokens: new Map([[5, '[TOOL_CALLS]']]) });
  p.push('Sure.');
  p.push('', 5);
  p.push('[{"name": "f", "arguments": {"q": 1}}]');
  p.finish();
  assert.deepEqual(p.calls.map((c) => [c.name, c.arguments]), [['f', '{"q": 1}']]);
  assert.match(p.calls[0]!.id, /^[A-Za-z0-9]{9}$/);
});

test('format detection and template helpers', () => {
  assert.equal(detectToolCallFormat(['{{ "<tool_call>" }}'], () => false), 'hermes');
  assert.equal(detectToolCallFormat([''], (t) => t === '[TOOL_CALLS]'), 'mistral');
  assert.equal(detectToolCallFormat(['<|python_tag|>'], () => false), 'llama3_json');
  assert.equal(detectToolCallFormat(['plain'], () => false), 'hermes');
  assert.equal(templateRendersTools('{% if tools %}x{% endif %}'), true);
  assert.equal(templateRendersTools('{{ messages }}'), false);
  const msgs = templateToolMessages([{ role: 'assistant', content: null, tool_calls: [{ id: 'a', type: 'function', function: { name: 'f', arguments: '{"x":1}' } }] }]);
  assert.deepEqual(msgs[0]!.tool_calls, [{ id: 'a', type: 'function', function: { name: 'f', arguments: { x: 1 } } }]);
  assert.equal(msgs[0]!.content, '');
});

test('inline tool prompts: tools in the system message, calls and results as text', () => {
  const tools = [{ name: 'f', description: 'does f', parameters: { type: 'object', properties: { a: { type: 'integer' } } } }];
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{"a": 1}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: '42' },
    { role: 'tool', tool_call_id: 'c2', content: '43' },
  ];
  const h = TOOL_FORMATS.hermes.inlineTools(messages, tools);
  assert.equal(h.length, 4);
  assert.match(h[0]!.content as string, /^Be brief\.\n\n# Tools[\s\S]*"name":"f"[\s\S]*<\/tool_call>$/);
  assert.equal(h[2]!.content, '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>');
  assert.equal(h[2]!.tool_calls, undefined);
  assert.deepEqual(h[3], { role: 'user', content: '<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response>' });
  const m = TOOL_FORMATS.mistral.inlineTools(messages.slice(1), tools);
  assert.equal(m[0]!.role, 'system');
  assert.equal(m[2]!.content, '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]');
});

test('forced-call grammars of every format compile and accept exactly the calls they force (and the parser reads them)', async () => {
  const { GrammarCompiler, GrammarRowError, maskAllows } = await import('../../src/sampling/grammar/index.ts');
  const { byteLevelCharToByte } = await import('../../src/artifacts/byte-level.ts');
  const tokens: string[] = new Array(257).fill('');
  for (const [ch, b] of byteLevelCharToByte()) tokens[b] = ch;
  tokens[256] = '<eos>';
  const compiler = new GrammarCompiler({
    tokens, vocabType: 'byte_level', prependSpace: false, vocabSize: 257, stopTokenIds: [256],
    encode: (t) => [...Buffer.from(t)], decode: (ids) => Buffer.from(ids).toString(),
  }, { worker: false });
  const params = { type: 'object', properties: { u: { enum: ['c', 'cc'] } }, required: ['u'] };
  // names that share prefixes (what xgrammar's alternation merge gets wrong elsewhere)
  const tools = [{ name: 'get', parameters: params }, { name: 'get_time', parameters: params }, { name: 'got' }];
  const call = (f: ToolCallFormatName, name: string, args: string) =>
    f === 'hermes' ? `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>` : `{"name": "${name}", "${f === 'llama3_json' ? 'parameters' : 'arguments'}": ${args}}`;
  const calls = (f: ToolCallFormatName, cs: string[]) => (f === 'mistral' ? `[${cs.join(', ')}]` : cs.join(f === 'hermes' ? '\n' : '; '));
  for (const f of ['hermes', 'llama3_json', 'mistral'] as const) {
    for (const forced of [{ parallel: true }, { parallel: false }, { only: 'get_time', parallel: true }]) {
      const g = await compiler.compile(TOOL_FORMATS[f].forcedGrammar(tools, forced));
      const accepts = (s: string) => {
        const m = g.createMatcher({ jumpForward: false });
        try {
          for (const b of Buffer.from(s)) {
            if (!maskAllows(m.mask(), b)) return false;
            m.accept(b);
          }
          return maskAllows(m.mask(), 256);
        } catch (err) {
          if (err instanceof GrammarRowError) return false;
          throw err;
        } finally {
          m.dispose();
        }
      };
      const one = call(f, 'get_time', '{"u": "cc"}');
      const two = calls(f, [call(f, 'get', '{"u": "c"}'), call(f, 'got', '{}')]);
      const where = `${f} ${JSON.stringify(forced)}`;
      assert.ok(accepts(calls(f, [one])), `${where}: one call`);
      assert.equal(accepts(two), forced.parallel && forced.only === undefined, `${where}: two calls`);
      for (const bad of [call(f, 'get_tim', '{"u": "c"}'), call(f, 'gett', '{"u": "c"}'), call(f, 'get_time', '{"u": "ccc"}'), call(f, 'get_time', '{}')])
        assert.equal(accepts(calls(f, [bad])), false, `${where}: ${bad}`);
      // what the grammar forces, the forced-mode parser reads back
      const parser = TOOL_FORMATS[f].createParser({ forced: true });
      const { result } = run(parser, [calls(f, [one])]);
      assert.deepEqual(result.calls, [{ name: 'get_time', arguments: '{"u": "cc"}' }], where);
      g.release();
    }
  }
});
