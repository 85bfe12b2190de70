"""What the commands share: option types whose help reads the same in every command, and the
click context that hands llama.cpp flags after `--` to the command untouched."""
from __future__ import annotations

from typing import Annotated

import typer

Format = Annotated[str, typer.Option("--format", help="table | json | yaml")]
Model = Annotated[str, typer.Argument(
    help="GGUF path or http(s) URL; hf://ORG/REPO[:QUANT]\\[@REV], ORG/REPO[:QUANT], hf://ORG/REPO/FILE.gguf, "
         "ms://ORG/REPO[:QUANT], ollama://NAME[:TAG]; or example:gemma3-270m")]
Ram = Annotated[str | None, typer.Option("--ram", help="host RAM, e.g. 64GiB")]

# click: unknown options and extra arguments (the llama.cpp flags) land in ctx.args
LLAMA_FLAGS_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
