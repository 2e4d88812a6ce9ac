"""Tests of skill_rm.py: readouts (§3), skill loading and gating, the tool-call parser, the python_sandbox
against hostile code, the judge loop's mechanics, and a smoke run of the tiny preset. The world
(tasks/reward_bench.py: checkers, items, splits, the knockout) is tested in test_tasks_reward_bench.py."""
import json
import random
import re
import shutil
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import plumbing  # noqa: E402
import skill_rm as S  # noqa: E402
from conftest import MEMORY_GROUP, SLOW  # noqa: E402
from plumbing import ConstrainedHFSampler, FreeString, json_text, schema_instances  # noqa: E402
from sandbox import CODE_IMPORTS  # noqa: E402
from tasks import reward_bench as rb  # noqa: E402

SLOW_WHY = ("the in-run full-weight judge SFT (1,280 s, one thread), a path tiny no longer takes (it merges the "
            "prepared adapters, tested by [prepared]): NANOSKILL_SLOW_TESTS=1 runs it")

SKILLS = ROOT / "data" / "skills"


def judge_args(**kw):
    a = dict(max_resources=4, resource_chars=8000, sandbox_timeout=3.0, sandbox_mem_mb=256, retries=1,
             judge_max_new_tokens=32, judge_temperature=0.0, constrained=True, code_max_chars=400, judge_chunk=0)
    a.update(kw)
    return SimpleNamespace(**a)


# ----- §3 readouts -----

def test_readout_pointwise_score_is_clamped():
    assert S.readout_pointwise({"score": 0.75}) == (0.75, True)
    assert S.readout_pointwise({"score": 7}) == (1.0, True)
    assert S.readout_pointwise({"score": -2}) == (0.0, True)
    assert S.readout_pointwise({"score": "3/4"}) == (0.75, True)
    assert S.readout_pointwise({"score": "50%"}) == (0.5, True)


def test_readout_pointwise_checklist_ratio():
    assert S.readout_pointwise({"satisfied_count": 2, "total_count": 3})[0] == pytest.approx(2 / 3)
    items = [{"constraint": "a", "satisfied": True}, {"constraint": "b", "satisfied": False},
             {"constraint": "c", "satisfied": "true"}, {"constraint": "d", "satisfied": False}]
    assert S.readout_pointwise({"checklist": items}) == (0.5, True)
    assert S.readout_pointwise({"satisfied_count": 0, "total_count": 0}) == (1.0, True)  # total 0 → 1.0


def test_readout_pointwise_unparseable_is_half_and_invalid():
    for j in (None, "garbage", {}, {"score": "high"}, {"checklist": "x"}, {"score": float("nan")}):
        assert S.readout_pointwise(j) == (0.5, False)


def test_readout_pairwise_both_orders():
    # order 1 shows the chosen as A, order 2 as B
    assert S.readout_pairwise("A", "B")["win"] == 1.0
    assert S.readout_pairwise("A", "A")["win"] == 0.0      # pure position bias: +1 − 1 = 0, no win
    assert S.readout_pairwise("B", "A")["win"] == 0.0
    assert S.readout_pairwise("A", None) == {"win": 1.0, "sum": 1, "valid": 0.0, "consistent": 0.0}
    assert S.readout_pairwise("Tie", "Tie")["win"] == 0.0  # ties are non-wins


def test_readout_selection_best_of_4():
    assert S.readout_selection("C", "C", 4) == 1.0
    assert S.readout_selection("A", "C", 4) == 0.0
    assert S.readout_selection(None, "C", 4) == 0.25
    assert S.readout_selection("Z", "C", 4) == 0.25


def test_anchored_pairwise_reward():
    assert S.anchored_pairwise_reward("A", "A") == 1.0
    assert S.anchored_pairwise_reward("B", "A") == 0.0
    assert S.anchored_pairwise_reward(None, "A") == 0.5
    assert S.anchored_pairwise_reward("Tie", "B") == 0.5


def test_judgment_label_normalises():
    assert S.judgment_label({"verdict": "[[B]]"}, "AB") == "B"
    assert S.judgment_label({"verdict": "Assistant A"}, "AB") == "A"
    assert S.judgment_label({"choice": "(c)"}, "ABCD") == "C"
    assert S.judgment_label({"verdict": "tie"}, "AB") == "Tie"
    assert S.judgment_label({"verdict": "E"}, "ABCD") is None
    assert S.judgment_label(None, "AB") is None


# ----- skills: loading, validation, gating -----

def test_skills_load():
    skills = S.load_skills(SKILLS)
    assert {"reward_judge_fair", "instruction_following_pointwise"} <= set(skills)
    s = skills["instruction_following_pointwise"]
    assert "constraints" in s.body and s.resource("text_checks")["type"] == "verifier"
    assert "constraint_labels" not in s.index_text()  # oracle entries are not even listed


def _copy_skill(tmp_path, name="reward_judge_fair"):
    dst = tmp_path / name
    shutil.copytree(SKILLS / name, dst)
    return dst


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "SKILL.md").unlink(), "SKILL.md is missing"),
    (lambda d: (d / "SKILL.md").write_text("# no front matter\n"), "no YAML front matter"),
    (lambda d: (d / "SKILL.md").write_text("---\nname: other\ndescription: x\n---\nbody\n"), "differs from the folder name"),
    (lambda d: (d / "SKILL.md").write_text("---\nname: reward_judge_fair\n---\nbody\n"), "'description' is missing"),
    (lambda d: (d / "resources.yaml").unlink(), "resources.yaml"),
    (lambda d: (d / "resources.yaml").write_text("- id: a\n  type: magic\n  path: SKILL.md\n  applies_to: [all]\n  cost: low\n"
                                                  "  hard_or_soft: soft\n  leakage_level: none\n  allowed_setting: all\n"), "type 'magic'"),
    (lambda d: (d / "resources.yaml").write_text("- id: a\n  type: rubric\n  path: nope.md\n  applies_to: [all]\n  cost: low\n"
                                                  "  hard_or_soft: soft\n  leakage_level: none\n  allowed_setting: all\n"), "does not exist"),
    (lambda d: (d / "resources.yaml").write_text("- id: a\n  type: rubric\n  path: ../../x.md\n  applies_to: [all]\n  cost: low\n"
                                                  "  hard_or_soft: soft\n  leakage_level: none\n  allowed_setting: all\n"), "leaves the skill folder"),
    (lambda d: (d / "resources.yaml").write_text("- id: a\n  type: rubric\n"), "missing key"),
    (lambda d: (d / "resources.yaml").write_text("[unclosed"), "not valid YAML"),
    (lambda d: (d / "verifiers" / "last_number.py").write_text("import os\nos.system('ls')\n"), "would be refused"),
    (lambda d: (d / "resources.yaml").write_text("- id: a\n  type: rubric\n  path: SKILL.md\n  applies_to: [all]\n  cost: low\n"
                                                  "  hard_or_soft: soft\n  leakage_level: none\n  allowed_setting: all\n"
                                                  "  arguments: [code]\n"), "only a tool or verifier"),
])
def test_broken_skill_folder_gives_clear_error(tmp_path, breakage, message):
    d = _copy_skill(tmp_path)
    breakage(d)
    with pytest.raises(S.SkillError, match=message):
        S.load_skill(d)


def test_progressive_disclosure_and_leakage_gate():
    skills = S.load_skills(SKILLS)
    args = judge_args(max_resources=2)
    t = S.JudgeTask("Say hi.", ["hi", "hello"], "pairwise", "skill_rm")
    call = lambda tool, **a: S.execute_tool(t, {"name": tool, "arguments": a}, skills, args)
    assert "not available" in call("view_resource", id="principles")      # before use_skill
    assert "not available" in call("python_sandbox", code="print(1)")
    assert "Skill reward_judge_fair loaded" in call("use_skill", name="reward_judge_fair")
    assert "already loaded" in call("use_skill", name="instruction_following_pointwise")
    assert call("view_resource", id="reference_answers").startswith("refused")  # oracle-only
    assert "Judging principles" in call("view_resource", id="principles")
    assert "Bias controls" in call("view_resource", id="bias_controls")
    assert call("view_resource", id="aggregation").startswith("refused: at most 2")
    assert "2" in call("python_sandbox", code="print(len(candidates))")
    assert "final number" in call("run_verifier", id="last_number")


# ----- the tool-call text format -----

@pytest.mark.parametrize("text, name, args", [
    ('<tool_call>{"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}</tool_call>', "use_skill", {"name": "reward_judge_fair"}),
    ('Let me check.\n<tool_call>{"name": "final_answer", "arguments": {"verdict": "B"}}', "final_answer", {"verdict": "B"}),
    ("<tool_call>{'name': 'view_resource', 'arguments': {'id': 'principles'}}</tool_call>", "view_resource", {"id": "principles"}),
    ('<tool_call>{"name": "final_answer", "arguments": {"verdict": "A",},}</tool_call>', "final_answer", {"verdict": "A"}),
    ('{"name": "final_answer", "arguments": {"choice": "C"}}', "final_answer", {"choice": "C"}),
    ('<tool_call>{"name": "use_skill", "arguments": "reward_judge_fair"}</tool_call>', "use_skill", {"name": "reward_judge_fair"}),
    ('<tool_call>{"name": "final_answer", "arguments": {"verdict": "A"', "final_answer", {"verdict": "A"}),
    ('I will call final_answer(verdict="B")\n', "final_answer", {"verdict": "B"}),
    ('view_resource("bias_controls")\n', "view_resource", {"id": "bias_controls"}),
])
def test_tool_call_parser_accepts_variants(text, name, args):
    assert S.parse_tool_call(text) == {"name": name, "arguments": args}


@pytest.mark.parametrize("text", ["", "Assistant A is better.", "<tool_call>not json</tool_call>",
                                  '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "{{{{", None,
                                  '<tool_call>{"arguments": {"verdict": "A"}}</tool_call>', "final_answer(((", "}" * 5 + "{" * 5])
def test_tool_call_parser_malformed_is_none(text):
    assert S.parse_tool_call(text) is None


def test_tool_call_parser_code_block_only_when_allowed():
    text = "```python\nprint(len(candidates))\n```"
    assert S.parse_tool_call(text) is None
    assert S.parse_tool_call(text, allow_code_block=True) == {"name": "python_sandbox", "arguments": {"code": "print(len(candidates))\n"}}


def test_text_verdict_fallbacks():
    assert S.parse_text_verdict("blah [[A]] then [[B]]", "AB") == "B"
    assert S.parse_text_verdict("My final verdict is: Assistant A.", "AB") == "A"
    assert S.parse_text_verdict("I cannot decide", "AB") is None
    assert S.parse_text_rating("Rating: [[7]]", 10.0) == 0.7
    assert S.parse_text_rating("no number") is None


# ----- python_sandbox: containment of hostile code -----

HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "huge_allocation": "x = bytearray(10 ** 11)\nprint(len(x))\n",
    "read_outside": "print(open('/etc/passwd').read())\n",
    "socket": "import socket\ns = socket.socket()\ns.connect(('10.255.255.1', 80))\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_sandbox_refuses_hostile_snippet_statically(name):
    res = S.run_sandboxed(HOSTILE[name], timeout_s=2.0, mem_mb=256)
    if name == "infinite_loop":  # passes the static check: must be contained at run time
        assert res["error"].startswith("timeout")
    elif name == "huge_allocation":  # also passes it: the address-space limit stops it
        assert res["error"].startswith("memory limit")
    else:
        assert res["error"].startswith("refused:")
    assert not res["ok"]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_sandbox_contains_hostile_snippet_without_static_check(name):
    res = S.run_sandboxed(HOSTILE[name], timeout_s=2.0, mem_mb=256, static_check=False)
    assert not res["ok"] and res["error"]
    # it ends within the sandbox's limits, by the verdict the sandbox gives (not a clock read here: start-up alone
    # may take sandbox.STARTUP_S on a loaded machine); only the loop meets the wall clock
    expected = {"infinite_loop": "timeout after 2.0 s", "fork_bomb": "import of 'os' is not allowed", "huge_allocation": "memory",
                "read_outside": "outside the working folder", "socket": "not allowed"}[name]
    assert expected in res["error"]
    assert "root:" not in res["stdout"]


