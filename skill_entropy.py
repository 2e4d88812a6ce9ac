"""Skill Entropy, Skill²-Bench and Skill-Entropy RL, end to end at tiny scale.

Paper: "Toward Skill-Native LLMs: Skill Entropy for Benchmarking and Training Long-Horizon Reasoning"
(2026; ../shared/papers/skill_entropy.txt, lost equations restored in NOTES.md §1). Skill entropy SkE(a, b)
(Eq. 3) says how much harder two skills are in a row than apart for a reference model; Eq. (7) factorises
it through domains and Eq. (4) averages it over a task's switches. Skill²-Bench synthesizes long-horizon
tasks at low / medium / high SkE (§3.2) and scores every step (§3.3); Skill-Entropy RL adds to GRPO's
answer reward a reward for predicting the task's SkE rank (Eq. 5, 6), after an SFT warm-up (§4).

    python skill_entropy.py --preset tiny                  # the whole pipeline on a 2-core CPU (README)
    python skill_entropy.py --preset tiny --resume         # a stage's file already in --run-dir is read back
    python skill_entropy.py --preset tiny --resume --lambda-sweep 0.9,0.5   # only the new rows are trained
    make ske-seeds                                         # tiny runs for seeds 0 1 2, then --aggregate
    python skill_entropy.py --preset gpu                   # Table 3's headline pair, one 80 GB GPU (README)
    torchrun --nproc_per_node 8 skill_entropy.py --preset paper   # Qwen3-4B-Instruct-2507, 8 GPUs

The world (skill bank, seeds, prompts, scorers eval_d, Skill²-Bench's step scores) is tasks/skill_bank.py;
docs/skill_entropy.md has the stages and their files, a reading order and all 15 differences from the paper.
Glossary: s skill, d domain, Acc reference accuracy, α smoothing, τ task of L steps, μ(τ) its skills, ρ rank.

Differences from the paper (the eight that matter most; numbered as in docs/skill_entropy.md):
 1. Every frozen model is the embedded SmolLM2-135M (paper: Claude-opus-4.7, Qwen3-8B): most tasks templates.
 2. 36 curated, screened skills (paper: 558) from reasoning-gym, HumanEval and a science set written here.
 4. Acc(s) from two-step chains s → s, asked step by step, valued as the mean of their steps (--pair-acc).
 5. Levels: θ_ℓ < θ_h nearest the 33rd/67th percentiles of the Eq. (7) table, halfway between two values.
 7. r_ent over switches whose two labels are both in-bank (cos ≥ 0.5), none → 0; MiniLM embeds the labels.
 8. SFT traces: the teacher's that parse with r_ans ≥ --sft-min-rans, else gold traces.
11. Table 3 adds the controls "format bonus" and "shuffled SkE"; Skill-Distill*, SkillRL*, STAT* simplified.
15. Not in the paper: the SkE claims against a permutation null (ske_null); each Table 3 row its own seed.
"""

import argparse
import json
import random
import time
from argparse import RawDescriptionHelpFormatter as RawDescription
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grpo import (add_grpo_args, chat_ids, group_advantages, grpo_update, parse_with_preset, refill_groups,
                  sample_group_rollouts, seed_everything, sft_loop)
from plumbing import (HFSampler, barrier, check_response_budget, check_resume, checkpoint_state, preflight,
                      frozen_models, json_to_table, load_checkpoint, load_model, load_policy, log_metrics,
                      make_optimizer, on_ranks, per_rank, plot_curves, plot_fig2, read_back, read_metrics,
                      reduce_metrics, renamed_flags, replica, resume_checkpoint, resume_finished, row_seed,
                      run_main, run_settings, save_checkpoint, setup_distributed, shared_sampler,
                      table_to_json, unwrap, write_json)
from stats import (aggregate_main, compare, format_headline, format_null, format_power, permutation_null,
                   print_table, spearman, write_results)
from tasks.skill_bank import (CHECKS, DATA, LEVELS, add_scorer_args, aggregate_mechanism, aggregate_nulls,
                              ask_stepwise, bank_keys, bench_entries, bench_eval, constant_recs,
                              constant_scores, dependency_real, diverse_subset, gold_trace, label_bank,
                              load_bank, make_generate, make_seed, make_task, marked_answer, match_labels,
                              offshelf_traces, parse_proposal, parse_response, parse_verdict, print_bench,
                              print_switching, proposer_prompt, rule_checks, same_skill_task, score_replies,
                              score_steps, summarize, step_rows, switch_items, switch_report, task_prompt,
                              template_task, verifier_prompt, weakest_first)


# ----- config: flags and presets -----


# --preset gpu's skills: answers with more than two possible values (numbers, lists, names, 4 options, code)
GPU_SKILLS = ("math/arithmetic_operations,math/multiplication,math/linear_equations,math/number_theory,"
              "logic/kinship_reasoning,logic/constraint_grid_solving,planning/maze_navigation,"
              "planning/grid_path_planning,information_extraction/character_counting,"
              "information_extraction/quantity_aggregation,information_extraction/fact_lookup,"
              "information_extraction/list_filtering_by_value,science/classical_mechanics,"
              "science/chemistry_basics,science/genetics,science/earth_and_space,coding/integer_algorithms,"
              "coding/string_manipulation,coding/list_filtering,coding/sequence_scanning,"
              "creative_writing/theme_creation,creative_writing/character_description,"
              "context_retrieval/passage_recall,context_retrieval/cross_step_reference,"
              "instruction_following/format_compliance,instruction_following/keyword_inclusion")

