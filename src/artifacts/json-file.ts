// Reading the small JSON files of a model directory with errors that name the file.

import fs from 'node:fs';
import { ArtifactError } from './errors.ts';

/** Parses a JSON file that must exist; `what` describes it in messages ("model config"). */
export function readJsonFile(file: string, what: string): any {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'is missing' : `cannot be read (${code ?? (e as Error).message})`;
    throw new ArtifactError(`${what} ${file} ${why}`, file);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ArtifactError(`${what} ${file} is not valid JSON: ${(e as Error).message}`, file);
  }
}

/** Like readJsonFile, but a missing file is `undefined` (optional files). Corrupt files still throw. */
export function readOptionalJsonFile(file: string, what: string): any {
  if (!fs.existsSync(file)) return undefined;
  return readJsonFile(file, what);
}

/** A JSON object (not array / null / scalar), or an error naming the file. */
export function expectObject(value: unknown, what: string, file: string): Record<string, any> {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ArtifactError(`${what} ${file} must hold a JSON object`, file);
  }
  return value as Record<string, any>;
}
