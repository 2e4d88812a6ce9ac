"""Skill-RM: reward modelling as the execution of a Reward-Evaluation Skill.

Paper: "Skill-RM: Unifying Heterogeneous Evaluation Criteria via Agent Skill",
Chen et al., arXiv:2606.03980 (code: github.com/Qwen-Applications/Skill-RM; its
mechanics are summarised in papers/NOTES.md §2 and rebuilt here in our own code).

A judge model does not score a response in one shot: it runs an agentic loop over a
*skill folder* (SKILL.md + a resource index + rubrics, bias controls, aggregation
policy, output contract, verifiers). It sees only the skill's name and description
until it calls `use_skill` (progressive disclosure); then it may `view_resource`
(≤ 4, leakage-gated) and run `python_sandbox` code over the visible prompt and
candidates. A deterministic readout (§3) maps the final structured judgment to a
pointwise reward (K = 1), a pairwise preference (K = 2, both presentation orders)
or a selection among K ≥ 2.

What runs here, top to bottom:
  1. an offline benchmark with preferences known by construction (precise
     instruction following, math, code, focus/style bias), candidates from the
     embedded model where it can produce them (`--build-bench` rebuilds it);
  2. pairwise (both orders) and best-of-4 accuracy per category for the plain
     LLM-as-a-judge and Skill-RM with the same backbone, plus the ablations
     "resources appended to the prompt" and "Python tool only" (§5);
  3. best-of-N by JETTS sequential pairwise knockout: seqko@k, random@N, oracle@N;
  4. instruction-following GRPO (App. D) with the Skill-RM pointwise reward vs. a
     direct LLM-judge reward vs. anchored pairwise, all policies evaluated with
     deterministic constraint checkers the reward never sees.

Run:
  tiny (2-core CPU, ~5 min):   python skill_rm.py --preset tiny
  paper settings (needs GPUs): python skill_rm.py --preset paper --model Qwen/Qwen3.5-27B
  print one judge trace:       python skill_rm.py --preset tiny --show-trace 1 --skip-rl

Glossary: K number of candidates shown to the judge; N best-of-N pool size;
G rollouts per prompt (GRPO group); seqko@k incumbent's true score after k
candidates of the knockout; random@N / oracle@N mean / max true score of the pool.

Differences from the paper:
  1. Backbone: the embedded SmolLM2-135M-Instruct (paper: Qwen3.5-27B and others);
     at 135M the judge rarely emits valid tool calls, so the numbers show the
     machinery, not the paper's gains. Invalid rates are reported beside accuracy.
  2. Benchmarks: RewardBench2 / RM-Bench / JudgeBench / JETTS pools / IF-RewardBench
     are not available offline; we build a small benchmark with the same shapes
     (best-of-4 with one correct, pairwise in both orders) from reasoning-gym,
     HumanEval and templated verifiable instructions (data/skill_rm/).
  3. Tool-call format: one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
     per turn (Hermes style); the parser also accepts bare JSON and `[[A]]`-style
     verdicts, so a malformed reply becomes "no call" rather than a crash.
  4. Sandbox: besides the authors' `python -I -S`, empty env, timeout and static
     check, we add rlimits (CPU, address space, file size, open files) and a
     PEP 578 audit hook inside the child that blocks new imports, process
     creation, sockets and file access outside its folder (containment, not only
     refusal). RLIMIT_NPROC is set but is not enforced for root.
  5. Best-of-N pools come from the policy model (SmolLM2) on reasoning-gym
     arithmetic and our verifiable instructions, N = 8 in tiny (paper: JETTS
     pools of 10 from Qwen2.5-72B; N = 10).
  6. IF-RL: our verifiable-instruction prompts (paper: VerInstruct-derived
     prompts, Tulu-3-8B-SFT policy, Verl); eval with our checkers (paper: IFEval,
     IFBench, AdvancedIF). Policy and judge are the same 135M model; the judge is
     a frozen copy.
  7. The "sample-specific resources" variant of Table 8 is not built (no such
     resources exist for a synthetic benchmark).
"""
import argparse
import ast
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent

# ----- config -----

