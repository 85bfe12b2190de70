"""`fitplan validate (PLAN.yaml | MODEL [inventory options] -- <llama.cpp flags>)
[--engine embedded|llama.cpp] [--kernels default|ggml-avx2] [--reserve-only]`.

The validator is imported inside the command: it loads numpy, gguf and the runtime, which
`fitplan --help` does not need.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import NO_INVENTORY_FLAGS, Format, InventoryFlags, InventoryOptions, with_inventory_flags
from planner.core.errors import BadInput
from planner.core.render import render


@with_inventory_flags
def validate_cmd(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="a plan file (plan.yaml), or a GGUF path / example:gemma3-270m")],
    engine: Annotated[str, typer.Option("--engine", help="embedded | llama.cpp")] = "embedded",
    kernels: Annotated[str, typer.Option("--kernels", help="embedded engine: default | ggml-avx2 (bit-exact "
                                          "with llama.cpp's portable x86-64 build, slower)")] = "default",
    fmt: Format = "table",
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="prompt length in token ids")] = 32,
    gen_tokens: Annotated[int, typer.Option("--gen-tokens", min=1, help="generated tokens")] = 16,
    reserve_only: Annotated[bool, typer.Option(
        "--reserve-only", help="split and allocate the reserve graphs under the budgets, compute nothing")] = False,
) -> None:
    """Run the model under a plan or flags; measured memory, splits and speed against the estimate
    (the inventory options are for the MODEL form: a plan file carries its own)."""
    from planner.checking.validate import validate, validate_request
    from planner.checking.validation_report import ValidateRequest
    from planner.llama.flags import parse_llama_flags

    options = inventory.options()
    if target.endswith((".yaml", ".yml")):
        if options != InventoryOptions():
            raise BadInput("a plan file carries its own flags, inventory and budgets: give nothing else")
        req = validate_request(target, list(ctx.args), n_prompt=prompt_tokens, n_gen=gen_tokens)
    else:
        choice = options.resolve(detect=False)
        req = ValidateRequest(target, parse_llama_flags(options.llama_argv(list(ctx.args))),
                              choice.inventory if choice else None, choice.budget_rows() if choice else {},
                              prompt_tokens, gen_tokens)
    report = validate(req, engine, kernels, reserve_only)
    typer.echo(render(report, fmt), nl=fmt != "table")
    if not report.fits:
        raise typer.Exit(1)
