/**
 * Run-option validation (src/cli/options.ts) and config files (src/cli/config.ts): defaults, YAML and JSON files
 * with camelCase / kebab-case / snake_case keys, flags overriding the file, and one error per kind of mistake,
 * each naming the setting (as a flag or as a config key) and saying how to fix it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs, UsageError } from '../../src/cli/args.js';
import { configKeyToField, resolveRunOptions, runFlags, RUN_FIELDS, type FsProbe } from '../../src/cli/options.js';
import { loadConfigFile, parseConfigText } from '../../src/cli/config.js';
import { DEFAULT_RUN_OPTIONS } from '../../src/train/options.js';
import { usageError } from './fixtures.js';

/** A fake file system: these files exist; paths in `dirs` are folders. */
function fakeFs(files: string[], dirs: string[] = []): FsProbe {
  const all = new Set([...files, ...dirs]);
  return { exists: (p) => all.has(p), isDirectory: (p) => dirs.includes(p) };
}
const FS = fakeFs(['a.txt', 'b.jsonl', 'my-config.json', 'tok.json', 'teacher/config.json', 'init/config.json'], ['teacher', 'init', 'nocfg']);

function resolve(mode: 'train' | 'distill', argv: string[], config?: { file: string; values: Record<string, unknown> }, probe = FS) {
  const flags = parseArgs(argv, runFlags(mode), mode).values;
  return resolveRunOptions({ mode, flags, config, fs: probe });
}


test('defaults come from DEFAULT_RUN_OPTIONS; mode, out and data from the command', () => {
  const { options, warnings } = resolve('train', ['--out', 'runs/x', '--data', 'a.txt']);
  assert.deepEqual(options, { ...DEFAULT_RUN_OPTIONS, mode: 'train', out: 'runs/x', data: ['a.txt'] });
  assert.deepEqual(warnings, []);
});

test('every RunOptions field has a flag, in kebab-case', () => {
  const fields = RUN_FIELDS.map((f) => f.field).sort();
  const expected = [...Object.keys(DEFAULT_RUN_OPTIONS), 'out', 'data', 'tokenizer', 'init', 'teacher', 'teacherCache', 'chatTemplateKwargs', 'evalFewshot'].sort();
  assert.deepEqual(fields, expected);
  const names = runFlags('distill').map((f) => f.name);
  for (const n of ['grad-accum', 'lr', 'min-lr-ratio', 'eval-every', 'save-every', 'val-fraction', 'loss', 'alpha', 'temperature',
    'beta', 'save-dtype', 'loss-on', 'chat-template-kwargs', 'vocab-size', 'max-chars', 'device', 'threads', 'resume', 'quiet', 'stop-after', 'data', 'out', 'config', 'teacher']) {
    assert.ok(names.includes(n), `--${n} missing`);
  }
});

test('flags map 1:1 to fields with their types', () => {
  const { options } = resolve('distill', ['--out', 'o', '--data', 'a.txt', 'b.jsonl', '--teacher', 'teacher', '--grad-accum', '4', '--lr', '1e-4',
    '--min-lr-ratio', '0', '--loss', 'jsd', '--beta', '0.3', '--save-dtype', 'bf16', '--device', 'cuda', '--resume', '--quiet', '--stop-after', '5',
    '--tokenizer', 'tok.json', '--init', 'init', '--val-fraction', '0']);
  assert.equal(options.mode, 'distill');
  assert.deepEqual(options.data, ['a.txt', 'b.jsonl']);
  assert.equal(options.gradAccum, 4);
  assert.equal(options.lr, 1e-4);
  assert.equal(options.minLrRatio, 0);
  assert.equal(options.loss, 'jsd');
  assert.equal(options.beta, 0.3);
  assert.equal(options.saveDtype, 'bf16');
  assert.equal(options.device, 'cuda');
  assert.equal(options.resume, true);
  assert.equal(options.quiet, true);
  assert.equal(options.stopAfter, 5);
  assert.equal(options.teacher, 'teacher');
  assert.equal(options.tokenizer, 'tok.json');
  assert.equal(options.init, 'init');
  assert.equal(options.valFraction, 0);
});