def test_sandbox_more_escapes_are_contained():
    for code in ("import posix\nposix.system('touch /tmp/pwned_by_sandbox')",
                 "f = open('../../../etc/hostname')", "import subprocess\nsubprocess.run(['ls'])",
                 "while True:\n    print('x' * 10000)"):
        res = S.run_sandboxed(code, timeout_s=2.0, mem_mb=256, static_check=False)
        assert not res["ok"], code
    assert not Path("/tmp/pwned_by_sandbox").exists()


def test_sandbox_runs_benign_code_with_variables():
    res = S.run_sandboxed("import re, math\nprint(len(candidates), prompt.upper(), math.isqrt(17))",
                          variables={"prompt": "hi", "candidates": ["a", "b", "c"]})
    assert res["ok"] and res["stdout"].strip() == "3 HI 4"
    res = S.run_sandboxed("x = 1/0")
    assert "ZeroDivisionError" in res["error"]


def test_sandbox_runs_humaneval_style_tests():
    prog = "def add(a, b):\n    return a + b\n\ndef check(f):\n    assert f(1, 2) == 3\n\ncheck(add)\n"
    assert S.run_sandboxed(prog, static_check=False, allowed_imports=CODE_IMPORTS)["ok"]
    assert not S.run_sandboxed(prog.replace("a + b", "a - b"), static_check=False)["ok"]


# ----- App. D: the held-out evaluation -----


def test_eval_if_policy_scores_with_ifevals_checkers():
    test_set = [{"prompt": "p", "constraints": [{"type": "include_keyword", "word": "river"}]},
                {"prompt": "q", "constraints": [{"type": "no_commas"}, {"type": "title"}]}]
    out = S.eval_if_policy(ScriptedSampler(["rivers run", "<<T>> a, b"]), CharTok(), test_set, SimpleNamespace(max_new_tokens=8))
    assert out["prompt_strict"] == 0.5 and out["inst_level"] == 2 / 3 and out["per_prompt"] == [1.0, 0.5]


# ----- the judge loop (scripted replies; the loop itself is what is tested) -----

class ScriptedSampler:
    """Returns the next scripted reply for each prompt, in order (the judge model's side)."""

    def __init__(self, replies):
        self.replies, self.k = replies, 0

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        out = []
        for _ in prompts:
            text = self.replies[min(self.k, len(self.replies) - 1)]
            self.k += 1
            out.append([SimpleNamespace(ids=[1], text=text)])
        return out


class CharTok:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **template_kwargs):  # e.g. enable_thinking, as HF tokenizers take
        return [ord(c) % 256 for m in messages for c in m["content"][:50]]


def test_judge_loop_progressive_disclosure_then_final():
    skills = S.load_skills(SKILLS)
    replies = ['<tool_call>{"name": "view_resource", "arguments": {"id": "principles"}}</tool_call>',
               '<tool_call>{"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}</tool_call>',
               '<tool_call>{"name": "python_sandbox", "arguments": {"code": "print(candidates[1])"}}</tool_call>',
               '<tool_call>{"name": "final_answer", "arguments": {"verdict": "B", "evidence": ["b is right"]}}</tool_call>']
    t = S.JudgeTask("What is 2+2?", ["5", "4"], "pairwise", "skill_rm")
    S.run_judges(ScriptedSampler(replies), CharTok(), [t], skills, judge_args(), max_turns=5)
    assert t.done and t.judgment["verdict"] == "B" and t.turns == 4
    assert "not available" in t.trace[0]["observation"]
    assert t.skill.name == "reward_judge_fair"
    assert t.trace[2]["observation"].startswith("stdout:\n4")
    assert "final judgment" in S.format_trace(t)
    assert "python_sandbox" not in t.messages[0]["content"]  # the first prompt names only use_skill and final_answer


