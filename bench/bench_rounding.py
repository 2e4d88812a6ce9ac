"""Does bf16 rounding damp GRPO's step (issue #22)? One fixed batch of toy-task rollouts, sampled once from the
embedded model, then --steps GRPO updates at --lr in fp32 and in bf16 (MasterAdamW) from the same start (the
embedded checkpoint is bf16, so fp32 starts from the same values); π_ref = the start in fp32. After each step:

  kl, grad_norm   as grpo_update logs them for that step (the KL is of the weights before it)
  moved           share of the compute weights (what the forward sees) that differ from the start
  |dW_compute|    norm of compute weights − start, over all parameters
  |dW_master|     the same for the fp32 masters (fp32: the weights themselves); ratio = compute / master

    .venv/bin/python bench/bench_rounding.py [--steps 2] [--lr 2e-5]

Seen (AMD EPYC AVX2, 1 thread, 6 prompts × G = 6, 32 tokens, lr 2e-5; README "fp32 and bf16 alike"):
round-to-nearest compute weights moved 3.2 % of their elements and 0.24 of the master's update norm after step 1."""
import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402
from tasks import toy  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
grpo.add_grpo_args(p)
p.add_argument("--steps", type=int, default=2, help="GRPO steps per precision")
p.add_argument("--prompts-per-step", type=int, default=6, help="P (grpo.py --preset tiny: 6)")
p.set_defaults(lr=2e-5, G=6, micro_batch=18, temperature=0.7, max_new_tokens=32)  # grpo.py --preset tiny
args = p.parse_args()
torch.manual_seed(args.seed)
dist = plumbing.Dist()
base, tok = plumbing.load_model(args.model, dist, "float32")
prompts, answers = toy.toy_batch(tok, 0, args, dist)
rollouts = grpo.sample_group_rollouts(plumbing.HFSampler(base, tok), prompts, args.G, args)
for r in rollouts:
    r.reward = toy.toy_reward(r.text, answers[r.group])
print(f"{len(rollouts)} rollouts, mean reward {sum(r.reward for r in rollouts) / len(rollouts):.3f}, lr {args.lr}", flush=True)
ref = plumbing.frozen_copy(base)
init = [w.detach().clone() for w in base.parameters()]
n = sum(w.numel() for w in init)
for precision in ("fp32", "bf16"):
    args.precision = precision
    model = copy.deepcopy(base).to(torch.float32 if precision == "fp32" else torch.bfloat16)
    opt = plumbing.make_optimizer(model, args)
    for step in range(args.steps):
        t0 = time.time()
        m = grpo.grpo_update(model, ref, opt, [grpo.Rollout(r.prompt_ids, r.ids, r.mask, reward=r.reward, group=r.group)
                                               for r in rollouts], args, dist)
        comp = [w.detach().float() for w in model.parameters()]
        mast = opt.masters() if isinstance(opt, plumbing.MasterAdamW) else comp
        moved = sum((c != w).sum().item() for c, w in zip(comp, init)) / n
        dc, dm = (sum(((c - w) ** 2).sum().item() for c, w in zip(x, init)) ** 0.5 for x in (comp, mast))
        print(f"{precision} step {step}: kl {m['kl']:.4f} grad_norm {m['grad_norm']:.2f} | moved {moved:.4f} "
              f"|dW_compute| {dc:.4f} |dW_master| {dm:.4f} ratio {dc / dm:.3f} ({time.time() - t0:.0f} s)", flush=True)
