"""Issue #53 §3: model output is hostile input. Every parser, gate and readout of model output (or of a
data or skill file) returns its own error value on bad input (None, a zero reward, a flagged record: each
function's existing contract) and never raises, in bounded time. Each test is named after the function it
covers and feeds it
  * the inputs fuzzing found: integers past Python's 4,300-digit int() limit, nesting past the recursion
    limit, NaN/Infinity, lone surrogates, 1 MB floods of braces, tags, newlines and openers without closers;
  * random text and JSON (hypothesis), built from the tokens these parsers look for.
Every call must return within SECONDS on one (loaded) CPU core; the parsers take milliseconds. The file runs
in well under a minute: OMP_NUM_THREADS=1 pytest tests/test_hostile_output.py"""
import json
import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plumbing
import skill_rm as R
import skill_selfplay as S
import stats
import talentrl as T
from tasks import reward_bench, search_world, skill_bank, tool_calls, toy, zebra

SECONDS = 2.0       # the bound on one call
EXAMPLES = 30       # hypothesis examples per test
MB = 1_000_000
FLOOD = 200_000     # characters of each flood (the plain 1 MB strings are a few)
BIG = "9" * 5000    # past Python's 4,300-digit limit of int(str)
HEX = "0x" + "f" * 5000  # a Python literal whose int str() refuses (6,000 digits)
DEEP = "[" * 900 + "]" * 900  # parses (json's limit is ~1,000), then breaks whatever recurses into it
TAGS = "".join(f"<{t}>" for t in ("skill", "answer", "step", "tool_call", "search", "think", "scenario",
                                   "rubric", "talent", "verdict"))


def _call(name, args):
    return '<tool_call>{"name": "' + name + '", "arguments": ' + args + "}</tool_call>"


