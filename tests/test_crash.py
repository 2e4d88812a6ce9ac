"""Crash safety: a run killed (SIGKILL) anywhere, including inside a checkpoint write, resumes with --resume to
the same final weights and the same metrics rows as a run never interrupted; a corrupt checkpoint is one clear
error line; a torn metrics line is dropped with a warning. The kill points are plumbing.kill_point's
(NANOSKILL_KILL_AT=name:stepN)."""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

import plumbing
from conftest import ONE_THREAD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "tests", "crash_check.py")


def _run(argv, kill_at=None, timeout=300):
    env = {**os.environ, **ONE_THREAD}
    env.pop("NANOSKILL_KILL_AT", None)
    if kill_at:
        env["NANOSKILL_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, CHECK, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _rows(run_dir, drop=("time", "time_gen", "time_step")):
    """metrics.jsonl as written, line by line (a duplicated or missing row shows), without the wall times."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]


def _weights(run_dir, name="model"):
    from safetensors.torch import load_file
    return load_file(run_dir / "ckpt" / name / "model.safetensors")


def _assert_same_weights(a, b, name="model"):
    wa, wb = _weights(a, name), _weights(b, name)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), f"{b}, {name}: final weights differ"


def _assert_same_optimizer(sa, sb):
    for i in sa["state"]:
        for k, v in sa["state"][i].items():
            assert torch.equal(v, sb["state"][i][k]), (i, k)


def _assert_same_run(a, b):
    assert _rows(a) == _rows(b)
    _assert_same_weights(a, b)
    sa, sb = (torch.load(d / "ckpt" / "state.pt", weights_only=False) for d in (a, b))
    assert sa["step"] == sb["step"] and plumbing.checkpoint_extra(a) == plumbing.checkpoint_extra(b)
    _assert_same_optimizer(sa["optimizer"], sb["optimizer"])


def _kill_at_each(argv, kills, resume="--resume"):
    """Run argv once per kill point, SIGKILLed there, each run after the first resuming (with the flag `resume`;
    None: the script resumes on its own); then once to the end. Returns everything the runs wrote to stderr."""
    said = ""
    for i, point in enumerate(kills):
        out = _run(argv + ([resume] if i and resume else []), kill_at=point)
        assert out.returncode == -9, f"the kill at {point} did not happen (rc {out.returncode}): {out.stderr[-2000:]}"
        said += out.stderr
    out = _run(argv + ([resume] if resume else []))
    assert out.returncode == 0, out.stderr[-3000:]
    return said + out.stderr


# ----- grpo.py: killed at six points across the run, resumed each time -----

GRPO = ["grpo", "--sampler", "hf", "--steps", "6", "--save-every", "2", "--prompts-per-step", "2", "--G", "2",
        "--max-new-tokens", "6", "--micro-batch", "4", "--eval-n", "0", "--lr", "1e-3", "--beta", "0.04"]

# each kill lands later than the checkpoint the previous resume started from; together they cover: before any
# checkpoint, inside the first checkpoint write, a torn metrics line, between the two renames of a commit, a row
# logged after a checkpoint, and after the commit but before the old checkpoint is deleted
KILLS = ["metrics:after_row:step0", "ckpt:after_model:step1", "metrics:torn:step2", "ckpt:between_renames:step3",
         "metrics:after_row:step4", "ckpt:after_tmp_rename:step5"]


@pytest.mark.heavy(63)
def test_grpo_killed_at_six_points_resumes_bit_identical(tiny_model_dir, tmp_path):
    common = GRPO + ["--model", tiny_model_dir]
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(common + ["--run-dir", str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_rows(ref)) == 6
    w0 = plumbing.load_model(tiny_model_dir, plumbing.Dist())[0].state_dict()
    assert any(not torch.equal(w0[k], v) for k, v in _weights(ref).items()), "the weights never moved"
    said = _kill_at_each(common + ["--run-dir", str(run)], KILLS)
    _assert_same_run(ref, run)
    assert not (run / "ckpt.old").exists() and not (run / "ckpt.tmp").exists()
    # what the resumes said: a fresh start twice, a torn line, the fallback to ckpt.tmp, rows cut back
    assert said.count("no checkpoint in") == 2 and "and a torn last line" in said
    assert "loading the last complete checkpoint" in said and "ckpt.tmp" in said
    assert "dropped 1 row(s) logged after the checkpoint" in said


@pytest.mark.heavy(66)
def test_talentrl_killed_at_five_points_resumes_bit_identical(tiny_model_dir, tmp_path):
    """talentrl.phase2_rl (Alg. 1 l.14-23: policy, optimizer and SkillBank in the checkpoint) with scripted rollouts."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(["talentrl", tiny_model_dir, str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_rows(ref)) == 5
    w0 = plumbing.load_model(tiny_model_dir, plumbing.Dist())[0].state_dict()
    assert any(not torch.equal(w0[k], v) for k, v in _weights(ref).items()), "the weights never moved"
    kills = ["metrics:after_row:step0", "ckpt:before_complete:step1", "metrics:torn:step2",
             "ckpt:between_renames:step3", "ckpt:after_tmp_rename:step4"]
    _kill_at_each(["talentrl", tiny_model_dir, str(run)], kills)
    _assert_same_run(ref, run)


@pytest.mark.heavy(56)
def test_skill_entropy_killed_at_five_points_resumes_bit_identical(tiny_model_dir, tmp_path):
    """skill_entropy's SFT warm-up and a GRPO row (run_sft, run_grpo: checkpoint_state decides what is reused),
    rollouts from the HF sampler on the tiny model. The kills: inside SFT's checkpoint write (SFT reruns), after
    it committed and inside GRPO's first checkpoint (GRPO starts afresh from the SFT weights), a torn GRPO row,
    between the renames of a commit, and after the final ("done") commit (the run only loads it)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(["skill_entropy", tiny_model_dir, str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_rows(ref / "sft")) == 2 and len(_rows(ref / "grpo")) == 5
    assert any(not torch.equal(_weights(ref / "sft")[k], v) for k, v in _weights(ref / "grpo").items()), \
        "GRPO never moved the weights"
    kills = ["ckpt:before_complete:step2", "ckpt:after_model:step1", "metrics:torn:step2", "ckpt:between_renames:step3",
             "ckpt:after_tmp_rename:step4"]
    said = _kill_at_each(["skill_entropy", tiny_model_dir, str(run)], kills, resume=None)  # its stages reuse what is done
    for sub in ("sft", "grpo"):
        assert _rows(ref / sub) == _rows(run / sub), sub
        _assert_same_weights(ref / sub, run / sub)
        assert plumbing.checkpoint_extra(ref / sub) == plumbing.checkpoint_extra(run / sub)
        assert sorted(p.name for p in (run / sub).iterdir() if p.name.startswith("ckpt")) == ["ckpt"]
    assert "and a torn last line" in said and "loading the last complete checkpoint" in said


SELFPLAY = ["skill_selfplay", "--family", "zebra", "--preset", "tiny", "--T", "3", "--proposer-prompts", "2",
            "--proposer-G", "2", "--collect-prompts", "0", "--K", "2", "--solver-G", "2", "--solver-batch", "2",
            "--solver-steps", "1", "--solver-sft-steps", "1", "--solver-sft-tasks", "2", "--solver-sft-batch", "2",
            "--solver-sft-lr", "1e-2", "--lr", "1e-3", "--max-new-tokens", "16", "--zebra-eval-per-scale", "1",
            "--zebra-eval-scales", "small", "--rg-eval-n", "0", "--controller-max-new-tokens", "8", "--sampler", "hf",
            "--proposer-sft-steps", "0", "--precision", "fp32", "--no-plots"]


@pytest.mark.heavy(66)
def test_skill_selfplay_killed_at_five_points_resumes_bit_identical(tiny_model_dir, tmp_path):
    """Skill-SP's loop (zebra, 3 iterations; proposer and solver in one checkpoint per iteration, the library, σ
    and the table rows in its extra; the solver on the HF sampler, the proposer scripted: crash_check.py). The
    kills: inside the first checkpoint write (a fresh start), a torn main-log row of iteration 1, between the
    renames of iteration 1's commit (the resume loads ckpt.tmp), a row after iteration 2's proposer and solver
    rows (three logs cut back), after the final commit; then the same rows, weights, optimizers and extra."""
    from test_skill_selfplay import TINY_ZEBRA_PACKAGE  # one 2 × 2 package: short gold grids, short answer budgets
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "zebra_tiny.md").write_text(TINY_ZEBRA_PACKAGE)
    argv = SELFPLAY + ["--model", tiny_model_dir, "--library", str(tmp_path / "lib")]
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(argv + ["--run-dir", str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    logs = ("", "proposer", "solver", "solver_sft")
    times = ("time", "time_propose", "time_collect", "time_solve", "time_evolve", "time_eval")
    assert [len(_rows(ref / sub)) for sub in logs] == [3, 3, 3, 1]
    assert all(r["pool_size"] >= 1 for r in _rows(ref)) and all(r["grad_norm"] > 0 for r in _rows(ref / "solver"))
    kills = ["ckpt:after_model:step0", "metrics:torn:step2", "ckpt:between_renames:step1", "metrics:after_row:step3",
             "ckpt:after_tmp_rename:step2"]
    said = _kill_at_each(argv + ["--run-dir", str(run)], kills)
    for sub in logs:
        assert _rows(ref / sub, times) == _rows(run / sub, times), sub
    for name in ("proposer", "solver"):
        _assert_same_weights(ref, run, name)
    sa, sb = (torch.load(d / "ckpt" / "state.pt", weights_only=False) for d in (ref, run))
    for name in ("proposer", "solver"):
        _assert_same_optimizer(sa["optimizer"][name], sb["optimizer"][name])
    untimed = lambda d: {**d, "rows": [{k: v for k, v in r.items() if k not in times} for r in d["rows"]]}
    ea, eb = plumbing.checkpoint_extra(ref), plumbing.checkpoint_extra(run)
    assert ea["iteration"] == eb["iteration"] == 3 and untimed(ea) == untimed({**eb, "library": ea["library"]})
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (ref, run))
    assert untimed(ra) == untimed(rb)
    for f in ("library_changes.jsonl", "records/iter_2.jsonl", "library/iter_3/stats.json", "eval/iter_3.jsonl"):
        assert (ref / f).read_text() == (run / f).read_text(), f
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("ckpt")) == ["ckpt"]
    assert said.count("no checkpoint in") == 1 and "and a torn last line" in said
    assert "loading the last complete checkpoint" in said and "dropped 1 row(s) logged after the checkpoint" in said


# ----- the checkpoint commit, point by point (in-process: a "kill" is an exception that abandons the save) -----


class Killed(Exception):
    pass


def _tiny(tiny_model_dir):
    args = types.SimpleNamespace(model=tiny_model_dir, precision="fp32", fsdp=False, lr=1e-3, weight_decay=0.0)
    import grpo
    dist = plumbing.Dist()
    model, tok = plumbing.load_policy(args, dist)
    return model, tok, plumbing.make_optimizer(model, args), dist


SAVE_POINTS = ["ckpt:begin", "ckpt:after_model", "ckpt:before_complete", "ckpt:before_rename",
               "ckpt:between_renames", "ckpt:after_tmp_rename"]


@pytest.mark.parametrize("point", SAVE_POINTS)
def test_checkpoint_killed_while_saving_loads_a_complete_one(tiny_model_dir, tmp_path, monkeypatch, point):
    """A kill at any point of the second save leaves step 0's or step 1's checkpoint loadable, whole; before the
    fix a kill between the renames left no ckpt/ and the run silently restarted from step 0."""
    model, tok, opt, dist = _tiny(tiny_model_dir)
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    plumbing.save_checkpoint(tmp_path, model, tok, opt, 0, {"at": 0}, dist)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    w1 = {k: v.clone() for k, v in model.state_dict().items()}

    def die(name, step=None):
        if name == point:
            raise Killed(name)
    monkeypatch.setattr(plumbing, "kill_point", die)
    with pytest.raises(Killed):
        plumbing.save_checkpoint(tmp_path, model, tok, opt, 1, {"at": 1}, dist)
    monkeypatch.undo()
    fresh, _, opt2, _ = _tiny(tiny_model_dir)
    ck = plumbing.load_checkpoint(tmp_path, fresh, opt2, dist)
    assert ck is not None, "a complete checkpoint was left but not found"
    want = w0 if ck[0] == 0 else w1
    assert ck[1] == {"at": ck[0]}
    got = fresh.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    # expected step: the new one once it is complete, else the old one
    assert ck[0] == (1 if SAVE_POINTS.index(point) >= SAVE_POINTS.index("ckpt:before_rename") else 0)
    # and the next save, from whatever was left, commits cleanly
    plumbing.save_checkpoint(tmp_path, model, tok, opt, 2, {"at": 2}, dist)
    assert plumbing.load_checkpoint(tmp_path, fresh, opt2, dist)[0] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# ----- a corrupt checkpoint: one clear line naming the file, never a deep traceback or a fresh start -----


def _corrupt_cases(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    model, tok, opt, dist = _tiny(tiny_model_dir)
    plumbing.save_checkpoint(tmp_path / "good", model, tok, opt, 3, {}, dist)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    other = LlamaForCausalLM(cfg)
    other_opt = torch.optim.AdamW(other.parameters())
    other(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    other_opt.step()                                                   # AdamW state exists after a step
    plumbing.save_checkpoint(tmp_path / "shapes", other, tok, other_opt, 3, {}, dist)
    one_layer = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))
    plumbing.save_checkpoint(tmp_path / "other", one_layer, tok, None, 3, {}, dist)
    return model, opt, dist


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("case", ["weights_truncated", "state_truncated", "rng_truncated", "wrong_shapes",
                                  "another_model", "optimizer_of_another_model"])
def test_corrupt_checkpoint_is_one_clear_error_line(tiny_model_dir, tmp_path, case):
    model, opt, dist = _corrupt_cases(tmp_path, tiny_model_dir)
    ck = tmp_path / "good" / "ckpt"
    run, names = tmp_path / "good", {"weights_truncated": "model.safetensors", "state_truncated": "state.pt",
                                     "rng_truncated": "rng_0.pt", "wrong_shapes": "model.safetensors",
                                     "another_model": "model.safetensors", "optimizer_of_another_model": "state.pt"}
    if case == "weights_truncated":
        _truncate(ck / "model" / "model.safetensors")
    elif case == "state_truncated":
        _truncate(ck / "state.pt")
    elif case == "rng_truncated":
        _truncate(ck / "rng_0.pt")
    elif case == "wrong_shapes":
        run = tmp_path / "shapes"
    elif case == "another_model":
        run = tmp_path / "other"
    else:  # the right weights beside another model's optimizer state
        (ck / "state.pt").write_bytes((tmp_path / "shapes" / "ckpt" / "state.pt").read_bytes())
    with pytest.raises(SystemExit) as e:
        plumbing.resume_checkpoint(run, model, opt, dist)
    msg = str(e.value)
    assert msg.startswith("nanoskill: cannot load the checkpoint ") and names[case] in msg and "\n" not in msg, msg


# ----- metrics.jsonl: append-only, a torn last line dropped with a warning, never a doubled row -----


def test_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path, capsys):
    import grpo
    dist = plumbing.Dist()
    for s in range(3):
        plumbing.log_metrics(tmp_path, s, {"reward": float(s)}, dist)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')                                   # a kill in the middle of a write
    assert sorted(plumbing.read_metrics(tmp_path)) == [0, 1, 2]       # before the fix: json.loads raised
    assert "torn last line" in capsys.readouterr().err
    plumbing.log_metrics(tmp_path, 3, {"reward": 3.0}, dist)          # the next row does not glue onto it
    assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


def test_resume_cuts_rows_logged_after_the_checkpoint(tiny_model_dir, tmp_path, capsys):
    """Rows of steps after the checkpoint run again on resume: kept, they would be in the file twice."""
    model, tok, opt, dist = _tiny(tiny_model_dir)
    for s in range(2):
        plumbing.log_metrics(tmp_path, s, {"reward": float(s)}, dist)
    plumbing.save_checkpoint(tmp_path, model, tok, opt, 1, {}, dist)
    for s in range(2, 4):
        plumbing.log_metrics(tmp_path, s, {"reward": float(s)}, dist)
    assert plumbing.resume_checkpoint(tmp_path, model, opt, dist)[0] == 1
    assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert "dropped 2 row(s)" in capsys.readouterr().err
    empty = tmp_path / "fresh"
    plumbing.log_metrics(empty, 0, {"reward": 0.0}, dist)                # killed before its first checkpoint
    assert plumbing.resume_checkpoint(empty, model, opt, dist) is None
    assert (empty / "metrics.jsonl").read_text() == "" and "no checkpoint in" in capsys.readouterr().err


# ----- every script honours --resume or refuses it -----


def test_skill_rm_refuses_resume():
    import skill_rm
    with pytest.raises(SystemExit, match="--resume is not supported"):
        skill_rm.main(["--preset", "tiny", "--resume"])


# ----- vLLM reseeds the global RNGs when its engine starts -----


def test_vllm_engine_start_leaves_the_rng_state_alone(tiny_model_dir):
    """LLM(seed=) calls set_random_seed at every engine start; a resumed run restores its RNG state first, so
    the engine must not move it (before the fix, the draws after the start were those of seed 0)."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    import random

    import numpy as np

    import grpo
    p = __import__("argparse").ArgumentParser()
    grpo.add_grpo_args(p)
    args = p.parse_args(["--model", tiny_model_dir, "--no-autocast", "--max-model-len", "128", "--vllm-kv-gib", "0.02"])
    dist = plumbing.Dist()
    model, tok = plumbing.load_policy(args, dist)
    grpo.seed_everything(123)
    state = plumbing._rng_state()
    plumbing.VLLMSampler(model, tok, args, dist)
    after = (random.random(), float(np.random.rand()), torch.rand(1).item())
    plumbing._set_rng_state(state)
    assert after == (random.random(), float(np.random.rand()), torch.rand(1).item())


