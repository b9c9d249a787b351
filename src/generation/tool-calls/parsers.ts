// Streaming parsers that split a model's output into content and tool calls, one per family
// format:
//   hermes (Qwen, Hermes): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (repeatable)
//   llama3_json: {"name": ..., "parameters": {...}} (optionally after <|python_tag|>, several
//     joined with ";"), only at the start of the output
//   mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or [TOOL_CALLS]name[ARGS]{...}
// Text that only looks like the start of a call is held back until decided; a block that turns
// out not to be a call is returned as content, exactly as written. Whitespace around calls is
// dropped (content holds trailing whitespace until more content follows). Every decision depends
// only on the text seen so far, so any split into pushes yields the same content and calls.

import { CallScanner } from './call-scanner.ts';
import type { ParsedPiece, ToolCall, ToolCallDelta } from './types.ts';

export interface ToolCallParser {
  /** `tokenId` lets a parser see control tokens the detokenizer drops (Mistral's [TOOL_CALLS]) */
  push(text: string, tokenId?: number): ParsedPiece;
  /**
   * End of output: what was held back. `truncated` (max_tokens cut the output): text held back
   * because it may begin a call (a tag, a call's opening before its name) is dropped instead of
   * returned as content. A call cut after its name keeps the arguments written so far, as a
   * stream has sent them (the finish reason says the output was cut).
   */
  finish(truncated?: boolean): ParsedPiece;
  /** the calls found so far (arguments complete once finished) */
  readonly calls: readonly ToolCall[];
}

export interface ParserOptions {
  newId(): string;
  /** token id -> the text it stands for, for control tokens decoded to nothing */
  triggerTokens?: ReadonlyMap<number, string>;
  /** the output starts directly with the call syntax (a grammar forced it) */
  forced?: boolean;
}

const isWs = (c: string): boolean => c === ' ' || c === '\n' || c === '\t' || c === '\r';

/** the longest suffix of `s` that is a proper prefix of `tag` */
function partialSuffix(s: string, tag: string): number {
  for (let k = Math.min(tag.length - 1, s.length); k > 0; k--) if (s.endsWith(tag.slice(0, k))) return k;
  return 0;
}

abstract class ParserBase implements ToolCallParser {
  protected buf = '';
  readonly calls: ToolCall[] = [];
  private heldWs = '';
  private piece: ParsedPiece = { content: '', calls: [] };
  private finished = false;

  constructor(protected readonly opts: ParserOptions) {}

  push(text: string, tokenId?: number): ParsedPiece {
    if (this.finished) throw new Error('push after finish');
    const trigger = tokenId === undefined ? undefined : this.opts.triggerTokens?.get(tokenId);
    if (trigger !== undefined && !text.includes(trigger)) text = trigger + text;
    this.buf += text;
    this.step(false);
    return this.take();
  }

  finish(truncated = false): ParsedPiece {
    if (!this.finished) {
      if (truncated) {
        // what is decidable without more text is decided; the rest may be a call's beginning
        this.step(false);
        if (this.buf !== '') this.heldWs = ''; // whitespace before dropped markup goes with it
        this.buf = '';
      } else {
        this.step(true);
        this.atEnd();
      }
      if (this.calls.length === 0) this.piece.content += this.heldWs;
      this.heldWs = '';
      this.finished = true;
    }
    return this.take();
  }

  /** consume as much of `buf` as can be decided (everything when `final`) */
  protected abstract step(final: boolean): void;
  /** end of output inside an unfinished construct */
  protected abstract atEnd(): void;

  private take(): ParsedPiece {
    const p = this.piece;
    this.piece = { content: '', calls: [] };
    return p;
  }

  /** plain text outside calls; trailing whitespace waits for more content */
  protected content(text: string): void {
    if (text === '') return;
    const all = this.heldWs + text;
    let end = all.length;
    while (end > 0 && isWs(all[end - 1]!)) end--;
    if (end === 0) {
      this.heldWs = all;
      return;
    }
    this.piece.content += all.slice(0, end);
    this.heldWs = all.slice(end);
  }

