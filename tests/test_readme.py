"""The README stays a map a newcomer can use (issue #16): short, with a table of contents, no copies of
the scripts' differences lists, and every function its equation tables name exists in the script."""
import importlib
import json
import os
import re
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
SECTIONS = {"grpo": "## grpo.py", "skill_entropy": "## Skill Entropy", "skill_rm": "## Skill-RM",
            "skill_selfplay": "## Skill Self-Play", "talentrl": "## TalentRL"}
WORLDS = ["tasks." + p[:-3] for p in sorted(os.listdir(os.path.join(ROOT, "tasks")))
          if p[0] != "_" and p.endswith(".py")]


def _section(title):
    start = README.index("\n" + title) + 1
    nxt = README.find("\n## ", start + 1)
    return README[start:nxt if nxt > 0 else len(README)]


def test_readme_is_short_and_has_a_table_of_contents():
    assert len(README.splitlines()) <= 560  # 500 until issue #23's memory plan and GPU section
    assert "## Contents" in README
    for title in SECTIONS.values():
        assert title in README


@pytest.mark.parametrize("mod", [m for m in SECTIONS if m != "grpo"])
def test_differences_live_in_the_docstring_and_docs_only(mod):
    """The script's header names the differences that matter most (at most 8); docs/<script>.md has them all.
    Neither list is copied into the README."""
    doc = importlib.import_module(mod).__doc__
    full = open(os.path.join(ROOT, "docs", mod + ".md")).read()
    for text in (doc, full):
        assert "Differences from the paper" in text
    head = re.findall(r"^\s*(\d+)\. (.{30,}?)$", doc.split("Differences from the paper", 1)[1], re.M)
    items = re.findall(r"^\s*(\d+)\. (.{30,}?)$", full.split("Differences from the paper", 1)[1], re.M)
    assert 3 <= len(head) <= 8 and len(items) >= len(head)
    for _, text in head + items:  # no item of either list is copied into the README
        assert text.strip() not in README, text


@pytest.mark.parametrize("mod", list(SECTIONS))
def test_equation_tables_name_functions_that_exist(mod):
    """In each section's equation → code table (header 'paper', 'paper mechanism' or 'equation'), every
    backticked identifier of the code column is an attribute of the script, of grpo / plumbing / sandbox /
    stats, or of a world in tasks/."""
    modules = [importlib.import_module(m) for m in [mod, "grpo", "plumbing", "sandbox", "stats"] + WORLDS]
    in_table, checked = False, 0
    for line in _section(SECTIONS[mod]).splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not in_table:
            in_table, is_eq = True, cells[0] in ("paper", "paper mechanism", "equation")
            continue
        if not is_eq or set(cells[0]) <= set("-: "):
            continue
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", cells[-1]):
            obj = name.split(".")
            found = any(hasattr(m, obj[-1]) for m in modules
                        if len(obj) == 1 or obj[0] == m.__name__.rsplit(".", 1)[-1])
            if len(obj) == 2 and not found:  # Class.attr
                found = any(hasattr(getattr(m, obj[0], None), obj[1]) for m in modules)
            assert found, f"README {SECTIONS[mod]}: `{name}` is in none of {mod}.py and the shared modules"
            checked += 1
    assert checked >= 8, f"{mod}: only {checked} names checked"


@pytest.mark.parametrize("mod", list(SECTIONS))
def test_read_in_this_order_names_functions_that_exist(mod):
    """Each section's "Read in this order" paragraph (issue #47) names the functions a newcomer reads first:
    every backticked name in it is a function or class of the script, the shared modules or tasks/."""
    text = _section(SECTIONS[mod])
    assert "**Read in this order**" in text
    para = text.split("**Read in this order**", 1)[1].split("\n\n", 1)[0]
    modules = [importlib.import_module(m) for m in [mod, "grpo", "plumbing", "stats"] + WORLDS]
    names = [n for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", para) if not n.endswith(".py")]
    assert len(names) >= 6
    for name in names:
        head, _, attr = name.partition(".")
        found = [m for m in modules if hasattr(m, head)]
        assert found and (not attr or hasattr(getattr(found[0], head), attr)), f"{mod}: `{name}` not found"


def test_readme_results_block_is_generated_from_results_dir():
    """#48 §4: the README's results block and every results/<run>/<preset>/TABLE.md are exactly what
    `make results-table` makes from results/."""
    import stats
    for path, text in stats.generated(os.path.join(ROOT, "README.md"), os.path.join(ROOT, "results")).items():
        assert os.path.exists(path) and open(path).read() == text, f"{path}: run `make results-table`"


def test_results_block_follows_one_number_in_results(tmp_path):
    """Two seeds pooled into aggregate.json, then one item of one seed changed and pooled again: the generated
    files differ, so the test above fails whenever results/ and the README disagree by one number. The README
    shows the primary claims only; TABLE.md every claim."""
    import shutil

    import stats
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{stats.RESULTS_BEGIN}\nold\n{stats.RESULTS_END}\nrest\n")
    for k, items in ((0, [1.0, 0.0, 1.0, 1.0]), (1, [1.0, 1.0, 0.0, 1.0])):
        entries = [stats.vs_chance("toy accuracy", "policy", items, 0.5, primary=True),
                   stats.vs_chance("toy side claim", "policy", items[::-1], 0.25)]
        stats.write_results(tmp_path / "runs" / f"seed{k}", {}, entries)
    run_dirs = [str(tmp_path / "runs" / f"seed{k}") for k in (0, 1)]
    out = tmp_path / "results" / "toy" / "tiny" / "aggregate.json"
    stats.aggregate_main(run_dirs, out)
    before = stats.generated(readme, tmp_path / "results")
    block = before[str(readme)]
    assert "| toy (tiny) | 2 |" in block and "| toy accuracy (policy vs " in block and "| 8 |" in block
    assert "toy side claim" not in block and block.startswith("intro\n") and block.endswith("rest\n")
    assert "toy side claim" in before[str(out.parent / "TABLE.md")]  # 4 items × 2 seeds pooled
    seed1 = tmp_path / "runs" / "seed1" / "results.json"
    seed1.write_text(seed1.read_text().replace("1.0", "0.0", 1))
    stats.aggregate_main(run_dirs, out)
    assert stats.generated(readme, tmp_path / "results") != before
    if os.path.isdir(os.path.join(ROOT, "results")):  # and the committed files move with committed results
        shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "committed")
        for agg in sorted((tmp_path / "committed").glob("*/*/aggregate.json")):
            j = json.loads(agg.read_text())
            j["headline"][0]["mean_a"] = (j["headline"][0]["mean_a"] or 0) + 1
            agg.write_text(json.dumps(j))
            now = stats.generated(os.path.join(ROOT, "README.md"), tmp_path / "committed")
            table = open(os.path.join(ROOT, "results", *agg.parts[-3:-1], "TABLE.md")).read()
            readme_now, table_now = now[os.path.join(ROOT, "README.md")], now[str(agg.parent / "TABLE.md")]
            assert readme_now != README or table_now != table


