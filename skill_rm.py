"""Skill-RM: reward modelling as the execution of a Reward-Evaluation Skill.

Paper: "Skill-RM: Unifying Heterogeneous Evaluation Criteria via Agent Skill",
Chen et al., arXiv:2606.03980 (code: github.com/Qwen-Applications/Skill-RM; its
mechanics are summarised in papers/NOTES.md §2 and rebuilt here in our own code).

A judge model does not score a response in one shot: it runs an agentic loop over a
*skill folder* (SKILL.md + a resource index + rubrics, bias controls, aggregation
policy, output contract, verifiers). It sees only the skill's name and description
until it calls `use_skill` (progressive disclosure); then it may `view_resource`
(≤ 4, leakage-gated) and run `python_sandbox` code over the visible prompt and
candidates. A deterministic readout (§3) maps the final structured judgment to a
pointwise reward (K = 1), a pairwise preference (K = 2, both presentation orders)
or a selection among K ≥ 2.

What runs here, top to bottom:
  1. an offline benchmark with preferences known by construction (precise
     instruction following, math, code, focus/style bias), candidates from the
     embedded model where it can produce them (data/skill_rm/prepare.py builds it);
  2. pairwise (both orders) and best-of-4 accuracy per category for the plain
     LLM-as-a-judge and Skill-RM with the same backbone, plus the ablations
     "resources appended to the prompt" and "Python tool only" (§5);
  3. best-of-N by JETTS sequential pairwise knockout: seqko@k, random@N, oracle@N;
  4. instruction-following GRPO (App. D) with the Skill-RM pointwise reward vs. a
     direct LLM-judge reward vs. anchored pairwise, all policies evaluated with
     deterministic constraint checkers the reward never sees.

Run:
  tiny (2-core CPU, ~16 min with AMX bf16, RL included; README): python skill_rm.py --preset tiny
  paper settings (needs GPUs): python skill_rm.py --preset paper --model Qwen/Qwen3.5-27B
  print one judge trace:       python skill_rm.py --preset tiny --show-trace 1 --skip-rl

Glossary: K number of candidates shown to the judge; N best-of-N pool size;
G rollouts per prompt (GRPO group); seqko@k incumbent's true score after k
candidates of the knockout; random@N / oracle@N mean / max true score of the pool.

Differences from the paper:
  1. Backbone: the embedded SmolLM2-135M-Instruct (paper: Qwen3.5-27B and others); free-running it
     never emits a parsable verdict, so items 8 and 9 make it judge. Invalid rates sit beside accuracy.
  2. Benchmark: RewardBench2 / RM-Bench / JudgeBench / JETTS / IF-RewardBench are not offline; a small
     one of the same shapes (pairwise both orders, best-of-4) from reasoning-gym, HumanEval and
     templated verifiable instructions (data/skill_rm/).
  3. Tool calls: one JSON object `{"name": ..., "arguments": {...}}` per turn; the parser also takes
     `<tool_call>` tags, Python-style calls and `[[A]]` verdicts; a malformed reply is "no call".
  4. Sandbox: the authors' `python -I -S`, empty env, timeout and static check, plus rlimits and a
     PEP 578 audit hook blocking imports, processes, sockets and outside files (RLIMIT_NPROC: not for root).
  5. Best-of-N pools: 8 SmolLM2 samples per reasoning-gym arithmetic or verifiable-instruction prompt
     (paper: JETTS pools of 10 from Qwen2.5-72B); tiny uses the first 4.
  6. IF-RL: our verifiable-instruction prompts and checkers (paper: VerInstruct prompts, Tulu-3-8B-SFT,
     Verl; IFEval, IFBench, AdvancedIF). Policy and judge are the same 135M model; the judge is frozen.
  7. Table 8's "sample-specific resources" variant is not built (a synthetic benchmark has none).
  8. Every judge (Skill-RM and the plain LLM judge) decodes each turn under a JSON schema (`turn_schema`):
     xgrammar under vLLM, else plumbing's `ConstrainedHFSampler` (finite instances + one bounded free
     code string). The plain judge so answers at once with a 0-1 score (MT-Bench: a 0-10 rating after
     reasoning); the checklist form is its counts only, and no free "evidence" field is offered.
  9. Judge SFT warm-up (`--judge-sft-steps`, on in tiny): each judge is first fine-tuned on scripted
     traces from a split nothing else uses (`sft_items`), one trace = one example trained on the judge's
     decisions only (the tokens its schema leaves open: tool, skill, code, label; `trace_examples`), same
     steps and traces for every judge (same budget, not the same information: the skill judge's final
     answers follow its verifier's report, the plain judge's must be inferred). The paper's judges are
     not trained.
  10. Verifier resources print a report when run without code, so run_verifier needs none. The tables
      add a scripted `oracle` judge (same loop, knows the label) as the upper bound.
  11. Held-out IF evaluation: test prompts use their own tasks, half of them a constraint type (title,
      postscript) no training prompt has, scored by IFEval's own checkers (lm-eval's copy), not ours.
"""
import argparse
import ast
import copy
import functools
import json
import math
import random
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from grpo import (Dist, add_grpo_args, chat_ids, gather_objects, grpo_update, make_optimizer, parse_with_preset, reduce_metrics,
                  sft_loop, sample_group_rollouts, seed_everything, setup_distributed)
from plumbing import (cpu_snapshot, exit_ranks, frozen_copy, load_model, load_policy, log_metrics, make_sampler, per_rank, plot_curves,
                      json_text, restore_snapshot, unwrap, ConstrainedHFSampler, GrammarReplay, VLLMSampler, xgrammar_schema)
from sandbox import CODE_IMPORTS, run_sandboxed, sandbox_static_check
from stats import aggregate_main, binomial_p, compare, format_headline, vs_chance, write_results

ROOT = Path(__file__).resolve().parent


# ----- config -----

PRESETS = {
    # 2-core CPU with AMX: ~16 min per seed, ~12.5 without RL (judge SFT ~9 min of it; README), embedded SmolLM2-135M as
    # judge and policy (judges SFT-warmed, difference 9): 3 epochs of 32 traces per judge (one epoch of 64 left the
    # skill judge position-locked), every benchmark item judged.
    "tiny": dict(sampler="auto", lr=2e-6, beta=0.0, bon_prompts=4, bon_N=4, rl_steps=2, rl_prompts=2,
                 rl_eval_prompts=8, judge_max_new_tokens=128, max_new_tokens=48, max_turns=3, rl_max_turns=3,
                 methods="baseline,skill_rm,oracle", judge_sft_steps=24, judge_sft_items=4, judge_sft_batch=4,
                 judge_sft_lr=1e-4),
    # the flag defaults: the paper's judge (temperature 0, 5 turns, 7 in RL) at paper scale (needs GPUs).
    "paper": {},
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_grpo_args(p)
    p.set_defaults(G=4, max_new_tokens=1024)  # RL at paper scale (App. D does not state G or the length)
    g = p.add_argument_group("skill-rm judge")
    g.add_argument("--skills-dir", default=str(ROOT / "data/skills"), help="folder of Reward-Evaluation Skills (Agent Skills convention)")
    g.add_argument("--judge-model", default=None, help="judge backbone (default: same as --model; paper: Qwen3.5-27B)")
    g.add_argument("--judge-temperature", type=float, default=0.0, help="judge sampling temperature (paper: 0, greedy)")
    g.add_argument("--judge-max-new-tokens", type=int, default=1024, help="tokens per judge turn (paper scale; not stated in the paper)")
    g.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=True,
                   help="decode every judge turn under its JSON schema (tool call or final answer); off = free text (difference 8)")
    g.add_argument("--max-turns", type=int, default=5, help="assistant-turn budget of the skill judge; plain judge: 1 (paper: 5, NOTES §2)")
    g.add_argument("--retries", type=int, default=1, help="retries after a reply with no valid tool call (paper: 1, NOTES §2)")
    g.add_argument("--max-resources", type=int, default=4, help="view_resource calls per sample (paper: 4, NOTES §2)")
    g.add_argument("--resource-chars", type=int, default=8000, help="characters returned per resource (paper: 8000, NOTES §2)")
    g.add_argument("--sandbox-timeout", type=float, default=3.0, help="python_sandbox wall-clock limit, s (paper: 3, NOTES §2)")
    g.add_argument("--sandbox-mem-mb", type=int, default=256, help="python_sandbox address-space limit, MiB")
    g.add_argument("--code-max-chars", type=int, default=1000,
                   help="longest code string of python_sandbox / run_verifier under --constrained (not in the paper)")
    g.add_argument("--judge-batch", type=int, default=16, help="judge prompts per generate call (memory)")
    g.add_argument("--judge-max-model-len", type=int, default=8192, help="vLLM context of the judge engine (SmolLM2: 8192)")
    g.add_argument("--show-trace", type=int, default=0, help="print the full judge trace of this many samples")
    g = p.add_argument_group("judge SFT warm-up (not in the paper; needed at 135M)")
    g.add_argument("--judge-sft-steps", type=int, default=0, help="SFT steps on scripted judge traces, per judge (0 = off; paper: no SFT)")
    g.add_argument("--judge-sft-batch", type=int, default=8, help="examples (whole scripted traces) per SFT step")
    g.add_argument("--judge-sft-items", type=int, default=16, help="SFT-split items per category (precise_if, math, focus)")
    g.add_argument("--judge-sft-micro-batch", type=int, default=1,
                   help="traces per forward/backward in the judge SFT (they run to ~1.4k tokens: 8 at once need >24 GiB on CPU)")
    g.add_argument("--judge-sft-lr", type=float, default=5e-5, help="AdamW learning rate of the judge SFT")
    g = p.add_argument_group("benchmark")
    g.add_argument("--bench", default=str(ROOT / "data/skill_rm/bench.jsonl"),
                   help="benchmark file; bon_pools.jsonl beside it (both written by data/skill_rm/prepare.py)")
    g.add_argument("--bench-per-cat", type=int, default=0, help="items per category to evaluate (0 = all)")
    g.add_argument("--methods", default="baseline,appended,python_only,skill_rm,oracle",
                   help="judges to compare (§5 ablations; oracle = scripted judge that knows the label, the upper bound)")
    g.add_argument("--formats", default="pairwise,best_of_4", help="benchmark readouts to run")
    g = p.add_argument_group("best-of-N (JETTS)")
    g.add_argument("--bon-prompts", type=int, default=0, help="prompts with a fixed candidate pool (0 = all)")
    g.add_argument("--bon-N", type=int, default=8, help="pool size N (paper: 10; our pools hold 8, difference 5)")
    g.add_argument("--bon-temperature", type=float, default=1.0, help="policy temperature for the pools")
    g.add_argument("--bon-seeds", type=int, default=1, help="seeded knockout orders averaged")
    g = p.add_argument_group("instruction-following RL (App. D)")
    g.add_argument("--rl-rewards", default="skill_rm,direct,anchored", help="reward variants to train and compare")
    g.add_argument("--rl-steps", type=int, default=200, help="GRPO steps per variant (paper scale; not stated in the paper)")
    g.add_argument("--rl-prompts", type=int, default=32, help="prompts per GRPO step (paper scale; not stated in the paper)")
    g.add_argument("--rl-eval-prompts", type=int, default=300, help="held-out instructions for checker evaluation (paper: 300, IFBench's test set)")
    g.add_argument("--rl-max-turns", type=int, default=7, help="skill judge turn budget in RL (paper: 7, NOTES §2)")
    g.add_argument("--skip-bench", action="store_true", help="skip the benchmark table")
    g.add_argument("--skip-bon", action="store_true", help="skip best-of-N")
    g.add_argument("--skip-rl", action="store_true", help="skip instruction-following RL")
    return p


# ----- skills: Reward-Evaluation Skill folders (Agent Skills convention, NOTES §2) -----

RESOURCE_TYPES = {"rubric", "principle", "calibration", "aggregation", "output_contract", "tool", "verifier"}
RESOURCE_KEYS = ("id", "type", "path", "applies_to", "cost", "hard_or_soft", "leakage_level", "allowed_setting")
LEAKAGE_LEVELS = {"none", "low", "oracle"}


class SkillError(ValueError):
    """A skill folder that cannot be loaded; the message says which file and what is wrong."""


@dataclass
class Skill:
    name: str
    description: str
    metadata: dict
    body: str                   # SKILL.md after the front matter: the procedure M_RM
    resources: list             # the resource index U_RM: list of dicts (RESOURCE_KEYS)
    folder: Path

    def resource(self, rid):
        return next((r for r in self.resources if r["id"] == rid), None)

    def index_text(self):
        """The resource index as the judge sees it after use_skill (oracle entries hidden)."""
        rows = [f"- {r['id']} ({r['type']}, {r['hard_or_soft']}, applies to {', '.join(map(str, r['applies_to']))})"
                for r in self.resources if r["leakage_level"] != "oracle"]
        return "\n".join(rows)


