"""The zebra world of Skill Self-Play (skill_selfplay.py --family zebra): runtime, generator, validators.

A puzzle is {"houses": N, "attributes": {attr: [values]}, "clues": [{"type": t, "a": value, "b": value |
"house": k}]}. Values are unique across attributes, so a clue names values only; houses are numbered 1..N.
x = the rendered puzzle (render_zebra_prompt), c = its unique solution grid {"House k": {attr: value}}. Here:
- the runtime: clue types, the global schema check of Eq. 4 (zebra_schema_error), the solution counter
  (count_solutions) and the clue compiler that completes a blueprint until it is unique (compile_puzzle,
  App. I.2; complete_blueprint);
- the generator of training-side and held-out puzzles by ZebraLogic scale (make_zebra_puzzles);
- the answer parser and checker of Eq. 15 (parse_grid, grade_grid) and the answer's JSON schema (grid_schema,
  --solver-aid);
- the package validator language ν and compiler spec (ZEBRA_VALIDATOR_KEYS, ZEBRA_COMPILER_KEYS,
  zebra_contract_error), a package's integrity on its own example (zebra_package_error), the ν derived from
  an inducing record (derive_zebra_validator);
- the proposal format: its text for the proposer (ZEBRA_TASK_SPEC) and its JSON schema (ZEBRA_TASK_SCHEMA);
- search-free clue propagation (propagate, propagation_decides) and the clue readers (clue_reader_grid);
- the held-out instrument (score_zebra), its trivial answers (trivial_grids) and reasoning-gym's zebra puzzles
  as an external check; the held-out set (zebra_heldout), its evaluation (evaluate_zebra), the rows of the
  trivial answers (trivial_baselines) and the solver warm-up's puzzles (zebra_sft_puzzles).
Model output is hostile input: no JSON value makes a checker here raise (count_solutions has a search budget).
"""
import collections
import copy
import json
import math
import random
import re

import numpy as np

from plumbing import brace_candidates, gather_objects, read_items, save_generations
from stats import compare
from tasks.tool_calls import json_object

# ----- the runtime: clue types, value pools, scales -----

ZEBRA_CLUE_TYPES = {  # type -> (arity, holds(pos_a, pos_b_or_house))
    "fixed": (1, lambda pa, h: pa == h),
    "not_house": (1, lambda pa, h: pa != h),
    "same_house": (2, lambda pa, pb: pa == pb),
    "next_to": (2, lambda pa, pb: abs(pa - pb) == 1),
    "left_of": (2, lambda pa, pb: pa < pb),
    "directly_left_of": (2, lambda pa, pb: pa + 1 == pb),
}


ZEBRA_TEXT = {
    "fixed": "{a} is in house {house}.",
    "not_house": "{a} is not in house {house}.",
    "same_house": "{a} and {b} are in the same house.",
    "next_to": "{a} and {b} are in adjacent houses.",
    "left_of": "{a} is somewhere to the left of {b}.",
    "directly_left_of": "{a} is directly left of {b}.",
}


ZEBRA_POOLS = {
    "Name": ["Alice", "Bob", "Carol", "Dave", "Eva", "Finn", "Gia", "Leo"],
    "Drink": ["Tea", "Coffee", "Milk", "Juice", "Water", "Cocoa", "Soda", "Latte"],
    "Pet": ["Cat", "Dog", "Bird", "Fish", "Horse", "Rabbit", "Turtle", "Hamster"],
    "Color": ["Red", "Green", "Blue", "Yellow", "White", "Black", "Purple", "Orange"],
    "Hobby": ["Reading", "Cooking", "Gardening", "Painting", "Chess", "Hiking", "Knitting", "Fishing"],
    "Sport": ["Tennis", "Soccer", "Golf", "Rugby", "Hockey", "Boxing", "Rowing", "Skiing"],
    "Nationality": ["German", "Swede", "Brit", "Dane", "Norwegian", "Indian", "Korean", "Peruvian"],
}


# ZebraLogic scales by search space (N!)^m: small < 1e3 <= medium < 1e6 <= large < 1e10 <= xlarge
ZEBRA_SCALES = {"small": [(2, 3), (3, 2), (3, 3)], "medium": [(3, 4), (4, 3), (4, 4)],
                "large": [(4, 5), (5, 3), (5, 4)], "xlarge": [(5, 5), (6, 4)],
                "two": [(2, 2), (2, 3), (2, 4)]}  # below ZebraLogic's four (all "small"): 2 houses


