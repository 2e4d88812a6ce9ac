"""stats.py against hand-computed cases: the one stats helper every paper's headline uses."""
import json
import math

import numpy as np
import pytest

import stats


def test_mean_sd_uses_bessel_and_drops_nan():
    assert stats.mean_sd([1, 2, 3]) == (2.0, 1.0)
    m, s = stats.mean_sd([4.0, float("nan"), None])
    assert m == 4.0 and math.isnan(s)


def test_binomial_p_exact_two_sided():
    assert stats.binomial_p(0, 5, 0.5) == pytest.approx(2 / 32)
    assert stats.binomial_p(9, 10, 0.5) == pytest.approx(22 / 1024)  # outcomes 0, 1, 9, 10
    assert stats.binomial_p(5, 10, 0.5) == pytest.approx(1.0)
    # asymmetric null: k = 0 of 4 at p0 = 0.25 has pmf 0.75^4 = 0.316; outcomes no more likely: 0, 2, 3, 4
    pmf = [math.comb(4, i) * 0.25 ** i * 0.75 ** (4 - i) for i in range(5)]
    assert stats.binomial_p(0, 4, 0.25) == pytest.approx(sum(p for p in pmf if p <= pmf[0] + 1e-12))


def test_sign_flip_p_exact_enumeration():
    assert stats.sign_flip_p([1, 1, 1]) == pytest.approx(2 / 8)
    assert stats.sign_flip_p([1, 2, 3]) == pytest.approx(2 / 8)   # only all-plus and all-minus reach |6|
    assert stats.sign_flip_p([1, 2, -3]) == pytest.approx(1.0)  # observed sum 0
    assert stats.sign_flip_p([0, 0]) == 1.0                      # no non-zero difference: no evidence
    assert stats.paired_permutation_p([1, 1, 1, 1], [0, 0, 0, 0]) == pytest.approx(2 / 16)


def test_sign_flip_p_monte_carlo_for_large_n_is_small_for_a_real_shift():
    rng = np.random.default_rng(0)
    d = rng.normal(1.0, 1.0, size=40)
    assert stats.sign_flip_p(d) < 1e-3
    assert stats.sign_flip_p(np.tile([1.0, -1.0], 20)) == pytest.approx(1.0)  # observed sum 0


def test_wilson_ci_hand_values():
    lo, hi = stats.wilson_ci(0, 10)
    z2 = 1.959964 ** 2
    assert lo == 0.0 and hi == pytest.approx(z2 / (10 + z2))
    lo, hi = stats.wilson_ci(5, 10)
    assert lo == pytest.approx(1 - hi) and 0.2 < lo < 0.25


def test_bootstrap_ci_covers_the_mean_and_collapses_on_constants():
    assert stats.paired_bootstrap_ci([1, 1, 1], [0, 0, 0]) == [1.0, 1.0]
    lo, hi = stats.paired_bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1, 0, 0])
    assert lo <= 0.5 <= hi and lo >= -0.01 and hi <= 1.0


def test_compare_entry_fields_and_vs_chance_binary_uses_binomial():
    e = stats.compare("A beats B", "A", "B", [1, 1, 0, 1], [0, 1, 0, 0], chance=0.25)
    assert set(e) >= {"claim", "a", "b", "mean_a", "mean_b", "diff", "ci95", "p", "chance", "n_items", "n_seeds"}
    assert (e["mean_a"], e["mean_b"], e["diff"], e["n_items"]) == (0.75, 0.25, 0.5, 4)
    assert e["p"] == pytest.approx(2 / 4)  # two non-zero differences, both +1: 2 of 4 patterns reach |2|
    c = stats.vs_chance("A above coin", "A", [1, 1, 1, 1, 1], 0.5)
    assert c["b"] == "chance" and c["p"] == pytest.approx(2 / 32) and c["diff"] == 0.5
    s = stats.vs_chance("sd above locked", "A", [0.5, 0.6, 0.7], 0.4)  # non-binary: sign flip of a − chance
    assert s["p"] == pytest.approx(2 / 8)


def test_aggregate_pools_items_over_seeds(tmp_path):
    for seed, (a, b) in enumerate([([1, 1, 0], [0, 1, 0]), ([1, 0, 1], [0, 0, 0])]):
        stats.write_results(tmp_path / f"s{seed}", {"seed": seed},
                            [stats.compare("A vs B", "A", "B", a, b), stats.vs_chance("A vs coin", "A", a, 0.5)])
    assert json.loads((tmp_path / "s0" / "results.json").read_text())["seed"] == 0
    pooled = {e["claim"]: e for e in stats.aggregate([tmp_path / "s0", tmp_path / "s1"])}
    ab = pooled["A vs B"]
    assert (ab["n_items"], ab["n_seeds"], ab["mean_a"], ab["mean_b"]) == (6, 2, 4 / 6, 1 / 6)
    assert ab["p"] == pytest.approx(2 / 8)  # three +1 differences
    assert pooled["A vs coin"]["p"] == pytest.approx(stats.binomial_p(4, 6, 0.5))
    table = stats.format_headline(list(pooled.values()))
    assert "| A vs B | A | B |" in table and "| 6 | 2 |" in table


def test_aggregate_names_a_missing_run(tmp_path):
    with pytest.raises(SystemExit, match="results.json does not exist"):
        stats.aggregate([tmp_path / "nope"])
