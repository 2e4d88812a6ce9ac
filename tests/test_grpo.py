"""grpo.py: each equation against a hand value or a naive loop, then the mechanics
(accumulation, DDP, resume, vLLM sync), bad inputs, and a smoke run of the toy demo."""
import argparse
import json
import math
import os
import random
import re
import sys

import pytest
import torch

import grpo
import plumbing
from conftest import ONE_THREAD, run_group
from tasks import toy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_args(*argv):
    p = argparse.ArgumentParser()
    grpo.add_grpo_args(p)
    return p.parse_args(list(argv))


# ----- equations -----

def test_group_advantage_hand_value():
    # rewards (1, 0, 0, 1): mean 0.5, Bessel std sqrt(1/3) → ±0.5/(0.57735 + 1e-4)
    A = grpo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale=True, eps=1e-4)
    want = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert torch.allclose(A, torch.tensor([[want, -want, -want, want]]), atol=1e-6)
    assert torch.allclose(grpo.group_advantages(torch.tensor([[3.0, 1.0]]), scale=False), torch.tensor([[1.0, -1.0]]))


def test_group_advantage_is_per_group_not_per_batch():
    A = grpo.group_advantages(torch.tensor([[1.0, 0.0], [10.0, 10.0]]))
    assert A[0, 0] > 0 > A[0, 1] and torch.all(A[1] == 0)


def test_dapo_eq8_clip_uses_eps_low_and_eps_high():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]]))  # ratios against old = 0
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    surr, ratio = grpo.clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # A>0, ρ=1.5 → clipped at 1+ε_high; A<0, ρ=0.5 → clipped at 1−ε_low; the other two are not clipped (min keeps ρA)
    assert torch.allclose(surr, torch.tensor([[1.28, -0.8, -1.5, 0.5]]), atol=1e-6)
    assert torch.allclose(ratio, torch.tensor([[1.5, 0.5, 1.5, 0.5]]))


def test_deepseekmath_eq4_k3_kl_value_and_sign():
    logp = torch.log(torch.tensor([0.5, 0.25])).requires_grad_()
    ref = torch.log(torch.tensor([0.25, 0.25]))
    kl = grpo.kl_k3(logp, ref)
    # π_ref/π = 0.5 → 0.5 − log 0.5 − 1 = 0.19315; equal policies → 0
    assert torch.allclose(kl, torch.tensor([0.5 - math.log(0.5) - 1, 0.0]), atol=1e-6)
    kl.sum().backward()
    assert logp.grad[0] > 0  # minimising the KL lowers log π where π > π_ref
    assert (grpo.kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()


def test_deepseekmath_eq3_loss_sign_and_beta():
    logp = torch.zeros(1, 2, requires_grad=True)
    per_tok, _, kl = grpo.grpo_token_loss(logp, logp.detach(), None, torch.tensor([[2.0, -1.0]]), beta=0.5, eps_low=0.2, eps_high=0.2)
    assert torch.allclose(per_tok, torch.tensor([[-2.0, 1.0]]))  # −ρÂ at ρ = 1
    per_tok.sum().backward()
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]  # descent raises log π of the positive-advantage token
    ref = torch.full((1, 2), -1.0)
    per_tok, _, kl = grpo.grpo_token_loss(torch.zeros(1, 2), torch.zeros(1, 2), ref, torch.zeros(1, 2), beta=0.5, eps_low=0.2, eps_high=0.2)
    assert torch.allclose(per_tok, 0.5 * kl) and (kl > 0).all()


def test_aggregation_token_mean_and_sequence_mean():
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert grpo.aggregate(per_tok, mask, "token", 4, 2).item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert grpo.aggregate(per_tok, mask, "seq", 4, 2).item() == pytest.approx((6 / 3 + 4 / 1) / 2)


def test_environment_tokens_are_masked():
    rows = [([5, 6], [7, 8, 9, 10], [1, 0, 0, 1], [1.0, 99.0, 99.0, 1.0]), ([5, 6, 7], [8], [1], [2.0])]
    b = grpo.collate(rows, 0, torch.device("cpu"))
    assert b["start"] == 2
    assert b["mask"].tolist() == [[1, 0, 0, 1], [0, 1, 0, 0]]  # row 2's completion starts one position later
    per_tok = b["adv"].clone()
    changed = per_tok.clone()
    changed[0, 1:3] = -1e6  # whatever happens at environment positions does not reach the loss
    assert grpo.aggregate(per_tok, b["mask"], "token", 3, 2) == grpo.aggregate(changed, b["mask"], "token", 3, 2)


def test_dynamic_sampling_drops_zero_variance_groups():
    rs = [grpo.Rollout([1], [2], [1], reward=r, group=g) for g, r in [(0, 1.0), (0, 1.0), (1, 0.0), (1, 1.0), (2, 0.0), (2, 0.0)]]
    kept, dropped = grpo.dynamic_sampling(rs)
    assert dropped == 2 and {r.group for r in kept} == {1}


def test_caller_supplied_token_advantages_are_kept():
    rs = [grpo.Rollout([1], [2, 3], [1, 1], reward=1.0, adv=[0.3, -0.7], group=0), grpo.Rollout([1], [2], [1], reward=0.0, group=0)]
    grpo.assign_advantages(rs, make_args())
    assert rs[0].adv == [0.3, -0.7] and rs[1].adv[0] < 0


# ----- the update against a naive loop -----

def _rollouts(n_groups=3, G=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [grpo.Rollout(torch.randint(0, 300, (3 + k % 2,), generator=g).tolist(),
                         torch.randint(0, 300, (1 + (3 * i + k) % 4,), generator=g).tolist(), [1] * (1 + (3 * i + k) % 4),
                         reward=float(torch.rand(1, generator=g)), group=i)
            for i in range(n_groups) for k in range(G)]


def _fresh(tiny_model_dir):
    dist = plumbing.setup_distributed()
    model = plumbing.load_model(tiny_model_dir, dist)[0]
    return model, dist


def _masked_spans(rs):
    """The same rollouts with multi-turn masks: every third completion token (and a whole tail) is environment."""
    return [grpo.Rollout(r.prompt_ids, r.ids + [7, 8], [int(t % 3 != 1) for t in range(len(r.ids))] + [0, 0],
                         reward=r.reward, group=r.group) for r in rs]


def _perturbed_ref(model):
    """π_ref ≠ π_θ, so the KL term has a gradient."""
    ref = plumbing.frozen_copy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return ref


def _kl_loss_and_grads(model, logp, ref_logp, b, agg, n_seqs):
    """The GRPO loss (β = 0.1, μ = 1) of these log-probs against π_ref, backpropagated: (loss, every gradient)."""
    per_tok, _, _ = grpo.grpo_token_loss(logp, logp.detach(), ref_logp, b["adv"], 0.1, 0.2, 0.2)
    loss = grpo.aggregate(per_tok, b["mask"], agg, b["mask"].sum(), n_seqs)
    loss.backward()
    return loss, {k: p.grad.clone() for k, p in model.named_parameters()}


def test_logits_only_at_trained_positions_equal_the_full_head(tiny_model_dir):
    """token_logprobs runs the head on mask-1 positions only: the values there, and the gradient of a masked loss
    with β > 0 against π_ref, equal those of the full (B, T, V) head followed by log-softmax at every position."""
    rs = _masked_spans(_rollouts(n_groups=3, G=3))
    model, dist = _fresh(tiny_model_dir)
    ref = _perturbed_ref(model)
    b = grpo.collate([(r.prompt_ids, r.ids, r.mask, [1.0 - 2 * (i % 2)] * len(r.ids)) for i, r in enumerate(rs)], 0, dist.device)
    grads, values = [], []
    for full in (False, True):
        model.zero_grad()
        if full:  # today's reference path: the head on every completion position, then mask the loss
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, b["start"] - 1:-1]
            logp = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, b["input_ids"][:, b["start"]:, None])[..., 0]
            with torch.no_grad():
                rl = torch.log_softmax(ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, b["start"] - 1:-1]
                                       .float() / 0.7, -1).gather(-1, b["input_ids"][:, b["start"]:, None])[..., 0]
        else:
            logp = grpo.token_logprobs(model, b, 0.7)
            with torch.no_grad():
                rl = grpo.token_logprobs(ref, b, 0.7)
        loss, g = _kl_loss_and_grads(model, logp, rl, b, "token", len(rs))
        values.append((logp * b["mask"], loss))
        grads.append(g)
    (lp_kept, loss_kept), (lp_full, loss_full) = values
    assert b["mask"].min() == 0 and torch.allclose(lp_kept, lp_full, atol=1e-5) and torch.allclose(loss_kept, loss_full, atol=1e-6)
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-4), k


