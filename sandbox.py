"""
sandbox.py — run untrusted Python (model-written code, HumanEval solutions) and say what happened.

skill_rm.py's `python_sandbox` tool and skill_entropy.py's code scorer call
`run_sandboxed`; it returns one result dict and never raises into the training loop.

    python -c "import sandbox; print(sandbox.run_sandboxed('print(6 * 7)'))"

The layers, kernel first. Each kernel layer holds even when the snippet gets past
everything written in Python (tests/test_sandbox.py runs every attack with the
Python layers switched off too):

  kernel
    1. bubblewrap (`bwrap`, a Debian package; `make install` installs it): new pid,
       network, mount, ipc and uts namespaces (user namespace too when not root). The
       filesystem is /usr and the Python install read-only plus the working folder;
       no_new_privs; the namespace dies with its parent, and every process in it dies
       with the snippet (setsid cannot leave a pid namespace).
    2. a fresh unprivileged uid/gid per call when started as root (the runner's first
       act, before any snippet code: no groups, setresgid, setresuid): the kernel
       refuses kill() on the trainer, its /proc/<pid>/environ, and writes outside the
       folder; RLIMIT_NPROC counts for that uid alone, and afterwards every process of
       that uid is killed (kill by uid: nothing the snippet starts survives).
    3. rlimits (CPU seconds, address space, output size, open files, processes, no
       core), an empty environment, a temporary working folder, its own session. The CPU
       limit (start-up included) holds without the parent: a busy snippet whose parent is
       killed before its wall clock fires has nothing else to end it when bubblewrap is missing.
    4. a wall-clock timeout, counted from the snippet's first line (start-up gets STARTUP_S of its own),
       then SIGKILL of the session and of the uid. Calls from parallel threads are independent: no two
       running calls share a uid, and a runner is reaped only after its session is killed.
  Python (defence in depth; its state is out of the snippet's reach)
    5. a static check: import allow-list, no dunder names, no eval/exec/open/...;
    6. restricted builtins: imports only from the allow-list, no eval/exec/compile/input;
    7. a PEP 578 audit hook whose rules are constants of its own code object and whose
       few helpers are closure cells: no new imports, no process creation, no sockets,
       no ctypes, no files outside the folder, no frame, code or gc access;
    8. no `__main__` in sys.modules: the runner keeps its state in a function's locals
       (frames are unreachable under the hook), and success is a per-call token the
       runner writes after the snippet returns, so `os._exit(0)` is not a pass.

Where a kernel layer is unavailable (no bwrap, not root, no namespaces) the sandbox
runs without it and prints a one-line warning naming what is missing.
"""
import ast
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# ----- static check -----

SANDBOX_IMPORTS = ("collections", "decimal", "fractions", "functools", "itertools",
                   "json", "math", "re", "statistics", "string")
# HumanEval programs and tests (trusted test code, untrusted solutions) may also use these.
CODE_IMPORTS = SANDBOX_IMPORTS + ("typing", "hashlib", "heapq", "bisect", "random", "copy", "operator",
                                  "string")
SANDBOX_BANNED_NAMES = {"eval", "exec", "open", "getattr", "setattr", "delattr", "compile",
                        "globals", "locals", "vars", "input", "breakpoint", "memoryview",
                        "exit", "quit", "help"}


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
    except Exception as e:  # null bytes, not a string, nesting too deep for the parser
        return f"cannot parse: {type(e).__name__}: {str(e)[:100]}"
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
        name = (node.id if isinstance(node, ast.Name)
                else node.attr if isinstance(node, ast.Attribute) else None)
        if name is not None and name.startswith("__") and name.endswith("__"):
            return f"dunder name '{name}' is not allowed"
        if name in SANDBOX_BANNED_NAMES:
            return f"name '{name}' is not allowed"
    return None

# ----- kernel layers -----

