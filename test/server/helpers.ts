// Spawns `bin/llmts serve --port 0` on a tiny random model and parses its listening line.
// Backend: the native CPU backend (npm ci builds it); LLMTS_TEST_BACKEND=reference runs the same
// tests on the plain TypeScript reference backend (LLMTS_BACKEND=reference), no native build needed.

import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { writeTinyLlama, type TinyLlamaOptions } from '../helpers/tiny-model.ts';

const BIN = fileURLToPath(new URL('../../bin/llmts', import.meta.url));

// Servers this test process started: killed when it exits, however it exits, so a failing test
// never leaves a server behind.
const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});
function track(c: ChildProcess): ChildProcess {
  children.add(c);
  c.on('exit', () => children.delete(c));
  return c;
}

export interface Spawned {
  url: string;
  proc: ChildProcess;
  model: string;
  dir: string;
  /** everything the process wrote to stderr so far */
  stderr(): string;
  /** everything the process wrote to stdout so far */
  stdout(): string;
  /** resolves with the exit code (or signal name) */
  exited: Promise<number | string>;
  stop(): Promise<void>;
}

export function serverEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, ...extra };
  if (process.env.LLMTS_TEST_BACKEND === 'reference') env.LLMTS_BACKEND = 'reference';
  else delete env.LLMTS_BACKEND;
  return env;
}

/** Runs `llmts serve` to completion (for flag errors): exit code, stdout, stderr. */
export function runServeCli(args: string[], timeoutMs = 60_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(BIN, ['serve', ...args], { env: serverEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    track(proc);
    let stdout = '', stderr = '';
    proc.stdout.on('data', (d) => (stdout += d));
    proc.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`llmts serve ${args.join(' ')} did not exit; stderr: ${stderr}`));
    }, timeoutMs);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

export async function spawnServer(opts: { args?: string[]; model?: TinyLlamaOptions; dir?: string; env?: Record<string, string> } = {}): Promise<Spawned> {
  const dir = opts.dir ?? writeTinyLlama(opts.model ?? {});
  const model = 'tiny';
  const proc = spawn(BIN, ['serve', '--model', dir, '--port', '0', '--served-model-name', model, ...(opts.args ?? [])], {
    env: serverEnv(opts.env), stdio: ['ignore', 'pipe', 'pipe'],
  });
  track(proc);
  let out = '', err = '';
  proc.stderr!.on('data', (d) => (err += d));
  const exited = new Promise<number | string>((resolve) => proc.on('exit', (code, signal) => resolve(code ?? signal ?? -1)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start within 60 s; stderr: ${err}`)), 60_000);
    proc.stdout!.on('data', (d) => {
      out += d;
      const m = /^listening on (http:\/\/\S+)\n/m.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code}) before listening; stderr: ${err}`));
    });
  });
  return {
    url, proc, model, dir, exited,
    stderr: () => err,
    stdout: () => out,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(t);
      }
      if (!opts.dir) rmSync(dir, { recursive: true, force: true }); // the model this call wrote
    },
  };
}

/** POST JSON, returning status, parsed body (or text) and headers */
export async function postJson(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any; headers: Headers }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: any = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, body: parsed, headers: res.headers };
}

/** Reads a Prometheus text page into name{labels} -> value */
export async function scrape(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** Polls until `cond` holds (or throws after `ms`) */
export async function eventually<T>(what: string, fn: () => Promise<T>, cond: (v: T) => boolean, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  let v = await fn();
  while (!cond(v)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; last value ${JSON.stringify(v instanceof Map ? [...v] : v)}`);
    await new Promise((r) => setTimeout(r, 25));
    v = await fn();
  }
  return v;
}

/** Parses an SSE body into its `data:` payloads (and event names) */
export function parseSse(text: string): { event?: string; data: string }[] {
  const out: { event?: string; data: string }[] = [];
  for (const frame of text.split('\n\n')) {
    if (frame.trim() === '') continue;
    let event: string | undefined;
    const data: string[] = [];
    for (const line of frame.split('\n')) {
      if (line.startsWith('event: ')) event = line.slice(7);
      else if (line.startsWith('data: ')) data.push(line.slice(6));
    }
    out.push({ event, data: data.join('\n') });
  }
  return out;
}

/** distinct deterministic prompts of printable ASCII */
export function promptText(k: number, len = 12): string {
  let s = '';
  for (let i = 0; i < len; i++) s += String.fromCharCode(97 + ((k * 7 + i * 13 + ((k * i) % 5)) % 26));
  return s;
}