def zebra_scale(houses, n_attrs):
    size = math.factorial(houses) ** n_attrs
    return "small" if size < 1e3 else "medium" if size < 1e6 else "large" if size < 1e10 else "xlarge"

# ----- global schema check (Eq. 4) and the solution counter -----

def zebra_schema_error(p):
    """Global schema check of a puzzle dict; returns an error string or None."""
    if not isinstance(p, dict) or not isinstance(p.get("houses"), int) or isinstance(p.get("houses"), bool):
        return "houses must be an integer"
    n, attrs = p["houses"], p.get("attributes")
    if not 2 <= n <= 6:
        return "houses must be in 2..6"
    if not isinstance(attrs, dict) or not 2 <= len(attrs) <= 6:
        return "attributes must map 2..6 names to value lists"
    seen = set()
    for name, vals in attrs.items():
        if not isinstance(vals, list) or len(vals) != n or not all(isinstance(v, str) and v.strip()
                                                                   for v in vals):
            return f"attribute {name!r} needs exactly {n} non-empty string values"
        for v in vals:
            if v.lower() in seen:
                return f"value {v!r} is repeated"
            seen.add(v.lower())
    clues = p.get("clues", [])
    if not isinstance(clues, list):
        return "clues must be a list"
    for c in clues:
        if not isinstance(c, dict) or not isinstance(c.get("type"), str) or c["type"] not in ZEBRA_CLUE_TYPES:
            return f"unknown clue {str(c)[:80]}"
        arity = ZEBRA_CLUE_TYPES[c["type"]][0]
        if not isinstance(c.get("a"), str) or c["a"].lower() not in seen:
            return f"clue {c!r} names an unknown value"
        if arity == 2 and (not isinstance(c.get("b"), str) or c["b"].lower() not in seen
                           or c["b"].lower() == c["a"].lower()):
            return f"clue {c!r} needs a second, different known value"
        if arity == 1 and (not isinstance(c.get("house"), int) or isinstance(c.get("house"), bool)
                           or not 1 <= c["house"] <= n):
            return f"clue {c!r} needs a house in 1..{n}"
    return None


def clean_clues(clues):
    """Schema-valid clues with only the keys their type reads (a stray "b" on a one-value clue, or a "house"
    on a two-value clue, is dropped rather than rejected)."""
    keep = {1: ("type", "a", "house"), 2: ("type", "a", "b")}
    return [{k: c[k] for k in keep[ZEBRA_CLUE_TYPES[c["type"]][0]]} for c in clues]


def _canon_value(p):
    """lower-cased value -> (attribute, canonical spelling)."""
    return {v.lower(): (a, v) for a, vals in p["attributes"].items() for v in vals}


class SearchBudget(Exception):
    pass


def count_solutions(p, limit=2, budget=2_000_000):
    """Backtracking count of solutions of a schema-valid puzzle, stopping at `limit` (raises SearchBudget
    after `budget` placements, so a hostile proposal cannot stall).

    Unary clues shrink each value's house domain first; values are then placed most-constrained first and a
    binary clue is checked as soon as both of its values are placed. Returns (count, first solution as {value:
    house})."""
    canon = _canon_value(p)
    attr_of = {v: a for a, vals in p["attributes"].items() for v in vals}
    domain = {v: set(range(1, p["houses"] + 1)) for v in attr_of}
    binary, degree = [], collections.Counter()
    for c in p.get("clues", []):
        a = canon[c["a"].lower()][1]
        if ZEBRA_CLUE_TYPES[c["type"]][0] == 1:
            domain[a] = {h for h in domain[a] if ZEBRA_CLUE_TYPES[c["type"]][1](h, c["house"])}
        else:
            b = canon[c["b"].lower()][1]
            binary.append((c["type"], a, b))
            degree[a] += 1
            degree[b] += 1
    order = sorted(attr_of, key=lambda v: (len(domain[v]), -degree[v]))
    rank = {v: i for i, v in enumerate(order)}
    checks = collections.defaultdict(list)  # index of value -> binary clues to test once it is placed
    for t, a, b in binary:
        checks[max(rank[a], rank[b])].append((ZEBRA_CLUE_TYPES[t][1], a, b))
    pos, used, found, nodes = {}, collections.defaultdict(set), [], [0]

    def place(i):
        if len(found) >= limit:
            return
        nodes[0] += 1
        if nodes[0] > budget:
            raise SearchBudget("solution search exceeded its budget")
        if i == len(order):
            found.append(dict(pos))
            return
        v = order[i]
        for h in sorted(domain[v] - used[attr_of[v]]):
            pos[v] = h
            if all(holds(pos[a], pos[b]) for holds, a, b in checks[i]):
                used[attr_of[v]].add(h)
                place(i + 1)
                used[attr_of[v]].discard(h)
            del pos[v]

    place(0)
    return len(found), (found[0] if found else None)


