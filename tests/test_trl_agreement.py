"""grpo.py's loss against code no one here wrote: TRL's own GRPOTrainer._compute_loss (trl 1.16, a test
dependency in requirements.txt) on identical per-token log-probs of π_θ, π_θold and π_ref, advantages and
masks, with μ > 1 (π_θ ≠ π_θold, so clipping is active), β > 0, for each loss type and ratio level; and the
group advantages against TRL's and verl's formulas.

The adapter (trl_loss) builds a GRPOTrainer without __init__ (no model, no data set): its log-prob hook returns the
given log-probs and its accelerator is one process. Everything after that hook is TRL's code, unchanged.
Tolerance: both sides run the same float64 arithmetic in a different order (sums over ≤ 42 terms), so they agree
to ~1e-15; 1e-10 leaves room and still catches any difference of formula (those are ≥ 1e-3 here)."""
import types
from collections import defaultdict

import pytest
import torch

import grpo
import plumbing

import trl.trainer.grpo_trainer as trl_grpo  # requirements.txt: trl (a test dependency)
import trl.trainer.utils as trl_utils

TOL = 1e-10


def _inputs(seed=0, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3                     # log π_θold
    logp = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)            # μ > 1: π_θ has moved
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    sampler = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)         # log π_sampler (vLLM)
    sampler[1, 1] = old[1, 1] - 2.0                                                    # π_θold/π_sampler = e² > C: capped
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lens = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(T)[None] < lens[:, None]).double()
    mask[0, 2] = 0.0                                                                   # an environment token inside a row
    return logp, old, ref, sampler, adv, mask


def trl_loss(loss_type, level, logp, old, ref, adv, mask, beta, eps_low, eps_high, is_ratio=None, t_max=None):
    """TRL's GRPOTrainer._compute_loss on these log-probs (see the module docstring)."""
    t = trl_grpo.GRPOTrainer.__new__(trl_grpo.GRPOTrainer)
    one = types.SimpleNamespace(num_processes=1, reduce=lambda x, reduction: x, gather=lambda x: x,
                                gather_for_metrics=lambda x: x)
    t.__dict__.update(
        accelerator=one, model=torch.nn.Module().train(), beta=beta, epsilon_low=eps_low, epsilon_high=eps_high,
        loss_type=loss_type, importance_sampling_level=level, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        aux_loss_enabled=False, use_vllm=is_ratio is not None, vllm_importance_sampling_correction=is_ratio is not None,
        current_gradient_accumulation_steps=1, max_completion_length=t_max, _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
        args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1))
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    B, T = logp.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": mask.sum(),
              "importance_sampling_ratio": is_ratio}
    return trl_grpo.GRPOTrainer._compute_loss(t, None, inputs)


def our_loss(agg, level, logp, old, ref, adv, mask, beta, eps_low, eps_high, tis=None, t_max=None):
    A = adv[:, None].expand_as(logp)                                                   # outcome advantage at every token
    per_tok, ratio, _ = grpo.grpo_token_loss(logp, old, ref, A, beta, eps_low, eps_high, tis,
                                             mask if level == "sequence" else None)
    clipped = ((ratio < 1 - eps_low) & (A < 0)) | ((ratio > 1 + eps_high) & (A > 0))
    return grpo.aggregate(per_tok, mask, agg, mask.sum(), logp.shape[0], t_max), (clipped.double() * mask).sum()


CASES = [("token", "dapo", "token"), ("seq", "grpo", "token"), ("dr_grpo", "dr_grpo", "token"),
         ("token", "dapo", "sequence"), ("seq", "grpo", "sequence")]


@pytest.mark.parametrize("agg,loss_type,level", CASES)
@pytest.mark.parametrize("tis_cap", [0.0, 3.0])
def test_grpo_loss_and_gradient_equal_trl(agg, loss_type, level, tis_cap):
    """--loss-agg token/seq/dr_grpo = TRL dapo/grpo/dr_grpo; --ratio-level sequence = TRL's GSPO
    (importance_sampling_level="sequence"); --tis-cap C = TRL's vllm_importance_sampling_correction with the
    weights min(π_θold/π_sampler, C) fed in (TRL computes them inline during generation: not callable alone)."""
    logp, old, ref, sampler, adv, mask = _inputs()
    eps_low, eps_high = (0.2, 0.28) if level == "token" else (0.03, 0.04)             # GSPO's clip is small: make it bite
    tis = grpo.tis_weights(old, sampler, tis_cap) if tis_cap else None
    assert tis is None or (tis == tis_cap).any() and (tis < 1).any()                    # the cap and the down-weighting both act
    ours_lp, trl_lp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours, n_clipped = our_loss(agg, level, ours_lp, old, ref, adv, mask, 0.04, eps_low, eps_high, tis, t_max=9)
    theirs = trl_loss(loss_type, level, trl_lp, old, ref, adv, mask, 0.04, eps_low, eps_high, tis, t_max=9)
    assert n_clipped > 0                                                                # clipping is active
    ours.backward(), theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=TOL, rel=TOL)
    assert torch.allclose(ours_lp.grad, trl_lp.grad, atol=TOL, rtol=TOL)
    assert ours_lp.grad.abs().sum() > 0 and (ours_lp.grad[mask == 0] == 0).all()


def test_tis_weight_hand_value_and_cap():
    # w = min(π_θold / π_sampler, C): ratios 0.5, 2 and 8 with C = 3; a token without a sampler log-prob weighs 1
    old = torch.log(torch.tensor([[0.1, 0.2, 0.8, 0.3]]))
    sampler = torch.log(torch.tensor([[0.2, 0.1, 0.1, float("nan")]]))
    assert torch.allclose(grpo.tis_weights(old, sampler, 3.0), torch.tensor([[0.5, 2.0, 3.0, 1.0]]))


def test_group_advantages_equal_trl_and_verl_formulas():
    """TRL (grpo_trainer._generate_and_score_completions, inline): (r − mean_G) / (nanstd_G + 1e-4) with TRL's own
    nanstd (Bessel); scale_rewards="none" drops the division. verl (not importable here: it needs ray, omegaconf,
    tensordict; its published code, verl 0.9.1 trainer/ppo/core_algos.py compute_grpo_outcome_advantage, is read
    and its formula typed here): (r − mean) / (torch.std + ε) for groups of ≥ 2, ε = 1e-6 by default; a group of one
    gets mean 0, std 1 there (grpo.py gives it 0; not exercised)."""
    g = torch.Generator().manual_seed(3)
    r = torch.rand(4, 5, generator=g, dtype=torch.float64).round(decimals=1)            # P = 4 prompts, G = 5
    mean = torch.nanmean(r, dim=1)                                                      # TRL: torch.nanmean
    trl_adv = (r - mean[:, None]) / (trl_utils.nanstd(r, dim=1)[:, None] + 1e-4)
    assert torch.allclose(grpo.group_advantages(r, True, 1e-4), trl_adv, atol=1e-12)
    assert torch.allclose(grpo.group_advantages(r, False, 1e-4), r - mean[:, None], atol=1e-12)
    verl_adv = torch.stack([(row - row.mean()) / (torch.std(row) + 1e-6) for row in r])
    assert torch.allclose(grpo.group_advantages(r, True, 1e-6), verl_adv, atol=1e-12)


def test_token_entropy_equals_trl_entropy_from_logits():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1))
    for tau in (1.0, 0.7):
        assert torch.allclose(plumbing.token_entropy(logits, tau), trl_utils.entropy_from_logits(logits / tau), atol=1e-5)
