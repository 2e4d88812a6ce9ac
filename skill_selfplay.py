"""
Skill Self-Play (Skill-SP): a proposer, a solver and an evolving skill library.

Paper: "Skill Self-Play: Pushing the Frontier of LLM Capability with Co-Evolving
Skills" (Huang et al., 2026), ../shared/papers/skill_selfplay.txt, Algorithm 2.

Run (CPU, embedded SmolLM2-135M, two small self-play iterations; 2 cores, native bf16: zebra 9.7-12.7 min, tool ~8 min):
    python skill_selfplay.py --family tool  --preset tiny
    python skill_selfplay.py --family zebra --preset tiny
Several processes (same code; gloo on CPU, NCCL on GPUs):
    torchrun --nproc_per_node=2 skill_selfplay.py --family tool --preset tiny
Paper scale (Table 5; needs GPUs and a 4B+ model in a local folder):
    torchrun --nproc_per_node=8 skill_selfplay.py --family tool --preset paper --model /path/to/Qwen3-4B-Instruct
Ablations (§4.3): --unguided, --skill-only, --uniform-routing, --frozen-skills,
--frozen-proposer, --frozen-feedback-solver (both frozen flags = "Frozen both").

One iteration t (Algorithm 2):
  1. proposer rollouts: skill stream (a routed package s ~ P(s), Eq. 13, in the
     prompt) and exploration stream (no package); every candidate (x, c) is
     checked (Eq. 4) and probed by K samples of the frozen solver (Eq. 1);
     R_propose (Eq. 2) minus the repetition penalty is the proposer's GRPO
     reward (Eq. 5); unparseable proposals get -1. A collection pass of the
     updated proposer adds further candidates, checked and probed the same way.
  2. curriculum D(t) (Eq. 6) from the valid candidates of both streams;
     solver GRPO on D(t) (Eq. 7); the solver never sees package text.
  3. library evolution: statistics σ, refinement from failed attempts, pruning
     (Eq. 8), induction from frontier exploration records (Eq. 9-10).

Glossary: x = task prompt the solver sees; c = hidden contract (reference call or
unique grid); K = solver probes per candidate; v_solve = mean solver reward on
the K probes; M = pool size; α = skill-stream share of the pool; σ = routing
statistics (a, n_ver, n_con, n_fd) of a package; κ, w_min, w_max, β_route, τ =
routing constants of Eq. 11-13 (β_route is the routing β, not the KL β).

Differences from the paper:
 1. Scale: SmolLM2-135M-Instruct on CPU instead of 3B-14B models on 8 A800s; the tiny
    preset shrinks T, M, K, rollouts and steps (the paper preset keeps Table 5).
 2. Tool-call held-out set: the four BFCL categories of Table 1 from the bfcl-eval package, scored by
    BFCL's own AST checker; answers use our <tool_call>{json}</tool_call> format and function names
    must match exactly. API-Bank is not available offline and is not evaluated.
 3. ZebraLogic is not available offline: held-out puzzles come from our runtime (fixed seed, never used
    in training) in its four scales, plus reasoning-gym's zebra puzzles as an external check. Trivial answers
    (one constant value per attribute; values in listed order) are scored by the same checker beside every row.
 4. Zebra proposals are blueprints; the runtime compiles clues, guided by the package's compiler spec,
    until the puzzle is unique (App. I.2); exploration proposals must be unique on their own. Zebra
    validity is the deterministic checker, not probe consistency (Table 5).
 5. D(t) comes from the proposer's GRPO rollouts plus a collection pass of the updated proposer with a
    fixed number of candidates (--collect-prompts × G, no gradient); the paper's pass runs until M are accepted.
 6. "Unique majority answer" is a unique most frequent (plurality) probe answer, equal to the reference.
 7. Induction (Eq. 10): the controller writes the text fields; the example is the inducing record and the
    validator is derived from it by code. Refinement rewrites only the hints. γ_prune, γ_induce and the
    novelty threshold are not given in the paper: flags with our values.
 8. A proposal is the JSON object its reply opens with, else reward −1 (the paper does not say how
    proposals are parsed). The v_solve band filters tool records only (Table 5; --zebra-band on: zebra too).
 9. Data parallel (torchrun): every rank holds proposer, solver (DDP) and the frozen π^(0) and works on its
    share of prompts, solver batches and held-out items; the proposer batch is gathered, rank 0 evolves the
    library and broadcasts it. Logged `reward` is the mean of the ranks' means; verl is not reproduced.
10. Aids for a small model: the solver's format instruction shows a filled-in call; the proposer's reply is
    prefilled with the JSON opening (PROPOSER_PREFIX). Tiny preset only: --proposer-grammar on (TASK_SCHEMA),
    --solver-aid on (tool-call prefill, zebra grid schema), temperature 0.7; its held-out numbers are not the paper's.
11. Sampling: held-out evaluation does not apply Table 5's top-k 40; every row (base included) is decoded by the
    solver's own sampler, schema and budget. Rollouts decoded under a grammar get their GRPO log-probs from the
    unconstrained π_θ (off-policy, not corrected); the tokens it forced leave the loss (grpo.trained_mask;
    bench/forced_gradnorm.py). The paper preset uses no grammar.
12. Tool answers: a reply's answer is its first well-formed <tool_call>; ExactCall (Eq. 14) and the probe
    vote (Eq. 4) compare it with the reference by call_key (argument order ignored, 1 ≡ 1.0, True ≢ 1).
13. --proposer-sft-steps N (paper 0): SFT warm-up of the proposer on S(0)'s worked examples before
    iteration 0, in every arm (--unguided too); the paper's proposer starts from the backbone. Tiny, both
    families: 10 steps of 6 examples; without it 2 of 29 skill-stream zebra blueprints were valid (the
    135M proposer repeats values and names attributes "clues"), with it 105 of 108 (seeds 0-2).
14. --solver-sft-steps N (paper 0): SFT warm-up of the solver before iteration 0, in every arm, on scripted
    tool tasks (SCRIPTED_TOOLS, disjoint from S(0) and BFCL) or runtime zebra puzzles (not held-out ones); the
    135M base solver solves no S(0) tool example in a majority of its probes, so no tool task could pass Eq. 4
    without it; the tiny zebra solver after it scores 8 % of held-out small grids vs 2 % (seeds 0-2; tiny: 12 steps).
    The tiny tool run also starts from S(0)'s 5 simplest packages (data/selfplay/tool_tiny) and uses K = 8.
    π_ref stays the backbone π^(0) after either warm-up (it is not saved, so a resume could not rebuild it).
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
import sys
import time

import numpy as np

from grpo import (Rollout, add_grpo_args, barrier, broadcast_object, chat_ids, gather_objects, grpo_update,
                  make_optimizer, parse_with_preset, reduce_metrics, sample_group_rollouts, seed_everything,
                  setup_distributed, sft_loop)
from plumbing import (HFSampler, exit_ranks, frozen_copy, load_embedder, load_model, load_policy, log_metrics,
                      json_text, make_sampler, plot_curves, resume_checkpoint, save_checkpoint)
from stats import aggregate as aggregate_headlines, compare, format_headline, vs_chance, wilson_ci, write_results

# ----- config -----

PRESETS = {
    # 9.7-12.7 minutes (zebra; tool ~8) on a 2-core CPU with native bf16 and the embedded 135M model, sampling with vLLM
    # (the collection pass of 16 prompts × G is cheap there); both families warm up both players (differences
    # 13-14: 10 proposer SFT steps of 6 examples, 12 solver SFT steps); temperature 0.7 because SmolLM2-135M at 1.0
    # (top-k off) rarely writes well-formed JSON; micro_batch 2 bounds the memory of the backward pass over
    # ~900-token proposer sequences (a run with 8 peaked at 16.6 GB RSS, with 2 at 6.3); the aids of
    # difference 10 (grammar, solver aid) are what lets the 135M model close the loop for zebra; held-out zebra:
    # the small scale only, 100 puzzles (≤ 3 houses; every arm scored 0 % of medium grids), greedy (eval_temperature
    # 0), the answer budget fitted to the longest gold grid (answer_budget; --max-new-tokens 96 is the floor
    # and the tool answers' budget)
    "tiny": dict(T=2, M=8, proposer_prompts=2, proposer_G=2, proposer_steps=1, collect_prompts=16,
                 solver_G=4, solver_steps=2, solver_batch=4, eval_n=4, eval_samples=1,
                 eval_temperature=0.0, max_new_tokens=96,
                 controller_max_new_tokens=96, induce_min=1,
                 zebra_eval_scales="small", rg_eval_n=2, lr=1e-5, sampler="auto", micro_batch=2,
                 temperature=0.7, proposer_grammar="on", solver_aid="on", proposer_sft_steps=10, proposer_sft_batch=6,
                 solver_sft_steps=12),
    # Table 5: the flag defaults (the family-dependent ones from BY_FAMILY["paper"])
    "paper": {},
}
# Values that differ between the families, by preset; they fill the flags no preset or argv set (parse_args),
# the preset's first, then the paper's. paper: Table 5 (no warm-up). tiny: the tool family's library of its 5
# simplest packages, K = 8 probes so that a partly solved task can fall in the frontier band, room for its
# longer proposals (difference 14).
_PAPER_BOTH = dict(K=10, proposer_max_new_tokens=8192, proposer_sft_steps=0, proposer_sft_batch=0, solver_sft_steps=0)
BY_FAMILY = {
    "paper": {"tool": dict(_PAPER_BOTH, M=8000, proposer_steps=5, solver_steps=15, induce_min=20),
              "zebra": dict(_PAPER_BOTH, M=1920, proposer_steps=3, solver_steps=10, induce_min=10)},
    "tiny": {"tool": dict(library=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "selfplay", "tool_tiny"),
                          K=8, proposer_max_new_tokens=448),
             "zebra": dict(K=4, proposer_max_new_tokens=320)},
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grpo_args(p)
    p.set_defaults(beta=1e-2, weight_decay=1e-2, max_new_tokens=8192)  # Table 5: KL 10⁻², weight decay 10⁻², 8192 tokens
    g = p.add_argument_group("task family and data")
    g.add_argument("--family", choices=["tool", "zebra"], default="tool", help="task family (§4.1)")
    g.add_argument("--library", default=None,
                   help="initial library S(0) folder; default data/selfplay/<family> (tiny tool: data/selfplay/tool_tiny)")
    g.add_argument("--data-seed", type=int, default=0, help="seed of the training-side puzzle compiler")
    g.add_argument("--eval-seed", type=int, default=1234, help="seed of held-out zebra puzzles (never used in training)")
    g = p.add_argument_group("self-play loop (Table 5)")
    g.add_argument("--T", type=int, default=5, help="self-play iterations T; paper 5")
    g.add_argument("--K", type=int, default=None, help="solver probes per candidate K (Eq. 1, 4); paper 10 (tiny: 8 tool, 4 zebra)")
    g.add_argument("--M", type=int, default=None,
                   help="training pool size M (Eq. 6); paper 8000 tool / 1920 zebra (default by --family)")
    g.add_argument("--alpha", type=float, default=0.5, help="skill-stream share α of the pool (Eq. 6); paper 0.5")
    g.add_argument("--v-lo", type=float, default=0.25, help="lower v_solve bound of the frontier band; paper 0.25")
    g.add_argument("--v-hi", type=float, default=0.75, help="upper v_solve bound of the frontier band; paper 0.75")
    g.add_argument("--zebra-band", choices=["on", "off"], default="off",
                   help="apply the v_solve band to zebra records too; paper off (Table 5: the deterministic checker only)")
    g.add_argument("--collect-prompts", type=int, default=2048,
                   help="prompts of the collection pass after the proposer update (×G candidates, no gradient; App. E); "
                        "the paper's pass runs until M tasks are accepted (difference 5)")
    g.add_argument("--proposer-grammar", choices=["on", "off"], default="off",
                   help="decode proposals under the task's JSON schema (vLLM only); paper off")
    g.add_argument("--solver-aid", choices=["on", "off"], default="off",
                   help="tool: prefill the call opening; zebra: decode the grid under its answer schema; paper off")
    g.add_argument("--proposer-prompts", type=int, default=256, help="proposer prompts per update step (half skill, half exploration)")
    g.add_argument("--proposer-G", type=int, default=4, help="proposer rollouts per prompt; paper 4")
    g.add_argument("--proposer-steps", type=int, default=None,
                   help="proposer GRPO steps per iteration; paper 5 tool / 3 zebra (default by --family)")
    g.add_argument("--proposer-sft-steps", type=int, default=None,
                   help="SFT steps priming the proposer on S(0)'s worked examples before iteration 0 (difference 13); "
                        "paper 0 (default: 0; tiny: 10)")
    g.add_argument("--proposer-sft-lr", type=float, default=1e-4, help="learning rate of that SFT warm-up")
    g.add_argument("--proposer-sft-batch", type=int, default=None,
                   help="examples per SFT step, drawn at random; 0 = all of them every step (default: 0; tiny: 6)")
    g.add_argument("--solver-sft-steps", type=int, default=None,
                   help="SFT steps of the solver on scripted tool tasks / runtime zebra puzzles before iteration 0 "
                        "(difference 14); paper 0 (default: 0; tiny: 12)")
    g.add_argument("--solver-sft-tasks", type=int, default=64, help="scripted tasks (puzzles) of that warm-up")
    g.add_argument("--solver-sft-batch", type=int, default=8, help="tasks per solver SFT step, drawn at random")
    g.add_argument("--solver-sft-lr", type=float, default=1e-4, help="learning rate of the solver SFT warm-up")
    g.add_argument("--proposer-max-new-tokens", type=int, default=None,
                   help="proposer generation limit; paper 8192 (default: 8192; tiny: 448 tool, 320 zebra)")
    g.add_argument("--solver-G", type=int, default=5, help="solver rollouts per task; paper 5")
    g.add_argument("--solver-steps", type=int, default=None,
                   help="solver GRPO steps per iteration; paper 15 tool / 10 zebra (default by --family)")
    g.add_argument("--solver-batch", type=int, default=64, help="tasks per solver GRPO step")
    g.add_argument("--parse-penalty", type=float, default=-1.0, help="proposer reward for an unparseable proposal; paper -1")
    g.add_argument("--rep-threshold", type=float, default=0.5, help="Jaccard threshold of the repetition clusters; paper 0.5")
    g = p.add_argument_group("routing (App. B, Table 5)")
    g.add_argument("--kappa", type=float, default=4.0, help="Beta prior strength κ (Eq. 11); paper 4")
    g.add_argument("--w-min", type=float, default=0.25, help="w_min (Eq. 13); paper 0.25")
    g.add_argument("--w-max", type=float, default=1.75, help="w_max (Eq. 13); paper 1.75")
    g.add_argument("--beta-route", type=float, default=1.0, help="exploration bonus β (Eq. 13); paper 1")
    g.add_argument("--tau", type=float, default=8.0, help="exploration bonus decay τ (Eq. 13); paper 8")
    g = p.add_argument_group("library evolution (§3.4)")
    g.add_argument("--gamma-prune", type=float, default=0.05, help="γ_prune (Eq. 8); not given in the paper")
    g.add_argument("--prune-min-attempts", type=int, default=4, help="attempts a package needs before Eq. 8 may prune it")
    g.add_argument("--gamma-induce", type=float, default=0.5, help="γ_induce (Eq. 9); not given in the paper")
    g.add_argument("--induce-min", type=int, default=None,
                   help="packages to induce per iteration, at least (while T_induce lasts); paper ≥20 tool / ≥10 zebra "
                        "(default by --family)")
    g.add_argument("--novelty-threshold", type=float, default=0.6, help="max Jaccard similarity to an existing package (Eq. 10)")
    g.add_argument("--refine-max", type=int, default=2, help="packages refined per iteration (those with most failed attempts)")
    g.add_argument("--controller-max-new-tokens", type=int, default=2048, help="controller generation limit")
    g = p.add_argument_group("ablations (§4.3)")
    g.add_argument("--unguided", action="store_true", help="Unguided SP: exploration stream only, no library")
    g.add_argument("--skill-only", action="store_true", help="Skill-only pool: no exploration stream")
    g.add_argument("--uniform-routing", action="store_true", help="Uniform routing: P(s) = 1/|S| instead of Eq. 13")
    g.add_argument("--frozen-skills", action="store_true", help="Frozen skills: no refinement, pruning or induction")
    g.add_argument("--frozen-proposer", action="store_true", help="Frozen proposer: no proposer GRPO")
    g.add_argument("--frozen-feedback-solver", action="store_true", help="probes use the solver as it enters self-play (after its warm-up), frozen, not π_solve^(t)")
    g = p.add_argument_group("evaluation (Table 5: avg@8, temperature 1.0; its top-k 40 is not applied, difference 11)")
    g.add_argument("--eval-n", type=int, default=0, help="held-out items per BFCL category (0 = all); paper all")
    g.add_argument("--eval-samples", type=int, default=8, help="samples per held-out item (avg@k); paper 8")
    g.add_argument("--eval-temperature", type=float, default=1.0, help="held-out sampling temperature; paper 1.0 (0 = greedy)")
    g.add_argument("--zebra-eval-per-scale", type=int, default=100, help="held-out zebra puzzles per scale")
    g.add_argument("--zebra-eval-scales", default="small,medium,large,xlarge",
                   help="held-out zebra scales; paper all four (Table 2)")
    g.add_argument("--rg-eval-n", type=int, default=200, help="reasoning-gym zebra puzzles (external check; 0 = off)")
    g.add_argument("--no-plots", action="store_true", help="skip the diagnostic PNGs")
    return p


def parse_args(argv=None):
    """Flags with the preset's values; BY_FAMILY's per-family values fill the flags left unset (None); the
    default run folder runs/skill_selfplay-<preset> gets the family and the ablations as suffixes."""
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="skill_selfplay")
    for values in (BY_FAMILY.get(args.preset, {}).get(args.family, {}), BY_FAMILY["paper"][args.family]):
        for k, v in values.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
    if args.run_dir == f"runs/skill_selfplay-{args.preset}":  # no --run-dir given
        args.run_dir += "-" + args.family + "".join("-" + f for f in ARMS if getattr(args, f))
    if args.unguided and args.skill_only:
        raise SystemExit("--unguided and --skill-only exclude each other")
    return args


# ----- data -----
# Zebra puzzles: a puzzle is {"houses": N, "attributes": {attr: [values]},
# "clues": [{"type": t, "a": value, "b": value | "house": k}]}. Values are unique
# across attributes so a clue names values only. Houses are numbered 1..N. The runtime (value
# pools, scales, schema check, solution counter, clue compiler, answer parser) sits below main.

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


def extract_json(text):
    """Last top-level decodable JSON object in text (or None)."""
    dec, best, i = json.JSONDecoder(), None, 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return best
        try:
            obj, end = dec.raw_decode(text, i)
        except (ValueError, RecursionError):  # RecursionError: hostile nesting depth
            i += 1
            continue
        if isinstance(obj, dict):
            best = obj
        i = end


def first_json_object(text):
    """The JSON object the text starts with (trailing text is ignored), or None. A proposal must open with
    its task: an object recovered from later in the reply (an example, a fragment) is not the proposal."""
    try:
        obj, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except (ValueError, RecursionError):  # RecursionError: hostile nesting depth
        return None
    return obj if isinstance(obj, dict) else None


# Tool-call tasks: a task is {"tools": [schema], "dialogue": [{"role", "content"}],
# "call": {"name", "arguments"}}; x = tools + dialogue, c = call. The checker (global schema check,
# call parser, call equality) sits below main.

# a filled-in call, not placeholders: SmolLM2-135M copies "<argument name>: <value>" literally
TOOL_FORMAT = ('Reply with exactly one tool call: the tool\'s name and its arguments as JSON inside <tool_call> tags. '
               'For example, for a tool "get_weather" with a string parameter "city":\n'
               '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')


def tool_messages(tools, dialogue):
    """Chat messages the solver sees for a tool task (x): system = tools, user = dialogue."""
    system = ("You are a function-calling assistant. Available tools (JSON schemas):\n"
              + "\n".join(json.dumps(t) for t in tools) + "\n" + TOOL_FORMAT)
    turns = "\n".join(f"<{d['role']}> {d['content']}" for d in dialogue)
    return [{"role": "system", "content": system},
            {"role": "user", "content": turns + "\nBased on the conversation above, make exactly one tool call."}]


# Skill packages s = ⟨m, r, h, e, ν, σ⟩ as files: front matter = m (name, title,
# family, source, iteration, derived_from, description); "## Rules" (+ "## Compiler"
# for zebra) = r; "## Hints" = h; "## Example" = e; "## Validator" = ν. σ lives in
# the library's stats.json. Packages are data: validators are interpreted below,
# never executed.

PKG_META = ["name", "title", "family", "source", "iteration", "derived_from", "description"]
TOOL_FORMATS = {"date": r"\d{4}-\d{2}-\d{2}", "time": r"\d{2}:\d{2}",
                "datetime": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?", "email": r"[^@\s]+@[^@\s]+\.\w+"}
TOOL_VALIDATOR_KEYS = {"tool_name": (str, list), "min_tools": int, "min_turns": int, "require_roles": list,
                       "min_args": int, "max_args": int, "arg_formats": dict, "arg_types": dict,
                       "args": dict, "grounded": (str, list), "omitted_optional": int}
ZEBRA_VALIDATOR_KEYS = {"min_houses": int, "max_houses": int, "min_attributes": int, "max_attributes": int,
                        "required_clues": dict, "max_fixed": int}
ZEBRA_COMPILER_KEYS = {"preferred": list, "fixed_limit": int, "min_counts": dict}


def compact_json(obj):
    """JSON with one line per top-level key and per element of a top-level list (readable package files)."""
    if not isinstance(obj, dict):
        return json.dumps(obj)
    rows = []
    for k, v in obj.items():
        if isinstance(v, list) and v:
            v = "[\n" + ",\n".join("  " + json.dumps(e) for e in v) + "\n ]"
        else:
            v = json.dumps(v)
        rows.append(f" {json.dumps(k)}: {v}")
    return "{\n" + ",\n".join(rows) + "\n}"


def render_package(pkg):
    lines = ["---"] + [f"{k}: {pkg.get(k, '')}" for k in PKG_META] + ["---", f"# {pkg['title']}", "",
                                                                        "## Rules", pkg["rules"].strip(), "",
                                                                        "## Hints", pkg["hints"].strip(), ""]
    for sec in (["compiler"] if pkg["family"] == "zebra" else []) + ["validator", "example"]:
        lines += [f"## {sec.capitalize()}", "```json", compact_json(pkg[sec]), "```", ""]
    return "\n".join(lines)


def parse_package(text):
    """Package file text -> (pkg, None) or (None, error)."""
    m = re.match(r"\s*---\n(.*?)\n---\n(.*)", text, re.S)
    if not m:
        return None, "missing front matter"
    pkg = {}
    for line in m.group(1).splitlines():
        k, _, v = line.partition(":")
        if k.strip() in PKG_META:
            pkg[k.strip()] = v.strip()
    try:
        pkg["iteration"] = int(pkg.get("iteration") or 0)
    except ValueError:
        return None, "iteration must be an integer"
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", m.group(2), re.S | re.M))
    pkg["rules"], pkg["hints"] = sections.get("Rules", "").strip(), sections.get("Hints", "").strip()
    for sec in ("Compiler", "Validator", "Example"):
        if sec in sections:
            body = re.search(r"```json\n(.*?)```", sections[sec], re.S)
            try:
                pkg[sec.lower()] = json.loads(body.group(1)) if body else None
            except ValueError:
                return None, f"{sec} is not valid JSON"
    return pkg, None


def check_keys(spec, allowed, what):
    if not isinstance(spec, dict):
        return f"{what} must be a JSON object"
    for k, v in spec.items():
        if k not in allowed:
            return f"unknown {what} key {k!r}"
        if not isinstance(v, allowed[k]) or isinstance(v, bool):
            return f"{what} key {k!r} has the wrong type"
    return None


def tool_contract_error(task, nu):
    """Package validator ν of a tool package on a schema-valid task (second part of Eq. 4)."""
    call, tools, dialogue = task["call"], task["tools"], task["dialogue"]
    schema = next(t for t in tools if t["name"] == call["name"]).get("parameters", {})
    props, args = schema.get("properties", {}), call["arguments"]
    names = [nu["tool_name"]] if isinstance(nu.get("tool_name"), str) else nu.get("tool_name")
    if names and call["name"] not in names:
        return f"tool must be one of {names}"
    if len(tools) < nu.get("min_tools", 1):
        return f"needs at least {nu['min_tools']} listed tools (distractors)"
    if len(dialogue) < nu.get("min_turns", 1):
        return f"needs at least {nu['min_turns']} dialogue turns"
    roles = {d["role"] for d in dialogue}
    for role in nu.get("require_roles", []):
        if role not in roles:
            return f"dialogue needs a {role} turn"
    if not nu.get("min_args", 0) <= len(args) <= nu.get("max_args", 99):
        return "wrong number of arguments"
    for fmt, k in nu.get("arg_formats", {}).items():
        if fmt not in TOOL_FORMATS:
            return f"unknown format {fmt}"
        if sum(isinstance(v, str) and re.fullmatch(TOOL_FORMATS[fmt], v) is not None for v in args.values()) < k:
            return f"needs {k} argument(s) in {fmt} format"
    for typ, k in nu.get("arg_types", {}).items():
        if sum(props.get(a, {}).get("type") == typ for a in args) < k:
            return f"needs {k} argument(s) of type {typ}"
    for a, spec in nu.get("args", {}).items():
        if a not in args:
            return f"argument {a} is required by the package"
        v = args[a]
        if "type" in spec and not type_ok(v, spec["type"]):
            return f"argument {a} must be {spec['type']}"
        if "format" in spec and not (isinstance(v, str) and spec["format"] in TOOL_FORMATS
                                     and re.fullmatch(TOOL_FORMATS[spec["format"]], v)):
            return f"argument {a} must use format {spec['format']}"
        if "min" in spec and not (type_ok(v, "number") and v >= spec["min"]):
            return f"argument {a} must be at least {spec['min']}"
        if "enum" in spec and v not in spec["enum"]:
            return f"argument {a} must be one of {spec['enum']}"
    optional = [p for p in props if p not in schema.get("required", []) and p not in args]
    if len(optional) < nu.get("omitted_optional", 0):
        return f"needs {nu['omitted_optional']} unused optional parameter(s)"
    grounded = nu.get("grounded")
    if grounded:
        text = " ".join(d["content"] for d in dialogue).lower()
        check = [a for a, v in args.items() if isinstance(v, str)] if grounded == "strings" else grounded
        for a in check:
            if a in args and str(args[a]).lower() not in text:
                return f"argument {a} value is not grounded in the dialogue"
    return None


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


def validate_package(pkg, family):
    """Integrity of a package: fields, known validator keys, and its own example
    passes the global schema, its validator and (zebra) uniqueness. (pkg, err)."""
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
        bad = [k for k in pkg["validator"].get("arg_formats", {}) if k not in TOOL_FORMATS]
        if bad:
            return f"unknown formats {bad}"
        err = tool_schema_error(pkg.get("example")) or tool_contract_error(pkg["example"], pkg["validator"])
        return f"example: {err}" if err else None
    err = check_keys(pkg.get("compiler"), ZEBRA_COMPILER_KEYS, "compiler")
    if err:
        return err
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


def new_stats():
    return {"a": 0, "n_ver": 0, "n_con": 0, "n_fd": 0, "accepted": 0, "a_t": 0, "R_t": 0.0, "failed_t": []}


def load_library(folder, family):
    """Packages of a library folder (invalid files are skipped with a message) and σ."""
    pkgs = []
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".md"):
            continue
        with open(os.path.join(folder, fn)) as f:
            pkg, err = parse_package(f.read())
        err = err or validate_package(pkg, family)
        if err:
            print(f"[library] skipping {fn}: {err}")
            continue
        pkgs.append(pkg)
    stats_path = os.path.join(folder, "stats.json")
    try:
        stats = json.load(open(stats_path)) if os.path.exists(stats_path) else {}
    except ValueError:
        print(f"[library] {stats_path} is not valid JSON: statistics start from zero")
        stats = {}
    return pkgs, {p["name"]: {**new_stats(), **stats.get(p["name"], {})} for p in pkgs}


def save_library(folder, pkgs, stats):
    os.makedirs(folder, exist_ok=True)
    for pkg in pkgs:
        with open(os.path.join(folder, pkg["name"] + ".md"), "w") as f:
            f.write(render_package(pkg))
    with open(os.path.join(folder, "stats.json"), "w") as f:
        json.dump({p["name"]: stats[p["name"]] for p in pkgs}, f, indent=1)


# ----- rewards -----

def tool_reward(text, call):
    """Eq. (14) with its parts: (R_tool, valid_format, exact_call, first parsed call). The reply's answer is its
    first well-formed call, the same answer the probes' majority vote counts (solve_reward)."""
    calls = parse_tool_calls(text)
    valid_format = len(calls) > 0
    exact = valid_format and call_key(calls[0]) == call_key(call)
    # Eq. (14): R_tool = 0.9·1{ExactCall(y, c)} + 0.1·1{ValidFormat(y)}
    r = 0.9 * float(exact) + 0.1 * float(valid_format)
    return r, valid_format, exact, (calls[0] if calls else None)


