"""gpu/smoke.py — `make gpu-smoke`: the CUDA path, checked in a few minutes on a machine that has torch and
transformers but no vLLM, no network and no model cache. The model is a random 2-layer Llama built from a config,
with the small tokenizer shipped in gpu/tokenizer/ (gpu/make_tokenizer.py). One PASS / FAIL / SKIP line per
check; the exit status is 1 when any check fails.

    python gpu/smoke.py            # on a CUDA machine (make gpu-smoke)
    python gpu/smoke.py --cpu      # dry mode: the same logic on CPU and gloo at small sizes; CUDA-only checks SKIP

Stage 1 (always):
  bf16       a GRPO update with bf16 weights + fp32 masters (MasterAdamW) moves the weights as fp32 does (≤ 10 %)
  chunked    ChunkedTokenLogProb equals log_softmax, forward and backward, at Qwen3's vocabulary (151,936)
  torchrun   torchrun with 2 ranks (NCCL) where there are 2 GPUs, else 1 (its line says DDP is then not
             wrapped), runs updates with and without --fsdp; a run resumed from its checkpoint ends
             bit-identical to an uninterrupted one
  reward     a short toy run's reward rises (a dense reward the random model can learn: the share of digits)
  perf       peak memory and tokens/s of that run (printed, no threshold)
  preset     each script's --preset gpu for a few steps (its sizes cut, every memory flag its own) on random
             weights in the shapes of the preset's model (SHAPES); dry mode: the small random model, HF
             generate and short generations
Stage 2 (only when vllm imports):
  vllm       VLLMSampler's greedy reply equals HF's after an SFT update and a weight sync
  scripts    torchrun --nproc_per_node=N (N = GPUs) of each script for one step on the random model
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

RESULTS = []


def report(name, ok, detail):
    """One line per check: PASS / FAIL / SKIP, its name, what was measured."""
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    RESULTS.append(status)
    print(f"{status} {name}: {detail}", flush=True)


def build_model(out, device_vocab_heads=128):
    """A random 2-layer Llama (head_dim 64, a size every vLLM attention backend takes) with the shipped tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(ROOT / "gpu" / "tokenizer")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=device_vocab_heads, intermediate_size=2 * device_vocab_heads,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


# The gpu presets' models in the shapes of their config.json (the smoke has no network or model cache): the
# preset check runs each script on random weights of these shapes
SHAPES = {
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2", dict(hidden_size=896, intermediate_size=4864,
                                                 num_hidden_layers=24, num_attention_heads=14,
                                                 num_key_value_heads=2)),
    "Qwen/Qwen2.5-1.5B-Instruct": ("qwen2", dict(hidden_size=1536, intermediate_size=8960,
                                                 num_hidden_layers=28, num_attention_heads=12,
                                                 num_key_value_heads=2)),
    "Qwen/Qwen3-0.6B": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                      num_attention_heads=16, num_key_value_heads=8, head_dim=128)),
    "Qwen/Qwen3-1.7B": ("qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                      num_attention_heads=16, num_key_value_heads=8, head_dim=128)),
}
VOCAB = 151936  # all four: tied embeddings, rope θ 10⁶


def build_like(name, out, device):
    """Random bf16 weights in the shapes of SHAPES[name], with the shipped tokenizer padded to the model's
    vocabulary by tokens no text encodes to ("pad1024", …): every id a random model samples decodes."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    kind, shape = SHAPES[name]
    Config, Model = (Qwen3Config, Qwen3ForCausalLM) if kind == "qwen3" else (Qwen2Config, Qwen2ForCausalLM)
    tok = AutoTokenizer.from_pretrained(ROOT / "gpu" / "tokenizer")
    cfg = Config(vocab_size=VOCAB, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768,
                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                 **shape)
    torch.manual_seed(0)
    with torch.device(device):
        Model(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    spec = json.loads((Path(out) / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab.update({f"pad{i}": i for i in range(len(tok), VOCAB)})
    (Path(out) / "tokenizer.json").write_text(json.dumps(spec))
    return str(out)


def digit_share(text, answer=None):
    """The toy runs' dense reward: the share of characters that are digits (a random model starts near its base rate)."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def patch_grpo():
    """grpo.main with the dense reward, and no plot when matplotlib is missing (torch + transformers only)."""
    import grpo
    import tasks.toy
    tasks.toy.toy_reward = digit_share  # grpo.main reads the world's reward from tasks/toy.py
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        grpo.plot_curves = lambda *a, **k: None
    return grpo


