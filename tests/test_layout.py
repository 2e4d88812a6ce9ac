"""The layout of issue #47: each paper script reads as the paper, over a ~500-line grpo.py, with its world in
tasks/. Checked here: sizes, the role count against the README's Layout table, header length, argument counts,
line width, no timings in docstrings, and data/ scripts that import worlds, never a paper script."""
import ast
import re
from pathlib import Path

import pytest

import roles

ROOT = roles.ROOT
PAPERS = roles.PAPERS
CORE = ["grpo.py", "plumbing.py", "stats.py"] + PAPERS + [str(p.relative_to(ROOT)) for p in (ROOT / "tasks").glob("*.py")]


@pytest.mark.parametrize("name", PAPERS)
def test_paper_script_is_mostly_the_method(name):
    c = roles.role_counts(ROOT / name)
    n = sum(c.values())
    assert n <= 1000, f"{name}: {n} lines"
    assert c["method"] >= 0.5 * n, f"{name}: method {c['method']} of {n} lines ({c})"
    assert c["world"] == 0, f"{name}: {c['world']} lines of world code belong in tasks/"


def test_grpo_is_the_cards_grpo():
    assert len((ROOT / "grpo.py").read_text().splitlines()) <= 560


def test_readme_layout_table_is_the_role_count():
    assert roles.readme_block() in (ROOT / "README.md").read_text(), "run: python tests/roles.py --readme"


@pytest.mark.parametrize("name", PAPERS)
def test_header_is_short_and_lists_the_differences(name):
    doc = ast.get_docstring(ast.parse((ROOT / name).read_text()))
    assert len(doc.splitlines()) <= 40
    assert "Differences from the paper" in doc
    assert (ROOT / "docs" / name.replace(".py", ".md")).exists()


@pytest.mark.parametrize("name", PAPERS)
def test_no_function_takes_more_than_eight_parameters(name):
    for node in ast.walk(ast.parse((ROOT / name).read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            assert n <= 8, f"{name}: {node.name} takes {n} parameters"


@pytest.mark.parametrize("name", CORE)
def test_lines_are_at_most_110_characters(name):
    long = [i + 1 for i, line in enumerate((ROOT / name).read_text().splitlines()) if len(line) > 110]
    assert not long, f"{name}: lines {long[:10]} are over 110 characters"


SECONDS = re.compile(r"\b\d+(?:\.\d+)?\s*(?:s|sec|seconds|min|minutes)\b(?! ?(?:timeout|limit|budget))")


@pytest.mark.parametrize("name", ["grpo.py"] + PAPERS)
def test_docstrings_and_preset_comments_name_no_measured_time(name):
    """Measured timings live in the README; a docstring or a comment that says '~25 min' goes stale."""
    tree = ast.parse((ROOT / name).read_text())
    docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))]
    comments = [line.split("#", 1)[1] for line in (ROOT / name).read_text().splitlines() if "#" in line]
    for text in docs + comments:
        for m in SECONDS.finditer(text):
            ctx = text[max(0, m.start() - 60):m.end() + 30]
            assert re.search(r"timeout|limit|budget|cap|at most|wall clock|--", ctx), f"{name}: {ctx!r}"


@pytest.mark.parametrize("path", sorted((ROOT / "data").glob("*/*.py")), ids=lambda p: p.name)
def test_data_scripts_import_worlds_never_a_paper_script(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {p[:-3] for p in PAPERS}, f"{path} imports a paper script"
