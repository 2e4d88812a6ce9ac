"""
talentrl.py — TalentRL: Strategy-Guided Reinforcement Learning for Hierarchical
Skill Routing (Sun et al., arXiv 2610.41143), over the shared GRPO in grpo.py.

A policy first routes each task to a *talent* (a coarse strategy: description
d_c, guidance g_c, associated skills ℳ(c)); the talent softly re-ranks the
skills retrieved from a SkillBank (Eq. 5–6) and guides execution (Eq. 7) in a
Search-R1 style search environment. Phase I builds talent-aware SFT data from
paired rollouts (Eq. 8–9); phase II trains routing with matched-intervention
contrasts (Eq. 11–13) and execution with group-relative advantages (Eq. 10),
token by token (Eq. 14), through the clipped, KL-regularised loss (Eq. 15).

    python talentrl.py --preset tiny                             # 2-core CPU: 10-12 min per seed in bf16, ~16 in fp32 (README)
    python talentrl.py --aggregate runs/talentrl-s0 runs/talentrl-s1 runs/talentrl-s2   # Table 1, mean ± sd
    torchrun --nproc_per_node=2 talentrl.py --preset tiny         # the same on 2 CPU ranks (gloo)
    torchrun --nproc_per_node=8 talentrl.py --preset paper        # Table 4 settings (GPUs)

Glossary: x task, 𝒯 talent catalog, c a talent, c* the SFT-selected talent,
𝒮 SkillBank, q(x, s) cosine similarity, ℛ(x) recall pool, λ talent bonus, K
skill budget, k reduced budget, τ trajectory, R(τ) return, u_{c,r} utility,
𝒫 anchor + ordinary rollouts, δ_ℓ contrasts (ℓ = skill, budget, talent),
η dead zone, α scale, κ clip bound, w_ℓ contrast weights.

Differences from the paper:
1. Search7 and its Wikipedia corpus are not offline: a seeded fictional encyclopedia with seven question
   types in seven splits named after Search7's (`SPLITS`). RL trains on `nq` + `hotpotqa` (paper: NQ + HotpotQA);
   phase I draws round-robin over the seven question types of all splits' train questions (paper: SkillRL's SFT split).
2. Retriever and skill embedder: all-MiniLM-L6-v2 (paper: E5-style retrieval, Qwen3-Embedding-0.6B).
3. Table 5's guidance texts and talent–skill links and Table 6's skills are rewritten for this world
   (data/talentrl/); the 26 skill ids and the eight talents are the paper's.
4. Phase I teacher (paper: GPT-5.5 or an SFT student): `--teacher scripted` (default) is a search agent in
   Python that answers only from the passages it read, naive without a talent; each talent adds the move its
   questions need (`TEACHER`), so Eq. (8) can choose every talent. `--teacher policy | PATH`: policy, HF model.
5. "8 rollouts per task" is |𝒫| = G = 8 (anchor + 7 ordinary) plus the three matched controls, which stay in
   the batch with zero advantage (KL, N of Eq. 15); `--no-train-controls` drops them.
6. The no-skill and reduced-context controls repeat the anchor's routing response; the no-prior control has
   no routing turn (SkillRL's prompt). An invalid anchor route gets Â_talent = 0.
7. SkillBank evolution follows SkillRL (NOTES §4), validated on a slice of the RL pool (every rank's share,
   gathered); rank 0's policy proposes the skills (at 135M almost none parse), each tied to the talent its
   failures were routed to.
8. KL and aggregation are grpo.py's: k3 estimator, token mean over the batch (N = Σ m_{i,t}, Eq. 15); the ε of
   Eq. (10) is --adv-eps.
9. Tables 1–2 compare this script's five methods only (no CoSkill, SAGE, Skill1, ReSkill); SFT sets are small.
10. MiniLM's cosines are lower than Qwen3-Embedding's: `tiny` uses threshold 0 and K = 3 (paper: 0.2, 5),
   drops the controls from the loss and uses larger learning rates (SFT 1e-4, RL 1e-5).
11. The return is the exact match alone (App. D.2); `--invalid-penalty` adds SkillRL's penalty per invalid
   action. Evaluation is greedy in routing and execution.
12. Phase I ties in ū_c are broken by mean return, success rate, fewer searches, then the talent whose d_c is
   closest to the question (MiniLM cosine).
13. Table 1's SFT rows: SkillRL-SFT on the successful reference rollouts from π_0; TalentRL-SFT on those + 𝒟_talent
   from π_0 (Search7, default) or, in `tiny`, on 𝒟_talent from SkillRL-SFT (ALFWorld, `--talent-sft-init`).
   `tiny` skips the SkillRL RL arm.
14. App. C's rows: a talent-selection row per kept task and one multi-turn execution row (paper: one ReAct row per
   action), each with its own epochs (`--route-epochs`, `--exec-epochs`; `tiny`: 3 and 1, original rows 1; with
   0 execution rows the routed policy answered 0/42 held-out questions, README TalentRL).
   Rationales: a template naming what the question asks in its own words (`GISTS`), then the talent's move
   (paper: written by the teacher LLM).
15. Routing is scored against c* of held-out questions, labelled by the same teacher and Eq. (8), beside the
   majority-class router (the most frequent c* of phase I); the SFT tasks are routed greedily too (underfitting).
16. `--route-temperature` other than `--temperature` is refused while RL trains: grpo_update log-probes every token
   at one temperature. An over-long prompt is an error; a context full before an answer ends the episode (logged).
"""
import argparse
import copy
import json
import random
import re
import string
import sys
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

import stats

from grpo import (Rollout, add_grpo_args, all_reduce_sum, broadcast_object, chat_ids, gather_objects, group_advantages,
                  grpo_update, make_optimizer, multi_turn_rollouts, parse_with_preset, reduce_metrics, seed_everything,
                  setup_distributed, sft_loop)
from plumbing import (HFSampler, cpu_snapshot, exit_ranks, frozen_copy, load_checkpoint, load_embedder, load_model, load_policy,
                      log_metrics, make_sampler, plot_curves, restore_snapshot, resume_checkpoint, save_checkpoint, unwrap)

# ----- config -----
DATA = Path(__file__).resolve().parent / "data" / "talentrl"

PRESETS = {
    # 2-core CPU, embedded SmolLM2-135M, a small world: a few tasks per stage (README, "Measured": 15.7 min per seed
    # in fp32, 10-12 in bf16); rollouts on vLLM (`auto`: HF generate if vLLM cannot start) with a KV cache for 32
    # sequences, so that every turn of the 42 held-out episodes reuses its cached prefix (8: 150 s per routed
    # evaluation in fp32, 32: 67 s, the same outputs)
    "tiny": dict(n_people=40, n_places=16, n_orgs=10, n_events=10, n_hamlets=12, n_shared=6, n_train=60, n_test=6,
                 sim_threshold=0.0, K=3, sft_tasks=70, sft_n=1, sft_batch=4, sft_lr=1e-4,
                 sft_epochs=1, route_epochs=3, exec_epochs=1, talent_sft_init="skillrl-sft",
                 arms=["talentrl"], rl_steps=2, tasks_per_step=2, G=4, train_controls=False, lr=1e-5,
                 max_new_tokens=64, route_max_tokens=64, micro_batch=4,
                 evolve_every=0, val_tasks=4, evolve_max_tokens=48, sampler="auto", vllm_kv_seqs=32),
    # Table 4 (the flag defaults) on GPUs, rollouts on vLLM
    "paper": dict(sampler="vllm", max_model_len=8192),  # Table 4: maximum sequence length 8,192
}