def solution_grid(p, pos):
    """{value: house} -> {"House k": {attr: value}}."""
    grid = {f"House {h}": {} for h in range(1, p["houses"] + 1)}
    for attr, vals in p["attributes"].items():
        for v in vals:
            grid[f"House {pos[v]}"][attr] = v
    return grid

# ----- the clue compiler (App. I.2) and the puzzle generator -----

def random_clue(rng, p, pos, types):
    """A random clue of one of `types` that holds under the solution `pos`, or None."""
    vals, n = list(pos), p["houses"]
    t = rng.choice(types)
    a = rng.choice(vals)
    if t == "fixed":
        return {"type": t, "a": a, "house": pos[a]}
    if t == "not_house":
        others = [h for h in range(1, n + 1) if h != pos[a]]
        return {"type": t, "a": a, "house": rng.choice(others)}
    cands = [b for b in vals if b != a and ZEBRA_CLUE_TYPES[t][1](pos[a], pos[b])]
    if t == "same_house":  # same-house pairs across different attributes only
        attr_of = {v: at for at, vs in p["attributes"].items() for v in vs}
        cands = [b for b in cands if attr_of[b] != attr_of[a]]
    return {"type": t, "a": a, "b": rng.choice(cands)} if cands else None


def compile_puzzle(rng, blueprint, preferred=None, fixed_limit=None, min_counts=None, max_clues=40):
    try:
        return _compile(rng, blueprint, preferred, fixed_limit, min_counts, max_clues)
    except SearchBudget as e:
        return None, str(e)


def _compile(rng, blueprint, preferred, fixed_limit, min_counts, max_clues):
    """Fixed logical runtime: complete a blueprint into a uniquely solvable puzzle.

    The blueprint's own clues (if any) are kept; the runtime picks one of their solutions, then adds random
    true clues (preferred relation types 3x as likely) until the solution is unique, and finally drops
    redundant added clues while keeping `min_counts`. Returns (puzzle, {value: house}) or (None, reason)."""
    p = {"houses": blueprint["houses"], "attributes": copy.deepcopy(blueprint["attributes"]),
         "clues": copy.deepcopy(blueprint.get("clues", []))}
    if zebra_schema_error(p):
        return None, zebra_schema_error(p)
    canon = _canon_value(p)
    p["clues"] = clean_clues(p["clues"])
    for c in p["clues"]:  # canonical spelling of the values
        c["a"] = canon[c["a"].lower()][1]
        if "b" in c:
            c["b"] = canon[c["b"].lower()][1]
    if p["clues"]:
        n_sol, pos = count_solutions(p, limit=1)
        if n_sol == 0:
            return None, "the proposed clues contradict each other"
    else:
        pos = {}
        for attr, vals in p["attributes"].items():
            houses = list(range(1, p["houses"] + 1))
            rng.shuffle(houses)
            pos.update(dict(zip(vals, houses)))
    types = list(ZEBRA_CLUE_TYPES)
    weighted = types + [t for t in (preferred or []) if t in ZEBRA_CLUE_TYPES] * 3
    n_given = len(p["clues"])
    need = dict(min_counts or {})
    for tries in range(50 * max_clues + 1):  # required counts first, then random clues until unique
        if len(p["clues"]) > max_clues or tries == 50 * max_clues:
            return None, "no unique puzzle within the clue budget"
        have = collections.Counter(c["type"] for c in p["clues"])
        missing = [t for t, k in need.items() if have[t] < k and t in ZEBRA_CLUE_TYPES]
        if not missing and count_solutions(p, 2)[0] == 1:
            break
        c = random_clue(rng, p, pos, missing or weighted)
        if c is None or c in p["clues"]:
            continue
        if c["type"] == "fixed" and fixed_limit is not None and have["fixed"] >= fixed_limit and not missing:
            continue
        p["clues"].append(c)
    for i in range(len(p["clues"]) - 1, n_given - 1, -1):  # drop redundant compiled clues
        trial = p["clues"][:i] + p["clues"][i + 1:]
        have = collections.Counter(c["type"] for c in trial)
        if all(have[t] >= k for t, k in need.items()) and count_solutions({**p, "clues": trial}, 2)[0] == 1:
            p["clues"] = trial
    return p, count_solutions(p, 2)[1]