def test_shared_prompt_logits_equal_the_full_pass(tiny_model_dir):
    """Prefix sharing (shared_prompt_logits): groups whose G rows share one prompt, prompts of different lengths (one
    of a single token), masked spans and padding. The log-probs, the loss against π_ref and every gradient equal the
    full pass over each row's prompt + completion (collate's batch without its "prefix")."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 2, 1, 7)]
    rows = []
    for i, p in enumerate(prompts):
        for k in range(3):  # a group: one prompt, three completions of different lengths and masks
            c = torch.randint(0, 300, (2 + (i + 2 * k) % 5,), generator=g).tolist()
            rows.append((p, c, [int(t % 3 != 1) for t in range(len(c))], [1.0 - k] * len(c)))
    model, dist = _fresh(tiny_model_dir)
    ref = _perturbed_ref(model)
    b = grpo.collate(rows, 0, dist.device)
    assert b["prefix"]["ids"].shape == (4, 6)  # 4 distinct prompts, not 12 rows; the longest less its last token
    out = []
    for shared in (True, False):
        batch = b if shared else {k: v for k, v in b.items() if k != "prefix"}
        model.zero_grad()
        logp = grpo.token_logprobs(model, batch, 0.7)
        with torch.no_grad():
            rl = grpo.token_logprobs(ref, batch, 0.7)
        out.append((logp, rl, *_kl_loss_and_grads(model, logp, rl, b, "seq", len(rows))))
    (lp_s, rl_s, loss_s, g_s), (lp_f, rl_f, loss_f, g_f) = out
    assert torch.allclose(lp_s, lp_f, atol=1e-5) and torch.allclose(rl_s, rl_f, atol=1e-5) and torch.allclose(loss_s, loss_f, atol=1e-6)
    assert (lp_s != 0).sum() == b["mask"].sum() > 0
    for k in g_f:
        assert torch.allclose(g_s[k], g_f[k], atol=1e-6, rtol=1e-4), k


@pytest.mark.parametrize("agg", ["token", "seq"])
@pytest.mark.parametrize("masked", [False, True], ids=["all-trained", "masked-spans"])
def test_grpo_update_matches_naive_loop_and_accumulation(tiny_model_dir, agg, masked):
    rs = _masked_spans(_rollouts()) if masked else _rollouts()
    grads = []
    for mb in (1, 4):  # gradient accumulation must not change the gradient
        model, dist = _fresh(tiny_model_dir)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        grpo.grpo_update(model, None, opt, [grpo.Rollout(r.prompt_ids, r.ids, r.mask, reward=r.reward, group=r.group) for r in rs],
                         make_args("--micro-batch", str(mb), "--loss-agg", agg, "--beta", "0", "--grad-clip", "1e9", "--no-autocast"), dist)
        grads.append({k: before[k] - v for k, v in model.state_dict().items()})
    # naive: one sequence at a time, token by token, Python sums
    model, dist = _fresh(tiny_model_dir)
    A = {}
    for grp in {r.group for r in rs}:
        rw = torch.tensor([[r.reward for r in rs if r.group == grp]])
        A[grp] = grpo.group_advantages(rw)[0].tolist()
    total, n_tok = 0.0, sum(sum(r.mask) for r in rs)
    seen = {}
    for r in rs:
        a = A[r.group][seen.setdefault(r.group, 0)]
        seen[r.group] += 1
        logits = model(torch.tensor([r.prompt_ids + r.ids])).logits[0]
        seq = 0.0
        for t, tok in enumerate(r.ids):
            if r.mask[t]:  # environment tokens are context, never trained
                lp = torch.log_softmax(logits[len(r.prompt_ids) + t - 1], -1)[tok]
                seq = seq + (-(torch.exp(lp - lp.detach()) * a))
        total = total + (seq / n_tok if agg == "token" else seq / sum(r.mask) / len(rs))
    total.backward()
    for k, p in model.named_parameters():
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-6), k
        assert torch.allclose(grads[0][k], p.grad, atol=1e-5), k


# ----- mixed precision -----

# a capability table: (device description, what --precision auto must pick)
CAPABILITIES = [
    ({"device": "cuda", "name": "NVIDIA H100", "features": {"bf16"}}, "bf16"),
    ({"device": "cuda", "name": "Tesla T4", "features": set()}, "fp32"),                       # sm75: bf16 emulated
    ({"device": "cpu", "name": "Xeon Sapphire Rapids", "features": {"avx2", "avx512f", "amx_bf16", "amx_tile"}}, "bf16"),
    ({"device": "cpu", "name": "Xeon Cooper Lake", "features": {"avx2", "avx512f", "avx512_bf16"}}, "bf16"),
    ({"device": "cpu", "name": "Xeon Skylake", "features": {"avx2", "avx512f", "avx512bw"}}, "fp32"),  # AVX-512, no bf16
    ({"device": "cpu", "name": "AMD EPYC", "features": {"avx", "avx2"}}, "fp32"),                 # this project's CPU class
    ({"device": "cpu", "name": "", "features": set()}, "fp32"),
]


@pytest.mark.parametrize("cap,want", CAPABILITIES, ids=[c["name"] or "unknown" for c, _ in CAPABILITIES])
def test_precision_auto_follows_native_bf16_and_explicit_wins(cap, want):
    got, why = plumbing.choose_precision("auto", cap)
    assert got == want and "auto" in why and want in why and "\n" not in why
    for explicit in ("bf16", "autocast", "fp32"):  # an explicit --precision always wins, whatever the hardware
        assert plumbing.choose_precision(explicit, cap)[0] == explicit


def test_precision_and_dtype_flags_resolve_auto(monkeypatch):
    """--precision auto and --dtype auto become this machine's choice at parse time; explicit values stay. An explicit
    --precision wins for the frozen models too: --dtype auto follows the parsed precision, not the hardware (an
    explicit fp32 on a native-bf16 CPU once left π_ref in bf16), whether the flags come first or last."""
    for native, precision, dtype in ((True, "bf16", "bfloat16"), (False, "fp32", "float32")):
        monkeypatch.setattr(plumbing, "auto_precision", lambda: precision)
        assert (make_args().precision, make_args().dtype) == (precision, dtype), native
        args = make_args("--precision", "autocast", "--dtype", "bfloat16")
        assert (args.precision, args.dtype, plumbing.compute_dtype(args)) == ("autocast", "bfloat16", "bfloat16")
        for explicit, follows in (("fp32", "float32"), ("bf16", "bfloat16"), ("autocast", "bfloat16")):
            assert make_args("--precision", explicit).dtype == follows, (native, explicit)
            assert make_args("--dtype", "auto", "--precision", explicit).dtype == follows, (native, explicit)
        assert make_args("--no-autocast").dtype == "float32", native
        assert make_args("--precision", "fp32", "--dtype", "bfloat16").dtype == "bfloat16", native  # explicit stays
        frozen = argparse.ArgumentParser()  # a script's own frozen-model flag resolves the same way (skill_entropy)
        grpo.add_grpo_args(frozen)
        frozen.add_argument("--frozen-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
        assert frozen.parse_args(["--precision", "fp32"]).frozen_dtype == "float32", native
        assert frozen.parse_known_args(["--precision", "bf16", "--other"])[0].frozen_dtype == "bfloat16", native
    assert plumbing.compute_dtype(make_args("--no-autocast")) == "float32"


def test_bf16_master_updates_match_fp32_updates(tiny_model_dir):
    """--precision bf16 (bf16 weights, fp32 masters and AdamW moments) against --precision fp32 from the same
    bf16-representable start: 3 GRPO steps (β > 0, μ = 2, 2 micro-batches) move the (master) weights the same
    way, within 5 % of the update's norm per tensor (seen: 2.8 % at most), and log the same loss and KL within 2e-3."""
    dist = plumbing.setup_distributed()
    rs = _rollouts(n_groups=4, G=3)
    out = {}
    for precision, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        args = make_args("--model", tiny_model_dir, "--precision", precision, "--dtype", dtype, "--lr", "1e-3",
                         "--beta", "0.1", "--passes", "2", "--micro-batch", "7")
        model, _ = plumbing.load_policy(args, dist)
        ref = plumbing.load_model(tiny_model_dir, dist, dtype, trainable=False)[0]
        with torch.no_grad():
            for m in (model, ref):
                for p in m.parameters():
                    p.copy_(p.bfloat16())  # the same start in both runs: the fp32 weights rounded to bf16
        init = {k: v.float().clone() for k, v in model.named_parameters()}
        opt = plumbing.make_optimizer(model, args)
        assert isinstance(opt, plumbing.MasterAdamW) == (precision == "bf16")
        metrics = [grpo.grpo_update(model, ref, opt, [grpo.Rollout(r.prompt_ids, r.ids, r.mask, reward=r.reward, group=r.group)
                                                      for r in rs], args, dist) for _ in range(3)]
        # the weights being optimised: the fp32 masters under bf16 (the bf16 copy rounds them, e.g. to 1/128 near 1.0)
        weights = zip(init, opt.masters()) if precision == "bf16" else model.named_parameters()
        out[precision] = {k: v.detach() - init[k] for k, v in weights}, metrics
        if precision == "bf16":
            assert all(p.dtype == torch.bfloat16 and ((p.float() - m).abs() <= m.abs() * 2 ** -7).all()  # stochastic rounding: ≤ 1 ulp
                       for p, m in zip(opt.model_params, opt.masters()))
            assert all(m.dtype == torch.float32 for m in opt.masters()) and opt.state[opt.masters()[0]]["exp_avg"].dtype == torch.float32
    (d32, m32), (d16, m16) = out["fp32"], out["bf16"]
    for k in d32:
        assert (d16[k] - d32[k]).norm() <= 0.05 * d32[k].norm() + 1e-6, (k, ((d16[k] - d32[k]).norm() / d32[k].norm()).item())
    for a, b in zip(m32, m16):
        assert b["loss"] == pytest.approx(a["loss"], abs=2e-3) and b["kl"] == pytest.approx(a["kl"], abs=2e-3)
    assert m32[-1]["kl"] > 0  # the policy left π_ref, so the KL term was exercised


