"""The README stays a map a newcomer can use (issue #16): short, with a table of contents, no copies of
the scripts' differences lists, and every function its equation tables name exists in the script."""
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
SECTIONS = {"grpo": "## grpo.py", "skill_entropy": "## Skill Entropy", "skill_rm": "## Skill-RM",
            "skill_selfplay": "## Skill Self-Play", "talentrl": "## TalentRL"}


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
def test_differences_live_in_the_script_docstring_only(mod):
    doc = importlib.import_module(mod).__doc__
    assert "Differences from the paper" in doc
    items = re.findall(r"^\s*(\d+)\. (.{30,}?)$", doc.split("Differences from the paper", 1)[1], re.M)
    assert len(items) >= 3
    for _, text in items:  # no item of the list is copied into the README
        assert text.strip() not in README, text


@pytest.mark.parametrize("mod", list(SECTIONS))
def test_equation_tables_name_functions_that_exist(mod):
    """In each section's equation → code table (header 'paper', 'paper mechanism' or 'equation'), every
    backticked identifier of the code column is an attribute of the script or of grpo / plumbing / sandbox."""
    modules = [importlib.import_module(m) for m in (mod, "grpo", "plumbing", "sandbox")]
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
            found = any(hasattr(m, obj[-1]) if len(obj) == 1 or obj[0] == m.__name__ else False for m in modules)
            if len(obj) == 2 and not found:  # Class.attr
                found = any(hasattr(getattr(m, obj[0], None), obj[1]) for m in modules)
            assert found, f"README {SECTIONS[mod]}: `{name}` is not in {mod}.py, grpo.py, plumbing.py or sandbox.py"
            checked += 1
    assert checked >= 8, f"{mod}: only {checked} names checked"