def random_blueprint(rng, houses, n_attrs):
    attrs = rng.sample(sorted(ZEBRA_POOLS), n_attrs)
    return {"houses": houses, "attributes": {a: rng.sample(ZEBRA_POOLS[a], houses) for a in attrs}}


def make_zebra_puzzles(seed, scales, per_scale, decided=False):
    """Held-out puzzles by scale from a fixed seed: [(scale, puzzle, solution grid)]; decided: only puzzles
    that clue propagation solves without search (propagation_decides)."""
    rng, out = random.Random(seed), []
    for scale in scales:
        made = 0
        while made < per_scale:
            houses, m = rng.choice(ZEBRA_SCALES[scale])
            p, pos = compile_puzzle(rng, random_blueprint(rng, houses, m))
            if p is not None and (not decided or propagation_decides(p)):
                out.append((scale, p, solution_grid(p, pos)))
                made += 1
    return out

# ----- the solver's prompt and the answer parser (Eq. 15) -----

def render_zebra_prompt(p):
    """x for a zebra puzzle: the solver sees attributes and clues, never the solution."""
    lines = [f"There are {p['houses']} houses in a row, numbered 1 (left) to {p['houses']} (right). "
             "Each house has exactly one value of every attribute, and no two houses share a value."]
    for attr, vals in p["attributes"].items():
        lines.append(f"- {attr}: {', '.join(vals)}")
    lines.append("Clues:")
    for i, c in enumerate(p["clues"], 1):
        lines.append(f"{i}. " + ZEBRA_TEXT[c["type"]].format(**c))
    example = {f"House {h}": {a: "..." for a in p["attributes"]} for h in range(1, p["houses"] + 1)}
    lines.append("Give the full solution as JSON in this shape: " + json.dumps(example))
    return "\n".join(lines)


def extract_json(text):
    """Last top-level decodable JSON object in text (or None). A JSON object runs to its matching '}', so only
    the closed candidates of plumbing.brace_candidates are decoded (bounded time on a flood of braces)."""
    dec, best, after = json.JSONDecoder(), None, 0
    for start, end, _ in brace_candidates(text, closed_only=True):
        if start < after:  # inside the last object decoded
            continue
        try:
            obj, n = dec.raw_decode(text[start:end])  # the slice: an error's line count is not O(len(text))
        except (ValueError, RecursionError):  # RecursionError: hostile nesting depth
            continue
        if isinstance(obj, dict):
            best = obj
        after = start + n
    return best


def parse_grid(text, p):
    """Parse a solver answer into {house: {attr: value}} with canonical names.

    Returns (grid, valid_structure). valid_structure needs houses 1..N, every attribute in every house, and
    each attribute a permutation of its values."""
    obj = extract_json(text)
    if obj is None:
        return None, False
    if "solution" in obj and isinstance(obj["solution"], dict):
        obj = obj["solution"]
    attr_names = {a.lower(): a for a in p["attributes"]}
    grid = {}
    for key, row in obj.items():
        m = re.fullmatch(r"\s*(?:house\s*)?(\d+)\s*", str(key), re.I)
        if not m or not isinstance(row, dict):
            continue
        try:
            h = int(m.group(1))
        except ValueError:  # past int()'s 4,300 digits: no house (hostile output)
            h = -1
        grid[h] = {}
        for a, v in row.items():
            a = attr_names.get(str(a).strip().lower())
            if a is not None and isinstance(v, str):
                canon = {x.lower(): x for x in p["attributes"][a]}
                grid[h][a] = canon.get(v.strip().lower(), v.strip())
    valid = set(grid) == set(range(1, p["houses"] + 1)) and all(
        set(grid[h]) == set(p["attributes"]) for h in grid) and all(
        sorted(grid[h][a] for h in grid) == sorted(vals) for a, vals in p["attributes"].items())
    return grid, valid


