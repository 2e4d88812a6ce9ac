"""Tests for skill_entropy.py: the equations against hand values, the D.2 parser, rejection sampling and
synthesis, the rewards, Acc estimation and its null, the run folder and resume, and a smoke test of the tiny
preset. The world (bank, seed pools, scorers, sandbox, screen) is tested in tests/test_tasks_skill_bank.py."""
import argparse
import json
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import plumbing  # noqa: E402
import skill_entropy as se  # noqa: E402
import tasks.skill_bank as sb  # noqa: E402
from conftest import MEMORY_GROUP, run_group  # noqa: E402

A, B, C = ("math", "arithmetic_operations"), ("logic", "syllogistic_deduction"), ("coding", "list_filtering")


class Args:
    code_timeout, code_mem_mb = 5.0, 256


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
    assert sb.extract_lenient("<answer>1</answer> blah <answer>2", 3)[1] == ["1", "2", ""]
    assert sb.extract_lenient("Step 1: 5\nStep 2: yes", 2)[1] == ["5", "yes"]
    assert sb.extract_lenient("just 7", 1)[1] == ["just 7"]


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


def test_llm_verifier_verdict_needs_every_check_and_accept():
    v = se.parse_verdict("<answer_preserved> PASS: x </answer_preserved><scenario_consistent>PASS"
                         "</scenario_consistent><dependency_present>PASS</dependency_present><no_answer_leakage> PASS "
                         "</no_answer_leakage><verdict>ACCEPT</verdict>")
    assert v["accept"] and not se.parse_verdict("ACCEPT")["accept"]


def test_spearman():
    assert se.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert se.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