class TurnTok:
    """Prompt ids [number of messages, crc of the system and candidates messages]: a task and its turn."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **template_kwargs):
        return [len(messages), zlib.crc32((messages[0]["content"] + messages[1]["content"]).encode())]


class StatelessJudge:
    """Replies from the prompt alone (use_skill, then a sandbox run, then a verdict that depends on the
    task), and records the prompts of every generate call."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        self.calls.append({task for _, task in prompts})
        steps = ['{"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}',
                 '{"name": "python_sandbox", "arguments": {"code": "print(len(candidates))"}}']
        final = lambda task: '{"name": "final_answer", "arguments": {"verdict": "%s"}}' % "AB"[task % 2]
        return [[SimpleNamespace(ids=[1], text=steps[(m - 2) // 2] if m < 6 else final(task))]
                for m, task in prompts]


def test_judge_chunks_give_the_same_judgments_and_finish_a_chunk_before_the_next():
    """--judge-chunk: each chunk of one method's tasks goes through all its turns before the next chunk
    starts (so its conversations stay in vLLM's prefix cache), and the judgments equal all-at-once ones."""
    skills = S.load_skills(SKILLS)
    items = [(f"What is {k}+{k}?", [str(2 * k), str(2 * k + 1)]) for k in range(5)]
    runs = {}
    for chunk in (0, 3):
        tasks = [S.JudgeTask(p, c, "pairwise", m) for m in ("skill_rm", "python_only") for p, c in items]
        judge = StatelessJudge()
        S.run_judges(judge, TurnTok(), tasks, skills, judge_args(judge_chunk=chunk), max_turns=3)
        runs[chunk] = [(t.judgment, [st["observation"] for st in t.trace]) for t in tasks], judge.calls
    assert runs[3][0] == runs[0][0]
    assert {j["verdict"] for j, _ in runs[0][0]} == {"A", "B"}  # the replies follow the task
    assert max(map(len, runs[0][1])) == 10 and max(map(len, runs[3][1])) == 3
    chunk, finished = set(), set()  # a finished chunk's task asked again: its prefix would be gone
    for asked in runs[3][1]:
        if not asked <= chunk:  # the next chunk begins (within one, the open tasks only shrink)
            finished, chunk = finished | chunk, set()
        assert not asked & finished
        chunk |= asked
    assert len(finished | chunk) == 10


def test_judge_loop_retry_then_forced_final():
    skills = S.load_skills(SKILLS)
    t = S.JudgeTask("Say hi.", ["hi"], "pointwise", "skill_rm")
    S.run_judges(ScriptedSampler(["no idea", "still no idea", "my score: 0.8"]), CharTok(), [t], skills, judge_args(), max_turns=5)
    assert t.turns == 3 and t.done
    assert "no valid tool call" in t.trace[0]["observation"]  # one retry
    assert "call final_answer now" in t.messages[-2]["content"]  # then the forced final turn
    assert S.readout_pointwise(t.judgment) == (0.8, True)
    t = S.JudgeTask("Say hi.", ["hi"], "pointwise", "skill_rm")
    S.run_judges(ScriptedSampler(["garbage"]), CharTok(), [t], skills, judge_args(), max_turns=5)
    assert t.judgment is None and S.readout_pointwise(t.judgment) == (0.5, False)


def test_judge_loop_turn_budget_and_plain_judge():
    skills = S.load_skills(SKILLS)
    loop = '<tool_call>{"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}</tool_call>'
    t = S.JudgeTask("q", ["a", "b"], "pairwise", "skill_rm")
    S.run_judges(ScriptedSampler([loop]), CharTok(), [t], skills, judge_args(), max_turns=3)
    assert t.turns == 4 and t.judgment is None  # 3 turns + 1 forced, never a final answer
    t = S.JudgeTask("q", ["a", "b"], "pairwise", "baseline")
    S.run_judges(ScriptedSampler(["A is fine but [[B]]"]), CharTok(), [t], skills, judge_args(), max_turns=3)
    assert t.turns == 1 and S.judgment_label(t.judgment, "AB") == "B"


# ----- smoke test of the tiny preset, shrunk further (614 s alone on the 2-core AVX2 CPU, 12-06: both sets) -----

@pytest.mark.heavy(620)
@pytest.mark.xdist_group(MEMORY_GROUP)
def test_smoke_tiny_preset(tmp_path, capsys):
    argv = ["--preset", "tiny", "--sampler", "hf", "--bench-per-cat", "1", "--methods", "baseline,skill_rm,oracle",
            "--formats", "pairwise", "--bon-prompts", "2", "--bon-N", "2", "--steps", "1", "--prompts-per-step", "1",
            "--G", "2", "--eval-n", "2", "--rl-rewards", "skill_rm", "--max-turns", "2", "--rl-max-turns", "2",
            "--max-new-tokens", "16", "--beta", "0", "--show-trace", "1", "--judge-sft-steps", "1",
            "--judge-sft-batch", "2", "--judge-sft-items", "1", "--run-dir", str(tmp_path)]
    res = S.main(argv)
    out = capsys.readouterr().out
    assert "pairwise accuracy" in out and "seqko@2" in out and "prompt_strict" in out and "final judgment" in out
    # #49: the held-out test set (the headline) and the dev set beside it, each with the no-model baselines
    assert list(res["benchmark"]) == ["heldout", "dev"]
    assert {"baseline|pairwise|math", "skill_rm|pairwise|code", "checker|pairwise|math"} <= set(res["benchmark"]["dev"])
    assert {"skill_rm|pairwise|word_math", "shorter|pairwise|code", "coin|pairwise|focus"} <= set(res["benchmark"]["heldout"])
    bench = {f"{name}|{k}": v for name, rows in res["benchmark"].items() for k, v in rows.items()}
    # no signal, no pass: the judges must give valid verdicts, and the oracle must read out as 100 %
    for method in ("baseline", "skill_rm"):
        rows = [v for k, v in bench.items() if k.split("|")[1] == method]
        assert sum(r["valid"] for r in rows) / len(rows) >= 0.9, (method, rows)
        assert res["bon"][method]["invalid"] <= 0.1
    assert all(v["score"] == 1.0 for k, v in bench.items() if k.split("|")[1] == "oracle" and not k.endswith("code"))
    assert "[held-out] pairwise per category" in out and "checker-only" in out and "shorter-wins" in out
    # best-of-N recounted: seqko@2 is the mean over pools of the knockout winner's true score, which lies between
    # the pool's two candidates' (the lower one is 2·random@2 − oracle@2)
    bon = res["bon"]["skill_rm"]
    won, rand, best = (bon["per_pool"][k] for k in ("seqko@2", "random@2", "oracle@2"))
    assert bon["seqko@2"] == pytest.approx(sum(won) / len(won))
    assert all(2 * r - b - 1e-9 <= w <= b + 1e-9 for w, r, b in zip(won, rand, best)), (won, rand, best)
    assert set(res["rl"]) == {"initial", "skill_rm"} and res["rl"]["skill_rm"]["judge_valid"] >= 0.9
    # App. D recounted from the per-prompt satisfied fractions: instruction level = satisfied constraints over all
    # constraints of the held-out prompts, prompt level = the prompts with every constraint satisfied
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, argv=argv)
    n = [len(p["constraints"]) for p in S.if_prompts(args.seed, args.eval_n, "test")]
    rl = json.loads((tmp_path / "results.json").read_text())["rl"]["skill_rm"]
    assert rl["inst_level"] == pytest.approx(sum(f * k for f, k in zip(rl["per_prompt"], n, strict=True)) / sum(n))
    assert rl["prompt_strict"] == pytest.approx(sum(f == 1 for f in rl["per_prompt"]) / len(n))
    assert (tmp_path / "rl_skill_rm" / "metrics.jsonl").exists()
    judged = [json.loads(line) for line in (tmp_path / "bench_judgments.jsonl").read_text().splitlines()]
    assert judged and all(j["trace"] and j["trace"][0]["action"] for j in judged)  # every judgment, with its trace
    # issue #26: every number beside its chance line; tool use is counted; a tool-less skill judge is a failure
    claims = [e["claim"] for e in json.loads((tmp_path / "results.json").read_text())["headline"]]
    assert "held-out: pairwise accuracy of skill_rm vs coin" in claims and "dev: pairwise accuracy of skill_rm vs coin" in claims
    assert claims.index("held-out: pairwise accuracy of skill_rm vs coin") < claims.index("dev: pairwise accuracy of skill_rm vs coin")
    for what in ("plain judge", "checker-only (fidelity)", "shorter-wins"):
        assert any(c.startswith(f"held-out: pairwise accuracy: Skill-RM vs {what}") for c in claims), what
    assert sum(v["calls"] for k, v in bench.items() if k.split("|")[1] == "skill_rm") > 0, "no judge ever called a tool"
    assert all("never called a tool" not in w for w in res["judge_warnings"])
    row = res["benchmark"]["dev"]["skill_rm|pairwise|math"]
    assert {"order_A", "order_B", "consistent", "ci95"} <= set(row)
    assert {j["set"] for j in judged} == {"heldout", "dev"}


@pytest.mark.heavy(600)
@pytest.mark.xdist_group(MEMORY_GROUP)
def test_smoke_tiny_preset_one_process(tmp_path):
    """#48's teaching run end to end on the embedded model, unshrunk, on the preset's own sampler: the three committed
    judges merged (no SFT step in the run), the benchmark on both sets, best-of-N, RL with each reward, and a headline
    whose every comparison carries its mde."""
    import os
    from conftest import run_group
    out = run_group([sys.executable, "skill_rm.py", "--preset", "tiny", "--run-dir", str(tmp_path)], cwd=ROOT,
                    capture_output=True, text=True, timeout=1800, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("merged the prepared LoRA adapter") == 3, out.stdout[-3000:]
    assert not list(tmp_path.glob("judge_sft_*")) and not list(tmp_path.glob("stages/judge_sft_*"))
    res = json.loads((tmp_path / "results.json").read_text())
    assert list(res["benchmark"]) == ["heldout", "dev"] and set(res["bon"]) == {"baseline", "skill_rm", "oracle"}
    assert set(res["rl"]) == {"initial", "skill_rm", "direct", "anchored"}
    claims = res["headline"]
    assert any(e["claim"].startswith("held-out: pairwise accuracy: Skill-RM vs plain judge with") for e in claims)
    assert claims and all("mde" in e for e in claims)
    # no signal, no pass: every judge's verdicts valid (1.0 on seed 0, 12-07, both CPU classes), the scripted oracle
    # at 100 % in every category and format, the RL judges valid too
    bench = {f"{name}|{k}": v for name, rows in res["benchmark"].items() for k, v in rows.items()}
    for method in ("baseline", "python_only", "skill_rm"):
        rows = [v for k, v in bench.items() if k.split("|")[1] == method]
        assert rows and sum(r["valid"] for r in rows) / len(rows) >= 0.9, (method, rows)
    assert all(v["score"] == 1.0 for k, v in bench.items() if k.split("|")[1] == "oracle"), bench
    assert all(res["bon"][m]["invalid"] <= 0.1 for m in ("baseline", "skill_rm"))
    assert all(res["rl"][r]["judge_valid"] >= 0.9 for r in ("skill_rm", "anchored")), res["rl"]


# ----- #49: the held-out set, the no-model baselines and the check that catches a judge copying a dev rule -----

DEV, HELDOUT = ROOT / "data/skill_rm/bench.jsonl", ROOT / "data/skill_rm/heldout.jsonl"


def _judged(items, verdict, formats=("pairwise",)):
    """score_benchmark of a judge given as a function (task -> final answer), no model and no loop."""
    tasks, meta = S.benchmark_tasks(items, ["skill_rm"], list(formats), 0)
    for t in tasks:
        t.judgment, t.tool_calls = verdict(t), 3
    return S.score_benchmark(tasks, meta)


def _copies_the_checker(t):
    """A judge that runs the skills' scripts and copies what they name (what the dev labels reward): A or B when
    one is named, Tie otherwise."""
    named, _ = rb.checker_pick(t.prompt, t.candidates)
    return {"verdict": next(iter(named)) if named and len(named) == 1 else "Tie"}


def test_template_copy_check_flags_a_judge_that_copies_the_checker():
    """#49 §4, no model: a judge that copies the scripts' verdict scores checker-only's 83.7 % on dev, yet sits at
    chance on held-out categories no script decides; template_copy_warnings (in every run's judge warnings) names
    it per category. A judge that knows the label, or one below checker-only on dev, is not flagged."""
    sets = {"dev": rb.read_jsonl(DEV), "heldout": rb.read_jsonl(HELDOUT)}
    def by_set(verdict):
        return {name: _judged(items, verdict) | rb.baseline_scores(items, ["pairwise"], 0) for name, items in sets.items()}
    copier = by_set(_copies_the_checker)
    assert rb.pooled(copier["dev"], "skill_rm", "pairwise") == pytest.approx(36 / 43) == rb.pooled(copier["dev"], "checker", "pairwise")
    w = S.template_copy_warnings(copier, ["baseline", "skill_rm"])
    flagged = {x.split("held-out ")[1].split(" (")[0] for x in w}
    assert {"code", "word_math", "precise_if"} <= flagged and all(x.startswith("skill_rm: copies a dev-set rule?") for x in w)
    assert not S.template_copy_warnings(by_set(lambda t: {"verdict": t.label}), ["skill_rm"])  # knows the label
    assert not S.template_copy_warnings(by_set(lambda t: {"verdict": "A"}), ["skill_rm"])  # below checker-only on dev
    assert not S.template_copy_warnings({"dev": copier["dev"]}, ["skill_rm"])  # no held-out set: nothing to compare


def test_baseline_scores_are_the_judges_readout():
    """tasks.reward_bench.baseline_scores scores a deterministic baseline exactly as score_benchmark scores a judge
    that gives the same answers (both orders, best-of-4 with the same permutation)."""
    items = rb.select_items(rb.read_jsonl(DEV), 3, 0) + rb.select_items(rb.read_jsonl(HELDOUT), 3, 0)
    fmts = ["pairwise", "best_of_4"]
    for name in ("first", "checker", "shorter"):
        spread = set()  # best-of-4 items where the baseline names several: it takes the expectation, a judge one pick

        def verdict(t):
            pick, _ = rb.baseline_pick(name, t.prompt, t.candidates)
            if len(pick) > 1:
                spread.add(t.prompt)
            lab = next(iter(pick)) if len(pick) == 1 else ("Tie" if t.mode == "pairwise" else None)
            return {("verdict" if t.mode == "pairwise" else "choice"): lab}
        judged, base = _judged(items, verdict, fmts), rb.baseline_scores(items, fmts, 0, [name])
        ids = {it["id"] for it in items if it["prompt"] not in spread}
        for (m, fmt, cat), r in judged.items():
            b = base[(name, fmt, cat)]
            assert {k: v for k, v in r["items"].items() if k in ids} == pytest.approx(
                {k: v for k, v in b["items"].items() if k in ids}), (name, fmt, cat)
            if fmt == "pairwise":
                assert [r[k] for k in ("order_A", "order_B", "consistent")] == pytest.approx([b[k] for k in ("order_A", "order_B", "consistent")])


def test_benchmark_stage_reports_both_sets_with_baselines_without_a_model(tmp_path):
    """skill_rm.benchmark with a scripted plain judge (always "A") and the scripted oracle: the held-out set and
    the dev set each get the judges and the five baselines per category (accuracy with CI, per order,
    consistency), every judgment is written with its set, the position lock is flagged, and the headline
    resamples prompt templates (clusters), held-out first."""
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=[
        "--preset", "tiny", "--bench-per-cat", "2", "--formats", "pairwise", "--run-dir", str(tmp_path)])
    judge = S.Judge({"baseline": ScriptedSampler(['{"verdict": "A"}']), "default": None}, CharTok(),
                    S.load_skills(SKILLS))
    by_set, clusters, warnings = S.benchmark(judge, args, S.Dist(), ["baseline", "oracle"], ["pairwise"])
    assert list(by_set) == ["heldout", "dev"] and len(clusters["heldout"]) == 10 and len(clusters["dev"]) == 8
    for name, cats in (("heldout", P_CATS), ("dev", ["code", "focus", "math", "precise_if"])):
        for m in ("baseline", "oracle", *rb.BASELINES):
            for c in cats:
                r = by_set[name][(m, "pairwise", c)]
                assert {"score", "order_A", "order_B", "consistent", "ci95", "items"} <= set(r), (name, m, c)
                assert r["ci95"][0] <= r["score"] <= r["ci95"][1]
    assert all(r["score"] == 1.0 for (m, _, c), r in by_set["heldout"].items() if m == "oracle")
    assert "[held-out] baseline: position-locked (pairwise consistency 0 over 10 items)" in warnings
    rows = [json.loads(line) for line in (tmp_path / "bench_judgments.jsonl").read_text().splitlines()]
    assert {r["set"] for r in rows} == {"heldout", "dev"} and len(rows) == 2 * 2 * (10 + 8)
    H = S.build_headline(by_set, None, None, ["baseline", "skill_rm", "oracle"], clusters)
    claims = [e["claim"] for e in H]
    assert claims[0].startswith("held-out: ") and any(c.startswith("dev: ") for c in claims)
    e = next(e for e in H if e["claim"] == "held-out: pairwise accuracy of checker-only vs coin")
    assert e["n_items"] == 10 and e["n_units"] == len(set(clusters["heldout"].values())) and e["b"] == "chance"
    e = next(e for e in H if e["claim"] == "dev: pairwise accuracy of shorter-wins vs coin")
    assert e["unit"] == "cluster (prompt template)" and e["n_units"] == 3  # dev: math and focus share one template
    assert e["item_ids"].count("dev/chain_sum") == 4


P_CATS = ["code", "focus", "math", "precise_if", "word_math"]


# ----- #49 §5: per-stage resume -----

def test_stages_read_back_finished_stages_and_refuse_other_settings(tmp_path):
    """No model: a finished stage is read back under --resume (and only then), a fresh run empties the stage
    folder, and a resume with another setting stops with one line naming it."""
    argv = ["--preset", "tiny", "--run-dir", str(tmp_path)]
    parse = lambda *extra: S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=argv + list(extra))
    st = S.Stages(parse(), S.Dist())
    assert st.save("bon", {"skill_rm": {"seqko@4": 0.5}}) == {"skill_rm": {"seqko@4": 0.5}}
    assert st.load("bon") is None  # not resuming: every stage runs
    assert S.Stages(parse("--resume"), S.Dist()).load("bon") == {"skill_rm": {"seqko@4": 0.5}}
    assert S.Stages(parse("--resume"), S.Dist()).load("rl_skill_rm") is None  # never finished: runs
    with pytest.raises(SystemExit, match=r"^nanoskill: --resume with other settings .* --seed 0 → 3 \(saved → now\)"):
        S.main(argv + ["--resume", "--seed", "3", "--model", str(tmp_path / "no-model")])  # before any model loads
    S.Stages(parse(), S.Dist())  # a fresh run
    assert not (tmp_path / "stages" / "bon.json").exists()


@pytest.mark.heavy(50)
def test_kill_after_a_stage_then_resume_skips_it(tiny_model_dir, tmp_path, monkeypatch):
    """#49 §5 with kill -9: the run dies right after its benchmark stage is written (NANOSKILL_KILL_AT); the
    --resume run reads the judge SFT weights and the benchmark back (judge_sft and benchmark are never called)
    and runs only what was left, best-of-N, to the same benchmark and headline entries."""
    from conftest import ONE_THREAD, run_group
    argv = ["--preset", "tiny", "--model", tiny_model_dir, "--sampler", "hf", "--bench-per-cat", "1",
            "--methods", "baseline,skill_rm", "--formats", "pairwise", "--no-rl", "--bon-prompts", "2", "--bon-N", "2",
            "--max-turns", "2", "--judge-sft-steps", "1", "--judge-sft-batch", "2", "--judge-sft-items", "1",
            "--judge-max-new-tokens", "64", "--run-dir", str(tmp_path)]
    import os
    env = {**os.environ, **ONE_THREAD, "NANOSKILL_KILL_AT": "stage:benchmark"}
    out = run_group([sys.executable, str(ROOT / "skill_rm.py"), *argv], cwd=ROOT, capture_output=True, text=True,
                    timeout=600, env=env)
    assert out.returncode == -9, out.stdout[-2000:] + out.stderr[-2000:]
    done = {p.name for p in (tmp_path / "stages").iterdir()}
    assert done == {"judge_sft_baseline.json", "judge_sft_baseline.pt", "judge_sft_skill_rm.json", "judge_sft_skill_rm.pt",
                    "benchmark.json"}, done
    assert not (tmp_path / "results.json").exists()
    never = lambda *a, **k: pytest.fail("a finished stage ran again")
    monkeypatch.setattr(S, "judge_sft", never), monkeypatch.setattr(S, "benchmark", never)
    res = S.main(argv + ["--resume"])
    saved = json.loads((tmp_path / "stages" / "benchmark.json").read_text())["result"]
    assert res["benchmark"] == saved["benchmark"] and res["judge_warnings"] == saved["judge_warnings"]
    assert set(res["bon"]) == {"baseline", "skill_rm"} and (tmp_path / "stages" / "bon.json").exists()
    claims = [e["claim"] for e in json.loads((tmp_path / "results.json").read_text())["headline"]]
    assert "held-out: pairwise accuracy of skill_rm vs coin" in claims


def test_python_only_judge_gets_its_own_sft_stage_and_resumes(tmp_path, monkeypatch):
    """#49 §2, no model: main gives the plain judge with the python tool its own SFT stage (judge_sft_python_only,
    weights and all) and its own sampler; appended judges on the plain weights; --resume reads all three back
    without training; without python_only in --methods its SFT is not run; without SFT one judge serves all."""
    import torch
    trained, judges = [], []
    def sft(backbone, tok, skills, args, dist, method):
        trained.append(method)
        model = torch.nn.Linear(1, 1)
        torch.nn.init.constant_(model.weight, ["baseline", "skill_rm", "python_only"].index(method) + 1.0)
        return model
    monkeypatch.setattr(S, "load_policy", lambda args, dist: (torch.nn.Linear(1, 1), None))
    monkeypatch.setattr(S, "make_sampler", lambda *a, **k: None)
    monkeypatch.setattr(S, "make_judge", lambda policy, args, dist: torch.nn.Linear(1, 1))
    monkeypatch.setattr(S, "make_judge_sampler", lambda model, tok, args, dist: float(model.weight.detach().flatten()[0]))
    monkeypatch.setattr(S, "judge_sft", sft)
    Judge = S.Judge
    monkeypatch.setattr(S, "Judge", lambda samplers, tok, skills: judges.append(samplers) or Judge(samplers, tok, skills))
    argv = ["--preset", "tiny", "--no-benchmark", "--no-bon", "--no-rl", "--run-dir", str(tmp_path)]
    S.main(argv)
    assert trained == ["baseline", "skill_rm", "python_only"]
    assert {p.name for p in (tmp_path / "stages").iterdir()} >= {"judge_sft_python_only.json", "judge_sft_python_only.pt"}
    want = {"baseline": 1.0, "appended": 1.0, "default": 1.0, "skill_rm": 2.0, "python_only": 3.0}
    assert judges[-1] == want
    trained.clear()
    S.main(argv + ["--resume"])
    assert trained == [] and judges[-1] == want  # each judge's own weights, read back
    S.main(argv + ["--methods", "baseline,skill_rm"])
    assert trained == ["baseline", "skill_rm"] and "python_only" not in judges[-1]
    trained.clear()
    S.main(argv + ["--judge-sft-steps", "0"])
    assert trained == [] and set(judges[-1]) == {"baseline", "appended", "default"}  # python_only: "default"
    assert len(set(judges[-1].values())) == 1


def test_rl_stage_resume_trains_only_the_unfinished_variants(tmp_path, monkeypatch):
    """No model: if_rl with the initial evaluation and the skill_rm variant finished reads both back and trains
    direct alone (no anchors are generated: anchored is not left), then records it as a stage."""
    import torch
    argv = ["--preset", "tiny", "--run-dir", str(tmp_path), "--rl-rewards", "skill_rm,direct"]
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=argv)
    first = S.Stages(args, S.Dist())
    first.save("rl_initial", {"prompt_strict": 0.1, "inst_level": 0.2, "per_prompt": [0.2]})
    first.save("rl_skill_rm", {"prompt_strict": 0.3, "inst_level": 0.4, "per_prompt": [0.4], "reward_group_sd": 0.1,
                               "null_group_sd": 0.0, "judge_valid": 1.0, "group_sds": [0.1]})
    trained = []
    def train(variant, *a, **k):
        trained.append(variant)
        return tmp_path, {"reward_group_sd": 0.2, "null_group_sd": 0.0, "judge_valid": 1.0, "group_sds": [0.2]}
    monkeypatch.setattr(S, "train_if_policy", train)
    monkeypatch.setattr(S, "eval_if_policy", lambda *a, **k: {"prompt_strict": 0.5, "inst_level": 0.6, "per_prompt": [0.6]})
    monkeypatch.setattr(S, "plot_curves", lambda *a, **k: None)
    sampler = SimpleNamespace(sync=lambda p: None, generate=lambda *a, **k: pytest.fail("no anchors are needed"))
    resumed = S.Stages(S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=argv + ["--resume"]), S.Dist())
    rl = S.if_rl(torch.nn.Linear(2, 2), sampler, SimpleNamespace(tok=None), args, S.Dist(), resumed)
    assert trained == ["direct"] and rl["initial"]["inst_level"] == 0.2 and rl["skill_rm"]["inst_level"] == 0.4
    assert rl["direct"]["inst_level"] == 0.6 and (tmp_path / "stages" / "rl_direct.json").exists()


