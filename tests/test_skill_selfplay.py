"""Tests of skill_selfplay.py: the paper's equations against hand values, package validators, the solver phase (Eq. 6-7) on
real tasks with the tiny random model, and tiny smoke runs."""
import copy
import json
import math
import os
import random
import shutil
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import skill_selfplay as S  # noqa: E402
from plumbing import (SELFPLAY_LOGS, checkpoint_extra, effective_skills, json_text, parse_package,  # noqa: E402
                      plot_diagnostics, read_items, render_package)
from tasks.tool_calls import BFCL_CATEGORIES, tool_schema_error  # noqa: E402
from tasks.zebra import count_solutions, extract_json, make_zebra_puzzles, solution_grid, zebra_heldout  # noqa: E402
from conftest import MEMORY_GROUP, ONE_THREAD, run_group  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----- routing (App. B) -----

def test_eq11_beta_smoothing():
    assert S.smoothed_rate(3, 6, 4) == pytest.approx((3 + 2) / (6 + 4))
    assert S.smoothed_rate(0, 0, 4) == pytest.approx(0.5)  # no data: the symmetric prior


def test_eq12_composite_score():
    st = {"a": 4, "n_ver": 4, "n_con": 2, "n_fd": 0}
    # r̂ver = 6/8, r̂con = 4/8, r̂fd = 2/8 → ½·0.75 + ¼·0.5 + ¼·0.25
    assert S.skill_score(st, 4) == pytest.approx(0.5625)


def test_eq13_routing_clips_and_decays_bonus():
    fresh = {"a": 0, "n_ver": 0, "n_con": 0, "n_fd": 0}
    worn = {"a": 80, "n_ver": 0, "n_con": 0, "n_fd": 0}
    good = {"a": 80, "n_ver": 80, "n_con": 80, "n_fd": 80}
    P = S.routing_probs([fresh, worn, good], kappa=4, w_min=0.25, w_max=1.75, beta=1, tau=8)
    w = []  # naive loop of Eq. 13
    for st in (fresh, worn, good):
        v = S.skill_score(st, 4)
        w.append(min(max(v, 0.25), 1.75) * (1 + math.exp(-st["a"] / 8)))
    assert w[0] == pytest.approx(1.0)             # v = 0.5, bonus doubles it
    assert w[1] == pytest.approx(0.25, abs=1e-4)  # v ≈ 0.024 clipped up to w_min
    assert P == pytest.approx([x / sum(w) for x in w])
    assert S.routing_probs([fresh, worn], 4, 0.25, 1.75, 1, 8, uniform=True) == [0.5, 0.5]


# ----- proposer rewards (§3.2) -----

def test_eq1_v_solve_is_mean_probe_reward():
    assert S.v_solve([1.0, 0.1, 0.0, 0.9]) == pytest.approx(0.5)
    assert S.v_solve([]) == 0.0


def test_eq2_gated_frontier_reward():
    assert S.propose_reward(True, 0.5) == pytest.approx(1.0)
    assert S.propose_reward(True, 0.25) == pytest.approx(0.5)
    assert S.propose_reward(True, 1.0) == pytest.approx(0.0)
    assert S.propose_reward(False, 0.5) == 0.0


def test_eq4_probe_consistency_unique_majority():
    assert S.probe_consistent(["A", "A", "B", None], "A")
    assert not S.probe_consistent(["A", "B", None], "A")        # tie: no unique majority
    assert not S.probe_consistent(["B", "B", "A"], "A")         # majority differs from the reference
    assert not S.probe_consistent([None, None], "A")


def test_repetition_penalty_greedy_jaccard_clusters():
    texts = ["a b c d", "a b c e", "x y z", "a b c d"]
    # J(1,2) = 3/5 ≥ 0.5 → {1, 2, 4} one cluster, {3} another; ρ = |C_i| / B
    assert S.repetition_penalty(texts, 0.5) == pytest.approx([3 / 4, 3 / 4, 1 / 4, 3 / 4])
    assert S.repetition_penalty(["a b", "c d"], 0.5, B=8) == pytest.approx([1 / 8, 1 / 8])


def rec(stream, R, v, valid=True):
    return {"stream": stream, "R": R, "v_solve": v, "valid": valid}


def test_eq6_curriculum_takes_top_alpha_M_per_stream_in_band():
    recs = [rec("skill", 1.0, 0.5), rec("skill", 0.6, 0.3), rec("skill", 0.9, 0.45), rec("skill", 0.0, 1.0),
            rec("explore", 0.8, 0.6), rec("explore", 0.2, 0.1), rec("explore", 0.7, 0.35, valid=False)]
    D = S.build_curriculum(recs, M=4, alpha=0.5, v_lo=0.25, v_hi=0.75)
    assert [(r["stream"], r["R"]) for r in D] == [("skill", 1.0), ("skill", 0.9), ("explore", 0.8)]
    D = S.build_curriculum(recs, M=4, alpha=0.5, v_lo=0.25, v_hi=0.75, band=False)
    assert ("explore", 0.2) in [(r["stream"], r["R"]) for r in D]


def test_eq8_prune_below_gamma_with_enough_attempts():
    pkgs = [{"name": n} for n in "abcd"]
    stats = {"a": {"a_t": 10, "R_t": 0.1}, "b": {"a_t": 10, "R_t": 3.0}, "c": {"a_t": 1, "R_t": 0.0},
             "d": {"a_t": 5, "R_t": 0.2}}
    assert S.prune_set(pkgs, stats, gamma=0.05, min_attempts=4) == ["a", "d"]  # 0.01 and 0.04 < 0.05
    # the library never empties
    assert len(S.prune_set(pkgs[:1], {"a": {"a_t": 10, "R_t": 0}}, 0.05, 4)) == 0


def test_eq9_induce_set_frontier_exploration_records():
    recs = [rec("explore", 0.9, 0.5), rec("explore", 0.3, 0.15), rec("skill", 1.0, 0.5),
            rec("explore", 1.0, 0.5, valid=False)]
    assert S.induce_set(recs, 0.5) == [recs[0]]


def test_effective_skills_neff():
    assert effective_skills({"a": 3, "b": 3, "c": 0}) == (2, pytest.approx(2.0))
    assert effective_skills({}) == (0, 0.0)


# ----- task rewards (App. C) -----

CALL = {"name": "get_weather", "arguments": {"city": "Denver", "units": "fahrenheit"}}


def test_eq14_tool_reward_good_and_malformed():
    good = '<tool_call>{"name": "get_weather", "arguments": {"units": "fahrenheit", "city": "Denver"}}</tool_call>'
    wrong = '<tool_call>{"name": "get_weather", "arguments": {"city": "Boston"}}</tool_call>'
    assert S.tool_reward(good, CALL)[0] == pytest.approx(1.0)
    assert S.tool_reward(wrong, CALL)[0] == pytest.approx(0.1)
    assert S.tool_reward(good + wrong, CALL)[0] == pytest.approx(1.0)  # the answer is the first call
    assert S.tool_reward(wrong + good, CALL)[0] == pytest.approx(0.1)
    assert S.tool_reward('<tool_call>{"name": get_weather}</tool_call>', CALL)[0] == 0.0
    assert S.tool_reward("get_weather(city='Denver')", CALL)[0] == 0.0
    assert S.tool_reward("", CALL)[0] == 0.0


def grid_text(grid):
    return "Here it is: " + json.dumps(grid)


def test_eq15_zebra_reward_good_wrong_and_malformed():
    _, p, sol = make_zebra_puzzles(5, ["small"], 1)[0]
    assert S.zebra_reward(grid_text(sol), p, sol)[:4] == (1.0, True, True, 1.0)
    swapped = copy.deepcopy(sol)  # swap one attribute between houses 1 and 2: legal grid, wrong cells
    a = next(iter(p["attributes"]))
    swapped["House 1"][a], swapped["House 2"][a] = sol["House 2"][a], sol["House 1"][a]
    r, valid, full, cell, _ = S.zebra_reward(grid_text(swapped), p, sol)
    n = p["houses"] * len(p["attributes"])
    assert (r, valid, full) == (pytest.approx(0.1), True, False) and cell == pytest.approx((n - 2) / n)
    broken = copy.deepcopy(sol)
    del broken["House 1"][a]
    assert S.zebra_reward(grid_text(broken), p, sol)[:3] == (0.0, False, False)
    assert S.zebra_reward("no grid {here", p, sol)[:4] == (0.0, False, False, 0.0)


# ----- the skill stream compiles every package's blueprint -----

def test_every_package_blueprint_compiles_to_a_unique_puzzle():
    # every training-side compiled puzzle (skill stream) compiles and is unique too: each package's own blueprint
    pkgs, _ = S.load_library(os.path.join(ROOT, "data", "selfplay", "zebra"), "zebra")
    assert len(pkgs) == 8
    for i, pkg in enumerate(pkgs):
        bp = {"houses": pkg["example"]["houses"], "attributes": pkg["example"]["attributes"]}
        r = S.check_proposal("zebra", json.dumps(bp), pkg, random.Random(i))
        assert r["reject"] is None and r["ok_schema"] and r["ok_contract"], (pkg["name"], r["why"])
        assert count_solutions(r["task"], 2)[0] == 1
        assert solution_grid(r["task"], count_solutions(r["task"], 2)[1]) == r["contract"]


# ----- skill packages and validators -----

def test_initial_libraries_load_and_roundtrip():
    for fam, n in (("tool", 15), ("zebra", 8)):
        pkgs, stats = S.load_library(os.path.join(ROOT, "data", "selfplay", fam), fam)
        assert len(pkgs) == n and set(stats) == {p["name"] for p in pkgs}
        for p in pkgs:
            back, err = parse_package(render_package(p))
            assert err is None and back == p


def tool_pkg():
    pkgs, _ = S.load_library(os.path.join(ROOT, "data", "selfplay", "tool"), "tool")
    return copy.deepcopy(next(p for p in pkgs if p["title"] == "observation_grounded_identifier"))


def test_validators_reject_broken_packages(tmp_path):
    pkg = tool_pkg()
    assert S.validate_package(pkg, "tool") is None
    bad = copy.deepcopy(pkg)
    bad["validator"]["run_python"] = "import os"
    assert "unknown validator key" in S.validate_package(bad, "tool")
    bad = copy.deepcopy(pkg)
    bad["example"]["call"]["arguments"]["restaurant_id"] = "XYZ-1"  # not grounded in the dialogue
    assert "grounded" in S.validate_package(bad, "tool")
    bad = copy.deepcopy(pkg)
    bad["rules"] = " "
    assert "empty" in S.validate_package(bad, "tool")
    assert S.validate_package(pkg, "zebra") is not None            # wrong family
    zpkgs, _ = S.load_library(os.path.join(ROOT, "data", "selfplay", "zebra"), "zebra")
    z = copy.deepcopy(zpkgs[0])
    z["example"]["clues"] = [c for c in z["example"]["clues"] if c["type"] != "same_house"]  # pets now free
    assert "uniquely" in S.validate_package(z, "zebra")
    z = copy.deepcopy(zpkgs[0])
    z["compiler"]["min_counts"] = {"teleport": 1}
    assert S.validate_package(z, "zebra") is not None
    # a broken file in a library folder is skipped, never a crash
    (tmp_path / "ok.md").write_text(render_package(pkg))
    (tmp_path / "broken.md").write_text("---\nname: x\n---\n## Validator\n```json\n{not json\n```\n")
    (tmp_path / "nofront.md").write_text("just text")
    pkgs, _ = S.load_library(str(tmp_path), "tool")
    assert [p["name"] for p in pkgs] == [pkg["name"]]


def test_validators_reject_proposals():
    pkg = tool_pkg()
    good = json.dumps(pkg["example"])
    r = S.check_proposal("tool", good, pkg, random.Random(0))
    assert r["ok_schema"] and r["ok_contract"]
    assert S.check_proposal("tool", "I cannot write JSON", pkg, random.Random(0)) is None  # unparseable → −1
    t = copy.deepcopy(pkg["example"])
    del t["call"]["arguments"]["guests"]                       # missing required argument: schema
    r = S.check_proposal("tool", json.dumps(t), pkg, random.Random(0))
    assert not r["ok_schema"] and "missing required" in r["why"]
    t = copy.deepcopy(pkg["example"])
    t["dialogue"] = [d for d in t["dialogue"] if d["role"] != "observation"]  # package ν: needs an observation
    r = S.check_proposal("tool", json.dumps(t), pkg, random.Random(0))
    assert r["ok_schema"] and not r["ok_contract"]
    assert S.check_proposal("tool", json.dumps(t), None, random.Random(0))["ok_contract"]  # exploration skips ν
    t = copy.deepcopy(pkg["example"])
    t["call"]["arguments"]["guests"] = "four"                  # wrong type
    assert not S.check_proposal("tool", json.dumps(t), pkg, random.Random(0))["ok_schema"]
    # zebra exploration: proposer clues must already be unique
    many = {"houses": 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]},
            "clues": [{"type": "next_to", "a": "Ann", "b": "Ben"}]}
    r = S.check_proposal("zebra", json.dumps(many), None, random.Random(0))
    assert not r["ok_schema"] and "solutions" in r["why"]
    many["clues"] += [{"type": "fixed", "a": "Ann", "house": 1}, {"type": "same_house", "a": "Ann", "b": "Cat"}]
    r = S.check_proposal("zebra", json.dumps(many), None, random.Random(0))
    assert r["ok_schema"] and r["contract"] == {"House 1": {"Name": "Ann", "Pet": "Cat"},
                                                "House 2": {"Name": "Ben", "Pet": "Dog"}}
    bad = {"houses": 2, "attributes": {"Name": ["Ann", "Ann"], "Pet": ["Cat", "Dog"]}}
    assert "repeated" in S.check_proposal("zebra", json.dumps(bad), None, random.Random(0))["why"]


# ----- the proposal gate never raises (model output is hostile input) -----

def _library(family):
    return S.load_library(os.path.join(ROOT, "data", "selfplay", family), family)[0]


def _gate_ok(family, task, pkg):
    """check_proposal on a task must return None (not a JSON object) or a record that either passed every gate
    or names the gate that rejected it and why; it must never raise."""
    out = S.check_proposal(family, json.dumps(task), pkg, random.Random(0))
    if not isinstance(task, dict):
        assert out is None
        return out
    assert out["reject"] in (None,) + S.REJECT_TYPES
    if out["reject"] is None:
        assert out["ok_schema"] and out["ok_contract"] and out["contract"] is not None and out["why"] == ""
    else:
        assert isinstance(out["why"], str) and out["why"]
    return out


