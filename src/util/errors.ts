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

/** Throws a DistilleryError when cond is false. */
export function check(cond: unknown, message: string, hint?: string): asserts cond {
  if (!cond) throw new DistilleryError(message, hint);
}
