"""The world of Skill-RM (skill_rm.py): verifiable instructions and their hidden checkers, the arithmetic
items, the answers built from checkers (chosen / rejected), the judge-SFT split, the benchmark files, the
JETTS knockout with its baselines random@N and oracle@N, the benchmark's presentation and answer contract
(and the plain judge's prompt), the judgment record JudgeTask with the benchmark's and the SFT split's
judgments, and the scripted judge that knows the label (the tables' upper bound, the source of SFT traces,
python_only's written checks among them);
the benchmark sets (held-out test set, dev set) with their clusters, the no-model baselines (coin,
position-locked, shorter- / longer-wins, checker-only) and the benchmark's report (tables, chance lines,
warnings, headline entries); App. D's evaluation of a policy by IFEval's checkers and the no-signal judge's
reward sd.

    p = if_prompts(seed, n, "train")[0]                 # {"prompt": ..., "constraints": [{"type": ...}, ...]}
    constraint_scores(p["constraints"], response)       # the hidden checkers: {"checks", "all", "frac"}
    ifeval_check(c, response)                           # IFEval's own checker (the held-out evaluation)
    items = select_items(read_jsonl(DATA / "heldout.jsonl"), per_cat, seed)   # the test set; bench.jsonl: dev
    baseline_scores(items, ["pairwise"], seed)          # {(baseline, format, category): row}, no model

Every split (bench, bon, sft, train, test) draws from its own tasks and seeds, so no prompt is in two.
data/skill_rm/prepare.py builds bench.jsonl and bon_pools.jsonl with these functions, and heldout.jsonl
from its own build seed, templates, wordings and wrong-answer styles (none of them here).
"""
import functools
import json
import math
import random
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo import chat_ids
from plumbing import Dist, gather_objects, json_text
from stats import (binomial_p, bootstrap_ci, cluster_bootstrap_ci, compare, floor_note, print_table,
                   sign_flip_mde, sign_flip_p, vs_chance, wilson_ci)

DATA = Path(__file__).resolve().parent.parent / "data" / "skill_rm"

# --- verifiable instructions (their checkers follow) ---

IF_TASKS = [
    "Write a short note about the ocean.", "Describe a rainy day in a city.",
    "Explain why people enjoy gardening.", "Give advice to someone starting a new job.",
    "Describe your favourite kind of breakfast.", "Write a short story about a lost key.",
    "Explain how a bicycle works.", "Describe a walk in the forest.",
    "Write a message inviting a friend to dinner.",
    "Explain why sleep is important.", "Describe a busy market.", "Write a thank-you note to a teacher.",
    "Explain what a library is for.", "Describe the moon at night.", "Give tips for learning a new language.",
    "Write a short poem about winter.", "Explain how to make tea.", "Describe a train journey.",
    "Write a product description for a water bottle.", "Explain why exercise helps.",
    "Describe a summer festival.",
    "Write a short review of a fictional cafe.", "Explain how plants grow.", "Describe an old house.",
    "Write a note to a neighbour about a lost cat.", "Explain what a map is used for.",
    "Describe a snowy mountain village.", "Give advice for a long flight.",
    "Write a short speech for a birthday.",
    "Explain why bees matter.", "Describe a quiet morning.", "Write a short letter to your future self.",
]
# test instructions use their own tasks (never seen in training) and add constraint types training never sees
IF_TEST_TASKS = [
    "Describe a lighthouse on a stormy night.", "Explain how a compass works.",
    "Write a short note about autumn leaves.", "Give advice for a first camping trip.",
    "Describe a crowded train station.", "Explain why people keep diaries.",
    "Write a short message to a new colleague.", "Describe the smell of fresh bread.",
]
HELD_OUT_GROUPS = [("title", "postscript")]  # test-only constraint types (IFEval's title and P.S. checks)
KEYWORDS = ["river", "lamp", "garden", "coffee", "window", "music", "friend", "bridge", "candle", "stone"]
BANNED = ["very", "really", "good", "nice", "thing"]
END_PHRASES = ["Is there anything else I can help with?", "That is all.", "Thank you for reading."]
START_WORDS = ["Today", "Honestly", "Imagine"]
# groups of mutually exclusive constraint types (at most one per group in a prompt)
CONSTRAINT_GROUPS = [("lowercase", "uppercase"), ("max_words", "min_words", "bullets"), ("include_keyword",),
                     ("exclude_word",), ("end_phrase", "quotes"), ("start_word",), ("no_commas",)]


def render_constraint(c):
    """The natural-language form the policy and the judge see."""
    t = c["type"]
    return {"lowercase": "Your entire response must be in lowercase letters; no capital letters are allowed.",
            "uppercase": "Your entire response must be in English capital letters only.",
            "max_words": f"Answer in at most {c.get('n')} words.",
            "min_words": f"Answer with at least {c.get('n')} words.",
            "bullets": f"Your answer must contain exactly {c.get('n')} bullet points, each starting with "
                       "'* '.",
            "include_keyword": f"Include the word \"{c.get('word')}\" in your response.",
            "exclude_word": f"Do not use the word \"{c.get('word')}\" anywhere in your response.",
            "end_phrase": f"End your response with the exact phrase \"{c.get('phrase')}\". "
                          "No other words should follow it.",
            "quotes": "Wrap your entire response in double quotation marks.",
            "start_word": f"Start your response with the word \"{c.get('word')}\".",
            "no_commas": "Do not use any commas in your response.",
            "title": "Your answer must contain a title, wrapped in double angular brackets, such as "
                     "<<poem of joy>>.",
            "postscript": "At the end of your response, please explicitly add a postscript starting with P.S."
            }.get(t, f"(unknown constraint {t})")


def make_if_prompt(rng, n_constraints, tasks=IF_TASKS, held_out=False):
    """One instruction: a task plus n constraints from distinct groups, with their specs; held_out
    makes the first constraint a test-only type."""
    task = rng.choice(tasks)
    cons = []
    groups = rng.sample(CONSTRAINT_GROUPS, n_constraints - 1 if held_out else n_constraints)
    for group in (rng.sample(HELD_OUT_GROUPS, 1) if held_out else []) + groups:
        t = rng.choice(group)
        c = {"type": t}
        if t in ("max_words",):
            c["n"] = rng.choice([20, 30, 40])
        elif t == "min_words":
            c["n"] = rng.choice([40, 60])
        elif t == "bullets":
            c["n"] = rng.choice([2, 3])
        elif t == "include_keyword":
            c["word"] = rng.choice(KEYWORDS)
        elif t == "exclude_word":
            c["word"] = rng.choice(BANNED)
        elif t == "end_phrase":
            c["phrase"] = rng.choice(END_PHRASES)
        elif t == "start_word":
            c["word"] = rng.choice(START_WORDS)
        cons.append(c)
    prompt = task + " " + " ".join(render_constraint(c) for c in cons)
    return {"prompt": prompt, "constraints": cons}


IF_SPLITS = ("bench", "bon", "sft", "train", "test")


def split_tasks(split):
    """The tasks a split's instruction prompts use, disjoint across splits (so no prompt is in two):
    test has its own IF_TEST_TASKS; bench, bon and sft take every 6th of IF_TASKS; train the other half."""
    if split not in IF_SPLITS:
        raise ValueError(f"unknown split '{split}' (one of {', '.join(IF_SPLITS)})")
    if split == "test":
        return IF_TEST_TASKS
    if split == "train":
        return [t for k, t in enumerate(IF_TASKS) if k % 6 >= 3]
    return IF_TASKS[("bench", "bon", "sft").index(split)::6]


def if_prompts(seed, n, split):
    """Deterministic instruction prompts from the split's own tasks (split_tasks); every other test
    prompt has a constraint type no other split has."""
    rng = random.Random(f"{split}-{seed}")
    if split == "test":
        return [make_if_prompt(rng, rng.choice([1, 2, 2, 3]), IF_TEST_TASKS, held_out=k % 2 == 0)
                for k in range(n)]
    return [make_if_prompt(rng, rng.choice([1, 2, 2, 3]), split_tasks(split)) for _ in range(n)]


# --- the checkers (hidden from every judge and reward) ---

