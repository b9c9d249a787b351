// Splits `<think>...</think>` reasoning from the answer, over streamed text deltas.
//
// Used only for models whose chat template mentions <think>. The reasoning block is recognised
// at the start of the output (after optional whitespace), or from the first token when the
// rendered prompt already ends inside an open <think> (templates that force thinking). Text that
// could still be the start of a tag is held back until it is decided, so a tag is never split
// across the two fields. Without a closing tag everything after <think> is reasoning.

const OPEN = '<think>';
const CLOSE = '</think>';

export interface SplitText {
  reasoning: string;
  content: string;
}

type Mode = 'start' | 'reasoning' | 'content';

/** true when the rendered prompt leaves the model inside an unclosed <think> */
export function promptOpensThink(prompt: string): boolean {
  const open = prompt.lastIndexOf(OPEN);
  return open >= 0 && prompt.indexOf(CLOSE, open) < 0 && prompt.slice(open + OPEN.length).trim() === '';
}

/** the longest suffix of `s` that is a proper prefix of `tag` */
function partialTagSuffix(s: string, tag: string): number {
  for (let k = Math.min(tag.length - 1, s.length); k > 0; k--) if (s.endsWith(tag.slice(0, k))) return k;
  return 0;
}

export class ThinkSplitter {
  private mode: Mode;
  private held = '';

  constructor(startsInside = false) {
    this.mode = startsInside ? 'reasoning' : 'start';
  }

  push(text: string): SplitText {
    const out: SplitText = { reasoning: '', content: '' };
    let buf = this.held + text;
    this.held = '';
    while (buf.length > 0) {
      if (this.mode === 'content') {
        out.content += buf;
        break;
      }
      if (this.mode === 'start') {
        const lead = buf.length - buf.trimStart().length;
        const rest = buf.slice(lead);
        if (rest.startsWith(OPEN)) {
          this.mode = 'reasoning';
          buf = rest.slice(OPEN.length);
          continue;
        }
        if (OPEN.startsWith(rest)) {
          this.held = buf; // whitespace and/or a partial "<think"
          break;
        }
        this.mode = 'content';
        continue;
      }
      // reasoning
      const close = buf.indexOf(CLOSE);
      if (close >= 0) {
        out.reasoning += buf.slice(0, close);
        this.mode = 'content';
        buf = buf.slice(close + CLOSE.length);
        continue;
      }
      const keep = partialTagSuffix(buf, CLOSE);
      out.reasoning += buf.slice(0, buf.length - keep);
      this.held = buf.slice(buf.length - keep);
      break;
    }
    return out;
  }

  /** what is still held back, at the end of generation */
  flush(): SplitText {
    const held = this.held;
    this.held = '';
    return this.mode === 'reasoning' ? { reasoning: held, content: '' } : { reasoning: '', content: held };
  }
}

/** whole-text form, for non-streaming responses */
export function splitThink(text: string, startsInside = false): SplitText {
  const s = new ThinkSplitter(startsInside);
  const a = s.push(text);
  const b = s.flush();
  return { reasoning: a.reasoning + b.reasoning, content: a.content + b.content };
}
