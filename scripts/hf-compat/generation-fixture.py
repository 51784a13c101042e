"""Writes test/fixtures/generation/harness-generation.json: what lm-evaluation-harness's own code gives for the pieces of
a generate_until task that distillery reproduces (src/eval/generation.ts, src/eval/py-regex.ts), so that the tests
compare against the harness rather than against a reading of it:
- every regex_pattern and regexes_to_ignore entry of the harness's task YAMLs, run by Python's re over a set of
  model-like responses (re.findall and re.sub), and RegexFilter's output for each with group_select 0 and -1;
- exact_match_hf_evaluate over predictions and references with the settings the tasks use;
- postprocess_generated_text and handle_stop_sequences over generations and stop strings.

    git -C <harness repo> archive HEAD lm_eval | tar -x -C /tmp/lmeval
    python3 scripts/hf-compat/generation-fixture.py /tmp/lmeval <harness repo> > test/fixtures/generation/harness-generation.json
"""
import json
import re
import subprocess
import sys

import yaml

import harness_source

root, repo = sys.argv[1], sys.argv[2]
harness_source.load(root)
from lm_eval.api.metrics import exact_match_hf_evaluate  # noqa: E402
from lm_eval.filters.extraction import RegexFilter  # noqa: E402
from lm_eval.models.utils import handle_stop_sequences, postprocess_generated_text  # noqa: E402

commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
files = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "-z", "--name-only", "HEAD", "lm_eval/tasks"], capture_output=True, text=True, check=True).stdout.split("\0")


class Loose(yaml.SafeLoader):
    pass


Loose.add_multi_constructor("", lambda loader, suffix, node: None)

patterns, ignores = set(), set()


def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "regex_pattern" and isinstance(x, str):
                patterns.add(x)
            elif k == "regexes_to_ignore" and isinstance(x, list):
                ignores.update(s for s in x if isinstance(s, str))
            else:
                walk(x)
    elif isinstance(v, list):
        for x in v:
            walk(x)


for f in files:
    if not f.endswith("yaml"):  # task files and their templates (_default_template_yaml)
        continue
    text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{f}"], capture_output=True, text=True, check=True).stdout
    if "regex" not in text:
        continue
    try:
        walk(yaml.load(text, Loader=Loose))
    except yaml.YAMLError:
        pass

responses = [
    "",
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72",
    "She has $1,250.50 left. The answer is 1,250.50.",
    "The answer is 42.\n",
    "The answer is -7",
    "So the final answer is $18.\n\nQuestion: next",
    "The final answer is 3.5",
    "Answer: (B) because (C) is wrong",
    "(A)",
    "Yes, it is. no",
    "valid",
    "The answer: Paris.",
    "the answer is  twelve apples.",
    "答案是 12。",
    "答えは5です。",
    "La réponse est 1.000,5",
    "Ответ — 17",
    "คำตอบคือ 9",
    "Die Antwort lautet 44",
    "Erantzuna $ 45 da",
    "  A) first\nB) second",
    "The woman and the man",
    "It is True and False",
    "[ ( < { } > ) ]",
    "12 345.6 and 7,8",
    "Total: ٣٤ items (Arabic-Indic digits) and 5",
    "line one\nline two.\n",
    "#### 1,000\n#### 2",
    "An apple. A pear. The end.",
    "price is $5.",
]
def regex_filter(p, g, r):
    """RegexFilter's answer, or None where Python raises (a group_select past the matches)."""
    try:
        return RegexFilter(regex_pattern=p, group_select=g).apply([[r]], [{}])[0][0]
    except IndexError:
        return None


# beyond the tasks' own: the Python syntax the translation rewrites (flags, classes, anchors, names, quantifiers)
extra = {r"(?i)the answer is (\w+)", r"(?m)^\w+\.?$", r"\d+", r"\D+", r"[\d,]+", r"[^\s\w]", r"\W+", r"\S+", r"\B\w",
         r"(?P<n>\w)\w", r"l{,2}", r"o{1}n", r"x{", r"[]a]", r"\Aline|two\.\Z", r"two\.$", r"(?#comment)answer", r"(?a)\w+",
         r"[\]\[]", r"\.", r"(?s)line.two", r"line.two", r"\n", r"\x41|\u00e9", r"a{,}", r"|a", r"a*?", r"x*|b", r"\s*",
         r"[\s\S]+", r"[^\S\n]+", r"[\w\-]+", r"[^\d\s]+", r"\101|\0", r"(\d+)?x", r"(?:ab)+", r"(?:(\d)|x)?y"}
pattern_cases = []
for p in sorted(patterns | ignores | extra):
    try:
        rx = re.compile(p)
    except re.error as e:
        pattern_cases.append({"pattern": p, "error": str(e)})
        continue
    out = []
    for r in responses:
        found = rx.findall(r)
        out.append({"findall": [list(x) if isinstance(x, tuple) else x for x in found], "sub": rx.sub("", r)})
    entry = {"pattern": p, "results": out}
    if p in patterns:
        entry["filter"] = {str(g): [regex_filter(p, g, r) for r in responses] for g in (0, -1)}
    pattern_cases.append(entry)

gsm = {"ignore_case": True, "ignore_punctuation": False, "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}
match_settings = [
    {},
    gsm,
    {"ignore_case": True, "ignore_punctuation": True},
    {"ignore_numbers": True},
    {"regexes_to_ignore": ["^\\s+", "\\s+$"]},
    {"regexes_to_ignore": ["\\b(?:The |the |An |A |The |a |an )"], "ignore_case": True, "ignore_punctuation": True},
]
pairs = [
    ("72", "Natalia sold 48/2 = 24 clips in May.\n#### 72"),
    ("72.", "#### 72"),
    ("$1,000", "#### 1000"),
    ("1000", "#### 1,000"),
    ("[invalid]", "#### 5"),
    ("Paris", "paris"),
    ("The Paris!", "paris"),
    ("  spaced  ", "spaced"),
    ("a1b2", "ab"),
    ("An apple", "apple"),
    ("ÉCOLE", "école"),
    ("-7", "#### -7"),
]
match_cases = []
for st in match_settings:
    for pred, ref in pairs:
        match_cases.append({"settings": st, "prediction": pred, "reference": ref,
                            "exact_match": float(exact_match_hf_evaluate(predictions=[pred], references=[ref], **st)["exact_match"])})

stop_cases = []
for gen, until in [
    ("Janet has 3 eggs.\n#### 3\n\nQuestion: How many", ["Question:", "</s>", "<|im_end|>"]),
    ("a\n\nb", None),
    ("a\n\nb", "\n\n"),
    ("one</s>two Question: three", ["Question:", "</s>"]),
    ("x<|endoftext|>y", ["\n\n"]),
    ("no stop here", ["Question:"]),
    ("Question: at the start", ["Question:"]),
    ("empty terms", ["", "terms"]),
]:
    stops = handle_stop_sequences(until if not isinstance(until, list) else list(until), eos="<|endoftext|>")
    stop_cases.append({"generation": gen, "until": until, "stops": stops, "text": postprocess_generated_text(gen, stops, None)})

print(json.dumps({"harness_commit": commit, "responses": responses, "patterns": pattern_cases, "exact_match": match_cases, "stops": stop_cases}, ensure_ascii=False, indent=1))