def test_bf16_compute_weights_follow_fp32_updates_below_half_an_ulp(tiny_model_dir):
    """Issue #22: at lr 1e-5 five Adam steps move a weight by ≤ 5e-5, less than half a bf16 ulp at |w| ≈ 0.02
    (6e-5), so round-to-nearest compute weights lag (their update projects onto fp32's with a coefficient of
    0.66 here; small weights, with finer ulps, still move). With stochastic rounding the bf16 compute weights move like fp32's on average: the
    projection of their update on fp32's is 1 within 10 % (the rounding noise is zero-mean and spread over 1.6 M
    weights; the rest is bf16 forward/backward noise in the gradients, ~3 % at lr 1e-3), and each compute weight
    sits within one ulp of its master."""
    dist = plumbing.setup_distributed()
    rs = _rollouts(n_groups=4, G=3)
    out = {}
    for precision, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        args = make_args("--model", tiny_model_dir, "--precision", precision, "--dtype", dtype, "--lr", "1e-5", "--beta", "0.1")
        model, _ = plumbing.load_policy(args, dist)
        ref = plumbing.load_model(tiny_model_dir, dist, dtype, trainable=False)[0]
        init = [p.detach().float().clone() for p in model.parameters()]  # the tiny model is saved in fp32: round it once
        opt = plumbing.make_optimizer(model, args)
        for _ in range(5):
            grpo.grpo_update(model, ref, opt, [grpo.Rollout(r.prompt_ids, r.ids, r.mask, reward=r.reward, group=r.group)
                                               for r in rs], args, dist)
        out[precision] = torch.cat([(p.detach().float() - w).flatten() for p, w in zip(model.parameters(), init)])
        if precision == "bf16":
            nearest = torch.cat([(m.bfloat16().float() - w).flatten() for m, w in zip(opt.masters(), init)])
            for p, m in zip(model.parameters(), opt.masters()):
                assert ((p.float() - m).abs() <= m.abs() * 2 ** -7 + 1e-30).all()  # one ulp at most
    d32, d16 = out["fp32"], out["bf16"]
    proj = lambda d: (d @ d32 / (d32 @ d32)).item()  # noqa: E731
    assert d32.abs().max() <= 5.1e-5 and proj(d16) == pytest.approx(1.0, abs=0.1), proj(d16)
    assert proj(nearest) < 0.8, proj(nearest)  # what round-to-nearest would have done: the damping this test guards


