/**
 * Model arguments (`--model`, `--teacher`, `--init`, `inspect <dir>`): a local folder, or a Hub id such as
 * `Qwen/Qwen2.5-0.5B[@revision]` found in the local Hugging Face cache (src/io/hf-cache.ts). A local path always
 * wins; an id that is not in the cache is a usage error (exit 2) saying where distillery looked.
 */
import * as fs from 'node:fs';
import { looksLikeHubId, resolveHubModel } from '../io/hf-cache.js';
import { UsageError } from './args.js';

/** The folder a model argument names: the path itself when it exists, else the cached snapshot of a Hub id. */
export function resolveModelArg(value: string, flag: string, env: NodeJS.ProcessEnv = process.env): string {
  if (fs.existsSync(value) || !looksLikeHubId(value)) return value;
  const r = resolveHubModel(value, env);
  if (r.ok) return r.dir;
  throw new UsageError(`${flag}: ${r.message}`, r.hint);
}
