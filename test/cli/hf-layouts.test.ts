/**
 * The same checkpoint with its config.json written in the transformers 4 layout and in the transformers 5 layout
 * (committed fixtures: llama3 rope scaling, yarn rope scaling, plain RoPE) gives the same `eval` loss, and every
 * command prints the baked parameters it resolved. The old reader took the 5.x layout's theta for 10000: reading a
 * config without its rope block gives a different loss (the test has teeth).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { main } from '../../src/cli/main.js';
import { parseHfConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import { Rng } from '../../src/util/rng.js';
import { capture, tempDir, tinyTokenizer, TEXT } from './fixtures.js';

let dir = '', dataFile = '';
before(() => {
  dir = tempDir();
  dataFile = path.join(dir, 'data.txt');
  fs.writeFileSync(dataFile, TEXT.join('\n\n'));
});
after(() => { fs.rmSync(dir, { recursive: true, force: true }); });

const fixture = (name: string): Record<string, unknown> =>
  JSON.parse(fs.readFileSync(new URL(`../../../test/fixtures/hf-configs/${name}.json`, import.meta.url), 'utf8')) as Record<string, unknown>;

async function run(argv: string[]) {
  const io = capture();
  const code = await main(argv, io, {});
  return { code, out: io.stdout(), err: io.stderr() };
}

async function evalLoss(model: string): Promise<{ loss: number; err: string }> {
  const r = await run(['eval', '--model', model, '--data', dataFile, '--seq', '24', '--json']);
  assert.equal(r.code, 0, r.err);
  return { loss: (JSON.parse(r.out) as { loss: number }).loss, err: r.err };
}

for (const [name, baked] of [
  ['tiny-llama3', /^model: llama theta 500000 rope llama3 factor 32 low_freq_factor 1 high_freq_factor 4 original_max_position_embeddings 16 eps 1e-5 head_dim 8 qkv_bias no tied yes$/m],
  ['tiny-qwen2-yarn', /^model: qwen2 theta 1000000 rope yarn factor 4 original_max_position_embeddings 16 beta_fast 32 beta_slow 1 attention_factor 1\.13863 eps 1e-6 head_dim 8 qkv_bias yes tied no$/m],
  ['tiny-qwen2', /^model: qwen2 theta 1000000 rope default eps 1e-6 head_dim 8 qkv_bias yes tied yes$/m],
] as const) {
  test(`${name}: config.json in the transformers 4 and 5 layouts gives the same eval loss`, async () => {
    const tok = tinyTokenizer();
    const v4: Record<string, unknown> = { ...fixture(`${name}.v4`), vocab_size: tok.vocabSize };
    const v5: Record<string, unknown> = { ...fixture(`${name}.v5`), vocab_size: tok.vocabSize };
    const cfg = parseHfConfig(v4);
    const model = path.join(dir, name);
    writeCheckpoint(model, cfg, initialWeights(parameterLayout(cfg), cfg, new Rng(3), 0.5), { dtype: 'f32', tokenizerJson: tok.toJSON() });
    const cfgPath = path.join(model, 'config.json');
    fs.writeFileSync(cfgPath, JSON.stringify(v4));
    const a = await evalLoss(model);
    assert.match(a.err, baked);
    fs.writeFileSync(cfgPath, JSON.stringify(v5));
    const b = await evalLoss(model);
    assert.equal(b.loss, a.loss, 'same model, same loss');
    assert.match(b.err, baked);
    // Without its rope block (what the old reader saw in a 5.x config): another function, another loss.
    const { rope_parameters: _, ...bare } = v5;
    fs.writeFileSync(cfgPath, JSON.stringify(bare));
    const c = await evalLoss(model);
    assert.ok(Math.abs(c.loss - a.loss) > 1e-4, `theta/scaling must matter: ${c.loss} vs ${a.loss}`);
    // inspect prints the same baked line.
    fs.writeFileSync(cfgPath, JSON.stringify(v5));
    const ins = await run(['inspect', model]);
    assert.equal(ins.code, 0, ins.err);
    assert.match(ins.out, new RegExp(`^baked +${baked.source.slice('^model: '.length)}`, 'm'));
  });
}

test('a string boolean in config.json is refused by eval: exit 1, the field named, no stack', async () => {
  const tok = tinyTokenizer();
  const v4 = { ...fixture('tiny-qwen2.v4'), vocab_size: tok.vocabSize, tie_word_embeddings: false };
  const cfg = parseHfConfig(v4);
  const model = path.join(dir, 'string-bool');
  writeCheckpoint(model, cfg, initialWeights(parameterLayout(cfg), cfg, new Rng(4), 0.5), { dtype: 'f32', tokenizerJson: tok.toJSON() });
  fs.writeFileSync(path.join(model, 'config.json'), JSON.stringify({ ...v4, tie_word_embeddings: 'false' }));
  const r = await run(['eval', '--model', model, '--data', dataFile, '--seq', '24']);
  assert.equal(r.code, 1);
  assert.match(r.err, /"tie_word_embeddings" must be true or false, got "false" \(a string\)/);
  assert.doesNotMatch(r.err, /\n\s+at /, 'no stack trace');
});