  /** a call begins: whitespace before it is dropped (returned, in case the call turns out to be text) */
  protected takeHeldWs(): string {
    const ws = this.heldWs;
    this.heldWs = '';
    return ws;
  }

  protected newScanner(): CallScanner {
    let index = -1;
    return new CallScanner({
      header: (name) => {
        index = this.calls.length;
        const id = this.opts.newId();
        this.calls.push({ id, name, arguments: '' });
        this.piece.calls.push({ index, id, name, arguments: '' });
      },
      args: (text) => {
        this.calls[index]!.arguments += text;
        const last: ToolCallDelta | undefined = this.piece.calls[this.piece.calls.length - 1];
        if (last && last.index === index) last.arguments += text;
        else this.piece.calls.push({ index, arguments: text });
      },
    });
  }

  /** Feeds buf to the scanner until it finishes or fails; returns the text consumed. */
  protected feed(scanner: CallScanner): string {
    let k = 0;
    while (k < this.buf.length && !scanner.done && !scanner.failed) {
      scanner.feed(this.buf[k]!);
      k++;
    }
    const used = this.buf.slice(0, k);
    this.buf = this.buf.slice(k);
    return used;
  }
}

/** <tool_call>{...}</tool_call> blocks anywhere in the output */
export class HermesParser extends ParserBase {
  static readonly OPEN = '<tool_call>';
  static readonly CLOSE = '</tool_call>';
  private state: 'content' | 'call' | 'close' | 'bad' = 'content';
  private scanner?: CallScanner;
  private blockRaw = '';
  private wsBefore = '';

  protected step(final: boolean): void {
    const OPEN = HermesParser.OPEN, CLOSE = HermesParser.CLOSE;
    for (;;) {
      switch (this.state) {
        case 'content': {
          const i = this.buf.indexOf(OPEN);
          if (i >= 0) {
            this.content(this.buf.slice(0, i));
            this.wsBefore = this.takeHeldWs();
            this.buf = this.buf.slice(i + OPEN.length);
            this.scanner = this.newScanner();
            this.blockRaw = '';
            this.state = 'call';
            continue;
          }
          const keep = final ? 0 : partialSuffix(this.buf, OPEN);
          this.content(this.buf.slice(0, this.buf.length - keep));
          this.buf = this.buf.slice(this.buf.length - keep);
          return;
        }
        case 'call': {
          const s = this.scanner!;
          this.blockRaw += this.feed(s);
          if (s.done || (s.failed && s.headerSent)) this.state = 'close';
          else if (s.failed) this.state = 'bad';
          else return;
          continue;
        }
        case 'close': {
          const i = this.buf.indexOf(CLOSE);
          const j = this.buf.indexOf(OPEN);
          if (i >= 0 && (j < 0 || i < j)) {
            this.buf = this.buf.slice(i + CLOSE.length);
            this.state = 'content';
            continue;
          }
          if (j >= 0) {
            // a new call without closing the last one
            this.buf = this.buf.slice(j);
            this.state = 'content';
            continue;
          }
          const keep = final ? 0 : Math.max(partialSuffix(this.buf, CLOSE), partialSuffix(this.buf, OPEN));
          this.buf = this.buf.slice(this.buf.length - keep);
          return;
        }
        case 'bad': {
          // not a call: the whole block, tags included, is content
          const i = this.buf.indexOf(CLOSE);
          if (i >= 0 || final) {
            const end = i >= 0 ? i + CLOSE.length : this.buf.length;
            this.content(this.wsBefore + OPEN + this.blockRaw + this.buf.slice(0, end));
            this.buf = this.buf.slice(end);
            this.state = 'content';
            if (final && i < 0) return;
            continue;
          }
          const keep = partialSuffix(this.buf, CLOSE);
          this.blockRaw += this.buf.slice(0, this.buf.length - keep);
          this.buf = this.buf.slice(this.buf.length - keep);
          return;
        }
      }
    }
  }