USE_BWRAP = True  # False: the fallback without namespaces from bubblewrap (tests run both)
UID_BASE = 0x40000000  # per-call uids are UID_BASE + 24 random bits: no account and no other process has one
STARTUP_S = 30.0  # allowance for the runner's start-up (bwrap, interpreter, inputs) before timeout_s starts
_UIDS_IN_USE, _UIDS_LOCK = set(), threading.Lock()  # concurrent calls (a judge's threads) never share a uid
_BWRAP = {}  # cache: "path" -> a bwrap that passed its probe, or None
_WARNED = set()
# Layers the runner sets up itself (no bwrap) and reports in the file `missing` when it cannot.
_RUNNER_LAYERS = ("network namespace", "unprivileged uid", "no_new_privs")


def _warn_once(what):
    """One line on stderr per missing layer and process."""
    if what not in _WARNED:
        _WARNED.add(what)
        print(f"sandbox: warning: {what}", file=sys.stderr, flush=True)


def _bwrap_args(bwrap, work):
    """bwrap's options: fresh namespaces, /usr and Python read-only, the working folder read-write."""
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # bwrap runs privileged (no user namespace); the runner then drops to its uid itself
    if os.geteuid() == 0:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    made = {"/"}

    def parents(path):  # bwrap would make missing parents 0700: unreadable once the uid is dropped
        out = []
        for p in reversed(Path(path).parents):
            if str(p) not in made:
                made.add(str(p))
                out += ["--perms", "0755", "--dir", str(p)]
        return out
    args += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    prefix, python = os.path.realpath(sys.base_prefix), os.path.realpath(sys.executable)
    for d in [prefix] + ([] if python.startswith(prefix + "/") else [os.path.dirname(python)]):
        if not (d + "/").startswith("/usr/"):
            args += parents(d) + ["--ro-bind", d, d]
    args += ["--proc", "/proc", "--dev", "/dev"] + parents(work) + ["--bind", work, work, "--chdir", work]
    return args