# ----- test hygiene: no test can hang, no two tests race for a port -----


def test_every_subprocess_in_the_tests_has_a_timeout_and_no_fixed_port():
    """Every subprocess call in tests/ has timeout=; torchrun runs --standalone (the rendezvous binds a port the OS
    picks), never a fixed --master_port (several were reused back to back)."""
    import ast
    import glob
    bad = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        src = open(path).read()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("subprocess."):
                if not any(k.arg == "timeout" for k in node.keywords):
                    bad.append(f"{os.path.basename(path)}:{node.lineno} has no timeout")
        if "master_port" in src and os.path.basename(path) != "test_crash.py":  # this test names it, to refuse it
            bad.append(f"{os.path.basename(path)} names a fixed --master_port")
        if "torch.distributed.run" in src and "--standalone" not in src:
            bad.append(f"{os.path.basename(path)} runs torchrun without --standalone")
    assert not bad, bad


HYGIENE = {"test_every_subprocess_in_the_tests_has_a_timeout_and_no_fixed_port",  # they name torchrun to check it
           "test_every_test_that_starts_torchrun_ranks_is_marked_multirank"}


def test_every_test_that_starts_torchrun_ranks_is_marked_multirank():
    """A test that starts torchrun (itself or through a helper of its file) carries @pytest.mark.multirank, so
    bench/multirank_repeat.py (the teardown-abort repeats) runs every multi-rank test, none forgotten."""
    import ast
    import glob
    bad = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        src = open(path).read()
        funcs = {n.name: n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}

        def starts_ranks(fn, seen):
            if "torch.distributed.run" in ast.get_source_segment(src, fn):
                return True
            called = {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            return any(starts_ranks(funcs[c], seen | {c}) for c in called & set(funcs) - seen)

        for name, fn in funcs.items():
            marked = any("mark.multirank" in ast.unparse(d) for d in fn.decorator_list)
            if name.startswith("test_") and name not in HYGIENE and starts_ranks(fn, {name}) and not marked:
                bad.append(f"{os.path.basename(path)}::{name}")
    assert not bad, f"start torchrun ranks without @pytest.mark.multirank: {bad}"


def test_skipped_tests_say_why_in_the_summary(pytestconfig):
    """A skip (no root, no bubblewrap, no vLLM) is listed with its reason in pytest's short summary."""
    assert set("sA") & set(pytestconfig.option.reportchars)
