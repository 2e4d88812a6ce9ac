"""The GPU path, checked on CPU (issue #23): vLLM's memory arguments and KV sizing for a given free/total, model
resolution online and offline, Qwen3's thinking switch, the prompts-per-rank refusal, the process-group timeout,
--grad-checkpointing, CPU snapshots, and `gpu/smoke.py --cpu` (the dry mode of `make gpu-smoke`)."""
import os
import sys
import types

import pytest
import torch

import grpo
import plumbing
from gpu import smoke
from conftest import ONE_THREAD, run_group

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 2**30


@pytest.fixture(scope="module")
def smoke_model_dir(tmp_path_factory):
    """gpu/smoke.py's random 2-layer Llama with the shipped tokenizer (gpu/tokenizer)."""
    return smoke.build_model(tmp_path_factory.mktemp("smoke_model"))


# ----- vLLM memory arguments -----

def _qwen3_4b():
    from transformers import Qwen3Config
    return Qwen3Config(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_size=2560)


def test_kv_bytes_per_token_from_the_config():
    from transformers import LlamaConfig
    assert plumbing.kv_bytes_per_token(_qwen3_4b()) == 2 * 36 * 8 * 128 * 2 == 144 * 1024  # head_dim 128, not 2560 / 32
    smol = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30)
    assert plumbing.kv_bytes_per_token(smol) == 2 * 30 * 3 * 64 * 2


def test_vllm_kv_cache_sized_from_max_model_len():
    cfg = _qwen3_4b()
    cpu = plumbing.vllm_memory(cfg, 4e9, 8192, None, 8)
    assert cpu == {"kv_cache_memory_bytes": 8 * 8192 * 144 * 1024}  # 9 GiB: 8 full-length requests; no utilisation on CPU
    assert plumbing.vllm_memory(cfg, 4e9, 8192, 2.0, 8)["kv_cache_memory_bytes"] == 2 * GiB  # --vllm-kv-gib wins
    with pytest.raises(ValueError, match="fewer than one request of --max-model-len 8192"):
        plumbing.vllm_memory(cfg, 4e9, 8192, 1.0, 8)  # the old 1 GiB default holds 7281 tokens


@pytest.mark.parametrize("free_gib", [78.0, 40.0, 12.5])
def test_vllm_utilisation_passes_vllm_032s_startup_check(free_gib):
    """vLLM 0.32 (vllm/v1/worker/utils.py request_memory) refuses to start unless free ≥ ⌈utilisation · total⌉, even
    with kv_cache_memory_bytes set: the utilisation must fit what training left free, and cover the engine's share."""
    from vllm.v1.worker.utils import request_memory
    total, free, n_params = 80 * GiB, int(free_gib * GiB), 4e9
    mem = plumbing.vllm_memory(_qwen3_4b(), n_params, 8192, 1.25, 8, free=free, total=total)
    snapshot = types.SimpleNamespace(total_memory=total, free_memory=free, device_="cuda:0")
    granted = request_memory(snapshot, types.SimpleNamespace(gpu_memory_utilization=mem["gpu_memory_utilization"]))
    assert granted <= free and granted >= 2 * n_params + mem["kv_cache_memory_bytes"]   # weights + KV fit the grant
    if free < 0.9 * total:  # the defect: vLLM's default 0.9 does not start beside training
        with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
            request_memory(snapshot, types.SimpleNamespace(gpu_memory_utilization=0.9))


def test_vllm_memory_refuses_clearly_when_training_left_too_little():
    with pytest.raises(ValueError, match=r"vLLM needs .* GiB .* but 5.0 of 80.0 GiB are free"):
        plumbing.vllm_memory(_qwen3_4b(), 4e9, 8192, None, 8, free=5 * GiB, total=80 * GiB)


# ----- model resolution -----

def test_resolve_model_downloads_unless_hf_hub_offline(monkeypatch):
    import huggingface_hub
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda name, **kw: calls.append(kw) or f"/cache/{name}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert plumbing.resolve_model("Qwen/Qwen3-4B") == "/cache/Qwen/Qwen3-4B" and calls[-1] == {"local_files_only": False}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert plumbing.resolve_model("Qwen/Qwen3-4B") == "/cache/Qwen/Qwen3-4B" and calls[-1] == {"local_files_only": True}

    def missing(name, **kw):
        raise FileNotFoundError(name)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    with pytest.raises(SystemExit, match="cannot load model 'Qwen/Qwen3-4B'.*HF_HUB_OFFLINE=1"):
        plumbing.resolve_model("Qwen/Qwen3-4B")


