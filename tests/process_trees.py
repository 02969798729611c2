"""The processes a test started, found from /proc: a command's children (its Ray, a
server's replicas) to kill or inspect, and a session's members (Ray's workers leave
their parent's tree, not its session). Linux only, as the tests are."""

from __future__ import annotations

import os
from pathlib import Path


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command name may hold spaces and ")": the fields follow its last ")"
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone while read
        children.setdefault(parent, []).append(int(stat.parent.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, nearest first."""
    children, found, todo = _children_by_parent(), [], [pid]
    while todo:
        below = children.get(todo.pop(0), [])
        found.extend(below)
        todo.extend(below)
    return found


def process_tree(root: int) -> set[int]:
    """`root` and every process below it."""
    return {root, *descendants(root)}


def session_pids(session: int, marker: bytes = b"") -> list[int]:
    """The processes of a session whose command line holds `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            in_session = os.getsid(int(entry.name)) == session
        except (OSError, ProcessLookupError):
            continue
        if in_session and marker in cmdline:
            pids.append(int(entry.name))
    return pids
