"""
talentrl.py — TalentRL: Strategy-Guided Reinforcement Learning for Hierarchical Skill Routing
(Sun et al., arXiv 2610.41143), over the shared GRPO in grpo.py; the search world is tasks/search_world.py.

A policy first routes each task to a *talent* (a coarse strategy: description d_c, guidance g_c, associated
skills ℳ(c)); the talent softly re-ranks the skills retrieved from a SkillBank (Eq. 5–6) and guides execution
(Eq. 7) in a Search-R1 style search environment. Phase I builds talent-aware SFT data from paired rollouts
(Eq. 8–9); phase II trains routing with matched-intervention contrasts (Eq. 11–13) and execution with
group-relative advantages (Eq. 10), token by token (Eq. 14), through the clipped, KL-regularised loss
(Eq. 15).

    python talentrl.py --preset tiny                              # 2-core CPU (wall time: README)
    python talentrl.py --aggregate runs/talentrl-s0 runs/talentrl-s1 runs/talentrl-s2   # Table 1, mean ± sd
    torchrun --nproc_per_node=2 talentrl.py --preset tiny          # the same on 2 CPU ranks (gloo)
    python talentrl.py --preset gpu                               # one 80 GB GPU, Qwen2.5-1.5B-Instruct
    torchrun --nproc_per_node=8 talentrl.py --preset paper         # Table 4 settings, Qwen2.5-7B-Instruct

Glossary: x task, 𝒯 talent catalog, c a talent, c* the SFT-selected talent, 𝒮 SkillBank, q(x, s) cosine
similarity, ℛ(x) recall pool, λ talent bonus, K skill budget, k reduced budget, τ trajectory, R(τ) return,
u_{c,r} utility, 𝒫 anchor + ordinary rollouts, δ_ℓ contrasts (ℓ = skill, budget, talent), η dead zone,
α scale, κ clip bound, w_ℓ contrast weights.

Differences from the paper (the eight that matter most; all seventeen in docs/talentrl.md):
1. Search7 and its Wikipedia corpus are not offline: a seeded fictional encyclopedia with seven question types
   in seven splits named after Search7's (tasks/search_world.py); RL trains on `nq` + `hotpotqa`.
2. Retriever and skill embedder: all-MiniLM-L6-v2 (paper: E5-style retrieval, Qwen3-Embedding-0.6B).
3. Phase I teacher (paper: GPT-5.5 or an SFT student): `--teacher scripted` (default), a Python search agent
   that answers only from the passages it read; each talent adds the move its questions need.
4. "8 rollouts per task" is |𝒫| = G = 8 (anchor + 7 ordinary) plus the three matched controls, which stay in
   the batch with zero advantage (KL, N of Eq. 15); `--no-train-controls` drops them.
5. The no-skill and reduced-context controls repeat the anchor's routing response; the no-prior control has
   no routing turn (SkillRL's prompt). An invalid anchor route gets Â_talent = 0.
6. KL and aggregation are grpo.py's: k3 estimator, token mean over the batch (N = Σ m_{i,t}, Eq. 15).
7. `tiny` uses similarity threshold 0 and K = 3 (paper: 0.2, 5), drops the controls from the loss and uses
   larger learning rates (SFT 1e-4, RL 1e-5).
8. Routing is scored against c* of held-out questions (same teacher, Eq. 8), beside routers that need no
   training; whole templates are kept out of training and scored apart (`--unseen-templates`).
"""
import argparse
import copy
import json
import random
import re
import sys
import time
from collections import Counter, namedtuple
from pathlib import Path

import numpy as np
import torch

import stats
from grpo import (Rollout, add_grpo_args, chat_ids, group_advantages, grpo_update, multi_turn_rollouts,
                  parse_with_preset, seed_everything, sft_loop)
from plumbing import (HFSampler, broadcast_object, check_resume, cpu_snapshot, frozen_copy, preflight,
                      gather_objects, load_embedder, load_model, load_policy, log_metrics, make_optimizer,
                      make_sampler, on_ranks, per_rank, phase_logger, plot_curves, plot_talents,
                      reduce_metrics, renamed_flags, restore_snapshot, resume_checkpoint, resume_finished,
                      retokenize, run_settings, run_main, save_checkpoint, setup_distributed, usable_value)
from tasks.search_world import (DATA, MULTI_HOP, SINGLE_HOP, SPLITS, TEMPLATES, TRAIN_SPLITS, World,
                                env_reply, episode_return, exact_match, f1_score, new_episode,
                                no_training_routers, rationale, routing_accuracy, save_skillbank,
                                scripted_rollouts, split_pools, label_stats)

# ----- config: presets and flags (Table 4) -----
PRESETS = {
    # 2-core CPU, embedded SmolLM2-135M, small world, TalentRL alone (+ SkillRL: --arms skillrl talentrl),
    # in #48's 5-minute budget (FLOP-bound, README "Time"): 11 SFT tasks, K 2, 3 actions, 1 RL step of 2 tasks
    # × G 2, 2 held-out questions per split (6 routed alone); vLLM rollouts (`auto`: HF if it cannot start)
    "tiny": dict(n_people=40, n_places=16, n_orgs=10, n_events=10, n_hamlets=12, n_shared=6, n_train=60,
                 eval_n=2, route_eval_n=6, zero_shot=False, arms=["talentrl"], max_steps=3,
                 sim_threshold=0.0, K=2, k_reduced=1, sft_tasks=11, sft_n=1, sft_batch=4, sft_lr=1e-4,
                 sft_epochs=1, exec_epochs=1, sft_match=True,
                 steps=1, prompts_per_step=2, G=2, train_controls=False, lr=1e-5,
                 max_new_tokens=48, route_max_tokens=64, micro_batch=4,
                 evolve_every=0, val_tasks=4, evolve_max_tokens=48, sampler="auto", vllm_kv_seqs=32),
    # Table 4 (the flag defaults) on GPUs, rollouts on vLLM, its primary backbone Qwen2.5-7B-Instruct
    "paper": dict(model="Qwen/Qwen2.5-7B-Instruct", sampler="vllm", max_model_len=8192),  # Table 4: 8,192
    # one GPU of ≥ 80 GB, at most 1 h (estimated, not run), Qwen2.5-1.5B-Instruct (the primary's family):
    # TalentRL vs SkillRL after RL (Table 2), success paired over the held-out questions
    "gpu": dict(model="Qwen/Qwen2.5-1.5B-Instruct", sampler="auto", max_model_len=8192, n_train=600,
                eval_n=100, sft_tasks=400, steps=30, prompts_per_step=16, val_tasks=64,
                grad_checkpointing=True),
}
RENAMED = {"--rl-steps": "--steps", "--tasks-per-step": "--prompts-per-step", "--n-test": "--eval-n"}