PRESETS = {
    # 2-core CPU, ~5 minutes, embedded SmolLM2-135M as judge and policy.
    "tiny": dict(bench_per_cat=2, bon_prompts=3, bon_N=4, rl_steps=2, rl_prompts=2,
                 rl_eval_prompts=6, G=4, judge_max_new_tokens=64, max_new_tokens=48,
                 max_turns=3, rl_max_turns=3),
    # the paper's judge settings: temperature 0, 5 turns (7 in RL), 4 rollouts/prompt.
    "paper": dict(bench_per_cat=0, bon_prompts=0, bon_N=8, rl_steps=200, rl_prompts=32,
                  rl_eval_prompts=0, G=4, judge_max_new_tokens=1024, max_new_tokens=1024,
                  max_turns=5, rl_max_turns=7),
}


def build_parser():
    from grpo import add_grpo_args
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_grpo_args(p)
    g = p.add_argument_group("skill-rm judge")
    g.add_argument("--skills-dir", default=str(ROOT / "data/skills"), help="folder of Reward-Evaluation Skills (Agent Skills convention)")
    g.add_argument("--judge-model", default=None, help="judge backbone (default: same as --model); paper Qwen3.5-27B")
    g.add_argument("--judge-temperature", type=float, default=0.0, help="judge sampling temperature; paper 0 (greedy)")
    g.add_argument("--judge-max-new-tokens", type=int, default=256, help="tokens per judge turn")
    g.add_argument("--max-turns", type=int, default=5, help="assistant-turn budget of the skill judge (NOTES §2: 5; plain judge: 1)")
    g.add_argument("--retries", type=int, default=1, help="retries after a reply with no valid tool call (NOTES §2: 1)")
    g.add_argument("--max-resources", type=int, default=4, help="view_resource calls per sample (NOTES §2: 4)")
    g.add_argument("--resource-chars", type=int, default=8000, help="characters returned per resource (NOTES §2: 8000)")
    g.add_argument("--sandbox-timeout", type=float, default=3.0, help="python_sandbox wall-clock limit, s (NOTES §2: 3)")
    g.add_argument("--sandbox-mem-mb", type=int, default=256, help="python_sandbox address-space limit, MiB")
    g.add_argument("--show-trace", type=int, default=0, help="print the full judge trace of this many samples")
    g = p.add_argument_group("benchmark")
    g.add_argument("--bench", default=str(ROOT / "data/skill_rm/bench.jsonl"), help="benchmark file (built by --build-bench)")
    g.add_argument("--build-bench", action="store_true", help="regenerate the benchmark with the policy model, then exit")
    g.add_argument("--build-per-cat", type=int, default=12, help="items per category when building the benchmark")
    g.add_argument("--bench-per-cat", type=int, default=0, help="items per category to evaluate (0 = all)")
    g.add_argument("--methods", default="baseline,appended,python_only,skill_rm", help="judges to compare (§5 ablations)")
    g.add_argument("--formats", default="pairwise,best_of_4", help="benchmark readouts to run")
    g = p.add_argument_group("best-of-N (JETTS)")
    g.add_argument("--bon-prompts", type=int, default=8, help="prompts with a fixed candidate pool")
    g.add_argument("--bon-N", type=int, default=8, help="pool size N; paper 10")
    g.add_argument("--bon-temperature", type=float, default=1.0, help="policy temperature for the pools")
    g.add_argument("--bon-seeds", type=int, default=1, help="seeded knockout orders averaged")
    g = p.add_argument_group("instruction-following RL (App. D)")
    g.add_argument("--rl-rewards", default="skill_rm,direct,anchored", help="reward variants to train and compare")
    g.add_argument("--rl-steps", type=int, default=20, help="GRPO steps per variant")
    g.add_argument("--rl-prompts", type=int, default=4, help="prompts per GRPO step")
    g.add_argument("--rl-eval-prompts", type=int, default=32, help="held-out instructions for checker evaluation")
    g.add_argument("--rl-max-turns", type=int, default=7, help="skill judge turn budget in RL (NOTES §2: 7)")
    g.add_argument("--skip-bench", action="store_true", help="skip the benchmark table")
    g.add_argument("--skip-bon", action="store_true", help="skip best-of-N")
    g.add_argument("--skip-rl", action="store_true", help="skip instruction-following RL")
    return p


