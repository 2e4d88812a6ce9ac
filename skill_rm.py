"""Skill-RM: reward modelling as the execution of a Reward-Evaluation Skill.

Paper: "Skill-RM: Unifying Heterogeneous Evaluation Criteria via Agent Skill", Chen et al., arXiv:2606.03980
(code: github.com/Qwen-Applications/Skill-RM; its mechanics are in papers/NOTES.md §2, rebuilt here).

A judge does not score a response in one shot: it runs an agentic loop over a skill folder (SKILL.md, a
resource index, rubrics, bias controls, verifiers). It sees only each skill's name and description until
it calls `use_skill` (progressive disclosure); then it may `view_resource` (≤ 4, leakage-gated) and run
`python_sandbox` code over the prompt and candidates. A deterministic readout (§3) maps its final answer
to a pointwise reward (K = 1), a pairwise preference (K = 2, both orders) or a selection among K ≥ 2.
main runs the paper's stages: the skills; the judges; the §5 benchmark on a held-out test set (headline:
Skill-RM vs the plain judge with the python tool) with the tuned-on dev set beside it (pairwise and best-of-4
accuracy per category: the plain judge, the ablations, no-model baselines: coin, position-locked, length,
checker-only); best-of-N by JETTS knockout; instruction-following GRPO with the Skill-RM reward (App. D).

Run (the benchmark files come from data/skill_rm/prepare.py; the world is tasks/reward_bench.py):
  tiny (2-core CPU, RL included; README):  python skill_rm.py --preset tiny
  one 80 GB GPU, Qwen3-1.7B (README):     python skill_rm.py --preset gpu
  paper settings (needs GPUs):             python skill_rm.py --preset paper --model Qwen/Qwen3.5-27B
  print one judge trace:                   python skill_rm.py --preset tiny --show-trace 1 --no-rl

Glossary: K candidates shown to the judge; N best-of-N pool size; G rollouts per prompt (GRPO group);
seqko@k the incumbent's true score after k candidates; random@N / oracle@N mean / max true score of a pool.

Differences from the paper (the 8 that matter most; the full list of 11 is in docs/skill_rm.md):
  1. Backbone: the embedded SmolLM2-135M-Instruct (paper: Qwen3.5-27B and others); free-running it never
     emits a parsable verdict, so 7 and 8 make it judge. Invalid rates sit beside accuracy.
  2. Benchmark: a small offline one of the same shapes (pairwise both orders, best-of-4) from reasoning-gym,
     HumanEval and templated verifiable instructions (paper: RewardBench2, RM-Bench, JudgeBench, JETTS).
  3. Best-of-N pools: 8 SmolLM2 samples per prompt (paper: JETTS pools of 10); tiny uses the first 4.
  4. IF-RL: our verifiable instructions; policy and judge the same 135M model, the judge frozen (paper:
     VerInstruct, Tulu-3-8B-SFT); held-out prompts with unseen constraint types, IFEval's own checkers.
  5. Sandbox: the authors' `python -I -S`, timeout and static check, plus rlimits and an audit hook.
  6. Tool calls: one JSON object per turn; the parser also takes <tool_call> tags, calls, [[A]] verdicts.
  7. Every judge turn is decoded under a JSON schema (`turn_schema`): xgrammar under vLLM, else
     plumbing's ConstrainedHFSampler; the plain judge so answers at once with a 0-1 score.
  8. Judge SFT (`--judge-sft-steps`; tiny: prepared once as LoRA) on scripted traces of a split nothing else
     uses: plain and skill judge the same steps, python_only as many supervised tokens as the skill judge;
     the paper's judges are not trained. A scripted `oracle` that knows the label is the upper bound.
"""
import argparse
import copy
import itertools
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo import add_grpo_args, chat_ids, grpo_update, parse_with_preset, sft_loop, sample_group_rollouts
from grpo import seed_everything
from plumbing import (TOOL_NAMES, Dist, GrammarReplay, SkillError, Stages, VLLMSampler, add_prepare_args,
                      compute_dtype, cpu_snapshot, first_json_object, load_model, load_policy, log_metrics,
                      make_judge, make_judge_sampler, make_optimizer, make_sampler, on_ranks, parse_label,
                      parse_text_rating, parse_text_verdict, parse_tool_call, per_rank, plot_curves,
                      preflight, prepare_lora, read_skill_folder, reduce_metrics, renamed_flags,
                      restore_snapshot, run_main, setup_distributed, unwrap, use_prepared, xgrammar_schema)
from sandbox import run_sandboxed
from stats import (aggregate_main, compare, format_headline, parse_number, print_table, vs_chance,
                   write_results)
from tasks import reward_bench as rb
from tasks.reward_bench import (FINAL_KEYS, LABELS, SET_NAMES, JudgeTask, bench_headline, null_group_sd,
                                bench_sets, benchmark_tasks, constraint_scores, contract_text, final_schema,
                                eval_if_policy, format_candidates, format_trace, if_prompts, judge_sft_tasks,
                                judge_warnings, plain_system_prompt, print_benchmark_table, read_jsonl,
                                schema_object, sft_items, template_copy_warnings, tool_counts, with_ci)

ROOT = Path(__file__).resolve().parent


# ----- config: presets and flags -----

PRESETS = {
    # 2-core CPU, SmolLM2-135M as judge and policy; judge SFT (difference 8) prepared once as LoRA; one item
    # per category and set, drawn per seed; one GRPO step per reward; 0.5 GiB of KV in each vLLM engine (4)
    "tiny": dict(sampler="auto", lr=2e-6, beta=0.0, bon_prompts=4, bon_N=4, steps=1, prompts_per_step=2,
                 eval_n=8, judge_max_new_tokens=128, max_new_tokens=48, max_turns=3, rl_max_turns=3,
                 methods="baseline,python_only,skill_rm,oracle", judge_sft_steps=24, judge_sft_items=4,
                 judge_sft_batch=4, judge_sft_lr=1e-4, warmup_adapters=str(ROOT / "data/skill_rm/judges"),
                 bench_per_cat=1, vllm_kv_gib=0.5),
    # the flag defaults (judge at temperature 0, 5 turns, 7 in RL); no model: here one is judge and policy
    "paper": dict(model=None),  # (the paper's judge Qwen3.5-27B, its policy Llama-3.1-Tulu-3-8B-SFT)
    # one GPU of ≥ 80 GB, at most 1 h (estimated, not run), Qwen3-1.7B as judge and policy: Skill-RM vs the
    # plain judges (with and without the python tool) on the §5 benchmark's pairwise accuracy, paired
    "gpu": dict(model="Qwen/Qwen3-1.7B", sampler="auto", methods="baseline,python_only,skill_rm,oracle",
                bon_prompts=16, rl_rewards="skill_rm,direct", steps=20, prompts_per_step=16, eval_n=100,
                max_new_tokens=512, judge_max_new_tokens=512, grad_checkpointing=True),
}
RENAMED = {"--rl-steps": "--steps", "--rl-prompts": "--prompts-per-step", "--rl-eval-prompts": "--eval-n",
           "--skip-bench": "--no-benchmark", "--skip-bon": "--no-bon", "--skip-rl": "--no-rl"}
