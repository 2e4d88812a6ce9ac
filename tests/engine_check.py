"""torchrun --nproc_per_node=2 tests/engine_check.py MODEL_DIR OUT: plumbing.make_sampler with a stand-in for
vllm.LLM (no engine is started): it fails on every rank (--sampler auto falls back to HF generate on both),
then on rank 1 only (both ranks stop with one line, --sampler auto included). Each rank writes what it saw to
OUT.<rank> and leaves through the SystemExit of the second case, as a script would."""
import argparse
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402

model_dir, out = sys.argv[1:]
failing = set()  # the ranks whose engine start fails


class FakeLLM:
    """vllm.LLM's stand-in: raises where its rank is in `failing`, else an engine that does nothing."""

    def __init__(self, **kw):
        if plumbing.setup_distributed().rank in failing:
            raise RuntimeError("CUDA out of memory (simulated)\nsecond line")

    def collective_rpc(self, *a, **kw):
        pass

    def reset_prefix_cache(self):
        pass


sys.modules["vllm"] = types.SimpleNamespace(LLM=FakeLLM)
p = argparse.ArgumentParser()
grpo.add_grpo_args(p)
args = p.parse_args(["--model", model_dir, "--sampler", "auto", "--max-model-len", "256"])
dist = plumbing.setup_distributed()
model, tok = plumbing.load_model(model_dir, dist)
seen = {}
failing.update({0, 1})
seen["all_failed"] = type(plumbing.make_sampler(args, model, tok, dist)).__name__
torch.save(seen, f"{out}.{dist.rank}")
failing.clear(), failing.add(1)
plumbing.make_sampler(args, model, tok, dist)  # SystemExit on both ranks: this process ends here
seen["mixed"] = "no SystemExit"
torch.save(seen, f"{out}.{dist.rank}")