def load_skill(folder):
    """Load and validate one skill folder: SKILL.md with YAML front matter, resources.yaml, files."""
    folder = Path(folder)
    md = folder / "SKILL.md"
    if not md.is_file():
        raise SkillError(f"skill folder {folder}: SKILL.md is missing")
    text = md.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n(.*)$", text, re.S)
    if m is None:
        raise SkillError(f"{md}: no YAML front matter (the file must start with '---', the fields, then '---')")
    try:
        front = yaml.safe_load(m.group(1))
    except yaml.YAMLError as e:
        raise SkillError(f"{md}: front matter is not valid YAML: {str(e).splitlines()[0]}")
    if not isinstance(front, dict):
        raise SkillError(f"{md}: front matter must be a mapping with 'name' and 'description'")
    for key in ("name", "description"):
        if not isinstance(front.get(key), str) or not front[key].strip():
            raise SkillError(f"{md}: front matter field '{key}' is missing or empty")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", front["name"]):
        raise SkillError(f"{md}: name '{front['name']}' must be lowercase letters, digits, '_' or '-'")
    if front["name"] != folder.name:
        raise SkillError(f"{md}: name '{front['name']}' differs from the folder name '{folder.name}'")
    if not m.group(2).strip():
        raise SkillError(f"{md}: the procedure (body after the front matter) is empty")
    idx = folder / "resources.yaml"
    if not idx.is_file():
        raise SkillError(f"skill folder {folder}: resources.yaml (the resource index) is missing")
    try:
        entries = yaml.safe_load(idx.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError as e:
        raise SkillError(f"{idx}: not valid YAML: {str(e).splitlines()[0]}")
    if not isinstance(entries, list):
        raise SkillError(f"{idx}: must be a YAML list of resource entries")
    seen = set()
    for k, r in enumerate(entries):
        where = f"{idx}: entry {k}"
        if not isinstance(r, dict):
            raise SkillError(f"{where}: must be a mapping with keys {', '.join(RESOURCE_KEYS)}")
        where += f" ('{r.get('id')}')"
        missing = [key for key in RESOURCE_KEYS if key not in r]
        if missing:
            raise SkillError(f"{where}: missing key(s) {', '.join(missing)}")
        if r["id"] in seen:
            raise SkillError(f"{where}: duplicate id")
        seen.add(r["id"])
        if r["type"] not in RESOURCE_TYPES:
            raise SkillError(f"{where}: type '{r['type']}' is not one of {', '.join(sorted(RESOURCE_TYPES))}")
        if r["leakage_level"] not in LEAKAGE_LEVELS:
            raise SkillError(f"{where}: leakage_level '{r['leakage_level']}' is not one of {', '.join(sorted(LEAKAGE_LEVELS))}")
        if r["leakage_level"] == "oracle" and r["allowed_setting"] != "oracle_only":
            raise SkillError(f"{where}: an oracle resource must have allowed_setting: oracle_only")
        if not isinstance(r["applies_to"], list):
            r["applies_to"] = [r["applies_to"]]
        if not set(r.setdefault("arguments", [])) <= {"code"} or r["arguments"] and r["type"] not in ("tool", "verifier"):
            raise SkillError(f"{where}: arguments {r['arguments']} — only a tool or verifier may declare one, and only 'code'")
        p = (folder / str(r["path"])).resolve()
        if folder.resolve() not in p.parents:
            raise SkillError(f"{where}: path '{r['path']}' leaves the skill folder")
        if not p.is_file():
            raise SkillError(f"{where}: path '{r['path']}' does not exist")
        if r["type"] in ("tool", "verifier"):
            why = sandbox_static_check(p.read_text())
            if why is not None:
                raise SkillError(f"{where}: {r['path']} would be refused by python_sandbox: {why}")
    return Skill(front["name"], front["description"].strip(), front.get("metadata") or {}, m.group(2).strip(),
                 entries, folder)


def load_skills(skills_dir):
    """Every skill folder under skills_dir, by name; a broken folder stops the run with its error."""
    skills = {}
    for folder in sorted(Path(skills_dir).iterdir()) if Path(skills_dir).is_dir() else []:
        if folder.is_dir():
            s = load_skill(folder)
            skills[s.name] = s
    if not skills:
        raise SkillError(f"no skill folders found in {skills_dir}")
    return skills


# ----- judge tools: the tool-call text format and its tolerant parser -----
# One call per reply:  <tool_call>{"name": "view_resource", "arguments": {"id": "rubric"}}</tool_call>
TOOL_NAMES = ("use_skill", "view_resource", "python_sandbox", "run_verifier", "final_answer")
_MAIN_ARG = {"use_skill": "name", "view_resource": "id", "python_sandbox": "code", "run_verifier": "id"}


def _loads_lenient(s):
    """JSON, else JSON with single quotes / trailing commas fixed, else a Python literal; None if all fail."""
    for attempt in (s, re.sub(r",\s*([}\]])", r"\1", s)):
        try:
            return json.JSONDecoder().raw_decode(attempt)[0]
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; deep nesting recurses
            pass
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None


def _first_object(text):
    """The first {...} in text that parses (leniently), scanning every '{'; braces inside
    quoted strings ('...' or "...", with backslash escapes) do not count."""
    for m in re.finditer(r"\{", text):
        depth, end, quote, escaped = 0, None, None, False
        for j in range(m.start(), len(text)):
            ch = text[j]
            if quote:
                escaped, quote = (not escaped and ch == "\\"), (None if ch == quote and not escaped else quote)
                continue
            if ch in "\"'":
                quote = ch
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                end = j + 1
                break
        obj = _loads_lenient(text[m.start():end] if end else text[m.start():] + "}" * depth)
        if isinstance(obj, dict):
            return obj
    return None


def _normalise_call(obj):
    if not isinstance(obj, dict):
        return None
    name = obj.get("name") or obj.get("tool") or obj.get("function")
    if not isinstance(name, str) or name.strip() not in TOOL_NAMES:
        return None
    name = name.strip()
    args = obj.get("arguments", obj.get("args", obj.get("parameters", {k: v for k, v in obj.items() if k not in ("name", "tool", "function")})))
    if isinstance(args, str):
        parsed = _loads_lenient(args) if args.strip().startswith("{") else None
        args = parsed if isinstance(parsed, dict) else {_MAIN_ARG.get(name, "verdict"): args}
    if not isinstance(args, dict):
        args = {}
    return {"name": name, "arguments": args}


def parse_tool_call(text, allow_code_block=False):
    """The first tool call in a judge reply, as {"name", "arguments"}; None when there is none.

    Accepts, in order: `<tool_call>{json}</tool_call>` (closing tag optional, JSON
    repaired leniently), a bare JSON object with a tool "name", a Python-style call
    `final_answer(verdict="A")`, and (if allow_code_block) a ```python block as a
    python_sandbox call. Never raises."""
    if not isinstance(text, str):
        return None
    for m in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S):
        call = _normalise_call(_first_object(m.group(1)))
        if call:
            return call
    call = _normalise_call(_first_object(text))
    if call:
        return call
    m = re.search(r"\b(" + "|".join(TOOL_NAMES) + r")\s*\((.*?)\)\s*(?:$|\n)", text, re.S)
    if m:
        name, inner = m.group(1), m.group(2)
        try:
            node = ast.parse(f"f({inner})", mode="eval").body
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            if node.args and name in _MAIN_ARG:
                args.setdefault(_MAIN_ARG[name], ast.literal_eval(node.args[0]))
            elif node.args:
                args.setdefault("verdict", ast.literal_eval(node.args[0]))
            return {"name": name, "arguments": args}
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            pass
    if allow_code_block:
        m = re.search(r"```(?:python)?\n(.*?)(?:```|$)", text, re.S)
        if m and m.group(1).strip():
            return {"name": "python_sandbox", "arguments": {"code": m.group(1)}}
    return None


def parse_label(value, labels):
    """'A', '[[B]]', 'Assistant A', '(a)', 'tie' → a label among `labels` (or 'Tie'); else None."""
    if not isinstance(value, str):
        return None
    v = re.sub(r"[\[\]()*\"'.:]", " ", value).strip().upper()
    v = re.sub(r"^(ASSISTANT|RESPONSE|CANDIDATE|OPTION|ANSWER)\s+", "", v).strip()
    if v in ("TIE", "EQUAL", "SAME"):
        return "Tie"
    return v if v in tuple(labels) else None


def parse_text_verdict(text, labels):
    """Fallback for a reply with no tool call: MT-Bench's [[A]], else 'verdict/better: A'."""
    m = re.findall(r"\[\[\s*(" + "|".join(labels) + r"|Tie|tie)\s*\]\]", text or "")
    if m:
        return parse_label(m[-1], labels)
    # keywords in any case, the label itself only as a capital letter: "the better answer is a list"
    # must not read as verdict A (with re.I it did, a position bias towards A)
    m = re.findall(r"(?i:verdict|answer|choice|winner|better)\W{0,3}(?:(?i:is)\W{0,3})?(?:(?i:assistant|response) )?\(?\b("
                   + "|".join(labels) + r")\b", text or "")
    return m[-1] if m else None


def parse_text_rating(text, scale=10.0):
    """Direct-judge pointwise fallback: 'Rating: [[7]]' → 0.7; None if absent."""
    m = re.findall(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]", text or "") or re.findall(r"(?:rating|score)\W{0,3}(\d+(?:\.\d+)?)", text or "", re.I)
    return min(max(float(m[-1]) / scale, 0.0), 1.0) if m else None


# ----- judge decoding: every judge turn is decoded under a JSON schema -----

SCORE_GRID = [round(0.1 * k, 1) for k in range(11)]  # pointwise scores the judge may give: 0, 0.1, …, 1
FINAL_KEYS = ("verdict", "choice", "score")


