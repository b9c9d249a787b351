// How the CLI fails: one clear line on stderr and a non-zero exit, never a stack trace for a
// user error. Internal errors still print their stack when LLMTS_DEBUG is set.

/** A problem with what the user asked for (bad flag, bad value): exit code 2. */
export class UsageError extends Error {}

export function exitWithError(err: unknown): never {
  const message = err instanceof Error ? err.message : String(err);
  process.stderr.write(`llmts: ${message.split('\n')[0]}\n`);
  if (process.env.LLMTS_DEBUG && err instanceof Error && err.stack) process.stderr.write(`${err.stack}\n`);
  process.exit(err instanceof UsageError ? 2 : 1);
}