def _bwrap():
    """Path of a bwrap that works here, or None (then warns once, naming what is missing)."""
    if not USE_BWRAP:
        _warn_once("bubblewrap switched off (sandbox.USE_BWRAP = False) -> no pid/mount namespaces")
        return None
    if "path" not in _BWRAP:
        path = shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)
        why = "bubblewrap (bwrap) not found" if path is None else None
        if path is not None:
            with tempfile.TemporaryDirectory(prefix="sandbox_probe_") as d:
                try:
                    p = subprocess.run(_bwrap_args(path, os.path.realpath(d)) +
                                       [os.path.realpath(sys.executable), "-I", "-S", "-c", ""],
                                       env={}, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
                    if p.returncode != 0:
                        why = "bubblewrap does not run here: " + (
                            p.stderr.decode("utf-8", "replace").strip().splitlines()
                            or [f"exit code {p.returncode}"])[-1][:150]
                except (OSError, subprocess.SubprocessError) as e:
                    why = f"bubblewrap does not run here: {e}"
        if why is not None:
            _warn_once(why + " -> no pid/mount namespaces (`apt-get install bubblewrap`; "
                       "`make install` does it as root)")
            path = None
        _BWRAP["path"] = path
    return _BWRAP["path"]


def _take_uid():
    """A per-call uid no running call of this process holds, so one call's kill by uid never hits
    another's."""
    with _UIDS_LOCK:
        while (uid := UID_BASE + secrets.randbelow(1 << 24)) in _UIDS_IN_USE:
            pass
        _UIDS_IN_USE.add(uid)
        return uid


def _wait_exit(proc, until):
    """Wait until proc has exited (True) or time.time() passes until (False), without reaping it: while it
    is unreaped its pid, and so its process group id, cannot be given to another call's runner."""
    while True:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.time() >= until:
            return False
        time.sleep(0.005)


def _pids_of_uid(uid):
    """Live (not zombie) processes whose real, effective or saved uid is `uid`, from /proc."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path("/proc", name, "status").read_text()
        except OSError:
            continue
        uids = status.partition("\nUid:")[2].split(None, 3)[:3]
        state = status.partition("\nState:")[2].lstrip()[:1]
        if str(uid) in uids and state not in ("Z", "X"):
            pids.append(int(name))
    return pids


def _kill_uid(uid, within_s=5.0):
    """SIGKILL every process of `uid` until none is left (a fork bomb is bounded by RLIMIT_NPROC)."""
    deadline = time.time() + within_s
    while True:
        pids = _pids_of_uid(uid)
        if not pids or time.time() > deadline:
            return not pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)

# ----- runner (the child) -----
# PEP 578 audit events refused once the snippet runs. "object." covers the audited attributes
# (tb_frame, f_code, gi_frame, __code__, ...): without frames the runner's locals are out of reach.
_BLOCKED_EVENT_PREFIXES = ("os.", "subprocess.", "socket.", "ctypes.", "shutil.", "pty.",
                           "mmap.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.",
                           "telnetlib.", "webbrowser.", "import", "compile", "builtins.input",
                           "sys.", "cpython.", "object.", "function.", "code.", "gc.", "marshal.",
                           "pickle.", "fcntl.", "resource.", "syslog.", "signal.", "tempfile.",
                           "glob.", "_posixsubprocess", "_thread")
# Builtins the snippet does not get (open stays: the hook confines it to the folder).
_REMOVED_BUILTINS = ("eval", "exec", "compile", "input", "breakpoint", "help", "exit", "quit",
                     "copyright", "credits", "license", "__loader__", "__spec__")

_RUNNER = r'''
def _sandbox(cfg):
    import builtins, io, json, os, resource, sys
    os.environ.clear()  # env={} from the parent; bwrap adds PWD
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    with open("inputs.json") as f:
        variables = json.load(f)
    with open("snippet.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    for m in cfg["imports"]:  # before the uid drop: the Python install may not be readable by that uid
        try:
            __import__(m)
        except Exception:
            pass
    missing, libc = [], None
    if cfg["netns"] or cfg["nnp"]:  # without bwrap the runner sets these up itself
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
        except Exception:
            pass
    if cfg["netns"]:  # CLONE_NEWNET, with CLONE_NEWUSER when unprivileged
        if libc is None or libc.unshare(0x40000000 if os.geteuid() == 0 else 0x50000000) != 0:
            missing.append("network namespace")
    if cfg["uid"] is not None:
        try:
            os.setgroups([])
            os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        except OSError:
            missing.append("unprivileged uid")
    if cfg["nnp"] and (libc is None or libc.prctl(38, 1, 0, 0, 0) != 0):  # PR_SET_NO_NEW_PRIVS
        missing.append("no_new_privs")
    libc = None
    for m in ("ctypes", "ctypes._endian", "_ctypes", "resource"):
        sys.modules.pop(m, None)
    os.unlink("runner.py")  # it holds the token; as the uid (the folder's owner) this works
    if missing:
        with open("missing", "w") as f:
            f.write("\n".join(missing))
    with open("started", "w"):  # the parent's timeout_s counts from here, not from the interpreter's start
        pass
    token, stdout, stderr, excepthook = cfg["token"], sys.stdout, sys.stderr, sys.__excepthook__
    os_open, os_write, os_exit, StringIO = os.open, os.write, os._exit, io.StringIO
    done_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    cfg = None
    type_, str_ = type, str

    def report(e):  # "Type: message (snippet line n)"; the line from the interpreter's own
        buf = StringIO()  # traceback printer (C code: it reads frames without Python access)
        sys.stderr = buf
        try:
            excepthook(type_(e), e, e.__traceback__)
        except BaseException:
            pass
        sys.stderr = stderr
        at = [ln.split(", line ")[1].split(",")[0] for ln in buf.getvalue().splitlines()
              if ln.lstrip().startswith('File "<snippet>", line ')]
        try:
            msg = str_(e)
        except BaseException:
            msg = "?"
        line = "%%s: %%s (snippet line %%s)" %% (type_(e).__name__, msg[:300], at[-1] if at else None)
        stderr.write(" ".join(line.split("\n")) + "\n")

    try:
        code = compile(source, "<snippet>", "exec")
    except BaseException as e:
        report(e)
        stderr.flush()
        os_exit(1)
    ns = dict(variables)
    ns["__name__"] = "__sandbox__"
    if %(audit)r:
        allowed, real_import = frozenset(%(imports)r), builtins.__import__

        def restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level or name.partition(".")[0] not in allowed:
                raise ImportError("sandbox: import of %%r is not allowed" %% (name,))
            return real_import(name, globals, locals, fromlist, level)
        ns["__builtins__"] = {k: v for k, v in vars(builtins).items() if k not in %(removed)r}
        ns["__builtins__"]["__import__"] = restricted_import
        # the hook's rules are literals of its code; the builtins it needs are closure cells
        calls, bytes_, int_, Refused = [0], bytes, int, PermissionError

        def hook(event, args):
            if event == "exec":
                calls[0] += 1
                if calls[0] > 1:
                    raise Refused("sandbox: exec is not allowed")
            elif event == "open":
                p = args[0]
                if type_(p) is int_:
                    return
                if type_(p) is bytes_:
                    p = bytes_.decode(p, "utf-8", "replace")
                if type_(p) is not str_:
                    raise Refused("sandbox: open of a path object is not allowed")
                if "\x00" in p or ".." in p.split("/") or (p.startswith("/") and p != %(root)r
                                                           and not p.startswith(%(root)r + "/")):
                    raise Refused("sandbox: file outside the working folder: " + p[:200])
            elif event.startswith(%(blocked)r):
                raise Refused("sandbox: " + event + " is not allowed")
        sys.addaudithook(hook)
        sys.modules.pop("__main__", None)
    try:
        exec(code, ns)
        stdout.flush()
    except BaseException as e:
        report(e)
        stderr.flush()
        os_exit(1)
    try:  # the pass mark: only this code knows the token
        os_write(os_open("done", done_flags, 0o600), token.encode())
    except BaseException:
        os_exit(1)
    os_exit(0)


_sandbox(%(cfg)r)
'''


def run_sandboxed(code: str, timeout_s: float = 3.0, mem_mb: int = 256, variables: dict | None = None,
                  allowed_imports=SANDBOX_IMPORTS, static_check: bool = True,
                  max_output_chars: int = 4000, *, audit_hook: bool = True, cpu_s: float | None = None) -> dict:
    """Run untrusted Python `code` in a contained child process and report what happened.

    `variables` (JSON-serialisable) become globals of the snippet (here: `prompt`,
    `candidates`, `sample`, `response`). `allowed_imports` are pre-imported and are the
    only importable modules. `static_check=False` skips the static check (HumanEval
    programs with trusted tests, `if __name__ == ...`); `audit_hook=False` also drops
    layers 6-8 and is for tests of the kernel layers only. `cpu_s` is the RLIMIT_CPU of the runner in
    whole seconds, start-up included (default ceil(timeout_s) + 1: a one-thread snippet whose start-up
    takes under a second of CPU meets the wall clock first).

    Returns {"ok": bool, "stdout": str, "stderr": str, "error": str | None,
             "returncode": int | None, "wall_s": float, "uid": int | None}. `error` is
    one line: "refused: ...", "timeout after X s", "memory limit: ...", "cpu limit",
    "output limit", "killed (signal n)", "ended before finishing (exit code n)", or the
    snippet's exception "Type: message (snippet line n)". `uid` is the unprivileged uid
    the snippet ran as (None when not started as root). Never raises.
    """
    t0 = time.time()
    res = {"ok": False, "stdout": "", "stderr": "", "error": None, "returncode": None, "wall_s": 0.0,
           "uid": None}
    try:
        why = "code is not a string" if not isinstance(code, str) else \
            sandbox_static_check(code, allowed_imports) if static_check else None
        if why is not None:
            res["error"] = "refused: " + why
        else:
            _run_contained(res, code, timeout_s, mem_mb, variables, tuple(allowed_imports),
                           max_output_chars, audit_hook, cpu_s)
    except Exception as e:  # our own failure (disk full, unserialisable variables): still one line
        res["error"] = f"sandbox failure: {type(e).__name__}: {str(e)[:200]}"
    if res["error"] is not None:
        res["error"] = " ".join(res["error"].splitlines())
    res["ok"] = res["error"] is None
    res["wall_s"] = round(time.time() - t0, 3)
    return res


def _run_contained(res, code, timeout_s, mem_mb, variables, imports, max_output_chars, audit_hook, cpu_s):
    """Write the folder, start the runner under the kernel layers, wait, kill, read back; fills `res`."""
    bwrap = _bwrap()
    root_user = os.geteuid() == 0
    if not root_user:
        _warn_once(f"not root: the snippet keeps uid {os.geteuid()} (no separate uid, no kill by uid)")
    uid = _take_uid() if root_user else None
    token = secrets.token_hex(16)
    max_bytes = max_output_chars * 4 + 4096
    cpu = int(timeout_s + 0.999) + 1 if cpu_s is None else max(1, int(cpu_s + 0.999))
    cfg = dict(uid=uid, token=token, imports=imports, netns=bwrap is None, nnp=bwrap is None,
               rlimits=[("RLIMIT_CPU", cpu, cpu + 1),  # SIGXCPU, then SIGKILL
                        ("RLIMIT_AS", mem_mb << 20, mem_mb << 20),
                        ("RLIMIT_FSIZE", max_bytes, max_bytes),
                        ("RLIMIT_NOFILE", 32, 32), ("RLIMIT_CORE", 0, 0),
                        ("RLIMIT_NPROC", 8, 8)])  # per uid: bounds a fork bomb (not for uid 0)
    work = os.path.realpath(tempfile.mkdtemp(prefix="sandbox_"))
    try:
        for name, text in (("snippet.py", code), ("inputs.json", json.dumps(dict(variables or {}))),
                           ("runner.py", _RUNNER % dict(cfg=cfg, audit=audit_hook, imports=imports, root=work,
                                                        removed=_REMOVED_BUILTINS,
                                                        blocked=_BLOCKED_EVENT_PREFIXES))):
            fd = os.open(os.path.join(work, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
        if uid is not None:  # the uid owns the folder; the runner, still root, reads its 0600 files through x
            os.chown(work, uid, uid)
            os.chmod(work, 0o711)
        argv = (_bwrap_args(bwrap, work) if bwrap else []) + [os.path.realpath(sys.executable), "-I", "-S",
                                                              "-B", "runner.py"]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, cwd=work, env={}, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
            started, up_to = os.path.join(work, "started"), time.time() + STARTUP_S
            while not os.path.exists(started) and not _wait_exit(proc, min(up_to, time.time() + 0.01)) \
                    and time.time() < up_to:
                pass  # start-up (slow on a loaded machine) is not the snippet's time
            if not _wait_exit(proc, time.time() + timeout_s):
                res["error"] = f"timeout after {timeout_s} s"
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the runner and anything it started in its session
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()  # reaped only now: the pgid above was still this call's
            if uid is not None:  # and anything that left the session (setsid); with bwrap too: its
                _kill_uid(uid)  # pid namespace empties only after bwrap has reported the exit
            out.seek(0), err.seek(0)
            res["stdout"] = out.read(max_bytes).decode("utf-8", "replace")[:max_output_chars]
            res["stderr"] = err.read(max_bytes).decode("utf-8", "replace")[:max_output_chars]
        done = _read_own_file(work, "done")
        for layer in (_read_own_file(work, "missing") or "").splitlines():
            if layer in _RUNNER_LAYERS:
                _warn_once(f"{layer} unavailable -> the snippet runs without it")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if uid is not None:
            with _UIDS_LOCK:
                _UIDS_IN_USE.discard(uid)
    rc = proc.returncode
    if bwrap and rc is not None and rc > 128:  # bwrap reports a child killed by signal n as 128 + n
        rc = -(rc - 128)
    res["returncode"], res["uid"] = rc, uid
    if res["error"] is not None:
        return
    last = res["stderr"].strip().splitlines()[-1] if res["stderr"].strip() else ""
    if rc == 0:
        if done != token:  # os._exit(0) or similar before the snippet finished
            res["error"] = "ended before finishing (exit code 0)"
    elif rc == -signal.SIGXCPU or rc == -signal.SIGKILL and "MemoryError" not in last:
        res["error"] = "cpu limit" if rc == -signal.SIGXCPU else f"killed (signal {-rc})"
    elif rc == -signal.SIGXFSZ or "File too large" in last:
        res["error"] = "output limit"
    elif "MemoryError" in last:
        res["error"] = "memory limit: " + last
    else:
        res["error"] = last or f"exit code {rc}"


def _read_own_file(folder, name, limit=4096):
    """A small file the child wrote, not following a symlink it may have put there; None if absent."""
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with open(fd, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")
