"""One full GRPO step (generate + score + update): grpo.py against Hugging Face TRL's GRPOTrainer, and
grpo.py's update phase against a bare forward+backward — every ratio printed side by side in one run.

    .venv/bin/python -m pip install trl      # in requirements.txt: `make install` does this
    .venv/bin/python bench/bench_step.py [--lengths 32 128] [--prompts 4] [--G 4] [--steps 3]
    .venv/bin/python bench/bench_step.py --only vllm --max-new-tokens 128    # one configuration, one JSON line
    .venv/bin/python bench/bench_step.py --out results/bench   # + the table as JSON: the README's bench block

Same model, prompts (the toy addition task), G, completion length, temperature,
reward, β, AdamW learning rate and loss aggregation (token mean = TRL "dapo"), one
prompt batch per step, and the whole batch in one forward (micro-batch = P·G).
TRL samples with HF `generate` (its colocated vLLM needs a GPU); grpo.py runs once with
HF `generate` (the trainers compared on the same engine) and once with its vLLM sampler.
Precision: every trainer runs at each of --precisions (default both): bf16 = grpo.py's bf16 weights with
fp32 masters and AdamW moments, TRL's `bf16=True` (bf16 autocast over fp32 weights); fp32 = both in fp32.
The first line printed is this machine's bf16 capability and what --precision auto picks; the summary
compares grpo.py at that choice with TRL at whichever of its precisions was faster here.

Update phase: grpo_update's wall time against a bare forward+backward of the same
micro-batches in the same precision (a mean of all completion logits), plus one
π_ref forward when β > 0, and no optimizer step; the ratio is bare time ÷ update time.

Each (trainer, length) runs in a fresh child process: vLLM's in-process engine pins
torch's thread settings for the rest of its process, and a child's memory is returned.
The first step of each is warm-up and not timed."""
import argparse
import json
import os
import random
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402
from tasks import toy  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
grpo.add_grpo_args(p)
p.add_argument("--prompts", type=int, default=4, help="P, prompts per step")
p.add_argument("--steps", type=int, default=3, help="timed steps (plus one warm-up)")
p.add_argument("--reps", type=int, default=5, help="interleaved update/bare pairs on the last batch (medians)")
p.add_argument("--lengths", type=int, nargs="+", default=[32, 128], help="completion lengths (--max-new-tokens) to run")
p.add_argument("--trainers", nargs="+", default=["trl", "hf", "vllm"], choices=["trl", "hf", "vllm"], help="which lines to run")
p.add_argument("--only", choices=["trl", "hf", "vllm"], help="child mode: run this trainer at --max-new-tokens, print one RESULT line")
p.add_argument("--precisions", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"], help="precisions to run every trainer at")
p.add_argument("--out", help="also write the table to OUT/bench_step-<CPU class>.json (stats.write_bench; `make bench`: results/bench)")
p.set_defaults(G=4, temperature=0.7, lr=1e-5, beta=0.04)
args = p.parse_args()
args.micro_batch = args.prompts * args.G


def problems():
    rng = random.Random(0)
    return [toy.toy_problem(rng) for _ in range(args.prompts * (args.steps + 1))]


def bare_update(model, ref, rollouts, dist):
    """The floor for an update: forward+backward of the same micro-batches (all completion logits), π_ref forward if β > 0."""
    rows = [(r.prompt_ids, r.ids, r.mask, [0.0] * len(r.ids)) for r in rollouts if sum(r.mask) > 0]
    t0 = time.perf_counter()
    for i in range(0, len(rows), args.micro_batch):
        b = grpo.collate(rows[i:i + args.micro_batch], 0, dist.device)
        ids, attn = b["input_ids"], b["attention_mask"]
        before = torch.arange(b["start"] - 1, ids.shape[1] - 1)
        if args.beta > 0:
            with torch.no_grad():
                ref(input_ids=ids, attention_mask=attn, logits_to_keep=before)
        model(input_ids=ids, attention_mask=attn, logits_to_keep=before).logits.mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def padded_share(rollouts, size, by_length):
    """Share of the (B, L) positions of micro-batches of `size` that are padding, in rollout order or sorted by length."""
    lens = sorted(len(r.prompt_ids) + len(r.ids) for r in rollouts) if by_length else \
        [len(r.prompt_ids) + len(r.ids) for r in rollouts]
    chunks = [lens[i:i + size] for i in range(0, len(lens), size)]
    return 1 - sum(map(sum, chunks)) / sum(len(c) * max(c) for c in chunks)


def ours(sampler_name):
    dist = plumbing.setup_distributed()
    plumbing.seed_everything(args.seed)
    model, tok = plumbing.load_policy(args, dist)
    ref = plumbing.load_model(args.model, dist, args.dtype, trainable=False)[0]
    opt = plumbing.make_optimizer(model, args)
    bare_model, bare_ref = model, ref  # the floor in the same precision as the update
    args.sampler = sampler_name
    sampler = plumbing.make_sampler(args, model, tok, dist)
    probs = problems()
    steps, updates, bares, tokens, pads = [], [], [], [], []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        batch = probs[step * args.prompts:(step + 1) * args.prompts]
        prompts = [grpo.chat_ids(tok, [{"role": "user", "content": q}]) for q, _ in batch]
        rollouts = grpo.sample_group_rollouts(sampler, prompts, args.G, args)
        for r in rollouts:
            r.reward = toy.toy_reward(r.text, batch[r.group][1])
        t1 = time.perf_counter()
        grpo.grpo_update(model, ref, opt, rollouts, args, dist)
        t2 = time.perf_counter()
        sampler.sync(model)
        steps.append(time.perf_counter() - t0)
        updates.append(t2 - t1)
        bares.append(bare_update(bare_model, bare_ref, rollouts, dist))  # outside the step's clock
        tokens.append(sum(len(r.ids) for r in rollouts))
        half = max(1, len(rollouts) // 2)  # two micro-batches, as in grpo.py's tiny preset
        pads.append((padded_share(rollouts, half, False), padded_share(rollouts, half, True)))
    # the update against the bare floor on one batch (the last step's rollouts), interleaved --reps times:
    # the per-step pairs above come right after sampling and vary by ±0.15 in ratio between runs
    rep_u, rep_b = [], []
    for _ in range(args.reps):
        for r in rollouts:
            r.adv = None
        t0 = time.perf_counter()
        grpo.grpo_update(model, ref, opt, rollouts, args, dist)
        rep_u.append(time.perf_counter() - t0)
        rep_b.append(bare_update(bare_model, bare_ref, rollouts, dist))
    mean = lambda xs: sum(xs[1:]) / args.steps  # noqa: E731, the timed steps
    median = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")  # noqa: E731
    return {"step": mean(steps), "update": mean(updates), "bare": mean(bares), "tokens": mean(tokens),
            "pad_in_order": mean([a for a, _ in pads]), "pad_sorted": mean([b for _, b in pads]),
            "update_rep": median(rep_u), "bare_rep": median(rep_b)}


def trl():
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    path = plumbing.resolve_model(args.model)
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in problems()])

    def reward(completions, answer, **kw):
        return [toy.toy_reward(c[0]["content"], a) for c, a in zip(completions, answer)]

    times = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    cfg = GRPOConfig(output_dir="/tmp/nanoskill-bench-trl", per_device_train_batch_size=args.prompts * args.G,
                     num_generations=args.G, max_completion_length=args.max_new_tokens, temperature=args.temperature,
                     top_k=0, beta=args.beta, learning_rate=args.lr, loss_type="dapo", epsilon=args.eps_low,
                     max_steps=args.steps + 1, gradient_accumulation_steps=1, use_cpu=True, bf16=args.precision == "bf16",
                     logging_steps=1, save_strategy="no", report_to=[], shuffle_dataset=False, seed=args.seed,
                     lr_scheduler_type="constant", weight_decay=args.weight_decay, max_grad_norm=args.grad_clip)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                          processing_class=AutoTokenizer.from_pretrained(path), callbacks=[Clock()])
    trainer.train()
    return {"step": sum(times[1:]) / args.steps}