def test_judge_warnings_flag_position_lock_chance_and_no_tools():
    items = [{"id": f"x{k}", "category": "math", "prompt": "p", "chosen": "C", "rejected": ["R1", "R2", "R3"]} for k in range(12)]
    tasks, meta = S.benchmark_tasks(items, ["baseline", "skill_rm"], ["pairwise"], 0)
    for t in tasks:  # baseline always "A"; skill_rm right on every order but calls no tool
        t.judgment = {"verdict": "A" if t.method == "baseline" else t.label}
    w = S.judge_warnings(S.score_benchmark(tasks, meta), ["baseline", "skill_rm", "oracle"])
    assert any(x.startswith("baseline: position-locked") for x in w) and any(x.startswith("baseline: at chance") for x in w)
    assert w[-1] == "skill_rm: never called a tool" and not any(x.startswith("skill_rm: at chance") for x in w)
    for t in tasks:
        t.tool_calls = 1
    assert not [x for x in S.judge_warnings(S.score_benchmark(tasks, meta), ["skill_rm"])]


def test_headline_pools_items_across_seeds_with_chance_lines(tmp_path):
    """build_headline → results.json → --aggregate: Skill-RM vs plain judge paired over items × seeds, each vs
    its coin; a judge that always says "A" is position-locked (consistency 0) and wins no pair."""
    for seed in (0, 1):
        items = [{"id": f"x{seed}-{k}", "category": "math", "prompt": "p", "chosen": "C", "rejected": ["R1", "R2", "R3"]}
                 for k in range(6)]
        tasks, meta = S.benchmark_tasks(items, ["baseline", "skill_rm"], ["pairwise", "best_of_4"], seed)
        for t in tasks:
            right = t.method == "skill_rm"
            t.judgment = ({"verdict": t.label if right else "A"} if t.mode == "pairwise" else {"choice": t.label if right else "A"})
        res = S.score_benchmark(tasks, meta)
        assert res[("baseline", "pairwise", "math")]["consistent"] == 0.0 and res[("skill_rm", "pairwise", "math")]["consistent"] == 1.0
        assert res[("baseline", "pairwise", "math")]["order_A"] == 1.0 and res[("baseline", "pairwise", "math")]["order_B"] == 0.0
        rl = {"initial": {"per_prompt": [0.5, 0.5]},
              "anchored": {"group_sds": [0.5, 0.0, 0.433], "null_group_sd": S.null_group_sd("anchored", 4), "per_prompt": [1.0, 0.5]}}
        bon = {m: {"per_pool": {"seqko@4": [1.0, 0.0], "random@4": [0.5, 0.25], "oracle@4": [1.0, 1.0]}} for m in ("baseline", "skill_rm")}
        S.write_results(tmp_path / f"s{seed}", {"args": {"seed": seed}},
                        S.build_headline({"heldout": res}, bon, rl, ["baseline", "skill_rm", "oracle"]))
    out = {e["claim"]: e for e in S.aggregate_main([str(tmp_path / "s0"), str(tmp_path / "s1")])}
    vs = out["held-out: pairwise accuracy: Skill-RM vs plain judge [SFT: skill targets copy a verifier report, plain targets do not]"]
    assert vs["n_items"] == 12 and vs["n_seeds"] == 2 and vs["mean_a"] == 1.0 and vs["mean_b"] == 0.0 and vs["p"] < 0.01
    coin = out["held-out: pairwise accuracy of baseline vs coin"]
    assert coin["chance"] == pytest.approx(1 / 3) and coin["mean_a"] == 0.0 and coin["n_items"] == 12  # A/B/Tie coin
    assert out["held-out: pairwise consistency of baseline vs coin (position-locked: 0)"]["mean_a"] == 0.0
    assert out["held-out: best_of_4 accuracy of skill_rm vs coin"]["chance"] == 0.25
    assert "best-of-N seqko@4 vs random@4 (skill_rm)" in out and "best-of-N seqko@4 vs oracle@4 (baseline)" in out
    sd = out["IF-RL within-group reward sd (anchored) vs no-signal judge"]
    assert sd["chance"] == pytest.approx(0.404, abs=1e-3) and sd["n_items"] == 6
    assert not any(m in c for c in out for m in ("oracle vs",))  # the scripted oracle is no model judge


def test_null_group_sd_is_the_position_locked_expectation():
    """A judge that always says "A", with the rollout shown at a random side: E[within-group sd] (naive simulation)."""
    rng = random.Random(0)
    sims = []
    for _ in range(20000):
        g = [float(rng.random() < 0.5) for _ in range(4)]
        m = sum(g) / 4
        sims.append((sum((x - m) ** 2 for x in g) / 4) ** 0.5)
    assert S.null_group_sd("anchored", 4) == pytest.approx(sum(sims) / len(sims), abs=0.005)
    assert S.null_group_sd("anchored", 4) == pytest.approx(0.404, abs=1e-3) and S.null_group_sd("skill_rm", 4) == 0.0


# ----- bugs of issue #11, each with a test that failed before its fix -----

def test_paper_preset_has_a_nonempty_rl_test_set(tmp_path):
    with pytest.raises(SystemExit, match="--preset paper names no model"):  # its judge and policy differ
        S.parse_with_preset(S.build_parser(), S.PRESETS, argv=["--preset", "paper"])
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, argv=["--preset", "paper", "--model", "Q/Q3-8B"])
    assert args.eval_n > 0 and len(S.if_prompts(0, args.eval_n, "test")) == args.eval_n
    with pytest.raises(SystemExit, match="eval-n"):  # stops before loading any model
        S.main(["--preset", "paper", "--eval-n", "0", "--model", str(tmp_path / "none")])
    assert S.eval_if_policy(ScriptedSampler(["x"]), CharTok(), [], judge_args(max_new_tokens=4)) == \
        {"prompt_strict": 0.0, "inst_level": 0.0, "per_prompt": []}


def test_skill_contract_text_fallback_keeps_the_0_1_scale():
    skills = S.load_skills(SKILLS)
    t = S.JudgeTask("Say hi.", ["hi"], "pointwise", "skill_rm")  # forced turn answered in text, contract scale 0-1
    S.run_judges(ScriptedSampler(["x", "y", '"score": 0.8'], ), CharTok(), [t], skills, judge_args(), max_turns=5)
    assert S.readout_pointwise(t.judgment) == (0.8, True)       # was 0.08 (divided by 10)
    t = S.JudgeTask("Say hi.", ["hi"], "pointwise", "baseline")  # the plain judge's prompt asks for 0-1 too
    S.run_judges(ScriptedSampler(["Rating: [[0.8]]"]), CharTok(), [t], skills, judge_args(), max_turns=5)
    assert S.readout_pointwise(t.judgment) == (0.8, True)