def test_gate_rejects_the_reported_mutations_with_a_reason():
    """The mutations of the issue, one field replaced by a value of another type; each raised before
    (TypeError "unhashable type", KeyError, ...). Now each is typed and explained, in both streams."""
    tool = tool_pkg()
    zebra = next(p for p in _library("zebra") if any(c["type"] == "fixed" for c in p["example"]["clues"]))
    ex = tool["example"]
    tool_cases = []
    t = copy.deepcopy(ex)
    t["tools"][0]["parameters"]["properties"][next(iter(t["tools"][0]["parameters"]["properties"]))]["type"] = ["string", "null"]
    tool_cases.append(t)
    t = copy.deepcopy(ex)
    t["tools"][0]["parameters"]["required"] = [{"name": "x"}]
    tool_cases.append(t)
    t = copy.deepcopy(ex)
    t["call"]["name"] = [t["call"]["name"]]
    tool_cases.append(t)
    t = copy.deepcopy(ex)
    t["tools"][0]["parameters"]["properties"][next(iter(t["tools"][0]["parameters"]["properties"]))]["enum"] = 5
    tool_cases.append(t)
    for t in tool_cases:
        for pkg in (tool, None):
            assert _gate_ok("tool", t, pkg)["reject"] == "schema"
    z = copy.deepcopy(zebra["example"])
    fixed = next(c for c in z["clues"] if c["type"] == "fixed")
    fixed["b"] = "Nobody"                                           # a stray "b" on a one-value clue: ignored
    for pkg in (zebra, None):
        assert _gate_ok("zebra", z, pkg)["reject"] is None
    z = copy.deepcopy(zebra["example"])
    z["clues"][0]["type"] = ["fixed"]                               # a list-valued clue type
    for pkg in (zebra, None):
        assert _gate_ok("zebra", z, pkg)["reject"] == "schema"
    deep = "[" * 100000 + "]" * 100000                              # hostile nesting depth: unparseable, not a crash
    assert S.check_proposal("tool", deep, None, random.Random(0)) is None
    assert S.parse_tool_calls("<tool_call>" + deep + "</tool_call>") == [] and extract_json(deep) is None


_SCALARS = (st.none() | st.booleans() | st.integers(-3, 8) | st.floats() | st.text(max_size=6)
            | st.sampled_from(["fixed", "same_house", "string", "integer", "user", "observation", "Alice", "b"]))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["b", "house", "type", "enum", "required", "items", "name", "arguments", "a", "role"])
    | st.text(max_size=5), inner, max_size=3), max_leaves=6)


def _paths(obj, path=()):
    yield path
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, path + (k,))


def _mutate(data, task):
    """One to three mutations of a worked example: replace a value (any JSON value, often of another type),
    add a key to an object, or delete a key or element."""
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(task))))
        op = data.draw(st.sampled_from(["replace", "add", "delete"]))
        value = data.draw(_JSON)
        if not path:
            task = value if op == "replace" else task
            continue
        parent = task
        for k in path[:-1]:
            parent = parent[k]
        target = parent[path[-1]]
        if op == "replace":
            parent[path[-1]] = value
        elif op == "add" and isinstance(target, dict):
            target[data.draw(st.sampled_from(["b", "house", "type", "enum", "required", "name", "extra"]))] = value
        elif op == "delete":
            del parent[path[-1]]
    return task


@pytest.mark.parametrize("stream", ["skill", "explore"])
@pytest.mark.parametrize("family", ["tool", "zebra"])
def test_gate_never_raises_on_mutated_package_examples(family, stream):
    """Property-based (hypothesis): mutated worked examples of every package of S(0), in both streams, never
    make check_proposal raise; every outcome is a pass or a typed rejection with a reason."""
    pkgs = _library(family)
    seen = set()

    @settings(max_examples=60 * len(pkgs), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        pkg = data.draw(st.sampled_from(pkgs))
        seen.add(pkg["name"])
        _gate_ok(family, _mutate(data, copy.deepcopy(pkg["example"])), pkg if stream == "skill" else None)

    check()
    assert seen == {p["name"] for p in pkgs}  # every package's example was mutated


def test_proposal_is_the_json_object_the_reply_opens_with():
    """A proposal is the object the reply starts with; trailing chatter is ignored, and an object found only
    later in the reply (a fragment, a repeated example) is not a proposal: unparseable, reward −1."""
    pkg = tool_pkg()
    good = json.dumps(pkg["example"])
    r = S.check_proposal("tool", "  " + good + "\n\nThis task asks the assistant to book a table. {\"a\": 1}", pkg,
                         random.Random(0))
    assert r["ok_schema"] and r["ok_contract"] and r["task"] == pkg["example"]
    assert S.check_proposal("tool", "Here is a task: " + good, pkg, random.Random(0)) is None
    broken = '{"houses": 3, "attributes": {"Name": ["A", "B"]}, "clues": [{"type": "fixed", "a": "A", "house": 1}'
    assert S.check_proposal("zebra", broken, None, random.Random(0)) is None  # was: the inner clue, "houses must be…"
    assert S.first_json_object('[1, 2]') is None


def test_task_schemas_admit_the_package_examples_and_reject_broken_tasks():
    """--proposer-grammar: the JSON schema that constrains decoding admits every worked example of S(0) (up to
    the schema's length caps) and rejects the shapes check_proposal would reject anyway."""
    import jsonschema  # installed with vllm
    rejected = []
    for family in ("tool", "zebra"):
        pkgs, _ = S.load_library(os.path.join(ROOT, "data", "selfplay", family), family)
        for p in pkgs:
            if not jsonschema.Draft202012Validator(S.TASK_SCHEMA[family]).is_valid(p["example"]):
                rejected.append(p["name"])
    assert rejected == ["tool_012"]  # its call nests an object argument, which the grammar leaves out
    v = jsonschema.Draft202012Validator(S.TASK_SCHEMA["zebra"])
    good = {"houses": 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]}, "clues": []}
    assert v.is_valid(good)
    assert not v.is_valid(dict(good, houses=3))                       # 2 values per attribute but 3 houses
    assert not v.is_valid(dict(good, extra=1))
    t = tool_pkg()["example"]
    assert not jsonschema.Draft202012Validator(S.TASK_SCHEMA["tool"]).is_valid(dict(t, call={"name": "x"}))


def test_solver_aid_tool_prefix_is_prompt_and_part_of_the_scored_answer():
    """--solver-aid on (tool): probes see the chat prompt plus the call opening, stop after the call, and
    Eq. 14 scores prefix + completion; off: the plain prompt and no stop."""
    from transformers import AutoTokenizer
    import plumbing
    tok = AutoTokenizer.from_pretrained(plumbing.resolve_model("embedded"))
    pkg = tool_pkg()
    rec = S.check_proposal("tool", json.dumps(pkg["example"]), pkg, random.Random(0))
    rec.update(stream="skill", skill=pkg["name"], proposal="")
    call = pkg["example"]["call"]
    completion = call["name"] + '", "arguments": ' + json.dumps(call["arguments"]) + "}</tool_call>"

    class Recording(FixedReply):
        def generate(self, prompts, n, *a, **k):
            self.prompts, self.stop = prompts, k.get("stop")
            return super().generate(prompts, n)
    args = type("A", (), {"family": "tool", "solver_aid": True, "K": 4, "max_new_tokens": 8, "temperature": 1.0})()
    sampler = Recording(completion)
    S.probe_records("tool", [rec], sampler, tok, args)
    plain = S.chat_ids(tok, S.solver_messages("tool", rec["task"]))
    assert sampler.prompts[0][:len(plain)] == plain and tok.decode(sampler.prompts[0][len(plain):]) == '<tool_call>{"name": "'
    assert sampler.stop == ["</tool_call>"]
    assert rec["v_solve"] == pytest.approx(1.0) and rec["consistent"] and rec["valid"]
    args.solver_aid = False
    rec2 = dict(rec)
    S.probe_records("tool", [rec2], sampler, tok, args)             # the same completion without the opening
    assert sampler.prompts[0] == plain and sampler.stop is None and rec2["v_solve"] == 0.0 and not rec2["valid"]


def test_proposer_grammar_on_vllm_prefill_on_hf():
    """--proposer-grammar on: a sampler that can constrain decoding gets TASK_SCHEMA and no prefill; the HF
    sampler, which cannot, gets the PROPOSER_PREFIX prefill instead (and the prefix is part of the proposal)."""
    from plumbing import Dist
    tok = _tok()
    args = S.parse_args(["--family", "zebra", "--preset", "tiny"])
    assert args.proposer_grammar is True
    pkgs, stats = S.load_library(os.path.join(ROOT, "data", "selfplay", "zebra"), "zebra")
    reply = ' 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]}, "clues": []}'

    class Constraining(FixedReply):  # stands in for vLLM: records what it was asked
        def generate(self, prompts, n, *a, **k):
            self.prompts, self.schema = prompts, k.get("json_schema")
            return super().generate(prompts, n)

    class HF(S.HFSampler):
        def __init__(self):
            self.text = reply

        def generate(self, prompts, n, *a, **k):
            self.prompts, self.schema = prompts, k.get("json_schema")
            return FixedReply.generate(self, prompts, n)

    plain = S.chat_ids(tok, S.proposer_messages("zebra", None))
    for sampler, schema, prefix in ((Constraining('{"houses":' + reply), S.TASK_SCHEMA["zebra"], ""),
                                    (HF(), None, S.PROPOSER_PREFIX["zebra"])):
        P = S.Players(None, None, None, None, None, sampler, None, FixedReply("no"), None, tok)
        _, local, _ = S.propose("t", 2, P, pkgs, stats, args, random.Random(0), Dist())
        assert sampler.schema == schema
        explore = sampler.prompts[-1]  # the exploration-stream prompt
        assert explore[:len(plain)] == plain and tok.decode(explore[len(plain):]) == prefix
        assert all(x["rec"] is not None and x["rec"]["proposal"].startswith('{"houses":') for x in local)


def test_solver_aid_zebra_grid_schema():
    """--solver-aid on (zebra): each probe is decoded under its own puzzle's grid_schema, which admits the
    solution and any grid of the puzzle's values, and nothing else; off: no schema."""
    import jsonschema  # installed with vllm
    _, p, sol = make_zebra_puzzles(3, ["small"], 1)[0]
    v = jsonschema.Draft202012Validator(S.grid_schema(p))
    assert v.is_valid(sol)
    a = next(iter(p["attributes"]))
    same = {h: dict(row, **{a: p["attributes"][a][0]}) for h, row in sol.items()}  # a repeated value: allowed
    assert v.is_valid(same) and not S.zebra_reward(json.dumps(same), p, sol)[1]  # ... but not a valid structure
    assert not v.is_valid({**sol, "House 9": sol["House 1"]})
    assert not v.is_valid(dict(sol, **{"House 1": dict(sol["House 1"], **{a: "Nobody"})}))
    rec = {"task": p, "contract": sol, "ok_schema": True, "ok_contract": True, "stream": "explore", "why": ""}

    class Recording(FixedReply):
        def generate(self, prompts, n, *args_, **k):
            self.schema = k.get("json_schema")
            return super().generate(prompts, n)
    args = type("A", (), {"family": "zebra", "solver_aid": True, "K": 2, "max_new_tokens": 8, "temperature": 1.0})()
    sampler = Recording(json.dumps(sol))
    S.probe_records("zebra", [rec], sampler, _tok(), args)
    assert sampler.schema == [S.grid_schema(p)] and rec["v_solve"] == pytest.approx(1.0)
    args.solver_aid = False
    S.probe_records("zebra", [dict(rec)], sampler, _tok(), args)
    assert sampler.schema is None


def _tok():
    from transformers import AutoTokenizer
    import plumbing
    return AutoTokenizer.from_pretrained(plumbing.resolve_model("embedded"))


def test_plot_diagnostics_writes_both_figures(tmp_path):
    """Figure 5a/5c/6 panels and the Figure 5b PCA of (real) MiniLM embeddings of the task texts by stream."""
    pkgs, _ = S.load_library(os.path.join(ROOT, "data", "selfplay", "zebra"), "zebra")
    recs = [{"stream": "skill" if i % 2 else "explore", "x_text": S.render_zebra_prompt(p["example"]), "valid": True,
             "skill": p["name"], "v_solve": 0.5, "R": 1.0} for i, p in enumerate(pkgs)]
    rows = [dict(S.iteration_metrics(recs, recs, pkgs, {}, [], t), iteration=t) for t in (1, 2)]
    spread = plot_diagnostics(str(tmp_path), rows, [recs, []])
    assert (tmp_path / "diagnostics.png").stat().st_size > 0 and (tmp_path / "tasks_pca.png").stat().st_size > 0
    assert set(spread) == {"skill", "explore"} and all(v > 0 for v in spread.values())


class FixedReply:
    """Stands in for the controller LLM (not the component under test): a fixed reply."""

    def __init__(self, text):
        self.text = text

    def generate(self, prompts, n, *a, **k):
        return [[type("S", (), {"text": self.text, "ids": [0], "logprobs": None, "forced": None})() for _ in range(n)] for _ in prompts]


def test_eq10_induction_integrity_and_novelty():
    from transformers import AutoTokenizer  # only for chat_ids; any chat tokenizer works
    import plumbing
    tok = AutoTokenizer.from_pretrained(plumbing.resolve_model("embedded"))
    pkg = tool_pkg()
    r = S.check_proposal("tool", json.dumps(pkg["example"]), None, random.Random(0))
    r.update(stream="explore", valid=True, R=0.9, v_solve=0.55,
             x_text="\n".join(m["content"] for m in S.solver_messages("tool", r["task"])))
    args = type("A", (), {"family": "tool", "induce_min": 2, "controller_max_new_tokens": 8, "novelty_threshold": 0.6})()
    reply = ("Title: booking after discovery\nDescription: book a table using an id seen in a search result\n"
             "Rules: put the id only in an observation\nHints: vary cities and ids")
    new, log = S.induce_packages([r], FixedReply(reply), tok, [], args, t=0)
    assert len(new) == 1 and new[0]["source"] == "skill_induction" and log[0]["op"] == "induce"
    assert new[0]["validator"]["tool_name"] == "book_table"
    new2, log2 = S.induce_packages([r], FixedReply(reply), tok, new, args, t=1)   # duplicate → not novel
    assert new2 == [] and "novel" in log2[0]["reason"]
    new3, log3 = S.induce_packages([r], FixedReply("sorry"), tok, [], args, t=1)   # incomplete → integrity
    assert new3 == [] and log3[0]["op"] == "induce_rejected"


# ----- smoke test of the tiny preset -----

TINY_ZEBRA_PACKAGE = """---
name: zebra_tiny
title: two_house_anchor
family: zebra
source: initial
iteration: 0
derived_from:
description: Two houses, one fixed value.
---
# two_house_anchor

## Rules
Fix one value.

## Hints
Keep it small.

## Compiler
```json
{"preferred": ["fixed"], "fixed_limit": 1, "min_counts": {}}
```

## Validator
```json
{"max_houses": 2}
```

## Example
```json
{"houses": 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]},
 "clues": [{"type": "fixed", "a": "Ann", "house": 1}, {"type": "same_house", "a": "Ann", "b": "Dog"}]}
```
"""


def _in_grid_schema(text, p):
    """text is an instance of p's grid_schema: every house, every attribute in order, each cell one of its values."""
    try:
        grid = json.loads(text)
    except ValueError:
        return False
    return isinstance(grid, dict) and list(grid) == [f"House {h}" for h in range(1, p["houses"] + 1)] and all(
        isinstance(row, dict) and list(row) == list(p["attributes"])
        and all(row[a] in vals for a, vals in p["attributes"].items()) for row in grid.values())