test('config keys: camelCase, kebab-case and snake_case; flags override the file', () => {
  const config = { file: 'run.yaml', values: { gradAccum: 2, 'min-lr-ratio': 0.2, eval_every: 7, lr: 0.01, steps: 50, out: 'from-file', data: 'a.txt' } };
  const { options } = resolve('train', ['--lr', '0.002'], config);
  assert.equal(options.gradAccum, 2);
  assert.equal(options.minLrRatio, 0.2);
  assert.equal(options.evalEvery, 7);
  assert.equal(options.steps, 50);
  assert.equal(options.lr, 0.002, 'the flag wins over the file');
  assert.equal(options.out, 'from-file');
  assert.deepEqual(options.data, ['a.txt']);
  // --data on the command line replaces the file's list.
  assert.deepEqual(resolve('train', ['--data', 'b.jsonl'], config).options.data, ['b.jsonl']);
});

test('YAML and JSON config files parse to the same settings', () => {
  const yaml = parseConfigText('out: runs/y\ndata:\n  - a.txt\n  - b.jsonl\ngrad-accum: 2\nlr: 3e-4\nquiet: true\nloss: jsd\n', 'run.yaml');
  const json = parseConfigText('{"out": "runs/y", "data": ["a.txt", "b.jsonl"], "gradAccum": 2, "lr": 0.0003, "quiet": true, "loss": "jsd"}', 'run.json');
  const a = resolve('distill', ['--teacher', 'teacher'], { file: 'run.yaml', values: yaml }).options;
  const b = resolve('distill', ['--teacher', 'teacher'], { file: 'run.json', values: json }).options;
  assert.deepEqual(a, b);
  assert.equal(a.gradAccum, 2);
  assert.equal(a.lr, 3e-4);
  assert.equal(a.quiet, true);
});

test('config file errors name the file, the key, and the line', () => {
  usageError(() => parseConfigText('lr: [1,\n', 'bad.yaml'), /^bad\.yaml:\d+: not valid YAML/);
  usageError(() => parseConfigText('{"lr": }', 'bad.json'), /bad\.json: not valid JSON/);
  usageError(() => parseConfigText('- a\n- b\n', 'list.yaml'), /list\.yaml: the config must be a mapping/);
  usageError(() => parseConfigText('lr: 1', 'run.toml'), /unsupported file type '\.toml'/, /\.yaml, \.yml or \.json/);
  usageError(() => resolve('train', [], { file: 'r.yaml', values: { lr: 'fast', out: 'o', data: 'a.txt' } }), /^lr in r\.yaml expects a number, got 'fast'$/);
  usageError(() => resolve('train', [], { file: 'r.yaml', values: { learningRate: 1 } }), /unknown key 'learningRate' in r\.yaml/);
  usageError(() => resolve('train', [], { file: 'r.yaml', values: { gradAcum: 1 } }), /unknown key 'gradAcum'/, /did you mean 'gradAccum'\?/);
  usageError(() => resolve('train', [], { file: 'r.yaml', values: { 'grad-acum': 1 } }), /unknown key/, /did you mean 'grad-accum'\?/);
  usageError(() => resolve('train', [], { file: 'r.yaml', values: { mode: 'distill' } }), /unknown key 'mode'/, /distillery distill/);
  assert.equal(configKeyToField('save_dtype', 'x.yaml'), 'saveDtype');
  // A range error from the file names the key as written in the file.
  usageError(() => resolve('train', ['--out', 'o', '--data', 'a.txt'], { file: 'r.yaml', values: { alpha: 2 } }), /^alpha in r\.yaml must be between 0 and 1/);
});

