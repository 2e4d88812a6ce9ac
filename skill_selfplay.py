"""
Skill Self-Play (Skill-SP): a proposer, a solver and an evolving skill library.

Paper: "Skill Self-Play: Pushing the Frontier of LLM Capability with Co-Evolving Skills" (Huang et al.,
2026), ../shared/papers/skill_selfplay.txt, Algorithm 2. Full notes: docs/skill_selfplay.md.

One iteration t: (1) the proposer writes tasks (x, c) in a skill stream (a package s ~ P(s), Eq. 13, in
its prompt) and an exploration stream; each is gated (Eq. 4) and probed by K solver samples (Eq. 1); GRPO
on R_propose (Eq. 2) minus the repetition penalty (Eq. 5). (2) The curriculum D(t) (Eq. 6) trains the
solver by GRPO (Eq. 7); it never sees package text. (3) The library evolves: refinement, pruning (Eq. 8),
induction (Eq. 9-10). Worlds: tasks/tool_calls.py (BFCL) and tasks/zebra.py (ZebraLogic-style runtime).

Run (CPU, embedded SmolLM2-135M; several processes: torchrun --nproc_per_node=2 ...):
    python skill_selfplay.py --family tool  --preset tiny
    python skill_selfplay.py --family zebra --preset tiny
Paper scale (Table 5; GPUs, a 4B+ model in a local folder):
    torchrun --nproc_per_node=8 skill_selfplay.py --family tool --preset paper --model /path/to/Qwen3-4B
Ablations (§4.3): --unguided, --skill-only, --uniform-routing, --frozen-skills, --frozen-proposer,
--frozen-feedback-solver (both frozen flags = "Frozen both").

Glossary: x = task prompt; c = hidden contract (reference call or unique grid); K = probes per candidate;
v_solve = mean probe reward; M = pool size; α = skill-stream share; σ = routing statistics (a, n_ver,
n_con, n_fd); κ, w_min, w_max, β_route, τ = routing constants of Eq. 11-13.

Differences from the paper (the eight that matter most; all 14 in docs/skill_selfplay.md):
 1. Scale: SmolLM2-135M on CPU; the tiny preset shrinks T, M, K, rollouts and steps.
 2. Held-out tool set: BFCL's four categories of Table 1 scored by BFCL's own AST checker; no API-Bank.
 3. ZebraLogic is offline-unavailable: held-out puzzles come from our runtime (fixed seed), plus
    reasoning-gym's zebra puzzles; trivial answers (constant, listed order, clue readers) beside every row;
    tiny: 2-house puzzles (--zebra-eval-scales two), where a 135M model can move.
 4. Zebra proposals are blueprints the runtime compiles until unique (App. I.2); validity is the checker.
 5. D(t) = the proposer's GRPO rollouts plus a fixed-size collection pass (--collect-prompts × G).
 8. A proposal is the JSON object its reply opens with, else reward −1.
10. Aids for a small model (tiny preset): grammar-constrained proposals, solver prefill/grid schema.
13-14. SFT warm-ups of both players before iteration 0 (paper none; tiny: 10, 12 steps, prepared as LoRA).
"""
import argparse
import collections
import copy
import dataclasses
import json
import math
import os
import random
import re
import time

import numpy as np

from grpo import (Rollout, add_grpo_args, chat_ids, grpo_update, parse_with_preset, sample_group_rollouts,
                  seed_everything, sft_loop)
from plumbing import (LOOP_KEYS, DealtSampler, HFSampler, add_prepare_args, broadcast_object, check_context,
                      check_keys, check_resume, controller_fields, frozen_snapshot, gather_objects,
                      iteration_metrics, json_text, load_model, load_policy, log_metrics, loop_failures,
                      make_optimizer, make_sampler, plot_loop, plot_run, preflight, prepare_lora,
                      read_library, read_records, reduce_metrics, reset_prefix_cache, resume_or_start,
                      run_main, same_row, save_generations, save_iteration, schema_sampler, setup_distributed,
                      solver_signal, usable_value, use_prepared)
from stats import aggregate_main, compare, format_headline, print_table, read_results, vs_chance
from stats import write_results
from tasks.tool_calls import (TOOL_TASK_SCHEMA, TOOL_TASK_SPEC, TOOL_VALIDATOR_KEYS, bfcl_headline,
                              call_budget, call_key, derive_tool_validator, evaluate_bfcl, gate_tool_task,
                              parse_tool_calls, print_bfcl_intervals, scripted_tool_tasks, tool_messages,
                              tool_package_error)
from tasks.zebra import (ZEBRA_COMPILER_KEYS, ZEBRA_TASK_SCHEMA, ZEBRA_TASK_SPEC, ZEBRA_VALIDATOR_KEYS,
                         derive_zebra_validator, evaluate_zebra, gate_zebra_blueprint, grade_grid,
                         grid_budget, grid_schema, render_zebra_prompt, trivial_baselines, zebra_headline,
                         zebra_package_error, zebra_sft_puzzles)


# ----- config: presets, flags (Table 5) and the arms of §4.3 -----

LIBRARIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "selfplay")  # S(0) folders
PRESETS = {
    # 2-core CPU, embedded 135M, the teaching run (#48): T = 1; both players warmed up (differences 13-14,
    # prepared once), temperature 0.7, the aids of difference 10, zebra 2 houses, greedy (docs: "tiny preset")
    "tiny": dict(T=1, M=8, proposer_prompts=2, proposer_G=2, proposer_steps=1, collect_prompts=16, solver_G=4,
                 solver_steps=2, solver_batch=4, eval_samples=1, eval_temperature=0.0, max_new_tokens=96,
                 controller_max_new_tokens=96, induce_min=1, zebra_eval_scales="two", rg_eval_n=2, lr=1e-5,
                 sampler="auto", micro_batch=2, temperature=0.7, proposer_grammar=True, solver_aid=True,
                 proposer_sft_steps=10, proposer_sft_batch=6, solver_sft_steps=12,
                 warmup_adapters=os.path.join(LIBRARIES, "warmup")),
    # Table 5 (flag defaults, BY_FAMILY["paper"]), its ablations' Qwen3-4B-Instruct; 8192 new tokens + prompt
    "paper": dict(model="Qwen/Qwen3-4B-Instruct-2507", max_model_len=12288),
    # one GPU of ≥ 80 GB, at most 1 h (estimated, not run), Qwen3-0.6B (two policies and engines fit): π_solve
    # after T = 2 iterations vs the base model on held-out items, paired (the table's first and last rows)
    "gpu": dict(model="Qwen/Qwen3-0.6B", sampler="auto", T=2, M=256, proposer_prompts=32, proposer_steps=2,
                collect_prompts=128, solver_steps=4, solver_batch=32, eval_samples=2, max_new_tokens=1024,
                proposer_max_new_tokens=1024, max_model_len=4096, induce_min=4, grad_checkpointing=True)}
# Per-family values by preset; they fill the flags no preset or argv set (parse_args), the preset's first,
# then the paper's (Table 5). Why the tiny ones: docs/skill_selfplay.md, "The tiny preset".
_PAPER_BOTH = dict(K=10, proposer_max_new_tokens=8192, proposer_sft_steps=0, proposer_sft_batch=0,
                   solver_sft_steps=0, eval_n=0)
BY_FAMILY = {
    "paper": {"tool": dict(_PAPER_BOTH, M=8000, proposer_steps=5, solver_steps=15, induce_min=20),
              "zebra": dict(_PAPER_BOTH, M=1920, proposer_steps=3, solver_steps=10, induce_min=10)},
    "tiny": {"tool": dict(library=os.path.join(LIBRARIES, "tool_tiny"), K=8, proposer_max_new_tokens=448,
                          eval_n=20), "zebra": dict(K=4, proposer_max_new_tokens=320)},
}
# the flags the warm-ups of differences 13-14 depend on (with S(0)'s folder and the proposal grammar)
WARMUP_FLAGS = ("family", "skill_only", "solver_aid", "proposer_sft_steps", "proposer_sft_batch",
                "solver_sft_steps", "solver_sft_tasks", "solver_sft_batch", "eval_seed", "zebra_eval_scales",
                "zebra_eval_per_scale", "zebra_eval_decided")