def build_parser():
    p = argparse.ArgumentParser(description="TalentRL on an offline fictional search world.")
    add_grpo_args(p)
    p.set_defaults(beta=0.01, max_new_tokens=512)  # Table 4: KL 0.01; App.: up to 512 tokens per response
    g = p.add_argument_group("world (offline stand-in for Search7)")
    g.add_argument("--n-people", type=int, default=2000, help="people in the fictional encyclopedia (paper scale: 2000)")
    g.add_argument("--n-places", type=int, default=400, help="towns (paper scale: 400)")
    g.add_argument("--n-orgs", type=int, default=400, help="organisations (paper scale: 400)")
    g.add_argument("--n-events", type=int, default=300, help="events (paper scale: 300)")
    g.add_argument("--n-hamlets", type=int, default=600, help="long-tail entities (hamlets) (paper scale: 600)")
    g.add_argument("--n-shared", type=int, default=150, help="deliberate name collisions (disambiguation) (paper scale: 150)")
    g.add_argument("--n-train", type=int, default=3000,
                   help="train questions per split; RL draws from nq + hotpotqa's, phase I from all seven (paper scale: 3000)")
    g.add_argument("--n-test", type=int, default=500, help="held-out test questions per split (7 splits) (paper scale: 500)")
    g.add_argument("--topk-docs", type=int, default=3, help="passages per search (Search-R1: 3)")
    g.add_argument("--max-steps", type=int, default=4, help="maximum interaction steps (Table 4: 4)")
    g.add_argument("--invalid-penalty", type=float, default=0.0,
                   help="return penalty per invalid action (App. D.2: none, the task score alone; SkillRL: small)")
    g = p.add_argument_group("talents and retrieval (§3.2, Table 4)")
    g.add_argument("--skillbank", default=str(DATA / "skillbank.json"), help="SkillBank in SkillRL's JSON format")
    g.add_argument("--talents", default=str(DATA / "talents.json"), help="talent catalog 𝒯 (App. B)")
    g.add_argument("--K", type=int, default=5, help="K, execution skill budget, Eq. (1)/(6) (Table 4: 5)")
    g.add_argument("--recall", type=int, default=20, help="|ℛ(x)|, similarity recall size (Table 4: 20)")
    g.add_argument("--sim-threshold", type=float, default=0.2, help="similarity threshold of ℛ(x) (Table 4: 0.2)")
    g.add_argument("--lam", type=float, default=0.3, help="λ, talent-prior bonus, Eq. (5) (Table 4: 0.3)")
    g.add_argument("--route-max-tokens", type=int, default=256, help="tokens of the routing response (paper scale: 256)")
    g.add_argument("--route-temperature", type=float, default=None,
                   help="routing temperature in RL (default: --temperature; another value is refused while RL trains, "
                        "since grpo_update log-probes every token at --temperature)")
    g.add_argument("--eval-temperature", type=float, default=0.0, help="routing and execution temperature at evaluation (Table 4 note: deterministic)")
    g = p.add_argument_group("phase I: talent-aware SFT (§3.3)")
    g.add_argument("--teacher", default="scripted", help="who rolls out SFT trajectories: scripted | policy | model path")
    g.add_argument("--sft-tasks", type=int, default=2000, help="|𝒟_sft|, tasks taken from the train splits (paper scale: 2000)")
    g.add_argument("--sft-n", type=int, default=3, help="n, rollouts per talent and reference rollouts per task (App. A: 3)")
    g.add_argument("--sft-epochs", type=int, default=2, help="SFT epochs over the original (SkillRL) rows (Table 4: 2)")
    g.add_argument("--route-epochs", type=int, default=2,
                   help="SFT epochs over App. C's talent-selection rows (paper: the SFT epochs, 2)")
    g.add_argument("--exec-epochs", type=int, default=2,
                   help="SFT epochs over App. C's talent-conditioned execution rows (paper: the SFT epochs, 2)")
    g.add_argument("--sft-batch", type=int, default=16, help="SFT effective batch size (Table 4: 16)")
    g.add_argument("--sft-lr", type=float, default=1e-5, help="SFT learning rate (Table 4: 1e-5)")
    g.add_argument("--talent-sft-init", choices=["pi0", "skillrl-sft"], default="pi0",
                   help="TalentRL-SFT: original + talent rows from π_0 (Search7, §5.3) or talent rows on SkillRL-SFT (ALFWorld)")
    g.add_argument("--zero-shot", action=argparse.BooleanOptionalAction, default=True, help="evaluate π_0 (Table 1's reference row)")
    g = p.add_argument_group("phase II: matched-intervention RL (§4)")
    g.add_argument("--rl-steps", type=int, default=200, help="policy updates (Table 4: 200)")
    g.add_argument("--tasks-per-step", type=int, default=64, help="task batch size over all ranks (Table 4: 64)")
    g.add_argument("--k-reduced", type=int, default=2, help="k, reduced skill budget of τ_k (Table 4: 2)")
    g.add_argument("--eta", type=float, default=0.1, help="η, dead-zone threshold, Eq. (11) (Table 4: 0.1)")
    g.add_argument("--alpha", type=float, default=2.0, help="α, routing-advantage scale, Eq. (13) (Table 4: 2.0)")
    g.add_argument("--kappa", type=float, default=2.0, help="κ, routing-advantage clip, Eq. (13) (Table 4: 2.0)")
    g.add_argument("--contrast-weights", type=float, nargs=3, default=[1.0, 1.0, 1.0],
                   help="w_skill w_budget w_talent of Eq. (13), normalised to sum 1 (paper: equal)")
    g.add_argument("--train-controls", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the matched controls in the loss batch with zero advantage (Eq. 14)")
    g.add_argument("--arms", nargs="*", default=["skillrl", "talentrl"], choices=["skillrl", "talentrl"],
                   help="RL runs: TalentRL from TalentRL-SFT, the SkillRL baseline from SkillRL-SFT (Table 2)")
    g = p.add_argument_group("SkillBank evolution (SkillRL, NOTES §4)")
    g.add_argument("--evolve-every", type=int, default=10, help="validate and evolve the bank every N RL steps (0: never; paper scale: 10)")
    g.add_argument("--val-tasks", type=int, default=256, help="validation tasks for evolution (paper scale: 256)")
    g.add_argument("--evolve-threshold", type=float, default=0.4, help="task types below this success get new skills (SkillRL: 0.4)")
    g.add_argument("--evolve-failures", type=int, default=10, help="failed trajectories shown per task type (SkillRL: 10)")
    g.add_argument("--evolve-max-new", type=int, default=3, help="new skills per task type at most (SkillRL: 3)")
    g.add_argument("--evolve-max-tokens", type=int, default=512, help="tokens of the skill proposal (paper scale: 512)")
    return p


# ----- rewards -----
def normalize_answer(s):
    """SQuAD / Search-R1 normalisation: lower case, no punctuation, no articles."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(pred, gold):
    return float(pred is not None and normalize_answer(pred) == normalize_answer(gold))


def f1_score(pred, gold):
    p, g = normalize_answer(pred or "").split(), normalize_answer(gold).split()
    common = sum(min(p.count(w), g.count(w)) for w in set(p))
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def episode_return(ep, invalid_penalty):
    """R(τ): exact match of the normalised answer minus a penalty per invalid action."""
    return exact_match(ep["pred"], ep["task"]["answer"]) - invalid_penalty * ep["n_invalid"]


# ----- rollout -----
# Eq. (4): c ~ π_θ(· | x, 𝒯): the routing response is `<think>…</think><talent>id</talent>`
ROUTE_RE = re.compile(r"^\s*<think>(.+?)</think>\s*<talent>\s*([A-Za-z0-9_]+)\s*</talent>\s*$", re.S)


def parse_route(text, talent_ids):
    """Strict parse of the routing response; None (fall back to no talent) when
    the format is broken or the id is not in the catalog."""
    m = ROUTE_RE.match(text or "")
    if m is None or not m.group(1).strip() or m.group(2) not in talent_ids:
        return None
    return m.group(2)


def retrieve_skills(sims, assoc, K, recall, threshold, lam):
    """Indices of the skills given to execution.
    sims: (S,) cosine similarities q(x, s); assoc: set of skill indices ℳ(c)
    (empty for no talent, which gives the similarity-only Eq. (1))."""
    # candidate pool ℛ(x): the `recall` most similar skills above the threshold
    order = sorted(range(len(sims)), key=lambda i: -float(sims[i]))[:recall]
    pool = [i for i in order if float(sims[i]) >= threshold]
    # Eq. (5): q̃(x, s | c) = q(x, s) + λ·𝕀[s ∈ ℳ(c)],  s ∈ ℛ(x)
    q_tilde = {i: float(sims[i]) + lam * (i in assoc) for i in pool}
    # Eq. (6): 𝒮_K(x, c) = TopK_{s ∈ ℛ(x)} q̃(x, s | c); without a talent this is Eq. (1): TopK q(x, s)
    return sorted(pool, key=lambda i: -q_tilde[i])[:K]


def routing_prompt(task, talents):
    catalog = "\n".join(f"- {t['talent_id']}: {t['description']}" for t in talents)
    return (f"Question: {task['question']}\n\nBefore answering, choose the talent (strategy) that "
            f"fits this question best:\n{catalog}\n\nReply with a short reason in <think>...</think> "
            f"followed by the talent id in <talent>...</talent>.")


def execution_context(task, talent, skills, route_given):
    """The execution context of Eq. (7): guidance g_c and skills 𝒮_K(x, c). With
    `route_given` it follows the routing turn in the same conversation."""
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


GISTS = (  # (question pattern, what the routing rationale says the question asks), first match wins
    (r"In what year was (.+?), the (\w+), born\?", "asks when {0}, the {1}, was born: a name several people may share"),
    (r"Where was (.+?), the (\w+), born\?", "asks where {0}, the {1}, was born: a name several people may share"),
    (r"Whose creator was born first, (.+) or (.+)\?", "compares the creators of {0} and {1}"),
    (r"In what year was the founder of the (.+) born\?", "asks about the founder of the {0}, not about the {0} itself"),
    (r"Where was the creator of the [\w ]+? (The .+) born\?", "asks about the creator of {0}, not about {0} itself"),
    (r"In which country did the (.+) take place\?", "asks about the town where the {0} took place"),
    (r"How old was the creator of (.+) in the year it was released\?", "asks for an age: the year of {0} minus its creator's birth year"),
    (r"How many years after .+ was the (.+) founded\?", "asks for a difference of two founding years, of the {0} and its town"),
    (r"Who was born first, (.+) or (.+)\?", "compares when {0} and {1} were born"),
    (r"Which was founded earlier, the (.+) or the (.+)\?", "compares when the {0} and the {1} were founded"),
    (r"Which town has the larger population, (.+) or (.+)\?", "compares the populations of {0} and {1}"),
    (r"Which ([\w ]+?) by (.+) was released in (\d+)\?", "asks for the {0} by {1} with a condition, released in {2}"),
    (r"What is the population of (.+)\?", "asks for a number, the population of {0}"),
    (r"Which river flows past the hamlet of (.+)\?", "asks for the river of the hamlet of {0}, a rare name"),
    (r"At what elevation, in metres, lies the hamlet of (.+)\?", "asks for the elevation of the hamlet of {0}, a rare name"),
    (r"In what year was (.+) born\?", "asks for one fact, the birth year of {0}"),
    (r"Where was (.+) born\?", "asks for one fact, the birthplace of {0}"),
    (r"Who created the ([\w ]+?) (The .+)\?", "asks for one fact, who created the {0} {1}"),
    (r"Where is the (.+) headquartered\?", "asks for one fact, where the {0} is headquartered"),
    (r"In which country is the town of (.+)\?", "asks for one fact, the country of {0}"),
    (r"Where did the (.+) take place\?", "asks for one fact, where the {0} took place"),
)


def rationale(question, talent):
    """App. C's task-grounded routing rationale: what this question asks (from its own words), then the
    move of the talent. A fixed sentence per talent left the choice to 1-3 ungrounded tokens (issue #28)."""
    for rx, gist in GISTS:
        if m := re.fullmatch(rx, question):
            return f"The question {gist.format(*m.groups())}, so {talent['rationale']}."
    return f"The question asks: {question} So {talent['rationale']}."


def route_target(talent, task):
    """SFT routing target for a task: its grounded rationale in <think> and the talent id."""
    return f"<think>{rationale(task['question'], talent)}</think><talent>{talent['talent_id']}</talent>"


def turn_suffix_ids(tok, user_text):
    """Ids that close the assistant's routing turn, open a user turn carrying
    `user_text` (the execution context) and open the next assistant turn."""
    mark = "<<ROUTE>>"
    full = tok.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": mark},
                                    {"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(full.split(mark, 1)[1], add_special_tokens=False)


def condition_prompt(W, tok, task, cond, route_ids=None):
    """Prompt ids for execution under a condition:
    cond = dict(talent=id|None, k=skills given, prior=bonus on, guidance=on)."""
    talent = W.by_id.get(cond.get("talent")) if cond.get("talent") else None
    skills = W.skills_for(task, talent, cond["k"], cond.get("prior", True)) if cond["k"] > 0 else []
    guided = talent if cond.get("guidance", True) else None
    # Eq. (7): a_j ~ π_θ(· | h_{j−1}, g_c, 𝒮_K(x, c)): guidance and skills precede the history
    if route_ids is None:  # no routing turn: SkillRL's protocol
        return chat_ids(tok, [{"role": "user", "content": execution_context(task, guided, skills, False)}]), skills
    rp = chat_ids(tok, [{"role": "user", "content": routing_prompt(task, W.talents)}])
    return rp + route_ids + turn_suffix_ids(tok, execution_context(task, guided, skills, True)), skills


def sample_route(tok, W, sample):
    """(routing ids, parsed talent id or None) of one sampled routing response."""
    ids = [t for t in sample.ids if t != tok.eos_token_id]  # the chat template closes the turn itself
    return ids, parse_route(tok.decode(ids, skip_special_tokens=True), set(W.by_id))


def run_episodes(sampler, tok, W, tasks, conds, args, temperature, route_temperature=None):
    """Roll out one episode per (task, condition). cond["talent"] == "policy"
    means the policy routes first (Eq. 4) and the rollout then holds both the
    routing tokens and the execution tokens; an unparsable route falls back to
    no talent. Returns dicts with the episode, its ids/mask for training and n_route.
    temperature: execution; route_temperature: routing (None: --route-temperature, else `temperature`)."""
    rp = [chat_ids(tok, [{"role": "user", "content": routing_prompt(t, W.talents)}]) for t in tasks]
    routed = [i for i, c in enumerate(conds) if c.get("talent") == "policy" and "route" not in c]
    route = {i: c["route"] for i, c in enumerate(conds) if "route" in c}  # routes sampled by the caller
    if routed:
        route_t = route_temperature if route_temperature is not None else (
            args.route_temperature if args.route_temperature is not None else temperature)
        check_fits([rp[i] for i in routed], args.route_max_tokens, args, "routing prompt")
        outs = sampler.generate([rp[i] for i in routed], 1, args.route_max_tokens, route_t, args.top_p, ["</talent>"])
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
        execs = multi_turn_rollouts(sampler, tok, prompts, lambda j, text: env_reply(eps[j], text, W.search, args.max_steps),
                                    args.max_steps, args, stop=["</search>", "</answer>"], temperature=temperature,
                                    max_tokens=args.max_model_len - args.max_new_tokens)
        for ep in eps:
            ep["truncated"] = not ep["done"]  # the context filled up before an answer or the step budget
        if n_cut := sum(ep["truncated"] for ep in eps):
            print(f"talentrl: {n_cut}/{len(eps)} episode(s) stopped unanswered at --max-model-len {args.max_model_len} "
                  f"(truncated: R = 0)", file=sys.stderr, flush=True)
    out = []
    for i, (ep, ex) in enumerate(zip(eps, execs)):
        R = episode_return(ep, args.invalid_penalty)
        d = dict(ep=ep, R=R, em=exact_match(ep["pred"], ep["task"]["answer"]), f1=f1_score(ep["pred"], ep["task"]["answer"]),
                 completed=ep["pred"] is not None, valid=ep["n_invalid"] == 0, **info[i])
        if i in route:  # one rollout: routing response (trained) + context (masked) + execution
            r_ids = route[i][0]
            ctx = prompts[i][len(rp[i]) + len(r_ids):]
            d.update(prompt_ids=rp[i], ids=r_ids + ctx + ex.ids, mask=[1] * len(r_ids) + [0] * len(ctx) + ex.mask,
                     n_route=len(r_ids), route_ok=route[i][1] is not None)
        else:
            d.update(prompt_ids=prompts[i], ids=ex.ids, mask=ex.mask, n_route=0)
        out.append(d)
    return out


def check_fits(prompts, max_new, args, what):
    """An over-long prompt is an error, never an engine's silent empty completion (an invalid action, R = 0)."""
    if over := [len(p) for p in prompts if len(p) + max_new > args.max_model_len]:
        raise ValueError(f"talentrl: {len(over)} {what}(s) of up to {max(over)} tokens + {max_new} new tokens exceed "
                         f"--max-model-len {args.max_model_len}; raise it or shorten the context (--K, --topk-docs)")


# ----- credit: Eq. (8) and (10)–(14) as pure functions of returns and masks -----
def talent_utilities(R_talent, R_ref):
    """Eq. (8) per rollout and its mean over the n repeats.
    R_talent: (T, n) returns per talent; R_ref: (n,) reference returns."""
    # Eq. (8): u_{c,r}(x) = R(τ_{c,r}) − R(τ_{∅,r})
    u = R_talent - R_ref[None, :]  # (T, n)
    return u, u.mean(dim=1)  # (T, n), (T,): ū_c(x) = 1/n Σ_r u_{c,r}(x)


def dead_zone(z, eta):
    # Eq. (11): D_η(z) = 0 if |z| < η else z
    return torch.where(z.abs() < eta, torch.zeros_like(z), z)


def routing_advantage(R_a, R_controls, weights, alpha, kappa, eta):
    """R_controls: (3,) returns of the no-skill, reduced-context and no-prior
    controls (ℓ = skill, budget, talent); weights: (3,) summing to 1."""
    # Eq. (12): δ_ℓ = D_η(R_a − R_ℓ),  ℓ ∈ {skill, budget, talent}
    delta = dead_zone(R_a - R_controls, eta)  # (3,)
    # Eq. (13): Â_talent = clip(α Σ_ℓ w_ℓ δ_ℓ, −κ, κ)
    return float((alpha * (weights * delta).sum()).clamp(-kappa, kappa)), delta


def token_advantages(mask, n_route, anchor, in_P, A_talent, A_exec):
    """Eq. (14) for one rollout's completion tokens.
    mask: per-token 1 (policy) / 0 (environment); the first n_route tokens are
    the routing response (ℐ_route), later policy tokens are execution (ℐ_exec)."""
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


# ----- training loop -----
def retokenize(ids, mask, src, dst):
    """A trajectory in the teacher's tokenizer `src` re-encoded in the policy's `dst`: each run of policy
    (mask 1) or environment (mask 0) tokens is decoded and encoded again; the teacher's end of turn becomes
    the policy's. The same tokenizer returns the ids unchanged."""
    if src is dst:
        return list(ids), list(mask)
    out_ids, out_mask, run = [], [], []
    for t, (i, m) in enumerate(zip(ids, mask)):
        run.append(i)
        if t + 1 == len(ids) or mask[t + 1] != m:
            eos = [dst.eos_token_id] if run[-1] == src.eos_token_id else []
            new = dst.encode(src.decode(run, skip_special_tokens=True), add_special_tokens=False) + eos
            out_ids, out_mask, run = out_ids + new, out_mask + [m] * len(new), []
    return out_ids, out_mask


def build_sft_data(sampler, tok, W, tasks, args, ttok=None):
    """Algorithm 1, phase I: paired rollouts per task, Eq. (8), c* and one kept trajectory per task. The
    teacher rolls out in its own tokenizer `ttok` (default: the policy's `tok`); rows come back in `tok`.
    Returns (rows, stats). rows, each row (prompt_ids, target_ids, mask), per App. C:
      route:    one talent-selection row per kept task: routing prompt → grounded rationale + c*;
      exec:     the kept rollout's actions, after that routing turn and c*'s context (masked);
      original: the successful reference rollouts (similarity skills, no talent), SkillRL's rows, each
                distinct trajectory once (a deterministic teacher repeats one n times).
    stats: counts, and the c* label of every kept task (question, qtype, split, talent)."""
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
        labels.append(dict(question=task["question"], qtype=task["qtype"], split=task["split"], talent=T[c]["talent_id"]))
    return rows, label_stats(len(tasks), labels, len(rows["original"]))


def label_stats(n_tasks, labels, n_original):
    """Phase I counts: kept tasks, original rows, c* overall and per question type, and the labels."""
    chosen, by_qtype = {}, {}
    for l in labels:
        chosen[l["talent"]] = chosen.get(l["talent"], 0) + 1
        by = by_qtype.setdefault(l["qtype"], {})
        by[l["talent"]] = by.get(l["talent"], 0) + 1
    return dict(tasks=n_tasks, kept=len(labels), original_rows=n_original, chosen=chosen, chosen_by_qtype=by_qtype,
                labels=labels)


def load_teacher(args, dist, sampler, tok):
    """Phase I's sampler and tokenizer: the policy's (scripted, policy) or an HF model with its own tokenizer."""
    if args.teacher in ("scripted", "policy"):
        return sampler, tok
    model, ttok = load_model(args.teacher, dist, args.dtype, trainable=False)
    return HFSampler(model, ttok), ttok


def phase1_data(sampler, tok, W, tasks, args, dist):
    """Alg. 1 l.4-12 with each rank on its share of the tasks; the rows and labels of every rank are
    gathered in rank order, so that every rank holds the same SFT rows."""
    sampler, ttok = load_teacher(args, dist, sampler, tok)
    rows, st = build_sft_data(sampler, tok, W, tasks[dist.rank::dist.world], args, ttok)
    parts = gather_objects([(rows, st["labels"])], dist)  # one entry per rank
    rows = {k: [row for r, _ in parts for row in r[k]] for k in rows}
    return rows, label_stats(len(tasks), [l for _, ls in parts for l in ls], len(rows["original"]))


def sft_sets(rows, talent_sft_init, sft_epochs, route_epochs, exec_epochs):
    """Alg. 1 l.13's data for Table 1 (§5.3), as multisets read in one shuffled pass: each original row
    sft_epochs times, each talent-selection row route_epochs times, each execution row exec_epochs times.
    SkillRL-SFT: the original rows alone; TalentRL-SFT: those + 𝒟_talent from π_0 (Search7), or 𝒟_talent
    on SkillRL-SFT (ALFWorld)."""
    orig = rows["original"] * sft_epochs
    talent = rows["exec"] * exec_epochs + rows["route"] * route_epochs
    return {"skillrl-sft": orig, "talentrl-sft": talent if talent_sft_init == "skillrl-sft" else orig + talent}


def run_sft(model, examples, args, dist, seed):
    """Alg. 1 l.13: one shuffled pass over `examples` (the same list on every rank) in batches of --sft-batch
    (grpo.sft_loop; under DDP each rank takes its share of a batch)."""
    # Eq. (9): L_sft = −Σ_{t ∈ ℐ_asst} log π_θ(y_t | ξ, y_<t); grpo.sft_update divides by the
    # number of response tokens in the batch (token mean; context and observations masked)
    m = sft_loop(model, examples, args, dist, args.sft_lr, args.sft_batch, epochs=1, seed=seed)
    return dict(sft_steps=m["sft_steps"], sft_examples=len(examples), sft_loss=m["sft_loss"])


def split_pools(train, n_sft):
    """𝒟_sft and 𝒟_rl of Algorithm 1 from the shuffled train questions of every split: 𝒟_sft takes n_sft
    of them round-robin over the question types, so phase I sees every type the evaluation uses; 𝒟_rl is
    the rest of the RL splits' questions (NQ + HotpotQA)."""
    queues = {}
    for q in train:
        queues.setdefault(q["qtype"], []).append(q)
    sft, queues = [], [queues[k] for k in sorted(queues)]
    while len(sft) < n_sft and any(queues):
        for qu in queues:
            if qu and len(sft) < n_sft:
                sft.append(qu.pop(0))
    taken = {q["question"] for q in sft}
    rl = [q for q in train if q["split"] in TRAIN_SPLITS and q["question"] not in taken]
    if n_sft <= 0 or len(sft) < n_sft or not rl:
        raise ValueError(f"--sft-tasks {n_sft} leaves no disjoint RL pool: the train splits hold {len(train)} "
                         f"questions ({len(rl)} left for RL); lower --sft-tasks or raise --n-train")
    return sft, rl


def phase1_sft(model, sampler, tok, init, examples, sft_dir, args, dist):
    """Alg. 1 l.13: fine-tune the weights `init` on the examples by Eq. (9) and save the
    checkpoint (π_ref of the RL stage); with --resume its checkpoint is loaded instead."""
    if args.resume and load_checkpoint(sft_dir, model, None, dist) is not None:
        sampler.sync(model)
        return dict(sft_steps=0, sft_examples=len(examples), sft_loss=float("nan"), resumed=True)
    restore_snapshot(model, init)
    sft = run_sft(model, examples, args, dist, args.seed)
    save_checkpoint(sft_dir, model, tok, None, -1, {}, dist)
    sampler.sync(model)
    return sft


def phase2_rl(routed, model, sampler, tok, W, rl_tasks, arm_dir, args, dist):
    """Alg. 1 l.14-23 from the SFT weights in `model`: TalentRL (routed) or
    SkillRL's GRPO with similarity skills (the baseline). Both evolve the SkillBank.
    Returns Â_talent of every group of every step (all ranks; TalentRL only)."""
    # l.14: π_ref ← π_θ (the SFT checkpoint), frozen
    ref = frozen_copy(model, getattr(torch, args.dtype))  # --dtype (bf16): not an fp32 replica under FSDP
    opt = make_optimizer(model, args)
    start = 0
    if args.resume and (ck := resume_checkpoint(arm_dir, model, opt, dist)):  # policy, optimizer, SkillBank
        start = ck[0] + 1
        W.set_bank(ck[1]["bank"], ck[1]["bank_raw"])
        W.set_talents(ck[1]["talents"])
    sampler.sync(model)
    val_tasks, A_groups = rl_tasks[: args.val_tasks], []
    for step in range(start, args.rl_steps):
        t0 = time.time()
        # l.17: a task batch from 𝒟_rl, the same on every rank; each rank owns whole tasks
        batch = random.Random(args.seed * 7919 + step).sample(rl_tasks, min(args.tasks_per_step, len(rl_tasks)))
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
        log_metrics(arm_dir, step, m, dist, keys=("reward", "R_P", "success_P", "A_talent_abs", "A_talent_nonzero",
                                                  "route_valid", "kl", "loss", "grad_norm", "time_step"))
        if (step + 1) % args.save_every == 0 or step + 1 == args.rl_steps:
            save_checkpoint(arm_dir, model, tok, opt, step, dict(bank=W.bank, bank_raw=W.bank_raw, talents=W.talents), dist)
    if dist.is_main and args.rl_steps > start:
        plot_curves(arm_dir, ("reward", "R_P", "kl") + (("A_talent_abs", "A_talent_nonzero") if routed else ()))
    return A_groups


def talentrl_rollouts(sampler, tok, W, tasks, args, first_group):
    """Alg. 1 l.18-22 for a batch of tasks: anchor, three matched controls and
    G−1 ordinary rollouts per task; per-token advantages by Eq. (10)-(14)."""
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
        conds += [dict(talent="policy", route=routes[0], k=0), dict(talent="policy", route=routes[0], k=args.k_reduced),
                  dict(talent=None, k=args.K)]
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
            adv = token_advantages(r["mask"], r["n_route"], is_anchor, in_P, A_talent, A_exec[i] if in_P else 0.0)
            if in_P or args.train_controls:
                rollouts.append(Rollout(r["prompt_ids"], r["ids"], r["mask"], reward=r["R"], adv=adv,
                                        group=first_group + j, info=dict(role="P" if in_P else "control")))
    return rollouts, stats


def skillrl_rollouts(sampler, tok, W, tasks, args, first_group):
    """The SkillRL baseline: G rollouts per task with similarity-retrieved skills,
    group-relative advantages on every token (grpo.py fills them)."""
    res = run_episodes(sampler, tok, W, [t for t in tasks for _ in range(args.G)],
                       [dict(talent=None, k=args.K)] * (len(tasks) * args.G), args, args.temperature)
    rs = [Rollout(r["prompt_ids"], r["ids"], r["mask"], reward=r["R"], group=first_group + k // args.G) for k, r in enumerate(res)]
    return rs, dict(R_P=[r["R"] for r in res])


def evolve_skillbank(sampler, tok, W, val_outcomes, args, dist):
    """SkillRL's library update: for each task type whose validation success is
    below the threshold, up to `evolve_failures` failed trajectories go to the
    model, which proposes at most `evolve_max_new` skills as JSON. New skills
    join the bank under that task type and are associated with the talent the
    failures were routed to. val_outcomes: evaluate's outcomes of every rank;
    rank 0 proposes; the bank is broadcast."""
    added = []
    if dist.is_main:
        by_type = {}
        for r in val_outcomes:
            by_type.setdefault(r["qtype"], []).append(r)
        for qtype, rs in sorted(by_type.items()):
            if np.mean([r["em"] for r in rs]) >= args.evolve_threshold:
                continue
            fails = [r for r in rs if r["em"] == 0][: args.evolve_failures]
            shown = "\n\n".join(f"Question: {r['question']}\nGold answer: {r['answer']}\n"
                                f"Agent answer: {r['pred']}\nSearches: {r['n_search']}" for r in fails)
            msg = (f"These search-agent attempts on '{qtype}' questions failed:\n\n{shown}\n\nPropose at most "
                   f"{args.evolve_max_new} new reusable skills as a JSON list of objects with keys "
                   f'"title", "principle", "when_to_apply".')
            out = sampler.generate([chat_ids(tok, [{"role": "user", "content": msg}])], 1, args.evolve_max_tokens, 0.0)[0][0].text
            talents = [r["talent"] for r in fails if r["talent"] in W.by_id]
            for s in parse_proposed_skills(out)[: args.evolve_max_new]:
                s.update(skill_id=f"dyn_{len(W.bank) + len(added) + 1:03d}", category=qtype)  # section: the bank's own
                added.append((s, max(set(talents), key=talents.count) if talents else None))
    added = broadcast_object(added, dist)
    for s, t in added:
        if t in W.by_id:
            W.by_id[t]["skills"].append(s["skill_id"])
    if added:
        W.set_bank(W.bank + [s for s, _ in added], W.bank_raw)
    return len(added)


def parse_proposed_skills(text):
    """Skills from the model's reply: a JSON list (or object) anywhere in it; bad output gives []."""
    for m in re.finditer(r"\[.*\]|\{.*\}", text or "", re.S):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        items = obj if isinstance(obj, list) else [obj]
        return [dict(title=str(s["title"])[:80], principle=str(s["principle"])[:300],
                     when_to_apply=str(s.get("when_to_apply", ""))[:200])
                for s in items if isinstance(s, dict) and s.get("title") and s.get("principle")]
    return []


# ----- evaluation -----
def evaluate(sampler, tok, W, tasks, routed, args, dist):
    """Success (EM) and F1 per split, routing validity and the talent selected
    per split (Figure 2a). Greedy routing and execution by default (Table 4
    note: deterministic evaluation). Each rank rolls out its share of the tasks; every rank
    then counts the outcomes of all of them. Returns (metrics, the outcome of every task on all ranks,
    in rank order: question, qtype, answer, prediction, searches, em, talent)."""
    mine = tasks[dist.rank::dist.world]
    cond = dict(talent="policy", k=args.K) if routed else dict(talent=None, k=args.K)
    res = run_episodes(sampler, tok, W, mine, [cond] * len(mine), args, args.eval_temperature,
                       route_temperature=args.eval_temperature) if mine else []
    outcomes = gather_objects([dict(split=r["ep"]["task"]["split"], qtype=r["ep"]["task"]["qtype"], question=r["ep"]["task"]["question"],
                                    answer=r["ep"]["task"]["answer"], pred=r["ep"]["pred"], n_search=r["ep"]["n_search"],
                                    truncated=r["ep"].get("truncated", False), em=r["em"], f1=r["f1"],
                                    route_ok=bool(r.get("route_ok")), talent=r["talent"] or "none") for r in res], dist)
    tids = [t["talent_id"] for t in W.talents] + ["none"]
    out = {"success": {}, "f1": {}, "talents": {}, "n": {},
           "items": {o["question"]: (o["split"], o["em"]) for o in outcomes},  # per question, for paired tests
           "truncated": sum(o["truncated"] for o in outcomes)}
    if routed:
        out["routes"] = {o["question"]: o["talent"] for o in outcomes}
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
               route_valid=100 * sum(o["route_ok"] for o in outcomes) / max(len(outcomes), 1) if routed else None)
    return out, outcomes


def table_cols():
    return SINGLE_HOP + ["single"] + MULTI_HOP + ["multi", "avg"]  # Table 1-2's column order


def table_row(r):
    """One method's row of Table 1-2: success per split, single-hop, multi-hop and overall averages."""
    return {**r["success"], "single": r["single_hop"], "multi": r["multi_hop"], "avg": r["overall"]}


def print_table(title, rows, cell=lambda v: f"{v:.1f}"):
    """rows: {method: {column: value}}; cell formats one value (a number, or mean ± sd)."""
    w, wn = max([len(cell(v)) for r in rows.values() for v in r.values()] + [9]) + 1, max(map(len, rows), default=6) + 1
    head = f"{'method':<{wn}}" + "".join(f"{c:>{w}}" for c in table_cols())
    lines = [title, head, "-" * len(head)]
    lines += [f"{name:<{wn}}" + "".join(f"{cell(r[c]):>{w}}" for c in table_cols()) for name, r in rows.items()]
    print("\n".join(lines) + "\n")


def plot_talents(run_dir, panels, out="talent_selection.png"):
    """Figure 2a: share of test questions routed to each talent, per split;
    panels: {title: talents per split} (before and after RL)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tids = sorted({t for per in panels.values() for v in per.values() for t in v})
    colors = {t: plt.cm.tab10(i % 10) for i, t in enumerate(tids)}
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.6), squeeze=False)
    for ax, (title, per) in zip(axes[0], panels.items()):
        splits = list(per)
        bottom = np.zeros(len(splits))
        for t in tids:
            pct = np.array([100 * per[s].get(t, 0) / max(sum(per[s].values()), 1) for s in splits])
            ax.bar(splits, pct, bottom=bottom, label=t.replace("talent_", ""), color=colors[t])
            for x, (b, p) in enumerate(zip(bottom, pct)):
                if p >= 10:  # the paper omits labels below 10%
                    ax.text(x, b + p / 2, f"{p:.0f}", ha="center", va="center", fontsize=7)
            bottom += pct
        ax.set_ylabel("% of questions"), ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    axes[0][-1].legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(Path(run_dir) / out, dpi=100)
    plt.close(fig)
    return Path(run_dir) / out


def print_routing(title, per):
    """Figure 2a as text: % of each split's test questions routed to each talent (≥ 10 % shown)."""
    print(title)
    for s, v in per.items():
        n = max(sum(v.values()), 1)
        top = sorted(v.items(), key=lambda kv: -kv[1])
        print(f"  {s:<10} " + ", ".join(f"{t.replace('talent_', '')} {100 * c / n:.0f}%" for t, c in top if c / n >= 0.1))
    print()


METHODS = {"zero-shot": "Zero-shot", "skillrl-sft": "SkillRL-SFT", "talentrl-sft": "TalentRL-SFT",
           "skillrl": "SkillRL", "talentrl": "TalentRL"}


def report(run_dir, results, headline, dist):
    """Tables 1-2, routing accuracy against c* per question type, Figure 2a before and after RL, the headline."""
    if not dist.is_main:
        return
    lab = results.get("routing", {})
    for title, labels, routes in (("SFT tasks (train)", lab.get("train"), lab.get("train_routes")),
                                  ("held-out, TalentRL-SFT", lab.get("held_out"), results.get("talentrl-sft", {}).get("routes")),
                                  ("held-out, TalentRL", lab.get("held_out"), results.get("talentrl", {}).get("routes"))):
        if labels and routes:
            print_routing_accuracy(f"Routing accuracy vs c*, {title}:", routing_items(labels, routes, lab["majority"]))
    print()
    print_table("Table 1 (shape): success rate (%) after SFT, and TalentRL after RL",
                {METHODS[k]: table_row(results[k]) for k in ("zero-shot", "skillrl-sft", "talentrl-sft", "talentrl")
                 if k in results})
    if "skillrl" in results:
        print_table("Table 2 (shape): success rate (%) after RL",
                    {METHODS[k]: table_row(results[k]) for k in ("skillrl", "talentrl") if k in results})
    panels = {f"{METHODS[k]} ({'before' if k.endswith('sft') else 'after'} RL), routing valid "
              f"{results[k]['route_valid']:.0f}%": results[k]["talents"] for k in ("talentrl-sft", "talentrl") if k in results}
    for title, per in panels.items():
        print_routing(f"Figure 2a, {title}:", per)
    if panels:
        print(f"Figure 2a: {plot_talents(run_dir, panels)}")
    print("\nHeadline (rates as fractions; paired over questions; --aggregate pools seeds):")
    print(stats.format_headline(headline))


def route_greedy(sampler, tok, W, tasks, args, dist):
    """{question: greedily routed talent id, or "none" for an invalid route} for tasks (dicts with a
    question), each rank routing its share; the routing turn alone, no execution."""
    mine = tasks[dist.rank::dist.world]
    rp = [chat_ids(tok, [{"role": "user", "content": routing_prompt(t, W.talents)}]) for t in mine]
    check_fits(rp, args.route_max_tokens, args, "routing prompt")
    outs = sampler.generate(rp, 1, args.route_max_tokens, args.eval_temperature, args.top_p, ["</talent>"]) if rp else []
    got = [(t["question"], sample_route(tok, W, s)[1] or "none") for t, (s,) in zip(mine, outs)]
    return dict(gather_objects(got, dist))


def routing_items(labels, routes, majority):
    """Routing accuracy against c*: per question type (and "all"), the per-question 0/1 hits of the router
    (`routes`) and of the majority-class router (always `majority`, the most frequent c* of phase I)."""
    out = {}
    for lab in labels:
        if lab["question"] in routes:
            for k in ("all", lab["qtype"]):
                a, b = out.setdefault(k, ([], []))
                a.append(float(routes[lab["question"]] == lab["talent"]))
                b.append(float(majority == lab["talent"]))
    return out


def print_routing_accuracy(title, items):
    print(f"{title}  (router vs majority-class router; n labelled questions)")
    for k, (a, b) in items.items():
        print(f"  {k:<15} {100 * np.mean(a):5.1f}%  vs {100 * np.mean(b):5.1f}%   n = {len(a)}")
    print()


def build_headline(results):
    """results.json's headline (stats.py): each claim with both means, the paired difference, 95 % CI, p and n;
    per-question items are kept so that --aggregate pools questions × seeds."""
    H, lab = [], results.get("routing", {})
    maj = "majority-class router"
    for part, routes_of in (("held-out", lambda k: results.get(k, {}).get("routes")),
                            ("SFT tasks", lambda k: lab.get("train_routes") if k == "talentrl-sft" else None)):
        for key in ("talentrl-sft", "talentrl"):
            routes = routes_of(key)
            if not routes or not lab:
                continue
            items = routing_items(lab["held_out" if part == "held-out" else "train"], routes, lab["majority"])
            for qt, (a, b) in items.items():
                H.append(stats.compare(f"routing accuracy vs c*, {part}, {qt}: {METHODS[key]} vs {maj}", METHODS[key], maj,
                                       a, b, chance=float(np.mean(b))))
    for a, b in (("talentrl-sft", "skillrl-sft"), ("talentrl", "talentrl-sft"), ("talentrl-sft", "zero-shot")):
        if a not in results or b not in results:
            continue
        for split in ["all"] + list(SPLITS):
            qs = [q for q, (sp, _) in results[a]["items"].items() if split in ("all", sp) and q in results[b]["items"]]
            H.append(stats.compare(f"success, {split}: {METHODS[a]} vs {METHODS[b]}", METHODS[a], METHODS[b],
                                   [results[a]["items"][q][1] for q in qs], [results[b]["items"][q][1] for q in qs]))
    if A := results.get("talentrl", {}).get("A_talent_groups"):
        H.append(stats.vs_chance("RL groups with Â_talent ≠ 0 (share)", "TalentRL", [float(x != 0) for x in A], 0.0))
        H.append(stats.vs_chance("|Â_talent| per RL group (mean)", "TalentRL", [abs(x) for x in A], 0.0))
    return H


def aggregate_seeds(run_dirs):
    """--aggregate: the headline pooled over the runs' questions × seeds (stats.aggregate: CI, p, n), then
    Table 1 as mean ± sd of the per-seed success rates."""
    entries = stats.aggregate_main(run_dirs)
    runs = [json.loads((Path(d) / "results.json").read_text()) for d in run_dirs]
    rows = {}
    for k in ("zero-shot", "skillrl-sft", "talentrl-sft", "talentrl"):
        vals = [table_row(r[k]) for r in runs if k in r and "success" in r[k]]
        if vals:
            rows[f"{METHODS[k]} (n={len(vals)})"] = {c: stats.mean_sd([v[c] for v in vals]) for c in table_cols()}
    print()
    print_table(f"Table 1 over {len(runs)} seeds: success rate (%), mean ± sd (sd: nan for one seed)", rows,
                cell=lambda v: f"{v[0]:.1f}±{v[1]:.1f}")
    return dict(headline=entries, rows=rows)


# ----- main -----
def save_results(run_dir, results, dist):
    if dist.is_main:  # the headline is written once, at the end
        stats.write_results(run_dir, results, [])


def check_args(args):
    """Refuse settings whose training would be silently wrong."""
    rt = args.route_temperature
    if rt is not None and rt != args.temperature and "talentrl" in args.arms and args.rl_steps > 0:
        # Eq. (15)'s ratio needs log π at the temperature the token was sampled at; grpo_update uses one
        raise SystemExit(f"talentrl: --route-temperature {rt} differs from --temperature {args.temperature}, but "
                         "grpo_update log-probes every token (routing included) at --temperature; set them equal")


def main(argv=None):
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="talentrl")
    if args.aggregate:
        return aggregate_seeds(args.aggregate)
    check_args(args)
    dist = setup_distributed()
    seed_everything(args.seed + dist.rank)
    t_start, run_dir, results = time.time(), Path(args.run_dir), {"phase_seconds": {}}  # --resume reloads checkpoints
    clock = [t_start]

    def say(msg, phase=None):
        """A timestamped line; with `phase`, also the seconds since the previous phase ended (results.json)."""
        now = time.time()
        if phase:
            results["phase_seconds"][phase] = round(now - clock[0], 1)
            msg, clock[0] = f"{phase} done in {now - clock[0]:.0f}s: {msg}", now
        if dist.is_main:
            print(f"[{time.strftime('%H:%M:%S', time.gmtime(now))} UTC {now - t_start:6.0f}s] {msg}", file=sys.stderr, flush=True)

    def evaluate_as(key, routed):
        results[key] = {**results.get(key, {}), **evaluate(sampler, tok, W, test, routed, args, dist)[0]}
        save_results(run_dir, results, dist)
        r = results[key]
        return (f"{key}: success {r['overall']:.1f}% (single-hop {r['single_hop']:.1f}, multi-hop {r['multi_hop']:.1f})"
                + (f", routing valid {r['route_valid']:.0f}%" if routed else ""))

    # Algorithm 1's inputs: environment ℰ, talent catalog 𝒯, SkillBank 𝒮, disjoint 𝒟_sft and 𝒟_rl, π_0
    W = World(args, load_embedder())
    init_bank, init_talents = copy.deepcopy((W.bank, W.bank_raw)), copy.deepcopy(W.talents)
    train = [q for s in SPLITS for q in W.questions[s]["train"]]
    random.Random(args.seed).shuffle(train)
    sft_tasks, rl_tasks = split_pools(train, args.sft_tasks)
    test = [q for s in SPLITS for q in W.questions[s]["test"]]
    model, tok = load_policy(args, dist)
    sampler = make_sampler(args, model, tok, dist)
    pi_0 = cpu_snapshot(model)  # snapshots on the CPU: no GPU memory per copy
    say(f"world: {len(W.passages)} passages, {len(W.bank)} skills, {len(W.talents)} talents; {len(sft_tasks)} SFT "
        f"({', '.join(f'{k} {v}' for k, v in sorted(_count(sft_tasks).items()))}) / {len(rl_tasks)} RL / "
        f"{len(test)} test tasks", phase="load")
    if args.zero_shot:  # the backbone with SkillRL's prompt (similarity skills, no talent)
        say(evaluate_as("zero-shot", False), phase="zero-shot")

    # Phase I (l.4-12): 𝒟_talent from paired teacher rollouts; the original rows: the successful references
    rows, results["sft_data"] = phase1_data(sampler, tok, W, sft_tasks, args, dist)
    st = results["sft_data"]
    # c* of the held-out questions by the same teacher and Eq. (8): the labels routing is scored against
    held = phase1_data(sampler, tok, W, test, args, dist)[1]["labels"]
    chosen = st["chosen"]
    results["routing"] = dict(train=st["labels"], held_out=held, majority=max(chosen, key=chosen.get) if chosen else None)
    say(f"kept {st['kept']}/{len(sft_tasks)} tasks (ū_c* > 0), {st['original_rows']} original rows; c* per type "
        f"{st['chosen_by_qtype']}; held-out c* for {len(held)}/{len(test)}; majority class "
        f"{results['routing']['majority']}", phase="phase I")
    sets = sft_sets(rows, args.talent_sft_init, args.sft_epochs, args.route_epochs, args.exec_epochs)
    # l.13: SkillRL-SFT from π_0 on the original rows alone (Table 1's baseline)
    results["skillrl-sft"] = phase1_sft(model, sampler, tok, pi_0, sets["skillrl-sft"], run_dir / "skillrl-sft", args, dist)
    say(evaluate_as("skillrl-sft", False), phase="SkillRL-SFT")
    skillrl_sft = cpu_snapshot(model)
    # l.13: TalentRL-SFT from π_0, or from SkillRL-SFT with --talent-sft-init skillrl-sft
    init = skillrl_sft if args.talent_sft_init == "skillrl-sft" else pi_0
    results["talentrl-sft"] = phase1_sft(model, sampler, tok, init, sets["talentrl-sft"], run_dir / "talentrl-sft", args, dist)
    msg = evaluate_as("talentrl-sft", True)
    # the diagnosis of issue #28: can the SFT router route its own training tasks (underfitting) and new ones?
    results["routing"]["train_routes"] = route_greedy(sampler, tok, W, st["labels"], args, dist)
    save_results(run_dir, results, dist)
    say(msg, phase="TalentRL-SFT")
    talentrl_sft = cpu_snapshot(model)

    # Phase II (l.14-23) from TalentRL-SFT; SkillRL's GRPO from SkillRL-SFT as the RL baseline
    for arm in args.arms:
        routed = arm == "talentrl"
        W.set_bank(*copy.deepcopy(init_bank))
        W.set_talents(copy.deepcopy(init_talents))
        restore_snapshot(model, talentrl_sft if routed else skillrl_sft)
        A_groups = phase2_rl(routed, model, sampler, tok, W, rl_tasks, run_dir / arm, args, dist)
        msg = evaluate_as(arm, routed)
        if routed:
            results[arm]["A_talent_groups"] = A_groups
        say(msg, phase=f"{arm} RL")

    results["wall_seconds"] = time.time() - t_start
    headline = build_headline(results)
    if dist.is_main:
        stats.write_results(run_dir, results, headline)
    report(run_dir, results, headline, dist)
    say(f"results: {run_dir / 'results.json'}")
    return {**results, "headline": headline}


def _count(tasks):
    out = {}
    for t in tasks:
        out[t["qtype"]] = out.get(t["qtype"], 0) + 1
    return out


# ----- data: retriever, SkillBank and talent catalog -----
def embed(embedder, texts):
    """L2-normalised MiniLM embeddings, so a dot product is a cosine similarity."""
    return torch.as_tensor(embedder.encode(list(texts), normalize_embeddings=True,
                                           convert_to_numpy=True))  # (n, 384)


def search_corpus(query, passages, P_emb, embedder, topk):
    """Dense retrieval: the top-k passages by cosine similarity to the query."""
    q = embed(embedder, [query])  # (1, 384)
    sims = (P_emb @ q.T).squeeze(1)  # (n_passages,)
    idx = sims.topk(min(topk, len(passages))).indices.tolist()
    return [passages[i] for i in idx]


def load_talents(path, bank):
    """The talent catalog 𝒯: per talent c its id, description d_c, guidance g_c
    and associated skill ids ℳ(c). A link to a skill missing from the bank (a
    SkillBank from elsewhere) is dropped with a warning that names it."""
    try:
        talents = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"talent file {path}: {e}") from e
    ids = {s["skill_id"] for s in bank}
    out = []
    for t in talents:
        missing = [k for k in ("talent_id", "description", "guidance", "skills") if k not in t]
        if missing:
            raise ValueError(f"talent file {path}: talent {t.get('talent_id', '?')} lacks {missing}")
        if dropped := [s for s in t["skills"] if s not in ids]:
            warnings.warn(f"talent {t['talent_id']}: links to {dropped} dropped (not in the SkillBank)")
        out.append(dict(t, skills=[s for s in t["skills"] if s in ids]))
    return out


# SkillRL keeps per-type skills under `task_specific_skills` (its ALFWorld bank)
# or `query_type_skills` (its search bank); both are read and written back.
SKILL_SECTIONS = ("task_specific_skills", "query_type_skills")


def load_skillbank(path):
    """A SkillBank in SkillRL's JSON format, flattened to a list of skills
    {skill_id, title, principle, when_to_apply?, …, category, section}, and the
    whole JSON (common mistakes, metadata and any other field), which
    save_skillbank writes back unchanged. Mistakes are kept, not retrieved."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"SkillBank {path}: {e}") from e
    if not isinstance(raw, dict) or not {"general_skills", *SKILL_SECTIONS} & set(raw):
        raise ValueError(f"SkillBank {path}: expected general_skills / {' / '.join(SKILL_SECTIONS)} keys")
    bank = [dict(s, category="general", section="general_skills") for s in raw.get("general_skills") or []]
    for key in SKILL_SECTIONS:
        if not isinstance(raw.get(key) or {}, dict):
            raise ValueError(f"SkillBank {path}: {key} must map a category to a list of skills")
        for cat, skills in (raw.get(key) or {}).items():
            bank += [dict(s, category=cat, section=key) for s in skills]
    for s in bank:
        missing = [k for k in ("skill_id", "title", "principle") if not s.get(k)]
        if missing:
            raise ValueError(f"SkillBank {path}: skill {s.get('skill_id', '?')} lacks {missing}")
    return bank, raw


def save_skillbank(path, bank, raw):
    """Write the bank back in the layout it was loaded from: every top-level field
    of `raw` kept, skills in their section; new skills join the bank's per-type section."""
    out = {k: (v if k not in ("general_skills", *SKILL_SECTIONS) else {c: [] for c in v}
               if isinstance(v, dict) else []) for k, v in raw.items()}
    per_type = next((k for k in SKILL_SECTIONS if k in raw), SKILL_SECTIONS[0])
    for s in bank:
        item = {k: v for k, v in s.items() if k not in ("category", "section")}
        if s["category"] == "general":
            out.setdefault("general_skills", []).append(item)
        else:
            out.setdefault(s.get("section", per_type), {}).setdefault(s["category"], []).append(item)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1))


