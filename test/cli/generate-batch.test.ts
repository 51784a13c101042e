/**
 * `generate --prompts file.jsonl --batch N`: one JSON line per prompt, in order; the output does not depend on --batch
 * (greedy and sampled); a greedy completion equals `--prompt`'s streamed one; chat lines use the template; bad input is
 * a usage or input error (exit 2) naming the line.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { runCli, tempDir, writeTinyCheckpoint } from './fixtures.js';
import { generateOptions, sampleAsConfig, samplingNotice } from '../../src/cli/commands/generate.js';
import { sample } from '../../src/model/generate.js';
import { sampleRow } from '../../src/backend/cpu/kernels/sample.js';
import { Rng } from '../../src/util/rng.js';

const run = runCli;

test('generate --prompts: JSON lines in order, independent of --batch, greedy equal to --prompt; bad input exits 2', async () => {
  const dir = tempDir();
  const model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 8);
  const file = path.join(dir, 'prompts.jsonl');
  fs.writeFileSync(file, [
    { prompt: 'The teacher' }, { text: 'A' }, { messages: [{ role: 'user', content: 'the student learns' }] }, { prompt: 'Distillation trains a small model on the' },
  ].map((x) => JSON.stringify(x)).join('\n') + '\n');
  const base = ['generate', '--model', model, '--prompts', file, '--max-new-tokens', '6', '--threads', '1'];
  for (const extra of [[], ['--temperature', '1.2', '--top-k', '20', '--top-p', '0.9', '--seed', '3']]) {
    const a = await run([...base, ...extra, '--batch', '1']), b = await run([...base, ...extra, '--batch', '4']);
    assert.equal(a.code, 0, a.err); assert.equal(b.code, 0, b.err);
    assert.equal(a.out, b.out, `--batch changes nothing (${extra.join(' ') || 'greedy'})`);
    const rows = a.out.trim().split('\n').map((l) => JSON.parse(l) as { index: number; prompt: string; completion: string; tokens: number; finish_reason: string });
    assert.deepEqual(rows.map((r) => r.index), [0, 1, 2, 3]);
    assert.match(rows[2]!.prompt, /<\|im_start\|>user\nthe student learns<\|im_end\|>\n<\|im_start\|>assistant\n$/);
    for (const r of rows) assert.ok(['stop', 'length'].includes(r.finish_reason) && r.tokens <= 6);
    if (extra.length === 0) {
      const one = await run(['generate', '--model', model, '--prompt', 'The teacher', '--max-new-tokens', '6', '--threads', '1']);
      assert.equal(one.out, rows[0]!.completion + '\n');
    }
  }
  // a repetition penalty: the batched sampler (a seen-token bitmask per prompt) decodes greedily what --prompt does
  const pen = ['--repetition-penalty', '3', '--max-new-tokens', '12'];
  const batchedPen = await run([...base, ...pen, '--batch', '3']), plain = await run([...base, '--max-new-tokens', '12']);
  assert.equal(batchedPen.code, 0, batchedPen.err);
  const penRows = batchedPen.out.trim().split('\n').map((l) => JSON.parse(l) as { completion: string });
  const onePen = await run(['generate', '--model', model, '--prompt', 'The teacher', '--threads', '1', ...pen]);
  assert.equal(onePen.out, penRows[0]!.completion + '\n');
  assert.notEqual(batchedPen.out, plain.out, 'the penalty changes what greedy decoding picks here');
  const bad = path.join(dir, 'bad.jsonl');
  fs.writeFileSync(bad, '{"prompt": "ok"}\n{"nothing": 1}\n');
  const nul = path.join(dir, 'null.jsonl');
  fs.writeFileSync(nul, '{"prompt": "ok"}\nnull\n');
  const emptyConv = path.join(dir, 'empty.jsonl');
  fs.writeFileSync(emptyConv, '{"messages": []}\n');
  const num = path.join(dir, 'num.jsonl');
  fs.writeFileSync(num, '{"prompt": 5}\n');
  for (const [argv, re] of [
    [['generate', '--model', model, '--prompts', bad], /bad\.jsonl:2: no "prompt", "text" or "messages"/],
    [['generate', '--model', model, '--prompts', nul], /null\.jsonl:2: not a JSON object/],
    [['generate', '--model', model, '--prompts', emptyConv], /empty\.jsonl:1: "messages" must be a non-empty array/],
    [['generate', '--model', model, '--prompts', num], /num\.jsonl:1: "prompt" must be a string, got 5/],
    [['generate', '--model', model, '--prompt', 'x', '--chat-template-kwargs', '{"a": 1}'], /--chat-template-kwargs goes with --chat/],
    [['generate', '--model', model, '--prompts', dir], /--prompts .* is not a file/],
    [['generate', '--model', model, '--prompt', 'x', '--batch', '4', '--top-k', '5'], /--batch goes with --prompts/],
    [['generate', '--model', model, '--prompts', file, '--prompt', 'x'], /--prompt and --prompts: pass one of them/],
    [['generate', '--model', model, '--prompts', path.join(dir, 'none.jsonl')], /--prompts: .*none\.jsonl does not exist/],
    [[...base, '--batch', '0'], /--batch must be a positive integer/],
    [[...base, '--top-k', '-1'], /--top-k must be an integer >= 0/],
    [[...base, '--min-p', '1.5', '--temperature', '1'], /--min-p must be in \[0, 1\], got 1\.5/],
    [[...base, '--repetition-penalty', '0'], /--repetition-penalty must be a positive number, got 0/],
    [[...base, '--top-k', '5'], /--top-k shapes sampling, and --temperature is 0 \(greedy decoding\)/],
    [[...base, '--top-p', '0.9', '--min-p', '0.1', '--temperature', '0'], /--top-p, --min-p shape sampling, and --temperature is 0/],
  ] as Array<[string[], RegExp]>) {
    const r = await run(argv);
    assert.equal(r.code, 2, r.err);
    assert.match(r.err, re);
  }
});

test('generate says when generation_config.json samples and distillery decodes greedily (the flags that sample as it says; what is not applied, by name); not when a sampling flag is given', async () => {
  // transformers' defaults where the file is silent: temperature 1, top_p 1, top_k 50
  assert.equal(samplingNotice(null, 'g'), null);
  assert.equal(samplingNotice({ temperature: 0.7 }, 'g'), null, 'do_sample absent: transformers decodes greedily too');
  const qwen = { do_sample: true, temperature: 0.7, top_p: 0.8, top_k: 20, repetition_penalty: 1.05, eos_token_id: [151645, 151643] };
  assert.equal(samplingNotice(qwen, 'q'),
    'note: q samples (do_sample: true, temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05), as transformers\' generate() would; distillery decodes greedily unless told: '
    + '--temperature 0.7 --top-p 0.8 --top-k 20 --repetition-penalty 1.05 samples as it says (so does --generation-config auto)');
  assert.match(samplingNotice({ do_sample: true, temperature: 0.6, top_p: 0.9 }, 'l')!, /top_k 50 \(transformers' default\).*--temperature 0\.6 --top-p 0\.9 --top-k 50 samples as it says \(so does --generation-config auto\)$/);
  assert.match(samplingNotice({ do_sample: true, min_p: 0.05, typical_p: 0.9 }, 'm')!, /min_p 0\.05\).*--temperature 1 --top-k 50 --min-p 0\.05 samples as it says, without typical_p 0\.9, which distillery does not apply$/);
  // transformers applies a repetition penalty to greedy decoding too: a file that penalizes without sampling is announced
  assert.equal(samplingNotice({ do_sample: false, repetition_penalty: 1.1, top_p: 0.5 }, 'r'),
    'note: r penalizes repetition (do_sample: false, repetition_penalty 1.1), as transformers\' generate() would; distillery decodes greedily without a penalty unless told: '
    + '--repetition-penalty 1.1 decodes as it says (so does --generation-config auto)');
  const dir = tempDir();
  const model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 8);
  fs.writeFileSync(path.join(model, 'generation_config.json'), JSON.stringify(qwen));
  const base = ['generate', '--model', model, '--prompt', 'The teacher', '--max-new-tokens', '2', '--threads', '1'];
  const quiet = await run([...base, '--temperature', '0']);
  assert.equal(quiet.code, 0, quiet.err);
  assert.doesNotMatch(quiet.err, /samples/);
  const told = await run(base);
  assert.equal(told.code, 0, told.err);
  assert.match(told.err, /^note: .*generation_config\.json samples \(do_sample: true, temperature 0\.7/m);
  assert.equal(told.out, quiet.out, 'still greedy');
});

test('generate --prompt takes --top-k (the device sampler\'s rule on the host): top-k 1 at any temperature is greedy; top-k widens what a seed draws', async () => {
  const dir = tempDir();
  const model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 8);
  const base = ['generate', '--model', model, '--prompt', 'The teacher', '--max-new-tokens', '8', '--threads', '1'];
  const greedy = await run(base);
  const k1 = await run([...base, '--temperature', '2', '--top-k', '1', '--seed', '5']);
  assert.equal(k1.code, 0, k1.err);
  assert.equal(k1.out, greedy.out);
  // sample() is sampleRow with the seeded stream's uniforms: the same ids as the reference drawn by hand
  const z = Float32Array.from({ length: 40 }, (_, j) => Math.sin(j * 1.7) * 3);
  const rng = new Rng(9), ref = new Rng(9);
  for (let i = 0; i < 20; i++) {
    const s = { temperature: 0.9, topK: 7, topP: 0.8 };
    assert.equal(sample(z, s, rng), sampleRow(z, 0, 40, s, ref.next()));
  }
});

test('generate --generation-config auto samples as generation_config.json says (transformers\' defaults where it is silent; flags override; what is not run is refused by name)', async () => {
  const opts = (argv: string[]) => generateOptions({ model: 'm', prompt: 'x', 'generation-config': 'auto', ...Object.fromEntries(argv.map((a, i, all) => (i % 2 === 0 ? [a.slice(2), Number(all[i + 1])] : null)).filter((x) => x !== null)) });
  const qwen = { do_sample: true, temperature: 0.7, top_p: 0.8, top_k: 20, repetition_penalty: 1.05 };
  const a = sampleAsConfig(opts([]), qwen, 'g');
  assert.deepEqual([a.options.temperature, a.options.topK, a.options.topP, a.options.minP, a.options.repetitionPenalty], [0.7, 20, 0.8, 0, 1.05]);
  assert.equal(a.said, 'sampling: temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.05 (g)');
  // transformers' defaults where the file is silent: top_k 50, temperature 1
  const b = sampleAsConfig(opts([]), { do_sample: true, min_p: 0.1 }, 'g').options;
  assert.deepEqual([b.temperature, b.topK, b.topP, b.minP, b.repetitionPenalty], [1, 50, 1, 0.1, 1]);
  // do_sample false (or no file): greedy, the file's repetition penalty kept (transformers applies it to greedy decoding)
  const c = sampleAsConfig(opts([]), { do_sample: false, temperature: 0.7, repetition_penalty: 1.2 }, 'g');
  assert.deepEqual([c.options.temperature, c.options.repetitionPenalty], [0, 1.2]);
  assert.equal(c.said, 'sampling: greedy, repetition_penalty 1.2 (g)');
  assert.equal(sampleAsConfig(opts([]), null, 'g').said, "sampling: greedy (transformers' defaults (no g))");
  // a flag given overrides its setting only
  const d = sampleAsConfig(opts(['--temperature', '0.3', '--repetition-penalty', '1']), qwen, 'g');
  assert.deepEqual([d.options.temperature, d.options.topK, d.options.repetitionPenalty], [0.3, 20, 1]);
  assert.match(d.said, /overridden by --temperature --repetition-penalty\)$/);
  for (const [gen, re] of [
    [{ do_sample: true, num_beams: 4 }, /asks for num_beams 4, which distillery's generation does not run/],
    [{ do_sample: true, typical_p: 0.9, no_repeat_ngram_size: 3 }, /no_repeat_ngram_size 3, typical_p 0\.9/],
    [{ do_sample: true, temperature: 'hot' }, /temperature is "hot", not a number/],
    [{ do_sample: true, top_p: 1.5 }, /out of range .*top_p 1\.5/],
  ] as Array<[Record<string, unknown>, RegExp]>) assert.throws(() => sampleAsConfig(opts([]), gen, 'g'), re);
  assert.equal(sampleAsConfig(opts([]), { do_sample: true, num_beams: 1, typical_p: 1 }, 'g').options.topK, 50, 'neutral values are not refused');
  // a cut given: fine where the file samples, refused where it decodes greedily
  assert.equal(sampleAsConfig(opts(['--top-k', '3']), qwen, 'g').options.topK, 3);
  assert.throws(() => sampleAsConfig(opts(['--top-k', '3']), { do_sample: false }, 'g'), /--top-k shapes sampling, and g decodes greedily \(do_sample false\)/);
  assert.equal(sampleAsConfig(opts(['--top-k', '0', '--top-p', '1']), { do_sample: false }, 'g').options.temperature, 0, 'neutral cuts with greedy decoding are fine');
  // --temperature above 0 over a file that decodes greedily samples with the file's cuts (transformers' defaults where silent)
  const e = sampleAsConfig(opts(['--temperature', '0.5']), { do_sample: false, top_p: 0.9 }, 'g').options;
  assert.deepEqual([e.temperature, e.topK, e.topP, e.minP], [0.5, 50, 0.9, 0]);
  assert.throws(() => sampleAsConfig(opts([]), { do_sample: true, temperature: 0 }, 'g'), /samples \(do_sample true\) at temperature 0, which transformers refuses/);
  // the settings transformers acts on and distillery does not run: refused by --generation-config auto, named by the notice
  for (const k of [{ suppress_tokens: [5] }, { min_new_tokens: 4 }, { forced_eos_token_id: 2 }, { sequence_bias: { '[1]': -1 } }, { penalty_alpha: 0.6 }]) {
    assert.throws(() => sampleAsConfig(opts([]), { do_sample: true, ...k }, 'g'), new RegExp(`asks for ${Object.keys(k)[0]} `));
    assert.match(samplingNotice({ do_sample: true, ...k }, 'g')!, new RegExp(`without ${Object.keys(k)[0]} .*, which distillery does not apply$`));
  }
  assert.doesNotThrow(() => sampleAsConfig(opts([]), { do_sample: true, suppress_tokens: [], min_length: 0, bad_words_ids: null, forced_eos_token_id: null }, 'g'), 'neutral or empty values run');
  assert.doesNotThrow(() => sampleAsConfig(opts([]), { do_sample: false, typical_p: 0.5 }, 'g'), 'typical_p acts only when sampling');

  // through the CLI: the same text as the flags that say the same, and the line that says so
  const dir = tempDir();
  const model = path.join(dir, 'm');
  writeTinyCheckpoint(model, 8);
  fs.writeFileSync(path.join(model, 'generation_config.json'), JSON.stringify({ ...qwen, top_k: 5, temperature: 1.3 }));
  const base = ['generate', '--model', model, '--prompt', 'The teacher', '--max-new-tokens', '8', '--threads', '1', '--seed', '9'];
  const auto = await run([...base, '--generation-config', 'auto']);
  const flags = await run([...base, '--temperature', '1.3', '--top-k', '5', '--top-p', '0.8', '--repetition-penalty', '1.05']);
  assert.equal(auto.code, 0, auto.err); assert.equal(flags.code, 0, flags.err);
  assert.equal(auto.out, flags.out);
  assert.match(auto.err, /^sampling: temperature 1\.3, top_k 5, top_p 0\.8, repetition_penalty 1\.05 \(.*generation_config\.json\)$/m);
  assert.doesNotMatch(auto.err, /^note:/m);
  const greedy = await run([...base, '--generation-config', 'auto', '--temperature', '0']);
  const greedyFlags = await run([...base, '--repetition-penalty', '1.05']);
  assert.equal(greedy.out, greedyFlags.out, '--temperature 0 overrides do_sample; the file\'s penalty stays');
  fs.writeFileSync(path.join(model, 'generation_config.json'), JSON.stringify({ do_sample: true, num_beams: 3 }));
  const beams = await run([...base, '--generation-config', 'auto']);
  assert.equal(beams.code, 2, beams.err);
  assert.match(beams.err, /num_beams 3, which distillery's generation does not run/);
});