# the flags the judges' SFT warm-ups depend on (with the skills folder): a prepared adapter serves only these
JUDGE_SFT_FLAGS = ("judge_sft_steps", "judge_sft_batch", "judge_sft_items", "constrained", "max_turns",
                   "max_resources", "resource_chars", "code_max_chars")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_grpo_args(p)
    p.set_defaults(G=4, max_new_tokens=1024)  # RL at paper scale (App. D does not state G or the length)
    on_off = argparse.BooleanOptionalAction
    g = p.add_argument_group("skill-rm judge (paper values: NOTES §2)")
    g.add_argument("--skills-dir", default=str(ROOT / "data/skills"), help="Reward-Evaluation Skill folders")
    g.add_argument("--judge-model", default=None, help="judge backbone (default --model; paper: Qwen3.5-27B)")
    g.add_argument("--judge-temperature", type=float, default=0.0, help="judge temperature (paper: 0)")
    g.add_argument("--judge-max-new-tokens", type=int, default=1024, help="tokens per judge turn")
    g.add_argument("--constrained", action=on_off, default=True,
                   help="decode every judge turn under its JSON schema; off = free text (difference 7)")
    g.add_argument("--max-turns", type=int, default=5, help="skill judge turn budget (paper: 5)")
    g.add_argument("--retries", type=int, default=1, help="retries after no valid call (paper: 1)")
    g.add_argument("--max-resources", type=int, default=4, help="view_resource calls per sample (paper: 4)")
    g.add_argument("--resource-chars", type=int, default=8000, help="characters per resource (paper: 8000)")
    g.add_argument("--sandbox-timeout", type=float, default=3.0, help="python_sandbox limit, s (paper: 3)")
    g.add_argument("--sandbox-mem-mb", type=int, default=256, help="python_sandbox address-space limit, MiB")
    g.add_argument("--code-max-chars", type=int, default=1000,
                   help="longest code string of python_sandbox / run_verifier under --constrained")
    g.add_argument("--judge-batch", type=int, default=16, help="judge prompts per generate call (memory)")
    g.add_argument("--judge-chunk", type=int, default=32,
                   help="tasks taken through all turns together (in vLLM's prefix cache); 0 = all at once")
    g.add_argument("--judge-max-model-len", type=int, default=8192, help="vLLM context of the judge")
    g.add_argument("--show-trace", type=int, default=0, help="print this many judge traces")
    g = p.add_argument_group("judge SFT warm-up (not in the paper; needed at 135M)")
    g.add_argument("--judge-sft-steps", type=int, default=0, help="SFT steps per judge (0 = off, the paper)")
    g.add_argument("--judge-sft-batch", type=int, default=8, help="examples (whole traces) per SFT step")
    g.add_argument("--judge-sft-items", type=int, default=16, help="SFT items per category")
    g.add_argument("--judge-sft-micro-batch", type=int, default=1,
                   help="traces per forward/backward (a trace runs to ~1.4k tokens)")
    g.add_argument("--judge-sft-lr", type=float, default=5e-5, help="AdamW learning rate of the judge SFT")
    add_prepare_args(g, "the judges (tiny: data/skill_rm/judges; make prepare-skill-rm rebuilds them)")
    g = p.add_argument_group("benchmark (§5)")
    g.add_argument("--benchmark", action=on_off, default=True, help="the pairwise / best-of-4 benchmark")
    g.add_argument("--bench", default=str(ROOT / "data/skill_rm/bench.jsonl"),
                   help="the dev set (tuned on; reported beside the held-out set); bon_pools.jsonl beside it "
                        "(data/skill_rm/prepare.py)")
    g.add_argument("--heldout", default=str(ROOT / "data/skill_rm/heldout.jsonl"),
                   help="the held-out test set, the headline ('' = none; prepare.py --heldout builds it)")
    g.add_argument("--bench-per-cat", type=int, default=0, help="items per category to evaluate (0 = all)")
    g.add_argument("--methods", default="baseline,appended,python_only,skill_rm,oracle",
                   help="judges (§5 ablations; oracle: a scripted judge that knows the label)")
    g.add_argument("--formats", default="pairwise,best_of_4", help="benchmark readouts to run")
    g = p.add_argument_group("best-of-N (JETTS)")
    g.add_argument("--bon", action=on_off, default=True, help="best-of-N by sequential knockout")
    g.add_argument("--bon-prompts", type=int, default=0, help="prompts with a fixed candidate pool (0 = all)")
    g.add_argument("--bon-N", type=int, default=8, help="pool size N (paper: 10; our pools hold 8)")
    g.add_argument("--bon-temperature", type=float, default=1.0, help="policy temperature for the pools")
    g.add_argument("--bon-seeds", type=int, default=1, help="seeded knockout orders averaged")
    g = p.add_argument_group("instruction-following RL (App. D)")
    g.add_argument("--rl", action=on_off, default=True, help="GRPO with each reward variant")
    g.add_argument("--rl-rewards", default="skill_rm,direct,anchored", help="reward variants to compare")
    g.add_argument("--steps", type=int, default=200, help="GRPO steps per variant (not stated)")
    g.add_argument("--prompts-per-step", type=int, default=32, help="prompts per GRPO step (not stated)")
    g.add_argument("--eval-n", type=int, default=300, help="held-out instructions (paper: 300)")
    g.add_argument("--rl-max-turns", type=int, default=7, help="skill judge turn budget in RL (paper: 7)")
    renamed_flags(p, RENAMED)
    return p