def test_smoke_tiny(tmp_path, tiny_model_dir):
    """The tiny preset, shrunk further, on the tiny random model: one iteration of zebra self-play end to end,
    then a resume with nothing left to do. The random model is SFT-primed (--proposer-sft-steps, difference 13)
    on the worked example of a one-package library, the smallest puzzle the runtime accepts; the test fails
    unless proposals pass every gate (valid), D(t) is not empty and the solver takes its GRPO step on it, and
    unless the loop closed (#52 §3: loop_failures empty, so the step had an advantage term). That needs the
    solver's answers decoded under their grid schema, which --sampler hf does through ConstrainedHFSampler
    (plumbing.schema_sampler): a random solver's sampled grids then differ in R_solve (0.1 for a valid structure,
    1 for the solution), where free text scores 0 on every answer and the update is the KL term alone."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "zebra_tiny.md").write_text(TINY_ZEBRA_PACKAGE)
    run = tmp_path / "run"
    flags = ["--family", "zebra", "--preset", "tiny", "--model", tiny_model_dir, "--T", "1",  # bf16 weights (MasterAdamW)
             "--library", str(tmp_path / "lib"), "--proposer-sft-steps", "150", "--proposer-sft-lr", "1e-2",
             "--proposer-prompts", "2", "--proposer-G", "2", "--proposer-max-new-tokens", "100", "--max-new-tokens", "48",
             "--solver-steps", "1", "--solver-G", "8", "--K", "2", "--zebra-eval-per-scale", "1", "--zebra-eval-scales", "small",
             "--solver-sft-steps", "2", "--solver-sft-tasks", "2", "--solver-sft-lr", "1e-2",
             "--rg-eval-n", "1", "--induce-min", "1", "--controller-max-new-tokens", "32", "--collect-prompts", "1",
             "--sampler", "hf", "--no-plots", "--run-dir", str(run)]
    out = S.main(flags)
    assert [name for name, _ in out["history"]] == ["base", "solver SFT", "iter 1"]
    # the iter-1 row's grid and cell accuracy, regraded from its saved replies by Eq. 15's checker: per puzzle the
    # mean over its replies (avg@k), then the mean over the held-out puzzles
    puzzles, _ = zebra_heldout(S.parse_args(flags))
    items = read_items(run, "iter 1")
    graded = [[S.grade_grid(t, puzzles[it["i"]][1], puzzles[it["i"]][2]) for t in it["answers"]] for it in items]
    mean = lambda xs: sum(xs) / len(xs)
    assert len(items) == len(puzzles) and out["history"][-1][1]["zebra_grid"] == pytest.approx(
        mean([mean([full for _, full, _, _ in g]) for g in graded]))
    assert out["history"][-1][1]["zebra_cell"] == pytest.approx(mean([mean([cell for _, _, cell, _ in g]) for g in graded]))
    row = out["rows"][0]
    assert row["n_proposals_parsed"] + row["n_proposals_unparsed"] == 2 * 2 + 1 * 2
    assert row["n_accepted_skill"] + row["n_accepted_explore"] >= 1, row   # some proposal passed every gate
    assert row["pool_size"] >= 1 and row["lib_size"] >= 1
    assert json.loads(open(run / "proposer_sft" / "metrics.jsonl").readlines()[-1])["sft_loss"] < 0.5
    # the proposer's GRPO step starts from the primed weights: an optimizer built before the warm-up would hold
    # fp32 masters of the base weights and write them back (the warm-up undone at the first step)
    from safetensors.torch import load_file
    base = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    primed = load_file(str(run / "ckpt" / "proposer" / "model.safetensors"))
    assert max((primed[k].float() - base[k].float()).abs().max().item() for k in base if k in primed) > 0.05
    (step,) = [json.loads(line) for line in open(run / "solver" / "metrics.jsonl")]
    assert step["grad_norm"] > 0 and step["skipped"] == 0.0                 # the solver trained on D(t) ...
    # results.json's loop holds this iteration, and the loop closed: D(t) was not empty and the solver's step had
    # an advantage term (a group whose rewards differ). Unconstrained answers of the random solver all score 0, so
    # this fails without the grid schema (test_loop_check_fails_on_… checks that the check fails then)
    results = json.load(open(run / "results.json"))
    loop = results["loop"]
    assert loop["pool_size"] == [row["pool_size"]] and loop["solver_pg_steps"] == [1], loop
    assert results["loop_failures"] == [], results["loop_failures"]
    recs = [json.loads(line) for line in open(run / "records" / "iter_0.jsonl")]
    # the solver's sampler decodes under the grid schema (the held-out replies: its own decoding, every row)
    assert all(_in_grid_schema(t, puzzles[it["i"]][1]) for it in items for t in it["answers"])
    assert len(recs) == row["n_proposals_parsed"]
    assert sum(r["valid"] for r in recs) == row["n_accepted_skill"] + row["n_accepted_explore"]
    assert all(r["reject"] in (None,) + S.REJECT_TYPES and (r["valid"] or r["why"]) for r in recs)
    assert os.path.exists(run / "ckpt" / "solver" / "model.safetensors") and os.path.exists(run / "ckpt" / "state.pt")
    assert checkpoint_extra(run)["iteration"] == 1
    assert os.path.exists(run / "library" / "iter_1" / "stats.json")
    with open(run / "metrics.jsonl") as f:
        assert json.loads(f.readline())["iteration"] == 1
    again = S.main(flags + ["--resume"])  # nothing left to do: the saved history comes back
    assert [name for name, _ in again["history"]] == ["base", "solver SFT", "iter 1"]
    assert sorted(os.listdir(run / "eval")) == ["base.jsonl", "iter_1.jsonl", "solver_SFT.jsonl",
                                                 "trivial_clue_reader.jsonl", "trivial_clue_reader_not.jsonl",
                                                 "trivial_constant.jsonl", "trivial_listed_order.jsonl"]


@pytest.mark.heavy(53)
@pytest.mark.multirank
def test_smoke_two_rank_gloo_and_resume(tmp_path, tiny_model_dir):
    """torchrun with 2 gloo ranks on the tiny random model (tool family): one iteration, a torchrun resume
    that runs the second, then a plain-python resume with nothing left to do; and one plain process running
    both iterations. The proposer's and solver's samplers are scripted (tests/selfplay_ddp_check.py: the
    random model writes no valid tool task), the rest is the real loop. Checks signal (valid proposals, a
    non-empty D(t), solver steps with a non-zero gradient), that the gathered batch, σ, the broadcast library
    and the sharded evaluation are whole, that only rank 0 prints, and that the resumed two-rank run equals
    the one process: the same metrics rows, records and final weights."""
    import torch
    from safetensors.torch import load_file
    flags = [os.path.join(ROOT, "tests", "selfplay_ddp_check.py"), "--family", "tool", "--preset", "tiny",
             "--model", tiny_model_dir, "--proposer-prompts", "4", "--proposer-G", "2", "--K", "2", "--max-new-tokens", "8",
             "--solver-steps", "1", "--eval-n", "3", "--controller-max-new-tokens", "8", "--prune-min-attempts", "99",
             "--collect-prompts", "2", "--proposer-sft-steps", "1", "--solver-sft-steps", "1", "--no-proposer-grammar",
             "--sampler", "hf", "--no-autocast", "--no-plots"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, **ONE_THREAD}
    one, two = tmp_path / "one", tmp_path / "two"

    def run(cmd, run_dir):
        out = run_group(cmd + ["--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    run([sys.executable] + flags + ["--T", "2"], one)
    stdout = run(torchrun + flags + ["--T", "1"], two)
    assert stdout.count("held-out eval of the base model") == 1  # rank 0 prints, rank 1 is silent
    assert stdout.count("Avg.") == 2                             # the table: base, then after iteration 1
    stdout = run(torchrun + flags + ["--T", "2", "--resume"], two)
    assert "resumed" in stdout and "held-out eval of the base model" not in stdout
    rows = [json.loads(line) for line in open(two / "metrics.jsonl")]
    assert [r["iteration"] for r in rows] == [1, 2]
    keys = {"n_proposals_parsed", "pool_size", "lib_size", "valid_rate_skill", "valid_rate_explore", "v_solve_skill",
            "active_skills", "n_eff", "n_induced", "n_refined", "n_pruned", "bfcl_simple_python", "bfcl_live_simple",
            "bfcl_avg", "time_propose", "time_eval"}
    assert keys <= set(rows[0]) and keys <= set(rows[1])
    B = 4 * 2 + 2 * 2  # proposer rollouts of one step plus the collection pass (2 prompts × G), over both ranks
    prop = [json.loads(line) for line in open(two / "proposer" / "metrics.jsonl")]
    assert [r["step"] for r in prop] == [0, 1] and {"reward", "n_unparsed", "n_valid", "kl", "grad_norm"} <= set(prop[0])
    solver = [json.loads(line) for line in open(two / "solver" / "metrics.jsonl")]
    for t, (row, p, s) in enumerate(zip(rows, prop, solver)):
        assert row["n_proposals_parsed"] + row["n_proposals_unparsed"] == B  # gathered: both ranks, both passes
        assert row["n_proposals_unparsed"] >= p["n_unparsed"]
        # signal: valid proposals of both streams, a non-empty D(t), a solver step with a gradient
        assert row["n_accepted_skill"] >= 1 and row["n_accepted_explore"] >= 1 and p["n_valid"] >= 1, row
        assert row["pool_size"] >= 1 and s["step"] == t and s["grad_norm"] > 0 and p["grad_norm"] > 0
        with open(two / "records" / f"iter_{t}.jsonl") as f:
            assert len(f.readlines()) == row["n_proposals_parsed"]
    for t in (1, 2):  # σ counts every skill-stream attempt of both ranks: (2 + 1) skill prompts × G = 2 per iteration
        stats = json.load(open(two / "library" / f"iter_{t}" / "stats.json"))
        assert sum(st["a"] for st in stats.values()) == 6 * t
        assert len(stats) == rows[t - 1]["lib_size"]
    ck = two / "ckpt"  # iteration 2's pair, one commit; iteration 1's is gone
    assert checkpoint_extra(two)["iteration"] == 2 and os.path.exists(ck / "rng_1.pt")
    assert not os.path.exists(two / "ckpt.old") and not os.path.exists(two / "ckpt.tmp")
    # two ranks (and a resume) = one process: rows, records, weights
    for sub, n in (("", 2), ("proposer", 2), ("solver", 2), ("proposer_sft", 1), ("solver_sft", 1)):
        a, b = ([{k: v for k, v in json.loads(line).items() if not k.startswith("time")}
                 for line in open(d / sub / "metrics.jsonl")] for d in (one, two))
        assert len(a) == len(b) == n and all(x.keys() == y.keys() for x, y in zip(a, b)), sub
        for x, y in zip(a, b):  # floats to rounding (DDP sums in another order), the rest exactly
            assert all(x[k] == (pytest.approx(y[k], rel=1e-5, abs=1e-7, nan_ok=True) if isinstance(y[k], float) else y[k])
                       for k in x), (sub, x, y)
    for t in (0, 1):
        assert open(one / "records" / f"iter_{t}.jsonl").read() == open(two / "records" / f"iter_{t}.jsonl").read()
    for name in ("proposer", "solver"):
        wa, wb = (load_file(str(d / "ckpt" / name / "model.safetensors")) for d in (one, two))
        assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa), name
    stdout = run([sys.executable] + flags + ["--T", "2", "--resume"], two)  # the other launcher: nothing left to do
    assert "resumed" in stdout and stdout.count("Avg.") == 1
    assert len(open(two / "metrics.jsonl").readlines()) == 2


# ----- solver phase (Eq. 6-7) on a curriculum of real tasks -----

def curriculum_records(family):
    """Valid tasks that went through the proposer's own gate (check_proposal): a package's worked example in
    the skill stream (its validator ν applies) and a second task in the exploration stream (a runtime puzzle
    for zebra), plus a valid task outside the frontier band and an invalid one. The probe outcome is set by
    hand (consistent, v_solve given): a random model's K probes never put a task in the band."""
    pkgs, _ = S.load_library(os.path.join(ROOT, "data", "selfplay", family), family)
    if family == "tool":  # short reference calls, so a primed tiny model can reproduce them
        by_tool = {p["example"]["call"]["name"]: p for p in pkgs}
        skill, explore, outside = by_tool["set_light"], by_tool["search_products"]["example"], by_tool["get_weather"]["example"]
    else:
        skill = min(pkgs, key=lambda p: p["example"]["houses"] * len(p["example"]["attributes"]))
        explore, outside = [p for _, p, _ in make_zebra_puzzles(7, ["small"], 2)]
    recs = []
    for stream, task, pkg, v in (("skill", skill["example"], skill, 0.5), ("explore", explore, None, 0.4),
                                 ("explore", outside, None, 0.9)):
        text = json.dumps(task)
        r = S.check_proposal(family, text, pkg, random.Random(0))
        assert r["ok_schema"] and r["ok_contract"], r["why"]
        r.update(stream=stream, skill=pkg["name"] if pkg else None, iteration=0, proposal=text, v_solve=v,
                 consistent=True)
        recs.append(r)
    broken = S.check_proposal(family, json.dumps({"houses": 1} if family == "zebra" else {"tools": []}), None,
                              random.Random(0))
    assert not broken["ok_schema"]
    recs.append({**broken, "stream": "explore", "skill": None, "v_solve": 0.5, "consistent": False})
    for r in recs:  # Eq. (4) and Eq. (2), as probe_records computes them
        r["valid"] = r["ok_schema"] and r["ok_contract"] and r["consistent"]
        r["R"] = S.propose_reward(r["valid"], r["v_solve"])
    return pkgs, recs


def solver_args(model_dir, family, run_dir, *extra):
    """Tiny-preset arguments for the solver-phase tests; the v_solve band filters both families here (the
    default for zebra is off, as in Table 5; test_eq6 covers that case)."""
    return S.parse_args([
        "--family", family, "--preset", "tiny", "--model", model_dir, "--solver-G", "8", "--solver-batch", "2",
        "--solver-steps", "1", "--max-new-tokens", "96", "--weight-decay", "0", "--no-autocast", "--no-solver-aid", "--zebra-band",
        "--run-dir", str(run_dir), *extra])


class RecordingSampler(S.HFSampler):
    """The real HF sampler of the solver; it also keeps every prompt it was given and every answer."""

    def __init__(self, model, tok):
        super().__init__(model, tok)
        self.calls = []

    def generate(self, prompts, n, *a, **k):
        outs = super().generate(prompts, n, *a, **k)
        self.calls.append((prompts, outs))
        return outs


def answer_text(family, rec):
    return f"<tool_call>{json.dumps(rec['contract'])}</tool_call>" if family == "tool" else json.dumps(rec["contract"])


