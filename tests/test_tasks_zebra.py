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


# ----- clue propagation and the clue readers (trivial answers beside the held-out rows) -----

HAND = {"houses": 3, "attributes": {"Name": ["Ann", "Ben", "Cid"], "Pet": ["Cat", "Dog", "Emu"]},
        "clues": [{"type": "fixed", "a": "Ben", "house": 1}, {"type": "not_house", "a": "Dog", "house": 1},
                  {"type": "not_house", "a": "Dog", "house": 2}, {"type": "same_house", "a": "Ann", "b": "Emu"}]}


def test_clue_reader_applies_only_in_house_clues_then_listed_order():
    """"Ben is in house 1" places Ben; Ann and Cid fill houses 2 and 3 in listed order; no Pet clue is read, so
    the pets stand in listed order."""
    grid = Z.clue_reader_grid(HAND)
    assert grid == {"House 1": {"Name": "Ben", "Pet": "Cat"}, "House 2": {"Name": "Ann", "Pet": "Dog"},
                    "House 3": {"Name": "Cid", "Pet": "Emu"}}


def test_clue_reader_with_not_clues_uses_all_different():
    """Dog is not in house 1 nor 2: house 3. Cat and Emu then fill houses 1 and 2 in listed order."""
    grid = Z.clue_reader_grid(HAND, use_not=True)
    assert [grid[f"House {h}"]["Pet"] for h in (1, 2, 3)] == ["Cat", "Emu", "Dog"]
    assert [grid[f"House {h}"]["Name"] for h in (1, 2, 3)] == ["Ben", "Ann", "Cid"]
    # a house only one value can take gets it (hidden single): Cat is the only pet allowed in house 1
    p = {"houses": 3, "attributes": {"Name": ["Ann", "Ben", "Cid"], "Pet": ["Cat", "Dog", "Emu"]},
         "clues": [{"type": "not_house", "a": "Dog", "house": 1}, {"type": "not_house", "a": "Emu", "house": 1}]}
    assert Z.propagate(p)["Cat"] == {1} and Z.clue_reader_grid(p, use_not=True)["House 1"]["Pet"] == "Cat"
    assert Z.clue_reader_grid(p)["House 1"]["Pet"] == "Cat"                  # listed order happens to agree


def test_propagation_decides_without_search_or_not():
    """HAND: the one-value clues fix Ben (1) and Dog (3) and leave Ann in {2, 3}, Emu in {1, 2}; arc consistency
    of "Ann and Emu share a house" then decides house 2 for both, and all-different the rest. A puzzle unique only
    by search (B between A and C since both are its neighbours, A not in house 3) is not decided."""
    one_value = Z.propagate(HAND)
    assert one_value["Ben"] == {1} and one_value["Dog"] == {3} and one_value["Ann"] == {2, 3}
    assert one_value["Emu"] == {1, 2}
    assert Z.count_solutions(HAND, 2)[0] == 1 and Z.propagation_decides(HAND)
    assert Z.propagate(HAND, unary=tuple(Z.ZEBRA_CLUE_TYPES), binary=True)["Emu"] == {2}
    search = {"houses": 3, "attributes": {"Name": ["A", "B", "C"], "Pet": ["X", "Y", "Z"]},
              "clues": [{"type": "next_to", "a": "A", "b": "B"}, {"type": "next_to", "a": "B", "b": "C"},
                        {"type": "not_house", "a": "A", "house": 3}, {"type": "same_house", "a": "A", "b": "X"},
                        {"type": "same_house", "a": "B", "b": "Y"}]}
    assert Z.count_solutions(search, 2)[0] == 1 and not Z.propagation_decides(search)


def test_trivial_grids_are_valid_answers_and_the_clue_readers_read_clues():
    """Every trivial answer is a valid grid (each value once); on 2-house puzzles the clue reader with "not" clues
    beats listed order, which the plain reader matches or beats (it only adds what clues fix)."""
    puzzles = Z.make_zebra_puzzles(1234, ["two"], 60)
    score = {k: 0.0 for k in Z.trivial_grids(puzzles[0][1])}
    for _, p, sol in puzzles:
        for kind, grid in Z.trivial_grids(p).items():
            valid, full, _, _ = Z.grade_grid(json.dumps(grid), p, sol)
            assert valid or kind == "constant"
            score[kind] += full
    assert score["constant"] == 0 and score["clue reader+not"] > score["clue reader"] >= score["listed order"]


def test_two_house_scale_and_the_decided_filter():
    """--zebra-eval-scales two: 2-house unique puzzles; --zebra-eval-decided keeps only puzzles propagation decides
    (a filter on the same stream: the default draw is unchanged)."""
    two = Z.make_zebra_puzzles(7, ["two"], 10)
    assert all(p["houses"] == 2 and Z.count_solutions(p, 2)[0] == 1 for _, p, _ in two)
    small = Z.make_zebra_puzzles(7, ["small"], 30, decided=True)
    assert len(small) == 30 and all(Z.propagation_decides(p) for _, p, _ in small)
    every = Z.make_zebra_puzzles(7, ["small"], 60)
    assert [p for _, p, _ in small] == [p for _, p, _ in every if Z.propagation_decides(p)][:30]
