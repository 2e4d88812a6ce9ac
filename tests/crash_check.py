"""Run by tests/test_crash.py as a plain process, killed (SIGKILL) at a named point by NANOSKILL_KILL_AT and
resumed with --resume:
    grpo ARGS...                    grpo.main(ARGS), with a dense reward so the random tiny model's weights move
    talentrl MODEL RUN_DIR ARGS...  talentrl.phase2_rl (TalentRL's GRPO loop) on a small World, scripted rollouts"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402

mode, rest = sys.argv[1], sys.argv[2:]
if mode == "grpo":
    grpo.toy_reward = lambda text, answer: (len(text) % 5) / 4  # the arithmetic reward is all zero for a random model
    grpo.main(rest)
elif mode == "talentrl":
    # Alg. 1 l.14-23 (phase2_rl, the part with checkpoints) on the tiny model, with talentrl_ddp_check's scripted
    # policy as the sampler: deterministic rollouts whose rewards differ, so every step moves the weights
    from pathlib import Path

    import plumbing
    import talentrl as T
    from talentrl_ddp_check import ScriptedPolicy
    model_dir, run_dir, *flags = rest
    args = T.parse_with_preset(T.build_parser(), T.PRESETS, argv=[
        "--preset", "tiny", "--model", model_dir, "--G", "3", "--no-autocast", "--micro-batch", "4", "--beta", "0.1",
        "--lr", "1e-3", "--n-people", "12", "--n-places", "6", "--n-orgs", "4", "--n-events", "4", "--n-hamlets", "4",
        "--n-shared", "2", "--n-train", "8", "--n-test", "1", "--rl-steps", "5", "--save-every", "2",
        "--tasks-per-step", "2", "--evolve-every", "0", "--val-tasks", "0", *flags])
    dist = grpo.setup_distributed()
    grpo.seed_everything(args.seed)
    W = T.World(args, T.load_embedder())
    model, tok = plumbing.load_policy(args, dist)
    tasks = W.questions["hotpotqa"]["train"][:4]
    sampler = ScriptedPolicy(tok, {t["question"]: t["answer"] for t in tasks})
    sampler.sync = lambda m: None
    T.phase2_rl(True, model, sampler, tok, W, tasks, Path(run_dir), args, dist)
else:
    raise SystemExit(f"crash_check.py: unknown mode {mode}")