def prime(model, tok, family, task, steps=100):
    """SFT (grpo.sft_update) on the right answer and on "No." for one task, so the solver's samples for it are
    a mix of reward-1 and reward-0 answers: a group whose rewards vary, hence a nonzero GRPO gradient."""
    import torch
    from grpo import sft_update
    from plumbing import Dist
    args = type("A", (), {"micro_batch": 8, "precision": "fp32", "grad_clip": 1.0})()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    prompt = S.chat_ids(tok, S.solver_messages(family, task["task"]))
    examples = [(prompt, tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
                for text in (answer_text(family, task), "No.")]
    for _ in range(steps):
        m = sft_update(model, opt, examples, args, Dist())
    return m["sft_loss"]


@pytest.mark.parametrize("family", ["tool", "zebra"])
def test_eq7_solver_phase_trains_on_curriculum(family, tiny_model_dir, tmp_path):
    """Eq. (6) then Eq. (7) on real tasks: the solver sees exactly the in-band valid tasks and never package
    text, its rewards are Eq. 14/15 of its own answers, and an update with varying rewards moves its weights."""
    import torch
    from plumbing import Dist, make_optimizer
    from plumbing import load_model
    pkgs, recs = curriculum_records(family)
    args = solver_args(tiny_model_dir, family, tmp_path)
    dist = Dist()
    solver, tok = load_model(args.model, dist, args.dtype)
    in_band = [r for r in recs if r["valid"] and args.v_lo <= r["v_solve"] <= args.v_hi]
    assert len(in_band) == 2
    torch.manual_seed(0)
    assert prime(solver, tok, family, in_band[0]) < 0.1  # → log 2 / (answer tokens) once both are memorised
    ref = copy.deepcopy(solver).requires_grad_(False)  # π^(0) of this solver: KL reference
    before = {k: v.clone() for k, v in solver.state_dict().items()}
    sampler, opt = RecordingSampler(solver, tok), make_optimizer(solver, args)
    torch.manual_seed(1)
    P = S.Players(None, solver, ref, None, opt, None, sampler, None, None, tok)
    D, steps = S.solver_phase(recs, 1, P, args, random.Random(0), dist)  # iteration t = 1
    # Eq. (6): the two in-band valid records, the skill stream first; out-of-band and invalid ones are dropped
    assert [id(r) for r in D] == [id(r) for r in in_band]
    # the solver saw x only: exactly the prompts of the curriculum tasks, no package text anywhere
    (prompts, outs), = sampler.calls
    by_prompt = {tuple(S.chat_ids(tok, S.solver_messages(family, r["task"]))): r for r in D}
    assert sorted(map(tuple, prompts)) == sorted(by_prompt)
    for p in prompts:
        text = tok.decode(p)
        assert "Follow this skill" not in text and "Rules:" not in text and "Hints:" not in text
        for pkg in pkgs:
            assert pkg["rules"] not in text and pkg["hints"] not in text and pkg["description"] not in text
    # Eq. (14)/(15) on the solver's own answers; some group's rewards vary
    rewards = [[S.solve_reward(family, s.text, by_prompt[tuple(p)])[0] for s in samples]
               for p, samples in zip(prompts, outs)]
    assert all(len(g) == args.solver_G for g in rewards)
    assert any(max(g) > min(g) for g in rewards), rewards
    assert max(max(g) for g in rewards) == pytest.approx(1.0)  # the exact answer is sampled at least once
    # grpo_update ran on these rollouts: metrics, log line and changed weights
    assert len(steps) == args.solver_steps
    m = steps[0]
    assert {"reward", "kl", "loss", "grad_norm", "completion_len", "n_groups", "n_groups_dropped", "n_tokens",
            "clip_frac", "skipped"} <= set(m)
    assert m["skipped"] == 0.0 and m["n_groups"] == 2 and m["grad_norm"] > 0
    assert m["reward"] == pytest.approx(sum(map(sum, rewards)) / sum(map(len, rewards)))
    logged = [json.loads(line) for line in open(tmp_path / "solver" / "metrics.jsonl")]
    assert [row["step"] for row in logged] == [1] and logged[0]["reward"] == pytest.approx(m["reward"])  # t·steps + s
    after = solver.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_eq7_empty_curriculum_leaves_solver_untouched(tiny_model_dir, tmp_path):
    """No valid record in the band: D(t) is empty, nothing is sampled, no optimizer step, nothing logged."""
    import torch
    from plumbing import Dist, make_optimizer
    from plumbing import load_model
    for family in ("tool", "zebra"):
        _, recs = curriculum_records(family)
        outside = [r for r in recs if not (r["valid"] and 0.25 <= r["v_solve"] <= 0.75)]
        args = solver_args(tiny_model_dir, family, tmp_path / family)
        solver, tok = load_model(args.model, Dist(), args.dtype)
        before = {k: v.clone() for k, v in solver.state_dict().items()}
        sampler, opt = RecordingSampler(solver, tok), make_optimizer(solver, args)
        P = S.Players(None, solver, None, None, opt, None, sampler, None, None, tok)
        D, steps = S.solver_phase(outside, 0, P, args, random.Random(0), Dist())
        assert D == [] and steps == [] and sampler.calls == [] and opt.state_dict()["state"] == {}
        assert all(torch.equal(before[k], v) for k, v in solver.state_dict().items())
        assert not os.path.exists(tmp_path / family / "solver" / "metrics.jsonl")


def test_eq7_constant_rewards_leave_solver_unchanged(tiny_model_dir, tmp_path):
    """The contrast to the test above: the unprimed random solver scores 0 on every answer, so every group's
    advantages are 0 and (π_θ = π_ref, no weight decay) the GRPO step of Eq. 7 leaves the weights as they were."""
    import torch
    from plumbing import Dist, make_optimizer
    from plumbing import load_model
    _, recs = curriculum_records("tool")
    args = solver_args(tiny_model_dir, "tool", tmp_path, "--max-new-tokens", "16")
    solver, tok = load_model(args.model, Dist(), args.dtype)
    ref, _ = load_model(args.model, Dist(), args.dtype, trainable=False)  # π^(0), loaded apart as main() does
    before = {k: v.clone() for k, v in solver.state_dict().items()}
    sampler, opt = RecordingSampler(solver, tok), make_optimizer(solver, args)
    P = S.Players(None, solver, ref, None, opt, None, sampler, None, None, tok)
    D, (m,) = S.solver_phase(recs, 0, P, args, random.Random(0), Dist())
    assert len(D) == 2 and m["reward"] == 0.0 and m["skipped"] == 0.0 and m["n_tokens"] > 0 and m["grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in solver.state_dict().items())


def _grid_puzzle(houses, m):
    return {"houses": houses, "attributes": {f"A{j}": [f"v{j}{i}" for i in range(houses)] for j in range(m)}}


def test_schema_segments_split_a_big_grid_by_houses_then_cells():
    """The rule for big schemas (plumbing.schema_segments): up to MAX_INSTANCES instances a schema is one choice
    over all of them (what ConstrainedHFSampler always did); a bigger object is decoded property by property, its
    keys and punctuation fixed, the same language in templates linear in a zebra grid's cells instead of
    (values^m)^houses; a big schema that is not an object, or an unbounded one, is left unconstrained (None)."""
    from plumbing import MAX_INSTANCES, instance_count, instance_template, schema_instances, schema_segments
    small = S.grid_schema(_grid_puzzle(2, 4))                     # 2^8 = 256 grids: listed whole, as before
    assert instance_count(small) == 256 <= MAX_INSTANCES
    assert schema_segments(small) == [[instance_template(v) for v in schema_instances(small)]]
    mid = S.grid_schema(_grid_puzzle(3, 3))                       # 27^3 = 19,683 grids: one choice per house
    segs = schema_segments(mid)
    assert instance_count(mid) == 27 ** 3 and [len(s) for s in segs] == [1, 27, 27, 27]
    assert segs[0] == [['{"House 1":']] and segs[1][0] == [json_text({"A0": "v00", "A1": "v10", "A2": "v20"}) + ',"House 2":']
    texts = {a[0] + x[0] + y[0] + z[0] for a in segs[0] for x in segs[1] for y in segs[2] for z in segs[3]}
    assert texts == {json_text(v) for v in schema_instances(mid)}  # the same grids, the same compact JSON
    big = S.grid_schema(_grid_puzzle(6, 6))                       # (6^6)^6 ≈ 1e28 grids: one choice per cell
    segs = schema_segments(big)
    assert len(segs) == 1 + 36 and sum(map(len, segs)) == 1 + 36 * 6
    assert segs[0] == [['{"House 1":{"A0":']] and segs[1][1] == ['"v01","A1":'] and segs[-1][0] == ['"v50"}}']
    assert schema_segments({"enum": list(range(MAX_INSTANCES))}) == [[[str(i)] for i in range(MAX_INSTANCES)]]
    assert schema_segments({"enum": list(range(MAX_INSTANCES + 1))}) is None     # big, and not an object
    assert schema_segments({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}) is None
    assert schema_segments({"enum": []}) is None                  # nothing to choose: unconstrained, no crash


def test_constrained_hf_sampler_decodes_big_grids_cell_by_cell(tiny_model_dir):
    """A random tiny model under a 3-house, 3-attribute grid schema (19,683 grids) and a 6 × 6 one (~1e28): every
    reply is a grid of the schema (each cell one of its attribute's values), EOS-terminated, with per-token forced
    flags and log-probs (a decision at every choice segment at least); at temperature 1 the draws differ, so a GRPO
    group gets reward variance; greedy ones do not. Bounded: the 6 × 6 decode walks 6 templates per cell."""
    import time
    import torch
    from plumbing import ConstrainedHFSampler, Dist, load_model, schema_segments
    model, tok = load_model(tiny_model_dir, Dist(), trainable=False)
    sampler = ConstrainedHFSampler(model, tok)
    for houses, m in ((3, 3), (6, 6)):
        p = _grid_puzzle(houses, m)
        schema = S.grid_schema(p)
        choices = sum(len(seg) > 1 for seg in schema_segments(schema))   # 3 (one per house), 36 (one per cell)
        prompt = S.chat_ids(tok, [{"role": "user", "content": f"Fill the {houses}-house grid."}])
        torch.manual_seed(0)
        t0 = time.time()
        sampled = sampler.generate([prompt], 6, 400, 1.0, json_schema=[schema])[0]
        greedy = sampler.generate([prompt], 2, 400, 0.0, json_schema=[schema])[0]
        assert time.time() - t0 < 120                      # generous: about a second on one idle core
        for smp in sampled + greedy:
            assert _in_grid_schema(smp.text, p), smp.text
            assert smp.ids[-1] == tok.eos_token_id and tok.decode(smp.ids[:-1]) == smp.text
            assert len(smp.ids) == len(smp.forced) == len(smp.logprobs) and smp.forced.count(0) >= choices
            assert all(lp == 0.0 for lp, f in zip(smp.logprobs, smp.forced) if f)
        assert all(lp <= 0 for smp in sampled for lp, f in zip(smp.logprobs, smp.forced) if not f)
        assert len({smp.text for smp in sampled}) > 1 and greedy[0].text == greedy[1].text


def _forced_bench():
    import importlib.util
    spec = importlib.util.spec_from_file_location("forced_gradnorm", os.path.join(ROOT, "bench", "forced_gradnorm.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_forced_grid_tokens_leave_the_solver_loss(tiny_model_dir, tmp_path):
    """Difference 11: a solver batch of zebra grids decoded under grid_schema (ConstrainedHFSampler, through
    solver_round, as bench/forced_gradnorm.py measures it) trains exactly the tokens the grammar did not force;
    without the mask (Rollout.forced = None) every generated token, with another gradient. A batch whose every
    token was forced (a one-house puzzle: the schema has one instance) has no decision to learn from, and
    grpo_update documents what it does then: no step (skipped, weights untouched), while the same batch with
    the mask dropped would move them."""
    import torch
    from plumbing import Dist
    from plumbing import ConstrainedHFSampler, load_model, load_policy
    bench = _forced_bench()
    r = bench.measure(["--model", tiny_model_dir, "--tasks", "8", "--solver-G", "4", "--no-autocast"])
    assert r["n_rollouts"] == 32 and 0 < r["forced"] < r["generated"]
    assert r["off"]["n_tokens"] == r["generated"] and r["on"]["n_tokens"] == r["generated"] - r["forced"]
    assert r["on"]["grad_norm"] > 0 and r["off"]["grad_norm"] > 0 and r["on"]["grad_norm"] != r["off"]["grad_norm"]
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--solver-aid", "--model", tiny_model_dir,
                         "--solver-G", "4", "--no-autocast", "--run-dir", str(tmp_path)])
    dist = Dist()
    solver, tok = load_policy(args, dist)
    ref = load_model(args.model, dist, args.dtype, trainable=False)[0]
    one = {"houses": 1, "attributes": {"Name": ["Ann"], "Pet": ["Cat"]}, "clues": []}
    D = [{"task": one, "contract": {"House 1": {"Name": "Ann", "Pet": "Cat"}}}]
    rollouts = S.solver_round(D, ConstrainedHFSampler(solver, tok), tok, args, random.Random(0), dist)
    assert len(rollouts) == 4 and all(r.forced == [1] * len(r.ids) and r.ids for r in rollouts)
    for k, ro in enumerate(rollouts):  # rewards that vary, so that the unmasked arm has an advantage to follow
        ro.reward = float(k % 2)
    m_on, on = bench.update(solver, ref, rollouts, args, dist, [ro.forced for ro in rollouts])
    assert m_on["skipped"] == 1.0 and m_on["n_tokens"] == 0 and "grad_norm" not in m_on
    assert all(torch.equal(v, on.state_dict()[k]) for k, v in solver.state_dict().items())
    m_off, off = bench.update(solver, ref, rollouts, args, dist, [None] * len(rollouts))
    assert m_off["skipped"] == 0.0 and m_off["n_tokens"] == sum(len(ro.ids) for ro in rollouts) and m_off["grad_norm"] > 0
    assert any(not torch.equal(v, off.state_dict()[k]) for k, v in solver.state_dict().items())


# ----- bugs of the loop (each test failed before its fix) -----

class ListReply:
    """Stands in for an LLM that is not the component under test: replies taken in turn from a list (cycling),
    one per requested sample."""

    def __init__(self, texts):
        self.texts, self.i = list(texts), 0

    def generate(self, prompts, n, *a, **k):
        out = []
        for _ in prompts:
            row = []
            for _ in range(n):
                row.append(type("S", (), {"text": self.texts[self.i % len(self.texts)], "ids": [0], "logprobs": None, "forced": None})())
                self.i += 1
            out.append(row)
        return out


def test_flags_take_any_argparse_spelling():
    """`--M=500` used to be silently replaced by Table 5's zebra value (argv was scanned for "--M")."""
    assert S.parse_args(["--family", "zebra", "--preset", "paper"]).M == 1920               # Table 5, zebra
    assert S.parse_args(["--family", "zebra", "--preset", "paper", "--M=500"]).M == 500
    assert S.parse_args(["--family=zebra", "--preset=paper", "--solver-steps=3"]).solver_steps == 3
    assert S.parse_args(["--family=zebra", "--preset=paper"]).solver_steps == 10
    assert S.parse_args(["--family", "tool", "--preset", "paper"]).M == 8000
    assert S.parse_args(["--family=zebra", "--run-dir=/tmp/x"]).run_dir == "/tmp/x"            # no family suffix
    assert S.parse_args(["--family", "zebra", "--unguided"]).run_dir.endswith("-zebra-unguided")
    # the tiny preset (differences 13-14): both families warm up both players; per family: library, K, budget
    tool, zebra = S.parse_args(["--family", "tool", "--preset", "tiny"]), S.parse_args(["--family=zebra", "--preset=tiny"])
    assert (tool.proposer_sft_steps, tool.solver_sft_steps, tool.proposer_max_new_tokens, tool.K) == (10, 12, 448, 8)
    assert tool.library.endswith(os.path.join("selfplay", "tool_tiny")) and zebra.library is None and zebra.K == 4
    assert (zebra.proposer_sft_steps, zebra.proposer_sft_batch, zebra.solver_sft_steps) == (10, 6, 12)
    assert (zebra.proposer_max_new_tokens, zebra.zebra_eval_scales, tool.eval_n) == (320, "two", 20)  # per category
    assert tool.T == zebra.T == 1 and tool.warmup_adapters == zebra.warmup_adapters != ""  # prepared warm-ups (#48)
    assert [S.parse_args(["--family", "tool", "--preset", p]).eval_n for p in ("paper", "gpu")] == [0, 0]  # 808
    assert S.parse_args(["--family=zebra", "--preset=tiny", "--proposer-sft-steps=0"]).proposer_sft_steps == 0
    assert S.parse_args(["--family", "tool", "--preset", "tiny", "--solver-sft-steps=0"]).solver_sft_steps == 0
    paper = S.parse_args(["--family", "tool", "--preset", "paper"])
    assert (paper.proposer_sft_steps, paper.solver_sft_steps, paper.proposer_max_new_tokens) == (0, 0, 8192)


def test_reward_and_probe_vote_use_one_equality():
    """ExactCall (Eq. 14) and the probes' answer key (Eq. 4) agree on every pair: 1 ≡ 1.0, True ≢ 1, "1" ≢ 1,
    argument order ignored; the answer is the first call. Before, the reward used Python == (True == 1.0)."""
    ref = {"name": "f", "arguments": {"n": 1, "flag": True, "s": "a"}}
    rec = {"contract": ref}
    variants = [{"n": 1, "flag": True, "s": "a"}, {"s": "a", "flag": True, "n": 1.0}, {"n": True, "flag": True, "s": "a"},
                {"n": 1, "flag": 1, "s": "a"}, {"n": "1", "flag": True, "s": "a"}, {"n": 1, "flag": True}]
    exact = []
    for args in variants:
        text = "<tool_call>" + json.dumps({"name": "f", "arguments": args}) + "</tool_call>"
        r, _, ex, _ = S.tool_reward(text, ref)
        _, key = S.solve_reward("tool", text, rec)
        assert ex == (key == S.call_key(ref)) and r == pytest.approx(0.9 * ex + 0.1)
        exact.append(ex)
    assert exact == [True, True, False, False, False, False]
    wrong = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    good = "<tool_call>" + json.dumps(ref) + "</tool_call>"
    assert S.tool_reward(good + wrong, ref)[2] and not S.tool_reward(wrong + good, ref)[2]  # the first call counts
    assert S.solve_reward("tool", wrong + good, rec)[1] != S.call_key(ref)


def _tiny_args(tiny_model_dir, run_dir, *extra):
    return S.parse_args(["--preset", "tiny", "--model", tiny_model_dir, "--no-autocast", "--sampler", "hf",
                         "--run-dir", str(run_dir), *extra])


def _players(model, opt, tok):
    return S.Players(model, model, None, opt, opt, None, None, None, None, tok)


class Killed(Exception):
    """The process dies here (raised at a named point of save_iteration's checkpoint: plumbing.kill_point)."""


def _resume(tmp_path, tiny_model_dir, args):
    """A fresh proposer and solver (and optimizers) loaded by --resume's call; (extra, the two models)."""
    from plumbing import Dist, make_optimizer
    from plumbing import load_model, resume_checkpoint
    models = {name: load_model(tiny_model_dir, Dist(), args.dtype)[0] for name in ("proposer", "solver")}
    opts = {name: make_optimizer(m, args) for name, m in models.items()}
    ck = resume_checkpoint(tmp_path, models, opts, Dist(), logs=SELFPLAY_LOGS)
    return (ck[1] if ck else None), models


@pytest.mark.parametrize("point", ["ckpt:begin", "ckpt:after_model", "ckpt:before_complete"])
def test_resume_after_a_kill_in_an_iterations_save_uses_the_last_complete_pair(point, tiny_model_dir, tmp_path,
                                                                               monkeypatch):
    """Iteration 1 commits; the run is killed while saving iteration 2 (after its metrics row was logged): before
    the proposer's weights were written, after both players', before the commit mark. The pair of iteration 1 is
    what resume loads (weights of both), the row logged after its commit is cut, and the rerun of iteration 2
    leaves one metrics row per iteration. (A kill at the later points of a commit: tests/test_crash.py.)"""
    import torch
    import plumbing
    from plumbing import Dist, make_optimizer
    from plumbing import load_model, read_metrics
    args = _tiny_args(tiny_model_dir, tmp_path, "--family", "zebra")
    model, tok = load_model(tiny_model_dir, Dist(), args.dtype)
    opt = make_optimizer(model, args)
    pkgs = _library("zebra")[:1]
    stats = {p["name"]: S.new_stats() for p in pkgs}
    S.save_iteration(0, _players(model, opt, tok), (pkgs, stats, []), [], [{"pool_size": 1}], [["base", {}]], args,
                     Dist())
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for v in model.parameters():
            v.add_(1.0)                                                     # iteration 2 trained the weights

    def die(name, step=None):
        if name == point:
            raise Killed(name)
    with monkeypatch.context() as m:
        m.setattr(plumbing, "kill_point", die)
        with pytest.raises(Killed):
            S.save_iteration(1, _players(model, opt, tok), (pkgs, stats, []), [], [{"pool_size": 1}, {"pool_size": 2}],
                             [], args, Dist())
    assert len(open(tmp_path / "metrics.jsonl").readlines()) == 2          # iteration 2's row was logged
    extra, players = _resume(tmp_path, tiny_model_dir, args)
    assert extra["iteration"] == 1 and extra["rows"] == [{"pool_size": 1}]
    for m_ in players.values():                                             # both from iteration 1's pair
        assert all(torch.equal(saved[k], v) for k, v in m_.state_dict().items())
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1]
    S.save_iteration(1, _players(model, opt, tok), (pkgs, stats, []), [], [{"pool_size": 1}, {"pool_size": 2}], [],
                     args, Dist())
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1, 2]
    assert sorted(read_metrics(tmp_path)) == [1, 2] and checkpoint_extra(tmp_path)["iteration"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt")) == ["ckpt"]


def test_checkpoint_extra_reads_no_optimizer_state(tiny_model_dir, tmp_path, monkeypatch):
    """`extra` lives in its own file (extra.pt): reading it never unpickles an optimizer state (≈ 48 GB at 4B)."""
    import torch
    from plumbing import Dist, make_optimizer
    from plumbing import load_model
    args = _tiny_args(tiny_model_dir, tmp_path, "--family", "zebra")
    model, tok = load_model(tiny_model_dir, Dist(), args.dtype)
    S.save_iteration(0, _players(model, make_optimizer(model, args), tok), ([], {}, []), [], [{"pool_size": 0}],
                     [["base", {"zebra_cell": 0.5}]], args, Dist())
    real, read = torch.load, []
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: read.append(os.path.basename(f)) or real(f, *a, **k))
    extra = checkpoint_extra(tmp_path)
    assert extra["iteration"] == 1 and extra["history"] == [["base", {"zebra_cell": 0.5}]]
    assert read == ["extra.pt"] and checkpoint_extra(tmp_path / "fresh") is None