def _object(props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


MAX_CHECKLIST = 6  # checklist form: satisfied_count ≤ total_count ≤ this (our prompts hold ≤ 3 constraints)


def final_schema(mode, K, checklist=False):
    """A final answer: {"verdict": "A"|"B"|"Tie"} (§3's pairwise readout has a tie), {"choice": "A".."D"}
    or {"score": 0..1} (on SCORE_GRID); checklist adds the form {"satisfied_count": s, "total_count": t}
    (§3's checklist readout, what the instruction-following skill asks for)."""
    if mode == "pointwise":
        score = _object({"score": {"enum": SCORE_GRID}})
        if not checklist:
            return score
        counts = [_object({"satisfied_count": {"enum": list(range(t + 1))}, "total_count": {"const": t}})
                  for t in range(1, MAX_CHECKLIST + 1)]
        return {"anyOf": [score] + counts}
    if mode == "pairwise":
        return _object({"verdict": {"enum": ["A", "B", "Tie"]}})
    return _object({"choice": {"enum": list(LABELS[:K])}})


def asks_checklist(task):
    """The loaded skill's procedure asks for the checklist form (instruction_following_pointwise)."""
    return task.mode == "pointwise" and task.skill is not None and "checklist" in task.skill.body


def turn_schema(task, skills, args):
    """The JSON schema of the judge's next reply.

    Plain judges and forced turns: the final answer itself. Tool turns: anyOf over the tool
    calls available now — use_skill before a skill is loaded; view_resource, python_sandbox
    and run_verifier after (python_only: python_sandbox from the start); final_answer always —
    with skill and resource ids enumerated. Code is a free string of ≤ --code-max-chars; a
    verifier takes the arguments its resource entry declares (`arguments: [code]`)."""
    final = final_schema(task.mode, len(task.candidates), asks_checklist(task))
    if task.method in ("baseline", "appended") or task.force:
        return final
    call = lambda name, arguments: _object({"name": {"const": name}, "arguments": arguments})
    code = {"type": "string", "maxLength": args.code_max_chars}
    calls = []
    if task.method == "python_only":
        calls.append(call("python_sandbox", _object({"code": code})))
    elif task.skill is None:
        calls.append(call("use_skill", _object({"name": {"enum": sorted(skills)}})))
    else:
        open_ = [r for r in task.skill.resources if r["leakage_level"] != "oracle" and r["allowed_setting"] != "oracle_only"]
        views = [r["id"] for r in open_ if r["type"] not in ("tool", "verifier")]
        if views and task.n_viewed < args.max_resources:
            calls.append(call("view_resource", _object({"id": {"enum": views}})))
        calls.append(call("python_sandbox", _object({"code": code})))
        for r in open_:
            if r["type"] in ("tool", "verifier"):
                calls.append(call("run_verifier", _object({"id": {"const": r["id"]}})))
                if "code" in r.get("arguments", []):
                    calls.append(call("run_verifier", _object({"id": {"const": r["id"]}, "code": code})))
    calls.append(call("final_answer", final))
    return {"anyOf": calls}


# ----- the judge: prompts, tool execution, bounded multi-turn loop -----

SKILL_METHODS = ("skill_rm", "oracle")  # judges that see the skills (the oracle is scripted, for the upper bound)

LABELS = "ABCDEFGHIJ"
CRITERIA = ("helpfulness, relevance, accuracy, depth, creativity and level of detail, and whether every "
            "instruction of the user is followed")


def format_candidates(prompt, candidates):
    """MT-Bench / RewardBench style layout; K = 1 is a single response."""
    if len(candidates) == 1:
        return f"[User Question]\n{prompt}\n\n[The Start of the Response]\n{candidates[0]}\n[The End of the Response]"
    parts = [f"[User Question]\n{prompt}\n"]
    for lab, c in zip(LABELS, candidates):
        parts.append(f"[The Start of Assistant {lab}'s Answer]\n{c}\n[The End of Assistant {lab}'s Answer]\n")
    return "\n".join(parts)


def final_example(mode, K):
    """The final answer's shape in words, as every judge's prompt states it (the schema of final_schema)."""
    if mode == "pointwise":
        return '{"score": S} with S from 0 to 1 (satisfied constraints / all constraints, e.g. 0.7)'
    if mode == "pairwise":
        return '{"verdict": "A"} if A is better, {"verdict": "B"} if B is better, {"verdict": "Tie"} if neither is'
    return '{"choice": "X"} where X is one of ' + ", ".join(LABELS[:K])


def contract_text(mode, K):
    """The benchmark contract: what final answer the judge must give (B.3)."""
    return "final_answer " + final_example(mode, K)


def plain_system_prompt(mode, K):
    """Direct LLM-as-a-judge prompt (MT-Bench / RewardBench2 wording, B.3), one turn."""
    if mode == "pointwise":
        return ("Please act as an impartial judge and evaluate how well the response follows every instruction "
                "of the user. Be as objective as possible. Give the share of the instructions that the response "
                'follows as a score from 0 to 1, strictly in this format: {"score": 0.7}.')
    return ("Please act as an impartial judge and evaluate the quality of the responses provided by AI assistants "
            f"to the user question displayed below. Choose the assistant that follows the user's instructions and "
            f"answers the question better, considering {CRITERIA}. Avoid any position biases; do not let the length "
            "of the responses or the names of the assistants influence you. Be as objective as possible. Output "
            "your final verdict by strictly following this format: " + final_example(mode, K) + ".")


def tool_system_prompt(mode, K, skills, method):
    """Skill-RM system prompt (B.3, B.5): only use_skill and final_answer until a skill is loaded."""
    lines = ["You are a reward judge. Evaluate the visible text only. You act by calling tools, exactly one per reply, "
             'in this format:\n{"name": "TOOL", "arguments": {...}}',
             f"You must finish with {contract_text(mode, K)}.", "Tools:"]
    if method in SKILL_METHODS:
        lines.append('- use_skill {"name": SKILL}: load one Reward-Evaluation Skill (its procedure and resource index). '
                     "Use it for constraints, code or math checks, or close calls. At most one skill.")
    if method == "python_only":
        lines.append('- python_sandbox {"code": CODE}: run Python; variables prompt and candidates are set; print results.')
    lines.append(f"- final_answer: your judgment, e.g. {contract_text(mode, K).split('final_answer ')[1]}")
    if method in SKILL_METHODS:
        lines.append("Available skills (name: description):")
        lines += [f"- {s.name}: {s.description}" for s in skills.values()]
    return "\n".join(lines)


def appended_resources(skill, resource_chars):
    """Ablation 'resources appended': the skill's procedure and every non-oracle resource pasted in the prompt."""
    parts = [f"Evaluation resources ({skill.name}):", skill.body]
    for r in skill.resources:
        if r["leakage_level"] != "oracle":
            parts.append(f"## {r['id']} ({r['type']})\n" + (skill.folder / r["path"]).read_text()[:resource_chars])
    return "\n\n".join(parts)


def default_skill(mode, skills):
    """The skill a mode uses when one must be fixed (appended ablation): the one listing the mode first."""
    ranked = [(s.metadata.get("modes", []).index(mode), name) for name, s in skills.items() if mode in s.metadata.get("modes", [])]
    return skills[min(ranked)[1]] if ranked else next(iter(skills.values()))


@dataclass
class JudgeTask:
    """One judgment: K candidates for one prompt, judged by one method; keeps the whole trace."""
    prompt: str
    candidates: list
    mode: str                   # pointwise (K = 1) | pairwise (K = 2) | selection (K ≥ 2)
    method: str                 # baseline | appended | python_only | skill_rm | oracle (scripted, knows the label)
    label: object = None        # the correct final answer ("A", "C", 0.7); only the oracle judge reads it
    category: str = ""          # benchmark category (picks the oracle's verifier)
    scripted: bool = False      # replies come from scripted_reply (the oracle; SFT traces), not from a model
    messages: list = field(default_factory=list)
    schemas: list = field(default_factory=list)  # the JSON schema of each assistant turn (under --constrained)
    trace: list = field(default_factory=list)
    skill: object = None        # the loaded Skill, if any
    n_viewed: int = 0
    retries_left: int = 1
    force: bool = False         # the next reply must be final_answer
    force_asked: bool = False
    done: bool = False
    judgment: object = None     # final structured judgment (dict) or None (invalid)
    turns: int = 0
    tool_calls: int = 0


def execute_tool(task, call, skills, args):
    """Run one tool call of the judge; returns the observation text (never raises)."""
    name, a = call["name"], call["arguments"]
    loaded = task.skill is not None
    tools = {"final_answer"}
    if task.method in SKILL_METHODS:
        tools |= {"use_skill"} | ({"view_resource", "python_sandbox", "run_verifier"} if loaded else set())
    if task.method == "python_only":
        tools |= {"python_sandbox"}
    if name not in tools:
        return f"error: tool '{name}' is not available now. Available: {', '.join(sorted(tools))}."
    if name == "use_skill":
        if loaded:
            return f"error: skill '{task.skill.name}' is already loaded (at most one skill per sample)."
        want = str(a.get("name", "")).strip()
        match = skills.get(want) or next((s for s in skills.values() if want and want in s.name), None)
        if match is None:
            return f"error: no skill named '{want}'. Skills: {', '.join(skills)}."
        task.skill = match
        return (f"Skill {match.name} loaded.\n{match.body}\n\nResources (view_resource {{\"id\": ID}}, at most "
                f"{args.max_resources}):\n{match.index_text()}\n\nNew tools: view_resource {{\"id\": ID}}; "
                'run_verifier {"id": ID} runs a verifier or tool resource over the prompt and candidates and prints '
                'its report ({"id": ID, "code": EXTRA} runs your extra code after it); python_sandbox {"code": CODE} '
                "(variables prompt, candidates, response).")
    if name == "view_resource":
        r = task.skill.resource(str(a.get("id", "")).strip())
        if r is None:
            return f"error: no resource '{a.get('id')}'. Resources:\n{task.skill.index_text()}"
        if r["leakage_level"] == "oracle" or r["allowed_setting"] == "oracle_only":
            return f"refused: resource '{r['id']}' is oracle-only (leakage-gated) and cannot be viewed."
        if task.n_viewed >= args.max_resources:
            return f"refused: at most {args.max_resources} resources per sample."
        task.n_viewed += 1
        return (task.skill.folder / r["path"]).read_text(errors="replace")[:args.resource_chars]
    if name in ("python_sandbox", "run_verifier"):
        code = str(a.get("code", ""))
        if args.constrained and len(code) > args.code_max_chars:  # vLLM's grammar cannot bound it (plumbing.xgrammar_schema)
            return f"refused: code longer than {args.code_max_chars} characters."
        if name == "run_verifier":
            r = task.skill.resource(str(a.get("id", "")).strip())
            if r is None or r["type"] not in ("verifier", "tool"):
                return f"error: '{a.get('id')}' is not a verifier of skill {task.skill.name}."
            if r["leakage_level"] == "oracle" or r["allowed_setting"] == "oracle_only":
                return f"refused: verifier '{r['id']}' is oracle-only (leakage-gated) and cannot be run."
            code = (task.skill.folder / r["path"]).read_text() + "\n" + code
        variables = {"prompt": task.prompt, "candidates": task.candidates,
                     "sample": {"prompt": task.prompt, "candidates": task.candidates},
                     "response": task.candidates[0]}
        res = run_sandboxed(code, args.sandbox_timeout, args.sandbox_mem_mb, variables)
        out = res["stdout"][-1500:]
        return f"stdout:\n{out}" + (f"\nerror: {res['error']}" if res["error"] else "")
    return "ok"


def judge_step(task, text, skills, args, labels):
    """Consume one judge reply: parse, run the tool, append the observation; set done/judgment."""
    task.turns += 1
    task.messages.append({"role": "assistant", "content": text})
    if task.method in ("baseline", "appended"):  # one turn: the final answer, a final_answer call or a text verdict
        call = parse_tool_call(text)
        task.judgment = call["arguments"] if call and call["name"] == "final_answer" else text_judgment(text, task.mode, labels)
        task.trace.append({"turn": task.turns, "action": text, "call": call, "observation": None})
        task.done = True
        return
    call = parse_tool_call(text, allow_code_block=task.skill is not None or task.method == "python_only")
    if call is None:
        obs = None
        if task.force:  # the forced final turn: last chance, parse the text
            task.judgment, task.done = text_judgment(text, task.mode, labels), True
        elif task.retries_left > 0:
            task.retries_left -= 1
            obs = 'error: no valid tool call. Reply with exactly one {"name": ..., "arguments": {...}}.'
        else:
            task.force = True
        task.trace.append({"turn": task.turns, "action": text, "call": None, "observation": obs})
        if obs:
            task.messages.append({"role": "user", "content": obs})
        return
    task.tool_calls += 1
    if call["name"] == "final_answer":
        task.judgment, task.done = call["arguments"], True
        task.trace.append({"turn": task.turns, "action": text, "call": call, "observation": None})
        return
    obs = execute_tool(task, call, skills, args)
    if task.force:  # a non-final call on the forced turn: no judgment
        task.done = True
    task.trace.append({"turn": task.turns, "action": text, "call": call, "observation": obs})
    task.messages.append({"role": "user", "content": f"<tool_response>\n{obs}\n</tool_response>"})


def text_judgment(text, mode, labels):
    """A judgment from a reply that is no tool call: the bare final answer {"verdict": "A"} (what
    constrained decoding gives), else plain text ([[A]], 'score: 0.8'); None if nothing parses.
    Scores are on the contract's 0-1 scale for every judge."""
    obj = _first_object(text or "")
    if isinstance(obj, dict) and any(k in obj for k in FINAL_KEYS):
        return obj
    if mode == "pointwise":
        s = parse_text_rating(text, 1.0)
        return {"score": s} if s is not None else None
    v = parse_text_verdict(text, labels)
    return {"verdict": v} if v else None


def run_judges(sampler, tok, tasks, skills, args, max_turns):
    """Run every task's judge to completion, batched turn by turn. `sampler`: one judge model,
    or a dict {method: sampler, "default": sampler} when the methods have their own (SFT) judges;
    the oracle method's replies come from `scripted_reply`, not from a model.

    Plain methods (baseline, appended) get one turn. Tool methods get `max_turns`
    turns, `args.retries` retries after a reply with no valid call, then one forced
    turn that must be final_answer (NOTES §2)."""
    for t in tasks:
        K = len(t.candidates)
        if t.method in ("baseline", "appended"):
            system = plain_system_prompt(t.mode, K)
            if t.method == "appended":
                system += "\n\n" + appended_resources(default_skill(t.mode, skills), args.resource_chars)
        else:
            system = tool_system_prompt(t.mode, K, skills, t.method)
        t.messages = [{"role": "system", "content": system},
                      {"role": "user", "content": format_candidates(t.prompt, t.candidates)}]
        t.retries_left = args.retries
    for turn in range(max_turns + 1):
        active = [t for t in tasks if not t.done]
        if not active:
            break
        for t in active:
            if t.method in ("baseline", "appended"):
                continue
            if (turn == max_turns or t.force) and not t.force_asked:
                t.force = t.force_asked = True
                t.messages.append({"role": "user", "content": "Budget used up: call final_answer now, "
                                   + contract_text(t.mode, len(t.candidates)).split("final_answer ")[1] + "."})
        for t in active:  # every reply's schema, scripted ones too (judge_sft leaves what it forces out of the loss)
            t.schemas.append(turn_schema(t, skills, args) if args.constrained else None)
        replies = {id(t): scripted_reply(t, skills) for t in active if t.scripted or t.method == "oracle"}
        by_sampler = {}  # one batched generate per judge model
        for t in active:
            if id(t) not in replies:
                s = sampler.get(t.method, sampler.get("default")) if isinstance(sampler, dict) else sampler
                by_sampler.setdefault(id(s), (s, []))[1].append(t)
        for s, group in by_sampler.values():
            prompts = [chat_ids(tok, t.messages) for t in group]
            # vLLM: code strings unbounded in the grammar (plumbing.xgrammar_schema); execute_tool bounds them
            schemas = [xgrammar_schema(t.schemas[-1]) if isinstance(s, VLLMSampler) else t.schemas[-1]
                       for t in group] if args.constrained else None
            outs = s.generate(prompts, 1, args.judge_max_new_tokens, args.judge_temperature, stop=["</tool_call>"],
                              json_schema=schemas)
            replies.update({id(t): o[0].text for t, o in zip(group, outs)})
        for t in active:
            judge_step(t, replies[id(t)], skills, args, LABELS[:len(t.candidates)])
    for t in tasks:  # a task still open here ran out of turns without a final answer
        t.done = True
    return tasks


def judge_on_ranks(sampler, tok, tasks, skills, args, max_turns, dist=None):
    """run_judges with the tasks dealt over the ranks (task i on rank i mod world); returns every judged
    task, in the given order, on every rank (under torchrun; the tasks themselves for one process)."""
    dist = dist or Dist()
    done = gather_objects(run_judges(sampler, tok, tasks[dist.rank::dist.world], skills, args, max_turns), dist)
    order = [i for r in range(dist.world) for i in range(r, len(tasks), dist.world)]  # gathered in rank order
    return [t for _, t in sorted(zip(order, done), key=lambda x: x[0])]


def format_trace(task):
    """The whole trace of one judgment, for printing."""
    out = [f"=== {task.method} judge, mode {task.mode}, K={len(task.candidates)}, turns {task.turns}, "
           f"skill {task.skill.name if task.skill else '-'}, resources viewed {task.n_viewed} ==="]
    for step in task.trace:
        out.append(f"[turn {step['turn']}] action: {step['action'].strip()[:600]}")
        if step["call"]:
            out.append(f"   parsed call: {json.dumps(step['call'])[:300]}")
        if step["observation"]:
            out.append(f"   observation: {step['observation'].strip()[:600]}")
    out.append(f"final judgment: {json.dumps(task.judgment)[:400]}")
    return "\n".join(out)


# --- the scripted judge: the oracle upper bound of the tables and the SFT traces ---

def oracle_skill(task):
    """The skill the scripted judge loads: the instruction-following skill for instructions with
    constraints (any mode), the fair judge otherwise."""
    if task.mode == "pointwise" or task.category == "precise_if":
        return "instruction_following_pointwise"
    return "reward_judge_fair"


def oracle_verifier(task):
    """The verifier the scripted judge runs for a task (None: no checker applies, e.g. code);
    "python_sandbox": it writes the check itself (MATH_CHECK_CODE). Math and focus items share their
    arithmetic prompts, so both get the sandbox, as the fair skill's step 3 says: one tool per prompt
    kind, or the SFT judge learns whichever tool its traces use more often."""
    if oracle_skill(task) == "instruction_following_pointwise":
        return "text_checks"
    return "python_sandbox" if task.category in ("math", "focus") else None


# the scripted judge's own check of an arithmetic item: recompute the sum, name the candidates whose last number matches
MATH_CHECK_CODE = ("import re\n"
                   "e = prompt.split(':')[1].split('=')[0]\n"
                   "v = str(sum(int(t.replace(' ', '')) for t in re.findall(r'[-+]? *\\d+', e)))\n"
                   "print(v, 'matches:', [l for l, c in zip('ABCD', candidates) if re.findall(r'-?\\d+', c)[-1:] == [v]])")


def scripted_final(task):
    """The known label as a final answer; a checklist label {"satisfied_count", "total_count"} becomes
    a score where the schema has no checklist form (plain judges)."""
    if isinstance(task.label, dict):
        if asks_checklist(task):
            return dict(task.label)
        return {"score": round(task.label["satisfied_count"] / max(task.label["total_count"], 1), 1)}
    return {{"pointwise": "score", "pairwise": "verdict"}.get(task.mode, "choice"): task.label}


def scripted_reply(task, skills):
    """The scripted judge: use_skill → run_verifier or python_sandbox (math) → final_answer with the
    known label (plain methods: the final answer at once). The oracle upper bound of the tables and
    the SFT traces."""
    if task.method in ("baseline", "appended") or task.force:
        return json_text(scripted_final(task))  # compact, as the turn schema decodes it (plumbing.json_text)
    if task.skill is None:
        return json_text({"name": "use_skill", "arguments": {"name": oracle_skill(task)}})
    ran = any(step["call"] and step["call"]["name"] in ("run_verifier", "python_sandbox") for step in task.trace)
    check = oracle_verifier(task)
    if not ran and check == "python_sandbox":
        return json_text({"name": "python_sandbox", "arguments": {"code": MATH_CHECK_CODE}})
    if not ran and check and task.skill.resource(check):
        return json_text({"name": "run_verifier", "arguments": {"id": check}})
    return json_text({"name": "final_answer", "arguments": scripted_final(task)})


# ----- rewards: §3 deterministic readout, App. D reward variants -----

def _num(x):
    """A judgment's number (7, 0.7, "3/4", "70%") as a finite float; None for anything else: a bool, a
    string that is no number, NaN/inf, or an int too large for a float ({"score": 10**400})."""
    if isinstance(x, bool):
        return None
    try:
        if isinstance(x, (int, float)):
            v = float(x)  # OverflowError for an int beyond the float range
        elif isinstance(x, str) and (m := re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)|(%))?\s*", x)):
            v, den = float(m.group(1)), float(m.group(2) or 1)
            v = (v / den if den else math.nan) / (100 if m.group(3) else 1)
        else:
            return None
    except (OverflowError, ValueError):
        return None
    return v if math.isfinite(v) else None


