"""Run by tests/test_crash.py as a plain process, killed (SIGKILL) at a named point by NANOSKILL_KILL_AT and
resumed with --resume:
    grpo ARGS...                    grpo.main(ARGS), with a dense reward so the random tiny model's weights move
    talentrl MODEL RUN_DIR ARGS...  talentrl.phase2_rl (TalentRL's GRPO loop) on a small World, scripted rollouts
    skill_entropy MODEL RUN_DIR     skill_entropy.run_sft then run_grpo (§4.2's SFT warm-up, GRPO from it: the parts
                                    with checkpoints) on 4 two-step tasks, rollouts from the HF sampler
    skill_selfplay ARGS...          skill_selfplay.main(ARGS), the proposer scripted (selfplay_ddp_check.py)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import tasks.toy  # noqa: E402

mode, rest = sys.argv[1], sys.argv[2:]
if mode == "grpo":
    tasks.toy.toy_reward = lambda text, answer: (len(text) % 5) / 4  # the arithmetic reward is all zero for a random model
    grpo.main(rest)
elif mode == "talentrl":
    # Alg. 1 l.14-23 (phase2_rl, the part with checkpoints) on the tiny model, with talentrl_ddp_check's scripted
    # policy as the sampler: deterministic rollouts whose rewards differ, so every step moves the weights; the
    # SkillBank evolves every 2 steps on the 4 tasks, and the first is answered only once its evolved skill
    # is retrieved: it fails validation at step 1 (its type, bridge, at 50 %), whose new skill makes it pass
    from pathlib import Path

    import plumbing
    import talentrl as T
    from talentrl_ddp_check import ScriptedPolicy
    model_dir, run_dir, *flags = rest
    args = T.parse_with_preset(T.build_parser(), T.PRESETS, argv=[
        "--preset", "tiny", "--model", model_dir, "--G", "3", "--no-autocast", "--micro-batch", "4", "--beta", "0.1",
        "--lr", "1e-3", "--n-people", "12", "--n-places", "6", "--n-orgs", "4", "--n-events", "4", "--n-hamlets", "4",
        "--n-shared", "2", "--n-train", "8", "--eval-n", "1", "--steps", "5", "--save-every", "2",
        "--prompts-per-step", "2", "--evolve-every", "2", "--val-tasks", "4", "--evolve-threshold", "0.6", *flags])
    dist = plumbing.setup_distributed()
    grpo.seed_everything(args.seed)
    W = T.World(args, T.load_embedder())
    model, tok = plumbing.load_policy(args, dist)
    tasks = W.questions["hotpotqa"]["train"][:4]
    sampler = ScriptedPolicy(tok, {t["question"]: t["answer"] for t in tasks}, hard=[tasks[0]["question"]])
    sampler.sync = lambda m: None
    T.phase2_rl(True, T.Policy(model, sampler, tok), W, tasks, Path(run_dir), args, dist)
elif mode == "skill_entropy":
    from pathlib import Path

    import plumbing
    import skill_entropy as se
    import tasks.skill_bank as sb
    model_dir, run_dir = rest
    args = se.parse_with_preset(se.build_parser(), se.PRESETS, argv=[
        "--preset", "tiny", "--model", model_dir, "--sampler", "hf", "--precision", "fp32", "--sft-epochs", "2",
        "--sft-lr", "1e-3", "--steps", "5", "--save-every", "2", "--prompts-per-step", "2", "--G", "3",
        "--max-new-tokens", "6", "--micro-batch", "3", "--beta", "0.1", "--lr", "1e-3", "--resume"])
    dist = plumbing.setup_distributed()
    grpo.seed_everything(args.seed)
    bank = sb.load_bank(sb.DATA / "bank.json", 1, "math,logic")
    a, b = sb.bank_keys(bank)[:2]
    tasks = []
    for i in range(4):
        seeds = [sb.make_seed(bank, *a, i), sb.make_seed(bank, *b, i)]
        tasks.append(sb.make_task(seeds, f"Scenario {i}.", [x["question"] for x in seeds]) | {"skills": [list(a), list(b)]})
    run, doms = Path(run_dir), list(bank)
    # the teacher replies nothing, so SFT trains on the gold traces (--sft-gold-fallback, its default)
    se.run_sft(args, dist, tasks[:2], lambda prompts, n: [""] * len(prompts), None, doms, run / "sft", {"sft": 1})
    # Eq. (5)'s parts are 0 for a random model's text: a dense reward instead, so every step moves the weights
    reward = lambda texts, batch: [dict(reward=(len(t) % 5) / 4, r_ans=0.0, r_ent=0.0, format_ok=0.0, matched=0.0)
                                   for t in texts]
    se.run_grpo(args, dist, se.Row(tasks, run / "sft", run / "grpo", {"row": "grpo"}, 1, 1.0), reward, doms, {})
elif mode == "skill_selfplay":
    # a random model writes no puzzle: the proposer's sampler is scripted, so proposals pass the gate, D(t) is not
    # empty and both players' GRPO steps move their weights; the solver samples (probes, rollouts) on HF generate
    import skill_selfplay as S
    from selfplay_ddp_check import script_players
    script_players(rest, roles=("proposer",))
    S.main(rest)
else:
    raise SystemExit(f"crash_check.py: unknown mode {mode}")