def grade_grid(text, p, solution):
    """Eq. 15's checker on a reply: (valid structure, full puzzle, cell accuracy, parsed grid)."""
    grid, valid = parse_grid(text, p)
    cells = [(h, a) for h in range(1, p["houses"] + 1) for a in p["attributes"]]
    right = sum(1 for h, a in cells if grid and grid.get(h, {}).get(a) == solution[f"House {h}"][a])
    full = right == len(cells) and valid
    return valid, full, right / len(cells), grid


def complete_blueprint(bp, compiler, rng):
    """A schema-valid blueprint → (puzzle, its solution {value: house}) or (None, why). With a package's
    compiler spec (skill stream) the runtime compiles it until it is unique (compile_puzzle); without one
    (exploration stream) the proposer's own clues must already make it unique."""
    bp["clues"] = clean_clues(bp["clues"])
    if compiler is not None:
        return compile_puzzle(rng, bp, compiler.get("preferred"), compiler.get("fixed_limit"),
                              compiler.get("min_counts"))
    try:
        n_sol, pos = count_solutions(bp, 2)
        return (bp, pos) if n_sol == 1 else (None, f"{n_sol} solutions (need exactly 1)")
    except SearchBudget as e:
        return None, str(e)


def gate_zebra_blueprint(obj, pkg, rng):
    """The gate of Eq. 4 before the probes, on a zebra proposal: its blueprint passes the global schema, is
    completed into a unique puzzle (complete_blueprint; pkg None: the exploration stream) and passes the
    package's ν. Returns (task, contract, the gate that rejected it or None, why)."""
    bp = {"houses": obj.get("houses"), "attributes": obj.get("attributes"), "clues": obj.get("clues", [])}
    err = zebra_schema_error(bp)
    if err:
        return obj, None, "schema", err
    puzzle, pos = complete_blueprint(bp, pkg["compiler"] if pkg is not None else None, rng)
    if puzzle is None:
        return obj, None, "compile", pos
    err = zebra_contract_error(puzzle, pkg["validator"]) if pkg is not None else None
    return puzzle, solution_grid(puzzle, pos), ("contract" if err else None), err or ""


def grid_budget(tok, solutions, floor):
    """Token budget of a zebra answer: `floor`, raised until the longest gold grid among `solutions` fits,
    written with ", " and ": " (longer than the compact JSON the grid schema decodes), plus a quarter for
    other tokenisations and EOS (docs/skill_selfplay.md)."""
    longest = max(len(tok.encode(json.dumps(sol), add_special_tokens=False)) for sol in solutions)
    return max(floor, math.ceil(1.25 * longest) + 1)

def grid_schema(p):
    """JSON schema of a zebra answer: every house, every attribute, each value one of the attribute's values
    (that each value is used once, and which house holds it, is left to the solver)."""
    row = json_object(list(p["attributes"]),
                      **{a: {"enum": list(vals)} for a, vals in p["attributes"].items()})
    houses = [f"House {h}" for h in range(1, p["houses"] + 1)]
    return json_object(houses, **{h: row for h in houses})

# ----- package validators ν and compiler specs -----

ZEBRA_VALIDATOR_KEYS = {"min_houses": int, "max_houses": int, "min_attributes": int, "max_attributes": int,
                        "required_clues": dict, "max_fixed": int}


ZEBRA_COMPILER_KEYS = {"preferred": list, "fixed_limit": int, "min_counts": dict}


def zebra_contract_error(p, nu):
    """Package validator ν of a zebra package on a schema-valid puzzle."""
    if not nu.get("min_houses", 2) <= p["houses"] <= nu.get("max_houses", 6):
        return "house count outside the package range"
    if not nu.get("min_attributes", 2) <= len(p["attributes"]) <= nu.get("max_attributes", 6):
        return "attribute count outside the package range"
    have = collections.Counter(c["type"] for c in p["clues"])
    for t, k in nu.get("required_clues", {}).items():
        if have[t] < k:
            return f"needs at least {k} {t} clue(s)"
    if have["fixed"] > nu.get("max_fixed", 99):
        return f"at most {nu['max_fixed']} fixed clue(s)"
    return None


def zebra_package_error(pkg):
    """Integrity of a zebra package past its keys: clue counts name clue types, and its own example passes the
    global schema (zebra_schema_error), its validator ν (zebra_contract_error) and is uniquely solvable."""
    for spec in (pkg["validator"].get("required_clues", {}), pkg["compiler"].get("min_counts", {})):
        if any(t not in ZEBRA_CLUE_TYPES or not isinstance(k, int) for t, k in spec.items()):
            return "clue counts must map clue types to integers"
    ex = pkg.get("example")
    err = zebra_schema_error(ex) or zebra_contract_error(ex, pkg["validator"])
    if err:
        return f"example: {err}"
    try:
        if count_solutions(ex, 2)[0] != 1:
            return "example: puzzle is not uniquely solvable"
    except SearchBudget:
        return "example: solution search exceeded its budget"
    return None


