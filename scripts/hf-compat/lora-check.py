"""transformers and PEFT read what distillery writes for LoRA (lora-make.js): the merged export with
AutoModelForCausalLM (logits within 1e-5 relative of distillery's merged model), and, when peft is installed, the
adapter folder with PeftModel.from_pretrained on the base (logits within 1e-5 of distillery's unmerged LoRA model; and
merge_and_unload's weights against the exported model.safetensors).
Usage: python3 lora-check.py <dir written by lora-make.js>   (one line per check; exits 1 on a mismatch)"""
import json, os, sys
import torch
from transformers import AutoModelForCausalLM

root = sys.argv[1]
man = json.load(open(os.path.join(root, 'manifest.json')))
ok = True
try:
    from peft import PeftModel
except ImportError:
    PeftModel = None
    print('lora-compat: peft is not installed here: the adapter folder is not loaded with PEFT (merged export only)')

def rel(got, exp):
    return ((got - exp).norm() / exp.norm()).item()

def report(name, what, measure, value, bound):
    global ok
    good = value <= bound
    ok &= good
    print(f"lora-compat {name}: {what}: {measure} {value:.2e} {'OK' if good else 'MISMATCH'}")

for c in man['cases']:
    ids = torch.tensor([c['ids']])
    merged = AutoModelForCausalLM.from_pretrained(c['merged'], dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(ids).logits[0].double()
    e = rel(got, torch.tensor(c['merged_logits'], dtype=torch.float64).reshape(got.shape))
    report(c['name'], 'transformers reads the merged export', 'logits relative error', e, 1e-5)
    if PeftModel is not None:
        base = AutoModelForCausalLM.from_pretrained(c['base'], dtype=torch.float32).eval()
        peft = PeftModel.from_pretrained(base, c['adapter']).eval()
        with torch.no_grad():
            got = peft(ids).logits[0].double()
        e = rel(got, torch.tensor(c['lora_logits'], dtype=torch.float64).reshape(got.shape))
        report(c['name'], 'PEFT loads the adapter on its base', 'logits relative error', e, 1e-5)
        m = peft.merge_and_unload()
        theirs, ours = m.state_dict(), merged.state_dict()
        worst = max(((theirs[k].double() - ours[k].double()).abs().max() / ours[k].double().abs().max().clamp_min(1e-30)).item() for k in ours if k in theirs)
        report(c['name'], "PEFT merge_and_unload vs distillery's export", 'worst relative weight difference', worst, 1e-6)
sys.exit(0 if ok else 1)
