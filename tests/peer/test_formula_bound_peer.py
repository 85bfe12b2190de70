"""Architectures left on the formula are never estimated below llama.cpp: llama-fit-params --fit-print on
against the estimate (which carries the formula's safety term, planner/memory/analytic.py formula_safety)
on shape-faithful files of three architectures without a graph builder (planner/synth/shapes_formula.py:
MiniCPM-2B, DBRX, Ling-lite bailingmoe), host only, two rpc-servers full and partial, -fa off at 32k, q8_0
caches with -np 4. Model and context must be exact, compute never below llama.cpp's figure; the figures
without the term are printed beside, to show what it covers."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from planner.core.units import MiB
from planner.llama.context import model_context
from planner.memory.analytic import FORMULA
from planner.memory.estimate import estimate
from planner.synth.shapes_formula import FORMULA_SHAPES

pytestmark = pytest.mark.peer

CASES = {
    "host": ["-c", "4096", "-ngl", "0"],
    "rpc2-full": ["{rpc}", "-c", "4096", "-ngl", "99", "-ts", "1,1"],
    "rpc2-partial": ["{rpc}", "-c", "4096", "-ngl", "{half}", "-ts", "1,1"],
    "fa-off-32k": ["{rpc}", "-c", "32768", "-ngl", "99", "-ts", "1,1", "-fa", "off"],
    "q8-np4": ["{rpc}", "-c", "8192", "-ngl", "99", "-ts", "1,1", "-ctk", "q8_0", "-ctv", "q8_0", "-np", "4"],
}


@pytest.fixture(scope="module")
def formula_files(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("formula-shapes")
    paths = {}
    for name, make in FORMULA_SHAPES.items():
        [paths[name]] = make().write(out / f"{name}.gguf")
    return paths


def _fit_print(bin_dir: Path, model: Path, argv: list[str]) -> dict[str, tuple[int, int, int]]:
    """llama-fit-params' rows: device -> (model, context, compute) MiB, as it prints them (floored)."""
    done = subprocess.run([str(bin_dir / "llama-fit-params"), "-m", str(model), "--fit-print", "on", "-fit", "off",
                           *argv], capture_output=True, text=True, timeout=300)
    rows = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            rows[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    assert rows, done.stderr[-2000:]
    return rows


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(FORMULA_SHAPES))
def test_the_formula_is_never_below_llama_cpp(llama_tools, rpc_endpoints, formula_files, name, case):
    ctx = model_context(str(formula_files[name]))
    half = str(ctx.facts.n_layer_all // 2)
    argv: list[str] = []
    for a in CASES[case]:
        argv += ["--rpc", ",".join(rpc_endpoints)] if a == "{rpc}" else [half if a == "{half}" else a]
    est = estimate(ctx, argv)
    assert est.compute_model == FORMULA
    theirs = _fit_print(llama_tools, formula_files[name], argv)
    safety = dict(est.compute_safety)
    figures = []
    for d in est.devices:
        if d.name not in theirs:
            continue
        model, context, compute = theirs[d.name]
        assert (d.model_bytes // MiB, d.context_bytes // MiB) == (model, context), (d, theirs[d.name])
        assert d.compute_bytes >= compute * MiB, (d.name, d.compute_bytes / MiB, compute)
        bare = d.compute_bytes - safety.get(d.name, 0)
        figures.append(f"{d.name} {compute} / {d.compute_bytes / MiB:.0f} (formula alone {bare / MiB:.0f})")
    print(f"\n[{name} {case}] compute MiB llama-fit-params / fitplan: " + ", ".join(figures))