def skill_text(s):
    return f"{s['title']}. {s['principle']} {s.get('when_to_apply', '')}"  # SkillRL's embedded text


class World:
    """Everything an episode needs that is not the model: corpus, retriever,
    SkillBank, talents and the flags, with the two retrieval look-ups."""

    def __init__(self, args, embedder):
        self.args, self.embedder = args, embedder
        self.world = build_world(args.seed, args.n_people, args.n_places, args.n_orgs, args.n_events,
                                 args.n_hamlets, args.n_shared)
        self.passages = render_passages(self.world)
        self.P_emb = embed(embedder, [p["text"] for p in self.passages])  # (n_passages, 384)
        self.questions = build_questions(self.world, args.seed, args.n_train, args.n_test)
        self.set_bank(*load_skillbank(args.skillbank))
        self.cache, self.q_emb = {}, {}
        self.set_talents(load_talents(args.talents, self.bank))

    def set_bank(self, bank, raw):
        self.bank, self.bank_raw = bank, raw
        self.S_emb = embed(self.embedder, [skill_text(s) for s in bank])  # (S, 384)

    def set_talents(self, talents):
        self.talents, self.by_id = talents, {t["talent_id"]: t for t in talents}
        self.D_emb = embed(self.embedder, [t["description"] for t in talents])  # (T, 384)

    def description_similarity(self, task):
        return (self.D_emb @ self.question_embedding(task["question"]).T).squeeze(1)  # (T,): cos(x, d_c)

    def question_embedding(self, q):
        if q not in self.q_emb:
            self.q_emb[q] = embed(self.embedder, [q])  # (1, 384)
        return self.q_emb[q]

    def search(self, query):
        if query not in self.cache:  # the same query recurs across a group's rollouts
            self.cache[query] = search_corpus(query, self.passages, self.P_emb, self.embedder, self.args.topk_docs)
        return self.cache[query]

    def skills_for(self, task, talent, k, prior):
        """𝒮_k(x, c) with the talent bonus (prior) or 𝒮_k(x) by similarity alone."""
        sims = (self.S_emb @ self.question_embedding(task["question"]).T).squeeze(1)  # (S,)
        assoc = {i for i, s in enumerate(self.bank) if talent and prior and s["skill_id"] in talent["skills"]}
        a = self.args
        return [self.bank[i] for i in retrieve_skills(sims, assoc, k, a.recall, a.sim_threshold, a.lam)]


