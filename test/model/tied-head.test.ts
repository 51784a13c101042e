/**
 * A tied model's `lm_head.weight` read as transformers 5 reads it (PreTrainedModel.tie_weights during from_pretrained):
 * alone, it is the embedding matrix; beside an equal embedding it changes nothing; beside a different one the config
 * and the file disagree (transformers 5 would run them untied, transformers 4 tied): refused by name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { presetConfig } from '../../src/model/config.js';
import { initialWeights, packWeights, parameterLayout, unpackWeights } from '../../src/model/params.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';

const cfg = presetConfig('tiny', 300);
const layout = parameterLayout(cfg);
const flat = initialWeights(layout, cfg, new Rng(11));
const named = unpackWeights(layout, flat);
const EMBED = 'model.embed_tokens.weight';

test('the tiny preset ties its embeddings (the premise of these tests)', () => {
  assert.equal(cfg.tieWordEmbeddings, true);
  assert.equal(layout.lmHead, null);
  assert.equal(layout.embed.name, EMBED);
});

test('a tied checkpoint holding only lm_head.weight: it is the embedding (and the head)', () => {
  const head = named.get(EMBED)!;
  const only = new Map([...named].filter(([k]) => k !== EMBED));
  only.set('lm_head.weight', { shape: head.shape, data: head.data });
  assert.deepEqual(packWeights(layout, only, 'ckpt'), flat);
  // lazily read tensors too (as large safetensors files are)
  const lazy = new Map([...only].map(([k, v]) => [k, { shape: v.shape, read: () => v.data }]));
  assert.deepEqual(packWeights(layout, lazy, 'ckpt'), flat);
});

test('a tied checkpoint with an lm_head.weight equal to the embedding: the same weights as without it', () => {
  const both = new Map(named);
  both.set('lm_head.weight', { shape: named.get(EMBED)!.shape, data: Float32Array.from(named.get(EMBED)!.data) });
  assert.deepEqual(packWeights(layout, both, 'ckpt'), flat);
  // lazily read: the embedding is read once, for the comparison and the weights alike
  let reads = 0;
  const lazy = new Map([...both].map(([k, v]) => [k, { shape: v.shape, read: () => { if (k === EMBED) reads++; return v.data; } }]));
  assert.deepEqual(packWeights(layout, lazy, 'ckpt'), flat);
  assert.equal(reads, 1);
});

test('a tied checkpoint with an lm_head.weight that differs from the embedding is refused by name', () => {
  const head = Float32Array.from(named.get(EMBED)!.data);
  head[head.length - 1]! += 1;
  const both = new Map(named);
  both.set('lm_head.weight', { shape: named.get(EMBED)!.shape, data: head });
  assert.throws(() => packWeights(layout, both, 'ckpt/model.safetensors'), (e: unknown) => e instanceof DistilleryError
    && e.message === 'ckpt/model.safetensors: config.json ties the embeddings (tie_word_embeddings) but "lm_head.weight" differs from "model.embed_tokens.weight"'
    && /"tie_word_embeddings": false/.test(e.hint ?? ''));
});

test('an untied layout still requires its own lm_head.weight', () => {
  const c = { ...cfg, tieWordEmbeddings: false };
  const l = parameterLayout(c);
  const w = initialWeights(l, c, new Rng(3));
  const n = unpackWeights(l, w);
  assert.deepEqual(packWeights(l, n, 'ckpt'), w);
  n.delete('lm_head.weight');
  assert.throws(() => packWeights(l, n, 'ckpt'), /missing tensor "lm_head.weight"/);
});
