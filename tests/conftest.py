"""Shared fixtures: the repo on sys.path, a tiny randomly initialised model for mechanics tests; run_group, how
every test starts a process; a time limit on every test (pytest-timeout), so a hang fails instead of blocking."""
import ctypes
import gc
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# a test subprocess's thread settings: one thread per process (per rank under torchrun). torch takes its thread
# count from MKL_NUM_THREADS when that is set, so OMP_NUM_THREADS alone can leave two ranks at 2 threads each on 2 cores
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# a test's time limit: max(DEFAULT_TIMEOUT_S, HEAVY_TIMEOUT_FACTOR × its @pytest.mark.heavy seconds) (_add_time_limits)
DEFAULT_TIMEOUT_S, HEAVY_TIMEOUT_FACTOR = 300, 5  # 3× failed a sound test (116 s) at load 10 on 2 cores
# the tests that run the embedded model end to end (each tiny preset, skill_rm's judges), never two at once under
# `make test` (xdist_group(MEMORY_GROUP)): in fp32, the precision of a CPU without native bf16, skill_rm's tiny
# run peaks at 11.2 GiB RSS, skill_entropy's near 8, and an in-process test leaves its worker ~6 GiB. CI 12-07
# (that class) lost three tiny runs to the kernel's SIGKILL with two side by side
MEMORY_GROUP = "embedded_memory"
# NANOSKILL_SLOW_TESTS=1: also the tests too long for CI's 90 minutes (their skip reason says what they cover)
SLOW = os.environ.get("NANOSKILL_SLOW_TESTS") == "1"


def run_group(args, *, timeout, check=False, **kwargs):
    """subprocess.run for the tests, with the child in its own session (so its own process group): on the timeout,
    or any interrupt while it waits (pytest-timeout's, Ctrl-C), the whole group is SIGKILLed, torchrun's ranks and
    whatever they started with it, before the exception goes on. subprocess.run kills the launcher alone, and its
    ranks lived on as orphans holding CPU and memory. Same arguments and result as subprocess.run."""
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with subprocess.Popen(args, start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # TimeoutExpired (it holds the output so far), pytest-timeout's Failed, Ctrl-C
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


@pytest.fixture(autouse=True)
def _trim_heap_after_group_tests(request):
    """After a MEMORY_GROUP test, this worker's freed heap goes back to the OS (gc, then glibc's malloc_trim). An
    in-process run left its worker holding what it had freed (skill_rm's shrunk smoke: 3.7 GiB in bf16, 0.9 after
    the trim), and the group's next run, a subprocess, stacked on it: 22.4 of 24 GiB at peak under fp32, 12-08."""
    yield
    if request.node.get_closest_marker("xdist_group"):
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
            pass


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama with the embedded model's tokenizer, saved as an HF folder (fast on CPU)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import plumbing
    tok = AutoTokenizer.from_pretrained(plumbing.embedded_model_path())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    out = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def pytest_configure(config):
    """Skipped tests say why in the summary line (e.g. the sandbox's kernel layers without root or bubblewrap).
    The `multirank` marker names every test that starts torchrun ranks (bench/multirank_repeat.py runs them)."""
    config.addinivalue_line("markers", "multirank: starts two or more torchrun ranks (bench/multirank_repeat.py)")
    config.addinivalue_line("markers", "heavy(seconds): this test's measured seconds under make test (one thread); it "
                            f"starts early, and its time limit is max({DEFAULT_TIMEOUT_S}, {HEAVY_TIMEOUT_FACTOR} × seconds)")
    if not set("sA") & set(config.option.reportchars):
        config.option.reportchars += "s"


def _seconds(item):
    mark = item.get_closest_marker("heavy")
    return mark.args[0] if mark else 0


def pytest_collection_modifyitems(config, items):
    """Longest test first. `make test` runs two xdist workers of one thread each under --dist loadgroup: the tests
    of MEMORY_GROUP are one unit, run in this order on one worker, and every other test is a unit of its own, so
    the group opens worker 1 and the longest other tests open worker 2 while the rest fill in around them.
    Without xdist the order only moves the heavy tests to the front (a stable sort: the rest keep file order)."""
    items.sort(key=_seconds, reverse=True)
    _add_time_limits(config, items)


def _add_time_limits(config, items):
    """pytest-timeout's marker on every test that has none: max(floor, HEAVY_TIMEOUT_FACTOR × heavy seconds), the
    floor being --timeout (or PYTEST_TIMEOUT) when given, else DEFAULT_TIMEOUT_S; --timeout 0 sets no limit. The
    method stays pytest-timeout's default on Linux, signal (SIGALRM in the test's thread, the main thread of each
    xdist worker too): the hang fails that test alone and run_group kills its process group on the way out. The
    thread method's os._exit would end the whole worker, and leave a subprocess's ranks behind."""
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout not installed: no limits
        return
    from pytest_timeout import get_env_settings
    floor = get_env_settings(config).timeout
    floor = DEFAULT_TIMEOUT_S if floor is None else floor
    for item in items:
        if floor and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(floor, HEAVY_TIMEOUT_FACTOR * _seconds(item))))