ARMS = ("unguided", "skill_only", "uniform_routing", "frozen_skills", "frozen_proposer",
        "frozen_feedback_solver")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grpo_args(p)
    # Table 5: KL coefficient 10⁻², weight decay 10⁻², 8192 new tokens
    p.set_defaults(beta=1e-2, weight_decay=1e-2, max_new_tokens=8192, G=None)  # G: see parse_args
    on_off = argparse.BooleanOptionalAction
    g = p.add_argument_group("task family and data")
    g.add_argument("--family", choices=["tool", "zebra"], default="tool", help="task family (§4.1)")
    g.add_argument("--library", default=None,
                   help="initial library S(0) folder; default data/selfplay/<family> (tiny tool: tool_tiny)")
    g.add_argument("--data-seed", type=int, default=0,
                   help="seed of the training-side puzzles and of --eval-n's draw")
    g.add_argument("--eval-seed", type=int, default=1234, help="seed of held-out zebra puzzles")
    g.add_argument("--versus", default=None, metavar="RUN_DIR",
                   help="another arm's finished run (same family, data seed): the headline adds their paired "
                        "comparison on the held-out items (make evidence: Skill-SP vs unguided)")
    g = p.add_argument_group("self-play loop (Table 5)")
    g.add_argument("--T", type=int, default=5, help="self-play iterations T; paper 5")
    g.add_argument("--K", type=int, default=None,
                   help="solver probes per candidate K (Eq. 1, 4); paper 10 (tiny: 8 tool, 4 zebra)")
    g.add_argument("--M", type=int, default=None, help="pool size M (Eq. 6); paper 8000 tool / 1920 zebra")
    g.add_argument("--alpha", type=float, default=0.5, help="skill-stream share α (Eq. 6); paper 0.5")
    g.add_argument("--v-lo", type=float, default=0.25, help="frontier band: lowest v_solve; paper 0.25")
    g.add_argument("--v-hi", type=float, default=0.75, help="frontier band: highest v_solve; paper 0.75")
    g.add_argument("--zebra-band", action=on_off, default=False, help="v_solve band on zebra too; paper off")
    g.add_argument("--collect-prompts", type=int, default=2048,
                   help="prompts of the collection pass (×G, no gradient; App. E, difference 5)")
    g.add_argument("--proposer-grammar", action=on_off, default=False,
                   help="decode proposals under the task's JSON schema (vLLM only); paper off")
    g.add_argument("--solver-aid", action=on_off, default=False,
                   help="tool: prefill the call opening; zebra: decode the grid under its schema; paper off")
    g.add_argument("--proposer-prompts", type=int, default=256, help="proposer prompts per step (half skill)")
    g.add_argument("--proposer-G", type=int, default=4, help="proposer rollouts per prompt; paper 4")
    g.add_argument("--proposer-steps", type=int, default=None, help="GRPO steps; paper 5 tool, 3 zebra")
    g.add_argument("--proposer-sft-steps", type=int, default=None,
                   help="proposer SFT steps on S(0)'s examples (difference 13); paper 0 (tiny: 10)")
    g.add_argument("--proposer-sft-lr", type=float, default=1e-4, help="learning rate of that SFT warm-up")
    g.add_argument("--proposer-sft-batch", type=int, default=None,
                   help="examples per SFT step, at random; 0 = all (default: 0; tiny: 6)")
    g.add_argument("--solver-sft-steps", type=int, default=None,
                   help="solver SFT steps on scripted tasks (difference 14); paper 0 (tiny: 12)")
    g.add_argument("--solver-sft-tasks", type=int, default=64, help="tasks (puzzles) of that warm-up")
    g.add_argument("--solver-sft-batch", type=int, default=8, help="tasks per solver SFT step, at random")
    g.add_argument("--solver-sft-lr", type=float, default=1e-4, help="learning rate of that warm-up")
    add_prepare_args(g, "both warm-ups (tiny: data/selfplay/warmup; make prepare-selfplay rebuilds them)")
    g.add_argument("--proposer-max-new-tokens", type=int, default=None,
                   help="proposer generation limit; paper 8192 (tiny: 448 tool, 320 zebra)")
    g.add_argument("--solver-G", type=int, default=5, help="solver rollouts per task; paper 5")
    g.add_argument("--solver-steps", type=int, default=None, help="GRPO steps; paper 15 tool, 10 zebra")
    g.add_argument("--solver-batch", type=int, default=64, help="tasks per solver GRPO step")
    g.add_argument("--parse-penalty", type=float, default=-1.0, help="reward of unparsed proposals; paper -1")
    g.add_argument("--rep-threshold", type=float, default=0.5, help="Jaccard threshold of App. C; paper 0.5")
    g = p.add_argument_group("routing (App. B, Table 5)")
    g.add_argument("--kappa", type=float, default=4.0, help="Beta prior strength κ (Eq. 11); paper 4")
    g.add_argument("--w-min", type=float, default=0.25, help="w_min (Eq. 13); paper 0.25")
    g.add_argument("--w-max", type=float, default=1.75, help="w_max (Eq. 13); paper 1.75")
    g.add_argument("--beta-route", type=float, default=1.0, help="exploration bonus β (Eq. 13); paper 1")
    g.add_argument("--tau", type=float, default=8.0, help="exploration bonus decay τ (Eq. 13); paper 8")
    g = p.add_argument_group("library evolution (§3.4)")
    g.add_argument("--gamma-prune", type=float, default=0.05, help="γ_prune (Eq. 8); not given in the paper")
    g.add_argument("--prune-min-attempts", type=int, default=4, help="attempts before Eq. 8 may prune")
    g.add_argument("--gamma-induce", type=float, default=0.5, help="γ_induce (Eq. 9); not given in the paper")
    g.add_argument("--induce-min", type=int, default=None,
                   help="packages induced per iteration, at least; paper ≥20 tool / ≥10 zebra")
    g.add_argument("--novelty-threshold", type=float, default=0.6,
                   help="max Jaccard similarity to an existing package (Eq. 10)")
    g.add_argument("--refine-max", type=int, default=2, help="packages refined per iteration")
    g.add_argument("--controller-max-new-tokens", type=int, default=2048, help="controller generation limit")
    g = p.add_argument_group("ablations (§4.3)")
    g.add_argument("--unguided", action=on_off, default=False, help="Unguided SP: exploration stream only")
    g.add_argument("--skill-only", action=on_off, default=False, help="Skill-only pool: no exploration")
    g.add_argument("--uniform-routing", action=on_off, default=False, help="Uniform routing: P(s) = 1/|S|")
    g.add_argument("--frozen-skills", action=on_off, default=False, help="Frozen skills: no evolution")
    g.add_argument("--frozen-proposer", action=on_off, default=False, help="Frozen proposer: no GRPO")
    g.add_argument("--frozen-feedback-solver", action=on_off, default=False,
                   help="probes by the solver as it enters self-play, frozen, not π_solve^(t)")
    g = p.add_argument_group("evaluation (Table 5: avg@8, temperature 1.0; its top-k 40 is not applied)")
    g.add_argument("--eval-n", type=int, default=None,
                   help="held-out items per BFCL category, drawn with --data-seed (0 = all 808; tiny: 20)")
    g.add_argument("--eval-samples", type=int, default=8, help="samples per held-out item (avg@k); paper 8")
    g.add_argument("--eval-temperature", type=float, default=1.0,
                   help="held-out sampling temperature; paper 1.0 (0 = greedy)")
    g.add_argument("--zebra-eval-per-scale", type=int, default=100, help="held-out zebra puzzles per scale")
    g.add_argument("--zebra-eval-scales", default="small,medium,large,xlarge",
                   help="held-out zebra scales; paper all four (Table 2); tiny: two (2 houses)")
    g.add_argument("--zebra-eval-decided", action=on_off, default=False,
                   help="held-out and warm-up zebra puzzles only those clue propagation decides; paper off")
    g.add_argument("--rg-eval-n", type=int, default=200, help="reasoning-gym zebra puzzles (0 = off)")
    g.add_argument("--plots", action=on_off, default=True, help="write the diagnostic PNGs")
    return p


