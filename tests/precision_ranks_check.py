"""Run by tests/test_gpu.py under torchrun with 2 gloo ranks, on gpu/smoke.py's random model (issue #23, item 7):
    replica MODEL OUT   --fsdp: the HF sampler's full copy and frozen_copy's default are in the dtype FSDP computes in
                        (bf16, fp32 under --precision fp32), with the full weights, refreshed in place by sync
    reduce MODEL OUT    DDP with bf16 weights: each rank's own gradient (under no_sync), then DDP's mean of them as
                        MasterAdamW's masters receive it, and as p.grad holds it
Each rank writes OUT.<rank> (torch.save)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plumbing  # noqa: E402
from gpu import smoke  # noqa: E402
from plumbing import exit_ranks  # noqa: E402

mode, model_dir, out = sys.argv[1:]
dist = plumbing.setup_distributed()
got = {}
if mode == "replica":
    for precision in ("bf16", "fp32"):
        model, tok = plumbing.load_policy(smoke.grpo_args("--model", model_dir, "--fsdp", "--precision", precision), dist)
        sampler = plumbing.HFSampler(model, tok)
        first, ptr = sampler.model, sampler.model.model.embed_tokens.weight.data_ptr()
        with torch.no_grad():  # move every shard, as an update would
            for p in model.parameters():
                p.to_local().add_(0.01 * (dist.rank + 1))
        sampler.sync(model)
        full = plumbing.full_state_dict(model)  # the fp32 shards gathered
        got[precision] = dict(dtypes={str(p.dtype) for p in sampler.model.parameters()},
                              bytes=sum(p.numel() * p.element_size() for p in sampler.model.parameters()),
                              n_params=sum(p.numel() for p in sampler.model.parameters()),
                              same_object=sampler.model is first and sampler.model.model.embed_tokens.weight.data_ptr() == ptr,
                              synced=all(torch.equal(v, full[k].to(v.dtype)) for k, v in sampler.model.state_dict().items()),
                              frozen={str(p.dtype) for p in plumbing.frozen_copy(model).parameters()})
elif mode == "reduce":
    args = smoke.grpo_args("--model", model_dir, "--precision", "bf16")
    model, tok = plumbing.load_policy(args, dist)
    opt = plumbing.make_optimizer(model, args)
    ids = torch.randint(0, len(tok), (2, 16), generator=torch.Generator().manual_seed(dist.rank))  # each rank its own batch

    def backward():
        model(input_ids=ids, labels=ids).loss.backward()
    with model.no_sync():
        backward()
    got["local"] = [p.grad.float() for p in model.parameters()]
    opt.zero_grad()
    backward()  # DDP's all-reduce of the same gradients
    got["grad"] = [p.grad.float() for p in model.parameters()]
    got["master"] = [m.grad.clone() for m in opt.take_grads()]
    got["optimizer"] = type(opt).__name__
torch.save(got, f"{out}.{dist.rank}")
exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
