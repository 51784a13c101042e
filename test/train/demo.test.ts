/**
 * The embedded default end to end, in its quick form: teacher, distilled and scratch students are trained on the
 * builtin doc-comment corpus; the table has the three labelled lines and every model's validation loss fell.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { DEMO_MARKER, runDemo } from '../../src/demo.js';
import { InputError } from '../../src/util/errors.js';

test('demo (quick): three runs, a labelled table, losses fall, files written', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-demo-'));
  const r = await runDemo({ out, quick: true, log: () => {} });
  const lines = r.table.split('\n');
  for (const label of ['teacher', 'distilled', 'scratch']) {
    assert.ok(lines.some((l) => l.startsWith(label + ' ')), `no line labelled ${label}`);
  }
  for (const s of [r.teacher, r.distilled, r.scratch]) {
    assert.equal(s.status, 'completed');
    assert.ok(s.finalValCe < s.initialValCe, `${s.out}: validation CE ${s.initialValCe} → ${s.finalValCe}`);
  }
  // The students share the architecture, data, steps and initial weights; only the teacher differs.
  assert.equal(r.distilled.parameters, r.scratch.parameters);
  assert.equal(r.distilled.initialValCe, r.scratch.initialValCe);
  assert.ok(fs.existsSync(path.join(out, 'demo.txt')));
  assert.ok(fs.existsSync(path.join(out, 'distilled', 'final', 'model.safetensors')));
  assert.ok(fs.existsSync(path.join(out, DEMO_MARKER)), 'the folder is marked as the demo\'s: the next demo may replace its runs');
});

test('demo --out refuses a folder whose teacher/ holds a run it did not make (it replaced it), and marks its own folder', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-demo-'));
  fs.mkdirSync(path.join(out, 'teacher'));
  fs.writeFileSync(path.join(out, 'teacher', 'metrics.jsonl'), '{"step":1,"loss":2}\n');
  await assert.rejects(runDemo({ out, quick: true, log: () => {} }),
    (e: unknown) => e instanceof InputError && /teacher\/ is not the demo's/.test(e.message));
  assert.equal(fs.readFileSync(path.join(out, 'teacher', 'metrics.jsonl'), 'utf8'), '{"step":1,"loss":2}\n', 'the user\'s run is untouched');
  assert.ok(!fs.existsSync(path.join(out, DEMO_MARKER)));
});

test('demo --out: a demo.txt that is not a demo\'s report does not make the folder the demo\'s (its runs and the file would be replaced)', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-demo-'));
  fs.writeFileSync(path.join(out, 'demo.txt'), 'my notes\n');
  await assert.rejects(runDemo({ out, quick: true, log: () => {} }), (e: unknown) => e instanceof InputError && /demo\.txt is not the demo's/.test(e.message));
  assert.equal(fs.readFileSync(path.join(out, 'demo.txt'), 'utf8'), 'my notes\n');
  fs.mkdirSync(path.join(out, 'teacher'));
  fs.writeFileSync(path.join(out, 'teacher', 'metrics.jsonl'), '{"step":1,"loss":2}\n');
  await assert.rejects(runDemo({ out, quick: true, log: () => {} }), (e: unknown) => e instanceof InputError && /teacher\/, demo\.txt are not the demo's/.test(e.message));
  assert.ok(!fs.existsSync(path.join(out, DEMO_MARKER)));
});
