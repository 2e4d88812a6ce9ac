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
    # d = four 1s and four 0s: a resample's mean is Binomial(8, ½)/8, and P(≤ 1/8) = 9/256 = 3.5 % straddles the
    # 2.5 % point (P(0) = 1/256): the percentile CI is [1/8, 7/8] (10000 resamples: ±0.2 % around 3.5 %)
    assert [lo, hi] == [0.125, 0.875]


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


def test_aggregate_prints_the_run_to_run_spread_beside_the_ci(tmp_path):
    # seed diffs: 1/3 − 0 = 0.333, 1 − 0 = 1, 0 − 0 = 0 → sd √(21/81) = 0.509 (ddof 1), range 0 … 1
    for seed, a in enumerate([[1, 0, 0], [1, 1, 1], [0, 0, 0]]):
        stats.write_results(tmp_path / f"s{seed}", {}, [stats.compare("A vs B", "A", "B", a, [0, 0, 0])])
    (e,) = stats.aggregate([tmp_path / f"s{k}" for k in range(3)])
    assert e["seed_diffs"] == pytest.approx([1 / 3, 1, 0])
    assert stats.seed_spread(e) == "sd 0.509 (0 … 1)"
    lo, hi = (stats._fmt(x) for x in e["ci95"])
    assert f"| [{lo}, {hi}] | sd 0.509 (0 … 1) |" in stats.format_headline([e])  # the column right after the CI
    assert stats.seed_spread({**e, "seed_diffs": [0.2]}) == "—"  # one seed has no spread
    assert stats.seed_spread({**e, "seed_diffs": [None, "x", 0.1]}) == "—"  # hostile values are skipped


def test_aggregate_names_a_missing_run(tmp_path):
    with pytest.raises(SystemExit, match="results.json does not exist"):
        stats.aggregate([tmp_path / "nope"])


# ----- issue #48 §2: minimum detectable effect; #53 §3: aggregate robustness; #48 §3: clustering -----
Z_A, Z_B = 1.959964, 0.841621  # z_{1−α/2} at α = 0.05, z_{0.8}


def test_mde_hand_values_paired_and_proportion_at_zero():
    assert stats.mde(100, sd=2.0) == pytest.approx((Z_A + Z_B) * 2.0 / 10, rel=1e-5)
    # p0 = 0: δ·√n = z_b·√(δ(1 − δ))  ⇒  δ = z_b² / (n + z_b²)
    assert stats.mde(100, p0=0.0) == pytest.approx(Z_B ** 2 / (100 + Z_B ** 2), rel=1e-5)
    assert math.isnan(stats.mde(1, sd=1.0)) and math.isnan(stats.mde(5, p0=0.99))  # p1 = 1 not detectable
    assert math.isnan(stats.mde(6, sd=0.0))  # six equal differences: no spread seen, no mde (not "≥ 0")
    assert stats.compare("x", "a", "b", [0.5] * 6, [0.3] * 6)["mde"] is None  # sd 1.6e-17: rounding, not spread
    assert stats.compare("same vs cross", "a", "b", [0.0] * 6, [0.0] * 6)["mde"] is None  # stored: null


