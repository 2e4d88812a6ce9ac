"""Tests for tasks/search_world.py, TalentRL's offline search world: answers and the search protocol, the
fictional encyclopedia's questions (answerable, unique, disjoint), retrieval, SkillRL-format SkillBanks and
talent catalogs, and the scripted teacher's reading of passages."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import plumbing  # noqa: E402
import tasks.search_world as S  # noqa: E402


@pytest.fixture(scope="module")
def embedder():
    return plumbing.load_embedder()


def test_answers_normalise_and_f1():
    assert S.exact_match("The  Amber Lantern.", "amber lantern") == 1.0
    assert S.exact_match(None, "x") == 0.0
    assert S.exact_match("1,234", "1234") == 1.0
    assert S.f1_score("Amber Lantern Hall", "the Amber Lantern") == pytest.approx(0.8)
    assert S.f1_score("", "x") == 0.0


def test_malformed_actions_are_penalised_not_fatal():
    task = dict(question="q", answer="Velm")
    ep = S.new_episode(task)
    assert "invalid" in S.env_reply(ep, "I think it is Velm.", lambda q: [], 4)
    assert "invalid" in S.env_reply(ep, "<search></search>", lambda q: [], 4)
    obs = S.env_reply(ep, "ok <search>hamlet</search>", lambda q: [dict(text="A."), dict(text="B.")], 4)
    assert obs.strip() == "<information>Doc 1: A. Doc 2: B.</information>"
    assert S.env_reply(ep, "<answer>velm</answer>", lambda q: [], 4) is None
    assert ep["n_invalid"] == 2 and ep["n_search"] == 1
    assert S.episode_return(ep, 0.1) == pytest.approx(0.8)
    # the step budget ends an episode without an answer: return 0 minus penalties
    ep = S.new_episode(task)
    for _ in range(3):
        assert S.env_reply(ep, "<search>x</search>", lambda q: [], 4) is not None
    assert S.env_reply(ep, "<search>x</search>", lambda q: [], 4) is None and ep["pred"] is None


@pytest.fixture(scope="module")
def world():
    w = S.build_world(3, 24, 10, 6, 6, 6, 3)
    return w, S.render_passages(w), S.build_questions(w, 3, 30, 10)


def _naive_answer(w, q):
    """Recompute the gold answer of a question from the structured world with a plain loop."""
    e = [w[i] for i in q["support"]]
    text, t = q["question"], q["qtype"]
    if text.startswith("Whose creator"):  # a bridge on each side, then compare the creators' birth years
        return min(e[:2], key=lambda x: w[x["creator"]]["born"])["name"]
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
    assert types == set(S.QTYPES)
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


def test_retrieval_finds_gold_passage_single_hop(world, embedder):
    w, passages, qs = world
    P = S.embed(embedder, [p["text"] for p in passages])
    single = [q for p in qs.values() for q in p["test"] if q["qtype"] in ("single", "longtail", "disambiguation")][:20]
    hits = sum(q["support"][0] in [d["id"] for d in S.search_corpus(q["question"], passages, P, embedder, 3)]
               for q in single)
    assert hits / len(single) >= 0.9


def test_skillbank_and_talents_load(tmp_path):
    bank, mistakes = S.load_skillbank(S.DATA / "skillbank.json")
    assert len(bank) == 26 and len({s["skill_id"] for s in bank}) == 26 and mistakes
    talents = S.load_talents(S.DATA / "talents.json", bank)
    assert len(talents) == 8 and all(t["skills"] and t["guidance"] and t["description"] for t in talents)
    # every skill belongs to at least one talent (App. B: 26 distinct referenced skills)
    assert {s for t in talents for s in t["skills"]} == {s["skill_id"] for s in bank}
    # a SkillRL-format bank from elsewhere: unknown categories load, missing associations drop
    other = {"general_skills": [{"skill_id": "g1", "title": "t", "principle": "p", "when_to_apply": "w"}],
             "task_specific_skills": {"webshop": [{"skill_id": "w1", "title": "t2", "principle": "p2"}]}}
    f = tmp_path / "bank.json"
    f.write_text(json.dumps(other))
    b2, m2 = S.load_skillbank(f)
    assert [s["skill_id"] for s in b2] == ["g1", "w1"] and b2[1]["category"] == "webshop" and m2 == other
    with pytest.warns(UserWarning, match="talent_bridge_entity: links to .*'mul_005'"):
        assert all(t["skills"] == [] for t in S.load_talents(S.DATA / "talents.json", b2))
    S.save_skillbank(tmp_path / "out.json", b2, m2)
    assert S.load_skillbank(tmp_path / "out.json")[0] == b2


def test_broken_skillbank_gives_clear_error(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(ValueError, match="SkillBank"):
        S.load_skillbank(f)
    f.write_text(json.dumps({"general_skills": [{"skill_id": "x", "title": "t"}]}))
    with pytest.raises(ValueError, match="principle"):
        S.load_skillbank(f)
    f.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="general_skills"):
        S.load_skillbank(f)


def test_scripted_teacher_reads_facts():
    doc = ("<information>Doc 1: The Iron Tide. The Iron Tide is an album released in 1950 by the composer Ka Vel. "
           "Doc 2: Ka Vel (composer). Ka Vel was a composer born in 1920 in Osk, Dalmiria. Known works: The Iron Tide.</information>")
    facts = S.read_facts(doc)
    assert S.scripted_answer("How old was the creator of The Iron Tide in the year it was released?", facts, {"arith"}) == "30"
    assert S.scripted_answer("Where was the creator of the album The Iron Tide born?", facts, {"follow"}) == "Osk"
    # without the talent's move the teacher reads naively: a year copied instead of the age computed
    assert S.scripted_answer("How old was the creator of The Iron Tide in the year it was released?", facts) == "1950"
    assert S.scripted_answer("Where was Nobody born?", facts, {"check"}) is None  # verification checks the name
    assert S.scripted_answer("Where was Nobody born?", facts) == "Osk"  # the naive reader does not


def _skill(i, **extra):
    return dict(skill_id=f"s{i}", title=f"title {i}", principle=f"principle {i}", when_to_apply=f"when {i}", **extra)


@pytest.mark.parametrize("section", ["query_type_skills", "task_specific_skills"])
def test_skillrl_bank_layouts_load_whole_and_round_trip(section, tmp_path):
    # SkillRL's search bank keeps per-type skills under query_type_skills, its ALFWorld bank under
    # task_specific_skills; both carry fields the loader does not use (metadata, extra skill keys)
    raw = {"metadata": {"source": "skillrl", "version": 3}, "general_skills": [_skill(0), _skill(1, source_type="x")],
           section: {"multi_hop": [_skill(2), _skill(3)], "comparison": [_skill(4)], "empty": []},
           "common_mistakes": [{"mistake_id": "m1", "description": "d"}]}
    f = tmp_path / "bank.json"
    f.write_text(json.dumps(raw))
    bank, kept = S.load_skillbank(f)
    assert [s["skill_id"] for s in bank] == [f"s{i}" for i in range(5)]
    assert [s["category"] for s in bank] == ["general", "general", "multi_hop", "multi_hop", "comparison"]
    S.save_skillbank(tmp_path / "out.json", bank, kept)
    assert json.loads((tmp_path / "out.json").read_text()) == raw  # a load → save round trip changes nothing
    # a skill added by evolution joins the bank's own per-type section
    S.save_skillbank(tmp_path / "grown.json", bank + [dict(_skill(9), category="bridge")], kept)
    grown = json.loads((tmp_path / "grown.json").read_text())
    assert grown[section]["bridge"] == [_skill(9)] and set(grown) == set(raw)
    # talent links to skills of the per-type section survive; a missing one is named in a warning
    talents = tmp_path / "talents.json"
    talents.write_text(json.dumps([dict(talent_id="talent_x", description="d", guidance="g", skills=["s2", "s4", "gone"])]))
    with pytest.warns(UserWarning, match=r"talent_x: links to \['gone'\]"):
        assert S.load_talents(talents, bank)[0]["skills"] == ["s2", "s4"]


# ----- issue #50: templates, the routers that need no training, routing scored against c* -----
def test_every_question_has_a_template_of_one_question_type(world):
    _, _, qs = world
    of_type = {}
    for q in (q for s in qs.values() for part in s.values() for q in part):
        name = S.template_of(q["question"])
        assert name in S.TEMPLATES, q["question"]
        assert of_type.setdefault(name, q["qtype"]) == q["qtype"], name  # a template belongs to one type
    assert S.template_of("What is the meaning of life?") == "other" and S.template_of(None) == "other"


def _lab(question, qtype, talent):
    return dict(question=question, qtype=qtype, talent=talent)


def test_no_training_routers_and_the_template_lookups_fallback_on_an_unseen_template():
    labels = [_lab("In what year was Ab Cd born?", "single", "talent_verification"),
              _lab("In what year was Ef Gh born?", "single", "talent_verification"),
              _lab("Where was Ab Cd born?", "single", "talent_bridge_entity"),
              _lab("What is the population of Xton?", "temporal", "talent_verification"),
              _lab("How old was the creator of The Amber Lantern in the year it was released?", "temporal",
                   "talent_temporal_numeric"),
              _lab("How old was the creator of The Glass Tide in the year it was released?", "temporal",
                   "talent_temporal_numeric")]
    ids = ["talent_longtail", "talent_comparison"]
    sims = {"Where was Ij Kl born?": torch.tensor([0.1, 0.9])}
    R = S.no_training_routers(labels, lambda t: sims.get(t["question"], torch.tensor([0.8, 0.2])), ids)
    assert set(R) == {"majority", "qtype-majority", "template-lookup", "nearest-description"}
    seen_single = dict(question="Where was Ij Kl born?", qtype="single")  # template birthplace: seen
    seen_temporal = dict(question="What is the population of Yton?", qtype="temporal")
    unseen = dict(question="How many years after the founding of its headquarters town was the Zu Guild "
                           "founded?", qtype="temporal")  # founding_gap: no label
    new_type = dict(question="Which river flows past the hamlet of Abc?", qtype="longtail")
    route = lambda name, t: R[name](t)
    assert [route("majority", t) for t in (seen_single, unseen)] == ["talent_verification"] * 2  # 3 of 6
    assert [route("qtype-majority", t) for t in (seen_single, seen_temporal, unseen, new_type)] == [
        "talent_verification", "talent_temporal_numeric", "talent_temporal_numeric", "talent_verification"]
    # one rule per template; an unseen template falls back to its question type's majority, then the majority
    assert [route("template-lookup", t) for t in (seen_single, seen_temporal, unseen, new_type)] == [
        "talent_bridge_entity", "talent_verification", "talent_temporal_numeric", "talent_verification"]
    assert route("nearest-description", seen_single) == "talent_comparison"
    assert route("nearest-description", unseen) == "talent_longtail"


def test_routing_accuracy_per_part_and_the_confusion_matrix():
    labels = [_lab("Where is the Ab Guild headquartered?", "single", "v"),   # hq
              _lab("Where is the Cd Guild headquartered?", "single", "v"),
              _lab("Where was Ab Cd born?", "single", "v"),                  # birthplace
              _lab("Where was Ef Gh born?", "single", "b")]
    routes = {"Where is the Ab Guild headquartered?": "v", "Where is the Cd Guild headquartered?": "b",
              "Where was Ab Cd born?": "v"}  # the last question unrouted: "none"
    r = S.routing_accuracy(labels, routes, ["hq"])
    assert r["all"] == dict(acc=0.5, n=4, hits=[1.0, 0.0, 1.0, 0.0])
    assert r["unseen"] == dict(acc=0.5, n=2, hits=[1.0, 0.0]) and r["seen"] == dict(acc=0.5, n=2, hits=[1.0, 0.0])
    assert r["confusion"] == {"v": {"v": 2}, "b": {"v": 1}, "none": {"b": 1}}
    assert S.routing_accuracy(labels, routes, [])["unseen"] == dict(acc=None, n=0, hits=[])