if args.only:  # child: one configuration
    res = trl() if args.only == "trl" else ours(args.only)
    print("RESULT " + json.dumps(res), flush=True)
    sys.exit(0)

auto, why = plumbing.choose_precision("auto", plumbing.bf16_capability())
print(f"machine: {why}", flush=True)  # the CPU class every time below belongs to
results = {}
for prec in args.precisions:
    for n in args.lengths:
        for t in args.trainers:
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--only", t, "--max-new-tokens", str(n),
                                  "--precision", prec, "--dtype", "bfloat16" if prec == "bf16" else "float32"], capture_output=True, text=True)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            results[prec, n, t] = json.loads(line[-1][len("RESULT "):]) if line else None
            status = "ok" if line else "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1][:200]
            print(f"  ran {t:4s} at {n:3d} new tokens, {prec} in {time.perf_counter() - t0:5.0f} s: {status}", file=sys.stderr, flush=True)


def get(prec, n, t, key="step"):
    return (results.get((prec, n, t)) or {}).get(key)


def cell(prec, n, t, key="step"):
    v = get(prec, n, t, key)
    return f"{v:6.2f}" if v else "     –"


def ratio(a, b):
    return f"{a / b:5.2f}x" if a and b else "    –"


print(f"{args.prompts} prompts x G={args.G}, T={args.temperature}, beta={args.beta}, lr={args.lr}, token-mean loss, "
      f"{args.steps} timed steps after one warm-up; TRL bf16=True in the bf16 rows")
