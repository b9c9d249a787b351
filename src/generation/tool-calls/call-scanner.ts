// Scans one call object, character by character, as the model writes it:
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
// ("parameters" is accepted for "arguments": Llama 3's spelling). Once the name is known and the
// arguments value begins, the value's characters stream out as they arrive, so a client sees the
// arguments grow; when the arguments come before the name (or are a JSON string holding the
// object's text), they are held and sent whole at the end. Either way the concatenated pieces
// equal the final `arguments` text, which is the model's own text of the value.
//
// Every decision depends only on characters already seen, so any split of the input into pushes
// gives the same result (what makes streamed and non-streamed responses agree).

export const NAME_KEY = 'name';
export const ARGUMENT_KEYS = ['arguments', 'parameters'];

type State = 'start' | 'key' | 'keystr' | 'colon' | 'value' | 'after' | 'done' | 'fail';

export interface ScannerEvents {
  /** the call's name is known and its arguments begin (or the object ended without them) */
  header(name: string): void;
  /** more arguments text */
  args(text: string): void;
}

const isWs = (c: string): boolean => c === ' ' || c === '\n' || c === '\t' || c === '\r';

export class CallScanner {
  private state: State = 'start';
  private keyBuf = '';
  private keyEsc = false;
  private key = '';
  // value being scanned
  private raw = '';
  private started = false;
  private depth = 0;
  private inStr = false;
  private esc = false;
  private streaming = false;
  name?: string;
  /** the complete arguments text (once known) */
  arguments?: string;
  headerSent = false;

  constructor(private readonly ev: ScannerEvents) {}

  get done(): boolean {
    return this.state === 'done';
  }

  get failed(): boolean {
    return this.state === 'fail';
  }

  /** Consumes one character; returns false when the character is not part of the object (done/failed). */
  feed(c: string): boolean {
    switch (this.state) {
      case 'done':
      case 'fail':
        return false;
      case 'start':
        if (isWs(c)) return true;
        if (c === '{') this.state = 'key';
        else return this.fail();
        return true;
      case 'key':
        if (isWs(c)) return true;
        if (c === '"') {
          this.state = 'keystr';
          this.keyBuf = '"';
          this.keyEsc = false;
        } else if (c === '}') this.end();
        else return this.fail();
        return true;
      case 'keystr':
        this.keyBuf += c;
        if (this.keyEsc) this.keyEsc = false;
        else if (c === '\\') this.keyEsc = true;
        else if (c === '"') {
          try {
            this.key = JSON.parse(this.keyBuf) as string;
          } catch {
            return this.fail();
          }
          this.state = 'colon';
        }
        return true;
      case 'colon':
        if (isWs(c)) return true;
        if (c !== ':') return this.fail();
        this.state = 'value';
        this.raw = '';
        this.started = false;
        this.depth = 0;
        this.inStr = false;
        this.esc = false;
        this.streaming = false;
        return true;
      case 'value':
        return this.value(c);
      case 'after':
        if (isWs(c)) return true;
        if (c === ',') this.state = 'key';
        else if (c === '}') this.end();
        else return this.fail();
        return true;
    }
  }

  private value(c: string): boolean {
    if (!this.started) {
      if (isWs(c)) return true;
      this.started = true;
      // a string holding the arguments' JSON text is unwrapped at the end, so it is held
      if (this.isArgsKey() && this.arguments === undefined && this.name !== undefined && c !== '"') {
        this.sendHeader();
        this.streaming = true;
      }
    }
    let complete = false;
    let consumed = true;
    if (this.inStr) {
      if (this.esc) this.esc = false;
      else if (c === '\\') this.esc = true;
      else if (c === '"') {
        this.inStr = false;
        if (this.depth === 0) complete = true;
      }
    } else if (c === '"') {
      this.inStr = true;
    } else if (c === '{' || c === '[') {
      this.depth++;
    } else if (c === '}' || c === ']') {
      if (this.depth === 0) {
        complete = true; // ends a bare value and the object
        consumed = false;
      } else if (--this.depth === 0) complete = true;
    } else if (this.depth === 0 && (c === ',' || isWs(c))) {
      complete = true;
      consumed = false;
    }
    if (consumed) {
      this.raw += c;
      if (this.streaming) this.ev.args(c);
    }
    if (complete) {
      this.valueEnd();
      if (!consumed) return this.feed(c); // the delimiter belongs to the object
    }
    return true;
  }

  private isArgsKey(): boolean {
    return ARGUMENT_KEYS.includes(this.key);
  }

  private valueEnd(): void {
    this.state = 'after';
    const raw = this.raw;
    if (this.key === NAME_KEY) {
      let name: unknown;
      try {
        name = JSON.parse(raw);
      } catch {
        name = undefined;
      }
      if (typeof name !== 'string' || this.name !== undefined) {
        this.fail();
        return;
      }
      this.name = name;
      if (this.arguments !== undefined) {
        this.sendHeader();
        this.ev.args(this.arguments);
      }
      return;
    }
    if (this.isArgsKey() && this.arguments === undefined) {
      let text = raw;
      if (!this.streaming && raw.startsWith('"')) {
        try {
          text = JSON.parse(raw) as string;
        } catch {
          // leave it as written
        }
      }
      this.arguments = text;
      if (!this.streaming && this.name !== undefined) {
        this.sendHeader();
        this.ev.args(text);
      }
    }
  }

  private sendHeader(): void {
    if (this.headerSent) return;
    this.headerSent = true;
    this.ev.header(this.name!);
  }

  private end(): void {
    if (this.name === undefined) {
      this.fail();
      return;
    }
    if (this.arguments === undefined) {
      this.arguments = '{}';
      this.sendHeader();
      this.ev.args('{}');
    }
    this.state = 'done';
  }

  private fail(): false {
    this.state = 'fail';
    return false;
  }
}