def readout_pointwise(judgment):
    """§3, K = 1: clamp₀¹(score); else satisfied/total of the checklist (total 0 → 1.0);
    unparseable → 0.5 flagged invalid. Returns (reward, valid)."""
    if not isinstance(judgment, dict):
        return 0.5, False
    s = _num(judgment.get("score"))
    if s is not None:
        # r = clamp(score, 0, 1)
        return min(max(s, 0.0), 1.0), True
    sat, tot = _num(judgment.get("satisfied_count")), _num(judgment.get("total_count"))
    items = judgment.get("checklist")
    if (sat is None or tot is None) and isinstance(items, list):
        flags = [it.get("satisfied") for it in items if isinstance(it, dict)]
        flags = [f if isinstance(f, bool) else str(f).strip().lower() in ("true", "yes", "1") for f in flags]
        sat, tot = float(sum(flags)), float(len(flags))
    if sat is None or tot is None:
        return 0.5, False
    # r = satisfied / total  (no constraints → 1.0)
    return (min(max(sat / tot, 0.0), 1.0) if tot > 0 else 1.0), True


def judgment_label(judgment, labels):
    """The verdict/choice of a final_answer judgment among labels (+ 'Tie'), or None."""
    if not isinstance(judgment, dict):
        return None
    for key in ("verdict", "choice", "winner", "answer", "better", "best"):
        if key in judgment:
            return parse_label(str(judgment[key]), labels)
    return None


def readout_pairwise(verdict_chosen_first, verdict_chosen_second):
    """§3, K = 2, both presentation orders: +1 per order that prefers the chosen, −1 per
    order that prefers the rejected, 0 for Tie/invalid; the pair is won iff the sum > 0.
    Order 1 shows the chosen as A, order 2 as B."""
    per = [{"A": 1, "B": -1}.get(verdict_chosen_first, 0), {"B": 1, "A": -1}.get(verdict_chosen_second, 0)]
    return {"win": float(sum(per) > 0), "sum": sum(per),
            "valid": float(verdict_chosen_first in ("A", "B", "Tie") and verdict_chosen_second in ("A", "B", "Tie")),
            "consistent": float(sum(per) != 0 and 0 not in per)}


def readout_selection(choice, correct, K):
    """§3, K ≥ 2 (RewardBench2 best-of-4): 1 if the pick is the chosen answer, 0 for another
    valid pick, 1/K (0.25 for K = 4) if the judgment is invalid."""
    labels = tuple("ABCDEFGHIJ"[:K])
    if choice not in labels:
        return 1.0 / K
    return 1.0 if choice == correct else 0.0


def anchored_pairwise_reward(verdict, rollout_label):
    """App. D ablation: the rollout vs. a fixed reference response: win 1, loss 0, failure/tie 0.5."""
    if verdict not in ("A", "B"):
        return 0.5
    return 1.0 if verdict == rollout_label else 0.0


RL_VARIANTS = ("skill_rm", "direct", "anchored")


def judge_rewards(judge_sampler, tok, prompts, responses, variant, skills, args, anchors=None, seed=0):
    """App. D rewards for policy responses. skill_rm: pointwise Skill-RM score; direct: one-turn
    LLM-judge rating; anchored: Skill-RM pairwise against a fixed reference (random A/B order).
    Returns (rewards, valid flags, tasks)."""
    if variant not in RL_VARIANTS:
        raise ValueError(f"unknown RL reward variant '{variant}' (one of {', '.join(RL_VARIANTS)})")
    if variant == "anchored":
        rng = random.Random(seed)
        flips = [rng.random() < 0.5 for _ in responses]  # True: the rollout is shown as B
        tasks = [JudgeTask(p, [a, r] if f else [r, a], "pairwise", "skill_rm")
                 for p, r, a, f in zip(prompts, responses, anchors, flips)]
    else:
        tasks = [JudgeTask(p, [r], "pointwise", "skill_rm" if variant == "skill_rm" else "baseline")
                 for p, r in zip(prompts, responses)]
    run_judges(judge_sampler, tok, tasks, skills, args, args.rl_max_turns)
    rewards, valid = [], []
    for k, t in enumerate(tasks):
        if variant == "anchored":
            v = judgment_label(t.judgment, "AB")
            rewards.append(anchored_pairwise_reward(v, "B" if flips[k] else "A"))
            valid.append(v in ("A", "B"))
        else:
            r, ok = readout_pointwise(t.judgment)  # invalid → 0.5 (NOTES §2)
            rewards.append(r)
            valid.append(ok)
    return rewards, valid, tasks


# ----- judge SFT warm-up (not in the paper; difference 9) -----

def judge_sft_tasks(items, method, seed):
    """Scripted judge tasks on the SFT split: each item pairwise (random order), best-of-4 (random
    permutation) and, for precise_if, pointwise on the chosen and on one rejected answer."""
    rng, tasks = random.Random(seed), []
    for it in items:
        flip = rng.random() < 0.5
        pair = [it["rejected"][0], it["chosen"]] if flip else [it["chosen"], it["rejected"][0]]
        tasks.append(JudgeTask(it["prompt"], pair, "pairwise", method, "AB"[flip], it["category"], scripted=True))
        perm = rng.sample(range(4), 4)
        cands = [it["chosen"]] + it["rejected"][:3]
        tasks.append(JudgeTask(it["prompt"], [cands[i] for i in perm], "selection", method, LABELS[perm.index(0)],
                               it["category"], scripted=True))
        if it["category"] == "precise_if":
            for r in (it["chosen"], it["rejected"][0]):
                checks = constraint_scores(it["meta"]["constraints"], r)["checks"]
                label = {"satisfied_count": sum(checks), "total_count": len(checks)}  # the checklist form
                tasks.append(JudgeTask(it["prompt"], [r], "pointwise", method, label, it["category"], scripted=True))
    return tasks