print("precision new tok | TRL s/step | ours HF s/step  vs TRL | ours vLLM s/step  vs TRL | update s  bare s  bare/update (vLLM run)")
for prec in args.precisions:
    for n in args.lengths:
        trl_s, hf_s, vl_s = get(prec, n, "trl"), get(prec, n, "hf"), get(prec, n, "vllm")
        print(f"{prec:>9s} {n:7d} | {cell(prec, n, 'trl'):>10s} | {cell(prec, n, 'hf'):>14s}  {ratio(trl_s, hf_s):>6s} | "
              f"{cell(prec, n, 'vllm'):>16s}  {ratio(trl_s, vl_s):>6s} | {cell(prec, n, 'vllm', 'update'):>8s}  "
              f"{cell(prec, n, 'vllm', 'bare'):>6s}  {ratio(get(prec, n, 'vllm', 'bare'), get(prec, n, 'vllm', 'update')):>6s}")
for n in args.lengths:  # each trainer in its best precision here: ours at --precision auto, TRL at its faster one
    trl_best = min(((get(p, n, "trl"), p) for p in args.precisions if get(p, n, "trl")), default=(None, None))
    ours = get(auto, n, "vllm") or get(auto, n, "hf")
    if ours and trl_best[0]:
        print(f"{n} new tokens, best precision each: ours (auto = {auto}) {ours:.2f} s/step vs TRL ({trl_best[1]}) "
              f"{trl_best[0]:.2f} s/step: {ratio(trl_best[0], ours).strip()}")
for prec in args.precisions:
    for n in args.lengths:
        if vl := results.get((prec, n, "vllm")):
            print(f"{prec}, {n} new tokens, vLLM run: {vl['tokens']:.0f} completion tokens/step; padding in 2 micro-batches: "
                  f"{vl['pad_in_order']:.0%} of positions in rollout order, {vl['pad_sorted']:.0%} sorted by length")
            print(f"{prec}, {n} new tokens, one batch, {args.reps} interleaved pairs (medians): update {vl['update_rep']:.2f} s, "
                  f"bare {vl['bare_rep']:.2f} s, bare/update {ratio(vl['bare_rep'], vl['update_rep'])}")
if args.out:  # the README's bench block is generated from this file (stats.bench_markdown)
    import stats
    rows = [[prec, n, cell(prec, n, "trl").strip(), cell(prec, n, "hf").strip(),
             ratio(get(prec, n, "trl"), get(prec, n, "hf")).strip(), cell(prec, n, "vllm").strip(),
             ratio(get(prec, n, "trl"), get(prec, n, "vllm")).strip(), cell(prec, n, "vllm", "update").strip(),
             cell(prec, n, "vllm", "bare").strip(),
             ratio(get(prec, n, "vllm", "bare_rep"), get(prec, n, "vllm", "update_rep")).strip()]
            for prec in args.precisions for n in args.lengths]
    path = stats.write_bench(args.out, "bench_step", ["precision", "new tokens", "TRL s/step", "ours HF s/step",
                             "HF vs TRL", "ours vLLM s/step", "vLLM vs TRL", "update s", "bare s",
                             "bare / update (interleaved medians)"], rows,
                             f"{args.prompts} prompts × G = {args.G}, T = {args.temperature}, β = {args.beta}, "
                             f"token-mean loss, {args.steps} timed steps after one warm-up; {why}.")
    print(f"wrote {path}")
