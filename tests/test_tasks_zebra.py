"""Tests for tasks/zebra.py, the zebra world of skill_selfplay.py: the solution counter against hand values and
a brute force, the clue compiler and generator (unique, deterministic puzzles by ZebraLogic scale), the
answer checker of Eq. 15 and hostile input."""
import copy
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import tasks.zebra as Z  # noqa: E402


# ----- zebra runtime -----

def test_zebra_solution_count_zero_one_many():
    base = {"houses": 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]}}
    none = {**base, "clues": [{"type": "fixed", "a": "Ann", "house": 1}, {"type": "left_of", "a": "Ben", "b": "Ann"}]}
    one = {**base, "clues": [{"type": "fixed", "a": "Ann", "house": 1}, {"type": "same_house", "a": "Ann", "b": "Dog"}]}
    many = {**base, "clues": [{"type": "next_to", "a": "Ann", "b": "Ben"}]}
    assert Z.count_solutions(none)[0] == 0
    assert Z.count_solutions(one) == (1, {"Ann": 1, "Ben": 2, "Dog": 1, "Cat": 2})
    assert Z.count_solutions(many, limit=2)[0] == 2            # stops at 2
    assert Z.count_solutions({**base, "clues": []}, limit=10)[0] == 4  # naive: 2!·2!


def test_zebra_count_matches_brute_force():
    import itertools
    rng = random.Random(3)
    for _ in range(20):
        p = Z.random_blueprint(rng, 3, 2)
        _, pos = Z.compile_puzzle(rng, p)
        p["clues"] = [Z.random_clue(rng, p, pos, list(Z.ZEBRA_CLUE_TYPES)) for _ in range(3)]
        p["clues"] = [c for c in p["clues"] if c]
        brute = 0
        (a1, v1), (a2, v2) = p["attributes"].items()
        for perm1 in itertools.permutations(range(1, 4)):
            for perm2 in itertools.permutations(range(1, 4)):
                pos_ = {**dict(zip(v1, perm1)), **dict(zip(v2, perm2))}
                brute += all(Z.ZEBRA_CLUE_TYPES[c["type"]][1](pos_[c["a"]], pos_[c["b"]] if "b" in c else c["house"])
                             for c in p["clues"])
        assert Z.count_solutions(p, limit=100)[0] == brute


def test_generated_puzzles_are_unique_and_heldout_is_deterministic():
    for scale, p, sol in Z.make_zebra_puzzles(11, ["small", "medium", "large"], 3):
        assert Z.zebra_scale(p["houses"], len(p["attributes"])) == scale
        assert Z.count_solutions(p, 2)[0] == 1
    assert Z.make_zebra_puzzles(11, ["small"], 2) == Z.make_zebra_puzzles(11, ["small"], 2)


def test_grade_grid_good_wrong_and_malformed():
    _, p, sol = Z.make_zebra_puzzles(5, ["small"], 1)[0]
    assert Z.grade_grid("Here it is: " + json.dumps(sol), p, sol)[:3] == (True, True, 1.0)
    broken = copy.deepcopy(sol)
    del broken["House 1"][next(iter(p["attributes"]))]
    assert Z.grade_grid(json.dumps(broken), p, sol)[:2] == (False, False)
    assert Z.grade_grid("no grid {here", p, sol)[:3] == (False, False, 0.0)


def test_complete_blueprint_compiles_or_explains():
    bp = {"houses": 2, "attributes": {"Name": ["Ann", "Ben"], "Pet": ["Cat", "Dog"]},
          "clues": [{"type": "next_to", "a": "Ann", "b": "Ben"}]}
    puzzle, why = Z.complete_blueprint(copy.deepcopy(bp), None, random.Random(0))
    assert puzzle is None and "solutions" in why            # exploration: the proposer's clues must be unique
    puzzle, pos = Z.complete_blueprint(copy.deepcopy(bp), {}, random.Random(0))  # skill stream: compiled
    assert Z.count_solutions(puzzle, 2)[0] == 1 and Z.solution_grid(puzzle, pos)


def test_extract_json_survives_hostile_nesting():
    deep = "[" * 100000 + "]" * 100000
    assert Z.extract_json(deep) is None
