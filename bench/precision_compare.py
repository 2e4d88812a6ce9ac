"""fp32 and bf16 alike (issue #22): grpo.py --preset tiny at --precision fp32 and bf16 over seeds, then the
held-out greedy accuracy before → after as mean ± sd per precision and the paired difference (stats.py).

    .venv/bin/python bench/precision_compare.py [--seeds 0 1 2] [--precisions fp32 bf16] [-- extra grpo.py flags]

Each run is a fresh `grpo.py` process into runs/precision-<precision>-seed<seed>/ (an existing finished run is
reused); frozen models load in the same precision as the policy, so each row is one precision end to end."""
import argparse
import json
import os
import subprocess
import sys
import time


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import stats  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
p.add_argument("--runs", default=os.path.join(ROOT, "runs"), help="parent folder of the run folders")
p.add_argument("extra", nargs="*", help="flags passed on to grpo.py (after --)")
args = p.parse_args()

acc = {}
for prec in args.precisions:
    for seed in args.seeds:
        run = os.path.join(args.runs, f"precision-{prec}-seed{seed}")
        results = os.path.join(run, "results.json")  # acc_after is measured after the last checkpoint: read it here
        t0 = time.time()
        if not os.path.exists(results):
            cmd = [sys.executable, os.path.join(ROOT, "grpo.py"), "--preset", "tiny", "--precision", prec, "--seed", str(seed),
                   "--dtype", "bfloat16" if prec == "bf16" else "float32", "--run-dir", run, *args.extra]
            subprocess.run(cmd, cwd=ROOT, check=True)
        with open(results) as f:
            extra = json.load(f)
        acc[prec, seed] = (extra["acc_before"], extra["acc_after"])
        print(f"{prec} seed {seed}: held-out {extra['acc_before']:.3f} → {extra['acc_after']:.3f} ({time.time() - t0:.0f} s)", flush=True)

print(f"\ngrpo.py --preset tiny, held-out greedy accuracy (64 problems), seeds {args.seeds}")
for prec in args.precisions:
    before, after = stats.mean_sd([acc[prec, s][0] for s in args.seeds]), stats.mean_sd([acc[prec, s][1] for s in args.seeds])
    print(f"{prec}: before {before[0]:.3f} ± {before[1]:.3f}  after {after[0]:.3f} ± {after[1]:.3f}  (mean ± sd, n = {len(args.seeds)})")
if len(args.precisions) == 2 and len(args.seeds) > 1:
    a, b = ([acc[q, s][1] for s in args.seeds] for q in args.precisions)
    lo, hi = stats.paired_bootstrap_ci(a, b)
    print(f"{args.precisions[0]} − {args.precisions[1]} after, paired by seed: {sum(a) / len(a) - sum(b) / len(b):+.3f}, "
          f"95 % CI [{lo:+.3f}, {hi:+.3f}], sign-flip p = {stats.paired_permutation_p(a, b):.3f} (null: no difference)")