def test_master_weights_keep_updates_below_bf16_resolution(tiny_model_dir):
    """lr = 1e-6 is far below bf16's spacing near |w| ~ 0.02 (≈ 1.2e-4): plain AdamW on bf16 weights rounds every
    step away, while MasterAdamW accumulates 300 steps of −lr·sign(g) in the fp32 masters and the bf16 weights follow."""
    dist = plumbing.setup_distributed()
    args = make_args("--lr", "1e-6")
    plain, master = (plumbing.load_model(tiny_model_dir, dist, "bfloat16")[0] for _ in range(2))
    init = [p.detach().clone() for p in plain.parameters()]
    opts = torch.optim.AdamW(plain.parameters(), lr=1e-6, weight_decay=0.0), plumbing.make_optimizer(master, args)
    for _ in range(300):
        for model, opt in zip((plain, master), opts):
            opt.zero_grad()
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            opt.step()
    def moved(model):  # share of weights whose bf16 value changed
        return sum((p != w).sum().item() for p, w in zip(model.parameters(), init)) / sum(w.numel() for w in init)
    assert moved(plain) < 0.05 and moved(master) > 0.5
    for m, p, w in zip(opts[1].masters(), master.parameters(), init):
        assert torch.allclose(m, w.float() - 300 * 1e-6, atol=1e-6) and ((p.float() - m).abs() <= m.abs() * 2 ** -7).all()