PRESETS = {
    # the teaching run (#48), 2-core CPU: 3 domains × 2 skills, 3 questions per Acc cell, 2 GRPO steps per
    # row, 1 refill draw; 160 new tokens fit a 4-step trace; format bonus: --baselines (docs/skill_entropy.md)
    "tiny": dict(domains="math,logic,information_extraction", skills_per_domain=2, direct_pairs=6,
                 acc_samples=3, n_train=10, n_sft=4, eval_n=6, train_len="3,4", test_len="2,4",
                 llm_proposer_tasks=2, regenerations=1, max_new_tokens=160, acc_max_new_tokens=32,
                 micro_batch=4, vllm_kv_seqs=32, propose_max_new_tokens=128, label_seeds=1, sft_epochs=3,
                 sft_lr=1e-4, steps=2, prompts_per_step=2, G=4, lr=2e-5, n_label=2, sampler="auto",
                 refill_max_draws=1, baselines="sft,grpo,shuffled_ske,ske_rl"),
    # the flag defaults (the paper's values) on GPUs, its main model (§4.2): 4096 new tokens + a long prompt
    "paper": dict(model="Qwen/Qwen3-4B-Instruct-2507", sampler="vllm", max_model_len=8192, null_perms=200),
    # one GPU of ≥ 80 GB, at most 1 h per seed (estimated, not run), Qwen3-1.7B: Skill-Entropy RL vs GRPO
    # paired over 300 test tasks (README "--preset gpu": one seed of its power-sized run)
    "gpu": dict(model="Qwen/Qwen3-1.7B", sampler="auto", max_model_len=4096, max_new_tokens=1024,
                acc_max_new_tokens=256, propose_max_new_tokens=1024, skills=GPU_SKILLS, direct_pairs=100,
                n_train=1500, n_sft=500, test_len="2,6", llm_proposer_tasks=300, prompts_per_step=32,
                steps=30, baselines="grpo,ske_rl", label_seeds=4, n_label=200, grad_checkpointing=True),
}
RENAMED = {"--rl-steps": "--steps", "--n-test": "--eval-n"}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=RawDescription)
    add_grpo_args(p)
    # Table 12: KL coefficient 1e-3 and DAPO dynamic sampling (its refill: 3 draws at most, our cap); 4096 new
    # tokens per rollout (our cap)
    p.set_defaults(beta=1e-3, dynamic_sampling=True, refill_max_draws=3, max_new_tokens=4096)
    g = p.add_argument_group("skill bank (§3.2 stage 1)")
    g.add_argument("--bank", default=str(DATA / "bank.json"), help="skill bank JSON (curated default)")
    g.add_argument("--domains", default="", help="comma-separated subset of the bank's domains (default all)")
    g.add_argument("--skills", default="", help="domain/skill keys to keep, comma-separated (default all)")
    g.add_argument("--skills-per-domain", type=int, default=0,
                   help="keep the first k skills of each domain (0 = all; paper: 558 skills)")
    g.add_argument("--label-seeds", type=int, default=20, help="seeds per skill the LLM labels (§3.2 (1))")
    g.add_argument("--cluster-threshold", type=float, default=0.6, help="cosine that merges label clusters")
    g = p.add_argument_group("skill entropy (§3.1, B.3–B.5)")
    g.add_argument("--ref-model", default=None,
                   help="reference model for Acc (default: --model; paper: Claude-opus-4.7)")
    g.add_argument("--frozen-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="dtype of the frozen reference/proposer/judge/teacher models; auto = float32 under "
                        "--precision fp32 (explicit or auto), else bfloat16")
    g.add_argument("--alpha", type=float, default=0.1, help="α, Laplace smoothing in Eq. (3) (paper: 0.1)")
    g.add_argument("--acc-samples", type=int, default=8, help="Monte-Carlo two-step questions per Acc cell")
    g.add_argument("--acc-max-new-tokens", type=int, default=1024, help="generation cap for Acc estimates")
    g.add_argument("--pair-acc", default="both", choices=["both", "second"],
                   help="Acc(a,b): mean of both steps (NOTES proposal) or step b only")
    g.add_argument("--direct-pairs", type=int, default=200, help="pairs by Eq. (3) that check Eq. (7)")
    g.add_argument("--null-perms", type=int, default=1000, help="permutations per SkE null (ske_null)")
    g.add_argument("--level-quantiles", default="0.33,0.67", help="θ_ℓ, θ_h as quantiles of pairwise SkE")
    g = p.add_argument_group("task synthesis (§3.2 stage 3, B.6–B.9)")
    g.add_argument("--n-train", type=int, default=9000, help="training tasks, SFT ones included (paper: 9K)")
    g.add_argument("--n-sft", type=int, default=3000, help="of --n-train, the SFT warm-up tasks (paper: 3K)")
    g.add_argument("--eval-n", type=int, default=300, help="held-out Skill²-Bench tasks (paper: 300)")
    g.add_argument("--train-len", default="3,5", help="L range for training tasks (paper: 3,5)")
    g.add_argument("--test-len", default="2,10", help="L range for test tasks (paper: 2,10)")
    g.add_argument("--max-reject", type=int, default=2000, help="rejection-sampling draws per task")
    g.add_argument("--proposer", default=None, help="proposer LLM (default: --ref-model, else --model)")
    g.add_argument("--llm-proposer-tasks", type=int, default=-1, help="tasks that try the LLM (-1: all)")
    g.add_argument("--regenerations", type=int, default=3, help="LLM proposer attempts (paper: 3)")
    g.add_argument("--propose-max-new-tokens", type=int, default=2048, help="cap for proposer and verifier")
    g.add_argument("--verifier", default="rules+llm", choices=["rules+llm", "rules", "llm"], help="B.9's")
    g = p.add_argument_group("scorers eval_d (§2, B.3)")
    g.add_argument("--judge", default=None,
                   help="LLM judge for open-ended steps (default: --ref-model, else --model)")
    add_scorer_args(g)
    g = p.add_argument_group("Skill-Entropy RL (§4, D.2–D.7)")
    g.add_argument("--lambda-ans", type=float, default=0.7, help="λ_ans in Eq. (5) (paper: 0.7)")
    g.add_argument("--lambda-ent", type=float, default=0.3, help="λ_ent in Eq. (5) (paper: 0.3)")
    g.add_argument("--match-threshold", type=float, default=0.5,
                   help="cosine below which an emitted skill is out-of-bank (D.4) (paper: 0.5)")
    g.add_argument("--teacher", default=None,
                   help="SFT teacher (default: --ref-model, else --model; paper: Qwen3-8B)")
    g.add_argument("--sft-epochs", type=int, default=4, help="SFT warm-up epochs (paper: 4)")
    g.add_argument("--sft-lr", type=float, default=1e-5, help="SFT learning rate (paper: 1e-5)")
    g.add_argument("--sft-min-rans", type=float, default=1.0, help="teacher trace kept for SFT if r_ans ≥ it")
    g.add_argument("--sft-gold-fallback", action=argparse.BooleanOptionalAction, default=True,
                   help="a gold trace when the teacher's fails")
    g.add_argument("--steps", type=int, default=200, help="GRPO steps per Table 3 row (paper: not stated)")
    g.add_argument("--prompts-per-step", type=int, default=256, help="tasks per GRPO step (paper: 256)")
    g.add_argument("--baselines", default="base,sft,grpo,ske_rl", help="Table 3 rows to run")
    g.add_argument("--lambda-sweep", default="", help="λ_ans values for the D.7 sweep, e.g. 0.9,0.7,0.5,0.3")
    g.add_argument("--n-label", type=int, default=6000, help="off-the-shelf problems (§4.4; paper: 6K)")
    renamed_flags(p, RENAMED)
    return p

# ----- method: skill entropy, Eq. (3), Eq. (7), Eq. (4) and the levels -----


def ske_pair(acc_a, acc_b, acc_ab, alpha):
    # Eq. (3): SkE(a, b) = (½·Acc(a) + ½·Acc(b) + α) / (Acc(a, b) + α)
    return (0.5 * acc_a + 0.5 * acc_b + alpha) / (acc_ab + alpha)


def ske_factorised(a, b, acc, alpha):
    """Skill→domain product (B.4). acc holds 'skill' {key: Acc(s)}, 'domain' {d: Acc(d)},
    's2d' {(key, d): Acc(s, d)}, 'd2s' {(d, key): Acc(d, s)}."""
    da, db = a[0], b[0]
    to_dom = ske_pair(acc["skill"][a], acc["domain"][db], acc["s2d"][(a, db)], alpha)   # SkE(a → d_b)
    from_dom = ske_pair(acc["domain"][da], acc["skill"][b], acc["d2s"][(da, b)], alpha)  # SkE(d_a → b)
    # Eq. (7): SkE(a, b) ≈ SkE(a → d_b) · SkE(d_a → b)
    return to_dom * from_dom


def task_ske(seq, pair):
    """pair(a, b) -> pairwise SkE; seq = μ(τ) = (s_1, …, s_L), L ≥ 2."""
    L = len(seq)
    # Eq. (4): SkE(τ) = 1/(L−1) · Σ_{i=1}^{L−1} SkE(s_i, s_{i+1})
    return sum(pair(seq[i], seq[i + 1]) for i in range(L - 1)) / (L - 1)


def level_of(x, thetas):
    """low / medium / high; None for a NaN SkE (a switch whose Acc cell had no chains)."""
    lo, hi = thetas
    if x is None or x != x:
        return None
    return "low" if x < lo else ("high" if x > hi else "medium")


def level_thresholds(values, quantiles):
    """θ_ℓ < θ_h nearest the quantiles, each halfway between two distinct values (docs/skill_entropy.md)."""
    v = np.sort(np.asarray(values, float))
    u = np.unique(v)
    if len(u) < 2:
        return [float(u[0]), float(u[0])] if len(u) else [1.0, 1.0]
    cuts = (u[:-1] + u[1:]) / 2                  # (k-1,) candidate thresholds
    below = np.searchsorted(v, cuts) / len(v)    # (k-1,) fraction of values under each cut
    if len(cuts) == 1:
        return [float(cuts[0]), float(cuts[0])]
    i = int(np.argmin(np.abs(below[:-1] - quantiles[0])))
    j = i + 1 + int(np.argmin(np.abs(below[i + 1:] - quantiles[1])))
    return [float(cuts[i]), float(cuts[j])]