def derive_zebra_validator(task):
    """ν and compiler spec of a package induced from this puzzle (Eq. 10; difference 7): its house count, at
    least its attributes, up to two of each clue type it uses (not_house aside), at most its fixed clues; the
    compiler prefers its three most used clue types. Returns (ν, compiler)."""
    counts = collections.Counter(c["type"] for c in task["clues"])
    need = {t: min(k, 2) for t, k in counts.items() if t != "not_house"}
    nu = {"min_houses": task["houses"], "max_houses": task["houses"],
          "min_attributes": len(task["attributes"]), "required_clues": need, "max_fixed": counts["fixed"]}
    compiler = {"preferred": [t for t, _ in counts.most_common(3)], "fixed_limit": counts["fixed"],
                "min_counts": need}
    return nu, compiler

# ----- the proposal format (the proposer's spec, and its JSON schema for --proposer-grammar) -----

ZEBRA_TASK_SPEC = ('A puzzle is one JSON object with keys "houses" (2-6), "attributes" ({name: [one '
                   'value per house]}, all values distinct) and "clues" (a list of {"type": '
                   'fixed|not_house, "a": value, "house": k} or {"type": '
                   'same_house|next_to|left_of|directly_left_of, "a": value, "b": value}).')


_ZEBRA_VALUE = {"type": "string", "pattern": "^[A-Z][a-z]{1,11}$"}


def _zebra_schema(n):
    """A puzzle with n houses: every attribute lists exactly n values."""
    clue = json_object(["type", "a"], type={"enum": sorted(ZEBRA_TEXT)}, a=_ZEBRA_VALUE, b=_ZEBRA_VALUE,
                       house={"type": "integer", "minimum": 1, "maximum": n})
    values = {"type": "array", "items": _ZEBRA_VALUE, "minItems": n, "maxItems": n}
    return json_object(["houses", "attributes", "clues"], houses={"const": n},
                       attributes={"type": "object", "minProperties": 2, "maxProperties": 6,
                                   "additionalProperties": values},
                       clues={"type": "array", "maxItems": 16, "items": clue})


ZEBRA_TASK_SCHEMA = {"anyOf": [_zebra_schema(n) for n in range(2, 7)]}  # one alternative per house count

# ----- clue propagation (search-free solving) and the clue readers -----

def propagate(p, unary=("fixed", "not_house"), binary=False):
    """Each value's houses {value: set} after propagation without search on a schema-valid puzzle: the
    one-value clues of the types `unary`, then, until nothing changes, all-different (a value alone in its
    domain leaves that house to no other value of its attribute; a house only one value of an attribute can
    take gets it) and, if `binary`, arc consistency of the two-value clues (a house of a stays only if some
    house of b satisfies the clue, and back)."""
    canon, n = _canon_value(p), p["houses"]
    dom = {v: set(range(1, n + 1)) for vals in p["attributes"].values() for v in vals}
    pairs = []
    for c in p.get("clues", []):
        arity, holds = ZEBRA_CLUE_TYPES[c["type"]]
        a = canon[c["a"].lower()][1]
        if arity == 1 and c["type"] in unary:
            dom[a] = {h for h in dom[a] if holds(h, c["house"])}
        elif arity == 2 and binary:
            pairs.append((holds, a, canon[c["b"].lower()][1]))
    before = None
    while dom != before:  # domains only shrink, so this ends
        before = {v: set(d) for v, d in dom.items()}
        for vals in p["attributes"].values():
            for v in [v for v in vals if len(dom[v]) == 1]:
                for w in vals:
                    if w != v:
                        dom[w] = dom[w] - dom[v]
            for h in range(1, n + 1):
                can = [v for v in vals if h in dom[v]]
                if len(can) == 1:
                    dom[can[0]] = {h}
        for holds, a, b in pairs:
            dom[a] = {h for h in dom[a] if any(holds(h, k) for k in dom[b])}
            dom[b] = {k for k in dom[b] if any(holds(h, k) for h in dom[a])}
    return dom