def _words(text):
    return re.findall(r"[A-Za-z0-9']+", text)


def check_constraint(c, response):
    """Deterministic checker of one constraint (IFEval-style); unknown type → False."""
    r, t = response.strip(), c.get("type")
    if t == "lowercase":
        return r == r.lower() and any(ch.isalpha() for ch in r)
    if t == "uppercase":
        return r == r.upper() and any(ch.isalpha() for ch in r)
    if t == "max_words":
        return len(_words(r)) <= c["n"]
    if t == "min_words":
        return len(_words(r)) >= c["n"]
    if t == "bullets":
        return len([l for l in r.splitlines() if re.match(r"^\s*\*\s", l)]) == c["n"]
    if t == "include_keyword":
        return re.search(r"\b" + re.escape(c["word"]) + r"\b", r, re.I) is not None
    if t == "exclude_word":
        return re.search(r"\b" + re.escape(c["word"]) + r"\b", r, re.I) is None
    if t == "end_phrase":
        return r.lower().endswith(c["phrase"].lower())
    if t == "quotes":
        return len(r) > 1 and r[0] == '"' and r[-1] == '"'
    if t == "start_word":
        w = _words(r)
        return bool(w) and w[0].lower() == c["word"].lower()
    if t == "no_commas":
        return "," not in r
    if t == "title":
        return re.search(r"<<[^\n]+>>", r) is not None
    if t == "postscript":
        return re.search(r"^\s*P\.S\.", r, re.M) is not None
    return False


def constraint_scores(constraints, response, check=check_constraint):
    """Per-constraint pass/fail, the prompt-level 'all pass' and the satisfied fraction."""
    ok = [check(c, response) for c in constraints]
    return {"checks": ok, "all": float(all(ok)), "frac": sum(ok) / max(len(ok), 1)}


# The held-out evaluation uses IFEval's own instruction checkers (Google's registry, as shipped in lm-eval),
# not the training checks above: our constraint type -> (IFEval instruction id, its build_description kwargs).
# IFEval has no "start with the word X" (its first-word check also fixes the paragraph count): start_word
# keeps ours.
IFEVAL_IDS = {
    "lowercase": ("change_case:english_lowercase", lambda c: {}),
    "uppercase": ("change_case:english_capital", lambda c: {}),
    "max_words": ("length_constraints:number_words",
                  lambda c: {"num_words": c["n"] + 1, "relation": "less than"}),
    "min_words": ("length_constraints:number_words", lambda c: {"num_words": c["n"], "relation": "at least"}),
    "bullets": ("detectable_format:number_bullet_lists", lambda c: {"num_bullets": c["n"]}),
    "include_keyword": ("keywords:existence", lambda c: {"keywords": [c["word"]]}),
    "exclude_word": ("keywords:forbidden_words", lambda c: {"forbidden_words": [c["word"]]}),
    "end_phrase": ("startend:end_checker", lambda c: {"end_phrase": c["phrase"]}),
    "quotes": ("startend:quotation", lambda c: {}),
    "no_commas": ("punctuation:no_comma", lambda c: {}),
    "title": ("detectable_format:title", lambda c: {}),
    "postscript": ("detectable_content:postscript", lambda c: {"postscript_marker": "P.S."}),
}


@functools.cache
def ifeval_registry():
    """lm-eval's `instructions_registry.INSTRUCTION_DICT`, imported without lm-eval's task manager: lm-eval
    is installed --no-deps (its evaluator needs sacrebleu, datasets, ...), so `lm_eval.tasks` is bound to its
    folder before the import instead of running its __init__. IFEval's case checks use langdetect: seeded,
    so exact."""
    import importlib.util
    import sys
    import types
    import langdetect
    langdetect.DetectorFactory.seed = 0
    if "lm_eval.tasks" not in sys.modules:
        tasks = types.ModuleType("lm_eval.tasks")
        tasks.__path__ = [str(Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks")]
        sys.modules["lm_eval.tasks"] = tasks
    from lm_eval.tasks.ifeval import instructions_registry
    return instructions_registry.INSTRUCTION_DICT


def ifeval_check(c, response):
    """IFEval's checker of one constraint (ours for a type IFEval lacks); a malformed spec or a checker that
    raises on the response is False (model output is hostile input)."""
    if not isinstance(c, dict) or not isinstance(response, str):
        return False
    # outside the try: a missing lm-eval is an ImportError, not every check False
    registry = ifeval_registry()
    try:
        if c.get("type") not in IFEVAL_IDS:
            return bool(check_constraint(c, response))
        iid, kwargs = IFEVAL_IDS[c["type"]]
        checker = registry[iid](iid)
        checker.build_description(**kwargs(c))
        return bool(checker.check_following(response))
    except Exception:  # noqa: BLE001 -- a checker's assert or regex error on hostile text is a failed check
        return False


def eval_if_policy(sampler, tok, test_set, args, dist=None):
    """App. D's evaluation: greedy responses of the policy on held-out instructions, scored by IFEval's own
    checkers (`ifeval_check`, not the training checks): prompt-level strict accuracy (all constraints) and
    instruction-level accuracy. Each rank answers its share; all are gathered, in order."""
    dist = dist or Dist()
    idx = list(range(dist.rank, len(test_set), dist.world))
    ids = [chat_ids(tok, [{"role": "user", "content": test_set[i]["prompt"]}]) for i in idx]
    outs = sampler.generate(ids, 1, args.max_new_tokens, 0.0)
    sc = [c for _, c in sorted(gather_objects([(i, constraint_scores(test_set[i]["constraints"], o[0].text,
                                                                     ifeval_check))
                                               for i, o in zip(idx, outs)], dist), key=lambda x: x[0])]
    n_inst = sum(len(t["constraints"]) for t in test_set)
    return {"prompt_strict": sum(s["all"] for s in sc) / max(len(sc), 1),
            "inst_level": sum(sum(s["checks"]) for s in sc) / max(n_inst, 1),
            "per_prompt": [s["frac"] for s in sc]}


# --- answers built from a prompt's checkers (the SFT split; data/skill_rm/prepare.py too) ---

def repair_response(constraints, text):
    """Edit a model response until it satisfies every constraint (builds 'chosen' answers from real
    outputs)."""
    words = text.replace("\n", " ").split()
    types = {c["type"]: c for c in constraints}
    for c in constraints:
        if c["type"] == "exclude_word":
            words = [w for w in words if re.sub(r"\W", "", w).lower() != c["word"]]
    if "max_words" in types:
        extra = sum(len(_words(types[k].get("word", types[k].get("phrase", ""))))
                    for k in ("include_keyword", "end_phrase", "start_word") if k in types)
        words = words[:max(types["max_words"]["n"] - extra - 2, 3)]
    if "min_words" in types:
        filler = "This matters because small details shape how we see the world around us every day".split()
        while len(_words(" ".join(words))) < types["min_words"]["n"] + 2:
            words += filler
    out = " ".join(words).strip()
    if "no_commas" in types:
        out = out.replace(",", "")
    if "include_keyword" in types and not check_constraint(types["include_keyword"], out):
        out += f" It reminds me of a {types['include_keyword']['word']}."
    if "start_word" in types and not check_constraint(types["start_word"], out):
        out = types["start_word"]["word"] + " " + out
    if "bullets" in types:
        sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", out) if s.strip()] or [out]
        n = types["bullets"]["n"]
        sents = (sents * n)[:n] if len(sents) < n else sents[:n - 1] + [" ".join(sents[n - 1:])]
        out = "\n".join("* " + s.replace("*", "") for s in sents)
    if "end_phrase" in types and not check_constraint(types["end_phrase"], out):
        out = out.rstrip() + " " + types["end_phrase"]["phrase"]
    if "quotes" in types:
        out = '"' + out.replace('"', "'") + '"'
    if "lowercase" in types:
        out = out.lower()
    if "uppercase" in types:
        out = out.upper()
    return out


def break_response(constraint, text, rng):
    """Edit a response so that it violates `constraint` (builds 'rejected' answers)."""
    t = constraint["type"]
    if t == "lowercase":
        return "The " + text if text else "The End"
    if t == "uppercase":
        return text + " thank you."
    if t == "max_words":
        return text + " " + " ".join(["Also, there is much more to say about this topic."] * 8)
    if t == "min_words":
        return " ".join(text.split()[:8])
    if t == "bullets":
        return text + "\n* One more point."
    if t == "include_keyword":
        return re.sub(r"\b" + re.escape(constraint["word"]) + r"\b", "thing", text, flags=re.I)
    if t == "exclude_word":
        return text + f" It is {constraint['word']}."
    if t == "end_phrase":
        return text + " Have a great day."
    if t == "quotes":
        return text.strip('"')
    if t == "start_word":
        return "Well, " + text
    if t == "no_commas":
        return text.replace(". ", ", and ", 1) if ". " in text else text + ", indeed"
    return text + " ?"


MATH_SPLITS = ("bench-math", "bench-focus", "bon-math", "sft-math", "sft-focus")


def math_items(split, seed, n):
    """reasoning-gym chain_sum problems (1-2 digits, 2-3 terms) with their gold answers, disjoint across
    splits: reasoning-gym seeds item i with seed + i, so each (split, seed) reads its own seed range,
    (split index + 1)·10⁸ + 10⁴·seed; and as small problems recur under any seed, a split keeps only
    the problems whose prompt hashes to it (crc32 mod the number of splits)."""
    import reasoning_gym
    if not (0 <= seed < 10_000 and n <= 1000):
        raise ValueError(f"math_items: seed {seed} / n {n} outside the split's range "
                         "(seed < 10000, n ≤ 1000)")
    k = MATH_SPLITS.index(split)
    ds = reasoning_gym.create_dataset("chain_sum", seed=(k + 1) * 10 ** 8 + 10_000 * seed, size=10 * n,
                                      min_terms=2, max_terms=3, min_digits=1, max_digits=2)
    out, seen = [], set()
    for e in ds:
        prompt = e["question"] + " Give the final answer as a number."
        if zlib.crc32(prompt.encode()) % len(MATH_SPLITS) == k and prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "answer": str(e["answer"]), "entry": e, "ds": ds})
        if len(out) == n:
            return out
    raise ValueError(f"math_items: only {len(out)} of {n} problems of split {split} in its seed range")