# ----- method: r_ent (Eq. 6), r_ans (Eq. D.3) and r (Eq. 5) -----


def cdf_rank(x, train_values):
    """Empirical CDF of training-set SkE*: F(x) = #{t : SkE*(t) ≤ x} / N."""
    v = np.asarray(train_values, dtype=float)
    v = np.sort(v[np.isfinite(v)])  # tasks with an empty Acc cell have no SkE*
    return float(np.searchsorted(v, x, side="right")) / len(v) if len(v) else 0.0


def r_ent_reward(pred_keys, gold_keys, pair, train_values):
    """pred_keys: the matched key per step (None: out-of-bank, D.4); ŜkE over in-bank switches."""
    sw = [pair(a, b) for a, b in zip(pred_keys[:-1], pred_keys[1:]) if a is not None and b is not None]
    sw = [x for x in sw if x == x]  # a NaN switch (empty Acc cell) is skipped like an out-of-bank one
    ske_star = task_ske(gold_keys, pair)
    if not sw or ske_star != ske_star:
        return 0.0
    ske_hat = sum(sw) / len(sw)
    rho_hat, rho_star = cdf_rank(ske_hat, train_values), cdf_rank(ske_star, train_values)
    # Eq. (6): r_ent = 1 − |ρ̂ − ρ*|
    return 1.0 - abs(rho_hat - rho_star)


def r_ans_reward(step_scores):
    # Eq. (D.3): r_ans = 1/L · Σ_i eval_{d_i}(â_i, a_i)
    return sum(step_scores) / len(step_scores)


def total_reward(r_ans, r_ent, lambda_ans, lambda_ent):
    # Eq. (5): r = λ_ans·r_ans + λ_ent·r_ent
    return lambda_ans * r_ans + lambda_ent * r_ent


# ----- method: Acc under the reference model and the SkE table (§3.1, B.3–B.5) -----


def acc_jobs(bank, acc_samples, direct_pairs, rng):
    """The two-step chains of B.3–B.4 as (kind, first, second): 'single' s → s for Acc(s); 'chain' a → the
    skills of d in turn for Acc(a, d) and Acc(d_a, b) of Eq. (7); 'pair' a → b for --direct-pairs pairs."""
    keys = bank_keys(bank)
    jobs = []
    for ia, a in enumerate(keys):
        jobs += [("single", a, a)] * acc_samples
        for d in bank:
            targets = [k for k in keys if k[0] == d and k != a] or [a]
            # each source starts at its own offset, so Acc(d_a, b) cells get chains even when
            # acc_samples < |skills of d|; a cell left empty is NaN (cells_to_acc), never 0
            jobs += [("chain", a, targets[(ia + i) % len(targets)]) for i in range(acc_samples)]
    pairs = [(a, b) for a in keys for b in keys if a[0] != b[0]]
    for a, b in rng.sample(pairs, min(direct_pairs, len(pairs))):
        jobs += [("pair", a, b)] * acc_samples
    return jobs


def pool_cells(jobs, step_scores, pair_acc):
    """Per-chain values (--pair-acc: the mean of both steps, or step 2) pooled into the Acc cells."""
    cell = defaultdict(list)
    for (kind, a, b), (s1, s2) in zip(jobs, step_scores):
        v = (s1 + s2) / 2 if pair_acc == "both" else s2
        if kind == "single":
            cell[("skill", a)].append(v)
        elif kind == "chain":
            cell[("s2d", a, b[0])].append(v)
            cell[("d2s", a[0], b)].append(v)
        else:
            cell[("pair", a, b)].append(v)
    return cell


def cells_to_acc(bank, jobs, step_scores, pair_acc):
    """Acc(s), Acc(d), Acc(s, d), Acc(d, s) and direct Acc(a, b); a cell without chains is NaN, never 0."""
    keys, doms = bank_keys(bank), list(bank)
    cell = pool_cells(jobs, step_scores, pair_acc)
    mean = lambda xs: float(np.mean(xs)) if len(xs) else float("nan")
    fin = lambda xs: [x for x in xs if x == x]
    acc = {"skill": {k: mean(cell[("skill", k)]) for k in keys}}
    acc["domain"] = {d: mean(fin([acc["skill"][k] for k in keys if k[0] == d])) for d in doms}
    acc["s2d"] = {(a, d): mean(cell[("s2d", a, d)]) for a in keys for d in doms}
    acc["d2s"] = {(d, b): mean(cell[("d2s", d, b)]) for d in doms for b in keys}
    acc["pair"] = {(k[1], k[2]): mean(v) for k, v in cell.items() if k[0] == "pair"}
    return acc


def empty_cells(acc):
    """Names of the Acc cells that got no chains (NaN)."""
    ks = lambda x: x if isinstance(x, str) else f"{x[0]}/{x[1]}"
    out = [f"skill:{ks(k)}" for k, v in acc["skill"].items() if v != v]
    out += [f"domain:{k}" for k, v in acc["domain"].items() if v != v]
    return out + [f"{c}:{ks(x)}|{ks(y)}" for c in ("s2d", "d2s") for (x, y), v in acc[c].items() if v != v]


def estimate_acc(bank, gen, judge, args):
    """B.3: every Acc cell under the reference model at temperature 0, each chain asked step by step."""
    rng = random.Random(args.seed)
    jobs = acc_jobs(bank, args.acc_samples, args.direct_pairs, rng)
    first, second = defaultdict(int), defaultdict(int)
    chains, q2 = [], []
    for _, a, b in jobs:
        first[a] += 1
        q2.append(second[b] % args.acc_samples)  # the second-step question's index in b's pool
        second[b] += 1
        chains.append([make_seed(bank, *a, args.acc_samples + first[a], seed=args.seed, split="train"),
                       make_seed(bank, *b, q2[-1], seed=args.seed, split="train")])
    t0 = time.time()
    replies = ask_stepwise(gen, chains, args.acc_max_new_tokens)
    flat = score_replies([s for c in chains for s in c], [r for rr in replies for r in rr], args, judge)
    scores = [flat[2 * i:2 * i + 2] for i in range(len(chains))]
    acc = cells_to_acc(bank, jobs, scores, args.pair_acc)
    acc["empty_cells"] = empty_cells(acc)
    acc["n_generations"], acc["seconds"] = 2 * len(chains), time.time() - t0
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")
    acc["mean_step_score"] = mean([x for sc in scores for x in sc])
    verifiable = [x for c, sc in zip(chains, scores) for st, x in zip(c, sc) if st["scorer"] != "judge"]
    acc["mean_step_score_verifiable"] = mean(verifiable)  # the judge's scores kept apart
    acc["chains"] = dict(jobs=[[k, list(a), list(b)] for k, a, b in jobs], q2=q2, scores=scores,
                         valid=[[float(marked_answer(r, st["scorer"]) != "") for st, r in zip(c, rr)]
                                for c, rr in zip(chains, replies)],  # a reply marks an answer (format)
                         constant=constant_scores([c[1] for c in chains], args)[0])
    acc["examples"] = [dict(skills=[list(a), list(b)], replies=r, scores=sc)
                       for (_, a, b), r, sc in list(zip(jobs, replies, scores))[:5]]  # for inspection
    return acc


def build_ske_table(bank, acc, args):
    """Eq. (7) for every ordered pair of skills, Eq. (3) on the direct pairs, levels."""
    keys = bank_keys(bank)
    pw = {(a, b): ske_factorised(a, b, acc, args.alpha) for a in keys for b in keys if a != b}
    direct = {(a, b): ske_pair(acc["skill"][a], acc["skill"][b], acc["pair"][(a, b)], args.alpha)
              for (a, b) in acc["pair"]}
    both = [p for p in direct if direct[p] == direct[p] and pw[p] == pw[p]]  # NaN: a cell without chains
    rho = spearman([direct[p] for p in both], [pw[p] for p in both]) if len(both) > 2 else float("nan")
    cross = [v for (a, b), v in pw.items() if a[0] != b[0] and v == v]
    thetas = level_thresholds(cross, [float(q) for q in args.level_quantiles.split(",")])
    return dict(pairwise=pw, direct=direct, spearman_direct_vs_factorised=rho, thetas=thetas)

