"""Loads distillery's checkpoints with HF transformers and compares logits and tokenizer ids.
Usage: python3 check.py <dir written by make.js>   (prints one line per case; exits 1 on a mismatch)"""
import json, sys, os
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

root = sys.argv[1]
man = json.load(open(os.path.join(root, 'manifest.json')))
ok = True
for c in man['cases']:
    model = AutoModelForCausalLM.from_pretrained(os.path.join(root, c['dir']), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(torch.tensor([c['ids']])).logits[0].double()
    exp = torch.tensor(c['logits'], dtype=torch.float64).reshape(got.shape)
    rel = ((got - exp).norm() / exp.norm()).item()
    good = rel < 1e-4
    ok &= good
    print(f"hf-compat {c['name']}: {type(model).__name__} logits relative error {rel:.2e} {'OK' if good else 'MISMATCH'}")
tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(root, man['tokenizer']))
for t in man['texts']:
    ids = tok.encode(t['text'], add_special_tokens=False)
    good = ids == t['ids']
    ok &= good
    print(f"hf-compat tokenizer {t['text'][:30]!r}: {'OK' if good else 'MISMATCH ' + str(ids) + ' vs ' + str(t['ids'])}")
if 'chat' in man:
    # The exported tokenizer_config.json carries a chat template: apply_chat_template must render as distillery does.
    ch = man['chat']
    at = AutoTokenizer.from_pretrained(os.path.join(root, ch['dir']))
    got = at.apply_chat_template(ch['messages'], tokenize=False, add_generation_prompt=True)
    good = got == ch['rendered']
    ok &= good
    print(f"hf-compat chat template: {'OK' if good else 'MISMATCH ' + repr(got) + ' vs ' + repr(ch['rendered'])}")
sys.exit(0 if ok else 1)