MATH_STYLES = [  # chosen and rejected answers of one item share a style: only the value differs
    "{expr} = {v}. The answer is {v}.",
    "Adding the terms from left to right gives {v}. So {expr} = {v}, and the final answer is {v}.",
    "Let me compute it step by step: {expr} = {v}.\nFinal answer: {v}",
]


def math_pair(m, rng):
    """One math item: the correct worked answer and three wrong ones in the same style."""
    style, expr, v = rng.choice(MATH_STYLES), m["entry"]["metadata"]["expression"], int(m["answer"])
    wrong = rng.sample([v + d for d in (-10, -3, -2, -1, 1, 2, 3, 10)], 3)
    return style.format(expr=expr, v=v), [style.format(expr=expr, v=w) for w in wrong]


def polished_wrong(answer, rng):
    """A long, confident, well-formatted answer with a wrong final number (style-bias case)."""
    wrong = int(float(answer)) + rng.choice([-3, -2, -1, 1, 2, 3])
    return ("Great question! Let's work through this carefully, step by step, so that nothing is missed.\n\n"
            "**Step 1.** Read the expression from left to right and keep track of every sign.\n"
            "**Step 2.** Combine the terms one at a time, double-checking each intermediate result.\n"
            "**Step 3.** Verify the total once more to be completely sure.\n\n"
            f"Putting it all together, the final answer is **{wrong}**. I am confident this is correct, and "
            "I hope this detailed explanation helps!")


def sft_items(seed, n):
    """Judge-SFT split, built without a model from seeds the benchmark never uses: precise_if (a
    repaired answer vs. one with a constraint broken), math (same-style pairs), focus (short
    right vs. polished wrong); n items per category."""
    rng, items = random.Random(f"sft-{seed}"), []
    for k, p in enumerate(if_prompts(seed, n, "sft")):
        base = rng.choice(["I think this is a lovely idea and I would enjoy it a lot.",
                           "Here is my answer. It is short and clear, and it covers the main point."])
        chosen = repair_response(p["constraints"], base)
        rejected = [break_response(c, chosen, rng) for c in rng.choices(p["constraints"], k=3)]
        items.append({"id": f"sft-if-{k}", "category": "precise_if", "prompt": p["prompt"], "chosen": chosen,
                      "rejected": rejected, "meta": {"constraints": p["constraints"]}})
    for k, m in enumerate(math_items("sft-math", seed, n)):
        chosen, rejected = math_pair(m, rng)
        items.append({"id": f"sft-math-{k}", "category": "math", "prompt": m["prompt"], "chosen": chosen,
                      "rejected": rejected, "meta": {"answer": m["answer"],
                                                     "expression": m["entry"]["metadata"]["expression"]}})
    for k, m in enumerate(math_items("sft-focus", seed, n)):
        rejected = [polished_wrong(m["answer"], rng)] + [f"The answer is {int(m['answer']) + d}."
                                                         for d in (-1, 1)]
        items.append({"id": f"sft-focus-{k}", "category": "focus", "prompt": m["prompt"],
                      "chosen": f"The answer is {m['answer']}.", "rejected": rejected,
                      "meta": {"answer": m["answer"], "expression": m["entry"]["metadata"]["expression"]}})
    return items


# --- the benchmark files (written by data/skill_rm/prepare.py) ---

def read_jsonl(path):
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{i + 1}: not valid JSON ({e.msg}); "
                                 "rebuild with data/skill_rm/prepare.py")
    return rows