def propagation_decides(p):
    """The puzzle is solved by propagation alone (every clue type, no search): one house left per value."""
    return all(len(d) == 1 for d in propagate(p, unary=tuple(ZEBRA_CLUE_TYPES), binary=True).values())


def clue_reader_grid(p, use_not=False):
    """A trivial answer that reads only the one-value clues: "X is in house k" (use_not: also "X is not in
    house k", with the all-different rule) place what they decide; each attribute's other values fill its
    free houses in listed order, each into the first free house its read clues allow (else the first free)."""
    dom = propagate(p, ("fixed", "not_house") if use_not else ("fixed",))
    grid = {f"House {h}": {} for h in range(1, p["houses"] + 1)}
    for attr, vals in p["attributes"].items():
        place = {}
        for v in vals:  # decided values first, each house at most once
            if len(dom[v]) == 1 and next(iter(dom[v])) not in place.values():
                place[v] = next(iter(dom[v]))
        for v in vals:
            free = [h for h in range(1, p["houses"] + 1) if h not in place.values()]
            if v not in place:
                place[v] = next((h for h in free if h in dom[v]), free[0])
        for v, h in place.items():
            grid[f"House {h}"][attr] = v
    return grid


# ----- the held-out instrument, its trivial answers, reasoning-gym's zebra puzzles -----

def trivial_grids(p):
    """The trivial answers of a puzzle: one constant value per attribute (its first listed value in every
    house: 1/N of the cells by construction), every attribute's values in listed order (house h the h-th),
    and the two clue readers (clue_reader_grid: "in house k" clues only; also "not in house k")."""
    houses = range(1, p["houses"] + 1)
    return {"constant": {f"House {h}": {a: v[0] for a, v in p["attributes"].items()} for h in houses},
            "listed order": {f"House {h}": {a: v[h - 1] for a, v in p["attributes"].items()} for h in houses},
            "clue reader": clue_reader_grid(p), "clue reader+not": clue_reader_grid(p, use_not=True)}


def score_zebra(puzzles, answers, scales):
    """The held-out instrument (Table 2): Eq. 15's checker on the answers (answers[i]: the replies to puzzle
    i), per-puzzle items (cell accuracy, full-grid and valid rates, each the mean over its replies = avg@k)
    and the table's numbers, means over puzzles: grid accuracy per scale, overall grid and cell accuracy."""
    items = []
    for i, ((scale, p, sol), texts) in enumerate(zip(puzzles, answers)):
        scored = [grade_grid(t, p, sol) for t in texts]
        items.append({"i": i, "scale": scale, "cells": p["houses"] * len(p["attributes"]),
                      "cell": float(np.mean([x[2] for x in scored])) if scored else 0.0,
                      "grid": float(np.mean([x[1] for x in scored])) if scored else 0.0,
                      "valid": float(np.mean([x[0] for x in scored])) if scored else 0.0, "answers": texts})
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0
    res = {f"zebra_{s}": mean([it["grid"] for it in items if it["scale"] == s]) for s in scales}
    res.update(zebra_grid=mean([it["grid"] for it in items]), zebra_cell=mean([it["cell"] for it in items]))
    return res, items


def rg_zebra_items(seed, n, rank=0, world=1):
    """reasoning-gym's zebra puzzles (an external check; difference 3): the dataset, whose score_answer is its
    own checker, and this rank's share of its n entries ({"question", ...}; entry i on rank i mod world)."""
    import reasoning_gym
    ds = reasoning_gym.create_dataset("zebra_puzzles", seed=seed, size=n)
    return ds, [ds[i] for i in range(rank, n, world)]


def rg_zebra_score(ds, entry, text):
    """reasoning-gym's score of a reply: its answer is the last word of its last line, lower-cased."""
    last = (text.strip().splitlines() or [""])[-1]
    words_ = re.findall(r"[A-Za-z]+", last)
    return float(ds.score_answer(words_[-1].lower() if words_ else "", entry))


# ----- the held-out evaluation (Table 2) and the rows of the trivial answers -----

def zebra_heldout(args):
    """The held-out puzzles (fixed --eval-seed, never trained on; --zebra-eval-decided: only those clue
    propagation decides) and their scales."""
    scales = [s for s in args.zebra_eval_scales.split(",") if s]
    decided = args.zebra_eval_decided
    return make_zebra_puzzles(args.eval_seed, scales, args.zebra_eval_per_scale, decided), scales