def parse_args(argv=None):
    """Flags with the preset's values, BY_FAMILY's filling those left unset; the run folder's suffixes."""
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="skill_selfplay")
    for values in (BY_FAMILY.get(args.preset, {}).get(args.family, {}), BY_FAMILY["paper"][args.family]):
        for k, v in values.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
    if args.run_dir == f"runs/skill_selfplay-{args.preset}":  # no --run-dir given
        args.run_dir += "-" + args.family + "".join("-" + f for f in ARMS if getattr(args, f))
    if args.unguided and args.skill_only:
        raise SystemExit("--unguided and --skill-only exclude each other")
    if args.G is not None:  # grpo's one group size: each player has its own here
        raise SystemExit("skill_selfplay: --G is unused; give --proposer-G (paper 4), --solver-G (paper 5)")
    check_context(args, args.max_new_tokens, args.proposer_max_new_tokens)  # the controller: HF generate
    if args.versus and not args.aggregate:
        read_versus(args)  # checked before the run, not after it
    return args


def read_versus(args):
    """--versus: the other arm's results.json (same family and data seed), else one line saying why not."""
    r, want = read_results(f"{args.versus}/results.json", "--versus"), [args.family, args.data_seed]
    if not isinstance(r.get("final_items"), dict) or [r.get("family"), r.get("data_seed")] != want:
        raise SystemExit(f"--versus {args.versus}: no finished run of family {want[0]}, data seed {want[1]}")
    return r


def arm_name(args):
    """The run's arm: "skill-sp" (the full method) or its ablation flags joined by "+"."""
    return "+".join(f for f in ARMS if getattr(args, f)) or "skill-sp"


# ----- method: skill packages s = ⟨m, r, h, e, ν, σ⟩ and their integrity (§3.2, Eq. 10) -----
# A package is a file: front matter = m (name, title, family, source, iteration, derived_from,
# description); "## Rules" (+ "## Compiler" for zebra) = r; "## Hints" = h; "## Example" = e;
# "## Validator" = ν. σ lives in the library's stats.json. Validators are data, interpreted by tasks/.

def validate_package(pkg, family):
    """Integrity(s) of Eq. 10: fields, validator keys, and the example passes its own checks."""
    for k in ("name", "title", "description", "rules", "hints"):
        if not isinstance(pkg.get(k), str) or not pkg[k].strip():
            return f"field {k} is empty"
    if not re.fullmatch(r"[\w\-]{1,64}", pkg["name"]):
        return "bad package name"
    if pkg.get("family") != family:
        return f"package family is {pkg.get('family')!r}, not {family!r}"
    err = check_keys(pkg.get("validator"), TOOL_VALIDATOR_KEYS if family == "tool" else ZEBRA_VALIDATOR_KEYS,
                     "validator")
    if err:
        return err
    if family == "tool":
        return tool_package_error(pkg)
    err = check_keys(pkg.get("compiler"), ZEBRA_COMPILER_KEYS, "compiler")
    return err or zebra_package_error(pkg)


def new_stats():
    return {"a": 0, "n_ver": 0, "n_con": 0, "n_fd": 0, "accepted": 0, "a_t": 0, "R_t": 0.0, "failed_t": []}


def load_library(folder, family):
    """Packages of a library folder that pass Integrity (Eq. 10; the others are skipped), and σ."""
    return read_library(folder, lambda pkg: validate_package(pkg, family), new_stats)


# ----- method: rewards (Eq. 1, 2, 4, 14, 15) and the repetition penalty (App. C) -----

def tool_reward(text, call):
    """Eq. (14) with its parts: (R_tool, valid_format, exact_call, first parsed call)."""
    calls = parse_tool_calls(text)
    valid_format = len(calls) > 0
    exact = valid_format and call_key(calls[0]) == call_key(call)
    # Eq. (14): R_tool = 0.9·1{ExactCall(y, c)} + 0.1·1{ValidFormat(y)}
    r = 0.9 * float(exact) + 0.1 * float(valid_format)
    return r, valid_format, exact, (calls[0] if calls else None)


def zebra_reward(text, p, solution):
    """Eq. (15) with its parts: (R_logic, valid_structure, full_puzzle, cell accuracy, grid)."""
    valid, full, cell, grid = grade_grid(text, p, solution)
    # Eq. (15): R_logic = 0.9·1{FullPuzzle(y, c)} + 0.1·1{ValidStructure(y, c)}
    r = 0.9 * float(full) + 0.1 * float(valid)
    return r, valid, full, cell, grid


def v_solve(probe_rewards):
    # Eq. (1): v_solve(x, c; π_solve) = E_{y~π_solve(·|x)}[R_solve(x, y, c)], estimated by the mean over K
    # probes
    return sum(probe_rewards) / len(probe_rewards) if probe_rewards else 0.0


def probe_consistent(answer_keys, ref_key):
    """Third part of Eq. 4: a unique most frequent probe answer equal to the reference."""
    counts = collections.Counter(k for k in answer_keys if k is not None)
    if not counts:
        return False
    top = counts.most_common()
    unique = len(top) == 1 or top[0][1] > top[1][1]
    return unique and top[0][0] == ref_key


def propose_reward(valid, v):
    # Eq. (2): R_propose(x, c; π_solve) = 1{(x, c) is valid}·(1 − 2|v_solve(x, c; π_solve) − ½|)
    return float(valid) * (1 - 2 * abs(v - 0.5))


def words(text):
    return set(re.findall(r"\w+", text.lower()))


def jaccard(a, b):
    return len(a & b) / len(a | b) if a | b else 1.0


def repetition_penalty(texts, threshold, B=None):
    """App. C: ρ(x_i) = |C_i| / B over greedy Jaccard clusters (B defaults to len(texts))."""
    B = B or len(texts)
    founders, member_of = [], []
    for t in texts:
        w = words(t)
        for ci, f in enumerate(founders):
            if jaccard(w, f) >= threshold:
                member_of.append(ci)
                break
        else:
            founders.append(w)
            member_of.append(len(founders) - 1)
    size = collections.Counter(member_of)
    return [size[c] / B for c in member_of]


# ----- method: routing (App. B: Eq. 11-13) -----

def smoothed_rate(n, a, kappa):
    # Eq. (11): r̂ᵒ_j = (nᵒ_j + κ/2) / (a_j + κ)
    return (n + kappa / 2) / (a + kappa)


def skill_score(st, kappa):
    # Eq. (12): v_skill(s_j) = ½ r̂ᵛᵉʳ_j + ¼ r̂ᶜᵒⁿ_j + ¼ r̂ᶠᵈ_j
    return (0.5 * smoothed_rate(st["n_ver"], st["a"], kappa)
            + 0.25 * smoothed_rate(st["n_con"], st["a"], kappa)
            + 0.25 * smoothed_rate(st["n_fd"], st["a"], kappa))


def routing_probs(stats_list, kappa, w_min, w_max, beta, tau, uniform=False):
    """Selection probabilities P(s_j) over the library (list of σ dicts)."""
    if uniform:  # "Uniform routing" ablation
        return [1.0 / len(stats_list)] * len(stats_list)
    # Eq. (13): w(s_j) = clip(v_skill(s_j), w_min, w_max)·(1 + β·exp(−a_j/τ)),  P(s_j) = w(s_j) / Σ_ℓ w(s_ℓ)
    w = [min(max(skill_score(st, kappa), w_min), w_max) * (1 + beta * math.exp(-st["a"] / tau))
         for st in stats_list]
    return [x / sum(w) for x in w]


