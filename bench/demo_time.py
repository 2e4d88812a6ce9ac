"""`make demo` from a fresh clone, install included (#48: ≤ 25 min on a 2-core CPU with native bf16): the wall
seconds of the whole command and of each tiny run in it (the `(N s)` of each REPORT.md header), side by side.

    .venv/bin/python bench/demo_time.py [--commit HEAD] [--out results/bench]

The commit is cloned into a temporary folder with no .venv, so `make demo` there installs everything before it
runs, as on a fresh machine: pip without its cache (PIP_NO_CACHE_DIR) and the embedded model converted again
(NANOSKILL_CACHE in the folder). The folder is deleted afterwards unless --keep.
"install and the rest" is the whole command's wall time less the runs' own. Run it alone on the machine."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import stats  # noqa: E402

TARGET_S = 25 * 60  # #48: make demo ≤ 25 min on the native-bf16 class, install included

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--commit", default="HEAD", help="the commit to clone and run")
p.add_argument("--out", help="also write OUT/demo_time-<CPU class>.json (results/bench)")
p.add_argument("--keep", action="store_true", help="keep the clone (its runs/demo/ and .venv)")
args = p.parse_args()

commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.commit], check=True,
                        capture_output=True, text=True).stdout.strip()
tmp = Path(tempfile.mkdtemp(prefix="demo_time_"))
clone = tmp / "nanoskill"
subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True)
subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
print(f"demo_time: make demo in a fresh clone of {commit} ({clone}); log: {tmp / 'demo.log'}", flush=True)
t0 = time.time()
with open(tmp / "demo.log", "w") as log:
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "NANOSKILL_CACHE": str(tmp / "cache")}
    rc = subprocess.run(["make", "demo"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
wall = time.time() - t0
report = clone / "runs/demo/REPORT.md"
# REPORT.md's header per run: "## <script>.py --preset tiny [--family F] (<seconds> s)"
runs = [(m[1] + (f" {m[2]}" if m[2] else ""), int(m[3])) for m in re.finditer(
    r"^## (\w+)\.py --preset tiny ?(--family \w+)? \((\d+) s\)$", report.read_text() if report.exists() else "",
    re.M)]
columns = [name for name, _ in runs] + ["install and the rest", "make demo", "target"]
row = [s for _, s in runs] + [round(wall - sum(s for _, s in runs)), round(wall), TARGET_S]
for name, s in zip(columns, row):
    print(f"{name:32s} {s:>6} s")
verdict = "FAILED (exit code %d)" % rc if rc else ("within" if wall <= TARGET_S else "OVER") + " the target"
print(f"make demo: {wall:.0f} s, {verdict}")
if args.out:  # one row, wall seconds
    stats.write_bench(args.out, "demo_time", [f"{c} s" for c in columns], [row],
                      note=f"`make demo` in a fresh clone of {commit}, its install included; {verdict}.",
                      extra={"make_demo_s": round(wall, 1), "returncode": rc, "commit_run": commit})
if not args.keep:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(rc)