def trace_examples(tok, messages, schemas=None, grammar=None):
    """A judge trace as SFT examples (prompt_ids, target_ids, mask): the whole conversation after its first
    user turn is one target, trained on the judge's replies (+ end of turn, mask 1) and not on the tool
    observations and chat markup between them (mask 0). Each reply is tokenised as the sampler generated
    it (after chat_ids of the conversation before it); where the template does not extend the tokens so far
    (a chat template that rewrites earlier turns), the trace is cut there and a new example begins.
    With a GrammarReplay and the schema of each assistant turn, the tokens whose text that schema fixed are
    mask 0 too (GrammarReplay.decided): under constrained decoding they are no decision of the judge."""
    out, seq, n0, mask = [], [], 0, []
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for j, k in enumerate(turns):
        prefix, reply = chat_ids(tok, messages[:k]), tok.encode(messages[k]["content"], add_special_tokens=False) + [tok.eos_token_id]
        schema = schemas[j] if schemas and j < len(schemas) else None
        if seq and prefix[:len(seq)] == seq:
            mask += [0] * (len(prefix) - len(seq))  # the observation and markup since the last reply
        else:
            if seq:
                out.append((seq[:n0], seq[n0:], mask))
            n0, mask = len(prefix), []
        seq = prefix + reply
        mask += grammar.decided(schema, reply) if grammar is not None and schema is not None else [1] * len(reply)
    if seq:
        out.append((seq[:n0], seq[n0:], mask))
    return out


def judge_sft(judge, tok, skills, args, dist, method):
    """SFT warm-up of one judge on scripted traces (use_skill → run_verifier → final_answer with the
    known label for skill_rm; the final answer alone for the plain judge), from sft_items — a split
    the benchmark, pools and RL prompts never use. Every judge gets the same steps × examples.
    Returns a new bf16 judge; `judge` is left as it is."""
    tasks = judge_sft_tasks(sft_items(args.seed, args.judge_sft_items), method, args.seed)
    run_judges(None, tok, tasks, skills, args, args.max_turns)
    grammar = GrammarReplay(tok, unwrap(judge).config.vocab_size) if args.constrained else None
    examples = [e for t in tasks for e in trace_examples(tok, t.messages, t.schemas, grammar)]
    model = copy.deepcopy(judge).to(torch.float32 if args.precision == "fp32" else torch.bfloat16).train().requires_grad_(True)
    sft_loop(model, examples, args, dist, args.judge_sft_lr, args.judge_sft_batch, args.judge_sft_steps, seed=args.seed,
             log_dir=Path(args.run_dir) / f"judge_sft_{method}", micro_batch=args.judge_sft_micro_batch)
    return model.to(torch.bfloat16).eval().requires_grad_(False)


# ----- training loop: instruction-following GRPO (App. D) -----

def policy_prompt_ids(tok, prompts):
    return [chat_ids(tok, [{"role": "user", "content": p}]) for p in prompts]


def train_if_policy(variant, policy, tok, sampler, judge_sampler, skills, args, dist, anchors_by_prompt, train_set):
    """GRPO on verifiable instructions with one reward variant; the checkers only log, never reward."""
    ref = load_model(args.model, dist, args.dtype, trainable=False)[0] if args.beta > 0 else None
    opt = make_optimizer(policy, args)
    run_dir, seen, group_sds = Path(args.run_dir) / f"rl_{variant}", [], []
    for step in range(args.rl_steps):
        t0 = time.time()
        batch = train_set[step * args.rl_prompts:(step + 1) * args.rl_prompts][dist.rank::dist.world]  # this rank's prompts
        rollouts = sample_group_rollouts(sampler, policy_prompt_ids(tok, [b["prompt"] for b in batch]), args.G, args)
        prompts = [batch[r.group]["prompt"] for r in rollouts]
        rewards, valid, tasks = judge_rewards(judge_sampler, tok, prompts, [r.text for r in rollouts], variant, skills, args,
                                              [anchors_by_prompt[p] for p in prompts], seed=args.seed * 7919 + step)
        for r, rw in zip(rollouts, rewards):
            r.reward = rw
        t_judge = time.time() - t0
        metrics = grpo_update(policy, ref, opt, rollouts, args, dist)
        sampler.sync(policy)
        hidden = [constraint_scores(batch[r.group]["constraints"], r.text) for r in rollouts]
        groups = {}
        for r in rollouts:
            groups.setdefault(r.group, []).append(r.reward)
        # within-group sd of the reward: the signal GRPO's advantage needs (0 → no update)
        sd = [(sum((x - sum(g) / len(g)) ** 2 for x in g) / len(g)) ** 0.5 for g in groups.values()]
        group_sds += sd
        metrics.update(reduce_metrics(dict(  # means over the ranks
            reward_group_sd=sum(sd) / len(sd), judge_valid=float(sum(valid) / len(valid)), checker_strict=sum(h["all"] for h in hidden) / len(hidden),
            checker_loose=sum(h["frac"] for h in hidden) / len(hidden),
            judge_turns=sum(t.turns for t in tasks) / len(tasks), time_judge=t_judge, time_step=time.time() - t0), dist))
        log_metrics(run_dir, step, metrics, dist, keys=("reward", "reward_group_sd", "judge_valid", "checker_strict", "time_step"))
        seen.append(metrics)
    return run_dir, {k: sum(m[k] for m in seen) / max(len(seen), 1) for k in ("reward", "reward_group_sd", "judge_valid")} | \
        {"group_sds": group_sds, "null_group_sd": null_group_sd(variant, args.G)}


def null_group_sd(variant, G):
    """The within-group reward sd a judge with no signal gives. Anchored pairwise: a position-locked
    judge (always "A") with the rollout shown at a random side pays 1 with probability ½ per rollout,
    so E[sd] = Σ_k C(G,k) 2^-G √(k/G · (1 − k/G)) (0.404 at G = 4). Pointwise: a constant score, sd 0."""
    if variant != "anchored":
        return 0.0
    return sum(math.comb(G, k) / 2 ** G * (k / G * (1 - k / G)) ** 0.5 for k in range(G + 1))


# ----- evaluation -----

# --- §5 reward-modelling benchmark: pairwise (both orders) and best-of-4 ---

def select_items(items, per_cat, seed=0):
    """per_cat items of each category drawn with the run's seed (0 or more than there are = all), so
    seeded runs judge different items; categories in a fixed order."""
    cats = {}
    for it in items:
        cats.setdefault(it["category"], []).append(it)
    pick = lambda c, xs: random.Random(f"select-{seed}-{c}").sample(xs, per_cat) if 0 < per_cat < len(xs) else xs
    return [it for c in sorted(cats) for it in pick(c, cats[c])]


def benchmark_tasks(items, methods, formats, seed):
    """Judge tasks for every (item, method, format): pairwise in both orders; best-of-4 with a seeded shuffle."""
    tasks, meta = [], []
    for it in items:
        for method in methods:
            if "pairwise" in formats:
                for order in (0, 1):  # order 0: chosen shown as A; order 1: chosen shown as B
                    cands = [it["chosen"], it["rejected"][0]] if order == 0 else [it["rejected"][0], it["chosen"]]
                    tasks.append(JudgeTask(it["prompt"], cands, "pairwise", method, label="AB"[order], category=it["category"]))
                    meta.append((it["id"], it["category"], method, "pairwise", order))
            if "best_of_4" in formats:
                cands = [it["chosen"]] + it["rejected"][:3]
                perm = random.Random(f"{seed}-{it['id']}").sample(range(4), 4)
                tasks.append(JudgeTask(it["prompt"], [cands[i] for i in perm], "selection", method,
                                       label=LABELS[perm.index(0)], category=it["category"]))
                meta.append((it["id"], it["category"], method, "best_of_4", LABELS[perm.index(0)]))
    return tasks, meta


CODE_TOOLS = ("python_sandbox", "run_verifier")  # the calls that run code in the sandbox


def tool_counts(task):
    """{tool name: calls} over one judgment's trace."""
    out = {}
    for step in task.trace:
        if step["call"]:
            out[step["call"]["name"]] = out.get(step["call"]["name"], 0) + 1
    return out


def code_result_used(task):
    """Did the final answer follow the last code run (python_sandbox or run_verifier)? True when the
    final label is among the candidates its report names ("matches: ['A']", "most constraints pass:
    tie (A, B)") or the final score is the one it reports ("A: 2 of 3 pass; score 0.7"); None when no
    code ran or the report names no candidate and no score."""
    runs = [st for st in task.trace if st["call"] and st["call"]["name"] in CODE_TOOLS and st["observation"]]
    if not runs or task.judgment is None:
        return None
    obs = runs[-1]["observation"]
    if task.mode == "pointwise":
        r, ok = readout_pointwise(task.judgment)
        said = [int(a) / int(b) for a, b in re.findall(r"(\d+) of (\d+) pass", obs) if int(b)]
        said += [float(x) for x in re.findall(r"score (\d+(?:\.\d+)?)", obs)]
        return ok and any(abs(r - x) < 0.051 for x in said) if said else None
    labels = LABELS[:len(task.candidates)]
    named = set()
    for line in obs.splitlines():
        if re.search(r"match\w*|most constraints pass", line) and ":" in line:
            named |= set(re.findall(r"\b([" + labels + r"])\b", line.rsplit(":", 1)[1]))
            named |= {"Tie"} if "tie" in line.rsplit(":", 1)[1].lower() else set()
    if not named:
        return None
    return judgment_label(task.judgment, labels) in named


def score_benchmark(tasks, meta):
    """Per (method, format, category): accuracy (`score`), invalid rate, and for pairwise the §3 both-order
    readout's `consistent` (both orders prefer the same answer: 0 for a position-locked judge) and the
    per-order accuracies `order_A` / `order_B` (the chosen shown first / second); mean turns, skill
    loads, resources viewed, tool calls (per tool: `calls_<name>`), and `code_used`: how often the final
    answer follows the last code run's report (over the judgments whose code named a candidate or a
    score; nan when none). `items`: {item id: score}, for pairing methods over items."""
    acc, pending = {}, {}
    for t, (iid, cat, method, fmt, extra) in zip(tasks, meta):
        key = (method, fmt, cat)
        row = acc.setdefault(key, {"score": [], "valid": [], "turns": [], "skill": [], "viewed": [], "calls": [],
                                   **{f"calls_{n}": [] for n in TOOL_NAMES}, "code_used": [], "items": {}})
        row["turns"].append(t.turns), row["skill"].append(float(t.skill is not None))
        row["viewed"].append(t.n_viewed), row["calls"].append(t.tool_calls)
        counts = tool_counts(t)
        for n in TOOL_NAMES:
            row[f"calls_{n}"].append(counts.get(n, 0))
        used = code_result_used(t)
        if used is not None:
            row["code_used"].append(float(used))
        if fmt == "pairwise":
            pending.setdefault((iid, method), {})[extra] = judgment_label(t.judgment, "AB")
            if len(pending[(iid, method)]) == 2:
                v0, v1 = pending[(iid, method)][0], pending[(iid, method)][1]
                r = readout_pairwise(v0, v1)
                row["score"].append(r["win"]), row["valid"].append(r["valid"])
                row.setdefault("consistent", []).append(r["consistent"])
                row.setdefault("order_A", []).append(float(v0 == "A")), row.setdefault("order_B", []).append(float(v1 == "B"))
                row["items"][iid] = r["win"]
                row.setdefault("items_consistent", {})[iid] = r["consistent"]
        else:
            choice = judgment_label(t.judgment, "ABCD")
            row["score"].append(readout_selection(choice, extra, 4)), row["valid"].append(float(choice in tuple("ABCD")))
            row["items"][iid] = row["score"][-1]
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    return {k: {m: (v if m.startswith("items") else mean(v)) for m, v in row.items()} | {"n": len(row["score"]), "n_judgments": len(row["turns"])}
            for k, row in acc.items()}


def pooled(res, method, fmt, key="score"):
    """One metric of a method and format pooled over categories, weighted by items (nan if absent)."""
    rows = [r for (m, f, _), r in res.items() if m == method and f == fmt and key in r and r[key] == r[key]]
    n = sum(r["n"] for r in rows)
    return sum(r[key] * r["n"] for r in rows) / n if n else float("nan")


