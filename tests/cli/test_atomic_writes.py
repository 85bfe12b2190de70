"""Issue #22 deliverable 5, nothing lost: every file fitplan writes goes through write_atomic, so a
writer SIGKILLed at any moment leaves the old file or the whole new one, and two writers of one path
leave one complete file."""
from __future__ import annotations

import ast
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from planner.system.files import write_atomic

ROOT = Path(__file__).resolve().parents[2]
PLAN = [sys.executable, "-m", "planner.cli", "plan", "example:gemma3-270m", "--device", "CUDA0=8GiB", "--ram", "16GiB"]
OLD = "old: true\n"


def _complete_plan(text: str) -> bool:
    doc = yaml.safe_load(text)
    return isinstance(doc, dict) and isinstance(doc.get("flags"), str) and "model" in doc and text.endswith("\n")


def _spawn(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*PLAN, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_plan_killed_at_random_moments_leaves_the_old_or_a_complete_file(tmp_path):
    target = tmp_path / "plan.yaml"
    target.write_text(OLD)
    rng = random.Random(22)
    seen = set()
    for _ in range(6):
        proc = _spawn("-o", str(target))
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        text = target.read_text()
        assert text == OLD or _complete_plan(text), text[:200]
        seen.add("old" if text == OLD else "new")
        if text != OLD:
            target.write_text(OLD)
    finished = _spawn("-o", str(target))
    assert finished.wait(timeout=120) == 0
    assert _complete_plan(target.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]     # the killed writers' temporaries are gone


def _write_half_then_hang(path: str) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            f.write("half: ")
            f.flush()
            time.sleep(60)

    write_atomic(path, write)


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "out.yaml"
    target.write_text(OLD)
    child = multiprocessing.get_context("fork").Process(target=_write_half_then_hang, args=(str(target),))
    child.start()
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob(".out.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(tmp_path.glob(".out.partial-*")), "the writer never started"
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert target.read_text() == OLD
    write_atomic(target, lambda tmp: tmp.write_text("new: true\n"))
    assert target.read_text() == "new: true\n" and [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_two_concurrent_plans_to_one_path_leave_one_complete_file(tmp_path):
    target = tmp_path / "plan.yaml"
    one, two = _spawn("-o", str(target), "--ctx", "1024"), _spawn("-o", str(target), "--ctx", "2048")
    assert one.wait(timeout=120) == 0 and two.wait(timeout=120) == 0
    doc = yaml.safe_load(target.read_text())
    assert _complete_plan(target.read_text()) and ("-c 1024" in doc["flags"] or "-c 2048" in doc["flags"])
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


# Calls that write a file's bytes; fitplan's writers call them only inside a write_atomic callback.
_DIRECT = {"write_text", "write_bytes", "savefig"}


# Renames and temporaries of one's own: only planner/system/files.py (the one atomic writer) makes them.
_OWN_RENAME = {"replace", "rename", "mkstemp", "NamedTemporaryFile"}


def test_no_planner_writer_bypasses_write_atomic():
    """Every write_text/write_bytes/savefig/open(..., 'w') in planner/ — plans, sweeps, pictures, the HTML
    report, exports, the header cache, the assembled example model — is inside a function handed to
    write_atomic, and nothing but planner/system/files.py renames files or makes temporaries of its own."""
    offenders = []
    for path in (ROOT / "planner").rglob("*.py"):
        if path.name == "files.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _writes(node) and not _inside_callback(tree, node):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _OWN_RENAME and ast.unparse(node.func.value) in ("os", "tempfile")
                    and not _is_log(node)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}")
    assert offenders == []


def _writes(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _DIRECT:
        return True
    if isinstance(func, ast.Name) and func.id == "open" and len(call.args) > 1:
        mode = call.args[1]
        return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax")
    return False


def _inside_callback(tree: ast.AST, call: ast.Call) -> bool:
    """The call sits in a function or lambda whose first argument is named `tmp` (write_atomic's
    callback contract), or is a log file a child process writes (llama_tools, checking/llama)."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.Lambda)) and fn.lineno <= call.lineno <= (fn.end_lineno or 0):
            names = [a.arg for a in fn.args.args]
            if names[:1] == ["tmp"]:
                return True
    return _is_log(call)


def _is_log(call: ast.Call) -> bool:
    text = ast.unparse(call)
    return "log" in text or ".lock" in text
