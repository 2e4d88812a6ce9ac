"""Training-phase throughput: grpo_update against a bare forward+backward of the same tokens.

    .venv/bin/python bench/bench_train.py [--model embedded] [--seqs 64] [--len 96]

Both process the same padded batch of `seqs` sequences (prompt + completion) in
micro-batches of --micro-batch. The bare loop is `model(ids).logits → mean → backward`
and an optimizer step, at the same precision (--autocast); grpo_update adds the π_ref forward (β > 0), log-prob gathering,
the clipped loss and its bookkeeping. The ratio is grpo_update tokens/s ÷ bare tokens/s."""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
grpo.add_grpo_args(p)
p.add_argument("--seqs", type=int, default=32)
p.add_argument("--len", type=int, default=96, help="completion tokens per sequence")
p.add_argument("--repeats", type=int, default=2)
args = p.parse_args()
dist = grpo.setup_distributed()
grpo.seed_everything(args.seed)
model, tok = grpo.load_model(args.model, dist, args.dtype)
ref = grpo.load_model(args.model, dist, args.dtype, trainable=False)[0] if args.beta > 0 else None
opt = grpo.make_optimizer(model, args)
g = torch.Generator().manual_seed(0)
prompt = grpo.chat_ids(tok, [{"role": "user", "content": "What is 12 + 7?"}])
rollouts = [grpo.Rollout(prompt, torch.randint(100, 5000, (args.len,), generator=g).tolist(), [1] * args.len,
                         reward=float(i % 3 == 0), group=i // args.G) for i in range(args.seqs)]
n_tok = args.seqs * (len(prompt) + args.len)


def bare():
    opt.zero_grad(set_to_none=True)
    for i in range(0, args.seqs, args.micro_batch):
        ids = torch.tensor([r.prompt_ids + r.ids for r in rollouts[i:i + args.micro_batch]])
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=args.autocast):  # same precision as grpo_update
            logits = model(input_ids=ids).logits
        logits.float().mean().backward()
    opt.step()


def ours():
    for r in rollouts:
        r.adv = None
    grpo.grpo_update(model, ref, opt, rollouts, args, dist)


rate = {}
for name, fn in [("bare fwd+bwd", bare), ("grpo_update", ours)]:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        fn()
    rate[name] = args.repeats * n_tok / (time.perf_counter() - t0)
    print(f"{name:13s} {rate[name]:8.1f} tok/s")
print(f"grpo_update / bare forward+backward: {rate['grpo_update'] / rate['bare fwd+bwd']:.2f}x "
      f"({args.seqs} seqs x {len(prompt) + args.len} tokens, micro-batch {args.micro_batch}, beta {args.beta}, {args.dtype})")
