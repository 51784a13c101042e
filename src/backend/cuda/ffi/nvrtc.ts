/**
 * NVRTC bindings (koffi) and the NVRTC kernel compiler: CUDA C source → CUBIN for one exact arch.
 * Works without a GPU or driver (compiling only needs libnvrtc). `compile()` runs nvrtcCompileProgram on a
 * koffi worker thread so several kernels compile in parallel; `compileSync()` is for a (non-strict) miss.
 */
import koffi from 'koffi';
import { CudaError } from './status.js';
import { requireLibraries, type FinderEnv, systemFinderEnv } from './libfind.js';

/** What the kernel cache needs from a compiler (a fake implements it in tests). */
export interface KernelCompiler {
  /** Goes into every cache key, e.g. 'nvrtc-12.8'. */
  readonly version: string;
  compile(source: string, name: string, options: readonly string[]): Promise<Uint8Array>;
  compileSync(source: string, name: string, options: readonly string[]): Uint8Array;
}

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

export class Nvrtc implements KernelCompiler {
  readonly version: string;
  readonly path: string;
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
  }

  private check(rc: number, call: string, context: string, extra = ''): void {
    if (rc === 0) return;
    const name = String(this.f.errorString!(rc) ?? `NVRTC_ERROR_${rc}`);
    throw new CudaError(rc, name + extra, call, context);
  }

  private create(source: string, name: string): unknown {
    const prog: unknown[] = [null];
    this.check(this.f.create!(prog, source, `${name}.cu`, 0, null, null), 'nvrtcCreateProgram', `creating ${name}`);
    return prog[0];
  }

  private finish(prog: unknown, rc: number, name: string, options: readonly string[]): Uint8Array {
    try {
      if (rc !== 0) {
        const log = this.getLog(prog);
        this.check(rc, 'nvrtcCompileProgram', `compiling ${name} (${options.join(' ')})`, `:\n${log}`);
      }
      const size = [0];
      this.check(this.f.cubinSize!(prog, size), 'nvrtcGetCUBINSize', `compiling ${name}`);
      const out = Buffer.alloc(Number(size[0]));
      this.check(this.f.cubin!(prog, out), 'nvrtcGetCUBIN', `compiling ${name}`);
      return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
    } finally {
      this.f.destroy!([prog]);
    }
  }

  private getLog(prog: unknown): string {
    const size = [0];
    if (this.f.logSize!(prog, size) !== 0) return '(no log)';
    const buf = Buffer.alloc(Math.max(1, Number(size[0])));
    if (this.f.log!(prog, buf) !== 0) return '(no log)';
    return buf.toString('utf8').replace(/\0+$/, '');
  }

  compileSync(source: string, name: string, options: readonly string[]): Uint8Array {
    const prog = this.create(source, name);
    const rc = this.f.compile!(prog, options.length, [...options]) as number;
    return this.finish(prog, rc, name, options);
  }

  compile(source: string, name: string, options: readonly string[]): Promise<Uint8Array> {
    const prog = this.create(source, name);
    return new Promise((resolve, reject) => {
      this.f.compile!.async(prog, options.length, [...options], (err: unknown, rc: number) => {
        if (err) { this.f.destroy!([prog]); reject(err instanceof Error ? err : new Error(String(err))); return; }
        try { resolve(this.finish(prog, rc, name, options)); } catch (e) { reject(e instanceof Error ? e : new Error(String(e))); }
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
