"""The notebooks in notebooks/ run headless, from a wheel install, and each draws at least one figure.

Once per session the worktree is built into a wheel (`pip wheel --no-deps --no-build-isolation`, from a
copy of the packaged files, so no build/ or egg-info lands in the tree) and installed with `--no-deps`
into a new virtual environment whose dependencies are this interpreter's (`--system-site-packages`;
when the tests run from a virtual environment, a .pth file adds that environment's site-packages).
Each notebook is executed by nbclient under the new environment's python, in a fresh kernel
(matplotlib's inline backend, which renders with Agg), from a directory outside the repository and
with PYTHONPATH unset: what the notebooks import (planner, planner.synth, runtime) comes from the
wheel, as after `pip install fitplan`. A probe cell appended to each run checks that.

The limit per cell only stops a hung kernel; it is not a speed target (the sweeps of notebooks 01 and
03 estimate a few hundred flag sets each, about 50 s on a 2-core machine, and a 60 s limit failed CI
on a busier one). The notebooks are stored without outputs, so a diff of one shows its code, not base64
pictures.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
RUNNER = Path(__file__).resolve().parent / "run_notebook.py"
CELL_TIMEOUT_S = 600   # a hang guard: the slowest cell measured 49 s here
PACKAGES = ("planner", "runtime")   # [tool.setuptools.packages.find] include


@dataclass(frozen=True)
class WheelEnv:
    python: Path     # the venv's interpreter
    prefix: Path     # the venv
    workdir: Path    # outside the repository: the notebooks' working directory
    env: dict[str, str]


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> WheelEnv:
    base = tmp_path_factory.mktemp("wheel")
    src, dist, venv, work = base / "src", base / "dist", base / "venv", base / "work"
    # the packaged files only: the top-level files (pyproject.toml, README.md, ...) and the packages
    src.mkdir()
    for p in ROOT.iterdir():
        if p.is_file():
            shutil.copy2(p, src / p.name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the build backend from this environment when it has one ([build-system] setuptools), else pip's
    # isolated build fetches it
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(dist), str(src)],
         env=env, cwd=base)
    [wheel] = dist.glob("fitplan-*.whl")
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], env=env, cwd=base)
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # run from a virtual environment: --system-site-packages reaches the base interpreter's
        # site-packages, not this environment's, so the new one adds this one's (and runs its .pth files)
        site_dir = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        env=env, cwd=base).stdout.strip()
        ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        (Path(site_dir) / "_fitplan_test_deps.pth").write_text(
            "".join(f"import site; site.addsitedir({d!r})\n" for d in ours))
    # pip from the system site-packages, installing into the venv; --ignore-installed because the
    # system may hold fitplan itself (an editable install of a checkout)
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
         env=env, cwd=base)
    work.mkdir()
    return WheelEnv(python, venv, work, env)


def test_the_wheel_env_imports_the_wheel(wheel_env):
    """planner and planner.synth come from the venv's site-packages, not from a checkout."""
    done = _run([str(wheel_env.python), "-I", "-c",
                 "import planner, planner.synth, runtime; print(planner.__file__); print(planner.synth.__file__); "
                 "print(runtime.__file__)"], env=wheel_env.env, cwd=wheel_env.workdir)
    files = [Path(line).resolve() for line in done.stdout.split()]
    assert len(files) == 3
    for f in files:
        assert f.is_relative_to(wheel_env.prefix.resolve()) and "site-packages" in f.parts, f


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_runs_from_the_wheel_and_draws(path, wheel_env, tmp_path):
    out = tmp_path / path.name
    _run([str(wheel_env.python), "-I", str(RUNNER), str(path), str(out), str(wheel_env.workdir), str(CELL_TIMEOUT_S)],
         env=wheel_env.env, cwd=wheel_env.workdir)
    nb = nbformat.read(out, as_version=4)
    probe = nb.cells.pop()
    printed = "".join(o.get("text", "") for o in probe.outputs if o.get("output_type") == "stream").split()
    assert len(printed) == 3, probe.outputs
    planner_file, synth_file, prefix = (Path(p).resolve() for p in printed)
    venv = wheel_env.prefix.resolve()
    assert prefix == venv, "the kernel ran another python"
    assert planner_file.is_relative_to(venv) and synth_file.is_relative_to(venv), printed
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]
    assert figures, f"{path.name} drew no figure"
