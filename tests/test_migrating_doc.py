"""docs/migrating.md keeps every behaviour RLlib's own unit tests found different
(issue 46), each with a resolution and a reason, so that none drops out."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
SECTION = "## Behaviours RLlib's own unit tests found different"
RESOLUTIONS = ("aligned", "kept", "switch, default kept")
# one per deviation: text its row's first cell starts with
DEVIATIONS = (
    "V-trace input rank",
    "squashed Gaussian log-probability",
    "squashed Gaussian clamps",
    "diagonal Gaussian `log_std`",
    "SAC critic loss",
    "`MeanStdFilter.sync`",
    "`NoFilter` on what is not an array",
    "replay `sample(n)`",
    "`GaussianNoise` defaults",
    "OU noise state advance",
    "GTrXL memory",
    "complex-input network and `vf_share_layers`",
    "multi-agent `truncateds`",
    "multi-agent `t`",
    "multi-agent reward before the first observation",
)


def deviation_rows() -> dict[str, list[str]]:
    """First cell -> the row's cells, from the section's table."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| ---") or line.startswith("| deviation"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").replace(r"\|", "¦").split("|")]
        rows[cells[0]] = cells
    return rows


def test_every_deviation_is_listed_with_rllibs_behaviour_ours_a_resolution_and_why():
    rows = deviation_rows()
    for name in DEVIATIONS:
        matches = [cells for first, cells in rows.items() if first.startswith(name)]
        assert len(matches) == 1, f"{name!r}: {len(matches)} rows in {sorted(rows)}"
        cells = matches[0]
        assert len(cells) == 5, (name, cells)
        deviation, rllib, ours, resolution, why = cells
        assert rllib and ours and why, (name, cells)
        assert resolution in RESOLUTIONS, (name, resolution)


def test_the_table_holds_no_row_this_test_does_not_know():
    """A new row gets its keyword above, so it cannot drop out unnoticed either."""
    unknown = [first for first in deviation_rows() if not first.startswith(DEVIATIONS)]
    assert unknown == []