def test_contract_examples_are_valid_json():
    for mode, K in (("pointwise", 1), ("pairwise", 2), ("selection", 4)):
        example = S.contract_text(mode, K).split("final_answer ")[1]
        example = example[:example.index("}") + 1].replace("S}", "0.75}")
        assert isinstance(json.loads(example), dict), example
    body = S.load_skills(SKILLS)["instruction_following_pointwise"].body
    assert "n/m" not in body and "n/m" not in S.contract_text("pointwise", 1)


def test_first_object_ignores_braces_inside_strings():
    text = '<tool_call>{"name": "python_sandbox", "arguments": {"code": "print(\'}\' * 2, {1: 2})"}}</tool_call>'
    assert S.parse_tool_call(text) == {"name": "python_sandbox", "arguments": {"code": "print('}' * 2, {1: 2})"}}
    assert plumbing.first_json_object('{"a": "{", "b": 1}') == {"a": "{", "b": 1}


def test_article_a_is_not_verdict_a():
    assert S.parse_text_verdict("The better answer is a short one.", "AB") is None
    assert S.parse_text_verdict("My choice is a tough one, but the verdict: B", "ABCD") == "B"
    assert S.parse_text_verdict("VERDICT: A", "AB") == "A"
    assert S.parse_text_verdict("the winner is assistant B", "AB") == "B"


def test_judge_copy_unwraps_the_ddp_wrapper():
    import torch

    class Wrapper(torch.nn.Module):  # what DistributedDataParallel looks like to make_judge
        def __init__(self, module):
            super().__init__()
            self.module = module
    inner = torch.nn.Linear(2, 2)
    for precision, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):  # the policy's compute dtype
        args = SimpleNamespace(judge_model=None, model="embedded", precision=precision)
        judge = S.make_judge(Wrapper(inner), args, None)
        assert isinstance(judge, torch.nn.Linear) and judge.weight.dtype == dtype
        assert judge.weight.data_ptr() != inner.weight.data_ptr() and not judge.weight.requires_grad


def test_unknown_rl_variant_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown --rl-rewards bogus"):  # before any model loads
        S.main(["--preset", "tiny", "--rl-rewards", "skill_rm,bogus", "--model", str(tmp_path / "none")])
    with pytest.raises(ValueError, match="unknown RL reward variant"):
        S.judge_rewards(S.Judge(None, None, {}), ["p"], ["r"], "bogus", judge_args())


def test_tiny_judge_budget_fits_every_contract_reply():
    from transformers import AutoTokenizer
    import plumbing
    tok = AutoTokenizer.from_pretrained(plumbing.embedded_model_path())
    budget = S.PRESETS["tiny"]["judge_max_new_tokens"]
    for mode, K in (("pointwise", 1), ("pairwise", 2), ("selection", 4)):
        example = S.contract_text(mode, K).split("final_answer ")[1]
        call = '<tool_call>{"name": "final_answer", "arguments": ' + example + "}</tool_call>"
        assert len(tok.encode(call)) <= budget, (mode, len(tok.encode(call)))
    assert budget >= 128


def test_if_skill_verifier_goes_through_run_verifier_and_oracle_only_is_refused(tmp_path):
    skills = S.load_skills(SKILLS)
    body = skills["instruction_following_pointwise"].body
    assert "run_verifier" in body and "`text_checks` through python_sandbox" not in body
    t = S.JudgeTask("Answer in lowercase.", ["all lowercase here"], "pointwise", "skill_rm")
    call = lambda tool, **a: S.execute_tool(t, {"name": tool, "arguments": a}, skills, judge_args())
    call("use_skill", name="instruction_following_pointwise")
    assert "True 3" in call("run_verifier", id="text_checks", code="print(is_lower(response), word_count(response))")
    assert "NameError" in call("python_sandbox", code="print(is_lower(response))")  # not defined there
    d = tmp_path / "instruction_following_pointwise"  # a verifier marked oracle_only (leakage low)
    shutil.copytree(SKILLS / d.name, d)
    y = (d / "resources.yaml").read_text().replace(
        "path: verifiers/text_checks.py\n  applies_to: [instruction]\n  cost: low\n  hard_or_soft: hard\n  leakage_level: none\n  allowed_setting: all",
        "path: verifiers/text_checks.py\n  applies_to: [instruction]\n  cost: low\n  hard_or_soft: hard\n  leakage_level: low\n  allowed_setting: oracle_only")
    (d / "resources.yaml").write_text(y)
    gated = {"instruction_following_pointwise": S.load_skill(d)}
    t = S.JudgeTask("q", ["r"], "pointwise", "skill_rm")
    S.execute_tool(t, {"name": "use_skill", "arguments": {"name": d.name}}, gated, judge_args())
    out = S.execute_tool(t, {"name": "run_verifier", "arguments": {"id": "text_checks", "code": "print(1)"}}, gated, judge_args())
    assert out.startswith("refused") and "oracle-only" in out


# ----- constrained decoding (§1 of issue #11) -----

def test_turn_schema_enumerates_tools_and_ids():
    skills = S.load_skills(SKILLS)
    args = judge_args()
    t = S.JudgeTask("q", ["a", "b"], "pairwise", "skill_rm")
    first = schema_instances(S.turn_schema(t, skills, args))
    assert {"name": "use_skill", "arguments": {"name": "reward_judge_fair"}} in first
    assert {"name": "final_answer", "arguments": {"verdict": "B"}} in first
    assert {c["name"] for c in first} == {"use_skill", "final_answer"}  # progressive disclosure
    S.execute_tool(t, {"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}, skills, args)
    after = schema_instances(S.turn_schema(t, skills, args))
    assert {c["name"] for c in after} == {"view_resource", "python_sandbox", "run_verifier", "final_answer"}
    ids = {c["arguments"].get("id") for c in after}
    assert "reference_answers" not in ids and {"principles", "math_recompute", "last_number"} <= ids  # oracle never offered
    # python_sandbox: its code is a bounded free string (issue #26 §1)
    assert {"name": "python_sandbox", "arguments": {"code": FreeString(400)}} in after
    t.force = True
    assert schema_instances(S.turn_schema(t, skills, args)) == [{"verdict": "A"}, {"verdict": "B"}, {"verdict": "Tie"}]
    assert schema_instances(S.final_schema("selection", 4)) == [{"choice": c} for c in "ABCD"]
    assert schema_instances(S.final_schema("pointwise", 1))[-1] == {"score": 1.0}
    py = schema_instances(S.turn_schema(S.JudgeTask("q", ["a"], "pointwise", "python_only"), skills, args))
    assert {c["name"] for c in py} == {"python_sandbox", "final_answer"}  # constrained like every other judge


def test_vllm_grammar_lets_the_judge_write_multiline_code():
    """Under vLLM (xgrammar) a maxLength string admits no JSON escape, so the SFT judge's check (MATH_CHECK_CODE: newlines,
    \\d) was cut to "import re" in every math judgment of a tiny run (2026-12-04). The schema vLLM gets must take it."""
    import xgrammar as xgr
    from transformers import AutoTokenizer
    from plumbing import embedded_model_path, xgrammar_schema
    tok = AutoTokenizer.from_pretrained(embedded_model_path())
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok))
    skills, args = S.load_skills(SKILLS), judge_args()
    t = S.JudgeTask("Compute: 2 + 3 =", ["5", "6"], "pairwise", "skill_rm")
    S.execute_tool(t, {"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}, skills, args)
    schema = S.turn_schema(t, skills, args)
    ids = tok.encode(json_text({"name": "python_sandbox", "arguments": {"code": rb.MATH_CHECK_CODE}}), add_special_tokens=False)

    def accepts(sc):
        m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(sc), any_whitespace=False, separators=(",", ":")))
        return all(m.accept_token(i) for i in ids)
    assert not accepts(schema)  # the bug: xgrammar's bounded string has no escapes
    assert accepts(xgrammar_schema(schema)) and "maxLength" not in json.dumps(xgrammar_schema(schema))
    long = {"name": "python_sandbox", "arguments": {"code": "x" * (args.code_max_chars + 1)}}
    assert S.execute_tool(t, long, skills, args).startswith("refused: code longer")  # the bound, enforced after decoding


def test_run_verifier_takes_the_arguments_its_resource_declares_and_checklist_form():
    skills = S.load_skills(SKILLS)
    t = S.JudgeTask("Answer in lowercase.", ["all lowercase"], "pointwise", "skill_rm")
    assert schema_instances(S.turn_schema(t, skills, judge_args()))[-1] == {"name": "final_answer", "arguments": {"score": 1.0}}
    S.execute_tool(t, {"name": "use_skill", "arguments": {"name": "instruction_following_pointwise"}}, skills, judge_args())
    calls = schema_instances(S.turn_schema(t, skills, judge_args()))
    assert {"name": "run_verifier", "arguments": {"id": "text_checks"}} in calls
    assert {"name": "run_verifier", "arguments": {"id": "text_checks", "code": FreeString(400)}} in calls  # declared: [code]
    finals = [c["arguments"] for c in calls if c["name"] == "final_answer"]
    assert {"satisfied_count": 2, "total_count": 3} in finals and {"score": 0.625} in finals  # the skill asks for a checklist
    assert {"score": 0.7} not in finals  # the grid is the eighths (rb.SCORE_GRID): what xgrammar writes as json_text does
    assert {"satisfied_count": 4, "total_count": 3} not in finals
    assert S.readout_pointwise({"satisfied_count": 2, "total_count": 3})[0] == pytest.approx(2 / 3)
    fair = S.JudgeTask("q", ["a", "b"], "pairwise", "skill_rm")
    S.execute_tool(fair, {"name": "use_skill", "arguments": {"name": "reward_judge_fair"}}, skills, judge_args())
    calls = schema_instances(S.turn_schema(fair, skills, judge_args()))
    assert {"name": "run_verifier", "arguments": {"id": "math_recompute"}} in calls
    assert not any(c["name"] == "run_verifier" and "code" in c["arguments"] for c in calls)  # none declared


def test_constrained_hf_sampler_only_emits_allowed_replies(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    sampler = ConstrainedHFSampler(model, tok)
    skills = S.load_skills(SKILLS)
    t = S.JudgeTask("q", ["a", "b"], "pairwise", "skill_rm")
    schema = S.turn_schema(t, skills, judge_args())
    allowed = [json_text(v) for v in schema_instances(schema)]
    prompt = S.chat_ids(tok, [{"role": "user", "content": "Which is better, A or B?"}])
    for temperature in (0.0, 1.0):
        outs = sampler.generate([prompt, prompt[:-3]], 3, 16, temperature, json_schema=schema)
        assert all(s.text in allowed and S.parse_tool_call(s.text) for o in outs for s in o)
    # greedy choice = the allowed first token with the highest logit (checked at the one branch point)
    texts = ['{"verdict":"A"}', '{"verdict":"B"}', '{"verdict":"Tie"}']  # compact: plumbing.json_text, as vLLM decodes
    opts = [tok.encode(a, add_special_tokens=False) for a in texts]
    k = next(i for i in range(min(map(len, opts))) if len({o[i] for o in opts}) > 1)
    assert len({o[k] for o in opts}) == 3 and all(o[:k] == opts[0][:k] for o in opts)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + opts[0][:k]])).logits[0, -1]
    want = max(texts, key=lambda t: logits[opts[texts.index(t)][k]])
    got = sampler.generate([prompt], 1, 16, 0.0, json_schema=S.final_schema("pairwise", 2))[0][0].text
    assert got == want
    # the per-conversation cache gives the same answer as a fresh sampler
    assert ConstrainedHFSampler(model, tok).generate([prompt], 1, 16, 0.0, json_schema=S.final_schema("pairwise", 2))[0][0].text == got


