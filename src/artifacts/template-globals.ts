// The global scope chat templates render in. @huggingface/jinja's Template.render declares its
// own raise_exception (a plain Error, indistinguishable from a template bug), and refuses to
// redeclare it, so templates are run through Interpreter with this scope instead. It holds what
// the library's setupGlobals holds, plus transformers' helpers with transformers' behaviour:
// raise_exception throws ChatTemplateRaise; strftime_now formats like Python in the C locale.

import { Environment } from '@huggingface/jinja';

/** thrown by a template's raise_exception(message): the conversation is refused */
export class ChatTemplateRaise extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ChatTemplateRaise';
  }
}

export function templateEnvironment(now: () => Date = () => new Date()): Environment {
  const env = new Environment();
  for (const [k, v] of [['false', false], ['true', true], ['none', null], ['False', false], ['True', true], ['None', null]] as const) {
    env.set(k, v);
  }
  env.set('range', range);
  env.set('raise_exception', (message: unknown) => {
    throw new ChatTemplateRaise(String(message));
  });
  env.set('strftime_now', (format: string) => strftime(now(), String(format)));
  return env;
}

/** python range(stop) / range(start, stop[, step]) */
function range(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error('range() step must not be zero');
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

const MONTHS = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October', 'November', 'December'];
const DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];

/** Python's datetime.strftime for the common directives, C locale (English names), local time */
export function strftime(d: Date, format: string): string {
  const pad = (n: number, w = 2) => String(n).padStart(w, '0');
  return format.replace(/%([a-zA-Z%])/g, (all, c: string) => {
    switch (c) {
      case 'Y': return String(d.getFullYear());
      case 'y': return pad(d.getFullYear() % 100);
      case 'm': return pad(d.getMonth() + 1);
      case 'd': return pad(d.getDate());
      case 'e': return String(d.getDate()).padStart(2, ' ');
      case 'B': return MONTHS[d.getMonth()];
      case 'b': case 'h': return MONTHS[d.getMonth()].slice(0, 3);
      case 'A': return DAYS[d.getDay()];
      case 'a': return DAYS[d.getDay()].slice(0, 3);
      case 'H': return pad(d.getHours());
      case 'I': return pad(d.getHours() % 12 || 12);
      case 'p': return d.getHours() < 12 ? 'AM' : 'PM';
      case 'M': return pad(d.getMinutes());
      case 'S': return pad(d.getSeconds());
      case 'j': {
        const day = Date.UTC(d.getFullYear(), d.getMonth(), d.getDate()) - Date.UTC(d.getFullYear(), 0, 1);
        return pad(day / 86_400_000 + 1, 3);
      }
      case '%': return '%';
      default: return all;
    }
  });
}
