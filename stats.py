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
seeds instead of averaging p-values. NumPy only.
"""
import json
import math
import os
from pathlib import Path

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
    """Exact two-sided binomial p: the probability, under Binomial(n, p0), of every outcome no more likely than k."""
    k, n = int(k), int(n)
    if n == 0:
        return 1.0
    if p0 <= 0 or p0 >= 1:
        return 1.0 if k == round(p0 * n) else 0.0
    logpmf = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p0) + (n - i) * math.log1p(-p0)
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


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else None  # JSON has no NaN


def compare(claim, a, b, a_items, b_items, chance=None, n_seeds=1):
    """Headline entry for "A vs B", paired over items (a_items[i] and b_items[i] are the same item)."""
    a_items = [float(v) for v in a_items]
    b_items = [float(v) for v in b_items]
    d = _paired_diffs(a_items, b_items)
    return {"claim": claim, "a": a, "b": b, "mean_a": _num(mean_sd(a_items)[0]), "mean_b": _num(mean_sd(b_items)[0]),
            "diff": _num(d.mean()) if len(d) else None, "ci95": [_num(v) for v in bootstrap_ci(d)],
            "p": paired_permutation_p(a_items, b_items), "chance": chance, "n_items": len(d), "n_seeds": n_seeds,
            "a_items": a_items, "b_items": b_items}


def vs_chance(claim, a, a_items, chance, n_seeds=1):
    """Headline entry for "A vs its chance level": exact binomial p for 0/1 items, else a sign-flip test of a_i − chance."""
    x = _clean(a_items)
    binary = len(x) > 0 and bool(np.all((x == 0) | (x == 1)))
    p = binomial_p(int(x.sum()), len(x), chance) if binary else sign_flip_p(x - chance)
    return {"claim": claim, "a": a, "b": "chance", "mean_a": _num(x.mean()) if len(x) else None, "mean_b": chance,
            "diff": _num(x.mean() - chance) if len(x) else None, "ci95": [_num(v) for v in bootstrap_ci(x - chance)],
            "p": p, "chance": chance, "n_items": len(x), "n_seeds": n_seeds, "a_items": [float(v) for v in a_items],
            "b_items": None}


def write_results(run_dir, results, headline):
    """run_dir/results.json = {**results, "headline": headline}, written atomically (temp file, fsync, rename)."""
    path = Path(run_dir) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump({**results, "headline": headline}, f, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def aggregate(run_dirs):
    """Pool every claim's items over the runs (units = items × seeds) and recompute its entry."""
    pooled = {}  # claim -> (first entry, a_items, b_items, n_seeds)
    for d in run_dirs:
        path = Path(d) / "results.json"
        if not path.exists():
            raise SystemExit(f"--aggregate: {path} does not exist (did that run finish?)")
        for e in json.loads(path.read_text()).get("headline", []):
            first, a_items, b_items, n = pooled.get(e["claim"], (e, [], [], 0))
            a_items += e.get("a_items") or []
            b_items += e.get("b_items") or []
            pooled[e["claim"]] = (first, a_items, b_items, n + 1)
    out = []
    for claim, (e, a_items, b_items, n) in pooled.items():
        if e.get("b_items") is None:
            out.append(vs_chance(claim, e["a"], a_items, e["chance"], n_seeds=n))
        else:
            out.append(compare(claim, e["a"], e["b"], a_items, b_items, chance=e.get("chance"), n_seeds=n))
    return out


def _fmt(x):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.3g}"


def format_headline(entries):
    """The headline table, one row per claim (values as stored: rates are fractions, not percent)."""
    rows = ["| claim | A | B | mean A | mean B | diff | 95 % CI | p | chance | n (items × seeds) | seeds |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        lo, hi = e["ci95"]
        rows.append(f"| {e['claim']} | {e['a']} | {e['b']} | {_fmt(e['mean_a'])} | {_fmt(e['mean_b'])} | {_fmt(e['diff'])} | "
                    f"[{_fmt(lo)}, {_fmt(hi)}] | {_fmt(e['p'])} | {_fmt(e['chance'])} | {e['n_items']} | {e['n_seeds']} |")
    return "\n".join(rows)


def aggregate_main(run_dirs):
    """`--aggregate RUN_DIR ...`: print the pooled headline table and return its entries."""
    entries = aggregate(run_dirs)
    print(format_headline(entries))
    return entries
