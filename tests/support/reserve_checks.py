"""Checks shared by the builder tests: the runtime's reserve against llama-fit-params -v's figures."""
from __future__ import annotations

from pathlib import Path

from planner.llama.flags import parse_llama_flags
from runtime.engine.runner import ModelRunner

MIB = 2**20


def assert_reserve_equals(model: Path, flags: str, n_nodes: int, compute_mib: float) -> None:
    """llama.cpp's "graph: nodes = N" (prompt and token graph alike) and its "CPU compute buffer
    size = X MiB" (two decimals) on a file every layer of which runs on the CPU."""
    runner = ModelRunner.load(str(model), parse_llama_flags(flags.split()), weights=False)
    report = runner.reserve_report
    assert report is not None
    assert (report.n_nodes_pp, report.n_nodes_tg) == (n_nodes, n_nodes)
    assert round(report.compute_bytes["CPU"] / MIB, 2) == compute_mib
