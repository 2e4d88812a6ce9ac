"""The multi-rank tests, repeated (issue #29): N consecutive pytest runs of every test marked `multirank` (each
starts torchrun ranks over gloo; tests/test_crash.py keeps the marker on all of them), with a busy loop pinned to
the last CPU, the load under which the gloo teardown abort was seen. Counts, per test, the runs that passed and
those that failed, and every output that shows the abort ("terminate called without an active exception").
Not run in CI: one round is ~5 min unloaded on 2 cores.

    python bench/multirank_repeat.py --n 20                 # the issue's check: 20 runs of each, other core busy
    python bench/multirank_repeat.py --n 2 -k "ddp and not fsdp" --no-busy

Each round is one pytest process over all the marked tests (so each test runs once per round, rounds back to
back); the output of a round with a failure is kept in --out-dir. Exit status 1 if any run failed."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
# a hung round is killed with its process group (pytest, its xdist workers); each torchrun a test starts has its
# own group, which that test's time limit (tests/conftest.py) kills first
from conftest import run_group  # noqa: E402

ABORT = "terminate called without an active exception"

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--n", type=int, default=20, help="consecutive rounds (issue #29: 20)")
p.add_argument("-k", default="", help="pytest -k filter on the marked tests (default: all of them)")
p.add_argument("--busy", action=argparse.BooleanOptionalAction, default=True,
               help="a Python busy loop pinned to the last CPU for the whole run (default: on)")
p.add_argument("--out-dir", default="/tmp/multirank_repeat", help="junit files, failing rounds' output, summary.json")
p.add_argument("--timeout", type=int, default=3600, help="seconds per round before it counts as hung")
args = p.parse_args()
os.makedirs(args.out_dir, exist_ok=True)

busy = None
if args.busy:
    cpu = max(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    print(f"busy loop: pid {busy.pid} pinned to CPU {cpu} of {len(os.sched_getaffinity(0))}")

runs = {}      # test id -> list of (outcome, seconds)
aborts = []    # (round, test id or "round") whose output shows the abort
try:
    for r in range(args.n):
        xml = os.path.join(args.out_dir, f"round_{r}.xml")
        if os.path.exists(xml):  # an earlier invocation's file: never read as this round's when pytest writes none
            os.remove(xml)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "multirank", f"--junitxml={xml}",
               "-o", "junit_logging=all", "tests"] + (["-k", args.k] if args.k else [])
        t0 = time.time()
        try:
            out = run_group(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
            text, hung = out.stdout + out.stderr, False
        except subprocess.TimeoutExpired as e:
            text, hung = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"), True
        wall = time.time() - t0
        cases = ET.parse(xml).getroot().iter("testcase") if os.path.exists(xml) and not hung else []
        failed, n_pass = [], 0
        for c in cases:
            tid = f"{c.get('classname')}::{c.get('name')}"
            outcome = ("failed" if c.find("failure") is not None or c.find("error") is not None
                       else "skipped" if c.find("skipped") is not None else "passed")
            runs.setdefault(tid, []).append((outcome, float(c.get("time", 0))))
            failed += [tid] if outcome == "failed" else []
            n_pass += outcome == "passed"
            if ABORT in ET.tostring(c, encoding="unicode"):
                aborts.append((r, tid))
        if ABORT in text and not any(a[0] == r for a in aborts):
            aborts.append((r, "round"))
        if hung or failed or ABORT in text:
            open(os.path.join(args.out_dir, f"round_{r}.log"), "w").write(text)
        print(f"round {r + 1}/{args.n}: {wall:.0f} s, {n_pass} passed, {len(failed)} failed"
              + (" HUNG" if hung else "") + (f": {failed}" if failed else ""), flush=True)
        if hung:
            runs.setdefault("<round hung>", []).append(("failed", wall))
finally:
    if busy is not None:
        busy.kill()

print(f"\n{'test':<100} {'pass':>5} {'fail':>5} {'skip':>5} {'median s':>9} {'max s':>7}")
summary = {}
for tid, v in sorted(runs.items()):
    counts = {o: sum(1 for x in v if x[0] == o) for o in ("passed", "failed", "skipped")}
    secs = [x[1] for x in v]
    summary[tid] = {**counts, "median_s": statistics.median(secs), "max_s": max(secs)}
    print(f"{tid:<100} {counts['passed']:>5} {counts['failed']:>5} {counts['skipped']:>5} "
          f"{statistics.median(secs):>9.1f} {max(secs):>7.1f}")
n_failed = sum(s["failed"] for s in summary.values())
print(f"\n{args.n} rounds, busy loop {'on' if args.busy else 'off'}: {n_failed} failed runs, "
      f"{len(aborts)} outputs with the abort {aborts if aborts else ''}")
json.dump({"n": args.n, "busy": args.busy, "k": args.k, "tests": summary, "aborts": aborts},
          open(os.path.join(args.out_dir, "summary.json"), "w"), indent=1)
sys.exit(1 if n_failed or aborts else 0)
