"""Bar charts of benchmark summaries (matplotlib is optional: no plot without it)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import stats


def bar_chart(
    path: Path,
    title: str,
    ylabel: str,
    groups: list[str],
    series: dict[str, list],
    *,
    log: bool = False,
    hlines: dict[str, float] | None = None,
) -> str | None:
    """Grouped bars: one group per x label, one bar per series (None = missing).
    `hlines` draws labelled reference lines (ceilings)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the RLlib venv has no matplotlib; plots are optional there
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(series)) / 2), 4.2))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        for bar, v in zip(bars, values):
            if v is not None:
                ax.annotate(
                    _short(v),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    for j, (label, y) in enumerate((hlines or {}).items()):
        if y:
            ax.axhline(y, linestyle="--", linewidth=1, color=f"C{len(series) + j}", label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def count_chart(
    path: Path,
    title: str,
    ylabel: str,
    summary: list[dict],
    value: str,
    count: tuple[str, str],
    series: dict[str, dict],
) -> str | None:
    """`bar_chart` of the summary's `value`, a group per count (count: the rows' key
    and its unit, e.g. ("callers", "callers")), a bar per series: label -> the keys
    of its rows."""
    key, unit = count
    counts = sorted({r[key] for r in summary if r.get(key)})
    bars = {
        label: [stats.find(summary, value, **match, **{key: n}) for n in counts]
        for label, match in series.items()
    }
    return bar_chart(path, title, ylabel, [f"{n} {unit}" for n in counts], bars)


def _short(v: float) -> str:
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.2g}"