# ----- method: curriculum and library selection (Eq. 6, 8-10) -----

def build_curriculum(records, M, alpha, v_lo, v_hi, band=True):
    """Eq. (6) on valid records, restricted to the frontier band v_solve ∈ [v_lo, v_hi]."""
    pool = [r for r in records if r["valid"] and (not band or v_lo <= r["v_solve"] <= v_hi)]
    top = lambda stream, k: sorted([r for r in pool if r["stream"] == stream], key=lambda r: -r["R"])[:k]
    m_skill = int(round(alpha * M))
    # Eq. (6): D(t) = Top_αM(T_skill; R_propose) ∪ Top_(1−α)M(T_explore; R_propose)
    return top("skill", m_skill) + top("explore", M - m_skill)


def prune_set(pkgs, stats, gamma, min_attempts):
    """Eq. (8) on this iteration's attempts; untested packages are kept, the library never empties."""
    # Eq. (8): S_prune = {s ∈ S : E_{(x,c)~π_propose(·|s)}[R_propose(x, c; π_solve)] < γ_prune}
    out = [p["name"] for p in pkgs if stats[p["name"]]["a_t"] >= min_attempts
           and stats[p["name"]]["R_t"] / stats[p["name"]]["a_t"] < gamma]
    return out if len(out) < len(pkgs) else out[1:]


def induce_set(records, gamma):
    # Eq. (9): T_induce = {(x, c) ∈ T_explore : R_propose(x, c; π_solve) ≥ γ_induce}
    return [r for r in records if r["stream"] == "explore" and r["valid"] and r["R"] >= gamma]


def package_words(pkg):
    return words(" ".join(pkg[k] for k in ("title", "description", "rules", "hints")))


def novelty_ok(pkg, library, threshold):
    """Novelty(s, S) of Eq. 10: lexical Jaccard similarity to every package below threshold."""
    return all(jaccard(package_words(pkg), package_words(q)) < threshold for q in library)


# ----- method: rollouts: the proposer's prompts, the gate of Eq. 4, the K probes of Eq. 1 -----

# The proposer's reply is prefilled with the opening of the JSON object (the prefix is part of the
# prompt, not of the trained tokens): a small model then continues a task instead of chatting.
PROPOSER_PREFIX = {"tool": '{"tools": [{"name": "', "zebra": '{"houses": '}
# --proposer-grammar: proposals decoded under the task's JSON schema (syntax and key layout only)
TASK_SCHEMA = {"tool": TOOL_TASK_SCHEMA, "zebra": ZEBRA_TASK_SCHEMA}


def proposer_messages(family, pkg):
    """Skill stream (pkg given: rules r, hints h, example e) or exploration stream (pkg None)."""
    if family == "tool":
        head = "You write training tasks for a function-calling assistant. " + TOOL_TASK_SPEC
        ask = "Write one NEW task in this JSON format with different tools and values. Output only the JSON."
    else:
        head = "You write logic grid puzzles for a solver. " + ZEBRA_TASK_SPEC
        ask = ("Write one NEW puzzle blueprint in this JSON format (houses and attributes; clues are "
               "optional, a runtime completes them until the solution is unique). Output only the JSON."
               if pkg else "Write one NEW puzzle in this JSON format whose clues determine exactly one "
               "solution. Output only the JSON.")
    if pkg is None:
        return [{"role": "user", "content": head + "\n" + ask}]
    body = (f"{head}\nFollow this skill: {pkg['title']}: {pkg['description']}\nRules:\n{pkg['rules']}\n"
            f"Hints: {pkg['hints']}\nExample:\n{json.dumps(pkg['example'])}\n{ask}")
    return [{"role": "user", "content": body}]


def solver_messages(family, task):
    """x: what the solver sees (never the package)."""
    if family == "tool":
        return tool_messages(task["tools"], task["dialogue"])
    return [{"role": "user", "content": render_zebra_prompt(task)}]


def answer_prefix(args):
    """(prefix, stop) of every tool-call answer; --solver-aid prefills the call's opening."""
    if args.family == "tool" and args.solver_aid:
        return '<tool_call>{"name": "', ["</tool_call>"]
    return "", None


def answer_schemas(args, puzzles):
    """--solver-aid on (zebra): zebra answers are decoded under their puzzle's grid_schema; else None."""
    return [grid_schema(p) for p in puzzles] if args.family == "zebra" and args.solver_aid else None


def answer_budget(args, tok, solutions):
    """Token budget of a solver answer: --max-new-tokens (room to reason, where it exceeds the answer), raised
    to fit the longest gold answer among `solutions` (a zebra grid, a reference tool call)."""
    fit = grid_budget if args.family == "zebra" else call_budget
    return fit(tok, solutions, args.max_new_tokens) if solutions else args.max_new_tokens


def prefilled_prompt(tok, messages, prefix):
    """Chat prompt ids followed by the reply's prefilled opening (part of the prompt, never trained on)."""
    return chat_ids(tok, messages) + (tok.encode(prefix, add_special_tokens=False) if prefix else [])


def solve_reward(family, text, rec):
    """R_solve and the probe's answer key (for the majority vote)."""
    if family == "tool":
        r, _, _, first = tool_reward(text, rec["contract"])
        return r, call_key(first)
    r, valid, _, _, grid = zebra_reward(text, rec["task"], rec["contract"])
    return r, (json.dumps(grid, sort_keys=True) if valid else None)


def first_json_object(text):
    """The JSON object the text opens with (trailing text ignored), or None; so is an object that would break
    the code reading it (plumbing.usable_value: nested too deep, a lone surrogate)."""
    try:
        obj, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except (ValueError, RecursionError):  # RecursionError: hostile nesting depth
        return None
    return obj if isinstance(obj, dict) and usable_value(obj) else None


REJECT_TYPES = ("schema", "compile", "contract", "probe")  # rec["reject"]: the gate it failed (None: passed)


def check_proposal(family, text, pkg, rng):
    """Parse and gate a proposal before probing: a record, or None if unparseable (reward −1)."""
    obj = first_json_object(text)
    if obj is None:
        return None
    if family == "tool":  # the task is the proposal itself
        task, (contract, reject, why) = obj, gate_tool_task(obj, None if pkg is None else pkg["validator"])
    else:  # a blueprint; skill stream: the runtime compiles it by the package's compiler spec
        task, contract, reject, why = gate_zebra_blueprint(obj, pkg, rng)
    ok_schema = reject not in ("schema", "compile")
    return {"task": task, "contract": contract, "ok_schema": ok_schema,
            "ok_contract": pkg is None or (ok_schema and reject != "contract"), "reject": reject, "why": why}


def probe_records(family, recs, probe_sampler, tok, args):
    """K probes of the solver per gated record: v_solve (Eq. 1), consistency and valid (Eq. 4)."""
    todo = [r for r in recs if r["ok_schema"] and r["ok_contract"]]
    prefix, stop = answer_prefix(args)
    prompts = [prefilled_prompt(tok, solver_messages(family, r["task"]), prefix) for r in todo]
    outs = probe_sampler.generate(prompts, args.K, answer_budget(args, tok, [r["contract"] for r in todo]),
                                  args.temperature, stop=stop,
                                  json_schema=answer_schemas(args, [r["task"] for r in todo])
                                  ) if prompts else []
    for r, samples in zip(todo, outs):
        scored = [solve_reward(family, prefix + s.text, r) for s in samples]
        r["v_solve"] = v_solve([x[0] for x in scored])
        if family == "tool":
            r["consistent"] = probe_consistent([x[1] for x in scored], call_key(r["contract"]))
        else:  # Table 5: the deterministic checker (parse, schema, ν, uniqueness) replaces probe consistency
            r["consistent"] = True
        r["probe_text"] = prefix + samples[0].text
    for r in recs:
        r.setdefault("v_solve", 0.0)
        r.setdefault("consistent", False)
        # Eq. (4): {valid} = {schema compliant} ∩ {contract valid} ∩ {probe consistent}
        r["valid"] = r["ok_schema"] and r["ok_contract"] and r["consistent"]
        if r["ok_schema"] and r["ok_contract"] and not r["consistent"]:
            r["reject"], r["why"] = "probe", "probe answers have no unique majority equal to the reference"
        r["R"] = propose_reward(r["valid"], r["v_solve"])
        x = solver_messages(family, r["task"]) if r["ok_schema"] else []
        r["x_text"] = "\n".join(m["content"] for m in x)  # "" when x does not parse
    return recs