def check_args(args):
    """Stop before any model loads when flags cannot give a result (clear message, no traceback)."""
    bad = [v for v in args.rl_rewards.split(",") if v not in RL_VARIANTS]
    if bad and args.rl:
        raise SystemExit(f"skill_rm: unknown --rl-rewards {','.join(bad)} (choose: {', '.join(RL_VARIANTS)})")
    if args.eval_n < 1 and args.rl:
        raise SystemExit("skill_rm: --eval-n must be at least 1 (the RL table needs a held-out test set)")


# ----- method: Reward-Evaluation Skills (skill folders, Agent Skills convention, NOTES §2) -----

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
        rows = [f"- {r['id']} ({r['type']}, {r['hard_or_soft']}, "
                f"applies to {', '.join(map(str, r['applies_to']))})"
                for r in self.resources if r["leakage_level"] != "oracle"]
        return "\n".join(rows)


def load_skill(folder):
    """One skill folder (checked by plumbing.read_skill_folder) as a Skill: M_RM and U_RM."""
    front, body, entries = read_skill_folder(folder)
    return Skill(front["name"], front["description"].strip(), front.get("metadata") or {}, body, entries,
                 Path(folder))


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


# ----- method: the judge's action space, as the JSON schema of each turn (progressive disclosure) -----

def asks_checklist(task):
    """The loaded skill's procedure asks for the checklist form (instruction_following_pointwise)."""
    return task.mode == "pointwise" and task.skill is not None and "checklist" in task.skill.body


def turn_schema(task, skills, args):
    """The JSON schema of the judge's next reply: the final answer (plain judges, forced turns), else anyOf
    over the calls available now, ids enumerated: progressive disclosure and the leakage gate as a grammar."""
    final = final_schema(task.mode, len(task.candidates), asks_checklist(task))
    if task.method in ("baseline", "appended") or task.force:
        return final
    call = lambda name, arguments: schema_object({"name": {"const": name}, "arguments": arguments})
    code = {"type": "string", "maxLength": args.code_max_chars}
    calls = []
    if task.method == "python_only":
        calls.append(call("python_sandbox", schema_object({"code": code})))
    elif task.skill is None:
        calls.append(call("use_skill", schema_object({"name": {"enum": sorted(skills)}})))
    else:
        open_ = [r for r in task.skill.resources
                 if r["leakage_level"] != "oracle" and r["allowed_setting"] != "oracle_only"]
        views = [r["id"] for r in open_ if r["type"] not in ("tool", "verifier")]
        if views and task.n_viewed < args.max_resources:
            calls.append(call("view_resource", schema_object({"id": {"enum": views}})))
        calls.append(call("python_sandbox", schema_object({"code": code})))
        for r in open_:
            if r["type"] in ("tool", "verifier"):
                calls.append(call("run_verifier", schema_object({"id": {"const": r["id"]}})))
                if "code" in r.get("arguments", []):
                    with_code = schema_object({"id": {"const": r["id"]}, "code": code})
                    calls.append(call("run_verifier", with_code))
    calls.append(call("final_answer", final))
    return {"anyOf": calls}


# ----- method: the judge: prompts, tool execution, the bounded multi-turn loop (NOTES §2) -----

SKILL_METHODS = ("skill_rm", "oracle")  # judges that see the skills (the oracle is scripted: the upper bound)


def tool_system_prompt(mode, K, skills, method):
    """Skill-RM system prompt (B.3, B.5): only use_skill and final_answer until a skill is loaded."""
    lines = ["You are a reward judge. Evaluate the visible text only. You act by calling tools, exactly one "
             'per reply, in this format:\n{"name": "TOOL", "arguments": {...}}',
             f"You must finish with {contract_text(mode, K)}.", "Tools:"]
    if method in SKILL_METHODS:
        lines.append('- use_skill {"name": SKILL}: load one Reward-Evaluation Skill (its procedure and '
                     "resource index). Use it for constraints, code or math checks, or close calls. "
                     "At most one skill.")
    if method == "python_only":
        lines.append('- python_sandbox {"code": CODE}: run Python; variables prompt and candidates are set; '
                     'print results.')
    lines.append(f"- final_answer: your judgment, e.g. {contract_text(mode, K).split('final_answer ')[1]}")
    if method in SKILL_METHODS:
        lines.append("Available skills (name: description):")
        lines += [f"- {s.name}: {s.description}" for s in skills.values()]
    return "\n".join(lines)


def appended_resources(skill, resource_chars):
    """Ablation 'resources appended': the skill's procedure and every non-oracle resource in the prompt."""
    parts = [f"Evaluation resources ({skill.name}):", skill.body]
    for r in skill.resources:
        if r["leakage_level"] != "oracle":
            parts.append(f"## {r['id']} ({r['type']})\n"
                         + (skill.folder / r["path"]).read_text()[:resource_chars])
    return "\n\n".join(parts)


def default_skill(mode, skills):
    """The skill a mode uses when one must be fixed (appended ablation): the one listing the mode first."""
    ranked = [(s.metadata.get("modes", []).index(mode), name) for name, s in skills.items()
              if mode in s.metadata.get("modes", [])]
    return skills[min(ranked)[1]] if ranked else next(iter(skills.values()))


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
        return (f"Skill {match.name} loaded.\n{match.body}\n\nResources (view_resource {{\"id\": ID}}, "
                f"at most {args.max_resources}):\n{match.index_text()}\n\n"
                f"New tools: view_resource {{\"id\": ID}}; "
                'run_verifier {"id": ID} runs a verifier or tool resource over the prompt and candidates and '
                'prints its report ({"id": ID, "code": EXTRA} runs your extra code after it); python_sandbox '
                '{"code": CODE} (variables prompt, candidates, response).')
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
        # vLLM's grammar cannot bound it (plumbing.xgrammar_schema)
        if args.constrained and len(code) > args.code_max_chars:
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
    if task.method in ("baseline", "appended"):  # one turn: the final answer, a final_answer call or text
        call = parse_tool_call(text)
        task.judgment = (call["arguments"] if call and call["name"] == "final_answer"
                         else text_judgment(text, task.mode, labels))
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
    """A judgment from a reply that is no tool call: the bare final answer {"verdict": "A"} (constrained
    decoding), else plain text ([[A]], 'score: 0.8', on the 0-1 scale); None if nothing parses."""
    obj = first_json_object(text or "")
    if isinstance(obj, dict) and any(k in obj for k in FINAL_KEYS):
        return obj
    if mode == "pointwise":
        s = parse_text_rating(text, 1.0)
        return {"score": s} if s is not None else None
    v = parse_text_verdict(text, labels)
    return {"verdict": v} if v else None


