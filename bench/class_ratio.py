"""How much faster the other CPU class runs the same tiny runs (#48: "on a CPU without native bf16, state an
estimate, and label it as one"): wall seconds here at one fixed commit, beside that commit's wall seconds
recorded on the other class. Their ratio turns this class's times into a labelled estimate for the other.

    .venv/bin/python bench/class_ratio.py [--commit 80ee833] [--runs grpo,skill_entropy] [--out results/bench]

The two sides cannot run in one process: the other side is a recorded figure (--recorded, with its source).
The commit is exported with `git archive` into a temporary folder, and each run is `python <run>.py --preset
tiny` there, timed from start to exit as `make demo` timed the recorded side. Run it alone on the machine."""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import stats  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--commit", default="80ee833", help="the commit both sides ran")
p.add_argument("--runs", default="grpo,skill_entropy", help="scripts run with --preset tiny (seed 0)")
# the recorded side: this script on a 2-core avx512_bf16 machine, 12-08 (the 12-04 figures it replaced, 168 and
# 400 s from a make demo, were 2.2-2.8x these at the same commit)
p.add_argument("--recorded", default="grpo=60,skill_entropy=178", help="the other class's wall s per run")
p.add_argument("--recorded-class", default="avx512_bf16", help="the other class, as provenance names it")
p.add_argument("--recorded-source", help="where the recorded figures come from",
               default="bench/class_ratio.py on a 2-core AMD EPYC with avx512_bf16, 2026-12-08 "
                       "(results/bench/class_ratio-avx512_bf16.json)")
p.add_argument("--repo", default=str(ROOT), help="the git repository that holds --commit")
p.add_argument("--out", help="also write OUT/class_ratio-<CPU class>.json (results/bench)")
args = p.parse_args()
recorded = {k: float(v) for k, v in (x.split("=") for x in args.recorded.split(","))}
missing = [r for r in args.runs.split(",") if r not in recorded]
if missing:  # before any run, not after minutes of one
    sys.exit(f"class_ratio: no --recorded time for {', '.join(missing)}")
cls = (stats.provenance().get("device") or {}).get("class")
if cls == args.recorded_class:  # a class's ratio to itself would label a measurement as an estimate
    print(f"class_ratio: this machine is {cls}, the recorded class: nothing to estimate (pass --recorded, "
          f"--recorded-class and --recorded-source with figures from a machine of another class)")
    sys.exit(0)
rows = []
with tempfile.TemporaryDirectory(prefix="class_ratio-") as tmp:
    archive = subprocess.run(["git", "archive", args.commit], cwd=args.repo, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    for run in args.runs.split(","):
        t0 = time.time()
        cmd = [sys.executable, f"{run}.py", "--preset", "tiny", "--run-dir", f"{tmp}/runs/{run}"]
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        here = time.time() - t0
        if out.returncode:
            sys.exit(f"class_ratio: {run}.py at {args.commit} exited {out.returncode}:\n{out.stderr[-3000:]}")
        rows.append([run, round(here, 1), recorded[run], round(here / recorded[run], 2)])
        print(f"{run}: {here:.0f} s here, {recorded[run]:.0f} s on {args.recorded_class}: "
              f"ratio {here / recorded[run]:.2f}")
if args.out:  # stats.run_table divides a run's wall seconds by these ratios (its estimate line)
    note = (f"Commit {args.commit} on both classes; the {args.recorded_class} column is recorded: "
            f"{args.recorded_source}. ratio = {cls} s ÷ {args.recorded_class} s; each TABLE.md divides "
            f"its wall seconds by it for a labelled estimate on {args.recorded_class}.")
    columns = ["run (--preset tiny)", f"{cls} s", f"{args.recorded_class} s", "ratio"]
    print("wrote", stats.write_bench(args.out, "class_ratio", columns, rows, note,
                                     extra={"other_class": args.recorded_class, "commit": args.commit}))
