/**
 * User-facing errors. A DistilleryError carries what went wrong and, where there is one, how to fix it;
 * the CLI prints both without a stack trace. Anything else that escapes is a bug and prints its stack.
 */
export class DistilleryError extends Error {
  readonly hint: string | undefined;
  constructor(message: string, hint?: string) {
    super(message);
    this.name = 'DistilleryError';
    this.hint = hint;
  }
  /** The message as the CLI prints it. */
  describe(): string {
    return this.hint ? `${this.message}\n  hint: ${this.hint}` : this.message;
  }
}

/**
 * Bad input found while running (exit code 2, like a usage error): a data file that cannot be read, a broken
 * symbolic link in a data folder, an --out path that is a file. The CLI's UsageError is one too.
 */
export class InputError extends DistilleryError {
  readonly exitCode: number = 2;
  constructor(message: string, hint?: string) {
    super(message, hint);
    this.name = 'InputError';
  }
}

const FS_PROBLEMS: Readonly<Record<string, string>> = {
  ENOSPC: 'no space left on the device (disk full)',
  EDQUOT: 'disk quota exceeded',
  EFBIG: 'file too large for the file system',
  EROFS: 'the file system is read-only',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EIO: 'input/output error',
  ENOTDIR: 'a part of the path is a file, not a folder',
  EISDIR: 'it is a folder',
  ELOOP: 'a symbolic link loop',
  ENAMETOOLONG: 'the path is too long',
};

/**
 * A file system error (one with an errno `code` such as ENOSPC) as a one-sentence DistilleryError naming what was
 * being done; anything else is returned unchanged (a bug keeps its stack).
 */
export function fileError(e: unknown, doing: string, hint: string): unknown {
  if (e instanceof DistilleryError) return e;
  const code = (e as NodeJS.ErrnoException | null)?.code;
  if (typeof code !== 'string' || !/^E[A-Z]+$/.test(code)) return e;
  return new DistilleryError(`${doing}: ${FS_PROBLEMS[code] ?? (e as Error).message} (${code})`, hint);
}

/** Throws a DistilleryError when cond is false. */
export function check(cond: unknown, message: string, hint?: string): asserts cond {
  if (!cond) throw new DistilleryError(message, hint);
}