def test_bench_block_is_generated_from_results_bench_and_follows_one_number(tmp_path):
    """#48 §4 for speed: the README's bench block is made from results/bench/*.json (bench scripts' --out, via
    stats.write_bench), names the command, CPU class and commit, and changes when one cell there changes."""
    import stats
    assert stats.BENCH_BEGIN in README and stats.BENCH_END in README  # the real README has the block
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{stats.RESULTS_BEGIN}\n{stats.RESULTS_END}\nb\n{stats.BENCH_BEGIN}\nold\n{stats.BENCH_END}\nc\n")
    path = stats.write_bench(tmp_path / "results" / "bench", "bench_toy", ["new tokens", "ours s/step"],
                             [[32, "1.50"]], "toy set-up.")
    assert path.parent == tmp_path / "results" / "bench" and path.name.startswith("bench_toy-")
    text = stats.generated(readme, tmp_path / "results")[str(readme)]
    assert "| new tokens | ours s/step |\n|---|---|\n| 32 | 1.50 |" in text and "toy set-up." in text
    assert "old" not in text and text.startswith("a\n") and text.endswith("c\n")
    j = json.loads(path.read_text())
    assert j["provenance"]["command"] and f"commit {j['provenance']['git']['commit']}" in text
    j["rows"][0][1] = "1.51"
    path.write_text(json.dumps(j))
    assert "| 32 | 1.51 |" in stats.generated(readme, tmp_path / "results")[str(readme)]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_evidence_runs_each_seed_once_and_tool_calls_versus_unguided(tmp_path):
    """`make evidence` (#48 §3, #52) with a stand-in interpreter that records its arguments and leaves a
    results.json in --run-dir (the Makefile's own loop is what runs): per seed, tool calls run unguided first and
    then Skill-SP --versus it, both with the seed's --data-seed; zebra runs Skill-SP alone; a finished seed is
    skipped, an interrupted one resumes, and each run pools its seeds. PAPERS=skill_selfplay means both families."""
    from conftest import run_group
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "python"
    fake.write_text('#!/bin/bash\necho "$@" >> calls.log\nprev=""\nfor a in "$@"; do\n'
                    '  if [ "$prev" = --run-dir ]; then mkdir -p "$a"; echo \'{"headline": []}\' > "$a/results.json"; fi\n'
                    '  prev=$a\ndone\n')
    fake.chmod(0o755)
    make = ["make", "-s", "-f", os.path.join(ROOT, "Makefile"), "-C", str(tmp_path), f"BIN={tmp_path / 'bin'}",
            "-o", "install", "-o", "results-table", "evidence", "PAPERS=skill_selfplay"]  # = :tool :zebra
    out = run_group(make + ["SEEDS=0 1"], capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    runs = [c for c in calls if "--run-dir" in c]
    tool = "skill_selfplay.py --preset tiny --family tool --data-seed {k}"
    assert runs[:2] == [tool.format(k=0) + " --unguided --no-plots --seed 0 --run-dir "
                        "runs/evidence/skill_selfplay-tool/seed0-unguided",
                        tool.format(k=0) + " --versus runs/evidence/skill_selfplay-tool/seed0-unguided --seed 0 "
                        "--run-dir runs/evidence/skill_selfplay-tool/seed0"], out.stderr
    assert len(runs) == 6 and runs[4].endswith("--family zebra --data-seed 0 --seed 0 --run-dir "
                                               "runs/evidence/skill_selfplay-zebra/seed0")
    assert (tmp_path / "results/skill_selfplay-tool/tiny/seed1/unguided.json").exists()
    assert "stats.py --aggregate results/skill_selfplay-tool/tiny/seed0 results/skill_selfplay-tool/tiny/seed1 " \
           "--out results/skill_selfplay-tool/tiny/aggregate.json" in calls
    (tmp_path / "calls.log").unlink()
    (tmp_path / "results/skill_selfplay-tool/tiny/seed1/results.json").unlink()
    (tmp_path / "runs/evidence/skill_selfplay-tool/seed1/results.json").unlink()
    run_group(make + ["SEEDS=0 1"], capture_output=True, text=True, timeout=60)
    runs = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "--run-dir" in c]
    assert runs == [tool.format(k=1) + " --versus runs/evidence/skill_selfplay-tool/seed1-unguided --seed 1 "
                    "--resume --run-dir runs/evidence/skill_selfplay-tool/seed1"]
