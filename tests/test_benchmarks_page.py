"""BENCHMARKS.md stays the short page a user reads, and its history stays whole.

Each row of "Current figures" has a date and the command that refreshes it; the page
is at most 150 lines; every line of the long page it replaced is kept in
benchmarks/history/ (benchmarks/history/check_moved.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "BENCHMARKS.md"


def figure_rows(text: str) -> list[list[str]]:
    """The rows of the first table under "## Current figures", as lists of cells."""
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header, rows = rows[0], rows[2:]
    assert [c.strip() for c in header.strip("|").split("|")][-2:] == ["measured", "command"]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def test_the_page_is_short():
    assert len(PAGE.read_text().splitlines()) <= 150


def test_every_figure_has_a_date_a_goal_and_a_command():
    rows = figure_rows(PAGE.read_text())
    assert len(rows) >= 10
    for row in rows:
        workload, measured, command = row[0], row[-2], row[-1]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", measured), workload
        assert command.startswith("`") and len(command) > 8, workload


def test_every_history_file_is_listed_on_the_page():
    text = PAGE.read_text()
    files = sorted(p.name for p in (REPO / "benchmarks" / "history").glob("*.md"))
    assert files
    assert [name for name in files if f"benchmarks/history/{name}" not in text] == []


def test_nothing_of_the_long_page_was_lost():
    script = REPO / "benchmarks" / "history" / "check_moved.py"
    known = subprocess.run(
        ["git", "cat-file", "-e", "a7b2e317aa0d061b4be56e4979c7d9d213a90c42"],
        cwd=REPO,
        capture_output=True,
    )
    if known.returncode != 0:
        pytest.skip("the long page's commit is not in this clone's history")
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[:2000]