@pytest.mark.heavy(368)
@pytest.mark.xdist_group(MEMORY_GROUP)
def test_tiny_preset_smoke(tmp_path):
    """Every stage end to end on the embedded model, shrunk further with flags, on the preset's own sampler (vLLM where
    it starts; with 2 RL steps 305 s, 2-core AMD EPYC with avx512_bf16, 2026-12-03). Fails when the run
    shows no signal: RL made no update, every verifiable step scored 0 (the judge's open-ended
    scores kept apart), or SkE is indistinguishable from a constant (sd ≤ 0.01 or < 3 values)."""
    cmd = [sys.executable, str(ROOT / "skill_entropy.py"), "--preset", "tiny", "--sampler", "auto",
           "--run-dir", str(tmp_path / "run"), "--domains", "math,information_extraction,creative_writing",
           "--skills-per-domain", "2", "--acc-samples", "2", "--direct-pairs", "3", "--n-train", "6", "--n-sft", "2",
           "--eval-n", "3", "--train-len", "2,3", "--test-len", "2,3", "--llm-proposer-tasks", "1",
           "--max-new-tokens", "96", "--acc-max-new-tokens", "12", "--propose-max-new-tokens", "24", "--steps", "2",
           "--prompts-per-step", "2",
           "--G", "4", "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "6", "--null-perms", "50",
           "--baselines", "grpo,format_only,shuffled_ske,ske_rl"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    out = run_group(cmd, capture_output=True, text=True, timeout=900, env=env)
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
    assert set(ske["null"]) == {"spread", "spearman", "single_minus_cross", "within_minus_cross"}
    assert "null 95 % band" in out.stdout
    t3 = json.loads((run / "table3.json").read_text())["rows"]
    assert set(t3) == {"grpo", "format_only", "shuffled_ske", "ske_rl"}
    # a row's overall recounted: the mean over every step of the test tasks, from the per-task means weighted by steps
    steps = {t["id"]: len(t["steps"]) for t in json.loads((run / "tasks.json").read_text())["tasks"] if t["split"] == "test"}
    for r in t3.values():
        assert set(r["per_task"]) == set(steps) and r["n_steps"] == sum(steps.values()), r
        assert r["overall"] == pytest.approx(sum(steps[t] * m for t, m in r["per_task"].items()) / r["n_steps"]), r
    assert any(t3[r]["lam_ent"]["updates"] > 0 for r in t3), "no RL row made an update (every group dropped or cut off)"
    assert "Table 3 shape" in out.stdout and "kept groups" in out.stdout
    res = json.loads((run / "results.json").read_text())
    assert {e["claim"].split(":")[0] for e in res["headline"]} == {"Acc", "Skill²-Bench", "Table 3"}
    tasks = json.loads((run / "tasks.json").read_text())["tasks"]
    assert all(t["proposer"] in ("llm", "template") for t in tasks)
    # a re-run with --resume reads every stage's output and reuses every checkpoint
    out2 = run_group(cmd + ["--resume"], capture_output=True, text=True, timeout=600, env=env)
    assert out2.returncode == 0 and "[ske]" not in out2.stdout and "GRPO steps" not in out2.stdout
    assert "SFT →" not in out2.stdout
    # another rollout budget on --resume: refused at once, naming it (plumbing.check_resume; a budget that fits
    # no D.2 response is an error of its own: test_response_budget_fits_the_gold_traces)
    bad = run_group(cmd + ["--resume", "--max-new-tokens", "24"], capture_output=True, text=True, timeout=600,
                    env=env)
    assert bad.returncode != 0 and "--max-new-tokens 96 → 24" in bad.stderr


def test_d4_matching_with_the_real_minilm_at_threshold_half():
    """D.4 with the embedder the reward uses (MiniLM) at the paper's 0.5: every canonical key maps to
    itself, paraphrases of a key to that key, labels from outside the bank to None."""
    bank = sb.load_bank(sb.DATA / "bank.json")
    keys = sb.bank_keys(bank)
    embed = plumbing.minilm_encoder()
    key_emb = embed([sb.key_text(*k) for k in keys])
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
    """--preset gpu (Qwen3-1.7B, one seed of the README's power-sized run, at most 1 h) with --model → the
    random tiny model: one GRPO step per RL row on CPU; sizes shrunk by flags, every other setting the
    preset's."""
    from grpo import parse_with_preset
    a = parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", "gpu", "--run-dir", "/tmp/x"])
    assert a.model == "Qwen/Qwen3-1.7B" and a.eval_n == 300 and a.steps == 30 and a.G == 8
    assert a.grad_checkpointing
    bank = sb.load_bank(a.bank, a.skills_per_domain, a.domains, a.skills)
    binary = {("logic", "syllogistic_deduction"), ("logic", "boolean_circuits"), ("logic", "truth_teller_puzzles"),
              ("planning", "dependency_scheduling"), ("information_extraction", "letter_inventory")}
    assert len(bank) == 9 and not binary & set(sb.bank_keys(bank))
    run = tmp_path / "run"
    se.main(["--preset", "gpu", "--model", tiny_model_dir, "--sampler", "hf", "--run-dir", str(run),
             "--domains", "math,science,creative_writing", "--acc-samples", "1", "--direct-pairs", "2", "--n-train", "4",
             "--n-sft", "2", "--eval-n", "3", "--train-len", "2,3", "--test-len", "2,3", "--max-new-tokens", "160",
             "--acc-max-new-tokens", "4", "--propose-max-new-tokens", "8", "--llm-proposer-tasks", "0",
             "--steps", "1",
             "--prompts-per-step", "2", "--G", "2", "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "1",
             "--max-model-len", "512", "--null-perms", "20", "--baselines", "grpo,ske_rl"])
    out = capsys.readouterr().out
    assert out.count("1 GRPO steps") == 2 and (run / "results.json").exists()


def _small_world():
    bank = sb.load_bank(sb.DATA / "bank.json", 1, "math,logic,science,creative_writing")
    keys = sb.bank_keys(bank)
    rng = random.Random(1)
    pw = {(a, b): rng.uniform(0.8, 2.0) for a in keys for b in keys}
    cross = [v for (a, b), v in pw.items() if a[0] != b[0]]
    return bank, keys, {"pairwise": pw, "thetas": list(np.quantile(cross, [0.33, 0.67]))}


class SynArgs(Args):
    seed, max_reject, llm_proposer_tasks, regenerations, propose_max_new_tokens = 0, 500, -1, 3, 64
    verifier = "rules+llm"
    n_train, eval_n, train_len, test_len = 6, 9, "2,2", "2,3"


def test_synthesis_llm_proposer_accepted_and_template_fallback():
    bank, keys, table = _small_world()
    calls = []

    def fake_llm(msgs, max_new_tokens, temperature=0.0):
        outs = []
        for m in msgs:
            text = m[0]["content"]
            calls.append(text[:20])
            if text.startswith("You are a strict verifier"):
                outs.append("".join(f"<{c}>PASS: ok</{c}>" for c in sb.CHECKS) + "<verdict>ACCEPT</verdict>")
            elif "Step 1 [math" in text:  # a faithful fusion for tasks that start with math
                qs = re.findall(r"Step \d+ \[[^\]]+\]: (?:\(open-ended\) )?(.*?)(?:\nAnswer: .*?)?(?=\nStep \d+ \[|\n\nOutput exactly)", text, re.S)
                steps = "".join(f"<step>{'Using the previous answer, ' if i else ''}{q}</step>" for i, q in enumerate(qs))
                outs.append(f"<scenario>A farm audit.</scenario>{steps}")
            else:
                outs.append("I cannot do that.")
        return outs

    tasks = se.synthesize(bank, table, fake_llm, SynArgs(), "test")
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
    texts_of = [sb.key_text(*k) for k in keys]
    embed = lambda texts: np.array([key_emb[texts_of.index(t)] if t in texts_of else 0.3 * key_emb[0] for t in texts])
    task = {"skills": [list(keys[0]), list(keys[1])], "steps": [sb.make_seed(bank, *keys[0], 0), sb.make_seed(bank, *keys[1], 0)]}
    train = [1.0, 1.5, 2.0]
    args = Args()
    args.match_threshold = 0.5
    fz = plumbing.Frozen(None, None, embed, keys, key_emb, {})
    fn = se.make_reward_fn(bank, table, train, fz, args, (0.7, 0.3))
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


def test_checkpoint_is_reused_only_under_resume(tmp_path):
    """A finished checkpoint is 'done' and an unfinished one 'resume', under --resume only: a fresh run never
    continues an older run's checkpoint (an earlier row of the same run passes reuse=True to run_sft)."""
    import torch
    (tmp_path / "ckpt").mkdir()
    torch.save({"extra": {"done": True, "spec": {"row": "ske_rl"}}}, tmp_path / "ckpt" / "state.pt")
    assert se.checkpoint_state(tmp_path, resume=True) == "done"
    assert se.checkpoint_state(tmp_path, resume=False) is None
    torch.save({"extra": {"done": False}}, tmp_path / "ckpt" / "state.pt")
    assert se.checkpoint_state(tmp_path, resume=True) == "resume"
    assert se.checkpoint_state(tmp_path, resume=False) is None
    assert se.checkpoint_state(tmp_path / "nothing", resume=True) is None


def test_a_stage_computes_its_file_and_resume_reads_it_back(tmp_path):
    """Each stage is a plain call: rank 0 computes its file in --run-dir; with --resume a file already there is
    read back instead (here §3.2 stage (3), template proposer only, so no model is loaded)."""
    from plumbing import Dist
    bank, keys, table = _small_world()
    args = argparse.Namespace(**{k: getattr(SynArgs, k) for k in dir(SynArgs) if not k.startswith("_")})
    args.regenerations, args.run_dir, args.resume = 0, str(tmp_path), False
    import types

    import plumbing  # one process: a stage is a plain call (plumbing.on_rank0), no model is ever asked
    fz = types.SimpleNamespace(gen_of=None, on_rank0=lambda fn, skip=False: plumbing.on_rank0(fn, None, Dist(),
                                                                                               {}, skip))
    train, test = se.synthesize_tasks(args, Dist(), bank, table, fz)
    assert len(train) == 6 and len(test) == 9 and (tmp_path / "tasks.json").exists()
    marker = dict(tasks=[dict(train[0], id="marker")])
    (tmp_path / "tasks.json").write_text(json.dumps(marker))
    args.resume = True
    train2, test2 = se.synthesize_tasks(args, Dist(), bank, table, fz)                    # --resume: read back
    assert [t["id"] for t in train2] == ["marker"] and test2 == []
    args.resume = False
    train3, test3 = se.synthesize_tasks(args, Dist(), bank, table, fz)                    # a fresh run recomputes
    assert train3 == train and test3 == test


def _tiny_args(*extra):
    from grpo import parse_with_preset
    return parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", "tiny", "--run-dir", "/tmp/x", *extra])


def test_old_flag_names_say_the_new_ones(capsys):
    for old, new in [("--rl-steps", "--steps"), ("--n-test", "--eval-n")]:
        with pytest.raises(SystemExit):
            _tiny_args(old, "3")
        assert f"{old} is now {new}" in capsys.readouterr().err
    assert _tiny_args("--no-sft-gold-fallback").sft_gold_fallback is False and _tiny_args().sft_gold_fallback


class SynArgsRules(Args):
    seed, max_reject, llm_proposer_tasks, regenerations, propose_max_new_tokens = 0, 500, -1, 1, 256
    verifier = "rules+llm"
    n_train, eval_n, train_len, test_len = 6, 6, "2,2", "2,2"


def test_verifier_reply_is_not_cut_off():
    bank, keys, table = _small_world()
    reason = "the rewritten question keeps every number and option of its seed " * 2

    def llm(msgs, max_new_tokens, temperature=0.0):  # a real model stops at max_new_tokens (≈ 4 characters each)
        outs = []
        for m in msgs:
            t = m[0]["content"]
            if t.startswith("You are a strict verifier"):
                full = "".join(f"<{c}> PASS: {reason}</{c}>\n" for c in sb.CHECKS) + "<verdict> ACCEPT </verdict>"
                outs.append(full[:4 * max_new_tokens])
            else:
                qs = re.findall(r"Step \d+ \[[^\]]+\]: (?:\(open-ended\) )?(.*?)(?:\nAnswer: .*?)?(?=\nStep \d+ \[|\n\nOutput exactly)", t, re.S)
                outs.append("<scenario>A farm audit.</scenario>" + "".join(
                    f"<step>{'Using the previous answer, ' if i else ''}{q}</step>" for i, q in enumerate(qs)))
        return outs
    tasks = se.synthesize(bank, table, llm, SynArgsRules(), "train")
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
    bank = sb.load_bank(p)
    keys = sb.bank_keys(bank)
    table = {"pairwise": {(keys[0], keys[1]): 1.0, (keys[1], keys[0]): 2.0}, "thetas": [1.2, 1.8]}
    args = SynArgsRules()
    args.n_train = 12
    tasks = se.synthesize(bank, table, None, args, "train")
    assert 0 < len(tasks) < 12
    for t in tasks:
        assert t["skills"][0] == ["a", "x"]
        seeds = [dict(s, question=s["seed_question"]) for s in t["steps"]]
        assert all(sb.rule_checks(t["scenario"], [s["question"] for s in t["steps"]], seeds).values())


@pytest.mark.parametrize("preset", list(se.PRESETS))
def test_presets_leave_room_for_the_prompt(preset):
    from grpo import parse_with_preset
    a = parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", preset, "--run-dir", "/tmp/x"])
    assert a.max_new_tokens < a.max_model_len
    with pytest.raises(SystemExit, match="max-model-len"):
        se.main(["--preset", preset, "--max-new-tokens", "4096", "--max-model-len", "2048", "--run-dir", "/tmp/x"])


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
    bank = sb.load_bank(sb.DATA / "bank.json", 2, "math,logic,science")
    keys = sb.bank_keys(bank)
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
    bank = sb.load_bank(p)
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
    _, single, cross = sb.switch_items(acc["chains"], "single", "switch")
    assert len(single) == 4 * 4 and all(x == 1.0 for x in single) and min(cross) < 1.0   # paired over (b, q)
    _, within, cross = sb.switch_items(acc["chains"], "within", "cross")   # the cost is a domain switch's
    assert all(x == 1.0 for x in within) and min(cross) < 1.0
    assert acc["chains"]["valid"] == [[1.0, 1.0]] * len(acc["chains"]["jobs"])   # every reply marks an answer
    assert len(acc["chains"]["constant"]) == len(acc["chains"]["jobs"]) and max(acc["chains"]["constant"]) <= 1
    assert acc["empty_cells"] == [] and acc["mean_step_score_verifiable"] == acc["mean_step_score"]
    # the null: a cost only on [p] → [q] switches beats it; the same scores with the first step shuffled do not
    null = se.ske_null(bank, acc["chains"], argparse.Namespace(alpha=0.1, pair_acc="both", level_quantiles="0.33,0.67"), 200, 0)
    assert null["single_minus_cross"]["p"] < 0.05 and null["spread"]["observed"] > null["spread"]["band"][1]
    assert null["within_minus_cross"]["p"] < 0.05 and null["within_minus_cross"]["observed"] > 0
    assert len(null["spread"]["null"]) == 200


def test_ske_null_is_not_beaten_by_noise():
    """H0 true (every step-2 score is a coin flip, whatever came first): the null's p is uniform-ish,
    so over 20 noise tables the spread beats its null at p < 0.05 in few of them (≤ 4 of 20)."""
    bank = sb.load_bank(sb.DATA / "bank.json", 2, "math,logic,information_extraction")
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
    bank = sb.load_bank(sb.DATA / "bank.json", 3, "math,logic")
    jobs = [("single", k, k) for k in sb.bank_keys(bank)] + [("chain", ("math", "arithmetic_operations"), ("logic", "syllogistic_deduction"))]
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
    big = sb.load_bank(sb.DATA / "bank.json", 0, "math,logic")
    cells = se.pool_cells(se.acc_jobs(big, 2, 0, random.Random(0)), [(1, 1)] * 10 ** 4, "both")
    assert all(cells[("d2s", d, k)] for d in big for k in sb.bank_keys(big))


def _tiny_bank():
    from grpo import parse_with_preset
    a = parse_with_preset(se.build_parser(), se.PRESETS, argv=["--preset", "tiny", "--run-dir", "/tmp/x"])
    return sb.load_bank(a.bank, a.skills_per_domain, a.domains)


@pytest.mark.parametrize("key", sb.bank_keys(_tiny_bank()))
def test_echoing_the_question_never_scores(key):
    """Issue #25: on every tiny-bank skill's questions, a reply that restates the question (bare, in
    the answer tag, or only the expression it asks about) scores 0, while the gold answer scores 1."""
    bank = _tiny_bank()
    for i in range(12):
        st = sb.make_seed(bank, key[0], key[1], i)
        q = st["question"]
        echoes = [q, f"<answer>{q}</answer>", q.splitlines()[-1], f"<answer>{q.splitlines()[-1]}</answer>"]
        expr = re.findall(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+", q)          # "37 + 48" in "Calculate 37 + 48."
        echoes += [e for x in expr for e in (x, f"<answer>{x}</answer>", f"The answer is {x}")]
        assert sb.score_replies([st] * len(echoes), echoes, Args()) == [0.0] * len(echoes), (key, q, echoes)
        assert sb.score_steps([st] * len(expr), expr, Args()) == [0.0] * len(expr)   # the RL reward path too
        assert sb.score_replies([st], [f"<answer>{st['answer']}</answer>"], Args()) == [1.0], (key, st["answer"])


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
    texts_of = [sb.key_text(*k) for k in keys]
    embed = lambda texts: np.array([key_emb[texts_of.index(t)] if t in texts_of else 0.3 * key_emb[0] for t in texts])
    task = {"skills": [list(keys[0]), list(keys[1])], "steps": [sb.make_seed(bank, *keys[0], 0), sb.make_seed(bank, *keys[1], 0)]}
    args = Args()
    args.match_threshold = 0.5
    wrong_plan = (f"<think>x</think><skill>{keys[2][0]}, {keys[2][1]}</skill><answer>zz</answer>"
                  f"<skill>{keys[1][0]}, {keys[1][1]}</skill><answer>zz</answer>")
    oob = wrong_plan.replace(f"{keys[1][0]}, {keys[1][1]}", "cooking, baking")
    fz = plumbing.Frozen(None, None, embed, keys, key_emb, {})
    fmt = se.make_reward_fn(bank, table, [1.0, 2.0], fz, args, (0.7, 0.3), "format")
    r = fmt([wrong_plan, oob], [task] * 2)
    assert r[0]["r_ent"] == 1.0 and r[0]["reward"] == pytest.approx(0.3) and r[1]["r_ent"] == 0.0
    sm = se.make_reward_fn(bank, table, [1.0, 2.0], fz, args, (0.7, 0.3), "skill_match")
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
                              [x + 0.5 for x in a], a, paper_effect=0.096, primary=True)]
        null = dict(spread=dict(observed=2.0, null=rng.random(200).tolist(), p=0.0, band=[0, 1], side="greater"),
                    spearman=dict(observed=0.1, null=rng.uniform(-1, 1, 200).tolist(), p=0.5, band=[-1, 1], side="greater"),
                    single_minus_cross=dict(observed=None, null=[], p=None, band=[None, None], side="two-sided"))
        stats.write_results(r, {"ske_null": null}, head)
        runs.append(str(r))
    entries, nulls = se.main(["--aggregate", *runs])
    out = capsys.readouterr().out
    assert entries[0]["n_seeds"] == 3 and entries[0]["n_items"] == 18 and entries[0]["diff"] == pytest.approx(0.5)
    assert "Skill-Entropy RL vs GRPO" in out and "mean over 3 runs" in out
    assert "SkE at its null on every seed (no run has p < 0.05): no" in out     # spread: p = 0 in each run
    # the gpu preset's power at the tiny item spread: 6 test tasks per seed in tiny, 300 in gpu
    assert "--preset gpu, one seed: Table 3: Skill-Entropy RL vs GRPO (r_ans) (per-task cross-skill score): n = 300" in out
    assert nulls["spread"]["p"] == pytest.approx(1 / 201) and nulls["spread"]["observed"] == 2.0
    lo, hi = nulls["spread"]["band"]
    assert 0.1 < lo < hi < 0.9 and hi - lo < 0.8     # the mean of 3 uniforms is narrower than one's [0.025, 0.975]
    assert "single_minus_cross" not in nulls