def test_constrained_sampler_decodes_a_bounded_free_code_string(tiny_model_dir):
    """python_sandbox's code is a free string: whatever the model writes, the reply is valid JSON of the
    schema's shape with ≤ maxLength characters of code (issue #26 §1)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from plumbing import _json_string_body, _string_end, instance_template
    assert instance_template({"code": FreeString(9)}) == ['{"code":"', 9, '"}']
    assert instance_template({"verdict": "A"}) == ['{"verdict":"A"}']
    assert _string_end('ab\\"c"d') == 5 and _string_end('a\\\\"') == 3 and _string_end("abc") is None
    assert _json_string_body('x\nq\\', 50) == 'x\\nq\\\\' and _json_string_body("abcdef", 3) == "abc"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    skills = S.load_skills(SKILLS)
    t = S.JudgeTask("q", ["a", "b"], "pairwise", "python_only")
    schema = {"anyOf": [s for s in S.turn_schema(t, skills, judge_args(code_max_chars=30))["anyOf"]
                        if s["properties"]["name"]["const"] == "python_sandbox"]}  # only the code call: the free path
    prompt = S.chat_ids(tok, [{"role": "user", "content": "Write code."}])
    for temperature in (0.0, 1.0):
        for o in ConstrainedHFSampler(model, tok).generate([prompt] * 2, 2, 24, temperature, json_schema=schema):
            for smp in o:
                call = json.loads(smp.text)
                assert list(call) == ["name", "arguments"] and call["name"] == "python_sandbox"
                assert list(call["arguments"]) == ["code"] and isinstance(call["arguments"]["code"], str)
                assert len(call["arguments"]["code"]) <= 30 and S.parse_tool_call(smp.text)["name"] == "python_sandbox"
    full = S.turn_schema(t, skills, judge_args(code_max_chars=30))  # the choice between code and final answer
    for smp in ConstrainedHFSampler(model, tok).generate([prompt], 3, 24, 1.0, json_schema=full)[0]:
        assert S.parse_tool_call(smp.text)["name"] in ("python_sandbox", "final_answer")


def test_every_judge_gives_valid_verdicts_under_constraints(tiny_model_dir):
    """A random tiny model as judge: with constrained decoding every judgment is valid."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    skills = S.load_skills(SKILLS)
    items = rb.select_items(S.read_jsonl(ROOT / "data/skill_rm/bench.jsonl"), 1)
    tasks, meta = S.benchmark_tasks(items, ["baseline", "skill_rm"], ["pairwise", "best_of_4"], 0)
    S.run_judges(ConstrainedHFSampler(model, tok), tok, tasks, skills, judge_args(), max_turns=3)
    res = S.score_benchmark(tasks, meta)
    assert all(r["valid"] == 1.0 for r in res.values())


# ----- §5 readout mappings, the oracle judge, RL rewards -----

def test_best_of_4_permutation_and_order_readout():
    items = [{"id": "x", "category": "math", "prompt": "p", "chosen": "C0", "rejected": ["R1", "R2", "R3"]}]
    tasks, meta = S.benchmark_tasks(items, ["baseline"], ["pairwise", "best_of_4"], seed=3)
    pair0, pair1, bo4 = tasks
    assert pair0.candidates == ["C0", "R1"] and pair0.label == "A" and meta[0][4] == 0
    assert pair1.candidates == ["R1", "C0"] and pair1.label == "B" and meta[1][4] == 1
    correct = meta[2][4]
    assert bo4.candidates["ABCD".index(correct)] == "C0" and bo4.label == correct
    assert sorted(bo4.candidates) == ["C0", "R1", "R2", "R3"]
    # a judge that always names the chosen wins everything; one that always says "A" wins no pair
    for t in tasks:
        t.judgment = {"verdict": t.label} if t.mode == "pairwise" else {"choice": t.label}
    res = S.score_benchmark(tasks, meta)
    assert res[("baseline", "pairwise", "math")]["score"] == 1.0 and res[("baseline", "best_of_4", "math")]["score"] == 1.0
    for t in tasks:
        t.judgment = {"verdict": "A"} if t.mode == "pairwise" else {"choice": "A"}
    res = S.score_benchmark(tasks, meta)
    assert res[("baseline", "pairwise", "math")]["score"] == 0.0
    assert res[("baseline", "best_of_4", "math")]["score"] == float(correct == "A")


def test_oracle_judge_reaches_100_percent_through_the_real_loop():
    skills = S.load_skills(SKILLS)
    items = [it for it in rb.select_items(S.read_jsonl(ROOT / "data/skill_rm/bench.jsonl"), 1) if it["category"] != "code"]
    tasks, meta = S.benchmark_tasks(items, ["oracle"], ["pairwise", "best_of_4"], 0)
    S.run_judges(None, None, tasks, skills, judge_args(), max_turns=3)
    res = S.score_benchmark(tasks, meta)
    assert all(r["score"] == 1.0 and r["valid"] == 1.0 for r in res.values())
    math_pair = next(t for t in tasks if t.category == "math")
    assert [s["call"]["name"] for s in math_pair.trace] == ["use_skill", "python_sandbox", "final_answer"]
    focus = next(t for t in tasks if t.category == "focus")
    assert [s["call"]["name"] for s in focus.trace] == ["use_skill", "python_sandbox", "final_answer"]  # same prompts as math
    if_pair = next(t for t in tasks if t.category == "precise_if")
    assert if_pair.skill.name == "instruction_following_pointwise" and "most constraints pass" in if_pair.trace[1]["observation"]
    assert S.default_skill("pairwise", skills).name == "reward_judge_fair"
    assert S.default_skill("pointwise", skills).name == "instruction_following_pointwise"
    assert "matches: ['A']" in math_pair.trace[1]["observation"] and f"matches: ['{focus.label}']" in focus.trace[1]["observation"]
    assert all(S.code_result_used(t) for t in tasks if t.category in ("math", "focus", "precise_if"))


def test_anchored_flip_maps_to_the_rollout_label():
    skills = S.load_skills(SKILLS)
    args = judge_args(rl_max_turns=2)
    rng = __import__("random").Random(5)
    flips = [rng.random() < 0.5 for _ in range(6)]  # judge_rewards draws the same flips from seed 5
    # a judge that always prefers the rollout: its position is B when flipped (rollout shown second)
    replies = ['{"verdict": "%s"}' % ("B" if f else "A") for f in flips]
    rewards, valid, tasks = S.judge_rewards(S.Judge(ScriptedSampler(replies), CharTok(), skills), ["p"] * 6,
                                            [f"r{k}" for k in range(6)], "anchored", args, anchors=["ref"] * 6, seed=5)
    assert all(t.candidates[1 if f else 0].startswith("r") for t, f in zip(tasks, flips))
    assert rewards == [1.0] * 6 and all(valid)


def test_judge_rewards_pointwise_and_direct():
    skills = S.load_skills(SKILLS)
    args = judge_args(rl_max_turns=2)
    judge = S.Judge(ScriptedSampler(['{"name": "final_answer", "arguments": {"score": 0.7}}']), CharTok(), skills)
    r, v, _ = S.judge_rewards(judge, ["p", "q"], ["a", "b"], "skill_rm", args)
    assert r == [0.7, 0.7] and v == [True, True]
    r, v, _ = S.judge_rewards(S.Judge(ScriptedSampler(['{"score": 0.3}']), CharTok(), skills), ["p"], ["a"], "direct",
                              args)
    assert r == [0.3] and v == [True]
    r, v, _ = S.judge_rewards(S.Judge(ScriptedSampler(["nonsense"]), CharTok(), skills), ["p"], ["a"], "direct", args)
    assert r == [0.5] and v == [False]  # invalid → 0.5, flagged


def test_pointwise_final_answer_shaped_like_the_contract():
    for score in rb.SCORE_GRID:
        reply = json.dumps({"name": "final_answer", "arguments": {"score": score}})
        call = S.parse_tool_call(reply)
        assert call["name"] == "final_answer" and S.readout_pointwise(call["arguments"]) == (score, True)
    assert rb.final_example("pointwise", 1).startswith('{"score": S}')


# ----- issue #26 §2: data and bugs, each with a test that failed before its fix -----


def test_text_checks_tie_is_a_tie():
    """The IF verifier named A for equal scores (scores.index(max)): a position bias towards A."""
    out = S.run_sandboxed((SKILLS / "instruction_following_pointwise/verifiers/text_checks.py").read_text(), 3.0, 256,
                          {"prompt": "Do not use any commas in your response.", "candidates": ["no commas", "none here"]})
    assert "most constraints pass: tie (A, B)" in out["stdout"]
    out = S.run_sandboxed((SKILLS / "instruction_following_pointwise/verifiers/text_checks.py").read_text(), 3.0, 256,
                          {"prompt": "Do not use any commas in your response.", "candidates": ["a, b", "none here"]})
    assert "most constraints pass: B" in out["stdout"]


def test_huge_integer_score_is_invalid_not_a_crash():
    """{"score": <400-digit int>} raised OverflowError in _num (now stats.parse_number) through judge_rewards."""
    assert S.readout_pointwise({"score": 10 ** 400}) == (0.5, False)
    assert S.readout_pointwise({"satisfied_count": 10 ** 400, "total_count": 3}) == (0.5, False)
    assert S.readout_pointwise({"score": "1" * 400}) == (0.5, False)  # inf as a string
    skills = S.load_skills(SKILLS)
    r, v, _ = S.judge_rewards(S.Judge(ScriptedSampler(['{"score": ' + "9" * 400 + "}"]), CharTok(), skills), ["p"],
                              ["a"], "direct", judge_args(rl_max_turns=2))
    assert r == [0.5] and v == [False]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12)
KEYS = st.sampled_from(["score", "satisfied_count", "total_count", "checklist", "verdict", "choice", "name", "arguments",
                        "code", "id", "winner", "satisfied"])
JUDGMENT = JSON | st.dictionaries(KEYS, JSON, max_size=4)
TEXT = st.text(max_size=200) | JSON.map(json.dumps) | JUDGMENT.map(lambda v: "<tool_call>" + json.dumps(v)) | \
    st.from_regex(r"(final_answer|python_sandbox|run_verifier)\(.{0,30}\)", fullmatch=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JUDGMENT, TEXT)
def test_every_readout_and_parser_survives_hostile_output(judgment, text):
    """Model output is hostile input: no readout or parser raises on any JSON value or string."""
    r, ok = S.readout_pointwise(judgment)
    assert 0.0 <= r <= 1.0 and isinstance(ok, bool)
    for labels in ("AB", "ABCD"):
        lab = S.judgment_label(judgment, labels)
        assert lab is None or lab in tuple(labels) + ("Tie",)
        assert S.readout_selection(lab, "A", 4) in (0.0, 0.25, 1.0)
        v = S.parse_text_verdict(text, labels)
        assert v is None or v in tuple(labels) + ("Tie",)
        S.text_judgment(text, "pairwise", labels), S.text_judgment(text, "pointwise", labels)
    S.readout_pairwise(S.judgment_label(judgment, "AB"), S.parse_label(text, "AB"))
    assert S.anchored_pairwise_reward(S.judgment_label(judgment, "AB"), "A") in (0.0, 0.5, 1.0)
    for allow in (False, True):
        call = S.parse_tool_call(text, allow_code_block=allow)
        assert call is None or (call["name"] in S.TOOL_NAMES and isinstance(call["arguments"], dict))
    assert plumbing._normalise_call(judgment) is None or plumbing._normalise_call(judgment)["name"] in S.TOOL_NAMES
    rating = S.parse_text_rating(text)
    assert rating is None or 0.0 <= rating <= 1.0
    t = S.JudgeTask("p", ["a", "b"], "pairwise", "skill_rm", label="A")
    t.judgment = judgment
    t.trace = [{"turn": 1, "action": text, "call": {"name": "python_sandbox", "arguments": {}}, "observation": text}]
    assert S.code_result_used(t) in (None, True, False)
    t.mode, t.candidates = "pointwise", ["a"]
    assert S.code_result_used(t) in (None, True, False)


