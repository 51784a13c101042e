/**
 * NVRTC bindings (koffi) and the NVRTC kernel compiler: CUDA C source → CUBIN for one exact arch.
 * Works without a GPU or driver (compiling only needs libnvrtc). `compile()` runs nvrtcCompileProgram on a
 * koffi worker thread so several kernels compile in parallel; `compileSync()` is for a (non-strict) miss.
 */
import koffi from 'koffi';
import { CudaError } from './status.js';
import { fileBuildId, libraryFile, requireLibraries, type FinderEnv, systemFinderEnv } from './libfind.js';

/** What the kernel cache needs from a compiler (a fake implements it in tests). */
export interface KernelCompiler {
  /** Goes into every cache key, e.g. 'nvrtc-12.8'. */
  readonly version: string;
  /**
   * Goes into every cache key too: which build of that version, e.g. 'libnvrtc.so.11.8.89 54409816 sha256:…'
   * (see fileBuildId), so two 11.8.x builds never share cache entries.
   */
  readonly build: string;
  /** `label` names the kernel in errors (the kernel cache passes spec.describe(): family and baked parameters). */
  compile(source: string, name: string, options: readonly string[], label?: string): Promise<Uint8Array>;
  compileSync(source: string, name: string, options: readonly string[], label?: string): Uint8Array;
}

/** Lines of the NVRTC log an error message quotes. */
export const LOG_EXCERPT_LINES = 12;

/** The first `max` non-empty lines of a compile log, indented, with a count of the rest. */
export function logExcerpt(log: string, max = LOG_EXCERPT_LINES): string {
  const lines = log.split('\n').map((l) => l.trimEnd()).filter((l) => l.trim() !== '');
  if (lines.length === 0) return '  (empty NVRTC log)';
  const shown = lines.slice(0, max).map((l) => `  ${l}`);
  if (lines.length > max) shown.push(`  ... (${lines.length - max} more log lines)`);
  return shown.join('\n');
}

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

export class Nvrtc implements KernelCompiler {
  readonly version: string;
  readonly build: string;
  readonly path: string;
  /** The library file actually loaded (symlinks resolved), or null when it could not be determined. */
  readonly file: string | null;
  readonly major: number;
  readonly minor: number;
  private readonly f: Record<string, Fn>;

  constructor(fe: FinderEnv = systemFinderEnv) {
    const { nvrtc } = requireLibraries(['nvrtc'], fe);
    this.path = nvrtc.path;
    const l = nvrtc.lib;
    this.f = {
      version: l.func('int nvrtcVersion(_Out_ int *major, _Out_ int *minor)'),
      create: l.func('int nvrtcCreateProgram(_Out_ void **prog, const char *src, const char *name, int numHeaders, const char **headers, const char **includeNames)'),
      compile: l.func('int nvrtcCompileProgram(void *prog, int numOptions, const char **options)'),
      logSize: l.func('int nvrtcGetProgramLogSize(void *prog, _Out_ size_t *size)'),
      log: l.func('int nvrtcGetProgramLog(void *prog, _Out_ uint8_t *log)'),
      cubinSize: l.func('int nvrtcGetCUBINSize(void *prog, _Out_ size_t *size)'),
      cubin: l.func('int nvrtcGetCUBIN(void *prog, _Out_ uint8_t *cubin)'),
      destroy: l.func('int nvrtcDestroyProgram(_Inout_ void **prog)'),
      errorString: l.func('const char *nvrtcGetErrorString(int result)'),
    };
    const maj = [0], min = [0];
    this.check(this.f.version!(maj, min), 'nvrtcVersion', 'reading the NVRTC version');
    this.major = maj[0]!;
    this.minor = min[0]!;
    this.version = `nvrtc-${this.major}.${this.minor}`;
    this.file = libraryFile(this.path);
    let build = `unresolved ${this.path}`;
    if (this.file) { try { build = fileBuildId(this.file); } catch { /* keep the unresolved marker */ } }
    this.build = build;
  }

  private errorName(rc: number): string {
    try {
      const s: unknown = this.f.errorString!(rc);
      if (typeof s === 'string' && s) return s;
    } catch { /* fall through */ }
    return `NVRTC_ERROR_${rc}`;
  }

  private check(rc: number, call: string, context: string): void {
    if (rc === 0) return;
    throw new CudaError(rc, this.errorName(rc), call, context);
  }

  /** nvrtcDestroyProgram, checked: the error, or null when it succeeded. */
  private destroy(prog: unknown, name: string): CudaError | null {
    const rc = this.f.destroy!([prog]) as number;
    return rc === 0 ? null : new CudaError(rc, this.errorName(rc), 'nvrtcDestroyProgram', `releasing the program of ${name}`);
  }

  private create(source: string, name: string): unknown {
    const prog: unknown[] = [null];
    this.check(this.f.create!(prog, source, `${name}.cu`, 0, null, null), 'nvrtcCreateProgram', `creating ${name}`);
    return prog[0];
  }

  /**
   * Takes the CUBIN (or the compile error, naming the kernel's baked parameters and quoting the first lines of
   * the NVRTC log), then destroys the program. A failing nvrtcDestroyProgram is thrown by name, unless an
   * earlier error is already on its way (that one is the more useful report).
   */
  private finish(prog: unknown, rc: number, name: string, options: readonly string[], label: string): Uint8Array {
    let result: Uint8Array;
    try {
      if (rc !== 0) {
        const log = this.getLog(prog);
        this.check(rc, 'nvrtcCompileProgram', `compiling ${label} (${options.join(' ')}); NVRTC log:\n${logExcerpt(log)}`);
      }
      const size = [0];
      this.check(this.f.cubinSize!(prog, size), 'nvrtcGetCUBINSize', `compiling ${label}`);
      const out = Buffer.alloc(Number(size[0]));
      this.check(this.f.cubin!(prog, out), 'nvrtcGetCUBIN', `compiling ${label}`);
      result = new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
    } catch (e) {
      this.destroy(prog, label);
      throw e;
    }
    const err = this.destroy(prog, label);
    if (err) throw err;
    return result;
  }

  private getLog(prog: unknown): string {
    const size = [0];
    if (this.f.logSize!(prog, size) !== 0) return '(no log)';
    const buf = Buffer.alloc(Math.max(1, Number(size[0])));
    if (this.f.log!(prog, buf) !== 0) return '(no log)';
    return buf.toString('utf8').replace(/\0+$/, '');
  }

  compileSync(source: string, name: string, options: readonly string[], label = name): Uint8Array {
    const prog = this.create(source, name);
    const rc = this.f.compile!(prog, options.length, [...options]) as number;
    return this.finish(prog, rc, name, options, label);
  }

  compile(source: string, name: string, options: readonly string[], label = name): Promise<Uint8Array> {
    const prog = this.create(source, name);
    return new Promise((resolve, reject) => {
      this.f.compile!.async(prog, options.length, [...options], (err: unknown, rc: number) => {
        if (err) { this.destroy(prog, label); reject(err instanceof Error ? err : new Error(String(err))); return; }
        try { resolve(this.finish(prog, rc, name, options, label)); } catch (e) { reject(e instanceof Error ? e : new Error(String(e))); }
      });
    });
  }
}

let shared: Nvrtc | null | undefined;
/** The process-wide NVRTC, or null when libnvrtc is not installed. */
export function tryNvrtc(): Nvrtc | null {
  if (shared === undefined) {
    try { shared = new Nvrtc(); } catch { shared = null; }
  }
  return shared;
}
