"""No two library modules share a file name (issue 41): a name says which module it is without its package.
The CLI's command modules (planner/cli) are named after their commands and are left out."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def library_modules() -> list[Path]:
    found = [p for top in ("planner", "runtime") for p in (ROOT / top).rglob("*.py")]
    return [p for p in found if p.name != "__init__.py" and (ROOT / "planner" / "cli") not in p.parents]


def test_the_walk_finds_the_library():
    names = {p.relative_to(ROOT).as_posix() for p in library_modules()}
    assert "planner/api/calls.py" in names and "runtime/ggml/graph.py" in names
    assert not any(n.startswith("planner/cli/") or n.endswith("__init__.py") for n in names)


def test_no_two_library_modules_share_a_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in library_modules():
        by_name[p.name].append(p.relative_to(ROOT).as_posix())
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}