def zebra_reward(text, p, solution):
    """Eq. (15) with its parts: (R_logic, valid_structure, full_puzzle, cell accuracy, grid)."""
    grid, valid = parse_grid(text, p)
    cells = [(h, a) for h in range(1, p["houses"] + 1) for a in p["attributes"]]
    right = sum(1 for h, a in cells if grid and grid.get(h, {}).get(a) == solution[f"House {h}"][a])
    full = right == len(cells) and valid
    # Eq. (15): R_logic = 0.9·1{FullPuzzle(y, c)} + 0.1·1{ValidStructure(y, c)}
    r = 0.9 * float(full) + 0.1 * float(valid)
    return r, valid, full, right / len(cells), grid


def v_solve(probe_rewards):
    # Eq. (1): v_solve(x, c; π_solve) = E_{y~π_solve(·|x)}[R_solve(x, y, c)], estimated by the mean over K probes
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
    """ρ(x_i) = |C_i| / B with C_i the greedy Jaccard cluster of x_i (App. C).

    Texts are visited in order; each joins the first cluster whose founding text
    has Jaccard similarity ≥ threshold, or founds a new one. B defaults to
    len(texts) (the proposer rollout batch)."""
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


# ----- routing (App. B: Eq. 11-13) -----

def smoothed_rate(n, a, kappa):
    # Eq. (11): r̂ᵒ_j = (nᵒ_j + κ/2) / (a_j + κ)
    return (n + kappa / 2) / (a + kappa)