test('loadConfigFile reads real files and reports a missing one', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-cfg-'));
  try {
    fs.writeFileSync(path.join(dir, 'r.yml'), 'steps: 12\nwarmup: 2\n');
    assert.deepEqual(loadConfigFile(path.join(dir, 'r.yml')), { steps: 12, warmup: 2 });
    assert.deepEqual(loadConfigFile(path.join(dir, 'r.yml')), parseConfigText('steps: 12\nwarmup: 2\n', 'r.yml'));
    fs.writeFileSync(path.join(dir, 'empty.yaml'), '');
    assert.deepEqual(loadConfigFile(path.join(dir, 'empty.yaml')), {});
    usageError(() => loadConfigFile(path.join(dir, 'missing.yaml')), /--config: file .*missing\.yaml does not exist/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('ranges: each error names the flag and the value', () => {
  const base = ['--out', 'o', '--data', 'a.txt'];
  const cases: Array<[string[], RegExp]> = [
    [['--lr', '0'], /^--lr must be > 0, got 0$/],
    [['--lr', '-1'], /^--lr must be > 0, got -1$/],
    [['--alpha', '1.5'], /^--alpha must be between 0 and 1 \(inclusive\), got 1\.5$/],
    [['--alpha', '-0.1'], /^--alpha must be between 0 and 1/],
    [['--temperature', '0'], /^--temperature must be > 0, got 0$/],
    [['--beta', '1'], /^--beta must be strictly between 0 and 1, got 1$/],
    [['--beta', '0'], /^--beta must be strictly between 0 and 1, got 0$/],
    [['--batch', '0'], /^--batch must be a positive integer, got 0$/],
    [['--seq', '-4'], /^--seq must be a positive integer, got -4$/],
    [['--steps', '0'], /^--steps must be a positive integer, got 0$/],
    [['--grad-accum', '0'], /^--grad-accum must be a positive integer/],
    [['--val-fraction', '1'], /^--val-fraction must be >= 0 and < 1, got 1$/],
    [['--val-fraction', '-0.1'], /^--val-fraction must be >= 0 and < 1/],
    [['--min-lr-ratio', '2'], /^--min-lr-ratio must be between 0 and 1/],
    [['--vocab-size', '100'], /^--vocab-size must be an integer from 256 \(the 256 byte tokens\) to 1048575, got 100$/],
    [['--vocab-size', '1048576'], /^--vocab-size must be an integer from 256 .* to 1048575, got 1048576$/],
    [['--threads', '-1'], /^--threads must be an integer from 0 to 1024 \(0 = all cores\), got -1$/],
    [['--threads', '1025'], /^--threads must be an integer from 0 to 1024/],
    [['--weight-decay', '-1'], /^--weight-decay must be >= 0/],
    [['--beta2', '1'], /^--beta2 must be >= 0 and < 1/],
    [['--clip', '-1'], /^--clip must be >= 0/],
  ];
  for (const [argv, re] of cases) {
    usageError(() => resolve('distill', [...base, '--teacher', 'teacher', ...argv]), re);
  }
});

test('warmup must be below steps, naming both settings; the default shrinks to a tenth of a short run', () => {
  usageError(() => resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '10', '--warmup', '20']), /^--warmup \(20\) must be less than --steps \(10\)$/, /lower --warmup/);
  // left unset: the default 20 is kept below it and shrinks to floor(steps / 10) at 20 steps or fewer
  assert.equal(resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '10']).options.warmup, 1);
  assert.equal(resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '20']).options.warmup, 2);
  assert.equal(resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '5']).options.warmup, 0);
  assert.equal(resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '21']).options.warmup, 20);
  usageError(() => resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '10'], { file: 'c.yaml', values: { warmup: 10 } }),
    /^warmup in c\.yaml \(10\) must be less than --steps \(10\)$/);
  assert.equal(resolve('train', ['--out', 'o', '--data', 'a.txt', '--steps', '10', '--warmup', '9']).options.warmup, 9);
});

test('required settings: --out, --data, and --teacher for distill', () => {
  usageError(() => resolve('train', ['--data', 'a.txt']), /train: no output folder given \(--out\)/, /--out <dir>/);
  usageError(() => resolve('train', ['--out', 'o']), /train: no training data given \(--data\)/, /builtin:docs/);
  usageError(() => resolve('distill', ['--out', 'o', '--data', 'a.txt']), /^distill needs a teacher \(--teacher\) or a teacher cache \(--teacher-cache\)$/,
    /--teacher <checkpoint folder>.*--teacher-cache <folder>/);
});