def run_judges(sampler, tok, tasks, skills, args, max_turns):
    """Every task's judge to completion, batched turn by turn (NOTES §2, judge_turns): plain methods one turn;
    tool methods `max_turns` turns, `args.retries` retries after no valid call, then a forced final_answer.
    `sampler`: one model or {method: sampler, "default": ...}; scripted tasks (oracle, SFT traces):
    rb.scripted_reply."""
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
    # chunks of one method's tasks, each through all its turns before the next: a chunk's conversations stay
    # in vLLM's prefix cache from turn to turn (all at once, every turn prefilled each conversation again)
    n, by_method = args.judge_chunk or len(tasks) or 1, sorted(tasks, key=lambda t: t.method)
    for i in range(0, len(tasks), n):
        judge_turns(sampler, tok, by_method[i:i + n], skills, args, max_turns)
    for t in tasks:  # a task still open here ran out of turns without a final answer
        t.done = True
    return tasks


def judge_turns(sampler, tok, tasks, skills, args, max_turns):
    """run_judges' bounded loop over `tasks`: each turn, one batched generate per judge model."""
    for turn in range(max_turns + 1):
        active = [t for t in tasks if not t.done]
        if not active:
            break
        for t in active:
            if t.method in ("baseline", "appended"):
                continue
            if (turn == max_turns or t.force) and not t.force_asked:
                t.force = t.force_asked = True
                answer = contract_text(t.mode, len(t.candidates)).split("final_answer ")[1]
                t.messages.append({"role": "user", "content": "Budget used up: call final_answer now, "
                                   + answer + "."})
        for t in active:  # every reply's schema, scripted ones too (judge_sft leaves what it forces out)
            t.schemas.append(turn_schema(t, skills, args) if args.constrained else None)
        replies = {id(t): rb.scripted_reply(t, asks_checklist(t))
                   for t in active if t.scripted or t.method == "oracle"}
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
            outs = s.generate(prompts, 1, args.judge_max_new_tokens, args.judge_temperature,
                              stop=["</tool_call>"], json_schema=schemas)
            replies.update({id(t): o[0].text for t, o in zip(group, outs)})
        for t in active:
            judge_step(t, replies[id(t)], skills, args, LABELS[:len(t.candidates)])


def judge_on_ranks(sampler, tok, tasks, skills, args, max_turns, dist=None):
    """run_judges with the tasks dealt over the ranks (plumbing.on_ranks): every judged task, in order."""
    judge_share = lambda share: run_judges(sampler, tok, share, skills, args, max_turns)
    return on_ranks(judge_share, tasks, dist or Dist())


# ----- method: §3 deterministic readout and the App. D rewards -----

