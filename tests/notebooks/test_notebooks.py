"""The notebooks in notebooks/ run headless from a clean state and each draws at least one figure.

Each is executed by nbclient in a fresh kernel (matplotlib's inline backend, which renders with
Agg) from the repository root. The limit per cell only stops a hung kernel; it is not a speed
target (the sweeps of notebooks 01 and 03 estimate a few hundred flag sets each, about 50 s on a
2-core machine, and a 60 s limit failed CI on a busier one). The notebooks are stored without
outputs, so a diff of one shows its code, not base64 pictures.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600   # a hang guard: the slowest cell measured 49 s here


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_runs_and_draws(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()   # raises on any cell error
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]
    assert figures, f"{path.name} drew no figure"
