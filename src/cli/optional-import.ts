/**
 * Importing a module that may be absent from this build (the CUDA kernel tools): the CLI must still run, and
 * say clearly what is not available, when such a module is missing.
 */
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Imports `url`: null when that module itself does not exist; any other failure (a syntax error, or a module it
 * imports being missing) propagates, so a broken build is not mistaken for an absent feature.
 */
export async function importOptional(url: URL): Promise<Record<string, unknown> | null> {
  try {
    return (await import(url.href)) as Record<string, unknown>;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    const missing = /Cannot find (?:module|package) '([^']+)'/.exec(err.message)?.[1];
    if (err.code === 'ERR_MODULE_NOT_FOUND' && missing !== undefined && path.resolve(missing) === fileURLToPath(url)) return null;
    throw e;
  }
}
