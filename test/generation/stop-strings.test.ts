import { test } from 'node:test';
import assert from 'node:assert/strict';
import { StopStringMatcher } from '../../src/generation/stop-strings.ts';

function feedAll(m: StopStringMatcher, deltas: string[]): string[] {
  return deltas.map((d) => m.feed(d).text);
}

test('a stop string split across deltas is held back, then dropped', () => {
  const m = new StopStringMatcher(['STOP']);
  assert.deepEqual(m.feed('abc ST'), { text: 'abc ', stopped: false });
  assert.deepEqual(m.feed('O'), { text: '', stopped: false });
  assert.deepEqual(m.feed('P more'), { text: '', stopped: true, stop: 'STOP' });
  assert.deepEqual(m.feed('later'), { text: '', stopped: true });
  assert.equal(m.flush(), '');
});

test('a false start is released as soon as it cannot match', () => {
  const m = new StopStringMatcher(['STOP']);
  assert.deepEqual(feedAll(m, ['abc ST', 'ART', 'S']), ['abc ', 'START', '']);
  assert.equal(m.flush(), 'S');
  assert.equal(m.stopped, false);
});

test('multiple stop strings: the earliest in the text wins, then the longest', () => {
  assert.deepEqual(new StopStringMatcher(['\n\n', 'END']).feed('hello END world\n\n'), { text: 'hello ', stopped: true, stop: 'END' });
  assert.deepEqual(new StopStringMatcher(['END', '\n\n']).feed('a\n\nEND'), { text: 'a', stopped: true, stop: '\n\n' });
  assert.deepEqual(new StopStringMatcher(['ab', 'abc']).feed('xabcd'), { text: 'x', stopped: true, stop: 'abc' });
});

test('overlapping prefixes: self-overlapping stop string', () => {
  const m = new StopStringMatcher(['aab']);
  assert.deepEqual(feedAll(m, ['a', 'a', 'a']), ['', '', 'a']);
  assert.deepEqual(m.feed('b'), { text: '', stopped: true, stop: 'aab' });
});

test('overlapping prefixes: one stop string inside another one\'s prefix', () => {
  const m = new StopStringMatcher(['abcd', 'bce']);
  assert.deepEqual(feedAll(m, ['ab', 'c']), ['', '']);
  assert.deepEqual(m.feed('e'), { text: 'a', stopped: true, stop: 'bce' });
});

test('the held tail is exactly the longest suffix that may still start a stop string', () => {
  const m = new StopStringMatcher(['xyz', 'yq']);
  assert.deepEqual(feedAll(m, ['0x', 'y', 'w']), ['0', '', 'xyw']);
  assert.equal(m.flush(), '');
});

test('includeStop keeps the stop string; no stops = pass-through; empty stops ignored', () => {
  assert.deepEqual(new StopStringMatcher(['</s>'], { includeStop: true }).feed('a</s>b'), { text: 'a</s>', stopped: true, stop: '</s>' });
  const none = new StopStringMatcher(['']);
  assert.deepEqual(feedAll(none, ['a', 'b']), ['a', 'b']);
  assert.equal(none.flush(), '');
});

test('streamed output equals the one-shot answer for every split point', () => {
  const text = 'the cat sat on the mat. THE END and more';
  for (let i = 0; i <= text.length; i++) {
    for (let j = i; j <= text.length; j++) {
      const m = new StopStringMatcher(['THE END', 'mat?']);
      const out = feedAll(m, [text.slice(0, i), text.slice(i, j), text.slice(j)]).join('') + m.flush();
      assert.equal(out, 'the cat sat on the mat. ', `split at ${i},${j}`);
    }
  }
});