# ----- sandbox (python_sandbox tool; self-contained so it can move to grpo.py) -----

SANDBOX_IMPORTS = ("collections", "decimal", "fractions", "functools", "itertools",
                   "json", "math", "re", "statistics", "string")
SANDBOX_BANNED_NAMES = {"eval", "exec", "open", "getattr", "setattr", "delattr", "compile",
                        "globals", "locals", "vars", "input", "breakpoint", "memoryview",
                        "exit", "quit", "help"}
# PEP 578 audit events refused inside the child once the user code starts.
_BLOCKED_EVENT_PREFIXES = ("os.", "subprocess.", "socket.", "ctypes.", "shutil.", "pty.",
                           "mmap.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.",
                           "telnetlib.", "webbrowser.", "import", "compile", "builtins.input",
                           "sys._getframe", "sys.setprofile", "sys.settrace", "cpython.")

_RUNNER = r'''
import sys, json
for _m in %(imports)r:
    try:
        __import__(_m)
    except Exception:
        pass
_ROOT = %(root)r
_BLOCKED = %(blocked)r
with open("inputs.json") as _f:
    _vars = json.load(_f)
with open("snippet.py") as _f:
    _code = compile(_f.read(), "<snippet>", "exec")
_state = [0]

def _inside(p):
    if isinstance(p, int):
        return True
    if isinstance(p, bytes):
        p = p.decode("utf-8", "replace")
    p = str(p)
    if "\x00" in p or ".." in p.split("/"):
        return False
    return not p.startswith("/") or p == _ROOT or p.startswith(_ROOT + "/")

def _hook(event, args):
    if event == "exec":
        _state[0] += 1
        if _state[0] > 1:
            raise PermissionError("sandbox: exec is not allowed")
    elif event == "open":
        if not _inside(args[0]):
            raise PermissionError("sandbox: file outside the working folder: %%s" %% (args[0],))
    elif event.startswith(_BLOCKED):
        raise PermissionError("sandbox: %%s is not allowed %%s" %% (event, str(args)[:80]))

sys.addaudithook(_hook)
_ns = dict(_vars)
_ns["__name__"] = "__sandbox__"
try:
    exec(_code, _ns)
except BaseException as _e:
    _tb = _e.__traceback__
    _line = None
    while _tb is not None:
        if _tb.tb_frame.f_code.co_filename == "<snippet>":
            _line = _tb.tb_lineno
        _tb = _tb.tb_next
    sys.stderr.write("%%s: %%s (snippet line %%s)\n" %% (type(_e).__name__, str(_e)[:300], _line))
    sys.stderr.flush()
    sys.exit(1)
'''


def sandbox_static_check(code, allowed_imports=SANDBOX_IMPORTS):
    """Return None if `code` passes the static check, else the reason it is refused.

    Refuses: syntax errors, imports whose top-level module is not in
    `allowed_imports`, relative imports, any dunder name or attribute (`__class__`,
    `__import__`, ...) and the names in SANDBOX_BANNED_NAMES (eval, exec, open, ...).
    """
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return f"syntax error: {e.msg} (line {e.lineno})"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return "relative imports are not allowed"
            mods = [node.module or ""]
        else:
            mods = []
        for m in mods:
            if m.split(".")[0] not in allowed_imports:
                return f"import of '{m}' is not allowed (allowed: {', '.join(allowed_imports)})"
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is not None and name.startswith("__") and name.endswith("__"):
            return f"dunder name '{name}' is not allowed"
        if name in SANDBOX_BANNED_NAMES:
            return f"name '{name}' is not allowed"
    return None


_LIBC = None


def _sandbox_limits(timeout_s, mem_mb, max_output_bytes):
    """preexec_fn of the child: rlimits, then (best effort) a private network namespace."""
    cpu = int(math.ceil(timeout_s)) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes, max_output_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (8, 8))  # not enforced for root; the audit hook is
    if _LIBC is not None:
        _LIBC.unshare(0x40000000)  # CLONE_NEWNET: no interfaces at all; fails quietly without CAP_SYS_ADMIN