def test_resume_cuts_every_log_back_to_the_commit(tiny_model_dir, tmp_path):
    """Resume from iteration 1: the rows written after its commit (main, proposer, solver logs) are dropped, the
    warm-ups' rows (before it) stay; resume with nothing committed drops every row, the warm-ups' too (they run
    again)."""
    from plumbing import Dist, make_optimizer
    from plumbing import load_model
    args = _tiny_args(tiny_model_dir, tmp_path, "--family", "zebra")
    steps = lambda sub: [json.loads(x)["step"] for x in open(tmp_path / sub / "metrics.jsonl")]

    def log(sub, ks):
        (tmp_path / sub).mkdir(exist_ok=True)
        with open(tmp_path / sub / "metrics.jsonl", "a") as f:
            f.write("".join(json.dumps({"step": k}) + "\n" for k in ks))
    for sub, ks in (("proposer_sft", [0]), ("solver_sft", [0, 1]), ("proposer", [0, 1]), ("solver", [0, 1, 2])):
        log(sub, ks)
    model, tok = load_model(tiny_model_dir, Dist(), args.dtype)
    S.save_iteration(0, _players(model, make_optimizer(model, args), tok), ([], {}, []), [], [{"pool_size": 0}], [],
                     args, Dist())                                          # logs row 1 of the main log, commits
    for sub, ks in (("", [2]), ("proposer", [2, 3]), ("solver", [3, 4, 5])):
        log(sub, ks)                                                        # iteration 2, killed before its commit
    assert _resume(tmp_path, tiny_model_dir, args)[0]["iteration"] == 1
    assert [steps(s) for s in SELFPLAY_LOGS] == [[1], [0, 1], [0, 1, 2], [0], [0, 1]]
    for f in tmp_path.glob("ckpt*"):
        shutil.rmtree(f)                                                    # nothing committed: a fresh start
    assert _resume(tmp_path, tiny_model_dir, args)[0] is None
    assert [steps(s) for s in SELFPLAY_LOGS] == [[]] * 5


def test_save_iteration_rerun_does_not_duplicate_library_changes(tiny_model_dir, tmp_path):
    """A resumed run repeats the iteration whose checkpoint was not written: its change-log lines replace the
    first attempt's instead of being appended a second time; earlier iterations' lines stay."""
    from plumbing import Dist, make_optimizer
    from plumbing import load_model
    args = _tiny_args(tiny_model_dir, tmp_path, "--family", "zebra")
    model, tok = load_model(tiny_model_dir, Dist(), args.dtype)
    opt = make_optimizer(model, args)
    pkgs, stats = _library("zebra")[:2], None
    stats = {p["name"]: S.new_stats() for p in pkgs}
    row = {"pool_size": 0}
    for t, changes in ((0, [{"iteration": 0, "op": "prune", "skill": "a", "reason": "r"}]),
                       (1, [{"iteration": 1, "op": "refine", "skill": "b", "reason": "r"}]),
                       (1, [{"iteration": 1, "op": "refine", "skill": "b", "reason": "r"}])):  # iteration 1 again
        S.save_iteration(t, _players(model, opt, tok), (pkgs, stats, changes), [], [row], [], args, Dist())
    lines = [json.loads(line) for line in open(tmp_path / "library_changes.jsonl")]
    assert [(c["iteration"], c["skill"]) for c in lines] == [(0, "a"), (1, "b")]
    assert checkpoint_extra(tmp_path)["iteration"] == 2
    assert (tmp_path / "library" / "iter_2" / "stats.json").exists()


INDUCE_REPLY = ("Title: booking after discovery\nDescription: book a table using an id seen in a search result\n"
                "Rules: put the id only in an observation\nHints: vary cities and ids")


def _explore_record(pkg, R=0.9):
    r = S.check_proposal("tool", json.dumps(pkg["example"]), None, random.Random(0))
    r.update(stream="explore", skill=None, valid=True, R=R, v_solve=0.55,
             x_text="\n".join(m["content"] for m in S.solver_messages("tool", r["task"])))
    return r


def test_induction_continues_until_induce_min_packages_are_kept():
    """Table 5: "induce at least N new packages". It used to try only the induce_min best records, so one
    rejected package meant fewer than induce_min; now further records are tried while T_induce lasts."""
    pkg = tool_pkg()
    recs = [_explore_record(pkg, R) for R in (0.9, 0.8, 0.7)]
    args = type("A", (), {"family": "tool", "induce_min": 1, "controller_max_new_tokens": 8, "novelty_threshold": 0.6})()
    new, log = S.induce_packages(recs, ListReply(["sorry", INDUCE_REPLY, INDUCE_REPLY]), _tok(), [], args, t=0)
    assert [c["op"] for c in log] == ["induce_rejected", "induce"] and len(new) == 1
    args.induce_min = 2  # the third record: the same text as the second, so not novel; T_induce is used up
    new, log = S.induce_packages(recs, ListReply(["sorry", INDUCE_REPLY, INDUCE_REPLY]), _tok(), [], args, t=0)
    assert [c["op"] for c in log] == ["induce_rejected", "induce", "induce_rejected"] and len(new) == 1
    assert "novel" in log[2]["reason"]


def test_novelty_is_checked_against_the_library_before_pruning():
    """Eq. (10): Novelty(s, S(t)), the whole library of iteration t. A package pruned this iteration used to be
    left out of the comparison, so its near-copy was induced right back."""
    pkg = tool_pkg()
    old = copy.deepcopy(pkg)
    old.update(title="booking_after_discovery", description="book a table using an id seen in a search result",
               rules="put the id only in an observation", hints="vary cities and ids")
    other = next(p for p in _library("tool") if p["name"] != pkg["name"])
    stats = {old["name"]: dict(S.new_stats(), a_t=10, R_t=0.0), other["name"]: dict(S.new_stats(), a_t=10, R_t=5.0)}
    args = S.parse_args(["--family", "tool", "--preset", "tiny", "--induce-min", "1", "--gamma-induce", "0.5"])
    from plumbing import Dist
    pkgs, stats2, changes = S.evolve_library(0, [old, other], stats, [_explore_record(pkg)],
                                             ListReply([INDUCE_REPLY]), _tok(), args, Dist())
    assert [p["name"] for p in pkgs] == [other["name"]]                    # pruned (Eq. 8) ...
    assert [c["op"] for c in changes] == ["prune", "induce_rejected"]      # ... and its copy is not novel
    assert "novel" in changes[1]["reason"]


def test_update_stats_counts_sigma():
    """σ of App. B from a batch: a (attempts), n_ver (schema + ν), n_con (+ probe consistency), n_fd (+ valid
    and v_solve in the band), accepted, and this iteration's a_t, R_t and failed attempts; the exploration
    stream does not count."""
    def r(ok_schema, ok_contract, consistent, v, why=""):
        valid = ok_schema and ok_contract and consistent
        return {"ok_schema": ok_schema, "ok_contract": ok_contract, "consistent": consistent, "valid": valid,
                "v_solve": v, "R": S.propose_reward(valid, v), "why": why}
    batch = [{"stream": "skill", "skill": "s", "rec": None},
             {"stream": "skill", "skill": "s", "rec": r(False, False, False, 0.0, "bad schema")},
             {"stream": "skill", "skill": "s", "rec": r(True, True, False, 0.5, "no majority")},
             {"stream": "skill", "skill": "s", "rec": r(True, True, True, 0.5)},
             {"stream": "skill", "skill": "s", "rec": r(True, True, True, 1.0)},
             {"stream": "explore", "skill": None, "rec": r(True, True, True, 0.5)}]
    stats = {"s": S.new_stats()}
    S.update_stats(batch, stats, S.parse_args([]))
    st = stats["s"]
    assert (st["a"], st["n_ver"], st["n_con"], st["n_fd"], st["accepted"], st["a_t"]) == (5, 3, 2, 1, 2, 5)
    assert st["R_t"] == pytest.approx(1.0 + 0.0)
    assert st["failed_t"] == ["unparseable proposal", "bad schema", "no majority"]


def test_proposer_rewards_are_R_minus_rho_and_minus_one(tmp_path):
    """Eq. 5's reward: R_propose (Eq. 2) − ρ (App. C) for a parsed proposal, --parse-penalty (−1) for an
    unparseable one. Zebra exploration stream: two copies of one unique puzzle (one cluster: ρ = 2/4) probed
    with one right and one wrong grid each (v_solve = ½, R = 1), and two replies that are not JSON."""
    from plumbing import Dist
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--unguided", "--proposer-prompts", "2",
                         "--proposer-G", "2", "--K", "2", "--no-proposer-grammar", "--no-solver-aid",
                         "--run-dir", str(tmp_path)])
    one = {"houses": 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]},
           "clues": [{"type": "fixed", "a": "Ann", "house": 1}, {"type": "same_house", "a": "Ann", "b": "Dog"}]}
    reply = json.dumps(one)[len(S.PROPOSER_PREFIX["zebra"]):]  # the reply continues the prefilled opening
    grid = json.dumps({"House 1": {"Name": "Ann", "Pet": "Dog"}, "House 2": {"Name": "Ben", "Pet": "Cat"}})
    P = S.Players(None, None, None, None, None, ListReply([reply, "no"]), None, ListReply([grid, "no"]), None, _tok())
    rollouts, recs, n_unparsed = S.proposer_round(0, 0, P, [], {}, args, random.Random(0), Dist())
    assert n_unparsed == 2 and len(recs) == 2 and len(rollouts) == 4
    for rec in recs:
        assert rec["valid"] and rec["v_solve"] == pytest.approx(0.5) and rec["R"] == pytest.approx(1.0)
        assert rec["rho"] == pytest.approx(2 / 4)
    assert [ro.reward for ro in rollouts] == pytest.approx([0.5, -1.0, 0.5, -1.0])