HOSTILE = [
    # numbers
    BIG, "-" + "9" * 10000, "1e999999", "-1e999999", "NaN", "Infinity", "-Infinity", "[NaN, Infinity]",
    '{"score": ' + BIG + ', "verdict": "A"}', "[" + BIG + "]", "[1, " + HEX + "]",
    '{"score": NaN, "verdict": Infinity, "a": -Infinity}', "final_answer(verdict=" + HEX + ")\n",
    "{'score': " + HEX + ", 'verdict': " + HEX + ", 'name': " + HEX + "}",
    "Rating: [[" + BIG + "]]", BIG + " of " + BIG + " pass; score " + BIG, "Step " + BIG + ": x\nStep 1: y",
    '{"House ' + BIG + '": {"Name": "x"}, "House 1": {}}', "<answer>" + BIG + "</answer>",
    "The answer is " + BIG, '[{"title": "t", "principle": ' + BIG + "}]",
    # nesting
    "[" * 100_000, '{"a":' * 50_000, "{" * 100_000, "[" * 3000 + "]" * 3000, "{" * 5000 + "}" * 5000,
    '{"a":' * 5000 + "1" + "}" * 5000, '{"a": ' + DEEP + "}", _call("f", '{"a": ' + DEEP + "}"),
    _call("final_answer", '{"verdict": ' + DEEP + "}"), '{"verdict": ' + DEEP + ', "score": ' + DEEP + "}",
    '[{"title": ' + DEEP + ', "principle": "p"}]', '{"tools": [' + DEEP + '], "dialogue": [], "call": {}}',
    '{"houses": 3, "attributes": {}, "clues": [' + DEEP + "]}", "-" * 100_000 + "1", "(" * 100_000,
    '{"House 1": ' + '{"a": ' * 900 + "1" + "}" * 901, "{'a': " + "-" * 100_000 + "1}",
    '<tool_call>{"name": "final_answer", "arguments": ' + '{"a":' * 50_000,
    "---\nname: x\n---\n## Validator\n```json\n" + "[" * 100_000 + "\n```\n",
    # unicode
    "\ud800", '{"verdict": "\ud800"}', '{"verdict": "\\ud800", "score": "\\udfff"}',
    "\udfff<answer>\ud800</answer>",
    _call("final_answer", '{"verdict": "\\ud800"}'), '[{"title": "\\ud800", "principle": "\\udfff"}]',
    # floods: a parser that retries every opener to the end of the text is quadratic (hours at these sizes)
    "a" * MB, "\n" * MB, " " * MB, "9" * MB, "{" + " " * FLOOD, '{"' * (FLOOD // 2), "{'" * (FLOOD // 2),
    "1 " * (FLOOD // 2), '{"a": "' + "x" * FLOOD, " ".join(f"w{i}" for i in range(FLOOD // 6)),
    TAGS * (FLOOD // len(TAGS)), "<step>" * (FLOOD // 6) + "</rubric>",
    "<step>a</step><rubric>" * (FLOOD // 22), "<search>" * (FLOOD // 8) + "</answer>", "final_answer(" * (FLOOD // 13), "final_answer(" + ")x" * FLOOD,
    "answer" + " " * FLOOD + "x", "Title" + "\n" * FLOOD, "---\n" + "## Rules\n" * (FLOOD // 9),
    "{x}" * (FLOOD // 3), "[[" * (FLOOD // 2), ", ".join(f"abc{i}" for i in range(FLOOD // 8)),
]


def _show(x):
    r = repr(x)
    return r if len(r) < 120 else f"{r[:70]}…{r[-30:]} ({len(r)} chars)"


def _timed(fn, *args):
    t = time.perf_counter()
    try:
        out = fn(*args)
    except Exception as e:
        raise AssertionError(f"raised {type(e).__name__} on {_show(args)}") from e
    took = time.perf_counter() - t
    assert took < SECONDS, f"took {took:.1f} s on {_show(args)}"
    return out


# random model-like text: the tokens the parsers look for, random text and random JSON, concatenated
KEYS = ["score", "verdict", "choice", "name", "arguments", "code", "id", "title", "principle", "houses",
        "attributes", "clues", "tools", "dialogue", "call", "type", "a", "b", "house", "satisfied_count",
        "total_count", "checklist", "satisfied", "House 1", "solution"]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), kids, max_size=4),
                    max_leaves=15)
TOKENS = ["{", "}", "[", "]", "(", ")", '"', "'", "\\", ":", ",", "\n", " ", "NaN", "Infinity", "-", "1e999",
          "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<skill>", "</skill>", "<step>",
          "</step>", "<rubric>", "</rubric>", "<scenario>", "</scenario>", "<think>", "</think>", "<talent>",
          "</talent>",
          "<search>", "</search>", "final_answer(", "python_sandbox(", "[[", "]]", "Step 1:", "Answer 2)",
          "House 1", "Rating: ", "verdict: ", "score ", " of ", " pass", "```json\n", "```", "```python\n",
          "---\n", "## Rules\n", "## Validator\n", "Title: ", "Hints: ", "\ud800", "9" * 50, "0x" + "f" * 40]
TEXT = st.lists(st.sampled_from(TOKENS) | st.text(max_size=12) | JSON.map(json.dumps),
                max_size=12).map("".join)
FUZZ = settings(max_examples=EXAMPLES, deadline=SECONDS * 1000, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check(fns, ok, hostile=HOSTILE, texts=TEXT):
    """Each of fns (a function of one argument, or a list of them) on every hostile input and on random
    model-like text returns a value ok() accepts, within SECONDS, and never raises."""
    fns = fns if isinstance(fns, list) else [fns]
    for fn in fns:
        for h in hostile:
            out = _timed(fn, h)
            assert ok(out), f"returned {_show(out)} on {_show(h)}"

    @FUZZ
    @given(texts)
    def fuzz(text):
        for fn in fns:
            out = _timed(fn, text)
            assert ok(out), f"returned {_show(out)} on {_show(text)}"
    fuzz()


def is_none_or(kind):
    return lambda out: out is None or isinstance(out, kind)


def is_label(labels):
    return lambda out: out is None or out in tuple(labels) + ("Tie",)


def is_unit(out):
    return isinstance(out, float) and 0.0 <= out <= 1.0


# ----- plumbing: the judge's lenient JSON / tool-call readers, package files -----

def test_first_json_object():
    check(plumbing.first_json_object, is_none_or(dict))
    # 5,000 nested objects (40 KB) took 7.7 s: every '{' was rescanned to the end and reparsed
    assert _timed(plumbing.first_json_object, '{"a":' * 5000 + "1" + "}" * 5000) is None
    assert plumbing.first_json_object('x {"a": [1, {"b": "}"}]} y') == {"a": [1, {"b": "}"}]}


def test_loads_lenient():
    check(plumbing._loads_lenient, lambda out: True)


def test_parse_tool_call():
    ok = lambda c: c is None or (c["name"] in plumbing.TOOL_NAMES and isinstance(c["arguments"], dict))
    check([plumbing.parse_tool_call, lambda t: plumbing.parse_tool_call(t, allow_code_block=True)], ok)


def test_normalise_call():
    ok = lambda c: c is None or (c["name"] in plumbing.TOOL_NAMES and isinstance(c["arguments"], dict))
    check(lambda t: plumbing._normalise_call(plumbing.first_json_object(t)), ok)
    check(plumbing._normalise_call, ok, hostile=[], texts=JSON)


def test_parse_label():
    check(lambda t: plumbing.parse_label(t, "AB"), is_label("AB"))


def test_parse_text_verdict():
    check(lambda t: plumbing.parse_text_verdict(t, "ABCD"), is_label("ABCD"))


def test_parse_text_rating():
    check(plumbing.parse_text_rating, lambda r: r is None or 0.0 <= r <= 1.0)


def test_parse_package():
    ok = lambda out: ((isinstance(out[0], dict) and out[1] is None)
                      or (out[0] is None and isinstance(out[1], str)))
    check(plumbing.parse_package, ok)


def test_read_skill_folder(tmp_path):
    """A broken skill folder is a SkillError that says what is wrong, never another exception."""
    n = [0]

    def read(front, resources):
        n[0] += 1
        folder = tmp_path / f"s{n[0]}"
        folder.mkdir()
        (folder / "SKILL.md").write_text(f"---\nname: s{n[0]}\ndescription: d\n{front}\n---\nbody\n", "utf-8",
                                         errors="surrogatepass")
        (folder / "resources.yaml").write_text(resources, "utf-8", errors="surrogatepass")
        try:
            plumbing.read_skill_folder(folder)
        except plumbing.SkillError:
            pass
    # PyYAML reads ~10 µs a character and is quadratic in nesting until its RecursionError (~1,000 levels,
    # seconds): a skill file is a few KB, so the deep and the long inputs are left out here
    for h in [h for h in HOSTILE if len(h) < 20_000 and h.count("[") + h.count("{") < 200]:
        _timed(read, "x: " + h, h)
        _timed(read, "", "- " + h)
    check(lambda t: read(t, "- id: a\n  " + t), lambda out: True, hostile=[])

# ----- skill_rm: the judge's readouts -----


def test_text_judgment():
    check([lambda t, mode=mode: R.text_judgment(t, mode, "AB") for mode in ("pointwise", "pairwise")],
          is_none_or(dict))


def test_judge_step():
    def step(text):
        task = R.JudgeTask("p", ["a", "b"], "pairwise", "baseline")
        R.judge_step(task, text, {}, None, "AB")
        return task
    check(step, lambda t: t.done and (t.judgment is None or isinstance(t.judgment, dict)))


def test_readout_pointwise():
    ok = lambda out: 0.0 <= out[0] <= 1.0 and isinstance(out[1], bool)
    check([lambda t: R.readout_pointwise(plumbing.first_json_object(t)),
           lambda v: R.readout_pointwise({"score": v, "satisfied_count": v, "total_count": v})], ok)
    check(R.readout_pointwise, ok, hostile=[], texts=JSON)


def test_judgment_label():
    check([lambda t: R.judgment_label(plumbing.first_json_object(t), "AB"),
           lambda t: R.judgment_label((plumbing.parse_tool_call(t) or {}).get("arguments"), "AB")],
          is_label("AB"))
    check(lambda v: R.judgment_label({"verdict": v}, "AB"), is_label("AB"), hostile=[], texts=JSON)


def test_code_result_used():
    def used(text, mode):
        t = R.JudgeTask("p", ["a", "b"], mode, "skill_rm", judgment={"score": 0.5, "verdict": "A"})
        t.trace = [{"turn": 1, "action": "", "call": {"name": "python_sandbox", "arguments": {}},
                    "observation": text}]
        return R.code_result_used(t)
    check([lambda t, mode=mode: used(t, mode) for mode in ("pointwise", "pairwise")],
          lambda out: out in (None, True, False))

# ----- skill_selfplay: proposals, the solver's rewards, the controller's fields -----


def _zebra_puzzle():
    _, p, solution = zebra.make_zebra_puzzles(0, ["small"], 1)[0]
    return p, solution


def test_proposal_first_json_object():
    check(S.first_json_object, is_none_or(dict))


def test_check_proposal():
    pkgs = {f: S.load_library(f"data/selfplay/{f}", f)[0][0] for f in ("tool", "zebra")}
    ok = lambda rec: rec is None or (isinstance(rec, dict) and rec["reject"] in (None,) + S.REJECT_TYPES)
    check([lambda t, f=family, pkg=pkg: S.check_proposal(f, t, pkg, random.Random(0))
           for family in ("tool", "zebra") for pkg in (None, pkgs[family])], ok)


def test_tool_reward():
    call = {"name": "f", "arguments": {"a": []}}
    check([lambda t: S.tool_reward(t, call), lambda t: S.solve_reward("tool", t, {"contract": call})],
          lambda out: out[0] in (0.0, 0.1, 1.0))


def test_zebra_reward():
    p, solution = _zebra_puzzle()
    rec = {"task": p, "contract": solution}
    check([lambda t: S.zebra_reward(t, p, solution), lambda t: S.solve_reward("zebra", t, rec)],
          lambda out: out[0] in (0.0, 0.1, 1.0))


def test_controller_fields():
    keys = ["Title", "Description", "Rules", "Hints"]
    check(lambda t: plumbing.controller_fields(t, keys),
          lambda out: set(out) <= {k.lower() for k in keys} and all(isinstance(v, str) for v in out.values()))

# ----- talentrl: the route and the proposed skills -----


def test_parse_route():
    check(lambda t: T.parse_route(t, ["talent_a", "b"]), lambda out: out in (None, "talent_a", "b"))


def test_parse_proposed_skills():
    keys = {"title", "principle", "when_to_apply"}
    ok = lambda out: isinstance(out, list) and all(set(s) == keys for s in out)
    check(T.parse_proposed_skills, ok)
    assert T.parse_proposed_skills('[{"title": "t", "principle": ' + BIG + "}]") == []  # was: ValueError
    assert T.parse_proposed_skills("[" * 3000 + "]" * 3000) == []                     # was: RecursionError


@FUZZ
@given(TEXT, st.integers(4301, 20000), st.integers(900, 5000), st.sampled_from(["title", "principle", "x"]),
       st.sampled_from(["int", "list", "dict"]), TEXT)
def test_parse_proposed_skills_never_raises_on_huge_numbers_or_deep_nesting(before, digits, depth, key, kind,
                                                                              after):
    """Issue #50 §4: a number past int()'s 4,300-digit limit (ValueError) or nesting past the recursion limit
    (RecursionError), as any field of a proposed skill list anywhere in the reply, gives well-formed skills
    or none, never an exception."""
    value = {"int": "9" * digits, "list": "[" * depth + "]" * depth,
             "dict": '{"a": ' * depth + "1" + "}" * depth}[kind]
    text = before + '[{"title": "t", "principle": "p"}, {"' + key + '": ' + value + "}]" + after
    out = _timed(T.parse_proposed_skills, text)
    assert isinstance(out, list) and all(set(s) == {"title", "principle", "when_to_apply"} for s in out)

# ----- tasks/: answer extraction, checkers and rewards of each world -----


def test_extract_json():
    check(zebra.extract_json, is_none_or(dict))
    assert zebra.extract_json('a {"x": 1} b {"y": {"z": "}"}} c') == {"y": {"z": "}"}}


def test_parse_grid():
    p, solution = _zebra_puzzle()
    check(lambda t: zebra.parse_grid(t, p), lambda out: isinstance(out[1], bool))
    check(lambda t: zebra.grade_grid(t, p, solution), lambda out: 0.0 <= out[2] <= 1.0)
    assert zebra.parse_grid('{"House ' + BIG + '": {}}', p)[1] is False  # was: ValueError


def test_tool_schema_and_gate():
    ok = lambda out: out is None or isinstance(out, str)
    check(tool_calls.tool_schema_error, ok, hostile=[], texts=JSON)
    check(lambda t: tool_calls.tool_schema_error(S.first_json_object(t)), ok)
    check(lambda v: tool_calls.gate_tool_task(v, None)[1] in (None, "schema"), bool, hostile=[], texts=JSON)


def test_zebra_schema_and_gate():
    ok = lambda out: out is None or isinstance(out, str)
    check(zebra.zebra_schema_error, ok, hostile=[], texts=JSON)
    check(lambda t: zebra.zebra_schema_error(S.first_json_object(t)), ok)
    gate = lambda v: zebra.gate_zebra_blueprint(v, None, random.Random(0))[2] in (None, "schema", "compile")
    check(gate, bool, hostile=[], texts=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=4))


def test_validate_package():
    for family in ("tool", "zebra"):
        pkg = S.load_library(f"data/selfplay/{family}", family)[0][0]
        parts = st.fixed_dictionaries({k: JSON for k in ("validator", "compiler", "example")})
        check(lambda v: S.validate_package({**pkg, **v}, family),
              lambda out: out is None or isinstance(out, str), hostile=[], texts=parts)


def test_parse_tool_calls():
    check([tool_calls.parse_tool_calls, tool_calls.bfcl_decode], is_none_or(list))


def test_extract_lenient():
    check([lambda t, L=L: (L, skill_bank.extract_lenient(t, L)) for L in (1, 3)],
          lambda out: all(len(x) == out[0] and all(isinstance(s, str) for s in x) for x in out[1]))
    assert skill_bank.extract_lenient("Step " + BIG + ": x\nStep 1: y", 1)[1] == ["y"]  # was: ValueError


def test_parse_proposal():
    check(lambda t: skill_bank.parse_proposal(t, [{}, {}]), is_none_or(tuple))


def test_parse_verdict():
    check(skill_bank.parse_verdict, lambda out: all(isinstance(v, bool) for v in out.values()))


def test_parse_judge():
    check(skill_bank.parse_judge, is_unit)


def test_marked_answer():
    check([lambda t, scorer=scorer: skill_bank.marked_answer(t, scorer) for scorer in ("math", "code")],
          lambda out: isinstance(out, str))


def test_parse_labels():
    check(skill_bank.parse_labels, lambda out: isinstance(out, list))


def test_parse_response():
    check(lambda t: skill_bank.parse_response(t, 2), is_none_or(tuple))


def test_scorers():
    """score_choice, score_structure and score_exact (score_math: test_score_math); echoes_question."""
    steps = [{"scorer": "choice", "answer": "B", "question": "q", "meta": {"options": {"A": "x", "B": "y"}}},
             {"scorer": "structure", "answer": "[[1, 2], [3, 4]]", "question": "q", "meta": {}},
             {"scorer": "exact", "answer": "[1, 2.5, 'x']", "question": "q", "meta": {}},
             {"scorer": "exact", "answer": "12", "question": "q", "meta": {}}]
    check([lambda t, step=step: skill_bank.SCORERS[step["scorer"]](t, step) for step in steps], is_unit)
    check(lambda t: skill_bank.echoes_question(t, steps[2]), lambda out: isinstance(out, bool))


def test_score_math():
    """math-verify bounds its own parse and verify (5 s timeouts each); the 1 MB floods are left out here."""
    step = {"scorer": "math", "answer": "12", "question": "q", "meta": {}}
    assert skill_bank.score_math("12", step) == 1.0  # imports math-verify (seconds), outside the timed calls
    check(lambda t: skill_bank.score_math(t, step), is_unit, hostile=[h for h in HOSTILE if len(h) < 200_000])


def test_search_world_rewards():
    """normalize_answer, exact_match, f1_score (the Search-R1 rewards)."""
    check(search_world.normalize_answer, lambda out: isinstance(out, str))
    check([lambda t: search_world.exact_match(t, "the Osk river"), lambda t: search_world.f1_score(t, "Osk")],
          lambda out: 0.0 <= out <= 1.0)


def test_parse_action():
    check(search_world.parse_action, lambda out: out == (None, None) or out[0] in ("search", "answer"))

    def step(text):
        ep = search_world.new_episode({"answer": "x"})
        return search_world.env_reply(ep, text, lambda q: [], 4), ep
    check(step, lambda out: out[0] is None or isinstance(out[0], str))


def test_check_constraint():
    cs = [{"type": t, "n": 3, "word": "w", "phrase": "end"} for t in
          ("lowercase", "uppercase", "max_words", "min_words", "bullets", "include_keyword", "exclude_word",
           "end_phrase", "quotes", "start_word", "no_commas", "title", "postscript", "unknown")]
    check([lambda t, c=c: reward_bench.check_constraint(c, t) for c in cs], lambda out: isinstance(out, bool))
    check(lambda t: reward_bench.constraint_scores(cs[:3], t), lambda out: 0.0 <= out["frac"] <= 1.0)


def test_toy_reward():
    check(lambda t: toy.toy_reward(t, 3), lambda out: out in (0.0, 1.0))


def test_parse_number():
    """stats.parse_number reads model output too (judge scores, exact answers): a finite float or None."""
    finite = lambda out: out is None or (isinstance(out, float) and out == out and abs(out) != float("inf"))
    check([stats.parse_number, lambda t: stats.parse_number(t, ratio=True)], finite)
    check(stats.parse_number, finite, hostile=[], texts=JSON)