test('--teacher-cache: a cache folder instead of --teacher (not both); a folder without manifest.json is refused; train ignores it', () => {
  const probe = fakeFs(['a.txt', 'teacher/config.json', 'cache/manifest.json'], ['teacher', 'cache', 'empty']);
  const base = ['--out', 'o', '--data', 'a.txt'];
  assert.equal(resolve('distill', [...base, '--teacher-cache', 'cache'], undefined, probe).options.teacherCache, 'cache');
  usageError(() => resolve('distill', [...base, '--teacher-cache', 'cache', '--teacher', 'teacher'], undefined, probe),
    /--teacher and --teacher-cache: distill from one of them/, /drop --teacher/);
  usageError(() => resolve('distill', [...base, '--teacher-cache', 'empty'], undefined, probe), /--teacher-cache: empty has no manifest\.json/, /distillery teacher-cache/);
  usageError(() => resolve('distill', [...base, '--teacher-cache', 'gone'], undefined, probe), /--teacher-cache: gone is not a folder/);
  usageError(() => resolve('distill', [...base, '--teacher-cache', 'cache', '--on-policy', '0.5'], undefined, probe),
    /--on-policy needs a live teacher: it scores the student's own completions/, /--teacher <checkpoint folder> instead of --teacher-cache/);
  usageError(() => resolve('distill', [...base, '--teacher', 'teacher', '--on-policy', '1', '--seq', '2'], undefined, probe), /--on-policy needs windows of at least 3 tokens/);
  usageError(() => resolve('distill', [...base, '--teacher', 'teacher', '--on-policy', '1.5'], undefined, probe), /--on-policy must be between 0 and 1/);
  assert.equal(resolve('distill', [...base, '--teacher', 'teacher', '--on-policy', '0.5', '--gen-top-k', '50'], undefined, probe).options.genTopK, 50);
  const t = resolve('train', [...base, '--teacher-cache', 'cache'], undefined, probe);
  assert.equal(t.options.teacherCache, undefined);
  assert.match(t.warnings.join('\n'), /--teacher-cache has no effect with 'train'/);
});

test('paths: missing data files, teacher and init folders, tokenizer and model', () => {
  const base = ['--out', 'o'];
  usageError(() => resolve('train', [...base, '--data', 'a.txt', 'nope.txt']), /^--data: data file nope\.txt does not exist$/);
  usageError(() => resolve('train', [...base, '--data', 'builtin:docs', 'a.txt']), /'builtin:docs' cannot be combined/);
  assert.deepEqual(resolve('train', [...base, '--data', 'builtin:docs']).options.data, ['builtin:docs']);
  usageError(() => resolve('distill', [...base, '--data', 'a.txt', '--teacher', 'gone']), /^--teacher: checkpoint folder gone does not exist$/);
  usageError(() => resolve('distill', [...base, '--data', 'a.txt', '--teacher', 'a.txt']), /--teacher: a\.txt is a file, not a checkpoint folder/);
  usageError(() => resolve('distill', [...base, '--data', 'a.txt', '--teacher', 'nocfg']), /--teacher: nocfg has no config\.json/);
  usageError(() => resolve('train', [...base, '--data', 'a.txt', '--init', 'gone']), /^--init: checkpoint folder gone does not exist/);
  usageError(() => resolve('train', [...base, '--data', 'a.txt', '--tokenizer', 'gone.json']), /^--tokenizer: tokenizer file gone\.json does not exist/);
  usageError(() => resolve('train', [...base, '--data', 'a.txt', '--model', 'huge']), /^--model: 'huge' is neither a preset nor an existing config\.json/, /tiny, small/);
  usageError(() => resolve('train', [...base, '--data', 'a.txt', '--model', 'teacher']), /--model: teacher is a folder/, /--init teacher/);
  assert.equal(resolve('train', [...base, '--data', 'a.txt', '--model', 'my-config.json']).options.model, 'my-config.json');
  assert.equal(resolve('train', [...base, '--data', 'a.txt', '--model', 'small']).options.model, 'small');
  // a run inside a data folder would be read as data by the next run (or its own --resume); beside it is fine
  const withData = fakeFs(['corpus/a.txt'], ['corpus', 'corpus/sub']);
  for (const out of ['corpus/run', 'corpus', 'corpus/sub/r', './corpus/x/../run']) {
    usageError(() => resolve('train', ['--out', out, '--data', 'corpus'], undefined, withData), new RegExp(`^--out ${out.replace(/[.]/g, '\\.')} is inside the data folder corpus$`));
  }
  assert.equal(resolve('train', ['--out', 'corpus-runs/r', '--data', 'corpus'], undefined, withData).options.out, 'corpus-runs/r');
  assert.equal(resolve('train', ['--out', '..corpus/r', '--data', 'corpus'], undefined, withData).options.out, '..corpus/r');
});

test('train warns about distillation-only settings and drops the teacher', () => {
  const r = resolve('train', ['--out', 'o', '--data', 'a.txt', '--alpha', '0.9', '--teacher', 'teacher']);
  assert.equal(r.warnings.length, 1);
  assert.match(r.warnings[0]!, /--teacher, --alpha have no effect with 'train'/);
  assert.match(r.warnings[0]!, /distillery distill/);
  assert.equal(r.options.teacher, undefined);
  const fromFile = resolve('train', ['--out', 'o', '--data', 'a.txt'], { file: 'r.yaml', values: { temperature: 3 } });
  assert.match(fromFile.warnings[0]!, /^temperature in r\.yaml has no effect/);
});

test('distill warns when --beta is set but the loss is not jsd', () => {
  const r = resolve('distill', ['--out', 'o', '--data', 'a.txt', '--teacher', 'teacher', '--beta', '0.2']);
  assert.match(r.warnings.join('\n'), /--beta has no effect with --loss kl/);
  assert.deepEqual(resolve('distill', ['--out', 'o', '--data', 'a.txt', '--teacher', 'teacher', '--beta', '0.2', '--loss', 'jsd']).warnings, []);
});

test('--chat-template-kwargs must be a JSON object (exit 2 naming the flag); --loss-on takes assistant or all', () => {
  assert.equal(resolve('train', ['--out', 'runs/x', '--data', 'a.txt', '--chat-template-kwargs', '{"enable_thinking": false}']).options.chatTemplateKwargs, '{"enable_thinking": false}');
  assert.throws(() => resolve('train', ['--out', 'runs/x', '--data', 'a.txt', '--chat-template-kwargs', '{enable_thinking: false}']),
    (e: unknown) => e instanceof UsageError && /--chat-template-kwargs: not valid JSON/.test(e.message));
  assert.throws(() => resolve('train', ['--out', 'runs/x', '--data', 'a.txt', '--chat-template-kwargs', '[1]']),
    (e: unknown) => e instanceof UsageError && /must be a JSON object/.test(e.message));
  assert.equal(resolve('train', ['--out', 'runs/x', '--data', 'a.txt', '--loss-on', 'all']).options.lossOn, 'all');
  assert.equal(resolve('train', ['--out', 'runs/x', '--data', 'a.txt']).options.lossOn, 'assistant');
  assert.throws(() => resolve('train', ['--out', 'runs/x', '--data', 'a.txt', '--loss-on', 'user']), UsageError);
});

test('LoRA flags: --lora-rank needs --init; bad targets and an adapter folder as --init are refused; alpha/targets alone warn', () => {
  const base = ['--out', 'runs/x', '--data', 'a.txt'];
  const ok = resolve('train', [...base, '--init', 'init', '--lora-rank', '16', '--lora-targets', 'q_proj, v_proj']).options;
  assert.equal(ok.loraRank, 16); assert.equal(ok.loraTargets, 'q_proj, v_proj'); assert.equal(ok.loraAlpha, 0);
  usageError(() => resolve('train', [...base, '--lora-rank', '8']), /--lora-rank trains adapters on a pretrained model, but no --init names one/);
  usageError(() => resolve('train', [...base, '--init', 'init', '--lora-rank', '8', '--lora-targets', 'q_proj,lm_head']), /--lora-targets: unknown projection "lm_head"/);
  usageError(() => resolve('train', [...base, '--init', 'init', '--lora-rank', '-1']), /--lora-rank must be an integer >= 0/);
  assert.equal(resolve('distill', [...base, '--teacher', 'teacher', '--init', 'init', '--lora-rank', '8', '--on-policy', '0.5']).options.onPolicy, 0.5);
  const probe = fakeFs(['a.txt', 'ad/adapter_config.json'], ['ad']);
  usageError(() => resolve('train', [...base, '--init', 'ad', '--lora-rank', '8'], undefined, probe), /--init: ad is a LoRA adapter folder, not a model folder/);
  assert.deepEqual(resolve('train', [...base, '--lora-alpha', '32']).warnings, ['--lora-alpha has no effect without --lora-rank']);
});

test('--base-dtype nf4 needs --lora-rank; --teacher-dtype nf4 has nothing to quantize with --teacher-cache', () => {
  const base = ['--out', 'runs/x', '--data', 'a.txt'];
  usageError(() => resolve('train', [...base, '--init', 'init', '--base-dtype', 'nf4']), /--base-dtype nf4 stores a frozen LoRA base in 4 bits, but no --lora-rank/);
  assert.equal(resolve('train', [...base, '--init', 'init', '--lora-rank', '4', '--base-dtype', 'nf4']).options.baseDtype, 'nf4');
  assert.equal(resolve('distill', [...base, '--teacher', 'teacher', '--teacher-dtype', 'nf4']).options.teacherDtype, 'nf4');
  const probe = fakeFs(['a.txt', 'c/manifest.json'], ['c']);
  usageError(() => resolve('distill', [...base, '--teacher-cache', 'c', '--teacher-dtype', 'nf4'], undefined, probe), /--teacher-dtype nf4 has no effect with --teacher-cache/);
});