def run_sandboxed(code: str, timeout_s: float = 3.0, mem_mb: int = 256, variables: dict | None = None,
                  allowed_imports=SANDBOX_IMPORTS, static_check: bool = True,
                  max_output_chars: int = 4000) -> dict:
    """Run untrusted Python `code` in a contained child process and report what happened.

    Layers (each one alone would stop the hostile snippets in tests/test_skill_rm.py):
      * static check (`sandbox_static_check`): import allow-list, no dunders, no
        eval/exec/open/getattr...; skipped with static_check=False (e.g. for unit
        tests of model-written code that uses `if __name__ == ...`);
      * a separate process `python -I -S -B` (isolated: no site-packages, no user
        paths, no env vars) with an EMPTY environment, in a fresh temporary folder
        (its cwd, deleted afterwards), in its own session (killed as a group);
      * rlimits: CPU seconds, address space `mem_mb`, output file size, open files;
      * an audit hook (PEP 578) installed before the user code: no new imports, no
        process creation (fork/exec/system/spawn), no sockets, no ctypes, no file
        access outside the folder, no os.* side effects, no nested exec/compile;
      * a wall-clock timeout `timeout_s`, then SIGKILL of the process group.
    `variables` (JSON-serialisable) become globals of the snippet (here: `prompt`,
    `candidates`, `sample`, `response`). `allowed_imports` are pre-imported before
    the hook, so they are the only importable modules.

    Returns {"ok": bool, "stdout": str, "stderr": str, "error": str | None,
             "returncode": int | None, "wall_s": float}. `error` is one line:
    "refused: ...", "timeout after X s", "memory limit", "cpu limit",
    "output limit", or the snippet's exception "Type: message (snippet line n)".
    Never raises for anything the snippet does.
    """
    global _LIBC
    t0 = time.time()
    res = {"ok": False, "stdout": "", "stderr": "", "error": None, "returncode": None, "wall_s": 0.0}
    if static_check:
        why = sandbox_static_check(code, allowed_imports)
        if why is not None:
            res["error"] = "refused: " + why
            return res
    if _LIBC is None:
        try:
            import ctypes
            _LIBC = ctypes.CDLL(None, use_errno=True)
        except OSError:
            pass
    work = tempfile.mkdtemp(prefix="sandbox_")
    max_bytes = max_output_chars * 4 + 4096
    try:
        root = os.path.realpath(work)
        Path(work, "snippet.py").write_text(code)
        Path(work, "inputs.json").write_text(json.dumps(variables or {}))
        Path(work, "runner.py").write_text(_RUNNER % dict(imports=tuple(allowed_imports), root=root,
                                                           blocked=_BLOCKED_EVENT_PREFIXES))
        with open(os.path.join(work, "out.txt"), "wb") as out, open(os.path.join(work, "err.txt"), "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "runner.py"], cwd=work, env={},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                    preexec_fn=lambda: _sandbox_limits(timeout_s, mem_mb, max_bytes))
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                res["error"] = f"timeout after {timeout_s} s"
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the snippet and anything it started
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        res["returncode"] = proc.returncode
        res["stdout"] = Path(work, "out.txt").read_bytes()[:max_bytes].decode("utf-8", "replace")[:max_output_chars]
        res["stderr"] = Path(work, "err.txt").read_bytes()[:max_bytes].decode("utf-8", "replace")[:max_output_chars]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rc = res["returncode"]
    if res["error"] is None and rc != 0:
        last = res["stderr"].strip().splitlines()[-1] if res["stderr"].strip() else ""
        if rc == -signal.SIGXCPU or rc == -signal.SIGKILL and "MemoryError" not in last:
            res["error"] = "cpu limit" if rc == -signal.SIGXCPU else f"killed (signal {-rc})"
        elif rc == -signal.SIGXFSZ or "File too large" in last:
            res["error"] = "output limit"
        elif "MemoryError" in last:
            res["error"] = "memory limit: " + last
        else:
            res["error"] = last or f"exit code {rc}"
    res["ok"] = res["error"] is None
    res["wall_s"] = round(time.time() - t0, 3)
    return res