def write_jsonl(path, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


def select_items(items, per_cat, seed=0):
    """per_cat items of each category drawn with the run's seed (0 or more than there are = all), so
    seeded runs judge different items; categories in a fixed order."""
    cats = {}
    for it in items:
        cats.setdefault(it["category"], []).append(it)
    pick = lambda c, xs: (random.Random(f"select-{seed}-{c}").sample(xs, per_cat)
                          if 0 < per_cat < len(xs) else xs)
    return [it for c in sorted(cats) for it in pick(c, cats[c])]


# --- best-of-N by JETTS sequential pairwise knockout (§5), with its baselines random@N and oracle@N ---

def knockout_schedule(N, seed, pool_id):
    """JETTS sequential knockout, seeded: candidate order, A/B flip per match, tie-break coin per match."""
    rng = random.Random(f"{seed}-{pool_id}")
    order = rng.sample(range(N), N)
    flips = [rng.random() < 0.5 for _ in range(N - 1)]
    coins = [rng.random() < 0.5 for _ in range(N - 1)]
    return order, flips, coins


def sequential_knockout(pool_scores, judge_batch, seed, ks):
    """Best-of-N by sequential pairwise knockout (§5, JETTS protocol).

    The first candidate of a seeded order is the incumbent; each next one challenges
    it in a seeded A/B order; the judged winner stays; a Tie or invalid verdict is a
    seeded coin. `judge_batch([(pool, a, b), ...]) -> ['A' | 'B' | other, ...]` judges
    one match per pool per round (all pools in one batch).
    Returns seqko@k = mean over pools of the incumbent's true score after k candidates."""
    P = len(pool_scores)
    N = min(len(s) for s in pool_scores)
    sched = [knockout_schedule(N, seed, p) for p in range(P)]
    inc = [s[0][0] for s in sched]
    at = {1: [pool_scores[p][inc[p]] for p in range(P)]}
    for r in range(1, N):
        reqs, sides = [], []
        for p in range(P):
            order, flips, _ = sched[p]
            a, b = (order[r], inc[p]) if flips[r - 1] else (inc[p], order[r])
            reqs.append((p, a, b)), sides.append((a, b))
        verdicts = judge_batch(reqs)
        for p, v in enumerate(verdicts):
            a, b = sides[p]
            if v not in ("A", "B"):
                v = "A" if sched[p][2][r - 1] else "B"  # invalid or tie: seeded random pick
            inc[p] = a if v == "A" else b
        if r + 1 in ks:
            at[r + 1] = [pool_scores[p][inc[p]] for p in range(P)]
    out = {f"seqko@{k}": sum(at[k]) / P for k in sorted(at) if k in ks}
    # random@N: expected true score of a uniformly random pick; oracle@N: the pool's best
    out[f"random@{N}"] = sum(sum(s[:N]) / N for s in pool_scores) / P
    out[f"oracle@{N}"] = sum(max(s[:N]) for s in pool_scores) / P
    out["per_pool"] = {f"seqko@{N}": at[N], f"random@{N}": [sum(s[:N]) / N for s in pool_scores],
                       f"oracle@{N}": [max(s[:N]) for s in pool_scores]}
    return out


# --- the benchmark's presentation and answer contract (MT-Bench / RewardBench2 wording, B.3), the plain
# LLM-as-a-judge prompt, and the contract as the JSON schema of a final answer ---

LABELS = "ABCDEFGHIJ"
CRITERIA = ("helpfulness, relevance, accuracy, depth, creativity and level of detail, and whether every "
            "instruction of the user is followed")


def format_candidates(prompt, candidates):
    """MT-Bench / RewardBench style layout; K = 1 is a single response."""
    if len(candidates) == 1:
        return (f"[User Question]\n{prompt}\n\n[The Start of the Response]\n{candidates[0]}\n"
                "[The End of the Response]")
    parts = [f"[User Question]\n{prompt}\n"]
    for lab, c in zip(LABELS, candidates):
        parts.append(f"[The Start of Assistant {lab}'s Answer]\n{c}\n[The End of Assistant {lab}'s Answer]\n")
    return "\n".join(parts)


def final_example(mode, K):
    """The final answer's shape in words, as every judge's prompt states it (the schema of final_schema)."""
    if mode == "pointwise":
        return '{"score": S} with S from 0 to 1 (satisfied constraints / all constraints, e.g. 0.75)'
    if mode == "pairwise":
        return ('{"verdict": "A"} if A is better, {"verdict": "B"} if B is better, '
                '{"verdict": "Tie"} if neither is')
    return '{"choice": "X"} where X is one of ' + ", ".join(LABELS[:K])


def contract_text(mode, K):
    """The benchmark contract: what final answer the judge must give (B.3)."""
    return "final_answer " + final_example(mode, K)


def plain_system_prompt(mode, K):
    """Direct LLM-as-a-judge prompt (MT-Bench / RewardBench2 wording, B.3), one turn."""
    if mode == "pointwise":
        return ("Please act as an impartial judge and evaluate how well the response follows every "
                "instruction of the user. Be as objective as possible. Give the share of the instructions "
                'that the response follows as a score from 0 to 1, strictly in this format: {"score": 0.75}.')
    return ("Please act as an impartial judge and evaluate the quality of the responses provided by AI "
            "assistants to the user question displayed below. Choose the assistant that follows the user's "
            f"instructions and answers the question better, considering {CRITERIA}. Avoid any position "
            "biases; do not let the length of the responses or the names of the assistants influence you. "
            "Be as objective as possible. Output your final verdict by strictly following this format: "
            + final_example(mode, K) + ".")


# pointwise scores the judge may give: the eighths 0, 0.125, …, 0.875, 1 (#49 §4). xgrammar (vLLM's grammar,
# and GrammarReplay's) writes an enum's numbers with 17 significant digits, tenths too (0.7 as
# 0.69999999999999996, a text neither the HF sampler nor a scripted trace writes); an eighth is binary-exact,
# so %.17g and json_text write it alike. The ends are integers: xgrammar writes an enum's 1.0 as "1"
SCORE_GRID = [0] + [k / 8 for k in range(1, 8)] + [1]
FINAL_KEYS = ("verdict", "choice", "score")


def grid_score(sat, tot):
    """sat / tot as a score on SCORE_GRID: the nearest eighth (Python's round; no total → 1, as
    readout_pointwise). The scripted judge's final score and the reports it follows (python_check_code;
    text_checks.py, a sandboxed script, writes the same line) all round with it."""
    return SCORE_GRID[min(max(round(8 * sat / tot), 0), 8)] if tot > 0 else 1


def schema_object(props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


MAX_CHECKLIST = 6  # checklist form: satisfied_count ≤ total_count ≤ this (our prompts hold ≤ 3 constraints)


def final_schema(mode, K, checklist=False):
    """A final answer: {"verdict": "A"|"B"|"Tie"} (§3's pairwise readout has a tie), {"choice": "A".."D"}
    or {"score": 0..1} (on SCORE_GRID); checklist adds the form {"satisfied_count": s, "total_count": t}
    (§3's checklist readout, what the instruction-following skill asks for)."""
    if mode == "pointwise":
        score = schema_object({"score": {"enum": SCORE_GRID}})
        if not checklist:
            return score
        counts = [schema_object({"satisfied_count": {"enum": list(range(t + 1))},
                                 "total_count": {"const": t}}) for t in range(1, MAX_CHECKLIST + 1)]
        return {"anyOf": [score] + counts}
    if mode == "pairwise":
        return schema_object({"verdict": {"enum": ["A", "B", "Tie"]}})
    return schema_object({"choice": {"enum": list(LABELS[:K])}})


# --- a judgment: the candidates a judge is shown and its whole trace (skill_rm.run_judges fills it); the
# benchmark's and the SFT split's judgments ---

@dataclass
class JudgeTask:
    """One judgment: K candidates for one prompt, judged by one method; keeps the whole trace."""
    prompt: str
    candidates: list
    mode: str                   # pointwise (K = 1) | pairwise (K = 2) | selection (K ≥ 2)
    method: str                 # baseline | appended | python_only | skill_rm | oracle (scripted: the label)
    label: object = None        # the correct final answer ("A", "C", 0.75); only the oracle judge reads it
    category: str = ""          # benchmark category (picks the oracle's verifier)
    scripted: bool = False      # replies come from scripted_reply (the oracle; SFT traces), not a model
    meta: dict = field(default_factory=dict)  # the SFT item's meta (constraints, expression): scripted only
    messages: list = field(default_factory=list)
    schemas: list = field(default_factory=list)  # the JSON schema of each assistant turn (--constrained)
    trace: list = field(default_factory=list)
    skill: object = None        # the loaded Skill, if any
    n_viewed: int = 0
    retries_left: int = 1
    force: bool = False         # the next reply must be final_answer
    force_asked: bool = False
    done: bool = False
    judgment: object = None     # final structured judgment (dict) or None (invalid)
    turns: int = 0
    tool_calls: int = 0


def benchmark_tasks(items, methods, formats, seed):
    """Judge tasks for every (item, method, format): pairwise in both orders; best-of-4 seeded shuffle."""
    tasks, meta = [], []
    for it in items:
        for method in methods:
            if "pairwise" in formats:
                for order in (0, 1):  # order 0: chosen shown as A; order 1: chosen shown as B
                    cands = ([it["chosen"], it["rejected"][0]] if order == 0
                             else [it["rejected"][0], it["chosen"]])
                    tasks.append(JudgeTask(it["prompt"], cands, "pairwise", method, label="AB"[order],
                                           category=it["category"]))
                    meta.append((it["id"], it["category"], method, "pairwise", order))
            if "best_of_4" in formats:
                cands = [it["chosen"]] + it["rejected"][:3]
                perm = random.Random(f"{seed}-{it['id']}").sample(range(4), 4)
                tasks.append(JudgeTask(it["prompt"], [cands[i] for i in perm], "selection", method,
                                       label=LABELS[perm.index(0)], category=it["category"]))
                meta.append((it["id"], it["category"], method, "best_of_4", LABELS[perm.index(0)]))
    return tasks, meta


def judge_sft_tasks(items, method, seed):
    """Scripted judge tasks on the SFT split: each item pairwise (random order), best-of-4 (random
    permutation) and, for precise_if, pointwise on the chosen and on one rejected answer."""
    rng, tasks = random.Random(seed), []
    for it in items:
        flip = rng.random() < 0.5
        pair = [it["rejected"][0], it["chosen"]] if flip else [it["chosen"], it["rejected"][0]]
        tasks.append(JudgeTask(it["prompt"], pair, "pairwise", method, "AB"[flip], it["category"],
                               scripted=True, meta=it["meta"]))
        perm = rng.sample(range(4), 4)
        cands = [it["chosen"]] + it["rejected"][:3]
        tasks.append(JudgeTask(it["prompt"], [cands[i] for i in perm], "selection", method,
                               LABELS[perm.index(0)], it["category"], scripted=True, meta=it["meta"]))
        if it["category"] == "precise_if":
            for r in (it["chosen"], it["rejected"][0]):
                checks = constraint_scores(it["meta"]["constraints"], r)["checks"]
                label = {"satisfied_count": sum(checks), "total_count": len(checks)}  # the checklist form
                tasks.append(JudgeTask(it["prompt"], [r], "pointwise", method, label, it["category"],
                                       scripted=True, meta=it["meta"]))
    return tasks


def format_trace(task):
    """The whole trace of one judgment, for printing."""
    out = [f"=== {task.method} judge, mode {task.mode}, K={len(task.candidates)}, turns {task.turns}, "
           f"skill {task.skill.name if task.skill else '-'}, resources viewed {task.n_viewed} ==="]
    for step in task.trace:
        out.append(f"[turn {step['turn']}] action: {step['action'].strip()[:600]}")
        if step["call"]:
            out.append(f"   parsed call: {json.dumps(step['call'])[:300]}")
        if step["observation"]:
            out.append(f"   observation: {step['observation'].strip()[:600]}")
    out.append(f"final judgment: {json.dumps(task.judgment)[:400]}")
    return "\n".join(out)


def tool_counts(task):
    """{tool name: calls} over one judgment's trace."""
    out = {}
    for step in task.trace:
        if step["call"]:
            out[step["call"]["name"]] = out.get(step["call"]["name"], 0) + 1
    return out


# --- the scripted judge: the oracle upper bound of the tables and the SFT traces ---

def oracle_skill(task):
    """The skill the scripted judge loads: the instruction-following skill for instructions with
    constraints (any mode), the fair judge otherwise."""
    if task.mode == "pointwise" or task.category == "precise_if":
        return "instruction_following_pointwise"
    return "reward_judge_fair"


def oracle_verifier(task):
    """The verifier the scripted judge runs for a task (None: no checker applies, e.g. code);
    "python_sandbox": it writes the check itself (MATH_CHECK_CODE). Math and focus items share their
    arithmetic prompts, so both get the sandbox, as the fair skill's step 3 says: one tool per prompt
    kind, or the SFT judge learns whichever tool its traces use more often."""
    if oracle_skill(task) == "instruction_following_pointwise":
        return "text_checks"
    return "python_sandbox" if task.category in ("math", "focus") else None


# the scripted judge's own check of an arithmetic item: recompute the sum, name the candidates whose last
# number matches
# the report of a math check: the value v, and the candidates whose last number is v
MATCH_REPORT = ("print(v, 'matches:', [l for l, c in zip('ABCD', candidates) "
                "if re.findall(r'-?\\d+', c)[-1:] == [v]])")
MATH_CHECK_CODE = ("import re\n"
                   "e = prompt.split(':')[1].split('=')[0]\n"
                   "v = str(sum(int(t.replace(' ', '')) for t in re.findall(r'[-+]? *\\d+', e)))\n"
                   + MATCH_REPORT)


def constraint_test(c):
    """One constraint as the Python test a judge reading the prompt would write, over the stripped candidate
    x (w: its words), deciding it as check_constraint does; None for a type it has no test for."""
    t, n, word = c.get("type"), c.get("n"), str(c.get("word", ""))
    found = "re.search(" + repr(r"\b" + re.escape(word) + r"\b") + ", x, re.I)"
    return {"lowercase": "x == x.lower() != x.upper()", "uppercase": "x == x.upper() != x.lower()",
            "max_words": f"len(w(x)) <= {n}", "min_words": f"len(w(x)) >= {n}",
            "bullets": f"len([l for l in x.splitlines() if re.match(r'\\s*\\*\\s', l)]) == {n}",
            "include_keyword": f"bool({found})", "exclude_word": f"not {found}",
            "end_phrase": f"x.lower().endswith({str(c.get('phrase', '')).lower()!r})",
            "quotes": "len(x) > 1 and x[0] == x[-1] == '\"'", "no_commas": "',' not in x",
            "start_word": f"[t.lower() for t in w(x)[:1]] == [{word.lower()!r}]"}.get(t)


def python_check_code(task):
    """python_only's own check of an SFT item (#49 §2), written for the item as a judge that reads the prompt
    would write it, with no skill or verifier to run: math and focus, the prompt's expression recomputed and
    the candidates whose last number matches (MATH_CHECK_CODE's report); precise_if, one test per stated
    constraint (constraint_test) and the passes per candidate, in text_checks' report form ("matches: ['A']";
    pointwise "A: 2 of 3 pass; score 0.625", grid_score's value for the pass count, from a table). None
    where it has no check."""
    meta = task.meta or {}
    if task.category in ("math", "focus") and meta.get("expression"):
        return f"import re\nv = str({meta['expression']})\n" + MATCH_REPORT
    tests = [constraint_test(c) for c in meta.get("constraints", [])]
    if not tests or None in tests:
        return None
    k = len(tests)
    code = ("import re\nw = lambda x: re.findall(r\"[A-Za-z0-9']+\", x)\n"
            f"n = [sum([{', '.join(tests)}]) for x in (c.strip() for c in candidates)]\n")
    if task.mode == "pointwise":
        grid = [grid_score(s, k) for s in range(k + 1)]  # by pass count, e.g. [0, 0.375, 0.625, 1]
        return code + f"print('A:', n[0], 'of {k} pass; score', {grid}[n[0]])"
    return code + f"print(n, 'of {k} pass; matches:', [l for l, s in zip('ABCD', n) if s == max(n)])"


def scripted_final(task, checklist):
    """The known label as a final answer; a checklist label {"satisfied_count", "total_count"} becomes
    a score where the schema has no checklist form (checklist False: plain judges)."""
    if isinstance(task.label, dict):
        if checklist:
            return dict(task.label)
        return {"score": grid_score(task.label["satisfied_count"], task.label["total_count"])}
    return {{"pointwise": "score", "pairwise": "verdict"}.get(task.mode, "choice"): task.label}


def scripted_reply(task, checklist):
    """The scripted judge's next reply to a skill_rm.JudgeTask: use_skill → run_verifier or python_sandbox
    (math) → final_answer with the known label (plain methods: the final answer at once; python_only:
    python_sandbox with its own check, python_check_code, → final_answer). checklist: the loaded skill asks
    for the checklist form (skill_rm.asks_checklist)."""
    if task.method in ("baseline", "appended") or task.force:
        return json_text(scripted_final(task, checklist))  # compact, as the turn schema decodes it
    ran = any(step["call"] and step["call"]["name"] in ("run_verifier", "python_sandbox")
              for step in task.trace)
    if task.method == "python_only" and not ran and (code := python_check_code(task)):
        return json_text({"name": "python_sandbox", "arguments": {"code": code}})
    if task.method == "python_only":
        return json_text({"name": "final_answer", "arguments": scripted_final(task, checklist)})
    if task.skill is None:
        return json_text({"name": "use_skill", "arguments": {"name": oracle_skill(task)}})
    check = oracle_verifier(task)
    if not ran and check == "python_sandbox":
        return json_text({"name": "python_sandbox", "arguments": {"code": MATH_CHECK_CODE}})
    if not ran and check and task.skill.resource(check):
        return json_text({"name": "run_verifier", "arguments": {"id": check}})
    return json_text({"name": "final_answer", "arguments": scripted_final(task, checklist)})


def pooled(res, method, fmt, key="score"):
    """One metric of a method and format pooled over categories, weighted by items (nan if absent)."""
    rows = [r for (m, f, _), r in res.items() if m == method and f == fmt and key in r and r[key] == r[key]]
    n = sum(r["n"] for r in rows)
    return sum(r[key] * r["n"] for r in rows) / n if n else float("nan")


def bench_items(res, method, fmt, key="items"):
    """{item id: value} of one method and format over every category."""
    out = {}
    for (m, f, _), r in res.items():
        if m == method and f == fmt:
            out.update(r.get(key, {}))
    return out


# --- the benchmark sets (dev, held-out), their clusters, and the baselines computed with no model (#49) ---

BENCH_SETS = ("heldout", "dev")  # the headline set first; dev is reported beside it
# dev (bench.jsonl) items carry no template id: one prompt template per category, and math and focus share
# reasoning-gym's chain_sum prompt, so they are one behaviour (one cluster), not 24 data points
DEV_TEMPLATES = {"precise_if": "dev/if-render", "math": "dev/chain_sum", "focus": "dev/chain_sum",
                 "code": "dev/code-complete"}


def item_cluster(it):
    """An item's cluster for the bootstrap: its prompt template (held-out items name theirs in meta), else the
    dev set's template of its category, else the category."""
    tpl = (it.get("meta") or {}).get("template")
    return f"{it['category']}/{tpl}" if tpl else DEV_TEMPLATES.get(it["category"], it["category"])


# The coin's tie rule: each order independently says A, B or Tie with probability (1 − t)/2, (1 − t)/2, t.
# A pair is won when the two orders' sum is > 0 (§3 readout), so a tie plus one correct order also wins:
#   P(win) = p² + 2pt with p = (1 − t)/2, i.e. (1 − t)(1 + 3t)/4: 1/4 at t = 0 (a two-way coin), 1/3 at
#   t = 1/3 (a uniform three-way coin), and 1/3 is the largest any t gives (d/dt = 0 at t = 1/3).
# The coin baseline is the three-way one (the judges' contract offers Tie): pairwise 1/3, each order 1/3,
# consistency 2p² = 2/9. Best-of-4: a uniform pick, 1/4.
COIN_TIE = 1 / 3


def coin_pair(tie=COIN_TIE):
    """Exact pairwise expectations of the coin with tie probability `tie`: pair win, accuracy per order,
    consistency (both orders name the same answer)."""
    p = (1 - tie) / 2
    return {"win": p * p + 2 * p * tie, "order": p, "consistent": 2 * p * p}


def null_group_sd(variant, G):
    """The within-group reward sd a judge with no signal gives. Anchored pairwise: a position-locked
    judge (always "A") with the rollout shown at a random side pays 1 with probability ½ per rollout,
    so E[sd] = Σ_k C(G,k) 2^-G √(k/G · (1 − k/G)) (0.404 at G = 4). Pointwise: a constant score, sd 0."""
    if variant != "anchored":
        return 0.0
    return sum(math.comb(G, k) / 2 ** G * (k / G * (1 - k / G)) ** 0.5 for k in range(G + 1))


def report_winners(text, labels):
    """The candidates a verifier report names as the winners: lines with "match…" or "most constraints pass"
    (MATH_CHECK_CODE's "96 matches: ['A']", math_recompute's "… matches the expected value: A", text_checks'
    "most constraints pass: tie (A, B)"), read after their last ':'; "Tie" when such a line says tie."""
    named = set()
    for line in (text or "").splitlines():
        if ":" in line and re.search(r"match\w*|most constraints pass", line):
            tail = line.rsplit(":", 1)[1]
            named |= set(re.findall(r"\b([" + labels + r"])\b", tail))
            named |= {"Tie"} if "tie" in tail.lower() else set()
    return named


SKILLS_DIR = DATA.parent / "skills"
# The checker-only baseline's scripts, in the order it tries them: the skill's own verifier of instructions,
# the arithmetic check the scripted judge writes (MATH_CHECK_CODE, what the SFT traces teach), the fair
# skill's own recompute tool. applies(report, prompt): the script recognised the prompt (text_checks found a
# constraint; MATH_CHECK_CODE's slice between the first ':' and '=' is a sum of integers and nothing else;
# math_recompute found an expression); the first that applies decides (one winner named) or makes the item
# a Tie. None applying is a Tie too (code: no script of either skill runs a candidate).
_SUM = re.compile(r"[\s\d+-]*\d[\s\d+-]*")


def _math_check_applies(out, prompt):
    seg = prompt.split(":")[1].split("=")[0] if ":" in prompt else ""
    return "matches:" in out and "error" not in out and _SUM.fullmatch(seg) is not None


CHECKER_SCRIPTS = (
    ("text_checks", "instruction_following_pointwise/verifiers/text_checks.py",
     lambda out, prompt: "constraints found:" in out and "constraints found: none" not in out),
    ("math_check_code", None, _math_check_applies),
    ("math_recompute", "reward_judge_fair/scripts/math_recompute.py",
     lambda out, prompt: "expected:" in out and "expected: None" not in out and "error" not in out),
)


@functools.cache
def _script_code(name, skills_dir):
    path = dict((n, p) for n, p, _ in CHECKER_SCRIPTS)[name]
    return MATH_CHECK_CODE if path is None else (Path(skills_dir) / path).read_text()


def run_script(code, prompt, candidates):
    """A checker script's report (stdout; an exception's name appended as 'error: …'). The scripts are the
    repository's own (skills, MATH_CHECK_CODE) and read the item as data: run in-process, with the sandbox's
    variables (prompt, candidates, response, sample)."""
    import contextlib
    import io
    buf = io.StringIO()
    ns = {"prompt": prompt, "candidates": list(candidates), "response": candidates[0],
          "sample": {"prompt": prompt, "candidates": list(candidates)}}
    try:
        with contextlib.redirect_stdout(buf):
            exec(code, ns)  # noqa: S102 -- trusted repository scripts over benchmark data
    except Exception as e:  # noqa: BLE001 -- a script failing on a prompt it does not parse: not applicable
        buf.write(f"\nerror: {type(e).__name__}")
    return buf.getvalue()


def checker_pick(prompt, candidates, skills_dir=SKILLS_DIR):
    """Checker-only (no model): run CHECKER_SCRIPTS in order on the item; the first whose report applies
    decides. Returns (the set of candidates its report names, excluding 'Tie', or None when no script
    applies, the deciding script or None)."""
    labels = LABELS[:len(candidates)]
    for name, _, applies in CHECKER_SCRIPTS:
        out = run_script(_script_code(name, str(skills_dir)), prompt, candidates)
        if applies(out, prompt):
            return report_winners(out, labels) - {"Tie"}, name
    return None, None


def baseline_pick(name, prompt, candidates, skills_dir=SKILLS_DIR):
    """A no-model baseline's answer as {label: probability} over the candidates' labels (an empty dict: a
    tie / no pick). first: always A (position-locked); shorter / longer: the fewest / most characters (after
    strip), uniform over the tied; checker: checker_pick's named set, uniform over it when it names fewer
    than all; coin is exact and handled by baseline_scores. Also returns the deciding script (checker)."""
    labels = LABELS[:len(candidates)]
    uniform = lambda xs: {x: 1 / len(xs) for x in xs} if 0 < len(xs) < len(labels) else {}
    if name == "first":
        return {"A": 1.0}, None
    if name in ("shorter", "longer"):
        n = [len(c.strip()) for c in candidates]
        best = min(n) if name == "shorter" else max(n)
        return uniform([lab for lab, k in zip(labels, n) if k == best]), None
    if name == "checker":
        named, script = checker_pick(prompt, candidates, skills_dir)
        return uniform(sorted(named or ())), script
    raise ValueError(f"unknown baseline '{name}' (one of {', '.join(BASELINES)})")


BASELINES = ("coin", "first", "shorter", "longer", "checker")


def _pair_expectations(d0, d1):
    """Pairwise §3 readout in expectation: d0 / d1 are {+1, −1, 0: probability} for the orders with the chosen
    first / second, independent; a pair is won when the sum is > 0 (skill_rm.readout_pairwise)."""
    win = sum(p * q for a, p in d0.items() for b, q in d1.items() if a + b > 0)
    same = d0.get(1, 0) * d1.get(1, 0) + d0.get(-1, 0) * d1.get(-1, 0)
    return {"win": win, "order_A": d0.get(1, 0.0), "order_B": d1.get(1, 0.0), "consistent": same}


def baseline_scores(items, formats, seed, names=BASELINES, skills_dir=SKILLS_DIR):
    """The no-model baselines on the items the judges see, in the same presentations (pairwise both orders:
    the chosen as A, then as B; best-of-4 with benchmark_tasks' seeded permutation), scored as the §3
    readouts score a judge, exactly (in expectation over a baseline's own randomness). Returns
    {(name, format, category): row} with score_benchmark's keys (score, valid, consistent, order_A, order_B,
    items, items_consistent, n, n_judgments) and, for checker, decided_by {script: judgments}."""
    coin = coin_pair()
    acc = {}
    for it in items:
        for name in names:
            for fmt in formats:
                row = acc.setdefault((name, fmt, it["category"]), {"score": [], "valid": [], "items": {},
                                                                   "decided_by": {}})
                if fmt == "pairwise":
                    if name == "coin":
                        r = {"win": coin["win"], "order_A": coin["order"], "order_B": coin["order"],
                             "consistent": coin["consistent"]}
                    else:
                        signed = []
                        for order in (0, 1):
                            cands = ([it["chosen"], it["rejected"][0]] if order == 0
                                     else [it["rejected"][0], it["chosen"]])
                            pick, script = baseline_pick(name, it["prompt"], cands, skills_dir)
                            row["decided_by"][str(script)] = row["decided_by"].get(str(script), 0) + 1
                            good, bad = "AB"[order], "BA"[order]
                            d = {1: pick.get(good, 0.0), -1: pick.get(bad, 0.0)}
                            signed.append(d | {0: 1 - d[1] - d[-1]})
                        r = _pair_expectations(*signed)
                    for k in ("order_A", "order_B", "consistent"):
                        row.setdefault(k, []).append(r[k])
                    row["score"].append(r["win"]), row["valid"].append(1.0)
                    row["items"][it["id"]] = r["win"]
                    row.setdefault("items_consistent", {})[it["id"]] = r["consistent"]
                elif fmt == "best_of_4":
                    cands = [it["chosen"]] + it["rejected"][:3]
                    perm = random.Random(f"{seed}-{it['id']}").sample(range(4), 4)  # as benchmark_tasks
                    shown, correct = [cands[i] for i in perm], LABELS[perm.index(0)]
                    if name == "coin":
                        s = 1 / len(shown)
                    else:
                        pick, script = baseline_pick(name, it["prompt"], shown, skills_dir)
                        row["decided_by"][str(script)] = row["decided_by"].get(str(script), 0) + 1
                        s = pick.get(correct, 0.0) if pick else 1 / len(shown)  # no pick: the readout's 1/K
                    row["score"].append(s), row["valid"].append(1.0)
                    row["items"][it["id"]] = s
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    out = {}
    for k, row in acc.items():
        r = {m: (v if m.startswith("items") or m == "decided_by" else mean(v)) for m, v in row.items()}
        if k[0] != "checker":
            r.pop("decided_by")
        out[k] = r | {"n": len(row["score"]),
                      "n_judgments": len(row["score"]) * (2 if k[1] == "pairwise" else 1)}
    return out


# --- the benchmark's report: tables, chance lines, warnings and headline entries (skill_rm.benchmark and
# build_headline call these; the statistics are stats.py's) ---

MODEL_JUDGES = ("baseline", "appended", "python_only", "skill_rm")  # a model judges (the oracle is scripted)
# Chance lines: the most a label-blind coin scores. Pairwise: each order says A, B or Tie independently, and
# a tie plus one right order wins the pair, so a coin with tie rate t wins (1 − t)(1 + 3t)/4, at most 1/3
# (t = 1/3; a two-way coin, t = 0: 1/4) — coin_pair; consistency: at most 1/2 (t = 0);
# best-of-4: a uniform pick, 1/4.
COIN = {"pairwise": coin_pair()["win"], "best_of_4": 0.25, "consistent": coin_pair(0.0)["consistent"]}


def judge_warnings(res, methods):
    """What makes a table meaningless, per model judge: position-locked (pairwise consistency 0), at chance
    (not above the 1/3 coin at p < 0.05, exact binomial), never a tool call (tool-using methods)."""
    out = []
    for m in [m for m in methods if m in MODEL_JUDGES]:
        cons, wins = bench_items(res, m, "pairwise", "items_consistent"), bench_items(res, m, "pairwise")
        if cons and sum(cons.values()) == 0:
            out.append(f"{m}: position-locked (pairwise consistency 0 over {len(cons)} items)")
        if wins and not above_chance(list(wins.values())):
            out.append(f"{m}: at chance (pairwise {sum(wins.values()):.0f}/{len(wins)} vs coin "
                       f"{100 * COIN['pairwise']:.0f} %)")
        if m in ("python_only", "skill_rm") and not any(r.get("calls", 0) > 0 for (mm, _, _), r in res.items()
                                                        if mm == m):
            out.append(f"{m}: never called a tool")
    return out


def above_chance(wins, chance=None, alpha=0.05):
    """0/1 pair wins above the pairwise coin: the rate exceeds it and the exact binomial p < alpha."""
    chance = COIN["pairwise"] if chance is None else chance
    k, n = int(sum(wins)), len(wins)
    return n > 0 and k / n > chance and binomial_p(k, n, chance) < alpha


def template_copy_warnings(by_set, methods, fmt="pairwise"):
    """The signature of a judge that copies a rule of the dev set's templates instead of judging (#49): on
    dev it scores at least what checker-only (the scripts that made the dev labels) scores, yet on some
    held-out category it is not above the coin (above_chance). One warning per (judge, category)."""
    dev, held = by_set.get("dev"), by_set.get("heldout")
    if not dev or not held:
        return []
    out, ceiling = [], pooled(dev, "checker", fmt)
    for m in [m for m in methods if m in MODEL_JUDGES]:
        acc = pooled(dev, m, fmt)
        if not acc == acc or not acc >= ceiling - 1e-9:
            continue
        for (mm, f, cat), r in sorted(held.items()):
            wins = list(r.get("items", {}).values()) if (mm, f) == (m, fmt) else []
            if wins and not above_chance(wins):
                out.append(f"{m}: copies a dev-set rule? {fmt} {100 * acc:.0f} % on dev ≥ checker-only "
                           f"{100 * ceiling:.0f} %, but at chance on held-out {cat} "
                           f"({sum(wins):.0f}/{len(wins)} vs coin {100 * COIN[fmt]:.0f} %)")
    return out


def clustered(e):
    """A single run's headline entry recomputed over its clusters (the templates in item_ids) when several
    items share one, as stats.aggregate does for items that recur over seeds: CI by cluster bootstrap, p by
    sign flip of the cluster means, mde on the clusters. Pooled seeds (n_seeds > 1) are stats' business."""
    ids = e.get("item_ids")
    if not ids or e["n_seeds"] > 1 or len(set(ids)) == len(ids) or math.isnan(e["p"]):  # nan: no test
        return e
    a = np.asarray(e["a_items"], dtype=float)
    b = np.asarray(e["b_items"], dtype=float) if e["b_items"] is not None else np.full(len(a), e["chance"])
    keep = np.isfinite(a - b)
    d = (a - b)[keep]
    groups = np.unique(np.asarray(ids)[keep], return_inverse=True)[1]
    units = np.bincount(groups, weights=d) / np.bincount(groups)
    m = sign_flip_mde(units)  # nan (stored null) where the sign flip over these clusters cannot reject
    return e | {"ci95": cluster_bootstrap_ci(d, groups), "p": sign_flip_p(units), "n_units": len(units),
                "mde": m if m == m else None, "note": floor_note(len(units)),
                "unit": "cluster (prompt template)"}


def bench_headline(res, methods, set_name, clusters=None):
    """One benchmark set's headline entries: every model judge vs the coin (accuracy, consistency);
    Skill-RM paired over items vs the plain judge with the python tool (python_only, SFT on as many
    supervised tokens as Skill-RM's: #49 §3's headline), vs the plain judge, vs checker-only (fidelity: how
    much of the ceiling of faithful script execution the judge reaches) and vs shorter-wins; the two
    baselines vs the coin.
    clusters {item id: template}: the entries' item ids, so the bootstrap and the test resample templates."""
    H, judges, tag = [], [m for m in methods if m in MODEL_JUDGES], SET_NAMES.get(set_name, set_name)
    note = " [SFT: skill targets copy a verifier report, plain targets do not]"
    tool = "plain judge with the python tool [SFT: as many supervised tokens]"
    cl = lambda ids: [(clusters or {}).get(i, i) for i in ids]
    chance = lambda name, m, vals, ids, c: clustered(vs_chance(name, m, vals, c, item_ids=cl(ids)))
    for fmt in ("pairwise", "best_of_4"):
        for m in judges + ["checker", "shorter"] * (fmt == "pairwise"):
            it = bench_items(res, m, fmt)
            if it:
                H.append(chance(f"{tag}: {fmt} accuracy of {BASELINE_NAMES.get(m, m)} vs coin",
                                BASELINE_NAMES.get(m, m),
                                [it[k] for k in sorted(it)], sorted(it), COIN[fmt]))
            cons = bench_items(res, m, fmt, "items_consistent") if m in judges else {}
            if cons:
                H.append(chance(f"{tag}: pairwise consistency of {m} vs coin (position-locked: 0)", m,
                                [cons[k] for k in sorted(cons)], sorted(cons), COIN["consistent"]))
        a = bench_items(res, "skill_rm", fmt)
        # paper_effect: Table 2, Qwen3.5-27B, Skill-RM 86.2 vs LLM-as-a-Judge 83.9 (benchmark average)
        for other, what, effect in (("python_only", tool, None), ("baseline", f"plain judge{note}", 0.023),
                                    ("checker", "checker-only (fidelity)", None),
                                    ("shorter", "shorter-wins", None)):
            b = bench_items(res, other, fmt)
            ids = sorted(set(a) & set(b))
            if ids:
                H.append(clustered(compare(f"{tag}: {fmt} accuracy: Skill-RM vs {what}", "skill_rm",
                                           BASELINE_NAMES.get(other, other), [a[k] for k in ids],
                                           [b[k] for k in ids], chance=COIN[fmt], paper_effect=effect,
                                           item_ids=cl(ids), primary=set_name == "heldout"
                                           and fmt == "pairwise" and other in ("python_only", "baseline"))))
    return H


def print_benchmark_table(res, methods, formats, title=""):
    """Accuracy (%) per category and pooled, beside the coin, invalid rate, turns and tool use; the no-model
    baselines (tasks.reward_bench.baseline_scores) in the same table, below the judges; then, pairwise, each
    category's accuracy with its 95 % CI, accuracy per presentation order and consistency."""
    cats = sorted({k[2] for k in res})
    methods = list(methods) + [b for b in BASELINES if b not in methods]
    for fmt in formats:
        rows = {}
        for m in methods:
            cells = [res.get((m, fmt, c)) for c in cats]
            if not any(cells):
                continue
            pct = lambda key: 100 * pooled(res, m, fmt, key)
            judged = all(r is None or "turns" in r for r in cells)  # a judge (not a no-model baseline)
            calls = lambda tool: sum(r[f"calls_{tool}"] * r["n_judgments"] for r in cells if r)
            rows[BASELINE_NAMES.get(m, m)] = {c: 100 * r["score"] for c, r in zip(cats, cells) if r} | {
                "all": pct("score"), "n": sum(r["n"] for r in cells if r), "invalid": 100 - pct("valid")} | ({
                    "turns": pooled(res, m, fmt, "turns"), "skill%": pct("skill"),
                    "sandbox": calls("python_sandbox"), "verifier": calls("run_verifier"),
                    "code_used": pct("code_used")} if judged else {})
            if fmt == "pairwise":
                rows[BASELINE_NAMES.get(m, m)] |= {"order_A": pct("order_A"), "order_B": pct("order_B"),
                                                   "consist": pct("consistent")}
        extra = ["order_A", "order_B", "consist"] if fmt == "pairwise" else []
        chance = ("a three-way coin per order (A, B, Tie: 1/3 each) wins a pair 1/3 of the time, the most "
                  "any tie rate gives; its consist is 2/9, the headline's chance for consist 1/2, the most "
                  "any coin gives (two-way)" if fmt == "pairwise" else "a uniform pick of 4")
        print_table(f"{title}{fmt} accuracy (%) per category  (chance {100 * COIN[fmt]:.0f} %: {chance})",
                    rows,
                    cats + ["all", "n"] + extra
                    + ["invalid", "turns", "skill%", "sandbox", "verifier", "code_used"],
                    cell=lambda v: f"{v:.4g}", first="method")
    if "pairwise" in formats:
        rows = {f"{BASELINE_NAMES.get(m, m)} {c}": {
                    "acc": 100 * r["score"], "ci_lo": 100 * r["ci95"][0], "ci_hi": 100 * r["ci95"][1],
                    "order_A": 100 * r["order_A"], "order_B": 100 * r["order_B"],
                    "consist": 100 * r["consistent"], "n": r["n"]}
                for m in methods for c in cats for r in [res.get((m, "pairwise", c))] if r}
        print_table(f"{title}pairwise per category: accuracy (%) with its 95 % CI (Wilson over the "
                    "category's pairs), per order, consistency", rows,
                    ["acc", "ci_lo", "ci_hi", "order_A", "order_B", "consist", "n"],
                    cell=lambda v: f"{v:.4g}", first="method category")
    print("(sandbox / verifier: python_sandbox / run_verifier calls in all judgments; code_used: % of\n"
          " judgments whose final answer follows the last code run's report. The skill judge's SFT targets\n"
          " copy its verifier's report; the plain judge's SFT targets carry the same labels with no report\n"
          " to copy: same SFT budget, not same information. No-model baselines: coin (A / B / Tie, 1/3\n"
          " each, exact), position-locked (always A), shorter- / longer-wins (characters; equal lengths\n"
          " tie), checker-only (the skills' scripts run on the item: tasks.reward_bench.CHECKER_SCRIPTS))")


BASELINE_NAMES = {"coin": "coin", "first": "position-locked", "shorter": "shorter-wins",
                  "longer": "longer-wins", "checker": "checker-only"}
SET_NAMES = {"heldout": "held-out", "dev": "dev"}


def with_ci(res):
    """Each (method, format, category) row with ci95: the Wilson interval of its pairs won when every item
    is 0/1, else the percentile bootstrap of the mean (a coin's exact expectations: a point)."""
    for r in res.values():
        v = list(r.get("items", {}).values())
        if v and all(x in (0.0, 1.0) for x in v):
            r["ci95"] = wilson_ci(int(sum(v)), len(v))
        else:
            r["ci95"] = bootstrap_ci(v) if v else [float("nan"), float("nan")]
    return res


def bench_sets(heldout, dev, per_cat, seed):
    """{set: items} of the benchmark: the held-out test set first (the headline; heldout '' or None: none),
    the dev set beside it; per_cat items per category of each, drawn with the seed (select_items)."""
    sets = {"heldout": select_items(read_jsonl(heldout), per_cat, seed)} if heldout else {}
    return sets | {"dev": select_items(read_jsonl(dev), per_cat, seed)}


def bench_json(by_set, back=False):
    """{set: {(method, format, category): row}} as results.json keeps it, {set: {"method|format|category":
    row}}; back=True: the other way."""
    key = (lambda k: tuple(k.split("|"))) if back else "|".join
    return {name: {key(k): v for k, v in res.items()} for name, res in by_set.items()}


def write_judgments(path, tasks, meta, where):
    """bench_judgments.jsonl: every benchmark judgment with its set and whole trace (what a judge did)."""
    with open(path, "w") as f:
        for t, (iid, cat, method, fmt, extra), name in zip(tasks, meta, where):
            trace = [{k: st[k] for k in ("action", "observation")} for st in t.trace]
            row = {"set": name, "item": iid, "category": cat, "method": method, "format": fmt,
                   "label": t.label, "judgment": t.judgment, "trace": trace}
            f.write(json.dumps(row, default=str) + "\n")


def print_tool_calls(by_set, methods, tools):
    """Each model judge's calls per tool over every benchmark set."""
    for m in [m for m in methods if m in MODEL_JUDGES]:
        rows = [r for res in by_set.values() for k, r in res.items() if k[0] == m]
        print(f"{m:12s} tool calls: " + ", ".join(
            f"{n} {sum(r[f'calls_{n}'] * r['n_judgments'] for r in rows):.0f}" for n in tools))
