"""The role count of the README's Layout table: what share of each paper script is the paper's method.

Every line of a script belongs to the `# ----- title -----` banner above it (lines before the first banner:
the header docstring and imports). A banner's role is its title's first word:

    method: ...     -> method      (the paper's equations, rollouts, credit, training loop)
    main            -> method      (main reads as the paper's algorithm box, stage by stage)
    config ...      -> cli         (flags, presets, argument checks; the header and imports count here too)
    evaluation ...  -> evaluation  (benchmarks, tables, headlines: the paper's experiments)
    plumbing ...    -> plumbing    (run folders, resume, distributed bookkeeping)
    world ...       -> world       (items, checkers, environments: these belong in tasks/)
Any other first word is an error, so a banner says what it holds.

    python tests/roles.py            prints the table
    python tests/roles.py --readme   rewrites the README block between the layout-table markers
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAPERS = ["skill_entropy.py", "skill_rm.py", "skill_selfplay.py", "talentrl.py"]
ROLES = ["method", "world", "evaluation", "cli", "plumbing"]
BANNER = re.compile(r"^# ----- (.+?) -----\s*$")
FIRST_WORD = {"method": "method", "main": "method", "config": "cli", "evaluation": "evaluation", "plumbing": "plumbing", "world": "world"}
BEGIN, END = "<!-- layout-table:begin (python tests/roles.py --readme) -->", "<!-- layout-table:end -->"


def role_counts(path):
    counts, role = dict.fromkeys(ROLES, 0), "cli"
    for line in Path(path).read_text().splitlines():
        if m := BANNER.match(line):
            word = re.split(r"\W", m.group(1).strip().lower())[0]
            if word not in FIRST_WORD:
                raise ValueError(f"{path}: banner {line!r} names no role (first word one of {sorted(FIRST_WORD)})")
            role = FIRST_WORD[word]
        counts[role] += 1
    return counts


def table():
    rows = ["| script | lines | method | world | evaluation | CLI and presets | plumbing |", "|---|---|---|---|---|---|---|"]
    for name in PAPERS:
        c = role_counts(ROOT / name)
        n = sum(c.values())
        rows.append(f"| `{name}` | {n} | " + " | ".join(f"{100 * c[r] / n:.0f} %" for r in ROLES) + " |")
    n = len((ROOT / "grpo.py").read_text().splitlines())
    rows.append(f"| `grpo.py` | {n} | the shared GRPO (§ grpo.py) | | | | |")
    return "\n".join(rows)


def readme_block():
    return f"{BEGIN}\n{table()}\n{END}"


if __name__ == "__main__":
    if "--readme" in sys.argv:
        sys.path.insert(0, str(ROOT))
        from stats import fill_block
        readme = ROOT / "README.md"
        readme.write_text(fill_block(readme.read_text(), BEGIN, END, table() + "\n", "README.md"))
    print(table())