def skill_score(st, kappa):
    # Eq. (12): v_skill(s_j) = ½ r̂ᵛᵉʳ_j + ¼ r̂ᶜᵒⁿ_j + ¼ r̂ᶠᵈ_j
    return (0.5 * smoothed_rate(st["n_ver"], st["a"], kappa) + 0.25 * smoothed_rate(st["n_con"], st["a"], kappa)
            + 0.25 * smoothed_rate(st["n_fd"], st["a"], kappa))


def routing_probs(stats_list, kappa, w_min, w_max, beta, tau, uniform=False):
    """Selection probabilities P(s_j) over the library (list of σ dicts)."""
    if uniform:  # "Uniform routing" ablation
        return [1.0 / len(stats_list)] * len(stats_list)
    # Eq. (13): w(s_j) = clip(v_skill(s_j), w_min, w_max)·(1 + β·exp(−a_j/τ)),  P(s_j) = w(s_j) / Σ_ℓ w(s_ℓ)
    w = [min(max(skill_score(st, kappa), w_min), w_max) * (1 + beta * math.exp(-st["a"] / tau)) for st in stats_list]
    return [x / sum(w) for x in w]


# ----- curriculum and library selection (Eq. 6, 8-10) -----

def build_curriculum(records, M, alpha, v_lo, v_hi, band=True):
    """Eq. (6) on valid records, restricted to the frontier band v_solve ∈ [v_lo, v_hi]."""
    pool = [r for r in records if r["valid"] and (not band or v_lo <= r["v_solve"] <= v_hi)]
    top = lambda stream, k: sorted([r for r in pool if r["stream"] == stream], key=lambda r: -r["R"])[:k]
    m_skill = int(round(alpha * M))
    # Eq. (6): D(t) = Top_αM(T_skill; R_propose) ∪ Top_(1−α)M(T_explore; R_propose)
    return top("skill", m_skill) + top("explore", M - m_skill)


def prune_set(pkgs, stats, gamma, min_attempts):
    """Eq. (8) with E[R_propose | s] estimated by this iteration's attempts of s;
    untested packages (< min_attempts) are kept, and the library never empties."""
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


def effective_skills(accepted_counts):
    """Active skills (≥ 1 accepted record) and N_eff = exp(−Σ p_j log p_j) (Figure 6)."""
    total = sum(accepted_counts.values())
    ps = [c / total for c in accepted_counts.values() if c > 0] if total else []
    return len(ps), math.exp(-sum(p * math.log(p) for p in ps)) if ps else 0.0


# ----- rollout -----

TOOL_TASK_SPEC = ('A task is one JSON object with keys "tools" (a list of tool schemas {"name", "description", '
                  '"parameters": {"type": "object", "properties": {arg: {"type": string|integer|number|boolean|array|object}}, '
                  '"required": [...]}}), "dialogue" (a list of {"role": "user"|"assistant"|"observation", "content"}, '
                  'starting with the user) and "call" ({"name", "arguments"}: the one correct next tool call).')
# The proposer's reply is prefilled with the opening of the JSON object (the prefix is part of the
# prompt, not of the trained tokens): a small model then continues a task instead of chatting.
PROPOSER_PREFIX = {"tool": '{"tools": [{"name": "', "zebra": '{"houses": '}
ZEBRA_TASK_SPEC = ('A puzzle is one JSON object with keys "houses" (2-6), "attributes" ({name: [one value per house]}, '
                   'all values distinct) and "clues" (a list of {"type": fixed|not_house, "a": value, "house": k} or '
                   '{"type": same_house|next_to|left_of|directly_left_of, "a": value, "b": value}).')


# --proposer-grammar on: proposals are decoded under these JSON schemas (vLLM structured outputs). They fix
# the syntax and the key layout only; every semantic check of Eq. 4 (tool names, required arguments,
# distinct values, uniqueness, ν, probes) is still done by check_proposal and probe_records.
_TEXT = lambda n: {"type": "string", "minLength": 1, "maxLength": n}


def _OBJECT(required, /, **props):
    """A JSON-schema object with exactly these properties (a property may itself be called "required")."""
    return {"type": "object", "additionalProperties": False, "required": required, "properties": props}


_PARAM = _OBJECT(["type"], type={"enum": ["string", "integer", "number", "boolean", "array"]}, description=_TEXT(80),
                 items=_OBJECT([], type={"enum": ["string", "integer", "number"]}),
                 enum={"type": "array", "items": _TEXT(30), "maxItems": 6})
_TOOL = _OBJECT(["name", "description", "parameters"], name={"type": "string", "pattern": "^[a-z][a-z_]{1,30}$"},
                description=_TEXT(60),
                parameters=_OBJECT(["type", "properties", "required"], type={"const": "object"},
                                   properties={"type": "object", "maxProperties": 4, "additionalProperties": _PARAM},
                                   required={"type": "array", "items": _TEXT(30), "maxItems": 4}))
_TURN = _OBJECT(["role", "content"], role={"enum": ["user", "assistant", "observation"]}, content=_TEXT(160))
_ARG_VALUE = {"anyOf": [{"type": ["string", "integer", "number", "boolean"]},
                        {"type": "array", "maxItems": 6, "items": {"type": ["string", "integer", "number"]}}]}
_CALL = _OBJECT(["name", "arguments"], name=_TEXT(40),
                arguments={"type": "object", "maxProperties": 4, "additionalProperties": _ARG_VALUE})
_ZEBRA_VALUE = {"type": "string", "pattern": "^[A-Z][a-z]{1,11}$"}


def _zebra_schema(n):
    """A puzzle with n houses: every attribute lists exactly n values."""
    clue = _OBJECT(["type", "a"], type={"enum": sorted(ZEBRA_TEXT)}, a=_ZEBRA_VALUE, b=_ZEBRA_VALUE,
                   house={"type": "integer", "minimum": 1, "maximum": n})
    return _OBJECT(["houses", "attributes", "clues"], houses={"const": n},
                   attributes={"type": "object", "minProperties": 2, "maxProperties": 6, "additionalProperties": {
                       "type": "array", "items": _ZEBRA_VALUE, "minItems": n, "maxItems": n}},
                   clues={"type": "array", "maxItems": 16, "items": clue})


TASK_SCHEMA = {
    "tool": _OBJECT(["tools", "dialogue", "call"], tools={"type": "array", "minItems": 1, "maxItems": 4, "items": _TOOL},
                    dialogue={"type": "array", "minItems": 1, "maxItems": 5, "items": _TURN}, call=_CALL),
    "zebra": {"anyOf": [_zebra_schema(n) for n in range(2, 7)]},  # one alternative per house count
}