def _finished_run(root, arm_flags, seed, cells, recs, sft=None, versus=None):
    """A run folder as main leaves it (eval rows, records; a "solver SFT" row with cell accuracy `sft` if given),
    its results.json written by run_results; `versus`: another arm's run folder (--versus)."""
    import stats
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--T", "1", "--seed", str(seed), "--data-seed",
                         str(seed), "--run-dir", str(root / f"{'-'.join(arm_flags) or 'skill'}-s{seed}"), *arm_flags]
                        + (["--versus", versus] if versus else []))
    from plumbing import Dist
    baselines = S.trivial_baselines(args, Dist())
    n = len(zebra_heldout(args)[0])
    rows = [("base", 0.0)] + ([("solver SFT", sft)] if sft is not None else []) + [("iter 1", cells)]
    for row, c in rows:
        S.save_generations(args, row, [{"i": i, "cell": c, "grid": 0.0} for i in range(n)], Dist())
    os.makedirs(os.path.join(args.run_dir, "records"))
    with open(os.path.join(args.run_dir, "records", "iter_0.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    with open(os.path.join(args.run_dir, "metrics.jsonl"), "w") as f:  # a row logged twice: never read for results
        f.writelines([json.dumps({"step": 1, "zebra_cell": cells})] * 2)
    results, headline = S.run_results(args, [(row, {}) for row, _ in rows], baselines, [{}])
    stats.write_results(args.run_dir, results, headline)
    return args.run_dir, n


def test_aggregate_pools_seeds_and_versus_pairs_skill_sp_with_another_arm_over_puzzles(tmp_path, capsys):
    """results.json per run (the last iteration vs base, vs the warm-up and vs the best trivial answer, whose mean
    rides along as chance; valid rate and v_solve by stream; with --versus, Skill-SP vs that arm of the same data
    seed, paired over puzzles), then --aggregate: each claim pooled over seeds with puzzles as clusters."""
    v = lambda stream, ok, vs: {"stream": stream, "valid": ok, "v_solve": vs}
    other = [_finished_run(tmp_path, ["--uniform-routing"], 0, 0.2, [v("skill", True, 0.5)], sft=0.3)[0],
             _finished_run(tmp_path, ["--uniform-routing"], 1, 0.1, [v("skill", True, 0.5)], sft=0.3)[0]]
    runs = [_finished_run(tmp_path, [], 0, 0.5, [v("skill", True, 0.5), v("explore", False, 0.0)], sft=0.3,
                          versus=other[0]),
            _finished_run(tmp_path, [], 1, 0.4, [v("skill", True, 0.25)], sft=0.3, versus=other[1])]
    one = json.load(open(os.path.join(runs[0][0], "results.json")))
    explore = next(e for e in one["headline"] if e["claim"].startswith("valid-proposal rate, explore"))
    assert "by construction" in explore["claim"] and explore["mean_a"] == 0.0 and explore["n_items"] == 1
    better = max(one["trivial"], key=lambda kr: kr[1]["zebra_cell"])               # the best trivial answer
    (trivial,) = [e for e in one["headline"] if "cell" in e["claim"] and "vs trivial" in e["claim"]]
    assert trivial["b"] == "trivial: " + better[0] and trivial["mean_b"] == pytest.approx(better[1]["zebra_cell"])
    assert trivial["mean_a"] == pytest.approx(0.5)
    # what self-play added on top of the warm-up, and over base: same puzzles, the best trivial answer beside
    for ref, b in (("solver SFT", 0.3), ("base", 0.0)):
        (e,) = [e for e in one["headline"] if e["claim"] == f"held-out zebra cell accuracy, skill-sp: last iteration vs {ref}"]
        assert (e["mean_a"], e["mean_b"], e["diff"]) == pytest.approx((0.5, b, 0.5 - b))
        assert e["chance"] == pytest.approx(better[1]["zebra_cell"])
        assert "mde" in e and e["mde"] is None  # every puzzle differs by 0.5 − b: no spread seen, so no mde
    (pair,) = [e for e in one["headline"] if e["claim"].startswith("held-out cell accuracy: skill-sp vs uniform_routing")]
    assert pair["primary"] and pair["diff"] == pytest.approx(0.5 - 0.2) and pair["b"] == "uniform_routing"
    entries = S.main(["--aggregate", *[d for d, _ in runs]])
    n = runs[0][1]
    (pair,) = [e for e in entries if e["claim"].startswith("held-out cell accuracy: skill-sp vs uniform_routing")]
    assert pair["n_items"] == 2 * n and pair["n_seeds"] == 2 and pair["unit"] == "item (clustered over seeds)"
    assert pair["n_units"] == n and pair["diff"] == pytest.approx(((0.5 - 0.2) + (0.4 - 0.1)) / 2)
    (pooled,) = [e for e in entries if e["claim"] == "held-out zebra cell accuracy, skill-sp: last iteration vs base"]
    assert pooled["n_seeds"] == 2 and pooled["n_units"] == n                 # clustered by puzzle, not puzzle × seed
    vskill = next(e for e in entries if e["claim"].startswith("v_solve of valid proposals, skill stream, skill-sp"))
    assert vskill["n_seeds"] == 2 and vskill["mean_a"] == pytest.approx(0.375)
    assert "skill-sp vs uniform_routing" in capsys.readouterr().out


def _finished_tool_run(root, flags, seed, hits, ids):
    """A tool run folder as main leaves it (base and iter 1 rows over the BFCL items `ids`, iter 1 hitting `hits`),
    its results.json written by run_results."""
    import stats
    from plumbing import Dist
    args = S.parse_args(["--family", "tool", "--preset", "tiny", "--T", "1", "--seed", str(seed), "--data-seed",
                         str(seed), "--run-dir", str(root / f"tool{'-'.join(flags)}-s{seed}"), *flags])
    for row, h in (("base", [0] * len(ids)), ("iter 1", hits)):
        S.save_generations(args, row, [{"category": "simple_python" if i.startswith("py") else "simple_java", "id": i,
                                        "hits": k, "n": 1} for i, k in zip(ids, h)], Dist())
    results, headline = S.run_results(args, [("base", {}), ("iter 1", {})], [], [{}])
    stats.write_results(args.run_dir, results, headline)
    return args.run_dir, headline


def test_versus_pairs_skill_sp_with_unguided_over_bfcl_items_and_refuses_other_runs(tmp_path):
    """Tool family (make evidence): Skill-SP with --versus the unguided run of its data seed, paired on BFCL's item
    ids; pooled over seeds by stats.aggregate. --versus refuses, before the run, a folder with no finished run or
    a run of another data seed; a run on other items is not paired (a line says so)."""
    import stats
    pairs, ids = [], {0: ["py_0", "py_1", "java_0"], 1: ["py_1", "py_2", "java_1"]}  # per-seed draws share py_1
    for seed in (0, 1):
        unguided, _ = _finished_tool_run(tmp_path, ["--unguided"], seed, [0, 1, 0], ids[seed])
        d, headline = _finished_tool_run(tmp_path, ["--versus", unguided], seed, [1, 1, 0], ids[seed])
        (pair,) = [e for e in headline if e["claim"].startswith("held-out BFCL simple accuracy: skill-sp vs unguided")]
        assert pair["primary"] and (pair["mean_a"], pair["mean_b"]) == pytest.approx((2 / 3, 1 / 3))
        (base,) = [e for e in headline if e["claim"] == "BFCL simple, skill-sp: last iteration vs base"]
        assert base["primary"] and base["n_items"] == 3
        assert not [e for e in headline if e["primary"] and e["claim"].startswith("BFCL simple_")]  # by category
        pairs.append(d)
    (pooled,) = [e for e in stats.aggregate(pairs) if "vs unguided" in e["claim"]]
    assert pooled["n_items"] == 6 and pooled["n_seeds"] == 2 and pooled["n_units"] == 5  # py_1 is one cluster
    assert pooled["diff"] == pytest.approx(1 / 3)
    with pytest.raises(SystemExit, match="no finished run of family tool, data seed 1"):
        S.parse_args(["--family", "tool", "--data-seed", "1", "--versus", str(tmp_path / "tool--unguided-s0")])
    with pytest.raises(SystemExit, match="does not exist"):
        S.parse_args(["--family", "tool", "--versus", str(tmp_path / "nowhere")])
    _, headline = _finished_tool_run(tmp_path / "x", ["--versus", str(tmp_path / "tool--unguided-s0")], 0, [1, 1],
                                     ["py_0", "py_1"])
    assert not [e for e in headline if "vs unguided" in e["claim"]]


def test_prime_proposer_targets_are_the_worked_examples(monkeypatch, tmp_path):
    """--proposer-sft-steps: each package's skill prompt and the exploration prompt, each followed by the example
    as the proposer writes it (after the prefilled opening, or whole under the grammar). grpo.sft_update
    (tested in test_grpo.py) is replaced by a recorder: what is checked here is the data it is given."""
    import torch
    import grpo
    from plumbing import Dist
    tok, pkgs, seen = _tok(), _library("zebra")[:2], []
    monkeypatch.setattr(grpo, "sft_update", lambda model, opt, examples, *a: seen.extend(examples) or {"sft_loss": 0.0})
    args = S.parse_args(["--family", "zebra", "--proposer-sft-steps", "1", "--run-dir", str(tmp_path)])
    model = torch.nn.Linear(1, 1)
    S.prime_proposer(model, tok, pkgs, args, Dist(), grammar=False, lr=1e-4)
    assert len(seen) == 4
    for pkg, stream in [(p, s) for p in pkgs for s in (p, None)]:  # grpo.sft_loop shuffles the batch: any order
        prompt = S.prefilled_prompt(tok, S.proposer_messages("zebra", stream), S.PROPOSER_PREFIX["zebra"])
        assert any(p == prompt and t[-1] == tok.eos_token_id
                   and S.PROPOSER_PREFIX["zebra"] + tok.decode(t[:-1]) == json.dumps(pkg["example"]) for p, t in seen)
    seen.clear()
    S.prime_proposer(model, tok, pkgs, args, Dist(), grammar=True, lr=1e-4)
    assert any(tok.decode(t[:-1]) == json_text(pkgs[0]["example"]) for _, t in seen)  # compact, as the grammar decodes


def test_proposer_sft_batch_draws_that_many_examples(monkeypatch, tmp_path):
    """--proposer-sft-batch B: each SFT step trains on B of the examples, drawn with a seeded rng."""
    import torch
    import grpo
    from plumbing import Dist
    tok, pkgs, seen = _tok(), _library("zebra")[:3], []
    monkeypatch.setattr(grpo, "sft_update", lambda model, opt, examples, *a: seen.append(examples) or {"sft_loss": 0.0})
    args = S.parse_args(["--family", "zebra", "--proposer-sft-steps", "3", "--proposer-sft-batch", "2",
                         "--run-dir", str(tmp_path)])
    S.prime_proposer(torch.nn.Linear(1, 1), tok, pkgs, args, Dist(), grammar=False, lr=1e-4)
    assert [len(b) for b in seen] == [2, 2, 2] and len({id(e) for b in seen for e in b}) >= 3


def test_scripted_tool_tasks_pass_the_gate_and_state_every_argument():
    """The solver warm-up's tasks (difference 14) pass the global schema check, and every argument value of the
    reference call appears literally in the request; they use none of S(0)'s tool names."""
    import random as _random
    tasks = S.scripted_tool_tasks(_random.Random(0), 50)
    s0_tools = {t["name"] for p in _library("tool") for t in p["example"]["tools"]}
    for task in tasks:
        assert tool_schema_error(task) is None, task
        assert all(str(v) in task["dialogue"][0]["content"] for v in task["call"]["arguments"].values())
        assert 2 <= len(task["tools"]) <= 3 and not {t["name"] for t in task["tools"]} & s0_tools
    assert len({S.call_key(t["call"]) for t in tasks}) >= 30


def test_prime_solver_targets_are_the_reference_calls(monkeypatch, tmp_path):
    """--solver-sft-steps: the prompt is what the solver sees (with the answer prefix), and prefix + target is a
    reply that tool_reward scores as the scripted task's own reference call (R = 1), not merely as its own parse."""
    import torch
    import grpo
    from plumbing import Dist
    tok, seen = _tok(), []
    monkeypatch.setattr(grpo, "sft_update", lambda model, opt, examples, *a: seen.extend(examples) or {"sft_loss": 0.0})
    args = S.parse_args(["--family", "tool", "--preset", "tiny", "--solver-sft-steps", "2", "--solver-sft-tasks", "6",
                         "--solver-sft-batch", "3", "--run-dir", str(tmp_path)])
    S.prime_solver(torch.nn.Linear(1, 1), tok, args, Dist(), 1e-4)
    tasks = S.scripted_tool_tasks(random.Random(f"{args.seed}-solver-sft"), 6)  # the warm-up's own draw
    assert len(seen) == 6
    prefix, _ = S.answer_prefix(args)
    by_prompt = {tok.decode(S.prefilled_prompt(tok, S.solver_messages("tool", t), prefix)): t for t in tasks}
    assert len(by_prompt) == 6 and {tok.decode(p) for p, _ in seen} == set(by_prompt)
    for prompt, target in seen:  # grpo.sft_loop shuffles: each example is matched to its task by the prompt
        assert target[-1] == tok.eos_token_id
        reply = prefix + tok.decode(target[:-1])
        assert S.tool_reward(reply, by_prompt[tok.decode(prompt)]["call"])[:3] == (1.0, True, True)


def test_prime_solver_zebra_targets_are_the_grids_of_puzzles_outside_the_heldout_set(monkeypatch, tmp_path):
    """Zebra warm-up: runtime puzzles of the held-out scales, none equal to a held-out puzzle; each target is
    the JSON grid that Eq. 15 scores as the full solution (R = 1)."""
    import torch
    import grpo
    from plumbing import Dist
    tok, seen = _tok(), []
    monkeypatch.setattr(grpo, "sft_update", lambda model, opt, examples, *a: seen.extend(examples) or {"sft_loss": 0.0})
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--solver-sft-steps", "1", "--solver-sft-tasks", "8",
                         "--run-dir", str(tmp_path)])
    S.prime_solver(torch.nn.Linear(1, 1), tok, args, Dist(), 1e-4)
    heldout = {S.render_zebra_prompt(p) for _, p, _ in zebra_heldout(args)[0]}
    puzzles = {S.render_zebra_prompt(p): (p, sol) for _, p, sol in make_zebra_puzzles(
        f"{args.data_seed}-solver-sft", zebra_heldout(args)[1], 8)}
    assert 1 <= len(seen) <= 8
    for prompt, target in seen:
        text = tok.decode(prompt)
        (key,) = [k for k in puzzles if k in text]
        assert key not in heldout
        p, sol = puzzles[key]
        assert S.zebra_reward(tok.decode(target[:-1]), p, sol)[0] == pytest.approx(1.0) and target[-1] == tok.eos_token_id


# ----- the held-out instrument (§1 of issue 27) -----

