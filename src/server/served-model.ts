// What the wire formats need to know about the model being served: its name, text helpers, the
// chat template, and the longest sequence a request can actually get (the context, further
// bounded by the KV cache the engine was given).

import type { Engine } from '../execution/engine.ts';
import type { LoadedModel } from '../execution/load-model.ts';
import type { ChatMessage, ChatTemplate, RenderOptions } from '../artifacts/chat-template.ts';
import type { SamplingParamsInput } from '../sampling/index.ts';
import { TokenTexts } from './token-text.ts';
import { GrammarCompiler, grammarVocabFrom } from '../sampling/grammar/index.ts';
import { detectToolCallFormat, templateRendersTools, toolCallFormat, type ToolCallFormatName } from '../generation/tool-calls/index.ts';
import { badRequest } from './errors.ts';

export class ServedModel {
  readonly created = Math.floor(Date.now() / 1000);
  /** valid token ids are [0, vocabSize) */
  readonly vocabSize: number;
  /** prompt + generated tokens one sequence can hold here */
  readonly contextLen: number;
  readonly eosIds: ReadonlySet<number>;
  readonly samplingDefaults: SamplingParamsInput;
  readonly chatTemplate?: ChatTemplate;
  readonly tokens: TokenTexts;
  /** the chat template knows <think>: split reasoning from content in chat responses */
  readonly thinks: boolean;
  /** how this model writes tool calls */
  readonly toolFormat: ToolCallFormatName;
  /** the chat template renders the `tools` variable (else tools are written into the messages) */
  readonly rendersTools: boolean;
  /** ids of control tokens the tool-call parser must see although decoding drops them */
  readonly toolTriggerTokens: ReadonlyMap<number, string>;
  private grammar?: Promise<GrammarCompiler>;

  constructor(
    readonly name: string,
    private readonly loaded: LoadedModel,
    engine: Engine,
    /** overrides the tool-call format detected from the template and vocabulary */
    toolFormat?: ToolCallFormatName,
  ) {
    // ids the model can score AND the tokenizer can decode (a padded embedding has more rows)
    this.vocabSize = Math.min(loaded.config.vocabSize, loaded.tokenizer.vocabSize);
    this.eosIds = new Set(loaded.eosIds);
    this.samplingDefaults = loaded.samplingDefaults;
    this.chatTemplate = loaded.chatTemplate;
    this.tokens = new TokenTexts(loaded.tokenizer);
    this.thinks = Object.values(loaded.chatTemplate?.sources ?? {}).some((s) => s.includes('<think>'));
    const templates = Object.values(loaded.chatTemplate?.sources ?? {});
    const hasToken = (t: string) => loaded.tokenizer.tokenToId(t) !== undefined;
    this.toolFormat = toolFormat ?? detectToolCallFormat(templates, hasToken);
    this.rendersTools = templates.some(templateRendersTools);
    const triggers = new Map<number, string>();
    for (const t of toolCallFormat(this.toolFormat).triggerStrings) {
      const id = loaded.tokenizer.tokenToId(t);
      if (id !== undefined) triggers.set(id, t);
    }
    this.toolTriggerTokens = triggers;
    // Full-attention KV groups hold every token of a sequence; sliding ones only their window.
    const bs = engine.kv.shape.blockSize;
    let kvTokens = Infinity;
    for (const g of engine.kv.groups) if (g.spec.window === 0) kvTokens = Math.min(kvTokens, g.pool.numBlocks * bs);
    this.contextLen = Math.min(engine.maxModelLen, kvTokens);
  }

  /**
   * The grammar compiler for this model's tokenizer, created on first use (the first structured
   * request pays ~0.4 s to load xgrammar here and in the compile worker, and index the vocabulary).
   */
  grammarCompiler(): Promise<GrammarCompiler> {
    this.grammar ??= (async () => {
      const vocab = grammarVocabFrom(this.loaded.tokenizer, this.loaded.config.vocabSize, this.loaded.eosIds);
      const compiler = new GrammarCompiler(vocab);
      await compiler.warm();
      return compiler;
    })();
    const p = this.grammar;
    p.catch(() => {
      if (this.grammar === p) this.grammar = undefined;
    });
    return p;
  }

  /** text -> ids with the tokenizer's special tokens (BOS), as a completions prompt */
  encode(text: string): number[] {
    this.refuseUnfittable(text, 'prompt');
    return this.loaded.encode(text);
  }

  /**
   * Refuses, before tokenizing it, a text too long for the context whatever its tokens: more
   * characters than contextLen tokens can cover (TextTokenizer.maxCharsPerToken). Tokenizing such a
   * text only to refuse it could stall the event loop for a long time (BPE on a long run of one
   * character grows faster than linearly).
   */
  private refuseUnfittable(text: string, param: string): void {
    const per = this.loaded.tokenizer.maxCharsPerToken;
    if (per === undefined || text.length <= this.contextLen * per) return;
    throw badRequest(
      `the prompt has ${text.length} characters: at least ${Math.ceil(text.length / per)} tokens (a token covers at most ${per} ` +
      `characters), but this model's context holds ${this.contextLen} tokens`, param, 'context_length_exceeded');
  }

  decode(ids: readonly number[]): string {
    return this.loaded.decode([...ids]);
  }

  /**
   * Renders a conversation with the model's template and encodes it. `continueFinal` leaves the
   * last message open (its text is continued instead of a new assistant turn: Anthropic prefill,
   * vLLM continue_final_message). Returns the ids and the rendered text.
   */
  renderChat(
    messages: ChatMessage[],
    opts: { continueFinal?: boolean; addGenerationPrompt?: boolean; variables?: Record<string, unknown>; tools?: unknown[] } = {},
  ): { ids: number[]; text: string } {
    const tpl = this.chatTemplate;
    if (!tpl) throw badRequest(`the model "${this.name}" has no chat template; use /v1/completions with a raw prompt`, 'messages', 'no_chat_template');
    const render: RenderOptions = { addGenerationPrompt: !opts.continueFinal && (opts.addGenerationPrompt ?? true), variables: opts.variables, tools: opts.tools };
    let text = tpl.render(messages, render);
    if (opts.continueFinal) {
      // vLLM's rule: cut the rendering right after the final message's text
      const last = messages[messages.length - 1];
      const content = typeof last.content === 'string' ? last.content : '';
      const at = content === '' ? -1 : text.lastIndexOf(content);
      if (at < 0) throw badRequest('cannot continue the final message: its text does not appear in the rendered chat template', 'messages');
      text = text.slice(0, at + content.length);
    }
    this.refuseUnfittable(text, 'messages');
    return { ids: this.loaded.tokenizer.encode(text, { addSpecialTokens: false }), text };
  }
}