def test_several_passes_use_old_logprobs(tiny_model_dir):
    model, dist = _fresh(tiny_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    m = grpo.grpo_update(model, None, opt, _rollouts(), make_args("--passes", "3", "--beta", "0"), dist)
    assert m["ratio"] != pytest.approx(1.0, abs=1e-6)  # passes 2 and 3 see π_θ ≠ π_θold


def test_sft_loss_is_cross_entropy_on_targets_only(tiny_model_dir):
    model, dist = _fresh(tiny_model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    ex = [([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10])]
    m = grpo.sft_update(model, opt, ex, make_args("--no-autocast"), dist)
    with torch.no_grad():
        nll = [-torch.log_softmax(model(torch.tensor([p + t])).logits[0, len(p) - 1 + i], -1)[tok]
               for p, t in ex for i, tok in enumerate(t)]
    assert m["sft_loss"] == pytest.approx(torch.stack(nll).mean().item(), rel=1e-5)


def test_sft_loop_reads_shuffled_passes_and_learns(tiny_model_dir, tmp_path, monkeypatch):
    """grpo.sft_loop: epochs × ⌈n / B⌉ steps of B examples, consecutive draws from a stream of shuffled passes (so
    each pass holds every example once), one JSONL row per step; batch 0 = every example each step; the real
    sft_update (spied, not replaced) lowers the loss on a tiny model."""
    model, dist = _fresh(tiny_model_dir)
    seen, real = [], grpo.sft_update
    monkeypatch.setattr(grpo, "sft_update", lambda m, opt, ex, *a: seen.append([e[0][0] for e in ex]) or real(m, opt, ex, *a))
    examples = [([k, 7, 8], [k + 10, k + 20]) for k in range(5)]
    out = grpo.sft_loop(model, examples, make_args("--no-autocast"), dist, lr=1e-2, batch=2, epochs=4, seed=1, log_dir=tmp_path)
    assert out["sft_steps"] == 12 and [len(b) for b in seen] == [2] * 12 and out["sft_examples"] == 5
    stream = [k for b in seen for k in b]
    assert all(sorted(stream[i:i + 5]) == list(range(5)) for i in range(0, 20, 5))  # 4 passes, each a permutation
    rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(12)) and rows[-1]["sft_loss"] < 0.8 * rows[0]["sft_loss"]
    seen.clear()
    assert grpo.sft_loop(model, examples, make_args(), dist, lr=1e-3, batch=0, steps=2)["sft_steps"] == 2
    assert [sorted(b) for b in seen] == [list(range(5))] * 2
    assert grpo.sft_loop(model, [], make_args(), dist, lr=1e-3, batch=4, epochs=3)["sft_steps"] == 0


@pytest.mark.parametrize("change", ["sft_warmup", "checkpoint_load"])
def test_master_adamw_follows_weights_changed_outside_it(tiny_model_dir, change):
    """A MasterAdamW built before the weights change elsewhere (an SFT warm-up with its own optimizer, a checkpoint
    load) must not write its stale fp32 masters back at its next step (5d20b35: the warm-up silently undone)."""
    dist = plumbing.setup_distributed()
    args = make_args("--lr", "1e-6", "--grad-clip", "1e9")
    model = plumbing.load_model(tiny_model_dir, dist, "bfloat16")[0]
    init = [p.detach().clone() for p in model.parameters()]
    opt = plumbing.make_optimizer(model, args)
    assert isinstance(opt, plumbing.MasterAdamW)
    if change == "sft_warmup":
        grpo.sft_loop(model, [([1, 2, 3], [4, 5, 6])], args, dist, lr=1e-2, batch=1, steps=3)
    else:
        with torch.no_grad():
            model.load_state_dict({k: v + 0.5 for k, v in model.state_dict().items()})
    changed = [p.detach().clone() for p in model.parameters()]
    assert sum((c != w).sum().item() for c, w in zip(changed, init)) > 0.5 * sum(w.numel() for w in init)
    grpo.sft_update(model, opt, [([1, 2, 3], [4, 5])], args, dist)   # one step of the old optimizer, lr 1e-6
    for p, c, m in zip(model.parameters(), changed, opt.masters()):
        assert torch.allclose(p.float(), c.float(), atol=2e-2, rtol=1e-2) and torch.allclose(m, c.float(), atol=1e-5)


# ----- off-policy tokens, forced tokens, logged entropy (issue #24) -----

def _logp_of(model, rs, temperature=1.0):
    """log π_θ of each rollout token, one row at a time (the samplers' reference point)."""
    rows = [grpo.collate([(r.prompt_ids, r.ids, [1] * len(r.ids), [0.0] * len(r.ids))], 0, torch.device("cpu")) for r in rs]
    with torch.no_grad():
        return [grpo.token_logprobs(model, b, temperature)[0].tolist() for b in rows]


def _update(tiny_model_dir, rs, *flags):
    """One grpo_update with SGD(lr = 1): the weight change is minus the gradient."""
    model, dist = _fresh(tiny_model_dir)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    m = grpo.grpo_update(model, None, torch.optim.SGD(model.parameters(), lr=1.0), rs,
                         make_args("--beta", "0", "--grad-clip", "1e9", "--no-autocast", *flags), dist)
    return {k: before[k] - v.detach() for k, v in model.named_parameters()}, m


def test_tis_weighs_tokens_by_old_over_sampler_and_logs_the_mismatch(tiny_model_dir):
    """--tis-cap C: π_sampler = 2 π_θold on every token → w = 0.5, the gradient halves; π_sampler = π_θold / 8 → w
    capped at C = 3; logged: mean |log π_θold − log π_sampler| = log 2 and its k3 KL = 2 − 1 − log 2 (r = 1/2:
    r − 1 − log r = 0.5 − 1 + log 2)."""
    model, _ = _fresh(tiny_model_dir)
    lps = _logp_of(model, _rollouts())
    def rollouts(shift):
        rs = _rollouts()
        for r, lp in zip(rs, lps):
            r.sample_logp = [x + shift for x in lp]
        return rs
    d0, m0 = _update(tiny_model_dir, rollouts(math.log(2)))                            # off: the sampler's log-probs unused
    d_half, m_half = _update(tiny_model_dir, rollouts(math.log(2)), "--tis-cap", "3")
    d_cap, _ = _update(tiny_model_dir, rollouts(-math.log(8)), "--tis-cap", "3")
    for k in d0:
        assert torch.allclose(d_half[k], 0.5 * d0[k], atol=1e-7, rtol=1e-3), k
        assert torch.allclose(d_cap[k], 3.0 * d0[k], atol=1e-7, rtol=1e-3), k
    assert m0["sampler_logp_diff"] == pytest.approx(math.log(2), rel=1e-4)
    assert m0["sampler_kl_k3"] == pytest.approx(0.5 - 1 + math.log(2), rel=1e-3)
    assert m_half["tis_weight"] == pytest.approx(0.5, rel=1e-4) and m0["tis_weight"] == 0.0


def test_forced_tokens_leave_the_loss_and_the_kl(tiny_model_dir):
    """Rollout.forced (a grammar allowed one token): the update equals the one with those tokens masked out, the
    token count excludes them, and it differs from training on them."""
    forced, masked = _rollouts(), _rollouts()
    for f, m in zip(forced, masked):
        f.forced = [1] + [0] * (len(f.ids) - 1) if len(f.ids) > 1 else [0]
        m.mask = [1 - x for x in f.forced]
    d_forced, m_forced = _update(tiny_model_dir, forced, "--beta", "0.1")
    d_masked, m_masked = _update(tiny_model_dir, masked, "--beta", "0.1")
    d_all, m_all = _update(tiny_model_dir, _rollouts(), "--beta", "0.1")
    assert m_forced["n_tokens"] == m_masked["n_tokens"] < m_all["n_tokens"]
    assert all(torch.allclose(d_forced[k], d_masked[k], atol=1e-7) for k in d_all)
    assert not all(torch.allclose(d_forced[k], d_all[k], atol=1e-6) for k in d_all)


def test_logged_entropy_and_frac_groups_zero_std(tiny_model_dir):
    """entropy = mean over trained tokens of H(π_θ(· | q, o_<t)) at the sampling temperature (a naive loop here);
    frac_groups_zero_std = share of groups whose rewards all agree (1 of 3 here)."""
    rs = _rollouts()
    for r in rs[:2]:                                                                   # group 0: both rewards 1
        r.reward = 1.0
    model, _ = _fresh(tiny_model_dir)
    H = []
    with torch.no_grad():
        for r in rs:
            logits = model(torch.tensor([r.prompt_ids + r.ids])).logits[0, len(r.prompt_ids) - 1:-1] / 0.7
            H += (-(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)).tolist()
    _, m = _update(tiny_model_dir, rs, "--temperature", "0.7")
    assert m["entropy"] == pytest.approx(sum(H) / len(H), rel=1e-4)
    assert m["frac_groups_zero_std"] == pytest.approx(1 / 3)


def test_dr_grpo_and_gspo_flags_reach_the_loss(tiny_model_dir):
    """--loss-agg dr_grpo divides the token sum by N · --max-new-tokens (so its gradient is the token mean's times
    n_tokens / (N · T_max)). --ratio-level sequence: at μ = 1 (s_i = 1, ∂s_i/∂log π_t = 1/|o_i|) GSPO's gradient is
    the token-level one; at μ = 2 the second pass sees s_i ≠ ρ_{i,t} and the updates part (formulas against TRL:
    test_trl_agreement.py)."""
    n_tok = sum(len(r.ids) for r in _rollouts())
    d_tok, _ = _update(tiny_model_dir, _rollouts(), "--loss-agg", "token")
    d_dr, _ = _update(tiny_model_dir, _rollouts(), "--loss-agg", "dr_grpo", "--max-new-tokens", "10")
    d_gspo, _ = _update(tiny_model_dir, _rollouts(), "--loss-agg", "token", "--ratio-level", "sequence")
    for k in d_tok:
        assert torch.allclose(d_dr[k], d_tok[k] * n_tok / (6 * 10), atol=1e-7, rtol=1e-4), k
        assert torch.allclose(d_gspo[k], d_tok[k], atol=1e-7, rtol=1e-4), k
    d_tok2, _ = _update(tiny_model_dir, _rollouts(), "--passes", "2")
    d_gspo2, m = _update(tiny_model_dir, _rollouts(), "--passes", "2", "--ratio-level", "sequence")
    assert m["ratio"] != pytest.approx(1.0, abs=1e-6)
    assert not all(torch.allclose(d_tok2[k], d_gspo2[k], atol=1e-6) for k in d_tok)


def test_hf_sampler_returns_each_sampled_tokens_logprob(tiny_model_dir):
    """HFSampler's Sample.logprobs = log π(o_t) at the sampling temperature (top-p 1: the trainer's token_logprobs, up
    to the KV cache's float error); with top-p 0.9 the nucleus renormalises: ≥ the untruncated log-prob."""
    model, dist = _fresh(tiny_model_dir)
    sampler = plumbing.HFSampler(model, plumbing.load_model(tiny_model_dir, dist)[1])
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    for top_p in (1.0, 0.9):
        torch.manual_seed(0)
        outs = sampler.generate(prompts, 2, 6, 0.7, top_p)
        rs = [grpo.Rollout(p, s.ids, [1] * len(s.ids)) for p, ss in zip(prompts, outs) for s in ss]
        ref = _logp_of(model, rs, 0.7)
        got = [s.logprobs for ss in outs for s in ss]
        assert all(len(g) == len(r.ids) for g, r in zip(got, rs))
        flat_g, flat_r = torch.tensor(sum(got, [])), torch.tensor(sum(ref, []))
        if top_p == 1.0:
            assert torch.allclose(flat_g, flat_r, atol=1e-4)
        else:
            assert (flat_g >= flat_r - 1e-4).all() and (flat_g > flat_r + 1e-3).any()


def test_grammar_replay_marks_tokens_the_json_schema_forced(tiny_model_dir):
    """plumbing.GrammarReplay (vLLM's rollouts): replaying a completion of {"verdict": "A" | "B"} through xgrammar,
    a token is forced iff exactly one token was allowed; the EOS after the closing brace is the only token allowed
    there; a token outside the grammar ends the replay (0 after it)."""
    tok = plumbing.load_model(tiny_model_dir, plumbing.Dist())[1]
    replay = plumbing.GrammarReplay(tok, len(tok))
    schema = {"type": "object", "properties": {"verdict": {"enum": ["A", "B"]}}, "required": ["verdict"],
              "additionalProperties": False}
    ids, other = (tok.encode(json.dumps({"verdict": v}, separators=(",", ":")), add_special_tokens=False) for v in "AB")
    split = next(i for i, (x, y) in enumerate(zip(ids, other)) if x != y)          # where A and B part: a decision
    forced = replay.forced(schema, ids + [tok.eos_token_id])
    assert len(forced) == len(ids) + 1 and forced[-1] == 1 and forced[split] == 0
    bad = tok.encode('{"verdict":"C"}', add_special_tokens=False)
    assert replay.forced(schema, bad)[split:] == [0] * (len(bad) - split)


def test_vllm_rollouts_train_only_the_tokens_where_the_schema_left_a_choice_of_text(tiny_model_dir):
    """VLLMSampler.sample's Sample.forced is 1 − GrammarReplay.decided: xgrammar admits every tokenization of the
    schema's fixed text, so pieces of the literal '{"verdict":"' have several allowed tokens (one-token rule: not
    forced, trained with the unconstrained π_θ) but no choice of text; only the A/B token is trained."""
    import types
    tok = plumbing.load_model(tiny_model_dir, plumbing.Dist())[1]
    replay = plumbing.GrammarReplay(tok, len(tok))
    schema = {"type": "object", "properties": {"verdict": {"enum": ["A", "B"]}}, "required": ["verdict"],
              "additionalProperties": False}
    ids, other = (tok.encode(json.dumps({"verdict": v}, separators=(",", ":")), add_special_tokens=False) for v in "AB")
    split = next(i for i, (x, y) in enumerate(zip(ids, other)) if x != y)
    ids = ids + [tok.eos_token_id]
    completion = types.SimpleNamespace(token_ids=ids, text=tok.decode(ids[:-1]), logprobs=None)
    s = plumbing.VLLMSampler.sample(types.SimpleNamespace(tok=tok, grammar=replay), completion, None, schema)
    assert s.forced == [0 if i == split else 1 for i in range(len(ids))], s.forced      # the verdict alone is trained
    assert sum(replay.forced(schema, ids)) < sum(s.forced)                          # the one-token rule misses pieces
    assert plumbing.VLLMSampler.sample(types.SimpleNamespace(tok=tok, grammar=replay), completion, None, None).forced is None


def test_grammar_replay_decided_vectorised_equals_the_loop_over_tokens():
    """GrammarReplay.decided compares the allowed tokens with the longest one byte by byte over a byte
    matrix; it gives what the loop over the allowed tokens' texts gave (a choice of text: a token that is no
    prefix of the longest), on gpu/tokenizer's 1,024 tokens: fixed text, an enum, a number, a free string, a
    rejection."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "gpu", "tokenizer"))
    replay = plumbing.GrammarReplay(tok, len(tok))

    def loop(schema, ids):  # the loop decided() replaced
        out = []
        for a in replay._allowed(schema, ids):
            words = [replay.vocab[i] for i in a]
            longest = max(words, key=len)
            out.append(int(any(not longest.startswith(w) for w in words)))
        return out + [1] * (len(ids) - len(out))
    schema = {"type": "object", "properties": {"verdict": {"enum": ["A", "B", "Tie"]}, "n": {"type": "integer"},
                                               "why": {"type": "string", "maxLength": 60}},
              "required": ["verdict", "n", "why"], "additionalProperties": False}
    texts = ['{"verdict":"Tie","n":-42,"why":"both say 7"}', '{"verdict":"A","n":3,"why":""}',
             '{"verdict":"C"}', '{"verdict":"B","n":1']
    seen = set()
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        got = replay.decided(schema, ids)
        assert got == loop(schema, ids), text
        seen.update(got)
    assert seen == {0, 1}


# ----- bad inputs -----

def test_bad_inputs_do_not_crash(tiny_model_dir):
    model, dist = _fresh(tiny_model_dir)
    opt = plumbing.make_optimizer(model, make_args())
    empty = [grpo.Rollout([1, 2], [], [], reward=1.0, group=0), grpo.Rollout([1, 2], [], [], reward=0.0, group=0)]
    assert grpo.grpo_update(model, None, opt, empty, make_args(), dist)["skipped"] == 1.0
    one = [grpo.Rollout([1, 2], [3, 4], [1, 1], reward=1.0, group=0)]  # a group of one: advantage 0, no NaN
    m = grpo.grpo_update(model, None, opt, one, make_args(), dist)
    assert m["skipped"] == 0.0 and math.isfinite(m["loss"]) and one[0].adv == [0.0, 0.0]
    equal = [grpo.Rollout([1, 2], [3], [1], reward=0.5, group=0) for _ in range(4)]
    m = grpo.grpo_update(model, None, opt, equal, make_args("--dynamic-sampling"), dist)
    assert m["n_groups_dropped"] == 1 and m["skipped"] == 1.0 and m["reward"] == 0.5  # reward counts dropped groups too
    assert all(p.isfinite().all() for p in model.parameters())


def test_missing_model_path_is_one_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="cannot load model"):
        plumbing.resolve_model(str(tmp_path / "no-such-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no config.json"):
        plumbing.resolve_model(str(tmp_path / "empty"))


# ----- distributed, resume, samplers -----

@pytest.mark.multirank
@pytest.mark.parametrize("agg", ["token", "seq"])
def test_ddp_two_gloo_ranks_equal_one_process(tiny_model_dir, tmp_path, agg):
    env = {**os.environ, **ONE_THREAD}
    script = os.path.join(ROOT, "tests", "ddp_check.py")
    run_group([sys.executable, script, tiny_model_dir, str(tmp_path / "one.pt"), agg], check=True, env=env, timeout=300)
    _torchrun(script, tiny_model_dir, str(tmp_path / "two.pt"), agg)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    for k in one["state"]:
        assert torch.allclose(one["state"][k], two["state"][k], atol=1e-6), k
    assert one["metrics"]["loss"] == pytest.approx(two["metrics"]["loss"], rel=1e-5)
    assert one["metrics"]["n_tokens"] == two["metrics"]["n_tokens"]


@pytest.mark.multirank
def test_gather_and_broadcast_objects_two_gloo_ranks(tmp_path):
    """plumbing.gather_objects: rank 0's list then rank 1's, on both ranks; plumbing.broadcast_object: rank 0's object on both."""
    out = tmp_path / "objs"
    _torchrun(os.path.join(ROOT, "tests", "objects_check.py"), str(out))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"objs.{rank}").read_text())
        assert got["gather"] == [{"rank": 0, "k": 0}, {"rank": 1, "k": 0}, {"rank": 1, "k": 1}]
        assert got["broadcast"] == ["from", 0, [0, 0, 0]]
    dist = plumbing.Dist()  # one process: the list (a copy) and the object itself
    items = [1, 2]
    assert plumbing.gather_objects(items, dist) == items and plumbing.gather_objects(items, dist) is not items
    assert plumbing.broadcast_object(items, dist) is items