# ----- prompts, ranks, process group -----

def test_chat_ids_turn_qwen3_thinking_off():
    """The shipped tokenizer's template has Qwen3's switch: chat_ids opens the reply with an empty think block;
    a template without the switch is unaffected."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "gpu", "tokenizer"))
    msgs = [{"role": "user", "content": "What is 3 + 4?"}]
    assert "enable_thinking" in tok.chat_template
    assert tok.decode(grpo.chat_ids(tok, msgs)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tok.chat_template = tok.chat_template.replace("{% if enable_thinking is defined and enable_thinking is false %}"
                                                  "<think>\n\n</think>\n\n{% endif %}", "")
    assert tok.decode(grpo.chat_ids(tok, msgs)).endswith("<|im_start|>assistant\n")


def test_prompts_per_rank_refused_before_any_model_loads(monkeypatch):
    assert plumbing.per_rank(16, plumbing.Dist(world=8), "--prompts-per-step") == 2
    with pytest.raises(SystemExit, match="--prompts-per-step 6 leaves some of the 8 ranks with nothing to do"):
        plumbing.per_rank(6, plumbing.Dist(world=8), "--prompts-per-step")
    monkeypatch.setattr(grpo, "setup_distributed", lambda: plumbing.Dist(rank=0, world=8))
    monkeypatch.setattr(grpo, "load_policy", lambda *a: pytest.fail("a model loaded before the refusal"))
    with pytest.raises(SystemExit, match="--prompts-per-step 6"):
        grpo.main(["--preset", "tiny"])  # tiny: 6 prompts per step


def test_process_group_timeout_outlasts_rank0_stages():
    """setup_distributed gives the process group a timeout of hours (NANOSKILL_DIST_TIMEOUT_MIN; default 24 h),
    not NCCL's 10 minutes, so ranks waiting in a barrier survive a long rank-0 stage. In a fresh process: an
    in-process vLLM engine of an earlier test leaves its own default group (gloo, 30 min) behind, and
    setup_distributed keeps a group it finds (this test failed when test_grpo ran before it)."""
    code = ("import plumbing, torch, torch.distributed as td; plumbing.setup_distributed(); "
            "print(td.distributed_c10d._get_default_group()._get_backend(torch.device('cpu')).options._timeout.total_seconds()); "
            "td.destroy_process_group()")
    # port 0: rank 0's store binds a port the OS picks, never one another test holds (world size 1: none connects)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="0", NANOSKILL_DIST_TIMEOUT_MIN="90", **ONE_THREAD)
    out = run_group([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) == 90 * 60


def test_more_ranks_than_gpus_is_one_clear_line(monkeypatch):
    """torchrun --nproc_per_node=2 on a machine with one GPU: rank 1 stops with one line naming the GPU count
    before CUDA's "invalid device ordinal" (torch.cuda faked: one GPU; no process group is started)."""
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: pytest.fail("set_device reached"))
    monkeypatch.setattr(plumbing.torch_dist, "init_process_group", lambda *a, **k: pytest.fail("a group"))
    with pytest.raises(SystemExit, match=r"rank 1 has LOCAL_RANK 1, but this machine has 1 GPU\(s\); use "
                                         r"--nproc_per_node ≤ 1") as e:
        plumbing.setup_distributed()
    assert len(str(e.value).splitlines()) == 1


# ----- memory: gradient checkpointing, snapshots on the CPU -----