# ----- search environment (Search-R1's protocol) -----
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.S)
INVALID_MSG = ("\nMy previous action is invalid. If I want to search, I should put the query "
               "between <search> and </search>. If I want to give the final answer, I should "
               "put the answer between <answer> and </answer>. Let me try again.\n")


def parse_action(text):
    """First `<search>q</search>` or `<answer>a</answer>` in a turn (Search-R1), else (None, None)."""
    m = ACTION_RE.search(text or "")
    if m is None or not m.group(2).strip():
        return None, None
    return m.group(1), m.group(2).strip()


def new_episode(task):
    return dict(task=task, turns=0, n_search=0, n_invalid=0, pred=None, done=False)


def env_reply(ep, text, search_fn, max_steps):
    """One environment step of the search protocol: returns the observation to
    insert (environment tokens, masked out of the loss) or None when the episode
    ends (an answer, or the step budget is spent). Malformed actions are
    penalised through n_invalid, never fatal."""
    ep["turns"] += 1
    action, content = parse_action(text)
    if action == "answer":
        ep["pred"], ep["done"] = content, True
        return None
    if action == "search":
        ep["n_search"] += 1
        docs = search_fn(content)
        obs = "\n<information>" + " ".join(f"Doc {i + 1}: {d['text']}" for i, d in enumerate(docs)) + "</information>\n"
    else:
        ep["n_invalid"] += 1
        obs = INVALID_MSG
    if ep["turns"] >= max_steps:
        ep["done"] = True
        return None
    return obs


