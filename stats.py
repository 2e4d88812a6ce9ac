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
import re
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
    """Exact two-sided binomial p: the probability, under Binomial(n, p0), of every outcome no more likely
    than k."""
    k, n = int(k), int(n)
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


def compare(claim, a, b, a_items, b_items, chance=None, n_seeds=1):
    """Headline entry for "A vs B", paired over items (a_items[i] and b_items[i] are the same item)."""
    a_items = [float(v) for v in a_items]
    b_items = [float(v) for v in b_items]
    d = _paired_diffs(a_items, b_items)
    return {"claim": claim, "a": a, "b": b, "mean_a": _num(mean_sd(a_items)[0]),
            "mean_b": _num(mean_sd(b_items)[0]),
            "diff": _num(d.mean()) if len(d) else None, "ci95": [_num(v) for v in bootstrap_ci(d)],
            "p": paired_permutation_p(a_items, b_items), "chance": chance, "n_items": len(d),
            "n_seeds": n_seeds, "a_items": a_items, "b_items": b_items}


def vs_chance(claim, a, a_items, chance, n_seeds=1):
    """Headline entry for "A vs its chance level": exact binomial p for 0/1 items, else a sign-flip test of
    a_i − chance."""
    x = _clean(a_items)
    binary = len(x) > 0 and bool(np.all((x == 0) | (x == 1)))
    p = binomial_p(int(x.sum()), len(x), chance) if binary else sign_flip_p(x - chance)
    return {"claim": claim, "a": a, "b": "chance", "mean_a": _num(x.mean()) if len(x) else None,
            "mean_b": chance,
            "diff": _num(x.mean() - chance) if len(x) else None,
            "ci95": [_num(v) for v in bootstrap_ci(x - chance)],
            "p": p, "chance": chance, "n_items": len(x), "n_seeds": n_seeds,
            "a_items": [float(v) for v in a_items], "b_items": None}


def write_results(run_dir, results, headline):
    """run_dir/results.json = {**results, "headline": headline}, written atomically (temp file, fsync,
    rename)."""
    path = Path(run_dir) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump({**results, "headline": headline}, f, indent=1,
                  default=lambda o: o.item() if hasattr(o, "item") else str(o))
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
        rows.append(f"| {e['claim']} | {e['a']} | {e['b']} | {_fmt(e['mean_a'])} | {_fmt(e['mean_b'])} | "
                    f"{_fmt(e['diff'])} | [{_fmt(lo)}, {_fmt(hi)}] | {_fmt(e['p'])} | {_fmt(e['chance'])} | "
                    f"{e['n_items']} | {e['n_seeds']} |")
    return "\n".join(rows)


def aggregate_main(run_dirs):
    """`--aggregate RUN_DIR ...`: print the pooled headline table and return its entries."""
    entries = aggregate(run_dirs)
    print(format_headline(entries))
    return entries


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
