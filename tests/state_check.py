"""torchrun --nproc_per_node=2 tests/state_check.py MODEL_DIR RUN_DIR ddp|fsdp OUT: one SFT update, a
checkpoint, then a fresh policy and AdamW loaded from it; each rank writes to OUT.<rank> which files it
torch.load-ed, whether its optimizer state equals the one saved (its own shard under FSDP), and the step and
extra it got back."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402

model_dir, run, mode, out = sys.argv[1:]
p = argparse.ArgumentParser()
grpo.add_grpo_args(p)
args = p.parse_args(["--model", model_dir, "--lr", "1e-2", "--precision", "fp32"]
                    + (["--fsdp"] if mode == "fsdp" else []))
dist = plumbing.setup_distributed()
model, tok = plumbing.load_policy(args, dist)
opt = plumbing.make_optimizer(model, args)
q = grpo.chat_ids(tok, [{"role": "user", "content": f"Name a fruit, rank {dist.rank}."}])
grpo.sft_update(model, opt, [(q, tok.encode("A banana.", add_special_tokens=False))], args, dist)
plumbing.save_checkpoint(run, model, tok, opt, 3, {"note": "saved"}, dist)
fresh, _ = plumbing.load_policy(args, dist)
opt2 = plumbing.make_optimizer(fresh, args)
loaded, load = [], torch.load
def recorded(f, *a, **kw):  # files only (a broadcast object is unpickled from bytes)
    if isinstance(f, (str, os.PathLike)):
        loaded.append(os.path.basename(f))
    return load(f, *a, **kw)


torch.load = recorded
step, extra = plumbing.load_checkpoint(run, fresh, opt2, dist)
torch.load = load


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


a, b = opt.state_dict()["state"], opt2.state_dict()["state"]
same = set(a) == set(b) and len(a) > 0 and all(torch.equal(local(a[i][k]), local(b[i][k]))
                                               for i in a for k in a[i])
torch.save(dict(loaded=sorted(loaded), same=same, step=step, extra=extra), f"{out}.{dist.rank}")
plumbing.exit_ranks()