def _torchrun(*argv, timeout=900):
    """2 gloo ranks; --standalone: the rendezvous binds a free port the OS picks, never a fixed number.
    Returns stderr; a rank that fails shows its tail."""
    out = run_group([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *argv],
                    capture_output=True, text=True, env={**os.environ, **ONE_THREAD},
                    timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stderr


@pytest.mark.multirank
@pytest.mark.parametrize("agg", ["token", "seq"])
def test_fsdp_two_gloo_ranks_equal_one_process(tiny_model_dir, tmp_path, agg):
    # --grad-clip 0.05 is below this batch's gradient norm (about 0.1): clip_grad_norm_ over DTensor shards is checked too
    script = os.path.join(ROOT, "tests", "ddp_check.py")
    run_group([sys.executable, script, tiny_model_dir, str(tmp_path / "one.pt"), agg, "--grad-clip", "0.05"],
              check=True, env={**os.environ, **ONE_THREAD}, timeout=300)
    _torchrun(script, tiny_model_dir, str(tmp_path / "two.pt"), agg, "--grad-clip", "0.05", "--fsdp")
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert set(one["state"]) == set(two["state"])
    for k in one["state"]:
        assert torch.allclose(one["state"][k], two["state"][k], atol=1e-6), k
    assert one["metrics"]["loss"] == pytest.approx(two["metrics"]["loss"], rel=1e-5)
    assert one["metrics"]["n_tokens"] == two["metrics"]["n_tokens"]
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-5) and one["metrics"]["grad_norm"] > 0.05