def test_every_table_row_uses_one_sampler_schema_temperature_and_budget(tiny_model_dir, tmp_path, monkeypatch):
    """Base and solver-SFT rows (tool family, --T 0): the base row used to be decoded by a separate HF sampler of
    π^(0) (no schema under vLLM), the others by the solver's sampler. Now every held-out generate call goes to
    the solver's own sampler with the same n, budget, temperature, stop and schema."""
    import plumbing
    calls, real = [], plumbing.HFSampler.generate

    def recording(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        calls.append((id(self), any(p.requires_grad for p in self.model.parameters()), n, max_new_tokens, temperature,
                      str(stop), json.dumps(json_schema)))
        return real(self, prompts, n, max_new_tokens, temperature, top_p, stop, json_schema)
    monkeypatch.setattr(plumbing.HFSampler, "generate", recording)
    out = S.main(["--family", "tool", "--preset", "tiny", "--model", tiny_model_dir, "--T", "0", "--eval-n", "1",
                  "--proposer-sft-steps", "0", "--solver-sft-steps", "1", "--solver-sft-batch", "2",
                  "--max-new-tokens", "4", "--sampler", "hf", "--no-plots", "--run-dir", str(tmp_path)])
    assert [name for name, _ in out["history"]] == ["base", "solver SFT"]
    assert len(calls) == 2 * len(BFCL_CATEGORIES)
    n = len(BFCL_CATEGORIES)  # one sampler, the (trainable) solver's; per category one budget (call_budget)
    assert calls[:n] == calls[n:] and len({c[0] for c in calls}) == 1 and calls[0][1]
    assert sorted(os.listdir(tmp_path / "eval")) == ["base.jsonl", "solver_SFT.jsonl"]


@pytest.mark.parametrize("temperature", ["0", "0.5"])
def test_an_iteration_without_a_solver_step_copies_the_last_row_under_greedy_decoding(
        temperature, tiny_model_dir, tmp_path, monkeypatch):
    """#48's cut: D(t) empty (--M 0), so π_solve is the warm-up's; greedy held-out decoding would give the warm-up
    row again, so "iter 1" is that row and its items, copied, with no generate call. Sampled decoding (T > 0)
    draws other answers, so there the row is decoded again."""
    import plumbing
    calls, real = [], plumbing.HFSampler.generate

    def recording(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        if json_schema is not None or stop:  # the held-out rows (the proposer decodes with neither on HF)
            calls.append(len(prompts))
        return real(self, prompts, n, max_new_tokens, temperature, top_p, stop, json_schema)
    monkeypatch.setattr(plumbing.HFSampler, "generate", recording)
    out = S.main(["--family", "tool", "--preset", "tiny", "--model", tiny_model_dir, "--T", "1", "--M", "0",
                  "--eval-n", "1", "--eval-temperature", temperature, "--proposer-sft-steps", "0",
                  "--solver-sft-steps", "1", "--solver-sft-batch", "2", "--max-new-tokens", "4",
                  "--proposer-prompts", "1", "--proposer-G", "2", "--proposer-max-new-tokens", "8",
                  "--collect-prompts", "0", "--K", "1", "--controller-max-new-tokens", "4",
                  "--sampler", "hf", "--no-plots", "--run-dir", str(tmp_path)])
    (_, base), (_, warm), (name, last) = out["history"]
    assert name == "iter 1" and out["rows"][0]["solver_pg_steps"] == 0
    n = len(BFCL_CATEGORIES)
    if temperature == "0":
        assert last == warm and len(calls) == 2 * n, calls
        assert read_items(tmp_path, "iter 1") == read_items(tmp_path, "solver SFT") != []
    else:
        assert len(calls) == 3 * n, calls
        assert len(read_items(tmp_path, "iter 1")) == len(read_items(tmp_path, "solver SFT"))


def _zebra_gold(args):
    """Gold grids in play: the held-out set's and every S(0) worked example's."""
    puzzles, _ = zebra_heldout(args)
    sols = [sol for _, _, sol in puzzles]
    for pkg in _library("zebra"):
        n, pos = count_solutions(pkg["example"], 2)
        sols.append(solution_grid(pkg["example"], pos))
    return puzzles, sols


def test_zebra_answer_budget_fits_every_heldout_and_library_gold_answer():
    """--max-new-tokens 96 used to cut the 4×4 held-out solution (108 tokens): a quarter of the metric could never
    be scored. The budget now fits the longest gold grid of the call (as xgrammar writes it, + EOS), for the held-out set
    and for any S(0) example probed alone. The tiny held-out set: 100 small puzzles, all distinct (≤ 3 houses; every
    arm scored 0 % of medium grids; #27 asks for ≥ 100)."""
    args, tok = S.parse_args(["--family", "zebra", "--preset", "tiny", "--zebra-eval-scales", "small"]), _tok()
    puzzles, sols = _zebra_gold(args)
    assert len(puzzles) == 100 and {s for s, _, _ in puzzles} == {"small"}
    assert len({S.render_zebra_prompt(p) for _, p, _ in puzzles}) == 100
    length = lambda sol: len(tok.encode(json.dumps(sol), add_special_tokens=False)) + 1  # as xgrammar decodes it, + EOS
    assert max(length(sol) for sol in sols) > args.max_new_tokens          # the flag alone would truncate
    budget = S.answer_budget(args, tok, sols)
    assert all(length(sol) <= budget for sol in sols)
    assert all(length(sol) <= S.answer_budget(args, tok, [sol]) for sol in sols)


class _Engine:
    """Stands in for vLLM's engine: counts prefix-cache resets."""

    def __init__(self):
        self.resets = 0

    def reset_prefix_cache(self):
        self.resets += 1


def test_heldout_eval_resets_the_prefix_cache_fits_the_budget_and_saves_every_generation(tmp_path):
    """evaluate (zebra): the prefix cache is reset before generating, the budget fits the longest held-out
    gold grid, decoding is greedy in the tiny preset (stated in its help), and every reply is saved, scored,
    per puzzle."""
    from plumbing import Dist
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--rg-eval-n", "0", "--run-dir", str(tmp_path)])
    tok = _tok()

    class Recording(FixedReply):
        def __init__(self):
            super().__init__("no grid")
            self.llm, self.seen = _Engine(), []

        def generate(self, prompts, n, max_new_tokens, temperature, **k):
            self.seen.append((len(prompts), n, max_new_tokens, temperature, self.llm.resets, len(k["json_schema"])))
            return super().generate(prompts, n)
    sampler = Recording()
    res = S.evaluate(sampler, tok, args, Dist(), "iter 1")
    puzzles, _ = zebra_heldout(args)
    budget = S.answer_budget(args, tok, [sol for _, _, sol in puzzles])
    assert sampler.seen == [(len(puzzles), args.eval_samples, budget, 0.0, 1, len(puzzles))]
    items = [json.loads(line) for line in open(tmp_path / "eval" / "iter_1.jsonl")]
    assert len(items) == len(puzzles) and all(it["answers"] == ["no grid"] and it["cell"] == 0.0 for it in items)
    assert res["zebra_cell"] == 0.0 and res["zebra_grid"] == 0.0


def test_trivial_baselines_are_scored_by_the_same_checker_and_printed(tmp_path, capsys):
    """A constant value per attribute gets exactly 1/N of each puzzle's cells and no grid; listed order is a
    valid grid, right only when the solution is the listed order. Both rows print under every table."""
    from plumbing import Dist
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--run-dir", str(tmp_path)])
    rows = S.trivial_baselines(args, Dist())
    assert [name for name, _ in rows] == ["constant", "listed order", "clue reader", "clue reader+not"]
    puzzles, _ = zebra_heldout(args)
    const = [json.loads(line) for line in open(tmp_path / "eval" / "trivial_constant.jsonl")]
    listed = [json.loads(line) for line in open(tmp_path / "eval" / "trivial_listed_order.jsonl")]
    for (_, p, sol), c, o in zip(puzzles, const, listed):
        assert c["cell"] == pytest.approx(1 / p["houses"]) and c["grid"] == 0.0 and c["valid"] == 0.0
        in_order = all(sol[f"House {h}"][a] == v[h - 1] for a, v in p["attributes"].items() for h in range(1, p["houses"] + 1))
        assert o["valid"] == 1.0 and o["grid"] == float(in_order)
    assert rows[0][1]["zebra_cell"] == pytest.approx(sum(1 / p["houses"] for _, p, _ in puzzles) / len(puzzles))
    S.print_main_table([("base", {"zebra_cell": 0.1})], "zebra", rows)
    out = capsys.readouterr().out
    assert "[constant]" in out and "[listed order]" in out and "[clue reader+not]" in out and "base" in out


def test_task_and_grid_schemas_compile_under_xgrammar_and_admit_the_gold_grid():
    """What vLLM gets (structured outputs, xgrammar with disable_any_whitespace: no optional whitespace and the
    separators "," and ":", as VLLMSampler asks): TASK_SCHEMA of both families and every held-out puzzle's
    grid_schema compile with the embedded tokenizer, and the grid schema's matcher takes the gold grid, token by
    token as compact JSON (json_text: what the solver warm-up writes; ", "-spaced JSON is refused), then EOS: the
    grammar admits the answer it scores as right, in the form the warm-up teaches."""
    import xgrammar as xgr
    tok = _tok()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok))
    for family in ("tool", "zebra"):
        assert compiler.compile_json_schema(json.dumps(S.TASK_SCHEMA[family]), any_whitespace=False, separators=(",", ":")) is not None
    args = S.parse_args(["--family", "zebra", "--preset", "tiny"])
    puzzles, _ = zebra_heldout(args)
    for _, p, sol in puzzles[::10] + puzzles[-1:]:
        vllm_grammar = compiler.compile_json_schema(json.dumps(S.grid_schema(p)), any_whitespace=False, separators=(",", ":"))
        matcher = xgr.GrammarMatcher(vllm_grammar)
        ids = tok.encode(json_text(sol), add_special_tokens=False)
        assert all(matcher.accept_token(i) for i in ids) and matcher.accept_token(tok.eos_token_id)
        assert matcher.is_terminated()
        spaced = xgr.GrammarMatcher(vllm_grammar)
        assert not all(spaced.accept_token(i) for i in tok.encode(json.dumps(sol), add_special_tokens=False))
        assert S.answer_budget(args, tok, [sol]) >= len(ids) + 1  # the budget (spaced, x 1.25) fits it and EOS


class _StopBeforeIteration(Exception):
    pass


def test_ablations_differ_from_the_full_method_only_in_what_they_name(tiny_model_dir, tmp_path, monkeypatch):
    """--unguided used to skip the proposer warm-up that Skill-SP gets; --frozen-feedback-solver probed with the
    un-warmed π^(0) on HF generate (no schema under vLLM). Now the unguided proposer is primed like Skill-SP's,
    and the frozen feedback solver is a frozen copy of the warmed solver on a sampler of the solver's kind."""
    import torch
    primed, seen = [], {}
    monkeypatch.setattr(S, "prime_proposer", lambda proposer, tok, pkgs, args, *a: primed.append(args.unguided) or {})

    def first_iteration(t, P, *a):
        seen["P"] = P
        raise _StopBeforeIteration
    monkeypatch.setattr(S, "proposer_phase", first_iteration)
    flags = ["--family", "tool", "--preset", "tiny", "--model", tiny_model_dir, "--eval-n", "1", "--proposer-sft-steps",
             "1", "--solver-sft-steps", "2", "--solver-sft-batch", "4", "--solver-sft-lr", "1e-2", "--max-new-tokens",
             "4", "--sampler", "hf", "--no-plots"]
    for arm in ("--unguided", "--frozen-feedback-solver"):
        with pytest.raises(_StopBeforeIteration):
            S.main(flags + [arm, "--run-dir", str(tmp_path / arm)])
    assert primed == [True, False]                                   # the warm-up runs in the unguided arm too
    P = seen["P"]                                                    # the --frozen-feedback-solver run
    assert P.probe_sampler is not P.s_sampler and P.probe_sampler is not P.controller
    assert type(P.probe_sampler) is type(P.s_sampler)
    probe, solver = P.probe_sampler.model.state_dict(), P.solver.state_dict()
    assert all(torch.equal(probe[k], solver[k]) for k in solver)      # the warmed solver ...
    assert not any(p.requires_grad for p in P.probe_sampler.model.parameters())  # ... frozen
    base = P.controller.sampler.model.state_dict()  # a DealtSampler over HF generate
    assert any(not torch.equal(base[k].float(), solver[k].float()) for k in solver)  # not π^(0)


# ----- issue 52: the feedback solver across a resume, the change log under a kill, the loop shown closing -----

def test_frozen_feedback_solver_keeps_the_post_warm_up_solver_across_a_resume(tiny_model_dir, tmp_path, monkeypatch):
    """--frozen-feedback-solver probes with the solver as it entered self-play. A run warms up, commits iteration 1
    with a solver that self-play moved, and resumes: the probes' model must be the post-warm-up solver again, not
    the resumed π_solve (the old code copied the solver after loading the checkpoint)."""
    import torch
    from plumbing import Dist
    seen = {}

    def first_iteration(t, P, *a):
        seen["P"] = P
        raise _StopBeforeIteration
    monkeypatch.setattr(S, "proposer_phase", first_iteration)
    run = tmp_path / "run"
    flags = ["--family", "tool", "--preset", "tiny", "--model", tiny_model_dir, "--eval-n", "1", "--proposer-sft-steps",
             "1", "--solver-sft-steps", "2", "--solver-sft-batch", "4", "--solver-sft-lr", "1e-2", "--max-new-tokens",
             "4", "--sampler", "hf", "--no-plots", "--frozen-feedback-solver", "--T", "2", "--run-dir", str(run)]
    with pytest.raises(_StopBeforeIteration):
        S.main(flags)
    P = seen.pop("P")
    warm = {k: v.clone() for k, v in P.probe_sampler.model.state_dict().items()}
    with torch.no_grad():
        for v in P.solver.parameters():
            v.add_(0.5)                                                   # iteration 1 moved the solver
    args = S.parse_args(flags)
    pkgs, stats = S.load_library(args.library, "tool")
    S.save_iteration(0, P, (pkgs, stats, []), [], [{"pool_size": 1}], [("base", {})], args, Dist())
    with pytest.raises(_StopBeforeIteration):
        S.main(flags + ["--resume"])
    P2 = seen["P"]
    probe, solver = P2.probe_sampler.model.state_dict(), P2.solver.state_dict()
    assert any(not torch.equal(probe[k], solver[k]) for k in solver)     # not π_solve at the resume iteration ...
    assert all(torch.equal(probe[k], warm[k]) for k in warm)             # ... the solver that entered self-play
    assert not any(p.requires_grad for p in P2.probe_sampler.model.parameters())