def print_benchmark_table(res, methods, formats):
    cats = sorted({k[2] for k in res})
    for fmt in formats:
        chance = {"pairwise": 25.0, "best_of_4": 25.0}[fmt]
        print(f"\n{fmt} accuracy (%) per category  (chance {chance:.0f} %: a coin per "
              + ("order wins a pair 1/4 of the time" if fmt == "pairwise" else "pick of 4") + ")")
        extra = " order_A order_B consist" if fmt == "pairwise" else ""
        print(f"{'method':12s} " + " ".join(f"{c:>10s}" for c in cats) + f" {'all':>6s} {'n':>4s}{extra} {'invalid':>7s} "
              f"{'turns':>5s} {'skill%':>6s} {'sandbox':>7s} {'verifier':>8s} {'code_used':>9s}")
        for m in methods:
            rows = [res.get((m, fmt, c)) for c in cats]
            if not any(rows):
                continue
            pct = lambda key: 100 * pooled(res, m, fmt, key)
            n = sum(r["n"] for r in rows if r)
            calls = lambda tool: sum(r[f"calls_{tool}"] * r["n_judgments"] for r in rows if r)
            print(f"{m:12s} " + " ".join(f"{100 * r['score']:10.1f}" if r else f"{'-':>10s}" for r in rows)
                  + f" {pct('score'):6.1f} {n:4d}"
                  + (f" {pct('order_A'):7.1f} {pct('order_B'):7.1f} {pct('consistent'):7.1f}" if fmt == "pairwise" else "")
                  + f" {100 - pct('valid'):7.1f} {pooled(res, m, fmt, 'turns'):5.2f} {pct('skill'):6.1f}"
                  f" {calls('python_sandbox'):7.0f} {calls('run_verifier'):8.0f} {pct('code_used'):9.1f}")
    print("(sandbox / verifier: python_sandbox / run_verifier calls in all judgments; code_used: % of judgments whose\n"
          " final answer follows the last code run's report. The skill judge's SFT targets copy its verifier's report;\n"
          " the plain judge's SFT targets carry the same labels with no report to copy: same SFT budget, not same information)")


# --- §5 best-of-N: JETTS sequential pairwise knockout ---

def knockout_schedule(N, seed, pool_id):
    """JETTS sequential knockout, seeded: candidate order, A/B flip per match, tie-break coin per match."""
    rng = random.Random(f"{seed}-{pool_id}")
    order = rng.sample(range(N), N)
    flips = [rng.random() < 0.5 for _ in range(N - 1)]
    coins = [rng.random() < 0.5 for _ in range(N - 1)]
    return order, flips, coins


def sequential_knockout(pool_scores, judge_batch, seed, ks):
    """Best-of-N by sequential pairwise knockout (§5, JETTS protocol).

    The first candidate of a seeded order is the incumbent; each next one challenges
    it in a seeded A/B order; the judged winner stays; a Tie or invalid verdict is a
    seeded coin. `judge_batch([(pool, a, b), ...]) -> ['A' | 'B' | other, ...]` judges
    one match per pool per round (all pools in one batch).
    Returns seqko@k = mean over pools of the incumbent's true score after k candidates."""
    P = len(pool_scores)
    N = min(len(s) for s in pool_scores)
    sched = [knockout_schedule(N, seed, p) for p in range(P)]
    inc = [s[0][0] for s in sched]
    at = {1: [pool_scores[p][inc[p]] for p in range(P)]}
    for r in range(1, N):
        reqs, sides = [], []
        for p in range(P):
            order, flips, _ = sched[p]
            a, b = (order[r], inc[p]) if flips[r - 1] else (inc[p], order[r])
            reqs.append((p, a, b)), sides.append((a, b))
        verdicts = judge_batch(reqs)
        for p, v in enumerate(verdicts):
            a, b = sides[p]
            if v not in ("A", "B"):
                v = "A" if sched[p][2][r - 1] else "B"  # invalid or tie: seeded random pick
            inc[p] = a if v == "A" else b
        if r + 1 in ks:
            at[r + 1] = [pool_scores[p][inc[p]] for p in range(P)]
    out = {f"seqko@{k}": sum(at[k]) / P for k in sorted(at) if k in ks}
    # random@N: expected true score of a uniformly random pick; oracle@N: the pool's best
    out[f"random@{N}"] = sum(sum(s[:N]) / N for s in pool_scores) / P
    out[f"oracle@{N}"] = sum(max(s[:N]) for s in pool_scores) / P
    out["per_pool"] = {f"seqko@{N}": at[N], f"random@{N}": [sum(s[:N]) / N for s in pool_scores],
                       f"oracle@{N}": [max(s[:N]) for s in pool_scores]}
    return out


def best_of_n(judge_sampler, tok, pools, method, skills, args, seeds, dist=None):
    """seqko@{1,2,4,8,N} for one judge method, averaged over knockout seeds."""
    N = args.bon_N
    ks = sorted({k for k in (1, 2, 4, 8, N) if k <= N})
    scores = [p["scores"][:N] for p in pools]

    valid = []

    def judge_batch(reqs):
        tasks = [JudgeTask(pools[p]["prompt"], [pools[p]["candidates"][a], pools[p]["candidates"][b]], "pairwise", method,
                           label="A" if pools[p]["scores"][a] >= pools[p]["scores"][b] else "B", category=pools[p]["category"])
                 for p, a, b in reqs]
        tasks = judge_on_ranks(judge_sampler, tok, tasks, skills, args, args.max_turns, dist)
        verdicts = [judgment_label(t.judgment, "AB") for t in tasks]
        valid.extend(v in ("A", "B") for v in verdicts)
        return verdicts

    runs = [sequential_knockout(scores, judge_batch, args.seed * 1000 + s, ks) for s in range(seeds)]
    out = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0] if k != "per_pool"}
    per_pool = {k: [sum(r["per_pool"][k][p] for r in runs) / len(runs) for p in range(len(pools))] for k in runs[0]["per_pool"]}
    return out | {"invalid": 1 - sum(valid) / max(len(valid), 1), "per_pool": per_pool}


# --- App. D: the trained policy on held-out instructions, scored by the hidden checkers ---

def eval_if_policy(sampler, tok, test_set, args, dist=None):
    """Greedy responses on held-out instructions, scored by IFEval's own checkers (`ifeval_check`, not the
    training checks): prompt-level strict accuracy (all constraints) and instruction-level accuracy (IFEval's metrics)."""
    dist = dist or Dist()
    idx = list(range(dist.rank, len(test_set), dist.world))  # this rank's share; the scores of all are gathered, in order
    outs = sampler.generate(policy_prompt_ids(tok, [test_set[i]["prompt"] for i in idx]), 1, args.max_new_tokens, 0.0)
    sc = [c for _, c in sorted(gather_objects([(i, constraint_scores(test_set[i]["constraints"], o[0].text, ifeval_check))
                                               for i, o in zip(idx, outs)], dist), key=lambda x: x[0])]
    n_inst = sum(len(t["constraints"]) for t in test_set)
    return {"prompt_strict": sum(s["all"] for s in sc) / max(len(sc), 1),
            "inst_level": sum(sum(s["checks"]) for s in sc) / max(n_inst, 1),
            "per_prompt": [s["frac"] for s in sc]}


# --- the results.json headline: every number beside its chance line (stats.py) ---

MODEL_JUDGES = ("baseline", "appended", "python_only", "skill_rm")  # judged by a model (the oracle is scripted)
COIN = {"pairwise": 0.25, "best_of_4": 0.25, "consistent": 0.5}  # a coin per order / per pick


def bench_items(res, method, fmt, key="items"):
    """{item id: value} of one method and format over every category."""
    out = {}
    for (m, f, _), r in res.items():
        if m == method and f == fmt:
            out.update(r.get(key, {}))
    return out


def judge_warnings(res, methods):
    """What makes a benchmark table meaningless, per model judge: position-locked (pairwise consistency 0),
    at chance (pairwise accuracy not above the 25 % coin at p < 0.05, exact binomial), no tool ever called
    (tool-using methods)."""
    out = []
    for m in [m for m in methods if m in MODEL_JUDGES]:
        cons, wins = bench_items(res, m, "pairwise", "items_consistent"), bench_items(res, m, "pairwise")
        if cons and sum(cons.values()) == 0:
            out.append(f"{m}: position-locked (pairwise consistency 0 over {len(cons)} items)")
        if wins and not (sum(wins.values()) / len(wins) > COIN["pairwise"]
                         and binomial_p(int(sum(wins.values())), len(wins), COIN["pairwise"]) < 0.05):
            out.append(f"{m}: at chance (pairwise {sum(wins.values()):.0f}/{len(wins)} vs coin 25 %)")
        if m in ("python_only", "skill_rm") and not any(r["calls"] > 0 for (mm, _, _), r in res.items() if mm == m):
            out.append(f"{m}: never called a tool")
    return out


def build_headline(res, bon, rl, methods):
    """The headline entries: Skill-RM vs the plain judge paired over items, every model judge vs the
    coin (pairwise: 25 % of pairs won in both orders; consistency 50 %, position-locked 0 %; best-of-4:
    25 %), seqko@N beside random@N and oracle@N per pool, and the IF-RL within-group reward sd beside
    the no-signal judge's (position-locked for anchored). --aggregate pools them over seeds."""
    H, judges = [], [m for m in methods if m in MODEL_JUDGES]
    note = " [SFT: skill targets copy a verifier report, plain targets do not]"
    for fmt in ("pairwise", "best_of_4"):
        for m in judges:
            it = bench_items(res, m, fmt)
            if it:
                H.append(vs_chance(f"{fmt} accuracy of {m} vs coin", m, [it[k] for k in sorted(it)], COIN[fmt]))
            cons = bench_items(res, m, fmt, "items_consistent")
            if cons:
                H.append(vs_chance(f"pairwise consistency of {m} vs coin (position-locked: 0)", m,
                                   [cons[k] for k in sorted(cons)], COIN["consistent"]))
        a, b = bench_items(res, "skill_rm", fmt), bench_items(res, "baseline", fmt)
        ids = sorted(set(a) & set(b))
        if ids:
            H.append(compare(f"{fmt} accuracy: Skill-RM vs plain judge{note}", "skill_rm", "baseline",
                             [a[k] for k in ids], [b[k] for k in ids], chance=COIN[fmt]))
    for m, r in (bon or {}).items():
        pp = r["per_pool"]
        seqko, rand, orc = (next(v for k, v in pp.items() if k.startswith(x)) for x in ("seqko@", "random@", "oracle@"))
        N = next(k for k in pp if k.startswith("random@"))[7:]
        H.append(compare(f"best-of-N seqko@{N} vs random@{N} ({m})", m, f"random@{N}", seqko, rand))
        H.append(compare(f"best-of-N seqko@{N} vs oracle@{N} ({m})", m, f"oracle@{N}", seqko, orc))
    if bon and "skill_rm" in bon and "baseline" in bon:
        N = next(k for k in bon["skill_rm"]["per_pool"] if k.startswith("seqko@"))
        H.append(compare(f"best-of-N {N}: Skill-RM vs plain judge{note}", "skill_rm", "baseline",
                         bon["skill_rm"]["per_pool"][N], bon["baseline"]["per_pool"][N]))
    for v, r in (rl or {}).items():
        if "group_sds" in r:
            H.append(vs_chance(f"IF-RL within-group reward sd ({v}) vs no-signal judge", v, r["group_sds"], r["null_group_sd"]))
            H.append(compare(f"IF held-out instruction-level accuracy: {v} vs initial policy", v, "initial",
                             r["per_prompt"], rl["initial"]["per_prompt"]))
    return H


# ----- main -----

def check_args(args):
    """Stop before any model loads when flags cannot give a result (clear message, no traceback)."""
    bad = [v for v in args.rl_rewards.split(",") if v not in RL_VARIANTS]
    if bad and not args.skip_rl:
        raise SystemExit(f"skill_rm: unknown --rl-rewards {', '.join(bad)} (choose from {', '.join(RL_VARIANTS)})")
    if args.rl_eval_prompts < 1 and not args.skip_rl:
        raise SystemExit("skill_rm: --rl-eval-prompts must be at least 1 (the RL table needs a held-out test set)")


def make_judge(policy, args, dist):
    """The judge: a frozen bf16 copy of the backbone (bf16 halves its memory and time on CPU).
    Under torchrun the policy is a DDP wrapper: copy the module inside, not the wrapper."""
    if args.judge_model in (None, args.model):
        return frozen_copy(policy, torch.bfloat16)  # same weights, no reload (FSDP: gathered from the shards in bf16)
    return load_model(args.judge_model, dist, "bfloat16", trainable=False)[0]


def make_judge_sampler(judge, tok, args, dist):
    """A sampler for one judge model: its own vLLM engine when the policy uses vLLM (never re-synced:
    judges are frozen; their prompts need a long context), else HF generate with the schema fallback."""
    if args.sampler != "hf" and dist.world == 1:
        s = make_sampler(args, judge, tok, dist, max_model_len=args.judge_max_model_len)
        if isinstance(s, VLLMSampler):
            return s
    return ConstrainedHFSampler(judge, tok, batch=args.judge_batch)


