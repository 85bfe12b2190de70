"""The complexity gate .ci/run runs: every function and method under planner/ and runtime/ at most LIMIT.

Cyclomatic complexity as radon counts it (radon.complexity.cc_visit): one, plus one per branch (if, loop,
except, each case of a match), plus one per boolean operator (`a and b or c` adds two) and per condition of a
comprehension. ruff's C90 (mccabe) leaves the boolean operators out, so a validation written as one long
`or` of checks passes it at any length; radon sees each of them. Nested functions are scored on their own, as
radon scores them (a closure's branches are not added to its parent's).

    python scripts/complexity_gate.py [PATH ...]   (default: planner runtime)

Exit 0 with a one-line summary when every function is within LIMIT; exit 1 listing `file:line name score`
for each one above it.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

# radon's ranks A-C (1-20) pass; D (21-30), E (31-40) and F (41+) fail
LIMIT = 20
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = ("planner", "runtime")


@dataclass(frozen=True)
class Scored:
    """One function or method and radon's cyclomatic complexity for it."""

    file: str
    line: int
    name: str
    score: int


def _functions(blocks: Iterable[Function | Class]) -> Iterator[Function]:
    """Every function among radon's blocks once: top-level functions and methods (the blocks list both, each
    class followed by its methods), closures, and the methods of nested classes (the blocks leave them out)."""
    for block in blocks:
        if isinstance(block, Class):
            for inner in block.inner_classes:
                yield from _functions([inner, *inner.methods])
        else:
            yield block
            yield from _functions(block.closures)


def score_source(source: str, file: str = "<source>") -> list[Scored]:
    """radon's complexity of each function and method in one module's source, in line order."""
    scored = [Scored(file, f.lineno, f.fullname, f.complexity) for f in _functions(cc_visit(source))]
    return sorted(scored, key=lambda s: s.line)


def over_limit(scored: Iterable[Scored], limit: int = LIMIT) -> list[Scored]:
    """The functions whose complexity is above `limit`, worst first."""
    return sorted((s for s in scored if s.score > limit), key=lambda s: (-s.score, s.file, s.line))


def score_tree(paths: Iterable[str | Path], root: Path = ROOT) -> list[Scored]:
    """Every function of every .py file under `paths` (relative to `root`), named by its path under `root`."""
    scored: list[Scored] = []
    for path in paths:
        base = root / path
        for file in sorted(base.rglob("*.py")) if base.is_dir() else [base]:
            name = file.relative_to(root).as_posix()
            scored.extend(score_source(file.read_text(encoding="utf-8"), name))
    return scored


def main(argv: list[str]) -> int:
    scored = score_tree(argv or DEFAULT_PATHS)
    failing = over_limit(scored)
    for s in failing:
        print(f"{s.file}:{s.line} {s.name} {s.score}")
    if failing:
        print(f"complexity gate: {len(failing)} of {len(scored)} functions above {LIMIT} (radon cc, "
              "boolean operators counted): split them", file=sys.stderr)
        return 1
    worst = max(scored, key=lambda s: s.score, default=None)
    top = f"; highest {worst.score} ({worst.file}:{worst.line} {worst.name})" if worst else ""
    print(f"complexity gate: {len(scored)} functions, all at most {LIMIT}{top}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