def readout_pointwise(judgment):
    """§3, K = 1: clamp₀¹(score); else satisfied/total of the checklist (total 0 → 1.0);
    unparseable → 0.5 flagged invalid. Returns (reward, valid)."""
    if not isinstance(judgment, dict):
        return 0.5, False
    s = parse_number(judgment.get("score"), ratio=True)
    if s is not None:
        # r = clamp(score, 0, 1)
        return min(max(s, 0.0), 1.0), True
    sat = parse_number(judgment.get("satisfied_count"), ratio=True)
    tot = parse_number(judgment.get("total_count"), ratio=True)
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
    """§3, K = 2, both presentation orders (chosen as A, then as B): +1 per order that prefers the chosen,
    −1 per order that prefers the rejected, 0 for Tie/invalid; the pair is won iff the sum > 0."""
    per = [{"A": 1, "B": -1}.get(verdict_chosen_first, 0), {"B": 1, "A": -1}.get(verdict_chosen_second, 0)]
    return {"win": float(sum(per) > 0), "sum": sum(per),
            "valid": float(verdict_chosen_first in ("A", "B", "Tie")
                           and verdict_chosen_second in ("A", "B", "Tie")),
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


@dataclass
class Judge:
    """A judge as the rewards and best-of-N call it: a sampler or {method: sampler}, tokenizer, skills."""
    sampler: object
    tok: object
    skills: dict


def judge_rewards(judge, prompts, responses, variant, args, anchors=None, seed=0):
    """App. D rewards: skill_rm, the pointwise Skill-RM score; direct, a one-turn LLM-judge rating; anchored,
    Skill-RM pairwise against a fixed reference (random A/B order). Returns (rewards, valid, tasks)."""
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
    run_judges(judge.sampler, judge.tok, tasks, judge.skills, args, args.rl_max_turns)
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


# ----- method: judge SFT warm-up (not in the paper; difference 8) -----

def trace_examples(tok, messages, schemas=None, grammar=None):
    """A judge trace as SFT examples (prompt_ids, target_ids, mask): everything after the first user turn
    is one target, trained on the judge's replies (+ end of turn, mask 1), not on the observations and
    chat markup between them (mask 0). Each reply is tokenised as the sampler generated it; where the
    chat template does not extend the tokens so far, the trace is cut and a new example begins. With a
    GrammarReplay and each turn's schema, the tokens that schema fixed are mask 0 too (no decision)."""
    out, seq, n0, mask = [], [], 0, []
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for j, k in enumerate(turns):
        prefix = chat_ids(tok, messages[:k])
        reply = tok.encode(messages[k]["content"], add_special_tokens=False) + [tok.eos_token_id]
        schema = schemas[j] if schemas and j < len(schemas) else None
        if seq and prefix[:len(seq)] == seq:
            mask += [0] * (len(prefix) - len(seq))  # the observation and markup since the last reply
        else:
            if seq:
                out.append((seq[:n0], seq[n0:], mask))
            n0, mask = len(prefix), []
        seq = prefix + reply
        # replayed under the grammar vLLM decodes with: a bounded string rejects a JSON escape such as \n
        # (plumbing.xgrammar_schema), and after a rejection every token would count as decided (#49 §4)
        mask += (grammar.decided(xgrammar_schema(schema), reply) if grammar is not None and schema is not None
                 else [1] * len(reply))
    if seq:
        out.append((seq[:n0], seq[n0:], mask))
    return out


def sft_examples(tok, skills, args, method, grammar):
    """`method`'s scripted traces on the SFT split (rb.scripted_reply) as SFT examples (trace_examples)."""
    tasks = judge_sft_tasks(sft_items(args.seed, args.judge_sft_items), method, args.seed)
    run_judges(None, tok, tasks, skills, args, args.max_turns)
    return [e for t in tasks for e in trace_examples(tok, t.messages, t.schemas, grammar)]


def token_matched(examples, target, batch, seed=0):
    """#49 §2: examples that train `target` supervised tokens (mask 1) in whole batches: `examples` in seeded
    shuffled passes, cut after the batch whose running total comes nearest to target. One pass of sft_loop
    over them (len / batch steps) trains each once: within half a batch's tokens of target."""
    tokens, rng, order = [sum(m) for _, _, m in examples], random.Random(seed), []
    while sum(tokens) and (len(order) < 2 * batch or sum(tokens[i] for i in order) < target + sum(tokens)):
        order += rng.sample(range(len(examples)), len(examples))  # passes, to one beyond the target
    total = list(itertools.accumulate((tokens[i] for i in order), initial=0))
    # n* = argmin_n |Σ_{i < n} supervised_i − T| over whole batches, n = B, 2B, …
    cuts = range(batch, len(order) + 1, batch) if batch > 0 else ()
    n = min(cuts, key=lambda n: abs(total[n] - target), default=0)
    return [examples[i] for i in order[:n]]


def judge_sft(judge, tok, skills, args, dist, method, lr=None, model=None):
    """A new judge, SFT-warmed on scripted traces of the SFT split (skill_rm: use_skill → run_verifier
    → final_answer; python_only: python_sandbox with its own check → final_answer; the plain judge: the
    answer). The plain and skill judges train the same steps × examples; python_only as many supervised
    tokens as skill_rm (token_matched; the plain judge stays step-matched: docs/skill_rm.md).
    model: train it in place at lr (prepare_judges' LoRA) and return sft_loop's metrics instead."""
    hf = not judge_recipe(args)["fixed_tokens_trained"]  # GrammarReplay: the loss skips a schema's fixed text
    grammar = GrammarReplay(tok, unwrap(judge).config.vocab_size) if hf else None
    examples = sft_examples(tok, skills, args, method, grammar)
    steps, batch = args.judge_sft_steps, args.judge_sft_batch
    if method == "python_only":
        skill = [sum(m) for _, _, m in sft_examples(tok, skills, args, "skill_rm", grammar)]
        # T = steps · B · (1/n) Σ_i supervised_i over skill_rm's n examples (B: sft_loop's batch)
        target = steps * min(batch or len(skill), len(skill)) * sum(skill) / max(len(skill), 1)
        batch = min(batch or len(examples), len(examples))
        examples = token_matched(examples, target, batch, args.seed)
        steps = len(examples) // max(batch, 1)
    dtype = getattr(torch, compute_dtype(args))
    trained = copy.deepcopy(judge).to(dtype).train().requires_grad_(True) if model is None else model
    metrics = sft_loop(trained, examples, args, dist, lr or args.judge_sft_lr, batch, steps, seed=args.seed,
                       log_dir=Path(args.run_dir) / f"judge_sft_{method}",
                       micro_batch=args.judge_sft_micro_batch)
    return metrics if model is not None else trained.eval().requires_grad_(False)


def judge_recipe(args):
    """The flags the judges' SFT warm-ups depend on: a prepared adapter serves only a run with the same. A
    schema's fixed text is trained unless HF decoding forces its canonical tokens; xgrammar (vLLM) leaves
    their tokenization to the judge, so there it is trained (docs/skill_rm.md)."""
    return {**{k: getattr(args, k) for k in JUDGE_SFT_FLAGS}, "skills": Path(args.skills_dir).name,
            "fixed_tokens_trained": not (args.constrained and args.sampler == "hf")}


def prepare_judges(args):
    """--prepare-warmup (#48 §1): each judge's SFT once as LoRA in --warmup-adapters (see warmed_judge)."""
    dist, skills = setup_distributed(), load_skills(args.skills_dir)
    for method in [m for m in ("baseline", "skill_rm", "python_only") if m in args.methods.split(",")]:
        seed_everything(args.seed)
        train = lambda m, tok: judge_sft(m, tok, skills, args, dist, method, args.lora_lr, model=m)
        prepare_lora(args, dist, train, f"judge-{method}", judge_recipe(args))


def warmed_judge(stages, backbone, tok, skills, args, dist, method):
    """The SFT-warmed judge of `method`: its weights from a finished stage (`Stages`), or its prepared adapter
    merged into the backbone (prepare_judges; only one made for this recipe and model), else judge_sft."""
    name, weights = f"judge_sft_{method}", stages.dir / f"judge_sft_{method}.pt"
    done = stages.load(name) is not None and weights.exists()
    model = copy.deepcopy(unwrap(backbone)) if done or args.warmup_adapters else None
    if done:
        model.load_state_dict(torch.load(weights, map_location="cpu"))
        return model.eval().requires_grad_(False)
    merged, why = use_prepared(model, args.warmup_adapters, f"judge-{method}", judge_recipe(args))
    if merged:
        print(f"judge {method}: {why}")
        return model.eval().requires_grad_(False)
    t0, model = time.time(), judge_sft(backbone, tok, skills, args, dist, method)
    print(f"judge {method}: SFT{f' ({why})' * bool(why)}, {time.time() - t0:.0f} s")
    if dist.is_main:  # every rank holds the same replica (judge_sft): rank 0 saves it
        torch.save(unwrap(model).state_dict(), weights.with_suffix(".tmp"))
        weights.with_suffix(".tmp").replace(weights)
    stages.save(name, {"weights": weights.name})
    return model


# ----- method: instruction-following GRPO with the Skill-RM reward (App. D) -----

def policy_prompt_ids(tok, prompts):
    return [chat_ids(tok, [{"role": "user", "content": p}]) for p in prompts]


def train_if_policy(variant, policy, sampler, judge, args, dist, anchors_by_prompt, train_set):
    """GRPO on verifiable instructions with one reward variant; the checkers only log, never reward."""
    tok = judge.tok
    ref = load_model(args.model, dist, args.dtype, trainable=False)[0] if args.beta > 0 else None
    opt = make_optimizer(policy, args)
    run_dir, seen, group_sds = Path(args.run_dir) / f"rl_{variant}", [], []
    for step in range(args.steps):
        t0 = time.time()
        n = args.prompts_per_step
        batch = train_set[step * n:(step + 1) * n][dist.rank::dist.world]  # this rank's prompts
        ids = policy_prompt_ids(tok, [b["prompt"] for b in batch])
        rollouts = sample_group_rollouts(sampler, ids, args.G, args)
        prompts = [batch[r.group]["prompt"] for r in rollouts]
        rewards, valid, tasks = judge_rewards(judge, prompts, [r.text for r in rollouts], variant, args,
                                              [anchors_by_prompt[p] for p in prompts],
                                              seed=args.seed * 7919 + step)
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
            reward_group_sd=sum(sd) / len(sd), judge_valid=float(sum(valid) / len(valid)),
            checker_strict=sum(h["all"] for h in hidden) / len(hidden),
            checker_loose=sum(h["frac"] for h in hidden) / len(hidden),
            judge_turns=sum(t.turns for t in tasks) / len(tasks), time_judge=t_judge,
            time_step=time.time() - t0), dist))
        log_metrics(run_dir, step, metrics, dist,
                    keys=("reward", "reward_group_sd", "judge_valid", "checker_strict", "time_step"))
        seen.append(metrics)
    means = {k: sum(m[k] for m in seen) / max(len(seen), 1)
             for k in ("reward", "reward_group_sd", "judge_valid")}
    return run_dir, means | {"group_sds": group_sds, "null_group_sd": null_group_sd(variant, args.G)}


