/**
 * `distillery export --onnx <dir>` (src/cli/commands/export.ts), run directly: it writes onnx/model.onnx into a
 * checkpoint folder written by writeCheckpoint, honours --external-data, and rejects bad usage with exit-2 errors.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { exportCommand } from '../../src/cli/commands/export.js';
import { UsageError } from '../../src/cli/args.js';
import { readFlatCheckpoint } from '../../src/model/checkpoint.js';
import { capture, tempDir, writeTinyCheckpoint } from '../cli/fixtures.js';

let dir = '';
let model = '';
before(() => {
  dir = tempDir();
  model = path.join(dir, 'model');
  writeTinyCheckpoint(model, 1);
});
after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

test('export --onnx writes onnx/model.onnx (inline or external weights) and leaves the checkpoint readable', async () => {
  const before = readFlatCheckpoint(model).weights;
  const io = capture();
  assert.equal(await exportCommand.run(['--onnx', model], io, {}), 0);
  assert.match(io.stdout(), /wrote .*model\.onnx \(/);
  assert.deepEqual(fs.readdirSync(path.join(model, 'onnx')), ['model.onnx']);
  assert.ok(fs.statSync(path.join(model, 'onnx', 'model.onnx')).size > before.byteLength);

  const io2 = capture();
  assert.equal(await exportCommand.run(['--onnx', '--external-data', 'yes', model], io2, {}), 0);
  assert.deepEqual(fs.readdirSync(path.join(model, 'onnx')).sort(), ['model.onnx', 'model.onnx_data']);
  assert.equal(fs.statSync(path.join(model, 'onnx', 'model.onnx_data')).size, before.byteLength);
  const hf = JSON.parse(fs.readFileSync(path.join(model, 'config.json'), 'utf8')) as Record<string, unknown>;
  assert.deepEqual(hf['transformers.js_config'], { use_external_data_format: true });

  // Back to inline: the data file goes and so does the flag.
  assert.equal(await exportCommand.run(['--onnx', '--external-data', 'no', model], capture(), {}), 0);
  assert.deepEqual(fs.readdirSync(path.join(model, 'onnx')), ['model.onnx']);
  const hf2 = JSON.parse(fs.readFileSync(path.join(model, 'config.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(hf2['transformers.js_config'], undefined);
  assert.deepEqual(readFlatCheckpoint(model).weights, before);
});

test('export: usage errors', async () => {
  await assert.rejects(exportCommand.run([model], capture(), {}), (e) => e instanceof UsageError && /choose a format/.test(e.message));
  await assert.rejects(exportCommand.run(['--onnx'], capture(), {}), (e) => e instanceof UsageError && /no model folder/.test(e.message));
  await assert.rejects(exportCommand.run(['--merge', '--out', 'x'], capture(), {}), (e) => e instanceof UsageError && /no adapter folder given/.test(e.message));
  await assert.rejects(exportCommand.run(['--merge', model, '--out', path.join(path.dirname(model), 'merged')], capture(), {}), (e) => e instanceof UsageError && /is not a LoRA adapter folder/.test(e.message));
  await assert.rejects(exportCommand.run(['--merge', model], capture(), {}), (e) => e instanceof UsageError && /no output folder given \(--out\)/.test(e.message));
  await assert.rejects(exportCommand.run(['--merge', model, '--out', 'x', '--external-data', 'yes'], capture(), {}), (e) => e instanceof UsageError && /--external-data belongs to --onnx/.test(e.message));
  await assert.rejects(exportCommand.run(['--onnx', '--merge', model], capture(), {}), (e) => e instanceof UsageError && /choose one of --onnx and --merge/.test(e.message));
  await assert.rejects(exportCommand.run(['--onnx', '--out', 'x', model], capture(), {}), (e) => e instanceof UsageError && /belong to --merge/.test(e.message));
  await assert.rejects(exportCommand.run(['--onnx', '--external-data', 'maybe', model], capture(), {}), UsageError);
  const io = capture();
  assert.equal(await exportCommand.run(['--help'], io, {}), 0);
  assert.match(io.stdout(), /usage: distillery export --onnx <model dir>/);
});