# ----- the world -----
# A seeded fictional encyclopedia. Every fact is invented, so the policy cannot
# answer from memory and has to search (Search7's corpora are not offline).

COUNTRIES = ["Dalmiria", "Ostrevia", "Kelvany", "Murosia", "Tessaly", "Varnholt"]
OCCUPATIONS = {"novelist": "novel", "director": "film", "composer": "album",
               "painter": "painting", "architect": "building", "poet": "poem collection"}
SYL = ["bra", "vel", "or", "quen", "tal", "mir", "dro", "sa", "lin", "kor", "ev",
       "an", "thi", "zu", "pel", "ros", "ka", "nor", "ith", "gal", "ume", "fen",
       "ost", "ray", "dun", "cel", "ia", "mo", "res", "vik"]
PLACE_SUFFIX = ["worth", "holm", "ford", "mere", "ton", "gard", "wick", "stead"]
TITLE_ADJ = ["Amber", "Silent", "Hollow", "Crimson", "Northern", "Glass", "Iron",
             "Distant", "Pale", "Winter", "Quiet", "Burning", "Seventh", "Lost"]
TITLE_NOUN = ["Lantern", "Harbour", "Orchard", "Meridian", "Choir", "Atlas",
              "Bridge", "Tide", "Garden", "Compass", "Archive", "Falcon", "Vessel"]
