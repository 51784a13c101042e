"""Few-shot prompts built by lm-evaluation-harness's own code, for test/eval/fewshot.test.ts: ConfigurableTask's
fewshot_context and build_qa_turn, its samplers (ContextSampler, FirstNSampler) and Message / multiturn_to_singleturn,
imported from a checkout of the harness's source (harness_source.py). The task object is made without __init__ (no
dataset) and given the config fields these functions read, as a task YAML with doc_to_text: context, doc_to_choice:
choices, doc_to_target: answer would.

    git -C <harness repo> archive HEAD lm_eval | tar -x -C /tmp/lmeval
    python3 scripts/hf-compat/fewshot-fixture.py /tmp/lmeval <commit> > test/fixtures/fewshot/harness-prompts.json
"""
import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness_source  # noqa: E402

root, commit = sys.argv[1], sys.argv[2]
harness_source.load(root)
from lm_eval.api import samplers  # noqa: E402
from lm_eval.api.task import ConfigurableTask  # noqa: E402

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def mc_docs(n, tag, description=None):
    docs = []
    for i in range(n):
        d = {"context": f"Question {tag}{i}: which word comes {i % 5} after {WORDS[i % 16]}?\nAnswer:",
             "choices": [WORDS[(i + k) % 16] for k in range(2 + i % 3)], "answer": i % (2 + i % 3)}
        if description is not None:
            d["description"] = description if i % 4 else f"Subject {tag}: words.\n\n"
        docs.append(d)
    return docs


def mi_docs(n, tag):
    # Winogrande's kind: the sentence up to the blank with each option, the rest of it the shared continuation
    return [{"contexts": [f"{tag}{i}: the {WORDS[i % 16]} would not fit in the {WORDS[(i + 3) % 16]} because the {o}" for o in (WORDS[(i + 5) % 16], WORDS[(i + 7) % 16])],
             "continuation": f"was too {WORDS[(i + 2) % 16]}.", "answer": i % 2} for i in range(n)]


def cont_docs(n, tag):
    return [{"context": f"The {tag} story {i} ends with the word", "continuation": f" {WORDS[(3 * i) % 16]}"} for i in range(n)]


def gen_docs(tag):
    # generate_until docs: a target, a list of targets, and empty ones (a "" target is no answer to build_qa_turn; [""] is one)
    return [{"context": f"Question {tag}{i}?\nAnswer:", "target": t} for i, t in
            enumerate(["#### 1", "", ["#### 3", "three"], [""], "#### 5", "", "#### 7"])]


def with_prefix(docs, prefixes):
    # the docs' gen_prefix field, one of `prefixes` each (the task names the field: gen_prefix: gen_prefix)
    return [dict(d, gen_prefix=prefixes[i % len(prefixes)]) for i, d in enumerate(docs)]


def task(kind, description, fewshot_delim, split_same, target_delim, gen_prefix=None):
    t = object.__new__(ConfigurableTask)
    t.prompt = None
    t.multiple_input = 2 if kind == "mi" else 0  # as the harness sets it when doc_to_text gives an int
    t.features = ["context", "choices", "answer", "description", "continuation", "contexts", "target", "gen_prefix"]
    choice = {"mc": "choices", "mi": "contexts"}.get(kind)
    target = "answer" if kind == "mc" else "target" if kind == "gen" else "continuation"
    text = "answer" if kind == "mi" else "context"  # Winogrande's doc_to_text: the right option's index
    t._config = SimpleNamespace(description="description" if description else None, fewshot_delimiter=fewshot_delim,
                                target_delimiter=target_delim, test_split="test", doc_to_text=text,
                                doc_to_choice=choice, doc_to_target=target, gen_prefix=gen_prefix)
    t.fewshot_cfg = SimpleNamespace(split="test" if split_same else "train", doc_to_text=text, doc_to_choice=choice,
                                    doc_to_target=target, gen_prefix=gen_prefix, target_delimiter=target_delim,
                                    fewshot_delimiter=fewshot_delim)
    return t


def chat(messages, add_generation_prompt):
    return json.dumps({"messages": messages, "add_generation_prompt": add_generation_prompt})


cases = []


