"""CPython's random.Random draws that src/eval/py-random.ts must reproduce: lm-evaluation-harness's few-shot sampler
(random.Random(fewshot_seed).sample(docs, n)) decides a context's examples with them.

    python3 scripts/hf-compat/py-random-fixture.py > test/fixtures/fewshot/py-random.json
"""
import json
import random
import sys

cases = []
for seed in [0, 1, 42, 1234, 2**31 - 1, 2**32 - 1, 2**32 + 5, 2**40 + 123, 2**53 - 1]:
    r = random.Random(seed)
    bits = [r.getrandbits(32) for _ in range(8)] + [r.getrandbits(k) for k in (1, 5, 17, 31)]
    below = [r._randbelow(n) for n in (1, 2, 3, 7, 100, 1000, 2**31 + 7)]
    samples = []
    # both of CPython's paths: a pool when n is within a k-set's size (21, +4^ceil(log4(3k)) for k > 5), else rejection
    for n, k in [(10, 3), (5, 5), (21, 4), (22, 4), (100, 6), (30, 11), (85, 6), (86, 6), (1000, 26), (5000, 25), (2, 1), (1, 1), (7, 0)]:
        samples.append({"n": n, "k": k, "got": r.sample(range(n), k)})
    cases.append({"seed": seed, "bits32x8_then_1_5_17_31": bits, "randbelow_1_2_3_7_100_1000_2p31p7": below, "samples": samples})
json.dump({"python": sys.version.split()[0], "command": "python3 scripts/hf-compat/py-random-fixture.py > test/fixtures/fewshot/py-random.json", "cases": cases}, sys.stdout, indent=1)
print()