ORG_KIND = ["Institute", "Society", "Company", "Guild", "Academy", "Foundation"]
EVENT_KIND = ["Accord", "Exhibition", "Congress", "Regatta", "Games", "Summit"]
RIVERS = ["Osk", "Velm", "Turra", "Brenn", "Iselle", "Quor", "Maddow", "Fenn"]


def _word(rng, n_syl):
    return "".join(rng.choice(SYL) for _ in range(n_syl)).capitalize()


def build_world(seed, n_people=40, n_places=16, n_orgs=10, n_events=8,
                n_hamlets=10, n_shared=4):
    """Entities as plain dicts keyed by id; names are unique except for the
    `n_shared` deliberate name collisions (people with the same name and a
    different occupation), which the disambiguation questions use."""
    rng = random.Random(seed)
    used = set()

    def fresh(make):
        for _ in range(1000):
            name = make()
            if name.lower() not in used:
                used.add(name.lower())
                return name
        raise RuntimeError("name space exhausted; lower the world size")

    places = [dict(id=f"place{i}", type="place",
                   name=fresh(lambda: _word(rng, 2) + rng.choice(PLACE_SUFFIX)),
                   country=rng.choice(COUNTRIES), founded=rng.randint(800, 1850),
                   population=rng.randint(2000, 900000)) for i in range(n_places)]
    people = []
    for i in range(n_people):
        occ = rng.choice(sorted(OCCUPATIONS))
        people.append(dict(id=f"person{i}", type="person",
                           name=fresh(lambda: f"{_word(rng, 2)} {_word(rng, 2)}"),
                           occupation=occ, born=rng.randint(1820, 1980),
                           birthplace=rng.choice(places)["id"], shared=False))
    # deliberate homonyms: same name, different occupation, year and birthplace
    for j in range(n_shared):
        src = people[j]
        src["shared"] = True
        occ = rng.choice(sorted(set(OCCUPATIONS) - {src["occupation"]}))
        born = rng.choice([y for y in range(1820, 1981) if abs(y - src["born"]) > 5])
        bp = rng.choice([p["id"] for p in places if p["id"] != src["birthplace"]])
        people.append(dict(id=f"person{n_people + j}", type="person", name=src["name"],
                           occupation=occ, born=born, birthplace=bp, shared=True))
    works = []
    for p in people:
        years = rng.sample(range(p["born"] + 20, p["born"] + 75), rng.randint(1, 3))
        for y in sorted(years):
            works.append(dict(id=f"work{len(works)}", type="work",
                              name=fresh(lambda: f"The {rng.choice(TITLE_ADJ)} {rng.choice(TITLE_NOUN)}"
                                         if rng.random() < 0.5 else
                                         f"The {rng.choice(TITLE_NOUN)} of {_word(rng, 2)}"),
                              kind=OCCUPATIONS[p["occupation"]], year=y, creator=p["id"]))
    orgs = [dict(id=f"org{i}", type="org",
                 name=fresh(lambda: f"{_word(rng, 2)} {rng.choice(ORG_KIND)}"),
                 founded=rng.randint(1850, 2010), hq=rng.choice(places)["id"],
                 founder=rng.choice([p["id"] for p in people if not p["shared"]]))
            for i in range(n_orgs)]
    events = [dict(id=f"event{i}", type="event",
                   name=fresh(lambda: f"{_word(rng, 2)} {rng.choice(EVENT_KIND)}"),
                   year=rng.randint(1850, 2020), location=rng.choice(places)["id"])
              for i in range(n_events)]
    # long-tail entities: mentioned in exactly one passage, with rare attributes
    hamlets = [dict(id=f"hamlet{i}", type="hamlet",
                    name=fresh(lambda: _word(rng, 3)), near=rng.choice(places)["id"],
                    river=rng.choice(RIVERS), elevation=rng.randint(40, 2400))
               for i in range(n_hamlets)]
    return {e["id"]: e for e in places + people + works + orgs + events + hamlets}