def proposer_messages(family, pkg):
    """Skill stream (pkg given: rules r, hints h, example e) or exploration stream (pkg None)."""
    if family == "tool":
        head = "You write training tasks for a function-calling assistant. " + TOOL_TASK_SPEC
        ask = "Write one NEW task in this JSON format with different tools and values. Output only the JSON."
    else:
        head = "You write logic grid puzzles for a solver. " + ZEBRA_TASK_SPEC
        ask = ("Write one NEW puzzle blueprint in this JSON format (houses and attributes; clues are optional, "
               "a runtime completes them until the solution is unique). Output only the JSON." if pkg else
               "Write one NEW puzzle in this JSON format whose clues determine exactly one solution. Output only the JSON.")
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
    """(prefix, stop) of every tool-call answer (probes, solver GRPO, held-out evaluation, base and trained alike).
    --solver-aid on: the reply is prefilled with the opening of the call, part of the prompt and not trained
    on, and stops after the call; SmolLM2-135M otherwise rarely writes a call at all."""
    if args.family == "tool" and args.solver_aid == "on":
        return '<tool_call>{"name": "', ["</tool_call>"]
    return "", None


def grid_schema(p):
    """JSON schema of a zebra answer: every house, every attribute, each value one of the attribute's values
    (that each value is used once, and which house holds it, is left to the solver)."""
    row = _OBJECT(list(p["attributes"]), **{a: {"enum": list(vals)} for a, vals in p["attributes"].items()})
    houses = [f"House {h}" for h in range(1, p["houses"] + 1)]
    return _OBJECT(houses, **{h: row for h in houses})


def answer_schemas(args, puzzles):
    """--solver-aid on (zebra): zebra answers are decoded under their puzzle's grid_schema; else None."""
    return [grid_schema(p) for p in puzzles] if args.family == "zebra" and args.solver_aid == "on" else None


def answer_budget(args, tok, solutions):
    """Token budget of a solver answer. Zebra: --max-new-tokens, raised until the longest gold grid among
    `solutions` fits, written with ", " and ": " (longer than the compact JSON the grid schema decodes, and what
    free decoding tends to write) plus a quarter for other tokenisations and EOS; under the grammar a reply ends when its grid closes, so the room costs nothing.
    Derived from the largest grid in play (the held-out set; a batch of probes or solver tasks), never fixed: a
    budget below the answer scores a grid 0 by truncation and steers the proposer towards small puzzles."""
    if args.family != "zebra" or not solutions:
        return args.max_new_tokens
    longest = max(len(tok.encode(json.dumps(sol), add_special_tokens=False)) for sol in solutions)
    return max(args.max_new_tokens, math.ceil(1.25 * longest) + 1)


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


REJECT_TYPES = ("schema", "compile", "contract", "probe")  # rec["reject"]: the gate a proposal failed (None: passed)


def check_proposal(family, text, pkg, rng):
    """Parse and gate a proposal before probing: a record, or None if unparseable (proposer reward −1).

    Record fields: task (compiled puzzle for zebra), contract c, ok_schema, ok_contract (package validator ν;
    always True in the exploration stream), reject (None, or which gate rejected it: "schema" = global schema,
    "compile" = zebra runtime found no unique puzzle, "contract" = ν; probe_records adds "probe") and why (the
    reason). Model output is hostile input: no JSON value makes this function, or anything it calls, raise."""
    obj = first_json_object(text)
    if obj is None:
        return None
    rec = {"task": obj, "contract": None, "ok_schema": False, "ok_contract": pkg is None, "reject": None, "why": ""}

    def reject(kind, why):
        rec.update(reject=kind, why=why)
        return rec

    if family == "tool":
        err = tool_schema_error(obj)
        if err:
            return reject("schema", err)
        rec.update(contract=obj["call"], ok_schema=True)
        if pkg is not None:
            err = tool_contract_error(obj, pkg["validator"])
            rec["ok_contract"] = not err
            if err:
                return reject("contract", err)
        return rec
    bp = {"houses": obj.get("houses"), "attributes": obj.get("attributes"), "clues": obj.get("clues", [])}
    err = zebra_schema_error(bp)
    if err:
        return reject("schema", err)
    bp["clues"] = clean_clues(bp["clues"])
    if pkg is not None:  # skill stream: the runtime compiles the blueprint with the package's compiler spec
        cmp = pkg["compiler"]
        puzzle, pos = compile_puzzle(rng, bp, cmp.get("preferred"), cmp.get("fixed_limit"), cmp.get("min_counts"))
    else:  # exploration stream: the proposer's clues must already be unique
        try:
            n_sol, pos = count_solutions(bp, 2)
            puzzle, pos = (bp, pos) if n_sol == 1 else (None, f"{n_sol} solutions (need exactly 1)")
        except SearchBudget as e:
            puzzle, pos = None, str(e)
    if puzzle is None:
        return reject("compile", pos)
    rec.update(task=puzzle, contract=solution_grid(puzzle, pos), ok_schema=True)
    if pkg is not None:
        err = zebra_contract_error(puzzle, pkg["validator"])
        rec["ok_contract"] = not err
        if err:
            return reject("contract", err)
    return rec


def probe_records(family, recs, probe_sampler, tok, args):
    """K probes of the (frozen) solver for every gated record: fills v_solve (Eq. 1), consistency and valid (Eq. 4)."""
    todo = [r for r in recs if r["ok_schema"] and r["ok_contract"]]
    prefix, stop = answer_prefix(args)
    prompts = [prefilled_prompt(tok, solver_messages(family, r["task"]), prefix) for r in todo]
    outs = probe_sampler.generate(prompts, args.K, answer_budget(args, tok, [r["contract"] for r in todo]),
                                  args.temperature, stop=stop,
                                  json_schema=answer_schemas(args, [r["task"] for r in todo])) if prompts else []
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
        r["x_text"] = "\n".join(m["content"] for m in solver_messages(family, r["task"])) if r["ok_schema"] else ""
    return recs


def proposal_decoding(args, proposer_sampler):
    """(prefilled opening of the reply, JSON schema that constrains decoding) of every proposal: the schema with
    --proposer-grammar on and a sampler that can constrain (vLLM), else the PROPOSER_PREFIX prefill."""
    if args.proposer_grammar == "on" and not isinstance(proposer_sampler, HFSampler):
        return "", TASK_SCHEMA[args.family]
    return PROPOSER_PREFIX[args.family], None


def propose(tag, n_prompts, proposer_sampler, probe_sampler, tok, pkgs, stats, args, rng, dist):
    """n_prompts proposer prompts (routed skill stream, Eq. 13, and exploration stream), G proposals each,
    gated (check_proposal) and probed by the solver (probe_records). Each rank generates and probes its share
    of the prompts; the batch is gathered so that it is the same, in the same order, on every rank.
    Returns (this rank's rollouts, their batch entries, the whole batch)."""
    n_skill = 0 if args.unguided else n_prompts if args.skill_only else n_prompts // 2
    probs = routing_probs([stats[p["name"]] for p in pkgs], args.kappa, args.w_min, args.w_max, args.beta_route,
                          args.tau, args.uniform_routing) if n_skill else []
    chosen = rng.choices(pkgs, weights=probs, k=n_skill) if n_skill else []  # same rng state on every rank
    streams = [("skill", p) for p in chosen] + [("explore", None) for _ in range(n_prompts - n_skill)]
    mine = list(range(dist.rank, len(streams), dist.world))  # global prompt indices g of this rank
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
            rollouts.append(Rollout(prompt, s.ids, [1] * len(s.ids), s.text, group=g, sample_logp=s.logprobs, forced=s.forced))
            local.append({"g": g, "j": j, "stream": stream, "skill": pkg["name"] if pkg else None, "rec": rec})
    probe_records(args.family, [x["rec"] for x in local if x["rec"] is not None], probe_sampler, tok, args)
    batch = sorted(gather_objects(local, dist), key=lambda x: (x["g"], x["j"]))
    return rollouts, local, batch


def update_stats(batch, stats, args):
    """σ, the routing statistics of App. B, from the skill-conditioned attempts of a batch, and this
    iteration's Eq. 8 estimate (a_t, R_t) with its failed attempts (for refinement)."""
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


def proposer_round(step, t, proposer_sampler, probe_sampler, tok, pkgs, stats, args, rng, dist):
    """One proposer GRPO batch (Eq. 5): --proposer-prompts prompts, G proposals each, rewarded with
    R_propose (Eq. 2) minus the repetition penalty, −1 when unparseable.
    Returns (this rank's rollouts with rewards, all parsed records, the number unparsed)."""
    rollouts, local, batch = propose(f"{t}-{step}", args.proposer_prompts, proposer_sampler, probe_sampler, tok, pkgs,
                                     stats, args, rng, dist)
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


def collection_pass(t, proposer_sampler, probe_sampler, tok, pkgs, stats, args, rng, dist):
    """App. E, Table 6: after the proposer update, the updated proposer generates --collect-prompts × G
    further candidates, which are gated and probed like the GRPO batch (no gradient).
    Returns (their parsed records, the number unparsed)."""
    _, _, batch = propose(f"{t}-collect", args.collect_prompts, proposer_sampler, probe_sampler, tok, pkgs, stats,
                          args, rng, dist)
    update_stats(batch, stats, args)
    return [x["rec"] for x in batch if x["rec"] is not None], sum(x["rec"] is None for x in batch)


# ----- training loop -----

def prime_proposer(proposer, tok, pkgs, args, dist, grammar):
    """--proposer-sft-steps (difference 13): SFT warm-up of the proposer on the worked examples of S(0), before
    iteration 0. Each package's skill-stream prompt is paired with its own example, the exploration prompt with
    every example; the target is the example as the proposer would write it (compact JSON, plumbing.json_text, as
    the grammar decodes it; without the grammar, after the spaced prefilled opening). Returns grpo.sft_loop's summary."""
    prefix = "" if grammar else PROPOSER_PREFIX[args.family]
    examples = []
    for pkg in pkgs:
        text = json_text(pkg["example"]) if grammar else json.dumps(pkg["example"])  # as each decoding writes it
        if not text.startswith(prefix):
            continue
        target = tok.encode(text[len(prefix):], add_special_tokens=False) + [tok.eos_token_id]
        for stream_pkg in ([pkg, None] if not args.skill_only else [pkg]):
            examples.append((prefilled_prompt(tok, proposer_messages(args.family, stream_pkg), prefix), target))
    # grpo.sft_loop: L_SFT = − Σ log π(y_t | x, y_<t) / Σ 1 over the target tokens of each step's examples
    return sft_loop(proposer, examples, args, dist, args.proposer_sft_lr, args.proposer_sft_batch, args.proposer_sft_steps,
                    seed=f"{args.seed}-proposer-sft", log_dir=os.path.join(args.run_dir, "proposer_sft"))