  protected atEnd(): void {
    if (this.state === 'call' && !this.scanner!.headerSent) {
      this.content(this.wsBefore + HermesParser.OPEN + this.blockRaw + this.buf);
      this.buf = '';
    }
  }
}

/** Llama 3 JSON calls: the output begins with {"name": ..., "parameters": ...} */
export class Llama3JsonParser extends ParserBase {
  static readonly PYTHON_TAG = '<|python_tag|>';
  private state: 'start' | 'call' | 'next' | 'content' = 'start';
  private scanner?: CallScanner;
  /** text of the current attempt, returned as content if it is not a call */
  private blockRaw = '';

  protected step(final: boolean): void {
    const TAG = Llama3JsonParser.PYTHON_TAG;
    for (;;) {
      switch (this.state) {
        case 'start': {
          let i = 0;
          while (i < this.buf.length && isWs(this.buf[i]!)) i++;
          const rest = this.buf.slice(i);
          if (rest.startsWith(TAG)) {
            this.blockRaw = this.buf.slice(0, i + TAG.length);
            this.buf = rest.slice(TAG.length);
            this.startCall();
            continue;
          }
          if (rest.startsWith('{')) {
            this.blockRaw = this.buf.slice(0, i);
            this.buf = rest;
            this.startCall();
            continue;
          }
          if (!final && (rest === '' || TAG.startsWith(rest))) return;
          this.state = 'content';
          continue;
        }
        case 'call': {
          const s = this.scanner!;
          this.blockRaw += this.feed(s);
          if (s.done || (s.failed && s.headerSent)) {
            this.blockRaw = '';
            this.state = 'next';
          } else if (s.failed) {
            this.buf = this.blockRaw + this.buf;
            this.blockRaw = '';
            this.state = 'content';
          } else return;
          continue;
        }
        case 'next': {
          let i = 0;
          while (i < this.buf.length && isWs(this.buf[i]!)) i++;
          if (i === this.buf.length) {
            if (!final) return;
            this.buf = '';
            return;
          }
          if (this.buf[i] === ';') {
            this.blockRaw = this.buf.slice(0, i + 1);
            this.buf = this.buf.slice(i + 1);
            this.startCall();
            continue;
          }
          this.state = 'content';
          continue;
        }
        case 'content':
          this.content(this.buf);
          this.buf = '';
          return;
      }
    }
  }

  private startCall(): void {
    this.scanner = this.newScanner();
    this.state = 'call';
  }

  protected atEnd(): void {
    if (this.state === 'call' && !this.scanner!.headerSent) {
      this.content(this.blockRaw + this.buf);
      this.buf = '';
    }
  }
}

/** Mistral: [TOOL_CALLS] then a JSON list of calls, or name[ARGS]{...} (newer tokenizers) */
export class MistralParser extends ParserBase {
  static readonly TRIGGER = '[TOOL_CALLS]';
  static readonly ARGS = '[ARGS]';
  private state: 'content' | 'open' | 'call' | 'next' | 'name' | 'args';
  private scanner?: CallScanner;
  private blockRaw = '';
  private wsBefore = '';
  /** the list form ([{...}, ...]) rather than a bare object or name[ARGS] */
  private list = false;

  constructor(opts: ParserOptions) {
    super(opts);
    this.state = opts.forced ? 'open' : 'content';
  }