def test_constrained_sampler_records_forced_tokens(tiny_model_dir):
    """ConstrainedHFSampler marks the tokens its grammar forced (one allowed token) and reports each token's log-prob
    in the constrained distribution (0 where forced), so grpo_update can drop forced tokens from the loss (issue #24 §2)."""
    import math
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt = S.chat_ids(tok, [{"role": "user", "content": "Which is better?"}])
    schema = {"type": "object", "properties": {"verdict": {"enum": ["A", "B"]}}, "required": ["verdict"]}
    for smp in ConstrainedHFSampler(model, tok).generate([prompt], 3, 16, 1.0, json_schema=schema)[0]:
        assert len(smp.forced) == len(smp.logprobs) == len(smp.ids)
        assert sum(1 - f for f in smp.forced) == 1  # one decision (A or B); the keys, quotes and EOS are forced
        k = smp.forced.index(0)
        assert tok.decode(smp.ids[:k]).rstrip().endswith('"') and smp.text in ('{"verdict":"A"}', '{"verdict":"B"}')
        assert all(lp == 0.0 for lp, f in zip(smp.logprobs, smp.forced) if f) and -math.log(2) * 20 < smp.logprobs[k] <= 0
    free = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 12}}, "required": ["code"]}
    for smp in ConstrainedHFSampler(model, tok).generate([prompt], 2, 16, 1.0, json_schema=free)[0]:
        assert len(smp.forced) == len(smp.ids) and smp.forced[0] == 1  # the head '{"code":"' is forced
        head = smp.forced.index(0) if 0 in smp.forced else len(smp.ids)
        assert tok.decode(smp.ids[:head]).startswith('{"code')
        assert all(f == 0 for f in smp.forced[head:])  # the free string and the re-encoded end count as decisions


def test_judge_sft_trace_is_one_example_trained_on_the_judges_decisions(tiny_model_dir):
    """judge_sft trains each scripted trace as one sequence: the judge's replies are the targets (mask 1), the
    tool observations and chat markup between them are not, and under --constrained the tokens whose text the
    turn's schema fixed leave the loss too (GrammarReplay.decided), so the plain and the skill judge are trained
    on their decisions (tool, resource, code, label), not on JSON boilerplate."""
    from transformers import AutoTokenizer
    from plumbing import GrammarReplay
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    grammar = GrammarReplay(tok, len(tok))
    skills = S.load_skills(SKILLS)
    tasks = S.judge_sft_tasks(S.sft_items(0, 1), "skill_rm", 0)
    S.run_judges(None, tok, tasks, skills, judge_args(), 3)
    pair = next(t for t in tasks if t.mode == "pairwise" and t.category == "math")
    replies = [m["content"] for m in pair.messages if m["role"] == "assistant"]
    assert len(replies) == 3 and len(pair.schemas) == 3 and '"python_sandbox"' in replies[1]
    (prompt, target, mask), = S.trace_examples(tok, pair.messages)
    last = max(k for k, m in enumerate(pair.messages) if m["role"] == "assistant")
    assert prompt == S.chat_ids(tok, pair.messages[:2])  # system + user
    assert prompt + target == S.chat_ids(tok, pair.messages[:last]) + tok.encode(replies[-1], add_special_tokens=False) + [tok.eos_token_id]
    trained = [t for t, m in zip(target, mask) if m]
    assert trained == [t for r in replies for t in tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]]
    # the observations (the skill's text, the sandbox's report) are context, never a target
    assert tok.decode(target).count("<tool_response>") == 2 and "tool_response" not in tok.decode(trained)
    # under the schemas: the decisions only — the skill's name, the tool, the code, the label
    (_, target2, free), = S.trace_examples(tok, pair.messages, pair.schemas, grammar)
    assert target2 == target and sum(free) < sum(mask)
    decided = [tok.decode([t]) for t, m in zip(target, free) if m]
    assert decided[-1] == pair.label and "verdict" not in decided and "arguments" not in decided
    plain = S.judge_sft_tasks(S.sft_items(0, 1), "baseline", 0)
    S.run_judges(None, tok, plain, skills, judge_args(), 3)
    p = next(t for t in plain if t.mode == "pairwise")
    (_, tgt, free), = S.trace_examples(tok, p.messages, p.schemas, grammar)
    assert [tok.decode([t]) for t, m in zip(tgt, free) if m] == [p.label]  # the plain judge's one decision


def test_grammar_replay_decided_is_a_choice_of_text_not_of_tokenization(tiny_model_dir):
    """GrammarReplay.forced counts a token as forced only when one token is allowed, so "ver" of a literal
    "verdict" (where "v", "ve", ... are allowed too) is not forced; decided marks only a choice of text."""
    from transformers import AutoTokenizer
    from plumbing import GrammarReplay
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    g = GrammarReplay(tok, len(tok))
    schema = S.final_schema("pairwise", 2)
    for verdict in ("A", "B", "Tie"):
        ids = tok.encode(json_text({"verdict": verdict}), add_special_tokens=False) + [tok.eos_token_id]
        decided = g.decided(schema, ids)
        assert [tok.decode([t]) for t, d in zip(ids, decided) if d] == [tok.decode(tok.encode(verdict)[:1])]
        assert sum(1 - f for f in g.forced(schema, ids)) > sum(decided)  # one-token forcing misses the literal's pieces
    free = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 40}}, "required": ["code"]}
    ids = tok.encode('{"code":"print(1)"}', add_special_tokens=False) + [tok.eos_token_id]
    decided = g.decided(free, ids)
    assert tok.decode([t for t, d in zip(ids, decided) if d]).startswith("print(1)")  # the free string is all decisions
    assert g.decided(schema, tok.encode('{"x":1}', add_special_tokens=False))[-1] == 1  # rejected: 1 from there on


@pytest.mark.parametrize("warm", [pytest.param("sft", marks=[pytest.mark.heavy(1280), pytest.mark.xdist_group(MEMORY_GROUP),
                                                              pytest.mark.skipif(not SLOW, reason=SLOW_WHY)]),
                                  pytest.param("prepared", marks=[pytest.mark.heavy(400), pytest.mark.xdist_group(MEMORY_GROUP)])])
def test_sft_skill_judge_beats_the_coin_and_is_not_position_locked(tmp_path, warm):
    """Issue #26 §1 and §4, the signal the shrunk smoke run cannot carry: the embedded model, SFT-warmed in the run with
    the tiny preset's flags under HF (whole traces, decisions only, 3 epochs of 32 traces; 857 s on two avx512_bf16
    threads, 12-04; only with NANOSKILL_SLOW_TESTS=1), or with the committed adapter the tiny preset merges (#48:
    the same traces and steps, trained once as LoRA), judges the benchmark's 12 held-out precise_if and 12 math pairs (no
    SFT item is among them) in both orders. It must beat the 25 % coin beyond its binomial band, not be position-locked
    (consistency > 0), and run python_sandbox in most math judgments: a judge at chance, answering one position, or
    never writing its own check fails here. (Fewer traces, 2 per
    category for 12 steps, left it at 2/24 on precise_if + focus; the same 32 traces for 2 epochs, 16 steps, at 2/12, p
    0.74, 427 s of SFT, 2026-12-03: the preset's budget is the floor.)"""
    from stats import binomial_p
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=[  # prepared: the preset's vLLM
        "--preset", "tiny", "--run-dir", str(tmp_path)] + ["--sampler", "hf"] * (warm == "sft"))
    dist, skills = S.Dist(), S.load_skills(args.skills_dir)
    policy, tok = S.load_policy(args, dist)
    if warm == "sft":
        judge = S.judge_sft(S.make_judge(policy, args, dist), tok, skills, args, dist, "skill_rm")
    else:
        judge = S.warmed_judge(S.Stages(args, dist), S.make_judge(policy, args, dist), tok, skills, args, dist,
                               "skill_rm")
        assert not (tmp_path / "judge_sft_skill_rm").exists()  # merged: no SFT step ran
    items = [it for it in S.read_jsonl(args.bench) if it["category"] in ("precise_if", "math")]
    tasks, meta = S.benchmark_tasks(items, ["skill_rm"], ["pairwise"], 0)
    S.run_judges(S.make_judge_sampler(judge, tok, args, dist), tok, tasks, skills, args, args.max_turns)
    res = S.score_benchmark(tasks, meta)
    wins = list(rb.bench_items(res, "skill_rm", "pairwise").values())
    consistent = list(rb.bench_items(res, "skill_rm", "pairwise", "items_consistent").values())
    assert len(wins) == len(items) == 24
    assert sum(wins) / len(wins) > 0.25 and binomial_p(sum(wins), len(wins), 0.25) < 0.01, wins
    assert sum(consistent) > 0, "position-locked"
    assert all(t.tool_calls >= 3 for t in tasks)  # use_skill, a verifier run, final_answer: no tool-less verdicts
    # §1: on math the judge runs code in the sandbox in most judgments (24 = 12 pairs × 2 orders): the SFT judge its
    # own check (python_sandbox); the prepared one ran the skill's verifier in all 24 on 2026-12-07 and never wrote
    # its own check, a difference from the in-run SFT judge that the note on #48 reports
    tool = "python_sandbox" if warm == "sft" else "run_verifier"
    sandbox = [S.tool_counts(t).get(tool, 0) > 0 for t in tasks if t.category == "math"]
    assert len(sandbox) == 24 and sum(sandbox) >= 18, sandbox


# ----- the prepared judges (#48 §1): each judge's SFT warm-up once as a LoRA adapter, merged at start -----

def test_committed_tiny_judges_are_made_for_the_tiny_recipe_and_the_embedded_model():
    """data/skill_rm/judges: the adapters the tiny preset merges; each was made for the tiny preset's current judge
    SFT flags and the embedded model, so a change of either that would leave them stale fails here (rebuild: make
    prepare-skill-rm)."""
    import os
    from plumbing import Dist, load_model, read_lora, weights_fingerprint
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=["--preset", "tiny"])
    embedded, _ = load_model("embedded", Dist(), "float32", trainable=False)
    for method in ("baseline", "skill_rm", "python_only"):
        meta, tensors = read_lora(os.path.join(args.warmup_adapters, f"judge-{method}.safetensors"))
        assert meta["recipe"] == S.judge_recipe(args), method
        assert meta["fingerprint"] == weights_fingerprint(embedded) and meta["sft"]["sft_steps"] > 0
        assert len(tensors) == 2 * 7 * 30  # A and B of all seven projections of SmolLM2-135M's 30 layers


