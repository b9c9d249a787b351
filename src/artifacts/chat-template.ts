// Chat templates, rendered with @huggingface/jinja the way transformers 5's apply_chat_template
// does: trim_blocks + lstrip_blocks (the library's defaults), variables messages,
// add_generation_prompt, tools, documents and the tokenizer's named special tokens (bos_token,
// eos_token, ...), helpers raise_exception and strftime_now; then the text is encoded WITHOUT
// adding special tokens again (the template already wrote bos where the model wants it).
//
// Where the template comes from (transformers 5 precedence): chat_template.jinja and
// additional_chat_templates/*.jinja, else tokenizer_config.json "chat_template" (a string, or a
// list of {name, template}), else the legacy processor file chat_template.json.

import fs from 'node:fs';
import path from 'node:path';
import { Interpreter, Template } from '@huggingface/jinja';
import { ArtifactError } from './errors.ts';
import { readJsonFile } from './json-file.ts';
import { ChatTemplateRaise, templateEnvironment } from './template-globals.ts';
import type { TextTokenizer } from './tokenizer.ts';

export const CHAT_TEMPLATE_FILE = 'chat_template.jinja';
export const CHAT_TEMPLATE_DIR = 'additional_chat_templates';
export const LEGACY_CHAT_TEMPLATE_FILE = 'chat_template.json';

export interface ChatMessage {
  role: string;
  content: unknown;
  [key: string]: unknown;
}

export interface RenderOptions {
  /** append the assistant header so the model writes the reply; default false, as in transformers */
  addGenerationPrompt?: boolean;
  /** JSON-schema tool descriptions; selects the "tool_use" template when the model has one */
  tools?: unknown[];
  documents?: unknown[];
  /** a named template from the model's set; default "default" (or "tool_use" with tools) */
  templateName?: string;
  /** extra template variables (they override the special tokens, as transformers' kwargs do) */
  variables?: Record<string, unknown>;
  /** the clock strftime_now reads (tests) */
  now?: () => Date;
}

/** A template refused the conversation (raise_exception) or failed while rendering: bad input. */
export class ChatTemplateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ChatTemplateError';
  }
}

export class ChatTemplate {
  /** template sources by name; a single template is "default" */
  readonly sources: Readonly<Record<string, string>>;
  /** the file the templates came from, for messages */
  readonly origin: string;
  private readonly compiled = new Map<string, Template>();
  private readonly tokenizer: TextTokenizer;

  constructor(templates: string | Record<string, string>, tokenizer: TextTokenizer, origin = 'chat template') {
    this.sources = typeof templates === 'string' ? { default: templates } : { ...templates };
    this.origin = origin;
    this.tokenizer = tokenizer;
    // compile everything now: a broken template is an artifact problem, found at load time
    for (const [name, src] of Object.entries(this.sources)) {
      try {
        this.compiled.set(name, new Template(src));
      } catch (e) {
        throw new ArtifactError(`chat template "${name}" in ${origin} does not parse: ${(e as Error).message}`, origin);
      }
    }
  }

  /** The model's template(s), or undefined when it has none. */
  static fromDir(dir: string, tokenizer: TextTokenizer): ChatTemplate | undefined {
    const found = findTemplates(dir, tokenizer.config);
    return found && new ChatTemplate(found.templates, tokenizer, found.origin);
  }

  render(messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
    const name = this.pickName(opts);
    const template = this.compiled.get(name)!;
    const vars: Record<string, unknown> = {
      ...this.tokenizer.specialTokens,
      messages: messages.map((m) => ({ ...m })),
      add_generation_prompt: opts.addGenerationPrompt ?? false,
      tools: opts.tools ?? null,
      documents: opts.documents ?? null,
      ...opts.variables,
    };
    try {
      // Template.render would redeclare the globals; run the parsed template in our own scope
      const env = templateEnvironment(opts.now);
      for (const [k, v] of Object.entries(vars)) {
        if (env.variables.has(k)) env.variables.delete(k); // a caller's variable shadows a helper
        env.set(k, v);
      }
      return (new Interpreter(env).run(template.parsed) as { value: string }).value;
    } catch (e) {
      if (e instanceof ChatTemplateRaise) throw new ChatTemplateError(e.message);
      throw new ChatTemplateError(`chat template "${name}" from ${this.origin} failed: ${(e as Error).message}`);
    }
  }

  /** render, then encode without adding special tokens (transformers' apply_chat_template) */
  encode(messages: readonly ChatMessage[], opts: RenderOptions = {}): number[] {
    return this.tokenizer.encode(this.render(messages, opts), { addSpecialTokens: false });
  }

  private pickName(opts: RenderOptions): string {
    if (opts.templateName !== undefined) {
      if (!this.compiled.has(opts.templateName)) {
        throw new ChatTemplateError(`no chat template named "${opts.templateName}" (have: ${Object.keys(this.sources).join(', ')})`);
      }
      return opts.templateName;
    }
    if (opts.tools !== undefined && this.compiled.has('tool_use')) return 'tool_use';
    if (this.compiled.has('default')) return 'default';
    throw new ChatTemplateError(
      `${this.origin} has several chat templates and none is named "default" (have: ${Object.keys(this.sources).join(', ')})`,
    );
  }
}

function findTemplates(
  dir: string, tokenizerConfig: Readonly<Record<string, unknown>>,
): { templates: string | Record<string, string>; origin: string } | undefined {
  const files: Record<string, string> = {};
  const main = path.join(dir, CHAT_TEMPLATE_FILE);
  if (fs.existsSync(main)) files.default = fs.readFileSync(main, 'utf8');
  const extraDir = path.join(dir, CHAT_TEMPLATE_DIR);
  if (fs.existsSync(extraDir) && fs.statSync(extraDir).isDirectory()) {
    for (const f of fs.readdirSync(extraDir).filter((n) => n.endsWith('.jinja')).sort()) {
      files[f.slice(0, -'.jinja'.length)] = fs.readFileSync(path.join(extraDir, f), 'utf8');
    }
  }
  if (Object.keys(files).length > 0) return { templates: files, origin: fs.existsSync(main) ? main : extraDir };

  const configFile = path.join(dir, 'tokenizer_config.json');
  const fromConfig = templatesFromValue(tokenizerConfig.chat_template, configFile);
  if (fromConfig) return { templates: fromConfig, origin: configFile };

  const legacy = path.join(dir, LEGACY_CHAT_TEMPLATE_FILE);
  if (fs.existsSync(legacy)) {
    const fromLegacy = templatesFromValue(readJsonFile(legacy, 'chat template')?.chat_template, legacy);
    if (fromLegacy) return { templates: fromLegacy, origin: legacy };
  }
  return undefined;
}

/** "chat_template" as stored in JSON: a string or a list of {name, template} */
function templatesFromValue(v: unknown, file: string): string | Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) {
    const out: Record<string, string> = {};
    for (const t of v) {
      if (!t || typeof t.name !== 'string' || typeof t.template !== 'string') {
        throw new ArtifactError(`${file}: chat_template list entries must be {name, template}`, file);
      }
      out[t.name] = t.template;
    }
    return out;
  }
  throw new ArtifactError(`${file}: chat_template must be a string or a list of {name, template}`, file);
}
