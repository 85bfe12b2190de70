"""The complexity gate (scripts/complexity_gate.py): radon's count, boolean operators included, against LIMIT."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.complexity_gate import LIMIT, main, over_limit, score_source, score_tree

# One `if` whose condition is a chain of 24 `or`s, a loop and a comprehension with a condition. By hand:
# radon counts 1 + 1 (if) + 24 (or) + 1 (for) + 1 (the comprehension) + 1 (its `if`) = 29;
# mccabe (ruff's C90) counts 1 + 1 (if) + 1 (for) = 3, the `or`s and the comprehension left out.
CHECKS = 25
HOSTILE = f'''
def check(header):
    if {" or ".join(f"header[{i}] < 0" for i in range(CHECKS))}:
        raise ValueError("negative")
    for value in header:
        print(value)
    return [v for v in header if v]


def small(x):
    return x and 1
'''


def test_boolean_operators_count_so_a_long_or_chain_fails_the_gate(tmp_path: Path):
    scored = {s.name: s.score for s in score_source(HOSTILE)}
    assert scored == {"check": 1 + 1 + (CHECKS - 1) + 1 + 1 + 1, "small": 2}
    assert [s.name for s in over_limit(score_source(HOSTILE))] == ["check"]

    # ruff's mccabe, at the project's own max-complexity of 10, lets the same function through
    source = tmp_path / "hostile.py"
    source.write_text(HOSTILE)
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "C901",
                           "--config", "lint.mccabe.max-complexity=10", str(source)],
                          capture_output=True, text=True)
    assert ruff.returncode == 0, ruff.stdout
    strict = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "C901",
                             "--config", "lint.mccabe.max-complexity=2", str(source)],
                            capture_output=True, text=True)
    assert "`check` is too complex (3 > 2)" in strict.stdout


def test_methods_and_closures_are_scored_on_their_own():
    source = '''
class Outer:
    def method(self, a, b):
        return a or b

    class Inner:
        def deep(self, a):
            if a:
                return 1
            return 0


def parent(a):
    def closure(b):
        return a and b and b
    return closure
'''
    assert [(s.name, s.score) for s in score_source(source)] == [
        ("Outer.method", 2), ("Inner.deep", 2), ("parent", 1), ("closure", 3)]


def test_the_gate_lists_each_function_above_the_limit(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "hostile.py").write_text(HOSTILE)
    scored = score_tree(["pkg"], root=tmp_path)
    assert [(s.file, s.line, s.name) for s in over_limit(scored)] == [("pkg/hostile.py", 2, "check")]
    assert over_limit(scored, limit=29) == []


def test_planner_and_runtime_pass_the_gate(capsys):
    """What .ci/run runs: every function of planner/ and runtime/ within LIMIT."""
    assert main([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.startswith("complexity gate: ") and f"all at most {LIMIT}" in out