def prime_solver(solver, tok, args, dist):
    """--solver-sft-steps (difference 14): SFT warm-up of the solver before iteration 0 on tasks disjoint from
    S(0) and the held-out sets, the reference answers as targets, written as the reward parses them. Tool:
    scripted tool tasks (scripted_tool_tasks), the call after the answer prefix. Zebra: runtime puzzles of the
    held-out scales from a training-side seed (a puzzle equal to a held-out one is skipped), the grid as compact
    JSON (plumbing.json_text, as the grid schema decodes it). Returns grpo.sft_loop's summary."""
    prefix, _ = answer_prefix(args)
    rng, examples = random.Random(f"{args.seed}-solver-sft"), []
    if args.family == "tool":
        for task in scripted_tool_tasks(rng, args.solver_sft_tasks):
            answer = "<tool_call>" + json.dumps(task["call"]) + "</tool_call>"
            target = tok.encode(answer[len(prefix):], add_special_tokens=False) + [tok.eos_token_id]
            examples.append((prefilled_prompt(tok, solver_messages("tool", task), prefix), target))
    else:
        heldout, scales = zebra_heldout(args)
        seen = {render_zebra_prompt(p) for _, p, _ in heldout}
        per_scale = -(-args.solver_sft_tasks // len(scales))
        for _, p, sol in make_zebra_puzzles(f"{args.data_seed}-solver-sft", scales, per_scale):
            if render_zebra_prompt(p) in seen:
                continue
            answer = json_text(sol)  # compact, as the grid schema decodes it (vLLM and ConstrainedHFSampler alike)
            target = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
            examples.append((prefilled_prompt(tok, solver_messages("zebra", p), ""), target))
    return sft_loop(solver, examples, args, dist, args.solver_sft_lr, args.solver_sft_batch, args.solver_sft_steps,
                    seed=f"{args.seed}-solver-sft-draw", log_dir=os.path.join(args.run_dir, "solver_sft"))


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
    probe_sampler: object  # the K probes of Eq. 1/4: s_sampler, or a frozen solver's under --frozen-feedback-solver
    controller: object     # π_control: π^(0) on HF generate (free text, no schema)
    tok: object


def proposer_phase(t, P, pkgs, stats, args, rng, dist):
    """Algorithm 2, lines 3-20: --proposer-steps GRPO steps of the proposer (Eq. 5) on skill- and
    exploration-stream batches probed by the solver, then the collection pass of the updated proposer.
    Updates σ in place. Returns (every parsed record of the iteration, the number unparsed, timings)."""
    proposer, ref, opt_p, p_sampler, probe_sampler, tok = P.proposer, P.ref, P.opt_p, P.p_sampler, P.probe_sampler, P.tok
    for st in stats.values():
        st.update(a_t=0, R_t=0.0, failed_t=[])
    t0, recs, n_unparsed_all, times = time.time(), [], 0, {}
    for s in range(args.proposer_steps):
        rollouts, batch_recs, n_unparsed = proposer_round(s, t, p_sampler, probe_sampler, tok, pkgs, stats, args,
                                                          rng, dist)
        recs += batch_recs
        n_unparsed_all += n_unparsed
        if args.frozen_proposer:
            m = reduce_metrics({"reward": float(np.mean([r.reward for r in rollouts])) if rollouts else 0.0,
                                "skipped": 1.0}, dist)
        else:
            # Eq. (5): J_propose(π) = E_{s~S, (x,c)~π(·|s)}[R_propose(x, c; π_solve^(t))], GRPO over G proposals per prompt
            m = grpo_update(proposer, ref, opt_p, rollouts, args, dist)
            p_sampler.sync(proposer)
        m.update(n_unparsed=n_unparsed, n_valid=sum(r["valid"] for r in batch_recs),
                 v_solve=float(np.mean([r["v_solve"] for r in batch_recs])) if batch_recs else 0.0)
        log_metrics(os.path.join(args.run_dir, "proposer"), t * args.proposer_steps + s, m, dist,
                    keys=("reward", "n_unparsed", "n_valid", "v_solve", "kl", "grad_norm", "completion_len"))
    times["time_propose"] = time.time() - t0
    t0 = time.time()
    if args.collect_prompts:  # candidates of the updated proposer, probed by the current solver (App. E)
        collected, n_unparsed = collection_pass(t, p_sampler, probe_sampler, tok, pkgs, stats, args, rng, dist)
        recs += collected
        n_unparsed_all += n_unparsed
    times["time_collect"] = time.time() - t0
    return recs, n_unparsed_all, times


def solver_round(D, solver_sampler, tok, args, rng, dist):
    """Solver GRPO rollouts on a batch of the curriculum D(t) (Eq. 7): only x is shown.
    The batch is drawn with the shared rng (same on every rank); each rank rolls out its share."""
    batch = rng.sample(D, min(args.solver_batch, len(D)))[dist.rank::dist.world]
    prefix, stop = answer_prefix(args)
    prompts = [prefilled_prompt(tok, solver_messages(args.family, r["task"]), prefix) for r in batch]
    budget = copy.copy(args)  # the zebra budget fits the batch's longest gold grid (answer_budget)
    budget.max_new_tokens = answer_budget(args, tok, [r["contract"] for r in batch])
    rollouts = sample_group_rollouts(solver_sampler, prompts, args.solver_G, budget, stop,
                                     json_schema=answer_schemas(args, [r["task"] for r in batch])) if batch else []
    for ro in rollouts:
        ro.reward = solve_reward(args.family, prefix + ro.text, batch[ro.group])[0]
    return rollouts


def solver_phase(recs, t, solver, ref, opt_s, s_sampler, tok, args, rng, dist):
    """Step 2 of iteration t: the curriculum D(t) from this iteration's records (Eq. 6), then
    --solver-steps GRPO steps of the solver on batches of D(t) (Eq. 7), each logged to
    <run-dir>/solver. An empty D(t) leaves the solver untouched. Returns (D(t), per-step metrics)."""
    alpha = 0.0 if args.unguided else 1.0 if args.skill_only else args.alpha
    band = args.family == "tool" or args.zebra_band == "on"
    D = build_curriculum(recs, args.M, alpha, args.v_lo, args.v_hi, band=band)
    if not D:
        if dist.is_main:
            print(f"iteration {t}: the curriculum is empty (no valid candidate{' in the frontier band' if band else ''}); "
                  "solver not updated")
        return D, []
    steps = []
    for s in range(args.solver_steps):
        rollouts = solver_round(D, s_sampler, tok, args, rng, dist)
        # Eq. (7): J_solve(π) = E_{(x,c)~D(t), y~π(·|x)}[R_solve(x, y, c)], GRPO over G answers per task
        m = grpo_update(solver, ref, opt_s, rollouts, args, dist)
        s_sampler.sync(solver)
        log_metrics(os.path.join(args.run_dir, "solver"), t * args.solver_steps + s, m, dist,
                    keys=("reward", "kl", "loss", "grad_norm", "completion_len", "n_groups_dropped"))
        steps.append(m)
    return D, steps


def iteration_metrics(recs, D, pkgs, stats, changes, t):
    """Figure 5/6 diagnostics of one iteration."""
    m = {"iteration": t, "n_proposals_parsed": len(recs), "pool_size": len(D), "lib_size": len(pkgs)}
    for stream in ("skill", "explore"):
        rs = [r for r in recs if r["stream"] == stream]
        acc = [r for r in rs if r["valid"]]
        m[f"valid_rate_{stream}"] = len(acc) / len(rs) if rs else 0.0
        m[f"n_accepted_{stream}"] = len(acc)
        m[f"v_solve_{stream}"] = float(np.mean([r["v_solve"] for r in acc])) if acc else float("nan")
        m[f"R_propose_{stream}"] = float(np.mean([r["R"] for r in rs])) if rs else float("nan")
    counts = collections.Counter(r["skill"] for r in recs if r["stream"] == "skill" and r["valid"])
    m["active_skills"], m["n_eff"] = effective_skills(counts)
    for op in ("induce", "refine", "prune"):
        m[f"n_{op}d" if op != "prune" else "n_pruned"] = sum(c["op"] == op for c in changes)
    return m


# ----- library evolution (§3.4) -----

CONTROLLER_INDUCE = ("You maintain a library of skills for generating {what}. Here is a generated task that was "
                     "valid and at the solver's frontier:\n{x}\nReference answer: {c}\nDescribe the reusable pattern "
                     "behind it in exactly four lines:\nTitle: <short_snake_case_name>\nDescription: <one sentence>\n"
                     "Rules: <how to build tasks with this pattern>\nHints: <what to vary>")
CONTROLLER_REFINE = ("A skill for generating {what}:\nTitle: {title}\nDescription: {description}\nRules: {rules}\n"
                     "Hints: {hints}\nRecent generation attempts with this skill failed because: {reasons}\n"
                     "Write improved hints that avoid these failures, in one line:\nHints: <text>")


def controller_fields(text, keys):
    """'Key: value' lines of a controller reply -> {key: value} (missing keys absent)."""
    out = {}
    for k in keys:
        m = re.search(rf"^\W*{k}\W*:\s*(.+)$", text, re.I | re.M)
        if m and m.group(1).strip():
            out[k.lower()] = m.group(1).strip()[:600]
    return out


def derive_validator(rec, family):
    """ν (and the zebra compiler spec) of an induced package, derived from its inducing record by code."""
    task = rec["task"]
    if family == "tool":
        props = next(t for t in task["tools"] if t["name"] == task["call"]["name"])["parameters"].get("properties", {})
        return {"tool_name": task["call"]["name"], "min_tools": len(task["tools"]), "min_turns": len(task["dialogue"]),
                "require_roles": sorted({d["role"] for d in task["dialogue"]} - {"user"}),
                "args": {a: {"type": props[a]["type"]} for a in task["call"]["arguments"]}}, None
    counts = collections.Counter(c["type"] for c in task["clues"])
    need = {t: min(k, 2) for t, k in counts.items() if t != "not_house"}
    nu = {"min_houses": task["houses"], "max_houses": task["houses"], "min_attributes": len(task["attributes"]),
          "required_clues": need, "max_fixed": counts["fixed"]}
    compiler = {"preferred": [t for t, _ in counts.most_common(3)], "fixed_limit": counts["fixed"], "min_counts": need}
    return nu, compiler


def induce_packages(T_induce, controller_sampler, tok, pkgs, args, t):
    """Eq. (10): packages written by the controller from T_induce, kept if Integrity ∧ Novelty (against the
    whole library S(t) given as pkgs, and the packages induced before them). The records are taken best
    R_propose first, --induce-min at a time, until at least --induce-min packages are kept or T_induce is
    used up (Table 5: "induce at least 20 new packages")."""
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
            pkg = {"name": f"{args.family}_i{t + 1:02d}_{i:03d}", "title": re.sub(r"\W+", "_", f.get("title", ""))[:60],
                   "family": args.family, "source": "skill_induction", "iteration": t + 1, "derived_from": "",
                   "description": f.get("description", ""), "rules": f.get("rules", ""), "hints": f.get("hints", ""),
                   "validator": nu, "example": r["task"]}
            i += 1
            if compiler:
                pkg["compiler"] = compiler
            # Eq. (10): S_new = {s ~ π_control(·|T_induce) | Integrity(s) ∧ Novelty(s, S)}
            err = validate_package(pkg, args.family)
            if err is None and not novelty_ok(pkg, library, args.novelty_threshold):
                err = "not novel (lexically too close to an existing package)"
            log.append({"iteration": t, "op": "induce" if err is None else "induce_rejected", "skill": pkg["name"],
                        "reason": err or f"frontier exploration record with R_propose={r['R']:.2f}"})
            if err is None:
                new.append(pkg)
                library.append(pkg)
    return new, log


def refine_packages(pkgs, stats, controller_sampler, tok, args, t):
    """Rewrite the hints of the packages with most failed attempts this iteration (controller)."""
    what = "function-calling tasks" if args.family == "tool" else "logic grid puzzles"
    worst = sorted([p for p in pkgs if stats[p["name"]]["failed_t"]], key=lambda p: -len(stats[p["name"]]["failed_t"]))
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
            log.append({"iteration": t, "op": "refine_rejected", "skill": p["name"], "reason": "controller gave no new hints"})
            continue
        p["hints"] = hints
        log.append({"iteration": t, "op": "refine", "skill": p["name"], "reason": f"failed attempts: {reasons}"[:500]})
    return log


def evolve_library(t, pkgs, stats, recs, controller, tok, args, dist):
    """§3.4 on rank 0 (the controller is the frozen initial policy): refine the hints of failing packages,
    prune (Eq. 8), induce from frontier exploration records (Eq. 9-10, novelty against the whole S(t));
    S(t+1), σ and the change log are then broadcast. Returns (S(t+1), σ, changes)."""
    changes = []
    if not (args.frozen_skills or args.unguided) and dist.is_main:
        changes += refine_packages(pkgs, stats, controller, tok, args, t)
        pruned = prune_set(pkgs, stats, args.gamma_prune, args.prune_min_attempts)
        changes += [{"iteration": t, "op": "prune", "skill": n, "reason":
                     f"E[R_propose] = {stats[n]['R_t'] / stats[n]['a_t']:.3f} < γ_prune over {stats[n]['a_t']} attempts"}
                    for n in pruned]
        new, log = induce_packages(induce_set(recs, args.gamma_induce), controller, tok, pkgs, args, t)
        changes += log
        # S(t+1) = (S(t) \ S_prune) ∪ S_new
        pkgs = [p for p in pkgs if p["name"] not in pruned] + new
        stats = {**stats, **{p["name"]: new_stats() for p in new}}
    pkgs, stats, changes = broadcast_object((pkgs, stats, changes), dist)  # S(t+1), σ and the change log of rank 0
    return pkgs, stats, changes


# ----- evaluation -----

def reset_prefix_cache(sampler):
    """Before each evaluation: vLLM's prefix cache dropped, so no row reuses KV blocks of another (HF keeps none)."""
    llm = getattr(sampler, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()


def save_generations(args, name, items, dist):
    """Every held-out generation of one table row, scored: <run-dir>/eval/<row>.jsonl (rank 0)."""
    if not dist.is_main:
        return
    os.makedirs(os.path.join(args.run_dir, "eval"), exist_ok=True)
    with open(os.path.join(args.run_dir, "eval", re.sub(r"\W+", "_", name) + ".jsonl"), "w") as f:
        f.writelines(json.dumps(it) + "\n" for it in items)


def eval_tool(sampler, tok, args, dist, name="eval"):
    """BFCL accuracy per category (avg@k over --eval-samples) and the unweighted BFCL average.
    Items are sharded over ranks; their replies are gathered, so every rank gets the same totals."""
    res, items, (prefix, stop) = {}, [], answer_prefix(args)
    reset_prefix_cache(sampler)
    for cat in BFCL_CATEGORIES:
        data = load_bfcl(cat, args.eval_n)
        mine = list(range(dist.rank, len(data), dist.world))
        prompts = [prefilled_prompt(tok, bfcl_messages(data[i][0], cat), prefix) for i in mine]
        outs = sampler.generate(prompts, args.eval_samples, args.max_new_tokens, args.eval_temperature,
                                stop=stop) if prompts else []
        replies = dict(gather_objects([(i, [prefix + s.text for s in samples]) for i, samples in zip(mine, outs)], dist))
        hits = []
        for i, (e, gt) in enumerate(data):
            ok = [bfcl_check(bfcl_decode(text), e["function"][0], gt, cat)[0] for text in replies[i]]
            items.append({"category": cat, "id": e["id"], "hits": sum(ok), "n": len(ok), "answers": replies[i]})
            hits += ok
        res[f"bfcl_{cat}"] = float(np.mean(hits)) if hits else 0.0
    res["bfcl_avg"] = float(np.mean([res[f"bfcl_{c}"] for c in BFCL_CATEGORIES]))
    save_generations(args, name, items, dist)
    return res


def trivial_grids(p):
    """The two trivial answers of a puzzle: one constant value per attribute (its first listed value in every
    house: 1/N of the cells by construction) and every attribute's values in listed order (house h the h-th)."""
    houses = range(1, p["houses"] + 1)
    return {"constant": {f"House {h}": {a: v[0] for a, v in p["attributes"].items()} for h in houses},
            "listed order": {f"House {h}": {a: v[h - 1] for a, v in p["attributes"].items()} for h in houses}}


def score_zebra(puzzles, answers, scales):
    """Eq. 15's checker on held-out answers (answers[i]: the replies to puzzle i): per-puzzle items (cell
    accuracy and full-grid rate, each the mean over its replies = avg@k) and the table's numbers, means over
    puzzles: grid accuracy per scale, overall grid and cell accuracy. Returns (res, items)."""
    items = []
    for i, ((scale, p, sol), texts) in enumerate(zip(puzzles, answers)):
        scored = [zebra_reward(t, p, sol) for t in texts]
        items.append({"i": i, "scale": scale, "cells": p["houses"] * len(p["attributes"]),
                      "cell": float(np.mean([x[3] for x in scored])) if scored else 0.0,
                      "grid": float(np.mean([x[2] for x in scored])) if scored else 0.0,
                      "valid": float(np.mean([x[1] for x in scored])) if scored else 0.0, "answers": texts})
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0
    res = {f"zebra_{s}": mean([it["grid"] for it in items if it["scale"] == s]) for s in scales}
    res.update(zebra_grid=mean([it["grid"] for it in items]), zebra_cell=mean([it["cell"] for it in items]))
    return res, items


def zebra_heldout(args):
    """The held-out puzzles ([(scale, puzzle, solution)], fixed --eval-seed, never used in training) and scales."""
    scales = [s for s in args.zebra_eval_scales.split(",") if s]
    return make_zebra_puzzles(args.eval_seed, scales, args.zebra_eval_per_scale), scales


def eval_zebra(sampler, tok, args, dist, name="eval"):
    """Held-out zebra (score_zebra), plus reasoning-gym's zebra puzzles. Puzzles are sharded over ranks and
    their replies gathered; the token budget fits the longest held-out gold grid (the same in every row)."""
    puzzles, scales = zebra_heldout(args)
    reset_prefix_cache(sampler)
    mine = list(range(dist.rank, len(puzzles), dist.world))
    prompts = [chat_ids(tok, solver_messages("zebra", puzzles[i][1])) for i in mine]
    outs = sampler.generate(prompts, args.eval_samples, answer_budget(args, tok, [sol for _, _, sol in puzzles]),
                            args.eval_temperature,
                            json_schema=answer_schemas(args, [puzzles[i][1] for i in mine])) if prompts else []
    replies = dict(gather_objects([(i, [s.text for s in samples]) for i, samples in zip(mine, outs)], dist))
    res, items = score_zebra(puzzles, [replies[i] for i in range(len(puzzles))], scales)
    save_generations(args, name, items, dist)
    if args.rg_eval_n:
        import reasoning_gym
        ds = reasoning_gym.create_dataset("zebra_puzzles", seed=args.eval_seed, size=args.rg_eval_n)
        entries = [ds[i] for i in range(dist.rank, args.rg_eval_n, dist.world)]
        outs = sampler.generate([chat_ids(tok, [{"role": "user", "content": e["question"]}]) for e in entries],
                                args.eval_samples, args.max_new_tokens, args.eval_temperature) if entries else []
        scores = []
        for e, samples in zip(entries, outs):
            for s in samples:
                last = (s.text.strip().splitlines() or [""])[-1]
                words_ = re.findall(r"[A-Za-z]+", last)
                scores.append(float(ds.score_answer(words_[-1].lower() if words_ else "", e)))
        res["rg_zebra"] = float(np.mean(gather_objects(scores, dist)))
    return res


def trivial_baselines(args, dist):
    """Table rows of the trivial answers (trivial_grids) on the held-out zebra set, scored by the same checker
    (score_zebra) and saved like a solver's row; the tool family has none (BFCL has no constant answer)."""
    if args.family != "zebra":
        return []
    puzzles, scales = zebra_heldout(args)
    rows = []
    for kind in ("constant", "listed order"):
        res, items = score_zebra(puzzles, [[json.dumps(trivial_grids(p)[kind])] for _, p, _ in puzzles], scales)
        save_generations(args, "trivial " + kind, items, dist)
        rows.append((kind, res))
    return rows


def evaluate(sampler, tok, args, dist, name="eval"):
    """One table row: the held-out set of the family, generations saved to <run-dir>/eval/<name>.jsonl."""
    fn = eval_tool if args.family == "tool" else eval_zebra
    return fn(sampler, tok, args, dist, name)


def print_table(history, family, baselines=()):
    """The paper's main-table shape: BFCL columns (Table 1) or ZebraLogic scales (Table 2); the trivial answers'
    rows (trivial_baselines) under every table."""
    cols = ([("JS", "bfcl_simple_javascript"), ("Py", "bfcl_simple_python"), ("Java", "bfcl_simple_java"),
             ("Live", "bfcl_live_simple"), ("Avg.", "bfcl_avg")] if family == "tool" else
            [("Small", "zebra_small"), ("Medium", "zebra_medium"), ("Large", "zebra_large"),
             ("X-Large", "zebra_xlarge"), ("Grid", "zebra_grid"), ("Cell", "zebra_cell"), ("RG", "rg_zebra")])
    print("solver".ljust(12) + "".join(c.rjust(9) for c, _ in cols))
    for name, res in list(history) + [(f"[{n}]", r) for n, r in baselines]:
        print(name.ljust(12) + "".join((f"{100 * res[k]:9.1f}" if k in res else "        -") for _, k in cols))
    if baselines:
        print("[trivial answers, same checker: one constant value per attribute; values in listed order]")


ARMS = ("unguided", "skill_only", "uniform_routing", "frozen_skills", "frozen_proposer", "frozen_feedback_solver")


def arm_name(args):
    """The run's arm: "skill-sp" (the full method) or its ablation flags joined by "+"."""
    return "+".join(f for f in ARMS if getattr(args, f)) or "skill-sp"


def read_items(run_dir, row):
    """The per-item lines of a table row (save_generations); [] when that row was not saved."""
    path = os.path.join(run_dir, "eval", re.sub(r"\W+", "_", row) + ".jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def run_results(args, history, baselines, rows):
    """(results, headline) of a finished run (stats.py's results.json convention). Zebra: the last row's per-
    puzzle cell and grid accuracy against the better trivial answer, the base row and the solver warm-up's row
    (paired over the same held-out puzzles, same decoding); tool: each BFCL category, the last row and the warm-up against the
    base row, paired over items, with every row's Wilson interval in results["bfcl"]. Both: the valid-proposal
    rate and the v_solve of valid proposals by stream, over every iteration's records."""
    arm, last = arm_name(args), history[-1][0]
    results = {"family": args.family, "arm": arm, "seed": args.seed, "data_seed": args.data_seed,
               "history": [list(h) for h in history], "trivial": [list(b) for b in baselines], "rows": rows}
    headline = []
    if args.family == "zebra":
        final = read_items(args.run_dir, last)
        results["final_items"] = {m: [it[m] for it in final] for m in ("cell", "grid")}
        for m in ("cell", "grid"):
            trivial = {kind: [it[m] for it in read_items(args.run_dir, "trivial " + kind)] for kind, _ in baselines}
            kind = max(trivial, key=lambda k: np.mean(trivial[k]))  # the better trivial answer on this metric
            headline.append(compare(f"held-out zebra {m} accuracy, {arm} after the last iteration vs the better "
                                          f"trivial answer", arm, f"trivial: {kind}", results["final_items"][m],
                                          trivial[kind]))
            for ref_row in ("base", "solver SFT"):  # the warm-up alone: what self-play added on top of it
                if ref_row != last and ref_row in dict(history):
                    headline.append(compare(f"held-out zebra {m} accuracy, {arm}: last iteration vs {ref_row}",
                                            f"{arm} {last}", ref_row, results["final_items"][m],
                                            [it[m] for it in read_items(args.run_dir, ref_row)]))
    else:
        results["bfcl"] = {}
        for name, _ in history:
            items = read_items(args.run_dir, name)
            results["bfcl"][name] = {}
            for cat in BFCL_CATEGORIES:
                k, n = sum(it["hits"] for it in items if it["category"] == cat), sum(
                    it["n"] for it in items if it["category"] == cat)
                results["bfcl"][name][cat] = {"acc": k / n if n else None, "hits": k, "n": n,
                                              "ci95": wilson_ci(k, n) if n else None}
        base = read_items(args.run_dir, "base")
        for name in [h for h, _ in history[1:] if h in ("solver SFT", last)]:
            items = read_items(args.run_dir, name)
            for cat in BFCL_CATEGORIES:
                pick = lambda its: [it["hits"] / it["n"] for it in its if it["category"] == cat and it["n"]]
                headline.append(compare(f"BFCL {cat}, {arm}: {'warm-up' if name == 'solver SFT' else 'last iteration'}"
                                              f" vs base", f"{arm} {name}", "base", pick(items), pick(base)))
    recs = [json.loads(line) for t in range(args.T)
            for line in (open(os.path.join(args.run_dir, "records", f"iter_{t}.jsonl"))
                         if os.path.exists(os.path.join(args.run_dir, "records", f"iter_{t}.jsonl")) else [])]
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


def print_bfcl_intervals(results):
    """BFCL accuracy per category and row with its binomial (Wilson) 95 % interval: 16 items step by 6.25 points."""
    if results.get("bfcl"):
        print("BFCL per category, % [Wilson 95 % CI] (hits/n)")
    for name, cats in results.get("bfcl", {}).items():
        print(name.ljust(12) + "  ".join(
            f"{c.replace('simple_', '')}: {100 * v['acc']:.1f} [{100 * v['ci95'][0]:.1f}, {100 * v['ci95'][1]:.1f}] "
            f"({v['hits']}/{v['n']})" for c, v in cats.items() if v["n"]))


def aggregate_runs(run_dirs):
    """--aggregate RUN_DIR...: stats.aggregate's pooled headline of the runs (each claim over its seeds), plus
    Skill-SP against every other arm present, paired over held-out puzzles × the seeds both arms ran (zebra)."""
    entries = aggregate_headlines(run_dirs)
    by = {}
    for d in run_dirs:
        with open(os.path.join(d, "results.json")) as f:
            r = json.load(f)
        if "final_items" in r:
            by[(r["arm"], r["seed"])] = r["final_items"]
    for arm in sorted({a for a, _ in by} - {"skill-sp"}):
        seeds = sorted(s for a, s in by if a == arm and ("skill-sp", s) in by)
        for m in ("cell", "grid") if seeds else ():
            entries.append(compare(f"held-out zebra {m} accuracy: skill-sp vs {arm} (paired over puzzles × seeds)",
                                         "skill-sp", arm, sum((by[("skill-sp", s)][m] for s in seeds), []),
                                         sum((by[(arm, s)][m] for s in seeds), []), n_seeds=len(seeds)))
    print(format_headline(entries))
    return entries


def plot_diagnostics(run_dir, rows, recs_by_iter):
    """Figure 5a/5c/6 panels per iteration and the Figure 5b PCA of MiniLM task embeddings."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    its = [r["iteration"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.4))
    for k in ("v_solve_skill", "v_solve_explore"):
        ax[0].plot(its, [r[k] for r in rows], marker="o", label=k)
    ax[0].set_title("mean v_solve of accepted records"), ax[0].legend()
    for k in ("lib_size", "n_induced", "n_refined", "n_pruned"):
        ax[1].plot(its, [r[k] for r in rows], marker="o", label=k)
    ax[1].set_title("library evolution"), ax[1].legend()
    for k in ("active_skills", "n_eff"):
        ax[2].plot(its, [r[k] for r in rows], marker="o", label=k)
    ax[2].set_title("skill utilisation"), ax[2].legend()
    for a in ax:
        a.set_xlabel("iteration"), a.grid(alpha=0.3)
    fig.tight_layout(), fig.savefig(os.path.join(run_dir, "diagnostics.png"), dpi=100), plt.close(fig)
    texts = [(r["stream"], r["x_text"]) for recs in recs_by_iter for r in recs if r["x_text"]]
    if len(texts) < 3:
        return None
    emb = load_embedder().encode([t for _, t in texts])  # (N, 384)
    X = emb - emb.mean(0)                                                                                         # (N, 384)
    Z = X @ np.linalg.svd(X, full_matrices=False)[2][:2].T                                                        # (N, 2)
    fig, a = plt.subplots(figsize=(5, 4))
    for stream, color in (("skill", "tab:blue"), ("explore", "tab:orange")):
        idx = [i for i, (s, _) in enumerate(texts) if s == stream]
        a.scatter(Z[idx, 0], Z[idx, 1], s=12, c=color, label=f"{stream} ({len(idx)})", alpha=0.7)
    a.set_title("PCA of MiniLM task embeddings"), a.legend()
    fig.tight_layout(), fig.savefig(os.path.join(run_dir, "tasks_pca.png"), dpi=100), plt.close(fig)
    spread = {}  # mean distance of a stream's points to their own centroid in the PCA plane
    for stream in ("skill", "explore"):
        P = Z[[i for i, (x, _) in enumerate(texts) if x == stream]]                                              # (n, 2)
        if len(P):
            spread[stream] = round(float(np.linalg.norm(P - P.mean(0), axis=1).mean()), 4)
    return spread


# ----- main -----

# Checkpoints: one plumbing checkpoint <run-dir>/ckpt holds iteration t's proposer and solver (weights, optimizers,
# RNG) and, in extra.pt, the iteration, history, table rows and library folder: the pair commits together, so a
# kill anywhere resumes from the last complete pair. It also records the sizes of these logs, which a resume cuts
# back (a row logged after the commit belongs to an iteration that runs again):
LOGS = ("", "proposer", "solver", "proposer_sft", "solver_sft")


def save_iteration(t, P, pkgs, stats, changes, recs, rows, history, args, dist):
    """Files of iteration t (rank 0): the library S(t+1), its change log, the records and the metrics row
    (rows[-1]); then the checkpoint of both players. A rerun of iteration t (a resume after a crash before the
    commit) replaces the iteration's lines of library_changes.jsonl."""
    run_dir, lib_t = args.run_dir, os.path.join(args.run_dir, "library", f"iter_{t + 1}")
    if dist.is_main:
        save_library(lib_t, pkgs, stats)
        path = os.path.join(run_dir, "library_changes.jsonl")
        old = open(path).readlines() if os.path.exists(path) else []
        with open(path, "w") as f:
            f.writelines(line for line in old if json.loads(line)["iteration"] < t)
            f.writelines(json.dumps(c) + "\n" for c in changes)
        os.makedirs(os.path.join(run_dir, "records"), exist_ok=True)
        with open(os.path.join(run_dir, "records", f"iter_{t}.jsonl"), "w") as f:
            for r in recs:
                f.write(json.dumps({k: r.get(k) for k in ("stream", "skill", "valid", "reject", "why", "v_solve", "R",
                                                          "rho", "x_text", "contract", "proposal")}) + "\n")
    barrier(dist)  # the library folder exists before any rank may need it (resume)
    log_metrics(run_dir, t + 1, rows[-1], dist, keys=("pool_size", "valid_rate_skill", "valid_rate_explore",
                                                      "v_solve_skill", "v_solve_explore", "lib_size", "active_skills",
                                                      "n_eff", "bfcl_avg" if args.family == "tool" else "zebra_grid"))
    save_checkpoint(run_dir, {"proposer": P.proposer, "solver": P.solver}, P.tok, {"proposer": P.opt_p, "solver": P.opt_s},
                    t, {"iteration": t + 1, "history": history, "rows": rows, "library": lib_t}, dist, logs=LOGS)


def main(argv=None):
    args = parse_args(argv)
    if args.aggregate:  # pool finished runs (one per seed and arm) and exit
        return aggregate_runs(args.aggregate)
    dist = setup_distributed()  # python: rank 0 of 1; torchrun: gloo on CPU, NCCL on GPUs
    seed_everything(args.seed + dist.rank)  # rank-specific samples; shared choices use rng seeded without the rank
    say = print if dist.is_main else (lambda *a, **k: None)
    os.makedirs(args.run_dir, exist_ok=True)
    proposer, tok = load_policy(args, dist)  # DDP-wrapped when world > 1: gradients are averaged over ranks
    solver, _ = load_policy(args, dist)
    # π^(0), frozen: KL reference of both policies and the controller π_control
    base, _ = load_model(args.model, dist, args.dtype, trainable=False)
    ref = base if args.beta > 0 else None
    opt_p, opt_s = make_optimizer(proposer, args), make_optimizer(solver, args)
    lib_dir = args.library or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "selfplay", args.family)
    pkgs, stats = load_library(lib_dir, args.family)
    if not pkgs and not args.unguided:
        raise SystemExit(f"no valid skill package in {lib_dir}")
    start, history, rows, extra = 0, [], [], None
    if args.resume:  # the last complete pair, and each log cut back to its commit (LOGS)
        ck = resume_checkpoint(args.run_dir, {"proposer": proposer, "solver": solver}, {"proposer": opt_p, "solver": opt_s},
                               dist, logs=LOGS)
        extra = ck[1] if ck else None
    elif dist.is_main:  # a fresh start: no rows of an earlier run
        for log in (os.path.join(args.run_dir, sub, "metrics.jsonl") for sub in LOGS):
            if os.path.exists(log):
                os.remove(log)
    if extra:
        start, history, rows = extra["iteration"], extra["history"], extra["rows"]
        pkgs, stats = load_library(extra["library"], args.family)
        say(f"resumed {args.run_dir} after iteration {start} (library {extra['library']})")
    p_sampler, s_sampler = make_sampler(args, proposer, tok, dist), make_sampler(args, solver, tok, dist)
    # One decoding regime for every row of the table: the solver's own sampler (schema, temperature, budget),
    # the base row included, taken before any warm-up while the solver is still π^(0).
    if not history:
        t0 = time.time()
        history.append(("base", evaluate(s_sampler, tok, args, dist, "base")))
        say(f"held-out eval of the base model: {time.time() - t0:.0f}s")
    if not extra and args.proposer_sft_steps and pkgs:  # difference 13, in every arm (the ablations differ only in what they name)
        t0, grammar = time.time(), proposal_decoding(args, p_sampler)[1] is not None
        m = prime_proposer(proposer, tok, pkgs, args, dist, grammar)
        opt_p = make_optimizer(proposer, args)  # MasterAdamW's fp32 masters must start from the primed weights
        p_sampler.sync(proposer)
        say(f"proposer SFT warm-up on {len(pkgs)} worked examples: loss {m.get('sft_loss', 0):.3f}, {time.time() - t0:.0f}s")
    if not extra and args.solver_sft_steps:  # difference 14 (every arm, also --unguided)
        t0 = time.time()
        m = prime_solver(solver, tok, args, dist)
        opt_s = make_optimizer(solver, args)  # as for the proposer: masters from the primed weights
        s_sampler.sync(solver)
        say(f"solver SFT warm-up on {args.solver_sft_tasks} scripted {args.family} tasks: loss {m.get('sft_loss', 0):.3f}, "
            f"{time.time() - t0:.0f}s")
        history.append(("solver SFT", evaluate(s_sampler, tok, args, dist, "solver SFT")))  # the warm-up alone
    # --frozen-feedback-solver: the probes use the solver as it enters self-play (after its warm-up), frozen, with
    # the solver's own decoding; it differs from the full method only in that π_solve^(t) stops following training
    probe_sampler = make_sampler(args, frozen_copy(solver), tok, dist) if args.frozen_feedback_solver else s_sampler
    P = Players(proposer, solver, ref, opt_p, opt_s, p_sampler, s_sampler, probe_sampler, HFSampler(base, tok), tok)
    if args.unguided and args.family == "zebra":
        say("unguided: zebra proposals are valid only if the proposer's own clues make the puzzle unique (no runtime "
            "clue completion, which only the skill stream gets), so a valid rate near 0 is by construction")
    baselines = trivial_baselines(args, dist)
    if dist.is_main:
        print_table(history, args.family, baselines)
    for t in range(start, args.T):  # Algorithm 2
        rng = random.Random(f"{args.seed}-{t}")  # shared choices (routing, solver batches): same on every rank
        # 1. proposer: skill + exploration streams, probes, GRPO (Eq. 5), collection pass
        recs, n_unparsed, times = proposer_phase(t, P, pkgs, stats, args, rng, dist)
        # 2. curriculum D(t) (Eq. 6) and solver GRPO (Eq. 7)
        t0 = time.time()
        D, _ = solver_phase(recs, t, P.solver, P.ref, P.opt_s, P.s_sampler, P.tok, args, rng, dist)
        times["time_solve"] = time.time() - t0
        # 3. library evolution (§3.4): refine, prune (Eq. 8), induce (Eq. 9-10)
        t0 = time.time()
        pkgs, stats, changes = evolve_library(t, pkgs, stats, recs, P.controller, P.tok, args, dist)
        times["time_evolve"] = time.time() - t0
        # 4. held-out evaluation of π_solve^(t+1)
        t0 = time.time()
        res = evaluate(s_sampler, tok, args, dist, f"iter {t + 1}")
        history.append((f"iter {t + 1}", res))
        times["time_eval"] = time.time() - t0
        rows.append({**iteration_metrics(recs, D, pkgs, stats, changes, t + 1), "n_proposals_unparsed": n_unparsed,
                     **res, **times})
        save_iteration(t, P, pkgs, stats, changes, recs, rows, history, args, dist)
        if dist.is_main:
            print_table(history, args.family, baselines)
    if dist.is_main:  # results.json: the table, the trivial rows and the headline (stats.py)
        results, headline = run_results(args, history, baselines, rows)
        write_results(args.run_dir, results, headline)
        print_bfcl_intervals(results)
        print(format_headline(headline))
    if not args.no_plots and rows and dist.is_main:
        recs_by_iter = []
        for t in range(args.T):
            path = os.path.join(args.run_dir, "records", f"iter_{t}.jsonl")
            recs_by_iter.append([json.loads(line) for line in open(path)] if os.path.exists(path) else [])
        spread = plot_diagnostics(args.run_dir, rows, recs_by_iter)
        print(f"diagnostics: {args.run_dir}/diagnostics.png, {args.run_dir}/tasks_pca.png; PCA spread by stream {spread}")
        for sub in ("proposer", "solver"):
            if os.path.exists(os.path.join(args.run_dir, sub, "metrics.jsonl")):
                plot_curves(os.path.join(args.run_dir, sub), ("reward", "kl"))
    return {"history": history, "rows": rows}


# ----- task environments (below main, which reads as Algorithm 2): tool-call checker, zebra runtime, BFCL -----

# Tool-call checker: the global schema check of Eq. 4 and the call equality of Eq. 4 and 14.

TOOL_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
              "array": list, "object": dict}


def parse_tool_calls(text):
    """All parseable <tool_call>{"name", "arguments"}</tool_call> blocks in text."""
    calls = []
    for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S):
        try:
            obj = json.loads(body.strip())
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments", {}), dict):
            calls.append({"name": obj["name"], "arguments": obj.get("arguments", {})})
    return calls