def build_parser():
    p = argparse.ArgumentParser(description="TalentRL on an offline fictional search world.")
    add_grpo_args(p)
    p.set_defaults(beta=0.01, max_new_tokens=512)  # Table 4: KL 0.01; App.: up to 512 tokens per response
    g = p.add_argument_group("world (offline stand-in for Search7, tasks/search_world.py)")
    g.add_argument("--n-people", type=int, default=2000,
                   help="people in the fictional encyclopedia (paper scale: 2000)")
    g.add_argument("--n-places", type=int, default=400, help="towns (paper scale: 400)")
    g.add_argument("--n-orgs", type=int, default=400, help="organisations (paper scale: 400)")
    g.add_argument("--n-events", type=int, default=300, help="events (paper scale: 300)")
    g.add_argument("--n-hamlets", type=int, default=600,
                   help="long-tail entities (hamlets) (paper scale: 600)")
    g.add_argument("--n-shared", type=int, default=150,
                   help="deliberate name collisions (disambiguation) (paper scale: 150)")
    g.add_argument("--n-train", type=int, default=3000, help="train questions per split; RL draws from nq + "
                   "hotpotqa's, phase I from all seven (paper scale: 3000)")
    g.add_argument("--eval-n", type=int, default=500,
                   help="held-out test questions per split (7 splits) (paper scale: 500)")
    g.add_argument("--route-eval-n", type=int, default=0, help="held-out questions per split routed alone, "
                   "scored against c*, if above --eval-n (paper: none, it reports no routing accuracy)")
    g.add_argument("--topk-docs", type=int, default=3, help="passages per search (Search-R1: 3)")
    g.add_argument("--max-steps", type=int, default=4, help="maximum interaction steps (Table 4: 4)")
    g.add_argument("--invalid-penalty", type=float, default=0.0,
                   help="return penalty per invalid action (App. D.2: none, the task score alone; "
                        "SkillRL: small)")
    g = p.add_argument_group("talents and retrieval (§3.2, Table 4)")
    g.add_argument("--skillbank", default=str(DATA / "skillbank.json"),
                   help="SkillBank in SkillRL's JSON format")
    g.add_argument("--talents", default=str(DATA / "talents.json"), help="talent catalog 𝒯 (App. B)")
    g.add_argument("--K", type=int, default=5, help="K, execution skill budget, Eq. (1)/(6) (Table 4: 5)")
    g.add_argument("--recall", type=int, default=20, help="|ℛ(x)|, similarity recall size (Table 4: 20)")
    g.add_argument("--sim-threshold", type=float, default=0.2,
                   help="similarity threshold of ℛ(x) (Table 4: 0.2)")
    g.add_argument("--lam", type=float, default=0.3, help="λ, talent-prior bonus, Eq. (5) (Table 4: 0.3)")
    g.add_argument("--route-max-tokens", type=int, default=256,
                   help="tokens of the routing response (paper scale: 256)")
    g.add_argument("--route-temperature", type=float, default=None,
                   help="routing temperature in RL (default: --temperature; another value is refused while "
                        "RL "
                        "trains, since grpo_update log-probes every token at --temperature)")
    g.add_argument("--eval-temperature", type=float, default=0.0,
                   help="routing and execution temperature at evaluation (Table 4 note: deterministic)")
    g = p.add_argument_group("phase I: talent-aware SFT (§3.3)")
    g.add_argument("--teacher", default="scripted",
                   help="who rolls out SFT trajectories: scripted | policy | model path")
    g.add_argument("--sft-tasks", type=int, default=2000,
                   help="|𝒟_sft|, tasks taken from the train splits (paper scale: 2000)")
    g.add_argument("--sft-n", type=int, default=3,
                   help="n, rollouts per talent and reference rollouts per task (App. A: 3)")
    g.add_argument("--sft-epochs", type=int, default=2,
                   help="SFT epochs over the original (SkillRL) rows (Table 4: 2)")
    g.add_argument("--route-epochs", type=int, default=2,
                   help="SFT epochs over App. C's talent-selection rows (paper: the SFT epochs, 2)")
    g.add_argument("--exec-epochs", type=int, default=2,
                   help="SFT epochs over App. C's talent-conditioned execution rows (paper: the SFT epochs, "
                        "2)")
    g.add_argument("--sft-batch", type=int, default=16, help="SFT effective batch size (Table 4: 16)")
    g.add_argument("--sft-lr", type=float, default=1e-5, help="SFT learning rate (Table 4: 1e-5)")
    g.add_argument("--talent-sft-init", choices=["pi0", "skillrl-sft"], default="pi0",
                   help="TalentRL-SFT: original + talent rows from π_0 (Search7, §5.3) or talent rows on "
                        "SkillRL-SFT (ALFWorld)")
    g.add_argument("--sft-match", action=argparse.BooleanOptionalAction, default=False,
                   help="SkillRL-SFT repeats its rows up to TalentRL-SFT's count: the same SFT steps from "
                        "π_0 (needs --talent-sft-init pi0; paper: no, the talent rows come on top)")
    g.add_argument("--unseen-templates", nargs="*", choices=TEMPLATES,
                   default=["hq", "event_country", "larger_population", "age", "disamb_place",
                            "hamlet_elevation"],
                   help="question templates kept out of SFT and RL (one of each type that has several), on "
                        "which held-out routing is scored apart (paper: none, it has no such split)")
    g.add_argument("--zero-shot", action=argparse.BooleanOptionalAction, default=True,
                   help="evaluate π_0 (Table 1's reference row)")
    g = p.add_argument_group("phase II: matched-intervention RL (§4)")
    g.add_argument("--steps", type=int, default=200, help="policy updates (Table 4: 200)")
    g.add_argument("--prompts-per-step", type=int, default=64,
                   help="task batch size over all ranks (Table 4: 64)")
    g.add_argument("--k-reduced", type=int, default=2, help="k, reduced skill budget of τ_k (Table 4: 2)")
    g.add_argument("--eta", type=float, default=0.1, help="η, dead-zone threshold, Eq. (11) (Table 4: 0.1)")
    g.add_argument("--alpha", type=float, default=2.0,
                   help="α, routing-advantage scale, Eq. (13) (Table 4: 2.0)")
    g.add_argument("--kappa", type=float, default=2.0,
                   help="κ, routing-advantage clip, Eq. (13) (Table 4: 2.0)")
    g.add_argument("--contrast-weights", type=float, nargs=3, default=[1.0, 1.0, 1.0],
                   help="w_skill w_budget w_talent of Eq. (13), normalised to sum 1 (paper: equal)")
    g.add_argument("--train-controls", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the matched controls in the loss batch with zero advantage (Eq. 14)")
    g.add_argument("--arms", nargs="*", default=["skillrl", "talentrl"], choices=["skillrl", "talentrl"],
                   help="methods: TalentRL (RL from TalentRL-SFT), the SkillRL baseline (SkillRL-SFT, Table "
                        "1, then RL from it, Table 2)")
    g = p.add_argument_group("SkillBank evolution (SkillRL, NOTES §4)")
    g.add_argument("--evolve-every", type=int, default=10,
                   help="validate and evolve the bank every N RL steps (0: never; paper scale: 10)")
    g.add_argument("--val-tasks", type=int, default=256,
                   help="validation tasks for evolution (paper scale: 256)")
    g.add_argument("--evolve-threshold", type=float, default=0.4,
                   help="task types below this success get new skills (SkillRL: 0.4)")
    g.add_argument("--evolve-failures", type=int, default=10,
                   help="failed trajectories shown per task type (SkillRL: 10)")
    g.add_argument("--evolve-max-new", type=int, default=3,
                   help="new skills per task type at most (SkillRL: 3)")
    g.add_argument("--evolve-max-tokens", type=int, default=512,
                   help="tokens of the skill proposal (paper scale: 512)")
    renamed_flags(p, RENAMED)
    return p


def check_args(args):
    """Refuse settings whose training would be silently wrong."""
    if args.sft_match and args.talent_sft_init != "pi0":  # TalentRL-SFT would also get SkillRL-SFT's steps
        raise SystemExit("talentrl: --sft-match compares two SFT runs from π_0; set --talent-sft-init pi0")
    if args.talent_sft_init == "skillrl-sft" and "skillrl" not in args.arms:
        raise SystemExit("talentrl: --talent-sft-init skillrl-sft needs SkillRL-SFT: add skillrl to --arms")
    rt = args.route_temperature
    if rt is not None and rt != args.temperature and "talentrl" in args.arms and args.steps > 0:
        # Eq. (15)'s ratio needs log π at the temperature the token was sampled at; grpo_update uses one
        raise SystemExit(f"talentrl: --route-temperature {rt} differs from --temperature {args.temperature}, "
                         "but grpo_update log-probes every token (routing included) at --temperature; "
                         "set them equal")


# ----- method: the equations as pure functions (Eq. 1, 4–6, 8, 10–14) -----
# Eq. (4): c ~ π_θ(· | x, 𝒯): the routing response is `<think>…</think><talent>id</talent>`
ROUTE_RE = re.compile(r"^\s*<think>(.+?)</think>\s*<talent>\s*([A-Za-z0-9_]+)\s*</talent>\s*$", re.S)


def parse_route(text, talent_ids):
    """Strict parse of the routing response; None (no talent) for a broken format or an unknown id."""
    m = ROUTE_RE.match(text or "")
    if m is None or not m.group(1).strip() or m.group(2) not in talent_ids:
        return None
    return m.group(2)


def retrieve_skills(sims, assoc, K, recall, threshold, lam):
    """Indices of the skills given to execution. sims: (S,) cosine similarities q(x, s); assoc: set of skill
    indices ℳ(c) (empty for no talent, which gives the similarity-only Eq. (1))."""
    # candidate pool ℛ(x): the `recall` most similar skills above the threshold
    order = sorted(range(len(sims)), key=lambda i: -float(sims[i]))[:recall]
    pool = [i for i in order if float(sims[i]) >= threshold]
    # Eq. (5): q̃(x, s | c) = q(x, s) + λ·𝕀[s ∈ ℳ(c)],  s ∈ ℛ(x)
    q_tilde = {i: float(sims[i]) + lam * (i in assoc) for i in pool}
    # Eq. (6): 𝒮_K(x, c) = TopK_{s ∈ ℛ(x)} q̃(x, s | c); without a talent this is Eq. (1): TopK q(x, s)
    return sorted(pool, key=lambda i: -q_tilde[i])[:K]


def talent_utilities(R_talent, R_ref):
    """Eq. (8) per rollout and its mean over the n repeats; R_talent: (T, n), R_ref: (n,) returns."""
    # Eq. (8): u_{c,r}(x) = R(τ_{c,r}) − R(τ_{∅,r})
    u = R_talent - R_ref[None, :]  # (T, n)
    return u, u.mean(dim=1)  # (T, n), (T,): ū_c(x) = 1/n Σ_r u_{c,r}(x)


def dead_zone(z, eta):
    # Eq. (11): D_η(z) = 0 if |z| < η else z
    return torch.where(z.abs() < eta, torch.zeros_like(z), z)


def routing_advantage(R_a, R_controls, weights, alpha, kappa, eta):
    """R_controls: (3,) returns of the no-skill, reduced-context, no-prior controls; weights (3,), sum 1."""
    # Eq. (12): δ_ℓ = D_η(R_a − R_ℓ),  ℓ ∈ {skill, budget, talent}
    delta = dead_zone(R_a - R_controls, eta)  # (3,)
    # Eq. (13): Â_talent = clip(α Σ_ℓ w_ℓ δ_ℓ, −κ, κ)
    return float((alpha * (weights * delta).sum()).clamp(-kappa, kappa)), delta


def token_advantages(mask, n_route, anchor, in_P, A_talent, A_exec):
    """Eq. (14) for one rollout's completion tokens. mask: per-token 1 (policy) / 0 (environment); the first
    n_route tokens are the routing response (ℐ_route), later policy tokens are execution (ℐ_exec)."""
    # Eq. (14): A_{i,t} = Â_talent if i = i_a, t ∈ ℐ_route; Â_exec_i if i ∈ 𝒫, t ∈ ℐ_exec; 0 otherwise
    adv = []
    for t, m in enumerate(mask):
        if not m:
            adv.append(0.0)  # environment tokens: masked out of Eq. (15) anyway
        elif t < n_route:
            adv.append(A_talent if anchor else 0.0)  # Â_talent, i = i_a, t ∈ ℐ_route
        else:
            adv.append(A_exec if in_P else 0.0)  # Â_exec_i, i ∈ 𝒫, t ∈ ℐ_exec
    return adv  # 0 otherwise (controls, ordinary routing tokens)


# ----- method: rollouts, routing then talent-conditioned execution (Eq. 2–7) -----
def routing_prompt(task, talents):
    catalog = "\n".join(f"- {t['talent_id']}: {t['description']}" for t in talents)
    return (f"Question: {task['question']}\n\nBefore answering, choose the talent (strategy) that "
            f"fits this question best:\n{catalog}\n\nReply with a short reason in <think>...</think> "
            f"followed by the talent id in <talent>...</talent>.")


def execution_context(task, talent, skills, route_given):
    """Eq. (7)'s context: guidance g_c, skills 𝒮_K(x, c); route_given: it follows the routing turn."""
    lines = []
    if talent is not None:
        lines.append(f"Talent guidance: {talent['guidance']}")
    if skills:
        lines.append("Relevant skills:\n" + "\n".join(f"- {s['title']}: {s['principle']}" for s in skills))
    lines.append("Answer the question using the search engine. Each turn, write at most one short "
                 "sentence of reasoning, then exactly one action: <search>query</search> to search, "
                 "or <answer>final answer</answer> once the documents contain the answer. The "
                 "answer must be a short name, place or number.")
    if not route_given:
        lines.append(f"Question: {task['question']}")
    return "\n\n".join(lines)


def route_target(talent, task):
    """SFT routing target for a task: its grounded rationale in <think> and the talent id."""
    return f"<think>{rationale(task['question'], talent)}</think><talent>{talent['talent_id']}</talent>"


def turn_suffix_ids(tok, user_text):
    """Ids that close the assistant's routing turn, open a user turn carrying
    `user_text` (the execution context) and open the next assistant turn."""
    mark = "<<ROUTE>>"
    # enable_thinking=False as grpo.chat_ids: else Qwen3 thinks inside the execution turn's budget
    full = tok.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": mark},
                                    {"role": "user", "content": user_text}],
                                   add_generation_prompt=True, tokenize=False, enable_thinking=False)
    return tok.encode(full.split(mark, 1)[1], add_special_tokens=False)


