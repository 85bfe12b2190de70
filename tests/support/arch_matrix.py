"""The peer matrix every simulated architecture passes (issue 40's "must show"): host only, two and three
rpc-servers, partial offload, flash attention off at 32k, q8_0 caches, four sequences and, for MoE models,
expert layers kept on the host (-ncmoe). Each row runs llama-fit-params --fit-print on the architecture's
shape-faithful file and compares fitplan's estimate with tests/support/estimate_matrix.assert_rows_match.

A family module (planner/synth/shapes_<family>.py) lists its files as ArchShape rows; its peer test
parametrizes over `arch_rows(SHAPES)` and calls `check_row`.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from planner.llama.context import ModelContext, model_context
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.synth.gguf_factory import ModelSpec
from tests.support.estimate_matrix import assert_rows_match

# "{rpc2}" / "{rpc3}": --rpc with the first two / all three loopback rpc-servers (RPC0..RPC2)
ARCH_FLAGS: tuple[str, ...] = (
    "-c 4096",
    "{rpc2} -c 4096 -ts 1,1",
    "{rpc3} -c 4096 -ts 1,1,1",
    "{rpc2} -c 4096 -ts 1,1 -ngl {half}",
    "{rpc2} -c 32768 -ts 3,1 -fa off",
    "{rpc2} -c 4096 -ts 1,1 -ctk q8_0 -ctv q8_0",
    "{rpc2} -c 4096 -ts 1,1 -np 4",
)
MOE_FLAGS: tuple[str, ...] = ("{rpc2} -c 4096 -ts 1,1 -ncmoe 8",)


@dataclass(frozen=True)
class ArchShape:
    """One shape-faithful file: its name in test ids, how to write it, its trunk's layer count (for
    {half}), whether it is a mixture of experts, and flag sets of its own beyond the matrix."""

    name: str
    spec: Callable[[], ModelSpec]
    n_layer: int
    moe: bool = False
    extra: tuple[str, ...] = ()


def arch_rows(shapes: Mapping[str, ArchShape]) -> list[tuple[str, str]]:
    """(shape name, flag template) rows; use the pairs as pytest parameters."""
    return [(name, f) for name, s in shapes.items()
            for f in ARCH_FLAGS + (MOE_FLAGS if s.moe else ()) + s.extra]


def expand(template: str, shape: ArchShape, endpoints: list[str]) -> list[str]:
    text = (template.replace("{rpc2}", "--rpc " + ",".join(endpoints[:2]))
            .replace("{rpc3}", "--rpc " + ",".join(endpoints[:3]))
            .replace("{half}", str(shape.n_layer // 2)))
    return shlex.split(text)


def shape_file(written: dict[str, tuple[Path, ModelContext]], directory: Path,
               shape: ArchShape) -> tuple[Path, ModelContext]:
    """A shape's file and context, written into `directory` the first time a row asks for it (`written`
    is the module's cache: the shape_files fixture)."""
    if shape.name not in written:
        [path] = shape.spec().write(directory / f"{shape.name}.gguf")
        written[shape.name] = (path, model_context(str(path)))
    return written[shape.name]


def check_row(tools: Path, path: Path, ctx: ModelContext, shape: ArchShape, template: str,
              endpoints: list[str]) -> None:
    """One row: llama-fit-params' figures equal fitplan's (model and context to the MiB, compute within
    3 % or 4 MiB and never more than 1 MiB below), and the estimate is the simulated one."""
    argv = expand(template, shape, endpoints)
    theirs = fit_print(tools, path, argv)
    est = estimate(ctx, argv)
    assert est.compute_model == "simulated", (shape.name, est.compute_model)
    assert_rows_match(est, theirs)