def _canon_arg(v):
    """An argument value up to JSON spelling: integral floats as integers (1.0 ≡ 1); booleans stay booleans."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list):
        return [_canon_arg(x) for x in v]
    if isinstance(v, dict):
        return {k: _canon_arg(x) for k, x in v.items()}
    return v


def call_key(call):
    """Canonical string of a call: the one equality used by ExactCall (Eq. 14) and by the probes' majority vote
    (Eq. 4). Argument order is ignored, 1 ≡ 1.0, but True ≢ 1 and "1" ≢ 1 (Python's == would say True == 1.0)."""
    return None if call is None else json.dumps([call["name"], _canon_arg(call["arguments"])], sort_keys=True)


def type_ok(value, typ):
    if typ not in TOOL_TYPES:
        return False
    if typ in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TOOL_TYPES[typ])


def tool_schema_error(task):
    """Global schema compliance of a proposed tool task (first part of Eq. 4)."""
    if not isinstance(task, dict):
        return "task is not a JSON object"
    tools, dialogue, call = task.get("tools"), task.get("dialogue"), task.get("call")
    if not isinstance(tools, list) or not tools:
        return "tools must be a non-empty list"
    by_name = {}
    for t in tools:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not re.fullmatch(r"[A-Za-z_][\w.\-]{0,63}", t["name"]):
            return f"bad tool {str(t)[:80]}"
        params = t.get("parameters", {})
        props = params.get("properties", {}) if isinstance(params, dict) else None
        if not isinstance(props, dict) or not all(isinstance(s, dict) and isinstance(s.get("type"), str)
                                                  and s["type"] in TOOL_TYPES and isinstance(s.get("enum", []), list)
                                                  for s in props.values()):
            return f"tool {t['name']} has bad parameters"
        required = params.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) and r in props for r in required):
            return f"tool {t['name']} requires unknown parameters"
        if t["name"] in by_name:
            return f"tool {t['name']} listed twice"
        by_name[t["name"]] = t
    if not isinstance(dialogue, list) or not dialogue or not all(
            isinstance(d, dict) and d.get("role") in ("user", "assistant", "observation")
            and isinstance(d.get("content"), str) and d["content"].strip() for d in dialogue):
        return "dialogue must be a non-empty list of {role: user|assistant|observation, content}"
    if dialogue[0]["role"] != "user":
        return "dialogue must start with the user"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or call["name"] not in by_name \
            or not isinstance(call.get("arguments"), dict):
        return "call must name a listed tool and give an arguments object"
    params = by_name[call["name"]].get("parameters", {})
    props = params.get("properties", {})
    for arg, value in call["arguments"].items():
        if arg not in props:
            return f"argument {arg!r} is not in the schema"
        if not type_ok(value, props[arg]["type"]):
            return f"argument {arg!r} is not of type {props[arg]['type']}"
        if "enum" in props[arg] and value not in props[arg]["enum"]:
            return f"argument {arg!r} is not one of its enum values"
    missing = [r for r in params.get("required", []) if r not in call["arguments"]]
    return f"missing required arguments {missing}" if missing else None