def proposal_decoding(args, proposer_sampler):
    """(prefilled opening, JSON schema) of every proposal: grammar (vLLM) or PROPOSER_PREFIX."""
    if args.proposer_grammar and not isinstance(proposer_sampler, HFSampler):
        return "", TASK_SCHEMA[args.family]
    return PROPOSER_PREFIX[args.family], None


def propose(tag, n_prompts, P, pkgs, stats, args, rng, dist):
    """Prompts of both streams, G proposals each, gated and probed; rollouts, local and whole batch."""
    n_skill = 0 if args.unguided else n_prompts if args.skill_only else n_prompts // 2
    probs = routing_probs([stats[p["name"]] for p in pkgs], args.kappa, args.w_min, args.w_max,
                          args.beta_route, args.tau, args.uniform_routing) if n_skill else []
    chosen = rng.choices(pkgs, weights=probs, k=n_skill) if n_skill else []  # same rng state on every rank
    streams = [("skill", p) for p in chosen] + [("explore", None) for _ in range(n_prompts - n_skill)]
    mine = list(range(dist.rank, len(streams), dist.world))  # global prompt indices g of this rank
    proposer_sampler, tok = P.p_sampler, P.tok
    prefix, schema = proposal_decoding(args, proposer_sampler)
    prompts = [prefilled_prompt(tok, proposer_messages(args.family, streams[g][1]), prefix) for g in mine]
    outs = proposer_sampler.generate(prompts, args.proposer_G, args.proposer_max_new_tokens, args.temperature,
                                     json_schema=schema) if mine else []
    rollouts, local = [], []
    for g, prompt, samples in zip(mine, prompts, outs):
        stream, pkg = streams[g]
        for j, s in enumerate(samples):
            text = prefix + s.text
            rec = check_proposal(args.family, text, pkg, random.Random(f"{args.data_seed}-{tag}-{g}-{j}"))
            if rec is not None:
                rec.update(stream=stream, skill=pkg["name"] if pkg else None, proposal=text)
            rollouts.append(Rollout(prompt, s.ids, [1] * len(s.ids), s.text, group=g, sample_logp=s.logprobs,
                                    forced=s.forced))
            local.append({"g": g, "j": j, "stream": stream, "skill": pkg["name"] if pkg else None,
                          "rec": rec})
    probe_records(args.family, [x["rec"] for x in local if x["rec"] is not None], P.probe_sampler, tok, args)
    batch = sorted(gather_objects(local, dist), key=lambda x: (x["g"], x["j"]))
    return rollouts, local, batch


def update_stats(batch, stats, args):
    """σ of App. B from a batch's skill attempts, and this iteration's Eq. 8 estimate (a_t, R_t)."""
    for x in batch:
        if x["stream"] != "skill":
            continue
        rec, st = x["rec"], stats[x["skill"]]
        st["a"] += 1
        st["a_t"] += 1
        if rec is None:  # an unparseable skill attempt counts as an attempt with R = 0
            st["failed_t"] = (st["failed_t"] + ["unparseable proposal"])[-5:]
            continue
        st["n_ver"] += int(rec["ok_schema"] and rec["ok_contract"])
        st["n_con"] += int(rec["ok_schema"] and rec["ok_contract"] and rec["consistent"])
        st["n_fd"] += int(rec["valid"] and args.v_lo <= rec["v_solve"] <= args.v_hi)
        st["accepted"] += int(rec["valid"])
        st["R_t"] += rec["R"]
        if not rec["valid"]:
            st["failed_t"] = (st["failed_t"] + [rec["why"]])[-5:]


def proposer_round(step, t, P, pkgs, stats, args, rng, dist):
    """One proposer GRPO batch (Eq. 5): rollouts with rewards, parsed records, number unparsed."""
    rollouts, local, batch = propose(f"{t}-{step}", args.proposer_prompts, P, pkgs, stats, args, rng, dist)
    recs = [x["rec"] for x in batch if x["rec"] is not None]
    # App. C: ρ(x_i) = |C_i| / B over the task texts of this proposer batch (B = all rollouts of all ranks)
    rho = repetition_penalty([r["x_text"] or r["proposal"] for r in recs], args.rep_threshold, len(batch))
    for r, penalty in zip(recs, rho):
        r["rho"] = penalty
    by_key = {(x["g"], x["j"]): x["rec"] for x in batch}
    for ro, x in zip(rollouts, local):
        rec = by_key[(x["g"], x["j"])]
        # proposer reward: −1 for an unparseable proposal, else R_propose (Eq. 2) − ρ
        ro.reward = args.parse_penalty if rec is None else rec["R"] - rec["rho"]
    update_stats(batch, stats, args)
    return rollouts, recs, sum(x["rec"] is None for x in batch)


def collection_pass(t, P, pkgs, stats, args, rng, dist):
    """App. E: --collect-prompts × G more candidates, gated and probed, without gradient."""
    _, _, batch = propose(f"{t}-collect", args.collect_prompts, P, pkgs, stats, args, rng, dist)
    update_stats(batch, stats, args)
    return [x["rec"] for x in batch if x["rec"] is not None], sum(x["rec"] is None for x in batch)


# ----- method: training loop (warm-ups, proposer phase, solver phase) -----

def prime_proposer(proposer, tok, pkgs, args, dist, grammar, lr):
    """--proposer-sft-steps (difference 13): SFT of the proposer on S(0)'s worked examples."""
    prefix = "" if grammar else PROPOSER_PREFIX[args.family]
    examples = []
    for pkg in pkgs:
        # the example as each decoding writes it
        text = json_text(pkg["example"]) if grammar else json.dumps(pkg["example"])
        if not text.startswith(prefix):
            continue
        target = tok.encode(text[len(prefix):], add_special_tokens=False) + [tok.eos_token_id]
        for stream_pkg in ([pkg, None] if not args.skill_only else [pkg]):
            prompt = prefilled_prompt(tok, proposer_messages(args.family, stream_pkg), prefix)
            examples.append((prompt, target))
    # grpo.sft_loop: L_SFT = − Σ log π(y_t | x, y_<t) / Σ 1 over the target tokens of each step's examples
    return sft_loop(proposer, examples, args, dist, lr, args.proposer_sft_batch,
                    args.proposer_sft_steps, seed=f"{args.seed}-proposer-sft",
                    log_dir=os.path.join(args.run_dir, "proposer_sft"))


def prime_solver(solver, tok, args, dist, lr):
    """--solver-sft-steps (difference 14): SFT of the solver on tasks outside S(0) and held-out."""
    prefix, _ = answer_prefix(args)
    rng, examples = random.Random(f"{args.seed}-solver-sft"), []
    if args.family == "tool":
        for task in scripted_tool_tasks(rng, args.solver_sft_tasks):
            answer = "<tool_call>" + json.dumps(task["call"]) + "</tool_call>"
            target = tok.encode(answer[len(prefix):], add_special_tokens=False) + [tok.eos_token_id]
            examples.append((prefilled_prompt(tok, solver_messages("tool", task), prefix), target))
    else:
        for p, sol in zebra_sft_puzzles(args):
            answer = json_text(sol)  # compact, as the grid schema decodes it (vLLM, ConstrainedHFSampler)
            target = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
            examples.append((prefilled_prompt(tok, solver_messages("zebra", p), ""), target))
    return sft_loop(solver, examples, args, dist, lr, args.solver_sft_batch,
                    args.solver_sft_steps, seed=f"{args.seed}-solver-sft-draw",
                    log_dir=os.path.join(args.run_dir, "solver_sft"))


