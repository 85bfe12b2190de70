"""MkDocs hook: the CLI reference, rendered from the typer app itself.

docs/reference/cli.md holds the marker below; on build it is replaced by one section per command
of `planner.cli.app.app` (in `fitplan --help` order): its usage line, its help text and a table of
its arguments and options, each as the command's own `--help` states it (click's help records).
The page therefore cannot drift from the code: a new option appears on the next build.
"""
from __future__ import annotations

import re
from typing import Any

MARKER = "<!-- fitplan:cli-reference -->"
PROG = "fitplan"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())


def render() -> str:
    """The whole reference as Markdown: the global options, then one section per command."""
    import typer

    from planner.cli.app import app

    group = typer.main.get_command(app)
    Context = group.context_class   # click's, or the click typer vendors (0.29 on): each command names its own
    root = Context(group, info_name=PROG)
    parts = [_section(group, root, PROG, level=2, title="Global options")]
    for name in group.list_commands(root):
        command = group.get_command(root, name)
        if command is None or command.hidden:
            continue
        parts.append(_section(command, Context(command, info_name=name, parent=root), name, level=2))
    return "\n".join(parts)


def _section(command: Any, ctx: Any, name: str, level: int, title: str | None = None) -> str:
    lines = [f"{'#' * level} {title or name}", ""]
    usage = _usage(command.get_usage(ctx))
    if (command.context_settings or {}).get("allow_extra_args"):   # LLAMA_FLAGS_CONTEXT: llama.cpp's flags after --
        usage += " [-- LLAMA_CPP_FLAGS...]"
    lines += ["```text", usage, "```", ""]
    if command.help:
        lines += [_text(_plain(command.help)), ""]
    rows = [_row(param, ctx) for param in command.get_params(ctx)]
    rows = [row for row in rows if row is not None]
    if rows:
        lines += ["| argument or option | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def _row(param: Any, ctx: Any) -> str | None:
    if getattr(param, "hidden", False):
        return None
    record = param.get_help_record(ctx)
    if record is None:
        return None
    names, text = record
    if param.param_type_name == "argument":
        names = _arguments(names)
    return f"| `{_cell(names)}` | {_cell(_text(_plain(text)))} |"


def _arguments(text: str) -> str:
    """A positional argument as usage lines name it: MODEL rather than typer's `model <str>`."""
    name, _, kind = text.partition(" ")
    return name.upper() + (f" {kind}" if kind and kind != "<str>" else "")


def _plain(text: str) -> str:
    """Typer's text without its rich-markup escapes (`\\[`)."""
    return text.replace("\\[", "[").strip()


def _usage(text: str) -> str:
    """The usage line with typer's argument pieces `{model}` and `[models]` as MODEL and [MODELS]."""
    text = re.sub(r"\{([a-z_]+)\}", lambda m: m.group(1).upper(), _plain(text))
    return re.sub(r"\[([a-z_]+)\]", lambda m: f"[{m.group(1).upper()}]", text)


def _text(text: str) -> str:
    """Help text as Markdown that shows it as written: outside code spans, brackets, `*` and `_` are
    escaped (`[:QUANT][@REV]` is no reference link, `*=cpu` no emphasis) and `<` is an entity."""
    spans = text.split("`")
    return "`".join(re.sub(r"([\[\]*_])", r"\\\1", s).replace("<", "&lt;") if i % 2 == 0 else s
                    for i, s in enumerate(spans))


def _cell(text: str) -> str:
    """Text for one Markdown table cell: one line, no bare pipes."""
    return " ".join(text.split()).replace("|", "\\|")