def grpo_args(*argv):
    import grpo
    p = argparse.ArgumentParser()
    grpo.add_grpo_args(p)
    return p.parse_args(list(argv))


# ----- stage 1 -----


def check_bf16(model_dir, device):
    """3 GRPO steps (β > 0, μ = 2, 2 micro-batches) from the same bf16-representable start under --precision bf16
    and fp32: per tensor, the update differs by at most 10 % of its norm (seen on CPU: 7.2 % for this model; an
    update lost to bf16 rounding would differ by ~100 %)."""
    import grpo
    import plumbing
    dist = plumbing.Dist(device=device)
    g = torch.Generator().manual_seed(0)
    rollouts = [grpo.Rollout(torch.randint(5, 1000, (6,), generator=g).tolist(), torch.randint(5, 1000, (5 + k % 4,), generator=g).tolist(),
                             [1] * (5 + k % 4), reward=float(k % 3), group=k // 3) for k in range(12)]
    deltas = {}
    for precision, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        args = grpo_args("--model", model_dir, "--precision", precision, "--dtype", dtype, "--lr", "1e-3", "--beta", "0.1",
                         "--passes", "2", "--micro-batch", "7")
        model, _ = plumbing.load_policy(args, dist)
        ref = plumbing.load_model(model_dir, dist, dtype, trainable=False)[0]
        with torch.no_grad():
            for m in (model, ref):
                for q in m.parameters():
                    q.copy_(q.bfloat16())
        init = {k: v.float().clone() for k, v in model.named_parameters()}
        opt = plumbing.make_optimizer(model, args)
        for _ in range(3):
            grpo.grpo_update(model, ref, opt, [grpo.Rollout(r.prompt_ids, r.ids, r.mask, reward=r.reward, group=r.group)
                                               for r in rollouts], args, dist)
        weights = zip(init, opt.masters()) if precision == "bf16" else model.named_parameters()
        deltas[precision] = {k: v.detach().float() - init[k] for k, v in weights}
    worst = max(((deltas["bf16"][k] - d).norm() / d.norm().clamp(min=1e-12)).item() for k, d in deltas["fp32"].items())
    report("bf16", worst <= 0.10, f"bf16 vs fp32 update on {device.type}: worst tensor differs by {100 * worst:.1f} % of its norm (≤ 10 %)")


def check_chunked(device, V):
    """ChunkedTokenLogProb against log_softmax(z/τ)[y] in fp32 autograd, from the same bf16 logits."""
    from plumbing import ChunkedTokenLogProb
    g = torch.Generator(device="cpu").manual_seed(0)
    N, tau = 256, 0.7
    z = (3 * torch.randn(N, V, generator=g)).to(device, torch.bfloat16)
    y = torch.randint(0, V, (N,), generator=g).to(device)
    up = torch.randn(N, generator=g).to(device)
    z1 = z.clone().requires_grad_(True)
    t0 = time.time()
    out = ChunkedTokenLogProb.apply(z1, y, tau)
    out.backward(up)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.time() - t0
    z2 = z.float().requires_grad_(True)
    ref = torch.log_softmax(z2 / tau, -1).gather(-1, y[:, None])[:, 0]
    ref.backward(up)
    fwd = (out - ref).abs().max().item()
    bwd = ((z1.grad.float() - z2.grad).abs().max() / z2.grad.abs().max()).item()
    report("chunked", fwd < 1e-4 and bwd < 1e-2, f"V = {V}, N = {N} on {device.type}: forward max |Δ| {fwd:.1e} (< 1e-4), backward "
           f"max |Δ| / max |grad| {bwd:.1e} (< 1e-2, bf16 gradients); {1000 * dt:.0f} ms fwd+bwd")


def torchrun(argv, env, log, n=1):
    """`torchrun --nproc_per_node=N gpu/smoke.py --worker ARGS` (the worker: grpo.main, the dense reward)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}",
           f"--master_port={env['PORT']}", str(Path(__file__).resolve()), "--worker", *argv]
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=600).returncode


def check_torchrun(model_dir, tmp, device):
    """Two ranks under torchrun where there are two GPUs (NCCL), else one (NCCL, or gloo on CPU: no DDP
    wrapper, said on the line): updates with and without --fsdp, then an uninterrupted 4-step run against 2
    steps + --resume to 4 (weights and AdamW state bit-identical)."""
    from safetensors.torch import load_file
    env = {**os.environ, "PORT": str(29600 + os.getpid() % 300), "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    common = ["--model", model_dir, "--sampler", "hf", "--G", "4", "--prompts-per-step", "2", "--max-new-tokens", "8",
              "--eval-n", "0", "--lr", "1e-3", "--save-every", "2", "--beta", "0.1", "--micro-batch", "4"]
    n = 2 if device.type == "cuda" and torch.cuda.device_count() >= 2 else 1
    backend = "NCCL" if device.type == "cuda" else "gloo"
    ranks = (f"2 ranks ({backend})" if n == 2 else
             f"1 rank ({backend}; one {device.type} device: DDP is not wrapped, 2 ranks need 2 GPUs)")
    for fsdp in ([], ["--fsdp"]):
        name = "torchrun" + (" --fsdp" if fsdp else "")
        runs = {r: tmp / f"{r}{len(fsdp)}" for r in ("a", "b")}
        resume = ["--steps", "4", "--run-dir", str(runs["b"]), "--resume"]
        rcs = [torchrun(common + fsdp + ["--steps", "4", "--run-dir", str(runs["a"])], env, tmp / "a.log", n),
               torchrun(common + fsdp + ["--steps", "2", "--run-dir", str(runs["b"])], env, tmp / "b.log", n),
               torchrun(common + fsdp + resume, env, tmp / "b2.log", n)]
        if any(rcs):
            tail = (tmp / ["a.log", "b.log", "b2.log"][[bool(r) for r in rcs].index(True)]).read_text()[-1500:]
            report(name, False, f"{ranks} exit codes {rcs}\n{tail}")
            continue
        wa, wb = (load_file(runs[r] / "ckpt" / "model" / "model.safetensors") for r in ("a", "b"))
        sa, sb = (torch.load(runs[r] / "ckpt" / "state.pt", weights_only=False)["optimizer"]["state"] for r in ("a", "b"))
        same_w = set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)
        same_opt = set(sa) == set(sb) and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i] if torch.is_tensor(sa[i][k]))
        moved = not all(torch.equal(wa[k], v) for k, v in load_file(Path(model_dir) / "model.safetensors").items() if k in wa)
        steps = len((runs["a"] / "metrics.jsonl").read_text().splitlines())
        report(name, same_w and same_opt and moved and steps == 4,
               f"{ranks}: {steps} updates, weights moved {moved}; resumed run equals uninterrupted: weights "
               f"{same_w}, AdamW {same_opt}")


def check_reward(model_dir, tmp, device, steps):
    """grpo.main on the toy prompts with the dense digit reward: mean reward of the last 5 steps above the first 5."""
    import plumbing
    grpo = patch_grpo()
    run = tmp / "reward"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    grpo.main(["--model", model_dir, "--sampler", "hf", "--G", "8", "--prompts-per-step", "8", "--max-new-tokens", "12",
               "--eval-n", "0", "--lr", "3e-3", "--beta", "0", "--temperature", "1.0", "--steps", str(steps), "--save-every",
               str(steps), "--micro-batch", "64", "--run-dir", str(run)])
    wall = time.time() - t0
    rows = [plumbing.read_metrics(run)[s] for s in range(steps)]
    first, last = (sum(r["reward"] for r in rs) / len(rs) for rs in (rows[:5], rows[-5:]))
    report("reward", last > first + 0.05, f"{steps} GRPO steps: mean reward of the first 5 steps {first:.3f} → last 5 {last:.3f} (rise > 0.05)")
    tokens = sum(r["n_tokens"] for r in rows)
    peak = (f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB CUDA (max allocated)" if device.type == "cuda" else
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB RSS")
    report("perf", None if device.type != "cuda" else True,
           f"peak {peak}; {tokens / sum(r['time_step'] for r in rows):.0f} trained tokens/s over generation + update, "
           f"{wall:.0f} s for {steps} steps (the random 2-layer model: a plumbing number, not a benchmark)")


# Each script's --preset gpu cut to a few steps: the sizes shrink, the memory flags (micro-batch, context,
# checkpointing, sampler) stay the preset's. DRY: what dry mode adds on the small random model (HF generate,
# short generations, fewer rollouts).
PRESET_RUNS = {
    "grpo": "--steps 2 --eval-n 8 --prompts-per-step 8",
    "skill_entropy": "--domains math,science,creative_writing --acc-samples 1 --direct-pairs 2 --n-train 8 "
                     "--n-sft 4 --eval-n 4 --train-len 2,3 --test-len 2,3 --llm-proposer-tasks 2 "
                     "--label-seeds 1 --n-label 2 --sft-epochs 1 --steps 2 --prompts-per-step 4 "
                     "--null-perms 20",
    "skill_rm": "--bench-per-cat 1 --formats pairwise --bon-prompts 1 --bon-N 2 --steps 2 "
                "--prompts-per-step 2 --eval-n 2 --rl-rewards skill_rm",
    "skill_selfplay": "--family tool --T 1 --proposer-prompts 4 --proposer-steps 1 --collect-prompts 4 "
                      "--solver-steps 2 --solver-batch 4 --eval-n 3 --eval-samples 1 --induce-min 1 "
                      "--prune-min-attempts 99 --no-plots",
    "talentrl": "--n-people 40 --n-places 16 --n-orgs 10 --n-events 10 --n-hamlets 12 --n-shared 6 "
                "--n-train 60 --eval-n 2 --sft-tasks 48 --sft-epochs 1 --steps 2 --prompts-per-step 2 "
                "--val-tasks 2 --evolve-every 1",
}
DRY = {
    "grpo": "--max-new-tokens 8 --G 2 --prompts-per-step 2 --micro-batch 4",
    "skill_entropy": "--max-new-tokens 160 --acc-max-new-tokens 4 --propose-max-new-tokens 8 "
                     "--llm-proposer-tasks 0 --max-model-len 512 --G 2 --prompts-per-step 2",
    "skill_rm": "--max-new-tokens 8 --judge-max-new-tokens 16 --max-turns 2 --rl-max-turns 2 --G 2 "
                "--prompts-per-step 1 --methods baseline,skill_rm",
    "skill_selfplay": "--max-new-tokens 8 --proposer-max-new-tokens 12 --controller-max-new-tokens 8 --K 2 "
                      "--proposer-G 2 --solver-G 2 --max-model-len 512",
    "talentrl": "--max-new-tokens 16 --route-max-tokens 16 --max-steps 2 --topk-docs 2 --K 2 --k-reduced 1 "
                "--G 2 --evolve-max-tokens 16 --no-zero-shot --sft-tasks 24 --route-epochs 1 --exec-epochs 1 "
                "--arms talentrl",
}


def check_presets(small_model, tmp, device, only=None):
    """`python <script>.py --preset gpu` of each script (only: a subset) for a few steps: on a GPU on random
    weights in the shapes of the preset's model (build_like), in dry mode on the small random model."""
    import importlib
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    built = {}
    for name, cut in PRESET_RUNS.items():
        if only and name not in only:
            continue
        mod = importlib.import_module(name)
        hf_id = mod.PRESETS["gpu"]["model"]
        if device.type == "cuda":
            if hf_id not in built:
                built[hf_id] = build_like(hf_id, tmp / hf_id.replace("/", "--"), device)
            argv, what = [*cut.split(), "--model", built[hf_id]], f"random weights in the shapes of {hf_id}"
        else:
            argv = [*cut.split(), *DRY[name].split(), "--model", small_model, "--sampler", "hf"]
            what = "the small random model"
        log, t0 = tmp / f"preset-{name}.log", time.time()
        cmd = [sys.executable, f"{name}.py", "--preset", "gpu", *argv, "--run-dir", str(tmp / f"gpu-{name}")]
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    timeout=900).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout (900 s)"
        tail = "" if rc == 0 else "\n" + log.read_text()[-1500:]
        report(f"preset {name}", rc == 0, f"{name}.py --preset gpu on {what}, sizes cut to a few steps: exit "
               f"{rc} in {time.time() - t0:.0f} s{tail}")


# ----- stage 2 (vLLM) -----


def check_vllm(model_dir, device):
    """SFT on one answer moves HF's greedy reply; before a sync vLLM still has the old weights, after it the same reply."""
    import grpo
    import plumbing
    dist = plumbing.Dist(device=device)
    args = grpo_args("--model", model_dir, "--lr", "3e-3", "--max-model-len", "512", "--vllm-kv-gib", "0.05", "--precision", "fp32")
    model, tok = plumbing.load_model(model_dir, dist)
    v, h = plumbing.VLLMSampler(model, tok, args, dist), plumbing.HFSampler(model, tok)
    q = [grpo.chat_ids(tok, [{"role": "user", "content": "Name a fruit."}])]
    before = v.generate(q, 1, 12, 0.0)[0][0].ids
    opt = plumbing.make_optimizer(model, args)
    tgt = tok.encode("The secret word is banana split.", add_special_tokens=False) + [tok.eos_token_id]
    for _ in range(30):
        grpo.sft_update(model, opt, [(q[0], tgt)], args, dist)
    stale = v.generate(q, 1, 12, 0.0)[0][0].ids
    v.sync(model)
    hf, vl = h.generate(q, 1, 12, 0.0)[0][0], v.generate(q, 1, 12, 0.0)[0][0]
    report("vllm", hf.ids == vl.ids and stale == before and hf.ids != before,
           f"greedy ids after SFT + sync: HF == vLLM {hf.ids == vl.ids}; without the sync vLLM kept the old reply {stale == before}")


def script_commands(model_dir, n, tmp):
    """One step of each script on the random model under vLLM, with flags that shrink every stage."""
    m, v = ["--model", model_dir, "--sampler", "vllm", "--max-model-len", "1024", "--vllm-kv-seqs", "4"], str(2 * n)
    return {
        "grpo": ["grpo.py", "--preset", "tiny", *m, "--steps", "1", "--eval-n", "0", "--prompts-per-step", v, "--G", "2"],
        "skill_entropy": ["skill_entropy.py", "--preset", "tiny", *m, "--domains", "math,logic,creative_writing",
                          "--acc-samples", "1", "--direct-pairs", "2", "--n-train", "4", "--n-sft", "2", "--eval-n", "3",
                          "--train-len", "2,3", "--test-len", "2,3", "--max-new-tokens", "160", "--acc-max-new-tokens", "4",
                          "--propose-max-new-tokens", "8", "--steps", "1", "--prompts-per-step", v, "--G", "2",
                          "--label-seeds", "1", "--n-label", "1", "--sft-epochs", "1", "--baselines", "grpo"],
        "skill_rm": ["skill_rm.py", "--preset", "tiny", *m, "--judge-max-model-len", "1024", "--bench-per-cat", "1",
                     "--steps", "1", "--prompts-per-step", v, "--eval-n", v, "--bon-prompts", "1", "--judge-sft-steps", "1",
                     "--max-new-tokens", "8", "--judge-max-new-tokens", "16"],
        "skill_selfplay": ["skill_selfplay.py", "--family", "tool", "--preset", "tiny", *m, "--T", "1", "--proposer-prompts", v,
                           "--proposer-G", "2", "--proposer-max-new-tokens", "12", "--K", "2", "--max-new-tokens", "8",
                           "--solver-steps", "1", "--eval-n", "3", "--controller-max-new-tokens", "8",
                           "--prune-min-attempts", "99", "--collect-prompts", v, "--no-plots"],
        "talentrl": ["talentrl.py", "--preset", "tiny", *m, "--eval-n", "2", "--n-train", "60", "--sft-tasks", "48",
                     "--sft-epochs", "1", "--max-steps", "2", "--topk-docs", "2", "--K", "2", "--k-reduced", "1",
                     "--steps", "1", "--prompts-per-step", v, "--G", "2", "--evolve-every", "1", "--val-tasks", "2",
                     "--evolve-max-tokens", "16"],
    }


def check_scripts(model_dir, tmp, n):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for k, (name, argv) in enumerate(script_commands(model_dir, n, tmp).items()):
        log = tmp / f"{name}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={29900 + k}", *argv,
               "--run-dir", str(tmp / f"run-{name}")]
        t0 = time.time()
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout (900 s)"
        tail = "" if rc == 0 else "\n" + log.read_text()[-1500:]
        report(f"script {name}", rc == 0, f"torchrun --nproc_per_node={n} {' '.join(argv[:1])} one step: exit {rc} in {time.time() - t0:.0f} s{tail}")