@dataclasses.dataclass
class Players:
    """The models of the loop and the samplers that read them (one record instead of a dozen parameters)."""
    proposer: object       # π_propose, trained by proposer GRPO (Eq. 5)
    solver: object         # π_solve, trained by solver GRPO (Eq. 7)
    ref: object            # π^(0), frozen: KL reference of both (None when β = 0)
    opt_p: object          # the proposer's optimizer
    opt_s: object          # the solver's optimizer
    p_sampler: object      # proposals, synced with the proposer
    s_sampler: object      # solver rollouts and every held-out row, synced with the solver
    probe_sampler: object  # the K probes of Eq. 1/4: s_sampler, or a frozen solver's (--frozen-feedback-...)
    controller: object     # π_control: π^(0) on HF generate (free text, no schema)
    tok: object


def proposer_phase(t, P, pkgs, stats, args, rng, dist):
    """Algorithm 2, lines 3-20: the proposer's GRPO steps (Eq. 5), then the collection pass."""
    for st in stats.values():
        st.update(a_t=0, R_t=0.0, failed_t=[])
    t0, recs, n_unparsed_all, times = time.time(), [], 0, {}
    for s in range(args.proposer_steps):
        rollouts, batch_recs, n_unparsed = proposer_round(s, t, P, pkgs, stats, args, rng, dist)
        recs += batch_recs
        n_unparsed_all += n_unparsed
        if args.frozen_proposer:
            m = reduce_metrics({"reward": float(np.mean([r.reward for r in rollouts])) if rollouts else 0.0,
                                "skipped": 1.0}, dist)
        else:
            # Eq. (5): J_propose(π) = E_{s~S, (x,c)~π(·|s)}[R_propose(x, c; π_solve^(t))],
            # GRPO over G proposals per prompt
            m = grpo_update(P.proposer, P.ref, P.opt_p, rollouts, args, dist)
            P.p_sampler.sync(P.proposer)
        m.update(n_unparsed=n_unparsed, n_valid=sum(r["valid"] for r in batch_recs),
                 v_solve=float(np.mean([r["v_solve"] for r in batch_recs])) if batch_recs else 0.0)
        log_metrics(os.path.join(args.run_dir, "proposer"), t * args.proposer_steps + s, m, dist,
                    keys=("reward", "n_unparsed", "n_valid", "v_solve", "kl", "grad_norm", "completion_len"))
    times["time_propose"] = time.time() - t0
    t0 = time.time()
    if args.collect_prompts:  # candidates of the updated proposer, probed by the current solver (App. E)
        collected, n_unparsed = collection_pass(t, P, pkgs, stats, args, rng, dist)
        recs += collected
        n_unparsed_all += n_unparsed
    times["time_collect"] = time.time() - t0
    return recs, n_unparsed_all, times


def solver_round(D, solver_sampler, tok, args, rng, dist):
    """Solver GRPO rollouts (Eq. 7) on a batch of D(t) drawn by the shared rng; x only."""
    batch = rng.sample(D, min(args.solver_batch, len(D)))[dist.rank::dist.world]
    prefix, stop = answer_prefix(args)
    prompts = [prefilled_prompt(tok, solver_messages(args.family, r["task"]), prefix) for r in batch]
    budget = copy.copy(args)  # the zebra budget fits the batch's longest gold grid (answer_budget)
    budget.max_new_tokens = answer_budget(args, tok, [r["contract"] for r in batch])
    rollouts = sample_group_rollouts(solver_sampler, prompts, args.solver_G, budget, stop,
                                     json_schema=answer_schemas(args, [r["task"] for r in batch])
                                     ) if batch else []
    for ro in rollouts:
        ro.reward = solve_reward(args.family, prefix + ro.text, batch[ro.group])[0]
    return rollouts


def solver_phase(recs, t, P, args, rng, dist):
    """D(t) (Eq. 6), then the solver's GRPO steps on it (Eq. 7); empty D(t): no update."""
    alpha = 0.0 if args.unguided else 1.0 if args.skill_only else args.alpha
    band = args.family == "tool" or args.zebra_band
    D = build_curriculum(recs, args.M, alpha, args.v_lo, args.v_hi, band=band)
    if not D:
        if dist.is_main:
            where = " in the frontier band" if band else ""
            print(f"iteration {t}: the curriculum is empty (no valid candidate{where}); solver not updated")
        return D, []
    steps = []
    for s in range(args.solver_steps):
        rollouts = solver_round(D, P.s_sampler, P.tok, args, rng, dist)
        # Eq. (7): J_solve(π) = E_{(x,c)~D(t), y~π(·|x)}[R_solve(x, y, c)], GRPO over G answers per task
        m = grpo_update(P.solver, P.ref, P.opt_s, rollouts, args, dist)
        P.s_sampler.sync(P.solver)
        log_metrics(os.path.join(args.run_dir, "solver"), t * args.solver_steps + s, m, dist,
                    keys=("reward", "kl", "loss", "grad_norm", "completion_len", "n_groups_dropped"))
        steps.append(m)
    return D, steps


# ----- method: library evolution (§3.4) -----

CONTROLLER_INDUCE = ("You maintain a library of skills for generating {what}. Here is a generated task "
                     "that was valid and at the solver's frontier:\n{x}\nReference answer: {c}\nDescribe "
                     "the reusable pattern behind it in exactly four lines:\nTitle: <short_snake_case_name>"
                     "\nDescription: <one sentence>\nRules: <how to build tasks with this pattern>\nHints: "
                     "<what to vary>")
CONTROLLER_REFINE = ("A skill for generating {what}:\nTitle: {title}\nDescription: {description}\nRules: "
                     "{rules}\nHints: {hints}\nRecent generation attempts with this skill failed because: "
                     "{reasons}\nWrite improved hints that avoid these failures, in one line:\nHints: <text>")


def derive_validator(rec, family):
    """ν (and the zebra compiler spec) of an induced package, derived from its inducing record by code."""
    return derive_tool_validator(rec["task"]) if family == "tool" else derive_zebra_validator(rec["task"])


def induce_packages(T_induce, controller_sampler, tok, pkgs, args, t):
    """Eq. (10): controller-written packages from T_induce, kept if Integrity ∧ Novelty."""
    what = "function-calling tasks" if args.family == "tool" else "logic grid puzzles"
    todo = sorted(T_induce, key=lambda r: -r["R"])
    new, log, library, i = [], [], list(pkgs), 0
    while todo and len(new) < args.induce_min:
        recs, todo = todo[:max(args.induce_min, 1)], todo[max(args.induce_min, 1):]
        prompts = [chat_ids(tok, [{"role": "user", "content": CONTROLLER_INDUCE.format(
            what=what, x=r["x_text"], c=json.dumps(r["contract"]))}]) for r in recs]
        outs = controller_sampler.generate(prompts, 1, args.controller_max_new_tokens, 0.0)
        for r, (s,) in zip(recs, outs):
            f = controller_fields(s.text, ["Title", "Description", "Rules", "Hints"])
            nu, compiler = derive_validator(r, args.family)
            pkg = {"name": f"{args.family}_i{t + 1:02d}_{i:03d}",
                   "title": re.sub(r"\W+", "_", f.get("title", ""))[:60],
                   "family": args.family, "source": "skill_induction", "iteration": t + 1, "derived_from": "",
                   "description": f.get("description", ""), "rules": f.get("rules", ""),
                   "hints": f.get("hints", ""), "validator": nu, "example": r["task"]}
            i += 1
            if compiler:
                pkg["compiler"] = compiler
            # Eq. (10): S_new = {s ~ π_control(·|T_induce) | Integrity(s) ∧ Novelty(s, S)}
            err = validate_package(pkg, args.family)
            if err is None and not novelty_ok(pkg, library, args.novelty_threshold):
                err = "not novel (lexically too close to an existing package)"
            log.append({"iteration": t, "op": "induce" if err is None else "induce_rejected",
                        "skill": pkg["name"],
                        "reason": err or f"frontier exploration record with R_propose={r['R']:.2f}"})
            if err is None:
                new.append(pkg)
                library.append(pkg)
    return new, log