@pytest.mark.heavy(62)
@pytest.mark.multirank
def test_fsdp_resume_and_checkpoints(tiny_model_dir, tmp_path):
    """FSDP, two gloo ranks: a resumed run ends bit-identical to an uninterrupted one; its checkpoint loads in
    transformers; a DDP checkpoint loads into an FSDP policy and AdamW exactly (saved back, the files are equal)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    script = os.path.join(ROOT, "tests", "fsdp_check.py")
    common = ["--model", tiny_model_dir, "--sampler", "hf", "--G", "3", "--prompts-per-step", "2", "--max-new-tokens", "6",
              "--eval-n", "0", "--lr", "1e-3", "--save-every", "2", "--beta", "0.1"]
    _torchrun(script, "main", *common, "--fsdp", "--steps", "4", "--run-dir", str(tmp_path / "a"))
    _torchrun(script, "main", *common, "--fsdp", "--steps", "2", "--run-dir", str(tmp_path / "b"))
    first = (tmp_path / "b" / "metrics.jsonl").read_text()
    err = _torchrun(script, "main", *common, "--fsdp", "--steps", "4", "--run-dir", str(tmp_path / "b"),
                    "--resume")
    # a resume, not a restart from step 0 (which ends with the same weights): rows 0-1 are the first run's
    assert f"resumed from {tmp_path / 'b' / 'ckpt'} at step 1" in err, err[-2000:]
    assert (tmp_path / "b" / "metrics.jsonl").read_text().startswith(first) and first.count("\n") == 2
    _torchrun(script, "main", *common, "--steps", "2", "--run-dir", str(tmp_path / "ddp"))  # DDP
    _torchrun(script, "roundtrip", tiny_model_dir, str(tmp_path / "ddp"), str(tmp_path / "back"))

    def weights(run):
        return load_file(tmp_path / run / "ckpt" / "model" / "model.safetensors")

    def adam(run):
        return torch.load(tmp_path / run / "ckpt" / "state.pt", weights_only=False)["optimizer"]["state"]

    a, init = weights("a"), load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    assert set(a) == set(init) and not all(torch.equal(a[k], init[k]) for k in a)  # training moved the weights
    for x, y in [(a, weights("b")), (weights("ddp"), weights("back"))]:
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)
    for x, y in [(adam("a"), adam("b")), (adam("ddp"), adam("back"))]:
        assert set(x) == set(y) and all(torch.equal(x[i][k], y[i][k]) for i in x for k in x[i])
    assert plumbing.read_metrics(tmp_path / "a")[3]["reward"] == plumbing.read_metrics(tmp_path / "b")[3]["reward"]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "ckpt" / "model")
    assert type(hf).__name__ == "LlamaForCausalLM" and all(torch.equal(hf.state_dict()[k], a[k]) for k in a)


@pytest.mark.heavy(38)
@pytest.mark.multirank
def test_fsdp_vllm_greedy_equals_hf_greedy_after_sync(tmp_path):
    """FSDP, two gloo ranks, one vLLM engine per rank: after SFT on the sharded model and a sync, vLLM's greedy
    reply is HF's (a 2-layer random model with vLLM-sized heads; SFT makes the reply a memorised sentence)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(plumbing.embedded_model_path())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    err = _torchrun(os.path.join(ROOT, "tests", "fsdp_check.py"), "vllm", str(tmp_path / "m"), str(tmp_path / "out"))
    assert "Traceback" not in err, err[-3000:]  # plumbing.exit_ranks lets vLLM's shutdown destroy its groups first
    for rank in range(2):
        r = json.loads((tmp_path / f"out.{rank}").read_text())
        assert "banana split" in r["hf"] and r["hf"] == r["vllm"] and r["same_ids"], r
        assert r["stale"] == r["before"] and "banana split" not in r["stale"], r  # without the sync vLLM has the old weights


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_matches_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch, capsys, precision):
    """Two steps, then a resume to four = four steps at once (weights, step, rows). The resume must start
    at step 2: a run restarted from step 0 would end with the same weights (it is deterministic), so it says
    "resumed … at step 1", keeps rows 0-1 as the first run wrote them (wall times too), logs steps 2-3 only."""
    # a dense reward so the random tiny model gets a learning signal (the arithmetic reward would be all zero)
    monkeypatch.setattr(toy, "toy_reward", lambda text, answer: (len(text) % 5) / 4)
    common = ["--model", tiny_model_dir, "--sampler", "hf", "--G", "3", "--prompts-per-step", "2", "--max-new-tokens", "6",
              "--eval-n", "0", "--lr", "1e-3", "--save-every", "2", "--beta", "0.1", "--precision", precision]
    grpo.main(common + ["--steps", "4", "--run-dir", str(tmp_path / "a")])
    grpo.main(common + ["--steps", "2", "--run-dir", str(tmp_path / "b")])
    first, _ = (tmp_path / "b" / "metrics.jsonl").read_text(), capsys.readouterr()
    grpo.main(common + ["--steps", "4", "--run-dir", str(tmp_path / "b"), "--resume"])  # --steps may change
    out = capsys.readouterr()
    assert f"resumed from {tmp_path / 'b' / 'ckpt'} at step 1" in out.err
    assert re.findall(r"^step +(\d+) \|", out.out, re.M) == ["2", "3"]
    assert (tmp_path / "b" / "metrics.jsonl").read_text().startswith(first) and first.count("\n") == 2
    from safetensors.torch import load_file
    a = load_file(tmp_path / "a" / "ckpt" / "model" / "model.safetensors")
    b = load_file(tmp_path / "b" / "ckpt" / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    init = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    assert not all(torch.equal(a[k], init[k]) for k in a)  # training moved the weights
    sa, sb = (torch.load(tmp_path / r / "ckpt" / "state.pt", weights_only=False) for r in "ab")
    assert sa["step"] == sb["step"] == 3
    assert plumbing.read_metrics(tmp_path / "a")[3]["reward"] == plumbing.read_metrics(tmp_path / "b")[3]["reward"]


def test_multi_turn_rollout_masks_environment_replies(tiny_model_dir):
    dist = plumbing.setup_distributed()
    model, tok = plumbing.load_model(tiny_model_dir, dist)
    torch.manual_seed(0)
    replies = {}

    def env_step(i, text):
        replies[i] = replies.get(i, 0) + 1
        return "<information>Doc 1: a fact</information>" if replies[i] < 3 else None

    args = make_args("--max-new-tokens", "4")
    rs = grpo.multi_turn_rollouts(plumbing.HFSampler(model, tok), tok, [[1, 2, 3]] * 2, env_step, max_turns=5, args=args)
    obs = tok.encode("<information>Doc 1: a fact</information>", add_special_tokens=False)
    for r in rs:
        assert r.mask.count(0) == 2 * len(obs) and len(r.mask) == len(r.ids)
        assert "Doc 1: a fact" in r.text and sum(r.mask) > 0


@pytest.mark.heavy(54)
def test_vllm_greedy_equals_hf_greedy_after_weight_update():
    """Embedded model: an SFT update changes the greedy answer; after sync vLLM agrees with HF.
    A prompt longer than --max-model-len gets an empty completion instead of an error. A JSON schema
    constrains decoding (one for all prompts or one per prompt)."""
    code = r'''
import grpo, plumbing, argparse, json
p = argparse.ArgumentParser(); grpo.add_grpo_args(p); args = p.parse_args(["--lr", "1e-4"])
d = plumbing.setup_distributed()
m, tok = plumbing.load_model("embedded", d)
v, h = plumbing.VLLMSampler(m, tok, args, d), plumbing.HFSampler(m, tok)
q = [grpo.chat_ids(tok, [{"role": "user", "content": "Name a fruit."}])]
before = v.generate(q, 1, 12, 0.0)[0][0].text
opt = plumbing.make_optimizer(m, args)
tgt = tok.encode("The secret word is banana split.", add_special_tokens=False) + [tok.eos_token_id]
for _ in range(8):
    grpo.sft_update(m, opt, [(q[0], tgt)], args, d)
stale = v.generate(q, 1, 12, 0.0)[0][0].text
v.sync(m)
hf, vl = h.generate(q, 1, 12, 0.0)[0][0], v.generate(q, 1, 12, 0.0)[0][0]
mixed = v.generate([q[0] * 300, q[0]], 1, 12, 0.0)  # a prompt over --max-model-len: empty, the batch goes on
yes_no = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
fruit = {"type": "object", "properties": {"fruit": {"enum": ["kiwi", "plum"]}}, "required": ["fruit"],
         "additionalProperties": False}
one = v.generate(q, 3, 24, 1.0, json_schema=yes_no)[0]                 # one schema for every prompt
per = v.generate([q[0], q[0]], 2, 24, 1.0, json_schema=[yes_no, fruit])  # one schema per prompt
import torch
lp_err = []  # vLLM's reported log π_sampler of each sampled token against the trainer's log-softmax (TIS's input)
for s in v.generate(q, 2, 8, 1.0)[0]:
    with torch.no_grad():
        logits = m(torch.tensor([q[0] + s.ids])).logits[0, len(q[0]) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.ids)[:, None])[:, 0]
    lp_err.append(float((ref - torch.tensor(s.logprobs)).abs().max()) if len(s.logprobs) == len(s.ids) else 1e9)
in_line = not v.llm.llm_engine.engine_core.engine_core.structured_output_manager._use_async_grammar_compilation
print("RESULT", json.dumps([before, stale, hf.text, vl.text, hf.ids == vl.ids, mixed[0][0].text, mixed[1][0].text,
                            [s.text for s in one], [[s.text for s in g] for g in per], lp_err, in_line]))
plumbing.exit_ranks()  # every script's last line: a plain process leaves vLLM's own group to vLLM's shutdown
'''
    out = run_group([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    assert line, out.stderr[-3000:]
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    before, stale, hf, vl, same_ids, too_long, short, one, per, lp_err, in_line = json.loads(line[0][len("RESULT "):])
    assert in_line  # plumbing.compile_grammars_in_line reached vLLM's switch: a schema's timing moves no sample
    assert max(lp_err) < 2e-2, lp_err  # the sampler's log-probs are the policy's (fp32 here; another kernel)
    assert "banana split" in hf and hf == vl and same_ids
    # json_schema: constrained decoding (structured outputs), one schema for all prompts or one per prompt
    assert all(json.loads(t)["answer"] in ("yes", "no") for t in one)
    assert all(t == json.dumps(json.loads(t), separators=(",", ":")) for t in one)  # compact: no optional spaces
    assert all(json.loads(t)["answer"] in ("yes", "no") for t in per[0])
    assert all(json.loads(t)["fruit"] in ("kiwi", "plum") for t in per[1])
    assert too_long == "" and short == vl
    assert stale == before and "banana split" not in stale  # without the sync vLLM still has the old weights


def test_toy_eval_chance_line_is_the_best_constant_answers_share():
    """toy_eval against a hand count: the 8 held-out problems of seed 0 have the answers 7, 11, 24, 23, 9, 17, 20,
    9, so always answering 9 scores 2/8 (not 1/7, one over the distinct answers); a sampler that adds the prompt's
    two numbers is right on all 8."""
    class Tok:  # a prompt's ids: the characters of its user message
        def apply_chat_template(self, messages, **kw):
            return [ord(c) for c in messages[-1]["content"]]

    class Adder:
        def generate(self, prompts, n, max_new_tokens, temperature):
            sums = [sum(map(int, re.findall(r"\d+", "".join(map(chr, p))))) for p in prompts]
            return [[argparse.Namespace(text=f"It is {x}.")] for x in sums]
    items, chance = toy.toy_eval(Adder(), Tok(), argparse.Namespace(seed=0, max_new_tokens=8), n=8)
    assert items == [1.0] * 8 and chance == 2 / 8


@pytest.mark.heavy(48)
def test_toy_demo_smoke(tmp_path):
    out = run_group([sys.executable, "grpo.py", "--preset", "tiny", "--steps", "2", "--G", "2", "--prompts-per-step", "2",
                     "--max-new-tokens", "16", "--eval-n", "4", "--sampler", "hf", "--run-dir", str(tmp_path)],
                    cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out greedy accuracy" in out.stdout and "step     1 |" in out.stdout
    assert (tmp_path / "curves.png").stat().st_size > 1000 and len(plumbing.read_metrics(tmp_path)) == 2
    assert (tmp_path / "ckpt" / "model" / "config.json").exists()
    res = json.loads((tmp_path / "results.json").read_text())  # the headline: paired after vs before, and vs a constant
    after_before, vs_const = res["headline"]
    assert after_before["b"] == "before" and after_before["n_items"] == 4
    # the chance line recounted: the best constant answer's share of toy_eval's 4 held-out answers (its seed −1 − seed)
    rng = random.Random(-1 - grpo.build_parser().get_default("seed"))
    answers = [toy.toy_problem(rng)[1] for _ in range(4)]
    assert after_before["chance"] == pytest.approx(max(map(answers.count, answers)) / 4)
    assert vs_const["b"] == "chance" and vs_const["mean_b"] == after_before["chance"] and "acc_after" in res
    agg = run_group([sys.executable, "grpo.py", "--aggregate", str(tmp_path)], cwd=ROOT,
                    capture_output=True, text=True, timeout=120)
    assert agg.returncode == 0 and "| held-out greedy accuracy: after vs before GRPO | after | before |" in agg.stdout
    twice = run_group([sys.executable, "grpo.py", "--aggregate", str(tmp_path), str(tmp_path)], cwd=ROOT,
                      capture_output=True, text=True, timeout=120)  # one run counted twice: refused
    assert twice.returncode != 0 and "listed twice" in twice.stderr


def test_hf_sampler_sync_points_at_the_given_model(tiny_model_dir):
    """HF generate has no weight copy: `sync(model)` makes later samples come from that model."""
    import torch
    dist = plumbing.setup_distributed()
    a, tok = plumbing.load_model(tiny_model_dir, dist)
    b, _ = plumbing.load_model(tiny_model_dir, dist)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(torch.randn_like(p))  # b: different weights, same architecture
    q = [grpo.chat_ids(tok, [{"role": "user", "content": "Name a fruit."}])]
    s = plumbing.HFSampler(a, tok)
    from_a = s.generate(q, 1, 8, 0.0)[0][0].ids
    s.sync(b)
    from_b = s.generate(q, 1, 8, 0.0)[0][0].ids
    assert from_b == plumbing.HFSampler(b, tok).generate(q, 1, 8, 0.0)[0][0].ids and from_b != from_a