def test_pipeline_mechanics_on_a_tiny_random_model(tiny_model_dir, tmp_path, capsys):
    """Every stage in-process on a 2-layer random model (no signal expected): the files, the Table 3 rows,
    --resume reading every stage, and --resume with one more row training that row only (from the SFT
    checkpoint), which is how a row or a λ sweep is added to a finished run."""
    run = tmp_path / "run"
    argv = ["--preset", "tiny", "--model", tiny_model_dir, "--sampler", "hf", "--run-dir", str(run),
            "--domains", "math,logic,creative_writing", "--acc-samples", "1", "--direct-pairs", "2", "--n-train", "4",
            "--n-sft", "2", "--eval-n", "3", "--train-len", "2,3", "--test-len", "2,3", "--max-new-tokens", "128",
            "--acc-max-new-tokens", "4", "--propose-max-new-tokens", "8", "--steps", "1", "--prompts-per-step", "2",
            "--G", "2", "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "1", "--max-model-len", "512",
            "--baselines", "base,grpo,format_only"]
    se.main(argv)
    out = capsys.readouterr().out
    for f in ("bank_labelled.json", "ske_table.json", "tasks.json", "bench.json", "table3.json", "offshelf_labelled.json"):
        assert (run / f).exists(), f
    assert set(json.loads((run / "table3.json").read_text())["rows"]) == {"base", "grpo", "format_only"}
    assert out.count("GRPO steps") == 2 and "[ske]" in out and "SFT →" in out
    # issue #51: the same-skill control and the constant answer in bench.json, the switching contrast and
    # Table 3's mechanism (r_ent and refills per step) in results.json
    bench, res = (json.loads((run / f).read_text()) for f in ("bench.json", "results.json"))
    assert bench["same_steps"] and len(bench["constant_steps"]) >= len(bench["steps"])
    assert {"by_skill", "format_valid"} <= set(res["switching"]) and "best constant answer" in out
    lam = res["table3"]["grpo"]["lam_ent"]
    assert len(lam["r_ent_by_step"]) == len(lam["refills_by_step"]) == 1 and "share_changed" in lam
    claims = [e["claim"] for e in res["headline"]]
    assert any("within-domain vs a cross-domain" in c for c in claims) and any("same-skill" in c for c in claims)
    spread = lambda e: len({round(a - b, 9) for a, b in zip(e["a_items"], e["b_items"] or [])}) > 1
    assert all(e["mde"] is not None or e["n_units"] <= 5 or not spread(e) for e in res["headline"])  # sd 0: none
    se.main(argv + ["--resume"])
    out = capsys.readouterr().out
    assert "[ske]" not in out and "[synth]" not in out and "GRPO steps" not in out and "SFT →" not in out
    se.main(argv[:-1] + ["base,grpo,format_only,ske_rl", "--resume"])
    out = capsys.readouterr().out
    assert out.count("GRPO steps") == 1 and "[train] ske_rl" in out and "SFT →" not in out and "[ske]" not in out
    assert set(json.loads((run / "table3.json").read_text())["rows"]) == {"base", "grpo", "format_only", "ske_rl"}