  protected step(final: boolean): void {
    const TRIGGER = MistralParser.TRIGGER, ARGS = MistralParser.ARGS;
    for (;;) {
      switch (this.state) {
        case 'content': {
          const i = this.buf.indexOf(TRIGGER);
          if (i >= 0) {
            this.content(this.buf.slice(0, i));
            this.wsBefore = this.takeHeldWs();
            this.blockRaw = TRIGGER;
            this.buf = this.buf.slice(i + TRIGGER.length);
            this.state = 'open';
            continue;
          }
          const keep = final ? 0 : partialSuffix(this.buf, TRIGGER);
          this.content(this.buf.slice(0, this.buf.length - keep));
          this.buf = this.buf.slice(this.buf.length - keep);
          return;
        }
        case 'open': {
          let i = 0;
          while (i < this.buf.length && isWs(this.buf[i]!)) i++;
          if (i === this.buf.length) {
            if (!final) return;
            this.revert();
            continue;
          }
          const c = this.buf[i]!;
          this.blockRaw += this.buf.slice(0, i);
          this.buf = this.buf.slice(i);
          if (c === '[') {
            this.blockRaw += c;
            this.buf = this.buf.slice(1);
            this.list = true;
            this.scanner = this.newScanner();
            this.state = 'call';
          } else if (c === '{') {
            this.list = false;
            this.scanner = this.newScanner();
            this.state = 'call';
          } else if (/[A-Za-z_]/.test(c)) {
            this.state = 'name';
          } else {
            this.revert();
          }
          continue;
        }
        case 'name': {
          const i = this.buf.indexOf(ARGS);
          if (i < 0) {
            if (final || !/^[A-Za-z0-9_.-]*$/.test(this.buf.slice(0, this.buf.length - partialSuffix(this.buf, ARGS)))) {
              this.revert();
              continue;
            }
            return;
          }
          const name = this.buf.slice(0, i).trim();
          this.blockRaw += this.buf.slice(0, i + ARGS.length);
          this.buf = this.buf.slice(i + ARGS.length);
          // the arguments are scanned as the value of a synthetic {"name": ..., "arguments": ...}
          this.scanner = this.newScanner();
          for (const c of `{"name": ${JSON.stringify(name)}, "arguments": `) this.scanner.feed(c);
          this.state = 'args';
          continue;
        }
        case 'args': {
          const s = this.scanner!;
          // stop at the end of the arguments value, then close the synthetic object
          let k = 0;
          while (k < this.buf.length && !s.failed && s.arguments === undefined) s.feed(this.buf[k++]!);
          this.blockRaw += this.buf.slice(0, k);
          this.buf = this.buf.slice(k);
          if (s.arguments !== undefined && !s.failed) {
            s.feed('}');
            this.blockRaw = '';
            this.wsBefore = '';
            this.state = 'content';
            continue;
          }
          if (s.failed) {
            if (s.headerSent) this.state = 'content';
            else this.revert();
            continue;
          }
          return;
        }
        case 'call': {
          const s = this.scanner!;
          this.blockRaw += this.feed(s);
          if (s.done || (s.failed && s.headerSent)) {
            // a call was made: only a later, failed call could still turn back into text
            this.blockRaw = '';
            this.wsBefore = '';
            this.state = this.list ? 'next' : 'content';
          } else if (s.failed) {
            this.revert();
          } else return;
          continue;
        }
        case 'next': {
          let i = 0;
          while (i < this.buf.length && isWs(this.buf[i]!)) i++;
          if (i === this.buf.length) {
            if (final) this.buf = '';
            return;
          }
          const c = this.buf[i]!;
          this.buf = this.buf.slice(i + (c === ',' || c === ']' ? 1 : 0));
          if (c === ',') {
            this.scanner = this.newScanner();
            this.state = 'call';
          } else {
            this.blockRaw = '';
            this.state = 'content';
          }
          continue;
        }
      }
    }
  }

  /** what looked like the start of calls is text after all */
  private revert(): void {
    this.content(this.wsBefore + this.blockRaw);
    this.wsBefore = '';
    this.blockRaw = '';
    this.state = 'content'; // the rest of buf is scanned again as content
  }

  protected atEnd(): void {
    if ((this.state === 'call' || this.state === 'args') && !this.scanner!.headerSent) this.revert();
    else if (this.state === 'name' || this.state === 'open') this.revert();
  }
}