def test_library_changes_survive_a_kill_mid_rewrite_and_a_torn_line(tiny_model_dir, tmp_path, monkeypatch):
    """The change log is rewritten through a temporary file and a rename: a kill while iteration 1's lines are
    written leaves iteration 0's committed lines (the old code truncated the file first, then died with it empty);
    a torn last line (a kill in an older writer) is dropped, not raised on, by the next save."""
    import plumbing
    from plumbing import Dist, load_model, make_optimizer
    args = _tiny_args(tiny_model_dir, tmp_path, "--family", "zebra")
    model, tok = load_model(tiny_model_dir, Dist(), args.dtype)
    opt = make_optimizer(model, args)
    pkgs = _library("zebra")[:1]
    stats = {p["name"]: S.new_stats() for p in pkgs}
    path = tmp_path / "library_changes.jsonl"
    zero = [{"iteration": 0, "op": "prune", "skill": "a", "reason": "r"}]
    S.save_iteration(0, _players(model, opt, tok), (pkgs, stats, zero), [], [{"pool_size": 1}], [], args, Dist())
    one = [{"iteration": 1, "op": "refine", "skill": "b", "reason": "r"}]
    for name, real in (("loads", json.loads), ("dumps", json.dumps)):    # killed while an old / a new line is handled
        def dies(obj, *a, real=real, **k):
            if '"op"' in str(obj) or isinstance(obj, dict) and "op" in obj:
                raise Killed("library_changes")
            return real(obj, *a, **k)
        with monkeypatch.context() as m:
            m.setattr(plumbing.json, name, dies)
            with pytest.raises(Killed):
                S.save_iteration(1, _players(model, opt, tok), (pkgs, stats, one), [], [{"pool_size": 1}] * 2, [],
                                 args, Dist())
        assert [json.loads(line) for line in open(path)] == zero, name    # iteration 0's committed line is intact
    with open(path, "a") as f:
        f.write('{"iteration": 1, "op": "ref')                             # a torn line
    S.save_iteration(1, _players(model, opt, tok), (pkgs, stats, one), [], [{"pool_size": 1}] * 2, [], args, Dist())
    assert [json.loads(line) for line in open(path)] == zero + one
    assert not os.path.exists(str(path) + ".tmp")


def _loop(pool, pg):
    return {k: [0.0] * len(pool) for k in S.LOOP_KEYS} | {"pool_size": pool, "solver_pg_steps": pg}


def test_loop_check_fails_on_an_empty_curriculum_or_a_kl_only_solver_update():
    """The check the smoke test calls: D(t) empty in every iteration fails; a non-empty D(t) whose solver steps had
    no group with differing rewards (the update is the KL term alone, yet grad_norm > 0) fails; one step with an
    advantage term passes. solver_signal counts a step only when it was taken and some group's rewards differ."""
    assert S.loop_failures(_loop([0, 0], [0, 0])) == ["D(t) was empty in every iteration: the solver never trained"]
    assert "KL term alone" in S.loop_failures(_loop([3, 2], [0, 0]))[0]
    assert S.loop_failures(_loop([0, 2], [0, 1])) == []
    step = lambda skipped, zero_std: {"reward": 0.1, "skipped": skipped, "frac_groups_zero_std": zero_std,
                                      "grad_norm": 0.3}
    assert S.solver_signal([step(0.0, 1.0), step(0.0, 1.0)]) == {"solver_reward": 0.1, "solver_pg_steps": 0}
    assert S.solver_signal([step(0.0, 0.5), step(1.0, 0.5)])["solver_pg_steps"] == 1
    assert S.solver_signal([])["solver_pg_steps"] == 0 and math.isnan(S.solver_signal([])["solver_reward"])


def test_run_results_holds_the_loop_per_iteration_and_plots_it(tmp_path):
    """results.json's "loop": per iteration the valid rates per stream, v_solve of valid tasks (Eq. 2), |D(t)|,
    the solver's reward on D(t) and its steps with an advantage term, the library edits; loop.png draws them."""
    from plumbing import plot_loop
    run, _ = _finished_run(tmp_path, [], 0, 0.5, [{"stream": "skill", "valid": True, "v_solve": 0.5}])
    rows = [{"valid_rate_skill": 0.5, "valid_rate_explore": 0.0, "v_solve_skill": 0.3, "v_solve_explore": float("nan"),
             "pool_size": 4, "solver_reward": 0.2, "solver_pg_steps": 1, "n_refined": 1, "n_pruned": 0, "n_induced": 2},
            {"valid_rate_skill": 0.75, "valid_rate_explore": 0.1, "v_solve_skill": 0.45, "v_solve_explore": 0.5,
             "pool_size": 6, "solver_reward": 0.4, "solver_pg_steps": 2, "n_refined": 0, "n_pruned": 1, "n_induced": 0}]
    from plumbing import Dist
    args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--T", "1", "--run-dir", run])
    results, _ = S.run_results(args, [("base", {}), ("iter 1", {})], S.trivial_baselines(args, Dist()), rows)
    assert results["loop"]["v_solve_skill"] == [0.3, 0.45] and results["loop"]["pool_size"] == [4, 6]
    assert results["loop"]["n_induced"] == [2, 0] and results["loop_failures"] == []
    plot_loop(str(tmp_path), results["loop"])
    assert os.path.getsize(tmp_path / "loop.png") > 1000


def test_answer_budget_fits_the_reference_tool_call():
    """Tool answers get --max-new-tokens as a floor, raised to fit the longest reference call (+ a quarter, + EOS),
    so a long call is never cut; the held-out BFCL rows use the same rule on BFCL's reference calls."""
    args, tok = S.parse_args(["--family", "tool", "--preset", "tiny"]), _tok()
    long_call = {"name": "book_table", "arguments": {f"field_{i}": f"value number {i}" for i in range(30)}}
    n = len(tok.encode("<tool_call>" + json.dumps(long_call) + "</tool_call>", add_special_tokens=False)) + 1
    assert n > args.max_new_tokens and S.answer_budget(args, tok, [long_call]) >= n
    assert S.answer_budget(args, tok, [{"name": "f", "arguments": {}}]) == args.max_new_tokens


# ----- the prepared warm-ups (#48 §1): LoRA adapters W' = W + (α/r)·B·A, merged at start -----

def _lora_tiny(tiny_model_dir, seed=0):
    import torch
    from plumbing import Dist, add_lora, load_model
    model, tok = load_model(tiny_model_dir, Dist(), "float32")
    add_lora(model, 4, 8.0)
    torch.manual_seed(seed)
    for m in model.modules():  # B as training leaves it (nonzero), bf16-exact as save_lora stores A and B
        if hasattr(m, "B"):
            m.B.data = torch.randn_like(m.B).mul_(0.05).bfloat16().float()
            m.A.data = m.A.data.bfloat16().float()
    return model, tok


def test_lora_adapter_starts_at_the_base_model_and_only_its_A_B_train(tiny_model_dir):
    """LoRALinear: B = 0 at the start, so the wrapped model computes what the base computes; add_lora freezes
    every base weight and wraps all seven projections of each layer."""
    import torch
    from plumbing import Dist, LoRALinear, add_lora, load_model
    base, _ = load_model(tiny_model_dir, Dist(), "float32")
    model, _ = load_model(tiny_model_dir, Dist(), "float32")
    add_lora(model, 4, 8.0)
    x = torch.tensor([[1, 5, 9, 2]])
    assert torch.equal(model(x).logits, base(x).logits)
    trainable = {n.rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"A", "B"}
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 7 * 2


def test_lora_merge_computes_W_plus_alpha_over_r_BA(tiny_model_dir, tmp_path):
    """merge_lora(save_lora(adapters)): the plain model with W + (α/r)·B·A merged computes the same logits as
    the model with its adapters; the file holds A and B only (a few MB for the 135M model)."""
    import torch
    from plumbing import Dist, load_model, merge_lora, save_lora
    model, _ = _lora_tiny(tiny_model_dir)
    x = torch.tensor([[1, 5, 9, 2, 7]])
    want = model(x).logits
    save_lora(model, str(tmp_path / "a.safetensors"), {"recipe": {}})
    plain, _ = load_model(tiny_model_dir, Dist(), "float32")
    assert not torch.allclose(plain(x).logits, want, atol=1e-3)  # the adapters change the output
    meta = merge_lora(plain, str(tmp_path / "a.safetensors"))
    assert meta["scale"] == 8.0 / 4
    assert torch.allclose(plain(x).logits, want, atol=1e-4)


def test_lora_merge_into_bf16_weights_keeps_deltas_below_their_resolution_in_expectation(tiny_model_dir, tmp_path):
    """bf16 weights: W + (α/r)·B·A is rounded stochastically (MasterAdamW's rounding), so a delta of 1/10 of a
    bf16 ulp moves the weights by that much on average; rounding to nearest would drop it."""
    import torch
    from plumbing import Dist, load_model, merge_lora, save_lora
    model, _ = _lora_tiny(tiny_model_dir)
    for m in model.modules():
        if hasattr(m, "B"):
            m.B.data.fill_(1e-3)
            m.A.data.fill_(1e-3)  # delta = 2 · 4 · 1e-6 = 8e-6 per entry
    save_lora(model, str(tmp_path / "a.safetensors"), {})
    plain, _ = load_model(tiny_model_dir, Dist(), "bfloat16")
    w0 = plain.model.layers[0].mlp.down_proj.weight.float().clone()
    merge_lora(plain, str(tmp_path / "a.safetensors"))
    moved = (plain.model.layers[0].mlp.down_proj.weight.float() - w0).mean().item()
    want = 2.0 * 4 * float(torch.tensor(1e-3).bfloat16()) ** 2
    assert want < 0.2 * w0.abs().mean().item() * 2**-8  # well below bf16's resolution at these weights
    assert moved == pytest.approx(want, rel=0.15)


def test_use_prepared_merges_only_for_its_recipe_and_model(tiny_model_dir, tmp_path):
    """use_prepared: merged when the recipe and π^(0)'s fingerprint match; another recipe value or another
    model: not merged, and the reason names what differs (the run then warms up by SFT); no folder: nothing; a
    corrupt file: one error line, never a silent fallback."""
    import torch
    from plumbing import Dist, load_model, save_lora, use_prepared, weights_fingerprint
    model, _ = _lora_tiny(tiny_model_dir)
    plain, _ = load_model(tiny_model_dir, Dist(), "float32")
    save_lora(model, str(tmp_path / "zebra-solver.safetensors"),
              {"recipe": {"family": "zebra", "steps": 12}, "fingerprint": weights_fingerprint(plain)})
    assert use_prepared(plain, "", "zebra-solver", {"family": "zebra", "steps": 12}) == (False, "")
    merged, why = use_prepared(plain, str(tmp_path), "zebra-proposer", {})
    assert not merged and "no prepared warm-up" in why
    w0 = plain.model.layers[0].self_attn.q_proj.weight.clone()
    merged, why = use_prepared(plain, str(tmp_path), "zebra-solver", {"family": "zebra", "steps": 10})
    assert not merged and why.endswith("prepared for another steps")
    assert torch.equal(plain.model.layers[0].self_attn.q_proj.weight, w0)  # untouched
    other, _ = load_model(tiny_model_dir, Dist(), "float32")
    with torch.no_grad():
        other.model.embed_tokens.weight.add_(0.5)
    merged, why = use_prepared(other, str(tmp_path), "zebra-solver", {"family": "zebra", "steps": 12})
    assert not merged and why.endswith("prepared for another model")
    merged, why = use_prepared(plain, str(tmp_path), "zebra-solver", {"family": "zebra", "steps": 12})
    assert merged and "merged" in why and not torch.equal(plain.model.layers[0].self_attn.q_proj.weight, w0)
    (tmp_path / "zebra-solver.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(SystemExit, match="cannot read the LoRA adapter"):
        use_prepared(plain, str(tmp_path), "zebra-solver", {"family": "zebra", "steps": 12})


@pytest.mark.parametrize("family", ["tool", "zebra"])
def test_committed_tiny_warmups_are_made_for_the_tiny_recipe_and_the_embedded_model(family):
    """data/selfplay/warmup: the prepared adapters the tiny preset merges; each was made for the tiny preset's
    current warm-up flags and the embedded model, so a change of either that would leave them stale fails here
    (rebuild: make prepare-selfplay)."""
    from plumbing import Dist, load_model, read_lora, weights_fingerprint
    args = S.parse_args(["--preset", "tiny", "--family", family])
    embedded, _ = load_model("embedded", Dist(), "float32", trainable=False)
    for role in ("proposer", "solver"):
        meta, tensors = read_lora(os.path.join(args.warmup_adapters, f"{family}-{role}.safetensors"))
        assert meta["recipe"] == S.warmup_recipe(args, grammar=True), role
        assert meta["fingerprint"] == weights_fingerprint(embedded) and meta["sft"]["sft_steps"] > 0
        assert len(tensors) == 2 * 7 * 30  # A and B of all seven projections of SmolLM2-135M's 30 layers


def test_prepare_warmup_then_a_run_merges_it_and_a_changed_flag_runs_the_sft(tiny_model_dir, tmp_path, capsys):
    """--prepare-warmup trains both warm-ups as LoRA adapters into --warmup-adapters; a run with the same
    flags merges them (no SFT step runs: no proposer_sft/ or solver_sft/ log), and one with another warm-up
    flag (--solver-sft-tasks; the two share one recipe) runs both SFT warm-ups and says why."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "zebra_tiny.md").write_text(TINY_ZEBRA_PACKAGE)
    common = ["--family", "zebra", "--preset", "tiny", "--model", tiny_model_dir, "--library", str(tmp_path / "lib"),
              "--proposer-sft-steps", "2", "--solver-sft-steps", "2", "--solver-sft-tasks", "2", "--sampler", "hf",
              "--warmup-adapters", str(tmp_path / "adapters"), "--lora-rank", "2", "--zebra-eval-per-scale", "1"]
    S.main(common + ["--prepare-warmup", "--run-dir", str(tmp_path / "prep")])
    assert sorted(os.listdir(tmp_path / "adapters")) == ["zebra-proposer.safetensors", "zebra-solver.safetensors"]
    small = ["--T", "0", "--rg-eval-n", "0", "--max-new-tokens", "16", "--no-plots"]
    capsys.readouterr()
    out = S.main(common + small + ["--run-dir", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert printed.count("merged the prepared LoRA adapter") == 2, printed
    assert not (tmp_path / "run" / "proposer_sft").exists() and not (tmp_path / "run" / "solver_sft").exists()
    assert [name for name, _ in out["history"]] == ["base", "solver SFT"]
    S.main(common + small + ["--solver-sft-tasks", "3", "--run-dir", str(tmp_path / "run2")])
    printed = capsys.readouterr().out
    assert printed.count("was prepared for another solver_sft_tasks): 2 steps") == 2, printed  # one recipe: both
    assert "merged the prepared LoRA adapter" not in printed
    assert (tmp_path / "run2" / "solver_sft").exists() and (tmp_path / "run2" / "proposer_sft").exists()


# ----- smoke: the tiny preset itself, one process, as `make demo` and `make evidence` run it -----
@pytest.mark.heavy(270)
@pytest.mark.xdist_group(MEMORY_GROUP)
def test_smoke_tiny_preset_zebra_one_process(tmp_path):
    """#48's teaching run end to end on the embedded model, unshrunk, on the preset's own sampler: both committed
    warm-ups merged (no SFT step in the run), one iteration that proposes, collects, solves, evolves and
    evaluates, and a headline whose every comparison carries its mde."""
    out = run_group([sys.executable, "skill_selfplay.py", "--family", "zebra", "--preset", "tiny", "--run-dir",
                     str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                    env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("merged the prepared LoRA adapter") == 2, out.stdout[-3000:]
    assert not (tmp_path / "proposer_sft").exists() and not (tmp_path / "solver_sft").exists()
    res = json.loads((tmp_path / "results.json").read_text())
    assert [h[0] for h in res["history"]] == ["base", "solver SFT", "iter 1"]
    row = res["rows"][0]
    assert row["n_proposals_parsed"] > 0 and row["pool_size"] > 0, row
    assert all(row[k] > 0 for k in ("time_propose", "time_collect", "time_solve", "time_eval")), row
    assert res["history"][1][1]["zebra_grid"] > res["history"][0][1]["zebra_grid"]  # the warm-up's lift
    claims = [e for e in res["headline"] if e["claim"].startswith("held-out zebra")]
    assert len(claims) == 6 and all("mde" in e for e in claims)
