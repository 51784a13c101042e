/** The default documentation corpus: real prose, deduplicated, capped, deterministic; clear error without TypeScript. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { extractDocComments, loadDocCorpus } from '../../src/data/doc-corpus.js';
import { DistilleryError } from '../../src/util/errors.js';

test('extractDocComments strips comment markers and keeps tags as text', () => {
  const src = `/**
   * Adds two numbers.
   * @param a first
   */
  function add(a, b) {}
  /** One line. */
  /* not a doc comment */`;
  assert.deepEqual(extractDocComments(src), ['Adds two numbers.\n@param a first', 'One line.']);
});

test('loadDocCorpus reads TypeScript lib docs, deduplicated and capped', () => {
  const c = loadDocCorpus({ maxChars: 200_000 });
  assert.ok(c.totalChars <= 200_000 && c.totalChars > 150_000, `${c.totalChars}`);
  assert.equal(c.totalChars, c.documents.reduce((s, d) => s + d.length, 0));
  assert.equal(new Set(c.documents).size, c.documents.length);
  assert.ok(c.files.some((f) => f.endsWith('lib.es5.d.ts')));
  assert.ok(c.documents.some((d) => /Returns/.test(d)));
  for (const d of c.documents) {
    assert.ok(!d.includes('*/') && !/^\*( |$)/m.test(d) && d.length >= 16, d);
  }
  assert.deepEqual(loadDocCorpus({ maxChars: 200_000 }).documents, c.documents, 'deterministic');
  const full = loadDocCorpus();
  assert.ok(full.totalChars > 500_000 && full.totalChars <= 2_000_000);
  assert.throws(() => loadDocCorpus({ libDir: '/nonexistent/typescript/lib' }), DistilleryError);
});
