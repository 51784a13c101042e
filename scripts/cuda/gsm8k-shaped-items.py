#!/usr/bin/env python3
"""N GSM8K-shaped generation items as JSON lines ({"context", "target"}): each context holds 5 worked examples (about
700 tokens with Qwen's tokenizer, as the harness's 5-shot gsm8k prompts) and a question; the target is its worked answer
ending in '#### <number>'. Seeded, so every run writes the same file. Usage: gsm8k-shaped-items.py OUT N"""
import json
import random
import sys

random.seed(0)
names, things = ['Natalia', 'Weng', 'Betty', 'James', 'Mark', 'Albert'], ['clips', 'apples', 'pages', 'flowers', 'pizzas']


def question(i):
    a, b = random.randint(2, 90), random.randint(2, 9)
    n, t = names[i % len(names)], things[i % len(things)]
    return (f'{n} sold {a} {t} to friends in April, and then {b} times as many in May. How many {t} did {n} sell altogether in April and May?',
            f'{n} sold {a}*{b} = {a * b} {t} in May.\n{n} sold {a}+{a * b} = {a + a * b} {t} altogether in April and May.\n#### {a + a * b}')


shots = [question(1000 + k) for k in range(5)]
prefix = ''.join(f'Question: {x}\nAnswer: {y}\n\n' for x, y in shots)
with open(sys.argv[1], 'w') as f:
    for i in range(int(sys.argv[2])):
        x, y = question(i)
        f.write(json.dumps({'context': prefix + f'Question: {x}\nAnswer:', 'target': y}) + '\n')
