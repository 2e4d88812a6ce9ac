"""Run by tests/test_grpo.py, once as a plain process and once under torchrun with 2 gloo ranks (DDP, or FSDP
with --fsdp after the three arguments): one GRPO update on a fixed batch of 5 groups; rank r owns groups
r, r+world, … (so the ranks run different numbers of micro-batches); rank 0 saves the full weights."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402
from plumbing import exit_ranks  # noqa: E402

model_dir, out, agg, *extra = sys.argv[1:]
p = argparse.ArgumentParser()
grpo.add_grpo_args(p)
args = p.parse_args(["--model", model_dir, "--micro-batch", "3", "--beta", "0.1", "--loss-agg", agg, "--passes", "2", "--no-autocast", *extra])
dist = plumbing.setup_distributed()
model, tok = plumbing.load_policy(args, dist)
ref = plumbing.load_model(model_dir, dist, trainable=False)[0]
with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient
    for q in ref.parameters():
        q.add_(0.05 * torch.randn(q.shape, generator=torch.Generator().manual_seed(q.numel())))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
g = torch.Generator().manual_seed(1)
rollouts = []
for grp in range(5):
    for k in range(3):
        plen, clen = 3 + grp, 2 + (grp * 3 + k) % 5
        mask = [1] * clen
        mask[clen // 2] = 0 if clen > 2 else 1  # one environment token in the middle
        rollouts.append(grpo.Rollout(torch.randint(0, 500, (plen,), generator=g).tolist(),
                                     torch.randint(0, 500, (clen,), generator=g).tolist(), mask,
                                     reward=float(torch.rand(1, generator=g)), group=grp))
mine = [r for r in rollouts if r.group % dist.world == dist.rank]
metrics = grpo.grpo_update(model, ref, opt, mine, args, dist)
state = plumbing.full_state_dict(model)  # under FSDP a collective: every rank calls it
if dist.is_main:
    torch.save({"state": state, "metrics": metrics}, out)
exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
