// Tool calling: family formats (what calls look like, the grammar that forces them, prompt text
// for templates without tools) and the streaming parsers that read calls back out of the output.
export * from './types.ts';
export * from './call-scanner.ts';
export * from './parsers.ts';
export * from './formats.ts';