# ----- method: task synthesis (§3.2 stage 3, B.6–B.9) -----


def sample_skill_sequence(keys, L, level, pair, thetas, rng, max_tries):
    """B.6 rejection sampling: L skills, no two neighbours in one domain, at the target level."""
    for _ in range(max_tries):
        seq = [rng.choice(keys)]
        while len(seq) < L:
            seq.append(rng.choice([k for k in keys if k[0] != seq[-1][0]]))
        if level_of(task_ske(seq, pair), thetas) == level:
            return seq
    return None


def synthesize(bank, table, gen, args, split):
    """One split's tasks, balanced over the levels: LLM proposer + verifier, then the template proposer."""
    train = split == "train"
    n = args.n_train if train else args.eval_n
    kinds = ("verifiable",) if train else ("verifiable", "open_ended")
    lo, hi = (int(x) for x in (args.train_len if train else args.test_len).split(","))
    rng = random.Random(args.seed * 31 + (0 if train else 1000))
    keys = [k for k in bank_keys(bank) if bank[k[0]]["kind"] in kinds]
    pair = lambda a, b: table["pairwise"][(a, b)]
    counter = defaultdict(int)
    seqs = []
    for i in range(n):
        target = LEVELS[i % 3]
        seq = None
        for _ in range(5):  # a level can be unreachable at some L: redraw L
            L = rng.randint(lo, hi)
            seq = sample_skill_sequence(keys, L, target, pair, table["thetas"], rng, args.max_reject)
            if seq:
                break
        if seq is None:  # keep the last draw at its own level, recorded as such
            seq = [rng.choice(keys)]
            while len(seq) < L:
                seq.append(rng.choice([k for k in keys if k[0] != seq[-1][0]]))
        seqs.append((target, seq))

    def draw(seq):  # the next unused seeds of the split's own pool (seed_pool keeps the splits apart)
        out = []
        for k in seq:
            counter[k] += 1
            out.append(make_seed(bank, k[0], k[1], counter[k], seed=args.seed, split=split))
        return out
    seeds_all = [draw(seq) for _, seq in seqs]
    results = [None] * n
    budget = n if args.llm_proposer_tasks < 0 else min(n, args.llm_proposer_tasks)
    pending = list(range(budget))
    attempts = defaultdict(int)
    for attempt in range(args.regenerations if gen is not None else 0):
        if not pending:
            break
        prompts = [proposer_prompt(seeds_all[i]) for i in pending]
        outs = gen(prompts, args.propose_max_new_tokens, 0.0 if attempt == 0 else 0.7)
        cand = []
        for i, o in zip(pending, outs):
            attempts[i] += 1
            p = parse_proposal(o, seeds_all[i])
            if p is None:
                continue
            rules = rule_checks(p[0], p[1], seeds_all[i])
            if args.verifier == "llm" or all(rules.values()):
                cand.append((i, p, rules))
        verdicts = [dict.fromkeys(CHECKS + ["accept"], True)] * len(cand)
        if args.verifier != "rules" and cand:
            vp = [verifier_prompt(p[0], p[1], seeds_all[i]) for i, p, _ in cand]
            # room for 4 reasons + verdict
            verdicts = [parse_verdict(v) for v in gen(vp, args.propose_max_new_tokens)]
        for (i, p, rules), v in zip(cand, verdicts):
            if v["accept"] and (args.verifier == "llm" or all(rules.values())):
                results[i] = dict(make_task(seeds_all[i], p[0], p[1], p[2]), proposer="llm",
                                  verifier=dict(rules=rules, llm=v, attempts=attempts[i]))
        pending = [i for i in pending if results[i] is None]
    tasks = []
    for i, ((target, seq), seeds) in enumerate(zip(seqs, seeds_all)):
        t = results[i]
        # the template fallback, with fresh seeds until it passes
        for _ in range(args.regenerations + 1 if t is None else 0):
            sc, qs = template_task(seeds)
            rules = rule_checks(sc, qs, seeds)
            if all(rules.values()):
                t = dict(make_task(seeds, sc, qs), proposer="template",
                         verifier=dict(rules=rules, llm=None, attempts=attempts[i]))
                break
            seeds = draw(seq)
        if t is None:  # the verifier filters it out (B.9): the split is one task shorter
            continue
        ske = task_ske(seq, pair)
        t.update(id=f"{split}-{i}", split=split, target_level=target, ske=ske,
                 level=level_of(ske, table["thetas"]), skills=[list(k) for k in seq],
                 dependency_real=dependency_real([st["question"] for st in t["steps"]], seeds))
        tasks.append(t)
    return tasks

# ----- method: Skill-Entropy RL and its Table 3 rows (§4, D.2–D.7) -----

# Table 3 rows: init weights, (λ_ans, λ_ent) of Eq. (5), r_ent, SkE table, task stream (docs/skill_entropy.md)
ROWS = {
    "base": dict(init=None),
    "sft": dict(init="sft"),
    "skill_distill": dict(init="sft_diverse"),
    "grpo": dict(init="sft", lam=(1.0, 0.0), r_ent="ske"),
    "format_only": dict(init="sft", lam=None, r_ent="format"),
    "shuffled_ske": dict(init="sft", lam=None, r_ent="ske", table="shuffled"),
    "skillrl": dict(init="sft", lam=None, r_ent="skill_match"),
    "stat": dict(init="sft", lam=(1.0, 0.0), r_ent="ske", tasks="weakest"),
    "ske_rl": dict(init="sft", lam=None, r_ent="ske"),
}
ROW_NAMES = {"base": "Base", "sft": "SFT", "skill_distill": "Skill-Distill*", "grpo": "GRPO (r_ans)",
             "format_only": "format bonus", "shuffled_ske": "shuffled SkE", "skillrl": "SkillRL*",
             "stat": "STAT*", "ske_rl": "Skill-Entropy RL"}


def row_spec(name, args):
    """ROWS[name] with λ filled in; 'ske_rl_lam<x>' is the D.7 sweep point (x, 1 − x)."""
    if name.startswith("ske_rl_lam"):
        x = float(name[len("ske_rl_lam"):])
        return dict(init="sft", lam=(x, 1.0 - x), r_ent="ske", table="real", tasks="in_order")
    if name not in ROWS:
        raise SystemExit(f"--baselines: unknown row {name!r}; choose from {sorted(ROWS)} or ske_rl_lam<x>")
    spec = dict(dict(table="real", tasks="in_order"), **ROWS[name])
    if "lam" in spec and spec["lam"] is None:
        spec["lam"] = (args.lambda_ans, args.lambda_ent)
    return spec


def shuffled_table(table, seed):
    """Control: the same SkE values, permuted over the ordered skill pairs."""
    pairs = sorted(table["pairwise"])
    vals = [table["pairwise"][p] for p in pairs]
    random.Random(seed).shuffle(vals)
    return dict(table, pairwise=dict(zip(pairs, vals)))