def case(name, kind, items, pool, n, sampler, seed, description=False, fewshot_delim="\n\n", target_delim=" ", modes=("text", "multiturn", "singleturn"),
         system=None, gen_prefix=None):
    out = {"name": name, "items": items, "pool": pool, "n": n, "sampler": sampler, "seed": seed,
           "fewshot_delimiter": fewshot_delim, "target_delimiter": target_delim, "system_instruction": system}
    for mode in modes:
        t = task(kind, description, fewshot_delim, pool is None, target_delim, gen_prefix)
        cls = samplers.get_sampler("default" if sampler == "random" else sampler)
        t.sampler = cls(list(items if pool is None else pool), rnd=None)
        t.sampler.set_rnd(seed)  # the evaluator's task.set_fewshot_seed(fewshot_random_seed)
        got = []
        for d in items:
            gp = t.doc_to_prefix(d)  # as the evaluator passes it (None without the task's gen_prefix)
            if mode == "text":
                got.append(t.fewshot_context(d, n, system_instruction=system, gen_prefix=gp))
            else:
                r = t.fewshot_context(d, n, system_instruction=system, apply_chat_template=True, fewshot_as_multiturn=mode == "multiturn", chat_template=chat, gen_prefix=gp)
                got.append([json.loads(x) for x in r] if isinstance(r, list) else json.loads(r))
        out[mode] = got
    cases.append(out)


case("mc-own-random-3", "mc", mc_docs(12, "A"), None, 3, "random", 1234)
case("mc-own-random-0", "mc", mc_docs(5, "Z", description="Zero-shot subject.\n\n"), None, 0, "random", 1234, description=True)
case("mc-pool-random-2-descriptions", "mc", mc_docs(9, "B", description="About words.\n\n"), mc_docs(8, "T"), 2, "random", 42, description=True)
case("mc-own-first_n-4", "mc", mc_docs(7, "C"), None, 4, "first_n", 1234)
case("mc-pool-first_n-2", "mc", mc_docs(5, "D"), mc_docs(6, "U"), 2, "first_n", 1234)
case("mc-own-random-set-path", "mc", mc_docs(100, "E"), None, 5, "random", 7, modes=("text",))
case("mc-own-random-delims", "mc", mc_docs(10, "F"), None, 2, "random", 1234, fewshot_delim="\n###\n", target_delim=" :: ")
case("continuation-own-random-2", "cont", cont_docs(8, "G"), None, 2, "random", 1234)  # lambada_openai's default target_delimiter " "
case("multiple-input-own-random-2", "mi", mi_docs(9, "W"), None, 2, "random", 1234)
case("multiple-input-pool-first_n-1-descriptions", "mi", [dict(d, description="Fill the blank.\n\n") for d in mi_docs(4, "X")], mi_docs(3, "Y"), 1, "first_n", 1234, description=True)
case("mc-system-instruction-descriptions", "mc", mc_docs(6, "S", description="About words.\n\n"), None, 1, "first_n", 1234, description=True,
     system="You are a careful reader.")
case("mc-system-instruction-trailing-space", "mc", mc_docs(4, "R"), None, 1, "random", 5, system="Answer briefly. ")
case("generation-own-first_n-4-empty-targets", "gen", gen_docs("K"), None, 4, "first_n", 1234)
case("generation-own-random-3", "gen", gen_docs("L"), None, 3, "random", 1234)
case("continuation-own-random-2-no-delimiter", "cont", cont_docs(6, "H"), None, 2, "random", 99, target_delim="")
# gen_prefix (Llama 3's instruct tasks: "The best answer is"): the examples' answers after their own, the item's as an
# assistant turn to continue; one with a trailing space, one after a context that ends in a space, an empty one
case("mc-gen-prefix-own-random-2", "mc", with_prefix(mc_docs(8, "P"), ["The best answer is", "Answer: ", ""]), None, 2, "random", 1234, gen_prefix="gen_prefix")
case("mc-gen-prefix-context-space-first_n-1", "mc", with_prefix([dict(d, context=d["context"] + " ") for d in mc_docs(4, "Q")], ["The answer is"]), None, 1, "first_n", 1234,
     gen_prefix="gen_prefix", system="Be exact.")
case("generation-gen-prefix-own-first_n-3", "gen", with_prefix(gen_docs("M"), ["Let's think step by step.", "\nReasoning:"]), None, 3, "first_n", 1234, gen_prefix="gen_prefix")
case("continuation-gen-prefix-own-random-1", "cont", with_prefix(cont_docs(5, "N"), ["It ends:"]), None, 1, "random", 3, gen_prefix="gen_prefix")
json.dump({"harness_commit": commit, "python": sys.version.split()[0],
           "command": "python3 scripts/hf-compat/fewshot-fixture.py /tmp/lmeval <commit> > test/fixtures/fewshot/harness-prompts.json",
           "cases": cases}, sys.stdout, ensure_ascii=False)
print()