def test_mde_paired_gives_power_080_in_simulation():
    """True effect = mde ⇒ the two-sided test rejects 80 % of the time (one-sided z would give ~70 %,
    forgetting √n ~100 %)."""
    rng = np.random.default_rng(0)
    n = 60
    d = rng.normal(stats.mde(n, sd=1.0), 1.0, size=(4000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    assert np.mean(np.abs(t) > Z_A) == pytest.approx(0.8, abs=0.025)
    # the test compare() runs: the sign flip (Monte Carlo, n > 16)
    n = 40
    m = stats.mde(n, sd=1.0)
    ps = [stats.sign_flip_p(rng.normal(m, 1.0, n), n_perm=500, seed=i) for i in range(400)]
    assert np.mean(np.array(ps) < 0.05) == pytest.approx(0.8, abs=0.06)


def test_mde_proportion_vs_chance_gives_power_080_with_the_exact_binomial():
    """vs_chance's test on 0/1 items at true rate p0 + mde rejects ~80 % (the exact test is a little
    conservative; a one-sided z gives ~67 %)."""
    n, p0 = 300, 0.25
    reject = np.array([stats.binomial_p(k, n, p0) < 0.05 for k in range(n + 1)])
    k = np.random.default_rng(1).binomial(n, p0 + stats.mde(n, p0=p0), size=20000)
    assert reject[k].mean() == pytest.approx(0.8, abs=0.04)


def test_mde_two_proportions_gives_power_080_with_the_pooled_z_test():
    rng = np.random.default_rng(2)
    n, p0 = 200, 0.3
    m = stats.mde(n, p0=p0, two_proportions=True)
    x0, x1 = rng.binomial(n, p0, 20000), rng.binomial(n, p0 + m, 20000)
    pbar = (x0 + x1) / (2 * n)
    z = (x1 - x0) / n / np.sqrt(2 * pbar * (1 - pbar) / n)
    assert np.mean(np.abs(z) > Z_A) == pytest.approx(0.8, abs=0.02)


def test_entries_carry_mde_and_paper_effect_and_the_table_prints_them():
    a, b = [1, 1, 0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0, 0, 1]
    e = stats.compare("A vs B", "A", "B", a, b, paper_effect=0.023)
    d = np.subtract(a, b)
    assert e["mde"] == pytest.approx(stats.mde(8, sd=d.std(ddof=1))) and e["paper_effect"] == 0.023
    c = stats.vs_chance("A vs coin", "A", a, 0.25)
    assert c["mde"] == pytest.approx(stats.mde(8, p0=0.25)) and c["paper_effect"] is None
    s = stats.vs_chance("sd vs 0.4", "A", [0.5, 0.6, 0.7, 0.5, 0.6, 0.7], 0.4)
    assert s["mde"] == pytest.approx(stats.mde(6, sd=np.std([0.5, 0.6, 0.7] * 2, ddof=1)))
    text = stats.format_headline([e, c])
    assert f"- A vs B: this run can detect |diff| ≥ {e['mde']:.3g}" in text
    assert "the paper reports +0.023" in text
    assert f"- A vs coin: this run can detect |diff| ≥ {c['mde']:.3g}" in text
    assert "no paper effect recorded for this claim" in text


def test_item_ids_leave_a_single_run_entry_unchanged():
    rng = np.random.default_rng(3)
    a, b = rng.random(30).tolist(), rng.random(30).tolist()
    plain = stats.compare("A vs B", "A", "B", a, b)
    with_ids = stats.compare("A vs B", "A", "B", a, b, item_ids=[i % 5 for i in range(30)])  # ids repeat
    for k in ("diff", "ci95", "p", "mde", "n_items", "unit"):
        assert with_ids[k] == plain[k], k
    assert plain["unit"] == "item" and with_ids["item_ids"][:6] == ["0", "1", "2", "3", "4", "0"]


def test_cluster_bootstrap_resamples_whole_clusters():
    x = np.random.default_rng(4).normal(size=12)
    groups = np.arange(12)
    assert stats.cluster_bootstrap_ci(x, groups) == stats.bootstrap_ci(x)  # singletons: the item bootstrap
    # every cluster two copies of one value: resampling clusters = resampling the cluster means
    ci = stats.cluster_bootstrap_ci(np.repeat(x, 2), np.repeat(groups, 2))
    assert ci == pytest.approx(stats.bootstrap_ci(x))
    assert stats.bootstrap_ci(np.repeat(x, 2)) != pytest.approx(stats.bootstrap_ci(x))  # the naive CI narrows


def _two_seeds(tmp_path, ids0, ids1):
    for s, ids in enumerate((ids0, ids1)):
        stats.write_results(tmp_path / f"s{s}", {},
                            [stats.compare("A vs B", "A", "B", [1] * 5, [0] * 5, item_ids=ids),
                             stats.vs_chance("A vs coin", "A", [1] * 5, 0.5, item_ids=ids)])
    return {e["claim"]: e for e in stats.aggregate([tmp_path / "s0", tmp_path / "s1"])}


def test_aggregate_clusters_items_repeated_over_seeds(tmp_path):
    same = _two_seeds(tmp_path, list("abcde"), list("abcde"))  # the same five items in both seeds
    ab, coin = same["A vs B"], same["A vs coin"]
    assert ab["unit"] == coin["unit"] == "item (clustered over seeds)" and ab["n_units"] == 5
    assert ab["n_items"] == 10 and ab["p"] == pytest.approx(2 / 32)  # 5 clusters, not 10 items: 2 of 2^5
    assert coin["p"] == pytest.approx(2 / 32)  # sign flip over cluster means, not binomial_p(10, 10, 0.5)
    distinct = _two_seeds(tmp_path, list("abcde"), list("fghij"))
    assert distinct["A vs B"]["unit"] == "item×seed" and distinct["A vs B"]["p"] == pytest.approx(2 / 1024)
    assert distinct["A vs coin"]["p"] == pytest.approx(stats.binomial_p(10, 10, 0.5))


def test_aggregate_without_item_ids_pools_as_item_x_seed(tmp_path):
    _two_seeds(tmp_path, None, None)
    pooled = stats.aggregate([tmp_path / "s0", tmp_path / "s1"])
    assert {e["unit"] for e in pooled} == {"item×seed"} and pooled[0]["item_ids"] is None


def test_provenance_dirty_counts_code_not_results(tmp_path):
    """A results/ file that `make evidence` rewrote mid-run leaves the record clean; a changed code file does
    not (seeds 2-4 of skill_selfplay-tool, 12-07, were marked dirty by the zebra aggregate alone)."""
    from conftest import run_group

    def git(*cmd):
        run_group(["git", "-c", "user.email=t@t", "-c", "user.name=t", *cmd], cwd=tmp_path, check=True,
                  capture_output=True, timeout=60)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "aggregate.json").write_text("{}")
    (tmp_path / "grpo.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    assert stats.git_dirty(tmp_path) is False
    (tmp_path / "results" / "aggregate.json").write_text('{"n": 5}')
    (tmp_path / "new.py").write_text("untracked\n")
    assert stats.git_dirty(tmp_path) is False
    (tmp_path / "grpo.py").write_text("x = 2\n")
    assert stats.git_dirty(tmp_path) is True


def test_write_results_records_provenance(tmp_path):
    import sys
    import time

    import psutil  # accelerate's dependency: this process's age read from /proc by other code than stats'
    from conftest import run_group
    start = psutil.Process().create_time()
    before = time.time() - start
    stats.write_results(tmp_path, {"x": 1}, [])
    after = time.time() - start
    prov = json.loads((tmp_path / "results.json").read_text())["provenance"]
    head = run_group(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=60,
                     cwd=stats.Path(stats.__file__).parent).stdout.strip()
    assert prov["git"]["commit"] == head and isinstance(prov["git"]["dirty"], bool)
    assert prov["command"].startswith(sys.executable) and before - 0.1 <= prov["wall_s"] <= after + 0.1
    assert prov["device"]["kind"] in ("cpu", "cuda") and prov["device"]["class"]
    import torch
    assert prov["torch"] == torch.__version__ and "vllm" in prov


def test_provenance_never_raises_without_git(monkeypatch):
    def no_git(*a, **k):
        raise FileNotFoundError("git")
    monkeypatch.setattr(stats.subprocess, "run", no_git)
    prov = stats.provenance()
    assert prov["git"] is None and prov["command"] and "wall_s" in prov


def test_aggregate_names_a_corrupt_results_json(tmp_path):
    (tmp_path / "s0").mkdir()
    (tmp_path / "s0" / "results.json").write_text('{"headline": [')
    with pytest.raises(SystemExit, match=r"s0/results.json is not valid JSON"):
        stats.aggregate([tmp_path / "s0"])


def test_aggregate_refuses_a_run_listed_twice(tmp_path):
    stats.write_results(tmp_path / "s0", {}, [stats.compare("A vs B", "A", "B", [1, 0], [0, 0])])
    with pytest.raises(SystemExit, match="listed twice"):
        stats.aggregate([tmp_path / "s0", tmp_path / "s0" / "."])  # the same real path spelled twice


def test_vs_chance_with_null_chance_reports_no_test(tmp_path):
    e = stats.vs_chance("A vs ?", "A", [1, 0, 1], 0.5)
    e["chance"] = None
    stats.write_results(tmp_path / "s0", {}, [e])
    (pooled,) = stats.aggregate([tmp_path / "s0"])
    assert math.isnan(pooled["p"]) and pooled["diff"] is None and "no chance level" in pooled["note"]


def test_binomial_p_k_above_n_raises_a_clear_value_error():
    with pytest.raises(ValueError, match="k = 6 successes is not a count out of n = 5"):
        stats.binomial_p(6, 5, 0.5)


def test_all_nan_items_report_nan_p_and_n_zero():
    e = stats.compare("A vs B", "A", "B", [float("nan")] * 3, [1, 0, 1])
    c = stats.vs_chance("A vs coin", "A", [float("nan"), None], 0.5)
    for x in (e, c):
        assert math.isnan(x["p"]) and x["n_items"] == 0 and "n = 0" in x["note"]
    assert "[no finite paired item (n = 0)" in stats.format_headline([e])


def test_aggregate_keeps_which_claims_are_primary(tmp_path):
    """The README shows a run's primary claims (results_markdown); pooling seeds must not drop the mark."""
    for k in (0, 1):
        stats.write_results(tmp_path / f"s{k}", {}, [stats.compare("main", "A", "B", [1, 0], [0, 0], primary=True),
                                                     stats.vs_chance("side", "A", [1, 0], 0.5)])
    pooled = {e["claim"]: e for e in stats.aggregate([tmp_path / "s0", tmp_path / "s1"])}
    assert pooled["main"]["primary"] is True and pooled["side"]["primary"] is False
    assert pooled["main"]["n_items"] == 4


def test_sign_flip_mde_is_nan_where_the_test_cannot_reject():
    """Five units (five seeds as the unit): every sign agreeing gives p = 2/32 = 0.0625 > 0.05, so no effect
    is detectable and the mde is nan with a note saying why; six units reach p = 1/32 and get the formula."""
    five = stats.compare("within vs cross", "w", "c", [0.4, 0.5, 0.6, 0.5, 0.45], [0.1] * 5)
    assert five["p"] == pytest.approx(0.0625) and five["mde"] is None and "cannot reject" in five["note"]
    six = stats.compare("within vs cross", "w", "c", [0.4, 0.5, 0.6, 0.5, 0.45, 0.55], [0.1] * 6)
    assert six["p"] == pytest.approx(1 / 32) and six["mde"] > 0 and six["note"] is None
    assert math.isnan(stats.sign_flip_mde(np.ones(5) * 0.3 + np.arange(5) * 0.01))
    assert stats.vs_chance("x", "a", [0.9, 0.8, 0.7], 0.5)["mde"] is None  # 3 non-binary units: sign flip


def test_projected_mde_is_the_paired_formula_at_the_entrys_item_spread():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 60).astype(float), rng.integers(0, 2, 60).astype(float)
    e = stats.compare("A vs B", "A", "B", a, b, paper_effect=0.01, primary=True)
    sd = float(np.std(a - b, ddof=1))
    assert stats.projected_mde(e, 700) == pytest.approx(stats.mde(700, sd=sd))
    assert stats.projected_mde(e, 60) == pytest.approx(e["mde"])  # at its own n it is the entry's mde
    # four times the items halve it; a vs-chance entry uses a_i − chance
    assert stats.projected_mde(e, 2800) == pytest.approx(stats.projected_mde(e, 700) / 2)
    c = stats.vs_chance("A vs chance", "A", list(a) + [None], 0.3)
    assert stats.projected_mde(c, 100) == pytest.approx(stats.mde(100, sd=float(np.std(a - 0.3, ddof=1))))
    assert stats.projected_mde(stats.vs_chance("x", "A", [1.0, 0.0], None), 100) is None  # no chance level
    assert stats.projected_mde(stats.compare("y", "A", "B", [1.0], [0.0]), 100) is None  # one item: no sd


def test_format_power_scales_a_seeds_n_and_says_whether_the_paper_effect_is_reachable(tmp_path):
    rng = np.random.default_rng(1)
    for k in range(2):
        a, b = rng.integers(0, 2, 42).tolist(), rng.integers(0, 2, 42).tolist()
        H = [stats.compare("success: A vs B", "A", "B", a, b, paper_effect=0.0123, primary=True),
             stats.compare("not primary", "A", "B", a, b, paper_effect=0.5)]
        stats.write_results(tmp_path / f"s{k}", {}, H)
    pooled = stats.aggregate([tmp_path / "s0", tmp_path / "s1"])
    text = stats.format_power(pooled, 100 / 6)
    assert "not primary" not in text and "n = 700," in text  # 84 items over 2 seeds → 42 per seed × 100/6
    assert "cannot power the paper's effect" in text  # 0.0123 ≪ (z_a + z_b)·sd/√700 for coin flips
    big = [dict(pooled[0], paper_effect=0.9)]
    assert "; powers the paper's effect" in stats.format_power(big, 100 / 6)


def test_table_estimates_the_other_cpu_class_from_the_measured_class_ratio(tmp_path):
    """#48 "state an estimate, and label it as one": TABLE.md divides the seeds' wall seconds by the class ratios
    in results/bench/class_ratio-*.json (bench/class_ratio.py), fastest ÷ highest to slowest ÷ lowest, and says
    it is not measured; no ratio from the run's class, or a broken file, gives no estimate and no error."""
    bench = tmp_path / "results" / "bench"
    bench.mkdir(parents=True)
    prov = {"device": {"class": "no native bf16"}}
    rows = [["grpo", 173.0, 168.0, 1.03], ["skill_entropy", 497.0, 400.0, 1.24], ["bad", 1, 0, "nan"]]
    (bench / "class_ratio-no-native-bf16.json").write_text(json.dumps(
        {"script": "class_ratio", "columns": ["run", "a", "b", "ratio"], "rows": rows, "provenance": prov,
         "other_class": "avx512_bf16"}))
    (bench / "class_ratio-broken.json").write_text("{not json")
    (bench / "class_ratio-odd.json").write_text(json.dumps({"rows": [[1, 2, 3, 2.0]], "provenance": None,
                                                            "other_class": ["x"]}))
    ratios = stats.class_ratios(tmp_path / "results")
    assert ratios == {("no native bf16", "avx512_bf16"): (1.03, 1.24, "class_ratio-no-native-bf16.json")}
    j = {"runs": ["seed0", "seed1"], "headline": [], "commits": ["abc"], "cpu_class": ["no native bf16"],
         "wall_s": [434.6, 620.0, None]}
    line = stats.time_estimate(j, ratios)
    # 434.6 / 1.24 = 350.5, 620 / 1.03 = 601.9
    assert "Estimated on avx512_bf16, not measured there: 350–602 s per seed (wall ÷ 1.03–1.24" in line
    assert "../../bench/class_ratio-no-native-bf16.json" in line
    table = stats.run_table(tmp_path / "results" / "toy" / "tiny" / "aggregate.json", j, ratios)
    assert "wall 435–620 s per seed. Estimated on avx512_bf16" in table
    for other in ({**j, "cpu_class": ["avx512_bf16"]}, {**j, "wall_s": [None]}, {**j, "wall_s": "x"}):
        assert stats.time_estimate(other, ratios) == ""
    assert stats.time_estimate(j, {}) == "" and "Estimated" not in stats.run_table(
        tmp_path / "results" / "toy" / "tiny" / "aggregate.json", j)


def test_class_ratio_bench_times_a_commit_and_writes_the_ratio_stats_reads(tmp_path):
    """bench/class_ratio.py end to end on a throwaway repository whose one 'run' sleeps 1 s: it exports the
    commit, times `python <run>.py --preset tiny`, divides by the recorded figure and writes what
    stats.class_ratios reads; on the recorded class itself it writes nothing."""
    import sys

    from conftest import run_group
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "toy.py").write_text("import sys, time\nassert sys.argv[1:3] == ['--preset', 'tiny']\ntime.sleep(1)\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for cmd in (["init", "-q"], ["add", "toy.py"], ["commit", "-q", "-m", "toy"]):
        run_group(git + cmd, check=True, timeout=60)
    script = str(stats.Path(stats.__file__).parent / "bench" / "class_ratio.py")
    cls = stats.provenance()["device"]["class"]
    base = [sys.executable, script, "--repo", str(repo), "--commit", "HEAD", "--runs", "toy", "--recorded",
            "toy=0.5", "--out", str(tmp_path / "results" / "bench")]
    out = run_group(base + ["--recorded-class", "other class"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (path,) = (tmp_path / "results" / "bench").glob("class_ratio-*.json")
    j = json.loads(path.read_text())
    assert j["other_class"] == "other class" and j["rows"][0][0] == "toy" and 1.0 <= j["rows"][0][1] < 30
    assert j["rows"][0][3] >= 2.0 and abs(j["rows"][0][3] - j["rows"][0][1] / 0.5) < 0.15  # rows are rounded
    assert stats.class_ratios(tmp_path / "results") == {(cls, "other class"): (j["rows"][0][3],) * 2 + (path.name,)}
    path.unlink()
    out = run_group(base + ["--recorded-class", cls], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "nothing to estimate" in out.stdout
    assert not list((tmp_path / "results" / "bench").glob("*.json"))