def skills_for(W, task, talent, k, prior):
    """𝒮_k(x, c) of Eq. (6) with the talent bonus (prior), or 𝒮_k(x) of Eq. (1) by similarity alone."""
    sims = (W.S_emb @ W.question_embedding(task["question"]).T).squeeze(1)  # (S,)
    assoc = {i for i, s in enumerate(W.bank) if talent and prior and s["skill_id"] in talent["skills"]}
    a = W.args
    return [W.bank[i] for i in retrieve_skills(sims, assoc, k, a.recall, a.sim_threshold, a.lam)]


def condition_prompt(W, tok, task, cond, route_ids=None):
    """Execution prompt ids under cond = dict(talent=id|None, k=skills given, prior=bonus on, guidance=on)."""
    talent = W.by_id.get(cond.get("talent")) if cond.get("talent") else None
    skills = skills_for(W, task, talent, cond["k"], cond.get("prior", True)) if cond["k"] > 0 else []
    guided = talent if cond.get("guidance", True) else None
    # Eq. (7): a_j ~ π_θ(· | h_{j−1}, g_c, 𝒮_K(x, c)): guidance and skills precede the history
    if route_ids is None:  # no routing turn: SkillRL's protocol
        return (chat_ids(tok, [{"role": "user", "content": execution_context(task, guided, skills, False)}]),
                skills)
    rp = chat_ids(tok, [{"role": "user", "content": routing_prompt(task, W.talents)}])
    return rp + route_ids + turn_suffix_ids(tok, execution_context(task, guided, skills, True)), skills


def sample_route(tok, W, sample):
    """(routing ids, parsed talent id or None) of one sampled routing response."""
    ids = [t for t in sample.ids if t != tok.eos_token_id]  # the chat template closes the turn itself
    return ids, parse_route(tok.decode(ids, skip_special_tokens=True), set(W.by_id))


def run_episodes(sampler, tok, W, tasks, conds, args, temperature, route_temperature=None):
    """One episode per (task, condition). cond["talent"] == "policy": the policy routes first (Eq. 4) and the
    rollout holds the routing and the execution tokens; an unparsable route falls back to no talent. Returns
    dicts with the episode, its ids/mask and n_route. route_temperature None: --route-temperature, else
    `temperature`."""
    rp = [chat_ids(tok, [{"role": "user", "content": routing_prompt(t, W.talents)}]) for t in tasks]
    routed = [i for i, c in enumerate(conds) if c.get("talent") == "policy" and "route" not in c]
    route = {i: c["route"] for i, c in enumerate(conds) if "route" in c}  # routes sampled by the caller
    if routed:
        route_t = route_temperature if route_temperature is not None else (
            args.route_temperature if args.route_temperature is not None else temperature)
        check_fits([rp[i] for i in routed], args.route_max_tokens, args, "routing prompt")
        outs = sampler.generate([rp[i] for i in routed], 1, args.route_max_tokens, route_t, args.top_p,
                                ["</talent>"])
        for i, (s,) in zip(routed, outs):
            route[i] = sample_route(tok, W, s)
    prompts, eps, info = [], [], []
    for i, (task, c) in enumerate(zip(tasks, conds)):
        c = dict(c)
        if i in route:
            c["talent"] = route[i][1]  # None: invalid route → no talent (guidance and bonus off)
            p, skills = condition_prompt(W, tok, task, c, route[i][0])
        elif c.get("talent"):  # a forced talent (phase I): its routing target stands in the prompt
            rid = tok.encode(route_target(W.by_id[c["talent"]], task), add_special_tokens=False)
            p, skills = condition_prompt(W, tok, task, c, rid)
        else:
            p, skills = condition_prompt(W, tok, task, c)
        prompts.append(p)
        eps.append(new_episode(task))
        info.append(dict(talent=c.get("talent"), skills=[s["skill_id"] for s in skills]))
    if args.teacher == "scripted" and conds and conds[0].get("teacher"):
        execs = scripted_rollouts(tok, W, eps, info, args)
    else:
        check_fits(prompts, args.max_new_tokens, args, "execution prompt")
        # a turn starts only while prompt + history + a full turn fit in the engine's context
        execs = multi_turn_rollouts(sampler, tok, prompts,
                                    lambda j, text: env_reply(eps[j], text, W.search, args.max_steps),
                                    args.max_steps, args, stop=["</search>", "</answer>"],
                                    temperature=temperature,
                                    max_tokens=args.max_model_len - args.max_new_tokens)
        for ep in eps:
            ep["truncated"] = not ep["done"]  # the context filled up before an answer or the step budget
        if n_cut := sum(ep["truncated"] for ep in eps):
            print(f"talentrl: {n_cut}/{len(eps)} episode(s) stopped unanswered at --max-model-len "
                  f"{args.max_model_len} (truncated: R = 0)", file=sys.stderr, flush=True)
    out = []
    for i, (ep, ex) in enumerate(zip(eps, execs)):
        R = episode_return(ep, args.invalid_penalty)
        d = dict(ep=ep, R=R, em=exact_match(ep["pred"], ep["task"]["answer"]),
                 f1=f1_score(ep["pred"], ep["task"]["answer"]), completed=ep["pred"] is not None,
                 valid=ep["n_invalid"] == 0, **info[i])
        if i in route:  # one rollout: routing response (trained) + context (masked) + execution
            r_ids = route[i][0]
            ctx = prompts[i][len(rp[i]) + len(r_ids):]
            d.update(prompt_ids=rp[i], ids=r_ids + ctx + ex.ids,
                     mask=[1] * len(r_ids) + [0] * len(ctx) + ex.mask, n_route=len(r_ids),
                     route_ok=route[i][1] is not None)
        else:
            d.update(prompt_ids=prompts[i], ids=ex.ids, mask=ex.mask, n_route=0)
        out.append(d)
    return out