def render_passages(world):
    """One short encyclopedia passage per entity, `Title. text` (Search-R1 style)."""
    W, out = world, []
    for e in world.values():
        t = e["type"]
        if t == "person":
            bp = W[e["birthplace"]]
            made = [w["name"] for w in world.values() if w["type"] == "work" and w["creator"] == e["id"]]
            art = "an" if e["occupation"][0] in "aeiou" else "a"
            text = (f"{e['name']} ({e['occupation']}). {e['name']} was {art} {e['occupation']} born in "
                    f"{e['born']} in {bp['name']}, {bp['country']}. Known works: {', '.join(made)}.")
        elif t == "work":
            c = W[e["creator"]]
            text = f"{e['name']}. {e['name']} is {'an' if e['kind'][0] in 'aeiou' else 'a'} {e['kind']} released in {e['year']} by the {c['occupation']} {c['name']}."
        elif t == "place":
            text = (f"{e['name']}. {e['name']} is a town in {e['country']}, founded in {e['founded']}. "
                    f"It has a population of {e['population']}.")
        elif t == "org":
            text = (f"{e['name']}. The {e['name']} was founded in {e['founded']} by {W[e['founder']]['name']} "
                    f"and is headquartered in {W[e['hq']]['name']}.")
        elif t == "event":
            text = f"{e['name']}. The {e['name']} took place in {e['year']} in {W[e['location']]['name']}."
        else:
            text = (f"{e['name']}. {e['name']} is a small hamlet near {W[e['near']]['name']} on the "
                    f"{e['river']} river, at an elevation of {e['elevation']} metres.")
        out.append(dict(id=e["id"], text=text))
    return out


# Question generators by type. Each returns (question, answer, support ids) or
# None when the sampled entities cannot give a question with a unique answer.
def _of(world, t, rng, cond=lambda e: True):
    pool = [e for e in world.values() if e["type"] == t and cond(e)]
    return rng.choice(pool) if pool else None


def q_single(world, rng):
    kind = rng.choice(["born", "birthplace", "creator", "hq", "country", "event"])
    if kind in ("born", "birthplace"):
        p = _of(world, "person", rng, lambda e: not e["shared"])
        if kind == "born":
            return f"In what year was {p['name']} born?", str(p["born"]), [p["id"]]
        return f"Where was {p['name']} born?", world[p["birthplace"]]["name"], [p["id"]]
    if kind == "creator":
        w = _of(world, "work", rng)
        return f"Who created the {w['kind']} {w['name']}?", world[w["creator"]]["name"], [w["id"]]
    if kind == "hq":
        o = _of(world, "org", rng)
        return f"Where is the {o['name']} headquartered?", world[o["hq"]]["name"], [o["id"]]
    if kind == "country":
        p = _of(world, "place", rng)
        return f"In which country is the town of {p['name']}?", p["country"], [p["id"]]
    e = _of(world, "event", rng)
    return f"Where did the {e['name']} take place?", world[e["location"]]["name"], [e["id"]]


def q_constrained(world, rng):
    # the constraint (year) selects one of several works of the same creator
    works = [w for w in world.values() if w["type"] == "work"]
    by = {}
    for w in works:
        by.setdefault(w["creator"], []).append(w)
    cands = [ws for c, ws in by.items() if len(ws) >= 2 and not world[c]["shared"]]
    if not cands:
        return None
    ws = rng.choice(cands)
    w = rng.choice(ws)
    c = world[w["creator"]]
    return (f"Which {w['kind']} by {c['name']} was released in {w['year']}?", w["name"],
            [c["id"], w["id"]])


def q_bridge(world, rng):
    kind = rng.choice(["creator_birthplace", "founder_born", "event_country"])
    if kind == "creator_birthplace":
        w = _of(world, "work", rng, lambda e: not world[e["creator"]]["shared"])
        c = world[w["creator"]]
        return (f"Where was the creator of the {w['kind']} {w['name']} born?",
                world[c["birthplace"]]["name"], [w["id"], c["id"]])
    if kind == "founder_born":
        o = _of(world, "org", rng)
        f = world[o["founder"]]
        return f"In what year was the founder of the {o['name']} born?", str(f["born"]), [o["id"], f["id"]]
    e = _of(world, "event", rng)
    loc = world[e["location"]]
    return f"In which country did the {e['name']} take place?", loc["country"], [e["id"], loc["id"]]


def q_comparison(world, rng):
    kind = rng.choice(["born", "founded", "population"])
    t, key = {"born": ("person", "born"), "founded": ("org", "founded"),
              "population": ("place", "population")}[kind]
    if rng.random() < 0.25:  # through a bridge on each side (2Wiki's compositional comparisons)
        ws = [w for w in world.values() if w["type"] == "work" and not world[w["creator"]]["shared"]]
        a, b = rng.sample(ws, 2)
        ca, cb = world[a["creator"]], world[b["creator"]]
        if ca["born"] == cb["born"]:
            return None
        return (f"Whose creator was born first, {a['name']} or {b['name']}?", (a if ca["born"] < cb["born"] else b)["name"],
                [a["id"], b["id"], ca["id"], cb["id"]])
    pool = [e for e in world.values() if e["type"] == t and not e.get("shared")]
    a, b = rng.sample(pool, 2)
    if a[key] == b[key]:
        return None
    if kind == "born":
        q, win = f"Who was born first, {a['name']} or {b['name']}?", min(a, b, key=lambda e: e[key])
    elif kind == "founded":
        q, win = (f"Which was founded earlier, the {a['name']} or the {b['name']}?",
                  min(a, b, key=lambda e: e[key]))
    else:
        q, win = (f"Which town has the larger population, {a['name']} or {b['name']}?",
                  max(a, b, key=lambda e: e[key]))
    return q, win["name"], [a["id"], b["id"]]


def q_temporal(world, rng):
    kind = rng.choice(["age", "gap", "population"])
    if kind == "age":
        w = _of(world, "work", rng, lambda e: not world[e["creator"]]["shared"])
        c = world[w["creator"]]
        return (f"How old was the creator of {w['name']} in the year it was released?",
                str(w["year"] - c["born"]), [w["id"], c["id"]])
    if kind == "gap":
        o = _of(world, "org", rng)
        return (f"How many years after the founding of its headquarters town was the {o['name']} founded?",
                str(o["founded"] - world[o["hq"]]["founded"]), [o["id"], o["hq"]])
    p = _of(world, "place", rng)
    return f"What is the population of {p['name']}?", str(p["population"]), [p["id"]]


def q_disambiguation(world, rng):
    p = _of(world, "person", rng, lambda e: e["shared"])
    if p is None:
        return None
    if rng.random() < 0.5:
        return (f"In what year was {p['name']}, the {p['occupation']}, born?", str(p["born"]), [p["id"]])
    return (f"Where was {p['name']}, the {p['occupation']}, born?", world[p["birthplace"]]["name"], [p["id"]])


def q_longtail(world, rng):
    h = _of(world, "hamlet", rng)
    if rng.random() < 0.5:
        return f"Which river flows past the hamlet of {h['name']}?", h["river"], [h["id"]]
    return f"At what elevation, in metres, lies the hamlet of {h['name']}?", str(h["elevation"]), [h["id"]]


QTYPES = {"single": q_single, "constrained": q_constrained, "bridge": q_bridge,
          "comparison": q_comparison, "temporal": q_temporal,
          "disambiguation": q_disambiguation, "longtail": q_longtail}
# Seven splits mirroring Search7's single-hop (NQ, TriviaQA, PopQA) / multi-hop
# (HotpotQA, 2Wiki, MuSiQue, Bamboogle) mix: split -> {question type: weight}.
SPLITS = {
    "nq": {"single": 0.5, "temporal": 0.3, "constrained": 0.2},
    "triviaqa": {"single": 0.5, "constrained": 0.5},
    "popqa": {"longtail": 0.7, "single": 0.3},
    "hotpotqa": {"bridge": 0.6, "comparison": 0.4},
    "2wiki": {"comparison": 0.5, "bridge": 0.3, "temporal": 0.2},
    "musique": {"bridge": 0.8, "disambiguation": 0.2},
    "bamboogle": {"bridge": 0.6, "disambiguation": 0.4},
}
SINGLE_HOP = ["nq", "triviaqa", "popqa"]
MULTI_HOP = ["hotpotqa", "2wiki", "musique", "bamboogle"]
TRAIN_SPLITS = ["nq", "hotpotqa"]  # the paper trains RL on NQ + HotpotQA


def build_questions(world, seed, n_train, n_test):
    """{split: {"train": [...], "test": [...]}}; a question text is never in two sets. The test sets are
    drawn first, so a small world's rare types (homonyms, hamlets) are not used up by training."""
    rng, seen, out = random.Random(seed + 1), set(), {split: {} for split in SPLITS}
    for part, n in (("test", n_test), ("train", n_train)):
        for split, mix in SPLITS.items():
            qs, tries = [], 0
            while len(qs) < n and tries < 200 * (n + 1):
                tries += 1
                qtype = rng.choices(list(mix), weights=list(mix.values()))[0]
                got = QTYPES[qtype](world, rng)
                if got is None or got[0] in seen:
                    continue
                seen.add(got[0])
                qs.append(dict(question=got[0], answer=got[1], support=got[2],
                               qtype=qtype, split=split))
            out[split][part] = qs
    return out



