"""Rollout throughput: the colocated vLLM engine against HF `generate`, side by side in one run.

    .venv/bin/python bench/bench_sampler.py [--model embedded] [--prompts 8] [--G 8] [--max-new-tokens 64] [--out results/bench]

Both samplers get the same chat prompts, G, temperature and token budget; the
ratio is vLLM tokens/s ÷ HF tokens/s. Each sampler is warmed up once first."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402
from tasks import toy  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
grpo.add_grpo_args(p)
p.add_argument("--prompts", type=int, default=8)
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--out", help="also write the result to OUT/bench_sampler-<CPU class>.json (`make bench`: results/bench)")
args = p.parse_args()
dist = plumbing.setup_distributed()
plumbing.seed_everything(args.seed)
model, tok = plumbing.load_model(args.model, dist, args.dtype)
prompts = [grpo.chat_ids(tok, [{"role": "user", "content": toy.toy_problem(__import__("random").Random(i))[0]}]) for i in range(args.prompts)]
samplers = {"hf": plumbing.HFSampler(model, tok), "vllm": plumbing.VLLMSampler(model, tok, args, dist)}
rate = {}
for name, s in samplers.items():
    s.generate(prompts[:1], 2, 8, args.temperature)  # warm-up
    toks, secs = 0, 0.0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = s.generate(prompts, args.G, args.max_new_tokens, args.temperature)
        secs += time.perf_counter() - t0
        toks += sum(len(x.ids) for group in out for x in group)
    rate[name] = toks / secs
    print(f"{name:5s} {toks:6d} tokens in {secs:7.2f} s = {rate[name]:8.1f} tok/s")
print(f"vLLM / HF rollout throughput: {rate['vllm'] / rate['hf']:.2f}x  "
      f"({args.prompts} prompts x G={args.G}, {args.max_new_tokens} new tokens, T={args.temperature}, {args.dtype} training weights)")
if args.out:  # the README's bench block is generated from this file (stats.bench_markdown)
    import stats
    print("wrote", stats.write_bench(args.out, "bench_sampler", ["HF tok/s", "vLLM tok/s", "vLLM / HF"],
                                     [[f"{rate['hf']:.1f}", f"{rate['vllm']:.1f}", f"{rate['vllm'] / rate['hf']:.2f}x"]],
                                     f"Rollout throughput: {args.prompts} prompts × G = {args.G}, {args.max_new_tokens} "
                                     f"new tokens, T = {args.temperature}, {args.dtype} training weights."))