def test_grad_checkpointing_gives_the_same_gradients(smoke_model_dir):
    """--grad-checkpointing recomputes each decoder layer in backward (its MLP runs twice: one forward, one
    recomputation, so the prefix-sharing path, two forwards, is off) and the gradients are those without it (fp32,
    same batch; the unchecked run takes the single full pass)."""
    dist = plumbing.Dist()
    batch = grpo.collate([([5, 6, 7, 8], [9, 10, 11], [1, 1, 1], [0.5] * 3), ([5, 6], [12, 13, 14, 15], [1, 1, 0, 1], [-1.0] * 4)], 0, dist.device)
    grads, calls = {}, {}
    for flag in ([], ["--grad-checkpointing"]):
        args = smoke.grpo_args("--model", smoke_model_dir, "--precision", "fp32", *flag)
        model, _ = plumbing.load_policy(args, dist)
        n, mlp = [], model.model.layers[0].mlp
        forward = mlp.forward  # counted by wrapping: forward hooks do not fire in the recomputation
        mlp.forward = lambda *a, **kw: n.append(1) or forward(*a, **kw)
        logp = grpo.token_logprobs(model, batch if flag else {k: v for k, v in batch.items() if k != "prefix"}, 1.0)
        (-(logp * batch["adv"] * batch["mask"]).sum()).backward()
        grads[bool(flag)] = {k: p.grad.clone() for k, p in model.named_parameters()}
        calls[bool(flag)] = len(n)
    assert calls == {False: 1, True: 2}
    for k, g in grads[False].items():
        assert torch.allclose(grads[True][k], g, atol=1e-6, rtol=1e-5), k
    assert any(g.abs().sum() > 0 for g in grads[False].values())


def test_cpu_snapshot_restores_weights_without_gpu_copies(smoke_model_dir):
    model, _ = plumbing.load_model(smoke_model_dir, plumbing.Dist())
    snap = plumbing.cpu_snapshot(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert all(v.device.type == "cpu" and v.data_ptr() != before[k].data_ptr() for k, v in snap.items())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    plumbing.restore_snapshot(model, snap)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# ----- make gpu-smoke, dry mode -----

@pytest.mark.parametrize("name", ["grpo", "skill_entropy", "skill_rm", "skill_selfplay", "talentrl"])
def test_gpu_smoke_stage2_commands_parse(name, tmp_path):
    """Stage 2 (a GPU with vLLM, not run here) launches each script with these flags: each is one the script takes."""
    import importlib
    argv = smoke.script_commands("MODEL", 8, tmp_path)[name][1:] + ["--run-dir", str(tmp_path)]
    mod = importlib.import_module(name)
    args = mod.parse_args(argv) if hasattr(mod, "parse_args") else grpo.parse_with_preset(mod.build_parser(), mod.PRESETS, argv=argv)
    assert args.sampler == "vllm" and args.model == "MODEL"

@pytest.mark.heavy(230)
def test_gpu_smoke_dry_mode_on_cpu():
    """`gpu/smoke.py --cpu`: every check's logic on CPU and gloo (one torchrun rank with and without --fsdp, exact
    resume, a toy run whose reward rises, each script's --preset gpu cut to a few steps on the small random
    model); the CUDA-only checks and the vLLM stage say SKIP, the torchrun line that DDP is not wrapped."""
    out = run_group([sys.executable, os.path.join(ROOT, "gpu", "smoke.py"), "--cpu", "--reward-steps", "12"], cwd=ROOT,
                    capture_output=True, text=True, timeout=1800, env={**os.environ, **ONE_THREAD})
    lines = [l for l in out.stdout.splitlines() if l.split(" ")[0] in ("PASS", "FAIL", "SKIP")]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = {l.split(":")[0].split(" ", 1)[1]: l.split(" ")[0] for l in lines}
    assert status == {"bf16": "PASS", "chunked 151936": "SKIP", "chunked": "PASS", "torchrun": "PASS", "torchrun --fsdp": "PASS",
                      "reward": "PASS", "perf": "SKIP", "stage 2": "SKIP", **{f"preset {name}": "PASS" for name in smoke.PRESET_RUNS}}, lines
    assert "1 rank (gloo; one cpu device: DDP is not wrapped, 2 ranks need 2 GPUs)" in out.stdout


def test_gpu_presets_name_a_model_the_smoke_can_build(monkeypatch, tmp_path):
    """Every --preset gpu names a public HF model whose shapes gpu/smoke.py knows (SHAPES: it runs the preset on
    random weights of them, offline); build_like pads the shipped tokenizer to the model's vocabulary, so every
    id a random model samples decodes (checked here on a 2-layer model of Qwen3's and Qwen2's kinds)."""
    import importlib
    for name in smoke.PRESET_RUNS:
        assert importlib.import_module(name).PRESETS["gpu"]["model"] in smoke.SHAPES, name
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1)
    monkeypatch.setitem(smoke.SHAPES, "t/qwen3", ("qwen3", dict(small, head_dim=32)))
    monkeypatch.setitem(smoke.SHAPES, "t/qwen2", ("qwen2", small))
    for kind in ("qwen3", "qwen2"):
        model, tok = plumbing.load_model(smoke.build_like(f"t/{kind}", tmp_path / kind, "cpu"), plumbing.Dist())
        assert model.config.model_type == kind and len(tok) == model.config.vocab_size == smoke.VOCAB
        assert tok.decode([smoke.VOCAB - 1]) == f"pad{smoke.VOCAB - 1}" and tok.encode("pad2000") != [2000]