def test_row_seeds_differ_per_row_and_follow_seed():
    seeds = {plumbing.row_seed(0, r) for r in ("grpo", "format_only", "shuffled_ske", "ske_rl")}
    assert len(seeds) == 4 and plumbing.row_seed(0, "grpo") != plumbing.row_seed(1, "grpo") and plumbing.row_seed(0, "grpo") == plumbing.row_seed(0, "grpo")


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


def test_dapo_refill_draws_until_the_batch_has_spread_and_stops_at_its_cap():
    """grpo.refill_groups (DAPO Alg. 1's refill, issue #51 §4): zero-spread groups call for more prompts, drawn
    ⌈shortfall⌉ at a time and numbered after the last group, until n_groups groups have spread or the cap."""
    from grpo import Rollout, refill_groups
    dist = plumbing.setup_distributed()
    grp = lambda g, rw: [Rollout([1], [2], [1], reward=x, group=g) for x in rw]
    calls = []

    def draw(k, first, spread=iter([False, True, True, True])):
        calls.append((k, first))
        return [r for i in range(k) for r in grp(first + i, [0.0, 1.0] if next(spread) else [1.0, 1.0])]
    rs, n = refill_groups(grp(0, [0.0, 1.0]) + grp(1, [0.0, 0.0]) + grp(2, [1.0, 1.0]), draw, 3, 5, dist)
    assert calls == [(2, 3), (1, 5)] and n == 2              # short 2: one of 2 has spread; short 1: it has
    assert sorted({r.group for r in rs}) == list(range(6)) and len(rs) == 12
    calls.clear()
    rs, n = refill_groups(grp(0, [0.0, 0.0]), lambda k, f: calls.append((k, f)) or grp(f, [1.0, 1.0]), 1, 2, dist)
    assert n == 2 and calls == [(1, 1), (1, 2)]              # the cap: 2 draws, still no spread
    assert refill_groups(grp(0, [0.0, 0.0]), draw, 1, 0, dist) == (grp(0, [0.0, 0.0]), 0)   # 0 = off