# Scripted tool tasks of the solver warm-up (--solver-sft-steps, difference 14): a small bank of tools, each
# with a request template that states every argument literally, so the reference call copies the values.
def _tool(name, description, props, required):
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": required}}


_S, _I = {"type": "string"}, {"type": "integer"}
SCRIPTED_TOOLS = [  # (tool, request template, value pools)
    (_tool("get_forecast", "Weather forecast for a city.", {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           ["city"]), "What will the weather be in {city}? Give it in {unit}.",
     {"city": ["Lyon", "Osaka", "Quito", "Perth", "Bergen", "Austin"], "unit": ["celsius", "fahrenheit"]}),
    (_tool("text_friend", "Send a short text to a contact.", {"contact": _S, "text": _S}, ["contact", "text"]),
     "Text {contact} that {text}.", {"contact": ["Ana", "Tomas", "Mei", "Omar", "Lena"],
                                     "text": ["dinner is at eight", "the train is late", "I found the keys"]}),
    (_tool("order_pizza", "Order pizzas for delivery.", {"size": {"type": "string", "enum": ["small", "medium", "large"]},
                                                         "count": _I}, ["size", "count"]),
     "Order {count} {size} pizzas, please.", {"size": ["small", "medium", "large"], "count": [1, 2, 3, 5]}),
    (_tool("play_song", "Play a song by title.", {"title": _S}, ["title"]), "Play the song {title}.",
     {"title": ["Blue Sky", "River Road", "Night Owl", "Paper Moon"]}),
    (_tool("set_alarm", "Set an alarm clock.", {"time": _S}, ["time"]), "Wake me up at {time}.",
     {"time": ["06:30", "07:15", "05:45", "08:00"]}),
    (_tool("book_taxi", "Book a taxi ride.", {"pickup": _S, "dropoff": _S}, ["pickup", "dropoff"]),
     "Get me a taxi from {pickup} to {dropoff}.", {"pickup": ["the hotel", "Pine Street 4", "the museum"],
                                                  "dropoff": ["the airport", "Oak Avenue 9", "the stadium"]}),
    (_tool("lookup_word", "Dictionary definition of a word.", {"word": _S}, ["word"]), "What does the word {word} mean?",
     {"word": ["serendipity", "ephemeral", "laconic", "zenith"]}),
    (_tool("pay_bill", "Pay a bill from the user's account.", {"biller": _S, "amount": _I}, ["biller", "amount"]),
     "Pay {amount} dollars to {biller}.", {"biller": ["City Water", "PowerCo", "NetFast"], "amount": [40, 75, 120, 300]}),
]


def scripted_tool_tasks(rng, n):
    """n tool tasks from SCRIPTED_TOOLS: one requested tool among 2-3 listed, the request naming every argument."""
    tasks = []
    for _ in range(n):
        picked = rng.sample(SCRIPTED_TOOLS, rng.randint(2, 3))
        tool, template, pools = picked[0]
        args = {k: rng.choice(v) for k, v in pools.items()}
        tools = [t for t, _, _ in picked]
        rng.shuffle(tools)
        tasks.append({"tools": tools, "dialogue": [{"role": "user", "content": template.format(**args)}],
                      "call": {"name": tool["name"], "arguments": args}})
    return tasks


# Zebra runtime.

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
                "large": [(4, 5), (5, 3), (5, 4)], "xlarge": [(5, 5), (6, 4)]}


