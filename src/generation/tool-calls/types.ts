// Tool calling, independent of the wire format: the tools a request offers, the calls parsed
// back from the model's text, and the streaming deltas that rebuild them.

/** One callable function (OpenAI `tools[].function`, Anthropic `tools[]`). */
export interface ToolFunction {
  name: string;
  description?: string;
  /** JSON schema of the arguments object; absent = no parameters */
  parameters?: Record<string, unknown>;
}

/** A parsed call. `arguments` is the JSON text exactly as the model wrote it. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

/**
 * A piece of a call while streaming (OpenAI's `delta.tool_calls[]` shape without `type`): the first
 * delta of call `index` carries `id` and `name`, later ones only `arguments` text. Concatenating a
 * call's `arguments` pieces gives exactly `ToolCall.arguments`.
 */
export interface ToolCallDelta {
  index: number;
  id?: string;
  name?: string;
  arguments: string;
}

/** What one push to a parser yields: plain content (outside any call) and call deltas, in order. */
export interface ParsedPiece {
  content: string;
  calls: ToolCallDelta[];
}

/** `none`: never call; `auto`: the model decides; `required`: at least one; else that function. */
export type ToolChoice = 'none' | 'auto' | 'required' | { name: string };