@pytest.mark.parametrize("name", list(smoke.PRESET_RUNS))
def test_gpu_preset_fits_one_80gb_gpu_by_the_scripts_memory_plan(name, tmp_path, capsys):
    """Each --preset gpu, bf16 as on a GPU, by the script's own memory plan (--memory-plan show, on a folder
    holding only the config of the preset's model, from SHAPES): at most 72 GiB, room left on an 80 GB GPU."""
    import importlib
    from transformers import Qwen2Config, Qwen3Config
    mod = importlib.import_module(name)
    kind, shape = smoke.SHAPES[mod.PRESETS["gpu"]["model"]]
    (Qwen3Config if kind == "qwen3" else Qwen2Config)(vocab_size=smoke.VOCAB, tie_word_embeddings=True,
                                                       **shape).save_pretrained(tmp_path / "cfg")
    with pytest.raises(SystemExit) as e:
        mod.main(["--preset", "gpu", "--model", str(tmp_path / "cfg"), "--memory-plan", "--precision", "bf16",
                  "--run-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    total = float(next(line.split()[1] for line in out.splitlines() if line.strip().startswith("total")))
    assert e.value.code == 0 and 0 < total <= 72, out


# ----- every script under torchrun: skill_entropy.py and skill_rm.py on two gloo ranks -----

def _two_ranks(*argv, timeout=900):
    return run_group([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *argv],
                     cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **ONE_THREAD})


def _one_then_two(script, model_dir, one, two):
    env = {**os.environ, **ONE_THREAD}
    r1 = run_group([sys.executable, script, model_dir, one], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert r1.returncode == 0, r1.stdout[-2000:] + r1.stderr[-3000:]
    r2 = _two_ranks(script, model_dir, two)
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-3000:]


@pytest.mark.multirank
def test_skill_entropy_grpo_step_two_gloo_ranks_equal_one_process(smoke_model_dir, tmp_path):
    """run_grpo's own split of the step's tasks over 2 ranks, Eq. (5) rewards of scripted completions: the weights after
    one step are one process's, and only rank 0 wrote the metrics line and the checkpoint."""
    script = os.path.join(ROOT, "tests", "ske_ddp_check.py")
    env = {**os.environ, **ONE_THREAD}
    r1 = run_group([sys.executable, script, "step", smoke_model_dir, str(tmp_path / "one")], cwd=ROOT,
                   capture_output=True, text=True, timeout=900, env=env)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _two_ranks(script, "step", smoke_model_dir, str(tmp_path / "two"))
    assert r2.returncode == 0, r2.stderr[-3000:]
    one, two = (torch.load(tmp_path / r / "state.pt") for r in ("one", "two"))
    init = plumbing.load_model(smoke_model_dir, plumbing.Dist())[0].state_dict()
    assert not all(torch.equal(one["state"][k], init[k]) for k in init)  # the step moved the weights
    for k in one["state"]:
        assert torch.allclose(one["state"][k], two["state"][k], atol=1e-6), k
    m1, m2 = (plumbing.read_metrics(tmp_path / r) for r in ("one", "two"))
    assert len((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()) == 1  # rank 0 alone logs
    assert m2[0]["loss"] == pytest.approx(m1[0]["loss"], rel=1e-5) and m2[0]["r_ans"] == pytest.approx(m1[0]["r_ans"])
    assert 0 < m1[0]["r_ans"] < 1


@pytest.mark.multirank
def test_skill_entropy_rank0_stages_under_torchrun_do_not_deadlock(smoke_model_dir, tmp_path):
    """Two ranks, --sampler vllm: the rank-0-only stages (bank, ske, synth, bench, label, the Table 3 evaluation) load
    their frozen models with HF generate; an external_launcher vLLM engine built there would wait for rank 1, which
    waits in a barrier (the deadlock of issue #23). Rank 0 alone computes and writes each stage."""
    run = tmp_path / "run"
    argv = ["--preset", "tiny", "--model", smoke_model_dir, "--sampler", "vllm", "--run-dir", str(run),
            "--domains", "math,logic,creative_writing", "--acc-samples", "1", "--direct-pairs", "2", "--n-train", "4",
            "--n-sft", "2", "--eval-n", "3", "--train-len", "2,3", "--test-len", "2,3", "--max-new-tokens", "160",
            "--acc-max-new-tokens", "4", "--propose-max-new-tokens", "8", "--label-seeds", "1", "--n-label", "1",
            "--max-model-len", "512", "--baselines", "base"]  # 160: a gold D.2 trace of these tasks fits
    out = _two_ranks(os.path.join(ROOT, "tests", "ske_ddp_check.py"), "stages", *argv, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for f in ("bank_labelled.json", "ske_table.json", "tasks.json", "bench.json", "table3.json", "offshelf_labelled.json"):
        assert (run / f).exists(), f
    assert out.stdout.count("[bank] labelled bank") == 1 and out.stdout.count("[synth]") == 1  # computed once, by rank 0


@pytest.mark.multirank
def test_skill_rm_judging_and_rl_step_two_gloo_ranks_equal_one_process(smoke_model_dir, tmp_path):
    """skill_rm.py on 2 ranks: benchmark judgments dealt over the ranks come back complete and in order, the held-out
    evaluation counts what one process counts, one GRPO step (prompts split over the ranks) moves the weights as
    one process does, and rank 0 alone logs."""
    _one_then_two(os.path.join(ROOT, "tests", "rm_ddp_check.py"), smoke_model_dir, str(tmp_path / "one.pt"),
                  str(tmp_path / "two.pt"))
    one, two = (torch.load(tmp_path / f, weights_only=False) for f in ("one.pt", "two.pt"))
    assert one["judged"] == two["judged"] and len(one["judged"]) == 7
    assert [j[1]["score"] for j in one["judged"]] == [round((i % 4) / 4, 2) for i in range(7)]
    assert one["eval"] == two["eval"]
    for k in one["state"]:
        assert torch.allclose(one["state"][k], two["state"][k], atol=1e-6), k
    assert two["train"]["reward"] == pytest.approx(one["train"]["reward"]) and two["metrics_lines"] == 1


@pytest.mark.multirank
def test_vllm_engine_failing_on_one_rank_stops_every_rank_with_one_line(smoke_model_dir, tmp_path):
    """VLLMSampler agrees on the engine's outcome, not only on its memory plan (tests/engine_check.py,
    vllm.LLM replaced): failing on both ranks, --sampler auto falls back to HF generate on both; failing on
    rank 1 only, both ranks stop at once with the same line (before, rank 1 fell back to HF generate and rank
    0 waited 24 h)."""
    import time
    t0 = time.time()
    out = _two_ranks(os.path.join(ROOT, "tests", "engine_check.py"), smoke_model_dir, str(tmp_path / "seen"),
                     timeout=300)
    line = ("nanoskill: the vLLM engine's start failed on rank(s) [1] of 2 (RuntimeError: CUDA out of memory "
            "(simulated)); every rank stops")  # the error's first line
    assert out.returncode != 0 and out.stderr.count(line) == 2, out.stdout[-2000:] + out.stderr[-3000:]
    assert time.time() - t0 < 240
    for rank in range(2):
        assert torch.load(tmp_path / f"seen.{rank}") == {"all_failed": "HFSampler"}


@pytest.mark.multirank
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_resume_reads_state_pt_on_rank_0_alone(smoke_model_dir, tmp_path, mode):
    """A checkpoint's state.pt (the optimizer state, 12 B/param) is read by rank 0 and sent to the others:
    rank 1 torch.loads only its RNG file and extra.pt, yet under DDP its AdamW state is the saved one
    (broadcast tensor by tensor) and under FSDP its shard of it (_load_fsdp); step and extra reach both."""
    out = _two_ranks(os.path.join(ROOT, "tests", "state_check.py"), smoke_model_dir, str(tmp_path / "run"),
                     mode, str(tmp_path / "seen"), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    seen = [torch.load(tmp_path / f"seen.{rank}", weights_only=False) for rank in range(2)]
    assert seen[0]["loaded"] == ["extra.pt", "rng_0.pt", "state.pt"]
    assert seen[1]["loaded"] == ["extra.pt", "rng_1.pt"]
    for s in seen:
        assert s["same"] and s["step"] == 3 and s["extra"]["note"] == "saved", s


@pytest.mark.multirank
def test_rank0_stages_and_evolution_deal_their_generation_over_two_gloo_ranks(tmp_path):
    """tests/shards_check.py, scripted generators: skill_entropy's rank-0 stages (plumbing.on_rank0), the
    SFT teacher's call, talentrl's skill-bank evolution and skill_selfplay's controller (DealtSampler) give
    each of 2 gloo ranks a share of the prompts: disjoint, together those of one process, whose results every
    rank gets in one process's order (one process: each generator saw every prompt in order). Outside a stage
    a frozen model's call is the rank's own (a reward of its own rollouts must not wait for the others)."""
    env = {**os.environ, **ONE_THREAD}
    script = os.path.join(ROOT, "tests", "shards_check.py")
    r1 = run_group([sys.executable, script, str(tmp_path / "one")], cwd=ROOT, capture_output=True, text=True,
                   timeout=300, env=env)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _two_ranks(script, str(tmp_path / "two"), timeout=300)
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-3000:]
    one = torch.load(tmp_path / "one.0", weights_only=False)
    two = [torch.load(tmp_path / f"two.{rank}", weights_only=False) for rank in range(2)]
    assert one["seen"]["stage"] == [f"q{i}" for i in range(5)] + ["only"] and "skipped" not in one["seen"]
    for rank, t in enumerate(two):  # outside a stage a rank's call is its own
        assert t["seen"]["own"] == [f"r{rank}"] and t["got"]["own"] == [f"o:r{rank}"]
    for case in set(one["seen"]) - {"own"}:
        prompts, shares = one["seen"][case], [t["seen"].get(case, []) for t in two]
        assert all(shares) and not set(shares[0]) & set(shares[1]), case      # disjoint, no rank idle
        assert sorted(shares[0] + shares[1]) == sorted(prompts), case          # covering
    assert two[0]["got"]["stage"] == one["got"]["stage"] and two[1]["got"]["stage"] is None  # on rank 0
    for case in ("teacher", "evolve", "refine"):
        assert two[0]["got"][case] == two[1]["got"][case] == one["got"][case], case
    assert one["got"]["evolve"][0] == 3 and one["got"]["refine"][1] == ["p5", "p4", "p3", "p2", "p1"]


# ----- precision: the full copies under FSDP, DDP's gradient mean, logit chunks, vLLM's eager mode -----

@pytest.mark.multirank
def test_fsdp_hf_sampler_copy_is_in_the_compute_dtype(smoke_model_dir, tmp_path):
    """Under --fsdp the HF sampler generates from a full copy of the policy on every rank: bf16 (2 B/param, not the
    shards' fp32 4 B/param) unless --precision fp32; sync refreshes the same tensors in place with the gathered
    weights; frozen_copy's default dtype is the same."""
    out = _two_ranks(os.path.join(ROOT, "tests", "precision_ranks_check.py"), "replica", smoke_model_dir, str(tmp_path / "r"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for rank in range(2):
        got = torch.load(tmp_path / f"r.{rank}", weights_only=False)
        for precision, dtype, size in (("bf16", "torch.bfloat16", 2), ("fp32", "torch.float32", 4)):
            r = got[precision]
            assert r["dtypes"] == r["frozen"] == {dtype} and r["bytes"] == size * r["n_params"], (rank, precision, r)
            assert r["same_object"] and r["synced"], (rank, precision)


@pytest.mark.multirank
def test_ddp_reduces_bf16_gradients_in_fp32(smoke_model_dir, tmp_path):
    """DDP with bf16 weights: the gradient MasterAdamW's fp32 masters receive is the fp32 mean of the two ranks' own
    gradients (to fp32 rounding), and p.grad that mean rounded once to bf16. Most of the masters' values lie
    between two bf16 numbers, so no bf16 reduction could have produced them."""
    out = _two_ranks(os.path.join(ROOT, "tests", "precision_ranks_check.py"), "reduce", smoke_model_dir, str(tmp_path / "g"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"g.{rank}", weights_only=False) for rank in range(2))
    assert r0["optimizer"] == "MasterAdamW"
    n_off_grid = n = 0
    for a, b, m0, m1, g0 in zip(r0["local"], r1["local"], r0["master"], r1["master"], r0["grad"]):
        mean = (a + b) / 2                                                   # fp32, exact for two bf16 values
        assert not torch.equal(a, b)                                         # the ranks had different batches
        assert torch.allclose(m0, mean, rtol=1e-6, atol=1e-12) and torch.equal(m0, m1)
        assert torch.equal(g0, mean.to(torch.bfloat16).float())              # p.grad: one rounding of the fp32 mean
        n_off_grid, n = n_off_grid + int((m0 != g0).sum()), n + m0.numel()
    assert n_off_grid > 0.5 * n, (n_off_grid, n)


def test_chunk_rows_by_device():
    """ChunkedTokenLogProb's chunk: 8 rows on a CPU; on CUDA a 64 MiB fp32 chunk (110 rows at Qwen3's 151,936), so a
    16k-row micro-batch takes ~150 Python iterations, not 2k. The chunk size leaves the values unchanged."""
    assert plumbing.chunk_rows("cpu", 151936) == plumbing.chunk_rows(torch.device("cpu"), 49152) == 8
    rows = plumbing.chunk_rows(torch.device("cuda", 3), 151936)
    assert rows == 110 and rows * 151936 * 4 <= 64 * 2**20 < (rows + 1) * 151936 * 4 and -(-16384 // rows) == 149
    assert plumbing.chunk_rows("cuda", 10**9) == 1
    z = torch.randn(300, 500, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = torch.randint(0, 500, (300,), generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    for r in (None, 8, 110):
        x = z.clone().requires_grad_(True)
        out = plumbing.ChunkedTokenLogProb.apply(x, y, 0.7, r)
        out.sum().backward()
        outs.append(out), grads.append(x.grad)
    assert all(torch.equal(outs[0], o) and torch.equal(grads[0], g) for o, g in zip(outs, grads))
    assert torch.equal(plumbing.token_entropy(z, 0.7), plumbing.token_entropy(z, 0.7, rows=110))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_vllm_eager_only_on_cpu(smoke_model_dir, monkeypatch, device):
    """VLLMSampler asks vLLM for CUDA graphs on a GPU (enforce_eager=False) and for eager mode only on the CPU backend;
    on CUDA it also passes the utilisation computed from the free memory. (vllm.LLM is replaced by a recorder: the
    arguments are what is checked; a CUDA device needs no GPU to be named.)"""
    import vllm
    seen = {}

    def recorder(**kw):
        seen.update(kw)
        raise RuntimeError("recorded")
    monkeypatch.setattr(vllm, "LLM", recorder)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (70 * GiB, 80 * GiB))
    model, tok = plumbing.load_model(smoke_model_dir, plumbing.Dist())
    args = smoke.grpo_args("--model", smoke_model_dir, "--max-model-len", "512")
    with pytest.raises(RuntimeError, match="recorded"):
        plumbing.VLLMSampler(model, tok, args, plumbing.Dist(device=torch.device(device)))
    assert seen["enforce_eager"] is (device == "cpu")
    assert ("gpu_memory_utilization" in seen) is (device == "cuda")


def test_make_cuda_check_is_one_clear_line():
    """`make install`'s cuda-check, told a GPU is there (GPU=yes, as nvidia-smi would): with a CPU torch it stops with
    one line naming the cause; with a CUDA torch it passes."""
    out = run_group(["make", "-s", "cuda-check", "GPU=yes", f"BIN={os.path.dirname(sys.executable)}"], cwd=ROOT,
                    capture_output=True, text=True, timeout=120)
    if torch.cuda.is_available():
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode != 0 and "nvidia-smi sees a GPU but torch" in out.stderr
        assert len([l for l in out.stderr.splitlines() if l.startswith("nanoskill:")]) == 1