def main(argv=None):
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="skill_rm")
    if args.aggregate:
        return aggregate_main(args.aggregate)
    if args.resume:  # add_grpo_args' flag: this script saves no checkpoint, so there is nothing to continue from
        raise SystemExit("skill_rm: --resume is not supported (its RL variants keep no checkpoint); rerun without it")
    check_args(args)
    dist = setup_distributed()
    if not args.skip_rl:
        per_rank(args.rl_prompts, dist, "--rl-prompts")
    seed_everything(args.seed + dist.rank)
    t_start = time.time()
    try:
        skills = load_skills(args.skills_dir)
    except SkillError as e:
        raise SystemExit(f"skill_rm: {e}")
    policy, tok = load_policy(args, dist)
    sampler = make_sampler(args, policy, tok, dist)
    pools_path = Path(args.bench).with_name("bon_pools.jsonl")
    results = {"args": vars(args)}
    methods, formats = args.methods.split(","), args.formats.split(",")

    # §3: the judges. Every method decodes under JSON schemas (turn_schema). With --judge-sft-steps the
    # plain judge (baseline, appended) and the skill judge (skill_rm, python_only) each get the same SFT.
    t0 = time.time()
    judge = make_judge(policy, args, dist)
    if args.judge_sft_steps > 0:
        plain = make_judge_sampler(judge_sft(judge, tok, skills, args, dist, "baseline"), tok, args, dist)
        skilled = make_judge_sampler(judge_sft(judge, tok, skills, args, dist, "skill_rm"), tok, args, dist)
    else:
        plain = skilled = make_judge_sampler(judge, tok, args, dist)
    judges = {"baseline": plain, "appended": plain, "default": plain, "skill_rm": skilled, "python_only": skilled}
    results["time_judge_sft"] = time.time() - t0

    # §5 reward-modelling benchmark: pairwise (both orders) and best-of-4 per category
    if not args.skip_bench:
        t0 = time.time()
        items = select_items(read_jsonl(args.bench), args.bench_per_cat, args.seed)
        tasks, meta = benchmark_tasks(items, methods, formats, args.seed)
        tasks = judge_on_ranks(judges, tok, tasks, skills, args, args.max_turns, dist)  # dealt over the ranks
        res = score_benchmark(tasks, meta)
        print_benchmark_table(res, methods, formats)
        print(f"(benchmark: {len(items)} items, {len(tasks)} judgments, {time.time() - t0:.0f} s)")
        for t in [t for t in tasks if t.method == "skill_rm"][:args.show_trace]:
            print("\n" + format_trace(t))
        if dist.rank == 0:  # every judgment with its whole trace, to read what a judge did (--show-trace prints some)
            with open(Path(args.run_dir) / "bench_judgments.jsonl", "w") as f:
                for t, (iid, cat, method, fmt, extra) in zip(tasks, meta):
                    f.write(json.dumps({"item": iid, "category": cat, "method": method, "format": fmt, "label": t.label,
                                        "judgment": t.judgment, "trace": [{k: st[k] for k in ("action", "observation")}
                                                                          for st in t.trace]}, default=str) + "\n")
        results["benchmark"] = {"|".join(k): v for k, v in res.items()}
        results["judge_warnings"] = judge_warnings(res, methods)
        print("\n".join(f"WARNING {w}" for w in results["judge_warnings"]) or "no judge is position-locked, at chance or tool-less")
        for m in [m for m in methods if m in MODEL_JUDGES]:  # the per-method tool use, issue #26 §1
            print(f"{m:12s} tool calls: " + ", ".join(f"{n} {sum(r[f'calls_{n}'] * r['n_judgments'] for k, r in res.items() if k[0] == m):.0f}"
                                                      for n in TOOL_NAMES))

    # §5 best-of-N: JETTS sequential pairwise knockout over fixed pools
    if not args.skip_bon:
        t0 = time.time()
        pools = read_jsonl(pools_path)[:args.bon_prompts] if args.bon_prompts else read_jsonl(pools_path)
        print(f"\nbest-of-N (JETTS sequential knockout), {len(pools)} pools, N={args.bon_N}, true score = hidden checker")
        results["bon"] = {}
        for m in [m for m in methods if m in ("baseline", "skill_rm", "oracle")]:
            results["bon"][m] = r = best_of_n(judges, tok, pools, m, skills, args, args.bon_seeds, dist)
            print(f"{m:12s} " + "  ".join(f"{k} {v:.3f}" for k, v in r.items() if k != "per_pool"))
        print(f"(best-of-N: {time.time() - t0:.0f} s)")

    # App. D: instruction-following GRPO with each judge reward, evaluated by the hidden checkers
    if not args.skip_rl:
        t0 = time.time()
        train_set = if_prompts(args.seed, args.rl_steps * args.rl_prompts, "train")
        test_set = if_prompts(args.seed, args.rl_eval_prompts, "test")
        init_state = cpu_snapshot(policy)  # on the CPU: no GPU memory for the copy
        # anchored pairwise: a fixed reference response per prompt from the initial policy (greedy)
        refs = sampler.generate(policy_prompt_ids(tok, [t["prompt"] for t in train_set]), 1, args.max_new_tokens, 0.0)
        anchors = {t["prompt"]: o[0].text for t, o in zip(train_set, refs)}
        results["rl"] = {"initial": eval_if_policy(sampler, tok, test_set, args, dist)}
        for variant in args.rl_rewards.split(","):
            restore_snapshot(policy, init_state)
            sampler.sync(policy)
            run_dir, train = train_if_policy(variant, policy, tok, sampler, judges, skills, args, dist, anchors, train_set)
            results["rl"][variant] = {**eval_if_policy(sampler, tok, test_set, args, dist), **train}
            if dist.is_main:  # rank 0 writes the plots and results
                plot_curves(run_dir, ("reward", "judge_valid", "checker_strict"))
        print(f"\ninstruction-following RL (App. D): {args.rl_steps} GRPO steps per reward, eval on "
              f"{len(test_set)} held-out instructions with hidden checkers")
        print(f"{'reward':12s} {'prompt_strict':>14s} {'inst_level':>11s} {'reward_sd':>10s} {'no-signal sd':>13s} {'judge_invalid%':>15s}")
        for k, v in results["rl"].items():
            print(f"{k:12s} {100 * v['prompt_strict']:14.1f} {100 * v['inst_level']:11.1f} "
                  + (f"{v['reward_group_sd']:10.3f} {v['null_group_sd']:13.3f} {100 * (1 - v['judge_valid']):15.1f}" if "judge_valid" in v else ""))
        print(f"(RL: {time.time() - t0:.0f} s)")
    results["time_total"] = time.time() - t_start
    results["headline"] = build_headline(res if not args.skip_bench else {}, results.get("bon"), results.get("rl"), methods)
    if not dist.is_main:  # rank 0 writes the results
        return results
    print("\n" + format_headline(results["headline"]))
    write_results(args.run_dir, {k: v for k, v in results.items() if k != "headline"}, results["headline"])
    print(f"\ntotal {time.time() - t_start:.0f} s; results in {args.run_dir}/results.json")
    return results


# ----- verifiable instructions (environment; their checkers follow) -----

IF_TASKS = [
    "Write a short note about the ocean.", "Describe a rainy day in a city.", "Explain why people enjoy gardening.",
    "Give advice to someone starting a new job.", "Describe your favourite kind of breakfast.",
    "Write a short story about a lost key.", "Explain how a bicycle works.", "Describe a walk in the forest.",
    "Write a message inviting a friend to dinner.", "Explain why sleep is important.", "Describe a busy market.",
    "Write a thank-you note to a teacher.", "Explain what a library is for.", "Describe the moon at night.",
    "Give tips for learning a new language.", "Write a short poem about winter.", "Explain how to make tea.",
    "Describe a train journey.", "Write a product description for a water bottle.", "Explain why exercise helps.",
    "Describe a summer festival.", "Write a short review of a fictional cafe.", "Explain how plants grow.",
    "Describe an old house.", "Write a note to a neighbour about a lost cat.", "Explain what a map is used for.",
    "Describe a snowy mountain village.", "Give advice for a long flight.", "Write a short speech for a birthday.",
    "Explain why bees matter.", "Describe a quiet morning.", "Write a short letter to your future self.",
]
# test instructions use their own tasks (never seen in training) and add constraint types training never sees
IF_TEST_TASKS = [
    "Describe a lighthouse on a stormy night.", "Explain how a compass works.", "Write a short note about autumn leaves.",
    "Give advice for a first camping trip.", "Describe a crowded train station.", "Explain why people keep diaries.",
    "Write a short message to a new colleague.", "Describe the smell of fresh bread.",
]
HELD_OUT_GROUPS = [("title", "postscript")]  # test-only constraint types (IFEval's title and P.S. checks)
KEYWORDS = ["river", "lamp", "garden", "coffee", "window", "music", "friend", "bridge", "candle", "stone"]
BANNED = ["very", "really", "good", "nice", "thing"]
END_PHRASES = ["Is there anything else I can help with?", "That is all.", "Thank you for reading."]
START_WORDS = ["Today", "Honestly", "Imagine"]
# groups of mutually exclusive constraint types (at most one per group in a prompt)
CONSTRAINT_GROUPS = [("lowercase", "uppercase"), ("max_words", "min_words", "bullets"), ("include_keyword",),
                     ("exclude_word",), ("end_phrase", "quotes"), ("start_word",), ("no_commas",)]


def render_constraint(c):
    """The natural-language form the policy and the judge see."""
    t = c["type"]
    return {"lowercase": "Your entire response must be in lowercase letters; no capital letters are allowed.",
            "uppercase": "Your entire response must be in English capital letters only.",
            "max_words": f"Answer in at most {c.get('n')} words.",
            "min_words": f"Answer with at least {c.get('n')} words.",
            "bullets": f"Your answer must contain exactly {c.get('n')} bullet points, each starting with '* '.",
            "include_keyword": f"Include the word \"{c.get('word')}\" in your response.",
            "exclude_word": f"Do not use the word \"{c.get('word')}\" anywhere in your response.",
            "end_phrase": f"End your response with the exact phrase \"{c.get('phrase')}\". No other words should follow it.",
            "quotes": "Wrap your entire response in double quotation marks.",
            "start_word": f"Start your response with the word \"{c.get('word')}\".",
            "no_commas": "Do not use any commas in your response.",
            "title": "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
            "postscript": "At the end of your response, please explicitly add a postscript starting with P.S."
            }.get(t, f"(unknown constraint {t})")


def make_if_prompt(rng, n_constraints, tasks=IF_TASKS, held_out=False):
    """One instruction: a task plus n constraints from distinct groups, with their specs; held_out
    makes the first constraint a test-only type."""
    task = rng.choice(tasks)
    cons = []
    groups = rng.sample(CONSTRAINT_GROUPS, n_constraints - 1 if held_out else n_constraints)
    for group in (rng.sample(HELD_OUT_GROUPS, 1) if held_out else []) + groups:
        t = rng.choice(group)
        c = {"type": t}
        if t in ("max_words",):
            c["n"] = rng.choice([20, 30, 40])
        elif t == "min_words":
            c["n"] = rng.choice([40, 60])
        elif t == "bullets":
            c["n"] = rng.choice([2, 3])
        elif t == "include_keyword":
            c["word"] = rng.choice(KEYWORDS)
        elif t == "exclude_word":
            c["word"] = rng.choice(BANNED)
        elif t == "end_phrase":
            c["phrase"] = rng.choice(END_PHRASES)
        elif t == "start_word":
            c["word"] = rng.choice(START_WORDS)
        cons.append(c)
    prompt = task + " " + " ".join(render_constraint(c) for c in cons)
    return {"prompt": prompt, "constraints": cons}


IF_SPLITS = ("bench", "bon", "sft", "train", "test")


def split_tasks(split):
    """The tasks a split's instruction prompts use, disjoint across splits (so no prompt is in two):
    test has its own IF_TEST_TASKS; bench, bon and sft take every 6th of IF_TASKS; train the other half."""
    if split not in IF_SPLITS:
        raise ValueError(f"unknown split '{split}' (one of {', '.join(IF_SPLITS)})")
    if split == "test":
        return IF_TEST_TASKS
    if split == "train":
        return [t for k, t in enumerate(IF_TASKS) if k % 6 >= 3]
    return IF_TASKS[("bench", "bon", "sft").index(split)::6]


def if_prompts(seed, n, split):
    """Deterministic instruction prompts from the split's own tasks (split_tasks); every other test
    prompt has a constraint type no other split has."""
    rng = random.Random(f"{split}-{seed}")
    if split == "test":
        return [make_if_prompt(rng, rng.choice([1, 2, 2, 3]), IF_TEST_TASKS, held_out=k % 2 == 0) for k in range(n)]
    return [make_if_prompt(rng, rng.choice([1, 2, 2, 3]), split_tasks(split)) for _ in range(n)]


