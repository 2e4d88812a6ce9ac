"""Crash safety: a run killed (SIGKILL) anywhere, including inside a checkpoint write, resumes with --resume to
the same final weights and the same metrics rows as a run never interrupted; a corrupt checkpoint is one clear
error line; a torn metrics line is dropped with a warning. The kill points are plumbing.kill_point's
(NANOSKILL_KILL_AT=name:stepN)."""
import importlib
import json
import os
import re
import sys
import types

import pytest
import torch

import plumbing
from conftest import ONE_THREAD, run_group

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "tests", "crash_check.py")


def _run(argv, kill_at=None, timeout=300):
    env = {**os.environ, **ONE_THREAD}
    env.pop("NANOSKILL_KILL_AT", None)
    if kill_at:
        env["NANOSKILL_KILL_AT"] = kill_at
    return run_group([sys.executable, CHECK, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


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


def _lines(path):
    return path.read_text().splitlines(keepends=True) if path.exists() else []


def _assert_resumed_at(n, out, before, ck_dir, log, key):
    """The run `out` resumed where the runs before it stopped, step n (None: there was no checkpoint yet):
    it said "resumed from <ck_dir>/ckpt… at step n", kept the rows of steps 0…n of the metrics.jsonl `log`
    as they were `before` it ran (byte for byte: their wall times too) and printed no `key` row of a step
    ≤ n. A run that restarted from step 0 ends with the same weights (it is deterministic), but fails here."""
    said = [int(s) for s in re.findall(rf"resumed from {re.escape(str(ck_dir))}/ckpt[.a-z]* at step (-?\d+)",
                                       out.stderr)]
    rows = [int(s) for s, k in re.findall(r"^step +(-?\d+) \| (\w+)", out.stdout, re.M) if k == key]
    where = f"expected a resume at step {n}; said {said}, printed {key} rows {rows}: {out.stderr[-1500:]}"
    if n is None:
        assert said == [] and rows[:1] in ([], [0]), where
        return
    assert said == [n] and rows[:1] in ([], [n + 1]) and min(rows, default=n + 1) > n, where
    assert len(before) > n and _lines(log)[:n + 1] == before[:n + 1], f"{log}: rows of steps ≤ {n} rewritten"


def _kill_at_each(argv, kills, resumes, ck_dir, log="", key="reward", resume="--resume"):
    """Run argv once per kill point, SIGKILLed there, each run after the first resuming (with the flag
    `resume`; None: the script resumes on its own); then once to the end. resumes[i]: the step the run after
    kill i resumes at (the checkpoint in ck_dir; None: a fresh start), checked by _assert_resumed_at on
    <ck_dir>/<log>'s rows and the `key` rows on stdout. Returns the runs' outputs."""
    assert len(resumes) == len(kills)
    outs, path = [], ck_dir / log / "metrics.jsonl"
    for i, point in enumerate(kills + [None]):
        before = _lines(path)
        out = _run(argv + ([resume] if i and resume else []), kill_at=point)
        if point is None:
            assert out.returncode == 0, out.stderr[-3000:]
        else:
            assert out.returncode == -9, f"no kill at {point} (rc {out.returncode}): {out.stderr[-2000:]}"
        if i:
            _assert_resumed_at(resumes[i - 1], out, before, ck_dir, path, key)
        outs.append(out)
    return outs


# ----- grpo.py: killed at seven points across the run, resumed each time -----

GRPO = ["grpo", "--sampler", "hf", "--steps", "8", "--save-every", "2", "--prompts-per-step", "2", "--G", "2",
        "--max-new-tokens", "6", "--micro-batch", "4", "--eval-n", "2", "--lr", "1e-3", "--beta", "0.04"]

# each kill lands later than the checkpoint the previous resume started from (saves at steps 1, 3, 5, 7);
# together they cover: a tensor file half written in the first checkpoint (nothing to resume), a torn metrics
# line, between the two renames of a commit (no ckpt/ at all), before the rename (ckpt.tmp/ newer than ckpt/),
# then a second kill in the next save (state.pt half written: the resume must still find the step ckpt.tmp/
# held, not the older ckpt/'s), after the commit but before the old checkpoint is deleted, and in the last
# evaluation
KILLS = ["ckpt:torn_weights:step1", "metrics:torn:step2", "ckpt:between_renames:step3",
         "ckpt:before_rename:step5", "ckpt:torn_state:step7", "ckpt:after_tmp_rename:step7", "eval:after"]
RESUMES = [None, 1, 3, 5, 5, 7, 7]  # the step each run after a kill resumes at


@pytest.mark.heavy(70)
def test_grpo_killed_at_seven_points_resumes_where_it_stopped(tiny_model_dir, tmp_path):
    common = GRPO + ["--model", tiny_model_dir]
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(common + ["--run-dir", str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_rows(ref)) == 8
    w0 = plumbing.load_model(tiny_model_dir, plumbing.Dist())[0].state_dict()
    assert any(not torch.equal(w0[k], v) for k, v in _weights(ref).items()), "the weights never moved"
    said = "".join(o.stderr for o in _kill_at_each(common + ["--run-dir", str(run)], KILLS, RESUMES, run))
    _assert_same_run(ref, run)
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (ref, run))
    assert (ra["acc_before"], ra["acc_after"]) == (rb["acc_before"], rb["acc_after"])
    assert not (run / "ckpt.old").exists() and not (run / "ckpt.tmp").exists()
    # what the resumes said: a fresh start, a torn line, the fallback to ckpt.tmp, rows of steps 6-7 cut back
    assert said.count("no checkpoint in") == 1 and "and a torn last line" in said
    assert "loading the last complete checkpoint" in said and "ckpt.tmp" in said
    assert "dropped 2 row(s) logged after the checkpoint" in said


@pytest.mark.heavy(110)
def test_talentrl_killed_at_five_points_resumes_bit_identical(tiny_model_dir, tmp_path):
    """talentrl.phase2_rl (Alg. 1 l.14-23: policy, optimizer and SkillBank in the checkpoint) with scripted rollouts
    and the SkillBank evolving (crash_check.py: one new skill at step 1, which the task of step 2 needs). Each
    resume starts at the step the kills leave (_kill_at_each: a fresh start twice, then steps 1, 3, 4) with
    the bank of that step's checkpoint; the second kill falls after step 1's evolution and bank save, before
    its checkpoint commits (the rerun step must add the skill once, not twice)."""
    from tasks.search_world import load_skillbank
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(["talentrl", tiny_model_dir, str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_rows(ref)) == 5
    w0 = plumbing.load_model(tiny_model_dir, plumbing.Dist())[0].state_dict()
    assert any(not torch.equal(w0[k], v) for k, v in _weights(ref).items()), "the weights never moved"
    size = {int(p.stem[4:]): len(load_skillbank(p)[0]) for p in (ref / "skillbanks").glob("step*.json")}
    assert [r["n_new_skills"] for r in _rows(ref)] == [0, 1, 0, 0, 0] and size == {0: 26, 1: 27, 2: 27, 3: 27, 4: 27}
    assert plumbing.checkpoint_extra(ref)["bank"][-1]["title"] == "Scripted skill for bridge"
    kills = ["metrics:after_row:step0", "ckpt:torn_state:step1", "metrics:torn:step2",
             "ckpt:between_renames:step3", "ckpt:after_tmp_rename:step4"]
    resumes = [None, None, 1, 3, 4]
    outs = _kill_at_each(["talentrl", tiny_model_dir, str(run)], kills, resumes, run)
    for n, o in zip(resumes, outs[1:]):  # the bank each resume restored: its checkpoint's, not the initial one
        said = re.findall(r"^talentrl: SkillBank restored: (\d+) skills$", o.stderr, re.M)
        assert said == ([] if n is None else [str(size[n])]), (n, said, o.stderr[-1500:])
    _assert_same_run(ref, run)  # the metrics rows (step 2's reward needs the restored skill) and the bank
    banks = [{p.name: p.read_text() for p in (d / "skillbanks").iterdir()} for d in (ref, run)]
    assert banks[0] == banks[1], "the SkillBank saved at some step differs from the uninterrupted run's"


@pytest.mark.heavy(56)
def test_skill_entropy_killed_at_five_points_resumes_bit_identical(tiny_model_dir, tmp_path):
    """skill_entropy's SFT warm-up and a GRPO row (run_sft, run_grpo: checkpoint_state decides what is reused),
    rollouts from the HF sampler on the tiny model. The kills: after SFT's second step (SFT reruns), after it
    committed and inside GRPO's first checkpoint (GRPO starts afresh from the SFT weights), a torn GRPO row,
    between the renames of a commit, and after the final ("done") commit (the run only loads it)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    out = _run(["skill_entropy", tiny_model_dir, str(ref)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(_rows(ref / "sft")) == 2 and len(_rows(ref / "grpo")) == 5
    assert any(not torch.equal(_weights(ref / "sft")[k], v) for k, v in _weights(ref / "grpo").items()), \
        "GRPO never moved the weights"
    kills = ["sft:step1", "ckpt:after_model:step1", "metrics:torn:step2", "ckpt:between_renames:step3",
             "ckpt:after_tmp_rename:step4"]
    outs = _kill_at_each(["skill_entropy", tiny_model_dir, str(run)], kills, [None, None, 1, 3, 4],
                         run / "grpo", resume=None)  # its stages reuse what is done
    said = "".join(o.stderr for o in outs)
    # the run after the SFT kill trains SFT from its first step; every later one loads its finished checkpoint
    sft_rows = [re.findall(r"^step +(\d+) \| sft_loss", o.stdout, re.M) for o in outs]
    assert sft_rows[0] == sft_rows[1] == ["0", "1"] and not any(sft_rows[2:]), sft_rows
    assert all(f"resumed from {run / 'sft'}/ckpt at step 2, its last" in o.stderr for o in outs[2:])
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
    outs = _kill_at_each(argv + ["--run-dir", str(run)], kills, [None, 0, 1, 1, 2], run, log="solver")
    said = "".join(o.stderr for o in outs)
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
    # provenance records each run's own command line
    ra, rb = ({**json.loads((d / "results.json").read_text()), "provenance": None} for d in (ref, run))
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


@pytest.mark.parametrize("second", ["ckpt:begin", "ckpt:torn_weights", "ckpt:before_complete"])
def test_a_second_kill_resumes_from_the_checkpoint_the_first_left(tiny_model_dir, tmp_path, monkeypatch,
                                                                  second):
    """Killed before the rename of step 1's commit, the run resumes from ckpt.tmp/ (step 1); killed again
    while saving step 2, it resumes from step 1 once more. Before the fix the second save deleted ckpt.tmp/
    before its own was complete, and the run fell back to step 0 (ckpt/)."""
    model, tok, opt, dist = _tiny(tiny_model_dir)
    plumbing.save_checkpoint(tmp_path, model, tok, opt, 0, {"at": 0}, dist)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    w1 = {k: v.clone() for k, v in model.state_dict().items()}

    def save_killed_at(point, step):
        def die(name, step=None):
            if name == point:
                raise Killed(name)
        with monkeypatch.context() as m:
            m.setattr(plumbing, "kill_point", die)
            m.setenv("NANOSKILL_KILL_AT", f"{point}:step{step}")  # torn_point cuts its file, calls kill_point
            with pytest.raises(Killed):
                plumbing.save_checkpoint(tmp_path, model, tok, opt, step, {"at": step}, dist)
    save_killed_at("ckpt:before_rename", 1)
    fresh, _, opt2, _ = _tiny(tiny_model_dir)
    assert plumbing.resume_checkpoint(tmp_path, fresh, opt2, dist)[0] == 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    save_killed_at(second, 2)
    fresh, _, opt2, _ = _tiny(tiny_model_dir)
    assert plumbing.resume_checkpoint(tmp_path, fresh, opt2, dist) == (1, {"at": 1})
    assert all(torch.equal(fresh.state_dict()[k], w1[k]) for k in w1)


def test_resume_without_a_ranks_rng_file_warns(tiny_model_dir, tmp_path, capsys):
    """A checkpoint whose RNG files are not one per rank of this run (another world size, a lost file)
    resumes with one warning line: the ranks without a file keep their --seed state, so the run does not
    repeat an uninterrupted one draw for draw."""
    model, tok, opt, dist = _tiny(tiny_model_dir)
    plumbing.save_checkpoint(tmp_path, model, tok, opt, 0, {}, dist)
    ck = tmp_path / "ckpt"
    (ck / "rng_1.pt").write_bytes((ck / "rng_0.pt").read_bytes())  # saved by two ranks, resumed by one
    capsys.readouterr()
    for held in (2, 1):
        assert plumbing.resume_checkpoint(tmp_path, model, opt, dist)[0] == 0
        warned = [line for line in capsys.readouterr().err.splitlines() if "RNG state" in line]
        assert len(warned) == 1 and f"the RNG state of {held} rank(s) and this run has 1" in warned[0], warned
        (ck / "rng_0.pt").unlink(missing_ok=True)  # then rank 0's file lost


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


def test_skill_rm_resume_with_another_setting_stops_naming_the_flags(tmp_path):
    """skill_rm resumes by stage (<run-dir>/stages/<name>.json, skill_rm.Stages): a finished stage made with
    other settings stops the run in one line naming each changed flag, before any model loads."""
    import skill_rm
    argv = ["--preset", "tiny", "--model", str(tmp_path / "no-model"), "--run-dir", str(tmp_path),
            "--seed", "3"]
    (tmp_path / "stages").mkdir()
    settings = json.loads(json.dumps(plumbing.run_settings(_parse("skill_rm", argv)), default=str))
    (tmp_path / "stages" / "benchmark.json").write_text(json.dumps({"settings": settings, "result": {}}))
    with pytest.raises(SystemExit) as e:
        skill_rm.main(argv + ["--resume", "--lr", "0.25", "--seed", "4", "--steps", "99"])
    msg = str(e.value)
    assert msg.startswith("nanoskill: --resume with other settings") and "\n" not in msg, msg
    assert "--seed 3 → 4" in msg and re.search(r"--lr [\d.e-]+ → 0\.25", msg) and "--steps" not in msg, msg


def test_a_run_folder_resumes_in_another_clone(tmp_path):
    """Flag defaults that are paths inside the checkout (skill_rm's --bench, --heldout, --skills-dir) are recorded
    relative to it (plumbing.in_checkout): a run folder copied from another clone, or a checkpoint that recorded
    this clone's absolute path, resumes here; a path that differs (another data file) still stops it."""
    argv = ["--preset", "tiny", "--model", str(tmp_path / "no-model"), "--run-dir", str(tmp_path)]
    args = _parse("skill_rm", argv)
    assert os.path.isabs(args.bench) and plumbing.run_settings(args)["bench"] == os.path.join("data", "skill_rm",
                                                                                              "bench.jsonl")
    stages = tmp_path / "stages"
    stages.mkdir()
    for recorded in ({**vars(args), "bench": "/another/clone/data/skill_rm/bench.jsonl"},  # refused below
                     plumbing.run_settings(args),                                   # another clone's folder
                     {k: v for k, v in vars(args).items() if k not in plumbing.RESUME_SAFE}):  # absolute here
        settings = json.loads(json.dumps(recorded, default=str))
        (stages / "benchmark.json").write_text(json.dumps({"settings": settings, "result": {}}))
        if recorded.get("bench", "").startswith("/another"):
            with pytest.raises(SystemExit, match="--bench '/another/clone/data/skill_rm/bench.jsonl' → "):
                plumbing.Stages(_parse("skill_rm", argv + ["--resume"]), plumbing.Dist())
        else:
            plumbing.Stages(_parse("skill_rm", argv + ["--resume"]), plumbing.Dist())


# each script that resumes: a checkpoint folder of its run (one of several when staged), its longer-run flag
RESUMING = {"grpo": ("", "--steps"), "talentrl": ("talentrl-sft", "--steps"),
            "skill_entropy": ("sft", "--steps"), "skill_selfplay": ("", "--T")}


def _parse(script, argv):
    mod = importlib.import_module(script)
    if script == "skill_selfplay":
        return mod.parse_args(argv)
    return plumbing.parse_with_preset(mod.build_parser(), mod.PRESETS, argv=argv)


def _checkpoint_with_settings(folder, args):
    """A checkpoint folder with only what check_resume reads (extra.pt, COMPLETE), made with `args`."""
    (folder / "ckpt").mkdir(parents=True)
    torch.save({"done": False, "settings": plumbing.run_settings(args)}, folder / "ckpt" / "extra.pt")
    (folder / "ckpt" / "COMPLETE").write_text("1")


@pytest.mark.parametrize("script", sorted(RESUMING))
def test_resume_with_another_setting_stops_naming_the_flags(script, tmp_path):
    """Every script that resumes checks the flags against those its checkpoints recorded
    (plumbing.check_resume), first thing: one line naming each changed flag, saved → now, before any model
    loads (--model names no model: a script that skipped the check fails otherwise). A longer run (--steps,
    --T) is no change."""
    sub, longer = RESUMING[script]
    argv = ["--preset", "tiny", "--model", str(tmp_path / "no-model"), "--run-dir", str(tmp_path),
            "--seed", "3"]
    _checkpoint_with_settings(tmp_path / sub, _parse(script, argv))
    with pytest.raises(SystemExit) as e:
        importlib.import_module(script).main(argv + ["--resume", "--lr", "0.25", "--seed", "4", longer, "99"])
    msg = str(e.value)
    assert msg.startswith("nanoskill: --resume with other settings") and "\n" not in msg, msg
    assert "--seed 3 → 4" in msg and re.search(r"--lr [\d.e-]+ → 0\.25", msg) and longer not in msg, msg


def test_check_resume_lets_the_safe_flags_change_and_says_what_it_cannot_check(tmp_path, capsys):
    """RESUME_SAFE's flags (a longer run, its checkpoint interval, memory) may change; a flag only one side
    knows (added or removed by a code change) is not compared; a checkpoint from before settings were
    recorded is said in one line; without --resume nothing is checked (a fresh run)."""
    argv = ["--run-dir", str(tmp_path), "--steps", "4"]
    _checkpoint_with_settings(tmp_path, _parse("grpo", argv))
    extra = torch.load(tmp_path / "ckpt" / "extra.pt", weights_only=False)
    extra["settings"]["a_flag_since_removed"] = 1
    torch.save(extra, tmp_path / "ckpt" / "extra.pt")
    plumbing.check_resume(_parse("grpo", argv + ["--resume", "--steps", "8", "--save-every", "3",
                                                  "--micro-batch", "2", "--grad-checkpointing"]))
    plumbing.check_resume(_parse("grpo", argv + ["--lr", "0.5"]))  # no --resume
    with pytest.raises(SystemExit, match=r"--beta 0\.04 → 0\.0 "):
        plumbing.check_resume(_parse("grpo", argv + ["--resume", "--beta", "0"]))
    _checkpoint_with_settings(tmp_path / "old", _parse("grpo", argv))
    torch.save({"done": False}, tmp_path / "old" / "ckpt" / "extra.pt")
    capsys.readouterr()
    plumbing.check_resume(_parse("grpo", argv + ["--resume"]))
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and said.endswith("cannot check that the flags are the same"), said
    assert str(tmp_path / "old" / "ckpt") in said, said


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
    """Every process a test starts goes through conftest.run_group (its own process group, killed whole on a
    timeout) with timeout=; torchrun runs --standalone (the rendezvous binds a port the OS picks), and a master
    port, MASTER_PORT or --master_port, is never set to anything but 0, the OS's pick (several fixed ones were
    reused back to back)."""
    import ast
    import glob
    bad = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        name, src = os.path.basename(path), open(path).read()
        for node in ast.walk(ast.parse(src)):
            func = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
            if func.startswith("subprocess.") and name != "conftest.py":  # conftest.run_group itself
                bad.append(f"{name}:{node.lineno} calls {func}, not conftest.run_group")
            if func in ("run_group", "subprocess.run") and not any(k.arg == "timeout" for k in node.keywords):
                bad.append(f"{name}:{node.lineno} has no timeout")
        for m in re.finditer(r"master_port\W*(\w*)", src, re.IGNORECASE):
            if m[1] != "0" and name != "test_crash.py":  # this test names it, to refuse it
                bad.append(f"{name} sets a master port to {m[1]!r}, not 0")
        if "torch.distributed.run" in src and "--standalone" not in src:
            bad.append(f"{name} runs torchrun without --standalone")
    assert not bad, bad


def _alive(pid, wait_s=5.0):
    """pid is still a live process after up to wait_s (SIGKILL takes effect asynchronously); a zombie, killed and
    not yet reaped by its new parent, is not."""
    import time
    deadline = time.time() + wait_s
    while True:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state in "ZX" or time.time() > deadline:
            return state not in "ZX"
        time.sleep(0.05)


# a launcher and the child it started (torchrun and a rank), both pids written to {pids}, then a wait for ever
LAUNCHER = "sleep 600 & echo $! $$ > {pids}; wait"


def test_run_group_kills_the_launcher_and_its_children_on_timeout(tmp_path):
    """subprocess.run on a timeout kills the launcher alone (the child lives on, an orphan); run_group kills the
    child too: its whole process group."""
    import subprocess
    pids = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        run_group(["sh", "-c", LAUNCHER.format(pids=pids)], timeout=2, capture_output=True)
    child, launcher = map(int, pids.read_text().split())
    assert not _alive(launcher) and not _alive(child)


HANGS = """
import time
import pytest
from conftest import run_group

@pytest.mark.heavy(1)
def test_heavy_hangs():
    time.sleep(600)

def test_hangs_in_a_subprocess():
    run_group(["sh", "-c", {launcher!r}], timeout=600)
"""


def test_a_hung_test_fails_by_its_time_limit_and_its_process_group_dies(tmp_path):
    """pytest-timeout as conftest sets it up, under xdist as in make test: with --timeout 2 (the floor), an unmarked
    test fails after 2 s and a @pytest.mark.heavy(1) one after max(2, HEAVY_TIMEOUT_FACTOR × 1) s, neither hangs;
    and the subprocess the first waited on is killed with the child it started (run_group, on pytest-timeout's
    interrupt)."""
    from conftest import HEAVY_TIMEOUT_FACTOR
    pids = tmp_path / "pids"
    (tmp_path / "test_hangs.py").write_text(HANGS.format(launcher=LAUNCHER.format(pids=pids)))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # make test's -n 2: not for this run
    env["PYTHONPATH"] = os.path.join(ROOT, "tests")  # -p conftest: this folder's conftest, as a plugin
    env["COLUMNS"] = "200"  # the summary lines whole
    out = run_group([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-n", "1",
                     "--timeout", "2", "-rf", "--rootdir", str(tmp_path), str(tmp_path / "test_hangs.py")],
                    cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    said = dict(ln[len("FAILED test_hangs.py::"):].split(" - ", 1) for ln in out.stdout.splitlines()
                if ln.startswith("FAILED test_hangs.py::"))
    assert said == {"test_hangs_in_a_subprocess": "Failed: Timeout (>2.0s) from pytest-timeout.",
                    "test_heavy_hangs": f"Failed: Timeout (>{max(2.0, HEAVY_TIMEOUT_FACTOR * 1.0)}s) from pytest-timeout."}, \
        out.stdout[-3000:] + out.stderr[-2000:]
    child, launcher = map(int, pids.read_text().split())
    assert not _alive(launcher) and not _alive(child)


GROUPED = """
import os
import time
import pytest
from conftest import MEMORY_GROUP

def _log(name):
    with open(os.path.join(os.path.dirname(__file__), "ran.txt"), "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {name}\\n")
    time.sleep(0.6)

@pytest.mark.parametrize("w", [pytest.param("a", marks=[pytest.mark.heavy(9), pytest.mark.xdist_group(MEMORY_GROUP)]),
                               pytest.param("b", marks=pytest.mark.heavy(5))])
def test_param(w):
    _log(w)

@pytest.mark.heavy(8)
@pytest.mark.xdist_group(MEMORY_GROUP)
def test_c():
    _log("c")

@pytest.mark.heavy(7)
@pytest.mark.xdist_group(MEMORY_GROUP)
def test_d():
    _log("d")

@pytest.mark.parametrize("i", range(6))
def test_light(i):
    _log(f"light{i}")
"""


def test_make_test_never_runs_two_tests_of_the_memory_group_at_once(tmp_path):
    """conftest.MEMORY_GROUP under make test's xdist options (-n 2 --dist loadgroup): its tests run on one worker,
    one after another, while the other worker takes the rest. (pytest 9 stores a node id where xdist 3.8's
    loadgroup cannot set it: there every test was its own unit and two 11 GiB runs met; requirements.txt pins
    pytest < 9 for it.)"""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.path.join(ROOT, "tests")  # -p conftest: this folder's conftest, as a plugin
    out = run_group([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "-n", "2",
                     "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_grouped.py")],
                    cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    ran = [ln.split() for ln in (tmp_path / "ran.txt").read_text().splitlines()]
    group = [w for w, name in ran if name in ("a", "c", "d")]
    assert len(group) == 3 and len(set(group)) == 1, ran  # one worker, so never two at once
    assert len({w for w, _ in ran}) == 2, ran  # and the other worker ran the rest


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
