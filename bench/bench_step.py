"""One full GRPO step (generate + score + update): grpo.py against Hugging Face TRL's GRPOTrainer.

    .venv/bin/python -m pip install trl      # `make bench` does this
    .venv/bin/python bench/bench_step.py [--prompts 4] [--G 4] [--max-new-tokens 32] [--steps 3]

Same model, prompts (the toy addition task), G, completion length, temperature,
reward, β, AdamW learning rate and loss aggregation (token mean = TRL "dapo"), one
prompt batch per step, and the whole batch in one forward (micro-batch = P·G).
Both sample with HF `generate` here (TRL's colocated vLLM needs a GPU), so the ratio
compares the trainers, not the engines; grpo.py with its vLLM sampler is a third line.
Precision matches too: bf16 autocast over fp32 weights in both (--no-autocast: fp32 in both).
The first step of each is warm-up and not timed."""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
grpo.add_grpo_args(p)
p.add_argument("--prompts", type=int, default=4)
p.add_argument("--steps", type=int, default=3, help="timed steps (plus one warm-up)")
p.set_defaults(G=4, max_new_tokens=32, temperature=0.7, lr=1e-5, beta=0.04)
args = p.parse_args()
args.micro_batch = args.prompts * args.G
dist = grpo.setup_distributed()
rng = random.Random(0)
problems = [grpo.toy_problem(rng) for _ in range(args.prompts * (args.steps + 1))]


def ours(sampler_name):
    grpo.seed_everything(args.seed)
    model, tok = grpo.load_model(args.model, dist)
    ref = grpo.load_model(args.model, dist, trainable=False)[0]
    opt = grpo.make_optimizer(model, args)
    args.sampler = sampler_name
    sampler = grpo.make_sampler(args, model, tok, dist)
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        batch = problems[step * args.prompts:(step + 1) * args.prompts]
        prompts = [grpo.chat_ids(tok, [{"role": "user", "content": q}]) for q, _ in batch]
        rollouts = grpo.sample_group_rollouts(sampler, prompts, args.G, args)
        for r in rollouts:
            r.reward = grpo.toy_reward(r.text, batch[r.group][1])
        grpo.grpo_update(model, ref, opt, rollouts, args, dist)
        sampler.sync(model)
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / args.steps


def trl():
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    path = grpo.resolve_model(args.model)
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in problems])

    def reward(completions, answer, **kw):
        return [grpo.toy_reward(c[0]["content"], a) for c, a in zip(completions, answer)]

    times = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    cfg = GRPOConfig(output_dir="/tmp/nanoskill-bench-trl", per_device_train_batch_size=args.prompts * args.G,
                     num_generations=args.G, max_completion_length=args.max_new_tokens, temperature=args.temperature,
                     top_k=0, beta=args.beta, learning_rate=args.lr, loss_type="dapo", epsilon=args.eps_low,
                     max_steps=args.steps + 1, gradient_accumulation_steps=1, use_cpu=True, bf16=args.autocast,
                     logging_steps=1, save_strategy="no", report_to=[], shuffle_dataset=False, seed=args.seed,
                     lr_scheduler_type="constant", weight_decay=args.weight_decay, max_grad_norm=args.grad_clip)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                          processing_class=AutoTokenizer.from_pretrained(path), callbacks=[Clock()])
    trainer.train()
    return sum(times[1:]) / args.steps


t_trl = trl()
t_ours = ours("hf")
print(f"TRL GRPOTrainer      {t_trl:7.2f} s/step")
print(f"grpo.py (HF sampler) {t_ours:7.2f} s/step   speed-up over TRL {t_trl / t_ours:.2f}x")
try:
    t_vllm = ours("vllm")
    print(f"grpo.py (vLLM)       {t_vllm:7.2f} s/step   speed-up over TRL {t_trl / t_vllm:.2f}x")
except Exception as e:  # no vLLM on this machine
    print(f"grpo.py (vLLM)       unavailable: {type(e).__name__}")
print(f"({args.prompts} prompts x G={args.G}, {args.max_new_tokens} new tokens, T={args.temperature}, beta={args.beta}, "
      f"lr={args.lr}, loss token-mean, {args.steps} timed steps)")