# ----- scripted teacher -----
# A stronger teacher for phase I (the paper uses GPT-5.5 or an SFT student): a
# scripted search agent that executes the strategy of its talent literally and
# answers only from the documents it retrieved. It knows the passage templates,
# not the answers. Without a talent it is naive: it searches the question once
# and reads the first passage of the right kind. Each talent adds the one move
# that its questions need, so Eq. (8) finds a positive utility for every talent
# on the questions it is meant for (bridge hop, one search per compared entity,
# the stated condition, the clarifier, arithmetic, the exact rare name, the
# name check) and none elsewhere.
TEACHER = {  # talent → (moves, least number of searches before answering)
    "talent_decomposition": ({"follow", "compare", "arith", "check"}, 3),  # one search per sub-question
    "talent_bridge_entity": ({"follow"}, 1),
    "talent_disambiguation": ({"clarify"}, 1),
    "talent_constraint": ({"condition"}, 1),
    "talent_comparison": ({"compare", "split"}, 1),
    "talent_longtail": ({"exact"}, 1),  # the exact-name search and the name check, for rare entities
    "talent_temporal_numeric": ({"arith", "follow"}, 1),
    "talent_verification": ({"check"}, 1),
}
FACT_RES = [
    (r"(?P<name>[A-Z][\w ]*?) was an? (?P<occupation>[\w ]+?) born in (?P<born>\d+) in (?P<birthplace>\w+), (?P<country>\w+)\.", "person"),
    (r"(?P<name>The [\w ]+?) is an? (?P<kind>[\w ]+?) released in (?P<year>\d+) by the (?P<occupation>\w+) (?P<creator>[A-Z][\w ]*?)\.", "work"),
    (r"(?P<name>\w+) is a town in (?P<country>\w+), founded in (?P<founded>\d+)\. It has a population of (?P<population>\d+)\.", "place"),
    (r"The (?P<name>[A-Z][\w ]*?) was founded in (?P<founded>\d+) by (?P<founder>[A-Z][\w ]*?) and is headquartered in (?P<hq>\w+)\.", "org"),
    (r"The (?P<name>[A-Z][\w ]*?) took place in (?P<year>\d+) in (?P<location>\w+)\.", "event"),
    (r"(?P<name>\w+) is a small hamlet near (?P<near>\w+) on the (?P<river>\w+) river, at an elevation of (?P<elevation>\d+) metres\.", "hamlet"),
]


def read_facts(text):
    """Facts of the passages in `text`, in retrieval order."""
    facts = []
    for doc in re.split(r"Doc \d+: ", text or ""):
        for rx, t in FACT_RES:
            facts += [dict(m.groupdict(), type=t) for m in re.finditer(rx, doc)]
    return facts


def _find(facts, t, **kw):
    return [f for f in facts if f["type"] == t and all(f.get(k) == v for k, v in kw.items())]


def _one(xs, key):
    return xs[0][key] if xs else None


BRIDGE_QS = (  # (question, bridge type, link field, target type, attribute)
    (r"In what year was the founder of the (.+) born\?", "org", "founder", "person", "born"),
    (r"Where was the creator of the [\w ]+? (The .+) born\?", "work", "creator", "person", "birthplace"),
    (r"In which country did the (.+) take place\?", "event", "location", "place", "country"),
)
SINGLE_QS = (  # (question, type, attribute)
    (r"In what year was (.+) born\?", "person", "born"),
    (r"Where was (.+) born\?", "person", "birthplace"),
    (r"Who created the [\w ]+? (The .+)\?", "work", "creator"),
    (r"Where is the (.+) headquartered\?", "org", "hq"),
    (r"In which country is the town of (.+)\?", "place", "country"),
    (r"Where did the (.+) take place\?", "event", "location"),
    (r"What is the population of (.+)\?", "place", "population"),
    (r"Which river flows past the hamlet of (.+)\?", "hamlet", "river"),
    (r"At what elevation, in metres, lies the hamlet of (.+)\?", "hamlet", "elevation"),
)
COMPARE_QS = ((r"Who was born first, (.+) or (.+)\?", "person", "born", min),
              (r"Which was founded earlier, the (.+) or the (.+)\?", "org", "founded", min),
              (r"Which town has the larger population, (.+) or (.+)\?", "place", "population", max))


def scripted_answer(q, facts, moves=frozenset()):
    """Answer a question from the facts read so far with the given moves; None
    when they do not suffice. Without a move the teacher reads naively: the
    first passage of the asked kind, ignoring clarifiers and conditions."""
    m = re.match(r"(In what year|Where) was (.+?), the (\w+), born\?", q)
    if m:  # disambiguation: only the clarifier tells the homonyms apart
        xs = _find(facts, "person", name=m.group(2))
        if "clarify" in moves:
            xs = [x for x in xs if x["occupation"] == m.group(3)]
        return _one(xs, "born" if m.group(1) == "In what year" else "birthplace")
    if m := re.match(r"Whose creator was born first, (.+) or (.+)\?", q):  # a bridge on each side, then compare
        ws = [_find(facts, "work", name=m.group(j)) for j in (1, 2)]
        if not {"follow", "compare"} <= moves:
            return next((w[0]["name"] for w in ws if w), None)
        cs = [_find(facts, "person", name=w[0]["creator"]) if w else [] for w in ws]
        return min(zip(ws, cs), key=lambda wc: int(wc[1][0]["born"]))[0][0]["name"] if all(cs) else None
    for rx, t, link, t2, attr in BRIDGE_QS:
        if m := re.match(rx, q):  # bridge: the answer is an attribute of the linked entity
            if not {"follow"} & moves:
                return _one(_find(facts, t2), attr)  # naive: any entity of the answer's kind
            return _one(_find(facts, t2, name=_one(_find(facts, t, name=m.group(1)), link)), attr)
    if m := re.match(r"How old was the creator of (.+) in the year it was released\?", q):
        w = _find(facts, "work", name=m.group(1))
        p = _find(facts, "person", name=w[0]["creator"]) if w else []
        if "arith" not in moves:
            return _one(w, "year")  # naive: copies a year instead of computing the age
        return str(int(w[0]["year"]) - int(p[0]["born"])) if w and p else None
    if m := re.match(r"How many years after the founding of its headquarters town was the (.+) founded\?", q):
        o = _find(facts, "org", name=m.group(1))
        p = _find(facts, "place", name=o[0]["hq"]) if o else []
        if "arith" not in moves:
            return _one(o, "founded")
        return str(int(o[0]["founded"]) - int(p[0]["founded"])) if o and p else None
    for rx, t, key, pick in COMPARE_QS:
        if m := re.match(rx, q):
            xs = [_find(facts, t, name=m.group(j)) for j in (1, 2)]
            if "compare" not in moves:  # naive: the first of the two it read about
                return next((x[0]["name"] for x in xs if x), None)
            return pick(xs, key=lambda x: int(x[0][key]))[0]["name"] if all(xs) else None
    if m := re.match(r"Which ([\w ]+?) by (.+) was released in (\d+)\?", q):
        cond = dict(year=m.group(3)) if "condition" in moves else {}
        return _one(_find(facts, "work", creator=m.group(2), **cond), "name")
    for rx, t, attr in SINGLE_QS:
        if m := re.match(rx, q):  # naive: the first passage of the kind, about whichever entity
            check = "check" in moves or ("exact" in moves and t == "hamlet")
            return _one(_find(facts, t, **({"name": m.group(1)} if check else {})), attr)
    return None


def single_attribute(q):
    """A question about one attribute of one named entity (no bridge, no clarifier)."""
    return (any(re.match(rx, q) for rx, _, _ in SINGLE_QS) and not any(re.match(b[0], q) for b in BRIDGE_QS)
            and not re.search(r", the \w+, born\?$", q))


def scripted_queries(q, facts, tid):
    """The search queries of the strategy of talent `tid` (None: no talent) given the facts so far."""
    moves = TEACHER[tid][0] if tid else set()
    if "split" in moves and (m := re.search(r", (?:the )?(.+) or (?:the )?(.+)\?", q)):
        return [m.group(1), m.group(2)]  # one search per compared entity
    if "exact" in moves and (m := re.search(r"hamlet of (\w+)", q)):
        return [m.group(1), f"{m.group(1)} hamlet river elevation"]  # the rare name, then expanded
    if "clarify" in moves and (m := re.match(r"(?:In what year|Where) was (.+?), the (\w+), born\?", q)):
        return [f"{m.group(1)} ({m.group(2)})"]  # the clarifier in the query
    if "clarify" not in moves:
        q = re.sub(r", the \w+, born\?$", " born?", q)  # the clarifier is dropped from the query
    plan = [q]
    if "follow" in moves or TEACHER.get(tid, (0, 1))[1] > 1:
        # sub-questions: the entities named in the documents that the question's entity links to
        named = [f for f in facts if f["name"] in q]
        plan += [x for f in named for x in (f.get("creator"), f.get("founder"), f.get("location"), f.get("hq")) if x]
        if TEACHER.get(tid, (0, 1))[1] > 1:  # decomposition: each named entity is a sub-question too
            plan += [f["name"] for f in named]
        if "compare" in moves and (m := re.search(r", (?:the )?(.+) or (?:the )?(.+)\?", q)):
            plan += [m.group(1), m.group(2)]
    return list(dict.fromkeys(plan))


def scripted_rollouts(tok, W, eps, info, args):
    """The teacher's trajectories in the same shape as multi_turn_rollouts (ids, mask)."""
    out = []
    for ep, inf in zip(eps, info):
        tid, facts, ids, mask, done_q = inf["talent"], [], [], [], 0
        moves, min_searches = TEACHER[tid] if tid else (set(), 1)
        q = ep["task"]["question"]
        # without verification's habit of searching first, a third of the single-attribute questions
        # (a hash of the question decides) are answered from memory: wrong in a fictional world
        searches_first = "check" in moves or ("exact" in moves and "hamlet" in q)
        from_memory = not searches_first and single_attribute(q) and zlib.crc32(q.encode()) % 3 == 0
        while not ep["done"]:
            plan = scripted_queries(q, facts, tid)
            if from_memory:
                plan = []
            ans = scripted_answer(q, facts, moves) if done_q >= min_searches else None
            if ans is not None or done_q >= len(plan) or ep["turns"] + 1 >= args.max_steps:
                ans = ans or scripted_answer(q, facts, moves) or (facts[0]["name"] if facts else "unknown")
                text = f"The documents give the answer.<answer>{ans}</answer>"
            else:
                text = f"I search for the next fact.<search>{plan[done_q]}</search>"
                done_q += 1
            t_ids = tok.encode(text, add_special_tokens=False)
            ids, mask = ids + t_ids, mask + [1] * len(t_ids)
            reply = env_reply(ep, text, W.search, args.max_steps)
            if reply is not None:
                facts += read_facts(reply)
                o = tok.encode(reply, add_special_tokens=False)
                ids, mask = ids + o, mask + [0] * len(o)
        out.append(Rollout([], ids + [tok.eos_token_id], mask + [1], text=""))
    return out


if __name__ == "__main__":
    main()
    exit_ranks()  # under torchrun: barrier, destroy, os._exit (plumbing.exit_ranks says why)