# ----- method: phase I, talent-aware SFT (Alg. 1 l.4–13, Eq. 8–9) -----
def build_sft_data(sampler, tok, W, tasks, args, ttok=None):
    """Alg. 1 l.6-12: paired rollouts per task, Eq. (8), c* and one kept trajectory per task, rolled out in
    the teacher's tokenizer `ttok` (default `tok`), rows in `tok`. Returns (rows, stats): rows {route, exec,
    original} of (prompt_ids, target_ids, mask), App. C (docs/talentrl.md); stats: counts, c* labels."""
    ttok = ttok or tok
    n, T = args.sft_n, W.talents
    rows, labels = dict(route=[], exec=[], original=[]), []
    for task in tasks:
        # Alg. 1 l.6-7: n reference rollouts (similarity-only skills) and n per talent
        conds = [dict(talent=None, k=args.K, teacher=True)] * n
        conds += [dict(talent=t["talent_id"], k=args.K, teacher=True) for t in T for _ in range(n)]
        res = run_episodes(sampler, ttok, W, [task] * len(conds), conds, args, args.temperature)
        ref, per = res[:n], [res[n + j * n: n + (j + 1) * n] for j in range(len(T))]
        R_ref = torch.tensor([r["R"] for r in ref])  # (n,)
        R_t = torch.tensor([[r["R"] for r in rs] for rs in per])  # (T, n)
        u, u_bar = talent_utilities(R_t, R_ref)  # (T, n), (T,)
        # SkillRL rows: successful reference rollouts (the replay data both arms see)
        ref_prompt, seen = condition_prompt(W, tok, task, dict(talent=None, k=args.K))[0], set()
        for r in ref:
            ids, mask = retokenize(r["ids"], r["mask"], ttok, tok)
            if r["em"] > 0 and r["valid"] and tuple(ids) not in seen:
                seen.add(tuple(ids))
                rows["original"].append((ref_prompt, ids, mask))
        # Alg. 1 l.9: c* = argmax_c ū_c(x); ties: mean score, success rate, fewer searches, then the
        # talent whose description d_c is closest to the question
        sim_d = W.description_similarity(task)  # (T,)
        key = lambda j: (float(u_bar[j]), float(R_t[j].mean()), float((R_t[j] > 0).float().mean()),
                         -np.mean([r["ep"]["n_search"] for r in per[j]]), float(sim_d[j]))
        c = max(range(len(T)), key=key)
        if float(u_bar[c]) <= 0:  # l.10: keep the task only if ū_c*(x) > 0
            continue
        # l.11: a completed, valid rollout with u > 0: higher utility, then fewer turns
        ok = [r for r in range(n) if per[c][r]["completed"] and per[c][r]["valid"] and float(u[c, r]) > 0]
        if not ok:
            continue
        best = per[c][max(ok, key=lambda r: (float(u[c, r]), -per[c][r]["ep"]["turns"]))]
        # l.12, App. C: a talent-selection row (routing prompt → task-grounded rationale + c*) ...
        rp = chat_ids(tok, [{"role": "user", "content": routing_prompt(task, T)}])
        route = tok.encode(route_target(T[c], task), add_special_tokens=False)
        rows["route"].append((rp, route, [1] * len(route)))
        # ... and the rollout's actions after that routing turn, guidance and skills (context masked)
        prompt = condition_prompt(W, tok, task, dict(talent=T[c]["talent_id"], k=args.K), route)[0]
        rows["exec"].append((prompt, *retokenize(best["ids"], best["mask"], ttok, tok)))
        labels.append(dict(question=task["question"], qtype=task["qtype"], split=task["split"],
                           talent=T[c]["talent_id"]))
    return rows, label_stats(len(tasks), labels, len(rows["original"]))


def load_teacher(args, dist, sampler, tok):
    """Phase I's sampler and tokenizer: the policy's (scripted, policy) or an HF model with its own."""
    if args.teacher in ("scripted", "policy"):
        return sampler, tok
    model, ttok = load_model(args.teacher, dist, args.dtype, trainable=False)
    return HFSampler(model, ttok, args.hf_batch), ttok


def phase1_data(sampler, tok, W, tasks, args, dist):
    """Alg. 1 l.4-12, each rank on its share of the tasks; every rank gets all ranks' rows, in rank order."""
    sampler, ttok = load_teacher(args, dist, sampler, tok)
    rows, st = build_sft_data(sampler, tok, W, tasks[dist.rank::dist.world], args, ttok)
    parts = gather_objects([(rows, st["labels"])], dist)  # one entry per rank
    rows = {k: [row for r, _ in parts for row in r[k]] for k in rows}
    return rows, label_stats(len(tasks), [l for _, ls in parts for l in ls], len(rows["original"]))


