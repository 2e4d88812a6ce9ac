"""Tests for talentrl.py: the equations against hand values, the search world,
the parsers, and a tiny end-to-end run on one and on two gloo ranks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import talentrl as T  # noqa: E402


# ----- equations -----
def test_eq1_similarity_topk_threshold_and_recall():
    sims = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.19, 0.8])
    # no talent: plain TopK by similarity within the pool (threshold 0.2 drops 0.1 and 0.19)
    assert T.retrieve_skills(sims, set(), K=3, recall=20, threshold=0.2, lam=0.3) == [0, 5, 2]
    assert T.retrieve_skills(sims, set(), K=10, recall=20, threshold=0.2, lam=0.3) == [0, 5, 2, 3]
    assert T.retrieve_skills(sims, set(), K=10, recall=2, threshold=0.2, lam=0.3) == [0, 5]


def test_eq5_eq6_talent_skill_enters_topk_only_through_bonus():
    # 7 skills; skill 6 is the talent's and ranks last among those above threshold
    sims = torch.tensor([0.70, 0.65, 0.60, 0.55, 0.50, 0.45, 0.40, 0.05])
    K = 5
    without = T.retrieve_skills(sims, set(), K, 20, 0.2, 0.3)
    assert 6 not in without and without == [0, 1, 2, 3, 4]
    # Eq. (5): q̃ = 0.40 + 0.3 = 0.70 ties the best one; Eq. (6) keeps it in the top K
    withb = T.retrieve_skills(sims, {6}, K, 20, 0.2, 0.3)
    assert 6 in withb and len(withb) == K and 4 not in withb
    # a soft prior, not a filter: a talent skill below the similarity threshold never enters
    assert 7 not in T.retrieve_skills(sims, {7}, K, 20, 0.2, 0.3)
    # nor one outside the recall pool ℛ(x)
    assert 6 not in T.retrieve_skills(sims, {6}, K, recall=5, threshold=0.2, lam=0.3)
    # λ = 0 is Eq. (1)
    assert T.retrieve_skills(sims, {6}, K, 20, 0.2, 0.0) == without


def test_eq8_utility_and_mean():
    R_t = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, -0.1]])  # (T=2, n=3)
    R_ref = torch.tensor([0.0, 1.0, 0.0])
    u, u_bar = T.talent_utilities(R_t, R_ref)
    assert torch.allclose(u, torch.tensor([[1.0, -1.0, 1.0], [0.0, -1.0, -0.1]]))
    assert torch.allclose(u_bar, torch.tensor([1 / 3, -1.1 / 3]))


def test_eq10_exec_advantage_matches_naive_loop():
    from grpo import group_advantages
    R = [1.0, 0.0, 0.0, 1.0, 1.0]
    A = group_advantages(torch.tensor([R], dtype=torch.float64), True, 1e-4)[0].tolist()
    mu = sum(R) / len(R)
    sd = (sum((r - mu) ** 2 for r in R) / (len(R) - 1)) ** 0.5
    assert A == pytest.approx([(r - mu) / (sd + 1e-4) for r in R])


def test_eq11_dead_zone():
    z = torch.tensor([0.05, -0.09, 0.1, -0.5, 1.0, 0.0])
    assert T.dead_zone(z, 0.1).tolist() == pytest.approx([0.0, 0.0, 0.1, -0.5, 1.0, 0.0])


def test_eq12_eq13_routing_advantage_contrasts_weights_clip():
    w = torch.ones(3, dtype=torch.float64) / 3
    # anchor succeeds, no-skill fails, reduced-context succeeds, no-prior fails
    A, delta = T.routing_advantage(torch.tensor(1.0), torch.tensor([0.0, 1.0, 0.0]), w, 2.0, 2.0, 0.1)
    assert delta.tolist() == [1.0, 0.0, 1.0]
    assert A == pytest.approx(2.0 * (2 / 3))
    # all three controls fail: α·1 = 2 = κ; with α = 5 the clip bites
    assert T.routing_advantage(torch.tensor(1.0), torch.zeros(3), w, 5.0, 2.0, 0.1)[0] == pytest.approx(2.0)
    assert T.routing_advantage(torch.tensor(0.0), torch.ones(3), w, 5.0, 2.0, 0.1)[0] == pytest.approx(-2.0)
    # a difference of one invalid-action penalty (0.05 < η) is ignored
    assert T.routing_advantage(torch.tensor(1.0), torch.tensor([1.05, 1.0, 1.0]), w, 2.0, 2.0, 0.1)[0] == 0.0
    # unequal weights
    w2 = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert T.routing_advantage(torch.tensor(1.0), torch.tensor([0.0, 0.0, 0.0]), w2, 1.5, 2.0, 0.1)[0] == pytest.approx(1.5)


def test_eq14_token_assignment_on_hand_built_rollout():
    # 3 routing tokens, 2 context tokens (env), 2 action tokens, 2 observation tokens, 1 action token
    mask = [1, 1, 1, 0, 0, 1, 1, 0, 0, 1]
    anchor = T.token_advantages(mask, 3, True, True, 1.5, -0.5)
    assert anchor == [1.5, 1.5, 1.5, 0, 0, -0.5, -0.5, 0, 0, -0.5]
    ordinary = T.token_advantages(mask, 3, False, True, 1.5, 0.7)
    assert ordinary == [0, 0, 0, 0, 0, 0.7, 0.7, 0, 0, 0.7]
    control = T.token_advantages([1, 1, 0, 1], 0, False, False, 1.5, 0.7)
    assert control == [0, 0, 0, 0]


# ----- routing parser (Eq. 4) -----
@pytest.mark.parametrize("text,want", [
    ("<think>two hops</think><talent>talent_bridge_entity</talent>", "talent_bridge_entity"),
    ("  <think>x</think>\n<talent> talent_comparison </talent>\n", "talent_comparison"),
    ("<think>x</think><talent>talent_unknown</talent>", None),
    ("<talent>talent_comparison</talent>", None),
    ("<think></think><talent>talent_comparison</talent>", None),
    ("<think>x</think><talent>talent_comparison</talent> and more", None),
    ("<think>x<talent>talent_comparison</talent>", None),
    ("", None), (None, None),
])
def test_eq4_route_parser_strict(text, want):
    ids = {"talent_bridge_entity", "talent_comparison"}
    assert T.parse_route(text, ids) == want


# ----- environment -----
def test_answers_normalise_and_f1():
    assert T.exact_match("The  Amber Lantern.", "amber lantern") == 1.0
    assert T.exact_match(None, "x") == 0.0
    assert T.exact_match("1,234", "1234") == 1.0
    assert T.f1_score("Amber Lantern Hall", "the Amber Lantern") == pytest.approx(0.8)
    assert T.f1_score("", "x") == 0.0


def test_malformed_actions_are_penalised_not_fatal():
    task = dict(question="q", answer="Velm")
    ep = T.new_episode(task)
    assert "invalid" in T.env_reply(ep, "I think it is Velm.", lambda q: [], 4)
    assert "invalid" in T.env_reply(ep, "<search></search>", lambda q: [], 4)
    obs = T.env_reply(ep, "ok <search>hamlet</search>", lambda q: [dict(text="A."), dict(text="B.")], 4)
    assert obs.strip() == "<information>Doc 1: A. Doc 2: B.</information>"
    assert T.env_reply(ep, "<answer>velm</answer>", lambda q: [], 4) is None
    assert ep["n_invalid"] == 2 and ep["n_search"] == 1
    assert T.episode_return(ep, 0.1) == pytest.approx(0.8)
    # the step budget ends an episode without an answer: return 0 minus penalties
    ep = T.new_episode(task)
    for _ in range(3):
        assert T.env_reply(ep, "<search>x</search>", lambda q: [], 4) is not None
    assert T.env_reply(ep, "<search>x</search>", lambda q: [], 4) is None and ep["pred"] is None


@pytest.fixture(scope="module")
def world():
    w = T.build_world(3, 24, 10, 6, 6, 6, 3)
    return w, T.render_passages(w), T.build_questions(w, 3, 30, 10)


def _naive_answer(w, q):
    """Recompute the gold answer of a question from the structured world with a plain loop."""
    e = [w[i] for i in q["support"]]
    text, t = q["question"], q["qtype"]
    if t == "comparison":
        key = "born" if "born" in text else "founded" if "founded" in text else "population"
        pick = max if key == "population" else min
        return pick(e, key=lambda x: x[key])["name"]
    if t == "constrained":
        return e[1]["name"]
    if "How old" in text:
        return str(e[0]["year"] - e[1]["born"])
    if "How many years" in text:
        return str(e[0]["founded"] - e[1]["founded"])
    last = e[-1]
    if "born?" in text:
        return str(last["born"]) if "year" in text else w[last["birthplace"]]["name"]
    for key, rx in (("country", "country"), ("river", "river"), ("elevation", "elevation"), ("population", "population")):
        if rx in text:
            return str(last[key])
    if "headquartered" in text:
        return w[last["hq"]]["name"]
    if "take place" in text:
        return w[last["location"]]["name"]
    if "created" in text:
        return w[last["creator"]]["name"]
    raise AssertionError(text)


def test_questions_answerable_unique_and_disjoint(world):
    w, passages, qs = world
    text = {p["id"]: p["text"] for p in passages}
    seen = set()
    types = set()
    for split, parts in qs.items():
        assert parts["test"], split
        for q in parts["train"] + parts["test"]:
            types.add(q["qtype"])
            assert q["question"] not in seen  # train and test never share a question
            seen.add(q["question"])
            assert _naive_answer(w, q) == q["answer"]
            support = " ".join(text[i] for i in q["support"])
            if q["qtype"] in ("temporal",) and q["answer"].lstrip("-").isdigit() and "population" not in q["question"]:
                continue  # an arithmetic answer: its operands are in the support passages (checked above)
            assert q["answer"] in support, q
    assert types == set(T.QTYPES)
    # names are unique except for the deliberate homonyms, which differ by occupation
    names = {}
    for e in w.values():
        names.setdefault(e["name"], []).append(e)
    for n, es in names.items():
        if len(es) > 1:
            assert all(x["type"] == "person" and x["shared"] for x in es)
            assert len({x["occupation"] for x in es}) == len(es)


def test_constrained_answer_is_the_only_match(world):
    w, _, qs = world
    for q in [q for p in qs.values() for q in p["train"] + p["test"] if q["qtype"] == "constrained"]:
        creator, year = q["support"][0], int(q["question"].rstrip("?").split()[-1])
        hits = [e for e in w.values() if e["type"] == "work" and e["creator"] == creator and e["year"] == year]
        assert [h["name"] for h in hits] == [q["answer"]]


@pytest.fixture(scope="module")
def embedder():
    return T.load_embedder()


def test_retrieval_finds_gold_passage_single_hop(world, embedder):
    w, passages, qs = world
    P = T.embed(embedder, [p["text"] for p in passages])
    single = [q for p in qs.values() for q in p["test"] if q["qtype"] in ("single", "longtail", "disambiguation")][:20]
    hits = sum(q["support"][0] in [d["id"] for d in T.search_corpus(q["question"], passages, P, embedder, 3)]
               for q in single)
    assert hits / len(single) >= 0.9


# ----- SkillBank and talents -----
def test_skillbank_and_talents_load(tmp_path):
    bank, mistakes = T.load_skillbank(T.DATA / "skillbank.json")
    assert len(bank) == 26 and len({s["skill_id"] for s in bank}) == 26 and mistakes
    talents = T.load_talents(T.DATA / "talents.json", bank)
    assert len(talents) == 8 and all(t["skills"] and t["guidance"] and t["description"] for t in talents)
    # every skill belongs to at least one talent (App. B: 26 distinct referenced skills)
    assert {s for t in talents for s in t["skills"]} == {s["skill_id"] for s in bank}
    # a SkillRL-format bank from elsewhere: unknown categories load, missing associations drop
    other = {"general_skills": [{"skill_id": "g1", "title": "t", "principle": "p", "when_to_apply": "w"}],
             "task_specific_skills": {"webshop": [{"skill_id": "w1", "title": "t2", "principle": "p2"}]}}
    f = tmp_path / "bank.json"
    f.write_text(json.dumps(other))
    b2, m2 = T.load_skillbank(f)
    assert [s["skill_id"] for s in b2] == ["g1", "w1"] and b2[1]["category"] == "webshop" and m2 == []
    assert all(t["skills"] == [] for t in T.load_talents(T.DATA / "talents.json", b2))
    T.save_skillbank(tmp_path / "out.json", b2, m2)
    assert T.load_skillbank(tmp_path / "out.json")[0] == b2


def test_broken_skillbank_gives_clear_error(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(ValueError, match="SkillBank"):
        T.load_skillbank(f)
    f.write_text(json.dumps({"general_skills": [{"skill_id": "x", "title": "t"}]}))
    with pytest.raises(ValueError, match="principle"):
        T.load_skillbank(f)
    f.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="general_skills"):
        T.load_skillbank(f)


def test_proposed_skill_parser_tolerates_garbage():
    assert T.parse_proposed_skills("no json here") == []
    assert T.parse_proposed_skills('[{"title": "a"}]') == []
    got = T.parse_proposed_skills('Sure! [{"title": "Check years", "principle": "Search each year.", "when_to_apply": "dates"}]')
    assert got == [dict(title="Check years", principle="Search each year.", when_to_apply="dates")]


def test_scripted_teacher_reads_facts():
    doc = ("<information>Doc 1: The Iron Tide. The Iron Tide is an album released in 1950 by the composer Ka Vel. "
           "Doc 2: Ka Vel (composer). Ka Vel was a composer born in 1920 in Osk, Dalmiria. Known works: The Iron Tide.</information>")
    facts = T.read_facts(doc)
    assert T.scripted_answer("How old was the creator of The Iron Tide in the year it was released?", facts) == "30"
    assert T.scripted_answer("Where was the creator of the album The Iron Tide born?", facts) == "Osk"
    assert T.scripted_answer("Where was Nobody born?", facts) is None


def test_phase1_keeps_positive_utility_tasks_with_routing_and_execution_targets(embedder):
    from transformers import AutoTokenizer
    import grpo
    args = T.parse_with_preset(T.build_parser(), T.PRESETS, argv=["--preset", "tiny"])
    W = T.World(args, embedder)
    tok = AutoTokenizer.from_pretrained(grpo.resolve_model("embedded"))
    tasks = [q for s in T.TRAIN_SPLITS for q in W.questions[s]["train"]]
    talent_rows, ref_rows, strip_rows, st = T.build_sft_data(None, tok, W, tasks, args)
    assert st["n_kept"] == len(talent_rows) == len(strip_rows) >= 1
    assert sum(st["chosen"].values()) == st["n_kept"]
    for p, ids, mask in talent_rows:
        trained = tok.decode([i for i, m in zip(ids, mask) if m])
        route = trained.split("</talent>")[0] + "</talent>"
        assert T.parse_route(route, set(W.by_id)) in st["chosen"]  # routing target: <think>…</think><talent>c*</talent>
        assert "<answer>" in trained and "<information>" not in trained and "Talent guidance" not in trained
        assert "Talent guidance" in tok.decode(ids)  # the context is in the row, masked
    for p, ids, mask in strip_rows:
        assert "Talent guidance" not in tok.decode(p) and "<talent>" not in tok.decode(ids)


class ScriptedSampler:
    """Stands in for the policy's sampler only: routes every task to the bridge talent
    and answers correctly exactly when both talent guidance and skills are in the context."""

    def __init__(self, tok, answers):
        self.tok, self.answers = tok, answers

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        from grpo import Sample
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            if stop == ["</talent>"]:
                reply = "<think>Find the creator first.</think><talent>talent_bridge_entity</talent>"
            else:
                q = next(q for q in self.answers if q in text)
                good = "Talent guidance" in text and "Relevant skills" in text
                reply = f"<answer>{self.answers[q] if good else 'nobody'}</answer>"
            out.append([Sample(self.tok.encode(reply, add_special_tokens=False), reply) for _ in range(n)])
        return out


def test_eq10_to_eq14_in_talentrl_rollouts(embedder):
    from transformers import AutoTokenizer
    import grpo
    args = T.parse_with_preset(T.build_parser(), T.PRESETS, argv=["--preset", "tiny", "--G", "3", "--train-controls"])
    W = T.World(args, embedder)
    tok = AutoTokenizer.from_pretrained(grpo.resolve_model("embedded"))
    task = W.questions["hotpotqa"]["train"][0]
    rollouts, st = T.talentrl_rollouts(ScriptedSampler(tok, {task["question"]: task["answer"]}), tok, W, [task], args, 0)
    # anchor 1, no-skill 0, reduced-context (k = 2 skills, guidance) 1, no-prior 0 → δ = (1, 0, 1)
    assert st["delta"] == [[1.0, 0.0, 1.0]] and st["A_talent"] == [pytest.approx(2.0 * 2 / 3)]
    assert len(rollouts) == 3 + 3 and [r.info["role"] for r in rollouts] == ["P"] * 3 + ["control"] * 3
    anchor, ordinary, controls = rollouts[0], rollouts[1:3], rollouts[3:]
    n_route = len(tok.encode("<think>Find the creator first.</think><talent>talent_bridge_entity</talent>",
                             add_special_tokens=False))
    assert anchor.adv[:n_route] == [pytest.approx(4 / 3)] * n_route  # routing tokens of the anchor: Â_talent
    assert all(sum(m for m in r.mask[:n_route]) == n_route for r in rollouts[:5])
    # every rollout of 𝒫 succeeded: Eq. (10) gives 0 to all execution tokens; ordinary routing tokens get 0
    for r in [anchor] + ordinary:
        assert all(a == 0.0 for a in r.adv[n_route:])
    for r in ordinary + controls:
        assert all(a == 0.0 for a in r.adv)
    # environment tokens (the injected context) are masked
    assert 0 in anchor.mask and all(a == 0.0 for a, m in zip(anchor.adv, anchor.mask) if not m)


# ----- smoke: tiny end to end, one process and two gloo ranks -----
SMOKE = ["--preset", "tiny", "--n-test", "1", "--sft-tasks", "6", "--n-train", "5", "--rl-steps", "1",
         "--tasks-per-step", "2", "--G", "2", "--max-new-tokens", "16", "--route-max-tokens", "16",
         "--max-steps", "2", "--evolve-every", "1", "--val-tasks", "2", "--evolve-max-tokens", "16", "--sampler", "hf"]


def _run(cmd, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "results.json").read_text()), out.stdout


def test_smoke_tiny_two_rank_gloo_and_resume(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
           "talentrl.py", *SMOKE, "--run-dir", str(tmp_path)]
    res, stdout = _run(cmd, tmp_path)
    for k in ("zero-shot", "skillrl-sft", "talentrl-sft", "skillrl", "talentrl"):
        assert set(res[k]["success"]) == set(T.SPLITS) and 0 <= res[k]["overall"] <= 100
    assert "Table 1" in stdout and "Table 2" in stdout
    assert (tmp_path / "talent_selection.png").exists()
    assert (tmp_path / "talentrl" / "ckpt" / "state.pt").exists()
    assert (tmp_path / "talentrl" / "skillbanks" / "step0000.json").exists()
    rows = [json.loads(l) for l in (tmp_path / "talentrl" / "metrics.jsonl").read_text().splitlines()]
    assert {"A_talent", "delta_skill", "route_valid", "R_P", "kl"} <= set(rows[0])
    # resume: everything is done, so nothing is retrained and the results are kept
    res2, _ = _run([sys.executable, "talentrl.py", *SMOKE, "--run-dir", str(tmp_path), "--resume",
                    "--arms", "talentrl"], tmp_path)
    assert res2["talentrl"] == res["talentrl"]
