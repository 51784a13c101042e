"""lm-evaluation-harness's rolling windows and word counts, for test/eval/rolling.test.ts: its own
utils.get_rolling_token_windows and make_disjoint_window (as HFLM.loglikelihood_rolling calls them: context_len 1, the
prefix token first) over token lists of several lengths and windows, and Task.count_words / count_bytes over strings
with every kind of whitespace, imported from a checkout of the harness's source (harness_source.py).

    git -C <harness repo> archive HEAD lm_eval | tar -x -C /tmp/lmeval
    python3 scripts/hf-compat/rolling-fixture.py /tmp/lmeval <commit> > test/fixtures/rolling/harness-windows.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness_source  # noqa: E402

root, commit = sys.argv[1], sys.argv[2]
harness_source.load(root)
from lm_eval import utils  # noqa: E402
from lm_eval.api.task import Task  # noqa: E402

PREFIX = 999
windows = []
for n in [1, 2, 3, 4, 5, 7, 8, 9, 10, 16, 17, 31, 33, 100]:
    for max_len in [1, 2, 3, 4, 8, 16]:
        tokens = list(range(n))
        got = [list(map(list, w)) for w in map(utils.make_disjoint_window,
                                               utils.get_rolling_token_windows(token_list=tokens, prefix_token=PREFIX, max_seq_len=max_len, context_len=1))]
        windows.append({"n": n, "max_len": max_len, "windows": got})
texts = ["", "one", " one", "one ", "one two  three", "\tone\ntwo\r\nthree\x0b\x0cfour", "a\x1cb\x1dc\x1ed\x1fe", "a\x85b\xa0c\u1680d",
         "a\u2000b\u200ac\u2028d\u2029e\u202ff\u205fg\u3000h", "a\ufeffb\u200bc", "  ", "naïve café 東京 🙂 done", "end\n"]
counts = [{"text": t, "words": Task.count_words(t), "bytes": Task.count_bytes(t)} for t in texts]
json.dump({"harness_commit": commit, "python": sys.version.split()[0],
           "command": "python3 scripts/hf-compat/rolling-fixture.py /tmp/lmeval <commit> > test/fixtures/rolling/harness-windows.json",
           "prefix_token": PREFIX, "windows": windows, "counts": counts}, sys.stdout, ensure_ascii=False)
print()
