"""README.md's map matches the tree, it links every docs page, and pages link only inside the repo.

The map is the first fenced block under "## Where things are". A line whose first word
ends in "/" or ".py" names packages or modules: its leading words that end so. A name is
inside the nearest package line above it that is indented less; other lines continue a
description. Every name must exist, and every module and package of `policy_service/` and
`algorithms/` must be named (an `__init__.py` is named by its package).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAPPED_PACKAGES = ("policy_service", "algorithms")
PAGES = [
    "README.md",
    "BENCHMARKS.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks" / "history").glob("*.md")),
]


def map_block(readme: str) -> list[str]:
    section = readme.split("## Where things are", 1)[1]
    return section.split("```", 2)[1].splitlines()[1:]


def _is_name(word: str) -> bool:
    return word.endswith("/") or word.endswith(".py")


def mapped_paths(lines: list[str]) -> list[str]:
    """The repository paths the map names, packages ending in "/"."""
    parents: list[tuple[int, str]] = []  # (indent, path) of the open package lines
    paths = []
    for line in lines:
        words = line.split()
        if not words or not _is_name(words[0]):
            continue
        indent = len(line) - len(line.lstrip())
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prefix = parents[-1][1] if parents else ""
        names = []
        for word in words:
            if not _is_name(word):
                break
            names.append(word)
        paths += [prefix + name for name in names]
        if len(names) == 1 and names[0].endswith("/"):
            parents.append((indent, prefix + names[0]))
    return paths


def tree_paths() -> set[str]:
    """Every package (as "pkg/") and module of the mapped packages, `__init__.py` aside."""
    found = set()
    for root in MAPPED_PACKAGES:
        for path in (REPO / root).rglob("*.py"):
            rel = path.relative_to(REPO)
            if "__pycache__" in rel.parts:
                continue
            found.update(str(Path(*rel.parts[:i])) + "/" for i in range(1, len(rel.parts)))
            if path.name != "__init__.py":
                found.add(str(rel))
    return found


def test_the_map_parses_as_described():
    lines = [
        "a/   the a package",
        "  b.py c.py   two modules",
        "  d/",
        "    e.py",
        "f.py  more",
        "",
    ]
    assert mapped_paths(lines) == ["a/", "a/b.py", "a/c.py", "a/d/", "a/d/e.py", "f.py"]
    assert mapped_paths(["a/  x", "    continued on a line of its own", "  b.py"]) == [
        "a/",
        "a/b.py",
    ]


def test_every_name_in_the_map_exists():
    paths = mapped_paths(map_block((REPO / "README.md").read_text()))
    assert len(paths) > 50
    gone = [p for p in paths if not (REPO / p).exists()]
    assert gone == [], "README.md's map (## Where things are) names what is not in the tree"
    assert len(paths) == len(set(paths)), "a name is given twice"


def test_every_module_and_package_is_in_the_map():
    paths = set(mapped_paths(map_block((REPO / "README.md").read_text())))
    unnamed = sorted(tree_paths() - paths)
    assert unnamed == [], "add these to README.md's map (## Where things are)"


def test_the_readme_links_every_page_of_docs():
    targets = set(_link_targets((REPO / "README.md").read_text()))
    pages = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))
    assert [page for page in pages if page not in targets] == [], "link them in README.md"


def _link_targets(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES)
def test_pages_link_only_inside_the_repository(page):
    """Markdown links resolve to a file or folder of the repository (web addresses and
    anchors aside), and no "../" path in the text leaves the repository."""
    path = REPO / page
    text = path.read_text()
    outside, dangling = [], []
    for target in _link_targets(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        if not resolved.is_relative_to(REPO):
            outside.append(target)
        elif not resolved.exists():
            dangling.append(target)
    for relative in re.findall(r"(?<![.\w])\.\./[\w./-]+", text):
        if not (path.parent / relative).resolve().is_relative_to(REPO):
            outside.append(relative)
    assert (outside, dangling) == ([], [])