def test_prepare_judges_then_a_run_merges_them_and_a_changed_flag_runs_the_sft(tiny_model_dir, tmp_path, capsys):
    """--prepare-warmup trains each judge's SFT warm-up as a LoRA adapter into --warmup-adapters (python_only's only
    when it is judged); a run with the same flags merges them (no SFT step runs, no judge_sft stage is saved), and one
    with another judge SFT flag runs each SFT and says why."""
    common = ["--preset", "tiny", "--model", tiny_model_dir, "--sampler", "hf", "--methods", "baseline,skill_rm",
              "--judge-sft-steps", "1", "--judge-sft-batch", "2", "--judge-sft-items", "1", "--lora-rank", "2",
              "--warmup-adapters", str(tmp_path / "adapters")]
    S.main(common + ["--prepare-warmup", "--run-dir", str(tmp_path / "prep")])
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["judge-baseline.safetensors",
                                                                        "judge-skill_rm.safetensors"]
    small = ["--no-benchmark", "--no-bon", "--no-rl"]
    capsys.readouterr()
    S.main(common + small + ["--run-dir", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert printed.count("merged the prepared LoRA adapter") == 2, printed
    assert not list(tmp_path.glob("run/judge_sft_*")) and not list(tmp_path.glob("run/stages/judge_sft_*"))
    S.main(common + small + ["--judge-sft-items", "2", "--run-dir", str(tmp_path / "run2")])
    printed = capsys.readouterr().out
    assert printed.count("was prepared for another judge_sft_items), ") == 2, printed
    assert "merged the prepared LoRA adapter" not in printed
    assert (tmp_path / "run2" / "judge_sft_baseline").exists() and (tmp_path / "run2" / "judge_sft_skill_rm").exists()


def test_judge_sft_trains_the_fixed_tokens_unless_hf_forces_them(tiny_model_dir, tmp_path, monkeypatch):
    """xgrammar (vLLM) lets the judge choose how to tokenize a schema's fixed text: greedy picked `{` `"` `n` `am` `e`
    for `{"name"`, and a prepared skill judge trained on its decisions only fell from pairwise 0.75 / 1 on dev
    precise_if / math under HF, which forces the canonical tokens, to 0.25 / 0 (docs/skill_rm.md). So judge_sft trains every reply token unless
    the sampler is HF, and a prepared judge's recipe says which it was trained for."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    judge = SimpleNamespace(config=SimpleNamespace(vocab_size=len(tok)))
    seen = {}
    monkeypatch.setattr(S, "sft_loop", lambda model, examples, *a, **k: seen.setdefault(args.sampler, examples))
    for sampler in ("auto", "hf"):
        args = S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=[
            "--preset", "tiny", "--sampler", sampler, "--judge-sft-items", "1", "--run-dir", str(tmp_path)])
        S.judge_sft(judge, tok, S.load_skills(SKILLS), args, S.Dist(), "skill_rm", model=judge)
        assert S.judge_recipe(args)["fixed_tokens_trained"] == (sampler != "hf")
    supervised = lambda xs: sum(sum(m) for _, _, m in xs)
    chars = sum(len(tok.decode([t for t, m in zip(tgt, mask) if m])) for _, tgt, mask in seen["auto"])
    assert chars > 0 and supervised(seen["hf"]) < 0.6 * supervised(seen["auto"])  # 446 of 845 tokens
    for (_, tgt, mask) in seen["auto"]:  # every reply token, no observation or chat markup
        text = tok.decode([t for t, m in zip(tgt, mask) if m])
        *replies, rest = text.split(tok.eos_token)
        assert replies and rest == "" and all(r.startswith('{"name":"') for r in replies), text
        assert "tool_response" not in text


@pytest.mark.parametrize("method", ["skill_rm", "python_only"])
def test_judge_sft_mask_is_the_decoding_grammars_for_multiline_code(tiny_model_dir, method):
    """#49 §4: xgrammar compiles a maxLength string without JSON escapes, so replaying a scripted trace whose
    code holds a newline under the turn's own schema rejected the code at its first \\n, and every token after
    it counted as decided: the forced "}} and end of turn were trained in one run and masked in another.
    trace_examples replays under the grammar the sampler decodes with (xgrammar_schema): a code string with
    newlines is all decisions, and the JSON that closes it is forced. python_only's traces (#49 §2: its own
    check, python_sandbox → final_answer, no skill) are replies its turn schema decodes whole, every one."""
    from transformers import AutoTokenizer
    from plumbing import GrammarReplay, xgrammar_schema
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    grammar = GrammarReplay(tok, len(tok))
    tasks = S.judge_sft_tasks(S.sft_items(0, 2), method, 0)
    S.run_judges(None, tok, tasks, S.load_skills(SKILLS), judge_args(), 3)
    checked = scores = 0
    for t in tasks:
        replies = [m["content"] for m in t.messages if m["role"] == "assistant"]
        (_, _, mask), = S.trace_examples(tok, t.messages, t.schemas, grammar)
        (_, _, unbounded), = S.trace_examples(tok, t.messages, [xgrammar_schema(s) for s in t.schemas], grammar)
        assert mask == unbounded
        for reply, schema in zip(replies, t.schemas):
            ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
            decided = grammar.decided(xgrammar_schema(schema), ids)
            score = (_json_object(reply).get("arguments") or {}).get("score")
            # the grammar took the whole reply (its end of turn forced), a pointwise score too (the eighths grid:
            # test_xgrammar_takes_every_pointwise_score_as_the_scripted_judge_writes_it)
            assert decided[-1] == 0, reply
            scores += score is not None
            code = (_json_object(reply).get("arguments") or {}).get("code")
            if not isinstance(code, str) or "\n" not in code:
                continue
            assert decided[-2] == 0  # '"}}' closes it: forced
            assert sum(decided) >= len(tok.encode(code, add_special_tokens=False)) // 2  # the code is decided
            assert len(code) <= judge_args().code_max_chars  # the HF sampler's bounded string takes it too
            checked += 1
    assert checked, "no scripted trace runs multi-line code: the test would check nothing"
    assert scores or method == "skill_rm", "no pointwise score replayed"  # skill_rm's traces answer in checklist form
    if method == "python_only":  # its own check in every trace, run, and its report followed (ties aside)
        assert all(S.tool_counts(t) == {"python_sandbox": 1, "final_answer": 1} and t.skill is None for t in tasks)
        assert all(t.trace[0]["observation"].startswith("stdout:\n") and "error" not in t.trace[0]["observation"]
                   for t in tasks)
        assert all(S.code_result_used(t) for t in tasks), [S.format_trace(t) for t in tasks if not S.code_result_used(t)]
        assert checked == len(tasks) and S.judgment_label(tasks[0].judgment, "AB") == tasks[0].label


def test_xgrammar_takes_every_pointwise_score_as_the_scripted_judge_writes_it(tiny_model_dir):
    """#49 §4, found with python_only's traces: xgrammar writes an enum's numbers with 17 significant digits, so on
    a tenths grid the score enum compiled as vLLM compiles it (GrammarReplay) took 0, 0.5 and 1 alone as json_text
    writes them: a scripted 0.7 was rejected at its third character (the tokens after it counted as decided), and
    a vLLM judge wrote 0.69999999999999996 where the HF sampler wrote 0.7. On the eighths grid every score is one
    text under both decoders: the grammar takes each SCORE_GRID value whole as json_text writes it, its number
    alternatives are exactly those texts, and the HF sampler's templates (schema_segments, final answer and
    final_answer tool call alike) write exactly the grammar's texts."""
    import xgrammar as xgr
    from transformers import AutoTokenizer
    from plumbing import GrammarReplay, schema_segments, xgrammar_schema
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    grammar, schema = GrammarReplay(tok, len(tok)), xgrammar_schema(S.final_schema("pointwise", 1))
    taken = [s for s in rb.SCORE_GRID
             if grammar.decided(schema, tok.encode(json_text({"score": s}), add_special_tokens=False)
                                + [tok.eos_token_id])[-1] == 0]
    assert taken == rb.SCORE_GRID
    off = tok.encode('{"score":0.7}', add_special_tokens=False) + [tok.eos_token_id]
    assert grammar.decided(schema, off)[-1] == 1  # off the grid: rejected ("0.7" is but a prefix of 0.75)
    # vLLM's texts: the enum's alternatives as xgrammar compiles them (the root rule of the bare enum)
    root = str(xgr.Grammar.from_json_schema(json.dumps({"enum": rb.SCORE_GRID}), any_whitespace=False))
    vllm = re.findall(r'\("([^"]*)"\)', re.search(r"^root ::= (.*)$", root, re.M).group(1))
    assert vllm == [json_text(s) for s in rb.SCORE_GRID] == ["0", "0.125", "0.25", "0.375", "0.5", "0.625", "0.75",
                                                            "0.875", "1"]
    # the HF sampler's texts: its templates for the bare final answer and for the final_answer call of a tool turn
    segments = schema_segments(S.final_schema("pointwise", 1))
    assert len(segments) == 1 and [tpl[0] for tpl in segments[0]] == ['{"score":%s}' % v for v in vllm]
    t = S.JudgeTask("Answer in lowercase.", ["all lowercase"], "pointwise", "python_only")
    turn = S.turn_schema(t, S.load_skills(SKILLS), judge_args())  # python_sandbox or final_answer
    segments = schema_segments(turn)
    calls = [tpl[0] for tpl in segments[0] if tpl[0].startswith('{"name":"final_answer"')]
    assert len(segments) == 1 and calls == ['{"name":"final_answer","arguments":{"score":%s}}' % v for v in vllm]
    assert all(grammar.decided(xgrammar_schema(turn), tok.encode(c, add_special_tokens=False) + [tok.eos_token_id])[-1]
               == 0 for c in calls)


def test_token_matched_gives_the_tool_judge_the_skill_judges_supervised_tokens(monkeypatch):
    """#49 §2, no model: two example lists with different supervised tokens (mask 1) per example, the skill judge's
    (7-103, as its traces) and the tool judge's (59-132). sft_loop's draws over the skill list (24 steps of 4 from
    32: whole passes) train exactly T = steps · B · mean; token_matched's list for the tool judge holds T within
    half a batch's tokens, in whole batches, and one sft_loop pass over it trains exactly that list: fewer steps
    of longer examples. A shorter-example judge gets more steps by the same rule."""
    import grpo
    import torch
    rng = random.Random(0)
    examples = lambda lo, hi: [([1], [2] * 200, [1] * k + [0] * (200 - k)) for k in (rng.randint(lo, hi) for _ in range(32))]
    supervised = lambda xs: sum(sum(m) for _, _, m in xs)
    drawn = []
    monkeypatch.setattr(grpo, "sft_update", lambda model, opt, chosen, *a, **k: drawn.extend(chosen) or {"sft_loss": 0.0})
    train = lambda xs, batch, steps: drawn.clear() or grpo.sft_loop(torch.nn.Linear(1, 1), xs, SimpleNamespace(weight_decay=0.0),
                                                                     S.Dist(), 1e-4, batch, steps) and supervised(drawn)
    skill, tool, short = examples(7, 103), examples(59, 132), examples(1, 5)
    T = train(skill, 4, 24)
    assert T == 24 * 4 * supervised(skill) / 32  # three whole passes: the formula judge_sft uses, exactly
    for xs, most in ((tool, 132), (short, 5)):
        matched = S.token_matched(xs, T, 4, seed=1)
        assert len(matched) % 4 == 0 and abs(supervised(matched) - T) <= 4 * most / 2
        assert train(matched, 4, len(matched) // 4) == supervised(matched)  # one pass: each copy trained once
        assert {id(e) for e in matched} <= {id(e) for e in xs}
    assert len(S.token_matched(tool, T, 4, 1)) // 4 < 24 < len(S.token_matched(short, T, 4, 1)) // 4
    assert S.token_matched(tool, T, 4, 1) == S.token_matched(tool, T, 4, 1)  # seeded
    assert S.token_matched([([1], [2], [0])], T, 4) == [] and S.token_matched([], T, 4) == []  # nothing to match


def test_judge_sft_trains_python_only_on_the_skill_judges_supervised_tokens(tiny_model_dir, tmp_path, monkeypatch):
    """judge_sft with sft_loop recorded (no training; the tokenizer, not a model): the plain and skill judges get
    --judge-sft-steps × --judge-sft-batch; python_only gets its own traces in whole batches holding the skill
    judge's T = steps · B · mean supervised tokens, within half a batch's tokens."""
    import torch
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = S.parse_with_preset(S.build_parser(), S.PRESETS, name="skill_rm", argv=[
        "--preset", "tiny", "--judge-sft-items", "1", "--run-dir", str(tmp_path)])
    calls = {}
    monkeypatch.setattr(S, "sft_loop", lambda model, examples, args, dist, lr, batch, steps, **k:
                        calls.setdefault(k["log_dir"].name, (examples, batch, steps)))
    judge = torch.nn.Linear(1, 1)
    judge.config = SimpleNamespace(vocab_size=len(tok))
    for m in ("baseline", "skill_rm", "python_only"):
        S.judge_sft(judge, tok, S.load_skills(SKILLS), args, S.Dist(), m)
    supervised = lambda xs: [sum(mask) for _, _, mask in xs]
    skill, B, steps = calls["judge_sft_skill_rm"]
    assert (B, steps) == (4, 24) == calls["judge_sft_baseline"][1:]  # step-matched
    T = steps * B * sum(supervised(skill)) / len(skill)
    tool, b, n = calls["judge_sft_python_only"]
    assert b == B and n * b == len(tool) and 0 < n < steps
    assert abs(sum(supervised(tool)) - T) <= B * max(supervised(tool)) / 2
    assert min(supervised(tool)) > max(supervised(calls["judge_sft_baseline"][0]))  # code is trained, not only labels


def _json_object(text):
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