def main():
    p = argparse.ArgumentParser(description="make gpu-smoke: the CUDA path in a few minutes")
    p.add_argument("--cpu", action="store_true", help="dry mode: the same logic on CPU/gloo at small sizes; CUDA-only checks SKIP")
    p.add_argument("--stage2", default="auto", choices=["auto", "on", "off"], help="vLLM stage: auto = when vllm imports")
    p.add_argument("--reward-steps", type=int, default=30, help="steps of the toy run whose reward must rise")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, runs)")
    p.add_argument("--presets", default="", help="scripts whose --preset gpu runs (comma-separated; all)")
    args = p.parse_args()
    if args.cpu:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise SystemExit("gpu-smoke: torch sees no CUDA device (torch " + torch.__version__ + "); `python gpu/smoke.py --cpu` is the dry run")
    else:
        device = torch.device("cuda", 0)
    t0 = time.time()
    print(f"gpu-smoke on {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU (dry mode)'}, torch {torch.__version__}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    try:
        model_dir = build_model(tmp / "model")
        check_bf16(model_dir, device)
        if device.type == "cuda":
            check_chunked(device, 151936)
        else:
            report("chunked 151936", None, "CUDA only (dry mode checks a 4,096 vocabulary below)")
            check_chunked(device, 4096)
        check_torchrun(model_dir, tmp, device)
        check_reward(model_dir, tmp, device, args.reward_steps)
        check_presets(model_dir, tmp, device, args.presets and args.presets.split(","))
        try:
            import vllm  # noqa: F401
            has_vllm = True
        except ImportError:
            has_vllm = False
        if args.stage2 == "off" or (args.stage2 == "auto" and (not has_vllm or device.type != "cuda")):
            report("stage 2", None, "vLLM sampler, weight sync and torchrun of each script: "
                   + ("--stage2 off" if args.stage2 == "off" else "vllm not installed" if not has_vllm else "dry mode (--stage2 on runs it)"))
        else:
            check_vllm(model_dir, device)
            check_scripts(model_dir, tmp, max(torch.cuda.device_count(), 1) if device.type == "cuda" else 1)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"gpu-smoke: {RESULTS.count('PASS')} PASS, {RESULTS.count('FAIL')} FAIL, {RESULTS.count('SKIP')} SKIP in "
          f"{time.time() - t0:.0f} s" + (f" (folder {tmp})" if args.keep else ""), flush=True)
    sys.exit(1 if "FAIL" in RESULTS else 0)


def worker(argv):
    """A torchrun rank: grpo.main as patch_grpo leaves it, with deterministic kernels (resume bit-exact on CUDA)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    patch_grpo().main(argv)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2:])
    else:
        main()