def refine_packages(pkgs, stats, controller_sampler, tok, args, t):
    """Rewrite the hints of the packages with most failed attempts this iteration (controller)."""
    what = "function-calling tasks" if args.family == "tool" else "logic grid puzzles"
    worst = sorted([p for p in pkgs if stats[p["name"]]["failed_t"]],
                   key=lambda p: -len(stats[p["name"]]["failed_t"]))
    worst = worst[:args.refine_max]
    if not worst:
        return []
    prompts = [chat_ids(tok, [{"role": "user", "content": CONTROLLER_REFINE.format(
        what=what, reasons="; ".join(sorted(set(stats[p["name"]]["failed_t"]))), **p)}]) for p in worst]
    outs = controller_sampler.generate(prompts, 1, args.controller_max_new_tokens, 0.0)
    log = []
    for p, (s,) in zip(worst, outs):
        hints = controller_fields(s.text, ["Hints"]).get("hints", "")
        reasons = "; ".join(sorted(set(stats[p["name"]]["failed_t"])))
        if len(hints) < 10 or hints == p["hints"]:
            log.append({"iteration": t, "op": "refine_rejected", "skill": p["name"],
                        "reason": "controller gave no new hints"})
            continue
        p["hints"] = hints
        log.append({"iteration": t, "op": "refine", "skill": p["name"],
                    "reason": f"failed attempts: {reasons}"[:500]})
    return log


def evolve_library(t, pkgs, stats, recs, controller, tok, args, dist):
    """§3.4 on every rank, each writing its share of the controller's replies (a DealtSampler): refine, prune
    (Eq. 8), induce (Eq. 9-10) from the same records; then rank 0's S(t+1), σ, log are broadcast."""
    changes = []
    if not (args.frozen_skills or args.unguided):
        changes += refine_packages(pkgs, stats, controller, tok, args, t)
        pruned = prune_set(pkgs, stats, args.gamma_prune, args.prune_min_attempts)
        changes += [{"iteration": t, "op": "prune", "skill": n, "reason":
                     f"E[R_propose] = {stats[n]['R_t'] / stats[n]['a_t']:.3f} < γ_prune over "
                     f"{stats[n]['a_t']} attempts"} for n in pruned]
        new, log = induce_packages(induce_set(recs, args.gamma_induce), controller, tok, pkgs, args, t)
        changes += log
        # S(t+1) = (S(t) \ S_prune) ∪ S_new
        pkgs = [p for p in pkgs if p["name"] not in pruned] + new
        stats = {**stats, **{p["name"]: new_stats() for p in new}}
    pkgs, stats, changes = broadcast_object((pkgs, stats, changes), dist)  # S(t+1), σ, change log of rank 0
    return pkgs, stats, changes


# ----- evaluation: held-out BFCL and zebra (Tables 1-2, tasks/), the table, headline -----

def evaluate(sampler, tok, args, dist, name="eval"):
    """One table row: the family's held-out set under the solver's decoding, saved to eval/<name>.jsonl."""
    reset_prefix_cache(sampler)
    prefix, stop = answer_prefix(args)
    prompt_of = lambda messages: prefilled_prompt(tok, messages, prefix)
    if args.family == "tool":
        budget_of = lambda calls: answer_budget(args, tok, calls)
        res, items = evaluate_bfcl(sampler, prompt_of, budget_of, args, dist, prefix, stop)
    else:
        res, items = evaluate_zebra(sampler, prompt_of, lambda sols: answer_budget(args, tok, sols),
                                    lambda puzzles: answer_schemas(args, puzzles), args, dist)
    save_generations(args, name, items, dist)
    return res


def print_main_table(history, family, baselines=()):
    """The paper's main table: BFCL columns (Table 1) or ZebraLogic scales (Table 2), trivial rows last."""
    cols = ([("JS", "bfcl_simple_javascript"), ("Py", "bfcl_simple_python"), ("Java", "bfcl_simple_java"),
             ("Live", "bfcl_live_simple"), ("Avg.", "bfcl_avg")] if family == "tool" else
            [(s.capitalize(), f"zebra_{s}") for s in ("two", "small", "medium", "large", "xlarge")]
            + [("Grid", "zebra_grid"), ("Cell", "zebra_cell"), ("RG", "rg_zebra")])
    rows = {name: res for name, res in list(history) + [(f"[{n}]", r) for n, r in baselines]}
    print_table("", rows, cols, first="solver")
    if baselines:
        print("[trivial answers, same checker: a constant per attribute; listed order; the clue readers]")


def run_results(args, history, baselines, rows):
    """(results, headline) of a finished run, every comparison paired over held-out items; results' "loop":
    the loop per iteration (LOOP_KEYS), "final_items"/"final_ids": the last row's items (for --versus)."""
    arm = arm_name(args)
    loop = {k: [r.get(k) for r in rows] for k in LOOP_KEYS}
    results = {"family": args.family, "arm": arm, "seed": args.seed, "data_seed": args.data_seed,
               "history": [list(h) for h in history], "trivial": [list(b) for b in baselines], "rows": rows,
               "loop": loop, "loop_failures": loop_failures(loop) if rows else []}
    names = [h for h, _ in history]  # zebra: the last row vs base, the warm-up and the best trivial answer
    headline = (zebra_headline(args.run_dir, names, [b for b, _ in baselines], arm, results)
                if args.family == "zebra" else bfcl_headline(args.run_dir, names, arm, results))
    if args.versus:  # the other arm on the same items: the paper's comparison, paired per item (Table 2)
        other, ids = read_versus(args), results["final_ids"]
        if other.get("final_ids") != ids:
            print(f"--versus {args.versus}: other held-out items than this run's; not paired")
        for m in results["final_items"] if other.get("final_ids") == ids else ():
            headline.append(compare(f"held-out {m} accuracy: {arm} vs {other.get('arm')} (paired over items)",
                                    arm, str(other.get("arm")), results["final_items"][m],
                                    other["final_items"][m], item_ids=ids, primary=True))
    recs = [r for recs_t in read_records(args.run_dir, args.T) for r in recs_t]
    for stream in ("skill", "explore"):
        rs = [r for r in recs if r["stream"] == stream]
        if not rs:
            continue
        note = ("; zebra exploration proposals get no runtime clue completion, so near 0 by construction"
                if args.family == "zebra" and stream == "explore" else "")
        headline.append(vs_chance(f"valid-proposal rate, {stream} stream, {arm} (of parsed proposals{note})",
                                  arm, [float(r["valid"]) for r in rs], 0.0))
        vs = [r["v_solve"] for r in rs if r["valid"]]
        if vs:
            headline.append(vs_chance(f"v_solve of valid proposals, {stream} stream, {arm} (vs the frontier "
                                      f"midpoint 1/2 of Eq. 2)", arm, vs, 0.5))
    return results, headline


# ----- main -----

def warmup_recipe(args, grammar):
    """The flags the two warm-ups depend on: a prepared adapter serves only a run with the same ones."""
    library = os.path.basename(os.path.normpath(args.library or os.path.join(LIBRARIES, args.family)))
    return {**{k: getattr(args, k) for k in WARMUP_FLAGS}, "library": library, "grammar": grammar}