def zebra_scale(houses, n_attrs):
    size = math.factorial(houses) ** n_attrs
    return "small" if size < 1e3 else "medium" if size < 1e6 else "large" if size < 1e10 else "xlarge"


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
        if not isinstance(vals, list) or len(vals) != n or not all(isinstance(v, str) and v.strip() for v in vals):
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
        if arity == 2 and (not isinstance(c.get("b"), str) or c["b"].lower() not in seen or c["b"].lower() == c["a"].lower()):
            return f"clue {c!r} needs a second, different known value"
        if arity == 1 and (not isinstance(c.get("house"), int) or isinstance(c.get("house"), bool) or not 1 <= c["house"] <= n):
            return f"clue {c!r} needs a house in 1..{n}"
    return None


def clean_clues(clues):
    """Schema-valid clues with only the keys their type reads (a stray "b" on a one-value clue, or a "house" on
    a two-value clue, is dropped rather than rejected)."""
    keep = {1: ("type", "a", "house"), 2: ("type", "a", "b")}
    return [{k: c[k] for k in keep[ZEBRA_CLUE_TYPES[c["type"]][0]]} for c in clues]


def _canon_value(p):
    """lower-cased value -> (attribute, canonical spelling)."""
    return {v.lower(): (a, v) for a, vals in p["attributes"].items() for v in vals}


class SearchBudget(Exception):
    pass


def count_solutions(p, limit=2, budget=2_000_000):
    """Backtracking count of solutions of a schema-valid puzzle, stopping at `limit`
    (raises SearchBudget after `budget` placements, so a hostile proposal cannot stall).

    Unary clues shrink each value's house domain first; values are then placed
    most-constrained first and a binary clue is checked as soon as both of its
    values are placed. Returns (count, first solution as {value: house})."""
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

    The blueprint's own clues (if any) are kept; the runtime picks one of their
    solutions, then adds random true clues (preferred relation types 3x as likely)
    until the solution is unique, and finally drops redundant added clues while
    keeping `min_counts`. Returns (puzzle, {value: house}) or (None, reason)."""
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


def make_zebra_puzzles(seed, scales, per_scale):
    """Held-out puzzles by scale from a fixed seed: [(scale, puzzle, solution grid)]."""
    rng, out = random.Random(seed), []
    for scale in scales:
        made = 0
        while made < per_scale:
            houses, m = rng.choice(ZEBRA_SCALES[scale])
            p, pos = compile_puzzle(rng, random_blueprint(rng, houses, m))
            if p is not None:
                out.append((scale, p, solution_grid(p, pos)))
                made += 1
    return out


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


def parse_grid(text, p):
    """Parse a solver answer into {house: {attr: value}} with canonical names.

    Returns (grid, valid_structure). valid_structure needs houses 1..N, every
    attribute in every house, and each attribute a permutation of its values."""
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
        h = int(m.group(1))
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


# BFCL held-out data (bfcl-eval package) and BFCL's own AST checker.
BFCL_CATEGORIES = ["simple_python", "simple_java", "simple_javascript", "live_simple"]


def bfcl_data_dir():
    import importlib.util
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bfcl-eval is not installed: pip install --no-deps bfcl-eval (see requirements-nodeps.txt)")
    return os.path.join(spec.submodule_search_locations[0], "data")


def load_bfcl(category, n=0):
    """[(entry, ground_truth)] for a BFCL category; n > 0 keeps the first n."""
    d = bfcl_data_dir()
    with open(os.path.join(d, f"BFCL_v4_{category}.json")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(d, "possible_answer", f"BFCL_v4_{category}.json")) as f:
        answers = {a["id"]: a["ground_truth"] for a in map(json.loads, filter(str.strip, f))}
    items = [(e, answers[e["id"]]) for e in entries if e["id"] in answers]
    return items[:n] if n else items


def bfcl_language(category):
    return "java" if category.endswith("_java") else "javascript" if category.endswith("javascript") else "python"


def bfcl_messages(entry, category):
    """BFCL prompt in our tool format, with BFCL's language-specific doc hints
    (bfcl_eval/utils.py: _func_doc_language_specific_pre_processing)."""
    lang, tools = bfcl_language(category), copy.deepcopy(entry["function"])
    hint = {"java": " Note that the provided function is in Java 8 SDK syntax.",
            "javascript": " Note that the provided function is in JavaScript syntax."}.get(
        lang, " Note that the provided function is in Python 3 syntax.")
    for t in tools:
        t["description"] = t.get("description", "") + hint
        if lang != "python":
            for name, spec in t["parameters"]["properties"].items():
                what = "Java" if lang == "java" else "JavaScript"
                spec["description"] = spec.get("description", "") + (
                    f" This parameter can be of any type of {what} object in string representation." if spec["type"] == "any"
                    else f" This is {what} {spec['type']} type parameter in string representation.")
                spec["type"] = "string"
    dialogue = [m for m in entry["question"][0] if m["role"] in ("user", "system")]
    system = ("You are a function-calling assistant. Available tools (JSON schemas):\n"
              + "\n".join(json.dumps(t) for t in tools) + "\n" + TOOL_FORMAT)
    sys_extra = "\n".join(m["content"] for m in dialogue if m["role"] == "system")
    user = "\n".join(m["content"] for m in dialogue if m["role"] == "user")
    return [{"role": "system", "content": system + ("\n" + sys_extra if sys_extra else "")},
            {"role": "user", "content": user}]


def bfcl_official_checker():
    """BFCL's own AST checker module (bfcl_eval/eval_checker/ast_eval/ast_checker.py), used as is.

    Shim: that module imports MODEL_CONFIG_MAPPING from bfcl_eval.constants.model_config, which imports every
    vendor SDK (bfcl-eval is installed with --no-deps, so they are absent). The checker reads the mapping only
    in convert_func_name, to rename "." to "_" in function names for models whose API forbids dots; our answers
    keep the names as given. So a stand-in module holding only that mapping is registered before the import
    (unless the real module is already loaded), and the checker's mapping answers "no renaming" for any model."""
    import importlib
    import types
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].MODEL_CONFIG_MAPPING = {}
    checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    checker.MODEL_CONFIG_MAPPING = collections.defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=False))
    return checker


def bfcl_decode(text):
    """The calls of a reply as BFCL's checker takes them ([{name: arguments}]), or None when a <tool_call> block
    does not decode (a BFCL handler's decode failure: the item is wrong, the block is not silently dropped)."""
    blocks = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)
    calls = parse_tool_calls(text)
    return [{c["name"]: c["arguments"]} for c in calls] if calls and len(calls) == len(blocks) else None


def bfcl_check(calls, func, ground_truth, category):
    """BFCL's verdict on decoded calls (bfcl_decode) for a simple-category item: (ok, reason). The official
    checker decides (simple_function_checker: exactly one call, names, required and unexpected parameters,
    Python types with BFCL's variable rule, Java/JS values through its converters, accepted value lists with
    its string standardisation). A model value it cannot handle makes it raise; that is a wrong answer."""
    if not calls:
        return False, "no decodable call"
    A = bfcl_official_checker()
    from bfcl_eval.constants.enums import Language
    lang = {"java": Language.JAVA, "javascript": Language.JAVASCRIPT}.get(bfcl_language(category), Language.PYTHON)
    try:
        out = A.ast_checker([func], calls, ground_truth, lang, category, "nanoskill")
    except Exception as e:  # e.g. a Java/JS string its converter cannot parse
        return False, f"BFCL's checker raised {type(e).__name__}"
    return bool(out["valid"]), "ok" if out["valid"] else str(out.get("error_type"))


if __name__ == "__main__":
    main()
    exit_ranks()  # under torchrun: barrier, destroy, os._exit (plumbing.exit_ranks says why)
