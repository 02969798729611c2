"""Check that nothing was lost when BENCHMARKS.md's dated sections moved here.

    python benchmarks/history/check_moved.py [REV]

Every non-empty line of BENCHMARKS.md at REV (default a7b2e31, the last commit of
the long page) must appear in BENCHMARKS.md or in a file of benchmarks/history/.
Links are compared after the one rewrite the move made: `](benchmarks/` became
`](../` in the history files. Prints the lines that are missing; exit 1 if any.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG_PAGE_REV = "a7b2e317aa0d061b4be56e4979c7d9d213a90c42"


def normalized(line: str) -> str:
    return re.sub(r"\]\(\.\./", "](benchmarks/", line.strip())


def missing_lines(old_text: str, new_texts: list[str]) -> list[str]:
    """The non-empty lines of old_text found in none of new_texts."""
    present = {normalized(line) for text in new_texts for line in text.splitlines()}
    return [
        line for line in old_text.splitlines() if line.strip() and normalized(line) not in present
    ]


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else LONG_PAGE_REV
    old = subprocess.run(
        ["git", "show", f"{rev}:BENCHMARKS.md"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    files = [ROOT / "BENCHMARKS.md", *sorted((ROOT / "benchmarks" / "history").glob("*.md"))]
    lost = missing_lines(old, [f.read_text() for f in files])
    for line in lost:
        print(line)
    print(f"{len(old.splitlines())} lines at {rev[:7]}, {len(lost)} not found", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
