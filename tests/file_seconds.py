"""Writes tests/file_seconds.json: each test file's seconds (its tests' last measured
setup, call and teardown, summed), from this machine's record of every run
(conftest.TEST_SECONDS). CI starts on a clean machine with no record: the scheduler
then orders files by these sums, so the longest files still start first. Refresh it
after a `make test` and a `make test-slow`:

    .venv/bin/python tests/file_seconds.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
OUT = TESTS / "file_seconds.json"


def collected_ids() -> list[str]:
    """Every test id of both groups, as pytest names them from the repository root."""
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.strip() for line in listing.splitlines() if "::" in line]


def main() -> int:
    sys.path.insert(0, str(TESTS))
    from conftest import TEST_SECONDS, recorded_test_seconds

    recorded = recorded_test_seconds()
    if not recorded:
        print(f"no test seconds recorded in {TEST_SECONDS}: run the tests first", file=sys.stderr)
        return 1
    files: dict[str, float] = {}
    for test in collected_ids():
        if test in recorded:
            file = test.split("::")[0]
            files[file] = files.get(file, 0.0) + recorded[test]
    OUT.write_text(json.dumps({f: round(s, 1) for f, s in sorted(files.items())}, indent=0) + "\n")
    print(f"{len(files)} files, {sum(files.values()):.0f} s in all -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