def if_rl(policy, sampler, judge, args, dist, stages=None):
    """App. D: GRPO from the same initial policy with each reward variant, every policy scored on held-out
    instructions by IFEval's checkers; anchored pairwise compares with the initial policy's greedy reply.
    stages: the initial evaluation and each variant are stages (a resumed run skips the finished ones)."""
    train_set = if_prompts(args.seed, args.steps * args.prompts_per_step, "train")
    test_set = if_prompts(args.seed, args.eval_n, "test")
    load = stages.load if stages else lambda name: None
    save = stages.save if stages else lambda name, result: result
    variants = args.rl_rewards.split(",")
    rl = {"initial": load("rl_initial")} | {v: load(f"rl_{v}") for v in variants}
    todo = [v for v in variants if rl[v] is None]
    init_state = cpu_snapshot(policy) if todo else None  # on the CPU: no GPU memory for the copy
    # anchored pairwise: a fixed reference response per prompt from the initial policy (greedy)
    refs = sampler.generate(policy_prompt_ids(judge.tok, [t["prompt"] for t in train_set]), 1,
                            args.max_new_tokens, 0.0) if "anchored" in todo else [[None]] * len(train_set)
    anchors = {t["prompt"]: o[0] and o[0].text for t, o in zip(train_set, refs)}
    evaluate = lambda: eval_if_policy(sampler, judge.tok, test_set, args, dist)
    rl["initial"] = rl["initial"] or save("rl_initial", evaluate())
    for variant in todo:
        restore_snapshot(policy, init_state)
        sampler.sync(policy)
        run_dir, train = train_if_policy(variant, policy, sampler, judge, args, dist, anchors, train_set)
        rl[variant] = save(f"rl_{variant}", {**evaluate(), **train})
        if dist.is_main:  # rank 0 writes the plots and results
            plot_curves(run_dir, ("reward", "judge_valid", "checker_strict"))
    rows = {k: {"prompt_strict": 100 * v["prompt_strict"], "inst_level": 100 * v["inst_level"]}
            | ({"reward_sd": v["reward_group_sd"], "no-signal sd": v["null_group_sd"],
                "judge_invalid%": 100 * (1 - v["judge_valid"])} if "judge_valid" in v else {})
            for k, v in rl.items()}
    print_table(f"instruction-following RL (App. D): {args.steps} GRPO steps per reward, eval on "
                f"{len(test_set)} held-out instructions with hidden checkers", rows,
                ["prompt_strict", "inst_level", "reward_sd", "no-signal sd", "judge_invalid%"],
                cell=lambda v: f"{v:.4g}", first="reward")
    return rl

# ----- evaluation: §5 reward-modelling benchmark, pairwise (both orders) and best-of-4 -----

CODE_TOOLS = ("python_sandbox", "run_verifier")  # the calls that run code in the sandbox


def code_result_used(task):
    """Did the final answer follow the last code run's report ("matches: ['A']", "2 of 3 pass; score 0.625")?
    None when no code ran or its report names no candidate and no score."""
    runs = [st for st in task.trace if st["call"] and st["call"]["name"] in CODE_TOOLS and st["observation"]]
    if not runs or task.judgment is None:
        return None
    obs = runs[-1]["observation"]
    if task.mode == "pointwise":
        r, ok = readout_pointwise(task.judgment)
        # parse_number, not int(): int(a) / int(b) overflows a float past ~308 digits (int() refuses 4,300);
        # (?<!\d): not every suffix of a run of digits again (quadratic in a flood of digits)
        passes = re.findall(r"(?<!\d)(\d+) of (\d+) pass", obs)
        counts = [(parse_number(a), parse_number(b)) for a, b in passes]
        said = [a / b for a, b in counts if a is not None and b]
        said += [float(x) for x in re.findall(r"score (\d+(?:\.\d+)?)", obs)]
        return ok and any(abs(r - x) < 0.051 for x in said) if said else None
    labels = LABELS[:len(task.candidates)]
    named = rb.report_winners(obs, labels)
    return judgment_label(task.judgment, labels) in named if named else None


