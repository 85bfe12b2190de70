"""`export` and `fetch-header` for the command line: what runs a plan (a systemd unit, a
compose service, a preset, a script; a set plan's router preset or llama-swap configuration) and
a model's header written for offline planning.
"""
from __future__ import annotations

from pathlib import Path

from planner.emit.document import read_deployment
from planner.emit.exports import ExportOptions, export
from planner.emit.set_document import is_set_plan, read_set_plan
from planner.emit.set_exports import set_export
from planner.gguf.header_file import HeaderFile, write_header_file
from planner.llama.commands import LLAMA_SERVER
from planner.registry.examples import resolve_model
from planner.system.llama_tools import tools_dir

__all__ = ["HeaderFile", "export_plan", "fetch_header", "llama_server_program"]


def llama_server_program(llama_bin: str | None) -> str:
    """llama-server's path: in `llama_bin`, else in the pinned build when it is built, else the bare name."""
    bin_dir = Path(llama_bin) if llama_bin else tools_dir()
    return str((bin_dir / LLAMA_SERVER).absolute()) if bin_dir else LLAMA_SERVER


def export_plan(plan_file: str, to: str, llama_bin: str | None, host: str, port: int, name: str) -> str:
    """`export`: a plan file as a systemd unit, a compose service, a preset or a shell script; a set
    plan (`fitplan plan-set -o`) as the router's preset or a llama-swap configuration."""
    program = llama_server_program(llama_bin)
    if is_set_plan(plan_file):
        return set_export(read_set_plan(plan_file), to, program, host, port)
    return export(read_deployment(plan_file), to, ExportOptions(program, host, port, name))


def fetch_header(model: str, output: str) -> HeaderFile:
    """`fetch-header`: a model's header (metadata and tensor index, no weights) as a header-only GGUF."""
    return write_header_file(resolve_model(model), output)
