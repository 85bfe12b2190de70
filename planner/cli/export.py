"""`fitplan export PLAN.yaml --to systemd|compose|preset|shell [-o FILE]`: the plan as a systemd
unit, a docker compose service, a llama.cpp preset (`llama-server --models-preset`) or a bash script;
a set plan (`fitplan plan-set -o`) as a router preset or a llama-swap configuration."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner import api


def export_cmd(
    plan: Annotated[str, typer.Argument(
        help="a plan file from `fitplan plan -o plan.yaml`, or a set plan from `fitplan plan-set -o`")],
    to: Annotated[str, typer.Option(
        "--to", help="systemd (a unit) | compose (a docker compose service on ghcr.io/ggml-org/llama.cpp) | "
                     "preset (llama-server --models-preset INI) | shell (a bash script); a set plan: preset | "
                     "llama-swap")],
    llama_bin: Annotated[str | None, typer.Option(
        "--llama-bin", help="directory of llama-server (default: the pinned build when built, else the name)")] = None,
    host: Annotated[str, typer.Option("--host", help="address llama-server binds")] = api.LOOPBACK,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="its port")] = 8080,
    name: Annotated[str, typer.Option("--name", help="the compose service's name")] = "fitplan-llama-server",
    output: Annotated[str | None, typer.Option("-o", "--output", help="write here instead of stdout")] = None,
) -> None:
    """Write what runs the plan: a systemd unit, a compose service, a llama.cpp preset or a shell script."""
    if output is not None:
        api.check_output_path(output)
    text = api.export_plan(plan, to, llama_bin, host, port, name)
    if output is None:
        typer.echo(text, nl=False)
        return

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")
        if to == "shell":
            tmp.chmod(0o755)

    api.write_atomic(output, write)