def score_benchmark(tasks, meta):
    """Per (method, format, category): `score`, `valid`, pairwise `consistent` (0 if position-locked) and
    `order_A` / `order_B`, means of turns and tool use, `code_used`, `items` {item id: score}
    (docs/skill_rm.md)."""
    acc, pending = {}, {}
    for t, (iid, cat, method, fmt, extra) in zip(tasks, meta):
        key = (method, fmt, cat)
        row = acc.setdefault(key, {"score": [], "valid": [], "turns": [], "skill": [], "viewed": [],
                                   "calls": [], **{f"calls_{n}": [] for n in TOOL_NAMES}, "code_used": [],
                                   "items": {}})
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
                row.setdefault("order_A", []).append(float(v0 == "A"))
                row.setdefault("order_B", []).append(float(v1 == "B"))
                row["items"][iid] = r["win"]
                row.setdefault("items_consistent", {})[iid] = r["consistent"]
        else:
            choice = judgment_label(t.judgment, "ABCD")
            row["score"].append(readout_selection(choice, extra, 4))
            row["valid"].append(float(choice in tuple("ABCD")))
            row["items"][iid] = row["score"][-1]
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    return {k: {m: (v if m.startswith("items") else mean(v)) for m, v in row.items()}
            | {"n": len(row["score"]), "n_judgments": len(row["turns"])} for k, row in acc.items()}


def benchmark(judge, args, dist, methods, formats):
    """§5 on each benchmark set (bench_sets): every method judges every item (pairwise in both orders,
    best-of-4), the no-model baselines score the same items; returns {set: scores by (method, format,
    category)}, {set: {item id: cluster}}, the judge warnings, and writes every judgment with its trace."""
    t0 = time.time()
    sets = bench_sets(args.heldout, args.bench, args.bench_per_cat, args.seed)
    tasks, meta, where = [], [], []
    for name, items in sets.items():
        t, m = benchmark_tasks(items, methods, formats, args.seed)
        tasks, meta, where = tasks + t, meta + m, where + [name] * len(t)
    tasks = judge_on_ranks(judge.sampler, judge.tok, tasks, judge.skills, args, args.max_turns, dist)
    by_set = {}
    for name, items in sets.items():
        idx = [i for i, w in enumerate(where) if w == name]
        res = score_benchmark([tasks[i] for i in idx], [meta[i] for i in idx])
        res |= rb.baseline_scores(items, formats, args.seed, skills_dir=args.skills_dir)
        by_set[name] = with_ci(res)
        print(f"\n=== benchmark set: {SET_NAMES[name]} ({len(items)} items"
              + (", the headline" if name == "heldout" else ", tuned on: reported beside") + ") ===")
        print_benchmark_table(by_set[name], methods, formats, title=f"[{SET_NAMES[name]}] ")
    clusters = {name: {it["id"]: rb.item_cluster(it) for it in items} for name, items in sets.items()}
    print(f"(benchmark: {sum(map(len, sets.values()))} items, {len(tasks)} judgments, "
          f"{time.time() - t0:.0f} s)")
    for t in [t for t in tasks if t.method == "skill_rm"][:args.show_trace]:
        print("\n" + format_trace(t))
    if dist.rank == 0:  # every judgment with its whole trace, to read what a judge did
        rb.write_judgments(Path(args.run_dir) / "bench_judgments.jsonl", tasks, meta, where)
    warnings = [f"[{SET_NAMES[name]}] {w}" for name, res in by_set.items()
                for w in judge_warnings(res, methods)] + template_copy_warnings(by_set, methods)
    print("\n".join(f"WARNING {w}" for w in warnings)
          or "no judge is position-locked, at chance, tool-less or copying a dev-set rule")
    rb.print_tool_calls(by_set, methods, TOOL_NAMES)  # the per-method tool use, issue #26 §1
    return by_set, clusters, warnings


# ----- evaluation: §5 best-of-N by JETTS sequential pairwise knockout (tasks.reward_bench) -----

def best_of_n(judge, pools, method, args, seeds, dist=None):
    """seqko@{1,2,4,8,N} for one judge method, averaged over knockout seeds."""
    N = args.bon_N
    ks = sorted({k for k in (1, 2, 4, 8, N) if k <= N})
    scores = [p["scores"][:N] for p in pools]

    valid = []

    def judge_batch(reqs):
        tasks = [JudgeTask(pools[p]["prompt"], [pools[p]["candidates"][a], pools[p]["candidates"][b]],
                           "pairwise", method,
                           label="A" if pools[p]["scores"][a] >= pools[p]["scores"][b] else "B",
                           category=pools[p]["category"])
                 for p, a, b in reqs]
        tasks = judge_on_ranks(judge.sampler, judge.tok, tasks, judge.skills, args, args.max_turns, dist)
        verdicts = [judgment_label(t.judgment, "AB") for t in tasks]
        valid.extend(v in ("A", "B") for v in verdicts)
        return verdicts

    runs = [rb.sequential_knockout(scores, judge_batch, args.seed * 1000 + s, ks) for s in range(seeds)]
    out = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0] if k != "per_pool"}
    per_pool = {k: [sum(r["per_pool"][k][p] for r in runs) / len(runs) for p in range(len(pools))]
                for k in runs[0]["per_pool"]}
    return out | {"invalid": 1 - sum(valid) / max(len(valid), 1), "per_pool": per_pool}


# ----- evaluation: the results.json headline, every number beside its chance line (stats.py) -----

