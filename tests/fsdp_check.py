"""Run by tests/test_grpo.py under torchrun with 2 gloo ranks (FSDP or DDP, as the flags say):
    main ARGS...              grpo.main(ARGS), with a dense reward so the random tiny model gets a learning signal
    roundtrip MODEL SRC DST   load the checkpoint in SRC into an FSDP policy and AdamW, then save it to DST
    vllm MODEL OUT            SFT the sharded model on one answer, sync vLLM, write HF's and vLLM's greedy replies"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import tasks.toy  # noqa: E402
import plumbing  # noqa: E402
from plumbing import exit_ranks  # noqa: E402

mode, rest = sys.argv[1], sys.argv[2:]
if mode == "main":
    tasks.toy.toy_reward = lambda text, answer: (len(text) % 5) / 4  # the arithmetic reward is all zero for a random model
    grpo.main(rest)
    exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
    raise SystemExit
p = argparse.ArgumentParser()
grpo.add_grpo_args(p)
args = p.parse_args(["--model", rest[0], "--fsdp", "--lr", "3e-3", "--grad-clip", "1e9", "--max-model-len", "256",
                     "--vllm-kv-gib", "0.05"])
dist = plumbing.setup_distributed()
model, tok = plumbing.load_policy(args, dist)
opt = plumbing.make_optimizer(model, args)
if mode == "roundtrip":
    plumbing.load_checkpoint(rest[1], model, opt, dist)
    plumbing.save_checkpoint(rest[2], model, tok, opt, 0, {}, dist)
elif mode == "vllm":
    v, h = plumbing.VLLMSampler(model, tok, args, dist), plumbing.HFSampler(model, tok)
    q = [grpo.chat_ids(tok, [{"role": "user", "content": "Name a fruit."}])]
    before = v.generate(q, 1, 12, 0.0)[0][0].text
    tgt = tok.encode("The secret word is banana split.", add_special_tokens=False) + [tok.eos_token_id]
    for _ in range(30):  # the same example on both ranks: the averaged gradient is one process's
        grpo.sft_update(model, opt, [(q[0], tgt)], args, dist)
    stale = v.generate(q, 1, 12, 0.0)[0][0].text
    v.sync(model)  # all-gathers the shards, then pushes bf16 weights into this rank's engine
    h.sync(model)  # under FSDP the HF sampler generates from a full copy, refreshed here as in the training loop
    hf, vl = h.generate(q, 1, 12, 0.0)[0][0], v.generate(q, 1, 12, 0.0)[0][0]
    with open(f"{rest[1]}.{dist.rank}", "w") as f:
        json.dump(dict(before=before, stale=stale, hf=hf.text, vllm=vl.text, same_ids=hf.ids == vl.ids), f)
exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