def sft_sets(rows, talent_sft_init, sft_epochs, route_epochs, exec_epochs, match=False):
    """Alg. 1 l.13's data for Table 1 (§5.3), each row repeated for its epochs: SkillRL-SFT the original rows
    alone; TalentRL-SFT those + 𝒟_talent (Search7, from π_0) or 𝒟_talent alone (ALFWorld, on SkillRL-SFT).
    match: SkillRL-SFT cycles through its rows up to TalentRL-SFT's number of rows (the same SFT steps)."""
    orig = rows["original"] * sft_epochs
    talent = rows["exec"] * exec_epochs + rows["route"] * route_epochs
    both = orig + talent
    return {"skillrl-sft": (orig * (len(both) // max(len(orig), 1) + 1))[:len(both)] if match else orig,
            "talentrl-sft": talent if talent_sft_init == "skillrl-sft" else both}


def run_sft(model, examples, args, dist, seed):
    """Alg. 1 l.13: one shuffled pass over `examples`, batches of --sft-batch (grpo.sft_loop; DDP shares)."""
    # Eq. (9): L_sft = −Σ_{t ∈ ℐ_asst} log π_θ(y_t | ξ, y_<t); grpo.sft_update divides by the
    # number of response tokens in the batch (token mean; context and observations masked)
    m = sft_loop(model, examples, args, dist, args.sft_lr, args.sft_batch, epochs=1, seed=seed)
    return dict(sft_steps=m["sft_steps"], sft_examples=len(examples), sft_loss=m["sft_loss"],
                sft_tokens=sum(sum(mask) for _, _, mask in examples))  # trained (response) tokens


def phase1_sft(model, sampler, tok, init, examples, sft_dir, args, dist):
    """Alg. 1 l.13: fine-tune the weights `init` on the examples by Eq. (9) and save the
    checkpoint (π_ref of the RL stage) with the run's SFT metrics; with --resume its checkpoint is loaded
    instead, and the metrics it saved are returned (an older checkpoint without them: NaN, 0 steps)."""
    if args.resume and (ck := resume_finished(sft_dir, model, dist)) is not None:
        sampler.sync(model)
        old = dict(sft_steps=0, sft_examples=len(examples), sft_loss=float("nan"))
        return dict(ck[1].get("sft", old), resumed=True)
    restore_snapshot(model, init)
    sft = run_sft(model, examples, args, dist, args.seed)
    save_checkpoint(sft_dir, model, tok, None, -1, {"settings": run_settings(args), "sft": sft}, dist)
    sampler.sync(model)
    return sft


# ----- method: phase II, matched-intervention RL and SkillBank evolution (Alg. 1 l.14–23) -----
Policy = namedtuple("Policy", "model sampler tok")  # π_θ, the engine that rolls it out, its tokenizer


def phase2_rl(routed, pi, W, rl_tasks, arm_dir, args, dist):
    """Alg. 1 l.14-23 from the SFT weights in pi.model: TalentRL (routed) or SkillRL's GRPO with similarity
    skills (the baseline); both evolve the SkillBank. Returns Â_talent of all groups and steps (TalentRL)."""
    model, sampler, tok = pi
    # l.14: π_ref ← π_θ (the SFT checkpoint), frozen
    ref = frozen_copy(model, getattr(torch, args.dtype))  # --dtype (bf16): not an fp32 replica under FSDP
    opt = make_optimizer(model, args)
    start, A_groups = 0, []
    if args.resume and (ck := resume_checkpoint(arm_dir, model, opt, dist)):  # policy, optimizer, SkillBank
        start = ck[0] + 1
        W.set_bank(ck[1]["bank"], ck[1]["bank_raw"])
        W.set_talents(ck[1]["talents"])
        print(f"talentrl: SkillBank restored: {len(W.bank)} skills", file=sys.stderr)
        A_groups = list(ck[1].get("A_talent_groups", []))  # Â_talent of the steps before the checkpoint
    sampler.sync(model)
    val_tasks = rl_tasks[: args.val_tasks]
    for step in range(start, args.steps):
        t0 = time.time()
        # l.17: a task batch from 𝒟_rl, the same on every rank; each rank owns whole tasks
        batch = random.Random(args.seed * 7919 + step).sample(rl_tasks,
                                                              min(args.prompts_per_step, len(rl_tasks)))
        mine, first = batch[dist.rank::dist.world], dist.rank * len(batch)
        if routed:  # l.18-22
            rollouts, st = talentrl_rollouts(sampler, tok, W, mine, args, first)
        else:
            rollouts, st = skillrl_rollouts(sampler, tok, W, mine, args, first)
        t_gen = time.time() - t0
        # l.23, Eq. (15): L_rl = −1/N Σ_{i,t} m_{i,t} min(r Â, clip(r, 1−ε_c, 1+ε_c) Â) + β D_KL(π_θ‖π_ref)
        m = grpo_update(model, ref, opt, rollouts, args, dist)
        sampler.sync(model)
        extra = dict(R_P=np.mean(st["R_P"]) if st["R_P"] else 0.0,
                     success_P=np.mean([r >= 1.0 for r in st["R_P"]]) if st["R_P"] else 0.0)
        if routed:  # means over this rank's groups, then over ranks
            A_groups += gather_objects(st["A_talent"], dist)
            A, d = np.array(st["A_talent"] or [0.0]), np.array(st["delta"] or [[0.0] * 3]).reshape(-1, 3)
            extra.update(A_talent=A.mean(), A_talent_abs=np.abs(A).mean(), A_talent_nonzero=(A != 0).mean(),
                         delta_skill=d[:, 0].mean(), delta_budget=d[:, 1].mean(), delta_talent=d[:, 2].mean(),
                         route_valid=np.mean(st["route_ok"]) if st["route_ok"] else 0.0)
        m.update(reduce_metrics(extra, dist))
        n_new = 0
        if args.evolve_every and (step + 1) % args.evolve_every == 0:
            _, val = evaluate(sampler, tok, W, val_tasks, routed, args, dist)
            n_new = evolve_skillbank(sampler, tok, W, val, args, dist)
        if dist.is_main:  # the bank of every step is saved
            save_skillbank(arm_dir / "skillbanks" / f"step{step:04d}.json", W.bank, W.bank_raw)
        m.update(n_new_skills=n_new, bank_size=len(W.bank), time_gen=t_gen, time_step=time.time() - t0)
        log_metrics(arm_dir, step, m, dist,
                    keys=("reward", "R_P", "success_P", "A_talent_abs", "A_talent_nonzero", "route_valid",
                          "kl", "loss", "grad_norm", "time_step"))
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_checkpoint(arm_dir, model, tok, opt, step,
                            dict(bank=W.bank, bank_raw=W.bank_raw, talents=W.talents,
                                 A_talent_groups=A_groups, settings=run_settings(args)), dist)
    if dist.is_main and args.steps > start:
        plot_curves(arm_dir,
                    ("reward", "R_P", "kl") + (("A_talent_abs", "A_talent_nonzero") if routed else ()))
    return A_groups


def talentrl_rollouts(sampler, tok, W, tasks, args, first_group):
    """Alg. 1 l.18-22: per task an anchor, three matched controls, G−1 ordinary rollouts; Eq. (10)-(14)."""
    G = args.G
    # routing responses of the anchor (route 0) and the G−1 ordinary rollouts of each task, in one batch
    rp = [chat_ids(tok, [{"role": "user", "content": routing_prompt(t, W.talents)}]) for t in tasks]
    route_t = args.route_temperature if args.route_temperature is not None else args.temperature
    check_fits(rp, args.route_max_tokens, args, "routing prompt")
    outs = sampler.generate(rp, G, args.route_max_tokens, route_t, args.top_p, ["</talent>"]) if tasks else []
    conds, ctasks = [], []
    for task, samples in zip(tasks, outs):
        routes = [sample_route(tok, W, s) for s in samples]
        conds += [dict(talent="policy", route=r, k=args.K) for r in routes]
        # matched controls: no-skill τ_−s and reduced-context τ_k repeat the anchor's routing
        # response (so c_a, g_c and the skill ordering are the anchor's; an invalid anchor route gives
        # the no-talent fallback in all three); no-prior τ_np drops talent, guidance and bonus
        conds += [dict(talent="policy", route=routes[0], k=0),
                  dict(talent="policy", route=routes[0], k=args.k_reduced), dict(talent=None, k=args.K)]
        ctasks += [task] * (G + 3)
    res = run_episodes(sampler, tok, W, ctasks, conds, args, args.temperature)
    rollouts, stats = [], dict(A_talent=[], delta=[], route_ok=[], R_P=[])
    for j, task in enumerate(tasks):
        P, ctrl = res[j * (G + 3): j * (G + 3) + G], res[j * (G + 3) + G:(j + 1) * (G + 3)]
        anchor = P[0]
        R_P = torch.tensor([[r["R"] for r in P]], dtype=torch.float64)  # (1, G)
        # Eq. (10): Â_exec_i = (R_i − μ_𝒫) / (σ_𝒫 + ε), over 𝒫 = anchor + ordinary rollouts only
        A_exec = group_advantages(R_P, args.scale_rewards, args.adv_eps)[0].tolist()  # (G,)
        R_ctrl = torch.tensor([r["R"] for r in ctrl], dtype=torch.float64)  # (3,): −s, k, np
        w = torch.tensor(args.contrast_weights, dtype=torch.float64)
        A_talent, delta = routing_advantage(torch.tensor(anchor["R"], dtype=torch.float64), R_ctrl,
                                            w / w.sum(), args.alpha, args.kappa, args.eta)
        if not anchor["route_ok"]:
            A_talent = 0.0  # no routing action was taken: nothing to credit
        stats["A_talent"].append(A_talent), stats["delta"].append(delta.tolist())
        stats["route_ok"] += [r["route_ok"] for r in P]
        stats["R_P"] += [r["R"] for r in P]
        for i, r in enumerate(P + ctrl):
            in_P, is_anchor = i < len(P), i == 0
            adv = token_advantages(r["mask"], r["n_route"], is_anchor, in_P, A_talent,
                                   A_exec[i] if in_P else 0.0)
            if in_P or args.train_controls:
                rollouts.append(Rollout(r["prompt_ids"], r["ids"], r["mask"], reward=r["R"], adv=adv,
                                        group=first_group + j, info=dict(role="P" if in_P else "control")))
    return rollouts, stats


def skillrl_rollouts(sampler, tok, W, tasks, args, first_group):
    """The SkillRL baseline: G rollouts per task, similarity skills, group advantages (grpo.py fills them)."""
    res = run_episodes(sampler, tok, W, [t for t in tasks for _ in range(args.G)],
                       [dict(talent=None, k=args.K)] * (len(tasks) * args.G), args, args.temperature)
    rs = [Rollout(r["prompt_ids"], r["ids"], r["mask"], reward=r["R"], group=first_group + k // args.G)
          for k, r in enumerate(res)]
    return rs, dict(R_P=[r["R"] for r in res])


def evolve_skillbank(sampler, tok, W, val_outcomes, args, dist):
    """SkillRL's library update: a task type below --evolve-threshold shows its failures to the model, whose
    proposed skills join the bank, linked to the talent the failures were routed to. val_outcomes: every
    rank's, on every rank; each rank proposes for its share of the weak types (on_ranks), in type order on
    one process; the replies are gathered and rank 0's bank update is broadcast."""
    by_type, weak, added = {}, [], []
    for r in val_outcomes:
        by_type.setdefault(r["qtype"], []).append(r)
    for qtype, rs in sorted(by_type.items()):
        if np.mean([r["em"] for r in rs]) >= args.evolve_threshold:
            continue
        fails = [r for r in rs if r["em"] == 0][: args.evolve_failures]
        shown = "\n\n".join(f"Question: {r['question']}\nGold answer: {r['answer']}\n"
                            f"Agent answer: {r['pred']}\nSearches: {r['n_search']}" for r in fails)
        weak.append((qtype, fails, f"These search-agent attempts on '{qtype}' questions failed:\n\n"
                     f"{shown}\n\nPropose at most {args.evolve_max_new} new reusable skills as a JSON list "
                     f'of objects with keys "title", "principle", "when_to_apply".'))
    outs = on_ranks(lambda share: [sampler.generate([chat_ids(tok, [{"role": "user", "content": msg}])], 1,
                                                    args.evolve_max_tokens, 0.0)[0][0].text
                                   for _, _, msg in share], weak, dist)  # one call per type, as before
    for (qtype, fails, _), out in zip(weak, outs):
        talents = [r["talent"] for r in fails if r["talent"] in W.by_id]
        for s in parse_proposed_skills(out)[: args.evolve_max_new]:
            # the section: the bank's own
            s.update(skill_id=f"dyn_{len(W.bank) + len(added) + 1:03d}", category=qtype)
            added.append((s, max(set(talents), key=talents.count) if talents else None))
    added = broadcast_object(added, dist)
    for s, t in added:
        if t in W.by_id:
            W.by_id[t]["skills"].append(s["skill_id"])
    if added:
        W.set_bank(W.bank + [s for s, _ in added], W.bank_raw)
    return len(added)


def parse_proposed_skills(text):
    """Skills from the model's reply: a JSON list (or object) anywhere in it; bad output gives [].

    The candidates are those of the greedy regex \\[.*\\]|\\{.*\\} (the first opener before the last closer
    of its kind, up to that closer; after a candidate that does not parse, the next one from its end), found
    with find and rfind: the regex tried every opener to the end of the text, quadratic in a flood of them."""
    text, pos = text or "", 0
    while True:
        spans = [(text.find(o, pos), text.rfind(c)) for o, c in (("[", "]"), ("{", "}"))]
        spans = [(i, j) for i, j in spans if 0 <= i < j]
        if not spans:
            return []
        i, j = min(spans)
        try:
            obj = json.loads(text[i:j + 1])
        except (ValueError, RecursionError):  # ValueError: also a number past int()'s 4,300 digits
            obj = None
        if obj is None or not usable_value(obj):  # plumbing.usable_value: nested too deep, a lone surrogate
            pos = j + 1
            continue
        items = obj if isinstance(obj, list) else [obj]
        return [dict(title=str(s["title"])[:80], principle=str(s["principle"])[:300],
                     when_to_apply=str(s.get("when_to_apply", ""))[:200])
                for s in items if isinstance(s, dict) and s.get("title") and s.get("principle")]


# ----- evaluation: Tables 1–2, Figure 2a, routing accuracy against c*, the headline -----
def evaluate(sampler, tok, W, tasks, routed, args, dist):
    """Success (EM) and F1 per split, routing validity and the talents selected per split (Figure 2a), greedy
    by default (Table 4 note). Each rank rolls out its share; returns (metrics, every rank's outcomes)."""
    mine = tasks[dist.rank::dist.world]
    cond = dict(talent="policy", k=args.K) if routed else dict(talent=None, k=args.K)
    res = run_episodes(sampler, tok, W, mine, [cond] * len(mine), args, args.eval_temperature,
                       route_temperature=args.eval_temperature) if mine else []
    outcomes = gather_objects([dict(split=r["ep"]["task"]["split"], qtype=r["ep"]["task"]["qtype"],
                                    question=r["ep"]["task"]["question"], answer=r["ep"]["task"]["answer"],
                                    pred=r["ep"]["pred"], n_search=r["ep"]["n_search"],
                                    truncated=r["ep"].get("truncated", False), em=r["em"], f1=r["f1"],
                                    route_ok=bool(r.get("route_ok")), talent=r["talent"] or "none")
                               for r in res], dist)
    tids = [t["talent_id"] for t in W.talents] + ["none"]
    out = {"success": {}, "f1": {}, "talents": {}, "n": {},
           "items": {o["question"]: (o["split"], o["em"]) for o in outcomes},  # per question: paired tests
           "truncated": sum(o["truncated"] for o in outcomes)}
    for name in SPLITS:
        rs = [o for o in outcomes if o["split"] == name]
        n = float(len(rs))
        out["n"][name] = n
        out["success"][name] = 100 * sum(o["em"] for o in rs) / max(n, 1)
        out["f1"][name] = 100 * sum(o["f1"] for o in rs) / max(n, 1)
        per_talent = {t: float(sum(o["talent"] == t for o in rs)) if routed else 0.0 for t in tids}
        out["talents"][name] = {t: c for t, c in per_talent.items() if c}
    sh, mh = [out["success"][k] for k in SINGLE_HOP], [out["success"][k] for k in MULTI_HOP]
    out.update(single_hop=float(np.mean(sh)), multi_hop=float(np.mean(mh)), overall=float(np.mean(sh + mh)),
               route_valid=100 * sum(o["route_ok"] for o in outcomes) / max(len(outcomes), 1)
               if routed else None)
    return out, outcomes


TABLE_COLS = SINGLE_HOP + ["single"] + MULTI_HOP + ["multi", "avg"]  # Table 1-2's column order
ONE_DECIMAL = dict(cell=lambda v: f"{v:.1f}", first="method")


def table_row(r):
    """One method's row of Table 1-2: success per split, single-hop, multi-hop and overall averages."""
    return {**r["success"], "single": r["single_hop"], "multi": r["multi_hop"], "avg": r["overall"]}


def print_routing(title, per):
    """Figure 2a as text: % of each split's test questions routed to each talent (≥ 10 % shown)."""
    print(title)
    for s, v in per.items():
        n = max(sum(v.values()), 1)
        top = sorted(v.items(), key=lambda kv: -kv[1])
        print(f"  {s:<10} " + ", ".join(f"{t.replace('talent_', '')} {100 * c / n:.0f}%"
                                        for t, c in top if c / n >= 0.1))
    print()


METHODS = {"zero-shot": "Zero-shot", "skillrl-sft": "SkillRL-SFT", "talentrl-sft": "TalentRL-SFT",
           "skillrl": "SkillRL", "talentrl": "TalentRL"}


def report(run_dir, results, headline, dist):
    """Every router's routing accuracy vs c*, the trained ones' confusion, Tables 1-2, Figure 2a, headline."""
    if not dist.is_main:
        return
    for labels_key, scored in results.get("routing", {}).get("accuracy", {}).items():
        stats.print_table(f"Routing accuracy vs c* (%), {labels_key.replace('_', '-')} questions (unseen: "
                          f"{', '.join(results['routing']['unseen']) or 'none'})",
                          {name: {p: r[p]["acc"] for p in PARTS} for name, r in scored.items()}, PARTS,
                          first="router")
        for name in (METHODS[k] for k in ("talentrl-sft", "talentrl") if METHODS[k] in scored):
            print(f"{name}, confusion (routed talent: c* counts): " + "; ".join(
                f"{g}: " + ", ".join(f"{c} {n}" for c, n in sorted(row.items()))
                for g, row in sorted(scored[name]["confusion"].items())))
    print()
    stats.print_table("Table 1 (shape): success rate (%) after SFT, and TalentRL after RL",
                      {METHODS[k]: table_row(results[k]) for k in ("zero-shot", "skillrl-sft", "talentrl-sft",
                                                                   "talentrl") if k in results},
                      TABLE_COLS, **ONE_DECIMAL)
    if "skillrl" in results:
        stats.print_table("Table 2 (shape): success rate (%) after RL",
                          {METHODS[k]: table_row(results[k]) for k in ("skillrl", "talentrl")
                           if k in results},
                          TABLE_COLS, **ONE_DECIMAL)
    panels = {f"{METHODS[k]} ({'before' if k.endswith('sft') else 'after'} RL), routing valid "
              f"{results[k]['route_valid']:.0f}%": results[k]["talents"]
              for k in ("talentrl-sft", "talentrl") if k in results}
    for title, per in panels.items():
        print_routing(f"Figure 2a, {title}:", per)
    if panels:
        print(f"Figure 2a: {plot_talents(run_dir, panels)}")
    print("\nHeadline (rates as fractions; paired over questions; --aggregate pools seeds):")
    print(stats.format_headline(headline))
    print(f"Routing on unseen templates beats the strongest no-training router: "
          f"{routing_verdict(headline)['generalises']}")


def route_greedy(sampler, tok, W, tasks, args, dist):
    """{question: greedy talent id, "none" if invalid}: the routing turn alone, each rank its share."""
    mine = tasks[dist.rank::dist.world]
    rp = [chat_ids(tok, [{"role": "user", "content": routing_prompt(t, W.talents)}]) for t in mine]
    check_fits(rp, args.route_max_tokens, args, "routing prompt")
    outs = (sampler.generate(rp, 1, args.route_max_tokens, args.eval_temperature, args.top_p, ["</talent>"])
            if rp else [])
    got = [(t["question"], sample_route(tok, W, s)[1] or "none") for t, (s,) in zip(mine, outs)]
    return dict(gather_objects(got, dist))


# the routers that need no training (tasks/search_world.py), in the order that breaks ties for the strongest
NO_TRAINING = ("template-lookup", "qtype-majority", "nearest-description", "majority")
PARTS = ("all", "seen", "unseen")  # the held-out questions of all templates, of seen ones, of unseen ones


def routers_scored(results, labels_key):
    """routing_accuracy vs the c* of `labels_key` ("held_out", "train"): no-training and trained routers."""
    lab = results.get("routing", {})
    routers = dict(lab.get("baselines", {}).get(labels_key, {}))
    if labels_key == "train":  # the SFT tasks: TalentRL-SFT's greedy routes of its own training tasks
        routers[METHODS["talentrl-sft"]] = lab.get("train_routes")
    else:
        routers.update({METHODS[k]: results.get(k, {}).get("routes") for k in ("talentrl-sft", "talentrl")})
    return {name: routing_accuracy(lab[labels_key], r, lab.get("unseen", []))
            for name, r in routers.items() if r and lab.get(labels_key)}


def routing_entries(results):
    """The routing claims: per trained router and part (all, seen, unseen templates) its per-question hits
    against those of the strongest no-training router on the same questions, the majority router's accuracy
    as the chance level. "Strongest" is chosen on these very questions: it favours the baseline."""
    H = []
    for labels_key, where, parts in (("held_out", "held-out", PARTS),
                                     ("train", "SFT tasks", ("all",))):
        scored = routers_scored(results, labels_key)
        chance = scored.get("majority", {})  # the majority router's accuracy: the trivial solution
        for key in ("talentrl-sft", "talentrl"):
            for part in parts if METHODS[key] in scored else ():
                base = [n for n in NO_TRAINING if n in scored and scored[n][part]["n"]]
                if not base or not scored[METHODS[key]][part]["n"]:
                    continue
                best = max(base, key=lambda n: scored[n][part]["acc"])  # the first of NO_TRAINING among ties
                H.append(stats.compare(f"routing accuracy vs c*, {where}, {part} templates: {METHODS[key]} "
                                       f"vs the strongest no-training router", METHODS[key],
                                       "strongest no-training router", scored[METHODS[key]][part]["hits"],
                                       scored[best][part]["hits"], chance=chance.get(part, {}).get("acc"),
                                       primary=where == "held-out" and part == "unseen"))
                H[-1]["strongest"] = best  # per run; --aggregate pools each seed's strongest
    return H


def routing_verdict(headline):
    """Issue #50's check: a trained router "beats" the strongest no-training router on a part when the 95 %
    CI of their difference lies above 0. TalentRL's routing (after RL; without RL, TalentRL-SFT's)
    generalises only if it beats it on the questions of unseen templates."""
    v = {e["claim"]: "beats" if (e["ci95"][0] or 0) > 0 else "does not beat" for e in headline
         if e["claim"].endswith("the strongest no-training router")}
    unseen = sorted((c for c in v if "held-out, unseen" in c), key=lambda c: "TalentRL vs" not in c)
    return dict(parts=v, generalises=bool(unseen) and v[unseen[0]] == "beats")


def build_headline(results):
    """results.json's headline (stats.py): each claim with both means, the paired difference, 95 % CI, p
    and n; per-question items are kept so that --aggregate pools questions × seeds."""
    H = routing_entries(results)
    # the paper's Qwen2.5-7B success gains, as fractions: Table 1 (§5.2: average +3.13 %, Bamboogle +8.80 %);
    # Table 2 − Table 1 (TalentRL 43.13 % − TalentRL-SFT 34.72 %); §5.3: TalentRL − SkillRL after RL +1.23 %
    paper = {("talentrl-sft", "skillrl-sft", "all"): 0.0313,
             ("talentrl-sft", "skillrl-sft", "bamboogle"): 0.088,
             ("talentrl", "talentrl-sft", "all"): 0.0841, ("talentrl", "skillrl", "all"): 0.0123}
    for a, b in (("talentrl-sft", "skillrl-sft"), ("talentrl", "skillrl"), ("talentrl", "talentrl-sft"),
                 ("talentrl-sft", "zero-shot")):
        if a not in results or b not in results:
            continue
        for split in ["all"] + list(SPLITS):
            qs = [q for q, (sp, _) in results[a]["items"].items()
                  if split in ("all", sp) and q in results[b]["items"]]
            H.append(stats.compare(f"success, {split}: {METHODS[a]} vs {METHODS[b]}", METHODS[a], METHODS[b],
                                   [results[a]["items"][q][1] for q in qs],
                                   [results[b]["items"][q][1] for q in qs],
                                   paper_effect=paper.get((a, b, split)),
                                   primary=split == "all" and b != "zero-shot"))
    if A := results.get("talentrl", {}).get("A_talent_groups"):
        H.append(stats.vs_chance("RL groups with Â_talent ≠ 0 (share)", "TalentRL",
                                 [float(x != 0) for x in A], 0.0))
        H.append(stats.vs_chance("|Â_talent| per RL group (mean)", "TalentRL", [abs(x) for x in A], 0.0))
    return H


def aggregate_seeds(run_dirs):
    """--aggregate: the headline pooled over the runs' questions × seeds (stats.aggregate: CI, p, n), the same
    claims with seeds as the unit, Table 1-2 as mean ± sd of the per-seed success rates, the routing check."""
    entries = stats.aggregate_main(run_dirs)
    runs = [json.loads((Path(d) / "results.json").read_text()) for d in run_dirs]
    rows = {}
    for k in ("zero-shot", "skillrl-sft", "talentrl-sft", "skillrl", "talentrl"):
        vals = [table_row(r[k]) for r in runs if k in r and "success" in r[k]]
        if vals:
            rows[f"{METHODS[k]} (n={len(vals)})"] = {c: stats.mean_sd([v[c] for v in vals])
                                                     for c in TABLE_COLS}
    stats.print_table(f"Table 1 over {len(runs)} seeds: success rate (%), mean ± sd (sd: nan for one seed)",
                      rows, TABLE_COLS, cell=lambda v: f"{v[0]:.1f}±{v[1]:.1f}", first="method")
    seeds = stats.aggregate_by_seed(run_dirs)  # the same claims, each seed's means paired over the seeds
    print("\nSeeds as the unit (each seed's mean of A and of B):\n" + stats.format_headline(seeds))
    v = dict(pooled=routing_verdict(entries), seeds=routing_verdict(seeds))
    print(f"\nRouting on unseen templates beats the strongest no-training router: pooled "
          f"{v['pooled']['generalises']}, seeds as the unit {v['seeds']['generalises']}\n")
    tiny, gpu, rt = PRESETS["tiny"], PRESETS["gpu"]["eval_n"], [e for e in entries if "routing" in e["claim"]]
    print(stats.format_power(rt, gpu / max(tiny["eval_n"], tiny["route_eval_n"])), stats.format_power(
        [e for e in entries if e not in rt], gpu / tiny["eval_n"]), sep="\n")
    em = [e for r in runs for _, e in r.get("talentrl", {}).get("items", {}).values()]
    if em and not any("skillrl" in r for r in runs):  # the SkillRL baseline: --arms skillrl talentrl
        m = stats.mde(len(em), p0=float(np.mean(em)), two_proportions=True)  # pairing lowers it
        print(f"TalentRL vs SkillRL (Table 2), not in these runs (--arms skillrl talentrl): n = {len(em)}, "
              f"TalentRL's success {np.mean(em):.3f}, two independent proportions' mde {m:.3f}; paper 0.0123")
    return dict(headline=entries, by_seed=seeds, rows=rows, verdict=v)


# ----- plumbing: prompt budgets, results.json -----
def check_fits(prompts, max_new, args, what):
    """An over-long prompt is an error, never an engine's silent empty completion (invalid, R = 0)."""
    if over := [len(p) for p in prompts if len(p) + max_new > args.max_model_len]:
        raise ValueError(f"talentrl: {len(over)} {what}(s) of up to {max(over)} tokens + {max_new} new "
                         f"tokens exceed --max-model-len {args.max_model_len}: raise it or lower --K")


def save_results(run_dir, results, dist):
    if dist.is_main:  # the headline is written once, at the end
        stats.write_results(run_dir, results, [])


# ----- main -----
def main(argv=None):
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="talentrl")
    if args.aggregate:
        return aggregate_seeds(args.aggregate)
    check_args(args)
    check_resume(args)  # --resume with the run's own settings, or one line naming the changed flags
    dist = setup_distributed()
    per_rank(args.prompts_per_step, dist, "--prompts-per-step")  # l.17: every rank owns whole tasks
    teacher = args.teacher not in ("scripted", "policy")  # an HF model: a frozen copy, generating with HF
    preflight(args, dist, frozen=1 + teacher, hf=teacher)  # and π_ref (Alg. 1 l.14)
    seed_everything(args.seed + dist.rank)
    t_start, run_dir, results = time.time(), Path(args.run_dir), {"phase_seconds": {}}  # --resume: ckpts
    say = phase_logger(results, dist, t_start)

    def evaluate_as(key, routed):  # Table 1-2's row `key` on the held-out questions, saved at once
        results[key] = {**results.get(key, {}), **evaluate(sampler, tok, W, test, routed, args, dist)[0]}
        if routed:  # routing vs c*: the greedy routing turn of every --route-eval-n question (Eq. 4)
            results[key]["routes"] = route_greedy(sampler, tok, W, route_test, args, dist)
        save_results(run_dir, results, dist)
        r = results[key]
        return (f"{key}: success {r['overall']:.1f}% (single-hop {r['single_hop']:.1f}, "
                f"multi-hop {r['multi_hop']:.1f})"
                + (f", routing valid {r['route_valid']:.0f}%" if routed else ""))

    # Algorithm 1's inputs: environment ℰ, talent catalog 𝒯, SkillBank 𝒮, disjoint 𝒟_sft and 𝒟_rl, π_0
    W = World(args, load_embedder())
    init_bank, init_talents = copy.deepcopy((W.bank, W.bank_raw)), copy.deepcopy(W.talents)
    train = [q for s in SPLITS for q in W.questions[s]["train"]]
    random.Random(args.seed).shuffle(train)
    sft_tasks, rl_tasks = split_pools(train, args.sft_tasks, args.unseen_templates)
    test = [q for s in SPLITS for q in W.questions[s]["test"][:args.eval_n]]
    route_test = [q for s in SPLITS for q in W.questions[s]["test"]]  # max(--eval-n, --route-eval-n) each
    model, tok = load_policy(args, dist)
    sampler = make_sampler(args, model, tok, dist)
    pi_0 = cpu_snapshot(model)  # snapshots on the CPU: no GPU memory per copy
    per_type = ", ".join(f"{k} {v}" for k, v in sorted(Counter(t["qtype"] for t in sft_tasks).items()))
    say(f"world: {len(W.passages)} passages, {len(W.bank)} skills, {len(W.talents)} talents; "
        f"{len(sft_tasks)} SFT ({per_type}) / {len(rl_tasks)} RL / {len(test)} test tasks", phase="load")
    if args.zero_shot:  # the backbone with SkillRL's prompt (similarity skills, no talent)
        say(evaluate_as("zero-shot", False), phase="zero-shot")

    # Phase I (l.4-12): 𝒟_talent from paired teacher rollouts; the original rows: the successful references
    rows, results["sft_data"] = phase1_data(sampler, tok, W, sft_tasks, args, dist)
    st = results["sft_data"]
    # c* of the held-out questions by the same teacher and Eq. (8): the labels routing is scored against
    held = phase1_data(sampler, tok, W, route_test, args, dist)[1]["labels"]
    # the routers that need no training, built from the SFT tasks' c* alone, route the same questions
    routers = no_training_routers(st["labels"], W.description_similarity, [t["talent_id"] for t in W.talents])
    results["routing"] = dict(train=st["labels"], held_out=held, unseen=args.unseen_templates,
                              baselines={k: {name: {x["question"]: r(x) for x in labels}
                                             for name, r in routers.items()}
                                         for k, labels in (("train", st["labels"]), ("held_out", held))})
    say(f"kept {st['kept']}/{len(sft_tasks)} tasks (ū_c* > 0), {st['original_rows']} original rows; c* per "
        f"type {st['chosen_by_qtype']}; held-out c* for {len(held)}/{len(route_test)}", phase="phase I")
    sets = sft_sets(rows, args.talent_sft_init, args.sft_epochs, args.route_epochs, args.exec_epochs,
                    args.sft_match)
    skillrl_sft = None  # l.13, Eq. (9): SkillRL-SFT from π_0 on the original rows alone (Table 1's baseline)
    if "skillrl" in args.arms:
        results["skillrl-sft"] = phase1_sft(model, sampler, tok, pi_0, sets["skillrl-sft"],
                                            run_dir / "skillrl-sft", args, dist)
        say(evaluate_as("skillrl-sft", False), phase="SkillRL-SFT")
        skillrl_sft = cpu_snapshot(model)
    # l.13, Eq. (9): TalentRL-SFT from π_0, or from SkillRL-SFT with --talent-sft-init skillrl-sft
    init = skillrl_sft if args.talent_sft_init == "skillrl-sft" else pi_0
    results["talentrl-sft"] = phase1_sft(model, sampler, tok, init, sets["talentrl-sft"],
                                         run_dir / "talentrl-sft", args, dist)
    msg = evaluate_as("talentrl-sft", True)
    # the diagnosis of issue #28: can the SFT router route its own training tasks (underfitting) and new ones?
    results["routing"]["train_routes"] = route_greedy(sampler, tok, W, st["labels"], args, dist)
    save_results(run_dir, results, dist)
    say(msg, phase="TalentRL-SFT")
    talentrl_sft = cpu_snapshot(model)

    # Phase II (l.14-23, Eq. 10-15) from TalentRL-SFT; SkillRL's GRPO from SkillRL-SFT as the RL baseline
    for arm in args.arms:
        routed = arm == "talentrl"
        W.set_bank(*copy.deepcopy(init_bank))
        W.set_talents(copy.deepcopy(init_talents))
        restore_snapshot(model, talentrl_sft if routed else skillrl_sft)
        A_groups = phase2_rl(routed, Policy(model, sampler, tok), W, rl_tasks, run_dir / arm, args, dist)
        msg = evaluate_as(arm, routed)
        if routed:
            results[arm]["A_talent_groups"] = A_groups
        say(msg, phase=f"{arm} RL")

    # Tables 1-2, Figure 2a, routing accuracy against c* and the headline (stats.py)
    results["wall_seconds"] = time.time() - t_start
    results["routing"]["accuracy"] = {k: routers_scored(results, k) for k in ("held_out", "train")}
    headline = build_headline(results)
    results["routing"]["verdict"] = routing_verdict(headline)
    if dist.is_main:
        stats.write_results(run_dir, results, headline)
    report(run_dir, results, headline, dist)
    say(f"results: {run_dir / 'results.json'}")
    return {**results, "headline": headline}


if __name__ == "__main__":
    run_main(main)  # main(); a package not installed: one line; under torchrun exit_ranks (plumbing)