def make_reward_fn(bank, table, train_ske, fz, args, lam, r_ent_kind="ske"):
    """§4.1's reward per rollout: strict D.2 parse → r_ans (Eq. D.3), r_ent → r (Eq. 5); lam = (λ_ans,
    λ_ent); r_ent_kind 'ske' (Eq. 6), or the controls 'format' and 'skill_match' (docs/skill_entropy.md)."""
    keys = bank_keys(bank)
    pair = lambda a, b: table["pairwise"][(a, b)]
    lambda_ans, lambda_ent = lam

    def reward(texts, tasks):
        out = []
        parsed = [parse_response(t, len(task["steps"])) for t, task in zip(texts, tasks)]
        steps, preds, where = [], [], []
        for i, (p, task) in enumerate(zip(parsed, tasks)):
            if p is not None:
                steps += task["steps"]
                preds += p[1]
                where.append((i, len(task["steps"])))
        flat = score_steps(steps, preds, args, fz.judge)
        step_scores, pos = {}, 0
        for i, L in where:
            step_scores[i], pos = flat[pos:pos + L], pos + L
        for i, (p, task) in enumerate(zip(parsed, tasks)):
            if p is None:  # malformed (D.2): both rewards 0
                out.append(dict(reward=0.0, r_ans=0.0, r_ent=0.0, format_ok=0.0, matched=0.0))
                continue
            ra = r_ans_reward(step_scores[i])
            matched, _ = match_labels(p[0], fz.embed, keys, fz.key_emb, args.match_threshold)
            gold = [tuple(k) for k in task["skills"]]
            if r_ent_kind == "format":
                re_ = float(any(a is not None and b is not None for a, b in zip(matched[:-1], matched[1:])))
            elif r_ent_kind == "skill_match":
                re_ = float(np.mean([m == g for m, g in zip(matched, gold)]))
            else:
                re_ = r_ent_reward(matched, gold, pair, train_ske)  # logged in every row; weighted by λ_ent
            out.append(dict(reward=total_reward(ra, re_, lambda_ans, lambda_ent), r_ans=ra, r_ent=re_,
                            format_ok=1.0, matched=float(np.mean([m is not None for m in matched]))))
        return out
    return reward


def lambda_ent_effect(rollouts, args, lambda_ans):
    """(changed, kept): the groups GRPO keeps whose advantage the λ_ent term changed."""
    groups = defaultdict(list)
    for r in rollouts:
        groups[r.group].append(r)
    kept = changed = 0
    for rs in groups.values():
        rw = [r.reward for r in rs]
        if len(rs) < 2 or (args.dynamic_sampling and max(rw) - min(rw) <= 1e-8):
            continue
        kept += 1
        r0 = [[lambda_ans * r.info["r_ans"] for r in rs]]
        sr, eps = args.scale_rewards, args.adv_eps
        a1 = group_advantages(torch.tensor([rw], dtype=torch.float64), sr, eps)  # (1, G)
        a0 = group_advantages(torch.tensor(r0, dtype=torch.float64), sr, eps)    # (1, G)
        changed += int((a1 - a0).abs().max().item() > 1e-6)
    return changed, kept


def run_sft(args, dist, tasks, teacher_gen, judge, doms, out_dir, reuse):
    """SFT warm-up (§4.2) on the teacher's correct traces, else gold ones; `reuse`: load a finished one."""
    policy, tok = load_policy(args, dist)
    if reuse and checkpoint_state(out_dir, True) == "done":  # by an earlier run (--resume) or this one
        (resume_finished(out_dir, policy, dist) if args.resume else
         load_checkpoint(out_dir, policy, None, dist))
        return policy, tok
    (Path(out_dir) / "metrics.jsonl").unlink(missing_ok=True)
    prompts = [task_prompt(t, doms) for t in tasks]
    texts = on_ranks(lambda share: teacher_gen(share, args.max_new_tokens), prompts, dist)  # each its share
    examples, n_teacher = [], 0
    for t, pr, txt in zip(tasks, prompts, texts):
        p = parse_response(txt, len(t["steps"]))
        ok = p is not None and r_ans_reward(score_steps(t["steps"], p[1], args, judge)) >= args.sft_min_rans
        if ok:
            target, n_teacher = txt, n_teacher + 1
        elif args.sft_gold_fallback:
            target = gold_trace(t)
        else:
            continue
        target_ids = tok.encode(target, add_special_tokens=False) + [tok.eos_token_id]
        examples.append((chat_ids(tok, pr), target_ids))
    m = sft_loop(policy, examples, args, dist, args.sft_lr, args.prompts_per_step, epochs=args.sft_epochs,
                 seed=args.seed, log_dir=out_dir)
    done = dict(done=True, n_examples=len(examples), settings=run_settings(args))
    save_checkpoint(out_dir, policy, tok, None, m["sft_steps"], done, dist)
    if dist.is_main:
        print(f"[train] SFT → {out_dir}: {len(examples)} traces, {n_teacher} teacher's")
    return policy, tok


@dataclass
class Row:
    """One Table 3 row's GRPO run: its task stream, SFT folder, own folder, spec, seed and λ_ans."""
    tasks: list
    init_dir: Path
    out_dir: Path
    spec: dict
    seed: int
    lambda_ans: float