def sft_items(seed, n):
    """Judge-SFT split, built without a model from seeds the benchmark never uses: precise_if (a
    repaired answer vs. one with a constraint broken), math (same-style pairs), focus (short
    right vs. polished wrong); n items per category."""
    rng, items = random.Random(f"sft-{seed}"), []
    for k, p in enumerate(if_prompts(seed, n, "sft")):
        base = rng.choice(["I think this is a lovely idea and I would enjoy it a lot.",
                           "Here is my answer. It is short and clear, and it covers the main point."])
        chosen = repair_response(p["constraints"], base)
        rejected = [break_response(c, chosen, rng) for c in rng.choices(p["constraints"], k=3)]
        items.append({"id": f"sft-if-{k}", "category": "precise_if", "prompt": p["prompt"], "chosen": chosen,
                      "rejected": rejected, "meta": {"constraints": p["constraints"]}})
    for k, m in enumerate(math_items("sft-math", seed, n)):
        chosen, rejected = math_pair(m, rng)
        items.append({"id": f"sft-math-{k}", "category": "math", "prompt": m["prompt"], "chosen": chosen,
                      "rejected": rejected, "meta": {"answer": m["answer"]}})
    for k, m in enumerate(math_items("sft-focus", seed, n)):
        rejected = [polished_wrong(m["answer"], rng)] + [f"The answer is {int(m['answer']) + d}." for d in (-1, 1)]
        items.append({"id": f"sft-focus-{k}", "category": "focus", "prompt": m["prompt"],
                      "chosen": f"The answer is {m['answer']}.", "rejected": rejected, "meta": {"answer": m["answer"]}})
    return items


# ----- checkers (hidden from every judge and reward) -----


def _words(text):
    return re.findall(r"[A-Za-z0-9']+", text)


def check_constraint(c, response):
    """Deterministic checker of one constraint (IFEval-style); unknown type → False."""
    r, t = response.strip(), c.get("type")
    if t == "lowercase":
        return r == r.lower() and any(ch.isalpha() for ch in r)
    if t == "uppercase":
        return r == r.upper() and any(ch.isalpha() for ch in r)
    if t == "max_words":
        return len(_words(r)) <= c["n"]
    if t == "min_words":
        return len(_words(r)) >= c["n"]
    if t == "bullets":
        return len([l for l in r.splitlines() if re.match(r"^\s*\*\s", l)]) == c["n"]
    if t == "include_keyword":
        return re.search(r"\b" + re.escape(c["word"]) + r"\b", r, re.I) is not None
    if t == "exclude_word":
        return re.search(r"\b" + re.escape(c["word"]) + r"\b", r, re.I) is None
    if t == "end_phrase":
        return r.lower().endswith(c["phrase"].lower())
    if t == "quotes":
        return len(r) > 1 and r[0] == '"' and r[-1] == '"'
    if t == "start_word":
        w = _words(r)
        return bool(w) and w[0].lower() == c["word"].lower()
    if t == "no_commas":
        return "," not in r
    if t == "title":
        return re.search(r"<<[^\n]+>>", r) is not None
    if t == "postscript":
        return re.search(r"^\s*P\.S\.", r, re.M) is not None
    return False


def constraint_scores(constraints, response, check=check_constraint):
    """Per-constraint pass/fail, the prompt-level 'all pass' and the satisfied fraction."""
    ok = [check(c, response) for c in constraints]
    return {"checks": ok, "all": float(all(ok)), "frac": sum(ok) / max(len(ok), 1)}


# The held-out evaluation uses IFEval's own instruction checkers (Google's registry, as shipped in lm-eval),
# not the training checks above: our constraint type -> (IFEval instruction id, its build_description kwargs).
# IFEval has no "start with the word X" (its first-word check also fixes the paragraph count): start_word keeps ours.
IFEVAL_IDS = {
    "lowercase": ("change_case:english_lowercase", lambda c: {}),
    "uppercase": ("change_case:english_capital", lambda c: {}),
    "max_words": ("length_constraints:number_words", lambda c: {"num_words": c["n"] + 1, "relation": "less than"}),
    "min_words": ("length_constraints:number_words", lambda c: {"num_words": c["n"], "relation": "at least"}),
    "bullets": ("detectable_format:number_bullet_lists", lambda c: {"num_bullets": c["n"]}),
    "include_keyword": ("keywords:existence", lambda c: {"keywords": [c["word"]]}),
    "exclude_word": ("keywords:forbidden_words", lambda c: {"forbidden_words": [c["word"]]}),
    "end_phrase": ("startend:end_checker", lambda c: {"end_phrase": c["phrase"]}),
    "quotes": ("startend:quotation", lambda c: {}),
    "no_commas": ("punctuation:no_comma", lambda c: {}),
    "title": ("detectable_format:title", lambda c: {}),
    "postscript": ("detectable_content:postscript", lambda c: {"postscript_marker": "P.S."}),
}


@functools.cache
def ifeval_registry():
    """lm-eval's `instructions_registry.INSTRUCTION_DICT`, imported without lm-eval's task manager: lm-eval is
    installed --no-deps (its evaluator needs sacrebleu, datasets, ...), so `lm_eval.tasks` is bound to its folder
    before the import instead of running its __init__. IFEval's case checks use langdetect: seeded, so exact."""
    import importlib.util
    import sys
    import types
    import langdetect
    langdetect.DetectorFactory.seed = 0
    if "lm_eval.tasks" not in sys.modules:
        tasks = types.ModuleType("lm_eval.tasks")
        tasks.__path__ = [str(Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks")]
        sys.modules["lm_eval.tasks"] = tasks
    from lm_eval.tasks.ifeval import instructions_registry
    return instructions_registry.INSTRUCTION_DICT


def ifeval_check(c, response):
    """IFEval's checker of one constraint (ours for a type IFEval lacks); a malformed spec or a checker that
    raises on the response is False (model output is hostile input)."""
    if not isinstance(c, dict) or not isinstance(response, str):
        return False
    registry = ifeval_registry()  # outside the try: a missing lm-eval is an ImportError, not every check False
    try:
        if c.get("type") not in IFEVAL_IDS:
            return bool(check_constraint(c, response))
        iid, kwargs = IFEVAL_IDS[c["type"]]
        checker = registry[iid](iid)
        checker.build_description(**kwargs(c))
        return bool(checker.check_following(response))
    except Exception:  # noqa: BLE001 -- a checker's assert or regex error on hostile text is a failed check
        return False


# ----- answers built from a prompt's checkers (the SFT split; data/skill_rm/prepare.py too) -----


def repair_response(constraints, text):
    """Edit a model response until it satisfies every constraint (builds 'chosen' answers from real outputs)."""
    words = text.replace("\n", " ").split()
    types = {c["type"]: c for c in constraints}
    for c in constraints:
        if c["type"] == "exclude_word":
            words = [w for w in words if re.sub(r"\W", "", w).lower() != c["word"]]
    if "max_words" in types:
        extra = sum(len(_words(types[k].get("word", types[k].get("phrase", "")))) for k in ("include_keyword", "end_phrase", "start_word") if k in types)
        words = words[:max(types["max_words"]["n"] - extra - 2, 3)]
    if "min_words" in types:
        filler = "This matters because small details shape how we see the world around us every day".split()
        while len(_words(" ".join(words))) < types["min_words"]["n"] + 2:
            words += filler
    out = " ".join(words).strip()
    if "no_commas" in types:
        out = out.replace(",", "")
    if "include_keyword" in types and not check_constraint(types["include_keyword"], out):
        out += f" It reminds me of a {types['include_keyword']['word']}."
    if "start_word" in types and not check_constraint(types["start_word"], out):
        out = types["start_word"]["word"] + " " + out
    if "bullets" in types:
        sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", out) if s.strip()] or [out]
        n = types["bullets"]["n"]
        sents = (sents * n)[:n] if len(sents) < n else sents[:n - 1] + [" ".join(sents[n - 1:])]
        out = "\n".join("* " + s.replace("*", "") for s in sents)
    if "end_phrase" in types and not check_constraint(types["end_phrase"], out):
        out = out.rstrip() + " " + types["end_phrase"]["phrase"]
    if "quotes" in types:
        out = '"' + out.replace('"', "'") + '"'
    if "lowercase" in types:
        out = out.lower()
    if "uppercase" in types:
        out = out.upper()
    return out


def break_response(constraint, text, rng):
    """Edit a response so that it violates `constraint` (builds 'rejected' answers)."""
    t = constraint["type"]
    if t == "lowercase":
        return "The " + text if text else "The End"
    if t == "uppercase":
        return text + " thank you."
    if t == "max_words":
        return text + " " + " ".join(["Also, there is much more to say about this topic."] * 8)
    if t == "min_words":
        return " ".join(text.split()[:8])
    if t == "bullets":
        return text + "\n* One more point."
    if t == "include_keyword":
        return re.sub(r"\b" + re.escape(constraint["word"]) + r"\b", "thing", text, flags=re.I)
    if t == "exclude_word":
        return text + f" It is {constraint['word']}."
    if t == "end_phrase":
        return text + " Have a great day."
    if t == "quotes":
        return text.strip('"')
    if t == "start_word":
        return "Well, " + text
    if t == "no_commas":
        return text.replace(". ", ", and ", 1) if ". " in text else text + ", indeed"
    return text + " ?"


MATH_SPLITS = ("bench-math", "bench-focus", "bon-math", "sft-math", "sft-focus")


def math_items(split, seed, n):
    """reasoning-gym chain_sum problems (1-2 digits, 2-3 terms) with their gold answers, disjoint across
    splits: reasoning-gym seeds item i with seed + i, so each (split, seed) reads its own seed range,
    (split index + 1)·10⁸ + 10⁴·seed; and as small problems recur under any seed, a split keeps only
    the problems whose prompt hashes to it (crc32 mod the number of splits)."""
    import reasoning_gym
    if not (0 <= seed < 10_000 and n <= 1000):
        raise ValueError(f"math_items: seed {seed} / n {n} outside the split's range (seed < 10000, n ≤ 1000)")
    k = MATH_SPLITS.index(split)
    ds = reasoning_gym.create_dataset("chain_sum", seed=(k + 1) * 10 ** 8 + 10_000 * seed, size=10 * n, min_terms=2,
                                      max_terms=3, min_digits=1, max_digits=2)
    out, seen = [], set()
    for e in ds:
        prompt = e["question"] + " Give the final answer as a number."
        if zlib.crc32(prompt.encode()) % len(MATH_SPLITS) == k and prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "answer": str(e["answer"]), "entry": e, "ds": ds})
        if len(out) == n:
            return out
    raise ValueError(f"math_items: only {len(out)} of {n} problems of split {split} in its seed range")


MATH_STYLES = [  # chosen and rejected answers of one item share a style: only the value differs
    "{expr} = {v}. The answer is {v}.",
    "Adding the terms from left to right gives {v}. So {expr} = {v}, and the final answer is {v}.",
    "Let me compute it step by step: {expr} = {v}.\nFinal answer: {v}",
]


def math_pair(m, rng):
    """One math item: the correct worked answer and three wrong ones in the same style."""
    style, expr, v = rng.choice(MATH_STYLES), m["entry"]["metadata"]["expression"], int(m["answer"])
    wrong = rng.sample([v + d for d in (-10, -3, -2, -1, 1, 2, 3, 10)], 3)
    return style.format(expr=expr, v=v), [style.format(expr=expr, v=w) for w in wrong]


def polished_wrong(answer, rng):
    """A long, confident, well-formatted answer with a wrong final number (style-bias case)."""
    wrong = int(float(answer)) + rng.choice([-3, -2, -1, 1, 2, 3])
    return ("Great question! Let's work through this carefully, step by step, so that nothing is missed.\n\n"
            "**Step 1.** Read the expression from left to right and keep track of every sign.\n"
            "**Step 2.** Combine the terms one at a time, double-checking each intermediate result.\n"
            "**Step 3.** Verify the total once more to be completely sure.\n\n"
            f"Putting it all together, the final answer is **{wrong}**. I am confident this is correct, and "
            "I hope this detailed explanation helps!")


# ----- data files -----

def read_jsonl(path):
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{i + 1}: not valid JSON ({e.msg}); rebuild with data/skill_rm/prepare.py")
    return rows


def write_jsonl(path, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
    exit_ranks()  # under torchrun: barrier, destroy, os._exit (plumbing.exit_ranks says why)