def test_lambda_ent_summary_reports_the_mechanism(tmp_path):
    """Table 3's mechanism in results.json: the share of kept groups whose advantages λ_ent changed, r_ent and
    the refill draws per step, read from the row's metrics.jsonl."""
    rows = [dict(step=0, n_groups_kept=2, n_groups_lam_ent_changed=1, r_ent=0.4, refills=1, skipped=0.0),
            dict(step=1, n_groups_kept=2, n_groups_lam_ent_changed=2, r_ent=0.6, refills=0, skipped=0.0)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = se.lambda_ent_summary(tmp_path)
    assert (s["changed"], s["kept"], s["updates"], s["steps"]) == (3, 4, 2, 2) and s["share_changed"] == 0.75
    assert s["r_ent_by_step"] == [0.4, 0.6] and s["refills_by_step"] == [1, 0]
    assert "3 of 4 kept groups; r_ent by step [0.4, 0.6]" in se.lambda_ent_note(s, 0.3)


def test_response_budget_fits_the_gold_traces(tiny_model_dir):
    """--max-new-tokens 24 fit no D.2 response with L ≥ 2: every RL group was dropped and the smoke test passed."""
    bank, keys, table = _small_world()
    args = SynArgsRules()
    args.n_train, args.train_len = 4, "2,3"
    tasks = se.synthesize(bank, table, None, args, "train")
    for t in tasks:
        t["steps"] = [dict(st) for st in t["steps"]]
    traces, what = [se.gold_trace(t) for t in tasks], "D.2 response of the training tasks: their gold traces"
    with pytest.raises(SystemExit, match="fits no D.2 response"):
        se.check_response_budget(argparse.Namespace(model=tiny_model_dir, max_new_tokens=24), traces, what)
    need = se.check_response_budget(argparse.Namespace(model=tiny_model_dir, max_new_tokens=4000), traces, what)
    assert 24 < need < 4000


def test_bench_entries_pair_single_cross_and_the_same_skill_control_over_the_same_steps():
    """Table 2's single vs cross, and the same-skill control (issue #51 §3) between them: single vs same is the
    format's cost, same vs cross the switch's, over the steps every mode scored, beside the constant answer."""
    bj = dict(steps=[["t0", 0, 1.0], ["t0", 1, 1.0], ["t1", 0, 0.0], ["t2", 0, 1.0]],
              cross_steps=[["t0", 0, 0.0], ["t0", 1, 1.0], ["t0", 2, 1.0], ["t1", 0, 0.0], ["t2", 0, 0.0]])
    (e,) = se.bench_entries(bj)
    assert e["n_items"] == 4 and e["mean_a"] == 0.75 and e["mean_b"] == 0.25 and e["diff"] == pytest.approx(0.5)
    assert e["claim"] == "Skill²-Bench: single-skill vs cross-skill per-step score (same verifiable steps)"
    bj.update(same_steps=[["t0", 1, 0.0], ["t2", 0, 0.5]], constant_steps=[["t0", 1, 0.5], ["t2", 0, 0.0]])
    e, fmt, switch = se.bench_entries(bj)
    assert (fmt["a"], fmt["b"], fmt["n_items"]) == ("single", "same", 2) and fmt["diff"] == pytest.approx(0.75)
    assert (switch["a"], switch["b"], switch["chance"]) == ("same", "cross", 0.25)
    assert switch["diff"] == pytest.approx(-0.25) and "switch's cost" in switch["claim"]
    assert e["chance"] == 0.25 and fmt["mde"] is None and "format's cost" in fmt["claim"]  # 2 units: no test
    assert se.bench_entries({"single": {}}) == [] and se.bench_entries(None) == []
    # rows that carry item ids (a fixed pool's item recurs over seeds): the entry keeps them for stats.aggregate
    bj2 = dict(steps=[["t0", 0, 1.0, "science/g#a"], ["t1", 0, 0.0, "math/m#1"]],
               cross_steps=[["t0", 0, 0.0, "science/g#a"], ["t1", 0, 0.0, "math/m#1"]])
    assert se.bench_entries(bj2)[0]["item_ids"] == ["science/g#a", "math/m#1"] and e["item_ids"] is None


DATA_DIGEST = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import skill_selfplay as P
import tasks.reward_bench as R, tasks.search_world as T, tasks.skill_bank as E, tasks.zebra as Z
bank = E.load_bank(str(E.DATA / "bank.json"))
sp = P.parse_with_preset(P.build_parser(), P.PRESETS, argv=["--preset", "tiny"], name="skill_selfplay")
data = dict(
    ske=[E.seed_pool(bank, d, s, split, 0) for d, s in E.bank_keys(bank, "verifiable") for split in ("train", "test")],
    rm=[R.sft_items(0, 4), R.if_prompts(0, 8, "test"), R.math_items("bench-math", 0, 8)],
    sp=Z.zebra_heldout(sp)[0],
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
        out = run_group([sys.executable, "-c", DATA_DIGEST, str(ROOT)], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        digests.append(out.stdout.split()[-1])
    assert digests[0] == digests[1]