def build_headline(by_set, bon, rl, methods, clusters=None):
    """Per benchmark set (held-out first, the headline; dev beside): bench_headline; seqko@N beside random@N
    and oracle@N per pool; IF-RL reward sd beside a no-signal judge's (--aggregate pools seeds)."""
    H = []
    for name in [s for s in rb.BENCH_SETS if s in (by_set or {})]:
        H += bench_headline(by_set[name], methods, name, (clusters or {}).get(name))
    note = " [SFT: skill targets copy a verifier report, plain targets do not]"
    for m, r in (bon or {}).items():
        pp = r["per_pool"]
        seqko, rand, orc = (next(v for k, v in pp.items() if k.startswith(x))
                            for x in ("seqko@", "random@", "oracle@"))
        N = next(k for k in pp if k.startswith("random@"))[7:]
        pools = range(len(seqko))  # pool p: line p of the fixed bon_pools.jsonl in every seed
        H.append(compare(f"best-of-N seqko@{N} vs random@{N} ({m})", m, f"random@{N}", seqko, rand,
                         item_ids=pools))
        H.append(compare(f"best-of-N seqko@{N} vs oracle@{N} ({m})", m, f"oracle@{N}", seqko, orc,
                         item_ids=pools))
    if bon and "skill_rm" in bon and "baseline" in bon:
        N = next(k for k in bon["skill_rm"]["per_pool"] if k.startswith("seqko@"))
        H.append(compare(f"best-of-N {N}: Skill-RM vs plain judge{note}", "skill_rm", "baseline",
                         bon["skill_rm"]["per_pool"][N], bon["baseline"]["per_pool"][N],
                         item_ids=range(len(bon["skill_rm"]["per_pool"][N]))))
    for v, r in (rl or {}).items():
        if "group_sds" in r:
            H.append(vs_chance(f"IF-RL within-group reward sd ({v}) vs no-signal judge", v, r["group_sds"],
                               r["null_group_sd"]))
            H.append(compare(f"IF held-out instruction-level accuracy: {v} vs initial policy", v, "initial",
                             r["per_prompt"], rl["initial"]["per_prompt"]))
    return H

# ----- main -----

def main(argv=None):
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="skill_rm")
    if args.aggregate or args.prepare_warmup:  # pool finished runs (seeds), or prepare the judges' warm-ups
        return aggregate_main(args.aggregate) if args.aggregate else prepare_judges(args)
    check_args(args)
    dist = setup_distributed()
    stages = Stages(args, dist)  # --resume: finished stages read back; other settings stop it here
    preflight(args, dist, frozen=1 + (args.rl and args.beta > 0), hf=dist.world > 1,  # the judge; π_ref
              engines=(args.max_model_len, args.judge_max_model_len) if dist.world == 1 else 1)
    if args.rl:
        per_rank(args.prompts_per_step, dist, "--prompts-per-step")
    seed_everything(args.seed + dist.rank)
    t_start = time.time()
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)  # without judge SFT nothing had made it

    # the Reward-Evaluation Skills: one folder each (SKILL.md, resources.yaml, rubrics, verifiers)
    try:
        skills = load_skills(args.skills_dir)
    except SkillError as e:
        raise SystemExit(f"skill_rm: {e}")
    policy, tok = load_policy(args, dist)
    sampler = make_sampler(args, policy, tok, dist)
    pools_path = Path(args.bench).with_name("bon_pools.jsonl")
    results = {"args": vars(args)}
    methods, formats = args.methods.split(","), args.formats.split(",")

    # the judges, one backbone: the plain LLM judge (baseline; appended on its weights), the skill judge and
    # the plain judge with the python tool (python_only), each turn decoded under its JSON schema; with
    # --judge-sft-steps each its own SFT stage (judge_sft)
    t0 = time.time()
    backbone = make_judge(policy, args, dist)
    if args.judge_sft_steps > 0:  # python_only's SFT only when it is judged
        own = ["baseline", "skill_rm"] + ["python_only"] * ("python_only" in methods)
        judges = {m: make_judge_sampler(warmed_judge(stages, backbone, tok, skills, args, dist, m), tok, args,
                                        dist) for m in own}
    else:  # one untrained judge for every method
        judges = {"baseline": make_judge_sampler(backbone, tok, args, dist)}
    judge = Judge({"default": judges["baseline"], "appended": judges["baseline"], **judges}, tok, skills)
    results["time_judge_sft"] = time.time() - t0

    # §5: the judges as reward models, by the §3 readout: pairwise (both orders) and best-of-4 per category
    # on the held-out test set (the headline) and the dev set beside it, with the no-model baselines
    by_set, clusters = {}, {}
    if args.benchmark:
        if (done := stages.load("benchmark")) is None:
            by_set, clusters, warnings = benchmark(judge, args, dist, methods, formats)
            done = stages.save("benchmark", {"benchmark": rb.bench_json(by_set), "bench_clusters": clusters,
                                             "judge_warnings": warnings})
        by_set, clusters = rb.bench_json(done["benchmark"], back=True), done["bench_clusters"]
        for name, res in by_set.items() if stages.resume else ():  # read back: the tables again, for the log
            print_benchmark_table(res, methods, formats, title=f"[{SET_NAMES[name]}] ")
        results |= done

    # §5 best-of-N: JETTS sequential pairwise knockout over fixed pools
    if args.bon:
        t0 = time.time()
        pools = read_jsonl(pools_path)[:args.bon_prompts] if args.bon_prompts else read_jsonl(pools_path)
        print(f"\nbest-of-N (JETTS sequential knockout), {len(pools)} pools, N={args.bon_N}, "
              "true score = hidden checker")
        results["bon"] = stages.load("bon") or stages.save("bon", {
            m: best_of_n(judge, pools, m, args, args.bon_seeds, dist)
            for m in methods if m in ("baseline", "skill_rm", "oracle")})
        cols = [k for k in next(iter(results["bon"].values()), {}) if k != "per_pool"]
        print_table("", results["bon"], cols, cell=lambda v: f"{v:.3f}", first="judge")
        print(f"(best-of-N: {time.time() - t0:.0f} s)")

    # App. D: GRPO with the skill-based reward (and the direct / anchored rewards), hidden-checker evaluation
    if args.rl:
        t0 = time.time()
        results["rl"] = if_rl(policy, sampler, judge, args, dist, stages)
        print(f"(RL: {time.time() - t0:.0f} s)")
    results["time_total"] = time.time() - t_start
    results["headline"] = build_headline(by_set, results.get("bon"), results.get("rl"), methods, clusters)
    if not dist.is_main:  # rank 0 writes the results
        return results
    print("\n" + format_headline(results["headline"]))
    write_results(args.run_dir, {k: v for k, v in results.items() if k != "headline"}, results["headline"])
    print(f"\ntotal {time.time() - t_start:.0f} s; results in {args.run_dir}/results.json")
    return results


if __name__ == "__main__":
    run_main(main)  # main(); a package not installed: one line; under torchrun exit_ranks (plumbing)
