"""Forced tokens in the solver's loss (issue #27 §2): one Skill-SP solver GRPO batch of zebra grids decoded under
the grid schema, updated once with grpo.trained_mask's forced-token mask (on) and once without it (off:
Rollout.forced = None, every generated token trained), side by side; under --sampler vllm also with the
one-allowed-token rule (GrammarReplay.forced, VLLMSampler's rule before it took GrammarReplay.decided).

    .venv/bin/python bench/forced_gradnorm.py [--model tiny|embedded|PATH] [--tasks 8] [--shapes 2x3,3x2] [SKILL_SP FLAGS]

The batch is skill_selfplay.solver_round's (prompts, answer budget, grid_schema, Eq. 15 rewards) under
--family zebra --preset tiny --solver-aid, on runtime puzzles of the given shapes (houses x attributes),
sampled once; each arm then takes grpo_update on its own copy of the same solver from the same rollouts
(grad norm: before clipping). Sampler: --sampler hf is plumbing.ConstrainedHFSampler (prefix tree of the
schema's instances: the canonical tokenisation only, so more tokens count as forced than under xgrammar);
--sampler vllm is VLLMSampler, whose forced flags come from xgrammar (1 − GrammarReplay.decided: no choice of
text), as --preset tiny runs.
--model tiny (default): a random 2-layer, 128-wide Llama with the embedded tokenizer.
Any other flag goes to skill_selfplay.parse_args."""
import argparse
import copy
import dataclasses
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402
import skill_selfplay as S  # noqa: E402
import tasks.zebra as zebra  # noqa: E402


def tiny_random_model(folder):
    """A random 2-layer, 128-wide Llama with the embedded model's tokenizer, saved as an HF folder (head_dim 64:
    vLLM's CPU attention has no kernel for tests/conftest.py's head_dim 16)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(plumbing.embedded_model_path())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                                 tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                                 eos_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def batch_records(shapes, n, seed):
    """n runtime puzzles of the given (houses, attributes) shapes, as curriculum records (task x, contract c)."""
    rng, recs = random.Random(f"{seed}-forced-bench"), []
    while len(recs) < n:
        houses, m = shapes[len(recs) % len(shapes)]
        p, pos = zebra.compile_puzzle(rng, zebra.random_blueprint(rng, houses, m))
        if p is not None:
            recs.append({"task": p, "contract": zebra.solution_grid(p, pos)})
    return recs


def update(solver, ref, rollouts, args, dist, forced):
    """grpo_update on a copy of the solver (a fresh optimizer) with these forced flags per rollout (None: none)."""
    model = copy.deepcopy(solver)
    opt = plumbing.make_optimizer(model, args)
    ros = [dataclasses.replace(r, adv=None, forced=f) for r, f in zip(rollouts, forced)]
    return grpo.grpo_update(model, ref, opt, ros, args, dist), model


def measure(argv=None):
    """The batch, its forced-token counts and each arm's metrics: {"generated", "forced", "n_rollouts", "on", "off"},
    under --sampler vllm also "forced_one" and "one" (the one-allowed-token rule)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny (a random 2-layer Llama), embedded, or a model folder")
    p.add_argument("--tasks", type=int, default=8, help="puzzles in the batch (--solver-batch)")
    p.add_argument("--shapes", default="2x3,3x2",
                   help="houses x attributes of the puzzles; 3x3 has 3⁹ schema instances, slow under --sampler hf")
    p.add_argument("--sampler", choices=["hf", "vllm"], default="hf", help="ConstrainedHFSampler or VLLMSampler")
    bench, rest = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="forced-bench-") as tmp:
        model = tiny_random_model(tmp) if bench.model == "tiny" else bench.model
        args = S.parse_args(["--family", "zebra", "--preset", "tiny", "--solver-aid", "--model", model,
                             "--solver-batch", str(bench.tasks), "--sampler", bench.sampler,
                             "--run-dir", os.path.join(tmp, "run"), *rest])  # nothing is written there
        return run(bench, args)


def run(bench, args):
    """measure's work once the arguments are parsed (and the tiny model, if any, is written)."""
    dist = plumbing.Dist()
    plumbing.seed_everything(args.seed)
    solver, tok = plumbing.load_policy(args, dist)
    ref = plumbing.load_model(args.model, dist, args.dtype, trainable=False)[0] if args.beta > 0 else None
    sampler = plumbing.ConstrainedHFSampler(solver, tok) if bench.sampler == "hf" else \
        plumbing.VLLMSampler(solver, tok, args, dist)
    shapes = [tuple(int(x) for x in s.split("x")) for s in bench.shapes.split(",")]
    D = batch_records(shapes, bench.tasks, args.data_seed)
    t0 = time.time()
    rollouts = S.solver_round(D, sampler, tok, args, random.Random(args.seed), dist)
    out = {"generated": sum(len(r.ids) for r in rollouts), "forced": sum(sum(r.forced or []) for r in rollouts),
           "n_rollouts": len(rollouts), "reward": sum(r.reward for r in rollouts) / max(len(rollouts), 1),
           "time_sample": time.time() - t0, "model": bench.model, "sampler": bench.sampler, "precision": args.precision}
    arms = [("on", [r.forced for r in rollouts]), ("off", [None] * len(rollouts))]
    if bench.sampler == "vllm":  # the same rollouts under the one-allowed-token rule
        batch = random.Random(args.seed).sample(D, min(args.solver_batch, len(D)))  # solver_round's draw: group g
        schemas = S.answer_schemas(args, [r["task"] for r in batch])
        assert all([1 - d for d in sampler.grammar.decided(schemas[r.group], r.ids)] == r.forced for r in rollouts)
        one = [sampler.grammar.forced(schemas[r.group], r.ids) for r in rollouts]
        out["forced_one"] = sum(map(sum, one))
        arms.append(("one", one))
    for arm, forced in arms:
        t0 = time.time()
        out[arm] = {**update(solver, ref, rollouts, args, dist, forced)[0], "time": time.time() - t0}
    return out


def main(argv=None):
    r = measure(argv)
    arms = [("mask on", r["on"]), ("mask off", r["off"])] + ([("one-token", r["one"])] if "one" in r else [])
    print(f"one solver GRPO batch: {r['n_rollouts']} grids, {r['generated']} generated tokens, {r['forced']} forced by "
          f"the grid schema ({100 * r['forced'] / max(r['generated'], 1):.1f} %); mean reward {r['reward']:.3f}; "
          f"{r['model']} model, {r['sampler']} sampler, {r['precision']} weights; sampled in {r['time_sample']:.1f} s")
    if "one" in r:
        print(f"one-token rule (exactly one token allowed, GrammarReplay.forced): {r['forced_one']} forced "
              f"({100 * r['forced_one'] / max(r['generated'], 1):.1f} %)")
    print(f"{'':28s}" + "".join(f"{name:>12s}" for name, _ in arms))
    for name, key, fmt in (("trained tokens", "n_tokens", "{:.0f}"), ("grad norm (before clipping)", "grad_norm", "{:.4g}"),
                           ("loss", "loss", "{:.4g}"), ("KL", "kl", "{:.3g}"), ("update time (s)", "time", "{:.2f}")):
        print(f"{name:28s}" + "".join(f"{fmt.format(a[key]) if key in a else '-':>12s}" for _, a in arms))
    print("mask off is the control: the same rollouts with Rollout.forced = None; a skipped arm (no decision "
          "token) shows '-' for its gradient")
    return r


if __name__ == "__main__":
    main()