def prepare_warmup(args):
    """--prepare-warmup (#48 §1): both warm-ups trained once as LoRA adapters on π^(0), written to
    --warmup-adapters with their recipe; a run then merges them (warm_up) instead of running their SFT."""
    dist, grammar = setup_distributed(), args.proposer_grammar and args.sampler != "hf"
    pkgs, _ = load_library(args.library or os.path.join(LIBRARIES, args.family), args.family)
    for role in ("proposer", "solver"):
        seed_everything(args.seed)
        prepare_lora(args, dist, lambda m, tok: prime_solver(m, tok, args, dist, args.lora_lr)
                     if role == "solver" else prime_proposer(m, tok, pkgs, args, dist, grammar, args.lora_lr),
                     f"{args.family}-{role}", warmup_recipe(args, grammar))


def warm_up(P, pkgs, history, args, dist):
    """Before iteration 0 (differences 13-14, every arm): SFT of proposer, then solver (its row); with
    --warmup-adapters, each warm-up prepared once (prepare_warmup) for this run's recipe is merged instead."""
    say = print if dist.is_main else (lambda *a, **k: None)
    grammar = proposal_decoding(args, P.p_sampler)[1] is not None
    for role, model, sampler in (("proposer", P.proposer, P.p_sampler), ("solver", P.solver, P.s_sampler)):
        if not (args.solver_sft_steps if role == "solver" else args.proposer_sft_steps and pkgs):
            continue
        t0, recipe = time.time(), warmup_recipe(args, grammar)
        merged, why = use_prepared(model, args.warmup_adapters, f"{args.family}-{role}", recipe)
        if not merged:
            m = (prime_solver(model, P.tok, args, dist, args.solver_sft_lr) if role == "solver"
                 else prime_proposer(model, P.tok, pkgs, args, dist, grammar, args.proposer_sft_lr))
            why = (f"SFT{f' ({why})' * bool(why)}: {m.get('sft_steps')} steps on {m.get('sft_examples')} "
                   f"examples, loss {m.get('sft_loss', float('nan')):.3f}, {time.time() - t0:.0f}s")
        say(f"{role} warm-up: {why}")
        sampler.sync(model)
    if args.solver_sft_steps:
        history.append(("solver SFT", evaluate(P.s_sampler, P.tok, args, dist, "solver SFT")))  # warm-up only


def main(argv=None):
    """Algorithm 2: T iterations of proposer GRPO, curriculum and solver GRPO, library evolution."""
    args = parse_args(argv)
    if args.aggregate or args.prepare_warmup:  # pool finished runs (seeds, arms), or prepare the warm-ups
        return aggregate_main(args.aggregate) if args.aggregate else prepare_warmup(args)
    check_resume(args)  # --resume with the run's own settings, or one line naming the changed flags
    dist = setup_distributed()  # python: rank 0 of 1; torchrun: gloo on CPU, NCCL on GPUs
    frozen = int(args.frozen_feedback_solver)  # the probes' frozen solver (below), with its own engine
    preflight(args, dist, policies=2, frozen=1 + frozen, engines=2 + frozen, hf=True)  # π^(0), π_control: HF
    seed_everything(args.seed + dist.rank)  # rank-specific samples; shared choices: an rng without the rank
    say = print if dist.is_main else (lambda *a, **k: None)
    os.makedirs(args.run_dir, exist_ok=True)
    # Require: π_propose, π_solve initialised from π^(0) (DDP-wrapped under torchrun); π^(0) frozen is the KL
    # reference of both and the controller π_control; the initial library S(0) with its statistics σ
    (proposer, tok), (solver, _) = load_policy(args, dist), load_policy(args, dist)
    base, _ = load_model(args.model, dist, args.dtype, trainable=False)
    opt_p, opt_s = make_optimizer(proposer, args), make_optimizer(solver, args)
    lib_dir = args.library or os.path.join(LIBRARIES, args.family)
    pkgs, stats = load_library(lib_dir, args.family)
    if not pkgs and not args.unguided:
        raise SystemExit(f"no valid skill package in {lib_dir}")
    P = Players(proposer, solver, base if args.beta > 0 else None, opt_p, opt_s, None, None, None, None, tok)
    start, history, rows, extra = 0, [], [], resume_or_start(P, args, dist)
    if extra:
        start, history, rows = extra["iteration"], extra["history"], extra["rows"]
        pkgs, stats = load_library(extra["library"], args.family)
        say(f"resumed {args.run_dir} after iteration {start} (library {extra['library']})")
    P.p_sampler = make_sampler(args, proposer, tok, dist)
    # One decoding regime for every row of the table: the solver's own sampler (schema on vLLM and HF alike,
    # temperature, budget), the base row included, taken before any warm-up while the solver is still π^(0).
    P.s_sampler = schema_sampler(make_sampler(args, solver, tok, dist))
    if not history:
        t0 = time.time()
        history.append(("base", evaluate(P.s_sampler, tok, args, dist, "base")))
        say(f"held-out eval of the base model: {time.time() - t0:.0f}s")
    if not extra:
        warm_up(P, pkgs, history, args, dist)
    # --frozen-feedback-solver: the probes use the solver as it enters self-play (after its warm-up), frozen,
    # with its decoding; kept in <run-dir>/feedback_solver (saved before the first checkpoint, read on resume)
    fd = os.path.join(args.run_dir, "feedback_solver")
    P.probe_sampler = schema_sampler(make_sampler(args, frozen_snapshot(solver, fd, extra is not None, dist),
                                                  tok, dist)) if frozen else P.s_sampler
    P.controller = DealtSampler(HFSampler(base, tok, args.hf_batch), dist)  # π_control: π^(0), HF generate
    baselines = trivial_baselines(args, dist)
    if dist.is_main:
        print_main_table(history, args.family, baselines)
    for t in range(start, args.T):  # for t = 0 … T−1
        rng = random.Random(f"{args.seed}-{t}")  # shared choices (routing, solver batches): same on all ranks
        # 1. Proposer update: skill stream s ~ P(s) (Eq. 13) and exploration stream, each (x, c) gated (Eq. 4)
        #    and probed (Eq. 1); GRPO on R_propose − ρ (Eq. 2, 5); then the collection pass (App. E)
        recs, n_unparsed, times = proposer_phase(t, P, pkgs, stats, args, rng, dist)
        # 2. Solver update: D(t) = the top αM skill and (1 − α)M exploration tasks (Eq. 6); GRPO (Eq. 7)
        t0 = time.time()
        D, steps = solver_phase(recs, t, P, args, rng, dist)
        times["time_solve"] = time.time() - t0
        # 3. Library evolution (§3.4): refine, prune S_prune (Eq. 8), induce S_new from T_induce (Eq. 9-10)
        t0 = time.time()
        pkgs, stats, changes = evolve_library(t, pkgs, stats, recs, P.controller, tok, args, dist)
        times["time_evolve"] = time.time() - t0
        # 4. Held-out evaluation of π_solve^(t+1) (Tables 1-2); greedy and no solver step: the last row again
        t0 = time.time()
        res = (evaluate(P.s_sampler, tok, args, dist, f"iter {t + 1}") if steps or args.eval_temperature
               else same_row(args, history[-1], f"iter {t + 1}", dist))
        history.append((f"iter {t + 1}", res))
        times["time_eval"] = time.time() - t0
        rows.append({**iteration_metrics(recs, D, pkgs, stats, changes, t + 1), **solver_signal(steps),
                     "n_proposals_unparsed": n_unparsed, **res, **times})
        save_iteration(t, P, (pkgs, stats, changes), recs, rows, history, args, dist)
        if dist.is_main:
            print_main_table(history, args.family, baselines)
    if dist.is_main:  # results.json: the table, the trivial rows, the loop and the headline (stats.py)
        results, headline = run_results(args, history, baselines, rows)
        say("".join(f"the loop did not close: {why}\n" for why in results["loop_failures"]), end="")
        write_results(args.run_dir, results, headline)
        print_bfcl_intervals(results)
        print(format_headline(headline))
    if args.plots and rows and dist.is_main:
        plot_run(args, rows)
        plot_loop(args.run_dir, results["loop"])
    return {"history": history, "rows": rows}


if __name__ == "__main__":
    run_main(main)  # main(); a package not installed: one line; under torchrun exit_ranks (plumbing)
