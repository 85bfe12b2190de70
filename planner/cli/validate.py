"""`fitplan validate (PLAN.yaml | MODEL -- <llama.cpp flags>) [--engine embedded|llama.cpp]
[--kernels default|ggml-avx2] [--reserve-only]`.

The validator is imported inside the command: it loads numpy, gguf and the runtime, which
`fitplan --help` does not need.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Format
from planner.core.render import render


def validate_cmd(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="a plan file (plan.yaml), or a GGUF path / example:gemma3-270m")],
    engine: Annotated[str, typer.Option("--engine", help="embedded | llama.cpp")] = "embedded",
    kernels: Annotated[str, typer.Option("--kernels", help="embedded engine: default | ggml-avx2 (bit-exact "
                                          "with llama.cpp's portable x86-64 build, slower)")] = "default",
    fmt: Format = "table",
    devices: Annotated[str | None, typer.Option("--devices", help="inventory YAML (MODEL form)")] = None,
    max_vram: Annotated[str | None, typer.Option("--max-vram", help="budgets, as fitplan plan")] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="prompt length in token ids")] = 32,
    gen_tokens: Annotated[int, typer.Option("--gen-tokens", min=1, help="generated tokens")] = 16,
    reserve_only: Annotated[bool, typer.Option(
        "--reserve-only", help="split and allocate the reserve graphs under the budgets, compute nothing")] = False,
) -> None:
    """Run the model under a plan or flags; measured memory, splits and speed against the estimate."""
    from planner.checking.validate import validate, validate_request

    req = validate_request(target, list(ctx.args), devices, max_vram, prompt_tokens, gen_tokens)
    report = validate(req, engine, kernels, reserve_only)
    typer.echo(render(report, fmt), nl=fmt != "table")
    if not report.fits:
        raise typer.Exit(1)