def run_grpo(args, dist, row, reward_fn, doms, samplers):
    """GRPO from the SFT weights (also π_ref when β > 0) on the row's task stream and reward."""
    tasks, init_dir, out_dir = row.tasks, row.init_dir, row.out_dir
    policy, tok = load_policy(args, dist)
    load_checkpoint(init_dir, policy, None, dist)  # restores the SFT run's RNG too: reseed below
    state = checkpoint_state(out_dir, args.resume)
    if state == "done":
        resume_finished(out_dir, policy, dist)
        return policy, tok
    ref, record = None, {"spec": row.spec, "settings": run_settings(args)}  # in every checkpoint
    if args.beta > 0:
        ref = load_model(args.model, dist, args.dtype, trainable=False)[0]
        load_checkpoint(init_dir, ref, None, dist)
    # the row's own stream (HF generate and vLLM draw from torch's global RNG), after the loads restored SFT's
    seed_everything(row.seed + dist.rank)
    opt = make_optimizer(policy, args)
    start = 0
    if state == "resume":
        start = resume_checkpoint(out_dir, policy, opt, dist)[0] + 1  # and metrics.jsonl cut back to it
    elif dist.is_main:  # a fresh run: no rows of an older run
        (Path(out_dir) / "metrics.jsonl").unlink(missing_ok=True)
    sampler, n = shared_sampler(samplers, args, policy, tok, dist), args.prompts_per_step

    def draw(batch, first):  # G rollouts of each task (groups numbered from `first`), rewarded by Eq. (5)
        prompts = [chat_ids(tok, task_prompt(t, doms)) for t in batch]
        rs = sample_group_rollouts(sampler, prompts, args.G, args, first_group=first)
        for r, p in zip(rs, reward_fn([r.text for r in rs], [batch[r.group - first] for r in rs])):
            r.reward, r.info = p["reward"], p
        return rs
    for step in range(start, args.steps):
        t0 = time.time()
        # the step's n tasks of the stream, dealt over the ranks (main refuses n < world)
        batch = [tasks[(step * n + j) % len(tasks)] for j in range(n)][dist.rank::dist.world]
        # DAPO's refill (--refill-max-draws): tasks of the stream at random (the same on a resume)
        rng = random.Random(f"{row.seed}-{step}-{dist.rank}")
        rollouts, refills = refill_groups(draw(batch, 0), lambda k, g: draw(rng.choices(tasks, k=k), g), n,
                                          args.refill_max_draws, dist)
        parts = [r.info for r in rollouts]
        t_gen = time.time() - t0
        n_changed, n_kept = lambda_ent_effect(rollouts, args, row.lambda_ans)
        m = grpo_update(policy, ref, opt, rollouts, args, dist)
        m.update(reduce_metrics(dict(n_groups_kept=n_kept, n_groups_lam_ent_changed=n_changed), dist))
        sampler.sync(policy)
        means = {k: float(np.mean([p[k] for p in parts])) for k in ("r_ans", "r_ent", "format_ok", "matched")}
        m.update(reduce_metrics(means, dist))
        m.update(time_gen=t_gen, time_step=time.time() - t0, refills=refills)
        log_metrics(out_dir, step, m, dist, keys=("reward", "r_ans", "r_ent", "format_ok", "matched",
                                                  "n_groups_kept", "n_groups_lam_ent_changed", "skipped",
                                                  "refills", "kl", "loss", "grad_norm", "completion_len",
                                                  "time_step"))
        if (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            save_checkpoint(out_dir, policy, tok, opt, step, {"done": False, **record}, dist)
    save_checkpoint(out_dir, policy, tok, None, args.steps - 1, {"done": True, **record}, dist)
    if dist.is_main and (Path(out_dir) / "metrics.jsonl").exists():
        plot_curves(out_dir, ("reward", "r_ans", "r_ent", "format_ok"))
    del ref, opt
    return policy, tok

# ----- evaluation: Skill²-Bench (§3.3), Table 2 and Table 3 -----


def lambda_ent_summary(out_dir):
    """Kept groups over the run, those in which the λ_ent term changed an advantage and their share, r_ent and
    the refill draws per step (metrics.jsonl): Table 3's mechanism, logged whatever λ_ent is."""
    rows = read_metrics(out_dir).values()
    s = dict(changed=int(sum(r.get("n_groups_lam_ent_changed", 0) for r in rows)),
             kept=int(sum(r.get("n_groups_kept", 0) for r in rows)),
             updates=int(sum(1 for r in rows if not r.get("skipped", 1))), steps=len(rows),
             r_ent_by_step=[r.get("r_ent") for r in rows], refills_by_step=[r.get("refills") for r in rows])
    return dict(s, share_changed=s["changed"] / s["kept"] if s["kept"] else float("nan"))


def lambda_ent_note(s, lambda_ent):
    """The share of kept groups in which λ_ent changed an advantage, and what 0 means."""
    r_ent = [round(x, 3) for x in s.get("r_ent_by_step", []) if x is not None]  # logged under GRPO too
    note = f"λ_ent changed an advantage in {s['changed']} of {s['kept']} kept groups; r_ent by step {r_ent}"
    if lambda_ent > 0 and s["changed"] == 0:
        note += (" — 0: every update equals answer-only GRPO's on the same rollouts, so this row cannot "
                 "differ from GRPO (r_ans) by its reward, by construction (only by its sampling stream)")
    return note


TABLE3_CLAIMS = [("ske_rl", "grpo"), ("ske_rl", "format_only"), ("ske_rl", "shuffled_ske")]


def table3_headline(rows, test, args):
    """Headline entries 'Skill-Entropy RL vs X' paired over the test tasks every row was evaluated on, beside
    the per-task score of the best constant answer of each step's skill."""
    entries, const = [], defaultdict(list)
    for r in constant_recs(test, args):
        const[r["task"]].append(r["score"])
    for a, b in TABLE3_CLAIMS:
        if a in rows and b in rows and rows[a].get("per_task") and rows[b].get("per_task"):
            ids = [t["id"] for t in test if t["id"] in rows[a]["per_task"] and t["id"] in rows[b]["per_task"]]
            pa, pb = rows[a]["per_task"], rows[b]["per_task"]
            # paper_effect: Table 3 (§4.2), Qwen3-4B-Instruct: Skill-Entropy RL beats GRPO by +9.6 points
            entries.append(compare(f"Table 3: {ROW_NAMES[a]} vs {ROW_NAMES[b]} (per-task cross-skill score)",
                                   a, b, [pa[i] for i in ids], [pb[i] for i in ids],
                                   chance=float(np.mean([np.mean(const[i]) for i in ids])) if ids else None,
                                   paper_effect=0.096 if (a, b) == ("ske_rl", "grpo") else None,
                                   primary=(a, b) == ("ske_rl", "grpo")))
    return entries


def evaluate_row(args, dist, policy, tok, test, doms, fz, lam_ent):
    """A Table 3 row on the test tasks (cross-skill, greedy), per-task mean step scores (rank 0: on_rank0)."""
    t1 = time.time()
    if dist.world == 1 and args.sampler != "hf":  # the rows' shared engine, loaded with this model
        sampler = shared_sampler(fz.samplers, args, policy, tok, dist)
    else:  # under torchrun HF generate on every rank: a vLLM engine's calls are collectives of all ranks
        sampler = HFSampler(unwrap(policy), tok, args.hf_batch)
    gen = fz.deal("<policy>", make_generate(sampler, tok))
    res = fz.on_rank0(lambda: bench_eval(gen, test, doms, fz, args, "cross")) or []
    fz.samplers.pop("<policy>")  # the row's weights are not kept
    per_task = defaultdict(list)
    for r in res:
        per_task[r["task"]].append(r["score"])
    return dict(summarize(res, doms), per_task={t: float(np.mean(v)) for t, v in per_task.items()},
                lam_ent=lam_ent, seconds=time.time() - t1)


def print_table3(out, test, doms, args):
    """Table 3's shape, the λ_ent shares, and Skill-Entropy RL against each control paired over the tasks."""
    shown = dict({ROW_NAMES.get(k, k): v for k, v in out.items()},
                 **{"best constant answer": summarize(constant_recs(test, args), doms)})
    print_table("Table 3 shape: Skill²-Bench cross-skill, % per-step score", shown,
                ["overall"] + LEVELS + ["format_ok"])
    print_table("per domain", shown, doms)
    for name, r in out.items():
        if r.get("lam_ent") is not None:
            note = lambda_ent_note(r["lam_ent"], row_spec(name, args)["lam"][1])
            print(f"  {ROW_NAMES.get(name, name)}: " + note)
    entries = table3_headline(out, test, args)
    if entries:
        print(f"\nTable 3 paired over the {len(test)} test tasks (same tasks, greedy, every row; "
              f"items = per-task mean step score):\n" + format_headline(entries))

# ----- evaluation: the SkE claims against a permutation null, results.json -----


def ske_statistics(bank, jobs, q2, scores, args):
    """The SkE claims: sd of Eq. (7) over cross-domain pairs, Spearman Eq. (3) vs (7), single − switch and
    within − cross (step-2 accuracy)."""
    acc = cells_to_acc(bank, jobs, scores, args.pair_acc)
    table = build_ske_table(bank, acc, args)
    cross = [v for (a, b), v in table["pairwise"].items() if a[0] != b[0] and v == v]
    ch = dict(jobs=jobs, q2=q2, scores=scores)
    (_, si, sw), (_, wi, cr) = switch_items(ch, "single", "switch"), switch_items(ch, "within", "cross")
    gap = lambda u, v: float(np.mean(np.subtract(u, v))) if u else float("nan")  # mean over second steps
    return dict(spread=float(np.std(cross, ddof=1)) if len(cross) > 1 else float("nan"),
                spearman=table["spearman_direct_vs_factorised"], single_minus_cross=gap(si, sw),
                within_minus_cross=gap(wi, cr))


NULL_SIDES = dict(spread="greater", spearman="greater", single_minus_cross="two-sided",
                  within_minus_cross="two-sided")
NULL_NAMES = dict(spread="sd of SkE over cross-domain pairs (Eq. 7)", spearman="Spearman Eq. 3 direct vs 7",
                  single_minus_cross="step-2 accuracy single − cross", within_minus_cross="step-2 accuracy "
                  "within − cross domain")


def ske_null(bank, chains, args, n_perm, seed):
    """Null 'the first step does not matter': step-2 scores shuffled within each (b, q) (stats)."""
    jobs = [(k, tuple(a), tuple(b)) for k, a, b in chains["jobs"]]
    q2, scores = chains["q2"], [list(x) for x in chains["scores"]]
    strata = defaultdict(list)
    for i, (_, _, b) in enumerate(jobs):
        strata[(b, q2[i])].append(i)
    stat = lambda s2: ske_statistics(bank, jobs, q2, [[x[0], y] for x, y in zip(scores, s2)], args)
    return permutation_null(stat, [x[1] for x in scores], list(strata.values()), n_perm, seed, NULL_SIDES)


def print_ske(acc, table, args, t0):
    """The SkE table in one line, then every SkE claim against its permutation null."""
    cross = [v for (a, b), v in table["pairwise"].items() if a[0] != b[0] and v == v]
    si = switch_items(acc["chains"], "single", "switch")[0]
    empty, nan = acc["empty_cells"], float("nan")
    print(f"[ske] {acc['n_generations']} generations ({acc['seconds']:.0f}s); mean step score "
          f"{acc['mean_step_score']:.3f} (verifiable steps {acc['mean_step_score_verifiable']:.3f}); "
          f"{len(set(np.round(cross, 6)))} distinct pairwise SkE in [{min(cross, default=nan):.3f}, "
          f"{max(cross, default=nan):.3f}]; θ = {table['thetas'][0]:.3f}, {table['thetas'][1]:.3f}; "
          f"{len(empty)} empty Acc cells (NaN){': ' + ', '.join(empty[:6]) if empty else ''}"
          f" → {Path(args.run_dir) / 'fig2_ske.png'}")
    print(f"[ske] against the null 'the first step does not matter' ({args.null_perms} permutations of "
          f"the first step within each second step, {time.time() - t0:.0f}s; single vs cross over "
          f"{len(si)} second steps):\n" + format_null(table["null"], NULL_NAMES))
    print_switching(acc["chains"], args.seed)


def write_headline(args, run, acc, table, t3, test, bj=None):
    """results.json: the SkE null and the switching contrast, Table 3 with its mechanism (λ_ent shares, r_ent
    by step), and the headline entries."""
    results, headline = {}, []
    if table.get("null"):
        results["ske_null"] = table["null"]
        ch = acc.get("chains")
        if ch:
            _, si, cr = switch_items(ch, "single", "switch")
            c = switch_items(ch, "single", "switch", ch.get("constant"))[1] if ch.get("constant") else []
            headline.append(compare("Acc: step-2 accuracy single-skill vs cross-skill chains "
                                    "(paired over second steps)", "single", "cross", si, cr,
                                    chance=float(np.mean(c)) if c else None))
            entry, results["switching"] = switch_report(ch, args.seed)
            headline.append(entry)
    headline += bench_entries(bj)
    if t3:
        results["table3"] = {k: {c: v for c, v in r.items() if c != "per_task"} for k, r in t3.items()}
        headline += table3_headline(t3, test, args)
    write_results(run, results, headline)

# ----- main: the paper's pipeline, one function per stage, each writing its file into --run-dir -----


def construct_skill_bank(args, dist, bank, fz):
    """§3.2 stage (1): seeds labelled by the LLM, labels clustered → bank_labelled.json (for review)."""
    path = Path(args.run_dir) / "bank_labelled.json"
    def stage():  # on rank 0; every rank generates its share of its calls (on_rank0)
        t0 = time.time()
        lb = label_bank(bank, fz.gen_of(args.ref_model), fz.embed, args)
        sizes = ", ".join(f"{d} {len(v['skills'])}" for d, v in lb["domains"].items())
        print(f"[bank] labelled bank: {sizes} skills ({time.time() - t0:.0f}s) → {path}")
        write_json(path, lb)
    fz.on_rank0(stage, skip=args.resume and path.exists())
    barrier(dist)


def estimate_skill_entropy(args, dist, bank, fz):
    """§3.1, §3.2 (2), B.3–B.5: Acc → Eq. (3), (7), levels, Figure 2, the null → ske_table.json."""
    run, path = Path(args.run_dir), Path(args.run_dir) / "ske_table.json"
    def stage():
        acc = estimate_acc(bank, fz.gen_of(args.ref_model), fz.judge, args)
        table = build_ske_table(bank, acc, args)
        plot_fig2(bank, acc, table, run / "fig2_ske.png")
        t0 = time.time()
        table["null"] = ske_null(bank, acc["chains"], args, args.null_perms, args.seed)
        print_ske(acc, table, args, t0)
        write_json(path, table_to_json(acc, table))
    fz.on_rank0(stage, skip=args.resume and path.exists())
    acc, table = json_to_table(read_back(path, dist))
    keys = bank_keys(bank)
    missing = [(a, b) for a in keys for b in keys if a != b and (a, b) not in table["pairwise"]]
    if missing:  # a table of another bank would KeyError later
        raise SystemExit(f"{path} does not match the bank (missing {missing[0]}); delete it and rerun")
    for a in keys:  # same-skill "switches" (off-the-shelf traces can repeat a skill): Eq. (7) too
        table["pairwise"][(a, a)] = ske_factorised(a, a, acc, args.alpha)
    return acc, table


def annotate_offshelf(args, dist, table, fz):
    """§4.4: off-the-shelf traces in steps labelled from the bank, with their plans' SkE and level."""
    path = Path(args.run_dir) / "offshelf_labelled.json"
    def stage():
        pair, rows = (lambda a, b: table["pairwise"][(a, b)]), []
        for p, t, who, steps in offshelf_traces(fz, args):  # tasks/skill_bank.py: teacher, annotator, D.4
            seq = [k for k, _ in steps]
            ske = task_ske(seq, pair) if len(seq) >= 2 else None
            rows.append(dict(question=p["question"], answer=str(p["answer"]), trace=t, annotator=who,
                             steps=[dict(skill=list(k), answer=a) for k, a in steps], ske=ske,
                             level=level_of(ske, table["thetas"]) if ske is not None else None))
        write_json(path, dict(rows=rows))
    fz.on_rank0(stage, skip=args.resume and path.exists())
    r = read_back(path, dist)["rows"]
    if dist.is_main:
        n_annot = sum(x["annotator"] == "annotator" for x in r)
        levels = {lv: sum(x["level"] == lv for x in r) for lv in LEVELS}
        print(f"\n[label] §4.4 off-the-shelf: {len(r)} gsm_symbolic traces, annotator {n_annot} / fallback "
              f"{len(r) - n_annot}; mean steps {np.mean([len(x['steps']) for x in r]) if r else 0:.1f}; "
              f"levels {levels} → {path}")


def synthesize_tasks(args, dist, bank, table, fz):
    """§3.2 stage (3), B.6–B.9: train tasks (verifiable domains) and test tasks (all nine) → tasks.json."""
    path = Path(args.run_dir) / "tasks.json"
    def stage():
        t0 = time.time()
        use_llm = args.regenerations > 0 and args.llm_proposer_tasks != 0
        proposer = fz.gen_of(args.proposer) if use_llm else None
        train = synthesize(bank, table, proposer, args, "train")
        test = synthesize(bank, table, proposer, args, "test")
        by = lambda ts, k: {str(v): sum(t[k] == v for t in ts) for v in sorted({t[k] for t in ts}, key=str)}
        print(f"[synth] {len(train)} train / {len(test)} test tasks in {time.time() - t0:.0f}s; proposer "
              f"{by(train + test, 'proposer')}; levels: train {by(train, 'level')}, test {by(test, 'level')};"
              f" a real dependency (dependency_real) in {by(train + test, 'dependency_real')}")
        write_json(path, dict(tasks=train + test))
    fz.on_rank0(stage, skip=args.resume and path.exists())
    tasks = read_back(path, dist)["tasks"]
    return [t for t in tasks if t["split"] == "train"], [t for t in tasks if t["split"] == "test"]


def evaluate_skill2_bench(args, dist, bank, test, fz):
    """§3.3: Skill²-Bench single- and cross-skill evaluation of --model (Table 2 shape, C) → bench.json."""
    doms, path = list(bank), Path(args.run_dir) / "bench.json"
    def stage():
        t0 = time.time()
        gen = fz.gen_of(args.model)
        single = bench_eval(gen, test, doms, fz, args, "single")
        cross = bench_eval(gen, test, doms, fz, args, "cross")
        # the format control: L steps of one skill in the cross-skill prompt, its step j paired with (τ, j)
        ctl = {c["id"]: c for c in (same_skill_task(t, bank, args.seed) for t in test) if c}
        same = bench_eval(gen, list(ctl.values()), doms, fz, args, "cross")
        same = [dict(r, task=ctl[r["task"]]["of"]) for r in same if r["step"] == ctl[r["task"]]["step"]]
        const = constant_recs(test, args)
        write_json(path, dict(model=args.model, single=summarize(single, doms),
                              cross=summarize(cross, doms, same_as=single), cross_all=summarize(cross, doms),
                              constant=summarize(const, doms, same_as=single), seconds=time.time() - t0,
                              steps=step_rows(single), cross_steps=step_rows(cross),
                              same=summarize(same, doms), same_steps=step_rows(same),
                              constant_steps=step_rows(const)))
    fz.on_rank0(stage, skip=args.resume and path.exists())
    bj = read_back(path, dist)
    if dist.is_main:
        print_bench(bj, doms)
    return bj


def train_skill_entropy_rl(args, dist, bank, fz, acc, table, train, test):
    """§4: SFT warm-up, the GRPO rows of Table 3, each evaluated greedily on the same test tasks."""
    run, doms = Path(args.run_dir), list(bank)
    rows = ([r for r in args.baselines.split(",") if r]
            + [f"ske_rl_lam{x}" for x in args.lambda_sweep.split(",") if x])
    sft_tasks, rl_tasks = train[:args.n_sft], train[args.n_sft:]
    if not rl_tasks and any("lam" in row_spec(r, args) for r in rows):
        raise SystemExit(f"synthesis kept {len(train)} training tasks, none left for RL after "
                         f"--n-sft {args.n_sft}; raise --n-train or lower --n-sft")
    made, out = set(), {}  # made: the SFT folders this run trained, which later rows load
    for name in rows:
        spec, path = row_spec(name, args), run / name / "eval.json"
        if not (args.resume and path.exists()):
            t0, lam_ent = time.time(), None
            if spec["init"] is None:
                policy, tok = load_model(args.model, dist, args.dtype, trainable=False)
            elif spec["init"] == "sft_diverse":
                policy, tok = run_sft(args, dist, diverse_subset(train, args.n_sft), fz.gen_of(args.teacher),
                                      fz.judge, doms, run / name, args.resume or name in made)
                made.add(name)
            else:
                teacher = fz.gen_of(args.teacher)
                policy, tok = run_sft(args, dist, sft_tasks, teacher, fz.judge, doms, run / "sft",
                                      args.resume or "sft" in made)
                made.add("sft")
            if "lam" in spec:
                # Eq. (5) with the row's λ and r_ent, on the row's SkE table and task stream
                tab = shuffled_table(table, args.seed) if spec["table"] == "shuffled" else table
                train_ske = [task_ske([tuple(k) for k in t["skills"]], lambda a, b: tab["pairwise"][(a, b)])
                             for t in rl_tasks]
                reward_fn = make_reward_fn(bank, tab, train_ske, fz, args, spec["lam"], spec["r_ent"])
                stream = weakest_first(rl_tasks, acc, args.seed) if spec["tasks"] == "weakest" else rl_tasks
                del policy
                row = Row(stream, run / "sft", run / name, dict(spec, row=name), row_seed(args.seed, name),
                          spec["lam"][0])
                policy, tok = run_grpo(args, dist, row, reward_fn, doms, fz.samplers)
                lam_ent = lambda_ent_summary(run / name)
                if dist.is_main:
                    print(f"[train] {name} (λ_ans={spec['lam'][0]}, λ_ent={spec['lam'][1]}, "
                          f"r_ent={spec['r_ent']}, seed {row.seed}): {args.steps} GRPO steps, "
                          f"{lam_ent['updates']} updates, in "
                          f"{time.time() - t0:.0f}s; " + lambda_ent_note(lam_ent, spec["lam"][1]))
            policy = replica(policy)  # under FSDP, full weights that every rank generates from
            row_eval = evaluate_row(args, dist, policy, tok, test, doms, fz, lam_ent)
            if dist.is_main:
                write_json(path, row_eval)
            barrier(dist)
            del policy
        out[name] = json.loads(path.read_text())
    if dist.is_main:
        write_json(run / "table3.json", dict(rows=out))
        print_table3(out, test, doms, args)
    return out


def main(argv=None):
    t_start = time.time()
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="skill_entropy")
    if args.aggregate:  # finished runs (one seed each): pooled headline, Table 3's mechanism, the SkE nulls
        entries, n = aggregate_main(args.aggregate), build_parser().get_default("eval_n")  # gpu: the default
        aggregate_mechanism(args.aggregate)  # then what the gpu preset can power, at the tiny runs' spread
        print(format_power([e for e in entries if "Table 3" in e["claim"]], n / PRESETS["tiny"]["eval_n"]))
        return entries, aggregate_nulls(args.aggregate, NULL_SIDES, NULL_NAMES)
    if not (0 <= args.lambda_ans <= 1 and 0 <= args.lambda_ent <= 1):
        raise SystemExit("--lambda-ans/--lambda-ent must lie in [0, 1]")
    rl_rows = ([r for r in args.baselines.split(",") if r and "lam" in row_spec(r, args)]
               + [x for x in args.lambda_sweep.split(",") if x])
    if rl_rows and args.n_train <= args.n_sft:
        raise SystemExit(f"--n-train {args.n_train} ≤ --n-sft {args.n_sft} leaves no RL tasks for {rl_rows}")
    if args.max_new_tokens >= args.max_model_len:
        raise SystemExit(f"--max-new-tokens {args.max_new_tokens} leaves no room for the prompt in "
                         f"--max-model-len {args.max_model_len}")
    check_resume(args)  # --resume with the run's own settings, or one line naming the changed flags
    dist = setup_distributed()
    per_rank(args.prompts_per_step, dist, "--prompts-per-step")  # every rank a share of each step
    preflight(args, dist, frozen=1 + (args.beta > 0), engines=1 + (dist.world == 1), hf=dist.world > 1)
    seed_everything(args.seed + dist.rank)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    bank = load_bank(args.bank, args.skills_per_domain, args.domains, args.skills)
    if len([d for d in bank if bank[d]["kind"] == "verifiable"]) < 2:
        raise SystemExit("need at least two verifiable domains (training tasks switch domains at every step)")
    fz = frozen_models(args, dist, bank)
    # §3.2 stage (1): the skill bank from labelled seeds (for review; the curated bank is the one used)
    construct_skill_bank(args, dist, bank, fz)
    # §3.1, §3.2 stage (2): Acc under the reference model → skill entropy, Eq. (3) and (7), and its levels
    acc, table = estimate_skill_entropy(args, dist, bank, fz)
    # §4.4: off-the-shelf solutions segmented and labelled with the bank's skills
    annotate_offshelf(args, dist, table, fz)
    # §3.2 stage (3): Skill²-Bench tasks at each SkE level, proposed and verified
    train, test = synthesize_tasks(args, dist, bank, table, fz)
    if not train:
        raise SystemExit(f"no synthesized training tasks in {args.run_dir}")
    check_response_budget(args, [gold_trace(t) for t in train],
                          "D.2 response of the training tasks: their gold traces")
    # §3.3: the model on Skill²-Bench, single- vs cross-skill (Table 2)
    bj = evaluate_skill2_bench(args, dist, bank, test, fz)
    # §4: SFT warm-up, then GRPO with r = λ_ans·r_ans + λ_ent·r_ent against its baselines (Table 3)
    t3 = train_skill_entropy_rl(args, dist, bank, fz, acc, table, train, test)
    if dist.is_main:
        write_headline(args, Path(args.run_dir), acc, table, t3, test, bj)
        print(f"\ndone in {time.time() - t_start:.0f}s; everything is in {args.run_dir}/")


if __name__ == "__main__":
    run_main(main)  # main(); a package not installed: one line; under torchrun exit_ranks (plumbing)