def evaluate_zebra(sampler, prompt_of, budget_of, schemas_of, args, dist):
    """Held-out zebra (score_zebra) plus reasoning-gym's zebra puzzles; sharded over ranks, replies gathered.
    prompt_of(messages), budget_of(gold grids), schemas_of(puzzles): the solver's decoding. Returns (res,
    items)."""
    puzzles, scales = zebra_heldout(args)
    mine = list(range(dist.rank, len(puzzles), dist.world))
    prompts = [prompt_of([{"role": "user", "content": render_zebra_prompt(puzzles[i][1])}]) for i in mine]
    budget = budget_of([sol for _, _, sol in puzzles])  # fits the longest held-out gold grid, in every row
    outs = sampler.generate(prompts, args.eval_samples, budget, args.eval_temperature,
                            json_schema=schemas_of([puzzles[i][1] for i in mine])
                            ) if prompts else []
    replies = dict(gather_objects([(i, [s.text for s in samples]) for i, samples in zip(mine, outs)], dist))
    res, items = score_zebra(puzzles, [replies[i] for i in range(len(puzzles))], scales)
    if args.rg_eval_n:  # reasoning-gym's zebra puzzles, scored by its own checker
        ds, entries = rg_zebra_items(args.eval_seed, args.rg_eval_n, dist.rank, dist.world)
        prompts = [prompt_of([{"role": "user", "content": e["question"]}]) for e in entries]
        outs = sampler.generate(prompts, args.eval_samples, args.max_new_tokens,
                                args.eval_temperature) if entries else []
        scores = [rg_zebra_score(ds, e, s.text) for e, samples in zip(entries, outs) for s in samples]
        res["rg_zebra"] = float(np.mean(gather_objects(scores, dist)))
    return res, items


def zebra_sft_puzzles(args):
    """The solver warm-up's puzzles: the held-out scales from a training-side seed, none equal to a held-out
    one; [(puzzle, solution grid)]."""
    heldout, scales = zebra_heldout(args)
    seen = {render_zebra_prompt(p) for _, p, _ in heldout}
    per_scale = -(-args.solver_sft_tasks // len(scales))
    return [(p, sol) for _, p, sol in make_zebra_puzzles(f"{args.data_seed}-solver-sft", scales, per_scale,
                                                         args.zebra_eval_decided)
            if render_zebra_prompt(p) not in seen]


def trivial_baselines(args, dist):
    """Table rows of the trivial answers (trivial_grids), scored by the same checker and saved like a
    solver's row; the tool family has none."""
    if args.family != "zebra":
        return []
    puzzles, scales = zebra_heldout(args)
    rows = []
    for kind in ("constant", "listed order", "clue reader", "clue reader+not"):
        answers = [[json.dumps(trivial_grids(p)[kind])] for _, p, _ in puzzles]
        res, items = score_zebra(puzzles, answers, scales)
        save_generations(args, "trivial " + kind, items, dist)
        rows.append((kind, res))
    return rows


def zebra_headline(run_dir, rows, trivial_kinds, arm, results):
    """skill_selfplay's held-out comparisons, paired over puzzles (puzzle i is the same in every seed: the
    clusters): the last row (rows[-1]) vs base, vs the warm-up, and vs the best trivial answer on each metric
    (its mean is every entry's chance line). Fills results' final_items and final_ids; returns the entries."""
    last, headline = rows[-1], []
    final = read_items(run_dir, last)
    results["final_items"] = {m: [it[m] for it in final] for m in ("cell", "grid")}
    results["final_ids"] = ids = [it["i"] for it in final]
    for m in ("cell", "grid"):
        trivial = {kind: [it[m] for it in read_items(run_dir, "trivial " + kind)] for kind in trivial_kinds}
        kind = max(trivial, key=lambda k: np.mean(trivial[k]))
        refs = [(ref, [it[m] for it in read_items(run_dir, ref)]) for ref in ("base", "solver SFT")
                if ref != last and ref in rows] + [(f"trivial: {kind}", trivial[kind])]
        for ref, ref_items in refs:
            headline.append(compare(f"held-out zebra {m} accuracy, {arm}: last iteration vs {ref}",
                                    f"{arm} {last}", ref, results["final_items"][m], ref_items,
                                    chance=float(np.mean(trivial[kind])), item_ids=ids,
                                    primary=m == "grid" and ref != "solver SFT"))
    return headline
